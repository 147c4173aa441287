"""Run the simulated fleet in (scaled) real time against the real servers.

The fleet is the event-driven model of :mod:`sim.fleet`; this driver

* submits the workload's arrivals as (scaled) time reaches them,
* ships finished-request and per-replica GPU records through the same
  :class:`~governor_telemetry.producer.TelemetryProducer` inference nodes use,
* reconciles the fleet with the desired replica counts the executors write
  to Redis (``<prefix>:fleet:<zone>:desired``), like a Deployment controller,
* acts as the gateway of the contract in :mod:`executors.backends`
  (:func:`sim.gateway.sync_routing_from_redis` every poll, its
  :class:`~sim.gateway.TrafficGate` per request): route weights from
  ``<prefix>:routing:<zone>`` (family = ``model``), the canary share
  ``_canary|<model>`` of the request's zone (to ``<model>@<version>`` when the
  fleet has it), and the breakers of ``<prefix>:breaker:<zone>`` -- an open
  target gets no requests (its weight is removed and the rest renormalised;
  without route weights the zone choice avoids it), a half-open one 5 % of its
  share and at most ``probe_budget`` requests per breaker version; the agent
  class weights ``_agents|<model>`` route requests that carry an
  ``agent_path`` (:meth:`sim.fleet.Fleet.set_agent_routes`; the trace replay
  carries none, ``bench/agents_live.py`` does);
  ``stats.routed`` counts the requests per ``"variant|zone"``,
* drains the KV relocation requests the executors push to the Redis list
  ``<prefix>:fleet:<zone>:relocate`` (JSON ``{"node", "model", "max_bytes",
  "expected_generation", "action", "command_id"}``) and applies them with
  :meth:`sim.fleet.Fleet.relocate` (``action == "move"``:
  :meth:`~sim.fleet.Fleet.move_sessions`); each outcome is pushed to
  ``<prefix>:fleet:<zone>:relocated`` (last ``RELOCATED_KEEP``) and logged,
  and the zone's executor relays it to the results topic
  (``executors/outcomes.py``).

Generation check (see :mod:`loop.kv_policy_driver`): a busy replica's allocator
generation changes with every allocation, so a request planned on a window
seconds old would nearly always be refused by an exact check.  The live fleet
uses the generation as a coarse *layout* generation: it refuses with
``'generation changed'`` only when the node's generation is now *lower*
than expected (its allocator was reset: the node was replaced/restarted) and
otherwise calls ``Fleet.relocate(..., expected_generation=None)``.

It keeps the ground truth (every finished request, replicas over time) for
the run's report.

Engine telemetry (``engines``): by default the fleet ships governor's native
request and GPU records.  With a sink it speaks an engine's language instead:
:class:`sim.engine_server.ScrapeEngines` keeps vLLM ``/metrics`` per replica for
``governor ingest scrape`` (nothing native is shipped),
:class:`sim.otlp_export.OtlpEngines` exports a span per request to
``governor ingest otlp`` (GPU records stay native: spans carry no GPU state).
A sink has ``finished(records)`` and ``gpu(snapshots)`` (each returns what is
still shipped natively) and ``await sync(t_s)`` (called every tick).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from core import names
from sim.gateway import TrafficGate, sync_routing_from_redis
from sim.workloads import Workload

log = logging.getLogger(__name__)


RELOCATED_KEEP = 1000


def apply_relocation(fleet: Any, zone: str, req: dict[str, Any], t: float) -> dict[str, Any]:
    """Apply one relocation request to the fleet under the coarse generation check."""
    model, node = str(req["model"]), str(req["node"])
    expected = req.get("expected_generation")
    now_gen = fleet.kv_generation(zone, model, node)
    base = {
        "zone": zone,
        "model": model,
        "node": node,
        "command_id": req.get("command_id"),
        "action": req.get("action"),
        "t_s": t,
    }
    if now_gen is None:
        return {**base, "refused": "unknown node or no kv allocator"}
    if isinstance(expected, int) and now_gen < expected:
        return {**base, "refused": "generation changed", "generation": now_gen, "expected_generation": expected}
    if req.get("action") == "move":
        return {**base, **fleet.move_sessions(zone, model, node, t)}
    out = fleet.relocate(zone, model, node, int(req["max_bytes"]), None, t)
    return {**base, **out}


_CORRUPTIONS = {
    "request": (
        ("ttft_ms", -5.0),  # negative latency
        ("zone", None),  # missing required field
        ("e2e_ms", "slow"),  # wrong type
        ("status", "exploded"),  # unknown status
    ),
    "gpu": (
        ("gpu_util", 7.5),  # outside [0, 1]
        ("zone", None),  # missing required field
        ("mem_used_bytes", "lots"),  # wrong type
        ("state", "melting"),  # unknown state
    ),
}


@dataclass
class LiveStats:
    submitted: int = 0
    records_sent: int = 0
    gpu_sent: int = 0
    corrupted_sent: int = 0
    finished: list[dict[str, Any]] = field(default_factory=list)
    replicas: list[tuple[float, str, str, int, int, int]] = field(default_factory=list)
    desired_changes: list[tuple[float, str, str, int]] = field(default_factory=list)
    relocations: list[dict[str, Any]] = field(default_factory=list)
    routed: dict[str, int] = field(default_factory=dict)  # "variant|zone" -> requests submitted there


class LiveFleet:
    def __init__(
        self,
        fleet: Any,
        workload: Workload,
        *,
        model: str,
        zones: Sequence[str],
        producer: Any,
        redis: Any,
        prefix: str,
        now_ms: Callable[[], int],
        t0_ms: int,
        gpu_interval_s: float = 1.0,
        bad_rate: float = 0.0,
        seed: int = 0,
        tick_wall_s: float = 0.05,
        desired_poll_wall_s: float = 0.2,
        engines: Any = None,
        platform: Any = None,
    ) -> None:
        self.fleet = fleet
        self.workload = workload
        self.model = model
        self.zones = list(zones)
        self.producer = producer
        self.redis = redis
        self.prefix = prefix
        self.now_ms = now_ms
        self.t0_ms = t0_ms
        self.gpu_interval_s = gpu_interval_s
        self.bad_rate = bad_rate
        self.rng = random.Random(seed)
        self.tick_wall_s = tick_wall_s
        self.desired_poll_wall_s = desired_poll_wall_s
        self.engines = engines
        # A workload controller's view (sim/k8s_platform.py): desired replicas from the API server's
        # workloads instead of the Redis desired hash, and the fleet's replicas written back as their status.
        self.platform = platform
        self.stats = LiveStats()
        self._next = 0
        self._routing_seen: dict[str, int] = {}
        self.gate = TrafficGate(np.random.default_rng([seed, 5]))  # breakers and canary shares
        self._zone_of = np.random.default_rng(seed).integers(0, len(self.zones), len(workload.arrival_s))

    @classmethod
    def on_stack(
        cls, fleet: Any, workload: Workload, settings: Any, producer: Any, redis: Any, clock: Any, t0_ms: int, **kw: Any
    ) -> LiveFleet:
        """A live fleet of ``settings``' first model and zones against a running stack (prefix, clock)."""
        return cls(
            fleet,
            workload,
            model=settings.models[0].name,
            zones=settings.zones,
            producer=producer,
            redis=redis,
            prefix=settings.topic_prefix,
            now_ms=clock.now_ms,
            t0_ms=t0_ms,
            **kw,
        )

    def t_s(self) -> float:
        return (self.now_ms() - self.t0_ms) / 1000.0

    async def _desired(self, zone: str) -> int | None:
        if self.platform is not None:
            value: int | None = await self.platform.desired(self.model, zone)
            return value
        raw = await self.redis.hget(names.desired_replicas(self.prefix, zone), self.model)
        return None if raw is None else int(raw)

    async def _sync_desired(self, t: float) -> None:
        for zone in self.zones:
            want = await self._desired(zone)
            if want is None:
                continue
            if want != self.fleet.desired(zone, self.model):
                self.fleet.set_desired(zone, self.model, want, t)
                self.stats.desired_changes.append((t, zone, self.model, want))
                log.info("fleet %s/%s desired -> %d at t=%.1f s", zone, self.model, want, t)
        if hasattr(self.fleet, "kv_generation") and hasattr(self.redis, "lpop"):
            await self._sync_relocations(t)
        if hasattr(self.fleet, "router") and hasattr(self.redis, "hgetall"):  # route commands: family = model
            await sync_routing_from_redis(
                self.fleet, self.redis, self.prefix, self.zones, self.model, t, self._routing_seen, self.gate
            )

    async def _sync_relocations(self, t: float) -> None:
        """Drain each zone's relocation list, apply, report the outcomes."""
        for zone in self.zones:
            raw = await self.redis.lpop(names.relocate_queue(self.prefix, zone), 100)
            for item in raw or []:
                try:
                    req = orjson.loads(item)
                    out = apply_relocation(self.fleet, zone, req, t)
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    out = {"zone": zone, "refused": f"bad relocation request: {exc}", "t_s": t}
                self.stats.relocations.append(out)
                log.info(
                    "fleet %s relocation %s: %s",
                    zone,
                    out.get("node"),
                    out.get("refused") or f"{out.get('bytes_moved', out.get('moved'))}",
                )
                key = names.relocated_outcomes(self.prefix, zone)
                await self.redis.rpush(key, orjson.dumps(out, default=str))
                await self.redis.ltrim(key, -RELOCATED_KEEP, -1)

    def _target(self, i: int) -> tuple[str, str]:
        """(variant, zone) of request ``i``, as a gateway picks it (see :class:`sim.gateway.TrafficGate`)."""
        router = getattr(self.fleet, "router", None)
        if router is not None and router.weights(self.model):  # route commands decide the target
            variant, zone = router.pick(self.model, "default")
        else:
            variant = self.model
            zone = self.gate.zone_for(self.model, self.zones[int(self._zone_of[i])], self.zones)
        return self.gate.variant_for(variant, zone), zone

    def _submit(self, i: int, t: float) -> None:
        w = self.workload
        variant, zone = self._target(i)
        self.fleet.submit(
            float(w.arrival_s[i]),
            zone,
            variant,
            int(w.prompt_tokens[i]),
            int(w.output_tokens[i]),
            f"req-{i}",
            hash_ids=w.hash_ids[i] if w.hash_ids is not None else None,
        )
        key = f"{variant}|{zone}"
        self.stats.routed[key] = self.stats.routed.get(key, 0) + 1
        if self.gate.sent(variant, zone) and self.gate.routes:  # a probe budget ran out
            self.gate.apply(self.fleet, t)

    def _corrupt(self, rec: dict[str, Any]) -> dict[str, Any]:
        name, value = self.rng.choice(_CORRUPTIONS[rec["kind"]])
        bad = dict(rec)
        if value is None:
            bad.pop(name, None)
        else:
            bad[name] = value
        return bad

    async def _ship(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            if self.bad_rate > 0 and self.rng.random() < self.bad_rate:
                rec = self._corrupt(rec)
                self.stats.corrupted_sent += 1
            await self.producer.send(rec)
        self.stats.records_sent += len(records)

    async def run(self, duration_s: float, on_tick: Callable[[float], Awaitable[None]] | None = None) -> LiveStats:
        w = self.workload
        next_gpu = 0.0
        last_poll = -1e9
        loop = asyncio.get_running_loop()
        while True:
            t = min(self.t_s(), duration_s)
            if loop.time() - last_poll >= self.desired_poll_wall_s:
                await self._sync_desired(t)
                last_poll = loop.time()
            while self._next < len(w.arrival_s) and w.arrival_s[self._next] <= t:
                self._submit(self._next, t)
                self._next += 1
                self.stats.submitted += 1
            done = self.fleet.advance_to(t)
            self.stats.finished.extend(done)
            await self._ship(done if self.engines is None else self.engines.finished(done))
            if t >= next_gpu:
                snaps = self.fleet.gpu_snapshot(t)
                native = snaps if self.engines is None else self.engines.gpu(snaps)
                await self._ship(native)
                self.stats.gpu_sent += len(native)
                for zone in self.zones:
                    c = self.fleet.replicas(zone, self.model)
                    if self.platform is not None:
                        await self.platform.report(self.model, zone, c.get("ready", 0), c.get("starting", 0))
                    self.stats.replicas.append(
                        (
                            t,
                            zone,
                            self.model,
                            c.get("ready", 0),
                            c.get("starting", 0),
                            self.fleet.desired(zone, self.model),
                        )
                    )
                next_gpu += self.gpu_interval_s
            if self.engines is not None:
                await self.engines.sync(t)
            if on_tick is not None:
                await on_tick(t)
            if t >= duration_s:
                break
            await asyncio.sleep(self.tick_wall_s)
        await self.producer.flush()
        return self.stats
