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
mean here.  The detector pickles (River models do); :meth:`to_bytes` and
:meth:`from_bytes` wrap :mod:`pickle` for snapshots.

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
import pickle
from dataclasses import dataclass
from typing import Any, Literal

from river import drift, stats

from controllers.errors import ParameterError

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
    >>> d = DriftDetector("adwin", signal="latency_ms", delta=0.002)
    >>> DriftDetector.from_bytes(d.to_bytes()).signal
    'latency_ms'
    """

    def __init__(self, kind: Kind, signal: str = "value", recent_weight: float = 0.1, **params: Any) -> None:
        if kind not in ("adwin", "page_hinkley"):
            raise ParameterError(f"kind={kind!r}: must be 'adwin' or 'page_hinkley'")
        if not isinstance(signal, str) or not signal:
            raise ParameterError(f"signal={signal!r}: must be a non-empty name")
        if not (isinstance(recent_weight, float | int) and 0.0 < recent_weight <= 1.0):
            raise ParameterError(f"recent_weight={recent_weight!r}: must lie in (0, 1]")
        try:
            if kind == "adwin":
                model: drift.ADWIN | drift.PageHinkley = drift.ADWIN(**params)  # type: ignore[no-untyped-call]
            else:
                model = drift.PageHinkley(**{"alpha": 1.0, **params})
        except (TypeError, ValueError) as exc:
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

    def to_bytes(self) -> bytes:
        """Snapshot (pickle) of the detector and its River model."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_bytes(cls, data: bytes) -> DriftDetector:
        """Inverse of :meth:`to_bytes` (trusted snapshots only: it unpickles)."""
        obj = pickle.loads(data)
        if not isinstance(obj, cls):
            raise ParameterError(f"data: unpickled a {type(obj).__name__}, not a {cls.__name__}")
        return obj

    def __repr__(self) -> str:
        return (
            f"DriftDetector(kind={self.kind!r}, signal={self.signal!r}, params={self.params!r}, "
            f"n_seen={self.n_seen}, n_detections={self.n_detections})"
        )
