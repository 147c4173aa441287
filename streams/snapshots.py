"""Learned state in Redis as authenticated, versioned data: one key per model, one per routed family.

The control agent's drivers (scaler, breaker, KV policy, agent weights,
routing) learn as windows pass; the worker saves that state so a restart
does not forget it.  Whatever is read back from Redis is hostile until it
is proved to be governor's own, so the state is stored as *data* (JSON,
never pickle: loading it can run nothing) and *sealed*:

- **One key per scope** (:func:`core.names.snapshot`): ``model:<name>``
  holds every model-keyed driver's state for that model, ``family:<primary>``
  the routing state of that family.  A worker writes only the scopes of the
  models whose metrics partition it holds (:mod:`streams.ownership`), so
  workers that own different models never overwrite each other's state; on a
  rebalance it saves them first and restores the scopes of the models it gains.
- **Sealed value**: ``GSNAP <key id> <hex HMAC-SHA256>\\n<body>``, the MAC
  taken with the command keys (:class:`core.signing.Keyring`, domain
  :data:`core.signing.SNAPSHOT_DOMAIN`) over the Redis key, a NUL byte and
  the exact body bytes.  The key is inside the MAC: a valid snapshot of one
  model copied under another model's key does not open.
- **Versioned body**: ``{"format": FORMAT, "scope": ..., "saved_at_ms": ...,
  "parts": {driver: data}}``; each driver's data carries its own version.

:func:`open_snapshot` says why a value is refused, and the scope starts
fresh (logged, and counted in ``governor_snapshots_ignored_total{reason}``):

========================  ===================================================
``unauthenticated``       no seal, unknown key id or wrong MAC: a planted
                          value (a pickle, a hand edit), another cluster's key
``unreadable``            sealed but not the JSON shape above, or a part that
                          does not load
``version``               another envelope format or a driver version this
                          code does not read; also the per-driver keys of
                          earlier versions (:data:`core.names.LEGACY_SNAPSHOT_PARTS`)
``scope``                 the body names another scope than its key
``stale``                 saved more than ``GOVERNOR_SNAPSHOT_MAX_AGE_S`` ago,
                          or ahead of the clock by more than the allowed skew
========================  ===================================================

Someone who can write Redis but holds no key can delete a snapshot or put
back an older sealed one of the same scope (a replay, bounded by the maximum
age); they cannot make the loop load state of their choosing, and a replayed
scaler state cannot shrink a fleet: a restored key scales below its fleet only
once three fresh windows call for it (:meth:`loop.scaler_driver.Scaler.restore`).

>>> from core.signing import Keyring
>>> ring = Keyring.parse("k1:" + bytes(range(32)).hex())
>>> blob = seal_snapshot(ring, "p:snapshot:model:m", "model:m", {"scaler": {"version": 2}}, now_ms=1_000)
>>> blob[:8]
b'GSNAP k1'
>>> opened = open_snapshot(ring, "p:snapshot:model:m", "model:m", blob, now_ms=2_000, max_age_ms=60_000)
>>> opened.parts, opened.reason
({'scaler': {'version': 2}}, None)
>>> open_snapshot(ring, "p:snapshot:model:other", "model:other", blob, 2_000, 60_000).reason
'unauthenticated'
>>> open_snapshot(ring, "p:snapshot:model:m", "model:m", blob, 100_000, 60_000).reason
'stale'
>>> open_snapshot(ring, "p:snapshot:model:m", "model:m", b"\\x80\\x04cos\\nsystem\\n", 2_000, 60_000).reason
'unauthenticated'
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core import names
from core.signing import SNAPSHOT_DOMAIN, Keyring
from streams.metrics_export import WorkerMetrics

__all__ = [
    "FORMAT",
    "REASONS",
    "Opened",
    "SnapshotStore",
    "open_snapshot",
    "seal_snapshot",
]

log = logging.getLogger(__name__)

FORMAT = 3  # 1: pickle of the scaler; 2: JSON per driver, unsealed; 3: sealed, one key per scope
MAGIC = b"GSNAP "
REASONS = ("unauthenticated", "unreadable", "version", "scope", "stale")
_REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
_MAX_HEADER = 200  # "GSNAP <kid> <64 hex>\n": a key id is short


@dataclass(frozen=True)
class Opened:
    """What :func:`open_snapshot` found: the parts, or the reason (one of :data:`REASONS`) and detail."""

    parts: dict[str, Any] | None
    reason: str | None = None
    detail: str = ""


def _mac_input(key: str, body: bytes) -> bytes:
    return key.encode() + b"\0" + body


def seal_snapshot(ring: Keyring, key: str, scope: str, parts: Mapping[str, Any], now_ms: int) -> bytes:
    """The sealed value of ``parts`` for Redis key ``key`` (see the module docstring)."""
    body = orjson.dumps({"format": FORMAT, "scope": scope, "saved_at_ms": int(now_ms), "parts": parts})
    kid, mac = ring.sign_bytes(_mac_input(key, body), SNAPSHOT_DOMAIN)
    return MAGIC + f"{kid} {mac}\n".encode() + body


def open_snapshot(
    ring: Keyring, key: str, scope: str, blob: bytes, now_ms: int, max_age_ms: int, max_skew_ms: int = 60_000
) -> Opened:
    """The parts of a sealed value, or why it must be ignored."""
    head, nl, body = bytes(blob).partition(b"\n")
    if not blob.startswith(MAGIC) or not nl or len(head) > _MAX_HEADER:
        return Opened(None, "unauthenticated", "no seal (not written by a governor worker of this version)")
    fields = head[len(MAGIC) :].decode("ascii", "replace").split(" ")
    if len(fields) != 2:
        return Opened(None, "unauthenticated", "malformed seal")
    why = ring.verify_bytes(_mac_input(key, body), fields[0], fields[1], SNAPSHOT_DOMAIN)
    if why is not None:
        return Opened(None, "unauthenticated", why)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return Opened(None, "unreadable", f"not JSON: {exc}")
    if not isinstance(doc, dict):
        return Opened(None, "unreadable", "not a JSON object")
    if doc.get("format") != FORMAT:
        return Opened(None, "version", f"format {doc.get('format')!r} (this code reads {FORMAT})")
    if doc.get("scope") != scope:
        return Opened(None, "scope", f"body is for {str(doc.get('scope'))[:80]!r}")
    saved, parts = doc.get("saved_at_ms"), doc.get("parts")
    if isinstance(saved, bool) or not isinstance(saved, int) or not isinstance(parts, dict):
        return Opened(None, "unreadable", "saved_at_ms or parts missing")
    if now_ms - saved > max_age_ms or saved - now_ms > max_skew_ms:
        return Opened(None, "stale", f"saved at {saved} ms, now {now_ms} ms (max age {max_age_ms} ms)")
    return Opened(parts)


class Scoped(Protocol):
    """What the store needs of the control loop (:class:`loop.control_loop.ControlLoop`)."""

    def scopes(self) -> list[str]: ...

    def snapshot_scopes(self) -> dict[str, dict[str, Any]]: ...

    def restore_scope(self, scope: str, parts: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, str]]: ...


@dataclass
class SnapshotStore:
    """Saves and restores the control loop's learned state in Redis, one sealed key per scope.

    Every scope the loop owns is written in one ``MSET`` at most every
    ``every_s`` (loop time); Redis trouble is logged and the next window
    retries.  :meth:`restore` reads every configured scope; one that is
    missing starts fresh silently, one that is refused starts fresh with a
    log line and a count (``governor_snapshots_ignored_total{reason}``).
    """

    redis: aioredis.Redis
    prefix: str
    loop: Scoped
    keyring: Keyring
    clock_ms: Callable[[], int]
    max_age_s: float = 3600.0
    metrics: WorkerMetrics | None = None
    every_s: float = 2.0
    _last_s: float = field(default=-float("inf"), init=False)
    _legacy_checked: bool = field(default=False, init=False)
    ignored: dict[str, int] = field(default_factory=dict, init=False)

    def key(self, scope: str) -> str:
        return names.snapshot(self.prefix, scope)

    def _ignore(self, key: str, reason: str, detail: str) -> None:
        self.ignored[reason] = self.ignored.get(reason, 0) + 1
        if self.metrics is not None:
            self.metrics.snapshots_ignored.labels(reason).inc()
        log.error("snapshot %s ignored (%s: %s); that state starts fresh", key, reason, detail)

    async def restore(self, only: Collection[str] | None = None) -> dict[str, dict[str, int]]:
        """Restore every scope (or those of ``only``: the models a worker gained in a rebalance)
        that has a valid snapshot; returns what each part of each scope restored."""
        scopes = [s for s in self.loop.scopes() if only is None or s in only]
        if not scopes:
            return {}
        legacy = [] if self._legacy_checked else [self.key(p) for p in names.LEGACY_SNAPSHOT_PARTS]
        try:
            blobs = await self.redis.mget([self.key(s) for s in scopes] + legacy)
        except _REDIS_ERRORS as exc:
            log.warning("no snapshot restored (redis: %s); starting fresh", exc)
            return {}
        self._legacy_checked = True
        for key, blob in zip(legacy, blobs[len(scopes) :], strict=True):
            if blob:
                self._ignore(key, "version", "a per-driver snapshot of an earlier version")
        done: dict[str, dict[str, int]] = {}
        now = self.clock_ms()
        for scope, blob in zip(scopes, blobs, strict=False):
            if not blob:
                continue
            key = self.key(scope)
            raw = blob if isinstance(blob, bytes) else str(blob).encode()
            opened = open_snapshot(self.keyring, key, scope, raw, now, int(self.max_age_s * 1000))
            if opened.parts is None:
                self._ignore(key, opened.reason or "unreadable", opened.detail)
                continue
            restored, failed = self.loop.restore_scope(scope, opened.parts)
            for part, why in failed.items():
                reason = "version" if why.startswith("version") else "unreadable"
                self._ignore(f"{key} ({part})", reason, why)
            if restored:
                done[scope] = restored
                if self.metrics is not None:
                    self.metrics.snapshots_restored.inc()
                log.info("state restored from %s: %s", key, restored)
        return done

    async def save(self, now_s: float, *, force: bool = False) -> bool:
        """Write every owned scope's sealed snapshot unless the last write is under ``every_s`` old
        (``force``: now, whatever its age; before a rebalance hands scopes to another worker)."""
        if now_s - self._last_s < self.every_s and not force:
            return False
        self._last_s = now_s
        scopes = self.loop.snapshot_scopes()
        if not scopes:
            return False
        now = self.clock_ms()
        sealed = {self.key(s): seal_snapshot(self.keyring, self.key(s), s, p, now) for s, p in scopes.items()}
        try:
            await self.redis.mset(sealed)
        except _REDIS_ERRORS as exc:
            log.warning("snapshots not saved (redis: %s); next window retries", exc)
            return False
        return True
