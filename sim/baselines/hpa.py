"""Kubernetes Horizontal Pod Autoscaler (autoscaling/v2) on GPU utilisation.

Algorithm (re-implemented from the controller's source, not copied):

* **Ratio rule with tolerance** (``replica_calculator.go``,
  ``calcPlainMetricReplicas``): ``ratio = usage / target`` over the pods that
  report; if ``|1 - ratio| <= tolerance`` (0.1, ``--horizontal-pod-autoscaler-tolerance``)
  keep the current count, else ``desired = ceil(ratio * ready_pods)``.  Pods
  without a metric count at the *target* on a scale-down and at 0 on a
  scale-up; unready pods count at 0 on a scale-up; the recomputed ratio keeps
  the count when within tolerance or when it flips direction.  Here the
  starting replicas are the pods without a metric (no DCGM sample before the
  model server runs).
* **Reconcile** (``horizontal.go``, ``reconcileAutoscaler``): ``current`` is the
  scale target's spec replicas (our ``obs.desired``).  ``current == 0`` with
  ``minReplicas > 0`` disables scaling; ``current`` above max / below min is
  snapped to the bound; else the metric proposal is normalised.  The
  recommendation history is seeded with ``current`` on the first reconcile.
* **No ``behavior`` = the legacy path** (the API server defaults ``behavior``
  only when it is set; ``normalizeDesiredReplicas``): the recommendation is
  the maximum over the ``--horizontal-pod-autoscaler-downscale-stabilization``
  window (300 s) including this one, then bounded by ``minReplicas`` (1 when
  0) and ``min(maxReplicas, max(2 x current, 4))`` (``calculateScaleUpLimit``).
  This is the default here and for KEDA (whose HPAs carry no ``behavior``).
* **With ``behavior``** (``stabilizeRecommendationWithBehaviors`` then
  ``convertDesiredReplicasWithBehaviorRate``): ``up`` = min of the proposal and
  the recommendations within the scale-up window, ``down`` = max of the proposal
  and those within the scale-down window; ``current`` is raised to ``up`` or
  lowered to ``down`` (so a proposal below ``current`` never scales up).  Rate
  policies measure from the count at the start of each policy's period
  (current minus added plus removed replicas in the last ``periodSeconds``):
  ``Pods`` +- value; ``Percent`` up ``ceil(start * (1 + v/100))``, down
  ``int(start * (1 - v/100))``; ``selectPolicy: Max`` picks the largest change.
  Defaults for an unset half (``pkg/apis/autoscaling/v2/defaults.go``):
  scale-up ``max(100 %, 4 pods) per 15 s`` with no window, scale-down
  ``100 % per 15 s`` with a 300 s window.
* The controller syncs every 15 s (``--horizontal-pod-autoscaler-sync-period``).

Metric mapping: HPA for GPU serving is driven by the DCGM exporter's
``DCGM_FI_DEV_GPU_UTIL`` through a metrics adapter as a per-pod metric with an
average target, and the adapter's query smooths it (``avg_over_time`` over
30-60 s; the DCGM exporter itself samples every 30 s by default).  Here the
baseline samples ``obs.gpu_util`` (mean busy fraction of *ready* replicas over
the last second) every ``sample_period_s`` (1 s) and syncs on its mean over
``smoothing_window_s`` (default 30 s); ``target_utilization`` (0.70) is the
``averageValue`` target.  Honest caveats: GPU busy fraction saturates at 1.0,
so a queue building behind fully busy replicas is invisible beyond
``1/target``; and the target cannot be derived from the profiled capacity
(a replica at capacity is busy nearly all the time), so it stays the common
operator choice.  Most LLM deployments scale on queue depth instead: see
:mod:`sim.baselines.hpa_queue`.

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
>>> hpa.decide(obs)  # ceil(4 * 0.9 / 0.7) = 6 (first sync: the window holds one sample)
6
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.defaults import ITL_SLO_MS, MAX_REPLICAS, MIN_REPLICAS, TTFT_SLO_MS
from sim.baselines.base import BaselineBase, Observation, check, non_negative, positive
from sim.baselines.hpa_behavior import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    HpaBehavior,
    ScalingPolicy,
    ScalingRules,
    SmoothedSignal,
    convert_legacy,
    legacy_scale_up_limit,
)

__all__ = [
    "DEFAULT_SCALE_DOWN",
    "DEFAULT_SCALE_UP",
    "HorizontalPodAutoscaler",
    "HpaBehavior",
    "HpaParams",
    "ScalingPolicy",
    "ScalingRules",
    "SmoothedSignal",
    "convert_legacy",
    "legacy_scale_up_limit",
    "plain_metric_replicas",
]


@dataclass(frozen=True)
class HpaParams:
    """HPA parameters; defaults are the Kubernetes defaults (target and smoothing: see the module docstring).

    ``scale_up`` / ``scale_down`` ``None`` (both) = no ``behavior`` block: the legacy path.
    """

    target_utilization: float = 0.70
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    smoothing_window_s: float = 30.0
    sample_period_s: float = 1.0
    scale_up: ScalingRules | None = None
    scale_down: ScalingRules | None = None
    downscale_stabilization_s: float = 300.0

    def __post_init__(self) -> None:
        check(0 < self.target_utilization <= 1, "target_utilization", self.target_utilization, "must lie in (0, 1]")
        check(0 <= self.tolerance < 1, "tolerance", self.tolerance, "must lie in [0, 1)")
        positive("sync_period_s", self.sync_period_s)
        non_negative("smoothing_window_s", self.smoothing_window_s)
        positive("sample_period_s", self.sample_period_s)
        non_negative("downscale_stabilization_s", self.downscale_stabilization_s)


def plain_metric_replicas(
    usage: float,
    target: float,
    ready: int,
    unready: int,
    current: int,
    tolerance: float = 0.1,
    missing: int = 0,
    fill_down: float | None = None,
) -> int | None:
    """Replica proposal of the HPA ratio rule for a per-pod average metric (``calcPlainMetricReplicas``).

    ``usage`` is the mean over the ``ready`` pods that report; ``unready`` pods
    (pending or not yet ready) and ``missing`` pods (no metric) carry none.
    Missing pods count at ``fill_down`` on a scale-down (the target for a
    ``Pods`` metric; ``max(100, target)`` % of the request for a CPU
    ``Resource`` metric) and at 0 on a scale-up (not at all when the ratio is
    exactly 1);
    unready pods count at 0, and only on a scale-up.  The recomputed ratio
    keeps the count when it is within tolerance or flips direction.  ``None``
    when no ready pod reports ("did not receive metrics").

    >>> plain_metric_replicas(90, 70, ready=4, unready=0, current=4)
    6
    >>> plain_metric_replicas(75, 70, ready=4, unready=0, current=4)  # within 10 %
    4
    >>> plain_metric_replicas(24.75, 100, ready=2, unready=0, current=4, missing=2)  # missing at target
    3
    """
    if ready <= 0:
        return None
    ratio = usage / target
    up_with_unready = unready > 0 and ratio > 1.0
    if not up_with_unready and missing == 0:
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * ready)
    total = usage * ready
    pods = ready
    if missing > 0 and ratio < 1.0:  # scale-down: missing pods use the target (or the fill)
        total += (target if fill_down is None else fill_down) * missing
        pods += missing
    elif missing > 0 and ratio > 1.0:  # scale-up: missing pods use 0
        pods += missing
    if up_with_unready:
        pods += unready  # scale-up: unready pods use 0
    new_ratio = total / (target * pods)
    if abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current
    new = math.ceil(new_ratio * pods)
    if (new_ratio < 1.0 and new > current) or (new_ratio > 1.0 and new < current):
        return current
    return new


class HorizontalPodAutoscaler(BaselineBase):
    """Kubernetes HPA on GPU utilisation (see the module docstring)."""

    name = "hpa"

    def __init__(
        self,
        params: HpaParams | None = None,
        *,
        min_replicas: int = MIN_REPLICAS,
        max_replicas: int = MAX_REPLICAS,
        slo_ttft_ms: float = TTFT_SLO_MS,
        slo_itl_ms: float = ITL_SLO_MS,
        replica_capacity_rps: float | None = None,
    ) -> None:
        super().__init__(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            slo_ttft_ms=slo_ttft_ms,
            slo_itl_ms=slo_itl_ms,
            replica_capacity_rps=replica_capacity_rps,
        )
        self.params = p = params or HpaParams()
        self.sync_period_s = p.sync_period_s
        self.period_s = min(p.sample_period_s, p.sync_period_s)  # sample the signal, sync every sync_period_s
        self.behavior = HpaBehavior(p.scale_up, p.scale_down, p.downscale_stabilization_s)
        self.signal = SmoothedSignal(p.smoothing_window_s)
        self.last_sync_s: float | None = None

    def metric(self, obs: Observation) -> float:
        """The per-pod metric sampled each period: GPU busy fraction of the ready replicas."""
        return obs.gpu_util

    def target(self) -> float:
        """The per-pod target of the metric."""
        return self.params.target_utilization

    def decide(self, obs: Observation) -> int | None:
        """Sample the metric; every ``sync_period_s`` one HPA sync on its smoothed value."""
        p, t = self.params, obs.t_s
        if obs.replicas_ready > 0:
            self.signal.add(t, self.metric(obs))
        if self.last_sync_s is not None and t - self.last_sync_s < p.sync_period_s - 1e-9:
            return None
        self.last_sync_s = t
        usage = self.signal.mean(t) if obs.replicas_ready > 0 else None
        proposal = (
            None
            if usage is None
            else plain_metric_replicas(
                usage,
                self.target(),
                obs.replicas_ready,
                0,
                obs.desired,
                p.tolerance,
                missing=obs.replicas_starting,
            )
        )
        new = self.behavior.reconcile(t, obs.desired, proposal, self.min_replicas, self.max_replicas)
        return None if new == obs.desired else new
