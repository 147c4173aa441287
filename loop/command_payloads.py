"""One typed payload per command kind (:class:`loop.commands.Command`'s ``typed_payload``).

Each payload type is a frozen dataclass that checks every field when it is
built, with ``from_dict(d)`` (a command's ``payload`` JSON object: every
required key present, no unknown key, each value checked; a
:class:`CommandError` names the field) and ``to_dict()`` (its inverse:
``P.from_dict(d).to_dict() == d`` for every valid ``d``).  What each driver
puts there:

========  ========================================================  ==========================================
kind      payload keys                                              producer
========  ========================================================  ==========================================
scale     none (``target_replicas``, ``previous_replicas`` are      :meth:`loop.scaler_driver.Scaler`
          top-level fields; :class:`ScalePayload` reads them)
route     ``weights`` ``{class: {"variant|zone": weight >= 0}}``,   :class:`loop.routing_driver.RoutingDriver`,
          optional ``fallback`` ``{class: reason}``                 ``Scaler.zone_route_commands`` (class ``*``)
breaker   ``target`` ``"model|zone"``, ``state`` (closed, open,     :class:`loop.breaker_driver.BreakerDriver`
          half_open), ``probe_budget`` int >= 0, ``threshold``
          >= 0, ``error_ratio`` in [0, 1]
canary    ``model``, ``version``, ``share`` in [0, 1]               :class:`loop.canary_driver.CanaryDriver`
relocate  ``node``, ``action`` (compact, move), ``max_bytes`` and   :class:`loop.kv_policy_driver.KvPolicyDriver`
          ``expected_generation`` (ints >= 0)
agents    ``weights`` ``{rag, tool, llm}``, ``signals``             :class:`loop.agent_weights_driver.AgentWeightsDriver`
          ``{stability, rag_score, tool_conf}``, ``paths``
          ``{path: share}`` (numbers in [0, 1])
========  ========================================================  ==========================================

>>> p = CanaryPayload.from_dict({"model": "m", "version": "v2", "share": 0.25})
>>> p.share, p.to_dict() == {"model": "m", "version": "v2", "share": 0.25}
(0.25, True)
>>> CanaryPayload.from_dict({"model": "m", "version": "v2", "share": 1.5})
Traceback (most recent call last):
...
loop.command_payloads.CommandError: canary payload field 'share': must be a number in [0, 1], got 1.5
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn, get_args

from controllers.breaker import StateName
from core.vocab import AGENT_PATHS

__all__ = [
    "AGENT_SIGNALS",
    "BREAKER_STATES",
    "RELOCATE_ACTIONS",
    "AgentsPayload",
    "BreakerPayload",
    "CanaryPayload",
    "CommandError",
    "Payload",
    "PayloadBase",
    "RelocatePayload",
    "RoutePayload",
    "ScalePayload",
    "split_pair",
]

AGENT_SIGNALS = ("stability", "rag_score", "tool_conf")
BREAKER_STATES: tuple[str, ...] = get_args(StateName)  # closed, open, half_open (controllers.breaker)
RELOCATE_ACTIONS = ("compact", "move")


class CommandError(ValueError):
    """A command record is malformed; the message says which field."""


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _fail(kind: str, name: str, what: str, v: Any) -> NoReturn:
    raise CommandError(f"{kind} payload field {name!r}: must be {what}, got {_short(v)}")


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(kind: str, name: str, v: Any) -> int:
    """``v``, an int >= 0 (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        _fail(kind, name, "an int >= 0", v)
    return v


def _num(kind: str, name: str, v: Any, hi: float | None = None) -> float:
    """``v``, a finite number >= 0 (and <= ``hi``), not a bool."""
    if not _is_num(v) or v < 0 or (hi is not None and v > hi):
        _fail(kind, name, "a number >= 0" if hi is None else f"a number in [0, {hi:g}]", v)
    return float(v)


def _str(kind: str, name: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        _fail(kind, name, "a non-empty string", v)
    return v


def split_pair(v: Any) -> tuple[str, str] | None:
    """``("a", "b")`` for ``"a|b"`` (both parts non-empty, one ``|``); else None.

    >>> split_pair("llama2-70b|az-a"), split_pair("m|"), split_pair("a|b|c"), split_pair(3)
    (('llama2-70b', 'az-a'), None, None, None)
    """
    if not isinstance(v, str) or v.count("|") != 1:
        return None
    a, _, b = v.partition("|")
    return (a, b) if a and b else None


def _shares(kind: str, name: str, v: Any, keys: tuple[str, ...] | None) -> dict[str, float]:
    """``v``, a mapping of exactly ``keys`` (any non-empty str keys when None) to numbers in [0, 1]."""
    if not isinstance(v, dict):
        _fail(kind, name, "a JSON object", v)
    if keys is not None and sorted(v) != sorted(keys):
        _fail(kind, name, f"an object with exactly the keys {list(keys)}", sorted(v))
    for k, x in v.items():
        _str(kind, f"{name}.<key>", k)
        _num(kind, f"{name}.{k}", x, 1.0)
    return dict(v)


def _keys(kind: str, d: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """``d`` as a dict after checking it holds every ``required`` key and nothing else."""
    if not isinstance(d, Mapping):
        raise CommandError(f"{kind} payload must be a JSON object, got {_short(d)}")
    for k in required:
        if k not in d:
            raise CommandError(f"{kind} payload field {k!r}: missing (needs {list(required)})")
    for k in d:
        if k not in required and k not in optional:
            raise CommandError(f"{kind} payload field {k!r}: unknown (allowed {list(required + optional)})")
    return dict(d)


class PayloadBase:
    """What every payload type shares: its kind, its keys, ``to_dict`` and ``id_dict``."""

    KIND: ClassVar[str]
    REQUIRED: ClassVar[tuple[str, ...]]
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self.REQUIRED + self.OPTIONAL:
            v = getattr(self, k)
            if v is not None or k in self.REQUIRED:
                out[k] = _copy(v)
        return out

    def id_dict(self) -> dict[str, Any]:
        """What enters ``command_id`` (the decision): the whole payload, except for ``scale``."""
        return self.to_dict()


def _copy(v: Any) -> Any:
    return {k: _copy(x) for k, x in v.items()} if isinstance(v, dict) else v


@dataclass(frozen=True)
class ScalePayload(PayloadBase):
    """A ``scale`` decision: the command's top-level ``target_replicas`` and ``previous_replicas``.

    ``previous_replicas`` is context (the target or provisioned count before
    the decision), not part of the decision, so it does not enter the id.

    >>> ScalePayload.from_dict({"target_replicas": 4, "previous_replicas": None}).id_dict()
    {'target_replicas': 4}
    """

    KIND = "scale"
    REQUIRED = ("target_replicas",)
    OPTIONAL = ("previous_replicas",)

    target_replicas: int
    previous_replicas: int | None = None

    def __post_init__(self) -> None:
        _int(self.KIND, "target_replicas", self.target_replicas)
        if self.previous_replicas is not None:
            _int(self.KIND, "previous_replicas", self.previous_replicas)

    @classmethod
    def from_dict(cls, d: Any) -> ScalePayload:
        d = _keys(cls.KIND, d, cls.REQUIRED, cls.OPTIONAL)
        return cls(d["target_replicas"], d.get("previous_replicas"))

    def id_dict(self) -> dict[str, Any]:
        return {"target_replicas": self.target_replicas}


@dataclass(frozen=True)
class RoutePayload(PayloadBase):
    """Weights per request class per ``"variant|zone"`` target, and the classes in fallback."""

    KIND = "route"
    REQUIRED = ("weights",)
    OPTIONAL = ("fallback",)

    weights: dict[str, dict[str, float]]
    fallback: dict[str, str] | None = None

    def __post_init__(self) -> None:
        k = self.KIND
        if not isinstance(self.weights, dict) or not self.weights:
            _fail(k, "weights", "a non-empty {class: {'variant|zone': weight >= 0}} object", self.weights)
        for cls, ws in self.weights.items():
            _str(k, "weights.<class>", cls)
            if not isinstance(ws, dict):
                _fail(k, f"weights.{cls}", "a {'variant|zone': weight >= 0} object", ws)
            for t, w in ws.items():
                if split_pair(t) is None:
                    _fail(k, f"weights.{cls}.<target>", "'variant|zone' (both non-empty)", t)
                _num(k, f"weights.{cls}.{t}", w)
        if self.fallback is not None:
            if not isinstance(self.fallback, dict):
                _fail(k, "fallback", "a {class: reason} object", self.fallback)
            for cls, why in self.fallback.items():
                _str(k, "fallback.<class>", cls)
                if not isinstance(why, str):
                    _fail(k, f"fallback.{cls}", "a string (the reason)", why)

    @classmethod
    def from_dict(cls, d: Any) -> RoutePayload:
        d = _keys(cls.KIND, d, cls.REQUIRED, cls.OPTIONAL)
        w, fb = d["weights"], d.get("fallback")
        return cls(_copy(w) if isinstance(w, dict) else w, _copy(fb) if isinstance(fb, dict) else fb)


@dataclass(frozen=True)
class BreakerPayload(PayloadBase):
    """One target's breaker state (:class:`loop.breaker_driver.BreakerDriver`)."""

    KIND = "breaker"
    REQUIRED = ("target", "state", "probe_budget", "threshold", "error_ratio")

    target: str
    state: str
    probe_budget: int
    threshold: float
    error_ratio: float

    def __post_init__(self) -> None:
        k = self.KIND
        if split_pair(self.target) is None:
            _fail(k, "target", "'model|zone' (both non-empty)", self.target)
        if self.state not in BREAKER_STATES:
            _fail(k, "state", f"one of {list(BREAKER_STATES)}", self.state)
        _int(k, "probe_budget", self.probe_budget)
        _num(k, "threshold", self.threshold)
        _num(k, "error_ratio", self.error_ratio, 1.0)

    @classmethod
    def from_dict(cls, d: Any) -> BreakerPayload:
        d = _keys(cls.KIND, d, cls.REQUIRED)
        return cls(d["target"], d["state"], d["probe_budget"], d["threshold"], d["error_ratio"])


@dataclass(frozen=True)
class CanaryPayload(PayloadBase):
    """The share of ``model``'s requests a gateway sends to ``model@version``."""

    KIND = "canary"
    REQUIRED = ("model", "version", "share")

    model: str
    version: str
    share: float

    def __post_init__(self) -> None:
        _str(self.KIND, "model", self.model)
        _str(self.KIND, "version", self.version)
        _num(self.KIND, "share", self.share, 1.0)

    @classmethod
    def from_dict(cls, d: Any) -> CanaryPayload:
        d = _keys(cls.KIND, d, cls.REQUIRED)
        return cls(d["model"], d["version"], d["share"])


@dataclass(frozen=True)
class RelocatePayload(PayloadBase):
    """Compact or move one node's KV cache, at most ``max_bytes``, if its generation is still the one seen."""

    KIND = "relocate"
    REQUIRED = ("node", "max_bytes", "expected_generation", "action")

    node: str
    max_bytes: int
    expected_generation: int
    action: str

    def __post_init__(self) -> None:
        _str(self.KIND, "node", self.node)
        _int(self.KIND, "max_bytes", self.max_bytes)
        _int(self.KIND, "expected_generation", self.expected_generation)
        if self.action not in RELOCATE_ACTIONS:
            _fail(self.KIND, "action", f"one of {list(RELOCATE_ACTIONS)}", self.action)

    @classmethod
    def from_dict(cls, d: Any) -> RelocatePayload:
        d = _keys(cls.KIND, d, cls.REQUIRED)
        return cls(d["node"], d["max_bytes"], d["expected_generation"], d["action"])


@dataclass(frozen=True)
class AgentsPayload(PayloadBase):
    """Path weights, the smoothed signals behind them and the observed path shares."""

    KIND = "agents"
    REQUIRED = ("weights", "signals", "paths")

    weights: dict[str, float]
    signals: dict[str, float]
    paths: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _shares(self.KIND, "weights", self.weights, AGENT_PATHS)
        _shares(self.KIND, "signals", self.signals, AGENT_SIGNALS)
        _shares(self.KIND, "paths", self.paths, None)

    @classmethod
    def from_dict(cls, d: Any) -> AgentsPayload:
        d = _keys(cls.KIND, d, cls.REQUIRED)
        return cls(*(_copy(d[k]) for k in cls.REQUIRED))


Payload = ScalePayload | RoutePayload | BreakerPayload | CanaryPayload | RelocatePayload | AgentsPayload
