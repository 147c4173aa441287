"""What crosses the loop's boundary: the input events the shell reads for it, the effects it returns.

The loop does no I/O.  What lives in Redis enters through one port,
:meth:`loop.control_loop.ControlLoop.observe`, as one of the input events below
(the worker reads them; the fast simulator makes them up).  Each decision
(:meth:`~loop.control_loop.ControlLoop.decide`, ``observe``) returns one
:class:`Effects` value, which the worker's shell performs in this order:
writes (a compare-and-set write first, then the commands it guards), status
rows, events, commands, dead letters.

>>> fx = Effects()
>>> fx.events.append({"kind": "drift"})
>>> fx.extend(Effects(status=[StatusRow("m|az-a", {"target": 3})]))
>>> len(fx.events), fx.status[0].field
(1, 'm|az-a')
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from loop.commands import Command

__all__ = [
    "AdmissionEntries",
    "Allowances",
    "Effects",
    "HashWrite",
    "Heartbeats",
    "InputEvent",
    "PlatformReplicas",
    "Rollout",
    "StatusRow",
    "SwapWrite",
    "Tick",
    "ZoneClocks",
]


# -- input events ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Heartbeats:
    """The zones whose executor heartbeat is present (None: no view, Redis did not answer)."""

    alive: Collection[str] | None


@dataclass(frozen=True)
class Allowances:
    """Each zone's stored share of the fleet budget, raw (None: no view, the last one kept)."""

    raw: Mapping[str, Any] | None


@dataclass(frozen=True)
class PlatformReplicas:
    """A zone's replica counts as its platform reports them (the hash its executor writes)."""

    zone: str
    fields: Mapping[Any, Any]


@dataclass(frozen=True)
class Rollout:
    """A model family's canary rollout as read before its zone window (None: no rollout)."""

    model: str
    raw: bytes | None


@dataclass(frozen=True)
class AdmissionEntries:
    """The admission registry as read, the time and the model latencies to review it under.

    The review is the one slow decision: the worker observes this event in a worker thread,
    on copies (the latencies read on the event loop, :meth:`loop.admission_driver.AdmissionDriver.latencies`).
    """

    entries: Mapping[Any, Any]
    now_ms: int
    latencies: Mapping[str, float]


@dataclass(frozen=True)
class Tick:
    """The clock: (model, zone)s whose windows stopped turn stale."""

    now_ms: int


@dataclass(frozen=True)
class ZoneClocks:
    """The executors' heartbeats as read (decoded, by zone; None: no view) with the measured lead in each
    (``timing``), and one exchange ``(t0, redis_time, t3)`` of the worker's wall clock against Redis
    ``TIME`` (None: not read), at ``now_ms``: what ``apply_at_ms`` is planned from (:mod:`controllers.apply_at`)."""

    beats: Mapping[str, Any] | None
    clock: tuple[float, float, float] | None
    now_ms: int


InputEvent = Heartbeats | Allowances | PlatformReplicas | Rollout | AdmissionEntries | Tick | ZoneClocks


# -- effects ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StatusRow:
    """One field of the status hash (``governor status``): ``<model>|<zone>`` -> its record."""

    field: str
    record: dict[str, Any]


@dataclass(frozen=True)
class HashWrite:
    """Fields to set in a Redis hash; with ``reviewed``, only those whose stored value is still the
    one ``reviewed`` holds (none removed or rewritten since it was read)."""

    key: str
    fields: dict[str, bytes]
    reviewed: Mapping[Any, Any] | None = None


@dataclass(frozen=True)
class SwapWrite:
    """Set ``key`` to ``value`` only if it still holds ``expect`` (an optimistic transaction); the
    commands in ``then`` (with their log line) are published only once it is written: a value
    changed meanwhile (an operator's abort) wins, and the next decision starts from it."""

    key: str
    value: bytes
    expect: bytes
    then: tuple[tuple[Command, str], ...] = ()


@dataclass
class Effects:
    """What one decision asks of the shell (see the module docstring)."""

    commands: list[Command] = field(default_factory=list)
    described: list[str] = field(default_factory=list)  # one log line per command
    events: list[dict[str, Any]] = field(default_factory=list)
    status: list[StatusRow] = field(default_factory=list)
    writes: list[HashWrite | SwapWrite] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)

    def add(self, cmd: Command, what: str) -> None:
        self.commands.append(cmd)
        self.described.append(what)

    def extend(self, other: Effects) -> None:
        for mine, theirs in zip(self._parts(), other._parts(), strict=True):
            mine.extend(theirs)

    def _parts(self) -> tuple[list[Any], ...]:
        return (self.commands, self.described, self.events, self.status, self.writes, self.dead_letters)
