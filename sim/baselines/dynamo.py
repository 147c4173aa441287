"""NVIDIA Dynamo planner: load-based (reactive, +-1) and throughput-based (predictive) modes.

Re-implemented from ai-dynamo/dynamo ``components/src/dynamo/planner`` (not copied):

**Load-based mode** (``core/load_scaling.py``, SLA optimisation target, agg mode),
every ``load_adjustment_interval`` (5 s, ``config/defaults.py``):

* No decision while a previous scaling is in progress (ready != target) or
  while the latency regressions have fewer than ``load_min_observations`` (5)
  samples; at most ``max_num_fpm_samples`` (64) samples are kept.
* Latency is *estimated* by regressions on per-engine load (TTFT on queued
  prefill work, ITL on scheduled + queued decode KV), evaluated at the load
  the engines carry now.
* ``_scale_decision``: **+1** replica if the estimate is above the SLA
  (every engine above it); otherwise **-1** if scale-down is safe; else no change.
* Scale-down is consolidation-aware: the load is multiplied by
  ``N / (N - 1)`` and re-estimated.  TTFT: the queue-induced part
  (``est - T_own``, ``T_own`` = estimate at zero queue) must stay below
  ``(SLA - T_own) * sensitivity``; ITL: the estimate must stay below
  ``SLA * sensitivity``; ``load_scaling_down_sensitivity`` is 80 %.
* Agg combination (``_advance_load_agg``): prefill scale-up wins, then decode
  scale-up, scale-down only when both sides allow it; ``min_endpoint`` (1) floor.

**Throughput-based mode** (``core/throughput_scaling.py``,
``core/load/predictors.py``), every ``throughput_adjustment_interval`` (180 s):
the request count of the last interval is fed to a load predictor (leading
zeros skipped), the next interval is forecast, ``demand_rps = next_num_req /
interval`` and ``replicas = max(ceil(demand_rps / engine_rps), min_endpoint)``,
``engine_rps`` being what one engine sustains within the SLA (from profiling).
Dynamo's default predictor is ARIMA (``pmdarima``), which this project does not
depend on; implemented are ``constant`` (last value) and ``kalman`` (Dynamo's
local-linear-trend Kalman filter, ``q_level`` 1.0, ``q_trend`` 0.1, ``r`` 10.0).
Dynamo enables throughput scaling by default and load scaling on request; here
each mode is its own baseline.

Metric mapping: Dynamo reads per-engine forward-pass metrics; the simulator
exposes zone aggregates, so the zone is treated as engines that share load
evenly.  Regression samples come from each new closed window: TTFT
``window["ttft_p95_ms"]`` against ``queue_len_mean`` (mean queued requests per
replica, standing in for queued prefill tokens) and ITL ``window["itl_p95_ms"]``
against ``running_mean + queue_len_mean`` (standing in for scheduled + queued
decode KV); both are least-squares lines.  "Now" is ``obs.queue_len /
ready`` and ``obs.ongoing_requests / ready``.  Dynamo's KV-cache feasibility
check and prefix-hit discounting are not modelled.  Throughput mode integrates
``obs.arrival_rate_rps`` (arrivals over the last second) every
``sample_period_s`` into the interval's request count; ``engine_rps`` is the
harness's ``replica_capacity_rps`` (required).

Sources: ai-dynamo/dynamo ``components/src/dynamo/planner/core/load_scaling.py``,
``core/throughput_scaling.py``, ``core/load/predictors.py``, ``config/defaults.py``;
https://docs.nvidia.com/dynamo/latest/architecture/sla_planner.html

Examples
--------
>>> from sim.baselines.base import Observation
>>> th = DynamoThroughputPlanner(DynamoThroughputParams(adjustment_interval_s=10.0,
...                                                     sample_period_s=1.0),
...                              replica_capacity_rps=4.0)
>>> outs = [th.decide(Observation(t_s=float(t), zone="az-a", model="m", replicas_ready=1,
...         replicas_starting=0, desired=1, ongoing_requests=0, queue_len=0,
...         arrival_rate_rps=10.0, gpu_util=0.5, window=None)) for t in range(11)]
>>> outs[-1]  # 100 requests in 10 s -> 10 rps forecast / 4 rps per replica -> 3
3
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

from sim.baselines.base import (
    BaselineBase,
    BaselineParameterError,
    Observation,
    check,
    non_negative,
    positive,
)

__all__ = [
    "DynamoLoadParams",
    "DynamoLoadPlanner",
    "DynamoThroughputParams",
    "DynamoThroughputPlanner",
    "KalmanTrend",
    "LinearFit",
]


class LinearFit:
    """Least-squares line ``y = a + b x`` over the last ``max_samples`` points."""

    def __init__(self, max_samples: int = 64) -> None:
        self.xs: deque[float] = deque(maxlen=max_samples)
        self.ys: deque[float] = deque(maxlen=max_samples)

    def add(self, x: float, y: float) -> None:
        """Add one observation."""
        self.xs.append(float(x))
        self.ys.append(float(y))

    def __len__(self) -> int:
        return len(self.xs)

    def predict(self, x: float) -> float:
        """Estimate at ``x``; a flat line at the mean when ``x`` never varied.

        >>> f = LinearFit()
        >>> for x in (0.0, 1.0, 2.0):
        ...     f.add(x, 100.0 + 50.0 * x)
        >>> round(f.predict(4.0), 6)
        300.0
        """
        xs, ys = np.asarray(self.xs), np.asarray(self.ys)
        mx, my = float(xs.mean()), float(ys.mean())
        var = float(((xs - mx) ** 2).sum())
        slope = float(((xs - mx) * (ys - my)).sum()) / var if var > 1e-12 else 0.0
        return my + slope * (x - mx)


@dataclass(frozen=True)
class DynamoLoadParams:
    """Load-based planner settings (``config/defaults.py``); SLAs ``None`` -> the run's SLOs."""

    adjustment_interval_s: float = 5.0
    scaling_down_sensitivity: float = 80.0
    min_observations: int = 5
    max_samples: int = 64
    ttft_sla_ms: float | None = None
    itl_sla_ms: float | None = None

    def __post_init__(self) -> None:
        positive("adjustment_interval_s", self.adjustment_interval_s)
        check(
            0 <= self.scaling_down_sensitivity <= 100,
            "scaling_down_sensitivity",
            self.scaling_down_sensitivity,
            "must lie in [0, 100]",
        )
        check(
            isinstance(self.min_observations, int) and self.min_observations >= 2,
            "min_observations",
            self.min_observations,
            "must be an integer >= 2",
        )
        check(
            isinstance(self.max_samples, int) and self.max_samples >= self.min_observations,
            "max_samples",
            self.max_samples,
            "must be an integer >= min_observations",
        )
        if self.ttft_sla_ms is not None:
            positive("ttft_sla_ms", self.ttft_sla_ms)
        if self.itl_sla_ms is not None:
            positive("itl_sla_ms", self.itl_sla_ms)


class DynamoLoadPlanner(BaselineBase):
    """Dynamo load-based planner, agg mode, on TTFT and ITL (see the module docstring)."""

    name = "dynamo-load"

    def __init__(
        self,
        params: DynamoLoadParams | None = None,
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
        self.params = p = params or DynamoLoadParams()
        self.period_s = p.adjustment_interval_s
        self.ttft_sla_ms = p.ttft_sla_ms if p.ttft_sla_ms is not None else self.slo_ttft_ms
        self.itl_sla_ms = p.itl_sla_ms if p.itl_sla_ms is not None else self.slo_itl_ms
        self.ttft_fit = LinearFit(p.max_samples)
        self.itl_fit = LinearFit(p.max_samples)
        self.last_window_end_ms: float | None = None

    def _observe(self, obs: Observation) -> None:
        w = obs.window
        if w is None or w.get("window_end_ms") is None:
            return
        end = float(w["window_end_ms"])
        if self.last_window_end_ms is not None and end <= self.last_window_end_ms:
            return
        self.last_window_end_ms = end
        q, r = w.get("queue_len_mean"), w.get("running_mean")
        if q is None or r is None:
            return
        if w.get("ttft_p95_ms") is not None:
            self.ttft_fit.add(float(q), float(w["ttft_p95_ms"]))
        if w.get("itl_p95_ms") is not None:
            self.itl_fit.add(float(q) + float(r), float(w["itl_p95_ms"]))

    def _side(self, fit: LinearFit, x_now: float, sla: float, n: int, *, own_cost: bool) -> int:
        """``_scale_decision`` for one latency: n + 1, n - 1 or n."""
        est = fit.predict(x_now)
        if est > sla:
            return n + 1
        if n <= 1:
            return n
        sens = self.params.scaling_down_sensitivity / 100.0
        post = fit.predict(x_now * n / (n - 1))
        if own_cost:
            t_own = fit.predict(0.0)
            budget = (sla - t_own) * sens
            safe = budget > 0 and post - t_own < budget
        else:
            safe = post < sla * sens
        return n - 1 if safe else n

    def decide(self, obs: Observation) -> int | None:
        """One load-based adjustment: +1, -1 or no change."""
        self._observe(obs)
        n = obs.replicas_ready
        if n == 0 or n != obs.desired or obs.replicas_starting > 0:
            return None  # scaling in progress: observe only
        m = self.params.min_observations
        if len(self.ttft_fit) < m or len(self.itl_fit) < m:
            return None  # regression has insufficient data
        p_des = self._side(self.ttft_fit, obs.queue_len / n, self.ttft_sla_ms, n, own_cost=True)
        d_des = self._side(self.itl_fit, obs.ongoing_requests / n, self.itl_sla_ms, n, own_cost=False)
        if p_des > n or d_des > n:
            desired = n + 1
        elif p_des < n and d_des < n:
            desired = n - 1
        else:
            desired = n
        return self.changed(obs, max(desired, 1))


class KalmanTrend:
    """Local-linear-trend Kalman filter (level, trend), as Dynamo's ``KalmanPredictor``.

    >>> k = KalmanTrend()
    >>> for v in (10.0, 20.0, 30.0, 40.0):
    ...     k.update(v)
    >>> 40.0 < k.predict() < 60.0
    True
    """

    def __init__(self, q_level: float = 1.0, q_trend: float = 0.1, r: float = 10.0) -> None:
        self.F = np.array([[1.0, 1.0], [0.0, 1.0]])
        self.H = np.array([[1.0, 0.0]])
        self.Q = np.diag([max(1e-12, q_level), max(1e-12, q_trend)])
        self.R = np.array([[max(1e-9, r)]])
        self.x = np.zeros((2, 1))
        self.P = np.eye(2) * 1000.0
        self.initialized = False
        self.cached: float | None = None

    def _predict_step(self) -> None:
        self.x = self.F @ self.x
        self.P = self.F @ self.P @ self.F.T + self.Q

    def update(self, z: float) -> None:
        """Absorb one observation (predicting first unless a forecast already did)."""
        if not self.initialized:
            self.x = np.array([[z], [0.0]])
            self.initialized = True
        else:
            if self.cached is None:
                self._predict_step()
            y = np.array([[z]]) - self.H @ self.x
            S = self.H @ self.P @ self.H.T + self.R
            K = self.P @ self.H.T @ np.linalg.inv(S)
            self.x = self.x + K @ y
            ikh = np.eye(2) - K @ self.H
            self.P = ikh @ self.P @ ikh.T + K @ self.R @ K.T  # Joseph form
        self.cached = None

    def predict(self) -> float:
        """One-step-ahead level forecast (cached until the next update)."""
        if self.cached is None:
            self._predict_step()
            self.cached = float(self.x[0, 0])
        return self.cached


@dataclass(frozen=True)
class DynamoThroughputParams:
    """Throughput-based planner settings (``config/defaults.py``)."""

    adjustment_interval_s: float = 180.0
    predictor: Literal["constant", "kalman"] = "constant"
    kalman_q_level: float = 1.0
    kalman_q_trend: float = 0.1
    kalman_r: float = 10.0
    sample_period_s: float = 1.0

    def __post_init__(self) -> None:
        positive("adjustment_interval_s", self.adjustment_interval_s)
        check(
            self.predictor in ("constant", "kalman"),
            "predictor",
            self.predictor,
            "must be 'constant' or 'kalman' (ARIMA/Prophet need dependencies)",
        )
        non_negative("kalman_q_level", self.kalman_q_level)
        non_negative("kalman_q_trend", self.kalman_q_trend)
        positive("kalman_r", self.kalman_r)
        positive("sample_period_s", self.sample_period_s)
        check(
            self.sample_period_s <= self.adjustment_interval_s,
            "sample_period_s",
            self.sample_period_s,
            "must not exceed adjustment_interval_s",
        )


class DynamoThroughputPlanner(BaselineBase):
    """Dynamo throughput-based planner (see the module docstring)."""

    name = "dynamo-throughput"

    def __init__(
        self,
        params: DynamoThroughputParams | None = None,
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
        if replica_capacity_rps is None:
            raise BaselineParameterError(
                "replica_capacity_rps",
                None,
                "required: the per-replica rate within the SLA (Dynamo takes it from profiling)",
            )
        self.capacity_rps = float(replica_capacity_rps)
        self.params = p = params or DynamoThroughputParams()
        self.period_s = p.sample_period_s
        self.kalman = KalmanTrend(p.kalman_q_level, p.kalman_q_trend, p.kalman_r)
        self.history: list[float] = []  # request counts per interval (predictor buffer)
        self.seen_nonzero = False
        self.interval_start_s: float | None = None
        self.last_t_s: float | None = None
        self.count = 0.0

    def _add(self, num_req: float) -> None:
        if not math.isfinite(num_req):
            num_req = 0.0
        if num_req == 0 and not self.seen_nonzero:
            return  # skip the leading idle period
        self.seen_nonzero = self.seen_nonzero or num_req != 0
        self.history.append(num_req)
        if self.params.predictor == "kalman":
            self.kalman.update(num_req)

    def predict_next(self) -> float:
        """Forecast of the next interval's request count."""
        if not self.history:
            return 0.0
        if self.params.predictor == "kalman":
            return max(0.0, self.kalman.predict())
        return self.history[-1]

    def decide(self, obs: Observation) -> int | None:
        """Accumulate arrivals; at each interval end forecast and size the fleet."""
        p, t = self.params, obs.t_s
        if self.interval_start_s is None:
            self.interval_start_s = self.last_t_s = t
            return None
        assert self.last_t_s is not None
        dt = max(0.0, min(t - self.last_t_s, 2.0 * p.sample_period_s))
        self.count += max(0.0, obs.arrival_rate_rps) * dt
        self.last_t_s = t
        elapsed = t - self.interval_start_s
        if elapsed < p.adjustment_interval_s - 1e-9:
            return None
        self._add(self.count)
        self.count, self.interval_start_s = 0.0, t
        demand_rps = self.predict_next() / elapsed
        desired = max(math.ceil(demand_rps / self.capacity_rps), 1)
        return self.changed(obs, desired)
