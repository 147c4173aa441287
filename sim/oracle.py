"""The physical limit, bracketed: the SLO ceiling of a workload, a lower bound
on the GPU-seconds it needs, and an ``oracle`` schedule that knows the future.

- :func:`ceiling`: the attainment of an unbounded fleet.  Every request is
  served alone on an idle, fresh replica the moment it reaches the zone (no
  queue, no batch partner, no prefix cache); what is left is its own network +
  preprocessing + prefill (TTFT) and its batch-1 decode step (ITL).  A request
  that breaks the SLO even so is *unservable*: no fleet size helps it.  On a
  300 s Mooncake replay it equals, request by request, what a 300-replica
  simulated fleet without jitter serves.  Service times are the perf model's
  medians (jitter factor 1, network delay at its median), and a small fleet
  can reuse prefix-cache blocks a huge one spreads thin, so a run can land a
  little above it; ``prefix_cache=True`` gives the strict upper bound (every
  block another request carries counted as cached).
- :func:`lower_bound_gpu_seconds`: busy GPU-seconds at the cheapest batching
  the perf model allows (proof in its docstring).
- :func:`oracle_factory`: a per-zone :class:`OracleAutoscaler` that reads a
  schedule computed from the whole arrival sequence, the service-time model
  and the scenario's faults, and orders each replica exactly one start-up
  (plus the command path) ahead of need.  It runs in the same fast loop
  (:func:`sim.fastloop.run`), so its attainment and GPU-seconds are measured by
  the same accounting as every other strategy: it is achievable.
  :func:`tuned_oracle` walks its headroom up to the cheapest run within
  99.5 % of the ceiling (``governor bench control``'s ``oracle`` row).
- ``oracle_factory(..., causal=True)``: the same schedule read only up to
  *now*: it knows every request that has arrived and its exact cost, but
  nothing of the future, so it orders replicas for the load it has seen and
  holds each for one start-up before releasing it.  No controller that
  measures instead of foreseeing does better at the same headroom: the gap
  between it and the oracle is the price of not knowing the future, the gap
  between a controller and it the price of measuring and controlling
  (``governor bench frontier``'s ``oracle-causal`` curve).

Examples
--------
>>> import numpy as np
>>> from sim.fastloop import LoopConfig
>>> from sim.workloads import Workload
>>> w = Workload(np.array([0.0, 1.0]), np.array([512, 512]), np.array([10, 10]), None, "two")
>>> ceiling(w, LoopConfig())
1.0
>>> 0 < lower_bound_gpu_seconds(w, LoopConfig()) < 1
True
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Unpack

import numpy as np

from sim.baselines.base import BaselineBase, Harness, Observation
from sim.fastloop import Fault, LoopConfig, RunResult, run
from sim.perf_model import DECODE_REF_CTX_PER_SEQ, PerfModel
from sim.replica import BLOCK_TOKENS, FleetConfig
from sim.workloads import Workload

__all__ = [
    "OracleAutoscaler",
    "ceiling",
    "lower_bound_gpu_seconds",
    "oracle_factory",
    "oracle_schedule",
    "request_slo_ok",
    "tuned_oracle",
    "zone_assignment",
]

_FLEET_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(FleetConfig)}
MAX_BATCH = int(_FLEET_DEFAULTS["max_batch"])  # the fast loop's fleet: FleetConfig defaults
MAX_PREFILL_TOKENS = int(_FLEET_DEFAULTS["max_prefill_tokens"])
NETWORK_MS_MEDIAN = float(_FLEET_DEFAULTS["network_ms_median"])
SQRT_STAFFING = 1.0  # square-root staffing: + beta * sqrt(load) replicas for arrival noise
CAUSAL_WINDOW_S = 20.0  # the schedule's demand window (centred: half of it looks ahead)
DEFAULT_HEADROOM = 1.0  # oracle: replicas over the profiled-capacity need (bench frontier sweeps it)


def _perf(cfg: LoopConfig) -> PerfModel:
    return PerfModel.from_splitwise(model=cfg.model, hardware=cfg.hardware, tensor_parallel=cfg.tensor_parallel)


def cached_blocks_upper(workload: Workload) -> np.ndarray:
    """Per request, the most leading prefix blocks any replica's cache could hold for it.

    A replica caches only blocks of requests it served before, so a block can
    be a hit only if some *other* request of the workload carries it; the
    count is the leading run of such blocks (an upper bound on the simulator's
    hits, whatever the routing and cache eviction).
    """
    n = len(workload)
    if workload.hash_ids is None:
        return np.zeros(n, dtype=int)
    seen: Counter[int] = Counter()
    for ids in workload.hash_ids:
        seen.update(set(ids or ()))
    out = np.zeros(n, dtype=int)
    for i, ids in enumerate(workload.hash_ids):
        hits = 0
        for h in ids or ():
            if seen[h] < 2:  # only this request carries it
                break
            hits += 1
        out[i] = hits
    return out


def _prefill_tokens_lower(workload: Workload) -> np.ndarray:
    prompt = np.asarray(workload.prompt_tokens, dtype=float)
    return np.asarray(np.maximum(1.0, prompt - BLOCK_TOKENS * cached_blocks_upper(workload)))


def request_slo_ok(workload: Workload, cfg: LoopConfig, prefix_cache: bool = False) -> np.ndarray:
    """Per request: does it meet both SLOs alone on an idle replica (see the module docstring)?

    TTFT = network (median) + preprocess (``0.5 + 0.0005 * prompt`` ms, as
    :meth:`sim.fleet.Fleet.submit`) + ``prefill_ms(prompt)`` (less the
    :func:`cached_blocks_upper` blocks with ``prefix_cache``); ITL =
    the batch-1 decode step at the request's mean context
    (``prompt + output / 2``, as :class:`sim.replica.Replica` plans one segment).
    """
    perf = _perf(cfg)
    prompt = np.asarray(workload.prompt_tokens, dtype=float)
    output = np.asarray(workload.output_tokens, dtype=float)
    if len(prompt) == 0:
        return np.zeros(0, dtype=bool)
    tokens = _prefill_tokens_lower(workload) if prefix_cache else np.maximum(prompt, 1.0)
    ttft = NETWORK_MS_MEDIAN + 0.5 + 0.0005 * prompt + perf.prefill_ms(tokens)
    base = perf.decode_step_ms(1)
    ctx = prompt + output / 2.0
    step = np.maximum(0.5 * base, base + perf.decode_ctx_slope_ms * (ctx - DECODE_REF_CTX_PER_SEQ))
    itl = np.where(output > 0, step, 0.0)
    return np.asarray((ttft <= cfg.ttft_slo_ms) & (itl <= cfg.itl_slo_ms))


def ceiling(workload: Workload, cfg: LoopConfig, prefix_cache: bool = False) -> float:
    """Attainment of an unbounded fleet: the share of requests :func:`request_slo_ok` passes (1.0 when empty)."""
    ok = request_slo_ok(workload, cfg, prefix_cache)
    return float(ok.mean()) if len(ok) else 1.0


def _min_per_unit(f: Callable[[float], float], knots: Sequence[float], lo: float, hi: float) -> float:
    """``min f(x) / x`` over ``[lo, hi]`` for ``f`` piecewise linear in log-log.

    On each log-log segment ``f(x) / x`` is a power of ``x``, so monotone: its
    minimum over the interval lies at a knot or an end point.
    """
    xs = [lo, hi, *(k for k in knots if lo <= k <= hi)]
    return min(f(x) / x for x in xs)


def lower_bound_gpu_seconds(workload: Workload, cfg: LoopConfig) -> float:
    """GPU-seconds no schedule can go below while serving ``workload`` (perf-model service times).

    Proof.  Provisioned GPU-seconds count every replica holding GPUs for
    every tick, ``gpus_per_replica`` each, so they are at least
    ``gpus_per_replica`` x the replicas' total busy time (a replica serves one
    segment at a time: one prefill pass or one decode step).  That busy time
    is a sum over the segments the work needs:

    - *Prefill*: a pass over ``T`` tokens takes ``prefill_ms(T)``, with
      ``T <= max(max_prefill_tokens, largest prompt)`` (a batch stops at the
      budget; only a lone request may exceed it).  So a pass costs at least
      ``T * r_p`` with ``r_p = min prefill_ms(T) / T`` over that range
      (:func:`_min_per_unit`), and all passes together at least
      ``r_p * sum of prefill tokens``; a request's prefill tokens are at least
      ``prompt - 512 * (its most cacheable blocks)`` (:func:`cached_blocks_upper`).
    - *Decode*: a request needs ``output`` steps; a step of ``b <= max_batch``
      requests takes ``max(0.5 base(b), base(b) + slope * (ctx - 576 b))``
      with ``ctx >= sum of the batch's prompts``.  With
      ``m = min base(b) / b`` each step costs at least
      ``sum over its requests of (m + slope * (prompt - 576))`` and at least
      ``0.5 m b``; summing over steps, decode costs at least the larger of
      ``sum output * (m + slope * (prompt - 576))`` and ``0.5 m sum output``.

    Spikes only slow service down.  Two limits, stated: the bound uses the
    perf model's median service times (the simulator's per-replica jitter
    factor has mean ~1; its clip would allow 0.5 in principle), and the fast
    loop bills GPU-seconds until the run's end while counting the requests
    still in flight then (their drain tail is not billed), so a run whose
    last seconds hold much work could sit below this bound by that tail.
    """
    if len(workload) == 0:
        return 0.0
    perf = _perf(cfg)
    prompt = np.asarray(workload.prompt_tokens, dtype=float)
    output = np.asarray(workload.output_tokens, dtype=float)
    tokens = _prefill_tokens_lower(workload)
    cap = float(max(MAX_PREFILL_TOKENS, prompt.max(), 1.0))
    r_p = _min_per_unit(perf.prefill_ms, perf.prefill_tokens, 1.0, cap)
    prefill_ms = r_p * float(tokens.sum())
    m = _min_per_unit(lambda b: perf.decode_step_ms(int(b)), range(1, MAX_BATCH + 1), 1.0, float(MAX_BATCH))
    slope = perf.decode_ctx_slope_ms
    decode_ms = max(
        float((output * (m + slope * (prompt - DECODE_REF_CTX_PER_SEQ))).sum()), 0.5 * m * float(output.sum())
    )
    return (prefill_ms + decode_ms) / 1000.0 * cfg.gpus_per_replica


def zone_assignment(workload: Workload, cfg: LoopConfig) -> np.ndarray:
    """The zone index the fast loop's balancer draws for each request (same seeded draw as :mod:`sim.fastloop`)."""
    rng = np.random.default_rng(cfg.seed)
    return rng.integers(0, len(cfg.zones), len(workload))


def _request_cost(workload: Workload, perf: PerfModel) -> np.ndarray:
    """Replica-time of each request at a nominal batch of 32 (relative weights of the demand)."""
    prompt = np.asarray(workload.prompt_tokens, dtype=float)
    output = np.asarray(workload.output_tokens, dtype=float)
    per_token = perf.decode_step_ms(32) / 32.0
    return np.asarray(perf.prefill_ms(np.maximum(prompt, 1.0)) + output * per_token)


def oracle_schedule(
    workload: Workload,
    cfg: LoopConfig,
    capacity_rps: float,
    faults: Sequence[Fault] = (),
    duration_s: float | None = None,
    headroom: float = DEFAULT_HEADROOM,
    window_s: float = 20.0,
) -> dict[str, np.ndarray]:
    """Replicas each zone should *have ready* at each whole second ``t`` (index ``t``).

    Demand: the zone's request cost arriving in ``[t - window_s / 2, t + window_s / 2]``
    per second (each request weighted by its own prefill + decode time, relative
    to the workload's mean), over the profiled ``capacity_rps`` of one replica,
    times ``headroom``, rounded up.  Faults it knows: a cut zone's arrivals go
    to the others (as the balancer sends them); a spike slows
    ``ceil(fraction * replicas)`` of them ``factor`` x, so its zone gets
    ``ceil(k * (1 - 1 / factor))`` more; a lost replica +1 for a start-up.
    Rounding: ``ceil(headroom * a + sqrt(a))`` replicas for an offered load of
    ``a`` replicas' worth (square-root staffing: arrival noise needs relatively
    more room on a small fleet).
    """
    if capacity_rps <= 0 or headroom <= 0 or window_s <= 0:
        raise ValueError("capacity_rps, headroom and window_s must be > 0")
    duration = float(duration_s if duration_s is not None else (workload.arrival_s[-1] if len(workload) else 0.0))
    n_s = int(math.ceil(duration)) + 1
    zones = list(cfg.zones)
    zone_of = zone_assignment(workload, cfg)
    arrival = np.asarray(workload.arrival_s, dtype=float)
    for f in faults:  # the balancer sends a cut zone's arrivals to the reachable zones, i % len(live)
        if f.kind == "zone_cut" and f.zone in zones:
            live = [k for k, z in enumerate(zones) if z != f.zone] or list(range(len(zones)))
            cut = (zone_of == zones.index(f.zone)) & (arrival > f.at_s - 1.0) & (arrival < f.at_s + f.duration_s)
            idx = np.nonzero(cut)[0]
            zone_of[idx] = np.asarray(live)[idx % len(live)]
    cost = _request_cost(workload, _perf(cfg)) if len(workload) else np.zeros(0)
    unit = float(cost.mean()) if len(cost) else 1.0
    out: dict[str, np.ndarray] = {}
    half = window_s / 2.0
    for k, zone in enumerate(zones):
        mine = zone_of == k
        per_s = np.bincount(np.clip(arrival[mine].astype(int), 0, n_s - 1), weights=cost[mine], minlength=n_s)
        csum = np.concatenate([[0.0], np.cumsum(per_s)])
        t = np.arange(n_s)
        lo, hi = np.clip(t - int(half), 0, n_s), np.clip(t + int(math.ceil(half)) + 1, 0, n_s)
        rate = (csum[hi] - csum[lo]) / np.maximum(hi - lo, 1) / unit
        mult = np.ones(n_s)
        for f in faults:
            if f.zone == zone and f.kind == "zone_cut":
                mult[(t >= f.at_s) & (t < f.at_s + f.duration_s)] = 0.0
        load = rate * mult / capacity_rps  # replicas' worth of offered work
        need = np.ceil(headroom * load + SQRT_STAFFING * np.sqrt(load) - 1e-9).astype(int)
        base = need.copy()
        for f in faults:
            if f.zone != zone:
                continue
            span = (t >= f.at_s) & (t < f.at_s + (f.duration_s if f.kind == "spike" else cfg.startup_s))
            if f.kind == "spike":  # ceil(fraction * replicas) of them serve at 1 / factor: make up the loss
                slowed = math.ceil(f.fraction * max(int(base[min(int(f.at_s), n_s - 1)]), cfg.min_replicas))
                need[span] += math.ceil(slowed * (1.0 - 1.0 / f.factor))
            elif f.kind == "replica_lost":  # its replacement starts up meanwhile
                need[span] += 1
        out[zone] = np.clip(need, cfg.min_replicas, cfg.max_replicas)
    return out


class OracleAutoscaler(BaselineBase):
    """Reads a precomputed ready-replica schedule; decides the most it will need within one lead.

    A decision at ``t`` reaches the fleet at ``t + actuation_delay_s`` and a
    replica started then is ready ``startup_s`` later, so the desired count at
    ``t`` is the largest need over ``[t + delay, t + delay + startup]``: every
    replica is ordered exactly one lead ahead of its first needed second, and
    none is released while it is still needed within a lead (a released one
    could not come back sooner).
    """

    name = "oracle"
    period_s = 1.0

    def __init__(
        self,
        need: np.ndarray,
        lead_s: Callable[[float], float],
        delay_s: float,
        causal_lag_s: float | None = None,
        **harness: Unpack[Harness],
    ) -> None:
        super().__init__(**harness)
        self.need, self.lead_s, self.delay_s = need, lead_s, delay_s
        self.causal_lag_s = causal_lag_s

    def decide(self, obs: Observation) -> int | None:
        if self.causal_lag_s is not None:
            # Causal: need[t] looks causal_lag_s ahead, so need[t - lag] is the load up to now;
            # a replica is held for one start-up after its last needed second (it cannot come back sooner).
            hi = int(math.floor(obs.t_s - self.causal_lag_s))
            lo = int(math.floor(hi - self.lead_s(obs.t_s)))
            seg = self.need[max(0, min(lo, len(self.need) - 1)) : max(0, min(hi + 1, len(self.need)))]
            return self.changed(obs, int(seg.max())) if hi >= 0 and len(seg) else None  # nothing seen yet: hold
        lo = int(math.floor(obs.t_s + self.delay_s))
        hi = int(math.ceil(obs.t_s + self.delay_s + self.lead_s(obs.t_s))) + 1
        seg = self.need[min(lo, len(self.need) - 1) : min(hi, len(self.need))]
        target = int(seg.max()) if len(seg) else int(self.need[-1])
        return self.changed(obs, target)


def oracle_factory(
    workload: Workload,
    cfg: LoopConfig,
    capacity_rps: float,
    faults: Sequence[Fault] = (),
    duration_s: float | None = None,
    headroom: float = DEFAULT_HEADROOM,
    causal: bool = False,
) -> Callable[[str], OracleAutoscaler]:
    """zone -> :class:`OracleAutoscaler` over :func:`oracle_schedule` (for :func:`sim.fastloop.run`).

    ``causal``: the schedule read only up to now (module docstring); a fault
    is then known, exactly, half a demand window after it starts.
    """
    sched = oracle_schedule(workload, cfg, capacity_rps, faults, duration_s, headroom, window_s=CAUSAL_WINDOW_S)
    slow = [(f.at_s, f.factor) for f in faults if f.kind == "slow_start"]

    def lead_s(t: float) -> float:  # start-up at the time of the order (slow-start faults known)
        factor = 1.0
        for at, x in slow:
            if t + cfg.actuation_delay_s >= at:
                factor = x
        return cfg.startup_s * factor

    def make(zone: str) -> OracleAutoscaler:
        return OracleAutoscaler(
            sched[zone],
            lead_s,
            cfg.actuation_delay_s,
            min_replicas=cfg.min_replicas,
            max_replicas=cfg.max_replicas,
            slo_ttft_ms=cfg.ttft_slo_ms,
            slo_itl_ms=cfg.itl_slo_ms,
            replica_capacity_rps=capacity_rps,
            causal_lag_s=CAUSAL_WINDOW_S / 2.0 if causal else None,
        )

    return make


HEADROOM_GRID = (1.0, 1.1, 1.2, 1.35, 1.5, 1.75, 2.0)


def tuned_oracle(
    workload: Workload,
    cfg: LoopConfig,
    capacity_rps: float,
    faults: Sequence[Fault] = (),
    duration_s: float | None = None,
    target_share: float = 0.995,
    grid: Sequence[float] = HEADROOM_GRID,
) -> tuple[float, RunResult, list[tuple[float, float, float]]]:
    """The cheapest oracle in ``grid`` (ascending headroom) reaching ``target_share`` of the ceiling.

    Each headroom is one fast-loop run; the walk stops at the first run with
    attainment ``>= target_share * ceiling`` or, on a plateau, when a step
    gains under 0.1 point (the previous, cheaper run is kept).  Returns the
    headroom, its run and every ``(headroom, attainment, gpu_seconds)`` tried.
    """
    goal = target_share * ceiling(workload, cfg)
    tried: list[tuple[float, float, float]] = []
    best: tuple[float, RunResult] | None = None
    for h in sorted(grid):
        res = run(oracle_factory(workload, cfg, capacity_rps, faults, duration_s, h), workload, cfg, faults,
                  duration_s, name="oracle")  # fmt: skip
        att = float(res.metrics["slo_attainment"] or 0.0)
        tried.append((h, att, float(res.metrics["gpu_seconds"])))
        if best is not None and att < float(best[1].metrics["slo_attainment"] or 0.0) + 0.001:
            break
        best = (h, res)
        if att >= goal:
            break
    assert best is not None, "grid is empty"
    return best[0], best[1], tried
