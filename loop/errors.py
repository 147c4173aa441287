"""The loop's own error types (no I/O: the drivers raise them, the worker and the simulator catch them)."""

from __future__ import annotations

__all__ = ["SnapshotVersionError"]


class SnapshotVersionError(ValueError):
    """A driver's snapshot data is of a version (or controller) this code does not read."""
