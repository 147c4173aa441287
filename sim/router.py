"""Weighted request routing over (variant, zone) targets, and injected errors.

The fleet's own router (:mod:`sim.fleet`) places a request on a replica of
*one* (zone, model).  This module decides *which* (zone, model) a request of
a model family goes to, the way an inference gateway does:

* :class:`WeightedRouter` keeps, per family, routing weights per request
  class (and a default for every class) over targets ``(variant, zone)``,
  written as tuples or as ``"variant|zone"`` strings (the key format of
  :class:`controllers.routing.Target`).  :meth:`WeightedRouter.pick` draws a
  target from its own seeded stream, so a run is reproducible and the draws
  do not disturb the fleet's other random streams.  A variant is a model name
  of ``FleetConfig.models``.  In the benchmarks the primary is
  ``'bloom-176b'`` and the fallback ``'llama2-70b'``; "smaller" in the
  routing controller means *faster and cheaper per request* here (both are
  measured in the Splitwise CSV on 8 x H100; the 70B prefills and decodes
  faster), not a distilled copy of the same weights.  A new *version* of a
  model (a canary) is a separate model name such as ``'llama2-70b@v2'``.
* :class:`ErrorInjector` marks finished requests ``status='error'`` with a
  given probability per (zone, model) during a time interval (a failing
  zone, a bad version), from its own seeded stream.

What a gateway applies on top of the weights (breakers, canary shares) and
the sync from the executors' Redis hashes are in :mod:`sim.gateway`.

Examples
--------
>>> r = WeightedRouter(np.random.default_rng(0))
>>> r.set("fam", {"a|z1": 3.0, ("b", "z1"): 1.0})
{'a|z1': 0.75, 'b|z1': 0.25}
>>> sorted({r.pick("fam", "voice") for _ in range(50)})
[('a', 'z1'), ('b', 'z1')]
>>> inj = ErrorInjector(np.random.default_rng(0))
>>> inj.add("z1", "a", 1.0, 10.0, 5.0)
>>> inj.status("z1", "a", 12.0), inj.status("z1", "a", 20.0)
('error', 'ok')
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Mapping

import numpy as np

from sim.replica import FleetConfigError

__all__ = ["DEFAULT_CLASS", "ErrorInjector", "WeightedRouter", "parse_target"]

log = logging.getLogger(__name__)

DEFAULT_CLASS = "*"


def parse_target(key: str | tuple[str, str]) -> tuple[str, str]:
    """``'variant|zone'`` or ``(variant, zone)`` -> ``(variant, zone)``.

    >>> parse_target("llama2-70b|az-a")
    ('llama2-70b', 'az-a')
    """
    if isinstance(key, str):
        variant, sep, zone = key.rpartition("|")
        if not sep or not variant or not zone:
            raise FleetConfigError(f"target: {key!r} is not 'variant|zone'")
        return variant, zone
    if isinstance(key, tuple) and len(key) == 2 and all(isinstance(x, str) and x for x in key):
        return key[0], key[1]
    raise FleetConfigError(f"target: {key!r} is not (variant, zone) or 'variant|zone'")


class WeightedRouter:
    """Per family and class: cumulative weights over targets (see the module docstring)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._table: dict[str, dict[str, tuple[list[tuple[str, str]], list[float]]]] = {}
        self._draws: list[float] = []
        self.picks: dict[tuple[str, str, str], int] = {}  # (class, variant, zone) -> count

    def set(
        self, family: str, weights: Mapping[str | tuple[str, str], float], request_class: str | None = None
    ) -> dict[str, float]:
        """Replace the weights of ``family`` for ``request_class`` (None: the default).

        Weights are normalised (they need not sum to 1); zero weights are
        dropped; at least one must be positive. Returns the normalised
        weights by ``"variant|zone"``.
        """
        clean: dict[tuple[str, str], float] = {}
        for k, w in weights.items():
            t = parse_target(k)
            w = float(w)
            if not w >= 0 or w == float("inf"):
                raise FleetConfigError(f"weight of {k!r}: must be finite and >= 0, got {w!r}")
            if w > 0:
                clean[t] = clean.get(t, 0.0) + w
        total = sum(clean.values())
        if total <= 0:
            raise FleetConfigError(f"weights of {family!r}/{request_class}: need one > 0")
        targets = sorted(clean)
        cum, acc = [], 0.0
        for t in targets:
            acc += clean[t] / total
            cum.append(acc)
        cum[-1] = 1.0
        self._table.setdefault(family, {})[request_class or DEFAULT_CLASS] = (targets, cum)
        return {f"{v}|{z}": clean[(v, z)] / total for v, z in targets}

    def weights(self, family: str, request_class: str | None = None) -> dict[str, float]:
        """The normalised weights a request of ``request_class`` would be drawn from."""
        table = self._table.get(family, {})
        entry = table.get(request_class or DEFAULT_CLASS) or table.get(DEFAULT_CLASS)
        if entry is None:
            return {}
        targets, cum = entry
        prev = [0.0, *cum[:-1]]
        return {f"{v}|{z}": c - p for (v, z), c, p in zip(targets, cum, prev, strict=True)}

    def pick(self, family: str, request_class: str) -> tuple[str, str]:
        """Draw the target of one request (the class's weights, else the family default)."""
        table = self._table.get(family)
        if not table:
            raise FleetConfigError(f"family: no routing weights set for {family!r}")
        entry = table.get(request_class) or table.get(DEFAULT_CLASS)
        if entry is None:
            raise FleetConfigError(f"request_class: no weights for {request_class!r} in {family!r}")
        if not self._draws:
            self._draws = self._rng.random(4096).tolist()
        targets, cum = entry
        t = targets[min(bisect.bisect_right(cum, self._draws.pop()), len(targets) - 1)]
        k = (request_class, t[0], t[1])
        self.picks[k] = self.picks.get(k, 0) + 1
        return t


class ErrorInjector:
    """Seeded per-(zone, model) error probabilities over time intervals."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._rules: dict[tuple[str, str], list[tuple[float, float, float]]] = {}

    def add(self, zone: str, model: str, rate: float, start_s: float, duration_s: float) -> None:
        """Requests of (zone, model) finishing in ``[start_s, start_s + duration_s)`` fail w.p. ``rate``."""
        if not 0.0 <= float(rate) <= 1.0 or not float(duration_s) > 0:
            raise FleetConfigError("rate/duration_s: need 0 <= rate <= 1 and duration_s > 0")
        self._rules.setdefault((zone, model), []).append(
            (float(start_s), float(start_s) + float(duration_s), float(rate))
        )

    @property
    def active(self) -> bool:
        return bool(self._rules)

    def status(self, zone: str, model: str, t: float) -> str:
        """``'error'`` or ``'ok'`` for a request of (zone, model) finishing at ``t``."""
        rules = self._rules.get((zone, model))
        if not rules:
            return "ok"
        rate = 1.0
        for start, end, r in rules:
            if start <= t < end:
                rate *= 1.0 - r
        return "error" if rate < 1.0 and self._rng.random() >= rate else "ok"
