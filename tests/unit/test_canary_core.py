"""The canary driver's steps on a rollout held in memory decides as the Redis driver does
(tests/integration/test_canary.py runs the same windows against the real Redis)."""

from __future__ import annotations

from typing import Any

from controllers.canary import CanaryParams
from controllers.window_record import WindowRecord, decode_window
from core.settings import Settings
from loop.canary_driver import CanaryDriver, new_rollout
from loop.commands import Command

MODEL = "llama2-70b"
ZONES = ("az-a", "az-b")


def _window(model: str, zone: str, start_ms: int, count: int, error_rate: float) -> WindowRecord:
    return decode_window(
        {
            "scope": "zone",
            "model": model,
            "zone": zone,
            "window_start_ms": start_ms,
            "window_end_ms": start_ms + 10_000,
            "count": count,
            "error_rate": error_rate,
            "ttft_p99_ms": 200.0,
        }
    )


def _on_window(
    core: CanaryDriver, r: dict[str, Any], w: WindowRecord, now_ms: int
) -> tuple[dict[str, Any], list[Command]]:
    """One step on a rollout held in memory: the rollout after it (unchanged when None) and its commands."""
    step = core.step(r, w, now_ms)
    return (r if step.rollout is None else step.rollout), step.commands


def test_core_rolls_back_a_bad_canary_and_publishes_share_zero() -> None:
    core = CanaryDriver(Settings(zones=ZONES))
    r = new_rollout(MODEL, "v2", CanaryParams(hold_s=60.0), 0.0)
    r, cmds = _on_window(core, r, _window(MODEL, "az-a", 0, 990, 0.0), 1)
    assert [(c.zone, c.payload["share"], c.basis_ms) for c in cmds] == [(z, 0.01, 10_000) for z in ZONES]
    r, cmds = _on_window(core, r, _window(f"{MODEL}@v2", "az-a", 0, 10, 0.0), 1)
    assert cmds == [] and r["published_share"] == 0.01
    unchanged = dict(r)
    assert _on_window(core, r, _window(f"{MODEL}@v3", "az-a", 10_000, 5, 0.0), 1) == (unchanged, [])  # not this one
    r, cmds = _on_window(core, r, _window(f"{MODEL}@v2", "az-a", 10_000, 100, 0.05), 1)
    assert cmds == []
    r, cmds = _on_window(core, r, _window(MODEL, "az-a", 10_000, 9900, 0.0), 1)
    assert [c.payload["share"] for c in cmds] == [0.0, 0.0]
    assert cmds[0].basis_ms == 20_000 and "rolled back" in cmds[0].reason
    assert r["state"]["name"] == "rolled_back" and r["published_basis_ms"] == 20_000
    assert _on_window(core, r, _window(MODEL, "az-a", 20_000, 9900, 0.0), 1)[1] == []


def test_advance_never_changes_the_rollout_it_is_given() -> None:
    core = CanaryDriver(Settings(zones=ZONES))
    r = new_rollout(MODEL, "v2", CanaryParams(), 0.0)
    before = {**r, "state": dict(r["state"])}
    step = core.advance(r, None, 10_000, 1)
    assert r == before and step.rollout is not None and step.rollout["published_share"] == 0.01
    assert core.advance(step.rollout, None, 20_000, 1).rollout is None  # nothing new: nothing to store
