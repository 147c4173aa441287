"""Issue 31, item 8: /metrics, /healthz and /readyz have no auth, so a process started outside a
cluster serves them on loopback only: reachable on 127.0.0.1, refused on the machine's other
addresses.  Compose and the k8s manifests set GOVERNOR_METRICS_ADDR=0.0.0.0 themselves
(tests/unit/test_compose.py, tests/unit/test_k8s_manifests.py)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from core.settings import Settings
from governor.embedded import free_port
from governor.processes import EXECUTOR_READY, start_executor
from streams.metrics_export import ExecutorMetrics, WorkerMetrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _other_address() -> str:
    """An address of this machine that is not loopback (the one its default route leaves by)."""
    addr = ""
    for target in ("10.255.255.254", "203.0.113.1", "198.51.100.1"):  # any routed address: nothing is sent
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((target, 9))
            except OSError:
                continue
            addr = str(s.getsockname()[0])
            if not addr.startswith("127."):
                break
    if not addr or addr.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address to try")
    return addr


def _refused(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=3).close()
    except ConnectionRefusedError:
        return True
    return False


def _healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        return int(r.status)


@pytest.mark.parametrize("metrics", [WorkerMetrics, ExecutorMetrics])
def test_the_exporters_serve_loopback_only_by_default(metrics: type[WorkerMetrics | ExecutorMetrics]) -> None:
    other = _other_address()
    port = free_port()
    server = metrics().serve(port)
    assert server is not None
    try:
        assert _healthz(port) == 200
        assert _refused(other, port), f"/metrics answered on {other}:{port}"
    finally:
        server.close()


def test_an_executor_started_with_the_default_settings_serves_loopback_only(settings: Settings, tmp_path: Path) -> None:
    other = _other_address()
    port = free_port()
    ex = start_executor(settings.replace(metrics_port=port), "az-a", tmp_path)
    try:
        ex.wait_for_log(EXECUTOR_READY, 60)
        assert _healthz(port) == 200
        assert _refused(other, port), f"the executor's /metrics answered on {other}:{port}"
    finally:
        ex.stop()
    assert Settings().metrics_addr == "127.0.0.1"
