"""Zone-aware capacity (controllers.zone_capacity): hand-worked cases.

Windows are 10 s; ``demand_alpha=1`` makes a zone's demand its last arrival
rate, so every floor below can be checked by hand.
"""

from __future__ import annotations

import pickle

import pytest

from controllers.errors import ParameterError
from controllers.zone_capacity import (
    HEALING,
    LOST,
    UP,
    ZoneCapacityParams,
    ZoneCapacityState,
    ZoneState,
    ZoneWindow,
    floor_rps,
    observe,
    weights,
)

pytestmark = pytest.mark.timeout(30)

AB = ("a", "b")


def _p(zones: tuple[str, ...] = AB, **kw) -> ZoneCapacityParams:
    return ZoneCapacityParams(zones=zones, window_s=10.0, demand_alpha=1.0, **kw)


def _feed(p, s, zone, end_s, rps, ready=3, starting=0):
    s, ev = observe(p, s, zone, ZoneWindow(int(end_s * 1000), rps, ready, starting))
    return s, [e.kind for e in ev]


def _steady(p, demands: dict[str, float], ends=(10, 20)):
    s = ZoneCapacityState()
    for end in ends:
        for z, d in demands.items():
            s, ev = _feed(p, s, z, end, d)
            assert ev == []
    return s


def _cut_b_at_50(p):
    """a=6, b=4 rps until 20 s; then only a reports (6 rps at 30, 40, 50): b lost at 50."""
    s = _steady(p, {"a": 6.0, "b": 4.0})
    kinds = []
    for end in (30, 40, 50):
        s, ev = _feed(p, s, "a", end, 6.0)
        kinds.append(ev)
    return s, kinds


@pytest.mark.parametrize(
    ("timeout", "lost_at_s"),
    [
        (1, 40),  # b's window ending 30 missing when a's ending 40 arrives
        (2, 50),  # the default: two windows missed
        (3, 60),
    ],
)
def test_silent_zone_is_lost_after_the_timeout(timeout: int, lost_at_s: int) -> None:
    p = _p(loss_timeout_windows=timeout)
    s = _steady(p, {"a": 6.0, "b": 4.0})
    for end in range(30, 80, 10):
        s, ev = _feed(p, s, "a", end, 6.0)
        assert ev == (["zone_lost"] if end == lost_at_s else []), end
    assert s.zones["b"].status == LOST


def test_one_late_window_is_not_a_loss() -> None:
    """b misses the window ending 30 (a reports 30 and 40), then reports 40: still up."""
    p = _p()
    s = _steady(p, {"a": 6.0, "b": 4.0})
    s, ev1 = _feed(p, s, "a", 30, 6.0)
    s, ev2 = _feed(p, s, "a", 40, 6.0)
    s, ev3 = _feed(p, s, "b", 40, 4.0)
    s, ev4 = _feed(p, s, "a", 50, 6.0)
    assert ev1 == ev2 == ev3 == ev4 == []
    assert s.zones["b"].status == UP


def test_zone_without_demand_is_not_lost_when_silent() -> None:
    p = _p()
    s = _steady(p, {"a": 6.0, "b": 0.0})
    for end in range(30, 100, 10):
        s, ev = _feed(p, s, "a", end, 6.0)
        assert ev == []
    assert s.zones["b"].status == UP and floor_rps(p, s, "a", 90_000) == 0.0


def test_dark_windows_with_demand_are_a_loss() -> None:
    """b keeps reporting 4 rps arriving but nothing provisioned: lost at its second such window."""
    p = _p()
    s = _steady(p, {"a": 6.0, "b": 4.0})
    s, ev = _feed(p, s, "b", 30, 4.0, ready=0, starting=0)
    assert ev == []
    s, ev = _feed(p, s, "b", 40, 4.0, ready=0, starting=0)
    assert ev == ["zone_lost"]
    assert floor_rps(p, s, "a", 40_000) == 10.0  # 6 + b's 4 (its demand before it went dark)


def test_loss_shifts_the_lost_demand_to_the_survivors_at_once() -> None:
    p = _p()
    s, kinds = _cut_b_at_50(p)
    assert kinds == [[], [], ["zone_lost"]]
    assert floor_rps(p, s, "a", 40_000) == 10.0  # a's 6 + b's 4
    assert weights(p, s) == {"a": 1.0, "b": 0.0}
    # Three zones: c's 3 rps split evenly over a and b.
    p3 = _p(("a", "b", "c"))
    s3 = _steady(p3, {"a": 6.0, "b": 6.0, "c": 3.0})
    for end in (30, 40, 50):
        for z in ("a", "b"):
            s3, ev = _feed(p3, s3, z, end, 6.0)
    assert s3.zones["c"].status == LOST
    assert floor_rps(p3, s3, "a", 50_000) == floor_rps(p3, s3, "b", 50_000) == 7.5
    assert weights(p3, s3) == {"a": 0.5, "b": 0.5, "c": 0.0}


def test_lost_event_says_what_moved() -> None:
    p = _p()
    s = _steady(p, {"a": 6.0, "b": 4.0})
    for end in (30, 40):
        s, _ = _feed(p, s, "a", end, 6.0)
    s, ev = observe(p, s, "a", ZoneWindow(50_000, 6.0, 3, 0))
    d = ev[0].to_dict()
    assert d["kind"] == "zone_lost" and d["zone"] == "b" and d["window_end_ms"] == 50_000
    assert d["demand_rps"] == 4.0 and d["shifted_rps"] == {"a": 4.0}
    assert d["weights"] == {"a": 1.0, "b": 0.0} and "2 windows" in d["reason"]


def test_heal_waits_for_ready_capacity_then_returns_the_traffic() -> None:
    """Capacity 2 rps/replica at 80 %: b's share of a's 10 rps is 5 rps = 3.125 replicas;
    it gets its traffic back at 0.9 x 3.125 = 2.8, i.e. with 3 ready."""
    p = _p(capacity_rps=2.0)
    s, _ = _cut_b_at_50(p)
    s, ev = _feed(p, s, "a", 60, 10.0)  # a now carries everything
    assert ev == []
    s, ev = _feed(p, s, "b", 60, 0.0, ready=0, starting=4)
    assert ev == ["zone_healed"]
    assert s.zones["b"].status == HEALING
    assert weights(p, s) == {"a": 1.0, "b": 0.0}  # no traffic to a zone with nothing ready
    assert floor_rps(p, s, "b", 60_000) == 5.0  # sized for its share at once
    assert floor_rps(p, s, "a", 60_000) == 10.0  # a keeps its shifted floor meanwhile
    s, ev = _feed(p, s, "a", 70, 10.0)
    s, ev = _feed(p, s, "b", 70, 0.0, ready=2, starting=2)
    assert ev == [] and s.zones["b"].status == HEALING
    s, ev = _feed(p, s, "a", 80, 10.0)
    s, ev = _feed(p, s, "b", 80, 0.0, ready=3, starting=1)
    assert ev == ["zone_returned"]
    assert weights(p, s) == {"a": 0.5, "b": 0.5}
    # Hysteresis: both floors held release_windows (3) more windows, then released.
    assert floor_rps(p, s, "a", 100_000) == 10.0 and floor_rps(p, s, "b", 100_000) == 5.0
    assert floor_rps(p, s, "a", 110_000) == 0.0 and floor_rps(p, s, "b", 110_000) == 0.0


def test_heal_without_a_capacity_profile_returns_when_all_started_or_after_the_wait() -> None:
    p = _p(max_heal_windows=3)
    s, _ = _cut_b_at_50(p)
    kinds = []
    for end in (60, 70, 80, 90):
        s, _ = _feed(p, s, "a", end, 10.0)
        s, ev = _feed(p, s, "b", end, 0.0, ready=0, starting=4)  # never ready
        kinds.append(ev)
    assert kinds == [["zone_healed"], [], [], ["zone_returned"]]  # 3 windows after 60
    p2 = _p()
    s2, _ = _cut_b_at_50(p2)
    s2, _ = _feed(p2, s2, "b", 60, 0.0, ready=0, starting=4)
    s2, ev = _feed(p2, s2, "b", 70, 0.0, ready=4, starting=0)  # all started replicas ready
    assert ev == ["zone_returned"]


def test_healing_zone_silent_again_is_lost_again_without_a_second_shift() -> None:
    p = _p(capacity_rps=2.0)
    s, _ = _cut_b_at_50(p)
    s, _ = _feed(p, s, "b", 60, 0.0, ready=0, starting=4)
    kinds = []
    for end in (60, 70, 80, 90):
        s, ev = _feed(p, s, "a", end, 10.0)
        kinds.append(ev)
    assert kinds == [[], [], [], ["zone_lost"]]  # b's last window ended 60: two missed at 90
    assert floor_rps(p, s, "a", 90_000) == 10.0  # still 6 + 4, not + 4 again


def test_redelivered_window_changes_nothing() -> None:
    p = _p()
    s = _steady(p, {"a": 6.0, "b": 4.0})
    s2, ev = observe(p, s, "a", ZoneWindow(20_000, 99.0, 0, 0))
    assert s2 is s and ev == []


@pytest.mark.parametrize(
    ("zones", "demands", "k", "floors"),
    [
        # 2 zones, N+1: each zone carries everything (its share x 2/1)
        (AB, {"a": 6.0, "b": 4.0}, 1, {"a": 10.0, "b": 10.0}),
        # 3 equal zones, N+1: share 6 x 3/2 = 9
        (("a", "b", "c"), {"a": 6.0, "b": 6.0, "c": 6.0}, 1, {"a": 9.0, "b": 9.0, "c": 9.0}),
        # unequal: own + half of the largest other (the worst single loss)
        (("a", "b", "c"), {"a": 9.0, "b": 6.0, "c": 3.0}, 1, {"a": 12.0, "b": 10.5, "c": 7.5}),
        # N+2 over 3 zones: own + both others / 1: every zone carries everything
        (("a", "b", "c"), {"a": 6.0, "b": 6.0, "c": 6.0}, 2, {"a": 18.0, "b": 18.0, "c": 18.0}),
        # no redundancy, no loss: no floor
        (AB, {"a": 6.0, "b": 4.0}, 0, {"a": 0.0, "b": 0.0}),
    ],
)
def test_redundancy_floors(zones, demands, k, floors) -> None:
    p = _p(zones, redundancy=k)
    s = _steady(p, demands)
    assert {z: floor_rps(p, s, z, 20_000) for z in zones} == pytest.approx(floors)


def test_redundancy_budget_is_spent_by_a_loss() -> None:
    """3 zones, N+1; c lost: the survivors hold the shift (6 + 3) and no N+1 floor on top."""
    p = _p(("a", "b", "c"), redundancy=1)
    s = _steady(p, {"a": 6.0, "b": 6.0, "c": 6.0})
    for end in (30, 40, 50):
        for z in ("a", "b"):
            s, _ = _feed(p, s, z, end, 6.0)
    assert s.zones["c"].status == LOST
    assert floor_rps(p, s, "a", 50_000) == 9.0


def test_state_round_trips() -> None:
    p = _p(capacity_rps=2.0)
    s, _ = _cut_b_at_50(p)
    again = ZoneCapacityState.from_dict(s.to_dict())
    assert again == s and pickle.loads(pickle.dumps(s)) == s
    assert floor_rps(p, again, "a", 50_000) == 10.0


def test_unknown_zone_is_ignored() -> None:
    p = _p()
    s, ev = observe(p, ZoneCapacityState(), "zz", ZoneWindow(10_000, 5.0, 1, 0))
    assert ev == [] and s.zones == {}
    assert floor_rps(p, s, "zz", 10_000) == 0.0
    assert weights(p, ZoneCapacityState({"a": ZoneState(status=LOST), "b": ZoneState(status=LOST)})) == {
        "a": 0.5,
        "b": 0.5,
    }  # nothing up: no better choice than equal shares


@pytest.mark.parametrize(
    "kw",
    [
        {"zones": ()},
        {"zones": ("a", "a")},
        {"zones": AB, "window_s": 0.0},
        {"zones": AB, "loss_timeout_windows": 0},
        {"zones": AB, "redundancy": 2},
        {"zones": AB, "demand_alpha": 0.0},
        {"zones": AB, "return_ready_fraction": 1.5},
        {"zones": AB, "capacity_rps": -1.0},
        {"zones": AB, "release_windows": -1},
        {"zones": AB, "target_util": 2.2},
    ],
)
def test_bad_parameters_are_refused(kw) -> None:
    with pytest.raises(ParameterError):
        ZoneCapacityParams(**kw)
