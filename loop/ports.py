"""What the loop needs from the process around it, as protocols (the worker's
:class:`streams.metrics_export.WorkerMetrics` is one; the fast simulator passes none).

The loop never imports the worker: it is handed these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["LoopMetrics"]


class LoopMetrics(Protocol):
    """The metric families the loop updates as events pass (Prometheus-style ``labels(...).set/inc``)."""

    records: Any
    telemetry_messages: Any
    target: Any
    capacity: Any
    events: Any
    ff_mode: Any
    sde: Any
    stale: Any
    admission_feasible: Any
    admission_margin: Any

    def observe_window(self, m: Mapping[str, Any]) -> None: ...

    def observe_breaker(self, model: str, zone: str, state: str, *, changed: bool) -> None: ...

    def observe_agent_weights(self, model: str, zone: str, weights: Mapping[str, float]) -> None: ...

    def observe_dead_letter(self, reason: str) -> None: ...
