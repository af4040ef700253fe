"""SiLU-gated product of a row's halves, a SwiGLU MLP's activation in one kernel:

    out[r, c] = round(round(silu(x[r, c])) * x[r, n + c])        silu(g) = g / (1 + exp(-g))

in float32, rounding where the unfused `F.silu(gate) * up` rounds (after the SiLU, after the
product), so that it stands in for those two kernels value for value.

Grid (m, pieces of a half row / THREADS): each thread one 16-byte piece of the gate and of the
up half.

Tensors, in elements (row strides multiples of 8: rows move in 16-byte pieces):
  x    (m, 2n)  strides (stride_m, 1): the gate in [0, n), the up projection in [n, 2n)
  out  (m, n)   strides (stride_m, 1)
"""

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute

from frostc.kernels.interface import I64, Kernel, Ptr, Variant, abi, pointer
from frostc.kernels.row_pieces import VECTOR_BYTES, load_piece, piece_elems, store_piece
from frostc.kernels.sdpa_common import dsl_dtype

THREADS = 128


@dataclass(frozen=True)
class SiluMulArgs:
    x: Ptr = pointer()
    out: Ptr = pointer()
    x_stride: I64 = abi("x.stride_m")
    out_stride: I64 = abi("out.stride_m")


@dataclass(frozen=True)
class SiluMulVariant(Variant):
    """Compile key: the dtype and the half row's length."""

    ARGS: ClassVar[type] = SiluMulArgs
    THREADS: ClassVar[int] = THREADS
    dtype: str  # "bf16" | "fp16"
    n: int  # out's row: half of x's (a multiple of a 16-byte piece's elements)

    @property
    def name(self) -> str:
        return f"silu_mul.{self.dtype}.n{self.n}"

    @property
    def elems(self) -> int:
        return piece_elems(self.dtype)

    @property
    def row_ctas(self) -> int:
        """CTAs along one row."""
        return -(-self.n // self.elems // THREADS)

    @property
    def tiles(self) -> dict[str, int]:
        return {"threads": THREADS, "vector_bytes": VECTOR_BYTES}

    @property
    def grid_rule(self) -> str:
        return f"(m, {self.row_ctas}, 1): one CTA per {THREADS} 16-byte pieces of each row"

    def kernel(self) -> "SiluMulKernel":
        return SiluMulKernel(self)


class SiluMulKernel(Kernel):
    def __init__(self, variant: SiluMulVariant):
        super().__init__(variant)
        self.v = variant
        self.dtype = dsl_dtype(variant.dtype)
        self.elems = variant.elems
        self.row_pieces = variant.n // self.elems

    @cute.kernel
    def kernel(self, args: SiluMulArgs):
        tidx, _, _ = cute.arch.thread_idx()
        row, part, _ = cute.arch.block_idx()
        piece = part * THREADS + tidx
        if piece < self.row_pieces:
            r = cutlass.Int64(row)
            col = piece * self.elems
            x_row = args.x + cute.assume(r * args.x_stride, divby=8)
            gate = self._load(x_row, col).to(cutlass.Float32)
            up = self._load(x_row, col + self.v.n).to(cutlass.Float32)
            silu = (gate / (cute.math.exp(-gate) + 1.0)).to(self.dtype).to(cutlass.Float32)
            self._store(args.out + cute.assume(r * args.out_stride, divby=8), col, (silu * up).to(self.dtype))

    def _load(self, base, col):
        return load_piece(base, col, self.elems)

    def _store(self, base, col, value) -> None:
        store_piece(base, col, value, self.elems)
