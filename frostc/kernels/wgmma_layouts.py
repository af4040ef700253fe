"""Register views of MMA fragments that the attention kernels share: the rows a thread holds,
an accumulator as (rows, cols) (Hopper WGMMA's and the warp-level m16n8k16's), and an
accumulator reused as the A operand; the width of a swizzle atom's rows along the head dim."""

import cutlass.cute as cute

# WGMMA's swizzles a row of the head dim is cut into, widest first: the 128-byte one where a row
# is a whole number of 128 bytes (d = 64, 128, 256 at 16 bits), else the 64-byte one (d = 96)
SWIZZLE_ROW_BYTES = (128, 64)


def swizzle_elems(head_dim: int, bits: int) -> int:
    """Elements of `bits` bits in one row of the swizzle atom that `sm90.make_smem_layout_a/b`
    picks for tiles `head_dim` wide (the widest swizzle whose row divides a head-dim row). A TMA
    box this wide along d lands in one column of atoms: for each such piece of d, a tile's rows
    are contiguous (64 at 16 bits: 128 bytes; 32 at d=96: 64 bytes, three boxes a row)."""
    for row_bytes in SWIZZLE_ROW_BYTES:
        if head_dim * bits % (8 * row_bytes) == 0:
            return 8 * row_bytes // bits
    raise ValueError(f"rows of {head_dim} elements of {bits} bits are not a whole number of 64 bytes")


def wgmma_rows(acc_layout) -> int:
    """Rows of a WGMMA accumulator ((2, 2, N/8), M, N) one thread holds."""
    return cute.size(acc_layout.shape[0][1]) * cute.size(acc_layout.shape[1])


def wgmma_rows_by_cols(acc: cute.Tensor) -> cute.Tensor:
    """View ((2 cols, 2 rows, N/8 blocks), MMA_M, MMA_N) as (rows, cols)."""
    lay = cute.make_layout(acc.layout.shape)
    view = cute.make_layout(
        ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[0][2], lay.shape[2])),
        stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[0][2], lay.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, view))


def c_to_a_layout(c):
    """Accumulator ((2, 2, N/8), M, 1) -> A operand ((2, 2, 2), M, N/16): each 16 columns of S
    are one k-slice of P (the m64nNk16 C and A register layouts agree for 16-bit types)."""
    return cute.make_layout(
        ((c.shape[0][0], c.shape[0][1], 2), c.shape[1], c.shape[0][2] // 2),
        stride=((c.stride[0][0], c.stride[0][1], c.stride[0][2]), c.stride[1], c.stride[0][2] * 2),
    )


def mma_rows_by_cols(acc: cute.Tensor) -> cute.Tensor:
    """View a warp-level m16n8 accumulator ((2 cols, 2 rows), MMA_M, MMA_N) as (rows, cols):
    rows (row half, m-tile), cols (column parity, n-tile)."""
    lay = cute.make_layout(acc.layout.shape)
    view = cute.make_layout(
        ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[2])),
        stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, view))
