"""The gateway contract in the simulator: breakers and canary shares on top of route weights.

* :class:`TrafficGate` and :func:`gate_weights` are what a gateway applies
  on top of the weights of :class:`sim.router.WeightedRouter`: circuit
  breakers (an open target gets nothing, a half-open one
  :data:`HALF_OPEN_SHARE` of its share for at most ``probe_budget``
  requests) and canary shares (``model`` -> ``model@version``).
* :func:`sync_routing_from_redis` reads them, and the agent class weights, from the Redis hashes the
  executors write (the contract is in :mod:`executors.backends`);
  :class:`CommandGateway` applies the commands themselves in memory, as an
  executor writes them and a gateway reads them (the traffic benchmarks,
  which run the control loop without Redis).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from controllers.gateway_weights import HALF_OPEN_SHARE, gate_weights
from core import names
from loop.commands import Command
from sim.replica import FleetConfigError
from sim.router import DEFAULT_CLASS, parse_target

__all__ = ["HALF_OPEN_SHARE", "BreakerView", "CommandGateway", "TrafficGate", "gate_weights", "sync_routing_from_redis"]

log = logging.getLogger(__name__)


# -- the gateway contract: breakers and canary shares on top of the route weights ----------
BREAKER_STATES = frozenset({"closed", "open", "half_open"})


@dataclass
class BreakerView:
    """A gateway's view of one target's breaker (a field of ``<prefix>:breaker:<zone>``).

    ``probes_sent`` counts the requests sent to the target since this breaker
    version (``basis_ms``) was read; a half-open target whose ``probe_budget``
    is spent gets no more traffic until a newer breaker version arrives.

    >>> BreakerView("half_open", probe_budget=2).factor
    0.05
    >>> BreakerView("half_open", probe_budget=2, probes_sent=2).factor, BreakerView("open").factor
    (0.0, 0.0)
    """

    state: str = "closed"
    probe_budget: int = 0
    basis_ms: int = 0
    probes_sent: int = 0

    @property
    def factor(self) -> float:
        """The multiplier of the target's traffic share: 1 closed, 0 open, HALF_OPEN_SHARE probing."""
        if self.state == "closed":
            return 1.0
        if self.state == "half_open" and self.probes_sent < self.probe_budget:
            return HALF_OPEN_SHARE
        return 0.0


class TrafficGate:
    """What a gateway applies on top of the route weights: breakers and canary shares.

    * Route weights (kept raw in ``routes``, per (family, class)) reach the
      fleet's router through :func:`gate_weights` (:meth:`apply`).
    * Without route weights a request keeps the zone it was given unless that
      zone's target ``model|zone`` is open or probing; then it moves to the
      other zones so that the zone shares are ``gate_weights`` of equal
      weights (:meth:`zone_for`).
    * Canary: in zone ``z`` a request for ``model`` goes to ``model@version``
      with probability ``share`` (the ``_canary|<model>`` field of ``z``'s
      routing hash) times that target's breaker factor (:meth:`variant_for`).
    * :meth:`sent` counts the probes of half-open targets.

    Draws come from the gate's own seeded stream.

    >>> g = TrafficGate(np.random.default_rng(0))
    >>> g.set_breaker("m|z1", "open", 0, 1)
    >>> {g.zone_for("m", "z1", ["z1", "z2"]) for _ in range(20)}
    {'z2'}
    >>> g.set_canary("z2", "m", "m@v2", 1.0)
    >>> g.variant_for("m", "z2"), g.variant_for("m", "z1")
    ('m@v2', 'm')
    """

    def __init__(self, rng: np.random.Generator, *, agent_routes: bool = True) -> None:
        self._rng = rng
        self._draws: list[float] = []
        self.agent_routes = agent_routes  # False: the agent class weights are read, not applied
        self.agents: dict[tuple[str, str], dict[str, float]] = {}  # (zone, model) -> agent class weights
        self.routes: dict[tuple[str, str | None], dict[str, float]] = {}
        self.breakers: dict[str, BreakerView] = {}
        self.canary: dict[tuple[str, str], tuple[str, float]] = {}  # (zone, model) -> (variant, share)

    def _draw(self) -> float:
        if not self._draws:
            self._draws = self._rng.random(4096).tolist()
        return self._draws.pop()

    def factors(self) -> dict[str, float]:
        return {t: b.factor for t, b in self.breakers.items()}

    def factor(self, variant: str, zone: str) -> float:
        b = self.breakers.get(f"{variant}|{zone}")
        return 1.0 if b is None else b.factor

    def set_breaker(self, target: str, state: str, probe_budget: int, basis_ms: int) -> None:
        """A new breaker version for ``target``; probes are counted afresh (``'closed'`` forgets it).

        The same (state, ``basis_ms``) again -- the copy the breaker driver
        sends to every zone's hash -- keeps the probes already counted.
        """
        parse_target(target)
        if state not in BREAKER_STATES:
            raise FleetConfigError(f"breaker state of {target!r}: {state!r} is not one of {sorted(BREAKER_STATES)}")
        old = self.breakers.get(target)
        if old is not None and (old.state, old.basis_ms) == (state, int(basis_ms)):
            return
        if state == "closed":
            self.breakers.pop(target, None)
        else:
            self.breakers[target] = BreakerView(state, max(0, int(probe_budget)), int(basis_ms))

    def set_canary(self, zone: str, model: str, variant: str, share: float) -> None:
        if not 0.0 <= float(share) <= 1.0:
            raise FleetConfigError(f"canary share of {model!r} in {zone!r}: {share!r} not in [0, 1]")
        self.canary[(zone, model)] = (variant, float(share))

    def set_agents(self, fleet: Any, zone: str, model: str, weights: dict[str, float]) -> None:
        """Keep a zone's agent class weights; with ``agent_routes``, route the classes by them
        (:meth:`sim.fleet.Fleet.set_agent_routes`)."""
        self.agents[(zone, model)] = weights
        if self.agent_routes and (zone, model) in fleet._reps:
            fleet.set_agent_routes(zone, model, weights)

    def apply(self, fleet: Any, t_s: float) -> None:
        """Set every stored class's gated weights on ``fleet`` (its router)."""
        factors = self.factors()
        for (family, cls), weights in sorted(self.routes.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            fleet.set_routing(family, gate_weights(weights, factors), t_s, cls)

    def zone_for(self, model: str, zone: str, zones: Sequence[str]) -> str:
        """The zone a request given ``zone`` goes to, avoiding open and probing zones (see the class)."""
        if not self.breakers:
            return zone
        uniform = 1.0 / len(zones)
        gated = gate_weights({f"{model}|{z}": 1.0 for z in zones}, self.factors())
        keep = gated.get(f"{model}|{zone}", 0.0) / uniform
        if keep >= 1.0 - 1e-12 or self._draw() < keep:
            return zone
        excess = {t: w - uniform for t, w in gated.items() if w > uniform}
        if not excess:
            return zone
        targets = list(excess)
        cum = np.cumsum([excess[t] for t in targets])
        k = int(np.searchsorted(cum, self._draw() * cum[-1], side="right"))
        return parse_target(targets[min(k, len(targets) - 1)])[1]

    def variant_for(self, model: str, zone: str) -> str:
        """``model``, or its canary version with the zone's share times the canary's breaker factor."""
        entry = self.canary.get((zone, model))
        if entry is None:
            return model
        variant, share = entry
        p = share * self.factor(variant, zone)
        return variant if p > 0.0 and self._draw() < p else model

    def sent(self, variant: str, zone: str) -> bool:
        """Count one request sent to (variant, zone); True when it spent a probe budget."""
        b = self.breakers.get(f"{variant}|{zone}")
        if b is None or b.state != "half_open" or b.probes_sent >= b.probe_budget:
            return False
        b.probes_sent += 1
        return b.probes_sent >= b.probe_budget


def _changed(seen: dict[str, int], key: str, basis_ms: int) -> bool:
    """Same-version skipping: True (and remembered) when ``basis_ms`` differs from the one seen."""
    if seen.get(key) == basis_ms:
        return False
    seen[key] = basis_ms
    return True


def _read_agents(fleet: Any, gate: TrafficGate, zone: str, field: str, raw: bytes, seen: dict[str, int]) -> None:
    a = json.loads(raw)
    weights = {str(k): float(v) for k, v in a["weights"].items()}
    if not all(w >= 0.0 for w in weights.values()) or not any(w > 0.0 for w in weights.values()):
        raise ValueError(f"weights {weights!r}: need finite values >= 0, one > 0")
    if _changed(seen, f"{zone}|{field}", int(a.get("basis_ms", 0))):
        gate.set_agents(fleet, zone, field.partition("|")[2], weights)


def _read_canary(fleet: Any, gate: TrafficGate, zone: str, field: str, raw: bytes, seen: dict[str, int]) -> None:
    c = json.loads(raw)
    model = field.partition("|")[2]
    variant, share, basis_ms = f"{model}@{c['version']}", float(c["share"]), int(c.get("basis_ms", 0))
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share {share!r} not in [0, 1]")
    if not _changed(seen, f"{zone}|{field}", basis_ms):
        return
    if (zone, variant) in fleet._reps and (zone, model) in fleet._reps:
        gate.set_canary(zone, model, variant, share)
    else:
        gate.canary.pop((zone, model), None)
        log.info("canary %s in %s: the fleet has no %s there; ignored", model, zone, variant)


async def _read_breakers(redis: Any, prefix: str, zone: str, gate: TrafficGate, seen: dict[str, int]) -> bool:
    """Apply the zone's breaker hash; True when a breaker changed (fields gone: closed)."""
    h = await redis.hgetall(names.breaker_hash(prefix, zone))
    changed = False
    mine = f"{zone}|breaker|"
    for key in [k for k in seen if k.startswith(mine) and k[len(mine) :].encode() not in h]:
        del seen[key]
        target = key[len(mine) :]
        if not any(k.endswith(f"|breaker|{target}") for k in seen):  # no other zone's hash has it
            gate.breakers.pop(target, None)
            changed = True
    for raw_target, raw in sorted(h.items()):
        target = raw_target.decode()
        try:
            b = json.loads(raw)
            if _changed(seen, mine + target, int(b.get("basis_ms", 0))):
                gate.set_breaker(target, str(b["state"]), int(b.get("probe_budget") or 0), int(b.get("basis_ms", 0)))
                changed = True
        except (ValueError, KeyError, TypeError) as exc:  # bad input is data: skip the field
            if _changed(seen, mine + target, -1):  # warn once, not every poll
                log.warning("breaker %s in %s: unusable field (%s); skipped", target, zone, exc)
    return changed


async def sync_routing_from_redis(
    fleet: Any,
    redis: Any,
    prefix: str,
    zones: list[str],
    family: str,
    t_s: float,
    seen: dict[str, int],
    gate: TrafficGate | None = None,
) -> list[str]:
    """Apply what the executors wrote for a gateway to ``fleet`` (the contract is :mod:`executors.backends`).

    * Route weights, ``<prefix>:routing:<zone>``: each class field's
      ``weights`` become :meth:`sim.fleet.Fleet.set_routing` of ``family``
      (field ``*``: the default); targets the fleet does not have are
      dropped.  A zone's classes are re-read only when its ``_version`` (the
      command's ``basis_ms``) differs from ``seen[zone]``.  The simulated
      fleet has one router per family, so the zones' hashes apply in order
      (a real gateway reads its own zone's).
    * Canary, field ``_canary|<model>``: the share of ``<model>``'s requests
      in that zone sent to ``<model>@<version>`` when the fleet has both
      there (:meth:`TrafficGate.variant_for`); re-read when its ``basis_ms``
      differs from ``seen['<zone>|_canary|<model>']``.
    * Agent classes, field ``_agents|<model>``: its ``weights`` (``rag``,
      ``tool``, ``llm``) route requests whose ``agent_path`` is that class
      to the class's share of the zone's replicas (:meth:`TrafficGate.set_agents`,
      :meth:`sim.fleet.Fleet.set_agent_routes`; the gateway backend's
      ``x-agent-class`` rules, :mod:`executors.gateway`); re-read when its
      ``basis_ms`` differs from ``seen['<zone>|_agents|<model>']``.
    * Breakers, ``<prefix>:breaker:<zone>`` (field ``variant|zone``, JSON
      ``{"state", "probe_budget", "basis_ms", ...}``): the weights reach the
      router through :func:`gate_weights` (open: none, half-open: 5 % of the
      share and at most ``probe_budget`` requests per breaker version); a
      field is re-read when its ``basis_ms`` differs from
      ``seen['<zone>|breaker|<target>']``, and a field that disappeared
      counts as closed.

    ``gate`` keeps the canary shares, breakers and raw weights between polls
    (:class:`sim.live.LiveFleet` passes its own); without one, a throwaway
    gate still filters the weights by the breakers read now.  Returns the
    classes whose weights were read.
    """
    gate = gate if gate is not None else TrafficGate(np.random.default_rng(0))
    updated: list[str] = []
    breakers_changed = False
    for zone in zones:
        breakers_changed |= await _read_breakers(redis, prefix, zone, gate, seen)
        h = await redis.hgetall(names.routing_hash(prefix, zone))
        for raw_field, raw in sorted(h.items()):
            name = raw_field.decode()
            read = {"_canary": _read_canary, "_agents": _read_agents}.get(name.partition("|")[0])
            if read is not None:
                try:
                    read(fleet, gate, zone, name, raw, seen)
                except (ValueError, KeyError, TypeError, AttributeError, FleetConfigError) as exc:
                    if _changed(seen, f"{zone}|{name}", -1):  # warn once, not every poll
                        log.warning("field %s in %s: unusable (%s); skipped", name, zone, exc)
        if not h or not _changed(seen, zone, int(h.get(b"_version", 0))):
            continue
        for raw_cls, raw in sorted(h.items()):
            cls = raw_cls.decode()
            if cls.startswith("_"):  # _version, _canary|<model>, _agents|<model>: not request classes
                continue
            known = {}
            for key, w in json.loads(raw)["weights"].items():
                variant, z = parse_target(key)
                if (z, variant) in fleet._reps:
                    known[key] = float(w)
            if any(w > 0 for w in known.values()):
                gate.routes[(family, None if cls == DEFAULT_CLASS else cls)] = known
                updated.append(cls)
    if updated or (breakers_changed and gate.routes):
        gate.apply(fleet, t_s)
    return updated


GATEWAY_KINDS = ("route", "breaker", "canary", "agents")


class CommandGateway:
    """A zone's executor and gateway in memory: route, breaker, canary and agents commands reach ``fleet``.

    What :class:`executors.backends.RoutingBackend` writes and
    :func:`sync_routing_from_redis` reads, without Redis: a command whose
    ``basis_ms`` is older than the last one applied for its (zone, kind, model)
    is stale (the executor's rule); a route command's classes are normalised
    and their targets the fleet lacks dropped; a breaker version re-gates the
    weights; a canary share applies where the fleet has both versions; the
    agent weights are kept per (zone, model) for the orchestrator
    (:attr:`agents`) and, with ``agent_routes``, route each agent class to its
    share of the replicas (:meth:`TrafficGate.set_agents`).  A route command's
    model is the family routed.

    >>> from sim.fleet import Fleet, FleetConfig
    >>> from sim.perf_model import PerfModel
    >>> f = Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}, zones=("az-a", "az-b")))
    >>> gw = CommandGateway(f, np.random.default_rng(0))
    >>> route = Command(kind="route", zone="az-a", model="m", reason="", issued_at_ms=0, expires_at_ms=1,
    ...                 basis_ms=10, payload={"weights": {"*": {"m|az-a": 3.0, "m|az-b": 1.0}}})
    >>> gw.apply(route, 0.0), f.router.weights("m")
    (True, {'m|az-a': 0.75, 'm|az-b': 0.25})
    >>> from dataclasses import replace
    >>> gw.apply(replace(route, basis_ms=5, command_id=""), 0.0)   # older than applied: stale
    False
    """

    def __init__(self, fleet: Any, rng: np.random.Generator, *, agent_routes: bool = True) -> None:
        self.fleet = fleet
        self.gate = TrafficGate(rng, agent_routes=agent_routes)
        self.agents = self.gate.agents  # (zone, model) -> path weights
        self.applied: list[Command] = []
        self._last_basis: dict[tuple[str, str, str], int] = {}

    def apply(self, cmd: Command, t_s: float) -> bool:
        """Apply one command at ``t_s``; False when it is stale or not a gateway kind."""
        key = (cmd.zone, cmd.kind, cmd.model)
        if cmd.kind not in GATEWAY_KINDS or cmd.basis_ms < self._last_basis.get(key, cmd.basis_ms):
            return False
        gate, p = self.gate, cmd.payload
        totals = {cls: sum(ws.values()) for cls, ws in p.get("weights", {}).items()} if cmd.kind == "route" else {}
        if any(total <= 0 for total in totals.values()):
            return False  # the backend rejects a class without a positive weight
        self._last_basis[key] = cmd.basis_ms
        self.applied.append(cmd)
        if cmd.kind == "route":
            for cls, ws in p["weights"].items():  # normalised as written, then the fleet's targets kept
                known = {
                    t: w / totals[cls]
                    for t, w in sorted(ws.items())
                    if tuple(reversed(parse_target(t))) in self.fleet._reps
                }
                if any(w > 0 for w in known.values()):
                    gate.routes[(cmd.model, None if cls == DEFAULT_CLASS else cls)] = known
            gate.apply(self.fleet, t_s)
        elif cmd.kind == "breaker":
            gate.set_breaker(str(p["target"]), str(p["state"]), int(p.get("probe_budget") or 0), cmd.basis_ms)
            if gate.routes:
                gate.apply(self.fleet, t_s)
        elif cmd.kind == "canary":
            variant = f"{cmd.model}@{p['version']}"
            if (cmd.zone, variant) in self.fleet._reps and (cmd.zone, cmd.model) in self.fleet._reps:
                gate.set_canary(cmd.zone, cmd.model, variant, float(p["share"]))
            else:
                gate.canary.pop((cmd.zone, cmd.model), None)
        else:
            gate.set_agents(self.fleet, cmd.zone, cmd.model, {k: float(v) for k, v in p["weights"].items()})
        return True

    def submit(
        self, t_s: float, family: str, request_class: str, prompt: int, output: int, request_id: str
    ) -> tuple[str, str]:
        """Route one request as a gateway does (weights drawn, then the canary), submit it; its target."""
        variant, zone = self.fleet.router.pick(family, request_class)
        variant = self.gate.variant_for(variant, zone)
        self.fleet.submit(t_s, zone, variant, prompt, output, request_id, request_class=request_class)
        if self.gate.sent(variant, zone) and self.gate.routes:  # a probe budget ran out
            self.gate.apply(self.fleet, t_s)
        return variant, zone
