"""Which violations a replica count can fix (docs/model.md §23).

A request that finished ``ok`` but whose time to first token without its
wait is over its TTFT limit would have missed on an idle fleet: its prefill
alone is too long.  Windows count those (``unfixable_rate``,
:mod:`controllers.windows`); the scaler's feedback acts on the rest
(:func:`fixable_violation_rate`), with the unfixable share capped at the
key's running share of it (:func:`running_unfixable`) plus its noise --
except the share a slow stage before the replica explains
(``stage_unfixable_rate``: the network and preprocess time, which no replica
count shortens), never capped.
"""

from __future__ import annotations

import math
from dataclasses import replace

from controllers.window_record import WindowRecord

__all__ = [
    "BACKLOG_PER_REPLICA",
    "BACKLOG_WINDOWS",
    "DRAINED_PER_REPLICA",
    "UNFIXABLE_SLACK",
    "UNFIXABLE_WEIGHT",
    "fixable_violation_rate",
    "running_unfixable",
    "slow_stage_held",
    "stale_after_drain",
]

UNFIXABLE_SLACK = 0.005  # beyond the running share and its noise, an unfixable share counts as fixable
UNFIXABLE_WEIGHT = 0.05  # the running share's EWMA weight per window (a running mean over the first 20)
BACKLOG_PER_REPLICA = 1.0  # a backlog: at least one request waiting per ready replica (window mean) ...
BACKLOG_WINDOWS = 3  # ... within this many windows before the current one
DRAINED_PER_REPLICA = 0.05  # drained: at most this many waiting per ready replica now


def fixable_violation_rate(w: WindowRecord, base: float | None = None) -> float:
    """The violation rate of the requests the fleet could have served in time (docs/model.md §23).

    A window's ``unfixable_rate`` counts requests over their TTFT limit even
    without their wait (their prefill alone is too long): no replica count
    fixes them, so they leave both the violations and the population.  That
    share is a property of the workload's prompts and moves slowly; with the
    key's running ``base`` of it, a window's share beyond ``base`` plus its
    binomial noise counts as fixable: replicas slowed by something else (a
    latency spike, a bad node) also make TTFT without the wait long, and more
    or other replicas do fix those.  The part of that share a slow stage
    explains (``stage_unfixable_rate``: those requests would meet the limit
    without their network and preprocess time) is never capped: a slow network
    or a slow preprocessor is not queueing, and no replica count shortens it.

    >>> w = WindowRecord(scope="zone", model="m", zone="z", window_end_ms=10_000, count=100,
    ...                  violation_rate=0.05, unfixable_rate=0.04)
    >>> round(fixable_violation_rate(w), 4)  # 1 of the 96 servable requests
    0.0104
    >>> round(fixable_violation_rate(w, base=0.0), 4)  # none expected: only 0.5 % of them is let off
    0.0452
    >>> fixable_violation_rate(WindowRecord(scope="zone", model="m", zone="z", window_end_ms=1, violation_rate=0.03))
    0.03
    >>> slow = WindowRecord(scope="zone", model="m", zone="z", window_end_ms=10_000, count=100,
    ...                     violation_rate=0.05, unfixable_rate=0.04, stage_unfixable_rate=0.04)
    >>> round(fixable_violation_rate(slow, base=0.0), 4)  # the network explains them: all let off
    0.0104
    """
    total = min(w.unfixable_rate, w.violation_rate)
    stage = min(w.stage_unfixable_rate, total)
    u = total - stage
    if base is not None:
        u = min(u, base + UNFIXABLE_SLACK + 2.0 * math.sqrt(base * (1.0 - base) / max(w.count, 1)))
    u += stage
    if u <= 0.0:
        return w.violation_rate
    return max(0.0, w.violation_rate - u) / (1.0 - u) if u < 1.0 else 0.0


def slow_stage_held(w: WindowRecord, base: float | None, eps_ref: float) -> bool:
    """Whether the stages before the replica alone keep a window's violations from scaling the fleet up.

    True when the fixable rate with the stage share let off is within ``eps_ref``
    and it would not be without (``stage_unfixable_rate`` counted as any unfixable share).

    >>> slow = WindowRecord(scope="zone", model="m", zone="z", window_end_ms=10_000, count=100,
    ...                     violation_rate=0.3, unfixable_rate=0.29, stage_unfixable_rate=0.29)
    >>> slow_stage_held(slow, 0.0, 0.02), slow_stage_held(slow, None, 0.02)
    (True, False)
    """
    if w.stage_unfixable_rate <= 0.0:
        return False
    plain = replace(w, stage_unfixable_rate=0.0)
    return fixable_violation_rate(w, base) <= eps_ref < fixable_violation_rate(plain, base)


def running_unfixable(base: float | None, n: int, rate: float) -> tuple[float, int]:
    """The key's running unfixable share after one more window with requests, and the windows counted.

    A running mean over the first ``1 / UNFIXABLE_WEIGHT`` windows, then an
    EWMA of that weight.

    >>> running_unfixable(None, 0, 0.04)
    (0.04, 1)
    >>> base, n = running_unfixable(0.04, 1, 0.0)
    >>> round(base, 3), n
    (0.02, 2)
    """
    n += 1
    start = rate if base is None else base
    return start + max(UNFIXABLE_WEIGHT, 1.0 / n) * (rate - start), n


def stale_after_drain(
    backlog_history: tuple[float, ...], queued: float, ready: int, arrival_rps: float, serving_rps: float
) -> bool:
    """Whether a window's violations are the wake of a backlog that has drained (docs/model.md §23).

    Violations are counted when requests finish: after a burst the requests
    that waited in its queue keep finishing late for a window or two after
    the queue is gone and the fleet has caught up.  Acting on them adds
    replicas for a cause that no longer exists (on the Azure trace's 3600 s
    burst run the fleet peaked at 18-34 replicas a zone after each burst,
    against 10-14 during it).  They are stale when a backlog (at least
    :data:`BACKLOG_PER_REPLICA` waiting per ready replica) was seen in the
    last :data:`BACKLOG_WINDOWS` windows (``backlog_history``: waiting per
    ready replica, oldest first), the queue has drained (at most
    :data:`DRAINED_PER_REPLICA` per replica) and the ready fleet serves the
    arrivals at its planned utilisation (``serving_rps``).  Without a backlog
    before, violations with an empty queue (slow batches, long prompts) are
    never stale.

    >>> stale_after_drain((0.0, 4.2, 2.5), 0.1, 12, 9.0, 29.8)  # the burst's queue is gone
    True
    >>> stale_after_drain((0.0, 0.1, 0.0), 0.1, 12, 9.0, 29.8)  # no backlog before: violations are current
    False
    >>> stale_after_drain((0.0, 4.2, 2.5), 30.0, 12, 9.0, 29.8)  # still waiting
    False
    >>> stale_after_drain((0.0, 4.2, 2.5), 0.1, 12, 31.0, 29.8)  # the fleet does not keep up
    False
    """
    if ready <= 0 or not backlog_history:
        return False
    return (
        max(backlog_history[-BACKLOG_WINDOWS:]) >= BACKLOG_PER_REPLICA
        and queued / ready <= DRAINED_PER_REPLICA
        and arrival_rps <= serving_rps
    )
