"""The interface every baseline autoscaler implements, and the parts they share.

The benchmark harness builds one :class:`Autoscaler` per (zone, model), calls
:meth:`Autoscaler.decide` every ``period_s`` seconds of trace time with an
:class:`Observation` of that zone, and applies the returned replica count (or
keeps the current one on ``None``).  Baselines are pure: no clock, no I/O; all
memory lives in explicit attributes that pickle, so a run can be snapshotted.

:class:`BaselineBase` holds what every baseline receives from the harness (the
replica bounds, the TTFT/ITL SLOs and an optional per-replica capacity), validates
it, and clamps decisions into ``[min_replicas, max_replicas]``.

Examples
--------
>>> obs = Observation(t_s=0.0, zone="az-a", model="m", replicas_ready=2, replicas_starting=0,
...                   desired=2, ongoing_requests=10, queue_len=0, arrival_rate_rps=3.0,
...                   gpu_util=0.5, window=None)
>>> BaselineBase(min_replicas=1, max_replicas=4).clamp(9)
4
>>> try:
...     BaselineBase(min_replicas=3, max_replicas=2)
... except BaselineParameterError as exc:
...     print(exc.parameter)
max_replicas
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, runtime_checkable

from core.defaults import ITL_SLO_MS, MAX_REPLICAS, MIN_REPLICAS, TTFT_SLO_MS

__all__ = [
    "Autoscaler",
    "BaselineBase",
    "BaselineParameterError",
    "Harness",
    "Observation",
    "LittleTarget",
    "check",
]


class BaselineParameterError(ValueError):
    """A baseline parameter is out of its domain; ``parameter`` names it."""

    def __init__(self, parameter: str, value: object, why: str) -> None:
        self.parameter = parameter
        super().__init__(f"{parameter}={value!r}: {why}")


def check(ok: bool, parameter: str, value: object, why: str) -> None:
    """Raise :class:`BaselineParameterError` for ``parameter`` unless ``ok``."""
    if not ok:
        raise BaselineParameterError(parameter, value, why)


def positive(parameter: str, value: float) -> None:
    """``value`` must be a finite number > 0."""
    check(
        isinstance(value, int | float) and math.isfinite(value) and value > 0,
        parameter,
        value,
        "must be a finite number > 0",
    )


def non_negative(parameter: str, value: float) -> None:
    """``value`` must be a finite number >= 0."""
    check(
        isinstance(value, int | float) and math.isfinite(value) and value >= 0,
        parameter,
        value,
        "must be a finite number >= 0",
    )


@dataclass(frozen=True)
class Observation:
    """What the harness shows a baseline about one zone at ``t_s``."""

    t_s: float  # trace time now (seconds)
    zone: str
    model: str
    replicas_ready: int
    replicas_starting: int
    desired: int  # current desired replica count (last decision applied)
    ongoing_requests: int  # requests queued + running on this zone's replicas right now
    queue_len: int  # requests waiting (not yet in a running batch) in this zone
    arrival_rate_rps: float  # arrivals in this zone over the last second
    gpu_util: float  # mean busy fraction of ready replicas over the last second (0..1)
    window: Mapping[str, Any] | None  # latest closed window metrics of this zone (keys below) or None
    zone_queued: int = 0  # requests held at the zone with no ready replica to take them (not in ongoing_requests)
    # window keys (same dict the stream pipeline publishes): window_end_ms, window_s, count, rate_rps,
    # violation_rate, ttft_p50_ms, ttft_p95_ms, ttft_p99_ms, e2e_p50_ms, e2e_p95_ms, e2e_p99_ms,
    # itl_p95_ms, queue_len_mean, running_mean, gpu_util_mean, replicas_ready, replicas_starting
    # (quantiles may be None when the window had no requests)


@runtime_checkable
class Autoscaler(Protocol):
    """A baseline: ``decide`` is called every ``period_s`` seconds of trace time."""

    name: str
    period_s: float  # the harness calls decide() every period_s of trace time

    def decide(self, obs: Observation) -> int | None: ...  # new desired replicas, or None = unchanged


class Harness(TypedDict, total=False):
    """The harness's keywords, the same for every baseline: ``Peer(params, **harness)``.

    A peer's constructor takes its own parameters and passes these on untouched
    (``def __init__(self, params=None, **harness: Unpack[Harness])``); only
    :class:`BaselineBase` names them, with their defaults and checks.
    """

    min_replicas: int
    max_replicas: int
    slo_ttft_ms: float
    slo_itl_ms: float
    replica_capacity_rps: float | None


class BaselineBase:
    """Harness-supplied settings shared by all baselines (validated, picklable).

    Every peer declares only what differs (its parameters and state) and hands
    the :class:`Harness` keywords to this constructor.

    Parameters
    ----------
    min_replicas, max_replicas
        Bounds of every decision; ``0 <= min_replicas <= max_replicas``, ``max_replicas >= 1``.
    slo_ttft_ms, slo_itl_ms
        The service-level objectives of the run (time to first token, inter-token latency).
    replica_capacity_rps
        Sustainable request rate of one replica at the SLO (from profiling), if known.
    """

    name = "base"
    period_s = 1.0

    def __init__(
        self,
        *,
        min_replicas: int = MIN_REPLICAS,
        max_replicas: int = MAX_REPLICAS,
        slo_ttft_ms: float = TTFT_SLO_MS,
        slo_itl_ms: float = ITL_SLO_MS,
        replica_capacity_rps: float | None = None,
    ) -> None:
        check(
            isinstance(min_replicas, int) and min_replicas >= 0, "min_replicas", min_replicas, "must be an integer >= 0"
        )
        check(
            isinstance(max_replicas, int) and max_replicas >= max(1, min_replicas),
            "max_replicas",
            max_replicas,
            "must be an integer >= max(1, min_replicas)",
        )
        positive("slo_ttft_ms", slo_ttft_ms)
        positive("slo_itl_ms", slo_itl_ms)
        if replica_capacity_rps is not None:
            positive("replica_capacity_rps", replica_capacity_rps)
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.slo_ttft_ms = float(slo_ttft_ms)
        self.slo_itl_ms = float(slo_itl_ms)
        self.replica_capacity_rps = replica_capacity_rps

    def clamp(self, replicas: int) -> int:
        """Clamp ``replicas`` into ``[min_replicas, max_replicas]``."""
        return max(self.min_replicas, min(self.max_replicas, int(replicas)))

    def changed(self, obs: Observation, replicas: int) -> int | None:
        """Clamp ``replicas``; ``None`` when it equals the current desired count."""
        target = self.clamp(replicas)
        return None if target == obs.desired else target

    def __repr__(self) -> str:
        params = getattr(self, "params", None)
        return f"{type(self).__name__}({params!r}, min={self.min_replicas}, max={self.max_replicas})"


class LittleTarget:
    """Per-replica in-flight target by Little's law: ``capacity_rps x W``.

    ``W`` is the mean time a request spends in a replica (queued + served)
    when the replica carries at most its profiled capacity.  It is measured,
    as an operator's load test measures it, from the closed windows of the
    run: ``W = L / lambda`` with ``L = running_mean + queue_len_mean`` (mean
    in-flight requests per replica) and ``lambda = rate_rps / replicas_ready``
    (arrivals per replica), using only windows whose per-replica rate is at
    or under ``capacity_rps`` (an overloaded window measures queueing, not
    service, and would raise the target exactly when replicas are short).
    ``W`` is the running mean of those windows (bounded memory: an
    incremental mean over at most ``max_windows`` recent ones).  ``None``
    until the first such window: the baselines hold until then.

    >>> lt = LittleTarget(capacity_rps=2.0)
    >>> lt.value() is None
    True
    >>> lt.observe({"window_end_ms": 1, "count": 30, "rate_rps": 3.0, "replicas_ready": 2,
    ...             "running_mean": 9.0, "queue_len_mean": 0.0})
    >>> lt.value()  # W = 9 / 1.5 = 6 s -> 2 rps x 6 s = 12 in flight per replica
    12.0
    """

    def __init__(self, capacity_rps: float, max_windows: int = 60) -> None:
        positive("capacity_rps", capacity_rps)
        self.capacity_rps = float(capacity_rps)
        self.max_windows = max_windows
        self.w_s: float | None = None
        self.n = 0
        self.last_end: float | None = None

    def observe(self, window: Mapping[str, Any] | None) -> None:
        """Absorb one closed window (each window counts once)."""
        if window is None:
            return
        end = window.get("window_end_ms")
        if end is None or (self.last_end is not None and float(end) <= self.last_end):
            return
        self.last_end = float(end)
        ready = window.get("replicas_ready") or 0
        rate, run, queue = window.get("rate_rps"), window.get("running_mean"), window.get("queue_len_mean")
        if not ready or rate is None or run is None or queue is None:
            return
        lam = float(rate) / float(ready)
        occupancy = float(run) + float(queue)
        if not (math.isfinite(lam) and math.isfinite(occupancy)) or lam <= 0 or occupancy <= 0:
            return
        if lam > self.capacity_rps:
            return  # overloaded: W would measure the queue
        w = occupancy / lam
        self.n = min(self.n + 1, self.max_windows)
        self.w_s = w if self.w_s is None else self.w_s + (w - self.w_s) / self.n

    def value(self) -> float | None:
        """``capacity_rps x W`` (requests in flight per replica at capacity), or None before any window."""
        return None if self.w_s is None else self.capacity_rps * self.w_s
