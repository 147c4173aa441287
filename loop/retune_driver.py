"""Online retuning, the loop's bookkeeping: each key's ring of recent windows, when a model is due,
the job handed to the search (run elsewhere: the worker's process, :mod:`streams.retune_shell`, or
the fast loop inline), and what a result does to the gains in force (:mod:`controllers.retune`).

``GOVERNOR_RETUNE`` is the mode: ``off`` keeps nothing; ``shadow`` (the default) searches and shows
the proposal and its expected effect in ``governor status`` (``<prefix>:retune``), never applying it;
``apply`` moves the gains in force one certified, bounded step a period towards it.  The kill switch
(``governor pause --retune``, :meth:`RetuneDriver.on_kill_switch`) puts the configured gains back at
once and applies nothing while it is set.  The gains in force are the process's: a restarted worker
starts from the configured ones.  No I/O.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from controllers import retune as rt
from controllers import startup as su
from controllers.window_record import WindowRecord
from core.settings import Settings
from loop.scaler_driver import Scaler

log = logging.getLogger(__name__)

__all__ = ["RetuneDriver"]


class RetuneDriver:
    """Rings, schedule and the gains in force of each model (module docstring)."""

    def __init__(self, settings: Settings, scaler: Scaler) -> None:
        self.settings, self.scaler = settings, scaler
        self.mode = settings.retune
        self.period_ms = int(settings.retune_period_s * 1000)
        size = min(rt.MAX_RING_WINDOWS, max(rt.MIN_WINDOWS, math.ceil(settings.retune_period_s / settings.window_s)))
        self.ring = rt.WindowRing(size)
        self.configured = {m.name: dict(settings.pid_gains) for m in settings.models}
        self.in_force = {m: dict(g) for m, g in self.configured.items()}
        self.next_due_ms: dict[str, int] = {}
        self.running: set[str] = set()
        self.killed = False
        self.status: dict[str, dict[str, Any]] = {}  # model -> the record governor status shows

    # -- windows ----------------------------------------------------------------------------
    def on_window(self, w: WindowRecord) -> None:
        """Keep a decided zone window of a configured model (nothing in mode ``off``)."""
        if self.mode == "off" or w.scope != "zone" or w.model not in self.configured:
            return
        self.ring.add(w.model, w.zone, rt.WindowSample.of(w))
        self.next_due_ms.setdefault(w.model, w.window_end_ms + self.period_ms)

    def fits(self, model: str) -> tuple[rt.PlantFit, ...]:
        """The fitted keys of ``model`` (those with enough windows)."""
        out = []
        for m, zone in sorted(self.ring.keys):
            if m != model:
                continue
            found = rt.fit(
                m,
                zone,
                self.ring.of(m, zone),
                self.scaler.learned_capacity(m, zone),
                self.measured_startup_s(m, zone),
            )
            if found is not None:
                out.append(found)
        return tuple(out)

    def measured_startup_s(self, model: str, zone: str) -> float:
        """The start-up of ``(model, zone)`` the scaler measured from its windows (the hint until one is)."""
        hint, ks = self.settings.startup_hint_s, self.scaler.states.get((model, zone))
        return hint if ks is None else su.estimate_s(ks.startup, hint)

    def due(self, now_ms: int) -> list[rt.RetuneJob]:
        """The jobs of the models whose period has passed (one in flight a model; none while killed)."""
        if self.mode == "off" or self.killed:
            return []
        jobs = []
        for model, at in sorted(self.next_due_ms.items()):
            if now_ms < at or model in self.running:
                continue
            self.next_due_ms[model] = now_ms + self.period_ms
            fits = self.fits(model)
            if not fits:
                continue
            self.running.add(model)
            jobs.append(
                rt.RetuneJob(
                    model,
                    self.settings,
                    fits,
                    dict(self.in_force[model]),
                    self.settings.retune_trials,
                    now_ms,
                    seed=now_ms // max(1, self.period_ms),
                )
            )
        return jobs

    # -- results ------------------------------------------------------------------------------
    def on_result(self, result: Mapping[str, Any], killed: bool | None, now_ms: int) -> dict[str, Any]:
        """A finished search of one model: the decision of its mode (:func:`controllers.retune.apply_decision`)
        performed, and its status record.  ``killed`` None: the kill switch could not be read (hold)."""
        model = str(result["model"])
        self.running.discard(model)
        if killed is None:
            return self._record(model, now_ms, "hold", "kill switch unreadable: nothing applied", result)
        self.killed = killed
        d = rt.apply_decision(self.mode, killed, result, self.in_force[model], self.configured[model])
        if d.gains is not None:
            self._put(model, d.gains, d.action)
        return self._record(model, now_ms, d.action, d.reason, result)

    def on_error(self, model: str, why: str, now_ms: int) -> dict[str, Any]:
        """A search that failed (fail safe: the gains in force stay)."""
        self.running.discard(model)
        return self._record(model, now_ms, "error", why, self.status.get(model, {}).get("proposal"))

    def on_kill_switch(self, killed: bool, now_ms: int) -> list[dict[str, Any]]:
        """The kill switch as last read: set, every model back on its configured gains at once."""
        was, self.killed = self.killed, killed
        if not killed or was and all(self.in_force[m] == g for m, g in self.configured.items()):
            return []
        out = []
        for model, gains in self.configured.items():
            if self.in_force[model] != gains:
                self._put(model, gains, "reverted")
            out.append(self._record(model, now_ms, "killed", "kill switch set: the configured gains are in force",
                                    self.status.get(model, {}).get("proposal")))  # fmt: skip
        return out

    def _put(self, model: str, gains: Mapping[str, float], action: str) -> None:
        self.scaler.set_gains(model, gains)
        log.warning("retune %s: %s, gains in force %s (were %s)", model, action, dict(gains), self.in_force[model])
        self.in_force[model] = dict(gains)

    def _record(
        self, model: str, now_ms: int, action: str, reason: str, proposal: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        rec = {
            "model": model,
            "mode": self.mode,
            "killed": self.killed,
            "action": action,
            "reason": reason,
            "at_ms": now_ms,
            "in_force": dict(self.in_force[model]),
            "configured": dict(self.configured[model]),
            "proposal": None if proposal is None else dict(proposal),
        }
        self.status[model] = rec
        return rec
