"""Replica truth from the platform (loop/platform_truth.py) as the control loop uses it."""

from __future__ import annotations

import orjson
import pytest

from core.settings import ModelSpec, Settings
from loop.control_loop import ControlLoop
from loop.platform_truth import PlatformTruth
from tests.unit.test_scaler_driver import _window

SETTINGS = Settings(
    models=(ModelSpec("m", min_replicas=1, max_replicas=100),), window_s=10.0, zones=("az-a",), dead_time_comp=True
)


def _reading(ready: int, starting: int, at_ms: int) -> bytes:
    return orjson.dumps({"desired": ready + starting, "ready": ready, "starting": starting, "at_ms": at_ms})


def test_a_fresh_reading_replaces_the_gpu_counts_and_a_stale_one_does_not() -> None:
    truth = PlatformTruth(SETTINGS)
    assert truth.set("az-a", {b"m": _reading(4, 4, 10_000)}) == []
    w = _window(0, ready=4, starting=0)  # window ends at 10 000 ms
    assert (truth.apply(w).replicas_ready, truth.apply(w).replicas_starting) == (4, 4)
    late = _window(10, ready=4, starting=0)  # ends at 110 000 ms: the reading is 10 windows old
    assert truth.apply(late) is late


@pytest.mark.parametrize(
    "fields, why",
    [
        ({b"m": b"not json"}, "not a replica reading"),
        ({b"m": orjson.dumps({"ready": 1})}, "not a replica reading"),
        ({b"m": orjson.dumps({"ready": -1, "starting": 0, "at_ms": 1})}, "ints >= 0"),
        ({b"m": orjson.dumps({"ready": True, "starting": 0, "at_ms": 1})}, "ints >= 0"),
        ({b"m": orjson.dumps({"ready": 1.5, "starting": 0, "at_ms": 1})}, "ints >= 0"),
        ({b"m": orjson.dumps([1, 2, 3])}, "not a replica reading"),
        ({b"other": _reading(1, 0, 1)}, "not a configured model"),
    ],
)
def test_hostile_readings_are_refused_whole(fields: dict[bytes, bytes], why: str) -> None:
    truth = PlatformTruth(SETTINGS)
    (reason,) = truth.set("az-a", fields)
    assert why in reason
    assert truth.readings == {}


def test_unknown_zone_is_refused_and_state_stays_bounded() -> None:
    truth = PlatformTruth(SETTINGS)
    assert truth.set("az-z", {b"m": _reading(1, 0, 1)}) == ["zone 'az-z' is not configured"]
    for i in range(1000):
        truth.set("az-a", {f"x{i}".encode(): _reading(1, 0, 1)})
    assert truth.readings == {}


def test_pending_pods_count_as_starting_so_the_scaler_holds() -> None:
    """Violations stay high and 4 replicas are ready; the GPU records know of no more. Blind, the loop takes the
    missing capacity for a lost command or dead replicas and re-issues its target every 3 windows (reconcile);
    with the platform's reading (the rest Pending for GPUs, counted as starting) it holds."""
    blind, informed = ControlLoop(SETTINGS), ControlLoop(SETTINGS)
    reissued: list[int] = []
    for k in range(7):
        w = _window(k, eps=0.6, ready=4, rate=20)
        target = informed.scaler.targets().get(("m", "az-a"), 4)
        informed.platform.set("az-a", {b"m": _reading(4, target - 4, (k + 1) * 10_000)})
        b, i = blind.decide(w, (k + 1) * 10_000).commands, informed.decide(w, (k + 1) * 10_000).commands
        if k == 0:
            assert [c.target_replicas for c in b] == [c.target_replicas for c in i] and int(
                b[0].target_replicas or 0
            ) > 4
            continue
        reissued += [int(c.target_replicas or 0) for c in b]
        assert i == [], f"window {k}: the informed loop acted while its capacity was starting"
    assert len(reissued) >= 2  # blind: the same target again and again
    assert blind.scaler.targets() == informed.scaler.targets()  # and neither escalated past it
