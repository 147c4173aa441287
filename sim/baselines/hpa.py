"""Kubernetes Horizontal Pod Autoscaler (autoscaling/v2) on GPU utilisation.

Algorithm (re-implemented from the controller's source, not copied):

* **Ratio rule with tolerance** (``replica_calculator.go``,
  ``calcPlainMetricReplicas`` / ``GetResourceReplicas``):
  ``ratio = current_metric / target``; if ``|1 - ratio| <= tolerance`` (0.1,
  the controller flag ``--horizontal-pod-autoscaler-tolerance``) keep the
  current count, else ``desired = ceil(ratio * ready_pods)``.  Pods that are not
  ready yet (starting replicas) carry no metric: on a scale-up
  (``ratio > 1``) they are counted as using 0 and the ratio is recomputed over
  ready + unready pods; if that recomputed ratio is within tolerance or flips
  direction, the count is kept.
* **Reconcile** (``horizontal.go``, ``reconcileAutoscaler``): ``current`` is the
  scale target's spec replicas (our ``obs.desired``).  ``current == 0`` with
  ``minReplicas > 0`` disables scaling; ``current`` above max / below min is
  snapped to the bound; else the metric proposal is normalised.  The
  recommendation history is seeded with ``current`` on the first reconcile
  (``recordInitialRecommendation``).
* **Stabilisation** (``stabilizeRecommendationWithBehaviors``): a scale-up
  proposal becomes the *minimum* of proposals within the scale-up window
  (default 0 s), a scale-down proposal the *maximum* of proposals within the
  scale-down window (default 300 s, ``--horizontal-pod-autoscaler-downscale-stabilization``).
* **Rate policies** (``convertDesiredReplicasWithBehaviorRate``,
  ``calculateScaleUpLimitWithScalingRules``/``...ScaleDownLimitWithBehaviors``):
  per policy the limit is measured from the count at the start of the
  policy's period (current minus replicas added / plus removed in the last
  ``periodSeconds``): ``Pods``: start +- value; ``Percent``: up
  ``ceil(start * (1 + v/100))``, down ``int(start * (1 - v/100))``.
  ``selectPolicy: Max`` picks the largest change.  Defaults
  (``pkg/apis/autoscaling/v2/defaults.go``; docs "Default Behavior"):
  scale-up ``max(100 %, 4 pods) per 15 s``, scale-down ``100 % per 15 s``.
* The controller runs every 15 s (``--horizontal-pod-autoscaler-sync-period``).

Metric mapping: HPA for GPU serving is commonly driven by the DCGM exporter's
``DCGM_FI_DEV_GPU_UTIL`` through a metrics adapter as a per-pod metric with an
average target; here ``obs.gpu_util`` (mean busy fraction of *ready* replicas
over the last second) plays that role and ``target_utilization`` (default
0.70) is the ``averageUtilization``-style target.  Starting replicas are the
not-ready pods.  Honest caveat: GPU busy fraction saturates at 1.0, so a
queue building behind fully busy replicas is invisible beyond ``1/target``.

Sources: kubernetes/kubernetes ``pkg/controller/podautoscaler/horizontal.go``,
``pkg/controller/podautoscaler/replica_calculator.go``;
https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/
(algorithm details, tolerance, default behavior).

Examples
--------
>>> from sim.baselines.base import Observation
>>> hpa = HorizontalPodAutoscaler(max_replicas=16)
>>> obs = Observation(t_s=0.0, zone="az-a", model="m", replicas_ready=4, replicas_starting=0,
...                   desired=4, ongoing_requests=0, queue_len=0, arrival_rate_rps=0.0,
...                   gpu_util=0.9, window=None)
>>> hpa.decide(obs)  # ceil(4 * 0.9 / 0.7) = 6
6
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from sim.baselines.base import BaselineBase, Observation, check, non_negative, positive

__all__ = [
    "DEFAULT_SCALE_DOWN",
    "DEFAULT_SCALE_UP",
    "HorizontalPodAutoscaler",
    "HpaBehavior",
    "HpaParams",
    "ScalingPolicy",
    "ScalingRules",
    "plain_metric_replicas",
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


@dataclass(frozen=True)
class HpaParams:
    """HPA parameters; defaults are the Kubernetes defaults (target: see module docstring)."""

    target_utilization: float = 0.70
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN

    def __post_init__(self) -> None:
        check(0 < self.target_utilization <= 1, "target_utilization", self.target_utilization, "must lie in (0, 1]")
        check(0 <= self.tolerance < 1, "tolerance", self.tolerance, "must lie in [0, 1)")
        positive("sync_period_s", self.sync_period_s)


def plain_metric_replicas(
    usage: float, target: float, ready: int, unready: int, current: int, tolerance: float = 0.1
) -> int | None:
    """Replica proposal of the HPA ratio rule for a per-pod average metric.

    ``usage`` is the mean over ready pods; ``unready`` pods carry no metric.
    ``None`` when no ready pod reports (the HPA's "did not receive metrics").

    >>> plain_metric_replicas(90, 70, ready=4, unready=0, current=4)
    6
    >>> plain_metric_replicas(75, 70, ready=4, unready=0, current=4)  # within 10 %
    4
    """
    if ready <= 0:
        return None
    ratio = usage / target
    if not (unready > 0 and ratio > 1.0):
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * ready)
    # scale-up with unready pods: count them at 0 and recompute
    new_ratio = usage * ready / (target * (ready + unready))
    if abs(1.0 - new_ratio) <= tolerance or new_ratio < 1.0:
        return current
    return math.ceil(new_ratio * (ready + unready))


@dataclass
class HpaBehavior:
    """Stabilisation window and rate policies of one HPA, with their memory."""

    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    up_events: list[tuple[float, int]] = field(default_factory=list)
    down_events: list[tuple[float, int]] = field(default_factory=list)

    def seed(self, t_s: float, current: int) -> None:
        """``recordInitialRecommendation``: the first reconcile remembers ``current``."""
        if not self.recommendations:
            self.recommendations.append((t_s, current))

    def stabilize(self, t_s: float, current: int, desired: int) -> int:
        """Min over the scale-up window / max over the scale-down window."""
        if desired >= current:
            window, better = self.scale_up.stabilization_window_s, min
        else:
            window, better = self.scale_down.stabilization_window_s, max
        cutoff = t_s - window
        out = desired
        for ts, rec in self.recommendations:
            if ts > cutoff:
                out = better(out, rec)
        keep = max(self.scale_up.stabilization_window_s, self.scale_down.stabilization_window_s)
        self.recommendations = [(ts, r) for ts, r in self.recommendations if ts >= t_s - keep]
        self.recommendations.append((t_s, desired))
        return out

    @staticmethod
    def _changed(events: list[tuple[float, int]], t_s: float, period_s: float) -> int:
        return sum(n for ts, n in events if ts > t_s - period_s)

    def up_limit(self, t_s: float, current: int) -> int:
        """Largest count the scale-up policies allow now."""
        rules = self.scale_up
        if rules.select_policy == "Disabled":
            return current
        pick = min if rules.select_policy == "Min" else max
        result: int | None = None
        for p in rules.policies:
            start = current - self._changed(self.up_events, t_s, p.period_s)
            prop = start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100))
            result = prop if result is None else pick(result, prop)
        return int(result if result is not None else current)

    def down_limit(self, t_s: float, current: int) -> int:
        """Smallest count the scale-down policies allow now."""
        rules = self.scale_down
        if rules.select_policy == "Disabled":
            return current
        pick = max if rules.select_policy == "Min" else min
        result: int | None = None
        for p in rules.policies:
            start = current + self._changed(self.down_events, t_s, p.period_s)
            prop = start - p.value if p.kind == "Pods" else int(start * (1 - p.value / 100))
            result = prop if result is None else pick(result, prop)
        return int(result if result is not None else current)

    def normalize(self, t_s: float, current: int, proposal: int, lo: int, hi: int) -> int:
        """Stabilise, then apply the rate limits and the bounds (``normalizeDesiredReplicasWithBehaviors``)."""
        desired = self.stabilize(t_s, current, proposal)
        if desired > current:
            limit = max(self.up_limit(t_s, current), current)
            return min(desired, min(hi, limit))
        if desired < current:
            limit = min(self.down_limit(t_s, current), current)
            return max(desired, max(lo, limit))
        return desired

    def record(self, t_s: float, prev: int, new: int) -> None:
        """``storeScaleEvent``: remember a rescale for the rate policies."""
        if new > prev:
            longest = max(p.period_s for p in self.scale_up.policies)
            self.up_events = [e for e in self.up_events if e[0] > t_s - longest]
            self.up_events.append((t_s, new - prev))
        elif new < prev:
            longest = max(p.period_s for p in self.scale_down.policies)
            self.down_events = [e for e in self.down_events if e[0] > t_s - longest]
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


class HorizontalPodAutoscaler(BaselineBase):
    """Kubernetes HPA on GPU utilisation (see the module docstring)."""

    name = "hpa"

    def __init__(
        self,
        params: HpaParams | None = None,
        *,
        min_replicas: int = 1,
        max_replicas: int = 64,
        slo_ttft_ms: float = 1000.0,
        slo_itl_ms: float = 150.0,
        replica_capacity_rps: float | None = None,
    ) -> None:
        super().__init__(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            slo_ttft_ms=slo_ttft_ms,
            slo_itl_ms=slo_itl_ms,
            replica_capacity_rps=replica_capacity_rps,
        )
        self.params = params or HpaParams()
        self.period_s = self.params.sync_period_s
        self.behavior = HpaBehavior(self.params.scale_up, self.params.scale_down)

    def decide(self, obs: Observation) -> int | None:
        """One HPA sync: proposal from GPU utilisation, then behaviour and bounds."""
        p = self.params
        proposal = plain_metric_replicas(
            obs.gpu_util, p.target_utilization, obs.replicas_ready, obs.replicas_starting, obs.desired, p.tolerance
        )
        new = self.behavior.reconcile(obs.t_s, obs.desired, proposal, self.min_replicas, self.max_replicas)
        return None if new == obs.desired else new
