"""How a persistent forward kernel's CTAs walk the tiles (query block, head, batch): the static
walks over fixed shapes (`DenseTiles`: in order, longest first, L2 sections, `paired_tile`), the
scheduling kernel's list for variable lengths (`ListedTiles`), and the dynamic walk that takes
each next tile from a counter in the workspace (`TicketWalk`)."""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from frostc.kernels.barriers import Barrier
from frostc.kernels.sequences import Shape

L2_SECTION_BYTES = 32 << 20  # K and V of the heads whose tiles run together (H100/H200 L2: 50/60 MB)


@dataclass(frozen=True)
class DenseTiles:
    """Fixed shapes: tile -> (query block, head, batch). Without a diagonal, the query blocks
    of one head are neighbours (they share K and V in L2); with one, longest first (the last
    query block of every head, then the one before, ...) so the short tiles fill the end."""

    shape: "Shape"
    longest_first: bool
    sectioned: bool = False  # longest first within sections of `section` (head, batch) pairs (L2)
    section: cutlass.Int32 = 0
    paired: bool = False  # the persistent walk over pairs of tiles (`paired_tile`)
    grid: cutlass.Int32 = 0

    def count(self):
        return self.shape.m_blocks * self.shape.heads_q * self.shape.batch

    def work(self, tile):
        s = self.shape
        heads_batch = s.heads_q * s.batch
        m_block, hb = tile % s.m_blocks, tile // s.m_blocks
        if cutlass.const_expr(self.paired):
            m_block, hb = paired_tile(tile, s.m_blocks, heads_batch, self.grid, DSL_INT_OPS)
        elif cutlass.const_expr(self.longest_first):
            m_block, hb = s.m_blocks - 1 - tile // heads_batch, tile % heads_batch
            if cutlass.const_expr(self.sectioned):
                first_pair = tile // (self.section * s.m_blocks) * self.section
                r = tile - first_pair * s.m_blocks
                pairs = cutlass.min(self.section, heads_batch - first_pair)
                m_block, hb = s.m_blocks - 1 - r // pairs, first_pair + r % pairs
        return m_block, hb % s.heads_q, hb // s.heads_q


# (select, min, max) for `paired_tile`: the DSL's in the kernel, Python's in tests
DSL_INT_OPS = (cutlass.select_, cutlass.min, cutlass.max)


def paired_tile(visit, m_blocks, head_batches, grid, ops):
    """The (query block, head-batch) of visit `visit` in the paired walk. With a diagonal, query
    block j and m_blocks - 1 - j of one head cost m_blocks + 1 key blocks together, so a CTA
    takes such a pair in two consecutive visits (the longer first) and every CTA's pairs cost
    the same; pairs go head by head, so a round's CTAs share a few heads' K and V in L2. CTA b
    visits v = b, b + grid, ...: its k-th visit is half k % 2 of pair b + (k // 2)·grid while
    whole rounds of pairs last. The rest (a last partial round of pairs: long halves, then each
    head's middle tile when m_blocks is odd, then short halves) is walked with every other
    round reversed, a partial round too. Integer arithmetic only, through `ops` = (select,
    min, max), so that tests run it in Python."""
    select, min_, max_ = ops
    half_m = m_blocks // 2
    pairs = half_m * head_batches
    full_rounds = pairs // grid  # rounds in which every CTA has a pair
    round_ = visit // grid
    pair = round_ // 2 * grid + (visit - round_ * grid)
    long_half = round_ % 2 == 0
    left = pairs - full_rounds * grid
    singles = select(m_blocks % 2 == 1, head_batches, 0)
    rest = visit - 2 * full_rounds * grid
    rest_round = rest // grid
    in_round = min_(grid, 2 * left + singles - rest_round * grid)
    item = select(rest_round % 2 == 1, rest_round * grid + in_round - 1 - (rest - rest_round * grid), rest)
    in_rest = round_ >= 2 * full_rounds
    is_middle = in_rest & (item >= left) & (item < left + singles)
    pair = select(in_rest, full_rounds * grid + select(item < left, item, 2 * left + singles - 1 - item), pair)
    long_half = select(in_rest, item < left, long_half)
    half_m_safe = max_(half_m, 1)
    j = pair - pair // half_m_safe * half_m_safe
    m_block = select(is_middle, half_m, select(long_half, m_blocks - 1 - j, j))
    return m_block, select(is_middle, item - left, pair // half_m_safe)


@dataclass(frozen=True)
class ListedTiles:
    """Variable lengths: tile -> the scheduling kernel's unit tile // heads_q (sequence, query
    block), head tile % heads_q: a unit's heads are neighbours (GQA heads share K and V)."""

    units: cute.Pointer
    count_ptr: cute.Pointer
    heads_q: cutlass.Int32

    def count(self):
        return cute.make_tensor(self.count_ptr, cute.make_layout(1))[0]

    def work(self, tile):
        unit = cute.make_tensor(self.units + (tile // self.heads_q) * 2, cute.make_layout(2))
        return unit[1], tile % self.heads_q, unit[0]


@dataclass(frozen=True)
class TicketWalk:
    """Fixed shapes, the dynamic walk: which tile a CTA takes next is decided at run time. CTA
    b starts with tile b; every later tile is `grid + n` for the n-th take of a counter in the
    workspace, so a CTA that finishes early takes more and the longest-first order is kept
    (within L2 sections: `DenseTiles`). The counter must hold zero before the first launch;
    each launch leaves it zero: every tile taken leads to one take, so exactly `tiles` takes
    happen, and the CTA whose take returns the last one writes zero back (no take can follow).

    The producer is a whole warp here (its TMA copies and barrier arrivals elect one lane
    themselves). Its first lane takes a ticket while the current tile loads (the round trip is
    hidden) and hands it to the consumers through a shared-memory word, between two named
    barriers that the producer warp and every consumer thread meet (bench/NOTES.md, "the
    ticket's hand-over"): `full` (the word is written: the producer arrives, the consumers wait)
    and `empty` (every consumer warp read it: the consumers arrive, the producer waits before
    the next write). The word is written and read with atomics, one lane per warp: the barriers
    order them; compute-sanitizer's racecheck does not follow an arrival at one barrier to a
    wait at it, and leaves atomics alone."""

    counter: cute.Pointer  # int32 in the workspace
    word: cute.Tensor  # int32 (shared): the tile the producer published
    consumers: int  # consumer warpgroups
    visits: cute.Pointer  # debug builds (`count_visits`): int32 visits per (tile, consumer)

    @property
    def threads(self) -> int:
        """The producer's warp and every consumer thread."""
        return 32 + 128 * self.consumers

    def _barrier(self, barrier_id: int):
        return pipeline.NamedBarrier(barrier_id=barrier_id, num_threads=self.threads)

    @cute.jit
    def take(self, grid, num_tiles, current):
        """Producer warp: the tile after `current`: a ticket while tiles remain, else `current`
        (past the end). One lane takes it (the compiler merges a warp's adds into one add of
        the warp's count), every lane gets it."""
        upcoming = current
        if current < num_tiles:
            taken = cutlass.Int32(0)
            if cute.arch.lane_idx() == 0:
                taken = cute.arch.atomic_add(self.counter, cutlass.Int32(1), scope="gpu")
            upcoming = grid + cute.arch.shuffle_sync(taken, 0)
        return upcoming

    @cute.jit
    def publish(self, tile, first: bool):
        """Producer warp: once the consumers read the previous tile (`empty`; the first needs
        no wait), write this one and tell them (`full`)."""
        if cutlass.const_expr(not first):
            self._barrier(Barrier.TICKET_EMPTY).arrive_and_wait()
        if cute.arch.lane_idx() == 0:
            cute.arch.atomic_exch(self.word.iterator, tile, scope="cta")
        self._barrier(Barrier.TICKET_FULL).arrive()

    def drain(self):
        """Producer warp, after publishing the end: wait until the consumers read it (every
        arrival at `empty` meets a wait)."""
        self._barrier(Barrier.TICKET_EMPTY).arrive_and_wait()

    @cute.jit
    def read(self):
        """Consumers: the tile the producer published (one lane per warp reads, all get it),
        then free the word for the next one."""
        self._barrier(Barrier.TICKET_FULL).arrive_and_wait()
        found = cutlass.Int32(0)
        if cute.arch.lane_idx() == 0:
            found = cute.arch.atomic_add(self.word.iterator, cutlass.Int32(0), scope="cta")
        tile = cute.arch.shuffle_sync(found, 0)
        self._barrier(Barrier.TICKET_EMPTY).arrive()
        return tile

    @cute.jit
    def finish(self, grid, num_tiles, last_taken):
        """Producer warp: the CTA that took the last ticket resets the counter."""
        if last_taken == grid + num_tiles - 1:
            if cute.arch.lane_idx() == 0:
                cute.arch.atomic_exch(self.counter, cutlass.Int32(0), scope="gpu")
