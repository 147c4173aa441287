"""KV relocation policy: trigger, bounded rounds, convergence tracking, move fallback."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers.errors import ParameterError
from controllers.kv_policy import KvDecision, KvObs, KvPolicyParams, KvPolicyState, step
from sim.kvalloc import ContiguousKvAllocator

pytestmark = pytest.mark.timeout(60)

P = KvPolicyParams(max_bytes_per_round=100)


def obs(largest: int, free: int, waiting: int, gen: int = 0, peer: int = 0) -> KvObs:
    frag = 0.0 if free == 0 else 1 - largest / free
    return KvObs(largest, free, waiting, frag, gen, peer)


# (largest free, free, waiting, peer largest) -> action, reason fragment
CASES = [
    ((1000, 1000, 0, 0), "none", "no waiting"),  # nothing waits
    ((1000, 1000, 500, 0), "none", "no waiting"),  # 1000 >= 1.8 * 500: room enough
    ((800, 1000, 500, 0), "compact", "largest free"),  # 800 < 900 <= 1000 free
    ((100, 500, 500, 0), "none", "scale out"),  # free < 1.8 x waiting: compaction cannot help
    ((100, 500, 500, 900), "move", "peer has room"),  # ... but a peer has a 900-byte hole
    ((100, 500, 500, 899), "none", "scale out"),  # peer hole just too small
]


@pytest.mark.parametrize("o,action,why", CASES)
def test_trigger_table(o: tuple[int, int, int, int], action: str, why: str) -> None:
    _, d = step(P, KvPolicyState(), obs(o[0], o[1], o[2], peer=o[3]))
    assert d.action == action and why in d.reason
    assert d.bytes_budget == (100 if action == "compact" else 0)


def test_episode_counts_rounds_and_converges() -> None:
    s, d = step(P, KvPolicyState(), obs(100, 1000, 100, gen=1))
    assert (d.action, d.round, s.episodes, d.expected_generation) == ("compact", 1, 1, 1)
    s, d = step(P, s, obs(500, 1000, 100, gen=2))  # still fragmented: round 2
    assert (d.action, d.round) == ("compact", 2)
    s, d = step(P, s, obs(950, 1000, 100, gen=3))  # 1 - 0.95 <= 0.08: converged after 2 rounds
    assert (d.action, d.converged) == ("none", True)
    assert (s.in_episode, s.converged_episodes, s.mean_rounds_to_converge) == (False, 1, 2.0)


def test_episode_gives_up_after_max_rounds_and_moves() -> None:
    s = KvPolicyState()
    for r in (1, 2, 3):
        s, d = step(P, s, obs(100, 1000, 100, peer=10_000))
        assert d.round == r
    s, d = step(P, s, obs(100, 1000, 100, peer=10_000))
    assert d.action == "move" and "not converged" in d.reason and not s.in_episode
    assert s.converged_episodes == 0


def test_state_round_trips_and_params_validate() -> None:
    s, _ = step(P, KvPolicyState(), obs(100, 1000, 100))
    assert KvPolicyState.from_dict(s.to_dict()) == s
    with pytest.raises(ParameterError, match="trigger_factor"):
        KvPolicyParams(trigger_factor=0.5)
    with pytest.raises(ParameterError, match="max_rounds"):
        KvPolicyParams(max_rounds=0)
    with pytest.raises(ParameterError, match="largest_free_block_bytes"):
        KvObs(10, 5, 0, 0.0, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)),
                max_size=30))
def test_rounds_never_exceed_max_and_budget_is_bounded(seq: list[tuple[int, int, int]]) -> None:
    s = KvPolicyState()
    for a, b, w in seq:
        free, largest = max(a, b), min(a, b)
        s, d = step(P, s, obs(largest, free, w))
        assert isinstance(d, KvDecision) and 0 <= d.round <= P.max_rounds
        assert s.rounds <= P.max_rounds and d.bytes_budget <= P.max_bytes_per_round


def test_closed_loop_on_a_fragmented_allocator_converges_within_three_rounds() -> None:
    # 64 blocks; every other 2-block region freed -> holes of 2; 1 waiting request of 6 blocks
    a = ContiguousKvAllocator(64, 1)
    for i in range(32):
        a.alloc(f"r{i}", 2)
    for i in range(0, 32, 2):
        a.free(f"r{i}")
    p = KvPolicyParams(max_bytes_per_round=12)
    s, rounds = KvPolicyState(), 0
    for _ in range(10):
        s, d = step(p, s, KvObs(a.largest_free_block(), a.free_bytes, 6, a.fragmentation_ratio(),
                                a.generation))
        if d.action != "compact":
            break
        a.compact(d.bytes_budget)
        rounds += 1
    assert d.converged and rounds == s.rounds_to_converge_total <= 3
    assert a.fragmentation_ratio() <= 0.08
