"""When a cross-zone action lands: ``detail.apply_at_ms`` from the zones' measured delays (docs/model.md §17 (hlc)).

Clock domains.  Redis ``TIME`` is the one reference clock: every executor
estimates ``offset = Redis - its clock`` (NTP style, :mod:`executors.timing`)
and holds a command until its clock corrected by that offset reaches
``apply_at_ms``; the worker estimates its own offset the same way.  So
``apply_at_ms`` is on the reference clock (scaled like the run clock when
``GOVERNOR_CLOCK_SPEED`` is not 1)::

    apply_at = worker_now + worker_offset + min(max_lead, lead)
    lead     = max over the involved zones whose executor is alive of lead_z, + margin

``lead_z`` is what the zone's executor measured and published in its
heartbeat (``timing.lead_ms``): the delay from the bridge's ``XADD`` (the
entry id is Redis's clock) to the command being ready to apply, plus the
checks its release repeats and one Redis round trip of poll wake-up.  A zone
whose executor is gone is left out (it applies nothing soon; when it comes
back the time is past and it applies at once).  A live zone without a valid,
fresh measurement, or a worker that has not measured its own offset yet,
gives the fixed ``fallback_ms`` lead instead (bounded: never blocks an
action).  Actions for one zone carry no ``apply_at_ms`` and are not delayed.

Pure: a frozen value and functions that return new ones; the worker reads
the heartbeats and Redis ``TIME`` and passes them in.

>>> p = ApplyAtParams(margin_ms=20, fallback_ms=500, max_lead_ms=2000, stale_ms=15_000)
>>> hb = {"az-a": {"timing": {"lead_ms": 40.0, "offset_error_ms": 0.5, "age_ms": 10}},
...       "az-b": {"timing": {"lead_ms": 300.0, "offset_error_ms": 2.0, "age_ms": 10}}}
>>> planner = ApplyAtPlanner(p).observe(hb, 1_000, clock=(995.0, 1_010.0, 1_005.0))
>>> planner.plan(1_000, ["az-a", "az-b"], alive=None)
ApplyAt(at_ms=1330, lead_ms=320.0, basis='measured', skew_bound_ms=2.5)
>>> planner.plan(1_000, ["az-a"], alive=None) is None  # one zone: not delayed
True
>>> planner.plan(1_000, ["az-a", "az-c"], alive=None).basis  # az-c never measured
'fallback'
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controllers.errors import ParameterError, check_number
from controllers.hlc import ClockOffsetEstimator

__all__ = ["ApplyAt", "ApplyAtParams", "ApplyAtPlanner", "ZoneLead", "parse_zone_lead"]

#: The largest measured lead believed (ms): anything above is a broken or hostile heartbeat.
LEAD_CAP_MS = 60_000.0


@dataclass(frozen=True)
class ApplyAtParams:
    """``margin_ms`` added to the largest measured lead; ``fallback_ms`` the fixed lead without a measurement;
    ``max_lead_ms`` the most any action is put off (0: no ``apply_at_ms`` at all); ``stale_ms`` the age past
    which a measurement counts as absent (wall ms, all four)."""

    margin_ms: float = 50.0
    fallback_ms: float = 1_000.0
    max_lead_ms: float = 3_000.0
    stale_ms: float = 15_000.0

    def __post_init__(self) -> None:
        lead, fallback = (check_number(n, getattr(self, n), 0.0) for n in ("max_lead_ms", "fallback_ms"))
        check_number("margin_ms", self.margin_ms, 0.0)
        check_number("stale_ms", self.stale_ms, 0.0)
        if lead and fallback > lead:
            raise ParameterError(f"fallback_ms={fallback}: must not exceed max_lead_ms={lead}")


@dataclass(frozen=True)
class ZoneLead:
    """One zone executor's published timing (wall ms): its lead, its clock-offset error bound, and when it was
    read (``seen_ms``, the worker's run clock)."""

    lead_ms: float
    offset_error_ms: float
    seen_ms: int


@dataclass(frozen=True)
class ApplyAt:
    """A plan: ``at_ms`` on the reference clock, the ``lead_ms`` (run ms) it adds, whether it was ``measured``
    or the ``fallback``, and the skew the offset estimates allow (the two largest error bounds, wall ms)."""

    at_ms: int
    lead_ms: float
    basis: str
    skew_bound_ms: float

    def detail(self) -> dict[str, Any]:
        """The fields a command's ``detail`` carries."""
        return {
            "apply_at_ms": self.at_ms,
            "apply_lead_ms": round(self.lead_ms, 3),
            "apply_basis": self.basis,
            "apply_skew_bound_ms": round(self.skew_bound_ms, 3),
        }


def _number(raw: Mapping[str, Any], name: str, cap: float) -> float:
    v = raw.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= cap:
        raise ParameterError(f"timing.{name}={v!r}: must be a number in [0, {cap:g}]")
    return float(v)


def parse_zone_lead(beat: Any, seen_ms: int, stale_ms: float) -> tuple[ZoneLead | None, str]:
    """A heartbeat's ``timing`` as a :class:`ZoneLead`, or None and why it is not believed ("" when it has none).

    >>> parse_zone_lead({"timing": {"lead_ms": 12, "offset_error_ms": 1, "age_ms": 5}}, 7, 1000)
    (ZoneLead(lead_ms=12.0, offset_error_ms=1.0, seen_ms=7), '')
    >>> parse_zone_lead({"timing": {"lead_ms": -1, "offset_error_ms": 1, "age_ms": 5}}, 7, 1000)[1]
    'timing.lead_ms=-1: must be a number in [0, 60000]'
    >>> parse_zone_lead({"timing": {"lead_ms": 1, "offset_error_ms": 1, "age_ms": 5000}}, 7, 1000)[1]
    'stale: measured 5000 ms before the heartbeat (limit 1000)'
    """
    timing = beat.get("timing") if isinstance(beat, Mapping) else None
    if timing is None:
        return None, ""
    if not isinstance(timing, Mapping):
        return None, "timing is not an object"
    try:
        lead, err = _number(timing, "lead_ms", LEAD_CAP_MS), _number(timing, "offset_error_ms", LEAD_CAP_MS)
        age = _number(timing, "age_ms", math.inf)
    except ParameterError as exc:
        return None, str(exc)
    if age > stale_ms:
        return None, f"stale: measured {age:g} ms before the heartbeat (limit {stale_ms:g})"
    return ZoneLead(lead, err, seen_ms), ""


@dataclass(frozen=True)
class ApplyAtPlanner:
    """What the worker knows of the zones' timing, and the ``apply_at_ms`` of a cross-zone action (a value)."""

    params: ApplyAtParams = field(default_factory=ApplyAtParams)
    speed: float = 1.0  # run ms per wall ms
    leads: Mapping[str, ZoneLead] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)  # zone -> why its timing is not believed
    clock: ClockOffsetEstimator = field(default_factory=ClockOffsetEstimator)  # the worker's, against Redis

    def observe(
        self,
        beats: Mapping[str, Any] | None,
        now_ms: int,
        clock: tuple[float, float, float] | None = None,
    ) -> ApplyAtPlanner:
        """The heartbeats read (decoded JSON by zone; None: no view, the last ones kept) and one exchange
        ``(t0, redis_time, t3)`` of the worker's wall clock against Redis ``TIME`` (None: none this time)."""
        out = self
        if clock is not None:
            t0, server, t3 = clock
            try:
                out = replace(out, clock=out.clock.sample(t0, server, server, t3))
            except ParameterError:
                pass  # a clock that stepped back mid-exchange: the sample is dropped
        if beats is None:
            return out
        leads, refused = {}, {}
        for zone, beat in beats.items():
            lead, why = parse_zone_lead(beat, now_ms, self.params.stale_ms)
            if lead is not None:
                leads[zone] = lead
            elif why:
                refused[zone] = why
        return replace(out, leads=leads, refused=refused)

    def plan(self, now_ms: int, zones: Collection[str], alive: Collection[str] | None) -> ApplyAt | None:
        """The ``apply_at_ms`` of an action for ``zones`` decided at ``now_ms`` (the worker's run clock), or None
        for one zone or with ``max_lead_ms`` 0.  ``alive``: the zones whose executor heartbeat is present
        (None: unknown, every zone counts)."""
        p = self.params
        involved = set(zones)
        if len(involved) < 2 or p.max_lead_ms <= 0:
            return None
        live = [z for z in sorted(involved) if alive is None or z in alive]
        stale_run_ms = p.stale_ms * self.speed
        measured = [self.leads[z] for z in live if z in self.leads and now_ms - self.leads[z].seen_ms <= stale_run_ms]
        if live and len(measured) == len(live) and self.clock.samples:
            lead, basis = max(m.lead_ms for m in measured) + p.margin_ms, "measured"
        else:
            lead, basis = p.fallback_ms, "fallback"
        lead = min(lead, p.max_lead_ms)
        errors = sorted((m.offset_error_ms for m in measured), reverse=True)[:2]
        at = now_ms + (self.clock.offset_ms() + lead) * self.speed
        return ApplyAt(int(math.ceil(at)), lead * self.speed, basis, sum(errors))
