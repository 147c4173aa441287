"""``governor bench router``: the vLLM router's cache_aware against round_robin on real engines, shared prefixes.

Starts ``--engines`` local vLLM engines (the tiny model, :mod:`engines.pool`), then
for each policy a router (:func:`engines.router.start_router` with a
``GOVERNOR_LOCAL_ROUTER_POLICY`` value) with the same engines added, and replays
one short open-loop load through it (:func:`engines.loadgen.replay`): requests
in ``--groups`` groups, each request's prompt its group's shared
``--prefix-tokens`` then tokens of its own.  Each policy gets groups of its own
(fresh prefixes, so the first policy's cache does not serve the second).
Printed per policy: P95 TTFT at the client, the engines' prefix cache hits over
queries (``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``,
summed over the engines, the run's increase) and the requests per engine.
Run it under ``flock /tmp/governor-heavy.lock``: the engines take the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.engines import engine_run
from core.settings import Settings
from engines.loadgen import RequestSpec, percentile, replay
from engines.pool import EnginePool, EngineSpec, free_port
from engines.router import RouterClient, policy_args, start_router

__all__ = ["add_parser", "run_router_bench"]

MODEL = "tiny"
_COUNTER = re.compile(r"^(vllm:(?:prefix_cache_(?:hits|queries)|request_success)_total)\{[^}]*\} ([0-9.e+-]+)$", re.M)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("router", help="the vLLM router's cache_aware vs round_robin on real engines, shared prefixes")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--cores", default="0,1", help="cores the engines are pinned to, round-robin")
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--rate", type=float, default=4.0, help="requests per second (Poisson)")
    p.add_argument("--groups", type=int, default=6, help="prefix groups")
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--prompt-tokens", type=int, default=1100)
    p.add_argument("--output-tokens", type=int, default=8)
    p.add_argument(
        "--policies",
        default="round_robin;cache_aware,cache_threshold=0.3,balance_abs_threshold=4,balance_rel_threshold=1.5",
        help="GOVERNOR_LOCAL_ROUTER_POLICY values to compare, ';'-separated",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout-s", type=float, default=200.0)
    p.add_argument("--out", default="runs/bench-router")


def _counters(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for name, value in _COUNTER.findall(text):
        out[name] = out.get(name, 0.0) + float(value)
    return out


def _specs(a: argparse.Namespace, arm: int) -> list[RequestSpec]:
    rng = random.Random(a.seed * 1000 + arm)
    t, out = 0.0, []
    for _ in range(a.requests):
        t += rng.expovariate(a.rate)
        group = 1000 * (arm + 1) + rng.randrange(a.groups)  # each arm its own prefixes
        out.append(RequestSpec(t, a.prompt_tokens, a.output_tokens, prefix=group, prefix_tokens=a.prefix_tokens))
    return out


async def _bench(a: argparse.Namespace, python: Path, model_dir: Path, run_dir: Path) -> dict[str, Any]:
    policies = [p.strip() for p in a.policies.split(";") if p.strip()]
    for p in policies:
        policy_args(p)  # a bad value fails before any engine starts
    spec = EngineSpec(
        python=str(python), model_dir=str(model_dir), served_name=MODEL, model=MODEL, zone="local",
        max_num_seqs=4, cores=tuple(int(c) for c in a.cores.split(",")), drain_timeout_s=5.0, grace_s=5.0,
        confine=True,
    )  # fmt: skip
    first = start_router(free_port(), free_port(), run_dir / "router-0.log", policies[0])
    pool = EnginePool(spec, RouterClient(first.url), run_dir / "pool")
    routers = [first]
    res: dict[str, Any] = {}
    try:
        await first.wait_healthy()
        t0 = time.monotonic()
        out = await pool.scale_to(a.engines)
        deadline = time.monotonic() + a.start_timeout_s
        while len([e for e in pool.engines() if e["state"] == "ready"]) < a.engines:
            if out["failed"] or pool.failed_starts or time.monotonic() > deadline:
                raise RuntimeError(f"engines not ready: {pool.engines()}")
            await asyncio.sleep(1.0)
        urls = [e["url"] for e in pool.engines()]
        res["startup_s"] = round(time.monotonic() - t0, 1)
        for k, policy in enumerate(policies):
            router = first if k == 0 else start_router(free_port(), free_port(), run_dir / f"router-{k}.log", policy)
            if k:
                routers.append(router)
                await router.wait_healthy()
                client = RouterClient(router.url)
                for u in urls:
                    await client.add_worker(u)
                await client.close()
            else:
                while set(await pool.router.list_workers()) < set(urls):
                    await asyncio.sleep(0.5)
            before = {u: _counters(u) for u in urls}
            load = await replay(router.url, MODEL, _specs(a, k), concurrency=32, timeout_s=60.0)
            after = {u: _counters(u) for u in urls}
            delta = {u: {n: after[u].get(n, 0.0) - before[u].get(n, 0.0) for n in after[u]} for u in urls}
            hits = sum(d.get("vllm:prefix_cache_hits_total", 0.0) for d in delta.values())
            queries = sum(d.get("vllm:prefix_cache_queries_total", 0.0) for d in delta.values())
            ttft = [r.ttft_s * 1000.0 for r in load.results if r.status == "ok" and r.ttft_s is not None]
            res[policy] = {
                "ok": sum(r.status == "ok" for r in load.results),
                "requests": len(load.results),
                "p50_ttft_ms": percentile(ttft, 50),
                "p95_ttft_ms": percentile(ttft, 95),
                "prefix_cache_hit_rate": hits / queries if queries else None,
                "per_engine": [int(d.get("vllm:request_success_total", 0.0)) for d in delta.values()],
            }
            if k:
                router.stop()
    finally:
        await pool.close(stop_engines=True)
        for r in routers:
            r.stop()
    return res


def run_router_bench(settings: Settings, a: argparse.Namespace) -> int:
    run_dir = Path(a.out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)

    async def body(python: Path, model_dir: Path, pools: list[Path]) -> dict[str, Any]:
        pools.append(run_dir / "pool")  # stopped whatever happens (bench.engines.engine_run)
        return {"meta": {}, **await _bench(a, python, model_dir, run_dir)}

    out = engine_run(settings, "router", body)
    if isinstance(out, int):
        return out
    res = {k: v for k, v in out.items() if k != "meta"}
    (run_dir / "report.json").write_text(json.dumps(res, indent=2))
    print(
        f"{a.engines} engines (started in {res.pop('startup_s')} s), {a.requests} requests at {a.rate:g}/s, "
        f"{a.groups} groups sharing {a.prefix_tokens} of {a.prompt_tokens} prompt tokens"
    )
    for policy, r in res.items():
        hit = "-" if r["prefix_cache_hit_rate"] is None else f"{r['prefix_cache_hit_rate']:.1%}"
        print(
            f"{policy}: ok {r['ok']}/{r['requests']}, P50 TTFT {r['p50_ttft_ms']:.0f} ms, "
            f"P95 TTFT {r['p95_ttft_ms']:.0f} ms, prefix cache hits {hit}, requests per engine {r['per_engine']}"
        )
    return 0
