"""Which violations a replica count can fix (docs/model.md §23).

A request that finished ``ok`` but whose time to first token without its
wait is over its TTFT limit would have missed on an idle fleet: its prefill
alone is too long.  Windows count those (``unfixable_rate``,
:mod:`controllers.windows`); the scaler's feedback acts on the rest
(:func:`fixable_violation_rate`), with the unfixable share capped at the
key's running share of it (:func:`running_unfixable`) plus its noise.
"""

from __future__ import annotations

import math

from controllers.window_record import WindowRecord

__all__ = ["UNFIXABLE_SLACK", "UNFIXABLE_WEIGHT", "fixable_violation_rate", "running_unfixable"]

UNFIXABLE_SLACK = 0.005  # beyond the running share and its noise, an unfixable share counts as fixable
UNFIXABLE_WEIGHT = 0.05  # the running share's EWMA weight per window (a running mean over the first 20)


def fixable_violation_rate(w: WindowRecord, base: float | None = None) -> float:
    """The violation rate of the requests the fleet could have served in time (docs/model.md §23).

    A window's ``unfixable_rate`` counts requests over their TTFT limit even
    without their wait (their prefill alone is too long): no replica count
    fixes them, so they leave both the violations and the population.  That
    share is a property of the workload's prompts and moves slowly; with the
    key's running ``base`` of it, a window's share beyond ``base`` plus its
    binomial noise counts as fixable: replicas slowed by something else (a
    latency spike, a bad node) also make TTFT without the wait long, and more
    or other replicas do fix those.

    >>> w = WindowRecord(scope="zone", model="m", zone="z", window_end_ms=10_000, count=100,
    ...                  violation_rate=0.05, unfixable_rate=0.04)
    >>> round(fixable_violation_rate(w), 4)  # 1 of the 96 servable requests
    0.0104
    >>> round(fixable_violation_rate(w, base=0.0), 4)  # none expected: only 0.5 % of them is let off
    0.0452
    >>> fixable_violation_rate(WindowRecord(scope="zone", model="m", zone="z", window_end_ms=1, violation_rate=0.03))
    0.03
    """
    u = min(w.unfixable_rate, w.violation_rate)
    if base is not None:
        u = min(u, base + UNFIXABLE_SLACK + 2.0 * math.sqrt(base * (1.0 - base) / max(w.count, 1)))
    if u <= 0.0:
        return w.violation_rate
    return max(0.0, w.violation_rate - u) / (1.0 - u) if u < 1.0 else 0.0


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
