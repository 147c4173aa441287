"""``governor_replicas_target``: the scaler's target, every window, held or restored (issue 16, item 3).

KEDA scales the fleet on this gauge (``infra/k8s/keda/``), so it must carry the
scaler's current target for every key it governs: on a window that issues a
command, on one that holds the target (no command), on one held for missing
telemetry -- and stay absent (never 0) while a key has no target, a restored key
until its first fresh window (a replayed snapshot's target would scale the fleet
down at once: issue 31, item 4).
"""

from __future__ import annotations

from typing import Any

import orjson

from controllers.window_record import WindowRecord, decode_window
from core.settings import ModelSpec, Settings
from loop.control_loop import ControlLoop
from streams.metrics_export import WorkerMetrics
from tests.unit.test_scaler_driver import BRISK

T0 = 1_700_000_000_000
MODEL = "m"


def _settings() -> Settings:
    return Settings(models=(ModelSpec(MODEL, max_replicas=20),), zones=("az-a", "az-b"), window_s=10.0, pid_gains=BRISK)


def _zone(k: int, zone: str = "az-a", **kw: Any) -> WindowRecord:
    base = {"scope": "zone", "model": MODEL, "zone": zone, "window_end_ms": T0 + k * 10_000, "window_s": 10.0}
    return decode_window({**base, **kw})


def _target(metrics: WorkerMetrics, zone: str = "az-a", model: str = MODEL) -> float | None:
    return metrics.registry.get_sample_value("governor_replicas_target", {"model": model, "zone": zone})


def _loop() -> tuple[ControlLoop, WorkerMetrics]:
    metrics = WorkerMetrics()
    return ControlLoop(_settings(), metrics), metrics


def test_the_target_is_exported_on_every_window_not_only_with_a_command() -> None:
    loop, metrics = _loop()
    first = loop.decide(_zone(1, count=100, violation_rate=0.5, replicas_ready=2), T0 + 10_000)
    assert [c.target_replicas for c in first.commands] == [3]
    assert _target(metrics) == 3.0
    metrics.target.clear()  # a worker whose gauge was never set for the key (the old bug: set only on a command)
    # the fleet has the 3 replicas and meets its SLO: the scaler holds 3, no command is issued
    held = loop.decide(_zone(2, count=100, violation_rate=0.0, replicas_ready=3), T0 + 20_000)
    assert held.commands == []
    assert _target(metrics) == 3.0 == loop.scaler.states[(MODEL, "az-a")].ctrl.last_target
    assert _target(metrics, "az-b") is None  # no decision for az-b yet: absent, not 0


def test_missing_telemetry_holds_the_exported_target() -> None:
    loop, metrics = _loop()
    loop.decide(_zone(1, count=100, violation_rate=0.5, replicas_ready=2), T0 + 10_000)
    metrics.target.clear()
    # no request records while the replicas are busy: the window is held, no driver acts
    out = loop.decide(_zone(2, count=0, replicas_ready=3, running_mean=4.0, queue_len_mean=0.1), T0 + 20_000)
    assert out.commands == [] and loop.watch.stale[(MODEL, "az-a")].held_windows == 1
    assert _target(metrics) == 3.0
    # requests but no GPU samples: the scaler holds too, the target stays
    loop.decide(_zone(3, count=100, violation_rate=0.9), T0 + 30_000)
    assert _target(metrics) == 3.0


def test_a_restored_target_is_exported_from_its_first_fresh_window() -> None:
    loop, _ = _loop()
    loop.decide(_zone(1, count=100, violation_rate=0.5, replicas_ready=2), T0 + 10_000)
    loop.decide(_zone(1, "az-b", count=100, violation_rate=1.0, replicas_ready=4), T0 + 10_000)
    want = {z: loop.scaler.states[(MODEL, z)].ctrl.last_target for z in ("az-a", "az-b")}
    assert None not in want.values() and want["az-a"] != want["az-b"]  # two keys, two targets
    parts = orjson.loads(orjson.dumps(loop.snapshot_scopes()))[f"model:{MODEL}"]  # as stored in Redis
    restarted, metrics = _loop()
    assert _target(metrics) is None  # no snapshot read yet: absent, so KEDA holds (not 0)
    done, failed = restarted.restore_scope(f"model:{MODEL}", parts)
    assert done["scaler"] == 2 and not failed
    assert {z: _target(metrics, z) for z in ("az-a", "az-b")} == {"az-a": None, "az-b": None}  # KEDA holds
    eps_ref = restarted.settings.eps_ref  # the fleet has the targets and meets its SLO: held, no command
    for z in ("az-a", "az-b"):
        assert (
            restarted.decide(_zone(2, z, count=100, violation_rate=eps_ref, replicas_ready=want[z]), 0).commands == []
        )
    assert {z: _target(metrics, z) for z in ("az-a", "az-b")} == want


def test_a_snapshot_part_that_does_not_load_exports_nothing() -> None:
    loop, _ = _loop()
    loop.decide(_zone(1, count=100, violation_rate=0.5, replicas_ready=2), T0 + 10_000)
    parts = orjson.loads(orjson.dumps(loop.snapshot_scopes()))[f"model:{MODEL}"]
    parts["scaler"]["version"] = 99
    restarted, metrics = _loop()
    _, failed = restarted.restore_scope(f"model:{MODEL}", parts)
    assert "scaler" in failed and _target(metrics) is None


def test_only_configured_keys_are_exported() -> None:
    loop, metrics = _loop()
    loop.decide(_zone(1, count=100, violation_rate=0.5, replicas_ready=2), T0 + 10_000)
    parts = orjson.loads(orjson.dumps(loop.snapshot_scopes()))[f"model:{MODEL}"]
    # a snapshot from a configuration that had another zone: its state loads, its series does not appear
    parts["scaler"]["states"].append(["m", "az-gone", parts["scaler"]["states"][0][2]])
    restarted, metrics = _loop()
    restarted.restore_scope(f"model:{MODEL}", parts)
    restarted.decide(_zone(2, count=100, violation_rate=restarted.settings.eps_ref, replicas_ready=3), T0 + 20_000)
    assert _target(metrics) == 3.0 and _target(metrics, "az-gone") is None
    assert restarted.scaler.targets() == {(MODEL, "az-a"): 3}


def test_the_capacity_the_target_is_sized_with_is_exported_beside_it() -> None:
    """With a profiled capacity the feedforward sizes the target; ``governor_replica_capacity_rps``
    carries the capacity it used (learned, the profile as prior) for the same keys, and stays absent
    for a model without one."""
    spec = ModelSpec(MODEL, max_replicas=20, replica_capacity_rps=2.0)
    metrics = WorkerMetrics()
    loop = ControlLoop(Settings(models=(spec,), zones=("az-a", "az-b"), window_s=10.0), metrics)
    loop.decide(_zone(1, count=100, rate_rps=10.0, violation_rate=0.0, replicas_ready=2, itl_p95_ms=40.0), T0 + 10_000)
    value = metrics.registry.get_sample_value("governor_replica_capacity_rps", {"model": MODEL, "zone": "az-a"})
    assert value is not None and value == loop.scaler.learned_capacity(MODEL, "az-a")
    plain, plain_metrics = _loop()
    plain.decide(_zone(1, count=100, violation_rate=0.5, replicas_ready=2), T0 + 10_000)
    assert (
        plain_metrics.registry.get_sample_value("governor_replica_capacity_rps", {"model": MODEL, "zone": "az-a"})
        is None
    )
