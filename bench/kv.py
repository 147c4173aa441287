"""``governor bench kv``: KV fragmentation and relocation on the Mooncake trace; cross-zone timing.

KV part (docs/model.md §16 (kv), issue 6). The same seeded trace window is replayed
three times on the event-driven fleet (:mod:`sim.fleet`):

1. ``contiguous``: contiguous KV regions, no relocation (the baseline);
2. ``contiguous+relocation``: every ``period_s`` each replica's GPU record
   feeds :func:`controllers.kv_policy.step`; a ``compact`` decision is
   applied with :meth:`sim.fleet.Fleet.relocate` (the allocator's targeted
   plan: largest hole, fewest bytes, within the round's byte budget; the
   moved requests pause), a ``move`` with :meth:`sim.fleet.Fleet.move_sessions`;
3. ``paged``: the no-fragmentation reference.

Per-round budget: ``--max-pause-ms`` (default 10 ms) times the copy
bandwidth of the TP group (``COPY_BANDWIDTH_BYTES_S x tensor_parallel``), so
the pause a round can cause is bounded; ``--max-gib-per-round`` overrides it
with a byte count. ``--no-compact-when-blocked`` restores the design
source's start rule alone (see :mod:`controllers.kv_policy`).

Reported per relocation episode (trigger -> target or ``max_rounds``):
fragmentation at the trigger, after the last round and at the observation
that closed the episode; rounds; *usable KV* = KV in use + the largest free
hole (what the replica can hold when the next request must fit in one hole)
before vs after, and its *bound*: KV in use + all free memory (what a
perfect compaction, or a paged allocator, would give at the trigger); bytes
moved, copy time and the moved requests. Admission: whether the head-of-line
request fits the largest hole before vs after; per run, the share of samples
in which a request waits *blocked by fragmentation alone* (``largest_free <
waiting <= free``) and the mean running requests (vs paged). Latency: TTFT
p50/p95 and e2e p95 of the three runs; ``lost`` = requests - completed. The
design source's reported figures (:data:`SEED_KV`) are printed alongside;
they come from other models and engines, so the comparison is of shape, not
of value.

Zones part (docs/model.md §17 (hlc)): :func:`sim.zones.run_zones` with
learned and with configured factors.
"""

from __future__ import annotations

import json
from argparse import BooleanOptionalAction, Namespace
from collections.abc import Sequence
from typing import Any

import numpy as np

from controllers.kv_policy import KvObs, KvPolicyParams, KvPolicyState
from controllers.kv_policy import step as kv_step
from sim.fleet import Fleet, FleetConfig
from sim.kvalloc import COPY_BANDWIDTH_BYTES_S
from sim.perf_model import PerfModel
from sim.traces import load_trace
from sim.zones import run_zones

# The design source's reported figures (docs/model.md §16 (kv)): engine, fragmentation %, rounds,
# KV capacity gain %; printed as "seed" next to the measured episodes, never used as constants.
SEED_KV = [("LLaMA-7B streaming", 63.2, 2, 41.3), ("Mixtral-8x7B sparse", 78.9, 3, 32.6)]
FRAG_BANDS = ((0.0, 0.4), (0.4, 0.6), (0.6, 1.01))  # fragmentation at trigger, for the SEED_KV comparison


def add_parser(sub: Any) -> None:
    """Register ``kv`` under ``governor bench``."""
    b = sub.add_parser("kv", help="KV fragmentation, relocation and cross-zone timing (simulator)")
    b.add_argument("--trace", default="mooncake")
    b.add_argument("--qps", type=float, default=0.2, help="per-replica request rate")
    b.add_argument("--duration-s", type=float, default=600.0, help="trace window replayed")
    b.add_argument("--replicas", type=int, default=1)
    b.add_argument("--tensor-parallel", type=int, default=4)
    b.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=131072,
        help="KV pool per replica (tokens; 256 blocks of 512 by default)",
    )
    b.add_argument("--period-s", type=float, default=1.0, help="policy period")
    b.add_argument(
        "--max-pause-ms",
        type=float,
        default=10.0,
        help="per-round copy-time bound; budget = this x copy bandwidth x TP",
    )
    b.add_argument("--max-gib-per-round", type=float, default=None, help="byte budget instead of --max-pause-ms")
    b.add_argument(
        "--compact-when-blocked",
        action=BooleanOptionalAction,
        default=True,
        help="also compact when the waiting request is blocked by fragmentation alone",
    )
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--episodes", action="store_true", help="print one line per relocation episode")
    b.add_argument("--json", action="store_true", help="print one JSON object")


def policy_params(args: Namespace) -> KvPolicyParams:
    """The relocation policy of the bench (budget from the pause bound unless a GiB budget is given)."""
    kw = {"compact_when_blocked": bool(args.compact_when_blocked)}
    if args.max_gib_per_round is not None:
        return KvPolicyParams(max_bytes_per_round=int(args.max_gib_per_round * 2**30), **kw)
    return KvPolicyParams.for_pause(args.max_pause_ms / 1e3, COPY_BANDWIDTH_BYTES_S * args.tensor_parallel, **kw)


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if xs else 0.0


def _summary(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-run aggregates of the closed episodes (definitions in the module docstring)."""
    conv = [e for e in episodes if e["converged"]]
    for e in episodes:
        e["gain_pct"] = 100.0 * (e["usable_after"] / e["usable_before"] - 1) if e["usable_before"] else 0.0
        e["bound_pct"] = 100.0 * (e["usable_max"] / e["usable_before"] - 1) if e["usable_before"] else 0.0
    bands = []
    for lo, hi in FRAG_BANDS:
        sel = [e for e in episodes if lo <= e["frag_before"] < hi]
        bands.append(
            {
                "frag_lo": lo,
                "frag_hi": min(hi, 1.0),
                "episodes": len(sel),
                "frag_before_mean": _mean([e["frag_before"] for e in sel]),
                "rounds_mean": _mean([e["rounds"] for e in sel]),
                "converged": sum(e["converged"] for e in sel),
                "usable_kv_gain_pct": _mean([e["gain_pct"] for e in sel]),
                "usable_kv_bound_pct": _mean([e["bound_pct"] for e in sel]),
            }
        )
    return {
        "episodes": len(episodes),
        "converged": len(conv),
        "converged_within_3": sum(e["rounds"] <= 3 for e in conv),
        "rounds_mean": _mean([e["rounds"] for e in conv]),
        "rounds_max": max((e["rounds"] for e in conv), default=0),
        "frag_before_mean": _mean([e["frag_before"] for e in episodes]),
        "frag_after_mean": _mean([e["frag_after"] for e in episodes]),
        "frag_end_mean": _mean([e["frag_end"] for e in episodes]),
        "usable_kv_gain_pct": _mean([e["gain_pct"] for e in episodes]),
        "usable_kv_gain_median_pct": float(np.median([e["gain_pct"] for e in episodes])) if episodes else 0.0,
        "usable_kv_bound_pct": _mean([e["bound_pct"] for e in episodes]),
        "gain_ge_30_pct": sum(e["gain_pct"] >= 30.0 for e in episodes),
        "bound_ge_30_pct": sum(e["bound_pct"] >= 30.0 for e in episodes),
        "head_fits_before": sum(e["head_fits_before"] for e in episodes),
        "head_fits_after": sum(e["head_fits_after"] for e in episodes),
        "by_fragmentation": bands,
    }


def _run(args: Namespace, kind: str, relocate: bool) -> dict[str, Any]:
    pm = PerfModel.from_splitwise(tensor_parallel=args.tensor_parallel)
    cfg = FleetConfig(
        models={"m": pm},
        initial_replicas=args.replicas,
        kv_allocator=kind,
        kv_capacity_tokens=args.kv_capacity_tokens,
        max_batch=128,
        seed=args.seed,
    )
    fleet = Fleet(cfg)
    tr = load_trace(args.trace).window(0.0, args.duration_s).scaled_to_qps(args.qps * args.replicas)
    for i in range(len(tr)):
        h = tr.hash_ids[i] if tr.hash_ids is not None else None
        fleet.submit(
            float(tr.arrival_s[i]), "az-a", "m", int(tr.prompt_tokens[i]), int(tr.output_tokens[i]), f"q{i}", h
        )
    params = policy_params(args)
    states: dict[str, KvPolicyState] = {}
    open_ep: dict[str, dict[str, Any]] = {}
    episodes: list[dict[str, Any]] = []
    recs: list[dict[str, Any]] = []
    frag_waiting: list[float] = []
    running: list[int] = []
    blocked = samples = moved_bytes = refused = moves = rounds = paused_steps = 0
    pause_s = copy_s = copy_max_s = 0.0
    t, end = 0.0, tr.duration_s + 3600.0
    while t < end and (t < tr.duration_s or fleet.stats()["in_flight"]):
        t += args.period_s
        recs += fleet.advance_to(t)
        gpus = [g for g in fleet.gpu_snapshot(t) if g["state"] == "ready"]
        for g in gpus:
            samples += 1
            running.append(g["running"])
            if g["queue_len"]:
                frag_waiting.append(g.get("fragmentation_ratio", 0.0))
                wait = g.get("kv_waiting_bytes", 0)
                blocked += g["largest_free_block_bytes"] < wait <= g.get("kv_free_bytes", 0)
        if not relocate:
            continue
        for g in gpus:
            node = g["node"]
            peer = max((p["largest_free_block_bytes"] for p in gpus if p is not g), default=0)
            obs = KvObs(
                g["largest_free_block_bytes"],
                g["kv_free_bytes"],
                g["kv_waiting_bytes"],
                g["fragmentation_ratio"],
                g["kv_generation"],
                peer,
            )
            was = states.get(node, KvPolicyState())
            st, d = kv_step(params, was, obs)
            states[node] = st
            if was.in_episode and not st.in_episode and node in open_ep:
                ep = open_ep.pop(node)
                ep.update(converged=d.converged, rounds=was.rounds, frag_end=obs.fragmentation_ratio)
                episodes.append(ep)
            if d.action == "compact":
                res = fleet.relocate("az-a", "m", node, d.bytes_budget, d.expected_generation, t)
                if "refused" in res:
                    refused += 1
                    continue
                used = g["mem_used_bytes"] - pm.weight_bytes
                if d.round == 1:
                    open_ep[node] = {
                        "t_s": t,
                        "frag_before": obs.fragmentation_ratio,
                        "usable_before": used + obs.largest_free_block_bytes,
                        "usable_max": used + obs.free_bytes,
                        "bytes_moved": 0,
                        "copy_s": 0.0,
                        "head_fits_before": obs.largest_free_block_bytes >= obs.waiting_kv_bytes,
                    }
                ep = open_ep[node]
                ep.update(
                    frag_after=res["fragmentation_after"],
                    usable_after=used + res["largest_free_after"],
                    head_fits_after=res["largest_free_after"] >= obs.waiting_kv_bytes,
                )
                ep["bytes_moved"] += res["bytes_moved"]
                ep["copy_s"] += res["duration_s"]
                rounds += 1
                moved_bytes += res["bytes_moved"]
                copy_s += res["duration_s"]
                copy_max_s = max(copy_max_s, res["duration_s"])
                pause_s += res["duration_s"] * len(res["moved_request_ids"])
                paused_steps += res["pause_steps"] * len(res["moved_request_ids"])
            elif d.action == "move":
                moves += len(fleet.move_sessions("az-a", "m", node, t).get("moved", {}))
    ttft = np.array([r["ttft_ms"] for r in recs]) if recs else np.zeros(1)
    e2e = np.array([r["e2e_ms"] for r in recs]) if recs else np.zeros(1)
    out: dict[str, Any] = {
        "run": kind + ("+relocation" if relocate else ""),
        "requests": len(tr),
        "completed": len(recs),
        "lost": len(tr) - len(recs),
        "frag_while_waiting_mean": _mean(frag_waiting),
        "frag_blocked_share": blocked / samples if samples else 0.0,
        "running_mean": _mean(running),
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p95_ms": float(np.percentile(ttft, 95)),
        "e2e_p95_ms": float(np.percentile(e2e, 95)),
    }
    if relocate:
        out.update(
            _summary(episodes),
            episode_list=episodes,
            budget_bytes_per_round=params.max_bytes_per_round,
            rounds_total=rounds,
            bytes_moved_gib=moved_bytes / 2**30,
            copy_s=copy_s,
            copy_max_round_ms=copy_max_s * 1e3,
            request_pause_s=pause_s,
            request_decode_steps_lost=paused_steps,
            refused=refused,
            sessions_moved=moves,
        )
    return out


def _fmt_kv(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'run':<24}{'done':>7}{'lost':>5}{'frag|wait':>10}{'blocked':>8}{'running':>9}{'TTFT p50':>10}"
        f"{'TTFT p95':>10}{'e2e p95':>10}"
    ]
    for r in runs:
        lines.append(
            f"{r['run']:<24}{r['completed']:>7}{r['lost']:>5}{r['frag_while_waiting_mean']:>10.3f}"
            f"{100 * r['frag_blocked_share']:>7.1f}%{r['running_mean']:>9.2f}{r['ttft_p50_ms'] / 1e3:>9.1f}s"
            f"{r['ttft_p95_ms'] / 1e3:>9.1f}s{r['e2e_p95_ms'] / 1e3:>9.1f}s"
        )
    rel = runs[1]
    n = rel["episodes"]
    lines += [
        "",
        f"relocation episodes {n}, converged {rel['converged']} "
        f"({rel['converged_within_3']} within 3 rounds), rounds mean {rel['rounds_mean']:.2f} "
        f"max {rel['rounds_max']}; budget {rel['budget_bytes_per_round'] / 2**30:.1f} GiB per round",
        f"fragmentation at trigger {100 * rel['frag_before_mean']:.1f} % -> after last round "
        f"{100 * rel['frag_after_mean']:.1f} % -> at episode end {100 * rel['frag_end_mean']:.1f} %",
        f"usable KV (used + largest hole) {rel['usable_kv_gain_pct']:+.1f} % (median "
        f"{rel['usable_kv_gain_median_pct']:+.1f} %, >= +30 % in {rel['gain_ge_30_pct']}/{n}); bound "
        f"(used + all free) {rel['usable_kv_bound_pct']:+.1f} % (>= +30 % in {rel['bound_ge_30_pct']}/{n})",
        f"head-of-line request fits the largest hole: {rel['head_fits_before']}/{n} before, "
        f"{rel['head_fits_after']}/{n} after",
        f"moved {rel['bytes_moved_gib']:.1f} GiB in {rel['rounds_total']} rounds, copy time "
        f"{1e3 * rel['copy_s']:.0f} ms (max {rel['copy_max_round_ms']:.1f} ms a round), request pause "
        f"{rel['request_pause_s']:.2f} s ({rel['request_decode_steps_lost']} decode steps), refused "
        f"{rel['refused']}, sessions moved {rel['sessions_moved']}",
    ]
    for b in rel["by_fragmentation"]:
        lines.append(
            f"  frag at trigger {100 * b['frag_lo']:.0f}-{100 * b['frag_hi']:.0f} %: {b['episodes']} "
            f"episodes (mean {100 * b['frag_before_mean']:.1f} %), converged {b['converged']}, rounds (all) "
            f"{b['rounds_mean']:.2f}, usable KV {b['usable_kv_gain_pct']:+.1f} % (bound "
            f"{b['usable_kv_bound_pct']:+.1f} %)"
        )
    # "seed": the design source's reported figures, SEED_KV (docs/model.md §16 (kv))
    lines.append(
        "seed (other models/engines): "
        + "; ".join(f"{n}: {f} % -> {k} rounds -> {g:+} % KV capacity" for n, f, k, g in SEED_KV)
    )
    return lines


def _fmt_episodes(rel: dict[str, Any]) -> list[str]:
    lines = [
        f"{'t_s':>7}{'frag':>7}{'after':>7}{'end':>7}{'rounds':>7}{'conv':>6}{'usable':>9}{'bound':>8}"
        f"{'GiB':>7}{'copy ms':>8}  fits"
    ]
    for e in rel["episode_list"]:
        lines.append(
            f"{e['t_s']:>7.0f}{e['frag_before']:>7.3f}{e['frag_after']:>7.3f}{e['frag_end']:>7.3f}"
            f"{e['rounds']:>7}{'yes' if e['converged'] else 'no':>6}{e['gain_pct']:>+8.1f}%"
            f"{e['bound_pct']:>+7.1f}%{e['bytes_moved'] / 2**30:>7.1f}{1e3 * e['copy_s']:>8.2f}"
            f"  {int(e['head_fits_before'])}->{int(e['head_fits_after'])}"
        )
    return lines


def _fmt_zones(reps: dict[str, dict[str, Any]]) -> list[str]:
    # "seed sigma / delay": the design source's reported figures, sim.zones.SEED_FIGURES (docs/model.md §17 (hlc))
    lines = [
        f"{'pair':<14}{'factors':<12}{'RTT':>6}{'factor':>8}{'sigma raw':>11}{'sigma comp':>11}"
        f"{'|err| comp':>11}{'eps model':>10}{'delay +%':>9}   seed sigma / delay"
    ]
    for mode, rep in reps.items():
        for pair, p in rep["pairs"].items():
            s = rep["seed_figures"].get(pair, {})
            c = p["compensated"]
            lines.append(
                f"{pair:<14}{mode:<12}{p['rtt_ms']:>6.1f}{p['factor']:>8.2f}"
                f"{p['uncompensated']['sigma_ms']:>11.2f}{c['sigma_ms']:>11.2f}"
                f"{c['mean_abs_ms']:>11.2f}{c['eps_sync_model_ms']:>10.2f}"
                f"{p['delay_increase_pct']:>9.0f}   {s.get('sigma_ms', '-')} ms / +{s.get('delay_increase_pct', '-')} %"
            )
        lines.append(
            f"  {mode}: spread p95 {rep['spread_ms']['uncompensated']['p95']:.2f} -> "
            f"{rep['spread_ms']['compensated']['p95']:.2f} ms; HLC refused {rep['refused_stale']} "
            f"of {rep['applied'] + rep['refused_stale']} deliveries"
        )
    return lines


def run_kv_bench(args: Namespace) -> int:
    """Run both parts and print them (or one JSON object with ``--json``)."""
    runs = [_run(args, "contiguous", False), _run(args, "contiguous", True), _run(args, "paged", False)]
    zones = {
        "learned": run_zones(seed=args.seed),
        "configured": run_zones(seed=args.seed, factors={"az-b": 1.35, "az-c": 1.12}),
    }
    if getattr(args, "json", False):
        print(json.dumps({"kv": runs, "zones": zones}, default=float))
        return 0
    budget = (
        f"{args.max_gib_per_round:g} GiB per round"
        if args.max_gib_per_round is not None
        else f"{args.max_pause_ms:g} ms copy per round"
    )
    print(
        f"## KV relocation: {args.trace}, {args.duration_s:g} s window at {args.qps:g} req/s per replica, "
        f"{args.replicas} replica(s) llama2-70b TP{args.tensor_parallel}, KV pool "
        f"{args.kv_capacity_tokens} tokens, policy every {args.period_s:g} s, {budget}, "
        f"compact when blocked {'on' if args.compact_when_blocked else 'off'}, seed {args.seed}"
    )
    print("\n".join(_fmt_kv(runs)))
    if getattr(args, "episodes", False):
        print("\n".join(_fmt_episodes(runs[1])))
    print("\n## Cross-zone timing (simulated, 600 s, commands every 5 s)")
    print("\n".join(_fmt_zones(zones)))
    return 0
