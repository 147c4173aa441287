"""Window metrics -> scaling decisions -> commands, per (model, zone).

The decisions are pure functions in :mod:`controllers`; this module owns the
per-key learned state and wires them together for each closed zone window:

1. *Leading violation signal* (:func:`controllers.feedforward.leading_violation_rate`):
   the window's violation rate plus the waiting requests already bound to miss.
2. *Drift* (:mod:`controllers.drift`): ADWIN on the window's TTFT P95
   (heavy-tailed), Page-Hinkley on the arrival rate (mean shifts).  A drift
   event is returned to the caller (the agent publishes it) and a rate drift
   resets the load forecaster, which re-learns the new regime.
3. *Forecast* (:mod:`controllers.forecast`): River Holt-Winters of the arrival
   rate (completions + queue growth), learned online, error tracked.
4. *Feedforward* (:mod:`controllers.feedforward`), when the model has a
   profiled ``replica_capacity_rps``: the replicas the demand forecast at
   start-up + one period needs lift the feedback level (bumpless, at most
   ``max_ff_step`` x the level per window); when quiet the level decays
   towards the requirement.
5. *Feedback*: the velocity PID (:mod:`controllers.pid`) or the fractional
   PID^alpha (:mod:`controllers.fpid`), ``Settings.controller``.

Across the zones of a model, :mod:`controllers.zone_capacity` watches every
zone's windows: a zone whose windows stop (or show no replicas while it had
demand) is lost, its demand is added at once to the survivors' feedforward
(a demand floor), routing weights leave it, and it gets them back once it
reports again and has its share ready (``zone_lost`` / ``zone_healed`` /
``zone_returned`` events; :meth:`Scaler.zone_weights`).  With
``Settings.zone_redundancy = k`` every zone's floor covers its part of any
``k`` lost zones' demand.

*Fleet budget*: a target is clamped to the model's ``max_replicas_total``
and ``GOVERNOR_MAX_REPLICAS_TOTAL`` minus the other keys' latest targets,
and to the zone's allowance when the worker has read it (what the zone's
executor enforces, :mod:`executors.budget`), never below ``min_replicas``
(:meth:`Scaler._budget_cap`); the level is clamped with it (anti-windup).

A decision that changes the replica count becomes a
:class:`~loop.commands.Command`; when the fleet's provisioned count
disagrees with the target for ``reconcile_after`` windows the target is
re-issued.  :meth:`Scaler.snapshot` / :meth:`Scaler.restore` carry the learned
state (controller, forecaster, detectors) across a worker restart.  No I/O.

Over 400 lines: the Scaler ties one (model, zone)'s PID, feedforward, drift detectors,
observer and zone capacity together, and the order in which they act on a window is kept
in one place on purpose.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from controllers import capacity_learn as cap
from controllers import feedforward as ff
from controllers import fpid
from controllers import observer as obs
from controllers import zone_capacity as zc
from controllers.drift import DriftDetector
from controllers.errors import ParameterError
from controllers.fixable import BACKLOG_WINDOWS, fixable_violation_rate, running_unfixable, stale_after_drain
from controllers.forecast import LoadForecaster
from controllers.pid import PidMeasurement, PidParams, PidState, step
from controllers.sde_fit import OnlineOuFit, OuEstimate
from controllers.window_record import WindowRecord
from core.budget import Allowance
from core.settings import Settings
from loop.commands import Command
from loop.errors import SnapshotVersionError

log = logging.getLogger(__name__)

# 2: plain data (1 was a pickle, never read again); 3: forecasters keep their horizon-mean error and
# recent values, and warm up for 2 + 1 / beta steps (a version-2 forecaster's pending forecasts
# would not fit), keys their in-system count and backlog history.
SNAPSHOT_VERSION = 3
# The scaler's forecaster (Holt, beta 0.1) warms up over its trend's memory: docs/model.md §7.
SCALER_FORECAST_WARMUP = LoadForecaster("holtwinters", 1).warmup_steps
# A restored key scales below its fleet only once this many fresh windows in a row call for it
# (issue 31, item 4): a sealed snapshot replayed within its maximum age cannot shrink the fleet.
RESTORE_CONFIRM_WINDOWS = 3


def pid_params_for(settings: Settings, model: str) -> PidParams | fpid.FpidParams:
    spec = settings.model(model)
    if spec is None:
        raise KeyError(f"no model {model!r} in settings")
    g = dict(settings.pid_gains)
    common: dict[str, Any] = {
        "eps_ref": settings.eps_ref,
        "min_replicas": spec.min_replicas,
        "max_replicas": spec.max_replicas,
        "hold_while_pending": settings.dead_time_comp,
    }
    if settings.controller == "fpid":
        extra: dict[str, Any] = {k: g[k] for k in ("alpha", "eta", "gamma", "beta") if k in g}
        if "memory" in g:
            extra["memory"] = int(g["memory"])
        return fpid.FpidParams(
            kp=g.get("kp", 0.2),
            ki=g.get("ki", 0.05),
            kd=g.get("kd", 0.0),
            deadband=g.get("deadband", 0.015),
            time_scale_s=settings.window_s,
            **extra,
            **common,
        )
    return PidParams(
        kp=g.get("kp", 0.0), ki=g.get("ki", 0.05), kd=g.get("kd", 0.0), deadband=g.get("deadband", 0.015), **common
    )


def ff_params_for(settings: Settings, model: str) -> ff.FeedforwardParams | None:
    spec = settings.model(model)
    if spec is None or spec.replica_capacity_rps is None:
        return None
    # Look ahead over what a new replica needs to become useful: start-up plus a period.
    # Tuned values (``governor tune``; ``ff_lift_z`` set by hand) come in the gains under ff_* names.
    g = settings.pid_gains
    tuned = {name: float(g[f"ff_{name}"]) for name in FF_TUNABLES if f"ff_{name}" in g}
    if "target_util" not in tuned and spec.replica_headroom is not None:  # the profile's, under the gain
        tuned["target_util"] = 1.0 / spec.replica_headroom
    return ff.FeedforwardParams(
        capacity_rps=spec.replica_capacity_rps, horizon_s=settings.startup_hint_s + settings.window_s, **tuned
    )


def controller_problem(settings: Settings) -> str:
    """Why the scaler cannot be built from ``settings`` ('' when it can): the first model whose
    controller parameters (its PID's, its feedforward's, its zones') refuse a value.

    Settings check each gain's name and that it is a number; the ranges (and the fractional
    PID's ``ki / kp < 0.5 alpha``) are the controllers' own, so ``governor config check`` and
    the worker ask them here rather than keep a second copy.

    >>> from core.settings import ModelSpec
    >>> spec = ModelSpec("m", replica_capacity_rps=2.0)
    >>> controller_problem(Settings(models=(spec,), zones=("az-a",)))
    ''
    >>> controller_problem(Settings(models=(spec,), zones=("az-a",), pid_gains={"ki": 0.05, "ff_lift_z": -1.0}))
    'pid_gains (model m): lift_z=-1.0: must be >= 0'
    """
    for spec in settings.models:
        try:
            pid_params_for(settings, spec.name)
            zone_params_for(settings, spec.name)  # builds the feedforward's too
        except ParameterError as exc:
            return f"pid_gains (model {spec.name}): {exc}"
    return ""


FF_TUNABLES = ("target_util", "error_margin", "decay_per_step", "lift_z")
CAPACITY_PARAMS = cap.CapacityParams()  # the learned capacity's (controllers.capacity_learn)
FF_MODE_QUIET_S = 60.0  # quiet time before the feedforward mode goes off (it goes on at once)


def zone_params_for(settings: Settings, model: str) -> zc.ZoneCapacityParams:
    """Zone-aware capacity of ``model``: loss timeout, hysteresis, ``zone_redundancy``.

    A healed zone gets its traffic back when its share is ready, or at the
    latest after two start-ups plus two periods (whatever is ready then).
    """
    ffp = ff_params_for(settings, model)
    heal_windows = max(3, math.ceil(2 * (settings.startup_hint_s + settings.window_s) / settings.window_s))
    return zc.ZoneCapacityParams(
        zones=tuple(settings.zones),
        window_s=settings.window_s,
        redundancy=settings.zone_redundancy,
        max_heal_windows=heal_windows,
        capacity_rps=None if ffp is None else ffp.capacity_rps,
        target_util=0.8 if ffp is None else ffp.target_util,
    )


def _running(w: WindowRecord) -> float | None:
    """The requests in service in the window: ``running_mean`` times every node that reported.

    The mean is taken over all GPU samples, a starting replica's (running 0) among them, so the
    total is the mean times the nodes sampled, not times the ready replicas: scaled by
    ``replicas_ready`` it would read low while replicas start and jump when they turn ready (a
    surge that is only a change of count).  Windows without ``nodes`` fall back to ready.
    """
    return None if w.running_mean is None else w.running_mean * max(w.nodes or w.replicas_ready, 1)


def _non_negative_or_none(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    if not 0.0 <= f < math.inf:
        raise ValueError(f"{v!r}: must be a finite number >= 0")
    return f


def _rate_or_none(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"unfixable_base={v!r}: must lie in [0, 1]")
    return f


@dataclass
class KeyState:
    ctrl: PidState | fpid.FpidState = field(default_factory=PidState)
    ff: ff.FeedforwardState = field(default_factory=ff.FeedforwardState)
    forecaster: LoadForecaster | None = None
    latency_drift: DriftDetector | None = None
    rate_drift: DriftDetector | None = None
    ff_mode: bool = False
    ff_quiet: int = 0  # consecutive windows with neither a burst nor a lift (the mode's hysteresis)
    unfixable_base: float | None = None  # running unfixable share of the key's requests (fixable_violation_rate)
    unfixable_n: int = 0
    mismatched_windows: int = 0
    last_basis_ms: int = -1
    queued: float | None = None
    in_system: float | None = None  # waiting + running (None: the window reported no running count)
    backlog: tuple[float, ...] = ()  # waiting per ready replica, the last BACKLOG_WINDOWS windows
    sde: OnlineOuFit = field(default_factory=OnlineOuFit)  # OU fit of the window TTFT P50
    capacity: cap.CapacityState = field(default_factory=cap.CapacityState)  # learned replica capacity
    kalman: obs.KalmanState | None = None
    delay: obs.LoopDelay = field(default_factory=obs.LoopDelay)
    # commands on their way: [basis_s, issued_s, target, applied_s | None]
    inflight: list[list[Any]] = field(default_factory=list)
    # Set by Scaler.restore, never saved: the fresh windows in a row since the restore that called for
    # fewer replicas than the fleet has (None: no restore to confirm; see Scaler._hold_restored).
    restore_votes: int | None = None
    fresh: bool = True  # the target is this process's decision (False from a restore to the key's next window)

    def to_state(self) -> dict[str, Any]:
        """Plain data (JSON-able): every part's own state, no pickle."""
        return {
            "ctrl": {"kind": "fpid" if isinstance(self.ctrl, fpid.FpidState) else "pid", **self.ctrl.to_dict()},
            "ff": self.ff.to_dict(),
            "forecaster": None if self.forecaster is None else self.forecaster.to_state(),
            "latency_drift": None if self.latency_drift is None else self.latency_drift.to_state(),
            "rate_drift": None if self.rate_drift is None else self.rate_drift.to_state(),
            "ff_mode": self.ff_mode,
            "ff_quiet": self.ff_quiet,
            "unfixable_base": self.unfixable_base,
            "unfixable_n": self.unfixable_n,
            "mismatched_windows": self.mismatched_windows,
            "last_basis_ms": self.last_basis_ms,
            "queued": self.queued,
            "in_system": self.in_system,
            "backlog": list(self.backlog),
            "sde": self.sde.to_state(),
            "capacity": self.capacity.to_dict(),
            "kalman": None if self.kalman is None else self.kalman.to_dict(),
            "delay": asdict(self.delay),
            "inflight": [list(c) for c in self.inflight],
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> KeyState:
        """Inverse of :meth:`to_state`; ``KeyError``, ``TypeError`` or ``ValueError`` on a malformed one."""
        ctrl_data = dict(data["ctrl"])
        kind = ctrl_data.pop("kind")
        ctrl: PidState | fpid.FpidState = (
            fpid.FpidState.from_dict(ctrl_data) if kind == "fpid" else PidState.from_dict(ctrl_data)
        )
        return cls(
            ctrl=ctrl,
            ff=ff.FeedforwardState.from_dict(dict(data["ff"])),
            forecaster=None if data["forecaster"] is None else LoadForecaster.from_state(data["forecaster"]),
            latency_drift=None if data["latency_drift"] is None else DriftDetector.from_state(data["latency_drift"]),
            rate_drift=None if data["rate_drift"] is None else DriftDetector.from_state(data["rate_drift"]),
            ff_mode=bool(data["ff_mode"]),
            ff_quiet=int(data.get("ff_quiet", 0)),
            unfixable_base=_rate_or_none(data.get("unfixable_base")),
            unfixable_n=int(data.get("unfixable_n", 0)),
            mismatched_windows=int(data["mismatched_windows"]),
            last_basis_ms=int(data["last_basis_ms"]),
            queued=None if data["queued"] is None else float(data["queued"]),
            in_system=_non_negative_or_none(data.get("in_system")),
            backlog=tuple(_non_negative_or_none(v) or 0.0 for v in data.get("backlog", ()))[-BACKLOG_WINDOWS:],
            sde=OnlineOuFit.from_state(data["sde"]),
            capacity=cap.CapacityState.from_dict(dict(data["capacity"])) if "capacity" in data else cap.CapacityState(),
            kalman=None if data["kalman"] is None else obs.KalmanState.from_dict(dict(data["kalman"])),
            delay=obs.LoopDelay(**data["delay"]),
            inflight=[list(c) for c in data["inflight"]],
        )


class Scaler:
    def __init__(self, settings: Settings, reconcile_after: int = 3) -> None:
        self.settings = settings
        self.ttl_ms = int(settings.command_ttl_s * 1000)
        self.reconcile_after = reconcile_after
        self.params = {m.name: pid_params_for(settings, m.name) for m in settings.models}
        self.ff_params = {m.name: ff_params_for(settings, m.name) for m in settings.models}
        self.horizon_steps = max(1, math.ceil((settings.startup_hint_s + settings.window_s) / settings.window_s))
        self.states: dict[tuple[str, str], KeyState] = {}
        self.zone_params = {m.name: zone_params_for(settings, m.name) for m in settings.models}
        self.zones: dict[str, zc.ZoneCapacityState] = {}  # per model: status, demand, floors
        self.events: list[dict[str, Any]] = []  # drift and mode events for the caller to publish
        self.decisions = 0
        # Each zone's share of the fleet budget, as last read (ControlLoop.set_allowances); absent: unknown.
        self.allowances: dict[str, Allowance] = {}
        # Zones whose executor heartbeat is present (ControlLoop.set_heartbeats); None: no view.
        self.alive: frozenset[str] | None = None

    # -- state ----------------------------------------------------------------
    def _new_key(self) -> KeyState:
        ctrl: PidState | fpid.FpidState = fpid.FpidState() if self.settings.controller == "fpid" else PidState()
        return KeyState(
            ctrl=ctrl,
            forecaster=LoadForecaster("holtwinters", self.horizon_steps),
            latency_drift=DriftDetector("adwin", signal="ttft_p95_ms") if self.settings.drift else None,
            rate_drift=DriftDetector("page_hinkley", signal="arrival_rps") if self.settings.drift else None,
        )

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
        """Load a :meth:`snapshot` (all or nothing; keys it holds replace those in memory).

        Returns the number of keys it restored; a snapshot of another version or
        controller raises :class:`~loop.errors.SnapshotVersionError`.
        """
        if data.get("version") != SNAPSHOT_VERSION or data.get("controller") != self.settings.controller:
            raise SnapshotVersionError(
                f"scaler snapshot version {data.get('version')!r} / controller {data.get('controller')!r} "
                f"(this worker: version {SNAPSHOT_VERSION}, controller {self.settings.controller})"
            )
        states = {(str(m), str(z)): KeyState.from_state(ks) for m, z, ks in data["states"]}
        for ks in states.values():
            ks.restore_votes = 0  # its targets shrink the fleet only once fresh windows confirm them
            ks.fresh = False  # nor is its target exported before a fresh window (KEDA would act on it)
        zones = {m: zc.ZoneCapacityState.from_dict(z) for m, z in data.get("zones", {}).items()}
        decisions = int(data.get("decisions", 0))
        self.states.update(states)
        self.zones.update(zones)
        self.decisions = max(self.decisions, decisions)
        return len(states)

    # -- decisions ------------------------------------------------------------
    def on_window(self, w: WindowRecord, now_ms: int) -> list[Command]:
        """Feed one window record; the ``scale`` command it calls for, if any (zone windows only)."""
        if w.scope != "zone":
            return []
        model, zone = w.model, w.zone
        params = self.params.get(model)
        if params is None:
            return []
        ks = self.states.get((model, zone)) or self.states.setdefault((model, zone), self._new_key())
        basis = w.window_end_ms
        if basis <= ks.last_basis_ms:
            return []  # a window we already decided on (redelivery): same decision, no new command
        ks.last_basis_ms = basis
        window_s = w.window_s or self.settings.window_s
        ready, starting = w.replicas_ready, w.replicas_starting
        queued = (w.queue_len_mean or 0.0) * max(ready, 1)
        rate = w.rate_rps
        fixable = fixable_violation_rate(w, ks.unfixable_base)
        if w.count > 0:
            ks.unfixable_base, ks.unfixable_n = running_unfixable(ks.unfixable_base, ks.unfixable_n, w.unfixable_rate)
        eps = ff.leading_violation_rate(
            w.count,
            fixable,
            queued,
            rate,
            w.ttft_slo_ms or self._slo(model),
        )
        running = _running(w)
        in_system = None if running is None else queued + running
        arrival = ff.arrival_rps(rate, queued, ks.queued, in_system, ks.in_system, window_s)
        if eps > self.settings.eps_ref and self._stale(model, zone, ks, queued, ready, arrival):
            eps = self.settings.eps_ref  # hold: the violations are the wake of a drained backlog
        ks.backlog = (*ks.backlog, queued / max(ready, 1))[-BACKLOG_WINDOWS:]
        floor = self._zones(model, zone, basis, arrival, ready, starting)
        if self.settings.observer:
            eps = self._observe(ks, model, w, basis, window_s, ready, starting, queued, rate, arrival, eps)
        meas = PidMeasurement(violation_rate=eps, replicas_current=ready + starting, replicas_pending=starting)
        ks.queued, ks.in_system = queued, in_system
        if w.ttft_p50_ms is not None:
            ks.sde = ks.sde.update(w.ttft_p50_ms, window_s)
        self._drift(ks, model, zone, w, arrival, basis)
        limits = params.limits if isinstance(params, fpid.FpidParams) else params
        ff_out = self._feedforward(model, zone, ks, rate, queued, window_s, meas, limits, floor, w)
        if ks.forecaster is not None:
            ks.forecaster.learn(arrival)
        previous = ks.ctrl.last_target
        if isinstance(params, fpid.FpidParams):
            assert isinstance(ks.ctrl, fpid.FpidState)
            ks.ctrl, out = fpid.step(params, ks.ctrl, meas, window_s)
        else:
            assert isinstance(ks.ctrl, PidState)
            ks.ctrl, out = step(params, ks.ctrl, meas, window_s)
        self.decisions += 1
        ks.fresh = True
        target = out.target_replicas
        reason = out.reason
        budget_cap = self._budget_cap(model, zone)
        if budget_cap is not None and target > budget_cap:
            reason = f"{reason}; budget: {target} clamped to {budget_cap}"
            target = budget_cap
            level = ks.ctrl.level
            # Anti-windup: the integrator (the level) stays within what the budget allows.
            ks.ctrl = replace(ks.ctrl, last_target=target, level=None if level is None else min(level, float(target)))
        provisioned = ready + starting
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
        return [
            Command(
                kind="scale",
                zone=zone,
                model=model,
                target_replicas=target,
                previous_replicas=previous if previous is not None else provisioned,
                reason=reason,
                issued_at_ms=issued,
                expires_at_ms=issued + self.ttl_ms,
                basis_ms=basis,
                controller=self.settings.controller,
                detail={
                    "violation_rate": meas.violation_rate,
                    "window_violation_rate": w.violation_rate,
                    "unfixable_rate": w.unfixable_rate,
                    "multiplier": out.multiplier,
                    "feedforward": None if ff_out is None else ff_out.to_dict(),
                    "zone_floor_rps": floor,
                    "ff_mode": ks.ff_mode,
                    "error": out.error,
                    "held_pending": out.held_pending,
                    "e2e_p95_ms": w.e2e_p95_ms,
                    "ttft_p95_ms": w.ttft_p95_ms,
                },
            )
        ]

    def _hold_restored(self, ks: KeyState, model: str, zone: str, basis: int, target: int, provisioned: int) -> bool:
        """Whether a restored key's ``target`` below its fleet (``provisioned``) is held this window.

        After :meth:`restore` a key's learned state may be a sealed snapshot replayed within its
        maximum age (issue 31, item 4): its level and target are not evidence about the fleet now.
        Scaling up goes at once; a target below the fleet is held (the level anchored at the
        fleet) until :data:`RESTORE_CONFIRM_WINDOWS` fresh windows in a row call for one, and the
        last of them acts.  A window that does not call for one starts the count again.
        """
        if ks.restore_votes is None:
            return False
        if target >= provisioned:
            ks.restore_votes = 0
            return False
        ks.restore_votes += 1
        if ks.restore_votes >= RESTORE_CONFIRM_WINDOWS:
            ks.restore_votes = None
            log.info(
                "%s/%s restored state: scale-down confirmed by %d fresh windows", zone, model, RESTORE_CONFIRM_WINDOWS
            )
            return False
        log.info(
            "%s/%s restored state: scale-down to %d held at %d (%d of %d fresh windows)",
            zone,
            model,
            target,
            provisioned,
            ks.restore_votes,
            RESTORE_CONFIRM_WINDOWS,
            extra={"model": model, "zone": zone, "window_end_ms": basis},
        )
        self.events.append(
            {
                "schema_version": 1,
                "kind": "restore_hold",
                "model": model,
                "zone": zone,
                "window_end_ms": basis,
                "target_replicas": target,
                "held_replicas": provisioned,
                "confirmations": ks.restore_votes,
            }
        )
        return True

    def _budget_cap(self, model: str, zone: str) -> int | None:
        """The most replicas ``(model, zone)`` may target under the fleet budgets, or None without one.

        A budget (the model's ``max_replicas_total`` over its zones,
        ``GOVERNOR_MAX_REPLICAS_TOTAL`` over every model and zone) minus the
        latest targets of the other keys it covers (a key without a decision
        yet counts 0), never below the model's ``min_replicas``: the zone
        that asks first gets the budget, the others are clamped to what is
        left.  The executors enforce the same budgets per zone, each within
        its zone's allowance (:mod:`executors.budget`): a known allowance caps
        the target too, so the zone's executor is not asked for more.
        """
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

    def _observe(
        self,
        ks: KeyState,
        model: str,
        w: WindowRecord,
        basis: int,
        window_s: float,
        ready: int,
        starting: int,
        queued: float,
        rate: float,
        arrival: float,
        eps: float,
    ) -> float:
        """Delay compensation: measure the loop delay from the commands' life, filter
        the loop state with the Kalman observer and predict it over that delay."""
        now_s = basis / 1000.0
        for cmd in list(ks.inflight):
            b, issued, target, applied = cmd
            if applied is None and ready + starting == target:
                cmd[3] = applied = now_s  # the fleet shows the command (window resolution)
            if applied is not None and ready == target:
                ks.delay = ks.delay.observe(
                    issued_at_s=issued, applied_at_s=applied, effective_at_s=now_s, basis_at_s=b
                )
                ks.inflight.remove(cmd)
            elif now_s - b > 600.0:
                ks.inflight.remove(cmd)  # never took effect (replaced, refused): stop waiting
        per_replica_q = queued / max(ready, 1)
        z = (w.gpu_util_mean or 0.0, per_replica_q, eps)
        if ks.kalman is None:
            ks.kalman = obs.KalmanState.initial(z)
        kp = obs.KalmanParams()
        spec = self.settings.model(model)
        steady = None
        if spec is not None and spec.replica_capacity_rps and ready > 0:
            u, q, _ = obs.load_steady_state(arrival, spec.replica_capacity_rps * ready)
            steady = (u, q, None)
        ks.kalman = obs.update(kp, ks.kalman, z, window_s, steady)
        tau = ks.delay.tau_s if ks.delay.n else self.settings.startup_hint_s
        _u, q_pred, eps_pred = obs.predict_ahead(kp, ks.kalman, tau, steady)
        # Where the loop will be when a command lands: the predicted queue's doomed share.
        lead = ff.leading_violation_rate(
            w.count,
            fixable_violation_rate(w, ks.unfixable_base),
            max(0.0, q_pred) * max(ready, 1),
            rate,
            w.ttft_slo_ms or self._slo(model),
        )
        return min(1.0, max(0.0, eps_pred, lead))

    def _itl_slo(self, model: str) -> float | None:
        spec = self.settings.model(model)
        return spec.itl_slo_ms if spec else None

    def _slo(self, model: str) -> float:
        spec = self.settings.model(model)
        return spec.ttft_slo_ms if spec else 1000.0

    def _drift(self, ks: KeyState, model: str, zone: str, w: WindowRecord, arrival: float, basis: int) -> None:
        checks = ((ks.latency_drift, w.ttft_p95_ms), (ks.rate_drift, arrival))
        for detector, value in checks:
            if detector is None or value is None:
                continue
            event = detector.update(float(value))
            if event is None:
                continue
            detail = event.to_dict()
            record = {
                **detail,
                "schema_version": 1,
                "kind": "drift",
                "detector": detail["kind"],
                "model": model,
                "zone": zone,
                "window_end_ms": basis,
            }
            self.events.append(record)
            log.info(
                "drift %s/%s: %s %s (%s)",
                zone,
                model,
                event.signal,
                event.direction,
                event.kind,
                extra={"model": model, "zone": zone, "window_end_ms": basis},
            )
            if detector is ks.rate_drift and ks.forecaster is not None:
                ks.forecaster.reset()  # the old regime's level and trend would mislead

    def _zones(self, model: str, zone: str, basis: int, arrival: float, ready: int, starting: int) -> float:
        """Fold the window into the model's zone view; publish its events; this zone's demand floor."""
        zp = self.zone_params[model]
        state, events = zc.observe(
            zp,
            self.zones.get(model, zc.ZoneCapacityState()),
            zone,
            zc.ZoneWindow(basis, arrival, ready, starting),
            self.alive,
        )
        self.zones[model] = state
        for ev in events:
            log.warning(
                "%s/%s %s: %s",
                ev.zone,
                model,
                ev.kind,
                ev.to_dict(),
                extra={"model": model, "zone": ev.zone, "window_end_ms": basis},
            )
            self.events.append({"schema_version": 1, **ev.to_dict(), "model": model})
        return zc.floor_rps(zp, state, zone, basis)

    def zone_weights(self, model: str) -> dict[str, float]:
        """Routing shares of ``model``'s traffic over the zones (0 for a lost or healing zone)."""
        zp = self.zone_params.get(model)
        if zp is None:
            return {}
        return zc.weights(zp, self.zones.get(model, zc.ZoneCapacityState()))

    def zone_route_commands(self, model: str, basis_ms: int, now_ms: int) -> list[Command]:
        """``route`` commands carrying :meth:`zone_weights` to every zone's gateway.

        Payload ``{"weights": {"*": {"<model>|<zone>": share}}}``: the routing
        backend's contract (class ``*`` = every request class), so a gateway
        sends a lost or healing zone nothing.  Published on ``zone_lost`` and
        ``zone_returned`` events (the caller's choice of when).
        """
        shares = self.zone_weights(model)
        if not shares:
            return []
        issued = max(now_ms, basis_ms)
        payload = {"weights": {"*": {f"{model}|{z}": round(w, 6) for z, w in shares.items()}}}
        status = self.zone_status(model)
        reason = "zone-aware routing: " + ", ".join(f"{z} {st}" for z, st in sorted(status.items()))
        return [
            Command(
                kind="route",
                zone=z,
                model=model,
                reason=reason,
                issued_at_ms=issued,
                expires_at_ms=issued + self.ttl_ms,
                basis_ms=basis_ms,
                controller="zone_capacity",
                payload=dict(payload),
            )
            for z in self.settings.zones
        ]

    def zone_status(self, model: str) -> dict[str, str]:
        """``up`` / ``lost`` / ``healing`` per zone that has reported."""
        return {z: st.status for z, st in self.zones.get(model, zc.ZoneCapacityState()).zones.items()}

    def _feedforward(
        self,
        model: str,
        zone: str,
        ks: KeyState,
        rate: float,
        queued: float,
        window_s: float,
        meas: PidMeasurement,
        params: PidParams,
        floor_rps: float = 0.0,
        w: WindowRecord | None = None,
    ) -> ff.FeedforwardOutput | None:
        """Size from demand (at least ``floor_rps``, the zone-aware floor); lift (or let
        decay) the feedback level before it steps."""
        ffp = self.ff_params.get(model)
        if ffp is None:
            return None
        if self.settings.learn_capacity:
            ready = meas.replicas_current - meas.replicas_pending
            window = cap.CapacityWindow(
                completions_rps=rate,
                ready=ready,
                queue_per_replica=queued / max(ready, 1),
                fixable_rate=meas.violation_rate,
                itl_p95_ms=None if w is None else w.itl_p95_ms,
                itl_slo_ms=None if w is None else (w.itl_slo_ms or self._itl_slo(model)),
                starting=meas.replicas_pending,
            )
            ffp = self._learned(model, zone, ks, ffp, window)
        forecast = error = None
        if ks.forecaster is not None and ks.forecaster.ready:
            forecast = max(0.0, ks.forecaster.forecast(self.horizon_steps)[-1])
            error = ks.forecaster.errors_hmean.mae
        ks.ff, out = ff.step(
            ffp,
            ks.ff,
            ff.FeedforwardMeasurement(
                rate_rps=rate,
                queued=queued,
                forecast_rps=forecast,
                forecast_error_rps=error,
                running=None if w is None else _running(w),
                slack_s=None if w is None else self._slack_s(model, w),
            ),
            window_s,
        )
        need = max(out.replicas, floor_rps / (ffp.capacity_rps * ffp.target_util))
        need = min(max(need, float(params.min_replicas)), float(params.max_replicas))
        level = (
            ks.ctrl.level
            if ks.ctrl.level is not None
            else float(ks.ctrl.last_target if ks.ctrl.last_target is not None else meas.replicas_current)
        )
        lift = ff.lifts(ffp, level, need, out.arrival_rps, window_s)  # beyond tolerance and counting noise
        if lift:
            # Bumpless: the integrator starts at the demand, at most max_ff_step x the level per window.
            lifted = ff.capped_lift(ffp, level, need)
            if lifted < need:
                log.debug("%s/%s feedforward lift capped at %.1f replicas (need %.1f)", zone, model, lifted, need)
            ks.ctrl = replace(ks.ctrl, level=lifted)
        elif meas.violation_rate <= params.eps_ref and ks.forecaster is not None and ks.forecaster.ready:
            # Reclaim towards the requirement only once the forecast is warm: a cold
            # model's first windows understate a ramp the trace is about to show.
            ks.ctrl = replace(ks.ctrl, level=level - ffp.decay_per_step * (level - need))
        # Hysteresis: the mode goes on at the first burst or lift and off only after FF_MODE_QUIET_S
        # without either (on the default step run it toggled in 3 of 5 windows; now 1 in 18).
        active = out.burst or lift
        ks.ff_quiet = 0 if active else ks.ff_quiet + 1
        mode = active or (ks.ff_mode and ks.ff_quiet < math.ceil(FF_MODE_QUIET_S / window_s))
        if mode != ks.ff_mode:  # per-window chatter at DEBUG; the event below is the record
            log.debug(
                "%s/%s feedforward mode %s (forecast %.1f rps, need %.1f replicas)",
                zone,
                model,
                "on" if mode else "off",
                out.forecast_rps,
                need,
            )
            self.events.append(
                {
                    "schema_version": 1,
                    "kind": "feedforward_mode",
                    "model": model,
                    "zone": zone,
                    "on": mode,
                    "forecast_rps": out.forecast_rps,
                    "need_replicas": need,
                }
            )
            ks.ff_mode = mode
        return out

    def _stale(self, model: str, zone: str, ks: KeyState, queued: float, ready: int, arrival: float) -> bool:
        """Whether this window's violations are the wake of a drained backlog (:func:`stale_after_drain`)."""
        ffp = self.ff_params.get(model)
        capacity = self.learned_capacity(model, zone)
        if ffp is None or capacity is None:
            return False
        return stale_after_drain(ks.backlog, queued, ready, arrival, ready * capacity * ffp.target_util)

    def _slack_s(self, model: str, w: WindowRecord) -> float | None:
        """The TTFT SLO's slack over the window's TTFT P50, seconds (None without a P50)."""
        if w.ttft_p50_ms is None:
            return None
        return max(0.0, ((w.ttft_slo_ms or self._slo(model)) - w.ttft_p50_ms) / 1000.0)

    def _learned(
        self, model: str, zone: str, ks: KeyState, ffp: ff.FeedforwardParams, window: cap.CapacityWindow
    ) -> ff.FeedforwardParams:
        """The feedforward parameters with the replica capacity learned from this window (the profile as prior)."""
        eps_ref = self.settings.eps_ref
        ks.capacity, change = cap.step(CAPACITY_PARAMS, ks.capacity, window, ffp.capacity_rps, eps_ref)
        learned = cap.capacity(ks.capacity, ffp.capacity_rps)
        if change is not None:
            log.warning(
                "%s/%s replica capacity: profile %.3f req/s, learned %.3f (%s)",
                zone,
                model,
                ffp.capacity_rps,
                learned,
                "prior off" if change == "off" else "prior fine again",
                extra={"model": model, "zone": zone},
            )
            self.events.append(
                {
                    "schema_version": 1,
                    "kind": "capacity_prior",
                    "model": model,
                    "zone": zone,
                    "prior_off": change == "off",
                    "prior_rps": ffp.capacity_rps,
                    "learned_rps": learned,
                }
            )
        return replace(ffp, capacity_rps=learned)

    def learned_capacity(self, model: str, zone: str) -> float | None:
        """The replica capacity (req/s) the feedforward of ``(model, zone)`` sizes with now, or None without one."""
        ffp = self.ff_params.get(model)
        ks = self.states.get((model, zone))
        if ffp is None:
            return None
        return (
            ffp.capacity_rps
            if ks is None or not self.settings.learn_capacity
            else cap.capacity(ks.capacity, ffp.capacity_rps)
        )

    def rate_forecast(self, model: str, zone: str, steps: int = 1) -> float | None:
        """Arrival-rate forecast (req/s) ``steps`` windows past the last window seen, or None
        while the key's forecaster is not warm (the routing driver's ``forecast_of``)."""
        ks = self.states.get((model, zone))
        if ks is None or ks.forecaster is None or not ks.forecaster.ready:
            return None
        return max(0.0, float(ks.forecaster.forecast(max(1, steps))[-1]))

    def targets(self, model: str | None = None, zone: str | None = None) -> dict[tuple[str, str], int]:
        """The current replica target (``last_target``) of every configured (model, zone) that
        has one, optionally of one model or zone: what ``governor_replicas_target`` exports.

        A restored key has none until it decides a fresh window: a replayed snapshot's target,
        exported, would scale a KEDA-driven fleet down at once (:meth:`_hold_restored`)."""
        return {
            (m, z): ks.ctrl.last_target
            for (m, z), ks in self.states.items()
            if ks.ctrl.last_target is not None
            and ks.fresh
            and m in self.params
            and z in self.settings.zones
            and model in (None, m)
            and zone in (None, z)
        }

    def sde_estimates(self) -> dict[tuple[str, str], OuEstimate]:
        """Fitted OU parameters of each key's TTFT P50 (docs/model.md §10 (sde), fitted online)."""
        return {key: est for key, ks in self.states.items() if (est := ks.sde.estimate()) is not None}

    def drain_events(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events
