"""One replica's capacity, learned online from the fleet's own windows, the profile as the prior.

The feedforward sizes the fleet by ``demand / (capacity x target_util)``.  A
profiled capacity that is wrong by a factor costs that factor: too high and
the fleet saturates before the feedback catches up, too low and it idles
(docs/model.md §23).  This estimator keeps the capacity's logarithm, starting at the prior's, and
moves it only by evidence a window gives about what a replica *did*:

- **The latency curve** (both ways).  A decoding replica's inter-token
  latency grows with its batch, and its batch with the load it carries
  (Little's law), so the ITL P95 of a window at ``x`` requests/s per ready
  replica follows ``itl(x) = a / (1 - x / x_sat)``: ``1 / itl`` is a straight
  line in ``x``, ``1/a - x / (a x_sat)``.  Healthy windows (no wait, no
  replica starting) add their ``(x, 1 / itl)`` to an exponentially weighted
  least-squares fit (``forget`` per window).  Where the line reaches
  ``1 / (itl_margin x SLO)`` is the fit's capacity; it is averaged with the
  prior in log space, the prior weighing ``prior_weight`` windows and the fit
  its windows' weight scaled by how much the load varied (its coefficient of
  variation over ``spread``, at most 1): a fleet that ran at one load only
  cannot tell a slope from noise and keeps the prior.  A fit that does not
  fall with load, or does not explain the points (correlation above
  ``-min_corr``: replicas slowed by something other than load, as in a
  latency spike, put slow windows at low load), says nothing.
- **Saturation** (an upper bound).  Two windows running, with no replica
  starting, the fixable violation rate is above ``2 x eps_ref`` and requests
  wait (at least ``min_queue`` per ready replica): the ready replicas could
  not serve the load in time, so what they completed per replica, ``s`` (the
  larger of the two: completions lag a sudden load by a request's
  duration), bounds the capacity from above.  The
  bound moves ``down_gain`` of the way to ``s`` (in log space) and then
  rises by ``bound_forget`` a window: a few bad windows correct an
  optimistic profile, whatever limits the replica (prefill-bound TTFT
  included, which the ITL curve does not model).

The capacity is the lower of the two (the curve's, or the prior's without
one), within ``max_factor`` of the prior either way.  The
prior is *off* when the estimate leaves ``[prior / off_ratio, prior x
off_ratio]`` and fine again inside ``ok_ratio`` (hysteresis); :func:`step`
returns the change so the caller can publish it.

>>> p = CapacityParams()
>>> s, changes = CapacityState(), []
>>> bad = CapacityWindow(completions_rps=6.0, ready=5, queue_per_replica=4.0, fixable_rate=0.3)
>>> for _ in range(4):  # 5 replicas fail at 1.2 req/s each: the profile's 3 is off
...     s, change = step(p, s, bad, prior_rps=3.0, eps_ref=0.02)
...     changes.append(change)
>>> round(capacity(s, 3.0), 2), s.off, changes
(1.35, True, [None, 'off', None, None])
>>> s = CapacityState()
>>> for x, itl in ((0.5, 30.0), (4.0, 60.0), (6.0, 80.0), (5.0, 70.0)) * 10:  # ITL P95 against load
...     w = CapacityWindow(completions_rps=5 * x, ready=5, queue_per_replica=0.0, fixable_rate=0.0,
...                        itl_p95_ms=itl, itl_slo_ms=150.0)
...     s, change = step(p, s, w, prior_rps=3.0, eps_ref=0.02)
>>> round(capacity(s, 3.0), 1), s.off  # where the fit meets 0.8 x 150 ms, the prior weighing 6 of 40
(5.8, True)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from controllers.errors import ParameterError, check_number

__all__ = ["CapacityParams", "CapacityState", "CapacityWindow", "capacity", "step"]


@dataclass(frozen=True)
class CapacityParams:
    down_gain: float = 0.5  # share of the log gap to a saturated window's rate the bound closes
    bound_forget: float = 0.005  # the saturation bound rises by this share a window
    min_queue: float = 1.0  # waiting requests per ready replica that make a bad window a saturated one
    healthy_queue: float = 0.5  # at most this many waiting per replica in a window of the curve
    itl_margin: float = 0.8  # the capacity is the load at which the ITL P95 reaches this share of the SLO
    forget: float = 0.98  # weight of the curve fit's past per window (memory ~50 windows)
    prior_weight: float = 6.0  # the prior weighs as this many windows of the fit
    spread: float = 0.25  # the load's coefficient of variation at which a window counts fully
    min_corr: float = 0.7  # the fit counts only while 1/ITL and load correlate at -0.7 or below
    max_factor: float = 4.0  # the estimate within [prior / max_factor, prior x max_factor]
    off_ratio: float = 1.5  # the prior is off beyond this factor ...
    ok_ratio: float = 1.25  # ... and fine again within this one

    def __post_init__(self) -> None:
        for name in ("down_gain", "itl_margin", "forget", "min_corr"):
            v = check_number(name, getattr(self, name), 0.0, strict=True)
            if v > 1.0:
                raise ParameterError(f"{name}={v}: must lie in (0, 1]")
        for name in ("bound_forget", "min_queue", "healthy_queue"):
            check_number(name, getattr(self, name), 0.0)
        check_number("prior_weight", self.prior_weight, 0.0, strict=True)
        check_number("spread", self.spread, 0.0, strict=True)
        if not 1.0 < self.ok_ratio <= self.off_ratio <= self.max_factor:
            raise ParameterError("need 1 < ok_ratio <= off_ratio <= max_factor")


_SUMS = ("w", "x", "y", "xx", "xy", "yy")
# A curve point's inputs are taken only inside realistic ranges, so that every sum stays finite:
# an ITL below a microsecond (1e-241 ms made 1/itl squared infinite) or above a day, or a load past
# a million requests/s per replica, is no measurement of a decoding replica.
MIN_ITL_MS = 1e-3
MAX_ITL_MS = 86_400_000.0
MAX_LOAD_RPS = 1e6


@dataclass(frozen=True)
class CapacityState:
    log_k: float = 0.0  # log of the estimate over the prior
    log_bound: float | None = None  # log of the saturation bound over the prior (None: never saturated)
    sums: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # weighted w, x, y, xx, xy, yy
    saturated: int = 0  # windows that moved it: saturated ones, curve ones (evidence counts)
    curve: int = 0
    off: bool = False
    last_saturated_rps: float | None = None  # the previous window's per-replica completions, if it was saturated

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["sums"] = dict(zip(_SUMS, self.sums, strict=True))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityState:
        """Inverse of :meth:`to_dict`; a non-finite number is refused (``ValueError``)."""
        log_k = float(data["log_k"])
        bound = None if data["log_bound"] is None else float(data["log_bound"])
        sums = tuple(float(data["sums"].get(k, 0.0)) for k in _SUMS)
        if not all(math.isfinite(v) for v in (log_k, *sums, 0.0 if bound is None else bound)):
            raise ValueError(f"capacity state {data!r}: numbers must be finite")
        last = data.get("last_saturated_rps")
        last = None if last is None else float(last)
        if last is not None and not (math.isfinite(last) and last >= 0):
            raise ValueError(f"last_saturated_rps={last!r}: must be finite and >= 0")
        return cls(log_k, bound, sums, int(data["saturated"]), int(data["curve"]), bool(data["off"]), last)


@dataclass(frozen=True)
class CapacityWindow:
    """What one zone window says about its ready replicas."""

    completions_rps: float  # requests completed per second in the window
    ready: int
    queue_per_replica: float  # mean waiting requests per ready replica
    fixable_rate: float  # violation rate of the requests capacity could have served in time
    itl_p95_ms: float | None = None  # the window's inter-token latency P95 (None: not measured)
    itl_slo_ms: float | None = None
    starting: int = 0


def capacity(state: CapacityState, prior_rps: float) -> float:
    """The learned capacity: the curve's (or the prior), at most the saturation bound."""
    log_k = state.log_k if state.log_bound is None else min(state.log_k, state.log_bound)
    return prior_rps * math.exp(log_k)


def _curve_capacity(
    sums: tuple[float, ...], y_target: float, spread: float, min_corr: float
) -> tuple[float, float] | None:
    """Where the weighted least-squares line of ``1 / itl`` on load reaches ``y_target``, and the
    fit's weight (its windows, scaled by the load's spread); None when the line does not fall
    with load or does not explain the points (correlation above ``-min_corr``)."""
    w, x, y, xx, xy, yy = sums
    if w <= 0.0:
        return None
    mean, mean_y = x / w, y / w
    var, var_y = max(0.0, xx / w - mean * mean), max(0.0, yy / w - mean_y * mean_y)
    if mean <= 0.0 or var <= 0.0 or var_y <= 0.0:
        return None
    cov = xy / w - mean * mean_y
    if cov / math.sqrt(var * var_y) > -min_corr:
        return None
    slope = cov / var
    cap = mean + (y_target - y / w) / slope
    if not (math.isfinite(cap) and cap > 0.0):
        return None
    return cap, w * min(1.0, var / (mean * mean) / (spread * spread))


def step(
    params: CapacityParams, state: CapacityState, w: CapacityWindow, prior_rps: float, eps_ref: float
) -> tuple[CapacityState, str | None]:
    """Fold one window in; returns the new state and ``"off"`` / ``"ok"`` when the prior's verdict changed."""
    check_number("prior_rps", prior_rps, 0.0, strict=True)
    if w.ready <= 0 or not all(math.isfinite(v) for v in (w.completions_rps, w.queue_per_replica, w.fixable_rate)):
        return state, None
    per_replica = max(w.completions_rps, 0.0) / w.ready
    saturated = w.fixable_rate > 2.0 * eps_ref and w.queue_per_replica >= params.min_queue
    itl, slo = w.itl_p95_ms, w.itl_slo_ms
    log_bound = state.log_bound
    if log_bound is not None:
        log_bound += math.log1p(params.bound_forget)
    previous = state.last_saturated_rps
    state = replace(state, last_saturated_rps=per_replica if saturated and w.starting == 0 else None)
    if saturated and w.starting == 0 and previous is not None and max(previous, per_replica) > 0.0:
        target = math.log(max(previous, per_replica)) - math.log(prior_rps)  # (a quotient may underflow to 0)
        now = min(state.log_k, log_bound if log_bound is not None else math.inf)
        if target < now:
            log_bound = now + params.down_gain * (target - now)
            state = replace(state, saturated=state.saturated + 1)
    sums = state.sums
    if (
        not saturated
        and itl is not None
        and MIN_ITL_MS <= itl <= MAX_ITL_MS  # (NaN fails both)
        and slo is not None
        and 0.0 < per_replica <= MAX_LOAD_RPS
        and w.starting == 0
        and w.queue_per_replica <= params.healthy_queue
    ):
        f = params.forget
        sw, sx, sy, sxx, sxy, syy = (f * v for v in sums)
        y, x = 1.0 / itl, per_replica
        sums = (sw + 1.0, sx + x, sy + y, sxx + x * x, sxy + x * y, syy + y * y)
        state = replace(state, curve=state.curve + 1)
    log_k = state.log_k
    if slo is not None and MIN_ITL_MS <= slo <= MAX_ITL_MS and sums[0] > 0:
        fit = _curve_capacity(sums, 1.0 / (params.itl_margin * slo), params.spread, params.min_corr)
        if fit is not None:
            cap_fit, weight = fit
            log_k = weight * (math.log(cap_fit) - math.log(prior_rps)) / (weight + params.prior_weight)
    limit = math.log(params.max_factor)
    log_k = min(max(log_k, -limit), limit)
    if log_bound is not None:
        log_bound = min(max(log_bound, -limit), limit)
    ratio = abs(min(log_k, log_bound) if log_bound is not None else log_k)
    off = state.off
    if not off and ratio > math.log(params.off_ratio):
        off = True
    elif off and ratio < math.log(params.ok_ratio):
        off = False
    change = None if off == state.off else ("off" if off else "ok")
    return replace(state, log_k=log_k, log_bound=log_bound, sums=sums, off=off), change
