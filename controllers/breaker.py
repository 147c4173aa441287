"""Adaptive circuit breaker per target (docs/model.md §13 (breaker)).

States and transitions::

    closed --trip--> open --open_for_s elapsed--> half_open --probes pass--> closed
                      ^                               |
                      +-------- probes fail ----------+   (open_for_s *= backoff, capped)

**Trip (closed -> open).**  The breaker keeps a *count-based sliding
window*: the most recent per-window observations whose requests add up to
just **more than** ``min_requests`` (older windows are dropped as long as
the rest still holds more than ``min_requests``; windows older than
``max_window_age_s`` are dropped always).  It trips when that window holds
strictly more than ``min_requests`` requests (design source: "a window of more
than 1,000 requests") and::

    error_ratio > threshold = base_error_ratio * (1 + attainment_gain * (1 - slo_attainment_5min))

with the design source's ``base_error_ratio = 0.005`` and ``attainment_gain =
0.5``.  Note the sense of the formula: the threshold *rises* (up to 1.5x)
as SLO attainment over the last five minutes falls.  While the fleet is
already missing its SLOs the breaker tolerates more errors before it takes
a target away, since removing capacity then would push more load onto the
targets that remain.  It is non-increasing in attainment.

**Open -> half-open** once ``open_for_s`` has elapsed since the trip
(``open_s`` = 30 s at first).  The observation passed in the step that
makes the transition was gathered while open and does not count as a probe.

**Half-open.**  The router lets ``probe_requests`` (default 20) through
(:attr:`BreakerOutput.probe_budget`).  Once at least that many have been
observed, the breaker closes if their error ratio is **below** the
threshold; otherwise it re-opens with ``open_for_s = min(open_for_s *
backoff, max_open_s)``.  With 20 probes and a threshold near 0.5 % a single
error re-opens.  Closing resets the backoff and empties the window.

:class:`AttainmentHistory` keeps the per-window (count, ok) pairs of the
last five minutes and gives the rolling attainment the trip rule needs.

Examples
--------
>>> p = BreakerParams()
>>> s, out = step(p, BreakerState(), BreakerObs(requests=1001, errors=6, slo_attainment_5min=0.9), 10.0)
>>> out.state_name, round(out.threshold, 5), round(out.error_ratio, 6)
('open', 0.00525, 0.005994)
>>> s, out = step(p, s, BreakerObs(0, 0, 0.9), 40.0)
>>> out.state_name, out.probe_budget
('half_open', 20)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from controllers.errors import ParameterError, check_int, check_number
from core.defaults import WINDOW_S

__all__ = [
    "AttainmentHistory",
    "BreakerObs",
    "BreakerOutput",
    "BreakerParams",
    "BreakerState",
    "rolling_attainment",
    "step",
    "threshold",
]

StateName = Literal["closed", "open", "half_open"]


@dataclass(frozen=True)
class BreakerParams:
    """Trip rule, cool-down and probing (validated).

    Defaults: ``base_error_ratio``, ``attainment_gain`` and ``min_requests`` are the design
    source's, the rest governor's choices (docs/model.md §13 (breaker)).

    Examples
    --------
    >>> BreakerParams(open_s=60.0, max_open_s=30.0)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: max_open_s=30.0: must be >= open_s=60.0
    """

    base_error_ratio: float = 0.005
    attainment_gain: float = 0.5
    min_requests: int = 1000  # the window must hold strictly more
    max_window_age_s: float = 120.0
    open_s: float = 30.0
    backoff: float = 2.0
    max_open_s: float = 300.0
    probe_requests: int = 20

    def __post_init__(self) -> None:
        if not 0.0 < check_number("base_error_ratio", self.base_error_ratio, 0.0, strict=True) < 1.0:
            raise ParameterError(f"base_error_ratio={self.base_error_ratio}: must lie in (0, 1)")
        check_number("attainment_gain", self.attainment_gain, 0.0)
        check_int("min_requests", self.min_requests)
        check_number("max_window_age_s", self.max_window_age_s, 0.0, strict=True)
        check_number("open_s", self.open_s, 0.0, strict=True)
        check_number("backoff", self.backoff, 1.0)
        if check_number("max_open_s", self.max_open_s, 0.0, strict=True) < self.open_s:
            raise ParameterError(f"max_open_s={self.max_open_s}: must be >= open_s={self.open_s}")
        check_int("probe_requests", self.probe_requests, 1)


def threshold(params: BreakerParams, slo_attainment_5min: float) -> float:
    """The adaptive error-ratio threshold of the trip rule.

    Examples
    --------
    >>> p = BreakerParams()
    >>> threshold(p, 1.0), round(threshold(p, 0.9), 6), threshold(p, 0.0)
    (0.005, 0.00525, 0.0075)
    """
    a = check_number("slo_attainment_5min", slo_attainment_5min, 0.0)
    if a > 1.0:
        raise ParameterError(f"slo_attainment_5min={a}: must lie in [0, 1]")
    return params.base_error_ratio * (1.0 + params.attainment_gain * (1.0 - a))


@dataclass(frozen=True)
class BreakerObs:
    """Requests and errors of the window just closed, and the rolling attainment."""

    requests: int
    errors: int
    slo_attainment_5min: float = 1.0

    def __post_init__(self) -> None:
        check_int("requests", self.requests)
        check_int("errors", self.errors)
        if self.errors > self.requests:
            raise ParameterError(f"errors={self.errors}: exceeds requests={self.requests}")
        if not 0.0 <= check_number("slo_attainment_5min", self.slo_attainment_5min, 0.0) <= 1.0:
            raise ParameterError(f"slo_attainment_5min={self.slo_attainment_5min}: must lie in [0, 1]")


@dataclass(frozen=True)
class BreakerState:
    """Breaker memory (JSON via to_dict/from_dict).

    ``window`` holds ``(now_s, requests, errors)`` per observed window while
    closed; ``trips`` counts consecutive failed openings (for the backoff).

    Examples
    --------
    >>> s = BreakerState(name="open", window=((1.0, 5, 1),), opened_at_s=1.0, open_for_s=30.0)
    >>> BreakerState.from_dict(s.to_dict()) == s
    True
    """

    name: StateName = "closed"
    window: tuple[tuple[float, int, int], ...] = ()
    opened_at_s: float | None = None
    open_for_s: float | None = None
    trips: int = 0
    probe_requests: int = 0
    probe_errors: int = 0

    def __post_init__(self) -> None:
        if self.name not in ("closed", "open", "half_open"):
            raise ParameterError(f"name={self.name!r}: must be closed, open or half_open")
        if self.name != "closed" and (self.opened_at_s is None or self.open_for_s is None):
            raise ParameterError(f"name={self.name!r}: needs opened_at_s and open_for_s")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        d = asdict(self)
        d["window"] = [list(w) for w in self.window]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BreakerState:
        """Inverse of :meth:`to_dict` (lists from JSON become tuples)."""
        d = dict(data)
        d["window"] = tuple((float(t), int(r), int(e)) for t, r, e in d.get("window", ()))
        return cls(**d)


@dataclass(frozen=True)
class BreakerOutput:
    """What one step decided; ``error_ratio`` is of the window or of the probes."""

    state_name: StateName
    changed: bool
    threshold: float
    error_ratio: float
    reason: str
    window_requests: int = 0
    probe_budget: int = 0  # requests the router may still send while half-open

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return asdict(self)


def _trim(
    window: tuple[tuple[float, int, int], ...], min_requests: int, oldest_s: float
) -> tuple[tuple[float, int, int], ...]:
    kept = [w for w in window if w[0] >= oldest_s]
    total = sum(r for _, r, _ in kept)
    while len(kept) > 1 and total - kept[0][1] > min_requests:
        total -= kept.pop(0)[1]
    return tuple(kept)


def step(
    params: BreakerParams, state: BreakerState, window: BreakerObs, now_s: float
) -> tuple[BreakerState, BreakerOutput]:
    """Advance the breaker with one window's observation (pure).

    Parameters
    ----------
    params : BreakerParams
    state : BreakerState
        ``BreakerState()`` (closed) to start.
    window : BreakerObs
        Requests and errors of the window that closed at ``now_s``.
    now_s : float
        Time of the step (event time of the window end), seconds.

    Returns
    -------
    (BreakerState, BreakerOutput)

    Examples
    --------
    >>> p = BreakerParams()
    >>> s, out = step(p, BreakerState(), BreakerObs(1000, 500, 1.0), 0.0)
    >>> out.state_name, out.reason    # 50 % errors, yet only 1,000 requests
    ('closed', 'window 1000 requests <= min_requests 1000')
    """
    now = check_number("now_s", now_s)
    thr = threshold(params, window.slo_attainment_5min)
    if state.name == "open":
        assert state.opened_at_s is not None and state.open_for_s is not None
        left = state.opened_at_s + state.open_for_s - now
        if left > 0.0:
            return state, BreakerOutput("open", False, thr, 0.0, f"open: {left:g} s left")
        s = replace(state, name="half_open", probe_requests=0, probe_errors=0)
        return s, BreakerOutput(
            "half_open",
            True,
            thr,
            0.0,
            f"open {state.open_for_s:g} s elapsed: probing {params.probe_requests} requests",
            probe_budget=params.probe_requests,
        )
    if state.name == "half_open":
        assert state.open_for_s is not None
        n = state.probe_requests + window.requests
        e = state.probe_errors + window.errors
        ratio = e / n if n else 0.0
        if n < params.probe_requests:
            s = replace(state, probe_requests=n, probe_errors=e)
            return s, BreakerOutput(
                "half_open",
                False,
                thr,
                ratio,
                f"probing: {n}/{params.probe_requests} requests, {e} errors",
                probe_budget=params.probe_requests - n,
            )
        if ratio < thr:
            return BreakerState(), BreakerOutput(
                "closed", True, thr, ratio, f"probes passed: {e}/{n} errors, ratio {ratio:.6g} < threshold {thr:.6g}"
            )
        open_for = min(state.open_for_s * params.backoff, params.max_open_s)
        s = BreakerState(name="open", opened_at_s=now, open_for_s=open_for, trips=state.trips + 1)
        return s, BreakerOutput(
            "open",
            True,
            thr,
            ratio,
            f"probes failed: {e}/{n} errors, ratio {ratio:.6g} >= threshold {thr:.6g}; re-open for {open_for:g} s",
        )
    win = _trim(
        state.window + ((now, window.requests, window.errors),), params.min_requests, now - params.max_window_age_s
    )
    n = sum(r for _, r, _ in win)
    e = sum(x for _, _, x in win)
    ratio = e / n if n else 0.0
    if n <= params.min_requests:
        return replace(state, window=win), BreakerOutput(
            "closed", False, thr, ratio, f"window {n} requests <= min_requests {params.min_requests}", window_requests=n
        )
    if ratio > thr:
        s = BreakerState(name="open", opened_at_s=now, open_for_s=params.open_s, trips=1)
        return s, BreakerOutput(
            "open",
            True,
            thr,
            ratio,
            f"trip: error_ratio {ratio:.6g} > threshold {thr:.6g} over {n} requests",
            window_requests=n,
        )
    return replace(state, window=win), BreakerOutput(
        "closed", False, thr, ratio, f"ok: error_ratio {ratio:.6g} <= threshold {thr:.6g}", window_requests=n
    )


def rolling_attainment(pairs: Sequence[tuple[int, int]], default: float = 1.0) -> float:
    """SLO attainment ``sum(ok) / sum(count)`` over per-window (count, ok) pairs.

    With no requests at all there is no evidence of violations and the
    ``default`` (1.0: the strictest breaker threshold) is returned.

    Examples
    --------
    >>> rolling_attainment([(100, 90), (300, 300)])
    0.975
    >>> rolling_attainment([])
    1.0
    """
    count = sum(c for c, _ in pairs)
    ok = sum(k for _, k in pairs)
    if any(k > c or k < 0 for c, k in pairs):
        raise ParameterError("pairs: need 0 <= ok <= count in every window")
    return ok / count if count else default


@dataclass(frozen=True)
class AttainmentHistory:
    """The last ``horizon_s`` of per-window (count, ok) pairs (default 5 min).

    Examples
    --------
    >>> h = AttainmentHistory(window_s=100.0)          # keeps 3 windows
    >>> for c, ok in [(10, 0), (10, 10), (10, 10), (10, 10)]:
    ...     h = h.add(c, ok)
    >>> h.attainment()                                 # the failing first window has left
    1.0
    """

    window_s: float = WINDOW_S
    horizon_s: float = 300.0
    pairs: tuple[tuple[int, int], ...] = field(default=())

    def __post_init__(self) -> None:
        check_number("window_s", self.window_s, 0.0, strict=True)
        check_number("horizon_s", self.horizon_s, 0.0, strict=True)

    @property
    def max_windows(self) -> int:
        """Windows inside the horizon: ``ceil(horizon_s / window_s)``."""
        return max(1, math.ceil(self.horizon_s / self.window_s - 1e-9))

    def add(self, count: int, ok: int) -> AttainmentHistory:
        """A new history with this window appended and the oldest beyond the horizon dropped."""
        check_int("count", count)
        if not 0 <= check_int("ok", ok) <= count:
            raise ParameterError(f"ok={ok}: must lie in [0, count={count}]")
        return replace(self, pairs=(self.pairs + ((count, ok),))[-self.max_windows :])

    def attainment(self, default: float = 1.0) -> float:
        """Rolling attainment over the kept windows (see :func:`rolling_attainment`)."""
        return rolling_attainment(self.pairs, default)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return {"window_s": self.window_s, "horizon_s": self.horizon_s, "pairs": [list(p) for p in self.pairs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttainmentHistory:
        """Inverse of :meth:`to_dict`."""
        return cls(
            window_s=data["window_s"],
            horizon_s=data["horizon_s"],
            pairs=tuple((int(c), int(k)) for c, k in data["pairs"]),
        )
