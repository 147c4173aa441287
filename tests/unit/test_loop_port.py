"""The loop's one port and its effects (issue 32, item 1): what lives in Redis comes in as input
events (:meth:`ControlLoop.observe`), each decision goes out as one :class:`Effects` value."""

from __future__ import annotations

from typing import Any

import orjson

from controllers.canary import CanaryParams
from controllers.window_record import WindowRecord, decode_window
from core import names
from core.budget import Allowance
from core.settings import ModelSpec, Settings
from loop.canary_driver import new_rollout
from loop.control_loop import ControlLoop
from loop.effects import (
    AdmissionEntries,
    Allowances,
    Effects,
    HashWrite,
    Heartbeats,
    PlatformReplicas,
    Rollout,
    SwapWrite,
    Tick,
)
from tests.unit.test_admission import _many
from tests.unit.test_scaler_driver import BRISK

MODEL = "m"

SETTINGS = Settings(
    models=(ModelSpec(MODEL, max_replicas=20), ModelSpec(f"{MODEL}@v2")), zones=("az-a", "az-b"), pid_gains=BRISK
)


def _zone(k: int, model: str = MODEL, count: int = 100, **kw: Any) -> WindowRecord:
    return decode_window(
        {"scope": "zone", "model": model, "zone": "az-a", "window_start_ms": k * 10_000,
         "window_end_ms": (k + 1) * 10_000, "window_s": 10.0, "count": count, "violation_rate": 0.5,
         "replicas_ready": 2, "e2e_p99_ms": 100.0, "ttft_p95_ms": 300.0, **kw}
    )  # fmt: skip


def test_decide_returns_one_effects_value_with_the_status_row() -> None:
    loop = ControlLoop(SETTINGS)
    fx = loop.decide(_zone(0), 10_000)
    assert isinstance(fx, Effects) and [c.kind for c in fx.commands] == ["scale"]
    (row,) = fx.status
    assert row.field == f"{MODEL}|az-a"
    assert row.record["target"] == fx.commands[0].target_replicas and row.record["written_ms"] == 10_000
    assert row.record["replicas_ready"] == 2 and row.record["zone_status"] == "up"
    # A held window (no requests) still writes its row: governor status shows it stale.
    held = loop.decide(_zone(1, count=0), 20_000)
    assert held.commands == [] and [r.field for r in held.status] == [f"{MODEL}|az-a"]
    assert loop.decide(decode_window({**_zone(2).to_dict(), "scope": "node", "node": "n1"}), 1).status == []


def test_heartbeats_allowances_and_platform_replicas_enter_through_observe() -> None:
    loop = ControlLoop(SETTINGS)
    assert loop.observe(Heartbeats(["az-a"])) == Effects()
    assert loop.scaler.alive == frozenset({"az-a"})
    loop.observe(Heartbeats(None))
    assert loop.scaler.alive is None
    loop.observe(Allowances({"az-a": Allowance(total=3, models={}).encode(), "az-b": b"junk"}))
    assert set(loop.scaler.allowances) == {"az-a"}
    reading = orjson.dumps({"ready": 7, "starting": 1, "at_ms": 10_000})
    assert loop.observe(PlatformReplicas("az-a", {MODEL.encode(): reading, b"other": reading})) == Effects()
    w = loop.platform.apply(_zone(0))
    assert (w.replicas_ready, w.replicas_starting) == (7, 1)
    # The decision sees the platform's counts; the status row shows the window as it came.
    fx = loop.decide(_zone(0), 10_000)
    assert fx.commands[0].previous_replicas == 8 and fx.status[0].record["replicas_ready"] == 2


def test_the_clock_turns_silent_keys_stale() -> None:
    loop = ControlLoop(SETTINGS)
    loop.decide(_zone(0), 10_000)
    fx = loop.observe(Tick(10 * 60_000))
    assert any(ev["kind"] == "telemetry_stale" for ev in fx.events), fx.events


def test_an_admission_review_is_a_write_guarded_by_what_it_read() -> None:
    loop = ControlLoop(SETTINGS)
    loop.decide(_zone(0), 10_000)  # the model's latency
    reg = _many(4, 1)
    fx = loop.observe(AdmissionEntries(reg, 10_000, loop.admission.latencies()))
    (write,) = fx.writes
    assert isinstance(write, HashWrite) and write.key == names.admission(SETTINGS.topic_prefix)
    assert write.reviewed == reg and {orjson.loads(v)["state"] for v in write.fields.values()} == {"admitted"}
    assert len(fx.events) == 4


def test_a_rollout_step_is_a_swap_that_guards_its_commands() -> None:
    loop = ControlLoop(SETTINGS)
    raw = orjson.dumps(new_rollout(MODEL, "v2", CanaryParams(hold_s=60.0), 0.0))
    assert loop.decide(_zone(0), 10_000).writes == []  # no rollout observed: no canary step
    loop.observe(Rollout(MODEL, raw))
    fx = loop.decide(_zone(1), 20_000)
    (write,) = fx.writes
    assert isinstance(write, SwapWrite) and write.expect == raw
    assert write.key == names.canary_state(SETTINGS.topic_prefix, MODEL)
    assert {c.kind for c, _ in write.then} == {"canary"} and len(write.then) == len(SETTINGS.zones)
    assert all(c.kind != "canary" for c in fx.commands)  # published only once the swap holds
    assert orjson.loads(write.value)["published_share"] == 0.01
