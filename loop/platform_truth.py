"""Replica truth from the platform, as the worker uses it.

A zone's executor with the ``k8s`` backend writes its workloads' ready and
starting replicas to ``<prefix>:platform:<zone>:replicas``
(:mod:`executors.platform`); the worker reads the hashes with the executor
heartbeats (at most once a second) and :meth:`PlatformTruth.apply` puts a
fresh reading's counts into a zone window before any driver sees it, in place
of the counts derived from the nodes' GPU records.  Pending pods then count as
starting, so the scaler's delay compensation holds instead of ordering more
replicas for pods that wait for GPUs.  A reading is fresh while its ``at_ms``
(the executor's scaled clock) is within 3 windows of the window's end; older,
the GPU records' counts stand (an executor that stops reporting does not
freeze the counts).

Hostile input: only configured models of configured zones are kept (the map is
bounded by models x zones); a value that is not a JSON object with non-negative
int ``ready``, ``starting`` and ``at_ms`` is refused whole, with a reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson

from controllers.window_record import WindowRecord
from core.settings import Settings

__all__ = ["FRESH_WINDOWS", "PlatformTruth"]

FRESH_WINDOWS = 3


class PlatformTruth:
    """(model, zone) -> (ready, starting, at_ms) of the latest platform reading (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.zones = frozenset(settings.zones)
        self.models = frozenset(m.name for m in settings.models)
        self.window_ms = int(settings.window_s * 1000)
        self.readings: dict[tuple[str, str], tuple[int, int, int]] = {}

    def set(self, zone: str, fields: Mapping[Any, Any]) -> list[str]:
        """Take one zone's hash (field = model, value = JSON); returns the refused fields' reasons."""
        if zone not in self.zones:
            return [f"zone {zone[:64]!r} is not configured"]
        bad: list[str] = []
        for raw_model, raw in fields.items():
            model = raw_model.decode("utf-8", "replace") if isinstance(raw_model, bytes) else str(raw_model)
            if model not in self.models:
                bad.append(f"{model[:64]}: not a configured model")
                continue
            try:
                obj = orjson.loads(raw)
                vals = [obj[k] for k in ("ready", "starting", "at_ms")]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                bad.append(f"{model}: not a replica reading")
                continue
            if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53 for v in vals):
                bad.append(f"{model}: ready, starting and at_ms must be ints >= 0")
                continue
            self.readings[(model, zone)] = (vals[0], vals[1], vals[2])
        return bad

    def apply(self, w: WindowRecord) -> WindowRecord:
        """``w`` with a fresh reading's ready/starting counts (unchanged without one)."""
        reading = self.readings.get((w.model, w.zone))
        if reading is None:
            return w
        ready, starting, at_ms = reading
        span = FRESH_WINDOWS * self.window_ms
        if not w.window_end_ms - span <= at_ms <= w.window_end_ms + span:
            return w  # stale, or from a clock far ahead: the GPU records' counts stand
        if (ready, starting) == (w.replicas_ready, w.replicas_starting):
            return w
        return dataclasses.replace(w, replicas_ready=ready, replicas_starting=starting)
