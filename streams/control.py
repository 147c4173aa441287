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
from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class KeyState:
    pid: PidState = field(default_factory=PidState)
    mismatched_windows: int = 0
    last_basis_ms: int = -1


class Scaler:
    def __init__(self, settings: Settings, reconcile_after: int = 3) -> None:
        self.settings = settings
        self.ttl_ms = int(settings.command_ttl_s * 1000)
        self.reconcile_after = reconcile_after
        self.params = {m.name: pid_params_for(settings, m.name) for m in settings.models}
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
        meas = PidMeasurement(violation_rate=float(m.get("violation_rate") or 0.0),
                              replicas_current=ready + starting, replicas_pending=starting)
        previous = ks.pid.last_target
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
                               "error": out.error, "held_pending": out.held_pending,
                               "e2e_p95_ms": m.get("e2e_p95_ms"), "ttft_p95_ms": m.get("ttft_p95_ms")})
