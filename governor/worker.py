"""``governor worker``: the Faust stream worker process.

``/metrics``, ``/healthz`` and ``/readyz`` are served on GOVERNOR_METRICS_PORT
(:mod:`streams.health`): ready once Faust has its partitions (connected to
Kafka, agents started) and Redis answers a PING (checked every ``WATCH_S``).
Kafka or Redis down at start is waited for (capped backoff, one log line per
attempt with the next delay; /readyz 503 meanwhile), never a reason to exit.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import redis
import redis.asyncio as aioredis
from aiokafka.client import AIOKafkaClient
from faust.worker import Worker

from core.clock import ScaledClock
from core.settings import Settings
from core.transport import kafka_options, redis_options
from executors.loop import MAX_DELAY_S, MIN_DELAY_S
from governor.budget_cli import write_default_allowances
from launch.processes import WORKER_READY, ready_log
from streams.agents import build_pipeline
from streams.app import create_app
from streams.health import Readiness

log = logging.getLogger(__name__)

WATCH_S = 5.0  # seconds between the Redis PINGs behind /readyz


def main(settings: Settings, args: argparse.Namespace) -> int:
    """``governor worker``: a bad controller setting is refused before any server is touched."""
    from controllers.scaling_law import controller_problem

    problem = controller_problem(settings)  # before any server: a bad gain is a setting, not a crash
    if problem:
        print(f"governor worker: bad setting: {problem}", file=sys.stderr)
        return 2
    return run_worker(settings)


def run_worker(settings: Settings) -> int:
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    app = create_app(settings)
    clock = ScaledClock(settings.clock_speed, settings.clock_origin_s)
    readiness = Readiness(("kafka", "agents", "redis"))  # and "agent <name>" after a crash (streams.boundary)
    pipeline = build_pipeline(app, settings, clock, readiness=readiness, retune_search=retune_search(settings))
    pipeline.metrics.serve(settings.metrics_port, settings.metrics_addr, readiness)
    if not wait_for_servers(settings, readiness):
        return 0  # stopped while waiting
    _default_allowances(settings)
    probe = aioredis.Redis.from_url(
        str(settings.redis_url), socket_timeout=5.0, socket_connect_timeout=5.0, **redis_options(settings)
    )

    async def check_redis() -> None:
        try:
            await probe.ping()
        except Exception as exc:  # noqa: BLE001 - reported by /readyz
            readiness.fail("redis", f"{type(exc).__name__}: {exc}")
        else:
            readiness.ok("redis")

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # Faust's receiver type requires signal=
    async def _assigned(sender, assigned, **kwargs) -> None:  # type: ignore[no-untyped-def]
        readiness.ok("kafka")
        readiness.ok("agents")
        await check_redis()
        if not frozen:  # the app is up: what it made stays, out of the collector's way too
            frozen.append(freeze_heap())
        ready_log().info("%s: %d partitions assigned", WORKER_READY, len(assigned))

    app.timer(WATCH_S)(check_redis)

    frozen: list[int] = []
    freeze_heap()
    # override_logging=False: keep governor's handler (--log-format), not mode's.
    worker = Worker(
        app,
        loglevel=logging.getLevelName(logging.getLogger().level).lower(),
        redirect_stdouts=False,
        quiet=True,
        override_logging=False,
    )
    worker.execute_from_commandline()
    return 0


def freeze_heap() -> int:
    """Collect once, then move every object alive (modules, the app, the pipeline: hundreds of
    thousands, made once) to the collector's permanent generation, so that its full collections,
    which the per-message allocations of Faust and aiokafka trigger, no longer walk them; the
    number of objects frozen.  Garbage made later is collected as before."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def retune_search(settings: Settings) -> Any:
    """The search of online retuning (:func:`sim.retune.propose`, the fast simulator fitted to the recent
    windows), or None with ``GOVERNOR_RETUNE=off`` (the simulator is then not even imported)."""
    if settings.retune == "off":
        return None
    from sim.retune import propose

    return propose


def _default_allowances(settings: Settings) -> None:
    """Each zone's share of the fleet budget where none is set (governor/budget_cli.py); a failure is logged:
    the executors then hold scale-ups of a zone without an allowance (fail safe)."""
    client = redis.Redis.from_url(
        str(settings.redis_url), socket_timeout=5.0, socket_connect_timeout=5.0, **redis_options(settings)
    )
    try:
        written = write_default_allowances(client, settings, int(time.time() * 1000))
        if written:
            log.info("fleet budget: default allowances written for %s", ", ".join(written))
    except Exception as exc:  # noqa: BLE001 - never stops the worker
        log.error("fleet budget: allowances not written (%s); executors hold scale-ups without one", exc)
    finally:
        client.close()


def _kafka_problem(settings: Settings) -> str | None:
    """Why KAFKA_BOOTSTRAP cannot be bootstrapped from (None: it can); on its own loop and thread."""

    async def probe() -> None:
        client = AIOKafkaClient(bootstrap_servers=settings.kafka_bootstrap, **kafka_options(settings))
        try:
            await client.bootstrap()
        finally:
            await client.close()

    try:
        with ThreadPoolExecutor(1) as pool:  # never touches the main thread's loop, which Faust uses
            pool.submit(asyncio.run, probe()).result()
    except Exception as exc:  # noqa: BLE001 - the reason is the answer
        return f"{type(exc).__name__}: {exc}"
    return None


def _redis_problem(settings: Settings) -> str | None:
    client = redis.Redis.from_url(
        str(settings.redis_url), socket_timeout=3.0, socket_connect_timeout=3.0, **redis_options(settings)
    )
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - the reason is the answer
        return f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
    return None


def wait_for_servers(settings: Settings, readiness: Readiness) -> bool:
    """Wait until Kafka and Redis answer (True), or SIGTERM/SIGINT (False); one line per attempt."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    aiokafka_log = logging.getLogger("aiokafka")
    level = aiokafka_log.level
    aiokafka_log.setLevel(logging.CRITICAL)  # its per-connection errors: our line says it once
    delay = MIN_DELAY_S
    try:
        while not stop.is_set():
            problems = []
            for name, setting, check in (
                ("kafka", "KAFKA_BOOTSTRAP", _kafka_problem),
                ("redis", "REDIS_URL", _redis_problem),
            ):
                why = check(settings)
                if why is None:
                    readiness.ok(name)
                else:
                    readiness.fail(name, why)
                    problems.append(f"{name} ({setting}) unavailable: {why}")
            if not problems:
                return True
            log.warning("worker: waiting for servers: %s; retry in %.1f s", "; ".join(problems), delay)
            stop.wait(delay)
            delay = min(MAX_DELAY_S, delay * 2)
        return False
    finally:
        aiokafka_log.setLevel(level)
        for sig, handler in old.items():
            signal.signal(sig, handler)
