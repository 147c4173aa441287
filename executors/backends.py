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
  *Fleet budget* (:class:`FleetBudget`: ``GOVERNOR_MAX_REPLICAS_TOTAL`` over
  every model and zone, a model's ``max_replicas_total`` over its zones):
  a scale write is one Lua script (:data:`BUDGET_LUA`, one ``EVAL`` over
  the desired hash of every zone of ``GOVERNOR_ZONES``) that sums the
  desired replicas with the new value in place of this zone's current one
  and refuses an *increase* that would end above a budget
  (:class:`BudgetExceeded`, reported as ``rejected``, reason ``budget:
  ...``); a decrease is always written, so a fleet above a lowered budget
  can come down.  Read, check and write are atomic, so executors of
  different zones racing for the last replicas cannot overshoot together.
  All zones' hashes must live on one Redis (no cluster slots).
* :class:`DryRunBackend` only records what it would do (for rehearsals).
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
  :mod:`streams.agent_weights_driver`): an agent orchestrator serving ``<model>`` in
  that zone reads it and draws each turn's path (retrieval, a tool call or
  plain generation) by ``weights``; it should ignore a field whose
  ``basis_ms`` is older than one it has already used.  Fields starting
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
* :class:`WebhookBackend` POSTs the command's JSON to a URL (timeout, a few
  retries with backoff; a 4xx answer is a rejection, a 5xx or no answer
  is temporary).
"""

from __future__ import annotations

import asyncio
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from core import names
from core.settings import Settings
from streams.command_payloads import BreakerPayload, ScalePayload
from streams.commands import Command

log = logging.getLogger(__name__)


class BackendUnavailable(RuntimeError):
    """Temporary: try the same command again later."""


class BackendRejected(RuntimeError):
    """Permanent: this backend cannot apply this command."""


class BudgetExceeded(BackendRejected):
    """Permanent: the write would take the fleet above a replica budget (outcome ``rejected``)."""


#: KEYS = every zone's desired hash, this zone's first; ARGV = model, desired,
#: model budget, total budget (-1 = none).  Returns {1, previous} when written,
#: {0, "model"|"total", sum, budget} when refused.
BUDGET_LUA = """
local model, desired = ARGV[1], tonumber(ARGV[2])
local model_budget, total_budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local previous = redis.call('HGET', KEYS[1], model)
local model_sum, total_sum = desired, desired
for i, key in ipairs(KEYS) do
  local flat = redis.call('HGETALL', key)
  for j = 1, #flat, 2 do
    if not (i == 1 and flat[j] == model) then
      local n = tonumber(flat[j + 1]) or 0
      total_sum = total_sum + n
      if flat[j] == model then model_sum = model_sum + n end
    end
  end
end
if desired > (tonumber(previous) or 0) then
  if model_budget >= 0 and model_sum > model_budget then return {0, 'model', model_sum, model_budget} end
  if total_budget >= 0 and total_sum > total_budget then return {0, 'total', total_sum, total_budget} end
end
redis.call('HSET', KEYS[1], model, ARGV[2])
return {1, previous or ''}
"""


@dataclass(frozen=True)
class FleetBudget:
    """Replica budgets the sim backend enforces across ``zones`` (see the module docstring)."""

    zones: Sequence[str]
    total: int | None = None  # every model, every zone; None = no budget
    per_model: Mapping[str, int] = field(default_factory=dict)  # model -> replicas over its zones

    @classmethod
    def from_settings(cls, settings: Settings) -> FleetBudget | None:
        """The deployment's budgets, or None when it has none."""
        per_model = {m.name: m.max_replicas_total for m in settings.models if m.max_replicas_total is not None}
        total = settings.max_replicas_total or None
        if total is None and not per_model:
            return None
        return cls(tuple(settings.zones), total, per_model)


class Backend(Protocol):
    name: str

    async def apply(self, cmd: Command) -> dict[str, Any]: ...


class SimFleetBackend:
    name = "sim"

    def __init__(self, redis: aioredis.Redis, prefix: str, zone: str, budget: FleetBudget | None = None) -> None:
        self.redis = redis
        self.key = names.desired_replicas(prefix, zone)
        self.zone = zone
        self.prefix = prefix
        self.budget = budget
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
                previous = await self.redis.hget(self.key, cmd.model)
                await self.redis.hset(self.key, cmd.model, desired)
            else:
                previous = await self._budgeted(cmd.model, desired, self.budget)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise BackendUnavailable(f"redis: {exc}") from exc
        return {"previous_desired": int(previous) if previous is not None else None, "desired": desired}

    async def _budgeted(self, model: str, desired: int, budget: FleetBudget) -> bytes | None:
        """Write ``desired`` through :data:`BUDGET_LUA`; the previous value, or :class:`BudgetExceeded`."""
        keys = [self.key, *(names.desired_replicas(self.prefix, z) for z in budget.zones if z != self.zone)]
        model_budget = budget.per_model.get(model)
        total = budget.total
        reply = await self.redis.eval(
            BUDGET_LUA,
            len(keys),
            *keys,
            model,
            desired,
            -1 if model_budget is None else model_budget,
            -1 if total is None else total,
        )
        if int(reply[0]) == 1:
            return reply[1] or None
        scope = "model" if reply[1] in (b"model", "model") else "total"
        what = f"{model}'s max_replicas_total" if scope == "model" else "GOVERNOR_MAX_REPLICAS_TOTAL"
        raise BudgetExceeded(
            f"budget: {desired} replicas of {model} in {self.zone} would make {int(reply[2])}, above {what}={int(reply[3])}"
        )

    async def _relocate(self, cmd: Command) -> dict[str, Any]:
        req = {**cmd.payload, "model": cmd.model, "command_id": cmd.command_id, "basis_ms": cmd.basis_ms}
        try:
            depth = await self.redis.rpush(names.relocate_queue(self.prefix, self.zone), orjson.dumps(req))
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise BackendUnavailable(f"redis: {exc}") from exc
        return {"queued": True, "node": cmd.payload.get("node"), "queue_depth": int(depth)}


class DryRunBackend:
    name = "dry-run"

    def __init__(self) -> None:
        self.applied: list[Command] = []

    async def apply(self, cmd: Command) -> dict[str, Any]:
        self.applied.append(cmd)
        if cmd.kind == "scale":
            log.info("dry-run: would set %s/%s to %d replicas", cmd.zone, cmd.model, cmd.target_replicas)
        else:
            log.info("dry-run: would apply %s to %s in %s: %s", cmd.kind, cmd.target, cmd.zone, cmd.payload)
        return {"dry_run": True}


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


class WebhookBackend:
    """POSTs the command JSON to ``url`` (stdlib urllib, run in a thread)."""

    name = "webhook"

    def __init__(self, url: str, timeout_s: float = 2.0, retries: int = 3, backoff_s: float = 0.2) -> None:
        self.url, self.timeout_s, self.retries, self.backoff_s = url, timeout_s, retries, backoff_s

    def _post(self, body: bytes) -> int:
        req = urllib.request.Request(self.url, data=body, method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - operator-set URL
            return int(resp.status)

    async def apply(self, cmd: Command) -> dict[str, Any]:
        body = cmd.encode()
        last = ""
        for attempt in range(self.retries):
            try:
                status = await asyncio.to_thread(self._post, body)
                return {"status": status, "attempts": attempt + 1}
            except urllib.error.HTTPError as exc:
                if 400 <= exc.code < 500:
                    raise BackendRejected(f"webhook answered {exc.code}") from exc
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, TimeoutError, OSError) as exc:
                last = str(exc)
            await asyncio.sleep(self.backoff_s * 2**attempt)
        raise BackendUnavailable(f"webhook {self.url}: {last} after {self.retries} attempts")
