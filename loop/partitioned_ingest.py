"""Telemetry windows per Kafka partition: one watermark per partition, dropped on a rebalance.

A worker that shares the telemetry topic with other workers gains partitions
in a rebalance whose records are older than the ones it is reading live: the
partitions of a SIGKILLed worker are re-read from their committed offsets,
seconds behind.  One watermark over every partition would be moved by the live
partitions and make the whole backlog *late* (dead-lettered, windows short).
:class:`PartitionedIngest` keeps one :class:`~loop.pipeline.TelemetryProcessor`
per partition -- its own watermark, its own window clock, created when the
partition's first message arrives (so it never closes windows by the clock
before it has read anything) -- and a (model, zone) never spans two of them:
telemetry is keyed ``model|zone``.

On a rebalance every partition is re-read from its committed offset, and a
telemetry message is acknowledged only once its windows closed, so
:meth:`PartitionedIngest.reset` drops every open window: its records come again
to whichever worker holds their partition now.

A partition still behind its high-water mark (a backlog being re-read) closes
windows by event time only, never by the clock: "caught up" by the clock alone
(the watermark within window + lateness of it) would close a window while the
rest of its records are still on the way, and dead-letter them as late.

Without ``partitioned`` (the fast simulator, the unit tests) one processor takes
every message, as before.

>>> from core.settings import ModelSpec, Settings
>>> ing = PartitionedIngest(Settings(models=(ModelSpec("m"),), zones=("az-a",)), partitioned=True)
>>> ing.get(5) is None, ing.of(3) is ing.of(3), ing.of(3) is ing.of(4), ing.of(None) is ing.default
(True, True, False, True)
>>> _ = ing.of(3, offset=41); ing.read_to
{3: 42}
>>> ing.reset(), sorted(ing.by_partition), ing.read_to
(0, [], {})
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.settings import Settings
from loop.pipeline import TelemetryProcessor

__all__ = ["PartitionedIngest"]


class PartitionedIngest:
    """The telemetry processors of a worker, one per partition when ``partitioned`` (see the module docstring)."""

    def __init__(self, settings: Settings, partitioned: bool = False) -> None:
        self.settings = settings
        self.partitioned = partitioned
        self.default = TelemetryProcessor(settings)
        self.by_partition: dict[int, TelemetryProcessor] = {}
        self.read_to: dict[int, int] = {}  # partition -> the offset after the last message taken

    def of(self, partition: Any, offset: Any = None) -> TelemetryProcessor:
        """The processor of ``partition`` (the default one when not partitioned or no partition is known);
        ``offset``: the message's, taken now."""
        proc = self.get(partition)
        if proc is not self.default and isinstance(offset, int):
            self.read_to[partition] = offset + 1
        if proc is None:
            proc = self.by_partition[partition] = TelemetryProcessor(self.settings)
        return proc

    def get(self, partition: Any) -> TelemetryProcessor | None:
        """As :meth:`of`, but None for a partition no message has come from since the last :meth:`reset`."""
        if not self.partitioned or not isinstance(partition, int) or isinstance(partition, bool):
            return self.default
        return self.by_partition.get(partition)

    def all(self) -> list[TelemetryProcessor]:
        return [self.default, *self.by_partition.values()]

    def drain_dead_letters(self) -> list[dict[str, Any]]:
        """The node cap's dead letters of the windows closed since the last call, one a window, to publish."""
        return [dl for proc in self.all() for dl in proc.drain_dead_letters()]

    @property
    def open_windows(self) -> int:
        return sum(p.open_windows for p in self.all())

    def close_due(self, now_ms: int, highwater: Callable[[int], int | None] | None = None) -> list[dict[str, Any]]:
        """Every processor's windows due at ``now_ms`` (each by its own watermark and clock rule); by
        event time only for a partition whose ``highwater`` (the offset after its last message) is ahead."""
        out = self.default.close_due(now_ms, now_ms)
        for part, proc in self.by_partition.items():
            hw = None if highwater is None else highwater(part)
            behind = hw is not None and part in self.read_to and hw > self.read_to[part]
            out += proc.close_due(None if behind else now_ms, now_ms)
        return out

    def reset(self) -> int:
        """Drop every open window (fresh processors); how many (model, zone, node) windows were open."""
        dropped = self.open_windows
        self.default = TelemetryProcessor(self.settings)
        self.by_partition, self.read_to = {}, {}
        return dropped
