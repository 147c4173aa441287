"""Online retuning (issue 36, item 1): the fit, the search's bound, the certificate gate, the bounded
step and the mode switch, through the real loop driver and scaler (controllers/retune.py,
loop/retune_driver.py, sim/retune.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from controllers import retune as rt
from controllers.gain_certificate import PLANT_GAIN_RANGE, gate
from controllers.window_record import WindowRecord
from core.settings import ModelSpec, Settings
from loop.control_loop import ControlLoop
from sim.retune import workload_of

pytestmark = pytest.mark.timeout(120)

SHIPPED = {"kp": 0.0, "ki": 0.0235, "kd": 0.0, "ki_down": 0.0105}
UNSTABLE = {"kp": 0.3, "ki": 0.03, "kd": 0.1, "ki_down": 0.0105}  # spectral radius > 1 at the top of the interval
BOX = rt.search_box(PLANT_GAIN_RANGE.hi)


def _sample(i: int, count: int, prompt: int = 1000, output: int = 200, ready: int = 4) -> rt.WindowSample:
    return rt.WindowSample(10_000 * (i + 1), 10.0, count, prompt * count, output * count, ready, 0)


def test_fit_reads_counts_tokens_capacity_and_startup() -> None:
    samples = [_sample(i, n, prompt=500 + 100 * i) for i, n in enumerate((10, 0, 30, 40, 50, 60, 70))]
    f = rt.fit("m", "az-a", samples, 2.5, 45.0)
    assert f is not None
    assert f.counts == (10, 0, 30, 40, 50, 60, 70)
    assert f.prompt_tokens[0] == 500 and f.prompt_tokens[1] == 500  # an empty window keeps the last sizes
    assert f.prompt_tokens[2] == 700 and f.output_tokens[3] == 200
    assert (f.capacity_rps, f.startup_s, f.initial_replicas, f.window_s) == (2.5, 45.0, 4, 10.0)
    # the simulated arrival schedule has the windows' counts, window by window
    w = workload_of(f)
    per_window = np.histogram(w.arrival_s, bins=np.arange(0, 80, 10.0))[0]
    assert per_window.tolist() == [10, 0, 30, 40, 50, 60, 70]
    # too few windows, or none with a request: nothing to fit
    assert rt.fit("m", "az-a", samples[: rt.MIN_WINDOWS - 1], 2.5, 45.0) is None
    assert rt.fit("m", "az-a", [_sample(i, 0) for i in range(8)], 2.5, 45.0) is None


def test_ring_is_bounded_and_drops_redelivered_windows() -> None:
    ring = rt.WindowRing(5)
    for i in range(12):
        ring.add("m", "z", _sample(i, i))
    ring.add("m", "z", _sample(3, 99))  # an old window delivered again
    kept = ring.of("m", "z")
    assert [s.count for s in kept] == [7, 8, 9, 10, 11]
    with pytest.raises(ValueError, match="ring size"):
        rt.WindowRing(rt.MAX_RING_WINDOWS + 1)


@pytest.mark.parametrize("trials", [1, 2, 5, 12, 30])
def test_search_scores_at_most_trials_gain_sets(trials: int) -> None:
    calls: list[dict[str, float]] = []

    def score(g: dict[str, float]) -> float:  # a bowl with its bottom inside the box, kd included
        calls.append(g)
        return (g["ki"] - 0.015) ** 2 + (g["kd"] - 0.05) ** 2 + g["kp"] ** 2 + (g["ki_down"] - 0.008) ** 2

    res = rt.search(score, SHIPPED, BOX, trials)
    assert len(calls) == len(res.trials) <= trials
    assert calls[0] == SHIPPED  # the first trial is the gains in force
    for g in calls:  # every trial inside the box
        assert all(BOX.lo[n] <= g[n] <= BOX.hi[n] for n in rt.SEARCHED)
    if trials >= 12:
        assert res.best_score < score(dict(SHIPPED)) and res.best["kd"] > 0  # kd is searched
    with pytest.raises(ValueError, match="trials"):
        rt.search(score, SHIPPED, BOX, 0)


@pytest.mark.parametrize(
    ("current", "proposed"),
    [
        (SHIPPED, {**SHIPPED, "ki": 0.028, "kd": 0.2}),  # up, and a gain at 0 starts to move
        (SHIPPED, {**SHIPPED, "ki": 0.002, "ki_down": 0.001}),  # down
        ({**SHIPPED, "kp": 0.1}, {**SHIPPED, "kp": 0.1}),  # already there
    ],
)
def test_bounded_step_moves_each_gain_at_most_max_rel(current: dict[str, float], proposed: dict[str, float]) -> None:
    step = rt.bounded_step(current, proposed, BOX, 0.25)
    for n in rt.SEARCHED:
        allowed = 0.25 * max(abs(current[n]), 0.1 * BOX.hi[n])
        assert abs(step[n] - current[n]) <= allowed + 1e-9
        assert min(current[n], proposed[n]) - 1e-9 <= step[n] <= max(current[n], proposed[n]) + 1e-9  # towards it
    twice = rt.bounded_step(step, proposed, BOX, 0.25)  # successive periods get there
    assert all(abs(twice[n] - proposed[n]) <= abs(step[n] - proposed[n]) for n in rt.SEARCHED)


@pytest.mark.parametrize("sdp", [False, True])
def test_gate_refuses_uncertified_gains_with_a_reason(sdp: bool) -> None:
    v = gate(UNSTABLE, Settings(), sdp=sdp)
    assert not v.accepted and v.sdp is sdp
    assert any("spectral radius" in r for r in v.reasons), v.reasons
    ok = gate(SHIPPED, Settings(), sdp=sdp)
    assert ok.accepted, ok.reasons
    if not sdp:  # without cvxpy the margins still gate, and the verdict says the switching was not checked
        assert "switching not checked" in ok.note


def _loop(mode: str, **kw: Any) -> ControlLoop:
    settings = Settings(retune=mode, retune_period_s=60.0, retune_trials=4, window_s=10.0, **kw)
    return ControlLoop(settings)


def _window(model: str, zone: str, i: int) -> WindowRecord:
    return WindowRecord(
        scope="zone", model=model, zone=zone, window_end_ms=10_000 * (i + 1), window_s=10.0, count=100,
        rate_rps=10.0, prompt_tokens=100_000, output_tokens=20_000, replicas_ready=4, ttft_slo_ms=1000.0,
        itl_slo_ms=150.0,
    )  # fmt: skip


def _result(
    loop: ControlLoop, model: str, step: dict[str, float], accepted: bool, better: bool = True
) -> dict[str, Any]:
    reasons = [] if accepted else ["up: spectral radius 1.2079 >= 1 at b = 4.21"]
    return {
        "model": model,
        "current": dict(loop.retune.in_force[model]),
        "proposed": step,
        "step": step,
        "gate": {"accepted": accepted, "reasons": reasons, "sdp": False},
        "step_gate": {"accepted": accepted, "reasons": reasons, "sdp": False},
        "expected": {"current": {"objective": 1.0}, "proposed": {"objective": 0.9 if better else 1.1}},
    }


def _fill(loop: ControlLoop, n: int = 8) -> str:
    model = loop.settings.models[0].name
    for i in range(n):
        for zone in loop.settings.zones:
            loop.decide(_window(model, zone, i), 10_000 * (i + 1))
    return model


def test_driver_makes_a_job_per_period_from_the_ring() -> None:
    loop = _loop("shadow")
    model = _fill(loop)
    assert loop.retune.due(50_000) == []  # the first window + a period not reached
    jobs = loop.retune.due(80_000)
    assert len(jobs) == 1 and jobs[0].model == model and jobs[0].trials == 4
    assert {f.zone for f in jobs[0].fits} == set(loop.settings.zones)
    assert jobs[0].current == SHIPPED
    assert loop.retune.due(90_000) == []  # one in flight, and the next period not reached
    off = _loop("off")
    _fill(off)
    assert off.retune.ring.keys == {} and off.retune.due(10**9) == []


def test_modes_shadow_apply_refused_and_kill_switch() -> None:
    better = {**SHIPPED, "ki": 0.02}
    # shadow: the proposal is recorded, the scaler's gains do not move
    loop = _loop("shadow")
    model = _fill(loop)
    before = loop.scaler.laws[model].pid
    rec = loop.retune.on_result(_result(loop, model, better, True), False, 1)
    assert rec["action"] == "shadow" and rec["in_force"] == SHIPPED and loop.scaler.laws[model].pid == before
    assert rec["proposal"]["proposed"] == better
    # apply, certified and better: the law of the model runs the new gains
    loop = _loop("apply")
    model = _fill(loop)
    rec = loop.retune.on_result(_result(loop, model, better, True), False, 1)
    assert rec["action"] == "applied" and rec["in_force"]["ki"] == 0.02
    assert loop.scaler.laws[model].pid.ki == pytest.approx(0.02)
    # apply, not certified: refused with the certificate's reason, nothing moves
    rec = loop.retune.on_result(_result(loop, model, UNSTABLE, False), False, 2)
    assert rec["action"] == "refused" and "not certified: up: spectral radius" in rec["reason"]
    assert loop.scaler.laws[model].pid.ki == pytest.approx(0.02) and loop.retune.in_force[model]["kp"] == 0.0
    # apply, certified but not better on the fit: held
    rec = loop.retune.on_result(_result(loop, model, {**SHIPPED, "ki": 0.021}, True, better=False), False, 3)
    assert rec["action"] == "hold" and loop.retune.in_force[model]["ki"] == 0.02
    # the kill switch: the configured gains back at once, and nothing applied while it is set
    recs = loop.retune.on_kill_switch(True, 4)
    assert [r["action"] for r in recs] == ["killed"] and loop.retune.in_force[model] == SHIPPED
    assert loop.scaler.laws[model].pid.ki == pytest.approx(SHIPPED["ki"])
    assert loop.retune.due(10**9) == []
    rec = loop.retune.on_result(_result(loop, model, better, True), True, 5)
    assert rec["action"] == "hold" and loop.retune.in_force[model] == SHIPPED


def test_propose_runs_the_fitted_simulator_within_the_trial_budget() -> None:
    from sim.retune import propose

    settings = Settings(window_s=10.0)
    model = settings.models[0].name
    samples = [_sample(i, 60 if i < 6 else 120) for i in range(12)]  # the load doubles half-way
    fits = tuple(f for z in settings.zones if (f := rt.fit(model, z, samples, 2.5, 30.0)) is not None)
    job = rt.RetuneJob(model, settings, fits, SHIPPED, 3, 0, sdp=False)
    out = propose(job)
    assert out["trials"] <= 3 and out["keys"] == [f"{model}|{z}" for z in settings.zones]
    assert out["current"] == SHIPPED and out["gate"]["sdp"] is False and out["step_gate"]["accepted"]
    for arm in ("current", "proposed"):
        assert 0.0 <= out["expected"][arm]["attainment"] <= 1.0 and out["expected"][arm]["gpu_seconds"] > 0
    # the fit's capacity: the simulated replica's, measured on the fitted token sizes, scales the load
    assert all(f["simulated_capacity_rps"] > 0 and f["capacity_rps"] == 2.5 for f in out["fit"])
    step = out["step"]
    assert all(
        abs(step[n] - SHIPPED[n]) <= rt.MAX_STEP_REL * max(SHIPPED[n], 0.1 * BOX.hi[n]) + 1e-12 for n in rt.SEARCHED
    )


def test_a_fit_no_fleet_can_serve_proposes_nothing() -> None:
    """A window's mean prompt too long to prefill within the TTFT SLO: every fitted request is unservable
    (ceiling 0), which says nothing of the gains; the driver holds, whatever the mode."""
    from sim.retune import propose

    settings = Settings(window_s=10.0, models=(ModelSpec("llama2-70b", ttft_slo_ms=50.0),))
    model = settings.models[0].name
    samples = [_sample(i, 20, prompt=60_000) for i in range(8)]
    fits = tuple(f for z in settings.zones if (f := rt.fit(model, z, samples, None, 30.0)) is not None)
    out = propose(rt.RetuneJob(model, settings, fits, SHIPPED, 3, 0, sdp=False))
    assert out["trials"] == 0 and out["proposed"] == SHIPPED and not out["expected"]
    loop = ControlLoop(settings.replace(retune="apply"))
    rec = loop.retune.on_result(out, False, 1)
    assert rec["action"] == "hold" and "serves within the SLO" in rec["reason"]
    assert rt.objective(10.0, 10.0, 0.0, 0.0, 0.995, 1000.0) == 1.0  # a ceiling of 0: nothing to miss


def test_an_unreadable_kill_switch_holds() -> None:
    """Redis down when a result comes back: nothing applied, nothing reverted (fail safe = hold)."""
    loop = _loop("apply")
    model = _fill(loop)
    rec = loop.retune.on_result(_result(loop, model, {**SHIPPED, "ki": 0.02}, True), None, 1)
    assert rec["action"] == "hold" and "unreadable" in rec["reason"] and loop.retune.in_force[model] == SHIPPED


def test_the_fast_loop_runs_the_retunes_and_applies_a_certified_step() -> None:
    """The fast loop's hook (what governor bench retune runs): jobs at the period, results applied."""
    from sim.fastloop import LoopConfig, run
    from sim.workloads import Workload

    jobs: list[rt.RetuneJob] = []

    def search(job: rt.RetuneJob) -> dict[str, Any]:
        jobs.append(job)
        step = {**job.current, "ki": 0.02}
        ok = {"accepted": True, "reasons": [], "sdp": False}
        exp = {"current": {"objective": 1.0}, "proposed": {"objective": 0.9}}
        return {"model": job.model, "current": dict(job.current), "proposed": step, "step": step, "gate": ok,
                "step_gate": ok, "expected": exp}  # fmt: skip

    rng = np.random.default_rng(0)
    n = 1200
    w = Workload(np.sort(rng.uniform(0, 120, n)), np.full(n, 1000), np.full(n, 100), None, "flat")
    cfg = LoopConfig.of(retune="apply", retune_period_s=60.0, pid_gains=SHIPPED)
    r = run("governor", w, cfg, (), 120.0, retune=search)
    applied = [e for e in r.events if e.get("kind") == "retune"]
    assert len(jobs) == 1 and {f.zone for f in jobs[0].fits} == set(cfg.zones)
    assert applied and applied[0]["action"] == "applied" and applied[0]["in_force"]["ki"] == 0.02
