"""Kubernetes HPA on queue depth: vLLM's ``vllm:num_requests_waiting`` per replica.

What LLM deployments scale on in practice (vLLM's production-stack and
KServe examples, GKE's guide for LLM inference autoscaling): the engines'
waiting-request gauge, exported through Prometheus and a metrics adapter as a
``Pods`` metric with an ``AverageValue`` target.  The HPA mechanics are those
of :mod:`sim.baselines.hpa` (ratio rule with tolerance, pods without a metric
at the target on a scale-down and at 0 on a scale-up, the legacy path when the
HPA has no ``behavior``, a 15 s sync); only the metric and its target differ.

Metric mapping: the per-pod value is ``obs.queue_len / replicas_ready``
(requests waiting for a batch slot on the ready replicas; a starting replica
exports nothing yet).  Requests held at a zone with no ready replica are in no
engine's gauge, so this HPA does not see them (no activator in front of it).
The gauge is smoothed over ``smoothing_window_s`` (30 s) as the adapter's
``avg_over_time`` query would.

Target (derived from the profiled capacity, like every peer's): by Little's
law on the waiting room, ``Lq = lambda x Wq``.  At the profiled capacity
(``lambda = replica_capacity_rps`` per replica) with a mean wait of
``wait_budget_fraction`` (0.5) of the TTFT SLO -- the rest of the SLO is the
prefill itself and the tail above the mean -- the ``AverageValue`` target is
``replica_capacity_rps x 0.5 x slo_ttft_s`` waiting requests per replica
(1.5 on azure-conv: 3.05 req/s x 0.5 s).  ``target_waiting`` overrides it.

Sources: kubernetes/kubernetes ``pkg/controller/podautoscaler/replica_calculator.go``
(``GetMetricReplicas`` -> ``calcPlainMetricReplicas``); vLLM metrics
(``vllm:num_requests_waiting``, https://docs.vllm.ai/en/latest/design/metrics.html);
https://cloud.google.com/kubernetes-engine/docs/best-practices/machine-learning/inference/autoscaling
(queue size as the recommended LLM autoscaling metric).

Examples
--------
>>> from sim.baselines.base import Observation
>>> hq = HpaQueueDepth(replica_capacity_rps=2.0)  # target 2 req/s x 0.5 x 1 s = 1 waiting per replica
>>> obs = Observation(t_s=0.0, zone="az-a", model="m", replicas_ready=4, replicas_starting=0,
...                   desired=4, ongoing_requests=40, queue_len=12, arrival_rate_rps=0.0,
...                   gpu_util=1.0, window=None)
>>> hq.decide(obs)  # 3 waiting per replica / 1 -> ceil(3 x 4) = 12, legacy limit max(2 x 4, 4) = 8
8
"""

from __future__ import annotations

from dataclasses import dataclass

from core.defaults import ITL_SLO_MS, MAX_REPLICAS, MIN_REPLICAS, TTFT_SLO_MS
from sim.baselines.base import BaselineParameterError, Observation, check, positive
from sim.baselines.hpa import HorizontalPodAutoscaler, HpaParams

__all__ = ["HpaQueueDepth", "HpaQueueParams"]


@dataclass(frozen=True)
class HpaQueueParams:
    """``target_waiting`` None = Little's law from the profiled capacity (module docstring)."""

    target_waiting: float | None = None
    wait_budget_fraction: float = 0.5
    hpa: HpaParams = HpaParams()

    def __post_init__(self) -> None:
        if self.target_waiting is not None:
            positive("target_waiting", self.target_waiting)
        check(
            0 < self.wait_budget_fraction <= 1,
            "wait_budget_fraction",
            self.wait_budget_fraction,
            "must lie in (0, 1]",
        )


class HpaQueueDepth(HorizontalPodAutoscaler):
    """Kubernetes HPA on waiting requests per replica (see the module docstring)."""

    name = "hpa-queue"

    def __init__(
        self,
        params: HpaQueueParams | None = None,
        *,
        min_replicas: int = MIN_REPLICAS,
        max_replicas: int = MAX_REPLICAS,
        slo_ttft_ms: float = TTFT_SLO_MS,
        slo_itl_ms: float = ITL_SLO_MS,
        replica_capacity_rps: float | None = None,
    ) -> None:
        q = params or HpaQueueParams()
        super().__init__(
            q.hpa,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            slo_ttft_ms=slo_ttft_ms,
            slo_itl_ms=slo_itl_ms,
            replica_capacity_rps=replica_capacity_rps,
        )
        self.queue_params = q
        if q.target_waiting is not None:
            self.target_waiting = float(q.target_waiting)
        elif replica_capacity_rps is None:
            raise BaselineParameterError(
                "replica_capacity_rps",
                None,
                "required unless target_waiting is set: the target is capacity x wait budget (Little's law)",
            )
        else:
            self.target_waiting = replica_capacity_rps * q.wait_budget_fraction * self.slo_ttft_ms / 1000.0

    def metric(self, obs: Observation) -> float:
        """``vllm:num_requests_waiting`` averaged over the ready replicas."""
        return obs.queue_len / obs.replicas_ready if obs.replicas_ready > 0 else 0.0

    def target(self) -> float:
        """The ``AverageValue`` target (waiting requests per replica)."""
        return self.target_waiting
