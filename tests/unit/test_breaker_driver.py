"""BreakerDriver: zone windows -> breaker commands per zone; its snapshot; the
worker's SnapshotStore; the breaker metrics."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import pytest

from controllers.window_record import WindowRecord, WindowRecordError, decode_window
from core.settings import Settings
from loop.breaker_driver import BreakerDriver, parse_window
from loop.commands import Command
from loop.control_loop import ControlLoop
from loop.errors import SnapshotVersionError
from streams.metrics_export import WorkerMetrics

pytestmark = pytest.mark.timeout(30)

M = "llama2-70b"
ZONES = ("az-a", "az-b", "az-c")
S = Settings(zones=ZONES, breaker_min_requests=200)


def _raw(
    end_s: float,
    count: int,
    error_rate: float = 0.0,
    violation_rate: float | None = None,
    zone: str = "az-a",
    model: str = M,
    **kw: Any,
) -> dict[str, Any]:
    """The metrics record as the ingest publishes it."""
    end = int(end_s * 1000)
    return {
        "kind": "window",
        "scope": "zone",
        "model": model,
        "zone": zone,
        "window_start_ms": end - 10_000,
        "window_end_ms": end,
        "count": count,
        "error_rate": error_rate,
        "violation_rate": error_rate if violation_rate is None else violation_rate,
        **kw,
    }


def _w(*args: Any, **kw: Any) -> WindowRecord:
    """The typed record the drivers read (:func:`_raw`, decoded)."""
    return decode_window(_raw(*args, **kw))


def _tripped(d: BreakerDriver) -> list[Command]:
    assert d.on_window(_w(10, 150, 0.02), 1) == []  # 150 requests: not more than 200 yet
    return d.on_window(_w(20, 150, 0.02), 2)  # 300 requests, 6 errors


def test_trip_emits_one_command_per_zone_with_the_exact_payload() -> None:
    d = BreakerDriver.from_settings(S)
    cmds = _tripped(d)
    assert [c.zone for c in cmds] == list(ZONES)
    thr = 0.005 * (1 + 0.5 * (1 - 0.98))  # attainment: 2 % of the requests violated
    for c in cmds:
        assert c.kind == "breaker" and c.controller == "breaker" and c.basis_ms == 20_000
        assert c.model == f"{M}|az-a"  # executors order breaker commands per target
        assert c.payload == {
            "target": f"{M}|az-a",
            "state": "open",
            "probe_budget": 0,
            "threshold": pytest.approx(thr),
            "error_ratio": 0.02,
        }
        assert c.reason.startswith("trip: error_ratio 0.02 > threshold")
        assert Command.decode(c.encode()) == c
    assert len({c.command_id for c in cmds}) == len(ZONES)
    assert d.state_of(f"{M}|az-a") == "open" and d.state_of(f"{M}|az-b") == "closed"
    assert [(t.model, t.zone, t.state) for t in d.drain_transitions()] == [(M, "az-a", "open")]
    assert d.drain_transitions() == []


def test_no_command_while_the_state_is_unchanged() -> None:
    d = BreakerDriver.from_settings(S)
    for i in range(1, 6):  # 0.4 % errors on 300-request windows: below the 0.5 % threshold
        assert d.on_window(_w(10 * i, 300, 0.004), i) == []
    assert d.drain_transitions() == [] and d.state_of(f"{M}|az-a") == "closed"
    d = BreakerDriver.from_settings(S)
    _tripped(d)
    assert d.on_window(_w(30, 500, 0.5), 3) == []  # open: traffic while open is ignored
    assert d.on_window(_w(40, 0), 4) == []  # 20 s of the 30 s cool-down
    assert [t.state for t in d.drain_transitions()] == ["open"]


def test_half_open_after_open_for_s_then_closes_after_passing_probes() -> None:
    d = BreakerDriver.from_settings(S)
    _tripped(d)
    cmds = d.on_window(_w(50, 0), 5)  # 30 s after the trip at 20 s
    assert {c.payload["state"] for c in cmds} == {"half_open"} and len(cmds) == len(ZONES)
    assert cmds[0].payload["probe_budget"] == 20 and cmds[0].basis_ms == 50_000
    assert d.on_window(_w(60, 10), 6) == []  # 10 of 20 probes: still probing, no command
    cmds = d.on_window(_w(70, 15), 7)
    assert [c.payload["state"] for c in cmds] == ["closed"] * len(ZONES)
    assert cmds[0].reason.startswith("probes passed")
    assert [t.state for t in d.drain_transitions()] == ["open", "half_open", "closed"]


def test_failed_probes_reopen_with_backoff() -> None:
    d = BreakerDriver.from_settings(S)
    _tripped(d)
    d.on_window(_w(50, 0), 5)
    cmds = d.on_window(_w(60, 20, 0.1), 6)
    assert cmds[0].payload["state"] == "open" and "re-open for 60 s" in cmds[0].reason
    assert d.on_window(_w(110, 0), 7) == []  # 50 s of 60
    assert d.on_window(_w(120, 0), 8)[0].payload["state"] == "half_open"


def test_an_open_target_without_windows_is_advanced_by_other_targets_windows() -> None:
    d = BreakerDriver.from_settings(S)
    _tripped(d)
    assert d.on_window(_w(40, 100, zone="az-b"), 4) == []  # az-a's cool-down not over
    cmds = d.on_window(_w(50, 100, zone="az-b"), 5)
    assert {(c.payload["target"], c.payload["state"]) for c in cmds} == {(f"{M}|az-a", "half_open")}
    assert cmds[0].basis_ms == 50_000
    # az-a's own window of that period was gathered while open: ignored, not a probe.
    assert d.on_window(_w(50, 40, 1.0), 6) == []
    assert d.state_of(f"{M}|az-a") == "half_open"


def test_redelivered_window_is_ignored() -> None:
    d = BreakerDriver.from_settings(S)
    w = _w(10, 150, 0.02)
    d.on_window(w, 1)
    assert d.on_window(w, 1) == []  # would have made 300 requests and tripped
    assert d.state_of(f"{M}|az-a") == "closed"


def test_attainment_is_the_models_over_every_zone_for_five_minutes() -> None:
    d = BreakerDriver.from_settings(S)
    d.on_window(_w(10, 100, 0.0, violation_rate=0.0), 1)
    d.on_window(_w(10, 100, 0.0, violation_rate=0.5, zone="az-b"), 1)
    d.on_window(_w(10, 100, 0.0, violation_rate=1.0, model="bloom-176b"), 1)  # another model
    assert d.attainment(M) == 0.75
    d.on_window(_w(20, 101, 0.1, violation_rate=0.1), 2)
    assert d.on_window(_w(20, 0, zone="az-b"), 2) == []
    for i in range(3, 33):  # 5 minutes of clean windows push the slow zone out
        d.on_window(_w(10 * i, 0, zone="az-b"), i)
    assert d.attainment(M) == pytest.approx((100 + 91) / 201)


@pytest.mark.parametrize(
    "bad",
    [
        {"count": None},  # no request count
        {"count": -1},  # negative count
        {"count": 1.5},  # not an int
        {"error_rate": "x"},  # not a number
        {"error_rate": 2.0},  # above 1
        {"violation_rate": -0.1},  # below 0
        {"error_rate": math.nan},  # NaN
        {"window_end_ms": None},  # no window end
        {"window_end_ms": math.inf},  # infinite end
        {"model": None},  # no model
        {"zone": ""},  # empty zone
    ],
)
def test_malformed_windows_are_dead_lettered_not_fed_to_the_breaker(bad: dict[str, Any]) -> None:
    (field,) = bad
    with pytest.raises(WindowRecordError, match=f"^{field}:"):
        decode_window({**_raw(10, 150, 0.02), **bad})
    loop = ControlLoop(S)
    rec, dl = loop.decode({**_raw(10, 150, 0.02), **bad}, {"topic": "metrics"}, 1)
    assert rec is None and dl is not None and dl["reason"].startswith(f"bad metrics record: {field}:")
    assert loop.breaker.on_window(_w(20, 150, 0.02), 2) == []  # the bad window did not count
    assert loop.breaker.on_window(_w(30, 100, 0.02), 3)[0].payload["state"] == "open"


def test_node_windows_and_other_records_are_ignored() -> None:
    d = BreakerDriver.from_settings(S)
    assert d.on_window(decode_window({**_raw(10, 5000, 0.5), "scope": "node", "node": "az-a/n1"}), 1) == []
    assert d.states == {}
    with pytest.raises(WindowRecordError, match="^kind:"):  # not a window: dead-lettered by the loop
        decode_window({**_raw(10, 5000, 0.5), "kind": "event"})
    # A window without a count is an empty one (decode's default), not an error.
    w = parse_window(decode_window({"scope": "zone", "model": "m", "zone": "z", "window_end_ms": 1}))
    assert (w.requests, w.errors, w.on_time, w.end_ms) == (0, 0, 0, 1)


def _stream() -> list[WindowRecord]:
    """Two zones over 4 minutes: az-a trips, its probes fail, then it recovers; az-b stays closed."""
    out = []
    for i in range(1, 25):
        bad = 0.03 if i < 8 else 0.0
        out += [_w(10 * i, 120, bad, zone="az-a"), _w(10 * i, 150, 0.001, violation_rate=0.2, zone="az-b")]
    return out


def plain(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """``snapshot`` as it comes back from Redis: JSON text and back.  Fails on anything
    that is not plain JSON data (NaN, non-string keys, objects), which the worker's
    ``orjson.dumps`` would refuse or silently turn into something else."""
    out = json.loads(json.dumps(snapshot, allow_nan=False))
    assert orjson.loads(orjson.dumps(snapshot)) == out
    return out


def assert_restores_alike(
    make: Callable[[], Any],
    feed: Callable[[Any, WindowRecord], list[Command]],
    records: list[WindowRecord],
    cut: int,
) -> list[bytes]:
    """Feed ``records[:cut]``, snapshot (through JSON), restore into a fresh object, feed
    the rest to both: the same commands (byte for byte) and the same final snapshot.
    Returns them."""
    a = make()
    for r in records[:cut]:
        feed(a, r)
    taken = a.snapshot()
    at_cut = plain(taken)
    b = make()
    b.restore(at_cut)
    rest_a = [c.encode() for r in records[cut:] for c in feed(a, r)]
    rest_b = [c.encode() for r in records[cut:] for c in feed(b, r)]
    assert rest_a == rest_b
    assert plain(b.snapshot()) == plain(a.snapshot())
    assert plain(taken) == at_cut  # a snapshot is a value: deciding on does not change it
    return rest_a


@pytest.mark.parametrize("cut", [3, 9, 14, 20])
def test_a_restored_breaker_driver_decides_like_the_original(cut: int) -> None:
    rest = assert_restores_alike(
        lambda: BreakerDriver.from_settings(S), lambda d, w: d.on_window(w, w.window_end_ms + 5), _stream(), cut
    )
    assert rest  # every cut has transitions ahead (trip at 2, probes at 8-10, recovery at 22-24)


def test_breaker_snapshot_of_another_version_is_ignored() -> None:
    d = BreakerDriver.from_settings(S)
    _tripped(d)
    with pytest.raises(SnapshotVersionError):
        d.restore({"version": 99, "targets": {}})
    assert d.state_of(f"{M}|az-a") == "open"
    bad = plain(d.snapshot())
    assert bad["targets"][f"{M}|az-a"]["state"]["name"] == "open"
    bad["targets"][f"{M}|az-a"]["state"]["name"] = "ajar"
    with pytest.raises(ValueError):  # the worker's SnapshotStore logs it and starts fresh
        BreakerDriver.from_settings(S).restore(bad)
    with pytest.raises(ValueError):
        d.restore(bad)
    assert d.state_of(f"{M}|az-a") == "open"  # a failed restore changes nothing


def test_breaker_metrics() -> None:
    m = WorkerMetrics()
    m.observe_breaker(M, "az-a", "open", changed=True)
    m.observe_breaker(M, "az-a", "half_open", changed=True)
    m.observe_breaker(M, "az-b", "closed", changed=False)
    val = m.registry.get_sample_value
    assert val("governor_breaker_state", {"model": M, "zone": "az-a"}) == 1.0
    assert val("governor_breaker_state", {"model": M, "zone": "az-b"}) == 0.0
    assert val("governor_breaker_transitions_total", {"model": M, "zone": "az-a", "state": "open"}) == 1.0
    assert val("governor_breaker_transitions_total", {"model": M, "zone": "az-b", "state": "closed"}) is None
    m.observe_breaker(M, "az-a", "open", changed=True)
    assert val("governor_breaker_state", {"model": M, "zone": "az-a"}) == 2.0
