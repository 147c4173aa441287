"""Missing telemetry means *hold*, never *idle*: which windows the controllers may act on.

A window of a (model, zone) is built from two streams -- request records (how
many requests finished, how many missed the SLO) and GPU samples (replicas,
running and queued requests).  When one of them stops, the window still
closes, and read naively it lies: no request records reads as "no
violations" (the PID scales the fleet down, to zero with ``min_replicas =
0``), no GPU samples reads as "no replicas" (zone-aware capacity calls the
zone lost and routes its traffic away while it is still serving).

:func:`classify` tells, for one zone window, whether the controllers may act
on it:

``ok``
    both streams agree (requests finished, or the GPUs show no work: idle).
``saturated``
    no request record while requests queue on the GPUs (``queue_len_mean >=
    saturated_queue`` per replica, default 0.5): nothing finished because the
    zone is overloaded and every request is long (measured on the Mooncake
    step: 20 s without a completion at 24-30 running and 1.5-2.2 queued per
    replica).  Acted on like ``ok``: the leading violation signal sees the
    queue and scales up; a broken request stream during real queueing errs
    towards capacity, never towards idle.
``no_requests``
    no request record while the GPU samples show work (``running`` > 0) but
    no queue: the request stream is missing, or requests run longer than a
    window.
``no_gpu``
    request records but no GPU sample: the replica counts are unknown.
``node_cap``
    the node cap dropped more than ``HOLD_DROPPED_RATE`` (10 %) of the window's
    records (:mod:`controllers.node_cap`): node ids beyond the cap, a flood of
    junk ids, say; what is left is no picture of the zone.

A window that is not ``ok`` is **held**: the scaler and the router do not
act on it, so the controllers' state (level, integrator, forecasts, zone
view) does not move.  A ``no_requests`` or ``node_cap`` window holds every driver; a
``no_gpu`` window still feeds the drivers that need only request data (the
circuit breaker, the agent weights).
The (model, zone) is **stale** after ``stale_windows`` held windows in a
row, or when no window has closed for ``stale_windows`` window lengths
(:func:`silent`); staleness is reported (a gauge, an event), the hold itself
starts with the first held window.

A zone is *lost* (zone-aware capacity) only when its telemetry is silent
**and** its executor's heartbeat is gone: one silent stream never moves
traffic (see :mod:`controllers.zone_capacity`).

Pure: no I/O, no clock.

>>> classify(count=120, running_mean=3.0, queue_len_mean=0.5)
'ok'
>>> classify(count=0, running_mean=0.0, queue_len_mean=0.0)  # idle: both streams agree
'ok'
>>> classify(count=0, running_mean=4.0, queue_len_mean=0.1)
'no_requests'
>>> classify(count=0, running_mean=28.0, queue_len_mean=2.0)  # overloaded, long requests: act
'saturated'
>>> classify(count=80, running_mean=None, queue_len_mean=None)
'no_gpu'
>>> s = StaleState()
>>> for _ in range(3):
...     s = step(StaleParams(), s, "no_requests")
>>> s.held_windows, s.stale
(3, True)
>>> step(StaleParams(), s, "ok")
StaleState(held_windows=0, stale=False, reason='')
>>> silent(StaleParams(stale_windows=3), last_end_ms=100_000, now_ms=140_001, window_ms=10_000, lateness_ms=2_000)
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controllers.errors import ParameterError
from controllers.node_cap import HOLD_DROPPED_RATE
from core.defaults import STALE_WINDOWS

__all__ = ["HOLD_KINDS", "SATURATED_QUEUE", "StaleParams", "StaleState", "classify", "silent", "step"]

HOLD_KINDS = ("no_requests", "no_gpu", "node_cap")
SATURATED_QUEUE = 0.5  # requests queued per replica: no completion then means overload, not missing data


@dataclass(frozen=True)
class StaleParams:
    """``stale_windows``: held (or missing) windows in a row before a (model, zone) is reported stale."""

    stale_windows: int = STALE_WINDOWS

    def __post_init__(self) -> None:
        if isinstance(self.stale_windows, bool) or not isinstance(self.stale_windows, int) or self.stale_windows < 1:
            raise ParameterError(f"stale_windows={self.stale_windows!r}: must be an int >= 1")


@dataclass(frozen=True)
class StaleState:
    held_windows: int = 0  # consecutive windows that were not "ok"
    stale: bool = False
    reason: str = ""  # the kind of the last held window ("no_requests", "no_gpu", "node_cap") or a silence


def classify(
    count: int,
    running_mean: float | None,
    queue_len_mean: float | None,
    replicas: int = 0,
    saturated_queue: float = SATURATED_QUEUE,
    node_cap_dropped_rate: float = 0.0,
) -> str:
    """``ok``, ``saturated``, ``no_requests``, ``no_gpu`` or ``node_cap`` for one zone window (see the
    module docstring).

    ``replicas`` (ready + starting) counts only from GPU samples, so replicas > 0 means
    samples were there even when the means are absent.

    >>> classify(count=96, running_mean=3.0, queue_len_mean=0.5, node_cap_dropped_rate=0.9)
    'node_cap'
    """
    if node_cap_dropped_rate > HOLD_DROPPED_RATE:
        return "node_cap"
    gpu_seen = running_mean is not None or queue_len_mean is not None or replicas > 0
    if count > 0:
        return "ok" if gpu_seen else "no_gpu"
    work = (running_mean or 0.0) + (queue_len_mean or 0.0)
    if not (gpu_seen and math.isfinite(work) and work > 0):
        return "ok"
    return "saturated" if (queue_len_mean or 0.0) >= saturated_queue else "no_requests"


def step(params: StaleParams, state: StaleState, kind: str) -> StaleState:
    """The state after one window of ``kind`` (from :func:`classify`)."""
    if kind not in HOLD_KINDS:
        return StaleState()
    held = state.held_windows + 1
    return StaleState(held_windows=held, stale=held >= params.stale_windows, reason=kind)


def silent(params: StaleParams, last_end_ms: int, now_ms: int, window_ms: int, lateness_ms: int) -> bool:
    """Whether no window has closed for ``stale_windows`` window lengths after the last one (plus lateness)."""
    return now_ms - last_end_ms > params.stale_windows * window_ms + lateness_ms
