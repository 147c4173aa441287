"""The router's latency model: SLA classes, target windows, predicted latency.

Pure functions of one target's window and one class's SLOs, used by
:mod:`controllers.routing` (which holds the router itself: the weights over
targets, the fallback state machine and ``step``).

**Prediction** (per target, from its window and the rate forecast,
:func:`predict_ms`)::

    drain_rps  = capacity_rps if known, else rate_rps   # a queued target completes at capacity
    excess_rps = forecast_rps - capacity_rps            # if both are known, else
               = (queue_len - previous queue_len) / dt_s   # the queue's own growth
    backlog    = max(0, queue_len + excess_rps * horizon_s)
    wait_ms    = 1000 * backlog / drain_rps             # FIFO drain time ahead of a new request
    ttft_pred  = ttft_p95_ms + wait_ms,   e2e_pred = e2e_p95_ms + wait_ms

A class ``c`` sees the *normalised* latency ``x = max(ttft_pred /
ttft_slo, e2e_pred / e2e_slo)`` (the e2e term only where both exist,
:func:`normalised`), so ``x > 1`` means the class's SLO is predicted to be
missed.

**Min-latency split** (:func:`min_latency_split`): the load of a variant
spread over its targets so that its mean latency is least, each target an
M/M/1-like server with its capacity and its predicted TTFT.  The latency it
uses is held (:func:`held_latency_ms`): a rise counts at once, a fall only as
far as the window's completions support it, so a slowed target that got a
few probe requests is not flooded again on the evidence of two fast ones.

The functions read two of the router's parameters (:class:`LatencyParams`:
``horizon_s`` and ``release_requests``), which
:class:`controllers.routing.RoutingParams` carries.

Examples
--------
>>> from controllers.routing import RoutingParams
>>> ttft, e2e = predict_ms(RoutingParams(primary="m"), TargetObs(450.0), None, 10.0)
>>> normalised(TRADING, ttft, e2e)     # 450 ms against trading's 300 ms SLO
1.5
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from controllers.errors import ParameterError, check_number

__all__ = [
    "BATCH",
    "DEFAULT_CLASSES",
    "TRADING",
    "VOICE",
    "BreakerName",
    "LatencyParams",
    "RequestClass",
    "TargetObs",
    "configured_classes",
    "held_latency_ms",
    "min_latency_split",
    "normalised",
    "predict_ms",
]

BreakerName = Literal["closed", "open", "half_open"]
_X_CAP = 1e6  # normalised-latency cap (a stuck queue), keeps the softmax finite


class LatencyParams(Protocol):
    """The router parameters the model reads (:class:`controllers.routing.RoutingParams`)."""

    @property
    def horizon_s(self) -> float:
        """Prediction horizon, seconds."""
        ...

    @property
    def release_requests(self) -> float:
        """Completions that weigh as much as the held latency."""
        ...


@dataclass(frozen=True)
class RequestClass:
    """An SLA tier: its SLOs, priority (0 = most urgent) and whether it may degrade."""

    name: str
    ttft_slo_ms: float
    e2e_slo_ms: float | None = None
    priority: int = 0
    degradable: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ParameterError(f"name={self.name!r}: must be a non-empty string")
        check_number("ttft_slo_ms", self.ttft_slo_ms, 0.0, strict=True)
        if self.e2e_slo_ms is not None:
            check_number("e2e_slo_ms", self.e2e_slo_ms, 0.0, strict=True)
        if not isinstance(self.degradable, bool):
            raise ParameterError(f"degradable={self.degradable!r}: must be a bool")


TRADING = RequestClass("trading", ttft_slo_ms=300.0, priority=0, degradable=True)
"""docs/model.md §12 (routing): a trading agent's 300 ms SLA; a smaller model on time beats a late one."""
VOICE = RequestClass("voice", ttft_slo_ms=800.0, priority=1, degradable=True)
"""Conversational voice: the first token within ~800 ms keeps the turn natural."""
BATCH = RequestClass("batch", ttft_slo_ms=10_000.0, e2e_slo_ms=120_000.0, priority=2, degradable=False)
"""Offline work: loose SLOs, never degraded to the smaller model."""
DEFAULT_CLASSES = (TRADING, VOICE, BATCH)
"""The classes' defaults: a model's configured class SLOs (``ModelSpec.classes``) replace them."""


def configured_classes(
    ttft_slo_ms: Mapping[str, float | None], defaults: Sequence[RequestClass] = DEFAULT_CLASSES
) -> tuple[RequestClass, ...]:
    """The router's classes with a model's configured TTFT SLOs (class -> ms, None = not configured).

    A class the model does not configure keeps its default (:data:`DEFAULT_CLASSES`).

    >>> [c.ttft_slo_ms for c in configured_classes({"trading": 150.0, "voice": None})]
    [150.0, 800.0, 10000.0]
    """
    out = []
    for c in defaults:
        slo = ttft_slo_ms.get(c.name)
        out.append(c if slo is None else replace(c, ttft_slo_ms=slo))
    return tuple(out)


@dataclass(frozen=True)
class TargetObs:
    """A target's window: latency percentiles, queue, rates and breaker state."""

    ttft_p95_ms: float | None
    e2e_p95_ms: float | None = None
    queue_len: float = 0.0
    rate_rps: float = 0.0  # completions in the window
    capacity_rps: float | None = None  # sustainable rate of the ready replicas
    forecast_rps: float | None = None  # arrival rate forecast at the horizon
    breaker: BreakerName = "closed"

    def __post_init__(self) -> None:
        for name in ("ttft_p95_ms", "e2e_p95_ms", "capacity_rps", "forecast_rps"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), 0.0)
        check_number("queue_len", self.queue_len, 0.0)
        check_number("rate_rps", self.rate_rps, 0.0)
        if self.breaker not in ("closed", "open", "half_open"):
            raise ParameterError(f"breaker={self.breaker!r}: must be closed, open or half_open")


def predict_ms(
    params: LatencyParams, obs: TargetObs, prev_queue: float | None, dt_s: float
) -> tuple[float | None, float | None]:
    """Predicted (ttft, e2e) in ms: windowed P95 plus the FIFO wait at the horizon.

    Examples
    --------
    >>> from controllers.routing import RoutingParams
    >>> p = RoutingParams(primary="m", horizon_s=10.0)
    >>> # 20 queued, forecast 12 rps against a capacity of 10: 20 + 2*10 = 40 waiting, 4 s
    >>> predict_ms(p, TargetObs(200.0, 900.0, queue_len=20, capacity_rps=10, forecast_rps=12),
    ...            None, 10.0)
    (4200.0, 4900.0)
    """
    drain = obs.capacity_rps if obs.capacity_rps is not None else obs.rate_rps
    if obs.forecast_rps is not None and obs.capacity_rps is not None:
        excess = obs.forecast_rps - obs.capacity_rps
    else:
        excess = 0.0 if prev_queue is None else (obs.queue_len - prev_queue) / dt_s
    backlog = max(0.0, obs.queue_len + excess * params.horizon_s)
    wait = 0.0 if backlog == 0.0 else (1000.0 * backlog / drain if drain > 0 else math.inf)
    ttft = None if obs.ttft_p95_ms is None else obs.ttft_p95_ms + wait
    e2e = None if obs.e2e_p95_ms is None else obs.e2e_p95_ms + wait
    return ttft, e2e


def normalised(c: RequestClass, ttft: float | None, e2e: float | None) -> float | None:
    """Predicted latency in units of the class's SLO (None without a TTFT).

    The larger of ``ttft / ttft_slo_ms`` and ``e2e / e2e_slo_ms`` (the latter
    where both exist), capped at 1e6 (a stuck queue) to keep the softmax finite.

    Examples
    --------
    >>> normalised(BATCH, 5_000.0, 90_000.0), normalised(TRADING, 150.0, 90_000.0)
    (0.75, 0.5)
    >>> normalised(TRADING, math.inf, None), normalised(TRADING, None, 100.0)
    (1000000.0, None)
    """
    if ttft is None:
        return None
    x = ttft / c.ttft_slo_ms
    if e2e is not None and c.e2e_slo_ms is not None:
        x = max(x, e2e / c.e2e_slo_ms)
    return min(x, _X_CAP)


def held_latency_ms(params: LatencyParams, held_ms: float | None, latency_ms: float, completions: float) -> float:
    """The latency the split uses: a rise at once, a fall weighed by its evidence.

    ``held + (latency - held) * n / (n + release_requests)`` when the window's
    prediction is lower, with ``n`` its completions: the P95 of fewer than
    ``1 / (1 - 0.95) = 20`` requests is little more than their maximum, so a
    slowed target is trusted again only as completions show it.

    Examples
    --------
    >>> from controllers.routing import RoutingParams
    >>> p = RoutingParams(primary="m")
    >>> held_latency_ms(p, 1200.0, 1500.0, 2.0)     # slower: at once
    1500.0
    >>> held_latency_ms(p, 1200.0, 300.0, 20.0)     # 20 completions: half way
    750.0
    >>> held_latency_ms(p, 1200.0, 300.0, 0.0)      # none: unchanged
    1200.0
    """
    if held_ms is None or latency_ms >= held_ms:
        return latency_ms
    n = completions
    return held_ms + (latency_ms - held_ms) * (
        n / (n + params.release_requests) if n + params.release_requests > 0 else 1.0
    )


def min_latency_split(latency_ms: Sequence[float], capacity_rps: Sequence[float], load_rps: float) -> list[float]:
    """Rates that minimise the mean latency of ``load_rps`` over parallel servers.

    Each target is modelled by an M/M/1-like latency curve ``s / (1 - l /
    mu)`` at rate ``l`` (``s``: its latency, ``mu``: its capacity, both > 0).
    Minimising ``sum_i l_i s_i / (1 - l_i / mu_i)`` subject to ``sum_i l_i =
    load`` (Lagrange; the square-root rule) gives::

        l_i = mu_i * max(0, 1 - u sqrt(s_i)),   u = (sum_A mu_i - load) / sum_A mu_i sqrt(s_i)

    over the active set ``A`` of the fastest targets, filled in order of
    latency while ``u sqrt(s_i) < 1``.  Equal latencies give the split by
    capacity; a target several times slower than the rest gets nothing while
    the rest have the headroom, and a share again as the load nears their
    capacity.  At or above the total capacity the split is by capacity.

    Examples
    --------
    >>> min_latency_split([100.0, 100.0], [30.0, 10.0], 20.0)    # by capacity
    [15.0, 5.0]
    >>> [round(v, 3) for v in min_latency_split([100.0, 400.0], [10.0, 10.0], 3.0)]  # slow: idle
    [3.0, 0.0]
    >>> # u = (20 - 6) / (10 * 10 + 10 * 20) = 0.0467: 10 (1 - 0.467), 10 (1 - 0.933)
    >>> [round(v, 3) for v in min_latency_split([100.0, 400.0], [10.0, 10.0], 6.0)]
    [5.333, 0.667]
    """
    n = len(latency_ms)
    if n == 0 or len(capacity_rps) != n:
        raise ParameterError(f"capacity_rps: needs one per latency ({n}), got {len(capacity_rps)}")
    for i in range(n):
        check_number("latency_ms", latency_ms[i], 0.0, strict=True)
        check_number("capacity_rps", capacity_rps[i], 0.0, strict=True)
    check_number("load_rps", load_rps, 0.0)
    total = sum(capacity_rps)
    if load_rps >= total:
        return [float(c) for c in capacity_rps]
    order = sorted(range(n), key=lambda i: latency_ms[i])
    mu_sum = root_sum = 0.0
    u = 0.0
    active = 0
    for k, i in enumerate(order):
        mu_sum += capacity_rps[i]
        root_sum += capacity_rps[i] * math.sqrt(latency_ms[i])
        u = (mu_sum - load_rps) / root_sum
        active = k + 1
        if k + 1 < n and u * math.sqrt(latency_ms[order[k + 1]]) >= 1.0:
            break
    out = [0.0] * n
    for i in order[:active]:
        out[i] = capacity_rps[i] * max(0.0, 1.0 - u * math.sqrt(latency_ms[i]))
    return out
