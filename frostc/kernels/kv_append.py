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


@dataclass(frozen=True)
class KvAppendVariant:
    """Compile key of the append kernel; every shape and stride is an argument."""

    dtype: str  # "bf16" | "fp16"
    head_dim: int

    @property
    def name(self) -> str:
        return f"kv_append.{self.dtype}.d{self.head_dim}"

    @property
    def params(self) -> tuple[tuple[str, str], ...]:
        return (
            tuple((p, "ptr") for p in POINTERS)
            + tuple((p, "i32") for p in INT_PARAMS)
            + tuple((p, "i64") for p in STRIDE_PARAMS)
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

    def compile_args(self) -> tuple:
        dtype = dsl_dtype(self.dtype)
        data = [make_ptr(dtype, 0x10000, AddressSpace.gmem, assumed_align=16) for _ in range(4)]
        ints = [make_ptr(cutlass.Int32, 0x10000, AddressSpace.gmem, assumed_align=4) for _ in range(2)]
        return (
            *data,
            *ints,
            tuple(cutlass.Int32(1) for _ in INT_PARAMS),
            tuple(cutlass.Int64(8) for _ in STRIDE_PARAMS),
            make_fake_stream(),
        )


class KvAppend:
    def __init__(self, variant: KvAppendVariant):
        self.v = variant
        self.dtype = dsl_dtype(variant.dtype)
        self.elems = VECTOR_BYTES * 8 // self.dtype.width  # per 16-byte vector
        self.smem_bytes = 0

    @cute.jit
    def __call__(self, k, v, k_cache, v_cache, page_table, seq_len_kv, ints: tuple, strides: tuple, stream):
        # the plan's launch gives the grid, (batch, s_new, 1); only the cubin is kept from here
        self.kernel(k, v, k_cache, v_cache, page_table, seq_len_kv, *ints, *strides).launch(
            grid=(1, 1, 1), block=[THREADS, 1, 1], smem=0, stream=stream
        )

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
        tidx, _, _ = cute.arch.thread_idx()
        b, t, _ = cute.arch.block_idx()
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
                        self._copy_heads(sources[0], targets[0], k_sh, kc_sh, heads_kv, tidx)
                        self._copy_heads(sources[1], targets[1], v_sh, vc_sh, heads_kv, tidx)

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
