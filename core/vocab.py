"""Shared vocabularies and defaults of the control plane.

The telemetry vocabularies (statuses, GPU states, agent paths and signals)
belong to the wire contract and live in :mod:`governor_telemetry.vocab`; they
are re-exported here so the control plane has one place to import from.

>>> DEFAULT_PID_GAINS
{'kp': 0.0, 'ki': 0.05, 'kd': 0.0}
>>> COMMAND_KINDS[0]
'scale'
"""

from __future__ import annotations

from governor_telemetry.vocab import (
    AGENT_PATHS,
    AGENT_SIGNALS,
    GPU_STATES,
    READY_STATES,
    REQUEST_STATUSES,
    STARTING_STATES,
)

__all__ = [
    "AGENT_PATHS",
    "AGENT_SIGNALS",
    "COMMAND_KINDS",
    "DEFAULT_PID_GAINS",
    "GPU_STATES",
    "READY_STATES",
    "REQUEST_STATUSES",
    "STARTING_STATES",
    "default_pid_gains",
]

#: The scaling PID's default gains (docs/model.md, velocity PID): integral
#: action only, the velocity form's equivalent of a pure I controller.
DEFAULT_PID_GAINS: dict[str, float] = {"kp": 0.0, "ki": 0.05, "kd": 0.0}

#: Every command kind the worker publishes and executors accept.
COMMAND_KINDS = ("scale", "route", "breaker", "canary", "relocate", "agents")


def default_pid_gains() -> dict[str, float]:
    """A fresh copy of :data:`DEFAULT_PID_GAINS` (for dataclass default factories)."""
    return dict(DEFAULT_PID_GAINS)
