"""KV-cache memory allocators of one replica: contiguous (fragments) and paged (does not).

docs/model.md §16 (kv) and issue 6. Engines without paged attention keep each
sequence's KV in **one contiguous region** reserved at admission for
``prompt + output`` tokens; regions freed at completion leave holes, and a
request whose region does not fit in any hole waits although the total free
memory would hold it (external fragmentation). :class:`ContiguousKvAllocator`
models that with first-fit over a sorted free list; :class:`PagedKvAllocator`
is the vLLM-style comparison (any free block serves, no external
fragmentation).

Granularity. Memory is counted in blocks of ``block_bytes`` (the fleet uses
512 tokens x ``kv_bytes_per_token``, the Mooncake ``hash_ids`` block). Offsets
and sizes in the API are bytes, multiples of ``block_bytes``.

Prefix reuse. ``alloc(request_id, nbytes, hash_ids)``: the leading
``len(hash_ids)`` blocks of the request are prefix blocks identified by their
Mooncake hash id. Those already resident on the replica (held by a live
request) are shared, refcounted, and cost no new memory; everything else (its
new prefix blocks, the rest of the prompt and the output, at least one
block) is one new contiguous region. When a request frees, a prefix block it
created that other live requests still use stays where it is, a pinned
one-block island inside the freed region, until its last holder frees: this
is how prefix sharing fragments contiguous memory. Unreferenced prefix
blocks are not kept.

Fragmentation ratio (documented definition): ``1 - largest_free / total_free``
(0 when nothing is free): 0 means all free memory is one hole; 0.9 means the
largest hole is a tenth of the free memory.

Compaction (issue 6). ``compact(max_bytes_moved, bandwidth_bytes_s)``
carries out :meth:`ContiguousKvAllocator.plan_compaction`: the round that
makes the **largest hole**, and among those the one that moves the **fewest
bytes**, within the byte budget. A *unit* is a live region (a request's
region, with the prefix blocks it created) or a pinned prefix island. A
candidate plan empties one *window*: a run of consecutive units and free
extents in address order (that neither starts right after nor ends right
before a free extent, which the longer run would include). Its units are
*evacuated*, largest first, each into the smallest free extent outside the
window that holds it (best fit, at the extent's low end); those that fit
nowhere *slide* to the window's low end in address order (a unit already
there stays). The hole is the window's span minus what slid; the cost is the
bytes copied. Every window is tried (pruned by the budget and by bounds on
the hole and the cost), so a layout whose packed prefix sits before one small
gap no longer pays for sliding everything above it: only the units that
block the merge move. The copy order is the evacuations, then the slides (a
slide only moves a unit down, into space already vacated). It is a
heuristic: on random 10-block layouts it matches a brute-force search over
every placement in all but about 1 % of cases (the misses chain moves: an
evacuee into the space another one vacated).

Prefix islands move like any unit; a moved prefix block (an island, or one
inside a moved region) keeps its refcount and holders, only its block
changes, and every holder's block table is updated, so every holder pauses.
Cost of a round: ``bytes_moved / bandwidth_bytes_s + moves x
move_overhead_s`` (:data:`MOVE_OVERHEAD_S` per copied unit: kernel launch
and block-table update); the moved requests pause for it.
:data:`COPY_BANDWIDTH_BYTES_S` is the number used by the fleet: an H100
device-to-device copy reads and writes every byte, so it reaches about half
of the 3.35 TB/s HBM3 peak (~1.5 TB/s measured by cudaMemcpy D2D
benchmarks); a TP group copies its shards in parallel, so the fleet
multiplies it by ``tensor_parallel``.

Every successful ``alloc``, ``free`` and non-empty ``compact`` bumps
``generation``, so a relocation command planned on a stale view is refused.

Examples
--------
>>> a = ContiguousKvAllocator(capacity_bytes=10 * 4, block_bytes=4)
>>> [a.alloc(r, 8) for r in ("a", "b", "c")]
[0, 8, 16]
>>> a.free("b"), a.largest_free_block(), round(a.fragmentation_ratio(), 3)
(True, 16, 0.333)
>>> res = a.compact(max_bytes_moved=100, bandwidth_bytes_s=4.0)
>>> res.moved_request_ids, res.bytes_moved, a.largest_free_block(), a.fragmentation_ratio()
(['c'], 8, 24, 0.0)
>>> res.duration_s == 8 / 4.0 + 1 * MOVE_OVERHEAD_S  # bytes / bandwidth + one copied unit
True
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.kvcompact import best_plan

__all__ = [
    "COPY_BANDWIDTH_BYTES_S",
    "DEFAULT_HIST_BLOCKS",
    "MOVE_OVERHEAD_S",
    "CompactionPlan",
    "CompactionResult",
    "ContiguousKvAllocator",
    "KvAllocError",
    "PagedKvAllocator",
]

COPY_BANDWIDTH_BYTES_S = 1.5e12  # per GPU, HBM-to-HBM effective (see module docstring)
MOVE_OVERHEAD_S = 10e-6  # per moved region: kernel launch + block-table update
DEFAULT_HIST_BLOCKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # bin lower edges, in blocks


class KvAllocError(ValueError):
    """Bad allocator argument (names it)."""


@dataclass(frozen=True)
class CompactionPlan:
    """One compaction round's copies, in copy order: ``(owner, from_offset, to_offset, nbytes)``.

    ``owner`` is a request id, or the int hash id of a pinned prefix island.
    ``largest_free_after`` is the largest hole once the copies are done.
    """

    moves: tuple[tuple[str | int, int, int, int], ...]
    bytes_moved: int
    largest_free_after: int


@dataclass(frozen=True)
class CompactionResult:
    """Outcome of one compaction round."""

    bytes_moved: int
    duration_s: float
    moved_request_ids: list[str]
    fragmentation_before: float
    fragmentation_after: float
    largest_free_before: int
    largest_free_after: int
    generation: int


class _Base:
    """Bookkeeping shared by both allocators: ownership, prefix refcounts, generation."""

    def __init__(self, capacity_bytes: int, block_bytes: int) -> None:
        if block_bytes < 1 or capacity_bytes < block_bytes:
            raise KvAllocError(
                f"capacity_bytes={capacity_bytes}, block_bytes={block_bytes}: need 1 <= block_bytes <= capacity_bytes"
            )
        self.block_bytes = int(block_bytes)
        self.n_blocks = int(capacity_bytes) // self.block_bytes
        self.total_bytes = self.n_blocks * self.block_bytes
        self.generation = 0
        self.used_blocks = 0
        self.prefix_hits = 0  # prefix blocks reused (memory saved, in blocks)
        self._own: dict[str, list[int]] = {}  # request -> its blocks (contiguous: one run)
        self._refs: dict[str, tuple[int, ...]] = {}  # request -> prefix hash ids it uses
        self._created: dict[str, list[int]] = {}  # request -> prefix hash ids placed in its region
        # hash id -> [block, owner request (None: a pinned island), holders]
        self._prefix: dict[int, list[Any]] = {}

    def _plan(self, nbytes: int, hash_ids: Sequence[int] | None) -> tuple[int, tuple[int, ...], list[int]]:
        if nbytes < 0:
            raise KvAllocError(f"nbytes={nbytes}: must be >= 0")
        ids = tuple(dict.fromkeys(hash_ids or ()))
        new = [h for h in ids if h not in self._prefix]
        need = -(-int(nbytes) // self.block_bytes)
        return max(1, len(new), need - (len(ids) - len(new))), ids, new

    def new_blocks(self, nbytes: int, hash_ids: Sequence[int] | None = None) -> int:
        """Blocks ``alloc`` would take now (its new region)."""
        return self._plan(nbytes, hash_ids)[0]

    def fits(self, nbytes: int, hash_ids: Sequence[int] | None = None) -> bool:
        """Would ``alloc`` succeed now (no side effect)?"""
        return self._largest_blocks() >= self._plan(nbytes, hash_ids)[0]

    def resident_prefix(self, hash_ids: Sequence[int] | None) -> int:
        """How many of ``hash_ids`` are resident (reusable) here."""
        return sum(h in self._prefix for h in (hash_ids or ()))

    def resident_hashes(self) -> list[int]:
        """The prefix hash ids resident here (for the coupling graph's MinHash)."""
        return list(self._prefix)

    @property
    def used_bytes(self) -> int:
        return self.used_blocks * self.block_bytes

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes

    def live_requests(self) -> set[str]:
        return set(self._own)

    def largest_free_block(self) -> int:
        """Bytes of the largest contiguous free region."""
        return self._largest_blocks() * self.block_bytes

    def fragmentation_ratio(self) -> float:
        """``1 - largest_free / total_free`` (0 when nothing is free)."""
        free = self.n_blocks - self.used_blocks
        return 0.0 if free == 0 else 1.0 - self._largest_blocks() / free

    def _largest_blocks(self) -> int:
        raise NotImplementedError

    def _take(self, n: int) -> list[int] | None:
        raise NotImplementedError

    def _release(self, blocks: list[int]) -> None:
        raise NotImplementedError

    def _free_sizes(self) -> list[int]:
        raise NotImplementedError

    def alloc(self, request_id: str, nbytes: int, hash_ids: Sequence[int] | None = None) -> int | None:
        """Reserve ``nbytes`` for ``request_id``; returns its new region's byte offset or None.

        All or nothing: when the new region does not fit, nothing changes.
        """
        if request_id in self._own:
            raise KvAllocError(f"request_id={request_id!r}: already allocated")
        n, ids, new = self._plan(nbytes, hash_ids)
        blocks = self._take(n)
        if blocks is None:
            return None
        for i, h in enumerate(new):
            self._prefix[h] = [blocks[i], request_id, {request_id}]
        for h in ids:
            if h not in new:
                self._prefix[h][2].add(request_id)
        self.prefix_hits += len(ids) - len(new)
        self._own[request_id], self._refs[request_id], self._created[request_id] = blocks, ids, new
        self.used_blocks += n
        self.generation += 1
        return blocks[0] * self.block_bytes

    def free(self, request_id: str) -> bool:
        """Release ``request_id``; prefix blocks others still use stay pinned. False if unknown."""
        blocks = self._own.pop(request_id, None)
        if blocks is None:
            return False
        release = set(blocks)
        for h in self._refs.pop(request_id):
            ent = self._prefix[h]
            ent[2].discard(request_id)
            if ent[2]:
                if ent[1] == request_id:
                    ent[1] = None  # pinned island inside the freed region
                    release.discard(ent[0])
            else:
                del self._prefix[h]
                release.add(ent[0])  # a pinned island (or a block of this region)
        del self._created[request_id]
        self._release(sorted(release))
        self.used_blocks -= len(release)
        self.generation += 1
        return True

    def regions(self) -> list[tuple[int, int, str]]:
        """Live runs ``(offset_bytes, nbytes, owner)`` in address order; ``'#<hash>'`` for pinned prefixes."""
        b, out = self.block_bytes, []
        for r, blocks in self._own.items():
            run0 = prev = blocks[0]
            for x in blocks[1:] + [-2]:
                if x != prev + 1:
                    out.append((run0 * b, (prev - run0 + 1) * b, r))
                    run0 = x
                prev = x
        out += [(pos * b, b, f"#{h}") for h, (pos, owner, _) in self._prefix.items() if owner is None]
        return sorted(out)

    def free_block_histogram(self, bins: Sequence[int] = DEFAULT_HIST_BLOCKS) -> list[int]:
        """Count of free regions per size bin; ``bins`` are lower edges in blocks (last bin open)."""
        out = [0] * len(bins)
        for n in self._free_sizes():
            i = bisect_left(bins, n + 1) - 1
            if i >= 0:
                out[i] += 1
        return out


class ContiguousKvAllocator(_Base):
    """First-fit contiguous regions over ``capacity_bytes`` (see the module docstring)."""

    def __init__(self, capacity_bytes: int, block_bytes: int) -> None:
        super().__init__(capacity_bytes, block_bytes)
        self._fs: list[int] = [0]  # free extents: sorted starts and their lengths
        self._fl: list[int] = [self.n_blocks]
        self._largest: int | None = self.n_blocks

    def _largest_blocks(self) -> int:
        if self._largest is None:
            self._largest = max(self._fl, default=0)
        return self._largest

    def _free_sizes(self) -> list[int]:
        return list(self._fl)

    def _take(self, n: int) -> list[int] | None:
        if n > self._largest_blocks():
            return None
        for i, length in enumerate(self._fl):
            if length >= n:
                start = self._fs[i]
                if length == n:
                    del self._fs[i], self._fl[i]
                else:
                    self._fs[i], self._fl[i] = start + n, length - n
                if length == self._largest:
                    self._largest = None
                return list(range(start, start + n))
        return None

    def _release(self, blocks: list[int]) -> None:
        i = 0
        while i < len(blocks):
            j = i
            while j + 1 < len(blocks) and blocks[j + 1] == blocks[j] + 1:
                j += 1
            self._give(blocks[i], j - i + 1)
            i = j + 1

    def _give(self, start: int, n: int) -> None:
        i = bisect_left(self._fs, start)
        if i > 0 and self._fs[i - 1] + self._fl[i - 1] == start:  # merge left
            i -= 1
            self._fl[i] += n
        else:
            self._fs.insert(i, start)
            self._fl.insert(i, n)
        if i + 1 < len(self._fs) and self._fs[i] + self._fl[i] == self._fs[i + 1]:  # merge right
            self._fl[i] += self._fl.pop(i + 1)
            del self._fs[i + 1]
        if self._largest is not None and self._fl[i] > self._largest:
            self._largest = self._fl[i]

    def _units(self) -> list[tuple[int, int, str | int]]:
        """Live runs ``(start_block, n_blocks, owner)`` in address order (int owner: a pinned island)."""
        units: list[tuple[int, int, str | int]] = [(b[0], len(b), r) for r, b in self._own.items()]
        units += [(e[0], 1, h) for h, e in self._prefix.items() if e[1] is None]
        units.sort(key=lambda u: u[0])
        return units

    def plan_compaction(self, max_bytes_moved: int) -> CompactionPlan:
        """The move plan :meth:`compact` would carry out now (no side effect); see the module docstring."""
        if max_bytes_moved < 0:
            raise KvAllocError(f"max_bytes_moved={max_bytes_moved}: must be >= 0")
        budget = int(max_bytes_moved) // self.block_bytes
        units = self._units()
        # items in address order: (start, n, unit index or -1 for a free extent)
        items = sorted(
            [(s, n, i) for i, (s, n, _) in enumerate(units)]
            + [(s, n, -1) for s, n in zip(self._fs, self._fl, strict=True)]
        )
        best = best_plan(items, self.n_blocks - self.used_blocks, self._largest_blocks(), budget)
        b = self.block_bytes
        moves = tuple((units[u][2], src * b, dst * b, n * b) for u, src, dst, n in best[2])
        return CompactionPlan(moves, best[1] * b, best[0] * b)

    def compact(
        self,
        max_bytes_moved: int,
        bandwidth_bytes_s: float = COPY_BANDWIDTH_BYTES_S,
        move_overhead_s: float = MOVE_OVERHEAD_S,
    ) -> CompactionResult:
        """Carry out :meth:`plan_compaction` (at most ``max_bytes_moved`` bytes); see the module docstring."""
        if max_bytes_moved < 0 or not bandwidth_bytes_s > 0:
            raise KvAllocError("max_bytes_moved >= 0 and bandwidth_bytes_s > 0 required")
        frag0, big0 = self.fragmentation_ratio(), self.largest_free_block()
        plan = self.plan_compaction(max_bytes_moved)
        moved: set[str] = set()
        for who, src_b, dst_b, _ in plan.moves:
            shift = (dst_b - src_b) // self.block_bytes
            if isinstance(who, str):
                self._own[who] = [x + shift for x in self._own[who]]
                moved.add(who)
                for h in self._created[who]:
                    ent = self._prefix.get(h)
                    if ent is not None and ent[1] == who:  # its prefix blocks travel with it
                        ent[0] += shift
                        moved.update(ent[2])
            else:  # a pinned prefix island: its holders' block tables are updated
                self._prefix[who][0] += shift
                moved.update(self._prefix[who][2])
        if plan.moves:  # rebuild the free list from the live units
            self._fs, self._fl, pos = [], [], 0
            for s, n, _ in self._units():
                if s > pos:
                    self._fs.append(pos)
                    self._fl.append(s - pos)
                pos = s + n
            if pos < self.n_blocks:
                self._fs.append(pos)
                self._fl.append(self.n_blocks - pos)
            self._largest = None
            self.generation += 1
        nbytes = plan.bytes_moved
        return CompactionResult(
            nbytes,
            nbytes / bandwidth_bytes_s + len(plan.moves) * move_overhead_s,
            sorted(moved),
            frag0,
            self.fragmentation_ratio(),
            big0,
            self.largest_free_block(),
            self.generation,
        )


class PagedKvAllocator(_Base):
    """Paged KV (vLLM-style): any free block serves, so no external fragmentation.

    ``largest_free_block`` is the free memory (every free block is usable by
    one request); ``compact`` moves nothing. Offsets are the first page's.

    Examples
    --------
    >>> p = PagedKvAllocator(40, 4)
    >>> p.alloc("a", 8), p.alloc("b", 8), p.free("a"), p.fragmentation_ratio()
    (0, 8, True, 0.0)
    """

    def __init__(self, capacity_bytes: int, block_bytes: int) -> None:
        super().__init__(capacity_bytes, block_bytes)
        self._free: list[int] = list(range(self.n_blocks))  # free page ids, sorted

    def _largest_blocks(self) -> int:
        return len(self._free)

    def _free_sizes(self) -> list[int]:
        return [len(self._free)] if self._free else []

    def _take(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        pages, self._free = self._free[:n], self._free[n:]
        return pages

    def _release(self, blocks: list[int]) -> None:
        for p in blocks:
            insort(self._free, p)

    def compact(
        self,
        max_bytes_moved: int,
        bandwidth_bytes_s: float = COPY_BANDWIDTH_BYTES_S,
        move_overhead_s: float = MOVE_OVERHEAD_S,
    ) -> CompactionResult:
        """Nothing to do: paged memory does not fragment externally."""
        f, big = self.fragmentation_ratio(), self.largest_free_block()
        return CompactionResult(0, 0.0, [], f, f, big, big, self.generation)
