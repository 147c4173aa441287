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

from controllers import canary as can
from controllers.window_record import WindowRecord
from core import names
from core.settings import Settings
from loop.commands import Command
from loop.effects import SwapWrite

log = logging.getLogger(__name__)

__all__ = ["Advanced", "CanaryDriver", "new_rollout", "params_from_dict", "params_to_dict", "window_obs"]


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


@dataclass(frozen=True)
class Advanced:
    """One step of a rollout: the rollout to store (None: unchanged) and the commands to publish."""

    rollout: dict[str, Any] | None
    commands: list[Command]


@dataclass
class Pair:
    canary: WindowRecord | None = None
    stable: WindowRecord | None = None


@dataclass
class CanaryDriver:
    """Pairs the zone windows of a rollout's two versions and advances the rollout (pure: the rollout
    comes in as read (:meth:`observe`), each step goes out as a :class:`~loop.effects.SwapWrite`
    guarding its commands, which the worker's :class:`streams.canary_store.CanaryStore` performs)."""

    settings: Settings
    _pairs: dict[tuple[str, str, int], Pair] = field(default_factory=dict)
    rollouts: dict[str, bytes | None] = field(default_factory=dict)  # family -> its rollout as last read
    _writes: list[SwapWrite] = field(default_factory=list)

    def observe(self, model: str, raw: bytes | None) -> None:
        """The rollout of ``model``'s family as read before its window (None: none)."""
        self.rollouts[model.partition("@")[0]] = raw

    def on_window(self, m: WindowRecord, now_ms: int) -> list[Command]:
        """Step the window's rollout (as last observed); the step and its commands wait in :meth:`drain_writes`.

        Returns no command of its own: a canary command goes out only once its step is written.
        """
        base = m.model.partition("@")[0]
        raw = self.rollouts.pop(base, None) if m.scope == "zone" else None
        if raw is None:
            return []
        step = self.step(orjson.loads(raw), m, now_ms)
        if step.rollout is not None:
            then = tuple((c, f"canary {c.model} -> {c.payload['share']:.2f}") for c in step.commands)
            key = names.canary_state(self.settings.topic_prefix, base)
            self._writes.append(SwapWrite(key, orjson.dumps(step.rollout), raw, then))
        return []

    def step(self, rollout: dict[str, Any], m: WindowRecord, now_ms: int) -> Advanced:
        """Every pair ``m`` completes, judged in turn on ``rollout`` (held in memory, not changed): the
        rollout after them (None: unchanged) and their commands.

        >>> from controllers.window_record import decode_window
        >>> d = CanaryDriver(Settings(zones=("az-a",)))
        >>> w = decode_window({"scope": "zone", "model": "m", "zone": "az-a", "window_end_ms": 10_000, "count": 5})
        >>> out = d.step(new_rollout("m", "v2", can.CanaryParams(), 0.0), w, 10_000)
        >>> [(c.zone, c.payload["share"]) for c in out.commands], out.rollout["published_share"]
        ([('az-a', 0.01)], 0.01)
        """
        after: dict[str, Any] | None = None
        cmds: list[Command] = []
        for pair in self.due(m, rollout):
            out = self.advance(after or rollout, pair, m.window_end_ms, now_ms)
            if out.rollout is not None:
                after = out.rollout
                cmds += out.commands
        return Advanced(after, cmds)

    def drain_writes(self) -> list[SwapWrite]:
        writes, self._writes = self._writes, []
        return writes

    def due(self, m: WindowRecord, rollout: dict[str, Any] | None) -> list[Pair | None]:
        """Feed one window of a model family whose rollout is ``rollout`` (None: no rollout).

        Returns the pairs to judge, oldest first (``[None]``: none, but a start or an abort may need its
        share published; ``[]``: the window is not the rollout's).
        """
        if m.scope != "zone" or rollout is None:
            return []
        base, _, version = m.model.partition("@")
        if version and version != rollout["version"]:
            return []
        zone, start = m.zone, m.window_start_ms
        pair = self._pairs.setdefault((base, zone, start), Pair())
        if version:
            pair.canary = m
        else:
            pair.stable = m
        due: list[Pair | None] = []
        for key in sorted(k for k in self._pairs if k[0] == base and k[1] == zone):
            p = self._pairs[key]
            if (p.canary is not None and p.stable is not None) or key[2] < start:
                due.append(self._pairs.pop(key))
        return due or [None]

    def advance(self, rollout: dict[str, Any], pair: Pair | None, seen_ms: int, now_ms: int) -> Advanced:
        """One step of a rollout: (the rollout to write back, or None when nothing changed; its commands)."""
        params = params_from_dict(rollout["params"])
        state = can.CanaryState.from_dict(rollout["state"])
        basis_ms = seen_ms
        if pair is not None and state.name == "running":
            ref = pair.stable or pair.canary
            assert ref is not None
            end_ms = ref.window_end_ms
            state, out = can.step(params, state, window_obs(pair.canary), window_obs(pair.stable), end_ms / 1000.0)
            if out.changed:
                log.info("canary %s: %s", rollout["canary"], out.reason)
        share = can.traffic_share(params, state)
        publish = share != rollout["published_share"]
        # Executors refuse a basis older than the last applied one: never go back.
        basis_ms = max(basis_ms, int(rollout.get("published_basis_ms", 0)))
        if state.to_dict() == rollout["state"] and not publish:
            return Advanced(None, [])
        rollout = {**rollout, "state": state.to_dict(), "published_share": share, "updated_ms": now_ms}
        if not publish:
            return Advanced(rollout, [])
        rollout["published_basis_ms"] = basis_ms
        return Advanced(rollout, self._commands(rollout, share, basis_ms, now_ms, state.reason or state.name))

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
