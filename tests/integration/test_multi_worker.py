"""Several workers, one correct view (issue 18, item 1), on the real broker and Redis.

Two ``governor worker`` processes share the topics.  Window records are keyed by
model, so every zone of a model meets at the one worker that holds its metrics
partition (:mod:`streams.ownership`).  The test scales out and fails over:

1. one worker decides for both models (violating telemetry in both zones);
2. a second worker joins: the first saves its snapshots on revocation and
   releases one model, which the second restores and decides from then on;
3. the first is killed with SIGKILL: the survivor takes its partitions,
   restores the dead worker's model from its last periodic snapshot and goes on.

At the end the command ledger has nothing lost, nothing applied twice and no
stale decision applied over a newer one; every zone window of both models
counts every request sent (a worker that kept a partition across a rebalance
re-reads it from its committed offset: without dropping its open windows it
would count records twice), and each window record sits on its model's
partition.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from governor_telemetry.producer import TelemetryProducer

from controllers.window_record import decode_window
from core import names
from core.settings import ModelSpec, Settings
from launch.processes import EXECUTOR_READY, WORKER_READY, ChildProcess, start_executor, start_worker
from launch.topics import ensure_topics
from loop.control_loop import ControlLoop
from streams.ownership import partition_of
from streams.snapshots import SnapshotStore
from tests.integration.faults import Background, kill9, ledger_settles, records, results, tails, violating, wait_until
from tests.integration.harness import with_models

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

ZONES = ("az-a", "az-b")
MODELS = ("llama2-70b", "m0")  # metrics partitions 0 and 1 of 2 (murmur2): one model per worker
OWNS = re.compile(r"control owns (\d+) models: .*'models': \[([^\]]*)\]")


@pytest.fixture
def procs() -> Iterator[list[ChildProcess]]:
    started: list[ChildProcess] = []
    yield started
    for p in reversed(started):
        p.stop()
    print(tails(*started, n=40))


class Load(Background):
    """Violating telemetry for every (model, zone), 5 ticks a second, from a thread; requests counted per window."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.requests: dict[tuple[str, str, int], int] = {}
        super().__init__("load")

    async def _produce(self) -> None:
        s = self.settings
        async with TelemetryProducer(s.kafka_bootstrap, s.topic("telemetry"), source="mw", linger_ms=20) as p:
            i = 0
            while not self._stop.is_set():
                now = int(time.time() * 1000)
                for model in MODELS:
                    for zone in ZONES:
                        for rec in violating(i, now, zone, model, (f"{zone}/n1", f"{zone}/n2")):
                            await p.send(rec)
                            if rec["kind"] == "request":
                                key = (model, zone, now - now % 1000)
                                self.requests[key] = self.requests.get(key, 0) + 1
                i += 1
                await asyncio.sleep(0.2)


def _owned(worker: ChildProcess) -> list[str] | None:
    """The models ``worker`` last said it owns (None: no assignment yet)."""
    found = OWNS.findall(worker.log_text())
    return None if not found else sorted(m.strip(" '\"") for m in found[-1][1].split(",") if m.strip())


def _applied_since(settings: Settings, model: str, since_ms: int) -> bool:
    return any(
        r["outcome"] == "applied" and r.get("model") == model and r["issued_at_ms"] > since_ms
        for r in results(settings, 0.3)
    )


def _assert_ledger_clean(report: dict[str, Any], *children: ChildProcess) -> None:
    print("ledger:", {k: v for k, v in report.items() if k != "ok"})
    why = (report, tails(*children))
    assert report["issued"] > 0, why
    assert report["lost"] == [], why
    assert report["applied_twice"] == [], why
    assert report["regressions"] == [], why
    assert report["unexplained"] == [], why


def test_two_workers_divide_the_models_and_the_survivor_of_a_sigkill_takes_over(
    settings: Settings, tmp_path: Path, procs: list[ChildProcess]
) -> None:
    t0 = time.monotonic()
    # A known replica capacity: the feedforward sizes from the first window (a command every few windows).
    settings = with_models(settings, *(ModelSpec(m, replica_capacity_rps=5.0) for m in MODELS)).replace(
        zones=ZONES,
        partitions=2,
        command_ttl_s=30.0,
        pid_gains={"kp": 0.0, "ki": 0.5, "kd": 0.0},  # 1 s windows: acts within a few windows
        session_timeout_s=4.0,  # a SIGKILLed worker's membership lapses in ~4 s
    )
    assert sorted(partition_of(m, 2) for m in MODELS) == [0, 1]
    asyncio.run(ensure_topics(settings))
    r = redis.Redis.from_url(str(settings.redis_url))
    for zone in ZONES:
        r.hset(names.desired_replicas(settings.topic_prefix, zone), mapping=dict.fromkeys(MODELS, 2))
    first = start_worker(settings, tmp_path, "worker-1")
    procs.append(first)
    for zone in ZONES:
        procs.append(start_executor(settings, zone, tmp_path))
    first.wait_for_log(WORKER_READY, 60)
    for ex in procs[1:]:
        ex.wait_for_log(EXECUTOR_READY, 30)
    wait_until(lambda: _owned(first) == sorted(MODELS), 20, f"worker-1 owns both models\n{first.tail()}")
    timings: dict[str, float] = {"first worker ready (s)": time.monotonic() - t0}
    with Load(settings) as load:
        # 1. One worker decides for both models.
        start_ms = int(time.time() * 1000)
        for m in MODELS:
            wait_until(
                lambda m=m: _applied_since(settings, m, start_ms), 30, f"{m} scaled by worker-1\n{tails(*procs)}"
            )
        # 2. Scale out: the second worker takes one model, restored from what the first saved on revocation.
        t_join = time.monotonic()
        second = start_worker(settings, tmp_path, "worker-2")
        procs.append(second)
        wait_until(lambda: _owned(second) is not None and len(_owned(second) or []) == 1, 60, tails(first, second))
        wait_until(lambda: len(_owned(first) or []) == 1, 20, f"worker-1 released a model\n{first.tail()}")
        timings["second worker start + rebalance (s)"] = time.monotonic() - t_join
        moved = (_owned(second) or [""])[0]
        kept = (_owned(first) or [""])[0]
        assert {moved, kept} == set(MODELS)
        restored = f"state restored from {settings.topic_prefix}:snapshot:model:{moved}"
        assert restored in second.log_text(), f"worker-2 restored {moved}\n{second.tail(40)}"
        joined_ms = int(time.time() * 1000)
        wait_until(lambda: _applied_since(settings, moved, joined_ms), 30, f"{moved} by worker-2\n{tails(*procs)}")
        # 3. SIGKILL the first worker late in a window; the survivor takes its partitions and its model.
        time.sleep((0.9 - time.time() % 1.0) % 1.0)
        before_kill = second.log_text().count("control owns")
        kill9(first)
        killed_ms, t_kill = int(time.time() * 1000), time.monotonic()
        wait_until(
            lambda: second.log_text().count("control owns") > before_kill and _owned(second) == sorted(MODELS),
            40,
            f"worker-2 owns both models\n{second.tail(40)}",
        )
        timings["SIGKILL -> survivor owns both models (s)"] = time.monotonic() - t_kill
        assert f"state restored from {settings.topic_prefix}:snapshot:model:{kept}" in second.log_text(), second.tail(
            40
        )
        takeover_ms = int(time.time() * 1000)
        for m in (kept, moved):  # the dead worker's model first
            wait_until(
                lambda m=m: _applied_since(settings, m, takeover_ms), 30, f"{m} by the survivor\n{tails(*procs)}"
            )
            timings[f"SIGKILL -> survivor's command for {m} applied (s)"] = time.monotonic() - t_kill
        load.stop()
        assert load.error is None, load.error
    report = ledger_settles(settings, 30)
    _assert_ledger_clean(report, second, *procs[1:3])
    commands = records(settings, "commands", 0.3)
    for m in MODELS:  # decided before the kill and after it: no gap in either model's decisions
        assert any(c["model"] == m and c["issued_at_ms"] < killed_ms for c in commands), m
        assert any(c["model"] == m and c["issued_at_ms"] > takeover_ms for c in commands), m
    # Every zone window counted every request (its fullest copy: windows come at least once),
    # and sits on its model's partition: all zones of a model meet at one worker.
    counted: dict[tuple[str, str, int], int] = {}
    for w in records(settings, "metrics", 0.0, partition=True):
        assert w["partition"] == partition_of(w["model"], 2), w
        if w["scope"] == "zone":
            key = (w["model"], w["zone"], w["window_start_ms"])
            counted[key] = max(w["count"], counted.get(key, 0))
    last = max(k[2] for k in load.requests)
    short = {k: (n, counted.get(k)) for k, n in load.requests.items() if k[2] < last and counted.get(k) != n}
    assert not short, ("windows whose count is not the requests sent (sent, counted)", short, second.tail(40))
    events = records(settings, "events", 0.3)
    assert not [e for e in events if e.get("kind") == "zone_lost"], events  # executors beat: no zone is lost
    assert "Traceback" not in second.log_text(), second.tail(60)
    timings["test (s)"] = time.monotonic() - t0
    print(timings)
    r.close()


async def test_the_store_restores_only_the_scopes_asked_and_saves_at_once_when_forced(settings: Settings) -> None:
    """What a rebalance asks of the snapshot store, on the real Redis: the gained models' scopes
    alone are restored (another worker's models are not touched), and a revocation saves at once,
    whatever the age of the last save."""
    s = settings.replace(models=tuple(ModelSpec(m) for m in MODELS), zones=ZONES)
    ring = s.keyring()
    assert ring is not None
    r = aioredis.Redis.from_url(str(s.redis_url))
    now = [int(time.time() * 1000)]
    try:
        donor = ControlLoop(s)
        for k in (1, 2):
            for m in MODELS:
                w = {"scope": "zone", "model": m, "zone": "az-a", "window_end_ms": now[0] + 1000 * k, "window_s": 1.0}
                donor.decide(decode_window({**w, "count": 50, "violation_rate": 0.5, "replicas_ready": 2}), now[0])
        store = SnapshotStore(r, s.topic_prefix, donor, ring, lambda: now[0])
        assert await store.save(100.0)
        assert not await store.save(100.5)  # under every_s: skipped ...
        assert await store.save(100.6, force=True)  # ... unless forced (a revocation)
        heir = ControlLoop(s)
        done = await SnapshotStore(r, s.topic_prefix, heir, ring, lambda: now[0]).restore({f"model:{MODELS[1]}"})
        assert set(done) == {f"model:{MODELS[1]}"} and heir.owned == {f"model:{MODELS[1]}"}
        assert heir.scaler.snapshot(only=MODELS[0]) != donor.scaler.snapshot(only=MODELS[0])  # not restored
        assert heir.scaler.snapshot(only=MODELS[1]) == donor.scaler.snapshot(only=MODELS[1])
    finally:
        await r.aclose()
