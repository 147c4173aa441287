"""Zone-aware capacity: detect a lost zone, shift its demand and routing to the
others, hand them back when it heals, and (optionally) keep N+k standing floors.

The per-(model, zone) controllers in :mod:`loop.scaler_driver` see one zone each;
a zone that is cut off stops reporting, and its traffic lands on the others
only as a rerouted load that their feedback and feedforward must notice first.
This module looks across the zones of one model and turns their windows into

* a **status** per zone: ``up`` (serving its share), ``lost`` (cut off),
  ``healing`` (reporting again, its capacity starting, no traffic yet);
* a **demand floor** per zone in requests/s, which the caller's feedforward
  sizes against (``max(own demand, floor)``);
* **routing weights** over the zones (the share of the model's traffic each
  zone should get), and events when they change.

Detection (timeout in windows, ``loss_timeout_windows``, default 2)
    A zone that had demand (its arrival EWMA >= ``min_demand_rps``) is *lost*
    when either its windows stop arriving -- another zone has reported a
    window ending ``(loss_timeout_windows + 1)`` windows after the zone's last
    one, i.e. it missed ``loss_timeout_windows`` windows in a row, and its
    executor's heartbeat is gone too (``alive``; telemetry that stops while the
    zone's executor still runs is missing data, held, never a loss) -- or its
    windows show nothing provisioned (``ready + starting == 0``) for
    ``loss_timeout_windows`` windows in a row.  With 10 s windows a cut is
    declared 20-30 s after the zone's last window.
Shift (on loss)
    The lost zone's recent demand (its arrival EWMA when it was lost) is split
    over the zones still up by their routing shares; each survivor's floor
    becomes its own demand then plus its part of the lost demand, at once (the
    window that detects the loss already sizes for it).  The floor holds while
    the zone is lost, at most ``shift_hold_windows`` windows (by then the
    survivors' own loops have measured the rerouted load), and is released
    ``release_windows`` windows after the lost zone takes its traffic back.
Heal and return (hysteresis)
    A lost zone that reports a window with capacity provisioned is *healing*:
    its floor is its share of the current total demand (so its replicas are
    sized for what it will get), but its routing weight stays 0 until its
    *ready* replicas reach ``return_ready_fraction`` of what that share needs
    (``floor / (capacity_rps x target_util)``; without a capacity profile: all
    of its provisioned replicas ready), or ``max_heal_windows`` windows have
    passed.  Only then does it get its traffic back (``zone_returned``); the
    survivors keep their floors ``release_windows`` more windows, and the
    returned zone keeps its own as long.  So traffic never goes to a zone with
    nothing ready, and a zone must be silent ``loss_timeout_windows`` windows
    to be lost again: no flapping on one late window.
Redundancy (``redundancy = k``, ``GOVERNOR_ZONE_REDUNDANCY``)
    Each zone's floor is sized so that the zones left after any ``k`` losses
    carry the whole demand without a scale-up: its own demand plus its share
    of the ``k`` largest other zones' demands, ``d_z + sum(top-k d_o) /
    (n - k)``; with equal shares that is ``D / (n - k)`` per zone, i.e. its
    share times ``n / (n - k)`` (2 zones, k = 1: every zone sized for the whole
    demand; 3 zones: for half of it).  While zones are lost the budget left is
    ``k - lost`` (a lost zone's shift is what the floors were for).

Pure: frozen parameters, an explicit frozen state, functions of them; no I/O,
no clock (times are the windows' end timestamps).

Examples
--------
Two zones with 6 and 4 requests/s; az-b stops reporting after its window
ending at 20 s.  When az-a's window ending at 40 s arrives, az-b has missed
one window (the one ending at 30 s; the one ending at 40 s may still come):
not yet lost.  At 50 s it has missed two: lost, and az-a's floor is its 6
plus az-b's 4.

>>> p = ZoneCapacityParams(zones=("az-a", "az-b"), window_s=10.0, demand_alpha=1.0)
>>> s = ZoneCapacityState()
>>> for end in (10_000, 20_000):
...     s, _ = observe(p, s, "az-a", ZoneWindow(end, 6.0, 3, 0))
...     s, _ = observe(p, s, "az-b", ZoneWindow(end, 4.0, 2, 0))
>>> for end in (30_000, 40_000):
...     s, ev = observe(p, s, "az-a", ZoneWindow(end, 6.0, 3, 0))
>>> ev
[]
>>> s, ev = observe(p, s, "az-a", ZoneWindow(50_000, 6.0, 3, 0)); [e.kind for e in ev]
['zone_lost']
>>> floor_rps(p, s, "az-a", 50_000), weights(p, s)
(10.0, {'az-a': 1.0, 'az-b': 0.0})
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from controllers.errors import ParameterError
from core.defaults import WINDOW_S

__all__ = [
    "HEALING",
    "LOST",
    "UP",
    "ZoneCapacityParams",
    "ZoneCapacityState",
    "ZoneEvent",
    "ZoneState",
    "ZoneWindow",
    "floor_rps",
    "observe",
    "weights",
]

UP, LOST, HEALING = "up", "lost", "healing"
_NEVER = -1


@dataclass(frozen=True)
class ZoneCapacityParams:
    """Parameters of the zone-aware capacity logic of one model (validated)."""

    zones: tuple[str, ...]
    window_s: float = WINDOW_S
    loss_timeout_windows: int = 2  # missed (or dark) windows before a zone with demand is lost
    min_demand_rps: float = 0.05  # a zone below this had no demand: its silence is no loss
    demand_alpha: float = 0.3  # EWMA weight of each zone's newest arrival rate
    return_ready_fraction: float = 0.9  # healing zone gets traffic back at this share of its need ready
    max_heal_windows: int = 8  # ... or after this many windows of healing, whatever is ready
    release_windows: int = 3  # floors kept this long after a healed zone takes its traffic back
    shift_hold_windows: int = 30  # a survivor's shift floor holds at most this long after a loss
    redundancy: int = 0  # zone losses absorbed by standing capacity (1 = N+1 zones)
    capacity_rps: float | None = None  # one replica's rate within the SLO (for the return test)
    target_util: float = 0.8

    def __post_init__(self) -> None:
        if not self.zones or len(set(self.zones)) != len(self.zones):
            raise ParameterError(f"zones={self.zones!r}: need at least one zone, no duplicates")
        for name in ("window_s", "target_util"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ParameterError(f"{name}={v!r}: must be a finite number > 0")
        if self.target_util > 2.0:  # the feedforward's (above 1: replicas planned hotter than their capacity)
            raise ParameterError(f"target_util={self.target_util}: must lie in (0, 2]")
        if not 0.0 < self.demand_alpha <= 1.0:
            raise ParameterError(f"demand_alpha={self.demand_alpha}: must lie in (0, 1]")
        if not 0.0 < self.return_ready_fraction <= 1.0:
            raise ParameterError(f"return_ready_fraction={self.return_ready_fraction}: must lie in (0, 1]")
        if not (math.isfinite(self.min_demand_rps) and self.min_demand_rps >= 0):
            raise ParameterError(f"min_demand_rps={self.min_demand_rps}: must be >= 0")
        for name in ("loss_timeout_windows", "max_heal_windows", "shift_hold_windows"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ParameterError(f"{name}={v!r}: must be an int >= 1")
        if not (isinstance(self.release_windows, int) and self.release_windows >= 0):
            raise ParameterError(f"release_windows={self.release_windows!r}: must be an int >= 0")
        if not (isinstance(self.redundancy, int) and 0 <= self.redundancy < len(self.zones)):
            raise ParameterError(f"redundancy={self.redundancy!r}: must be an int in [0, {len(self.zones)})")
        if self.capacity_rps is not None and not (math.isfinite(self.capacity_rps) and self.capacity_rps > 0):
            raise ParameterError(f"capacity_rps={self.capacity_rps}: must be > 0 (or None)")

    @property
    def window_ms(self) -> int:
        return int(round(self.window_s * 1000))


@dataclass(frozen=True)
class ZoneWindow:
    """What one closed zone window tells: its end, the zone's arrival rate and replicas."""

    basis_ms: int  # window end
    arrival_rps: float
    replicas_ready: int
    replicas_starting: int


@dataclass(frozen=True)
class ZoneState:
    status: str = UP
    last_basis_ms: int = _NEVER
    demand_rps: float = 0.0  # EWMA of the arrival rate while serving its share (frozen otherwise)
    dark_windows: int = 0  # consecutive windows with nothing provisioned while it had demand
    changed_ms: int = _NEVER  # window end of the last status change
    shift_floor_rps: float = 0.0  # survivor: own demand + its part of a lost zone's
    shift_until_ms: int = _NEVER
    heal_floor_rps: float = 0.0  # healed zone: its share of the total when it came back
    heal_until_ms: int = _NEVER  # held while healing, then release_windows after the return


@dataclass(frozen=True)
class ZoneCapacityState:
    zones: Mapping[str, ZoneState] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {z: asdict(s) for z, s in self.zones.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> ZoneCapacityState:
        return cls({z: ZoneState(**dict(s)) for z, s in data.items()})


@dataclass(frozen=True)
class ZoneEvent:
    kind: str  # zone_lost | zone_healed | zone_returned
    zone: str
    window_end_ms: int
    demand_rps: float
    weights: Mapping[str, float]
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "zone": self.zone,
            "window_end_ms": self.window_end_ms,
            "demand_rps": round(self.demand_rps, 4),
            "weights": dict(self.weights),
            **dict(self.detail),
        }


def _weights(params: ZoneCapacityParams, zones: Mapping[str, ZoneState]) -> dict[str, float]:
    raw = {z: 1.0 if zones.get(z, ZoneState()).status == UP else 0.0 for z in params.zones}
    total = sum(raw.values())
    if total <= 0:
        return {z: 1.0 / len(params.zones) for z in params.zones}
    return {z: w / total for z, w in raw.items()}


def weights(params: ZoneCapacityParams, state: ZoneCapacityState) -> dict[str, float]:
    """Routing shares over ``params.zones``: equal over the zones up, 0 for lost and healing ones.

    >>> p = ZoneCapacityParams(zones=("a", "b", "c"))
    >>> weights(p, ZoneCapacityState({"b": ZoneState(status=LOST)}))
    {'a': 0.5, 'b': 0.0, 'c': 0.5}
    """
    return _weights(params, state.zones)


def _had_demand(params: ZoneCapacityParams, z: ZoneState) -> bool:
    return z.demand_rps >= params.min_demand_rps and z.demand_rps > 0


def _lose(params: ZoneCapacityParams, zones: dict[str, ZoneState], zone: str, basis_ms: int, why: str) -> ZoneEvent:
    z = zones[zone]
    lost_rps = z.demand_rps if z.status == UP else 0.0  # a healing zone carried no traffic yet
    zones[zone] = replace(
        z, status=LOST, changed_ms=basis_ms, dark_windows=0, heal_until_ms=_NEVER, shift_until_ms=_NEVER
    )
    survivors = [s for s in params.zones if s != zone and zones.get(s, ZoneState()).status == UP and s in zones]
    shifted: dict[str, float] = {}
    for s in survivors:
        st = zones[s]
        part = lost_rps / len(survivors)  # the balancer spreads the lost share evenly over survivors
        base = st.shift_floor_rps if st.shift_until_ms > basis_ms else st.demand_rps
        zones[s] = replace(
            st, shift_floor_rps=base + part, shift_until_ms=basis_ms + params.shift_hold_windows * params.window_ms
        )
        shifted[s] = round(part, 4)
    return ZoneEvent(
        "zone_lost", zone, basis_ms, lost_rps, _weights(params, zones), {"reason": why, "shifted_rps": shifted}
    )


def _need_replicas(params: ZoneCapacityParams, rps: float) -> float | None:
    if params.capacity_rps is None:
        return None
    return rps / (params.capacity_rps * params.target_util)


def observe(
    params: ZoneCapacityParams,
    state: ZoneCapacityState,
    zone: str,
    win: ZoneWindow,
    alive: Collection[str] | None = None,
) -> tuple[ZoneCapacityState, list[ZoneEvent]]:
    """Fold one closed window of ``zone`` in; check every other zone's silence.

    Returns the new state and the events it caused, in order.  A window no
    newer than the zone's last one (a redelivery) changes nothing.  Zones
    not in ``params.zones`` are ignored.  ``alive``: the zones whose
    executor heartbeat is present; a silent zone in it is not lost (its
    telemetry is missing, not its capacity).  None: no heartbeat view, silence
    alone decides.
    """
    if zone not in params.zones:
        return state, []
    zones = dict(state.zones)
    z = zones.get(zone, ZoneState())
    if win.basis_ms <= z.last_basis_ms:
        return state, []
    events: list[ZoneEvent] = []
    b = win.basis_ms
    provisioned = win.replicas_ready + win.replicas_starting
    arrival = max(0.0, float(win.arrival_rps))
    dark = provisioned <= 0 and (arrival >= params.min_demand_rps or _had_demand(params, z))
    first = z.last_basis_ms == _NEVER
    z = replace(z, last_basis_ms=b)
    if z.status == UP:
        if dark:
            z = replace(z, dark_windows=z.dark_windows + 1)
        else:
            a = params.demand_alpha
            demand = arrival if first else a * arrival + (1 - a) * z.demand_rps
            z = replace(z, dark_windows=0, demand_rps=demand)
        zones[zone] = z
        if z.dark_windows >= params.loss_timeout_windows:
            events.append(_lose(params, zones, zone, b, f"no replicas for {z.dark_windows} windows"))
    elif z.status == LOST:
        zones[zone] = z
        if not dark:
            # Reporting with capacity again: healing.  Its floor is its share of today's total.
            serving = [s for s in params.zones if s != zone and zones.get(s, ZoneState()).status == UP]
            total = sum(zones[s].demand_rps for s in serving if s in zones)
            share = total / (len(serving) + 1)
            zones[zone] = replace(
                z, status=HEALING, changed_ms=b, heal_floor_rps=share, heal_until_ms=_NEVER, dark_windows=0
            )
            events.append(
                ZoneEvent(
                    "zone_healed",
                    zone,
                    b,
                    share,
                    _weights(params, zones),
                    {"ready": win.replicas_ready, "starting": win.replicas_starting},
                )
            )
    else:  # HEALING
        if dark:
            z = replace(z, dark_windows=z.dark_windows + 1)
            zones[zone] = z
            if z.dark_windows >= params.loss_timeout_windows:
                events.append(_lose(params, zones, zone, b, f"no replicas for {z.dark_windows} windows"))
        else:
            zones[zone] = z = replace(z, dark_windows=0)
            need = _need_replicas(params, z.heal_floor_rps)
            if need is None:
                ready_enough = win.replicas_ready >= 1 and win.replicas_starting == 0
            else:
                ready_enough = win.replicas_ready >= max(1.0, params.return_ready_fraction * need)
            waited = (b - z.changed_ms) // params.window_ms >= params.max_heal_windows
            if ready_enough or waited:
                release = b + params.release_windows * params.window_ms
                zones[zone] = replace(z, status=UP, changed_ms=b, demand_rps=z.heal_floor_rps, heal_until_ms=release)
                for s in params.zones:
                    st = zones.get(s)
                    if s != zone and st is not None and st.shift_until_ms > b:
                        zones[s] = replace(st, shift_until_ms=min(st.shift_until_ms, release))
                events.append(
                    ZoneEvent(
                        "zone_returned",
                        zone,
                        b,
                        z.heal_floor_rps,
                        _weights(params, zones),
                        {"ready": win.replicas_ready, "reason": "ready" if ready_enough else "waited"},
                    )
                )
    # Silence: zones (up or healing, with demand) whose windows stopped while this one's came.
    for o in params.zones:
        st = zones.get(o)
        if o == zone or st is None or st.status == LOST or st.last_basis_ms == _NEVER:
            continue
        missed = (b - st.last_basis_ms) // params.window_ms - 1
        if missed >= params.loss_timeout_windows and _had_demand(params, st) and (alive is None or o not in alive):
            events.append(_lose(params, zones, o, b, f"no window for {missed} windows"))
    return ZoneCapacityState(zones), events


def floor_rps(params: ZoneCapacityParams, state: ZoneCapacityState, zone: str, basis_ms: int) -> float:
    """Demand (req/s) ``zone`` must be sized for at ``basis_ms`` beyond its own measured demand.

    The largest of: its shift floor after another zone's loss (until released),
    its heal floor (while healing and ``release_windows`` after its return) and,
    with ``redundancy = k``, ``d_z + sum(k largest other d_o) / (n - k)`` over
    the zones up, with ``k`` reduced by the zones lost or healing.  0 when none
    applies (the default: no loss, no redundancy).

    >>> p = ZoneCapacityParams(zones=("a", "b", "c"), redundancy=1)
    >>> s = ZoneCapacityState({z: ZoneState(demand_rps=d, last_basis_ms=0) for z, d in
    ...                        (("a", 6.0), ("b", 6.0), ("c", 6.0))})
    >>> floor_rps(p, s, "a", 0)  # 6 + 6 / 2: any one loss leaves each survivor 9 of 18
    9.0
    """
    z = state.zones.get(zone)
    if z is None:
        return 0.0
    floor = 0.0
    if z.status == UP and z.shift_until_ms > basis_ms:
        floor = max(floor, z.shift_floor_rps)
    if z.status == HEALING or z.heal_until_ms > basis_ms:
        floor = max(floor, z.heal_floor_rps)
    if params.redundancy and z.status == UP:
        up = [s for s in params.zones if state.zones.get(s, ZoneState()).status == UP]
        k = params.redundancy - (len(params.zones) - len(up))
        if k >= 1 and len(up) > k:
            others = sorted((state.zones[s].demand_rps for s in up if s != zone and s in state.zones), reverse=True)[:k]
            floor = max(floor, z.demand_rps + sum(others) / (len(up) - k))
    return floor
