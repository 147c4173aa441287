"""The command ledger: every command issued, joined with its outcome in its zone.

The worker publishes each decision on ``<prefix>.commands`` (one record per
command, its ``command_id`` deterministic); the zone's executor reports what
became of it on ``<prefix>.results`` (``applied``, ``duplicate``, ``stale``,
``expired``, ``rejected``, ``failed``, ``advisory``; each with a reason).  At
least once everywhere means both topics may carry a record more than once:
the ledger joins them by ``(zone, command_id)`` and says whether the loop kept
its promises:

``lost``
    issued, and no outcome at all in its zone (after the caller has drained
    the topics: a command still in flight is not lost yet);
``applied_twice``
    more than one ``applied`` result for one command in one zone (a copy
    must come back ``duplicate``);
``regressions``
    an ``applied`` command older (``basis_ms``) than one already applied for
    the same (zone, kind, model): a stale decision took effect over a newer
    one;
``unexplained``
    a refusal (anything but ``applied`` / ``duplicate``) without a reason.

A result with no ``command_id`` (an entry that was not a command at all) is
counted as ``unparsed``; timing probes and relocation outcomes are not
command results and are skipped.  :meth:`Ledger.report` is plain data for a
benchmark or a test; :func:`read_ledger` fills a ledger from the topics.

>>> led = Ledger()
>>> led.issued({"command_id": "c1", "zone": "az-a", "kind": "scale", "model": "m", "basis_ms": 10})
>>> led.issued({"command_id": "c1", "zone": "az-a", "kind": "scale", "model": "m", "basis_ms": 10})  # redelivered
>>> led.result({"command_id": "c1", "zone": "az-a", "outcome": "applied", "reason": "", "basis_ms": 10})
>>> led.result({"command_id": "c1", "zone": "az-a", "outcome": "duplicate", "reason": "seen", "basis_ms": 10})
>>> led.issued({"command_id": "c2", "zone": "az-b", "kind": "scale", "model": "m", "basis_ms": 20})
>>> r = led.report()
>>> r["issued"], r["lost"], r["applied_twice"], r["outcomes"]
(2, ['az-b|c2'], [], {'applied': 1, 'duplicate': 1})
>>> r["ok"]
False
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["Ledger", "read_ledger"]

_ACCEPTED = ("applied", "duplicate")
_NOT_RESULTS = ("timing",)


@dataclass
class _Entry:
    kind: str = ""
    model: str = ""
    basis_ms: int = -1
    issued: int = 0
    outcomes: list[tuple[str, str]] = field(default_factory=list)


class Ledger:
    """Commands issued, joined with their outcomes (see the module docstring)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], _Entry] = {}
        self.unparsed: Counter[str] = Counter()
        self._applied_order: list[tuple[str, str, str, str, int]] = []  # zone, kind, model, id, basis

    def issued(self, cmd: Mapping[str, Any]) -> None:
        """One record of the commands topic (decoded JSON)."""
        key = (str(cmd.get("zone", "")), str(cmd.get("command_id", "")))
        e = self.entries.setdefault(key, _Entry())
        e.issued += 1
        e.kind, e.model = str(cmd.get("kind", "")), str(cmd.get("model", ""))
        basis = cmd.get("basis_ms")
        e.basis_ms = basis if isinstance(basis, int) else e.basis_ms

    def result(self, res: Mapping[str, Any]) -> None:
        """One record of the results topic (decoded JSON)."""
        if res.get("outcome") in _NOT_RESULTS or res.get("record") == "relocation_outcome":
            return
        cid = res.get("command_id")
        if not cid:
            self.unparsed[str(res.get("outcome", "?"))] += 1
            return
        key = (str(res.get("zone", "")), str(cid))
        e = self.entries.setdefault(key, _Entry())
        outcome, reason = str(res.get("outcome", "")), str(res.get("reason", ""))
        e.outcomes.append((outcome, reason))
        if outcome == "applied":
            basis = res.get("basis_ms")
            kind = str(res.get("kind", e.kind))
            model = str(res.get("model", e.model))
            self._applied_order.append((key[0], kind, model, key[1], basis if isinstance(basis, int) else -1))

    def feed(self, commands: Iterable[Mapping[str, Any]], results: Iterable[Mapping[str, Any]]) -> Ledger:
        for c in commands:
            self.issued(c)
        for r in results:
            self.result(r)
        return self

    def report(self) -> dict[str, Any]:
        """The join as plain data; ``ok`` is True when nothing was lost, doubled, regressed or unexplained."""
        issued = [k for k, e in self.entries.items() if e.issued]
        lost = sorted(f"{z}|{c}" for (z, c), e in self.entries.items() if e.issued and not e.outcomes)
        twice = sorted(
            f"{z}|{c}" for (z, c), e in self.entries.items() if sum(o == "applied" for o, _ in e.outcomes) > 1
        )
        unexplained = sorted(
            f"{z}|{c}:{o}"
            for (z, c), e in self.entries.items()
            for o, why in e.outcomes
            if o not in _ACCEPTED and not why
        )
        newest: dict[tuple[str, str, str], tuple[int, str]] = {}
        regressions = []
        for zone, kind, model, cid, basis in self._applied_order:
            last = newest.get((zone, kind, model))
            if last is not None and 0 <= basis < last[0]:
                regressions.append(f"{zone}|{cid} (basis {basis} after {last[1]} at {last[0]})")
            if last is None or basis > last[0]:
                newest[(zone, kind, model)] = (basis, cid)
        outcomes = Counter(o for e in self.entries.values() for o, _ in e.outcomes)
        reasons = Counter(
            f"{o}: {why.split(':', 1)[0][:60]}" for e in self.entries.values() for o, why in e.outcomes if why
        )
        return {
            "issued": len(issued),
            "issued_records": sum(e.issued for e in self.entries.values()),
            "with_outcome": sum(1 for k in issued if self.entries[k].outcomes),
            "results_without_issue": sorted(f"{z}|{c}" for (z, c), e in self.entries.items() if not e.issued),
            "lost": lost,
            "applied_twice": twice,
            "regressions": regressions,
            "unexplained": unexplained,
            "unparsed": dict(self.unparsed),
            "outcomes": dict(outcomes),
            "reasons": dict(reasons.most_common(20)),
            "ok": not (lost or twice or regressions or unexplained),
        }


async def read_ledger(
    bootstrap: str,
    commands_topic: str,
    results_topic: str,
    *,
    idle_s: float = 2.0,
    timeout_s: float = 60.0,
    **kafka: Any,
) -> Ledger:
    """Read both topics from the start until neither has had a new record for ``idle_s``; the ledger."""
    from aiokafka import AIOKafkaConsumer

    ledger = Ledger()
    consumer = AIOKafkaConsumer(
        commands_topic,
        results_topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        **kafka,
    )
    await consumer.start()
    try:
        start = last = time.monotonic()
        while time.monotonic() - last < idle_s and time.monotonic() - start < timeout_s:
            batch = await consumer.getmany(timeout_ms=200)
            for tp, msgs in batch.items():
                for m in msgs:
                    last = time.monotonic()
                    try:
                        rec = orjson.loads(m.value)
                    except orjson.JSONDecodeError:
                        ledger.unparsed["not JSON"] += 1
                        continue
                    if not isinstance(rec, dict):
                        ledger.unparsed["not an object"] += 1
                    elif tp.topic == commands_topic:
                        ledger.issued(rec)
                    else:
                        ledger.result(rec)
            await asyncio.sleep(0)
    finally:
        await consumer.stop()
    return ledger
