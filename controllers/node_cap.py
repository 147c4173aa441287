"""The node cap of a (model, zone) window: which new node ids get a slot (issue 31, item 5).

A (model, zone) window holds at most ``max_nodes`` distinct nodes
(``GOVERNOR_MAX_NODES_PER_WINDOW``): the bound on the ingest's open windows.
First come, first served, 1,024 junk node ids sent ahead of a fleet's own
records took every slot, the real nodes' records were dropped, and the junk
decided the window.  :class:`NodeCap` admits nodes by what it has seen:

- **Known nodes keep their slots.** A node is *known* when a window of its
  (model, zone) that closed in the last ``recent_windows`` window lengths
  held it.  A known node is admitted whenever the window has room, and new
  ids never take the slots the known ones have not claimed yet: a new id
  needs ``new + known < max_nodes``.
- **New ids grow the fleet at most ``max(new_floor, known)`` a window.** A
  real fleet at most doubles from one window to the next (a 64-node zone
  may appear at once: ``new_floor``); 1,024 fresh ids beside 8 real nodes
  get 64 slots, not 1,016.
- **Drops are counted per window**, not dead-lettered one by one: the caller
  reads :meth:`close` and reports one summary per window; a window whose cap
  dropped more than :data:`HOLD_DROPPED_RATE` of its records is held by the
  loop (:func:`controllers.staleness.classify`, ``node_cap``).

After a start nothing is known: a zone of more than ``new_floor`` nodes takes
a few held windows to be admitted whole (64, 128, 256, ...).  Pure: no I/O,
no clock; state bounded by ``recent_windows x max_nodes`` known ids per
(model, zone) and one counter per open window.

>>> cap = NodeCap(max_nodes=4, window_ms=1000, new_floor=2)
>>> for i in range(2):
...     cap.opened("m", "a", f"n{i}", 0)
>>> cap.admits("m", "a", "n2", 0, open_nodes=2)  # nothing known yet: new_floor new ids
False
>>> cap.drop("m", "a", 0)
>>> cap.close("m", "a", 0, ["n0", "n1"])
1
>>> cap.admits("m", "a", "junk", 1000, open_nodes=0), cap.admits("m", "a", "n1", 1000, open_nodes=3)
(True, True)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from controllers.errors import ParameterError

__all__ = ["HOLD_DROPPED_RATE", "NEW_NODES_FLOOR", "RECENT_WINDOWS", "NodeCap", "dropped_rate"]

RECENT_WINDOWS = 3  # a node is known while a window of the last 3 held it
NEW_NODES_FLOOR = 64  # new node ids a window may admit whatever the known fleet (a small zone appears at once)
HOLD_DROPPED_RATE = 0.1  # a window whose cap dropped more than this share of its records is held


def dropped_rate(dropped: int, admitted: int) -> float:
    """The share of a window's records the cap dropped (0 when it dropped none).

    >>> dropped_rate(960, 96), dropped_rate(0, 0)
    (0.9090909090909091, 0.0)
    """
    return dropped / (dropped + admitted) if dropped > 0 else 0.0


@dataclass
class NodeCap:
    """Which nodes a (model, zone) window admits, and what it dropped (see the module docstring).

    Windows are keyed ``(model, zone, start_ms)``; the caller counts the nodes open
    in a window and tells :meth:`opened` each one it opens.
    """

    max_nodes: int
    window_ms: int
    recent_windows: int = RECENT_WINDOWS
    new_floor: int = NEW_NODES_FLOOR
    known: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)  # node -> latest start
    new_in: dict[tuple[str, str, int], int] = field(default_factory=dict)  # new ids opened per window
    dropped: dict[tuple[str, str, int], int] = field(default_factory=dict)  # records dropped per window

    def __post_init__(self) -> None:
        for name in ("max_nodes", "window_ms", "recent_windows", "new_floor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParameterError(f"{name}={value!r}: must be an int >= 1")

    def _new_room(self, model: str, zone: str, start: int) -> int:
        """How many more new ids the window ``(model, zone, start)`` may open."""
        k = len(self.known.get((model, zone), ()))
        allowance = min(self.max_nodes - k, max(self.new_floor, k))
        return allowance - self.new_in.get((model, zone, start), 0)

    def admits(self, model: str, zone: str, node: str, start: int, open_nodes: int) -> bool:
        """Whether ``node``, not yet open in the window, gets a slot (``open_nodes`` are open)."""
        if open_nodes >= self.max_nodes:
            return False
        return node in self.known.get((model, zone), ()) or self._new_room(model, zone, start) > 0

    def fits(self, model: str, zone: str, start: int, nodes: Collection[str], open_nodes: int) -> bool:
        """Whether every one of ``nodes`` (none open in the window yet) gets a slot."""
        known = self.known.get((model, zone), {})
        new = sum(1 for n in nodes if n not in known)
        return open_nodes + len(nodes) <= self.max_nodes and new <= self._new_room(model, zone, start)

    def opened(self, model: str, zone: str, node: str, start: int) -> None:
        """``node`` was admitted and its window opened."""
        if node not in self.known.get((model, zone), ()):
            key = (model, zone, start)
            self.new_in[key] = self.new_in.get(key, 0) + 1

    def drop(self, model: str, zone: str, start: int, records: int = 1) -> None:
        """``records`` records of a node the window had no slot for were dropped."""
        key = (model, zone, start)
        self.dropped[key] = self.dropped.get(key, 0) + records

    def close(self, model: str, zone: str, start: int, nodes: Iterable[str]) -> int:
        """The window closed holding ``nodes``: they are known from now on; the records it dropped."""
        seen = self.known.setdefault((model, zone), {})
        for node in nodes:
            seen[node] = max(seen.get(node, start), start)
        horizon = start - (self.recent_windows - 1) * self.window_ms
        for node in [n for n, s in seen.items() if s < horizon]:
            del seen[node]
        self.new_in.pop((model, zone, start), None)
        return self.dropped.pop((model, zone, start), 0)

    def closed_without_nodes(self, closed_ms: int) -> list[tuple[tuple[str, str, int], int]]:
        """Windows ended by ``closed_ms`` that dropped records and opened no node: (key, dropped), removed."""
        done = [(key, n) for key, n in self.dropped.items() if key[2] + self.window_ms <= closed_ms]
        for key, _ in done:
            del self.dropped[key]
            self.new_in.pop(key, None)
        return done
