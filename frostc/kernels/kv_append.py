"""The paged KV-cache append: this step's new keys and values into their cache pages.

One CTA per (sequence b, new token t). The token goes to cache position p = len - s_new + t
(len = seq_len_kv[b], read on the device: the cache's length after the append), that is page
page_table[b, p // page_size], row p % page_size, every kv head, every element of the head
dim. A position outside [0, max_pages * page_size), or a page id outside [0, pages), is
skipped: whatever the caller wrote, nothing outside the caches is written, and every byte of
the caches but the appended rows is left as it was.

Tensors, in elements (every stride but the head dim's a multiple of 8, checked at build):
  k, v          (b, hkv, s_new, d)         strides (stride_b, stride_h, stride_s, 1)
  k/v_cache     (pages, page_size, hkv, d) strides (stride_p, stride_s, stride_h, 1)
  page_table    (b, max_pages) int32       strides (stride_b, 1)
  seq_len_kv    (b,) int32                 contiguous
Offsets are 64-bit: a cache may hold more than 2**31 elements.

The attention launched after it may start at once (programmatic dependent launch): it waits
for this kernel only before it reads the cache blocks that hold the new rows.

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
    Kernel,
    Ptr,
    Variant,
    abi,
    facets,
    pointer,
    when,
)
from frostc.kernels.sdpa_common import dsl_dtype

THREADS = 128
VECTOR_BYTES = 16


@dataclass(frozen=True)
class KvAppendArgs:
    k: Ptr = pointer()
    v: Ptr = pointer()
    k_cache: Ptr = pointer(of="kv_cache_dtype")
    v_cache: Ptr = pointer(of="kv_cache_dtype")
    page_table: Ptr = pointer("int32", align=4)
    seq_len_kv: Ptr = pointer("int32", align=4)
    scales: CacheScales | None = when(quantized)
    heads_kv: I32
    s_new: I32
    pages: I32
    page_size: I32
    max_pages: I32
    k_strides: BhsStrides = facets("k")
    v_strides: BhsStrides = facets("v")
    k_cache_strides: PshStrides = facets("k_cache")
    v_cache_strides: PshStrides = facets("v_cache")
    page_table_stride: I64 = abi("page_table.stride_b")
    scale_strides: CacheScaleStrides | None = when(quantized)


@dataclass(frozen=True)
class KvAppendVariant(Variant):
    """Compile key of the append kernel; every shape and stride is an argument."""

    ARGS: ClassVar[type] = KvAppendArgs
    THREADS: ClassVar[int] = THREADS
    dtype: str  # the new rows': "bf16" | "fp16"
    head_dim: int
    kv_cache_dtype: str  # the caches': `dtype`, or a quantized one (e4m3) with scales

    @property
    def name(self) -> str:
        kv = f".kv_{self.kv_cache_dtype}" if quantized(self) else ""
        return f"kv_append.{self.dtype}{kv}.d{self.head_dim}"

    @property
    def tiles(self) -> dict[str, int]:
        return {"threads": THREADS, "vector_bytes": VECTOR_BYTES}

    @property
    def grid_rule(self) -> str:
        return "(batch, s_new, 1): one CTA per new token of each sequence"

    def kernel(self) -> "KvAppendKernel":
        return KvAppendKernel(self)

    # what it writes: only these caches' rows of the step's new tokens (a decode attention that
    # reads the caches may start early behind it: frostc.resolve.mark_early_starts)
    appends_to_caches = ("k_cache", "v_cache")


def _offset(i, i_stride, j, j_stride):
    """Elements to (i, j) along two strides, in 64 bits (a cache may hold more than 2**31
    elements); whole 16-byte pieces (the build checks every stride)."""
    return cute.assume(cutlass.Int64(i) * i_stride + cutlass.Int64(j) * j_stride, divby=8)


class KvAppendKernel(Kernel):
    def __init__(self, variant: KvAppendVariant):
        super().__init__(variant)
        self.v = variant
        self.dtype = dsl_dtype(variant.dtype)
        self.kv_cache_type = dsl_dtype(variant.kv_cache_dtype)
        self.elems = VECTOR_BYTES * 8 // self.dtype.width  # per 16-byte vector of the new rows

    @cute.kernel
    def kernel(self, args: KvAppendArgs):
        k_strides, v_strides = args.k_strides, args.v_strides
        kc_strides, vc_strides = args.k_cache_strides, args.v_cache_strides
        tidx, _, _ = cute.arch.thread_idx()
        b, t, _ = cute.arch.block_idx()
        # the next launch (the step's attention) may start now: it waits for these rows itself
        cute.arch.griddepcontrol_launch_dependents()
        # a negative length (a broken contract) appends nothing, and cannot overflow below
        length = cutlass.max(cute.make_tensor(args.seq_len_kv + b, cute.make_layout(1))[0], 0)
        p = length - args.s_new + t
        if p >= 0:
            if p < args.max_pages * args.page_size:  # fits int32 (checked at build)
                row_of_table = args.page_table + cutlass.Int64(b) * args.page_table_stride
                page = cute.make_tensor(row_of_table + p // args.page_size, cute.make_layout(1))[0]
                if page >= 0:
                    if page < args.pages:
                        row = p % args.page_size
                        sources = (
                            args.k + _offset(b, k_strides.stride_b, t, k_strides.stride_s),
                            args.v + _offset(b, v_strides.stride_b, t, v_strides.stride_s),
                        )
                        targets = (
                            args.k_cache + _offset(page, kc_strides.stride_p, row, kc_strides.stride_s),
                            args.v_cache + _offset(page, vc_strides.stride_p, row, vc_strides.stride_s),
                        )
                        heads = args.heads_kv
                        if cutlass.const_expr(args.scales is None):
                            self._copy_heads(
                                sources[0], targets[0], k_strides.stride_h, kc_strides.stride_h, heads, tidx
                            )
                            self._copy_heads(
                                sources[1], targets[1], v_strides.stride_h, vc_strides.stride_h, heads, tidx
                            )
                        else:
                            k_scale = (args.scales.k_scale, args.scale_strides.k_scale)
                            v_scale = (args.scales.v_scale, args.scale_strides.v_scale)
                            self._quantize_heads(sources[0], targets[0], k_strides.stride_h, kc_strides.stride_h, heads,
                                                 tidx, k_scale)  # fmt: skip
                            self._quantize_heads(sources[1], targets[1], v_strides.stride_h, vc_strides.stride_h, heads,
                                                 tidx, v_scale)  # fmt: skip

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
