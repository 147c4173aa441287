"""Missing telemetry, watched per (model, zone): which zone windows the control loop holds.

:class:`TelemetryWatch` applies :mod:`controllers.staleness` to the zone windows
the loop decides on and to the clock: a window whose request records or GPU
samples are missing is *held* (no driver acts on it), a (model, zone) is
*stale* after ``GOVERNOR_STALE_WINDOWS`` held windows in a row or as many
window lengths without any window.  Each change is an event
(``telemetry_stale`` / ``telemetry_fresh``, with the reason) and the gauge
``governor_telemetry_stale{model,zone}``.  State is kept only for configured
models and zones, so it is bounded.

>>> from core.settings import ModelSpec, Settings
>>> from controllers.window_record import decode_window
>>> watch = TelemetryWatch(Settings(models=(ModelSpec("m"),), zones=("az-a",), window_s=10.0))
>>> busy = {"scope": "zone", "model": "m", "zone": "az-a", "window_s": 10.0, "count": 0, "replicas_ready": 4,
...         "running_mean": 3.0}
>>> events = []
>>> [watch.held(decode_window({**busy, "window_end_ms": k * 10_000}), events) for k in (1, 2, 3)]
['no_requests', 'no_requests', 'no_requests']
>>> [(e["kind"], e["reason"]) for e in events]
[('telemetry_stale', 'no_requests')]
"""

from __future__ import annotations

import logging
from typing import Any

from controllers.staleness import HOLD_KINDS, StaleParams, StaleState, classify, silent, step
from controllers.window_record import WindowRecord
from core.settings import Settings
from loop.ports import LoopMetrics

__all__ = ["TelemetryWatch"]

log = logging.getLogger(__name__)


class TelemetryWatch:
    """Staleness of every configured (model, zone) (see the module docstring)."""

    def __init__(self, settings: Settings, metrics: LoopMetrics | None = None) -> None:
        self.zones = frozenset(settings.zones)
        self.window_ms = int(settings.window_s * 1000)
        self.lateness_ms = int(settings.lateness_s * 1000)
        self.metrics = metrics
        self.params = StaleParams(settings.stale_windows)
        self.models = {spec.name for spec in settings.models}
        self.stale: dict[tuple[str, str], StaleState] = {}
        self.last_end_ms: dict[tuple[str, str], int] = {}

    def held(self, w: WindowRecord, events: list[dict[str, Any]]) -> str | None:
        """What the loop must hold this zone window for (``no_requests``, ``no_gpu``, ``node_cap``), or None.

        Staleness changes are appended to ``events``.
        """
        if w.model not in self.models or w.zone not in self.zones:
            return None
        key = (w.model, w.zone)
        if w.window_end_ms <= self.last_end_ms.get(key, -1):
            return None  # a redelivery: the drivers drop it themselves
        self.last_end_ms[key] = w.window_end_ms
        replicas = w.replicas_ready + w.replicas_starting
        kind = classify(
            w.count, w.running_mean, w.queue_len_mean, replicas, node_cap_dropped_rate=w.node_cap_dropped_rate
        )
        before = self.stale.get(key, StaleState())
        self._set(key, before, step(self.params, before, kind), w.window_end_ms, events)
        return kind if kind in HOLD_KINDS else None

    def check_silence(self, now_ms: int) -> list[dict[str, Any]]:
        """Mark stale every (model, zone) with no window for ``stale_windows`` window lengths; the events."""
        events: list[dict[str, Any]] = []
        window_ms, lateness_ms = self.window_ms, self.lateness_ms
        for key, last in self.last_end_ms.items():
            before = self.stale.get(key, StaleState())
            if not before.stale and silent(self.params, last, now_ms, window_ms, lateness_ms):
                after = StaleState(held_windows=before.held_windows, stale=True, reason="no_window")
                self._set(key, before, after, last, events)
        return events

    def _set(
        self, key: tuple[str, str], before: StaleState, after: StaleState, end_ms: int, events: list[dict[str, Any]]
    ) -> None:
        self.stale[key] = after
        if after.stale != before.stale:
            model, zone = key
            kind = "telemetry_stale" if after.stale else "telemetry_fresh"
            ev = {"schema_version": 1, "kind": kind, "model": model, "zone": zone, "window_end_ms": end_ms}
            ev.update(reason=after.reason or before.reason, held_windows=after.held_windows)
            events.append(ev)
            what = "holding its decisions" if after.stale else "deciding again"
            log.warning("%s/%s %s (%s): %s", zone, model, kind, ev["reason"], what)
        if self.metrics is not None:
            self.metrics.stale.labels(key[0], key[1]).set(1.0 if after.stale else 0.0)
