"""q and k at head dim 192 with v and o at 128 (DeepSeek-V2/V3/R1's prefill, issue 44) on the CPU:
the description takes exactly the pairs of HEAD_DIM_PAIRS (others refused at v's dims), the node
records both head dims and scales by 1/sqrt(192); the 16-bit forward kernel's dense, padded and
packed forms resolve to its tiles (128 rows, 128-key blocks, 2 stages, O through each consumer's
part of Q's buffer), every other form refuses the pair by field path; the O store writes every
column of a 64 x 128 tile once, and every GPU case of tests/gpu/cases.py's `head_dim_192_cases`
builds. The results against float64 are tests/gpu/test_sdpa.py's."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from frost_runtime.schema import decode_plan

from frostc import GraphBuilder
from frostc.build import build
from frostc.errors import DescriptionError
from frostc.kernels.sdpa_common import MaskFlags
from frostc.kernels.sdpa_fwd_wgmma import (
    HEAD_DIM_PAIRS,
    SdpaForwardWgmma,
    SdpaFwdVariant,
    WgmmaTiles,
    tiles_for_head_dim,
)
from frostc.resolve import resolve
from frostc.target import SM90A
from frostc.validate import validate
from tests.gpu.build_plans import description
from tests.gpu.cases import Case, head_dim_192_cases
from tests.test_head_dim_96 import _collect

D, DV = 192, 128
TILES = WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=2, o_buffer=False)


def case(*args, **kw) -> Case:
    return Case(*args, **kw, head_dim_v=DV)


def launches(c: Case):
    return resolve(validate(description(c))).launches


def problems(desc, stage: str = "resolve") -> dict[str, str]:
    with pytest.raises(DescriptionError) as e:
        graph = validate(desc)
        if stage == "resolve":
            resolve(graph)
    return {p.path: p.message for p in e.value.problems}


def dense(d: int = D, dv: int = DV, dtype: str = "bf16", lse: bool = False, **node):
    """A dense bshd node: q (1, 8, 300, d), k (1, 2, 300, d), v (1, 2, 300, dv), o (1, 8, 300, dv)."""
    g = GraphBuilder("d192")
    for name, heads, dims in (("q", 8, d), ("k", 2, d), ("v", 2, dv), ("o", 8, dv)):
        g.tensor(name, dtype=dtype, dims=(1, heads, 300, dims), layout="bshd")
    if lse:
        g.tensor("lse", dtype="fp32", dims=(1, 8, 300))
    g.sdpa(q="q", k="k", v="v", o="o", lse="lse" if lse else None, **node)
    return g.build()


# ------------------------------------------------------------------------------ the description


def test_the_pairs_are_one_table() -> None:
    assert HEAD_DIM_PAIRS == ((D, DV),)


@pytest.mark.parametrize(("d", "dv"), [(192, 64), (192, 256), (128, 64), (64, 128)])
def test_another_pair_is_refused_at_v_dims(d, dv) -> None:
    found = problems(dense(d, dv), stage="validate")
    assert list(found) == ["tensors.v.dims[3]"]
    message = found["tensors.v.dims[3]"]
    assert f"v head dim {dv} with q/k head dim {d} is not supported" in message
    assert "supported pairs (q/k, v): (192, 128)" in message


def test_o_takes_v_head_dim() -> None:
    g = GraphBuilder("d192")
    for name, heads, dims in (("q", 8, D), ("k", 2, D), ("v", 2, DV), ("o", 8, D)):
        g.tensor(name, dtype="bf16", dims=(1, heads, 300, dims), layout="bshd")
    g.sdpa(q="q", k="k", v="v", o="o")
    found = problems(g.build(), stage="validate")
    assert "head dim 192 does not match v's 128" in found["tensors.o.dims[3]"]


def test_head_dim_192_for_v_too_is_refused_at_q_dims_naming_the_pair() -> None:
    message = problems(dense(D, D))["tensors.q.dims[3]"]
    assert "head dim 192 is not supported" in message
    assert "only for q and k with v and o at 128" in message


def test_the_node_records_both_head_dims_and_scales_by_q_and_k() -> None:
    graph = validate(dense(lse=True))
    (node,) = graph.nodes
    assert (node.head_dim, node.head_dim_v, node.value_dim_apart) == (D, DV, DV)
    assert node.attn_scale == pytest.approx(1 / math.sqrt(D))
    (record,) = decode_plan(build(dense(lse=True))).nodes
    assert (record.sizes["head_dim"], record.sizes["head_dim_v"]) == (D, DV)
    assert record.constants["attn_scale"] == pytest.approx(1 / math.sqrt(D), rel=1e-6)


def test_one_head_dim_records_none_apart() -> None:
    (node,) = validate(dense(128, 128)).nodes
    assert (node.head_dim_v, node.value_dim_apart) == (128, 0)
    (launch,) = resolve(validate(dense(128, 128))).launches
    assert launch.variant.head_dim_v == 0 and ".d128." in launch.variant.name


# ------------------------------------------------------------------------------ tiles and launches


def test_the_tiles_stage_o_in_q_within_208_kib() -> None:
    assert tiles_for_head_dim(D, False, head_dim_v=DV) == tiles_for_head_dim(D, True, head_dim_v=DV) == TILES
    q = TILES.block_m * D * 2  # 48 KiB, O (64 x 128 per consumer) inside each consumer's 64 x 192
    stage = TILES.block_n * (D + DV) * 2  # 48 KiB K + 32 KiB V
    assert q + TILES.stages * stage == 208 * 1024
    assert q + TILES.stages * stage + TILES.block_m * DV * 2 > SM90A.smem_per_cta  # an own O buffer: no room


def test_a_dense_node_resolves_to_the_d192v128_variant() -> None:
    (attention,) = launches(case("bf16", 2, 8, 2, 1000, 1000, D, False, "bshd", True))
    variant = attention.variant
    assert variant.name == "sdpa_fwd_wgmma.bf16.d192v128.full.lse"
    assert (variant.head_dim, variant.head_dim_v, variant.value_dim) == (D, DV, DV)
    assert variant.tile_shape == TILES and variant.block == (384, 1, 1)
    assert attention.grid == (8 * 8 * 2, 1, 1)  # ceil(1000 / 128) query blocks, 8 heads, 2 sequences


@pytest.mark.parametrize(("seq", "walk"), [(1000, "paired"), (2000, "dynamic"), (8200, "per_tile")])
def test_causal_heads_take_the_walk_of_their_128_key_blocks(seq, walk) -> None:
    (attention,) = launches(case("fp16", 1, 8, 2, seq, seq, D, True, "bshd", False))
    assert attention.variant.name == f"sdpa_fwd_wgmma.fp16.d192v128.causal.{walk}"


def test_masks_sinks_and_lse_name_their_variant() -> None:
    c = case("fp16", 1, 8, 2, 300, 900, D, True, "bshd", True, "dense", "bottom_right", 200, None, 50.0, sinks=True)
    (attention,) = launches(c)
    assert attention.variant.name == "sdpa_fwd_wgmma.fp16.d192v128.local_br.softcap.sinks.lse"


@pytest.mark.parametrize("form", ["padded", "packed"])
def test_variable_lengths_schedule_128_row_units(form) -> None:
    extra = dict(tokens_q=3001, tokens_kv=2800) if form == "packed" else {}
    c = case("bf16", 5, 16, 4, 1100, 1000, D, True, "thd" if form == "packed" else "bshd", True, form, **extra)
    schedule, attention = launches(c)
    assert (schedule.variant.block_m, schedule.variant.block_n) == (128, 128)
    assert attention.variant.name == "sdpa_fwd_wgmma.bf16.d192v128.causal.varlen.lse"


# ------------------------------------------------------------------------------ what refuses the pair


def _refused_at_v(found: dict[str, str], path: str, words: str) -> None:
    assert path in found, found
    assert f"v head dim {DV} with q/k head dim {D} is not supported {words}" in found[path], found[path]


def _paged(mixed: bool):
    g = GraphBuilder("d192-cache")
    rows = (12, 8) if mixed else (2, 8, 1)  # mixed: (tokens, heads); paged: (b, heads, new tokens)
    for name, dims in (("q", D), ("o", DV)):
        g.tensor(name, dtype="bf16", dims=(*rows, dims) if mixed else (2, 8, 1, dims))
    g.tensor("k", dtype="bf16", dims=(64, 16, 2, D))
    g.tensor("v", dtype="bf16", dims=(64, 16, 2, DV))
    g.tensor("page_table", dtype="int32", dims=(2, 8))
    g.tensor("cache_len", dtype="int32", dims=(2,))
    keys = dict(q="q", k="k", v="v", o="o", page_table="page_table", seq_len_kv="cache_len", causal=True)
    if mixed:
        g.tensor("cu_q", dtype="int32", dims=(3,))
        keys["cu_seqlens_q"] = "cu_q"
    g.sdpa(**keys)
    return g.build()


def test_the_paged_form_refuses_the_pair_at_v_dims() -> None:
    _refused_at_v(problems(_paged(mixed=False)), "tensors.v.dims[3]", "in the paged form")


def test_the_mixed_form_refuses_the_pair_at_v_dims() -> None:
    _refused_at_v(problems(_paged(mixed=True)), "tensors.v.dims[3]", "in the mixed form")


def test_kv_append_refuses_v_rows_of_another_head_dim() -> None:
    g = GraphBuilder("d192-append")
    g.tensor("k_new", dtype="bf16", dims=(2, 2, 1, D))
    g.tensor("v_new", dtype="bf16", dims=(2, 2, 1, DV))
    g.tensor("k_cache", dtype="bf16", dims=(64, 16, 2, D))
    g.tensor("v_cache", dtype="bf16", dims=(64, 16, 2, DV))
    g.tensor("page_table", dtype="int32", dims=(2, 8))
    g.tensor("cache_len", dtype="int32", dims=(2,))
    g.node("kv_append", k="k_new", v="v_new", k_cache="k_cache", v_cache="v_cache", page_table="page_table",
                seq_len_kv="cache_len")  # fmt: skip
    found = problems(g.build(), stage="validate")
    assert "head dim 128 does not match k's 192" in found["tensors.v_new.dims[3]"], found


def test_e4m3_attention_refuses_the_pair_at_v_dims() -> None:
    g = GraphBuilder("d192-fp8")
    for name, heads, dims in (("q", 8, D), ("k", 2, D), ("v", 2, DV)):
        g.tensor(name, dtype="e4m3", dims=(1, heads, 300, dims), layout="bshd")
    g.tensor("o", dtype="bf16", dims=(1, 8, 300, DV), layout="bshd")
    for name in ("q_descale", "k_descale", "v_descale"):
        g.tensor(name, dtype="fp32", dims=(1,))
    g.sdpa(q="q", k="k", v="v", o="o", q_descale="q_descale", k_descale="k_descale", v_descale="v_descale")
    _refused_at_v(problems(g.build()), "tensors.v.dims[3]", "with e4m3 q, k and v")


@pytest.mark.parametrize(
    "variant",
    [
        SdpaFwdVariant("bf16", 128, MaskFlags(), False, head_dim_v=64),
        SdpaFwdVariant("e4m3", D, MaskFlags(), False, out_dtype="bf16", head_dim_v=DV),
        SdpaFwdVariant(
            "bf16", D, MaskFlags(right=True, bottom_right=True), False, varlen=True, page_size=64, head_dim_v=DV
        ),  # fmt: skip
    ],
    ids=["pair", "e4m3", "paged"],
)
def test_the_kernel_refuses_a_pair_it_is_not_built_for(variant) -> None:
    with pytest.raises(ValueError):
        SdpaForwardWgmma(variant)


# ------------------------------------------------------------------------------ O through Q's buffer


def _kernel() -> SdpaForwardWgmma:
    return SdpaForwardWgmma(SdpaFwdVariant("bf16", D, MaskFlags(), False, head_dim_v=DV))


def test_each_consumer_stages_o_in_its_own_part_of_q() -> None:
    """O's (rows, d_v, consumer) view of Q's buffer: consumer c's 64 x 128 in [c, c + 1) · 64 · 192,
    in Q's swizzle (no consumer writes where another's Q is still read)."""
    import cutlass.cute as cute

    kernel = _kernel()
    found = {}

    @cute.jit
    def trace():
        sQ, _, _ = kernel._smem_layouts()
        sO = kernel._smem_layout_o()
        found["swizzles"] = (str(sQ.inner), str(sO.inner))
        found["q_cosize"] = cute.cosize(sQ.outer)
        found["one"] = cute.cosize(cute.select(sO.outer, mode=[0, 1]))
        found["o_shape"] = str(cute.select(sO.outer, mode=[2]))

    cute.compile(trace)
    q_part = 64 * D
    assert found["swizzles"][0] == found["swizzles"][1]
    assert found["q_cosize"] == 2 * q_part
    assert found["one"] == 64 * DV <= q_part
    assert found["o_shape"] == f"(2):({q_part})"  # consumer c from c · 64 · 192


def test_the_o_store_writes_every_column_once_in_16_byte_pieces() -> None:
    import cutlass.cute as cute

    kernel = _kernel()
    found: dict[int, list[tuple[int, int]]] = {}

    @cute.jit
    def trace():
        _collect(kernel._row_copy(), cute.make_identity_tensor((64, DV)), found)

    cute.compile(trace)
    counts = Counter(rc for elems in found.values() for rc in elems)
    assert sorted(found) == list(range(128))
    assert set(counts) == {(r, c) for r in range(64) for c in range(DV)}
    assert set(counts.values()) == {1}


# ------------------------------------------------------------------------------ the GPU cases build


@pytest.mark.parametrize("c", head_dim_192_cases(), ids=lambda c: c.id)
def test_each_gpu_case_builds(c) -> None:
    plan = decode_plan(build(description(c)))
    (forward,) = [k for k in plan.kernels if k.name.startswith("sdpa_fwd_wgmma")]
    assert ".d192v128." in forward.name and forward.cubin
    assert forward.tiles["block_m"] == forward.tiles["block_n"] == 128 and forward.tiles["o_buffer"] == 0
    assert forward.smem_bytes <= SM90A.smem_per_cta
