"""Several workers, one correct view: which models this worker decides for.

Telemetry is keyed ``model|zone``, so the zones of one model land on different
partitions and, with several ``governor worker`` processes in one consumer
group, on different workers.  The decisions that need every zone of a model
(zone loss and zone-aware capacity in the scaler, routing, breaker fan-out,
missing-telemetry silence) are therefore taken one stage later: window records
go to the metrics topic keyed by their model's *control group* and on the
partition that key names (:meth:`Ownership.partition`), so every zone of a model
-- and every model of a fallback family, whose routing weights span both --
meets at the one worker that holds that metrics partition.

A control group is a model, or for the models of ``GOVERNOR_FALLBACKS`` pairs
the connected family (named by its smallest model name).  The partition is
Kafka's default partitioner over the group's name (murmur2, positive, modulo
``GOVERNOR_PARTITIONS``), sent explicitly, so the worker that owns a partition
knows which models it decides for without waiting for their windows.

On a rebalance (Faust's eager protocol revokes every partition, then assigns)
the worker (:mod:`streams.agents`):

- on revocation: drops its open telemetry windows (:func:`reset_ingest`,
  :mod:`loop.partitioned_ingest`: their records were not acknowledged, so
  whoever is assigned re-reads and windows them again), saves the snapshots
  of everything it decided on and stops writing them until it owns them again;
- on assignment: drops what it windowed in between (an event in hand when the
  flow stopped), forgets the models it no longer owns (:func:`release`: no
  snapshot writes, no silence judged, their ``governor_replicas_target``
  series removed) and restores the sealed snapshots of the models it gained
  (:meth:`streams.snapshots.SnapshotStore.restore`) before it takes their
  first window.

>>> from core.settings import ModelSpec, Settings
>>> s = Settings(models=(ModelSpec("a"), ModelSpec("b"), ModelSpec("c")), fallbacks=(("b", "a"),), partitions=4)
>>> own = Ownership(s)
>>> own.group_of  # b falls back to a: one family, one group
{'a': 'a', 'b': 'a', 'c': 'c'}
>>> [own.partition(m) for m in ("a", "b", "c")], own.key("b")
([0, 0, 2], b'a')
>>> sorted(own.assign({0, 1}))
['a', 'b']
>>> own.scopes({"a", "b"})
['family:b', 'model:a', 'model:b']
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiokafka.partitioner import murmur2

from core.settings import Settings

if TYPE_CHECKING:
    from loop.control_loop import ControlLoop

__all__ = ["Ownership", "Rebalance", "partition_of", "release", "reset_ingest"]

log = logging.getLogger(__name__)


def partition_of(key: str, partitions: int) -> int:
    """Kafka's default partitioner (murmur2 of the key bytes, made positive) over ``partitions``."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return int(murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def _groups(models: Iterable[str], fallbacks: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Model -> its control group: the smallest name of its connected fallback family (or itself)."""
    parent: dict[str, str] = {m: m for m in models}

    def root(m: str) -> str:
        parent.setdefault(m, m)
        while parent[m] != m:
            parent[m] = parent[parent[m]]
            m = parent[m]
        return m

    for a, b in fallbacks:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {m: root(m) for m in sorted(parent)}


class Ownership:
    """The metrics partition of each model and the models this worker owns (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.partitions = settings.partitions
        self.group_of = _groups((spec.name for spec in settings.models), settings.fallbacks)
        self._families: dict[str, str] = {}  # family primary -> its control group
        for primary, _fallback in settings.fallbacks:
            self._families[primary] = self.group_of[primary]
        self.assigned: frozenset[int] = frozenset()  # metrics partitions held now
        self.models: frozenset[str] = frozenset()  # configured models whose metrics partition is held

    def key(self, model: str) -> bytes:
        """The Kafka key of a model's window records: its control group's name."""
        return self.group_of.get(model, model).encode()

    def partition(self, model: str) -> int:
        """The metrics partition of ``model``'s window records (every zone, every node)."""
        return partition_of(self.group_of.get(model, model), self.partitions)

    def assign(self, partitions: Collection[int]) -> frozenset[str]:
        """Hold ``partitions`` of the metrics topic; the configured models they carry."""
        self.assigned = frozenset(partitions)
        self.models = frozenset(m for m in self.group_of if self.partition(m) in self.assigned)
        return self.models

    def scopes(self, models: Collection[str]) -> list[str]:
        """The snapshot scopes of ``models``: ``model:<m>`` each, ``family:<primary>`` of their families."""
        groups = {self.group_of.get(m, m) for m in models}
        return sorted(
            [f"model:{m}" for m in models] + [f"family:{f}" for f, g in self._families.items() if g in groups]
        )


def reset_ingest(loop: ControlLoop) -> int:
    """Drop every open telemetry window (:meth:`PartitionedIngest.reset`); how many (model, zone, node) were open.

    After a rebalance every partition is re-read from its committed offset, and
    a message is acknowledged only once its windows closed: the records of the
    dropped windows come again, to whichever worker holds their partition now.
    """
    return loop.ingests.reset()


def release(loop: ControlLoop, models: Collection[str], scopes: Collection[str]) -> None:
    """Stop deciding for ``models`` (their partitions went to another worker).

    Their snapshot ``scopes`` are no longer written by this worker (the new
    owner's state must not be overwritten), their zones are no longer judged
    silent (:meth:`ControlLoop.check_silence`: a model whose windows go
    elsewhere is not missing), and their ``governor_replicas_target``,
    ``governor_replica_capacity_rps`` and ``governor_telemetry_stale`` series are removed (KEDA takes the max over
    workers: an old owner's target must not linger).
    """
    loop.owned.difference_update(scopes)
    watch = loop.watch
    for key in [k for k in watch.last_end_ms if k[0] in models]:
        watch.last_end_ms.pop(key, None)
        watch.stale.pop(key, None)
    if loop.metrics is None:
        return
    for model in models:
        for zone in loop.settings.zones:
            for gauge in (loop.metrics.target, loop.metrics.capacity, loop.metrics.stale):
                try:
                    gauge.remove(model, zone)
                except KeyError:  # no series for this key on this worker
                    pass


class _Store(Protocol):
    """What a rebalance needs of :class:`streams.snapshots.SnapshotStore`."""

    async def save(self, now_s: float, *, force: bool = False) -> bool: ...

    async def restore(self, only: Collection[str] | None = None) -> dict[str, dict[str, int]]: ...


@dataclass
class Rebalance:
    """The worker's side of a consumer-group rebalance (see the module docstring).

    :meth:`hold` / :meth:`ack_closed` keep the ingest agent's telemetry events
    unacknowledged until their windows closed; on a rebalance they are dropped,
    never acknowledged (the partitions are re-read from their committed
    offsets), and so is an event the agent had in hand then (its generation).
    Redis work is bounded by ``redis_timeout_s``: a rebalance must finish
    within the session timeout, and a snapshot that cannot be saved or restored
    in time is logged (the next owner then starts from the last periodic save,
    or fresh).
    """

    loop: ControlLoop
    ownership: Ownership
    snapshots: _Store
    metrics_topic: str
    unacked: deque[tuple[Any, int | None, int]] = field(default_factory=deque)  # (event, max ts, generation)
    generation: int = 0  # of the ingest windows: + 1 at each revocation
    redis_timeout_s: float = 3.0
    _held: set[str] = field(default_factory=set, init=False)  # scopes decided on before the revocation

    def hold(self, event: Any, max_ts_ms: int | None, generation: int) -> None:
        """Keep a telemetry event unacknowledged (``generation``: :attr:`generation` when it was ingested)."""
        self.unacked.append((event, max_ts_ms, generation))

    def ack_closed(self) -> None:
        """Acknowledge, in order, the held events whose windows have all closed (Faust then commits them)."""
        while self.unacked:
            event, max_ts, gen = self.unacked[0]
            current = gen == self.generation
            if current and not self.loop.committable(max_ts, event.message.partition):
                return
            self.unacked.popleft()
            if current:
                event.ack()

    def _drop_ingest(self) -> int:
        self.generation += 1
        self.unacked.clear()
        return reset_ingest(self.loop)

    async def revoked(self, now_s: float) -> dict[str, Any]:
        """Partitions revoked (all of them: eager protocol): drop open windows, save, stop writing snapshots."""
        dropped = self._drop_ingest()
        saved: bool | None = None
        if self.loop.owned:
            try:
                saved = await asyncio.wait_for(self.snapshots.save(now_s, force=True), self.redis_timeout_s)
            except TimeoutError:
                saved = False
        self._held = set(self.loop.owned)
        self.loop.owned.clear()  # written again only for what this worker owns after the assignment
        out = {"open_windows_dropped": dropped, "scopes_saved": sorted(self._held) if saved else [], "saved": saved}
        if saved is False:
            log.warning(
                "rebalance: snapshots of %s not saved (redis); their next owner restores an older one",
                sorted(self._held),
            )
        return out

    async def assigned(self, partitions: Iterable[tuple[str, int]]) -> dict[str, Any]:
        """The new assignment ((topic, partition) pairs): release what went elsewhere, restore what came."""
        # Again: an event the ingest agent had in hand when the flow stopped was windowed after the
        # revocation; the flow resumes after this, from the committed offsets.
        dropped = self._drop_ingest()
        before = self.ownership.models
        now = self.ownership.assign({p for t, p in partitions if t == self.metrics_topic})
        gone, gained, kept = before - now, now - before, before & now
        release(self.loop, gone, self.ownership.scopes(gone))
        self.loop.owned.update(self._held & set(self.ownership.scopes(kept)))
        self._held = set()
        restored: dict[str, dict[str, int]] = {}
        if gained:
            try:
                restored = await asyncio.wait_for(
                    self.snapshots.restore(set(self.ownership.scopes(gained))), self.redis_timeout_s
                )
            except TimeoutError:
                log.warning("rebalance: snapshots of %s not restored in time (redis); they start fresh", sorted(gained))
        return {
            "partitions": sorted(self.ownership.assigned),
            "models": sorted(now),
            "released": sorted(gone),
            "gained": sorted(gained),
            "restored": sorted(restored),
            "open_windows_dropped": dropped,
        }
