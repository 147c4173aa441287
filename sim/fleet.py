"""Event-driven fleet of inference replicas per (zone, model).

Deterministic given ``FleetConfig.seed`` and the call sequence. The clock is
trace time in seconds; records carry ``ts_ms = epoch_ms0 + round(t_s * 1000)``.
Replica service is in :mod:`sim.replica`; this module owns the event heap,
routing (among the ready replicas of the zone, least outstanding tokens or
prefix-aware, ``FleetConfig.dispatch``: :mod:`controllers.dispatch`; else the
zone queue), the replica life cycle ``starting -> ready -> draining -> gone``,
fault injection and the request/GPU records. Which (zone, model) a request
of a model family goes to by weights (:meth:`Fleet.submit_routed`) and
injected request errors are in :mod:`sim.router`.

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
from typing import Any

import numpy as np

from controllers.agent_weights import pool_shares
from controllers.coupling import CouplingError, CouplingParams, NodeInfo, build_graph
from controllers.dispatch import pick
from sim.perf_model import PerfModel  # noqa: F401  (used by the doctests)
from sim.replica import (
    DRAINING,
    GONE,
    READY,
    STARTING,
    FleetConfig,
    FleetConfigError,
    Replica,
    Request,
    request_record,
)
from sim.router import ErrorInjector, WeightedRouter, parse_target
from sim.sde import JitterProcess

__all__ = ["Fleet", "FleetConfig", "FleetConfigError"]

_REPLICA, _REACH, _READY, _DISPATCH, _CALL = range(5)
_COUPLING = CouplingParams()  # session moves prefer coupled peers (docs/model.md (coupling))


class Fleet:
    """The simulated fleet (see the module docstring); ``epoch_ms0``: wall ms of trace time 0."""

    def __init__(self, config: FleetConfig, epoch_ms0: int = 0) -> None:
        self.config, self.epoch_ms0, self.now = config, int(epoch_ms0), 0.0
        self._heap: list[tuple[Any, ...]] = []
        self._seq = itertools.count()
        self._rng = np.random.default_rng(config.seed)
        self._net: list[float] = []
        keys = [(z, m) for z in config.zones for m in config.models]
        self._reps: dict[tuple[str, str], list[Replica]] = {k: [] for k in keys}
        self._ready: dict[tuple[str, str], list[Replica]] = {k: [] for k in keys}
        self._zone_q: dict[tuple[str, str], deque[Request]] = {k: deque() for k in keys}
        self._dispatch_pending: set[tuple[str, str]] = set()
        self._pending: dict[tuple[str, str], tuple[int, int]] = {}  # scheduled set_desired
        self._serial = itertools.count()
        self._names = {k: itertools.count() for k in keys}
        self._out: list[dict[str, Any]] = []
        self._gone = {k: 0 for k in keys}
        self.submitted = self.completed = self._pending_reach = self.failures = 0
        self.router = WeightedRouter(np.random.default_rng([config.seed, 2]))
        self.errors = ErrorInjector(np.random.default_rng([config.seed, 3]))
        self.routing_log: list[dict[str, Any]] = []
        self._agent_pools: dict[tuple[str, str], dict[str, float]] = {}  # (zone, model) -> agent class weights
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
            jit = JitterProcess(
                cfg.jitter_theta,
                cfg.jitter_L_bar,
                cfg.jitter_sigma0,
                cfg.jitter_k,
                cfg.jitter_L_knee,
                np.random.default_rng([cfg.seed, 1, serial]),
                t,
            )
        r = Replica(
            f"{key[0]}/{key[1]}/r{next(self._names[key])}",
            key[0],
            key[1],
            perf,
            state=READY if ready else STARTING,
            max_batch=cfg.max_batch,
            kv_capacity_tokens=cfg.kv_capacity_tokens or perf.kv_capacity_tokens,
            max_prefill_tokens=cfg.max_prefill_tokens,
            jitter=jit,
            prefix_cache=cfg.prefix_cache,
            context_aware=cfg.context_aware_decode,
            t_s=t,
            kv_allocator=cfg.kv_allocator,
            copy_bandwidth_bytes_s=cfg.kv_copy_bandwidth_bytes_s,
        )
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
        pools = self._agent_pools.get(key)
        path = req.agent.get("agent_path") if pools and req.agent else None
        if len(ready) == 1:
            r = ready[0]
        elif pools and isinstance(path, str):
            r = _agent_pick(ready, pools, path)
        elif self.config.dispatch.policy == "least-outstanding" or not req.hash_ids:
            r = min(ready, key=_load)
        else:
            r = ready[self._prefix_pick(ready, req.hash_ids)]
        nxt = r.enqueue(req, t)
        if nxt is not None:
            self._push(nxt, _REPLICA, r, r.version)

    def _prefix_pick(self, ready: list[Replica], ids: list[int]) -> int:
        matched = []
        for r in ready:
            cache, n = r.cache, 0
            for h in ids:
                if h not in cache:
                    break
                n += 1
            matched.append(n)
        return pick(
            [r.outstanding for r in ready], [r.in_flight for r in ready], matched, len(ids), self.config.dispatch
        )

    def _network_ms(self) -> float:
        if not self._net:
            c = self.config
            draws = self._rng.lognormal(math.log(max(c.network_ms_median, 1e-9)), c.network_sigma, 4096)
            self._net = (draws if c.network_ms_median > 0 else 0 * draws).tolist()
        return self._net.pop()

    def _complete(self, q: Request, r: Replica, t: float) -> None:
        self.completed += 1
        rec = request_record(q, r.node, t, self.epoch_ms0)
        if self.errors.active:
            rec["status"] = self.errors.status(r.zone, r.model, t)
        self._out.append(rec)

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
    def submit(
        self,
        t_s: float,
        zone: str,
        model: str,
        prompt_tokens: int,
        output_tokens: int,
        request_id: str,
        hash_ids: list[int] | None = None,
        request_class: str = "default",
        agent: dict[str, Any] | None = None,
    ) -> None:
        """Enqueue a request arriving at ``t_s`` (clamped to the fleet clock).

        ``agent``: the mixed-agent fields its telemetry record carries
        (``agent_stability``, ``agent_rag_score``, ``agent_tool_conf``,
        ``agent_path``; :mod:`governor_telemetry.records`), when the workload has them.

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
        req = Request(
            str(request_id),
            zone,
            model,
            request_class,
            int(prompt_tokens),
            int(output_tokens),
            hash_ids,
            t,
            self._network_ms(),
            0.5 + 0.0005 * int(prompt_tokens),
        )
        req.agent = agent
        self.submitted += 1
        self._pending_reach += 1
        self._push(req.reach_t, _REACH, req)

    def set_routing(
        self, family: str, weights: Mapping[Any, float], t_s: float, request_class: str | None = None
    ) -> dict[str, float]:
        """Routing weights of ``family`` over ``(variant, zone)`` / ``'variant|zone'`` targets.

        For ``request_class`` (None: every class without its own weights);
        applies to requests submitted by :meth:`submit_routed` from now on
        (``t_s`` is recorded in ``routing_log``). Returns the normalised weights.

        >>> f = Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}, initial_replicas=1))
        >>> f.set_routing("fam", {"m|az-a": 1.0}, 0.0)
        {'m|az-a': 1.0}
        >>> f.submit_routed(0.0, "fam", "voice", 100, 4, "x")
        ('m', 'az-a')
        """
        for k in weights:
            v, z = parse_target(k)
            self._key(z, v)
        out = self.router.set(family, weights, request_class)
        self.routing_log.append(
            {"t_s": max(float(t_s), self.now), "family": family, "request_class": request_class, "weights": out}
        )
        return out

    def set_agent_routes(self, zone: str, model: str, weights: Mapping[str, float] | None) -> None:
        """Route the agent classes of (zone, model) by ``weights`` (None or empty: stop).

        What a gateway does with the ``_agents|<model>`` field (:mod:`executors.gateway`): a request
        whose ``agent`` fields name an ``agent_path`` of positive weight goes to that class's pools,
        here the ready replicas in order, split by :func:`controllers.agent_weights.pool_shares`;
        among them the one with the fewest outstanding tokens per unit of the class's share (a
        Gateway API implementation draws by the rule's weights instead).

        >>> f = Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}, initial_replicas=2))
        >>> f.set_agent_routes("az-a", "m", {"rag": 0.5, "tool": 0.0, "llm": 0.5})
        >>> for i in range(4):
        ...     f.submit(0.0, "az-a", "m", 100, 10, f"q{i}", agent={"agent_path": "llm"})
        >>> sorted({r["node"] for r in f.advance_to(30.0)})     # llm holds the second replica only
        ['az-a/m/r1']
        """
        key = self._key(zone, model)
        if weights:
            self._agent_pools[key] = {str(k): float(v) for k, v in weights.items()}
        else:
            self._agent_pools.pop(key, None)

    def submit_routed(
        self,
        t_s: float,
        family: str,
        request_class: str,
        prompt_tokens: int,
        output_tokens: int,
        request_id: str,
        hash_ids: list[int] | None = None,
    ) -> tuple[str, str]:
        """Submit to the (variant, zone) drawn from the family's weights; returns it."""
        variant, zone = self.router.pick(family, request_class)
        self.submit(t_s, zone, variant, prompt_tokens, output_tokens, request_id, hash_ids, request_class)
        return variant, zone

    def inject_errors(self, zone: str, model: str, rate: float, start_s: float, duration_s: float) -> None:
        """Requests of (zone, model) finishing in the interval get ``status='error'`` w.p. ``rate``."""
        self._key(zone, model)
        self.errors.add(zone, model, rate, start_s, duration_s)

    def queued(self, zone: str, model: str) -> int:
        """Requests waiting for a prefill in (zone, model): zone queue plus replica queues."""
        key = self._key(zone, model)
        return len(self._zone_q[key]) + sum(len(r.queue) for r in self._reps[key])

    def advance_to(self, t_s: float) -> list[dict[str, Any]]:
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

    def set_desired(self, zone: str, model: str, n: int, t_s: float) -> dict[str, Any]:
        """Scale (zone, model) to ``n`` starting+ready replicas at ``t_s``.

        Scale-up starts replicas that are ready at ``t_s + startup_s``;
        scale-down cancels starting replicas (newest first), then drains the
        least-loaded ready ones (their queued requests are re-routed). A
        ``t_s`` ahead of the fleet clock is applied exactly at ``t_s`` by an
        event (``scheduled: True``, empty lists; ``desired()`` answers ``n`` at
        once), so the clock never runs ahead of requests not yet submitted.

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
        t = float(t_s)
        change: dict[str, Any] = {
            "zone": zone,
            "model": model,
            "desired": n,
            "t_s": max(t, self.now),
            "scheduled": t > self.now,
            "started": [],
            "cancelled": [],
            "draining": [],
        }
        if t > self.now:
            token = next(self._seq)
            self._pending[key] = (n, token)

            def apply(tc: float) -> None:
                if self._pending.get(key, (0, -1))[1] == token:
                    del self._pending[key]
                self._apply_desired(key, n, tc, {**change, "scheduled": False, "cancelled": [], "draining": []})

            self._push(t, _CALL, apply)
            return change
        return self._apply_desired(key, n, change["t_s"], change)

    def _apply_desired(self, key: tuple[str, str], n: int, t: float, change: dict[str, Any]) -> dict[str, Any]:
        active = [r for r in self._reps[key] if r.state in (STARTING, READY)]
        if n > len(active):
            change["started"] = [self._new_replica(key, t, ready=False).node for _ in range(n - len(active))]
        excess = len(active) - n
        for r in [r for r in reversed(active) if r.state == STARTING][: max(0, excess)]:
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
        """Starting + ready replicas of (zone, model).

        >>> Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}, initial_replicas=2)).desired("az-a", "m")
        2
        """
        key = self._key(zone, model)
        if key in self._pending:
            return self._pending[key][0]
        return sum(r.state in (STARTING, READY) for r in self._reps[key])

    def replicas(self, zone: str, model: str) -> dict[str, int]:
        """Replica counts by state (``gone`` counts every replica ever removed).

        >>> Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}, initial_replicas=1)).replicas("az-a", "m")
        {'starting': 0, 'ready': 1, 'draining': 0, 'gone': 0}
        """
        key = self._key(zone, model)
        out = {STARTING: 0, READY: 0, DRAINING: 0, GONE: self._gone[key]}
        for r in self._reps[key]:
            out[r.state] += 1
        return out

    def fail_replica(
        self, zone: str, model: str, t_s: float, node: str | None = None, replace: bool = True
    ) -> str | None:
        """Kill one replica at ``t_s`` (``node`` or a seeded random ready one).

        Its requests go back to the zone's router from scratch; with
        ``replace`` a new replica starts (desired count unchanged). Returns the
        failed node id or None when there was none. A future ``t_s`` picks
        the node now and fails it by an event at ``t_s`` (if it still exists).

        >>> f = Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}, initial_replicas=1))
        >>> f.fail_replica("az-a", "m", 0.0), f.replicas("az-a", "m")["starting"]
        ('az-a/m/r0', 1)
        """
        key = self._key(zone, model)
        pool = [r for r in self._reps[key] if node is None or r.node == node]
        pool = [r for r in pool if r.state == READY] or pool
        if not pool:
            return None
        r = pool[int(self._rng.integers(len(pool)))]
        if float(t_s) > self.now:
            self._push(float(t_s), _CALL, lambda tc: self._fail(r, tc, replace))
        else:
            self._fail(r, self.now, replace)
        return r.node

    def _fail(self, r: Replica, t: float, replace: bool) -> None:
        if r.state == GONE:
            return
        was_active = r.state in (STARTING, READY)
        reqs = r.evict_all(t)
        self._gone_now(r)
        self.failures += 1
        for q in reqs:
            self._route(q, t)
        if replace and was_active:
            self._new_replica((r.zone, r.model), t, ready=False)

    def inject_latency_spike(
        self, zone: str, model: str, fraction: float, factor: float, start_s: float, duration_s: float
    ) -> list[str]:
        """Multiply service time by ``factor`` on a seeded ``fraction`` of replicas.

        Returns the affected node ids (chosen among current non-gone replicas).

        >>> f = Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}, initial_replicas=4))
        >>> len(f.inject_latency_spike("az-a", "m", 0.5, 3.0, start_s=10.0, duration_s=5.0))
        2
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

    def _replica(self, zone: str, model: str, node: str) -> Replica | None:
        return next((r for r in self._reps[self._key(zone, model)] if r.node == node), None)

    def kv_generation(self, zone: str, model: str, node: str) -> int | None:
        """The KV allocator generation of ``node`` now (None: unknown/gone node or no allocator)."""
        r = self._replica(zone, model, node)
        if r is None or r.state == GONE or r.kv is None:
            return None
        return int(r.kv.generation)

    def relocate(
        self, zone: str, model: str, node: str, max_bytes: int, expected_generation: int | None, t_s: float
    ) -> dict[str, Any]:
        """One bounded KV compaction round on ``node`` at the fleet clock (``t_s`` is recorded).

        Returns :meth:`sim.replica.Replica.relocate`'s outcome, or
        ``{'refused': reason}`` (unknown node, no allocator, or ``'generation
        changed'`` when the allocator's generation is not ``expected_generation``).

        >>> f = Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}, initial_replicas=1,
        ...                       kv_allocator="contiguous"))
        >>> f.relocate("az-a", "m", "az-a/m/r0", 10**9, 0, 0.0)["bytes_moved"]
        0
        >>> f.relocate("az-a", "m", "az-a/m/r0", 10**9, 5, 0.0)["refused"]
        'generation changed'
        """
        r = self._replica(zone, model, node)
        if r is None or r.state == GONE:
            return {"refused": "unknown node", "node": node}
        out, nxt = r.relocate(max_bytes, expected_generation, self.now)
        if nxt is not None:
            self._push(nxt, _REPLICA, r, r.version)
        return {"zone": zone, "model": model, "t_s": max(float(t_s), self.now), **out}

    def move_sessions(
        self,
        zone: str,
        model: str,
        node: str,
        t_s: float,
        max_requests: int | None = None,
        coupling: CouplingParams | None = _COUPLING,
    ) -> dict[str, Any]:
        """Move ``node``'s waiting requests to ready peers whose KV can hold them now.

        A peer is chosen per request by the most of its prefix blocks already
        resident there, then the highest coupling with ``node``
        (docs/model.md (coupling): the peer whose resident prefix blocks
        overlap the source's most; ``coupling=None`` skips this key), then
        the least outstanding tokens; requests no peer can hold stay (in
        order). Running requests are not migrated.
        """
        src = self._replica(zone, model, node)
        if src is None or src.state == GONE:
            return {"refused": "unknown node", "node": node}
        peers = [p for p in self._ready[(zone, model)] if p is not src and p.kv is not None]
        couple = _coupling_to(src, peers, coupling) if coupling is not None and peers else {}
        moved: dict[str, str] = {}
        kept = []
        for q in src.take_queue():
            fit = [p for p in peers if p.kv is not None and p.kv.fits(q.need * p.perf.kv_bytes_per_token, q.hash_ids)]
            if not fit or (max_requests is not None and len(moved) >= max_requests):
                kept.append(q)
                continue
            dst = max(
                fit,
                key=lambda p: (p.kv.resident_prefix(q.hash_ids), couple.get(p.node, 0.0), -p.outstanding),  # type: ignore[union-attr]
            )
            moved[q.request_id] = dst.node
            nxt = dst.enqueue(q, self.now)
            if nxt is not None:
                self._push(nxt, _REPLICA, dst, dst.version)
        for q in kept:
            src.queue.append(q)
            src.outstanding += q.need
        nxt = src.poke(self.now, force=False) if moved else None
        if nxt is not None:
            self._push(nxt, _REPLICA, src, src.version)
        return {
            "zone": zone,
            "model": model,
            "node": node,
            "t_s": max(float(t_s), self.now),
            "moved": moved,
            "kept": len(kept),
        }

    def gpu_snapshot(self, t_s: float) -> list[dict[str, Any]]:
        """One GPU record per non-gone replica; ``gpu_util`` is busy time since the last snapshot.

        >>> f = Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}, initial_replicas=1))
        >>> [(g["node"], g["state"], g["gpu_util"]) for g in f.gpu_snapshot(1.0)]
        [('az-a/m/r0', 'ready', 0.0)]
        """
        ts = self.epoch_ms0 + round(t_s * 1000.0)
        out = []
        for reps in self._reps.values():
            for r in reps:
                rec = {"schema_version": 1, "kind": "gpu", "ts_ms": ts}
                rec.update(r.snapshot(t_s))
                out.append(rec)
        return out

    def stats(self) -> dict[str, Any]:
        """Totals; ``in_flight`` is counted from the queues and batches, not derived.

        >>> Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()})).stats()["conserved"]
        True
        """
        by_state = {STARTING: 0, READY: 0, DRAINING: 0, GONE: sum(self._gone.values())}
        in_flight = self._pending_reach + sum(len(q) for q in self._zone_q.values())
        for reps in self._reps.values():
            for r in reps:
                by_state[r.state] += 1
                in_flight += r.in_flight
        return {
            "t_s": self.now,
            "submitted": self.submitted,
            "completed": self.completed,
            "in_flight": in_flight,
            "zone_queued": sum(len(q) for q in self._zone_q.values()),
            "replicas": by_state,
            "failures": self.failures,
            "conserved": self.submitted == self.completed + in_flight,
        }


def _coupling_to(src: Replica, peers: list[Replica], params: CouplingParams) -> dict[str, float]:
    """Coupling of ``src`` with each peer from their resident prefix blocks ({} when the graph is refused)."""
    infos = [
        NodeInfo(r.node, r.zone, r.model, prefix_hashes=r.kv.resident_hashes() if r.kv else ()) for r in [src, *peers]
    ]
    try:
        g = build_graph(infos, params)
    except CouplingError:
        return {}  # over a bound: fall back to the choice without coupling
    return {p.node: g.coupling(src.node, p.node) for p in peers}


def _agent_pick(ready: list[Replica], weights: Mapping[str, float], path: str) -> Replica:
    """The replica of an agent class's pools (:func:`controllers.agent_weights.pool_shares` over the ready
    replicas) with the fewest outstanding tokens per unit of the class's share; a class without a
    share: least outstanding among all."""
    share = pool_shares(weights, len(ready)).get(path)
    if not share:
        return min(ready, key=_load)
    return ready[min((i for i, s in enumerate(share) if s > 0), key=lambda i: (ready[i].outstanding / share[i], i))]


_load = operator.attrgetter("outstanding")  # least outstanding tokens; ties: first in order
