"""The combine kernel of a split-KV paged attention plan: merges each query row's partial
results (one per key split, written by `sdpa_decode_paged.py` into the workspace) into O and
LSE, on the same stream right after it.

Split s of a row holds O_s (normalized over its keys, fp32) and LSE_s (natural log). With
m = max_s LSE_s and w_s = exp(LSE_s - m):  O = Σ w_s O_s / Σ w_s,  LSE = m + log Σ w_s.
Only the splits that hold keys of the sequence, ceil((len - origin) / chunk), are read (the
origin: 0, or with a sliding window the first new token's window start, down to a block: the
splits cover [origin, len), `sdpa_common.key_origin`): the attention
kernel's CTAs past the end wrote nothing, so their workspace is stale, and a sequence too
short to fill every split is merged from the splits it has. A row that sees no key (every
split LSE = -inf, or no split) gets O = 0 and LSE = -inf. Attention sinks (a sinks variant):
the row's head's logit joins m's max and Σ w_s once, as a key with no value (its O = 0 then,
its LSE the sink).

With the chunks apart (`decode_rows`) the decodes were split adaptively (the attention variant's
`adaptive`): each sequence's chunk comes from its length (`sequence_chunk`, computed here alike),
and a sequence whose keys fit one split was written by the attention kernel itself, so its rows
are left alone.

The decodes' rows (`decode_rows`) are merged a warp a row, 8 rows a CTA side by side: a
decode's splits are few (its keys spread over at most the plan's splits), so a row's LSE are
reduced by shuffles and each lane sums its 4-float pieces of d over the splits, with no shared
memory and no barrier. (The CTA-wide merge below, one row after another, spent ~16 µs a launch
in a serving step on its barriers: bench/NOTES.md "the combine a warp a row".)

Otherwise one CTA per (row, KV head, sequence); 256 threads: the splits' LSE are reduced across the
CTA, then O is summed with 16-byte loads, each thread a 4-float piece of d for every
`groups`-th split (groups = 256 // (d / 4), the whole groups of d / 4 threads: at d=96, 10 of
24; the 16 threads left over sum no split, into a spare column of the partial sums no one reads),
and the pieces' partial sums added through shared memory.
"""

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute

from frostc.kernels.cache_args import PackedQueries, packed
from frostc.kernels.interface import I32, BhsStrides, Kernel, Ptr, Variant, facets, pointer, when
from frostc.kernels.launch_order import WAITS_AT_ENTRY
from frostc.kernels.sdpa_common import LN_2, LOG2_E, dsl_dtype, key_origin, sequence_chunk
from frostc.kernels.sequences import packed_span

THREADS = 256
WARPS = THREADS // 32
VECTOR = 4  # fp32 elements per 16-byte load
# the mixed form with its chunks apart: query rows one CTA merges, a warp each. A serving
# bucket's grid covers every sequence its tokens could hold, most of them empty or one-token
# decodes (4 of up to 64 rows at GQA 4): one CTA a row launched ~60 empty CTAs for each useful one
# (0.23 s of a 64-request continuous-batching job, bench/RESULTS.md "bench/serve.py after mixed v3")
ROWS_PER_CTA = WARPS
LANES = 32


@dataclass(frozen=True)
class DecodeCombineArgs:
    o_partial: Ptr = pointer("fp32")  # the attention's partial results, in the workspace
    lse_partial: Ptr = pointer("fp32")
    seq_len_kv: Ptr = pointer("int32", align=4)
    o: Ptr = pointer()
    lse: Ptr = pointer("fp32", align=4)  # null without an LSE
    heads_kv: I32
    group: I32
    rows: I32  # query rows per (sequence, KV head): s_new * group
    capacity: I32  # the most keys a sequence holds
    chunk: I32  # keys per split (an adaptive split: the fewest)
    splits: I32
    s_new: I32
    window_left: I32  # -1: no window
    block_n: I32  # the attention's key blocks: where a window's first split starts
    o_strides: BhsStrides = facets("o")
    lse_strides: BhsStrides = facets("lse")
    packed: PackedQueries | None = when(packed)  # the mixed form: o and lse packed
    # attention sinks: each query head's logit joins the merged denominator once (the splits'
    # partials leave it out)
    sinks: Ptr | None = when(lambda v: v.sinks, dtype="fp32", align=4)


@dataclass(frozen=True)
class DecodeCombineVariant(Variant):
    ARGS: ClassVar[type] = DecodeCombineArgs
    THREADS: ClassVar[int] = THREADS
    dtype: str
    head_dim: int
    has_lse: bool
    packed: bool = False  # the mixed form: o and lse (tokens, h, d) packed, from cu_seqlens_q
    # the mixed form, causal: a chunk's row block reads no key past its last query, so each row
    # merges only the splits up to its own position
    causal: bool = False
    # the mixed form with its chunks apart: only sequences of at most this many query rows were
    # split (the paged decode kernel's); the forward kernel wrote the others' rows. 0: all
    decode_rows: int = 0
    sinks: bool = False  # attention sinks (`DecodeCombineArgs.sinks`)

    @property
    def name(self) -> str:
        name = f"sdpa_decode_combine.{self.dtype}.d{self.head_dim}" + (".packed" if self.packed else "")
        name += ".causal" if self.causal else ""
        name += f".decodes_r{self.decode_rows}" if self.decode_rows else ""
        name += ".sinks" if self.sinks else ""
        return name + (".lse" if self.has_lse else "")

    @property
    def tiles(self) -> dict[str, int]:
        if self.decode_rows:
            return {"threads": THREADS, "rows_per_cta": ROWS_PER_CTA}
        return {"threads": THREADS, "split_groups": THREADS // (self.head_dim // VECTOR)}

    @property
    def rows_per_cta(self) -> int:
        return ROWS_PER_CTA if self.decode_rows else 1

    @property
    def grid_rule(self) -> str:
        if self.decode_rows:
            rows = f"ceil(min(s_new * group, {self.decode_rows}) / {ROWS_PER_CTA})"
            return f"({rows}, heads_kv, batch): {ROWS_PER_CTA} rows a CTA, a warp each, the decodes' only"
        return "(s_new * group, heads_kv, batch): one CTA per query row"

    def kernel(self) -> "DecodeCombine":
        return DecodeCombine(self)

    early_start = WAITS_AT_ENTRY  # it may launch during the attention's last wave
    reads_only_the_launch_ahead = True  # the attention's partials (and the plan's lengths and sinks)


class DecodeCombine(Kernel):
    def __init__(self, variant: DecodeCombineVariant):
        super().__init__(variant)
        self.v = variant
        self.dtype = dsl_dtype(variant.dtype)
        self.lanes = variant.head_dim // VECTOR  # threads per split's row
        # splits summed at once: whole groups of `lanes` threads (d=64, 128, 256: all 256 threads;
        # d=96: 10 of 24, and threads 240 on a spare column of `pieces`, summing no split)
        self.groups = THREADS // self.lanes
        self.spare = THREADS % self.lanes != 0
        self.columns = self.groups + 1 if self.spare else self.groups  # of `pieces`

    def prepare(self) -> None:
        if self.v.decode_rows:  # a warp a row: shuffles, no shared memory
            self.smem_bytes = 0
            return
        columns, d = self.columns, self.v.head_dim

        @cute.struct
        class SharedStorage:
            reduce: cute.struct.MemRange[cutlass.Float32, WARPS]
            pieces: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, columns * d], 16]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()

    @cute.kernel
    def kernel(self, args: DecodeCombineArgs):
        # launched early (during the attention's last CTAs): the partials are complete and
        # visible once the attention has finished; nothing global is read before
        cute.arch.griddepcontrol_wait()
        row, head_kv, b = cute.arch.block_idx()
        if cutlass.const_expr(self.v.packed):  # the sequence's own rows: the others have none
            q_start, s_new = packed_span(args.packed.cu_seqlens_q, b, args.packed.tokens, args.s_new)
            rows = s_new * args.group
            if cutlass.const_expr(self.v.decode_rows > 0):  # a chunk's rows are not this launch's
                rows = cutlass.select_(rows > self.v.decode_rows, 0, rows)
                # each sequence's own chunk; one split: the attention kernel wrote its rows
                keys = self._keys(args, b, s_new)
                chunk = sequence_chunk(keys, args.chunk, args.splits, args.block_n)
                rows = cutlass.select_(keys <= chunk, 0, rows)
                tidx, _, _ = cute.arch.thread_idx()
                mine = row * ROWS_PER_CTA + tidx // LANES  # the same in the whole warp
                if mine < rows:
                    self._combine_in_warp(args, mine, head_kv, b, s_new, q_start, keys, chunk, tidx % LANES)
            elif row < rows:
                self._combine(args, row, head_kv, b, s_new, q_start)
        else:
            self._combine(args, row, head_kv, b, args.s_new, None)

    @staticmethod
    def _keys(args: DecodeCombineArgs, b, s_new):
        """The keys sequence b's splits cover: from its origin to its length."""
        length = cute.make_tensor(args.seq_len_kv + b, cute.make_layout(1))[0]
        kv_len = cutlass.min(cutlass.max(length, 0), args.capacity)
        return kv_len - key_origin(kv_len, s_new, args.window_left, args.block_n)

    @cute.jit
    def _combine(self, args: DecodeCombineArgs, row, head_kv, b, s_new, q_start):
        """Query row `row` (token row // group, head row % group of the group) of KV head `head_kv`
        of sequence b, whose `s_new` queries are the buffer's tokens from `q_start` (packed
        queries; None: b's rows of a (b, h, s_new) output)."""
        o_partial, lse_partial, rows, splits, group = (
            args.o_partial,
            args.lse_partial,
            args.rows,
            args.splits,
            args.group,
        )
        o_sb, o_sh, o_ss = args.o_strides.stride_b, args.o_strides.stride_h, args.o_strides.stride_s
        tidx, _, _ = cute.arch.thread_idx()
        d = self.v.head_dim
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        reduce = storage.reduce.get_tensor(cute.make_layout(WARPS))
        pieces = storage.pieces.get_tensor(cute.make_layout((d, self.columns)))

        # split 0's workspace row, and from one split's to the next (the attention kernel's
        # `_partial_index`)
        stride = rows
        first = (cutlass.Int64(b) * args.heads_kv + head_kv) * splits * rows + row
        if cutlass.const_expr(self.v.packed):
            heads_q = args.heads_kv * group
            stride = cutlass.Int64(args.packed.tokens) * heads_q
            first = cutlass.Int64(q_start + row // group) * heads_q + head_kv * group + row % group
        lses = cute.make_tensor(lse_partial + first, cute.make_layout(splits, stride=stride))
        lane, grp = tidx % self.lanes, tidx // self.lanes

        # Loads that do not wait for the length: this thread's first LSE and first O piece (of
        # splits that exist; used only if the sequence has them), beside the length itself.
        length = cute.make_tensor(args.seq_len_kv + b, cute.make_layout(1))[0]
        my_lse = lses[cutlass.min(tidx, splits - 1)]
        my_piece = self._piece(o_partial, first, cutlass.min(grp, splits - 1), stride, lane).load()
        kv_len = cutlass.min(cutlass.max(length, 0), args.capacity)
        keys = kv_len - key_origin(kv_len, s_new, args.window_left, args.block_n)  # what the splits cover
        if cutlass.const_expr(self.v.causal):  # the row's own keys: up to its position
            keys = cutlass.max(keys - (s_new - 1 - row // group), 0)
        active = cutlass.min((keys + args.chunk - 1) // args.chunk, splits)

        # the largest LSE, then the sum of the weights
        largest = cutlass.select_(tidx < active, my_lse, -cutlass.Float32.inf)
        for s in range(tidx + THREADS, active, THREADS):
            largest = cute.arch.fmax(largest, lses[s])
        largest = self._cta_reduce(largest, reduce, tidx, cute.arch.fmax)
        sink, shift = self._sink_and_shift(args, largest, head_kv * group + row % group)
        total = cutlass.Float32(0.0)
        if tidx < active:
            total = cute.math.exp2((my_lse - shift) * LOG2_E, fastmath=True)
        for s in range(tidx + THREADS, active, THREADS):
            total = total + cute.math.exp2((lses[s] - shift) * LOG2_E, fastmath=True)
        total = self._cta_reduce(total, reduce, tidx, lambda a, c: a + c)
        if cutlass.const_expr(self.v.sinks):  # a key with no value: the denominator only, once
            total = total + cute.math.exp2((sink - shift) * LOG2_E, fastmath=True)

        # Σ w_s O_s: thread (lane, grp) sums the 4-float piece `lane` of splits grp, grp + groups, ...
        # (a thread past the whole groups, grp == groups: no split, its spare column unread)
        split = grp
        if cutlass.const_expr(self.spare):
            split = cutlass.select_(grp < self.groups, grp, active)
        acc = cute.make_rmem_tensor(VECTOR, cutlass.Float32)
        acc.fill(0.0)
        if split < active:
            acc.store(my_piece * cute.math.exp2((lses[split] - shift) * LOG2_E, fastmath=True))
        for s in cutlass.range(split + self.groups, active, self.groups, unroll=4):  # the loads overlap
            weight = cute.math.exp2((lses[s] - shift) * LOG2_E, fastmath=True)
            acc.store(acc.load() + self._piece(o_partial, first, s, stride, lane).load() * weight)
        for i in cutlass.range_constexpr(VECTOR):
            pieces[lane * VECTOR + i, grp] = acc[i]
        cute.arch.sync_threads()

        inv = 0.0 if total == 0.0 else cute.arch.rcp_approx(total)
        token, head = row // group, head_kv * group + row % group
        if cutlass.const_expr(self.v.packed):
            token = q_start + token
        at = cutlass.Int64(b) * o_sb + cutlass.Int64(head) * o_sh + cutlass.Int64(token) * o_ss
        out = cute.make_tensor(args.o + at, cute.make_layout(d))
        for first in cutlass.range_constexpr(0, d, THREADS):  # d may be more or fewer than the threads
            col = first + tidx
            if col < d:
                value = cutlass.Float32(0.0)
                for g in cutlass.range_constexpr(self.groups):
                    value = value + pieces[col, g]
                out[col] = (value * inv).to(self.dtype)
        if cutlass.const_expr(self.v.has_lse):
            if tidx == 0:
                lse_strides = args.lse_strides
                at = cutlass.Int64(b) * lse_strides.stride_b + cutlass.Int64(head) * lse_strides.stride_h
                at = at + cutlass.Int64(token) * lse_strides.stride_s
                value = -cutlass.Float32.inf
                if total > 0.0:
                    value = shift + cute.math.log2(total) * LN_2
                cute.make_tensor(args.lse + at, cute.make_layout(1))[0] = value

    @cute.jit
    def _combine_in_warp(self, args: DecodeCombineArgs, row, head_kv, b, s_new, q_start, keys, chunk, lane):
        """Query row `row` of KV head `head_kv` of sequence b (a decode whose rows the attention
        kernel split, `chunk` keys a split over its `keys` keys), merged by one warp: `lane` reads
        the LSE of splits lane, lane + 32, ... and sums the 4-float pieces lane, lane + 32, ... of
        d over every split. Every lane runs the shuffles (a row's warp is whole)."""
        d, group, splits, rows = self.v.head_dim, args.group, args.splits, args.rows
        first = (cutlass.Int64(b) * args.heads_kv + head_kv) * splits * rows + row  # split 0's row
        lses = cute.make_tensor(args.lse_partial + first, cute.make_layout(splits, stride=rows))
        if cutlass.const_expr(self.v.causal):  # the row's own keys: up to its position
            keys = cutlass.max(keys - (s_new - 1 - row // group), 0)
        active = cutlass.min((keys + chunk - 1) // chunk, splits)

        largest = -cutlass.Float32.inf
        for s in cutlass.range(lane, active, LANES):
            largest = cute.arch.fmax(largest, lses[s])
        largest = cute.arch.warp_reduction(largest, cute.arch.fmax)
        sink, shift = self._sink_and_shift(args, largest, head_kv * group + row % group)
        total = cutlass.Float32(0.0)
        for s in cutlass.range(lane, active, LANES):
            total = total + cute.math.exp2((lses[s] - shift) * LOG2_E, fastmath=True)
        total = cute.arch.warp_reduction(total, lambda a, c: a + c)
        if cutlass.const_expr(self.v.sinks):  # a key with no value: the denominator only, once
            total = total + cute.math.exp2((sink - shift) * LOG2_E, fastmath=True)
        inv = 0.0 if total == 0.0 else cute.arch.rcp_approx(total)

        token, head = q_start + row // group, head_kv * group + row % group
        o_strides = args.o_strides
        at = cutlass.Int64(head) * o_strides.stride_h + cutlass.Int64(token) * o_strides.stride_s
        out = cute.make_tensor(args.o + at, cute.make_layout(d))
        pieces = d // VECTOR
        for j in cutlass.range_constexpr((pieces + LANES - 1) // LANES):
            piece = lane + j * LANES
            if piece < pieces:  # d=64: lanes 0-15; d=96: 0-23
                acc = cute.make_rmem_tensor(VECTOR, cutlass.Float32)
                acc.fill(0.0)
                for s in cutlass.range(0, active, 1, unroll=4):  # the loads overlap
                    weight = cute.math.exp2((lses[s] - shift) * LOG2_E, fastmath=True)
                    acc.store(acc.load() + self._piece(args.o_partial, first, s, rows, piece).load() * weight)
                for i in cutlass.range_constexpr(VECTOR):
                    out[piece * VECTOR + i] = (acc[i] * inv).to(self.dtype)
        if cutlass.const_expr(self.v.has_lse):
            if lane == 0:
                lse_strides = args.lse_strides
                at = cutlass.Int64(head) * lse_strides.stride_h + cutlass.Int64(token) * lse_strides.stride_s
                value = -cutlass.Float32.inf
                if total > 0.0:
                    value = shift + cute.math.log2(total) * LN_2
                cute.make_tensor(args.lse + at, cute.make_layout(1))[0] = value

    @cute.jit
    def _sink_and_shift(self, args: DecodeCombineArgs, largest, head):
        """The row's head's sink logit (0 without sinks: a sinks variant's) and the weights'
        shift: the largest of the splits' LSE and the sink, 0 where every one is -inf."""
        sink = cutlass.Float32(0.0)
        if cutlass.const_expr(self.v.sinks):
            sink = cute.make_tensor(args.sinks + head, cute.make_layout(1))[0]
            largest = cute.arch.fmax(largest, sink)
        shift = 0.0 if largest == -cutlass.Float32.inf else largest
        return sink, shift

    def _piece(self, o_partial, first, split, stride, lane):
        """Split `split`'s 4-float piece `lane` of the row's partial O (`stride` rows apart)."""
        at = (first + cutlass.Int64(split) * stride) * self.v.head_dim + lane * VECTOR
        return cute.make_tensor(o_partial + at, cute.make_layout(VECTOR))

    @cute.jit
    def _cta_reduce(self, value, scratch, tidx, combine):
        """`combine` over the CTA's values (one a thread); every thread gets the result."""
        value = cute.arch.warp_reduction(value, combine)
        if tidx % 32 == 0:
            scratch[tidx // 32] = value
        cute.arch.sync_threads()
        result = scratch[0]
        for w in cutlass.range_constexpr(1, WARPS):
            result = combine(result, scratch[w])
        cute.arch.sync_threads()  # the scratch is free again
        return result
