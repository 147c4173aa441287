"""Issue 31, item 8: /metrics, /healthz and /readyz have no auth, so a process started outside a
cluster serves them on loopback only: reachable on 127.0.0.1 and bound to it alone (the kernel's
listening table says so; no test traffic leaves loopback).  Compose and the k8s manifests set GOVERNOR_METRICS_ADDR=0.0.0.0 themselves
(tests/unit/test_compose.py, tests/unit/test_k8s_manifests.py)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from core.settings import Settings
from executors.metrics import ExecutorMetrics
from launch.embedded import free_port
from launch.processes import EXECUTOR_READY, start_executor
from streams.health import serve
from streams.metrics_export import WorkerMetrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _listen_addresses(port: int) -> set[str]:
    """The IPv4 addresses a socket LISTENs on at ``port`` in this network namespace (/proc/net/tcp).

    Read from the kernel's table, so nothing is sent to any address but loopback.
    """
    table = Path("/proc/net/tcp")
    if not table.exists():
        pytest.skip("no /proc/net/tcp on this machine")
    found: set[str] = set()
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        addr_hex, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:  # 0A: TCP_LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(addr_hex)[::-1]))
    return found


def _healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        return int(r.status)


@pytest.mark.parametrize("metrics", [WorkerMetrics, ExecutorMetrics])
def test_the_exporters_serve_loopback_only_by_default(metrics: type[WorkerMetrics | ExecutorMetrics]) -> None:
    port = free_port()
    server = serve(metrics().registry, port)
    assert server is not None
    try:
        assert _healthz(port) == 200
        assert _listen_addresses(port) == {"127.0.0.1"}, "/metrics listens beyond loopback"
    finally:
        server.close()


def test_an_executor_started_with_the_default_settings_serves_loopback_only(settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    ex = start_executor(settings.replace(metrics_port=port), "az-a", tmp_path)
    try:
        ex.wait_for_log(EXECUTOR_READY, 60)
        assert _healthz(port) == 200
        assert _listen_addresses(port) == {"127.0.0.1"}, "the executor's /metrics listens beyond loopback"
    finally:
        ex.stop()
    assert Settings().metrics_addr == "127.0.0.1"
