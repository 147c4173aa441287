"""``governor canary start|status|abort``: the operator's side of a rollout.

The rollout lives in Redis (``<prefix>:canary:<model>``, see
:mod:`loop.canary_driver`); the stream worker advances it from the metrics
windows and publishes the ``canary`` commands.  These commands only read and
write that key, against ``REDIS_URL`` (no embedded servers).

    governor canary start --model llama2-70b --version v2 [--stages 0.01,0.05,0.2,1.0]
                          [--hold-s 300] [--max-error-rate 0.008] [--max-p99-ms 800]
                          [--max-slowdown 2] [--sequential-alpha 0.001]
    governor canary status --model llama2-70b [--json]
    governor canary abort --model llama2-70b --reason "bad outputs"
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError

from controllers import canary as can
from controllers.errors import ParameterError
from core import names
from core.clock import ScaledClock
from core.settings import Settings
from core.transport import redis_options
from loop.canary_driver import new_rollout, params_from_dict


class CanaryCliError(RuntimeError):
    """A canary command cannot be carried out; the message says why."""


def add_parser(sub: Any) -> None:
    c = sub.add_parser("canary", help="start, inspect or abort a canary rollout (state in Redis)")
    csub = c.add_subparsers(dest="canary", required=True)
    s = csub.add_parser("start", help="start rolling out MODEL@VERSION")
    s.add_argument("--model", required=True, help="stable model name (a GOVERNOR_MODELS name)")
    s.add_argument("--version", required=True, help="canary version; its windows are MODEL@VERSION")
    s.add_argument("--stages", default="0.01,0.05,0.2,1.0", help="comma-separated shares")
    s.add_argument("--hold-s", type=float, default=300.0, help="seconds each stage is held")
    s.add_argument("--max-error-rate", type=float, default=0.008)
    s.add_argument("--max-p99-ms", type=float, default=800.0)
    s.add_argument("--min-requests-per-stage", type=int, default=500)
    s.add_argument(
        "--max-slowdown",
        type=float,
        default=2.0,
        help="roll back a canary slower than this x stable's TTFT P95 (0 = off)",
    )
    s.add_argument(
        "--sequential-alpha", type=float, default=0.001, help="false-rollback bound of the sequential latency tests"
    )
    s.add_argument("--force", action="store_true", help="replace a rollout that is still running")
    st = csub.add_parser("status", help="print a rollout's state")
    st.add_argument("--model", required=True)
    st.add_argument("--json", action="store_true")
    a = csub.add_parser("abort", help="abort a rollout (traffic back to the stable model)")
    a.add_argument("--model", required=True)
    a.add_argument("--reason", default="operator")


def _client(settings: Settings) -> redis.Redis:
    r = redis.Redis.from_url(
        str(settings.redis_url), socket_timeout=5.0, socket_connect_timeout=5.0, **redis_options(settings)
    )
    try:
        r.ping()
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        r.close()
        raise CanaryCliError(f"redis unreachable ({exc}); set REDIS_URL to the governor's Redis") from exc
    return r


def start(
    settings: Settings,
    model: str,
    version: str,
    params: can.CanaryParams,
    now_s: float | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Write a started rollout; refuses to replace a running one unless ``force``."""
    if now_s is None:
        now_s = ScaledClock(settings.clock_speed, settings.clock_origin_s).now_ms() / 1000.0
    try:
        rollout = new_rollout(model, version, params, now_s)
    except ValueError as exc:
        raise CanaryCliError(str(exc)) from exc
    r = _client(settings)
    key = names.canary_state(settings.topic_prefix, model)
    try:
        with r.pipeline(transaction=True) as pipe:
            pipe.watch(key)  # type: ignore[no-untyped-call]
            old = pipe.get(key)
            if old is not None and not force and orjson.loads(old)["state"]["name"] == "running":
                raise CanaryCliError(
                    f"a rollout of {model} is running ({orjson.loads(old)['canary']}); abort it or pass --force"
                )
            pipe.multi()
            pipe.set(key, orjson.dumps(rollout))
            pipe.execute()
    except WatchError as exc:
        raise CanaryCliError(f"the rollout of {model} changed meanwhile; try again") from exc
    finally:
        r.close()
    return rollout


def status(settings: Settings, model: str) -> dict[str, Any]:
    """The stored rollout with ``share`` (the canary's current traffic share) added."""
    r = _client(settings)
    try:
        raw = r.get(names.canary_state(settings.topic_prefix, model))
    finally:
        r.close()
    if raw is None:
        raise CanaryCliError(f"no rollout of {model} (key {names.canary_state(settings.topic_prefix, model)})")
    rollout = orjson.loads(raw)
    params = params_from_dict(rollout["params"])
    rollout["share"] = can.traffic_share(params, can.CanaryState.from_dict(rollout["state"]))
    return dict(rollout)


def abort(settings: Settings, model: str, reason: str) -> dict[str, Any]:
    """Mark the rollout aborted (the worker then publishes share 0)."""
    r = _client(settings)
    key = names.canary_state(settings.topic_prefix, model)
    try:
        for _ in range(10):
            try:
                with r.pipeline(transaction=True) as pipe:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    raw = pipe.get(key)
                    if raw is None:
                        raise CanaryCliError(f"no rollout of {model}")
                    rollout = orjson.loads(raw)
                    rollout["state"] = can.abort(can.CanaryState.from_dict(rollout["state"]), reason).to_dict()
                    pipe.multi()
                    pipe.set(key, orjson.dumps(rollout))
                    pipe.execute()
                    return dict(rollout)
            except WatchError:
                continue
        raise CanaryCliError(f"the rollout of {model} kept changing; try again")
    finally:
        r.close()


def format_status(rollout: dict[str, Any]) -> str:
    s, p = rollout["state"], rollout["params"]
    stages = p["stages"]
    lines = [
        f"{rollout['canary']}: {s['name']}",
        f"  stage      {s['stage'] + 1}/{len(stages)} ({stages[s['stage']]:.0%})",
        f"  share      {rollout['share']:.2%} (published {rollout['published_share']:.2%})",
        f"  stage      canary {s['stage_errors']}/{s['stage_requests']} errors, "
        f"stable {s['stable_errors']}/{s['stable_requests']}",
        f"  latency    {s.get('stage_over_limit', 0)}/{s['stage_requests']} over "
        f"{p['max_p99_ms']:g} ms, {s.get('stage_slow', 0)}/{s.get('stage_ref_requests', 0)} over "
        f"{p.get('max_slowdown') or '-'} x stable's p95",
        f"  exposure   {s['canary_total']}/{s['all_total']} requests",
        f"  reason     {s['reason']}",
    ]
    return "\n".join(lines)


def run_canary(settings: Settings, args: argparse.Namespace) -> int:
    try:
        if args.canary == "start":
            try:
                stages = tuple(float(x) for x in args.stages.split(",") if x.strip())
                params = can.CanaryParams(
                    stages=stages,
                    hold_s=args.hold_s,
                    max_error_rate=args.max_error_rate,
                    max_p99_ms=args.max_p99_ms,
                    min_requests_per_stage=args.min_requests_per_stage,
                    max_slowdown=args.max_slowdown or None,
                    sequential_alpha=args.sequential_alpha,
                )
            except (ValueError, ParameterError) as exc:
                print(f"governor canary: {exc}", file=sys.stderr)
                return 2
            rollout = start(settings, args.model, args.version, params, force=args.force)
            print(f"{rollout['canary']}: started at {params.stages[0]:.0%}")
            return 0
        if args.canary == "status":
            rollout = status(settings, args.model)
            print(orjson.dumps(rollout).decode() if args.json else format_status(rollout))
            return 0
        if args.canary == "abort":
            rollout = abort(settings, args.model, args.reason)
            print(f"{rollout['canary']}: {rollout['state']['name']} ({rollout['state']['reason']})")
            return 0
    except CanaryCliError as exc:
        print(f"governor canary: {exc}", file=sys.stderr)
        return 1
    return 2
