"""``governor bench traffic --scenario agents``: dynamic agent weights (docs/model.md §15 (agents)) vs static 1:1:1.

Agent turns take the RAG, tool or plain-LLM path drawn from those weights
(dynamic) or 1:1:1 (static); see :func:`agent_turn_calls` for the stated
model of each path.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from typing import Any

import numpy as np

from bench.traffic_sim import FALLBACK, _gpu_seconds, _pct
from controllers import agent_weights as aw
from sim.fleet import Fleet, FleetConfig
from sim.perf_model import PerfModel


def agent_turn_calls(path: str, sig: aw.AgentSignals, rng: np.random.Generator) -> tuple[list[tuple[int, int]], float]:
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
        zones=("az-a",),
        initial_replicas=args.agent_replicas,
        seed=args.seed,
    )
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
            fields = {
                "agent_stability": sigs[c].stability,
                "agent_rag_score": sigs[c].rag_score,
                "agent_tool_conf": sigs[c].tool_conf,
                "agent_path": path,
            }  # the turn's telemetry
            for j, (p, o) in enumerate(calls):
                rid = f"t{k}c{j}"
                f.submit(t, "az-a", FALLBACK, p, o, rid, request_class="agent", agent=fields)
                ids.append(rid)
            turns.append((ids, extra))
        lat = {r["request_id"]: r["e2e_ms"] for r in f.advance_to(args.duration_s + 600)}
        resp = [sum(lat[i] for i in ids) + extra for ids, extra in turns if all(i in lat for i in ids)]
        res[arm] = {
            "turns": n_turns,
            "mean_response_ms": float(np.mean(resp)),
            "p95_response_ms": _pct(resp, 95),
            "completion": sum(x <= args.agent_deadline_ms for x in resp) / n_turns,
            "llm_calls": len(lat),
            "paths": dict(paths),
            "gpu_seconds": _gpu_seconds(cfg, replicas, args.duration_s + 600) / 1,
        }
    return res
