"""The composed scaling law of one (model, zone): state and window in, state and decision out.

One closed zone window goes through, in this order (docs/model.md §4-§11):

1. *Leading violation signal* (:func:`controllers.feedforward.leading_violation_rate`):
   the violations a replica count can fix (:mod:`controllers.fixable`) plus the waiting
   requests already bound to miss; held at ``eps_ref`` when they are the wake of a drained
   backlog (:func:`controllers.fixable.stale_after_drain`).
2. *Zones* (:mod:`controllers.zone_capacity`): the window folds into the model's zone
   view; a lost zone's demand becomes the survivors' floor.
3. *Observer* (:mod:`controllers.observer`, ``observer``): the signal predicted over the
   measured loop delay, with the learned capacity and the load forecast as its known inputs
   (:func:`observer_inputs`).
4. *Drift* (:mod:`controllers.drift`): ADWIN on the TTFT P95, Page-Hinkley on the arrival
   rate; a rate drift resets the load forecaster.
5. *Feedforward* (:mod:`controllers.feedforward`, with a profiled capacity, learned online
   by :mod:`controllers.capacity_learn` when ``learn_capacity``): the demand forecast lifts
   the feedback level (bumpless) or lets it decay towards the requirement.
6. *Feedback*: the velocity PID (:mod:`controllers.pid`) or PID^alpha (:mod:`controllers.fpid`),
   clamped to the fleet budget the caller computed (anti-windup: the level with it).
7. *Scale-down stabilisation* (:func:`stabilise_scale_down`): dwell after a scale-up, the highest
   raw target of the stabilisation window, the replicas that absorb the demand; scale-up at once.

The key's start-up is measured from its windows (:mod:`controllers.startup`; ``startup_hint_s``
until the first sample) and sizes the feedforward's horizon and margin, the forecast look-ahead
and the stabilisation window.

:func:`decide` is pure: it returns a new state (the forecaster and the drift detectors are
copied before they learn) and never changes the state, the zone view or the window it is
given.  The caller (:class:`loop.scaler_driver.Scaler`) keeps one state per key, computes
the budget cap across keys, holds a restored key and turns decisions into commands.

>>> from core.settings import ModelSpec, Settings
>>> s = Settings(models=(ModelSpec("m", max_replicas=8),), zones=("az-a",))
>>> p = params_for(s, "m")
>>> p.pid.max_replicas, p.feedforward is None, p.horizon_steps
(8, True, 4)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

from controllers import capacity_learn as cap
from controllers import feedforward as ff
from controllers import fpid
from controllers import observer as obs
from controllers import startup as su
from controllers import zone_capacity as zc
from controllers.drift import DriftDetector
from controllers.errors import ParameterError, check_int, check_number
from controllers.fixable import (
    BACKLOG_WINDOWS,
    fixable_violation_rate,
    running_unfixable,
    slow_stage_held,
    stale_after_drain,
)
from controllers.forecast import LoadForecaster
from controllers.pid import PidMeasurement, PidOutput, PidParams, PidState, step
from controllers.sde_fit import OnlineOuFit
from controllers.window_record import WindowRecord
from core.defaults import EPS_REF, TTFT_SLO_MS, WINDOW_S
from core.settings import Settings
from core.vocab import DEFAULT_DWELL_DELAYS, dwell_in_windows

__all__ = [
    "CAPACITY_PARAMS",
    "FF_MODE_QUIET_S",
    "FF_TUNABLES",
    "SCALER_FORECAST_WARMUP",
    "ScalingDecision",
    "ScalingParams",
    "ScalingState",
    "Stabilised",
    "controller_problem",
    "dwell_windows",
    "decide",
    "ff_params_for",
    "horizon_steps",
    "observer_inputs",
    "params_for",
    "pid_params_for",
    "stabilise_scale_down",
    "zone_params_for",
]

FF_TUNABLES = ("target_util", "error_margin", "decay_per_step", "lift_z")
MAX_RAW_TARGETS = 720  # raw targets kept for the stabilisation window (two hours of 10 s windows)
MAX_SINCE_UP = 1_000_000  # windows since the last scale-up saturate here (the state stays bounded)
MAX_HORIZON_STEPS = 360  # the forecast look-ahead at most (an hour of 10 s windows)
CAPACITY_PARAMS = cap.CapacityParams()  # the learned capacity's (controllers.capacity_learn)
FF_MODE_QUIET_S = 60.0  # quiet time before the feedforward mode goes off (it goes on at once)
# The scaler's forecaster (Holt, beta 0.1) warms up over its trend's memory: docs/model.md §7.
SCALER_FORECAST_WARMUP = LoadForecaster("holtwinters", 1).warmup_steps


@dataclass(frozen=True)
class ScalingParams:
    """Everything the law of one model needs, built once (:func:`params_for`)."""

    pid: PidParams | fpid.FpidParams
    zones: zc.ZoneCapacityParams
    feedforward: ff.FeedforwardParams | None = None
    eps_ref: float = EPS_REF
    window_s: float = WINDOW_S  # a window that does not say its length
    horizon_steps: int = 1  # forecast look-ahead: start-up plus a period, in windows
    startup_hint_s: float = 60.0  # loop delay until one is measured (observer)
    ttft_slo_ms: float = TTFT_SLO_MS  # a window that does not carry its SLO
    itl_slo_ms: float | None = None
    replica_capacity_rps: float | None = None  # the profile's, for the observer's steady state
    observer: bool = False
    learn_capacity: bool = False
    drift: bool = True
    scale_down_dwell_windows: int = 0  # windows after a scale-up before a scale-down (stabilise_scale_down)
    # > 0: the dwell instead, in loop delays (the measured start-up + a window; -1 in the settings' dwell)
    dwell_loop_delays: float = 0.0
    scale_down_stabilization_s: float = 0.0  # HPA's window; at least twice the measured start-up

    def __post_init__(self) -> None:
        check_number("eps_ref", self.eps_ref, 0.0, strict=True)
        check_number("window_s", self.window_s, 0.0, strict=True)
        check_int("horizon_steps", self.horizon_steps, 1)
        check_number("startup_hint_s", self.startup_hint_s, 0.0)
        check_int("scale_down_dwell_windows", self.scale_down_dwell_windows, 0)
        check_number("dwell_loop_delays", self.dwell_loop_delays, 0.0)
        check_number("scale_down_stabilization_s", self.scale_down_stabilization_s, 0.0)
        check_number("ttft_slo_ms", self.ttft_slo_ms, 0.0, strict=True)

    @property
    def controller(self) -> str:
        return "fpid" if isinstance(self.pid, fpid.FpidParams) else "pid"

    def new_state(self) -> ScalingState:
        """A key's first state: its controller's, a forecaster over the horizon, drift detectors."""
        return ScalingState(
            ctrl=fpid.FpidState() if isinstance(self.pid, fpid.FpidParams) else PidState(),
            forecaster=LoadForecaster("holtwinters", self.horizon_steps),
            latency_drift=DriftDetector("adwin", signal="ttft_p95_ms") if self.drift else None,
            rate_drift=DriftDetector("page_hinkley", signal="arrival_rps") if self.drift else None,
        )


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
class ScalingState:
    """What the law learns about one (model, zone); plain data through :meth:`to_state`."""

    ctrl: PidState | fpid.FpidState = field(default_factory=PidState)
    ff: ff.FeedforwardState = field(default_factory=ff.FeedforwardState)
    forecaster: LoadForecaster | None = None
    latency_drift: DriftDetector | None = None
    rate_drift: DriftDetector | None = None
    ff_mode: bool = False
    ff_quiet: int = 0  # consecutive windows with neither a burst nor a lift (the mode's hysteresis)
    unfixable_base: float | None = None  # running unfixable share of the key's requests (fixable_violation_rate)
    unfixable_n: int = 0
    queued: float | None = None
    in_system: float | None = None  # waiting + running (None: the window reported no running count)
    backlog: tuple[float, ...] = ()  # waiting per ready replica, the last BACKLOG_WINDOWS windows
    sde: OnlineOuFit = field(default_factory=OnlineOuFit)  # OU fit of the window TTFT P50
    capacity: cap.CapacityState = field(default_factory=cap.CapacityState)  # learned replica capacity
    kalman: obs.KalmanState | None = None
    delay: obs.LoopDelay = field(default_factory=obs.LoopDelay)
    # commands on their way: [basis_s, issued_s, target, applied_s | None]
    inflight: list[list[Any]] = field(default_factory=list)
    startup: su.StartupState = field(default_factory=su.StartupState)  # measured start-up (controllers.startup)
    since_up: int | None = None  # windows since the last scale-up decision (None: none yet)
    raw_targets: tuple[tuple[float, int], ...] = ()  # (window end s, the law's target before the stabilisation)
    hold: str = ""  # the condition that held the last window's scale-down ('' none)

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
            "queued": self.queued,
            "in_system": self.in_system,
            "backlog": list(self.backlog),
            "sde": self.sde.to_state(),
            "capacity": self.capacity.to_dict(),
            "kalman": None if self.kalman is None else self.kalman.to_dict(),
            "delay": asdict(self.delay),
            "inflight": [list(c) for c in self.inflight],
            "startup": self.startup.to_dict(),
            "since_up": self.since_up,
            "raw_targets": [list(r) for r in self.raw_targets],
            "hold": self.hold,
        }

    @classmethod
    def fields_from_state(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor's arguments from :meth:`to_state`'s data; ``KeyError``, ``TypeError`` or
        ``ValueError`` on a malformed one."""
        ctrl_data = dict(data["ctrl"])
        kind = ctrl_data.pop("kind")
        ctrl: PidState | fpid.FpidState = (
            fpid.FpidState.from_dict(ctrl_data) if kind == "fpid" else PidState.from_dict(ctrl_data)
        )
        return {
            "ctrl": ctrl,
            "ff": ff.FeedforwardState.from_dict(dict(data["ff"])),
            "forecaster": None if data["forecaster"] is None else LoadForecaster.from_state(data["forecaster"]),
            "latency_drift": None if data["latency_drift"] is None else DriftDetector.from_state(data["latency_drift"]),
            "rate_drift": None if data["rate_drift"] is None else DriftDetector.from_state(data["rate_drift"]),
            "ff_mode": bool(data["ff_mode"]),
            "ff_quiet": int(data.get("ff_quiet", 0)),
            "unfixable_base": _rate_or_none(data.get("unfixable_base")),
            "unfixable_n": int(data.get("unfixable_n", 0)),
            "queued": None if data["queued"] is None else float(data["queued"]),
            "in_system": _non_negative_or_none(data.get("in_system")),
            "backlog": tuple(_non_negative_or_none(v) or 0.0 for v in data.get("backlog", ()))[-BACKLOG_WINDOWS:],
            "sde": OnlineOuFit.from_state(data["sde"]),
            "capacity": cap.CapacityState.from_dict(dict(data["capacity"]))
            if "capacity" in data
            else cap.CapacityState(),
            "kalman": None if data["kalman"] is None else obs.KalmanState.from_dict(dict(data["kalman"])),
            "delay": obs.LoopDelay(**data["delay"]),
            "inflight": [list(c) for c in data["inflight"]],
            "startup": su.StartupState.from_dict(dict(data.get("startup", {}))),
            "since_up": None if data.get("since_up") is None else int(data["since_up"]),
            "raw_targets": tuple((float(t), int(n)) for t, n in data.get("raw_targets", ()))[-MAX_RAW_TARGETS:],
            "hold": str(data.get("hold", "")),
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> ScalingState:
        """Inverse of :meth:`to_state`."""
        return cls(**cls.fields_from_state(data))


@dataclass(frozen=True)
class ScalingDecision:
    """One window's decision: the target (after the budget), what it came from, the events to publish."""

    target: int
    previous: int | None  # the target before this window (None: the key had none)
    reason: str
    out: PidOutput
    violation_rate: float  # the signal the feedback stepped on
    feedforward: ff.FeedforwardOutput | None
    zone_floor_rps: float
    events: tuple[dict[str, Any], ...] = ()
    held_by: str = ""  # the stabilisation condition that held (part of) a scale-down ('' none)
    startup_s: float | None = None  # the start-up the law sized with (measured, else the hint)


S = TypeVar("S", bound=ScalingState)


def _running(w: WindowRecord) -> float | None:
    """The requests in service in the window: ``running_mean`` times every node that reported.

    The mean is taken over all GPU samples, a starting replica's (running 0) among them, so the
    total is the mean times the nodes sampled, not times the ready replicas: scaled by
    ``replicas_ready`` it would read low while replicas start and jump when they turn ready (a
    surge that is only a change of count).  Windows without ``nodes`` fall back to ready.
    """
    return None if w.running_mean is None else w.running_mean * max(w.nodes or w.replicas_ready, 1)


def learned_capacity(p: ScalingParams, s: ScalingState) -> float | None:
    """The replica capacity (req/s) the feedforward sizes with now, or None without a profile."""
    if p.feedforward is None:
        return None
    base = p.feedforward.capacity_rps
    return cap.capacity(s.capacity, base) if p.learn_capacity else base


def decide(
    p: ScalingParams,
    state: S,
    zones: zc.ZoneCapacityState,
    w: WindowRecord,
    *,
    alive: frozenset[str] | None = None,
    budget_cap: int | None = None,
    hand_over: bool = False,
) -> tuple[S, zc.ZoneCapacityState, ScalingDecision]:
    """One zone window of one key through the law (module docstring); ``zones`` is the model's zone view,
    ``alive`` the zones whose executor answers (None: no view), ``budget_cap`` the most replicas the
    fleet budget leaves this key (None: no budget).  Returns the new state, zone view and decision.

    ``hand_over``: the caller gives ``state`` up and keeps only the returned one (the driver does), so
    the forecaster and the drift detectors (River models) learn in place instead of being copied first
    (copying them doubles the cost of a window); the decision is the same either way.
    """
    events: list[dict[str, Any]] = []
    s = copy.copy(state)  # its frozen parts are shared; what changes in place is copied (or handed over)
    s.inflight = [list(c) for c in state.inflight]
    if not hand_over:
        s.forecaster, s.latency_drift, s.rate_drift = copy.deepcopy((s.forecaster, s.latency_drift, s.rate_drift))
    basis, window_s = w.window_end_ms, w.window_s or p.window_s
    ready, starting, rate = w.replicas_ready, w.replicas_starting, w.rate_rps
    s.startup = su.observe(s.startup, basis / 1000.0, starting, ready, window_s)
    startup_s = su.estimate_s(s.startup, p.startup_hint_s)
    queued = (w.queue_len_mean or 0.0) * max(ready, 1)
    slo = w.ttft_slo_ms or p.ttft_slo_ms
    fixable = fixable_violation_rate(w, s.unfixable_base)
    if slow_stage_held(w, s.unfixable_base, p.eps_ref):
        events.append(_slow_stage_event(w, fixable))
    if w.count > 0:  # the running share is the prompts' (a slow stage is let off whole, never learned)
        prompts = w.unfixable_rate - w.stage_unfixable_rate
        s.unfixable_base, s.unfixable_n = running_unfixable(s.unfixable_base, s.unfixable_n, prompts)
    eps = ff.leading_violation_rate(w.count, fixable, queued, rate, slo)
    running = _running(w)
    in_system = None if running is None else queued + running
    arrival = ff.arrival_rps(rate, queued, s.queued, in_system, s.in_system, window_s)
    capacity = learned_capacity(p, s)
    if eps > p.eps_ref and p.feedforward is not None and capacity is not None:
        served = ready * capacity * p.feedforward.target_util
        if stale_after_drain(s.backlog, queued, ready, arrival, served):
            eps = p.eps_ref  # hold: the violations are the wake of a drained backlog
    s.backlog = (*s.backlog, queued / max(ready, 1))[-BACKLOG_WINDOWS:]
    zones, zone_events = zc.observe(p.zones, zones, w.zone, zc.ZoneWindow(basis, arrival, ready, starting), alive)
    events += [{"schema_version": 1, **ev.to_dict(), "model": w.model} for ev in zone_events]
    floor = zc.floor_rps(p.zones, zones, w.zone, basis)
    if p.observer:
        eps = _observe(p, s, w, window_s, queued, arrival, eps)
    meas = PidMeasurement(violation_rate=eps, replicas_current=ready + starting, replicas_pending=starting)
    s.queued, s.in_system = queued, in_system
    if w.ttft_p50_ms is not None:
        s.sde = s.sde.update(w.ttft_p50_ms, window_s)
    events += _drift(s, w, arrival)
    limits = p.pid.limits if isinstance(p.pid, fpid.FpidParams) else p.pid
    ff_out = _feedforward(p, s, w, window_s, queued, meas, limits, floor, events, startup_s)
    if s.forecaster is not None:
        s.forecaster.learn(arrival)
    previous, before = s.ctrl.last_target, s.ctrl
    s.ctrl, out = _feedback(p, before, meas, window_s)
    if (
        previous is not None
        and before.level is not None
        and before.level < previous
        and out.target_replicas <= previous
        and eps - limits.eps_ref > limits.deadband
    ):
        # A held scale-down leaves the level below the target in force; violations there mean that target is
        # short, so the loop turns up from it (bumpless) rather than climb back first: no delayed scale-up.
        # Only a step that then scales up takes the lifted level (a blip the fleet in force absorbs must not
        # raise the raw target back and restart the stabilisation window).
        ctrl_up, out_up = _feedback(p, replace(before, level=float(previous)), meas, window_s)
        if out_up.target_replicas > previous:
            s.ctrl, out = ctrl_up, out_up
    target, reason = out.target_replicas, out.reason
    if budget_cap is not None and target > budget_cap:
        reason, target = f"{reason}; budget: {target} clamped to {budget_cap}", budget_cap
        level = s.ctrl.level
        # Anti-windup: the integrator (the level) stays within what the budget allows.
        s.ctrl = replace(s.ctrl, last_target=target, level=None if level is None else min(level, float(target)))
    current = previous if previous is not None else ready + starting
    absorb = _absorb_min(p, s, ff_out, floor)
    st = stabilise_scale_down(
        current=current,
        raw=target,
        now_s=basis / 1000.0,
        window_s=max(p.scale_down_stabilization_s, 2.0 * startup_s),
        dwell_windows=dwell_windows(p, startup_s, window_s),
        since_up=s.since_up,
        # A key's first window: the fleet in force counts as the window's first raw target.
        raw_targets=s.raw_targets if previous is not None else ((basis / 1000.0, current),),
        absorb_min=absorb,
        budget_cap=budget_cap,
    )
    s.since_up, s.raw_targets = st.since_up, st.raw_targets
    if st.target != target:
        reason = (
            f"{'hold' if st.target == current else reason}; scale-down to {target} held at {st.target} by {st.held_by}"
        )
        level = s.ctrl.level
        # The level runs on below the held target (the stabilisation window releases it gradually, a turn
        # up restarts from the fleet), but never below the replicas that carry the demand (absorb).
        floor_level = None if level is None or absorb is None else max(level, float(min(absorb, st.target)))
        s.ctrl = replace(s.ctrl, last_target=st.target, level=level if floor_level is None else floor_level)
        target = st.target
    if st.held_by != s.hold:
        events.append(
            {
                "schema_version": 1,
                "kind": "scale_down_hold",
                "model": w.model,
                "zone": w.zone,
                "window_end_ms": basis,
                "condition": st.held_by or "released",
                "target_replicas": st.raw_target,
                "held_replicas": target,
                "startup_s": startup_s,
            }
        )
        s.hold = st.held_by
    decision = ScalingDecision(target, previous, reason, out, eps, ff_out, floor, tuple(events), st.held_by, startup_s)
    return s, zones, decision


def _feedback(
    p: ScalingParams, ctrl: PidState | fpid.FpidState, meas: PidMeasurement, window_s: float
) -> tuple[PidState | fpid.FpidState, PidOutput]:
    """One step of the key's feedback controller (pid or fpid, pure)."""
    if isinstance(p.pid, fpid.FpidParams):
        assert isinstance(ctrl, fpid.FpidState)
        return fpid.step(p.pid, ctrl, meas, window_s)
    assert isinstance(ctrl, PidState)
    return step(p.pid, ctrl, meas, window_s)


class Stabilised(NamedTuple):
    """What :func:`stabilise_scale_down` decided."""

    target: int  # the target to apply
    raw_target: int  # the law's target before the stabilisation
    held_by: str  # 'dwell', 'window' or 'absorb' when it held (part of) a scale-down, else ''
    since_up: int | None  # windows since the last scale-up, this one included (None: none yet)
    raw_targets: tuple[tuple[float, int], ...]  # the raw targets within the window, this one last


def stabilise_scale_down(
    *,
    current: int,
    raw: int,
    now_s: float,
    window_s: float,
    dwell_windows: int,
    since_up: int | None,
    raw_targets: tuple[tuple[float, int], ...],
    absorb_min: int | None,
    budget_cap: int | None = None,
) -> Stabilised:
    """Scale-down stabilisation of one key's window (pure): ``raw`` below ``current`` (the target in force)
    is applied only as far as three conditions allow, checked in this order.

    1. *Dwell*: at least ``dwell_windows`` windows since the key's last scale-up (the dwell time the
       certificate of the switched loop may rely on, ``GOVERNOR_SCALE_DOWN_DWELL_WINDOWS``).
    2. *Stabilisation window* (Kubernetes HPA's ``behavior.scaleDown.stabilizationWindowSeconds``: the
       HPA "gathers recommendations for the window and picks the largest one", KEP-853; the default window is
       300 s for scale-down and 0 for scale-up, ``autoscaling/v2`` ``HPAScalingRules``): the target is the
       highest raw target of the last ``window_s`` seconds, so a dip shorter than the window moves nothing
       and a long fall is followed ``window_s`` late, step by step, never in one drop.
    3. *Absorb* (Dynamo planner's fix for 2 <-> 1 oscillation, ai-dynamo/dynamo PR #9294: a scale-down N ->
       N-1 loads each survivor N / (N-1) times more, so it is refused when the survivors would pass the
       threshold): at least ``absorb_min`` replicas stay, the fewest that carry the demand at the
       feedforward's target utilisation (:func:`_absorb_min`; None, without a feedforward capacity: skipped).

    ``raw`` at or above ``current`` goes through at once (scale-up is never delayed) and a scale-up restarts
    the dwell; ``budget_cap`` wins over every hold (a budget that shrank is obeyed).

    The integrator (:func:`decide`): while a scale-down is held the level runs on below the held target, so
    the raw targets the window remembers are the controller's honest ones and a release follows them ``W``
    late, one window's raw target at a time, never in one drop; it is kept at or above the absorb count (it
    cannot wind below the replicas that carry the demand).  Pinning the level to the held target instead
    would release one step per ``W`` (a 40 -> 20 fall would take 20 windows of ``W``).  A violation at the
    held target that scales up restarts the feedback from that target (bumpless: no climb back first, no
    jump above it); one that does not (a blip the fleet absorbs) keeps the level, so it cannot restart the
    window.

    >>> kw = dict(now_s=100.0, window_s=60.0, dwell_windows=3, raw_targets=(), absorb_min=None)
    >>> stabilise_scale_down(current=8, raw=12, since_up=0, **kw)[:3]  # up: at once
    (12, 12, '')
    >>> stabilise_scale_down(current=8, raw=6, since_up=1, **kw)[:3]  # 2 windows after a scale-up
    (8, 6, 'dwell')
    >>> stabilise_scale_down(current=8, raw=6, since_up=5, **{**kw, "raw_targets": ((50.0, 8),)})[:3]
    (8, 6, 'window')
    >>> stabilise_scale_down(current=8, raw=6, since_up=5, **{**kw, "raw_targets": ((50.0, 7),)})[:3]
    (7, 6, 'window')
    >>> stabilise_scale_down(current=8, raw=6, since_up=None, **{**kw, "absorb_min": 8})[:3]
    (8, 6, 'absorb')
    """
    since = None if since_up is None else min(since_up + 1, MAX_SINCE_UP)
    history = (*((t, n) for t, n in raw_targets if t > now_s - window_s), (now_s, raw))[-MAX_RAW_TARGETS:]
    if raw >= current:
        return Stabilised(raw, raw, "", 0 if raw > current else since, history)
    target, held_by = raw, ""
    if since is not None and since < dwell_windows:
        target, held_by = current, "dwell"
    else:
        highest = max(n for _, n in history)
        if highest > target:
            target, held_by = min(highest, current), "window"
        if absorb_min is not None and absorb_min > target:
            target, held_by = min(absorb_min, current), "absorb"
    if budget_cap is not None and target > budget_cap:
        target = max(raw, budget_cap)
        held_by = held_by if target > raw else ""
    return Stabilised(target, raw, held_by, since, history)


def _absorb_min(p: ScalingParams, s: ScalingState, ff_out: ff.FeedforwardOutput | None, floor_rps: float) -> int | None:
    """The fewest replicas that carry the demand at the feedforward's target utilisation, with the
    learned capacity: the demand is the larger of the arrival rate and the forecast over the start-up
    horizon (and the zone floor).  None without a feedforward capacity (the absorb check is skipped)."""
    capacity = learned_capacity(p, s)
    if ff_out is None or capacity is None or p.feedforward is None:
        return None
    demand = max(ff_out.arrival_rps, ff_out.forecast_rps, floor_rps)
    return max(0, math.ceil(demand / (capacity * p.feedforward.target_util) - 1e-9))


def dwell_windows(p: ScalingParams, startup_s: float, window_s: float) -> int:
    """The dwell the law enforces now: ``scale_down_dwell_windows``, or ``dwell_loop_delays`` loop delays
    (the measured start-up plus a window) in whole windows when set: the dwell the certificate of the
    switched loop needs grows with the loop's delay (docs/model.md §22 (certified)).

    >>> from core.settings import ModelSpec, Settings
    >>> p = params_for(Settings(models=(ModelSpec("m"),), zones=("az-a",)), "m")
    >>> dwell_windows(p, 30.0, 10.0), dwell_windows(p, 120.0, 10.0)
    (12, 39)
    """
    if p.dwell_loop_delays <= 0.0:
        return p.scale_down_dwell_windows
    return dwell_in_windows(p.dwell_loop_delays, startup_s + window_s, window_s)


def horizon_steps(startup_s: float, window_s: float) -> int:
    """The forecast look-ahead in windows: start-up plus a period (at least 1, at most :data:`MAX_HORIZON_STEPS`).

    >>> horizon_steps(30.0, 10.0), horizon_steps(120.0, 10.0), horizon_steps(0.0, 10.0)
    (4, 13, 1)
    """
    return min(MAX_HORIZON_STEPS, max(1, math.ceil((startup_s + window_s) / window_s - 1e-9)))


def _observe(
    p: ScalingParams, s: ScalingState, w: WindowRecord, window_s: float, queued: float, arrival: float, eps: float
) -> float:
    """Delay compensation: measure the loop delay from the commands' life, filter the loop state with
    the Kalman observer and predict it over that delay (``s`` is the law's own copy)."""
    now_s, ready, starting = w.window_end_ms / 1000.0, w.replicas_ready, w.replicas_starting
    for cmd in list(s.inflight):
        b, issued, target, applied = cmd
        if applied is None and ready + starting == target:
            cmd[3] = applied = now_s  # the fleet shows the command (window resolution)
        if applied is not None and ready == target:
            s.delay = s.delay.observe(issued_at_s=issued, applied_at_s=applied, effective_at_s=now_s, basis_at_s=b)
            s.inflight.remove(cmd)
        elif now_s - b > 600.0:
            s.inflight.remove(cmd)  # never took effect (replaced, refused): stop waiting
    z = (w.gpu_util_mean or 0.0, queued / max(ready, 1), eps)
    kp = obs.KalmanParams()
    tau = s.delay.tau_s if s.delay.n else p.startup_hint_s
    steady, ahead = observer_inputs(p, s, arrival, ready, tau, window_s)
    s.kalman = obs.update(kp, s.kalman if s.kalman is not None else obs.KalmanState.initial(z), z, window_s, steady)
    # From the current best estimate: what the model cannot predict (no steady state) as measured.
    _u, q_pred, eps_pred = obs.predict_ahead(kp, s.kalman, tau, ahead, measured=z)
    # Where the loop will be when a command lands: the predicted queue's doomed share.
    fixable = fixable_violation_rate(w, s.unfixable_base)
    lead = ff.leading_violation_rate(
        w.count, fixable, max(0.0, q_pred) * max(ready, 1), w.rate_rps, w.ttft_slo_ms or p.ttft_slo_ms
    )
    return min(1.0, max(0.0, eps_pred, lead))


def _slow_stage_event(w: WindowRecord, fixable: float) -> dict[str, Any]:
    """The ``slow_stage`` event: the window's violations are the stages before a replica, not queueing."""
    return {
        "schema_version": 1,
        "kind": "slow_stage",
        "model": w.model,
        "zone": w.zone,
        "window_end_ms": w.window_end_ms,
        "reason": "violations explained by network/preprocess time, not queueing: no replicas added for them",
        "violation_rate": w.violation_rate,
        "stage_unfixable_rate": w.stage_unfixable_rate,
        "fixable_rate": fixable,
        "network_p95_ms": w.network_p95_ms,
        "preprocess_p95_ms": w.preprocess_p95_ms,
        "queue_ms_mean": w.queue_ms_mean,
    }


def observer_inputs(
    p: ScalingParams, s: ScalingState, arrival_rps: float, ready: int, tau_s: float, window_s: float
) -> tuple[obs.Steady, obs.Steady]:
    """The Kalman observer's known inputs (docs/model.md §9): the steady state its update relaxes to
    under the load measured now, and the one its prediction over the loop delay ``tau_s`` relaxes to
    under the load forecast for then (design source §5: the forecast is injected into the observer).

    Both size the fleet by the replica capacity the feedforward uses: the one learned online once
    learned (:func:`learned_capacity`), the profile until then.  The forecast is the scaler's
    forecaster's at ``tau_s`` ahead (at least one window), bounded as the feedforward bounds its own
    (``max_ahead`` x the demand seen now); a cold forecaster gives none, so the prediction relaxes to
    the load measured now.  ``(None, None)`` without a capacity or a ready replica: random walks.
    """
    capacity = learned_capacity(p, s) or p.replica_capacity_rps
    if not capacity or ready <= 0:
        return None, None
    u, q, _ = obs.load_steady_state(arrival_rps, capacity * ready)
    forecast = arrival_rps
    if s.forecaster is not None and s.forecaster.ready:
        steps = min(MAX_HORIZON_STEPS, max(1, math.ceil(tau_s / window_s - 1e-9)))
        forecast = max(0.0, s.forecaster.forecast(steps)[-1])
        if p.feedforward is not None:
            forecast = min(forecast, p.feedforward.max_ahead * arrival_rps)
    u_ahead, q_ahead, _ = obs.load_steady_state(forecast, capacity * ready)
    return (u, q, None), (u_ahead, q_ahead, None)


def _drift(s: ScalingState, w: WindowRecord, arrival: float) -> list[dict[str, Any]]:
    events = []
    for detector, value in ((s.latency_drift, w.ttft_p95_ms), (s.rate_drift, arrival)):
        if detector is None or value is None:
            continue
        event = detector.update(float(value))
        if event is None:
            continue
        detail = event.to_dict()
        events.append(
            {
                **detail,
                "schema_version": 1,
                "kind": "drift",
                "detector": detail["kind"],
                "model": w.model,
                "zone": w.zone,
                "window_end_ms": w.window_end_ms,
            }
        )
        if detector is s.rate_drift and s.forecaster is not None:
            s.forecaster.reset()  # the old regime's level and trend would mislead
    return events


def _feedforward(
    p: ScalingParams,
    s: ScalingState,
    w: WindowRecord,
    window_s: float,
    queued: float,
    meas: PidMeasurement,
    limits: PidParams,
    floor_rps: float,
    events: list[dict[str, Any]],
    startup_s: float,
) -> ff.FeedforwardOutput | None:
    """Size from demand (at least ``floor_rps``, the zone-aware floor) over the measured start-up
    (``startup_s``: the horizon, its forecast-error margin and the look-ahead); lift (or let decay)
    the feedback level before it steps."""
    ffp = p.feedforward
    if ffp is None:
        return None
    ffp = replace(ffp, horizon_s=startup_s + window_s)
    rate = w.rate_rps
    if p.learn_capacity:
        ready = meas.replicas_current - meas.replicas_pending
        window = cap.CapacityWindow(
            completions_rps=rate,
            ready=ready,
            queue_per_replica=queued / max(ready, 1),
            fixable_rate=meas.violation_rate,
            itl_p95_ms=w.itl_p95_ms,
            itl_slo_ms=w.itl_slo_ms or p.itl_slo_ms,
            starting=meas.replicas_pending,
        )
        ffp = _learned(p, s, w, ffp, window, events)
    forecast = error = None
    if s.forecaster is not None and s.forecaster.ready:
        forecast = max(0.0, s.forecaster.forecast(horizon_steps(startup_s, window_s))[-1])
        error = s.forecaster.errors_hmean.mae
    slack_s = None if w.ttft_p50_ms is None else max(0.0, ((w.ttft_slo_ms or p.ttft_slo_ms) - w.ttft_p50_ms) / 1000.0)
    s.ff, out = ff.step(
        ffp,
        s.ff,
        ff.FeedforwardMeasurement(
            rate_rps=rate,
            queued=queued,
            forecast_rps=forecast,
            forecast_error_rps=error,
            running=_running(w),
            slack_s=slack_s,
        ),
        window_s,
    )
    need = max(out.replicas, floor_rps / (ffp.capacity_rps * ffp.target_util))
    need = min(max(need, float(limits.min_replicas)), float(limits.max_replicas))
    last = s.ctrl.last_target
    level = s.ctrl.level if s.ctrl.level is not None else float(last if last is not None else meas.replicas_current)
    lift = ff.lifts(ffp, level, need, out.arrival_rps, window_s)  # beyond tolerance and counting noise
    if lift:
        # Bumpless: the integrator starts at the demand, at most max_ff_step x the level per window.
        s.ctrl = replace(s.ctrl, level=ff.capped_lift(ffp, level, need))
    elif meas.violation_rate <= limits.eps_ref and s.forecaster is not None and s.forecaster.ready:
        # Reclaim towards the requirement only once the forecast is warm: a cold
        # model's first windows understate a ramp the trace is about to show.
        s.ctrl = replace(s.ctrl, level=level - ffp.decay_per_step * (level - need))
    # Hysteresis: the mode goes on at the first burst or lift and off only after FF_MODE_QUIET_S
    # without either (on the default step run it toggled in 3 of 5 windows; now 1 in 18).
    active = out.burst or lift
    s.ff_quiet = 0 if active else s.ff_quiet + 1
    mode = active or (s.ff_mode and s.ff_quiet < math.ceil(FF_MODE_QUIET_S / window_s))
    if mode != s.ff_mode:
        events.append(
            {
                "schema_version": 1,
                "kind": "feedforward_mode",
                "model": w.model,
                "zone": w.zone,
                "on": mode,
                "forecast_rps": out.forecast_rps,
                "need_replicas": need,
            }
        )
        s.ff_mode = mode
    return out


def _learned(
    p: ScalingParams,
    s: ScalingState,
    w: WindowRecord,
    ffp: ff.FeedforwardParams,
    window: cap.CapacityWindow,
    events: list[dict[str, Any]],
) -> ff.FeedforwardParams:
    """The feedforward parameters with the replica capacity learned from this window (the profile as prior)."""
    s.capacity, change = cap.step(CAPACITY_PARAMS, s.capacity, window, ffp.capacity_rps, p.eps_ref)
    learned = cap.capacity(s.capacity, ffp.capacity_rps)
    if change is not None:
        events.append(
            {
                "schema_version": 1,
                "kind": "capacity_prior",
                "model": w.model,
                "zone": w.zone,
                "prior_off": change == "off",
                "prior_rps": ffp.capacity_rps,
                "learned_rps": learned,
            }
        )
    return replace(ffp, capacity_rps=learned)


# -- parameters from settings ----------------------------------------------------------------
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
    # An absent down gain is the up gain (None), whatever the dataclass default: old gains keep their meaning.
    down: dict[str, Any] = {name: g.get(name) for name in ("kp_down", "ki_down", "kd_down")}
    if settings.controller == "fpid":
        extra: dict[str, Any] = {k: g[k] for k in ("alpha", "eta", "gamma", "beta") if k in g}
        if "memory" in g:
            extra["memory"] = int(g["memory"])
        return fpid.FpidParams(
            kp=g.get("kp", 0.2),
            ki=g.get("ki", 0.05),
            kd=g.get("kd", 0.0),
            **down,
            deadband=g.get("deadband", 0.015),
            time_scale_s=settings.window_s,
            **extra,
            **common,
        )
    return PidParams(
        kp=g.get("kp", 0.0),
        ki=g.get("ki", 0.05),
        kd=g.get("kd", 0.0),
        **down,
        deadband=g.get("deadband", 0.015),
        **common,
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


def params_for(settings: Settings, model: str) -> ScalingParams:
    """The law's parameters of ``model`` (``KeyError`` when it is not configured)."""
    spec = settings.model(model)
    if spec is None:
        raise KeyError(f"no model {model!r} in settings")
    return ScalingParams(
        pid=pid_params_for(settings, model),
        zones=zone_params_for(settings, model),
        feedforward=ff_params_for(settings, model),
        eps_ref=settings.eps_ref,
        window_s=settings.window_s,
        horizon_steps=horizon_steps(settings.startup_hint_s, settings.window_s),
        startup_hint_s=settings.startup_hint_s,
        scale_down_dwell_windows=max(0, settings.scale_down_dwell_windows),
        dwell_loop_delays=DEFAULT_DWELL_DELAYS[settings.controller] if settings.scale_down_dwell_windows < 0 else 0.0,
        scale_down_stabilization_s=settings.scale_down_stabilization_s,
        ttft_slo_ms=spec.ttft_slo_ms,
        itl_slo_ms=spec.itl_slo_ms,
        replica_capacity_rps=spec.replica_capacity_rps,
        observer=settings.observer,
        learn_capacity=settings.learn_capacity,
        drift=settings.drift,
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
