"""The simulated fleet as a Kubernetes workload controller: desired replicas from the API server.

With ``governor demo --platform k8s`` the fleet does not read the Redis
desired-replicas hash (the ``sim`` backend's contract); it reads each
(model, zone) workload's ``spec.replicas`` from the Kubernetes API server, as
a Deployment controller would, and writes the replicas it runs back through
the ``status`` subresource (``replicas`` = ready + starting,
``readyReplicas`` = ready), as the controller and the kubelets would.  The
executors scale the same objects with the ``k8s`` backend and report their
status as replica truth (:mod:`executors.platform`), so the whole actuation
path is the one a real cluster has: command -> ``scale`` subresource ->
workload controller -> status -> governor.

:class:`KubePlatform` uses the official client (in a worker thread; calls are
blocking).  A failed read keeps the fleet's current desired count (the API
server being unreachable never scales anything); a failed status write is
retried on the next tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from kubernetes import client as k8s

from core.workload_api import WorkloadApi
from core.workloads import Workload

__all__ = ["KubePlatform"]

log = logging.getLogger(__name__)


class KubePlatform:
    """Reads desired replicas of, and writes status to, the workloads of (model, zone)."""

    def __init__(self, api: k8s.ApiClient, workloads: Iterable[Workload], timeout_s: float = 5.0) -> None:
        self.api = api
        self.apps = k8s.AppsV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.calls = WorkloadApi(self.apps, self.custom, timeout_s)
        self.workloads = {w.key: w for w in workloads}
        self.timeout_s = timeout_s
        self.read_failures = 0
        self.write_failures = 0

    def _spec_replicas(self, w: Workload) -> int | None:
        scale = self.calls.read_scale(w)
        if isinstance(scale, dict):  # a custom resource's scale subresource
            spec = scale.get("spec")
            value = spec.get("replicas") if isinstance(spec, dict) else None
            return value if isinstance(value, int) else None
        return None if scale.spec is None else scale.spec.replicas

    def _write_status(self, w: Workload, ready: int, starting: int) -> None:
        body = {"status": {"replicas": ready + starting, "readyReplicas": ready, "availableReplicas": ready}}
        self.calls.patch_status(w, body)

    async def scale_to(self, model: str, zone: str, replicas: int) -> None:
        """Set a workload's ``spec.replicas`` (the demo's starting fleet; errors propagate: nothing runs without it)."""
        w = self.workloads.get((model, zone))
        if w is None:
            raise KeyError(f"no workload mapped for ({model}, {zone}) in GOVERNOR_WORKLOADS")
        await asyncio.to_thread(self.calls.patch_scale, w, replicas)

    async def desired(self, model: str, zone: str) -> int | None:
        """``spec.replicas`` of the workload of (model, zone); None when unmapped or unreadable (keep as is)."""
        w = self.workloads.get((model, zone))
        if w is None:
            return None
        try:
            value = await asyncio.to_thread(self._spec_replicas, w)
        except Exception as exc:  # the API server down: the fleet keeps what it runs
            self.read_failures += 1
            log.warning("platform: desired replicas of %s/%s not read (%s)", zone, model, exc)
            return None
        return value if isinstance(value, int) and value >= 0 else None

    async def report(self, model: str, zone: str, ready: int, starting: int) -> None:
        """Write the replicas the fleet runs to the workload's status (the controller's and kubelets' part)."""
        w = self.workloads.get((model, zone))
        if w is None:
            return
        try:
            await asyncio.to_thread(self._write_status, w, ready, starting)
        except Exception as exc:
            self.write_failures += 1
            log.warning("platform: status of %s/%s not written (%s)", zone, model, exc)
