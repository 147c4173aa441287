"""KV allocators: invariants under random operation sequences, prefix reuse, compaction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kvalloc import ContiguousKvAllocator, KvAllocError, PagedKvAllocator

pytestmark = pytest.mark.timeout(120)

B = 4  # block bytes in these tests


def check_invariants(a: ContiguousKvAllocator) -> None:
    regs = a.regions()
    for (s0, n0, _), (s1, _, _) in zip(regs, regs[1:], strict=False):
        assert s0 + n0 <= s1, "overlapping regions"
    assert all(0 <= s and s + n <= a.total_bytes for s, n, _ in regs)
    assert sum(n for _, n, _ in regs) == a.used_bytes
    assert a.used_bytes + a.free_bytes == a.total_bytes
    assert sum(n * B for n in a._fl) == a.free_bytes  # free list agrees with the counter
    assert a.largest_free_block() == max(a._fl, default=0) * B
    assert 0.0 <= a.fragmentation_ratio() <= 1.0


# op: ("alloc", size_blocks, prefix ids) | ("free", index) | ("compact", budget_blocks)
OPS = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 12), st.lists(st.integers(0, 6), max_size=4)),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.just("compact"), st.integers(0, 40)),
), max_size=80)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_contiguous_invariants_hold_under_any_sequence(ops: list) -> None:
    a = ContiguousKvAllocator(64 * B, B)
    live: list[str] = []
    for i, op in enumerate(ops):
        gen = a.generation
        if op[0] == "alloc":
            ok = a.fits(op[1] * B, op[2])
            off = a.alloc(f"r{i}", op[1] * B, op[2])
            assert (off is not None) == ok  # fits() is exact
            assert (a.generation > gen) == (off is not None)
            if off is not None:
                live.append(f"r{i}")
        elif op[0] == "free" and live:
            assert a.free(live.pop(op[1] % len(live)))
            assert a.generation > gen
        elif op[0] == "compact":
            before = {(n, o) for _, n, o in a.regions()}
            frag0 = a.fragmentation_ratio()
            res = a.compact(op[1] * B, bandwidth_bytes_s=1.0)
            assert {(n, o) for _, n, o in a.regions()} == before  # same live allocations
            assert res.fragmentation_after <= frag0 + 1e-12  # never more fragmented
            assert res.bytes_moved <= op[1] * B
            assert (a.generation > gen) == (res.bytes_moved > 0)
            assert set(res.moved_request_ids) <= set(live)
        check_invariants(a)
    assert a.live_requests() == set(live)
    for r in live:
        a.free(r)
    assert a.used_bytes == 0 and a.largest_free_block() == a.total_bytes


def test_unbounded_compaction_removes_all_fragmentation() -> None:
    a = ContiguousKvAllocator(20 * B, B)
    for i in range(10):
        a.alloc(f"r{i}", 2 * B)
    for i in range(0, 10, 2):
        a.free(f"r{i}")
    assert a.largest_free_block() == 2 * B and a.fragmentation_ratio() == pytest.approx(0.8)
    res = a.compact(10**9, bandwidth_bytes_s=2.0 * B, move_overhead_s=0.0)
    assert a.fragmentation_ratio() == 0.0 and a.largest_free_block() == 10 * B
    assert res.bytes_moved == 10 * B and res.duration_s == pytest.approx(5.0)  # bytes / bandwidth
    assert res.moved_request_ids == [f"r{i}" for i in range(1, 10, 2)]


def test_budget_bounds_the_work_per_round() -> None:
    a = ContiguousKvAllocator(20 * B, B)
    for i in range(10):
        a.alloc(f"r{i}", 2 * B)
    for i in range(0, 10, 2):
        a.free(f"r{i}")
    res = a.compact(4 * B)  # two regions of 2 blocks
    assert res.bytes_moved == 4 * B and res.moved_request_ids == ["r1", "r3"]
    assert 0.0 < res.fragmentation_after < res.fragmentation_before


def test_prefix_blocks_are_shared_and_refcounted() -> None:
    a = ContiguousKvAllocator(100 * B, B)
    a.alloc("x", 10 * B, hash_ids=[1, 2, 3, 4])  # 4 prefix + 6 private
    assert a.used_bytes == 10 * B
    a.alloc("y", 10 * B, hash_ids=[1, 2, 3, 9])  # 3 reused: 1 new prefix + 6 private
    assert a.used_bytes == 17 * B and a.prefix_hits == 3
    a.free("x")  # 1, 2, 3 still held by y; 4 freed
    assert a.used_bytes == 10 * B and a.resident_prefix([1, 2, 3, 4]) == 3
    a.free("y")
    assert a.used_bytes == 0


def test_reuse_saves_memory_against_no_reuse() -> None:
    shared, unshared = ContiguousKvAllocator(1000 * B, B), ContiguousKvAllocator(1000 * B, B)
    for i in range(20):
        shared.alloc(f"r{i}", 12 * B, hash_ids=[0, 1, 2, 3, 100 + i])
        unshared.alloc(f"r{i}", 12 * B, hash_ids=[1000 * i + k for k in range(5)])
    assert unshared.used_bytes == 20 * 12 * B
    assert shared.used_bytes == 4 * B + 20 * 8 * B  # 4 common blocks held once


def test_moving_a_shared_prefix_block_pauses_every_holder() -> None:
    a = ContiguousKvAllocator(10 * B, B)
    a.alloc("gap", 1 * B)
    a.alloc("x", 3 * B, hash_ids=[7])  # private at 1-2, prefix 7 at 3
    a.alloc("y", 3 * B, hash_ids=[7])  # private at 4-5
    a.free("gap")
    res = a.compact(10 * B)
    assert res.moved_request_ids == ["x", "y"]


def test_oversize_and_duplicate_requests() -> None:
    a = ContiguousKvAllocator(10 * B, B)
    assert a.alloc("big", 11 * B) is None and a.generation == 0
    a.alloc("x", B)
    with pytest.raises(KvAllocError):
        a.alloc("x", B)
    assert not a.free("nobody")


def test_free_block_histogram_bins() -> None:
    a = ContiguousKvAllocator(20 * B, B)
    for i in range(6):
        a.alloc(f"r{i}", [1, 1, 2, 1, 4, 1][i] * B)
    a.free("r0"), a.free("r2"), a.free("r4")  # holes of 1, 2, 4 blocks; tail of 10
    assert a.free_block_histogram(bins=(1, 2, 4, 8)) == [1, 1, 1, 1]
    assert sum(a.free_block_histogram()) == 4


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 10), min_size=1, max_size=30), st.integers(0, 1000))
def test_paged_has_no_external_fragmentation(sizes: list[int], seed: int) -> None:
    p = PagedKvAllocator(64 * B, B)
    live = []
    for i, n in enumerate(sizes):
        if p.alloc(f"r{i}", n * B) is not None:
            live.append(f"r{i}")
        if live and (seed + i) % 3 == 0:
            p.free(live.pop((seed + i) % len(live)))
        assert p.fragmentation_ratio() == 0.0 and p.largest_free_block() == p.free_bytes
        assert p.used_bytes + p.free_bytes == p.total_bytes
    assert p.compact(10**9).bytes_moved == 0


def test_shared_prefix_pins_an_island_in_a_freed_region() -> None:
    a = ContiguousKvAllocator(10 * B, B)
    a.alloc("x", 4 * B, hash_ids=[5])  # region 0-3, prefix 5 at block 0
    a.alloc("y", 3 * B, hash_ids=[5])  # reuses 5: region 4-5
    a.free("x")  # block 0 stays (y uses it); blocks 1-3 free
    assert ("#5" in {o for _, _, o in a.regions()}) and a.used_bytes == 3 * B
    assert a.free_block_histogram(bins=(1, 2, 4)) == [0, 1, 1]  # holes of 3 and 4 blocks
    assert a.largest_free_block() == 4 * B and a.fragmentation_ratio() == pytest.approx(1 - 4 / 7)
    a.compact(10**9)
    assert a.largest_free_block() == 7 * B
    a.free("y")
    assert a.used_bytes == 0 and a.largest_free_block() == 10 * B
