"""HMAC-SHA256 signatures of commands, with a keyring (standard library only).

A command is signed over its *canonical bytes*: the command as a JSON object
with sorted keys and no whitespace, **without** the signature fields
(:data:`SIGNATURE_FIELDS`: ``key_id`` and ``signature``) and **with**
everything else -- ``command_id``, ``hlc``, ``detail`` (``apply_at_ms``
included), the payload, the times.  Changing any of them breaks the
signature.

A :class:`Keyring` holds several keys, by key id: the first one is *active*
(it signs), every one verifies.  Rotation without downtime: add the new key
behind the old one everywhere, then move it to the front, then drop the old
one once no command signed with it can still be in flight (commands live
``GOVERNOR_COMMAND_TTL_S``).

Raw bytes -- a window record on the metrics topic -- are MACed with the same
keys by :meth:`Keyring.sign_bytes` / :meth:`Keyring.verify_bytes`, over
:data:`WINDOW_DOMAIN` followed by the exact bytes: the domain prefix keeps a
command signature from ever passing as a window MAC (and the reverse).
Learned-state snapshots in Redis use :data:`SNAPSHOT_DOMAIN` the same way
(:mod:`streams.snapshots`).

Keys are written ``kid:hexkey`` (comma-separated in ``GOVERNOR_COMMAND_KEYS``,
one per line in ``GOVERNOR_COMMAND_KEYS_FILE``), each key at least
:data:`MIN_KEY_BYTES` bytes.  Key material never appears in a repr or an
error message.  A key that cannot be a secret is refused like a short one
(:func:`weak_key_reason`): a key id or value marked as a placeholder
(:data:`PLACEHOLDER_MARKS`, e.g. ``REPLACE-ME:00...0`` as once shipped in
docker-compose.yml), or bytes with fewer than :data:`MIN_DISTINCT_BYTES`
distinct values (all one value, ``deadbeef`` repeated, ...): 32 random bytes
take about 30, and fewer than 8 with a probability below 1e-36.

>>> NEW, OLD = bytes(range(32, 64)).hex(), bytes(range(32)).hex()  # fixed keys for the examples only
>>> ring = Keyring.parse("new:" + NEW + ",old:" + OLD)
>>> ring
Keyring(active='new', key_ids=('new', 'old'))
>>> cmd = ring.sign({"kind": "scale", "target_replicas": 4, "hlc": 7})
>>> cmd["key_id"], len(cmd["signature"])
('new', 64)
>>> ring.verify(cmd) is None
True
>>> ring.verify({**cmd, "target_replicas": 400})
'bad signature (key id new)'
>>> Keyring.parse("old:" + OLD).verify(Keyring.parse("old:" + OLD).sign({"a": 1})) is None
True
>>> kid, sig = ring.sign_bytes(b'{"window":1}')
>>> ring.verify_bytes(b'{"window":1}', kid, sig) is None
True
>>> ring.verify_bytes(b'{"window":2}', kid, sig)
'bad MAC (key id new)'
>>> Keyring.parse("k:abcd")
Traceback (most recent call last):
...
ValueError: key 'k': must be at least 32 bytes (got 2)
>>> Keyring.parse("REPLACE-ME:" + OLD)
Traceback (most recent call last):
...
ValueError: key id 'REPLACE-ME' is marked as a placeholder ('replaceme'): generate a key, e.g. k1:$(openssl rand -hex 32)
>>> Keyring.parse("k1:" + "00" * 32)
Traceback (most recent call last):
...
ValueError: key 'k1': its bytes are all one value, not a secret: generate a key, e.g. k1:$(openssl rand -hex 32)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MIN_DISTINCT_BYTES",
    "MIN_KEY_BYTES",
    "NO_KEYS",
    "PLACEHOLDER_MARKS",
    "SIGNATURE_FIELDS",
    "SNAPSHOT_DOMAIN",
    "WINDOW_DOMAIN",
    "Keyring",
    "MissingKeysError",
    "canonical_bytes",
    "generate_keys",
    "weak_key_reason",
]

SIGNATURE_FIELDS = ("key_id", "signature")
MIN_KEY_BYTES = 32
#: Fewer distinct byte values than this and a key is not random (32 random bytes take ~30).
MIN_DISTINCT_BYTES = 8
#: A key id or value containing one of these (case-insensitive, ignoring ``-``, ``_``, ``.`` and
#: spaces) is a placeholder copied from a shipped file or a how-to, never a key.
PLACEHOLDER_MARKS = (
    "replaceme",
    "changeme",
    "placeholder",
    "example",
    "dummy",
    "insecure",
    "fixme",
    "yourkey",
    "notasecret",
)
_GENERATE = "generate a key, e.g. k1:$(openssl rand -hex 32)"
WINDOW_DOMAIN = b"governor-window\0"
SNAPSHOT_DOMAIN = b"governor-snapshot\0"
NO_KEYS = (
    "no command signing key: set GOVERNOR_COMMAND_KEYS (kid:hexkey, >= 32 bytes) "
    "or GOVERNOR_COMMAND_KEYS_FILE; the worker and every executor must share it"
)


class MissingKeysError(RuntimeError):
    """A worker or executor was started without any command signing key."""

    def __init__(self) -> None:
        super().__init__(NO_KEYS)


def canonical_bytes(obj: Mapping[str, Any]) -> bytes:
    """The signed bytes of a command object: sorted-key compact JSON without the signature fields.

    >>> canonical_bytes({"b": 1, "a": {"y": 2, "x": 1}, "signature": "ff", "key_id": "k"})
    b'{"a":{"x":1,"y":2},"b":1}'
    """
    body = {k: v for k, v in obj.items() if k not in SIGNATURE_FIELDS}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def generate_keys() -> str:
    """A fresh random keyring value (one key, ``kid:hexkey``) for runs that configure none."""
    return f"gen-{secrets.token_hex(4)}:{secrets.token_hex(MIN_KEY_BYTES)}"


def _placeholder_mark(text: str) -> str | None:
    flat = "".join(c for c in text.lower() if c not in "-_. ")
    return next((m for m in PLACEHOLDER_MARKS if m in flat), None)


def weak_key_reason(kid: str, hexkey: str) -> str | None:
    """Why ``kid:hexkey`` cannot be a secret signing key, or None; never quotes the key.

    >>> weak_key_reason("k1", "CHANGE_ME")
    "key 'k1': its value is marked as a placeholder ('changeme'): generate a key, e.g. k1:$(openssl rand -hex 32)"
    >>> weak_key_reason("k1", "deadbeef" * 8).split(",")[0]
    "key 'k1': its bytes take only 4 distinct values (fewer than 8)"
    >>> weak_key_reason("k1", bytes(range(32)).hex()) is None
    True
    """
    mark = _placeholder_mark(kid)
    if mark:
        return f"key id {kid!r} is marked as a placeholder ({mark!r}): {_GENERATE}"
    mark = _placeholder_mark(hexkey)
    if mark:
        return f"key {kid!r}: its value is marked as a placeholder ({mark!r}): {_GENERATE}"
    try:
        key = bytes.fromhex(hexkey)
    except ValueError:
        return f"key {kid!r}: not hexadecimal"
    if len(key) < MIN_KEY_BYTES:
        return f"key {kid!r}: must be at least {MIN_KEY_BYTES} bytes (got {len(key)})"
    distinct = len(set(key))
    if distinct == 1:
        return f"key {kid!r}: its bytes are all one value, not a secret: {_GENERATE}"
    if distinct < MIN_DISTINCT_BYTES:
        return (
            f"key {kid!r}: its bytes take only {distinct} distinct values (fewer than {MIN_DISTINCT_BYTES}), "
            f"not a secret: {_GENERATE}"
        )
    return None


@dataclass(frozen=True)
class Keyring:
    """Keys by key id; ``active`` signs, every key verifies."""

    active: str
    keys: Mapping[str, bytes] = field(repr=False)

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self.keys)

    def __repr__(self) -> str:
        return f"Keyring(active={self.active!r}, key_ids={self.key_ids!r})"

    @classmethod
    def parse(cls, raw: str, sep: str = ",") -> Keyring:
        """Keys from ``kid:hexkey`` items separated by ``sep`` (the first is active); ValueError if bad.

        The error names the key id, never the key.
        """
        keys: dict[str, bytes] = {}
        for item in (i.strip() for i in raw.split(sep)):
            if not item or item.startswith("#"):
                continue
            kid, colon, hexkey = (x.strip() for x in item.partition(":"))
            if not colon or not kid or not hexkey:
                raise ValueError("each key must be written kid:hexkey")
            if any(c in kid for c in ",:\n") or not kid.isprintable():
                raise ValueError(f"key id {kid!r}: must not contain ',', ':' or control characters")
            if kid in keys:
                raise ValueError(f"key id {kid!r} appears twice")
            why = weak_key_reason(kid, hexkey)
            if why:
                raise ValueError(why)
            keys[kid] = bytes.fromhex(hexkey)
        if not keys:
            raise ValueError("no key given (kid:hexkey)")
        return cls(active=next(iter(keys)), keys=keys)

    def _mac(self, kid: str, obj: Mapping[str, Any]) -> str:
        return hmac.new(self.keys[kid], canonical_bytes(obj), hashlib.sha256).hexdigest()

    def sign(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """``obj`` with ``key_id`` (the active key) and ``signature`` (hex HMAC-SHA256) set."""
        return {**obj, "key_id": self.active, "signature": self._mac(self.active, obj)}

    def verify(self, obj: Mapping[str, Any]) -> str | None:
        """None if ``obj`` carries a valid signature by one of the keys; else why not."""
        kid, sig = obj.get("key_id"), obj.get("signature")
        if not kid or not sig:
            return "unsigned command"
        if not isinstance(kid, str) or kid not in self.keys:
            return f"unknown key id {str(kid)[:40]!r}"
        if not isinstance(sig, str) or not hmac.compare_digest(sig, self._mac(kid, obj)):
            return f"bad signature (key id {kid})"
        return None

    def _mac_bytes(self, kid: str, data: bytes, domain: bytes) -> str:
        return hmac.new(self.keys[kid], domain + data, hashlib.sha256).hexdigest()

    def sign_bytes(self, data: bytes, domain: bytes = WINDOW_DOMAIN) -> tuple[str, str]:
        """``(key id, hex HMAC-SHA256)`` of ``domain`` + ``data`` with the active key."""
        return self.active, self._mac_bytes(self.active, data, domain)

    def verify_bytes(self, data: bytes, kid: str | None, sig: str | None, domain: bytes = WINDOW_DOMAIN) -> str | None:
        """None if ``sig`` is the MAC of ``domain`` + ``data`` by key ``kid`` (see :meth:`sign_bytes`); else why not."""
        if not kid or not sig:
            return "no MAC"
        if kid not in self.keys:
            return f"unknown key id {kid[:40]!r}"
        if not hmac.compare_digest(sig.encode("utf-8", "replace"), self._mac_bytes(kid, data, domain).encode()):
            return f"bad MAC (key id {kid})"
        return None
