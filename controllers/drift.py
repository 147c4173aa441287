"""Online drift detection per signal, with River's detectors.

Two detectors, chosen per signal by what its changes look like:

* ``"adwin"`` (:class:`river.drift.ADWIN`) for latency: heavy-tailed, where
  a change may be in level or spread.  ADWIN keeps an adaptive window and
  cuts it where two sub-windows' means differ by more than a Hoeffding-type
  bound (confidence ``delta``), so it needs no scale parameter.
* ``"page_hinkley"`` (:class:`river.drift.PageHinkley`) for arrival rate: a
  CUSUM test for a shift in the mean.  Its ``threshold`` (and ``delta``) are
  in the signal's own units: a shift of ``d`` is flagged after roughly
  ``threshold / (d - delta)`` samples, and noise of standard deviation
  ``sigma`` makes the statistic wander like ``sigma sqrt(n)``, so choose
  ``threshold`` several ``sigma sqrt(n)`` for the ``n`` you tolerate.
  Here its forgetting factor ``alpha`` defaults to 1 (none), not River's
  ``1 - 1e-4``: with forgetting the CUSUM sum becomes stationary (standard
  deviation ``sigma / sqrt(2 (1 - alpha))``, about 70 sigma) while the test
  still compares it to its all-time minimum, so a stationary stream raises
  false alarms after about ``1 / (1 - alpha)`` samples (measured: one per
  20,000 Poisson(100) samples at ``delta = 5, threshold = 200``; none at 1).

:meth:`DriftDetector.update` returns a :class:`DriftEvent` when the detector
fires.  The direction is derived where the data allow it: for ADWIN from
its window mean before the update and after the cut; for Page-Hinkley from
a recent exponential average (weight ``recent_weight``) against the mean
since the last detection.  After a detection both River detectors start
afresh on the next sample (River 0.26 semantics), and so does the running
mean here.

Snapshots are plain data (:mod:`controllers.state`): :meth:`DriftDetector.to_state`
returns a JSON-able dict and :meth:`DriftDetector.from_state` rebuilds the
detector from one, validating every field; a restored detector reports the
same events as the original on the same continuation.  River's models are
read field by field (an allowlist of exactly ``river.drift.ADWIN`` and
``river.drift.PageHinkley``, checked against ``kind``):

* Page-Hinkley: its running mean (``n``, ``mean``), the two CUSUM sums and
  their extremes, and the drift flag (Python attributes).
* ADWIN: River 0.26 keeps the window in Rust
  (``river._river_rust.drift.AdaptiveWindowing``), whose only access to its
  state is ``__getstate__`` / ``__setstate__`` bytes (bincode of the Rust
  struct).  :meth:`~DriftDetector.to_state` decodes those bytes into explicit
  fields -- sums, counters and the exponential-histogram rows, at most
  ``max_buckets`` entries for each of at most ``log2(width) + 1`` rows -- and
  checks that encoding them again gives the very same bytes (any other
  layout, e.g. after a River upgrade, raises instead of guessing).
  :meth:`~DriftDetector.from_state` validates the fields (shapes, counts,
  ``width`` equal to the rows' sizes and at most the values seen), encodes
  them behind the fixed header River itself writes for the same parameters,
  and hands the numbers to ``__setstate__``.

Examples
--------
>>> import random
>>> rng = random.Random(1)
>>> d = DriftDetector("page_hinkley", signal="arrival_rps", delta=5.0, threshold=100.0)
>>> xs = [rng.gauss(100, 5) for _ in range(300)] + [rng.gauss(130, 5) for _ in range(300)]
>>> events = [e for e in map(d.update, xs) if e is not None]
>>> len(events), events[0].direction, 300 <= events[0].n_seen < 320
(1, 'up', True)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import river
from river import drift, stats

from controllers.errors import ParameterError
from controllers.state import (
    I32_MAX,
    I32_MIN,
    Obj,
    as_float,
    as_int,
    as_str,
    enc_float,
    header,
    open_state,
    show,
    show_key,
)

__all__ = ["DriftDetector", "DriftEvent"]

Kind = Literal["adwin", "page_hinkley"]
Direction = Literal["up", "down"]


@dataclass(frozen=True)
class DriftEvent:
    """A detected change in one signal.

    ``n_seen`` counts every value the detector has seen (1-based index of
    the value that triggered); ``mean_before`` / ``mean_after`` are the means
    the direction was derived from (``None`` where not derivable).
    """

    signal: str
    kind: Kind
    value: float
    n_seen: int
    direction: Direction | None
    mean_before: float | None
    mean_after: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return dict(self.__dict__)


class DriftDetector:
    """One River drift detector for one named signal.

    Parameters
    ----------
    kind : "adwin" or "page_hinkley"
    signal : name carried by the events (e.g. ``"latency_ms"``).
    recent_weight : EWMA weight of the recent mean (Page-Hinkley direction).
    **params : passed to the River detector (e.g. ``delta``, ``threshold``,
        ``min_instances``, ``mode``, ``grace_period``).

    Examples
    --------
    >>> DriftDetector("cusum")
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: kind='cusum': must be 'adwin' or 'page_hinkley'
    >>> import json
    >>> d = DriftDetector("adwin", signal="latency_ms", delta=0.002)
    >>> for x in [80.0, 82.0, 79.0]:
    ...     _ = d.update(x)
    >>> e = DriftDetector.from_state(json.loads(json.dumps(d.to_state())))
    >>> e.signal, e.n_seen, e.to_state() == d.to_state()
    ('latency_ms', 3, True)
    >>> DriftDetector.from_state({**d.to_state(), "version": 7})
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: state.version=7: unknown version (this code reads version 1)
    """

    def __init__(self, kind: Kind, signal: str = "value", recent_weight: float = 0.1, **params: Any) -> None:
        if kind not in ("adwin", "page_hinkley"):
            raise ParameterError(f"kind={kind!r}: must be 'adwin' or 'page_hinkley'")
        if not isinstance(signal, str) or not signal:
            raise ParameterError(f"signal={signal!r}: must be a non-empty name")
        if not (isinstance(recent_weight, float | int) and 0.0 < recent_weight <= 1.0):
            raise ParameterError(f"recent_weight={recent_weight!r}: must lie in (0, 1]")
        _check_params(kind, params)
        try:
            if kind == "adwin":
                model: drift.ADWIN | drift.PageHinkley = drift.ADWIN(**params)  # type: ignore[no-untyped-call]
            else:
                model = drift.PageHinkley(**{"alpha": 1.0, **params})
        except (TypeError, ValueError, OverflowError) as exc:
            raise ParameterError(f"params={params!r}: {kind} rejects them ({exc})") from exc
        self.kind: Kind = kind
        self.signal = signal
        self.recent_weight = float(recent_weight)
        self.params = dict(params)
        self.n_seen = 0
        self.n_detections = 0
        self._model = model
        self._mean = stats.Mean()
        self._recent: float | None = None

    def update(self, x: float) -> DriftEvent | None:
        """Feed one value; return the event if this value triggers a detection."""
        if isinstance(x, bool) or not isinstance(x, float | int) or not math.isfinite(x):
            raise ParameterError(f"x={x!r}: must be a finite number")
        x = float(x)
        if self._model.drift_detected:  # the detector restarts on this value
            self._mean = stats.Mean()
            self._recent = None
        self.n_seen += 1
        before = self._model.estimation if isinstance(self._model, drift.ADWIN) else None
        self._mean.update(x)
        w = self.recent_weight
        self._recent = x if self._recent is None else self._recent + w * (x - self._recent)
        self._model.update(x)  # type: ignore[no-untyped-call]
        if not self._model.drift_detected:
            return None
        self.n_detections += 1
        if isinstance(self._model, drift.ADWIN):
            mean_before, mean_after = before, self._model.estimation
        else:
            mean_before, mean_after = self._mean.get(), self._recent
        direction: Direction | None = None
        if mean_before is not None and mean_after is not None and mean_after != mean_before:
            direction = "up" if mean_after > mean_before else "down"
        return DriftEvent(
            signal=self.signal,
            kind=self.kind,
            value=x,
            n_seen=self.n_seen,
            direction=direction,
            mean_before=mean_before,
            mean_after=mean_after,
        )

    def to_state(self) -> dict[str, Any]:
        """Plain data (JSON-able, no NaN): everything :meth:`from_state` needs.

        Fields: ``type``, ``version``, ``kind``, ``signal``, ``recent_weight``,
        ``params`` (the River parameters), ``n_seen``, ``n_detections``,
        ``mean`` (``{"n", "mean"}``: the running mean since the last
        detection), ``recent`` (the EWMA, ``None`` before any value) and
        ``detector``: the River model, ``{"class": "river.drift.ADWIN" |
        "river.drift.PageHinkley", "drift_detected": bool, ...}`` (see the
        module doc).  Non-finite floats are the strings ``"nan"``, ``"inf"``,
        ``"-inf"``.
        """
        model = self._model
        detector = _adwin_to_state(model) if isinstance(model, drift.ADWIN) else _page_hinkley_to_state(model)
        return {
            **header(STATE_TYPE),
            "kind": self.kind,
            "signal": self.signal,
            "recent_weight": self.recent_weight,
            "params": dict(self.params),
            "n_seen": self.n_seen,
            "n_detections": self.n_detections,
            "mean": _mean_to_state(self._mean),
            "recent": None if self._recent is None else enc_float(self._recent),
            "detector": detector,
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> DriftDetector:
        """Rebuild a detector from :meth:`to_state` output.

        Raises :class:`~controllers.errors.ParameterError` naming the field for
        anything malformed: a missing or unknown field, a wrong type, an
        unknown ``version``, a ``detector.class`` other than the one ``kind``
        builds, shapes or counts that do not fit together.
        """
        o = open_state(data, STATE_TYPE, _STATE_KEYS)
        kind = o.get_str("kind", ("adwin", "page_hinkley"))
        signal = o.get_str("signal")
        recent_weight = o.get_float("recent_weight")
        params = _read_params(o, kind)
        det = cls(kind, signal=signal, recent_weight=recent_weight, **params)  # type: ignore[arg-type]
        det.n_seen = o.get_int("n_seen", 0, MAX_COUNT)
        det.n_detections = o.get_int("n_detections", lo=0, hi=det.n_seen)
        det._mean = _mean_from_state(o.raw("mean"), o.at("mean"), max_n=det.n_seen)
        det._recent = o.get_opt_float("recent")
        if (det._recent is None) != (det.n_seen == 0):
            raise ParameterError(f"state.recent={show(o.raw('recent'))}: must be null exactly when n_seen is 0")
        if isinstance(det._model, drift.ADWIN):
            _adwin_restore(det._model, o.raw("detector"), o.at("detector"), max_width=det.n_seen)
        else:
            _page_hinkley_restore(det._model, o.raw("detector"), o.at("detector"), max_n=det.n_seen)
        return det

    def __repr__(self) -> str:
        return (
            f"DriftDetector(kind={self.kind!r}, signal={self.signal!r}, params={self.params!r}, "
            f"n_seen={self.n_seen}, n_detections={self.n_detections})"
        )


# -- plain-data state ------------------------------------------------------------

STATE_TYPE = "DriftDetector"
_STATE_KEYS = ("kind", "signal", "recent_weight", "params", "n_seen", "n_detections", "mean", "recent", "detector")
ADWIN_CLASS = "river.drift.ADWIN"
PAGE_HINKLEY_CLASS = "river.drift.PageHinkley"
MAX_COUNT = 2**63  # bound on the counters read back
MAX_ADWIN_BUCKETS = 1024  # River's default is 5; the state holds up to this many entries per row


def _check_params(kind: str, params: Mapping[str, Any]) -> None:
    """Only River's own parameters of ``kind``, each of its type and in a range River survives.

    River takes some values it then panics on (ADWIN ``clock=0`` divides by
    zero, ``max_buckets=1`` indexes out of its rows): refused here.
    """
    for name, value in params.items():
        path = f"params.{name}"
        if kind == "adwin":
            if name == "delta":
                if not 0.0 < as_float(value, path, finite=True) < 1.0:
                    raise ParameterError(f"{path}={show(value)}: must lie in (0, 1)")
            elif name == "clock":
                as_int(value, path, 1, I32_MAX)
            elif name == "max_buckets":
                as_int(value, path, 2, MAX_ADWIN_BUCKETS)
            elif name == "min_window_length":
                as_int(value, path, 1, I32_MAX)
            elif name == "grace_period":
                as_int(value, path, 0, I32_MAX)
            else:
                raise ParameterError(f"params.{show_key(name)}: not an adwin parameter")
        elif name in ("delta", "threshold"):
            as_float(value, path, finite=True)
        elif name == "alpha":
            as_float(value, path, 0.0, 1.0)
        elif name == "min_instances":
            as_int(value, path, 0)
        elif name == "mode":
            as_str(value, path, ("up", "down", "both"))
        else:
            raise ParameterError(f"params.{show_key(name)}: not a page_hinkley parameter")


def _read_params(o: Obj, kind: str) -> dict[str, Any]:
    raw = o.raw("params")
    if not isinstance(raw, Mapping):
        raise ParameterError(f"state.params={show(raw)}: must be an object")
    for name in raw:
        if not isinstance(name, str):
            raise ParameterError(f"state.params.{show_key(name)}: not a parameter name")
    _check_params(kind, raw)  # before the call: a name like "signal" must not reach it
    return dict(raw)


def _mean_to_state(m: stats.Mean) -> dict[str, Any]:
    return {"n": enc_float(m.n), "mean": enc_float(m.get())}


def _mean_from_state(data: object, path: str, max_n: int) -> stats.Mean:
    o = Obj(data, path, ("n", "mean"))
    n = o.get_float("n", 0.0, float(max_n))
    if n != math.floor(n):
        raise ParameterError(f"{o.at('n')}={n!r}: must be a whole count")
    return stats.Mean._from_state(n=n, mean=o.get_float("mean"))


# Page-Hinkley: Python attributes.

_PH_KEYS = ("class", "drift_detected", "x_mean", "sum_increase", "sum_decrease", "min_increase", "max_decrease")


def _page_hinkley_to_state(model: drift.PageHinkley) -> dict[str, Any]:
    if type(model) is not drift.PageHinkley:
        raise TypeError(f"not a PageHinkley: {type(model).__name__}")
    return {
        "class": PAGE_HINKLEY_CLASS,
        "drift_detected": bool(model.drift_detected),
        "x_mean": _mean_to_state(model._x_mean),
        "sum_increase": enc_float(model._sum_increase),
        "sum_decrease": enc_float(model._sum_decrease),
        "min_increase": enc_float(model._min_increase),
        "max_decrease": enc_float(model._max_decrease),
    }


def _page_hinkley_restore(model: drift.PageHinkley, data: object, path: str, max_n: int) -> None:
    o = Obj(data, path, _PH_KEYS)
    o.check_class(PAGE_HINKLEY_CLASS, "kind 'page_hinkley'")
    model._drift_detected = o.get_bool("drift_detected")
    model._x_mean = _mean_from_state(o.raw("x_mean"), o.at("x_mean"), max_n=max_n)
    model._sum_increase = o.get_float("sum_increase")
    model._sum_decrease = o.get_float("sum_decrease")
    model._min_increase = o.get_float("min_increase")
    ph: Any = model  # River types _max_decrease from its initial int -1; it holds floats
    ph._max_decrease = o.get_float("max_decrease")


# ADWIN: the Rust window's bincode (river 0.26), decoded into fields and encoded back.
# RsAdaptiveWindowing { inner: AdaptiveWindowing, delta, clock, max_buckets, min_window_length, grace_period }
# AdaptiveWindowing { delta f64, clock i32, max_buckets u64, min_window_length f64, grace_period f64,
#   total f64, variance f64, width f64, total_width f64, n_buckets i32, max_n_buckets i32, tick i32,
#   n_detections i32, bucket_list Vec<Bucket> }; Bucket { max_size u64, current_idx u64, totals Vec<f64>,
#   variances Vec<f64> }; Vec = u64 length + items; little-endian, fixed-width integers.

_AW_HEAD = struct.Struct("<diQdd")
_AW_SUMS = struct.Struct("<dddd")
_AW_COUNTS = struct.Struct("<iiii")
_AW_TAIL = struct.Struct("<diQii")
_U64 = struct.Struct("<Q")
_MAX_ROWS = 64  # row i holds buckets of 2**i values
_ADWIN_KEYS = (
    "class",
    "drift_detected",
    "total",
    "variance",
    "width",
    "total_width",
    "n_buckets",
    "max_n_buckets",
    "tick",
    "n_detections",
    "buckets",
)


@dataclass
class _Window:
    head: tuple[Any, ...]
    sums: tuple[float, float, float, float]  # total, variance, width, total_width
    counts: tuple[int, int, int, int]  # n_buckets, max_n_buckets, tick, n_detections
    rows: list[tuple[list[float], list[float]]]  # per row: the used totals and variances
    tail: tuple[Any, ...]


def _layout_error(why: str) -> RuntimeError:
    return RuntimeError(
        f"river {getattr(river, '__version__', '?')}: ADWIN's window state is not laid out as controllers.drift "
        f"expects ({why}); its snapshot code must be updated for this River"
    )


def _window_decode(blob: bytes) -> _Window:
    off = 0

    def take(st: struct.Struct) -> tuple[Any, ...]:
        nonlocal off
        if off + st.size > len(blob):
            raise _layout_error("state shorter than expected")
        out = st.unpack_from(blob, off)
        off += st.size
        return out

    head = take(_AW_HEAD)
    max_buckets = head[2]
    if not 1 <= max_buckets <= MAX_ADWIN_BUCKETS:
        raise _layout_error(f"max_buckets {max_buckets}")
    cap = max_buckets + 1
    sums = take(_AW_SUMS)
    counts = take(_AW_COUNTS)
    (n_rows,) = take(_U64)
    if not 1 <= n_rows <= _MAX_ROWS:
        raise _layout_error(f"{n_rows} rows")
    row = struct.Struct(f"<{cap}d")
    rows: list[tuple[list[float], list[float]]] = []
    for _ in range(n_rows):
        size, used = take(_U64), take(_U64)
        if size[0] != max_buckets or used[0] > max_buckets:
            raise _layout_error(f"row of size {size[0]} holding {used[0]}")
        cols = []
        for _ in range(2):
            if take(_U64)[0] != cap:
                raise _layout_error("row length")
            cols.append([float(v) for v in take(row)[: used[0]]])
        rows.append((cols[0], cols[1]))
    tail = take(_AW_TAIL)
    if off != len(blob):
        raise _layout_error(f"{len(blob) - off} bytes left over")
    return _Window(head, sums, counts, rows, tail)


def _window_encode(w: _Window) -> bytes:
    max_buckets = w.head[2]
    cap = max_buckets + 1
    row = struct.Struct(f"<{cap}d")
    parts = [_AW_HEAD.pack(*w.head), _AW_SUMS.pack(*w.sums), _AW_COUNTS.pack(*w.counts), _U64.pack(len(w.rows))]
    for totals, variances in w.rows:
        parts += [_U64.pack(max_buckets), _U64.pack(len(totals))]
        for col in (totals, variances):
            parts += [_U64.pack(cap), row.pack(*col, *([0.0] * (cap - len(col))))]
    parts.append(_AW_TAIL.pack(*w.tail))
    return b"".join(parts)


def _adwin_to_state(model: drift.ADWIN) -> dict[str, Any]:
    if type(model) is not drift.ADWIN:
        raise TypeError(f"not an ADWIN: {type(model).__name__}")
    blob = model._helper.__getstate__()
    if not isinstance(blob, bytes):
        raise _layout_error(f"__getstate__ gave a {type(blob).__name__}")
    w = _window_decode(blob)
    if _window_encode(w) != blob:
        raise _layout_error("encoding the decoded fields does not give the same bytes")
    total, variance, width, total_width = w.sums
    n_buckets, max_n_buckets, tick, n_detections = w.counts
    return {
        "class": ADWIN_CLASS,
        "drift_detected": bool(model.drift_detected),
        "total": enc_float(total),
        "variance": enc_float(variance),
        "width": enc_float(width),
        "total_width": enc_float(total_width),
        "n_buckets": n_buckets,
        "max_n_buckets": max_n_buckets,
        "tick": tick,
        "n_detections": n_detections,
        "buckets": [{"totals": [enc_float(v) for v in t], "variances": [enc_float(v) for v in v_]} for t, v_ in w.rows],
    }


def _adwin_restore(model: drift.ADWIN, data: object, path: str, max_width: int) -> None:
    """Load the fields into ``model`` (freshly built from the same parameters)."""
    o = Obj(data, path, _ADWIN_KEYS)
    o.check_class(ADWIN_CLASS, "kind 'adwin'")
    fresh = _window_decode(model._helper.__getstate__())
    max_buckets = fresh.head[2]
    rows: list[tuple[list[float], list[float]]] = []
    raw_rows = o.raw("buckets")
    if not isinstance(raw_rows, list | tuple) or not 1 <= len(raw_rows) <= _MAX_ROWS:
        raise ParameterError(f"{o.at('buckets')}={show(raw_rows)}: must be a list of 1 to {_MAX_ROWS} rows")
    for i, raw in enumerate(raw_rows):
        r = Obj(raw, f"{o.at('buckets')}[{i}]", ("totals", "variances"))
        totals = r.get_floats("totals", max_len=max_buckets)
        variances = r.get_floats("variances", length=len(totals))
        rows.append((totals, variances))
    sizes = [len(t) for t, _ in rows]
    if len(rows) > 1 and 0 in sizes:
        # with max_buckets >= 2 every row keeps >= 1 bucket; an empty one would make River panic later
        raise ParameterError(f"{o.at('buckets')}: row {sizes.index(0)} is empty (only a fresh window has one)")
    width = o.get_float("width", 0.0, float(max_width))
    if width != float(sum(n << i for i, n in enumerate(sizes))):
        raise ParameterError(f"{o.at('width')}={width!r}: must equal the values the buckets hold")
    sums = (o.get_float("total"), o.get_float("variance"), width, o.get_float("total_width"))
    counts = (
        o.get_int("n_buckets", 0, I32_MAX),
        o.get_int("max_n_buckets", 0, I32_MAX),
        o.get_int("tick", I32_MIN, I32_MAX),
        o.get_int("n_detections", 0, I32_MAX),
    )
    drift_detected = o.get_bool("drift_detected")
    model._helper.__setstate__(_window_encode(_Window(fresh.head, sums, counts, rows, fresh.tail)))
    if model.width != width or model.n_detections != counts[3]:
        raise _layout_error("the loaded window does not read back")
    model._drift_detected = drift_detected
