"""Canary (gray release) controller for a new model version (docs/model.md §14 (canary)).

A new version takes a growing share of traffic, ``1 % -> 5 % -> 20 % ->
100 %`` by default (``stages``), holding each stage ``hold_s`` (one value,
or one per stage).  States::

    pending --start--> running(stage 0) --> running(1) --> ... --> promoted
                          |  any stage: a rollback rule fires  -->  rolled_back
                          |  abort(), or a stage stalls        -->  aborted

At every step the canary's and the stable version's observations of **the
same window** are compared.  Counts accumulate per stage (they restart at
each stage).  Roll back at once when any of these holds:

* error rate: ``errors / max(requests, min_judge_requests) > max_error_rate``
  (default 0.8 %).  Dividing by at least ``min_judge_requests`` (250) keeps
  a few early errors from condemning a healthy version, yet enough errors
  trip it before that many requests arrive (at 250 and 0.8 %: the 3rd error);
* P99: the window's canary P99 ``> max_p99_ms`` (default 800 ms), judged on
  windows with at least ``min_p99_requests`` (20) canary requests.  A P99 of
  fewer requests is mostly the maximum; at small stages the sequential test
  below judges the tail on the stage's counts instead;
* optional, relative to stable: the canary's stage error rate exceeds the
  stable one by more than ``max_error_rate_delta``, or its window P99 is above
  ``max_p99_ratio`` x stable's (each only when stable has as many requests).

Two sequential tests (:mod:`controllers.sequential`: a one-sided SPRT of
``H0: p <= p0`` against ``H1: p = p1``, rolled back when ``llr >= ln(1 /
sequential_alpha)``, so a version that satisfies ``H0`` is rolled back with
probability at most ``sequential_alpha``, 0.1 %, however many windows are
looked at) judge latency on the stage's *cumulative* counts ``k`` of ``n``
canary requests over a threshold, so a slow version is caught at the 1 %
stage, where no window holds 20 canary requests:

* **over the P99 limit** (the design source's rule, sequential): requests over
  ``max_p99_ms``; ``p0 = 1 %`` (P99 at the limit), ``p1 = limit_p1`` (5 %: the
  canary's P95 over the limit).
* **slower than stable** (relative, ``max_slowdown`` k = 2; None = off):
  requests over k x stable's window TTFT P95, on windows where stable has
  ``min_ref_requests`` (100).  If the canary's TTFT is at most k times
  stable's in distribution, a request exceeds that with probability at most
  5 %: ``p0 = 5 %``, ``p1 = slowdown_p1`` (50 %: the canary's median over k x
  stable's P95).  A version up to k times slower is not rolled back by it.

The counts are lower bounds from the canary's window quantiles
(:func:`exceedances`), which keeps the false-rollback bound.

Promote to the next stage (or to ``promoted`` after the last) when the
stage has been held ``hold_s`` **and** it saw ``min_requests_per_stage``
canary requests.  With ``max_stage_s`` set, a stage that lasts longer
without enough requests is ``aborted`` (stalled).

The share of all requests a bad version reaches before rollback
(:func:`expected_exposure`) is the time-weighted share of the stages passed::

    exposure = (sum_{i<k} share_i * hold_i + share_k * t_k) / (sum_{i<k} hold_i + t_k)

at a constant total rate, rollback at ``t_k`` seconds into stage ``k``;
:attr:`CanaryState.exposure` measures it from the counts.

Examples
--------
>>> p = CanaryParams(hold_s=60.0, min_requests_per_stage=10)
>>> s = start(p, now_s=0.0)
>>> s, out = step(p, s, VersionObs(1000, 10, 300.0), VersionObs(99000, 10, 300.0), 10.0)
>>> out.state_name, out.traffic_share     # 1 % errors at the 1 % stage
('rolled_back', 0.0)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from controllers.errors import ParameterError, check_int, check_number
from controllers.sequential import quantile_exceedances, sprt_bound, sprt_llr

__all__ = [
    "CanaryOutput",
    "CanaryParams",
    "CanaryState",
    "VersionObs",
    "abort",
    "exceedances",
    "expected_exposure",
    "sprt_llr",
    "start",
    "step",
    "traffic_share",
]

StateName = Literal["pending", "running", "promoted", "rolled_back", "aborted"]
TERMINAL = ("promoted", "rolled_back", "aborted")
LIMIT_P0 = 0.01  # share of requests over max_p99_ms when the P99 is at the limit
SLOWDOWN_P0 = 0.05  # share over k x stable's P95 when the canary is at most k times slower


@dataclass(frozen=True)
class CanaryParams:
    """Stages, holds and rollback limits (validated).

    Defaults: ``stages``, ``max_error_rate`` and ``max_p99_ms`` are the design source's, the
    rest governor's choices (docs/model.md §14 (canary)).

    Examples
    --------
    >>> CanaryParams(stages=(0.05, 0.01, 1.0))
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: stages=(0.05, 0.01, 1.0): must increase strictly within (0, 1]
    """

    stages: tuple[float, ...] = (0.01, 0.05, 0.20, 1.0)
    hold_s: float | tuple[float, ...] = 300.0
    max_error_rate: float = 0.008
    max_p99_ms: float = 800.0
    min_requests_per_stage: int = 500
    min_judge_requests: int = 250
    min_p99_requests: int = 20
    max_error_rate_delta: float | None = None
    max_p99_ratio: float | None = None
    max_stage_s: float | None = None
    sequential_alpha: float = 0.001
    limit_p1: float = 0.05
    max_slowdown: float | None = 2.0
    slowdown_p1: float = 0.5
    min_ref_requests: int = 100

    def __post_init__(self) -> None:
        st = self.stages
        if (
            not isinstance(st, tuple)
            or not st
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in st)
            or not all(0.0 < x <= 1.0 for x in st)
            or any(b <= a for a, b in zip(st, st[1:], strict=False))
        ):
            raise ParameterError(f"stages={st!r}: must increase strictly within (0, 1]")
        holds = self.hold_s if isinstance(self.hold_s, tuple) else (self.hold_s,) * len(st)
        if len(holds) != len(st):
            raise ParameterError(f"hold_s={self.hold_s!r}: needs one hold per stage ({len(st)})")
        for h in holds:
            check_number("hold_s", h, 0.0)
        if not 0.0 < check_number("max_error_rate", self.max_error_rate, 0.0) < 1.0:
            raise ParameterError(f"max_error_rate={self.max_error_rate}: must lie in (0, 1)")
        check_number("max_p99_ms", self.max_p99_ms, 0.0, strict=True)
        for name in ("min_requests_per_stage", "min_judge_requests", "min_p99_requests", "min_ref_requests"):
            check_int(name, getattr(self, name))
        if not 0.0 < check_number("sequential_alpha", self.sequential_alpha, 0.0) < 1.0:
            raise ParameterError(f"sequential_alpha={self.sequential_alpha}: must lie in (0, 1)")
        for name, p0 in (("limit_p1", LIMIT_P0), ("slowdown_p1", SLOWDOWN_P0)):
            if not p0 < check_number(name, getattr(self, name), 0.0) < 1.0:
                raise ParameterError(f"{name}={getattr(self, name)}: must lie in ({p0:g}, 1)")
        if self.max_slowdown is not None and check_number("max_slowdown", self.max_slowdown, 0.0) < 1.0:
            raise ParameterError(f"max_slowdown={self.max_slowdown}: must be >= 1")
        if self.max_error_rate_delta is not None:
            check_number("max_error_rate_delta", self.max_error_rate_delta, 0.0)
        if self.max_p99_ratio is not None and check_number("max_p99_ratio", self.max_p99_ratio, 0.0) < 1.0:
            raise ParameterError(f"max_p99_ratio={self.max_p99_ratio}: must be >= 1")
        if self.max_stage_s is not None and check_number("max_stage_s", self.max_stage_s, 0.0) < max(holds):
            raise ParameterError(f"max_stage_s={self.max_stage_s}: must be >= every hold_s")

    def hold(self, stage: int) -> float:
        """Hold time of stage ``stage`` in seconds."""
        return float(self.hold_s[stage] if isinstance(self.hold_s, tuple) else self.hold_s)


@dataclass(frozen=True)
class VersionObs:
    """One version's requests, errors and TTFT quantiles over the window just closed.

    Quantiles are None when unknown (or the window had no requests).
    """

    requests: int
    errors: int
    p99_ms: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None

    def __post_init__(self) -> None:
        check_int("requests", self.requests)
        if check_int("errors", self.errors) > self.requests:
            raise ParameterError(f"errors={self.errors}: exceeds requests={self.requests}")
        for name in ("p50_ms", "p95_ms", "p99_ms"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), 0.0)


def exceedances(obs: VersionObs, threshold_ms: float) -> int:
    """At least how many of the window's requests had a TTFT over ``threshold_ms``.

    :func:`controllers.sequential.quantile_exceedances` of the window's P50,
    P95 and P99.

    Examples
    --------
    >>> exceedances(VersionObs(4, 0, p99_ms=900.0, p50_ms=850.0), 800.0)   # the 2 largest
    2
    >>> exceedances(VersionObs(100, 0, p99_ms=700.0, p50_ms=100.0), 800.0)
    0
    """
    return quantile_exceedances(
        obs.requests, ((0.50, obs.p50_ms), (0.95, obs.p95_ms), (0.99, obs.p99_ms)), threshold_ms
    )


@dataclass(frozen=True)
class CanaryState:
    """Rollout memory (JSON via to_dict/from_dict); ``CanaryState()`` is pending.

    Examples
    --------
    >>> s = CanaryState(name="running", stage=1, stage_started_s=5.0, stage_requests=7)
    >>> CanaryState.from_dict(s.to_dict()) == s
    True
    """

    name: StateName = "pending"
    stage: int = 0
    stage_started_s: float | None = None
    stage_requests: int = 0
    stage_errors: int = 0
    stable_requests: int = 0
    stable_errors: int = 0
    canary_total: int = 0
    all_total: int = 0
    reason: str = ""
    stage_over_limit: int = 0  # canary requests over max_p99_ms (lower bound)
    stage_slow: int = 0  # canary requests over max_slowdown x stable's P95 (lower bound)
    stage_ref_requests: int = 0  # canary requests of windows with a stable P95 to compare

    def __post_init__(self) -> None:
        if self.name not in ("pending", "running", *TERMINAL):
            raise ParameterError(f"name={self.name!r}: unknown canary state")
        if self.name == "running" and self.stage_started_s is None:
            raise ParameterError("stage_started_s=None: a running canary needs its stage start")

    @property
    def exposure(self) -> float:
        """Measured share of all requests the canary served so far."""
        return self.canary_total / self.all_total if self.all_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CanaryState:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


@dataclass(frozen=True)
class CanaryOutput:
    """The canary's traffic share after the step, and why."""

    traffic_share: float
    state_name: StateName
    changed: bool
    reason: str
    stage: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return asdict(self)


def traffic_share(params: CanaryParams, state: CanaryState) -> float:
    """Share of traffic for the canary: the stage's while running, 1 once promoted, else 0."""
    if state.name == "running":
        return params.stages[state.stage]
    return 1.0 if state.name == "promoted" else 0.0


def start(params: CanaryParams, now_s: float) -> CanaryState:
    """Begin the rollout at the first stage.

    >>> start(CanaryParams(), 0.0).name
    'running'
    """
    return CanaryState(
        name="running",
        stage=0,
        stage_started_s=check_number("now_s", now_s, 0.0),
        reason=f"start at {params.stages[0]:.0%}",
    )


def abort(state: CanaryState, reason: str) -> CanaryState:
    """Stop a pending or running rollout (traffic back to stable).

    A rollout that already ended (promoted, rolled back or aborted) is
    returned unchanged.

    >>> abort(start(CanaryParams(), 0.0), "operator").name
    'aborted'
    """
    if state.name in TERMINAL:
        return state
    return replace(state, name="aborted", reason=f"aborted: {reason}")


def _rollback_reason(p: CanaryParams, s: CanaryState, canary: VersionObs, stable: VersionObs) -> str | None:
    judged = s.stage_errors / max(s.stage_requests, p.min_judge_requests, 1)
    if judged > p.max_error_rate:
        return f"error rate {s.stage_errors}/{s.stage_requests} (judged {judged:.4%}) > {p.max_error_rate:.2%}"
    if canary.p99_ms is not None and canary.requests >= max(p.min_p99_requests, 1):
        if canary.p99_ms > p.max_p99_ms:
            return f"p99 {canary.p99_ms:g} ms > {p.max_p99_ms:g} ms"
        if (
            p.max_p99_ratio is not None
            and stable.p99_ms is not None
            and stable.requests >= max(p.min_p99_requests, 1)
            and canary.p99_ms > p.max_p99_ratio * stable.p99_ms
        ):
            return f"p99 {canary.p99_ms:g} ms > {p.max_p99_ratio:g} x stable {stable.p99_ms:g} ms"
    bound = sprt_bound(p.sequential_alpha)
    llr = sprt_llr(s.stage_over_limit, s.stage_requests, LIMIT_P0, p.limit_p1)
    if llr >= bound:
        return (
            f"{s.stage_over_limit}/{s.stage_requests} requests over {p.max_p99_ms:g} ms "
            f"(sequential test, llr {llr:.2f} >= {bound:.2f}: p99 over the limit)"
        )
    llr = sprt_llr(s.stage_slow, s.stage_ref_requests, SLOWDOWN_P0, p.slowdown_p1)
    if p.max_slowdown is not None and llr >= bound:
        return (
            f"{s.stage_slow}/{s.stage_ref_requests} requests over {p.max_slowdown:g} x "
            f"stable's p95 (sequential test, llr {llr:.2f} >= {bound:.2f})"
        )
    if p.max_error_rate_delta is not None and s.stable_requests >= max(p.min_judge_requests, 1):
        stable_rate = s.stable_errors / s.stable_requests
        if judged > stable_rate + p.max_error_rate_delta:
            return f"error rate {judged:.4%} > stable {stable_rate:.4%} + {p.max_error_rate_delta:.2%}"
    return None


def step(
    params: CanaryParams, state: CanaryState, canary: VersionObs, stable: VersionObs, now_s: float
) -> tuple[CanaryState, CanaryOutput]:
    """Judge one window of both versions and move the rollout on (pure).

    Parameters
    ----------
    params : CanaryParams
    state : CanaryState
        From :func:`start` (or ``CanaryState()``: pending, nothing happens).
    canary, stable : VersionObs
        The two versions over the same window.
    now_s : float
        End of that window, seconds.

    Returns
    -------
    (CanaryState, CanaryOutput)

    Examples
    --------
    >>> p = CanaryParams(stages=(0.1, 1.0), hold_s=20.0, min_requests_per_stage=5)
    >>> s = start(p, 0.0)
    >>> for t in (10.0, 20.0):
    ...     s, out = step(p, s, VersionObs(10, 0, 200.0), VersionObs(90, 0, 200.0), t)
    >>> out.state_name, out.traffic_share, out.reason
    ('running', 1.0, 'promote to 100%')
    """
    now = check_number("now_s", now_s, 0.0)
    if state.name != "running":
        return state, CanaryOutput(
            traffic_share(params, state), state.name, False, state.reason or state.name, state.stage
        )
    assert state.stage_started_s is not None
    ref = stable.p95_ms if stable.requests >= max(params.min_ref_requests, 1) else None
    slow = 0 if ref is None or params.max_slowdown is None else exceedances(canary, params.max_slowdown * ref)
    s = replace(
        state,
        stage_requests=state.stage_requests + canary.requests,
        stage_over_limit=state.stage_over_limit + exceedances(canary, params.max_p99_ms),
        stage_slow=state.stage_slow + slow,
        stage_ref_requests=state.stage_ref_requests + (0 if ref is None else canary.requests),
        stage_errors=state.stage_errors + canary.errors,
        stable_requests=state.stable_requests + stable.requests,
        stable_errors=state.stable_errors + stable.errors,
        canary_total=state.canary_total + canary.requests,
        all_total=state.all_total + canary.requests + stable.requests,
    )
    why = _rollback_reason(params, s, canary, stable)
    if why is not None:
        s = replace(s, name="rolled_back", reason=f"rolled back at {params.stages[s.stage]:.0%}: {why}")
        return s, CanaryOutput(0.0, "rolled_back", True, s.reason, s.stage)
    elapsed = now - state.stage_started_s
    if elapsed >= params.hold(s.stage) and s.stage_requests >= params.min_requests_per_stage:
        if s.stage + 1 == len(params.stages):
            s = replace(s, name="promoted", reason="promoted")
            return s, CanaryOutput(1.0, "promoted", True, s.reason, s.stage)
        nxt = s.stage + 1
        s = replace(
            s,
            stage=nxt,
            stage_started_s=now,
            stage_requests=0,
            stage_errors=0,
            stable_requests=0,
            stable_errors=0,
            stage_over_limit=0,
            stage_slow=0,
            stage_ref_requests=0,
            reason=f"promote to {params.stages[nxt]:.0%}",
        )
        return s, CanaryOutput(params.stages[nxt], "running", True, s.reason, nxt)
    if params.max_stage_s is not None and elapsed > params.max_stage_s:
        s = abort(
            s,
            f"stalled at {params.stages[s.stage]:.0%}: {s.stage_requests}/"
            f"{params.min_requests_per_stage} requests after {elapsed:g} s",
        )
        return s, CanaryOutput(0.0, "aborted", True, s.reason, s.stage)
    why = (
        f"holding {params.stages[s.stage]:.0%}: {elapsed:g}/{params.hold(s.stage):g} s, "
        f"{s.stage_requests}/{params.min_requests_per_stage} requests"
    )
    return s, CanaryOutput(params.stages[s.stage], "running", False, why, s.stage)


def expected_exposure(params: CanaryParams, stage: int, elapsed_in_stage_s: float | None = None) -> float:
    """Share of all requests served by the canary if it is rolled back at ``stage``.

    Time-weighted over the stages passed (each held exactly ``hold_s``) and
    ``elapsed_in_stage_s`` of the current one (default: its whole hold, the
    worst case for that stage), at a constant total request rate.

    Examples
    --------
    >>> p = CanaryParams(hold_s=60.0)
    >>> expected_exposure(p, 0)                       # caught at the 1 % stage
    0.01
    >>> round(expected_exposure(p, 2, 30.0), 4)       # (0.6 + 3 + 6) / 150
    0.064
    """
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < len(params.stages):
        raise ParameterError(f"stage={stage!r}: must index params.stages")
    t_k = (
        params.hold(stage)
        if elapsed_in_stage_s is None
        else check_number("elapsed_in_stage_s", elapsed_in_stage_s, 0.0)
    )
    served = sum(params.stages[i] * params.hold(i) for i in range(stage))
    served += params.stages[stage] * t_k
    total = sum(params.hold(i) for i in range(stage)) + t_k
    return served / total if total > 0 else params.stages[stage]
