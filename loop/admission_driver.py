"""Admission in the loop: the worker admits periodic agent tasks and re-checks them as latency moves.

The registry is the Redis hash ``<prefix>:admission`` (:func:`core.names.admission`),
field ``<orchestrator>|<task>``, value JSON: the task (:class:`controllers.admission.AgentTask`
fields) plus ``state`` and what the worker last said.  ``governor admission add``
writes a task with ``state: pending``; the worker (:meth:`AdmissionDriver.review`,
at most once a second, beside the executor heartbeats):

* takes each pending task, oldest first, against its orchestrator's admitted set
  under the current latencies (:func:`controllers.admission.admit`): ``admitted``,
  ``rejected`` (with the task that would miss), or still ``pending`` while its
  model has no measured latency (no data is never a yes);
* re-checks every orchestrator's admitted set each time: when the measured P99s
  make it infeasible its tasks turn ``infeasible`` (an ``admission_infeasible``
  event names the task that would miss and the margin) and back to ``admitted``
  when it is feasible again (``admission_feasible``).  This is the early warning:
  it fires when the measured tail says a deadline *can* be missed, before misses
  pile up; the drift detectors move the same P99s;
* exports ``governor_admission_feasible{orchestrator}`` (1/0) and
  ``governor_admission_margin{orchestrator}`` (the critical scaling factor).

Latency = per model, the largest ``e2e_p99_ms`` of its zones' windows of the last
:data:`FRESH_WINDOWS` windows (:meth:`AdmissionDriver.on_window`).  Hostile
entries (bad JSON, bad fields, over :data:`MAX_ENTRY_BYTES`, over :data:`MAX_TASKS`)
are marked ``invalid`` with the reason once and never analysed; past
:data:`MAX_ENTRIES` fields the registry is not read further.  One worker writes
the registry (several workers would each review it: documented in docs/architecture.md).

**Never in the way of a decision.**  The worker starts a review
(:meth:`streams.admission_review.OffLoopReview.launch`) and does not wait for it: the analysis runs in
a worker thread on copies of the entries and latencies
(:meth:`streams.admission_review.OffLoopReview.review`), one review at a time, and its writes
and events are applied when it is done.  Its work is bounded too: one
admission or re-check may evaluate :data:`CALL_TERMS` recurrence terms (a task
whose set needs more is rejected, saying so; an admitted set that does keeps its
states), a review :data:`REVIEW_TERMS` in all (what is left waits for the next
review, which starts where this one stopped).  An orchestrator runs at most
:data:`~controllers.admission.MAX_TASKS_PER_ORCHESTRATOR` tasks.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import orjson

from controllers.admission import MAX_TASKS_PER_ORCHESTRATOR, AgentTask, Decision, Verdict, admit, evaluate
from controllers.errors import ParameterError
from controllers.rta import AnalysisBudget, AnalysisTooCostly
from controllers.window_record import WindowRecord
from loop.commands import Command

__all__ = [
    "still_current",
    "CALL_TERMS",
    "FRESH_WINDOWS",
    "MAX_ENTRIES",
    "MAX_ENTRY_BYTES",
    "MAX_TASKS",
    "REVIEW_TERMS",
    "AdmissionDriver",
]

log = logging.getLogger(__name__)

MAX_TASKS = 1024
MAX_ENTRIES = 4 * MAX_TASKS  # registry fields read per review (invalid ones included); the rest are not looked at
MAX_ENTRY_BYTES = 4096  # a task is a few hundred bytes of JSON
FRESH_WINDOWS = 6
CALL_TERMS = 2_000_000  # recurrence terms one admission or re-check may evaluate (well under a second)
REVIEW_TERMS = 20_000_000  # ... and one review in all
MARGIN_REL_TOL = 1e-3  # the margin is shown as x1.23 and exported: three digits are plenty
STATES = ("pending", "admitted", "rejected", "infeasible", "invalid")
T = TypeVar("T")


class _ReviewSpent(Exception):
    """This review's analysis budget is spent: what is left waits for the next review."""


class _Terms:
    """A review's analysis budget, spent one call at a time, each call capped at :data:`CALL_TERMS`."""

    def __init__(self, total: int) -> None:
        self.left = total

    def run(self, fn: Callable[[AnalysisBudget], T]) -> T:
        """``fn(budget)``; :class:`AnalysisTooCostly` when the call alone needs more than CALL_TERMS."""
        if self.left <= 0:
            raise _ReviewSpent
        cap = min(CALL_TERMS, self.left)
        budget = AnalysisBudget(cap)
        try:
            return fn(budget)
        except AnalysisTooCostly:
            if cap < CALL_TERMS:  # stopped by what the review had left, not by its own cost
                self.left = 0
                raise _ReviewSpent from None
            raise
        finally:
            self.left -= cap - max(budget.left, 0)


class AdmissionDriver:
    """Latencies from the windows; decisions on the registry (see the module docstring)."""

    def __init__(self, window_s: float, metrics: Any = None) -> None:
        self.window_ms = int(window_s * 1000)
        self.metrics = metrics
        self._p99: dict[tuple[str, str], tuple[float, int]] = {}  # (model, zone) -> (p99 ms, window end)
        self._last_end = 0
        self.verdicts: dict[str, Verdict] = {}
        # The last analysis of each orchestrator's admitted set, by (set, latencies): the review runs every second,
        # the latencies move once a window, so an unchanged set is not analysed again.  None: too costly to analyse.
        self._analysed: dict[str, tuple[tuple[Any, ...], Verdict | None]] = {}
        self._resume = ""  # the orchestrator the last review stopped at (its budget spent), "" when it finished

    def on_window(self, w: WindowRecord, now_ms: int = 0) -> list[Command]:
        """Keep a zone window's end-to-end P99 (bounded by the configured models x zones that reach it).

        No command: admission decides on the registry (:meth:`review`), its writes and events are effects.
        """
        if w.scope != "zone" or w.e2e_p99_ms is None or not w.count:
            return []
        if len(self._p99) >= MAX_TASKS and (w.model, w.zone) not in self._p99:
            return []
        self._p99[(w.model, w.zone)] = (float(w.e2e_p99_ms), w.window_end_ms)
        self._last_end = max(self._last_end, w.window_end_ms)
        return []

    def latencies(self) -> dict[str, float]:
        """Model -> the largest fresh P99 over its zones (ms)."""
        horizon = self._last_end - FRESH_WINDOWS * self.window_ms
        out: dict[str, float] = {}
        for (model, _zone), (p99, end) in self._p99.items():
            if end >= horizon:
                out[model] = max(out.get(model, 0.0), p99)
        return out

    @staticmethod
    def still_current(
        writes: Mapping[str, bytes], reviewed: Mapping[Any, Any], current: Mapping[Any, Any]
    ) -> dict[str, bytes]:
        """:func:`still_current`, for the shell that writes a review back."""
        return still_current(writes, reviewed, current)

    def review(
        self, entries: Mapping[Any, Any], now_ms: int, latencies: Mapping[str, float] | None = None
    ) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
        """The registry's fields -> (fields to write back, events).  Never raises on an entry."""
        lat = self.latencies() if latencies is None else dict(latencies)
        tasks: dict[str, tuple[AgentTask, dict[str, Any]]] = {}
        writes: dict[str, bytes] = {}
        events: list[dict[str, Any]] = []
        fields = sorted(entries.items(), key=lambda kv: _text(kv[0]))
        if len(fields) > MAX_ENTRIES:
            log.warning("admission: %d registry fields, only the first %d are read", len(fields), MAX_ENTRIES)
            del fields[MAX_ENTRIES:]
        for i, (raw_key, raw) in enumerate(fields):
            key = _text(raw_key)[:300]
            try:
                if not isinstance(raw, bytes | str) or len(raw) > MAX_ENTRY_BYTES:
                    size = len(raw) if isinstance(raw, bytes | str) else "?"
                    raise ParameterError(f"an entry of {size} bytes (at most {MAX_ENTRY_BYTES})")
                obj = orjson.loads(raw)
                if not isinstance(obj, dict):
                    raise ParameterError("not a JSON object")
                if obj.get("state") == "invalid":
                    continue
                if i >= MAX_TASKS:
                    raise ParameterError(f"more than {MAX_TASKS} tasks registered")
                task = AgentTask.from_dict({k: v for k, v in obj.items() if k not in _META})
                if task.key != key:
                    raise ParameterError(f"field {key!r} is not orchestrator|name {task.key!r}")
                if obj.get("state", "pending") not in STATES:
                    raise ParameterError(f"state {obj.get('state')!r:.40} is not one of {', '.join(STATES)}")
            except (orjson.JSONDecodeError, ParameterError, TypeError, ValueError) as exc:
                writes[key] = orjson.dumps({"state": "invalid", "reason": str(exc)[:300], "decided_ms": now_ms})
                continue
            tasks[key] = (task, obj)
        by_orch: dict[str, list[tuple[AgentTask, dict[str, Any]]]] = {}
        for task, obj in tasks.values():
            by_orch.setdefault(task.orchestrator, []).append((task, obj))
        order = sorted(by_orch)
        start = next((k for k, o in enumerate(order) if o >= self._resume), 0)  # where the last review stopped
        terms, self._resume = _Terms(REVIEW_TERMS), ""
        for orch in order[start:] + order[:start]:
            try:
                self._review_orchestrator(orch, by_orch[orch], lat, now_ms, writes, events, terms)
            except _ReviewSpent:
                self._resume = orch
                log.info("admission: review budget spent at orchestrator %s; the rest waits for the next review", orch)
                break
        for gone in (set(self.verdicts) | set(self._analysed)) - set(by_orch):  # orchestrators whose tasks are gone
            self.verdicts.pop(gone, None)
            self._analysed.pop(gone, None)
        return writes, events

    def _review_orchestrator(
        self,
        orch: str,
        items: list[tuple[AgentTask, dict[str, Any]]],
        lat: Mapping[str, float],
        now_ms: int,
        writes: dict[str, bytes],
        events: list[dict[str, Any]],
        terms: _Terms,
    ) -> None:
        admitted = [t for t, o in items if o.get("state") in ("admitted", "infeasible")]
        was_infeasible = any(o.get("state") == "infeasible" for _, o in items)
        objs = {t.key: o for t, o in items}
        if len(admitted) > MAX_TASKS_PER_ORCHESTRATOR:  # written so by hand: the earliest registered stay
            keep = sorted(admitted, key=lambda t: (_registered(objs[t.key]), t.name))[:MAX_TASKS_PER_ORCHESTRATOR]
            for task in set(admitted) - set(keep):
                reason = f"more than the {MAX_TASKS_PER_ORCHESTRATOR} tasks one orchestrator may run"
                writes[task.key] = _entry(task, objs[task.key], "rejected", reason, now_ms, None)
            admitted = [t for t in admitted if t in set(keep)]
        pending = sorted((_registered(o), t.name, t, o) for t, o in items if o.get("state", "pending") == "pending")
        for _, _, task, obj in pending:
            try:
                d = terms.run(functools.partial(admit, task, admitted, lat))
            except AnalysisTooCostly as exc:  # a clear refusal, never a guess
                d = Decision("rejected", f"{exc}: the set with it is too costly to analyse", Verdict(orch, False, None))
            if d.state == "admitted":
                admitted.append(task)
            if d.state != obj.get("state") or d.reason != obj.get("reason"):
                writes[task.key] = _entry(task, obj, d.state, d.reason, now_ms, d.verdict)
                if d.state != "pending":
                    events.append(_event(f"admission_{d.state}", task.orchestrator, d.reason, now_ms, task=task.name))
        if not admitted:
            self.verdicts.pop(orch, None)
            self._analysed.pop(orch, None)
            return
        key = (tuple(admitted), tuple(sorted(lat.items())))
        cached = self._analysed.get(orch)
        if cached is not None and cached[0] == key:
            verdict = cached[1]
        else:
            try:
                verdict = terms.run(
                    lambda budget: evaluate(admitted, lat, slack=False, rel_tol=MARGIN_REL_TOL, budget=budget)
                )
            except AnalysisTooCostly as exc:
                log.warning("admission: orchestrator %s keeps its states: %s", orch, exc)
                verdict = None
            self._analysed[orch] = (key, verdict)
        if verdict is None or verdict.missing:  # too costly, or a model's latency went stale: hold, say nothing new
            return
        self.verdicts[orch] = verdict
        self._export(orch, verdict)
        state = "admitted" if verdict.feasible else "infeasible"
        if verdict.feasible:
            reason = f"feasible, margin x{_x(verdict.margin)}"
        else:
            miss = verdict.misses()[0]
            reason = f"{miss.name} can miss its {miss.deadline:g} ms deadline at the measured P99 (margin x{_x(verdict.margin)})"
        for task in admitted:
            obj = objs[task.key]
            if task.key not in writes and (obj.get("state") != state or obj.get("reason") != reason):
                writes[task.key] = _entry(task, obj, state, reason, now_ms, verdict)
        if not verdict.feasible and not was_infeasible:
            events.append(_event("admission_infeasible", orch, reason, now_ms, margin=verdict.margin))
            log.warning("admission: orchestrator %s is infeasible: %s", orch, reason)
        elif verdict.feasible and was_infeasible:
            events.append(_event("admission_feasible", orch, reason, now_ms, margin=verdict.margin))

    def _export(self, orch: str, verdict: Verdict) -> None:
        if self.metrics is None:
            return
        self.metrics.admission_feasible.labels(orch).set(1.0 if verdict.feasible else 0.0)
        if verdict.margin is not None:
            self.metrics.admission_margin.labels(orch).set(min(verdict.margin, 1e6))


def still_current(
    writes: Mapping[str, bytes], reviewed: Mapping[Any, Any], current: Mapping[Any, Any]
) -> dict[str, bytes]:
    """The ``writes`` of a review whose entries are as it read them: none removed or rewritten meanwhile.

    >>> still_current({"o|a": b"new", "o|b": b"new", "o|c": b"new"}, {b"o|a": b"1", b"o|b": b"1", b"o|c": b"1"},
    ...               {b"o|a": b"1", b"o|b": b"2"})
    {'o|a': b'new'}
    """

    def raw(entries: Mapping[Any, Any], key: str) -> Any:
        return entries.get(key.encode(), entries.get(key))

    return {k: v for k, v in writes.items() if raw(current, k) is not None and raw(current, k) == raw(reviewed, k)}


_META = ("state", "reason", "registered_ms", "decided_ms", "response_ms", "margin")


def _x(margin: float | None) -> str:
    return "?" if margin is None else f"{margin:.2f}"


def _registered(obj: Mapping[str, Any]) -> float:
    v = obj.get("registered_ms", 0)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def _round(v: float | None, digits: int) -> float | None:
    return None if v is None or v == float("inf") else round(v, digits)


def _text(k: Any) -> str:
    return k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)


def _entry(
    task: AgentTask, obj: Mapping[str, Any], state: str, reason: str, now_ms: int, verdict: Verdict | None
) -> bytes:
    mine = None if verdict is None else next((r for r in verdict.results if r.name == task.name), None)
    return orjson.dumps(
        {
            **task.to_dict(),
            "state": state,
            "reason": reason[:300],
            "registered_ms": obj.get("registered_ms", now_ms),
            "decided_ms": now_ms,
            "response_ms": None if mine is None else _round(mine.response, 3),
            "margin": None if verdict is None else _round(verdict.margin, 6),
        }
    )


def _event(kind: str, orch: str, reason: str, now_ms: int, **extra: Any) -> dict[str, Any]:
    # The events topic is keyed by (model, zone); admission is per orchestrator: both are empty.
    margin = extra.pop("margin", None)
    out = {"kind": kind, "model": "", "zone": "", "orchestrator": orch, "reason": reason, "at_ms": now_ms}
    if margin is not None:
        out["margin"] = _round(float(margin), 6)
    return {**out, **extra}
