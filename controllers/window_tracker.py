"""Open tumbling windows per key: the store of :mod:`controllers.windows` aggregates.

:class:`WindowTracker` keeps the open :class:`~controllers.windows.WindowAggregate`
per (key, window start), advances an event-time watermark, pops windows once
``start + size + lateness`` has passed and remembers the closed horizon so a
late record is recognised (the caller dead-letters it).  No I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from controllers.errors import LateWindowError, ParameterError
from controllers.windows import WindowAggregate, initialize

__all__ = ["WindowTracker"]


def _order(item: tuple[Hashable, int, WindowAggregate]) -> tuple[int, str]:
    return item[1], repr(item[0])


class WindowTracker:
    """Open tumbling windows per key, an event-time watermark and lateness.

    A window ``[start, start + size_ms)`` closes once
    ``start + size_ms + lateness_ms <= max(watermark, now_ms)``; the closed
    horizon is remembered and any later record whose window ends at or
    before it is late (:meth:`is_late`, and :meth:`get` raises
    :class:`~controllers.errors.LateWindowError`) so the caller dead-letters
    it.  Keys are tuples of JSON scalars (e.g. ``("az-a", "node-3")``).

    Examples
    --------
    >>> t = WindowTracker(size_ms=1000, lateness_ms=500)
    >>> t.observe(1200); t.get(("az-a",), 1000).n_requests
    0
    >>> t.close_due(), t.open_count
    ([], 1)
    >>> t.observe(2500); [(k, s) for k, s, _ in t.close_due()]
    [(('az-a',), 1000)]
    >>> t.is_late(1000)
    True
    """

    def __init__(self, size_ms: int, lateness_ms: int = 0) -> None:
        if not (isinstance(size_ms, int) and size_ms > 0):
            raise ParameterError(f"size_ms={size_ms!r}: window size must be an int > 0")
        if not (isinstance(lateness_ms, int) and lateness_ms >= 0):
            raise ParameterError(f"lateness_ms={lateness_ms!r}: lateness must be an int >= 0")
        self.size_ms = size_ms
        self.lateness_ms = lateness_ms
        self.watermark_ms: int | None = None
        self.closed_ms: int | None = None
        self._windows: dict[Hashable, dict[int, WindowAggregate]] = {}
        # A lower bound on the earliest open window start (None: no window open),
        # so that close_due is O(1) when nothing is due (it runs once per message).
        self._first_start: int | None = None

    @property
    def open_count(self) -> int:
        """Number of open (key, window) pairs."""
        return sum(len(w) for w in self._windows.values())

    def observe(self, ts_ms: int) -> None:
        """Advance the watermark to the largest event time seen."""
        if self.watermark_ms is None or ts_ms > self.watermark_ms:
            self.watermark_ms = int(ts_ms)

    def is_late(self, start_ms: int) -> bool:
        """True when the window starting at ``start_ms`` is already closed."""
        return self.closed_ms is not None and start_ms + self.size_ms <= self.closed_ms

    def get(self, key: Hashable, start_ms: int) -> WindowAggregate:
        """The aggregate of ``key``'s window at ``start_ms``, created if new.

        Raises
        ------
        LateWindowError
            If that window is already closed (dead-letter the record).
        ValueError
            If ``start_ms`` is not aligned to ``size_ms``.
        """
        if start_ms % self.size_ms:
            raise ValueError(f"start_ms={start_ms}: not aligned to size_ms={self.size_ms}")
        if self.is_late(start_ms):
            raise LateWindowError(f"window start_ms={start_ms} closed (horizon {self.closed_ms} ms) for key {key!r}")
        per_key = self._windows.setdefault(key, {})
        agg = per_key.get(start_ms)
        if agg is None:
            agg = per_key[start_ms] = initialize()
            if self._first_start is None or start_ms < self._first_start:
                self._first_start = start_ms
        return agg

    def close_due(self, now_ms: int | None = None) -> list[tuple[Hashable, int, WindowAggregate]]:
        """Pop every due window, in (start, key) order, and advance the horizon."""
        marks = [m for m in (self.watermark_ms, now_ms) if m is not None]
        if not marks:
            return []
        horizon = max(marks) - self.lateness_ms
        due: list[tuple[Hashable, int, WindowAggregate]] = []
        if self._first_start is not None and self._first_start + self.size_ms <= horizon:
            first: int | None = None
            for key, per_key in list(self._windows.items()):
                for start in list(per_key):
                    if start + self.size_ms <= horizon:
                        due.append((key, start, per_key.pop(start)))
                    elif first is None or start < first:
                        first = start
                if not per_key:
                    del self._windows[key]
            self._first_start = first
            due.sort(key=_order)
        if self.closed_ms is None or horizon > self.closed_ms:
            self.closed_ms = horizon
        return due

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state (keys stored as lists)."""
        windows = [
            {"key": list(k) if isinstance(k, tuple) else k, "start_ms": s, "agg": a.to_dict()}
            for k, per in self._windows.items()
            for s, a in sorted(per.items())
        ]
        return {
            "size_ms": self.size_ms,
            "lateness_ms": self.lateness_ms,
            "watermark_ms": self.watermark_ms,
            "closed_ms": self.closed_ms,
            "windows": windows,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowTracker:
        """Rebuild from :meth:`to_dict` output (list keys become tuples).

        Examples
        --------
        >>> t = WindowTracker(1000); t.observe(5); _ = t.get(("a", 1), 0)
        >>> WindowTracker.from_dict(t.to_dict()).to_dict() == t.to_dict()
        True
        """
        t = cls(int(data["size_ms"]), int(data["lateness_ms"]))
        t.watermark_ms = data["watermark_ms"]
        t.closed_ms = data["closed_ms"]
        for w in data["windows"]:
            key = tuple(w["key"]) if isinstance(w["key"], list) else w["key"]
            start = int(w["start_ms"])
            t._windows.setdefault(key, {})[start] = WindowAggregate.from_dict(w["agg"])
            if t._first_start is None or start < t._first_start:
                t._first_start = start
        return t
