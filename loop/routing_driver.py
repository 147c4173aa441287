"""The routing driver of the stream worker (controller: :mod:`controllers.routing`).

Latency-aware routing with fallback for the families of ``GOVERNOR_FALLBACKS``;
see :class:`RoutingDriver`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from controllers import routing as rt
from controllers.window_record import WindowRecord, decode_window
from core.settings import Settings
from loop.commands import Command
from loop.errors import SnapshotVersionError

log = logging.getLogger(__name__)

ROUTING_SNAPSHOT_VERSION = 1

__all__ = ["RoutingDriver", "RoutingDriverParams"]


@dataclass(frozen=True)
class RoutingDriverParams:
    """What the routing driver reads of the settings, built once at start (:meth:`from_settings`).

    ``classes`` gives each family (by its primary) the router's request
    classes with the primary model's configured class SLOs
    (``ModelSpec.classes``; :func:`controllers.routing.configured_classes`).

    >>> from core.settings import ModelSpec
    >>> s = Settings(models=(ModelSpec("big", classes={"trading": {"ttft_slo_ms": 150.0}}),), fallbacks=(("big", "small"),))
    >>> [c.ttft_slo_ms for c in RoutingDriverParams.from_settings(s).classes["big"]]
    [150.0, 800.0, 10000.0]
    """

    zones: tuple[str, ...]
    window_s: float
    command_ttl_s: float
    fallbacks: tuple[tuple[str, str], ...]
    capacity_rps: Mapping[str, float]  # model -> requests/s one replica sustains (profiled)
    classes: Mapping[str, tuple[rt.RequestClass, ...]]  # family primary -> its request classes

    @classmethod
    def from_settings(cls, s: Settings) -> RoutingDriverParams:
        """The routing driver's parameters of ``s``."""
        classes = {}
        for primary, _ in s.fallbacks:
            spec = s.model(primary)
            slos = {} if spec is None else {c: o.ttft_slo_ms for c, o in spec.classes.items()}
            classes[primary] = rt.configured_classes(slos)
        capacity = {m.name: m.replica_capacity_rps for m in s.models if m.replica_capacity_rps}
        return cls(s.zones, s.window_s, s.command_ttl_s, s.fallbacks, capacity, classes)


@dataclass
class RoutingDriver:
    """Latency-aware routing with fallback (:mod:`controllers.routing`) from zone windows.

    For each family configured with a fallback variant (``GOVERNOR_FALLBACKS``,
    ``primary=fallback``), the zone windows of both variants in every zone
    that share a start are gathered (a window of a later start closes the
    gathering with what arrived); :func:`controllers.routing.step` then gives
    weights per request class over the ``"variant|zone"`` targets, and one
    ``route`` command per zone is emitted when a class entered or left
    fallback, or any weight moved by more than ``min_change`` since the last
    published weights.  The router's memory is this worker's; with several
    workers, route on one (the windows of a family must reach the same
    worker).  :meth:`snapshot` / :meth:`restore` carry it (router state, the
    last published weights and the windows still being gathered) as JSON,
    so a restarted worker routes as the stopped one.

    ``breaker_of`` maps a target ``"variant|zone"`` to its circuit breaker's
    state (the worker passes :meth:`loop.breaker_driver.BreakerDriver.state_of`);
    :func:`controllers.routing.step` gives an ``open`` target no traffic and a
    ``half_open`` one its floor share (the probes).  ``forecast_of`` gives a
    target's arrival-rate forecast (the worker passes the scaler's River
    forecaster, :meth:`loop.scaler_driver.Scaler.rate_forecast`); with a
    capacity, the router predicts the queue growth from it.
    """

    params: RoutingDriverParams
    min_change: float = 0.05
    breaker_of: Callable[[str], str] | None = None
    # (variant, zone) -> arrival-rate forecast for the window the routes will apply to
    forecast_of: Callable[[str, str], float | None] | None = None
    _family: dict[str, str] = field(default_factory=dict)  # variant -> primary
    _params: dict[str, rt.RoutingParams] = field(default_factory=dict)
    _state: dict[str, rt.RoutingState] = field(default_factory=dict)
    _published: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    _pending: dict[tuple[str, int], dict[rt.Target, WindowRecord]] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings, **kw: Any) -> RoutingDriver:
        """A driver with the parameters of ``settings`` (:class:`RoutingDriverParams`)."""
        return cls(RoutingDriverParams.from_settings(settings), **kw)

    def __post_init__(self) -> None:
        for primary, fallback in self.params.fallbacks:
            self._params[primary] = rt.RoutingParams(primary=primary, fallback=fallback)
            self._family[primary] = self._family[fallback] = primary

    def obs(self, w: WindowRecord) -> rt.TargetObs:
        """A target's :class:`TargetObs` from its zone window."""
        ready = w.replicas_ready
        per_replica = self.params.capacity_rps.get(w.model)
        cap = per_replica * ready if per_replica else None
        breaker = "closed" if self.breaker_of is None else self.breaker_of(f"{w.model}|{w.zone}")
        return rt.TargetObs(
            ttft_p95_ms=w.ttft_p95_ms,
            e2e_p95_ms=w.e2e_p95_ms,
            queue_len=(w.queue_len_mean or 0.0) * max(ready, 1),
            rate_rps=w.rate_rps,
            capacity_rps=cap,
            breaker=cast(rt.BreakerName, breaker),
            forecast_rps=None if self.forecast_of is None else self.forecast_of(w.model, w.zone),
        )

    def on_window(self, w: WindowRecord, now_ms: int) -> list[Command]:
        """Feed one window record; returns the ``route`` commands to publish."""
        if w.scope != "zone":
            return []
        family = self._family.get(w.model)
        if family is None:
            return []
        start = w.window_start_ms
        self._pending.setdefault((family, start), {})[rt.Target(w.model, w.zone)] = w
        want = 2 * len(self.params.zones)
        cmds: list[Command] = []
        for key in sorted(k for k in self._pending if k[0] == family):
            if len(self._pending[key]) >= want or key[1] < start:
                cmds = self._step(family, self._pending.pop(key), now_ms) or cmds
        return cmds

    def _step(self, family: str, windows: dict[rt.Target, WindowRecord], now_ms: int) -> list[Command]:
        params = self._params[family]
        state, d = rt.step(
            params,
            self._state.get(family, rt.RoutingState()),
            {t: self.obs(w) for t, w in windows.items()},
            self.params.classes.get(family, rt.DEFAULT_CLASSES),
            self.params.window_s,
        )
        self._state[family] = state
        weights = {c: {t.key: w for t, w in ws.items()} for c, ws in d.weights.items() if ws}
        if not weights:
            return []
        last = self._published.get(family)
        moved = (
            last is None
            or set(last) != set(weights)
            or any(
                abs(ws.get(t, 0.0) - last[c].get(t, 0.0)) > self.min_change
                for c, ws in weights.items()
                for t in set(ws) | set(last[c])
            )
        )
        if not (moved or d.changed):
            return []
        self._published[family] = weights
        basis_ms = max(w.window_end_ms for w in windows.values())
        ttl = int(self.params.command_ttl_s * 1000)
        reason = "; ".join(f"{c}: {r}" for c, r in sorted(d.reasons.items()))
        return [
            Command(
                kind="route",
                zone=z,
                model=family,
                reason=reason[:500],
                issued_at_ms=now_ms,
                expires_at_ms=now_ms + ttl,
                basis_ms=basis_ms,
                controller="routing",
                payload={"weights": weights, "fallback": dict(d.fallback)},
            )
            for z in self.params.zones
        ]

    @property
    def families(self) -> tuple[str, ...]:
        """The routed families (their primaries), the unit of the worker's routing snapshots."""
        return tuple(self._params)

    def snapshot(self, only: str | None = None) -> dict[str, Any]:
        """Router state, last published weights and the gathering windows per family (plain data).

        ``only`` keeps one family (the worker stores one snapshot per family).
        """
        pending = [
            [family, start, [[t.variant, t.zone, w.to_dict()] for t, w in ws.items()]]
            for (family, start), ws in self._pending.items()
            if only in (None, family)
        ]
        return {
            "version": ROUTING_SNAPSHOT_VERSION,
            "state": {f: s.to_dict() for f, s in self._state.items() if only in (None, f)},
            "published": {
                f: {c: dict(ws) for c, ws in w.items()} for f, w in self._published.items() if only in (None, f)
            },
            "pending": pending,
        }

    def restore(self, data: Mapping[str, Any]) -> int:
        """Load a :meth:`snapshot` (families no longer configured are dropped); returns the families restored."""
        if data.get("version") != ROUTING_SNAPSHOT_VERSION:
            raise SnapshotVersionError(
                f"routing snapshot version {data.get('version')!r} (this worker: {ROUTING_SNAPSHOT_VERSION})"
            )
        known = set(self._params)
        state = {f: rt.RoutingState.from_dict(s) for f, s in data["state"].items() if f in known}
        published = {f: w for f, w in data["published"].items() if f in known}
        pending = {
            (f, int(start)): {rt.Target(v, z): decode_window(w) for v, z, w in ws}
            for f, start, ws in data["pending"]
            if f in known
        }
        self._state.update(state)  # all or nothing: built first, then merged
        self._published.update(published)
        self._pending.update(pending)
        return len(state)
