"""``governor bench pipeline``: how fast the stream worker ingests, next to a
raw aiokafka consumer of the same messages on the same broker, and how long a
telemetry record takes to become a command in Redis.

All figures come from one run on one broker, side by side:

* raw consumer: ``getmany`` + ``orjson.loads`` of every message (the floor
  any Kafka consumer in Python pays);
* pipeline: the real ``governor worker`` process (Faust) decoding, validating
  and windowing the same messages; its progress is read from its Prometheus
  ``governor_records_total`` counter;
* batched (``--batch`` records per message, as the producer library sends)
  and unbatched (one record per message), stamped with event times the
  worker accepts (not late), so every record is validated and windowed;
  ``dead_lettered`` counts any that were not (it must be 0);
* decision latency: violating records for a fresh zone are sent, and the
  time until the resulting scale command is in that zone's Redis stream is
  measured -- in total, and after the window closed (total minus the wait
  for the window end and the allowed lateness, which is by design).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
import uuid
from argparse import Namespace
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from governor_telemetry.records import encode_envelope, partition_key

from core import names
from core.settings import Settings
from core.transport import kafka_options, redis_options
from governor.embedded import EmbeddedServers, free_port
from governor.processes import WORKER_READY, start_worker
from governor.topics import ensure_topics
from streams.commands import Command

MODEL = "llama2-70b"


def _request(i: int, ts_ms: int, zone: str, ttft_ms: float = 120.0) -> dict[str, Any]:
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
        "queue_ms": 10.0,
        "prompt_tokens": 1000,
        "output_tokens": 100,
        "status": "ok",
    }


async def _produce(
    settings: Settings, n: int, batch: int, zone: str, t0_ms: int, topic: str | None = None, span_ms: int = 60_000
) -> int:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        linger_ms=5,
        max_batch_size=1 << 20,
        max_request_size=8 << 20,
        **kafka_options(settings),
    )
    await producer.start()
    messages = 0
    try:
        pending = []
        for start in range(0, n, batch):
            # Spread event time over span_ms so windows open and close as in real traffic;
            # one message = one node's batch, as the producer library on a node sends it.
            node = f"{zone}/n{(start // batch) % 8}"
            recs = [
                {**_request(i, t0_ms + (i * span_ms) // n, zone), "node": node}
                for i in range(start, min(n, start + batch))
            ]
            value = encode_envelope(recs, "bench", t0_ms) if batch > 1 else orjson.dumps(recs[0])
            pending.append(
                await producer.send(topic or settings.topic("telemetry"), value, key=partition_key(MODEL, zone))
            )
            messages += 1
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return messages


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
                    orjson.loads(m.value)
                got += len(msgs)
        return n_records / (time.perf_counter() - t0)
    finally:
        await consumer.stop()


def _counters(port: int) -> tuple[float, float]:
    """(records read, records dead-lettered) from the worker's Prometheus counters."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r"^governor_records_total ([0-9.e+]+)$", text, re.M)
    dead = sum(float(v) for v in re.findall(r"^governor_deadletter_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))
    return (float(m.group(1)) if m else 0.0), dead


# Event time of the throughput phases.  The worker closes windows by its clock as well as by
# event time (``lateness_s`` after the window end), so records stamped in the past would all be
# dead-lettered as late and the bench would time the dead-letter path, not ingest.  Each phase
# stamps its records from just ahead of the clock (EVENT_LEAD_MS) over its span, never before
# the previous phase's last stamp (the watermark); ``dead_lettered`` in the result must be 0.
EVENT_LEAD_MS = 2_000
BATCHED_SPAN_MS = 20_000
UNBATCHED_SPAN_MS = 10_000


async def _pipeline_rate(
    settings: Settings, port: int, n: int, batch: int, zone: str, t0_ms: int, span_ms: int, timeout_s: float = 600.0
) -> tuple[float, int]:
    """Records/s from the first produce to the last record counted, and records dead-lettered."""
    before, dead_before = _counters(port)
    t0 = time.perf_counter()
    await _produce(settings, n, batch, zone, t0_ms, span_ms=span_ms)
    while (counts := _counters(port))[0] < before + n:
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"worker ingested {counts[0] - before:.0f} of {n} records")
        await asyncio.sleep(0.1)
    return n / (time.perf_counter() - t0), round(counts[1] - dead_before)


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
            recs = [_request(k * 1000 + i, now, zone, ttft_ms=5000.0) for i in range(50)]
            # Four ready replicas, all requests violating: the first decision scales up
            # (from one replica the slew-limited first step, x1.3, rounds back to 1).
            recs += [
                {
                    "kind": "gpu",
                    "ts_ms": now,
                    "model": MODEL,
                    "zone": zone,
                    "node": f"{zone}/n{j}",
                    "state": "ready",
                    "gpu_util": 0.9,
                    "mem_used_bytes": 1,
                    "mem_total_bytes": 2,
                }
                for j in range(4)
            ]
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


def _pct(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=float)
    return {"p50": round(float(np.percentile(arr, 50)), 1), "p99": round(float(np.percentile(arr, 99)), 1)}


async def _bench(settings: Settings, args: Namespace, run_dir: Path) -> dict[str, Any]:
    port = free_port()
    decision_zones = [f"dz{i}" for i in range(args.decisions)]
    settings = settings.replace(
        topic_prefix=f"bench{uuid.uuid4().hex[:8]}",
        metrics_port=port,
        window_s=1.0,
        lateness_s=0.2,
        partitions=4,
        # 1 s windows: a gain that acts within one window, so the first
        # violating window of a zone yields a command (x1.3, slew-limited).
        pid_gains={"kp": 0.0, "ki": 1.0, "kd": 0.0},
        zones=("az-a", "az-u", *decision_zones),
        clock_origin_s=time.time(),
        data_dir=str(run_dir / "state"),
    )
    await ensure_topics(settings)
    worker = start_worker(settings, run_dir)
    try:
        await asyncio.to_thread(worker.wait_for_log, WORKER_READY, 120)
        t_batched = int(time.time() * 1000) + EVENT_LEAD_MS
        batched, dead_batched = await _pipeline_rate(
            settings, port, args.events, args.batch, "az-a", t_batched, BATCHED_SPAN_MS
        )
        t_unbatched = max(int(time.time() * 1000) + EVENT_LEAD_MS, t_batched + BATCHED_SPAN_MS)
        unbatched, dead_unbatched = await _pipeline_rate(
            settings, port, args.unbatched_events, 1, "az-u", t_unbatched, UNBATCHED_SPAN_MS
        )
        last_event_ms = t_unbatched + UNBATCHED_SPAN_MS
        # The raw consumer reads the same messages, produced to topics of their own.
        raw_rates = []
        for name, n, batch in (("raw-batched", args.events, args.batch), ("raw-unbatched", args.unbatched_events, 1)):
            topic = settings.topic(name)
            msgs = await _produce(settings, n, batch, "az-r", int(time.time() * 1000), topic=topic)
            raw_rates.append(await _raw_consume(settings, topic, n, msgs))
        raw_batched, raw_unbatched = raw_rates
        # Decision records carry the current time: wait until the watermark left by the
        # throughput phases is behind the clock, or they would be late.
        wait_s = (last_event_ms + 1000 * (settings.window_s + settings.lateness_s)) / 1000 - time.time()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        total, after_close = await _decision_latency(settings, decision_zones)
    finally:
        worker.stop()
    return {
        "broker": settings.kafka_bootstrap,
        "batch_records_per_message": args.batch,
        "batched": {
            "records": args.events,
            "pipeline_rps": round(batched),
            "raw_consumer_rps": round(raw_batched),
            "ratio_pipeline_to_raw": round(batched / raw_batched, 3),
            "dead_lettered": dead_batched,
        },
        "unbatched": {
            "records": args.unbatched_events,
            "pipeline_rps": round(unbatched),
            "raw_consumer_rps": round(raw_unbatched),
            "ratio_pipeline_to_raw": round(unbatched / raw_unbatched, 3),
            "dead_lettered": dead_unbatched,
        },
        "batching_speedup_pipeline": round(batched / unbatched, 1),
        "decision_latency_ms": {
            "samples": len(total),
            "record_to_command_in_redis": _pct(total),
            "after_window_close": _pct(after_close),
            "window_s": settings.window_s,
            "lateness_s": settings.lateness_s,
        },
    }


def run_bench(settings: Settings, args: Namespace) -> int:
    run_dir = Path(tempfile.mkdtemp(prefix="governor-bench-"))
    with EmbeddedServers(settings, os.environ, log_dir=run_dir / "servers") as servers:
        result = asyncio.run(_bench(servers.settings, args, run_dir))
    if args.json:
        print(json.dumps(result))
        return 0
    b, u, d = result["batched"], result["unbatched"], result["decision_latency_ms"]
    print(f"pipeline ingest ({result['broker']}, one run, same messages)")
    print(
        f"  batched x{result['batch_records_per_message']:<4} pipeline {b['pipeline_rps']:>9,} rec/s   "
        f"raw consumer {b['raw_consumer_rps']:>9,} rec/s   ratio {b['ratio_pipeline_to_raw']:.3f}"
    )
    print(
        f"  unbatched    pipeline {u['pipeline_rps']:>9,} rec/s   raw consumer {u['raw_consumer_rps']:>9,} rec/s"
        f"   ratio {u['ratio_pipeline_to_raw']:.3f}"
    )
    print(f"  batching speeds the pipeline up x{result['batching_speedup_pipeline']}")
    if b["dead_lettered"] or u["dead_lettered"]:
        print(
            f"  WARNING: {b['dead_lettered']} batched / {u['dead_lettered']} unbatched records were "
            "dead-lettered (late?): the rates above time the dead-letter path, not ingest"
        )
    r, a = d["record_to_command_in_redis"], d["after_window_close"]
    print(f"decision latency, {d['samples']} samples (window {d['window_s']} s, lateness {d['lateness_s']} s)")
    print(f"  record -> command in Redis   p50 {r['p50']:.0f} ms   p99 {r['p99']:.0f} ms")
    print(f"  after the window closed      p50 {a['p50']:.0f} ms   p99 {a['p99']:.0f} ms")
    sys.stdout.flush()
    return 0
