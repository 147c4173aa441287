"""``governor bench kv``: KV fragmentation and relocation on the Mooncake trace; cross-zone timing.

KV part (seed-spec 4.2, issue 6). The same seeded trace window is replayed
three times on the event-driven fleet (:mod:`sim.fleet`):

1. ``contiguous``: contiguous KV regions, no relocation (the baseline);
2. ``contiguous+relocation``: every ``period_s`` each replica's GPU record
   feeds :func:`controllers.kv_policy.step`; a ``compact`` decision is
   applied with :meth:`sim.fleet.Fleet.relocate` (bounded bytes, expected
   generation, the moved requests pause), a ``move`` with
   :meth:`sim.fleet.Fleet.move_sessions`;
3. ``paged``: the no-fragmentation reference.

Reported per relocation episode (trigger -> target or ``max_rounds``):
fragmentation at the trigger and after the last round, rounds, and *usable
KV* = KV in use + the largest free hole (what the replica can hold when the
next request must fit in one hole), before vs after. Per run: time-averaged
fragmentation while requests wait, mean running requests, TTFT p50/p95, e2e
p95, bytes moved and pause time. The seed's figures are printed alongside;
they come from other models and engines, so the comparison is of shape, not
of value.

Zones part (seed-spec 4.3): :func:`sim.zones.run_zones` with learned and with
configured factors.
"""

from __future__ import annotations

import json
from argparse import Namespace
from typing import Any

import numpy as np

from controllers.kv_policy import KvObs, KvPolicyParams, KvPolicyState
from controllers.kv_policy import step as kv_step
from sim.fleet import Fleet, FleetConfig
from sim.perf_model import PerfModel
from sim.traces import load_trace
from sim.zones import run_zones

SEED_KV = [("LLaMA-7B streaming", 63.2, 2, 41.3), ("Mixtral-8x7B sparse", 78.9, 3, 32.6)]


def add_parser(sub: Any) -> None:
    """Register ``kv`` under ``governor bench``."""
    b = sub.add_parser("kv", help="KV fragmentation, relocation and cross-zone timing (simulator)")
    b.add_argument("--trace", default="mooncake")
    b.add_argument("--qps", type=float, default=0.2, help="per-replica request rate")
    b.add_argument("--duration-s", type=float, default=600.0, help="trace window replayed")
    b.add_argument("--replicas", type=int, default=1)
    b.add_argument("--tensor-parallel", type=int, default=4)
    b.add_argument("--kv-capacity-tokens", type=int, default=131072,
                   help="KV pool per replica (tokens; 256 blocks of 512 by default)")
    b.add_argument("--period-s", type=float, default=1.0, help="policy period")
    b.add_argument("--max-gib-per-round", type=float, default=8.0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--json", action="store_true", help="print one JSON object")


def _run(args: Namespace, kind: str, relocate: bool) -> dict[str, Any]:
    pm = PerfModel.from_splitwise(tensor_parallel=args.tensor_parallel)
    cfg = FleetConfig(models={"m": pm}, initial_replicas=args.replicas, kv_allocator=kind,
                      kv_capacity_tokens=args.kv_capacity_tokens, max_batch=128, seed=args.seed)
    fleet = Fleet(cfg)
    tr = load_trace(args.trace).window(0.0, args.duration_s).scaled_to_qps(args.qps * args.replicas)
    for i in range(len(tr)):
        h = tr.hash_ids[i] if tr.hash_ids is not None else None
        fleet.submit(float(tr.arrival_s[i]), "az-a", "m", int(tr.prompt_tokens[i]),
                     int(tr.output_tokens[i]), f"q{i}", h)
    params = KvPolicyParams(max_bytes_per_round=int(args.max_gib_per_round * 2**30))
    states: dict[str, KvPolicyState] = {}
    open_ep: dict[str, dict[str, Any]] = {}
    episodes: list[dict[str, Any]] = []
    recs: list[dict] = []
    frag_waiting: list[float] = []
    running: list[int] = []
    moved_bytes = refused = moves = 0
    pause_s = 0.0
    t, end = 0.0, tr.duration_s + 3600.0
    while t < end and (t < tr.duration_s or fleet.stats()["in_flight"]):
        t += args.period_s
        recs += fleet.advance_to(t)
        gpus = [g for g in fleet.gpu_snapshot(t) if g["state"] == "ready"]
        for g in gpus:
            running.append(g["running"])
            if g["queue_len"]:
                frag_waiting.append(g.get("fragmentation_ratio", 0.0))
        if not relocate:
            continue
        for g in gpus:
            node = g["node"]
            peer = max((p["largest_free_block_bytes"] for p in gpus if p is not g), default=0)
            obs = KvObs(g["largest_free_block_bytes"], g["kv_free_bytes"], g["kv_waiting_bytes"],
                        g["fragmentation_ratio"], g["kv_generation"], peer)
            was = states.get(node, KvPolicyState())
            st, d = kv_step(params, was, obs)
            states[node] = st
            if was.in_episode and not st.in_episode:
                ep = open_ep.pop(node)
                ep.update(converged=d.converged, rounds=was.rounds)
                episodes.append(ep)
            if d.action == "compact":
                res = fleet.relocate("az-a", "m", node, d.bytes_budget, d.expected_generation, t)
                if "refused" in res:
                    refused += 1
                    continue
                if d.round == 1:
                    open_ep[node] = {"frag_before": obs.fragmentation_ratio, "usable_before":
                                     g["mem_used_bytes"] - pm.weight_bytes + obs.largest_free_block_bytes}
                ep = open_ep[node]
                ep["frag_after"] = res["fragmentation_after"]
                ep["usable_after"] = g["mem_used_bytes"] - pm.weight_bytes + res["largest_free_after"]
                moved_bytes += res["bytes_moved"]
                pause_s += res["duration_s"] * len(res["moved_request_ids"])
            elif d.action == "move":
                moves += len(fleet.move_sessions("az-a", "m", node, t).get("moved", {}))
    ttft = np.array([r["ttft_ms"] for r in recs]) if recs else np.zeros(1)
    e2e = np.array([r["e2e_ms"] for r in recs]) if recs else np.zeros(1)
    out: dict[str, Any] = {
        "run": kind + ("+relocation" if relocate else ""), "requests": len(tr), "completed": len(recs),
        "frag_while_waiting_mean": float(np.mean(frag_waiting)) if frag_waiting else 0.0,
        "running_mean": float(np.mean(running)) if running else 0.0,
        "ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p95_ms": float(np.percentile(ttft, 95)),
        "e2e_p95_ms": float(np.percentile(e2e, 95)),
    }
    if relocate:
        done = [e for e in episodes if "frag_after" in e]
        conv = [e for e in done if e["converged"]]
        gain = [e["usable_after"] / e["usable_before"] - 1 for e in done if e["usable_before"] > 0]
        out.update(
            episodes=len(done), converged=len(conv),
            converged_within_3=sum(e["rounds"] <= 3 for e in conv),
            rounds_mean=float(np.mean([e["rounds"] for e in conv])) if conv else 0.0,
            rounds_max=max((e["rounds"] for e in conv), default=0),
            frag_before_mean=float(np.mean([e["frag_before"] for e in done])) if done else 0.0,
            frag_after_mean=float(np.mean([e["frag_after"] for e in done])) if done else 0.0,
            usable_kv_gain_pct=100.0 * float(np.mean(gain)) if gain else 0.0,
            bytes_moved_gib=moved_bytes / 2**30, request_pause_s=pause_s, refused=refused,
            sessions_moved=moves)
    return out


def _fmt_kv(runs: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'run':<24}{'done':>7}{'frag|wait':>10}{'running':>9}{'TTFT p50':>10}{'TTFT p95':>10}"
             f"{'e2e p95':>10}"]
    for r in runs:
        lines.append(f"{r['run']:<24}{r['completed']:>7}{r['frag_while_waiting_mean']:>10.3f}"
                     f"{r['running_mean']:>9.2f}{r['ttft_p50_ms'] / 1e3:>9.1f}s{r['ttft_p95_ms'] / 1e3:>9.1f}s"
                     f"{r['e2e_p95_ms'] / 1e3:>9.1f}s")
    rel = runs[1]
    lines += ["", f"relocation episodes {rel['episodes']}, converged {rel['converged']} "
              f"({rel['converged_within_3']} within 3 rounds), rounds mean {rel['rounds_mean']:.2f} "
              f"max {rel['rounds_max']}",
              f"fragmentation at trigger {100 * rel['frag_before_mean']:.1f} % -> after "
              f"{100 * rel['frag_after_mean']:.1f} %; usable KV (used + largest hole) "
              f"{rel['usable_kv_gain_pct']:+.1f} %",
              f"moved {rel['bytes_moved_gib']:.1f} GiB, request pause {rel['request_pause_s']:.2f} s "
              f"in total, refused {rel['refused']}, sessions moved {rel['sessions_moved']}",
              "seed (other models/engines): " + "; ".join(
                  f"{n}: {f} % -> {k} rounds -> {g:+} % KV capacity" for n, f, k, g in SEED_KV)]
    return lines


def _fmt_zones(reps: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"{'pair':<14}{'factors':<12}{'RTT':>6}{'factor':>8}{'sigma raw':>11}{'sigma comp':>11}"
             f"{'|err| comp':>11}{'eps model':>10}{'delay +%':>9}   seed sigma / delay"]
    for mode, rep in reps.items():
        for pair, p in rep["pairs"].items():
            s = rep["seed_figures"].get(pair, {})
            c = p["compensated"]
            lines.append(f"{pair:<14}{mode:<12}{p['rtt_ms']:>6.1f}{p['factor']:>8.2f}"
                         f"{p['uncompensated']['sigma_ms']:>11.2f}{c['sigma_ms']:>11.2f}"
                         f"{c['mean_abs_ms']:>11.2f}{c['eps_sync_model_ms']:>10.2f}"
                         f"{p['delay_increase_pct']:>9.0f}   {s.get('sigma_ms', '-')} ms / +{s.get('delay_increase_pct', '-')} %")
        lines.append(f"  {mode}: spread p95 {rep['spread_ms']['uncompensated']['p95']:.2f} -> "
                     f"{rep['spread_ms']['compensated']['p95']:.2f} ms; HLC refused {rep['refused_stale']} "
                     f"of {rep['applied'] + rep['refused_stale']} deliveries")
    return lines


def run_kv_bench(args: Namespace) -> int:
    """Run both parts and print them (or one JSON object with ``--json``)."""
    runs = [_run(args, "contiguous", False), _run(args, "contiguous", True), _run(args, "paged", False)]
    zones = {"learned": run_zones(seed=args.seed),
             "configured": run_zones(seed=args.seed, factors={"az-b": 1.35, "az-c": 1.12})}
    if getattr(args, "json", False):
        print(json.dumps({"kv": runs, "zones": zones}, default=float))
        return 0
    print(f"## KV relocation: {args.trace}, {args.duration_s:g} s window at {args.qps:g} req/s per replica, "
          f"{args.replicas} replica(s) llama2-70b TP{args.tensor_parallel}, KV pool "
          f"{args.kv_capacity_tokens} tokens, policy every {args.period_s:g} s, "
          f"{args.max_gib_per_round:g} GiB per round, seed {args.seed}")
    print("\n".join(_fmt_kv(runs)))
    print("\n## Cross-zone timing (simulated, 600 s, commands every 5 s)")
    print("\n".join(_fmt_zones(zones)))
    return 0
