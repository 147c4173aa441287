"""Baseline autoscalers the benchmark compares governor against.

Each baseline re-implements a production autoscaler's documented algorithm and
defaults (sources are cited in each module) behind one interface,
:class:`~sim.baselines.base.Autoscaler`.  ``BASELINES`` maps a name to a
constructor with the common signature ``Cls(params=None, **harness)``: the
peer's own parameters, then the :class:`~sim.baselines.base.Harness` keywords
that :class:`~sim.baselines.base.BaselineBase` alone names and checks
(``min_replicas=1, max_replicas=64, slo_ttft_ms=1000.0, slo_itl_ms=150.0,
replica_capacity_rps=None``).

=====================  =============================================  =======================================
name                   system                                         signal
=====================  =============================================  =======================================
``static``             fixed N replicas                               none
``hpa``                Kubernetes HPA (autoscaling/v2)                GPU utilisation (30 s mean)
``hpa-queue``          Kubernetes HPA on vLLM queue depth             waiting requests per replica
``keda``               KEDA Prometheus trigger -> HPA                 window P95 TTFT
``kpa``                Knative Pod Autoscaler                         in-flight requests
``rayserve``           Ray Serve default policy                       ongoing requests
``dynamo-load``        NVIDIA Dynamo planner, load-based              TTFT / ITL estimates + throughput floor
``dynamo-throughput``  NVIDIA Dynamo planner, throughput-based        forecast arrival rate
=====================  =============================================  =======================================

Per-replica targets are derived from the profiled capacity the harness passes
(``replica_capacity_rps``) for every peer that has one: Little's law for KPA
and Ray Serve (the requests in flight per replica at that capacity, one
profile trial per model: :func:`sim.baselines.derived.profiled_concurrency`)
and for the queue-depth HPA; the capacity itself for Dynamo's throughput sizing.

Examples
--------
>>> sorted(BASELINES)
['dynamo-load', 'dynamo-throughput', 'hpa', 'hpa-queue', 'keda', 'kpa', 'rayserve', 'static']
>>> BASELINES["hpa"](max_replicas=8).sync_period_s
15.0
"""

from __future__ import annotations

from collections.abc import Callable

from sim.baselines.base import (
    Autoscaler,
    BaselineBase,
    BaselineParameterError,
    Observation,
)
from sim.baselines.dynamo import (
    DynamoLoadParams,
    DynamoLoadPlanner,
    DynamoThroughputParams,
    DynamoThroughputPlanner,
)
from sim.baselines.hpa import HorizontalPodAutoscaler, HpaParams
from sim.baselines.hpa_queue import HpaQueueDepth, HpaQueueParams
from sim.baselines.keda import KedaParams, KedaPrometheus
from sim.baselines.kpa import KnativePodAutoscaler, KpaParams
from sim.baselines.rayserve import RayServeAutoscaler, RayServeParams
from sim.baselines.static import StaticParams, StaticReplicas

__all__ = [
    "BASELINES",
    "Autoscaler",
    "BaselineBase",
    "BaselineParameterError",
    "DynamoLoadParams",
    "DynamoLoadPlanner",
    "DynamoThroughputParams",
    "DynamoThroughputPlanner",
    "HorizontalPodAutoscaler",
    "HpaParams",
    "HpaQueueDepth",
    "HpaQueueParams",
    "KedaParams",
    "KedaPrometheus",
    "KnativePodAutoscaler",
    "KpaParams",
    "Observation",
    "RayServeAutoscaler",
    "RayServeParams",
    "StaticParams",
    "StaticReplicas",
]

BASELINES: dict[str, Callable[..., Autoscaler]] = {
    "static": StaticReplicas,
    "hpa": HorizontalPodAutoscaler,
    "hpa-queue": HpaQueueDepth,
    "keda": KedaPrometheus,
    "kpa": KnativePodAutoscaler,
    "rayserve": RayServeAutoscaler,
    "dynamo-load": DynamoLoadPlanner,
    "dynamo-throughput": DynamoThroughputPlanner,
}
