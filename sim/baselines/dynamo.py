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
* **Throughput floor**: Dynamo enables throughput scaling by default
  (``enable_throughput_scaling = True``) and, with load scaling on, the
  throughput planner's result is a *lower bound* on the load decision
  (``desired = max(desired, throughput_lower_bound)``, applied also when the
  load side sees no change).  Here the floor is the throughput planner below
  (same predictor, 180 s interval) whenever the harness gives a profiled
  capacity; ``throughput_floor=False`` runs the load side alone.

**Throughput-based mode** (``core/throughput_scaling.py``,
``core/load/predictors.py``), every ``throughput_adjustment_interval`` (180 s):
the request count of the last interval is fed to a load predictor (leading
zeros skipped), the next interval is forecast, ``demand_rps = next_num_req /
interval`` and ``replicas = max(ceil(demand_rps / engine_rps), min_endpoint)``,
``engine_rps`` being what one engine sustains within the SLA (from profiling).
The predictor defaults to Dynamo's default, ``arima``
(:mod:`sim.baselines.dynamo_predictors`: Dynamo's guards, then ARIMA(1,1,0)
with drift in place of ``pmdarima.auto_arima``); ``constant`` and ``kalman``
are the other choices.  ``dynamo-throughput`` is Dynamo's default deployment
(throughput scaling only); ``dynamo-load`` is load scaling turned on, with the
throughput floor it runs with upstream.

Metric mapping: Dynamo reads per-engine forward-pass metrics; the simulator
exposes zone aggregates, so the zone is treated as engines that share load
evenly.  Dynamo regresses per-forward-pass latencies, i.e. a mean-like
estimate, not a tail quantile: regression samples come from each new closed
window, TTFT ``window["ttft_p50_ms"]`` against ``queue_len_mean`` (mean queued
requests per replica, standing in for queued prefill tokens) and a mean-like
ITL ``(e2e_p50_ms - ttft_p50_ms) / (mean output tokens - 1)`` against
``running_mean + queue_len_mean`` (standing in for scheduled + queued decode
KV); both are least-squares lines (``estimate="p95"`` uses the windows' P95
TTFT and ITL instead).  "Now" is ``(obs.queue_len + obs.zone_queued) / ready``
and ``(obs.ongoing_requests + obs.zone_queued) / ready``: requests held at the
zone for want of a ready engine wait in Dynamo's frontend/router queue, which
the planner sees.  Dynamo's KV-cache feasibility
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from core.defaults import ITL_SLO_MS, MAX_REPLICAS, MIN_REPLICAS, TTFT_SLO_MS
from sim.baselines.base import (
    BaselineBase,
    BaselineParameterError,
    Observation,
    check,
    non_negative,
    positive,
)
from sim.baselines.dynamo_predictors import PREDICTORS, IntervalForecast, KalmanTrend, LoadPredictor

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
class DynamoThroughputParams:
    """Throughput-based planner settings (``config/defaults.py``; predictor default ``arima``)."""

    adjustment_interval_s: float = 180.0
    predictor: Literal["constant", "arima", "kalman"] = "arima"
    kalman_q_level: float = 1.0
    kalman_q_trend: float = 0.1
    kalman_r: float = 10.0
    sample_period_s: float = 1.0

    def __post_init__(self) -> None:
        positive("adjustment_interval_s", self.adjustment_interval_s)
        check(
            self.predictor in PREDICTORS,
            "predictor",
            self.predictor,
            f"must be one of {PREDICTORS} (Prophet needs a dependency)",
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

    def forecast(self) -> IntervalForecast:
        """A fresh interval forecast with this predictor."""
        return IntervalForecast(
            self.adjustment_interval_s,
            LoadPredictor(self.predictor, self.kalman_q_level, self.kalman_q_trend, self.kalman_r),
        )


@dataclass(frozen=True)
class DynamoLoadParams:
    """Load-based planner settings (``config/defaults.py``); SLAs ``None`` -> the run's SLOs."""

    adjustment_interval_s: float = 5.0
    scaling_down_sensitivity: float = 80.0
    min_observations: int = 5
    max_samples: int = 64
    ttft_sla_ms: float | None = None
    itl_sla_ms: float | None = None
    estimate: Literal["mean", "p95"] = "mean"
    throughput_floor: bool = True
    throughput: DynamoThroughputParams = field(default_factory=lambda: DynamoThroughputParams())

    def __post_init__(self) -> None:
        positive("adjustment_interval_s", self.adjustment_interval_s)
        check(self.estimate in ("mean", "p95"), "estimate", self.estimate, "must be 'mean' or 'p95'")
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
        self.params = p = params or DynamoLoadParams()
        self.period_s = p.adjustment_interval_s
        self.ttft_sla_ms = p.ttft_sla_ms if p.ttft_sla_ms is not None else self.slo_ttft_ms
        self.itl_sla_ms = p.itl_sla_ms if p.itl_sla_ms is not None else self.slo_itl_ms
        self.ttft_fit = LinearFit(p.max_samples)
        self.itl_fit = LinearFit(p.max_samples)
        self.last_window_end_ms: float | None = None
        self.floor_forecast = (
            p.throughput.forecast() if p.throughput_floor and replica_capacity_rps is not None else None
        )
        self.floor = 0

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
        ttft, itl = self._latencies(w)
        if ttft is not None:
            self.ttft_fit.add(float(q), ttft)
        if itl is not None:
            self.itl_fit.add(float(q) + float(r), itl)

    def _latencies(self, w: Mapping[str, Any]) -> tuple[float | None, float | None]:
        """(TTFT, ITL) of a window: mean-like (medians, ITL from the decode time) or P95."""
        if self.params.estimate == "p95":
            t95, i95 = w.get("ttft_p95_ms"), w.get("itl_p95_ms")
            return (None if t95 is None else float(t95)), (None if i95 is None else float(i95))
        t50, e50 = w.get("ttft_p50_ms"), w.get("e2e_p50_ms")
        ttft = None if t50 is None or not math.isfinite(float(t50)) else float(t50)
        count, out = w.get("count") or 0, w.get("output_tokens") or 0
        itl = None
        if ttft is not None and e50 is not None and count > 0 and out / count > 1.0:
            itl = max(0.0, float(e50) - ttft) / (out / count - 1.0)
        return ttft, itl

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
        """One load-based adjustment: +1, -1 or no change, then the throughput floor."""
        self._observe(obs)
        if self.floor_forecast is not None and self.replica_capacity_rps is not None:
            demand = self.floor_forecast.step(obs.t_s, obs.arrival_rate_rps, self.period_s)
            if demand is not None:
                self.floor = max(math.ceil(demand / self.replica_capacity_rps), 1)
        n = obs.replicas_ready
        if n == 0 or n != obs.desired or obs.replicas_starting > 0:
            return None  # scaling in progress: observe only
        m = self.params.min_observations
        if len(self.ttft_fit) < m or len(self.itl_fit) < m:
            return None  # regression has insufficient data
        held = obs.zone_queued  # waiting in the frontend for an engine
        p_des = self._side(self.ttft_fit, (obs.queue_len + held) / n, self.ttft_sla_ms, n, own_cost=True)
        d_des = self._side(self.itl_fit, (obs.ongoing_requests + held) / n, self.itl_sla_ms, n, own_cost=False)
        if p_des > n or d_des > n:
            desired = n + 1
        elif p_des < n and d_des < n:
            desired = n - 1
        else:
            desired = n
        return self.changed(obs, max(desired, 1, self.floor))


class DynamoThroughputPlanner(BaselineBase):
    """Dynamo throughput-based planner (see the module docstring)."""

    name = "dynamo-throughput"

    def __init__(
        self,
        params: DynamoThroughputParams | None = None,
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
        if replica_capacity_rps is None:
            raise BaselineParameterError(
                "replica_capacity_rps",
                None,
                "required: the per-replica rate within the SLA (Dynamo takes it from profiling)",
            )
        self.capacity_rps = float(replica_capacity_rps)
        self.params = p = params or DynamoThroughputParams()
        self.period_s = p.sample_period_s
        self.forecast = p.forecast()

    @property
    def history(self) -> list[float]:
        """Request counts per interval (the predictor's buffer)."""
        return self.forecast.predictor.buffer

    def predict_next(self) -> float:
        """Forecast of the next interval's request count."""
        return self.forecast.predictor.predict()

    def decide(self, obs: Observation) -> int | None:
        """Accumulate arrivals; at each interval end forecast and size the fleet."""
        demand_rps = self.forecast.step(obs.t_s, obs.arrival_rate_rps, self.params.sample_period_s)
        if demand_rps is None:
            return None
        return self.changed(obs, max(math.ceil(demand_rps / self.capacity_rps), 1))
