"""Real LLM-serving request traces: loading, rescaling, windowing, looping.

Two public traces ship in ``sim/data`` (see its README): the Azure LLM
inference conversation trace (Splitwise) and the Mooncake conversation trace
(with prefix-block ``hash_ids``). A :class:`Trace` is an immutable set of
numpy arrays; arrivals are seconds from the trace start, sorted.

Examples
--------
>>> tr = load_trace("azure-conv")
>>> len(tr), round(tr.duration_s)
(19366, 3502)
>>> round(tr.scaled_to_qps(200.0).mean_qps, 6)
200.0
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

DATA_DIR = Path(__file__).parent / "data"
PACKAGED = {
    "azure-conv": DATA_DIR / "AzureLLMInferenceTrace_conv_2023.csv",
    "mooncake": DATA_DIR / "mooncake_conversation_trace.jsonl.gz",
}


class TraceError(ValueError):
    """A trace file or trace parameter is malformed (names file and line)."""


@dataclass(frozen=True, eq=False)
class Trace:
    """An immutable request trace.

    Parameters
    ----------
    arrival_s : np.ndarray
        Arrival times (s), sorted, non-negative (loaders start them at 0).
    prompt_tokens, output_tokens : np.ndarray
        Integer token counts per request.
    hash_ids : list of list of int, optional
        Prefix-block ids (512-token blocks) per request, or None.
    name, source : str
        Short name and where it came from.
    span_s : float, optional
        Nominal duration; default last arrival plus one mean gap, so that
        ``mean_qps == len / duration_s`` stays exact under looping.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: list[list[int]] | None = None
    name: str = "trace"
    source: str = ""
    span_s: float | None = field(default=None)

    def __post_init__(self) -> None:
        a = np.asarray(self.arrival_s, dtype=float)
        p = np.asarray(self.prompt_tokens, dtype=np.int64)
        o = np.asarray(self.output_tokens, dtype=np.int64)
        if a.ndim != 1 or p.shape != a.shape or o.shape != a.shape:
            raise TraceError("arrival_s/prompt_tokens/output_tokens: must be 1-D of equal length")
        if len(a) and (a[0] < 0 or np.any(np.diff(a) < 0) or not np.all(np.isfinite(a))):
            raise TraceError("arrival_s: must be finite, non-negative and sorted")
        if np.any(p < 0) or np.any(o < 0):
            raise TraceError("prompt_tokens/output_tokens: must be non-negative")
        if self.hash_ids is not None and len(self.hash_ids) != len(a):
            raise TraceError("hash_ids: must have one list per request")
        if self.span_s is not None and (self.span_s <= 0 or (len(a) and self.span_s < a[-1])):
            raise TraceError("span_s: must be positive and >= the last arrival")
        for k, v in (("arrival_s", a), ("prompt_tokens", p), ("output_tokens", o)):
            v.setflags(write=False)
            object.__setattr__(self, k, v)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """Nominal duration (s): ``span_s`` or last arrival plus one mean gap."""
        if self.span_s is not None:
            return float(self.span_s)
        n = len(self)
        if n == 0:
            return 0.0
        last = float(self.arrival_s[-1])
        return last * n / (n - 1) if n > 1 and last > 0 else max(last, 1.0)

    @property
    def mean_qps(self) -> float:
        """Mean arrival rate: ``len / duration_s``."""
        d = self.duration_s
        return len(self) / d if d > 0 else 0.0

    def _take(self, idx: np.ndarray, arrival: np.ndarray, span: float, name: str) -> Trace:
        h = None if self.hash_ids is None else [self.hash_ids[i] for i in idx]
        return Trace(arrival, self.prompt_tokens[idx], self.output_tokens[idx], h, name, self.source, span)

    def scaled_to_qps(self, qps: float) -> Trace:
        """Time-compress (or stretch) arrivals so that the mean rate is ``qps``.

        Examples
        --------
        >>> tr = load_trace("mooncake").scaled_to_qps(50.0)
        >>> round(tr.mean_qps, 9)
        50.0
        """
        if not qps > 0:
            raise TraceError(f"qps: must be positive, got {qps}")
        f = self.mean_qps / qps
        return Trace(
            self.arrival_s * f,
            self.prompt_tokens,
            self.output_tokens,
            self.hash_ids,
            f"{self.name}@{qps:g}qps",
            self.source,
            self.duration_s * f,
        )

    def window(self, start_s: float, duration_s: float) -> Trace:
        """Requests arriving in ``[start_s, start_s + duration_s)``, re-based to 0.

        Examples
        --------
        >>> w = load_trace("azure-conv").window(60.0, 60.0)
        >>> float(w.arrival_s[0]) >= 0.0, w.duration_s
        (True, 60.0)
        """
        if start_s < 0 or not duration_s > 0:
            raise TraceError(f"window: need start_s >= 0 and duration_s > 0, got {start_s}, {duration_s}")
        lo, hi = np.searchsorted(self.arrival_s, [start_s, start_s + duration_s], side="left")
        idx = np.arange(lo, hi)
        return self._take(idx, self.arrival_s[idx] - start_s, float(duration_s), self.name)

    def loop_to(self, duration_s: float) -> Trace:
        """Repeat the trace back to back (period ``duration_s``) to cover ``duration_s``.

        Repeats keep their ``hash_ids`` (a replay of the same conversations).

        Examples
        --------
        >>> tr = load_trace("azure-conv")
        >>> long = tr.loop_to(3 * tr.duration_s)
        >>> len(long) == 3 * len(tr)
        True
        """
        if not duration_s > 0:
            raise TraceError(f"duration_s: must be positive, got {duration_s}")
        period = self.duration_s
        if len(self) == 0 or period <= 0:
            raise TraceError("loop_to: cannot loop an empty trace")
        reps = int(np.ceil(duration_s / period))
        arrival = np.concatenate([self.arrival_s + k * period for k in range(reps)])
        idx = np.tile(np.arange(len(self)), reps)
        keep = arrival < duration_s
        return self._take(idx[keep], arrival[keep], float(duration_s), self.name)

    def indices_between(self, t0_s: float, t1_s: float) -> range:
        """Indices of requests with ``t0_s <= arrival < t1_s`` (for live replay).

        Examples
        --------
        >>> tr = load_trace("azure-conv")
        >>> len(tr.indices_between(0.0, tr.duration_s)) == len(tr)
        True
        """
        lo, hi = np.searchsorted(self.arrival_s, [t0_s, t1_s], side="left")
        return range(int(lo), int(hi))


def _open_text(path: Path) -> TextIO:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rt") if magic == b"\x1f\x8b" else open(path, newline="")


def load_azure_csv(path: str | Path) -> Trace:
    """Load an Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens).

    Examples
    --------
    >>> tr = load_azure_csv(PACKAGED["azure-conv"])
    >>> int(tr.prompt_tokens[0]), int(tr.output_tokens[0])
    (374, 44)
    """
    path = Path(path)
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        want = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        if header is None or [h.strip() for h in header[:3]] != want:
            raise TraceError(f"{path}:1: expected header {','.join(want)}, got {header}")
        ts, p, o = [], [], []
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) < 3:
                raise TraceError(f"{path}:{lineno}: expected 3 columns, got {len(row)}")
            try:
                p.append(int(row[1]))
                o.append(int(row[2]))
            except ValueError as e:
                raise TraceError(f"{path}:{lineno}: bad token count: {e}") from None
            ts.append(row[0].strip())
    try:
        t = np.array(ts, dtype="datetime64[ns]")
    except ValueError:
        for i, s in enumerate(ts):
            try:
                np.datetime64(s, "ns")
            except ValueError:
                raise TraceError(f"{path}:{i + 2}: bad TIMESTAMP {s!r}") from None
        raise
    if len(t) == 0:
        raise TraceError(f"{path}: no requests")
    ns = (t - t.min()).astype(np.int64)
    order = np.argsort(ns, kind="stable")
    return Trace(ns[order] / 1e9, np.array(p)[order], np.array(o)[order], None, path.stem, str(path))


def load_mooncake_jsonl(path: str | Path) -> Trace:
    """Load a Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids).

    Examples
    --------
    >>> tr = load_mooncake_jsonl(PACKAGED["mooncake"])
    >>> len(tr), tr.hash_ids[0][0]
    (12031, 0)
    """
    path = Path(path)
    ts, p, o, h = [], [], [], []
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                ts.append(float(rec["timestamp"]))
                p.append(int(rec["input_length"]))
                o.append(int(rec["output_length"]))
                h.append([int(x) for x in rec.get("hash_ids", [])])
            except (ValueError, KeyError, TypeError) as e:
                raise TraceError(f"{path}:{lineno}: bad Mooncake record: {e!r}") from None
    if not ts:
        raise TraceError(f"{path}: no requests")
    t = np.array(ts) / 1000.0
    order = np.argsort(t, kind="stable")
    name = path.name.split(".")[0]
    return Trace(t[order] - t.min(), np.array(p)[order], np.array(o)[order], [h[i] for i in order], name, str(path))


def load_trace(path_or_name: str | Path) -> Trace:
    """Load a packaged trace by name ('azure-conv', 'mooncake') or a file by content.

    Examples
    --------
    >>> load_trace("mooncake").name
    'mooncake'
    """
    if isinstance(path_or_name, str) and path_or_name in PACKAGED:
        tr = load_trace(PACKAGED[path_or_name])
        return Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.hash_ids, path_or_name, tr.source)
    path = Path(path_or_name)
    if not path.exists():
        raise TraceError(f"{path}: no such trace file (packaged names: {sorted(PACKAGED)})")
    with _open_text(path) as fh:
        first = fh.readline().lstrip()
    if first.startswith("{"):
        return load_mooncake_jsonl(path)
    if first.upper().startswith("TIMESTAMP"):
        return load_azure_csv(path)
    raise TraceError(f"{path}:1: unknown trace format (want Azure CSV or Mooncake JSONL)")
