"""FP8 (e4m3) attention on the build machine: the description's checks (e4m3 q, k and v
together, their descales, O's dtype, the dense and padded forms, V's keys innermost), the variant
and arguments it resolves into (padded: the scheduling kernel's per-sequence Vᵀ maps),
real offline compiles and the ABI, and what inspect shows. Numerics are
tests/gpu/test_fp8_dense.py's and test_fp8_varlen.py's business."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from frost_runtime.schema import decode_plan

from frostc import GraphBuilder, validate
from frostc.build import build
from frostc.description import parse_description
from frostc.inspect import plan_summary
from frostc.kernels.sdpa_common import KEY_ORDER_PRMT, LOG2_E, MaskFlags
from frostc.kernels.sdpa_fwd_wgmma import SdpaFwdVariant, tiles_for_head_dim
from frostc.resolve import resolve
from tests.descriptions import check, edited, problems

B, HQ, HKV, S, D = 2, 8, 2, 200, 128
PITCH = 208  # Vᵀ's rows: S padded to 16 bytes


def fp8_node(descale_heads: tuple[int, int, int] = (HQ, HKV, 1)) -> dict[str, Any]:
    """e4m3 q and k "bshd", Vᵀ (keys innermost, rows of PITCH), bf16 O, descales."""

    def rows(heads, dtype="e4m3"):
        return {"dtype": dtype, "dims": [B, heads, S, D], "layout": "bshd"}

    v = {"dtype": "e4m3", "dims": [B, HKV, S, D], "strides": [HKV * D * PITCH, D * PITCH, 1, PITCH]}
    descales = {f"{r}_descale": {"dtype": "fp32", "dims": [n]} for r, n in zip("qkv", descale_heads)}
    return {
        "format": 1,
        "name": "fp8-dense",
        "tensors": {"q": rows(HQ), "k": rows(HKV), "v": v, "o": rows(HQ, "bf16"), **descales,
                    "lse": {"dtype": "fp32", "dims": [B, HQ, S]}},
        "nodes": [{"op": "sdpa", "q": "q", "k": "k", "v": "v", "o": "o", "lse": "lse", "causal": True,
                   "q_descale": "q_descale", "k_descale": "k_descale", "v_descale": "v_descale"}],
    }  # fmt: skip


def test_an_fp8_node_validates_with_its_descales():
    (node,) = check(fp8_node()).nodes
    assert (node.q_descale, node.k_descale, node.v_descale) == ("q_descale", "k_descale", "v_descale")
    assert [role for role, _ in node.inputs] == ["q", "k", "v", "q_descale", "k_descale", "v_descale"]


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"nodes.0.k_descale": None}, "nodes[0].k_descale", ("missing", "(hkv,) or (1,)", 'k_descale = "k_descale"')),
        ({"tensors.q_descale.dtype": "bf16"}, "tensors.q_descale.dtype", ("scale factor", "fp32")),
        ({"tensors.q_descale.dims": [3]}, "tensors.q_descale.dims", ("per q head (8)", "[8] or [1]")),
        ({"tensors.v_descale.dims": [HQ]}, "tensors.v_descale.dims", ("per kv head (2)",)),
        ({"tensors.k.dtype": "bf16"}, "tensors.k.dtype", ("does not match q's e4m3", 'dtype = "e4m3"')),
        ({"tensors.o.dtype": "e4m3"}, "tensors.o.dtype", ("bf16 or fp16",)),
        ({"tensors.lse.dtype": "bf16"}, "tensors.lse.dtype", ("fp32",)),
    ],
)  # fmt: skip
def test_bad_fp8_declarations_name_the_field_and_the_fix(changes, path, words):
    found = problems(edited(fp8_node(), **changes))
    assert path in [p.path for p in found], found
    message = next(p.message for p in found if p.path == path)
    for word in words:
        assert word in message, message


def test_descales_are_refused_without_e4m3_inputs():
    d = fp8_node()
    for name in ("q", "k", "v"):
        d = edited(d, **{f"tensors.{name}.dtype": "bf16"})
    d = edited(d, **{"tensors.v.strides": None, "tensors.v.layout": "bshd"})
    found = problems(d)
    assert sorted(p.path for p in found) == [f"nodes[0].{r}_descale" for r in "kqv"]
    assert all("remove" in p.message and "not e4m3" in p.message for p in found)


PACKED_TOKENS = 250  # re-laid, 310 keys: a grid over the tokens would miss the last 128


def packed_fp8_node() -> dict[str, Any]:
    """Three packed sequences of e4m3 q, k and v (t, h, d) (V as a projection writes it: the plan
    re-lays it), bf16 O, per-tensor descales."""
    t = PACKED_TOKENS
    return {
        "format": 1, "name": "packed-fp8",
        "tensors": {"q": {"dtype": "e4m3", "dims": [t, HQ, D]}, "k": {"dtype": "e4m3", "dims": [t, HKV, D]},
                    "v": {"dtype": "e4m3", "dims": [t, HKV, D]}, "o": {"dtype": "bf16", "dims": [t, HQ, D]},
                    "cu": {"dtype": "int32", "dims": [4]},
                    **{f"{r}_descale": {"dtype": "fp32", "dims": [1]} for r in "qkv"}},
        "nodes": [{"op": "sdpa", "q": "q", "k": "k", "v": "v", "o": "o", "cu_seqlens_q": "cu", "cu_seqlens_kv": "cu",
                   "max_seqlen_q": 200, "max_seqlen_kv": 200, "causal": True,
                   "q_descale": "q_descale", "k_descale": "k_descale", "v_descale": "v_descale"}],
    }  # fmt: skip


def test_a_packed_fp8_plan_re_lays_v_before_the_attention():
    """Three launches: the scheduling kernel (the sequences' Vᵀ maps, over the workspace's
    re-laid Vᵀ), vt_pack (V transposed into the workspace, each sequence from a 16-key boundary)
    and the attention kernel, whose V map steps over that region's rows."""
    plan = decode_plan(build(parse_description(json.dumps(packed_fp8_node()), fmt="json")))
    names = [plan.kernels[launch.kernel].name for launch in plan.launches]
    assert names[0].startswith("sdpa_schedule.packed.") and names[0].endswith(".v_maps.p_order")
    assert names[1] == "vt_pack.e4m3.d128.p_order"  # V's keys in P's order, zeros between sequences
    assert names[2].startswith("sdpa_fwd_wgmma.e4m3.o_bf16.d128.causal.varlen") and ".vpack.v_p_order" in names[2]
    sched, pack, attn = (_launch_values(plan, i) for i in range(3))
    regions = {r.name.split(".")[-1]: r for r in plan.workspace}
    pitch = -(-(PACKED_TOKENS + 15 * 3 + 15) // 128) * 128  # every sequence ends by then, whole lines
    assert pack["pitch"].value == pitch and regions["v_packed"].bytes == HKV * D * pitch
    assert sched["v_packed"].workspace == pack["v_packed"].workspace == regions["v_packed"].offset
    assert pack["sequences"].workspace == regions["sequences"].offset  # the schedule's table
    assert (pack["v.stride_t"].value, pack["v.stride_h"].value) == (HKV * D, D)
    assert plan.launches[1].grid == (-(-pitch // 128), HKV, 1)  # 128 destination keys of a head a CTA
    assert plan.launches[1].grid[0] * 128 >= pitch > -(-PACKED_TOKENS // 128) * 128
    assert sched["v.tmap"].tmap == attn["v.tmap"].tmap


def test_packed_fp8_v_needs_whole_16_byte_rows():
    d = edited(packed_fp8_node(), **{"tensors.v.strides": [HKV * D + 8, D + 8, 1]})
    with pytest.raises(Exception) as e:
        resolve(check(d))
    assert any(p.path.startswith("tensors.v.strides") for p in e.value.problems)


def _launch_values(plan, index: int) -> dict:
    launch = plan.launches[index]
    params = plan.kernels[launch.kernel].params
    return {p.name: a for p, a in zip(params, launch.args)}


def _padded_fp8_node() -> dict[str, Any]:
    return edited(fp8_node(), **{"tensors.seq_len_kv": {"dtype": "int32", "dims": [B]},
                                 "nodes.0.seq_len_kv": "seq_len_kv"})  # fmt: skip


def test_a_padded_fp8_plan_writes_each_sequence_v_map_before_the_attention():
    """The scheduling kernel takes the attention launch's own Vᵀ map (the same 128 bytes, its
    address patched per call from V's slot) and a workspace region of one map per sequence,
    which the attention kernel reads through `v_maps`."""
    plan = decode_plan(build(parse_description(json.dumps(_padded_fp8_node()), fmt="json")))
    schedule, attention = (plan.kernels[launch.kernel] for launch in plan.launches)
    assert schedule.name.startswith("sdpa_schedule.padded.kv.") and schedule.name.endswith(".v_maps")
    assert attention.name.startswith("sdpa_fwd_wgmma.e4m3.o_bf16.d128.causal.varlen")
    sched, attn = _launch_values(plan, 0), _launch_values(plan, 1)
    v_slot = next(i for i, s in enumerate(plan.slots) if s.name == "v")
    assert sched["v.tmap"].slot == attn["v.tmap"].slot == v_slot
    assert sched["v.tmap"].tmap == attn["v.tmap"].tmap
    assert sched["v_maps"].workspace == attn["v_maps"].workspace >= 0
    region = next(r for r in plan.workspace if r.name.endswith(".v_maps"))
    assert (region.offset, region.bytes) == (attn["v_maps"].workspace, 128 * B)
    assert region.offset % 128 == 0 and not region.zeroed  # rewritten at every execute


def test_a_padded_fp8_plan_starts_each_sequence_v_map_at_its_batch_row():
    """Padded Vᵀ (b, h, d, pitch): sequence b's keys start b * (batch stride) elements in, a
    whole number of 16-byte pieces (TMA's innermost coordinates must be)."""
    plan = decode_plan(build(parse_description(json.dumps(_padded_fp8_node()), fmt="json")))
    assert [plan.kernels[launch.kernel].name.split(".")[0] for launch in plan.launches] == [
        "sdpa_schedule", "sdpa_fwd_wgmma"
    ]  # fmt: skip
    sched, attn = _launch_values(plan, 0), _launch_values(plan, 1)
    assert sched["v.rows_per_batch"].value == attn["v.rows_per_batch"].value == HKV * D * PITCH


@pytest.mark.parametrize(
    ("v_changes", "path", "words"),
    [
        ({"tensors.v.strides": [2 * HKV * S * D, 2 * S * D, 2 * D, 2]}, "tensors.v.strides[2]",
         ("keys innermost", "d innermost", '"bhds"')),
        ({"tensors.v.strides": [HKV * D * 200, D * 200, 1, 200]}, "tensors.v.strides[3]",
         ("multiple of 16 elements",)),
    ],
)  # fmt: skip
def test_v_must_have_its_keys_innermost_in_whole_16_byte_rows(v_changes, path, words):
    with pytest.raises(Exception) as e:
        resolve(check(edited(fp8_node(), **v_changes)))
    found = {p.path: p.message for p in e.value.problems}
    assert path in found, found
    for word in words:
        assert word in found[path], found[path]


def _rows_v(node: dict[str, Any], layout: str = "bshd") -> dict[str, Any]:
    """`node` with V given like q and k (d innermost): the plan re-lays it."""
    return edited(node, **{"tensors.v.strides": None, "tensors.v.layout": layout})


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_a_dense_fp8_plan_re_lays_v_given_with_d_innermost(layout):
    """vt_pack's batched variant writes Vᵀ (b, h, d, pitch) into the workspace, pitch = S rounded
    up to 128 keys; the attention's V map addresses that region (bound to the workspace, not to
    V's slot) and holds the bytes of a plan given that Vᵀ itself."""
    from frostc.kernels.vt_pack import relaid_pitch

    plan = decode_plan(build(parse_description(json.dumps(_rows_v(fp8_node(), layout)), fmt="json")))
    names = [plan.kernels[launch.kernel].name for launch in plan.launches]
    assert names[0] == "vt_pack.e4m3.d128.batched.p_order"  # V's keys in P's order, zeros past S
    assert names[1].startswith("sdpa_fwd_wgmma.e4m3.o_bf16.d128.causal") and ".v_p_order" in names[1]
    pack, attn = _launch_values(plan, 0), _launch_values(plan, 1)
    pitch = relaid_pitch(S)
    assert pitch % 128 == 0 and S <= pitch < S + 128
    region = next(r for r in plan.workspace if r.name.endswith(".v_relaid"))
    assert region.bytes == B * HKV * D * pitch and not region.zeroed
    assert pack["v_packed"].workspace == attn["v.tmap"].workspace == region.offset and attn["v.tmap"].slot < 0
    v_slot = next(i for i, s in enumerate(plan.slots) if s.name == "v")
    assert pack["v"].slot == v_slot and plan.slots[v_slot].strides[3] == 1
    stride_s, stride_h = plan.slots[v_slot].strides[2], plan.slots[v_slot].strides[1]
    assert (pack["v.stride_s"].value, pack["v.stride_h"].value, pack["pitch"].value) == (stride_s, stride_h, pitch)
    assert plan.launches[0].grid == (pitch // 128, HKV, B)
    # a plan given that Vᵀ itself maps S keys; the re-laid one whole 16-key groups (S = 200: 208)
    given = edited(fp8_node(), **{"tensors.v.strides": [HKV * D * pitch, D * pitch, 1, pitch]})
    twin = decode_plan(build(parse_description(json.dumps(given), fmt="json")))
    assert S % 16 and attn["v.tmap"].tmap != _launch_values(twin, 0)["v.tmap"].tmap
    # the batched variant finds its tokens without the packed one's table of sequence starts
    from frostc.kernels.vt_pack import SHARED_STARTS

    packed = decode_plan(build(parse_description(json.dumps(packed_fp8_node()), fmt="json")))
    packed_smem = next(k.smem_bytes for k in packed.kernels if k.name.startswith("vt_pack"))
    batched_smem = plan.kernels[plan.launches[0].kernel].smem_bytes
    assert packed_smem - batched_smem >= 4 * SHARED_STARTS - 32  # the table's bytes, less alignment


def test_a_padded_fp8_plan_re_lays_v_given_with_d_innermost():
    """Padded: scheduling, vt_pack (batched), attention; the scheduling kernel's map template and
    the attention's V map both address the re-laid Vᵀ, each sequence a batch row of it."""
    from frostc.kernels.vt_pack import relaid_pitch

    plan = decode_plan(build(parse_description(json.dumps(_rows_v(_padded_fp8_node())), fmt="json")))
    names = [plan.kernels[launch.kernel].name.split(".")[0] for launch in plan.launches]
    assert names == ["sdpa_schedule", "vt_pack", "sdpa_fwd_wgmma"]
    sched, pack, attn = (_launch_values(plan, i) for i in range(3))
    region = next(r for r in plan.workspace if r.name.endswith(".v_relaid"))
    assert sched["v.tmap"].workspace == pack["v_packed"].workspace == attn["v.tmap"].workspace == region.offset
    assert sched["v.tmap"].tmap == attn["v.tmap"].tmap
    assert sched["v.rows_per_batch"].value == attn["v.rows_per_batch"].value == HKV * D * relaid_pitch(S)


def test_inspect_names_the_workspace_region_a_v_map_addresses():
    plan = decode_plan(build(parse_description(json.dumps(_rows_v(fp8_node())), fmt="json")))
    text = json.dumps(plan_summary(plan))
    assert "tensor map of workspace + 0 (sdpa0.v_relaid)" in text or ".v_relaid), sha256" in text


def _values(plan) -> dict:
    (launch,) = plan.launches
    names = [param.name for param in plan.kernels[launch.kernel].params]
    return {p: a.value if a.slot < 0 else ("slot", plan.slots[a.slot].name) for p, a in zip(names, launch.args)}


@pytest.mark.parametrize("heads", [(HQ, HKV, 1), (1, 1, 1)], ids=["per-head", "per-tensor"])
def test_the_plan_reads_the_descales_and_steps_over_v_by_d(heads):
    plan = decode_plan(build(parse_description(json.dumps(fp8_node(heads)), fmt="json")))
    (kernel,) = plan.kernels
    assert kernel.name.startswith("sdpa_fwd_wgmma.e4m3.o_bf16.d128.causal")
    values = _values(plan)
    assert values["scale_log2"] == pytest.approx(LOG2_E / math.sqrt(D))  # the descales join on the device
    strides = [1 if n > 1 else 0 for n in heads]
    assert [values[f"{r}_descale.stride"] for r in "qkv"] == strides
    assert [values[f"{r}_descale"] for r in "qkv"] == [("slot", f"{r}_descale") for r in "qkv"]
    slots = {s.name: s.dtype for s in plan.slots}
    assert (slots["q"], slots["v"], slots["o"], slots["q_descale"]) == ("e4m3", "e4m3", "bf16", "fp32")
    text = json.dumps(plan_summary(plan))
    for word in ("e4m3", "q_descale", "v_descale.stride"):
        assert word in text, word


def test_fp16_output_is_its_own_variant():
    plan = decode_plan(
        build(parse_description(json.dumps(edited(fp8_node(), **{"tensors.o.dtype": "fp16"})), fmt="json"))
    )
    assert ".e4m3.o_fp16.d128." in plan.kernels[0].name


def test_float32_o_accumulation_is_its_own_variant():
    """o_accumulation = "float32": the same launch and ABI, a kernel of its own (".o_f32")."""
    default = resolve(check(fp8_node()))
    chosen = resolve(check(edited(fp8_node(), **{"nodes.0.o_accumulation": "float32"})))
    (a,), (b,) = default.launches, chosen.launches
    assert not a.variant.o_float32 and b.variant.o_float32
    assert b.variant.name == a.variant.name.replace(".lse", ".o_f32.lse")
    assert a.variant.params == b.variant.params and a.args == b.args
    explicit = resolve(check(edited(fp8_node(), **{"nodes.0.o_accumulation": "tensor_cores"})))
    assert explicit.launches[0].variant == a.variant


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"nodes.0.o_accumulation": "fp32"}, ('unknown O accumulation "fp32"', '"tensor_cores", "float32"')),
        ({"nodes.0.o_accumulation": True}, ("expected a string",)),
        ({"tensors.q.dims": [B, HQ, S, 64], "tensors.k.dims": [B, HKV, S, 64], "tensors.v.dims": [B, HKV, S, 64],
          "tensors.o.dims": [B, HQ, S, 64], "nodes.0.o_accumulation": "float32"},
         ("built for head dim 128", "this node's is 64", '"tensor_cores"')),
    ],
)  # fmt: skip
def test_bad_o_accumulation_names_the_field_and_the_fix(changes, words):
    found = problems(edited(fp8_node(), **changes))
    message = next(p.message for p in found if p.path == "nodes[0].o_accumulation")
    for word in words:
        assert word in message, message


def test_o_accumulation_is_refused_for_16_bit_attention():
    d = fp8_node()
    for name in ("q", "k", "v"):
        d = edited(d, **{f"tensors.{name}.dtype": "bf16"})
    d = edited(d, **{"tensors.v.strides": None, "tensors.v.layout": "bshd", "nodes.0.o_accumulation": "float32"})
    d = edited(d, **{f"nodes.0.{r}_descale": None for r in "qkv"})
    (found,) = [p for p in problems(d) if p.path == "nodes[0].o_accumulation"]
    assert "16-bit" in found.message and "remove it" in found.message


def test_the_fp8_variants_add_the_descales_to_the_bf16_abi():
    plain = SdpaFwdVariant("bf16", 128, MaskFlags(), True)
    fp8 = SdpaFwdVariant("e4m3", 128, MaskFlags(), True, out_dtype="bf16")
    assert plain.name != fp8.name and fp8.fp8 and not plain.fp8
    assert fp8.params[: len(plain.params)] == plain.params
    assert fp8.params[len(plain.params) :] == (
        ("q_descale", "ptr"), ("k_descale", "ptr"), ("v_descale", "ptr"),
        ("q_descale.stride", "i32"), ("k_descale.stride", "i32"), ("v_descale.stride", "i32"),
        ("v_maps", "ptr"),
    )  # fmt: skip


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_fp8_tiles_fit_shared_memory_with_a_16_bit_o_buffer(head_dim):
    tiles = tiles_for_head_dim(head_dim, False, fp8=True)
    q = tiles.block_m * head_dim  # one byte each
    o = 2 * tiles.block_m * head_dim
    ring = tiles.stages * 2 * tiles.block_n * head_dim
    assert tiles.o_buffer and q + o + ring <= 227 * 1024


def test_three_consumer_tiles_fit_shared_memory_and_name_their_kernel():
    tiles = tiles_for_head_dim(128, False, fp8=True, three_consumers=True)
    assert (tiles.block_m, tiles.block_n, tiles.consumers) == (192, 96, 3)
    assert tiles.block_m * 128 * 3 + tiles.stages * 2 * tiles.block_n * 128 <= 227 * 1024  # Q, O, ring
    variant = SdpaFwdVariant("e4m3", 128, MaskFlags(right=True), True, out_dtype="bf16", three_consumers=True)
    assert variant.name.endswith(".m192.lse") and variant.block == (512, 1, 1)


def _dense_variant(batch, heads, seq_q, seq_kv, causal, dtype="e4m3", **node_keys) -> SdpaFwdVariant:
    """The attention kernel of a dense node with V given like q and k (re-laid by the plan)."""
    g = GraphBuilder("long")
    for name, rows in (("q", seq_q), ("k", seq_kv), ("v", seq_kv)):
        g.tensor(name, dtype=dtype, dims=(batch, heads, rows, 128), layout="bshd")
    g.tensor("o", dtype="bf16", dims=(batch, heads, seq_q, 128), layout="bshd")
    if dtype == "e4m3":
        for role in "qkv":
            g.tensor(f"{role}_descale", dtype="fp32", dims=(1,))
            node_keys[f"{role}_descale"] = f"{role}_descale"
    g.sdpa(q="q", k="k", v="v", o="o", causal=causal, **node_keys)
    return _attention_variant(resolve(validate(g.build())))


def _attention_variant(plan) -> SdpaFwdVariant:
    (variant,) = [launch.variant for launch in plan.launches if isinstance(launch.variant, SdpaFwdVariant)]
    return variant


@pytest.mark.parametrize(
    ("shape", "causal", "three"),
    [
        ((1, 16, 16384, 16384), False, True),  # 1376 tiles of 192 rows: 11 turns of 132 SMs, of 128 rows 16
        ((1, 16, 8192, 8192), False, False),  # 688: 6 turns (8.5 tiles of 128 rows' time) against 8
        ((1, 1, 17000, 8200), False, True),  # 89 tiles: one turn against two
        ((2, 16, 4096, 4096), False, False),  # rows of fewer than 8192 keys
        ((1, 16, 8192, 8192), True, True),  # causal tiles run one CTA each: any count balances
        ((1, 4, 700, 9001), True, True),
        ((2, 16, 4096, 4096), True, False),
    ],
)
def test_three_consumers_where_rows_are_long_and_the_tiles_fill_the_sms(shape, causal, three):
    """`frostc.ops.sdpa._three_consumers` (bench/NOTES.md, FP8 v12): +5-7 % a tile from 8k keys
    on, so taken there, except where 192-row tiles would leave more of the SMs' last turn empty
    than that gains (non-causal tiles all cost the same)."""
    variant = _dense_variant(*shape, causal)
    assert variant.three_consumers is three
    assert variant.tile_shape.block_m == (192 if three else 128)
    if causal and three:
        assert variant.walk == "per_tile"  # 8192 keys are 85 blocks of 96


@pytest.mark.parametrize(("changes", "dtype"), [({}, "bf16"), ({"window_left": 4096}, "e4m3")])
def test_three_consumers_only_for_e4m3_without_a_left_window(changes, dtype):
    assert not _dense_variant(1, 16, 16384, 16384, True, dtype, **changes).three_consumers


def test_o_in_float32_takes_three_consumers_by_the_same_rule():
    variant = _dense_variant(1, 16, 16384, 16384, True, o_accumulation="float32")
    assert variant.three_consumers and variant.o_float32 and variant.name.endswith(".o_f32.m192")


@pytest.mark.parametrize(("form", "capacity", "three"), [("packed", 8192, True), ("packed", 8191, False),
                                                         ("padded", 16384, False)])  # fmt: skip
def test_variable_lengths_take_three_consumers_by_their_key_capacity(form, capacity, three):
    """Packed: the scheduling kernel lists the tiles, so a long capacity decides alone (measured
    +4 to +8 % on mixes up to 8-16k, bench/NOTES.md FP8 v12); padded is not measured."""
    from tests.gpu.fp8_cases import Fp8Case, description

    tokens = {"tokens_q": 2 * capacity, "tokens_kv": 2 * capacity} if form == "packed" else {}
    case = Fp8Case("long", 2, 4, 2, capacity, capacity, 128, causal=True, form=form, **tokens)
    variant = _attention_variant(resolve(validate(description(case))))
    assert variant.three_consumers is three and variant.varlen


def test_the_gpu_cases_cover_three_consumers_both_ways():
    """tests/gpu/fp8_cases.py's plans that should take three consumers do (a rule change that
    moved them would leave the variant untested on the GPU)."""
    from tests.gpu.fp8_cases import cases, description

    chosen = {c.id: _attention_variant(resolve(validate(description(c)))) for c in cases()}
    three = sorted(name for name, variant in chosen.items() if variant.three_consumers)
    assert three == ["fp8-d128-causal-m192-br-vrows", "fp8-d128-causal-per_tile", "fp8-d128-causal-per_tile-f32",
                     "fp8-d128-full-m192", "fp8-d128-packed-causal-m192", "fp8-d128-packed-full-m192"]  # fmt: skip
    assert chosen["fp8-d128-causal-m192-br-vrows"].v_in_p_order and not chosen["fp8-d128-full-m192"].mask.right


def _prmt(a: int, b: int, selector: int) -> int:
    """prmt.b32's default mode: result byte i is byte (selector's nibble i) of b:a."""
    pool = (a | b << 32).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[(selector >> 4 * i) & 7] for i in range(4)), "little")


def test_reordered_v_keys_are_the_keys_each_lane_holds_in_the_accumulator():
    """`keys_in_accumulator_order` on keys 0-15 of a Vᵀ row: word c (the e4m3 A word of keys
    4c..4c+3, lane c of a quad) must hold the keys whose scores lane c holds in the fp32
    accumulator, in the order `_store_p` packs them: 2c, 2c + 1, then 2c + 8, 2c + 9 (n8 block
    g + 1). The kernel's pieces are prmt.b32 by KEY_ORDER_PRMT, emulated here."""
    keys = bytes(range(16))
    words = [int.from_bytes(keys[4 * w : 4 * w + 4], "little") for w in range(4)]
    for c, (a, b, selector) in enumerate(KEY_ORDER_PRMT):
        packed = _prmt(words[a], words[b], selector).to_bytes(4, "little")
        assert list(packed) == [2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9]


@pytest.mark.parametrize(
    ("head_dim", "causal", "reordered"),
    [(64, False, True), (64, True, True), (128, False, False), (128, True, True), (256, True, False)],
)
def test_fp8_variants_reorder_v_where_it_measured_faster(head_dim, causal, reordered):
    """`reorders_v` (bench/NOTES.md, FP8 v3): V's keys reordered in shared memory at d=64 and at
    d=128 with a diagonal; P's quad swap elsewhere. bf16 never reorders (its P needs no swap)."""
    mask = MaskFlags(right=causal)
    fp8 = SdpaFwdVariant("e4m3", head_dim, mask, True, out_dtype="bf16")
    assert fp8.tile_shape.v_reorder is reordered
    assert fp8.tiles.get("v_reorder", 0) == int(reordered)  # what inspect shows
    assert not SdpaFwdVariant("bf16", head_dim, mask, True).tile_shape.v_reorder


def test_aligned_starts_keep_packed_sequences_apart_on_16_key_boundaries():
    """vt_pack's layout, on random packed lengths (zero-length sequences included): each start a
    multiple of 16, past the previous sequence's end, and every sequence inside the pitch."""
    import random

    from frostc.kernels.sequence_maps import aligned_start, packed_pitch

    rng = random.Random(20)
    for _ in range(2000):
        batch = rng.randint(1, 40)
        lengths = [rng.choice((0, 1, 15, 16, 17, rng.randint(0, 300))) for _ in range(batch)]
        first = rng.choice((0, 0, 5, 31))
        tokens = first + sum(lengths) + rng.randint(0, 20)  # the buffer may hold more than the sequences
        end, token = 0, first
        for b, n in enumerate(lengths):
            start = aligned_start(token, b)
            assert start % 16 == 0 and start >= end
            end = start + n
            token += n
        assert end <= packed_pitch(tokens, batch) and packed_pitch(tokens, batch) % 128 == 0
