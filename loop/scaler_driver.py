"""Window records -> ``scale`` commands, per (model, zone): the bookkeeping around the scaling law.

The law (:func:`controllers.scaling_law.decide`) is pure; per closed zone window this driver drops a window it
already decided (redelivery), computes the fleet budget left to the key (:meth:`Scaler._budget_cap`:
``max_replicas_total``, ``GOVERNOR_MAX_REPLICAS_TOTAL``, the zone's allowance, never below ``min_replicas``),
holds a restored key's scale-down until fresh windows confirm it (:meth:`Scaler._hold_restored`), makes the
:class:`~loop.commands.Command` and re-issues a target the fleet disagrees with for ``reconcile_after``
windows. It keeps each model's zone view (:meth:`Scaler.zone_weights`); :meth:`Scaler.snapshot` /
:meth:`Scaler.restore` carry the state across a restart. No I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from controllers import scaling_law as law
from controllers import zone_capacity as zc
from controllers.sde_fit import OuEstimate
from controllers.window_record import WindowRecord
from core.budget import Allowance
from core.settings import Settings
from loop.commands import Command
from loop.errors import SnapshotVersionError

log = logging.getLogger(__name__)

# 2: plain data (1 was a pickle, never read again); 3: forecasters keep their horizon-mean error and
# recent values, and warm up for 2 + 1 / beta steps (a version-2 forecaster's pending forecasts
# would not fit), keys their in-system count and backlog history; 4: keys their measured start-up and
# scale-down stabilisation (windows since the last scale-up, the window's raw targets, the holding condition).
SNAPSHOT_VERSION = 4
# A restored key scales below its fleet only once this many fresh windows in a row call for it
# (issue 31, item 4): a sealed snapshot replayed within its maximum age cannot shrink the fleet.
RESTORE_CONFIRM_WINDOWS = 3
_LOG_LEVELS = {"zone_lost": logging.WARNING, "zone_healed": logging.WARNING, "zone_returned": logging.WARNING,
               "capacity_prior": logging.WARNING, "drift": logging.INFO, "scale_down_hold": logging.DEBUG,
               "slow_stage": logging.INFO}  # fmt: skip


@dataclass
class KeyState(law.ScalingState):
    """The law's state of one key plus the driver's bookkeeping."""

    mismatched_windows: int = 0
    last_basis_ms: int = -1
    # Set by Scaler.distrust_restored, never saved: the fresh windows in a row since the restore that called for
    # fewer replicas than the fleet has (None: no restore to confirm; see Scaler._hold_restored).
    restore_votes: int | None = None
    fresh: bool = True  # the target is this process's decision (False from a restore to the key's next window)

    def to_state(self) -> dict[str, Any]:
        return {
            **super().to_state(),
            "mismatched_windows": self.mismatched_windows,
            "last_basis_ms": self.last_basis_ms,
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> KeyState:
        """Inverse of :meth:`to_state`; ``KeyError``, ``TypeError`` or ``ValueError`` on a malformed one."""
        return cls(
            **cls.fields_from_state(data),
            mismatched_windows=int(data["mismatched_windows"]),
            last_basis_ms=int(data["last_basis_ms"]),
        )


class Scaler:
    def __init__(self, settings: Settings, reconcile_after: int = 3) -> None:
        self.settings = settings
        self.ttl_ms = int(settings.command_ttl_s * 1000)
        self.reconcile_after = reconcile_after
        self.laws = {m.name: law.params_for(settings, m.name) for m in settings.models}
        self.states: dict[tuple[str, str], KeyState] = {}
        self.zones: dict[str, zc.ZoneCapacityState] = {}  # per model: status, demand, floors
        self.events: list[dict[str, Any]] = []  # drift and mode events for the caller to publish
        self.decisions = 0
        # Each zone's share of the fleet budget, as last read (ControlLoop.set_allowances); absent: unknown.
        self.allowances: dict[str, Allowance] = {}
        # Zones whose executor heartbeat is present (ControlLoop.set_heartbeats); None: no view.
        self.alive: frozenset[str] | None = None

    # -- state ----------------------------------------------------------------
    def _new_key(self, model: str) -> KeyState:
        return KeyState(**vars(self.laws[model].new_state()))

    def snapshot(self, only: str | None = None) -> dict[str, Any]:
        """Learned state of every key (controller, forecaster, detectors, zones) as plain data.

        ``only`` keeps one model's keys (the worker stores one snapshot per model).
        """
        return {
            "version": SNAPSHOT_VERSION,
            "controller": self.settings.controller,
            "states": [
                [model, zone, ks.to_state()] for (model, zone), ks in self.states.items() if only in (None, model)
            ],
            "decisions": self.decisions,
            "zones": {m: st.to_dict() for m, st in self.zones.items() if only in (None, m)},
        }

    def restore(self, data: Mapping[str, Any]) -> int:
        """Load a :meth:`snapshot` (all or nothing; its keys replace those in memory); the keys restored.
        Another version or controller raises :class:`~loop.errors.SnapshotVersionError`."""
        if data.get("version") != SNAPSHOT_VERSION or data.get("controller") != self.settings.controller:
            raise SnapshotVersionError(
                f"scaler snapshot version {data.get('version')!r} / controller {data.get('controller')!r} "
                f"(this worker: version {SNAPSHOT_VERSION}, controller {self.settings.controller})"
            )
        states = {(str(m), str(z)): KeyState.from_state(ks) for m, z, ks in data["states"]}
        zones = {m: zc.ZoneCapacityState.from_dict(z) for m, z in data.get("zones", {}).items()}
        decisions = int(data.get("decisions", 0))
        self.states.update(states)
        self.zones.update(zones)
        self.decisions = max(self.decisions, decisions)
        return len(states)

    def distrust_restored(self, model: str) -> None:
        """Treat ``model``'s keys as restored from a snapshot that may be replayed: their targets shrink
        the fleet only once :data:`RESTORE_CONFIRM_WINDOWS` fresh windows confirm them, and none is
        exported before a fresh window (KEDA would act on it).  :meth:`restore` stays lossless (the
        contract battery's restored subject decides like the original); the loop's snapshot path calls
        this after it."""
        for (m, _), ks in self.states.items():
            if m == model:
                ks.restore_votes, ks.fresh = 0, False

    # -- decisions ------------------------------------------------------------
    def on_window(self, w: WindowRecord, now_ms: int) -> list[Command]:
        """Feed one window record; the ``scale`` command it calls for, if any (zone windows only)."""
        p = self.laws.get(w.model)
        if w.scope != "zone" or p is None:
            return []
        model, zone, basis = w.model, w.zone, w.window_end_ms
        ks = self.states.get((model, zone)) or self.states.setdefault((model, zone), self._new_key(model))
        if basis <= ks.last_basis_ms:
            return []  # a window we already decided on (redelivery): same decision, no new command
        ks.last_basis_ms = basis
        zones = self.zones.get(model, zc.ZoneCapacityState())
        cap = self._budget_cap(model, zone)
        ks, self.zones[model], d = law.decide(p, ks, zones, w, alive=self.alive, budget_cap=cap, hand_over=True)
        self.states[(model, zone)] = ks
        self._publish(d.events, basis)
        self.decisions += 1
        ks.fresh = True
        target, previous, reason = d.target, d.previous, d.reason
        provisioned = w.replicas_ready + w.replicas_starting
        if self._hold_restored(ks, model, zone, basis, target, provisioned):
            # Anchored at the fleet: the restored level cannot drive the next windows' targets either.
            ks.ctrl = replace(ks.ctrl, last_target=provisioned, level=max(ks.ctrl.level or 0.0, float(provisioned)))
            target = previous = provisioned
        if target == (previous if previous is not None else provisioned):
            ks.mismatched_windows = ks.mismatched_windows + 1 if provisioned != target else 0
            if ks.mismatched_windows < self.reconcile_after:
                return []
            ks.mismatched_windows = 0
            reason = f"reconcile: fleet has {provisioned}, target {target}"
        else:
            ks.mismatched_windows = 0
        issued = max(now_ms, basis)
        # Newer decisions supersede older ones still on their way.
        ks.inflight = [[basis / 1000.0, issued / 1000.0, target, None]]
        out, ff_out = d.out, None if d.feedforward is None else d.feedforward.to_dict()
        detail = {"violation_rate": d.violation_rate, "window_violation_rate": w.violation_rate,
                  "unfixable_rate": w.unfixable_rate, "multiplier": out.multiplier, "feedforward": ff_out,
                  "zone_floor_rps": d.zone_floor_rps, "ff_mode": ks.ff_mode, "error": out.error,
                  "held_pending": out.held_pending, "e2e_p95_ms": w.e2e_p95_ms, "ttft_p95_ms": w.ttft_p95_ms,
                  "scale_down_held_by": d.held_by, "startup_s": d.startup_s}  # fmt: skip
        prev = previous if previous is not None else provisioned
        return [self._command("scale", zone, model, reason, issued, basis, self.settings.controller, detail=detail,
                              target_replicas=target, previous_replicas=prev)]  # fmt: skip

    def _command(
        self, kind: str, zone: str, model: str, reason: str, issued: int, basis: int, controller: str, **kw: Any
    ) -> Command:
        return Command(kind=kind, zone=zone, model=model, reason=reason, issued_at_ms=issued,
                       expires_at_ms=issued + self.ttl_ms, basis_ms=basis, controller=controller, **kw)  # fmt: skip

    def _publish(self, events: tuple[dict[str, Any], ...], basis: int) -> None:
        """Queue the law's events for the caller and log the ones an operator reads."""
        for ev in events:
            self.events.append(ev)
            level = _LOG_LEVELS.get(ev["kind"], logging.DEBUG)
            log.log(level, "%s/%s %s: %s", ev["zone"], ev["model"], ev["kind"], ev,
                    extra={"model": ev["model"], "zone": ev["zone"], "window_end_ms": basis})  # fmt: skip

    def _hold_restored(self, ks: KeyState, model: str, zone: str, basis: int, target: int, provisioned: int) -> bool:
        """Whether a restored key's ``target`` below its fleet (``provisioned``) is held this window.

        A restored state may be a sealed snapshot replayed within its maximum age (issue 31, item 4): scaling
        up goes at once; a target below the fleet is held until :data:`RESTORE_CONFIRM_WINDOWS` fresh windows
        in a row call for one (the last acts; a window that does not starts the count again)."""
        if ks.restore_votes is None:
            return False
        if target >= provisioned:
            ks.restore_votes = 0
            return False
        ks.restore_votes += 1
        if ks.restore_votes >= RESTORE_CONFIRM_WINDOWS:
            log.info("%s/%s restored state: scale-down confirmed by %d fresh windows", zone, model, ks.restore_votes)
            ks.restore_votes = None
            return False
        log.info("%s/%s restored state: scale-down to %d held at %d (%d of %d fresh windows)", zone, model, target,
                 provisioned, ks.restore_votes, RESTORE_CONFIRM_WINDOWS,
                 extra={"model": model, "zone": zone, "window_end_ms": basis})  # fmt: skip
        self.events.append({"schema_version": 1, "kind": "restore_hold", "model": model, "zone": zone,
                            "window_end_ms": basis, "target_replicas": target, "held_replicas": provisioned,
                            "confirmations": ks.restore_votes})  # fmt: skip
        return True

    def _budget_cap(self, model: str, zone: str) -> int | None:
        """The most replicas ``(model, zone)`` may target under the fleet budgets (module docstring), or None.

        The other keys' latest targets count (none yet: 0); the zone that asks first gets the budget. A known
        allowance caps the target too: the zone's executor enforces it (:mod:`executors.budget`)."""
        spec = self.settings.model(model)
        total = self.settings.max_replicas_total
        if spec is None or (spec.max_replicas_total is None and not total):
            return None
        caps: list[int] = []
        others = [(key, ks.ctrl.last_target or 0) for key, ks in self.states.items() if key != (model, zone)]
        if spec.max_replicas_total is not None:
            caps.append(spec.max_replicas_total - sum(n for (m, _z), n in others if m == model))
        if total:
            caps.append(total - sum(n for _key, n in others))
        allowance = self.allowances.get(zone)
        if allowance is not None:
            if spec.max_replicas_total is not None and model in allowance.models:
                caps.append(allowance.models[model])
            if total and allowance.total is not None:
                caps.append(allowance.total - sum(n for (_m, z), n in others if z == zone))
        return max(min(caps), spec.min_replicas)

    def zone_weights(self, model: str) -> dict[str, float]:
        """Routing shares of ``model``'s traffic over the zones (0 for a lost or healing zone)."""
        p = self.laws.get(model)
        return {} if p is None else zc.weights(p.zones, self.zones.get(model, zc.ZoneCapacityState()))

    def zone_route_commands(self, model: str, basis_ms: int, now_ms: int) -> list[Command]:
        """``route`` commands carrying :meth:`zone_weights` to every zone's gateway (on ``zone_lost`` and
        ``zone_returned``): payload ``{"weights": {"*": {"<model>|<zone>": share}}}``, every request class."""
        shares = self.zone_weights(model)
        if not shares:
            return []
        issued = max(now_ms, basis_ms)
        payload = {"weights": {"*": {f"{model}|{z}": round(w, 6) for z, w in shares.items()}}}
        status = self.zone_status(model)
        reason = "zone-aware routing: " + ", ".join(f"{z} {st}" for z, st in sorted(status.items()))
        return [
            self._command("route", z, model, reason, issued, basis_ms, "zone_capacity", payload=dict(payload))
            for z in self.settings.zones
        ]

    def zone_status(self, model: str) -> dict[str, str]:
        """``up`` / ``lost`` / ``healing`` per zone that has reported."""
        return {z: st.status for z, st in self.zones.get(model, zc.ZoneCapacityState()).zones.items()}

    def learned_capacity(self, model: str, zone: str) -> float | None:
        """The replica capacity (req/s) the feedforward of ``(model, zone)`` sizes with now, or None without one."""
        p, ks = self.laws.get(model), self.states.get((model, zone))
        if p is None or p.feedforward is None:
            return None
        return p.feedforward.capacity_rps if ks is None else law.learned_capacity(p, ks)

    def set_gains(self, model: str, gains: Mapping[str, float]) -> None:
        """``gains`` in force for ``model`` from its next window (:mod:`loop.retune_driver`); the keys' state is
        kept (bumpless); a gain the controllers refuse raises :class:`~controllers.errors.ParameterError`."""
        self.laws[model] = law.params_for(self.settings.replace(pid_gains=dict(gains)), model)

    def rate_forecast(self, model: str, zone: str, steps: int = 1) -> float | None:
        """Arrival-rate forecast (req/s) ``steps`` windows past the last window seen, or None
        while the key's forecaster is not warm (the routing driver's ``forecast_of``)."""
        ks = self.states.get((model, zone))
        if ks is None or ks.forecaster is None or not ks.forecaster.ready:
            return None
        return max(0.0, float(ks.forecaster.forecast(max(1, steps))[-1]))

    def targets(self, model: str | None = None, zone: str | None = None) -> dict[tuple[str, str], int]:
        """The current target of every configured (model, zone) that has one (optionally of one model or zone):
        ``governor_replicas_target``.  A restored key has none until it decides a fresh window: a replayed
        snapshot's target, exported, would scale a KEDA-driven fleet down at once (:meth:`_hold_restored`)."""
        ours = [(m, z) for m, z in self.states if m in self.laws and z in self.settings.zones]
        keys = [(m, z) for m, z in ours if model in (None, m) and zone in (None, z) and self.states[(m, z)].fresh]
        return {k: t for k in keys if (t := self.states[k].ctrl.last_target) is not None}

    def key_status(self, model: str, zone: str) -> tuple[int | None, bool | None]:
        """The key's target and feedforward mode (None, None before its first window): its status row."""
        ks = self.states.get((model, zone))
        return (None, None) if ks is None else (ks.ctrl.last_target, ks.ff_mode)

    def sde_estimates(self) -> dict[tuple[str, str], OuEstimate]:
        """Fitted OU parameters of each key's TTFT P50 (docs/model.md §10 (sde), fitted online)."""
        return {key: est for key, ks in self.states.items() if (est := ks.sde.estimate()) is not None}

    def drain_events(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events
