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

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_ptr
from cutlass.cute.typing import AddressSpace

from frostc.kernels.sdpa_common import dsl_dtype

THREADS = 128
VECTOR_BYTES = 16
POINTERS = ("k", "v", "k_cache", "v_cache", "page_table", "seq_len_kv")
INT_PARAMS = ("heads_kv", "s_new", "pages", "page_size", "max_pages")
STRIDE_PARAMS = (
    "k.stride_b", "k.stride_h", "k.stride_s", "v.stride_b", "v.stride_h", "v.stride_s",
    "k_cache.stride_p", "k_cache.stride_s", "k_cache.stride_h",
    "v_cache.stride_p", "v_cache.stride_s", "v_cache.stride_h",
    "page_table.stride_b",
)  # fmt: skip
SCALE_POINTERS = ("k_scale", "v_scale")  # a quantized cache's, after POINTERS
SCALE_STRIDES = ("k_scale.stride_h", "v_scale.stride_h")  # after STRIDE_PARAMS


@dataclass(frozen=True)
class KvAppendVariant:
    """Compile key of the append kernel; every shape and stride is an argument."""

    dtype: str  # the new rows': "bf16" | "fp16"
    head_dim: int
    cache: str | None = None  # a quantized cache's dtype ("e4m3"); None: the caches are `dtype`

    @property
    def name(self) -> str:
        kv = f".kv_{self.cache}" if self.cache else ""
        return f"kv_append.{self.dtype}{kv}.d{self.head_dim}"

    @property
    def params(self) -> tuple[tuple[str, str], ...]:
        scaled = self.cache is not None
        return (
            tuple((p, "ptr") for p in POINTERS + (SCALE_POINTERS if scaled else ()))
            + tuple((p, "i32") for p in INT_PARAMS)
            + tuple((p, "i64") for p in STRIDE_PARAMS + (SCALE_STRIDES if scaled else ()))
        )

    @property
    def block(self) -> tuple[int, int, int]:
        return (THREADS, 1, 1)

    @property
    def tiles(self) -> dict[str, int]:
        return {"threads": THREADS, "vector_bytes": VECTOR_BYTES}

    @property
    def grid_rule(self) -> str:
        return "(batch, s_new, 1): one CTA per new token of each sequence"

    @property
    def ctas_per_sm(self) -> int:
        return 0

    def kernel(self) -> "KvAppend":
        return KvAppend(self)

    # what it writes: only these caches' rows of the step's new tokens (a decode attention that
    # reads the caches may start early behind it: frostc.resolve.mark_early_starts)
    appends_to_caches = ("k_cache", "v_cache")

    def compile_args(self) -> tuple:
        new, cache = dsl_dtype(self.dtype), dsl_dtype(self.cache or self.dtype)
        data = [make_ptr(t, 0x10000, AddressSpace.gmem, assumed_align=16) for t in (new, new, cache, cache)]
        ints = [make_ptr(cutlass.Int32, 0x10000, AddressSpace.gmem, assumed_align=4) for _ in range(2)]
        strides = STRIDE_PARAMS
        if self.cache is not None:
            ints += [make_ptr(cutlass.Float32, 0x10000, AddressSpace.gmem, assumed_align=4) for _ in SCALE_POINTERS]
            strides += SCALE_STRIDES
        return (
            *data,
            *ints,
            tuple(cutlass.Int32(1) for _ in INT_PARAMS),
            tuple(cutlass.Int64(8) for _ in strides),
            make_fake_stream(),
        )


class KvAppend:
    def __init__(self, variant: KvAppendVariant):
        self.v = variant
        self.dtype = dsl_dtype(variant.dtype)
        self.cache_dtype = dsl_dtype(variant.cache or variant.dtype)
        self.elems = VECTOR_BYTES * 8 // self.dtype.width  # per 16-byte vector of the new rows
        self.smem_bytes = 0

    @cute.jit
    def __call__(self, k, v, k_cache, v_cache, page_table, seq_len_kv, *rest):
        # the plan's launch gives the grid, (batch, s_new, 1); only the cubin is kept from here
        if cutlass.const_expr(self.v.cache is None):
            ints, strides, stream = rest
            kernel = self.kernel(k, v, k_cache, v_cache, page_table, seq_len_kv, *ints, *strides)
        else:
            k_scale, v_scale, ints, strides, stream = rest
            kernel = self.kernel_scaled(k, v, k_cache, v_cache, page_table, seq_len_kv, k_scale, v_scale, *ints,
                                        *strides)  # fmt: skip
        kernel.launch(grid=(1, 1, 1), block=[THREADS, 1, 1], smem=0, stream=stream)

    @cute.kernel
    def kernel(
        self,
        k: cute.Pointer,
        v: cute.Pointer,
        k_cache: cute.Pointer,
        v_cache: cute.Pointer,
        page_table: cute.Pointer,
        seq_len_kv: cute.Pointer,
        heads_kv: cutlass.Int32,
        s_new: cutlass.Int32,
        pages: cutlass.Int32,
        page_size: cutlass.Int32,
        max_pages: cutlass.Int32,
        k_sb: cutlass.Int64,
        k_sh: cutlass.Int64,
        k_ss: cutlass.Int64,
        v_sb: cutlass.Int64,
        v_sh: cutlass.Int64,
        v_ss: cutlass.Int64,
        kc_sp: cutlass.Int64,
        kc_ss: cutlass.Int64,
        kc_sh: cutlass.Int64,
        vc_sp: cutlass.Int64,
        vc_ss: cutlass.Int64,
        vc_sh: cutlass.Int64,
        pt_sb: cutlass.Int64,
    ):
        self._main(
            k, v, k_cache, v_cache, page_table, seq_len_kv, heads_kv, s_new, pages, page_size, max_pages,
            (k_sb, k_sh, k_ss, v_sb, v_sh, v_ss), (kc_sp, kc_ss, kc_sh, vc_sp, vc_ss, vc_sh), pt_sb, None,
        )  # fmt: skip

    @cute.kernel
    def kernel_scaled(
        self,
        k: cute.Pointer,
        v: cute.Pointer,
        k_cache: cute.Pointer,
        v_cache: cute.Pointer,
        page_table: cute.Pointer,
        seq_len_kv: cute.Pointer,
        k_scale: cute.Pointer,
        v_scale: cute.Pointer,
        heads_kv: cutlass.Int32,
        s_new: cutlass.Int32,
        pages: cutlass.Int32,
        page_size: cutlass.Int32,
        max_pages: cutlass.Int32,
        k_sb: cutlass.Int64,
        k_sh: cutlass.Int64,
        k_ss: cutlass.Int64,
        v_sb: cutlass.Int64,
        v_sh: cutlass.Int64,
        v_ss: cutlass.Int64,
        kc_sp: cutlass.Int64,
        kc_ss: cutlass.Int64,
        kc_sh: cutlass.Int64,
        vc_sp: cutlass.Int64,
        vc_ss: cutlass.Int64,
        vc_sh: cutlass.Int64,
        pt_sb: cutlass.Int64,
        k_scale_sh: cutlass.Int64,
        v_scale_sh: cutlass.Int64,
    ):
        self._main(
            k, v, k_cache, v_cache, page_table, seq_len_kv, heads_kv, s_new, pages, page_size, max_pages,
            (k_sb, k_sh, k_ss, v_sb, v_sh, v_ss), (kc_sp, kc_ss, kc_sh, vc_sp, vc_ss, vc_sh), pt_sb,
            ((k_scale, k_scale_sh), (v_scale, v_scale_sh)),
        )  # fmt: skip

    @cute.jit
    def _main(self, k, v, k_cache, v_cache, page_table, seq_len_kv, heads_kv, s_new, pages, page_size, max_pages,
              new_strides, cache_strides, pt_sb, scales):  # fmt: skip
        """`scales`: None, or a quantized cache's ((k_scale, head stride), (v_scale, head stride))."""
        k_sb, k_sh, k_ss, v_sb, v_sh, v_ss = new_strides
        kc_sp, kc_ss, kc_sh, vc_sp, vc_ss, vc_sh = cache_strides
        tidx, _, _ = cute.arch.thread_idx()
        b, t, _ = cute.arch.block_idx()
        # the next launch (the step's attention) may start now: it waits for these rows itself
        cute.arch.griddepcontrol_launch_dependents()
        # a negative length (a broken contract) appends nothing, and cannot overflow below
        length = cutlass.max(cute.make_tensor(seq_len_kv + b, cute.make_layout(1))[0], 0)
        p = length - s_new + t
        if p >= 0:
            if p < max_pages * page_size:  # fits int32 (checked at build)
                row_of_table = page_table + cutlass.Int64(b) * pt_sb
                page = cute.make_tensor(row_of_table + p // page_size, cute.make_layout(1))[0]
                if page >= 0:
                    if page < pages:
                        row = p % page_size
                        sources = (
                            k + cute.assume(cutlass.Int64(b) * k_sb + cutlass.Int64(t) * k_ss, divby=8),
                            v + cute.assume(cutlass.Int64(b) * v_sb + cutlass.Int64(t) * v_ss, divby=8),
                        )
                        targets = (
                            k_cache + cute.assume(cutlass.Int64(page) * kc_sp + cutlass.Int64(row) * kc_ss, divby=8),
                            v_cache + cute.assume(cutlass.Int64(page) * vc_sp + cutlass.Int64(row) * vc_ss, divby=8),
                        )
                        if cutlass.const_expr(scales is None):
                            self._copy_heads(sources[0], targets[0], k_sh, kc_sh, heads_kv, tidx)
                            self._copy_heads(sources[1], targets[1], v_sh, vc_sh, heads_kv, tidx)
                        else:
                            self._quantize_heads(sources[0], targets[0], k_sh, kc_sh, heads_kv, tidx, scales[0])
                            self._quantize_heads(sources[1], targets[1], v_sh, vc_sh, heads_kv, tidx, scales[1])

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
            narrow = cute.make_rmem_tensor(cute.make_layout(self.elems), self.cache_dtype)
            narrow.store((piece.load().to(cutlass.Float32) * inverse).to(self.cache_dtype))
            out = cute.make_tensor(dst + cute.assume(h * dst_sh + col, divby=8), cute.make_layout(self.elems))
            out.store(narrow.load())
