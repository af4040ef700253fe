"""The sdpa op's paged form (decode over a paged KV cache): what its kernels support and how a
node becomes launches. `frostc.ops.sdpa` validates the node (all forms) and hands paged nodes
here.

Split-KV is decided at build, from the capacities and the target's SM count
(`frostc.ops.sdpa_choice.choose_decode`): with few (sequence, KV head) pairs a cache read by one
CTA per pair would leave most SMs idle, so each sequence's keys are cut into chunks of `chunk`
keys, one CTA each; the chunks' partial results go to the workspace and a combine launch merges
them. The plan records the split count (the attention launch's grid x) and the chunk (an
argument of both launches).
"""

from __future__ import annotations

from frost_runtime.schema import MAX_GRID

from frostc.contexts import ResolveContext
from frostc.graph import Tensor
from frostc.kernels.cache_args import PackedQueries
from frostc.kernels.interface import BhsStrides, TmaSource
from frostc.kernels.sdpa_common import LOG2_E, SoftmaxScales
from frostc.kernels.sdpa_decode_combine import DecodeCombineArgs, DecodeCombineVariant
from frostc.kernels.sdpa_decode_paged import (
    DecodeSizes,
    DecodeTensors,
    PagedDecodeArgs,
    PagedDecodeVariant,
    decode_tiles,
)
from frostc.ops.paged_cache import cache_tma_strides, rows_per_page, scale_args
from frostc.ops.rows import (
    INT32_MAX,
    bhs_strides,
    check_head_dim,
    check_row_layout,
    check_tma_strides,
    check_value_dim,
)
from frostc.ops.sdpa_choice import DecodeConfig, choose_decode, decode_rows, row_block_ctas
from frostc.ops.sdpa_mixed import chunk_launches, chunks_apart, decode_tokens
from frostc.ops.sdpa_node import Sdpa
from frostc.resolved import ResolvedLaunch, Workspace, launch
from frostc.target import TARGETS


def resolve(node: Sdpa, ctx: ResolveContext) -> tuple[ResolvedLaunch, ...]:
    before = len(ctx.problems)
    _check_supported(node, ctx)
    if len(ctx.problems) > before:
        return ()
    ctx.length_contract(node.kv_lengths, "lengths", node.seq_kv)
    if node.form == "mixed":
        ctx.length_contract(node.q_lengths, "offsets", node.seq_q, node.tokens_q)
    dtype, kv_cache_dtype = ctx.slot(node.q).dtype, ctx.slot(node.k).dtype
    apart = chunks_apart(node, kv_cache_dtype)
    config = choose_decode(node, dtype, kv_cache_dtype, TARGETS[ctx.graph.target], apart)
    splits, chunk, tiles = config.splits, config.chunk, config.tiles
    variant = PagedDecodeVariant(
        dtype, kv_cache_dtype, node.head_dim, node.page_size, node.causal, splits > 1, node.lse is not None,
        window=node.mask.window_left is not None, softcap=node.mask.softcap is not None, few_rows=config.few_rows,
        packed=node.form == "mixed", chunks_apart=apart,
        # split: the combine adds them (adaptively split decodes: here too, for the sequences
        # this kernel writes directly)
        sinks=node.sinks is not None and (splits == 1 or apart),
    )  # fmt: skip
    # the mixed form's chunks, when apart: the scheduling kernel and the forward kernel over the
    # pages, after the decodes (which may start early behind an append: `mark_early_starts`)
    chunks = chunk_launches(node, ctx) if apart else ()
    if splits == 1:
        return (_attention_launch(node, variant, splits, chunk, None, ctx), *chunks)
    # a row's partial result from each split: (sequence, KV head, split, row), or with packed
    # queries (split, token, query head)
    if apart:  # the decodes' rows only: a row block's a sequence
        rows = node.batch * node.heads_kv * tiles.rows
    elif node.form == "mixed":
        rows = node.tokens_q * node.heads_q
    else:
        rows = node.batch * node.heads_kv * decode_rows(node)
    partials = splits * rows
    workspace = {
        "o_partial": ctx.workspace(f"{node.name}.o_partial", partials * node.head_dim * 4),
        "lse_partial": ctx.workspace(f"{node.name}.lse_partial", partials * 4),
    }
    return (
        _attention_launch(node, variant, splits, chunk, workspace, ctx),
        _combine_launch(node, config, workspace, ctx, apart),
        *chunks,
    )


def _check_supported(node: Sdpa, ctx: ResolveContext) -> None:
    q, k, v = ctx.tensor(node.q), ctx.tensor(node.k), ctx.tensor(node.v)
    check_head_dim(node.head_dim, f"{q.path}.dims[{len(q.dims) - 1}]", ctx, where=f"in the {node.form} form")
    check_value_dim(node, f"in the {node.form} form", ctx)
    letters, layouts = ("thd", '"thd"') if node.form == "mixed" else ("bhsd", '"bshd" or "bhsd"')
    for name in (node.q, node.o):
        check_row_layout(ctx.tensor(name), letters, layouts, ctx)
    for cache in (k, v):
        check_row_layout(cache, "pshd", '"pshd"', ctx)
    _check_cache(k, ctx)
    if v.strides != k.strides:
        ctx.problem(
            f"{v.path}.strides",
            f"the V cache's strides {list(v.strides)} differ from the K cache's {list(k.strides)}; "
            "give both caches the same layout",
        )
    table = ctx.tensor(node.page_table)
    if table.dims[1] > 1 and table.strides[1] != 1:
        ctx.problem(f"{table.path}.strides[1]", f"stride {table.strides[1]}: each row of page ids must be contiguous")
    for name in (node.kv_lengths, node.q_lengths if node.form == "mixed" else None):
        lengths = ctx.tensor(name) if name is not None else None
        if lengths is not None and lengths.dims[0] > 1 and lengths.strides[0] != 1:
            message = f"stride {lengths.strides[0]}: lengths must be contiguous (stride 1)"
            ctx.problem(f"{lengths.path}.strides[0]", message)
    # the launches' grids: (splits, heads_kv * row blocks, batch), or mixed (splits, heads_kv,
    # row blocks of all sequences); the combine's (rows, heads_kv, batch)
    if node.batch > MAX_GRID[2]:
        ctx.problem(
            f"{q.path}.dims[0]", f"batch {node.batch} is over {MAX_GRID[2]}, a launch's grid z; split the batch"
        )
    rows_per_cta = decode_tiles(node.head_dim, node.page_size, q.dtype, k.dtype).rows
    row_blocks = -(-decode_rows(node) // rows_per_cta)
    if node.form == "mixed":
        if node.batch <= MAX_GRID[2] < row_block_ctas(node, rows_per_cta, chunks_apart(node, k.dtype)):
            ctx.problem(
                f"{q.path}.dims[0]",
                f"{node.tokens_q} tokens of {node.heads_q // node.heads_kv} query heads per KV head make up to "
                f"{row_block_ctas(node, rows_per_cta)} blocks of {rows_per_cta} rows with {node.batch} sequences, "
                f"a grid z over {MAX_GRID[2]}: fewer tokens per plan",
            )
    elif node.heads_kv * row_blocks > MAX_GRID[1]:
        ctx.problem(
            f"{q.path}.dims[1]",
            f"{node.heads_q} query heads of {node.seq_q} new tokens over {node.heads_kv} KV heads make "
            f"{node.heads_kv} x {row_blocks} blocks of {rows_per_cta} rows, a grid y of {node.heads_kv * row_blocks}; "
            f"a launch's grid y is at most {MAX_GRID[1]}: fewer heads or new tokens per plan",
        )
    if node.seq_kv > INT32_MAX:
        ctx.problem(
            f"{table.path}.dims[1]",
            f"{table.dims[1]} pages of {node.page_size} tokens do not fit the kernel's int32 positions",
        )


def _check_cache(k: Tensor, ctx: ResolveContext) -> None:
    """The cache is read as ragged rows: page p's row r is row p * (page stride / row stride) + r,
    which must be a whole row and fit int32; TMA strides stay under 2**40 bytes."""
    pages, page_size = k.dims[0], k.dims[1]
    page_stride, row_stride = k.strides[0], k.strides[1]
    if pages > 1 and (row_stride == 0 or page_stride % row_stride):
        ctx.problem(
            f"{k.path}.strides[0]",
            f"page stride {page_stride} is not a multiple of the row stride {row_stride}: keep pages outermost, "
            'as layout "pshd" (the default) does',
        )
    elif row_stride and (pages - 1) * (page_stride // row_stride) + page_size > INT32_MAX:
        ctx.problem(f"{k.path}.dims[0]", f"{pages} pages of {page_size} rows do not fit the kernel's int32 rows")
    check_tma_strides(k, "pshd", (1, 2), ctx)  # the row and head strides (pages: whole rows)


def _attention_launch(node: Sdpa, variant: PagedDecodeVariant, splits: int, chunk: int, workspace, ctx):
    q, o, k, v = ctx.slot(node.q), ctx.slot(node.o), ctx.slot(node.k), ctx.slot(node.v)
    lse = ctx.slot(node.lse) if node.lse else None
    table = ctx.slot(node.page_table)
    rows = decode_rows(node)
    row_blocks = -(-rows // variant.tile_shape.rows)
    sizes = DecodeSizes(
        batch=node.batch, heads_kv=node.heads_kv, group=node.heads_q // node.heads_kv, s_new=node.seq_q, rows=rows,
        row_blocks=row_blocks, max_pages=table.dims[1], pages=node.pages,
        rows_per_page=rows_per_page(k, node.pages, node.page_size), chunk=chunk, splits=splits,
        window_left=_window_left(node),
    )  # fmt: skip
    # a quantized cache's kernel scales Q by attn_scale itself (before fp16), and the scores by
    # k_scale (read on the device): the scales below then leave attn_scale out
    scale = 1.0 if variant.quantized else node.attn_scale
    if node.mask.softcap is None:
        softmax = SoftmaxScales(scale_log2=scale * LOG2_E, score_scale=0.0)
    else:  # s -> softcap * tanh(s * scale / softcap): the tanh's argument, then the softmax's scale
        softmax = SoftmaxScales(scale_log2=node.mask.softcap * LOG2_E, score_scale=scale / node.mask.softcap)
    scales = scale_strides = None
    if variant.quantized:  # one scale per KV head, or one for all (stride 0)
        scales, scale_strides = scale_args(ctx.slot(node.k_scale), ctx.slot(node.v_scale))
    # the partial results: workspace with several splits, unused (null) with one
    partials = [Workspace(workspace[name]) if workspace else None for name in ("o_partial", "lse_partial")]
    args = PagedDecodeArgs(
        k=TmaSource(k, cache_tma_strides(k), extents=node.heads_kv),
        v=TmaSource(v, cache_tma_strides(v), extents=node.heads_kv),
        tensors=DecodeTensors(q, o, lse, table, ctx.slot(node.kv_lengths), *partials),
        scales=scales, sizes=sizes, q_strides=_query_strides(q, node), o_strides=_query_strides(o, node),
        lse_strides=_query_strides(lse, node), page_table_stride=table.strides[0], scale_strides=scale_strides,
        softmax=softmax, q_scale=node.attn_scale if variant.quantized else None, packed=_packed_queries(node, ctx),
        sinks=ctx.slot(node.sinks) if variant.sinks else None,
    )  # fmt: skip
    if node.form == "mixed":  # each sequence's first row block, then (chunks not apart) the chunks' further ones
        ctas = row_block_ctas(node, variant.tile_shape.rows, variant.chunks_apart)
        return launch(node.name, variant, (splits, node.heads_kv, ctas), args)
    return launch(node.name, variant, (splits, node.heads_kv * row_blocks, node.batch), args)


def _combine_launch(node: Sdpa, config: DecodeConfig, workspace: dict[str, int], ctx, apart: bool) -> ResolvedLaunch:
    splits, chunk, tiles = config.splits, config.chunk, config.tiles
    o = ctx.slot(node.o)
    lse = ctx.slot(node.lse) if node.lse else None
    mixed = node.form == "mixed"
    # with the chunks apart only the decodes' rows were split: at most one row block a sequence
    decode_rows_max = decode_tokens(node, ctx.slot(node.k).dtype) * (node.heads_q // node.heads_kv) if apart else 0
    variant = DecodeCombineVariant(
        o.dtype, node.head_dim, lse is not None, packed=mixed, causal=mixed and node.causal,
        decode_rows=decode_rows_max, sinks=node.sinks is not None,
    )  # fmt: skip
    args = DecodeCombineArgs(
        Workspace(workspace["o_partial"]), Workspace(workspace["lse_partial"]), ctx.slot(node.kv_lengths), o, lse,
        heads_kv=node.heads_kv, group=node.heads_q // node.heads_kv, rows=tiles.rows if apart else decode_rows(node),
        capacity=node.seq_kv, chunk=chunk, splits=splits, s_new=node.seq_q, window_left=_window_left(node),
        block_n=tiles.block_n,
        o_strides=_query_strides(o, node), lse_strides=_query_strides(lse, node), packed=_packed_queries(node, ctx),
        sinks=ctx.slot(node.sinks) if node.sinks else None,
    )  # fmt: skip
    rows = -(-min(decode_rows(node), decode_rows_max) // variant.rows_per_cta) if apart else decode_rows(node)
    return launch(node.name, variant, (rows, node.heads_kv, node.batch), args)


def _window_left(node: Sdpa) -> int:
    return -1 if node.mask.window_left is None else node.mask.window_left


def _query_strides(slot, node: Sdpa) -> BhsStrides:
    """(b, h, s) strides of q, o or lse: (b, h, s_new, ...) tensors', or with packed queries
    (tokens, h, ...) tensors' with no b (the kernels add each sequence's first token)."""
    if node.form != "mixed" or slot is None:
        return bhs_strides(slot)
    return BhsStrides(0, slot.strides[1], slot.strides[0])


def _packed_queries(node: Sdpa, ctx) -> PackedQueries | None:
    if node.form != "mixed":
        return None
    return PackedQueries(ctx.slot(node.q_lengths), tokens=node.tokens_q)
