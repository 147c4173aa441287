"""The record of a closed window: :func:`result`, :func:`node_kv`, :func:`node_result`.

Reads a :class:`controllers.windows.WindowAggregate` (the aggregate that
:mod:`controllers.windows` builds by initialize / add / merge) into the
JSON-safe summary the pipeline publishes for a zone or a node: counts,
rates, latency quantiles, GPU means, replica counts, KV allocator fields and
the agent-signal means.  Pure; the aggregate is not changed.  Ratios over
requests are 0.0 for an empty window; quantiles and means with no samples
are None (JSON null), never NaN.  The keys are the record's fields listed in
:mod:`controllers.window_fields` (checked at import); this module imports
:mod:`controllers.windows`, never the other way round.

Examples
--------
>>> from controllers.windows import initialize
>>> r = result(initialize(), window_s=10.0)
>>> r["count"], r["rate_rps"], r["ttft_p95_ms"]
(0, 0.0, None)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from controllers.errors import ParameterError
from controllers.window_fields import AGENT_MICRO, AGENT_SIGNAL_COLUMNS, KV_COLUMNS, STAGE_COLUMNS, check_keys
from controllers.windows import NodeSnapshot, WindowAggregate, initialize
from core.vocab import AGENT_PATHS, READY_STATES, STARTING_STATES

if TYPE_CHECKING:
    from controllers.sketch import DDSketch

__all__ = ["READY_STATES", "STARTING_STATES", "node_kv", "node_result", "result"]


#: A window's counts and sums saturate here (the window record's ints are int64): a window is never
#: refused because of its own content, however large the records it summed.
INT64_MAX = 2**63 - 1


def _ratio(num: float, den: float, empty: float | None) -> float | None:
    return float(num) / den if den else empty


def _saturated(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with every int at most :data:`INT64_MAX` and every non-finite float as None (unknown).

    >>> _saturated({"prompt_tokens": 2**64, "queue_ms_mean": float("inf"), "count": 3})
    {'prompt_tokens': 9223372036854775807, 'queue_ms_mean': None, 'count': 3}
    """
    for k, v in out.items():
        if type(v) is int and v > INT64_MAX:
            out[k] = INT64_MAX
        elif type(v) is float and not math.isfinite(v):
            out[k] = None
        elif type(v) is dict:
            out[k] = _saturated(v)
    return out


def result(agg: WindowAggregate, window_s: float) -> dict[str, Any]:
    """JSON-safe summary of one window.

    Ratios over requests are 0.0 for an empty window; quantiles and means
    with no samples are None (JSON null), never NaN.  Counts and sums
    saturate at :data:`INT64_MAX`; a mean that is not finite is None.

    Examples
    --------
    >>> from controllers.windows import initialize
    >>> r = result(initialize(), window_s=10.0)
    >>> r["count"], r["violation_rate"], r["e2e_p99_ms"], r["gpu_util_mean"]
    (0, 0.0, None, None)
    >>> r["agent_signals_n"], r["agent_stability_mean"], r["agent_path_counts"]
    (0, None, {'rag': 0, 'tool': 0, 'llm': 0})
    """
    if not (isinstance(window_s, (int, float)) and 0.0 < window_s < math.inf):
        raise ParameterError(f"window_s={window_s!r}: window length must be finite and > 0")
    n, g, agent_n = agg.n_requests, agg.n_gpu_samples, agg.n_agent_signals
    snaps = list(agg.nodes.values())
    out: dict[str, Any] = {
        "count": n,
        "rate_rps": n / window_s,
        "violation_rate": _ratio(agg.n_violations, n, 0.0),
        "unfixable_rate": _ratio(agg.n_unfixable, n, 0.0),
        "stage_unfixable_rate": _ratio(agg.n_stage_unfixable, n, 0.0),
        "error_rate": _ratio(agg.n_errors, n, 0.0),
        "kv_hit_rate": _ratio(agg.n_kv_hits, n, 0.0),
    }
    stages = tuple((c.removesuffix("_ms"), (50, 95)) for c in STAGE_COLUMNS)
    for name, qs in (("e2e", (50, 95, 99)), ("ttft", (50, 95, 99)), ("itl", (95,)), *stages):
        sketch: DDSketch = getattr(agg, name)
        for q in qs:
            out[f"{name}_p{q}_ms"] = sketch.quantile(q / 100.0)
    out.update(
        prompt_tokens=agg.prompt_tokens,
        output_tokens=agg.output_tokens,
        queue_ms_mean=_ratio(agg.queue_ms_sum, n, None),
        queue_len_mean=_ratio(agg.queue_len_sum, g, None),
        queue_len_max=agg.queue_len_max if g else None,
        running_mean=_ratio(agg.running_sum, g, None),
        gpu_util_mean=_ratio(agg.gpu_util_sum, g, None),
        replicas_ready=sum(s.state in READY_STATES for s in snaps),
        replicas_starting=sum(s.state in STARTING_STATES for s in snaps),
        kv_blocks_used=sum(s.kv_blocks_used for s in snaps),
        kv_blocks_total=sum(s.kv_blocks_total for s in snaps),
        largest_free_block_bytes_min=(min(s.largest_free_block_bytes for s in snaps) if snaps else None),
        agent_signals_n=agent_n,
        agent_path_counts={p: getattr(agg, f"n_path_{p}") for p in AGENT_PATHS},
    )
    for name in AGENT_SIGNAL_COLUMNS:
        out[f"{name}_mean"] = _ratio(getattr(agg, f"{name}_micro") / AGENT_MICRO, agent_n, None)
    return _saturated(out)


def node_kv(snap: NodeSnapshot | None) -> dict[str, Any]:
    """The KV allocator fields of a node's latest sample (None: not reported).

    ``largest_free_block_bytes`` is None only when the window has no GPU
    sample; a sample without that field counts 0 (as in the zone's min).

    Examples
    --------
    >>> node_kv(None)["kv_generation"] is None
    True
    >>> from controllers.windows import NodeSnapshot
    >>> s = NodeSnapshot(1, "ready", 0, 0, 0, 0, 64, 0.5, 128, 96, 7, (2, 1, 0))
    >>> sorted(node_kv(s).items())  # doctest: +NORMALIZE_WHITESPACE
    [('fragmentation_ratio', 0.5), ('free_block_hist', [2, 1, 0]), ('kv_free_bytes', 128),
     ('kv_generation', 7), ('kv_waiting_bytes', 96), ('largest_free_block_bytes', 64)]
    """
    if snap is None:
        return {k: None for k in (*KV_COLUMNS, "largest_free_block_bytes", "free_block_hist")}
    out: dict[str, Any] = {k: (v if (v := getattr(snap, k)) >= 0 else None) for k in KV_COLUMNS}
    out["largest_free_block_bytes"] = snap.largest_free_block_bytes
    out["free_block_hist"] = [min(v, INT64_MAX) for v in snap.free_block_hist] if snap.free_block_hist else None
    return _saturated(out)


def node_result(agg: WindowAggregate, node: str, window_s: float) -> dict[str, Any]:
    """:func:`result` of a node's window plus :func:`node_kv` of its latest sample.

    Examples
    --------
    >>> from controllers.windows import initialize
    >>> r = node_result(initialize(), "n1", 10.0)
    >>> r["count"], r["kv_free_bytes"], r["largest_free_block_bytes"]
    (0, None, None)
    """
    return {**result(agg, window_s), **node_kv(agg.nodes.get(node))}


check_keys("controllers.window_result.result", result(initialize(), 1.0), "result")
check_keys("controllers.window_result.node_kv", node_kv(None), "node")
