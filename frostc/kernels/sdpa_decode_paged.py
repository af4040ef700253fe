"""Attention over a paged KV cache for sm_90a (decode: a few new query tokens per sequence),
split-KV, at the memory-bandwidth limit.

- Work: one CTA per (key split, KV head and query-row block, sequence), taken in the order
  the hardware starts CTAs with the KV heads fastest (`_work_of`). The query heads that
  share a KV head are processed together (GQA packing): the CTA's rows are the pairs
  (new token t, head g of the group), g fastest, so every K/V page is read once per KV head.
  Rows are at most 64 per CTA (one WGMMA warpgroup); more make more row blocks.
- Split-KV: split s covers keys [s·chunk, (s + 1)·chunk) of its sequence; the plan fixes the
  chunk at build (from the capacities and the SM count). A split past a sequence's length
  exits at once. With one split the CTA writes O (and LSE) itself; with several it writes its
  partial O (normalized, fp32) and LSE (natural log) to the workspace, and the combine kernel
  (`sdpa_decode_combine.py`) merges the sequence's splits. The mixed form's decodes (its chunks
  apart), whose plan serves any mix of lengths, split adaptively: each sequence is cut on the device:
  its keys spread over the splits, each at least `chunk` keys (`sequence_chunk`), so a long
  context takes every split while a short one takes split 0 alone, which writes O and LSE
  itself (the combine leaves that sequence alone).
- Loads: a producer warp (one thread issues) brings K and V in blocks of `block_n` keys through
  TMA into a `stages`-deep ring, box by box: a box is `box_rows` = gcd(page size, block_n) keys
  of one page, so it never crosses a page, by one swizzle atom's row of d (`swizzle_elems`: 64
  elements, 128 bytes; at d=96, whose 192-byte rows take WGMMA's 64-byte swizzle, 32: three
  boxes a row). Pages come from the page table (device memory, read
  a block ahead). The cache is seen through the same "ragged" tensor maps as the variable-length
  prefill kernel: each box is addressed as a tensor of `valid` rows, so rows past the sequence's
  end (and whole boxes past it, or a page id outside the cache) are zero-filled by the TMA unit
  and never read; the mask then removes those keys.
- Consumer warpgroup (128 threads): Q rows loaded with 16-byte loads into the WGMMA layout
  (rows past the CTA's last are zeros), then per block S = Q Kᵀ (WGMMA, fp32), online softmax
  (`OnlineSoftmax`), O += P V with P from registers; S of block j is issued with P V of block
  j - 1 and its softmax runs while P V still runs. Masked: keys at or past the sequence's end,
  and with causal the keys past each new token's diagonal (bottom-right: token t of n sees
  keys < len - n + t + 1).

- A quantized (e4m3) cache: `PagedDecodeScaledCache` at the end of this file; the same producer,
  then four independent consumer warps with warp-level MMAs over registers (its docstring).

Modes the kernel sees (element strides; the innermost head-dim stride is 1, checked at build):
  K, V cache : (page_size, d, h_kv, pages) pages of rows; TMA views ragged like the prefill
               kernel's: (rows, d, h_kv, wrap, start) with start = page · rows_per_page + row
  Q, O       : (b, h_q, s_new, d) at any strides; LSE (b, h_q, s_new)
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.nvgpu import warp as warp_mma
from cutlass.tensor_utils import LayoutEnum
from frost_runtime.dtypes import DTYPES

from frostc.kernels.barriers import Barrier
from frostc.kernels.cache_args import CacheScales, CacheScaleStrides, PackedQueries, head_scales, packed, quantized
from frostc.kernels.interface import (
    F32,
    I32,
    I64,
    BhsStrides,
    Group,
    Kernel,
    Ptr,
    TmaSource,
    TmaTensor,
    Variant,
    abi,
    facets,
    pointer,
    tma,
    when,
)
from frostc.kernels.launch_order import NEW_ROWS_BY_S_NEW, WAITS_FOR_NEW_ROWS
from frostc.kernels.online_softmax import OnlineSoftmax
from frostc.kernels.ragged import RAGGED_EXTENT, RAGGED_ROWS, RAGGED_WRAP
from frostc.kernels.ring import Ring
from frostc.kernels.sdpa_common import (
    COLUMN_LANES,
    LN_2,
    QUAD_LANES,
    KeyRange,
    MaskFlags,
    SoftmaxScales,
    byte_interleave,
    dsl_dtype,
    key_origin,
    sequence_chunk,
    transpose_8x8,
)
from frostc.kernels.sequences import packed_span
from frostc.kernels.wgmma_layouts import c_to_a_layout, mma_rows_by_cols, swizzle_elems, wgmma_rows_by_cols
from frostc.target import SM90A

ROWS = 64  # query rows per CTA: one consumer warpgroup's WGMMA M
BLOCK_N = 64  # keys per pipeline stage
THREADS = 160  # one consumer warpgroup and one producer warp
PRODUCER_WARP = 4
CONSUMER_WARPS = 4
ROWS_SCALED = 16  # over a quantized cache: one m16n8k16 tile of rows, shared by the consumer warps
FEW_ROWS = 8  # ... whose first row half holds 8 rows: a GQA group of up to 8 by one token, of 4 by two
WARP_KEYS = BLOCK_N // CONSUMER_WARPS  # ... each warp taking this many keys of every block
MMA_SHAPE = (16, 8, 16)  # the warp-level MMA (mma.sync) the quantized cache's kernel uses
FEW_ROWS_CTAS_PER_SM = 3


@dataclass(frozen=True)
class DecodeTiles:
    """The named tile parameters of one compiled variant."""

    block_n: int
    stages: int
    box_rows: int  # keys per TMA box: within one page
    ctas_per_sm: int  # the residency the stages were sized for (the split count assumes it)
    rows: int = ROWS  # query rows per CTA

    def as_dict(self) -> dict[str, int]:
        return {
            "rows": self.rows,
            "block_n": self.block_n,
            "stages": self.stages,
            "box_rows": self.box_rows,
            "threads": THREADS,
            "ctas_per_sm": self.ctas_per_sm,
        }


def decode_tiles(head_dim: int, page_size: int, dtype: str, kv_cache_dtype: str, few_rows: bool = False) -> DecodeTiles:
    """Two CTAs per SM where they fit (one streams while the other starts or ends), then as
    many stages as the shared memory holds: Q is 64·d and a stage 2·block_n·d elements. A
    quantized cache's kernel keeps only its ring (Q and the operands live in registers), and
    takes ROWS_SCALED rows per CTA; with few rows (its transposed MMAs: ~100 registers a
    thread) three CTAs fit an SM, whose twelve consumer warps hide each other's latency better
    than eight with six stages each (bench/NOTES.md, decode v14; four CTAs of three stages lost)."""
    quantized = DTYPES[kv_cache_dtype].quantized
    ctas = 2 if head_dim <= 128 else 1
    if quantized and few_rows and head_dim <= 128:
        ctas = FEW_ROWS_CTAS_PER_SM
    budget = SM90A.smem_for(ctas) - 1024  # a KiB for the barriers and alignment
    if not quantized:
        size = DTYPES[dtype].bytes
        stages = min((budget - ROWS * head_dim * size) // (2 * BLOCK_N * head_dim * size), 6)
        return DecodeTiles(BLOCK_N, stages, math.gcd(page_size, BLOCK_N), ctas)
    size = DTYPES[kv_cache_dtype].bytes
    stages = min(budget // (2 * BLOCK_N * head_dim * size), 6)
    # the warps' partial outputs (fp32) are merged in the K ring once every block is read
    assert stages * BLOCK_N * size >= CONSUMER_WARPS * ROWS_SCALED * 4, "merge area over the ring"
    return DecodeTiles(BLOCK_N, stages, math.gcd(page_size, BLOCK_N), ctas, ROWS_SCALED)


# ------------------------------------------------------------------------------ the variant

MMA_DTYPE_OF_SCALED = "fp16"  # e4m3 converts to fp16 exactly in one instruction per pair (bf16: five)
MMA_FINITE_MAX = 65504.0  # fp16's largest finite: Q times the softmax scale saturates there


@dataclass(frozen=True)
class DecodeTensors(Group):
    q: Ptr = pointer()
    o: Ptr = pointer()
    lse: Ptr = pointer("fp32", align=4)  # null without an LSE
    page_table: Ptr = pointer("int32", align=4)
    seq_len_kv: Ptr = pointer("int32", align=4)
    o_partial: Ptr = pointer("fp32")  # split: the partial results (workspace); else null
    lse_partial: Ptr = pointer("fp32", align=4)


@dataclass(frozen=True)
class DecodeSizes(Group):
    batch: I32
    heads_kv: I32
    group: I32
    s_new: I32
    rows: I32  # query rows per (sequence, KV head): s_new * group
    row_blocks: I32  # CTAs over them
    max_pages: I32
    pages: I32
    rows_per_page: I32  # the cache's rows from one page to the next
    chunk: I32  # keys per split (an adaptive split: the fewest)
    splits: I32
    window_left: I32  # -1: no window


@dataclass(frozen=True)
class PagedDecodeArgs:
    """The K and V caches through tensor maps (ragged: each sequence's pages read as rows), the
    rest by pointer; a quantized cache's scales, their strides and the softmax scale (applied to
    Q before its conversion to the MMA's fp16) only in its variants."""

    k: TmaTensor = tma(extents="i32", of="kv_cache_dtype")
    v: TmaTensor = tma(extents="i32", of="kv_cache_dtype")
    tensors: DecodeTensors
    scales: CacheScales | None = when(quantized)
    sizes: DecodeSizes
    q_strides: BhsStrides = facets("q")
    o_strides: BhsStrides = facets("o")
    lse_strides: BhsStrides = facets("lse")
    page_table_stride: I64 = abi("page_table.stride_b")
    scale_strides: CacheScaleStrides | None = when(quantized)
    softmax: SoftmaxScales
    q_scale: F32 | None = when(quantized)
    packed: PackedQueries | None = when(packed)  # the mixed form: q, o and lse packed
    # attention sinks: a float32 logit per query head in each row's denominator (unsplit: here;
    # split: the combine adds it once, the partials leave it out)
    sinks: Ptr | None = when(lambda v: v.sinks, dtype="fp32", align=4)


@dataclass(frozen=True)
class PagedDecodeVariant(Variant):
    """Compile key of the paged attention kernel: declaration facts only (shapes are arguments)."""

    ARGS: ClassVar[type] = PagedDecodeArgs
    THREADS: ClassVar[int] = THREADS
    dtype: str  # Q's and O's
    kv_cache_dtype: str  # the caches': `dtype`, or a quantized one (e4m3) with scales
    head_dim: int
    page_size: int
    causal: bool  # bottom-right: the new tokens are the cache's last
    split: bool  # partial results to the workspace (a combine launch follows)
    has_lse: bool
    window: bool = False  # a sliding window: each token sees window_left keys before its own
    softcap: bool = False  # scores s -> softcap * tanh(s / softcap)
    # a quantized cache's kernel whose query rows per (sequence, KV head) fit an m16n8 tile's 8
    # columns: its MMAs run transposed (keys as rows, no padding rows), three CTAs an SM
    few_rows: bool = False
    # the mixed form: q, o and lse (tokens, h, d) packed, sequence b's queries from cu_seqlens_q,
    # each sequence's own count of them (`s_new` the most); else (b, h, s_new, d)
    packed: bool = False
    # the mixed form with its chunks apart: this kernel takes only the sequences whose query rows
    # fit one row block (decodes, speculative steps), one CTA row each (grid z = batch); the
    # forward kernel over the pages takes the others (`sdpa_fwd_wgmma`, `page_size`)
    chunks_apart: bool = False
    sinks: bool = False  # attention sinks (`PagedDecodeArgs.sinks`); 16-bit caches only

    @property
    def quantized(self) -> bool:
        return quantized(self)

    @property
    def adaptive(self) -> bool:
        """A split of the decodes beside chunks apart: each sequence's chunk from its length on
        the device (`sequence_chunk`), a sequence that fits one split written directly (O, LSE
        and sinks here)."""
        return self.chunks_apart and self.split

    @property
    def final_rows(self) -> bool:
        """Whether this kernel may write O and LSE itself: unsplit, or an adaptive split."""
        return not self.split or self.adaptive

    @property
    def name(self) -> str:
        mask = "causal_br" if self.causal else "full"
        mask += (".local" if self.window else "") + (".softcap" if self.softcap else "")
        kv = f".kv_{self.kv_cache_dtype}" if self.quantized else ""
        kv += ".r8" if self.few_rows else ""
        name = f"sdpa_decode_paged.{self.dtype}{kv}.d{self.head_dim}.p{self.page_size}.{mask}"
        name += ".packed" if self.packed else ""
        name += ".decodes" if self.chunks_apart else ""
        name += ".sinks" if self.sinks and self.final_rows else ""  # a split kernel's partials have none
        name += ".split" if self.split else ""
        return name + (".lse" if self.has_lse and self.final_rows else "")

    @property
    def tile_shape(self) -> DecodeTiles:
        return decode_tiles(self.head_dim, self.page_size, self.dtype, self.kv_cache_dtype, self.few_rows)

    @property
    def tiles(self) -> dict[str, int]:
        return self.tile_shape.as_dict()

    @property
    def grid_rule(self) -> str:
        if self.chunks_apart:
            rule = f"(splits, heads_kv, batch): the sequences of at most {self.tile_shape.rows} query rows"
            if self.adaptive:  # `sequence_chunk`, on the device
                rule += "; each one's keys over the splits, at least `chunk` a split, one split written directly"
            return rule
        if self.packed:  # each sequence's first row block, then the further ones of the chunks
            return f"(splits, heads_kv, batch + min(tokens * group // {self.tile_shape.rows}, further capacity))"
        return f"(splits, heads_kv * ceil(s_new * group / {self.tile_shape.rows}), batch)"

    def kernel(self) -> "PagedDecode":
        return PagedDecodeScaledCache(self) if self.quantized else PagedDecode(self)

    # behind a kv_append into its caches it starts at once; the producer waits before the
    # blocks holding the new rows (every other cache row is the caller's, written before the
    # plan: a row the step writes is read, by any sequence, only as the position it appends)
    early_start = WAITS_FOR_NEW_ROWS
    reads_caches = ("k.tmap", "v.tmap")  # the parameters that read the caches

    @property
    def new_rows(self) -> tuple[str, ...]:
        # the rows it waits before: each sequence's last s_new positions, or with packed queries
        # its own count of them (`packed_span`: cu_seqlens_q, as kv_append's packed form writes)
        return ("seq_len_kv", "cu_seqlens_q") if self.packed else NEW_ROWS_BY_S_NEW


# ------------------------------------------------------------------------------ device helpers


def _query_by_key():
    """An m16n8 accumulator tile ((2 column parities, 2 row halves), 1, 1) whose rows are keys
    and columns query rows, seen as (query, key): a lane's two queries by its two keys."""
    return cute.make_layout((2, 2), stride=(1, 2))


@dataclass(frozen=True)
class Work:
    """What one CTA does: its sequence, KV head, query rows and key range."""

    batch: cutlass.Int32
    head_kv: cutlass.Int32
    row_block: cutlass.Int32
    kv_len: cutlass.Int32  # the sequence's keys (clamped to the capacity)
    capacity: cutlass.Int32  # positions the page table lists (max_pages * page_size)
    key_first: cutlass.Int32  # the split's first key
    blocks: cutlass.Int32  # key blocks of the split that hold keys (0: nothing to do)
    first_new: cutlass.Int32  # the step's first new key (kv_len - s_new): its rows come from kv_append
    # packed queries (the mixed form): the sequence's first token, and the buffer's tokens
    q_start: cutlass.Int32 | None = None
    tokens: cutlass.Int32 | None = None
    # an adaptive split: the sequence's keys fit one split, whose CTA writes O and LSE itself
    direct: cutlass.Boolean | None = None


@dataclass(frozen=True)
class DecodeMask:
    """The kernels' one mask (`KeyRange`, the README's definition) over a decode CTA's rows:
    row r is new token (first_row + r) // group, bottom-right aligned (token t sits at position
    kv_len - s_new + t); causal is window_right = 0, a sliding window is window_left."""

    keys: KeyRange
    s_new: cutlass.Int32
    group: cutlass.Int32
    first_row: cutlass.Int32  # the CTA's first row (rows are (token, head in group), head fastest)

    @staticmethod
    def of(causal: bool, window: bool, window_left, s_new, kv_len, group, first_row) -> "DecodeMask":
        flags = MaskFlags(right=causal, left=window, bottom_right=True)
        return DecodeMask(KeyRange.of(flags, window_left, 0, s_new, kv_len), s_new, group, first_row)

    def needed(self, key0, key_end):
        """Whether any row misses a key of the block [key0, key_end): the first token sees the
        fewest keys at the end, the last one the fewest at the start."""
        if cutlass.const_expr(self.keys.flags.left):
            return (key_end > self.keys.hi(0)) | (key0 < self.keys.lo(self.s_new - 1))
        return key_end > self.keys.hi(0)

    @cute.jit
    def apply(self, c_mn, s_mn, key0, row_mode: int = 0):
        """-inf where a row misses a key: `c_mn` holds each score's (row, key - key0), or with
        `row_mode` 1 its (key - key0, row) (an accumulator whose MMA rows are the keys)."""
        key_mode = 1 - row_mode
        for r in cutlass.range_constexpr(cute.size(s_mn.shape[0])):
            token = (self.first_row + c_mn[r, 0][row_mode]) // self.group
            hi = self.keys.hi(token)
            if cutlass.const_expr(self.keys.flags.left):
                lo = self.keys.lo(token)
                for c in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
                    key = key0 + c_mn[r, c][key_mode]
                    if (key >= hi) | (key < lo):
                        s_mn[r, c] = -cutlass.Float32.inf
            else:
                for c in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
                    if key0 + c_mn[r, c][key_mode] >= hi:
                        s_mn[r, c] = -cutlass.Float32.inf


# ------------------------------------------------------------------------------ the kernel


class PagedDecode(Kernel):
    """One variant's kernel: its tensor maps' host code and its device code."""

    def __init__(self, variant: PagedDecodeVariant):
        super().__init__(variant)
        self.dtype = dsl_dtype(variant.dtype)  # Q's and O's
        self.kv_cache_type = dsl_dtype(variant.kv_cache_dtype)  # what TMA loads
        self.mma_dtype = self.dtype  # the MMAs' operands in shared memory and P
        self.head_dim = variant.head_dim
        self.page_size = variant.page_size
        self.tiles = variant.tile_shape
        # head-dim elements per TMA box row of the 16-bit kernel: a swizzle atom's row, so a box
        # lands in one column of atoms of a stage's tile
        self.d_chunk = swizzle_elems(self.head_dim, self.dtype.width)
        # preferred_smem_carveout: else the DSL asks a GPU for its shared memory per SM
        self.launch_options = dict(min_blocks_per_mp=self.tiles.ctas_per_sm, preferred_smem_carveout=100)

    # ---------------------------------------------------------------- host side
    def prepare(self) -> None:
        self.shared_storage = self._shared_storage()
        self.smem_bytes = self.shared_storage.size_in_bytes()

    @cute.jit
    def tma_atoms(self, args: PagedDecodeArgs) -> dict:
        """TMA atoms and ragged coordinate tensors of the K and V caches: (rows, d, h_kv, wrap,
        start), V viewed d-major to match its shared-memory tile; a box is (box_rows, d_chunk) of
        K, (d_chunk, box_rows) of V. The build also runs this on the CPU to write the plan's tensor
        maps."""
        t = self.tiles
        gK = self._ragged_cache(args.k, args.sizes.heads_kv, divby=8)
        gV = self._ragged_cache(args.v, args.sizes.heads_kv, divby=8, d_major=True)
        k_box, v_box = self._box_layouts()
        op = cpasync.CopyBulkTensorTileG2SOp()
        k_info = cpasync.make_tiled_tma_atom(op, gK, k_box, (t.box_rows, self.d_chunk))
        v_info = cpasync.make_tiled_tma_atom(op, gV, v_box, (self.d_chunk, t.box_rows))
        return {"k": TmaTensor(*k_info), "v": TmaTensor(*v_info)}

    def _ragged_cache(self, cache: TmaSource, heads_kv, divby: int, d_major: bool = False):
        """A cache's pages as ragged rows, (rows, d, h_kv, wrap, start) (`d_major`: (d, rows, ...)):
        a box from row `start` of head h sees the rows before `start` of its extent as out of
        bounds (ragged.py). `divby`: what the row and head strides are a multiple of."""
        _, row_stride, head_stride = (cute.assume(x, divby=divby) for x in cache.strides)
        wrap = cute.assume(RAGGED_WRAP - row_stride, divby=divby)
        modes = (RAGGED_ROWS, self.head_dim, heads_kv, RAGGED_EXTENT, RAGGED_EXTENT)
        strides = (row_stride, 1, head_stride, wrap, row_stride)
        if d_major:
            modes, strides = (modes[1], modes[0], *modes[2:]), (strides[1], strides[0], *strides[2:])
        layout = cute.make_layout(modes, stride=strides)
        return cute.make_tensor(cache.base, layout)

    def _smem_layouts(self):
        """Q (rows, d), K (keys, d, stage), V (d, keys, stage), in WGMMA's swizzles. For each
        `d_chunk`-wide piece of d the keys of a stage are contiguous rows of the swizzle's width,
        so a TMA box of (box_rows, d_chunk) lands in one piece of the tile."""
        return self._mma_layouts(self.tiles.stages)

    def _mma_layouts(self, stages: int):
        """Q, and `stages` of K and V, in the MMA's dtype and swizzles."""
        t = self.tiles
        d = self.head_dim
        sQ = sm90.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (ROWS, t.block_n, d), self.mma_dtype, 1)
        sK = sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (ROWS, t.block_n, d), self.mma_dtype, stages)
        sV = sm90.make_smem_layout_b(LayoutEnum.COL_MAJOR, (ROWS, d, t.block_n), self.mma_dtype, stages)
        return cute.select(sQ, mode=[0, 1]), sK, sV

    def _box_layouts(self):
        """The shared-memory layout of one TMA box of K and of V (a piece of the tiles above)."""
        rows, chunk = self.tiles.box_rows, self.d_chunk
        k_box = sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (ROWS, rows, chunk), self.dtype, 1)
        v_box = sm90.make_smem_layout_b(LayoutEnum.COL_MAJOR, (ROWS, chunk, rows), self.dtype, 1)
        return cute.select(k_box, mode=[0, 1]), cute.select(v_box, mode=[0, 1])

    def _shared_storage(self):
        t = self.tiles
        dtype = self.dtype
        q_elems, k_elems, v_elems = (cute.cosize(x) for x in self._smem_layouts())
        stages = t.stages

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, k_elems], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, v_elems], 1024]
            k_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            v_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]

        limit = SM90A.smem_for(t.ctas_per_sm)
        if SharedStorage.size_in_bytes() > limit:
            raise ValueError(f"{t} needs {SharedStorage.size_in_bytes()} bytes of shared memory, over {limit}")
        return SharedStorage

    def _mmas(self):
        t = self.tiles
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        qk = sm90.make_trivial_tiled_mma(
            self.mma_dtype, self.mma_dtype, k_major, k_major, cutlass.Float32, (1, 1, 1), (ROWS, t.block_n)
        )
        pv = sm90.make_trivial_tiled_mma(
            self.mma_dtype, self.mma_dtype, k_major, mn_major, cutlass.Float32, (1, 1, 1), (ROWS, self.head_dim),
            warpgroup.OperandSource.RMEM,
        )  # fmt: skip
        return qk, pv

    def _pipelines(self, storage):
        """K and V rings: "full" armed by the producer thread with the stage's bytes (every box,
        zero-filled or not, counts whole) and completed by TMA; "empty" takes the consumers."""
        t = self.tiles
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 128)

        def make(bars):
            return pipeline.PipelineTmaAsync.create(
                barrier_storage=bars.data_ptr(),
                num_stages=t.stages,
                producer_group=producer,
                consumer_group=consumers,
                tx_count=t.block_n * self.head_dim * (self.kv_cache_type.width // 8),
                defer_sync=True,
            )

        return make(storage.k_bars), make(storage.v_bars)

    # ---------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, args: PagedDecodeArgs):
        tensors, sizes = args.tensors, args.sizes
        scale_log2, score_scale = args.softmax.scale_log2, args.softmax.score_scale
        # the combine (launched early) may take the SMs' free room as this grid's last CTAs start
        cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        t = self.tiles
        if cutlass.const_expr(self.variant.chunks_apart):
            split, head_kv, b = self._work_of(cute.arch.block_idx(), sizes.heads_kv, sizes.splits)
            row_block = cutlass.Int32(0)
        elif cutlass.const_expr(self.variant.packed):
            split, head_kv, b = self._work_of(cute.arch.block_idx(), sizes.heads_kv, sizes.splits)
            b, row_block = self._row_block_of(b, sizes, args.packed, tidx)
        else:
            split, head_rows, b = self._work_of(cute.arch.block_idx(), sizes.heads_kv * sizes.row_blocks, sizes.splits)

        capacity = sizes.max_pages * self.page_size
        length = cute.make_tensor(tensors.seq_len_kv + b, cute.make_layout(1))[0]
        kv_len = cutlass.min(cutlass.max(length, 0), capacity)
        s_new, rows, q_start = sizes.s_new, sizes.rows, None
        if cutlass.const_expr(self.variant.packed):  # the sequence's own queries
            q_start, s_new = packed_span(args.packed.cu_seqlens_q, b, args.packed.tokens, sizes.s_new)
            rows = s_new * sizes.group
            if cutlass.const_expr(self.variant.chunks_apart):  # a chunk: the forward kernel's
                row_block = cutlass.select_(rows > t.rows, -1, row_block)
        origin = cutlass.Int32(0)
        if cutlass.const_expr(self.variant.window):
            origin = key_origin(kv_len, s_new, sizes.window_left, t.block_n)
        chunk, direct = sizes.chunk, None
        if cutlass.const_expr(self.variant.adaptive):
            chunk = sequence_chunk(kv_len - origin, sizes.chunk, sizes.splits, t.block_n)
            direct = kv_len - origin <= chunk
        key_first = origin + split * chunk
        key_end = cutlass.min(key_first + chunk, kv_len)
        if cutlass.const_expr(self.variant.packed and self.variant.causal):
            # no key past the block's last query: a chunk's early row blocks stop early (the
            # combine reads, for each row, only the splits up to its own position)
            last_token = cutlass.min(((row_block + 1) * t.rows - 1) // sizes.group, s_new - 1)
            key_end = cutlass.min(key_end, kv_len - s_new + last_token + 1)
        blocks = cutlass.max(key_end - key_first + (t.block_n - 1), 0) // t.block_n
        if cutlass.const_expr(not self.variant.packed):
            head_kv, row_block = head_rows // sizes.row_blocks, head_rows % sizes.row_blocks
        work = Work(
            b,
            head_kv,
            row_block,
            kv_len,
            capacity,
            key_first,
            blocks,
            kv_len - s_new,
            q_start,
            args.packed.tokens if cutlass.const_expr(self.variant.packed) else None,
            direct,
        )
        dequant = None
        if cutlass.const_expr(args.scales is not None):
            # K's scale joins the scores' (in the tanh with softcap), V's multiplies O at the end
            k_descale, v_descale = head_scales(args.scales, args.scale_strides, work.head_kv)
            if cutlass.const_expr(self.variant.softcap):
                score_scale = score_scale * k_descale
            else:
                scale_log2 = scale_log2 * k_descale
            dequant = (v_descale, args.q_scale)
        # the first block's page ids do not depend on the length: their loads overlap its load
        pt_row = tensors.page_table + cutlass.Int64(b) * args.page_table_stride
        first_pages = self._block_pages(pt_row, work, 0, sizes.pages)
        # a split past the sequence's end has nothing to add (the combine kernel counts the
        # splits from the lengths); with one split the CTA writes the rows even without keys
        run = (
            work, (args.k.tmap, args.k.extents), (args.v.tmap, args.v.extents), tensors.q, args.q_strides.bhs(),
            (tensors.o, *args.o_strides.bhs()), (tensors.lse, *args.lse_strides.bhs()),
            (tensors.o_partial, tensors.lse_partial), (pt_row, first_pages),
            (sizes.group, s_new, rows, sizes.splits, split, sizes.window_left),
            (sizes.heads_kv, sizes.pages, sizes.rows_per_page), (scale_log2, score_scale, dequant, args.sinks), tidx,
            warp,
        )  # fmt: skip
        if cutlass.const_expr(self.variant.packed):
            # a sequence's query rows fill its first row blocks: the others have nothing to do
            if work.row_block >= 0 and work.row_block * t.rows < rows:
                if cutlass.const_expr(self.variant.adaptive):
                    # one split: split 0 writes the rows even without keys, as an unsplit kernel
                    if blocks > 0 or (direct and split == 0):
                        self._run(*run)
                elif cutlass.const_expr(self.variant.split):
                    if blocks > 0:
                        self._run(*run)
                else:
                    self._run(*run)
        elif cutlass.const_expr(self.variant.split):
            if blocks > 0:
                self._run(*run)
        else:
            self._run(*run)

    @staticmethod
    def _work_of(cta, head_rows: int, splits: int):
        """(split, KV head · row block, sequence) of CTA (x, y, b) of the grid (splits, head_rows,
        batch). The hardware starts CTAs x fastest; taken in that order, consecutive CTAs are
        a sequence's one split over consecutive KV heads, so the heads' CTAs read the same pages
        (each key's heads side by side, in NHD caches) at about the same time rather than a
        split's length apart (−0.5 to −1.8 % on NHD e4m3 caches, bench/NOTES.md decode v16)."""
        x, y, b = cta
        taken = x + y * splits
        return taken // head_rows, taken % head_rows, b

    @cute.jit
    def _row_block_of(self, z, sizes, packed, tidx):
        """(sequence, row block) of grid z in the mixed form's grid (splits, heads_kv, batch +
        further): z < batch is sequence z's first row block (a decode's only one: found with no
        read); the others are, in order, the further row blocks of the sequences that have
        them (a chunk's), found on the device from cu_seqlens_q by a scan each warp makes alike;
        past the last: row block -1, nothing to do."""
        b, row_block = z, cutlass.Int32(0)
        if z >= sizes.batch:
            wanted = z - sizes.batch
            lane = tidx % 32
            b, row_block = cutlass.Int32(-1), cutlass.Int32(-1)
            before = cutlass.Int32(0)  # further row blocks of the sequences of earlier rounds
            for first in range(0, sizes.batch, 32):
                seq = first + lane
                further = cutlass.Int32(0)
                if seq < sizes.batch:
                    _, count = packed_span(packed.cu_seqlens_q, seq, packed.tokens, sizes.s_new)
                    further = cutlass.max((count * sizes.group + self.tiles.rows - 1) // self.tiles.rows - 1, 0)
                inclusive = further
                for offset in cutlass.range_constexpr(5):
                    shifted = cute.arch.shuffle_sync_up(inclusive, offset=1 << offset)
                    inclusive = inclusive + cutlass.select_(lane >= (1 << offset), shifted, 0)
                offset = wanted - (before + inclusive - further)  # into this lane's sequence's
                seq_hit = cutlass.select_(offset >= 0, cutlass.select_(offset < further, seq, -1), -1)
                block_hit = cutlass.select_(offset >= 0, cutlass.select_(offset < further, offset + 1, -1), -1)
                b = cutlass.max(b, cute.arch.warp_redux_sync(seq_hit, "max"))
                row_block = cutlass.max(row_block, cute.arch.warp_redux_sync(block_hit, "max"))
                before = before + cute.arch.shuffle_sync(inclusive, 31)
            b = cutlass.max(b, 0)  # a real sequence's lengths to read; row block -1 does nothing
        return b, row_block

    @cute.jit
    def _run(self, work, k_load, v_load, q, q_strides, o_args, lse_args, partials, page_ids, geometry, extents,
             scales, tidx, warp):  # fmt: skip
        heads_kv, pages, rows_per_page = extents
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        k_pipe, v_pipe = self._pipelines(storage)
        sQ, sK, sV, loaded = self._smem_tensors(storage)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if warp == PRODUCER_WARP:
            if tidx % 32 == 0:
                self._produce(k_pipe, v_pipe, *loaded, k_load, v_load, work, page_ids, pages, rows_per_page)
        else:
            self._consume(k_pipe, v_pipe, sQ, sK, sV, loaded, work, geometry, q, q_strides, tidx, scales, o_args,
                          lse_args, partials, heads_kv)  # fmt: skip

    def _smem_tensors(self, storage):
        """(Q, K, V) as the MMAs read them, and the (K, V) rings TMA writes: the same tiles."""
        sQ_layout, sK_layout, sV_layout = self._smem_layouts()
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        return sQ, sK, sV, (sK, sV)

    # ---------------------------------------------------------------- producer
    def _box_page(self, pt_row, key, pages):
        """The cache page holding `key` (a position the sequence has), or -1 for a page id
        outside the cache (a broken page table: read nothing)."""
        page = cute.make_tensor(pt_row + key // self.page_size, cute.make_layout(1))[0]
        return cutlass.select_(page < pages, cutlass.max(page, -1), -1)

    @cute.jit
    def _produce(self, k_pipe, v_pipe, sK, sV, k_load, v_load, work, page_ids, pages, rows_per_page):
        t = self.tiles
        ring = Ring(t.stages)
        (k_tma, mK), (v_tma, mV) = k_load, v_load
        # each box's page, read one block ahead so the loads overlap the ring's waits
        pt_row, next_pages = page_ids
        for j in range(0, work.blocks, 1):
            block_pages = next_pages
            next_pages = self._block_pages(pt_row, work, cutlass.min(j + 1, work.blocks - 1), pages)
            key0 = work.key_first + j * t.block_n
            stage, phase = ring.at(j)
            blocks = (key0, block_pages, stage, phase)
            if key0 + t.block_n > work.first_new:
                # the block holds rows the step appends: launched early, this kernel may run
                # beside kv_append, so wait until it has finished (once; a no-op otherwise)
                cute.arch.griddepcontrol_wait()
            self._load_block(k_pipe, k_tma, mK, sK, blocks, work, rows_per_page, keys_mode=0)
            self._load_block(v_pipe, v_tma, mV, sV, blocks, work, rows_per_page, keys_mode=1)

    @cute.jit
    def _load_block(self, pipe, tma, mX, sX, block, work, rows_per_page, keys_mode: int):
        """One K or V block into its ring stage, box by box: each box is `box_rows` keys of one
        page (ragged: rows the sequence lacks are zero-filled) by `d_chunk` of d. `keys_mode`:
        where the keys are in the tiles, 0 for K's (keys, d), 1 for V's (d, keys)."""
        t = self.tiles
        chunk = self.d_chunk
        key0, block_pages, stage, phase = block
        pipe.sync_object_empty.wait(stage, phase ^ 1)
        pipe.sync_object_full.arrive(stage, None)
        for i in cutlass.range_constexpr(t.block_n // t.box_rows):
            rows, valid = self._box_rows(mX, block_pages[i], key0 + i * t.box_rows, work, rows_per_page)
            for c in cutlass.range_constexpr(self.head_dim // chunk):
                if cutlass.const_expr(keys_mode == 0):
                    g_box = cute.local_tile(
                        cute.domain_offset((RAGGED_ROWS - valid, 0), rows), (t.box_rows, chunk), (0, c)
                    )
                    s_box = cute.local_tile(sX[None, None, stage], (t.box_rows, chunk), (i, c))
                else:
                    g_box = cute.local_tile(
                        cute.domain_offset((0, RAGGED_ROWS - valid), rows), (chunk, t.box_rows), (c, 0)
                    )
                    s_box = cute.local_tile(sX[None, None, stage], (chunk, t.box_rows), (c, i))
                self._copy_box(tma, s_box, g_box, pipe.sync_object_full.get_barrier(stage))

    def _block_pages(self, pt_row, work, j, pages):
        """The page of each box of key block j, from the page table (positions past the capacity
        read the last entry: within the table; boxes past the sequence's end load nothing)."""
        t = self.tiles
        result = []
        for i in range(t.block_n // t.box_rows):
            key = cutlass.min(work.key_first + j * t.block_n + i * t.box_rows, work.capacity - 1)
            result.append(self._box_page(pt_row, key, pages))
        return tuple(result)

    def _box_rows(self, mX, page, key, work, rows_per_page):
        """The box from `key` on `page`: its rows in the ragged map, and how many of them the
        sequence has (0 past its end or on a bad page id; the rest arrive as zeros)."""
        valid = cutlass.max(cutlass.min(work.kv_len - key, self.tiles.box_rows), 0)
        readable, valid = cutlass.max(page, 0), cutlass.select_(page < 0, 0, valid)  # a bad id: page 0, no valid rows
        start = readable * rows_per_page + key % self.page_size + valid
        return mX[None, None, work.head_kv, RAGGED_ROWS, start], valid

    @cute.jit
    def _copy_box(self, tma, s_box, g_box, barrier):
        s_part, g_part = cpasync.tma_partition(tma, 0, cute.make_layout(1), cute.group_modes(s_box, 0, 2),
                                               cute.group_modes(g_box, 0, 2))  # fmt: skip
        cute.copy(tma, g_part, s_part, tma_bar_ptr=barrier)

    # ---------------------------------------------------------------- consumer
    @cute.jit
    def _load_q(self, sQ, q, q_strides, work, group, rows, tidx):
        """The CTA's query rows (token t, head g of the group; g fastest) into shared memory in
        16-byte pieces; rows past the last are zeros (their results are never stored)."""
        q_sb, q_sh, q_ss = (cute.assume(x, divby=8) for x in q_strides)
        elems = 8
        per_row = self.head_dim // elems
        for i in cutlass.range_constexpr(ROWS * per_row // 128):
            piece = i * 128 + tidx
            r, col = piece // per_row, (piece % per_row) * elems
            row = work.row_block * ROWS + r
            vec = cute.make_rmem_tensor(elems, self.dtype)
            vec.fill(0.0)
            if row < rows:
                token, g = row // group, row % group
                if cutlass.const_expr(self.variant.packed):
                    token = work.q_start + token
                offset = cutlass.Int64(work.batch) * q_sb + cutlass.Int64(work.head_kv * group + g) * q_sh
                offset = offset + cutlass.Int64(token) * q_ss + col
                src = cute.make_tensor(q + cute.assume(offset, divby=8), cute.make_layout(elems))
                vec.store(src.load())
            dst = cute.local_tile(sQ, (1, elems), (r, col // elems))
            dst.store(cute.make_tensor(vec.iterator, cute.make_layout((1, elems))).load())
        cute.arch.fence_proxy("async.shared", space="cta")
        pipeline.NamedBarrier(barrier_id=Barrier.DECODE_Q, num_threads=128).arrive_and_wait()

    @cute.jit
    def _consume(self, k_pipe, v_pipe, sQ, sK, sV, loaded, work, geometry, q, q_strides, tidx, scales, o_args,
                 lse_args, partials, heads_kv):  # fmt: skip
        t = self.tiles
        group, s_new, rows, splits, split, window_left = geometry
        scale_log2, score_scale, _, sinks = scales  # the third: a quantized cache's (PagedDecodeScaledCache)
        ring = Ring(t.stages)
        qk_mma, pv_mma = self._mmas()
        qk_mma.set(warpgroup.Field.ACCUMULATE, True)
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)
        qk_thr, pv_thr = qk_mma.get_slice(tidx), pv_mma.get_slice(tidx)
        self._load_q(sQ, q, q_strides, work, group, rows, tidx)
        tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ))
        tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, N, K, stage)
        tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, N, K, stage)
        acc_O = pv_thr.make_fragment_C(pv_thr.partition_shape_C((ROWS, self.head_dim)))
        acc_O.fill(0.0)
        softmax = OnlineSoftmax.create(cute.size(wgmma_rows_by_cols(acc_O).shape[0]), scale_log2)
        softmax.reset()
        s_shape = qk_thr.partition_shape_C((ROWS, t.block_n))
        rP = cute.make_rmem_tensor(c_to_a_layout(qk_thr.make_fragment_C(s_shape).layout), self.mma_dtype)
        v = self.variant
        mask = DecodeMask.of(v.causal, v.window, window_left, s_new, work.kv_len, group, work.row_block * ROWS)
        tiles = (sK, sV, loaded)

        if work.blocks > 0:
            # step j issues S_j = Q K_jᵀ with O += P_{j-1} V_{j-1}; softmax(S_j) runs under P V
            acc_S = qk_thr.make_fragment_C(s_shape)
            acc_S.fill(0.0)
            k_tile, _ = self._operands(k_pipe, v_pipe, (0, 0), None, tiles, tidx)
            warpgroup.fence()
            self._gemm_qk(qk_mma, acc_S, tSrQ, tSrK, k_tile)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            self._release(k_pipe, 0)
            self._scores(qk_thr, acc_S, softmax, mask, work.key_first, score_scale)
            cute.make_tensor(rP.iterator, acc_S.layout).store(acc_S.load().to(self.mma_dtype))
            for j in range(1, work.blocks, 1):
                stage, phase = ring.at(j)
                prev_stage, prev_phase = ring.at(j - 1)
                acc_S = qk_thr.make_fragment_C(s_shape)
                acc_S.fill(0.0)
                k_tile, v_tile = self._operands(k_pipe, v_pipe, (stage, phase), (prev_stage, prev_phase), tiles, tidx)
                warpgroup.fence()
                self._gemm_qk(qk_mma, acc_S, tSrQ, tSrK, k_tile)
                warpgroup.commit_group()
                self._gemm_pv(pv_mma, acc_O, rP, tOrV, v_tile)
                warpgroup.commit_group()
                warpgroup.wait_group(1)  # S_j is ready; P V may still run
                self._release(k_pipe, stage)
                self._scores(qk_thr, acc_S, softmax, mask, work.key_first + j * t.block_n, score_scale)
                warpgroup.wait_group(0)
                self._release(v_pipe, prev_stage)
                softmax.rescale(wgmma_rows_by_cols(acc_O))
                cute.make_tensor(rP.iterator, acc_S.layout).store(acc_S.load().to(self.mma_dtype))
            last_stage, last_phase = ring.at(work.blocks - 1)
            _, v_tile = self._operands(k_pipe, v_pipe, None, (last_stage, last_phase), tiles, tidx)
            warpgroup.fence()
            self._gemm_pv(pv_mma, acc_O, rP, tOrV, v_tile)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            self._release(v_pipe, last_stage)

        sink_of = None  # each row's head's sink where this CTA writes O: it joins the denominator here
        if cutlass.const_expr(self.variant.sinks and self.variant.final_rows):
            sink_of = self._row_sinks(pv_thr, work, group, sinks)
        softmax.normalize(wgmma_rows_by_cols(acc_O), None, sink_of)  # no keys: O = 0, LSE = -inf (or the sink)
        self._epilogue(pv_thr, acc_O, softmax, work, geometry, o_args, lse_args, partials, heads_kv)

    def _row_sinks(self, pv_thr, work, group, sinks):
        """Row r of this thread's accumulator -> its query head's sink logit (the rows of a
        (sequence, KV head) are its tokens times the group's heads: head_kv · group + row % group)."""
        c_mn = wgmma_rows_by_cols(pv_thr.partition_C(cute.make_identity_tensor((ROWS, self.head_dim))))

        def sink_of(r):
            row = work.row_block * ROWS + c_mn[r, 0][0]
            sink = cute.make_tensor(sinks + (work.head_kv * group + row % group), cute.make_layout(1))[0]
            if cutlass.const_expr(self.variant.adaptive):  # a partial leaves it out (a sink of -inf adds 0)
                sink = cutlass.select_(work.direct, sink, -cutlass.Float32.inf)
            return sink

        return sink_of

    @cute.jit
    def _operands(self, k_pipe, v_pipe, k_at, v_at, tiles, tidx):
        """Wait for this step's K block (`k_at`: its (stage, phase) in the ring, or None) and V
        block; the stage of each in the MMAs' tiles (here: the ring's own)."""
        k_tile, v_tile = 0, 0
        if cutlass.const_expr(k_at is not None):
            k_pipe.sync_object_full.wait(k_at[0], k_at[1])
            k_tile = k_at[0]
        if cutlass.const_expr(v_at is not None):
            v_pipe.sync_object_full.wait(v_at[0], v_at[1])
            v_tile = v_at[0]
        return k_tile, v_tile

    def _release(self, pipe, stage):
        """The MMAs are done with a ring stage: the producer may refill it."""
        pipe.sync_object_empty.arrive(stage, None)

    @cute.jit
    def _gemm_qk(self, qk_mma, acc_S, tSrQ, tSrK, stage):
        for kk in cutlass.range_constexpr(cute.size(tSrQ.shape[2])):
            cute.gemm(qk_mma, acc_S, tSrQ[None, None, kk], tSrK[None, None, kk, stage], acc_S)

    @cute.jit
    def _gemm_pv(self, pv_mma, acc_O, rP, tOrV, stage):
        for kk in cutlass.range_constexpr(cute.size(rP.shape[2])):
            cute.gemm(pv_mma, acc_O, rP[None, None, kk], tOrV[None, None, kk, stage], acc_O)

    @cute.jit
    def _scores(self, qk_thr, acc_S, softmax, mask, key0, score_scale):
        """S -> softcap (scale / softcap inside the tanh, softcap * log2(e) in the softmax's
        scale), mask where some row misses a key of the block, online softmax."""
        if cutlass.const_expr(self.variant.softcap):
            acc_S.store(cute.math.tanh(acc_S.load() * score_scale, fastmath=True))
        s_mn = wgmma_rows_by_cols(acc_S)
        if mask.needed(key0, key0 + self.tiles.block_n):
            c_mn = wgmma_rows_by_cols(qk_thr.partition_C(cute.make_identity_tensor((ROWS, self.tiles.block_n))))
            mask.apply(c_mn, s_mn, key0)
            softmax.update(s_mn)
        else:
            softmax.update(s_mn)

    def _partial_index(self, work, heads_kv, group, splits, split, rows, row):
        """The workspace row of query row `row`'s partial result from split `split`: (sequence, KV
        head, split, row) with a fixed count of rows per sequence; with packed queries, whose
        sequences have rows of their own, (split, token, query head) over the buffer's tokens
        (the combine kernel reads the same); with the chunks apart, a sequence's rows fit one row
        block, so (sequence, KV head, split, row) with a row block's rows per sequence (a serving
        bucket's thousands of tokens hold at most a row block's queries of each decode)."""
        if cutlass.const_expr(self.variant.packed and not self.variant.chunks_apart):
            token = cutlass.Int64(work.q_start + row // group)
            return (
                (cutlass.Int64(split) * work.tokens + token) * (heads_kv * group) + work.head_kv * group + row % group
            )
        if cutlass.const_expr(self.variant.chunks_apart):
            rows = self.tiles.rows
        return ((cutlass.Int64(work.batch) * heads_kv + work.head_kv) * splits + split) * rows + row

    @cute.jit
    def _epilogue(self, pv_thr, acc_O, softmax, work, geometry, o_args, lse_args, partials, heads_kv):
        """Rows of this CTA that exist: O and LSE into the caller's tensors (one split, or an
        adaptive split's sequence that fits one), or the split's normalized O (fp32) and LSE into
        the workspace for the combine kernel."""
        group, s_new, rows, splits, split, _ = geometry
        o_mn = wgmma_rows_by_cols(acc_O)
        c_mn = wgmma_rows_by_cols(pv_thr.partition_C(cute.make_identity_tensor((ROWS, self.head_dim))))
        quad_leader = cute.arch.thread_idx()[0] % 4 == 0
        for r in cutlass.range_constexpr(cute.size(o_mn.shape[0])):
            row = work.row_block * ROWS + c_mn[r, 0][0]
            if row < rows:
                if cutlass.const_expr(self.variant.adaptive):
                    if work.direct:
                        self._store_row(o_mn, c_mn, r, row, softmax, work, group, o_args, lse_args, quad_leader)
                    else:
                        index = self._partial_index(work, heads_kv, group, splits, split, rows, row)
                        self._store_partial(o_mn, c_mn, r, index, softmax, partials, quad_leader)
                elif cutlass.const_expr(self.variant.split):
                    index = self._partial_index(work, heads_kv, group, splits, split, rows, row)
                    self._store_partial(o_mn, c_mn, r, index, softmax, partials, quad_leader)
                else:
                    self._store_row(o_mn, c_mn, r, row, softmax, work, group, o_args, lse_args, quad_leader)

    @cute.jit
    def _store_partial(self, o_mn, c_mn, r, index, softmax, partials, quad_leader):
        """Row r's normalized O (fp32) and LSE into the workspace's row `index`."""
        o_partial, lse_partial = partials
        out = cute.make_tensor(o_partial + index * self.head_dim, cute.make_layout(self.head_dim))
        for c in cutlass.range_constexpr(cute.size(o_mn.shape[1])):
            out[c_mn[r, c][1]] = o_mn[r, c]
        if quad_leader:
            cute.make_tensor(lse_partial + index, cute.make_layout(1))[0] = softmax.lse(r)

    @cute.jit
    def _store_row(self, o_mn, c_mn, r, row, softmax, work, group, o_args, lse_args, quad_leader):
        """Row r (query row `row`: token row // group, head row % group of the group) into O, and
        its LSE (with the sink, where the variant has them) into the caller's LSE."""
        token, head = row // group, work.head_kv * group + row % group
        if cutlass.const_expr(self.variant.packed):
            token = work.q_start + token
        o, o_sb, o_sh, o_ss = o_args
        offset = cutlass.Int64(work.batch) * o_sb + cutlass.Int64(head) * o_sh + cutlass.Int64(token) * o_ss
        out = cute.make_tensor(o + offset, cute.make_layout(self.head_dim))
        for c in cutlass.range_constexpr(cute.size(o_mn.shape[1])):
            out[c_mn[r, c][1]] = o_mn[r, c].to(self.dtype)
        if cutlass.const_expr(self.variant.has_lse):
            lse, lse_sb, lse_sh, lse_ss = lse_args
            if quad_leader:
                at = cutlass.Int64(work.batch) * lse_sb + cutlass.Int64(head) * lse_sh
                at = at + cutlass.Int64(token) * lse_ss
                cute.make_tensor(lse + at, cute.make_layout(1))[0] = softmax.lse(r, self.variant.sinks)


# ------------------------------------------------------------------------------ a quantized cache


class PagedDecodeScaledCache(PagedDecode):
    """The kernel over a quantized (e4m3) cache, whose element x holds value x * scale (float32
    scales per tensor or per KV head, device tensors).

    Not the bf16 kernel's WGMMA schedule: at a decode's few rows (a GQA group of 4 to 8 by one
    new token) a 64-row WGMMA spends 90 % of its MMAs, exponentials and shared-memory reads on
    padding, and its B operands must sit in shared memory as fp16: converting each e4m3 block
    there tripled the block's shared-memory traffic and serialized the conversion with the MMAs
    (51 % of the read ceiling, bench/NOTES.md "decode v4"). Here every consumer warp works on
    its own: it takes 16 of each block's 64 keys, reads its K and V rows from the TMA ring
    straight into registers, converts them there (e4m3 to fp16 is exact, one instruction per
    pair) and runs warp-level m16n8k16 MMAs over the CTA's 16 rows, with its own online softmax.
    The four warps' (max, sum, O) merge in shared memory at the end.

    Fragments (PTX m16n8k16; quad = lane / 4, c = lane % 4): the head dim is permuted so that
    each thread's operand elements are contiguous bytes of one cache row (the dot products do
    not care which order d is summed in, as long as Q and K agree; O's columns are put back when
    stored):
    - S = Q Kᵀ: thread c's k-elements of k-step kk are d = (d/4)·c + 4·kk + (0..3), for Q
      (registers, loaded once) and for K (row `key` of the warp's 16, one (d/4)-byte load);
    - O = P V: P is S's accumulator; n-tile dt's column `quad` is d = (d/8)·quad + dt, so a
      thread's V elements are one (d/8)-byte piece of each of its 4 keys' rows.
    Q is multiplied by the softmax scale and converted to fp16 (saturating at 65504); K's scale
    multiplies the scores, V's the output.

    With at most 8 query rows (`few_rows`: a GQA group of up to 8 by one token) half of each
    m16 tile would be padding; there the MMAs run transposed (`_consume`): the warp's
    16 keys are the rows and the query rows the n8 columns, half the MMAs and O registers."""

    def __init__(self, variant: PagedDecodeVariant):
        super().__init__(variant)
        self.mma_dtype = dsl_dtype(MMA_DTYPE_OF_SCALED)

    @cute.jit
    def tma_atoms(self, args: PagedDecodeArgs) -> dict:
        """Both caches seen like K in the base kernel, (rows, d, h_kv, wrap, start), a box being
        (box_rows, d) of plain rows: the warps read them into registers."""
        t = self.tiles
        d = self.head_dim
        gK = self._ragged_cache(args.k, args.sizes.heads_kv, divby=16)
        gV = self._ragged_cache(args.v, args.sizes.heads_kv, divby=16)
        box = cute.make_layout((t.box_rows, d), stride=(d, 1))
        op = cpasync.CopyBulkTensorTileG2SOp()
        k_info = cpasync.make_tiled_tma_atom(op, gK, box, (t.box_rows, d))
        v_info = cpasync.make_tiled_tma_atom(op, gV, box, (t.box_rows, d))
        return {"k": TmaTensor(*k_info), "v": TmaTensor(*v_info)}

    def _ring_layout(self):
        """The cache's ring: `stages` blocks of (block_n, d) plain rows."""
        t = self.tiles
        d = self.head_dim
        return cute.make_layout((t.block_n, d, t.stages), stride=(d, 1, t.block_n * d))

    def _shared_storage(self):
        t = self.tiles
        ring_elems = cute.cosize(self._ring_layout())
        stages = t.stages
        cache = self.kv_cache_type
        stats = CONSUMER_WARPS * ROWS_SCALED

        @cute.struct
        class SharedStorage:
            ringK: cute.struct.Align[cute.struct.MemRange[cache, ring_elems], 1024]
            ringV: cute.struct.Align[cute.struct.MemRange[cache, ring_elems], 1024]
            k_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            v_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            row_max: cute.struct.MemRange[cutlass.Float32, stats]  # each warp's, log2 units
            row_sum: cute.struct.MemRange[cutlass.Float32, stats]

        limit = SM90A.smem_for(t.ctas_per_sm)
        if SharedStorage.size_in_bytes() > limit:
            raise ValueError(f"{t} needs {SharedStorage.size_in_bytes()} bytes of shared memory, over {limit}")
        return SharedStorage

    def _smem_tensors(self, storage):
        """No operand tiles: the rings, and the merge's statistics and O (fp32, in the K ring)."""
        ring = self._ring_layout()
        d = self.head_dim
        stats = cute.make_layout((ROWS_SCALED, CONSUMER_WARPS))
        merge = (
            storage.row_max.get_tensor(stats),
            storage.row_sum.get_tensor(stats),
            cute.make_tensor(
                cute.recast_ptr(storage.ringK.data_ptr(), dtype=cutlass.Float32),
                cute.make_layout((ROWS_SCALED, d, CONSUMER_WARPS), stride=(d, 1, ROWS_SCALED * d)),
            ),
        )
        return None, None, None, (storage.ringK.get_tensor(ring), storage.ringV.get_tensor(ring), merge)

    @cute.jit
    def _produce(self, k_pipe, v_pipe, sK, sV, merge, k_load, v_load, work, page_ids, pages, rows_per_page):
        # named, not super(): the DSL's rewrite of a jit function loses super()'s class cell, and a
        # subclass's call would come back here
        PagedDecode._produce(self, k_pipe, v_pipe, sK, sV, k_load, v_load, work, page_ids, pages, rows_per_page)

    @cute.jit
    def _load_block(self, pipe, tma, mX, sX, block, work, rows_per_page, keys_mode: int):
        """One K or V block into its ring stage, box by box: `box_rows` keys of one page (ragged:
        rows the sequence lacks are zero-filled) by the whole head dim."""
        t = self.tiles
        key0, block_pages, stage, phase = block
        pipe.sync_object_empty.wait(stage, phase ^ 1)
        pipe.sync_object_full.arrive(stage, None)
        for i in cutlass.range_constexpr(t.block_n // t.box_rows):
            rows, valid = self._box_rows(mX, block_pages[i], key0 + i * t.box_rows, work, rows_per_page)
            g_box = cute.local_tile(
                cute.domain_offset((RAGGED_ROWS - valid, 0), rows), (t.box_rows, self.head_dim), (0, 0)
            )
            s_box = cute.local_tile(sX[None, None, stage], (t.box_rows, self.head_dim), (i, 0))
            self._copy_box(tma, s_box, g_box, pipe.sync_object_full.get_barrier(stage))

    # ---------------------------------------------------------------- consumer warps
    @cute.jit
    def _consume(self, k_pipe, v_pipe, sQ, sK, sV, loaded, work, geometry, q, q_strides, tidx, scales, o_args,
                 lse_args, partials, heads_kv):  # fmt: skip
        """Each warp's 16 keys of every block: S, the online softmax, O += P V, then the warps'
        merge. Two forms of the MMAs (`few_rows` picks):
        - query rows as the m16 rows (S = Q Kᵀ, O = P V), for up to 16 rows a CTA;
        - at most 8 query rows: transposed, Sᵀ = K Qᵀ and Oᵀ = Vᵀ Pᵀ, so the warp's 16 keys are
          the m16 rows and the query rows the n8 columns: no padding rows, half the MMAs and half
          the O registers (bench/NOTES.md, decode v14). Sᵀ: A = the warp's K rows (keys quad,
          quad + 8), B = Q row `quad`, both taking d = (d/4)·pair + 4·kk + (0..3) in k-step kk;
          the softmax per column (query 2·pair + parity), reduced over the lanes of a pair class;
          Oᵀ: A = Vᵀ, m-tile mt's rows quad and quad + 8 being d = (d/8)·quad + 2·mt + (0, 1)
          (the bytes `_v_fragment` loads), B = Pᵀ: Sᵀ's fp16 halves transposed by movmatrix,
          8 keys at a time. A thread ends with columns 2·pair, + 1 of O at d (d/8)·quad onward."""
        t = self.tiles
        d = self.head_dim
        group, s_new, rows, splits, split, window_left = geometry
        scale_log2, score_scale, dequant, _ = scales  # no sinks over a quantized cache (the op refuses them)
        ringK, ringV, merge = loaded
        warp, lane = tidx // 32, tidx % 32
        quad, pair = lane // 4, lane % 4
        by_keys = self.variant.few_rows
        mma = cute.make_tiled_mma(cute.make_mma_atom(warp_mma.MmaF16BF16Op(self.mma_dtype, cutlass.Float32, MMA_SHAPE)))
        if cutlass.const_expr(by_keys):
            rQ = self._q_operand_b(q, q_strides, work, group, rows, quad, pair, dequant[1])
        else:
            rQ = self._q_fragment(q, q_strides, work, group, rows, quad, pair, dequant[1])
        acc_O, o_rows = self._output_accumulator()
        # two rows a thread: quad and quad + 8, or (keys as rows) queries 2·pair and 2·pair + 1
        softmax = OnlineSoftmax.create(2, scale_log2, lanes=COLUMN_LANES if by_keys else QUAD_LANES)
        softmax.reset()
        v = self.variant
        first_row = 0 if by_keys else work.row_block * ROWS_SCALED
        mask = DecodeMask.of(v.causal, v.window, window_left, s_new, work.kv_len, group, first_row)
        coords = self._score_coordinates(mma, lane)  # each score's (row, key) in the warp's tile
        ring = Ring(t.stages)
        for j in range(0, work.blocks, 1):
            stage, phase = ring.at(j)
            key0 = work.key_first + j * t.block_n + warp * WARP_KEYS
            k_pipe.sync_object_full.wait(stage, phase)
            acc_S = self._block_scores(mma, ringK[None, None, stage], warp, quad, pair, rQ)
            # V's loads and conversions now, to overlap the MMAs and the softmax (at d 256 its
            # 64 registers more would spill: after the softmax there)
            if cutlass.const_expr(d <= 128):
                v_pipe.sync_object_full.wait(stage, phase)
                rV = self._value_operand(ringV[None, None, stage], warp, quad, pair)
            if cutlass.const_expr(v.softcap):
                acc_S.store(cute.math.tanh(acc_S.load() * score_scale, fastmath=True))
            s_rows = self._scores_by_row(acc_S)
            if mask.needed(key0, key0 + WARP_KEYS):
                mask.apply(coords, s_rows, key0, row_mode=1 if by_keys else 0)
            if softmax.update(s_rows):  # a reference max moved (rarely: see OnlineSoftmax.update)
                softmax.rescale(o_rows)
            rP = self._probability_operand(acc_S)
            if cutlass.const_expr(d > 128):
                v_pipe.sync_object_full.wait(stage, phase)
                rV = self._value_operand(ringV[None, None, stage], warp, quad, pair)
            if cutlass.const_expr(by_keys):
                cute.gemm(mma, acc_O, rV, rP, acc_O)
            else:
                cute.gemm(mma, acc_O, rP, rV, acc_O)
            self._release_reads(k_pipe, v_pipe, stage)
        if cutlass.const_expr(by_keys):
            self._merge_by_keys(o_rows, softmax, merge, warp, quad, pair, dequant[0])
        else:
            self._merge(acc_O, softmax, merge, warp, quad, pair, dequant[0])
        self._store(merge, work, geometry, o_args, lse_args, partials, heads_kv, tidx)

    def _output_accumulator(self):
        """O's accumulator and its (rows, d) view: m16n8 tiles over d (rows as M), or with keys
        as rows Oᵀ's m-tiles over d, a lane's two query columns by its 2·(d/16) d's."""
        d = self.head_dim
        if self.variant.few_rows:
            acc_O = cute.make_rmem_tensor(((2, 2), d // 16, 1), cutlass.Float32)
            acc_O.fill(0.0)
            return acc_O, cute.make_tensor(acc_O.iterator, cute.make_layout((2, (2, d // 16)), stride=(1, (2, 4))))
        acc_O = cute.make_rmem_tensor(((2, 2), 1, d // 8), cutlass.Float32)
        acc_O.fill(0.0)
        return acc_O, mma_rows_by_cols(acc_O)

    def _score_coordinates(self, mma, lane):
        """Each score's (row, key - key0) in the warp's tile as `_scores_by_row` sees them; with
        keys as rows its (key - key0, row) (DecodeMask.apply's `row_mode` 1)."""
        if self.variant.few_rows:
            c_kq = mma.get_slice(lane).partition_C(cute.make_identity_tensor((WARP_KEYS, 8)))
            return cute.make_tensor(c_kq.iterator, cute.composition(c_kq.layout, _query_by_key()))
        return mma_rows_by_cols(mma.get_slice(lane).partition_C(cute.make_identity_tensor((ROWS_SCALED, WARP_KEYS))))

    @cute.jit
    def _block_scores(self, mma, tile, warp, quad, pair, rQ):
        """The warp's scores of a ring stage's K rows (fp32 accumulator)."""
        if cutlass.const_expr(self.variant.few_rows):
            return self._scores_by_keys(mma, self._k_operand_a(tile, warp, quad, pair), rQ)
        return self._scores_of(mma, rQ, self._k_fragment(tile, warp, quad, pair))

    @cute.jit
    def _value_operand(self, tile, warp, quad, pair):
        if cutlass.const_expr(self.variant.few_rows):
            return self._vt_operand_a(tile, warp, quad, pair)
        return self._v_fragment(tile, warp, quad, pair)

    def _scores_by_row(self, acc_S):
        """The scores as (query rows, keys)."""
        if self.variant.few_rows:
            return cute.make_tensor(acc_S.iterator, _query_by_key())
        return mma_rows_by_cols(acc_S)

    @cute.jit
    def _probability_operand(self, acc_S):
        """P (fp16) as O's MMA takes it: A for O = P V (the accumulator's layout), or B = Pᵀ."""
        if cutlass.const_expr(self.variant.few_rows):
            return self._pt_operand_b(acc_S)
        rP = cute.make_rmem_tensor(((2, 2, 2), 1, 1), self.mma_dtype)
        cute.make_tensor(rP.iterator, acc_S.layout).store(acc_S.load().to(self.mma_dtype))
        return rP

    @cute.jit
    def _q_operand_b(self, q, q_strides, work, group, rows, quad, pair, q_scale):
        """Qᵀ as the B operand of Sᵀ = K Qᵀ, ((2, 2), 1, d/16) fp16: column `quad` is query row
        quad (zeros past the last), its elements d = (d/4)·pair + 4·kk + (0..3). Scaled by
        `q_scale`, saturating at fp16's largest finite."""
        wide = self._q_piece(q, q_strides, work, group, rows, quad, pair, q_scale)
        layout = cute.make_layout(((2, 2), 1, self.head_dim // 16), stride=((1, 2), 0, 4))
        return cute.make_tensor(wide.iterator, layout)

    @cute.jit
    def _q_piece(self, q, q_strides, work, group, rows, row, pair, q_scale):
        """Query row `row`'s d/4 elements from (d/4)·pair, times `q_scale`, in fp16 (saturating
        at its largest finite; zeros for a row past the last)."""
        span = self.head_dim // 4
        q_sb, q_sh, q_ss = (cute.assume(x, divby=8) for x in q_strides)
        raw = cute.make_rmem_tensor(span, self.dtype)
        raw.fill(0.0)
        if row < rows:
            token, g = row // group, row % group
            if cutlass.const_expr(self.variant.packed):
                token = work.q_start + token
            offset = cutlass.Int64(work.batch) * q_sb + cutlass.Int64(work.head_kv * group + g) * q_sh
            offset = offset + cutlass.Int64(token) * q_ss + span * pair
            raw.store(cute.make_tensor(q + cute.assume(offset, divby=8), cute.make_layout(span)).load())
        scaled = cute.make_rmem_tensor(span, cutlass.Float32)
        scaled.store(raw.load().to(cutlass.Float32) * q_scale)
        limit = cutlass.Float32(MMA_FINITE_MAX)
        for e in cutlass.range_constexpr(span):
            scaled[e] = cutlass.max(cutlass.min(scaled[e], limit), -limit)
        wide = cute.make_rmem_tensor(span, self.mma_dtype)
        wide.store(scaled.load().to(self.mma_dtype))
        return wide

    @cute.jit
    def _k_operand_a(self, tile, warp, quad, pair):
        """The warp's K rows as the A operand of Sᵀ, ((2, 2, 2), 1, d/16) fp16: rows quad and
        quad + 8 are keys warp·16 + quad (+ 8), k-elements as `_q_operand_b`'s."""
        d = self.head_dim
        span = d // 4
        wide = cute.make_rmem_tensor(2 * span, self.mma_dtype)
        for half in cutlass.range_constexpr(2):
            row = cute.local_tile(tile, (1, span), (warp * WARP_KEYS + quad + 8 * half, pair))
            piece = cute.make_tensor(wide.iterator + half * span, cute.make_layout((1, span)))
            piece.store(row.load().to(self.mma_dtype))
        # A's (k parity, row half, k + 8) at k-step kk: element 4·kk + 2·(k + 8) + parity of the half
        return cute.make_tensor(wide.iterator, cute.make_layout(((2, 2, 2), 1, d // 16), stride=((1, span, 2), 0, 4)))

    @cute.jit
    def _scores_by_keys(self, mma, rK, rQ):
        """Sᵀ = K Qᵀ of the warp's 16 keys by the 8 query columns (fp32)."""
        return self._two_chains(mma, ((2, 2), 1, 1), rK, rQ)

    @cute.jit
    def _vt_operand_a(self, tile, warp, quad, pair):
        """Vᵀ as the A operand of Oᵀ = Vᵀ Pᵀ, ((2, 2, 2), d/16 m-tiles, 1) fp16: `_v_fragment`'s
        registers renamed (no instruction): its n-tile dt (keys 2·pair (+1, +8, +9) at
        d = (d/8)·quad + dt) is m-tile dt // 2's row half dt % 2."""
        frag = self._v_fragment(tile, warp, quad, pair)
        layout = cute.make_layout(((2, 2, 2), self.head_dim // 16, 1), stride=((1, 4, 2), 8, 0))
        return cute.make_tensor(frag.iterator, layout)

    @cute.jit
    def _pt_operand_b(self, acc_S):
        """Pᵀ as the B operand of Oᵀ, ((2, 2), 1, 1) fp16: the lane's two fp16 pairs of Sᵀ
        (keys quad and quad + 8, columns 2·pair, + 1) transposed 8 keys at a time, giving
        keys 2·pair, + 1 (and + 8, + 9) of column quad."""
        halves = cute.make_rmem_tensor(4, self.mma_dtype)
        halves.store(acc_S.load().to(self.mma_dtype))
        words = cute.recast_tensor(halves, cutlass.Uint32)
        moved = cute.make_rmem_tensor(2, cutlass.Uint32)
        for h in cutlass.range_constexpr(2):
            moved[h] = cutlass.Uint32(transpose_8x8(words[h]))
        rP = cute.recast_tensor(moved, self.mma_dtype)
        return cute.make_tensor(rP.iterator, cute.make_layout(((2, 2), 1, 1), stride=((1, 2), 0, 0)))

    @cute.jit
    def _merge_by_keys(self, o_qd, softmax, merge, warp, quad, pair, v_descale):
        """`_merge` for the transposed tiles: the lane's columns 2·pair, + 1 are query rows; its
        O values of a row are d = (d/8)·quad + x, x = 2·mt + row half (`o_qd`'s second mode)."""
        row_max, row_sum, o_parts = merge
        for p in cutlass.range_constexpr(2):
            total = softmax.lane_sum(softmax.row_sum[p])
            if quad == 0:
                row_max[2 * pair + p, warp] = softmax.row_max[p] * softmax.scale_log2
                row_sum[2 * pair + p, warp] = total
        merge_barrier = pipeline.NamedBarrier(barrier_id=Barrier.DECODE_MERGE, num_threads=128)
        merge_barrier.arrive_and_wait()  # every warp's statistics are written, and its ring reads done
        span = self.head_dim // 8
        for p in cutlass.range_constexpr(2):
            row = 2 * pair + p
            top, total = self._row_total(row_max, row_sum, row)
            own = cute.math.exp2(row_max[row, warp] - top, fastmath=True)
            factor = cutlass.select_(total > 0.0, own * v_descale / total, cutlass.Float32(0.0))
            for mt in cutlass.range_constexpr(self.head_dim // 16):
                for half in cutlass.range_constexpr(2):
                    o_parts[row, span * quad + 2 * mt + half, warp] = o_qd[p, (half, mt)] * factor
        merge_barrier.arrive_and_wait()

    @cute.jit
    def _scores_of(self, mma, rQ, rK):
        """S = Q Kᵀ of the warp's keys (fp32 accumulator)."""
        return self._two_chains(mma, ((2, 2), 1, WARP_KEYS // 8), rQ, rK)

    @cute.jit
    def _two_chains(self, mma, shape, a, b):
        """A · B over the k-steps into an fp32 accumulator of `shape`. Each k-step's MMA waits
        for the last one's accumulator: the even and odd k-steps go to two accumulators (two
        chains of half the depth), summed at the end (bench/NOTES.md, decode v8)."""
        acc = cute.make_rmem_tensor(shape, cutlass.Float32)
        acc.fill(0.0)
        odd = cute.make_rmem_tensor(shape, cutlass.Float32)
        odd.fill(0.0)
        for kk in cutlass.range_constexpr(cute.size(a.shape[2])):
            chain = acc if kk % 2 == 0 else odd
            cute.gemm(mma, chain, a[None, None, kk], b[None, None, kk], chain)
        acc.store(acc.load() + odd.load())
        return acc

    def _release_reads(self, k_pipe, v_pipe, stage):
        """This thread has read its rows of a ring stage's K and V (ld.shared: the generic
        proxy); TMA (the async proxy) may refill them. The proxy fence orders the reads before
        the refill's writes — without it an arrive may overtake reads still in flight (runs
        differed in their last bits, bench/NOTES.md decode v5). One fence for both: it waits
        for the thread's loads, so releasing K early cost a second wait (5 % at batch 32)."""
        cute.arch.fence_proxy("async.shared", space="cta")
        k_pipe.sync_object_empty.arrive(stage, None)
        v_pipe.sync_object_empty.arrive(stage, None)

    @cute.jit
    def _q_fragment(self, q, q_strides, work, group, rows, quad, pair, q_scale):
        """The A operand of S = Q Kᵀ for all k-steps, ((2, 2, 2), 1, d/16) fp16: rows quad and
        quad + 8 of the CTA's, d = (d/4)·pair + 4·kk + (0..3); rows past the last are zeros.
        Q is scaled by `q_scale` and saturates at fp16's largest finite."""
        d = self.head_dim
        frag = cute.make_rmem_tensor(8 * (d // 16), self.mma_dtype)
        for half in cutlass.range_constexpr(2):
            row = work.row_block * ROWS_SCALED + quad + 8 * half
            wide = self._q_piece(q, q_strides, work, group, rows, row, pair, q_scale)
            for kk in cutlass.range_constexpr(d // 16):
                for e in cutlass.range_constexpr(4):
                    # A's value (k parity, row half, k + 8) = (e % 2, half, e // 2)
                    frag[8 * kk + 4 * (e // 2) + 2 * half + e % 2] = wide[4 * kk + e]
        return cute.make_tensor(frag.iterator, cute.make_layout(((2, 2, 2), 1, d // 16)))

    @cute.jit
    def _k_fragment(self, tile, warp, quad, pair):
        """The B operand of S = Q Kᵀ, ((2, 2), 2 n-tiles, d/16 k-steps) fp16: n-tile nt's column
        `quad` is key warp·16 + 8·nt + quad; its elements d = (d/4)·pair + 4·kk + (0..3)."""
        d = self.head_dim
        span = d // 4
        wide = cute.make_rmem_tensor(2 * span, self.mma_dtype)
        for nt in cutlass.range_constexpr(2):
            row = cute.local_tile(tile, (1, span), (warp * WARP_KEYS + 8 * nt + quad, pair))
            piece = cute.make_tensor(wide.iterator + nt * span, cute.make_layout((1, span)))
            piece.store(row.load().to(self.mma_dtype))
        return cute.make_tensor(wide.iterator, cute.make_layout(((2, 2), 2, d // 16), stride=((1, 2), span, 4)))

    @cute.jit
    def _v_fragment(self, tile, warp, quad, pair):
        """The B operand of O += P V, ((2, 2), d/8 n-tiles, 1) fp16: k-elements are the warp's
        keys 2·pair, 2·pair + 1, 2·pair + 8, 2·pair + 9 (P's columns); n-tile dt's column
        `quad` is d = (d/8)·quad + dt. A B register holds two keys at one d: each key pair's
        bytes are interleaved first (one prmt gives the pair at two d), then converted, so no
        fp16 halves move after the conversion (half the prmt of converting each key's row
        first: bench/NOTES.md, decode v8)."""
        span = self.head_dim // 8
        raw = cute.make_rmem_tensor(4 * span, self.kv_cache_type)  # key i's span bytes at i * span
        for i in cutlass.range_constexpr(4):
            key = warp * WARP_KEYS + 2 * pair + i % 2 + 8 * (i // 2)
            row = cute.local_tile(tile, (1, span), (key, quad))
            cute.make_tensor(raw.iterator + i * span, cute.make_layout((1, span))).store(row.load())
        words = cute.recast_tensor(raw, cutlass.Uint32)  # key i's word w: d 4w..4w+3 at i * span/4 + w
        paired = cute.make_rmem_tensor(span, cutlass.Uint32)  # 4 keys' span bytes, as words
        quarter = span // 4
        for dt4 in cutlass.range_constexpr(quarter):
            for half in cutlass.range_constexpr(2):  # keys (0, 1), then (2, 3): B's two registers
                a, b = words[2 * half * quarter + dt4], words[(2 * half + 1) * quarter + dt4]
                paired[4 * dt4 + half] = byte_interleave(a, b, 0x5140)  # d 4·dt4, 4·dt4 + 1
                paired[4 * dt4 + 2 + half] = byte_interleave(a, b, 0x7362)  # d 4·dt4 + 2, + 3
        pairs = cute.make_tensor(cute.recast_ptr(paired.iterator, dtype=self.kv_cache_type), cute.make_layout(4 * span))
        frag = cute.make_rmem_tensor(4 * span, self.mma_dtype)
        frag.store(pairs.load().to(self.mma_dtype))
        # paired word 4·dt4 + 2j + half became fp16 words 2·(4·dt4 + 2j + half) + (0, 1): key pair
        # `half` at n-tiles 4·dt4 + 2j and + 1. B wants n-tile dt's registers (pair 0, pair 1)
        # side by side: whole registers move (no instruction once allocated)
        out = cute.make_rmem_tensor(4 * span, self.mma_dtype)
        src, dst = cute.recast_tensor(frag, cutlass.Uint32), cute.recast_tensor(out, cutlass.Uint32)
        for dt4 in cutlass.range_constexpr(quarter):
            for j in cutlass.range_constexpr(2):
                for half in cutlass.range_constexpr(2):
                    for lohi in cutlass.range_constexpr(2):
                        dst[2 * (4 * dt4 + 2 * j + lohi) + half] = src[2 * (4 * dt4 + 2 * j + half) + lohi]
        return cute.make_tensor(out.iterator, cute.make_layout(((2, 2), span, 1)))

    @cute.jit
    def _merge(self, acc_O, softmax, merge, warp, quad, pair, v_descale):
        """Each warp's rows against the CTA's max and sum: O_w · 2^(m_w - m) / Σ_w l_w 2^(m_w - m)
        (times V's scale) into the merge area, summed by `_store`. A row no warp saw keys of
        ends with O = 0 and LSE = -inf."""
        row_max, row_sum, o_parts = merge
        for r in cutlass.range_constexpr(2):  # rows quad, quad + 8
            total = softmax.lane_sum(softmax.row_sum[r])
            if pair == 0:
                row_max[quad + 8 * r, warp] = softmax.row_max[r] * softmax.scale_log2
                row_sum[quad + 8 * r, warp] = total
        merge_barrier = pipeline.NamedBarrier(barrier_id=Barrier.DECODE_MERGE, num_threads=128)
        merge_barrier.arrive_and_wait()  # every warp's statistics are written, and its ring reads done
        o_mn = mma_rows_by_cols(acc_O)
        span = self.head_dim // 8
        for r in cutlass.range_constexpr(2):  # rows quad, quad + 8
            row = quad + 8 * r
            top, total = self._row_total(row_max, row_sum, row)
            own = cute.math.exp2(row_max[row, warp] - top, fastmath=True)
            factor = cutlass.select_(total > 0.0, own * v_descale / total, cutlass.Float32(0.0))
            # o_mn's columns: (k parity, n-tile): logical column 2·pair + parity of n-tile dt
            for parity in cutlass.range_constexpr(2):
                for dt in cutlass.range_constexpr(span):
                    o_parts[row, span * (2 * pair + parity) + dt, warp] = o_mn[r, parity + 2 * dt] * factor
        merge_barrier.arrive_and_wait()

    @cute.jit
    def _row_total(self, row_max, row_sum, row):
        """(the row's max over the warps, log2 units, 0 when none saw a key; its sum against it)."""
        top = row_max[row, 0]
        for w in cutlass.range_constexpr(1, CONSUMER_WARPS):
            top = cute.arch.fmax(top, row_max[row, w])
        top = cutlass.select_(top == -cutlass.Float32.inf, cutlass.Float32(0.0), top)
        total = cutlass.Float32(0.0)
        for w in cutlass.range_constexpr(CONSUMER_WARPS):
            total = total + row_sum[row, w] * cute.math.exp2(row_max[row, w] - top, fastmath=True)
        return top, total

    @cute.jit
    def _store(self, merge, work, geometry, o_args, lse_args, partials, heads_kv, tidx):
        """The merged rows that exist: thread i sums row i / 8's columns (d/8)·(i % 8) onward
        over the warps, then stores O and LSE (one split, or an adaptive split's sequence that
        fits one), or the split's normalized O (fp32) and LSE into the workspace."""
        row_max, row_sum, o_parts = merge
        group, s_new, rows, splits, split, _ = geometry
        span = self.head_dim // 8
        local, col = tidx // 8, (tidx % 8) * span
        row = work.row_block * ROWS_SCALED + local
        if row < rows:
            out = cute.make_rmem_tensor(span, cutlass.Float32)
            out.store(cute.local_tile(o_parts[local, None, 0], (span,), (tidx % 8,)).load())
            for w in cutlass.range_constexpr(1, CONSUMER_WARPS):
                out.store(out.load() + cute.local_tile(o_parts[local, None, w], (span,), (tidx % 8,)).load())
            top, total = self._row_total(row_max, row_sum, local)
            lse_value = (top + cute.math.log2(total)) * LN_2  # log2(0) = -inf: a row without keys
            row_out = (row, col, out, lse_value, tidx % 8 == 0)
            if cutlass.const_expr(self.variant.adaptive):
                # a sequence that fits one split: no combine reads it (it counts the splits from
                # the lengths alike), so its CTA writes O and LSE as an unsplit kernel's would
                if work.direct:
                    self._store_final_row(row_out, work, group, o_args, lse_args)
                else:
                    self._store_partial_row(row_out, work, heads_kv, group, splits, split, rows, partials)
            elif cutlass.const_expr(self.variant.split):
                self._store_partial_row(row_out, work, heads_kv, group, splits, split, rows, partials)
            else:
                self._store_final_row(row_out, work, group, o_args, lse_args)

    @cute.jit
    def _store_partial_row(self, row_out, work, heads_kv, group, splits, split, rows, partials):
        """A merged row's piece into the workspace: the split's normalized O (fp32) and its LSE."""
        row, col, out, lse_value, leader = row_out
        o_partial, lse_partial = partials
        index = self._partial_index(work, heads_kv, group, splits, split, rows, row)
        dst = cute.make_tensor(o_partial + index * self.head_dim + col, cute.make_layout(self.head_dim // 8))
        dst.store(out.load())
        if leader:
            cute.make_tensor(lse_partial + index, cute.make_layout(1))[0] = lse_value

    @cute.jit
    def _store_final_row(self, row_out, work, group, o_args, lse_args):
        """A merged row's piece into the caller's O (and its LSE)."""
        row, col, out, lse_value, leader = row_out
        token, head = row // group, work.head_kv * group + row % group
        if cutlass.const_expr(self.variant.packed):
            token = work.q_start + token
        o, o_sb, o_sh, o_ss = o_args
        offset = cutlass.Int64(work.batch) * o_sb + cutlass.Int64(head) * o_sh + cutlass.Int64(token) * o_ss
        dst = cute.make_tensor(o + offset + col, cute.make_layout(self.head_dim // 8))
        dst.store(out.load().to(self.dtype))
        if cutlass.const_expr(self.variant.has_lse):
            lse, lse_sb, lse_sh, lse_ss = lse_args
            if leader:
                at = cutlass.Int64(work.batch) * lse_sb + cutlass.Int64(head) * lse_sh
                at = at + cutlass.Int64(token) * lse_ss
                cute.make_tensor(lse + at, cute.make_layout(1))[0] = lse_value
