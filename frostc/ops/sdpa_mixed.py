"""The mixed form's prefill chunks: the forward kernel's tiles over the paged cache.

A mixed step holds decodes (one token, or 1 + k speculative ones) and prefill chunks side by
side. The paged decode kernel is at the memory bound for the decodes, but a chunk's hundreds of
query rows want the forward kernel's 128-row tiles on two consumer warpgroups (bench/NOTES.md,
mixed v2: a chunk on the decode kernel ran at 0.49x the packed plan). So when a sequence can hold
more query rows than one of the decode kernel's row blocks, the node becomes two halves, both
decided on the device from the step's lengths:

- the paged decode kernel (and its combine) over the sequences whose rows fit one row block
  (`decode_tokens` queries or fewer), grid z = the batch;
- the scheduling kernel lists the other sequences' query blocks, longest first, and the forward
  kernel (`SdpaFwdVariant.page_size`) walks them, reading K and V from the pages box by box.

Every sequence belongs to exactly one half, so every output row is written once. Over an e4m3
cache the forward kernel reads the pages raw and converts each block into its 16-bit stages
(`SdpaFwdVariant.kv_cache`), the scales joining its scores and O; the decodes stay on the e4m3
decode kernel, whose row block is smaller (its rows decide `decode_tokens`).
"""

from __future__ import annotations

import math

from frost_runtime.dtypes import DTYPES

from frostc.contexts import ResolveContext
from frostc.kernels.interface import BhsStrides, TmaSource
from frostc.kernels.sdpa_common import MaskFlags
from frostc.kernels.sdpa_decode_paged import decode_tiles
from frostc.kernels.sdpa_fwd_wgmma import (
    ForwardShape,
    Outputs,
    PagedKeys,
    SdpaForwardArgs,
    SdpaFwdVariant,
    TileWorkspace,
)
from frostc.kernels.sdpa_schedule import ScheduleArgs, ScheduleVariant
from frostc.ops.paged_cache import cache_tma_strides, rows_per_page, scale_args
from frostc.ops.rows import HEAD_DIMS
from frostc.ops.sdpa_choice import tile_capacity, unit_capacity
from frostc.ops.sdpa_forward import form_strides, map_strides, schedule_workspace, softmax_scales
from frostc.ops.sdpa_node import Sdpa
from frostc.resolved import ResolvedLaunch, Workspace, launch

BOX_ROWS_MIN = 8  # a TMA box of a page must hold whole 8-row swizzle atoms


def decode_tokens(node: Sdpa, kv_cache_dtype: str) -> int:
    """The most queries a sequence may have and still be the paged decode kernel's: its query
    rows (tokens x the GQA group) fit one row block (the e4m3 kernel's is smaller)."""
    rows = decode_tiles(node.head_dim, node.page_size, "bf16", kv_cache_dtype).rows
    return rows // (node.heads_q // node.heads_kv)


def chunks_apart(node: Sdpa, kv_cache_dtype: str) -> bool:
    """Whether the node's chunks run on the forward kernel: a mixed node over a 16-bit or e4m3
    cache whose sequences may have more queries than a decode row block holds."""
    cache = DTYPES[kv_cache_dtype]
    if node.form != "mixed" or node.head_dim not in HEAD_DIMS or (cache.quantized and kv_cache_dtype != "e4m3"):
        return False
    tokens = decode_tokens(node, kv_cache_dtype)
    if tokens < 1 or node.seq_q <= tokens:
        return False  # every sequence is a decode (or the group outgrows a row block)
    return math.gcd(node.page_size, forward_variant(node, "bf16").tile_shape.block_n) >= BOX_ROWS_MIN


def forward_variant(node: Sdpa, dtype: str, kv_cache_dtype: str = "") -> SdpaFwdVariant:
    """`kv_cache_dtype`: the cache's, where it is quantized (its pages converted on load)."""
    quantized = bool(kv_cache_dtype) and DTYPES[kv_cache_dtype].quantized
    return SdpaFwdVariant(
        dtype, node.head_dim, node.mask.flags, node.lse is not None, varlen=True, page_size=node.page_size,
        sinks=node.sinks is not None, kv_cache=kv_cache_dtype if quantized else "",
    )  # fmt: skip


def chunk_launches(node: Sdpa, ctx: ResolveContext) -> tuple[ResolvedLaunch, ResolvedLaunch]:
    """The scheduling kernel's launch (the chunks' query blocks) and the forward kernel's over
    the pages, in that order."""
    variant = forward_variant(node, ctx.slot(node.q).dtype, ctx.slot(node.k).dtype)
    tiles = variant.tile_shape
    units = unit_capacity(node, tiles.block_m)
    workspace = schedule_workspace(node, units, ctx, prefix="chunk_")
    return _schedule_launch(node, variant, units, workspace, ctx), _attention_launch(node, variant, workspace, ctx)


def _schedule_launch(node: Sdpa, attention: SdpaFwdVariant, units: int, workspace: dict[str, int], ctx):
    tiles = attention.tile_shape
    flags = node.mask.flags
    variant = ScheduleVariant(
        packed=True, q_lengths=True, kv_lengths=True, mask=MaskFlags(flags.right, flags.left, flags.bottom_right),
        block_m=tiles.block_m, block_n=tiles.block_n, mixed=True,
    )  # fmt: skip
    args = ScheduleArgs(
        ctx.slot(node.q_lengths), ctx.slot(node.kv_lengths),
        *(Workspace(workspace[name]) for name in ("sequences", "tiles", "tile_count")),
        batch=node.batch, q_capacity=node.tokens_q, kv_capacity=node.seq_kv, max_seqlen_q=node.seq_q,
        max_seqlen_kv=node.seq_kv, unit_capacity=units, heads_q=node.heads_q,
        window_left=node.mask.window_left or 0, window_right=0, maps=None,
        decode_tokens=decode_tokens(node, ctx.slot(node.k).dtype),
    )  # fmt: skip
    return launch(node.name, variant, (1, 1, 1), args)


def _attention_launch(node: Sdpa, variant: SdpaFwdVariant, workspace: dict[str, int], ctx) -> ResolvedLaunch:
    q, k, v, o = (ctx.slot(name) for name in (node.q, node.k, node.v, node.o))
    lse = ctx.slot(node.lse) if node.lse else None
    table = ctx.slot(node.page_table)
    mask = node.mask
    shape = ForwardShape(
        batch=node.batch, heads_q=node.heads_q, seq_q=node.seq_q, seq_kv=node.seq_kv,
        group=node.heads_q // node.heads_kv, window_left=mask.window_left or 0, window_right=0,
        q_rows=0, k_rows=0, v_rows=0,
    )  # fmt: skip
    paged = PagedKeys(
        table, page_table_stride=table.strides[0], pages=node.pages,
        rows_per_page=rows_per_page(k, node.pages, node.page_size),
    )  # fmt: skip
    args = SdpaForwardArgs(
        q=TmaSource(q, map_strides(q, form_strides(q, "packed")), node.heads_q),
        k=TmaSource(k, _bhs_order(cache_tma_strides(k)), node.heads_kv),
        v=TmaSource(v, _bhs_order(cache_tma_strides(v)), node.heads_kv),
        outputs=Outputs(o, lse),
        workspace=TileWorkspace(*(Workspace(workspace[name]) for name in ("sequences", "tiles", "tile_count")), None),
        shape=shape,
        o_strides=BhsStrides(*form_strides(o, "packed")),
        lse_strides=BhsStrides(*form_strides(lse, "packed")),
        softmax=softmax_scales(node),
        descales=None,
        v_maps=None,
        paged=paged,
        sinks=ctx.slot(node.sinks) if node.sinks else None,
        **_cache_scales(node, variant, ctx),
    )
    return launch(node.name, variant, (tile_capacity(node, variant.tile_shape.block_m), 1, 1), args)


def _cache_scales(node: Sdpa, variant: SdpaFwdVariant, ctx) -> dict:
    """An e4m3 cache's scales, one per KV head or one for all (stride 0), as the decode kernel
    takes them; none for a 16-bit cache."""
    if not variant.kv_cache:
        return {"scales": None, "scale_strides": None}
    scales, strides = scale_args(ctx.slot(node.k_scale), ctx.slot(node.v_scale))
    return {"scales": scales, "scale_strides": strides}


def _bhs_order(page_row_head: tuple[int, int, int]) -> tuple[int, int, int]:
    """A cache's (page, row, head) strides in the forward kernel's (b, h, s) order: its tensor maps
    see the pages as ragged rows, so the page stride is never stepped over."""
    page, row, head = page_row_head
    return (page, head, row)
