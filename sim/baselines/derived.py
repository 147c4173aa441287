"""The peers' per-replica targets, derived once per model from its profile.

KPA's concurrency target and Ray Serve's ``target_ongoing_requests`` are a
number of requests in flight per replica.  An operator sets them from a load
test; here the load test is one profile trial of the kind :mod:`sim.profiling`
bisects the capacity with: ``replicas`` replicas fed the trace long enough for
:data:`~sim.profiling.PROFILE_MIN_REQUESTS` arrivals, then drained.  By
Little's law a replica carrying its profiled capacity holds
``L = capacity_rps x W`` requests, ``W`` the time a request spends in it.
``W`` is measured at a light load (:data:`LOAD_SHARE` of the capacity): the
time a request takes to be served, not the queueing near the capacity's knee
(a trial at the capacity itself measured ``W`` 2.3x longer on Azure, and a
target that high let Ray Serve fall to 88 % on the 1800 s step), as the
run-window measurement it replaces left out overloaded windows.

One trial per model, not a measurement per zone: the targets used to be
measured by each zone on its own first windows of the run
(:class:`~sim.baselines.base.LittleTarget`), and two identical zones of one
Mooncake replay derived 3.3 and 16.0 (the first windows of one zone held a few
85k-token prompts).  The trial is seeded by the run's seed and depends only on
the trace, the model and the capacity, so every zone (and every scenario of a
trace) gets the same target.

>>> from sim.traces import load_trace
>>> from sim.fastloop import LoopConfig
>>> 10.0 < profiled_concurrency(load_trace("azure-conv"), LoopConfig(), 3.1) < 100.0
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.baselines.base import positive

if TYPE_CHECKING:
    from sim.fastloop import LoopConfig
    from sim.traces import Trace

__all__ = ["DRAIN_S", "LOAD_SHARE", "profiled_concurrency"]

DRAIN_S = 600.0  # the trial's drain after its last arrival (as the profiler's)
LOAD_SHARE = 0.1  # the trial's load, a share of the capacity: W is service, not queueing


def profiled_concurrency(trace: Trace, cfg: LoopConfig, capacity_rps: float, *, replicas: int = 4) -> float:
    """Requests in flight per replica carrying ``capacity_rps``: ``capacity_rps x W``, ``W`` the mean time
    from arrival to the last token on one light profile trial (module docstring)."""
    from sim.fleet import Fleet, FleetConfig
    from sim.perf_model import PerfModel
    from sim.profiling import PROFILE_DURATION_S, PROFILE_MIN_REQUESTS
    from sim.workloads import from_trace

    positive("capacity_rps", capacity_rps)
    qps = LOAD_SHARE * capacity_rps * replicas
    span_s = max(PROFILE_DURATION_S, PROFILE_MIN_REQUESTS / qps)
    perf = cfg.perf or PerfModel.from_splitwise(
        model=cfg.model, hardware=cfg.hardware, tensor_parallel=cfg.tensor_parallel
    )
    trial = Fleet(
        FleetConfig(models={cfg.model: perf}, zones=("trial",), initial_replicas=replicas, seed=cfg.seed), epoch_ms0=0
    )
    load = from_trace(trace, qps, span_s)
    for i, (t, prompt, out) in enumerate(zip(load.arrival_s, load.prompt_tokens, load.output_tokens, strict=True)):
        trial.submit(float(t), "trial", cfg.model, int(prompt), int(out), f"t{i}")
    e2e_ms = [float(r["e2e_ms"]) for r in trial.advance_to(span_s + DRAIN_S)]
    if not e2e_ms:
        raise ValueError("profiled_concurrency: the trial finished no request")
    return capacity_rps * sum(e2e_ms) / len(e2e_ms) / 1000.0
