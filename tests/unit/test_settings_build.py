"""Every setting the validation accepts builds the worker's loop: no value passes ``Settings``
and then stops the worker while it builds its drivers.

Each numeric field is set, alone, to the ends of its declared range (just inside an open end)
and to a thousand times its default; whatever ``Settings`` accepts must build a
:class:`loop.control_loop.ControlLoop` and pass :func:`controllers.scaling_law.controller_problem`.
(Found this way: ``GOVERNOR_WINDOW_S=1e-6`` passed ``> 0`` and made a 0 ms window.)
"""

from __future__ import annotations

import dataclasses

import pytest

from controllers.scaling_law import controller_problem
from core.settings import ModelSpec, Settings, SettingsError
from loop.control_loop import ControlLoop
from loop.scaler_driver import Scaler
from tests.unit.test_scaler_driver import MODEL, _window

BASE = Settings(models=(ModelSpec("m", replica_capacity_rps=2.0),), zones=("az-a", "az-b"))


def _candidates(field: dataclasses.Field[object]) -> list[object]:
    v0 = getattr(BASE, field.name)
    meta = field.metadata or {}
    gt, ge, lt, le = (meta.get(k) for k in ("gt", "ge", "lt", "le"))
    step = 1e-6 if isinstance(v0, float) else 1
    out: list[object] = []
    if gt is not None or ge is not None:
        out.append(gt + step if gt is not None else ge)
    if lt is not None or le is not None:
        out.append(lt - step if lt is not None else le)
    out.append(v0 * 1000 if v0 else 1000)
    return [type(v0)(c) for c in out]


NUMERIC = [
    f
    for f in dataclasses.fields(Settings)
    if not isinstance(getattr(BASE, f.name), bool) and isinstance(getattr(BASE, f.name), int | float)
]


def test_the_sweep_covers_the_numeric_settings() -> None:
    assert len(NUMERIC) >= 20 and "window_s" in {f.name for f in NUMERIC}


@pytest.mark.parametrize("field", NUMERIC, ids=lambda f: f.name)
def test_an_accepted_value_builds_the_loop(field: dataclasses.Field[object]) -> None:
    for value in _candidates(field):
        try:
            settings = BASE.replace(**{field.name: value})
        except SettingsError:
            continue  # refused with its reason: what a bad value should get
        ControlLoop(settings)
        assert controller_problem(settings) == "", (field.name, value)


MODEL_VALUES = (1e-9, 0.5, 1, 64, 1e6, float("inf"), float("nan"), -1, 0, 64.0, True)
MODEL_FIELDS = ("ttft_slo_ms", "itl_slo_ms", "min_replicas", "max_replicas", "replica_capacity_rps",
                "replica_headroom", "max_replicas_total")  # fmt: skip


@pytest.mark.parametrize("name", MODEL_FIELDS)
def test_a_model_spec_the_settings_accept_builds_the_loop(name: str) -> None:
    """A model's numbers: ``.inf`` (YAML) or ``Infinity`` (JSON) SLOs and capacities, and
    fractional or boolean replica counts, are refused by the settings, not by the loop."""
    accepted = []
    for value in MODEL_VALUES:
        try:
            spec = ModelSpec("m", **{"replica_capacity_rps": 2.0, name: value})  # type: ignore[arg-type]
            settings = Settings(models=(spec,), zones=("az-a", "az-b"))
        except SettingsError:
            continue
        ControlLoop(settings)
        assert controller_problem(settings) == "", (name, value)
        accepted.append(value)
    assert accepted, name  # the sweep reaches at least one accepted value per field
    assert not any(isinstance(v, float) and v != v or v == float("inf") for v in accepted), (name, accepted)


@pytest.mark.parametrize(
    ("controller", "gains"),
    [
        ("pid", {"kp": 1e300, "ki": 1e300, "kd": 1e300}),
        ("pid", {"ki": 1e-300}),
        ("pid", {"kp": 1e300, "ki": 0.0, "kd": 1e300, "deadband": 1e300}),
        ("fpid", {"kp": 1e300, "ki": 1e299, "alpha": 0.5, "eta": 1e300, "gamma": 1e300, "beta": 1e300}),
        ("pid", {"ki": 0.05, "ff_error_margin": 1e300, "ff_decay_per_step": 1.0, "ff_lift_z": 1e300}),
    ],
)
def test_extreme_but_valid_gains_keep_every_target_within_the_model_bounds(
    controller: str, gains: dict[str, float]
) -> None:
    """Accepted gains at the edge of float arithmetic: bursts, misses and queues for 40 windows,
    and every command targets a replica count within [min_replicas, max_replicas]."""
    spec = ModelSpec(MODEL, replica_capacity_rps=2.0, min_replicas=1, max_replicas=200)
    settings = Settings(models=(spec,), window_s=10.0, zones=("az-a",), controller=controller, pid_gains=gains)
    assert controller_problem(settings) == ""
    scaler, ready, targets = Scaler(settings), 4, []
    for k in range(40):
        w = _window(k, rate=50.0 if k % 7 < 3 else 1.0, ready=ready, eps=0.5 if k % 5 == 0 else 0.0,
                    queue=5.0 if k % 7 == 0 else 0.0)  # fmt: skip
        for cmd in scaler.on_window(w, (k + 1) * 10_000):
            ready = cmd.target_replicas
            targets.append(ready)
    assert targets and all(1 <= t <= 200 for t in targets), targets
