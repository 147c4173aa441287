"""Event-driven fleet: hand-checked timings, life cycle, faults, conservation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.fleet import Fleet, FleetConfig, FleetConfigError
from sim.perf_model import PerfModel
from sim.traces import load_trace

pytestmark = pytest.mark.timeout(120)

M = "llama2-70b"
PM = PerfModel.from_splitwise()
REQUEST_KEYS = {
    "schema_version",
    "kind",
    "request_id",
    "ts_ms",
    "arrival_ms",
    "model",
    "zone",
    "node",
    "request_class",
    "queue_ms",
    "network_ms",
    "preprocess_ms",
    "ttft_ms",
    "itl_ms",
    "decode_ms",
    "e2e_ms",
    "prompt_tokens",
    "output_tokens",
    "kv_hit",
    "kv_hit_blocks",
    "status",
}
GPU_KEYS = {
    "schema_version",
    "kind",
    "ts_ms",
    "node",
    "zone",
    "model",
    "state",
    "gpu_util",
    "mem_used_bytes",
    "mem_total_bytes",
    "kv_blocks_used",
    "kv_blocks_total",
    "largest_free_block_bytes",
    "queue_len",
    "running",
}


def make(**kw) -> Fleet:
    base = dict(models={M: PM}, initial_replicas=1, jitter=False, context_aware_decode=False)
    base.update(kw)
    epoch = base.pop("epoch_ms0", 1_700_000_000_000)
    return Fleet(FleetConfig(**base), epoch_ms0=epoch)


def overhead_s(rec: dict) -> float:
    return (rec["network_ms"] + rec["preprocess_ms"]) / 1000.0


# (prompt, output, context-aware decode): one request on an idle ready replica
SINGLE = [
    (512, 10, False),  # short
    (3000, 200, False),  # longer prompt, many steps
    (3000, 200, True),  # context-aware step: ctx = prompt + output / 2
    (100, 0, False),  # no decode at all
]


@pytest.mark.parametrize("prompt,output,ctx", SINGLE)
def test_single_request_hand_checked(prompt: int, output: int, ctx: bool) -> None:
    f = make(context_aware_decode=ctx)
    f.submit(1.0, "az-a", M, prompt, output, "r1")
    (rec,) = f.advance_to(100.0)
    step = PM.decode_step_ms(1, prompt + output / 2 if ctx else None)
    assert rec["queue_ms"] == pytest.approx(0.0, abs=1e-9)
    assert rec["preprocess_ms"] == pytest.approx(0.5 + 0.0005 * prompt)
    assert rec["ttft_ms"] == pytest.approx(rec["network_ms"] + rec["preprocess_ms"] + PM.prefill_ms(prompt))
    assert rec["e2e_ms"] == pytest.approx(rec["ttft_ms"] + output * step)
    assert rec["decode_ms"] == pytest.approx(output * step)
    assert rec["itl_ms"] == pytest.approx(step if output else 0.0)
    assert rec["arrival_ms"] == 1_700_000_000_000 + 1000
    assert rec["ts_ms"] == pytest.approx(rec["arrival_ms"] + rec["e2e_ms"], abs=1)
    assert set(rec) == REQUEST_KEYS and rec["status"] == "ok" and rec["node"] == f"az-a/{M}/r0"
    json.dumps(rec)


def test_arrival_during_decode_waits_for_step_boundary_and_pauses_decode() -> None:
    f = make()
    f.submit(0.0, "az-a", M, 512, 100, "a")
    f.submit(1.0, "az-a", M, 1024, 5, "b")
    recs = {r["request_id"]: r for r in f.advance_to(60.0)}
    a, b = recs["a"], recs["b"]
    s1, s2 = PM.decode_step_ms(1) / 1000, PM.decode_step_ms(2) / 1000
    a_first = overhead_s(a) + PM.prefill_ms(512) / 1000
    b_reach = 1.0 + overhead_s(b)
    n1 = math.ceil((b_reach - a_first) / s1)  # steps of a before b is admitted
    b_start = a_first + n1 * s1
    assert b["queue_ms"] == pytest.approx((b_start - b_reach) * 1000)
    assert 0 < b["queue_ms"] < s1 * 1000
    b_first = b_start + PM.prefill_ms(1024) / 1000
    # a pauses during b's prefill, then both decode at the batch-2 step
    assert b["e2e_ms"] == pytest.approx((b_first + 5 * s2 - 1.0) * 1000)
    a_end = b_first + 5 * s2 + (100 - n1 - 5) * PM.decode_step_ms(1) / 1000
    assert a["e2e_ms"] == pytest.approx(a_end * 1000)


def test_simultaneous_arrivals_share_one_prefill() -> None:
    f = make(network_ms_median=0.0)
    for i in range(3):
        f.submit(0.0, "az-a", M, 1000, 4, f"r{i}")
    recs = f.advance_to(30.0)
    # network 0 and equal prompts: all reach together, one batched prefill of 3000 tokens
    # (the first arrival starts its prefill alone the instant it reaches the idle replica)
    ttfts = sorted(r["ttft_ms"] - r["preprocess_ms"] for r in recs)
    assert ttfts[0] == pytest.approx(PM.prefill_ms(1000))
    assert ttfts[1] == pytest.approx(ttfts[2])
    assert ttfts[1] == pytest.approx(PM.prefill_ms(1000) + PM.prefill_ms(2000))


@pytest.mark.parametrize(
    "max_batch,kv_tokens,expect_serial",
    [
        (1, None, True),  # batch cap 1: the second waits for the first to finish
        (64, 1500, True),  # 2 x (600 + 300) > 1500 KV tokens: serialised
        (64, 2000, False),  # both fit: they overlap
    ],
)
def test_admission_limits(max_batch: int, kv_tokens: int | None, expect_serial: bool) -> None:
    f = make(max_batch=max_batch, kv_capacity_tokens=kv_tokens)
    f.submit(0.0, "az-a", M, 600, 300, "a")
    f.submit(0.0, "az-a", M, 600, 300, "b")
    recs = sorted(f.advance_to(120.0), key=lambda r: r["ts_ms"])
    first_end = recs[0]["ts_ms"]
    second_start = recs[1]["arrival_ms"] + recs[1]["network_ms"] + recs[1]["preprocess_ms"] + recs[1]["queue_ms"]
    assert (second_start >= first_end - 1) == expect_serial


def test_oversize_request_runs_alone() -> None:
    f = make(kv_capacity_tokens=1000)
    f.submit(0.0, "az-a", M, 5000, 10, "big")
    assert len(f.advance_to(60.0)) == 1


def test_startup_delay_and_zone_queue() -> None:
    f = make(initial_replicas=0, startup_s=30.0)
    f.submit(1.0, "az-a", M, 512, 10, "early")  # no replica: waits in the zone queue
    change = f.set_desired("az-a", M, 1, 2.0)  # ahead of the clock: applied by an event at 2.0
    assert change["scheduled"] and change["started"] == [] and f.desired("az-a", M) == 1
    assert f.replicas("az-a", M)["starting"] == 0
    f.advance_to(2.0)
    assert f.replicas("az-a", M)["starting"] == 1 and f.desired("az-a", M) == 1
    f.advance_to(31.9)
    assert f.replicas("az-a", M)["starting"] == 1 and f.stats()["zone_queued"] == 1
    assert f.gpu_snapshot(31.9)[0]["state"] == "starting"
    (rec,) = f.advance_to(100.0)
    assert f.replicas("az-a", M)["ready"] == 1
    prefill_start_s = 1.0 + overhead_s(rec) + rec["queue_ms"] / 1000
    assert prefill_start_s == pytest.approx(32.0)


def test_scale_down_drains_without_losing_requests() -> None:
    f = make(initial_replicas=4, jitter=True)
    tr = load_trace("azure-conv").scaled_to_qps(20.0).window(0.0, 30.0)
    for i, t in enumerate(tr.arrival_s):
        f.submit(float(t), "az-a", M, int(tr.prompt_tokens[i]), int(tr.output_tokens[i]), str(i))
    recs = f.advance_to(10.0)
    change = f.set_desired("az-a", M, 1, 10.0)
    drained = set(change["draining"])
    assert len(drained) == 3 and f.desired("az-a", M) == 1
    assert f.stats()["conserved"]
    recs += f.advance_to(10_000.0)
    st_ = f.stats()
    assert st_["completed"] == st_["submitted"] == len(tr) and st_["in_flight"] == 0
    assert len({r["request_id"] for r in recs}) == len(tr)
    assert f.replicas("az-a", M) == {"starting": 0, "ready": 1, "draining": 0, "gone": 3}
    # nothing that reached the zone after the drain went to a draining replica
    late = [r for r in recs if r["arrival_ms"] - f.epoch_ms0 > 10_500]
    assert late and not any(r["node"] in drained for r in late)


def test_scale_down_cancels_starting_first() -> None:
    f = make(initial_replicas=1)
    f.set_desired("az-a", M, 3, 0.0)
    f.advance_to(1.0)
    change = f.set_desired("az-a", M, 2, 1.0)
    assert change["cancelled"] == [f"az-a/{M}/r2"] and change["draining"] == []
    assert f.replicas("az-a", M) == {"starting": 1, "ready": 1, "draining": 0, "gone": 1}


def test_fail_replica_requeues_and_replaces() -> None:
    f = make(initial_replicas=2, startup_s=5.0)
    for i in range(40):
        f.submit(0.05 * i, "az-a", M, 800, 200, str(i))
    f.advance_to(2.0)
    node = f.fail_replica("az-a", M, 2.0)
    assert node is not None and f.stats()["conserved"]
    assert f.replicas("az-a", M)["starting"] == 1 and f.desired("az-a", M) == 2
    recs = f.advance_to(1000.0)
    assert len(recs) == 40 and f.stats()["in_flight"] == 0
    assert not any(r["node"] == node for r in recs)  # everything it held restarted elsewhere


def test_latency_spike_multiplies_service_time() -> None:
    f = make()
    nodes = f.inject_latency_spike("az-a", M, 1.0, 3.0, 10.0, 100.0)
    assert nodes == [f"az-a/{M}/r0"]
    f.submit(0.0, "az-a", M, 512, 20, "before")
    f.submit(20.0, "az-a", M, 512, 20, "during")
    f.submit(200.0, "az-a", M, 512, 20, "after")
    recs = {r["request_id"]: r for r in f.advance_to(400.0)}
    base = PM.prefill_ms(512) + 20 * PM.decode_step_ms(1)
    for rid, mult in (("before", 1.0), ("during", 3.0), ("after", 1.0)):
        r = recs[rid]
        assert r["e2e_ms"] - r["network_ms"] - r["preprocess_ms"] == pytest.approx(mult * base)


def test_kv_prefix_hits_shorten_prefill() -> None:
    f = make()
    f.submit(0.0, "az-a", M, 2048, 1, "a", hash_ids=[0, 1, 2, 3])
    f.submit(10.0, "az-a", M, 2048, 1, "b", hash_ids=[0, 1, 9, 10])
    a, b = sorted(f.advance_to(60.0), key=lambda r: r["ts_ms"])
    assert (a["kv_hit"], a["kv_hit_blocks"]) == (False, 0)
    assert (b["kv_hit"], b["kv_hit_blocks"]) == (True, 2)
    assert b["ttft_ms"] - b["network_ms"] - b["preprocess_ms"] == pytest.approx(PM.prefill_ms(1024))


def test_gpu_snapshot_records() -> None:
    f = make(initial_replicas=2)
    f.submit(0.0, "az-a", M, 4000, 400, "x")
    f.advance_to(5.0)
    snaps = f.gpu_snapshot(5.0)
    assert len(snaps) == 2 and all(set(s) == GPU_KEYS for s in snaps)
    json.dumps(snaps)
    busy = [s for s in snaps if s["running"] == 1]
    assert len(busy) == 1 and busy[0]["gpu_util"] == pytest.approx(1.0, abs=0.02)
    assert busy[0]["kv_blocks_used"] == math.ceil(4400 / 512)
    assert busy[0]["kv_blocks_total"] == PM.kv_capacity_tokens // 512
    idle = [s for s in snaps if s["running"] == 0][0]
    assert idle["gpu_util"] == 0.0 and idle["mem_used_bytes"] == PM.weight_bytes
    assert busy[0]["largest_free_block_bytes"] == (PM.kv_capacity_tokens - 4400) * PM.kv_bytes_per_token
    assert snaps[0]["ts_ms"] == f.epoch_ms0 + 5000


def run_workload(seed: int, commands: list[tuple[float, int]], n: int = 300) -> tuple[list[dict], Fleet]:
    f = make(
        initial_replicas=2, jitter=True, seed=seed, zones=("az-a", "az-b"), startup_s=3.0, context_aware_decode=True
    )
    tr = load_trace("mooncake").scaled_to_qps(30.0)
    cmds = sorted(commands)
    recs: list[dict] = []
    t = 0.0
    for i in range(n):
        ta = float(tr.arrival_s[i])
        while cmds and cmds[0][0] <= ta:
            tc, k = cmds.pop(0)
            zone = ("az-a", "az-b")[k % 2]
            if k >= 8:
                f.fail_replica(zone, M, tc)
            else:
                f.set_desired(zone, M, k % 5, tc)
            assert f.stats()["conserved"]
        f.submit(
            ta,
            ("az-a", "az-b")[i % 2],
            M,
            int(tr.prompt_tokens[i]) // 8,
            int(tr.output_tokens[i]) // 4,
            str(i),
            hash_ids=tr.hash_ids[i],
        )
        if ta - t > 0.5:
            recs += f.advance_to(ta)
            t = ta
            assert f.stats()["conserved"]
    for zone in ("az-a", "az-b"):
        f.set_desired(zone, M, 2, f.now)
    recs += f.advance_to(1e6)
    return recs, f


@given(seed=st.integers(0, 1000), commands=st.lists(st.tuples(st.floats(0, 40), st.integers(0, 9)), max_size=12))
@settings(max_examples=25, deadline=None)
def test_conservation_under_random_scale_and_failures(seed, commands) -> None:
    recs, f = run_workload(seed, commands)
    s = f.stats()
    assert s["conserved"] and s["in_flight"] == 0
    assert s["completed"] == s["submitted"] == 300 == len(recs)
    assert len({r["request_id"] for r in recs}) == 300
    assert all(r["queue_ms"] >= -1e-6 and r["e2e_ms"] >= r["ttft_ms"] > 0 for r in recs)


@given(seed=st.integers(0, 1000), commands=st.lists(st.tuples(st.floats(0, 40), st.integers(0, 9)), max_size=6))
@settings(max_examples=10, deadline=None)
def test_determinism_same_seed_same_records(seed, commands) -> None:
    a, _ = run_workload(seed, commands, n=150)
    b, _ = run_workload(seed, commands, n=150)
    assert a == b


def test_different_seed_different_jitter() -> None:
    a, _ = run_workload(1, [], n=100)
    b, _ = run_workload(2, [], n=100)
    assert [r["e2e_ms"] for r in a] != [r["e2e_ms"] for r in b]


def test_routing_balances_least_outstanding() -> None:
    f = make(initial_replicas=4)
    for i in range(8):
        f.submit(0.0, "az-a", M, 1000, 100, str(i))
    recs = f.advance_to(100.0)
    counts = np.unique([r["node"] for r in recs], return_counts=True)[1]
    assert list(counts) == [2, 2, 2, 2]


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(models={}), "models"),
        (dict(zones=("a", "a")), "zones"),
        (dict(max_batch=0), "max_batch"),
        (dict(startup_s=-1.0), "startup_s"),
        (dict(kv_capacity_tokens=0), "kv_capacity_tokens"),
        (dict(jitter_theta=0.0), "jitter_theta"),
    ],
)
def test_config_validation_names_parameter(kwargs, param) -> None:
    base = dict(models={M: PM})
    base.update(kwargs)
    with pytest.raises(FleetConfigError, match=param):
        FleetConfig(**base)


def test_unknown_zone_and_bad_commands() -> None:
    f = make()
    with pytest.raises(FleetConfigError, match="zone"):
        f.submit(0.0, "az-z", M, 1, 1, "x")
    with pytest.raises(FleetConfigError, match="n:"):
        f.set_desired("az-a", M, -1, 0.0)
    with pytest.raises(FleetConfigError, match="fraction"):
        f.inject_latency_spike("az-a", M, 2.0, 3.0, 0.0, 1.0)


def test_routing_load_returns_to_zero_after_completion() -> None:
    # finished work must stop counting: an idle r0 wins the tie again after serving a request
    f = make(initial_replicas=2)
    f.submit(0.0, "az-a", M, 3000, 300, "a")
    f.submit(60.0, "az-a", M, 100, 5, "b")
    f.submit(61.0, "az-a", M, 100, 5, "c")
    recs = {r["request_id"]: r["node"] for r in f.advance_to(200.0)}
    assert recs == {"a": f"az-a/{M}/r0", "b": f"az-a/{M}/r0", "c": f"az-a/{M}/r0"}
    assert all(s["kv_blocks_used"] == 0 and s["running"] == 0 for s in f.gpu_snapshot(200.0))


def test_immediate_set_desired_reports_started() -> None:
    f = make(initial_replicas=0)
    change = f.set_desired("az-a", M, 2, 0.0)
    assert not change["scheduled"] and change["started"] == [f"az-a/{M}/r0", f"az-a/{M}/r1"]


def test_future_fail_replica_is_scheduled() -> None:
    f = make(initial_replicas=2)
    node = f.fail_replica("az-a", M, 50.0)
    f.advance_to(49.0)
    assert f.replicas("az-a", M)["gone"] == 0
    f.advance_to(50.0)
    assert f.replicas("az-a", M) == {"starting": 1, "ready": 1, "draining": 0, "gone": 1}
    assert node not in {g["node"] for g in f.gpu_snapshot(50.0)}


# -- KV allocator (issue 6) --------------------------------------------------------------
KV_KEYS = GPU_KEYS | {"fragmentation_ratio", "free_block_hist", "kv_generation", "kv_free_bytes", "kv_waiting_bytes"}
BLOCK_B = 512 * PM.kv_bytes_per_token


def fragmented(**kw) -> tuple[Fleet, dict]:
    """a, b, c take 2 blocks each of 10; b ends; d (6 blocks) waits behind a 2-block hole."""
    f = make(kv_allocator="contiguous", kv_capacity_tokens=10 * 512, **kw)
    for rid, out in (("a", 512), ("b", 10), ("c", 512)):
        f.submit(0.0, "az-a", M, 512, out, rid)
    f.advance_to(3.0)
    f.submit(3.0, "az-a", M, 2048, 1024, "d")
    f.advance_to(3.5)
    (g,) = f.gpu_snapshot(3.5)
    return f, g


def test_contiguous_allocator_gpu_record_fields() -> None:
    f, g = fragmented()
    assert set(g) == KV_KEYS
    json.dumps(g)
    assert (g["kv_blocks_used"], g["kv_blocks_total"], g["queue_len"]) == (4, 10, 1)
    assert g["largest_free_block_bytes"] == 4 * BLOCK_B  # free: 2 + 4 blocks, d needs 6
    assert g["kv_free_bytes"] == 6 * BLOCK_B and g["kv_waiting_bytes"] == 6 * BLOCK_B
    assert g["fragmentation_ratio"] == pytest.approx(1 - 4 / 6)
    assert sum(g["free_block_hist"]) == 2 and g["kv_generation"] > 0


def test_relocation_admits_the_waiting_request_and_pauses_the_moved_one() -> None:
    f, g = fragmented(kv_copy_bandwidth_bytes_s=1e8)
    res = f.relocate("az-a", M, g["node"], 10**12, g["kv_generation"], 3.5)
    assert res["moved_request_ids"] == ["c"] and res["bytes_moved"] == 2 * BLOCK_B
    assert res["duration_s"] == pytest.approx(2 * BLOCK_B / (1e8 * PM.tensor_parallel), rel=1e-3)
    assert res["pause_steps"] >= 1 and res["fragmentation_after"] == 0.0
    recs = {r["request_id"]: r for r in f.advance_to(200.0)}
    assert set(recs) == {"a", "c", "d"} and f.stats()["conserved"]  # b ended before 3.0 s
    # d was admitted at the next step boundary after the relocation, not after a or c finished
    assert recs["d"]["arrival_ms"] + recs["d"]["ttft_ms"] < recs["a"]["ts_ms"]
    # c and a were identical; c now ends pause_steps decode steps after a
    assert recs["c"]["ts_ms"] > recs["a"]["ts_ms"]


def test_relocation_refused_on_stale_generation_or_without_allocator() -> None:
    f, g = fragmented()
    stale = f.relocate("az-a", M, g["node"], 10**12, g["kv_generation"] - 1, 3.5)
    assert stale["refused"] == "generation changed" and stale["generation"] == g["kv_generation"]
    assert f.gpu_snapshot(3.5)[0]["largest_free_block_bytes"] == 4 * BLOCK_B  # nothing moved
    assert make().relocate("az-a", M, f"az-a/{M}/r0", 1, None, 0.0)["refused"] == "no kv allocator"
    assert f.relocate("az-a", M, "nope", 1, None, 0.0)["refused"] == "unknown node"


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_no_request_lost_across_relocations(kind: str) -> None:
    f = make(kv_allocator=kind, kv_capacity_tokens=131072, initial_replicas=2, jitter=True)
    tr = load_trace("mooncake").window(0.0, 120.0).scaled_to_qps(0.6)
    for i in range(len(tr)):
        f.submit(
            float(tr.arrival_s[i]),
            "az-a",
            M,
            int(tr.prompt_tokens[i]),
            int(tr.output_tokens[i]),
            f"q{i}",
            tr.hash_ids[i],
        )
    done: list[dict] = []
    for t in np.arange(1.0, 2000.0, 1.0):
        done += f.advance_to(float(t))
        for g in f.gpu_snapshot(float(t)):
            res = f.relocate("az-a", M, g["node"], 8 * BLOCK_B, g["kv_generation"], float(t))
            assert "refused" not in res
        assert f.stats()["conserved"]
    assert sorted(r["request_id"] for r in done) == sorted(f"q{i}" for i in range(len(tr)))
    assert all(g["kv_blocks_used"] == 0 for g in f.gpu_snapshot(2000.0))


def test_move_sessions_sends_waiting_requests_to_a_peer_with_room() -> None:
    f, g = fragmented(initial_replicas=1, startup_s=0.0)
    f.set_desired("az-a", M, 2, 3.5)
    f.advance_to(3.6)
    out = f.move_sessions("az-a", M, g["node"], 3.6)
    assert out["moved"] == {"d": f"az-a/{M}/r1"} and out["kept"] == 0
    recs = {r["request_id"]: r["node"] for r in f.advance_to(200.0)}
    assert recs["d"] == f"az-a/{M}/r1" and f.stats()["conserved"]


def test_agent_fields_of_a_workload_reach_the_request_records_and_the_zone_window() -> None:
    """A workload that carries the agent fields (docs/model.md §15 (agents); bench.agents
    does): the fleet's records carry them, validate, and the worker's processor averages them per
    zone window."""
    from governor_telemetry.records import encode_envelope, validate_record

    from core.settings import ModelSpec, Settings
    from loop.pipeline import TelemetryProcessor

    f = make(initial_replicas=2, epoch_ms0=0)
    agent = {"agent_stability": 0.9, "agent_rag_score": 0.9, "agent_tool_conf": 0.2, "agent_path": "rag"}
    for i in range(6):
        f.submit(0.1 * i, "az-a", M, 200, 5, f"a{i}", agent=agent if i % 2 else None)
    recs = [r for r in f.advance_to(60.0) if r["kind"] == "request"]
    assert len(recs) == 6 and all(validate_record(r) is None for r in recs)
    assert sum(set(agent) <= r.keys() for r in recs) == 3
    assert all(r.keys() == REQUEST_KEYS for r in recs if r["request_id"] in ("a0", "a2", "a4"))
    p = TelemetryProcessor(Settings(window_s=60.0, models=(ModelSpec(M, 2000.0, 200.0),)))
    assert not p.process(encode_envelope(recs, "sim", 0), {"topic": "t", "partition": 0, "offset": 0}, 0).dead_letters
    (zone,) = [w for w in p.close_due(10**6, 0) if w["scope"] == "zone"]
    assert zone["agent_signals_n"] == 3 and zone["agent_path_counts"] == {"rag": 3, "tool": 0, "llm": 0}
    assert zone["agent_tool_conf_mean"] == pytest.approx(0.2)
