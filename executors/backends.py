"""Where an executor applies a command.

A backend turns a command into a change of the real (or simulated) fleet.
Backends raise :class:`BackendUnavailable` for temporary trouble (the command
is retried later, not acknowledged) and :class:`BackendRejected` for a
command they can never apply (acknowledged and reported as failed).

* :class:`SimFleetBackend` writes the desired replica count to the Redis hash
  ``<prefix>:fleet:<zone>:desired`` (field = model) that the simulated fleet
  reconciles against -- the same desired-state contract a Kubernetes
  Deployment's ``spec.replicas`` is.
  ``relocate`` commands are pushed (RPUSH) to the Redis list
  ``<prefix>:fleet:<zone>:relocate`` as JSON ``{"node", "model", "max_bytes",
  "expected_generation", "action", "command_id", "basis_ms"}`` (the
  command's result says ``queued``); the live fleet drains it each poll and
  applies it with ``Fleet.relocate`` (the generation check is the fleet's:
  it refuses a node whose allocator generation went *back*, i.e. a
  replaced/restarted node, see :mod:`sim.live`) and reports the outcome to
  ``<prefix>:fleet:<zone>:relocated`` (:attr:`SimFleetBackend.outcomes_key`),
  which the executor relays to the results topic
  (:mod:`executors.outcomes`).
  *Fleet budget* (:class:`~executors.budget.FleetBudget`: ``GOVERNOR_MAX_REPLICAS_TOTAL``
  over every model and zone, a model's ``max_replicas_total`` over its
  zones): a scale write is checked against this zone's allowance and
  written in one optimistic transaction on this zone's keys alone
  (:class:`~executors.budget.ZoneBudget`); an *increase* that would end above
  it is refused (:class:`BudgetExceeded`, reported as ``rejected``, reason
  ``budget: ...``); a decrease is always written.  No script, no other
  zone's key: :mod:`executors.budget` says how the allowances keep the
  fleet within the budget.
* :class:`DryRunBackend` only records and logs what it would do, in each
  kind's words (for rehearsals): ``would set az-a/m to 4 replicas``,
  ``would open breaker on m|az-b``, ``would send 10% of m's requests to
  m@v2``, ... (:func:`would`); the result detail carries the sentence.
* :class:`RoutingBackend` applies ``route`` commands where a gateway reads
  them: the Redis hash ``<prefix>:routing:<zone>``, one field per request
  class (field = class name, value = JSON ``{"weights": {"variant|zone": w},
  "model": family, "command_id", "basis_ms", "issued_at_ms"}``; weights sum
  to 1 per class), plus the field ``_version`` = the command's ``basis_ms``.
  A gateway reads the field of its request's class (falling back to
  ``*``) and draws the target by weight; it should ignore a field whose
  ``basis_ms`` is older than one it has already used.  ``breaker`` commands
  go to ``<prefix>:breaker:<zone>`` (field = the target ``variant|zone``,
  value = JSON of the payload plus ``basis_ms``: ``{"target", "state":
  "closed"|"open"|"half_open", "probe_budget", "threshold", "error_ratio",
  "basis_ms"}``).  ``canary`` commands write the field
  ``_canary|<model>`` of the routing hash (JSON ``{"model", "version",
  "share", "command_id", "basis_ms", "issued_at_ms"}``): the share of
  ``<model>``'s requests a gateway sends to ``<model>@<version>``.
  ``agents`` commands write the field ``_agents|<model>`` of the routing
  hash (JSON ``{"weights": {"rag", "tool", "llm"}, "signals":
  {"stability", "rag_score", "tool_conf"}, "paths": {path: share},
  "model", "command_id", "basis_ms", "issued_at_ms"}``; weights sum to 1,
  :mod:`loop.agent_weights_driver`): an agent orchestrator serving ``<model>`` in
  that zone reads it and draws each turn's path (retrieval, a tool call or
  plain generation) by ``weights``, and a gateway routes the requests of each
  agent class (header ``x-agent-class: rag|tool|llm``) to that class's
  weight of the model's pools (:func:`controllers.agent_weights.pool_shares`;
  the ``gateway`` backend writes them as HTTPRoute rules, :mod:`executors.gateway`);
  either should ignore a field whose ``basis_ms`` is older than one it has already used.  Fields starting
  with ``_`` are not request classes.  The simulated fleet reads the same hashes
  (:meth:`SimFleetBackend.apply` delegates these kinds here).

  What a gateway does with them, in order, per request (the simulated fleet
  does exactly this: :class:`sim.gateway.TrafficGate`, polled every 0.2 s):

  1. *Breakers on the weights.*  An ``open`` target gets no traffic: its
     weight is removed and the others renormalised.  A ``half_open`` target
     keeps 5 % of its share (the rest goes to the closed targets in
     proportion) for at most ``probe_budget`` requests per breaker version
     (``basis_ms``); once they are sent it counts as open until a newer
     breaker version arrives.  ``closed``, or no field, is no change.  If
     every target of a class is open the weights apply unchanged: a breaker
     moves traffic, it does not drop a class.  Without route weights the
     gateway's own zone choice avoids an open ``model|zone`` the same way.
  2. *Draw* the target ``(variant, zone)`` by the resulting weights.
  3. *Canary.*  If zone ``zone``'s routing hash has ``_canary|<variant>``
     and ``<variant>@<version>`` is deployed there, send the request to it
     with probability ``share`` (times that canary target's breaker
     factor: 0 open, 0.05 probing).
  A field is re-read when its version differs from the one in use
  (``_version`` for the classes of a zone, ``basis_ms`` for a canary or
  breaker field); a breaker field that disappears counts as closed.
* :class:`~executors.webhook.WebhookBackend` POSTs the signed command to a
  platform's URL (HMAC header, ``Authorization`` from a secret, 429/5xx
  retried with backoff and ``Retry-After``, other 4xx permanent): the
  contract, and how a receiver verifies a request, is in :mod:`executors.webhook`.

Backends with network sessions have ``async close()``; one executor can send
each kind to a different backend (:mod:`executors.chain`).  The exceptions
are :mod:`executors.errors`'s (re-exported here).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from core import names
from executors.budget import BudgetExceeded, FleetBudget, ZoneBudget
from executors.errors import BackendRefused, BackendRejected, BackendUnavailable
from executors.webhook import WebhookBackend
from loop.command_payloads import (
    AgentsPayload,
    BreakerPayload,
    CanaryPayload,
    RelocatePayload,
    RoutePayload,
    ScalePayload,
)
from loop.commands import Command

__all__ = [
    "Backend",
    "BackendRefused",
    "BackendRejected",
    "BackendUnavailable",
    "BudgetExceeded",
    "DryRunBackend",
    "FleetBudget",
    "RoutingBackend",
    "SimFleetBackend",
    "WebhookBackend",
    "applied_by",
    "would",
]

log = logging.getLogger(__name__)


class Backend(Protocol):
    name: str

    async def apply(self, cmd: Command) -> dict[str, Any]: ...


def applied_by(backend: Backend, kind: str | None) -> str:
    """The name of the backend that applies ``kind`` commands: a chain's member
    (:meth:`executors.chain.ChainBackend.name_for`), else the backend's own name.

    >>> applied_by(DryRunBackend(), "scale")
    'dry-run'
    """
    name_for = getattr(backend, "name_for", None)
    if kind is not None and callable(name_for):
        return str(name_for(kind))
    return backend.name


class SimFleetBackend:
    name = "sim"

    def __init__(self, redis: aioredis.Redis, prefix: str, zone: str, budget: FleetBudget | None = None) -> None:
        self.redis = redis
        self.key = names.desired_replicas(prefix, zone)
        self.zone = zone
        self.prefix = prefix
        self.budget = None if budget is None else ZoneBudget(redis, prefix, zone, budget)
        self.outcomes_key = names.relocated_outcomes(prefix, zone)  # the fleet's relocation outcomes (relayed)

    async def apply(self, cmd: Command) -> dict[str, Any]:
        if cmd.kind in RoutingBackend.KINDS:
            return await RoutingBackend(self.redis, self.prefix).apply(cmd)
        if cmd.kind == "relocate":
            return await self._relocate(cmd)
        if cmd.kind != "scale":
            raise BackendRejected(f"sim backend cannot apply {cmd.kind!r} commands")
        desired = cmd.payload_as(ScalePayload).target_replicas
        try:
            if self.budget is None:
                raw = await self.redis.hget(self.key, cmd.model)
                previous = None if raw is None else int(raw)
                await self.redis.hset(self.key, cmd.model, desired)
            else:
                previous = await self.budget.write(cmd.model, desired)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise BackendUnavailable(f"redis: {exc}") from exc
        return {"previous_desired": previous, "desired": desired}

    async def _relocate(self, cmd: Command) -> dict[str, Any]:
        req = {**cmd.payload, "model": cmd.model, "command_id": cmd.command_id, "basis_ms": cmd.basis_ms}
        try:
            depth = await self.redis.rpush(names.relocate_queue(self.prefix, self.zone), orjson.dumps(req))
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise BackendUnavailable(f"redis: {exc}") from exc
        return {"queued": True, "node": cmd.payload.get("node"), "queue_depth": int(depth)}


def would(cmd: Command) -> str:
    """What applying ``cmd`` would do, in its kind's words (the dry-run backend's log line).

    >>> from loop.commands import Command
    >>> c = Command(kind="breaker", zone="z", model="m|z2", reason="", issued_at_ms=0, expires_at_ms=1, basis_ms=0,
    ...             payload={"target": "m|z2", "state": "open", "probe_budget": 5, "threshold": 0.5, "error_ratio": 0.9})
    >>> would(c)
    'would open breaker on m|z2 (error ratio 0.9 >= threshold 0.5) in z'
    """
    p = cmd.typed_payload
    where = f"in {cmd.zone}"
    if isinstance(p, ScalePayload):
        return f"would set {cmd.zone}/{cmd.model} to {p.target_replicas} replicas"
    if isinstance(p, BreakerPayload):
        verb = {"open": "open", "closed": "close", "half_open": "half-open"}.get(p.state, f"set to {p.state}")
        extra = f"probe budget {p.probe_budget}" if p.state == "half_open" else ""
        if p.state == "open":
            extra = f"error ratio {p.error_ratio:g} >= threshold {p.threshold:g}"
        return f"would {verb} breaker on {p.target}" + (f" ({extra})" if extra else "") + f" {where}"
    if isinstance(p, RoutePayload):
        return f"would route family {cmd.model} {where}: {p.weights}"
    if isinstance(p, CanaryPayload):
        return f"would send {p.share:.0%} of {p.model}'s requests {where} to {p.model}@{p.version}"
    if isinstance(p, RelocatePayload):
        return f"would {p.action} up to {p.max_bytes} KV bytes of {cmd.model} on node {p.node} {where}"
    if isinstance(p, AgentsPayload):
        return f"would set agent path weights of {cmd.model} {where}: {p.weights}"
    return f"would apply {cmd.kind} to {cmd.target} {where}"  # pragma: no cover - every kind is above


class DryRunBackend:
    """Records and logs what each command would do; changes nothing."""

    name = "dry-run"

    def __init__(self) -> None:
        self.applied: list[Command] = []

    async def apply(self, cmd: Command) -> dict[str, Any]:
        self.applied.append(cmd)
        sentence = would(cmd)
        log.info("dry-run: %s (%s)", sentence, cmd.command_id)
        return {"dry_run": True, "would": sentence}


class RoutingBackend:
    """Writes route/breaker/canary/agents commands to Redis hashes (the contract is in the module docstring)."""

    name = "routing"
    KINDS = ("route", "breaker", "canary", "agents")

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix

    async def apply(self, cmd: Command) -> dict[str, Any]:
        try:
            if cmd.kind == "route":
                fields: dict[EncodableT, EncodableT] = {"_version": cmd.basis_ms}
                for cls, ws in cmd.payload["weights"].items():
                    total = sum(ws.values())
                    if total <= 0:
                        raise BackendRejected(f"route: class {cls!r} has no positive weight")
                    fields[cls] = orjson.dumps(
                        {
                            "weights": {t: w / total for t, w in sorted(ws.items())},
                            "model": cmd.model,
                            "command_id": cmd.command_id,
                            "basis_ms": cmd.basis_ms,
                            "issued_at_ms": cmd.issued_at_ms,
                        }
                    )
                await self.redis.hset(names.routing_hash(self.prefix, cmd.zone), mapping=fields)
                return {"classes": sorted(cmd.payload["weights"])}
            if cmd.kind == "breaker":
                target = cmd.payload_as(BreakerPayload).target
                await self.redis.hset(
                    names.breaker_hash(self.prefix, cmd.zone),
                    target,
                    orjson.dumps({**cmd.payload, "basis_ms": cmd.basis_ms}),
                )
                return {"target": target, "state": cmd.payload.get("state")}
            if cmd.kind == "canary":
                share = cmd.payload.get("share")
                if (
                    isinstance(share, bool)
                    or not isinstance(share, int | float)
                    or not 0.0 <= share <= 1.0
                    or not cmd.payload.get("version")
                ):
                    raise BackendRejected(f"canary: needs version and share in [0, 1], got {cmd.payload}")
                await self._model_field(cmd, "_canary")
                return {"model": cmd.model, "version": cmd.payload["version"], "share": float(share)}
            if cmd.kind == "agents":  # the payload was validated by Command
                await self._model_field(cmd, "_agents")
                return {"model": cmd.model, "weights": cmd.payload["weights"]}
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise BackendUnavailable(f"redis: {exc}") from exc
        raise BackendRejected(f"routing backend cannot apply {cmd.kind!r} commands")

    async def _model_field(self, cmd: Command, name: str) -> None:
        """The payload, the model and the command's id and times, as field ``<name>|<model>``."""
        await self.redis.hset(
            names.routing_hash(self.prefix, cmd.zone),
            f"{name}|{cmd.model}",
            orjson.dumps(
                {
                    **cmd.payload,
                    "model": cmd.model,
                    "command_id": cmd.command_id,
                    "basis_ms": cmd.basis_ms,
                    "issued_at_ms": cmd.issued_at_ms,
                }
            ),
        )
