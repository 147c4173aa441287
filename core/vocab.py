"""Shared vocabularies and defaults of the control plane.

The telemetry vocabularies (statuses, GPU states, agent paths and signals)
belong to the wire contract and live in :mod:`governor_telemetry.vocab`; they
are re-exported here so the control plane has one place to import from.

>>> DEFAULT_PID_GAINS
{'kp': 0.0, 'ki': 0.0235, 'kd': 0.0, 'ki_down': 0.0105}
>>> COMMAND_KINDS[0]
'scale'
"""

from __future__ import annotations

import math

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
    "DEAD_LETTER_KINDS",
    "DEFAULT_COUPLING_WEIGHTS",
    "DEFAULT_DWELL_DELAYS",
    "dwell_in_windows",
    "DEFAULT_PID_GAINS",
    "GPU_STATES",
    "PID_GAIN_NAMES",
    "READY_STATES",
    "REQUEST_STATUSES",
    "STARTING_STATES",
    "default_pid_gains",
]

#: The scaling PID's default gains (docs/model.md, velocity PID): integral
#: action only, the velocity form's equivalent of a pure I controller;
#: ``ki_down`` acts while the error is below 0 (scale-down; tentative, pending the
#: certificate of issue 35), the absent ``kp_down`` / ``kd_down`` mean the up gains.
DEFAULT_PID_GAINS: dict[str, float] = {"kp": 0.0, "ki": 0.0235, "kd": 0.0, "ki_down": 0.0105}
# The dwell after a scale-up before a scale-down that each controller's shipped gains need for their
# certificate, in loop delays (start-up + window, the start-up measured): ``governor analyze gains --shipped``
# finds no common Lyapunov function of both modes over the measured plant-gain interval, so the switching is
# certified by a dwell, and the dwell it needs grows with the delay (pid: 11 windows at a 40 s delay, 34 at
# 130 s; fpid 46 at 40 s).  3 and 12 delays: pid 12 windows at 40 s, 39 at 130 s; fpid 48 at 40 s.
DEFAULT_DWELL_DELAYS: dict[str, float] = {"pid": 3.0, "fpid": 12.0}


def dwell_in_windows(loop_delays: float, loop_delay_s: float, window_s: float) -> int:
    """A dwell of ``loop_delays`` loop delays of ``loop_delay_s`` in whole windows (at least one): the one
    rounding the scaling law (at the measured start-up) and the certificate (at the delay it checks) share.

    >>> dwell_in_windows(3.0, 40.0, 10.0), dwell_in_windows(3.0, 130.0, 10.0)
    (12, 39)
    """
    return max(1, math.ceil(loop_delays * loop_delay_s / window_s - 1e-9))


#: Every name GOVERNOR_PID_GAINS may hold (a name outside it is refused, not
#: ignored): the PID's ``kp``, ``ki``, ``kd`` and ``deadband``, and the scale-down
#: gains ``kp_down``, ``ki_down``, ``kd_down`` (absent: the up gain); the fractional
#: PID's ``alpha``, ``eta``, ``gamma``, ``beta`` and ``memory``; the
#: feedforward's ``ff_target_util`` (1 / headroom), ``ff_error_margin`` and
#: ``ff_decay_per_step`` (the names ``governor tune`` writes) and ``ff_lift_z``
#: (the sd of counting noise a lift must clear, controllers.feedforward.lifts).
PID_GAIN_NAMES = (
    "kp",
    "ki",
    "kd",
    "kp_down",
    "ki_down",
    "kd_down",
    "deadband",
    "alpha",
    "eta",
    "gamma",
    "beta",
    "memory",
    "ff_target_util",
    "ff_error_margin",
    "ff_decay_per_step",
    "ff_lift_z",
)

#: Weights of the coupling of two nodes (docs/model.md (coupling), design source
#: §2.3): ``path / (1 + shortest path) + cosine * cosine(embeddings)``; they sum to 1.
DEFAULT_COUPLING_WEIGHTS: dict[str, float] = {"path": 0.6, "cosine": 0.4}

#: Every command kind the worker publishes and executors accept.
COMMAND_KINDS = ("scale", "route", "breaker", "canary", "relocate", "agents")

#: Why something went to the dead-letter topic: the ``kind`` of a dead letter
#: and the only values of the ``reason`` label of ``governor_deadletter_total``
#: (a fixed set: the detail, which may carry the bad value, stays in the dead
#: letter's ``reason`` text).  Ingest: a message that is no envelope, a record
#: that fails validation, a model not in GOVERNOR_MODELS, a zone not in
#: GOVERNOR_ZONES, a window already closed, a timestamp beyond
#: GOVERNOR_MAX_FUTURE_S ahead of the clock, a window already holding
#: GOVERNOR_MAX_NODES_PER_WINDOW nodes.  Control: a metrics record that is no
#: window or whose MAC does not hold.  Bridge: a command that does not decode
#: or whose signature does not hold.
DEAD_LETTER_KINDS = (
    "bad envelope",
    "invalid record",
    "unknown model",
    "unknown zone",
    "late",
    "future",
    "too many nodes",
    "bad metrics record",
    "unauthenticated window record",
    "bad command",
    "unauthenticated command",
)


def default_pid_gains() -> dict[str, float]:
    """A fresh copy of :data:`DEFAULT_PID_GAINS` (for dataclass default factories)."""
    return dict(DEFAULT_PID_GAINS)
