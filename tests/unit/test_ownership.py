"""Several workers, one correct view: model-keyed control, per-partition windows, rebalances.

No broker and no Redis: :mod:`streams.ownership` and :mod:`loop.partitioned_ingest`
are plain objects the Faust agents call (tests/integration/test_multi_worker.py runs
them in two real workers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner

from controllers.window_record import decode_window
from core.settings import ModelSpec, Settings
from loop.control_loop import ControlLoop
from streams.metrics_export import WorkerMetrics
from streams.ownership import Ownership, Rebalance, partition_of, release

T0 = 1_700_000_000_000
ZONES = ("az-a", "az-b")


def _settings(*models: str, fallbacks: tuple[tuple[str, str], ...] = (), partitions: int = 4) -> Settings:
    return Settings(
        models=tuple(ModelSpec(m) for m in models),
        zones=ZONES,
        window_s=1.0,
        lateness_s=0.2,
        partitions=partitions,
        fallbacks=fallbacks,
    )


def _batch(model: str, zone: str, ts: int, n: int = 3) -> bytes:
    recs: list[dict[str, Any]] = [
        {
            "kind": "request",
            "request_id": f"{zone}-{ts}-{i}",
            "ts_ms": ts,
            "model": model,
            "zone": zone,
            "node": f"{zone}/n1",
            "ttft_ms": 100.0,
            "e2e_ms": 900.0,
            "status": "ok",
        }
        for i in range(n)
    ]
    return orjson.dumps({"schema_version": 1, "kind": "batch", "source": "t", "sent_ms": ts, "records": recs})


def _zone_window(model: str, zone: str, end_ms: int) -> Any:
    return decode_window(
        {
            "scope": "zone",
            "model": model,
            "zone": zone,
            "window_end_ms": end_ms,
            "window_s": 1.0,
            "count": 50,
            "violation_rate": 0.5,
            "replicas_ready": 2,
            "running_mean": 2.0,
        }
    )


# -- which worker decides which model ---------------------------------------------------------


@pytest.mark.parametrize("key", ["llama2-70b", "m0", "a", "zz-model", "ünïcode"])
@pytest.mark.parametrize("partitions", [1, 2, 3, 8])
def test_the_partition_is_kafkas_default_partitioners(key: str, partitions: int) -> None:
    parts = list(range(partitions))
    assert partition_of(key, partitions) == DefaultPartitioner()(key.encode(), parts, parts)


def test_no_partitions_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="partitions"):
        partition_of("m", 0)


def test_every_model_of_a_fallback_family_meets_on_one_partition() -> None:
    own = Ownership(_settings("a", "b", "c", "d", fallbacks=(("c", "b"), ("b", "a")), partitions=8))
    assert own.group_of == {"a": "a", "b": "a", "c": "a", "d": "d"}  # a chain is one family
    assert own.partition("a") == own.partition("b") == own.partition("c") == partition_of("a", 8)
    assert own.key("c") == b"a"
    models = own.assign({own.partition("a")})
    assert {"a", "b", "c"} <= models
    assert own.scopes({"a", "b", "c"}) == ["family:b", "family:c", "model:a", "model:b", "model:c"]


def test_two_workers_holding_all_partitions_own_every_model_exactly_once() -> None:
    s = _settings(*(f"m{i}" for i in range(20)), partitions=4)
    w1, w2 = Ownership(s), Ownership(s)
    one, two = w1.assign({0, 2}), w2.assign({1, 3})
    assert one | two == {f"m{i}" for i in range(20)} and not one & two
    assert one and two  # 20 models over 4 partitions: both get some


# -- a released model is no longer judged, written or exported --------------------------------


def test_a_released_model_is_neither_snapshotted_nor_judged_silent_nor_exported() -> None:
    metrics = WorkerMetrics()
    loop = ControlLoop(_settings("a", "b"), metrics)
    for zone in ZONES:
        for k in (1, 2):
            loop.decide(_zone_window("a", zone, T0 + 1000 * k), T0 + 1000 * k)
            loop.decide(_zone_window("b", zone, T0 + 1000 * k), T0 + 1000 * k)
    assert loop.owned == {"model:a", "model:b"}

    def target(model: str, zone: str) -> float | None:
        return metrics.registry.get_sample_value("governor_replicas_target", {"model": model, "zone": zone})

    assert target("b", "az-a") is not None
    release(loop, {"b"}, ["model:b"])
    assert set(loop.snapshot_scopes()) == {"model:a"}
    assert target("b", "az-a") is None and target("b", "az-b") is None and target("a", "az-a") is not None
    # Long after the last window: only the model still owned is judged silent.
    events = loop.check_silence(T0 + 60_000)
    assert {(e["model"], e["zone"]) for e in events} == {("a", "az-a"), ("a", "az-b")}


# -- per-partition windows ----------------------------------------------------------------------


def test_a_backlog_on_one_partition_is_not_late_behind_live_data_on_another() -> None:
    """A survivor reads its own partition live and a dead worker's partition seconds behind."""
    for partitioned, late in ((False, True), (True, False)):
        loop = ControlLoop(_settings("a"))
        loop.ingests.partitioned = partitioned
        now = T0 + 10_000
        live = loop.ingest(_batch("a", "az-a", now), {"topic": "t", "partition": 0, "offset": 9}, now)
        assert live.dead_letters == []
        backlog = loop.ingest(_batch("a", "az-b", T0 + 2_000), {"topic": "t", "partition": 1, "offset": 3}, now)
        assert bool(backlog.dead_letters) is late, (partitioned, backlog.dead_letters)
        assert all(d["reason"].startswith("late") for d in backlog.dead_letters)


def test_a_partition_that_has_sent_nothing_closes_nothing_by_the_clock() -> None:
    """A fresh partition's processor exists only once its first message came: the clock cannot
    close (and so make late) the windows of records it is about to re-read."""
    loop = ControlLoop(_settings("a"))
    loop.ingests.partitioned = True
    assert not loop.committable(T0, partition=1)  # asking does not create it
    assert loop.close_due(T0 + 60_000) == []
    res = loop.ingest(_batch("a", "az-a", T0), {"topic": "t", "partition": 1, "offset": 0}, T0 + 60_000)
    assert res.valid == 3 and res.dead_letters == []


# -- the rebalance ------------------------------------------------------------------------------


class Store:
    """The snapshot store's two calls, recorded (the real one against Redis: test_multi_worker)."""

    def __init__(self, restorable: dict[str, dict[str, Any]] | None = None) -> None:
        self.saved: list[list[str]] = []
        self.restored: list[set[str]] = []
        self.restorable = restorable or {}
        self.loop: ControlLoop | None = None

    async def save(self, now_s: float, *, force: bool = False) -> bool:
        assert force and self.loop is not None
        self.saved.append(sorted(self.loop.snapshot_scopes()))
        return True

    async def restore(self, only: Collection[str] | None = None) -> dict[str, dict[str, int]]:
        assert only is not None and self.loop is not None
        self.restored.append(set(only))
        done = {}
        for scope in only:
            if scope in self.restorable:
                done[scope] = self.loop.restore_scope(scope, self.restorable[scope])[0]
        return done


class Msg:
    def __init__(self, partition: int) -> None:
        self.partition = partition


class Event:
    def __init__(self, partition: int) -> None:
        self.message = Msg(partition)
        self.acked = 0

    def ack(self) -> None:
        self.acked += 1


def test_a_rebalance_saves_drops_open_windows_releases_and_restores_only_what_moved() -> None:
    s = _settings("a", "c", partitions=4)  # a -> partition 0, c -> partition 2
    assert (partition_of("a", 4), partition_of("c", 4)) == (0, 2)
    donor = ControlLoop(s)
    for k in (1, 2):
        donor.decide(_zone_window("c", "az-a", T0 + 1000 * k), T0 + 1000 * k)
    store = Store({"model:c": donor.snapshot_scopes()["model:c"]})
    loop = ControlLoop(s)
    loop.ingests.partitioned = True
    store.loop = loop
    own = Ownership(s)
    reb = Rebalance(loop, own, store, "t.metrics")

    first = asyncio.run(reb.assigned([("t.metrics", 0), ("t.telemetry", 0)]))
    assert first["models"] == ["a"] and store.restored == [{"model:a"}] and first["restored"] == []
    loop.decide(_zone_window("a", "az-a", T0 + 1000), T0 + 1000)
    res = loop.ingest(_batch("a", "az-a", T0 + 5_000), {"topic": "t", "partition": 0, "offset": 0}, T0 + 5_000)
    held = Event(0)
    reb.hold(held, res.max_ts_ms, reb.generation)
    reb.ack_closed()
    assert held.acked == 0 and loop.ingests.open_windows == 1  # its window is open

    revoked = asyncio.run(reb.revoked(0.0))
    assert revoked["open_windows_dropped"] == 1 and revoked["scopes_saved"] == ["model:a"]
    assert store.saved == [["model:a"]] and loop.owned == set()
    # An event the ingest agent had in hand across the revocation is never acknowledged.
    reb.hold(Event(0), res.max_ts_ms, reb.generation - 1)
    reb.ack_closed()
    assert not reb.unacked and held.acked == 0

    # A message the ingest agent had in hand when the flow stopped is windowed after the revocation:
    # the assignment drops that too (the flow resumes from the committed offsets).
    late_gen = reb.generation
    loop.ingest(_batch("a", "az-a", T0 + 5_200), {"topic": "t", "partition": 0, "offset": 1}, T0 + 5_200)
    second = asyncio.run(reb.assigned([("t.metrics", 2), ("t.telemetry", 2)]))
    assert second["open_windows_dropped"] == 1 and loop.ingests.open_windows == 0
    assert reb.generation == late_gen + 1
    assert second["released"] == ["a"] and second["gained"] == ["c"] and second["restored"] == ["model:c"]
    assert store.restored[-1] == {"model:c"}
    assert loop.owned == {"model:c"}  # a is no longer written; c is, as restored
    assert loop.scaler.snapshot(only="c") == donor.scaler.snapshot(only="c")

    third = asyncio.run(reb.revoked(1.0))  # kept across a rebalance: saved, then written again
    assert third["scopes_saved"] == ["model:c"]
    asyncio.run(reb.assigned([("t.metrics", 2), ("t.metrics", 3)]))
    assert loop.owned == {"model:c"} and store.restored[-1] == {"model:c"}  # nothing gained: no restore
    assert len(store.restored) == 2


def test_a_partition_behind_its_high_water_mark_closes_by_event_time_only() -> None:
    """A backlog re-read after a rebalance looks 'caught up' by the clock alone (its watermark is
    within window + lateness of it); closing by the clock then would dead-letter the rest as late."""
    for hw, closed_by_clock in ((50, False), (8, True), (None, True)):
        loop = ControlLoop(_settings("a"))
        loop.ingests.partitioned = True
        now = T0 + 1_300  # the record's window [T0, T0 + 1000) is due by the clock (lateness 0.2 s)
        loop.ingest(_batch("a", "az-a", T0 + 500), {"topic": "t", "partition": 0, "offset": 7}, now)
        closed = loop.close_due(now, lambda p, hw=hw: hw)
        assert bool(closed) is closed_by_clock, hw
        more = loop.ingest(_batch("a", "az-a", T0 + 900), {"topic": "t", "partition": 0, "offset": 8}, now)
        assert bool(more.dead_letters) is closed_by_clock, hw  # the rest of the backlog: late only if closed
