"""The window's shape, listed once: the columns it reads, the aggregate it keeps, the record it publishes.

One window exists in three forms, each made from (or checked at import against) the tables here:

- the **columns** of a batch (:mod:`controllers.window_columns` reads them):
  :data:`REQUEST_COLUMNS`, :data:`GPU_COLUMNS`, the optional :data:`KV_COLUMNS` and
  :data:`AGENT_COLUMNS`;
- the **aggregate** of one key in one window (:class:`controllers.windows.WindowAggregate`):
  :data:`AGGREGATE`, each field with how two windows merge it;
- the **record** of a closed window (:func:`controllers.window_result.result`, the header the
  pipeline adds, :class:`controllers.window_record.WindowRecord`): :data:`RECORD`, each field with
  how a decoder checks it, its empty value and who writes it.

The aggregate's and the record's names that follow a column (``agent_stability_micro``,
``agent_stability_mean``, ``n_path_rag``, the KV fields) are made from the column tables, so a
new column is written once.  The dataclasses stay written out (a type checker reads them), and
:func:`check_dataclass` refuses at import one that differs from its table, so the three forms
cannot drift apart.  This module imports nothing from the window modules: they import it.

Examples
--------
>>> [f.name for f in AGGREGATE if f.merge == "sketch"]
['e2e', 'ttft', 'itl', 'network', 'preprocess', 'decode']
>>> [f.name for f in RECORD if f.source == "zone"]
['node_cap_dropped', 'node_cap_dropped_rate']
>>> field_names("node")  # doctest: +NORMALIZE_WHITESPACE
('largest_free_block_bytes', 'fragmentation_ratio', 'kv_free_bytes', 'kv_waiting_bytes',
 'kv_generation', 'free_block_hist')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

from core.vocab import AGENT_PATHS

__all__ = [
    "AGENT_COLUMNS",
    "AGENT_MICRO",
    "AGENT_SIGNAL_COLUMNS",
    "AGGREGATE",
    "GPU_COLUMNS",
    "KV_COLUMNS",
    "RECORD",
    "REQUEST_COLUMNS",
    "REQUIRED",
    "STAGE_COLUMNS",
    "AggField",
    "FieldTableError",
    "RecordField",
    "check_dataclass",
    "check_keys",
    "field_names",
]

# -- the columns ----------------------------------------------------------------------------------
REQUEST_COLUMNS = tuple("ttft_ms itl_ms e2e_ms queue_ms prompt_tokens output_tokens kv_hit ok".split())
GPU_COLUMNS = tuple(
    "ts_ms gpu_util queue_len running mem_used_bytes mem_total_bytes kv_blocks_used "
    "kv_blocks_total largest_free_block_bytes".split()
)
# Optional KV allocator columns of a GPU sample: NaN = the sample has no such
# field (stored as -1 in the snapshot so snapshots stay totally ordered).
KV_COLUMNS = ("fragmentation_ratio", "kv_free_bytes", "kv_waiting_bytes", "kv_generation")
# Optional agent columns of a request batch (NaN = the request did not carry it):
# the three signals of docs/model.md §15 (agents), then the path as an index into AGENT_PATHS.
AGENT_SIGNAL_COLUMNS = ("agent_stability", "agent_rag_score", "agent_tool_conf")
AGENT_COLUMNS = (*AGENT_SIGNAL_COLUMNS, "agent_path")
AGENT_MICRO = 1_000_000  # a window sums the agent signals in integer millionths (exact merges)
# Optional stage latencies of a request batch (NaN = not measured): the time before the request
# reached a replica (network, preprocessing) and its decode.  A window keeps a sketch of each.
STAGE_COLUMNS = ("network_ms", "preprocess_ms", "decode_ms")


class FieldTableError(TypeError):
    """A window dataclass or summary differs from its field table; the message names the fields."""


# -- the aggregate --------------------------------------------------------------------------------
class AggField(NamedTuple):
    """A field of :class:`controllers.windows.WindowAggregate`.

    ``merge``: ``sum`` (counts and sums add), ``max``, ``sketch`` (a DDSketch, merged) or
    ``nodes`` (the per-node snapshots, the latest kept).  ``later``: added after the first
    snapshots were written, so a snapshot without it reads 0.
    """

    name: str
    type: type
    merge: Literal["sum", "max", "sketch", "nodes"]
    later: bool = False


def _counts(names: str) -> tuple[AggField, ...]:
    return tuple(AggField(n, int, "sum") for n in names.split())


#: The aggregate's fields, in its snapshot's order (``WindowAggregate.to_dict``).
AGGREGATE: tuple[AggField, ...] = (
    *_counts("n_requests n_violations n_errors n_kv_hits prompt_tokens output_tokens n_gpu_samples"),
    AggField("queue_ms_sum", float, "sum"),
    AggField("gpu_util_sum", float, "sum"),
    AggField("queue_len_sum", float, "sum"),
    AggField("queue_len_max", float, "max"),
    AggField("running_sum", float, "sum"),
    AggField("n_agent_signals", int, "sum", later=True),  # requests carrying the three agent signals
    *(AggField(f"{c}_micro", int, "sum", later=True) for c in AGENT_SIGNAL_COLUMNS),  # in millionths
    *(AggField(f"n_path_{p}", int, "sum", later=True) for p in AGENT_PATHS),  # requests by agent_path
    AggField("n_unfixable", int, "sum", later=True),
    AggField("n_stage_unfixable", int, "sum", later=True),  # of those, the ones network + preprocess explain
    *(AggField(s, object, "sketch") for s in ("e2e", "ttft", "itl")),
    *(AggField(c.removesuffix("_ms"), object, "sketch", later=True) for c in STAGE_COLUMNS),
    AggField("nodes", dict, "nodes"),
)


# -- the record -----------------------------------------------------------------------------------
#: Kinds of record field, as :func:`controllers.window_record.decode_window` checks a present value:
#: ``text`` a non-empty string; ``time`` / ``int`` an int >= 0; ``num`` a finite number >= 0;
#: ``rate`` a number in [0, 1]; ``opt_*`` the same or None; ``counts`` the agent path counts;
#: ``hist`` a free-block histogram; ``scope`` 'zone' or 'node'.
Kind = Literal["scope", "text", "time", "int", "num", "rate", "opt_num", "opt_int", "opt_rate", "counts", "hist"]
#: Who writes a field: the pipeline's ``header``, :func:`controllers.window_result.result`, the node
#: window's KV fields (:func:`controllers.window_result.node_kv`), or the zone window's node cap.
Source = Literal["header", "result", "node", "zone"]
REQUIRED: Any = dataclasses.MISSING  # the default of a field every record carries


class RecordField(NamedTuple):
    """A field of the window record: its decode check, its empty value (absent), who writes it."""

    name: str
    kind: Kind
    default: Any
    source: Source


def _rec(names: str, kind: Kind, default: Any, source: Source) -> tuple[RecordField, ...]:
    return tuple(RecordField(n, kind, default, source) for n in names.split())


_KV_KINDS: dict[str, Kind] = {"fragmentation_ratio": "opt_rate"}

#: The record's fields, in :class:`controllers.window_record.WindowRecord`'s order.
RECORD: tuple[RecordField, ...] = (
    RecordField("scope", "scope", REQUIRED, "header"),
    *_rec("model zone", "text", REQUIRED, "header"),
    RecordField("window_end_ms", "time", REQUIRED, "header"),
    RecordField("node", "text", None, "header"),  # node windows only (required there)
    RecordField("window_start_ms", "time", -1, "header"),  # -1: absent (decode fills end - window_s)
    RecordField("window_s", "num", 0.0, "header"),
    *_rec("ttft_slo_ms itl_slo_ms", "opt_num", None, "header"),
    *_rec("emitted_ms nodes", "opt_int", None, "header"),
    RecordField("count", "int", 0, "result"),
    RecordField("rate_rps", "num", 0.0, "result"),
    # unfixable: over the TTFT limit even without the wait (capacity cannot fix them); absent: 0
    # stage_unfixable: the unfixable the stages before a replica explain (network + preprocess); absent: 0
    *_rec("violation_rate unfixable_rate stage_unfixable_rate error_rate kv_hit_rate", "rate", 0.0, "result"),
    *_rec("e2e_p50_ms e2e_p95_ms e2e_p99_ms ttft_p50_ms ttft_p95_ms ttft_p99_ms itl_p95_ms", "opt_num", None, "result"),
    # the stage latencies' quantiles (None: no request measured that stage)
    *(RecordField(f"{c[:-3]}_p{q}_ms", "opt_num", None, "result") for c in STAGE_COLUMNS for q in (50, 95)),
    *_rec("prompt_tokens output_tokens", "int", 0, "result"),
    *_rec("queue_ms_mean queue_len_mean queue_len_max running_mean", "opt_num", None, "result"),
    RecordField("gpu_util_mean", "opt_rate", None, "result"),
    *_rec("replicas_ready replicas_starting kv_blocks_used kv_blocks_total", "int", 0, "result"),
    RecordField("largest_free_block_bytes_min", "opt_int", None, "result"),
    RecordField("agent_signals_n", "int", 0, "result"),
    *(RecordField(f"{c}_mean", "opt_rate", None, "result") for c in AGENT_SIGNAL_COLUMNS),
    RecordField("agent_path_counts", "counts", {}, "result"),  # the dataclass makes a fresh {} per record
    # a node window's KV allocator fields (its latest GPU sample; None: not reported)
    RecordField("largest_free_block_bytes", "opt_int", None, "node"),
    *(RecordField(k, _KV_KINDS.get(k, "opt_int"), None, "node") for k in KV_COLUMNS),
    RecordField("free_block_hist", "hist", None, "node"),
    # a zone window's records the node cap dropped, and their share of its records (controllers.node_cap)
    RecordField("node_cap_dropped", "int", 0, "zone"),
    RecordField("node_cap_dropped_rate", "rate", 0.0, "zone"),
)


def field_names(*sources: Source) -> tuple[str, ...]:
    """The record's fields that ``sources`` write, in table order."""
    return tuple(f.name for f in RECORD if f.source in sources)


def _compare(what: str, have: Iterable[str], want: Iterable[str], ordered: bool) -> None:
    have, want = list(have), list(want)
    if (have != want) if ordered else (set(have) != set(want)):
        extra = [n for n in have if n not in want]
        missing = [n for n in want if n not in have]
        raise FieldTableError(
            f"{what}: differs from controllers.window_fields (not in the table: {extra}, "
            f"missing: {missing}{', or out of order' if ordered and not extra and not missing else ''})"
        )


def check_dataclass(cls: type, table: tuple[AggField, ...] | tuple[RecordField, ...], *, ordered: bool) -> None:
    """Refuse a window dataclass whose fields (names, and the record's empty values) differ from ``table``.

    >>> @dataclasses.dataclass
    ... class Two:
    ...     count: int = 0
    ...     rate_rps: float = 0.0
    >>> check_dataclass(Two, RECORD[11:13], ordered=True)
    >>> check_dataclass(Two, RECORD[11:12], ordered=True)
    Traceback (most recent call last):
    ...
    controllers.window_fields.FieldTableError: Two: differs from controllers.window_fields (not in the table: ['rate_rps'], missing: [])
    """
    fields = dataclasses.fields(cls)
    _compare(cls.__name__, (f.name for f in fields), (f.name for f in table), ordered)
    defaults = {f.name: f.default for f in table if isinstance(f, RecordField)}
    wrong = [f.name for f in fields if f.name in defaults and not _same(_default(f), defaults[f.name])]
    if wrong:
        raise FieldTableError(f"{cls.__name__}: the empty values of {wrong} differ from controllers.window_fields")


def _default(f: dataclasses.Field[Any]) -> Any:
    """A dataclass field's empty value (a factory's product; MISSING when it has none)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def check_keys(what: str, keys: Iterable[str], *sources: Source) -> None:
    """Refuse a summary whose keys are not the record's fields that ``sources`` write (any order)."""
    _compare(what, keys, field_names(*sources), ordered=False)
