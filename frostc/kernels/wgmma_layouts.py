"""Register views of MMA fragments that the attention kernels share: the rows a thread holds,
an accumulator as (rows, cols) (Hopper WGMMA's and the warp-level m16n8k16's), and an
accumulator reused as the A operand."""

import cutlass.cute as cute


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
