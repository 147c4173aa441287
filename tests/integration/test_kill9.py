"""kill -9 on real processes (issue #13, item 5): the stream worker mid-window, a zone
executor between the apply and its marker, Redis under the bridge, and Redis under an
executor restarted with and without its data.

Every process here is real: ``governor worker`` / ``governor executor`` children
(:mod:`launch.processes`), a private ``redis-server`` per Redis-fault test (the
session's shared Redis and broker are never touched), the real broker.  Faults are
SIGKILL (no handler runs, nothing is acknowledged, no marker, no commit) and SIGSTOP.
Each test ends with the command ledger (:mod:`bench.ledger`): every command issued on
``<prefix>.commands`` joined with its outcomes on ``<prefix>.results``; none lost, none
applied twice, no stale decision applied over a newer one, every refusal with a reason.
Child logs are printed at teardown (pytest shows them when a test fails).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis

from core import names
from core.settings import Secret, Settings
from executors.executor import GROUP
from launch.processes import EXECUTOR_READY, WORKER_READY, ChildProcess, start_executor, start_worker
from launch.topics import ensure_topics
from loop.commands import Command
from tests.integration.faults import (
    Receiver,
    RedisServer,
    Telemetry,
    kill9,
    ledger,
    ledger_settles,
    publish_commands,
    records,
    results,
    start_webhook_executor,
    tails,
    wait_until,
)
from tests.integration.harness import signed, with_models

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ZONE = "az-a"
MODEL = "llama2-70b"  # default ModelSpec: TTFT SLO 1000 ms; the telemetry here has 3000 ms
OTHER = "kill9-other"  # a second model, so two commands of one test never order each other


@pytest.fixture
def procs() -> Iterator[list[Any]]:
    """Children and servers a test starts; stopped at teardown, their log tails printed."""
    started: list[Any] = []
    yield started
    for p in reversed(started):
        t0 = time.monotonic()
        p.stop()
        print(f"stopped {p.name} in {time.monotonic() - t0:.1f} s")
    print(tails(*started))


def _loop_settings(settings: Settings, **changes: Any) -> Settings:
    return settings.replace(
        zones=(ZONE,),
        command_ttl_s=30.0,
        pid_gains={"kp": 0.0, "ki": 0.5, "kd": 0.0},  # 1 s windows: acts within a few windows
        session_timeout_s=6.0,  # a SIGKILLed worker's group membership lapses in ~6 s
        **changes,
    )


def _scale(target: int, model: str = MODEL, basis_ms: int | None = None) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind="scale",
        zone=ZONE,
        model=model,
        target_replicas=target,
        reason="kill9",
        issued_at_ms=now,
        expires_at_ms=now + 60_000,
        basis_ms=now if basis_ms is None else basis_ms,
    )


def _desired(r: redis.Redis, settings: Settings, model: str = MODEL) -> int:
    raw = r.hget(names.desired_replicas(settings.topic_prefix, ZONE), model)
    return int(raw) if raw is not None else 0


def _issue(r: redis.Redis, settings: Settings, *cmds: Command) -> None:
    """What the worker does for ``cmds``: the commands topic (for the ledger), then the zone's stream."""
    asyncio.run(publish_commands(settings, cmds))
    for c in cmds:
        r.xadd(names.command_stream(settings.topic_prefix, ZONE), {"cmd": signed(settings, c)})


def _applied(settings: Settings, command_id: str) -> list[dict[str, Any]]:
    return [r for r in results(settings, 0.5) if r["command_id"] == command_id and r["outcome"] == "applied"]


def _assert_ledger_clean(report: dict[str, Any], *children: Any) -> None:
    print("ledger:", {k: v for k, v in report.items() if k != "ok"})
    why = (report, tails(*children))
    assert report["lost"] == [], why
    assert report["applied_twice"] == [], why
    assert report["regressions"] == [], why
    assert report["unexplained"] == [], why


def _into_window(fraction: float, window_s: float = 1.0) -> None:
    """Sleep until ``fraction`` of the way through a window (windows are aligned to the epoch)."""
    time.sleep((fraction - (time.time() / window_s) % 1.0) % 1.0 * window_s)


def test_worker_killed_mid_window_the_loop_goes_on(settings: Settings, tmp_path: Path, procs: list[Any]) -> None:
    """SIGKILL the worker 0.9 s into a 1 s window while violating telemetry flows; a new
    worker takes over the group's partitions (after the dead member's session lapses), reads
    what the dead one had not committed, and the loop goes on issuing and applying commands.
    Whatever the dead worker had published but not bridged is bridged by its successor."""
    settings = _loop_settings(settings)
    asyncio.run(ensure_topics(settings))
    r = redis.Redis.from_url(str(settings.redis_url))
    r.hset(names.desired_replicas(settings.topic_prefix, ZONE), MODEL, 2)
    (tmp_path / "w1").mkdir()
    (tmp_path / "w2").mkdir()
    first = start_worker(settings, tmp_path / "w1")
    procs.append(first)
    executor = start_executor(settings, ZONE, tmp_path)
    procs.append(executor)
    first.wait_for_log(WORKER_READY, 60)
    executor.wait_for_log(EXECUTOR_READY, 30)
    with Telemetry(settings, ZONE, MODEL) as telemetry:
        wait_until(
            lambda: _desired(r, settings) > 2, 40, f"a scale-up applied before the kill\n{tails(first, executor)}"
        )
        # Late in the window: the previous one has closed (lateness 0.5 s) and the worker has
        # committed telemetry offsets since (every 1 s), records of the open window among them
        # unless it holds them back until the window closes.
        _into_window(0.9)
        kill9(first)
        killed_ms = int(time.time() * 1000)
        second = start_worker(settings, tmp_path / "w2")
        procs.append(second)
        second.wait_for_log(WORKER_READY, 60)
        ready_ms = int(time.time() * 1000)

        def applied_after_restart() -> bool:
            return any(res["outcome"] == "applied" and res["issued_at_ms"] > ready_ms for res in results(settings, 0.5))

        wait_until(applied_after_restart, 40, f"a command issued after the restart applied\n{tails(second, executor)}")
        telemetry.stop()
        assert telemetry.error is None, telemetry.error
    report = ledger_settles(settings, 30)
    # No request lost from its window across the kill: a window the dead worker had open is
    # counted in full by its successor (telemetry is committed only once its windows closed);
    # a window published twice (at least once) counts with its fullest copy.
    counted: dict[int, int] = {}
    for w in records(settings, "metrics", 0.5):
        if w["scope"] == "zone" and w["model"] == MODEL:
            counted[w["window_start_ms"]] = max(w["count"], counted.get(w["window_start_ms"], 0))
    short = {start: (n, counted.get(start)) for start, n in telemetry.requests.items() if counted.get(start) != n}
    kill_window = killed_ms - killed_ms % 1000
    assert not short, (f"windows short of requests (sent, counted); killed in {kill_window}", short, second.tail(40))
    _assert_ledger_clean(report, second, executor)
    commands = records(settings, "commands", 0.5)
    assert any(c["issued_at_ms"] < killed_ms for c in commands), "no command before the kill"
    assert any(c["issued_at_ms"] > ready_ms for c in commands), "no command after the restart"
    assert executor.alive()
    assert "Traceback" not in second.log_text(), second.tail(60)
    r.close()


def test_executor_killed_between_apply_and_marker_takes_effect_once(
    settings: Settings, tmp_path: Path, procs: list[Any]
) -> None:
    """The webhook backend POSTs a command; the fleet API has it (the receiver recorded the
    body) but holds its answer, and the executor is SIGKILLed right then: applied, no marker,
    no result, no XACK -- the entry stays in the dead consumer's pending list.  A second
    executor of the zone claims it (XAUTOCLAIM once it has been idle ``retry_idle_ms``) and
    POSTs it again.

    So the fleet API sees the same command twice, byte for byte, with the same
    ``command_id``: a webhook receiver must treat ``command_id`` as its dedupe key (commands
    are absolute targets, so a receiver that does not dedupe re-applies the same target,
    which is harmless).  In governor's own record the command took effect once: exactly one
    ``applied`` result, the applied marker set, nothing pending, nothing lost.
    """
    settings = settings.replace(zones=(ZONE,))
    asyncio.run(ensure_topics(settings))
    r = redis.Redis.from_url(str(settings.redis_url))
    stream = names.command_stream(settings.topic_prefix, ZONE)
    with Receiver(hang_s=15.0) as fleet:
        dead = start_webhook_executor(settings, ZONE, tmp_path, fleet.url, "executor-1")
        procs.append(dead)
        dead.wait_for_log(EXECUTOR_READY, 30)
        cmd = _scale(9)
        _issue(r, settings, cmd)
        assert fleet.arrived.wait(20), tails(dead)
        kill9(dead)  # between the backend's apply and the marker / result / XACK
        pending = r.xpending_range(stream, GROUP, min="-", max="+", count=10)
        assert len(pending) == 1 and str(pending[0]["consumer"]).startswith(f"b'{ZONE}-"), pending
        assert not r.exists(names.applied_marker(settings.topic_prefix, ZONE, cmd.command_id))
        assert _applied(settings, cmd.command_id) == []

        heir = start_webhook_executor(settings, ZONE, tmp_path, fleet.url, "executor-2")
        procs.append(heir)
        heir.wait_for_log(EXECUTOR_READY, 30)
        wait_until(lambda: len(fleet.bodies) >= 2, 30, f"the claimed entry POSTed again\n{tails(heir)}")
        wait_until(lambda: bool(_applied(settings, cmd.command_id)), 20, f"an applied result\n{tails(heir)}")
        posted = fleet.commands()
        assert [p["command_id"] for p in posted] == [cmd.command_id, cmd.command_id], posted
        assert fleet.bodies[0] == fleet.bodies[1]  # the same signed command: the receiver's dedupe key holds
        assert posted[0]["target_replicas"] == 9
    led = ledger(settings)
    report = led.report()
    _assert_ledger_clean(report, heir)
    outcomes = led.entries[(ZONE, cmd.command_id)].outcomes
    assert outcomes == [("applied", "")], outcomes  # took effect once in governor's record
    assert report["issued"] == 1 and report["outcomes"] == {"applied": 1}, report
    applied = _applied(settings, cmd.command_id)
    assert applied[0]["detail"]["status"] == 200
    assert r.exists(names.applied_marker(settings.topic_prefix, ZONE, cmd.command_id))
    assert r.xpending(stream, GROUP)["pending"] == 0
    assert heir.alive()
    r.close()


def _outage(outage: str, settings: Settings, tmp_path: Path, procs: list[Any]) -> dict[str, Any]:
    """Worker and executor on a private Redis (AOF, fsync always); violating telemetry until a
    scale-up is applied; then Redis goes away for 6 s (``kill``: SIGKILL and restart on the
    same port with its data; ``freeze``: SIGSTOP, SIGCONT); telemetry goes on 3 s more."""
    server = RedisServer(tmp_path, persist=True)
    server.start()
    procs.append(server)
    settings = _loop_settings(settings, redis_url=Secret(server.url))
    asyncio.run(ensure_topics(settings))
    r = redis.Redis.from_url(server.url)
    r.hset(names.desired_replicas(settings.topic_prefix, ZONE), MODEL, 2)
    worker = start_worker(settings, tmp_path)
    procs.append(worker)
    executor = start_executor(settings, ZONE, tmp_path)
    procs.append(executor)
    worker.wait_for_log(WORKER_READY, 60)
    executor.wait_for_log(EXECUTOR_READY, 30)
    with Telemetry(settings, ZONE, MODEL) as telemetry:
        wait_until(lambda: _desired(r, settings) > 2, 40, f"a scale-up applied before the outage\n{tails(worker)}")
        server.kill9() if outage == "kill" else server.freeze()
        down_ms = int(time.time() * 1000)
        time.sleep(6.0)
        up_ms = int(time.time() * 1000)
        server.restart(with_data=True) if outage == "kill" else server.thaw()
        time.sleep(3.0)
        telemetry.stop()
        assert telemetry.error is None, telemetry.error
    commands = records(settings, "commands", 0.5)
    during = [c["command_id"] for c in commands if down_ms <= c["issued_at_ms"] <= up_ms]
    return {
        "settings": settings,
        "redis": r,
        "worker": worker,
        "executor": executor,
        "down_ms": down_ms,
        "up_ms": up_ms,
        "during": during,
    }


def _bridged_after_outage(run: dict[str, Any]) -> None:
    """Every command decided during the outage is in the zone's stream; the ledger is clean."""
    settings, r, worker, executor = run["settings"], run["redis"], run["worker"], run["executor"]
    stream = names.command_stream(settings.topic_prefix, ZONE)
    during = run["during"]
    assert during, f"no command decided during the outage\n{tails(worker)}"

    def in_stream() -> set[str]:
        return {orjson.loads(f[b"cmd"])["command_id"] for _id, f in r.xrange(stream)}

    wait_until(lambda: set(during) <= in_stream(), 40, f"{during} bridged after the outage\n{tails(worker)}")
    report = ledger_settles(settings, 30)
    _assert_ledger_clean(report, worker, executor)
    assert worker.alive() and executor.alive()


def test_bridge_rides_out_a_redis_outage(settings: Settings, tmp_path: Path, procs: list[Any]) -> None:
    """The worker's Redis is SIGKILLed while violating telemetry flows and started again on
    the same port with its data 6 s later.  The control agent keeps deciding (Kafka is up);
    the bridge cannot XADD, retries with backoff and does not take the next command
    meanwhile, so Faust does not commit past it.  Every command decided during the outage
    reaches the zone's stream afterwards, and the executor (same Redis) gives each an
    outcome: nothing lost, nothing applied twice."""
    run = _outage("kill", settings, tmp_path, procs)
    worker = run["worker"]
    assert "redis unavailable writing" in worker.log_text(), f"the bridge never met the outage\n{worker.tail(40)}"
    _bridged_after_outage(run)
    run["redis"].close()


def test_a_frozen_redis_stalls_neither_windows_nor_decisions(
    settings: Settings, tmp_path: Path, procs: list[Any]
) -> None:
    """Redis SIGSTOPped for 6 s (connections hang, nothing refuses): windows are a Kafka-to-
    Kafka path and must keep closing about once a window, telemetry that flows is not
    'stale', the control agent keeps deciding, and the bridge delivers those decisions after
    SIGCONT."""
    run = _outage("freeze", settings, tmp_path, procs)
    settings, down_ms, up_ms = run["settings"], run["down_ms"], run["up_ms"]
    emitted = sorted(
        {
            w["emitted_ms"]
            for w in records(settings, "metrics", 0.5)
            if w["scope"] == "zone" and w["model"] == MODEL and down_ms <= w["emitted_ms"] <= up_ms
        }
    )
    points = [down_ms, *emitted, up_ms]
    gap = max(b - a for a, b in zip(points, points[1:], strict=False))
    stale = [e for e in records(settings, "events", 0.5) if e.get("kind") == "telemetry_stale"]
    found = {
        "longest gap between window closes (ms)": gap,
        "telemetry_stale events": len(stale),
        "commands decided while Redis hung": len(run["during"]),
    }
    print(found)
    assert gap <= 2_500 and not stale and run["during"], (found, tails(run["worker"]))
    _bridged_after_outage(run)
    run["redis"].close()


def _sigstop(child: ChildProcess) -> None:
    """Freeze ``child``; return once it is stopped and Redis has ended its blocking XREADGROUP
    (the executor blocks 200 ms: a read still blocked would get, and own, the next entry)."""
    os.kill(child.proc.pid, signal.SIGSTOP)
    stat = Path(f"/proc/{child.proc.pid}/stat")
    wait_until(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T", 5, "the executor stopped", 0.01)
    time.sleep(0.6)


def _sigcont(child: ChildProcess) -> None:
    os.kill(child.proc.pid, signal.SIGCONT)


def test_redis_restarted_without_data(settings: Settings, tmp_path: Path, procs: list[Any]) -> None:
    """The executor's Redis is SIGKILLed and started on the same port with nothing: no
    stream, no group, no markers.  The executor stays up, re-creates its group (NOGROUP,
    ``XGROUP CREATE ... MKSTREAM``), writes its heartbeat key again and applies a new command
    XADDed after the restart."""
    server = RedisServer(tmp_path, persist=False)
    server.start()
    procs.append(server)
    settings = settings.replace(zones=(ZONE,), redis_url=Secret(server.url), heartbeat_s=1.0)
    asyncio.run(ensure_topics(settings))
    r = redis.Redis.from_url(server.url)
    executor = start_executor(settings, ZONE, tmp_path)
    procs.append(executor)
    executor.wait_for_log(EXECUTOR_READY, 30)
    before = _scale(5)
    _issue(r, settings, before)
    wait_until(lambda: _desired(r, settings) == 5, 20, f"the first command applied\n{tails(executor)}")

    server.kill9()
    server.restart(with_data=False)
    stream = names.command_stream(settings.topic_prefix, ZONE)
    assert _desired(r, settings) == 0 and not r.exists(names.desired_replicas(settings.topic_prefix, ZONE))
    after = _scale(7)
    _issue(r, settings, after)
    wait_until(lambda: _desired(r, settings) == 7, 30, f"the new command applied\n{tails(executor)}")
    assert executor.alive()
    assert "NOGROUP" in executor.log_text(), executor.tail(40)  # met, and the group re-created
    beat = names.executor_heartbeat(settings.topic_prefix, ZONE)
    wait_until(lambda: bool(r.exists(beat)), 10, f"the heartbeat key written again\n{tails(executor)}")
    assert any(g["name"] == GROUP.encode() for g in r.xinfo_groups(stream))
    led = ledger(settings)
    _assert_ledger_clean(led.report(), executor)
    for c in (before, after):
        assert led.entries[(ZONE, c.command_id)].outcomes == [("applied", "")], led.report()
    r.close()


def test_redis_restarted_with_data(settings: Settings, tmp_path: Path, procs: list[Any]) -> None:
    """The executor's Redis (AOF, fsync always) is SIGKILLed with two entries not yet done:
    one XADDed while the executor was frozen (SIGSTOP, never delivered) and one delivered to
    a consumer that died (in the group's pending list).  Redis comes back on the same port
    with its data; the executor (thawed) stays up, takes the undelivered entry, claims the
    dead consumer's after its idle time, applies each once, and applies a new command XADDed
    after the restart.  The command applied before the restart is not applied again."""
    server = RedisServer(tmp_path, persist=True)
    server.start()
    procs.append(server)
    settings = with_models(settings.replace(zones=(ZONE,), redis_url=Secret(server.url)), OTHER)
    asyncio.run(ensure_topics(settings))
    r = redis.Redis.from_url(server.url)
    stream = names.command_stream(settings.topic_prefix, ZONE)
    executor = start_executor(settings, ZONE, tmp_path)
    procs.append(executor)
    executor.wait_for_log(EXECUTOR_READY, 30)
    before = _scale(5)
    _issue(r, settings, before)
    wait_until(lambda: _desired(r, settings) == 5, 20, f"the first command applied\n{tails(executor)}")

    _sigstop(executor)
    try:
        orphan = _scale(3, model=OTHER)  # delivered to a consumer that then died: pending
        _issue(r, settings, orphan)
        claimed = cast("list[Any]", r.xreadgroup(GROUP, f"{ZONE}-dead-peer", {stream: ">"}, count=1))
        assert claimed and len(claimed[0][1]) == 1, claimed
        undelivered = _scale(6)
        _issue(r, settings, undelivered)
        server.kill9()
        server.restart(with_data=True)
        assert r.xlen(stream) == 3, r.xrange(stream)
        assert r.xpending(stream, GROUP)["pending"] == 1
    finally:
        _sigcont(executor)
    wait_until(lambda: _desired(r, settings) == 6, 30, f"the undelivered entry applied\n{tails(executor)}")
    wait_until(lambda: _desired(r, settings, OTHER) == 3, 30, f"the dead peer's entry claimed\n{tails(executor)}")
    after = _scale(8)
    _issue(r, settings, after)
    wait_until(lambda: _desired(r, settings) == 8, 30, f"the new command applied\n{tails(executor)}")
    assert r.xpending(stream, GROUP)["pending"] == 0
    assert executor.alive()
    led = ledger(settings)
    _assert_ledger_clean(led.report(), executor)
    for c in (before, orphan, undelivered, after):
        assert led.entries[(ZONE, c.command_id)].outcomes == [("applied", "")], led.report()
    r.close()
