"""The canary driver of the stream worker (controller: :mod:`controllers.canary`).

A rollout is one Redis key per model family, ``<prefix>:canary:<model>``,
holding JSON::

    {"model": "llama2-70b", "version": "v2", "canary": "llama2-70b@v2",
     "params": {CanaryParams fields}, "state": {CanaryState fields},
     "published_share": 0.0, "updated_ms": ...}

``governor canary start`` writes it (:func:`new_rollout`); the worker's
:class:`CanaryDriver` advances it.  The canary version is its own model
name (``<model>@<version>``, it must be in ``GOVERNOR_MODELS`` so its
windows exist).  For every zone window the driver pairs the canary's and the
stable model's window of the same zone and start, runs
:func:`controllers.canary.step` on the pair (a side without traffic counts
as an empty window once a later window of that zone arrives), and saves the
state with an optimistic Redis transaction (an operator's ``abort`` between
read and write makes the driver re-read, never overwrite it).  When the
canary's traffic share differs from ``published_share`` it emits one
``canary`` command per zone (payload ``{"model", "version", "share"}``;
``basis_ms`` = the end of the window that triggered it, never below the
last published one, so executors do not refuse it as stale); executors
write it into the zone's routing hash.  The start's share is published on
the first window of the model after ``start``; an abort's share 0 on the
first window after ``abort``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from controllers import canary as can
from controllers.window_record import WindowRecord
from core import names
from core.settings import Settings
from loop.commands import Command

log = logging.getLogger(__name__)

__all__ = ["CanaryDriver", "new_rollout", "params_from_dict", "params_to_dict", "window_obs"]


def params_to_dict(p: can.CanaryParams) -> dict[str, Any]:
    """JSON-safe :class:`CanaryParams` (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(p).items()}


def params_from_dict(d: dict[str, Any]) -> can.CanaryParams:
    """Inverse of :func:`params_to_dict` (validated by :class:`CanaryParams`)."""
    kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return can.CanaryParams(**kw)


def new_rollout(model: str, version: str, params: can.CanaryParams, now_s: float) -> dict[str, Any]:
    """A started rollout (stage 0), nothing published yet.

    >>> r = new_rollout("m", "v2", can.CanaryParams(), 10.0)
    >>> r["canary"], r["state"]["name"], r["published_share"]
    ('m@v2', 'running', 0.0)
    """
    if not model or "@" in model or not version or "@" in version:
        raise ValueError(f"model={model!r} version={version!r}: non-empty, without '@'")
    return {
        "model": model,
        "version": version,
        "canary": f"{model}@{version}",
        "params": params_to_dict(params),
        "state": can.start(params, now_s).to_dict(),
        "published_share": 0.0,
        "updated_ms": int(now_s * 1000),
    }


def window_obs(w: WindowRecord | None) -> can.VersionObs:
    """A zone window's requests, errors and TTFT P50/P95/P99 (an absent window is empty).

    The quantiles feed the canary's sequential latency tests (requests over
    the P99 limit, and over k x stable's P95) as well as its P99 rule.
    """
    if w is None:
        return can.VersionObs(0, 0, None)
    n = w.count
    errors = min(n, round(w.error_rate * n))
    if not n:
        return can.VersionObs(n, errors, None, p50_ms=None, p95_ms=None)
    return can.VersionObs(n, errors, w.ttft_p99_ms, p50_ms=w.ttft_p50_ms, p95_ms=w.ttft_p95_ms)


@dataclass
class _Pair:
    canary: WindowRecord | None = None
    stable: WindowRecord | None = None


@dataclass
class CanaryDriver:
    """Advances the rollouts stored in Redis from the worker's zone windows."""

    settings: Settings
    redis: aioredis.Redis
    max_retries: int = 5
    _pairs: dict[tuple[str, str, int], _Pair] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return self.settings.topic_prefix

    async def on_window(self, m: WindowRecord, now_ms: int) -> list[Command]:
        """Feed one window record; returns the ``canary`` commands to publish.

        The one driver that does I/O: a rollout lives in Redis, where ``governor
        canary`` writes it, and each step is an optimistic transaction on it.
        """
        if m.scope != "zone":
            return []
        name, zone, start = m.model, m.zone, m.window_start_ms
        base, _, version = name.partition("@")
        raw = await self.redis.get(names.canary_state(self.prefix, base))
        if raw is None:
            return []
        rollout = orjson.loads(raw)
        if version and version != rollout["version"]:
            return []
        pair = self._pairs.setdefault((base, zone, start), _Pair())
        if version:
            pair.canary = m
        else:
            pair.stable = m
        due = []
        for key in sorted(k for k in self._pairs if k[0] == base and k[1] == zone):
            p = self._pairs[key]
            if (p.canary is not None and p.stable is not None) or key[2] < start:
                due.append((key, self._pairs.pop(key)))
        cmds: list[Command] = []
        for (_, _, _), p in due:
            cmds += await self._step(base, p, m.window_end_ms, now_ms)
        if not due:  # nothing judged, but a start or an abort may need its share published
            cmds += await self._step(base, None, m.window_end_ms, now_ms)
        return cmds

    async def _step(self, base: str, pair: _Pair | None, seen_ms: int, now_ms: int) -> list[Command]:
        key = names.canary_state(self.prefix, base)
        for _ in range(self.max_retries):
            try:
                async with self.redis.pipeline(transaction=True) as pipe:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        return []
                    rollout = orjson.loads(raw)
                    params = params_from_dict(rollout["params"])
                    state = can.CanaryState.from_dict(rollout["state"])
                    basis_ms = seen_ms
                    if pair is not None and state.name == "running":
                        ref = pair.stable or pair.canary
                        assert ref is not None
                        end_ms = ref.window_end_ms
                        state, out = can.step(
                            params, state, window_obs(pair.canary), window_obs(pair.stable), end_ms / 1000.0
                        )
                        if out.changed:
                            log.info("canary %s: %s", rollout["canary"], out.reason)
                    share = can.traffic_share(params, state)
                    publish = share != rollout["published_share"]
                    # Executors refuse a basis older than the last applied one: never go back.
                    basis_ms = max(basis_ms, int(rollout.get("published_basis_ms", 0)))
                    if state.to_dict() == rollout["state"] and not publish:
                        await pipe.unwatch()  # type: ignore[no-untyped-call]
                        return []
                    rollout.update(state=state.to_dict(), published_share=share, updated_ms=now_ms)
                    if publish:
                        rollout["published_basis_ms"] = basis_ms
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, orjson.dumps(rollout))
                    await pipe.execute()
            except WatchError:
                continue
            if not publish:
                return []
            return self._commands(rollout, share, basis_ms, now_ms, state.reason or state.name)
        log.warning("canary %s: gave up after %d conflicting writes", base, self.max_retries)
        return []

    def _commands(
        self, rollout: dict[str, Any], share: float, basis_ms: int, now_ms: int, reason: str
    ) -> list[Command]:
        ttl = int(self.settings.command_ttl_s * 1000)
        payload = {"model": rollout["model"], "version": rollout["version"], "share": share}
        return [
            Command(
                kind="canary",
                zone=z,
                model=rollout["model"],
                reason=reason,
                issued_at_ms=now_ms,
                expires_at_ms=now_ms + ttl,
                basis_ms=basis_ms,
                controller="canary",
                payload=dict(payload),
            )
            for z in self.settings.zones
        ]
