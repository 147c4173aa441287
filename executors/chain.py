"""One executor, several backends: each command kind goes to the backend configured for it.

``GOVERNOR_EXECUTOR_BACKENDS`` is a comma-separated list of ``kind=backend``
(:func:`parse_spec`): a kind of :data:`loop.commands.COMMAND_KINDS`, or
``*`` for every kind not named; a backend of :data:`REGISTRY`.  For
example ``scale=sim,relocate=webhook,route=routing,breaker=routing,
canary=routing`` sends scale commands to the cluster, relocations to a
platform's webhook and traffic commands to the gateway's hashes -- and
refuses ``agents`` commands: a kind with no backend is ``rejected``, reason
``no backend for agents commands (GOVERNOR_EXECUTOR_BACKENDS=...)``, never
dropped.  Unset, ``governor executor --backend X`` sends every kind to
``X`` as it always did (one backend, no chain).

:class:`ChainBackend` builds each named backend once and closes each once
(:meth:`ChainBackend.close`, at shutdown).  Every result names the backend
that applied the command (``backend`` of the results record,
:func:`executors.backends.applied_by`).  The executor's checks (signature, expiry, order, the
``governor pause`` switch: ``advisory``) come before any backend, so they
hold for every backend of a chain.

A backend is one :data:`REGISTRY` entry: a name and a factory from
:class:`BackendContext` to the backend (``k8s``: :mod:`executors.k8s`, ``gateway``:
:mod:`executors.gateway`, their Kubernetes client imported only when named).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from core.settings import Settings, SettingsError
from executors.backends import Backend, DryRunBackend, RoutingBackend, SimFleetBackend
from executors.budget import BudgetedBackend, FleetBudget, ZoneBudget
from executors.errors import BackendRefused
from executors.webhook import WebhookBackend
from loop.commands import COMMAND_KINDS, Command

__all__ = [
    "REGISTRY",
    "BackendContext",
    "ChainBackend",
    "build_backend",
    "close_backend",
    "parse_spec",
    "with_budget",
]

MAX_SPEC_CHARS = 2000


@dataclass(frozen=True)
class BackendContext:
    """What a backend factory may use: the zone's Redis, names, settings, the webhook URL override."""

    redis: aioredis.Redis
    prefix: str
    zone: str
    settings: Settings
    webhook_url: str = ""
    budget: FleetBudget | None = None


def _k8s(c: BackendContext) -> Backend:
    from executors.k8s import KubernetesBackend, api_client  # the Kubernetes client loads only where it is used

    mine = [w for w in c.settings.workloads if w.zone == c.zone]
    if not mine:
        raise SettingsError(f"the k8s backend of zone {c.zone} has no workload in GOVERNOR_WORKLOADS")
    return KubernetesBackend(api_client(c.settings.kubeconfig, c.settings.k8s_api_url), mine)


def _local(c: BackendContext) -> Backend:
    from executors.local import LocalBackend  # aiohttp's server and the engine pool load only where used

    return LocalBackend.from_settings(c.settings, c.zone)


def _gateway(c: BackendContext) -> Backend:
    from executors.gateway import GatewayBackend
    from executors.k8s import api_client

    if not any(r.zone == c.zone for r in c.settings.gateway_routes):
        raise SettingsError(f"the gateway backend of zone {c.zone} has no route in GOVERNOR_GATEWAY_ROUTES")
    return GatewayBackend(api_client(c.settings.kubeconfig, c.settings.k8s_api_url), c.settings.gateway_routes, c.zone)


#: Backend name -> factory.  One entry per backend.
REGISTRY: dict[str, Callable[[BackendContext], Backend]] = {
    "sim": lambda c: SimFleetBackend(c.redis, c.prefix, c.zone, c.budget),
    "dry-run": lambda c: DryRunBackend(),
    "routing": lambda c: RoutingBackend(c.redis, c.prefix),
    "webhook": lambda c: WebhookBackend.from_settings(c.settings, c.webhook_url),
    "k8s": _k8s,
    "gateway": _gateway,
    "local": _local,
}


#: Backends that enforce the fleet budget themselves (sim: its desired hash is the budget's ledger) or that
#: change no replicas (dry-run, routing); every other one is wrapped in :class:`BudgetedBackend`.
SELF_BUDGETED = ("sim", "dry-run", "routing")


def with_budget(backend: Backend, ctx: BackendContext) -> Backend:
    """``backend`` with the zone's fleet budget enforced on its scale commands (:mod:`executors.budget`)."""
    if ctx.budget is None or backend.name in SELF_BUDGETED or "scale" not in getattr(backend, "KINDS", ("scale",)):
        return backend
    return BudgetedBackend(backend, ZoneBudget(ctx.redis, ctx.prefix, ctx.zone, ctx.budget))


def parse_spec(raw: str, backends: Mapping[str, object] = REGISTRY) -> dict[str, str]:
    """``kind -> backend name`` of a ``GOVERNOR_EXECUTOR_BACKENDS`` value, ``*`` expanded;
    :class:`SettingsError` naming the bad item.

    >>> parse_spec("*=dry-run, scale=sim")["scale"], parse_spec("*=dry-run,scale=sim")["route"]
    ('sim', 'dry-run')
    >>> sorted(parse_spec("scale=sim,route=routing"))
    ['route', 'scale']
    >>> parse_spec("scale=nomad")
    Traceback (most recent call last):
    ...
    core.settings.SettingsError: GOVERNOR_EXECUTOR_BACKENDS: unknown backend 'nomad' for scale (known: dry-run, gateway, k8s, local, routing, sim, webhook)
    """
    what = "GOVERNOR_EXECUTOR_BACKENDS"
    if not isinstance(raw, str) or len(raw) > MAX_SPEC_CHARS:
        raise SettingsError(f"{what}: must be a string of at most {MAX_SPEC_CHARS} characters")
    named: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        kind, eq, backend = (x.strip() for x in item.partition("="))
        if not eq or not kind or not backend:
            raise SettingsError(f"{what}: {item[:80]!r} is not kind=backend")
        if kind != "*" and kind not in COMMAND_KINDS:
            raise SettingsError(f"{what}: unknown kind {kind[:40]!r} (known: *, {', '.join(sorted(COMMAND_KINDS))})")
        if backend not in backends:
            raise SettingsError(
                f"{what}: unknown backend {backend[:40]!r} for {kind} (known: {', '.join(sorted(backends))})"
            )
        if kind in named:
            raise SettingsError(f"{what}: {kind} is given twice")
        named[kind] = backend
    if not named:
        raise SettingsError(f"{what}: names no kind=backend")
    rest = named.pop("*", None)
    out: dict[str, str] = {}
    for k in sorted(COMMAND_KINDS):
        chosen = named.get(k, rest)
        if chosen is not None:
            out[k] = chosen
    return out


class ChainBackend:
    """Applies each command with the backend of its kind (see the module docstring)."""

    name = "chain"

    def __init__(self, routes: Mapping[str, Backend], spec: str = "") -> None:
        self.routes = dict(routes)
        self.spec = spec or ",".join(f"{k}={b.name}" for k, b in sorted(self.routes.items()))
        # Relocation outcomes are relayed from the backend that takes relocate commands (the sim's queue).
        relocate = self.routes.get("relocate")
        self.outcomes_key: str | None = getattr(relocate, "outcomes_key", None)

    def name_for(self, kind: str) -> str:
        """The name of the backend that takes ``kind`` commands ("none" when no backend does)."""
        b = self.routes.get(kind)
        return b.name if b is not None else "none"

    async def apply(self, cmd: Command) -> dict[str, Any]:
        backend = self.routes.get(cmd.kind)
        if backend is None:
            raise BackendRefused(f"no backend for {cmd.kind} commands (GOVERNOR_EXECUTOR_BACKENDS={self.spec})")
        return await backend.apply(cmd)

    def backends(self) -> list[Backend]:
        """Each distinct backend once."""
        seen: dict[int, Backend] = {}
        for b in self.routes.values():
            seen.setdefault(id(b), b)
        return list(seen.values())

    async def close(self) -> None:
        for b in self.backends():
            await close_backend(b)


async def close_backend(backend: Backend) -> None:
    """Await ``backend.close()`` when it has one (aiohttp sessions; a chain closes each member once)."""
    close = getattr(backend, "close", None)
    if callable(close):
        result = close()
        if inspect.isawaitable(result):
            await result


def build_backend(
    ctx: BackendContext,
    backend_name: str | None = None,
    registry: Mapping[str, Callable[[BackendContext], Backend]] = REGISTRY,
) -> Backend:
    """The executor's backend: ``GOVERNOR_EXECUTOR_BACKENDS`` as a :class:`ChainBackend`, else ``--backend``
    (default ``sim``) alone.  :class:`SettingsError` for an unknown name, or when both are given."""
    spec = ctx.settings.executor_backends.strip()
    if spec and backend_name:
        raise SettingsError("give --backend or GOVERNOR_EXECUTOR_BACKENDS, not both")
    if not spec:
        name = backend_name or "sim"
        if name not in registry:
            raise SettingsError(f"unknown backend {name!r} (known: {', '.join(sorted(registry))})")
        return with_budget(registry[name](ctx), ctx)
    kinds = parse_spec(spec, registry)
    # Built once each (a backend shared by several kinds is one instance); none opens a connection yet.
    built = {name: with_budget(registry[name](ctx), ctx) for name in sorted(set(kinds.values()))}
    return ChainBackend({k: built[n] for k, n in kinds.items()}, spec)
