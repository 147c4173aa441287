"""Versioned, idempotent commands from the controllers to the executors.

Schema version 2 is a tagged union on ``kind``:

* the **target** (field ``model``, :attr:`Command.target`) is a model, a
  routing family or a ``"model|zone"``, as :data:`TARGET_TYPES` says per kind,
  and is checked when the command is built (a breaker's is ``"model|zone"``
  with both parts non-empty and equals its payload's ``target``; a canary's
  equals its payload's ``model``; a model or family name has no ``|``);
* the **payload** has one type per kind (:data:`PAYLOAD_TYPES`, in
  :mod:`loop.command_payloads`), every field checked;
  :attr:`Command.typed_payload` returns it.  ``scale`` keeps an empty
  ``payload``: its decision is the top-level ``target_replicas`` (and
  ``previous_replicas``), which only ``scale`` commands carry -- every other
  kind has ``target_replicas = previous_replicas = None``.

``command_id`` is a hash of what the command *decides*: the same decision
taken twice -- say after a worker restart re-reads the same window -- yields
the same id, and executors drop the duplicate::

    command_id = kind + "-" + sha256("v2|kind|zone|target|basis_ms|" + canonical)[:20 hex digits]

with ``canonical`` the sorted-key JSON (:func:`canonical_payload`) of the
typed payload's ``id_dict()``: the whole payload, and ``{"target_replicas":
n}`` for ``scale`` (``previous_replicas`` is context, not decision).

**Version 1** (``target_replicas = 0`` on every non-scale kind, ids from
:func:`command_id_v1`) is still accepted by :meth:`Command.decode` for one
release, so that a v1 command in flight during a rolling upgrade is applied
once: it is converted (``target_replicas`` and ``previous_replicas`` become
``None`` for non-scale kinds) and keeps its v1 ``command_id``, so its
redelivered duplicate is still recognised.  Any other version (0, 3,
missing) is a :class:`CommandError`.  Upgrade the executors before the
workers (a v1 executor rejects v2 records).  v1 support (``_upgrade_v1``,
:func:`command_id_v1`, ``ACCEPTED_SCHEMA_VERSIONS``) can be dropped in the
release after the one that introduced v2: by then no worker publishes v1,
and a v1 entry left in a stream has long expired (commands live
``GOVERNOR_COMMAND_TTL_S``).

Commands carry ``issued_at_ms`` and ``expires_at_ms``; an executor refuses an
expired command rather than act on a stale view of the fleet.

``hlc`` is a hybrid-logical-clock timestamp (``Hlc.encode()`` of
:mod:`controllers.hlc`, ``l << 16 | c``) stamped by the bridge agent when it
writes the command to the zone's Redis stream.  It is *not* part of
``command_id`` (re-stamping a re-delivered decision keeps its id, so the
duplicate is still dropped).  ``0`` means "unstamped" (an older producer);
executors then skip the HLC order check (:func:`hlc_stale`).

``key_id`` and ``signature`` authenticate the command (:mod:`core.signing`):
the bridge signs it with the active key of ``GOVERNOR_COMMAND_KEYS`` right
after stamping the HLC (it is the last writer before Redis), over every
other field -- ``hlc`` and ``detail.apply_at_ms`` included.  They are not
part of ``command_id``; executors refuse a command without a valid
signature (:mod:`executors.guard`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any, TypeVar

import orjson

from core import vocab
from core.jsonsafe import MAX_DEPTH, too_deep
from core.signing import Keyring
from loop.command_payloads import (
    AGENT_SIGNALS,
    AgentsPayload,
    BreakerPayload,
    CanaryPayload,
    CommandError,
    Payload,
    PayloadBase,
    RelocatePayload,
    RoutePayload,
    ScalePayload,
    split_pair,
)

__all__ = [
    "AGENT_SIGNALS",
    "COMMAND_KINDS",
    "COMMAND_SCHEMA_VERSION",
    "PAYLOAD_TYPES",
    "TARGET_TYPES",
    "Command",
    "CommandError",
    "canonical_payload",
    "command_id",
    "command_id_v1",
    "hlc_stale",
]

COMMAND_SCHEMA_VERSION = 2
ACCEPTED_SCHEMA_VERSIONS = (1, 2)  # 1: converted by Command.decode (drop in the next release)
COMMAND_KINDS = frozenset(vocab.COMMAND_KINDS)

#: What a command's ``model`` field holds, per kind (what each driver puts there).
TARGET_TYPES: dict[str, str] = {
    "scale": "model",  # Scaler: the model whose replicas it sets
    "route": "family",  # RoutingDriver: the family (its primary variant); Scaler.zone_route_commands: the model
    "breaker": "model|zone",  # BreakerDriver: the breaker's target, = payload["target"]
    "canary": "model",  # CanaryDriver: the stable model, = payload["model"]
    "relocate": "model",  # KvPolicyDriver: the model; the node is payload["node"]
    "agents": "model",  # AgentWeightsDriver: the model the orchestrator serves
}

#: The payload type of each kind.
PAYLOAD_TYPES: dict[str, type[Payload]] = {
    "scale": ScalePayload,
    "route": RoutePayload,
    "breaker": BreakerPayload,
    "canary": CanaryPayload,
    "relocate": RelocatePayload,
    "agents": AgentsPayload,
}

P = TypeVar("P", bound=PayloadBase)


def canonical_payload(payload: Mapping[str, Any]) -> str:
    """Sorted-key JSON of a payload (the part of the id hash that encodes it)."""
    try:
        return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError as exc:
        raise CommandError(f"payload is not JSON-encodable: {exc}") from exc


def command_id(kind: str, zone: str, target: str, basis_ms: int, id_payload: Mapping[str, Any]) -> str:
    """Deterministic id of a decision (schema v2): ``id_payload`` is the typed payload's ``id_dict()``.

    >>> command_id("scale", "az-a", "m", 10_000, {"target_replicas": 4})
    'scale-29bcebb0d7037a889f9f'
    >>> a = command_id("route", "az-a", "m", 1, {"weights": {"*": {"m|a": 0.5, "m|b": 0.5}}})
    >>> a == command_id("route", "az-a", "m", 1, {"weights": {"*": {"m|b": 0.5, "m|a": 0.5}}})
    True
    >>> a == command_id("route", "az-a", "m", 1, {"weights": {"*": {"m|a": 0.6, "m|b": 0.4}}})
    False
    """
    basis = f"v2|{kind}|{zone}|{target}|{basis_ms}|{canonical_payload(id_payload)}"
    return f"{kind}-{hashlib.sha256(basis.encode()).hexdigest()[:20]}"


def command_id_v1(
    kind: str, zone: str, model: str, basis_ms: int, target: Any, payload: Mapping[str, Any] | None = None
) -> str:
    """The schema-v1 id (``target`` = ``target_replicas``, 0 for non-scale kinds); for v1 records without one.

    >>> command_id_v1("scale", "az-a", "m", 10_000, 4)
    'scale-f44155bf14c288e04555'
    """
    basis = f"{kind}|{zone}|{model}|{basis_ms}|{target}"
    if payload:
        basis += "|" + canonical_payload(payload)
    return f"{kind}-{hashlib.sha256(basis.encode()).hexdigest()[:20]}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True, kw_only=True)
class Command:
    kind: str
    zone: str
    model: str  # the target: a model, a family or "model|zone" (TARGET_TYPES[kind]); see Command.target
    target_replicas: int | None = None  # scale only: absolute target, int >= 0; None for every other kind
    reason: str
    issued_at_ms: int
    expires_at_ms: int
    basis_ms: int  # end of the window the decision was taken on
    previous_replicas: int | None = None  # scale only
    controller: str = "pid"
    detail: dict[str, Any] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)  # empty for scale (see typed_payload)
    schema_version: int = COMMAND_SCHEMA_VERSION
    command_id: str = ""
    hlc: int = 0  # Hlc.encode() stamped by the bridge; 0 = unstamped; not part of command_id
    key_id: str = ""  # the signing key (core.signing); set by the bridge; not part of command_id
    signature: str = ""  # hex HMAC-SHA256 over the canonical bytes (everything but key_id, signature)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in COMMAND_KINDS:
            raise CommandError(f"kind {self.kind!r} not in {sorted(COMMAND_KINDS)}")
        if not isinstance(self.zone, str) or not self.zone:
            raise CommandError(f"zone must be a non-empty string, got {self.zone!r}")
        for name in ("reason", "controller", "command_id", "key_id", "signature"):
            if not isinstance(getattr(self, name), str):
                raise CommandError(f"{name} must be a string, got {getattr(self, name)!r}")
        for name in ("issued_at_ms", "expires_at_ms", "basis_ms"):
            if not _is_int(getattr(self, name)):
                raise CommandError(f"{name} must be an int, got {getattr(self, name)!r}")
        if self.expires_at_ms <= self.issued_at_ms:
            raise CommandError("expires_at_ms must be after issued_at_ms")
        if not _is_int(self.schema_version) or self.schema_version != COMMAND_SCHEMA_VERSION:
            raise CommandError(f"unsupported command schema_version {self.schema_version!r}")
        if not _is_int(self.hlc) or self.hlc < 0:
            raise CommandError(f"hlc must be a non-negative int, got {self.hlc!r}")
        if not isinstance(self.detail, dict):
            raise CommandError("detail must be a JSON object")
        if not isinstance(self.payload, dict):
            raise CommandError("payload must be a JSON object")
        for name in ("detail", "payload"):  # orjson writes 254 levels: deeper would fail when signed or sent
            if too_deep(getattr(self, name), MAX_DEPTH):
                raise CommandError(f"{name} nested deeper than {MAX_DEPTH} levels")
        if self.kind == "scale":
            if self.payload:
                raise CommandError("payload must be empty for scale (its decision is target_replicas)")
        else:
            for name in ("target_replicas", "previous_replicas"):
                if getattr(self, name) is not None:
                    raise CommandError(f"{name} must be None for {self.kind} (only scale commands carry it)")
        typed = self.typed_payload  # checks every payload field
        self._check_target(typed)
        if not self.command_id:
            ident = command_id(self.kind, self.zone, self.model, self.basis_ms, typed.id_dict())
            object.__setattr__(self, "command_id", ident)

    def _check_target(self, typed: Payload) -> None:
        kind, m, want = self.kind, self.model, TARGET_TYPES[self.kind]
        if want == "model|zone":
            if split_pair(m) is None:
                raise CommandError(f"model (the target) of a {kind} command must be 'model|zone', got {m!r}")
        elif not isinstance(m, str) or not m or "|" in m:
            raise CommandError(f"model (the target) of a {kind} command must be a {want} name (no '|'), got {m!r}")
        if isinstance(typed, BreakerPayload) and typed.target != m:
            raise CommandError(f"breaker payload field 'target': {typed.target!r} differs from model {m!r}")
        if isinstance(typed, CanaryPayload) and typed.model != m:
            raise CommandError(f"canary payload field 'model': {typed.model!r} differs from model {m!r}")

    @cached_property
    def typed_payload(self) -> Payload:
        """The payload as its kind's type (:data:`PAYLOAD_TYPES`); raises :class:`CommandError` naming a bad field."""
        if self.kind == "scale":
            if self.target_replicas is None:
                raise CommandError("scale payload field 'target_replicas': missing (an int >= 0)")
            return ScalePayload(self.target_replicas, self.previous_replicas)
        return PAYLOAD_TYPES[self.kind].from_dict(self.payload)

    def payload_as(self, cls: type[P]) -> P:
        """:attr:`typed_payload`, which must be a ``cls`` (else :class:`CommandError`)."""
        p = self.typed_payload
        if not isinstance(p, cls):
            raise CommandError(f"a {self.kind} command has no {cls.__name__}")
        return p

    @property
    def target(self) -> str:
        """What the command acts on: a model, a family or ``"model|zone"`` (``TARGET_TYPES[kind]``)."""
        return self.model

    @property
    def target_type(self) -> str:
        return TARGET_TYPES[self.kind]

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str | dict[str, Any]) -> Command:
        """A command from its JSON (v2, or v1 converted keeping its id); :class:`CommandError` if malformed."""
        try:
            obj = orjson.loads(raw) if isinstance(raw, bytes | str) else dict(raw)
        except orjson.JSONDecodeError as exc:
            raise CommandError(f"not JSON: {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise CommandError(f"command must be a JSON object: {exc}") from exc
        if not isinstance(obj, dict):
            raise CommandError("command must be a JSON object")
        if "schema_version" not in obj:
            raise CommandError("schema_version missing")
        version = obj["schema_version"]
        if not _is_int(version) or version not in ACCEPTED_SCHEMA_VERSIONS:
            raise CommandError(f"unsupported command schema_version {version!r} (accepted: 1, 2)")
        try:
            return _upgrade_v1(obj) if version == 1 else cls(**obj)
        except TypeError as exc:
            raise CommandError(str(exc)) from exc

    def expired(self, now_ms: int) -> bool:
        return now_ms >= self.expires_at_ms

    def with_hlc(self, hlc: int) -> Command:
        """The same command (same ``command_id``) stamped with ``hlc``, unsigned (the stamp is signed)."""
        return replace(self, hlc=int(hlc), key_id="", signature="")

    def signed(self, keyring: Keyring) -> Command:
        """The same command signed with the keyring's active key (:mod:`core.signing`).

        >>> from core.signing import Keyring
        >>> ring = Keyring.parse("k1:" + bytes(range(32)).hex())
        >>> c = Command(kind="scale", zone="z", model="m", target_replicas=2, reason="",
        ...             issued_at_ms=0, expires_at_ms=1, basis_ms=0).with_hlc(5 << 16).signed(ring)
        >>> c.key_id, ring.verify(asdict(Command.decode(c.encode())))
        ('k1', None)
        """
        obj = keyring.sign(asdict(self))
        return replace(self, key_id=obj["key_id"], signature=obj["signature"])

    @property
    def order_field(self) -> str:
        """The ``kind:model`` key under which executors keep the last applied HLC
        (``relocate:model:node`` for relocations: nodes are independent)."""
        if self.kind == "relocate":
            return f"{self.kind}:{self.model}:{self.payload_as(RelocatePayload).node}"
        return f"{self.kind}:{self.model}"


def _upgrade_v1(obj: dict[str, Any]) -> Command:
    """A schema-v1 record as a v2 :class:`Command` keeping its v1 ``command_id`` (drop with v1 support).

    v1 had ``target_replicas`` (an int >= 0) on every kind, 0 where it meant nothing.
    """
    v1 = dict(obj)
    target = v1.get("target_replicas")
    if isinstance(target, bool) or not isinstance(target, int) or target < 0:
        raise CommandError(f"target_replicas must be a non-negative int in schema v1, got {target!r}")
    if v1.get("kind") != "scale":
        v1["target_replicas"] = v1["previous_replicas"] = None
    v1["schema_version"] = COMMAND_SCHEMA_VERSION
    given = v1.get("command_id", "")
    cmd = Command(**v1)
    if given:
        return cmd
    ident = command_id_v1(cmd.kind, cmd.zone, cmd.model, cmd.basis_ms, target, cmd.payload)
    return replace(cmd, command_id=ident)


def hlc_stale(cmd_hlc: int, last_applied_hlc: int | None) -> bool:
    """Whether a command stamped ``cmd_hlc`` is older than the last applied one.

    Unstamped commands (``0``, older producers) and a first command (no last
    applied) are never stale; an equal stamp is not older.

    >>> hlc_stale(5 << 16, 6 << 16), hlc_stale(6 << 16, 5 << 16), hlc_stale(0, 6 << 16), hlc_stale(7, None)
    (True, False, False, False)
    """
    return cmd_hlc != 0 and last_applied_hlc is not None and cmd_hlc < last_applied_hlc
