"""Cross-zone timing (docs/model.md §17 (hlc)): hybrid logical clocks, RTT compensation, clock offset.

Three pure pieces, each a frozen value plus functions that return new values:

- :class:`Hlc` -- hybrid logical clock of Kulkarni et al. ("Logical Physical
  Clocks", OPODIS 2014). ``l`` is the largest physical time (ms) seen, ``c``
  a counter that orders events sharing ``l``. Send/local event:
  ``l' = max(l, pt)``; ``c' = c + 1`` if ``l' == l`` else 0. Receive of
  ``m``: ``l' = max(l, m.l, pt)``; ``c'`` = ``max(c, m.c) + 1`` if all three
  equal, ``c + 1`` if only ``l`` does, ``m.c + 1`` if only ``m.l`` does, else
  0. So ``receive(...) > remote`` (causality) and ``l - pt`` stays bounded by
  the clock skew. Total order: ``(l, c, node)``; wire form ``l << 16 | c``.
- :class:`RttEstimator` -- per-zone base RTT = mean of the last ``window``
  (5) probes, times a per-zone factor that is configured or learned online
  (EWMA of ``observed command delay / base RTT``, plus ``z`` EWMA standard
  deviations of headroom). ``compensation_ms = base * factor``.
- :class:`ClockOffsetEstimator` -- NTP-style: from ``t0`` (client send),
  ``t1`` (server receive), ``t2`` (server send), ``t3`` (client receive):
  ``offset = ((t1 - t0) + (t2 - t3)) / 2`` (server minus client),
  ``delay = (t3 - t0) - (t2 - t1)``; the estimate is the offset of the
  minimum-delay sample among the last ``window`` (the NTP clock filter).

Examples
--------
>>> a = Hlc().tick(100)
>>> b = Hlc().receive(a, 90)          # b's physical clock is behind
>>> b > a, b.l, b.c
(True, 100, 1)
>>> Hlc.decode(b.encode()) == b
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controllers.errors import ParameterError

__all__ = ["ClockOffsetEstimator", "Hlc", "RttEstimator"]

_C_BITS = 16


@dataclass(frozen=True, order=True)
class Hlc:
    """An HLC timestamp / clock state ``(l, c)``; ordering is ``(l, c)``."""

    l: int = 0  # noqa: E741 (the paper's name)
    c: int = 0

    def __post_init__(self) -> None:
        if self.l < 0 or not 0 <= self.c < (1 << _C_BITS):
            raise ParameterError(f"hlc=({self.l}, {self.c}): need l >= 0 and 0 <= c < 2**16")

    def tick(self, physical_ms: int) -> Hlc:
        """Local or send event at physical time ``physical_ms``.

        >>> Hlc(100, 3).tick(100), Hlc(100, 3).tick(101)
        (Hlc(l=100, c=4), Hlc(l=101, c=0))
        """
        pt = int(physical_ms)
        return Hlc(self.l, self.c + 1) if self.l >= pt else Hlc(pt, 0)

    def receive(self, remote: Hlc, physical_ms: int) -> Hlc:
        """Receive event of a message stamped ``remote``.

        >>> Hlc(5, 2).receive(Hlc(5, 7), 4)
        Hlc(l=5, c=8)
        """
        pt = int(physical_ms)
        lm = max(self.l, remote.l, pt)
        if lm == self.l == remote.l:
            c = max(self.c, remote.c) + 1
        elif lm == self.l:
            c = self.c + 1
        elif lm == remote.l:
            c = remote.c + 1
        else:
            c = 0
        return Hlc(lm, c)

    def encode(self) -> int:
        """One int, ordered like the timestamps: ``l << 16 | c``."""
        return (self.l << _C_BITS) | self.c

    @staticmethod
    def decode(value: int) -> Hlc:
        """Inverse of :meth:`encode`."""
        return Hlc(int(value) >> _C_BITS, int(value) & ((1 << _C_BITS) - 1))

    def total_order_key(self, node: str) -> tuple[int, int, str]:
        """Ties between nodes broken by the node id: a total order of events."""
        return (self.l, self.c, node)

    def drift_ms(self, physical_ms: int) -> int:
        """How far the logical part runs ahead of this node's physical clock."""
        return self.l - int(physical_ms)


def _pos(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ParameterError(f"{name}={value!r}: must be a finite number > 0")
    return float(value)


@dataclass(frozen=True)
class RttEstimator:
    """Per-zone RTT base and command-delay factor (a value; updates return a new one).

    Parameters
    ----------
    window : int
        Probes in the base-RTT mean (5).
    factors : Mapping[str, float]
        Configured factors; a zone listed here is not learned.
    alpha, z, factor_max : float
        EWMA weight of the learned factor, headroom in EWMA standard
        deviations, and the factor clamp ``[1, factor_max]``.

    Examples
    --------
    >>> est = RttEstimator(factors={"az-b": 1.35})
    >>> for rtt in (18.0, 19.0, 18.5, 19.5, 18.5, 40.0):
    ...     est = est.probe("az-b", rtt)
    >>> round(est.base_ms("az-b"), 2), round(est.compensation_ms("az-b"), 3)
    (23.1, 31.185)
    """

    window: int = 5
    factors: Mapping[str, float] = field(default_factory=dict)
    alpha: float = 0.1
    z: float = 2.0
    factor_max: float = 3.0
    probes: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    learned: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # zone -> (mean, var)

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ParameterError(f"window={self.window!r}: must be an int >= 1")
        for zone, f in self.factors.items():
            if _pos(f"factors[{zone}]", f) < 1.0:
                raise ParameterError(f"factors[{zone}]={f}: must be >= 1")
        if not 0.0 < _pos("alpha", self.alpha) <= 1.0:
            raise ParameterError(f"alpha={self.alpha}: must lie in (0, 1]")
        if self.z < 0 or _pos("factor_max", self.factor_max) < 1.0:
            raise ParameterError(f"z={self.z}, factor_max={self.factor_max}: need z >= 0, factor_max >= 1")

    def probe(self, zone: str, rtt_ms: float) -> RttEstimator:
        """Record one probe RTT (ms) of ``zone``."""
        last = (*self.probes.get(zone, ()), _pos("rtt_ms", rtt_ms))[-self.window :]
        return replace(self, probes={**self.probes, zone: last})

    def base_ms(self, zone: str) -> float:
        """Mean of the last ``window`` probes (0 before the first)."""
        p = self.probes.get(zone, ())
        return sum(p) / len(p) if p else 0.0

    def observe_delay(self, zone: str, delay_ms: float) -> RttEstimator:
        """Learn the factor from one observed command round trip (ms) of ``zone``."""
        base = self.base_ms(zone)
        if base <= 0 or zone in self.factors:
            return self
        ratio = _pos("delay_ms", delay_ms) / base
        mean, var = self.learned.get(zone, (ratio, 0.0))
        d = ratio - mean
        mean += self.alpha * d
        var = (1 - self.alpha) * (var + self.alpha * d * d)
        return replace(self, learned={**self.learned, zone: (mean, var)})

    def factor(self, zone: str) -> float:
        """Configured factor, else learned ``mean + z * std`` clamped to [1, factor_max], else 1."""
        if zone in self.factors:
            return float(self.factors[zone])
        if zone not in self.learned:
            return 1.0
        mean, var = self.learned[zone]
        return min(max(mean + self.z * math.sqrt(var), 1.0), self.factor_max)

    def compensation_ms(self, zone: str) -> float:
        """``base RTT * factor``: how early to dispatch so a command lands in time."""
        return self.base_ms(zone) * self.factor(zone)

    def dispatch_at_ms(self, zone: str, now_ms: float) -> float:
        """Compensated time the command takes effect in ``zone``: ``now + base * factor``."""
        return now_ms + self.compensation_ms(zone)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return {
            "window": self.window,
            "factors": dict(self.factors),
            "alpha": self.alpha,
            "z": self.z,
            "factor_max": self.factor_max,
            "probes": {k: list(v) for k, v in self.probes.items()},
            "learned": {k: list(v) for k, v in self.learned.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RttEstimator:
        """Inverse of :meth:`to_dict`."""
        d = dict(data)
        d["probes"] = {k: tuple(v) for k, v in d.get("probes", {}).items()}
        d["learned"] = {k: (float(v[0]), float(v[1])) for k, v in d.get("learned", {}).items()}
        return cls(**d)


@dataclass(frozen=True)
class ClockOffsetEstimator:
    """NTP clock filter over the last ``window`` exchanges (a value).

    Examples
    --------
    >>> est = ClockOffsetEstimator(window=4)
    >>> est = est.sample(t0=0.0, t1=60.0, t2=61.0, t3=21.0)   # server 50 ms ahead, 10 ms each way
    >>> est = est.sample(t0=100.0, t1=175.0, t2=176.0, t3=141.0)  # a slow, asymmetric exchange
    >>> est.offset_ms(), est.delay_ms()
    (50.0, 20.0)
    """

    window: int = 8
    samples: tuple[tuple[float, float, float], ...] = ()  # (t3, offset, delay)

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ParameterError(f"window={self.window!r}: must be an int >= 1")

    def sample(self, t0: float, t1: float, t2: float, t3: float) -> ClockOffsetEstimator:
        """Add one exchange (client ``t0``, ``t3``; server ``t1``, ``t2``; ms)."""
        delay = (t3 - t0) - (t2 - t1)
        if delay < 0 or t2 < t1:
            raise ParameterError(f"exchange t0..t3=({t0}, {t1}, {t2}, {t3}): negative delay")
        offset = ((t1 - t0) + (t2 - t3)) / 2.0
        return replace(self, samples=(*self.samples, (float(t3), offset, delay))[-self.window :])

    def _best(self) -> tuple[float, float, float] | None:
        return min(self.samples, key=lambda s: s[2]) if self.samples else None

    def offset_ms(self) -> float:
        """Server clock minus client clock (ms), from the minimum-delay sample (0 before any)."""
        b = self._best()
        return b[1] if b else 0.0

    def delay_ms(self) -> float:
        """Round-trip delay of the chosen sample (ms)."""
        b = self._best()
        return b[2] if b else 0.0

    def error_bound_ms(self) -> float:
        """Half the chosen delay: the offset error bound of any path asymmetry."""
        return self.delay_ms() / 2.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return {"window": self.window, "samples": [list(s) for s in self.samples]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClockOffsetEstimator:
        """Inverse of :meth:`to_dict`."""
        samples = tuple((float(a), float(b), float(c)) for a, b, c in data.get("samples", ()))
        return cls(window=int(data["window"]), samples=samples)
