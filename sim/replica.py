"""One simulated inference replica (continuous batching, event-driven) and the fleet config.

:class:`FleetConfig` lives here so that :mod:`sim.fleet` stays one idea (the
event loop and life cycle); import it from :mod:`sim.fleet`.

The replica alternates between *segments* during which nothing changes:

- **prefill**: every admissible queued request (FIFO, within ``max_batch``,
  the KV budget and ``max_prefill_tokens``) is prefilled in one forward pass
  of ``prefill_ms(sum of uncached prompt tokens) * factor``; decoding pauses
  (vLLM's default scheduler).
- **decode**: a fixed batch of ``B`` requests advances one token per step of
  ``decode_step_ms(B, context) * factor``; the segment is planned to end at
  the next completion, ``k`` steps ahead, and is cut at the next step boundary
  when a new request becomes admissible or the factor must be re-read.

So the cost is a few events per request, not one per token. Per-request
progress is kept as ``target_step`` against the replica's ``steps_done``
counter (a min-heap gives the next completion). ``factor`` is the jitter
process times any active latency spike, read at each segment start.

A request needs ``output_tokens`` decode steps after its prefill (the
project's convention: ``e2e = ttft + output_tokens * step``); its
``prompt + output`` tokens are reserved in the KV cache from admission to
completion. A request larger than the whole cache is admitted only alone.
Prefix caching: the leading ``hash_ids`` blocks already seen on the replica
(LRU over the cache's block count) are not prefilled again.

KV memory (``FleetConfig.kv_allocator``): ``'reserve'`` (default) counts
reserved tokens only; ``'contiguous'`` and ``'paged'`` place each admitted
request in a :mod:`sim.kvalloc` allocator (512-token blocks, Mooncake prefix
blocks shared), so with ``'contiguous'`` the head of the queue waits when no
hole fits it. :meth:`Replica.relocate` compacts; the requests it moves pause
for its duration (their remaining decode steps end that many steps later).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controllers.dispatch import DispatchParams
from sim.kvalloc import COPY_BANDWIDTH_BYTES_S, ContiguousKvAllocator, PagedKvAllocator
from sim.perf_model import PerfModel
from sim.sde import JitterProcess

BLOCK_TOKENS = 512
STARTING, READY, DRAINING, GONE = "starting", "ready", "draining", "gone"
IDLE, PREFILL, DECODE = 0, 1, 2
KV_ALLOCATORS = {"reserve": None, "contiguous": ContiguousKvAllocator, "paged": PagedKvAllocator}


class FleetConfigError(ValueError):
    """A fleet parameter or command is invalid (names the parameter)."""


@dataclass(frozen=True)
class FleetConfig:
    """Static fleet parameters.

    Parameters
    ----------
    models, zones : Mapping[str, PerfModel], tuple of str
        Model name -> service-time model; zone names.
    startup_s, max_batch : float, int
        Scale-up to ready delay; most requests in a replica's running batch.
    kv_capacity_tokens, max_prefill_tokens : int
        Override of ``PerfModel.kv_capacity_tokens``; token budget of one
        batched prefill (the first request always fits).
    jitter, prefix_cache, context_aware_decode : bool
        Per-replica OU service-time factor (``jitter_*`` as in
        :class:`sim.sde.JitterProcess`); skip cached leading ``hash_ids``
        blocks; decode step time depends on context tokens.
    network_ms_median, network_sigma, initial_replicas, seed : float, float, int, int
        Lognormal network delay; replicas per (zone, model) ready at t = 0;
        seed of every random stream.
    kv_allocator, kv_copy_bandwidth_bytes_s : str, float
        ``'reserve'`` (token counting, the default), ``'contiguous'`` or
        ``'paged'`` (see the module docstring); per-GPU copy bandwidth of a
        compaction (times ``tensor_parallel``).
    dispatch : DispatchParams
        How a request picks a replica of its (zone, model): least outstanding
        tokens (the default) or prefix-aware (:mod:`controllers.dispatch`).
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
    jitter_sigma0: float = 1.27  # fitted to the Splitwise repetitions (sim.calibration), not assumed
    jitter_k: float = 0.0
    jitter_L_knee: float = 150.0
    prefix_cache: bool = True
    context_aware_decode: bool = True
    network_ms_median: float = 2.0
    network_sigma: float = 0.3
    initial_replicas: int = 0
    seed: int = 0
    kv_allocator: str = "reserve"
    kv_copy_bandwidth_bytes_s: float = COPY_BANDWIDTH_BYTES_S
    dispatch: DispatchParams = DispatchParams()

    def __post_init__(self) -> None:
        object.__setattr__(self, "zones", tuple(self.zones))
        if not self.models or not all(isinstance(p, PerfModel) for p in self.models.values()):
            raise FleetConfigError("models: need at least one name -> PerfModel")
        if not self.zones or len(set(self.zones)) != len(self.zones):
            raise FleetConfigError("zones: need at least one, no duplicates")
        checks = {
            "startup_s": self.startup_s >= 0,
            "max_batch": self.max_batch >= 1,
            "max_prefill_tokens": self.max_prefill_tokens >= 1,
            "kv_capacity_tokens": self.kv_capacity_tokens is None or self.kv_capacity_tokens >= 1,
            "network_ms_median": self.network_ms_median >= 0,
            "network_sigma": self.network_sigma >= 0,
            "initial_replicas": self.initial_replicas >= 0,
            "jitter_theta": self.jitter_theta > 0,
            "jitter_L_bar": self.jitter_L_bar > 0,
            "jitter_sigma0": self.jitter_sigma0 >= 0,
            "kv_allocator": self.kv_allocator in KV_ALLOCATORS,
            "kv_copy_bandwidth_bytes_s": self.kv_copy_bandwidth_bytes_s > 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise FleetConfigError(f"{name}: invalid value {getattr(self, name)!r}")


class Request:
    """Mutable state of one in-flight request (internal to the simulator)."""

    __slots__ = (
        "request_id",
        "zone",
        "model",
        "request_class",
        "prompt",
        "output",
        "hash_ids",
        "arrival_t",
        "reach_t",
        "network_ms",
        "preprocess_ms",
        "prefill_start_t",
        "first_token_t",
        "kv_hit_blocks",
        "kv_hit",
        "prefill_tokens",
        "need",
        "pause_steps",
        "agent",
    )

    def __init__(
        self,
        request_id: str,
        zone: str,
        model: str,
        request_class: str,
        prompt: int,
        output: int,
        hash_ids: list[int] | None,
        arrival_t: float,
        network_ms: float,
        preprocess_ms: float,
    ) -> None:
        self.request_id, self.zone, self.model = request_id, zone, model
        self.request_class, self.prompt, self.output, self.hash_ids = request_class, prompt, output, hash_ids
        self.arrival_t, self.network_ms, self.preprocess_ms = arrival_t, network_ms, preprocess_ms
        self.reach_t = arrival_t + (network_ms + preprocess_ms) / 1000.0
        self.prefill_start_t = self.first_token_t = -1.0
        self.kv_hit_blocks, self.kv_hit, self.prefill_tokens = 0, False, prompt
        self.need = prompt + output
        self.pause_steps = 0  # decode steps added by a relocation during its prefill
        self.agent: dict[str, Any] | None = None  # agent fields its record carries (Fleet.submit)

    def reset(self) -> None:
        """Forget service progress (the replica failed)."""
        self.prefill_start_t = self.first_token_t = -1.0
        self.kv_hit_blocks, self.kv_hit, self.prefill_tokens = 0, False, self.prompt


class Replica:
    """One replica's queue, running batch and service segments."""

    def __init__(
        self,
        node: str,
        zone: str,
        model: str,
        perf: PerfModel,
        *,
        state: str,
        max_batch: int,
        kv_capacity_tokens: int,
        max_prefill_tokens: int,
        jitter: JitterProcess | None,
        prefix_cache: bool,
        context_aware: bool,
        t_s: float,
        kv_allocator: str = "reserve",
        copy_bandwidth_bytes_s: float = COPY_BANDWIDTH_BYTES_S,
    ) -> None:
        self.node, self.zone, self.model, self.perf, self.state = node, zone, model, perf, state
        self.max_batch, self.kv_cap, self.max_prefill = max_batch, kv_capacity_tokens, max_prefill_tokens
        self.jitter, self.prefix_cache, self.context_aware = jitter, prefix_cache, context_aware
        self.queue: deque[Request] = deque()
        self.heap: list[tuple[int, int, Request]] = []  # (target_step, seq, request) decoding
        self.prefilling: list[Request] = []
        self.steps_done = 0
        self.phase = IDLE
        self.seg_t0 = self.seg_step_s = 0.0
        self.seg_steps = 0
        self.version = 0
        self.kv_used = 0  # reserved tokens of prefilling + decoding requests
        self.outstanding = 0  # tokens not yet served: queued prompt+output, running output
        self.sum_prompt = self.sum_start = 0  # decode context bookkeeping
        self.busy_acc, self.busy_since, self.snap_t = 0.0, t_s, t_s
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.cache_cap = max(1, kv_capacity_tokens // BLOCK_TOKENS)
        self.spikes: list[tuple[float, float, float]] = []
        self._seq = 0
        self.kv_kind, self.copy_bw = kv_allocator, copy_bandwidth_bytes_s * perf.tensor_parallel
        self.kv: ContiguousKvAllocator | PagedKvAllocator | None = None
        self._reset_kv(0)

    def _reset_kv(self, generation: int) -> None:
        cls = KV_ALLOCATORS[self.kv_kind]
        if cls is not None:
            bpt = self.perf.kv_bytes_per_token
            self.kv = cls(max(self.kv_cap, BLOCK_TOKENS) * bpt, BLOCK_TOKENS * bpt)
            self.kv.generation = generation

    # -- load and state ------------------------------------------------------------------
    @property
    def running(self) -> int:
        return len(self.heap) + len(self.prefilling)

    @property
    def in_flight(self) -> int:
        return len(self.queue) + self.running

    def factor(self, t: float) -> float:
        f = 1.0 if self.jitter is None else self.jitter.factor(t)
        if self.spikes:
            self.spikes = [s for s in self.spikes if s[1] > t]
            for start, end, x in self.spikes:
                if start <= t < end:
                    f *= x
        return f

    def _admissible(self) -> bool:
        if self.state != READY or not self.queue or self.running >= self.max_batch:
            return False
        if self.kv is not None:
            q = self.queue[0]
            return self.running == 0 or self.kv.fits(q.need * self.perf.kv_bytes_per_token, q.hash_ids)
        return self.kv_used + self.queue[0].need <= self.kv_cap or self.running == 0

    # -- inputs --------------------------------------------------------------------------
    def enqueue(self, req: Request, t: float) -> float | None:
        """Queue a request; returns a new event time if the replica must act sooner."""
        self.queue.append(req)
        self.outstanding += req.need
        return self.poke(t, force=False)

    def poke(self, t: float, force: bool) -> float | None:
        """Re-plan: start now if idle, or cut the decode segment at the next step boundary."""
        if self.phase == IDLE:
            return self._start_next(t)
        if self.phase == DECODE and (force or self._admissible()):
            n = max(0, math.ceil((t - self.seg_t0) / self.seg_step_s - 1e-9))
            if n < self.seg_steps:
                self.seg_steps = n
                self.version += 1
                return self.seg_t0 + n * self.seg_step_s
        return None

    def take_queue(self) -> list[Request]:
        """Remove and return the not-yet-admitted requests (for re-routing)."""
        out = list(self.queue)
        self.queue.clear()
        self.outstanding -= sum(r.need for r in out)
        return out

    def evict_all(self, t: float) -> list[Request]:
        """Fail: drop everything, return all requests reset for re-queueing."""
        reqs = self.take_queue() + self.prefilling + [e[2] for e in self.heap]
        for r in reqs:
            r.reset()
        self.prefilling, self.heap = [], []
        self.kv_used = self.outstanding = self.sum_prompt = self.sum_start = 0
        if self.kv is not None:
            self._reset_kv(self.kv.generation + 1)
        self._set_phase(IDLE, t)
        self.version += 1
        return reqs

    # -- service -------------------------------------------------------------------------
    def on_event(self, t: float) -> tuple[list[Request], float | None]:
        """End the current segment at ``t``; return completed requests and the next event time."""
        done: list[Request] = []
        if self.phase == PREFILL:
            for r in self.prefilling:
                r.first_token_t = t
                self.outstanding -= r.prompt
                if r.output <= 0:
                    self.kv_used -= r.need
                    if self.kv is not None:
                        self.kv.free(r.request_id)
                    done.append(r)
                else:
                    self._seq += 1
                    start = self.steps_done + r.pause_steps
                    r.pause_steps = 0
                    heapq.heappush(self.heap, (start + r.output, self._seq, r))
                    self.sum_prompt += r.prompt
                    self.sum_start += start
            self.prefilling = []
        elif self.phase == DECODE:
            self.steps_done += self.seg_steps
            heap = self.heap
            while heap and heap[0][0] <= self.steps_done:
                target, _, r = heapq.heappop(heap)
                self.kv_used -= r.need
                if self.kv is not None:
                    self.kv.free(r.request_id)
                self.outstanding -= r.output
                self.sum_prompt -= r.prompt
                self.sum_start -= target - r.output
                done.append(r)
        return done, self._start_next(t)

    def _set_phase(self, phase: int, t: float) -> None:
        if (self.phase == IDLE) != (phase == IDLE):
            if phase == IDLE:
                self.busy_acc += t - self.busy_since
            else:
                self.busy_since = t
        self.phase = phase

    def _lookup(self, req: Request) -> None:
        ids = req.hash_ids
        if not ids:
            return
        cache = self.cache
        req.kv_hit = ids[0] in cache
        hits = 0
        for h in ids:
            if h not in cache:
                break
            hits += 1
        req.kv_hit_blocks = hits
        if self.prefix_cache:
            req.prefill_tokens = max(1, req.prompt - BLOCK_TOKENS * hits)

    def _remember(self, req: Request) -> None:
        if not req.hash_ids:
            return
        cache = self.cache
        for h in req.hash_ids:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.cache_cap:
            cache.popitem(last=False)

    def _start_next(self, t: float) -> float | None:
        if self._admissible():
            tokens = 0
            while self._admissible():
                r = self.queue[0]
                self._lookup(r)
                if tokens and tokens + r.prefill_tokens > self.max_prefill:
                    break
                self.queue.popleft()
                self._remember(r)
                r.prefill_start_t = t
                self.kv_used += r.need
                if self.kv is not None:  # None when admitted alone and larger than the cache
                    self.kv.alloc(r.request_id, r.need * self.perf.kv_bytes_per_token, r.hash_ids)
                self.prefilling.append(r)
                tokens += r.prefill_tokens
            self._set_phase(PREFILL, t)
            self.seg_t0 = t
            self.version += 1
            return t + self.perf.prefill_ms(tokens) * self.factor(t) / 1000.0
        if self.heap:
            b = len(self.heap)
            k = self.heap[0][0] - self.steps_done
            ctx = None
            if self.context_aware:
                ctx = self.sum_prompt + b * self.steps_done - self.sum_start + b * k / 2
            self._set_phase(DECODE, t)
            self.seg_t0, self.seg_steps = t, k
            self.seg_step_s = self.perf.decode_step_ms(b, ctx) * self.factor(t) / 1000.0
            self.version += 1
            return t + k * self.seg_step_s
        self._set_phase(IDLE, t)
        return None

    # -- KV relocation -------------------------------------------------------------------
    def relocate(
        self, max_bytes: int, expected_generation: int | None, t: float
    ) -> tuple[dict[str, Any], float | None]:
        """Compact the KV allocator (one bounded round); returns the outcome and a new event time.

        Refused when there is no allocator or its generation is not
        ``expected_generation`` (None skips the check). Moved requests pause:
        ``ceil(duration_s / step)`` decode steps are added to their targets.
        """
        kv = self.kv
        if kv is None:
            return {"refused": "no kv allocator"}, None
        if expected_generation is not None and expected_generation != kv.generation:
            return {"refused": "generation changed", "generation": kv.generation}, None
        res = kv.compact(int(max_bytes), self.copy_bw)
        moved, k = set(res.moved_request_ids), 0
        if moved:
            step_s = (
                self.seg_step_s
                if self.phase == DECODE
                else (self.perf.decode_step_ms(max(1, len(self.heap))) * self.factor(t) / 1000.0)
            )
            k = math.ceil(res.duration_s / step_s - 1e-12) if step_s > 0 else 0
            heap = []
            for target, seq, r in self.heap:
                if r.request_id in moved:
                    target += k
                    self.sum_start += k
                heap.append((target, seq, r))
            heapq.heapify(heap)
            self.heap = heap
            for r in self.prefilling:
                if r.request_id in moved:
                    r.pause_steps += k
        out = {
            "node": self.node,
            "bytes_moved": res.bytes_moved,
            "duration_s": res.duration_s,
            "moved_request_ids": res.moved_request_ids,
            "pause_steps": k,
            "fragmentation_before": res.fragmentation_before,
            "fragmentation_after": res.fragmentation_after,
            "largest_free_before": res.largest_free_before,
            "largest_free_after": res.largest_free_after,
            "generation": res.generation,
        }
        return out, self.poke(t, force=False)

    def waiting_kv_bytes(self) -> int:
        """New KV bytes the head of the queue needs (0 when nothing waits)."""
        if not self.queue:
            return 0
        q, bpt = self.queue[0], self.perf.kv_bytes_per_token
        if self.kv is None:
            return q.need * bpt
        return self.kv.new_blocks(q.need * bpt, q.hash_ids) * self.kv.block_bytes

    # -- telemetry -----------------------------------------------------------------------
    def snapshot(self, t: float) -> dict[str, Any]:
        """GPU record fields of this replica; resets the utilisation window."""
        busy = self.busy_acc
        if self.phase != IDLE:
            busy += t - self.busy_since
            self.busy_since = t
        span = t - self.snap_t
        util = min(1.0, busy / span) if span > 0 else (1.0 if self.phase != IDLE else 0.0)
        self.busy_acc, self.snap_t = 0.0, t
        bpt = self.perf.kv_bytes_per_token
        used_blocks = -(-self.kv_used // BLOCK_TOKENS)
        free_bytes = max(0, self.kv_cap - self.kv_used) * bpt
        loaded = self.state != STARTING
        kv, kv_bytes, total_blocks = self.kv, self.kv_used * bpt, self.kv_cap // BLOCK_TOKENS
        if kv is not None:
            used_blocks, total_blocks, kv_bytes = kv.used_blocks, kv.n_blocks, kv.used_bytes
            free_bytes = kv.largest_free_block()
        rec = {
            "node": self.node,
            "zone": self.zone,
            "model": self.model,
            "state": self.state,
            "gpu_util": float(util) if loaded else 0.0,
            "mem_used_bytes": int(self.perf.weight_bytes + kv_bytes) if loaded else 0,
            "mem_total_bytes": int(self.perf.hbm_bytes),
            "kv_blocks_used": int(used_blocks),
            "kv_blocks_total": int(total_blocks),
            "largest_free_block_bytes": int(free_bytes),
            "queue_len": len(self.queue),
            "running": self.running,
        }
        if kv is not None:  # allocator telemetry (issue 6); absent in 'reserve' mode
            rec.update(
                fragmentation_ratio=float(kv.fragmentation_ratio()),
                free_block_hist=kv.free_block_histogram(),
                kv_generation=int(kv.generation),
                kv_free_bytes=int(kv.free_bytes),
                kv_waiting_bytes=int(self.waiting_kv_bytes()),
            )
        return rec


def request_record(q: Request, node: str, t: float, epoch_ms0: int) -> dict[str, Any]:
    """The JSON-safe request record of ``q`` completed on ``node`` at ``t``."""
    queue_ms = (q.prefill_start_t - q.reach_t) * 1000.0
    prefill_ms = (q.first_token_t - q.prefill_start_t) * 1000.0
    decode_ms = (t - q.first_token_t) * 1000.0
    ttft = q.network_ms + q.preprocess_ms + queue_ms + prefill_ms
    rec = {
        "schema_version": 1,
        "kind": "request",
        "request_id": q.request_id,
        "ts_ms": epoch_ms0 + round(t * 1000.0),
        "arrival_ms": epoch_ms0 + round(q.arrival_t * 1000.0),
        "model": q.model,
        "zone": q.zone,
        "node": node,
        "request_class": q.request_class,
        "queue_ms": queue_ms,
        "network_ms": q.network_ms,
        "preprocess_ms": q.preprocess_ms,
        "ttft_ms": ttft,
        "itl_ms": decode_ms / q.output if q.output > 0 else 0.0,
        "decode_ms": decode_ms,
        "e2e_ms": ttft + decode_ms,
        "prompt_tokens": q.prompt,
        "output_tokens": q.output,
        "kv_hit": q.kv_hit,
        "kv_hit_blocks": q.kv_hit_blocks,
        "status": "ok",
    }
    if q.agent:
        rec.update(q.agent)
    return rec
