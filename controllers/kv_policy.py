"""KV-cache relocation policy (docs/model.md §16 (kv)): when to compact, how much, when to move.

Pure: a frozen :class:`KvPolicyParams`, an explicit :class:`KvPolicyState`
and :func:`step` from one replica's allocator telemetry (:class:`KvObs`) to a
:class:`KvDecision` that the caller issues as a relocation command.

Definitions (the design source leaves them loose; these are the ones used):

- *fragmentation ratio* ``f = 1 - largest_free / free`` (0: all free memory
  is one hole). *Compactness* is ``1 - f = largest_free / free``.
- *Trigger*: requests wait and ``largest_free < trigger_factor *
  waiting_kv_bytes`` (design source: 1.8 x the KV bytes the waiting request needs).
- *Target*: compact until compactness ``>= compact_ratio`` (0.92), i.e.
  ``f <= 1 - compact_ratio`` (``target_fragmentation`` = 0.08).
- An *episode* starts at a trigger and ends when the target is met
  (``converged``) or after ``max_rounds`` compaction rounds (not converged);
  each round moves at most ``max_bytes_per_round`` (bounded work).
- *Can compaction help?* An episode starts only when ``free >=
  trigger_factor * waiting`` (one hole could hold the waiting request with
  the design source's headroom), or, with ``compact_when_blocked``, when the waiting
  request is blocked by fragmentation alone: ``largest_free < waiting <=
  free`` (it fits once the free memory is one hole; a paged allocator would
  admit it now; compacting is then preferred to a move: it is local and
  takes milliseconds). Off by default (the design source's reading); ``governor
  bench kv`` turns it on.
- *Budget*: ``max_bytes_per_round``; :meth:`KvPolicyParams.for_pause` derives
  it from a pause bound (bytes = pause x copy bandwidth).
- *Move* instead of compacting: when compaction cannot make the room
  (neither condition above holds, or the episode ran out of rounds
  with the trigger still on) and a peer has a hole of at least
  ``trigger_factor * waiting`` (``peer_largest_free_bytes``), the decision is
  ``'move'``: send the waiting sessions there (the fleet prefers the peer
  holding their prefix blocks). Otherwise ``'none'`` with the reason.

The decision carries ``expected_generation`` (the observation's allocator
generation): the executor refuses the command if the node changed since.

Examples
--------
>>> p = KvPolicyParams(max_bytes_per_round=1 << 30)
>>> obs = KvObs(largest_free_block_bytes=100, free_bytes=1000, waiting_kv_bytes=200,
...             fragmentation_ratio=0.9, generation=7)
>>> st, d = step(p, KvPolicyState(), obs)
>>> d.action, d.round, d.bytes_budget, d.expected_generation, round(d.target_fragmentation, 2)
('compact', 1, 1073741824, 7, 0.08)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from controllers.errors import ParameterError, check_number

__all__ = ["KvDecision", "KvObs", "KvPolicyParams", "KvPolicyState", "step"]


@dataclass(frozen=True)
class KvPolicyParams:
    """Trigger, target and work bounds (validated).

    Examples
    --------
    >>> KvPolicyParams(max_bytes_per_round=1).trigger_factor
    1.8
    >>> KvPolicyParams(compact_ratio=1.5, max_bytes_per_round=1)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: compact_ratio=1.5: must lie in (0, 1]
    """

    trigger_factor: float = 1.8
    compact_ratio: float = 0.92
    max_bytes_per_round: int = 8 << 30
    max_rounds: int = 3
    allow_move: bool = True
    compact_when_blocked: bool = False

    def __post_init__(self) -> None:
        check_number("trigger_factor", self.trigger_factor, 1.0)
        if not 0.0 < check_number("compact_ratio", self.compact_ratio, 0.0) <= 1.0:
            raise ParameterError(f"compact_ratio={self.compact_ratio}: must lie in (0, 1]")
        for name in ("max_bytes_per_round", "max_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParameterError(f"{name}={value!r}: must be an int >= 1")
        for name in ("allow_move", "compact_when_blocked"):
            if not isinstance(getattr(self, name), bool):
                raise ParameterError(f"{name}={getattr(self, name)!r}: must be a bool")

    @classmethod
    def for_pause(cls, max_pause_s: float, copy_bandwidth_bytes_s: float, **kw: Any) -> KvPolicyParams:
        """Params whose per-round byte budget is what the copy engine moves in ``max_pause_s``.

        The pause a round causes is ``bytes / copy_bandwidth_bytes_s`` (plus a
        per-region overhead), so bounding the bytes bounds the pause.

        Examples
        --------
        >>> KvPolicyParams.for_pause(0.010, 6e12).max_bytes_per_round  # 10 ms at 6 TB/s
        60000000000
        """
        budget = check_number("max_pause_s", max_pause_s, 0.0, strict=True) * check_number(
            "copy_bandwidth_bytes_s", copy_bandwidth_bytes_s, 0.0, strict=True
        )
        return cls(max_bytes_per_round=max(1, int(budget)), **kw)

    @property
    def target_fragmentation(self) -> float:
        """``1 - compact_ratio``: the fragmentation ratio an episode compacts down to."""
        return 1.0 - self.compact_ratio


@dataclass(frozen=True)
class KvObs:
    """One replica's allocator telemetry (the GPU record's KV fields)."""

    largest_free_block_bytes: int
    free_bytes: int
    waiting_kv_bytes: int
    fragmentation_ratio: float
    generation: int
    peer_largest_free_bytes: int = 0

    def __post_init__(self) -> None:
        for name in (
            "largest_free_block_bytes",
            "free_bytes",
            "waiting_kv_bytes",
            "generation",
            "peer_largest_free_bytes",
        ):
            check_number(name, getattr(self, name), 0.0)
        if not 0.0 <= check_number("fragmentation_ratio", self.fragmentation_ratio, 0.0) <= 1.0:
            raise ParameterError(f"fragmentation_ratio={self.fragmentation_ratio}: must lie in [0, 1]")
        if self.largest_free_block_bytes > self.free_bytes:
            raise ParameterError(
                f"largest_free_block_bytes={self.largest_free_block_bytes}: exceeds free_bytes={self.free_bytes}"
            )


@dataclass(frozen=True)
class KvPolicyState:
    """Episode and convergence counters (JSON via to_dict/from_dict).

    Examples
    --------
    >>> s = KvPolicyState(in_episode=True, rounds=2, episodes=1)
    >>> KvPolicyState.from_dict(s.to_dict()) == s
    True
    """

    in_episode: bool = False
    rounds: int = 0
    episodes: int = 0
    converged_episodes: int = 0
    rounds_to_converge_total: int = 0
    frag_at_trigger: float = 0.0

    def __post_init__(self) -> None:
        for name in ("rounds", "episodes", "converged_episodes", "rounds_to_converge_total"):
            if getattr(self, name) < 0:
                raise ParameterError(f"{name}={getattr(self, name)}: must be >= 0")

    @property
    def mean_rounds_to_converge(self) -> float:
        """Mean rounds of the converged episodes (0 when none)."""
        n = self.converged_episodes
        return self.rounds_to_converge_total / n if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KvPolicyState:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


@dataclass(frozen=True)
class KvDecision:
    """What to do on this replica now."""

    action: str  # 'none' | 'compact' | 'move'
    target_fragmentation: float
    bytes_budget: int
    round: int
    converged: bool
    reason: str
    expected_generation: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return asdict(self)


def step(params: KvPolicyParams, state: KvPolicyState, obs: KvObs) -> tuple[KvPolicyState, KvDecision]:
    """One policy period for one replica (pure).

    Returns the new state and the decision; ``round`` is the compaction
    round this decision starts (0 when none), ``converged`` is True on the
    step that closes an episode at the target.

    Examples
    --------
    >>> p = KvPolicyParams(max_bytes_per_round=100)
    >>> st = KvPolicyState(in_episode=True, rounds=2, episodes=1, frag_at_trigger=0.6)
    >>> st, d = step(p, st, KvObs(900, 950, 200, 1 - 900 / 950, 9))
    >>> d.action, d.converged, d.reason, st.converged_episodes, st.mean_rounds_to_converge
    ('none', True, 'converged', 1, 2.0)
    """
    target = params.target_fragmentation
    need = params.trigger_factor * obs.waiting_kv_bytes
    triggered = obs.waiting_kv_bytes > 0 and obs.largest_free_block_bytes < need
    at_target = obs.fragmentation_ratio <= target + 1e-12

    def decide(action: str, reason: str, rnd: int = 0, converged: bool = False) -> KvDecision:
        budget = params.max_bytes_per_round if action == "compact" else 0
        return KvDecision(action, target, budget, rnd, converged, reason, int(obs.generation))

    def no_room(st: KvPolicyState, reason: str, conv: bool = False) -> tuple[KvPolicyState, KvDecision]:
        if params.allow_move and triggered and obs.peer_largest_free_bytes >= need:
            return st, decide("move", f"{reason}; a peer has room", 0, conv)
        return st, decide("none", f"{reason}; scale out" if triggered else reason, 0, conv)

    if state.in_episode:
        if at_target:
            done = replace(
                state,
                in_episode=False,
                rounds=0,
                converged_episodes=state.converged_episodes + 1,
                rounds_to_converge_total=state.rounds_to_converge_total + state.rounds,
            )
            return no_room(done, "converged", True)
        if state.rounds >= params.max_rounds:
            return no_room(replace(state, in_episode=False, rounds=0), "not converged in max_rounds")
        nxt = replace(state, rounds=state.rounds + 1)
        return nxt, decide("compact", "compacting towards target", nxt.rounds)
    if not triggered:
        return state, decide("none", "no waiting request blocked by fragmentation")
    blocked = params.compact_when_blocked and obs.largest_free_block_bytes < obs.waiting_kv_bytes <= obs.free_bytes
    if (obs.free_bytes < need and not blocked) or at_target:
        return no_room(state, "too little free memory for compaction to help")
    nxt = replace(
        state, in_episode=True, rounds=1, episodes=state.episodes + 1, frag_at_trigger=float(obs.fragmentation_ratio)
    )
    return nxt, decide("compact", "largest free block < trigger_factor x waiting KV", 1)
