"""``governor admission add|list|check|remove``: periodic agent tasks, admitted by response-time analysis.

An agent orchestrator registers each periodic task it runs; the stream worker
admits it, rejects it, or holds it until its model's latency is measured, and
re-checks the admitted set as the measured P99s move (:mod:`loop.admission_driver`,
the analysis in :mod:`controllers.admission` and :mod:`controllers.rta`).  The
registry is the Redis hash ``<prefix>:admission`` (``REDIS_URL``)::

    governor admission add --orchestrator desk-7 --task quote --model llama2-7b \\
        --period-ms 300 [--deadline-ms 250] --priority 0 [--class trading] [--jitter-ms 20] [--wait-s 10]
    governor admission list [--json]
    governor admission check [--file TASKS.json --latency-ms MODEL=MS ...] [--json]
    governor admission remove --orchestrator desk-7 --task quote

``add`` exits 0 when admitted, 1 when rejected (the reason names the task that
would miss), 3 when still pending after ``--wait-s`` (no latency measured for
its model yet: the worker decides later), 2 on bad input or an unreachable
Redis.  ``check`` exits 1 when an orchestrator's set can miss a deadline:
from the worker's registry, or offline for a file of tasks (a JSON list of
task objects) under the latencies given, with no server at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import orjson
import redis
from redis.exceptions import RedisError

from controllers.admission import AgentTask, Verdict, evaluate
from controllers.errors import ParameterError
from core import names
from core.clock import ScaledClock
from core.settings import Settings
from core.transport import redis_options
from loop.admission_driver import MAX_ENTRIES, MAX_ENTRY_BYTES

__all__ = ["add_parser", "run_admission"]


def add_parser(sub: Any) -> None:
    a = sub.add_parser("admission", help="periodic agent tasks admitted by response-time analysis (Redis)")
    asub = a.add_subparsers(dest="admission", required=True)
    add = asub.add_parser("add", help="register a periodic task; the worker admits or rejects it")
    add.add_argument("--orchestrator", required=True, help="the agent loop that runs the task (one processor)")
    add.add_argument("--task", required=True, help="the task's name, unique within its orchestrator")
    add.add_argument("--model", required=True, help="the model its call goes to (a GOVERNOR_MODELS name)")
    add.add_argument("--class", dest="request_class", default="", help="request class (its measured latency if any)")
    add.add_argument("--period-ms", type=float, required=True)
    add.add_argument("--deadline-ms", type=float, default=None, help="relative deadline (default: the period)")
    add.add_argument("--priority", type=int, required=True, help="smaller = more urgent")
    add.add_argument("--jitter-ms", type=float, default=0.0, help="release jitter")
    add.add_argument("--blocking-ms", type=float, default=0.0, help="longest wait behind a lower-priority call")
    add.add_argument("--wait-s", type=float, default=10.0, help="seconds to wait for the worker's decision")
    lst = asub.add_parser("list", help="every registered task with its state")
    lst.add_argument("--json", action="store_true")
    chk = asub.add_parser("check", help="can an orchestrator miss a deadline? (registry, or a file offline)")
    chk.add_argument("--file", default="", help="JSON list of tasks to analyse offline (no Redis)")
    chk.add_argument("--latency-ms", action="append", default=[], help="MODEL[|CLASS]=MS for --file (repeatable)")
    chk.add_argument("--json", action="store_true")
    rm = asub.add_parser("remove", help="unregister a task")
    rm.add_argument("--orchestrator", required=True)
    rm.add_argument("--task", required=True)


def run_admission(settings: Settings, args: argparse.Namespace) -> int:
    try:
        if args.admission == "check" and args.file:
            return _check_file(args)
        r = redis.Redis.from_url(str(settings.redis_url), socket_timeout=5.0, **redis_options(settings))
        key = names.admission(settings.topic_prefix)
        if args.admission == "add":
            return _add(settings, r, key, args)
        if args.admission == "remove":
            gone = r.hdel(key, f"{args.orchestrator}|{args.task}")
            print("removed" if gone else "no such task")
            return 0 if gone else 1
        raw_entries: dict[bytes, bytes] = r.hgetall(key)  # type: ignore[assignment]
        fields = sorted(raw_entries.items())
        if len(fields) > MAX_ENTRIES:  # what the worker reads, no more: the rest is not parsed either
            print(f"governor admission: {len(fields)} fields, only the first {MAX_ENTRIES} are read", file=sys.stderr)
        entries = {k.decode("utf-8", "replace")[:300]: _load(v) for k, v in fields[:MAX_ENTRIES]}
        if args.admission == "list":
            return _list(entries, args.json)
        return _check_registry(entries, args.json)
    except ParameterError as exc:
        print(f"governor admission: {exc}", file=sys.stderr)
        return 2
    except (RedisError, OSError) as exc:
        print(f"governor admission: Redis {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def _load(raw: bytes | str) -> dict[str, Any]:
    if len(raw) > MAX_ENTRY_BYTES:
        return {"state": "invalid", "reason": f"an entry of {len(raw)} bytes (at most {MAX_ENTRY_BYTES})"}
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"state": "invalid", "reason": "not JSON"}
    return obj if isinstance(obj, dict) else {"state": "invalid", "reason": "not an object"}


def _add(settings: Settings, r: redis.Redis, key: str, args: argparse.Namespace) -> int:
    spec = {
        "orchestrator": args.orchestrator,
        "name": args.task,
        "model": args.model,
        "request_class": args.request_class,
        "period_ms": args.period_ms,
        "deadline_ms": args.deadline_ms,
        "priority": args.priority,
        "jitter_ms": args.jitter_ms,
        "blocking_ms": args.blocking_ms,
    }
    task = AgentTask.from_dict({k: v for k, v in spec.items() if v not in (None, "")})
    if settings.model(task.model) is None:
        raise ParameterError(f"model {task.model!r} is not in GOVERNOR_MODELS")
    now = ScaledClock(settings.clock_speed, settings.clock_origin_s or time.time()).now_ms()
    r.hset(key, task.key, orjson.dumps({**task.to_dict(), "state": "pending", "registered_ms": now}))
    deadline = time.monotonic() + max(0.0, args.wait_s)
    obj: dict[str, Any] = {"state": "pending"}
    while True:
        raw = r.hget(key, task.key)
        obj = _load(raw) if raw is not None else {"state": "removed"}
        if obj.get("state") != "pending" or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    state = str(obj.get("state"))
    print(f"{task.key}: {state}" + (f" ({obj['reason']})" if obj.get("reason") else ""))
    return {"admitted": 0, "rejected": 1, "pending": 3}.get(state, 1)


def _list(entries: dict[str, dict[str, Any]], as_json: bool) -> int:
    if as_json:
        print(json.dumps(entries, indent=2, sort_keys=True))
        return 0
    print(f"{'task':<32} {'model':<16} {'T ms':>7} {'D ms':>7} {'prio':>4} {'state':<10} {'R ms':>8}  reason")
    for key, e in sorted(entries.items()):
        d = e.get("deadline_ms") or e.get("period_ms")
        resp = e.get("response_ms")
        print(
            f"{key[:32]:<32} {str(e.get('model', ''))[:16]:<16} {_num(e.get('period_ms')):>7} {_num(d):>7} "
            f"{str(e.get('priority', '')):>4} {str(e.get('state', ''))[:10]:<10} {_num(resp):>8}  "
            f"{str(e.get('reason', ''))[:100]}"
        )
    return 0


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else "-"


def _check_registry(entries: dict[str, dict[str, Any]], as_json: bool) -> int:
    bad = {k: e for k, e in entries.items() if e.get("state") == "infeasible"}
    if as_json:
        print(json.dumps({"infeasible": sorted(bad), "tasks": len(entries)}, indent=2))
    else:
        orchs = sorted({k.split("|", 1)[0] for k in bad})
        print(
            f"{len(entries)} tasks; " + (f"infeasible orchestrators: {', '.join(orchs)}" if orchs else "all feasible")
        )
    return 1 if bad else 0


def _check_file(args: argparse.Namespace) -> int:
    try:
        with open(args.file, "rb") as fh:
            raw = fh.read(1 << 20)
        items = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise ParameterError(f"{args.file}: {exc}") from None
    if not isinstance(items, list):
        raise ParameterError(f"{args.file}: a JSON list of task objects")
    tasks = []
    for i, item in enumerate(items):
        try:
            tasks.append(AgentTask.from_dict(item))
        except ParameterError as exc:
            raise ParameterError(f"{args.file}: [{i}]: {exc}") from None
    latency: dict[str, float] = {}
    for item in args.latency_ms:
        k, sep, ms = str(item).rpartition("=")
        try:
            latency[k] = float(ms)
        except ValueError:
            k = ""
        if not sep or not k or not latency.get(k, -1) >= 0:
            raise ParameterError(f"--latency-ms {item!r}: want MODEL[|CLASS]=MS")
    verdicts: list[Verdict] = []
    for orch in sorted({t.orchestrator for t in tasks}):
        verdicts.append(evaluate([t for t in tasks if t.orchestrator == orch], latency))
    if args.json:
        print(json.dumps([v.to_dict() for v in verdicts], indent=2))
    else:
        for v in verdicts:
            head = (
                "feasible" if v.feasible else ("no latency for " + ", ".join(v.missing) if v.missing else "INFEASIBLE")
            )
            print(f"{v.orchestrator}: {head}; margin x{v.margin:.3f}")
            for r in v.results:
                shown = "inf" if r.response == float("inf") else f"{r.response:.1f}"
                print(f"  {r.name:<24} R {shown:>8} ms  D {r.deadline:>8g} ms  slack {r.slack:8.1f} ms")
    return 0 if all(v.feasible for v in verdicts) else 1
