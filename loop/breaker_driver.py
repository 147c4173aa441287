"""The adaptive circuit breaker on the real path: zone windows -> ``breaker`` commands (no I/O).

:class:`BreakerDriver` keeps one :class:`~controllers.breaker.BreakerState`
per *target* ``"<model>|<zone>"`` and runs :func:`controllers.breaker.step`
on every zone-scope window record of that target (docs/model.md §13 (breaker)):

* **requests / errors** -- the window's ``count`` and ``round(error_rate *
  count)``; the controller's count-based sliding window of the most recent
  windows holding more than ``GOVERNOR_BREAKER_MIN_REQUESTS`` requests does
  the rest.
* **SLO attainment over the last 5 minutes** -- per window, the requests
  *on time* are ``round(count * (1 - violation_rate))``: a request is on time
  when it did not fail and its TTFT and ITL were within the model's SLO (the
  window's own definition of a violation, :mod:`controllers.windows`).  Each
  target keeps an :class:`~controllers.breaker.AttainmentHistory` of its
  last 5 minutes of windows; the attainment a breaker sees is that of its
  *model* over every zone (the pooled histories of the model's targets):
  the threshold rises while the model's fleet misses its SLOs, since taking
  a target away would push its load onto the model's other zones.
* **time** -- the window's end (event time), so a replay or a restored
  worker decides exactly as a live one.

A redelivered window (its end not newer than the target's last) is ignored.
An open target receives no traffic, so its own windows may stop; every
window of *another* target therefore also advances the open targets whose
cool-down has elapsed by that window's end (to ``half_open``, at that end;
windows of the target up to that end, gathered while open, are then
ignored).

On every state change (``closed`` / ``open`` / ``half_open``) it emits one
``breaker`` command per zone in ``GOVERNOR_ZONES`` (every zone's gateway may
route to the target)::

    payload = {"target": "<model>|<zone>", "state": ..., "probe_budget": int,
               "threshold": float, "error_ratio": float}

with the controller's reason, ``basis_ms`` = the window end and
``controller="breaker"``.  The command's ``model`` is the *target*
(``"<model>|<zone>"``): executors order commands per (kind, model), and the
breakers of one model's zones are independent, so a state change of one
zone must never be refused as stale because another zone's breaker moved
on a newer window.  Executors write the payload into
``<prefix>:breaker:<zone>`` (field = target; :mod:`executors.backends`).

:meth:`BreakerDriver.snapshot` / :meth:`BreakerDriver.restore` carry the
whole memory as JSON, so a restarted worker decides as the stopped one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from controllers.breaker import (
    AttainmentHistory,
    BreakerObs,
    BreakerOutput,
    BreakerParams,
    BreakerState,
    rolling_attainment,
    step,
)
from controllers.window_record import WindowRecord
from core.settings import Settings
from loop.commands import Command
from loop.errors import SnapshotVersionError

log = logging.getLogger(__name__)

__all__ = [
    "SNAPSHOT_VERSION",
    "BreakerDriver",
    "BreakerDriverParams",
    "Transition",
    "fresh_zone_window",
    "parse_window",
]

SNAPSHOT_VERSION = 1
HORIZON_S = 300.0  # the design source's "SLO attainment of the last 5 minutes" (docs/model.md §13 (breaker))
Target = tuple[str, str]  # (model, zone)


@dataclass(frozen=True)
class Transition:
    """One state change of one target (for the metrics and the log)."""

    model: str
    zone: str
    state: str
    reason: str


@dataclass(frozen=True)
class _Window:
    model: str
    zone: str
    end_ms: int
    requests: int
    errors: int
    on_time: int


def parse_window(w: WindowRecord) -> _Window:
    """The counts a breaker needs from a zone window.

    >>> from controllers.window_record import decode_window
    >>> w = parse_window(decode_window({"scope": "zone", "model": "m", "zone": "z", "window_end_ms": 10_000,
    ...                                 "count": 1000, "error_rate": 0.012, "violation_rate": 0.05}))
    >>> w.requests, w.errors, w.on_time
    (1000, 12, 950)
    """
    count = w.count
    errors = min(count, round(w.error_rate * count))
    on_time = max(0, min(count, round(count * (1.0 - w.violation_rate))))
    return _Window(w.model, w.zone, w.window_end_ms, count, errors, on_time)


class _ZoneWindow(Protocol):  # read-only members: the windows are frozen dataclasses
    @property
    def model(self) -> str: ...
    @property
    def zone(self) -> str: ...
    @property
    def end_ms(self) -> int: ...


W = TypeVar("W", bound=_ZoneWindow)


def fresh_zone_window(
    w: WindowRecord, parse: Callable[[WindowRecord], W | None], last_end_ms: dict[Target, int], what: str
) -> W | None:
    """``parse(w)`` of a zone window newer than its target's last one (recorded), else None.

    Not a zone window, one ``parse`` finds unusable (``ValueError``, logged) or
    has nothing in (None), or a redelivered one (its end not newer than
    ``last_end_ms[(model, zone)]``) give None.
    """
    if w.scope != "zone":
        return None
    try:
        parsed = parse(w)
    except ValueError as exc:
        log.warning("%s: window skipped (%s)", what, exc)
        return None
    if parsed is None or parsed.end_ms <= last_end_ms.get((parsed.model, parsed.zone), -1):
        return None
    last_end_ms[(parsed.model, parsed.zone)] = parsed.end_ms
    return parsed


def _key(target: Target) -> str:
    return f"{target[0]}|{target[1]}"


@dataclass(frozen=True)
class BreakerDriverParams:
    """What the breaker driver reads of the settings, built once at start (:meth:`from_settings`)."""

    zones: tuple[str, ...]
    window_s: float
    command_ttl_s: float
    breaker: BreakerParams  # the controller's (controllers.breaker)

    @classmethod
    def from_settings(cls, s: Settings, breaker: BreakerParams | None = None) -> BreakerDriverParams:
        """The breaker driver's parameters of ``s`` (``breaker``: the controller's, else from the settings)."""
        return cls(s.zones, s.window_s, s.command_ttl_s, breaker or BreakerParams(min_requests=s.breaker_min_requests))


class BreakerDriver:
    """One adaptive breaker per ``model|zone`` target, fed by zone windows.

    Examples
    --------
    >>> d = BreakerDriver.from_settings(Settings(zones=("az-a", "az-b"), breaker_min_requests=200))
    >>> from controllers.window_record import decode_window
    >>> w = decode_window({"scope": "zone", "model": "m", "zone": "az-a", "window_end_ms": 10_000,
    ...                    "count": 300, "error_rate": 0.02, "violation_rate": 0.02})
    >>> [(c.zone, c.payload["state"], c.payload["error_ratio"]) for c in d.on_window(w, 0)]
    [('az-a', 'open', 0.02), ('az-b', 'open', 0.02)]
    >>> d.state_of("m|az-a"), d.on_window(w, 0)          # a redelivered window changes nothing
    ('open', [])
    """

    def __init__(self, config: BreakerDriverParams) -> None:
        self.config = config
        self.params = config.breaker
        self.states: dict[Target, BreakerState] = {}
        self.history: dict[Target, AttainmentHistory] = {}
        self.last_end_ms: dict[Target, int] = {}
        self._transitions: list[Transition] = []

    @classmethod
    def from_settings(cls, settings: Settings, breaker: BreakerParams | None = None) -> BreakerDriver:
        """A driver with the parameters of ``settings`` (:class:`BreakerDriverParams`)."""
        return cls(BreakerDriverParams.from_settings(settings, breaker))

    def state_of(self, target: str) -> str:
        """The current state of ``"<model>|<zone>"`` (``closed`` when never seen)."""
        model, _, zone = target.rpartition("|")
        st = self.states.get((model, zone))
        return "closed" if st is None else st.name

    def drain_transitions(self) -> list[Transition]:
        """The state changes since the last call."""
        out, self._transitions = self._transitions, []
        return out

    def attainment(self, model: str) -> float:
        """The model's SLO attainment over the last 5 minutes, every zone pooled."""
        return rolling_attainment([p for t, h in sorted(self.history.items()) if t[0] == model for p in h.pairs])

    def on_window(self, record: WindowRecord, now_ms: int) -> list[Command]:
        """Feed one window record; returns the ``breaker`` commands to publish."""
        # Not newer: redelivered, or gathered while open and already stepped past.
        w = fresh_zone_window(record, parse_window, self.last_end_ms, "breaker")
        if w is None:
            return []
        target = (w.model, w.zone)
        hist = self.history.get(target) or AttainmentHistory(window_s=self.config.window_s, horizon_s=HORIZON_S)
        self.history[target] = hist.add(w.requests, w.on_time)
        cmds = self._step(target, BreakerObs(w.requests, w.errors, self.attainment(w.model)), w.end_ms, now_ms)
        for other, st in sorted(self.states.items()):
            if other != target and st.name == "open" and self._due(st, w.end_ms):
                self.last_end_ms[other] = max(self.last_end_ms.get(other, -1), w.end_ms)
                cmds += self._step(other, BreakerObs(0, 0, self.attainment(other[0])), w.end_ms, now_ms)
        return cmds

    @staticmethod
    def _due(st: BreakerState, end_ms: int) -> bool:
        assert st.opened_at_s is not None and st.open_for_s is not None
        return st.opened_at_s + st.open_for_s <= end_ms / 1000.0

    def _step(self, target: Target, obs: BreakerObs, end_ms: int, now_ms: int) -> list[Command]:
        state, out = step(self.params, self.states.get(target, BreakerState()), obs, end_ms / 1000.0)
        self.states[target] = state
        if not out.changed:
            return []
        self._transitions.append(Transition(target[0], target[1], out.state_name, out.reason))
        return self._commands(target, out, end_ms, now_ms)

    def _commands(self, target: Target, out: BreakerOutput, end_ms: int, now_ms: int) -> list[Command]:
        key = _key(target)
        ttl = int(self.config.command_ttl_s * 1000)
        payload = {
            "target": key,
            "state": out.state_name,
            "probe_budget": int(out.probe_budget),
            "threshold": float(out.threshold),
            "error_ratio": float(out.error_ratio),
        }
        return [
            Command(
                kind="breaker",
                zone=z,
                model=key,
                reason=out.reason[:500],
                issued_at_ms=now_ms,
                expires_at_ms=now_ms + ttl,
                basis_ms=end_ms,
                controller="breaker",
                payload=dict(payload),
            )
            for z in self.config.zones
        ]

    # -- snapshots ------------------------------------------------------------
    def snapshot(self, only: str | None = None) -> dict[str, Any]:
        """Every target's breaker state, attainment history and last window end (plain data).

        ``only`` keeps one model's targets (the worker stores one snapshot per model).
        """
        targets = {
            _key(t): {
                "state": s.to_dict(),
                "history": self.history[t].to_dict(),
                "last_end_ms": self.last_end_ms.get(t, -1),
            }
            for t, s in self.states.items()
            if t in self.history and only in (None, t[0])
        }
        return {"version": SNAPSHOT_VERSION, "targets": targets}

    def restore(self, data: Mapping[str, Any]) -> int:
        """Load a :meth:`snapshot` (all or nothing, merged into memory); returns the number of targets."""
        if data.get("version") != SNAPSHOT_VERSION:
            raise SnapshotVersionError(
                f"breaker snapshot version {data.get('version')!r} (this worker: {SNAPSHOT_VERSION})"
            )
        states: dict[Target, BreakerState] = {}
        history: dict[Target, AttainmentHistory] = {}
        last: dict[Target, int] = {}
        for key, d in data["targets"].items():
            model, _, zone = key.rpartition("|")
            states[(model, zone)] = BreakerState.from_dict(d["state"])
            history[(model, zone)] = AttainmentHistory.from_dict(d["history"])
            last[(model, zone)] = int(d["last_end_ms"])
        self.states.update(states)  # all or nothing: built first, then merged
        self.history.update(history)
        self.last_end_ms.update(last)
        return len(states)
