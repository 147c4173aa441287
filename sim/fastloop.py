"""Fast, deterministic closed loop: the fleet, the pipeline's window code and
an autoscaler, with no broker, no Redis and no wall clock.

It replays a workload through :class:`sim.fleet.Fleet` in ticks of trace time
and feeds every finished-request and GPU record through the *same*
:class:`loop.control_loop.ControlLoop` the stream worker runs (its
processor makes the windows, DDSketch and all).  ``governor`` decides with that
loop's drivers on the typed window records, as the worker does; baselines (:mod:`sim.baselines`) decide from the same
windows plus instantaneous fleet observations, every ``period_s``.  Decisions
reach the fleet after ``actuation_delay_s`` (command path + API latency).
Everything is seeded; the same inputs give the same run.

The global balancer in front of the zones sends each request to a seeded
uniform zone; a cut zone's requests go to the reachable ones.  With
``LoopConfig.balancer="health"`` it also skips zones with no ready replica
(a load balancer's health check).  For ``governor`` it follows the Scaler's
zone weights (:meth:`loop.scaler_driver.Scaler.zone_weights`) whenever they
are not uniform, i.e. while zone-aware capacity keeps traffic off a lost or
healing zone -- the fast loop's stand-in for the ``route`` commands the
worker would send to the gateways.

Cost accounting per tick: provisioned GPU-seconds count every replica that
holds GPUs (starting, ready, draining) times ``gpus_per_replica``; busy
GPU-seconds weight ready replicas by their measured busy fraction; waste is
``1 - busy / provisioned``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from controllers.window_record import decode_window
from core.defaults import COMMAND_TTL_S, WINDOW_S
from core.settings import DEFAULT_MODELS, ModelSpec, Settings
from loop.control_loop import ControlLoop
from sim.fleet import Fleet, FleetConfig
from sim.perf_model import PerfModel
from sim.workloads import Workload

if TYPE_CHECKING:
    from sim.baselines.base import Autoscaler

EPOCH_MS0 = 1_700_000_000_000


class LoopConfigError(ValueError):
    """A fast-loop parameter is unusable; the message names it."""


@dataclass(frozen=True)
class Fault:
    """``spike``: service time x ``factor`` on ``fraction`` of a zone's replicas;
    ``replica_lost``: one replica fails (replaced); ``zone_cut``: the zone
    loses all replicas and ingress for ``duration_s``; ``slow_start``: replica
    start-up takes ``factor`` x longer from ``at_s`` on (not undone);
    ``requests_silent`` / ``gpu_silent``: the zone keeps serving but its request
    records / GPU samples stop reaching governor for ``duration_s`` (a broken
    telemetry stream: the loop must hold, never read it as idle or as a lost zone)."""

    kind: str
    zone: str
    at_s: float
    duration_s: float = 60.0
    fraction: float = 0.5
    factor: float = 3.0

    def __post_init__(self) -> None:
        if self.kind not in {"spike", "replica_lost", "zone_cut", "slow_start", "requests_silent", "gpu_silent"}:
            raise LoopConfigError(f"fault kind {self.kind!r} unknown")


#: The fast loop's model: ``ModelSpec``'s defaults, with room to 256 replicas a zone so the
#: benchmarks' fleets never meet the bound (the published control tables ran with it).
FAST_LOOP_MAX_REPLICAS = 256
_SPEC_KEYS = {
    "model": "name",
    "ttft_slo_ms": "ttft_slo_ms",
    "itl_slo_ms": "itl_slo_ms",
    "min_replicas": "min_replicas",
    "max_replicas": "max_replicas",
    "replica_capacity_rps": "replica_capacity_rps",  # set = governor uses its feedforward path
    "replica_headroom": "replica_headroom",  # the profile's (sim.profiling.replica_headroom); None = 1.25
}


def fast_loop_settings(**changes: Any) -> Settings:
    """The settings the fast loop runs governor with: :class:`Settings`' defaults but
    one model (:data:`FAST_LOOP_MAX_REPLICAS`) and commands valid for 3 windows;
    ``changes`` name :class:`ModelSpec` fields (``model`` for its name) or settings fields."""
    spec = {k: changes.pop(key) for key, k in _SPEC_KEYS.items() if key in changes}
    spec.setdefault("name", DEFAULT_MODELS[0].name)
    spec.setdefault("max_replicas", FAST_LOOP_MAX_REPLICAS)
    if "pid_gains" in changes:
        changes["pid_gains"] = dict(changes["pid_gains"])
    window_s = changes.get("window_s", WINDOW_S)
    return Settings(models=(ModelSpec(**spec),), command_ttl_s=max(COMMAND_TTL_S, 3 * window_s), **changes)


@dataclass(frozen=True)
class LoopConfig:
    """One fast-loop run: the governor ``settings`` it runs (its one model, zones, SLOs,
    gains, feature switches; no copy of any of them here) and what only the simulation has.

    :meth:`of` builds one from keywords of either kind; :meth:`replace` changes either.

    >>> cfg = LoopConfig.of(window_s=5.0, ttft_slo_ms=300.0, seed=3)
    >>> cfg.settings.window_s, cfg.spec.ttft_slo_ms, cfg.seed, cfg.window_s
    (5.0, 300.0, 3, 5.0)
    >>> cfg.replace(zone_redundancy=1, tick_s=0.5).settings.zone_redundancy
    1
    """

    settings: Settings = field(default_factory=fast_loop_settings)
    initial_replicas: int = 4
    startup_s: float = 30.0  # the simulated replicas' start-up time (the settings' startup_hint_s follows it)
    actuation_delay_s: float = 2.0
    tick_s: float = 1.0
    gpus_per_replica: int = 8
    seed: int = 0
    hardware: str = "h100-80gb"
    tensor_parallel: int = 8
    # The global balancer in front of the zones: "uniform" sends a zone its share as soon as
    # it is reachable (so a healed zone gets traffic while its replicas still start);
    # "health" also skips zones with no ready replica (a load balancer's health check).
    balancer: str = "uniform"
    # A replica measured elsewhere (a real engine's profile, :mod:`bench.sim_vs_real`) instead of the
    # Splitwise model of ``hardware``/``tensor_parallel``; and its batch limit (vLLM's --max-num-seqs).
    perf: PerfModel | None = None
    max_batch: int = 64

    def __post_init__(self) -> None:
        if len(self.settings.models) != 1:
            raise LoopConfigError(f"settings: the fast loop runs one model (got {len(self.settings.models)})")
        if self.tick_s <= 0 or self.window_s < self.tick_s:
            raise LoopConfigError("need 0 < tick_s <= window_s")
        if self.actuation_delay_s < 0 or self.startup_s < 0:
            raise LoopConfigError("actuation_delay_s and startup_s must be >= 0")
        if not self.min_replicas <= self.initial_replicas <= self.max_replicas:
            raise LoopConfigError("need min_replicas <= initial_replicas <= max_replicas")
        if self.balancer not in ("uniform", "health"):
            raise LoopConfigError(f"balancer={self.balancer!r}: choose uniform or health")

    @classmethod
    def of(cls, **kw: Any) -> LoopConfig:
        """A run from keywords: the simulation's fields, and settings or model fields
        (:func:`fast_loop_settings`); the start-up hint is the simulated start-up time."""
        sim = {f.name: kw.pop(f.name) for f in dataclasses.fields(cls) if f.name in kw and f.name != "settings"}
        return cls(fast_loop_settings(startup_hint_s=sim.get("startup_s", cls.startup_s), **kw), **sim)

    def replace(self, **kw: Any) -> LoopConfig:
        """This run with ``kw`` changed (simulation, settings or model fields)."""
        sim = {k: kw.pop(k) for k in list(kw) if k in self.__dataclass_fields__}
        settings = self.settings
        spec = {k: kw.pop(key) for key, k in _SPEC_KEYS.items() if key in kw}
        if spec:
            settings = settings.replace(models=(dataclasses.replace(self.spec, **spec),))
        if "pid_gains" in kw:
            kw["pid_gains"] = dict(kw["pid_gains"])
        if "window_s" in kw:
            kw["command_ttl_s"] = max(COMMAND_TTL_S, 3 * kw["window_s"])
        if "startup_s" in sim:
            kw["startup_hint_s"] = sim["startup_s"]
        return dataclasses.replace(self, settings=settings.replace(**kw) if kw else settings, **sim)

    # -- read-only views of the settings (the run's model and loop) ------------
    @property
    def spec(self) -> ModelSpec:
        return self.settings.models[0]

    @property
    def model(self) -> str:
        return self.spec.name

    @property
    def zones(self) -> tuple[str, ...]:
        return self.settings.zones

    @property
    def min_replicas(self) -> int:
        return self.spec.min_replicas

    @property
    def max_replicas(self) -> int:
        return self.spec.max_replicas

    @property
    def ttft_slo_ms(self) -> float:
        return self.spec.ttft_slo_ms

    @property
    def itl_slo_ms(self) -> float:
        return self.spec.itl_slo_ms

    @property
    def replica_capacity_rps(self) -> float | None:
        return self.spec.replica_capacity_rps

    @property
    def replica_headroom(self) -> float | None:
        return self.spec.replica_headroom

    @property
    def window_s(self) -> float:
        return self.settings.window_s

    @property
    def lateness_s(self) -> float:
        return self.settings.lateness_s

    @property
    def eps_ref(self) -> float:
        return self.settings.eps_ref

    @property
    def pid_gains(self) -> Mapping[str, float]:
        return self.settings.pid_gains

    @property
    def controller(self) -> str:
        return self.settings.controller

    @property
    def zone_redundancy(self) -> int:
        return self.settings.zone_redundancy


@dataclass
class RunResult:
    strategy: str
    metrics: dict[str, Any]
    timeline: dict[str, np.ndarray]  # t_s and per-zone ready/starting/desired columns
    decisions: list[tuple[float, str, int, str]]  # (t_s, zone, desired, reason)
    finished: list[dict[str, Any]]
    windows: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)  # the Scaler's (drift, mode, zone)


def _pick_zone(weights: Mapping[str, float], reachable: Sequence[str], u: float) -> str | None:
    """The zone whose cumulative weight (over the reachable zones) passes ``u`` in [0, 1)."""
    w = [max(0.0, weights.get(z, 0.0)) for z in reachable]
    total = sum(w)
    if total <= 0:
        return None
    acc = 0.0
    for z, wz in zip(reachable, w, strict=True):
        acc += wz / total
        if u < acc:
            return z
    return reachable[-1]


StrategyFactory = Callable[[str], "Autoscaler"]  # zone -> autoscaler for that zone


def _reversals(values: Sequence[int]) -> int:
    moves = [b - a for a, b in zip(values, values[1:], strict=False) if b != a]
    return sum(1 for a, b in zip(moves, moves[1:], strict=False) if (a > 0) != (b > 0))


def run(
    strategy: str | StrategyFactory,
    workload: Workload,
    cfg: LoopConfig,
    faults: Sequence[Fault] = (),
    duration_s: float | None = None,
    name: str | None = None,
    retune: Callable[[Any], dict[str, Any]] | None = None,
) -> RunResult:
    """Run one strategy ("governor" or a per-zone baseline factory) on a workload.

    ``retune``: governor's online retuning runs, inline, with this search (:func:`sim.retune.propose`)
    in the settings' ``retune`` mode, each job at the close of the window that makes it due."""
    fast = _FastRun(strategy, workload, cfg, faults, duration_s)
    fast.retune = retune
    return fast.run(name)


class _FastRun:
    """One run, split by phase; each tick runs the phases in this order:

    faults -> arrivals (the global balancer) -> actuation (decisions whose delay
    has passed) -> observe (the fleet advances, its telemetry goes through the
    worker's :class:`~loop.control_loop.ControlLoop`, governor decides on the
    closed zone windows) -> account (GPU-seconds, timeline) and the baselines'
    decisions.
    """

    def __init__(
        self,
        strategy: str | StrategyFactory,
        workload: Workload,
        cfg: LoopConfig,
        faults: Sequence[Fault],
        duration_s: float | None,
    ) -> None:
        self.wall0 = time.perf_counter()
        self.strategy, self.workload, self.cfg = strategy, workload, cfg
        self.duration = float(
            duration_s if duration_s is not None else (workload.arrival_s[-1] if len(workload) else 0.0)
        )
        perf = cfg.perf or PerfModel.from_splitwise(
            model=cfg.model, hardware=cfg.hardware, tensor_parallel=cfg.tensor_parallel
        )
        self.fleet = Fleet(
            FleetConfig(
                models={cfg.model: perf},
                zones=cfg.zones,
                startup_s=cfg.startup_s,
                max_batch=cfg.max_batch,
                initial_replicas=cfg.initial_replicas,
                seed=cfg.seed,
            ),
            epoch_ms0=EPOCH_MS0,
        )
        # The worker's own loop: its processor makes every strategy's windows, its drivers decide for governor.
        self.loop = ControlLoop(cfg.settings)
        self.governor = strategy == "governor"
        self.scalers: dict[str, Autoscaler] = (
            {} if self.governor else {z: cast(StrategyFactory, strategy)(z) for z in cfg.zones}
        )
        self.next_decide = {z: 0.0 for z in cfg.zones}
        self.last_window: dict[str, dict[str, Any]] = {}
        self.pending: deque[tuple[float, str, int]] = deque()
        self.decisions: list[tuple[float, str, int, str]] = []
        self.desired_seq: dict[str, list[int]] = {z: [cfg.initial_replicas] for z in cfg.zones}
        self.arrivals_last: dict[str, deque[float]] = defaultdict(deque)
        rng = np.random.default_rng(cfg.seed)
        self.zone_of = rng.integers(0, len(cfg.zones), len(workload))
        self.route_u = rng.random(len(workload))  # drawn after zone_of: the default routing is unchanged
        self.finished: list[dict[str, Any]] = []
        self.windows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.tl: dict[str, list[float]] = defaultdict(list)
        self.cut_until: dict[str, float] = {}
        self.silent_until: dict[tuple[str, str], float] = {}  # (zone, "request" | "gpu") -> until
        self.saved_desired: dict[str, int] = {}
        self.fault_queue = sorted(faults, key=lambda f: f.at_s)
        self.prov_gpu_s = self.busy_gpu_s = 0.0
        self.i = 0
        self.retune: Callable[[Any], dict[str, Any]] | None = None

    def run(self, name: str | None) -> RunResult:
        cfg, t = self.cfg, 0.0
        n_ticks = int(np.ceil(self.duration / cfg.tick_s))
        for k in range(1, n_ticks + 1):
            t = min(k * cfg.tick_s, self.duration)
            self._faults(t)
            self._arrivals(t)
            self._actuate(t)
            snaps = self._observe(k, t)
            self._account(t, snaps)
            self.tl["t_s"].append(t)
        return self._result(t, name)

    # -- phases --------------------------------------------------------------------------
    def _faults(self, t: float) -> None:
        cfg, fleet = self.cfg, self.fleet
        while self.fault_queue and self.fault_queue[0].at_s <= t:
            f = self.fault_queue.pop(0)
            if f.kind == "spike":
                fleet.inject_latency_spike(f.zone, cfg.model, f.fraction, f.factor, f.at_s, f.duration_s)
            elif f.kind == "replica_lost":
                fleet.fail_replica(f.zone, cfg.model, f.at_s)
            elif f.kind == "zone_cut":
                self.cut_until[f.zone] = f.at_s + f.duration_s
                self.saved_desired[f.zone] = fleet.desired(f.zone, cfg.model)
                fleet.set_desired(f.zone, cfg.model, 0, f.at_s)
            elif f.kind == "slow_start":  # every replica started from now on loads slower
                fleet.config = dataclasses.replace(fleet.config, startup_s=cfg.startup_s * f.factor)
            elif f.kind in ("requests_silent", "gpu_silent"):
                self.silent_until[(f.zone, "request" if f.kind == "requests_silent" else "gpu")] = f.at_s + f.duration_s
        for key, until in list(self.silent_until.items()):
            if t >= until:
                del self.silent_until[key]
        for zone, until in list(self.cut_until.items()):
            if t >= until:
                del self.cut_until[zone]
                fleet.set_desired(zone, cfg.model, max(self.saved_desired.pop(zone, 1), cfg.min_replicas), until)

    def _arrivals(self, t: float) -> None:
        cfg, fleet, workload = self.cfg, self.fleet, self.workload
        live_zones = [z for z in cfg.zones if z not in self.cut_until] or list(cfg.zones)
        if cfg.balancer == "health":
            live_zones = [z for z in live_zones if fleet.replicas(z, cfg.model)["ready"] > 0] or live_zones
        # The global balancer: uniform over the zones, unless governor's zone-aware capacity
        # has moved routing off a lost or healing zone (Scaler.zone_weights).
        weights = self.loop.scaler.zone_weights(cfg.model) if self.governor else {}
        steer = bool(weights) and len(set(weights.values())) > 1
        i = self.i
        while i < len(workload) and workload.arrival_s[i] <= t:
            zone = cfg.zones[int(self.zone_of[i])]
            if steer:
                zone = _pick_zone(weights, live_zones, float(self.route_u[i])) or zone
            if zone not in live_zones:  # the global balancer sends a cut zone's traffic elsewhere
                zone = live_zones[i % len(live_zones)]
            fleet.submit(
                float(workload.arrival_s[i]),
                zone,
                cfg.model,
                int(workload.prompt_tokens[i]),
                int(workload.output_tokens[i]),
                f"r{i}",
                hash_ids=workload.hash_ids[i] if workload.hash_ids is not None else None,
            )
            self.arrivals_last[zone].append(float(workload.arrival_s[i]))
            i += 1
        self.i = i

    def _actuate(self, t: float) -> None:
        while self.pending and self.pending[0][0] <= t:
            at, zone, n = self.pending.popleft()
            if zone not in self.cut_until:
                self.fleet.set_desired(zone, self.cfg.model, n, at)

    def _decide(self, t: float, zone: str, n: int, reason: str) -> None:
        self.pending.append((t + self.cfg.actuation_delay_s, zone, n))
        self.decisions.append((t, zone, n, reason))
        self.desired_seq[zone].append(n)

    def _observe(self, k: int, t: float) -> list[dict[str, Any]]:
        """The fleet advances to ``t``; its records go through the loop; governor decides."""
        done = self.fleet.advance_to(t)
        self.finished.extend(done)
        snaps = self.fleet.gpu_snapshot(t)
        now_ms = EPOCH_MS0 + int(round(t * 1000))
        records = done + snaps
        if self.silent_until:  # a broken telemetry stream: those records never reach governor
            records = [r for r in records if (r.get("zone"), r.get("kind")) not in self.silent_until]
        batch = {"schema_version": 1, "kind": "batch", "records": records}
        # Windows close by the clock below, once per tick, as the worker's timer closes them.
        self.loop.ingest(batch, {"topic": "fastloop", "partition": 0, "offset": k}, now_ms, close=False)
        for m in self.loop.close_due(now_ms):
            if m["scope"] != "zone":
                continue  # node windows: the KV policy is not simulated here (bench kv is)
            self.windows.append(m)
            self.last_window[m["zone"]] = m
            if self.governor and m["zone"] not in self.cut_until:
                # Executor heartbeats: a cut zone's executor cannot reach Redis, every other one can.
                self.loop.set_heartbeats([z for z in self.cfg.zones if z not in self.cut_until])
                decided = self.loop.decide(decode_window(m), now_ms)
                self.events.extend(decided.events)
                for cmd in decided.commands:
                    if cmd.kind == "scale" and cmd.target_replicas is not None:
                        self._decide(t, cmd.zone, cmd.target_replicas, cmd.reason)
        if self.governor and self.retune is not None:  # the worker runs these off its loop; here time waits
            for job in self.loop.retune.due(now_ms):
                rec = self.loop.retune.on_result(self.retune(job), False, now_ms)
                self.events.append({"kind": "retune", "t_s": t, **rec})
        return snaps

    def _account(self, t: float, snaps: list[dict[str, Any]]) -> None:
        cfg, fleet = self.cfg, self.fleet
        by_zone: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for s in snaps:
            by_zone[s["zone"]].append(s)
        for zone in cfg.zones:
            zs = by_zone.get(zone, [])
            ready = [s for s in zs if s["state"] == "ready"]
            self.prov_gpu_s += len(zs) * cfg.gpus_per_replica * cfg.tick_s
            self.busy_gpu_s += sum(s["gpu_util"] for s in ready) * cfg.gpus_per_replica * cfg.tick_s
            counts = fleet.replicas(zone, cfg.model)
            self.tl[f"{zone}.ready"].append(counts.get("ready", 0))
            self.tl[f"{zone}.starting"].append(counts.get("starting", 0))
            self.tl[f"{zone}.desired"].append(fleet.desired(zone, cfg.model))
            q = self.arrivals_last[zone]
            while q and q[0] <= t - 1.0:
                q.popleft()
            if not self.governor and t >= self.next_decide[zone] and zone not in self.cut_until:
                self._baseline(t, zone, zs, ready, counts, len(q))

    def _baseline(
        self,
        t: float,
        zone: str,
        zs: list[dict[str, Any]],
        ready: list[dict[str, Any]],
        counts: Mapping[str, int],
        arrivals_1s: int,
    ) -> None:
        from sim.baselines.base import Observation

        cfg, fleet = self.cfg, self.fleet
        scaler = self.scalers[zone]
        self.next_decide[zone] = t + scaler.period_s
        obs = Observation(
            t_s=t,
            zone=zone,
            model=cfg.model,
            replicas_ready=counts.get("ready", 0),
            replicas_starting=counts.get("starting", 0),
            desired=fleet.desired(zone, cfg.model),
            ongoing_requests=sum(s["queue_len"] + s["running"] for s in zs),
            queue_len=sum(s["queue_len"] for s in zs),
            arrival_rate_rps=float(arrivals_1s),
            gpu_util=float(np.mean([s["gpu_util"] for s in ready])) if ready else 0.0,
            window=self.last_window.get(zone),
            # requests held at the zone router for want of a ready replica (an activator / handle sees them)
            zone_queued=max(0, fleet.queued(zone, cfg.model) - sum(s["queue_len"] for s in zs)),
        )
        n = scaler.decide(obs)
        if n is not None:
            n = int(min(max(n, cfg.min_replicas), cfg.max_replicas))
            if n != obs.desired:
                self._decide(t, zone, n, scaler.name)

    def _result(self, t: float, name: str | None) -> RunResult:
        cfg = self.cfg
        sde = (
            {f"{model}|{zone}": est.to_dict() for (model, zone), est in self.loop.scaler.sde_estimates().items()}
            if self.governor
            else {}
        )
        # Drain: let in-flight requests finish (no new arrivals), so nothing is left uncounted.
        tail = self.fleet.advance_to(t + 600.0)
        self.finished.extend(tail)
        strategy = self.strategy
        label = name or (
            strategy if isinstance(strategy, str) else cast(str, getattr(self.scalers[cfg.zones[0]], "name", "?"))
        )
        return RunResult(
            strategy=label,
            metrics=summarise(
                self.finished,
                cfg,
                self.prov_gpu_s,
                self.busy_gpu_s,
                self.decisions,
                self.desired_seq,
                submitted=self.i,
                wall_s=time.perf_counter() - self.wall0,
                duration_s=self.duration,
                in_flight=self.fleet.stats().get("in_flight", 0),
            )
            | ({"sde_fit": sde} if sde else {}),
            timeline={k: np.asarray(v) for k, v in self.tl.items()},
            decisions=self.decisions,
            finished=self.finished,
            windows=self.windows,
            events=self.events,
        )


def summarise(
    finished: Sequence[Mapping[str, Any]],
    cfg: LoopConfig,
    prov_gpu_s: float,
    busy_gpu_s: float,
    decisions: Sequence[tuple[float, str, int, str]],
    desired_seq: Mapping[str, Sequence[int]],
    *,
    submitted: int,
    wall_s: float,
    duration_s: float,
    in_flight: int,
) -> dict[str, Any]:
    ttft = np.array([r["ttft_ms"] for r in finished], dtype=float)
    itl = np.array([r.get("itl_ms", 0.0) for r in finished], dtype=float)
    e2e = np.array([r["e2e_ms"] for r in finished], dtype=float)
    ok = (ttft <= cfg.ttft_slo_ms) & (itl <= cfg.itl_slo_ms)

    def pct(a: np.ndarray, q: float) -> float | None:
        return round(float(np.percentile(a, q)), 1) if len(a) else None

    return {
        "requests": int(len(finished)),
        "submitted": int(submitted),
        "unfinished": int(in_flight),
        "slo_attainment": round(float(ok.mean()), 5) if len(ok) else None,
        "e2e_p50_ms": pct(e2e, 50),
        "e2e_p95_ms": pct(e2e, 95),
        "e2e_p99_ms": pct(e2e, 99),
        "ttft_p95_ms": pct(ttft, 95),
        "gpu_seconds": round(prov_gpu_s, 1),
        "waste": round(1.0 - busy_gpu_s / prov_gpu_s, 4) if prov_gpu_s else None,
        "scale_actions": len(decisions),
        "reversals": int(sum(_reversals(list(v)) for v in desired_seq.values())),
        "sim_speedup": round(duration_s / wall_s, 1) if wall_s > 0 else None,
    }
