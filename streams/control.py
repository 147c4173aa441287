"""Window metrics -> scaling decisions -> commands, per (model, zone).

The decision itself is :func:`controllers.pid.step` (pure).  This module owns
the per-key controller state, turns a decision that changes the replica count
into a :class:`~streams.commands.Command`, and reconciles: when the fleet's
provisioned count (ready + starting) disagrees with the last target for
``reconcile_after`` windows in a row (a command expired, a replica died),
the target is re-issued.  It does no I/O, so the same code runs in the Faust
agent and in the fast simulator.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controllers import feedforward as ff
from controllers.pid import PidMeasurement, PidParams, PidState, step
from governor.settings import Settings
from streams.commands import Command

log = logging.getLogger(__name__)


def pid_params_for(settings: Settings, model: str) -> PidParams:
    spec = settings.model(model)
    if spec is None:
        raise KeyError(f"no model {model!r} in settings")
    g = settings.pid_gains
    return PidParams(kp=g.get("kp", 0.0), ki=g.get("ki", 0.05), kd=g.get("kd", 0.0),
                     eps_ref=settings.eps_ref, min_replicas=spec.min_replicas,
                     max_replicas=spec.max_replicas)


def ff_params_for(settings: Settings, model: str) -> ff.FeedforwardParams | None:
    spec = settings.model(model)
    if spec is None or spec.replica_capacity_rps is None:
        return None
    # Look ahead over what a new replica needs to become useful: start-up plus a period.
    return ff.FeedforwardParams(capacity_rps=spec.replica_capacity_rps,
                                horizon_s=settings.startup_hint_s + settings.window_s)


@dataclass
class KeyState:
    pid: PidState = field(default_factory=PidState)
    ff: ff.FeedforwardState = field(default_factory=ff.FeedforwardState)
    ff_mode: bool = False
    mismatched_windows: int = 0
    last_basis_ms: int = -1


class Scaler:
    def __init__(self, settings: Settings, reconcile_after: int = 3) -> None:
        self.settings = settings
        self.ttl_ms = int(settings.command_ttl_s * 1000)
        self.reconcile_after = reconcile_after
        self.params = {m.name: pid_params_for(settings, m.name) for m in settings.models}
        self.ff_params = {m.name: ff_params_for(settings, m.name) for m in settings.models}
        self.states: dict[tuple[str, str], KeyState] = {}
        self.decisions = 0

    def on_window(self, m: Mapping[str, Any], now_ms: int) -> Command | None:
        """Feed one zone-scope window record; maybe return a command."""
        if m.get("scope") != "zone":
            return None
        model, zone = m["model"], m["zone"]
        params = self.params.get(model)
        if params is None:
            return None
        ks = self.states.setdefault((model, zone), KeyState())
        basis = int(m["window_end_ms"])
        if basis <= ks.last_basis_ms:
            return None  # a window we already decided on (redelivery): same decision, no new command
        ks.last_basis_ms = basis
        ready = int(m.get("replicas_ready") or 0)
        starting = int(m.get("replicas_starting") or 0)
        # Lead the lagging signal: count the waiting requests already bound to miss.
        eps = ff.leading_violation_rate(
            int(m.get("count") or 0), float(m.get("violation_rate") or 0.0),
            float(m.get("queue_len_mean") or 0.0) * max(ready, 1), float(m.get("rate_rps") or 0.0),
            float(m.get("ttft_slo_ms") or self._slo(model)))
        meas = PidMeasurement(violation_rate=eps, replicas_current=ready + starting,
                              replicas_pending=starting)
        previous = ks.pid.last_target
        ff_out = self._feedforward(model, zone, ks, m, meas, params)
        ks.pid, out = step(params, ks.pid, meas, float(m["window_s"]))
        self.decisions += 1
        target = out.target_replicas
        reason = out.reason
        provisioned = ready + starting
        if target == (previous if previous is not None else provisioned):
            ks.mismatched_windows = ks.mismatched_windows + 1 if provisioned != target else 0
            if ks.mismatched_windows < self.reconcile_after:
                return None
            ks.mismatched_windows = 0
            reason = f"reconcile: fleet has {provisioned}, target {target}"
        else:
            ks.mismatched_windows = 0
        issued = max(now_ms, basis)
        return Command(kind="scale", zone=zone, model=model, target_replicas=target,
                       previous_replicas=previous if previous is not None else provisioned,
                       reason=reason, issued_at_ms=issued, expires_at_ms=issued + self.ttl_ms,
                       basis_ms=basis, controller="pid",
                       detail={"violation_rate": meas.violation_rate, "multiplier": out.multiplier,
                               "feedforward": None if ff_out is None else ff_out.to_dict(),
                               "error": out.error, "held_pending": out.held_pending,
                               "e2e_p95_ms": m.get("e2e_p95_ms"), "ttft_p95_ms": m.get("ttft_p95_ms")})

    def _slo(self, model: str) -> float:
        spec = self.settings.model(model)
        return spec.ttft_slo_ms if spec else 1000.0

    def _feedforward(self, model: str, zone: str, ks: KeyState, m: Mapping[str, Any],
                     meas: PidMeasurement, params: PidParams) -> ff.FeedforwardOutput | None:
        """Size from demand; lift (or let decay) the PID's level before it steps."""
        ffp = self.ff_params.get(model)
        if ffp is None:
            return None
        window_s = float(m["window_s"])
        ready = int(m.get("replicas_ready") or 0)
        queued = float(m.get("queue_len_mean") or 0.0) * max(ready, 1)
        ks.ff, out = ff.step(ffp, ks.ff, ff.FeedforwardMeasurement(
            rate_rps=float(m.get("rate_rps") or 0.0), queued=queued), window_s)
        need = min(max(out.replicas, float(params.min_replicas)), float(params.max_replicas))
        level = ks.pid.level if ks.pid.level is not None else float(
            ks.pid.last_target if ks.pid.last_target is not None else meas.replicas_current)
        if need > level * (1.0 + ffp.tolerance):
            ks.pid = replace(ks.pid, level=need)  # bumpless: the integrator starts at the demand
        elif meas.violation_rate <= params.eps_ref:
            ks.pid = replace(ks.pid, level=level - ffp.decay_per_step * (level - need))
        mode = out.burst or need > level * (1.0 + ffp.tolerance)
        if mode != ks.ff_mode:
            log.info("%s/%s feedforward mode %s (forecast %.1f rps, need %.1f replicas)",
                     zone, model, "on" if mode else "off", out.forecast_rps, need)
            ks.ff_mode = mode
        return out
