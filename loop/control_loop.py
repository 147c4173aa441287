"""The control loop in memory: telemetry -> windows -> typed records -> drivers -> commands.

:class:`ControlLoop` holds everything the stream worker decides with -- the
ingest processor and one driver per controller -- and exposes one method per
event, so the loop can be driven, and tested, without a broker:

- :meth:`ControlLoop.ingest` a telemetry message (dead letters, windows closed), and
  :meth:`ControlLoop.close_due` the windows whose lateness has passed (on a worker:
  per telemetry partition, :mod:`loop.partitioned_ingest`);
- :meth:`ControlLoop.decode` a metrics message into a :class:`WindowRecord`
  (or the dead letter that says why it is not one);
- :meth:`ControlLoop.decide` a window record: the effects (:class:`loop.effects.Effects`:
  commands, events, status rows, writes) of every driver, in a fixed order;
- :meth:`ControlLoop.observe` an input event: what lives in Redis (rollouts, admission
  entries, heartbeats, platform replicas, allowances) and the clock, the one port
  through which it enters (:mod:`loop.effects`);
- :meth:`ControlLoop.snapshot_scopes` / :meth:`ControlLoop.restore_scope` the
  drivers' state as plain data, one scope per model and per routed family
  (sealed and stored by :mod:`streams.snapshots`);
- :meth:`ControlLoop.export_targets` the scalers' targets as ``governor_replicas_target``
  (every zone window, a restored key's from its first fresh window: the gauge KEDA scales
  on, ``infra/k8s/keda/``).

The Faust agents in :mod:`streams.agents` only move bytes to and from these
methods and perform the effects; the fast simulator (:mod:`sim.fastloop`) drives
the same class, so the simulator and the worker cannot drift apart.  Every driver
follows one protocol (:class:`WindowDriver`; with its state, :class:`Driver`).

Window records are authenticated when the loop has a keyring (the worker:
``settings.keyring()``): :meth:`ControlLoop.sign_window` gives the bytes and
the Kafka headers (``governor-kid``, ``governor-sig``: HMAC-SHA256 over the
exact value bytes, :meth:`core.signing.Keyring.sign_bytes`), and
:meth:`ControlLoop.decode` dead-letters a record whose MAC is missing or wrong
(``unauthenticated window record: ...``) -- whoever can write to the metrics
topic cannot make the loop scale.  Without a keyring (the fast simulator)
nothing is signed or verified.

Examples
--------
>>> from core.settings import ModelSpec, Settings
>>> loop = ControlLoop(Settings(models=(ModelSpec("m"),), zones=("az-a",)))
>>> loop.decode(b"{not json", {"topic": "metrics"}, 0)[1]["reason"]
'bad metrics record: not JSON'
>>> rec, _ = loop.decode({"scope": "zone", "model": "m", "zone": "az-a", "window_end_ms": 10_000,
...                       "window_s": 10.0, "count": 100, "violation_rate": 1.0, "replicas_ready": 2}, {}, 0)
>>> [(c.kind, c.target_replicas) for c in loop.decide(rec, 10_000).commands]
[('scale', 3)]
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from controllers.apply_at import ApplyAtParams, ApplyAtPlanner
from controllers.window_record import WindowRecord, WindowRecordError, decode_window
from core import names
from core.budget import Allowance
from core.settings import Settings
from core.signing import Keyring
from loop.admission_driver import AdmissionDriver
from loop.agent_weights_driver import AgentWeightsDriver
from loop.breaker_driver import BreakerDriver
from loop.canary_driver import CanaryDriver
from loop.commands import Command
from loop.cross_zone import stamp_cross_zone
from loop.effects import (
    AdmissionEntries,
    Allowances,
    Effects,
    HashWrite,
    Heartbeats,
    InputEvent,
    PlatformReplicas,
    Rollout,
    StatusRow,
    Tick,
    ZoneClocks,
)
from loop.errors import SnapshotVersionError
from loop.kv_policy_driver import KvPolicyDriver
from loop.partitioned_ingest import PartitionedIngest
from loop.pipeline import ProcessResult, TelemetryProcessor, dead_letter
from loop.platform_truth import PlatformTruth
from loop.ports import LoopMetrics
from loop.retune_driver import RetuneDriver
from loop.routing_driver import RoutingDriver
from loop.scaler_driver import Scaler
from loop.telemetry_watch import TelemetryWatch

__all__ = ["ControlLoop", "Driver", "Ingested", "WindowDriver"]

log = logging.getLogger(__name__)


KID_HEADER = "governor-kid"
SIG_HEADER = "governor-sig"


def _header_str(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


class WindowDriver(Protocol):
    """What every driver offers the loop: one window record in, the commands to publish now out."""

    def on_window(self, record: WindowRecord, now_ms: int) -> list[Command]: ...


class Driver(WindowDriver, Protocol):
    """A driver whose learned state the loop snapshots (the canary's and admission's live in Redis)."""

    def snapshot(self, only: str | None = None) -> dict[str, Any]: ...

    def restore(self, data: Mapping[str, Any]) -> int: ...


@dataclass
class Ingested:
    """What one telemetry message produced."""

    valid: int = 0
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)
    max_ts_ms: int | None = None  # latest event time windowed (see ControlLoop.committable)
    capped: int = 0  # records the node cap dropped (PartitionedIngest.drain_dead_letters: one letter a window)


class ControlLoop:
    """The worker's processor and drivers, one method per event (see the module docstring).

    ``metrics`` (optional) is updated as the events pass (the fast simulator runs without it).
    ``keyring`` (optional) signs and verifies window records; without it nothing is verified.
    """

    def __init__(self, settings: Settings, metrics: LoopMetrics | None = None, keyring: Keyring | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.keyring = keyring
        self.ingests = PartitionedIngest(settings)  # one processor per partition on a worker (partitioned)
        self.scaler = Scaler(settings)
        self.retune = RetuneDriver(settings, self.scaler)  # online retuning: rings, schedule, gains in force
        self.kv_policy = KvPolicyDriver(ttl_ms=int(settings.command_ttl_s * 1000))
        self.breaker = BreakerDriver.from_settings(settings)
        self.agent_weights = AgentWeightsDriver.from_settings(settings)
        # Routing runs on a window before the scaler sees it: the forecast 2 windows past
        # the scaler's last one is the window the new routes apply to.
        self.routing = RoutingDriver.from_settings(
            settings,
            breaker_of=self.breaker.state_of,
            forecast_of=lambda m, z: self.scaler.rate_forecast(m, z, steps=2),
        )
        self.routed_families = {m for pair in settings.fallbacks for m in pair}
        self._families_of: dict[str, set[str]] = {}  # model -> the routed families it is a variant of
        for primary, fallback in settings.fallbacks:
            for m in (primary, fallback):
                self._families_of.setdefault(m, set()).add(primary)
        self._configured = {spec.name for spec in settings.models}
        self.owned: set[str] = set()  # the snapshot scopes this loop has decided on or restored
        # Missing telemetry (controllers.staleness): per configured (model, zone), bounded.
        self.watch = TelemetryWatch(settings, metrics)
        self.platform = PlatformTruth(settings)  # replica truth from the platform (executors/platform.py)
        self._platform_refused: dict[str, list[str]] = {}
        self.canary = CanaryDriver(settings)  # rollouts: observe(Rollout) before the window, SwapWrite after
        self.admission = AdmissionDriver(settings.window_s, metrics)  # periodic agent tasks
        self._admission_key = names.admission(settings.topic_prefix)
        self._last_drift: dict[tuple[str, str], dict[str, Any]] = {}  # the status rows' last drift per key
        # Cross-zone actions land together: apply_at_ms from the executors' measured leads (loop/cross_zone.py).
        cap = settings.apply_at_lead_cap_ms()
        self.apply_at = ApplyAtPlanner(
            ApplyAtParams(
                settings.apply_at_margin_ms, min(settings.apply_at_fallback_ms, cap), cap, 3000 * settings.heartbeat_s
            ),
            speed=settings.clock_speed,
        )

    @property
    def drivers(self) -> dict[str, Driver]:
        """The drivers by snapshot name, in the order :meth:`decide` runs them on a zone window."""
        d: dict[str, Driver] = {"kv": self.kv_policy, "breaker": self.breaker, "routing": self.routing}
        return {**d, "agents": self.agent_weights, "scaler": self.scaler}

    @property
    def window_drivers(self) -> dict[str, WindowDriver]:
        """Every driver, in the order :meth:`decide` runs them on a window."""
        d: dict[str, WindowDriver] = {"canary": self.canary, "admission": self.admission}
        return {**d, **self.drivers}

    @property
    def processor(self) -> TelemetryProcessor:
        """The telemetry processor of messages without a partition (all of them unless partitioned)."""
        return self.ingests.default

    # -- telemetry -----------------------------------------------------------------------
    def ingest(self, raw: Any, source: Mapping[str, Any], now_ms: int, *, close: bool = True) -> Ingested:
        """One telemetry message: its dead letters and the windows it closed.

        ``close`` closes the windows the message's event time completes (the
        worker); a caller that closes by its own clock right after (the fast
        simulator, every tick) passes False and calls :meth:`close_due`.
        """
        proc = self.ingests.of(source.get("partition"), source.get("offset"))
        res: ProcessResult = proc.process(raw, source, now_ms)
        return self._ingested(res, proc.close_due(None, now_ms) if close else [])

    def ingest_many(self, raws: Sequence[Any], sources: Sequence[Mapping[str, Any]], now_ms: int) -> Ingested:
        """Messages of one partition, in their order, taken together (the worker's ingest agent takes what
        the consumer has fetched): the dead letters and windows :meth:`ingest` of each in turn gives,
        the column work of their rows done together (:meth:`TelemetryProcessor.process_many`);
        ``max_ts_ms``: of them all, so each is acknowledged once every window the batch fed closed."""
        last = sources[-1]
        proc = self.ingests.of(last.get("partition"), last.get("offset"))
        return self._ingested(*proc.process_many(raws, sources, now_ms))

    def _ingested(self, res: ProcessResult, windows: list[dict[str, Any]]) -> Ingested:
        out = Ingested(res.valid, res.dead_letters, windows, res.max_ts_ms, res.capped)
        if self.metrics is not None:
            self.metrics.records.inc(res.valid + len(res.dead_letters) + res.capped)
            for encoding, n in res.encodings.items():
                self.metrics.telemetry_messages.labels(encoding).inc(n)
            for dl in res.dead_letters:
                self.metrics.observe_dead_letter(dl["reason"])
            for m in out.windows:
                self.metrics.observe_window(m)
        return out

    def committable(self, max_ts_ms: int | None, partition: int | None = None) -> bool:
        """Whether every window a message (of ``partition``) fed, its :attr:`Ingested.max_ts_ms`, has closed:
        the worker acknowledges a telemetry message (Faust commits its offset) only then, so a
        worker killed mid-window re-reads the records of its open windows instead of losing them;
        the windows it had already closed come again and the drivers drop them (their last basis).
        """
        proc = self.ingests.get(partition)  # None: its windows were dropped in a rebalance
        return max_ts_ms is None or (proc is not None and proc.closed_through(max_ts_ms))

    def close_due(self, now_ms: int, highwater: Callable[[int], int | None] | None = None) -> list[dict[str, Any]]:
        """The windows whose end plus lateness has passed at ``now_ms`` (``highwater``: PartitionedIngest.close_due)."""
        closed = self.ingests.close_due(now_ms, highwater)
        if self.metrics is not None:
            for m in closed:
                self.metrics.observe_window(m)
        return closed

    # -- metrics records -----------------------------------------------------------------
    def sign_window(self, m: Mapping[str, Any]) -> tuple[bytes, list[tuple[str, bytes]]]:
        """A window record's message value (JSON bytes) and its Kafka headers (the MAC, if keyed)."""
        value = orjson.dumps(m)
        if self.keyring is None:
            return value, []
        kid, sig = self.keyring.sign_bytes(value)
        return value, [(KID_HEADER, kid.encode()), (SIG_HEADER, sig.encode())]

    def _unauthenticated(self, raw: Any, headers: Mapping[str, Any] | None) -> str | None:
        """Why a metrics message's MAC does not hold, or None (it holds, or the loop has no keyring)."""
        if self.keyring is None:
            return None
        if not isinstance(raw, bytes | bytearray | memoryview):
            return "not raw bytes"
        hs = headers or {}
        kid, sig = (_header_str(hs.get(h)) for h in (KID_HEADER, SIG_HEADER))
        return self.keyring.verify_bytes(bytes(raw), kid, sig)

    def decode(
        self,
        raw: bytes | Mapping[str, Any],
        source: Mapping[str, Any],
        now_ms: int,
        headers: Mapping[str, Any] | None = None,
    ) -> tuple[WindowRecord | None, dict[str, Any] | None]:
        """A metrics message as a record, or ``(None, dead letter)`` saying why it is not one.

        With a keyring, ``headers`` (name -> bytes) must carry a valid MAC of
        ``raw`` (:meth:`sign_window`); otherwise the dead letter's reason is
        ``unauthenticated window record: <why>``.
        """
        why = self._unauthenticated(raw, headers)
        if why is not None:
            shown = (
                bytes(raw).decode("utf-8", "replace")[:4096] if isinstance(raw, bytes | bytearray | memoryview) else raw
            )
            return None, self._dead_letter(f"unauthenticated window record: {why}", source, shown, now_ms)
        obj: Any = raw
        if isinstance(raw, bytes | bytearray | memoryview | str):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                shown = raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")
                return None, self._dead_letter("bad metrics record: not JSON", source, shown[:4096], now_ms)
        try:
            return decode_window(obj), None
        except WindowRecordError as exc:
            return None, self._dead_letter(f"bad metrics record: {exc}", source, obj, now_ms)

    def _dead_letter(self, reason: str, source: Mapping[str, Any], record: Any, now_ms: int) -> dict[str, Any]:
        if self.metrics is not None:
            self.metrics.observe_dead_letter(reason)
        return dead_letter(reason, source, record, now_ms)

    def decide(self, w: WindowRecord, now_ms: int) -> Effects:
        """Every driver on one window record, in a fixed order; the effects for the shell.

        A zone window goes to the canary (its rollout as last observed) and admission
        (latencies) whatever it holds, then, past the telemetry checks, to the breaker
        (first: routing sees this window's breaker state), the router and the agent
        weights; a node window to the KV policy; every window to the scaler, whose events
        may add zone-aware route commands.  A zone window's status row comes last.
        """
        out, seen = Effects(), w
        if w.scope == "zone":
            self._canary(w, now_ms, out)
            self.admission.on_window(w)
            w = self.platform.apply(w)
        # Missing telemetry (TelemetryWatch): no request records, or a node cap that dropped over
        # 10 % of the records -> every driver holds; no GPU samples -> the replica counts are
        # unknown: the breaker and the agent weights (request data) act, the router and the scaler hold.
        hold = self.watch.held(w, out.events) if w.scope == "zone" else None
        if hold in ("no_requests", "node_cap"):
            self.export_targets(w.model, w.zone)  # held: the target stays exported, never drops
            out.status.append(self._status_row(seen, out.events, now_ms))
            return out
        if w.model in self._configured:
            self.owned.add(f"model:{w.model}")
        self.owned.update(f"family:{f}" for f in self._families_of.get(w.model, ()))
        if w.scope == "node":
            for rc in self.kv_policy.on_window(w, now_ms):
                out.add(rc, f"relocate {rc.payload['node']}")
        else:
            self._zone_drivers(w, now_ms, out, route=hold is None)
        if hold is None:
            self._scale(w, now_ms, out)
            self.retune.on_window(w)  # a window the scaler decided: what the retune's fit reads
        if w.scope == "zone":
            self.export_targets(w.model, w.zone)
            out.status.append(self._status_row(seen, out.events, now_ms))
        stamp_cross_zone(out, functools.partial(self.plan_apply_at, now_ms))
        if self.metrics is not None:
            self._export(out)
        return out

    def plan_apply_at(self, now_ms: int, zones: Collection[str]) -> dict[str, Any] | None:
        """The ``detail`` fields of an action for ``zones`` that must land together (None: one zone)."""
        plan = self.apply_at.plan(now_ms, zones, self.scaler.alive)
        return None if plan is None else plan.detail()

    def _canary(self, w: WindowRecord, now_ms: int, out: Effects) -> None:
        try:
            self.canary.on_window(w, now_ms)
        except (ValueError, KeyError, TypeError) as exc:  # a malformed rollout key: the operator's to fix
            log.error("canary step failed for %s: %s", w.model, exc)
        out.writes.extend(self.canary.drain_writes())

    def _status_row(self, w: WindowRecord, events: list[dict[str, Any]], now_ms: int) -> StatusRow:
        """What ``governor status`` shows of the window's (model, zone), after its decision."""
        key = (w.model, w.zone)
        for ev in events:
            if ev.get("kind") == "drift":
                self._last_drift[(ev["model"], ev["zone"])] = {
                    k: ev.get(k) for k in ("signal", "direction", "window_end_ms")
                }
        target, ff_mode = self.scaler.key_status(w.model, w.zone)
        stale, spec = self.watch.stale.get(key), self.settings.model(w.model)
        record = {
            **{f: getattr(w, f) for f in ("window_end_ms", "rate_rps", "violation_rate", "unfixable_rate")},
            **{f: getattr(w, f) for f in ("ttft_p95_ms", "replicas_ready", "replicas_starting")},
            "ttft_slo_ms": w.ttft_slo_ms or (spec.ttft_slo_ms if spec else None),
            "written_ms": now_ms,
            "target": target,
            "ff_mode": ff_mode,
            "drift": self._last_drift.get(key),
            "stale": bool(stale and stale.stale),
            "stale_reason": stale.reason if stale else "",
            "zone_status": self.scaler.zone_status(w.model).get(w.zone, ""),
        }
        return StatusRow(f"{w.model}|{w.zone}", record)

    # -- the port: what lives in Redis, and the clock ----------------------------------------
    def observe(self, event: InputEvent) -> Effects:
        """One input event (:mod:`loop.effects`): what the loop learns from outside, and its effects.

        ``AdmissionEntries`` runs the admission review, the one slow decision: the worker
        observes it in a worker thread (nothing else of the loop runs there).
        """
        out = Effects()
        if isinstance(event, Heartbeats):
            self.set_heartbeats(event.alive)
        elif isinstance(event, Allowances):
            self.set_allowances(event.raw)
        elif isinstance(event, PlatformReplicas):
            self._platform_replicas(event.zone, event.fields)
        elif isinstance(event, Rollout):
            self.canary.observe(event.model, event.raw)
        elif isinstance(event, AdmissionEntries):
            writes, out.events = self.admission.review(event.entries, event.now_ms, event.latencies)
            if writes:
                out.writes.append(HashWrite(self._admission_key, writes, reviewed=event.entries))
        elif isinstance(event, Tick):
            out.events = self.check_silence(event.now_ms)
        elif isinstance(event, ZoneClocks):
            self._zone_clocks(event)
        return out

    def _zone_clocks(self, event: ZoneClocks) -> None:
        before = self.apply_at.refused
        self.apply_at = self.apply_at.observe(event.beats, event.now_ms, event.clock)
        for zone, why in self.apply_at.refused.items():
            if before.get(zone) != why:  # said once per change
                log.warning("timing of %s not believed for apply_at_ms (%s): its fixed lead instead", zone, why)

    def _platform_replicas(self, zone: str, fields: Mapping[Any, Any]) -> None:
        refused = self.platform.set(zone, fields)
        if refused != self._platform_refused.get(zone):  # said once per change, not every second
            self._platform_refused[zone] = refused
            for why in refused:
                log.warning("platform replicas of %s refused: %s", zone, why)

    def _scale(self, w: WindowRecord, now_ms: int, out: Effects) -> None:
        for cmd in self.scaler.on_window(w, now_ms):
            out.add(cmd, f"{cmd.model} -> {cmd.target_replicas}")
        for ev in self.scaler.drain_events():
            out.events.append(ev)
            if ev["kind"] in ("zone_lost", "zone_returned") and ev["model"] not in self.routed_families:
                # Zone-aware routing: gateways stop sending to a lost zone and wait for a healed
                # one's capacity.  A fallback family's routes are the RoutingDriver's (a lost
                # zone has no windows there, so it gets no weight either).
                for rc in self.scaler.zone_route_commands(ev["model"], int(ev["window_end_ms"]), now_ms):
                    out.add(rc, f"route {rc.model} by zone")

    def export_targets(self, model: str | None = None, zone: str | None = None) -> None:
        """``governor_replicas_target`` (and the capacity it is sized with) of each configured key, every zone
        window, held or not; absent without a target (a restored key's until a fresh window), never 0
        (``infra/k8s/keda/``)."""
        if self.metrics is not None:
            for (m, z), target in self.scaler.targets(model, zone).items():
                self.metrics.target.labels(m, z).set(float(target))
                if (capacity := self.scaler.learned_capacity(m, z)) is not None:
                    self.metrics.capacity.labels(m, z).set(capacity)

    # -- missing telemetry -----------------------------------------------------------------
    def set_allowances(self, raw: Mapping[str, Any] | None) -> None:
        """Each zone's stored share of the fleet budget (None: no view, the last one kept); the scaler caps a
        zone's targets at it (:meth:`loop.scaler_driver.Scaler._budget_cap`); a malformed one is unknown."""
        if raw is not None:
            decoded = {z: Allowance.decode(v) for z, v in raw.items()}
            self.scaler.allowances = {z: a for z, a in decoded.items() if a is not None}

    def set_heartbeats(self, alive: Collection[str] | None) -> None:
        """The zones whose executor heartbeat is present (None: unknown); zone loss needs it gone."""
        self.scaler.alive = None if alive is None else frozenset(alive)

    def check_silence(self, now_ms: int) -> list[dict[str, Any]]:
        """Mark stale every (model, zone) whose windows stopped (:class:`TelemetryWatch`); its events."""
        return self.watch.check_silence(now_ms)

    def _zone_drivers(self, w: WindowRecord, now_ms: int, out: Effects, route: bool = True) -> None:
        for bc in self.breaker.on_window(w, now_ms):
            out.add(bc, f"breaker {bc.payload['target']} -> {bc.payload['state']}")
        transitions = self.breaker.drain_transitions()
        routes = []
        try:
            routes = self.routing.on_window(w, now_ms) if route else []
        except ValueError as exc:  # a window the router cannot use (ParameterError)
            log.error("routing step failed for %s/%s: %s", w.model, w.zone, exc)
        for rc in routes:
            out.add(rc, f"route {rc.model}")
        for ac in self.agent_weights.on_window(w, now_ms):
            out.add(ac, f"agents {ac.model}")
        if self.metrics is not None:
            for t in transitions:
                self.metrics.observe_breaker(t.model, t.zone, t.state, changed=True)
            if w.key in self.breaker.states:  # a target the breaker judges
                self.metrics.observe_breaker(w.model, w.zone, self.breaker.states[w.key].name, changed=False)

    def _export(self, out: Effects) -> None:
        assert self.metrics is not None
        for cmd in out.commands:
            if cmd.kind == "agents":
                self.metrics.observe_agent_weights(cmd.model, cmd.zone, cmd.payload["weights"])
        for ev in out.events:
            self.metrics.events.labels(ev["kind"], ev.get("signal", "")).inc()
            if ev["kind"] == "feedforward_mode":
                self.metrics.ff_mode.labels(ev["model"], ev["zone"]).set(1.0 if ev["on"] else 0.0)
        for (model, zone), est in self.scaler.sde_estimates().items():
            for name in ("theta", "mu", "sigma"):
                self.metrics.sde.labels(model, zone, name).set(getattr(est, name))

    # -- state ---------------------------------------------------------------------------
    def scopes(self) -> list[str]:
        """Every snapshot scope of the configuration: ``model:<name>`` per model, ``family:<primary>`` per family."""
        return [f"model:{spec.name}" for spec in self.settings.models] + [f"family:{f}" for f in self.routing.families]

    def snapshot_scopes(self) -> dict[str, dict[str, Any]]:
        """The state of every scope this loop owns, as plain data by driver name (see :mod:`streams.snapshots`)."""
        out: dict[str, dict[str, Any]] = {}
        for scope in sorted(self.owned):
            kind, _, name = scope.partition(":")
            if kind == "family":
                out[scope] = {"routing": self.routing.snapshot(only=name)}
            else:
                out[scope] = {part: d.snapshot(only=name) for part, d in self.drivers.items() if part != "routing"}
        return out

    def restore_scope(self, scope: str, parts: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, str]]:
        """Restore one scope's parts: (what each part restored, why each failing part did not load).

        A part that does not load leaves its driver's state for that scope fresh; the others load.
        """
        kind, _, name = scope.partition(":")
        allowed = {"routing"} if kind == "family" else set(self.drivers) - {"routing"}
        done: dict[str, int] = {}
        failed: dict[str, str] = {}
        for part, data in parts.items():
            if part not in allowed or not isinstance(data, Mapping):
                failed[part] = f"unexpected part {part[:40]!r} in scope {scope}"
                continue
            try:
                done[part] = self.drivers[part].restore(data)
            except SnapshotVersionError as exc:
                failed[part] = f"version: {exc}"
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                failed[part] = f"{type(exc).__name__}: {exc}"
        if done:
            self.owned.add(scope)
        if "scaler" in done and kind == "model":
            self.scaler.distrust_restored(name)  # a replayed snapshot shrinks nothing without fresh windows
            self.export_targets(name)  # a restored key's target is exported after its first fresh window
        return done, failed
