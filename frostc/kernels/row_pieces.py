"""16-byte pieces of a row in global memory: the loads and stores of the kernels that work a row
at a time (rms_norm, silu_mul). `col` is in elements and a multiple of a piece's; rows are
16-byte aligned (checked at build), so each access is one vector instruction."""

import cutlass.cute as cute
from frost_runtime.dtypes import DTYPES

VECTOR_BYTES = 16  # one piece: a 16-byte vector access


def piece_elems(dtype: str) -> int:
    """Elements of `dtype` in one piece."""
    return VECTOR_BYTES // DTYPES[dtype].bytes


def load_piece(base, col, elems: int):
    return cute.make_tensor(base + cute.assume(col, divby=8), cute.make_layout(elems)).load()


def store_piece(base, col, value, elems: int) -> None:
    cute.make_tensor(base + cute.assume(col, divby=8), cute.make_layout(elems)).store(value)
