"""Deadline feasibility of fixed-priority periodic tasks: response-time analysis (pure).

An agent that must answer every ``T`` ms (a voice turn every 500 ms, a trading
check every 300 ms) is a periodic task: period ``T``, relative deadline
``D <= T``, worst-case execution time ``C`` (its request's latency on the
model that serves it), a fixed priority, release jitter ``J`` and blocking
``B`` (time a lower-priority request holds what this one needs, e.g. a batch
step that cannot be pre-empted).

**Worst-case response time** (Joseph & Pandya 1986; jitter and blocking as in
Audsley, Burns, Richardson, Tindell & Wellings 1993).  For task ``i`` with the
set ``hp(i)`` of higher-priority tasks, the busy window ``w`` is the least
fixed point of

    w(0)   = C_i + B_i
    w(k+1) = C_i + B_i + sum_{j in hp(i)} ceil((w(k) + J_j) / T_j) * C_j

and ``R_i = w + J_i``.  The iteration is non-decreasing; it stops at the fixed
point or as soon as ``w + J_i`` exceeds ``D_i`` (the task can miss its
deadline: :func:`response_time` returns ``inf``).  Without jitter and blocking
this is the recurrence of the design source (seed-spec section 2.2).  The test
is exact (necessary and sufficient) for ``D_i <= T_i``, synchronous release
and independent tasks; with jitter it is the standard sufficient bound.

**Liu & Layland bound** (1973): with ``D_i = T_i`` and rate-monotonic
priorities, ``U = sum C_i / T_i <= n (2^(1/n) - 1)`` is sufficient (not
necessary): :func:`liu_layland`.  It is the quick first check; the
recurrence decides.

**Robustness margin** (seed-spec 2.5, "the margin to infeasibility"): the
critical scaling factor ``lambda*`` (Lehoczky, Sha & Ding 1989): the largest
``lambda`` such that the set with every ``C_i`` multiplied by ``lambda``
still meets every deadline.  ``lambda* - 1`` is how much every execution time
may grow together before some task misses (0 = critically schedulable,
negative = already infeasible).  Feasibility is monotone in ``lambda``
(every ``R_i`` is non-decreasing in every ``C_j``), so :func:`critical_scaling`
finds it by bisection on the recurrence, to a relative tolerance;
:func:`critical_scaling_exact` computes it exactly at Lehoczky's scheduling
points (no jitter), and the tests check that both agree.  Per task,
:func:`task_slack` is how much that one ``C_i`` may grow alone.

**Exact.**  Times are numbers in any one unit (the loop uses ms); every one
of them (a float is a dyadic rational) is put on one integer scale, so the
recurrence, the deadline test and the bisections' feasibility checks run in
exact integer arithmetic: no tolerance decides a verdict (``R_i`` is exactly
its fixed point, and ``R_i = D_i`` is feasible).  There is no iteration cap:
``w`` grows by at least the smallest positive ``C_j`` a step and stops past
``D_i``.  Two standard speedups keep the steps few: ``w`` starts at the lower
bound ``(C_i + B_i + sum_j C_j J_j / T_j) / (1 - U_hp)`` (every fixed point lies
above it; taken 1e-6 lower than its float value, which is still below it), and
with ``U_hp > 1`` a task that needs the processor can never finish
(infeasible at once).  Warm starts (an earlier, smaller set's ``R``) serve the
bisections.  A caller that must bound the work passes an
:class:`AnalysisBudget`: past it the analysis raises
:class:`AnalysisTooCostly` (no verdict, never a wrong one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from controllers.errors import ParameterError

__all__ = [
    "AnalysisBudget",
    "AnalysisTooCostly",
    "Task",
    "TaskResult",
    "analyse",
    "critical_scaling",
    "critical_scaling_exact",
    "liu_layland",
    "liu_layland_bound",
    "response_time",
    "response_times",
    "task_slack",
]

# The float lower bound of a busy window is used this much lower: its rounding error is below 1e-9 relative
# (n terms of 2^-53 each, over 1 - U_hp >= _U_MARGIN).  Near U_hp = 1 no jump is taken.
_BOUND_SLACK = 1e-6
_U_MARGIN = 1e-6


class AnalysisTooCostly(ParameterError):
    """The analysis needs more recurrence steps than its :class:`AnalysisBudget`: no verdict (neither yes nor no)."""


class AnalysisBudget:
    """How many recurrence terms (one higher-priority task in one step) an analysis may evaluate.

    >>> b = AnalysisBudget(10)
    >>> b.spend(4); b.left
    6
    """

    def __init__(self, terms: int) -> None:
        if isinstance(terms, bool) or not isinstance(terms, int) or terms <= 0:
            raise ParameterError(f"budget terms={terms!r}: must be an int > 0")
        self.terms = terms
        self.left = terms

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise AnalysisTooCostly(f"the analysis needs more than {self.terms} recurrence terms (its budget)")


@dataclass(frozen=True)
class Task:
    """A periodic task; ``priority``: smaller = more urgent (ties: the order given)."""

    name: str
    c: float  # worst-case execution time
    t: float  # period
    d: float | None = None  # relative deadline (None: = period)
    priority: int = 0
    jitter: float = 0.0
    blocking: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ParameterError(f"task name must be a non-empty string, got {self.name!r}")
        for field, value, positive in (
            ("c", self.c, False),
            ("t", self.t, True),
            ("jitter", self.jitter, False),
            ("blocking", self.blocking, False),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ParameterError(f"task {self.name}: {field}={value!r} must be a finite number")
            if value < 0 or (positive and value <= 0):
                raise ParameterError(f"task {self.name}: {field}={value!r} must be {'> 0' if positive else '>= 0'}")
        d = self.deadline
        if isinstance(d, bool) or not isinstance(d, int | float) or not math.isfinite(d) or d <= 0:
            raise ParameterError(f"task {self.name}: deadline {self.d!r} must be a finite number > 0")
        if d > self.t:
            raise ParameterError(f"task {self.name}: deadline {d} > period {self.t} (the analysis needs D <= T)")

    @property
    def deadline(self) -> float:
        return self.t if self.d is None else self.d

    @property
    def utilisation(self) -> float:
        return self.c / self.t


@dataclass(frozen=True)
class TaskResult:
    name: str
    response: float  # inf: can miss its deadline; else the exact response, rounded to the nearest float
    deadline: float
    slack: float  # how much this task's C may grow alone (0 when it already misses)

    @property
    def feasible(self) -> bool:
        # Exact: R <= D (a float) rounds to a float <= D, and a task that can miss has R = inf.
        return self.response <= self.deadline


def _ordered(tasks: Sequence[Task]) -> list[Task]:
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ParameterError("task names must be unique")
    return [t for _, t in sorted(enumerate(tasks), key=lambda it: (it[1].priority, it[0]))]


@dataclass(frozen=True)
class _Ints:
    """Tasks in priority order on one integer scale: ``value = int / scale`` exactly."""

    scale: int
    c: list[int]
    t: list[int]
    d: list[int]
    j: list[int]
    b: list[int]

    @classmethod
    def of(cls, order: Sequence[Task], c: Sequence[Fraction] | None = None) -> _Ints:
        """``order``'s times (``c`` in place of their C when given) as integers on their least common scale."""
        return _Rows(order).ints([Fraction(t.c) for t in order] if c is None else c)

    def exact(self, r: int | None) -> Fraction | None:
        return None if r is None else Fraction(r, self.scale)


class _Rows:
    """The exact T, D, J, B of ``order`` (kept: only the C change from one feasibility check to the next)."""

    def __init__(self, order: Sequence[Task]) -> None:
        cols = [
            [Fraction(v) for v in col]
            for col in zip(*((t.t, t.deadline, t.jitter, t.blocking) for t in order), strict=True)
        ] or [[], [], [], []]
        self.scale = math.lcm(1, *(f.denominator for col in cols for f in col))
        self.base = [[f.numerator * (self.scale // f.denominator) for f in col] for col in cols]
        self.last: tuple[int, list[list[int]]] = (self.scale, self.base)  # the last finer scale asked for

    def ints(self, c: Sequence[Fraction]) -> _Ints:
        scale = math.lcm(self.scale, *(f.denominator for f in c))
        if self.last[0] != scale:
            self.last = (scale, [[v * (scale // self.scale) for v in col] for col in self.base])
        t, d, j, b = self.last[1]
        return _Ints(scale, [f.numerator * (scale // f.denominator) for f in c], t, d, j, b)


def _start(order_bound: float, scale: int) -> int:
    """A float lower bound (original units) as a scaled integer below it; 0 when it says nothing."""
    if not math.isfinite(order_bound) or order_bound <= 0:
        return 0
    return math.floor(Fraction(order_bound) * scale)


def _busy(
    s: _Ints,
    i: int,
    known: Fraction | None,
    hc: list[int],
    ht: list[int],
    hj: list[int],
    u: float,
    a: float,
    budget: AnalysisBudget | None,
) -> int | None:
    """Task ``i``'s exact ``R`` (scaled) under the higher-priority tasks ``hc, ht, hj``; None: it can miss."""
    base = s.c[i] + s.b[i]
    limit = s.d[i] - s.j[i]  # w must not exceed D - J
    w = base if known is None else max(base, math.floor(known * s.scale) - s.j[i])
    if hc:
        num = base / s.scale + a
        if u > 1 + _U_MARGIN and num > 0:
            return None  # f(x) >= num + U x > x: no fixed point at all
        if u < 1 - _U_MARGIN and num > 1e-290:  # (normal floats: the relative error bound holds)
            w = max(w, _start(num / (1 - u) * (1 - _BOUND_SLACK), s.scale))
    while w <= limit:
        if budget is not None:
            budget.spend(len(hc) + 1)
        nxt = base + sum([-((-w - jj) // tt) * cc for cc, tt, jj in zip(hc, ht, hj, strict=True)])
        if nxt <= w:  # from below the least fixed point f(w) >= w: equal, w is R - J
            return w + s.j[i]
        w = nxt
    return None


def _responses(
    s: _Ints,
    start: Sequence[Fraction | None] | None = None,
    budget: AnalysisBudget | None = None,
    upto: int | None = None,
    stop_at_miss: bool = False,
    first: int = 0,
) -> list[int | None]:
    """Exact ``R = w + J`` of each task (scaled), None where it can miss its deadline.

    ``start``: per task a value known not to exceed its ``R`` (an earlier run with no larger C and no
    more tasks above it), or None.  ``upto``: only the first ``upto`` tasks.  ``stop_at_miss``: stop at
    the first task that can miss (the rest are left out).  ``first``: the tasks above it are known to
    be unchanged and feasible, their ``R`` is ``start`` (only the tasks from ``first`` on are analysed).
    """
    n = len(s.c) if upto is None else upto
    out: list[int | None] = []
    hc: list[int] = []
    ht: list[int] = []
    hj: list[int] = []
    u = 0.0  # sum C_j / T_j over hp (float: it only places the start and the U > 1 shortcut)
    a = 0.0  # sum C_j J_j / T_j over hp (original units)
    for i in range(n):
        known = None if start is None else start[i]
        if i < first and known is not None:
            r: int | None = math.floor(known * s.scale)
        else:
            r = _busy(s, i, known, hc, ht, hj, u, a, budget)
        out.append(r)
        if r is None and stop_at_miss:
            break
        if s.c[i] > 0:  # a task that needs no time delays nobody
            hc.append(s.c[i])
            ht.append(s.t[i])
            hj.append(s.j[i])
            u += s.c[i] / s.t[i]
            a += (s.c[i] * s.j[i]) / (s.t[i] * s.scale)
    return out


def _float(r: Fraction | None) -> float:
    return math.inf if r is None else float(r)


def response_times(tasks: Sequence[Task], budget: AnalysisBudget | None = None) -> dict[str, float]:
    """Every task's worst-case response time (``inf`` where it can exceed its deadline), in priority order.

    Exact: the C1 = 1, T1 = 2 / C2 = 2e9, T2 = 4e9 set has R2 = 4e9 exactly.

    >>> response_times([Task("t1", 1, 2, priority=1), Task("t2", 2e9, 4e9, priority=2)])
    {'t1': 1.0, 't2': 4000000000.0}
    """
    order = _ordered(tasks)
    s = _Ints.of(order)
    return {t.name: _float(s.exact(r)) for t, r in zip(order, _responses(s, budget=budget), strict=True)}


def response_time(tasks: Sequence[Task], name: str, budget: AnalysisBudget | None = None) -> float:
    """Worst-case response time of task ``name`` (``inf`` when it can exceed its deadline).

    >>> ts = [Task("t1", 2, 5, 5, priority=1), Task("t2", 3, 8, 7, priority=2)]
    >>> response_time(ts, "t1"), response_time(ts, "t2")
    (2.0, 5.0)
    """
    order = _ordered(tasks)
    idx = next((i for i, t in enumerate(order) if t.name == name), None)
    if idx is None:
        raise ParameterError(f"no task named {name!r}")
    s = _Ints.of(order[: idx + 1])  # the tasks below it do not delay it
    return _float(s.exact(_responses(s, budget=budget)[idx]))


def liu_layland_bound(n: int) -> float:
    """``n (2^(1/n) - 1)``: 1 for one task, ~0.828 for two, -> ln 2 ~ 0.693.

    >>> round(liu_layland_bound(2), 4), round(liu_layland_bound(3), 4)
    (0.8284, 0.7798)
    """
    if n < 1:
        raise ParameterError(f"n={n}: need at least one task")
    return float(n * (2 ** (1 / n) - 1))


def liu_layland(tasks: Sequence[Task]) -> bool | None:
    """The sufficient utilisation test: True = feasible for sure, None = undecided (use :func:`analyse`).

    Applies only when every deadline equals its period and priorities are
    rate-monotonic (shorter period = higher priority); otherwise None.

    >>> liu_layland([Task("a", 1, 4, priority=1), Task("b", 1, 5, priority=2)])
    True
    """
    if not tasks:
        return True
    order = _ordered(tasks)
    if any(t.deadline != t.t or t.jitter or t.blocking for t in order):
        return None
    if any(a.t > b.t for a, b in zip(order, order[1:], strict=False)):
        return None
    u = sum(t.utilisation for t in order)
    return True if u <= liu_layland_bound(len(order)) else None


class _Feasibility:
    """Feasibility of ``order`` with other execution times, warm-started from the last feasible run."""

    def __init__(self, order: Sequence[Task], budget: AnalysisBudget | None) -> None:
        self.order = list(order)
        self.rows = _Rows(self.order)
        self.budget = budget
        self.warm: list[Fraction | None] | None = None  # R of the largest feasible C seen so far

    def __call__(self, c: Sequence[Fraction], warm: bool, first: int = 0) -> bool:
        """Is ``order`` feasible with execution times ``c``?  ``warm``: ``c`` is no smaller than at the last yes;
        ``first``: the tasks above it have the C of the last yes (their R are known)."""
        s = self.rows.ints(c)
        rs = _responses(s, self.warm if warm else None, self.budget, stop_at_miss=True, first=first if warm else 0)
        if len(rs) < len(self.order) or rs[-1] is None:
            return False
        self.warm = [s.exact(r) for r in rs]
        return True


def critical_scaling(tasks: Sequence[Task], rel_tol: float = 1e-6, budget: AnalysisBudget | None = None) -> float:
    """Largest ``lambda`` with every ``C`` x ``lambda`` still feasible (bisection; ``inf`` if all C are 0).

    Every feasibility check is exact; ``lambda`` itself is found to ``rel_tol``.

    >>> round(critical_scaling([Task("t1", 2, 5, 5, priority=1), Task("t2", 3, 8, 7, priority=2)]), 6)
    1.0
    """
    if not tasks or all(t.c == 0 for t in tasks):
        return math.inf
    order = _ordered(tasks)
    cs = [Fraction(t.c) for t in order]
    check = _Feasibility(order, budget)

    def ok(lam: float) -> bool:
        f = Fraction(lam)
        return check([c * f for c in cs], warm=True)

    # C x lambda must fit its own deadline: an upper bound; 0 fits whenever jitter + blocking do.
    hi = min(t.deadline / t.c for t in order if t.c > 0) * (1 + 1e-9)
    if not ok(0.0):
        return 0.0
    lo = 0.0
    if ok(hi):
        return hi
    if hi > 1.0:  # the verdict at lambda = 1 is exact: a feasible set's factor is >= 1, an infeasible one's < 1
        lo, hi = (1.0, hi) if ok(1.0) else (lo, 1.0)
    while hi - lo > rel_tol * max(hi, 1e-12):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def critical_scaling_exact(tasks: Sequence[Task]) -> float:
    """Lehoczky-Sha-Ding: ``min_i max_{t in S_i} (t - B_i) / W_i(t)``, no jitter (exact, then rounded).

    ``W_i(t) = sum_{j <= i} C_j ceil(t / T_j)``, and ``S_i`` = the multiples of
    the periods ``T_j`` (``j`` in ``hp(i)``) up to ``D_i``, plus ``D_i``.  The
    scheduling points are as many as ``D_i / T_j`` summed: an oracle for tests.

    >>> critical_scaling_exact([Task("t1", 2, 5, 5, priority=1), Task("t2", 3, 8, 7, priority=2)])
    1.0
    """
    order = _ordered(tasks)
    if any(t.jitter for t in order):
        raise ParameterError("the exact critical scaling factor is for tasks without release jitter")
    best: Fraction | None = None  # None: inf
    for i, task in enumerate(order):
        c, d, b = Fraction(task.c), Fraction(task.deadline), Fraction(task.blocking)
        if c == 0 and b == 0:
            continue  # needs no processor time: its response is 0 whatever the others do
        hp = [(Fraction(j.c), Fraction(j.t)) for j in order[: i + 1]]
        points = {d}
        for _cj, tj in hp[:-1]:
            points.update(k * tj for k in range(1, math.floor(d / tj) + 1))
        lam_i: Fraction | None = Fraction(0)
        for t in sorted(points):
            work = sum((cj * -(-t // tj) for cj, tj in hp), Fraction(0))
            if work > 0:
                if lam_i is not None:
                    lam_i = max(lam_i, (t - b) / work)
            elif t >= b:
                lam_i = None
        if lam_i is not None:
            best = lam_i if best is None else min(best, lam_i)
    return math.inf if best is None else float(best)


def _slacks(order: Sequence[Task], rel_tol: float, budget: AnalysisBudget | None) -> list[float]:
    """How much each task's C may grow alone before some task misses (all 0 when the set already misses)."""
    cs = [Fraction(t.c) for t in order]
    base = _Feasibility(order, budget)
    if not base(cs, warm=False):
        return [0.0] * len(order)
    out = []
    for idx, task in enumerate(order):
        check = _Feasibility(order, budget)
        check.warm = base.warm  # more C for one task: every R is at least the base set's

        def ok(extra: float, idx: int = idx, check: _Feasibility = check) -> bool:
            trial = list(cs)
            trial[idx] = cs[idx] + Fraction(extra)
            return check(trial, warm=True, first=idx)  # the tasks above it do not see it

        lo, hi = 0.0, float(task.deadline)  # C beyond its own deadline can never fit
        if ok(hi):
            out.append(hi)
            continue
        while hi - lo > rel_tol * max(hi, 1e-12):
            mid = (lo + hi) / 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
        out.append(lo)
    return out


def task_slack(tasks: Sequence[Task], name: str, rel_tol: float = 1e-6, budget: AnalysisBudget | None = None) -> float:
    """How much task ``name``'s ``C`` may grow alone before some task misses (0 if already infeasible)."""
    order = _ordered(tasks)
    idx = next((i for i, t in enumerate(order) if t.name == name), None)
    if idx is None:
        raise ParameterError(f"no task named {name!r}")
    return _slacks(order, rel_tol, budget)[idx]


def analyse(
    tasks: Sequence[Task],
    *,
    slack: bool = True,
    margin: bool = True,
    rel_tol: float = 1e-6,
    budget: AnalysisBudget | None = None,
) -> tuple[list[TaskResult], float | None]:
    """Every task's response time and slack, in priority order, and the set's critical scaling factor.

    ``slack=False``: every slack 0 (it costs a bisection per task); ``margin=False``: the factor is None.
    ``budget`` bounds the whole analysis (:class:`AnalysisTooCostly` past it).
    """
    order = _ordered(tasks)
    s = _Ints.of(order)
    rs = [_float(s.exact(r)) for r in _responses(s, budget=budget)]
    slacks = _slacks(order, rel_tol, budget) if slack else [0.0] * len(order)
    results = [TaskResult(t.name, r, t.deadline, sl) for t, r, sl in zip(order, rs, slacks, strict=True)]
    return results, (critical_scaling(order, rel_tol, budget) if margin else None)
