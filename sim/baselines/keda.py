"""KEDA ScaledObject with a Prometheus trigger on P95 TTFT, feeding an HPA.

How KEDA scales (re-implemented from its docs and source, not copied):

* The Prometheus scaler (``pkg/scalers/prometheus_scaler.go``) runs one PromQL
  query and returns a single value; an empty result or NaN is read as 0 when
  ``ignoreNullValues`` is true (the default).  ``threshold`` becomes the
  target of an HPA *External* metric; ``metricType`` defaults to
  ``AverageValue``.  The trigger is *active* while ``value >
  activationThreshold`` (default 0).
* The KEDA operator polls every ``pollingInterval`` (default 30 s) for
  activity.  With ``minReplicaCount = 0`` it scales 0 -> 1 as soon as a poll is
  active and back to 0 after ``cooldownPeriod`` (default 300 s) without
  activity; between 1 and max replicas the generated HPA decides.
* The HPA (see :mod:`sim.baselines.hpa`) evaluates External metrics every 15 s
  (``replica_calculator.go``): ``Value``: ``ratio = value / target``, within
  tolerance keep, else ``ceil(ratio * ready_pods)``; ``AverageValue``:
  ``ratio = value / (target * current)``, within tolerance keep, else
  ``ceil(value / target)``.  KEDA creates the HPA without a ``behavior``
  unless ``advanced.horizontalPodAutoscalerConfig`` sets one, so the HPA runs
  its legacy normalisation (max recommendation over 300 s, scale-up limit
  ``max(2 x current, 4)``; :mod:`sim.baselines.hpa_behavior`), not the
  documented default policies; ``scale_up`` / ``scale_down`` set a behaviour.
* By default the metrics adapter queries the scaler on every HPA request;
  with ``useCachedMetrics: true`` the HPA reads the value cached by the last
  poll.  This model follows the flag (default false, as in KEDA).

Metric mapping: the trigger's query is "P95 time to first token of the zone",
read from the latest closed window (``window["ttft_p95_ms"]``; ``None`` -> 0 as
with ``ignoreNullValues``), and ``threshold`` defaults to the run's TTFT SLO.
TTFT rather than end-to-end latency: e2e latency grows with the output length,
which the autoscaler cannot change, so a threshold on it is not an SLO on the
part scaling fixes.  ``metric_type`` defaults to ``"Value"`` although KEDA's
default is ``AverageValue``: ``AverageValue`` treats the query result as a
total to be split across pods (``replicas = ceil(p95 / threshold)``), which
for a latency quantile collapses the fleet to one replica whenever P95 is
under the threshold; an operator scaling on latency configures ``Value``.
Both are implemented.

Sources: kedacore/keda ``pkg/scalers/prometheus_scaler.go``;
https://keda.sh/docs/latest/scalers/prometheus/ ,
https://keda.sh/docs/latest/reference/scaledobject-spec/ (pollingInterval 30,
cooldownPeriod 300, useCachedMetrics); kubernetes/kubernetes
``pkg/controller/podautoscaler/replica_calculator.go`` (``GetExternalMetricReplicas``,
``GetExternalPerPodMetricReplicas``).

Examples
--------
>>> from sim.baselines.base import Observation
>>> k = KedaPrometheus(max_replicas=16)
>>> obs = Observation(t_s=0.0, zone="az-a", model="m", replicas_ready=4, replicas_starting=0,
...                   desired=4, ongoing_requests=0, queue_len=0, arrival_rate_rps=0.0,
...                   gpu_util=0.9, window={"ttft_p95_ms": 1500.0})
>>> k.decide(obs)  # Value: ceil(1500 / 1000 * 4) = 6
6
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from core.defaults import ITL_SLO_MS, MAX_REPLICAS, MIN_REPLICAS, TTFT_SLO_MS
from sim.baselines.base import BaselineBase, Observation, check, non_negative, positive
from sim.baselines.hpa_behavior import HpaBehavior, ScalingRules

__all__ = ["KedaParams", "KedaPrometheus", "external_metric_replicas"]


@dataclass(frozen=True)
class KedaParams:
    """ScaledObject + trigger settings; ``threshold_ms=None`` means the TTFT SLO."""

    threshold_ms: float | None = None
    activation_threshold_ms: float = 0.0
    metric_type: Literal["Value", "AverageValue"] = "Value"
    metric_key: str = "ttft_p95_ms"
    polling_interval_s: float = 30.0
    cooldown_period_s: float = 300.0
    use_cached_metrics: bool = False
    tolerance: float = 0.1
    hpa_sync_period_s: float = 15.0
    scale_up: ScalingRules | None = None  # None (both) = the HPA has no behavior: legacy path
    scale_down: ScalingRules | None = None
    downscale_stabilization_s: float = 300.0  # the controller flag the legacy path uses

    def __post_init__(self) -> None:
        if self.threshold_ms is not None:
            positive("threshold_ms", self.threshold_ms)
        non_negative("activation_threshold_ms", self.activation_threshold_ms)
        check(
            self.metric_type in ("Value", "AverageValue"),
            "metric_type",
            self.metric_type,
            "must be 'Value' or 'AverageValue'",
        )
        check(
            isinstance(self.metric_key, str) and bool(self.metric_key),
            "metric_key",
            self.metric_key,
            "must name a window key",
        )
        positive("polling_interval_s", self.polling_interval_s)
        non_negative("cooldown_period_s", self.cooldown_period_s)
        check(0 <= self.tolerance < 1, "tolerance", self.tolerance, "must lie in [0, 1)")
        positive("hpa_sync_period_s", self.hpa_sync_period_s)


def external_metric_replicas(
    value: float, target: float, metric_type: str, ready: int, current: int, tolerance: float = 0.1
) -> int | None:
    """HPA proposal for an External metric (``Value`` or ``AverageValue`` target).

    >>> external_metric_replicas(1500.0, 1000.0, "Value", ready=4, current=4)
    6
    >>> external_metric_replicas(1500.0, 1000.0, "AverageValue", ready=4, current=4)
    2
    """
    if metric_type == "AverageValue":
        ratio = value / (target * current) if current > 0 else math.inf
        if current > 0 and abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(value / target)
    ratio = value / target
    if current == 0:
        return math.ceil(ratio)
    if abs(1.0 - ratio) <= tolerance:
        return current
    if ready <= 0:
        return None  # "unable to calculate ready pods"
    return math.ceil(ratio * ready)


class KedaPrometheus(BaselineBase):
    """KEDA Prometheus trigger on window P95 TTFT driving an HPA (see the module docstring)."""

    name = "keda"

    def __init__(
        self,
        params: KedaParams | None = None,
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
        self.params = params or KedaParams()
        p = self.params
        self.threshold_ms = p.threshold_ms if p.threshold_ms is not None else self.slo_ttft_ms
        # the harness ticks at the HPA sync period; polls happen on ticks >= polling_interval apart
        self.period_s = min(p.hpa_sync_period_s, p.polling_interval_s)
        self.behavior = HpaBehavior(p.scale_up, p.scale_down, p.downscale_stabilization_s)
        self.last_poll_s: float | None = None
        self.last_hpa_s: float | None = None
        self.cached_value = 0.0
        self.last_active_s: float | None = None

    def _query(self, obs: Observation) -> float:
        """The trigger's query: the window metric, 0 when null (``ignoreNullValues``)."""
        v = obs.window.get(self.params.metric_key) if obs.window is not None else None
        if v is None or not math.isfinite(float(v)):
            return 0.0
        return float(v)

    def decide(self, obs: Observation) -> int | None:
        """Operator poll (activation, cooldown) and HPA sync, each on its own period."""
        p, t = self.params, obs.t_s
        current = obs.desired
        new = current
        eps = 1e-9
        if self.last_poll_s is None or t - self.last_poll_s >= p.polling_interval_s - eps:
            self.last_poll_s = t
            self.cached_value = self._query(obs)
            active = self.cached_value > p.activation_threshold_ms
            if active or self.last_active_s is None:
                self.last_active_s = t
            if current == 0 and active:
                new = max(1, self.min_replicas)  # 0 -> 1 (or to minReplicaCount)
            elif self.min_replicas == 0 and current > 0 and not active and t - self.last_active_s > p.cooldown_period_s:
                new = 0  # cooldown over: back to zero
        if (
            new == current
            and current > 0
            and (self.last_hpa_s is None or t - self.last_hpa_s >= p.hpa_sync_period_s - eps)
        ):
            self.last_hpa_s = t
            value = self.cached_value if p.use_cached_metrics else self._query(obs)
            proposal = external_metric_replicas(
                value, self.threshold_ms, p.metric_type, obs.replicas_ready, current, p.tolerance
            )
            new = self.behavior.reconcile(t, current, proposal, max(1, self.min_replicas), self.max_replicas)
        new = self.clamp(new)
        return None if new == current else new
