"""``governor ingest scrape`` as a user runs it, discovering its engines in Kubernetes.

The CLI runs as a child process with ``GOVERNOR_SCRAPE_K8S_SELECTOR`` set and a
kubeconfig (``KUBECONFIG``) that points the official client at tests/kube_api.py, which
lists two engine pods: a Ready one whose IP and port are a local HTTP server serving
the vLLM fixture scrapes (its zone from its node's ``topology.kubernetes.io/zone``), and
one that is not Ready (never scraped).  The child prints its readiness line, and the
telemetry topic of the real embedded broker receives the ready pod's records: its zone,
its ``podIP:port`` as the node, and the 10 requests of the fixture delta.  Then the pod
is deleted and the records stop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from governor_telemetry.records import validate_record

from core.settings import ModelSpec, Settings
from launch.processes import INGEST_SCRAPE_READY, ChildProcess
from tests.integration.test_ingest_scrape import _read_all
from tests.kube_api import KubeAPI

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def engine() -> Iterator[tuple[int, list[int]]]:
    """vllm_1 on the first GET, vllm_2 from then on (one advance of 10 requests)."""
    texts = [(FIX / n).read_bytes() for n in ("vllm_1.txt", "vllm_2.txt")]
    served: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = texts[min(len(served), 1)]
            served.append(1)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1]), served
    finally:
        server.shutdown()
        server.server_close()


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters:\n- name: test\n  cluster:\n    server: {server}\n"
        "users:\n- name: test\n  user: {}\n"
        "contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: engines\n"
    )
    return path


def test_ingest_scrape_discovers_pods_and_produces_their_records(
    settings: Settings, engine: tuple[int, list[int]], tmp_path: Path
) -> None:
    port, served = engine
    settings = settings.replace(
        models=(ModelSpec("llama", ttft_slo_ms=1000.0, itl_slo_ms=150.0),),
        scrape_k8s_selector="app.kubernetes.io/name=vllm",
        scrape_k8s_namespace="engines",
        scrape_k8s_port=port,
        scrape_interval_s=0.4,
        scrape_model_map=(f"{SERVED}=llama",),
    )
    labels = {"app.kubernetes.io/name": "vllm"}
    with KubeAPI() as api:
        api.add_node("gpu-1", zone=settings.zones[-1])
        api.add_pod("vllm-0", namespace="engines", labels=labels, ip="127.0.0.1", node="gpu-1", port=port)
        api.add_pod("vllm-1", namespace="engines", labels=labels, ip="127.0.0.9", node="gpu-1", ready=False)
        env = {"KUBECONFIG": str(_kubeconfig(tmp_path / "kubeconfig", api.url))}
        env["KUBERNETES_SERVICE_HOST"] = ""  # not in a pod, whatever runs the test
        child = ChildProcess("ingest-scrape", ["ingest", "scrape"], settings, tmp_path / "scrape.log", env)
        try:
            child.wait_for_log(INGEST_SCRAPE_READY, 60)
            deadline = time.monotonic() + 30
            while len(served) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            records = asyncio.run(_read_all(settings, 11, 30.0))
            api.delete("v1", "pods", "vllm-0", "engines")
            n = len(served)
            time.sleep(1.5)  # three scrape intervals with no pod listed
            after = len(served)
        finally:
            code = child.stop()
        log = child.log_text()
    assert code == 0, log
    assert f"{INGEST_SCRAPE_READY}: targets from kubernetes" in log
    assert len(served) >= 3, log
    assert after <= n + 1, "the deleted pod was still scraped"  # one scrape may have been in flight
    pod_lists = [p for m, p, _ in api.requests if p.startswith("/api/v1/namespaces/engines/pods")]
    selectors = {parse_qs(urlsplit(p).query)["labelSelector"][0] for p in pod_lists}
    assert selectors == {"app.kubernetes.io/name=vllm"}
    assert all(validate_record(r) is None for r in records)
    assert {(r["zone"], r["node"], r["model"]) for r in records} == {(settings.zones[-1], f"127.0.0.1:{port}", "llama")}
    reqs = [r for r in records if r["kind"] == "request"]
    assert len(reqs) == 10 and sum(r["status"] != "ok" for r in reqs) == 1
    # Stamped on the run's clock (speed 1 here): within the last minute.
    assert all(abs(r["ts_ms"] - time.time() * 1000) < 60_000 for r in records)
