"""Latency-aware routing with fallback to a smaller variant, per SLA tier.

One router serves one model family: a ``primary`` variant (e.g.
``"llama2-70b"``) and an optional smaller ``fallback`` (``"llama2-13b"``),
each deployed in several zones.  A :class:`Target` is one (variant, zone).
Every window, each request class gets routing weights over the targets.
This module holds the router (parameters, state, weights, fallback and
:func:`step`); the latency model it steers by, the SLA classes and the
target windows are in :mod:`controllers.routing_model` (re-exported here).

**Prediction**: each target's TTFT and e2e latency at the horizon, its
windowed P95 plus the FIFO wait of its forecast backlog
(:func:`~controllers.routing_model.predict_ms`).  A class ``c`` sees the
*normalised* latency ``x = max(ttft_pred / ttft_slo, e2e_pred / e2e_slo)``
(:func:`~controllers.routing_model.normalised`), so ``x > 1`` means the
class's SLO is predicted to be missed.

**Weights** over the eligible targets of one variant (breaker not ``open``
and capacity not 0; open targets get 0)::

    w_i = m + (1 - n m) * prior_i exp(-x_i / T) / sum_j prior_j exp(-x_j / T)

a softmax of ``-x / T`` (``temperature`` T = 0.25) weighted by a prior, with
a floor ``m = min(min_share, 1/n)`` for each of the ``n`` eligible targets.
Because ``x`` is in units of the class's SLO, a tight class (trading) is
steered hard to the fastest target, while a loose one (batch) follows the
prior.  Half-open targets and targets without latency data get the floor
only (the breaker's probes, and a way back in).

The **prior** (``split``) is the variant's load spread so that its mean
latency is least (:func:`~controllers.routing_model.min_latency_split`,
``"min-latency"``, the default), the variant's load the sum of its targets'
completion rates and each target's latency its held prediction
(:func:`~controllers.routing_model.held_latency_ms`).  Without capacities or
load (``rate_rps`` 0) the prior is ``capacity_rps`` (1 if unknown), as with
``split="capacity"``.

**Fallback** (degradable classes, when a ``fallback`` variant exists): the
class's expected ``x`` on the primary (weighted by the primary weights) is
compared with 1.  Over 1 for ``enter_windows`` consecutive windows, with a
fallback that is available and not predicted worse, the class moves to the
fallback variant; a primary with no eligible target moves it at once.  It
returns only after ``recover_windows`` consecutive windows with ``x < 1 -
hysteresis``; a window without primary data neither counts nor resets.
While in fallback the class keeps ``fallback_probe_share`` of its traffic on
the primary, so the recovery can be observed.  A class that cannot be
routed anywhere (e.g. not degradable and every primary target open) gets no
weights and is listed in ``unroutable``.

Examples
--------
>>> p = RoutingParams(primary="70b", fallback="13b", min_share=0.0)
>>> obs = {Target("70b", "a"): TargetObs(ttft_p95_ms=450.0),
...        Target("13b", "a"): TargetObs(ttft_p95_ms=120.0)}
>>> s, d = step(p, RoutingState(), obs, [TRADING], dt_s=10.0)
>>> sorted(d.fallback), d.weights["trading"][Target("13b", "a")]
(['trading'], 0.95)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, NamedTuple

from controllers.errors import ParameterError, check_number
from controllers.routing_model import (
    BATCH,
    DEFAULT_CLASSES,
    TRADING,
    VOICE,
    BreakerName,
    RequestClass,
    TargetObs,
    configured_classes,
    held_latency_ms,
    min_latency_split,
    normalised,
    predict_ms,
)

__all__ = [
    "BATCH",
    "DEFAULT_CLASSES",
    "TRADING",
    "VOICE",
    "BreakerName",
    "RequestClass",
    "RoutingDecision",
    "RoutingParams",
    "RoutingState",
    "Target",
    "TargetObs",
    "configured_classes",
    "held_latency_ms",
    "min_latency_split",
    "normalised",
    "predict_ms",
    "step",
]


class Target(NamedTuple):
    """One variant of the family in one zone; ``key`` is ``"variant|zone"``."""

    variant: str
    zone: str

    @property
    def key(self) -> str:
        return f"{self.variant}|{self.zone}"


@dataclass(frozen=True)
class RoutingParams:
    """Variants, softmax temperature, floors and fallback hysteresis (validated).

    Examples
    --------
    >>> RoutingParams(primary="70b", fallback="70b")
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: fallback='70b': must differ from primary
    """

    primary: str
    fallback: str | None = None
    temperature: float = 0.25  # in units of the class's SLO
    min_share: float = 0.02  # floor per eligible target
    hysteresis: float = 0.2  # return below SLO * (1 - hysteresis)
    recover_windows: int = 3
    enter_windows: int = 1
    horizon_s: float = 30.0
    fallback_probe_share: float = 0.05
    split: Literal["capacity", "min-latency"] = "min-latency"
    release_requests: float = 20.0  # completions that weigh as much as the held latency

    def __post_init__(self) -> None:
        if not isinstance(self.primary, str) or not self.primary:
            raise ParameterError(f"primary={self.primary!r}: must be a non-empty string")
        if self.fallback == self.primary:
            raise ParameterError(f"fallback={self.fallback!r}: must differ from primary")
        check_number("temperature", self.temperature, 0.0, strict=True)
        check_number("horizon_s", self.horizon_s, 0.0)
        if self.split not in ("capacity", "min-latency"):
            raise ParameterError(f"split={self.split!r}: must be capacity or min-latency")
        check_number("release_requests", self.release_requests, 0.0)
        for name in ("min_share", "hysteresis", "fallback_probe_share"):
            if check_number(name, getattr(self, name), 0.0) >= 1.0:
                raise ParameterError(f"{name}={getattr(self, name)}: must lie in [0, 1)")
        for name in ("recover_windows", "enter_windows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParameterError(f"{name}={v!r}: must be an int >= 1")


@dataclass(frozen=True)
class RoutingState:
    """Router memory (JSON via to_dict/from_dict): fallbacks, streaks, queues.

    Examples
    --------
    >>> s = RoutingState(fallback={"voice": "primary over SLO"}, recover_streak={"voice": 2})
    >>> RoutingState.from_dict(s.to_dict()) == s
    True
    """

    fallback: dict[str, str] = field(default_factory=dict)  # class -> why it entered
    over_streak: dict[str, int] = field(default_factory=dict)
    recover_streak: dict[str, int] = field(default_factory=dict)
    last_queue: dict[str, float] = field(default_factory=dict)  # Target.key -> queue_len
    held_ttft_ms: dict[str, float] = field(default_factory=dict)  # Target.key -> held prediction
    steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoutingState:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


@dataclass(frozen=True)
class RoutingDecision:
    """Weights per class per target (each class's sum is 1, or empty if unroutable)."""

    weights: dict[str, dict[Target, float]]
    fallback: dict[str, str]  # classes in fallback -> reason
    reasons: dict[str, str]  # every class -> why its routing is what it is
    predicted_ttft_ms: dict[Target, float | None]
    unroutable: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # classes that entered or left fallback this step

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields (targets as ``"variant|zone"`` keys)."""
        return {
            "weights": {c: {t.key: w for t, w in ws.items()} for c, ws in self.weights.items()},
            "fallback": dict(self.fallback),
            "reasons": dict(self.reasons),
            "predicted_ttft_ms": {t.key: v for t, v in self.predicted_ttft_ms.items()},
            "unroutable": list(self.unroutable),
            "changed": list(self.changed),
        }


def _variant_weights(
    p: RoutingParams,
    obs: Mapping[Target, TargetObs],
    variant: str | None,
    x: Mapping[Target, float | None],
    ttft: Mapping[Target, float | None],
) -> tuple[dict[Target, float], float | None]:
    """Weights over one variant's eligible targets and the expected normalised latency."""
    elig = [t for t, o in obs.items() if t.variant == variant and o.breaker != "open" and o.capacity_rps != 0.0]
    if not elig:
        return {}, math.inf
    scored = [t for t in elig if obs[t].breaker == "closed" and x[t] is not None]
    n = len(elig)
    m = min(p.min_share, 1.0 / n)
    if not scored:
        return {t: 1.0 / n for t in elig}, None
    caps = [obs[t].capacity_rps for t in scored]
    use_caps = all(c is not None and c > 0 for c in caps)
    prior = [c if use_caps and c is not None else 1.0 for c in caps]
    load = sum(obs[t].rate_rps for t in elig)
    lat = [ttft[t] for t in scored]
    if p.split == "min-latency" and use_caps and load > 0 and all(v is not None and 0 < v < math.inf for v in lat):
        split = min_latency_split([v or 0.0 for v in lat], prior, load)
        prior = [max(v, 1e-9 * c) for v, c in zip(split, prior, strict=True)]
    xs = [x[t] or 0.0 for t in scored]
    lo = min(xs)
    raw = [c * math.exp(-(xi - lo) / p.temperature) for c, xi in zip(prior, xs, strict=True)]
    total = sum(raw)
    w = {t: m for t in elig}
    for t, r in zip(scored, raw, strict=True):
        w[t] += (1.0 - n * m) * (r / total)  # r/total first: 0.94 * 5e-324 rounds back to 5e-324
    ws = sum(w[t] for t in scored)
    expected = sum(w[t] * xi for t, xi in zip(scored, xs, strict=True)) / ws
    return w, expected


def _blend(a: dict[Target, float], b: dict[Target, float], share_b: float) -> dict[Target, float]:
    out = {t: (1.0 - share_b) * v for t, v in a.items()}
    for t, v in b.items():
        out[t] = out.get(t, 0.0) + share_b * v
    return out


def step(
    params: RoutingParams,
    state: RoutingState,
    observations: Mapping[Target, TargetObs],
    classes: Sequence[RequestClass],
    dt_s: float,
) -> tuple[RoutingState, RoutingDecision]:
    """Route each class for the next window (pure).

    Parameters
    ----------
    params : RoutingParams
    state : RoutingState
        ``RoutingState()`` to start.
    observations : Mapping[Target, TargetObs]
        The window just closed, per target; targets of other variants are ignored.
    classes : Sequence[RequestClass]
        The SLA tiers to route (unique names), e.g. :data:`DEFAULT_CLASSES`.
    dt_s : float
        Window length, seconds (for the queue growth rate).

    Returns
    -------
    (RoutingState, RoutingDecision)

    Examples
    --------
    >>> p = RoutingParams(primary="70b", min_share=0.0, temperature=0.25)
    >>> obs = {Target("70b", "a"): TargetObs(150.0), Target("70b", "b"): TargetObs(225.0)}
    >>> _, d = step(p, RoutingState(), obs, [TRADING], 10.0)
    >>> round(d.weights["trading"][Target("70b", "a")], 4)   # x = 0.5 vs 0.75: 1 / (1 + e^-1)
    0.7311
    """
    check_number("dt_s", dt_s, 0.0, strict=True)
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise ParameterError(f"classes={names}: class names must be unique")
    pred = {t: predict_ms(params, o, state.last_queue.get(t.key), dt_s) for t, o in observations.items()}
    held = dict(state.held_ttft_ms)
    for t, (ttft_ms, _) in pred.items():
        if ttft_ms is not None:
            held[t.key] = held_latency_ms(params, held.get(t.key), ttft_ms, observations[t].rate_rps * dt_s)
    split_ttft = {t: held[t.key] if pred[t][0] is not None else None for t in observations}
    fb, over, rec = dict(state.fallback), dict(state.over_streak), dict(state.recover_streak)
    weights: dict[str, dict[Target, float]] = {}
    reasons: dict[str, str] = {}
    unroutable: list[str] = []
    changed: list[str] = []
    for c in sorted(classes, key=lambda k: (k.priority, k.name)):
        x = {t: normalised(c, *pred[t]) for t in observations}
        wp, xp = _variant_weights(params, observations, params.primary, x, split_ttft)
        can_fb = c.degradable and params.fallback is not None
        wf, xf = _variant_weights(params, observations, params.fallback, x, split_ttft) if can_fb else ({}, None)
        xp_txt = "unavailable" if xp == math.inf else "no data" if xp is None else f"{xp:.3g} x SLO"
        if c.name not in fb:
            if xp is not None:
                over[c.name] = over.get(c.name, 0) + 1 if xp > 1.0 else 0
            due = xp == math.inf or over.get(c.name, 0) >= params.enter_windows
            better = xf is None or xp is None or xf < xp
            if can_fb and wf and due and better:
                fb[c.name] = f"primary {'' if xp == math.inf else 'predicted '}{xp_txt} (ttft SLO {c.ttft_slo_ms:g} ms)"
                rec[c.name], over[c.name] = 0, 0
                changed.append(c.name)
                reasons[c.name] = f"enter fallback: {fb[c.name]}"
            elif due and can_fb and wf:
                reasons[c.name] = f"primary {xp_txt}, fallback not better ({xf:.3g} x SLO)"
            else:
                reasons[c.name] = f"primary {xp_txt}"
        else:
            if not wf:
                del fb[c.name]
                changed.append(c.name)
                reasons[c.name] = "exit fallback: fallback unavailable"
            else:
                if xp is not None and xp != math.inf:
                    rec[c.name] = rec.get(c.name, 0) + 1 if xp < 1.0 - params.hysteresis else 0
                if rec.get(c.name, 0) >= params.recover_windows:
                    del fb[c.name]
                    rec[c.name] = 0
                    changed.append(c.name)
                    reasons[c.name] = (
                        f"exit fallback: primary {xp_txt} < {1 - params.hysteresis:g}"
                        f" for {params.recover_windows} windows"
                    )
                else:
                    reasons[c.name] = (
                        f"in fallback, primary {xp_txt}, recovering {rec.get(c.name, 0)}/{params.recover_windows}"
                    )
        if c.name in fb:
            weights[c.name] = _blend(wf, wp, params.fallback_probe_share) if wp else wf
        elif wp:
            weights[c.name] = wp
        else:
            weights[c.name] = {}
            unroutable.append(c.name)
            reasons[c.name] += "; unroutable"
    for name in [k for k in fb if k not in names]:
        del fb[name]  # a class that is no longer routed leaves no fallback behind
    new = replace(
        state,
        fallback=fb,
        over_streak=over,
        recover_streak=rec,
        last_queue={t.key: o.queue_len for t, o in observations.items()},
        held_ttft_ms=held,
        steps=state.steps + 1,
    )
    return new, RoutingDecision(
        weights,
        {k: fb[k] for k in names if k in fb},
        reasons,
        {t: v[0] for t, v in pred.items()},
        tuple(unroutable),
        tuple(changed),
    )
