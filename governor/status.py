"""``governor status``: what the control loop is doing, per (model, zone) and fleet-wide.

    governor status                 one look (a table; plain text when piped)
    governor status --watch [S]     refresh every S seconds (default 2) until Ctrl-C
    governor status --json          one JSON object (``collect``'s snapshot)

Everything comes from what the processes already write:

* ``<prefix>:status`` (:func:`core.names.status`): the worker's record of
  each (model, zone), written after every zone window (``streams.agents``):
  the window's end, rate, violation rate, TTFT P95 and SLO, replicas ready
  and starting, the scaler's last target, feedforward mode, the last drift,
  the stale-telemetry flag and the zone's capacity status;
* ``<prefix>:executor:<zone>:last_result``: the last command per model each
  executor finished, with its outcome; ``<prefix>:breaker:<zone>`` and
  ``<prefix>:canary:<model>``: breaker and canary state; ``<prefix>:paused``;
* liveness: ``<prefix>:worker:heartbeat`` and each zone's
  ``<prefix>:executor:<zone>:heartbeat`` (keys with a TTL: present = alive);
* Kafka: dead letters of the last 60 s (records on ``<prefix>.deadletter``
  whose timestamp is in the last minute, counted by reading them) and the
  consumer lag of the worker's group (``governor``, the Faust app id) on the
  telemetry, metrics and commands topics: the records after the group's
  committed offset.  The end of a partition is found by reading its last
  batch, not taken from ListOffsets: the embedded broker (Tansu 0.6) answers
  ListOffsets with the last batch's *base* offset + 1, short by the batch's
  other records.  Telemetry is committed only once every window it fed has
  closed, so about one window plus the lateness of telemetry is normal lag.

Ages are wall seconds: a heartbeat's from its ``wall_ms``; the windows' and
commands' times are on the run's clock, which the worker publishes in its
heartbeat (speed and origin, :func:`run_clock`), so a status run beside a
demo at ``--speed 5`` needs no ``GOVERNOR_CLOCK_SPEED`` of its own.  A one-shot run that cannot reach Redis or Kafka exits 2 within 10 s
with one line naming the address and its setting (``REDIS_URL`` /
``KAFKA_BOOTSTRAP``); ``--watch`` keeps retrying after a first good look.

How it shows a snapshot: plain aligned text (piped, or no ``rich``), a ``rich`` table in a
terminal, and the ``--watch`` loop.

>>> snap = {"prefix": "g", "paused": False, "pause": None, "worker": {"alive": True, "age_s": 0.4},
...         "executors": {"az-a": {"alive": False, "age_s": None}}, "rows": [],
...         "kafka": {"group": "governor", "lag": None, "dead_letters_60s": 0}}
>>> print(render_plain(snap))  # doctest: +NORMALIZE_WHITESPACE
governor status (prefix g): loop running
worker alive (beat 0.4 s ago); executors: az-a DOWN
kafka: dead letters in the last 60 s: 0; lag of group governor: unavailable
(no (model, zone) has reported a window yet)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import urllib.parse
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.exceptions import RedisError

from core import names
from core.clock import ScaledClock
from core.settings import Settings
from core.transport import kafka_options, redis_options

__all__ = ["APP_ID", "LAG_TOPICS", "Unreachable", "add_parser", "collect", "run_status"]

#: The worker's consumer group: the Faust app id (:func:`streams.app.create_app`).
APP_ID = "governor"
#: The topics the worker consumes, whose lag is shown.
LAG_TOPICS = ("telemetry", "metrics", "commands")
DEAD_LETTER_WINDOW_S = 60.0
MAX_DEAD_LETTERS_READ = 20_000
LAG_NOTE = (
    "lag = records after the worker group's committed offset; partition ends are read from the last batch "
    "(Tansu's ListOffsets answers the last batch's base offset + 1); telemetry commits only after its windows "
    "close, so ~1 window + lateness is normal"
)


class Unreachable(Exception):
    """Redis or Kafka did not answer: ``str()`` is the one line to print."""


def _redis_address(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts.netloc.rpartition("@")[2] or url


def _json(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"unreadable": bytes(raw).decode("utf-8", "replace")[:80]}


def _s(b: Any) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b)


async def _read_redis(settings: Settings, timeout_s: float) -> dict[str, Any]:
    """Every Redis key ``governor status`` shows, raw, in one pipeline round trip."""
    p, zones = settings.topic_prefix, settings.zones
    client = aioredis.Redis.from_url(
        str(settings.redis_url),
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        **redis_options(settings),
    )
    try:
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(names.status(p))
        pipe.mget([names.paused(p), names.worker_heartbeat(p), *(names.executor_heartbeat(p, z) for z in zones)])
        pipe.hgetall(names.retune(p))
        for z in zones:
            pipe.hgetall(names.executor_last_result(p, z))
            pipe.hgetall(names.breaker_hash(p, z))
        status, singles, retune, *per_zone = await asyncio.wait_for(pipe.execute(), timeout_s + 1)
        models = sorted({m.name for m in settings.models} | {_s(f).split("|")[0] for f in status})
        canaries = await asyncio.wait_for(client.mget([names.canary_state(p, m) for m in models]), timeout_s + 1)
    except (RedisError, OSError, TimeoutError) as exc:
        raise Unreachable(_unreachable("redis", _redis_address(str(settings.redis_url)), "REDIS_URL", exc)) from exc
    finally:
        await client.aclose()
    return {
        "status": {_s(k): _json(v) for k, v in status.items()},
        "paused": _json(singles[0]),
        "worker": _json(singles[1]),
        "executors": {z: _json(b) for z, b in zip(zones, singles[2:], strict=True)},
        "last_result": {z: {_s(k): _json(v) for k, v in per_zone[2 * i].items()} for i, z in enumerate(zones)},
        "breaker": {z: {_s(k): _json(v) for k, v in per_zone[2 * i + 1].items()} for i, z in enumerate(zones)},
        "canary": {m: _json(c) for m, c in zip(models, canaries, strict=True) if c is not None},
        "retune": {_s(k): _json(v) for k, v in retune.items()},
    }


def _unreachable(what: str, address: str, setting: str, exc: BaseException) -> str:
    why = " ".join(str(exc).split()) or type(exc).__name__
    return f"governor status: cannot read {what} at {address} (set by {setting}): {why}"


async def _true_ends(consumer: AIOKafkaConsumer, tps: list[TopicPartition], deadline: float) -> dict[Any, int]:
    """Each partition's end offset: ListOffsets' answer, extended by reading the batch it points into."""
    ends: dict[Any, int] = dict(await consumer.end_offsets(tps))
    probe = [tp for tp in tps if ends[tp] > 0]
    if not probe:
        return ends
    consumer.assign(probe)
    for tp in probe:
        consumer.seek(tp, ends[tp] - 1)
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=200)
        quiet = 0 if batch else quiet + 1
        for tp, msgs in batch.items():
            ends[tp] = max(ends[tp], msgs[-1].offset + 1)
    return ends


async def _dead_letters(consumer: AIOKafkaConsumer, tp: TopicPartition, end: int, deadline: float) -> int | str:
    """Records on the dead-letter partition with a timestamp in the last minute (``">=N"`` when capped)."""
    cutoff = int((time.time() - DEAD_LETTER_WINDOW_S) * 1000)
    found = (await consumer.offsets_for_times({tp: cutoff})).get(tp)
    if found is None or found.timestamp < 0 or found.offset >= end:
        return 0  # nothing at or after the cutoff (Tansu: offset 0, timestamp -1)
    consumer.assign([tp])
    consumer.seek(tp, found.offset)  # the batch holding the first such record: filtered by timestamp below
    count = read = 0
    while time.monotonic() < deadline and read < MAX_DEAD_LETTERS_READ:
        msgs = (await consumer.getmany(tp, timeout_ms=300, max_records=5_000)).get(tp, [])
        if not msgs:
            break
        read += len(msgs)
        count += sum(1 for m in msgs if m.timestamp >= cutoff)
        if msgs[-1].offset + 1 >= end:
            return count
    return f">={count}"


async def _read_kafka(settings: Settings, timeout_s: float) -> dict[str, Any]:
    """Dead letters of the last minute and the worker group's lag per topic."""
    opts = {"bootstrap_servers": settings.kafka_bootstrap, "request_timeout_ms": int(timeout_s * 1000)}
    opts |= kafka_options(settings)
    reader = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, fetch_max_wait_ms=100, **opts)
    group = AIOKafkaConsumer(group_id=APP_ID, enable_auto_commit=False, **opts)  # never joins: committed() only
    started = [reader, group]
    deadline = time.monotonic() + timeout_s
    try:
        for c in started:
            await asyncio.wait_for(c.start(), timeout_s)
    except Exception as exc:  # noqa: BLE001 - any failure to start is "unreachable"
        for c in started:
            await c.stop()  # also a consumer that did not start: no "Unclosed AIOKafkaConsumer" at exit
        raise Unreachable(_unreachable("kafka", settings.kafka_bootstrap, "KAFKA_BOOTSTRAP", exc)) from exc
    out: dict[str, Any] = {"group": APP_ID, "lag": None, "lag_note": LAG_NOTE, "dead_letters_60s": None}
    try:
        known = await reader.topics()
        wanted = [settings.topic(t) for t in (*LAG_TOPICS, "deadletter") if settings.topic(t) in known]
        tps = [TopicPartition(t, p) for t in wanted for p in sorted(reader.partitions_for_topic(t) or ())]
        ends = await _true_ends(reader, tps, deadline)
        lag: dict[str, int | None] = {}
        for t in LAG_TOPICS:
            topic = settings.topic(t)
            parts = [tp for tp in tps if tp.topic == topic]
            committed = [await group.committed(tp) for tp in parts]
            lag[t] = None if not parts else sum(ends[tp] - (c or 0) for tp, c in zip(parts, committed, strict=True))
        out["lag"] = lag
        dl = [tp for tp in tps if tp.topic == settings.topic("deadletter")]
        if dl:
            counts = [await _dead_letters(reader, tp, ends[tp], deadline) for tp in dl]
            out["dead_letters_60s"] = counts[0] if len(counts) == 1 else sum(c for c in counts if isinstance(c, int))
    except Exception as exc:  # noqa: BLE001 - the broker answered the start: show what failed, keep the rest
        out["error"] = " ".join(str(exc).split()) or type(exc).__name__
    finally:
        for c in started:
            await c.stop()
    return out


def _age_s(now_ms: int, at_ms: Any, speed: float) -> float | None:
    return None if not isinstance(at_ms, int | float) else round((now_ms - at_ms) / 1000.0 / speed, 1)


def _num_field(d: Any, key: str) -> float | None:
    v = d.get(key) if isinstance(d, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def run_clock(worker_beat: Any, settings: Settings) -> ScaledClock:
    """The run's clock: the one the worker publishes in its heartbeat (:meth:`ScaledClock.stamp`), else
    this shell's settings.  A demo or replay runs at ``GOVERNOR_CLOCK_SPEED`` > 1 without telling the
    operator's shell; converting its times with speed 1 showed ages hundreds of seconds below zero."""
    speed, origin_s = _num_field(worker_beat, "clock_speed"), _num_field(worker_beat, "clock_origin_s")
    if speed is not None and speed > 0 and origin_s is not None:
        return ScaledClock(speed, origin_s)
    return ScaledClock(settings.clock_speed, settings.clock_origin_s)


def beat_age_s(beat: Any, clock: ScaledClock, wall_now_ms: int) -> float | None:
    """A heartbeat's age in wall seconds: from its ``wall_ms`` when it has one, else its ``ts_ms`` on ``clock``."""
    wall_ms = _num_field(beat, "wall_ms")
    if wall_ms is not None:
        return round((wall_now_ms - wall_ms) / 1000.0, 1)
    return _age_s(clock.now_ms(), beat.get("ts_ms") if isinstance(beat, dict) else None, clock.speed)


async def collect(settings: Settings, *, timeout_s: float = 3.0) -> dict[str, Any]:
    """One snapshot of the loop (the ``--json`` object); :class:`Unreachable` when Redis or Kafka is."""
    raw = await _read_redis(settings, timeout_s)
    try:
        kafka = await asyncio.wait_for(_read_kafka(settings, timeout_s), timeout_s * 2)
    except TimeoutError:  # it started (else Unreachable): a slow broker, not a missing one
        kafka = {"group": APP_ID, "lag": None, "dead_letters_60s": None, "error": f"no answer in {timeout_s * 2:g} s"}
    clock = run_clock(raw["worker"], settings)
    now, speed, wall_now = clock.now_ms(), clock.speed, int(time.time() * 1000)
    rows = []
    for field, rec in sorted(raw["status"].items()):
        model, _, zone = field.partition("|")
        rec = rec if isinstance(rec, dict) else {}
        last = raw["last_result"].get(zone, {}).get(model)
        if isinstance(last, dict):
            last = {**last, "age_s": _age_s(now, last.get("at_ms"), speed)}
        breaker = raw["breaker"].get(zone, {}).get(field)
        canary = raw["canary"].get(model)
        rows.append(
            {
                "model": model,
                "zone": zone,
                **rec,
                "window_age_s": _age_s(now, rec.get("window_end_ms"), speed),
                "last_command": last,
                "breaker": breaker.get("state") if isinstance(breaker, dict) else None,
                "canary": None
                if not isinstance(canary, dict)
                else {"state": (canary.get("state") or {}).get("name"), "share": canary.get("published_share")},
            }
        )

    def beat(b: Any) -> dict[str, Any]:
        return {"alive": b is not None, "age_s": beat_age_s(b, clock, wall_now)}

    paused = raw["paused"]
    return {
        "prefix": settings.topic_prefix,
        "now_ms": now,
        "wall_ms": wall_now,
        "clock_speed": speed,
        "paused": paused is not None,
        "pause": paused,
        "worker": beat(raw["worker"]),
        "executors": {z: {**beat(b), "backend": (b or {}).get("backend")} for z, b in raw["executors"].items()},
        "rows": rows,
        "kafka": kafka,
        "retune": raw["retune"],
    }


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="the loop per (model, zone), liveness, lag, dead letters (--watch, --json)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--watch", nargs="?", type=float, const=2.0, default=None, metavar="SECONDS", help="refresh (default 2 s)"
    )


def run_status(settings: Settings, args: argparse.Namespace) -> int:
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # a failure is our one line, not its log
    try:
        snap = asyncio.run(asyncio.wait_for(collect(settings), 9.0))
    except (Unreachable, TimeoutError) as exc:
        line = str(exc) if isinstance(exc, Unreachable) else "governor status: no answer within 9 s"
        print(line, file=sys.stderr)
        return 2
    if args.watch is None:
        show_once(snap, as_json=args.json)
        return 0
    return show_watch(settings, snap, max(0.5, args.watch), as_json=args.json)


__all__ = ["COLUMNS", "header_lines", "render_plain", "show_once", "show_watch", "table_rows"]

COLUMNS = (
    "MODEL",
    "ZONE",
    "WINDOW",
    "RATE",
    "VIOL",
    "TTFT P95/SLO",
    "READY/START/TARGET",
    "FF",
    "DRIFT",
    "STALE",
    "ZONE ST",
    "LAST COMMAND",
    "BREAKER",
    "CANARY",
)


def _num(v: Any, fmt: str, unit: str = "") -> str:
    return "-" if not isinstance(v, int | float) or isinstance(v, bool) else f"{v:{fmt}}{unit}"


def _ago(age: Any) -> str:
    return "-" if not isinstance(age, int | float) else f"{age:.1f} s ago"


def _command(last: Any) -> str:
    if not isinstance(last, dict):
        return "-"
    what = str(last.get("kind") or "?")
    if last.get("target_replicas") is not None:
        what += f"->{last['target_replicas']}"
    reason = f" ({str(last['reason'])[:40]})" if last.get("reason") and last.get("outcome") != "applied" else ""
    return f"{what} {last.get('outcome', '?')}{reason} {_ago(last.get('age_s'))}"


def _drift(d: Any) -> str:
    if not isinstance(d, dict):
        return "-"
    return f"{d.get('signal', '?')} {d.get('direction') or ''}".strip()


def table_rows(snap: dict[str, Any]) -> list[list[str]]:
    """One row of :data:`COLUMNS` per (model, zone)."""
    out = []
    for r in snap.get("rows", []):
        canary = r.get("canary")
        out.append(
            [
                str(r.get("model")),
                str(r.get("zone")),
                _ago(r.get("window_age_s")),
                _num(r.get("rate_rps"), ".1f", "/s"),
                _num(r.get("violation_rate"), ".0%")
                + (f" ({_num(u, '.0%')} unfix.)" if (u := r.get("unfixable_rate")) else ""),
                f"{_num(r.get('ttft_p95_ms'), '.0f')}/{_num(r.get('ttft_slo_ms'), '.0f')} ms",
                f"{r.get('replicas_ready', '-')}/{r.get('replicas_starting', '-')}/{_num(r.get('target'), 'd')}",
                {True: "on", False: "off"}.get(r.get("ff_mode"), "-"),
                _drift(r.get("drift")),
                f"STALE ({r.get('stale_reason')})" if r.get("stale") else "no",
                str(r.get("zone_status") or "-"),
                _command(r.get("last_command")),
                str(r.get("breaker") or "-"),
                "-"
                if not isinstance(canary, dict)
                else f"{canary.get('state')} {_num(canary.get('share'), '.0%')}".strip(),
            ]
        )
    return out


def header_lines(snap: dict[str, Any]) -> list[str]:
    """The fleet-wide lines above the table."""
    pause: dict[str, Any] = snap["pause"] if isinstance(snap.get("pause"), dict) else {}
    state = f"PAUSED ({pause.get('reason', '')})" if snap.get("paused") else "loop running"
    worker = snap.get("worker", {})
    w = f"worker alive (beat {_ago(worker.get('age_s'))})" if worker.get("alive") else "worker DOWN (no heartbeat)"
    execs = ", ".join(
        f"{z} alive ({_ago(e.get('age_s'))})" if e.get("alive") else f"{z} DOWN"
        for z, e in snap.get("executors", {}).items()
    )
    k = snap.get("kafka", {})
    dl = k.get("dead_letters_60s")
    lag = k.get("lag")
    lag_s = (
        "unavailable"
        if not isinstance(lag, dict)
        else ", ".join(f"{t} {'-' if n is None else n}" for t, n in lag.items())
    )
    kafka = f"kafka: dead letters in the last 60 s: {'-' if dl is None else dl}; lag of group {k.get('group')}: {lag_s}"
    if k.get("error"):
        kafka += f" (error: {k['error']})"
    lines = [f"governor status (prefix {snap.get('prefix')}): {state}", f"{w}; executors: {execs or '-'}", kafka]
    return lines + [retune_line(rec) for _, rec in sorted((snap.get("retune") or {}).items()) if isinstance(rec, dict)]


def _gains(g: Any) -> str:
    return "-" if not isinstance(g, dict) else " ".join(f"{k}={v:.4g}" for k, v in sorted(g.items()) if k in _SHOWN)


_SHOWN = ("kp", "ki", "kd", "ki_down")


def retune_line(rec: dict[str, Any]) -> str:
    """One model's online retuning (``<prefix>:retune``): the mode, the gains in force, the proposal with
    its certificate and expected effect on the fitted simulator, and what was done.

    >>> print(retune_line({"model": "m", "mode": "shadow", "killed": False, "action": "shadow", "reason": "r",
    ...     "in_force": {"ki": 0.0235}, "proposal": {"proposed": {"ki": 0.02}, "gate": {"accepted": True, "sdp": False},
    ...     "expected": {"current": {"attainment": 0.99, "gpu_seconds": 1000.0},
    ...                  "proposed": {"attainment": 0.995, "gpu_seconds": 900.0}}}}))
    retune m: shadow (shadow: r); in force ki=0.0235; proposed ki=0.02 (certified, margins only); expected attainment 99.00% -> 99.50%, GPU-s 1,000 -> 900
    """
    head = f"retune {rec.get('model')}: {rec.get('mode')}{' KILLED' if rec.get('killed') else ''}"
    out = f"{head} ({rec.get('action')}: {rec.get('reason')}); in force {_gains(rec.get('in_force'))}"
    prop = rec.get("proposal")
    if isinstance(prop, dict) and not prop.get("expected"):
        out += f"; no proposal ({(prop.get('gate') or {}).get('note', '')})"
    elif isinstance(prop, dict):
        gate = prop.get("gate") or {}
        cert = "certified" if gate.get("accepted") else "NOT certified: " + "; ".join(gate.get("reasons") or [])
        if gate.get("accepted") and not gate.get("sdp"):
            cert += ", margins only"
        cur, new = (prop.get("expected") or {}).get("current") or {}, (prop.get("expected") or {}).get("proposed") or {}
        out += f"; proposed {_gains(prop.get('proposed'))} ({cert})"
        if cur and new:
            out += (
                f"; expected attainment {_num(cur.get('attainment'), '.2%')} -> {_num(new.get('attainment'), '.2%')}, "
                f"GPU-s {_num(cur.get('gpu_seconds'), ',.0f')} -> {_num(new.get('gpu_seconds'), ',.0f')}"
            )
    return out


def render_plain(snap: dict[str, Any]) -> str:
    """The snapshot as aligned text (what a pipe gets)."""
    lines = header_lines(snap)
    rows = table_rows(snap)
    if not rows:
        return "\n".join([*lines, "(no (model, zone) has reported a window yet)"])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    for r in [list(COLUMNS), *rows]:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _rich(snap: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = [Text(line, style="bold red" if "PAUSED" in line or "DOWN" in line else "") for line in header_lines(snap)]
    if not snap.get("rows"):
        return Group(*head, Text("(no (model, zone) has reported a window yet)"))
    table = Table(*COLUMNS, header_style="bold", expand=False)
    for r in table_rows(snap):
        style = "red" if r[9] != "no" or "DOWN" in r[10] else None
        table.add_row(*r, style=style)
    return Group(*head, table)


def _rich_available() -> bool:
    if not sys.stdout.isatty():
        return False
    try:
        import rich  # noqa: F401 - optional: not a dependency of governor
    except ImportError:
        return False
    return True


def show_once(snap: dict[str, Any], *, as_json: bool = False) -> None:
    """One look: JSON, a ``rich`` table in a terminal, else plain text."""
    if as_json:
        print(orjson.dumps(snap).decode(), flush=True)
    elif _rich_available():
        from rich.console import Console

        Console().print(_rich(snap))
    else:
        print(render_plain(snap), flush=True)


def show_watch(settings: Settings, first: dict[str, Any], every_s: float, *, as_json: bool = False) -> int:
    """Refresh every ``every_s`` until Ctrl-C; a failed look is shown and retried."""

    def look() -> dict[str, Any] | str:
        try:
            return asyncio.run(asyncio.wait_for(collect(settings), 9.0))
        except (Unreachable, TimeoutError) as exc:
            return str(exc) or "governor status: no answer within 9 s"

    snap: dict[str, Any] | str = first
    try:
        if _rich_available() and not as_json:
            from rich.live import Live

            with Live(_rich(first), auto_refresh=False) as live:
                while True:
                    time.sleep(every_s)
                    snap = look()
                    live.update(_rich(snap) if isinstance(snap, dict) else snap, refresh=True)
        while True:
            if isinstance(snap, dict):
                print(orjson.dumps(snap).decode() if as_json else render_plain(snap) + "\n", flush=True)
            else:
                print(snap, file=sys.stderr, flush=True)
            time.sleep(every_s)
            snap = look()
    except KeyboardInterrupt:
        return 0
