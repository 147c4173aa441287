"""The node cap keeps a fleet's own nodes and holds a window it had to cut (issue 31, item 5).

1,024 junk GPU node ids a window, sent ahead of a fleet of 8, used to take every
slot of GOVERNOR_MAX_NODES_PER_WINDOW: the 8 real nodes' records were dropped
and the junk drove the fleet's target from 8 to 64.  Now the nodes of recent
windows keep their slots, new ids get at most ``max(64, known)`` a window, and a
window whose cap dropped more than 10 % of its records is held, with one dead
letter and a metric saying how many.
"""

from __future__ import annotations

from typing import Any

import pytest
from governor_telemetry.records import encode_envelope

from controllers.errors import ParameterError
from controllers.node_cap import NodeCap
from core.settings import ModelSpec, Settings
from loop.control_loop import ControlLoop
from streams.metrics_export import WorkerMetrics

MODEL, ZONE = "m", "az-a"
T0 = 1_700_000_000_000
WINDOW_MS = 10_000
REAL = tuple(f"{ZONE}/gpu-{i}" for i in range(8))


def _gpu(node: str, ts: int, running: float, queue: float) -> dict[str, Any]:
    return {
        "kind": "gpu",
        "ts_ms": ts,
        "model": MODEL,
        "zone": ZONE,
        "node": node,
        "state": "ready",
        "gpu_util": 0.6,
        "mem_used_bytes": 10,
        "mem_total_bytes": 20,
        "running": running,
        "queue_len": queue,
    }


def _req(node: str, i: int, ts: int, ttft_ms: float) -> dict[str, Any]:
    return {
        "kind": "request",
        "request_id": f"{node}-{i}",
        "ts_ms": ts,
        "model": MODEL,
        "zone": ZONE,
        "node": node,
        "ttft_ms": ttft_ms,
        "e2e_ms": ttft_ms + 400.0,
        "status": "ok",
    }


def _real(ts: int) -> list[dict[str, Any]]:
    """The fleet's own window: 8 nodes on their SLO, a GPU sample and 10 requests each."""
    out = []
    for node in REAL:
        out.append(_gpu(node, ts, running=2.0, queue=0.0))
        out += [_req(node, i, ts + i, ttft_ms=200.0) for i in range(10)]
    return out


def _junk(k: int, ts: int) -> list[dict[str, Any]]:
    """1,024 fresh node ids that claim a saturated fleet: one GPU sample and one missed request each."""
    out = []
    for i in range(1024):
        node = f"junk-{k}-{i}"
        out += [_gpu(node, ts, running=30.0, queue=20.0), _req(node, 0, ts, ttft_ms=30_000.0)]
    return out


def _run(loop: ControlLoop, k: int, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any], Any]:
    """Window ``k``: ingest ``records`` (in 500s), close it, decide its records: (zone record, commands, out)."""
    ts = T0 + k * WINDOW_MS + 100
    for first in range(0, len(records), 500):
        loop.ingest(encode_envelope(records[first : first + 500], "t", ts), {"partition": 0, "offset": k}, ts)
    end = T0 + (k + 1) * WINDOW_MS
    closed = loop.close_due(end + 2_000)
    zone, commands, events = [], [], []
    for m in closed:
        rec, dl = loop.decode(m, {"partition": 0, "offset": k}, end + 2_000)
        assert rec is not None, dl
        out = loop.decide(rec, end + 2_000)
        commands += [c for c in out.commands if c.kind == "scale"]
        events += out.events
        if m["scope"] == "zone":
            zone.append(m)
    return zone, commands, (closed, events)


def test_junk_node_ids_do_not_evict_the_fleet_nor_move_its_target() -> None:
    metrics = WorkerMetrics()
    settings = Settings(models=(ModelSpec(MODEL, max_replicas=64),), zones=(ZONE,), window_s=10.0, lateness_s=1.0)
    loop = ControlLoop(settings, metrics)
    for k in range(3):  # the fleet alone: 8 nodes, on its SLO
        (zone,), _, _ = _run(loop, k, _real(T0 + k * WINDOW_MS + 100))
        assert zone["nodes"] == 8
    before = loop.scaler.targets().get((MODEL, ZONE))
    dropped_total = 0
    held_kinds = []
    for k in range(3, 9):  # 1,024 fresh junk ids a window, each window ahead of the fleet's records
        ts = T0 + k * WINDOW_MS + 100
        (zone,), commands, (closed, events) = _run(loop, k, _junk(k, ts) + _real(ts))
        nodes = {m["node"] for m in closed if m["scope"] == "node"}
        assert set(REAL) <= nodes, f"window {k}: real nodes evicted"
        assert zone["node_cap_dropped_rate"] > 0.1  # most of the junk had no slot ...
        assert commands == [], f"window {k}: {[(c.target_replicas, c.reason) for c in commands]}"  # ... so held
        letters = loop.ingests.drain_dead_letters()
        assert [d["record"]["dropped_records"] for d in letters] == [zone["node_cap_dropped"]]  # one, counted
        dropped_total += zone["node_cap_dropped"]
        held_kinds += [e["reason"] for e in events if e["kind"] == "telemetry_stale"]
    assert loop.scaler.targets().get((MODEL, ZONE)) == before  # the target did not move
    labels = {"model": MODEL, "zone": ZONE}
    assert metrics.registry.get_sample_value("governor_window_node_cap_dropped_total", labels) == dropped_total
    assert metrics.registry.get_sample_value("governor_deadletter_total", {"reason": "too many nodes"}) == 6
    assert held_kinds == ["node_cap"]  # stale after 3 held windows, reported once


def _open(cap: NodeCap, nodes: tuple[str, ...], start: int) -> list[str]:
    """Offer ``nodes`` (none open yet) to the window at ``start`` in order: those admitted."""
    admitted: list[str] = []
    for node in nodes:
        if cap.admits("m", "z", node, start, open_nodes=len(admitted)):
            cap.opened("m", "z", node, start)
            admitted.append(node)
    return admitted


def test_known_nodes_keep_their_slots_and_new_ids_grow_by_at_most_the_known_fleet() -> None:
    cap = NodeCap(max_nodes=10, window_ms=1000, new_floor=2)
    assert _open(cap, ("a", "b", "c"), 0) == ["a", "b"]  # nothing known yet: new_floor new ids
    assert cap.close("m", "z", 0, ["a", "b"]) == 0
    # window 1: a and b known; new ids may add max(new_floor, 2 known) = 2, whoever comes first
    assert _open(cap, ("x1", "x2", "x3", "a", "b"), 1000) == ["x1", "x2", "a", "b"]
    assert not cap.admits("m", "z", "c", 1000, open_nodes=4)
    assert cap.admits("m", "z", "a", 2000, open_nodes=9) and not cap.admits("m", "z", "a", 2000, open_nodes=10)
    assert cap.fits("m", "z", 2000, ["a", "b", "q"], open_nodes=0)  # one new of the 2 allowed
    assert not cap.fits("m", "z", 2000, ["q", "r", "s"], open_nodes=0)
    cap.close("m", "z", 1000, ["x1", "x2", "a", "b"])
    cap.close("m", "z", 3000, ["x1"])
    assert set(cap.known[("m", "z")]) == {"x1", "x2", "a", "b"}  # windows 1000, 2000, 3000: the last 3
    cap.close("m", "z", 4000, ["x1"])
    assert set(cap.known[("m", "z")]) == {"x1"}  # a, b and x2 last seen 4 windows ago
    # 10 known of a 10-node cap: no new id gets a slot, a known one does
    full = NodeCap(max_nodes=10, window_ms=1000)
    full.close("m", "z", 0, [f"n{i}" for i in range(10)])
    assert not full.admits("m", "z", "new", 1000, open_nodes=0) and full.admits("m", "z", "n3", 1000, open_nodes=0)


@pytest.mark.parametrize("field", ["max_nodes", "window_ms", "recent_windows", "new_floor"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_cap_parameter_out_of_range_is_refused(field: str, bad: object) -> None:
    kw: dict[str, Any] = {"max_nodes": 4, "window_ms": 1000, field: bad}
    with pytest.raises(ParameterError, match=field):
        NodeCap(**kw)
