"""Simulated multi-zone command timing: RTT, jitter, clock drift, HLC and compensation (docs/model.md §17 (hlc)).

One issuer (the control plane, in the reference zone, whose clock is true
time) sends a command to every zone's executor. Each zone has a probe RTT
(lognormal, mean ``rtt_ms``, std ``jitter_ms``) split asymmetrically into a
forward and a return path, a command path slower than the probes by
``command_factor`` (stream and bridge hops; the estimator does not know it),
a clock ``C_z(t) = t + offset_ms + drift_ppm * 1e-6 * t``, and an apply time
``compute_ms`` (compute heterogeneity, not compensated).

Every ``probe_period_s`` the issuer runs an NTP exchange per zone
(:class:`controllers.hlc.ClockOffsetEstimator`) and records the probe RTT
(:class:`controllers.hlc.RttEstimator`). Every ``command_period_s`` it issues
an HLC-stamped command (now and then a second one 1 ms later, so the two
can arrive out of order); executors merge the HLC and refuse a command
whose HLC is older than the last applied. Two policies, on the same draws:

- ``uncompensated``: apply on arrival.
- ``compensated``: the command carries ``apply_at = t + max_z(base_z * factor_z)``
  (issuer clock); zone ``z`` applies when its clock reads ``apply_at +
  offset_estimate_z``, or on arrival if later. The factor is learned from
  command acknowledgements unless configured.

Measured per pair (reference zone, z) over commands: the effect-time
difference (``sigma`` = its standard deviation, ``mean_abs``), and the design source's
model ``eps_sync = dt_net + alpha * df_clock + beta * |C_ref - C_z|`` from its
measured terms: ``dt_net`` the mean network timing error left (late
arrivals; the one-way delay difference when uncompensated), ``df_clock`` the
mean absolute clock-offset estimation error, ``C`` the apply times.

Examples
--------
>>> rep = run_zones(duration_s=120.0, seed=1)
>>> sorted(rep["pairs"])
['az-a<->az-b', 'az-a<->az-c']
>>> p = rep["pairs"]["az-a<->az-b"]
>>> p["compensated"]["sigma_ms"] < p["uncompensated"]["sigma_ms"]
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from controllers.hlc import ClockOffsetEstimator, Hlc, RttEstimator

__all__ = ["DEFAULT_ZONES", "SEED_FIGURES", "ZoneSpec", "run_zones"]

# The design source's reported sync sigma and delay increase per zone pair (docs/model.md §17 (hlc)):
# printed next to the measured ones by ``governor bench kv``, never used as constants.
SEED_FIGURES = {
    "az-a<->az-b": {"rtt_ms": 18.7, "sigma_ms": 4.2, "delay_increase_pct": 23.0},
    "az-a<->az-c": {"rtt_ms": 9.3, "sigma_ms": 1.8, "delay_increase_pct": 8.0},
}


@dataclass(frozen=True)
class ZoneSpec:
    """Injected timing of one zone (relative to the issuer; ms, ppm)."""

    name: str
    rtt_ms: float
    jitter_ms: float
    drift_ppm: float = 0.0
    offset_ms: float = 0.0
    command_factor: float = 1.0
    compute_ms: float = 2.0
    forward_share: float = 0.5  # mean share of the RTT on the issuer -> zone path

    def clock(self, t_ms: float) -> float:
        return t_ms + self.offset_ms + self.drift_ppm * 1e-6 * t_ms

    def true_time(self, local_ms: float) -> float:
        return (local_ms - self.offset_ms) / (1.0 + self.drift_ppm * 1e-6)


DEFAULT_ZONES = (
    ZoneSpec("az-a", 0.4, 0.1, 0.0, 0.0, 1.0, 2.0),
    ZoneSpec("az-b", 18.7, 3.5, 25.0, 41.0, 1.35, 4.0, 0.55),
    ZoneSpec("az-c", 9.3, 1.5, -12.0, -17.0, 1.12, 2.5, 0.5),
)


def _rtt(rng: np.random.Generator, z: ZoneSpec, n: int) -> np.ndarray:
    s2 = math.log1p((z.jitter_ms / z.rtt_ms) ** 2)
    return rng.lognormal(math.log(z.rtt_ms) - s2 / 2, math.sqrt(s2), n)


def _split(rng: np.random.Generator, z: ZoneSpec, rtt: float) -> tuple[float, float]:
    share = min(max(rng.normal(z.forward_share, 0.05), 0.2), 0.8)
    return rtt * share, rtt * (1 - share)


def run_zones(
    zones: Sequence[ZoneSpec] = DEFAULT_ZONES,
    duration_s: float = 600.0,
    probe_period_s: float = 1.0,
    command_period_s: float = 5.0,
    alpha: float = 1.0,
    beta: float = 1.0,
    factors: Mapping[str, float] | None = None,
    seed: int = 0,
    burst_every: int = 4,
) -> dict[str, Any]:
    """Run the timing simulation; returns a report dict (see the module docstring).

    ``factors`` configures per-zone factors (e.g. the design source's
    ``{'az-b': 1.35, 'az-c': 1.12}``, docs/model.md §17 (hlc)); None learns
    them from command acknowledgements.
    """
    ref, names = zones[0], [z.name for z in zones]
    rng = np.random.default_rng(seed)
    rtt_est = RttEstimator(factors=dict(factors or {}))
    off_est = {z.name: ClockOffsetEstimator() for z in zones}
    issuer, last_applied = Hlc(), {z.name: Hlc() for z in zones}
    hlc_in = {z.name: Hlc() for z in zones}
    rows: list[dict[str, dict[str, float]]] = []
    refused = applied = sent = 0
    max_hlc_drift = 0
    n_probes = int(duration_s / probe_period_s)
    cmd_every = max(1, round(command_period_s / probe_period_s))
    for k in range(n_probes):
        t = k * probe_period_s * 1000.0
        for z in zones:  # NTP exchange + probe RTT
            rtt = float(_rtt(rng, z, 1)[0])
            fwd, back = _split(rng, z, rtt)
            t1 = z.clock(t + fwd)
            off_est[z.name] = off_est[z.name].sample(t, t1, t1 + 0.05, t + fwd + 0.05 + back)
            rtt_est = rtt_est.probe(z.name, rtt)
        if k < 5 or k % cmd_every:
            continue
        burst = 2 if burst_every and (k // cmd_every) % burst_every == 0 else 1
        for b in range(burst):
            tc = t + 10.0 + b * 1.0
            issuer = issuer.tick(int(tc))
            stamp = issuer
            sent += 1
            lead = max(rtt_est.compensation_ms(n) for n in names)
            row: dict[str, dict[str, float]] = {}
            for z in zones:
                crtt = float(_rtt(rng, z, 1)[0]) * z.command_factor
                fwd, _ = _split(rng, z, crtt)
                arrive = tc + fwd
                hlc_in[z.name] = hlc_in[z.name].receive(stamp, int(z.clock(arrive)))
                max_hlc_drift = max(max_hlc_drift, hlc_in[z.name].drift_ms(int(z.clock(arrive))))
                target = z.true_time(tc + lead + off_est[z.name].offset_ms())
                row[z.name] = {
                    "arrive": arrive,
                    "target": target,
                    "issue": tc,
                    "hlc": stamp.encode(),
                    "off_err": abs(off_est[z.name].offset_ms() - (z.clock(tc) - tc)),
                }
                rtt_est = rtt_est.observe_delay(z.name, crtt)
            rows.append(row)
        # executors apply in arrival order; a command older (HLC) than the last applied is refused
        for z in zones:
            for r in sorted(
                rows[-burst:],
                key=cast("Callable[[dict[str, dict[str, float]]], float]", lambda r, n=z.name: r[n]["arrive"]),
            ):
                e, stamp = r[z.name], Hlc.decode(int(r[z.name]["hlc"]))
                e["applied"] = float(stamp > last_applied[z.name])
                if e["applied"]:
                    last_applied[z.name] = stamp
                    applied += 1
                else:
                    refused += 1
    rows = [r for r in rows if all(e["applied"] for e in r.values())]  # applied everywhere
    return _report(zones, ref, rows, rtt_est, off_est, alpha, beta, sent, applied, refused, max_hlc_drift, factors)


def _report(
    zones: Sequence[ZoneSpec],
    ref: ZoneSpec,
    rows: list[dict[str, dict[str, float]]],
    rtt_est: RttEstimator,
    off_est: Mapping[str, ClockOffsetEstimator],
    alpha: float,
    beta: float,
    sent: int,
    applied: int,
    refused: int,
    max_hlc_drift: int,
    factors: Mapping[str, float] | None,
) -> dict[str, Any]:
    comp = {
        z.name: np.array([max(r[z.name]["arrive"], r[z.name]["target"]) + z.compute_ms for r in rows]) for z in zones
    }
    raw = {z.name: np.array([r[z.name]["arrive"] + z.compute_ms for r in rows]) for z in zones}
    issue = np.array([r[ref.name]["issue"] for r in rows])
    pairs = {}
    for z in zones[1:]:
        late = np.array(
            [
                max(0.0, r[z.name]["arrive"] - r[z.name]["target"])
                - max(0.0, r[ref.name]["arrive"] - r[ref.name]["target"])
                for r in rows
            ]
        )
        off_err = np.array([r[z.name]["off_err"] + r[ref.name]["off_err"] for r in rows])
        dc = abs(ref.compute_ms - z.compute_ms)
        one_way = np.array([r[z.name]["arrive"] - r[ref.name]["arrive"] for r in rows])
        out: dict[str, Any] = {
            "rtt_ms": z.rtt_ms,
            "base_rtt_ms": rtt_est.base_ms(z.name),
            "factor": rtt_est.factor(z.name),
            "factor_true": z.command_factor,
        }
        for name, eff, dt_net, df in (
            ("compensated", comp, float(np.mean(np.abs(late))), float(np.mean(off_err))),
            ("uncompensated", raw, float(np.mean(np.abs(one_way))), 0.0),
        ):
            d = eff[z.name] - eff[ref.name]
            out[name] = {
                "sigma_ms": float(np.std(d)),
                "mean_abs_ms": float(np.mean(np.abs(d))),
                "p95_abs_ms": float(np.percentile(np.abs(d), 95)),
                "dt_net_ms": dt_net,
                "df_clock_ms": df,
                "dC_ms": dc,
                "eps_sync_model_ms": dt_net + alpha * df + beta * dc,
                "delay_ms": float(np.mean(eff[z.name] - issue)),
            }
        out["delay_increase_pct"] = 100.0 * (out["compensated"]["delay_ms"] / out["uncompensated"]["delay_ms"] - 1)
        pairs[f"{ref.name}<->{z.name}"] = out
    spread = {
        name: np.ptp(np.vstack([eff[z.name] for z in zones]), axis=0)
        for name, eff in (("compensated", comp), ("uncompensated", raw))
    }
    return {
        "commands": sent,
        "applied": applied,
        "refused_stale": refused,
        "max_hlc_drift_ms": max_hlc_drift,
        "factors": "configured" if factors else "learned",
        "alpha": alpha,
        "beta": beta,
        "pairs": pairs,
        "spread_ms": {
            k: {"p50": float(np.median(v)), "p95": float(np.percentile(v, 95)), "max": float(np.max(v))}
            for k, v in spread.items()
        },
        "offset_error_ms": {
            z.name: abs(off_est[z.name].offset_ms() - (z.clock(float(issue[-1])) - float(issue[-1]))) for z in zones
        },
        "seed_figures": SEED_FIGURES,
    }
