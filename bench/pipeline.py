"""``governor bench pipeline``: how fast the stream worker ingests, next to a
raw aiokafka consumer of the same messages on the same broker; how that
scales from one worker to two; what a worker's memory costs per key; and how
long a telemetry record takes to become a command in Redis.

All figures come from one run on one broker, side by side:

* ingest, per encoding (row batches and columnar batches of ``--batch``
  records, :mod:`governor_telemetry.columnar`): the real ``governor worker``
  process(es) -- one, then two in the same consumer group -- start on a
  fresh telemetry topic; once their group settled the same bytes are loaded
  at producer speed (``--preload``: before they start; the second worker's
  join then pauses the first mid-backlog) and they read the backlog;
  records/s is the backlog over the time from the first record counted to
  the last (each worker's Prometheus
  ``governor_records_total``, polled every 20 ms).  The CPU seconds of the
  broker and of each worker over that time (``/proc/<pid>/stat``) say where
  the cores went.  The raw consumer (``getmany`` + ``orjson.loads`` of every
  message: the floor any Kafka consumer in Python pays) reads the same
  topic after the workers.  Event times lie ahead of the clock and the throughput workers run
  with ``lateness_s`` 60, so no record is late (``dead_lettered`` must be 0)
  and no window closes while the backlog is read: the figure is ingest
  (decode, validate, window), closing is timed by the decision latency;
* unbatched (one record per message, one worker): the per-message cost;
* memory: the RSS of a worker (window 1 s) holding ``--keys`` (model, zone,
  node) windows -- one request and one GPU sample each -- against the same
  worker idle just before, in KB per key; and after those windows closed;
* decision latency: violating records for a fresh zone are sent, and the
  time until the resulting scale command is in that zone's Redis stream is
  measured -- in total, and after the window closed (total minus the wait
  for the window end and the allowed lateness, which is by design).

``--profile`` runs one more columnar phase with the worker under cProfile
and prints its top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from argparse import Namespace
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.partitioner import murmur2
from governor_telemetry.columnar import encode_columns, encode_typed
from governor_telemetry.records import encode_envelope, partition_key

from bench.fleet import raw_parse
from controllers.node_cap import NEW_NODES_FLOOR
from core import names
from core.settings import Settings
from core.transport import kafka_options, redis_options
from launch.embedded import EmbeddedServers, _die_with_parent, free_port
from launch.processes import WORKER_READY, ChildProcess, start_worker
from launch.topics import ensure_topics
from loop.commands import Command

MODEL = "llama2-70b"
ENCODERS = {"rows": encode_envelope, "columns": encode_columns, "typed": encode_typed}
NODES_PER_ZONE = 8  # nodes of a throughput zone; one message = one node's batch
THROUGHPUT_LATENESS_S = 60.0  # no window closes, no record is late while a backlog is read
EVENT_SPAN_MS = 20_000  # event time of a throughput backlog
POLL_S = 0.02
CLK_TCK = os.sysconf("SC_CLK_TCK")


def add_parser(sub: Any) -> None:
    """``governor bench pipeline`` in the CLI's ``bench`` group."""
    help_ = "pipeline ingest (rows, columns; 1 and 2 workers) vs a raw consumer, memory, latency"
    add_arguments(sub.add_parser("pipeline", help=help_))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``governor bench pipeline``."""
    p.add_argument("--events", type=int, default=500_000, help="request records per batched backlog")
    p.add_argument("--unbatched-events", type=int, default=20_000, help="records of the unbatched run (0: skip)")
    p.add_argument("--batch", type=int, default=100, help="records per Kafka message (batched runs)")
    p.add_argument("--workers", type=int, default=2, help="most workers in the scaling runs (1: one only)")
    p.add_argument("--keys", type=int, default=10_000, help="(model, zone, node) keys of the memory run (0: skip)")
    p.add_argument("--decisions", type=int, default=20, help="decision-latency samples")
    p.add_argument(
        "--preload", action="store_true", help="load each backlog before the workers start (default: once they settle)"
    )
    p.add_argument("--profile", action="store_true", help="also profile a columnar worker (cProfile)")
    p.add_argument("--profile-events", type=int, default=600_000, help="records of the profiled backlog")
    p.add_argument(
        "--profile-encoding", choices=("columns", "typed"), default="typed", help="encoding of the profiled backlog"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _request(i: int, ts_ms: int, zone: str, ttft_ms: float = 120.0, queue_ms: float = 10.0) -> dict[str, Any]:
    return {
        "kind": "request",
        "request_id": f"b{i}",
        "ts_ms": ts_ms,
        "model": MODEL,
        "zone": zone,
        "node": f"{zone}/n{i % 8}",
        "ttft_ms": ttft_ms,
        "itl_ms": 40.0,
        "e2e_ms": ttft_ms + 4000.0,
        "queue_ms": queue_ms,
        "prompt_tokens": 1000,
        "output_tokens": 100,
        "status": "ok",
    }


def _varied(i: int, ts_ms: int, zone: str, node: str) -> dict[str, Any]:
    """A request record of a throughput backlog: latencies and token counts that differ from row to row,
    as measured ones do (milliseconds to 3 decimals), from a fixed hash of ``i``."""
    h = (i * 2654435761) % 2**32
    ttft = round(40.0 + (h % 100_003) / 211.0, 3)
    rec = _request(i, ts_ms, zone, ttft_ms=ttft, queue_ms=round((h >> 7) % 5_003 / 97.0, 3))
    rec.update(
        node=node,
        itl_ms=round(20.0 + (h >> 3) % 4_001 / 157.0, 3),
        e2e_ms=round(ttft + 500.0 + (h >> 11) % 1_000_003 / 211.0, 3),
        prompt_tokens=16 + (h >> 5) % 8_000,
        output_tokens=1 + (h >> 13) % 1_000,
    )
    return rec


def _gpu(zone: str, node: str, ts_ms: int) -> dict[str, Any]:
    return {
        "kind": "gpu",
        "ts_ms": ts_ms,
        "model": MODEL,
        "zone": zone,
        "node": node,
        "state": "ready",
        "gpu_util": 0.9,
        "mem_used_bytes": 1,
        "mem_total_bytes": 2,
    }


def spread_zones(partitions: int, per_partition: int = 2, prefix: str = "tz") -> list[str]:
    """Zone names whose telemetry keys land ``per_partition`` on each partition (aiokafka's murmur2).

    >>> len(spread_zones(4))
    8
    """
    chosen: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while any(len(z) < per_partition for z in chosen.values()):
        zone = f"{prefix}{i}"
        part = (murmur2(partition_key(MODEL, zone)) & 0x7FFFFFFF) % partitions
        if len(chosen[part]) < per_partition:
            chosen[part].append(zone)
        i += 1
    return [z for p in range(partitions) for z in chosen[p]]


def backlog(n: int, batch: int, zones: Sequence[str], t0_ms: int, encoding: str) -> list[tuple[bytes, bytes]]:
    """(key, value) messages of ``n`` request records, ``batch`` per message, round-robin over
    ``zones`` and their nodes, event times spread over EVENT_SPAN_MS from ``t0_ms``.

    >>> msgs = backlog(10, 5, ["a", "b"], 0, "columns")
    >>> [k for k, _ in msgs], orjson.loads(msgs[1][1])["request"]["node"][0]
    ([b'llama2-70b|a', b'llama2-70b|b'], 'b/n0')
    """
    encode = ENCODERS[encoding]
    out = []
    for m, start in enumerate(range(0, n, batch)):
        zone = zones[m % len(zones)]
        node = f"{zone}/n{(m // len(zones)) % NODES_PER_ZONE}"
        recs = [_varied(i, t0_ms + (i * EVENT_SPAN_MS) // n, zone, node) for i in range(start, min(n, start + batch))]
        value = encode(recs, "bench", t0_ms) if batch > 1 else orjson.dumps(recs[0])
        out.append((partition_key(MODEL, zone), value))
    return out


async def _send(settings: Settings, topic: str, messages: Sequence[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        linger_ms=5,
        max_batch_size=1 << 20,
        max_request_size=8 << 20,
        **kafka_options(settings),
    )
    await producer.start()
    try:
        pending = [await producer.send(topic, value, key=key) for key, value in messages]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def _raw_consume(settings: Settings, topic: str, n_records: int, n_messages: int) -> float:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka_bootstrap,
        **kafka_options(settings),
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=8 << 20,
    )
    await consumer.start()
    try:
        got, t0 = 0, time.perf_counter()
        while got < n_messages:
            for msgs in (await consumer.getmany(timeout_ms=500, max_records=5000)).values():
                for m in msgs:
                    raw_parse(m.value)
                got += len(msgs)
        return n_records / (time.perf_counter() - t0)
    finally:
        await consumer.stop()


def _counters(port: int) -> tuple[float, float]:
    """(records read, records dead-lettered) from a worker's Prometheus counters."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r"^governor_records_total ([0-9.e+]+)$", text, re.M)
    dead = sum(float(v) for v in re.findall(r"^governor_deadletter_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))
    return (float(m.group(1)) if m else 0.0), dead


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (0 when unknown or gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kb(pid: int) -> int:
    """Resident set size of a process, in KB (/proc/<pid>/status VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class _ProfiledWorker(ChildProcess):
    """``governor worker`` under cProfile: its stats are written to ``out`` when it stops (SIGTERM)."""

    def __init__(self, settings: Settings, log_path: Path, out: Path) -> None:  # noqa: D107
        self.name, self.log_path = "worker", log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "governor.cli", "worker"],
            env={**os.environ, **settings.to_env(), "PYTHONUNBUFFERED": "1"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )


class _Worker:
    """One ``governor worker`` child with its own metrics port and data directory."""

    def __init__(self, settings: Settings, run_dir: Path, name: str, profile_to: Path | None = None) -> None:
        self.port = free_port()
        self.settings = settings.replace(metrics_port=self.port, data_dir=str(run_dir / name / "state"))
        (run_dir / name).mkdir(parents=True, exist_ok=True)
        self.child = (
            start_worker(self.settings, run_dir / name)
            if profile_to is None
            else _ProfiledWorker(self.settings, run_dir / name / "worker.log", profile_to)
        )

    @property
    def pid(self) -> int:
        return self.child.proc.pid

    def counts(self) -> tuple[float, float]:
        return _counters(self.port)

    def counts_or_zero(self) -> tuple[float, float]:
        """The counters, or zeros while the worker does not serve them yet."""
        try:
            return _counters(self.port)
        except OSError:
            return 0.0, 0.0

    def stop(self) -> None:
        # A profiled worker must exit on its own to write its stats; the others need no grace
        # (Faust's shutdown can hang in its fetcher for long seconds).
        self.child.stop(timeout_s=30 if isinstance(self.child, _ProfiledWorker) else 5)


async def _ingest(
    settings: Settings,
    run_dir: Path,
    name: str,
    messages: Sequence[tuple[bytes, bytes]],
    n_records: int,
    workers: int,
    broker_pid: int | None,
    *,
    raw: bool = False,
    profile_to: Path | None = None,
    preload: bool = False,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Time ``workers`` workers reading ``messages`` from a fresh telemetry topic.

    ``preload``: the messages are on the topic before the workers start (the first worker in
    the group may read much of them before the second joins and the rebalance pauses both).
    Otherwise the workers start on the empty topic, their group settles (every worker ready,
    no rejoin for SETTLE_S), then the messages are loaded -- at producer speed, far above the
    workers' rate, so they read a backlog all the same.  The raw consumer reads the same
    messages after the workers.
    """
    s = settings.replace(topic_prefix=f"{settings.topic_prefix}-{name}")
    await ensure_topics(s)
    if preload:
        await _send(s, s.topic("telemetry"), messages)
    out: dict[str, Any] = {"records": n_records, "messages": len(messages), "workers": workers, "preload": preload}
    procs = [_Worker(s, run_dir, f"{name}-w{i}", profile_to) for i in range(workers)]
    try:
        if not preload:
            await _settle(procs)
            load = asyncio.create_task(_send(s, s.topic("telemetry"), messages))
        # Polled from the start: a worker reads the backlog as soon as it has partitions, which
        # may be before its ready line.  The run starts at the last poll that saw no record.
        pids = [w.pid for w in procs]
        prev_t, prev_cpu = time.perf_counter(), [cpu_s(broker_pid), cpu_s(os.getpid()), *map(cpu_s, pids)]
        t_first: float | None = None
        cpu0: list[float] = []
        done_at: list[float | None] = [None] * workers  # when each worker's count last grew
        first_at: list[float | None] = [None] * workers  # the poll before its first record
        counts_prev = [0.0] * workers
        series: list[tuple[float, list[float]]] = []  # (poll time, each worker's records)
        deadline = time.perf_counter() + timeout_s
        while True:
            counts = [w.counts_or_zero() for w in procs]
            now, cpu = time.perf_counter(), [cpu_s(broker_pid), cpu_s(os.getpid()), *map(cpu_s, pids)]
            total = sum(c[0] for c in counts)
            series.append((now, [c[0] for c in counts]))
            if t_first is None and total > 0:
                t_first, cpu0 = prev_t, prev_cpu
            for i, (c, _) in enumerate(counts):
                if c > 0 and first_at[i] is None:
                    first_at[i] = prev_t
                if c > counts_prev[i]:
                    done_at[i] = now
            if total >= n_records:
                break
            if now > deadline:
                raise TimeoutError(f"{name}: workers read {total:.0f} of {n_records} records")
            for w in procs:
                if not w.child.alive():
                    raise RuntimeError(f"{name}: a worker exited:\n{w.child.tail()}")
            counts_prev, prev_t, prev_cpu = [c[0] for c in counts], now, cpu
            await asyncio.sleep(POLL_S)
        assert t_first is not None
        if not preload:
            await load
        wall = max(now - t_first, POLL_S)
        used = [round((b - a) / wall, 2) for a, b in zip(cpu0, cpu, strict=True)]
        out.update(
            pipeline_rps=round(n_records / wall),
            seconds=round(wall, 2),
            dead_lettered=round(sum(c[1] for c in counts)),
            per_worker=[
                {
                    "records": round(c[0]),
                    "rps": round(c[0] / max((d or now) - (f or now), POLL_S)) if c[0] else 0,
                    "cores": u,
                    "rss_mb": round(rss_kb(pid) / 1024),
                }
                for c, f, d, u, pid in zip(counts, first_at, done_at, used[2:], pids, strict=True)
            ],
            broker_cores=used[0] if broker_pid is not None else None,
            bench_cores=used[1],  # this process: polling, and loading the backlog unless preloaded
            all_reading_rps=_all_reading_rps(series, done_at),
        )
    finally:
        for w in procs:
            w.stop()
    if raw:
        out["raw_consumer_rps"] = round(await _raw_consume(s, s.topic("telemetry"), n_records, len(messages)))
    return out


#: The shortest stretch with every worker reading that :func:`_all_reading_rps` takes as a rate.
ALL_READING_MIN_S = 0.5


def _all_reading_rps(series: Sequence[tuple[float, list[float]]], done_at: Sequence[float | None]) -> int | None:
    """Records/s of the workers together while every one of them reads: from the first poll where each
    has counted a record to the first time one of them stops counting (the start-up, a rebalance's
    pause and the tail where one worker has finished left out).  None: no such stretch of at least
    ALL_READING_MIN_S.

    >>> _all_reading_rps([(0.0, [0, 0]), (1.0, [50, 0]), (2.0, [100, 10]), (3.0, [150, 60]), (4.0, [150, 100])],
    ...                  [3.0, 4.0])
    100
    """
    start = next(((t, sum(c)) for t, c in series if all(x > 0 for x in c)), None)
    ends = [d for d in done_at if d is not None]
    if start is None or len(ends) < len(done_at):
        return None
    end_t = min(ends)
    end = next((sum(c) for t, c in series if t >= end_t), None)
    if end is None or end_t - start[0] < ALL_READING_MIN_S:
        return None
    return round((end - start[1]) / (end_t - start[0]))


SETTLE_S = 3.0  # a group is settled when no worker rejoined for this long


async def _settle(procs: Sequence[_Worker], timeout_s: float = 120.0) -> None:
    """Wait until every worker is ready and none has rejoined the group for SETTLE_S."""
    await asyncio.gather(*(asyncio.to_thread(w.child.wait_for_log, WORKER_READY, timeout_s) for w in procs))
    deadline = time.monotonic() + timeout_s
    joins, quiet_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now_joins = sum(w.child.log_text().count("(Re-)joining group") for w in procs)
        if now_joins != joins:
            joins, quiet_since = now_joins, time.monotonic()
        elif time.monotonic() - quiet_since >= SETTLE_S:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the workers' group did not settle within {timeout_s:.0f} s")


async def _has_scale_command(redis: aioredis.Redis, key: str) -> bool:
    # redis-py types the reply for every protocol/decoding mode; this client gets RESP2 bytes
    for _, fields in cast("list[tuple[bytes, dict[bytes, bytes]]]", await redis.xrange(key)):
        if Command.decode(fields[b"cmd"]).kind == "scale":
            return True
    return False


async def _decision_latency(settings: Settings, zones: list[str]) -> tuple[list[float], list[float]]:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=0, **kafka_options(settings))
    await producer.start()
    redis = aioredis.Redis.from_url(str(settings.redis_url), **redis_options(settings))
    size_ms, late_ms = int(settings.window_s * 1000), int(settings.lateness_s * 1000)
    total, after_close = [], []
    try:
        for k, zone in enumerate(zones):
            now = int(time.time() * 1000)
            # misses from waiting (a fleet can fix those; a 5 s TTFT with no wait would be unfixable)
            recs = [_request(k * 1000 + i, now, zone, ttft_ms=5000.0, queue_ms=4800.0) for i in range(50)]
            # Four ready replicas, all requests violating: the first decision scales up
            # (from one replica the slew-limited first step, x1.3, rounds back to 1).
            recs += [_gpu(zone, f"{zone}/n{j}", now) for j in range(4)]
            await producer.send_and_wait(
                settings.topic("telemetry"), encode_envelope(recs, "bench", now), key=partition_key(MODEL, zone)
            )
            sent = time.time() * 1000
            window_close = (now - now % size_ms) + size_ms + late_ms
            key = names.command_stream(settings.topic_prefix, zone)
            deadline = time.monotonic() + 30
            # Other commands reach every zone's stream too (zone-aware routes, breakers):
            # wait for this zone's scale command.
            while not await _has_scale_command(redis, key):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no scale command for {zone} within 30 s")
                await asyncio.sleep(0.002)
            landed = time.time() * 1000
            total.append(landed - sent)
            after_close.append(landed - max(window_close, sent))
    finally:
        await producer.stop()
        await redis.aclose()
    return total, after_close


async def _memory(settings: Settings, worker: _Worker, zones: list[str], keys: int) -> dict[str, Any]:
    """RSS of ``worker`` idle, then holding ``keys`` (model, zone, node) windows, then after they closed."""
    await asyncio.sleep(1.0)
    idle = rss_kb(worker.pid)
    before, _ = worker.counts()
    # Stamped ahead of the clock (within GOVERNOR_MAX_FUTURE_S): the windows stay open while RSS is read.
    ts = int(time.time() * 1000) + 5_000
    by_zone: dict[str, list[str]] = {z: [] for z in zones}
    for k in range(keys):
        zone = zones[k % len(zones)]
        by_zone[zone].append(f"{zone}/m{k // len(zones)}")
    messages = []
    for zone, nodes in by_zone.items():
        for i in range(0, len(nodes), 100):
            chunk = nodes[i : i + 100]
            recs = [{**_request(j, ts, zone), "node": node} for j, node in enumerate(chunk)]
            recs += [_gpu(zone, node, ts) for node in chunk]
            messages.append((partition_key(MODEL, zone), encode_columns(recs, "bench", ts)))
    await _send(settings, settings.topic("telemetry"), messages)
    want = before + 2 * keys
    deadline = time.monotonic() + 120
    while (got := worker.counts())[0] < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"memory run: worker read {got[0] - before:.0f} of {2 * keys} records")
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    holding = rss_kb(worker.pid)
    # Past the windows' end + lateness, and the closed windows through the control stage.
    await asyncio.sleep(max(0.0, (ts + 1000 * (settings.window_s + settings.lateness_s)) / 1000 - time.time()) + 3.0)
    after = rss_kb(worker.pid)
    return {
        "keys": keys,
        "idle_rss_mb": round(idle / 1024, 1),
        "holding_rss_mb": round(holding / 1024, 1),
        "kb_per_key": round((holding - idle) / keys, 2),
        "after_close_rss_mb": round(after / 1024, 1),
        "after_close_kb_per_key": round((after - idle) / keys, 2),
        "dead_lettered": round(worker.counts()[1] - got[1]),
    }


def _pct(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=float)
    return {"p50": round(float(np.percentile(arr, 50)), 1), "p99": round(float(np.percentile(arr, 99)), 1)}


def _package(file: str, func: str) -> str:
    """Where a profiled function lives: a package, a stdlib module, or a builtin."""
    if "site-packages/" in file:
        return file.split("site-packages/", 1)[1].split("/", 1)[0]
    here = str(Path(__file__).resolve().parents[1]) + "/"
    if file.startswith(here):
        return file[len(here) :].split("/", 1)[0]
    if file == "~":
        return "builtin " + func.strip("<>").removeprefix("built-in method ").removeprefix("method ")[:40]
    return "stdlib " + Path(file).name


#: Where a profiled worker's time goes, by step: (name, [(file path suffix, function)]), each the
#: cumulative time of its functions; what the ingest agent does not account for is Faust,
#: aiokafka and asyncio per message.
LAYERS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("ingest agent", (("streams/agents.py", "ingest_batch"), ("streams/agents.py", "ingest_one"))),
    ("processor", (("loop/pipeline.py", "process"), ("loop/pipeline.py", "process_many"))),
    ("decode", (("governor_telemetry/columnar.py", "decode_message"),)),
    (
        "column checks",
        (("controllers/record_columns.py", "check_requests"), ("controllers/record_columns.py", "check_gpus")),
    ),
    ("windowing", (("loop/pipeline.py", "_window_section"),)),
    ("per-record path", (("loop/pipeline.py", "_process_records"),)),
)


def profile_layers(cum: dict[tuple[str, str], float], busy_s: float) -> dict[str, float]:
    """Each of :data:`LAYERS` as a share of ``busy_s`` (``cum``: (file, function) -> cumulative s);
    ``faust, aiokafka, asyncio``: the busy time outside the ingest agent."""
    out = {}
    for name, funcs in LAYERS:
        total = sum(t for (file, func), t in cum.items() for suffix, f in funcs if func == f and file.endswith(suffix))
        out[name] = round(total / busy_s, 3) if busy_s > 0 else 0.0
    out["faust, aiokafka, asyncio"] = round(max(0.0, 1.0 - out["ingest agent"]), 3)
    return out


def profile_top(path: Path, baseline: Path | None = None, n: int = 20) -> dict[str, Any]:
    """A cProfile dump of a worker: the ``n`` functions and packages with the most own time.

    ``baseline``: the dump of the same worker started and left idle as long, subtracted
    function by function (its start: imports, compiles, Faust's set-up; its timers), so
    what remains is the ingest.  The wait in ``epoll`` (idle) is set apart.
    """
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    base = pstats.Stats(str(baseline)).stats if baseline is not None else {}  # type: ignore[attr-defined]
    rows: list[dict[str, Any]] = []
    packages: dict[str, float] = {}
    cum: dict[tuple[str, str], float] = {}
    idle = 0.0
    for key, (_, ncalls, tottime, cumtime, _) in stats.items():
        file, line, func = key
        if key in base:
            _, bcalls, btot, bcum, _ = base[key]
            ncalls, tottime, cumtime = max(0, ncalls - bcalls), max(0.0, tottime - btot), max(0.0, cumtime - bcum)
        cum[(file, func)] = cum.get((file, func), 0.0) + cumtime
        if "epoll" in func:
            idle += tottime
            continue
        rows.append(
            {
                "function": f"{Path(file).name}:{line}({func})",
                "calls": ncalls,
                "tottime_s": tottime,
                "cumtime_s": cumtime,
            }
        )
        pkg = _package(file, func)
        packages[pkg] = packages.get(pkg, 0.0) + tottime
    rows.sort(key=lambda r: -r["tottime_s"])
    for r in rows:
        r["tottime_s"], r["cumtime_s"] = round(r["tottime_s"], 3), round(r["cumtime_s"], 3)
    busy = sum(packages.values())
    top = sorted(packages.items(), key=lambda kv: -kv[1])[:n]
    return {
        "busy_s": round(busy, 2),
        "idle_s": round(idle, 2),
        "layers": profile_layers(cum, busy),
        "functions": rows[:n],
        "packages": [{"package": k, "tottime_s": round(v, 3), "share": round(v / busy, 3)} for k, v in top],
    }


@contextlib.contextmanager
def _servers(settings: Settings, run_dir: Path, name: str, **params: Any) -> Iterator[tuple[Settings, int | None]]:
    """A fresh embedded broker and Redis for one phase: (the phase's settings, the broker's pid).

    Fresh per phase because every worker joins the consumer group ``governor``: a worker of an
    earlier phase stopped without leaving it (Faust's shutdown can hang; it is killed) would
    stall the next phase's join.  A broker named by KAFKA_BOOTSTRAP is shared by every phase.
    """
    with EmbeddedServers(settings, os.environ, log_dir=run_dir / name / "servers") as servers:
        proc = servers.process("tansu")
        yield servers.settings.replace(**params), (proc.pid if proc is not None else None)


async def _bench(settings: Settings, args: Namespace, run_dir: Path) -> dict[str, Any]:
    partitions = 4
    zones = spread_zones(partitions)
    # A fresh (model, zone) window admits NEW_NODES_FLOOR new nodes (the node cap): the memory run's keys
    # are spread so that every one of them is held, none dropped.
    mem_zones = [f"mz{i}" for i in range(max(10, math.ceil(args.keys / NEW_NODES_FLOOR)))]
    decision_zones = [f"dz{i}" for i in range(args.decisions)]
    params: dict[str, Any] = {
        "topic_prefix": f"bench{uuid.uuid4().hex[:8]}",
        "window_s": 1.0,
        "lateness_s": 0.2,
        "partitions": partitions,
        # 1 s windows: a gain that acts within one window, so the first
        # violating window of a zone yields a command (x1.3, slew-limited).
        "pid_gains": {"kp": 0.0, "ki": 1.0, "kd": 0.0},
        "clock_origin_s": time.time(),
        "data_dir": str(run_dir / "state"),
    }
    fast = {**params, "lateness_s": THROUGHPUT_LATENESS_S, "zones": (*zones, "az-u")}
    result: dict[str, Any] = {
        "broker": settings.kafka_bootstrap if "KAFKA_BOOTSTRAP" in os.environ else "embedded, fresh per phase",
        "batch_records_per_message": args.batch,
        "partitions": partitions,
        "cores": os.cpu_count(),
        "preload": args.preload,
    }
    encodings: dict[str, Any] = {}
    for encoding in ENCODERS:
        t0 = int(time.time() * 1000) + 2_000
        msgs = backlog(args.events, args.batch, zones, t0, encoding)
        runs = {}
        for workers in sorted({1, max(1, args.workers)}):
            name = f"{encoding}{workers}"
            with _servers(settings, run_dir, name, **fast) as (s, broker):
                runs[f"{workers}w"] = await _ingest(
                    s, run_dir, name, msgs, args.events, workers, broker, raw=workers == 1, preload=args.preload
                )
        encodings[encoding] = {"bytes_per_record": round(sum(len(v) for _, v in msgs) / args.events, 1), **runs}
    raw_rows = encodings["rows"]["1w"]["raw_consumer_rps"]
    for enc in encodings.values():
        for run in (r for k, r in enc.items() if k.endswith("w")):
            run["ratio_to_raw_rows"] = round(run["pipeline_rps"] / raw_rows, 3)
            run["ratio_to_raw_own"] = round(run["pipeline_rps"] / enc["1w"]["raw_consumer_rps"], 3)
    result["encodings"] = encodings
    if args.unbatched_events:
        msgs = backlog(args.unbatched_events, 1, ["az-u"], int(time.time() * 1000) + 2_000, "rows")
        with _servers(settings, run_dir, "unbatched", **fast) as (s, broker):
            result["unbatched"] = await _ingest(
                s, run_dir, "unbatched", msgs, args.unbatched_events, 1, broker, raw=True, preload=args.preload
            )
    if args.profile:
        prof = run_dir / "columns-profile.pstats"
        n = args.profile_events  # enough that the ingest, not the worker's start, fills the profile
        msgs = backlog(n, args.batch, zones, int(time.time() * 1000) + 2_000, args.profile_encoding)
        result["profile_encoding"] = args.profile_encoding
        idle_prof = run_dir / "idle-profile.pstats"
        with _servers(settings, run_dir, "profile", **fast) as (s, broker):
            result["profile_run"] = run = await _ingest(s, run_dir, "profile", msgs, n, 1, broker, profile_to=prof)
        with _servers(settings, run_dir, "profile-idle", **fast) as (s, _):
            await ensure_topics(s)
            idle = _Worker(s, run_dir, "profile-idle", idle_prof)
            try:  # as long as the profiled worker ran from its ready line to its last record
                await _settle([idle])
                await asyncio.sleep(run["seconds"])
            finally:
                idle.stop()
        if prof.exists():
            result["profile_top"] = profile_top(prof, idle_prof if idle_prof.exists() else None)
        else:  # the worker was killed before cProfile could write (a hung shutdown)
            result["profile_error"] = f"no profile written to {prof}"
    # Workers at lateness 0.2 s: the decisions, then (a fresh one, its zones its own) the memory.
    if decision_zones:
        with _servers(settings, run_dir, "decide", **params, zones=tuple(decision_zones)) as (s, _):
            await ensure_topics(s)
            worker = _Worker(s, run_dir, "decide")
            try:
                await asyncio.to_thread(worker.child.wait_for_log, WORKER_READY, 120)
                total, after_close = await _decision_latency(worker.settings, decision_zones)
            except TimeoutError as exc:  # reported, and the memory run still runs
                result["decision_latency_error"] = str(exc)
            else:
                result["decision_latency_ms"] = {
                    "samples": len(total),
                    "record_to_command_in_redis": _pct(total),
                    "after_window_close": _pct(after_close),
                    "window_s": s.window_s,
                    "lateness_s": s.lateness_s,
                }
            finally:
                worker.stop()
    if args.keys:
        with _servers(settings, run_dir, "memory", **params, zones=tuple(mem_zones)) as (s, _):
            await ensure_topics(s)
            worker = _Worker(s, run_dir, "memory")
            try:
                await asyncio.to_thread(worker.child.wait_for_log, WORKER_READY, 120)
                result["fresh_worker_rss_mb"] = round(rss_kb(worker.pid) / 1024, 1)
                result["memory"] = await _memory(worker.settings, worker, mem_zones, args.keys)
            finally:
                worker.stop()
    return result


def _print(result: dict[str, Any]) -> None:
    enc = result["encodings"]
    raw_rows = enc["rows"]["1w"]["raw_consumer_rps"]
    print(
        f"pipeline ingest ({result['broker']}, {result['cores']} cores, {result['partitions']} partitions, "
        f"x{result['batch_records_per_message']} records/message, backlog loaded "
        f"{'before the workers start' if result['preload'] else 'once the workers group settled'})"
    )
    print(f"  raw consumer (getmany + orjson.loads; of a typed message its header), rows bytes: {raw_rows:>9,} rec/s")
    for name, e in enc.items():
        one = e["1w"]
        print(f"  {name:<8} {e['bytes_per_record']:>6.1f} B/rec  raw consumer {one['raw_consumer_rps']:>9,} rec/s")
        for key in (k for k in e if k.endswith("w")):
            r = e[key]
            cores = ", ".join(f"w{i} {w['cores']:.2f}" for i, w in enumerate(r["per_worker"]))
            split = "/".join(f"{w['records']:,}" for w in r["per_worker"])
            own = f", {r['ratio_to_raw_own']:.3f}x raw {name}" if name != "rows" else ""
            print(
                f"    {r['workers']} worker{'s' if r['workers'] > 1 else ' '} {r['pipeline_rps']:>9,} rec/s "
                f"({r['ratio_to_raw_rows']:.3f}x raw rows{own})  "
                f"{r['seconds']:>5.2f} s  records {split}  "
                f"cores: broker {r['broker_cores']}, bench {r['bench_cores']}, {cores}  dead {r['dead_lettered']}"
            )
        if "2w" in e:
            two = e["2w"]
            steady = ""
            if two.get("all_reading_rps") and one.get("all_reading_rps"):
                steady = (
                    f" (while every worker reads: {two['all_reading_rps']:,} against {one['all_reading_rps']:,} "
                    f"rec/s, x{two['all_reading_rps'] / one['all_reading_rps']:.2f})"
                )
            print(f"    two workers / one: x{two['pipeline_rps'] / one['pipeline_rps']:.2f}{steady}")
    if "unbatched" in result:
        u = result["unbatched"]
        print(
            f"  unbatched rows, 1 worker {u['pipeline_rps']:>9,} rec/s   raw consumer {u['raw_consumer_rps']:>9,} "
            f"rec/s   ratio {u['pipeline_rps'] / u['raw_consumer_rps']:.3f}   dead {u['dead_lettered']}"
        )
    if any(r["dead_lettered"] for e in enc.values() for k, r in e.items() if k.endswith("w")):
        print("  WARNING: records were dead-lettered: the rates above time the dead-letter path, not ingest")
    if "memory" in result:
        m = result["memory"]
        print(
            f"worker memory: fresh {result['fresh_worker_rss_mb']} MB; idle {m['idle_rss_mb']} MB -> holding "
            f"{m['keys']:,} (model, zone, node) windows {m['holding_rss_mb']} MB = {m['kb_per_key']} KB/key; "
            f"after they closed {m['after_close_rss_mb']} MB ({m['after_close_kb_per_key']} KB/key)"
            f"{'  dead ' + str(m['dead_lettered']) if m['dead_lettered'] else ''}"
        )
    if "decision_latency_ms" in result:
        d = result["decision_latency_ms"]
        r, a = d["record_to_command_in_redis"], d["after_window_close"]
        print(f"decision latency, {d['samples']} samples (window {d['window_s']} s, lateness {d['lateness_s']} s)")
        print(f"  record -> command in Redis   p50 {r['p50']:.0f} ms   p99 {r['p99']:.0f} ms")
        print(f"  after the window closed      p50 {a['p50']:.0f} ms   p99 {a['p99']:.0f} ms")
    if "decision_latency_error" in result:
        print(f"decision latency: FAILED: {result['decision_latency_error']}")
    if "profile_error" in result:
        print(f"profile: FAILED: {result['profile_error']}")
    if "profile_top" in result:
        p, top = result["profile_run"], result["profile_top"]
        print(
            f"profile: a worker under cProfile, {result['profile_encoding']} messages, {p['records']:,} records at "
            f"{p['pipeline_rps']:,} rec/s "
            f"(less an idle worker's profile: busy {top['busy_s']} s, idle in epoll {top['idle_s']} s)"
        )
        if "layers" in top:
            print("  where the busy time goes: " + ", ".join(f"{k} {v:.0%}" for k, v in top["layers"].items()))
        print("  own time by package: " + ", ".join(f"{r['package']} {r['share']:.0%}" for r in top["packages"][:12]))
        for row in top["functions"]:
            print(
                f"  {row['tottime_s']:>7.3f} s own {row['cumtime_s']:>7.3f} s cum {row['calls']:>9} calls  {row['function']}"
            )
    sys.stdout.flush()


def run_bench(settings: Settings, args: Namespace) -> int:
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    # Flags the CLI's parser does not define yet take their defaults.
    args = Namespace(**{**vars(defaults.parse_args([])), **vars(args)})
    run_dir = Path(tempfile.mkdtemp(prefix="governor-bench-"))
    result = asyncio.run(_bench(settings, args, run_dir))
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.pipeline`` (the same as ``governor bench pipeline``)."""
    p = argparse.ArgumentParser(prog="governor bench pipeline")
    add_arguments(p)
    return run_bench(Settings.from_env(os.environ), p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
