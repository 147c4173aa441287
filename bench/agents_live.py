"""``governor bench agents-live``: agent class routes through the real worker and executors, with and without.

The closed loop as the demo runs it (embedded broker and redis-server unless
``KAFKA_BOOTSTRAP`` / ``REDIS_URL`` are given, ``governor worker`` and one
``governor executor --backend sim`` per zone as child processes) serves two
identical simulated fleets at once, one model each, pinned at ``--replicas``
(``min_replicas = max_replicas``, so the scaler moves nothing):

* an agent orchestrator per fleet submits turns (:func:`bench.agents.agent_turn_calls`):
  each turn's path (``rag``, ``tool``, ``llm``: its agent class) is drawn from the
  weights of the ``_agents|<model>`` field the executor wrote (1:1:1 until the
  first), and each of its calls carries the conversation's signals and the path in
  its telemetry, so the worker's ``AgentWeightsDriver`` publishes the weights;
* the simulated gateway of the **routes** fleet routes each class to its share of
  the replicas (:meth:`sim.fleet.Fleet.set_agent_routes`, as the gateway backend's
  ``x-agent-class`` rules do); the **shared** fleet's gateway reads the same field
  and ignores it (least outstanding tokens over every replica: before this consumer).

The conversations are settled and their retrieval relevant (stability and RAG
score drawn from Beta(8, 2), tool confidence from Beta(2, 2)), so the weights
move from 1:1:1 towards RAG and plain LLM.  Printed per class: turns, the
on-time share (turn response within ``--deadline-ms``), mean and P95 response.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from governor_telemetry.producer import TelemetryProducer

from bench.agents import STATIC, Signals, agent_turn_calls
from core import names
from core.clock import ScaledClock
from core.settings import ModelSpec, Settings
from core.transport import redis_options
from core.vocab import AGENT_PATHS
from launch.embedded import EmbeddedServers
from launch.processes import EXECUTOR_READY, WORKER_READY, start_executor, start_worker
from launch.topics import ensure_topics
from sim.fleet import Fleet, FleetConfig
from sim.gateway import TrafficGate
from sim.live import LiveFleet
from sim.perf_model import PerfModel
from sim.workloads import Workload

__all__ = ["AgentLiveFleet", "add_parser", "run_agents_live"]

ZONE = "az-a"
BASE = "llama2-70b"
ARMS = {"routes": BASE, "shared": f"{BASE}-shared"}  # arm -> the model (and fleet) it runs


def add_parser(sub: Any) -> None:
    p = sub.add_parser("agents-live", help="agent class routes through the real worker and executors, with and without")
    p.add_argument("--duration-s", type=float, default=360.0, help="trace seconds of turns")
    p.add_argument("--speed", type=float, default=6.0, help="trace seconds per wall second")
    p.add_argument("--rate", type=float, default=3.0, help="agent turns per trace second, per fleet")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--conversations", type=int, default=200)
    p.add_argument("--deadline-ms", type=float, default=8_000.0, help="a turn is on time within this")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--out", default="runs/agents-live")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


class AgentLiveFleet(LiveFleet):
    """A :class:`~sim.live.LiveFleet` whose arrivals are agent turns (see the module docstring)."""

    def __init__(self, *a: Any, sigs: list[Signals], conv: list[int], agent_routes: bool, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.gate = TrafficGate(np.random.default_rng([kw.get("seed", 0), 5]), agent_routes=agent_routes)
        self.sigs, self.conv = sigs, conv
        self.draws = np.random.default_rng([kw.get("seed", 0), 12])  # the same draws in both arms
        self.turns: list[tuple[str, list[str], float]] = []  # (path, call ids, extra ms)

    def _submit(self, i: int, t: float) -> None:
        w = self.gate.agents.get((ZONE, self.model), STATIC)
        u = self.draws.random()
        path = "rag" if u < w["rag"] else ("tool" if u < w["rag"] + w["tool"] else "llm")
        sig = self.sigs[self.conv[i]]
        calls, extra = agent_turn_calls(path, sig, self.draws)
        fields = {
            "agent_stability": sig.stability,
            "agent_rag_score": sig.rag_score,
            "agent_tool_conf": sig.tool_conf,
            "agent_path": path,
        }
        ids = [f"t{i}c{j}" for j in range(len(calls))]
        for rid, (p, o) in zip(ids, calls, strict=True):
            arrival = float(self.workload.arrival_s[i])
            self.fleet.submit(arrival, ZONE, self.model, p, o, rid, request_class="agent", agent=fields)
        self.turns.append((path, ids, extra))


def _by_class(live: AgentLiveFleet, latency: dict[str, float], deadline_ms: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in AGENT_PATHS:
        resp = [sum(latency.get(i, float("inf")) for i in ids) + extra for p, ids, extra in live.turns if p == path]
        done = [x for x in resp if x != float("inf")]
        out[path] = {
            "turns": len(resp),
            "on_time": sum(x <= deadline_ms for x in resp) / len(resp) if resp else None,
            "mean_ms": float(np.mean(done)) if done else None,
            "p95_ms": float(np.percentile(done, 95)) if done else None,
        }
    return out


async def _run(settings: Settings, args: Namespace, run_dir: Path) -> dict[str, Any]:
    clock = ScaledClock(settings.clock_speed, settings.clock_origin_s)
    await ensure_topics(settings)
    redis = aioredis.Redis.from_url(str(settings.redis_url), **redis_options(settings))
    for model in ARMS.values():
        await redis.hset(names.desired_replicas(settings.topic_prefix, ZONE), model, args.replicas)
    worker = start_worker(settings, run_dir)
    executor = start_executor(settings, ZONE, run_dir)
    try:
        await asyncio.to_thread(worker.wait_for_log, WORKER_READY, 90)
        await asyncio.to_thread(executor.wait_for_log, EXECUTOR_READY, 30)
        rng = np.random.default_rng([args.seed, 11])
        sigs = [
            Signals(float(rng.beta(8, 2)), float(rng.beta(8, 2)), float(rng.beta(2, 2)))
            for _ in range(args.conversations)
        ]
        n = int(rng.poisson(args.rate * args.duration_s))
        arrivals = np.sort(rng.uniform(0, args.duration_s, n))
        conv = rng.integers(args.conversations, size=n).tolist()
        turns = Workload(arrivals, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), None, "agent-turns")
        t0_ms = clock.now_ms()
        lives: dict[str, AgentLiveFleet] = {}
        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="agents-live", clock_ms=clock.now_ms
        ) as producer:
            for arm, model in ARMS.items():
                fleet = Fleet(
                    FleetConfig(
                        models={model: PerfModel.from_splitwise(model=BASE)},
                        zones=(ZONE,),
                        initial_replicas=args.replicas,
                        seed=args.seed,
                    ),
                    epoch_ms0=t0_ms,
                )
                lives[arm] = AgentLiveFleet(
                    fleet,
                    turns,
                    model=model,
                    zones=(ZONE,),
                    producer=producer,
                    redis=redis,
                    prefix=settings.topic_prefix,
                    now_ms=clock.now_ms,
                    t0_ms=t0_ms,
                    seed=args.seed,
                    sigs=sigs,
                    conv=conv,
                    agent_routes=arm == "routes",
                )
            await asyncio.gather(*(live.run(args.duration_s) for live in lives.values()))
        res: dict[str, Any] = {}
        for arm, live in lives.items():
            done = live.stats.finished + live.fleet.advance_to(args.duration_s + 600.0)  # let the last turns end
            latency = {r["request_id"]: float(r["e2e_ms"]) for r in done}
            res[arm] = {
                "classes": _by_class(live, latency, args.deadline_ms),
                "weights": live.gate.agents.get((ZONE, live.model)),
                "applied": live.gate.agent_routes,
            }
        return res
    finally:
        worker.stop()
        executor.stop()
        await redis.aclose()


def run_agents_live(settings: Settings, args: Namespace) -> int:
    run_dir = Path(args.out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = settings.replace(
        models=tuple(ModelSpec(m, min_replicas=args.replicas, max_replicas=args.replicas) for m in ARMS.values()),
        zones=(ZONE,),
        clock_speed=args.speed,
        clock_origin_s=time.time(),
        data_dir=str(run_dir / "state"),
        lateness_s=max(settings.lateness_s, 0.8 * args.speed),
    )
    with EmbeddedServers(settings, os.environ, log_dir=run_dir / "servers") as servers:
        res = asyncio.run(_run(servers.settings, args, run_dir))
    (run_dir / "report.json").write_text(json.dumps(res, indent=2))
    if args.json:
        print(json.dumps(res))
        return 0
    print(
        f"agent turns through the worker and executor: {args.duration_s:g} s at {args.rate:g} turns/s, "
        f"{args.replicas} replicas per fleet, on time within {args.deadline_ms:g} ms"
    )
    for arm, r in res.items():
        w = r["weights"] or {}
        print(f"{arm} (gateway {'routes' if r['applied'] else 'ignores'} the classes; last weights {w})")
        for path, c in r["classes"].items():
            on = "-" if c["on_time"] is None else f"{c['on_time']:.1%}"
            mean = "-" if c["mean_ms"] is None else f"{c['mean_ms']:.0f}"
            p95 = "-" if c["p95_ms"] is None else f"{c['p95_ms']:.0f}"
            print(f"  {path:5} turns {c['turns']:5}  on time {on:>6}  mean {mean:>6} ms  P95 {p95:>6} ms")
    return 0
