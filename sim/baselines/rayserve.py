"""Ray Serve's default autoscaling policy (target ongoing requests + delays).

Algorithm (re-implemented from ``python/ray/serve/autoscaling_policy.py``):

* Replicas record their ongoing requests (queued at the replica + executing)
  and push them to the controller every ``metrics_interval_s`` (10 s); the
  controller averages what it has over ``look_back_period_s`` (30 s) into
  ``total_num_requests``.
* Core policy (``replica_queue_length_autoscaling_policy``):
  ``desired = running * total / (target_ongoing_requests * running)`` (a float).
* Scaling factors (``_apply_scaling_factors``):
  ``ceil(running + factor * (desired - running))`` with ``upscaling_factor`` /
  ``downscaling_factor`` (default ``None`` -> ``smoothing_factor`` 1.0); a
  scale-down stuck at ``running`` by the factor is forced one lower.
* Bounds, then the delay logic (``_apply_delay_logic``) against the current
  *target*: a signed decision counter counts consecutive control-loop
  iterations that want up (+) or down (-), resets when the direction flips or
  the target is met, and the new count is applied only once the counter
  exceeds ``int(upscale_delay_s / loop)`` (30 s) resp.
  ``int(downscale_delay_s / loop)`` (600 s; ``downscale_to_zero_delay_s`` for
  1 -> 0).
* Cold start (``_get_cold_start_scale_up_replicas``): with no running replica
  and requests waiting, the target jumps to ``max(ceil(upscaling_factor), target)``
  at once.

Defaults from ``python/ray/serve/config.py`` (``AutoscalingConfig``) except
``target_ongoing_requests``: Ray's default is 2 (since Ray 2.32; 1 before),
chosen for request/response Python deployments.  An LLM replica runs a
continuous batch and its throughput grows with batch occupancy, so holding 2
per replica would provision many times the replicas needed; Ray's docs say to
set this value from the latency objective.  Here it is derived from the same
profiled capacity governor, static and Dynamo get, by Little's law:
``target_ongoing_requests = replica_capacity_rps x W``, ``W`` the mean time a
request spends in a replica (served, not queued), measured once per model on
a light profile trial (:func:`sim.baselines.derived.profiled_concurrency`; the
benchmarks pass it as ``target_ongoing_requests``, the same in every zone).
With ``None`` and a capacity each policy measures ``W`` on its own zone's
windows instead (:class:`~sim.baselines.base.LittleTarget`; it holds until
the first window measures it).  Ray's defaults for the delays stand: with
``downscale_delay_s`` 600 s a run of 600 s or less never scales down, so a
target above the load holds the start fleet whatever its value.  The control loop: Ray runs it every 0.1 s (``CONTROL_LOOP_INTERVAL_S``);
here every ``control_loop_interval_s`` (default 1 s) and the delay counters
count those periods, which keeps the delays in seconds.

Metric mapping: ``total_num_requests`` <- ``obs.ongoing_requests +
obs.zone_queued`` (queued + running in the zone's replicas, plus the requests
the handles hold while no replica is ready: Ray counts handle-side queued
requests), recorded each loop; ``running`` <- ``obs.replicas_ready``;
the current target <- ``obs.desired``.

Sources: ray-project/ray ``python/ray/serve/autoscaling_policy.py``,
``python/ray/serve/config.py``; https://docs.ray.io/en/latest/serve/advanced-guides/advanced-autoscaling.html

Examples
--------
>>> from sim.baselines.base import Observation
>>> rs = RayServeAutoscaler(RayServeParams(target_ongoing_requests=32.0, upscale_delay_s=0.0))
>>> obs = Observation(t_s=0.0, zone="az-a", model="m", replicas_ready=2, replicas_starting=0,
...                   desired=2, ongoing_requests=128, queue_len=0, arrival_rate_rps=0.0,
...                   gpu_util=0.9, window=None)
>>> rs.decide(obs)  # 128 ongoing / 32 per replica = 4
4
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Unpack

from sim.baselines.base import BaselineBase, Harness, LittleTarget, Observation, non_negative, positive

__all__ = ["RayServeAutoscaler", "RayServeParams"]


@dataclass(frozen=True)
class RayServeParams:
    """``AutoscalingConfig`` fields (Ray defaults except ``target_ongoing_requests``)."""

    target_ongoing_requests: float | None = None  # None = Little's law from the profiled capacity
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    smoothing_factor: float = 1.0
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    control_loop_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.target_ongoing_requests is not None:
            positive("target_ongoing_requests", self.target_ongoing_requests)
        non_negative("upscale_delay_s", self.upscale_delay_s)
        non_negative("downscale_delay_s", self.downscale_delay_s)
        if self.downscale_to_zero_delay_s is not None:
            non_negative("downscale_to_zero_delay_s", self.downscale_to_zero_delay_s)
        positive("metrics_interval_s", self.metrics_interval_s)
        positive("look_back_period_s", self.look_back_period_s)
        positive("smoothing_factor", self.smoothing_factor)
        if self.upscaling_factor is not None:
            positive("upscaling_factor", self.upscaling_factor)
        if self.downscaling_factor is not None:
            positive("downscaling_factor", self.downscaling_factor)
        positive("control_loop_interval_s", self.control_loop_interval_s)

    @property
    def up_factor(self) -> float:
        """``get_upscaling_factor``."""
        return self.upscaling_factor or self.smoothing_factor

    @property
    def down_factor(self) -> float:
        """``get_downscaling_factor``."""
        return self.downscaling_factor or self.smoothing_factor


class RayServeAutoscaler(BaselineBase):
    """Ray Serve default policy on zone ongoing requests (see the module docstring)."""

    name = "rayserve"

    def __init__(self, params: RayServeParams | None = None, **harness: Unpack[Harness]) -> None:
        super().__init__(**harness)
        self.params = params or RayServeParams()
        self.period_s = self.params.control_loop_interval_s
        self.pending: list[tuple[float, float]] = []  # recorded, not yet pushed
        self.store: deque[tuple[float, float]] = deque()  # what the controller has
        self.last_push_s: float | None = None
        self.decision_counter = 0
        self.little = LittleTarget(self.replica_capacity_rps) if self.replica_capacity_rps is not None else None

    def target_ongoing(self) -> float | None:
        """``target_ongoing_requests`` now: fixed, or Little's law; None = not measured yet."""
        if self.params.target_ongoing_requests is not None:
            return self.params.target_ongoing_requests
        if self.little is None:
            raise ValueError("rayserve: target_ongoing_requests=None needs replica_capacity_rps (Little's law)")
        v = self.little.value()
        return None if v is None else max(1e-9, v)

    def _total_requests(self, obs: Observation) -> float:
        """Record, push every ``metrics_interval_s``, average over the look-back period."""
        p, t = self.params, obs.t_s
        self.pending.append((t, float(obs.ongoing_requests + obs.zone_queued)))
        if self.last_push_s is None or t - self.last_push_s >= p.metrics_interval_s - 1e-9:
            self.store.extend(self.pending)
            self.pending = []
            self.last_push_s = t
        while self.store and self.store[0][0] <= t - p.look_back_period_s:
            self.store.popleft()
        if not self.store:
            return 0.0
        return sum(v for _, v in self.store) / len(self.store)

    def _apply_delay(self, desired: int, target: int) -> int:
        p, loop = self.params, self.params.control_loop_interval_s
        decision = target
        if desired > target:
            self.decision_counter = max(self.decision_counter, 0) + 1
            if self.decision_counter > int(p.upscale_delay_s / loop):
                self.decision_counter, decision = 0, desired
        elif desired < target:
            self.decision_counter = min(self.decision_counter, 0) - 1
            if target == 1 and p.downscale_to_zero_delay_s is not None:
                delay_s = p.downscale_to_zero_delay_s
            else:
                delay_s = p.downscale_delay_s
                if target != 1:
                    desired = max(1, desired)
            if self.decision_counter < -int(delay_s / loop):
                self.decision_counter, decision = 0, desired
        else:
            self.decision_counter = 0
        return decision

    def decide(self, obs: Observation) -> int | None:
        """One control-loop iteration of the default policy."""
        p = self.params
        if self.little is not None:
            self.little.observe(obs.window)
        total = self._total_requests(obs)
        running, target = obs.replicas_ready, obs.desired
        if running == 0:  # cold start fast path: no delay
            new = max(math.ceil(p.up_factor), target) if total > 0 else target
            return self.changed(obs, new)
        per_replica = self.target_ongoing()
        if per_replica is None:
            return None  # target not measured yet: hold
        return self.changed(obs, self.policy(total, running, target, per_replica))

    def policy(self, total: float, running: int, target: int, per_replica: float) -> int:
        """``replica_queue_length_autoscaling_policy`` with factors, bounds and delays (running > 0)."""
        p = self.params
        desired_f = total / per_replica  # = running * error_ratio
        delta = desired_f - running
        factor = p.up_factor if delta > 0 else p.down_factor
        scaled = math.ceil(running + factor * delta)
        if math.ceil(desired_f) < running and scaled == running:
            scaled -= 1
        bounded = self.clamp(scaled)
        return self._apply_delay(bounded, target)
