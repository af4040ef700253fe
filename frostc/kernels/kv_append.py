"""The paged KV-cache append: this step's new keys and values into their cache pages, in three
forms (the variant's `form`) that differ only in where each new token goes:

- rows: k, v (b, hkv, s_new, d), one CTA per (sequence b, new token t), grid (b, s_new). The
  token goes to cache position p = len - s_new + t (len = seq_len_kv[b], read on the device:
  the cache's length after the append).
- packed: k, v (tokens, hkv, d), the step's new rows packed like the queries of a mixed step;
  sequence b's are tokens cu[b] .. cu[b + 1] of cu_seqlens_q (b + 1 prefix sums). One CTA per
  token of the capacity, grid (tokens,): token i finds its sequence by a binary search over cu
  (about log2(b) loads of a small array every CTA reads: cached), so a long chunk among single
  decodes spreads over as many CTAs as it has tokens and no CTA walks a sequence. Token
  i = cu[b] + t of a sequence of n = cu[b + 1] - cu[b] tokens goes to position len - n + t.
  Tokens before cu[0] or from cu[b_cap] on exit at once; a sequence's span is clamped to the
  buffer's tokens (`packed_span`, the attention's rule), and a token outside the span of the
  sequence the search finds (a prefix sum that decreases) is skipped: whatever cu holds, every
  token is written at most once, to a position of a sequence's last n.
- slots (vLLM's slot_mapping): k, v (tokens, hkv, d), one CTA per token, grid (tokens,); token i
  goes to row slot % page_size of page slot // page_size, slot = slot_mapping[i]; a slot below
  0 (the padding's -1) or past the pool is skipped. No page table, no lengths.

Rows and packed then place position p through the page table: page page_table[b, p //
page_size], row p % page_size, every kv head, every element of the head dim. A position outside
[0, max_pages * page_size), or a page id outside [0, pages), is skipped: whatever the caller
wrote, nothing outside the caches is written, and every byte of the caches but the appended
rows is left as it was.

Tensors, in elements (every stride but the head dim's a multiple of 8, checked at build):
  k, v          rows: (b, hkv, s_new, d)   strides (stride_b, stride_h, stride_s, 1)
                packed, slots: (tokens, hkv, d)  strides (stride_t, stride_h, 1)
  k/v_cache     (pages, page_size, hkv, d) strides (stride_p, stride_s, stride_h, 1)
  page_table    (b, max_pages) int32       strides (stride_b, 1)
  seq_len_kv    (b,) int32                 contiguous
  cu_seqlens_q  (b + 1,) int32             contiguous
  slot_mapping  (tokens,) int32            contiguous
Offsets are 64-bit: a cache may hold more than 2**31 elements.

The attention launched after rows or packed may start at once (programmatic dependent launch):
it waits for this kernel only before it reads the cache blocks that hold the new rows, which
are sequence b's positions from len - n on (n: s_new, or b's tokens by the same cu_seqlens_q:
`new_rows` names what it must share). The slots form writes where the caller's slots say, which
nothing ties to the positions an attention deems new: no attention starts early behind it.

A quantized cache (e4m3, whose element x holds the value x * scale): k_scale and v_scale are
float32 device tensors, one scale per kv head or one for all (head stride 0); each new element
is stored as x * (1 / scale), rounded to nearest even and saturated to +-448 (NaN stays NaN).
"""

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute

from frostc.kernels.cache_args import CacheScales, CacheScaleStrides, PshStrides, quantized
from frostc.kernels.interface import (
    I32,
    I64,
    BhsStrides,
    Facets,
    Group,
    Kernel,
    Ptr,
    Variant,
    facets,
    pointer,
    when,
)
from frostc.kernels.launch_order import NEW_ROWS_BY_S_NEW
from frostc.kernels.sdpa_common import dsl_dtype
from frostc.kernels.sequences import packed_span

THREADS = 128
VECTOR_BYTES = 16

# where each new token goes (the variant's `form`)
ROWS = "rows"  # (b, hkv, s_new, d): the last s_new positions of each sequence
PACKED = "packed"  # (tokens, hkv, d) by cu_seqlens_q: the last cu[b + 1] - cu[b] positions of sequence b
SLOTS = "slots"  # (tokens, hkv, d) by slot_mapping: the cache row each token names
FORMS = (ROWS, PACKED, SLOTS)


def _rows(variant) -> bool:
    return variant.form == ROWS


def _packed(variant) -> bool:
    return variant.form == PACKED


def _slots(variant) -> bool:
    return variant.form == SLOTS


def _paged(variant) -> bool:
    """Placed through a page table and the lengths (rows and packed)."""
    return variant.form != SLOTS


def _tokens(variant) -> bool:
    """New rows (tokens, hkv, d) (packed and slots)."""
    return variant.form != ROWS


@dataclass(frozen=True)
class TokenStrides(Facets):
    """Packed rows' (token, head) element strides."""

    stride_t: I64
    stride_h: I64


@dataclass(frozen=True)
class PackedTokens(Group):
    """The packed form's sequences: sequence b's new rows are tokens cu_seqlens_q[b] ..
    cu_seqlens_q[b + 1] of k and v, `batch` sequences in `tokens` (the grid's) at most."""

    cu_seqlens_q: Ptr = pointer("int32", align=4)
    batch: I32
    tokens: I32


@dataclass(frozen=True)
class KvAppendArgs:
    k: Ptr = pointer()
    v: Ptr = pointer()
    k_cache: Ptr = pointer(of="kv_cache_dtype")
    v_cache: Ptr = pointer(of="kv_cache_dtype")
    page_table: Ptr | None = when(_paged, dtype="int32", align=4)
    seq_len_kv: Ptr | None = when(_paged, dtype="int32", align=4)
    packed: PackedTokens | None = when(_packed)
    slot_mapping: Ptr | None = when(_slots, dtype="int32", align=4)
    scales: CacheScales | None = when(quantized)
    heads_kv: I32
    s_new: I32 | None = when(_rows)
    pages: I32
    page_size: I32
    max_pages: I32 | None = when(_paged)
    k_strides: BhsStrides | None = when(_rows, tensor="k")
    v_strides: BhsStrides | None = when(_rows, tensor="v")
    k_token_strides: TokenStrides | None = when(_tokens, tensor="k")
    v_token_strides: TokenStrides | None = when(_tokens, tensor="v")
    k_cache_strides: PshStrides = facets("k_cache")
    v_cache_strides: PshStrides = facets("v_cache")
    page_table_stride: I64 | None = when(_paged, named="page_table.stride_b")
    scale_strides: CacheScaleStrides | None = when(quantized)


_GRID_RULES = {
    ROWS: "(batch, s_new, 1): one CTA per new token of each sequence",
    PACKED: "(tokens, 1, 1): one CTA per token of the capacity; each finds its sequence in cu_seqlens_q",
    SLOTS: "(tokens, 1, 1): one CTA per token, to the cache row its slot_mapping entry names",
}
# the parameters that say which positions of each sequence are this step's new rows: an
# attention that waits only before those must take the same ones, bound alike, to start early
_NEW_ROWS = {ROWS: NEW_ROWS_BY_S_NEW, PACKED: ("seq_len_kv", "cu_seqlens_q"), SLOTS: ()}


@dataclass(frozen=True)
class KvAppendVariant(Variant):
    """Compile key of the append kernel; every shape and stride is an argument."""

    ARGS: ClassVar[type] = KvAppendArgs
    THREADS: ClassVar[int] = THREADS
    dtype: str  # the new rows': "bf16" | "fp16"
    head_dim: int
    kv_cache_dtype: str  # the caches': `dtype`, or a quantized one (e4m3) with scales
    form: str = ROWS  # where each new token goes: ROWS, PACKED or SLOTS

    @property
    def name(self) -> str:
        kv = f".kv_{self.kv_cache_dtype}" if quantized(self) else ""
        form = "" if self.form == ROWS else f".{self.form}"
        return f"kv_append.{self.dtype}{kv}.d{self.head_dim}{form}"

    @property
    def tiles(self) -> dict[str, int]:
        return {"threads": THREADS, "vector_bytes": VECTOR_BYTES}

    @property
    def grid_rule(self) -> str:
        return _GRID_RULES[self.form]

    def kernel(self) -> "KvAppendKernel":
        return KvAppendKernel(self)

    # What it writes: only these caches' rows of the step's new tokens, at the positions
    # `new_rows` says, so an attention over the caches may start early behind it
    # (frostc.resolve.mark_early_starts); the slots form writes wherever its slots say.
    @property
    def appends_to_caches(self) -> tuple[str, ...]:
        return () if self.form == SLOTS else ("k_cache", "v_cache")

    @property
    def new_rows(self) -> tuple[str, ...]:
        return _NEW_ROWS[self.form]


def _offset(i, i_stride, j, j_stride):
    """Elements to (i, j) along two strides, in 64 bits (a cache may hold more than 2**31
    elements); whole 16-byte pieces (the build checks every stride)."""
    return cute.assume(cutlass.Int64(i) * i_stride + cutlass.Int64(j) * j_stride, divby=8)


def _load(pointer, index):
    """One int32 of a device array."""
    return cute.make_tensor(pointer + index, cute.make_layout(1))[0]


class KvAppendKernel(Kernel):
    def __init__(self, variant: KvAppendVariant):
        super().__init__(variant)
        self.v = variant
        self.dtype = dsl_dtype(variant.dtype)
        self.kv_cache_type = dsl_dtype(variant.kv_cache_dtype)
        self.elems = VECTOR_BYTES * 8 // self.dtype.width  # per 16-byte vector of the new rows

    @cute.kernel
    def kernel(self, args: KvAppendArgs):
        tidx, _, _ = cute.arch.thread_idx()
        x, y, _ = cute.arch.block_idx()
        # the next launch (the step's attention) may start now: it waits for these rows itself
        cute.arch.griddepcontrol_launch_dependents()
        if cutlass.const_expr(self.v.form == ROWS):
            self._append_rows(args, x, y, tidx)
        elif cutlass.const_expr(self.v.form == PACKED):
            self._append_packed(args, x, tidx)
        else:
            self._append_slots(args, x, tidx)

    @cute.jit
    def _append_rows(self, args: KvAppendArgs, b, t, tidx):
        """New token t of sequence b (a CTA of the grid (b, s_new)) to position len - s_new + t."""
        k_strides, v_strides = args.k_strides, args.v_strides
        # a negative length (a broken contract) appends nothing, and cannot overflow below
        length = cutlass.max(_load(args.seq_len_kv, b), 0)
        p = length - args.s_new + t
        sources = ((b, k_strides.stride_b, t, k_strides.stride_s), (b, v_strides.stride_b, t, v_strides.stride_s))
        self._to_position(args, b, p, sources, (k_strides.stride_h, v_strides.stride_h), tidx)

    @cute.jit
    def _append_packed(self, args: KvAppendArgs, token, tidx):
        """Token `token` of the capacity: if sequence b's by cu_seqlens_q (its t-th of n), to
        position len - n + t of sequence b."""
        packed = args.packed
        cu, batch, tokens = packed.cu_seqlens_q, packed.batch, packed.tokens
        # tokens before cu[0] or from cu[batch] on belong to no sequence (the step's padding)
        if token >= _load(cu, 0):
            if token < _load(cu, batch):
                b = _sequence_of(cu, token, batch)
                start, count = packed_span(cu, b, tokens, tokens)
                if token >= start:
                    if token < start + count:
                        length = cutlass.max(_load(args.seq_len_kv, b), 0)
                        p = length - count + (token - start)
                        k_strides, v_strides = args.k_token_strides, args.v_token_strides
                        sources = ((token, k_strides.stride_t, 0, 0), (token, v_strides.stride_t, 0, 0))
                        head_strides = (k_strides.stride_h, v_strides.stride_h)
                        self._to_position(args, b, p, sources, head_strides, tidx)

    @cute.jit
    def _append_slots(self, args: KvAppendArgs, token, tidx):
        """Token `token` to the cache row slot_mapping[token] names (none for a slot outside the pool)."""
        slot = _load(args.slot_mapping, token)
        if slot >= 0:
            page = slot // args.page_size  # no product that could overflow int32
            if page < args.pages:
                k_strides, v_strides = args.k_token_strides, args.v_token_strides
                sources = ((token, k_strides.stride_t, 0, 0), (token, v_strides.stride_t, 0, 0))
                head_strides = (k_strides.stride_h, v_strides.stride_h)
                self._to_row(args, page, slot % args.page_size, sources, head_strides, tidx)

    @cute.jit
    def _to_position(self, args: KvAppendArgs, b, p, sources, head_strides, tidx):
        """A new token's rows to position p of sequence b, through its page table; nothing for a
        position outside the sequence's capacity or a page id outside the pool."""
        if p >= 0:
            if p < args.max_pages * args.page_size:  # fits int32 (checked at build)
                row_of_table = args.page_table + cutlass.Int64(b) * args.page_table_stride
                page = _load(row_of_table, p // args.page_size)
                if page >= 0:
                    if page < args.pages:
                        self._to_row(args, page, p % args.page_size, sources, head_strides, tidx)

    @cute.jit
    def _to_row(self, args: KvAppendArgs, page, row, sources, head_strides, tidx):
        """A new token's rows, every kv head, to row `row` of page `page` of each cache. `sources`:
        where the token's K and V rows start, as `_offset`'s (i, i_stride, j, j_stride)."""
        kc_strides, vc_strides = args.k_cache_strides, args.v_cache_strides
        k_source, v_source = sources
        k_sh, v_sh = head_strides
        sources = (args.k + _offset(*k_source), args.v + _offset(*v_source))
        targets = (
            args.k_cache + _offset(page, kc_strides.stride_p, row, kc_strides.stride_s),
            args.v_cache + _offset(page, vc_strides.stride_p, row, vc_strides.stride_s),
        )
        heads = args.heads_kv
        if cutlass.const_expr(args.scales is None):
            self._copy_heads(sources[0], targets[0], k_sh, kc_strides.stride_h, heads, tidx)
            self._copy_heads(sources[1], targets[1], v_sh, vc_strides.stride_h, heads, tidx)
        else:
            k_scale = (args.scales.k_scale, args.scale_strides.k_scale)
            v_scale = (args.scales.v_scale, args.scale_strides.v_scale)
            self._quantize_heads(sources[0], targets[0], k_sh, kc_strides.stride_h, heads, tidx, k_scale)
            self._quantize_heads(sources[1], targets[1], v_sh, vc_strides.stride_h, heads, tidx, v_scale)

    @cute.jit
    def _copy_heads(self, src, dst, src_sh, dst_sh, heads_kv, tidx):
        """Every head's d elements of one token, src to dst, a 16-byte vector per thread at a time."""
        per_row = self.v.head_dim // self.elems
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=VECTOR_BYTES * 8)
        fragment = cute.make_rmem_tensor(cute.make_layout(self.elems), self.dtype)
        src_sh = cute.assume(src_sh, divby=8)
        dst_sh = cute.assume(dst_sh, divby=8)
        for i in range(tidx, heads_kv * per_row, THREADS):
            h = cutlass.Int64(i // per_row)
            col = (i % per_row) * self.elems
            piece = cute.make_tensor(src + cute.assume(h * src_sh + col, divby=8), cute.make_layout(self.elems))
            cute.copy(atom, piece, fragment)
            out = cute.make_tensor(dst + cute.assume(h * dst_sh + col, divby=8), cute.make_layout(self.elems))
            cute.copy(atom, fragment, out)

    @cute.jit
    def _quantize_heads(self, src, dst, src_sh, dst_sh, heads_kv, tidx, scale):
        """As `_copy_heads`, each element stored as x * (1 / scale of its head) in the cache's
        e4m3 (rounded to nearest even, saturated: the conversion's satfinite)."""
        per_row = self.v.head_dim // self.elems
        scale_ptr, scale_sh = scale
        src_sh = cute.assume(src_sh, divby=8)
        dst_sh = cute.assume(dst_sh, divby=16)
        for i in range(tidx, heads_kv * per_row, THREADS):
            h = cutlass.Int64(i // per_row)
            col = (i % per_row) * self.elems
            inverse = cutlass.Float32(1.0) / cute.make_tensor(scale_ptr + h * scale_sh, cute.make_layout(1))[0]
            piece = cute.make_tensor(src + cute.assume(h * src_sh + col, divby=8), cute.make_layout(self.elems))
            narrow = cute.make_rmem_tensor(cute.make_layout(self.elems), self.kv_cache_type)
            narrow.store((piece.load().to(cutlass.Float32) * inverse).to(self.kv_cache_type))
            out = cute.make_tensor(dst + cute.assume(h * dst_sh + col, divby=8), cute.make_layout(self.elems))
            out.store(narrow.load())


@cute.jit
def _sequence_of(cu, token, batch):
    """The last sequence b < batch with cu[b] <= token, for a token with cu[0] <= token: a binary
    search in ceil(log2(batch)) steps, whatever cu holds (a prefix sum that decreases gives some
    such b, which the caller checks against b's span)."""
    lo = cutlass.Int32(0)
    hi = batch - 1
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2  # no overflow: lo <= mid <= hi
        below = _load(cu, mid) <= token
        lo = cutlass.select_(below, mid, lo)
        hi = cutlass.select_(below, hi, mid - 1)
    return lo
