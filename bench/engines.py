"""``governor bench engines``: the capacity a real vLLM engine adds, 1, 2 and 3 engines side by side.

One run starts the vLLM router and, for each ``--max-num-seqs`` value, an
:class:`engines.pool.EnginePool` of the engine venv's Python and the tiny model
(:mod:`engines.setup`), pinned to ``--cores``.  The pool grows 1 -> 2 -> 3
(``--sizes``), each size measured once every engine is in the router: a few
warm-up requests, the unloaded latency, then the throughput at the SLO
(:func:`engines.profiling.capacity_at_slo`: a geometric bisection over the
offered Poisson rate, ``--trial-s`` seconds a trial, the same bracket for every
size so the answers sit on one grid).  The SLO is the same for every row:
``--slo-multiple`` x the unloaded P95 TTFT and ITL of the first pool at one
engine (:func:`engines.profiling.slos_from`; the ITL basis at least the unloaded
time per output token, :func:`itl_basis`).

What limits it, with figures: during each size's capacity trials the command
reads the CPU seconds (``utime + stime`` in ``/proc/<pid>/stat``) of every
process of each engine's process group (API server, EngineCore, Worker and
their helpers), of the router's group and of this process (the load client),
and the machine's busy time from ``/proc/stat``; it prints each as a share of
the machine (all its cores), and ``other`` (busy time of processes that are
not this run's: another engineer's engines, say) and ``idle``.  An engine at
one full core (50 % of 2 cores) is CPU-bound; an engine well under it while
capacity stops at its ``--max-num-seqs`` is batch-bound.

Every engine it starts is stopped at the end, whatever happens (the pools are
closed with their engines, then any process still carrying a pool's variable
is killed; the router's group is stopped).

>>> rows = [{"max_num_seqs": 4, "engines": 1, "capacity_rps": 8.0, "ratio": 1.0, "tokens_per_s": 250.0,
...          "at_capacity": {"attainment": 0.97, "p95_ttft_ms": 21.0},
...          "cpu_share": {"engines": [0.49], "router": 0.02, "client": 0.1, "other": 0.05, "idle": 0.34}}]
>>> print(markdown({"command": "governor bench engines", "slo": {"ttft_slo_ms": 40.0, "itl_slo_ms": 9.0}}, rows))
`governor bench engines` (SLO: TTFT 40 ms, ITL 9 ms)
<BLANKLINE>
| engines | confined | max-num-seqs | capacity, req/s | x 1 engine | tokens/s | attainment, P95 TTFT at capacity | CPU share of the machine: engines (each) | router | client | other | idle |
|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|
| 1 | yes | 4 | 8.00 | 1.00 | 250 | 97.0 %, 21 ms | 49 % | 2 % | 10 % | 5 % | 34 % |
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.settings import Settings
from engines import setup
from engines.pool import EnginePool, EngineSpec, free_port, pool_processes
from engines.profiling import CapacityProfile, Unloaded, capacity_at_slo, slos_from, unloaded
from engines.router import RouterClient, start_router

__all__ = [
    "CpuSample",
    "add_options",
    "add_parser",
    "cpu_sample",
    "cpu_shares",
    "engine_run",
    "group_pids",
    "grow",
    "itl_basis",
    "markdown",
    "parse_ints",
    "process_cpu_s",
    "run_engines",
]

HELP = "capacity at the SLO of 1, 2 and 3 real vLLM engines behind the router, and what limits it"
MODEL = "tiny-llama"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


# -- CPU accounting from /proc -------------------------------------------------------------------


def _stat_fields(pid: int, proc: Path = PROC) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3, the state, first); None when gone."""
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def process_cpu_s(pid: int, proc: Path = PROC) -> float | None:
    """CPU seconds ``pid`` has used (user + system, all its threads; not its reaped children), None when gone."""
    f = _stat_fields(pid, proc)
    if f is None:
        return None
    try:
        return (int(f[11]) + int(f[12])) / CLK_TCK  # fields 14 (utime) and 15 (stime), in clock ticks
    except (IndexError, ValueError):
        return None


def group_pids(pgid: int, proc: Path = PROC) -> list[int]:
    """The live processes whose process group is ``pgid`` (field 5 of their stat)."""
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        f = _stat_fields(int(entry.name), proc)
        if f is not None and len(f) > 2 and f[2] == str(pgid) and f[0] not in ("Z", "X"):
            out.append(int(entry.name))
    return sorted(out)


def group_cpu_s(pgid: int, proc: Path = PROC) -> float:
    """CPU seconds of the live processes of group ``pgid`` (a process that exited takes its seconds with it)."""
    return sum(process_cpu_s(p, proc) or 0.0 for p in group_pids(pgid, proc))


def machine_cpu_s(proc: Path = PROC) -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from ``/proc/stat``'s ``cpu`` line
    (busy: all but idle and iowait; guest time is already inside user)."""
    first = (proc / "stat").read_text().splitlines()[0].split()
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    total = sum(ticks)
    return (total - ticks[3] - ticks[4]) / CLK_TCK, total / CLK_TCK


@dataclass(frozen=True)
class CpuSample:
    """One reading: CPU seconds of each named group (engines by label), this process, the machine."""

    at_s: float
    groups: dict[str, float]
    client_s: float
    busy_s: float
    total_s: float


def cpu_sample(groups: Mapping[str, int], proc: Path = PROC, clock: Callable[[], float] = time.monotonic) -> CpuSample:
    """Read the CPU seconds of every group in ``groups`` (label -> process group), of this process and
    of the machine, now."""
    busy, total = machine_cpu_s(proc)
    return CpuSample(
        at_s=clock(),
        groups={label: group_cpu_s(pgid, proc) for label, pgid in groups.items()},
        client_s=process_cpu_s(os.getpid(), proc) or 0.0,
        busy_s=busy,
        total_s=total,
    )


def cpu_shares(before: CpuSample, after: CpuSample) -> dict[str, Any]:
    """Each group's, the client's, the others' and the idle share of the machine between two samples.

    A share is CPU seconds over the machine's CPU seconds in the interval (wall time x cores, read
    from ``/proc/stat`` so a core is counted only when the machine has it): 0.5 on 2 cores is one
    whole core.  ``other``: the machine's busy time that none of the named processes used.

    >>> a = CpuSample(0.0, {"e1": 1.0, "router": 0.0}, 2.0, 10.0, 20.0)
    >>> b = CpuSample(10.0, {"e1": 11.0, "router": 1.0}, 4.0, 25.0, 40.0)
    >>> cpu_shares(a, b)
    {'wall_s': 10.0, 'groups': {'e1': 0.5, 'router': 0.05}, 'client': 0.1, 'other': 0.1, 'idle': 0.25}
    """
    machine = after.total_s - before.total_s
    if machine <= 0:
        raise ValueError("cpu_shares: no machine time between the samples")
    used = {k: max(0.0, after.groups.get(k, 0.0) - v) for k, v in before.groups.items()}
    client = max(0.0, after.client_s - before.client_s)
    busy = after.busy_s - before.busy_s
    return {
        "wall_s": round(after.at_s - before.at_s, 3),
        "groups": {k: round(v / machine, 4) for k, v in used.items()},
        "client": round(client / machine, 4),
        "other": round(max(0.0, busy - client - sum(used.values())) / machine, 4),
        "idle": round(max(0.0, machine - busy) / machine, 4),
    }


# -- the table -----------------------------------------------------------------------------------


def _pct(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{100 * v:.{digits}f} %"


def markdown(meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """One row per (max-num-seqs, engines): the capacity, its ratio to one engine of the same batch limit,
    the output tokens/s of the trial at the capacity, its attainment and P95 TTFT, and the CPU shares."""
    slo = meta["slo"]
    lines = [
        f"`{meta['command']}` (SLO: TTFT {slo['ttft_slo_ms']:g} ms, ITL {slo['itl_slo_ms']:g} ms)",
        "",
        "| engines | confined | max-num-seqs | capacity, req/s | x 1 engine | tokens/s | attainment, P95 TTFT at capacity "
        "| CPU share of the machine: engines (each) | router | client | other | idle |",
        "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        at = r.get("at_capacity")
        at_text = "-" if not at else f"{_pct(at['attainment'], 1)}, {at['p95_ttft_ms']:.0f} ms"
        cpu = r.get("cpu_share") or {}
        engines = " + ".join(_pct(s) for s in cpu.get("engines", [])) or "-"
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f}"
        tokens = "-" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:.0f}"
        lines.append(
            f"| {r['engines']} | {'yes' if r.get('confined', True) else 'no'} | {r['max_num_seqs']} "
            f"| {r['capacity_rps']:.2f} | {ratio} | {tokens} | {at_text} "
            f"| {engines} | {_pct(cpu.get('router'))} | {_pct(cpu.get('client'))} | {_pct(cpu.get('other'))} "
            f"| {_pct(cpu.get('idle'))} |"
        )
    return "\n".join(lines)


def trials_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """Every capacity trial: rate -> attainment / P95 TTFT (ms), pass or fail.

    >>> print(trials_text([{"engines": 1, "max_num_seqs": 4, "trials": [
    ...     {"rate_rps": 1.0, "attainment": 1.0, "p95_ttft_ms": 20.0, "passed": True}]}]))
    trials, 1 engine(s), max-num-seqs 4: 1 req/s 100.0 % 20 ms ok
    """
    out = []
    for r in rows:
        parts = [
            f"{t['rate_rps']:g} req/s {_pct(t['attainment'], 1)} "
            f"{'-' if t.get('p95_ttft_ms') is None else format(t['p95_ttft_ms'], '.0f')} ms "
            f"{'ok' if t['passed'] else 'miss'}"
            for t in r["trials"]
        ]
        out.append(f"trials, {r['engines']} engine(s), max-num-seqs {r['max_num_seqs']}: " + "; ".join(parts))
    return "\n".join(out)


def summarize(
    engines: int, max_num_seqs: int, cap: CapacityProfile, shares: Mapping[str, Any], labels: Sequence[str]
) -> dict[str, Any]:
    """A table row from one size's capacity profile and CPU shares (ratio filled in by the caller)."""
    at = [t for t in cap.trials if t["passed"] and t["rate_rps"] == round(cap.capacity_rps, 3)]
    best = at[-1] if at else None
    tokens = None
    if best and best.get("duration_s"):
        tokens = round(best["output_tokens"] / best["duration_s"], 1)
    return {
        "engines": engines,
        "max_num_seqs": max_num_seqs,
        "capacity_rps": cap.capacity_rps,
        "ratio": None,
        "tokens_per_s": tokens,
        "at_capacity": None if best is None else {"attainment": best["attainment"], "p95_ttft_ms": best["p95_ttft_ms"]},
        "cpu_share": {
            "engines": [shares["groups"].get(lb, 0.0) for lb in labels],
            "router": shares["groups"].get("router", 0.0),
            "client": shares["client"],
            "other": shares["other"],
            "idle": shares["idle"],
            "wall_s": shares["wall_s"],
        },
        "trials": cap.trials,
    }


# -- the run -------------------------------------------------------------------------------------


def itl_basis(base: Unloaded, output_tokens: int) -> Unloaded:
    """``base`` with its ITL P95 at least the unloaded time per output token (mean end-to-end / tokens).

    Through the router the client often gets a completion's tokens in a few bursts: its ITL P95 then
    reads 0.01 ms to 2 ms from one run to the next, and an SLO stated on it (floored at 1 ms) fails
    every request.  The time per token of the whole request is what a token costs whatever the
    chunking.

    >>> itl_basis(Unloaded(20, 0.068, 0.09, 1e-05, 1e-05, 0.0728), 32).itl_p95_s
    0.002275
    """
    return dataclasses.replace(base, itl_p95_s=max(base.itl_p95_s, base.e2e_mean_s / max(1, output_tokens)))


def _say(msg: str) -> None:
    print(f"[bench engines] {msg}", file=sys.stderr, flush=True)


def parse_ints(text: str, name: str, lo: int, hi: int) -> tuple[int, ...]:
    """``"1,4"`` as ints in [lo, hi], strictly increasing (``SystemExit`` naming ``name`` otherwise).

    >>> parse_ints("1, 2,3", "--sizes", 1, 3)
    (1, 2, 3)
    """
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"{name} {text!r}: give a comma list of integers") from None
    if not out or any(not lo <= v <= hi for v in out) or list(out) != sorted(set(out)):
        raise SystemExit(f"{name} {text!r}: increasing integers in [{lo}, {hi}]")
    return out


async def grow(pool: EnginePool, n: int, timeout_s: float) -> None:
    """Scale ``pool`` to ``n`` engines and wait until all ``n`` are ready and in the router."""
    res = await pool.scale_to(n)
    if res["failed"]:
        raise RuntimeError(f"engine start failed: {res['failed']}")
    deadline = time.monotonic() + timeout_s
    while True:
        ready = {e["url"] for e in pool.engines() if e["state"] == "ready"}
        routed = set(await pool.router.list_workers())
        if len(ready) == n and ready <= routed:
            return
        if pool.failed_starts or pool.deaths:
            raise RuntimeError(f"engine lost while starting: failed {pool.failed_starts}, deaths {pool.deaths}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} engines not ready and routed after {timeout_s:.0f} s: {pool.engines()}")
        await asyncio.sleep(1.0)


async def _bench(
    a: argparse.Namespace, python: Path, model_dir: Path, run_dir: Path, pools: list[Path]
) -> dict[str, Any]:
    router = start_router(free_port(), free_port(), run_dir / "router.log")
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"command": a.command_line, "slo": None, "startup_s": []}
    shape = {"prompt_tokens": a.prompt_tokens, "output_tokens": a.output_tokens}
    try:
        await router.wait_healthy()
        for confine, m in [(c, m) for c in a.confine_list for m in a.seqs]:
            state = run_dir / f"pool-m{m}-confine{int(confine)}"
            pools.append(state)
            spec = EngineSpec(
                python=str(python), model_dir=str(model_dir), served_name=MODEL, model=MODEL, zone="local",
                max_num_seqs=m, cores=a.core_list, drain_timeout_s=10.0, grace_s=5.0, confine=confine,
            )  # fmt: skip
            pool = EnginePool(spec, RouterClient(router.url), state)
            try:
                for n in a.size_list:
                    t0 = time.monotonic()
                    _say(f"max-num-seqs {m}: scaling to {n} engine(s) (a cold start takes 40 s to 3 min here)")
                    await grow(pool, n, a.start_timeout_s)
                    meta["startup_s"].append(round(time.monotonic() - t0, 1))
                    first = meta["slo"] is None
                    base = await unloaded(router.url, MODEL, n=20 if first else 10, warmup=8 * n, **shape)
                    if first:
                        ttft, itl = slos_from(itl_basis(base, a.output_tokens), a.slo_multiple)
                        meta["slo"] = {"ttft_slo_ms": ttft, "itl_slo_ms": itl, "multiple": a.slo_multiple,
                                       "unloaded": base.as_dict()}  # fmt: skip
                        _say(f"SLO ({a.slo_multiple:g}x the unloaded P95 of 1 engine): TTFT {ttft} ms, ITL {itl} ms")
                    engines = pool.engines()
                    labels = [f"engine:{e['port']}" for e in engines]
                    groups = {lb: int(e["pid"]) for lb, e in zip(labels, engines, strict=True)}
                    groups["router"] = router.pid
                    before = cpu_sample(groups)
                    cap = await capacity_at_slo(
                        router.url, MODEL,
                        ttft_slo_ms=meta["slo"]["ttft_slo_ms"], itl_slo_ms=meta["slo"]["itl_slo_ms"],
                        lo_rps=a.lo_rps, hi_rps=a.hi_rps, steps=a.steps, trial_s=a.trial_s, target=a.target,
                        seed=a.seed, on_trial=lambda t: _say(
                            f"  {t['rate_rps']:g} req/s: attainment {100 * t['attainment']:.1f} %, "
                            f"P95 TTFT {t['p95_ttft_ms']} ms"),
                        **shape,
                    )  # fmt: skip
                    shares = cpu_shares(before, cpu_sample(groups))
                    if pool.deaths:
                        raise RuntimeError(f"an engine died during the trials ({pool.deaths})")
                    row = summarize(n, m, cap, shares, labels)
                    row["confined"] = confine
                    row["unloaded"] = base.as_dict()
                    row["cores"] = [e["core"] for e in engines]
                    one = next(
                        (r for r in rows if r["max_num_seqs"] == m and r["engines"] == 1 and r["confined"] == confine),
                        None,
                    )
                    if one is not None and one["capacity_rps"] > 0:
                        row["ratio"] = round(row["capacity_rps"] / one["capacity_rps"], 3)
                    elif n == 1:
                        row["ratio"] = 1.0
                    rows.append(row)
                    _say(f"max-num-seqs {m}, {n} engine(s): {cap.capacity_rps:g} req/s at the SLO")
            finally:
                await pool.close(stop_engines=True)
    finally:
        router.stop()
    return {"meta": meta, "rows": rows}


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _kill_leftovers(pools: Sequence[Path]) -> None:
    """SIGKILL every process still carrying one of this run's pool variables (only those: pool_processes)."""
    for state in pools:
        for pid in pool_processes(str(state.resolve())):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


#: the options: (flag, type, default, help)
OPTIONS: tuple[tuple[str, type, Any, str], ...] = (
    ("--max-num-seqs", str, "4", "engine batch limits to try, a comma list (default 4)"),
    ("--sizes", str, "1,2,3", "pool sizes, increasing (default 1,2,3)"),
    ("--cores", str, "0,1", "the cores engines are pinned to, round-robin (default 0,1)"),
    ("--confine", str, "1", "1: every process of an engine on its core; 0: its compute thread only; 0,1: both"),
    ("--slo-multiple", float, 5.0, "SLO = this x the 1-engine unloaded P95 (5)"),
    ("--trial-s", float, 10.0, "seconds of each capacity trial (10)"),
    ("--steps", int, 4, "bisection steps after the bracket's two trials (4)"),
    ("--lo-rps", float, 1.0, "the bracket's low rate, req/s (1)"),
    ("--hi-rps", float, 64.0, "the bracket's high rate, req/s (64)"),
    ("--target", float, 0.95, "attainment the capacity must keep (0.95)"),
    ("--prompt-tokens", int, 64, "prompt tokens of every request (64)"),
    ("--output-tokens", int, 32, "output tokens of every request (32)"),
    ("--seed", int, 0, "seed of the Poisson arrivals (0)"),
    ("--start-timeout-s", float, 360.0, "wait for each size's engines (360)"),
    ("--out", str, "runs/bench-engines", "run directory (engine and router logs)"),
    ("--json", str, "", "also write the rows and every trial here"),
)


def add_parser(sub: Any) -> None:
    add_options(sub.add_parser("engines", help=HELP), OPTIONS)


def add_options(p: argparse.ArgumentParser, options: Sequence[tuple[str, type, Any, str]]) -> None:
    """A real-engine benchmark's options: (flag, type, default, help) each."""
    for flag, kind, default, text in options:
        p.add_argument(flag, type=kind, default=default, help=text)


BenchBody = Callable[[Path, Path, list[Path]], Coroutine[Any, Any, dict[str, Any]]]


def engine_run(settings: Settings, name: str, body: BenchBody) -> dict[str, Any] | int:
    """Run ``body(python, model_dir, pools)`` with the engine venv and the tiny model (made if missing),
    appending each pool's state directory to ``pools`` as it starts one; what it returns with its
    ``meta.wall_s``, or an exit code (2: no engine venv, 130: interrupted).  Every engine it starts is
    stopped whatever happens (:func:`_kill_leftovers`)."""
    try:
        python = setup.engine_python(settings, say=_say)
        model_dir = setup.ensure_model(python, setup.engine_home(settings), seed=0, say=_say)
    except setup.EngineSetupError as exc:
        print(f"governor bench {name}: {exc}", file=sys.stderr)
        return 2
    pools: list[Path] = []
    wall0 = time.monotonic()
    # SIGTERM and SIGINT (which a shell's background job inherits ignored) stop the run through its
    # finally blocks: the pools stop their engines and the router its group
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        out = asyncio.run(body(python, model_dir, pools))
    except KeyboardInterrupt:
        print(f"governor bench {name}: interrupted; its engines and router are stopped", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _kill_leftovers(pools)
    out["meta"]["wall_s"] = round(time.monotonic() - wall0, 1)
    return out


def run_engines(settings: Settings, a: argparse.Namespace) -> int:
    a.seqs = parse_ints(a.max_num_seqs, "--max-num-seqs", 1, 256)
    a.size_list = parse_ints(a.sizes, "--sizes", 1, 8)
    a.core_list = tuple(int(c) for c in a.cores.split(","))
    a.confine_list = tuple(bool(x) for x in parse_ints(a.confine, "--confine", 0, 1))
    if not (0 < a.lo_rps < a.hi_rps) or a.trial_s <= 0 or a.steps < 0 or a.slo_multiple <= 0:
        raise SystemExit("need 0 < --lo-rps < --hi-rps, --trial-s > 0, --steps >= 0, --slo-multiple > 0")
    a.command_line = "governor " + shlex.join(sys.argv[1:]) if "engines" in sys.argv else "governor bench engines"
    run_dir = Path(a.out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    out = engine_run(settings, "engines", lambda python, model_dir, pools: _bench(a, python, model_dir, run_dir, pools))
    if isinstance(out, int):
        return out
    print(markdown(out["meta"], out["rows"]))
    print()
    print(trials_text(out["rows"]))
    print(f"\nwall {out['meta']['wall_s']:.0f} s; engine starts per size {out['meta']['startup_s']} s")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2, default=str))
    return 0
