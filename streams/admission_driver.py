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
entries (bad JSON, bad fields, over :data:`MAX_TASKS`) are marked ``invalid``
with the reason once and never analysed.  One worker writes the registry
(several workers would each review it: documented in docs/architecture.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson

from controllers.admission import AgentTask, Verdict, admit, evaluate
from controllers.errors import ParameterError
from controllers.window_record import WindowRecord

__all__ = ["FRESH_WINDOWS", "MAX_TASKS", "AdmissionDriver"]

log = logging.getLogger(__name__)

MAX_TASKS = 1024
FRESH_WINDOWS = 6
STATES = ("pending", "admitted", "rejected", "infeasible", "invalid")


class AdmissionDriver:
    """Latencies from the windows; decisions on the registry (see the module docstring)."""

    def __init__(self, window_s: float, metrics: Any = None) -> None:
        self.window_ms = int(window_s * 1000)
        self.metrics = metrics
        self._p99: dict[tuple[str, str], tuple[float, int]] = {}  # (model, zone) -> (p99 ms, window end)
        self._last_end = 0
        self.verdicts: dict[str, Verdict] = {}
        # The last analysis of each orchestrator's admitted set, by (set, latencies): the review runs every second,
        # the latencies move once a window, so an unchanged set is not analysed again (bisections per task).
        self._analysed: dict[str, tuple[tuple[Any, ...], Verdict]] = {}

    def on_window(self, w: WindowRecord) -> None:
        """Keep a zone window's end-to-end P99 (bounded by the configured models x zones that reach it)."""
        if w.scope != "zone" or w.e2e_p99_ms is None or not w.count:
            return
        if len(self._p99) >= MAX_TASKS and (w.model, w.zone) not in self._p99:
            return
        self._p99[(w.model, w.zone)] = (float(w.e2e_p99_ms), w.window_end_ms)
        self._last_end = max(self._last_end, w.window_end_ms)

    def latencies(self) -> dict[str, float]:
        """Model -> the largest fresh P99 over its zones (ms)."""
        horizon = self._last_end - FRESH_WINDOWS * self.window_ms
        out: dict[str, float] = {}
        for (model, _zone), (p99, end) in self._p99.items():
            if end >= horizon:
                out[model] = max(out.get(model, 0.0), p99)
        return out

    def review(self, entries: Mapping[Any, Any], now_ms: int) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
        """The registry's fields -> (fields to write back, events).  Never raises on an entry."""
        lat = self.latencies()
        tasks: dict[str, tuple[AgentTask, dict[str, Any]]] = {}
        writes: dict[str, bytes] = {}
        events: list[dict[str, Any]] = []
        for i, (raw_key, raw) in enumerate(sorted(entries.items(), key=lambda kv: _text(kv[0]))):
            key = _text(raw_key)[:300]
            try:
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
        for orch, items in sorted(by_orch.items()):
            self._review_orchestrator(orch, items, lat, now_ms, writes, events)
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
    ) -> None:
        admitted = [t for t, o in items if o.get("state") in ("admitted", "infeasible")]
        was_infeasible = any(o.get("state") == "infeasible" for _, o in items)
        pending = sorted(
            (o.get("registered_ms", 0), t.name, t, o) for t, o in items if o.get("state", "pending") == "pending"
        )
        for _, _, task, obj in pending:
            d = admit(task, admitted, lat)
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
        verdict = cached[1] if cached is not None and cached[0] == key else evaluate(admitted, lat)
        self._analysed[orch] = (key, verdict)
        if verdict.missing:  # a model's latency went stale: keep the last states (hold), say nothing new
            return
        self.verdicts[orch] = verdict
        self._export(orch, verdict)
        state = "admitted" if verdict.feasible else "infeasible"
        if verdict.feasible:
            reason = f"feasible, margin x{verdict.margin:.2f}"
        else:
            miss = verdict.misses()[0]
            reason = f"{miss.name} can miss its {miss.deadline:g} ms deadline at the measured P99 (margin x{verdict.margin:.2f})"
        objs = {t.key: o for t, o in items}
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
        self.metrics.admission_margin.labels(orch).set(min(verdict.margin, 1e6))


_META = ("state", "reason", "registered_ms", "decided_ms", "response_ms", "margin")


def _text(k: Any) -> str:
    return k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)


def _entry(task: AgentTask, obj: Mapping[str, Any], state: str, reason: str, now_ms: int, verdict: Verdict) -> bytes:
    mine = next((r for r in verdict.results if r.name == task.name), None)
    response = None if mine is None or mine.response == float("inf") else round(mine.response, 3)
    return orjson.dumps(
        {
            **task.to_dict(),
            "state": state,
            "reason": reason[:300],
            "registered_ms": obj.get("registered_ms", now_ms),
            "decided_ms": now_ms,
            "response_ms": response,
            "margin": None if verdict.margin == float("inf") else round(verdict.margin, 6),
        }
    )


def _event(kind: str, orch: str, reason: str, now_ms: int, **extra: Any) -> dict[str, Any]:
    # The events topic is keyed by (model, zone); admission is per orchestrator: both are empty.
    margin = extra.pop("margin", None)
    out = {"kind": kind, "model": "", "zone": "", "orchestrator": orch, "reason": reason, "at_ms": now_ms}
    if margin is not None:
        out["margin"] = None if margin == float("inf") else round(float(margin), 6)
    return {**out, **extra}
