"""Traffic weights a gateway applies: route weights, then breakers, then canary shares (pure).

The simulated gateway (:mod:`sim.gateway`) and the Gateway API backend
(:mod:`executors.gateway`) apply the same rules, so both use these functions:

* :func:`gate_weights` -- route weights after the circuit breakers: an open
  target gets nothing, a half-open one :data:`HALF_OPEN_SHARE` of its share;
  what they give up goes to the closed targets in proportion;
* :func:`canary_split` -- a canary share moves that fraction of a base
  target's weight to its ``model@version`` target in the same zone;
* :func:`integer_weights` -- fractions to the integer weights a Gateway API
  ``backendRef`` carries (largest remainder, so they sum exactly).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["HALF_OPEN_SHARE", "canary_split", "gate_weights", "integer_weights"]

HALF_OPEN_SHARE = 0.05  # a half-open target keeps this fraction of its share (while probes last)


def gate_weights(weights: Mapping[str, float], factors: Mapping[str, float]) -> dict[str, float]:
    """Route weights after the breakers.

    Each target's normalised share is multiplied by its factor (missing: 1,
    closed).  An open target (factor 0) gets nothing; a half-open one keeps
    ``factor x`` its share; what they give up goes to the closed targets in
    proportion to their shares.  With no closed target left the probing
    targets share the traffic; with none at all the weights are returned
    unchanged (normalised): a breaker sheds a class's traffic to other
    targets, it does not drop the class.

    >>> gate_weights({"a|z": 1, "b|z": 1}, {"a|z": 0.0})
    {'b|z': 1.0}
    >>> {t: round(w, 3) for t, w in gate_weights({"a|z": 1, "b|z": 1}, {"a|z": 0.05}).items()}
    {'a|z': 0.025, 'b|z': 0.975}
    >>> gate_weights({"a|z": 3, "b|z": 1}, {"a|z": 0.0, "b|z": 0.0})
    {'a|z': 0.75, 'b|z': 0.25}
    """
    total = sum(w for w in weights.values() if w > 0)
    if total <= 0:
        return {}
    share = {t: w / total for t, w in weights.items() if w > 0}
    closed = {t: s for t, s in share.items() if factors.get(t, 1.0) >= 1.0}
    probing = {t: s * factors[t] for t, s in share.items() if 0.0 < factors.get(t, 1.0) < 1.0}
    if not closed:
        kept = probing or share
        kept_total = sum(kept.values())
        return {t: s / kept_total for t, s in sorted(kept.items())}
    scale = (1.0 - sum(probing.values())) / sum(closed.values())
    return dict(sorted({**{t: s * scale for t, s in closed.items()}, **probing}.items()))


def canary_split(
    weights: Mapping[str, float], canaries: Mapping[str, tuple[str, float]], factors: Mapping[str, float]
) -> dict[str, float]:
    """Move each canary's share of its base target to the canary target.

    ``canaries`` maps a model to ``(version, share)``; for every target
    ``model|zone`` in ``weights`` the fraction ``share x factor`` (the canary
    target's breaker factor: 0 when it is open) of its weight goes to
    ``model@version|zone``.

    >>> {t: round(w, 3) for t, w in canary_split({"m|z": 0.8, "n|z": 0.2}, {"m": ("v2", 0.25)}, {}).items()}
    {'m@v2|z': 0.2, 'm|z': 0.6, 'n|z': 0.2}
    >>> canary_split({"m|z": 1.0}, {"m": ("v2", 0.5)}, {"m@v2|z": 0.0})
    {'m|z': 1.0}
    """
    out: dict[str, float] = {}
    for target, w in weights.items():
        model, _, zone = target.rpartition("|")
        entry = canaries.get(model)
        if entry is None or not zone:
            out[target] = out.get(target, 0.0) + w
            continue
        version, share = entry
        canary = f"{model}@{version}|{zone}"
        moved = w * min(1.0, max(0.0, share)) * factors.get(canary, 1.0)
        out[target] = out.get(target, 0.0) + w - moved
        if moved > 0:
            out[canary] = out.get(canary, 0.0) + moved
    return dict(sorted(out.items()))


def integer_weights(shares: Mapping[str, float], total: int = 1000) -> dict[str, int]:
    """Non-negative shares -> integer weights summing to ``total`` (largest remainder; ties by name).

    All-zero shares give all-zero weights (a rule with no live backend).

    >>> integer_weights({"a": 1, "b": 1, "c": 1}, 100)
    {'a': 34, 'b': 33, 'c': 33}
    >>> integer_weights({"a": 0.0, "b": 0.025, "c": 0.975})
    {'a': 0, 'b': 25, 'c': 975}
    """
    clean = {k: (v if isinstance(v, int | float) and math.isfinite(v) and v > 0 else 0.0) for k, v in shares.items()}
    s = sum(clean.values())
    if s <= 0:
        return {k: 0 for k in sorted(clean)}
    exact = {k: v / s * total for k, v in clean.items()}
    out = {k: int(math.floor(x)) for k, x in exact.items()}
    left = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return dict(sorted(out.items()))
