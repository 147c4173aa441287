"""The simulated replicas' vLLM ``/metrics`` (sim.engine_metrics), their HTTP server and
discovery document (sim.engine_server) and their OTLP spans (sim.otlp_export), read back by
governor's own adapters: ``parse_exposition``/``Scraper`` and ``spans_from_protobuf``/``map_span``.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.otlp.runner import spans_from_protobuf
from adapters.otlp.spans import MapOptions, map_span
from adapters.scrape.runner import Endpoint, Scraper, parse_exposition
from core.settings import Settings
from sim.engine_metrics import LATENCY_EDGES, TPOT_EDGES, TTFT_EDGES, FleetMetrics
from sim.engine_server import EngineServer
from sim.otlp_export import export_request

pytestmark = pytest.mark.timeout(60)

FIXTURE_EDGES = {  # le values of tests/fixtures/engines/vllm_1.txt (vLLM v1's own)
    "vllm:time_to_first_token_seconds": TTFT_EDGES,
    "vllm:request_time_per_output_token_seconds": TPOT_EDGES,
    "vllm:e2e_request_latency_seconds": LATENCY_EDGES,
}


def _requests(
    n: int, node: str = "az-a/m/r0", zone: str = "az-a", t0_ms: int = 1_000_000, seed: int = 1
) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ttft = float(rng.lognormal(np.log(300.0), 0.8))
        itl = float(rng.lognormal(np.log(40.0), 0.5))
        tokens = int(rng.integers(2, 200))
        out.append(
            {
                "request_id": f"{node}-{t0_ms}-{i}",
                "node": node,
                "zone": zone,
                "model": "m",
                "ts_ms": t0_ms + i,
                "arrival_ms": t0_ms + i - 500,
                "ttft_ms": ttft,
                "itl_ms": itl,
                "e2e_ms": ttft + itl * tokens,
                "decode_ms": itl * tokens,
                "queue_ms": ttft / 3,
                "prompt_tokens": 100 + i,
                "output_tokens": tokens,
                "status": "error" if i % 25 == 0 else "ok",
            }
        )
    return out


def test_rendering_parses_with_prometheus_and_governor_and_uses_vllm_edges() -> None:
    reg = FleetMetrics("m", 0)
    recs = _requests(200)
    reg.observe_all(recs)
    reg.update(
        [
            {
                "node": "az-a/m/r0",
                "zone": "az-a",
                "ts_ms": 0,
                "state": "ready",
                "running": 7,
                "queue_len": 3,
                "kv_blocks_used": 250,
                "kv_blocks_total": 1000,
            }
        ]
    )
    text = reg.render("az-a/m/r0")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name, edges in FIXTURE_EDGES.items():
        les = [s.labels["le"] for s in fams[name].samples if s.name.endswith("_bucket")]
        assert [float(x) for x in les[:-1]] == list(edges) and les[-1] == "+Inf"
    snap = parse_exposition(text, "vllm")["m"]
    assert snap.ttft is not None and snap.ttft.count == 200
    assert snap.itl is not None and snap.itl.per_request  # the per-request TPOT histogram is preferred
    assert snap.finished == 200 and snap.failed == sum(r["status"] != "ok" for r in recs)
    assert snap.prompt_tokens == sum(r["prompt_tokens"] for r in recs)
    assert snap.output_tokens == sum(r["output_tokens"] for r in recs)
    assert (snap.running, snap.waiting, snap.kv_usage, snap.kv_total) == (7, 3, 0.25, 1000)
    # Cumulative buckets match the truth exactly at every edge.
    ttft_s = np.array([r["ttft_ms"] for r in recs]) / 1000.0
    for edge, cum in zip(snap.ttft.edges, snap.ttft.cumulative, strict=False):
        assert cum == int((ttft_s <= edge).sum())
    assert snap.ttft.total == pytest.approx(ttft_s.sum())


def test_scraper_deltas_count_every_request_and_bound_the_violations() -> None:
    settings = Settings()
    spec = settings.models[0]
    reg = FleetMetrics(spec.name, 0)
    node = "az-a/m/r0"
    reg.observe_all(_requests(50))
    ep = Endpoint("http://sim/r0/metrics", "az-a")
    scraper = Scraper(settings, [ep], "vllm")
    assert scraper.step({ep.url: reg.render(node)}, 1_000_000) == []  # the baseline
    batch = _requests(120, t0_ms=1_005_000, seed=2)
    reg.observe_all(batch)
    records = scraper.step({ep.url: reg.render(node)}, 1_010_000)
    reqs = [r for r in records if r["kind"] == "request"]
    assert len(reqs) == 120 and sum(r["kind"] == "gpu" for r in records) == 1
    truth = sum(r["status"] != "ok" or r["ttft_ms"] > spec.ttft_slo_ms or r["itl_ms"] > spec.itl_slo_ms for r in batch)
    summary = scraper.summaries[-1][2]
    assert summary.bounds[0] <= truth <= summary.bounds[1]


def test_a_replaced_replica_starts_from_zero_and_the_scraper_sees_a_restart() -> None:
    settings = Settings()
    reg = FleetMetrics(settings.models[0].name, 0)
    reg.observe_all(_requests(40, node="n", t0_ms=1_000_000))
    ep = Endpoint("http://sim/n/metrics", "az-a")
    scraper = Scraper(settings, [ep], "vllm")
    scraper.step({ep.url: reg.render("n")}, 1_000_000)
    reg.update([])  # gone
    assert reg.targets() == {}
    reg.observe_all(_requests(7, node="n", t0_ms=2_000_000, seed=3))  # a new process behind the same address
    records = scraper.step({ep.url: reg.render("n")}, 2_000_100)
    assert sum(r["kind"] == "request" for r in records) == 7  # not 7 - 40: counters from zero


def test_server_serves_each_replica_on_its_own_port_and_the_discovery_document_follows_the_fleet() -> None:
    async def scenario() -> None:
        reg = FleetMetrics("m", 0)
        server = EngineServer(reg)
        await server.start()
        try:
            gpu = [{"node": f"az-a/m/r{i}", "zone": "az-a", "ts_ms": 0, "state": "ready"} for i in range(2)]
            gpu.append({"node": "az-a/m/r2", "zone": "az-a", "ts_ms": 0, "state": "starting"})
            reg.update(gpu)
            reg.observe_all(_requests(5, node="az-a/m/r1"))
            await server.sync()
            doc = json.loads(await asyncio.to_thread(_get, server.sd_url))
            assert sorted(d["labels"]["node"] for d in doc) == ["az-a/m/r0", "az-a/m/r1"]  # starting: not yet
            assert all(d["labels"]["__metrics_path__"] == "/metrics" and d["labels"]["zone"] == "az-a" for d in doc)
            urls = {d["labels"]["node"]: f"http://{d['targets'][0]}/metrics" for d in doc}
            text = await asyncio.to_thread(_get, urls["az-a/m/r1"])
            assert parse_exposition(text, "vllm")["m"].finished == 5
            assert parse_exposition(await asyncio.to_thread(_get, urls["az-a/m/r0"]), "vllm")["m"].finished == 0
            assert server.scrapes == 2
            reg.update(gpu[1:2])  # r0 and r2 gone
            await server.sync()
            doc = json.loads(await asyncio.to_thread(_get, server.sd_url))
            assert [d["labels"]["node"] for d in doc] == ["az-a/m/r1"]
            with pytest.raises(OSError):
                await asyncio.to_thread(_get, urls["az-a/m/r0"])  # its port is closed
        finally:
            await server.stop()

    asyncio.run(scenario())


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 (loopback test server)
        return str(resp.read().decode())


def test_otlp_spans_map_back_to_the_request_records() -> None:
    recs = _requests(30)
    spans = spans_from_protobuf(export_request(recs))
    assert len(spans) == 30
    opts = MapOptions(zones=frozenset({"az-a"}), models=frozenset({"m"}))
    for rec, span in zip(recs, spans, strict=True):
        got, why = map_span(span, opts)
        assert why is None and got is not None
        assert got["request_id"] == rec["request_id"] and got["node"] == rec["node"] and got["zone"] == "az-a"
        assert got["ttft_ms"] == pytest.approx(rec["ttft_ms"]) and got["e2e_ms"] == pytest.approx(rec["e2e_ms"])
        assert got["ts_ms"] == rec["ts_ms"] and got["arrival_ms"] == rec["arrival_ms"]
        assert got["status"] == ("ok" if rec["status"] == "ok" else "error")
        assert got["output_tokens"] == rec["output_tokens"] and got["queue_ms"] == pytest.approx(rec["queue_ms"])
