"""The shared harness of the traffic benchmarks (``governor bench traffic``).

A fixed fleet (:mod:`sim.fleet`) replays one seeded workload in ticks of
``TICK_S``; requests reach it through a gateway in memory
(:class:`sim.gateway.CommandGateway`: route weights, breakers, canary shares,
as an executor writes them and a gateway reads them).  A *policy* sees every
tick's finished requests.  The controlled arms run the product: the stream
worker's :class:`~loop.control_loop.ControlLoop` (:class:`LoopPolicy`) gets
the fleet's request records and GPU samples, makes the windows, decides with
its drivers (routing, breaker, agent weights; the canary's steps are the
canary driver's, :meth:`loop.canary_driver.CanaryDriver.step`), and its commands
go to the gateway.  Scale commands are not applied: the replicas are fixed,
so the arms of one scenario differ only in their traffic policy and their
GPU-seconds are equal.
On-time delivery: a request meets its class's SLO (TTFT, and e2e where the
class has one) and did not fail; classes as in
:data:`controllers.routing_model.DEFAULT_CLASSES`.

The scenarios are :mod:`bench.traffic` (routing, breaker),
:mod:`bench.canary` and :mod:`bench.agents`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from controllers.routing_model import DEFAULT_CLASSES
from core.settings import Settings
from loop.canary_driver import CanaryDriver
from loop.commands import Command
from loop.control_loop import ControlLoop
from sim.fastloop import EPOCH_MS0
from sim.fleet import Fleet, FleetConfig
from sim.gateway import CommandGateway
from sim.perf_model import PerfModel

PRIMARY, FALLBACK = "bloom-176b", "llama2-70b"
FAMILY = PRIMARY  # the worker names a routed family by its primary (route commands' model)
CLASSES = {c.name: c for c in DEFAULT_CLASSES}
TICK_S = 1.0  # the fleet advances, and the loop ingests and closes windows, once a tick
CLASS_MIX = {"trading": 0.3, "voice": 0.4, "batch": 0.3}
# (prompt median, output median) tokens per class; lognormal, sigma 0.5
CLASS_TOKENS = {"trading": (400, 16), "voice": (600, 48), "batch": (1500, 200)}
ZONES = ("az-a", "az-b")

Policy = Callable[[CommandGateway, float, list[dict[str, Any]]], None]  # (gateway, t_s, finished this tick)


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def on_time(rec: dict[str, Any]) -> bool:
    """The request met its class's SLO and did not fail."""
    if rec.get("status", "ok") != "ok":
        return False
    c = CLASSES.get(rec["request_class"])
    if c is None:
        return True
    return rec["ttft_ms"] <= c.ttft_slo_ms and (c.e2e_slo_ms is None or rec["e2e_ms"] <= c.e2e_slo_ms)


def workload(
    rate_rps: float, duration_s: float, seed: int, mix: dict[str, float] | None = None
) -> list[tuple[float, str, int, int]]:
    """Poisson arrivals ``(t_s, class, prompt, output)``, seeded."""
    rng = np.random.default_rng([seed, 7])
    mix = mix or CLASS_MIX
    n = int(rng.poisson(rate_rps * duration_s))
    ts = np.sort(rng.uniform(0.0, duration_s, n))
    names = list(mix)
    cls = rng.choice(len(names), size=n, p=np.array([mix[k] for k in names]) / sum(mix.values()))
    out = []
    for t, c in zip(ts.tolist(), cls.tolist(), strict=True):
        name = names[c]
        pm, om = CLASS_TOKENS[name]
        p = max(16, int(rng.lognormal(math.log(pm), 0.5)))
        o = max(1, int(rng.lognormal(math.log(om), 0.5)))
        out.append((t, name, p, o))
    return out


def capacity_rps(perf: PerfModel, replicas: int, prompt: float = 800, output: float = 80, batch: int = 32) -> float:
    """Rough sustainable rate of ``replicas``: batched decode tokens/s over the mean output."""
    per_req_s = (float(perf.prefill_ms(prompt)) + output * perf.decode_step_ms(batch) / batch) / 1000
    return replicas / per_req_s


def run_arm(
    cfg: FleetConfig,
    arrivals: list[tuple[float, str, int, int]],
    duration_s: float,
    setup: Callable[[Fleet], None],
    routes: dict[str, float],
    policy: Policy,
    drain_s: float = 300.0,
    family: str = FAMILY,
) -> tuple[list[dict[str, Any]], CommandGateway]:
    """Replay ``arrivals`` through the gateway tick by tick, ``policy`` after each; return all records.

    ``routes``: the gateway's weights of ``family`` before any command (its static configuration).
    """
    fleet = Fleet(cfg, epoch_ms0=EPOCH_MS0)
    setup(fleet)
    gw = CommandGateway(fleet, np.random.default_rng([cfg.seed, 5]))
    gw.gate.routes[(family, None)] = dict(routes)
    gw.gate.apply(fleet, 0.0)
    recs: list[dict[str, Any]] = []
    i, k, t = 0, 0, 0.0
    while t < duration_s:
        k += 1
        t = min(k * TICK_S, duration_s)
        while i < len(arrivals) and arrivals[i][0] < t:
            ta, c, p, o = arrivals[i]
            gw.submit(ta, family, c, p, o, f"q{i}")
            i += 1
        done = fleet.advance_to(t)
        recs += done
        policy(gw, t, done)
    recs += fleet.advance_to(duration_s + drain_s)
    return recs, gw


def summarize(recs: list[dict[str, Any]], gpu_seconds: float, submitted: int) -> dict[str, Any]:
    """Percentiles, on-time delivery overall and per class, errors, GPU-seconds."""
    ttft = [r["ttft_ms"] for r in recs]
    e2e = [r["e2e_ms"] for r in recs]
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by[r["request_class"]].append(r)
    ok = sum(on_time(r) for r in recs)
    out = {
        "requests": submitted,
        "completed": len(recs),
        "ttft_p50_ms": _pct(ttft, 50),
        "ttft_p95_ms": _pct(ttft, 95),
        "ttft_p99_ms": _pct(ttft, 99),
        "e2e_p50_ms": _pct(e2e, 50),
        "e2e_p95_ms": _pct(e2e, 95),
        "e2e_p99_ms": _pct(e2e, 99),
        "on_time": ok / submitted if submitted else 0.0,
        "error_rate": sum(r.get("status") == "error" for r in recs) / max(1, len(recs)),
        "gpu_seconds": gpu_seconds,
        "per_class": {},
    }
    for c, rs in sorted(by.items()):
        out["per_class"][c] = {
            "n": len(rs),
            "on_time": sum(on_time(r) for r in rs) / len(rs),
            "ttft_p95_ms": _pct([r["ttft_ms"] for r in rs], 95),
        }
    return out


def _gpu_seconds(cfg: FleetConfig, replicas: dict[str, int], horizon_s: float) -> float:
    return sum(n * cfg.models[m].tensor_parallel * len(cfg.zones) * horizon_s for m, n in replicas.items())


def _fleet(models: dict[str, str], replicas: dict[str, int], seed: int) -> FleetConfig:
    perf = {name: PerfModel.from_splitwise(model=base) for name, base in models.items()}
    return FleetConfig(models=perf, zones=ZONES, initial_replicas=0, seed=seed, startup_s=0.0)


def _setup_replicas(replicas: dict[str, int]) -> Callable[[Fleet], None]:
    def setup(f: Fleet) -> None:
        for z in f.config.zones:
            for m, n in replicas.items():
                f.set_desired(z, m, n, 0.0)

    return setup


def static_policy(gw: CommandGateway, t: float, win: list[dict[str, Any]]) -> None:
    """The gateway's static weights, never changed."""


class LoopPolicy:
    """The product as the policy: the fleet's telemetry -> :class:`ControlLoop` -> commands -> the gateway.

    Every tick the finished requests and a GPU sample of every replica go
    through :meth:`ControlLoop.ingest` as one batch (the worker's pipeline),
    the windows whose lateness has passed close (:meth:`ControlLoop.close_due`,
    the worker's timer), and each zone window is decoded and decided on
    (:meth:`ControlLoop.decide`).  With a canary ``rollout`` (the JSON that
    ``governor canary start`` stores), the canary driver's steps
    (:meth:`CanaryDriver.step`) run on each window first, as the worker's control
    agent awaits the canary driver before :meth:`ControlLoop.decide`.  The
    route, breaker, canary and agents commands reach the gateway at once
    (:meth:`CommandGateway.apply`); scale commands are counted, not applied
    (the replicas are fixed).
    """

    def __init__(self, settings: Settings, rollout: dict[str, Any] | None = None, rollout_at_s: float = 0.0) -> None:
        self.loop = ControlLoop(settings)
        self.canary = CanaryDriver(settings)
        self.pending_rollout, self.rollout_at_s = rollout, rollout_at_s
        self.rollout: dict[str, Any] | None = None
        self.rollout_log: list[dict[str, Any]] = []  # each change of the rollout's state: t_s, state, share
        self.commands: list[tuple[float, Command]] = []  # (t_s, command) of every gateway command applied
        self.scale_commands = 0
        self.windows = 0
        self._offset = 0

    def _decide(self, m: dict[str, Any], t: float, now_ms: int) -> list[Command]:
        rec, dead = self.loop.decode(m, {"topic": "bench"}, now_ms)
        if rec is None:
            raise ValueError(f"the loop refused its own window: {dead}")
        cmds: list[Command] = []
        if self.rollout is not None:
            before = self.rollout["state"]
            step = self.canary.step(self.rollout, rec, now_ms)
            self.rollout, cmds = step.rollout or self.rollout, step.commands
            if self.rollout["state"] != before:
                st = self.rollout["state"]
                self.rollout_log.append({"t_s": t, "state": st, "share": self.rollout["published_share"]})
        return cmds + self.loop.decide(rec, now_ms).commands

    def __call__(self, gw: CommandGateway, t: float, done: list[dict[str, Any]]) -> None:
        if self.pending_rollout is not None and t >= self.rollout_at_s:  # the operator starts it
            self.rollout, self.pending_rollout = self.pending_rollout, None
        now_ms = EPOCH_MS0 + int(round(t * 1000))
        self._offset += 1
        batch = {"schema_version": 1, "kind": "batch", "records": done + gw.fleet.gpu_snapshot(t)}
        self.loop.ingest(batch, {"topic": "bench", "partition": 0, "offset": self._offset}, now_ms, close=False)
        for m in self.loop.close_due(now_ms):
            if m["scope"] != "zone":
                continue  # node windows: the KV policy (bench kv)
            self.windows += 1
            for cmd in self._decide(m, t, now_ms):
                if gw.apply(cmd, t):
                    self.commands.append((t, cmd))
                elif cmd.kind == "scale":
                    self.scale_commands += 1

    def applied(self, kind: str) -> list[tuple[float, Command]]:
        """The ``kind`` commands applied, one per decision (the copy for the first zone)."""
        first = min((c.zone for _, c in self.commands), default="")
        return [(t, c) for t, c in self.commands if c.kind == kind and c.zone == first]


def _row(name: str, s: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:8.0f}"

    pc = " ".join(f"{c}={v['on_time'] * 100:5.1f}%" for c, v in s["per_class"].items())
    return (
        f"  {name:15s} ttft p50/p95/p99 {ms(s['ttft_p50_ms'])}{ms(s['ttft_p95_ms'])}{ms(s['ttft_p99_ms'])}"
        f"  e2e p95/p99 {ms(s['e2e_p95_ms'])}{ms(s['e2e_p99_ms'])}  on-time {s['on_time'] * 100:5.1f}%"
        f"  err {s['error_rate'] * 100:5.2f}%  gpu-s {s['gpu_seconds']:.0f}  [{pc}]"
    )
