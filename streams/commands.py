"""Versioned, idempotent commands from the controllers to the executors.

``command_id`` is a hash of what the command *decides* (kind, zone, model,
the window that caused it, the target): the same decision taken twice --
say after a worker restart re-reads the same window -- yields the same id,
and executors drop the duplicate.  ``route``, ``breaker`` and ``canary``
commands carry what they decide in ``payload`` (weights per class per
``"variant|zone"`` target; a breaker's state; a canary's share), and a
canonical JSON of it enters the id (``relocate``: ``{"node", "max_bytes",
"expected_generation", "action"}``, see :mod:`streams.kv_policy_driver`; ``agents``:
``{"weights": {"rag", "tool", "llm"}, "signals": {"stability", "rag_score",
"tool_conf"}, "paths": {path: share}}``, see :mod:`streams.agent_weights_driver`); ``scale`` commands keep an empty payload
and their old ids.  Commands carry ``issued_at_ms`` and
``expires_at_ms``; an executor refuses an expired command rather than act on
a stale view of the fleet.

``hlc`` is a hybrid-logical-clock timestamp (``Hlc.encode()`` of
:mod:`controllers.hlc`, ``l << 16 | c``) stamped by the bridge agent when it
writes the command to the zone's Redis stream.  It is *not* part of
``command_id`` (re-stamping a re-delivered decision keeps its id, so the
duplicate is still dropped).  ``0`` means "unstamped" (an older producer);
executors then skip the HLC order check (:func:`hlc_stale`).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson

from core import vocab
from core.vocab import AGENT_PATHS

COMMAND_SCHEMA_VERSION = 1
COMMAND_KINDS = frozenset(vocab.COMMAND_KINDS)
AGENT_SIGNALS = ("stability", "rag_score", "tool_conf")


class CommandError(ValueError):
    """A command record is malformed; the message says which field."""


def canonical_payload(payload: dict[str, Any]) -> str:
    """Sorted-key JSON of a payload (the part of the id hash that encodes it)."""
    return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode()


def command_id(
    kind: str, zone: str, model: str, basis_ms: int, target: Any, payload: dict[str, Any] | None = None
) -> str:
    """Deterministic id of a decision.

    >>> command_id("scale", "az-a", "m", 10_000, 4) == command_id("scale", "az-a", "m", 10_000, 4)
    True
    >>> a = command_id("route", "az-a", "m", 1, 0, {"w": {"x": 0.5, "y": 0.5}})
    >>> a == command_id("route", "az-a", "m", 1, 0, {"w": {"y": 0.5, "x": 0.5}})
    True
    >>> a == command_id("route", "az-a", "m", 1, 0, {"w": {"x": 0.6, "y": 0.4}})
    False
    """
    basis = f"{kind}|{zone}|{model}|{basis_ms}|{target}"
    if payload:
        basis += "|" + canonical_payload(payload)
    digest = hashlib.sha256(basis.encode()).hexdigest()
    return f"{kind}-{digest[:20]}"


@dataclass(frozen=True)
class Command:
    kind: str
    zone: str
    model: str
    target_replicas: int
    reason: str
    issued_at_ms: int
    expires_at_ms: int
    basis_ms: int  # end of the window the decision was taken on
    previous_replicas: int | None = None
    controller: str = "pid"
    detail: dict[str, Any] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)
    schema_version: int = COMMAND_SCHEMA_VERSION
    command_id: str = ""
    hlc: int = 0  # Hlc.encode() stamped by the bridge; 0 = unstamped; not part of command_id

    def __post_init__(self) -> None:
        if self.kind not in COMMAND_KINDS:
            raise CommandError(f"kind {self.kind!r} not in {sorted(COMMAND_KINDS)}")
        if not self.zone or not self.model:
            raise CommandError("zone and model must be non-empty")
        if not isinstance(self.target_replicas, int) or self.target_replicas < 0:
            raise CommandError(f"target_replicas must be a non-negative int, got {self.target_replicas!r}")
        if self.expires_at_ms <= self.issued_at_ms:
            raise CommandError("expires_at_ms must be after issued_at_ms")
        if self.schema_version != COMMAND_SCHEMA_VERSION:
            raise CommandError(f"unsupported command schema_version {self.schema_version}")
        if not self.command_id:
            object.__setattr__(
                self,
                "command_id",
                command_id(self.kind, self.zone, self.model, self.basis_ms, self.target_replicas, self.payload),
            )
        if isinstance(self.hlc, bool) or not isinstance(self.hlc, int) or self.hlc < 0:
            raise CommandError(f"hlc must be a non-negative int, got {self.hlc!r}")
        if not isinstance(self.payload, dict):
            raise CommandError("payload must be a JSON object")
        if self.kind == "route":
            weights = self.payload.get("weights")
            if not isinstance(weights, dict) or not all(
                isinstance(ws, dict) and all(isinstance(w, int | float) and w >= 0 for w in ws.values())
                for ws in weights.values()
            ):
                raise CommandError("route payload needs weights: {class: {'variant|zone': weight >= 0}}")
        if self.kind == "relocate":
            p = self.payload
            if (
                not isinstance(p.get("node"), str)
                or not p["node"]
                or p.get("action") not in ("compact", "move")
                or not all(
                    isinstance(p.get(k), int) and not isinstance(p.get(k), bool) and p[k] >= 0
                    for k in ("max_bytes", "expected_generation")
                )
            ):
                raise CommandError(
                    "relocate payload needs node, action in (compact, move), "
                    "max_bytes >= 0 and expected_generation >= 0 (ints)"
                )
        if self.kind == "agents":
            p = self.payload
            if not (
                _shares(p.get("weights"), AGENT_PATHS)
                and _shares(p.get("signals"), AGENT_SIGNALS)
                and _shares(p.get("paths"), None)
            ):
                raise CommandError(
                    "agents payload needs weights {rag, tool, llm}, signals {stability, "
                    "rag_score, tool_conf} and paths {path: share}, numbers in [0, 1]"
                )

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str | dict[str, Any]) -> Command:
        try:
            obj = orjson.loads(raw) if isinstance(raw, bytes | str) else dict(raw)
        except orjson.JSONDecodeError as exc:
            raise CommandError(f"not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise CommandError("command must be a JSON object")
        try:
            return cls(**obj)
        except TypeError as exc:
            raise CommandError(str(exc)) from exc

    def expired(self, now_ms: int) -> bool:
        return now_ms >= self.expires_at_ms

    def with_hlc(self, hlc: int) -> Command:
        """The same command (same ``command_id``) stamped with ``hlc``."""
        return replace(self, hlc=int(hlc))

    @property
    def order_field(self) -> str:
        """The ``kind:model`` key under which executors keep the last applied HLC
        (``relocate:model:node`` for relocations: nodes are independent)."""
        if self.kind == "relocate":
            return f"{self.kind}:{self.model}:{self.payload.get('node', '')}"
        return f"{self.kind}:{self.model}"


def _shares(d: Any, keys: tuple[str, ...] | None) -> bool:
    """``d`` maps exactly ``keys`` (any str keys when None) to numbers in [0, 1]."""
    return (
        isinstance(d, dict)
        and (keys is None or sorted(d) == sorted(keys))
        and all(
            isinstance(k, str) and not isinstance(v, bool) and isinstance(v, int | float) and 0.0 <= v <= 1.0
            for k, v in d.items()
        )
    )


def hlc_stale(cmd_hlc: int, last_applied_hlc: int | None) -> bool:
    """Whether a command stamped ``cmd_hlc`` is older than the last applied one.

    Unstamped commands (``0``, older producers) and a first command (no last
    applied) are never stale; an equal stamp is not older.

    >>> hlc_stale(5 << 16, 6 << 16), hlc_stale(6 << 16, 5 << 16), hlc_stale(0, 6 << 16), hlc_stale(7, None)
    (True, False, False, False)
    """
    return cmd_hlc != 0 and last_applied_hlc is not None and cmd_hlc < last_applied_hlc
