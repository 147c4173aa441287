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

Times are floats in any one unit (the loop uses ms).  Ceil uses a relative
tolerance of 1e-9 so that ``ceil(10.000000000001 / 5)`` on float noise is 2,
not 3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from controllers.errors import ParameterError

__all__ = [
    "Task",
    "TaskResult",
    "analyse",
    "critical_scaling",
    "critical_scaling_exact",
    "liu_layland",
    "liu_layland_bound",
    "response_time",
    "task_slack",
]

_EPS = 1e-9
MAX_ITERATIONS = 100_000


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
        if d > self.t + _EPS * self.t:
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
    response: float  # inf: can miss its deadline
    deadline: float
    slack: float  # how much this task's C may grow alone (0 when it already misses)

    @property
    def feasible(self) -> bool:
        return self.response <= self.deadline * (1 + _EPS)


def _ceil(x: float) -> int:
    return math.ceil(x - _EPS * max(1.0, abs(x)))


def _ordered(tasks: Sequence[Task]) -> list[Task]:
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ParameterError("task names must be unique")
    return [t for _, t in sorted(enumerate(tasks), key=lambda it: (it[1].priority, it[0]))]


def response_time(tasks: Sequence[Task], name: str) -> float:
    """Worst-case response time of task ``name`` (``inf`` when it can exceed its deadline).

    >>> ts = [Task("t1", 2, 5, 5, priority=1), Task("t2", 3, 8, 7, priority=2)]
    >>> response_time(ts, "t1"), response_time(ts, "t2")
    (2.0, 5.0)
    """
    order = _ordered(tasks)
    idx = next((i for i, t in enumerate(order) if t.name == name), None)
    if idx is None:
        raise ParameterError(f"no task named {name!r}")
    task, hp = order[idx], order[:idx]
    w = float(task.c + task.blocking)
    for _ in range(MAX_ITERATIONS):
        if w + task.jitter > task.deadline * (1 + _EPS):
            return math.inf
        nxt = task.c + task.blocking + sum(_ceil((w + j.jitter) / j.t) * j.c for j in hp)
        if nxt <= w * (1 + _EPS):
            return w + task.jitter
        w = nxt
    return math.inf  # pragma: no cover - w grows by >= min C each step and D bounds it


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


def _scaled(tasks: Sequence[Task], factor: float) -> list[Task]:
    return [replace(t, c=t.c * factor) for t in tasks]


def _feasible(tasks: Sequence[Task]) -> bool:
    return all(math.isfinite(response_time(tasks, t.name)) for t in tasks)


def critical_scaling(tasks: Sequence[Task], rel_tol: float = 1e-6) -> float:
    """Largest ``lambda`` with every ``C`` x ``lambda`` still feasible (bisection; ``inf`` if all C are 0).

    >>> round(critical_scaling([Task("t1", 2, 5, 5, priority=1), Task("t2", 3, 8, 7, priority=2)]), 6)
    1.0
    """
    if not tasks or all(t.c == 0 for t in tasks):
        return math.inf
    # C x lambda must fit its own deadline: an upper bound; 0 fits whenever jitter + blocking do.
    hi = min(t.deadline / t.c for t in tasks if t.c > 0) * (1 + 1e-9)
    if not _feasible(_scaled(tasks, 0.0)):
        return 0.0
    lo = 0.0
    if _feasible(_scaled(tasks, hi)):
        return hi
    while hi - lo > rel_tol * max(hi, 1e-12):
        mid = (lo + hi) / 2
        if _feasible(_scaled(tasks, mid)):
            lo = mid
        else:
            hi = mid
    return lo


def critical_scaling_exact(tasks: Sequence[Task]) -> float:
    """Lehoczky-Sha-Ding: ``min_i max_{t in S_i} (t - B_i) / W_i(t)``, no jitter.

    ``W_i(t) = sum_{j <= i} C_j ceil(t / T_j)``, and ``S_i`` = the multiples of
    the periods ``T_j`` (``j`` in ``hp(i)``) up to ``D_i``, plus ``D_i``.

    >>> critical_scaling_exact([Task("t1", 2, 5, 5, priority=1), Task("t2", 3, 8, 7, priority=2)])
    1.0
    """
    order = _ordered(tasks)
    if any(t.jitter for t in order):
        raise ParameterError("the exact critical scaling factor is for tasks without release jitter")
    best = math.inf
    for i, task in enumerate(order):
        if task.c == 0 and task.blocking == 0:
            continue  # needs no processor time: its response is 0 whatever the others do
        hp = order[: i + 1]
        points = {task.deadline}
        for j in order[:i]:
            points.update(k * j.t for k in range(1, int(math.floor(task.deadline / j.t + _EPS)) + 1))
        lam_i = 0.0
        for t in sorted(points):
            work = sum(j.c * _ceil(t / j.t) for j in hp)
            if work > 0:
                lam_i = max(lam_i, (t - task.blocking) / work)
            elif t >= task.blocking:
                lam_i = math.inf
        best = min(best, lam_i)
    return best


def task_slack(tasks: Sequence[Task], name: str, rel_tol: float = 1e-6) -> float:
    """How much task ``name``'s ``C`` may grow alone before some task misses (0 if already infeasible)."""
    base = list(tasks)
    idx = next((i for i, t in enumerate(base) if t.name == name), None)
    if idx is None:
        raise ParameterError(f"no task named {name!r}")
    if not _feasible(base):
        return 0.0

    def ok(extra: float) -> bool:
        trial = list(base)
        trial[idx] = replace(base[idx], c=base[idx].c + extra)
        return _feasible(trial)

    lo, hi = 0.0, base[idx].deadline  # C beyond its own deadline can never fit
    if ok(hi):
        return hi
    while hi - lo > rel_tol * max(hi, 1e-12):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def analyse(tasks: Sequence[Task]) -> tuple[list[TaskResult], float]:
    """Every task's response time and slack, in priority order, and the set's critical scaling factor."""
    order = _ordered(tasks)
    results = [TaskResult(t.name, response_time(order, t.name), t.deadline, task_slack(order, t.name)) for t in order]
    return results, critical_scaling(order)
