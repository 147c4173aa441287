"""Measured replica start-up of one (model, zone), from the windows' replica counts.

A replica that the platform shows *starting* at window ``t`` and *ready* at window ``t'``
took ``t' - t`` seconds to start (window resolution: each end is known to one window).
The windows carry counts, not replica names, so starts and readies are matched in FIFO
order, the order a platform brings replicas up in::

    became_ready = max(0, ready_k - ready_{k-1})
    started      = max(0, (starting_k - starting_{k-1}) + became_ready)
    cancelled    = max(0, -((starting_k - starting_{k-1}) + became_ready))

The ``started`` ones join the queue stamped with this window's end; ``became_ready``
leave from its head, each giving a sample; a cancelled start (a scale-down that removed a
replica still loading) leaves from its tail, without a sample (the newest start is the one
a platform cancels first).  Replicas already starting when the key is first seen have no
known start and give no sample either; a queue that disagrees with the starting count
(a window missed) is cut or padded with unknown starts to match it.

The estimate is the median of the last :data:`STARTUP_SAMPLES` samples, robust to a
replica that failed and restarted or a window that merged two transitions; until the
first sample it is the settings' ``startup_hint_s``.  The state is plain data and
bounded: at most :data:`MAX_PENDING` starts queued and :data:`STARTUP_SAMPLES` samples.

The scaling law (:mod:`controllers.scaling_law`) reads it for the feedforward's horizon,
the forecast look-ahead, the forecast-error margin's horizon and the scale-down
stabilisation window.

>>> s = StartupState()
>>> for t, starting, ready in ((0, 0, 4), (10, 2, 4), (20, 2, 4), (140, 0, 6)):
...     s = observe(s, t, starting, ready)
>>> s.samples, estimate_s(s, 30.0), estimate_s(StartupState(), 30.0)
((130.0, 130.0), 130.0, 30.0)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from controllers.errors import ParameterError, check_number

__all__ = ["MAX_PENDING", "STARTUP_SAMPLES", "StartupState", "estimate_s", "observe"]

STARTUP_SAMPLES = 9  # the median of the last nine starts: one slow restart or merged window moves it little
MAX_PENDING = 1024  # starts queued at most (a zone's fleet is far smaller)


@dataclass(frozen=True)
class StartupState:
    """Starts in flight (their window end, None: unknown) oldest first, the last samples, and the
    counts of the window before (None before the first)."""

    pending: tuple[float | None, ...] = ()
    samples: tuple[float, ...] = ()
    starting: int | None = None
    ready: int | None = None

    def __post_init__(self) -> None:
        if len(self.pending) > MAX_PENDING:
            raise ParameterError(f"pending: {len(self.pending)} starts, at most {MAX_PENDING}")
        if len(self.samples) > STARTUP_SAMPLES:
            raise ParameterError(f"samples: {len(self.samples)} samples, at most {STARTUP_SAMPLES}")
        for t in self.pending:
            if t is not None:
                check_number("pending", t)
        for v in self.samples:
            check_number("samples", v, 0.0)
        for name in ("starting", "ready"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ParameterError(f"{name}={v!r}: must be an int >= 0 or None")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return {
            "pending": list(self.pending),
            "samples": list(self.samples),
            "starting": self.starting,
            "ready": self.ready,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StartupState:
        """Inverse of :meth:`to_dict` (``ParameterError`` on a malformed one)."""
        return cls(
            pending=tuple(None if t is None else float(t) for t in data.get("pending", ())),
            samples=tuple(float(v) for v in data.get("samples", ())),
            starting=data.get("starting"),
            ready=data.get("ready"),
        )


def observe(state: StartupState, window_end_s: float, starting: int, ready: int, window_s: float = 0.0) -> StartupState:
    """Fold one window's ``replicas_starting`` / ``replicas_ready`` into the state (pure).

    A replica that starts and turns ready within one window (``window_s`` long) counts half a window.

    >>> s = observe(StartupState(), 0.0, 3, 0)          # already starting when first seen: unknown
    >>> s = observe(s, 10.0, 3, 1)                      # one of them ready, one new start
    >>> s.samples, s.pending
    ((), (None, None, 10.0))
    >>> s = observe(s, 20.0, 2, 1)                      # the newest start cancelled: no sample
    >>> s.pending, observe(s, 60.0, 0, 3).samples
    ((None, None), ())
    """
    window_end_s = check_number("window_end_s", window_end_s)
    for name, v in (("starting", starting), ("ready", ready)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ParameterError(f"{name}={v!r}: must be an int >= 0")
    if state.starting is None or state.ready is None:
        return StartupState((None,) * min(starting, MAX_PENDING), state.samples, starting, ready)
    became_ready = max(0, ready - state.ready)
    net = starting - state.starting + became_ready
    pending = list(state.pending) + [window_end_s] * max(0, net)
    if net < 0:
        del pending[max(0, len(pending) + net) :]  # cancelled starts: the newest, no sample
    samples = list(state.samples)
    for t0 in pending[:became_ready]:
        if t0 is not None:
            samples.append(max(0.5 * window_s, window_end_s - t0))
    pending = pending[became_ready:]
    if len(pending) > starting:  # the platform shows fewer starting than matched: drop the newest
        pending = pending[:starting]
    elif len(pending) < starting:  # more than matched (a window missed): their start is unknown
        unknown: list[float | None] = [None] * (starting - len(pending))
        pending = unknown + pending
    return StartupState(tuple(pending[:MAX_PENDING]), tuple(samples[-STARTUP_SAMPLES:]), starting, ready)


def estimate_s(state: StartupState, hint_s: float) -> float:
    """The start-up in seconds: the median of the samples, ``hint_s`` before the first."""
    return float(statistics.median(state.samples)) if state.samples else hint_s
