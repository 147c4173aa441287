"""Replica truth from the platform: an executor reports its workloads' status to the worker.

The GPU records of the nodes only count replicas that run and report; a pod
that is Pending for a GPU, pulling an image or loading weights is invisible
there, so the scaler would see too few replicas starting and scale up again.
An executor whose chain has a backend that can read replica counts (the
``k8s`` backend: :meth:`executors.k8s.KubernetesBackend.replicas`) runs a
:class:`PlatformReporter`: every ``GOVERNOR_PLATFORM_REPLICAS_S`` it reads
``{"desired", "ready", "starting"}`` of each workload of its zone and writes
``<prefix>:platform:<zone>:replicas`` (:func:`core.names.platform_replicas`,
field = model, value = JSON with ``at_ms`` on the executor's scaled clock and
``source``).  The worker uses a reading while it is fresh
(:meth:`loop.control_loop.ControlLoop.set_platform_replicas`).

A failed read writes nothing for that workload (the worker's reading ages out
and it falls back to the GPU records); a Redis failure is logged and retried
next period.  Nothing here blocks the command path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import orjson

from core import names

__all__ = ["PlatformReporter", "ReplicaSource", "replica_source"]

log = logging.getLogger(__name__)


class ReplicaSource(Protocol):
    name: str

    async def replicas(self, model: str, zone: str) -> dict[str, int] | None: ...


def replica_source(backend: Any) -> ReplicaSource | None:
    """The backend (or the member of a chain) that can read replica counts, or None."""
    members = backend.backends() if hasattr(backend, "backends") else [backend]
    for b in members:
        if callable(getattr(b, "replicas", None)) and hasattr(b, "workloads"):
            return b  # type: ignore[no-any-return]
    return None


class PlatformReporter:
    """Writes a zone's replica truth every ``interval_s`` (see the module docstring)."""

    def __init__(
        self,
        source: ReplicaSource,
        redis: Any,
        prefix: str,
        zone: str,
        models: Sequence[str],
        now_ms: Callable[[], int],
        interval_s: float = 5.0,
    ) -> None:
        self.source, self.redis, self.zone = source, redis, zone
        self.key = names.platform_replicas(prefix, zone)
        self.models, self.now_ms, self.interval_s = list(models), now_ms, interval_s
        self.failures = 0

    async def report_once(self) -> int:
        """Read every model's workload of this zone and write what was read; returns fields written."""
        fields: dict[str, bytes] = {}
        for model in self.models:
            try:
                counts = await self.source.replicas(model, self.zone)
            except Exception as exc:  # an API hiccup ages this reading out; the GPU records still count
                self.failures += 1
                log.warning("executor %s: replica status of %s not read (%s)", self.zone, model, exc)
                continue
            if counts is None:
                continue  # no workload mapped for this model here
            fields[model] = orjson.dumps({**counts, "at_ms": self.now_ms(), "source": self.source.name})
        if fields:
            try:
                await self.redis.hset(self.key, mapping=fields)
            except Exception as exc:
                self.failures += 1
                log.warning("executor %s: replica truth not written to %s (%s)", self.zone, self.key, exc)
                return 0
        return len(fields)

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            await self.report_once()
            try:
                await asyncio.wait_for(stopping.wait(), timeout=self.interval_s)
            except TimeoutError:
                pass
