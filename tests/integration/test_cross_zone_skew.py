"""A cross-zone action lands in every zone at once: ``apply_at_ms`` from the zones' measured leads.

Real redis-server, a real executor per zone, each behind its own :class:`DelayProxy` (az-a 3 ms each
way, az-b 60 ms) and with its clock off by a known amount (az-a +400 ms, az-b -250 ms; the worker's
+120 ms).  The executors probe RTT and offset against Redis ``TIME`` and publish their lead in their
heartbeats; the loop (:class:`loop.control_loop.ControlLoop`) reads them as the worker does
(:meth:`streams.agents.Worker.watch_liveness`: MGET of the heartbeats, one Redis ``TIME`` exchange)
and plans a reroute for both zones.  Each zone's backend call is timed on the host's clock (Redis's:
the shared reference).  With ``apply_at_ms`` the two zones act within the margin of each other and at
the planned time; without it they act the injected delay difference apart (about 8 of az-b's
extra round trips: the stream read and the executor's checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis

from controllers.hlc import Hlc
from core import names
from core.clock import ScaledClock
from core.settings import Settings
from executors.backends import SimFleetBackend
from executors.executor import ZoneExecutor
from loop.commands import Command
from loop.control_loop import ControlLoop
from loop.effects import ZoneClocks
from streams.agents import zone_beats
from tests.integration.harness import guard, signed, with_models
from tests.integration.zone_proxy import DelayProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "m"
#: zone -> (one-way delay of its path to Redis, ms; error of its executor's clock, ms).  The delays can be set
#: for the report (GOVERNOR_SKEW_ONE_WAY_MS=0.2,9.35: the design source's az-a<->az-b RTT of 18.7 ms).
_A, _B = (float(x) for x in os.environ.get("GOVERNOR_SKEW_ONE_WAY_MS", "3,60").split(","))
ZONES = {"az-a": (_A, 400.0), "az-b": (_B, -250.0)}
WORKER_OFFSET_MS = 120.0
MARGIN_MS = 50.0
#: Reroutes of each kind (GOVERNOR_SKEW_TRIALS=20 for the figures in the report: about 1.5 s a pair).
TRIALS = int(os.environ.get("GOVERNOR_SKEW_TRIALS", "3"))
#: The design source's §4.3 (seed-spec.md): az-a<->az-b, RTT 18.7 ms: sync sigma 4.2 ms, +23 % delay.
SEED_SIGMA_MS, SEED_DELAY_PCT = 4.2, 23.0


class TimedBackend(SimFleetBackend):
    """The sim backend, with the host's wall clock (ms) at each call, by command id."""

    def __init__(self, redis: aioredis.Redis, prefix: str, zone: str) -> None:
        super().__init__(redis, prefix, zone)
        self.called_ms: dict[str, float] = {}

    async def apply(self, cmd: Command) -> dict[str, Any]:
        self.called_ms[cmd.command_id] = time.time() * 1000.0
        return await super().apply(cmd)


def _route(zone: str, basis_ms: int, now_ms: int, detail: dict[str, Any]) -> Command:
    weights = {"*": {f"{MODEL}|az-a": 0.5, f"{MODEL}|az-b": 0.5}}
    return Command(
        kind="route", zone=zone, model=MODEL, reason="test reroute", issued_at_ms=now_ms,
        expires_at_ms=now_ms + 60_000, basis_ms=basis_ms, controller="zone_capacity",
        payload={"weights": weights}, detail=detail,
    )  # fmt: skip


def _scale(zone: str, basis_ms: int, now_ms: int) -> Command:
    return Command(
        kind="scale", zone=zone, model=MODEL, target_replicas=2, reason="warm-up", issued_at_ms=now_ms,
        expires_at_ms=now_ms + 60_000, basis_ms=basis_ms,
    )  # fmt: skip


class Rig:
    """The executors behind their proxies, the loop, and the bridge's XADD (the worker's own Redis link)."""

    def __init__(self, settings: Settings, direct: aioredis.Redis, executors: dict[str, ZoneExecutor]) -> None:
        self.settings, self.direct, self.executors = settings, direct, executors
        self.loop = ControlLoop(settings)
        self.clock = ScaledClock(offset_ms=WORKER_OFFSET_MS)
        self.hlc = Hlc()
        self.basis = 1_000

    async def observe_clocks(self) -> None:
        """What the worker reads every second: the heartbeats and one exchange against Redis TIME."""
        zones = self.settings.zones
        read = await self.direct.mget([names.executor_heartbeat(self.settings.topic_prefix, z) for z in zones])
        t0 = self.clock.wall_ms()
        secs, usecs = await self.direct.time()
        t3 = self.clock.wall_ms()
        event = ZoneClocks(zone_beats(zones, read), (t0, secs * 1000.0 + usecs / 1000.0, t3), self.clock.now_ms())
        self.loop.observe(event)

    async def bridge(self, cmds: list[Command]) -> None:
        """XADD as the bridge does: HLC-stamped, signed, with ``bridged_ms``."""
        for cmd in cmds:
            now = self.clock.now_ms()
            self.hlc = self.hlc.tick(now)
            entry = signed(self.settings, cmd.with_hlc(self.hlc.encode()))
            stream = names.command_stream(self.settings.topic_prefix, cmd.zone)
            await self.direct.xadd(stream, {"cmd": entry, "bridged_ms": str(now).encode()})

    async def applied(self, cmds: list[Command], timeout_s: float = 10.0) -> dict[str, float]:
        """Each zone's backend call time (host ms) for ``cmds``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            called = {c.zone: self.backend(c.zone).called_ms.get(c.command_id) for c in cmds}
            if all(v is not None for v in called.values()):
                return {z: float(v) for z, v in called.items() if v is not None}
            await asyncio.sleep(0.01)
        raise AssertionError(f"not applied in every zone within {timeout_s} s: {cmds}")

    def backend(self, zone: str) -> TimedBackend:
        backend = self.executors[zone].backend
        assert isinstance(backend, TimedBackend)
        return backend

    async def reroute(self, with_apply_at: bool) -> tuple[dict[str, float], dict[str, Any]]:
        """One reroute for both zones; the zones' call times (and ``"issued"``, host ms) and the plan's fields."""
        await self.observe_clocks()  # the worker reads them every second
        self.basis += 1
        issued, now = time.time() * 1000.0, self.clock.now_ms()
        detail = (self.loop.plan_apply_at(now, self.settings.zones) or {}) if with_apply_at else {}
        cmds = [_route(z, self.basis, now, detail) for z in self.settings.zones]
        await self.bridge(cmds)
        return {**await self.applied(cmds), "issued": issued}, detail


@contextlib.asynccontextmanager
async def rig(settings: Settings) -> Any:
    url = urlsplit(str(settings.redis_url))
    db = int(url.path.strip("/") or 0)
    settings = with_models(settings.replace(zones=tuple(ZONES), apply_at_margin_ms=MARGIN_MS), MODEL)
    direct = aioredis.Redis.from_url(str(settings.redis_url))
    async with contextlib.AsyncExitStack() as stack:
        executors, clients = {}, []
        for zone, (delay_ms, offset_ms) in ZONES.items():
            proxy = await stack.enter_async_context(DelayProxy(url.hostname or "127.0.0.1", url.port or 6379, delay_ms))
            r = aioredis.Redis.from_url(proxy.url(db))
            clients.append(r)
            executors[zone] = ZoneExecutor(
                zone=zone, prefix=settings.topic_prefix, redis=r,
                backend=TimedBackend(r, settings.topic_prefix, zone), guard=guard(settings, MODEL),
                clock=ScaledClock(offset_ms=offset_ms), results=None, results_topic="x",
                probe_interval_s=0.1, heartbeat_s=0.2,
            )  # fmt: skip
        tasks = [asyncio.create_task(ex.run()) for ex in executors.values()]
        try:
            yield Rig(settings, direct, executors)
        finally:
            for ex in executors.values():
                ex.stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            for r in (*clients, direct):
                await r.aclose()


async def _warm_up(r: Rig, hold: bool = True) -> None:
    """A single-zone command per zone (twice), then one held reroute: the executors measure their lead from
    real deliveries and releases, as a running fleet has."""
    await asyncio.sleep(1.0)  # probes every 0.1 s: RTT and offsets settle
    for _ in range(2):
        r.basis += 1
        now = r.clock.now_ms()
        cmds = [_scale(z, r.basis, now) for z in r.settings.zones]
        await r.bridge(cmds)
        await r.applied(cmds)
    await asyncio.sleep(0.5)  # a heartbeat (every 0.2 s) carries the measured lead
    for _ in range(5):
        await r.observe_clocks()
        await asyncio.sleep(0.05)
    if hold:  # one hold: the executors measure their release's checks and wake-up
        await r.reroute(with_apply_at=True)
        await asyncio.sleep(0.5)
        await r.observe_clocks()


async def test_a_reroute_lands_in_both_zones_within_the_margin_and_without_apply_at_it_does_not(
    settings: Settings,
) -> None:
    async with rig(settings) as r:
        await _warm_up(r)
        for zone, (_delay, offset) in ZONES.items():  # each executor measured its injected clock error
            assert r.executors[zone].timing.offset_ms() == pytest.approx(-offset, abs=10.0), zone
        assert r.loop.apply_at.clock.offset_ms() == pytest.approx(-WORKER_OFFSET_MS, abs=10.0)
        runs: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
        bounds = []  # the skew each plan's offsets allow
        for _ in range(TRIALS):
            called, detail = await r.reroute(with_apply_at=True)
            assert detail["apply_basis"] == "measured", detail
            # Both zones acted at the planned time (apply_at_ms is on Redis's clock: the host's here).
            for zone in ZONES:
                at = called[zone]
                assert detail["apply_at_ms"] - 5 <= at <= detail["apply_at_ms"] + 2 * MARGIN_MS, (zone, at, detail)
            runs["with"].append(called)
            bounds.append(detail["apply_skew_bound_ms"])
            called, detail = await r.reroute(with_apply_at=False)
            assert detail == {}
            runs["without"].append(called)
        print(_report(runs))
        skews = {k: [abs(c["az-b"] - c["az-a"]) for c in v] for k, v in runs.items()}
        # Within the measured skew: the offsets' error bounds (half the round trip of the best probe, about
        # 64 ms here), or the margin when that is smaller; on this host the median is a few ms.
        for skew, bound in zip(skews["with"], bounds, strict=True):
            assert skew <= max(bound, MARGIN_MS), (skews, bounds)
        # Without: az-b's extra round trips before its backend call (the stream read, the executor's five
        # reads and the pause read: about 20 times the one-way difference; 10 asserted).
        assert min(skews["without"]) >= 10 * (_B - _A), skews


def _report(runs: dict[str, list[dict[str, float]]]) -> str:
    """The skew (az-b minus az-a, ms) and the delay to the later zone's act, with and without, beside the source."""
    lines = [
        f"cross-zone reroute, {TRIALS} each: az-a {_A:g} ms / az-b {_B:g} ms one way to Redis, clocks +400 / -250 ms "
        f"(worker +{WORKER_OFFSET_MS:g})",
        "            mean |skew|   sigma   max |skew|   delay to last act",
    ]
    delays = {}
    for name, calls in runs.items():
        d = [c["az-b"] - c["az-a"] for c in calls]
        delays[name] = statistics.mean(max(c["az-a"], c["az-b"]) - c["issued"] for c in calls)
        sigma = statistics.pstdev(d) if len(d) > 1 else 0.0
        mean_abs, worst = statistics.mean(abs(x) for x in d), max(abs(x) for x in d)
        lines.append(f"  {name:<8} {mean_abs:10.1f} {sigma:9.1f} {worst:10.1f} {delays[name]:14.1f}")
    pct = 100.0 * (delays["with"] / delays["without"] - 1.0)
    lines.append(f"  delay increase {pct:+.0f} %; design source §4.3 (RTT 18.7 ms): sigma {SEED_SIGMA_MS} ms, "
                 f"+{SEED_DELAY_PCT:g} %")  # fmt: skip
    return "\n".join(lines)


async def test_one_zone_actions_are_not_put_off(settings: Settings) -> None:
    async with rig(settings) as r:
        await _warm_up(r, hold=False)
        now = r.clock.now_ms()
        assert r.loop.plan_apply_at(now, ["az-b"]) is None
        # A route for az-b alone: applied on arrival, well before any cross-zone lead.
        lead = r.loop.plan_apply_at(now, r.settings.zones)
        assert lead is not None and lead["apply_lead_ms"] > 10 * _B
        r.basis += 1
        cmd = _route("az-b", r.basis, now, {})
        sent = time.time() * 1000.0
        await r.bridge([cmd])
        called = await r.applied([cmd])
        assert called["az-b"] - sent < lead["apply_lead_ms"], (called, lead)
