"""controllers/stability.py: margins against python-control, a pure-integral
loop worked by hand, the Lyapunov certificate against scipy, hostile inputs;
``governor analyze gains`` exit codes."""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path

import control
import numpy as np
import pytest
from scipy.linalg import solve_discrete_lyapunov as scipy_dlyap

from bench.analyze_gains import PROPOSED_DWELL_WINDOWS, PROPOSED_GAINS
from bench.tune import run_tune
from controllers.errors import ParameterError
from controllers.loop_model import recurrence
from controllers.stability import (
    LoopModel,
    OperatingPoint,
    certify,
    closed_loop_matrix,
    frequency_response,
    margins,
    solve_discrete_lyapunov,
)
from core.settings import Settings
from governor.cli import main

DT = 10.0


def _tf(m: LoopModel) -> control.TransferFunction:
    """L_b(z) = b E(z^-1) / (1 - O(z^-1) - R(z^-1)), from the recurrence's parts, times z^order
    above and below (plain: b z^-(1+d) sum_j c_j z^-j / (1 - z^-1))."""
    own, ready, eps = recurrence(m)
    den = np.concatenate(([1.0], -(own + ready)[1:]))
    return control.tf(list(m.plant_gain * eps), list(den), m.dt_s)


CASES = [
    ({"ki": 0.05}, "pid", 1.0, 10.0),
    ({"ki": 0.05}, "pid", 0.3, 40.0),
    ({"ki": 0.02, "kp": 0.1}, "pid", 2.0, 20.0),
    ({"ki": 0.01, "kp": 0.3, "kd": 1.0}, "pid", 1.5, 30.0),
    ({"ki": 0.1, "kp": 0.4, "alpha": 0.8, "memory": 8}, "fpid", 0.5, 40.0),
    ({"ki": 0.1, "kp": 0.4, "alpha": 1.3, "memory": 8}, "fpid", 0.8, 20.0),
]


@pytest.mark.parametrize(("gains", "ctrl", "b", "delay"), CASES)
def test_margins_match_python_control(gains: dict[str, float], ctrl: str, b: float, delay: float) -> None:
    m = LoopModel.from_gains(gains, ctrl, plant_gain=b, delay_s=delay, dt_s=DT)
    mine = margins(m)
    gm, pm, sm, wpc, wgc, wms = control.stability_margins(_tf(m), returnall=True)
    # every crossover python-control finds is one of ours, with the same margin (its w is rad/s)
    for g, w in zip(gm, wpc, strict=True):
        if w <= 1e-9:
            continue  # python-control lists the integrator's pole at z = 1 as a crossover (gm ~ 0)
        assert any(
            math.isclose(w * DT, x, rel_tol=1e-5) and math.isclose(g, y, rel_tol=1e-5) for x, y in mine.gain_margins
        )
    # python-control's phase margin is 180 + arg L wrapped to [-180, 180): a crossover with
    # arg L > 0 reads negative there; ours is the phase (lag or lead) to -1, its absolute value
    for p, w in zip(pm, wgc, strict=True):
        assert any(
            math.isclose(w * DT, x, rel_tol=1e-5) and math.isclose(abs(p), y, rel_tol=1e-5, abs_tol=1e-6)
            for x, y in mine.phase_margins
        )
    assert len(mine.phase_margins) == len(pm)
    # and the reported (worst) margins are no larger than python-control's choice
    assert mine.gain_margin <= min((g for g, w in zip(gm, wpc, strict=True) if w > 1e-9), default=math.inf) * (1 + 1e-6)
    assert mine.phase_margin_deg <= min(np.abs(pm), default=math.inf) + 1e-6


@pytest.mark.parametrize("g", [0.1, 0.5, 1.2, 1.9])
def test_pure_integral_with_no_extra_delay_by_hand(g: float) -> None:
    # d = 0: L(z) = g / (z - 1), g = b ki dt.  e^{jw} - 1 = 2j sin(w/2) e^{jw/2}, so
    # |L| = g / (2 sin(w/2)) and arg L = -(pi/2 + w/2).  Gain crossover 2 sin(w_c/2) = g:
    # w_c = 2 asin(g/2), PM = pi/2 - w_c/2.  arg L = -pi only at w = pi, where |L| = g/2:
    # GM = 2/g.  Closed loop z = 1 - g: stable iff 0 < g < 2.
    m = LoopModel.from_gains({"ki": g / DT}, "pid", plant_gain=1.0, delay_s=0.0, dt_s=DT)
    mg = margins(m)
    wc = 2 * math.asin(g / 2)
    assert mg.gain_crossover == pytest.approx(wc, rel=1e-9)
    assert mg.phase_margin_deg == pytest.approx(math.degrees(math.pi / 2 - wc / 2), rel=1e-9)
    assert mg.gain_margin == pytest.approx(2 / g, rel=1e-9)
    assert mg.phase_crossover == pytest.approx(math.pi)
    assert closed_loop_matrix(m)[0, 0] == pytest.approx(1 - g)


@pytest.mark.parametrize("g", [0.1, 0.5, 0.9])
def test_pure_integral_with_one_window_of_delay_by_hand(g: float) -> None:
    # d = 1: L(z) = g / (z (z - 1)), arg L = -(pi/2 + 3w/2).  Phase crossover at w = pi/3, where
    # |L| = g / (2 sin(pi/6)) = g: GM = 1/g.  Gain crossover w_c = 2 asin(g/2), PM = pi/2 - 3 w_c/2.
    # Closed loop z^2 - z + g = 0: stable iff g < 1 (the product of the roots is g).
    m = LoopModel.from_gains({"ki": g / DT}, "pid", plant_gain=1.0, delay_s=DT, dt_s=DT)
    mg = margins(m)
    wc = 2 * math.asin(g / 2)
    assert mg.phase_crossover == pytest.approx(math.pi / 3, rel=1e-9)
    assert mg.gain_margin == pytest.approx(1 / g, rel=1e-9)
    assert mg.phase_margin_deg == pytest.approx(math.degrees(math.pi / 2 - 1.5 * wc), rel=1e-9)
    assert certify({"ki": g / DT}, "pid", OperatingPoint(1.0), DT, DT) is not None
    assert certify({"ki": 1.01 / DT}, "pid", OperatingPoint(1.0), DT, DT) is None


def test_the_delay_margin_counts_the_windows_the_loop_still_takes() -> None:
    gains, b = {"ki": 0.01}, 1.0  # g = 0.1
    m = LoopModel.from_gains(gains, "pid", plant_gain=b, delay_s=0.0, dt_s=DT)
    extra = margins(m).delay_margin_windows
    assert extra > 2
    ok = math.floor(extra)
    assert certify(gains, "pid", OperatingPoint(b), ok * DT, DT) is not None
    assert certify(gains, "pid", OperatingPoint(b), (ok + 1) * DT, DT) is None


@pytest.mark.parametrize(
    ("gains", "ctrl", "b", "delay", "comp"),
    [(*c, False) for c in CASES if certify(c[0], c[1], OperatingPoint(c[2]), c[3], DT)]
    + [({"ki": 0.05}, "pid", 1.0, 40.0, True), ({"kp": 0.2, "ki": 0.05}, "fpid", 3.0, 40.0, True)],
)
def test_the_certificate_holds_independently(
    gains: dict[str, float], ctrl: str, b: float, delay: float, comp: bool
) -> None:
    cert = certify(gains, ctrl, OperatingPoint(b), delay, DT, compensated=comp)
    assert cert is not None
    a = closed_loop_matrix(LoopModel.from_gains(gains, ctrl, plant_gain=b, delay_s=delay, dt_s=DT, compensated=comp))
    # scipy's solver on the same equation gives the same P (up to the ||P|| = 1 scaling)
    ref = scipy_dlyap((a / cert.rho).T, np.eye(a.shape[0]))
    np.testing.assert_allclose(cert.p, ref / np.linalg.norm(ref, 2), rtol=1e-6, atol=1e-9)
    assert cert.beta == pytest.approx(np.min(np.linalg.eigvalsh(ref)) / np.linalg.norm(ref, 2), rel=1e-6)
    assert cert.alpha_per_s == pytest.approx(-2 * math.log(cert.rho) / DT)
    assert cert.spectral_radius < cert.rho < 1
    rng = np.random.default_rng(7)
    for x in rng.normal(size=(200, a.shape[0])):
        v, v_next = x @ cert.p @ x, (a @ x) @ cert.p @ (a @ x)
        assert v >= cert.beta * (x @ x) * (1 - 1e-9)
        assert v_next <= cert.rho**2 * v * (1 + 1e-9)
    # and the bound along a trajectory: ||x_k|| <= rho^k ||x_0|| / sqrt(beta)
    x0 = x = rng.normal(size=a.shape[0])
    for k in range(1, 60):
        x = a @ x
        assert np.linalg.norm(x) <= cert.rho**k * np.linalg.norm(x0) / math.sqrt(cert.beta) * (1 + 1e-9)


def test_doubling_matches_scipy() -> None:
    a = np.array([[0.5, 0.4], [-0.3, 0.8]])
    q = np.array([[2.0, 0.1], [0.1, 1.0]])
    np.testing.assert_allclose(solve_discrete_lyapunov(a, q), scipy_dlyap(a.T, q), rtol=1e-10)


def test_an_unstable_gain_set_gets_no_certificate() -> None:
    assert certify({"ki": 2.0}, "pid", OperatingPoint(3.0), 60.0, DT) is None
    m = LoopModel.from_gains({"ki": 2.0}, "pid", plant_gain=3.0, delay_s=60.0, dt_s=DT)
    assert np.max(np.abs(np.linalg.eigvals(closed_loop_matrix(m)))) > 1
    assert margins(m).gain_margin < 1


@pytest.mark.parametrize("gains", [{"ki": 0.03}, {"kp": 0.2, "ki": 0.02}, {"kp": 0.1, "ki": 0.01, "kd": 0.5}])
def test_fpid_at_alpha_one_is_the_pid(gains: dict[str, float]) -> None:
    # time_scale_s = 1 s makes h = dt_s, where fpid.py's law is pid.py's (docs/model.md §5)
    pid = LoopModel.from_gains(gains, "pid", plant_gain=1.3, delay_s=20.0, dt_s=DT)
    fg = {**gains, "alpha": 1.0, "memory": 16}
    frac = LoopModel.from_gains(fg, "fpid", plant_gain=1.3, delay_s=20.0, dt_s=DT, time_scale_s=1.0)
    # the weights beyond the third are exactly zero at alpha = 1: the model drops them
    np.testing.assert_allclose(np.pad(frac.coeffs, (0, 3 - len(frac.coeffs))), pid.coeffs, atol=1e-12)
    assert len(frac.coeffs) <= 3
    w = np.linspace(0.01, math.pi, 50)
    np.testing.assert_allclose(frequency_response(frac, w), frequency_response(pid, w), rtol=1e-10)
    a, b = margins(pid), margins(frac)
    assert a.gain_margin == pytest.approx(b.gain_margin) and a.phase_margin_deg == pytest.approx(b.phase_margin_deg)
    ca = certify(gains, "pid", OperatingPoint(1.3), 20.0, DT)
    cb = certify({**gains, "alpha": 1.0, "memory": 16}, "fpid", OperatingPoint(1.3), 20.0, DT, time_scale_s=1.0)
    assert ca is not None and cb is not None
    assert ca.spectral_radius == pytest.approx(cb.spectral_radius, abs=1e-6)


@pytest.mark.parametrize(
    ("gains", "ctrl", "b", "delay", "match"),
    [
        ({"ki": math.nan}, "pid", 1.0, 10.0, "ki"),
        ({"kp": -0.1}, "pid", 1.0, 10.0, "kp"),
        ({"ki": 0.05}, "pid", 1.0, -1.0, "delay_s"),
        ({"ki": 0.05}, "pid", 0.0, 10.0, "plant_gain"),
        ({"ki": 0.05}, "pid", math.inf, 10.0, "plant_gain"),
        ({"ki": 0.05}, "ppid", 1.0, 10.0, "controller"),
        ({"ki": 0.05, "alpha": 3.0}, "fpid", 1.0, 10.0, "alpha"),
        ({"ki": 0.05, "memory": True}, "fpid", 1.0, 10.0, "memory"),
        ({"ki": 0.05}, "pid", 1.0, 1e9, "order"),
    ],
)
def test_hostile_inputs_raise_clear_errors(
    gains: dict[str, float], ctrl: str, b: float, delay: float, match: str
) -> None:
    with pytest.raises(ParameterError, match=match):
        certify(gains, ctrl, OperatingPoint(b), delay, DT)


def _write(tmp_path: Path, doc: object) -> str:
    p = tmp_path / f"gains-{len(list(tmp_path.iterdir()))}.json"
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(p)


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ok = _write(tmp_path, {"gains": {**PROPOSED_GAINS["pid"], "deadband": 0.01}})
    dwell = str(PROPOSED_DWELL_WINDOWS["pid"])
    assert main(["analyze", "gains", ok, "--dwell-windows", dwell]) == 0
    assert "certified" in capsys.readouterr().out
    assert main(["analyze", "gains", ok, "--json", "--dwell-windows", dwell]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["certified"] is True and [m["mode"] for m in doc["modes"]] == ["up", "down"]
    bad = _write(tmp_path, {"gains": {"ki": 0.5, "kp": 0.5}})
    assert main(["analyze", "gains", bad]) == 1
    assert "NOT CERTIFIED: up: spectral radius" in capsys.readouterr().out
    assert main(["analyze", "gains", _write(tmp_path, {"gains": {"ki": "lots"}})]) == 2
    assert "gains.ki" in capsys.readouterr().out
    assert main(["analyze", "gains", _write(tmp_path, "{not json")]) == 2
    assert main(["analyze", "gains", str(tmp_path / "missing.json")]) == 2
    assert main(["analyze", "gains", ok, "--delay-s", "-5"]) == 2
    assert "delay_s" in capsys.readouterr().out
    assert main(["analyze", "gains"]) == 2
    # the shipped defaults are analysed too; a gentle enough plant certifies them
    assert main(["analyze", "gains", "--shipped", "--plant-gain", "0.5", "--dwell-windows", "100"]) == 0


def _tune_args(tmp_path: Path, plant_gain: float) -> Namespace:
    return Namespace(
        trace=None,
        scenarios="step",
        qps=20.0,
        duration_s=30.0,
        trials=3,
        target_share=0.995,
        penalty=50.0,
        seed=0,
        seeds="0",
        out=str(tmp_path / f"gains-{plant_gain}.json"),
        plant_gain=plant_gain,
        delay_s=None,
    )


def test_tune_writes_only_certified_gains_with_their_certificate(tmp_path: Path) -> None:
    # a gentle plant certifies every trial: the best is written with its certificate
    args = _tune_args(tmp_path, 0.01)
    assert run_tune(args) == 0
    doc = json.loads(Path(args.out).read_text())
    assert {m["mode"] for m in doc["certificate"]["modes"]} == {"up", "down"}
    assert all(m["certified"] for m in doc["certificate"]["modes"])
    assert all(isinstance(v, float) for v in doc["gains"].values())  # GOVERNOR_GAINS_FILE reads a flat object
    loaded, _ = Settings.load({"GOVERNOR_GAINS_FILE": args.out}, None)  # every name one the worker accepts
    assert loaded.pid_gains == doc["gains"] and "ff_target_util" in loaded.pid_gains
    # a plant so steep that no gain in the search range is certified: nothing is written, exit 1
    args = _tune_args(tmp_path, 1e4)
    assert run_tune(args) == 1
    assert not Path(args.out).exists()
    assert run_tune(_tune_args(tmp_path, -1.0)) == 2  # a bad --plant-gain stops before any simulation


def test_tune_runs_are_bench_controls_and_weigh_the_share_of_the_ceiling(tmp_path: Path) -> None:
    """Each (trace, scenario, seed) is set up as ``bench control`` sets it, and the objective weighs
    attainment as a share of the ceiling: on Mooncake no fleet passes ~97 % raw, and a raw target would
    make every trial miss (the tuner would buy GPU-seconds for requests no capacity can serve)."""
    import subprocess
    import sys

    from bench.tune import _runs, evaluate

    args = Namespace(trace=["mooncake"], scenarios="replica-loss", qps=0.0, duration_s=90.0, seeds="0-1")
    runs = _runs(args)
    assert [r.name for r in runs] == ["mooncake/replica-loss/0", "mooncake/replica-loss/1"]
    assert all(r.cfg.ttft_slo_ms == 6000.0 for r in runs)  # the trace's SLO, as bench control uses
    gains = {"kp": 0.0, "ki": 0.05, "deadband": 0.015}
    score, detail = evaluate(gains, runs, None, 0.995, 50.0)
    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", "bench", "control", "--trace", "mooncake", "--scenario", "replica-loss",
         "--qps", "4", "--duration-s", "90", "--seed", "1", "--strategies", "governor", "--json",
         "--out", str(tmp_path)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    (control,) = json.loads(out.stdout)["strategies"]
    mine = detail["mooncake/replica-loss/1"]
    assert mine["gpu_seconds"] == control["gpu_seconds"]
    assert mine["share_of_ceiling"] == pytest.approx(control["attainment_over_ceiling"], abs=1e-5)
    assert mine["slo_attainment"] < 0.99 < mine["share_of_ceiling"]  # raw would miss; the share is what counts
    shortfall = sum(max(0.0, 0.995 - d["share_of_ceiling"]) for d in detail.values()) / len(detail)
    # each run is its own reference: 1.0 + the penalty (the detail's shares are rounded to 5 digits: x50)
    assert score == pytest.approx(1.0 + 50.0 * shortfall, abs=50.0 * 0.5e-5)
    with pytest.raises(ParameterError, match="--scenarios 'replay,nope'"):
        _runs(Namespace(trace=None, scenarios="replay,nope", qps=0.0, duration_s=30.0, seeds="0"))
