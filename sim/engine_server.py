"""The simulated fleet's engines on HTTP: vLLM ``/metrics`` per replica, and their discovery.

Each replica that serves (``ready`` or ``draining``) listens on its own loopback
port, as a vLLM pod has its own address, and answers ``GET /metrics`` with its
series (:mod:`sim.engine_metrics`).  Its scrape target is then ``127.0.0.1:<port>``,
which is also the node id ``governor ingest scrape`` gives its records.  A replica
that goes away closes its port; a new one (scale-up, replacement) opens a new port
with counters from zero.

The fleet scales, so a static target list cannot follow it: the main port serves
``GET /sd``, a Prometheus HTTP service-discovery document (``http_sd_config``:
HTTP 200, ``Content-Type: application/json``, ``[]`` when there is nothing) that
lists the replicas serving now::

    [{"targets": ["127.0.0.1:41234"],
      "labels": {"zone": "az-a", "node": "az-a/llama2-70b/r0", "model_name": "llama2-70b",
                 "__metrics_path__": "/metrics"}}]

The main port also serves ``GET /replicas/<node>/metrics`` (node URL-quoted) for
a look by hand.

:class:`ScrapeEngines` is the sink :class:`sim.live.LiveFleet` feeds in scrape
mode: finished requests go into the series and nothing is shipped natively
(the scraper turns the series into records).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from aiohttp import web

from sim.engine_metrics import FleetMetrics

__all__ = ["EngineServer", "ScrapeEngines"]

log = logging.getLogger(__name__)

EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"


class EngineServer:
    """The replicas' ``/metrics`` and the discovery document (see the module docstring)."""

    def __init__(self, metrics: FleetMetrics, host: str = "127.0.0.1") -> None:
        self.metrics = metrics
        self.host = host
        self.port = 0
        self.scrapes = 0  # GET /metrics answered (the demo's sign that a scraper is reading)
        self.sd_reads = 0  # GET /sd answered
        self._runner: web.AppRunner | None = None
        self._sites: dict[str, tuple[int, web.SockSite]] = {}  # node -> (port, site)
        self._node_at: dict[int, str] = {}  # port -> node

    @property
    def sd_url(self) -> str:
        return f"http://{self.host}:{self.port}/sd"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/sd", self._sd)
        app.router.add_get("/replicas/{node}/metrics", self._by_path)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = _bound(self.host)
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        await self.sync()
        log.info("engine metrics on http://%s:%d (discovery %s)", self.host, self.port, self.sd_url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._sites.clear()
        self._node_at.clear()

    async def sync(self) -> None:
        """Open a port for each replica now serving, close the ports of those gone."""
        if self._runner is None:  # not started, or stopped
            return
        now = self.metrics.targets()
        for node in [n for n in self._sites if n not in now]:
            port, site = self._sites.pop(node)
            self._node_at.pop(port, None)
            await site.stop()
        for node in now:
            if node not in self._sites:
                sock = _bound(self.host)
                port = int(sock.getsockname()[1])
                site = web.SockSite(self._runner, sock)
                await site.start()
                self._sites[node] = (port, site)
                self._node_at[port] = node

    def targets(self) -> dict[str, tuple[str, str]]:
        """node -> (``host:port``, zone) of every replica serving now."""
        zones = self.metrics.targets()
        return {n: (f"{self.host}:{p}", zones[n]) for n, (p, _) in self._sites.items() if n in zones}

    def sd_document(self) -> list[dict[str, Any]]:
        return [
            {
                "targets": [addr],
                "labels": {
                    "zone": zone,
                    "node": node,
                    "model_name": self.metrics.served_name,
                    "__metrics_path__": "/metrics",
                },
            }
            for node, (addr, zone) in sorted(self.targets().items())
        ]

    def _text(self, node: str | None) -> web.Response:
        if node is None or node not in self.metrics.replicas:
            return web.Response(status=404, text="no such replica\n")
        self.scrapes += 1
        return web.Response(body=self.metrics.render(node).encode(), headers={"Content-Type": EXPOSITION})

    async def _metrics(self, request: web.Request) -> web.Response:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        port = sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else -1
        return self._text(self._node_at.get(port))

    async def _by_path(self, request: web.Request) -> web.Response:
        return self._text(unquote(request.match_info["node"]))

    async def _sd(self, request: web.Request) -> web.Response:
        self.sd_reads += 1
        return web.json_response(self.sd_document())

    def replica_url(self, node: str) -> str:
        """``/replicas/<node>/metrics`` on the main port."""
        return f"http://{self.host}:{self.port}/replicas/{quote(node, safe='')}/metrics"


def _bound(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


class ScrapeEngines:
    """LiveFleet sink for scrape mode: requests and GPU state feed the replicas' series."""

    mode = "scrape"

    def __init__(self, server: EngineServer) -> None:
        self.server = server

    def finished(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.server.metrics.observe_all(records)
        return []

    def gpu(self, snaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.server.metrics.update(snaps)
        return []

    async def sync(self, t_s: float) -> None:
        await self.server.sync()

    async def finish(self) -> None:
        """Nothing to flush: the server stays up so the scraper reads the last counters."""

    async def close(self) -> None:
        await self.server.stop()

    def stats(self) -> Mapping[str, Any]:
        return {"scrapes_answered": self.server.scrapes, "replicas_serving": len(self.server.targets())}
