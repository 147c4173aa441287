"""The probe and metrics server of the worker and the executors.

One small HTTP server per process, on ``GOVERNOR_METRICS_ADDR:GOVERNOR_METRICS_PORT``:

* ``/metrics``: the process's Prometheus registry (text format);
* ``/healthz``: 200 while the process serves at all (liveness);
* ``/readyz``: 200 ``{"ready": true}`` once every readiness check holds
  (connected to Kafka and Redis; the worker: its agents started), else 503
  with ``{"ready": false, "reason": ..., "checks": {...}}`` naming the first
  failing check.

:class:`Readiness` is the shared state: the process sets each named check
(``kafka``, ``redis``, ``agents``) as it connects, loses or regains a server.

>>> r = Readiness(("kafka", "redis"))
>>> r.state()
(False, 'kafka: not connected yet')
>>> r.ok("kafka"); r.fail("redis", "Error 111 connecting to 127.0.0.1:1")
>>> r.state()
(False, 'redis: Error 111 connecting to 127.0.0.1:1')
>>> r.ok("redis"); r.state()
(True, '')
"""

from __future__ import annotations

import importlib.metadata
import logging
import platform
import socket
import threading
import tomllib
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from core.settings import SettingsError

log = logging.getLogger(__name__)

__all__ = ["HealthServer", "Readiness", "build_info", "governor_version", "serve"]


def governor_version() -> str:
    """The installed ``governor`` distribution's version, else pyproject.toml's, else ``0+unknown``."""
    try:
        return importlib.metadata.version("governor")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as fh:
            return str(tomllib.load(fh)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"


def build_info(registry: CollectorRegistry) -> Gauge:
    """``governor_build_info{version,python} 1`` in ``registry``."""
    g = Gauge("governor_build_info", "governor build: always 1", ("version", "python"), registry=registry)
    g.labels(governor_version(), platform.python_version()).set(1)
    return g


class Readiness:
    """Named readiness checks, each ok or failing with a reason; thread-safe."""

    def __init__(self, checks: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._checks: dict[str, str | None] = {name: "not connected yet" for name in checks}

    def ok(self, name: str) -> None:
        with self._lock:
            self._checks[name] = None

    def fail(self, name: str, reason: str) -> None:
        with self._lock:
            self._checks[name] = " ".join(reason.split())[:300] or "failing"

    def state(self) -> tuple[bool, str]:
        """(ready, reason of the first failing check)."""
        with self._lock:
            for name, why in self._checks.items():
                if why is not None:
                    return False, f"{name}: {why}"
        return True, ""

    def checks(self) -> dict[str, str]:
        with self._lock:
            return {name: "ok" if why is None else why for name, why in self._checks.items()}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._send(200, b'{"alive": true}\n', "application/json")
        elif path == "/readyz":
            ready = self.server.readiness
            ok, reason = ready.state() if ready is not None else (True, "")
            body: dict[str, Any] = {"ready": ok}
            if not ok:
                body["reason"] = reason
            if ready is not None:
                body["checks"] = ready.checks()
            self._send(200 if ok else 503, orjson.dumps(body) + b"\n", "application/json")
        else:
            self._send(404, b'{"error": "not found"}\n', "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - scrapes are not news
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry
    readiness: Readiness | None


class _Server6(_Server):
    address_family = socket.AF_INET6


class HealthServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``addr:port``, in a daemon thread."""

    def __init__(
        self, registry: CollectorRegistry, readiness: Readiness | None, port: int, addr: str = "127.0.0.1"
    ) -> None:
        self._server = (_Server6 if ":" in addr else _Server)((addr, port), _Handler)
        self._server.registry = registry
        self._server.readiness = readiness
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="governor-health", daemon=True)
        self._thread.start()
        log.debug("serving /metrics, /healthz, /readyz on %s:%d", addr, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(
    registry: CollectorRegistry, port: int, addr: str = "127.0.0.1", readiness: Readiness | None = None
) -> HealthServer | None:
    """Serve ``registry`` as /metrics, with /healthz and /readyz, on ``addr:port`` (GOVERNOR_METRICS_ADDR,
    GOVERNOR_METRICS_PORT; 0 = off).  An address that cannot be bound (the port taken, the address not
    this host's) is a :class:`~core.settings.SettingsError` naming both settings: one line and exit 2."""
    if port <= 0:
        return None
    try:
        return HealthServer(registry, readiness, port, addr)
    except OSError as exc:
        raise SettingsError(
            f"cannot serve /metrics on {addr}:{port}: {exc.strerror or exc}; free the port or choose another with "
            "GOVERNOR_METRICS_PORT (0 = off) or GOVERNOR_METRICS_ADDR",
            field="metrics_port",
            reason=f"{addr}:{port}: {exc.strerror or exc}",
        ) from exc
