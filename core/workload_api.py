"""Reads and merge-patches of a workload through the official Kubernetes client, by kind.

A :class:`~core.workloads.Workload` is a Deployment, a StatefulSet or a
custom resource with a scale subresource (a LeaderWorkerSet); each kind has
its own client method for the object, its ``scale`` and its ``status``.  The
k8s backend (:mod:`executors.k8s`) and the simulated platform
(:mod:`sim.k8s_platform`) both go through :class:`WorkloadApi`, so the
dispatch lives in one place.  It takes the client's API objects
(``AppsV1Api``, ``CustomObjectsApi``) and does not import the client.

Writes are JSON merge patches (``application/merge-patch+json``): the
client's default PATCH content type for these calls is JSON Patch, which an
API server refuses for an object body.

Examples
--------
>>> from core.workloads import Workload
>>> class Apps:
...     def read_namespaced_deployment_scale(self, name, namespace, **kw):
...         return (name, namespace, kw)
>>> api = WorkloadApi(Apps(), None, timeout_s=2.0)
>>> api.read_scale(Workload("m", "az-a", "Deployment", "vllm", namespace="llm"))
('vllm', 'llm', {'_request_timeout': 2.0})
"""

from __future__ import annotations

from typing import Any

from core.workloads import Workload

__all__ = ["MERGE_PATCH", "WorkloadApi"]

MERGE_PATCH = "application/merge-patch+json"

# operation -> (Deployment method, StatefulSet method) on AppsV1Api, custom-resource method on CustomObjectsApi
_METHODS: dict[str, tuple[str, str, str]] = {
    "read": ("read_namespaced_deployment", "read_namespaced_stateful_set", "get_namespaced_custom_object"),
    "read_scale": (
        "read_namespaced_deployment_scale",
        "read_namespaced_stateful_set_scale",
        "get_namespaced_custom_object_scale",
    ),
    "patch": ("patch_namespaced_deployment", "patch_namespaced_stateful_set", "patch_namespaced_custom_object"),
    "patch_scale": (
        "patch_namespaced_deployment_scale",
        "patch_namespaced_stateful_set_scale",
        "patch_namespaced_custom_object_scale",
    ),
    "patch_status": (
        "patch_namespaced_deployment_status",
        "patch_namespaced_stateful_set_status",
        "patch_namespaced_custom_object_status",
    ),
}


class WorkloadApi:
    """The calls on one workload's object and its ``scale`` / ``status`` subresources."""

    def __init__(self, apps: Any, custom: Any, timeout_s: float) -> None:
        self.apps, self.custom, self.timeout_s = apps, custom, timeout_s

    def _call(self, op: str, w: Workload, body: dict[str, Any] | None = None) -> Any:
        deployment, stateful_set, custom = _METHODS[op]
        args = () if body is None else (body,)
        kw: dict[str, Any] = {"_request_timeout": self.timeout_s}
        if body is not None:
            kw["_content_type"] = MERGE_PATCH
        if w.kind == "Deployment":
            return getattr(self.apps, deployment)(w.name, w.namespace, *args, **kw)
        if w.kind == "StatefulSet":
            return getattr(self.apps, stateful_set)(w.name, w.namespace, *args, **kw)
        group, version, plural = w.api
        return getattr(self.custom, custom)(group, version, w.namespace, plural, w.name, *args, **kw)

    def read(self, w: Workload) -> Any:
        """The workload object (a client model for the built-in kinds, a dict for a custom resource)."""
        return self._call("read", w)

    def read_scale(self, w: Workload) -> Any:
        """Its ``scale`` subresource (a ``V1Scale``, or a dict for a custom resource)."""
        return self._call("read_scale", w)

    def patch(self, w: Workload, body: dict[str, Any]) -> Any:
        return self._call("patch", w, body)

    def patch_scale(self, w: Workload, replicas: int) -> Any:
        """``spec.replicas`` of its ``scale`` subresource."""
        return self._call("patch_scale", w, {"spec": {"replicas": replicas}})

    def patch_status(self, w: Workload, body: dict[str, Any]) -> Any:
        return self._call("patch_status", w, body)
