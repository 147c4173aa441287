"""Cross-zone actions land together: one decision's commands of a kind and model for several zones carry
``detail.apply_at_ms`` (:mod:`controllers.apply_at`).

The actions that must act at once in every zone are the ones a decision sends to several zones: a
reroute (``route`` to every zone's gateway: zone loss, the router's split of a family), a canary step
(``canary``, guarded by its rollout's swap) and a scale that one decision makes for several zones
(``scale``).  :func:`stamp_cross_zone` groups a decision's commands -- those it publishes and those a
compare-and-set write releases -- by ``(kind, model)``; each group with two zones or more gets the plan's
fields in its ``detail``, the same ``apply_at_ms`` for every zone of the group.  A command for one zone
is left as it is (applied on arrival, not delayed); so are ``breaker``, ``agents`` and ``relocate``
commands, each a decision about its own zone.

>>> from loop.commands import Command
>>> from loop.effects import Effects
>>> def c(z, model="m"):
...     return Command(kind="scale", zone=z, model=model, target_replicas=2, reason="", issued_at_ms=0,
...                    expires_at_ms=9, basis_ms=0)
>>> fx = Effects(commands=[c("az-a"), c("az-b"), c("az-a", "n")])
>>> stamp_cross_zone(fx, lambda zones: {"apply_at_ms": 500} if len(zones) > 1 else None)
2
>>> [x.detail.get("apply_at_ms") for x in fx.commands]
[500, 500, None]
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from loop.commands import Command
from loop.effects import Effects, SwapWrite

__all__ = ["CROSS_ZONE_KINDS", "stamp_cross_zone"]

#: The command kinds whose multi-zone groups must land together.
CROSS_ZONE_KINDS = frozenset({"route", "canary", "scale"})


def stamp_cross_zone(fx: Effects, plan: Callable[[Collection[str]], dict[str, Any] | None]) -> int:
    """Put ``plan(zones)``'s fields into the ``detail`` of each cross-zone group of ``fx``; how many commands
    got them (``plan``: the detail fields for a group's zones, None to leave it)."""
    released = [c for w in fx.writes if isinstance(w, SwapWrite) for c, _ in w.then]
    zones: dict[tuple[str, str], set[str]] = {}
    for cmd in (*fx.commands, *released):
        if cmd.kind in CROSS_ZONE_KINDS:
            zones.setdefault((cmd.kind, cmd.model), set()).add(cmd.zone)
    fields = {key: plan(zs) for key, zs in zones.items() if len(zs) > 1}
    fields = {key: f for key, f in fields.items() if f}
    if not fields:
        return 0
    stamped = 0

    def put(cmd: Command) -> Command:
        nonlocal stamped
        f = fields.get((cmd.kind, cmd.model))
        if f is None:
            return cmd
        stamped += 1
        return replace(cmd, detail={**cmd.detail, **f})

    fx.commands[:] = [put(c) for c in fx.commands]
    fx.writes[:] = [
        replace(w, then=tuple((put(c), what) for c, what in w.then)) if isinstance(w, SwapWrite) else w
        for w in fx.writes
    ]
    return stamped
