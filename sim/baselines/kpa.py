"""Knative Pod Autoscaler (KPA) on request concurrency, with stable and panic modes.

Algorithm (re-implemented from ``pkg/autoscaler/scaling/autoscaler.go``, ``Scale``):

* Every tick (``tick-interval``, 2 s) the autoscaler reads the revision's
  total concurrency averaged over the *stable* window (``stable-window``
  60 s) and over the *panic* window (``panic-window-percentage`` 10 % of the
  stable window = 6 s).
* ``ready = max(1, ready_pods)``; ``maxScaleUp = ceil(max-scale-up-rate *
  ready)`` (rate 1000); ``maxScaleDown = floor(ready / max-scale-down-rate)``
  (rate 2, i.e. at most halve per decision).
* ``dspc = ceil(stable / TargetValue)``, ``dppc = ceil(panic / TargetValue)``
  with ``TargetValue = target * target-utilization`` (``container-concurrency-target-default``
  100, ``container-concurrency-target-percentage`` 70 %); both are clamped
  into ``[maxScaleDown, maxScaleUp]``.
* Panic starts when ``dppc / ready >= panic-threshold`` (200 % -> 2.0) and is
  extended on every tick that is still over; it ends once a tick is under the
  threshold and the last over-threshold tick is more than one stable window
  ago.  While panicking the desired count is ``max(stable, panic)`` and is
  never lowered (``maxPanicPods`` ratchets up).  A new autoscaler starts in
  panic when more than one pod is ready (it has no metric history).
* ``scale-down-delay`` (default 0 s): the maximum desired count over that
  trailing window is applied.  Min/max scale bounds are applied by the
  PodAutoscaler reconciler afterwards.

Metric mapping: Knative's concurrency is the number of in-flight requests at
the queue-proxy (queued + being served) per pod, summed over the revision,
plus the requests the activator holds while no pod is ready; that is
``obs.ongoing_requests + obs.zone_queued`` of the zone, sampled every tick and
averaged over the windows (mean of the samples in the window; Knative averages
1 s buckets).

Target: 100 is Knative's default for HTTP services, where a request holds a
container only briefly.  Here the per-replica concurrency target is derived
from the same profiled capacity governor, static and Dynamo get, by Little's
law: ``target_concurrency = replica_capacity_rps x W``, ``W`` the mean time a
request spends in a replica (served, not queued), measured once per model on
a light profile trial (:func:`sim.baselines.derived.profiled_concurrency`; the
benchmarks pass it as ``target_concurrency``, so every zone gets the same
one).  Knative's default 70 % utilisation applies on top, as it would for a
user who sets ``containerConcurrency`` from a load test.  With
``target_concurrency=None`` and a capacity each autoscaler measures ``W`` on
its own zone's windows instead (:class:`~sim.baselines.base.LittleTarget`;
it holds until the first window measures it): a harness without a profile
trial; two zones of one run can then derive different targets.

Sources: knative/serving ``pkg/autoscaler/scaling/autoscaler.go``,
``pkg/autoscaler/config/config.go`` (defaults); https://knative.dev/docs/serving/autoscaling/kpa-specific/
(stable / panic windows, panic threshold) and https://knative.dev/docs/serving/autoscaling/concurrency/.

Examples
--------
>>> from sim.baselines.base import Observation
>>> kpa = KnativePodAutoscaler(KpaParams(target_concurrency=10.0, target_utilization=1.0))
>>> obs = Observation(t_s=0.0, zone="az-a", model="m", replicas_ready=1, replicas_starting=0,
...                   desired=1, ongoing_requests=25, queue_len=0, arrival_rate_rps=0.0,
...                   gpu_util=0.9, window=None)
>>> kpa.decide(obs)  # ceil(25 / 10) = 3 pods; 3 / 1 >= 2.0 also enters panic
3
>>> kpa.panicking
True
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Unpack

from sim.baselines.base import BaselineBase, Harness, LittleTarget, Observation, check, non_negative, positive

__all__ = ["KnativePodAutoscaler", "KpaParams"]


@dataclass(frozen=True)
class KpaParams:
    """KPA configuration (``config-autoscaler`` keys in comments)."""

    target_concurrency: float | None = None  # container-concurrency-target-default; None = Little's law
    target_utilization: float = 0.70  # container-concurrency-target-percentage / 100
    stable_window_s: float = 60.0  # stable-window
    panic_window_percentage: float = 10.0  # panic-window-percentage
    panic_threshold_percentage: float = 200.0  # panic-threshold-percentage
    max_scale_up_rate: float = 1000.0  # max-scale-up-rate
    max_scale_down_rate: float = 2.0  # max-scale-down-rate
    scale_down_delay_s: float = 0.0  # scale-down-delay
    tick_interval_s: float = 2.0  # tick-interval

    def __post_init__(self) -> None:
        if self.target_concurrency is not None:
            positive("target_concurrency", self.target_concurrency)
        check(0 < self.target_utilization <= 1, "target_utilization", self.target_utilization, "must lie in (0, 1]")
        check(
            6.0 <= self.stable_window_s <= 3600.0,
            "stable_window_s",
            self.stable_window_s,
            "must lie in [6 s, 1 h] (Knative's bounds)",
        )
        check(
            1.0 <= self.panic_window_percentage <= 100.0,
            "panic_window_percentage",
            self.panic_window_percentage,
            "must lie in [1, 100]",
        )
        check(
            110.0 <= self.panic_threshold_percentage <= 1000.0,
            "panic_threshold_percentage",
            self.panic_threshold_percentage,
            "must lie in [110, 1000]",
        )
        check(self.max_scale_up_rate > 1.0, "max_scale_up_rate", self.max_scale_up_rate, "must be > 1")
        check(self.max_scale_down_rate > 1.0, "max_scale_down_rate", self.max_scale_down_rate, "must be > 1")
        non_negative("scale_down_delay_s", self.scale_down_delay_s)
        positive("tick_interval_s", self.tick_interval_s)

    @property
    def target_value(self) -> float | None:
        """Per-pod concurrency the autoscaler aims for (``TargetValue``), None = from the capacity."""
        if self.target_concurrency is None:
            return None
        return self.target_concurrency * self.target_utilization

    @property
    def panic_window_s(self) -> float:
        """Length of the panic window."""
        return self.stable_window_s * self.panic_window_percentage / 100.0


class KnativePodAutoscaler(BaselineBase):
    """Knative KPA on zone concurrency (see the module docstring)."""

    name = "kpa"

    def __init__(self, params: KpaParams | None = None, **harness: Unpack[Harness]) -> None:
        super().__init__(**harness)
        self.params = params or KpaParams()
        self.period_s = self.params.tick_interval_s
        self.samples: deque[tuple[float, float]] = deque()
        self.delay_window: deque[tuple[float, int]] = deque()
        self.panic_time_s: float | None = None
        self.max_panic_pods = 0
        self.started = False
        self.little = LittleTarget(self.replica_capacity_rps) if self.replica_capacity_rps is not None else None

    def target_value(self) -> float | None:
        """``TargetValue`` now: the fixed one, or Little's law x utilisation; None = not measured yet."""
        fixed = self.params.target_value
        if fixed is not None:
            return fixed
        if self.little is None:
            raise ValueError("kpa: target_concurrency=None needs replica_capacity_rps (Little's law)")
        per_replica = self.little.value()
        return None if per_replica is None else max(1e-9, per_replica) * self.params.target_utilization

    @property
    def panicking(self) -> bool:
        """Whether the autoscaler is in panic mode."""
        return self.panic_time_s is not None

    def _averages(self, t_s: float) -> tuple[float, float]:
        p = self.params
        while self.samples and self.samples[0][0] <= t_s - p.stable_window_s:
            self.samples.popleft()
        stable = [c for _, c in self.samples]
        panic = [c for ts, c in self.samples if ts > t_s - p.panic_window_s]
        return sum(stable) / len(stable), sum(panic) / len(panic)

    def start(self, t_s: float, ready: int) -> None:
        """``newAutoscaler``: with more than one ready pod it starts in panic mode."""
        self.started = True
        if ready > 1:
            self.panic_time_s, self.max_panic_pods = t_s, ready

    def scale(self, t_s: float, stable: float, panic: float, ready_pods: int, target_value: float) -> int:
        """``Scale``: the desired pod count from the window averages (no min/max bounds)."""
        p, t = self.params, t_s
        ready = float(max(1, ready_pods))
        max_up = math.ceil(p.max_scale_up_rate * ready)
        max_down = math.floor(ready / p.max_scale_down_rate)
        dspc = math.ceil(stable / target_value)
        dppc = math.ceil(panic / target_value)
        desired_stable = int(min(max(dspc, max_down), max_up))
        desired_panic = int(min(max(dppc, max_down), max_up))

        over = dppc / ready >= p.panic_threshold_percentage / 100.0
        if over:
            self.panic_time_s = t  # begin or extend panic
        elif self.panic_time_s is not None and self.panic_time_s + p.stable_window_s < t:
            self.panic_time_s, self.max_panic_pods = None, 0  # un-panic

        desired = desired_stable
        if self.panic_time_s is not None:
            desired = max(desired, desired_panic)
            self.max_panic_pods = max(self.max_panic_pods, desired)
            desired = self.max_panic_pods  # never scale down while panicking

        if p.scale_down_delay_s > 0:
            while self.delay_window and self.delay_window[0][0] <= t - p.scale_down_delay_s:
                self.delay_window.popleft()
            self.delay_window.append((t, desired))
            desired = max(d for _, d in self.delay_window)
        return desired

    def decide(self, obs: Observation) -> int | None:
        """One KPA tick (``Scale``) followed by the min/max scale bounds."""
        t = obs.t_s
        if not self.started:
            self.start(t, obs.replicas_ready)
        if self.little is not None:
            self.little.observe(obs.window)
        # the activator counts requests it holds while no pod is ready
        self.samples.append((t, float(obs.ongoing_requests + obs.zone_queued)))
        stable, panic = self._averages(t)
        target = self.target_value()
        if target is None:
            return None  # per-replica target not measured yet: hold
        return self.changed(obs, self.scale(t, stable, panic, obs.replicas_ready, target))
