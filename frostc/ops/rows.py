"""What every op's kernels require of the tensors they move, and how anything else is declined
at resolve time (with the field path): head dims the kernels are built for, rows of d
elements moved in 16-byte pieces, TMA strides under 2**40 bytes, int32 extents."""

from __future__ import annotations

from frost_runtime.dtypes import DTYPES

from frostc.contexts import CheckedTensor, NodeContext, ResolveContext
from frostc.graph import Tensor
from frostc.kernels.interface import BhsStrides
from frostc.kernels.sdpa_fwd_wgmma import HEAD_DIM_PAIRS
from frostc.resolved import Slot

# every form's (dense, padded, packed, paged decode, mixed; kv_append; 16-bit and e4m3 caches)
HEAD_DIMS = (64, 96, 128, 256)
# e4m3 q, k and v (the forward kernel's K-major rows and vt_pack's re-lay: whole 64-wide pieces)
E4M3_HEAD_DIMS = (64, 128, 256)
# the 16-bit dense, padded and packed forms also take q and k at one head dim with v and o at
# another, the pairs of HEAD_DIM_PAIRS (DeepSeek: 192, 128)
ROW_PIECE_BYTES = 16  # rows move in 16-byte pieces
TMA_STRIDE_LIMIT = 1 << 40  # bytes: the largest global stride a tensor map can hold, exclusive
INT32_MAX = (1 << 31) - 1


def bhs_strides(slot: Slot | None) -> BhsStrides:
    """A (b, h, s, ...) tensor's first three strides, as the kernels take them; zeros for an
    absent tensor (its pointer is null: the kernel never reads them)."""
    if slot is None:
        return BhsStrides(0, 0, 0)
    return BhsStrides(*slot.strides[:3])


def check_head_dim(
    head_dim: int, path: str, ctx: ResolveContext, supported: tuple[int, ...] = HEAD_DIMS, where: str = ""
) -> None:
    """A head dim the kernels are built for (`supported`); `where` names what refuses it, e.g.
    "with e4m3 q, k and v". A head dim other kernels take (`HEAD_DIMS`) says so."""
    if head_dim not in supported:
        dims = ", ".join(map(str, supported))
        message = f"head dim {head_dim} is not supported{' ' + where if where else ''} yet; supported: {dims}"
        if head_dim in HEAD_DIMS:
            message += f" (head dim {head_dim} with bf16 or fp16 q, k and v: every form)"
        for qk, v in HEAD_DIM_PAIRS:
            if head_dim == qk:
                message += (
                    f" (head dim {qk} only for q and k with v and o at {v}, in the dense, padded and packed forms "
                    "with bf16 or fp16 q, k, v)"
                )
        ctx.problem(path, message)


def check_value_dim(node, form_words: str, ctx: ResolveContext) -> bool:
    """A node whose v and o head dim differs from q's and k's (a validated pair of HEAD_DIM_PAIRS):
    refused at v's head dim unless `form_words` is empty (the 16-bit dense, padded and packed forms
    take it; else it names what refuses it, e.g. "in the paged form"). Returns whether it differs."""
    if node.head_dim_v == node.head_dim:
        return False
    if form_words:
        v = ctx.tensor(node.v)
        pairs = ", ".join(map(str, HEAD_DIM_PAIRS))
        ctx.problem(
            f"{v.path}.dims[{len(v.dims) - 1}]",
            f"v head dim {node.head_dim_v} with q/k head dim {node.head_dim} is not supported {form_words}; "
            f"the pairs {pairs} are built for the dense, padded and packed forms with bf16 or fp16 q, k and v",
        )
    return True


def row_align_elems(dtype: str) -> int:
    """Elements of one 16-byte piece: every stride but the head dim's is a multiple of it."""
    return ROW_PIECE_BYTES // DTYPES[dtype].bytes


_INNER_WORDS = {"d": "head dim", "n": "row", "k": "row"}  # the innermost letter of each op's rows


def check_row_layout(t: Tensor, letters: str, layouts: str, ctx: ResolveContext) -> None:
    """The head dim (the last of `letters`) innermost, every other stride a whole number of
    16-byte pieces; `layouts` suggests layouts that are, e.g. '"bshd" or "bhsd"'."""
    last = len(t.dims) - 1
    if t.strides[last] != 1:
        ctx.problem(
            f"{t.path}.strides[{last}]",
            f"the {_INNER_WORDS.get(letters[-1], 'last dim')} must be innermost (stride 1), found stride "
            f"{t.strides[last]}; "
            f"use a layout ending in {letters[-1]}, such as {layouts}",
        )
    outer = tuple(range(len(letters) - 1))
    check_whole_pieces(t, letters, outer, "(16 bytes) so rows can be moved in 16-byte pieces", ctx)


def check_whole_pieces(t: Tensor, letters: str, dims: tuple[int, ...], why: str, ctx: ResolveContext) -> None:
    """Strides of `dims` (those stepped over: extent > 1) whole 16-byte pieces; `why` ends the message."""
    align = row_align_elems(t.dtype)
    for i in dims:
        if t.dims[i] > 1 and t.strides[i] % align:
            ctx.problem(
                f"{t.path}.strides[{i}]",
                f"stride {t.strides[i]} of dim {letters[i]} must be a multiple of {align} elements {why}",
            )


def check_tma_strides(t: Tensor, letters: str, dims: tuple[int, ...], ctx: ResolveContext) -> None:
    """Strides a TMA tensor map holds (of `dims`) must stay under 2**40 bytes."""
    size = DTYPES[t.dtype].bytes
    for i in dims:
        if t.dims[i] > 1 and t.strides[i] * size >= TMA_STRIDE_LIMIT:
            ctx.problem(
                f"{t.path}.strides[{i}]",
                f"stride {t.strides[i]} of dim {letters[i]} is {t.strides[i] * size} bytes; TMA "
                f"loads need strides under 2**40 bytes ({TMA_STRIDE_LIMIT // size} elements)",
            )


def tma_stride(extent: int, stride: int, dtype: str) -> int:
    """A dim of extent 1 is never stepped over, so its stride (which a description may leave at
    any value) becomes one TMA accepts (16 bytes)."""
    return stride if extent > 1 else row_align_elems(dtype)


def agreeing_sizes(
    tensors: dict[str, CheckedTensor],
    dims: dict[str, tuple[str, ...]],
    words: dict[str, str],
    ctx: NodeContext,
    optional: tuple[str, ...] = (),
) -> tuple[dict[str, int], dict[str, str], bool]:
    """Each named dim's size (`dims`: role -> its dims' names), the role it was first read from,
    and whether all is well: a problem, in `words`' terms, for each role that disagrees; not
    well either when a role is missing or invalid (an optional role the node does not name aside)."""
    sizes: dict[str, int] = {}
    owner: dict[str, str] = {}
    ok = True
    for role, names in dims.items():
        c = tensors.get(role)
        if c is None or c.dims is None:
            ok = ok and role in optional and not ctx.given(role)
            continue
        for i, (name, size) in enumerate(zip(names, c.dims)):
            if name not in sizes:
                sizes[name], owner[name] = size, role
            elif sizes[name] != size:
                message = f"{words[name]} {size} does not match {owner[name]}'s {sizes[name]}; make them equal"
                ctx.problems_at(c.at(f"dims[{i}]"), message)
                ok = False
    return sizes, owner, ok
