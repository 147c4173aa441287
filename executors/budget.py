"""The fleet budget, enforced by each zone's executor on its own keys alone, for every backend.

The fleet budget (``GOVERNOR_MAX_REPLICAS_TOTAL``, a model's
``max_replicas_total``) is split into per-zone allowances
(:mod:`core.budget`, key :func:`core.names.zone_allowance`), written by one
owner -- the worker at start (an even split, rewritten when the settings
change) or an operator (``governor budget set``) -- and only *read* by the
zone's executor.  Before a scale write the executor checks, in one
optimistic transaction (``WATCH`` the zone's desired hash, ``GET`` the
allowance, ``HGETALL`` the hash, ``MULTI`` / ``HSET`` / ``EXEC``; retried
when another replica of the zone wrote in between), that

* the model's desired replicas in this zone stay within the zone's share of
  the model's ``max_replicas_total``, and
* the sum over the *configured* models (``GOVERNOR_MODELS``) of the zone's
  desired hash stays within the zone's share of the total.  Any other field,
  or a value that is not a replica count, is ignored, logged and counted
  (:attr:`ZoneBudget.ignored_fields`): junk cannot block a scale-up.

Only an *increase* is checked; a decrease is always written, so a zone above
a lowered allowance can come down.  A missing or malformed allowance holds:
no increase (``rejected``, ``budget: ... no valid allowance``), decreases
allowed.  The allowances of all zones sum to at most the budget, so the fleet
stays within it with no cross-zone read, no script and no shared key: each
zone's desired hash is written by its own executor alone (``governor
redis-acl``).  What headroom one zone cannot use, another gets only when the
owner moves it (``governor budget set``).

Every backend that applies ``scale`` commands enforces it: the ``sim``
backend writes the desired hash through :meth:`ZoneBudget.write` itself;
every other (``k8s``, ``gateway``, ``webhook``) is wrapped in
:class:`BudgetedBackend` by :func:`executors.chain.build_backend`: the
zone's desired hash is then the ledger of what the executor asked its
platform for.  An increase is reserved in the ledger before the platform is
asked (and given back when the platform refuses it); a decrease is recorded
after the platform applied it.  So the ledger never shows less than the
platform may run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError

from core import names
from core.budget import Allowance
from core.settings import Settings
from executors.entry import stored_int
from executors.errors import BackendRefused, BackendRejected, BackendUnavailable
from loop.command_payloads import ScalePayload
from loop.commands import Command

__all__ = ["BudgetExceeded", "BudgetedBackend", "FleetBudget", "ZoneBudget"]

log = logging.getLogger(__name__)

#: Optimistic transactions tried before a write is retried later (BackendUnavailable).
MAX_TRIES = 8


class BudgetExceeded(BackendRefused):
    """Permanent: the write would take the zone above its allowance (outcome ``rejected``)."""


@dataclass(frozen=True)
class FleetBudget:
    """The deployment's replica budgets (see the module docstring); ``models``: the configured models,
    the only fields of a desired hash that count."""

    zones: Sequence[str]
    total: int | None = None  # every model, every zone; None = no budget
    per_model: Mapping[str, int] = field(default_factory=dict)  # model -> replicas over its zones
    models: Sequence[str] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> FleetBudget | None:
        """The deployment's budgets, or None when it has none."""
        per_model = {m.name: m.max_replicas_total for m in settings.models if m.max_replicas_total is not None}
        total = settings.max_replicas_total or None
        if total is None and not per_model:
            return None
        return cls(tuple(settings.zones), total, per_model, tuple(m.name for m in settings.models))


class ZoneBudget:
    """Checked writes of one zone's desired hash within the zone's allowance (see the module docstring)."""

    def __init__(self, redis: aioredis.Redis, prefix: str, zone: str, budget: FleetBudget) -> None:
        self.redis, self.zone, self.budget = redis, zone, budget
        self.key = names.desired_replicas(prefix, zone)
        self.allowance_key = names.zone_allowance(prefix, zone)
        self.models = set(budget.models) | set(budget.per_model)
        self.ignored_fields = 0  # junk fields (not a configured model, or not a count) seen in checks

    async def write(self, model: str, desired: int, *, keep_higher: bool = False) -> int | None:
        """Write ``desired`` (``keep_higher``: the larger of it and the stored value) for ``model`` after the
        check of an increase; the previous value.  :class:`BudgetExceeded` when it does not fit,
        :class:`BackendUnavailable` for Redis trouble."""
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                for _ in range(MAX_TRIES):
                    try:
                        await pipe.watch(self.key)
                        raw_allowance = await pipe.get(self.allowance_key)
                        flat = await pipe.hgetall(self.key)
                        previous = _count(flat.get(model.encode()))
                        if desired > (previous or 0):
                            self._check(model, desired, flat, raw_allowance)
                        value = max(desired, previous or 0) if keep_higher else desired
                        pipe.multi()  # type: ignore[no-untyped-call]
                        pipe.hset(self.key, model, value)
                        await pipe.execute()
                        return previous
                    except WatchError:
                        continue
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise BackendUnavailable(f"redis: {exc}") from exc
        raise BackendUnavailable(f"budget: {self.key} changed during {MAX_TRIES} tries; retried later")

    def _check(self, model: str, desired: int, flat: Mapping[Any, Any], raw_allowance: Any) -> None:
        head = f"budget: {desired} replicas of {model} in {self.zone}"
        allowance = Allowance.decode(raw_allowance)
        if allowance is None:
            raise BudgetExceeded(
                f"{head} held: no valid allowance at {self.allowance_key} (the worker writes it at start; "
                "governor budget set)"
            )
        others, junk = 0, []
        for raw_field, raw_value in flat.items():
            name = raw_field.decode("utf-8", "replace") if isinstance(raw_field, bytes) else str(raw_field)
            n = _count(raw_value)
            if name not in self.models or n is None:
                junk.append(name)
            elif name != model:
                others += n
        if junk:
            self.ignored_fields += len(junk)
            log.warning(
                "executor %s: %d field(s) of %s ignored by the budget (not a configured model or not a count): %s",
                self.zone,
                len(junk),
                self.key,
                ", ".join(repr(j[:40]) for j in junk[:5]),
            )
        fleet_model = self.budget.per_model.get(model)
        if fleet_model is not None:
            share = allowance.models.get(model)
            if share is None:
                raise BudgetExceeded(f"{head} held: {self.allowance_key} has no share of {model}'s max_replicas_total")
            cap = min(share, fleet_model)
            if desired > cap:
                raise BudgetExceeded(
                    f"{head} would make {desired}, above {self.zone}'s share {cap} of "
                    f"{model}'s max_replicas_total={fleet_model}"
                )
        if self.budget.total is not None:
            if allowance.total is None:
                raise BudgetExceeded(f"{head} held: {self.allowance_key} has no share of GOVERNOR_MAX_REPLICAS_TOTAL")
            cap = min(allowance.total, self.budget.total)
            if others + desired > cap:
                raise BudgetExceeded(
                    f"{head} would make {others + desired}, above {self.zone}'s allowance {cap} of "
                    f"GOVERNOR_MAX_REPLICAS_TOTAL={self.budget.total}"
                )


def _count(raw: Any) -> int | None:
    """A stored replica count (an int >= 0), or None."""
    n = stored_int(raw)
    return n if n is not None and n >= 0 else None


class BudgetedBackend:
    """``inner`` with the zone's budget enforced on ``scale`` commands (see the module docstring); every
    other attribute is ``inner``'s."""

    def __init__(self, inner: Any, budget: ZoneBudget) -> None:
        self.inner, self.budget = inner, budget
        self.name: str = inner.name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def apply(self, cmd: Command) -> dict[str, Any]:
        if cmd.kind != "scale":
            return dict(await self.inner.apply(cmd))
        desired = cmd.payload_as(ScalePayload).target_replicas
        previous = await self.budget.write(cmd.model, desired, keep_higher=True)  # an increase is reserved
        try:
            out = dict(await self.inner.apply(cmd))
        except (BackendRefused, BackendRejected):
            if desired > (previous or 0):  # never asked for: give the reservation back
                await self.budget.write(cmd.model, previous or 0)
            raise
        if desired < (previous or 0):  # the platform came down: so does the ledger
            await self.budget.write(cmd.model, desired)
        return out
