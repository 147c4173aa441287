"""A small Kubernetes API server for tests: the real paths and JSON shapes, state in a dict.

No API server runs on the test machines and no test may need ``kubectl``, so the code
that talks to Kubernetes (engine discovery, the k8s executor backend) is tested against
this server through the *official* ``kubernetes`` client, pointed at it with a
``Configuration(host=api.url)``.  It serves (shapes as in the API reference,
kubernetes.io/docs/reference/kubernetes-api):

* discovery: ``/version``, ``/api`` (APIVersions), ``/apis`` (APIGroupList), and the
  APIResourceList of each group version (enough for the dynamic client);
* core/v1: pods (list with ``labelSelector`` and ``fieldSelector``, get, watch) and nodes
  (list, get; labels such as ``topology.kubernetes.io/zone``);
* apps/v1: deployments and statefulsets (list, get, watch, PATCH) and their ``scale``
  subresource (GET/PUT/PATCH; an ``autoscaling/v1`` Scale whose ``status.selector`` is the
  string form of the selector);
* autoscaling/v2 horizontalpodautoscalers (list, get); gateway.networking.k8s.io/v1
  httproutes (list, get, PATCH).

Lists carry ``metadata.resourceVersion``; a watch (``?watch=true``) streams the events
after ``resourceVersion`` as one JSON object per line (``{"type": "ADDED"|"MODIFIED"|
"DELETED", "object": ...}``, chunked) until ``timeoutSeconds``.  PATCH understands
``application/merge-patch+json`` (RFC 7386), ``application/strategic-merge-patch+json``
(merged the same way: every field these tests patch is a map or a scalar) and
``application/json-patch+json`` (RFC 6902: add/replace/remove/test); a JSON Patch whose
body is not a list is a 400, as on the real server (the official client sends a dict as a
strategic merge patch and a list as a JSON Patch).
Errors are ``Status`` objects (``kind: Status``, ``code``, ``reason`` NotFound / Conflict
/ ...); a PATCH or PUT whose ``metadata.resourceVersion`` is not the stored one is a 409.
``inject(code, times, path=...)`` makes the next calls fail (403, 429 with
``Retry-After``, 5xx) for retry tests; ``requests`` records what was called.

Seed state with :meth:`KubeAPI.add_pod`, :meth:`add_node`, :meth:`add_deployment`,
:meth:`add_statefulset`, :meth:`add_hpa`, :meth:`add_httproute`, or :meth:`put` for any
served resource.  A scale write updates ``spec.replicas``; with ``auto_ready`` (default)
the workload's status follows at once (a test that wants a slow rollout sets it False
and calls :meth:`set_status`).
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["KubeAPI", "match_labels", "parse_selector"]

# group/version -> {plural: (kind, namespaced)}
RESOURCES: dict[str, dict[str, tuple[str, bool]]] = {
    "v1": {"pods": ("Pod", True), "nodes": ("Node", False), "namespaces": ("Namespace", False)},
    "apps/v1": {"deployments": ("Deployment", True), "statefulsets": ("StatefulSet", True)},
    "autoscaling/v2": {"horizontalpodautoscalers": ("HorizontalPodAutoscaler", True)},
    "gateway.networking.k8s.io/v1": {"httproutes": ("HTTPRoute", True)},
    "leaderworkerset.x-k8s.io/v1": {"leaderworkersets": ("LeaderWorkerSet", True)},
}
GROUP_NAMES = {"apps": "apps", "autoscaling": "autoscaling", "gateway.networking.k8s.io": "gateway.networking.k8s.io"}
SCALABLE = {"deployments", "statefulsets", "leaderworkersets"}
WITH_STATUS = SCALABLE  # objects whose status is written through the status subresource
MAX_BODY = 1 << 20
_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    def __init__(self, code: int, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": _REASONS.get(self.code, "Unknown"),
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


# -- label selectors (the query-param syntax) -------------------------------------------


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [p.strip() for p in out if p.strip()]


def parse_selector(selector: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """``a=b,c!=d,e in (x,y),f notin (z),g,!h`` -> ``[(key, op, values)]`` (ValueError if bad).

    >>> parse_selector("app=vllm,tier in (a, b),!canary")
    [('app', '=', ('vllm',)), ('tier', 'in', ('a', 'b')), ('canary', '!', ())]
    """
    reqs: list[tuple[str, str, tuple[str, ...]]] = []
    for part in _split_top(selector or ""):
        for op in (" notin ", " in "):
            if op in part:
                key, _, rest = part.partition(op)
                rest = rest.strip()
                if not (rest.startswith("(") and rest.endswith(")")):
                    raise ValueError(f"bad set in selector {part!r}")
                vals = tuple(v.strip() for v in rest[1:-1].split(",") if v.strip())
                reqs.append((key.strip(), op.strip(), vals))
                break
        else:
            if "!=" in part:
                k, _, v = part.partition("!=")
                reqs.append((k.strip(), "!=", (v.strip(),)))
            elif "==" in part or "=" in part:
                k, _, v = part.partition("==") if "==" in part else part.partition("=")
                reqs.append((k.strip(), "=", (v.strip(),)))
            elif part.startswith("!"):
                reqs.append((part[1:].strip(), "!", ()))
            else:
                reqs.append((part, "exists", ()))
    for key, _, _ in reqs:
        if not key or any(c in key for c in " ()=!"):
            raise ValueError(f"bad key {key!r} in selector {selector!r}")
    return reqs


def match_labels(labels: dict[str, str], reqs: list[tuple[str, str, tuple[str, ...]]]) -> bool:
    for key, op, vals in reqs:
        have = key in labels
        v = labels.get(key)
        if op == "=":
            ok = have and v == vals[0]
        elif op == "!=":
            ok = not have or v != vals[0]
        elif op == "in":
            ok = have and v in vals
        elif op == "notin":
            ok = not have or v not in vals
        else:
            ok = have if op == "exists" else not have
        if not ok:
            return False
    return True


def _field(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def _match_fields(obj: dict[str, Any], selector: str) -> bool:
    for part in _split_top(selector):
        if "!=" in part:
            k, _, v = part.partition("!=")
            if _field(obj, k.strip()) == v.strip():
                return False
        else:
            k, _, v = part.partition("==") if "==" in part else part.partition("=")
            if _field(obj, k.strip()) != v.strip():
                return False
    return True


# -- patches --------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, ``null`` deletes, anything else replaces.

    >>> merge_patch({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}})
    {'a': 1, 'b': {'d': 3, 'e': 4}}
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ApiError(422, f"json patch path {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 ``add``/``replace``/``remove``/``test`` on maps and lists."""
    if not isinstance(ops, list):
        raise ApiError(400, "the body of the request was in an unknown format: a JSON Patch is a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "path" not in op or op.get("op") not in ("add", "replace", "remove", "test"):
            raise ApiError(422, f"unsupported json patch operation {op!r}")
        *parents, last = _pointer(op["path"])
        cur = doc
        for p in parents:
            cur = cur[int(p)] if isinstance(cur, list) else cur.get(p) if isinstance(cur, dict) else None
            if cur is None:
                raise ApiError(422, f"json patch path {op['path']!r} does not exist")
        kind = op["op"]
        if kind == "test":
            got = cur[int(last)] if isinstance(cur, list) else cur.get(last)
            if got != op.get("value"):
                raise ApiError(422, f"json patch test failed at {op['path']!r}")
        elif kind == "remove":
            if isinstance(cur, list):
                cur.pop(int(last))
            elif last in cur:
                del cur[last]
            else:
                raise ApiError(422, f"json patch remove: {op['path']!r} does not exist")
        elif isinstance(cur, list):
            idx = len(cur) if last == "-" else int(last)
            if kind == "add":
                cur.insert(idx, op.get("value"))
            else:
                cur[idx] = op.get("value")
        else:
            if kind == "replace" and last not in cur:
                raise ApiError(422, f"json patch replace: {op['path']!r} does not exist")
            cur[last] = op.get("value")
    return doc


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class _Fault:
    code: int
    times: int
    path: str
    method: str


class KubeAPI:
    """The server's state and its HTTP front (``with KubeAPI() as api: api.url``)."""

    def __init__(self, auto_ready: bool = True) -> None:
        self.auto_ready = auto_ready
        self._lock = threading.Condition()
        self._objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (gv, plural, ns, name)
        self._events: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, gv/plural, type, object)
        self._rv = 1000
        self._faults: list[_Fault] = []
        self.requests: list[tuple[str, str, str]] = []  # (method, path?query, content type)
        self._server: ThreadingHTTPServer | None = None
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> KubeAPI:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        api = self

        class Handler(_Handler):
            server_api = api

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="kube-api", daemon=True).start()
        return self.url

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None, "KubeAPI not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def client_configuration(self) -> Any:
        """A ``kubernetes.client.Configuration`` pointed at this server (no auth)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        return cfg

    # -- faults ----------------------------------------------------------------------------

    def inject(self, code: int, times: int = 1, *, path: str = "", method: str = "") -> None:
        """The next ``times`` requests whose path contains ``path`` (and of ``method``) fail with ``code``."""
        with self._lock:
            self._faults.append(_Fault(code, times, path, method.upper()))

    def _fault(self, method: str, path: str) -> int | None:
        with self._lock:
            for f in self._faults:
                if f.times > 0 and f.path in path and (not f.method or f.method == method):
                    f.times -= 1
                    return f.code
        return None

    # -- state -------------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def put(self, gv: str, plural: str, obj: dict[str, Any], *, event: str | None = None) -> dict[str, Any]:
        """Create or replace ``obj`` (metadata filled in) and emit its watch event."""
        kind, namespaced = RESOURCES[gv][plural]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            raise ValueError("metadata.name is required")
        ns = meta.setdefault("namespace", "default") if namespaced else ""
        obj["apiVersion"], obj["kind"] = gv, kind
        with self._lock:
            key = (gv, plural, ns, meta["name"])
            old = self._objects.get(key)
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"] if old else _now())
            meta.setdefault("generation", 1)
            meta["resourceVersion"] = self._next_rv()
            self._objects[key] = obj
            self._emit(gv, plural, event or ("MODIFIED" if old else "ADDED"), obj)
        return copy.deepcopy(obj)

    def delete(self, gv: str, plural: str, name: str, namespace: str = "default") -> None:
        ns = namespace if RESOURCES[gv][plural][1] else ""
        with self._lock:
            obj = self._objects.pop((gv, plural, ns, name))
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit(gv, plural, "DELETED", obj)

    def get(self, gv: str, plural: str, name: str, namespace: str = "default") -> dict[str, Any]:
        ns = namespace if RESOURCES[gv][plural][1] else ""
        with self._lock:
            return copy.deepcopy(self._objects[(gv, plural, ns, name)])

    def _emit(self, gv: str, plural: str, kind: str, obj: dict[str, Any]) -> None:
        self._events.append((int(obj["metadata"]["resourceVersion"]), f"{gv}/{plural}", kind, copy.deepcopy(obj)))
        del self._events[:-10_000]  # bounded: an older resourceVersion gets 410 Gone
        self._lock.notify_all()

    # -- seeds -------------------------------------------------------------------------------

    def add_node(self, name: str, zone: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
        lab = {"kubernetes.io/hostname": name, **(labels or {})}
        if zone is not None:
            lab["topology.kubernetes.io/zone"] = zone
        node = {
            "metadata": {"name": name, "labels": lab},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        return self.put("v1", "nodes", node)

    def add_pod(
        self,
        name: str,
        *,
        namespace: str = "default",
        labels: dict[str, str] | None = None,
        ip: str = "10.0.0.1",
        node: str = "node-a",
        phase: str = "Running",
        ready: bool = True,
        port: int = 8000,
        deleting: bool = False,
    ) -> dict[str, Any]:
        pod: dict[str, Any] = {
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "engine",
                        "image": "vllm/vllm-openai",
                        "ports": [{"containerPort": port, "protocol": "TCP"}],
                    }
                ],
            },
            "status": {
                "phase": phase,
                "podIP": ip,
                "podIPs": [{"ip": ip}] if ip else [],
                "conditions": [
                    {"type": "Initialized", "status": "True"},
                    {"type": "Ready", "status": "True" if ready else "False"},
                    {"type": "ContainersReady", "status": "True" if ready else "False"},
                ],
            },
        }
        if not ip:
            pod["status"].pop("podIP")
        if deleting:
            pod["metadata"]["deletionTimestamp"] = _now()
        return self.put("v1", "pods", pod)

    def _workload(self, name: str, namespace: str, replicas: int, labels: dict[str, str] | None) -> dict[str, Any]:
        lab = labels or {"app": name}
        return {
            "metadata": {"name": name, "namespace": namespace, "labels": dict(lab), "generation": 1},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": dict(lab)},
                "template": {"metadata": {"labels": dict(lab)}, "spec": {"containers": [{"name": "engine"}]}},
            },
            "status": {},
        }

    def add_deployment(
        self, name: str, *, namespace: str = "default", replicas: int = 1, labels: dict[str, str] | None = None
    ) -> dict[str, Any]:
        obj = self._workload(name, namespace, replicas, labels)
        obj["status"] = self._ready_status("deployments", replicas, 1)
        return self.put("apps/v1", "deployments", obj)

    def add_statefulset(
        self, name: str, *, namespace: str = "default", replicas: int = 1, labels: dict[str, str] | None = None
    ) -> dict[str, Any]:
        obj = self._workload(name, namespace, replicas, labels)
        obj["spec"]["serviceName"] = name
        obj["status"] = self._ready_status("statefulsets", replicas, 1)
        return self.put("apps/v1", "statefulsets", obj)

    def add_leaderworkerset(
        self, name: str, *, namespace: str = "default", replicas: int = 1, size: int = 2
    ) -> dict[str, Any]:
        """A LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): ``replicas`` groups of ``size`` pods (a leader and workers)."""
        obj = {
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}, "generation": 1},
            "spec": {
                "replicas": replicas,
                "leaderWorkerTemplate": {
                    "size": size,
                    "workerTemplate": {"spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai"}]}},
                },
            },
            "status": {"replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas},
        }
        return self.put("leaderworkerset.x-k8s.io/v1", "leaderworkersets", obj)

    @staticmethod
    def _ready_status(plural: str, replicas: int, generation: int) -> dict[str, Any]:
        st: dict[str, Any] = {
            "observedGeneration": generation,
            "replicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "updatedReplicas": replicas,
        }
        if plural == "leaderworkersets":
            del st["availableReplicas"]
        elif plural == "deployments":
            st["conditions"] = [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}]
        else:
            st["currentReplicas"] = replicas
        return st

    def set_status(self, plural: str, name: str, namespace: str = "default", **status: Any) -> dict[str, Any]:
        """Play the workload controller: merge ``status`` fields (e.g. ``readyReplicas=2``)."""
        gv = next(g for g, res in RESOURCES.items() if plural in res)
        obj = self.get(gv, plural, name, namespace)
        obj["status"] = {**obj.get("status", {}), **status}
        return self.put(gv, plural, obj)

    def add_hpa(
        self, name: str, target: str, *, namespace: str = "default", min_replicas: int = 1, max_replicas: int = 10
    ) -> dict[str, Any]:
        hpa = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
                "minReplicas": min_replicas,
                "maxReplicas": max_replicas,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                    }
                ],
            },
            "status": {"currentReplicas": min_replicas, "desiredReplicas": min_replicas},
        }
        return self.put("autoscaling/v2", "horizontalpodautoscalers", hpa)

    def add_httproute(
        self, name: str, backends: list[tuple[str, int, int]], *, namespace: str = "default"
    ) -> dict[str, Any]:
        """``backends``: (service name, port, weight) of one rule."""
        route = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "parentRefs": [{"name": "inference-gateway"}],
                "rules": [{"backendRefs": [{"name": n, "port": p, "weight": w} for n, p, w in backends]}],
            },
        }
        return self.put("gateway.networking.k8s.io/v1", "httproutes", route)

    # -- request handling (called from the handler thread) -------------------------------------------

    def _list(self, gv: str, plural: str, ns: str | None, query: dict[str, str]) -> dict[str, Any]:
        kind, _ = RESOURCES[gv][plural]
        reqs = parse_selector(query.get("labelSelector", ""))
        fields = query.get("fieldSelector", "")
        with self._lock:
            items = [
                copy.deepcopy(o)
                for (g, p, n, _), o in sorted(self._objects.items())
                if g == gv
                and p == plural
                and (ns is None or n == ns)
                and match_labels(o["metadata"].get("labels") or {}, reqs)
                and (not fields or _match_fields(o, fields))
            ]
            rv = str(self._rv)
        return {"kind": f"{kind}List", "apiVersion": gv, "metadata": {"resourceVersion": rv}, "items": items}

    def _watch(self, gv: str, plural: str, ns: str | None, query: dict[str, str]) -> Iterator[dict[str, Any]]:
        reqs = parse_selector(query.get("labelSelector", ""))
        timeout_s = min(float(query.get("timeoutSeconds") or 30), 300.0)
        deadline = time.monotonic() + timeout_s
        start = query.get("resourceVersion", "")
        with self._lock:
            if start in ("", "0"):
                after = self._rv
                initial = [o for (g, p, n, _), o in sorted(self._objects.items()) if g == gv and p == plural]
                pending: list[tuple[str, dict[str, Any]]] = [("ADDED", copy.deepcopy(o)) for o in initial]
            else:
                after = int(start)
                if self._events and after < self._events[0][0] - 1:
                    raise ApiError(410, f"too old resource version: {after} ({self._events[0][0]})")
                pending = []
        key = f"{gv}/{plural}"
        while True:
            for kind, obj in pending:
                meta = obj["metadata"]
                if (ns is None or meta.get("namespace", "") == ns) and match_labels(meta.get("labels") or {}, reqs):
                    yield {"type": kind, "object": obj}
            with self._lock:
                fresh = [(rv, k, o) for rv, res, k, o in self._events if rv > after and res == key]
                while not fresh and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._lock.wait(min(left, 0.5))
                    fresh = [(rv, k, o) for rv, res, k, o in self._events if rv > after and res == key]
                if self._closed:
                    return
                after = fresh[-1][0]
                pending = [(k, copy.deepcopy(o)) for _, k, o in fresh]

    def _patch_status(self, gv: str, plural: str, ns: str, name: str, body: Any, ctype: str) -> dict[str, Any]:
        """PATCH .../status: only ``status`` of the body is merged (as the API server ignores spec changes there)."""
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            raise ApiError(415, f"status patches here are merge patches (got {ctype!r})")
        if not isinstance(body, dict) or not isinstance(body.get("status", {}), dict):
            raise ApiError(400, "the body of the request was in an unknown format: want a JSON object")
        with self._lock:
            obj = self._objects.get((gv, plural, ns, name))
            if obj is None:
                raise _not_found(gv, plural, name)
            updated = copy.deepcopy(obj)
            updated["status"] = merge_patch(updated.get("status") or {}, body.get("status") or {})
            return self.put(gv, plural, updated)

    def _patch_object(
        self, gv: str, plural: str, ns: str, name: str, body: Any, ctype: str, *, scale: bool, replace: bool
    ) -> dict[str, Any]:
        key = (gv, plural, ns, name)
        with self._lock:
            obj = self._objects.get(key)
            if obj is None:
                raise _not_found(gv, plural, name)
            view = _scale_of(obj) if scale else copy.deepcopy(obj)
            if replace:
                new = body
            elif ctype == "application/json-patch+json":
                new = json_patch(view, body)
            elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                if not isinstance(body, dict):
                    raise ApiError(400, "the body of the request was in an unknown format: want a JSON object")
                new = merge_patch(view, body)
            else:
                raise ApiError(
                    415,
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: application/json-patch+json, application/merge-patch+json, "
                    f"application/apply-patch+yaml, application/strategic-merge-patch+json (got {ctype!r})",
                )
            if not isinstance(new, dict):
                raise ApiError(400, "the patched object is not a JSON object")
            want_rv = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
            if want_rv is not None and str(want_rv) != obj["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    f'Operation cannot be fulfilled on {plural}.{gv.split("/")[0] if "/" in gv else ""} "{name}": '
                    "the object has been modified; please apply your changes to the latest version and try again",
                    {"name": name, "group": gv.split("/")[0] if "/" in gv else "", "kind": plural},
                )
            if scale:
                replicas = (new.get("spec") or {}).get("replicas")
                if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                    raise ApiError(422, f'Scale.autoscaling "{name}" is invalid: spec.replicas: must be >= 0')
                updated = copy.deepcopy(obj)
                if updated["spec"].get("replicas") != replicas:
                    updated["spec"]["replicas"] = replicas
                    updated["metadata"]["generation"] = int(updated["metadata"].get("generation", 1)) + 1
                    if self.auto_ready:
                        updated["status"] = self._ready_status(plural, replicas, updated["metadata"]["generation"])
            else:
                updated = new
                meta = updated.setdefault("metadata", {})
                meta["name"], meta["uid"] = name, obj["metadata"]["uid"]
                if ns:
                    meta["namespace"] = ns
                meta.pop("resourceVersion", None)
                if updated.get("spec") != obj.get("spec"):
                    meta["generation"] = int(obj["metadata"].get("generation", 1)) + 1
            stored = self.put(gv, plural, updated)
        return _scale_of(stored) if scale else stored


def _not_found(gv: str, plural: str, name: str) -> ApiError:
    group = gv.split("/")[0] if "/" in gv else ""
    what = f"{plural}.{group}" if group else plural
    return ApiError(404, f'{what} "{name}" not found', {"name": name, "group": group, "kind": plural})


def _scale_of(obj: dict[str, Any]) -> dict[str, Any]:
    sel = (obj.get("spec") or {}).get("selector", {}).get("matchLabels", {})
    meta = obj["metadata"]
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"],
            "namespace": meta.get("namespace", ""),
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {"replicas": obj["spec"].get("replicas", 0)},
        "status": {
            "replicas": (obj.get("status") or {}).get("replicas", 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(sel.items())),
        },
    }


def _discovery(path: str) -> dict[str, Any] | None:
    if path == "/version":
        return {
            "major": "1",
            "minor": "30",
            "gitVersion": "v1.30.0",
            "gitCommit": "7c48c2bd72b9bf5c44d21d7338cc7bea77d0ad2a",
            "gitTreeState": "clean",
            "buildDate": "2024-04-17T17:27:03Z",
            "goVersion": "go1.22.2",
            "compiler": "gc",
            "platform": "linux/amd64",
        }
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
        }
    if path == "/apis":
        groups = []
        for gv in RESOURCES:
            if "/" in gv:
                g, v = gv.split("/")
                ver = {"groupVersion": gv, "version": v}
                groups.append({"name": g, "versions": [ver], "preferredVersion": ver})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    gv = path.removeprefix("/api/").removeprefix("/apis/")
    if gv in RESOURCES and path in (f"/api/{gv}", f"/apis/{gv}"):
        res = []
        for plural, (kind, namespaced) in RESOURCES[gv].items():
            verbs = ["get", "list", "watch", "patch", "update", "create", "delete"]
            res.append(
                {"name": plural, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind, "verbs": verbs}
            )
            if plural in WITH_STATUS:
                res.append(
                    {
                        "name": f"{plural}/status",
                        "singularName": "",
                        "namespaced": True,
                        "kind": kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if plural in SCALABLE:
                res.append(
                    {
                        "name": f"{plural}/scale",
                        "singularName": "",
                        "namespaced": True,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": res}
    return None


def _route(path: str) -> tuple[str, str, str | None, str | None, str | None]:
    """``path`` -> (group/version, plural, namespace or None, name or None, subresource or None)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        gv, rest = "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        raise ApiError(404, f"the server could not find the requested resource ({path})")
    if gv not in RESOURCES:
        raise ApiError(404, f"the server could not find the requested resource ({path})")
    ns = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        ns, rest = rest[1], rest[2:]
    if not rest or rest[0] not in RESOURCES[gv] or len(rest) > 3:
        raise ApiError(404, f"the server could not find the requested resource ({path})")
    plural = rest[0]
    namespaced = RESOURCES[gv][plural][1]
    if namespaced is False and ns is not None:
        raise ApiError(404, f"the server could not find the requested resource ({path})")
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if sub is not None and not (sub in ("scale", "status") and plural in SCALABLE):
        raise ApiError(404, f"the server could not find the requested resource ({path})")
    if name is not None and namespaced and ns is None:
        raise ApiError(404, f"the server could not find the requested resource ({path})")
    return gv, plural, ns, name, sub


class _Handler(BaseHTTPRequestHandler):
    server_api: KubeAPI
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        api = self.server_api
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        api.requests.append((method, self.path, ctype))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if 0 < length <= MAX_BODY else b""
        try:
            code = api._fault(method, split.path)
            if code is not None:
                raise ApiError(code, f"injected fault {code}")
            if length > MAX_BODY:
                raise ApiError(413, "request entity too large")
            if method == "GET" and (doc := _discovery(split.path.rstrip("/") or "/")) is not None:
                return self._send(200, doc)
            gv, plural, ns, name, sub = _route(split.path)
            if method == "GET" and name is None:
                if query.get("watch") in ("true", "1"):
                    return self._stream(api._watch(gv, plural, ns, query))
                return self._send(200, api._list(gv, plural, ns, query))
            if name is None:
                raise ApiError(405, f"{method} on a collection is not served here")
            key_ns = ns or ""
            if method == "GET":
                try:
                    obj = api.get(gv, plural, name, key_ns) if RESOURCES[gv][plural][1] else api.get(gv, plural, name)
                except KeyError:
                    raise _not_found(gv, plural, name) from None
                return self._send(200, _scale_of(obj) if sub == "scale" else obj)
            if method in ("PATCH", "PUT"):
                try:
                    body = json.loads(raw or b"null")
                except ValueError as exc:
                    raise ApiError(400, f"the body of the request is not JSON: {exc}") from None
                if method == "PUT" and not isinstance(body, dict):
                    raise ApiError(400, "PUT wants a JSON object")
                if sub == "status":  # the workload controller's write: status only, spec untouched
                    out = api._patch_status(gv, plural, key_ns, name, body, ctype)
                    return self._send(200, out)
                out = api._patch_object(
                    gv, plural, key_ns, name, body, ctype, scale=sub == "scale", replace=method == "PUT"
                )
                return self._send(200, out)
            raise ApiError(405, f"method {method} not allowed")
        except ApiError as exc:
            headers = {"Retry-After": "1"} if exc.code == 429 else None
            return self._send(exc.code, exc.status(), headers)
        except ValueError as exc:  # a bad selector
            err = ApiError(400, f"unable to parse requirement: {exc}")
            return self._send(400, err.status())
        except Exception as exc:  # a bug here must show as a 500, not as a dropped connection
            return self._send(500, ApiError(500, f"{type(exc).__name__}: {exc}").status())

    def _stream(self, events: Iterator[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for ev in events:
                line = json.dumps(ev).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        except ApiError as exc:  # 410 Gone before the first event: an ERROR event, as the real server does
            line = json.dumps({"type": "ERROR", "object": exc.status()}).encode() + b"\n"
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n0\r\n\r\n")
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802
        self._handle("GET")

    def do_PATCH(self) -> None:  # noqa: N802
        self._handle("PATCH")

    def do_PUT(self) -> None:  # noqa: N802
        self._handle("PUT")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")
