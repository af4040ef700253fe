"""What the SDPA kernels share: the mask (which keys each query row sees), constants, quad
reductions, and the DSL's names for the plan's dtypes.

The mask is defined once, here, and used by the attention kernel (to skip key blocks no row
of a tile sees and to mask the blocks some rows see only in part) and by the scheduling kernel
(to order tiles by the key blocks they visit).
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op
from frost_runtime.dtypes import DTYPES

from frostc.kernels.interface import F32, Group

LOG2_E = 1.4426950408889634
LN_2 = 0.6931471805599453


def dsl_dtype(name: str):
    return getattr(cutlass, DTYPES[name].dsl)


@dataclass(frozen=True)
class SoftmaxScales(Group):
    """The attention kernels' score scales: the softmax's, in log2 units (with softcap: the
    cap's), and with softcap the tanh's argument's (else 0)."""

    scale_log2: F32
    score_scale: F32


@dataclass(frozen=True)
class MaskFlags:
    """The compile-time shape of a mask; the bounds themselves are kernel arguments.

    Query row i of a sequence sees key j when lo(i) <= j < hi(i), with the diagonal at
    i + shift (shift = s_kv - s_q when bottom-right aligned, else 0):
      hi(i) = min(s_kv, i + shift + window_right + 1)  with `right` (causal: window_right = 0)
      lo(i) = max(0, i + shift - window_left)          with `left`
    and softcap replaces each scaled score s by softcap * tanh(s / softcap) before the softmax.
    """

    right: bool = False
    left: bool = False
    bottom_right: bool = False
    softcap: bool = False

    @property
    def label(self) -> str:
        """The mask's part of a variant name: full | causal | local, _br, .softcap."""
        base = "local" if self.left else "causal" if self.right else "full"
        if self.bottom_right:
            base += "_br"
        return base + (".softcap" if self.softcap else "")


@dataclass(frozen=True)
class KeyRange:
    """Which key blocks the query rows of one sequence see, for one tile at a time.

    Built inside a kernel from DSL integers (`of`); every method is plain arithmetic (no
    control flow), so it traces the same in any kernel. Rows and keys are sequence-relative.
    Frozen: the DSL passes read-only frozen dataclasses into loops and branches as they are."""

    flags: MaskFlags
    window_left: cutlass.Int32
    window_right: cutlass.Int32
    kv_len: cutlass.Int32
    shift: cutlass.Int32  # the diagonal's key for query row 0

    @staticmethod
    def of(flags: MaskFlags, window_left, window_right, q_len, kv_len) -> "KeyRange":
        shift = kv_len - q_len if flags.bottom_right else cutlass.Int32(0)
        return KeyRange(flags, window_left, window_right, kv_len, shift)

    def hi(self, row):
        """One past the last key `row` sees (may be <= 0: none)."""
        if cutlass.const_expr(self.flags.right):
            return cutlass.min(self.kv_len, row + self.shift + self.window_right + 1)
        return self.kv_len

    def lo(self, row):
        """The first key `row` sees (>= 0)."""
        if cutlass.const_expr(self.flags.left):
            return cutlass.max(row + self.shift - self.window_left, 0)
        return cutlass.Int32(0)

    def blocks(self, first_row, last_row, block_n: int):
        """(first, end) key blocks that rows first_row..last_row see at all; end <= first: none."""
        end = (cutlass.max(self.hi(last_row), 0) + (block_n - 1)) // block_n
        first = cutlass.min(self.lo(first_row) // block_n, end)
        return first, end

    def full_blocks(self, first_row, last_row, block_n: int):
        """(first, end) key blocks that every row of first_row..last_row sees whole: those need no mask."""
        first = (self.lo(last_row) + (block_n - 1)) // block_n
        end = cutlass.max(self.hi(first_row), 0) // block_n
        return first, end


QUAD_LANES = (2, 1)  # the 4 threads of a quad hold the same accumulator rows
COLUMN_LANES = (16, 8, 4)  # ... and the 8 threads of a lane % 4 class an m16n8 tile's same columns


def lane_reduce(value, combine, lanes: tuple[int, ...]):
    """`value` combined over the lanes that differ from this one in the bits of `lanes`."""
    for offset in lanes:
        value = combine(value, cute.arch.shuffle_sync_bfly(value, offset=offset, mask=-1, mask_and_clamp=31))
    return value


def _asm_word(text: str, operands: list, constraints: str, side_effects: bool):
    """One 32-bit result of inline PTX `text` over `operands` (MLIR values)."""
    word = llvm.inline_asm(
        T.i32(), operands, text, constraints,
        has_side_effects=side_effects, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )  # fmt: skip
    return cutlass.Int32(word)


@dsl_user_op
def register_copy(word, *, loc=None, ip=None):
    """`word` into a register of its own: a copy the compiler cannot fold away. A WGMMA's
    register operands must not be written while it runs; a value built aside for the next one
    would otherwise be coalesced with the running one's registers (ptxas then serializes every
    WGMMA: C7513)."""
    return _asm_word("mov.b32 $0, $1;", [cutlass.Int32(word).ir_value(loc=loc, ip=ip)], "=r,r", side_effects=False)


@dsl_user_op
def e4m3_quad_word(x0, x1, x2, x3, src_lo, src_hi, select, *, loc=None, ip=None):
    """Four fp32 values -> e4m3 bytes (round to nearest, saturating), packed in a word that is
    swapped within the quad: the result is bytes 0-1 (`select` 0x5410) or 2-3 (0x7632) of lane
    `src_lo`'s word, then the same bytes of lane `src_hi`'s. Every lane of the warp must call it."""
    values = [cutlass.Float32(x).ir_value(loc=loc, ip=ip) for x in (x0, x1, x2, x3)]
    lanes = [cutlass.Int32(x).ir_value(loc=loc, ip=ip) for x in (src_lo, src_hi, select)]
    return _asm_word(
        "{\n.reg .b16 lo, hi;\n.reg .b32 w, a, b;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
        "mov.b32 w, {lo, hi};\n"
        "shfl.sync.idx.b32 a, w, $5, 31, 0xffffffff;\n"
        "shfl.sync.idx.b32 b, w, $6, 31, 0xffffffff;\n"
        "prmt.b32 $0, a, b, $7;\n}",
        values + lanes,
        "=r,f,f,f,f,r,r,r",
        side_effects=True,  # shfl.sync: kept where it is, with the whole warp
    )


@dsl_user_op
def bf16_pair_to_fp16(word, *, loc=None, ip=None):
    """Two bf16 values (a word) -> the same two in fp16, saturating at +-65,280 (0x477F: bf16's
    largest value within fp16's range; NaN stays NaN), so every value fp16 can hold is kept
    exactly but for fp16's subnormals (below 2**-14)."""
    return _asm_word(
        "{\n.reg .b32 limit, c, lo, hi;\n"
        "mov.b32 limit, 0x477F477F;\n"
        "min.NaN.bf16x2 c, $1, limit;\n"
        "mov.b32 limit, 0xC77FC77F;\n"
        "max.NaN.bf16x2 c, c, limit;\n"
        "shl.b32 lo, c, 16;\n"
        "and.b32 hi, c, 0xFFFF0000;\n"
        "cvt.rn.f16x2.f32 $0, hi, lo;\n}",
        [cutlass.Int32(word).ir_value(loc=loc, ip=ip)],
        "=r,r",
        side_effects=False,
    )


@dsl_user_op
def e4m3_word(x0, x1, x2, x3, *, loc=None, ip=None):
    """Four fp32 values -> e4m3 bytes 0-3 of a word (round to nearest, saturating)."""
    values = [cutlass.Float32(x).ir_value(loc=loc, ip=ip) for x in (x0, x1, x2, x3)]
    return _asm_word(
        "{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
        "mov.b32 $0, {lo, hi};\n}",
        values,
        "=r,f,f,f,f",
        side_effects=False,
    )


# P's register order of 16 keys: the key at each place, word c holding 2c, 2c + 1, 2c + 8, 2c + 9
# (the keys whose probabilities lane c of a quad holds in an fp32 accumulator); vt_pack.py writes
# Vᵀ so, `keys_in_accumulator_order` reorders it so in shared memory
P_KEY_ORDER = tuple(2 * c + j for c in range(4) for j in (0, 1, 8, 9))
# ... as prmt.b32 does it: output word c of 16 keys (four little-endian words of 4) is
# prmt.b32(word a, word b, selector) for the (a, b, selector) at c
KEY_ORDER_PRMT = ((0, 2, 0x5410), (0, 2, 0x7632), (1, 3, 0x5410), (1, 3, 0x7632))


@dsl_user_op
def keys_in_accumulator_order(address, *, loc=None, ip=None):
    """Rearranges the 16 bytes at shared-memory `address`, keys 0-15 of one Vᵀ row, so that word
    c holds keys 2c, 2c + 1, 2c + 8, 2c + 9 (`KEY_ORDER_PRMT`): the keys whose probabilities lane
    c of a quad holds in an fp32 accumulator (n8 blocks g and g + 1), in the order of its e4m3
    A-operand word. Any aligned 16 bytes of a WGMMA K-major tile are 16 such keys, whatever the
    swizzle."""
    words = "abcd"
    moves = "".join(
        f"prmt.b32 {out}, {words[a]}, {words[b]}, {sel:#06x};\n" for out, (a, b, sel) in zip("wxyz", KEY_ORDER_PRMT)
    )
    llvm.inline_asm(
        None,
        [cutlass.Int32(address).ir_value(loc=loc, ip=ip)],
        "{\n.reg .b32 a, b, c, d, w, x, y, z;\nld.shared.v4.b32 {a, b, c, d}, [$0];\n"
        + moves
        + "st.shared.v4.b32 [$0], {w, x, y, z};\n}",
        "r,~{memory}",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def transpose_8x8(word, *, loc=None, ip=None):
    """movmatrix.sync.aligned.m8n8.trans.b16: an 8 x 8 matrix of 16-bit values whose row g holds
    elements 2c, 2c + 1 in lane 4g + c's `word` comes back transposed, in the same fragment
    layout (lane 4g + c: elements 2c, 2c + 1 of column g). Every lane of the warp must call it."""
    operands = [cutlass.Int32(word).ir_value(loc=loc, ip=ip)]
    return _asm_word("movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", operands, "=r,r", side_effects=True)


@dsl_user_op
def byte_interleave(a, b, selector: int, *, loc=None, ip=None):
    """prmt.b32 of words `a` and `b` (bytes 0-3 of a, 4-7 of b) by `selector`."""
    operands = [cutlass.Int32(a).ir_value(loc=loc, ip=ip), cutlass.Int32(b).ir_value(loc=loc, ip=ip)]
    return _asm_word(f"prmt.b32 $0, $1, $2, {selector};", operands, "=r,r,r", side_effects=False)


def key_origin(kv_len, s_new, window_left, block_n: int):
    """The first key any new token of a sequence sees, down to a block: 0, or with a window
    (window_left >= 0) the first token's window start. The splits cover [origin, kv_len); the
    combine kernel computes the same origin to count them."""
    start = cutlass.max(kv_len - s_new - window_left, 0)
    return cutlass.select_(window_left < 0, 0, start // block_n * block_n)


def sequence_chunk(keys, min_chunk, splits, block_n: int):
    """Keys per split of a sequence with `keys` keys past its origin, in an adaptive split
    (`PagedDecodeVariant.adaptive`): its keys spread evenly over the plan's splits, in whole key
    blocks, but never fewer than `min_chunk` a split, so a short sequence takes one split (and
    is written by it directly) while a long one takes them all. The combine kernel computes the
    same chunk to count a sequence's splits."""
    per_split = (cutlass.max(keys, 0) + splits - 1) // splits
    return cutlass.max((per_split + block_n - 1) // block_n * block_n, min_chunk)
