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


BLOCKED = KvPolicyParams(max_bytes_per_round=100, compact_when_blocked=True)

# (largest free, free, waiting, peer largest) -> action with compact_when_blocked off, on
BLOCKED_CASES = [
    ((100, 150, 120, 0), "none", "compact"),  # 100 < 120 <= 150: only fragmentation blocks it
    ((100, 150, 120, 999), "move", "compact"),  # blocked by fragmentation: compact locally, not move
    ((100, 110, 120, 0), "none", "none"),  # free < waiting: no compaction can admit it
    ((130, 150, 120, 0), "none", "none"),  # it fits now; the 1.8 x headroom is out of reach
    ((800, 1000, 500, 0), "compact", "compact"),  # the design source's trigger (docs/model.md §16 (kv)): both
]


@pytest.mark.parametrize("o,off,on", BLOCKED_CASES)
def test_compact_when_blocked_by_fragmentation_alone(o: tuple[int, int, int, int], off: str, on: str) -> None:
    assert step(P, KvPolicyState(), obs(o[0], o[1], o[2], peer=o[3]))[1].action == off
    st, d = step(BLOCKED, KvPolicyState(), obs(o[0], o[1], o[2], peer=o[3]))
    assert d.action == on and st.in_episode == (on == "compact")


def test_budget_from_a_pause_bound() -> None:
    p = KvPolicyParams.for_pause(0.005, 6e12, max_rounds=2)  # 5 ms of a 6 TB/s copy
    assert p.max_bytes_per_round == 30_000_000_000 and p.max_rounds == 2
    _, d = step(p, KvPolicyState(), obs(100, 1000, 100))
    assert d.bytes_budget == 30_000_000_000
    with pytest.raises(ParameterError, match="max_pause_s"):
        KvPolicyParams.for_pause(0.0, 6e12)
    with pytest.raises(ParameterError, match="copy_bandwidth_bytes_s"):
        KvPolicyParams.for_pause(0.01, float("nan"))
    with pytest.raises(ParameterError, match="compact_when_blocked"):
        KvPolicyParams(compact_when_blocked=1)  # type: ignore[arg-type]


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
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)), max_size=30))
def test_rounds_never_exceed_max_and_budget_is_bounded(seq: list[tuple[int, int, int]]) -> None:
    s = KvPolicyState()
    for a, b, w in seq:
        free, largest = max(a, b), min(a, b)
        s, d = step(P, s, obs(largest, free, w))
        assert isinstance(d, KvDecision) and 0 <= d.round <= P.max_rounds
        assert s.rounds <= P.max_rounds and d.bytes_budget <= P.max_bytes_per_round


def every_other_region_freed() -> ContiguousKvAllocator:
    """64 blocks of 1 byte in 2-block regions, every other one freed: 16 holes of 2."""
    a = ContiguousKvAllocator(64, 1)
    for i in range(32):
        a.alloc(f"r{i}", 2)
    for i in range(0, 32, 2):
        a.free(f"r{i}")
    return a


def test_closed_loop_on_a_fragmented_allocator_converges_within_three_rounds() -> None:
    # 64 blocks; every other 2-block region freed -> holes of 2; 1 waiting request of 6 blocks
    a = every_other_region_freed()
    p = KvPolicyParams(max_bytes_per_round=12)
    s, rounds = KvPolicyState(), 0
    for _ in range(10):
        s, d = step(p, s, KvObs(a.largest_free_block(), a.free_bytes, 6, a.fragmentation_ratio(), a.generation))
        if d.action != "compact":
            break
        a.compact(d.bytes_budget)
        rounds += 1
    assert d.converged and rounds == s.rounds_to_converge_total <= 3
    assert a.fragmentation_ratio() <= 0.08


def test_closed_loop_with_a_pause_budget_converges_in_one_round_and_admits_the_waiting_request() -> None:
    # 64 blocks of 1 byte, every other 2-block region freed: 32 free bytes in 16 holes of 2;
    # a request of 20 is blocked by fragmentation alone (20 > 2 and 20 <= 32, but < 1.8 x 20)
    a = every_other_region_freed()
    p = KvPolicyParams.for_pause(0.016, 1000.0, compact_when_blocked=True)  # 16 bytes a round
    s, d = step(p, KvPolicyState(), KvObs(2, 32, 20, a.fragmentation_ratio(), a.generation))
    assert (d.action, d.bytes_budget) == ("compact", 16)
    res = a.compact(d.bytes_budget, bandwidth_bytes_s=1000.0, move_overhead_s=0.0)
    assert res.bytes_moved == 16 and res.duration_s == pytest.approx(0.016)  # the pause bound, met
    assert a.fragmentation_ratio() == 0.0 and a.alloc("waiting", 20) is not None
    s, d = step(p, s, KvObs(a.largest_free_block(), a.free_bytes, 0, a.fragmentation_ratio(), a.generation))
    assert d.converged and s.mean_rounds_to_converge == 1.0
