"""``governor analyze gains``: the robust certificate (controllers/stability.py,
"Robust certificate"): an interval of plant gain, the required margins at every
plant gain in it, both modes, the switching between them (a common quadratic
Lyapunov function or a dwell), fpid's adaptation; the proposed defaults."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import control
import numpy as np
import pytest

from bench.analyze_gains import PLANT_GAIN_RANGE, PROPOSED_DWELL_WINDOWS, PROPOSED_GAINS, certify_settings
from controllers import fpid
from controllers.loop_model import LoopModel, closed_loop_matrix, margins, recurrence
from controllers.pid import PidMeasurement
from controllers.stability import (
    PlantGainRange,
    SolverMissing,
    _pad,
    common_lyapunov,
    reachable_alphas,
    robust_certificate,
)
from core.settings import Settings
from governor.cli import main

DT = 10.0


def _file(tmp_path: Path, gains: dict[str, float]) -> str:
    p = tmp_path / f"gains-{len(list(tmp_path.iterdir()))}.json"
    p.write_text(json.dumps({"gains": gains}))
    return str(p)


@pytest.mark.parametrize("controller", ["pid", "fpid"])
def test_the_proposed_gains_are_certified_over_the_measured_interval(
    controller: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, dwell = _file(tmp_path, PROPOSED_GAINS[controller]), str(PROPOSED_DWELL_WINDOWS[controller])
    assert main(["analyze", "gains", path, "--controller", controller, "--dwell-windows", dwell]) == 0
    out = capsys.readouterr().out
    assert f"plant gain b in [{PLANT_GAIN_RANGE.lo:g}, {PLANT_GAIN_RANGE.hi:g}]" in out
    assert "python -m sim.plant_gain --range" in out  # how the interval was measured
    assert "gain margin >= 2 (6 dB), phase margin >= 30 deg, delay margin >= 2 windows" in out
    assert out.rstrip().endswith("\ncertified")
    assert main(["analyze", "gains", path, "--controller", controller, "--dwell-windows", dwell, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["certified"] and doc["plant_gain_range"]["lo"] == PLANT_GAIN_RANGE.lo
    for mode in doc["modes"]:
        assert mode["gain_margin"]["value"] >= 2.0 and mode["phase_margin_deg"]["value"] >= 30.0
        assert mode["delay_margin_windows"]["value"] is None or mode["delay_margin_windows"]["value"] >= 2.0
        assert max(mode["spectral_radius_ends"]) < 1.0
    assert doc["switching"]["kind"] == "dwell" and doc["switching"]["dwell_windows_needed"] <= int(dwell)
    # certify_settings reads the dwell the controller enforces from the settings
    base, _ = Settings.load({}, None)
    settings = dataclasses.replace(base, controller=controller, scale_down_dwell_windows=int(dwell))
    assert certify_settings(PROPOSED_GAINS[controller], settings).certified
    # -1 (the shipped default): the controller's dwell in loop delays, enough at the hint's delay and at 130 s
    shipped = dataclasses.replace(settings, scale_down_dwell_windows=-1)
    assert certify_settings(PROPOSED_GAINS[controller], shipped).certified
    if controller == "pid":  # the dwell a 130 s loop needs (34 windows) is three times the 40 s one's
        assert certify_settings(PROPOSED_GAINS[controller], shipped, delay_s=130.0).certified
        assert not certify_settings(PROPOSED_GAINS[controller], settings, delay_s=130.0).certified
    settings = dataclasses.replace(settings, scale_down_dwell_windows=0)
    cert = certify_settings(PROPOSED_GAINS[controller], settings)
    assert not cert.certified
    need = cert.switching.dwell_windows_needed
    assert need is not None and 0 < need <= int(dwell)  # the SDP may land a window lower elsewhere
    assert cert.reasons == [
        f"switching: no common quadratic Lyapunov function; the up mode needs a dwell of {need} windows "
        "before a scale-down (scale_down_dwell_windows = 0)"
    ]


def test_the_old_shipped_pid_defaults_fail_with_the_margin_and_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pid defaults shipped before issue 35 (ki 0.05 both ways) are refused, with the margin and where."""
    assert main(["analyze", "gains", _file(tmp_path, {"kp": 0.0, "ki": 0.05, "kd": 0.0})]) == 1
    out = capsys.readouterr().out
    assert "NOT CERTIFIED: down: gain margin 0.475 < 2 at b = 4.21" in out
    assert "NOT CERTIFIED: down: spectral radius 1.4509 >= 1 at b = 4.21" in out
    assert "NOT CERTIFIED: up: spectral radius 1.0202 >= 1 at b = 4.21" in out


@pytest.mark.parametrize("controller", ["pid", "fpid"])
def test_the_shipped_defaults_are_the_certified_proposals(controller: str, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 35: `governor analyze gains --shipped` exits 0 with and without --controller fpid, at the
    dwell each controller ships (core.vocab.DEFAULT_DWELL_DELAYS loop delays)."""
    assert main(["analyze", "gains", "--shipped", "--controller", controller]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("certified") and "NOT CERTIFIED" not in out
    for name, value in PROPOSED_GAINS[controller].items():
        if name not in ("alpha_lo", "alpha_hi"):  # the adaptation is off (eta 0): alpha stays at 1
            assert f"'{name}': {value}" in out


def test_a_gain_certified_at_one_plant_gain_is_not_over_the_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ki = 0.025 was "certified" (at b = 3.909, any margin): with a 2 degree phase margin, and
    unstable at b = 4.21, inside the measured range."""
    path = _file(tmp_path, {"ki": 0.025})
    assert main(["analyze", "gains", path, "--plant-gain", "3.909", "--dwell-windows", "1000"]) == 1
    out = capsys.readouterr().out
    assert "down: phase margin" in out and "down: delay margin" in out
    assert main(["analyze", "gains", path, "--dwell-windows", "1000"]) == 1
    assert "NOT CERTIFIED: down: spectral radius 1.0" in capsys.readouterr().out


def test_the_plant_gain_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, PROPOSED_GAINS["pid"])
    # over the range the issue quotes (one fleet of 4) the proposal has a common Lyapunov function
    assert main(["analyze", "gains", path, "--plant-gain-range", "2.55,4.21"]) == 0
    out = capsys.readouterr().out
    assert "plant gain b in [2.55, 4.21]: --plant-gain-range 2.55,4.21" in out
    assert "switching: a common quadratic Lyapunov function of both modes at both ends" in out
    for bad in (["--plant-gain-range", "4,2"], ["--plant-gain-range", "x"], ["--plant-gain-range", "0,2"]):
        assert main(["analyze", "gains", path, *bad]) == 2
        assert "plant_gain_range" in capsys.readouterr().out
    assert main(["analyze", "gains", path, "--plant-gain-range", "1,2", "--plant-gain", "1"]) == 2
    assert main(["analyze", "gains", path, "--dwell-windows", "-1"]) == 2
    assert "scale_down_dwell_windows" in capsys.readouterr().out


def _modes(gains: dict[str, float], b: float) -> tuple[np.ndarray, np.ndarray]:
    up = closed_loop_matrix(LoopModel.from_gains(gains, "pid", plant_gain=b, delay_s=40.0, dt_s=DT, compensated=True))
    down = closed_loop_matrix(LoopModel.from_gains(gains, "pid", plant_gain=b, delay_s=DT, dt_s=DT, direction="down"))
    n = max(up.shape[0], down.shape[0])
    return _pad(up, n), _pad(down, n)


def test_a_common_lyapunov_function_at_the_ends_holds_at_every_plant_gain_between() -> None:
    """A(b) is affine in b and x -> x^T P x convex: P from the four vertices decreases along every
    mode at every b of the interval, and along any switching with b changing every window."""
    gains, lo, hi = PROPOSED_GAINS["pid"], 2.55, 4.21
    verts = [a for b in (lo, hi) for a in _modes(gains, b)]
    found = common_lyapunov(verts)
    assert found is not None
    p, rho = found
    assert rho < 1 and np.min(np.linalg.eigvalsh(p)) > 0
    for b in np.linspace(lo, hi, 57):
        for a in _modes(gains, float(b)):
            assert np.max(np.linalg.eigvalsh(a.T @ p @ a - rho**2 * p)) <= 1e-9 * np.linalg.norm(p)
    rng = np.random.default_rng(3)
    x: Any = rng.normal(size=p.shape[0])
    v0 = x @ p @ x
    for k in range(400):
        x = _modes(gains, float(rng.uniform(lo, hi)))[int(rng.integers(2))] @ x
        assert x @ p @ x <= rho ** (2 * (k + 1)) * v0 * (1 + 1e-9)


def test_switching_can_diverge_where_each_mode_is_stable_and_the_dwell_stops_it() -> None:
    """ki = 0.0105 both ways over [0.534, 4.21]: each mode is stable at every b, yet down, down, up
    at alternating ends grows (no common P can exist); the certificate asks for a dwell, and with
    it the switched loop (b drawn every window, the up mode held at least the dwell) decays."""
    gains, lo, hi = {"ki": 0.0105}, 0.534, 4.21
    (up_lo, down_lo), (up_hi, down_hi) = _modes(gains, lo), _modes(gains, hi)
    for a in (up_lo, down_lo, up_hi, down_hi):
        assert np.max(np.abs(np.linalg.eigvals(a))) < 1
    cycle = up_lo @ down_lo @ down_hi  # found by a brute-force search over words up to 8 long
    assert np.max(np.abs(np.linalg.eigvals(cycle))) ** (1 / 3) > 1.01
    assert common_lyapunov([up_lo, down_lo, up_hi, down_hi]) is None
    cert = robust_certificate(gains, "pid", PlantGainRange(lo, hi), 40.0, DT, time_scale_s=DT)
    sw = cert.switching
    assert sw.kind == "dwell" and sw.dwell_windows_needed is not None and not cert.certified
    need = sw.dwell_windows_needed
    assert robust_certificate(gains, "pid", PlantGainRange(lo, hi), 40.0, DT, dwell_windows=need).certified
    rng = np.random.default_rng(0)
    x0: Any = rng.normal(size=up_lo.shape[0])
    x = x0
    for _ in range(40):  # cycles: the dwell up, then 1-3 windows down; b anywhere in the interval
        for _ in range(need):
            x = _modes(gains, float(rng.uniform(lo, hi)))[0] @ x
        for _ in range(int(rng.integers(1, 4))):
            x = _modes(gains, float(rng.uniform(lo, hi)))[1] @ x
    assert np.linalg.norm(x) < 1e-3 * np.linalg.norm(x0)


def test_without_cvxpy_the_message_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cvxpy", None)  # import cvxpy raises ImportError
    with pytest.raises(SolverMissing, match=r"pip install 'governor\[bench\]'"):
        robust_certificate(PROPOSED_GAINS["pid"], "pid", PLANT_GAIN_RANGE, 40.0, DT)


def test_fpid_adaptation_is_certified_over_the_orders_it_can_reach(capsys: pytest.CaptureFixture[str]) -> None:
    # adaptation off: the one order; on: the clip interval, sampled (and said so)
    assert reachable_alphas({"kp": 0.2, "ki": 0.05, "alpha": 1.0}, "fpid")[0] == (1.0,)
    orders, note = reachable_alphas({"kp": 0.2, "ki": 0.05, "eta": 0.1, "alpha_lo": 0.8, "alpha_hi": 1.2}, "fpid")
    assert orders[0] == 0.8 and orders[-1] == 1.2 and len(orders) == 9 and "not certified" in note
    # the floor 2 ki / kp is part of the clip
    assert reachable_alphas({"kp": 0.2, "ki": 0.09, "eta": 0.1, "alpha_lo": 0.1}, "fpid")[0][0] == pytest.approx(0.9)
    # with a fractional order the whole memory is state (68 dimensions): refused, not faked
    cert = robust_certificate(
        {**PROPOSED_GAINS["fpid"], "eta": 0.1, "alpha_lo": 0.9, "alpha_hi": 1.1}, "fpid", PLANT_GAIN_RANGE, 40.0, DT,
        dwell_windows=1000,
    )  # fmt: skip
    assert not cert.certified and cert.switching.order == 68 and "too slow" in cert.switching.why
    # the proposal pins the adaptation at alpha = 1: fpid's clip keeps it there whatever the drive
    kw: dict[str, Any] = {k: v for k, v in PROPOSED_GAINS["fpid"].items() if k != "memory"}
    params = fpid.FpidParams(**kw, eta=5.0, time_scale_s=DT, max_replicas=50)
    st = fpid.FpidState()
    for eps in (0.9, 0.9, 0.0, 0.0, 0.5):
        st, _ = fpid.step(params, st, PidMeasurement(eps, replicas_current=10), DT)
        assert st.alpha == 1.0
    wide = fpid.FpidParams(kp=0.2, ki=0.05, eta=5.0, alpha_lo=0.9, alpha_hi=1.1)
    st = fpid.FpidState()
    seen: list[float] = []
    for eps in (0.9, 0.9, 0.0, 0.0, 0.0, 0.0):
        st, _ = fpid.step(wide, st, PidMeasurement(eps, replicas_current=10), DT)
        assert st.alpha is not None
        seen.append(st.alpha)
    assert max(seen) == 1.1 and min(seen) == 0.9
    with pytest.raises(ValueError, match="alpha_lo"):
        fpid.FpidParams(alpha_lo=1.2, alpha_hi=1.1)


def _tf(m: LoopModel) -> control.TransferFunction:
    own, ready, eps = recurrence(m)
    return control.tf(list(m.plant_gain * eps), list(np.concatenate(([1.0], -(own + ready)[1:]))), m.dt_s)


@pytest.mark.parametrize(
    ("controller", "mode", "b"),
    list(itertools.product(["pid", "fpid"], ["up", "down"], [PLANT_GAIN_RANGE.lo, PLANT_GAIN_RANGE.hi])),
)
def test_the_proposals_margins_at_the_interval_ends_match_python_control(controller: str, mode: str, b: float) -> None:
    up = mode == "up"
    m = LoopModel.from_gains(
        PROPOSED_GAINS[controller], controller, plant_gain=b, delay_s=40.0 if up else DT, dt_s=DT, compensated=up,
        time_scale_s=DT, direction=mode,
    )  # fmt: skip
    mine = margins(m)
    gm, pm, _, wpc, wgc, _ = control.stability_margins(_tf(m), returnall=True)
    real = [(g, w) for g, w in zip(gm, wpc, strict=True) if g > 1e-9]  # g ~ 0: a pole on the unit circle
    assert real
    for g, w in real:
        assert any(
            math.isclose(w * DT, x, rel_tol=1e-5) and math.isclose(g, y, rel_tol=1e-5) for x, y in mine.gain_margins
        )
    for p, w in zip(pm, wgc, strict=True):
        assert any(
            math.isclose(w * DT, x, rel_tol=1e-5) and math.isclose(abs(p), y, rel_tol=1e-5)
            for x, y in mine.phase_margins
        )
    assert mine.gain_margin <= min(g for g, _ in real) * (1 + 1e-6)
    assert mine.gain_margin >= 2.0 and mine.phase_margin_deg >= 30.0 and mine.delay_margin_windows >= 2.0
