"""Stage 3: resolution of a validated graph into slots, uids, kernel variants and launch args,
and the kernel-support checks that decline a graph with the user's field paths. No compiles."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest

from frostc import DescriptionError, GraphBuilder, Problem, validate
from frostc.kernels.interface import F32, Ptr, TmaSource, TmaTensor, Variant, pointer, tma
from frostc.kernels.sdpa_common import LOG2_E, MaskFlags
from frostc.kernels.sdpa_fwd_wgmma import SdpaFwdVariant
from frostc.resolve import resolve
from frostc.resolved import Arg, ResolvedLaunch, ResolvedPlan, Slot, Workspace, bind


def graph_builder(
    *,
    d: int = 64,
    hq: int = 8,
    hkv: int = 2,
    b: int = 2,
    sq: int = 200,
    skv: int = 256,
    dtype: str = "bf16",
    lse: bool = True,
    causal: bool | None = True,
    attn_scale: float | None = None,
    uids: dict[str, int] | None = None,
    strides: dict[str, tuple[int, ...]] | None = None,
    layouts: dict[str, str] | None = None,
    **node_keys,
) -> GraphBuilder:
    """A valid GQA graph (q, k, v, o and optionally lse, declared in that order)."""
    uids = uids or {}
    strides = strides or {}
    layouts = layouts or {}
    g = GraphBuilder("toy")
    shapes = {"q": (b, hq, sq, d), "k": (b, hkv, skv, d), "v": (b, hkv, skv, d), "o": (b, hq, sq, d)}
    for name, dims in shapes.items():
        layout = None if name in strides else layouts.get(name, "bshd")
        g.tensor(name, dtype=dtype, dims=dims, layout=layout, strides=strides.get(name), uid=uids.get(name))
    if lse:
        g.tensor("lse", dtype="fp32", dims=(b, hq, sq), uid=uids.get("lse"))
    g.sdpa(q="q", k="k", v="v", o="o", lse="lse" if lse else None, causal=causal, attn_scale=attn_scale, name="attn",
           **node_keys)  # fmt: skip
    return g


def resolved(g: GraphBuilder) -> ResolvedPlan:
    return resolve(validate(g.build()))


def only_launch(plan: ResolvedPlan) -> ResolvedLaunch:
    (launch,) = plan.launches
    return launch


def arg_values(launch: ResolvedLaunch) -> dict[str, int | float]:
    """Constant args by parameter name (pointer args bound to a slot are left out)."""
    return {a.param: a.value for a in launch.args if a.slot < 0}


def declined(g: GraphBuilder) -> list[Problem]:
    graph = validate(g.build())  # the graph is valid: only the kernel support is lacking
    with pytest.raises(DescriptionError) as e:
        resolve(graph)
    return e.value.problems


# ---------------------------------------------------------------------------------------- uids


def test_given_uids_are_kept() -> None:
    plan = resolved(graph_builder(uids={"q": 10, "k": 20, "v": 30, "o": 40, "lse": 50}))
    assert {s.name: s.uid for s in plan.slots} == {"q": 10, "k": 20, "v": 30, "o": 40, "lse": 50}


def test_missing_uids_get_the_smallest_unused_positive_ints_in_declaration_order() -> None:
    plan = resolved(graph_builder(uids={"q": 2, "v": 1, "lse": 5}))
    assert {s.name: s.uid for s in plan.slots} == {"q": 2, "k": 3, "v": 1, "o": 4, "lse": 5}


def test_uids_follow_declaration_order_not_slot_order() -> None:
    g = GraphBuilder("toy")
    for name in ("o", "v", "k", "q"):  # declared backwards
        g.tensor(name, dtype="fp16", dims=(1, 4, 64, 64))
    g.sdpa(q="q", k="k", v="v", o="o")
    plan = resolved(g)
    assert [s.name for s in plan.slots] == ["q", "k", "v", "o"]
    assert [s.uid for s in plan.slots] == [4, 3, 2, 1]


def test_uid_assignment_is_deterministic() -> None:
    first = resolved(graph_builder(uids={"k": 1}))
    second = resolved(graph_builder(uids={"k": 1}))
    assert first == second
    assert [s.uid for s in first.slots] == [2, 1, 3, 4, 5]


# --------------------------------------------------------------------------------------- slots


def test_slot_order_is_q_k_v_o_lse() -> None:
    plan = resolved(graph_builder())
    assert [s.name for s in plan.slots] == ["q", "k", "v", "o", "lse"]
    assert [s.index for s in plan.slots] == [0, 1, 2, 3, 4]
    assert [s.is_output for s in plan.slots] == [False, False, False, True, True]


def test_slot_dims_and_strides_come_from_the_layout() -> None:
    plan = resolved(graph_builder(b=2, hq=8, hkv=2, sq=200, skv=256, d=64))
    by_name = {s.name: s for s in plan.slots}
    assert by_name["q"].dims == (2, 8, 200, 64)
    assert by_name["q"].strides == (200 * 8 * 64, 64, 8 * 64, 1)  # bshd
    assert by_name["k"].dims == (2, 2, 256, 64)
    assert by_name["k"].strides == (256 * 2 * 64, 64, 2 * 64, 1)
    assert by_name["lse"].dims == (2, 8, 200)
    assert by_name["lse"].strides == (8 * 200, 200, 1)  # contiguous bhs


def test_explicit_strides_are_kept_as_given() -> None:
    k_strides = (2 * 256 * 128, 256 * 128, 128, 1)  # rows padded to 128 elements
    plan = resolved(graph_builder(strides={"k": k_strides}))
    assert plan.slots[1].name == "k"
    assert plan.slots[1].strides == k_strides


@pytest.mark.parametrize(("dtype", "align"), [("bf16", 16), ("fp16", 16)])
def test_slot_alignment_is_16_bytes_for_half_types_and_4_for_fp32(dtype: str, align: int) -> None:
    plan = resolved(graph_builder(dtype=dtype))
    assert [(s.dtype, s.align) for s in plan.slots] == [(dtype, align)] * 4 + [("fp32", 4)]


def test_no_lse_means_four_slots() -> None:
    plan = resolved(graph_builder(lse=False))
    assert [s.name for s in plan.slots] == ["q", "k", "v", "o"]


# ------------------------------------------------------------------------------------ launches


def test_variant_holds_only_declaration_facts() -> None:
    plan = resolved(graph_builder(dtype="fp16", d=128, causal=None, lse=False))
    assert plan.variants == (SdpaFwdVariant("fp16", 128, MaskFlags(), False),)
    assert plan.variants[0].name == "sdpa_fwd_wgmma.fp16.d128.full"
    causal = resolved(graph_builder(d=64, causal=True, lse=True, sq=4096, skv=4096))
    assert causal.variants[0].name == "sdpa_fwd_wgmma.bf16.d64.causal.dynamic.lse"


@pytest.mark.parametrize(
    ("d", "sq", "skv", "walk"),
    [
        (128, 200, 256, "paired"),  # 2 query blocks
        (128, 1536, 1536, "paired"),  # 12: the last paired
        (128, 1537, 1537, "dynamic"),  # 13
        (128, 4096, 4096, "dynamic"),
        (128, 8192, 8192, "per_tile"),  # 64 key blocks
        (64, 2304, 2304, "paired"),  # 12 blocks of 192 rows
        (64, 4096, 4096, "dynamic"),
        (256, 4096, 4096, "per_tile"),  # 64 blocks of 64 keys
    ],
)
def test_causal_tile_walk_follows_the_measured_rules(d: int, sq: int, skv: int, walk: str) -> None:
    plan = resolved(graph_builder(d=d, sq=sq, skv=skv, causal=True))
    (variant,) = plan.variants
    assert variant.walk == walk
    assert variant.name.endswith(".lse") and f".{walk}" in variant.name
    # only the dynamic walk has a counter: one zeroed word of workspace, bound to tile_counter
    counters = [(r.name, r.bytes, r.zeroed) for r in plan.workspace]
    assert counters == ([("attn.tile_counter", 4, True)] if walk == "dynamic" else [])
    counter_arg = next(a for a in only_launch(plan).args if a.param == "tile_counter")
    assert counter_arg.workspace == (0 if walk == "dynamic" else -1)


def test_non_causal_and_masked_dense_plans_have_no_counter() -> None:
    for causal in (None, False):
        plan = resolved(graph_builder(sq=4096, skv=4096, causal=causal))
        assert plan.workspace == () and plan.variants[0].walk == "static"


def test_non_causal_plans_walk_neither_in_pairs_nor_per_tile() -> None:
    (variant,) = resolved(graph_builder(d=128, sq=200, skv=256, causal=None)).variants
    assert variant.walk == "static"


def test_args_follow_the_kernel_abi_in_order() -> None:
    launch = only_launch(resolved(graph_builder()))
    assert tuple((a.param, a.kind) for a in launch.args) == launch.variant.params


def test_pointer_args_are_bound_to_their_slots() -> None:
    launch = only_launch(resolved(graph_builder()))
    pointers = {a.param: a.slot for a in launch.args if a.kind in ("ptr", "tmap")}
    assert pointers == {"q.tmap": 0, "k.tmap": 1, "v.tmap": 2, "o": 3, "lse": 4, "sequences": -1, "tiles": -1,
                        "tile_count": -1, "tile_counter": -1}  # fmt: skip
    # a dense plan has no schedule: its pointers are null constants
    workspace_params = ("sequences", "tiles", "tile_count", "tile_counter")
    assert all(a.value == 0 and a.workspace == -1 for a in launch.args if a.param in workspace_params)


def test_gqa_group_and_sequence_lengths_in_the_args() -> None:
    values = arg_values(only_launch(resolved(graph_builder(hq=16, hkv=4, sq=300, skv=77))))
    assert values["group"] == 4
    assert values["seq_q"] == 300
    assert values["seq_kv"] == 77


def test_mqa_group_is_the_query_head_count() -> None:
    values = arg_values(only_launch(resolved(graph_builder(hq=8, hkv=1))))
    assert values["group"] == 8


def test_stride_args_are_the_slot_strides_of_b_h_s() -> None:
    plan = resolved(graph_builder(b=2, hq=8, hkv=2))
    launch = only_launch(plan)
    values = arg_values(launch)
    for slot in plan.slots:
        if slot.name in ("o", "lse"):
            got = tuple(values[f"{slot.name}.stride_{x}"] for x in "bhs")
            assert got == slot.strides[:3], slot.name
    # q's, k's and v's strides reach the tensor-map encoder through their sources
    loaded = {"q": launch.record.q, "k": launch.record.k, "v": launch.record.v}
    for slot in plan.slots:
        if slot.name in loaded:
            assert loaded[slot.name].base == slot and loaded[slot.name].strides == slot.strides[:3], slot.name


def test_strides_of_extent_one_dims_become_sixteen_bytes_for_tma() -> None:
    launch = only_launch(resolved(graph_builder(b=1, hq=8, hkv=1)))
    assert launch.record.k.strides[0] == 8  # K: batch of one
    assert launch.record.k.strides[1] == 8  # K: one head (MQA)


def test_extents_are_rows_heads_batch_of_each_loaded_tensor() -> None:
    values = arg_values(only_launch(resolved(graph_builder(b=3, hq=16, hkv=4, sq=300, skv=77))))
    assert values["q.extents"] == (300, 16, 3)
    assert values["k.extents"] == values["v.extents"] == (77, 4, 3)


def test_scale_log2_is_attn_scale_times_log2_e() -> None:
    values = arg_values(only_launch(resolved(graph_builder(attn_scale=0.1))))
    assert values["scale_log2"] == pytest.approx(0.1 * math.log2(math.e), rel=1e-15)
    assert values["scale_log2"] == 0.1 * LOG2_E


@pytest.mark.parametrize("d", [64, 128])
def test_default_attn_scale_is_one_over_sqrt_head_dim(d: int) -> None:
    values = arg_values(only_launch(resolved(graph_builder(d=d))))
    assert values["scale_log2"] == pytest.approx(math.log2(math.e) / math.sqrt(d), rel=1e-15)


def test_absent_lse_binds_a_null_pointer_and_zero_strides() -> None:
    launch = only_launch(resolved(graph_builder(lse=False)))
    (lse_ptr,) = [a for a in launch.args if a.param == "lse"]
    assert lse_ptr.kind == "ptr"
    assert lse_ptr.slot == -1
    assert lse_ptr.value == 0
    values = arg_values(launch)
    assert [values[f"lse.stride_{x}"] for x in "bhs"] == [0, 0, 0]


@pytest.mark.parametrize(
    ("sq", "hq", "b", "grid"),
    [(1, 1, 1, (1, 1, 1)), (128, 8, 2, (16, 1, 1)), (129, 8, 2, (32, 1, 1)), (1000, 16, 3, (384, 1, 1))],
)
def test_grid_is_query_tiles_by_heads_by_batch(sq: int, hq: int, b: int, grid: tuple[int, int, int]) -> None:
    """The grid counts tiles; the runtime starts at most one CTA per SM over them."""
    launch = only_launch(resolved(graph_builder(sq=sq, hq=hq, hkv=1, b=b, d=128)))
    assert launch.grid == grid
    assert launch.grid == (math.ceil(sq / 128) * hq * b, 1, 1)


def test_no_workspace_and_the_node_name_is_kept() -> None:
    plan = resolved(graph_builder())
    assert plan.workspace_bytes == 0
    assert plan.name == "toy"
    assert plan.target == "sm_90a"
    assert only_launch(plan).node == "attn"


# --------------------------------------------------------------------------- unsupported graphs


def test_head_dim_80_is_declined_at_q_dims() -> None:
    (problem,) = declined(graph_builder(d=80))
    assert problem.path == "tensors.q.dims[3]"
    assert "head dim 80 is not supported" in problem.message
    assert "64, 96, 128, 256" in problem.message


def test_head_dim_80_with_explicit_strides_is_declined_at_q_dims() -> None:
    # rows of 80 elements padded to 88: strides multiples of 8, the head dim innermost
    strides = {name: (8 * 64 * 88, 64 * 88, 88, 1) for name in ("q", "o")}
    strides |= {name: (2 * 64 * 88, 64 * 88, 88, 1) for name in ("k", "v")}
    (problem,) = declined(graph_builder(d=80, sq=64, skv=64, strides=strides))
    assert problem.path == "tensors.q.dims[3]"
    assert "head dim 80 is not supported" in problem.message


@pytest.mark.parametrize("name", ["q", "k", "v", "o"])
def test_head_dim_not_innermost_is_declined_at_its_stride(name: str) -> None:
    heads = 8 if name in ("q", "o") else 2
    seq = 200 if name in ("q", "o") else 256
    # d has stride 2: every other element; b/h/s strides stay multiples of 8
    strides = {name: (heads * seq * 128, seq * 128, 128, 2)}
    (problem,) = declined(graph_builder(strides=strides))
    assert problem.path == f"tensors.{name}.strides[3]"
    assert "innermost" in problem.message
    assert "stride 2" in problem.message


def test_head_dim_not_innermost_from_a_layout_is_declined() -> None:
    found = declined(graph_builder(layouts={"k": "bhds"}))  # d before s: s gets stride 1
    assert [p.path for p in found] == ["tensors.k.strides[3]", "tensors.k.strides[2]"]
    assert "found stride 256" in found[0].message


@pytest.mark.parametrize(
    ("index", "letter", "strides"),
    [
        (0, "b", (8 * 200 * 64 + 4, 200 * 64, 64, 1)),
        (1, "h", (8 * 200 * 68, 200 * 68 + 4, 64, 1)),
        (2, "s", (8 * 200 * 68, 200 * 68, 68, 1)),
    ],
)
def test_misaligned_b_h_s_stride_is_declined(index: int, letter: str, strides: tuple[int, ...]) -> None:
    found = declined(graph_builder(strides={"q": strides}))
    assert [p.path for p in found] == [f"tensors.q.strides[{index}]"]
    message = found[0].message
    assert f"stride {strides[index]} of dim {letter}" in message
    assert "multiple of 8" in message


def test_stride_of_an_extent_1_dim_is_not_checked() -> None:
    # b == 1 is never stepped along, so its stride may be anything
    plan = resolved(graph_builder(b=1, strides={"q": (3, 200 * 64, 8 * 64, 1)}))
    assert plan.slots[0].strides == (3, 200 * 64, 8 * 64, 1)


def test_stride_beyond_what_a_tensor_map_holds_is_declined() -> None:
    big = 1 << 39  # elements: 2**40 bytes
    found = declined(graph_builder(b=2, strides={"k": (big, 256 * 64, 64, 1)}))
    assert [p.path for p in found] == ["tensors.k.strides[0]"]
    assert "under 2**40 bytes" in found[0].message


def test_several_problems_are_reported_at_once() -> None:
    strides = {
        "k": (2 * 256 * 100, 256 * 100, 100, 1),  # s stride 100 is not a multiple of 8
        "v": (2 * 256 * 80 * 2, 256 * 80 * 2, 80 * 2, 2),  # d stride 2
    }
    found = declined(graph_builder(d=80, strides=strides))
    assert [p.path for p in found] == ["tensors.q.dims[3]", "tensors.k.strides[2]", "tensors.v.strides[3]"]
    assert "head dim 80" in found[0].message
    assert "stride 100 of dim s" in found[1].message
    assert "innermost" in found[2].message


def test_declined_error_message_lists_every_path() -> None:
    graph = validate(graph_builder(d=80, strides={"o": (8 * 200 * 100, 200 * 100, 100, 1)}).build())
    with pytest.raises(DescriptionError) as e:
        resolve(graph)
    text = str(e.value)
    assert "tensors.q.dims[3]: head dim 80" in text
    assert "tensors.o.strides[2]: stride 100" in text


def _with_visit_counts(sq: int, d: int = 128) -> GraphBuilder:
    return graph_builder(d=d, sq=sq, skv=sq, causal=True, debug_tile_visits=True)


def test_a_debug_build_counts_the_dynamic_walks_visits_in_the_workspace() -> None:
    """`debug_tile_visits`: one int32 per (tile, consumer) in a region of its own (not zeroed:
    the counts are the result), bound to the tile list's pointer, which a dense plan leaves
    unused; the counter is still there."""
    plan = resolved(_with_visit_counts(2000))
    (variant,) = plan.variants
    assert variant.walk == "dynamic" and variant.count_visits and variant.name.endswith(".dynamic.visits.lse")
    tiles = 16 * 8 * 2  # 16 query blocks x 8 heads x batch 2
    regions = {r.name: (r.offset, r.bytes, r.zeroed) for r in plan.workspace}
    assert regions["attn.tile_counter"][1:] == (4, True)
    assert regions["attn.tile_visits"][1:] == (4 * tiles * 2, False)  # two consumer warpgroups at d=128
    bound = {a.param: a.workspace for a in only_launch(plan).args if a.kind == "ptr"}
    assert bound["tiles"] == regions["attn.tile_visits"][0]
    assert bound["tile_counter"] == regions["attn.tile_counter"][0]


def test_a_debug_build_of_another_walk_is_refused_with_the_field_path() -> None:
    with pytest.raises(DescriptionError) as info:
        resolved(_with_visit_counts(700))  # 6 query blocks: the paired walk
    (problem,) = info.value.problems
    assert problem.path.endswith("debug_tile_visits")
    assert "pairs of tiles" in problem.message and "remove debug_tile_visits" in problem.message


def test_a_debug_build_of_a_variable_length_node_is_refused_at_validation() -> None:
    g = GraphBuilder("toy")
    for name, dims in {"q": (300, 8, 128), "k": (300, 2, 128), "v": (300, 2, 128), "o": (300, 8, 128)}.items():
        g.tensor(name, dtype="bf16", dims=dims)
    g.tensor("cu", dtype="int32", dims=(3,))
    g.sdpa(q="q", k="k", v="v", o="o", cu_seqlens_q="cu", cu_seqlens_kv="cu", causal=True, debug_tile_visits=True)
    with pytest.raises(DescriptionError) as info:
        validate(g.build())
    (problem,) = info.value.problems
    assert problem.path.endswith("debug_tile_visits") and "a packed node has no such walk" in problem.message


# ------------------------------------------------------------------------------ launch arguments


@dataclass(frozen=True)
class _ToyArgs:
    q: TmaTensor = tma(extents="i32")
    lse: Ptr = pointer("fp32", align=4)
    tiles: Ptr = pointer("int32", align=4)
    unused: Ptr = pointer()
    scale: F32


@dataclass(frozen=True)
class _Toy(Variant):
    ARGS: ClassVar[type] = _ToyArgs
    name: str = "toy"
    dtype: str = "bf16"


def test_bind_takes_slots_the_workspace_nulls_and_constants_in_the_kernels_order() -> None:
    q = Slot(3, "q", 1, "bf16", (1, 8), (8, 1), False, 16)
    record = _ToyArgs(TmaSource(q, (8, 8, 8), extents=8), lse=None, tiles=Workspace(512), unused=None, scale=0.5)
    assert bind(_Toy(), record) == (
        Arg("q.tmap", "tmap", slot=3),
        Arg("q.extents", "i32", value=8),
        Arg("lse", "ptr", value=0),  # an absent tensor: a null pointer the kernel never touches
        Arg("tiles", "ptr", workspace=512),
        Arg("unused", "ptr", value=0),
        Arg("scale", "f32", value=0.5),
    )


def test_bind_refuses_a_slot_whose_elements_are_not_the_kernels_width() -> None:
    """A tensor map encoded for 16-bit elements over an e4m3 buffer read boxes twice its bytes
    (the forward kernel over e4m3 pages, on the GPU); a same-width reinterpretation binds."""
    e4m3 = Slot(3, "k_cache", 1, "e4m3", (1, 8), (8, 1), False, 16)
    record = _ToyArgs(TmaSource(e4m3, (8, 8, 8), extents=8), lse=None, tiles=None, unused=None, scale=0.5)
    with pytest.raises(ValueError, match=r"toy: q.tmap takes bf16 elements, its slot 'k_cache' holds e4m3"):
        bind(_Toy(), record)
    fp16 = Slot(3, "q", 1, "fp16", (1, 8), (8, 1), False, 16)
    record = _ToyArgs(TmaSource(fp16, (8, 8, 8), extents=8), lse=None, tiles=None, unused=None, scale=0.5)
    assert bind(_Toy(), record)[0] == Arg("q.tmap", "tmap", slot=3)


def test_bind_names_a_constant_parameter_given_no_value() -> None:
    record = _ToyArgs(TmaSource(None, (8, 8, 8), extents=8), lse=None, tiles=None, unused=None, scale=None)
    with pytest.raises(ValueError, match=r"toy: parameter scale \(f32\) has no value"):
        bind(_Toy(), record)
