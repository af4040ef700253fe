"""SDPA forward for sm_90a, warp-specialized and persistent: a producer warpgroup loads with
TMA, two or three consumer warpgroups compute with WGMMA, taking turns on the tensor cores.

- Tiles: a tile is `block_m` query rows of one (sequence, head). The grid is at most one CTA
  per SM (the runtime caps it, `ctas_per_sm`); each CTA walks the tiles blockIdx.x,
  blockIdx.x + gridDim.x, ... so the next tile's loads overlap the current tile's last
  blocks and epilogue, or (the `dynamic` variant: dense causal heads of many tiles) takes
  each next tile from a counter in the workspace (`TicketWalk`). Which tile an index names
  is the tile walk's business: `DenseTiles` (fixed shapes; with a diagonal, longest first,
  within L2 sections of heads or in pairs of equal cost) or `ListedTiles` (variable lengths:
  the scheduling kernel, sdpa_schedule.py, listed the (sequence, query block) units longest
  first in the workspace, and the count).
- Sequences: `Sequence` holds one sequence's lengths and where its rows start. Fixed shapes
  use the plan's lengths; variable lengths read the table the scheduling kernel wrote
  (lengths clamped to the plan's capacities there). Q, K and V of a variable-length plan are
  loaded through "ragged" tensor maps: each sequence is seen as its own tensor whose rows end
  at its length, so the TMA unit zero-fills rows past a sequence's end exactly as it does
  past a dense tensor's; nothing beyond a sequence is ever read (see `_ragged_view`).
- Mask (`sdpa_common.KeyRange`): a tile visits only the key blocks some of its rows see,
  last to first; blocks that every row of a consumer sees whole are not masked.
- Producer (warpgroup 0; one thread issues everything): TMA loads of Q, once the consumers
  released the previous tile's Q, then of K and V blocks into a `stages`-deep ring. Each
  stage's "full" mbarrier is armed with its byte count and completed by the TMA unit; a stage
  is refilled after every consumer released it on its "empty" mbarrier. The ring position
  (`Ring`) carries over from tile to tile.
- Consumers (64 query rows each; setmaxnreg per `WgmmaTiles.registers`): S = Q Kᵀ and
  O += P V with warpgroup MMAs, P kept in registers. Each turn issues S_j together with
  P_(j-1) V_(j-1) and runs the softmax of S_j (`OnlineSoftmax`) while P V still runs; a
  ring of named barriers makes the consumers take turns, so one's softmax also hides under
  the others' GEMMs. The consumers' own instructions between turns are the critical path
  (bench/NOTES.md v18), so the steps run in three loops of straight-line bodies (blocks a
  consumer's rows see in part on the right, whole, in part on the left), O is rescaled only
  when a row's max grew enough that keeping it would let a probability exceed 2**8, and
  stage indices are bit operations. At d=128 a tile's later steps do not even compute the
  block's max: they exponentiate against the reference max as it stands, packing the next P
  aside while S stays whole, and keep the result unless some thread's sum of probabilities
  exceeds FAST_SUM_LIMIT, in which case that thread's warp takes the exact step from S
  (`OnlineSoftmax.update_fast`); no warp waits for another to decide. O leaves
  through shared memory in 16-byte stores: its own buffer where it fits (then Q is released
  right after the tile's last S = Q Kᵀ), else the consumer's Q buffer (released after the
  store). A tile whose rows see no key writes O = 0, LSE = -inf.

An e4m3 cache under the mixed form's chunks (`kv_cache`, with `page_size`): the producer thread
loads each key block's K and V raw (boxes of `box_rows` keys of one page by the whole of d, plain
rows) into a raw ring (two stages where they fit: `dequantizing_tiles`); the producer warpgroup's
three idle warps convert each block into the 16-bit K and V stages (e4m3 is exact in fp16 and
bf16), once the consumers released them, and arrive on the stage's "converted" barriers, which
the consumers wait on instead of TMA's "full" (`_convert_blocks`). K's scale joins the scores'
scale and V's O's normalization (`CacheDescales`). Everything the consumers do is the 16-bit kernel's.

Tensor maps (Q, K, V) are kernel parameters; `tensor_maps` builds them, and the build runs the
same code on the CPU (`encode_tensor_maps`) so the plan holds each launch's maps. Modes as the
kernel sees them (element strides; the innermost head-dim stride is 1, checked at build time):
  Q    : (s_q, d, h_q, b)    tensor map; variable lengths: (rows, d, h_q, wrap, start) ragged
  K, V : (s_kv, d, h_kv, b)  tensor maps, likewise (V: d_v); head h_q reads h_q // group   (GQA / MQA)
  O    : (s_q, d_v) at base + b * stride_b + (token offset) * stride_s + h_q * stride_h
  LSE  : (s_q,)     fp32, natural log of the row's sum of exp(score), optional, addressed alike

Constraints: fp16 / bf16; head dim 64, 96, 128 or 256 (static; e4m3: 64, 128 or 256, whole
64-wide pieces), or Q and K at one head dim with V and O at another (`head_dim_v`: the pairs of
HEAD_DIM_PAIRS, 16-bit, K and V as tensors; V's map, the P V GEMM, O's staging, store and strides
take V's); rows of Q, K, V, O 16-byte aligned; any lengths (0 included for variable lengths).

e4m3 (the `fp8` variants): Q, K and V in float8_e4m3fn with float32 descales (per
tensor or per head: `Descales`), O in bf16 or fp16. 8-bit WGMMA reads both operands K-major, so
V arrives transposed (keys innermost: its tensor map is (d, s_kv, h_kv, b) with the keys'
stride 1, and its Vᵀ tile is the P V GEMM's K-major B). The A operand's key order differs from
the accumulator's, so either V's keys are put in the accumulator's order in shared memory by the
producer warpgroup's three idle warps (`v_reorder`, `_order_v_keys`: each stage once loaded,
then the consumers wait for its "ordered" barrier instead of its "full" one) and P is packed as
it lies, or P's e4m3 words are swapped within each quad (`_store_p`); `reorders_v` picks by
measurement. descale_q · descale_k joins the scores' scale and descale_v the normalization.
With variable lengths V is loaded through its sequence's own tensor map (`v_maps`, written by
the scheduling kernel: sequence_maps.py), whose key extent ends the sequence; the packed form's
V is first re-laid into the workspace by vt_pack.py (`v_layout` "packed"), each sequence from a
16-key boundary, and its maps point there.
"""

import copy
import math
from dataclasses import dataclass, replace
from typing import ClassVar

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum
from frost_runtime.dtypes import DTYPES, E4M3_MAX

from frostc.kernels.barriers import Barrier
from frostc.kernels.cache_args import CacheScales, CacheScaleStrides, head_scales
from frostc.kernels.interface import (
    I32,
    I64,
    BhsStrides,
    Group,
    Kernel,
    Ptr,
    TmaTensor,
    Variant,
    abi,
    facets,
    pointer,
    tma,
    when,
)
from frostc.kernels.launch_order import WAITS_AT_ENTRY
from frostc.kernels.online_softmax import OnlineSoftmax, ProbabilityLimits
from frostc.kernels.ragged import RAGGED_EXTENT, RAGGED_ROWS, RAGGED_WRAP
from frostc.kernels.ring import Ring, StageBarriers
from frostc.kernels.sdpa_common import (
    KeyRange,
    MaskFlags,
    SoftmaxScales,
    bf16_pair_to_fp16,
    dsl_dtype,
    e4m3_quad_word,
    e4m3_word,
    keys_in_accumulator_order,
    register_copy,
)
from frostc.kernels.sequence_maps import MAP_BYTES, aligned_start, sequence_map
from frostc.kernels.sequences import Sequence, Sequences, Shape
from frostc.kernels.tile_walks import L2_SECTION_BYTES, DenseTiles, ListedTiles, TicketWalk
from frostc.kernels.wgmma_layouts import c_to_a_layout, swizzle_elems, wgmma_rows, wgmma_rows_by_cols
from frostc.target import SM90A

# `o_float32` variants take O out of the tensor cores' accumulator into float32 (in shared
# memory) every this many key blocks: FP8 WGMMA adds into its accumulator with fewer bits than
# float32, so a long sum of products of one sign loses its small terms; 4 blocks leave O's
# mean 0.4-0.7 % low (V's channels N(1..3, 1)) where tensor-core accumulation left it 19-25 %
# low at 16k keys, at 5-10 % of the speed; 8 blocks: 1-1.6 % low, 3-7 % slower
# (bench/NOTES.md, "FP8 O's accumulation")
PROMOTE_BLOCKS = 4
O_FLOAT32_HEAD_DIMS = (128,)  # the fast tail's (`_fast_tail_one_branch`), where the promotion lives
# e4m3 head dims whose variants may take three consumer warpgroups of 64 rows (`three_consumers`)
THREE_CONSUMER_HEAD_DIMS = (128,)
# (Q and K's head dim, V and O's) where they differ, 16-bit only: DeepSeek-V2/V3's prefill (MLA)
HEAD_DIM_PAIRS = ((192, 128),)

# setmaxnreg per warpgroup, by consumer count: the CTA's launch allocation (`launch_registers`)
# split between one producer warpgroup (a single TMA thread needs few) and the consumers
# (accumulators)
REGISTERS = {2: (40, 232), 3: (32, 160)}
# 32-bit registers an SM holds: a CTA that is alone on its SM (min_blocks_per_mp=1) launches with
# its share, `launch_registers`, and setmaxnreg only moves registers within that allocation
REGISTER_FILE = 65536
# e4m3: the producer warpgroup's warps besides the TMA warp put each Vᵀ stage's keys in the
# order of P's registers (`_order_v_keys`)
V_ORDER_THREADS = 96
# an e4m3 cache's chunks (`kv_cache`): the producer warpgroup's warps besides the TMA warp convert
# each raw e4m3 block into the 16-bit K and V stages
CONVERT_THREADS = 96
# ... 16 elements a piece (16 bytes read, 32 written), two pieces' loads in flight a thread
CONVERT_PIECE, CONVERT_BATCH = 16, 2
# a bf16 Q converted to fp16 in place by its consumer (`_q_to_mma_dtype`): 16-byte pieces, this many
# a thread in flight
Q_CONVERT_BATCH = 4
# e4m3's K-major rows (and vt_pack's re-lay of V) come in whole pieces of 64 of d
FP8_D_PIECE = 64


def accumulating_if(mma, keep):
    """`mma` whose accumulator is added to where `keep` (a run-time flag: WGMMA's scale-d
    predicate) and overwritten elsewhere. `set` replaces the atom's value in place, and a value set
    inside a loop must not outlive its iteration, so the copy carries its own."""
    local = copy.copy(mma)
    local._trait = copy.copy(mma._trait)
    local.set(warpgroup.Field.ACCUMULATE, keep)
    return local


@dataclass(frozen=True)
class WgmmaTiles:
    """The named tile parameters of one compiled variant."""

    block_m: int  # query rows per tile (64 per consumer warpgroup)
    block_n: int  # key rows per step
    consumers: int  # consumer warpgroups
    stages: int  # K/V shared-memory ring depth
    o_buffer: bool  # O staged in its own buffer (else in the Q buffer)
    ctas_per_sm: int = 1  # persistent grid: the runtime launches min(tiles, SMs * this) CTAs
    l2_sections: bool = False  # longest-first tiles grouped by heads whose K and V fit in L2
    v_reorder: bool = False  # e4m3: V's keys put in P's register order in shared memory (`reorders_v`)
    raw_stages: int = 0  # an e4m3 cache's chunks: the raw ring's depth (`dequantizing_tiles`)

    @property
    def num_threads(self) -> int:
        return 128 * (self.consumers + 1)

    @property
    def registers(self) -> tuple[int, int]:
        """(producer, consumer) registers per thread after setmaxnreg. The consumers' increase
        waits until the producer's decrease has freed enough of the CTA's launch allocation, so
        the split must fit that allocation, not the register file: at 384 threads 168 a thread
        (64,512), which 40/232 fills exactly; 48/232 (the whole 64 Ki) left the consumers waiting
        forever on the GPU (bench/NOTES.md, the e4m3 converters at 48 registers)."""
        producer, consumer = REGISTERS[self.consumers]
        needed = 128 * (producer + self.consumers * consumer)
        held = launch_registers(self.num_threads) * self.num_threads
        if needed > held:
            raise ValueError(
                f"setmaxnreg split {producer}/{consumer} for {self.consumers} consumers needs {needed:,} "
                f"registers, over the {held:,} the CTA launches with: lower REGISTERS[{self.consumers}]"
            )
        return producer, consumer

    def as_dict(self) -> dict[str, int]:
        named = {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "threads": self.num_threads,
            "consumer_warpgroups": self.consumers,
            "stages": self.stages,
            "o_buffer": int(self.o_buffer),
            "ctas_per_sm": self.ctas_per_sm,
        }
        return (
            named
            | ({"v_reorder": 1} if self.v_reorder else {})
            | ({"raw_stages": self.raw_stages} if self.raw_stages else {})
        )


def launch_registers(threads: int) -> int:
    """Registers a thread that ptxas gives a kernel of `threads` threads that moves registers
    between warpgroups with setmaxnreg: the register file's share, rounded down to the
    allocation granule of 8 (384 threads: 168; 512: 128). The golden plans' cubins say the same."""
    return REGISTER_FILE // threads // 8 * 8


def tiles_for_head_dim(
    head_dim: int, window_left: bool, fp8: bool = False, three_consumers: bool = False, head_dim_v: int = 0
) -> WgmmaTiles:
    """Shared memory decides (227 KiB): Q and O buffers are 128·d, a ring stage 2·block_n·d
    two-byte elements (`head_dim_v`: V's and O's d where it is not Q's and K's, else 0).
    bench/NOTES.md has the measurements behind each choice."""
    if fp8:
        return _fp8_tiles(head_dim, window_left, three_consumers)
    if (head_dim, head_dim_v) == (192, 128):
        # DeepSeek's prefill (MLA, d_qk 192, d_v 128): 48 KiB Q + 2 stages of 48 KiB K and 32 KiB V
        # = 208 KiB; an own O buffer (32 KiB) would not fit beside them, so each consumer stages
        # its 64 x 128 O in its own 64 x 192 part of Q's buffer (`_smem_layout_o`), as d=256 does
        return WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=2, o_buffer=False)
    if head_dim == 256:
        # 64 KiB Q + 2 stages of 2·32 KiB: O must go through Q's buffer
        return WgmmaTiles(block_m=128, block_n=64, consumers=2, stages=2, o_buffer=False)
    if head_dim == 128:
        # 32 KiB Q + 32 KiB O + 2 stages of 64 KiB = 192 KiB
        return WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=2, o_buffer=True)
    if head_dim == 96:
        # Phi-3. Rows of 192 bytes (a multiple of 64, not of 128) take WGMMA's 64-byte swizzle in
        # Q, K, V and O, so each row is loaded as three 32-wide TMA boxes. Three consumers take
        # turns as at d=64 (192 rows; 96-key blocks keep S, O and P within 160 registers: 128
        # keys spill): 36 KiB Q + 36 KiB O + 2 stages of 36 KiB = 144 KiB; 3-7 % over 128 x 128
        # on the H100 (bench/NOTES.md). A left window's masks take d=128's tiles, 144 KiB too.
        if not window_left:
            return WgmmaTiles(block_m=192, block_n=96, consumers=3, stages=2, o_buffer=True)
        return WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=2, o_buffer=True)
    if not window_left:
        # d=64: a block's GEMMs are half as long as at d=128 for the same softmax work, so three
        # consumers take turns (192 rows); 24 KiB Q + 24 KiB O + 4 stages of 32 KiB = 176 KiB.
        # A left window's masks spill with three (ptxas keeps a 512-thread kernel at 128
        # registers): two, below.
        return WgmmaTiles(block_m=192, block_n=128, consumers=3, stages=4, o_buffer=True)
    # 16 KiB Q + 16 KiB O + 4 stages of 32 KiB = 160 KiB
    return WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=4, o_buffer=True)


def _fp8_tiles(head_dim: int, window_left: bool, three_consumers: bool) -> WgmmaTiles:
    """e4m3 Q, K, V (one byte) and a 16-bit O: O always has its own buffer (it is twice Q's
    bytes). The consumers as at 16 bits: three at d=64 (its GEMMs are short), else two, but
    three at d=128 where the plan asks (`three_consumers`)."""
    if three_consumers:
        # d=128, 192 rows: 24 KiB Q + 48 KiB O + 4 stages of 2·12 KiB = 168 KiB. 96-key blocks
        # keep a consumer's S, O and P within setmaxnreg's 160 registers (128 keys would not);
        # a third warp on each SM sub-partition hides the step's latency: +5-7 % a tile on long
        # rows (bench/NOTES.md, FP8 v12)
        assert head_dim in THREE_CONSUMER_HEAD_DIMS and not window_left, "three consumers: d=128, no left window"
        return WgmmaTiles(block_m=192, block_n=96, consumers=3, stages=4, o_buffer=True)
    if head_dim == 256:
        # 32 KiB Q + 64 KiB O + 2 stages of 2·24 KiB = 192 KiB: 96-key blocks ran 2-3 % faster
        # than 3 stages of 64 keys, 128 keys spill (bench/NOTES.md, FP8 v2)
        return WgmmaTiles(block_m=128, block_n=96, consumers=2, stages=2, o_buffer=True)
    if head_dim == 64 and not window_left:
        # 12 KiB Q + 24 KiB O + 4 stages of 2·8 KiB = 100 KiB
        return WgmmaTiles(block_m=192, block_n=128, consumers=3, stages=4, o_buffer=True)
    # d=128: 16 KiB Q + 32 KiB O + 4 stages of 2·16 KiB = 176 KiB; d=64 with a left window (its
    # masks spill with three consumers, as at 16 bits): half of each
    return WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=4, o_buffer=True)


def dequantizing_tiles(tiles: WgmmaTiles, head_dim: int) -> WgmmaTiles:
    """The 16-bit tiles with the raw ring an e4m3 cache's chunks read through. Two raw stages
    where they fit, so that TMA fills one while the converters empty the other: with one, each
    block's load waited for the last block's conversion, and the chunks ran at 0.48x the speed of
    the same chunks over bf16 pages (H100, bench/NOTES.md). d=128 makes room by staging O in Q's
    buffer (its 32 KiB are the second raw stage's); d=256 is at the limit with one."""
    if head_dim == 256:
        return replace(tiles, raw_stages=1)
    if head_dim == 128:
        return replace(tiles, o_buffer=False, raw_stages=2)
    return replace(tiles, raw_stages=2)


def reorders_v(head_dim: int, diagonal: bool) -> bool:
    """e4m3: whether the producer warpgroup's idle warps put each Vᵀ stage's keys in the order
    of P's registers (`_order_v_keys`), so that P leaves the accumulator with no exchange between
    lanes, or P's words are swapped within each quad instead. The reordering moves a stage
    through shared memory once more, which costs where the tensor cores' operand reads are the
    bound: measured (bench/NOTES.md, FP8 v3) +7-10 % at d=64, +1.5-2 % at d=128 with a diagonal,
    -1 to -3 % at d=128 without, -0.5 % at d=256."""
    return head_dim == 64 or (head_dim == 128 and diagonal)


# ------------------------------------------------------------------------------ the arguments

# How a variant's CTAs take the tiles (`DenseTiles`, `TicketWalk`; variable lengths walk the
# scheduling kernel's list):
# - static: persistent, CTA b takes tiles b, b + grid, ...;
# - per_tile: one CTA per tile, the hardware handing each freed SM the next (longest first
#   within L2 sections of heads): long causal tiles, where a static persistent order loses more
#   to imbalance and L2 misses than a CTA's exposed start costs (bench/NOTES.md v16);
# - paired: persistent, a diagonal's tiles walked in pairs of equal cost, head by head (short
#   causal tiles, whose K and V a longest-first walk over all heads keeps missing in L2; NOTES v19);
# - dynamic: persistent, CTAs taking the next tile of a longest-first walk within L2 sections of
#   heads from a counter in the workspace: balance and L2 reuse at once.
WALKS = ("static", "per_tile", "paired", "dynamic")
# How V lies where the kernel reads it:
# - given: as the caller gave it (16-bit: d innermost; e4m3: keys innermost, or re-laid so from
#   a padded V by vt_pack.py, its padding rows the caller's);
# - p_order: e4m3, re-laid by vt_pack.py with each 16 keys already in P's register order, so P
#   is packed as it lies (no quad swap, no reordering in shared memory); V's maps end on 16-key
#   groups (a zero fill inside a group would erase keys stored there; vt_pack wrote zeros past
#   every sequence);
# - packed: e4m3 packed, re-laid by vt_pack.py in P's order, sequence b's keys from `aligned_start`.
V_LAYOUTS = ("given", "p_order", "packed")


def _fp8(variant) -> bool:
    return variant.fp8


def _extents(variant) -> str:
    """A coordinate tensor's dynamic extents: (rows, heads, batch), or heads alone for the
    ragged maps of variable lengths."""
    return "i32" if variant.varlen else "i32x3"


@dataclass(frozen=True)
class Outputs(Group):
    o: Ptr = pointer(of="o_dtype")
    lse: Ptr = pointer("fp32", align=4)  # null without an LSE


@dataclass(frozen=True)
class TileWorkspace(Group):
    """Workspace regions: the scheduling kernel's table, list and count (variable lengths); the
    dynamic walk's counter (`TicketWalk`); debug builds bind `tiles` to the visit table."""

    sequences: Ptr = pointer("int32", align=4)
    tiles: Ptr = pointer("int32", align=4)
    tile_count: Ptr = pointer("int32", align=4)
    tile_counter: Ptr = pointer("int32", align=4)


@dataclass(frozen=True)
class ForwardShape(Group):
    """The plan's sizes (variable lengths: capacities); rows_per_batch: a padded variable-length
    tensor's rows per sequence (else 0)."""

    batch: I32
    heads_q: I32
    seq_q: I32
    seq_kv: I32
    group: I32
    window_left: I32
    window_right: I32
    q_rows: I32 = abi("q.rows_per_batch")
    k_rows: I32 = abi("k.rows_per_batch")
    v_rows: I32 = abi("v.rows_per_batch")


@dataclass(frozen=True)
class Descales(Group):
    """An e4m3 variant's float32 dequantization factors of Q, K and V: one per tensor (stride 0)
    or one per head (stride 1; K's and V's per KV head)."""

    q_descale: Ptr = pointer("fp32", align=4)
    k_descale: Ptr = pointer("fp32", align=4)
    v_descale: Ptr = pointer("fp32", align=4)
    q_stride: I32 = abi("q_descale.stride")
    k_stride: I32 = abi("k_descale.stride")
    v_stride: I32 = abi("v_descale.stride")

    def of_head(self, head, head_kv):
        """(descale_q · descale_k, descale_v) of query head `head`."""
        one = cute.make_layout(1)
        dq = cute.make_tensor(self.q_descale + head * self.q_stride, one)[0]
        dk = cute.make_tensor(self.k_descale + head_kv * self.k_stride, one)[0]
        dv = cute.make_tensor(self.v_descale + head_kv * self.v_stride, one)[0]
        return dq * dk, dv


def _paged(variant) -> bool:
    return variant.page_size > 0


def _sinks(variant) -> bool:
    return variant.sinks


def _dequantizes(variant) -> bool:
    return bool(variant.kv_cache)


@dataclass(frozen=True)
class CacheDescales:
    """An e4m3 cache's scales as the consumers take them per head: (K's, V's), as `Descales`
    gives e4m3 Q, K and V's (Q here is 16-bit: no descale of its own)."""

    scales: CacheScales
    strides: CacheScaleStrides

    def of_head(self, head, head_kv):
        return head_scales(self.scales, self.strides, head_kv)


@dataclass(frozen=True)
class PagedKeys(Group):
    """The mixed form's chunks (`page_size`): K and V are a paged cache, sequence b's key k on page
    page_table[b, k // page_size], row k % page_size; page p's first row is row p · rows_per_page
    of the cache's ragged tensor maps. Page ids outside [0, pages) read nothing (zero rows)."""

    page_table: Ptr = pointer("int32", align=4)
    page_table_stride: I64 = abi("page_table.stride_b")
    pages: I32
    rows_per_page: I32


@dataclass(frozen=True)
class SdpaForwardArgs:
    """Q, K and V through tensor maps (their host code: `SdpaForwardWgmma.tma_atoms`), O and LSE
    by pointer with their (b, h, s) strides; an e4m3 variant's descales and, with variable
    lengths, each sequence's Vᵀ map (`v_maps`, written by the scheduling kernel)."""

    q: TmaTensor = tma(extents=_extents)
    # an e4m3 cache's K and V maps are of e4m3 elements (`kv_dtype`): a 16-bit map over its
    # pages would read boxes twice the raw ring's bytes
    k: TmaTensor = tma(extents=_extents, of="kv_dtype")
    v: TmaTensor = tma(extents=_extents, of="kv_dtype")
    outputs: Outputs
    workspace: TileWorkspace
    shape: ForwardShape
    o_strides: BhsStrides = facets("o")
    lse_strides: BhsStrides = facets("lse")
    softmax: SoftmaxScales
    descales: Descales | None = when(_fp8)
    v_maps: Ptr | None = when(_fp8, dtype="int32", align=MAP_BYTES)
    paged: PagedKeys | None = when(_paged)
    # attention sinks (gpt-oss): one float32 logit per query head that joins every row's softmax
    # denominator (a key with no value)
    sinks: Ptr | None = when(_sinks, dtype="fp32", align=4)
    # an e4m3 cache's scales (the mixed form's chunks over it: `kv_cache`)
    scales: CacheScales | None = when(_dequantizes)
    scale_strides: CacheScaleStrides | None = when(_dequantizes)


# ------------------------------------------------------------------------------ the variant


@dataclass(frozen=True)
class SdpaFwdVariant(Variant):
    """The compile key of one attention kernel: declaration facts only (shapes are arguments)."""

    ARGS: ClassVar[type] = SdpaForwardArgs
    # it waits at entry (griddepcontrol.wait, after its shared memory's setup), so its launch may
    # overlap a settled launch ahead (frostc.kernels.launch_order): its scheduling kernel, a V re-lay
    early_start: ClassVar[str] = WAITS_AT_ENTRY

    dtype: str  # Q, K and V's
    head_dim: int
    mask: MaskFlags
    has_lse: bool
    out_dtype: str = ""  # O's, when it differs from `dtype` (e4m3 Q, K, V: bf16 or fp16 O)
    varlen: bool = False  # lengths from the scheduling kernel's table, ragged tensor maps
    walk: str = "static"  # how the CTAs take the tiles (WALKS)
    # debug builds of the dynamic walk: each consumer counts its visits of each tile into the
    # workspace (the stress test: every tile exactly once per launch)
    count_visits: bool = False
    v_layout: str = "given"  # how V lies (V_LAYOUTS)
    # e4m3 at d=128: O summed in float32 every PROMOTE_BLOCKS key blocks (description:
    # o_accumulation = "float32") instead of in the FP8 tensor cores' accumulator throughout
    o_float32: bool = False
    # e4m3 at d=128: three consumer warpgroups (192-row tiles of 96-key blocks) instead of two;
    # the ops pick it where the rows are long (dense: and the tiles fill the SMs' last turn; NOTES v12)
    three_consumers: bool = False
    # the mixed form's prefill chunks: K and V read from a paged cache of pages of this many rows
    # (`PagedKeys`), box by box within a page; 0: K and V are tensors (every other form)
    page_size: int = 0
    # a per-head sink logit in every row's softmax denominator (`SdpaForwardArgs.sinks`)
    sinks: bool = False
    # V's and O's head dim where it differs from Q's and K's (`head_dim`; DeepSeek's MLA prefill:
    # 192 and 128, HEAD_DIM_PAIRS); 0: the same
    head_dim_v: int = 0
    # the mixed form's chunks over a quantized cache (`page_size`; "e4m3"): the pages are read raw
    # and converted into the 16-bit stages by the producer warpgroup's idle warps; "": 16-bit pages
    kv_cache: str = ""

    @property
    def v_in_p_order(self) -> bool:
        return self.v_layout in ("p_order", "packed")

    @property
    def name(self) -> str:
        name = f"sdpa_fwd_wgmma.{self.dtype}" + (f".o_{self.out_dtype}" if self.out_dtype else "")
        name += f".d{self.head_dim}" + (f"v{self.head_dim_v}" if self.head_dim_v else "") + f".{self.mask.label}"
        name += (".varlen" if self.varlen else "") + (f".{self.walk}" if self.walk != "static" else "")
        name += ".visits" if self.count_visits else ""
        name += ".vpack" if self.v_layout == "packed" else ""
        name += ".v_p_order" if self.v_in_p_order else ""
        name += ".o_f32" if self.o_float32 else ""
        name += ".m192" if self.three_consumers else ""
        name += f".kv_{self.kv_cache}" if self.kv_cache else ""
        name += f".paged_p{self.page_size}" if self.page_size else ""
        name += ".sinks" if self.sinks else ""
        return name + (".lse" if self.has_lse else "")

    @property
    def value_dim(self) -> int:
        """V's and O's head dim."""
        return self.head_dim_v or self.head_dim

    @property
    def fp8(self) -> bool:
        """One-byte Q, K and V: both GEMMs in e4m3, V read with its keys innermost."""
        return DTYPES[self.dtype].bytes == 1

    @property
    def o_dtype(self) -> str:
        return self.out_dtype or self.dtype

    @property
    def kv_dtype(self) -> str:
        """K's and V's elements: an e4m3 cache's (`kv_cache`), else Q's."""
        return self.kv_cache or self.dtype

    @property
    def tile_shape(self) -> WgmmaTiles:
        tiles = tiles_for_head_dim(self.head_dim, self.mask.left, self.fp8, self.three_consumers, self.head_dim_v)
        if self.fp8 and not self.v_in_p_order:
            tiles = replace(tiles, v_reorder=reorders_v(self.head_dim, self.mask.right))
        if self.kv_cache:
            tiles = dequantizing_tiles(tiles, self.head_dim)
        if self.walk == "per_tile":
            return replace(tiles, ctas_per_sm=0, l2_sections=True)
        return replace(tiles, l2_sections=True) if self.walk == "dynamic" else tiles

    @property
    def tiles(self) -> dict[str, int]:
        return self.tile_shape.as_dict()

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.tile_shape.num_threads, 1, 1)

    @property
    def ctas_per_sm(self) -> int:
        return self.tile_shape.ctas_per_sm

    @property
    def grid_rule(self) -> str:
        t = self.tile_shape
        tiles = f"ceil(seq_q / {t.block_m}) * heads_q * batch"
        if self.walk == "per_tile":
            return f"({tiles}, 1, 1): one CTA per tile, longest first"
        if self.varlen:
            tiles = "(units listed by the scheduling kernel, at most the capacity's) * heads_q"
        if self.walk == "paired":
            walk = "persistent over pairs of tiles"
        elif self.walk == "dynamic":
            walk = "persistent, tiles taken from a counter"
        else:
            walk = "persistent over the tiles"
        return f"(min({tiles}, SMs * {t.ctas_per_sm}), 1, 1), {walk}"

    def kernel(self) -> "SdpaForwardWgmma":
        return SdpaForwardWgmma(self)


# ------------------------------------------------------------------------------ device helpers


# The helpers below are frozen dataclasses: the DSL passes read-only frozen dataclasses into
# its loops and branches as they are, where it would try to carry any other object as a value.


@dataclass(frozen=True)
class TileSteps:
    """What the steps of one consumer's tile share: the ring position of its first block,
    its key blocks (n_end - 1 down to n_end - n_blocks) and the mask as its rows see it."""

    ring: Ring
    consumed: cutlass.Int32  # K/V blocks consumed before this tile
    n_end: cutlass.Int32
    n_blocks: cutlass.Int32
    mask: "ConsumerMask"
    score_scale: cutlass.Float32


@dataclass(frozen=True)
class ConsumerMask:
    """The mask as one consumer's rows of one tile see it: which key blocks its rows all see
    whole (no mask needed), and the per-element mask of the others."""

    keys: KeyRange
    q_len: cutlass.Int32
    kv_len: cutlass.Int32
    row_tile: cutlass.Int32  # the consumer's rows, in units of `rows`
    full_first: cutlass.Int32  # key blocks [full_first, full_end) need no mask
    full_end: cutlass.Int32
    rows: int
    cols: int

    @staticmethod
    def of(keys: KeyRange, seq: "Sequence", row_tile, rows: int, cols: int) -> "ConsumerMask":
        first_row = row_tile * rows
        full = keys.full_blocks(first_row, cutlass.min(first_row + rows, seq.q_len) - 1, cols)
        return ConsumerMask(keys, seq.q_len, seq.kv_len, row_tile, full[0], full[1], rows, cols)

    @cute.jit
    def apply(self, qk_thr, s_mn, n_block):
        """-inf where a row does not see a key of block n_block."""
        cS = cute.local_tile(
            cute.make_identity_tensor((self.q_len, self.kv_len)), (self.rows, self.cols), (self.row_tile, n_block)
        )
        c_mn = wgmma_rows_by_cols(qk_thr.partition_C(cS))
        for r in cutlass.range_constexpr(cute.size(s_mn.shape[0])):
            row = c_mn[r, 0][0]
            lo, hi = self.keys.lo(row), self.keys.hi(row)
            for c in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
                col = c_mn[r, c][1]
                if col < lo or col >= hi:
                    s_mn[r, c] = -cutlass.Float32.inf


# ------------------------------------------------------------------------------ the kernel


class SdpaForwardWgmma(Kernel):
    """One variant's kernel: host entry (`__call__`), tensor maps, device code."""

    def __init__(self, variant: SdpaFwdVariant, tiles: WgmmaTiles | None = None):
        super().__init__(variant)
        self.dtype = dsl_dtype(variant.dtype)
        self.out_dtype = dsl_dtype(variant.o_dtype)
        self.fp8 = variant.fp8
        self.head_dim = variant.head_dim  # Q's and K's
        self.head_dim_v = variant.value_dim  # V's and O's
        self.mask_flags = variant.mask
        self.has_lse = variant.has_lse
        self.varlen = variant.varlen
        self.tiles = tiles if tiles is not None else variant.tile_shape
        # a paged cache's keys per TMA box: within one page and one key block
        self.box_rows = math.gcd(variant.page_size, self.tiles.block_n) if variant.page_size else 0
        # ... and its head-dim elements: one row of the tiles' swizzle atom (`swizzle_elems`: 64,
        # or 32 at d=96), so each box lands in one column of atoms of a stage's tile
        self.d_chunk = swizzle_elems(self.head_dim, self.dtype.width) if variant.page_size else 0
        if variant.page_size and (self.fp8 or not variant.varlen or variant.walk != "static"):
            raise ValueError(f"{variant.name}: a paged cache is read by the 16-bit variable-length static walk")
        self.dequantizes = bool(variant.kv_cache)
        if self.dequantizes and (not variant.page_size or variant.head_dim_v or variant.kv_cache != "e4m3"):
            raise ValueError(f"{variant.name}: an e4m3 cache is read by the paged variant, one head dim")
        self.cache_dtype = dsl_dtype(variant.kv_cache) if self.dequantizes else None
        # the tensor cores' 16-bit dtype (K, V, P; Q once converted): over an e4m3 cache fp16,
        # whatever Q's dtype, since e4m3 -> fp16 is one instruction a pair of elements where
        # bf16 takes four (the converters were the bound: bench/NOTES.md, e4m3 chunks' fp16 route)
        self.mma_dtype = cutlass.Float16 if self.dequantizes else self.dtype
        self.launch_options = dict(min_blocks_per_mp=1)
        if variant.o_float32 and not (self.fp8 and self.head_dim in O_FLOAT32_HEAD_DIMS):
            raise ValueError(f"{variant.name}: O in float32 is built for e4m3 at head dims {O_FLOAT32_HEAD_DIMS}")
        if variant.three_consumers and not self.fp8:
            raise ValueError(f"{variant.name}: three consumers are built for e4m3 (measured and tested there)")
        if self.fp8 and self.head_dim % FP8_D_PIECE:
            # e4m3's K-major rows and vt_pack's re-lay are built for whole 64-wide pieces of d
            raise ValueError(f"{variant.name}: e4m3 is built for head dims 64, 128 and 256")
        if variant.head_dim_v and (
            (self.head_dim, variant.head_dim_v) not in HEAD_DIM_PAIRS or self.fp8 or variant.page_size
        ):
            pairs = ", ".join(map(str, HEAD_DIM_PAIRS))
            raise ValueError(f"{variant.name}: a V head dim apart from Q's is built for 16-bit tensors at {pairs}")

    # ---------------------------------------------------------------- host side
    def prepare(self) -> None:
        self.shared_storage = self._shared_storage()
        self.smem_bytes = self.shared_storage.size_in_bytes()

    @cute.jit
    def tma_atoms(self, args: SdpaForwardArgs) -> dict:
        """TMA atoms (their tensor maps are kernel parameters) and coordinate tensors for Q, K
        and V as (rows, d, heads, batch), or ragged (rows, d, heads, wrap, start) for variable
        lengths; V is viewed d-major to match its shared-memory tile. The build also runs this
        on the CPU to write each launch's tensor maps into the plan."""
        t = self.tiles
        d, d_v = self.head_dim, self.head_dim_v
        wg_m = t.block_m // t.consumers
        shape = args.shape
        batch, heads_q, seq_q, seq_kv, group = shape.batch, shape.heads_q, shape.seq_q, shape.seq_kv, shape.group
        strides = args.q.strides + args.k.strides + args.v.strides
        q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss = (cute.assume(x, divby=8) for x in strides)
        q, k, v = args.q.base, args.k.base, args.v.base
        heads_kv = heads_q // group
        if cutlass.const_expr(self.varlen):
            rows, wrap = RAGGED_ROWS, RAGGED_EXTENT
            q_wrap, k_wrap, v_wrap = (cute.assume(RAGGED_WRAP - x, divby=8) for x in (q_ss, k_ss, v_ss))
            gQ = cute.make_tensor(
                q, cute.make_layout((rows, d, heads_q, wrap, wrap), stride=(q_ss, 1, q_sh, q_wrap, q_ss))
            )
            gK = cute.make_tensor(
                k, cute.make_layout((rows, d, heads_kv, wrap, wrap), stride=(k_ss, 1, k_sh, k_wrap, k_ss))
            )
            if cutlass.const_expr(self.fp8):
                # keys innermost cannot be ragged: each sequence has its own map, whose key extent
                # ends it (sequence_maps.py); rows here are the plan's (or the re-laid packed V's),
                # v_ss d's stride
                gV = cute.make_tensor(v, cute.make_layout((d, wrap, heads_kv), stride=(v_ss, 1, v_sh)))
            elif cutlass.const_expr(self.dequantizes):
                # an e4m3 cache's V is read as raw rows, like K (the converters lay it out)
                gV = cute.make_tensor(
                    v, cute.make_layout((rows, d_v, heads_kv, wrap, wrap), stride=(v_ss, 1, v_sh, v_wrap, v_ss))
                )
            else:
                gV = cute.make_tensor(
                    v, cute.make_layout((d_v, rows, heads_kv, wrap, wrap), stride=(1, v_ss, v_sh, v_wrap, v_ss))
                )
        else:
            gQ = cute.make_tensor(q, cute.make_layout((seq_q, d, heads_q, batch), stride=(q_ss, 1, q_sh, q_sb)))
            gK = cute.make_tensor(k, cute.make_layout((seq_kv, d, heads_kv, batch), stride=(k_ss, 1, k_sh, k_sb)))
            # e4m3: keys innermost (8-bit WGMMA operands are K-major), and v_ss is d's stride
            v_sd, v_skey = (v_ss, 1) if self.fp8 else (1, v_ss)
            v_keys = seq_kv
            if cutlass.const_expr(self.variant.v_in_p_order):
                v_keys = (seq_kv + 15) // 16 * 16  # `v_in_p_order`: whole 16-key groups
            gV = cute.make_tensor(
                v, cute.make_layout((d_v, v_keys, heads_kv, batch), stride=(v_sd, v_skey, v_sh, v_sb))
            )
        sQ, sK, sV = self._smem_layouts()
        op = cpasync.CopyBulkTensorTileG2SOp()
        q_info = cpasync.make_tiled_tma_atom(op, gQ, cute.select(sQ, mode=[0, 1]), (wg_m, d))
        if cutlass.const_expr(self.dequantizes):
            # an e4m3 cache: boxes of `box_rows` keys of one page by the whole of d, plain rows in
            # the raw ring (`_load_raw_block`)
            raw_box = cute.make_layout((self.box_rows, d), stride=(d, 1))
            k_info = cpasync.make_tiled_tma_atom(op, gK, raw_box, (self.box_rows, d))
            v_info = cpasync.make_tiled_tma_atom(op, gV, raw_box, (self.box_rows, d))
        elif cutlass.const_expr(self.variant.page_size > 0):
            # a paged cache: boxes of `box_rows` keys of one page by `d_chunk` of d (`_load_paged_block`)
            k_box, v_box = self._box_layouts()
            k_info = cpasync.make_tiled_tma_atom(op, gK, k_box, (self.box_rows, self.d_chunk))
            v_info = cpasync.make_tiled_tma_atom(op, gV, v_box, (self.d_chunk, self.box_rows))
        else:
            k_info = cpasync.make_tiled_tma_atom(op, gK, cute.select(sK, mode=[0, 1]), (t.block_n, d))
            v_info = cpasync.make_tiled_tma_atom(op, gV, cute.select(sV, mode=[0, 1]), (d_v, t.block_n))
        return {"q": TmaTensor(*q_info), "k": TmaTensor(*k_info), "v": TmaTensor(*v_info)}

    def _shared_storage(self):
        t = self.tiles
        dtype, mma_dtype = self.dtype, self.mma_dtype
        q_elems, k_elems, v_elems = (cute.cosize(x) for x in self._smem_layouts())
        o_elems = cute.cosize(self._smem_layout_o()) if t.o_buffer else 8  # unused placeholder when O goes through Q
        out_dtype = self.out_dtype
        stages = t.stages
        dynamic = self.variant.walk == "dynamic"
        v_reorder = self.tiles.v_reorder
        promotes = self._promotes()
        total_half = t.block_m * self.head_dim_v // 2  # float32: half of each thread's O; the other half is sO's
        dequantizes = self.dequantizes
        cache = self.cache_dtype
        raw_elems = t.block_n * self.head_dim * t.raw_stages  # the raw ring of K (or V): e4m3 plain rows
        raw_stages = t.raw_stages

        @cute.struct
        class SharedStorage:
            q_bars: cute.struct.MemRange[cutlass.Int64, 2]
            k_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            v_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[mma_dtype, k_elems], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[mma_dtype, v_elems], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[out_dtype, o_elems], 1024]
            if dynamic:
                ticket: cute.struct.MemRange[cutlass.Int32, 4]  # the tile the producer took
            if v_reorder:
                v_ordered: cute.struct.MemRange[cutlass.Int64, stages]  # a Vᵀ stage's keys reordered
                v_end: cute.struct.MemRange[cutlass.Int32, 1]  # the ring position after the last V
            if promotes:
                o_total: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, total_half], 1024]
            if dequantizes:
                raw_k: cute.struct.Align[cute.struct.MemRange[cache, raw_elems], 1024]
                raw_v: cute.struct.Align[cute.struct.MemRange[cache, raw_elems], 1024]
                raw_bars: cute.struct.MemRange[cutlass.Int64, 2 * raw_stages]  # the raw ring's full, empty
                k_converted: cute.struct.MemRange[cutlass.Int64, stages]  # a 16-bit K stage written
                v_converted: cute.struct.MemRange[cutlass.Int64, stages]
                raw_end: cute.struct.MemRange[cutlass.Int32, 1]  # the raw ring position after the last load

        if SharedStorage.size_in_bytes() > SM90A.smem_per_cta:
            limit = SM90A.smem_per_cta
            raise ValueError(f"{t} needs {SharedStorage.size_in_bytes()} bytes of shared memory, over {limit}")
        return SharedStorage

    def _mmas(self):
        t = self.tiles
        wg_m = t.block_m // t.consumers
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        qk = sm90.make_trivial_tiled_mma(
            self.mma_dtype, self.mma_dtype, k_major, k_major, cutlass.Float32, (1, 1, 1), (wg_m, t.block_n)
        )
        pv = sm90.make_trivial_tiled_mma(
            self.mma_dtype,
            self.mma_dtype,
            k_major,
            k_major if self.fp8 else mn_major,
            cutlass.Float32,
            (1, 1, 1),
            (wg_m, self.head_dim_v),
            warpgroup.OperandSource.RMEM,
        )
        return qk, pv

    def _smem_layouts(self):
        """Q (rows, d, consumer), K (keys, d, stage), V (d, keys, stage), in WGMMA's swizzles; V's
        d innermost (MN-major), or its keys (K-major: e4m3, as 8-bit operands must be)."""
        t = self.tiles
        wg_m = t.block_m // t.consumers
        sQ = sm90.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (wg_m, t.block_n, self.head_dim), self.dtype, t.consumers)
        sK = sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (wg_m, t.block_n, self.head_dim), self.mma_dtype, t.stages)
        v_major = LayoutEnum.ROW_MAJOR if self.fp8 else LayoutEnum.COL_MAJOR
        sV = sm90.make_smem_layout_b(v_major, (wg_m, self.head_dim_v, t.block_n), self.mma_dtype, t.stages)
        return sQ, sK, sV

    def _box_layouts(self):
        """A paged cache's TMA boxes in shared memory: (box_rows, d_chunk) of K and (d_chunk,
        box_rows) of V, each a piece of a stage's tile (for every d_chunk-wide piece of d, a
        stage's keys are contiguous rows of the swizzle's width: 128 bytes, 64 at d=96)."""
        wg_m = self.tiles.block_m // self.tiles.consumers
        rows, chunk = self.box_rows, self.d_chunk
        k_box = sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (wg_m, rows, chunk), self.dtype, 1)
        v_box = sm90.make_smem_layout_b(LayoutEnum.COL_MAJOR, (wg_m, chunk, rows), self.dtype, 1)
        return cute.select(k_box, mode=[0, 1]), cute.select(v_box, mode=[0, 1])

    def _smem_layout_o(self):
        """O's staging buffer (rows, d_v, consumer) in O's dtype. Without a buffer of its own O
        goes through Q's: the same layout where d_v is d, else each consumer's O in its own part
        of Q's buffer (a 64 x d_v tile in WGMMA's swizzle at the start of the consumer's 64 x d),
        so that no consumer writes where another's Q is still read."""
        t = self.tiles
        wg_m = t.block_m // t.consumers
        shape = (wg_m, t.block_n, self.head_dim_v)
        if t.o_buffer or self.head_dim_v == self.head_dim:
            return sm90.make_smem_layout_a(LayoutEnum.ROW_MAJOR, shape, self.out_dtype, t.consumers)
        one = sm90.make_smem_layout_a(LayoutEnum.ROW_MAJOR, shape, self.out_dtype, 1)
        q_part = wg_m * self.head_dim  # elements of one consumer's Q (a multiple of the swizzle's span)
        outer = cute.append(cute.select(one.outer, mode=[0, 1]), cute.make_layout(t.consumers, stride=q_part))
        return cute.make_composed_layout(one.inner, 0, outer)

    def _pipelines(self, storage):
        """Q: one stage; K and V: `stages` each. "full" is armed by the producer thread with the
        stage's byte count and completed by TMA; "empty" takes one arrival per consumer warp
        (`_release`)."""
        t = self.tiles
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * t.consumers)
        elem = self.dtype.width // 8

        def make(bars, stages, elems):
            return pipeline.PipelineTmaAsync.create(
                barrier_storage=bars.data_ptr(),
                num_stages=stages,
                producer_group=producer,
                consumer_group=consumers,
                tx_count=elems * elem,
                defer_sync=True,
            )

        return (
            make(storage.q_bars, 1, t.block_m * self.head_dim),
            make(storage.k_bars, t.stages, t.block_n * self.head_dim),
            make(storage.v_bars, t.stages, t.block_n * self.head_dim_v),
        )

    def _raw_pipeline(self, storage):
        """An e4m3 cache's raw ring: `raw_stages` stages of K's and V's raw blocks, each armed by
        the producer thread with both blocks' bytes and completed by TMA; "empty" takes one
        arrival per converter warp (`_convert_blocks`)."""
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.raw_bars.data_ptr(),
            num_stages=self.tiles.raw_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONVERT_THREADS // 32),
            tx_count=2 * self.tiles.block_n * self.head_dim,
            defer_sync=True,
        )

    # ---------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, args: SdpaForwardArgs):
        q_tma, mQ, k_tma, mK = args.q.tmap, args.q.extents, args.k.tmap, args.k.extents
        v_tma, mV = args.v.tmap, args.v.extents
        o, lse = args.outputs.o, args.outputs.lse
        sequences, units = args.workspace.sequences, args.workspace.tiles
        tile_count, tile_counter = args.workspace.tile_count, args.workspace.tile_counter
        shape_args = args.shape
        batch, heads_q, seq_q, seq_kv = shape_args.batch, shape_args.heads_q, shape_args.seq_q, shape_args.seq_kv
        group, window_left, window_right = shape_args.group, shape_args.window_left, shape_args.window_right
        q_rows, k_rows, v_rows = shape_args.q_rows, shape_args.k_rows, shape_args.v_rows
        o_sb, o_sh, o_ss = args.o_strides.bhs()
        lse_sb, lse_sh, lse_ss = args.lse_strides.bhs()
        scale_log2, score_scale = args.softmax.scale_log2, args.softmax.score_scale
        descales, v_maps = args.descales, args.v_maps
        if cutlass.const_expr(self.dequantizes):
            descales = CacheDescales(args.scales, args.scale_strides)
        tidx, _, _ = cute.arch.thread_idx()
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_tidx = tidx % 128

        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        q_pipe, k_pipe, v_pipe = self._pipelines(storage)
        v_full = v_pipe.sync_object_full  # what a consumer waits for before it reads a V stage
        v_ordered = v_end = v_base = None
        if cutlass.const_expr(self.tiles.v_reorder):
            # the consumers wait for the stage's keys to be reordered instead (`_order_v_keys`)
            v_ordered = StageBarriers(storage.v_ordered.data_ptr(), self.tiles.stages)
            v_end = storage.v_end.get_tensor(cute.make_layout(1))
            if tidx == 0:
                v_ordered.init(V_ORDER_THREADS)
                v_end[0] = cutlass.Int32(2**31 - 1)  # not known yet
            v_base = storage.sV.data_ptr().toint()
            v_full = v_ordered
        k_full = k_pipe.sync_object_full  # what a consumer waits for before it reads a K stage
        raw = converted = None
        if cutlass.const_expr(self.dequantizes):
            # the consumers wait for the converters' writes instead of TMA's (`_convert_blocks`)
            converted = tuple(
                StageBarriers(bars.data_ptr(), self.tiles.stages) for bars in (storage.k_converted, storage.v_converted)
            )
            raw_end = storage.raw_end.get_tensor(cute.make_layout(1))
            if tidx == 0:
                for barriers in converted:
                    barriers.init(CONVERT_THREADS)
                raw_end[0] = cutlass.Int32(2**31 - 1)  # not known yet
            t, d = self.tiles, self.head_dim
            rows = cute.make_layout((t.block_n, d, t.raw_stages), stride=(d, 1, t.block_n * d))  # a stage's plain rows
            raw_pipe = self._raw_pipeline(storage)
            raw = (raw_pipe, storage.raw_k.get_tensor(rows), storage.raw_v.get_tensor(rows), raw_end)
            k_full, v_full = converted
        sQ_layout, sK_layout, sV_layout = self._smem_layouts()
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sO = sQ
        # the consumers read Q as the tensor cores' dtype; over an e4m3 cache a bf16 Q is
        # converted in place once loaded (`_q_to_mma_dtype`, through `q_words`)
        sQ_mma, q_words = sQ, None
        if cutlass.const_expr(self.mma_dtype is not self.dtype):
            sQ_mma = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner, dtype=self.mma_dtype)
            q_words = storage.sQ.get_tensor(cute.make_layout(cute.cosize(sQ_layout) // 2), dtype=cutlass.Int32)
        if cutlass.const_expr(self.tiles.o_buffer):
            sO_layout = self._smem_layout_o()
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        elif cutlass.const_expr(self.head_dim_v != self.head_dim):
            sO_layout = self._smem_layout_o()  # each consumer's O in its own part of Q's buffer
            sO = storage.sQ.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        self._totals = None
        if cutlass.const_expr(self._promotes()):
            # O's float32 totals: each thread's first half in sO's bytes (its consumer's, free
            # until the epilogue), the second in o_total; per consumer 128 threads x 16-byte
            # pieces, a thread's pieces 128 pieces apart (conflict-free)
            self._totals = (cute.recast_ptr(storage.sO.data_ptr(), dtype=cutlass.Float32), storage.o_total.data_ptr())
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        # launched early (`early_start`): the launch and the shared memory's setup above overlap
        # the launch ahead; nothing global is read or written before this
        cute.arch.griddepcontrol_wait()

        shape = Shape(cute.ceil_div(seq_q, self.tiles.block_m), heads_q, batch, seq_q, seq_kv, group)
        if cutlass.const_expr(self.varlen):
            tiles = ListedTiles(units, tile_count, heads_q)
        else:
            section = cutlass.Int32(0)
            if cutlass.const_expr(self.tiles.l2_sections):
                # K and V bytes per query head: seq_kv · (d + d_v) · element bytes, shared by the group
                kv_row = (self.dtype.width // 8) * (self.head_dim + self.head_dim_v)
                pair_bytes = cutlass.Int64(seq_kv) * kv_row // group
                fit = cutlass.Int32(cutlass.max(cutlass.Int64(L2_SECTION_BYTES) // cutlass.max(pair_bytes, 1), 1))
                section = cutlass.min(fit, heads_q * batch)
            grid, _, _ = cute.arch.grid_dim()
            tiles = DenseTiles(
                shape, self.mask_flags.right, self.tiles.l2_sections, section, self.variant.walk == "paired", grid
            )
        o_sb, o_sh, o_ss = (cute.assume(x, divby=8) for x in (o_sb, o_sh, o_ss))  # 16-byte rows (build checks)
        seqs = Sequences(self.varlen, sequences, shape, (q_rows, k_rows, v_rows), (o_sb, o_ss), (lse_sb, lse_ss))
        window = (window_left, window_right)
        ticket = None
        if cutlass.const_expr(self.variant.walk == "dynamic"):
            # a dense plan has no tile list: debug builds bind its pointer to the visit table
            word = storage.ticket.get_tensor(cute.make_layout(1))
            ticket = TicketWalk(tile_counter, word, self.tiles.consumers, units)
        producer_regs, consumer_regs = self.tiles.registers
        if wg == 0:
            cute.arch.setmaxregister_decrease(producer_regs)
            # one thread issues every TMA load; the dynamic walk's producer is a whole warp, which
            # meets the consumers at the ticket's barriers (its TMA copies and arrivals elect a lane)
            producers = 32 if cutlass.const_expr(self.variant.walk == "dynamic") else 1
            if wg_tidx < producers:
                sources = (v_maps, args.paged, raw)
                loaded = self._produce(q_pipe, k_pipe, v_pipe, sQ, sK, sV, tiles, seqs, shape, window,
                                       (q_tma, mQ), (k_tma, mK), (v_tma, mV), ticket, sources)  # fmt: skip
                if cutlass.const_expr(self.tiles.v_reorder):
                    self._mark_end(v_pipe, Ring(self.tiles.stages), v_end, loaded)
                if cutlass.const_expr(self.dequantizes):
                    self._mark_end(raw[0], Ring(self.tiles.raw_stages), raw[3], loaded)
            if cutlass.const_expr(self.tiles.v_reorder):
                if wg_tidx >= 128 - V_ORDER_THREADS:
                    self._order_v_keys(v_pipe, (v_ordered, v_end, v_base), wg_tidx - (128 - V_ORDER_THREADS))
            if cutlass.const_expr(self.dequantizes):
                if wg_tidx >= 128 - CONVERT_THREADS:
                    thread = wg_tidx - (128 - CONVERT_THREADS)
                    self._convert_blocks(raw, (k_pipe, v_pipe), (sK, sV), converted, thread)
        else:
            cute.arch.setmaxregister_increase(consumer_regs)
            self._consume(
                q_pipe, k_pipe, (v_pipe, v_full, k_full), (sQ_mma, q_words), sK, sV, sO, tiles, seqs, shape, window,
                (o, o_sh, o_ss), (lse, lse_sh, lse_ss),
                wg - 1, wg_tidx, scale_log2, score_scale, ticket, (descales, args.sinks),
            )  # fmt: skip

    def _schedule(self, tiles):
        """This CTA's walk over the tiles, the same for the producer and the consumers:
        (first tile, end, stride)."""
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        return bidx, tiles.count(), grid

    def _ordered(self, tile, grid, count):
        """The tile a CTA's visit `tile` takes. Tiles are listed longest first (varlen, or a
        diagonal); CTA b visits b, b + grid, ... so round-robin would hand CTA 0 the longest of
        every round. Every other full round is walked backwards instead (boustrophedon), so the
        rounds' differences cancel; a last, partial round keeps its order (a bijection)."""
        if cutlass.const_expr(not (self.varlen or self.mask_flags.right)):
            return tile  # equal tiles: keep a head's query blocks together (K and V in L2)
        if cutlass.const_expr(self.variant.walk == "paired"):
            return tile  # pairs of equal cost (`paired_tile` orders them)
        round_ = tile // grid
        mirrored = round_ * grid + grid - 1 - (tile - round_ * grid)
        full = (round_ + 1) * grid <= count
        return cutlass.select_(full, cutlass.select_(round_ % 2 == 1, mirrored, tile), tile)

    def _unit_at(self, tiles, tile, grid, count, shape):
        """(query block, head, sequence) of visit `tile`, clamped into the listed tiles and the
        sequences so that reading ahead past the last tile stays inside the workspace."""
        listed = cutlass.max(cutlass.min(self._ordered(tile, grid, count), count - 1), 0)
        m_block, head, batch = tiles.work(listed)
        return m_block, head, cutlass.max(cutlass.min(batch, shape.batch - 1), 0)

    def _key_blocks(self, keys, m_block, q_len):
        """(first, end) key blocks of a tile: what any of its rows sees."""
        first_row = m_block * self.tiles.block_m
        last_row = cutlass.min(first_row + self.tiles.block_m, q_len) - 1
        return keys.blocks(first_row, last_row, self.tiles.block_n)

    def _ragged_view(self, mX, head, start, length, batch, rows_mode: int):
        """Sequence rows of head `head` as a (rows, d) (or (d, rows), rows_mode 1) coordinate
        tensor: ragged for variable lengths (rows past `length` are out of bounds), else the
        plan's fixed tensor at `batch`."""
        if cutlass.const_expr(self.varlen):
            view = mX[None, None, head, RAGGED_ROWS, start + length]
            offset = (RAGGED_ROWS - length, 0) if rows_mode == 0 else (0, RAGGED_ROWS - length)
            return cute.domain_offset(offset, view)
        return mX[None, None, head, batch]

    # ---------------------------------------------------------------- producer
    @cute.jit
    def _produce(self, q_pipe, k_pipe, v_pipe, sQ, sK, sV, tiles, seqs, shape, window, q_load, k_load, v_load,
                 ticket, sources):  # fmt: skip
        """`sources`: (the sequences' Vᵀ maps (e4m3 variable lengths), the paged cache's `PagedKeys`)."""
        loads = (q_pipe, k_pipe, v_pipe, sQ, sK, sV, q_load, k_load, v_load, sources)
        first, num_tiles, grid = self._schedule(tiles)
        loaded = cutlass.Int32(0)  # K/V blocks issued so far: the ring position
        q_loads = cutlass.Int32(0)  # Q buffer uses so far: its phase
        if cutlass.const_expr(self.variant.walk == "dynamic"):
            # the first tile is the CTA's own; each later one is taken from the counter while
            # the current one loads, so the atomic's round trip is hidden
            tile = first
            upcoming = ticket.take(grid, num_tiles, tile)
            ticket.publish(tile, True)
            while tile < num_tiles:
                m_block, head, batch = tiles.work(tile)
                blocks = self._produce_tile(loads, seqs, shape, window, m_block, head, batch, loaded, q_loads)
                loaded += blocks
                q_loads += cutlass.min(blocks, 1)
                tile = upcoming
                upcoming = ticket.take(grid, num_tiles, tile)
                ticket.publish(tile, False)  # past the end: the consumers stop
            ticket.drain()
            ticket.finish(grid, num_tiles, tile)
        else:
            for tile in range(first, num_tiles, grid):
                m_block, head, batch = tiles.work(self._ordered(tile, grid, num_tiles))
                blocks = self._produce_tile(loads, seqs, shape, window, m_block, head, batch, loaded, q_loads)
                loaded += blocks
                q_loads += cutlass.min(blocks, 1)
        return loaded

    @cute.jit
    def _mark_end(self, pipe, ring, end_word, loaded):
        """After the last load of a ring that helper warps read (V's for the reordering warps,
        e4m3: `_order_v_keys`; the raw ring for the converters: `_convert_blocks`): ring position
        `loaded` gets the end mark instead, its number in `end_word` and then a plain arrival on
        its "full" barrier (no bytes), so that the helpers stop there (`_at_end_mark`). Its stage
        is taken as for a load: once the helpers released it. (A flag would not do: it is written
        while up to a ring's depth of loads before it may still wait for the helpers.)"""
        stage, phase = ring.at(loaded)
        pipe.sync_object_empty.wait(stage, phase ^ 1)
        if cute.arch.lane_idx() == 0:
            # an atomic, as the ticket's word (`TicketWalk`): racecheck does not follow the
            # arrival below to the helpers' wait
            cute.arch.atomic_exch(end_word.iterator, loaded, scope="cta")
            cute.arch.mbarrier_arrive(pipe.sync_object_full.get_barrier(stage))

    @cute.jit
    def _order_v_keys(self, v_pipe, v_order, thread):
        """e4m3: each Vᵀ stage, once loaded, gets its keys in the order of P's registers
        (`keys_in_accumulator_order`, 16 bytes at a time), so that P leaves the accumulator with
        no exchange between lanes (`_store_p`); then the stage's "ordered" barrier takes this
        thread's arrival. Runs on the producer warpgroup's idle warps until the end mark."""
        v_ordered, v_end, v_base = v_order
        ring = Ring(self.tiles.stages)
        stage_bytes = self.head_dim_v * self.tiles.block_n
        position = cutlass.Int32(0)
        ended = cutlass.Boolean(False)
        while not ended:
            stage, phase = ring.at(position)
            v_pipe.sync_object_full.wait(stage, phase)
            ended = self._at_end_mark(v_end, position)
            if not ended:
                base = v_base + stage * stage_bytes
                for piece in range(thread, stage_bytes // 16, V_ORDER_THREADS):
                    keys_in_accumulator_order(base + 16 * piece)
                # the consumers' WGMMAs read the stage through the async proxy
                cute.arch.fence_proxy("async.shared", space="cta")
                v_ordered.arrive(stage)
                position += 1

    @cute.jit
    def _produce_tile(self, loads, seqs, shape, window, m_block, head, batch, loaded, q_loads):
        """Issue one tile's loads: Q once the consumers released the previous tile's, then its
        K and V blocks, last to first, into the ring from position `loaded` (`q_loads`: the Q
        buffer's uses so far). Returns the number of K/V blocks (a tile without any loads
        nothing). A thread or a whole warp may run it: the copies and arrivals elect a lane."""
        t = self.tiles
        d = self.head_dim
        ring = Ring(t.stages)
        _, k_pipe, v_pipe, _, sK, sV, q_load, (k_tma, mK), (v_tma, mV), (v_maps, paged, raw) = loads
        one = cute.make_layout(1)
        seq = seqs.get(batch)
        keys = KeyRange.of(self.mask_flags, window[0], window[1], seq.q_len, seq.kv_len)
        n_first, n_end = self._key_blocks(keys, m_block, seq.q_len)
        if n_end > n_first:
            head_kv = head // shape.group
            mQ_seq = self._ragged_view(q_load[1], head, seq.q_start, seq.q_len, batch, 0)
            if cutlass.const_expr(self.variant.page_size > 0):
                self._load_q(loads, mQ_seq, m_block, q_loads)
                pt_row = paged.page_table + cutlass.Int64(batch) * paged.page_table_stride
                where = (pt_row, paged.pages, paged.rows_per_page, seq.kv_len, head_kv)
                # a loop the compiler keeps: unrolled (by LLVM, 4 blocks a round), one key offset of
                # the page-table reads was hoisted or not from build to build, so the d=64 kernel
                # over pages of 64 came out one of two cubins (bench/NOTES.md); kept, 16 of 16 alike
                for n_block in cutlass.range(n_end - 1, n_first - 1, -1, unroll=1):
                    position = loaded + (n_end - 1 - n_block)
                    stage, phase = ring.at(position)
                    # the block's pages are read before the stage's wait, so the reads overlap it
                    pages = self._block_pages(where, n_block)
                    if cutlass.const_expr(self.dequantizes):
                        self._load_raw_block(raw, (k_tma, mK), (v_tma, mV), (n_block, pages, position), where)
                    else:
                        block = (n_block, pages, stage, phase)
                        self._load_paged_block(k_pipe, k_tma, mK, sK, block, where, keys_mode=0)
                        self._load_paged_block(v_pipe, v_tma, mV, sV, block, where, keys_mode=1)
            else:
                mK_seq = self._ragged_view(mK, head_kv, seq.k_start, seq.kv_len, batch, 0)
                v_desc = None
                if cutlass.const_expr(self.fp8 and self.varlen):
                    # Vᵀ through the sequence's own map, whose key extent ends at the sequence's end
                    v_start = seq.v_start
                    if cutlass.const_expr(self.variant.v_layout == "packed"):
                        v_start = aligned_start(seq.v_start, batch)  # packed: v_start is the first token
                    mV_seq = cute.domain_offset((0, v_start), mV[None, None, head_kv])
                    v_desc = sequence_map(v_maps, batch)
                else:
                    mV_seq = self._ragged_view(mV, head_kv, seq.v_start, seq.kv_len, batch, 1)
                # rows past the end of a sequence arrive as zeros (TMA's out-of-bounds fill)
                gK = cute.local_tile(mK_seq, (t.block_n, d), (None, 0))  # (n, d, blocks)
                gV = cute.local_tile(mV_seq, (self.head_dim_v, t.block_n), (0, None))  # (d_v, n, blocks)
                tKsK, tKgK = cpasync.tma_partition(
                    k_tma, 0, one, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2)
                )
                tVsV, tVgV = cpasync.tma_partition(
                    v_tma, 0, one, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2)
                )
                self._load_q(loads, mQ_seq, m_block, q_loads)
                for n_block in range(n_end - 1, n_first - 1, -1):
                    stage, phase = ring.at(loaded + (n_end - 1 - n_block))
                    self._load_stage(k_pipe, k_tma, tKgK[None, n_block], tKsK[None, stage], stage, phase)
                    self._load_stage(v_pipe, v_tma, tVgV[None, n_block], tVsV[None, stage], stage, phase, v_desc)
        return cutlass.max(n_end - n_first, 0)

    @cute.jit
    def _load_q(self, loads, mQ_seq, m_block, q_loads):
        """A tile's Q, each consumer's rows by one TMA load, once the consumers released the
        previous tile's (`q_loads`: the Q buffer's uses so far)."""
        t = self.tiles
        wg_m = t.block_m // t.consumers
        q_pipe, _, _, sQ, _, _, (q_tma, _), _, _, _ = loads
        one = cute.make_layout(1)
        q_pipe.sync_object_empty.wait(0, q_loads % 2 ^ 1)
        q_pipe.sync_object_full.arrive(0, None)  # expects every consumer's rows
        for c in cutlass.range_constexpr(t.consumers):
            gQ = cute.local_tile(mQ_seq, (wg_m, self.head_dim), (m_block * t.consumers + c, 0))
            tQsQ, tQgQ = cpasync.tma_partition(
                q_tma, 0, one, cute.group_modes(sQ[None, None, c], 0, 2), cute.group_modes(gQ, 0, 2)
            )
            cute.copy(q_tma, tQgQ, tQsQ, tma_bar_ptr=q_pipe.sync_object_full.get_barrier(0))

    def _block_pages(self, where, n_block):
        """The page of each box of key block n_block (read from the page table: positions past
        the sequence read its last one, within the table), or -1 for a page id outside the cache."""
        pt_row, pages, _, kv_len, _ = where
        result = []
        for i in range(self.tiles.block_n // self.box_rows):
            key = cutlass.max(cutlass.min(n_block * self.tiles.block_n + i * self.box_rows, kv_len - 1), 0)
            page = cute.make_tensor(pt_row + key // self.variant.page_size, cute.make_layout(1))[0]
            result.append(cutlass.select_(page < pages, cutlass.max(page, -1), -1))
        return tuple(result)

    @cute.jit
    def _page_box(self, n_block, i, pages, where):
        """Box `i` of key block `n_block` over a paged cache: (its valid rows, where they start in
        the ragged map). Rows past the sequence's end, and all of a bad page's (id < 0), are not
        valid: they arrive as zeros."""
        _, _, rows_per_page, kv_len, _ = where
        box = self.box_rows
        key = n_block * self.tiles.block_n + i * box
        page = pages[i]
        valid = cutlass.select_(page < 0, 0, cutlass.max(cutlass.min(kv_len - key, box), 0))
        return valid, cutlass.max(page, 0) * rows_per_page + key % self.variant.page_size + valid

    @cute.jit
    def _load_paged_block(self, pipe, tma, mX, sX, block, where, keys_mode: int):
        """One K or V block of a paged cache into its ring stage, box by box: `box_rows` keys of one
        page (ragged: rows the sequence lacks, or a bad page's, are zero-filled and count toward
        the stage's bytes like any) by `d_chunk` of d. `keys_mode`: 0 for K's (keys, d) tiles, 1
        for V's (d, keys)."""
        n_block, pages, stage, phase = block
        head_kv = where[4]
        box, chunk = self.box_rows, self.d_chunk
        pipe.sync_object_empty.wait(stage, phase ^ 1)
        pipe.sync_object_full.arrive(stage, None)
        for i in cutlass.range_constexpr(self.tiles.block_n // box):
            valid, start = self._page_box(n_block, i, pages, where)
            rows = mX[None, None, head_kv, RAGGED_ROWS, start]
            for c in cutlass.range_constexpr(self.head_dim // chunk):
                if cutlass.const_expr(keys_mode == 0):
                    box_rows = cute.domain_offset((RAGGED_ROWS - valid, 0), rows)
                    g_box = cute.local_tile(box_rows, (box, chunk), (0, c))
                    s_box = cute.local_tile(sX[None, None, stage], (box, chunk), (i, c))
                else:
                    box_rows = cute.domain_offset((0, RAGGED_ROWS - valid), rows)
                    g_box = cute.local_tile(box_rows, (chunk, box), (c, 0))
                    s_box = cute.local_tile(sX[None, None, stage], (chunk, box), (c, i))
                s_part, g_part = cpasync.tma_partition(
                    tma, 0, cute.make_layout(1), cute.group_modes(s_box, 0, 2), cute.group_modes(g_box, 0, 2)
                )
                cute.copy(tma, g_part, s_part, tma_bar_ptr=pipe.sync_object_full.get_barrier(stage))

    @cute.jit
    def _load_raw_block(self, raw, k_load, v_load, block, where):
        """An e4m3 cache's key block, K's and V's, into the raw ring's next stage once the
        converters released it, box by box: `box_rows` keys of one page by the whole of d, plain
        rows (ragged as `_load_paged_block`'s: rows the sequence lacks, or a bad page's, arrive as
        zeros and count toward the stage's bytes)."""
        raw_pipe, raw_k, raw_v, _ = raw
        n_block, pages, position = block
        head_kv = where[4]
        box, d = self.box_rows, self.head_dim
        stage, phase = Ring(self.tiles.raw_stages).at(position)
        raw_pipe.sync_object_empty.wait(stage, phase ^ 1)
        raw_pipe.sync_object_full.arrive(stage, None)
        for i in cutlass.range_constexpr(self.tiles.block_n // box):
            valid, start = self._page_box(n_block, i, pages, where)
            for (atom, mX), dst in ((k_load, raw_k), (v_load, raw_v)):
                rows = cute.domain_offset((RAGGED_ROWS - valid, 0), mX[None, None, head_kv, RAGGED_ROWS, start])
                g_box = cute.local_tile(rows, (box, d), (0, 0))
                s_box = cute.local_tile(dst[None, None, stage], (box, d), (i, 0))
                s_part, g_part = cpasync.tma_partition(
                    atom, 0, cute.make_layout(1), cute.group_modes(s_box, 0, 2), cute.group_modes(g_box, 0, 2)
                )
                cute.copy(atom, g_part, s_part, tma_bar_ptr=raw_pipe.sync_object_full.get_barrier(stage))

    @cute.jit
    def _at_end_mark(self, end_word, position):
        """Whether ring position `position` is the producer's end mark: the producer writes the
        mark's position before its arrival on that position's "full" barrier, which the caller
        has waited for; lane 0 reads it, the warp shares it."""
        end = cutlass.Int32(0)
        if cute.arch.lane_idx() == 0:
            end = cute.arch.atomic_add(end_word.iterator, cutlass.Int32(0), scope="cta")
        return cute.arch.shuffle_sync(end, 0) == position

    @cute.jit
    def _convert_blocks(self, raw, pipes, stages, converted, thread):
        """An e4m3 cache's blocks, as the producer loaded them into the raw ring, converted into
        the 16-bit K and V stages (each once the consumers released it), then the stage's
        "converted" barriers take this thread's arrival and the raw stage is freed. Runs on the
        producer warpgroup's idle warps until the end mark."""
        raw_pipe, raw_k, raw_v, raw_end = raw
        k_pipe, v_pipe = pipes
        sK, sV = stages
        k_done, v_done = converted
        ring = Ring(self.tiles.stages)
        position = cutlass.Int32(0)
        ended = cutlass.Boolean(False)
        raw_ring = Ring(self.tiles.raw_stages)
        while not ended:
            raw_stage, raw_phase = raw_ring.at(position)
            raw_pipe.sync_object_full.wait(raw_stage, raw_phase)
            ended = self._at_end_mark(raw_end, position)
            if not ended:
                stage, phase = ring.at(position)
                k_pipe.sync_object_empty.wait(stage, phase ^ 1)
                self._convert_block(raw_k[None, None, raw_stage], sK[None, None, stage], thread, keys_mode=0)
                v_pipe.sync_object_empty.wait(stage, phase ^ 1)
                self._convert_block(raw_v[None, None, raw_stage], sV[None, None, stage], thread, keys_mode=1)
                # the consumers' WGMMAs read the stages through the async proxy
                cute.arch.fence_proxy("async.shared", space="cta")
                k_done.arrive(stage)
                v_done.arrive(stage)
                cute.arch.sync_warp()  # the whole warp's raw reads are done: one arrival frees it
                if cute.arch.lane_idx() == 0:
                    raw_pipe.sync_object_empty.arrive(raw_stage, None)
                position += 1

    @cute.jit
    def _convert_block(self, raw, dst, thread, keys_mode: int):
        """A raw e4m3 block (keys, d) into a 16-bit stage tile, CONVERT_PIECE elements a piece:
        K's (keys, d), or V's (d, keys) (`keys_mode` 1). e4m3 values are exact in fp16 and bf16;
        the scales join later (K's the scores', V's O's normalization). Three warps convert while
        the consumers compute, so the pieces go in batches: CONVERT_BATCH loads issued before
        the first conversion, their latencies overlapped (one piece at a time, each load waited
        for alone, ran the chunks at half the speed of 16-bit pages: bench/NOTES.md). A thread's
        last round may fall past the block: it reloads the block's last piece and stores nothing."""
        per_row = self.head_dim // CONVERT_PIECE
        total = self.tiles.block_n * per_row
        rounds = -(-total // CONVERT_THREADS)
        # the batches where every thread's pieces are in the block, in a loop the compiler keeps
        # (its pieces' addresses computed in it: unrolled, they were held across the loop and
        # spilled at the producer warpgroup's 40 registers), then the rest unrolled
        full = total // (CONVERT_THREADS * CONVERT_BATCH)
        for b in cutlass.range(full, unroll=1):
            pieces = [thread + (b * CONVERT_BATCH + i) * CONVERT_THREADS for i in range(CONVERT_BATCH)]
            loads = [cute.local_tile(raw, (1, CONVERT_PIECE), (p // per_row, p % per_row)).load() for p in pieces]
            for i in cutlass.range_constexpr(CONVERT_BATCH):
                self._store_piece(
                    dst, loads[i].to(self.mma_dtype), pieces[i] // per_row, pieces[i] % per_row, keys_mode
                )
        for first in cutlass.range_constexpr(full * CONVERT_BATCH, rounds, CONVERT_BATCH):
            batch = min(CONVERT_BATCH, rounds - first)
            pieces = [thread + (first + i) * CONVERT_THREADS for i in range(batch)]
            loads = []
            for piece in pieces:
                within = cutlass.min(piece, total - 1)
                loads.append(cute.local_tile(raw, (1, CONVERT_PIECE), (within // per_row, within % per_row)).load())
            for i in cutlass.range_constexpr(batch):
                values = loads[i].to(self.mma_dtype)
                key, col = pieces[i] // per_row, pieces[i] % per_row
                if cutlass.const_expr((first + i + 1) * CONVERT_THREADS <= total):  # every thread's piece is in
                    self._store_piece(dst, values, key, col, keys_mode)
                elif pieces[i] < total:
                    self._store_piece(dst, values, key, col, keys_mode)

    @cute.jit
    def _store_piece(self, dst, values, key, col, keys_mode: int):
        """One converted piece into the 16-bit stage: along K's d, or V's d (its tile (d, keys))."""
        if cutlass.const_expr(keys_mode == 0):
            cute.local_tile(dst, (1, CONVERT_PIECE), (key, col)).store(values)
        else:
            cute.local_tile(dst, (CONVERT_PIECE, 1), (col, key)).store(values.reshape((CONVERT_PIECE, 1)))

    @staticmethod
    def _load_stage(pipe, tma, src, dst, stage, phase, desc=None):
        """One TMA load into ring stage `stage`: wait until every consumer released it, arm its
        "full" barrier with the byte count, issue the copy that completes it (through the tensor
        map at `desc` when given, else the atom's own)."""
        pipe.sync_object_empty.wait(stage, phase ^ 1)
        pipe.sync_object_full.arrive(stage, None)
        cute.copy(tma, src, dst, tma_bar_ptr=pipe.sync_object_full.get_barrier(stage), tma_desc_ptr=desc)

    # ---------------------------------------------------------------- consumers
    def _row_copy(self):
        """16-byte pieces along d, 128 threads spread over rows (the O store): as many threads a
        row as divide both its pieces and 128, so the (rows, threads a row) grid is all 128 and
        every piece of a row is one thread's (d=96: 12 pieces, 4 threads of 3 each, 32 rows a
        pass; 64, 128, 256: one piece a thread)."""
        elems = 128 // self.out_dtype.width
        per_row = math.gcd(self.head_dim_v // elems, 128)
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.out_dtype, num_bits_per_copy=128)
        layout = cute.make_layout((128 // per_row, per_row), stride=(per_row, 1))
        return cute.make_tiled_copy_tv(atom, layout, cute.make_layout((1, elems)))

    @cute.jit
    def _consume(self, q_pipe, k_pipe, v_pipes, q_views, sK, sV, sO, tiles, seqs, shape, window, o_args, lse_args,
                 consumer, wg_tidx, scale_log2, score_scale, ticket, per_head):  # fmt: skip
        """`v_pipes`: V's pipeline and the barrier its stages are read after (e4m3: once reordered);
        `q_views`: Q as the tensor cores read it, and its words where it is converted in place
        (else None); `per_head`: the e4m3 descales and the sinks, each None where the variant
        has none."""
        v_pipe, v_full, k_full = v_pipes
        sQ, q_words = q_views
        descales, sinks = per_head
        t = self.tiles
        wg_m = t.block_m // t.consumers
        qk_mma, pv_mma = self._mmas()
        qk_mma.set(warpgroup.Field.ACCUMULATE, True)
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)
        qk_thr, pv_thr = qk_mma.get_slice(wg_tidx), pv_mma.get_slice(wg_tidx)
        tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ))  # (MMA, M, K, consumer)
        tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, N, K, stage)
        tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, N, K, stage)
        acc_O = pv_thr.make_fragment_C(pv_thr.partition_shape_C((wg_m, self.head_dim_v)))
        softmax = OnlineSoftmax.create(wgmma_rows(acc_O.layout), scale_log2, self._probability_limits())
        s_shape = qk_thr.partition_shape_C((wg_m, t.block_n))
        if cutlass.const_expr(self.fp8):
            rP = pv_thr.make_fragment_A(pv_thr.partition_shape_A((wg_m, t.block_n)))
        else:
            rP = cute.make_rmem_tensor(c_to_a_layout(qk_thr.make_fragment_C(s_shape).layout), self.mma_dtype)

        # ping-pong: consumer c issues its GEMMs after consumer c-1 issued its own, in a ring.
        # Every turn hands over to the next consumer; the last hand-over (to consumer 0) is
        # taken after the tile loop, so every arrive meets a wait whatever the tiles were.
        consumers = t.consumers
        my_turn = pipeline.NamedBarrier(barrier_id=Barrier.TURN + consumer, num_threads=256)
        their_turn = pipeline.NamedBarrier(barrier_id=Barrier.TURN + (consumer + 1) % consumers, num_threads=256)
        if consumer == consumers - 1:
            their_turn.arrive()  # consumer 0 goes first
        turns = (my_turn, their_turn)
        operands = (qk_mma, pv_mma, qk_thr, tSrQ, tSrK, tOrV, rP, acc_O, s_shape, consumer)

        first, num_tiles, grid = self._schedule(tiles)
        consumed = cutlass.Int32(0)  # K/V blocks consumed so far: the ring position
        q_loads = cutlass.Int32(0)  # Q buffer uses so far: its phase
        pipes = (q_pipe, k_pipe, v_pipe, v_full, k_full)
        args = (operands, pipes, turns, softmax, (sO, q_words), o_args, lse_args, window, wg_tidx,
                score_scale, (descales, shape.group, sinks))  # fmt: skip
        if cutlass.const_expr(self.variant.walk == "dynamic"):
            # the producer publishes each tile (`TicketWalk`); past the end: stop
            tile = ticket.read()
            while tile < num_tiles:
                m_block, head, batch = tiles.work(tile)
                if cutlass.const_expr(self.variant.count_visits):
                    self._count_visit(ticket.visits, tile, consumer, wg_tidx)
                n_blocks = self._consume_tile(args, m_block, head, batch, seqs.get(batch), consumed, q_loads)
                consumed += n_blocks
                q_loads += cutlass.min(n_blocks, 1)
                tile = ticket.read()
        else:
            if cutlass.const_expr(self.varlen):
                # A tile's (sequence, block) and its sequence's lengths are loads, one depending on
                # the other: read them ahead (this tile's row, the next tile's unit) so they arrive
                # while a tile computes instead of stalling the start of the next one.
                unit = self._unit_at(tiles, first, grid, num_tiles, shape)
                row = seqs.row(unit[2])
                next_unit = self._unit_at(tiles, first + grid, grid, num_tiles, shape)
            for tile in range(first, num_tiles, grid):
                if cutlass.const_expr(self.varlen):
                    m_block, head, batch = unit
                    seq = seqs.make(batch, row)
                    row = seqs.row(next_unit[2])
                    unit = next_unit
                    next_unit = self._unit_at(tiles, tile + 2 * grid, grid, num_tiles, shape)
                else:
                    m_block, head, batch = tiles.work(self._ordered(tile, grid, num_tiles))
                    seq = seqs.get(batch)
                n_blocks = self._consume_tile(args, m_block, head, batch, seq, consumed, q_loads)
                consumed += n_blocks
                q_loads += cutlass.min(n_blocks, 1)
        if consumer == 0:
            my_turn.arrive_and_wait()  # the last consumer's last hand-over

    @cute.jit
    def _consume_tile(self, args, m_block, head, batch, seq, consumed, q_loads):
        """One tile of this consumer's rows, from ring position `consumed` (`q_loads`: the Q
        buffer's uses so far); returns its number of K/V blocks."""
        t = self.tiles
        wg_m = t.block_m // t.consumers
        ring = Ring(t.stages)
        operands, pipes, turns, softmax, (sO, q_words), o_args, lse_args, window, wg_tidx, score_scale, per_head = args
        descales, group, sinks = per_head
        sink = None  # the head's sink logit (natural log), or None without sinks
        if cutlass.const_expr(self.variant.sinks):
            sink = cute.make_tensor(sinks + head, cute.make_layout(1))[0]
        qk_mma, pv_mma, qk_thr, tSrQ, tSrK, tOrV, rP, acc_O, s_shape, consumer = operands
        q_pipe, k_pipe, v_pipe, v_full, k_full = pipes
        my_turn, their_turn = turns
        keys = KeyRange.of(self.mask_flags, window[0], window[1], seq.q_len, seq.kv_len)
        n_first, n_end = self._key_blocks(keys, m_block, seq.q_len)
        row_tile = m_block * t.consumers + consumer
        mask = ConsumerMask.of(keys, seq, row_tile, wg_m, t.block_n)
        n_blocks = cutlass.max(n_end - n_first, 0)
        if n_blocks > 0:
            # the tile's own names (a value reassigned in a branch would be carried out of it)
            tile_softmax, tile_score_scale, out_scale = softmax, score_scale, None
            if cutlass.const_expr(descales is not None):
                # the descales join the scores' scale (softcap: the tanh's argument) and O's
                qk_descale, out_scale = descales.of_head(head, head // group)
                if cutlass.const_expr(self.mask_flags.softcap):
                    tile_score_scale = score_scale * qk_descale
                else:
                    tile_softmax = softmax.with_scale(softmax.scale_log2 * qk_descale)
            acc_O.fill(0.0)
            tile_softmax.reset()
            q_pipe.sync_object_full.wait(0, q_loads % 2)
            if cutlass.const_expr(q_words is not None):
                self._q_to_mma_dtype(q_words, consumer, wg_tidx)

            # blocks at the top that none of this consumer's rows see are only handed through
            start, top, count = consumed, n_end, n_blocks
            if cutlass.const_expr(self._may_skip_unseen()):
                skipped = self._skip_unseen(keys, seq, row_tile, n_end, n_blocks, consumed, pipes, turns)
                start, top, count = consumed + skipped, n_end - skipped, n_blocks - skipped

            # Software pipeline: step j issues S_j = Q K_jᵀ and O += P_{j-1} V_{j-1}
            # together, then runs softmax(S_j) while P V is still on the tensor cores.
            acc_S = qk_thr.make_fragment_C(s_shape)
            acc_S.fill(0.0)
            stage, phase = ring.at(start)
            k_full.wait(stage, phase)
            my_turn.arrive_and_wait()
            warpgroup.fence()
            self._gemm_qk(qk_mma, acc_S, tSrQ, tSrK, stage, consumer)
            warpgroup.commit_group()
            their_turn.arrive()
            warpgroup.wait_group(0)
            self._release(k_pipe, stage)
            if cutlass.const_expr(t.o_buffer):
                if count == 1:
                    self._release(q_pipe, 0)  # the tile's last read of Q
            n_block = top - 1
            if n_block < mask.full_first or n_block >= mask.full_end:
                self._scores(qk_thr, acc_S, tile_softmax, mask, n_block, tile_score_scale, True)
            else:
                self._scores(qk_thr, acc_S, tile_softmax, mask, n_block, tile_score_scale, False)
            self._store_p(acc_S, rP)

            # the steps in three loops, so each loop's body is straight-line code: blocks
            # this consumer's rows see in part on the right (e.g. the causal diagonal), blocks
            # they see whole, blocks they see in part on the left (a window)
            right_end = cutlass.max(cutlass.min(top - mask.full_end, count), 1)
            whole_end = cutlass.max(cutlass.min(top - mask.full_first, count), right_end)
            tile_steps = TileSteps(ring, start, top, count, mask, tile_score_scale)
            for step in range(1, right_end, 1):
                self._step(operands, pipes, turns, tile_softmax, tile_steps, step, True)
            for step in range(right_end, whole_end, 1):
                self._step(operands, pipes, turns, tile_softmax, tile_steps, step, False)
            for step in range(whole_end, count, 1):
                self._step(operands, pipes, turns, tile_softmax, tile_steps, step, True)

            last_stage, last_phase = ring.at(consumed + n_blocks - 1)
            v_full.wait(last_stage, last_phase)
            my_turn.arrive_and_wait()
            warpgroup.fence()
            self._gemm_pv(pv_mma, acc_O, rP, tOrV, last_stage, self._pv_keeps(count - 1))
            warpgroup.commit_group()
            their_turn.arrive()
            warpgroup.wait_group(0)
            self._release(v_pipe, last_stage)
            if cutlass.const_expr(self._promotes()):
                if count - 1 >= PROMOTE_BLOCKS:
                    acc_O.store(acc_O.load() + self._load_total(acc_O, consumer).load())
                # sO's bytes hold other threads' totals until every thread has taken its own
                pipeline.NamedBarrier(barrier_id=Barrier.EPILOGUE + consumer, num_threads=128).arrive_and_wait()

            self._epilogue(pv_mma, acc_O, tile_softmax, sO[None, None, consumer], o_args, lse_args, seq, head, row_tile,
                           consumer, wg_tidx, out_scale, sink)  # fmt: skip
            if cutlass.const_expr(not t.o_buffer):
                # O has left the Q buffer. Its st/ld.shared are the generic proxy and the next
                # tile's Q arrives by TMA (the async proxy): PTX orders the two only through a
                # proxy fence, by every thread, before the release (bench/NOTES.md, decode v5)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_warp()
                self._release(q_pipe, 0)
        else:
            self._empty_rows(pv_mma, o_args, lse_args, seq, head, row_tile, wg_tidx, sink)
        return n_blocks

    @cute.jit
    def _q_to_mma_dtype(self, q_words, consumer, wg_tidx):
        """This consumer's rows of a bf16 Q, in place, into fp16 (`mma_dtype`: the tensor cores'
        over an e4m3 cache), saturating at +-65,280 (bf16's largest value within fp16's range);
        every 16-bit value keeps its place, so the swizzle does not matter. Each thread takes
        16-byte pieces, Q_CONVERT_BATCH pieces' loads issued before their conversion (more would
        hold registers the accumulators need at d=256); then the writes are fenced for the
        WGMMAs (async proxy) and the consumer's 128 threads meet. Once a tile: a tile's Q is read
        by each of its key blocks' WGMMAs."""
        words = self.tiles.block_m // self.tiles.consumers * self.head_dim // 2  # one consumer's
        rounds = words // (4 * 128)
        first = consumer * words // 4 + wg_tidx  # in 16-byte pieces
        for start in cutlass.range_constexpr(0, rounds, Q_CONVERT_BATCH):
            batch = min(Q_CONVERT_BATCH, rounds - start)
            held = cute.make_rmem_tensor(4 * batch, cutlass.Int32)
            for r in cutlass.range_constexpr(batch):
                piece = cute.local_tile(q_words, (4,), (first + (start + r) * 128,))
                cute.local_tile(held, (4,), (r,)).store(piece.load())
            for w in cutlass.range_constexpr(4 * batch):
                held[w] = bf16_pair_to_fp16(held[w])
            for r in cutlass.range_constexpr(batch):
                piece = cute.local_tile(q_words, (4,), (first + (start + r) * 128,))
                piece.store(cute.local_tile(held, (4,), (r,)).load())
        cute.arch.fence_proxy("async.shared", space="cta")
        pipeline.NamedBarrier(barrier_id=Barrier.EPILOGUE + consumer, num_threads=128).arrive_and_wait()

    @cute.jit
    def _count_visit(self, visits, tile, consumer, wg_tidx):
        """Debug builds (`count_visits`): one more visit of `tile` by consumer `consumer`, in the
        workspace's int32 table (tile, consumer), for the stress test of the dynamic walk."""
        if wg_tidx == 0:
            cute.arch.atomic_add(visits + (tile * self.tiles.consumers + consumer), cutlass.Int32(1), scope="gpu")

    def _may_skip_unseen(self) -> bool:
        """Whether a consumer's rows can miss the top key block of a tile: rows of a tile that
        span several key blocks (d=64: 192 over 128; d=256: 128 over 64), or a diagonal moved
        off the block grid (bottom-right, windows). Top-left causal 128 over 128 never does."""
        f = self.mask_flags
        return f.right and (self.tiles.block_m > self.tiles.block_n or f.bottom_right or f.left)

    @cute.jit
    def _skip_unseen(self, keys, seq, row_tile, n_end, n_blocks, consumed, pipes, turns):
        """The key blocks at the top of a tile that none of this consumer's rows see (a 192-row
        tile over 128-key blocks has one for some consumers; a bottom-right diagonal can make
        one): take their turns and release their stages once loaded, computing nothing.
        Returns how many; at least one block is left. Waiting for the loads keeps a release
        from counting toward the stage's previous use."""
        t = self.tiles
        wg_m = t.block_m // t.consumers
        ring = Ring(t.stages)
        _, k_pipe, v_pipe, v_full, k_full = pipes
        my_turn, their_turn = turns
        first_row = row_tile * wg_m
        _, mine_end = keys.blocks(first_row, cutlass.min(first_row + wg_m, seq.q_len) - 1, t.block_n)
        skipped = cutlass.max(cutlass.min(n_end - mine_end, n_blocks - 1), 0)
        for j in range(0, skipped, 1):
            stage, phase = ring.at(consumed + j)
            k_full.wait(stage, phase)
            v_full.wait(stage, phase)
            my_turn.arrive_and_wait()
            their_turn.arrive()
            self._release(k_pipe, stage)
            self._release(v_pipe, stage)
        return skipped

    @cute.jit
    def _release(self, pipe, stage):
        """A consumer warp is done with a stage: one arrival per warp (lane 0), after the whole
        warp's reads (WGMMA reads end at wait_group, which every lane passed)."""
        if cute.arch.lane_idx() == 0:
            pipe.sync_object_empty.arrive(stage, None)

    @cute.jit
    def _gemm_qk(self, qk_mma, acc_S, tSrQ, tSrK, stage, consumer):
        # Q's descriptors: indexing the consumer's buffer at each issue lets ptxas keep them in
        # uniform registers at d <= 128; at d=256 it moves them from general registers instead
        # (bench/NOTES.md v18), so there the consumer's slice is taken once
        q_mine = tSrQ[None, None, None, consumer]
        for kk in cutlass.range_constexpr(cute.size(tSrQ.shape[2])):
            q_k = tSrQ[None, None, kk, consumer] if cutlass.const_expr(self.head_dim <= 128) else q_mine[None, None, kk]
            cute.gemm(qk_mma, acc_S, q_k, tSrK[None, None, kk, stage], acc_S)

    def _pv_keeps(self, block):
        """Whether the tile's P V of key block `block` adds to O's accumulator: None (always) unless
        O is promoted, then not on the first block after a promotion (nor the tile's first)."""
        if cutlass.const_expr(not self._promotes()):
            return None
        return block % PROMOTE_BLOCKS != 0

    @cute.jit
    def _gemm_pv(self, pv_mma, acc_O, rP, tOrV, stage, keep=None):
        """O += P V; with `keep` (a runtime flag) O = P V where it is False."""
        for kk in cutlass.range_constexpr(cute.size(rP.shape[2])):
            mma = pv_mma if cutlass.const_expr(keep is None or kk > 0) else accumulating_if(pv_mma, keep)
            cute.gemm(mma, acc_O, rP[None, None, kk], tOrV[None, None, kk, stage], acc_O)

    @cute.jit
    def _step(self, operands, pipes, turns, softmax, tile: "TileSteps", step, masked: bool):
        """Step j of a tile: issue S_j = Q K_jᵀ and O += P_{j-1} V_{j-1} in this consumer's
        turn, then softmax(S_j) while P V still runs. V_{j-1} is waited for after S_j is
        issued (the two loads complete separately). `masked`: the block is one this
        consumer's rows see in part (a separate loop, so each loop's body is straight-line).
        K_j (and Q after the tile's last S) are released as soon as S_j is complete: nothing
        reads them again (a warp that needs the exact step takes it from S_j, `_fast_softmax`)."""
        qk_mma, pv_mma, qk_thr, tSrQ, tSrK, tOrV, rP, acc_O, s_shape, consumer = operands
        q_pipe, k_pipe, v_pipe, v_full, k_full = pipes
        my_turn, their_turn = turns
        stage, phase = tile.ring.at(tile.consumed + step)
        prev_stage, prev_phase = tile.ring.at(tile.consumed + step - 1)
        acc_S = qk_thr.make_fragment_C(s_shape)
        acc_S.fill(0.0)
        k_full.wait(stage, phase)
        my_turn.arrive_and_wait()
        warpgroup.fence()
        self._gemm_qk(qk_mma, acc_S, tSrQ, tSrK, stage, consumer)
        warpgroup.commit_group()
        v_full.wait(prev_stage, prev_phase)
        self._gemm_pv(pv_mma, acc_O, rP, tOrV, prev_stage, self._pv_keeps(step - 1))
        warpgroup.commit_group()
        their_turn.arrive()
        warpgroup.wait_group(1)  # S_j is ready; P V may still run
        n_block = tile.n_end - 1 - step
        self._release_reads(pipes, stage, step, tile)
        scores_of = (qk_thr, tile, n_block, masked)
        if cutlass.const_expr(self._fast_softmax() and self.fp8):
            self._fast_tail_one_branch(acc_S, rP, acc_O, softmax, scores_of, v_pipe, prev_stage, step, consumer)
        else:
            if cutlass.const_expr(self._fast_softmax()):
                self._fast_tail_two_branches(acc_S, rP, acc_O, softmax, scores_of, v_pipe, prev_stage)
            else:
                self._exact_tail(acc_S, rP, acc_O, softmax, scores_of, v_pipe, prev_stage)

    @cute.jit
    def _exact_tail(self, acc_S, rP, acc_O, softmax, scores_of, v_pipe, prev_stage):
        """`_step`'s softmax and tail with each block's max (`OnlineSoftmax.update`): P_j goes
        into rP once P_(j-1) V_(j-1) is done, after O's rescale where the max moved."""
        qk_thr, tile, n_block, masked = scores_of
        moved = self._scores(qk_thr, acc_S, softmax, tile.mask, n_block, tile.score_scale, masked)
        self._pv_done(v_pipe, prev_stage)
        if moved:
            softmax.rescale(wgmma_rows_by_cols(acc_O))
        self._store_p(acc_S, rP)

    @cute.jit
    def _fast_tail_two_branches(self, acc_S, rP, acc_O, softmax, scores_of, v_pipe, prev_stage):
        """`_step`'s fast softmax and tail for 16-bit P: P_j is packed aside while P_(j-1) V_(j-1)
        still reads rP, and S_j stays whole; a warp with a thread that needs the exact step takes
        it from S_j by itself before P V ends, and rescales O after."""
        qk_thr, tile, n_block, masked = scores_of
        p_next = cute.make_fragment_like(rP)
        moved = cutlass.Boolean(False)
        retry = self._scores(qk_thr, acc_S, softmax, tile.mask, n_block, tile.score_scale, masked, p_next)
        if cute.arch.vote_any_sync(retry):
            moved = softmax.update(wgmma_rows_by_cols(acc_S))
            self._store_p(acc_S, p_next)
        else:
            softmax.accept_fast()
        self._pv_done(v_pipe, prev_stage)
        if moved:
            softmax.rescale(wgmma_rows_by_cols(acc_O))
        self._copy_p(p_next, rP)

    @cute.jit
    def _fast_tail_one_branch(self, acc_S, rP, acc_O, softmax, scores_of, v_pipe, prev_stage, step, consumer):
        """`_step`'s fast softmax and tail for e4m3 P: as `_fast_tail_two_branches`, but the
        warp with a thread that needs the exact step takes it once P V is done, in the one
        branch that also rescales O (the fast path runs straight on to P's copy). Measured
        against the two branches: e4m3 +1 to +4 %, bf16 -1 to -3 % (bench/NOTES.md, FP8 v7)."""
        qk_thr, tile, n_block, masked = scores_of
        p_next = cute.make_fragment_like(rP)
        retry = self._scores(qk_thr, acc_S, softmax, tile.mask, n_block, tile.score_scale, masked, p_next)
        redo = cute.arch.vote_any_sync(retry)
        self._pv_done(v_pipe, prev_stage)
        if redo:
            if softmax.update(wgmma_rows_by_cols(acc_S)):
                softmax.rescale(wgmma_rows_by_cols(acc_O))
                if cutlass.const_expr(self._promotes()):
                    if step > PROMOTE_BLOCKS:
                        self._rescale_total(softmax, acc_O, consumer)
            self._store_p(acc_S, rP)
        else:
            softmax.accept_fast()
            self._copy_p(p_next, rP)
        if cutlass.const_expr(self._promotes()):
            if step % PROMOTE_BLOCKS == 0:
                self._promote(acc_O, consumer, step == PROMOTE_BLOCKS)

    def _total_parts(self, consumer):
        """This thread's float32 O totals (`_promotes`): two (4, pieces) shared-memory views, for the
        first half of its accumulator's registers and the second."""
        t = self.tiles
        wg_tidx = cute.arch.thread_idx()[0] % 128
        half = (t.block_m // t.consumers) * self.head_dim_v // 128 // 2  # floats
        layout = cute.make_layout((4, half // 4), stride=(1, 4 * 128))
        offset = cute.assume(consumer * (128 * half) + wg_tidx * 4, divby=4)
        return tuple(cute.make_tensor(base + offset, layout) for base in self._totals)

    def _total_pieces(self, fragment, consumer):
        """(shared-memory part, the fragment's registers it holds) for each half of the total."""
        flat = cute.make_tensor(fragment.iterator, cute.make_layout((4, cute.size(fragment) // 4), stride=(1, 4)))
        half = cute.size(fragment) // 8
        parts = self._total_parts(consumer)
        return [(parts[i], cute.local_tile(flat, (4, half), (0, i))) for i in range(2)]

    @cute.jit
    def _load_total(self, acc_O, consumer):
        """O's float32 total so far, in a fragment like the accumulator."""
        total = cute.make_fragment_like(acc_O)
        for part, registers in self._total_pieces(total, consumer):
            cute.autovec_copy(part, registers)
        return total

    @cute.jit
    def _store_total(self, total, consumer):
        """A fragment like the accumulator into this thread's float32 total."""
        for part, registers in self._total_pieces(total, consumer):
            cute.autovec_copy(registers, part)

    @cute.jit
    def _promote(self, acc_O, consumer, first):
        """O's accumulator into its float32 total (the total becomes it on the tile's first
        promotion); the next P V starts the accumulator from zero."""
        if first:
            self._store_total(acc_O, consumer)
        else:
            total = self._load_total(acc_O, consumer)
            total.store(total.load() + acc_O.load())
            self._store_total(total, consumer)

    @cute.jit
    def _rescale_total(self, softmax, acc_O, consumer):
        """The float32 total times the rows' corrections, as O's accumulator was."""
        total = self._load_total(acc_O, consumer)
        softmax.rescale(wgmma_rows_by_cols(total))
        self._store_total(total, consumer)

    @cute.jit
    def _pv_done(self, v_pipe, prev_stage):
        """Wait for P_(j-1) V_(j-1): O and rP are free again, and V_(j-1)'s stage is released."""
        warpgroup.wait_group(0)
        self._release(v_pipe, prev_stage)

    @cute.jit
    def _copy_p(self, p_next, rP):
        """P packed aside into rP, word by word through `register_copy` (a plain copy lets the
        compiler merge the two fragments' registers, and ptxas then serializes every WGMMA)."""
        words, next_words = cute.recast_tensor(rP, cutlass.Int32), cute.recast_tensor(p_next, cutlass.Int32)
        for w in cutlass.range_constexpr(cute.size(words)):
            words[w] = register_copy(next_words[w])

    @cute.jit
    def _store_p_row(self, r, probs, rP, s_layout):
        """Row r's probabilities (this thread's values of the row in column order, as
        `wgmma_rows_by_cols` lists them) into P, as `_store_p` packs them."""
        if cutlass.const_expr(not self.fp8):
            wgmma_rows_by_cols(cute.make_tensor(rP.iterator, s_layout))[r, None].store(probs.to(self.mma_dtype))
        else:
            row = cute.make_rmem_tensor(cute.size(probs.shape), cutlass.Float32)
            row.store(probs)
            words = cute.recast_tensor(rP, cutlass.Int32)  # word r + 2·g: row r, keys 16g..16g+15
            for g in cutlass.range_constexpr(cute.size(row) // 4):
                x = (row[4 * g], row[4 * g + 1], row[4 * g + 2], row[4 * g + 3])  # cols 4g..: keys 2c, 2c+1, 2c+8, 2c+9
                words[r + 2 * g] = self._p_word(x)

    @cute.jit
    def _p_word(self, x):
        """Four probabilities of one row and 16 keys (keys 2c, 2c + 1, 2c + 8, 2c + 9 at lane c of
        the quad) -> the e4m3 A-operand word this lane holds (`_store_p`)."""
        if cutlass.const_expr(self.tiles.v_reorder or self.variant.v_in_p_order):
            return e4m3_word(*x)
        lane = cute.arch.lane_idx()
        c = lane % 4
        src_lo, src_hi = lane - c + (2 * c) % 4, lane - c + (2 * c + 1) % 4
        select = cutlass.select_(c < 2, cutlass.Int32(0x5410), cutlass.Int32(0x7632))
        return e4m3_quad_word(*x, src_lo, src_hi, select)

    @cute.jit
    def _store_p(self, acc_S, rP):
        """The probabilities S_j (fp32, accumulator layout) into P, the next P V's A operand.
        16-bit P: the layouts agree, a conversion. e4m3 P: lane c of a quad holds keys 2c, 2c + 1,
        2c + 8, 2c + 9 of each 16 in the accumulator, where the A word of keys 4c..4c + 3 is
        due. With V's keys reordered (`v_reorder`) the four are packed as they are; else each 16
        keys of a row are packed to a word and the quad swaps them (`e4m3_quad_word`)."""
        if cutlass.const_expr(not self.fp8):
            cute.make_tensor(rP.iterator, acc_S.layout).store(acc_S.load().to(self.mma_dtype))
        else:
            words = cute.recast_tensor(rP, cutlass.Int32)  # word v1 + 2·g: row half v1, keys 16g..16g+15
            for g in cutlass.range_constexpr(cute.size(acc_S) // 8):
                for half in cutlass.range_constexpr(2):
                    at = 8 * g + 2 * half  # accumulator (col pair, row half, n8 block 2g and 2g+1)
                    words[half + 2 * g] = self._p_word((acc_S[at], acc_S[at + 1], acc_S[at + 4], acc_S[at + 5]))

    @cute.jit
    def _release_reads(self, pipes, stage, step, tile: "TileSteps"):
        """S_j's operands are read: release K_j, and Q after the tile's last S (own O buffer)."""
        q_pipe, k_pipe, _, _, _ = pipes
        self._release(k_pipe, stage)
        if cutlass.const_expr(self.tiles.o_buffer):
            if step == tile.n_blocks - 1:
                self._release(q_pipe, 0)  # the tile's last read of Q

    def _probability_limits(self) -> ProbabilityLimits:
        """16-bit P: the online softmax's defaults. e4m3 P (at most 448): the reference max
        moves with any growth, so an exact step's probabilities are at most 1 (a row's largest
        exactly 1), scaled by 2**8: e4m3's range below 448, so fewer small probabilities flush
        to zero. With the fast steps (d=128) a thread's sum of one row's 32 scaled
        probabilities must stay at most 448, so there the scale is 2**3 (32 probabilities of 1
        pass). A fast step keeps probabilities up to 56 (a block whose max grew a little): its
        rounding is then the same 2**-4 at most. Bounding them by 1 instead (a retry whenever
        any row's max grows) measured 0.6x (bench/NOTES.md, FP8 v1)."""
        if not self.fp8:
            return ProbabilityLimits()
        p_scale_log2 = 3.0 if self._fast_softmax() else 8.0
        return ProbabilityLimits(rescale_log2=0.0, fast_sum_limit=E4M3_MAX, p_scale_log2=p_scale_log2)

    def _promotes(self) -> bool:
        """Whether O is taken out of the tensor cores' accumulator every PROMOTE_BLOCKS blocks
        (`o_float32`: e4m3 at d=128, whose steps take the e4m3 fast tail)."""
        return self.variant.o_float32

    def _fast_softmax(self) -> bool:
        """Whether the steps after a tile's first take probabilities against the reference max
        without computing each block's max (`OnlineSoftmax.update_fast`). Measured (bench/NOTES.md
        v22): +1 to +5.5 % at d=128; at d=64 its live state spills (three consumers at 160
        registers) and at d=256 the later K release costs more than the shorter softmax saves."""
        return self.head_dim == 128

    @cute.jit
    def _scores(self, qk_thr, acc_S, softmax, mask, n_block, score_scale, masked: bool, fast_p=None):
        """S_j -> probabilities: softcap, mask (a block some row sees in part), softmax. Returns
        whether O must be rescaled (`OnlineSoftmax.update`). With `fast_p` (a P fragment): against
        the reference max as it stands, packed into `fast_p` with S_j left as the masked scores,
        returning whether this thread needs the exact step (`update_fast`)."""
        if cutlass.const_expr(self.mask_flags.softcap):
            acc_S.store(cute.math.tanh(acc_S.load() * score_scale, fastmath=True))
        s_mn = wgmma_rows_by_cols(acc_S)
        if cutlass.const_expr(masked):
            mask.apply(qk_thr, s_mn, n_block)
        if cutlass.const_expr(fast_p is not None):
            return softmax.update_fast(s_mn, lambda r, probs: self._store_p_row(r, probs, fast_p, acc_S.layout))
        return softmax.update(s_mn)

    def _out_rows(self, o_args, seq, head):
        """This (sequence, head)'s O rows, (q_len, d_v); strides are multiples of 8 (checked at build)."""
        o, o_sh, o_ss = o_args
        # every term is a multiple of 8 elements (the build checks the strides)
        base = o + cute.assume(seq.o_offset + cutlass.Int64(head) * o_sh, divby=8)
        return cute.make_tensor(base, cute.make_layout((seq.q_len, self.head_dim_v), stride=(o_ss, 1)))

    @cute.jit
    def _epilogue(
        self, pv_mma, acc_O, softmax, sO, o_args, lse_args, seq, head, row_tile, consumer, wg_tidx, out_scale, sink
    ):
        """Normalize O (times `out_scale`, V's descale, unless None; the head's `sink` logit in
        the denominator unless None), stage it through shared memory (its own buffer, or this
        warpgroup's Q buffer, whose last S = Q Kᵀ is done) and store whole 16-byte row pieces;
        write the LSE."""
        t = self.tiles
        wg_m = t.block_m // t.consumers
        d = self.head_dim_v
        softmax.normalize(wgmma_rows_by_cols(acc_O), out_scale, sink)
        rO = cute.make_fragment_like(acc_O, self.out_dtype)
        rO.store(acc_O.load().to(self.out_dtype))
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.out_dtype), pv_mma)
        r2s_thr = r2s.get_slice(wg_tidx)
        cute.copy(r2s, r2s_thr.retile(rO), r2s_thr.partition_D(sO))
        pipeline.NamedBarrier(barrier_id=Barrier.EPILOGUE + consumer, num_threads=128).arrive_and_wait()

        s2g = self._row_copy().get_slice(wg_tidx)
        mO = self._out_rows(o_args, seq, head)
        gO = cute.local_tile(mO, (wg_m, d), (row_tile, 0))
        cO = cute.local_tile(cute.make_identity_tensor((seq.q_len, d)), (wg_m, d), (row_tile, 0))
        tOsO, tOgO, tOcO = s2g.partition_S(sO), s2g.partition_D(gO), s2g.partition_D(cO)
        tOrO = cute.make_fragment_like(tOgO, self.out_dtype)
        cute.copy(s2g, tOsO, tOrO)
        for m in cutlass.range_constexpr(cute.size(tOgO.shape[1])):
            if tOcO[0, m, 0][0] < seq.q_len:
                cute.copy(s2g, tOrO[None, m, None], tOgO[None, m, None])

        if cutlass.const_expr(self.has_lse):
            c_mn = wgmma_rows_by_cols(pv_mma.get_slice(wg_tidx).partition_C(cO))
            mLSE = self._lse_rows(lse_args, seq, head)
            for r in cutlass.range_constexpr(cute.size(softmax.row_sum)):
                row = c_mn[r, 0][0]
                if wg_tidx % 4 == 0 and row < seq.q_len:
                    mLSE[row] = softmax.lse(r, sink is not None)

    @cute.jit
    def _empty_rows(self, pv_mma, o_args, lse_args, seq, head, row_tile, wg_tidx, sink):
        """A tile whose rows see no key: O = 0 and LSE = -inf (with sinks: the sink's logit, its
        only term), straight from registers."""
        t = self.tiles
        wg_m = t.block_m // t.consumers
        d = self.head_dim_v
        s2g = self._row_copy().get_slice(wg_tidx)
        mO = self._out_rows(o_args, seq, head)
        gO = cute.local_tile(mO, (wg_m, d), (row_tile, 0))
        cO = cute.local_tile(cute.make_identity_tensor((seq.q_len, d)), (wg_m, d), (row_tile, 0))
        tOgO, tOcO = s2g.partition_D(gO), s2g.partition_D(cO)
        tOrO = cute.make_fragment_like(tOgO, self.out_dtype)
        tOrO.fill(0.0)
        for m in cutlass.range_constexpr(cute.size(tOgO.shape[1])):
            if tOcO[0, m, 0][0] < seq.q_len:
                cute.copy(s2g, tOrO[None, m, None], tOgO[None, m, None])
        if cutlass.const_expr(self.has_lse):
            c_mn = wgmma_rows_by_cols(pv_mma.get_slice(wg_tidx).partition_C(cO))
            mLSE = self._lse_rows(lse_args, seq, head)
            empty = -cutlass.Float32.inf  # with sinks: the sink, the only term of such a row
            if cutlass.const_expr(sink is not None):
                empty = sink
            for r in cutlass.range_constexpr(cute.size(c_mn.shape[0])):
                row = c_mn[r, 0][0]
                if wg_tidx % 4 == 0 and row < seq.q_len:
                    mLSE[row] = empty

    def _lse_rows(self, lse_args, seq, head):
        lse, lse_sh, lse_ss = lse_args
        base = lse + (seq.lse_offset + cutlass.Int64(head) * lse_sh)
        return cute.make_tensor(base, cute.make_layout(seq.q_len, stride=lse_ss))
