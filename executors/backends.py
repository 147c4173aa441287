"""Where an executor applies a command.

A backend turns a command into a change of the real (or simulated) fleet.
Backends raise :class:`BackendUnavailable` for temporary trouble (the command
is retried later, not acknowledged) and :class:`BackendRejected` for a
command they can never apply (acknowledged and reported as failed).

* :class:`SimFleetBackend` writes the desired replica count to the Redis hash
  ``<prefix>:fleet:<zone>:desired`` (field = model) that the simulated fleet
  reconciles against -- the same desired-state contract a Kubernetes
  Deployment's ``spec.replicas`` is.
* :class:`DryRunBackend` only records what it would do (for rehearsals).
"""
from __future__ import annotations

import logging
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streams.commands import Command

log = logging.getLogger(__name__)


class BackendUnavailable(RuntimeError):
    """Temporary: try the same command again later."""


class BackendRejected(RuntimeError):
    """Permanent: this backend cannot apply this command."""


class Backend(Protocol):
    name: str

    async def apply(self, cmd: Command) -> dict[str, Any]: ...


def desired_key(prefix: str, zone: str) -> str:
    return f"{prefix}:fleet:{zone}:desired"


class SimFleetBackend:
    name = "sim"

    def __init__(self, redis: aioredis.Redis, prefix: str, zone: str) -> None:
        self.redis = redis
        self.key = desired_key(prefix, zone)
        self.zone = zone

    async def apply(self, cmd: Command) -> dict[str, Any]:
        if cmd.kind != "scale":
            raise BackendRejected(f"sim backend cannot apply {cmd.kind!r} commands")
        try:
            previous = await self.redis.hget(self.key, cmd.model)
            await self.redis.hset(self.key, cmd.model, cmd.target_replicas)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise BackendUnavailable(f"redis: {exc}") from exc
        return {"previous_desired": int(previous) if previous is not None else None,
                "desired": cmd.target_replicas}


class DryRunBackend:
    name = "dry-run"

    def __init__(self) -> None:
        self.applied: list[Command] = []

    async def apply(self, cmd: Command) -> dict[str, Any]:
        self.applied.append(cmd)
        log.info("dry-run: would set %s/%s to %d replicas", cmd.zone, cmd.model, cmd.target_replicas)
        return {"dry_run": True}
