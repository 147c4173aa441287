"""The shared harness of the traffic benchmarks (``governor bench traffic``).

A fixed fleet (:mod:`sim.fleet`) replays one seeded workload window by
window; after each window a *policy* sees that window's finished requests
and sets the fleet's routing weights for the next one.  Arms of one
scenario differ only in their policy, so their GPU-seconds are equal.
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

from controllers import breaker as brk
from controllers import routing as rt
from sim.fleet import Fleet, FleetConfig
from sim.perf_model import PerfModel

PRIMARY, FALLBACK, FAMILY = "bloom-176b", "llama2-70b", "chat"
CLASSES = {c.name: c for c in rt.DEFAULT_CLASSES}
CLASS_MIX = {"trading": 0.3, "voice": 0.4, "batch": 0.3}
# (prompt median, output median) tokens per class; lognormal, sigma 0.5
CLASS_TOKENS = {"trading": (400, 16), "voice": (600, 48), "batch": (1500, 200)}
ZONES = ("az-a", "az-b")

Policy = Callable[[Fleet, float, list[dict[str, Any]]], None]


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
    window_s: float,
    setup: Callable[[Fleet], None],
    policy: Policy,
    drain_s: float = 300.0,
    family: str = FAMILY,
) -> tuple[list[dict[str, Any]], Fleet]:
    """Replay ``arrivals`` window by window, calling ``policy`` after each; return all records."""
    fleet = Fleet(cfg, epoch_ms0=0)
    setup(fleet)
    policy(fleet, 0.0, [])
    recs: list[dict[str, Any]] = []
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


def static_policy(weights: dict[str, float]) -> Policy:
    """Fixed weights for every class."""

    def pol(f: Fleet, t: float, win: list[dict[str, Any]]) -> None:
        if t == 0.0:
            f.set_routing(FAMILY, weights, t)

    return pol


def _target_windows(win: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in win:
        by[f"{r['model']}|{r['zone']}"].append(r)
    return by


class ControlledRouting:
    """controllers.routing every window, optionally with a breaker per target."""

    def __init__(
        self,
        targets: list[rt.Target],
        caps: dict[rt.Target, float],
        window_s: float,
        params: rt.RoutingParams,
        breaker: brk.BreakerParams | None = None,
    ) -> None:
        self.targets, self.caps, self.window_s, self.params = targets, caps, window_s, params
        self.state = rt.RoutingState()
        self.breaker = breaker
        self.bstate = {t: brk.BreakerState() for t in targets}
        self.attain = brk.AttainmentHistory(window_s=window_s, horizon_s=300.0)
        self.timeline: list[dict[str, Any]] = []
        self.fallback_windows: dict[str, int] = defaultdict(int)

    def __call__(self, f: Fleet, t: float, win: list[dict[str, Any]]) -> None:
        if t == 0.0:
            prim = {tg.key: self.caps[tg] for tg in self.targets if tg.variant == self.params.primary}
            f.set_routing(FAMILY, prim, t)
            return
        by = _target_windows(win)
        self.attain = self.attain.add(len(win), sum(on_time(r) for r in win))
        obs = {}
        for tg in self.targets:
            rs = by.get(tg.key, [])
            state: brk.StateName = "closed"
            if self.breaker is not None:
                errs = sum(r.get("status") == "error" for r in rs)
                self.bstate[tg], out = brk.step(
                    self.breaker, self.bstate[tg], brk.BreakerObs(len(rs), errs, self.attain.attainment()), t
                )
                state = out.state_name
                if out.changed:
                    self.timeline.append({"t_s": t, "target": tg.key, "state": state, "reason": out.reason})
            obs[tg] = rt.TargetObs(
                ttft_p95_ms=_pct([r["ttft_ms"] for r in rs], 95),
                e2e_p95_ms=_pct([r["e2e_ms"] for r in rs], 95),
                queue_len=float(f.queued(tg.zone, tg.variant)),
                rate_rps=len(rs) / self.window_s,
                capacity_rps=self.caps[tg],
                breaker=state,
            )
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
    return (
        f"  {name:15s} ttft p50/p95/p99 {ms(s['ttft_p50_ms'])}{ms(s['ttft_p95_ms'])}{ms(s['ttft_p99_ms'])}"
        f"  e2e p95/p99 {ms(s['e2e_p95_ms'])}{ms(s['e2e_p99_ms'])}  on-time {s['on_time'] * 100:5.1f}%"
        f"  err {s['error_rate'] * 100:5.2f}%  gpu-s {s['gpu_seconds']:.0f}  [{pc}]"
    )
