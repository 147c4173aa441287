"""Online retuning of the scaling gains: the pure parts (docs/model.md §4 (pid), "Online retuning").

The worker keeps a bounded ring of each key's recent zone windows (:class:`WindowSample`); every
retune period it fits the fast simulator to them (:func:`fit`: the arrival schedule from the
windows' request counts, their token sizes, the key's learned capacity and measured start-up) and
searches the gains there off its event loop (:mod:`sim.retune`), with :func:`search` and the
objective of ``governor tune`` (:func:`objective`).  What it proposes moves the gains in force by
at most :data:`MAX_STEP_REL` a period (:func:`bounded_step`), and only where the certificate of
``governor analyze gains`` accepts the gains stepped to (:func:`controllers.gain_certificate.gate`);
:func:`apply_decision` says what the worker does with a result in each mode.

**The search** is a compass (pattern) search over ``kp``, ``ki``, ``kd`` and ``ki_down``
(:data:`SEARCHED`) inside a box scaled to the top of the plant-gain interval (``governor tune``'s
box), started at the gains in force: each trial moves one gain by its step up or down, keeps the
first that scores lower, and halves every step after a sweep that finds none.  A budget of a
dozen trials in four dimensions is too few points for a Bayesian surrogate to model the
objective (``governor tune``'s TPE runs 20 trials on six knots and still spends a third on
uncertified points); a pattern search needs no model, is deterministic, and stays near the
gains in force, where the bounded step will take the loop anyway.  Every call of the score
counts as a trial: at most ``trials`` (:func:`search`).

>>> box = search_box(4.21)
>>> calls = []
>>> def score(g):
...     calls.append(g)
...     return (g["ki"] - 0.02) ** 2 + g["kp"] ** 2 + g["kd"] ** 2
>>> res = search(score, {"kp": 0.0, "ki": 0.0235, "kd": 0.0, "ki_down": 0.0105}, box, 8)
>>> len(calls) <= 8, res.best["ki"] < 0.0235
(True, True)
>>> {k: round(v, 5) for k, v in bounded_step({"ki": 0.02, "kp": 0.0}, {"ki": 0.05, "kp": 0.2}, box).items()}
{'ki': 0.025, 'kp': 0.00713}
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controllers.errors import ParameterError
from controllers.window_record import WindowRecord
from core.settings import Settings

__all__ = [
    "MAX_STEP_REL",
    "MIN_WINDOWS",
    "MODES",
    "SEARCHED",
    "ApplyDecision",
    "PlantFit",
    "RetuneJob",
    "SearchResult",
    "WindowRing",
    "WindowSample",
    "apply_decision",
    "bounded_step",
    "fit",
    "objective",
    "search",
    "search_box",
]

#: ``GOVERNOR_RETUNE``: ``off`` (nothing kept, nothing searched), ``shadow`` (proposals searched and
#: shown in ``governor status``, never applied) or ``apply`` (moved to, in bounded steps, when certified).
MODES = ("off", "shadow", "apply")
#: The gains searched (kd included): the feedforward's knobs stay as configured.
SEARCHED = ("kp", "ki", "kd", "ki_down")
#: The most a gain moves in one retune period, relative to the larger of its value and a tenth of its box.
MAX_STEP_REL = 0.25
#: A key's ring must hold this many windows before it is fitted (one minute at 10 s windows).
MIN_WINDOWS = 6
#: The ring's bound: windows kept per key at most (an hour at 10 s windows).
MAX_RING_WINDOWS = 360


@dataclass(frozen=True)
class WindowSample:
    """What the fit reads of one closed zone window (plain numbers: it crosses to the search process)."""

    window_end_ms: int
    window_s: float
    count: int
    prompt_tokens: int
    output_tokens: int
    replicas_ready: int
    replicas_starting: int

    @classmethod
    def of(cls, w: WindowRecord) -> WindowSample:
        return cls(
            w.window_end_ms,
            w.window_s,
            w.count,
            w.prompt_tokens,
            w.output_tokens,
            w.replicas_ready,
            w.replicas_starting,
        )


class WindowRing:
    """The last ``size`` windows of each key ``(model, zone)``, oldest first (bounded: :data:`MAX_RING_WINDOWS`)."""

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_RING_WINDOWS:
            raise ParameterError(f"ring size={size!r}: must be an int in [1, {MAX_RING_WINDOWS}]")
        self.size = size
        self.keys: dict[tuple[str, str], deque[WindowSample]] = {}

    def add(self, model: str, zone: str, sample: WindowSample) -> None:
        ring = self.keys.setdefault((model, zone), deque(maxlen=self.size))
        if ring and sample.window_end_ms <= ring[-1].window_end_ms:
            return  # a window already kept (redelivery)
        ring.append(sample)

    def of(self, model: str, zone: str) -> tuple[WindowSample, ...]:
        return tuple(self.keys.get((model, zone), ()))


@dataclass(frozen=True)
class PlantFit:
    """The fast simulator fitted to one key's recent windows: per window its request count and mean
    prompt and output tokens, the replica capacity learned live (None: no feedforward profile), the
    measured start-up and the fleet the last window had."""

    model: str
    zone: str
    window_s: float
    counts: tuple[int, ...]
    prompt_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    capacity_rps: float | None
    startup_s: float
    initial_replicas: int

    @property
    def duration_s(self) -> float:
        return self.window_s * len(self.counts)

    @property
    def rate_rps(self) -> float:
        return sum(self.counts) / self.duration_s if self.counts else 0.0


def fit(
    model: str, zone: str, samples: Sequence[WindowSample], capacity_rps: float | None, startup_s: float
) -> PlantFit | None:
    """The fit of one key (class docstring), or None with fewer than :data:`MIN_WINDOWS` windows
    or no request in them (nothing to fit: the search would only see an idle fleet).

    A window without requests keeps the previous window's token sizes (the first one's: the next
    window with requests)."""
    if len(samples) < MIN_WINDOWS or not any(s.count for s in samples):
        return None
    if not math.isfinite(startup_s) or startup_s < 0:
        raise ParameterError(f"startup_s={startup_s!r}: must be a finite number >= 0")
    first = next(s for s in samples if s.count)
    p_prev, o_prev = first.prompt_tokens / first.count, first.output_tokens / first.count
    prompts, outputs = [], []
    for s in samples:
        if s.count:
            p_prev, o_prev = s.prompt_tokens / s.count, s.output_tokens / s.count
        prompts.append(max(1.0, p_prev))
        outputs.append(max(1.0, o_prev))
    last = samples[-1]
    return PlantFit(
        model=model,
        zone=zone,
        window_s=float(last.window_s),
        counts=tuple(int(s.count) for s in samples),
        prompt_tokens=tuple(prompts),
        output_tokens=tuple(outputs),
        capacity_rps=capacity_rps,
        startup_s=float(startup_s),
        initial_replicas=max(1, last.replicas_ready + last.replicas_starting),
    )


def objective(
    gpu_s: float, reference_gpu_s: float, attainment: float, ceiling: float, target_share: float, penalty: float
) -> float:
    """One run's term of ``governor tune``'s objective (:mod:`bench.tune`): the GPU-seconds over the
    reference run's plus ``penalty`` per unit of attainment share (of the ceiling) below the target.
    A ceiling of 0 (no request any fleet serves within the SLO) leaves nothing to miss: share 1.

    >>> round(objective(900.0, 1000.0, 0.99, 1.0, 0.995, 1000.0), 6)
    5.9
    """
    share = attainment / ceiling if ceiling > 0 else 1.0
    ref = reference_gpu_s if reference_gpu_s > 0 else max(gpu_s, 1.0)
    return gpu_s / ref + penalty * max(0.0, target_share - share)


@dataclass(frozen=True)
class SearchBox:
    """The range searched of each gain of :data:`SEARCHED`."""

    lo: Mapping[str, float]
    hi: Mapping[str, float]


def search_box(plant_gain_hi: float) -> SearchBox:
    """``governor tune``'s box at the top of the plant-gain interval (the certificate bounds the loop
    gain ``b k``): ``ki`` up to ``0.12 / b``, ``kp`` and ``kd`` up to ``1.2 / b``; ``ki_down`` as ``ki``."""
    if not plant_gain_hi > 0:
        raise ParameterError(f"plant_gain_hi={plant_gain_hi!r}: must be > 0")
    ki_hi, kp_hi = 0.12 / plant_gain_hi, 1.2 / plant_gain_hi
    return SearchBox(
        lo={"kp": 0.0, "ki": ki_hi / 15.0, "kd": 0.0, "ki_down": ki_hi / 30.0},
        hi={"kp": kp_hi, "ki": ki_hi, "kd": kp_hi, "ki_down": ki_hi},
    )


@dataclass
class SearchResult:
    """The best gains found, their score, and every trial in order."""

    best: dict[str, float]
    best_score: float
    trials: list[tuple[dict[str, float], float]] = field(default_factory=list)


def _clip(name: str, value: float, box: SearchBox) -> float:
    return round(min(max(value, box.lo[name]), box.hi[name]), 7)


def search(
    score: Callable[[dict[str, float]], float], start: Mapping[str, float], box: SearchBox, trials: int
) -> SearchResult:
    """Compass search (module docstring) from ``start`` (brought inside the box): ``score`` is
    called at most ``trials`` times, the first at the start; lower is better."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ParameterError(f"trials={trials!r}: must be an int >= 1")
    best = {**{k: float(v) for k, v in start.items()}}
    for name in SEARCHED:
        best[name] = _clip(name, best.get(name, box.lo[name]), box)
    result = SearchResult(dict(best), score(dict(best)))
    result.trials.append((dict(best), result.best_score))
    steps = {n: 0.1 * (box.hi[n] - box.lo[n]) for n in SEARCHED}  # a tenth: most of a wider move is uncertified
    while len(result.trials) < trials and max(steps.values()) > 1e-6:
        moved = False
        for name in SEARCHED:
            for sign in (1.0, -1.0):
                if len(result.trials) >= trials:
                    return result
                cand = {**result.best, name: _clip(name, result.best[name] + sign * steps[name], box)}
                if cand[name] == result.best[name]:
                    continue  # at the box's edge: no trial spent
                s = score(dict(cand))
                result.trials.append((dict(cand), s))
                if s < result.best_score:
                    result.best, result.best_score, moved = cand, s, True
                    break
        if not moved:
            steps = {n: v / 2.0 for n, v in steps.items()}
    return result


def bounded_step(
    current: Mapping[str, float], proposed: Mapping[str, float], box: SearchBox, max_rel: float = MAX_STEP_REL
) -> dict[str, float]:
    """``current`` moved towards ``proposed``, each gain of :data:`SEARCHED` by at most ``max_rel``
    times the larger of its value and a tenth of its box's top (so a gain at 0 can start to move);
    the other gains as in ``current``."""
    if not 0.0 < max_rel <= 1.0:
        raise ParameterError(f"max_rel={max_rel!r}: must be in (0, 1]")
    out = dict(current)
    for name in SEARCHED:
        if name not in proposed:
            continue
        cur = float(current.get(name, proposed[name]))
        allowed = max_rel * max(abs(cur), 0.1 * box.hi[name])
        out[name] = cur + min(max(float(proposed[name]) - cur, -allowed), allowed)
    return out


@dataclass(frozen=True)
class RetuneJob:
    """One model's retune: its fitted keys, the gains in force, the trial budget (plain, picklable)."""

    model: str
    settings: Settings
    fits: tuple[PlantFit, ...]
    current: Mapping[str, float]
    trials: int
    at_ms: int
    seed: int = 0
    sdp: bool | None = None  # None: where cvxpy is importable
    max_step: float = MAX_STEP_REL


@dataclass(frozen=True)
class ApplyDecision:
    """What the worker does with one retune result: the gains to put in force (None: none changes)
    and the action shown in ``governor status`` (``applied``, ``shadow``, ``refused``, ``hold``,
    ``reverted``, ``stale``) with its reason."""

    gains: dict[str, float] | None
    action: str
    reason: str


def apply_decision(
    mode: str,
    killed: bool,
    result: Mapping[str, Any],
    in_force: Mapping[str, float],
    configured: Mapping[str, float],
) -> ApplyDecision:
    """The worker's move for ``result`` (:func:`sim.retune.propose`'s dict: ``current``, ``step``,
    ``step_gate``, ``expected``) in ``mode`` (fail safe: anything but a certified, better step in
    ``apply`` mode with the kill switch off changes nothing).

    The kill switch (``governor pause --retune``) puts the configured gains back in force at once
    and applies nothing until it is cleared."""
    if mode not in MODES:
        raise ParameterError(f"retune mode={mode!r}: choose one of {', '.join(MODES)}")
    if killed:
        if dict(in_force) != dict(configured):
            return ApplyDecision(dict(configured), "reverted", "kill switch set: the configured gains are back")
        return ApplyDecision(None, "hold", "kill switch set (governor resume --retune clears it)")
    if mode != "apply":
        return ApplyDecision(None, "shadow", f"GOVERNOR_RETUNE={mode}: proposal shown, not applied")
    if dict(result.get("current", {})) != dict(in_force):
        return ApplyDecision(None, "stale", "the gains in force changed while the search ran")
    gate = result.get("step_gate") or {}
    if not result.get("expected"):  # nothing was searched (sim.retune: no servable request in the fit)
        return ApplyDecision(None, "hold", str(gate.get("note") or "nothing searched"))
    if not gate.get("accepted"):
        why = "; ".join(gate.get("reasons") or ["no certificate"])
        return ApplyDecision(None, "refused", f"not certified: {why}")
    exp = result.get("expected") or {}
    cur, prop = (exp.get("current") or {}).get("objective"), (exp.get("proposed") or {}).get("objective")
    if cur is None or prop is None or not prop < cur:
        return ApplyDecision(None, "hold", "the proposal is not better than the gains in force on the fit")
    step = {k: float(v) for k, v in result["step"].items()}
    if step == dict(in_force):
        return ApplyDecision(None, "hold", "already at the proposal")
    return ApplyDecision(step, "applied", "certified step towards the proposal")
