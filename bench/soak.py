"""``governor bench soak``: the closed loop for many minutes with faults on a schedule.

A benchmark, not a CI test.  It runs the demo's closed loop (embedded servers
unless ``KAFKA_BOOTSTRAP`` / ``REDIS_URL`` are given, the worker and one
executor per zone as child processes, the simulated fleet replaying a real
trace) for ``--minutes`` wall minutes, and every ``--fault-every-s`` wall
seconds injects the next fault of a fixed cycle:

``kill_executor``     SIGKILL one zone's executor, restart it 2 s later
``kill_worker``       SIGKILL the stream worker, restart it at once
``pause_redis``       SIGSTOP the embedded redis-server for 3 s (skipped on an external one)
``hostile_telemetry`` raw messages on the telemetry topic: not JSON, a record 10 years
                      ahead, unknown zones and models, deep nesting, a 2 MB string
``forged_command``    an unsigned and a wrongly signed scale command straight into a zone's stream

and samples every process's RSS every 10 s.  The report (``report.json`` and
stdout) has RSS over time (first, last, max per process), the command ledger
(:mod:`bench.ledger`: issued, outcomes, lost, applied twice, regressions,
refusals without a reason), forged commands applied (must be 0), dead letters by
reason, and records lost: finished requests the fleet reported minus the
requests counted in the distinct zone windows that closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from argparse import Namespace
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from governor_telemetry.producer import TelemetryProducer

from bench.ledger import read_ledger
from core import names
from core.clock import ScaledClock
from core.defaults import WINDOW_S
from core.settings import Settings
from core.transport import kafka_options, redis_options
from launch.embedded import EmbeddedServers
from launch.processes import EXECUTOR_READY, WORKER_READY, ChildProcess, start_executor, start_worker
from launch.topics import Collector, ensure_topics
from sim.fleet import Fleet, FleetConfig
from sim.live import LiveFleet
from sim.perf_model import PerfModel
from sim.traces import load_trace
from sim.workloads import step_load

FAULTS = ("kill_executor", "kill_worker", "pause_redis", "hostile_telemetry", "forged_command")
RSS_EVERY_S = 10.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("soak", help="the closed loop for many minutes with faults on a schedule")
    p.add_argument("--minutes", type=float, default=30.0, help="wall minutes of load")
    p.add_argument("--fault-every-s", type=float, default=60.0, help="wall seconds between faults")
    p.add_argument("--speed", type=float, default=2.0, help="trace seconds per wall second")
    p.add_argument("--trace", default="azure-conv")
    p.add_argument("--qps", type=float, default=8.0)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--out", default="runs/soak")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class Soak:
    """The processes, the fault cycle and the measurements of one soak run."""

    def __init__(self, settings: Settings, servers: EmbeddedServers | None, run_dir: Path) -> None:
        self.settings = settings
        self.servers = servers
        self.run_dir = run_dir
        self.worker = start_worker(settings, run_dir)
        self.executors = {z: start_executor(settings, z, run_dir) for z in settings.zones}
        self.rss: list[tuple[float, str, float]] = []
        self.faults: list[dict[str, Any]] = []
        self.forged_ids: list[str] = []
        self.restarts: Counter[str] = Counter()
        self._next_fault = 0

    def children(self) -> dict[str, ChildProcess]:
        return {"worker": self.worker, **{f"executor-{z}": c for z, c in self.executors.items()}}

    def sample_rss(self, t_wall: float) -> None:
        for name, child in self.children().items():
            mb = _rss_mb(child.proc.pid) if child.alive() else None
            if mb is not None:
                self.rss.append((round(t_wall, 1), name, round(mb, 1)))

    async def fault(self, t_wall: float, redis: aioredis.Redis) -> None:
        kind = FAULTS[self._next_fault % len(FAULTS)]
        zone = self.settings.zones[(self._next_fault // len(FAULTS)) % len(self.settings.zones)]
        self._next_fault += 1
        what = await getattr(self, f"_{kind}")(zone, redis)
        self.faults.append({"t_wall_s": round(t_wall, 1), "fault": kind, "zone": zone, "what": what})
        print(f"[soak] t={t_wall:.0f} s {kind} ({zone}): {what}", file=sys.stderr)

    async def _kill_executor(self, zone: str, redis: aioredis.Redis) -> str:
        old = self.executors[zone]
        old.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(old.proc.wait)
        old.stop()
        await asyncio.sleep(2.0)
        self.executors[zone] = start_executor(self.settings, zone, self.run_dir)
        self.restarts[f"executor-{zone}"] += 1
        return f"SIGKILL pid {old.proc.pid}, restarted"

    async def _kill_worker(self, zone: str, redis: aioredis.Redis) -> str:
        old = self.worker
        old.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(old.proc.wait)
        old.stop()
        self.worker = start_worker(self.settings, self.run_dir)
        self.restarts["worker"] += 1
        return f"SIGKILL pid {old.proc.pid}, restarted"

    async def _pause_redis(self, zone: str, redis: aioredis.Redis) -> str:
        proc = self.servers.process("redis") if self.servers is not None else None
        if proc is None:
            return "skipped (external Redis)"
        proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(3.0)
        finally:
            proc.send_signal(signal.SIGCONT)
        return f"SIGSTOP 3 s pid {proc.pid}"

    async def _hostile_telemetry(self, zone: str, redis: aioredis.Redis) -> str:
        s = self.settings
        now = int(time.time() * 1000)
        req = {  # a valid record but for the one field each hostile message breaks
            "kind": "request",
            "request_id": "x",
            "model": s.models[0].name,
            "zone": zone,
            "node": f"{zone}/soak",
            "ttft_ms": 1.0,
            "itl_ms": 1.0,
            "e2e_ms": 2.0,
            "prompt_tokens": 1,
            "output_tokens": 1,
            "status": "ok",
        }
        deep = b"[" * 900 + b"0" + b"]" * 900  # orjson reads 1024 levels, writes 254: built by hand
        values = [
            b"{not json",
            orjson.dumps(
                {"schema_version": 1, "kind": "batch", "records": [{**req, "ts_ms": now + 10 * 365 * 86_400_000}]}
            ),
            orjson.dumps({"schema_version": 1, "kind": "batch", "records": [{**req, "ts_ms": now, "zone": "zz-9"}]}),
            orjson.dumps({"schema_version": 1, "kind": "batch", "records": [{**req, "ts_ms": now, "model": "nope"}]}),
            b'{"schema_version": 1, "kind": "batch", "records": [' + deep + b"]}",
            orjson.dumps(
                {"schema_version": 1, "kind": "batch", "records": [{**req, "ts_ms": now, "x": "a" * 2_000_000}]}
            ),
        ]
        producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap, max_request_size=8 << 20, **kafka_options(s))
        await producer.start()
        try:
            for v in values:
                await producer.send_and_wait(s.topic("telemetry"), v, key=f"{s.models[0].name}|{zone}".encode())
        finally:
            await producer.stop()
        return f"{len(values)} hostile messages"

    async def _forged_command(self, zone: str, redis: aioredis.Redis) -> str:
        now = int(time.time() * 1000)
        base = {
            "schema_version": 2,
            "kind": "scale",
            "zone": zone,
            "model": self.settings.models[0].name,
            "target_replicas": 1,
            "reason": "forged",
            "issued_at_ms": now,
            "expires_at_ms": now + 30_000,
            "basis_ms": now,
        }
        for k, extra in enumerate(({}, {"key_id": "k1", "signature": "00" * 32})):
            cid = f"forged-{now}-{k}"
            self.forged_ids.append(cid)
            cmd = orjson.dumps({**base, **extra, "command_id": cid})
            await redis.xadd(names.command_stream(self.settings.topic_prefix, zone), {"cmd": cmd})
        return "2 forged scale commands (unsigned, bad signature)"

    def stop(self) -> None:
        for child in self.children().values():
            child.stop()


def _rss_summary(rss: list[tuple[float, str, float]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for _, name, mb in rss:
        d = out.setdefault(name, {"first_mb": mb, "max_mb": mb, "last_mb": mb, "samples": 0})
        d["max_mb"], d["last_mb"], d["samples"] = max(d["max_mb"], mb), mb, d["samples"] + 1
    return out


def _records_lost(finished: list[dict[str, Any]], windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Finished requests vs the requests counted in the distinct zone windows that closed."""
    counts: dict[tuple[str, str, int], int] = {}
    for w in windows:
        if w.get("scope") == "zone":
            key = (w["model"], w["zone"], int(w["window_end_ms"]))
            counts[key] = max(counts.get(key, 0), int(w.get("count", 0)))
    if not counts:
        return {"finished": len(finished), "counted": 0, "lost": None}
    last_end = max(k[2] for k in counts)
    first_start = min(k[2] for k in counts) - int(windows[0].get("window_s", WINDOW_S) * 1000)
    inside = [r for r in finished if first_start < int(r["ts_ms"]) <= last_end]
    counted = sum(counts.values())
    return {"finished": len(inside), "counted": counted, "lost": len(inside) - counted}


async def _run(settings: Settings, servers: EmbeddedServers | None, args: Namespace, run_dir: Path) -> dict[str, Any]:
    clock = ScaledClock(settings.clock_speed, settings.clock_origin_s)
    model = settings.models[0].name
    await ensure_topics(settings)
    redis = aioredis.Redis.from_url(str(settings.redis_url), **redis_options(settings))
    for zone in settings.zones:
        await redis.hset(names.desired_replicas(settings.topic_prefix, zone), model, args.replicas)
    soak = Soak(settings, servers, run_dir)
    collector = Collector(settings)
    try:
        await asyncio.to_thread(soak.worker.wait_for_log, WORKER_READY, 90)
        for c in soak.executors.values():
            await asyncio.to_thread(c.wait_for_log, EXECUTOR_READY, 30)
        await collector.start()
        duration_s = args.minutes * 60.0 * args.speed
        t0_ms = clock.now_ms()
        fleet = Fleet(
            FleetConfig(
                models={model: PerfModel.from_splitwise(model=model)},
                zones=tuple(settings.zones),
                seed=args.seed,
                initial_replicas=args.replicas,
            ),
            epoch_ms0=t0_ms,
        )
        workload = step_load(load_trace(args.trace), args.qps, duration_s, 0.0, 1.0)
        wall0 = time.monotonic()
        next_fault, next_rss = args.fault_every_s, 0.0

        async def tick(t: float) -> None:
            nonlocal next_fault, next_rss
            t_wall = time.monotonic() - wall0
            if t_wall >= next_rss:
                soak.sample_rss(t_wall)
                next_rss = t_wall + RSS_EVERY_S
            if t_wall >= next_fault:
                next_fault = t_wall + args.fault_every_s
                await soak.fault(t_wall, redis)

        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="soak-fleet", clock_ms=clock.now_ms
        ) as producer:
            live = LiveFleet.on_stack(fleet, workload, settings, producer, redis, clock, t0_ms, seed=args.seed)
            stats = await live.run(duration_s, on_tick=tick)
        await asyncio.sleep(clock.to_wall_s((settings.window_s + settings.lateness_s) * 1000) + 5.0)
        soak.sample_rss(time.monotonic() - wall0)
        ledger = await read_ledger(
            settings.kafka_bootstrap, settings.topic("commands"), settings.topic("results"), **kafka_options(settings)
        )
        forged = {cid for cid in soak.forged_ids}
        forged_applied = [
            r for r in collector.results if r.get("command_id") in forged and r.get("outcome") == "applied"
        ]
        return {
            "minutes": args.minutes,
            "speed": args.speed,
            "qps": args.qps,
            "wall_s": round(time.monotonic() - wall0, 1),
            "faults": soak.faults,
            "restarts": dict(soak.restarts),
            "rss": _rss_summary(soak.rss),
            "rss_samples": soak.rss,
            "ledger": ledger.report(),
            "forged_commands": len(forged),
            "forged_applied": len(forged_applied),
            "dead_letters": dict(Counter(str(d.get("kind") or d.get("reason", "?")) for d in collector.dead_letters)),
            "records": {"telemetry_sent": stats.records_sent, **_records_lost(stats.finished, collector.windows)},
        }
    finally:
        await collector.stop()
        soak.stop()
        await redis.aclose()


def run_soak(settings: Settings, args: Namespace) -> int:
    run_dir = Path(args.out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = settings.replace(
        clock_speed=args.speed,
        clock_origin_s=time.time(),
        data_dir=str(run_dir / "state"),
        lateness_s=max(settings.lateness_s, 0.8 * args.speed),
    )
    with EmbeddedServers(settings, os.environ, log_dir=run_dir / "servers") as servers:
        embedded = servers if servers.started else None
        report = asyncio.run(_run(servers.settings, embedded, args, run_dir))
    (run_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "rss_samples"}, default=str))
    else:
        led = report["ledger"]
        print(f"soak {report['minutes']} min, {len(report['faults'])} faults, restarts {report['restarts']}")
        for name, r in report["rss"].items():
            print(
                f"  rss {name:16s} first {r['first_mb']:.0f} MB  max {r['max_mb']:.0f} MB  last {r['last_mb']:.0f} MB"
            )
        print(f"  commands issued {led['issued']}, outcomes {led['outcomes']}")
        print(
            f"  lost {len(led['lost'])}, applied twice {len(led['applied_twice'])}, regressions {len(led['regressions'])}"
        )
        print(f"  forged commands {report['forged_commands']}, applied {report['forged_applied']}")
        print(f"  records {report['records']}; dead letters {report['dead_letters']}")
        print(f"report: {run_dir / 'report.json'}")
    ok = report["ledger"]["ok"] and report["forged_applied"] == 0
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    return 0 if ok else 1
