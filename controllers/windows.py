"""Tumbling event-time windows over request and GPU telemetry.

Aggregation follows quix-streams' ``BaseAggregator`` shape:
:func:`initialize` -> :func:`add_requests` / :func:`add_gpu` -> :func:`merge`
-> :func:`result`, with no I/O; the stream agent owns the store, here a
:class:`controllers.window_tracker.WindowTracker` that keeps the open windows
per key, advances an event-time watermark and pops windows once
``start + size + lateness`` has passed.  Merging node windows gives the zone window: counts add, sketches
merge, per-node GPU snapshots union keeping the latest timestamp.

This module holds the aggregate and its initialize / add / merge; its
fields and how each merges are listed in :mod:`controllers.window_fields`
(:data:`~controllers.window_fields.AGGREGATE`, checked at import).  The
batch columns and their checks (request, GPU, KV allocator and agent
columns; a bad batch is rejected whole with ``ValueError``) are in
:mod:`controllers.window_columns` (its schemas re-exported here); the record
of a closed window (``result``, ``node_kv``, ``node_result``) is built from
the aggregate by :mod:`controllers.window_result`, which imports this module
(never the other way round).

Mixed agent load (docs/model.md §15 (agents)): a window counts the requests
carrying the three agent signals and sums each signal in integer millionths
(so merging is exactly associative and commutative), and counts the requests per
``agent_path``; the record (:func:`controllers.window_result.result`)
reports the means (None when no request carried them) and ``agent_path_counts``.

Missing latency measurements (NaN) are skipped by that metric's sketch and
never count as a latency violation.  ``n_unfixable`` (docs/model.md §23):
``ok`` requests over their TTFT limit even without their wait, which no
replica count fixes (a NaN wait counts as fixable); ``n_stage_unfixable``: those
of them that would meet it without their network and preprocess time too (the
optional :data:`STAGE_COLUMNS`, NaN = not measured = 0): a slow stage before the
replica, not queueing nor prefill, made them miss.  Each stage's latency has its
own sketch (``network``, ``preprocess``, ``decode``), empty when not measured.

Per-request-class SLOs: a batch may carry the optional ``request_class``
column (small int codes, :data:`controllers.window_columns.REQUEST_CLASS_CODES`:
0 = no class, ``i + 1`` = ``REQUEST_CLASSES[i]``).  A request of class code
``c`` is held to ``SloSpec.class_limits[c - 1]``; code 0, a code the spec has
no limits for, or a batch without the column is held to the spec's own
limits (scraped metrics carry no class).

Examples
--------
>>> import numpy as np
>>> agg = initialize()
>>> cols = {"ttft_ms": np.array([100.0, 900.0]), "itl_ms": np.array([20.0, 20.0]),
...         "e2e_ms": np.array([500.0, 1500.0]), "queue_ms": np.array([0.0, 10.0]),
...         "prompt_tokens": np.array([10, 20]), "output_tokens": np.array([5, 5]),
...         "kv_hit": np.array([True, False]), "ok": np.array([True, True])}
>>> add_requests(agg, cols, SloSpec(ttft_slo_ms=500.0, itl_slo_ms=50.0))
>>> from controllers.window_result import result
>>> out = result(agg, window_s=10.0)
>>> out["count"], out["violation_rate"], out["rate_rps"]
(2, 0.5, 0.2)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from controllers.errors import ParameterError
from controllers.sketch import DDSketch
from controllers.window_columns import (
    AGENT_COLUMNS,
    AGENT_MICRO,
    AGENT_PATHS,
    AGENT_SIGNAL_COLUMNS,
    GPU_COLUMNS,
    KV_COLUMNS,
    REQUEST_COLUMNS,
    STAGE_COLUMNS,
    gpu_batch,
    request_batch,
)
from controllers.window_fields import AGGREGATE, check_dataclass

__all__ = [
    "AGENT_COLUMNS",
    "AGENT_PATHS",
    "AGENT_SIGNAL_COLUMNS",
    "GPU_COLUMNS",
    "KV_COLUMNS",
    "REQUEST_COLUMNS",
    "STAGE_COLUMNS",
    "NodeSnapshot",
    "SloSpec",
    "WindowAggregate",
    "add_gpu",
    "add_requests",
    "initialize",
    "merge",
    "window_start_ms",
]

# the aggregate's fields by merge rule, made from the one table (controllers.window_fields.AGGREGATE)
_SCALARS = tuple(f.name for f in AGGREGATE if f.merge in ("sum", "max"))  # in the snapshot's key order
_SUMMED = tuple(f.name for f in AGGREGATE if f.merge == "sum")
_MAXED = tuple(f.name for f in AGGREGATE if f.merge == "max")
_SKETCHES = tuple(f.name for f in AGGREGATE if f.merge == "sketch")
_FIRST = tuple((f.name, f.type) for f in AGGREGATE if f.merge in ("sum", "max") and not f.later)
_LATER_FIELDS = tuple(f.name for f in AGGREGATE if f.later and f.merge != "sketch")  # absent from an older snapshot: 0
_LATER_SKETCHES = tuple(f.name for f in AGGREGATE if f.later and f.merge == "sketch")  # absent: empty
_STAGE_SKETCHES = {c.removesuffix("_ms"): c for c in STAGE_COLUMNS}  # sketch -> its optional column


class _Unmeasured(DDSketch):
    """The one empty sketch every aggregate holds for a stage nobody measured (most producers send no stage
    times, and a worker holds an aggregate per (model, zone, node) window): :func:`add_requests` swaps in
    a sketch of its own at the first value; adding to this one raises instead of filling everyone's."""

    __slots__ = ()

    def add_many(self, values: npt.ArrayLike) -> None:
        raise RuntimeError("the shared unmeasured-stage sketch takes no values (windows.add_requests swaps it)")

    def merge(self, other: DDSketch) -> None:
        raise RuntimeError("the shared unmeasured-stage sketch takes no values (windows.merge copies it)")


UNMEASURED: DDSketch = _Unmeasured()


def _stage_sketch(sketch: DDSketch) -> DDSketch:
    """``sketch``, or the shared :data:`UNMEASURED` when it holds nothing."""
    return UNMEASURED if sketch.count == 0 else sketch


def window_start_ms(ts_ms: Any, size_ms: int) -> Any:
    """Start of the tumbling window holding ``ts_ms`` (floor alignment).

    Works on ints and on numpy integer arrays; negative timestamps floor too.

    Examples
    --------
    >>> window_start_ms(12_345, 1_000), window_start_ms(-1, 1_000)
    (12000, -1000)
    >>> window_start_ms(np.array([999, 1000]), 1000).tolist()
    [0, 1000]
    """
    if size_ms <= 0:
        raise ParameterError(f"size_ms={size_ms}: window size must be > 0")
    return ts_ms - ts_ms % size_ms


@dataclass(frozen=True)
class SloSpec:
    """Per-request SLO: violated if status != ok, TTFT or ITL above its limit.

    ``class_limits[c - 1]`` is the ``(ttft_slo_ms, itl_slo_ms)`` of request
    class code ``c`` (see the module docstring); empty: one SLO for all.

    Examples
    --------
    >>> SloSpec(ttft_slo_ms=500.0, itl_slo_ms=50.0).ttft_slo_ms
    500.0
    >>> spec = SloSpec(500.0, 50.0, class_limits=((300.0, 50.0),))
    >>> [a.tolist() for a in spec.limits(np.array([0, 1, 7]))]
    [[500.0, 300.0, 500.0], [50.0, 50.0, 50.0]]
    """

    ttft_slo_ms: float
    itl_slo_ms: float
    class_limits: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("ttft_slo_ms", "itl_slo_ms"):
            _check_limit(name, getattr(self, name))
        for i, pair in enumerate(self.class_limits):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ParameterError(f"class_limits[{i}]={pair!r}: must be a (ttft_slo_ms, itl_slo_ms) pair")
            for name, value in zip(("ttft_slo_ms", "itl_slo_ms"), pair, strict=True):
                _check_limit(f"class_limits[{i}].{name}", value)

    def limits(self, codes: npt.NDArray[np.int64] | None) -> tuple[Any, Any]:
        """The TTFT and ITL limits of each request: scalars without per-class limits or codes."""
        if codes is None or not self.class_limits:
            return self.ttft_slo_ms, self.itl_slo_ms
        table = np.array([(self.ttft_slo_ms, self.itl_slo_ms), *self.class_limits], dtype=np.float64)
        rows = np.where(codes < len(table), codes, 0)
        return table[rows, 0], table[rows, 1]


def _check_limit(name: str, value: Any) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0.0 < value < math.inf):
        raise ParameterError(f"{name}={value!r}: SLO limit must be finite and > 0")


@dataclass(frozen=True, order=True)
class NodeSnapshot:
    """Latest GPU sample of one node (ordering = recency, then content)."""

    ts_ms: int
    state: str
    mem_used_bytes: int
    mem_total_bytes: int
    kv_blocks_used: int
    kv_blocks_total: int
    largest_free_block_bytes: int
    # KV allocator fields of that sample; -1 = the sample did not carry it.
    fragmentation_ratio: float = -1.0
    kv_free_bytes: int = -1
    kv_waiting_bytes: int = -1
    kv_generation: int = -1
    free_block_hist: tuple[int, ...] = ()  # free holes per size bin (the sample's own bins); () = absent


@dataclass
class WindowAggregate:
    """Mutable accumulator for one key in one window (see module docstring)."""

    n_requests: int = 0
    n_violations: int = 0
    n_unfixable: int = 0
    n_stage_unfixable: int = 0  # of the unfixable, those the network and preprocess stages explain
    n_errors: int = 0
    n_kv_hits: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    queue_ms_sum: float = 0.0
    e2e: DDSketch = field(default_factory=DDSketch)
    ttft: DDSketch = field(default_factory=DDSketch)
    itl: DDSketch = field(default_factory=DDSketch)
    network: DDSketch = field(default_factory=lambda: UNMEASURED)  # the STAGE_COLUMNS' (not measured: shared)
    preprocess: DDSketch = field(default_factory=lambda: UNMEASURED)
    decode: DDSketch = field(default_factory=lambda: UNMEASURED)
    n_gpu_samples: int = 0
    gpu_util_sum: float = 0.0
    queue_len_sum: float = 0.0
    queue_len_max: float = 0.0
    running_sum: float = 0.0
    nodes: dict[str, NodeSnapshot] = field(default_factory=dict)
    n_agent_signals: int = 0  # requests carrying the three agent signals
    agent_stability_micro: int = 0  # sum of agent_stability, in millionths
    agent_rag_score_micro: int = 0
    agent_tool_conf_micro: int = 0
    n_path_rag: int = 0  # requests by agent_path
    n_path_tool: int = 0
    n_path_llm: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state; inverse of :meth:`from_dict`."""
        out: dict[str, Any] = {k: getattr(self, k) for k in _SCALARS}
        for name in _SKETCHES:
            out[name] = getattr(self, name).to_dict()
        out["nodes"] = {n: vars(s).copy() for n, s in sorted(self.nodes.items())}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowAggregate:
        """Rebuild from :meth:`to_dict` output.

        Examples
        --------
        >>> agg = initialize()
        >>> WindowAggregate.from_dict(agg.to_dict()) == agg
        True
        """
        agg = cls()
        for k, kind in _FIRST:
            setattr(agg, k, kind(data[k]))
        for k in _LATER_FIELDS:
            setattr(agg, k, int(data.get(k, 0)))
        for name in _SKETCHES:
            absent = name in _LATER_SKETCHES and name not in data
            sketch = DDSketch() if absent else DDSketch.from_dict(data[name])
            setattr(agg, name, _stage_sketch(sketch) if name in _STAGE_SKETCHES else sketch)
        agg.nodes = {
            n: NodeSnapshot(**{**s, "free_block_hist": tuple(s.get("free_block_hist", ()))})
            for n, s in data["nodes"].items()
        }
        return agg


check_dataclass(WindowAggregate, AGGREGATE, ordered=False)


def initialize() -> WindowAggregate:
    """A fresh, empty aggregate.

    Examples
    --------
    >>> initialize().n_requests
    0
    """
    return WindowAggregate()


def add_requests(agg: WindowAggregate, cols: Mapping[str, npt.ArrayLike], slo: SloSpec) -> None:
    """Add a batch of finished requests (vectorised, all-or-nothing).

    Parameters
    ----------
    agg : WindowAggregate
        Updated in place.
    cols : mapping of str to array
        Equal-length columns ``ttft_ms, itl_ms, e2e_ms, queue_ms,
        prompt_tokens, output_tokens, kv_hit`` (bool) and ``ok`` (bool,
        ``status == "ok"``).  NaN latency = not measured.  Optionally the
        :data:`AGENT_COLUMNS` (the signals all three or none of them) and
        ``request_class`` (int codes, see the module docstring).
    slo : SloSpec
        Per-request limits deciding violations (per class where it has them).

    Raises
    ------
    ValueError
        A batch :func:`controllers.window_columns.request_batch` rejects:
        missing column, ragged lengths, negative or infinite values, bad
        agent columns.

    Examples
    --------
    >>> agg = initialize()
    >>> cols = {k: np.array([1.0]) for k in REQUEST_COLUMNS}
    >>> cols["ok"] = np.array([False])
    >>> add_requests(agg, cols, SloSpec(500.0, 50.0)); agg.n_errors, agg.n_violations
    (1, 1)
    """
    ok, f, kv_hit, agent, classes, stages = request_batch(cols)
    n = int(ok.size)
    if n == 0:
        return
    ttft_limit, itl_limit = slo.limits(classes)
    with np.errstate(invalid="ignore"):
        bad = ~ok | (f["ttft_ms"] > ttft_limit) | (f["itl_ms"] > itl_limit)
        unfixable = ok & (f["ttft_ms"] - f["queue_ms"] > ttft_limit)
    for name in _SKETCHES:
        arr = f.get(f"{name}_ms") if name not in _STAGE_SKETCHES else (stages or {}).get(_STAGE_SKETCHES[name])
        if arr is None:
            continue
        values, sketch = arr[~np.isnan(arr)], getattr(agg, name)
        if sketch is UNMEASURED:  # the shared empty one: a sketch of its own at the first value
            if not values.size:
                continue
            sketch = DDSketch()
            setattr(agg, name, sketch)
        sketch.add_many(values)
    if stages is not None and ("network_ms" in stages or "preprocess_ms" in stages) and unfixable.any():
        before = sum(np.nan_to_num(stages[k]) for k in ("network_ms", "preprocess_ms") if k in stages)
        with np.errstate(invalid="ignore"):
            # the wait and the stages before a replica taken away, the request meets its limit: they explain the miss
            agg.n_stage_unfixable += int((unfixable & (f["ttft_ms"] - f["queue_ms"] - before <= ttft_limit)).sum())
    agg.n_requests += n
    agg.n_violations += int(bad.sum())
    agg.n_unfixable += int(unfixable.sum())
    agg.n_errors += int((~ok).sum())
    agg.n_kv_hits += int(kv_hit.sum())
    agg.prompt_tokens += int(f["prompt_tokens"].sum())
    agg.output_tokens += int(f["output_tokens"].sum())
    agg.queue_ms_sum += float(np.nansum(f["queue_ms"]))
    if agent is not None:
        signals, path = agent
        carried = ~np.isnan(signals[0])
        agg.n_agent_signals += int(carried.sum())
        for name, arr in zip(AGENT_SIGNAL_COLUMNS, signals, strict=True):
            micro = np.rint(arr[carried] * AGENT_MICRO).astype(np.int64)
            setattr(agg, f"{name}_micro", getattr(agg, f"{name}_micro") + int(micro.sum()))
        for i, p in enumerate(AGENT_PATHS):
            setattr(agg, f"n_path_{p}", getattr(agg, f"n_path_{p}") + int((path == i).sum()))


def add_gpu(
    agg: WindowAggregate,
    cols: Mapping[str, npt.ArrayLike],
    nodes: Sequence[str],
    states: Sequence[str],
    hists: Sequence[Sequence[int] | None] | None = None,
) -> None:
    """Add a batch of GPU samples; ``nodes[i]``/``states[i]`` label row ``i``.

    ``hists[i]`` is row ``i``'s free-block histogram (None: not reported);
    the node's latest snapshot keeps it.

    The per-node snapshot keeps the sample with the latest ``ts_ms`` (ties:
    the larger snapshot tuple, so the result is order-independent).  The
    :data:`KV_COLUMNS` are optional; NaN in them means "not reported".

    Examples
    --------
    >>> agg = initialize()
    >>> cols = {k: np.array([0, 5]) for k in GPU_COLUMNS}
    >>> cols["ts_ms"] = np.array([1, 2]); cols["gpu_util"] = np.array([0.5, 0.7])
    >>> add_gpu(agg, cols, ["n1", "n1"], ["starting", "ready"])
    >>> agg.nodes["n1"].state, round(agg.gpu_util_sum, 2)
    ('ready', 1.2)
    """
    ts, f, kv = gpu_batch(cols, nodes, states, hists)
    n = int(ts.size)
    if n == 0:
        return
    agg.n_gpu_samples += n
    agg.gpu_util_sum += float(f["gpu_util"].sum())
    agg.queue_len_sum += float(f["queue_len"].sum())
    agg.queue_len_max = max(agg.queue_len_max, float(f["queue_len"].max()))
    agg.running_sum += float(f["running"].sum())
    for i in range(n):
        extra: list[Any] = []
        for k in KV_COLUMNS:
            v = kv[k][i] if k in kv else math.nan
            absent = bool(np.isnan(v))
            extra.append((-1.0 if absent else float(v)) if k == "fragmentation_ratio" else (-1 if absent else int(v)))
        hist = hists[i] if hists is not None else None
        if hist is not None and any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in hist):
            raise ValueError(f"free_block_hist of row {i}: must be ints >= 0")
        fields: list[Any] = [
            int(ts[i]),
            str(states[i]),
            *(int(f[k][i]) for k in GPU_COLUMNS[4:]),
            *extra,
            tuple(hist) if hist is not None else (),
        ]
        snap = NodeSnapshot(*fields)
        prev = agg.nodes.get(nodes[i])
        if prev is None or snap > prev:
            agg.nodes[nodes[i]] = snap


def merge(a: WindowAggregate, b: WindowAggregate) -> WindowAggregate:
    """Combine two aggregates into a new one (inputs untouched).

    Examples
    --------
    >>> m = merge(initialize(), initialize()); m.n_requests
    0
    """
    out = WindowAggregate()
    for k in _SUMMED:
        setattr(out, k, getattr(a, k) + getattr(b, k))
    for k in _MAXED:
        setattr(out, k, max(getattr(a, k), getattr(b, k)))
    for name in _SKETCHES:
        if getattr(a, name) is UNMEASURED and getattr(b, name) is UNMEASURED:
            continue  # out holds the shared one already
        sk = getattr(a, name).copy()
        sk.merge(getattr(b, name))
        setattr(out, name, sk)
    out.nodes = dict(a.nodes)
    for node, snap in b.nodes.items():
        prev = out.nodes.get(node)
        if prev is None or snap > prev:
            out.nodes[node] = snap
    return out
