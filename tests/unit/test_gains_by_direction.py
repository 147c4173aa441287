"""Per-direction gains (issue 35): kp/ki/kd act while the error (after the deadband) is above 0, the
``*_down`` gains below it; an absent down gain is the up gain (old gains files keep their meaning)."""

from __future__ import annotations

import json

import pytest

from controllers import fpid
from controllers.errors import ParameterError
from controllers.pid import PidMeasurement, PidParams, PidState, step
from controllers.scaling_law import controller_problem, pid_params_for
from core.settings import ModelSpec, Settings, SettingsError
from core.vocab import DEFAULT_PID_GAINS, PID_GAIN_NAMES

DT = 10.0


def _first(params: PidParams | fpid.FpidParams, eps: float) -> float:
    meas = PidMeasurement(eps, replicas_current=10)
    if isinstance(params, fpid.FpidParams):
        return fpid.step(params, fpid.FpidState(), meas, DT)[1].i_term
    return step(params, PidState(), meas, DT)[1].i_term


def test_the_down_gains_act_below_the_reference_only() -> None:
    p = PidParams(ki=0.05, ki_down=0.01, deadband=0.0)
    assert _first(p, 0.0) == pytest.approx(0.01 * DT * -0.02)  # scale-down: ki_down
    assert _first(p, 0.5) == pytest.approx(0.05 * DT * 0.48)  # scale-up: ki
    assert _first(PidParams(ki=0.05, deadband=0.0), 0.0) == pytest.approx(0.05 * DT * -0.02)  # None: the up gain
    f = fpid.FpidParams(kp=0.2, ki=0.05, ki_down=0.01, deadband=0.0)
    assert _first(f, 0.0) == pytest.approx(0.01 * DT * -0.02)
    assert _first(f, 0.5) == pytest.approx(0.05 * DT * 0.48)


def test_a_bad_down_gain_is_refused_by_name() -> None:
    with pytest.raises(ParameterError, match="ki_down"):
        PidParams(ki_down=-0.1)
    with pytest.raises(ParameterError, match="ki_down"):  # fpid's ki/kp < 0.5 alpha holds both ways
        fpid.FpidParams(kp=0.2, ki=0.05, kp_down=0.01, ki_down=0.05)
    assert fpid.FpidParams(kp=0.2, ki=0.01, kp_down=0.2, ki_down=0.08).alpha_floor == pytest.approx(0.8)


def test_the_settings_take_the_down_gains_and_an_absent_one_is_the_up_gain() -> None:
    assert {"kp_down", "ki_down", "kd_down"} <= set(PID_GAIN_NAMES)
    assert DEFAULT_PID_GAINS["ki_down"] == 0.0105  # the shipped pid value, in one place
    spec = ModelSpec("m")
    shipped = pid_params_for(Settings(models=(spec,), zones=("az-a",)), "m")
    assert isinstance(shipped, PidParams) and (shipped.ki, shipped.ki_down) == (0.0235, 0.0105)
    old = pid_params_for(Settings(models=(spec,), zones=("az-a",), pid_gains={"ki": 0.05}), "m")
    assert isinstance(old, PidParams) and old.ki_down is None and old.gains(-0.1) == (0.0, 0.05, 0.0)
    env = Settings.from_env({"GOVERNOR_PID_GAINS": json.dumps({"ki": 0.05, "kp_down": 0.1, "kd_down": 0.0})})
    assert env.pid_gains["kp_down"] == 0.1
    with pytest.raises(SettingsError, match="ki_dwn"):
        Settings.from_env({"GOVERNOR_PID_GAINS": json.dumps({"ki_dwn": 0.01})})
    bad = Settings(models=(spec,), zones=("az-a",), pid_gains={"ki": 0.05, "ki_down": -1.0})
    assert controller_problem(bad) == "pid_gains (model m): ki_down=-1.0: gain must be >= 0"  # config check


def test_the_fpid_controller_reads_its_down_gains_from_the_settings() -> None:
    s = Settings(models=(ModelSpec("m"),), zones=("az-a",), controller="fpid",
                 pid_gains={"kp": 0.2, "ki": 0.05, "ki_down": 0.02})  # fmt: skip
    p = pid_params_for(s, "m")
    assert isinstance(p, fpid.FpidParams) and p.ki_down == 0.02 and p.kp_down is None
    assert fpid.FpidParams().ki_down is None  # fpid's shipped down gain is its up gain (certified so)
