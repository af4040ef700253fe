"""The sdpa op's dense, padded and packed forms: what their kernels support and how a node
becomes launches (the forward attention kernel; with variable lengths the scheduling kernel
before it; with e4m3 V given d-innermost or packed, vt_pack's re-lay). `frostc.ops.sdpa`
validates the node and hands these forms here; `frostc.ops.sdpa_choice` says how the kernels
cut the work."""

from __future__ import annotations

from frost_runtime.schema import MAX_GRID

from frostc.contexts import ResolveContext
from frostc.kernels.interface import BhsStrides, TmaSource
from frostc.kernels.sdpa_common import LOG2_E, MaskFlags, SoftmaxScales
from frostc.kernels.sdpa_fwd_wgmma import (
    Descales,
    ForwardShape,
    Outputs,
    SdpaForwardArgs,
    SdpaFwdVariant,
    TileWorkspace,
)
from frostc.kernels.sdpa_schedule import ScheduleArgs, ScheduleVariant, VMaps
from frostc.kernels.sequence_maps import MAP_BYTES, packed_pitch
from frostc.kernels.vt_pack import BatchedV, PackedV, VtPackArgs, VtPackVariant, relaid_pitch
from frostc.ops.rows import (
    E4M3_HEAD_DIMS,
    HEAD_DIMS,
    INT32_MAX,
    check_head_dim,
    check_row_layout,
    check_tma_strides,
    check_value_dim,
    check_whole_pieces,
    tma_stride,
)
from frostc.ops.sdpa_choice import (
    PAIRED_MAX_QUERY_BLOCKS,
    PER_TILE_MIN_KEY_BLOCKS,
    ForwardConfig,
    choose_forward,
    tile_capacity,
    unit_capacity,
)
from frostc.ops.sdpa_node import DESCALE_ROLES, Sdpa
from frostc.resolved import ResolvedLaunch, Workspace, launch
from frostc.target import TARGETS


def resolve(node: Sdpa, ctx: ResolveContext) -> tuple[ResolvedLaunch, ...]:
    before = len(ctx.problems)
    config = _config(node, ctx)
    _check_supported(node, config, ctx)
    variant = _variant(node, config, ctx)
    if len(ctx.problems) > before:
        return ()
    relaid = config.v_source == "relaid"  # e4m3 V given with d innermost: Vᵀ re-laid into the workspace
    if node.form == "dense":
        regions: dict[str, int] = {}
        if config.walk == "dynamic":  # the tiles' counter: zero at every launch's start, left zero
            regions["tile_counter"] = ctx.workspace(f"{node.name}.tile_counter", 4, zeroed=True)
        if variant.count_visits:  # int32 per (tile, consumer), through the tile list's pointer
            visits = tile_capacity(node, variant.tile_shape.block_m) * variant.tile_shape.consumers
            regions["tiles"] = ctx.workspace(f"{node.name}.tile_visits", 4 * visits)
        if relaid:
            regions["v_relaid"] = _relaid_region(node, ctx)
            return (
                _relay_launch(node, variant, regions["v_relaid"], ctx),
                _attention_launch(node, variant, ctx, regions),
            )
        return (_attention_launch(node, variant, ctx, regions),)
    _record_length_contracts(node, ctx)
    tiles = variant.tile_shape
    units = unit_capacity(node, tiles.block_m)
    workspace = schedule_workspace(node, units, ctx)
    if node.fp8:  # each sequence's Vᵀ tensor map, written by the scheduling kernel
        workspace["v_maps"] = ctx.workspace(f"{node.name}.v_maps", MAP_BYTES * node.batch)
    if config.v_source == "repacked":  # packed V, transposed from 16-key boundaries (vt_pack)
        rows = node.heads_kv * node.head_dim
        workspace["v_packed"] = ctx.workspace(f"{node.name}.v_packed", rows * packed_pitch(node.tokens_kv, node.batch))
    if relaid:  # padded V's rows, transposed: both launches' V maps address the workspace
        workspace["v_relaid"] = _relaid_region(node, ctx)
    attention = _attention_launch(node, variant, ctx, workspace)
    schedule = _schedule_launch(node, variant, units, workspace, attention, ctx)
    if config.v_source == "repacked":
        return (schedule, _pack_launch(node, variant, workspace, ctx), attention)
    if relaid:
        return (schedule, _relay_launch(node, variant, workspace["v_relaid"], ctx), attention)
    return (schedule, attention)


def schedule_workspace(node: Sdpa, units: int, ctx: ResolveContext, prefix: str = "") -> dict[str, int]:
    """The scheduling kernel's regions, which the attention launch reads: the sequences' table,
    the list of `units` (sequence, query block) units and their count (`prefix`: before each name)."""
    return {
        "sequences": ctx.workspace(f"{node.name}.{prefix}sequences", 16 * node.batch),
        "tiles": ctx.workspace(f"{node.name}.{prefix}tiles", 8 * units),
        "tile_count": ctx.workspace(f"{node.name}.{prefix}tile_count", 4),
    }


def _relaid_region(node: Sdpa, ctx: ResolveContext) -> int:
    """The workspace region of the re-laid Vᵀ (b, hkv, d, pitch), e4m3: its offset."""
    nbytes = node.batch * node.heads_kv * node.head_dim * relaid_pitch(node.seq_kv)
    return ctx.workspace(f"{node.name}.v_relaid", nbytes)


def _relaid_strides(node: Sdpa) -> tuple[int, int, int]:
    """(b, h, s) element strides of the re-laid Vᵀ: keys innermost, d rows `pitch` apart."""
    pitch = relaid_pitch(node.seq_kv)
    return (node.heads_kv * node.head_dim * pitch, node.head_dim * pitch, 1)


def _relay_launch(node: Sdpa, attention: SdpaFwdVariant, offset: int, ctx: ResolveContext) -> ResolvedLaunch:
    """Dense or padded e4m3 V (b, h, s, d) with d innermost, transposed into the workspace at
    `offset` as Vᵀ (b, h, d, pitch) (vt_pack's batched variant), before the attention."""
    variant = VtPackVariant(node.head_dim, batched=True, p_order=attention.v_in_p_order)
    v = ctx.slot(node.v)
    pitch = relaid_pitch(node.seq_kv)
    batched = BatchedV(node.seq_kv, stride_b=v.strides[0], stride_s=v.strides[2], stride_h=v.strides[1])
    args = VtPackArgs(v, None, Workspace(offset), packed=None, batched=batched, pitch=pitch)
    return launch(node.name, variant, variant.grid(pitch, node.heads_kv, node.batch), args)


def _record_length_contracts(node: Sdpa, ctx: ResolveContext) -> None:
    """What the plan assumes of the caller's lengths; the kernels clamp to it (never reading or
    writing outside a buffer), and frost_runtime's check_lengths checks it on request."""
    for name, longest, total in (
        (node.q_lengths, node.seq_q, node.tokens_q),
        (node.kv_lengths, node.seq_kv, node.tokens_kv),
    ):
        if name is not None:
            kind = "offsets" if node.form == "packed" else "lengths"
            ctx.length_contract(name, kind, longest, total if kind == "offsets" else 0)


def _config(node: Sdpa, ctx: ResolveContext) -> ForwardConfig:
    v_d_innermost = ctx.tensor(node.v).strides[-1] == 1
    return choose_forward(node, v_d_innermost, TARGETS[ctx.graph.target])


def _variant(node: Sdpa, config: ForwardConfig, ctx: ResolveContext) -> SdpaFwdVariant:
    """The attention kernel's compile key (its tiles follow from it)."""
    if node.debug_tile_visits and config.walk != "dynamic":
        walk = {"per_tile": "one CTA per tile", "paired": "pairs of tiles"}.get(config.walk, "a fixed walk")
        ctx.problem(
            f"{node.path}.debug_tile_visits",
            f"counts the visits of the dynamic tile walk (dense causal heads of {PAIRED_MAX_QUERY_BLOCKS + 1} or "
            f"more query blocks and fewer than {PER_TILE_MIN_KEY_BLOCKS} key blocks), but this node's tiles "
            f"run as {walk}: remove debug_tile_visits",
        )
    return SdpaFwdVariant(
        ctx.slot(node.q).dtype,
        node.head_dim,
        node.mask.flags,
        node.lse is not None,
        out_dtype=ctx.slot(node.o).dtype if node.fp8 else "",
        varlen=node.form != "dense",
        walk=config.walk,
        count_visits=config.walk == "dynamic" and node.debug_tile_visits,
        v_layout=config.v_layout,
        o_float32=node.o_accumulation == "float32",
        three_consumers=config.three_consumers,
        sinks=node.sinks is not None,
        head_dim_v=node.value_dim_apart,
    )


def _check_supported(node: Sdpa, config: ForwardConfig, ctx: ResolveContext) -> None:
    q = ctx.tensor(node.q)
    # the 16-bit kernel takes 96 too; the e4m3 one (and vt_pack's re-lay) 64, 128 and 256
    head_dims, where = (E4M3_HEAD_DIMS, "with e4m3 q, k and v") if node.fp8 else (HEAD_DIMS, "")
    # a pair of head dims (v's apart from q's: validated against HEAD_DIM_PAIRS) is built at 16 bits
    apart = check_value_dim(node, where, ctx)
    supported = apart and not node.fp8
    if not supported:
        check_head_dim(node.head_dim, f"{q.path}.dims[{len(q.dims) - 1}]", ctx, head_dims, where)
        supported = node.head_dim in head_dims and not apart
    letters = _letters(node.form)
    layouts = '"thd"' if node.form == "packed" else '"bshd" or "bhsd"'
    # e4m3 V is read keys innermost: given so (dense, padded), or re-laid by the plan (packed; dense
    # and padded V given with d innermost): vt_pack
    relaid = config.v_source == "relaid"
    v_transposed = node.fp8 and node.form != "packed" and not relaid
    for name in (node.q, node.k, node.o) if v_transposed else (node.q, node.k, node.v, node.o):
        check_row_layout(ctx.tensor(name), letters, layouts, ctx)
    for name in (node.q, node.k) if v_transposed else (node.q, node.k, node.v):
        check_tma_strides(ctx.tensor(name), letters, tuple(range(len(letters) - 1)), ctx)
    if v_transposed:
        _check_keys_innermost(ctx.tensor(node.v), ctx)
    for role in DESCALE_ROLES:
        t = ctx.tensor(name) if (name := getattr(node, role)) is not None else None
        if t is not None and t.dims[0] > 1 and t.strides[0] != 1:
            ctx.problem(f"{t.path}.strides[0]", f"stride {t.strides[0]}: {role} must be contiguous (stride 1)")
    for name in (node.q_lengths, node.kv_lengths):
        if name is not None:
            t = ctx.tensor(name)
            if t.dims[0] > 1 and t.strides[0] != 1:
                ctx.problem(
                    f"{t.path}.strides[0]", f"stride {t.strides[0]}: length tensors must be contiguous (stride 1)"
                )
    what = "row" if node.form == "dense" else "capacity"
    for value, label, t, i in (
        (node.seq_q, "query length", q, len(q.dims) - 2),
        (node.seq_kv, "key length", ctx.tensor(node.k), len(q.dims) - 2),
    ):
        if node.form != "packed" and value > INT32_MAX:
            ctx.problem(
                f"{t.path}.dims[{i}]", f"{label} {what} {value} does not fit the kernel's int32; at most {INT32_MAX}"
            )
    if node.form == "packed":
        for t in (q, ctx.tensor(node.k)):
            if t.dims[0] > INT32_MAX:
                ctx.problem(
                    f"{t.path}.dims[0]", f"{t.dims[0]} tokens do not fit the kernel's int32; at most {INT32_MAX}"
                )
        if node.fp8 and packed_pitch(node.tokens_kv, node.batch) > INT32_MAX:
            k = ctx.tensor(node.k)
            ctx.problem(
                f"{k.path}.dims[0]",
                f"{node.tokens_kv} tokens of {node.batch} sequences, re-laid from 16-key boundaries, do not fit the "
                f"kernel's int32 key index; at most {INT32_MAX - 16 * node.batch - 16} tokens",
            )
    if node.form == "padded":
        _check_padded_rows(node, ctx)
    if relaid:
        _check_relaid(node, ctx)
    if supported:
        tiles = config.tiles
        count = tile_capacity(node, tiles.block_m)
        if count > MAX_GRID[0]:  # the attention launch's grid x
            ctx.problem(
                f"{q.path}.dims",
                f"{count} tiles of {tiles.block_m} query rows per head: a launch holds at most {MAX_GRID[0]}; "
                "split the work into several plans",
            )


def _check_relaid(node: Sdpa, ctx: ResolveContext) -> None:
    """Re-laid Vᵀ: one CTA row of the transpose per sequence (grid z), and a padded form's key
    coordinates (sequence b from b · hkv · d · pitch) within int32."""
    v = ctx.tensor(node.v)
    if node.batch > MAX_GRID[2]:
        ctx.problem(f"{v.path}.dims[0]", f"batch {node.batch}: re-laying V takes one launch row per sequence, at most "
                    f"{MAX_GRID[2]}; give V keys innermost (\"bhds\") or split the batch")  # fmt: skip
    rows = _relaid_strides(node)[0]
    if node.form == "padded" and (node.batch - 1) * rows + node.seq_kv > INT32_MAX:
        ctx.problem(f"{v.path}.dims", f"{node.batch} sequences of V re-laid as Vᵀ ({rows} keys each) do not fit int32 "
                    'key coordinates; give V keys innermost ("bhds") or split the batch')  # fmt: skip


def _check_keys_innermost(v, ctx: ResolveContext) -> None:
    """e4m3 V (b, h, s, d) given as Vᵀ is read as it is, its keys innermost: s stride 1, and its
    b, h and d strides whole 16-byte pieces under TMA's stride limit (so every sequence of a
    padded V starts on a 16-byte boundary, as TMA's innermost coordinate must). (V with d
    innermost is re-laid by the plan: `choose_forward`.)"""
    if v.dims[2] > 1 and v.strides[2] != 1:
        ctx.problem(
            f"{v.path}.strides[2]",
            f"e4m3 V is read with its keys innermost (8-bit WGMMA operands are K-major): give V either with d "
            f'innermost (d stride 1, as q and k: the plan re-lays it) or with its s stride 1 (layout "bhds"); '
            f"found strides {list(v.strides)}",
        )
    check_whole_pieces(v, "bhsd", (0, 1, 3), "(16 bytes: TMA's rule for the strides of a tensor map)", ctx)
    check_tma_strides(v, "bhsd", (0, 1, 3), ctx)


def _letters(form: str) -> str:
    """The logical dims of q, k, v and o in the node's form."""
    return "thd" if form == "packed" else "bhsd"


def _check_padded_rows(node: Sdpa, ctx: ResolveContext) -> None:
    """Padded sequences are loaded as ragged rows: sequence b starts at row b * (batch stride /
    row stride), which must be a whole row, and every row index must fit int32."""
    for name in (node.q, node.k, node.v):
        t = ctx.tensor(name)
        sb, ss = t.strides[0], t.strides[2]
        if t.dims[0] > 1 and (ss == 0 or sb % ss):
            ctx.problem(
                f"{t.path}.strides[0]",
                f"batch stride {sb} is not a multiple of the sequence stride {ss}; padded variable-length "
                'tensors need whole rows between sequences: use a layout with b outside s, such as "bshd" or "bhsd"',
            )
        elif ss and (t.dims[0] - 1) * (sb // ss) + t.dims[2] > INT32_MAX:
            ctx.problem(f"{t.path}.dims", f"{t.dims[0]} sequences of {t.dims[2]} rows do not fit int32 row indices")


def _attention_launch(node: Sdpa, variant: SdpaFwdVariant, ctx: ResolveContext, workspace) -> ResolvedLaunch:
    slots = {role: ctx.slot(name) for role, name in (node.inputs + node.outputs)}
    varlen = node.form != "dense"
    strides = {role: form_strides(slots.get(role), node.form) for role in ("q", "k", "v", "o", "lse")}
    relaid = "v_relaid" in workspace  # V's map addresses the re-laid Vᵀ in the workspace, not V's slot
    if relaid:
        strides["v"] = _relaid_strides(node)
    rows_per_batch = {
        role: strides[role][0] // strides[role][2] if node.form == "padded" else 0 for role in ("q", "k", "v")
    }
    mask = node.mask
    softmax = softmax_scales(node)
    shape = ForwardShape(
        batch=node.batch, heads_q=node.heads_q, seq_q=node.seq_q, seq_kv=node.seq_kv,
        group=node.heads_q // node.heads_kv, window_left=mask.window_left or 0, window_right=mask.window_right or 0,
        q_rows=rows_per_batch["q"], k_rows=rows_per_batch["k"], v_rows=rows_per_batch["v"],
    )  # fmt: skip
    q_extents = node.heads_q if varlen else (node.seq_q, node.heads_q, node.batch)
    kv_extents = node.heads_kv if varlen else (node.seq_kv, node.heads_kv, node.batch)
    tma = {role: map_strides(slots[role], strides[role]) for role in ("q", "k", "v")}
    v_base = Workspace(workspace["v_relaid"]) if relaid else slots["v"]
    if relaid:  # (b, h, d) strides of Vᵀ (b, h, d, pitch)
        tma["v"] = (*tma["v"][:2], tma_stride(node.head_dim, relaid_pitch(node.seq_kv), "e4m3"))
    elif variant.v_layout == "packed":  # the re-laid Vᵀ (h, d, pitch) in the workspace: (b, h, d) strides
        pitch = packed_pitch(node.tokens_kv, node.batch)
        tma["v"] = (0, node.head_dim * pitch, pitch)
    elif variant.fp8:  # V's keys are innermost: its tensor map steps over (b, h, d)
        v = slots["v"]
        tma["v"] = (*tma["v"][:2], tma_stride(v.dims[-1], v.strides[-1], v.dtype))
    descales = v_maps = None
    if node.fp8:  # per tensor (stride 0) or per head (1); each sequence's Vᵀ map (variable lengths)
        q_descale, k_descale, v_descale = (slots[role] for role in DESCALE_ROLES)
        strides_of = (1 if s.dims[0] > 1 else 0 for s in (q_descale, k_descale, v_descale))
        descales = Descales(q_descale, k_descale, v_descale, *strides_of)
        v_maps = Workspace(workspace["v_maps"]) if "v_maps" in workspace else None
    b_stride = {role: 0 if node.form == "packed" else strides[role][0] for role in ("o", "lse")}
    args = SdpaForwardArgs(
        q=TmaSource(slots["q"], tma["q"], q_extents),
        k=TmaSource(slots["k"], tma["k"], kv_extents),
        v=TmaSource(v_base, tma["v"], kv_extents),
        outputs=Outputs(slots["o"], slots.get("lse")),
        workspace=TileWorkspace(
            *(_region(workspace, name) for name in ("sequences", "tiles", "tile_count", "tile_counter"))
        ),
        shape=shape,
        o_strides=BhsStrides(b_stride["o"], *strides["o"][1:]),
        lse_strides=BhsStrides(b_stride["lse"], *strides["lse"][1:]),
        softmax=softmax,
        descales=descales,
        v_maps=v_maps,
        paged=None,
        sinks=slots.get("sinks"),
        scales=None,  # an e4m3 cache's: the mixed form's chunks only (sdpa_mixed.py)
        scale_strides=None,
    )
    grid = (tile_capacity(node, variant.tile_shape.block_m), 1, 1)
    return launch(node.name, variant, grid, args)


def softmax_scales(node: Sdpa) -> SoftmaxScales:
    """The forward kernel's softmax scales: with a softcap, s -> softcap * tanh(s / softcap) is
    tanh(raw * scale / cap) (score_scale), then * cap (in the exponent's scale)."""
    if node.mask.softcap is not None:
        return SoftmaxScales(scale_log2=node.mask.softcap * LOG2_E, score_scale=node.attn_scale / node.mask.softcap)
    return SoftmaxScales(scale_log2=node.attn_scale * LOG2_E, score_scale=0.0)


def _region(workspace: dict[str, int], name: str) -> Workspace | None:
    """A workspace region the op carved for `name`, or None (a null pointer) where it has none."""
    return Workspace(workspace[name]) if name in workspace else None


def _schedule_launch(
    node: Sdpa, attention_variant: SdpaFwdVariant, units: int, workspace: dict[str, int], attention: ResolvedLaunch,
    ctx: ResolveContext,
) -> ResolvedLaunch:  # fmt: skip
    """The scheduling kernel's launch; an e4m3 node's also writes the sequences' Vᵀ maps, from
    the attention launch's V map (its record: the same host code, so the same bytes)."""
    tiles = attention_variant.tile_shape
    variant = ScheduleVariant(
        packed=node.form == "packed",
        q_lengths=node.q_lengths is not None,
        kv_lengths=node.kv_lengths is not None,
        mask=MaskFlags(node.mask.flags.right, node.mask.flags.left, node.mask.flags.bottom_right),
        block_m=tiles.block_m,
        block_n=tiles.block_n,
        v_maps_of=attention_variant if node.fp8 else None,
    )
    packed = node.form == "packed"
    maps = None
    if node.fp8:
        record = attention.record
        maps = VMaps(
            v=record.v, v_maps=Workspace(workspace["v_maps"]), v_rows=record.shape.v_rows,
            v_packed=_region(workspace, "v_packed"), attention=record,
        )  # fmt: skip
    lengths = (ctx.slot(name) if name is not None else None for name in (node.q_lengths, node.kv_lengths))
    args = ScheduleArgs(
        *lengths, Workspace(workspace["sequences"]), Workspace(workspace["tiles"]), Workspace(workspace["tile_count"]),
        batch=node.batch,
        q_capacity=node.tokens_q if packed else node.seq_q,
        kv_capacity=node.tokens_kv if packed else node.seq_kv,
        max_seqlen_q=node.seq_q,
        max_seqlen_kv=node.seq_kv,
        unit_capacity=units,
        heads_q=node.heads_q,
        window_left=node.mask.window_left or 0,
        window_right=node.mask.window_right or 0,
        maps=maps,
        decode_tokens=None,
    )  # fmt: skip
    return launch(node.name, variant, (1, 1, 1), args)


def _pack_launch(
    node: Sdpa, attention: SdpaFwdVariant, workspace: dict[str, int], ctx: ResolveContext
) -> ResolvedLaunch:
    """e4m3 packed: V (t, h, d) transposed into the workspace, sequence b's keys from a 16-key
    boundary (after the scheduling kernel, whose table it reads)."""
    variant = VtPackVariant(node.head_dim, p_order=attention.v_in_p_order)
    v = ctx.slot(node.v)
    pitch = packed_pitch(node.tokens_kv, node.batch)
    packed = PackedV(node.batch, node.tokens_kv, stride_t=v.strides[0], stride_h=v.strides[1])
    regions = (Workspace(workspace["sequences"]), Workspace(workspace["v_packed"]))
    args = VtPackArgs(v, *regions, packed=packed, batched=None, pitch=pitch)
    return launch(node.name, variant, variant.grid(pitch, node.heads_kv), args)


def form_strides(slot, form: str) -> tuple[int, int, int]:
    """(b, h, s) element strides of q, k, v, o or lse; packed tensors have no b (0); an absent
    tensor has zeros."""
    if slot is None:
        return (0, 0, 0)
    if form == "packed":  # (t, h, d) or (t, h)
        return (0, slot.strides[1], slot.strides[0])
    return (slot.strides[0], slot.strides[1], slot.strides[2])


def map_strides(slot, strides: tuple[int, int, int]) -> tuple[int, int, int]:
    """(b, h, s) strides TMA accepts; a packed tensor's absent b has extent 0 (never stepped)."""
    extents = (0, slot.dims[1], slot.dims[0]) if len(slot.dims) == 3 else slot.dims[:3]
    return tuple(tma_stride(extent, st, slot.dtype) for extent, st in zip(extents, strides))
