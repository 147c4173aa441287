"""``governor bench fleet``: the worker's loop fed the telemetry of a fleet of 10,000 replicas.

``--replicas`` replicas over ``--models`` x ``--zones`` (model, zone) keys (default 10,000 over
100 x 10 = 1,000 keys, 10 a key) send, every second of event time, their finished requests
(``--rps-per-replica``, Poisson, latencies around the SLOs) and ``--gpu-hz`` GPU samples each,
as one columnar message per key and ``--message-s`` (what a :class:`TelemetryProducer` batching
by key, or one scrape adapter round, sends), on the Kafka partition its key hashes to
(aiokafka's murmur2, ``--partitions``).

The loop is the worker's own: a :class:`loop.control_loop.ControlLoop` built as
:class:`streams.agents.Worker` builds it (a keyring, a processor per telemetry partition), driven
as its agents drive it, without Kafka, Redis or Faust between the steps:

* ingest: :meth:`ControlLoop.ingest` of every message (the windows its event time closes) and
  :meth:`ControlLoop.sign_window` of each window record (the ingest agent);
* close: :meth:`ControlLoop.close_due` once the window's lateness passed (the timer);
* decide: :meth:`ControlLoop.decode` (MAC checked) and :meth:`ControlLoop.decide` of every
  window record, node and zone, and each command signed (the control agent).

Per window (the first ``--warmup`` left out): the CPU seconds of ingest and of the decisions.
Printed: records/s per core of ingest; the decisions for every key as a share of one window
(p50, p99); the RSS the loop added (per (model, zone, node) key); and, for a worker core kept
at ``--target-util`` of a core, how many worker processes and partitions the fleet needs.
What is not in these figures: the Kafka consumer and Faust's per-message cost (``governor bench
pipeline`` measures the real worker against a raw consumer), and Redis/Kafka writes of the
effects.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from aiokafka.partitioner import murmur2
from governor_telemetry.columnar import encode_columns, encode_typed
from governor_telemetry.records import partition_key
from governor_telemetry.typed import MAGIC, split_frame

from core.settings import ModelSpec, Settings
from core.signing import Keyring, generate_keys
from loop.control_loop import ControlLoop

__all__ = ["FleetLoad", "add_parser", "fleet_settings", "measure", "raw_parse", "run_fleet"]

T0_MS = 1_800_000_000_000  # event time of the first window (a wall clock: the future check applies)


def fleet_settings(models: int, zones: int, partitions: int, base: Settings | None = None) -> Settings:
    """Settings of ``models`` x ``zones`` keys (replica bounds wide enough for any fleet)."""
    import dataclasses

    base = base or Settings()
    specs = tuple(ModelSpec(f"m{i:03d}", min_replicas=1, max_replicas=10_000) for i in range(models))
    return dataclasses.replace(
        base, models=specs, zones=tuple(f"z{j:02d}" for j in range(zones)), partitions=partitions, fallbacks=()
    )


ENCODERS = {"columns": encode_columns, "typed": encode_typed}


def raw_parse(value: bytes) -> Any:
    """What any consumer must parse of a telemetry message: all of a JSON one; a typed one's header (its
    arrays are read in place): the floor the benchmarks set the worker beside."""
    return orjson.loads(split_frame(value)[0] if value[:4] == MAGIC else value)


def _messages(
    settings: Settings,
    replicas: int,
    rps: float,
    gpu_hz: float,
    message_s: float,
    window: int,
    rng: np.random.Generator,
    encoding: str = "columns",
) -> Iterator[tuple[int, bytes, int, int]]:
    """(partition, columnar message, records, sent at ms) of one window, in event-time order: per ``message_s``
    slice, one message a key with its replicas' requests and GPU samples of that slice."""
    keys = [(m.name, z) for m in settings.models for z in settings.zones]
    per_key = [replicas // len(keys) + (1 if i < replicas % len(keys) else 0) for i in range(len(keys))]
    parts = [(murmur2(partition_key(m, z)) & 0x7FFFFFFF) % settings.partitions for m, z in keys]
    # Each key's load against its replicas, fixed per run: most keys meet the SLO, some miss it (scale up),
    # some idle below it (scale down), so the decisions include commands.
    load = np.random.default_rng(len(keys)).lognormal(0.0, 0.6, len(keys)).tolist()
    w_ms, step_ms = int(settings.window_s * 1000), int(message_s * 1000)
    start = T0_MS + window * w_ms
    for t in range(start, start + w_ms, step_ms):
        for (model, zone), n, part, f in zip(keys, per_key, parts, load, strict=True):
            recs: list[dict[str, Any]] = []
            for r in range(n):
                node = f"{zone}/{model}/r{r}"
                for q in range(int(rng.poisson(rps * message_s))):
                    ttft, out = f * float(rng.lognormal(5.8, 0.5)), int(rng.integers(16, 512))
                    recs.append(
                        {"kind": "request", "request_id": f"{node}/{t}/{q}", "model": model}
                        | {"ts_ms": t + int(rng.integers(0, step_ms))}
                        | {"zone": zone, "node": node, "ttft_ms": ttft, "itl_ms": f * float(rng.lognormal(3.5, 0.3))}
                        | {"e2e_ms": ttft + 40.0 * out, "queue_ms": ttft / 4, "prompt_tokens": 1000}
                        | {"output_tokens": out, "status": "ok"}
                    )
                for g in range(int(gpu_hz * message_s)):
                    recs.append(
                        {"kind": "gpu", "ts_ms": t + g * int(1000 / gpu_hz), "model": model, "zone": zone}
                        | {"node": node, "state": "ready", "gpu_util": 0.8, "mem_used_bytes": 1, "mem_total_bytes": 2}
                        | {"running": 8, "queue_len": int(rng.integers(0, 4))}
                    )
            if recs:
                yield part, ENCODERS[encoding](recs, "bench-fleet", t + step_ms), len(recs), t + step_ms


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@dataclass(frozen=True)
class FleetLoad:
    """What the fleet sends: ``replicas`` finishing ``rps`` requests/s and ``gpu_hz`` GPU samples/s
    each, one message a key every ``message_s``."""

    replicas: int = 10_000
    rps: float = 2.0
    gpu_hz: float = 1.0
    message_s: float = 1.0
    encoding: str = "columns"  # or typed (governor_telemetry.typed)


def measure(settings: Settings, load: FleetLoad, windows: int, warmup: int = 1, seed: int = 7) -> dict[str, Any]:
    """Drive the worker's loop through ``windows`` windows of the fleet's telemetry; the figures."""
    replicas, rps, gpu_hz, message_s = load.replicas, load.rps, load.gpu_hz, load.message_s
    rss0 = _rss_kb()
    keyring = Keyring.parse(generate_keys())
    loop = ControlLoop(settings, None, keyring)
    loop.ingests.partitioned = True  # as streams.agents.Worker: a processor per telemetry partition
    rng = np.random.default_rng(seed)
    topic, metrics_topic = settings.topic("telemetry"), settings.topic("metrics")
    offsets = [0] * settings.partitions
    w_ms, late_ms = int(settings.window_s * 1000), int(settings.lateness_s * 1000)
    rows: list[dict[str, Any]] = []
    last_ms = T0_MS
    for k in range(windows):
        closed: list[tuple[bytes, list[tuple[str, bytes]]]] = []
        ingest_s, decode_s, records, n_msgs, n_bytes = 0.0, 0.0, 0, 0, 0
        # One message at a time, made (the producers' side, not timed) then ingested: no backlog held.
        for part, raw, n, sent_ms in _messages(settings, replicas, rps, gpu_hz, message_s, k, rng, load.encoding):
            now_ms = max(sent_ms, last_ms)  # the worker's clock: when the message arrives, never back
            source = {"topic": topic, "partition": part, "offset": offsets[part]}
            offsets[part] += 1
            c0 = time.process_time()
            raw_parse(raw)  # the floor any consumer pays for the bytes, side by side
            c1 = time.process_time()
            decode_s += c1 - c0
            c0 = c1
            res = loop.ingest(raw, source, now_ms)
            closed += [loop.sign_window(m) for m in res.windows]
            ingest_s += time.process_time() - c0
            assert not res.dead_letters, res.dead_letters[0]["reason"]
            records, n_msgs, n_bytes = records + n, n_msgs + 1, n_bytes + len(raw)
        end_ms = T0_MS + (k + 1) * w_ms + late_ms + 1
        c0 = time.process_time()
        closed += [loop.sign_window(m) for m in loop.close_due(end_ms)]
        c1 = time.process_time()
        ingest_s += c1 - c0
        last_ms = end_ms
        commands = 0
        for i, (value, headers) in enumerate(closed):
            w, dl = loop.decode(value, {"topic": metrics_topic, "partition": 0, "offset": i}, end_ms, dict(headers))
            assert w is not None, dl
            fx = loop.decide(w, end_ms)
            commands += len([cmd.signed(keyring).encode() for cmd in fx.commands])
        c2 = time.process_time()
        rows.append(
            {
                "window": k,
                "records": records,
                "messages": n_msgs,
                "bytes": n_bytes,
                "ingest_cpu_s": ingest_s,
                "json_decode_cpu_s": decode_s,
                "window_records": len(closed),
                "decide_cpu_s": c2 - c1,
                "commands": commands,
            }
        )
    rss1 = _rss_kb()
    return {**summarise(settings, rows[warmup:], replicas, rss1 - rss0, loop), "encoding": load.encoding}


def summarise(
    settings: Settings, rows: list[dict[str, Any]], replicas: int, rss_kb: int, loop: ControlLoop
) -> dict[str, Any]:
    records = sum(r["records"] for r in rows)
    ingest_s = sum(r["ingest_cpu_s"] for r in rows)
    share = [r["decide_cpu_s"] / settings.window_s for r in rows]
    keys = len(settings.models) * len(settings.zones)
    return {
        "replicas": replicas,
        "keys": keys,
        "window_s": settings.window_s,
        "windows": len(rows),
        "records_per_window": records / len(rows),
        "messages_per_window": sum(r["messages"] for r in rows) / len(rows),
        "bytes_per_window": sum(r["bytes"] for r in rows) / len(rows),
        "window_records_per_window": sum(r["window_records"] for r in rows) / len(rows),
        "commands_per_window": sum(r["commands"] for r in rows) / len(rows),
        "records_per_s_per_core": records / ingest_s if ingest_s > 0 else math.inf,
        "ingest_vs_json_decode": sum(r["json_decode_cpu_s"] for r in rows) / ingest_s if ingest_s > 0 else math.inf,
        "ingest_share_of_window_p50": float(np.median([r["ingest_cpu_s"] / settings.window_s for r in rows])),
        "decide_share_of_window_p50": float(np.percentile(share, 50)),
        "decide_share_of_window_p99": float(np.percentile(share, 99)),
        "rss_added_mb": rss_kb / 1024.0,
        "rss_mb": _rss_kb() / 1024.0,
        "rss_kb_per_node_key": rss_kb / max(1, replicas),
        "open_windows_end": loop.ingests.open_windows,
        "per_window": rows,
    }


def plan(r: dict[str, Any], target_util: float, scale: float = 1.0) -> dict[str, Any]:
    """Workers and partitions for a fleet ``scale`` times the measured one, each worker core kept at
    ``target_util`` of a core: ingest plus the p99 decisions, per window, spread over the workers."""
    busy = scale * (r["ingest_share_of_window_p50"] + r["decide_share_of_window_p99"])  # cores
    workers = max(1, math.ceil(busy / target_util))
    return {
        "scale": scale,
        "replicas": int(r["replicas"] * scale),
        "records_per_s": scale * r["records_per_window"] / r["window_s"],
        "mb_per_s": scale * r["bytes_per_window"] / r["window_s"] / 1e6,
        "cores_busy": busy,
        "workers": workers,
        "partitions": 2 * workers,  # a worker more can take a share without a re-key; >= workers always
    }


def render(r: dict[str, Any], target_util: float) -> str:
    lines = [
        f"fleet: {r['replicas']} replicas over {r['keys']} (model, zone) keys, {r['windows']} windows of "
        f"{r['window_s']:g} s measured; {r['records_per_window']:.0f} records in {r['messages_per_window']:.0f} "
        f"{r.get('encoding', 'columns')} messages ({r['bytes_per_window'] / 1e6:.1f} MB) a window",
        f"  ingest     {r['records_per_s_per_core']:,.0f} records/s per worker core "
        f"({r['ingest_vs_json_decode']:.3f}x the rate of parsing alone: orjson.loads, of a typed message its header); "
        f"{r['ingest_share_of_window_p50']:.2f} of a core over each window",
        f"  decisions  {r['window_records_per_window']:.0f} window records a window, every key decided in "
        f"p50 {r['decide_share_of_window_p50']:.3f}, p99 {r['decide_share_of_window_p99']:.3f} of a window; "
        f"{r['commands_per_window']:.0f} commands",
        f"  memory     {r['rss_mb']:.0f} MB RSS, {r['rss_added_mb']:.0f} MB added by the loop's state: "
        f"{r['rss_kb_per_node_key']:.1f} KB per (model, zone, node) key",
        f"  sizing at {target_util:.0%} of a core a worker (Kafka and Faust per message not included):",
    ]
    for scale in (1.0, 10.0, 100.0):
        p = plan(r, target_util, scale)
        lines.append(
            f"    x{scale:<4g} {p['replicas']:>9,} replicas: {p['records_per_s']:>12,.0f} records/s, "
            f"{p['mb_per_s']:7.1f} MB/s, {p['cores_busy']:6.1f} cores -> {p['workers']} workers, "
            f"{p['partitions']} partitions"
        )
    return "\n".join(lines)


#: (flag, type, default, help) of ``governor bench fleet``
_FLAGS: tuple[tuple[str, type, float, str], ...] = (
    ("--replicas", int, 10_000, "replicas of the fleet"),
    ("--models", int, 100, "models (keys: models x zones)"),
    ("--zones", int, 10, "zones (keys: models x zones)"),
    ("--partitions", int, 16, "telemetry partitions the keys hash to"),
    ("--rps-per-replica", float, 2.0, "finished requests/s a replica"),
    ("--gpu-hz", float, 1.0, "GPU samples/s a replica"),
    ("--message-s", float, 1.0, "event seconds one message of a key holds"),
    ("--windows", int, 6, "windows driven (the first is warm-up)"),
    ("--target-util", float, 0.5, "share of a core a worker is sized to use"),
)


def add_parser(bsub: Any) -> None:
    help_ = "the worker's loop fed 10,000 replicas over 1,000 (model, zone) keys: ingest, decisions, RSS, sizing"
    p = bsub.add_parser("fleet", help=help_)
    for flag, kind, default, what in _FLAGS:
        p.add_argument(flag, type=kind, default=default, help=what)
    p.add_argument("--encoding", choices=tuple(ENCODERS), default="columns", help="how the fleet's messages go")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_fleet(args: argparse.Namespace) -> int:
    if min(args.replicas, args.models, args.zones, args.partitions) < 1 or args.windows < 2:
        print("governor bench fleet: need --replicas/--models/--zones/--partitions >= 1 and --windows >= 2")
        return 2
    if not 0 < args.target_util <= 1 or not args.message_s > 0 or args.rps_per_replica < 0 or args.gpu_hz < 0:
        print("governor bench fleet: need 0 < --target-util <= 1, --message-s > 0, rates >= 0")
        return 2
    settings = fleet_settings(args.models, args.zones, args.partitions)
    load = FleetLoad(args.replicas, args.rps_per_replica, args.gpu_hz, args.message_s, args.encoding)
    result = measure(settings, load, args.windows)
    result["sizing"] = [plan(result, args.target_util, s) for s in (1.0, 10.0, 100.0)]
    print(json.dumps(result, indent=2) if args.json else render(result, args.target_util))
    return 0
