"""``governor pause`` / ``governor resume``: the fleet's runtime kill switch.

``pause`` writes ``<prefix>:paused`` (JSON ``{"reason", "paused_at_ms"}``) to
the Redis at ``REDIS_URL``; every executor reads it before it applies a
command and, while it is set, reports the command as ``advisory`` instead
(acknowledged, not applied, only its marker kept, so a replay after
``resume`` is a ``duplicate``; see
:mod:`executors.executor`).  ``resume`` deletes the key.  No restart of any
process is needed either way.

``--retune`` (either command) is the kill switch of online retuning instead: ``pause --retune`` writes
``<prefix>:retune:paused``, which the worker reads every second: it puts the configured gains back in
force at once and applies no proposal while the key exists (:mod:`loop.retune_driver`); ``resume
--retune`` deletes it.  The executors are not paused by it.  Exit 0 on success, 2 when Redis cannot be
reached (one line on stderr naming ``REDIS_URL``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core import names
from core.settings import Settings
from core.transport import redis_options

__all__ = ["add_parser", "add_resume_parser", "run_pause"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pause", help="kill switch: executors stop applying commands (reported as advisory)")
    p.add_argument("--reason", default="operator", help="why (shown in every advisory result)")
    p.add_argument("--retune", action="store_true", help="the kill switch of online retuning instead (gains back)")


def add_resume_parser(sub: Any) -> None:
    p = sub.add_parser("resume", help="lift governor pause: executors apply commands again")
    p.add_argument("--retune", action="store_true", help="lift the kill switch of online retuning instead")


def run_pause(settings: Settings, args: argparse.Namespace) -> int:
    retune = bool(getattr(args, "retune", False))
    key = (names.retune_paused if retune else names.paused)(settings.topic_prefix)
    client = redis.Redis.from_url(
        str(settings.redis_url), socket_timeout=5.0, socket_connect_timeout=5.0, **redis_options(settings)
    )
    try:
        if args.command == "pause":
            record = {"reason": args.reason, "paused_at_ms": int(time.time() * 1000)}
            client.set(key, orjson.dumps(record))
            what = "the worker keeps the configured gains" if retune else "executors report commands as advisory"
            print(f"paused: {key} set ({args.reason}); {what}")
        else:
            existed = client.delete(key)
            print(f"resumed: {key} deleted" if existed else f"resumed: {key} was not set")
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        why = " ".join(str(exc).split())
        print(
            f"governor {args.command}: redis unreachable ({why}); set REDIS_URL to the governor's Redis",
            file=sys.stderr,
        )
        return 2
    finally:
        client.close()
    return 0
