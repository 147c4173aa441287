"""Profile a real engine pool the way :mod:`sim.profiling` profiles a simulated one.

Two questions, both answered by the load client (:mod:`engines.loadgen`), so
the figures are what a caller of the router sees:

* :func:`unloaded` -- the latency of requests sent one at a time: the floor
  the SLOs are stated against (``SLO = multiple x unloaded P95``,
  :func:`slos_from`).
* :func:`capacity_at_slo` -- the highest steady request rate at which the
  pool keeps SLO attainment at or above ``target``: a geometric bisection over
  the offered rate (as :func:`sim.profiling.replica_capacity_rps` bisects in
  the fast simulator), each trial an open-loop Poisson stream of
  ``trial_s`` seconds with the same request shape.  A request that fails, times
  out or is cut counts as a miss.

Nothing here starts or stops an engine: the caller points it at a router (or
one engine) serving what is to be profiled.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.loadgen import LoadResult, RequestResult, RequestSpec, replay

__all__ = [
    "nearest_rank",
    "CapacityProfile",
    "Unloaded",
    "capacity_at_slo",
    "poisson_specs",
    "service_knots",
    "slos_from",
    "unloaded",
]


@dataclass(frozen=True)
class Unloaded:
    """Latencies of requests sent one at a time (seconds; P95 over ``n``)."""

    n: int
    ttft_p50_s: float
    ttft_p95_s: float
    itl_p50_s: float
    itl_p95_s: float
    e2e_mean_s: float

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 5) if isinstance(v, float) else v for k, v in self.__dict__.items()}


@dataclass
class CapacityProfile:
    """The bisection's answer and every trial it ran (rate, attainment, counts)."""

    capacity_rps: float
    target: float
    trials: list[dict[str, Any]] = field(default_factory=list)


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-quantile (0..1) of ``values``; None for no values (the profile's, the demo's
    and the simulator comparison's one definition).

    >>> nearest_rank([3.0, 1.0, 2.0], 0.5), nearest_rank([1.0, 2.0, 3.0, 4.0], 0.95), nearest_rank([], 0.5)
    (2.0, 4.0, None)
    """
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _pct(values: list[float], q: float) -> float:
    """:func:`nearest_rank`, NaN for no values (a field of :class:`Unloaded`)."""
    v = nearest_rank(values, q)
    return math.nan if v is None else v


def slos_from(
    base: Unloaded,
    multiple: float,
    floor_ms: float = 1.0,
    ttft_edges_s: Sequence[float] = (),
    itl_edges_s: Sequence[float] = (),
) -> tuple[float, float]:
    """(TTFT SLO, ITL SLO) in ms: ``multiple`` x the unloaded P95 of each (at least ``floor_ms``), raised to
    the engine's next histogram bucket edge when edges are given -- an SLO on an edge is one the engines'
    own histograms count violations of exactly (off an edge they bound them only, docs/operations.md).

    >>> base = Unloaded(20, 0.01, 0.02, 0.004, 0.005, 0.2)
    >>> slos_from(base, 4.0)
    (80.0, 20.0)
    >>> slos_from(base, 4.0, ttft_edges_s=(0.04, 0.08, 0.1), itl_edges_s=(0.01, 0.025))
    (80.0, 25.0)
    >>> slos_from(base, 10.0, ttft_edges_s=(0.04, 0.08, 0.1))  # past the last edge: the multiple itself
    (200.0, 50.0)
    """
    if not (math.isfinite(multiple) and multiple > 0):
        raise ValueError(f"multiple must be a finite number > 0, got {multiple!r}")

    def slo(p95_s: float, edges_s: Sequence[float]) -> float:
        want = max(floor_ms, multiple * p95_s * 1000.0)
        above = [1000.0 * e for e in edges_s if 1000.0 * e >= want - 1e-9]
        return round(min(above), 3) if above else round(want, 1)

    return slo(base.ttft_p95_s, ttft_edges_s), slo(base.itl_p95_s, itl_edges_s)


Replay = Callable[..., Awaitable[LoadResult]]


async def _sequential(
    replay_fn: Replay, url: str, model: str, batches: Sequence[RequestSpec | Sequence[RequestSpec]], timeout_s: float
) -> list[RequestResult]:
    """Each item (one request, or a batch sent together) after the previous one finished: no request of
    a measurement waits for another's slot (the load client counts such a wait in TTFT, as it should
    under load)."""
    out: list[RequestResult] = []
    for item in batches:
        specs = [item] if isinstance(item, RequestSpec) else list(item)
        res = await replay_fn(url, model, specs, concurrency=len(specs), timeout_s=timeout_s)
        out.extend(res.results)
    return out


async def unloaded(
    url: str,
    model: str,
    *,
    n: int = 20,
    warmup: int = 8,
    prompt_tokens: int = 64,
    output_tokens: int = 32,
    timeout_s: float = 60.0,
    replay_fn: Replay = replay,
) -> Unloaded:
    """``n`` requests one after the other (concurrency 1): the pool's latency floor.

    ``warmup`` requests go first and are not measured: an engine's first requests take its one-time
    paths (the first of a run took 1.25 s to its first token where the next ones took 15 ms), which
    would otherwise set the P95 and every SLO stated against it."""
    spec = RequestSpec(at_s=0.0, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    await _sequential(replay_fn, url, model, [spec] * warmup, timeout_s)
    results = await _sequential(replay_fn, url, model, [spec] * n, timeout_s)
    ok = [r for r in results if r.status == "ok" and r.ttft_s is not None]
    if not ok:
        reasons = sorted({str(r.error)[:120] for r in results})
        raise RuntimeError(f"unloaded profile: no request of {n} succeeded ({'; '.join(reasons)})")
    ttft = [float(r.ttft_s) for r in ok if r.ttft_s is not None]
    itl = [float(r.itl_s) for r in ok if r.itl_s is not None]
    e2e = [float(r.e2e_s) for r in ok if r.e2e_s is not None]
    return Unloaded(
        n=len(ok),
        ttft_p50_s=_pct(ttft, 0.5),
        ttft_p95_s=_pct(ttft, 0.95),
        itl_p50_s=_pct(itl, 0.5),
        itl_p95_s=_pct(itl, 0.95),
        e2e_mean_s=sum(e2e) / len(e2e) if e2e else math.nan,
    )


def poisson_specs(
    rate_rps: float, duration_s: float, prompt_tokens: int, output_tokens: int, seed: int
) -> list[RequestSpec]:
    """A Poisson stream at ``rate_rps`` for ``duration_s`` (seeded), every request the same shape.

    >>> specs = poisson_specs(10.0, 5.0, 64, 32, seed=1)
    >>> 30 < len(specs) < 80, specs == poisson_specs(10.0, 5.0, 64, 32, seed=1)
    (True, True)
    """
    if not (rate_rps > 0 and duration_s > 0):
        raise ValueError("rate_rps and duration_s must be > 0")
    rng = random.Random(seed)
    t, out = 0.0, list[RequestSpec]()
    while True:
        t += rng.expovariate(rate_rps)
        if t >= duration_s:
            return out
        out.append(RequestSpec(at_s=t, prompt_tokens=prompt_tokens, output_tokens=output_tokens))


async def capacity_at_slo(
    url: str,
    model: str,
    *,
    ttft_slo_ms: float,
    itl_slo_ms: float,
    lo_rps: float,
    hi_rps: float,
    steps: int = 5,
    trial_s: float = 20.0,
    target: float = 0.95,
    prompt_tokens: int = 64,
    output_tokens: int = 32,
    seed: int = 0,
    concurrency: int = 256,
    replay_fn: Replay = replay,
    on_trial: Callable[[dict[str, Any]], None] | None = None,
) -> CapacityProfile:
    """Geometric bisection of the highest rate with attainment >= ``target`` (module docstring).

    ``lo_rps`` is assumed to pass and ``hi_rps`` to fail; both are tried first so a wrong bracket
    shows in the trials (a failing ``lo_rps`` gives capacity 0.0, a passing ``hi_rps`` gives ``hi_rps``).
    """
    prof = CapacityProfile(capacity_rps=0.0, target=target)

    async def trial(rate: float) -> bool:
        specs = poisson_specs(rate, trial_s, prompt_tokens, output_tokens, seed + len(prof.trials))
        res = await replay_fn(url, model, specs, concurrency=concurrency, timeout_s=max(30.0, 3 * trial_s))
        s = res.summary(ttft_slo_ms, itl_slo_ms)
        row = {"rate_rps": round(rate, 3), "requests": len(specs), **s}
        row["passed"] = bool(s["attainment"] >= target)
        prof.trials.append(row)
        if on_trial is not None:
            on_trial(row)
        return bool(row["passed"])

    if not await trial(lo_rps):
        return prof
    if await trial(hi_rps):
        prof.capacity_rps = hi_rps
        return prof
    lo, hi = lo_rps, hi_rps
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        if await trial(mid):
            lo = mid
        else:
            hi = mid
    prof.capacity_rps = round(lo, 3)
    return prof


async def service_knots(
    url: str,
    model: str,
    *,
    prompt_sizes: tuple[int, ...] = (16, 64, 256, 1024),
    batches: tuple[int, ...] = (1, 2, 4),
    output_tokens: int = 32,
    repeats: int = 5,
    timeout_s: float = 60.0,
    replay_fn: Replay = replay,
) -> dict[str, list[tuple[float, float]]]:
    """The engine's service times as a simulator takes them (:class:`sim.perf_model.PerfModel`'s knots).

    ``prefill``: (prompt tokens, median unloaded TTFT ms) -- one request at a time, so the TTFT is the
    prefill plus the HTTP path, which a caller pays too.  ``decode``: (batch, median ITL ms) with
    ``batch`` requests sent together (the engine decodes them as one batch once all are admitted).
    """
    prefill: list[tuple[float, float]] = []
    for size in prompt_sizes:
        one = RequestSpec(at_s=0.0, prompt_tokens=size, output_tokens=2)
        results = await _sequential(replay_fn, url, model, [one] * repeats, timeout_s)
        ttft = [1000.0 * r.ttft_s for r in results if r.status == "ok" and r.ttft_s is not None]
        if ttft:
            prefill.append((float(size), _pct(ttft, 0.5)))
    decode: list[tuple[float, float]] = []
    for b in batches:
        batch = [RequestSpec(at_s=0.0, prompt_tokens=16, output_tokens=output_tokens)] * b
        results = await _sequential(replay_fn, url, model, [batch] * repeats, timeout_s)
        itl = [1000.0 * r.itl_s for r in results if r.status == "ok" and r.itl_s is not None]
        if itl:
            decode.append((float(b), _pct(itl, 0.5)))
    return {"prefill": prefill, "decode": decode}
