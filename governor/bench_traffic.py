"""``governor bench traffic``: routing, breaker, canary and agent weights, A/B in one run.

Every scenario runs its arms on the same seeded workload (same arrivals,
classes and token counts) and the same fixed replicas, so the GPU-seconds
of the arms are equal; only the routing policy differs.  Windows are
``window_s`` long; after each, the policy sees that window's completed
requests (per target: P95 TTFT/e2e, completions, errors, queue depth) and
sets the fleet's routing weights for the next one.

* ``routing``: latency spikes (``Fleet.inject_latency_spike``: the seed's
  injected I/O delays) on the primary ``bloom-176b`` in ``az-a``.  Arms:
  ``static-primary`` (weights by capacity over the primary's zones, the
  fallback replicas idle), ``static-all`` (by capacity over every target),
  ``routing`` (:func:`controllers.routing.step` every window, fallback to
  ``llama2-70b`` per degradable class).
* ``breaker``: ``az-a``'s primary returns errors at ``--error-rate`` for a
  while.  Arms: ``no-breaker`` (static by capacity), ``breaker``
  (:mod:`controllers.breaker` per target feeding the router, half-open probes).
* ``canary``: a bad ``llama2-70b@v2`` (errors, or a P99 over 800 ms) rolled
  out 1 -> 5 -> 20 -> 100 %.  Arms: ``big-bang`` (100 % at the start),
  ``canary`` (:mod:`controllers.canary`), and ``canary-good`` (a healthy v2).
* ``agents``: agent turns take the RAG, tool or plain-LLM path drawn from
  the 4.1 weights (dynamic) or 1:1:1 (static); see :func:`agent_turn_calls`.

On-time delivery: a request meets its class's SLO (TTFT, and e2e where the
class has one) and did not fail; classes as in :data:`controllers.routing.DEFAULT_CLASSES`.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from controllers import agent_weights as aw
from controllers import breaker as brk
from controllers import canary as can
from controllers import routing as rt
from sim.fleet import Fleet, FleetConfig
from sim.perf_model import PerfModel

PRIMARY, FALLBACK, FAMILY = "bloom-176b", "llama2-70b", "chat"
CLASSES = {c.name: c for c in rt.DEFAULT_CLASSES}
CLASS_MIX = {"trading": 0.3, "voice": 0.4, "batch": 0.3}
# (prompt median, output median) tokens per class; lognormal, sigma 0.5
CLASS_TOKENS = {"trading": (400, 16), "voice": (600, 48), "batch": (1500, 200)}
ZONES = ("az-a", "az-b")

Policy = Callable[[Fleet, float, list[dict]], None]


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def on_time(rec: dict) -> bool:
    """The request met its class's SLO and did not fail."""
    if rec.get("status", "ok") != "ok":
        return False
    c = CLASSES.get(rec["request_class"])
    if c is None:
        return True
    return rec["ttft_ms"] <= c.ttft_slo_ms and (c.e2e_slo_ms is None or rec["e2e_ms"] <= c.e2e_slo_ms)


def workload(rate_rps: float, duration_s: float, seed: int,
             mix: dict[str, float] | None = None) -> list[tuple[float, str, int, int]]:
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


def capacity_rps(perf: PerfModel, replicas: int, prompt: float = 800, output: float = 80,
                 batch: int = 32) -> float:
    """Rough sustainable rate of ``replicas``: batched decode tokens/s over the mean output."""
    per_req_s = (float(perf.prefill_ms(prompt)) + output * perf.decode_step_ms(batch) / batch) / 1000
    return replicas / per_req_s


def run_arm(cfg: FleetConfig, arrivals: list[tuple[float, str, int, int]], duration_s: float,
            window_s: float, setup: Callable[[Fleet], None], policy: Policy,
            drain_s: float = 300.0, family: str = FAMILY) -> tuple[list[dict], Fleet]:
    """Replay ``arrivals`` window by window, calling ``policy`` after each; return all records."""
    fleet = Fleet(cfg, epoch_ms0=0)
    setup(fleet)
    policy(fleet, 0.0, [])
    recs: list[dict] = []
    i, t = 0, 0.0
    while t < duration_s:
        end = min(t + window_s, duration_s)
        while i < len(arrivals) and arrivals[i][0] < end:
            ta, c, p, o = arrivals[i]
            fleet.submit_routed(ta, family, c, p, o, f"q{i}")
            i += 1
        win = fleet.advance_to(end)
        recs += win
        policy(fleet, end, win)
        t = end
    recs += fleet.advance_to(duration_s + drain_s)
    return recs, fleet


def summarize(recs: list[dict], gpu_seconds: float, submitted: int) -> dict[str, Any]:
    """Percentiles, on-time delivery overall and per class, errors, GPU-seconds."""
    ttft = [r["ttft_ms"] for r in recs]
    e2e = [r["e2e_ms"] for r in recs]
    by: dict[str, list[dict]] = defaultdict(list)
    for r in recs:
        by[r["request_class"]].append(r)
    ok = sum(on_time(r) for r in recs)
    out = {"requests": submitted, "completed": len(recs),
           "ttft_p50_ms": _pct(ttft, 50), "ttft_p95_ms": _pct(ttft, 95), "ttft_p99_ms": _pct(ttft, 99),
           "e2e_p50_ms": _pct(e2e, 50), "e2e_p95_ms": _pct(e2e, 95), "e2e_p99_ms": _pct(e2e, 99),
           "on_time": ok / submitted if submitted else 0.0,
           "error_rate": sum(r.get("status") == "error" for r in recs) / max(1, len(recs)),
           "gpu_seconds": gpu_seconds, "per_class": {}}
    for c, rs in sorted(by.items()):
        out["per_class"][c] = {"n": len(rs), "on_time": sum(on_time(r) for r in rs) / len(rs),
                               "ttft_p95_ms": _pct([r["ttft_ms"] for r in rs], 95)}
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


def static_policy(weights: dict[str, float]) -> Policy:
    """Fixed weights for every class."""
    def pol(f: Fleet, t: float, win: list[dict]) -> None:
        if t == 0.0:
            f.set_routing(FAMILY, weights, t)
    return pol


def _target_windows(win: list[dict]) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = defaultdict(list)
    for r in win:
        by[f"{r['model']}|{r['zone']}"].append(r)
    return by


class ControlledRouting:
    """controllers.routing every window, optionally with a breaker per target."""

    def __init__(self, targets: list[rt.Target], caps: dict[rt.Target, float], window_s: float,
                 params: rt.RoutingParams, breaker: brk.BreakerParams | None = None) -> None:
        self.targets, self.caps, self.window_s, self.params = targets, caps, window_s, params
        self.state = rt.RoutingState()
        self.breaker = breaker
        self.bstate = {t: brk.BreakerState() for t in targets}
        self.attain = brk.AttainmentHistory(window_s=window_s, horizon_s=300.0)
        self.timeline: list[dict] = []
        self.fallback_windows: dict[str, int] = defaultdict(int)

    def __call__(self, f: Fleet, t: float, win: list[dict]) -> None:
        if t == 0.0:
            prim = {tg.key: self.caps[tg] for tg in self.targets if tg.variant == self.params.primary}
            f.set_routing(FAMILY, prim, t)
            return
        by = _target_windows(win)
        self.attain = self.attain.add(len(win), sum(on_time(r) for r in win))
        obs = {}
        for tg in self.targets:
            rs = by.get(tg.key, [])
            state = "closed"
            if self.breaker is not None:
                errs = sum(r.get("status") == "error" for r in rs)
                self.bstate[tg], out = brk.step(self.breaker, self.bstate[tg],
                                                brk.BreakerObs(len(rs), errs, self.attain.attainment()), t)
                state = out.state_name
                if out.changed:
                    self.timeline.append({"t_s": t, "target": tg.key, "state": state, "reason": out.reason})
            obs[tg] = rt.TargetObs(
                ttft_p95_ms=_pct([r["ttft_ms"] for r in rs], 95), e2e_p95_ms=_pct([r["e2e_ms"] for r in rs], 95),
                queue_len=float(f.queued(tg.zone, tg.variant)), rate_rps=len(rs) / self.window_s,
                capacity_rps=self.caps[tg], breaker=state)  # type: ignore[arg-type]
        self.state, d = rt.step(self.params, self.state, obs, rt.DEFAULT_CLASSES, self.window_s)
        for c in d.fallback:
            self.fallback_windows[c] += 1
        for c, ws in d.weights.items():
            if ws:
                f.set_routing(FAMILY, {tg.key: w for tg, w in ws.items()}, t, c)


def _row(name: str, s: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:8.0f}"
    pc = " ".join(f"{c}={v['on_time'] * 100:5.1f}%" for c, v in s["per_class"].items())
    return (f"  {name:15s} ttft p50/p95/p99 {ms(s['ttft_p50_ms'])}{ms(s['ttft_p95_ms'])}{ms(s['ttft_p99_ms'])}"
            f"  e2e p95/p99 {ms(s['e2e_p95_ms'])}{ms(s['e2e_p99_ms'])}  on-time {s['on_time'] * 100:5.1f}%"
            f"  err {s['error_rate'] * 100:5.2f}%  gpu-s {s['gpu_seconds']:.0f}  [{pc}]")


# -- scenarios ---------------------------------------------------------------------------
def _two_variants(args: argparse.Namespace) -> tuple[Any, ...]:
    """What the routing and breaker scenarios share: primary + fallback in every zone."""
    replicas = {PRIMARY: args.primary_replicas, FALLBACK: args.fallback_replicas}
    cfg = _fleet({PRIMARY: PRIMARY, FALLBACK: FALLBACK}, replicas, args.seed)
    arr = workload(args.rate, args.duration_s, args.seed)
    targets = [rt.Target(m, z) for m in (PRIMARY, FALLBACK) for z in ZONES]
    caps = {tg: capacity_rps(cfg.models[tg.variant], replicas[tg.variant]) for tg in targets}
    base = _setup_replicas(replicas)
    return replicas, cfg, arr, targets, caps, base


def scenario_routing(args: argparse.Namespace) -> dict[str, Any]:
    replicas, cfg, arr, targets, caps, base = _two_variants(args)

    def setup(f: Fleet) -> None:
        base(f)
        for k in range(args.spikes):
            start = args.spike_start_s + k * args.spike_every_s
            f.inject_latency_spike("az-a", PRIMARY, args.spike_fraction, args.spike_factor,
                                   start, args.spike_s)

    ctl = ControlledRouting(targets, caps, args.window_s, rt.RoutingParams(primary=PRIMARY, fallback=FALLBACK))
    arms: dict[str, Policy] = {
        "static-primary": static_policy({tg.key: caps[tg] for tg in targets if tg.variant == PRIMARY}),
        "static-all": static_policy({tg.key: caps[tg] for tg in targets}),
        "routing": ctl}
    horizon = args.duration_s + 300.0
    res = {}
    for name, pol in arms.items():
        recs, fleet = run_arm(cfg, arr, args.duration_s, args.window_s, setup, pol)
        res[name] = summarize(recs, _gpu_seconds(cfg, replicas, horizon), len(arr))
    res["routing"]["fallback_windows"] = dict(ctl.fallback_windows)
    a, b = res["static-primary"], res["routing"]
    res["p95_ttft_cut_ms"] = a["ttft_p95_ms"] - b["ttft_p95_ms"]
    res["p95_e2e_cut_ms"] = a["e2e_p95_ms"] - b["e2e_p95_ms"]
    return res


def scenario_breaker(args: argparse.Namespace) -> dict[str, Any]:
    replicas, cfg, arr, targets, caps, base = _two_variants(args)

    def setup(f: Fleet) -> None:
        base(f)
        f.inject_errors("az-a", PRIMARY, args.error_rate, args.fault_start_s, args.fault_s)

    params = rt.RoutingParams(primary=PRIMARY, fallback=FALLBACK)
    ctl_nb = ControlledRouting(targets, caps, args.window_s, params)
    ctl = ControlledRouting(targets, caps, args.window_s, params,
                            brk.BreakerParams(min_requests=args.breaker_min_requests))
    arms: dict[str, Policy] = {
        "no-breaker": static_policy({tg.key: caps[tg] for tg in targets if tg.variant == PRIMARY}),
        "routing-only": ctl_nb, "breaker": ctl}
    res: dict[str, Any] = {}
    for name, pol in arms.items():
        recs, _ = run_arm(cfg, arr, args.duration_s, args.window_s, setup, pol)
        res[name] = summarize(recs, _gpu_seconds(cfg, replicas, args.duration_s + 300), len(arr))
        res[name]["errors"] = sum(r.get("status") == "error" for r in recs)
    res["breaker"]["timeline"] = ctl.timeline
    return res


def scenario_canary(args: argparse.Namespace) -> dict[str, Any]:
    stable, v2 = FALLBACK, f"{FALLBACK}@v2"
    replicas = {stable: args.canary_replicas, v2: args.canary_replicas}
    cfg = _fleet({stable: FALLBACK, v2: FALLBACK}, replicas, args.seed)
    dur = args.canary_duration_s
    arr = workload(args.canary_rate, dur, args.seed, {"voice": 0.7, "trading": 0.3})
    cp = can.CanaryParams(hold_s=args.hold_s, min_requests_per_stage=args.min_stage_requests)
    start_s = args.canary_start_s

    def mk_setup(bad: str) -> Callable[[Fleet], None]:
        def setup(f: Fleet) -> None:
            _setup_replicas(replicas)(f)
            for z in ZONES:
                if bad == "errors":
                    f.inject_errors(z, v2, args.canary_error_rate, 0.0, 1e9)
                elif bad == "latency":
                    f.inject_latency_spike(z, v2, 1.0, args.canary_latency_factor, 0.0, 1e9)
        return setup

    def weights(share: float) -> dict[str, float]:
        w = {f"{stable}|{z}": (1 - share) / len(ZONES) for z in ZONES}
        w.update({f"{v2}|{z}": share / len(ZONES) for z in ZONES})
        return w

    class CanaryPolicy:
        def __init__(self) -> None:
            self.state = can.CanaryState()
            self.events: list[dict] = []
            self.stage_ttft: list[float] = []
            self.share = 0.0

        def __call__(self, f: Fleet, t: float, win: list[dict]) -> None:
            if self.state.name == "pending" and t >= start_s:
                self.state = can.start(cp, t)
                self.events.append({"t_s": t, "event": "start", "share": can.traffic_share(cp, self.state)})
            elif self.state.name == "running":
                cr = [r for r in win if r["model"] == v2]
                sr = [r for r in win if r["model"] == stable]
                self.stage_ttft += [r["ttft_ms"] for r in cr]
                p99 = _pct(self.stage_ttft, 99) if len(self.stage_ttft) >= cp.min_p99_requests else None
                stage = self.state.stage
                self.state, out = can.step(
                    cp, self.state, can.VersionObs(len(cr), sum(r["status"] == "error" for r in cr), p99),
                    can.VersionObs(len(sr), sum(r["status"] == "error" for r in sr), _pct([r["ttft_ms"] for r in sr], 99)), t)
                if out.changed:
                    self.events.append({"t_s": t, "event": out.state_name, "share": out.traffic_share,
                                        "reason": out.reason})
                if self.state.stage != stage:
                    self.stage_ttft = []
            share = can.traffic_share(cp, self.state)
            if t == 0.0 or share != self.share:
                self.share = share
                f.set_routing(FAMILY, weights(share), t)

    def bigbang(f: Fleet, t: float, win: list[dict]) -> None:
        if t == 0.0:
            f.set_routing(FAMILY, weights(0.0), t)
        elif start_s <= t < start_s + args.window_s:
            f.set_routing(FAMILY, weights(1.0), t)

    res: dict[str, Any] = {}
    for bad in ("errors", "latency", "good"):
        arms: dict[str, Any] = {"canary": CanaryPolicy()}
        if bad != "good":
            arms["big-bang"] = bigbang
        for name, pol in arms.items():
            recs, _ = run_arm(cfg, arr, dur, args.window_s, mk_setup(bad), pol)
            s = summarize(recs, _gpu_seconds(cfg, replicas, dur + 300), len(arr))
            on_v2 = [r for r in recs if r["model"] == v2]
            s["v2_requests"] = len(on_v2)
            s["v2_share_of_all"] = len(on_v2) / len(arr)
            s["v2_ttft_p99_ms"] = _pct([r["ttft_ms"] for r in on_v2], 99)
            s["v2_errors"] = sum(r["status"] == "error" for r in on_v2)
            if isinstance(pol, CanaryPolicy):
                s["events"] = pol.events
                s["final"] = pol.state.name
                end = next((e["t_s"] for e in pol.events if e["event"] in can.TERMINAL), dur)
                during = [r for r in recs if start_s * 1000 <= r["arrival_ms"] < end * 1000]
                s["rollout_s"] = [start_s, end]
                s["v2_share_during_rollout"] = (sum(r["model"] == v2 for r in during) / len(during)
                                                if during else 0.0)
            res[f"{bad}/{name}"] = s
    return res


def agent_turn_calls(path: str, sig: aw.AgentSignals, rng: np.random.Generator
                     ) -> tuple[list[tuple[int, int]], float]:
    """LLM calls ``(prompt, output)`` and fixed extra delay (ms) of one agent turn on ``path``.

    Model (stated, not measured): ``llm``: one call (prompt 800, output 120);
    with probability ``(1 - stability)`` the topic jumped and the answer needs
    a second, clarifying call.  ``rag``: retrieval (60 ms) then one call with
    1,500 retrieved tokens more; with probability ``1 - rag_score`` the
    context was irrelevant and a second plain call follows.  ``tool``: a
    planner call (output 24), the tool (lognormal, median 250 ms), the final
    call (prompt 1,000); with probability ``1 - tool_conf`` the tool call was
    wrong and planner + tool repeat once.
    """
    if path == "rag":
        calls, extra = [(2300, 120)], 60.0
        if rng.random() > sig.rag_score:
            calls.append((900, 120))
        return calls, extra
    if path == "tool":
        calls = [(800, 24)]
        extra = float(rng.lognormal(math.log(250), 0.5))
        if rng.random() > sig.tool_conf:
            calls.append((900, 24))
            extra += float(rng.lognormal(math.log(250), 0.5))
        calls.append((1000, 120))
        return calls, extra
    calls = [(800, 120)]
    if rng.random() > sig.stability:
        calls.append((1000, 120))
    return calls, 0.0


def scenario_agents(args: argparse.Namespace) -> dict[str, Any]:
    replicas = {FALLBACK: args.agent_replicas}
    cfg = FleetConfig(models={FALLBACK: PerfModel.from_splitwise(model=FALLBACK)}, zones=("az-a",),
                      initial_replicas=args.agent_replicas, seed=args.seed)
    rng = np.random.default_rng([args.seed, 11])
    n_conv = args.agent_conversations
    sigs = [aw.AgentSignals(*rng.beta(2.0, 2.0, 3).tolist()) for _ in range(n_conv)]
    n_turns = int(rng.poisson(args.agent_rate * args.duration_s))
    turn_t = np.sort(rng.uniform(0, args.duration_s, n_turns)).tolist()
    turn_conv = rng.integers(n_conv, size=n_turns).tolist()
    res: dict[str, Any] = {}
    for arm in ("static-1:1:1", "dynamic"):
        r2 = np.random.default_rng([args.seed, 12])  # same draws in both arms
        f = Fleet(cfg, epoch_ms0=0)
        turns: list[tuple[list[str], float]] = []
        paths: dict[str, int] = defaultdict(int)
        for k, (t, c) in enumerate(zip(turn_t, turn_conv, strict=True)):
            w = aw.weights(sigs[c]) if arm == "dynamic" else aw.STATIC_WEIGHTS
            u = r2.random()
            path = "rag" if u < w.rag else ("tool" if u < w.rag + w.tool else "llm")
            paths[path] += 1
            calls, extra = agent_turn_calls(path, sigs[c], r2)
            ids = []
            for j, (p, o) in enumerate(calls):
                rid = f"t{k}c{j}"
                f.submit(t, "az-a", FALLBACK, p, o, rid, request_class="agent")
                ids.append(rid)
            turns.append((ids, extra))
        lat = {r["request_id"]: r["e2e_ms"] for r in f.advance_to(args.duration_s + 600)}
        resp = [sum(lat[i] for i in ids) + extra for ids, extra in turns if all(i in lat for i in ids)]
        res[arm] = {"turns": n_turns, "mean_response_ms": float(np.mean(resp)),
                    "p95_response_ms": _pct(resp, 95),
                    "completion": sum(x <= args.agent_deadline_ms for x in resp) / n_turns,
                    "llm_calls": len(lat), "paths": dict(paths),
                    "gpu_seconds": _gpu_seconds(cfg, replicas, args.duration_s + 600) / 1}
    return res


SCENARIOS = {"routing": scenario_routing, "breaker": scenario_breaker, "canary": scenario_canary,
             "agents": scenario_agents}


def add_parser(sub: Any) -> None:
    """Register ``traffic`` under ``governor bench``."""
    b = sub.add_parser("traffic", help="routing/fallback, breaker, canary, agent weights: A/B in one run")
    b.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--duration-s", type=float, default=600.0)
    b.add_argument("--window-s", type=float, default=10.0)
    b.add_argument("--rate", type=float, default=8.0, help="routing/breaker arrival rate (rps)")
    b.add_argument("--primary-replicas", type=int, default=3, help="per zone")
    b.add_argument("--fallback-replicas", type=int, default=1, help="per zone")
    b.add_argument("--spikes", type=int, default=2)
    b.add_argument("--spike-start-s", type=float, default=120.0)
    b.add_argument("--spike-every-s", type=float, default=240.0)
    b.add_argument("--spike-s", type=float, default=120.0)
    b.add_argument("--spike-fraction", type=float, default=1.0)
    b.add_argument("--spike-factor", type=float, default=4.0)
    b.add_argument("--error-rate", type=float, default=0.05)
    b.add_argument("--fault-start-s", type=float, default=120.0)
    b.add_argument("--fault-s", type=float, default=300.0)
    b.add_argument("--canary-rate", type=float, default=40.0)
    b.add_argument("--canary-duration-s", type=float, default=1500.0)
    b.add_argument("--breaker-min-requests", type=int, default=100,
                   help="scaled to the per-target rate (the article: 1000)")
    b.add_argument("--canary-replicas", type=int, default=4, help="per zone and version")
    b.add_argument("--canary-start-s", type=float, default=30.0)
    b.add_argument("--hold-s", type=float, default=60.0)
    b.add_argument("--min-stage-requests", type=int, default=250)
    b.add_argument("--canary-error-rate", type=float, default=0.02)
    b.add_argument("--canary-latency-factor", type=float, default=5.0)
    b.add_argument("--agent-rate", type=float, default=6.0, help="agent turns per second")
    b.add_argument("--agent-conversations", type=int, default=200)
    b.add_argument("--agent-replicas", type=int, default=4)
    b.add_argument("--agent-deadline-ms", type=float, default=12_000.0)
    b.add_argument("--json", action="store_true")


def _print(name: str, res: dict[str, Any]) -> None:
    print(f"== {name}")
    for arm, s in res.items():
        if isinstance(s, dict) and "ttft_p95_ms" in s:
            print(_row(arm, s))
            extra = {k: v for k, v in s.items() if k.startswith("v2_") or k in ("final", "rollout_s", "errors",
                                                                               "fallback_windows")}
            if extra:
                print("      " + json.dumps(extra, default=float))
            for ev in s.get("events", []) + s.get("timeline", []):
                print("      " + json.dumps(ev))
        elif isinstance(s, dict):
            print(f"  {arm:15s} " + json.dumps(s, default=float))
        else:
            print(f"  {arm}: {s:.1f}")


def run_traffic_bench(args: argparse.Namespace) -> int:
    """Run the chosen scenarios; print a table per scenario (or JSON with ``--json``)."""
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    out = {n: SCENARIOS[n](args) for n in names}
    if args.json:
        print(json.dumps(out, indent=2, default=float))
    else:
        for n, res in out.items():
            _print(n, res)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="governor bench")
    add_parser(p.add_subparsers(dest="bench", required=True))
    return run_traffic_bench(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
