"""Request dispatch among the replicas of one (zone, model): least outstanding, or prefix-aware.

``least-outstanding`` sends a request to the replica with the fewest
outstanding tokens (ties: the first in order).  ``prefix-aware`` is the
cache-aware policy of the SGLang / vLLM router (``--policy cache_aware``),
with the same three thresholds:

1. *Balance bound.*  With ``loads`` the requests in flight per replica, the
   fleet is *imbalanced* when ``max - min > balance_abs_threshold`` **and**
   ``max > balance_rel_threshold * min``; then the request goes to the least
   outstanding replica, whatever it has cached.
2. *Prefix.*  Otherwise the replica whose cache holds the longest leading run
   of the request's prefix blocks wins if that run is more than
   ``cache_threshold`` of the request's blocks (ties: the least outstanding
   of them).
3. Else least outstanding (the router picks the worker with the smallest
   prefix tree, i.e. the most free cache; governor's simulator has no tree
   size, and least outstanding is the policy it replaces).

The overlap counted is the *leading* run of blocks a replica's prefix cache
would skip in prefill: what a hit saves.  The coupling graph's MinHash
(:mod:`controllers.coupling`) estimates set overlap between two replicas'
resident blocks for session moves; a request needs its own prefix, exactly,
which a router (radix tree) or the simulator (each replica's LRU of blocks)
knows.

Examples
--------
>>> p = DispatchParams(policy="prefix-aware", cache_threshold=0.3, balance_abs_threshold=4)
>>> pick([900, 100], [3, 1], [5, 0], 8, p)        # balanced: 5 of 8 blocks cached on replica 0
0
>>> pick([900, 100], [9, 1], [5, 0], 8, p)        # imbalanced (9 - 1 > 4, 9 > 1.5): least outstanding
1
>>> pick([900, 100], [3, 1], [2, 0], 8, p)        # 2 / 8 = 0.25 is under the cache threshold
1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controllers.errors import ParameterError, check_number

__all__ = ["POLICIES", "DispatchParams", "pick"]

POLICIES = ("least-outstanding", "prefix-aware")


@dataclass(frozen=True)
class DispatchParams:
    """The dispatch policy and its thresholds (validated).

    The thresholds are the vLLM router's (``--cache-threshold``,
    ``--balance-abs-threshold``, ``--balance-rel-threshold``; its defaults
    0.3, 64 and 1.5).  The simulator's default absolute bound is 8 requests:
    a simulated replica runs at most ``max_batch`` (64) at once, so 64 would
    never trigger.

    >>> DispatchParams(policy="round-robin")
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: policy='round-robin': one of least-outstanding, prefix-aware
    """

    policy: str = "least-outstanding"
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 8
    balance_rel_threshold: float = 1.5

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ParameterError(f"policy={self.policy!r}: one of {', '.join(POLICIES)}")
        if not 0.0 <= check_number("cache_threshold", self.cache_threshold) <= 1.0:
            raise ParameterError(f"cache_threshold={self.cache_threshold}: must lie in [0, 1]")
        abs_t = self.balance_abs_threshold
        if isinstance(abs_t, bool) or not isinstance(abs_t, int) or abs_t < 0:
            raise ParameterError(f"balance_abs_threshold={abs_t!r}: must be an int >= 0")
        if check_number("balance_rel_threshold", self.balance_rel_threshold) < 1.0:
            raise ParameterError(f"balance_rel_threshold={self.balance_rel_threshold}: must be >= 1")


def _least(outstanding: Sequence[float], among: Sequence[int]) -> int:
    return min(among, key=lambda i: (outstanding[i], i))


def pick(
    outstanding: Sequence[float],
    in_flight: Sequence[int],
    matched_blocks: Sequence[int],
    request_blocks: int,
    params: DispatchParams,
) -> int:
    """The index of the replica a request goes to (pure; see the module docstring).

    Parameters
    ----------
    outstanding : sequence of float
        Outstanding tokens per replica (the least-outstanding key).
    in_flight : sequence of int
        Requests queued or running per replica (the balance bound's load).
    matched_blocks : sequence of int
        Leading prefix blocks of the request each replica has cached.
    request_blocks : int
        The request's prefix blocks (0: no prefix; least outstanding).
    params : DispatchParams
    """
    n = len(outstanding)
    if n == 0 or len(in_flight) != n or len(matched_blocks) != n:
        raise ValueError(f"outstanding/in_flight/matched_blocks: need equal, non-empty lengths, got {n}")
    everyone = range(n)
    if params.policy == "least-outstanding" or request_blocks <= 0 or n == 1:
        return _least(outstanding, everyone)
    hi, lo = max(in_flight), min(in_flight)
    if hi - lo > params.balance_abs_threshold and hi > params.balance_rel_threshold * lo:
        return _least(outstanding, everyone)
    best = max(matched_blocks)
    if best <= 0 or best / request_blocks <= params.cache_threshold:
        return _least(outstanding, everyone)
    return _least(outstanding, [i for i in everyone if matched_blocks[i] == best])
