"""Admission of periodic agent tasks by response-time analysis (pure).

An *orchestrator* (an agent's control loop) issues its LLM calls one at a
time; the periodic tasks it runs (a voice turn every 500 ms, a trading check
every 300 ms, a summary every 10 s) share that loop by fixed priority, which is
exactly the uniprocessor model of :mod:`controllers.rta`: each orchestrator is
one processor, each task a periodic task whose execution time ``C`` is the
latency of one call to its model -- the measured end-to-end **P99** of that
model (the largest over its zones' latest windows; per request class when
one is measured for it), so a task admitted today keeps its deadline while the
fleet's tail stays where it is.

* :func:`evaluate` -- one orchestrator's set: every task's worst-case response
  time (jitter and blocking included, exact), feasibility, and the margin (the
  critical scaling factor: how far every latency may grow together before a
  deadline is missed) and, when asked, each task's slack (a bisection per
  task: the costly part, for ``governor admission check``).  A task whose model has no measured latency cannot be
  analysed: the verdict says so (``missing``) and is not feasible.
* :func:`admit` -- one new task against an orchestrator's admitted set: it is
  admitted when the set with it is feasible, rejected (with the task that
  would miss and by how much) when not, and *held* (neither) while a model's
  latency is unknown: no data is never a yes.  It computes response times
  only (no margin, no slack).

An orchestrator runs at most :data:`MAX_TASKS_PER_ORCHESTRATOR` tasks: one
past it is rejected with that reason (the analysis of a set costs about the
square of its size per check).  Both take an optional
:class:`~controllers.rta.AnalysisBudget`: past it they raise
:class:`~controllers.rta.AnalysisTooCostly` (no verdict), never a guess.

>>> t = AgentTask.from_dict({"orchestrator": "o", "name": "voice", "model": "m", "period_ms": 500, "priority": 1})
>>> v = evaluate([t], {"m": 180.0})
>>> v.feasible, v.results[0].response, round(v.margin, 3)
(True, 180.0, 2.778)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from controllers.errors import ParameterError
from controllers.rta import AnalysisBudget, Task, TaskResult, analyse

__all__ = ["MAX_TASKS_PER_ORCHESTRATOR", "AgentTask", "Decision", "Verdict", "admit", "evaluate", "latency_key"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")
_FIELDS = (
    "orchestrator",
    "name",
    "model",
    "request_class",
    "period_ms",
    "deadline_ms",
    "priority",
    "jitter_ms",
    "blocking_ms",
)
MAX_PERIOD_MS = 86_400_000.0  # a day
MAX_TASKS_PER_ORCHESTRATOR = 128  # one agent loop issuing one call at a time: far more than it can keep


def latency_key(model: str, request_class: str = "") -> str:
    """Key of a latency measurement: ``model`` or ``model|class``."""
    return f"{model}|{request_class}" if request_class else model


@dataclass(frozen=True)
class AgentTask:
    orchestrator: str
    name: str
    model: str
    period_ms: float
    priority: int
    deadline_ms: float | None = None  # None: = period
    request_class: str = ""
    jitter_ms: float = 0.0
    blocking_ms: float = 0.0

    @classmethod
    def from_dict(cls, d: Any) -> AgentTask:
        """A validated task; :class:`ParameterError` names the first bad field."""
        if not isinstance(d, Mapping):
            raise ParameterError(f"an agent task is an object, got {type(d).__name__}")
        extra = sorted(set(d) - set(_FIELDS))
        if extra:
            raise ParameterError(f"unknown field {str(extra[0])[:40]!r} (fields: {', '.join(_FIELDS)})")
        for key in ("orchestrator", "name", "model"):
            v = d.get(key)
            if not isinstance(v, str) or not _NAME.match(v):
                raise ParameterError(f"{key}: 1-128 characters of letters, digits and . _ @ -, got {v!r:.60}")
        rc = d.get("request_class", "") or ""
        if not isinstance(rc, str) or (rc and not _NAME.match(rc)):
            raise ParameterError(f"request_class: a name, got {rc!r:.60}")
        nums: dict[str, float | None] = {}
        for key, required in (
            ("period_ms", True),
            ("deadline_ms", False),
            ("jitter_ms", False),
            ("blocking_ms", False),
        ):
            v = d.get(key)
            if v is None and not required:
                nums[key] = None
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ParameterError(f"{key}: a finite number of ms, got {v!r:.60}")
            if v < 0 or (key in ("period_ms", "deadline_ms") and v <= 0) or v > MAX_PERIOD_MS:
                raise ParameterError(f"{key}: out of range (0, {MAX_PERIOD_MS:g}] ms: {v!r}")
            nums[key] = float(v)
        prio = d.get("priority")
        if isinstance(prio, bool) or not isinstance(prio, int) or not -1000 <= prio <= 1000:
            raise ParameterError(f"priority: an int in [-1000, 1000] (smaller = more urgent), got {prio!r:.60}")
        period = float(nums["period_ms"] or 0.0)
        deadline = nums["deadline_ms"]
        if deadline is not None and deadline > period:
            raise ParameterError(f"deadline_ms {deadline:g} > period_ms {period:g}: the analysis needs D <= T")
        return cls(
            d["orchestrator"],
            d["name"],
            d["model"],
            period,
            prio,
            deadline,
            rc,
            nums["jitter_ms"] or 0.0,
            nums["blocking_ms"] or 0.0,
        )

    @property
    def key(self) -> str:
        return f"{self.orchestrator}|{self.name}"

    @property
    def deadline(self) -> float:
        return self.period_ms if self.deadline_ms is None else self.deadline_ms

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}

    def execution_ms(self, latency_ms: Mapping[str, float]) -> float | None:
        """Its C: the class's measured latency, else the model's; None when neither is measured."""
        for key in (latency_key(self.model, self.request_class), self.model):
            v = latency_ms.get(key)
            if v is not None and math.isfinite(v) and v >= 0:
                return float(v)
        return None


@dataclass(frozen=True)
class Verdict:
    orchestrator: str
    feasible: bool
    margin: float | None  # critical scaling factor (1 = critically feasible; inf = nothing to run; None: not computed)
    results: list[TaskResult] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # models (or model|class) without a measured latency

    def misses(self) -> list[TaskResult]:
        return [r for r in self.results if not r.feasible]

    def to_dict(self) -> dict[str, Any]:
        return {
            "orchestrator": self.orchestrator,
            "feasible": self.feasible,
            "margin": None if self.margin is None or math.isinf(self.margin) else round(self.margin, 6),
            "missing": self.missing,
            "tasks": [
                {
                    "name": r.name,
                    "response_ms": None if math.isinf(r.response) else round(r.response, 3),
                    "deadline_ms": r.deadline,
                    "slack_ms": round(r.slack, 3),
                }
                for r in self.results
            ],
        }


def evaluate(
    tasks: Sequence[AgentTask],
    latency_ms: Mapping[str, float],
    *,
    slack: bool = True,
    margin: bool = True,
    rel_tol: float = 1e-6,
    budget: AnalysisBudget | None = None,
) -> Verdict:
    """Response times, feasibility and margin (``rel_tol``) of one orchestrator's tasks under the measured latencies.

    Feasibility and response times are exact; ``slack=False`` leaves every slack 0 (its bisections cost a factor
    of the set's size), ``margin=False`` leaves the margin None.
    """
    orchs = {t.orchestrator for t in tasks}
    if len(orchs) > 1:
        raise ParameterError(f"one orchestrator at a time, got {sorted(orchs)}")
    orch = next(iter(orchs), "")
    if len(tasks) > MAX_TASKS_PER_ORCHESTRATOR:
        raise ParameterError(
            f"orchestrator {orch}: {len(tasks)} tasks, more than the {MAX_TASKS_PER_ORCHESTRATOR} one may run"
        )
    missing = sorted({latency_key(t.model, t.request_class) for t in tasks if t.execution_ms(latency_ms) is None})
    if missing:
        return Verdict(orch, False, 0.0, [], missing)
    rta = [
        Task(
            t.name,
            float(t.execution_ms(latency_ms) or 0.0),
            t.period_ms,
            t.deadline,
            priority=t.priority,
            jitter=t.jitter_ms,
            blocking=t.blocking_ms,
        )
        for t in tasks
    ]
    # priority order, then the order given; a task that can miss has slack 0
    results, lam = analyse(rta, slack=slack, margin=margin, rel_tol=rel_tol, budget=budget)
    return Verdict(orch, all(r.feasible for r in results), lam, results, [])


@dataclass(frozen=True)
class Decision:
    state: str  # "admitted" | "rejected" | "pending"
    reason: str
    verdict: Verdict


def admit(
    new: AgentTask,
    admitted: Sequence[AgentTask],
    latency_ms: Mapping[str, float],
    budget: AnalysisBudget | None = None,
) -> Decision:
    """Admit ``new`` into its orchestrator's ``admitted`` set, reject it, or hold it (latency unknown).

    Exact response times only (the margin is left to the review of the admitted set).

    >>> a = AgentTask.from_dict({"orchestrator": "o", "name": "trade", "model": "m", "period_ms": 300, "priority": 0})
    >>> b = AgentTask.from_dict({"orchestrator": "o", "name": "voice", "model": "m", "period_ms": 500, "priority": 1})
    >>> admit(b, [a], {"m": 120.0}).state, admit(b, [a], {"m": 250.0}).reason
    ('admitted', 'voice would respond in inf ms > deadline 500 ms (the set is infeasible)')
    >>> admit(b, [a], {}).state
    'pending'
    """
    others = [t for t in admitted if t.orchestrator == new.orchestrator and t.name != new.name]
    if len(others) >= MAX_TASKS_PER_ORCHESTRATOR:
        return Decision(
            "rejected",
            f"orchestrator {new.orchestrator} already runs {len(others)} tasks, "
            f"the most one orchestrator may run ({MAX_TASKS_PER_ORCHESTRATOR})",
            Verdict(new.orchestrator, False, None),
        )
    verdict = evaluate([*others, new], latency_ms, slack=False, margin=False, budget=budget)
    if verdict.missing:
        return Decision("pending", f"no latency measured yet for {', '.join(verdict.missing)}", verdict)
    if verdict.feasible:
        tight = max(verdict.results, key=lambda r: r.response / r.deadline)
        return Decision(
            "admitted", f"feasible: {tight.name} responds in {tight.response:g} of {tight.deadline:g} ms", verdict
        )
    worst = verdict.misses()[0]
    shown = "inf" if math.isinf(worst.response) else f"{worst.response:g}"
    return Decision(
        "rejected",
        f"{worst.name} would respond in {shown} ms > deadline {worst.deadline:g} ms (the set is infeasible)",
        verdict,
    )
