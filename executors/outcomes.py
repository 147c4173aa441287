"""Relocation outcomes: from the fleet's Redis list to the results topic, none lost.

An executor's result for a ``relocate`` command only says that the request
was queued (:class:`~executors.backends.SimFleetBackend` pushes it to
``<prefix>:fleet:<zone>:relocate``).  The fleet applies it later and RPUSHes
the real outcome (JSON) to ``<prefix>:fleet:<zone>:relocated``
(:func:`sim.live.apply_relocation`).  :class:`OutcomeRelay`, run by the
zone's :class:`~executors.executor.ZoneExecutor` between two polls of its
command stream, publishes each of them as one more record on
``<prefix>.results`` (key = zone)::

    {"schema_version": 1, "record": "relocation_outcome", "kind": "relocation_outcome",
     "outcome": "relocation_applied" | "relocation_refused", "applied": bool,
     "reason": "" | why the fleet refused,
     "zone", "model", "node", "command_id", "action",      # of the relocate command
     "t_s",                                                # fleet (trace) time it was applied
     "at_ms", "backend",                                   # executor clock when relayed
     "bytes_moved", "duration_s", "pause_steps",            # compaction: the copy and its pause
     "fragmentation_before", "fragmentation_after",
     "largest_free_before", "largest_free_after",
     "moved",                                              # 'move': sessions moved to peers
     "detail": {...}}                                      # the fleet's whole outcome

A number the fleet did not report is ``null`` (a refusal, or a ``move``).
``record`` tells these records from command results (which have none) and
from timing probes (``"timing"``); ``command_id`` joins one to the
``relocate`` command's own result.

Delivery is at least once.  Each outcome is moved atomically (LMOVE) from
the fleet's list to ``<prefix>:executor:<zone>:relocated:inflight`` before
it is published, and removed from there (LREM) only after the broker
acknowledged it.  While the results topic is unavailable the publish retries
with capped backoff, like a command result, and the outcomes behind it wait
in the fleet's list; an executor that dies between the move and the
acknowledgement leaves the outcome in flight, and the zone's next executor
to start publishes it again.  So a consumer may see an outcome twice
(``command_id`` and ``t_s`` identify one), never zero times -- within the
fleet's bound: it keeps the last ``RELOCATED_KEEP`` (1,000) outcomes, so an
executor stopped for longer than that many relocations loses the oldest.
Several executors of one zone share the list safely (LMOVE hands each
outcome to one of them).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

log = logging.getLogger(__name__)

RECORD = "relocation_outcome"
NUMBERS = (
    "bytes_moved",
    "duration_s",
    "pause_steps",
    "fragmentation_before",
    "fragmentation_after",
    "largest_free_before",
    "largest_free_after",
)


def outcome_record(raw: bytes, zone: str, backend: str, now_ms: int) -> dict[str, Any]:
    """The results-topic record of one fleet outcome (``raw``: the JSON the fleet pushed).

    >>> r = outcome_record(b'{"node": "n", "command_id": "relocate-1", "bytes_moved": 5}', "az-a", "sim", 7)
    >>> r["outcome"], r["applied"], r["bytes_moved"], r["pause_steps"], r["at_ms"]
    ('relocation_applied', True, 5, None, 7)
    >>> outcome_record(b'{"refused": "unknown node"}', "az-a", "sim", 7)["reason"]
    'unknown node'
    >>> outcome_record(b'not json', "az-a", "sim", 7)["reason"]
    'unreadable outcome: not json'
    """
    try:
        out = orjson.loads(raw)
        if not isinstance(out, dict):
            raise TypeError("not a JSON object")
    except (orjson.JSONDecodeError, TypeError):
        out = {"refused": f"unreadable outcome: {raw.decode('utf-8', 'replace')[:200]}"}
    refused = out.get("refused")
    moved = out.get("moved")
    return {
        "schema_version": 1,
        "record": RECORD,
        "kind": RECORD,
        "outcome": "relocation_refused" if refused else "relocation_applied",
        "applied": not refused,
        "reason": str(refused or ""),
        "zone": str(out.get("zone") or zone),
        "model": out.get("model"),
        "node": out.get("node"),
        "command_id": out.get("command_id"),
        "action": out.get("action"),
        "t_s": out.get("t_s"),
        "at_ms": now_ms,
        "backend": backend,
        **{k: out.get(k) for k in NUMBERS},
        "moved": len(moved) if isinstance(moved, dict) else None,
        "detail": out,
    }


class OutcomeRelay:
    """Drains one zone's ``relocated`` list into the results topic (see the module docstring).

    ``publish`` must return only once the record is acknowledged, retrying
    temporary trouble itself (:meth:`ZoneExecutor._report` does); Redis
    errors propagate to the caller, which retries the whole step.
    """

    def __init__(
        self,
        redis: Any,
        source: str,
        inflight: str,
        *,
        zone: str,
        backend: str,
        publish: Callable[[dict[str, Any]], Awaitable[None]],
        now_ms: Callable[[], int],
        batch: int = 100,
    ) -> None:
        self.redis, self.source, self.inflight = redis, source, inflight
        self.zone, self.backend, self.publish, self.now_ms = zone, backend, publish, now_ms
        self.batch = batch
        self.relayed = 0
        self._recovered = False

    async def _publish(self, raw: bytes) -> None:
        rec = outcome_record(raw, self.zone, self.backend, self.now_ms())
        await self.publish(rec)
        await self.redis.lrem(self.inflight, 1, raw)
        self.relayed += 1
        log.info(
            "executor %s: relocation %s of %s %s%s",
            self.zone,
            rec["command_id"],
            rec["node"],
            rec["outcome"],
            f" ({rec['reason']})" if rec["reason"] else "",
        )

    async def recover(self) -> int:
        """Publish again what a previous executor left in flight; the number published."""
        left = await self.redis.lrange(self.inflight, 0, -1)
        for raw in left:
            await self._publish(raw)
        self._recovered = True
        return len(left)

    async def pump(self) -> int:
        """One step: recover once, then relay up to ``batch`` new outcomes; the number relayed."""
        n = 0 if self._recovered else await self.recover()
        for _ in range(self.batch):
            raw = await self.redis.lmove(self.source, self.inflight, "LEFT", "RIGHT")
            if raw is None:
                break
            await self._publish(raw)
            n += 1
        return n
