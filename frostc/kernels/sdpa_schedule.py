"""The scheduling kernel of a variable-length SDPA plan: one CTA, launched before the attention
kernel on the same stream, turns the caller's device-side lengths into what the attention
kernel walks, in the plan's workspace:

  sequences  (q_token, q_len, kv_token, kv_len) per sequence, int32: lengths clamped to the
             plan's capacities (a sequence never reaches past its buffer, whatever the caller
             wrote), token offsets for the packed form (0 for the padded one)
  units      (sequence, query block) pairs, int32, the longest work first
  tile_count units * heads_q, int32: how many tiles the attention kernel's CTAs walk
  v_maps     e4m3 plans: one Vᵀ tensor map per sequence, its keys ending where the sequence
             ends (sequence_maps.py: keys innermost cannot be ragged); packed, over the Vᵀ that
             vt_pack.py re-lays into the workspace

"Longest" is the number of key blocks a unit visits under the plan's mask (plus one for its
prologue and epilogue): a counting sort over those costs, with shared-memory atomics. The
order within one cost is whichever the atomics give; each tile's result does not depend on
it. Nothing is read back to the host and nothing needs zeroing beforehand.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import cutlass
import cutlass.cute as cute

from frostc.kernels.interface import (
    I32,
    Group,
    Kernel,
    Ptr,
    TmaTensor,
    Variant,
    abi,
    host_only,
    pointer,
    tma,
    when,
)
from frostc.kernels.launch_order import WAITS_AT_ENTRY
from frostc.kernels.sdpa_common import KeyRange, MaskFlags
from frostc.kernels.sequence_maps import MAP_BYTES, aligned_start, release_sequence_maps, write_sequence_map
from frostc.kernels.sequences import packed_span

THREADS = 1024
BUCKETS = THREADS  # costs of 0 .. BUCKETS - 1 key blocks (more share the last bucket)
WARPS = THREADS // 32


def _writes_v_maps(variant) -> bool:
    return variant.v_maps_of is not None


@dataclass(frozen=True)
class VMaps(Group):
    """e4m3 plans: each sequence's Vᵀ tensor map, written into the workspace from a template, the
    attention launch's own V map (which its host code makes: `attention`, the attention
    launch's record, never on the device)."""

    v: TmaTensor = tma(extents=None, of="v_dtype")
    v_maps: Ptr = pointer("int32", align=MAP_BYTES)
    v_rows: I32 = abi("v.rows_per_batch")  # V's rows per padded sequence
    v_packed: Ptr = pointer("uint8")  # the packed form's re-laid Vᵀ (vt_pack.py)
    attention: Any = host_only(lambda variant: variant.v_maps_of)


@dataclass(frozen=True)
class ScheduleArgs:
    q_lengths: Ptr = pointer("int32", align=4)  # seq_len_q or cu_seqlens_q; null: every sequence full
    kv_lengths: Ptr = pointer("int32", align=4)
    sequences: Ptr = pointer("int32", align=4)  # the workspace's table, list and count
    units: Ptr = pointer("int32", align=4)
    tile_count: Ptr = pointer("int32", align=4)
    batch: I32
    q_capacity: I32  # tokens (packed) or rows (padded)
    kv_capacity: I32
    max_seqlen_q: I32
    max_seqlen_kv: I32
    unit_capacity: I32
    heads_q: I32
    window_left: I32
    window_right: I32
    maps: VMaps | None = when(_writes_v_maps)
    # the mixed form: sequences of at most this many queries are the paged decode kernel's (no units)
    decode_tokens: I32 | None = when(lambda variant: variant.mixed)


@dataclass(frozen=True)
class ScheduleVariant(Variant):
    """Compile key of the scheduling kernel. `packed`: lengths from cu_seqlens (batch + 1 prefix
    sums, capacities in tokens); else padded: per-sequence lengths, capacities in rows, where
    either side may have none (then every sequence has the capacity's length). `v_maps_of`:
    the e4m3 attention variant whose sequences' Vᵀ maps this kernel writes (its V tensor map is
    this kernel's template), else None; taken as any variant, so that this kernel does not
    import another kernel's module."""

    ARGS: ClassVar[type] = ScheduleArgs
    THREADS: ClassVar[int] = THREADS
    packed: bool
    q_lengths: bool
    kv_lengths: bool
    mask: MaskFlags
    block_m: int
    block_n: int
    v_maps_of: Variant | None = None
    # the mixed form's chunks: queries from cu_seqlens_q (`packed` capacities in tokens), keys from
    # per-sequence lengths over a paged cache; only sequences of more than `decode_tokens` queries
    # become units (the paged decode kernel takes the others)
    mixed: bool = False
    # it waits at entry (griddepcontrol.wait), so its launch may overlap a settled launch ahead
    # (frostc.kernels.launch_order): a mixed plan's decodes, a dense FP8 plan's V re-lay
    early_start: ClassVar[str] = WAITS_AT_ENTRY

    @property
    def name(self) -> str:
        if self.mixed:
            form = "mixed"
        elif self.packed:
            form = "packed"
        else:
            form = "padded." + "+".join(x for x, given in (("q", self.q_lengths), ("kv", self.kv_lengths)) if given)
        mask = self.mask.label.split(".")[0]  # softcap does not change which keys are visited
        maps = ".v_maps" if self.v_maps_of else ""
        if self.v_maps_of and self.v_maps_of.v_in_p_order:
            maps += ".p_order"  # the maps' key extents end on 16-key groups
        return f"sdpa_schedule.{form}.m{self.block_m}n{self.block_n}.{mask}{maps}"

    @property
    def v_dtype(self) -> str:
        return self.v_maps_of.dtype

    @property
    def tiles(self) -> dict[str, int]:
        return {"block_m": self.block_m, "block_n": self.block_n, "threads": THREADS, "cost_buckets": BUCKETS}

    @property
    def grid_rule(self) -> str:
        return "(1, 1, 1): one CTA lists every tile"

    def kernel(self) -> "SdpaSchedule":
        return SdpaSchedule(self)


class SdpaSchedule(Kernel):
    def __init__(self, variant: ScheduleVariant):
        super().__init__(variant)
        self.v = variant

    def prepare(self) -> None:
        @cute.struct
        class SharedStorage:
            counts: cute.struct.MemRange[cutlass.Int32, BUCKETS]
            warp_sums: cute.struct.MemRange[cutlass.Int32, WARPS]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()

    def tma_atoms(self, args: ScheduleArgs) -> dict:
        """The template: the attention launch's V tensor map, made by its own host code."""
        if args.maps is None:
            return {}
        template = self.v.v_maps_of.kernel().tma_atoms(args.maps.attention)["v"].tmap
        return {"maps": dataclasses.replace(args.maps, v=TmaTensor(template, None), attention=None)}

    @cute.kernel
    def kernel(self, args: ScheduleArgs):
        ints = (args.batch, args.q_capacity, args.kv_capacity, args.max_seqlen_q, args.max_seqlen_kv,
                args.unit_capacity, args.heads_q, args.window_left, args.window_right)  # fmt: skip
        maps = None
        if cutlass.const_expr(args.maps is not None):
            maps = (args.maps.v.tmap, args.maps.v_maps, args.maps.v_rows, args.maps.v_packed)
        if cutlass.const_expr(self.v.mixed):
            ints = (*ints, args.decode_tokens)
        self._schedule(args.q_lengths, args.kv_lengths, args.sequences, args.units, args.tile_count, ints, maps)

    @cute.jit
    def _schedule(self, q_lengths, kv_lengths, sequences, units, tile_count, ints: tuple, v_maps):
        """Both entries' body; `v_maps`: (template, region, V's rows per padded sequence, the
        re-laid packed Vᵀ) or None."""
        batch, q_capacity, kv_capacity, max_seqlen_q, max_seqlen_kv, unit_capacity, heads_q = ints[:7]
        window_left, window_right = ints[7], ints[8]
        decode_tokens = ints[9] if cutlass.const_expr(self.v.mixed) else None
        # the forward kernel behind it may launch now and set up while this runs (it waits for this
        # launch's end before it reads the list); launched early itself, this reads nothing before
        # the launch ahead has finished
        cute.arch.griddepcontrol_launch_dependents()
        cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        counts = storage.counts.get_tensor(cute.make_layout(BUCKETS))
        warp_sums = storage.warp_sums.get_tensor(cute.make_layout(WARPS))
        counts[tidx] = 0
        cute.arch.sync_threads()

        # 1. each sequence's clamped lengths into the table; count the units of each cost
        caps = (q_capacity, kv_capacity, max_seqlen_q, max_seqlen_kv)
        for b in range(tidx, batch, THREADS):
            q_token, q_len = self._lengths(q_lengths, b, caps[0], caps[2], self.v.q_lengths, self.v.packed)
            # the mixed form's keys: each sequence's length (its pages; no token offset)
            kv_packed = self.v.packed and not self.v.mixed
            kv_token, kv_len = self._lengths(kv_lengths, b, caps[1], caps[3], self.v.kv_lengths, kv_packed)
            row = cute.make_tensor(sequences + b * 4, cute.make_layout(4))
            row[0] = q_token
            row[1] = q_len
            row[2] = kv_token
            row[3] = kv_len
            if cutlass.const_expr(v_maps is not None):
                v_tma, maps, v_rows, v_packed = v_maps
                # V in P's order (vt_pack.py `p_order`): the extent ends on a 16-key group, whose
                # keys are stored permuted (a zero fill inside it would erase keys of the sequence)
                kv_end = kv_len
                if cutlass.const_expr(self.v.v_maps_of.v_in_p_order):
                    kv_end = (kv_len + 15) // 16 * 16
                if cutlass.const_expr(self.v.packed):  # V re-laid by vt_pack.py: its own address
                    write_sequence_map(v_tma, maps, b, aligned_start(kv_token, b) + kv_end, v_packed)
                else:
                    write_sequence_map(v_tma, maps, b, b * v_rows + kv_token + kv_end)
            keys = KeyRange.of(self.v.mask, window_left, window_right, q_len, kv_len)
            m_blocks = self._query_blocks(q_len, decode_tokens)
            # runs of query blocks of equal cost (a whole sequence without a diagonal) take one
            # atomic and stay together in the list: the tiles that run at once share K and V
            run_bucket, run_start = cutlass.Int32(-1), cutlass.Int32(0)
            for m in range(0, m_blocks, 1):
                bucket = self._bucket(keys, m, q_len)
                if bucket != run_bucket and m > 0:
                    cute.arch.atomic_add(counts.iterator + run_bucket, m - run_start, scope="cta")
                run_start = cutlass.select_(bucket != run_bucket, m, run_start)
                run_bucket = bucket
            if m_blocks > 0:
                cute.arch.atomic_add(counts.iterator + run_bucket, m_blocks - run_start, scope="cta")
        if cutlass.const_expr(v_maps is not None):
            release_sequence_maps()
        cute.arch.sync_threads()

        # 2. bucket starts: an exclusive scan over the buckets, most work first
        count = counts[tidx]
        lane, warp = tidx % 32, tidx // 32
        inclusive = count
        for offset in cutlass.range_constexpr(5):
            shifted = cute.arch.shuffle_sync_up(inclusive, offset=1 << offset)
            inclusive = inclusive + cutlass.select_(lane >= (1 << offset), shifted, 0)
        if lane == 31:
            warp_sums[warp] = inclusive
        cute.arch.sync_threads()
        before = cutlass.Int32(0)
        total = cutlass.Int32(0)
        for w in cutlass.range_constexpr(WARPS):
            before = before + cutlass.select_(warp > w, warp_sums[w], 0)
            total = total + warp_sums[w]
        cute.arch.sync_threads()  # every count is read before it becomes a cursor
        counts[tidx] = before + inclusive - count
        if tidx == 0:
            cute.make_tensor(tile_count, cute.make_layout(1))[0] = cutlass.min(total, unit_capacity) * heads_q
        cute.arch.sync_threads()

        # 3. each unit to its place: its bucket's cursor, advanced atomically
        for b in range(tidx, batch, THREADS):
            row = cute.make_tensor(sequences + b * 4, cute.make_layout(4))
            q_len, kv_len = row[1], row[3]
            keys = KeyRange.of(self.v.mask, window_left, window_right, q_len, kv_len)
            m_blocks = self._query_blocks(q_len, decode_tokens)
            run_bucket, run_start = cutlass.Int32(-1), cutlass.Int32(0)
            for m in range(0, m_blocks + 1, 1):  # one past the end flushes the last run
                bucket = self._bucket(keys, cutlass.min(m, m_blocks - 1), q_len)
                if (m == m_blocks or bucket != run_bucket) and m > 0:
                    place = cute.arch.atomic_add(counts.iterator + run_bucket, m - run_start, scope="cta")
                    self._write_units(units, place, b, run_start, m - run_start, unit_capacity)
                run_start = cutlass.select_(bucket != run_bucket, m, run_start)
                run_bucket = bucket

    def _query_blocks(self, q_len, decode_tokens):
        """The sequence's query blocks: none for the mixed form's decodes (`decode_tokens`)."""
        m_blocks = (q_len + self.v.block_m - 1) // self.v.block_m
        if cutlass.const_expr(self.v.mixed):
            m_blocks = cutlass.select_(q_len > decode_tokens, m_blocks, 0)
        return m_blocks

    @cute.jit
    def _write_units(self, units, place, b, first_block, count, capacity):
        """Units (b, first_block + i) at list positions place + i; past the capacity only when
        the lengths broke the plan's contract, then dropped."""
        for i in range(0, count, 1):
            if place + i < capacity:
                unit = cute.make_tensor(units + (place + i) * 2, cute.make_layout(2))
                unit[0] = b
                unit[1] = first_block + i

    def _lengths(self, lengths, b, capacity, max_seqlen, given: bool, packed: bool):
        """(token offset, length) of sequence b, clamped: a packed sequence lies within the
        buffer's tokens and is at most max_seqlen long; a padded one fits its rows."""
        if cutlass.const_expr(packed):
            return packed_span(lengths, b, capacity, max_seqlen)
        if cutlass.const_expr(given):
            length = cute.make_tensor(lengths + b, cute.make_layout(1))[0]
            return cutlass.Int32(0), cutlass.min(cutlass.max(length, 0), capacity)
        return cutlass.Int32(0), capacity

    def _bucket(self, keys, m, q_len):
        """The unit's cost bucket: 0 for the most key blocks."""
        first_row = m * self.v.block_m
        last_row = cutlass.min(first_row + self.v.block_m, q_len) - 1
        first, end = keys.blocks(first_row, last_row, self.v.block_n)
        cost = cutlass.min(cutlass.max(end - first, 0) + 1, BUCKETS - 1)
        return BUCKETS - 1 - cost
