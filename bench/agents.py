"""``governor bench traffic --scenario agents``: the loop's agent weights (docs/model.md §15 (agents)) vs static 1:1:1.

Agent turns take the RAG, tool or plain-LLM path drawn from 1:1:1 (static)
or from the weights of the zone's last ``agents`` command (dynamic): the
stream worker's control loop (:class:`bench.traffic_sim.LoopPolicy`)
makes the windows from the turns' telemetry (each call carries its
conversation's signals and the path taken), its ``AgentWeightsDriver``
smooths the zone's mean signals and publishes weights, and the orchestrator
draws each later turn's path from them (1:1:1 until the first command).
See :func:`agent_turn_calls` for the stated model of each path.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from typing import Any, NamedTuple

import numpy as np

from bench.traffic_sim import FALLBACK, TICK_S, LoopPolicy, _gpu_seconds, _pct, static_policy
from core.settings import ModelSpec, Settings
from sim.fastloop import EPOCH_MS0
from sim.fleet import Fleet, FleetConfig
from sim.gateway import CommandGateway
from sim.perf_model import PerfModel

STATIC = {"rag": 1 / 3, "tool": 1 / 3, "llm": 1 / 3}
ZONE = "az-a"


class Signals(NamedTuple):
    """A conversation's agent signals (docs/model.md §15 (agents)), each in [0, 1]."""

    stability: float
    rag_score: float
    tool_conf: float


def agent_turn_calls(path: str, sig: Signals, rng: np.random.Generator) -> tuple[list[tuple[int, int]], float]:
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
    cfg = FleetConfig(
        models={FALLBACK: PerfModel.from_splitwise(model=FALLBACK)},
        zones=(ZONE,),
        initial_replicas=args.agent_replicas,
        seed=args.seed,
    )
    settings = Settings(
        models=(ModelSpec(FALLBACK, min_replicas=args.agent_replicas, max_replicas=args.agent_replicas),),
        zones=(ZONE,),
        window_s=args.window_s,
    )
    rng = np.random.default_rng([args.seed, 11])
    n_conv = args.agent_conversations
    sigs = [Signals(*rng.beta(2.0, 2.0, 3).tolist()) for _ in range(n_conv)]
    n_turns = int(rng.poisson(args.agent_rate * args.duration_s))
    turn_t = np.sort(rng.uniform(0, args.duration_s, n_turns)).tolist()
    turn_conv = rng.integers(n_conv, size=n_turns).tolist()
    res: dict[str, Any] = {}
    for arm in ("static-1:1:1", "dynamic"):
        pol = LoopPolicy(settings) if arm == "dynamic" else static_policy
        res[arm] = _agents_arm(args, cfg, pol, sigs, turn_t, turn_conv)
        res[arm]["gpu_seconds"] = _gpu_seconds(cfg, replicas, args.duration_s + 600)
        if isinstance(pol, LoopPolicy):
            res[arm]["agents_commands"] = len(pol.applied("agents"))
            last = pol.applied("agents")[-1:]
            res[arm]["last_weights"] = last[0][1].payload["weights"] if last else STATIC
    return res


def _agents_arm(
    args: argparse.Namespace,
    cfg: FleetConfig,
    pol: Any,
    sigs: list[Signals],
    turn_t: list[float],
    turn_conv: list[int],
) -> dict[str, Any]:
    """One arm: turns submitted tick by tick, each path drawn from the gateway's agent weights."""
    r2 = np.random.default_rng([args.seed, 12])  # same draws in both arms
    f = Fleet(cfg, epoch_ms0=EPOCH_MS0)
    gw = CommandGateway(f, np.random.default_rng([args.seed, 5]), agent_routes=False)  # the orchestrator's weights
    turns: list[tuple[list[str], float]] = []
    paths: dict[str, int] = defaultdict(int)
    lat: dict[str, float] = {}
    k, t = 0, 0.0
    for tick in range(1, int(math.ceil(args.duration_s / TICK_S)) + 1):
        t = min(tick * TICK_S, args.duration_s)
        while k < len(turn_t) and turn_t[k] < t:
            c = turn_conv[k]
            w = gw.agents.get((ZONE, FALLBACK), STATIC)
            u = r2.random()
            path = "rag" if u < w["rag"] else ("tool" if u < w["rag"] + w["tool"] else "llm")
            paths[path] += 1
            calls, extra = agent_turn_calls(path, sigs[c], r2)
            fields = {
                "agent_stability": sigs[c].stability,
                "agent_rag_score": sigs[c].rag_score,
                "agent_tool_conf": sigs[c].tool_conf,
                "agent_path": path,
            }  # the turn's telemetry
            ids = [f"t{k}c{j}" for j in range(len(calls))]
            for rid, (p, o) in zip(ids, calls, strict=True):
                f.submit(turn_t[k], ZONE, FALLBACK, p, o, rid, request_class="agent", agent=fields)
            turns.append((ids, extra))
            k += 1
        done = f.advance_to(t)
        lat.update((r["request_id"], r["e2e_ms"]) for r in done)
        pol(gw, t, done)
    lat.update((r["request_id"], r["e2e_ms"]) for r in f.advance_to(args.duration_s + 600))
    resp = [sum(lat[i] for i in ids) + extra for ids, extra in turns if all(i in lat for i in ids)]
    return {
        "turns": len(turn_t),
        "mean_response_ms": float(np.mean(resp)) if resp else None,
        "p95_response_ms": _pct(resp, 95),
        "completion": sum(x <= args.agent_deadline_ms for x in resp) / max(1, len(turn_t)),
        "llm_calls": len(lat),
        "paths": dict(paths),
    }
