"""An executor's first look at a batch of stream entries: junk is refused in bulk.

Anyone who can ``XADD`` to a zone's command stream can fill it.  Answering
each junk entry like a command (one result on the results topic, one
``last_result`` write, one ``XACK``: a Kafka round trip and three Redis
round trips each) lets 12,000 unsigned entries, written in 0.2 s, keep the
executor busy past the command TTL, so the real command behind them expires.

:func:`screen` is the cheap test of one entry, before anything else: an
entry goes on to the full checks (:mod:`executors.guard`, one result each)
only if its ``cmd`` field is a JSON object whose ``key_id`` is a key of the
executor's keyring (or a schema-v1 command while
``GOVERNOR_ACCEPT_UNSIGNED_V1`` is on).  Everything else -- no ``cmd``
field, not JSON, not an object, no ``key_id``, an unknown one -- cannot be a
command of this deployment, and :class:`Intake` refuses it in bulk: the
batch's junk entries are acknowledged with one ``XACK`` and reported as one
summary record on the results topic::

    {"schema_version": 1, "record": "refused_batch", "outcome": "rejected",
     "reason": "<N> entries without a valid key id refused in bulk",
     "zone", "at_ms", "backend", "entry_id" (the first), "count": N,
     "detail": {"reasons": {"unsigned command": n, ...}, "first_entry_id", "last_entry_id",
                "samples": [{"entry_id", "reason", "raw"}, ...]}}   # the first 3, raw capped

plus one log line per batch and the counter
``governor_executor_entries_refused_total{zone, reason}``.  The summary has
no ``command_id`` (the ledger counts it as unparsed, once).  A signed entry
with a known key id is never refused here, however malformed otherwise: it
gets its own result, as before.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter

from executors.entry import echo

__all__ = ["REASONS", "Intake", "JunkBatch", "screen"]

log = logging.getLogger(__name__)

RECORD = "refused_batch"
#: Every reason :func:`screen` gives (the counter's ``reason`` label values).
REASONS = ("no 'cmd' field", "not JSON", "not a JSON object", "unsigned command", "unknown key id")
SAMPLES = 3
SAMPLE_BYTES = 200


def screen(fields: Any, key_ids: Collection[str], accept_v1: bool) -> str | None:
    """None if the entry may be a command of this deployment (its ``key_id`` is one of ``key_ids``,
    or it is schema v1 and ``accept_v1``); else the reason (one of :data:`REASONS`) it is junk.

    >>> screen({b"cmd": b'{"key_id": "k1", "kind": 3}'}, {"k1"}, False) is None
    True
    >>> [screen(f, {"k1"}, False) for f in ({}, {b"cmd": b"x"}, {b"cmd": b"[1]"}, {b"cmd": b"{}"},
    ...                                      {b"cmd": b'{"key_id": "k9"}'})]
    ["no 'cmd' field", 'not JSON', 'not a JSON object', 'unsigned command', 'unknown key id']
    >>> screen({b"cmd": b'{"schema_version": 1}'}, {"k1"}, True) is None
    True
    """
    raw = fields.get(b"cmd") if isinstance(fields, dict) else None
    if raw is None:
        return REASONS[0]
    try:
        obj = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return REASONS[1]
    if not isinstance(obj, dict):
        return REASONS[2]
    kid = obj.get("key_id")
    if isinstance(kid, str) and kid in key_ids:
        return None
    version = obj.get("schema_version")
    if accept_v1 and version == 1 and not isinstance(version, bool):
        return None
    return REASONS[3] if not kid else REASONS[4]


@dataclass
class JunkBatch:
    """The junk entries of one batch: ids to acknowledge, reasons tallied, the first few sampled."""

    ids: list[Any] = field(default_factory=list)
    reasons: Tally[str] = field(default_factory=Tally)
    samples: list[dict[str, str]] = field(default_factory=list)

    def add(self, entry_id: Any, fields: Any, reason: str) -> None:
        self.ids.append(entry_id)
        self.reasons[reason] += 1
        if len(self.samples) < SAMPLES:
            raw = fields.get(b"cmd") if isinstance(fields, dict) else fields
            self.samples.append({"entry_id": _text(entry_id), "reason": reason, "raw": echo(raw, SAMPLE_BYTES)})

    def record(self, zone: str, backend: str, now_ms: int) -> dict[str, Any]:
        """The summary record of this batch (see the module docstring)."""
        n = len(self.ids)
        return {
            "schema_version": 1,
            "record": RECORD,
            "outcome": "rejected",
            "reason": f"{n} entries without a valid key id refused in bulk",
            "zone": zone,
            "at_ms": now_ms,
            "backend": backend,
            "entry_id": _text(self.ids[0]),
            "count": n,
            "detail": {
                "reasons": dict(self.reasons),
                "first_entry_id": _text(self.ids[0]),
                "last_entry_id": _text(self.ids[-1]),
                "samples": self.samples,
            },
        }


def _text(entry_id: Any) -> str:
    return entry_id.decode("utf-8", "replace") if isinstance(entry_id, bytes) else str(entry_id)


class Intake:
    """Screens a zone's entries with :func:`screen`; counts and logs what it refuses."""

    def __init__(
        self, zone: str, key_ids: Collection[str], accept_v1: bool, registry: CollectorRegistry | None = None
    ) -> None:
        self.zone, self.key_ids, self.accept_v1 = zone, frozenset(key_ids), accept_v1
        self.refused = Counter(
            "governor_executor_entries_refused",
            "command stream entries without a valid key id, refused in bulk (no result each)",
            ("zone", "reason"),
            registry=registry or CollectorRegistry(),
        )

    def split(self, entries: list[tuple[Any, Any]]) -> tuple[list[tuple[Any, Any]], JunkBatch]:
        """``entries`` as (those that go on to the full checks, the junk batch)."""
        keep: list[tuple[Any, Any]] = []
        junk = JunkBatch()
        for entry_id, fields in entries:
            why = screen(fields, self.key_ids, self.accept_v1)
            if why is None:
                keep.append((entry_id, fields))
            else:
                junk.add(entry_id, fields, why)
        return keep, junk

    def count(self, junk: JunkBatch) -> None:
        """Count and log a refused batch (once acknowledged)."""
        for reason, n in junk.reasons.items():
            self.refused.labels(self.zone, reason).inc(n)
        log.warning(
            "executor %s: refused %d stream entries without a valid key id (%s), %s .. %s",
            self.zone,
            len(junk.ids),
            ", ".join(f"{r}: {n}" for r, n in sorted(junk.reasons.items())),
            _text(junk.ids[0]),
            _text(junk.ids[-1]),
            extra={"zone": self.zone, "refused": len(junk.ids)},
        )
