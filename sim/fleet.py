"""Event-driven fleet of inference replicas per (zone, model).

Deterministic given ``FleetConfig.seed`` and the call sequence. The clock is
trace time in seconds; records carry ``ts_ms = epoch_ms0 + round(t_s * 1000)``.
Replica service is in :mod:`sim.replica`; this module owns the event heap,
routing (least outstanding tokens among ready replicas of the zone, else the
zone queue), the replica life cycle ``starting -> ready -> draining -> gone``,
fault injection and the request/GPU records.

Request timeline: a request arriving at ``t`` spends ``network_ms`` (seeded
lognormal, median ``network_ms_median``) and ``preprocess_ms`` (``0.5 +
0.0005 * prompt_tokens``) before it reaches the zone; ``queue_ms`` is the wait
from there to its prefill start; ``ttft_ms = network + preprocess + queue +
prefill``; ``e2e_ms = ttft_ms + decode_ms`` and ``ts_ms`` is the completion.

Examples
--------
>>> from sim.perf_model import PerfModel
>>> cfg = FleetConfig(models={"llama2-70b": PerfModel.from_splitwise()}, initial_replicas=1,
...                   jitter=False)
>>> fleet = Fleet(cfg, epoch_ms0=0)
>>> fleet.submit(0.0, "az-a", "llama2-70b", 512, 8, "r0")
>>> [rec["output_tokens"] for rec in fleet.advance_to(5.0)]
[8]
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from sim.perf_model import PerfModel
from sim.replica import DRAINING, GONE, READY, STARTING, Replica, Request
from sim.sde import JitterProcess

_REPLICA, _REACH, _READY, _DISPATCH, _CALL = range(5)


class FleetConfigError(ValueError):
    """A fleet parameter or command is invalid (names the parameter)."""


@dataclass(frozen=True)
class FleetConfig:
    """Static fleet parameters.

    Parameters
    ----------
    models : Mapping[str, PerfModel]
        Model name -> service-time model.
    zones : tuple of str
        Zone names.
    startup_s : float
        Time from scale-up to ready.
    max_batch : int
        Most requests in a replica's running batch.
    kv_capacity_tokens : int, optional
        Override of every model's ``PerfModel.kv_capacity_tokens``.
    max_prefill_tokens : int
        Token budget of one batched prefill (the first request always fits).
    jitter : bool
        Per-replica OU service-time factor on/off (``jitter_*`` parameters).
    prefix_cache : bool
        Skip prefill of cached leading ``hash_ids`` blocks.
    context_aware_decode : bool
        Decode step time depends on batch context tokens.
    network_ms_median, network_sigma : float
        Lognormal network delay.
    initial_replicas : int
        Replicas per (zone, model) that are ready at t = 0.
    seed : int
        Seed of every random stream.
    """

    models: Mapping[str, PerfModel]
    zones: tuple[str, ...] = ("az-a",)
    startup_s: float = 30.0
    max_batch: int = 64
    kv_capacity_tokens: int | None = None
    max_prefill_tokens: int = 16384
    jitter: bool = True
    jitter_theta: float = 0.03
    jitter_L_bar: float = 100.0
    jitter_sigma0: float = 8.0
    jitter_k: float = 0.0
    jitter_L_knee: float = 150.0
    prefix_cache: bool = True
    context_aware_decode: bool = True
    network_ms_median: float = 2.0
    network_sigma: float = 0.3
    initial_replicas: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.models or not all(isinstance(p, PerfModel) for p in self.models.values()):
            raise FleetConfigError("models: need at least one name -> PerfModel")
        if not self.zones or len(set(self.zones)) != len(self.zones):
            raise FleetConfigError("zones: need at least one, no duplicates")
        checks = {"startup_s": self.startup_s >= 0, "max_batch": self.max_batch >= 1,
                  "max_prefill_tokens": self.max_prefill_tokens >= 1,
                  "kv_capacity_tokens": self.kv_capacity_tokens is None or self.kv_capacity_tokens >= 1,
                  "network_ms_median": self.network_ms_median >= 0, "network_sigma": self.network_sigma >= 0,
                  "initial_replicas": self.initial_replicas >= 0, "jitter_theta": self.jitter_theta > 0,
                  "jitter_L_bar": self.jitter_L_bar > 0, "jitter_sigma0": self.jitter_sigma0 >= 0}
        for name, ok in checks.items():
            if not ok:
                raise FleetConfigError(f"{name}: invalid value {getattr(self, name)!r}")


class Fleet:
    """The simulated fleet; see the module docstring.

    Parameters
    ----------
    config : FleetConfig
        Static parameters.
    epoch_ms0 : int
        Wall-clock milliseconds of trace time 0.
    """

    def __init__(self, config: FleetConfig, epoch_ms0: int = 0) -> None:
        self.config, self.epoch_ms0, self.now = config, int(epoch_ms0), 0.0
        self._heap: list[tuple] = []
        self._seq = itertools.count()
        self._rng = np.random.default_rng(config.seed)
        self._net: list[float] = []
        keys = [(z, m) for z in config.zones for m in config.models]
        self._reps: dict[tuple[str, str], list[Replica]] = {k: [] for k in keys}
        self._ready: dict[tuple[str, str], list[Replica]] = {k: [] for k in keys}
        self._zone_q: dict[tuple[str, str], deque[Request]] = {k: deque() for k in keys}
        self._dispatch_pending: set[tuple[str, str]] = set()
        self._serial = itertools.count()
        self._names = {k: itertools.count() for k in keys}
        self._out: list[dict] = []
        self._gone = {k: 0 for k in keys}
        self.submitted = self.completed = self._pending_reach = self.failures = 0
        for k in keys:
            for _ in range(config.initial_replicas):
                self._new_replica(k, 0.0, ready=True)

    # -- plumbing ------------------------------------------------------------------------
    def _push(self, t: float, kind: int, obj: object, ver: int = 0) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, obj, ver))

    def _key(self, zone: str, model: str) -> tuple[str, str]:
        if (zone, model) not in self._reps:
            raise FleetConfigError(f"zone/model: unknown ({zone!r}, {model!r})")
        return zone, model

    def _new_replica(self, key: tuple[str, str], t: float, ready: bool) -> Replica:
        cfg, perf = self.config, self.config.models[key[1]]
        serial = next(self._serial)
        jit = None
        if cfg.jitter:
            jit = JitterProcess(cfg.jitter_theta, cfg.jitter_L_bar, cfg.jitter_sigma0, cfg.jitter_k,
                                cfg.jitter_L_knee, np.random.default_rng([cfg.seed, 1, serial]), t)
        r = Replica(f"{key[0]}/{key[1]}/r{next(self._names[key])}", key[0], key[1], perf,
                    state=READY if ready else STARTING, max_batch=cfg.max_batch,
                    kv_capacity_tokens=cfg.kv_capacity_tokens or perf.kv_capacity_tokens,
                    max_prefill_tokens=cfg.max_prefill_tokens, jitter=jit,
                    prefix_cache=cfg.prefix_cache, context_aware=cfg.context_aware_decode, t_s=t)
        self._reps[key].append(r)
        if ready:
            self._ready[key].append(r)
        else:
            self._push(t + cfg.startup_s, _READY, r)
        return r

    def _gone_now(self, r: Replica) -> None:
        key = (r.zone, r.model)
        r.state = GONE
        r.version += 1
        self._reps[key].remove(r)
        if r in self._ready[key]:
            self._ready[key].remove(r)
        self._gone[key] += 1

    def _route(self, req: Request, t: float) -> None:
        key = (req.zone, req.model)
        ready = self._ready[key]
        if not ready:
            self._zone_q[key].append(req)
            return
        r = min(ready, key=_load) if len(ready) > 1 else ready[0]
        nxt = r.enqueue(req, t)
        if nxt is not None:
            self._push(nxt, _REPLICA, r, r.version)

    def _network_ms(self) -> float:
        if not self._net:
            c = self.config
            draws = self._rng.lognormal(math.log(max(c.network_ms_median, 1e-9)), c.network_sigma, 4096)
            self._net = (draws if c.network_ms_median > 0 else draws * 0).tolist()[::-1]
        return self._net.pop()

    def _complete(self, q: Request, r: Replica, t: float) -> None:
        self.completed += 1
        queue_ms = (q.prefill_start_t - q.reach_t) * 1000.0
        prefill_ms = (q.first_token_t - q.prefill_start_t) * 1000.0
        decode_ms = (t - q.first_token_t) * 1000.0
        ttft = q.network_ms + q.preprocess_ms + queue_ms + prefill_ms
        self._out.append({
            "schema_version": 1, "kind": "request", "request_id": q.request_id,
            "ts_ms": self.epoch_ms0 + round(t * 1000.0),
            "arrival_ms": self.epoch_ms0 + round(q.arrival_t * 1000.0),
            "model": q.model, "zone": q.zone, "node": r.node, "request_class": q.request_class,
            "queue_ms": queue_ms, "network_ms": q.network_ms, "preprocess_ms": q.preprocess_ms,
            "ttft_ms": ttft,
            "itl_ms": decode_ms / q.output if q.output > 0 else 0.0,
            "decode_ms": decode_ms, "e2e_ms": ttft + decode_ms,
            "prompt_tokens": q.prompt, "output_tokens": q.output,
            "kv_hit": q.kv_hit, "kv_hit_blocks": q.kv_hit_blocks, "status": "ok",
        })

    def _run_until(self, t_end: float) -> None:
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= t_end:
            t, _, kind, obj, ver = pop(heap)
            self.now = t
            if kind == _REPLICA:
                if obj.version != ver or obj.state == GONE:
                    continue
                done, nxt = obj.on_event(t)
                for q in done:
                    self._complete(q, obj, t)
                if nxt is not None:
                    self._push(nxt, _REPLICA, obj, obj.version)
                elif obj.state == DRAINING and obj.in_flight == 0:
                    self._gone_now(obj)
            elif kind == _REACH:
                self._pending_reach -= 1
                self._route(obj, t)
            elif kind == _READY:
                if obj.state == STARTING:
                    obj.state = READY
                    key = (obj.zone, obj.model)
                    self._ready[key].append(obj)
                    if self._zone_q[key] and key not in self._dispatch_pending:
                        self._dispatch_pending.add(key)
                        self._push(t, _DISPATCH, key)
            elif kind == _DISPATCH:
                self._dispatch_pending.discard(obj)
                q = self._zone_q[obj]
                while q and self._ready[obj]:
                    self._route(q.popleft(), t)
            else:
                obj(t)
        self.now = max(self.now, t_end)

    # -- public API ----------------------------------------------------------------------
    def submit(self, t_s: float, zone: str, model: str, prompt_tokens: int, output_tokens: int,
               request_id: str, hash_ids: list[int] | None = None,
               request_class: str = "default") -> None:
        """Enqueue a request arriving at ``t_s`` (clamped to the fleet clock).

        Examples
        --------
        >>> from sim.perf_model import PerfModel
        >>> f = Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}))
        >>> f.submit(0.0, "az-a", "m", 100, 10, "x"); f.stats()["in_flight"]
        1
        """
        self._key(zone, model)
        if prompt_tokens < 0 or output_tokens < 0:
            raise FleetConfigError("prompt_tokens/output_tokens: must be >= 0")
        t = max(float(t_s), self.now)
        req = Request(str(request_id), zone, model, request_class, int(prompt_tokens),
                      int(output_tokens), hash_ids, t, self._network_ms(),
                      0.5 + 0.0005 * int(prompt_tokens))
        self.submitted += 1
        self._pending_reach += 1
        self._push(req.reach_t, _REACH, req)

    def advance_to(self, t_s: float) -> list[dict]:
        """Process every event up to ``t_s``; return the request records completed since the last call.

        Examples
        --------
        >>> from sim.perf_model import PerfModel
        >>> Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()})).advance_to(1.0)
        []
        """
        self._run_until(float(t_s))
        out, self._out = self._out, []
        return out

    def set_desired(self, zone: str, model: str, n: int, t_s: float) -> dict:
        """Scale (zone, model) to ``n`` starting+ready replicas at ``t_s``.

        Scale-up starts replicas that are ready at ``t_s + startup_s``;
        scale-down cancels starting replicas (newest first), then drains the
        least-loaded ready ones (their queued requests are re-routed).

        Examples
        --------
        >>> from sim.perf_model import PerfModel
        >>> f = Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}))
        >>> f.set_desired("az-a", "m", 2, 0.0)["started"]
        ['az-a/m/r0', 'az-a/m/r1']
        """
        key = self._key(zone, model)
        if n < 0:
            raise FleetConfigError(f"n: must be >= 0, got {n}")
        self._run_until(float(t_s))
        t = max(float(t_s), self.now)
        active = [r for r in self._reps[key] if r.state in (STARTING, READY)]
        change = {"zone": zone, "model": model, "desired": n, "t_s": t,
                  "started": [], "cancelled": [], "draining": []}
        if n > len(active):
            change["started"] = [self._new_replica(key, t, ready=False).node
                                 for _ in range(n - len(active))]
        excess = len(active) - n
        for r in [r for r in reversed(active) if r.state == STARTING][:max(0, excess)]:
            self._gone_now(r)
            change["cancelled"].append(r.node)
            excess -= 1
        if excess > 0:
            for r in sorted(self._ready[key], key=_load)[:excess]:
                self._drain(r, t)
                change["draining"].append(r.node)
        return change

    def _drain(self, r: Replica, t: float) -> None:
        r.state = DRAINING
        self._ready[(r.zone, r.model)].remove(r)
        for q in r.take_queue():
            self._route(q, t)
        if r.in_flight == 0:
            self._gone_now(r)

    def desired(self, zone: str, model: str) -> int:
        """Starting + ready replicas of (zone, model)."""
        return sum(r.state in (STARTING, READY) for r in self._reps[self._key(zone, model)])

    def replicas(self, zone: str, model: str) -> dict[str, int]:
        """Replica counts by state (``gone`` counts every replica ever removed)."""
        key = self._key(zone, model)
        out = {STARTING: 0, READY: 0, DRAINING: 0, GONE: self._gone[key]}
        for r in self._reps[key]:
            out[r.state] += 1
        return out

    def fail_replica(self, zone: str, model: str, t_s: float, node: str | None = None,
                     replace: bool = True) -> str | None:
        """Kill one replica at ``t_s`` (``node`` or a seeded random ready one).

        Its requests go back to the zone's router from scratch; with
        ``replace`` a new replica starts (desired count unchanged). Returns the
        failed node id or None when there was none.
        """
        key = self._key(zone, model)
        self._run_until(float(t_s))
        t = max(float(t_s), self.now)
        pool = [r for r in self._reps[key] if node is None or r.node == node]
        pool = [r for r in pool if r.state == READY] or pool
        if not pool:
            return None
        r = pool[int(self._rng.integers(len(pool)))]
        was_active = r.state in (STARTING, READY)
        reqs = r.evict_all(t)
        self._gone_now(r)
        self.failures += 1
        for q in reqs:
            self._route(q, t)
        if replace and was_active:
            self._new_replica(key, t, ready=False)
        return r.node

    def inject_latency_spike(self, zone: str, model: str, fraction: float, factor: float,
                             start_s: float, duration_s: float) -> list[str]:
        """Multiply service time by ``factor`` on a seeded ``fraction`` of replicas.

        Returns the affected node ids (chosen among current non-gone replicas).
        """
        key = self._key(zone, model)
        if not 0 <= fraction <= 1 or not factor > 0 or not duration_s > 0:
            raise FleetConfigError("fraction/factor/duration_s: need 0<=fraction<=1, factor>0, duration_s>0")
        reps = list(self._reps[key])
        k = math.ceil(fraction * len(reps))
        chosen = [reps[i] for i in sorted(self._rng.choice(len(reps), size=k, replace=False))] if k else []
        start = max(float(start_s), self.now)
        for r in chosen:
            r.spikes.append((start, start + duration_s, float(factor)))

        def retime(t: float) -> None:
            for r in chosen:
                if r.state != GONE:
                    nxt = r.poke(t, force=True)
                    if nxt is not None:
                        self._push(nxt, _REPLICA, r, r.version)

        self._push(start, _CALL, retime)
        self._push(start + duration_s, _CALL, retime)
        return [r.node for r in chosen]

    def gpu_snapshot(self, t_s: float) -> list[dict]:
        """One GPU record per non-gone replica; ``gpu_util`` is busy time since the last snapshot."""
        ts = self.epoch_ms0 + round(t_s * 1000.0)
        out = []
        for reps in self._reps.values():
            for r in reps:
                rec = {"schema_version": 1, "kind": "gpu", "ts_ms": ts}
                rec.update(r.snapshot(t_s))
                out.append(rec)
        return out

    def stats(self) -> dict:
        """Totals; ``in_flight`` is counted from the queues and batches, not derived."""
        by_state = {STARTING: 0, READY: 0, DRAINING: 0, GONE: sum(self._gone.values())}
        in_flight = self._pending_reach + sum(len(q) for q in self._zone_q.values())
        for reps in self._reps.values():
            for r in reps:
                by_state[r.state] += 1
                in_flight += r.in_flight
        return {"t_s": self.now, "submitted": self.submitted, "completed": self.completed,
                "in_flight": in_flight, "zone_queued": sum(len(q) for q in self._zone_q.values()),
                "replicas": by_state, "failures": self.failures,
                "conserved": self.submitted == self.completed + in_flight}


_load = operator.attrgetter("outstanding")  # least outstanding tokens; ties: first in order
