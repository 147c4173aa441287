"""Response-time analysis (controllers/rta.py): worked examples, worked by hand here, plus a schedule simulator.

Every expected number below is computed in the comments from the recurrence
(never copied from a printed table), and a discrete-time simulation of the
preemptive fixed-priority schedule from the critical instant is an independent
oracle for random task sets.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controllers.errors import ParameterError
from controllers.rta import (
    AnalysisBudget,
    AnalysisTooCostly,
    Task,
    analyse,
    critical_scaling,
    critical_scaling_exact,
    liu_layland,
    liu_layland_bound,
    response_time,
    response_times,
    task_slack,
)


def test_design_source_example() -> None:
    # tau1 (C=2, T=5, D=5) highest, tau2 (C=3, T=8, D=7).
    # R1 = 2.  R2: w0 = 3; w1 = 3 + ceil(3/5)*2 = 5; w2 = 3 + ceil(5/5)*2 = 5 -> fixed, R2 = 5 <= 7.
    ts = [Task("t1", 2, 5, 5, priority=1), Task("t2", 3, 8, 7, priority=2)]
    assert response_time(ts, "t1") == 2
    assert response_time(ts, "t2") == 5
    # Scaling every C by 1 + e: w = 3(1+e) -> 5(1+e) > 5, so ceil(w/5) = 2 and w = 7(1+e) > 7: infeasible.
    # The set is critically schedulable: lambda* = 1, margin 0.
    assert critical_scaling_exact(ts) == 1.0
    assert critical_scaling(ts) == pytest.approx(1.0, rel=1e-5)
    # C2 alone: 3 + d -> w = 5 + d > 5 -> 3 + d + 4 <= 7 only for d = 0.  C1 alone: 3 + C1 <= 5 needs C1 <= 2.
    assert task_slack(ts, "t2") == pytest.approx(0.0, abs=1e-5)
    assert task_slack(ts, "t1") == pytest.approx(0.0, abs=1e-5)


def test_rta_decides_where_liu_layland_cannot() -> None:
    # Rate-monotonic (C, T): (1, 4), (2, 6), (3, 10); U = 0.25 + 0.3333 + 0.3 = 0.8833 > 3(2^(1/3) - 1) = 0.7798.
    ts = [Task("a", 1, 4, priority=1), Task("b", 2, 6, priority=2), Task("c", 3, 10, priority=3)]
    assert liu_layland(ts) is None  # the bound is only sufficient: undecided
    # R_a = 1.  R_b: 2 -> 2 + ceil(2/4)*1 = 3 -> 2 + ceil(3/4)*1 = 3.
    # R_c: 3 -> 3 + 1 + 2 = 6 -> 3 + ceil(6/4)*1 + ceil(6/6)*2 = 7 -> 3 + 2 + ceil(7/6)*2 = 9
    #      -> 3 + ceil(9/4)*1 + ceil(9/6)*2 = 10 -> 3 + ceil(10/4) + ceil(10/6)*2 = 3 + 3 + 4 = 10.
    assert [response_time(ts, n) for n in "abc"] == [1, 3, 10]
    # Lehoczky points of c: 4, 8 (T_a), 6 (T_b), 10 (D_c): W(4) = 1+2+3 = 6, W(6) = 2+2+3 = 7,
    # W(8) = 2+4+3 = 9, W(10) = 3+4+3 = 10 -> max t/W = 10/10 = 1.  b: W(4) = 3, W(6) = 4 -> 1.5.  a: 4.
    assert critical_scaling_exact(ts) == 1.0


def test_jitter_and_blocking() -> None:
    # tau1: C=1, T=4, J=1 -> R1 = 1 + J1 = 2.
    # tau2: C=2, T=10, D=9, B=1: w0 = 3; w1 = 3 + ceil((3+1)/4)*1 = 4; w2 = 3 + ceil((4+1)/4)*1 = 5;
    #       w3 = 3 + ceil((5+1)/4)*1 = 5 -> R2 = 5 + J2 (0) = 5.
    ts = [Task("t1", 1, 4, jitter=1, priority=1), Task("t2", 2, 10, 9, blocking=1, priority=2)]
    assert response_time(ts, "t1") == 2
    assert response_time(ts, "t2") == 5
    with pytest.raises(ParameterError, match="jitter"):
        critical_scaling_exact(ts)
    # Blocking alone: one task C=2, T=D=5, B=3 -> R = 5: feasible, and no C growth is possible.
    solo = [Task("s", 2, 5, blocking=3)]
    assert response_time(solo, "s") == 5
    assert critical_scaling_exact(solo) == 1.0


def test_infeasible_set_stops_at_the_deadline() -> None:
    # (3, 5), (3, 8): w = 3 -> 3 + 3 = 6 -> 3 + ceil(6/5)*3 = 9 > 8: infeasible.
    ts = [Task("a", 3, 5, priority=1), Task("b", 3, 8, priority=2)]
    assert response_time(ts, "b") == math.inf
    results, lam = analyse(ts)
    assert [r.feasible for r in results] == [True, False]
    assert lam < 1.0
    # By hand: b needs lambda*(3 + 3*ceil(t/5)) <= t for t in {5, 8}: 5/6 and 8/9 -> lambda* = 8/9.
    assert critical_scaling_exact(ts) == pytest.approx(8 / 9)
    assert lam == pytest.approx(8 / 9, rel=1e-5)


def test_liu_layland() -> None:
    assert liu_layland_bound(1) == 1.0
    assert liu_layland_bound(2) == pytest.approx(2 * (math.sqrt(2) - 1))
    assert liu_layland_bound(1000) == pytest.approx(math.log(2), rel=1e-3)
    assert liu_layland([Task("a", 1, 4, priority=1), Task("b", 1, 5, priority=2)]) is True  # U = 0.45
    # Not rate-monotonic, or D < T: the bound does not apply.
    assert liu_layland([Task("a", 1, 5, priority=1), Task("b", 1, 4, priority=2)]) is None
    assert liu_layland([Task("a", 1, 5, 4)]) is None


def test_priority_order_not_list_order() -> None:
    ts = [Task("low", 3, 8, 7, priority=2), Task("high", 2, 5, 5, priority=1)]
    assert response_time(ts, "low") == 5 and response_time(ts, "high") == 2


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"c": -1, "t": 5}, "c=-1"),
        ({"c": 1, "t": 0}, "t=0"),
        ({"c": 1, "t": 5, "d": 6}, "deadline 6 > period 5"),
        ({"c": 1, "t": float("nan")}, "finite"),
        ({"c": True, "t": 5}, "finite number"),
        ({"c": 1, "t": 5, "jitter": -1}, "jitter"),
    ],
)
def test_hostile_tasks(kw: dict[str, float], match: str) -> None:
    with pytest.raises(ParameterError, match=match):
        Task("x", **kw)  # type: ignore[arg-type]


def test_duplicate_names_refused() -> None:
    with pytest.raises(ParameterError, match="unique"):
        response_time([Task("a", 1, 5), Task("a", 1, 6)], "a")


def _simulate(tasks: list[Task]) -> dict[str, float]:
    """Preemptive fixed-priority schedule from the synchronous release, unit time steps; worst response per task.

    Simulates one hyperperiod; with D <= T and synchronous release the first job is the worst (critical instant).
    """
    hyper = math.lcm(*(int(t.t) for t in tasks))
    order = sorted(range(len(tasks)), key=lambda i: (tasks[i].priority, i))
    remaining = [0] * len(tasks)
    released = [0] * len(tasks)
    worst = [0.0] * len(tasks)
    for now in range(hyper):
        for i, t in enumerate(tasks):
            if now % int(t.t) == 0:
                if remaining[i] > 0:
                    worst[i] = math.inf  # the previous job is still running: it missed
                remaining[i], released[i] = int(t.c), now
        for i in order:
            if remaining[i] > 0:
                remaining[i] -= 1
                if remaining[i] == 0:
                    worst[i] = max(worst[i], now + 1 - released[i])
                break
    for i in range(len(tasks)):
        if remaining[i] > 0:
            worst[i] = math.inf
    return {t.name: w for t, w in zip(tasks, worst, strict=True)}


@st.composite
def task_sets(draw: st.DrawFn) -> list[Task]:
    n = draw(st.integers(1, 4))
    out = []
    for i in range(n):
        t = draw(st.sampled_from([3, 4, 5, 6, 8, 10, 12, 15, 20]))
        c = draw(st.integers(0, max(1, t // 2)))
        d = draw(st.integers(max(1, c), t))
        out.append(Task(f"t{i}", c, t, d, priority=draw(st.integers(0, 3))))
    return out


@given(task_sets())
@settings(max_examples=200, deadline=None, derandomize=True)
def test_rta_equals_the_simulated_schedule(ts: list[Task]) -> None:
    # Up to the first task that can miss, every higher-priority job completes within its period, so the
    # simulated schedule is exact there; past it, the simulator (which drops a late job) is not a reference.
    sim = _simulate(ts)
    for t in sorted(ts, key=lambda t: (t.priority, ts.index(t))):
        r = response_time(ts, t.name)
        if not math.isfinite(r):
            assert sim[t.name] > t.deadline, (t, ts)
            return
        if t.c > 0:  # a zero-length job has no response in the simulator
            assert sim[t.name] == r, (t, ts)


@given(task_sets())
@settings(max_examples=150, deadline=None, derandomize=True)
def test_bisection_matches_lehoczky(ts: list[Task]) -> None:
    exact = critical_scaling_exact(ts)
    approx = critical_scaling(ts)
    if math.isinf(exact) or math.isinf(approx):
        assert all(t.c == 0 for t in ts) or exact == approx
        return
    assert approx == pytest.approx(exact, rel=1e-4, abs=1e-6)


def test_exact_where_a_relative_tolerance_stopped_short() -> None:
    # C1 = 1, T1 = 2; C2 = 2e9, T2 = 4e9.  w = 2e9 + ceil(w / 2): the gap to 4e9 halves each step
    # (2e9, 3e9, 3.5e9, ...), so a 1e-9 relative tolerance (4 at 4e9) stopped at 3,999,999,989.
    # Exactly: 4e9 = 2e9 + 2e9 is the fixed point, and a deadline one below it can be missed.
    ts = [Task("t1", 1, 2, priority=1), Task("t2", 2e9, 4e9, priority=2)]
    assert response_time(ts, "t2") == 4_000_000_000
    assert response_times(ts) == {"t1": 1, "t2": 4_000_000_000}
    tight = [ts[0], Task("t2", 2e9, 4e9, 3_999_999_999, priority=2)]
    assert response_time(tight, "t2") == math.inf
    results, lam = analyse(tight, slack=False)
    assert [r.feasible for r in results] == [True, False] and lam is not None and lam < 1


def test_no_iteration_cap_decides_a_verdict() -> None:
    # C1 = 4,999,980, T1 = 5e6 (U1 = 1 - 4e-6); C2 = 4e6, T2 = D2 = 1e12.  From w = 4e6 each step adds one
    # more job of t1 (m (T1 - C1) = 20 m < C2 while m < 200,000): 200,000 steps to the fixed point
    # w = 4e6 + 200,000 x 4,999,980 = 1e12 = ceil(1e12 / 5e6) x C1 + C2.  A cap of 100,000 steps called it
    # infeasible; here R = D exactly: feasible, and one less deadline is not.
    ts = [Task("t1", 4_999_980, 5e6, priority=1), Task("t2", 4e6, 1e12, priority=2)]
    assert response_time(ts, "t2") == 1e12
    results, lam = analyse(ts, slack=False)
    assert all(r.feasible for r in results) and lam == 1.0  # critically feasible: lambda* = 1 exactly
    assert response_time([ts[0], Task("t2", 4e6, 1e12, 1e12 - 1, priority=2)], "t2") == math.inf


def test_utilisation_over_one_is_infeasible_at_once() -> None:
    # U_hp = 0.6 + 0.5 > 1: the lowest task never finishes, whatever its deadline (no steps spent on it).
    ts = [Task("a", 3, 5, priority=0), Task("b", 4, 8, priority=1), Task("c", 1, 1e12, priority=2)]
    budget = AnalysisBudget(100)
    assert response_times(ts, budget) == {"a": 3, "b": math.inf, "c": math.inf}
    # A task that needs no processor time still responds at once.
    assert response_time([*ts, Task("z", 0, 10, priority=3)], "z") == 0


def test_a_budget_refuses_instead_of_guessing() -> None:
    # The recurrence stays exact; a caller that must bound its work gets no verdict past the budget.
    ts = [Task(f"t{i}", 1, 1000 + i, priority=i) for i in range(50)]
    assert all(math.isfinite(r) for r in response_times(ts, AnalysisBudget(100_000)).values())
    with pytest.raises(AnalysisTooCostly, match="budget"):
        response_times(ts, AnalysisBudget(100))
    with pytest.raises(ParameterError, match="budget terms"):
        AnalysisBudget(0)


@st.composite
def tight_sets(draw: st.DrawFn) -> list[Task]:
    """Small integer sets, priorities rate-monotonic or not, utilisation often near or over 1."""
    n = draw(st.integers(1, 5))
    out = []
    for i in range(n):
        t = draw(st.sampled_from([2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 15]))
        c = draw(st.integers(0, t))
        d = draw(st.integers(max(1, c), t))
        out.append(Task(f"t{i}", c, t, d, priority=draw(st.integers(0, 4))))
    return out


@given(tight_sets(), st.sampled_from([1, 2**-20, 1e9, 3]))
@settings(max_examples=300, deadline=None, derandomize=True)
@example([Task("a", 2, 3, priority=0), Task("b", 1, 7, priority=1), Task("c", 1, 15, priority=2)], 1e9)
@example([Task("a", 1, 2, priority=0), Task("b", 2, 4, priority=1)], 2**-20)  # R = D = 4: feasible, exactly
def test_exact_rta_equals_the_simulated_schedule(ts: list[Task], unit: float) -> None:
    # The simulator runs the synchronous release (the critical instant) in integer time steps; the analysis
    # runs on the same set in another unit (2^-20: dyadic; 1e9 and 3: large and odd): R must be exactly
    # unit x the simulated response, up to the first task that can miss, which both must call a miss.
    sim = _simulate(ts)
    scaled = [Task(t.name, t.c * unit, t.t * unit, t.deadline * unit, priority=t.priority) for t in ts]
    rs = response_times(scaled)
    results, lam = analyse(scaled, slack=False)
    for t in sorted(ts, key=lambda t: (t.priority, ts.index(t))):
        if not math.isfinite(rs[t.name]):
            assert sim[t.name] > t.deadline, (t, ts)
            assert lam is not None and lam < 1 and not all(r.feasible for r in results)
            return
        if t.c > 0:
            assert rs[t.name] == sim[t.name] * unit, (t, ts)
    assert all(r.feasible for r in results) and lam is not None and lam >= 1
