"""The ``gateway`` backend: route, breaker and canary commands become ``HTTPRoute`` backend weights.

Gateway API (``gateway.networking.k8s.io/v1``) routes traffic of an
``HTTPRoute`` rule to its ``backendRefs`` in proportion to their integer
``weight`` (0 = no traffic).  Each entry of the ``gateway_routes`` section
(:func:`parse_routes`) tells the backend which route of this zone carries a
model family's traffic and which ``backendRef`` is which governor target::

    gateway_routes:
      - family: llama2-70b          # route commands for this family; breakers/canaries of its targets
        zone: az-a
        route: llm                  # the HTTPRoute (namespace: default unless given)
        namespace: serving
        rules: {"*": 0, trading: 1}  # request class -> rule index ("*": every other class); default {"*": 0}
        backends:                   # governor target -> the backendRef's name (a Service; port optional)
          "llama2-70b|az-a": {name: vllm-70b, port: 8000}
          "llama2-13b|az-a": {name: vllm-13b, port: 8000}
          "llama2-70b@v2|az-a": {name: vllm-70b-v2, port: 8000}
        agent_pools:                # optional: backendRefs (Services, each a slice of the model's replicas)
          - {name: vllm-70b-p0, port: 8000}   # the agent classes share (agents commands)
          - {name: vllm-70b-p1, port: 8000}

What each command does to the route's *intent*, which the backend keeps in the
route's annotation ``governor.io/intent`` (JSON; so it survives executor
restarts and is visible with ``kubectl get httproute -o yaml``):

* ``route``: the class's weights replace the intent of the rule that class
  maps to (classes that map to no rule are ignored; none mapping is *rejected*);
* ``breaker``: the target's state (``open`` = weight 0; ``half_open`` keeps
  :data:`~controllers.gateway_weights.HALF_OPEN_SHARE` of its share, since a
  gateway cannot count a probe budget; ``closed`` restores it);
* ``canary``: ``model@version`` gets ``share`` of ``model``'s weight;
* ``agents`` (the route whose family is the command's model, or whose
  ``backends`` name ``<model>|<zone>``; it needs ``agent_pools``): the agent
  class weights (``rag``, ``tool``, ``llm``) replace the intent's ``agents``.
  Each class of positive weight gets one rule, after the operator's rules,
  matching the request header ``x-agent-class: <class>`` (``HTTPHeaderMatch``
  type ``Exact``) on each path match of the default rule (the rule of class
  ``*``), whose ``backendRefs`` are the ``agent_pools`` weighted by
  :func:`controllers.agent_weights.pool_shares`: the class holds its weight
  of the pools.  A header match is more specific than the default rule's
  path alone, so the class's requests take its rule; requests without the
  header (and classes of weight 0) keep the default rule.  The rules are
  rebuilt from the intent on every command (those with an ``x-agent-class``
  match are governor's); a class name that is not a valid header value, or
  more than the Gateway API's 16 rules per route, is *rejected*.

Then every rule is recomputed from its intent (or, before any route command,
from the weights the operator wrote in the route) with the same pure functions
as the simulated gateway (:mod:`controllers.gateway_weights`), converted to
integer weights summing to 1000 and written in one merge patch of ``spec.rules``
carrying the ``resourceVersion`` it read: a concurrent writer makes the API
server answer 409 and the backend re-reads and retries (:func:`executors.k8s.retrying`).
``backendRefs`` of a rule that are not governor targets keep their weight and
their place; targets the rule lacks are appended.  A command whose targets are
not in ``backends`` is *rejected* naming them; a route with no entry for this
zone too.  The Redis-hash contract of :class:`executors.backends.RoutingBackend`
stays for gateways that read it.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client as k8s

from controllers.agent_weights import AGENT_CLASS_HEADER, pool_shares
from controllers.gateway_weights import HALF_OPEN_SHARE, canary_split, gate_weights, integer_weights
from core.workloads import REF_FIELDS, GatewayRoute
from executors.backends import BackendRejected
from executors.k8s import ANNOTATION_PREFIX, MERGE_PATCH, retrying
from loop.commands import Command

__all__ = ["GROUP", "GatewayBackend", "agent_rules", "route_weights"]

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"
INTENT = ANNOTATION_PREFIX + "intent"
TOTAL = 1000
MAX_RULES = 16  # HTTPRouteSpec.rules maxItems
MAX_HEADER_VALUE = 4096  # HTTPHeaderMatch.value maxLength
_HEADER_VALUE = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$")  # RFC 9110 field-value, visible ASCII


def route_weights(
    route: GatewayRoute, obj: Mapping[str, Any], intent: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[int, dict[str, int]]]:
    """The route's ``spec.rules`` with governor's weights applied (pure), and the weights per rule.

    ``intent``: ``{"rules": {"<idx>": {target: w}}, "breakers": {target: state},
    "canary": {model: [version, share]}}`` (see the module docstring).
    """
    rules = copy.deepcopy(list((obj.get("spec") or {}).get("rules") or []))
    factors = {t: _factor(s) for t, s in (intent.get("breakers") or {}).items()}
    canaries = {m: (str(v[0]), float(v[1])) for m, v in (intent.get("canary") or {}).items()}
    written: dict[int, dict[str, int]] = {}
    for idx in sorted(set(route.rules.values())):
        if idx >= len(rules):
            continue
        refs = list(rules[idx].get("backendRefs") or [])
        ours = {i: t for i, ref in enumerate(refs) if (t := route.target_of(ref)) is not None}
        base = (intent.get("rules") or {}).get(str(idx))
        if base is None:  # no route command yet: the operator's weights (default 1) are the route weights
            base = {t: float(refs[i].get("weight", 1)) for i, t in ours.items() if "@" not in t.split("|")[0]}
        shares = canary_split(gate_weights(base, factors), canaries, factors) if base else {}
        if not shares and ours:  # every target open: a breaker moves traffic, it does not drop it
            shares = {t: 1.0 for t in ours.values()}
        weights = integer_weights({t: shares.get(t, 0.0) for t in set(ours.values()) | set(shares)}, TOTAL)
        present = set(ours.values())
        for i, t in ours.items():
            refs[i] = {**refs[i], "weight": weights.get(t, 0)}
        for t in sorted(set(weights) - present):
            if t in route.backends:
                refs.append({**_ref(route.backends[t]), "weight": weights[t]})
        rules[idx] = {**rules[idx], "backendRefs": refs}
        written[idx] = {t: w for t, w in weights.items() if t in route.backends}
    return rules, written


def _is_agent_rule(rule: Mapping[str, Any]) -> bool:
    return any(
        str(h.get("name", "")).lower() == AGENT_CLASS_HEADER
        for m in rule.get("matches") or []
        for h in m.get("headers") or []
    )


def agent_rules(
    route: GatewayRoute, rules: list[dict[str, Any]], weights: Mapping[str, float]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """``rules`` with governor's ``x-agent-class`` rules rebuilt from the class weights (pure).

    Returns the rules and the integer pool weights per class (by backendRef
    name).  Raises :class:`BackendRejected` for a class that is not a header
    value or a route that would pass the Gateway API's 16 rules.
    """
    kept = [r for r in rules if not _is_agent_rule(r)]
    try:
        shares = pool_shares(weights, len(route.agent_pools)) if weights else {}
    except (ValueError, TypeError) as exc:  # a hand-edited intent: governor's class rules go until the next command
        log.warning("route %s: unusable agent weights in the intent (%s); no agent class rules", route.route, exc)
        shares = {}
    for cls in shares:
        if len(cls) > MAX_HEADER_VALUE or not _HEADER_VALUE.fullmatch(cls):
            raise BackendRejected(f"route {route.route}: agent class {cls!r} is not an HTTP header value")
    if len(kept) + len(shares) > MAX_RULES:
        raise BackendRejected(
            f"route {route.route}: {len(kept)} rules + {len(shares)} agent classes > {MAX_RULES} (HTTPRoute limit)"
        )
    default = route.rule_of("*")
    paths = [
        {k: v for k, v in m.items() if k != "headers"}
        for m in (kept[default].get("matches") or [] if default is not None and default < len(kept) else [])
    ] or [{}]
    written: dict[str, dict[str, int]] = {}
    for cls, share in shares.items():
        names = [str(ref["name"]) + (f":{ref['port']}" if "port" in ref else "") for ref in route.agent_pools]
        ints = integer_weights(dict(zip(names, share, strict=True)), TOTAL)
        header = {"type": "Exact", "name": AGENT_CLASS_HEADER, "value": cls}
        kept.append(
            {
                "matches": [{**m, "headers": [*(m.get("headers") or []), header]} for m in paths],
                "backendRefs": [
                    {**_ref(ref), "weight": ints[n]} for ref, n in zip(route.agent_pools, names, strict=True)
                ],
            }
        )
        written[cls] = ints
    return kept, written


def _factor(state: Any) -> float:
    return {"open": 0.0, "half_open": HALF_OPEN_SHARE}.get(str(state), 1.0)


def _ref(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: spec[k] for k in REF_FIELDS if k in spec}


class GatewayBackend:
    """Applies route/breaker/canary commands to the HTTPRoutes of one zone (see the module docstring)."""

    name = "gateway"
    KINDS = ("route", "breaker", "canary", "agents")

    def __init__(self, api: k8s.ApiClient, routes: Iterable[GatewayRoute], zone: str, **retry: Any) -> None:
        self.api = api
        self.custom = k8s.CustomObjectsApi(api)
        self.zone = zone
        self.routes = [r for r in routes if r.zone == zone]
        self.timeout_s = float(retry.pop("timeout_s", 5.0))
        self.retry = retry

    def _routes_for(self, cmd: Command) -> list[GatewayRoute]:
        if cmd.kind == "route":
            return [r for r in self.routes if r.family == cmd.model]
        if cmd.kind == "agents":
            mine = f"{cmd.model}|{self.zone}"
            return [r for r in self.routes if r.family == cmd.model or mine in r.backends]
        target = cmd.payload.get("target") if cmd.kind == "breaker" else None
        if target is not None:
            return [r for r in self.routes if target in r.backends]
        version = cmd.payload.get("version")
        return [r for r in self.routes if f"{cmd.model}@{version}|{self.zone}" in r.backends]

    async def apply(self, cmd: Command) -> dict[str, Any]:
        if cmd.kind not in self.KINDS:
            raise BackendRejected(f"gateway backend applies {', '.join(self.KINDS)} commands, not {cmd.kind!r}")
        routes = self._routes_for(cmd)
        if not routes:
            raise BackendRejected(f"no gateway_routes entry of zone {self.zone} covers this {cmd.kind} command")
        out: dict[str, Any] = {}
        for route in routes:
            out[f"{route.namespace}/{route.route}"] = await retrying(
                f"httproute {route.namespace}/{route.route}",
                functools.partial(self._apply_one, route, cmd),
                **self.retry,
            )
        return {"routes": out}

    def _apply_one(self, route: GatewayRoute, cmd: Command) -> dict[str, Any]:
        obj = self.api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
            self.custom.get_namespaced_custom_object(
                GROUP, VERSION, route.namespace, PLURAL, route.route, _request_timeout=self.timeout_s
            )
        )
        meta = obj.get("metadata") or {}
        try:
            intent = json.loads((meta.get("annotations") or {}).get(INTENT) or "{}")
            if not isinstance(intent, dict):
                intent = {}
        except ValueError:
            intent = {}  # a hand-edited annotation: start over from the route's own weights
        intent = _update_intent(route, intent, cmd)
        rules, written = route_weights(route, obj, intent)
        rules, by_class = agent_rules(route, rules, intent["agents"])
        body = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {
                    INTENT: json.dumps(intent, sort_keys=True, separators=(",", ":")),
                    ANNOTATION_PREFIX + "command-id": cmd.command_id,
                    ANNOTATION_PREFIX + "reason": cmd.reason[:256],
                },
            },
            "spec": {"rules": rules},
        }
        self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            route.namespace,
            PLURAL,
            route.route,
            body,
            _content_type=MERGE_PATCH,
            _request_timeout=self.timeout_s,
        )
        out: dict[str, Any] = {"weights": {str(k): v for k, v in written.items()}}
        if by_class:
            out["agent_classes"] = by_class
        return out

    async def close(self) -> None:
        return None


def _update_intent(route: GatewayRoute, intent: dict[str, Any], cmd: Command) -> dict[str, Any]:
    intent = {k: dict(intent.get(k) or {}) for k in ("rules", "breakers", "canary", "agents")}
    if cmd.kind == "agents":
        if not route.agent_pools:
            raise BackendRejected(f"route {route.route}: agents commands need agent_pools in gateway_routes")
        ws = cmd.payload.get("weights")
        if not isinstance(ws, dict) or not all(
            isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w) and w >= 0 for w in ws.values()
        ):
            raise BackendRejected(f"agents: weights must map classes to finite numbers >= 0, got {ws!r}")
        if not any(w > 0 for w in ws.values()):
            raise BackendRejected("agents: no class has a positive weight")
        intent["agents"] = {str(k): float(w) for k, w in sorted(ws.items())}
    elif cmd.kind == "route":
        mapped = 0
        for cls, ws in (cmd.payload.get("weights") or {}).items():
            idx = route.rule_of(str(cls))
            if idx is None:
                continue
            unknown = sorted(set(ws) - set(route.backends))
            if unknown:
                raise BackendRejected(f"route {route.route}: targets {unknown} have no backendRef in gateway_routes")
            intent["rules"][str(idx)] = {t: float(w) for t, w in sorted(ws.items())}
            mapped += 1
        if not mapped:
            raise BackendRejected(f"route {route.route}: no request class of the command maps to a rule")
    elif cmd.kind == "breaker":
        target, state = str(cmd.payload.get("target")), str(cmd.payload.get("state"))
        if state == "closed":
            intent["breakers"].pop(target, None)
        else:
            intent["breakers"][target] = state
    else:
        share = cmd.payload.get("share")
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 <= share <= 1.0:
            raise BackendRejected(f"canary: share must be in [0, 1], got {share!r}")
        intent["canary"][cmd.model] = [str(cmd.payload.get("version")), float(share)]
    return intent
