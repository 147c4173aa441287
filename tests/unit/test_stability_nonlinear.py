"""The assumption the certificate states about the parts the linear model leaves
out (controllers/stability.py, "Deadband, clamp, slew, rounding"), checked on
the simulator: the *nonlinear* closed loop -- the real ``controllers.pid.step``
and ``controllers.fpid.step`` with their deadband, clamp, slew limit, dead-time
hold, replica bounds and integer rounding, and the per-direction gains where
the parameters have them -- against a static plant whose gain ``b(t)`` is
drawn afresh every window from the certified interval, enters the deadband
from random starts and stays there, with a bounded number of reversals."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bench.analyze_gains import PLANT_GAIN_RANGE, PROPOSED_GAINS
from controllers import fpid, pid
from controllers.pid import PidMeasurement

DT_S = 10.0
STARTUP_WINDOWS = 4  # startup_hint_s + window_s = 40 s: the up mode's delay
EPS_REF = 0.02


def _params(controller: str, gains: Mapping[str, float], max_replicas: int) -> Any:
    """The controller's parameters from ``gains``; the ``*_down`` gains only where the
    parameter class has them (else the loop runs the down gains both ways, which
    the certificate also covers: they are smaller)."""
    cls = pid.PidParams if controller == "pid" else fpid.FpidParams
    names = {f.name for f in dataclasses.fields(cls)}
    g = dict(gains)
    if not {"kp_down", "ki_down", "kd_down"} & names:
        for k in ("kp", "ki", "kd"):
            if f"{k}_down" in g:
                g[k] = g[f"{k}_down"]
    kw: dict[str, Any] = {k: v for k, v in g.items() if k in names}
    if "memory" in kw:
        kw["memory"] = int(kw["memory"])
    if controller == "fpid":
        kw["time_scale_s"] = DT_S
    return cls(**kw, min_replicas=1, max_replicas=max_replicas)


def run_loop(
    controller: str, gains: Mapping[str, float], r_star: int, start: int, seed: int, windows: int
) -> tuple[list[float], list[int]]:
    """``windows`` windows of the loop against ``eps = clip(eps* - b(t) log(ready / r*), 0, 1)``;
    a scale-up is ready ``STARTUP_WINDOWS`` windows later, a scale-down takes effect at once
    (cancelling replicas still starting first).  Returns the errors and the targets."""
    rng = random.Random(seed)
    params = _params(controller, gains, max_replicas=4 * r_star + 10)
    step: Callable[..., Any] = pid.step if controller == "pid" else fpid.step
    state: Any = pid.PidState() if controller == "pid" else fpid.FpidState()
    ready, pending = start, list[list[int]]()  # pending: [window ready, count]
    errors, targets = [], []
    for k in range(windows):
        arrived = sum(c for t, c in pending if t <= k)
        pending = [[t, c] for t, c in pending if t > k]
        ready += arrived
        b = rng.uniform(PLANT_GAIN_RANGE.lo, PLANT_GAIN_RANGE.hi)
        eps = 1.0 if ready == 0 else min(max(EPS_REF - b * math.log(ready / r_star), 0.0), 1.0)
        n_pending = sum(c for _, c in pending)
        meas = PidMeasurement(eps, replicas_current=ready + n_pending, replicas_pending=n_pending)
        state, out = step(params, state, meas, DT_S)
        errors.append(out.error)
        targets.append(out.target_replicas)
        have = ready + n_pending
        if out.target_replicas > have:
            pending.append([k + STARTUP_WINDOWS, out.target_replicas - have])
        cut = have - out.target_replicas
        while cut > 0 and pending:  # the newest starting replicas go first
            take = min(cut, pending[-1][1])
            pending[-1][1] -= take
            cut -= take
            if pending[-1][1] == 0:
                pending.pop()
        ready -= max(cut, 0)
    return errors, targets


def reversals(targets: list[int]) -> int:
    """Direction changes of the target (as sim/fastloop.py counts them)."""
    moves = [b - a for a, b in zip(targets, targets[1:], strict=False) if b != a]
    return sum(1 for a, b in zip(moves, moves[1:], strict=False) if (a > 0) != (b > 0))


WINDOWS = 600  # from 1.25 r*, with e = -eps_ref at most, fpid's integral needs ~300 windows down
SETTLED = 100  # the last windows: all inside the deadband
FPID_MAX_REVERSALS = 60


@pytest.mark.parametrize("controller", ["pid", "fpid"])
@settings(derandomize=True, max_examples=25, deadline=None)
@given(
    r_star=st.integers(min_value=2, max_value=30),
    start_ratio=st.floats(min_value=0.3, max_value=1.25),
    seed=st.integers(min_value=0, max_value=2**31),
)
@example(r_star=2, start_ratio=0.3, seed=0)
@example(r_star=30, start_ratio=1.25, seed=1)
@example(r_star=11, start_ratio=0.875, seed=0)  # fpid: the longest +-1 cycle found
def test_the_nonlinear_loop_enters_the_deadband_and_stays(
    controller: str, r_star: int, start_ratio: float, seed: int
) -> None:
    gains = PROPOSED_GAINS[controller]
    start = max(1, round(r_star * start_ratio))
    errors, targets = run_loop(controller, gains, r_star, start, seed, WINDOWS)
    # inside the deadband (the error after it is exactly 0) for the last SETTLED windows, at r*
    assert all(e == 0.0 for e in errors[-SETTLED:]), (errors[-SETTLED:][:5], targets[-5:])
    assert targets[-1] == r_star
    # no growing oscillation: once at r*, never more than one replica (the rounding) away
    first = targets.index(r_star)
    assert max(abs(t - r_star) for t in targets[first:]) <= 1
    # bounded reversals.  pid (integral only): an overshoot and its correction at most.  fpid:
    # its velocity P term retracts a replica whenever the error drops (a replica becomes ready,
    # or b(t) moves), even while the error is still positive: with the level near a rounding
    # edge that is a +-1 cycle (seen: 24 reversals in 120 windows at r* = 11), which the
    # integral ends; bounded, not growing, but it is flapping (reported, not certified away)
    bound = 2 if controller == "pid" else FPID_MAX_REVERSALS
    assert reversals(targets) <= bound
