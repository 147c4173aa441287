"""The ``k8s`` backend: scale commands become writes to a workload's ``scale`` subresource.

Each (model, zone) maps to one workload (:mod:`core.workloads`: a Deployment,
StatefulSet or LeaderWorkerSet).  A ``scale`` command, through the official
Kubernetes Python client (synchronous, so each call runs in a worker thread and
the executor's event loop never blocks on the API server):

1. lists the HorizontalPodAutoscalers of the workload's namespace and finds one
   whose ``spec.scaleTargetRef`` is this workload;
2. HPA found, mapping ``hpa: refuse`` (default): the command is *rejected*, naming
   the HPA -- two controllers writing one ``spec.replicas`` undo each other every
   sync period, and the HPA would win within 15 s anyway;
   ``hpa: coexist``: governor merge-patches the HPA's ``spec.minReplicas`` to the
   target (clamped to [1, ``spec.maxReplicas``]; HPAs cannot go below 1 without
   the HPAScaleToZero gate): governor's decision becomes a floor the HPA adds to;
3. no HPA: merge-patches ``spec.replicas`` of the workload's ``scale``
   subresource (``autoscaling/v1`` Scale: the only write RBAC grants,
   ``infra/k8s/rbac-executor.yaml``: verbs get/patch on ``*/scale``);
4. merge-patches the annotations ``governor.io/command-id``,
   ``governor.io/reason`` and ``governor.io/target-replicas`` onto the workload
   (or the HPA in co-exist mode), so ``kubectl describe`` says who set the count
   and why.  An annotation that fails after the scale was written does not undo
   or fail the command (``annotated: false`` in the result).

Errors, by the API server's status: 400/403/404/422 are permanent (*rejected*:
RBAC, a missing workload or a bad mapping does not heal by retrying); 409
(conflict), 429 (throttled, honouring ``Retry-After``) and 5xx, and connection
errors, are retried with exponential backoff inside one bounded time
(``max_wait_s``) and then reported as temporary (:class:`BackendUnavailable`:
the entry stays pending and is redelivered).

Patches are sent as ``application/merge-patch+json`` explicitly: the generated
client's default for a PATCH is ``application/json-patch+json``, which an API
server refuses for an object body.

:meth:`KubernetesBackend.replicas` reads a workload's status for replica
truth: ``ready`` = ``status.readyReplicas``, ``starting`` = ``spec.replicas``
minus ready (pods that are Pending for a GPU, pulling an image or loading
weights all count as starting, so the scaler holds while they wait).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from core.workload_api import MERGE_PATCH, WorkloadApi
from core.workloads import Workload
from executors.backends import BackendRejected, BackendUnavailable
from loop.commands import Command

__all__ = ["ANNOTATION_PREFIX", "MERGE_PATCH", "KubernetesBackend", "api_client", "replica_counts", "retrying"]

log = logging.getLogger(__name__)

ANNOTATION_PREFIX = "governor.io/"
_RETRIED = (409, 429)  # the 4xx worth another try; every 5xx is retried too
_RNG = random.Random()


def api_client(kubeconfig: str = "", host: str = "") -> k8s.ApiClient:
    """An API client: ``host`` (tests, a proxy), else in-cluster config in a pod, else ``kubeconfig``/~/.kube/config."""
    from kubernetes import config

    if host:
        cfg = k8s.Configuration(host=host)
        return k8s.ApiClient(cfg)
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig or None)  # type: ignore[no-untyped-call]
    return k8s.ApiClient()


def _retry_after_s(exc: ApiException, now: float) -> float | None:
    """Seconds a 429/503 asks to wait (``Retry-After``: delta seconds or an HTTP date), None if absent."""
    raw = (exc.headers or {}).get("Retry-After") if exc.headers else None
    if not raw:
        return None
    raw = str(raw).strip()
    if raw.isdigit():
        return float(raw)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def _reason(exc: ApiException) -> str:
    body = (exc.body or "") if isinstance(exc.body, str) else repr(exc.body)
    return f"HTTP {exc.status} {exc.reason}: {body[:200]}"


async def retrying(
    what: str,
    call: Callable[[], dict[str, Any]],
    *,
    max_wait_s: float = 20.0,
    backoff_s: float = 0.25,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Run the blocking API ``call`` in a thread, retrying what may heal (module docstring) within ``max_wait_s``.

    The result gets ``attempts``.  4xx other than 409/429 -> :class:`BackendRejected`;
    out of time -> :class:`BackendUnavailable` with the last error.
    """
    deadline = clock() + max_wait_s
    attempt = 0
    while True:
        attempt += 1
        try:
            out = await asyncio.to_thread(call)
            out["attempts"] = attempt
            return out
        except ApiException as exc:
            if 400 <= (exc.status or 0) < 500 and exc.status not in _RETRIED:
                raise BackendRejected(f"{what}: {_reason(exc)}") from None
            last = _reason(exc)
            wait = _retry_after_s(exc, clock())
        except (BackendRejected, BackendUnavailable):
            raise
        except Exception as exc:  # urllib3 connection/timeout errors: the API server is unreachable
            last, wait = f"{type(exc).__name__}: {exc}", None
        backoff = backoff_s * 2 ** (attempt - 1) * (0.5 + _RNG.random())
        delay = max(backoff, wait or 0.0)
        if clock() + delay > deadline:
            raise BackendUnavailable(f"{what}: {last} (after {attempt} attempts)")
        log.info("%s: %s; retry in %.2f s", what, last, delay)
        await asyncio.sleep(delay)


class KubernetesBackend:
    """Applies ``scale`` commands to the workloads of one zone (see the module docstring)."""

    name = "k8s"
    KINDS = ("scale",)

    def __init__(
        self,
        api: k8s.ApiClient,
        workloads: Iterable[Workload],
        *,
        timeout_s: float = 5.0,
        max_wait_s: float = 20.0,
        backoff_s: float = 0.25,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.workloads = {w.key: w for w in workloads}
        self.apps = k8s.AppsV1Api(api)
        self.autoscaling = k8s.AutoscalingV2Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.calls = WorkloadApi(self.apps, self.custom, timeout_s)
        self.timeout_s, self.max_wait_s, self.backoff_s = timeout_s, max_wait_s, backoff_s
        self.clock = clock

    # -- the command path ------------------------------------------------------------------
    async def apply(self, cmd: Command) -> dict[str, Any]:
        if cmd.kind != "scale" or cmd.target_replicas is None:
            raise BackendRejected(f"k8s backend applies scale commands only, not {cmd.kind!r}")
        w = self.workloads.get((cmd.model, cmd.zone))
        if w is None:
            raise BackendRejected(f"no workload mapped for ({cmd.model}, {cmd.zone}): add it to the workloads section")
        return await retrying(
            f"scale {w.kind}/{w.namespace}/{w.name}",
            lambda: self._scale(w, cmd),
            max_wait_s=self.max_wait_s,
            backoff_s=self.backoff_s,
            clock=self.clock,
        )

    def _scale(self, w: Workload, cmd: Command) -> dict[str, Any]:
        target = int(cmd.target_replicas or 0)
        hpa = self._hpa_for(w)
        annotations = {
            ANNOTATION_PREFIX + "command-id": cmd.command_id,
            ANNOTATION_PREFIX + "reason": cmd.reason[:256],
            ANNOTATION_PREFIX + "target-replicas": str(target),
        }
        if hpa is not None:
            hpa_name = hpa["metadata"]["name"]
            if w.hpa != "coexist":
                raise BackendRejected(
                    f"HorizontalPodAutoscaler {w.namespace}/{hpa_name} scales {w.kind}/{w.name}: governor does not "
                    "write a count an HPA owns (set hpa: coexist in its workloads entry to set the HPA's minReplicas)"
                )
            spec = hpa.get("spec") or {}
            ceiling = int(spec.get("maxReplicas") or target or 1)
            floor = min(max(1, target), ceiling)
            body = {"metadata": {"annotations": annotations}, "spec": {"minReplicas": floor}}
            self.autoscaling.patch_namespaced_horizontal_pod_autoscaler(
                hpa_name, w.namespace, body, _content_type=MERGE_PATCH, _request_timeout=self.timeout_s
            )
            return {
                "workload": f"{w.kind}/{w.namespace}/{w.name}",
                "hpa": hpa_name,
                "min_replicas": floor,
                "previous_min_replicas": spec.get("minReplicas"),
                "capped": floor != target,
            }
        previous = self._read_scale(w)
        self.calls.patch_scale(w, target)
        annotated = True
        try:
            self.calls.patch(w, {"metadata": {"annotations": annotations}})
        except Exception as exc:  # the scale is written; the annotation is a courtesy
            log.warning("annotating %s/%s/%s failed: %s", w.kind, w.namespace, w.name, exc)
            annotated = False
        return {
            "workload": f"{w.kind}/{w.namespace}/{w.name}",
            "previous": previous,
            "replicas": target,
            "annotated": annotated,
        }

    # -- API calls (run in a worker thread) --------------------------------------------------
    def _hpa_for(self, w: Workload) -> dict[str, Any] | None:
        hpas = self.autoscaling.list_namespaced_horizontal_pod_autoscaler(w.namespace, _request_timeout=self.timeout_s)
        doc = self._plain(hpas)
        group = w.api[0]
        for item in doc.get("items") or []:
            ref = (item.get("spec") or {}).get("scaleTargetRef") or {}
            api_version = str(ref.get("apiVersion") or "")
            ref_group = api_version.rpartition("/")[0] if "/" in api_version else ""
            if ref.get("kind") == w.kind and ref.get("name") == w.name and ref_group == group:
                return dict(item)
        return None

    def _read_scale(self, w: Workload) -> int | None:
        scale = self.calls.read_scale(w)
        if w.kind in ("Deployment", "StatefulSet"):
            return None if scale.spec is None else scale.spec.replicas
        return int((self._plain(scale).get("spec") or {}).get("replicas") or 0)

    def _status(self, w: Workload) -> dict[str, Any]:
        return self._plain(self.calls.read(w))

    def _plain(self, obj: object) -> dict[str, Any]:
        """The API's JSON of a client model (camelCase keys, as on the wire); {} for anything else."""
        out = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return out if isinstance(out, dict) else {}

    # -- replica truth -----------------------------------------------------------------------
    async def replicas(self, model: str, zone: str) -> dict[str, int] | None:
        """``{"desired", "ready", "starting"}`` of the workload serving (model, zone); None if unmapped."""
        w = self.workloads.get((model, zone))
        if w is None:
            return None
        obj = await asyncio.to_thread(self._status, w)
        return replica_counts(obj)

    async def close(self) -> None:
        await asyncio.to_thread(self.api.close)


def replica_counts(obj: dict[str, Any]) -> dict[str, int]:
    """Desired, ready and starting replicas of a workload object (Deployment/StatefulSet/LWS JSON).

    >>> replica_counts({"spec": {"replicas": 6}, "status": {"replicas": 6, "readyReplicas": 4}})
    {'desired': 6, 'ready': 4, 'starting': 2}
    >>> replica_counts({"spec": {"replicas": 2}, "status": {"replicas": 5, "readyReplicas": 5}})
    {'desired': 2, 'ready': 5, 'starting': 0}
    """

    def num(v: Any) -> int:
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    desired = num(spec.get("replicas", 1))
    ready = num(status.get("readyReplicas"))
    return {"desired": desired, "ready": ready, "starting": max(0, desired - ready)}
