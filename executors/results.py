"""Result records of a zone executor and their publication to the results topic.

:func:`result_record` builds the record of one outcome (see
:class:`executors.executor.ZoneExecutor`); :class:`ResultPublisher` sends it,
capped by :func:`executors.entry.encode_result`, to ``<prefix>.results``
(key = zone).  While the topic is unavailable it retries with capped backoff
(0.1 s doubling to 5 s), holding the caller; a record the broker refuses as
too large (``MessageSizeTooLargeError``) is permanent: logged, counted on
``governor_executor_results_dropped_total{zone, reason="too large"}`` and
given up, so the entry is still acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError
from prometheus_client import CollectorRegistry, Counter

from executors.entry import encode_result
from loop.commands import Command

log = logging.getLogger(__name__)


@dataclass
class ExecutorStats:
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str, n: int = 1) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n


def result_record(
    *,
    zone: str,
    backend: str,
    entry_id: Any,
    cmd: Command | None,
    outcome: str,
    reason: str,
    now: int,
    detail: dict[str, Any] | None,
    executor_hlc: int,
) -> dict[str, Any]:
    """The results-topic record of one outcome (command fields only when it decoded)."""
    result: dict[str, Any] = {
        "schema_version": 1,
        "zone": zone,
        "outcome": outcome,
        "reason": reason,
        "at_ms": now,
        "backend": backend,
        "detail": detail or {},
        "entry_id": entry_id.decode("utf-8", "replace") if isinstance(entry_id, bytes) else str(entry_id),
    }
    if cmd is not None:
        result.update(
            command_id=cmd.command_id,
            model=cmd.model,
            kind=cmd.kind,
            target_replicas=cmd.target_replicas,  # None for every kind but scale (schema v2)
            issued_at_ms=cmd.issued_at_ms,
            basis_ms=cmd.basis_ms,
            latency_ms=now - cmd.issued_at_ms,
            hlc=cmd.hlc,
            executor_hlc=executor_hlc,
        )
    return result


class ResultPublisher:
    """Publishes result records of one zone (see the module docstring)."""

    def __init__(self, producer: Any, topic: str, zone: str, registry: CollectorRegistry | None = None) -> None:
        self.producer, self.topic, self.zone = producer, topic, zone
        self.dropped = Counter(
            "governor_executor_results_dropped",
            "results never published (refused by the broker as too large)",
            ("zone", "reason"),
            registry=registry or CollectorRegistry(),
        )

    async def publish(self, result: dict[str, Any]) -> bool:
        """Send ``result``; True once acknowledged, False when dropped as too large."""
        value = encode_result(result)
        delay = 0.1
        while True:
            try:
                await self.producer.send_and_wait(self.topic, value, key=self.zone.encode())
                return True
            except MessageSizeTooLargeError as exc:
                self.dropped.labels(self.zone, "too large").inc()
                log.error(
                    "executor %s: result of %d bytes refused as too large (%s); dropped", self.zone, len(value), exc
                )
                return False
            except Exception as exc:  # noqa: BLE001 - Kafka trouble is temporary: back off
                log.warning("executor %s: results topic unavailable (%s); retry in %.1f s", self.zone, exc, delay)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
