"""The control loop in memory: every per-event method, no broker, no Redis.

The Faust agents only move bytes around these calls, so what the worker decides
is what these tests see.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from controllers.window_record import WindowRecord, decode_window
from core.settings import ModelSpec, Settings
from core.signing import Keyring
from loop.control_loop import ControlLoop
from streams.metrics_export import WorkerMetrics
from tests.unit.test_scaler_driver import BRISK

T0 = 1_700_000_000_000
MODEL = "m"
GIB = 1 << 30


def _settings(**kw: Any) -> Settings:
    kw.setdefault("pid_gains", BRISK)
    return Settings(
        models=(ModelSpec(MODEL, max_replicas=20),), zones=("az-a", "az-b"), window_s=1.0, lateness_s=0.2, **kw
    )


def _req(i: int, ts: int, zone: str = "az-a", ttft: float = 100.0) -> dict[str, Any]:
    return {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": ts,
        "model": MODEL,
        "zone": zone,
        "node": f"{zone}-n1",
        "ttft_ms": ttft,
        "e2e_ms": ttft + 900.0,
        "status": "ok",
    }


def _gpu(ts: int, zone: str = "az-a") -> dict[str, Any]:
    return {
        "kind": "gpu",
        "ts_ms": ts,
        "model": MODEL,
        "zone": zone,
        "node": f"{zone}-n1",
        "state": "ready",
        "gpu_util": 0.9,
        "mem_used_bytes": 10,
        "mem_total_bytes": 20,
        "queue_len": 2,
        "running": 4,
        "largest_free_block_bytes": GIB,
        "kv_free_bytes": 4 * GIB,
        "kv_waiting_bytes": 2 * GIB,
        "fragmentation_ratio": 0.75,
        "kv_generation": 1,
    }


def _batch(records: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"schema_version": 1, "kind": "batch", "source": "t", "sent_ms": T0, "records": records})


SRC = {"topic": "telemetry", "partition": 0, "offset": 1}


def _zone(**kw: Any) -> WindowRecord:
    base = {"scope": "zone", "model": MODEL, "zone": "az-a", "window_end_ms": T0 + 10_000, "window_s": 10.0}
    return decode_window({**base, **kw})


def test_ingest_dead_letters_bad_records_and_closes_windows_by_event_time() -> None:
    loop = ControlLoop(_settings())
    first = loop.ingest(_batch([_req(0, T0), {"kind": "request"}, _gpu(T0)]), SRC, T0)
    assert first.valid == 2
    assert [dl["reason"] for dl in first.dead_letters] == ["missing field 'request_id'"]
    assert first.windows == []  # nothing is due yet
    later = loop.ingest(_batch([_req(1, T0 + 2_000)]), SRC, T0 + 2_000)
    scopes = sorted(w["scope"] for w in later.windows)
    assert scopes == ["node", "zone"]  # the first second's windows, closed by the watermark
    assert all(decode_window(w).window_end_ms == T0 + 1_000 for w in later.windows)


def test_close_due_closes_by_the_clock_when_traffic_stops() -> None:
    loop = ControlLoop(_settings())
    loop.ingest(_batch([_req(0, T0)]), SRC, T0)
    assert loop.close_due(T0 + 500) == []
    closed = loop.close_due(T0 + 60_000)  # long idle: the clock closes what is open
    assert {w["scope"] for w in closed} == {"node", "zone"}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "bad metrics record: not JSON"),
        (b"[1, 2]", "bad metrics record: record: must be a JSON object, got list"),
        (orjson.dumps({"scope": "zone", "model": MODEL, "zone": "az-a"}), "bad metrics record: window_end_ms: missing"),
        (
            orjson.dumps({"scope": "zone", "model": MODEL, "zone": "az-a", "window_end_ms": 1, "violation_rate": 3}),
            "bad metrics record: violation_rate: must lie in [0, 1], got 3",
        ),
    ],
)
def test_decode_dead_letters_what_is_not_a_window_record(raw: bytes, reason: str) -> None:
    metrics = WorkerMetrics()
    rec, dl = ControlLoop(_settings(), metrics).decode(raw, {"topic": "metrics", "offset": 7}, T0)
    assert rec is None and dl is not None
    assert dl["reason"] == reason and dl["source"] == {"topic": "metrics", "offset": 7}
    # the counter's label is the reason's kind (bounded cardinality); the record keeps the detail
    assert metrics.registry.get_sample_value("governor_deadletter_total", {"reason": "bad metrics record"}) == 1.0


def test_decide_scales_a_zone_on_violations_and_ignores_a_redelivery() -> None:
    loop = ControlLoop(_settings())
    w = _zone(count=100, violation_rate=0.5, replicas_ready=2)
    first = loop.decide(w, T0 + 10_000)
    assert [(c.kind, c.zone, c.target_replicas) for c in first.commands] == [("scale", "az-a", 3)]
    assert first.described == ["m -> 3"]
    assert loop.decide(w, T0 + 10_000).commands == []  # the same window again: no new decision


def test_decide_runs_the_kv_policy_on_node_windows() -> None:
    loop = ControlLoop(_settings())
    node = decode_window(
        {
            "scope": "node",
            "model": MODEL,
            "zone": "az-a",
            "node": "n1",
            "window_end_ms": T0 + 10_000,
            "replicas_ready": 1,
            "largest_free_block_bytes": GIB,
            "kv_free_bytes": 4 * GIB,
            "kv_waiting_bytes": 2 * GIB,
            "fragmentation_ratio": 0.75,
            "kv_generation": 1,
        }
    )
    out = loop.decide(node, T0 + 10_000)
    assert [c.kind for c in out.commands] == ["relocate"]
    assert out.described == ["relocate n1"]


def test_decide_trips_the_breaker_and_publishes_to_every_zone() -> None:
    loop = ControlLoop(_settings(breaker_min_requests=100))
    out = loop.decide(_zone(count=500, error_rate=0.05, replicas_ready=4), T0 + 10_000)
    breakers = [c for c in out.commands if c.kind == "breaker"]
    assert sorted(c.zone for c in breakers) == ["az-a", "az-b"]
    assert {c.payload["state"] for c in breakers} == {"open"}


def test_a_lost_zone_turns_into_zone_aware_route_commands() -> None:
    loop = ControlLoop(_settings())
    routes: list[Any] = []
    for k in range(20):
        for zone in ("az-a", "az-b") if k < 5 else ("az-a",):  # az-b goes dark after 5 windows
            w = _zone(zone=zone, window_end_ms=T0 + (k + 1) * 10_000, count=80, rate_rps=8.0, replicas_ready=4)
            out = loop.decide(w, T0 + (k + 1) * 10_000)
            routes += [c for c in out.commands if c.kind == "route"]
            assert all(ev["model"] == MODEL for ev in out.events)
    assert routes, "zone loss published no route command"
    weights = routes[0].payload["weights"]["*"]
    assert weights[f"{MODEL}|az-b"] == 0.0 and weights[f"{MODEL}|az-a"] == 1.0
    assert {c.zone for c in routes} == {"az-a", "az-b"}


def test_snapshot_and_restore_carry_every_driver_and_decide_alike() -> None:
    windows = [
        _zone(window_end_ms=T0 + (k + 1) * 10_000, count=100, violation_rate=0.3 if k < 4 else 0.0, replicas_ready=2)
        for k in range(12)
    ]
    original = ControlLoop(_settings())
    assert original.snapshot_scopes() == {}  # owns nothing before its first window: writes nothing
    for w in windows[:6]:
        original.decide(w, w.window_end_ms)
    data = orjson.loads(orjson.dumps(original.snapshot_scopes()))
    assert set(data) == {f"model:{MODEL}"}  # one scope per model (no routed family configured)
    assert set(data[f"model:{MODEL}"]) == {"kv", "breaker", "agents", "scaler"}
    restored = ControlLoop(_settings())
    done, failed = restored.restore_scope(f"model:{MODEL}", data[f"model:{MODEL}"])
    assert done["scaler"] == 1 and failed == {}
    assert restored.owned == {f"model:{MODEL}"}  # a restored scope is saved again
    for w in windows[6:]:
        assert restored.decide(w, w.window_end_ms).commands == original.decide(w, w.window_end_ms).commands


def test_each_model_and_family_is_its_own_scope() -> None:
    s = Settings(
        models=(ModelSpec("big"), ModelSpec("small"), ModelSpec("other")),
        zones=("az-a", "az-b"),
        fallbacks=(("big", "small"),),
    )
    loop = ControlLoop(s)
    assert loop.scopes() == ["model:big", "model:small", "model:other", "family:big"]
    w = decode_window({**_zone().to_dict(), "model": "small", "violation_rate": 0.5, "replicas_ready": 2})
    loop.decide(w, T0 + 10_000)
    scopes = loop.snapshot_scopes()
    assert set(scopes) == {"model:small", "family:big"}  # "big" and "other" belong to whoever decides them
    assert set(scopes["family:big"]) == {"routing"}
    assert all(k[0] == "small" for k in loop.scaler.states)
    # a part in the wrong scope is refused, the rest loads
    done, failed = ControlLoop(s).restore_scope(
        "family:big", {"routing": scopes["family:big"]["routing"], "scaler": {}}
    )
    assert "routing" in done and "scaler" in failed


def test_a_part_that_does_not_load_leaves_only_that_driver_fresh() -> None:
    loop = ControlLoop(_settings())
    loop.decide(_zone(count=100, violation_rate=0.5, replicas_ready=2), T0 + 10_000)
    data = orjson.loads(orjson.dumps(loop.snapshot_scopes()))[f"model:{MODEL}"]
    data["scaler"]["states"] = [["m", "az-a", {"ctrl": "not a state"}]]
    data["kv"]["version"] = 99
    fresh = ControlLoop(_settings())
    done, failed = fresh.restore_scope(f"model:{MODEL}", data)
    assert "scaler" not in done and fresh.scaler.states == {}
    assert failed["kv"].startswith("version") and not failed["scaler"].startswith("version")
    assert done["breaker"] == 1 and fresh.breaker.states == loop.breaker.states


def test_metrics_follow_the_events() -> None:
    metrics = WorkerMetrics()
    loop = ControlLoop(_settings(), metrics)
    loop.ingest(_batch([_req(0, T0), _gpu(T0)]), SRC, T0)
    loop.ingest(_batch([_req(1, T0 + 2_000)]), SRC, T0 + 2_000)
    loop.decide(_zone(count=100, violation_rate=0.5, replicas_ready=2), T0 + 10_000)
    value = metrics.registry.get_sample_value
    assert value("governor_records_total") == 3.0
    assert value("governor_windows_closed_total", {"scope": "zone"}) == 1.0
    assert value("governor_replicas_target", {"model": MODEL, "zone": "az-a"}) == 3.0
    # the window closed by the second message holds request r0; the decided record is not a closed window
    assert value("governor_requests_total", {"model": MODEL, "zone": "az-a"}) == 1.0
    assert value("governor_slo_violations_total", {"model": MODEL, "zone": "az-a"}) == 0.0


# -- authenticated window records ---------------------------------------------------------
KEYS = "k1:" + bytes(range(32)).hex()
WINDOW = {
    "scope": "zone",
    "model": MODEL,
    "zone": "az-a",
    "window_end_ms": T0 + 10_000,
    "window_s": 10.0,
    "count": 100,
    "violation_rate": 1.0,
    "replicas_ready": 2,
}


def _keyed(keys: str = KEYS, metrics: WorkerMetrics | None = None) -> ControlLoop:
    return ControlLoop(_settings(), metrics, Keyring.parse(keys))


def test_a_signed_window_record_decodes() -> None:
    value, headers = _keyed().sign_window(WINDOW)
    assert [h for h, _ in headers] == ["governor-kid", "governor-sig"]
    rec, dl = _keyed().decode(value, SRC, T0, dict(headers))
    assert dl is None and rec is not None and rec.violation_rate == 1.0


def _command_signature_headers(value: bytes) -> dict[str, bytes]:
    """A command's valid signature over the same object, replayed as a window MAC."""
    cmd = Keyring.parse(KEYS).sign(orjson.loads(value))
    return {"governor-kid": cmd["key_id"].encode(), "governor-sig": cmd["signature"].encode()}


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("unsigned", "no MAC"),
        ("wrong key", "bad MAC (key id k1)"),
        ("unknown key id", "unknown key id 'k9'"),
        ("tampered value", "bad MAC (key id k1)"),
        ("command signature", "bad MAC (key id k1)"),
    ],
)
def test_an_unauthenticated_window_record_is_a_dead_letter(case: str, why: str) -> None:
    value, headers = _keyed().sign_window(WINDOW)
    h: dict[str, bytes] | None = dict(headers)
    if case == "unsigned":
        h = None
    elif case == "wrong key":
        value, headers = _keyed("k1:" + bytes(range(32, 64)).hex()).sign_window(WINDOW)
        h = dict(headers)
    elif case == "unknown key id":
        value, headers = _keyed("k9:" + bytes(range(32)).hex()).sign_window(WINDOW)
        h = dict(headers)
    elif case == "tampered value":
        value = value.replace(b'"replicas_ready":2', b'"replicas_ready":1')
        assert b'"replicas_ready":1' in value
    elif case == "command signature":
        h = _command_signature_headers(value)
    metrics = WorkerMetrics()
    loop = _keyed(metrics=metrics)
    rec, dl = loop.decode(value, SRC, T0, h)
    assert rec is None and dl is not None
    assert dl["reason"] == f"unauthenticated window record: {why}"
    labels = {"reason": "unauthenticated window record"}
    assert metrics.registry.get_sample_value("governor_deadletter_total", labels) == 1.0
    assert loop.scaler.states == {}  # nothing reached a driver


def test_without_a_keyring_nothing_is_signed_or_verified() -> None:
    loop = ControlLoop(_settings())
    value, headers = loop.sign_window(WINDOW)
    assert headers == [] and orjson.loads(value) == WINDOW
    assert loop.decode(value, SRC, T0)[0] is not None


def _replayed_six_replica_loop(metrics: WorkerMetrics | None = None) -> ControlLoop:
    """A loop restored from the snapshot of a quiet 6-replica fleet (issue 31, item 4: replayed later)."""
    # The restore hold alone: the scale-down stabilisation (dwell, window; issue 35) would hold these windows
    # too, so it is off here (no dwell, no window, a zero start-up hint so W = max(0, 2 x 0)).
    settings = Settings(
        models=(ModelSpec(MODEL, max_replicas=100),),
        zones=("az-a",),
        window_s=10.0,
        pid_gains=BRISK,
        scale_down_dwell_windows=0,
        scale_down_stabilization_s=0.0,
        startup_hint_s=0.0,
    )
    old = ControlLoop(settings)
    for k in range(5):
        old.decide(_zone(window_end_ms=T0 + (k + 1) * 10_000, count=100, replicas_ready=6, rate_rps=10.0), T0)
    snap = orjson.loads(orjson.dumps(old.snapshot_scopes()))[f"model:{MODEL}"]
    assert old.scaler.targets() == {(MODEL, "az-a"): 6}
    loop = ControlLoop(settings, metrics)
    assert loop.restore_scope(f"model:{MODEL}", snap)[0]["scaler"] == 1
    return loop


def _targets_at_64(loop: ControlLoop, violation_rate: float, windows: int) -> tuple[list[list[int | None]], list[str]]:
    """The scale targets each window commands with the fleet at 64, and the events' kinds."""
    targets: list[list[int | None]] = []
    kinds: list[str] = []
    for k in range(5, 5 + windows):
        w = _zone(window_end_ms=T0 + (k + 1) * 10_000, count=100, violation_rate=violation_rate, replicas_ready=64)
        out = loop.decide(w, w.window_end_ms)
        targets.append([c.target_replicas for c in out.commands if c.kind == "scale"])
        kinds += [ev["kind"] for ev in out.events]
    return targets, kinds


def _exported(metrics: WorkerMetrics) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels.values()): s.value
        for fam in metrics.target.collect()
        for s in fam.samples
        if s.name.endswith("target")
    }


def test_a_replayed_snapshot_cannot_shrink_a_fleet_its_fresh_windows_hold() -> None:
    """Fleet at 64, fresh windows on the SLO (hold): the replayed 6 is never commanded nor exported.

    Before: the restored target was exported at once (6) and re-issued as a reconcile at the 3rd window.
    """
    metrics = WorkerMetrics()
    loop = _replayed_six_replica_loop(metrics)
    assert _exported(metrics) == {}  # absent until a fresh window: KEDA holds the replicas
    targets, kinds = _targets_at_64(loop, loop.settings.eps_ref, 10)
    assert targets == [[]] * 10
    assert kinds.count("restore_hold") == 1  # the first window's 6 (from the restored level), held
    assert loop.scaler.targets() == {(MODEL, "az-a"): 64} and _exported(metrics) == {(MODEL, "az-a"): 64.0}


def test_after_a_restore_a_scale_down_waits_for_three_fresh_windows() -> None:
    """Fleet at 64, fresh windows under the SLO (shrink): held twice, the third acts, from 64 not from 6."""
    loop = _replayed_six_replica_loop()
    targets, kinds = _targets_at_64(loop, 0.0, 5)
    assert targets[:2] == [[], []]
    assert len(targets[2]) == 1 and 48 <= (targets[2][0] or 0) < 64  # the fresh windows' own step down (before: 6)
    assert kinds.count("restore_hold") == 2
    assert all(48 <= (t or 0) < 64 for t in targets[3] + targets[4])  # then as any loop: no hold left
