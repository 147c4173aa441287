"""Workloads: a real trace's arrivals, reshaped in rate but not in texture.

A :class:`Workload` is the arrival sequence the fleet replays.  Rate changes
(a load step, a burst) are applied by *time-warping* the trace: where the
rate multiplier is r(t), trace time u advances as du/dt = r(t), so the
trace's own burstiness and its prompt/output lengths are kept while the
mean rate follows the scenario.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.traces import Trace


class WorkloadError(ValueError):
    """A workload parameter is unusable; the message names it."""


@dataclass(frozen=True)
class Workload:
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: list[list[int]] | None
    name: str

    def __len__(self) -> int:
        return len(self.arrival_s)


def warp(u: np.ndarray, segments: Sequence[tuple[float, float]]) -> np.ndarray:
    """Map trace times ``u`` to wall times for a piecewise-constant rate.

    ``segments`` is [(t_start, rate_multiplier), ...] sorted by t_start with
    the first at 0.  Arrivals at trace time u happen at wall time t(u).

    >>> warp(np.array([0.0, 10.0, 30.0]), [(0.0, 1.0), (10.0, 2.0)]).tolist()
    [0.0, 10.0, 20.0]
    """
    if not segments or segments[0][0] != 0.0:
        raise WorkloadError("segments must start at t=0")
    t_out = np.empty_like(u, dtype=float)
    u_start = 0.0
    bounds = [(t, r) for t, r in segments]
    for k, (t_start, rate) in enumerate(bounds):
        if rate <= 0:
            raise WorkloadError(f"segment {k}: rate multiplier must be > 0, got {rate}")
        t_end = bounds[k + 1][0] if k + 1 < len(bounds) else np.inf
        u_end = u_start + (t_end - t_start) * rate
        mask = (u >= u_start) & (u < u_end)
        t_out[mask] = t_start + (u[mask] - u_start) / rate
        u_start = u_end
    return t_out


def from_trace(
    trace: Trace, qps: float, duration_s: float, segments: Sequence[tuple[float, float]] = ((0.0, 1.0),)
) -> Workload:
    """The trace at mean rate ``qps`` (times the segments' multipliers) for ``duration_s``."""
    if qps <= 0 or duration_s <= 0:
        raise WorkloadError("qps and duration_s must be > 0")
    peak = max(r for _, r in segments)
    base = trace.scaled_to_qps(qps).loop_to(duration_s * peak + 1.0)
    t = warp(np.asarray(base.arrival_s, dtype=float), segments)
    keep = t < duration_s
    idx = np.nonzero(keep)[0]
    hashes = [base.hash_ids[i] for i in idx] if base.hash_ids is not None else None
    return Workload(
        arrival_s=t[keep],
        prompt_tokens=np.asarray(base.prompt_tokens)[keep],
        output_tokens=np.asarray(base.output_tokens)[keep],
        hash_ids=hashes,
        name=f"{trace.name}@{qps:g}qps",
    )


def step_load(trace: Trace, qps: float, duration_s: float, step_at_s: float, factor: float) -> Workload:
    """Mean rate ``qps`` until ``step_at_s``, then ``qps * factor``."""
    if step_at_s <= 0 or step_at_s >= duration_s:
        return from_trace(trace, qps, duration_s)
    return from_trace(trace, qps, duration_s, [(0.0, 1.0), (step_at_s, factor)])
