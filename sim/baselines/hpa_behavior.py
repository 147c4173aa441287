"""Normalisation of an HPA recommendation: stabilisation, rate policies, the legacy path.

Split from :mod:`sim.baselines.hpa` (which documents the algorithm and cites
``horizontal.go``): the ``behavior`` types, the memory of recommendations
and scale events, and the smoothed per-pod signal.  Shared by the HPA,
KEDA and HPA-on-queue-depth baselines.

Examples
--------
>>> b = HpaBehavior()  # no behavior block: the legacy path
>>> b.legacy, b.reconcile(0.0, 4, 20, 1, 64)  # legacy scale-up limit max(2 x 4, 4) = 8
(True, 8)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from sim.baselines.base import check, non_negative, positive

__all__ = [
    "DEFAULT_SCALE_DOWN",
    "DEFAULT_SCALE_UP",
    "HpaBehavior",
    "ScalingPolicy",
    "ScalingRules",
    "SmoothedSignal",
    "convert_legacy",
    "legacy_scale_up_limit",
]


@dataclass(frozen=True)
class ScalingPolicy:
    """One HPA scaling policy: change by ``value`` pods or percent per ``period_s``."""

    kind: Literal["Pods", "Percent"]
    value: int
    period_s: float = 15.0

    def __post_init__(self) -> None:
        check(self.kind in ("Pods", "Percent"), "kind", self.kind, "must be 'Pods' or 'Percent'")
        check(isinstance(self.value, int) and self.value > 0, "value", self.value, "must be an integer > 0")
        positive("period_s", self.period_s)


@dataclass(frozen=True)
class ScalingRules:
    """``behavior.scaleUp`` / ``behavior.scaleDown`` of an HPA."""

    stabilization_window_s: float
    policies: tuple[ScalingPolicy, ...]
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"

    def __post_init__(self) -> None:
        non_negative("stabilization_window_s", self.stabilization_window_s)
        check(len(self.policies) > 0, "policies", self.policies, "needs at least one policy")
        check(
            self.select_policy in ("Max", "Min", "Disabled"),
            "select_policy",
            self.select_policy,
            "must be 'Max', 'Min' or 'Disabled'",
        )


DEFAULT_SCALE_UP = ScalingRules(0.0, (ScalingPolicy("Percent", 100, 15.0), ScalingPolicy("Pods", 4, 15.0)), "Max")
DEFAULT_SCALE_DOWN = ScalingRules(300.0, (ScalingPolicy("Percent", 100, 15.0),), "Max")


def legacy_scale_up_limit(current: int) -> int:
    """``calculateScaleUpLimit``: ``max(2 x current, 4)`` (HPA without ``behavior``)."""
    return int(max(2.0 * current, 4.0))


def convert_legacy(current: int, desired: int, lo: int, hi: int) -> int:
    """``convertDesiredReplicasWithRules``: bounds and the legacy scale-up limit.

    >>> convert_legacy(3, 1000, 1, 2000)
    6
    >>> convert_legacy(1, 0, 0, 10)  # min 0 still keeps one replica here
    1
    """
    lowest = 1 if lo == 0 else lo
    highest = min(hi, legacy_scale_up_limit(current))
    return max(lowest, min(highest, desired))


@dataclass
class HpaBehavior:
    """Stabilisation and rate limits of one HPA, with their memory.

    ``scale_up`` and ``scale_down`` both ``None`` is an HPA without a
    ``behavior`` block (every HPA KEDA creates unless the ScaledObject sets
    one): the controller then runs its legacy path (``normalizeDesiredReplicas``):
    the maximum recommendation over ``downscale_stabilization_s`` and the
    ``max(2 x current, 4)`` scale-up limit.  With either set, the missing one
    takes the documented defaults and ``normalizeDesiredReplicasWithBehaviors``
    runs.
    """

    scale_up: ScalingRules | None = None
    scale_down: ScalingRules | None = None
    downscale_stabilization_s: float = 300.0
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    up_events: list[tuple[float, int]] = field(default_factory=list)
    down_events: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.legacy = self.scale_up is None and self.scale_down is None
        if not self.legacy:
            self.scale_up = self.scale_up or DEFAULT_SCALE_UP
            self.scale_down = self.scale_down or DEFAULT_SCALE_DOWN

    @property
    def up_rules(self) -> ScalingRules:
        return self.scale_up or DEFAULT_SCALE_UP

    @property
    def down_rules(self) -> ScalingRules:
        return self.scale_down or DEFAULT_SCALE_DOWN

    def seed(self, t_s: float, current: int) -> None:
        """``recordInitialRecommendation``: the first reconcile remembers ``current``."""
        if not self.recommendations:
            self.recommendations.append((t_s, current))

    def stabilize_legacy(self, t_s: float, desired: int) -> int:
        """``stabilizeRecommendation``: the maximum over the downscale window, this one included."""
        cutoff = t_s - self.downscale_stabilization_s
        out = max([desired, *(r for ts, r in self.recommendations if ts >= cutoff)])
        self.recommendations = [(ts, r) for ts, r in self.recommendations if ts >= cutoff]
        self.recommendations.append((t_s, desired))
        return out

    def stabilize(self, t_s: float, current: int, desired: int) -> int:
        """``stabilizeRecommendationWithBehaviors``: bring ``current`` into [up, down].

        ``up`` is the minimum of this and the recommendations within the
        scale-up window, ``down`` the maximum of this and those within the
        scale-down window; the result is ``current`` raised to ``up`` or
        lowered to ``down``.  A scale-up therefore never comes out of a
        scale-down recommendation, nor the reverse.
        """
        up_cut = t_s - self.up_rules.stabilization_window_s
        down_cut = t_s - self.down_rules.stabilization_window_s
        up_rec = down_rec = desired
        for ts, rec in self.recommendations:
            if ts > up_cut:
                up_rec = min(up_rec, rec)
            if ts > down_cut:
                down_rec = max(down_rec, rec)
        out = current
        if out < up_rec:
            out = up_rec
        if out > down_rec:
            out = down_rec
        keep = min(up_cut, down_cut)
        self.recommendations = [(ts, r) for ts, r in self.recommendations if ts > keep]
        self.recommendations.append((t_s, desired))
        return out

    @staticmethod
    def _changed(events: list[tuple[float, int]], t_s: float, period_s: float) -> int:
        return sum(n for ts, n in events if ts > t_s - period_s)

    def _period_start(self, t_s: float, current: int, period_s: float) -> int:
        """The replica count at the start of a policy's period (current, less what it scaled up, plus down)."""
        return current - self._changed(self.up_events, t_s, period_s) + self._changed(self.down_events, t_s, period_s)

    def up_limit(self, t_s: float, current: int) -> int:
        """``calculateScaleUpLimitWithScalingRules``: the largest count the scale-up policies allow now."""
        rules = self.up_rules
        if rules.select_policy == "Disabled":
            return current
        pick = min if rules.select_policy == "Min" else max
        result: int | None = None
        for p in rules.policies:
            start = self._period_start(t_s, current, p.period_s)
            prop = start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100))
            result = prop if result is None else pick(result, prop)
        return int(result if result is not None else current)

    def down_limit(self, t_s: float, current: int) -> int:
        """``calculateScaleDownLimitWithBehaviors``: the smallest count the scale-down policies allow now."""
        rules = self.down_rules
        if rules.select_policy == "Disabled":
            return current
        pick = max if rules.select_policy == "Min" else min
        result: int | None = None
        for p in rules.policies:
            start = self._period_start(t_s, current, p.period_s)
            prop = start - p.value if p.kind == "Pods" else int(start * (1 - p.value / 100))
            result = prop if result is None else pick(result, prop)
        return int(result if result is not None else current)

    def normalize(self, t_s: float, current: int, proposal: int, lo: int, hi: int) -> int:
        """``normalizeDesiredReplicas`` (legacy) or ``...WithBehaviors``: stabilise, then limits and bounds."""
        if self.legacy:
            return convert_legacy(current, self.stabilize_legacy(t_s, proposal), lo, hi)
        desired = self.stabilize(t_s, current, proposal)
        if desired > current:
            limit = max(self.up_limit(t_s, current), current)
            return min(desired, min(hi, limit))
        if desired < current:
            limit = min(self.down_limit(t_s, current), current)
            return max(desired, max(lo, limit))
        return desired

    def record(self, t_s: float, prev: int, new: int) -> None:
        """``storeScaleEvent``: remember a rescale for the rate policies (not used by the legacy path)."""
        if self.legacy:
            return
        longest = max(
            max(p.period_s for p in self.up_rules.policies), max(p.period_s for p in self.down_rules.policies)
        )
        self.up_events = [e for e in self.up_events if e[0] > t_s - longest]
        self.down_events = [e for e in self.down_events if e[0] > t_s - longest]
        if new > prev:
            self.up_events.append((t_s, new - prev))
        elif new < prev:
            self.down_events.append((t_s, prev - new))

    def reconcile(self, t_s: float, current: int, proposal: int | None, lo: int, hi: int) -> int:
        """One ``reconcileAutoscaler`` pass; returns the new spec replicas."""
        self.seed(t_s, current)
        if current == 0 and lo != 0:
            return current  # "scaling is disabled since the replica count of the target is zero"
        if current > hi:
            desired = hi
        elif current < lo:
            desired = lo
        elif proposal is None:
            return current  # metrics unavailable: the HPA keeps the scale as it is
        else:
            desired = self.normalize(t_s, current, proposal, lo, hi)
        if desired != current:
            self.record(t_s, current, desired)
        return desired


class SmoothedSignal:
    """Mean of the samples of the last ``window_s`` seconds (a Prometheus ``avg_over_time``).

    >>> s = SmoothedSignal(30.0)
    >>> for t, v in ((0.0, 0.2), (15.0, 0.4), (40.0, 0.9)):
    ...     s.add(t, v)
    >>> s.mean(40.0)  # the sample at 0 s is out of the window
    0.65
    """

    def __init__(self, window_s: float) -> None:
        non_negative("window_s", window_s)
        self.window_s = float(window_s)
        self.samples: deque[tuple[float, float]] = deque()

    def add(self, t_s: float, value: float) -> None:
        """Record one sample (non-finite ones are dropped)."""
        if math.isfinite(value):
            self.samples.append((t_s, float(value)))

    def mean(self, t_s: float) -> float | None:
        """Mean over ``(t_s - window_s, t_s]`` (the latest sample when the window is 0); None when empty."""
        while self.samples and self.samples[0][0] <= t_s - self.window_s and len(self.samples) > 1:
            self.samples.popleft()
        if not self.samples:
            return None
        if self.window_s == 0:
            return self.samples[-1][1]
        vals = [v for ts, v in self.samples if ts > t_s - self.window_s]
        return sum(vals) / len(vals) if vals else None
