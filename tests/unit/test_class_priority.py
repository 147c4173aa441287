"""Engine priorities per request class (issue 36 item 5): a model's ``classes.<class>.priority`` in the
config, checked against vLLM's range; the load generator puts it on the wire (a real local HTTP server
reads the request bodies, through ``governor load`` as a user runs it); the engine pool starts a
model's engines with ``--scheduling-policy priority`` when its classes configure one.  The effect on
real engines: ``governor bench priority`` (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bench.load import load_classes
from core.settings import DEFAULT_PRIORITY, ClassSlo, ModelSpec, Settings, SettingsError
from engines.loadgen import LoadError, RequestSpec, prompt_ids, replay
from engines.pool import EnginePool, EngineSpec, EngineSpecError
from engines.router import RouterClient
from executors.local import pool_from_settings
from tests.unit.test_loadgen import Handler, _stream, serve  # noqa: F401 (serve: the fixture)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
MODELS: list[dict[str, Any]] = [
    {"name": "m", "classes": {"trading": {"priority": -1}, "batch": {"ttft_slo_ms": 5000.0, "priority": 10}}}
]


# --- the config ----------------------------------------------------------------------------------


def test_class_priorities_come_from_the_environment_and_the_config_file(tmp_path: Path) -> None:
    from_env = Settings.from_env({"GOVERNOR_MODELS": json.dumps(MODELS)}).models[0]
    cfg = tmp_path / "governor.yaml"
    cfg.write_text(
        "models:\n  - name: m\n    classes:\n      trading: {priority: -1}\n"
        "      batch: {ttft_slo_ms: 5000, priority: 10}\n"
    )
    from_file = Settings.load({}, str(cfg))[0].models[0]
    for m in (from_env, from_file):
        assert m.classes == {"trading": ClassSlo(priority=-1), "batch": ClassSlo(ttft_slo_ms=5000.0, priority=10)}
        assert (m.priority("trading"), m.priority("batch")) == (-1, 10) and m.schedules_by_priority
        # a class without one, a class the model does not name, no class: vLLM's default
        assert m.priority("voice") == m.priority("gold") == m.priority(None) == DEFAULT_PRIORITY == 0
        assert m.slo("batch") == (5000.0, m.itl_slo_ms)  # the SLO override beside it still holds
    assert ModelSpec(**from_env.to_dict()) == from_env  # GOVERNOR_MODELS round-trips it
    assert Settings.from_env(Settings(models=(from_env,)).to_env()).models[0].classes == from_env.classes
    # a model whose classes set SLOs only schedules first come first served
    assert not ModelSpec("m", classes={"trading": ClassSlo(ttft_slo_ms=300.0)}).schedules_by_priority


@pytest.mark.parametrize("value", [-(2**63), 2**63 - 1, 0])
def test_vllms_whole_range_is_accepted(value: int) -> None:
    assert ModelSpec("m", classes={"voice": ClassSlo(priority=value)}).priority("voice") == value


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 1.5, True, "3"])
def test_a_priority_outside_vllms_range_or_not_an_integer_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(SettingsError, match=r"^priority must be an integer in \[-2\*\*63, 2\*\*63 - 1\]"):
        ClassSlo(priority=value)
    with pytest.raises(SettingsError, match="model m: class voice: priority must be an integer"):
        Settings.from_env({"GOVERNOR_MODELS": json.dumps([{"name": "m", "classes": {"voice": {"priority": value}}}])})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1.5", "models[0].classes.trading.priority: must be an integer or null (got 1.5)"),
        ("'x'", "models[0].classes.trading.priority: must be an integer or null (got 'x')"),
        (str(2**63), f"models[0].classes.trading.priority: must be <= {2**63 - 1} (got {2**63})"),
    ],
)
def test_the_config_file_names_a_bad_priority_by_its_path(tmp_path: Path, value: str, message: str) -> None:
    cfg = tmp_path / "governor.yaml"
    cfg.write_text(f"models:\n  - name: m\n    classes: {{trading: {{priority: {value}}}}}\n")
    with pytest.raises(SettingsError) as info:
        Settings.load({}, str(cfg))
    assert str(info.value) == f"{cfg}: {message}"


# --- on the wire ---------------------------------------------------------------------------------


@pytest.fixture
async def engine_stub(serve: Callable[[Handler], Awaitable[str]]) -> tuple[str, list[dict[str, Any]]]:  # noqa: F811
    """A real HTTP server that streams ``/v1/completions`` as vLLM does and keeps every request body."""
    bodies: list[dict[str, Any]] = []

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        return await _stream(request, body["max_tokens"])

    return await serve(complete), bodies


async def test_each_request_carries_its_class_priority_and_none_without_one(
    engine_stub: tuple[str, list[dict[str, Any]]],
) -> None:
    url, bodies = engine_stub
    specs = [RequestSpec(0.0, 4, 2, "trading", -1), RequestSpec(0.0, 4, 2, "batch", 10), RequestSpec(0.0, 4, 2)]
    result = await replay(url, "m", specs, concurrency=1)
    assert [r.status for r in result.results] == ["ok"] * 3
    by_prompt = {tuple(b["prompt"]): b for b in bodies}
    assert [by_prompt[tuple(prompt_ids(i, 4))].get("priority", "absent") for i in range(3)] == [-1, 10, "absent"]


async def _governor_load(url: str, env: dict[str, str]) -> tuple[int, str]:
    argv = ["-m", "governor.cli", "load", "--url", url, "--model", "m", "--classes", "trading,voice,batch"]
    argv += ["--qps", "10", "--duration-s", "10", "--speed", "10", "--max-prompt-tokens", "8"]
    argv += ["--max-output-tokens", "2"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode()


async def test_governor_load_sends_the_configs_priorities_per_class(
    engine_stub: tuple[str, list[dict[str, Any]]],
) -> None:
    """The load generator as a user runs it: the priorities are the config's for the model it names,
    voice (no priority configured) gets the default 0, and a model without priorities sends none."""
    url, bodies = engine_stub
    base = {k: v for k, v in os.environ.items() if not k.startswith("GOVERNOR_")}
    code, text = await _governor_load(url, {**base, "GOVERNOR_MODELS": json.dumps(MODELS)})
    assert code == 0, text
    classes = {c.name: c.priority for c in load_classes("trading,voice,batch", ModelSpec(**MODELS[0]))}
    assert classes == {"trading": -1, "voice": 0, "batch": 10}
    assert len(bodies) >= 10 and {b["priority"] for b in bodies} == {-1, 0, 10}, [b.get("priority") for b in bodies]
    n = len(bodies)
    code, text = await _governor_load(url, {**base, "GOVERNOR_MODELS": json.dumps([{"name": "m"}])})
    assert code == 0, text
    assert len(bodies) > n and all("priority" not in b for b in bodies[n:])


def test_an_unknown_class_on_the_command_line_is_named() -> None:
    with pytest.raises(LoadError, match="--classes: unknown class 'gold'"):
        load_classes("trading,gold", ModelSpec(**MODELS[0]))


# --- the engines ---------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _argv_of_started_engine(tmp_path: Path, spec: EngineSpec) -> list[str]:
    """Start one engine of ``spec`` with a stand-in python that records its argv; the argv."""
    dump = tmp_path / "argv"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {dump}.tmp && mv {dump}.tmp {dump}\nexec sleep 60\n')
    fake.chmod(0o755)
    router = RouterClient(f"http://127.0.0.1:{_closed_port()}", timeout_s=1, attempts=1, backoff_s=0.01)
    pool = EnginePool(dataclasses.replace(spec, python=str(fake)), router, tmp_path / "pool")
    engine = pool._start()
    try:
        deadline = time.monotonic() + 10
        while not dump.exists():
            assert time.monotonic() < deadline, "the stand-in engine never ran"
            time.sleep(0.05)
        return dump.read_text().splitlines()
    finally:
        os.killpg(engine.pid, 9)
        assert engine.proc is not None
        engine.proc.wait(5)


@pytest.mark.parametrize(("models", "policy"), [(MODELS, "priority"), ([{"name": "m"}], "fcfs")])
def test_the_local_backend_starts_engines_with_priority_scheduling_when_classes_set_priorities(
    tmp_path: Path, models: list[dict[str, Any]], policy: str
) -> None:
    settings = Settings.from_env(
        {
            "GOVERNOR_MODELS": json.dumps(models),
            "GOVERNOR_ENGINE_PYTHON": sys.executable,
            "GOVERNOR_LOCAL_MODEL_DIR": str(tmp_path),
            "GOVERNOR_DATA_DIR": str(tmp_path / "data"),
        }
    )
    spec = pool_from_settings(settings, "z").spec
    assert spec.scheduling_policy == policy
    argv = _argv_of_started_engine(tmp_path, spec)
    if policy == "priority":
        assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    else:  # vLLM's default, no flag: the engine as it was started before priorities existed
        assert "--scheduling-policy" not in argv


def test_an_unknown_scheduling_policy_is_refused() -> None:
    with pytest.raises(EngineSpecError, match="scheduling_policy must be one of"):
        EngineSpec(python="p", model_dir="d", served_name="m", model="m", zone="z", scheduling_policy="lifo")
