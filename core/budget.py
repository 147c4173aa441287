"""Per-zone replica allowances: the fleet budget split so that no zone needs another zone's keys.

The fleet budget (``GOVERNOR_MAX_REPLICAS_TOTAL`` over every model and zone, a
model's ``max_replicas_total`` over its zones) is split into one allowance
per zone, stored at :func:`core.names.zone_allowance` (JSON, written by one
owner: the worker at start, or an operator with ``governor budget``).  A
zone's executor only *reads* its allowance and checks its own zone's desired
replicas against it; the allowances of all zones sum to at most the budget,
so the fleet stays within it without any cross-zone read, write or script
(:mod:`executors.budget`).

>>> split(100, ["az-a", "az-b", "az-c"])
{'az-a': 34, 'az-b': 33, 'az-c': 33}
>>> split(10, ["az-a", "az-b"], {"az-a": 3, "az-b": 1})
{'az-a': 8, 'az-b': 2}
>>> a = Allowance(total=50, models={"m": 10}, fleet_total=100, by="worker")
>>> Allowance.decode(a.encode()) == a
True
>>> Allowance.decode(b"junk") is None
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Allowance", "BudgetError", "default_allowances", "split", "within_budget"]

#: Who wrote an allowance: the worker's default (rewritten when the settings change), or an operator.
OWNERS = ("worker", "operator")


class BudgetError(ValueError):
    """An allowance or a split that would not keep the fleet within its budget (names the parameter)."""


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31


@dataclass(frozen=True)
class Allowance:
    """One zone's share of the fleet budget.

    ``total``: replicas of every model in this zone (None: no fleet total);
    ``models``: model -> replicas of it in this zone (its ``max_replicas_total`` share);
    ``fleet_total`` / ``fleet_models``: the budgets it was split from; ``by``: worker or operator.
    """

    total: int | None
    models: Mapping[str, int] = field(default_factory=dict)
    fleet_total: int | None = None
    fleet_models: Mapping[str, int] = field(default_factory=dict)
    by: str = "worker"
    at_ms: int = 0

    def encode(self) -> bytes:
        return json.dumps(
            {
                "total": self.total,
                "models": dict(sorted(self.models.items())),
                "fleet_total": self.fleet_total,
                "fleet_models": dict(sorted(self.fleet_models.items())),
                "by": self.by,
                "at_ms": self.at_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: Any) -> Allowance | None:
        """The allowance stored in ``raw``, or None when it is absent or malformed (fail safe: hold)."""
        if not isinstance(raw, bytes | str):
            return None
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict):
            return None
        total, fleet_total = obj.get("total"), obj.get("fleet_total")
        models, fleet_models = obj.get("models", {}), obj.get("fleet_models", {})
        if not (total is None or _count(total)) or not (fleet_total is None or _count(fleet_total)):
            return None
        for m in (models, fleet_models):
            if not isinstance(m, dict) or not all(isinstance(k, str) and _count(v) for k, v in m.items()):
                return None
        by, at_ms = obj.get("by", ""), obj.get("at_ms", 0)
        if by not in OWNERS or not isinstance(at_ms, int) or isinstance(at_ms, bool):
            return None
        return cls(total, dict(models), fleet_total, dict(fleet_models), by, at_ms)


def split(total: int, zones: Sequence[str], weights: Mapping[str, float] | None = None) -> dict[str, int]:
    """``total`` replicas split over ``zones`` by ``weights`` (default even), summing exactly to ``total``
    (largest remainders; ties to the earlier zone).  :class:`BudgetError` for a bad weight or total."""
    if not _count(total):
        raise BudgetError(f"total: {total!r} is not a replica count")
    if not zones:
        raise BudgetError("zones: none to split the budget over")
    w = {z: 1.0 for z in zones} if weights is None else dict(weights)
    if set(w) != set(zones):
        raise BudgetError(f"weights: zones {sorted(w)} are not GOVERNOR_ZONES {sorted(zones)}")
    for z, x in w.items():
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
            raise BudgetError(f"weights: {z}={x!r} is not a finite number >= 0")
    whole = sum(w.values())
    if whole <= 0:
        raise BudgetError("weights: at least one zone needs a weight above 0")
    exact = {z: total * w[z] / whole for z in zones}
    out = {z: int(math.floor(exact[z])) for z in zones}
    rest = total - sum(out.values())
    for z in sorted(zones, key=lambda z: (-(exact[z] - out[z]), list(zones).index(z)))[:rest]:
        out[z] += 1
    return out


def default_allowances(
    zones: Sequence[str],
    total: int | None,
    per_model: Mapping[str, int],
    *,
    weights: Mapping[str, float] | None = None,
    by: str = "worker",
    at_ms: int = 0,
) -> dict[str, Allowance]:
    """Each zone's allowance: ``total`` and every model's budget split by ``weights`` (default even)."""
    totals = split(total, zones, weights) if total is not None else None
    models = {m: split(n, zones, weights) for m, n in per_model.items()}
    return {
        z: Allowance(
            None if totals is None else totals[z],
            {m: s[z] for m, s in models.items()},
            total,
            dict(per_model),
            by,
            at_ms,
        )
        for z in zones
    }


def within_budget(allowances: Mapping[str, Allowance], total: int | None, per_model: Mapping[str, int]) -> str | None:
    """Why ``allowances`` (one per zone) would let the fleet exceed its budgets, or None when they cannot."""
    if total is not None:
        given = [a.total for a in allowances.values()]
        if any(t is None for t in given) or sum(t or 0 for t in given) > total:
            return f"zone totals {given} sum above GOVERNOR_MAX_REPLICAS_TOTAL={total}"
    for m, n in per_model.items():
        shares = [a.models.get(m) for a in allowances.values()]
        if any(s is None for s in shares) or sum(s or 0 for s in shares) > n:
            return f"{m}'s zone shares {shares} sum above its max_replicas_total={n}"
    return None
