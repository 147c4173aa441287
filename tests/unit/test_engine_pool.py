"""The engine pool's bookkeeping without engines: what a registry may make it do, and an unreachable router.

Stand-in processes (``sleep`` in a session of their own) play the engines
and the bystanders; the real engines are in tests/integration/test_local_engines.py.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from engines.pool import ID_VAR, POOL_VAR, Engine, EnginePool, EngineSpec, EngineSpecError, pool_processes
from engines.router import RouterClient, RouterUnavailable
from executors.errors import BackendRejected, BackendUnavailable
from executors.local import LocalBackend
from loop.commands import Command

pytestmark = pytest.mark.timeout(60)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens there


def _pool(state_dir: Path, **kw: object) -> EnginePool:
    spec = EngineSpec(
        python="/nonexistent/python", model_dir="/nonexistent/model", served_name="m", model="m", zone="z", grace_s=1
    )
    router = RouterClient(f"http://127.0.0.1:{_closed_port()}", timeout_s=1, attempts=2, backoff_s=0.01)
    return EnginePool(spec, router, state_dir, **kw)  # type: ignore[arg-type]


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Stand-in processes, each in a session of its own, killed at the end whatever the test did."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(5)


def _sleeper(procs: list[subprocess.Popen[bytes]], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "--port", "1"],
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    procs.append(p)
    return p


def _wait_env(pid: int, key: str) -> None:
    """Wait until /proc shows ``pid``'s environment (just after exec it may not be readable yet)."""
    for _ in range(100):
        try:
            if key.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                return
        except OSError:
            pass
        time.sleep(0.02)


@pytest.mark.parametrize(
    "registry",
    [
        b"{not json",  # corrupt
        b"[]",  # valid JSON, wrong shape
        b'{"version": 1, "target": 1e9, "engines": []}',  # a target no pool has
        None,  # a pid of another program, with a token it does not carry (filled in below)
    ],
)
async def test_a_corrupt_or_hostile_registry_never_kills_a_process_the_pool_did_not_start(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]], registry: bytes | None
) -> None:
    pool = _pool(tmp_path)
    bystander = _sleeper(spawned)  # not an engine: no pool variable
    other_pool = _sleeper(spawned, {POOL_VAR: "/elsewhere", ID_VAR: "t-other"})  # another pool's engine
    _wait_env(other_pool.pid, POOL_VAR)
    if registry is None:
        engines = [
            {"port": 1, "pid": p.pid, "pgid": p.pid, "token": tok, "state": "ready", "started_at": 0, "ready_at": 1}
            for p, tok in ((bystander, "t-bystander"), (other_pool, "t-other"))
        ]
        registry = orjson.dumps({"version": 1, "target": 2, "engines": engines})
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "engines.json").write_bytes(registry)
    assert await pool.adopt() == []
    time.sleep(0.2)
    assert bystander.poll() is None and other_pool.poll() is None  # both untouched
    assert pool.replicas() == {"desired": 0, "ready": 0, "starting": 0, "startup_s": None}
    assert orjson.loads((tmp_path / "engines.json").read_bytes())["engines"] == []  # the registry is rewritten true
    await pool.close(stop_engines=True)
    assert bystander.poll() is None and other_pool.poll() is None


async def test_adopt_stops_this_pools_processes_the_registry_does_not_hold(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    pool = _pool(tmp_path)
    tag = str(tmp_path.resolve())
    stray = _sleeper(spawned, {POOL_VAR: tag, ID_VAR: "t-stray"})  # an engine the registry lost
    dead_port = _sleeper(spawned, {POOL_VAR: tag, ID_VAR: "t-deaf"})  # registered, its port answers nothing
    bystander = _sleeper(spawned)
    for p in (stray, dead_port):
        _wait_env(p.pid, POOL_VAR)
    assert set(pool_processes(tag)) == {stray.pid, dead_port.pid}
    rec = {"port": 1, "pid": dead_port.pid, "pgid": dead_port.pid, "token": "t-deaf", "started_at": 0.0}
    (tmp_path / "engines.json").write_bytes(orjson.dumps({"version": 1, "target": 1, "engines": [rec]}))
    assert await pool.adopt() == []  # started long ago and deaf: not adopted
    assert stray.wait(10) is not None and dead_port.wait(10) is not None  # both stopped
    assert bystander.poll() is None
    assert pool_processes(tag) == {}
    await pool.close(stop_engines=True)


async def test_an_unreachable_router_fails_the_scale_with_its_reason_and_starts_nothing(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    with pytest.raises(RouterUnavailable, match=r"router http://127\.0\.0\.1:\d+: GET /list_workers failed after 2"):
        await pool.scale_to(2)
    assert pool.replicas()["desired"] == 0 and pool.engines() == []
    assert pool_processes(str(tmp_path.resolve())) == {}
    # Through the backend: temporary (the command is redelivered), with the router's reason.
    backend = LocalBackend(pool, start_replicas=0)
    cmd = Command(
        kind="scale", zone="z", model="m", target_replicas=1, reason="t", issued_at_ms=0, expires_at_ms=1, basis_ms=0
    )
    with pytest.raises(BackendUnavailable, match="ConnectionRefused|Cannot connect|failed after 2 attempts"):
        await backend.apply(cmd)
    with pytest.raises(BackendRejected, match="no local engines for model 'other'"):
        await backend.apply(dataclasses.replace(cmd, model="other"))
    await backend.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_num_seqs", 0),  # no batch
        ("cores", ()),  # nowhere to pin
        ("cores", (-1,)),
        ("drain_timeout_s", -1.0),
        ("served_name", ""),
    ],
)
def test_a_bad_engine_spec_names_its_parameter(field: str, value: object) -> None:
    base = {"python": "p", "model_dir": "d", "served_name": "m", "model": "m", "zone": "z"}
    with pytest.raises(EngineSpecError, match=field):
        EngineSpec(**{**base, field: value})  # type: ignore[arg-type]


async def test_the_backend_serves_the_sd_document_and_the_replica_truth_of_its_model_only(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    sd_port = _closed_port()
    backend = LocalBackend(pool, start_replicas=0, sd_port=sd_port)
    assert await backend.replicas("other", "z") is None and await backend.replicas("m", "elsewhere") is None
    assert await backend.replicas("m", "z") == {"desired": 0, "ready": 0, "starting": 0, "startup_s": None}
    # A registered engine (pid 1 stands in: it carries no pool variable, so closing the pool signals nothing).
    pool._engines[4321] = Engine(port=4321, pid=1, core=0, token="t", started_at=0.0, state="ready")
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{sd_port}/sd") as resp:
        assert resp.status == 200
        assert await resp.json() == [
            {"targets": ["127.0.0.1:4321"], "labels": {"zone": "z", "node": "127.0.0.1:4321", "model_name": "m"}}
        ]
    assert (await backend.replicas("m", "z"))["ready"] == 1  # type: ignore[index]
    await backend.close()


@pytest.mark.parametrize(
    ("live_cores", "expected"),
    [
        ((), 0),  # the first core
        ((0,), 1),  # the free one
        ((1,), 0),  # after a scale-down took the engine of core 0: core 0 again, not the "next" one
        ((0, 1), 0),  # all taken: the first of the least used
        ((0, 0, 1), 1),
    ],
)
def test_a_new_engine_goes_to_the_core_with_fewest_engines(
    tmp_path: Path, live_cores: tuple[int, ...], expected: int
) -> None:
    pool = _pool(tmp_path)
    for i, core in enumerate(live_cores):
        pool._engines[i] = Engine(port=i, pid=0, core=core, token=f"t{i}", started_at=0.0, state="ready")
    assert pool._pick_core() == expected


async def test_an_engine_that_stops_answering_health_is_taken_out_after_three_misses(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    pool = _pool(tmp_path)
    hung = _sleeper(spawned, {POOL_VAR: pool.tag, ID_VAR: "t-hung"})  # alive, but nothing answers its port
    _wait_env(hung.pid, POOL_VAR)
    e = Engine(port=_closed_port(), pid=hung.pid, core=0, token="t-hung", started_at=0.0, state="ready", served=True)
    pool._engines[e.port] = e
    pool.target = 1
    for misses in (1, 2):
        await pool.check()
        assert e.health_failures == misses and pool.deaths == 0 and hung.poll() is None
    await pool.check()  # the third miss: dead, its group stopped, counted; the replacement could not start here
    assert pool.deaths == 1 and hung.wait(10) is not None
    assert e.port not in pool._engines and pool_processes(pool.tag) == {}
    await pool.close(stop_engines=True)


def test_an_engine_started_with_an_otlp_endpoint_exports_over_http_promptly_naming_model_zone_and_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The argv and environment the pool gives an engine (a stand-in script records them): OTLP/HTTP,
    an export every OTLP_EXPORT_DELAY_MS (the SDK's 5 s made spans late for 2 s of lateness), and
    resource attributes that the OpenTelemetry SDK reads into what adapters.otlp.spans maps."""
    from opentelemetry.sdk.resources import Resource

    from adapters.otlp.spans import MapOptions, Span, map_span
    from engines.pool import OTLP_EXPORT_DELAY_MS

    dump = tmp_path / "seen"
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {dump}.argv\nenv > {dump}.tmp && mv {dump}.tmp {dump}.env\nexec sleep 60\n'
    )
    fake.chmod(0o755)
    monkeypatch.delenv("OTEL_BSP_SCHEDULE_DELAY", raising=False)
    endpoint = "http://127.0.0.1:4318/v1/traces"
    pool = _pool(tmp_path / "pool")
    pool.spec = dataclasses.replace(pool.spec, python=str(fake), model="llama", zone="az-b", otlp_endpoint=endpoint)
    engine = pool._start()
    try:
        deadline = time.monotonic() + 10
        while not Path(f"{dump}.env").exists():  # written whole (renamed into place)
            assert time.monotonic() < deadline, "the stand-in engine never ran"
            time.sleep(0.05)
        argv = Path(f"{dump}.argv").read_text().split("\n")
        env = dict(ln.split("=", 1) for ln in Path(f"{dump}.env").read_text().splitlines() if "=" in ln)
    finally:
        os.killpg(engine.pid, 9)
        assert engine.proc is not None
        engine.proc.wait(5)
    assert argv[argv.index("--otlp-traces-endpoint") + 1] == endpoint
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert env["OTEL_BSP_SCHEDULE_DELAY"] == str(OTLP_EXPORT_DELAY_MS)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", env["OTEL_RESOURCE_ATTRIBUTES"])
    resource = dict(Resource.create().attributes)  # as the engine's SDK reads its environment
    node = f"127.0.0.1:{engine.port}"
    assert {k: resource[k] for k in ("governor.model", "governor.zone", "governor.node")} == {
        "governor.model": "llama",
        "governor.zone": "az-b",
        "governor.node": node,
    }
    span = Span(
        name="llm_request",
        start_ns=10**18,
        end_ns=10**18 + 10**8,
        attributes={"gen_ai.latency.time_to_first_token": 0.01},
        resource=resource,
    )
    rec, why = map_span(span, MapOptions(zones=frozenset({"az-b"}), models=frozenset({"llama"})))
    assert why is None and rec is not None and (rec["model"], rec["zone"], rec["node"]) == ("llama", "az-b", node)


def test_an_engine_without_an_otlp_endpoint_gets_no_tracing_settings(tmp_path: Path) -> None:
    dump = tmp_path / "seen"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {dump}.argv\nexec sleep 60\n')
    fake.chmod(0o755)
    pool = _pool(tmp_path / "pool")
    pool.spec = dataclasses.replace(pool.spec, python=str(fake))
    engine = pool._start()
    try:
        deadline = time.monotonic() + 10
        while not Path(f"{dump}.argv").exists() or "--port" not in Path(f"{dump}.argv").read_text():
            assert time.monotonic() < deadline, "the stand-in engine never ran"
            time.sleep(0.05)
        environ = Path(f"/proc/{engine.pid}/environ").read_bytes()
    finally:
        os.killpg(engine.pid, 9)
        assert engine.proc is not None
        engine.proc.wait(5)
    assert "--otlp-traces-endpoint" not in Path(f"{dump}.argv").read_text()
    assert b"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in environ
