"""Which platform workload serves each (model, zone): the ``workloads`` section.

An executor with the ``k8s`` backend scales, per (model, zone), one workload
through its ``scale`` subresource; the mapping is data the operator writes
(the config file's ``workloads`` list, or ``GOVERNOR_WORKLOADS`` as JSON),
validated here before any process uses it:

``model``, ``zone``
    governor's names (a model of ``GOVERNOR_MODELS``, a zone of ``GOVERNOR_ZONES``:
    the settings check both).
``kind``
    ``Deployment``, ``StatefulSet`` (``apps/v1``) or ``LeaderWorkerSet``
    (``leaderworkerset.x-k8s.io/v1``, one replica = one leader with its workers).
``name``, ``namespace``
    the object; names follow the Kubernetes DNS rules (RFC 1123 subdomain for
    the name, label for the namespace), so a typo fails here, not at the API.
``hpa``
    what to do when a HorizontalPodAutoscaler targets the workload:
    ``refuse`` (default: governor rejects the command and says which HPA owns
    the workload; two autoscalers writing one ``spec.replicas`` fight) or
    ``coexist`` (governor writes the HPA's ``spec.minReplicas`` as a floor and
    leaves ``spec.replicas`` to the HPA).

>>> ws = parse_workloads([{"model": "m", "zone": "az-a", "kind": "Deployment", "name": "vllm-m", "namespace": "llm"}])
>>> ws[0].key, ws[0].hpa
(('m', 'az-a'), 'refuse')
>>> parse_workloads([{"model": "m", "zone": "az-a", "kind": "Pod", "name": "x"}])
Traceback (most recent call last):
...
ValueError: workloads[0].kind: choose one of Deployment, StatefulSet, LeaderWorkerSet (got 'Pod')
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "KINDS",
    "REF_FIELDS",
    "GatewayRoute",
    "Workload",
    "parse_routes",
    "parse_workloads",
    "routes_schema",
    "workloads_schema",
]

#: kind -> (API group, version, plural)
KINDS: dict[str, tuple[str, str, str]] = {
    "Deployment": ("apps", "v1", "deployments"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
}
HPA_MODES = ("refuse", "coexist")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_FIELDS = ("model", "zone", "kind", "name", "namespace", "hpa")
_ROUTE_FIELDS = ("family", "zone", "route", "namespace", "rules", "backends", "agent_pools")
REF_FIELDS = ("name", "port", "namespace", "kind", "group")


@dataclass(frozen=True)
class Workload:
    model: str
    zone: str
    kind: str
    name: str
    namespace: str = "default"
    hpa: str = "refuse"

    @property
    def key(self) -> tuple[str, str]:
        return (self.model, self.zone)

    @property
    def api(self) -> tuple[str, str, str]:
        """(group, version, plural) of the workload's kind."""
        return KINDS[self.kind]

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _str(where: str, item: dict[str, Any], name: str, default: str | None = None) -> str:
    value = item.get(name, default)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}.{name}: must be a non-empty string (got {value!r})")
    return value


def parse_workloads(raw: Any) -> tuple[Workload, ...]:
    """Validate a list of workload objects; ValueError names the first bad field's path."""
    if not isinstance(raw, list):
        raise ValueError(f"workloads: must be a list of objects (got {type(raw).__name__})")
    out: list[Workload] = []
    seen: dict[tuple[str, str], int] = {}
    for i, item in enumerate(raw):
        where = f"workloads[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: must be an object (got {type(item).__name__})")
        extra = sorted(set(item) - set(_FIELDS))
        if extra:
            raise ValueError(f"{where}: unknown field {extra[0]!r} (fields: {', '.join(_FIELDS)})")
        w = Workload(
            _str(where, item, "model"),
            _str(where, item, "zone"),
            _str(where, item, "kind"),
            _str(where, item, "name"),
            _str(where, item, "namespace", "default"),
            _str(where, item, "hpa", "refuse"),
        )
        if w.kind not in KINDS:
            raise ValueError(f"{where}.kind: choose one of {', '.join(KINDS)} (got {w.kind!r})")
        if len(w.name) > 253 or not _SUBDOMAIN.match(w.name):
            raise ValueError(f"{where}.name: not a Kubernetes object name (RFC 1123 subdomain): {w.name!r}")
        if len(w.namespace) > 63 or not _LABEL.match(w.namespace):
            raise ValueError(f"{where}.namespace: not a Kubernetes namespace (RFC 1123 label): {w.namespace!r}")
        if w.hpa not in HPA_MODES:
            raise ValueError(f"{where}.hpa: choose one of {', '.join(HPA_MODES)} (got {w.hpa!r})")
        if w.key in seen:
            raise ValueError(f"{where}: ({w.model}, {w.zone}) is already mapped by workloads[{seen[w.key]}]")
        seen[w.key] = i
        out.append(w)
    return tuple(out)


def workloads_schema() -> dict[str, Any]:
    """JSON Schema of the ``workloads`` list (the settings schema embeds it)."""
    return {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["model", "zone", "kind", "name"],
            "additionalProperties": False,
            "properties": {
                "model": {"type": "string", "minLength": 1},
                "zone": {"type": "string", "minLength": 1},
                "kind": {"enum": list(KINDS)},
                "name": {"type": "string", "minLength": 1, "maxLength": 253},
                "namespace": {"type": "string", "minLength": 1, "maxLength": 63},
                "hpa": {"enum": list(HPA_MODES)},
            },
        },
    }


# -- the gateway backend's routes (executors/gateway.py) -----------------------------------
@dataclass(frozen=True)
class GatewayRoute:
    family: str
    zone: str
    route: str
    namespace: str = "default"
    rules: Mapping[str, int] = field(default_factory=lambda: {"*": 0})
    backends: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # target -> backendRef fields
    agent_pools: tuple[Mapping[str, Any], ...] = ()  # backendRefs the agent classes share (x-agent-class rules)

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "zone": self.zone,
            "route": self.route,
            "namespace": self.namespace,
            "rules": dict(self.rules),
            "backends": {t: dict(r) for t, r in self.backends.items()},
            **({"agent_pools": [dict(r) for r in self.agent_pools]} if self.agent_pools else {}),
        }

    def rule_of(self, request_class: str) -> int | None:
        return self.rules.get(request_class, self.rules.get("*"))

    def target_of(self, ref: Mapping[str, Any]) -> str | None:
        """The governor target a backendRef stands for (matched on name, namespace, kind, group)."""
        for target, want in self.backends.items():
            if all(ref.get(k, _REF_DEFAULTS.get(k)) == want.get(k, _REF_DEFAULTS.get(k)) for k in _REF_MATCH):
                return target
        return None


_REF_DEFAULTS: dict[str, Any] = {"kind": "Service", "group": ""}
_REF_MATCH = ("name", "namespace", "kind", "group")


def parse_routes(raw: Any) -> tuple[GatewayRoute, ...]:
    """Validate the ``gateway_routes`` list; ValueError names the first bad field's path.

    >>> r = parse_routes([{"family": "m", "zone": "z", "route": "llm", "backends": {"m|z": {"name": "svc"}}}])
    >>> r[0].rule_of("trading"), r[0].namespace
    (0, 'default')
    >>> parse_routes([{"family": "m", "zone": "z", "route": "llm", "backends": {"m": {"name": "svc"}}}])
    Traceback (most recent call last):
    ...
    ValueError: gateway_routes[0].backends['m']: a target is model|zone (or model@version|zone)
    """
    if not isinstance(raw, list):
        raise ValueError("gateway_routes: must be a list of objects")
    out: list[GatewayRoute] = []
    for i, item in enumerate(raw):
        at = f"gateway_routes[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{at}: must be an object")
        extra = sorted(set(item) - set(_ROUTE_FIELDS))
        if extra:
            raise ValueError(f"{at}: unknown field {extra[0]!r} (fields: {', '.join(_ROUTE_FIELDS)})")
        for key in ("family", "zone", "route"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise ValueError(f"{at}.{key}: must be a non-empty string")
        ns = item.get("namespace", "default")
        for key, value in (("route", item["route"]), ("namespace", ns)):
            if not isinstance(value, str) or len(value) > 253 or not _SUBDOMAIN.match(value):
                raise ValueError(f"{at}.{key}: not a Kubernetes name: {value!r}")
        rules = item.get("rules", {"*": 0})
        if not isinstance(rules, dict) or not rules:
            raise ValueError(f"{at}.rules: must map request classes to rule indices")
        for cls, idx in rules.items():
            if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < 16:
                raise ValueError(f"{at}.rules[{cls!r}]: a rule index 0..15 (HTTPRoute allows 16 rules)")
        backends = item.get("backends")
        if not isinstance(backends, dict) or not backends:
            raise ValueError(f"{at}.backends: must map governor targets to backendRefs")
        for target, ref in backends.items():
            where = f"{at}.backends[{target!r}]"
            model, sep, zone = str(target).rpartition("|")
            if not sep or not model or not zone:
                raise ValueError(f"{where}: a target is model|zone (or model@version|zone)")
            _check_ref(where, ref)
        pools = item.get("agent_pools", [])
        if not isinstance(pools, list) or len(pools) > 16:
            raise ValueError(f"{at}.agent_pools: a list of at most 16 backendRefs (an HTTPRoute rule's limit)")
        for k, ref in enumerate(pools):
            _check_ref(f"{at}.agent_pools[{k}]", ref)
        out.append(
            GatewayRoute(
                item["family"], item["zone"], item["route"], ns, dict(rules), dict(backends), tuple(map(dict, pools))
            )
        )
    return tuple(out)


def _check_ref(where: str, ref: Any) -> None:
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str) or not _SUBDOMAIN.match(ref["name"]):
        raise ValueError(f"{where}.name: the backendRef's object name is required")
    bad = sorted(set(ref) - set(REF_FIELDS))
    if bad:
        raise ValueError(f"{where}: unknown field {bad[0]!r} (fields: {', '.join(REF_FIELDS)})")
    port = ref.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise ValueError(f"{where}.port: a port 1..65535")


def routes_schema() -> dict[str, Any]:
    """JSON Schema of the ``gateway_routes`` list (the settings schema embeds it)."""
    ref = {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "namespace": {"type": "string", "minLength": 1},
            "kind": {"type": "string", "minLength": 1},
            "group": {"type": "string"},
        },
    }
    return {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["family", "zone", "route", "backends"],
            "additionalProperties": False,
            "properties": {
                "family": {"type": "string", "minLength": 1},
                "zone": {"type": "string", "minLength": 1},
                "route": {"type": "string", "minLength": 1},
                "namespace": {"type": "string", "minLength": 1},
                "rules": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 15}},
                "backends": {"type": "object", "minProperties": 1, "additionalProperties": ref},
                "agent_pools": {"type": "array", "maxItems": 16, "items": ref},
            },
        },
    }
