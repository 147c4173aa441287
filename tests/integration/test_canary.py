"""Canary rollout against the real Redis: CLI state round trip, the worker's driver, the backend."""

from __future__ import annotations

import time

import orjson
import pytest
import redis.asyncio as aioredis

from controllers.canary import CanaryParams
from controllers.window_record import WindowRecord, decode_window
from core import names
from core.settings import Settings
from executors.backends import RoutingBackend
from governor import canary_cli
from governor.cli import main
from loop.commands import Command
from loop.control_loop import ControlLoop
from loop.effects import Rollout, SwapWrite
from streams.canary_store import CanaryStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MODEL = "llama2-70b"


def _raw(model: str, zone: str, start_ms: int, count: int, error_rate: float, p99: float | None = 200.0) -> dict:
    return {
        "kind": "window",
        "scope": "zone",
        "model": model,
        "zone": zone,
        "window_start_ms": start_ms,
        "window_end_ms": start_ms + 10_000,
        "count": count,
        "error_rate": error_rate,
        "ttft_p99_ms": p99,
    }


def _window(
    model: str, zone: str, start_ms: int, count: int, error_rate: float, p99: float | None = 200.0
) -> WindowRecord:
    return decode_window(_raw(model, zone, start_ms, count, error_rate, p99))


def test_start_status_abort_round_trip(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    p = CanaryParams(hold_s=60.0)
    rollout = canary_cli.start(settings, MODEL, "v2", p, now_s=100.0)
    st = canary_cli.status(settings, MODEL)
    assert st["state"] == rollout["state"] and st["state"]["name"] == "running"
    assert st["share"] == pytest.approx(0.01) and st["canary"] == f"{MODEL}@v2"
    assert "(1%)" in canary_cli.format_status(st)
    with pytest.raises(canary_cli.CanaryCliError, match="running"):
        canary_cli.start(settings, MODEL, "v3", p, now_s=101.0)
    out = canary_cli.abort(settings, MODEL, "bad outputs")
    assert out["state"]["name"] == "aborted" and "bad outputs" in out["state"]["reason"]
    assert canary_cli.status(settings, MODEL)["share"] == 0.0
    canary_cli.start(settings, MODEL, "v3", p, now_s=102.0)  # allowed once the old one ended
    assert canary_cli.status(settings, MODEL)["version"] == "v3"


def test_cli_commands_use_the_environment(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    assert main(["canary", "start", "--model", MODEL, "--version", "v2", "--stages", "0.05,1"]) == 0
    assert main(["canary", "status", "--model", MODEL]) == 0
    assert "stage      1/2 (5%)" in capsys.readouterr().out
    assert main(["canary", "abort", "--model", MODEL, "--reason", "ops"]) == 0
    assert main(["canary", "status", "--model", MODEL, "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out.splitlines()[-1])["state"]["name"] == "aborted"
    assert main(["canary", "start", "--model", MODEL, "--version", "v2", "--stages", "0.5,0.1"]) == 2
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert main(["canary", "status", "--model", MODEL]) == 2  # unreachable: exit 2, one line naming the setting
    err = capsys.readouterr().err
    assert "cannot reach Redis at 127.0.0.1:1 (REDIS_URL)" in err and "Traceback" not in err


class _Shell:
    """The worker shell's canary path: read the rollout, observe it, decide, swap, publish what it guards."""

    def __init__(self, settings: Settings, redis: aioredis.Redis) -> None:
        self.store, self.loop = CanaryStore(settings, redis), ControlLoop(settings)

    async def read(self, w: WindowRecord) -> None:
        if w.scope == "zone":
            self.loop.observe(Rollout(w.model, await self.store.read(w.model)))

    async def decide(self, w: WindowRecord, now: int) -> list[Command]:
        cmds: list[Command] = []
        for write in self.loop.decide(w, now).writes:
            assert isinstance(write, SwapWrite)
            if await self.store.swap(write):
                cmds += [c for c, _what in write.then]
        return cmds

    async def on_window(self, w: WindowRecord, now: int) -> list[Command]:
        await self.read(w)
        return await self.decide(w, now)


async def test_driver_rolls_back_a_bad_canary_and_publishes_share_zero(settings: Settings) -> None:
    canary_cli.start(settings, MODEL, "v2", CanaryParams(hold_s=60.0), now_s=0.0)
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    try:
        driver = _Shell(settings, redis)
        now = int(time.time() * 1000)
        # The first window after start publishes the 1 % share to every zone.
        cmds = await driver.on_window(_window(MODEL, "az-a", 0, 990, 0.0), now)
        assert sorted(c.zone for c in cmds) == sorted(settings.zones)
        assert {c.kind for c in cmds} == {"canary"} and cmds[0].basis_ms == 10_000
        assert cmds[0].payload == {"model": MODEL, "version": "v2", "share": 0.01}
        assert await driver.on_window(_window(f"{MODEL}@v2", "az-a", 0, 10, 0.0), now) == []
        # A node window and an unrelated model are ignored.
        node = decode_window({**_raw(MODEL, "az-a", 10_000, 1, 0.0), "scope": "node", "node": "az-a/n1"})
        assert await driver.on_window(node, now) == []
        assert await driver.on_window(_window("bloom-176b", "az-a", 10_000, 5, 0.0), now) == []
        # Bad canary: 5 % errors on 100 requests -> rolled back, share 0 published.
        assert await driver.on_window(_window(f"{MODEL}@v2", "az-a", 10_000, 100, 0.05), now) == []
        cmds = await driver.on_window(_window(MODEL, "az-a", 10_000, 9900, 0.0), now)
        assert [c.payload["share"] for c in cmds] == [0.0] * len(settings.zones)
        assert cmds[0].basis_ms == 20_000 and "rolled back" in cmds[0].reason
        st = canary_cli.status(settings, MODEL)
        assert st["state"]["name"] == "rolled_back" and st["published_share"] == 0.0
        # Nothing more to publish afterwards.
        assert await driver.on_window(_window(MODEL, "az-a", 20_000, 9900, 0.0), now) == []
        # The executor's backend writes the share into the routing hash.
        out = await RoutingBackend(redis, settings.topic_prefix).apply(cmds[0])
        assert out == {"model": MODEL, "version": "v2", "share": 0.0}
        raw = await redis.hget(names.routing_hash(settings.topic_prefix, cmds[0].zone), f"_canary|{MODEL}")
        assert orjson.loads(raw)["share"] == 0.0
    finally:
        await redis.aclose()


async def test_abort_publishes_share_zero_on_the_next_window(settings: Settings) -> None:
    # Aborted between the read of a window's rollout and the write of its step: the swap refuses
    # the step (its commands are not published), the abort stands, the next window publishes share 0.
    canary_cli.start(settings, MODEL, "v2", CanaryParams(hold_s=60.0), now_s=0.0)
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    try:
        shell = _Shell(settings, redis)
        now = int(time.time() * 1000)
        assert len(await shell.on_window(_window(MODEL, "az-a", 0, 990, 0.0), now)) == 2  # the 1 % share
        assert await shell.on_window(_window(f"{MODEL}@v2", "az-a", 0, 10, 0.0), now) == []
        w = _window(MODEL, "az-a", 10_000, 990, 0.0)
        await shell.read(w)
        canary_cli.abort(settings, MODEL, "ops")
        assert await shell.decide(w, now) == []  # computed from the running rollout: refused
        assert canary_cli.status(settings, MODEL)["state"]["name"] == "aborted"
        cmds = await shell.on_window(_window(MODEL, "az-a", 20_000, 990, 0.0), now)
        assert [c.payload["share"] for c in cmds] == [0.0] * len(settings.zones)
    finally:
        await redis.aclose()
