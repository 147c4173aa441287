"""Telemetry -> validated records -> event-time windows -> window metrics.

:class:`TelemetryProcessor` is what the ingest agent runs for each Kafka
message; it holds no connection and does no I/O, so it is tested without a
broker and reused by the fast simulator.  Per message it

1. decodes the batch envelope (a broken envelope is one dead letter),
2. validates every record (each bad one becomes a dead letter with its
   reason and its source topic/partition/offset/index),
3. admits the valid ones: a model not in GOVERNOR_MODELS, a zone not in
   GOVERNOR_ZONES, a time stamp more than GOVERNOR_MAX_FUTURE_S ahead of the
   clock and a window that already closed (late) are dead-lettered, each with
   its kind (:data:`core.vocab.DEAD_LETTER_KINDS`); a node a (model, zone)
   window has no slot for (GOVERNOR_MAX_NODES_PER_WINDOW, known nodes first:
   :mod:`controllers.node_cap`) is counted, and one ``too many nodes`` dead
   letter per window says how many records the cap dropped (:meth:`TelemetryProcessor.drain_dead_letters`);
4. adds the admitted ones to the tumbling window of their (model, zone, node).  Rows are buffered per window and
   aggregated as numpy columns in blocks (``FLUSH_ROWS``) and at close, so the
   numpy cost is per block, not per message.

A columnar message (:mod:`governor_telemetry.columnar`) takes the same steps a
column at a time: :mod:`controllers.record_columns` checks every field of every
row with numpy, the admission checks are vectorised, and the rows go to their
windows as arrays, without a Python object per record; the rows a check refuses
(or does not vouch for) take the per-record path, so each bad one is
dead-lettered with :func:`validate_record`'s reason, its row index and its
section (``source["section"]``), as a row batch's would be.

A request record's ``request_class`` travels as an int code column
(:data:`controllers.window_columns.REQUEST_CLASS_CODES`, 0 = none or unknown), so
the window holds each request to its class's SLO (``ModelSpec.classes``) without
a Python object per record; records without one (scraped metrics) get the model's.

The watermark never runs ahead of the clock: a record stamped ahead of it
(within the allowance) is windowed, but its window closes when the clock gets
there, so one record from a skewed or hostile producer cannot close the
current windows early and make every good record after it late.  Open
windows are bounded by models x zones x GOVERNOR_MAX_NODES_PER_WINDOW x the
windows between the closed horizon and clock + allowance
(:attr:`TelemetryProcessor.max_open_windows`).  Dead letters are bounded
(:mod:`loop.deadletters`).  A caller without a wall clock (``now_ms``
before 2000: tests that pass 0) gets neither the future check nor the cap.

:meth:`TelemetryProcessor.close_due` closes windows whose end plus the
allowed lateness has passed (by event time, or by the clock when traffic
stops) and returns one metrics record per node and one per (model, zone),
the latter merged from the node windows.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from governor_telemetry.columnar import SECTIONS, ColumnBatch, Section, decode_message
from governor_telemetry.records import (
    EnvelopeError,
    request_columns,
    show,
    validate_record,
)
from governor_telemetry.typed import TypedColumn

from controllers import typed_columns
from controllers.node_cap import NodeCap, dropped_rate
from controllers.record_columns import check_gpus, check_requests
from controllers.window_columns import AGENT_COLUMNS, AGENT_PATHS, REQUEST_CLASS_CODES, STAGE_COLUMNS
from controllers.window_record import METRICS_SCHEMA_VERSION
from controllers.window_result import node_result, result
from controllers.window_tracker import WindowTracker
from controllers.windows import (
    SloSpec,
    WindowAggregate,
    add_gpu,
    add_requests,
    merge,
)
from core.settings import REQUEST_CLASSES, ModelSpec, Settings
from loop.deadletters import dead_letter

__all__ = ["ProcessResult", "TelemetryProcessor", "dead_letter"]

log = logging.getLogger(__name__)

# An ingest clock before 2000-01-01 is no wall clock (unit tests pass 0): no future check, no cap.
CLOCK_FLOOR_MS = 946_684_800_000


@dataclass
class ProcessResult:
    valid: int = 0
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    max_ts_ms: int | None = None  # the latest event time windowed from this message (None: nothing windowed)
    capped: int = 0  # records dropped by the node cap (one dead letter per window when it closes)
    encodings: Counter[str] = field(default_factory=Counter)  # messages decoded, by encoding (rows, columns, typed)


def _hist(hist: list[Any] | None) -> list[int] | None:
    """A validated free-block histogram as ints (producers may write 2.0 for 2)."""
    return None if hist is None else [int(v) for v in hist]


def _nan_if_none(v: Any) -> Any:
    """An absent ``queue_ms`` is *not measured* (NaN), never 0: a 0 wait would make every TTFT miss
    of a producer that does not report waits look unfixable (controllers.windows)."""
    return math.nan if v is None else v


def _none_as_nan(col: list[Any]) -> list[Any]:
    """:func:`_nan_if_none` for every value (the column itself when none is absent, as :func:`_or`)."""
    return [math.nan if v is None else v for v in col] if None in col else col


def _or(col: list[Any], default: Any) -> list[Any]:
    """``v or default`` for every value, as the per-record path reads optional fields."""
    return [v or default for v in col] if None in col else col


def _raw_text(raw: Any) -> Any:
    """A message as text for its dead letter (a big one stays bytes: the dead letter cuts it)."""
    if isinstance(raw, bytes | bytearray | memoryview) and len(raw) <= 65536:
        return bytes(raw).decode("utf-8", errors="replace")
    return raw


# The node cap's dead letters of closed windows kept until the caller drains them (one per window).
MAX_CAP_LETTERS = 1024

# Rows of a window are buffered as Python lists and handed to the (vectorised)
# window aggregation in blocks of at least this many, or when the window
# closes: numpy's per-call cost (~0.3 ms for one add_requests) then no longer
# scales with the number of messages, only with the number of windows.
FLUSH_ROWS = 2048
# Rows of a columnar message for one window below this many join the window's row lists (an
# array per column costs ~100 bytes each: 10k windows of one row each would hold MBs of them).
BLOCK_ROWS = 32

_REQUEST_COLUMNS = (
    "ttft_ms",
    "itl_ms",
    "e2e_ms",
    "queue_ms",
    "prompt_tokens",
    "output_tokens",
    "kv_hit",
    "ok",
    "request_class",  # REQUEST_CLASS_CODES (0: none or unknown); aggregated only where the model has class SLOs
    *STAGE_COLUMNS,  # stage latencies (controllers.window_columns.STAGE_COLUMNS): None -> NaN = not measured
)
_GPU_COLUMNS = (
    "ts_ms",
    "gpu_util",
    "queue_len",
    "running",
    "mem_used_bytes",
    "mem_total_bytes",
    "kv_blocks_used",
    "kv_blocks_total",
    "largest_free_block_bytes",
    # KV allocator fields (controllers.window_columns.KV_COLUMNS): None -> NaN = not reported
    "fragmentation_ratio",
    "kv_free_bytes",
    "kv_waiting_bytes",
    "kv_generation",
)
# Agent fields of a request (controllers.window_columns.AGENT_COLUMNS): None -> NaN, the path -> its index.
_AGENT_FIELDS = ("agent_stability", "agent_rag_score", "agent_tool_conf")
_PATH_INDEX = {p: float(i) for i, p in enumerate(AGENT_PATHS)}
_NAN = float("nan")
_KV_FIELDS = frozenset(_GPU_COLUMNS[-4:])  # reported or not (NaN), never read as 0


def _slo_spec(model: ModelSpec) -> SloSpec:
    """The window SLO of a model: its own, and one per request class where it overrides any."""
    by_class = tuple(model.slo(c) for c in REQUEST_CLASSES) if model.classes else ()
    return SloSpec(model.ttft_slo_ms, model.itl_slo_ms, by_class)


def _class_codes(col: list[Any]) -> list[int]:
    """The request class codes of a validated column (None or an unknown class: 0)."""
    if col.count(None) == len(col):
        return [0] * len(col)
    get = REQUEST_CLASS_CODES.get
    return [get(c, 0) for c in col]


def _codes(col: list[Any] | TypedColumn, n: int) -> tuple[Any, list[Any]]:
    """A string column as int codes into its distinct values (-1: not a string; such rows are suspect)."""
    if type(col) is TypedColumn:
        return typed_columns.codes(col)
    first = col[0]
    if type(first) is str and col.count(first) == n:  # the usual batch: one model, zone and node
        return np.zeros(n, np.int64), [first]
    try:
        distinct = dict.fromkeys(col)  # in C: the distinct values in order (messages taken together: a few)
    except TypeError:  # an unhashable value (a list): a suspect row
        index: dict[str, int] = {}
        codes = np.fromiter((index.setdefault(v, len(index)) if type(v) is str else -1 for v in col), np.int64, n)
        return codes, list(index)
    vocab = [v for v in distinct if type(v) is str]
    code = {v: -1 for v in distinct if type(v) is not str}  # (1, 1.0 and True are one key: -1 all the same)
    code.update((v, i) for i, v in enumerate(vocab))
    return np.fromiter(map(code.__getitem__, col), np.int64, n), vocab


def _groups(good: Any, *keys: Any) -> list[tuple[tuple[int, ...], Any]]:
    """The rows ``good`` grouped by their key columns: (key, row indices) in order of first row."""
    cols = [k[good] for k in keys]
    # The usual batch is one key: a column is constant when its min and max agree.
    lows, highs = np.min(cols, axis=1), np.max(cols, axis=1)
    if (lows == highs).all():
        return [(tuple(lows.tolist()), good)]
    # Several keys (a message of many nodes): one int64 key per row, mixed radix over each column's
    # offset from its minimum, then one stable sort -- not a 2-D unique and a mask per group.  Keys
    # whose ranges multiply past int64 (window starts years apart) take the 2-D unique.
    mixed, radix = np.zeros(len(good), np.int64), 1
    for col, low, high in zip(cols, lows.tolist(), highs.tolist(), strict=True):
        mixed += (col - low) * radix
        radix *= high - low + 1
        if radix >= 2**62:
            return _groups_2d(good, cols)
    order = np.argsort(mixed, kind="stable")  # each group's rows in their order
    bounds = [0, *(np.flatnonzero(np.diff(mixed[order])) + 1).tolist(), len(order)]
    firsts = order[bounds[:-1]].tolist()
    out = []
    for g in sorted(range(len(firsts)), key=firsts.__getitem__):  # groups in order of first row
        first = firsts[g]
        out.append((tuple(int(c[first]) for c in cols), good[order[bounds[g] : bounds[g + 1]]]))
    return out


def _groups_2d(good: Any, cols: list[Any]) -> list[tuple[tuple[int, ...], Any]]:
    """:func:`_groups` by a 2-D unique of the key columns (any number of rows and distinct values)."""
    uniq, first, inv = np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)
    inv = inv.ravel()
    return [(tuple(int(v) for v in uniq[g]), good[inv == g]) for g in np.argsort(first, kind="stable").tolist()]


def _latest_ts(batch: ColumnBatch) -> int | None:
    """The latest ``ts_ms`` of a columnar message (None: no rows, or a value that is no finite number)."""
    latest = None
    for section in batch.sections.values():
        col = section.cols.get("ts_ms")
        if type(col) is TypedColumn:
            last = typed_columns.latest_ts(col)
            if last is None:
                return None
        else:
            try:
                last = math.ceil(max(col))  # type: ignore[arg-type]  # TypeError: None, a string; ValueError: NaN
            except (TypeError, ValueError, OverflowError):
                return None
        latest = last if latest is None else max(latest, last)
    return latest


def _concat(kind: str, sections: Sequence[Section]) -> Section:
    """Sections of one kind as one, in order (a column one of them lacks: None, absent, for its rows)."""
    names = dict.fromkeys(name for s in sections for name in s.cols)
    cols: dict[str, list[Any] | TypedColumn] = {}
    for name in names:
        parts = [s.cols.get(name) for s in sections]
        if any(type(p) is TypedColumn for p in parts):
            joined = typed_columns.join(parts, [s.n for s in sections])
            if joined is not None:
                cols[name] = joined
                continue
        col: list[Any] = []
        for s in sections:
            part = s.column(name)
            col += [None] * s.n if part is None else part
        cols[name] = col
    return Section(kind, sum(s.n for s in sections), cols)


def _parts(
    section: Section, source: Mapping[str, Any], parts: Sequence[tuple[Section, Mapping[str, Any]]]
) -> list[tuple[Section, Mapping[str, Any], int]]:
    """(section, source, first row in ``section``) of each part ``section`` was joined from (itself: none)."""
    if not parts:
        return [(section, source, 0)]
    out, first = [], 0
    for part, src in parts:
        out.append((part, src, first))
        first += part.n
    return out


def _zero_nan(arr: Any, zero: Any) -> Any:
    """An optional column with absent values (NaN) as 0, as the per-record path reads ``get(name) or 0``."""
    if arr is None:
        return zero
    return np.nan_to_num(arr, nan=0.0, posinf=np.inf, neginf=-np.inf) if np.isnan(arr).any() else arr


def _gpu_column(num: Mapping[str, Any], name: str, n: int) -> Any:
    """A GPU column for the windows: the KV allocator's absent as NaN, the other optional ones as 0."""
    arr = num.get(name)
    if name in _KV_FIELDS:
        return np.full(n, np.nan) if arr is None else arr
    return _zero_nan(arr, np.zeros(n))


def _agent_row(get: Any) -> list[list[Any]] | None:
    """One request's agent columns (None: it carries no agent field)."""
    s, r, t, p = get("agent_stability"), get("agent_rag_score"), get("agent_tool_conf"), get("agent_path")
    if s is None and p is None:  # the signals come all three or none (validated)
        return None
    if s is None:
        return [[_NAN], [_NAN], [_NAN], [_PATH_INDEX[p]]]
    return [[s], [r], [t], [_NAN if p is None else _PATH_INDEX[p]]]


def _agent_columns(cols: Mapping[str, list[Any]]) -> list[list[Any]] | None:
    """The agent columns of a validated batch (None: no record carries an agent field)."""
    n = len(cols["agent_path"])
    if cols["agent_stability"].count(None) == n and cols["agent_path"].count(None) == n:
        return None
    out = [[_NAN if v is None else v for v in cols[name]] for name in _AGENT_FIELDS]
    return [*out, [_NAN if v is None else _PATH_INDEX[v] for v in cols["agent_path"]]]


class _Pending:
    """Validated rows of one (model, zone, node) window not yet aggregated."""

    __slots__ = ("agg", "slo", "requests", "agent", "gpus", "blocks", "block_rows", "gblocks")

    def __init__(self, agg: WindowAggregate, slo: SloSpec) -> None:
        self.agg = agg
        self.slo = slo
        # The buffers are made with their first row and dropped at each flush: an open window
        # (one per (model, zone, node)) that holds no rows holds no empty lists either.
        self.requests: list[list[Any]] | None = None  # one list per _REQUEST_COLUMNS
        # The AGENT_COLUMNS of the same rows, from the first row that carries one (NaN before).
        self.agent: list[list[Any]] | None = None
        # GPU rows: the _GPU_COLUMNS values, then node, state and free_block_hist (None: not reported).
        self.gpus: list[tuple[Any, ...]] | None = None
        # Rows of columnar messages, as arrays (after the rows above): request blocks (_REQUEST_COLUMNS
        # arrays, AGENT_COLUMNS arrays or None) and GPU blocks (_GPU_COLUMNS arrays, nodes, states, hists).
        self.blocks: list[tuple[list[Any], list[Any] | None]] | None = None
        self.block_rows = 0
        self.gblocks: list[tuple[list[Any], list[str], list[str], list[list[int] | None]]] | None = None

    def _rows(self) -> int:
        return len(self.requests[0]) if self.requests else 0

    def extend_requests(self, cols: Sequence[Sequence[Any]], agent: Sequence[Sequence[Any]] | None = None) -> None:
        if self.requests is None:
            self.requests = [[] for _ in _REQUEST_COLUMNS]
        if agent is not None and self.agent is None:
            self.agent = [[_NAN] * len(self.requests[0]) for _ in AGENT_COLUMNS]
        if self.agent is not None:
            for buf, col in zip(self.agent, agent or [[_NAN] * len(cols[0])] * len(AGENT_COLUMNS), strict=True):
                buf.extend(col)
        for buf, col in zip(self.requests, cols, strict=True):
            buf.extend(col)
        if len(self.requests[0]) + self.block_rows >= FLUSH_ROWS:
            self.flush()

    def add_gpu_row(self, row: tuple[Any, ...]) -> None:
        """One GPU sample: its _GPU_COLUMNS values, node, state and histogram."""
        if self.gpus is None:
            self.gpus = []
        self.gpus.append(row)
        if len(self.gpus) >= FLUSH_ROWS:
            self.flush()

    def add_block(self, cols: list[Any], agent: list[Any] | None) -> None:
        """Request rows of a columnar message: one float64 array per _REQUEST_COLUMNS (and AGENT_COLUMNS)."""
        if self.blocks is None:
            self.blocks = []
        self.blocks.append((cols, agent))
        self.block_rows += len(cols[0])
        if self._rows() + self.block_rows >= FLUSH_ROWS:
            self.flush()

    def add_gpu_block(self, cols: list[Any], nodes: list[str], states: list[str], hists: list[Any]) -> None:
        """GPU rows of a columnar message: one array per _GPU_COLUMNS (ts_ms int64), their labels."""
        if self.gblocks is None:
            self.gblocks = []
        self.gblocks.append((cols, nodes, states, hists))
        if len(self.gpus or ()) + sum(len(b[1]) for b in self.gblocks) >= FLUSH_ROWS:
            self.flush()

    def _request_arrays(self) -> dict[str, Any]:
        """The buffered request rows as float64 columns: the per-record rows, then the blocks, in order."""
        n_rows, blocks = self._rows(), self.blocks or []
        parts: list[list[Any]] = [[] for _ in _REQUEST_COLUMNS]
        if self.requests and n_rows:
            for part, col in zip(parts, self.requests, strict=True):
                part.append(np.array(col, dtype=np.float64))
        for cols, _ in blocks:
            for part, arr in zip(parts, cols, strict=True):
                part.append(arr)
        out = {name: np.concatenate(p) if len(p) > 1 else p[0] for name, p in zip(_REQUEST_COLUMNS, parts, strict=True)}
        if self.agent is not None or any(agent is not None for _, agent in blocks):
            aparts: list[list[Any]] = [[] for _ in AGENT_COLUMNS]
            if n_rows:
                for part, col in zip(aparts, self.agent or [[_NAN] * n_rows] * len(AGENT_COLUMNS), strict=True):
                    part.append(np.array(col, dtype=np.float64))
            for cols, agent in blocks:
                for part, arr in zip(
                    aparts, agent or [np.full(len(cols[0]), np.nan)] * len(AGENT_COLUMNS), strict=True
                ):
                    part.append(arr)
            out.update((name, np.concatenate(p)) for name, p in zip(AGENT_COLUMNS, aparts, strict=True))
        return out

    def flush(self) -> None:
        if self._rows() or self.blocks:
            cols = self._request_arrays()
            if not self.slo.class_limits:
                del cols["request_class"]  # one SLO for every class: the codes change nothing
            add_requests(self.agg, cols, self.slo)
        self.requests, self.agent, self.blocks, self.block_rows = None, None, None, 0
        if self.gpus or self.gblocks:
            parts: list[list[Any]] = [[] for _ in _GPU_COLUMNS]
            nodes: list[str] = []
            states: list[str] = []
            hists: list[list[int] | None] = []
            if self.gpus:
                k = len(_GPU_COLUMNS)
                gcols = np.array([row[:k] for row in self.gpus], dtype=np.float64).T
                for i, part in enumerate(parts):
                    part.append(gcols[i])
                parts[0][0] = np.array([row[0] for row in self.gpus], dtype=np.int64)
                nodes = [row[k] for row in self.gpus]
                states = [row[k + 1] for row in self.gpus]
                hists = [row[k + 2] for row in self.gpus]
            for gcols_b, bnodes, bstates, bhists in self.gblocks or ():
                for part, arr in zip(parts, gcols_b, strict=True):
                    part.append(arr)
                nodes, states, hists = nodes + bnodes, states + bstates, hists + bhists
            gpu = {name: np.concatenate(p) if len(p) > 1 else p[0] for name, p in zip(_GPU_COLUMNS, parts, strict=True)}
            add_gpu(self.agg, gpu, nodes, states, hists)
        self.gpus, self.gblocks = None, None


class TelemetryProcessor:
    """Per-message ingest (``process``) and window closing (``close_due``).

    Valid rows are buffered per window and aggregated in blocks; ``close_due``
    aggregates a window's rows before it emits the window.  Call :meth:`flush`
    before reading ``tracker``'s open aggregates directly.
    """

    def __init__(self, settings: Settings) -> None:
        self.window_s = settings.window_s
        self.size_ms = int(round(settings.window_s * 1000))
        self.tracker = WindowTracker(self.size_ms, int(round(settings.lateness_s * 1000)))
        # The clock closes windows only after this long without any message.
        self.idle_close_ms = int(round(settings.lateness_s * 1000)) + self.size_ms
        self._last_message_ms: int | None = None
        self._caught_up = True
        self.slos = {m.name: _slo_spec(m) for m in settings.models}
        self.zones = frozenset(settings.zones)
        self.max_future_ms = int(round(settings.max_future_s * 1000))
        self.max_nodes = settings.max_nodes_per_window
        self.records_in = 0
        self.dead_letter_count = 0
        self.dead_by_kind: Counter[str] = Counter()
        self.late_count = 0
        self.windows_closed = 0
        self._pending: dict[tuple[tuple[str, str, str], int], _Pending] = {}
        self._nodes_in: dict[tuple[str, str, int], int] = {}  # (model, zone, start) -> nodes open
        self.node_cap = NodeCap(self.max_nodes, self.size_ms)  # who gets those slots; what the cap dropped
        self._cap_letters: list[dict[str, Any]] = []  # the cap's summaries of closed windows, to publish

    @property
    def open_windows(self) -> int:
        """(model, zone, node) windows open now."""
        return len(self._pending)

    @property
    def max_open_windows(self) -> int:
        """The most (model, zone, node) windows that can be open at once (while the clock
        and the watermark keep up): every configured (model, zone), each window from the
        closed horizon (clock - lateness) to clock + GOVERNOR_MAX_FUTURE_S full."""
        span = self.size_ms + self.tracker.lateness_ms + self.max_future_ms
        return len(self.slos) * len(self.zones) * self.max_nodes * (span // self.size_ms + 2)

    def _dead(self, out: ProcessResult, kind: str, reason: str, source: Mapping[str, Any], rec: Any, now: int) -> None:
        out.dead_letters.append(dead_letter(reason, source, rec, now, kind))
        self.dead_letter_count += 1
        self.dead_by_kind[kind] += 1

    def _observe(self, max_ts: int, now_ms: int, out: ProcessResult) -> None:
        """Advance the watermark, never past a wall clock; note the message's latest windowed time."""
        out.max_ts_ms = max_ts if out.max_ts_ms is None else max(out.max_ts_ms, max_ts)
        self.tracker.observe(max_ts if now_ms < CLOCK_FLOOR_MS else min(max_ts, now_ms))

    def _future_ms(self, now_ms: int) -> int | None:
        """The latest time stamp admitted (None: no wall clock, no limit)."""
        return None if now_ms < CLOCK_FLOOR_MS else now_ms + self.max_future_ms

    # -- ingest -----------------------------------------------------------
    def process(self, raw: Any, source: Mapping[str, Any], now_ms: int) -> ProcessResult:
        out = self._process(raw, source, now_ms)
        self._after_messages(now_ms)
        return out

    def _after_messages(self, now_ms: int) -> None:
        """After a message (or a batch): when the last one came, and whether the watermark has caught up."""
        self._last_message_ms = now_ms
        wm = self.tracker.watermark_ms
        self._caught_up = wm is not None and now_ms - wm <= self.idle_close_ms

    def _process(self, raw: Any, source: Mapping[str, Any], now_ms: int) -> ProcessResult:
        out = ProcessResult()
        records = self._decode(raw, source, now_ms, out)
        if isinstance(records, ColumnBatch):
            self.records_in += records.rows()
            for section in records.sections.values():
                self._process_section(section, source, now_ms, out)
        elif records is not None:
            self._process_rows(records, source, now_ms, out)
        return out

    def _decode(self, raw: Any, source: Mapping[str, Any], now_ms: int, out: ProcessResult) -> Any:
        """A message's records or columns; None: a broken envelope (its dead letter added to ``out``)."""
        try:
            records = decode_message(raw)
        except EnvelopeError as exc:
            self._dead(out, "bad envelope", f"bad envelope: {exc}", source, _raw_text(raw), now_ms)
            return None
        out.encodings[records.encoding if isinstance(records, ColumnBatch) else "rows"] += 1
        return records

    def _process_rows(self, records: list[Any], source: Mapping[str, Any], now_ms: int, out: ProcessResult) -> None:
        self.records_in += len(records)
        rest = self._process_columns(records, now_ms, out) if len(records) > 1 else None
        self._process_records(enumerate(records) if rest is None else rest, source, now_ms, out)

    def process_many(
        self, raws: Sequence[Any], sources: Sequence[Mapping[str, Any]], now_ms: int
    ) -> tuple[ProcessResult, list[dict[str, Any]]]:
        """Messages in their order, taken together: the dead letters and windows that :meth:`process` of
        each, then ``close_due(None, now_ms)``, would give, with the column checks and the windowing of
        consecutive columnar messages done once over their rows together (``max_ts_ms``: of them all).

        A run of columnar messages ends before the message whose predecessors' latest time stamp could
        close a window (one message at a time, windows would close there), so windows close after
        the same messages, a record is late exactly when it is late one message at a time, and a
        row batch is taken alone.  Suspect rows keep their own dead letter (reason, section, index,
        the source of their message).
        """
        out, windows = ProcessResult(), []
        run: list[tuple[ColumnBatch, Mapping[str, Any]]] = []
        latest: int | None = None  # the latest time stamp of the run: a bound on the watermark it makes
        for raw, source in zip(raws, sources, strict=True):
            records = self._decode(raw, source, now_ms, out)
            if records is None:
                continue
            last = _latest_ts(records) if isinstance(records, ColumnBatch) else None
            if run and (last is None or self._would_close(latest, now_ms)):
                windows += self._take_run(run, now_ms, out)
                run, latest = [], None
            if not isinstance(records, ColumnBatch):
                self._process_rows(records, source, now_ms, out)
                windows += self.close_due(None, now_ms)
                continue
            run.append((records, source))
            if last is None:  # a time stamp of no number: taken alone
                windows += self._take_run(run, now_ms, out)
                run = []
            else:
                latest = last if latest is None else max(latest, last)
        if run:
            windows += self._take_run(run, now_ms, out)
        self._after_messages(now_ms)
        return out, windows

    def _would_close(self, latest: int | None, now_ms: int) -> bool:
        """Whether a watermark at ``latest`` (the clock's at most) could close a window not yet closed."""
        closed = self.tracker.closed_ms
        if latest is None:
            return False
        if closed is None:
            return True
        mark = latest if now_ms < CLOCK_FLOOR_MS else min(latest, now_ms)
        return (mark - self.tracker.lateness_ms) // self.size_ms > closed // self.size_ms

    def _take_run(self, run: list[tuple[ColumnBatch, Mapping[str, Any]]], now_ms: int, out: ProcessResult) -> Any:
        """A run of columnar messages: each kind's sections as one (:func:`_concat`), then the windows due."""
        for batch, _ in run:
            self.records_in += batch.rows()
        for kind in SECTIONS:
            parts = [(b.sections[kind], src) for b, src in run if kind in b.sections]
            if len(parts) == 1:
                self._process_section(parts[0][0], parts[0][1], now_ms, out)
            elif parts:
                self._process_section(_concat(kind, [p for p, _ in parts]), parts[0][1], now_ms, out, parts)
        return self.close_due(None, now_ms)  # as the worker after every message (ControlLoop.ingest)

    def _admit(self, rec: Mapping[str, Any], now_ms: int) -> tuple[str, str] | tuple[int, SloSpec]:
        """A valid record's window start and SLO, or the (kind, reason) of its dead letter."""
        model, zone = rec["model"], rec["zone"]
        slo = self.slos.get(model)
        if slo is None:
            return "unknown model", f"no SLO configured for model {show(model)} (GOVERNOR_MODELS)"
        if zone not in self.zones:
            return "unknown zone", f"unknown zone: {show(zone)} is not in GOVERNOR_ZONES"
        ts = rec["ts_ms"]
        if type(ts) is not int:
            ts = int(ts)  # an integral float
        latest = self._future_ms(now_ms)
        if latest is not None and ts > latest:
            return "future", (
                f"future: ts_ms {ts} is {(ts - now_ms) / 1000:.0f} s ahead of the clock "
                f"(GOVERNOR_MAX_FUTURE_S={self.max_future_ms / 1000:g})"
            )
        size = self.size_ms
        start = ts - ts % size
        closed = self.tracker.closed_ms
        if closed is not None and start + size <= closed:
            self.late_count += 1
            return "late", f"late: window [{start}, {start + size}) closed before the record arrived"
        if (((model, zone, rec["node"]), start)) not in self._pending:
            if not self.node_cap.admits(model, zone, rec["node"], start, self._nodes_in.get((model, zone, start), 0)):
                return "too many nodes", ""  # counted per window (NodeCap.drop), not dead-lettered one by one
        return start, slo

    def _open(self, key: tuple[str, str, str], start: int, slo: SloSpec) -> _Pending:
        """The pending rows of a new (model, zone, node) window (admitted: within the node cap)."""
        zkey = (key[0], key[1], start)
        self._nodes_in[zkey] = self._nodes_in.get(zkey, 0) + 1
        self.node_cap.opened(*key, start)
        buf = self._pending[(key, start)] = _Pending(self.tracker.get(key, start), slo)
        return buf

    def _process_records(
        self, records: Iterable[tuple[int, Any]], source: Mapping[str, Any], now_ms: int, out: ProcessResult
    ) -> None:
        """Per-record path: validate and admit each record, dead-letter it with its kind, reason and index."""
        pending = self._pending
        max_ts: int | None = None
        for index, rec in records:
            reason = validate_record(rec)
            if reason is not None:
                self._dead(out, "invalid record", reason, {**source, "index": index}, rec, now_ms)
                continue
            admitted = self._admit(rec, now_ms)
            if isinstance(admitted[0], str):
                kind, why = admitted
                if kind == "too many nodes":
                    ts = int(rec["ts_ms"])
                    self.node_cap.drop(rec["model"], rec["zone"], ts - ts % self.size_ms)
                    out.capped += 1
                    continue
                self._dead(out, kind, why, {**source, "index": index}, rec, now_ms)
                continue
            start, slo = admitted
            ts = int(rec["ts_ms"])
            key = (rec["model"], rec["zone"], rec["node"])
            buf = pending.get((key, start))
            if buf is None:
                buf = self._open(key, start, slo)
            get = rec.get
            if rec["kind"] == "request":
                buf.extend_requests(
                    [
                        [rec["ttft_ms"]],
                        [get("itl_ms") or 0],
                        [rec["e2e_ms"]],
                        [_nan_if_none(get("queue_ms"))],
                        [get("prompt_tokens") or 0],
                        [get("output_tokens") or 0],
                        [get("kv_hit") or False],
                        [rec["status"] == "ok"],
                        [REQUEST_CLASS_CODES.get(get("request_class"), 0)],
                        *([_nan_if_none(get(k))] for k in STAGE_COLUMNS),
                    ],
                    _agent_row(get),
                )
            else:
                buf.add_gpu_row(
                    (
                        ts,
                        rec["gpu_util"],
                        get("queue_len") or 0,
                        get("running") or 0,
                        rec["mem_used_bytes"],
                        rec["mem_total_bytes"],
                        get("kv_blocks_used") or 0,
                        get("kv_blocks_total") or 0,
                        get("largest_free_block_bytes") or 0,
                        get("fragmentation_ratio"),
                        get("kv_free_bytes"),
                        get("kv_waiting_bytes"),
                        get("kv_generation"),
                        rec["node"],
                        rec["state"],
                        _hist(get("free_block_hist")),
                    )
                )
            if max_ts is None or ts > max_ts:
                max_ts = ts
            out.valid += 1
        if max_ts is not None:
            self._observe(max_ts, now_ms, out)

    def _process_columns(self, records: list[Any], now_ms: int, out: ProcessResult) -> list[tuple[int, Any]] | None:
        """Fast path for the request records of a batch when all of them are valid
        and admitted: they are handled a column at a time and the other records
        (GPU samples, anything else) are returned, with their indices, for the
        per-record path.  None: nothing done, every record takes the per-record path."""
        is_request = [type(r) is dict and r.get("kind") == "request" for r in records]
        n = is_request.count(True)
        if n < 2:
            return None
        rest: list[tuple[int, Any]] = []
        if n < len(records):
            rest = [(i, r) for i, r in enumerate(records) if not is_request[i]]
            records = [r for r, req in zip(records, is_request, strict=True) if req]
        cols = request_columns(records)
        if cols is None:
            return None
        models, ts_col = cols["model"], cols["ts_ms"]
        slos = self.slos
        if not set(models) <= slos.keys() or not set(cols["zone"]) <= self.zones:
            return None
        latest = self._future_ms(now_ms)
        if latest is not None and max(ts_col) > latest:
            return None
        size = self.size_ms
        starts = [t - t % size for t in ts_col]
        closed = self.tracker.closed_ms
        if closed is not None and min(starts) + size <= closed:
            return None
        values = [
            cols["ttft_ms"],
            _or(cols["itl_ms"], 0),
            cols["e2e_ms"],
            _none_as_nan(cols["queue_ms"]),
            _or(cols["prompt_tokens"], 0),
            _or(cols["output_tokens"], 0),
            _or(cols["kv_hit"], False),
            [s == "ok" for s in cols["status"]],
            _class_codes(cols["request_class"]),
            *(_none_as_nan(cols[k]) for k in STAGE_COLUMNS),
        ]
        agent = _agent_columns(cols)
        keys = list(zip(models, cols["zone"], cols["node"], starts, strict=True))
        if keys.count(keys[0]) == len(keys):  # the usual batch: one node, one window
            groups: dict[tuple[Any, ...], list[int] | None] = {keys[0]: None}
        else:
            groups = {}
            for i, k in enumerate(keys):
                groups.setdefault(k, []).append(i)  # type: ignore[union-attr]
        new: dict[tuple[str, str, int], list[str]] = {}  # nodes new to their (model, zone) window
        for m, z, n, s in groups:
            if ((m, z, n), s) not in self._pending:
                new.setdefault((m, z, s), []).append(n)
        if not all(self._cap_fits(zkey, nodes) for zkey, nodes in new.items()):
            return None  # the node cap: the per-record path admits what it can and counts the rest
        for (model, zone, node, start), idx in groups.items():
            key = (model, zone, node)
            buf = self._pending.get((key, start))
            if buf is None:
                buf = self._open(key, start, slos[model])
            if idx is None:
                buf.extend_requests(values, agent)
            else:
                buf.extend_requests(
                    [[col[i] for i in idx] for col in values],
                    None if agent is None else [[col[i] for i in idx] for col in agent],
                )
        self._observe(max(ts_col), now_ms, out)
        out.valid += len(records)
        return rest

    def _process_section(
        self,
        section: Section,
        source: Mapping[str, Any],
        now_ms: int,
        out: ProcessResult,
        parts: Sequence[tuple[Section, Mapping[str, Any]]] = (),
    ) -> None:
        """Columnar path: one section's rows checked, admitted and windowed a column at a time (numpy).

        The rows the column checks do not vouch for, and the rows a vectorised admission check
        refuses (unknown model or zone, future, late, past the node cap), take the per-record path:
        it dead-letters each with its reason and its row index (``source`` gets ``section``), or
        takes it when it is valid after all (an integral float in an int field, say).  ``parts``:
        the sections (and their messages' sources) ``section`` was joined from, in order; a row
        for the per-record path is then its own section's row, with its index and source there.
        """
        n, cols = section.n, section.cols
        checked = (check_requests if section.kind == "request" else check_gpus)(cols, n)
        slow = checked.suspect.copy()
        if not slow.all():
            self._window_section(section, checked, slow, now_ms, out)
        if not slow.any():
            return
        for part, src, first in _parts(section, source, parts):
            idx = np.flatnonzero(slow[first : first + part.n]).tolist()
            if idx:
                self._process_records(((i, part.row(i)) for i in idx), {**src, "section": part.kind}, now_ms, out)

    def _window_section(self, section: Section, checked: Any, slow: Any, now_ms: int, out: ProcessResult) -> None:
        """Admit and window the rows of a checked section not in ``slow``; adds to ``slow`` the rows it refuses."""
        n, cols, num = section.n, section.cols, checked.num
        (mcodes, models), (zcodes, zones), (ncodes, nodes) = (_codes(cols[k], n) for k in ("model", "zone", "node"))
        for codes, vocab, known in ((mcodes, models, self.slos.keys()), (zcodes, zones, self.zones)):
            unknown = [i for i, v in enumerate(vocab) if v not in known]
            if unknown:
                slow |= np.isin(codes, unknown)
        ts, size = checked.ts, self.size_ms
        latest = self._future_ms(now_ms)
        if latest is not None:
            slow |= ts > latest
        starts = ts - ts % size
        closed = self.tracker.closed_ms
        if closed is not None:
            slow |= starts + size <= closed
        good = np.flatnonzero(~slow)
        if not good.size:
            return
        groups = _groups(good, mcodes, zcodes, ncodes, starts)
        keyed = [((models[m], zones[z], nodes[nd]), s, idx) for (m, z, nd, s), idx in groups]
        new: dict[tuple[str, str, int], list[str]] = {}  # new nodes per (model, zone, window)
        for k, s, _ in keyed:
            if (k, s) not in self._pending:
                new.setdefault((k[0], k[1], s), []).append(k[2])
        over = {zk for zk, nodes in new.items() if not self._cap_fits(zk, nodes)}
        if over:  # the node cap: the per-record path takes the new nodes it admits, counts the rest
            for k, s, idx in keyed:
                if (k[0], k[1], s) in over and (k, s) not in self._pending:
                    slow[idx] = True
            keyed = [(k, s, idx) for k, s, idx in keyed if not slow[idx[0]]]
            if not keyed:
                return
        whole = len(keyed) == 1 and len(keyed[0][2]) == n
        if section.kind == "request":
            zero = np.zeros(n)
            values = [
                num["ttft_ms"],
                *(_zero_nan(num.get(k), zero) for k in ("itl_ms",)),
                num["e2e_ms"],
                num.get("queue_ms", np.full(n, np.nan)),  # a wait not measured stays NaN: fixable (controllers.windows)
                *(_zero_nan(num.get(k), zero) for k in ("prompt_tokens", "output_tokens", "kv_hit")),
                num["ok"],
                num.get("request_class", zero),
                *(num[k] if k in num else np.full(n, np.nan) for k in STAGE_COLUMNS),  # not measured: NaN
            ]
            agent = None
            if any(k in num for k in AGENT_COLUMNS):
                agent = [num.get(k, np.full(n, np.nan)) for k in AGENT_COLUMNS]
            rvals: list[tuple[Any, ...]] | None = None  # each row's values, made once for the groups of a few rows
            avals: list[tuple[Any, ...]] | None = None
            for key, start, idx in keyed:
                buf = self._pending.get((key, start)) or self._open(key, start, self.slos[key[0]])
                if len(idx) < BLOCK_ROWS:  # a few rows: as lists, an array each would cost more than they
                    if rvals is None:
                        rvals = list(zip(*(v.tolist() for v in values), strict=True))
                        avals = None if agent is None else list(zip(*(a.tolist() for a in agent), strict=True))
                    rows = idx.tolist()
                    buf.extend_requests(
                        list(zip(*(rvals[i] for i in rows), strict=True)),
                        None if avals is None else list(zip(*(avals[i] for i in rows), strict=True)),
                    )
                elif whole:
                    buf.add_block(values, agent)
                else:
                    buf.add_block([v[idx] for v in values], None if agent is None else [a[idx] for a in agent])
        else:
            gvalues = [ts, *(_gpu_column(num, k, n) for k in _GPU_COLUMNS[1:])]
            states, hists = cast(list[Any], section.column("state")), section.column("free_block_hist")
            gvals: list[tuple[Any, ...]] | None = None  # each row's values, made once for the groups of a few rows
            for key, start, idx in keyed:
                buf = self._pending.get((key, start)) or self._open(key, start, self.slos[key[0]])
                rows = idx.tolist()
                if len(rows) < BLOCK_ROWS:
                    if gvals is None:
                        gvals = list(zip(*(v.tolist() for v in gvalues), strict=True))
                    node = key[2]
                    for i in rows:
                        buf.add_gpu_row((*gvals[i], node, states[i], None if hists is None else _hist(hists[i])))
                else:
                    bstates = [states[i] for i in rows]
                    bhists = [None] * len(rows) if hists is None else [_hist(hists[i]) for i in rows]
                    buf.add_gpu_block([v[idx] for v in gvalues], [key[2]] * len(rows), bstates, bhists)
        windowed = np.concatenate([idx for _, _, idx in keyed]) if len(keyed) > 1 else keyed[0][2]
        self._observe(int(ts[windowed].max()), now_ms, out)
        out.valid += int(windowed.size)

    def _cap_fits(self, zkey: tuple[str, str, int], nodes: list[str]) -> bool:
        """Whether the node cap admits every one of ``nodes``, new to the window ``zkey``."""
        return self.node_cap.fits(zkey[0], zkey[1], zkey[2], nodes, self._nodes_in.get(zkey, 0))

    def _cap_letter(self, zkey: tuple[str, str, int], dropped: int, admitted: int, now_ms: int) -> None:
        """The one dead letter of a window whose node cap dropped records (issue 31, item 5), kept for
        :meth:`drain_dead_letters` (the latest MAX_CAP_LETTERS when nobody drains them: the simulator)."""
        (model, zone, start), end = zkey, zkey[2] + self.size_ms
        summary = {"model": model, "zone": zone, "window_start_ms": start, "window_end_ms": end}
        summary.update(dropped_records=dropped, admitted_records=admitted, max_nodes=self.max_nodes)
        reason = (
            f"too many nodes: {dropped} records of nodes without a slot dropped from window [{start}, {end}) "
            f"of {model}/{zone} (GOVERNOR_MAX_NODES_PER_WINDOW={self.max_nodes}; recent nodes keep theirs)"
        )
        self.dead_letter_count += 1
        self.dead_by_kind["too many nodes"] += 1
        dl = dead_letter(
            reason, {"window": "node cap", "model": model, "zone": zone}, summary, now_ms, "too many nodes"
        )
        self._cap_letters = [*self._cap_letters[-(MAX_CAP_LETTERS - 1) :], dl]

    def drain_dead_letters(self) -> list[dict[str, Any]]:
        """The node cap's dead letters of the windows closed since the last call (one per window)."""
        out, self._cap_letters = self._cap_letters, []
        return out

    def flush(self) -> None:
        """Aggregate every buffered row into its window's aggregate."""
        for buf in self._pending.values():
            buf.flush()

    # -- windows ----------------------------------------------------------
    def closed_through(self, ts_ms: int) -> bool:
        """Whether the window of a record stamped ``ts_ms`` has closed (its message may be committed)."""
        closed = self.tracker.closed_ms
        return closed is not None and ts_ms - ts_ms % self.size_ms + self.size_ms <= closed

    def close_due(self, now_ms: int | None, emitted_ms: int) -> list[dict[str, Any]]:
        """Close the windows that are due.

        By event time (the watermark) always; by the clock ``now_ms`` when the
        stream is caught up (the watermark was within window + lateness of
        the clock when the last message arrived) or when no message has
        arrived for ``idle_close_ms`` (traffic stopped).  A consumer catching
        up on a backlog (after a restart, say) sees old event times: closing
        by the clock then would dead-letter the whole backlog as late.
        """
        if (
            now_ms is not None
            and self._last_message_ms is not None
            and now_ms - self._last_message_ms < self.idle_close_ms
            and not self._caught_up
        ):
            now_ms = None
        closed = self.tracker.close_due(now_ms)
        if not closed:
            self._cap_unopened(emitted_ms)
            return []
        zones: dict[tuple[str, str, int], Any] = {}
        nodes_in: dict[tuple[str, str, int], list[str]] = defaultdict(list)
        out: list[dict[str, Any]] = []
        # the tracker is keyed by Hashable; this processor's keys are (model, zone, node)
        for key, start, agg in cast("list[tuple[tuple[str, str, str], int, WindowAggregate]]", closed):
            buf = self._pending.pop((key, start), None)
            if buf is not None:
                buf.flush()
            model, zone, node = key
            self._nodes_in.pop((model, zone, start), None)
            self.windows_closed += 1
            out.append(self._record("node", model, zone, start, agg, emitted_ms, node=node))
            zkey = (model, zone, start)
            zones[zkey] = agg if zkey not in zones else merge(zones[zkey], agg)
            nodes_in[zkey].append(node)
        for (model, zone, start), agg in sorted(zones.items(), key=lambda kv: kv[0][2]):
            zkey = (model, zone, start)
            extra: dict[str, Any] = {"nodes": len(nodes_in[zkey])}
            dropped = self.node_cap.close(model, zone, start, nodes_in[zkey])
            if dropped:  # the window is held when the cap dropped too much of it (controllers.staleness)
                admitted = agg.n_requests + agg.n_gpu_samples
                extra.update(node_cap_dropped=dropped, node_cap_dropped_rate=dropped_rate(dropped, admitted))
                self._cap_letter(zkey, dropped, admitted, emitted_ms)
            out.append(self._record("zone", model, zone, start, agg, emitted_ms, **extra))
        self._cap_unopened(emitted_ms)
        return out

    def _cap_unopened(self, emitted_ms: int) -> None:
        """The dead letters of closed windows the node cap let no node into (after those it did)."""
        if self.node_cap.dropped and self.tracker.closed_ms is not None:
            for zkey, dropped in self.node_cap.closed_without_nodes(self.tracker.closed_ms):
                self._cap_letter(zkey, dropped, 0, emitted_ms)

    def _record(
        self, scope: str, model: str, zone: str, start: int, agg: Any, emitted_ms: int, **extra: Any
    ) -> dict[str, Any]:
        slo = self.slos[model]
        summary = node_result(agg, extra["node"], self.window_s) if scope == "node" else result(agg, self.window_s)
        return {
            "schema_version": METRICS_SCHEMA_VERSION,
            "kind": "window",
            "scope": scope,
            "model": model,
            "zone": zone,
            "window_start_ms": start,
            "window_end_ms": start + self.size_ms,
            "window_s": self.window_s,
            "ttft_slo_ms": slo.ttft_slo_ms,
            "itl_slo_ms": slo.itl_slo_ms,
            "emitted_ms": emitted_ms,
            **extra,
            **summary,
        }
