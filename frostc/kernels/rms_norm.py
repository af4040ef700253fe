"""RMSNorm of rows, optionally after a residual add: a decoder layer's norm in one kernel.

    out[r] = round(round(x[r] * rsqrt(mean(x[r]^2) + eps)) * weight)
    with a residual:  s[r] = round(x[r] + residual[r]) -> residual_out[r];  out[r] = norm of s[r]

in float32, rounding where Hugging Face's LlamaRMSNorm and its residual add round (to the rows'
dtype after the sum, after the normalization, after the weight), so that it stands in for them
value for value, up to the mean's summation order.

One CTA per row; each thread keeps its 16-byte pieces of the row (PIECES a thread, fewer for the
last threads of a short row) in registers between the sum of squares and the store: the row is
read once. The sum goes through a warp reduction and shared memory.

Tensors, in elements (row strides multiples of 8: rows move in 16-byte pieces):
  x, residual, out, residual_out   (m, n)  strides (stride_m, 1)
  weight                           (n,)    contiguous
"""

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute

from frostc.kernels.interface import F32, I64, Kernel, Ptr, Variant, abi, pointer
from frostc.kernels.row_pieces import VECTOR_BYTES, load_piece, piece_elems, store_piece
from frostc.kernels.sdpa_common import dsl_dtype

THREADS = 256
WARPS = THREADS // 32
MAX_PIECES = 8  # 16-byte pieces a thread keeps: rows of up to THREADS * MAX_PIECES pieces


@dataclass(frozen=True)
class RmsNormArgs:
    """Without a residual, `residual` and `residual_out` are null (never touched)."""

    x: Ptr = pointer()
    residual: Ptr = pointer()
    weight: Ptr = pointer()
    out: Ptr = pointer()
    residual_out: Ptr = pointer()
    x_stride: I64 = abi("x.stride_m")
    residual_stride: I64 = abi("residual.stride_m")
    out_stride: I64 = abi("out.stride_m")
    residual_out_stride: I64 = abi("residual_out.stride_m")
    eps: F32


@dataclass(frozen=True)
class RmsNormVariant(Variant):
    """Compile key: the dtype, the row length and whether a residual is added first."""

    ARGS: ClassVar[type] = RmsNormArgs
    THREADS: ClassVar[int] = THREADS
    dtype: str  # "bf16" | "fp16"
    n: int  # the row's elements (a multiple of a 16-byte piece's)
    residual: bool

    @property
    def name(self) -> str:
        return f"rms_norm.{self.dtype}.n{self.n}" + (".residual" if self.residual else "")

    @property
    def elems(self) -> int:
        return piece_elems(self.dtype)

    @property
    def pieces(self) -> int:
        """16-byte pieces per thread (the last threads may hold fewer)."""
        return -(-self.n // self.elems // THREADS)

    @property
    def tiles(self) -> dict[str, int]:
        return {"threads": THREADS, "pieces_per_thread": self.pieces, "vector_bytes": VECTOR_BYTES}

    @property
    def grid_rule(self) -> str:
        return "(m, 1, 1): one CTA per row"

    def kernel(self) -> "RmsNormKernel":
        return RmsNormKernel(self)


class RmsNormKernel(Kernel):
    def __init__(self, variant: RmsNormVariant):
        super().__init__(variant)
        self.v = variant
        self.dtype = dsl_dtype(variant.dtype)
        self.elems = variant.elems
        self.row_pieces = variant.n // self.elems

    def prepare(self) -> None:
        @cute.struct
        class SharedStorage:
            reduce: cute.struct.MemRange[cutlass.Float32, WARPS]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()

    @cute.kernel
    def kernel(self, args: RmsNormArgs):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        scratch = storage.reduce.get_tensor(cute.make_layout(WARPS))
        r = cutlass.Int64(row)
        x_row = args.x + cute.assume(r * args.x_stride, divby=8)
        values = []  # this thread's pieces, float32
        total = cutlass.Float32(0.0)
        for j in cutlass.range_constexpr(self.v.pieces):
            piece = tidx + j * THREADS
            # a thread past the row's end reads the last piece again (a valid address) and adds 0
            col = cutlass.min(piece, self.row_pieces - 1) * self.elems
            value = self._load(x_row, col).to(cutlass.Float32)
            if cutlass.const_expr(self.v.residual):
                residual_row = args.residual + cute.assume(r * args.residual_stride, divby=8)
                summed = (value + self._load(residual_row, col).to(cutlass.Float32)).to(self.dtype)
                if piece < self.row_pieces:
                    self._store(args.residual_out + cute.assume(r * args.residual_out_stride, divby=8), col, summed)
                value = summed.to(cutlass.Float32)
            values.append(value)
            squares = (value * value).reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
            total = total + cutlass.select_(piece < self.row_pieces, squares, cutlass.Float32(0.0))
        total = self._cta_sum(total, scratch, tidx)
        scale = cute.math.rsqrt(total / cutlass.Float32(self.v.n) + args.eps)
        out_row = args.out + cute.assume(r * args.out_stride, divby=8)
        for j in cutlass.range_constexpr(self.v.pieces):
            piece = tidx + j * THREADS
            if piece < self.row_pieces:
                col = piece * self.elems
                normed = (values[j] * scale).to(self.dtype).to(cutlass.Float32)
                w = self._load(args.weight, col).to(cutlass.Float32)
                self._store(out_row, col, (normed * w).to(self.dtype))

    def _load(self, base, col):
        return load_piece(base, col, self.elems)

    def _store(self, base, col, value) -> None:
        store_piece(base, col, value, self.elems)

    @cute.jit
    def _cta_sum(self, value, scratch, tidx):
        """The sum over the CTA's values (one a thread); every thread gets it."""
        value = cute.arch.warp_reduction(value, lambda a, c: a + c)
        if tidx % 32 == 0:
            scratch[tidx // 32] = value
        cute.arch.sync_threads()
        result = scratch[0]
        for w in cutlass.range_constexpr(1, WARPS):
            result = result + scratch[w]
        return result
