"""The columns a window aggregates, and the checked reading of one batch of them.

A batch is a mapping of column name to equal-length arrays, as the stream
agent builds it from records.  The column schemas are listed in
:mod:`controllers.window_fields` (re-exported here); this module reads a
batch all-or-nothing: :func:`request_batch` and :func:`gpu_batch`
return the checked arrays, or raise ``ValueError`` before anything is
aggregated.  :mod:`controllers.windows` aggregates what they return
(initialize / add / merge) and re-exports the schemas.

Requests (:data:`REQUEST_COLUMNS`): missing latency measurements are NaN
(e.g. no first token on an error); other columns must not be NaN, and
negative or infinite values reject the whole batch.

Mixed agent load (docs/model.md §15 (agents), optional
:data:`AGENT_COLUMNS`): requests may carry the turn's ``agent_stability``, ``agent_rag_score`` and
``agent_tool_conf`` (each in [0, 1], all three or none; NaN = not carried)
and its ``agent_path`` (:data:`AGENT_PATHS` index, NaN = not carried).

Stage latencies (optional :data:`STAGE_COLUMNS`): ``network_ms``, ``preprocess_ms`` and
``decode_ms`` of each request (NaN = not measured; finite and >= 0 otherwise).

Request classes (optional ``request_class`` column): int codes of
:data:`REQUEST_CLASS_CODES` (0 = no or an unknown class); the windows hold a
request to its class's SLO (:class:`controllers.windows.SloSpec`).

GPU samples (:data:`GPU_COLUMNS`, finite and >= 0) may carry the KV
allocator's :data:`KV_COLUMNS` (NaN = not reported).

Examples
--------
>>> cols = {k: np.array([1.0, 2.0]) for k in REQUEST_COLUMNS}
>>> cols["ttft_ms"] = np.array([np.nan, 3.0])       # not measured: allowed
>>> batch = request_batch(cols)
>>> int(batch.ok.size), batch.agent is None
(2, True)
>>> cols["prompt_tokens"] = np.array([np.nan, 3.0])
>>> request_batch(cols)
Traceback (most recent call last):
...
ValueError: prompt_tokens: NaN is only allowed for latency columns
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from controllers.window_fields import (
    AGENT_COLUMNS,
    AGENT_MICRO,
    AGENT_SIGNAL_COLUMNS,
    GPU_COLUMNS,
    KV_COLUMNS,
    REQUEST_COLUMNS,
    STAGE_COLUMNS,
)
from core.settings import REQUEST_CLASSES
from core.vocab import AGENT_PATHS

__all__ = [
    "AGENT_COLUMNS",
    "AGENT_MICRO",
    "AGENT_PATHS",
    "AGENT_SIGNAL_COLUMNS",
    "GPU_COLUMNS",
    "KV_COLUMNS",
    "REQUEST_CLASS_CODES",
    "REQUEST_COLUMNS",
    "STAGE_COLUMNS",
    "GpuBatch",
    "RequestBatch",
    "agent_columns",
    "column",
    "gpu_batch",
    "request_batch",
]

# Optional request class column: class name -> int code (0, absent from the map: no class / unknown).
REQUEST_CLASS_CODES = {name: i + 1 for i, name in enumerate(REQUEST_CLASSES)}


class RequestBatch(NamedTuple):
    """A checked request batch: ``ok`` and ``kv_hit`` (bool), the float columns, the agent's."""

    ok: Any
    floats: dict[str, Any]  # ttft_ms itl_ms e2e_ms queue_ms prompt_tokens output_tokens
    kv_hit: Any
    agent: tuple[list[Any], Any] | None  # (the three signals, the path); None: not carried
    classes: Any = None  # request class codes (int64, REQUEST_CLASS_CODES); None: not carried
    stages: dict[str, Any] | None = None  # the STAGE_COLUMNS the batch carries (NaN: not measured); None: none


class GpuBatch(NamedTuple):
    """A checked GPU batch: ``ts_ms`` (int64), the other columns, the KV columns present."""

    ts: Any
    floats: dict[str, Any]  # GPU_COLUMNS[1:]
    kv: dict[str, Any]  # the KV_COLUMNS the batch carries (NaN: absent)


def column(cols: Mapping[str, Any], name: str, n: int | None, dtype: Any) -> Any:
    """Column ``name`` as a flat array of ``dtype``, of length ``n`` unless None.

    Examples
    --------
    >>> column({"x": [[1, 2]]}, "x", 2, np.float64).tolist()
    [1.0, 2.0]
    >>> column({"x": [1]}, "x", 2, np.float64)
    Traceback (most recent call last):
    ...
    ValueError: x: length 1 differs from 2
    """
    if name not in cols:
        raise ValueError(f"{name}: missing column")
    arr = np.asarray(cols[name], dtype=dtype).ravel()
    if n is not None and arr.size != n:
        raise ValueError(f"{name}: length {arr.size} differs from {n}")
    return arr


def request_batch(cols: Mapping[str, npt.ArrayLike]) -> RequestBatch:
    """Read a batch of finished requests (see the module docstring for the checks).

    Raises
    ------
    ValueError
        Missing column, ragged lengths, negative or infinite values; agent
        signals outside [0, 1] or not carried together, a path index not in
        ``0..2``; a request class code that is not an integer >= 0; a stage latency
        that is negative or infinite.
    """
    ok = column(cols, "ok", None, bool)
    n = int(ok.size)
    f = {
        k: column(cols, k, n, np.float64)
        for k in ("ttft_ms", "itl_ms", "e2e_ms", "queue_ms", "prompt_tokens", "output_tokens")
    }
    kv_hit = column(cols, "kv_hit", n, bool)
    for name, arr in f.items():
        if np.any(np.isinf(arr)) or np.any(arr < 0.0):
            raise ValueError(f"{name}: values must be finite and >= 0")
        if name not in ("ttft_ms", "itl_ms", "e2e_ms", "queue_ms") and np.any(np.isnan(arr)):
            raise ValueError(f"{name}: NaN is only allowed for latency columns")
    classes = None
    if "request_class" in cols:
        raw = column(cols, "request_class", n, np.float64)
        if not np.all(np.isfinite(raw)) or np.any(raw < 0) or np.any(raw != np.floor(raw)) or np.any(raw > 2**31):
            raise ValueError("request_class: codes must be integers >= 0 (0: no class)")
        classes = raw.astype(np.int64)
    stages = {k: column(cols, k, n, np.float64) for k in STAGE_COLUMNS if k in cols}
    for name, arr in stages.items():
        if np.any(np.isinf(arr)) or np.any(arr < 0.0):
            raise ValueError(f"{name}: values must be finite (NaN: not measured) and >= 0")
    return RequestBatch(ok, f, kv_hit, agent_columns(cols, n), classes, stages or None)


def agent_columns(cols: Mapping[str, npt.ArrayLike], n: int) -> tuple[list[Any], Any] | None:
    """The checked agent columns of a request batch (None: the batch has none).

    Examples
    --------
    >>> signals, path = agent_columns({"agent_stability": [0.5], "agent_rag_score": [1.0],
    ...                                "agent_tool_conf": [0.0], "agent_path": [2]}, 1)
    >>> [s.tolist() for s in signals], AGENT_PATHS[int(path[0])]
    ([[0.5], [1.0], [0.0]], 'llm')
    >>> agent_columns({"agent_stability": [0.5]}, 1)
    Traceback (most recent call last):
    ...
    ValueError: agent_rag_score: the agent signals must be carried together (NaN: none)
    """
    if not any(k in cols for k in AGENT_COLUMNS):
        return None
    signals = [column(cols, k, n, np.float64) if k in cols else np.full(n, np.nan) for k in AGENT_SIGNAL_COLUMNS]
    path = column(cols, "agent_path", n, np.float64) if "agent_path" in cols else np.full(n, np.nan)
    absent = np.isnan(signals[0])
    for name, arr in zip(AGENT_SIGNAL_COLUMNS, signals, strict=True):
        if not np.array_equal(np.isnan(arr), absent):
            raise ValueError(f"{name}: the agent signals must be carried together (NaN: none)")
        if np.any(arr[~absent] < 0.0) or np.any(arr[~absent] > 1.0):
            raise ValueError(f"{name}: agent signals must lie in [0, 1]")
    known = path[~np.isnan(path)]
    if not np.all(np.isin(known, np.arange(len(AGENT_PATHS)))):
        raise ValueError(f"agent_path: must be an index into {AGENT_PATHS} (NaN: none)")
    return signals, path


def gpu_batch(
    cols: Mapping[str, npt.ArrayLike],
    nodes: Sequence[str],
    states: Sequence[str],
    hists: Sequence[Sequence[int] | None] | None = None,
) -> GpuBatch:
    """Read a batch of GPU samples; ``nodes``, ``states`` and ``hists`` must match its length.

    Examples
    --------
    >>> cols = {k: np.array([0, 5]) for k in GPU_COLUMNS}
    >>> gpu_batch(cols, ["n1", "n1"], ["ready", "ready"]).ts.tolist()
    [0, 5]
    >>> gpu_batch({**cols, "kv_free_bytes": [np.inf, 0]}, ["n1", "n1"], ["ready", "ready"])
    Traceback (most recent call last):
    ...
    ValueError: kv_free_bytes: values must be finite (NaN: absent) and >= 0
    """
    ts = column(cols, "ts_ms", None, np.int64)
    n = int(ts.size)
    if len(nodes) != n or len(states) != n or (hists is not None and len(hists) != n):
        raise ValueError(f"nodes/states/hists: lengths {len(nodes)}/{len(states)} differ from {n}")
    f = {k: column(cols, k, n, np.float64) for k in GPU_COLUMNS[1:]}
    for name, arr in f.items():
        if not np.all(np.isfinite(arr)) or np.any(arr < 0.0):
            raise ValueError(f"{name}: values must be finite and >= 0")
    kv = {k: column(cols, k, n, np.float64) for k in KV_COLUMNS if k in cols}
    for name, arr in kv.items():
        if np.any(np.isinf(arr)) or np.any(arr < 0.0):
            raise ValueError(f"{name}: values must be finite (NaN: absent) and >= 0")
    return GpuBatch(ts, f, kv)
