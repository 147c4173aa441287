"""Telemetry -> validated records -> event-time windows -> window metrics.

:class:`TelemetryProcessor` is what the ingest agent runs for each Kafka
message; it holds no connection and does no I/O, so it is tested without a
broker and reused by the fast simulator.  Per message it

1. decodes the batch envelope (a broken envelope is one dead letter),
2. validates every record (each bad one becomes a dead letter with its
   reason and its source topic/partition/offset/index),
3. adds the valid ones, as numpy columns, to the tumbling window of their
   (model, zone, node) -- records for a window that already closed are
   dead-lettered as late rather than dropped or silently merged.

:meth:`TelemetryProcessor.close_due` closes windows whose end plus the
allowed lateness has passed (by event time, or by the clock when traffic
stops) and returns one metrics record per node and one per (model, zone),
the latter merged from the node windows.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controllers.windows import SloSpec, WindowTracker, add_gpu, add_requests, merge, result
from governor.settings import Settings
from streams.records import EnvelopeError, decode_envelope, validate_record

log = logging.getLogger(__name__)

METRICS_SCHEMA_VERSION = 1


@dataclass
class ProcessResult:
    valid: int = 0
    dead_letters: list[dict[str, Any]] = field(default_factory=list)


def dead_letter(reason: str, source: Mapping[str, Any], record: Any, now_ms: int) -> dict[str, Any]:
    return {"schema_version": 1, "reason": reason, "source": dict(source),
            "record": record, "dead_lettered_ms": now_ms}


def _raw_text(raw: Any) -> Any:
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw).decode("utf-8", errors="replace")
    return raw


class TelemetryProcessor:
    def __init__(self, settings: Settings) -> None:
        self.window_s = settings.window_s
        self.size_ms = int(round(settings.window_s * 1000))
        self.tracker = WindowTracker(self.size_ms, int(round(settings.lateness_s * 1000)))
        self.slos = {m.name: SloSpec(m.ttft_slo_ms, m.itl_slo_ms) for m in settings.models}
        self.records_in = 0
        self.dead_letter_count = 0
        self.late_count = 0
        self.windows_closed = 0

    # -- ingest -----------------------------------------------------------
    def process(self, raw: Any, source: Mapping[str, Any], now_ms: int) -> ProcessResult:
        out = ProcessResult()
        try:
            records = decode_envelope(raw)
        except EnvelopeError as exc:
            out.dead_letters.append(dead_letter(f"bad envelope: {exc}", source, _raw_text(raw), now_ms))
            self.dead_letter_count += 1
            return out
        requests: dict[tuple[str, str, str, int], list[Mapping[str, Any]]] = defaultdict(list)
        gpus: dict[tuple[str, str, str, int], list[Mapping[str, Any]]] = defaultdict(list)
        for index, rec in enumerate(records):
            self.records_in += 1
            reason = validate_record(rec)
            if reason is None and rec["model"] not in self.slos:
                reason = f"no SLO configured for model {rec['model']!r} (GOVERNOR_MODELS)"
            if reason is None:
                start = rec["ts_ms"] - rec["ts_ms"] % self.size_ms
                if self.tracker.is_late(start):
                    self.late_count += 1
                    reason = (f"late: window [{start}, {start + self.size_ms}) closed before "
                              f"the record arrived")
            if reason is not None:
                out.dead_letters.append(dead_letter(reason, {**source, "index": index}, rec, now_ms))
                self.dead_letter_count += 1
                continue
            key = (rec["model"], rec["zone"], rec["node"], start)
            (requests if rec["kind"] == "request" else gpus)[key].append(rec)
            out.valid += 1
        for (model, zone, node, start), recs in requests.items():
            agg = self.tracker.get((model, zone, node), start)
            add_requests(agg, _request_columns(recs), self.slos[model])
            self.tracker.observe(max(r["ts_ms"] for r in recs))
        for (model, zone, node, start), recs in gpus.items():
            agg = self.tracker.get((model, zone, node), start)
            add_gpu(agg, _gpu_columns(recs), [r["node"] for r in recs], [r["state"] for r in recs])
            self.tracker.observe(max(r["ts_ms"] for r in recs))
        return out

    # -- windows ----------------------------------------------------------
    def close_due(self, now_ms: int | None, emitted_ms: int) -> list[dict[str, Any]]:
        closed = self.tracker.close_due(now_ms)
        if not closed:
            return []
        zones: dict[tuple[str, str, int], Any] = {}
        nodes_in: dict[tuple[str, str, int], int] = defaultdict(int)
        out: list[dict[str, Any]] = []
        for (model, zone, node), start, agg in closed:
            self.windows_closed += 1
            out.append(self._record("node", model, zone, start, agg, emitted_ms, node=node))
            zkey = (model, zone, start)
            zones[zkey] = agg if zkey not in zones else merge(zones[zkey], agg)
            nodes_in[zkey] += 1
        for (model, zone, start), agg in sorted(zones.items(), key=lambda kv: kv[0][2]):
            out.append(self._record("zone", model, zone, start, agg, emitted_ms,
                                    nodes=nodes_in[(model, zone, start)]))
        return out

    def _record(self, scope: str, model: str, zone: str, start: int, agg: Any,
                emitted_ms: int, **extra: Any) -> dict[str, Any]:
        slo = self.slos[model]
        return {"schema_version": METRICS_SCHEMA_VERSION, "kind": "window", "scope": scope,
                "model": model, "zone": zone, "window_start_ms": start,
                "window_end_ms": start + self.size_ms, "window_s": self.window_s,
                "ttft_slo_ms": slo.ttft_slo_ms, "itl_slo_ms": slo.itl_slo_ms,
                "emitted_ms": emitted_ms, **extra, **result(agg, self.window_s)}


def _request_columns(recs: list[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    def col(name: str, dtype: Any = np.float64, default: Any = 0) -> np.ndarray:
        return np.fromiter((r.get(name, default) or default for r in recs), dtype=dtype, count=len(recs))

    return {
        "ttft_ms": col("ttft_ms"), "itl_ms": col("itl_ms"), "e2e_ms": col("e2e_ms"),
        "queue_ms": col("queue_ms"), "prompt_tokens": col("prompt_tokens", np.int64),
        "output_tokens": col("output_tokens", np.int64),
        "kv_hit": col("kv_hit", np.bool_, False),
        "ok": np.fromiter((r["status"] == "ok" for r in recs), dtype=np.bool_, count=len(recs)),
    }


_GPU_COLS = {"ts_ms": np.int64, "gpu_util": np.float64, "queue_len": np.int64, "running": np.int64,
             "mem_used_bytes": np.int64, "mem_total_bytes": np.int64, "kv_blocks_used": np.int64,
             "kv_blocks_total": np.int64, "largest_free_block_bytes": np.int64}


def _gpu_columns(recs: list[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    return {name: np.fromiter((r.get(name, 0) or 0 for r in recs), dtype=dtype, count=len(recs))
            for name, dtype in _GPU_COLS.items()}
