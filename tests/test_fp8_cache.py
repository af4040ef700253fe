"""An e4m3 (FP8) paged KV cache, on the build machine: the description's checks (scales required
with e4m3 caches and refused without, their dtype and dims, one dtype for both caches, e4m3 only
where a cache is read), the variants and arguments it resolves into (the softmax scale moves to
Q, the scales' head strides), real offline compiles, the ABI, and what inspect shows. Numerics
are tests/gpu's business (test_decode.py's matrix, test_fp8_cache.py's error bounds)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from frost_runtime.schema import decode_plan

from frostc.build import build
from frostc.description import parse_description
from frostc.inspect import plan_summary
from frostc.kernels.sdpa_decode_paged import decode_tiles
from frostc.resolve import resolve
from tests.descriptions import check, edited, problems

B, HQ, HKV, D, PAGE, MAX_PAGES, PAGES = 4, 8, 2, 128, 16, 64, 300


def step(cache: str = "e4m3", scale_heads: int = HKV) -> dict[str, Any]:
    """kv_append (bf16 rows into the caches) then attention over them, one new token each."""
    caches = {"dtype": cache, "dims": [PAGES, PAGE, HKV, D]}
    rows = {"dtype": "bf16", "dims": [B, HQ, 1, D], "layout": "bshd"}
    new = {"dtype": "bf16", "dims": [B, HKV, 1, D], "layout": "bshd"}
    scales = {"k_scale": "k_scale", "v_scale": "v_scale"}
    paged = {"k_cache": "k_cache", "v_cache": "v_cache", "page_table": "page_table", "seq_len_kv": "cache_len"}
    return {
        "format": 1,
        "name": "fp8-cache",
        "tensors": {
            "q": dict(rows), "o": dict(rows), "k_new": dict(new), "v_new": dict(new),
            "k_cache": dict(caches), "v_cache": dict(caches),
            "k_scale": {"dtype": "fp32", "dims": [scale_heads]}, "v_scale": {"dtype": "fp32", "dims": [scale_heads]},
            "page_table": {"dtype": "int32", "dims": [B, MAX_PAGES]},
            "cache_len": {"dtype": "int32", "dims": [B]},
        },
        "nodes": [
            {"op": "kv_append", "name": "append", "k": "k_new", "v": "v_new", **paged, **scales},
            {"op": "sdpa", "name": "attn", "q": "q", "k": "k_cache", "v": "v_cache", "o": "o",
             "page_table": "page_table", "seq_len_kv": "cache_len", "causal": True, **scales},
        ],
    }  # fmt: skip


def test_an_e4m3_step_validates_with_its_scales():
    append, attn = check(step()).nodes
    assert (append.k_scale, append.v_scale) == ("k_scale", "v_scale") == (attn.k_scale, attn.v_scale)
    assert [role for role, _ in attn.inputs][-2:] == ["k_scale", "v_scale"]
    assert [role for role, _ in append.inputs][-2:] == ["k_scale", "v_scale"]


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"nodes.1.k_scale": None}, "nodes[1].k_scale", ("missing", "x / scale", "fp32", "(hkv,) or (1,)")),
        ({"nodes.0.v_scale": None}, "nodes[0].v_scale", ("missing", 'v_scale = "v_scale"')),
        ({"tensors.k_scale.dtype": "bf16"}, "tensors.k_scale.dtype", ("scale factors", "fp32")),
        ({"tensors.v_scale.dims": [3]}, "tensors.v_scale.dims[0]", ("one scale per kv head (2)", "dims = [2]")),
        ({"tensors.k_scale.dims": [HKV, 1]}, "tensors.k_scale.dims", ("rank 1",)),
        ({"tensors.v_cache.dtype": "bf16"}, "tensors.v_cache.dtype", ("V cache is bf16", "K cache e4m3")),
        ({"tensors.q.dtype": "e4m3", "tensors.o.dtype": "e4m3"}, "tensors.q.dtype",
         ("bf16 or fp16", "paged form's q stays 16-bit", "k_scale")),
        ({"tensors.k_new.dtype": "e4m3", "tensors.v_new.dtype": "e4m3"}, "tensors.k_new.dtype",
         ("bf16 or fp16",)),
    ],
)  # fmt: skip
def test_bad_e4m3_declarations_name_the_field_and_the_fix(changes, path, words):
    found = problems(edited(step(), **changes))
    assert path in [p.path for p in found], found
    message = next(p.message for p in found if p.path == path)
    for word in words:
        assert word in message, message


def test_scales_are_refused_for_an_unquantized_cache():
    found = problems(step(cache="bf16"))
    assert sorted(p.path for p in found) == sorted(f"nodes[{n}].{r}" for n in (0, 1) for r in ("k_scale", "v_scale"))
    assert all("quantized (e4m3)" in p.message and "bf16" in p.message for p in found)


def test_e4m3_k_and_v_with_a_bf16_q_are_refused():
    dense = {"dtype": "e4m3", "dims": [1, 2, 64, 128]}
    d = {
        "format": 1, "name": "dense",
        "tensors": {"q": {"dtype": "bf16", "dims": [1, 2, 64, 128]}, "k": dict(dense), "v": dict(dense),
                    "o": {"dtype": "bf16", "dims": [1, 2, 64, 128]}, "s": {"dtype": "fp32", "dims": [2]}},
        "nodes": [{"op": "sdpa", "q": "q", "k": "k", "v": "v", "o": "o", "k_scale": "s"}],
    }  # fmt: skip
    found = problems(d)
    paths = {p.path: p.message for p in found}
    assert "e4m3 q, k and v" in paths["tensors.k.dtype"] and "quantize q too" in paths["tensors.k.dtype"]
    assert "paged KV cache" in paths["nodes[0].k_scale"] and "remove k_scale" in paths["nodes[0].k_scale"]


def test_an_e4m3_cache_needs_16_byte_rows():
    d = edited(step(), **{"tensors.k_cache.strides": [PAGE * HKV * 136, HKV * 136, 136, 1]})
    d = edited(d, **{"tensors.v_cache.strides": [PAGE * HKV * 136, HKV * 136, 136, 1]})
    with pytest.raises(Exception) as e:
        resolve(check(d))
    assert "multiple of 16 elements (16 bytes)" in str(e.value)


def _launch_values(plan, node: str, kernel_prefix: str) -> dict:
    for launch in plan.launches:
        name = plan.kernels[launch.kernel].name
        if launch.node == node and name.startswith(kernel_prefix):
            names = [param.name for param in plan.kernels[launch.kernel].params]
            return {p: a.value if a.slot < 0 else ("slot", plan.slots[a.slot].name) for p, a in zip(names, launch.args)}
    raise AssertionError(f"no {kernel_prefix} launch of {node}")


@pytest.mark.parametrize("scale_heads", [HKV, 1], ids=["per-head", "per-tensor"])
def test_the_plan_moves_the_softmax_scale_to_q_and_reads_the_scales(scale_heads):
    plan = decode_plan(build(parse_description(json.dumps(step(scale_heads=scale_heads)), fmt="json")))
    kernels = [k.name for k in plan.kernels]
    assert kernels[0] == "kv_append.bf16.kv_e4m3.d128"
    assert kernels[1].startswith("sdpa_decode_paged.bf16.kv_e4m3.r8.d128.p16.causal_br")  # 4 rows: few_rows
    attn = _launch_values(plan, "attn", "sdpa_decode_paged")
    assert attn["q_scale"] == pytest.approx(1 / math.sqrt(D))
    assert attn["scale_log2"] == pytest.approx(1 / math.log(2))  # log2(e): attn_scale is in Q
    stride = 1 if scale_heads > 1 else 0
    assert (attn["k_scale.stride_h"], attn["v_scale.stride_h"]) == (stride, stride)
    assert (attn["k_scale"], attn["v_scale"]) == (("slot", "k_scale"), ("slot", "v_scale"))
    append = _launch_values(plan, "append", "kv_append")
    assert (append["k_scale.stride_h"], append["v_scale.stride_h"]) == (stride, stride)
    slots = {s.name: s.dtype for s in plan.slots}
    assert (slots["k_cache"], slots["k_scale"]) == ("e4m3", "fp32")


def test_softcap_keeps_its_scale_inside_the_tanh_without_attn_scale():
    d = edited(step(), **{"nodes.1.softcap": 50.0})
    plan = decode_plan(build(parse_description(json.dumps(d), fmt="json")))
    attn = _launch_values(plan, "attn", "sdpa_decode_paged")
    assert attn["score_scale"] == pytest.approx(1 / 50.0)  # k_scale joins it on the device
    assert attn["scale_log2"] == pytest.approx(50.0 / math.log(2))


def test_the_ring_holds_more_stages_of_half_the_bytes():
    bf16, e4m3 = decode_tiles(128, 16, "bf16", "bf16"), decode_tiles(128, 16, "bf16", "e4m3")
    assert e4m3.ctas_per_sm == bf16.ctas_per_sm == 2
    assert e4m3.stages * 1 > bf16.stages * 1 and e4m3.stages >= 3
    assert decode_tiles(256, 32, "bf16", "e4m3").stages >= 3


def test_few_rows_run_three_ctas_an_sm_up_to_d128():
    """The transposed few-rows kernel (~100 registers a thread) fits three CTAs of four 16 KiB
    stages an SM at d=128; d=256 keeps one CTA; more rows keep two."""
    few = decode_tiles(128, 16, "bf16", "e4m3", few_rows=True)
    assert (few.ctas_per_sm, few.stages) == (3, 4)
    assert decode_tiles(64, 16, "bf16", "e4m3", few_rows=True).ctas_per_sm == 3
    assert decode_tiles(256, 32, "bf16", "e4m3", few_rows=True).ctas_per_sm == 1
    assert decode_tiles(128, 16, "bf16", "e4m3").ctas_per_sm == 2


def test_the_e4m3_kernel_takes_16_rows_per_cta_and_more_row_blocks():
    """The warp-level kernel's CTA holds one m16 tile of (token, head) rows: a group of 4 by one
    token is one row block, by 5 tokens two; the bf16 cache's kernel keeps 64 rows."""
    assert decode_tiles(128, 16, "bf16", "e4m3").rows == 16 and decode_tiles(128, 16, "bf16", "bf16").rows == 64
    for s_new, row_blocks in ((1, 1), (2, 1), (3, 1), (5, 2)):
        d = edited(step(), **{f"tensors.{name}.dims": [B, HQ, s_new, D] for name in ("q", "o")})
        d = edited(d, **{f"tensors.{name}.dims": [B, HKV, s_new, D] for name in ("k_new", "v_new")})
        plan = decode_plan(build(parse_description(json.dumps(d), fmt="json")))
        attn = _launch_values(plan, "attn", "sdpa_decode_paged")
        assert (attn["rows"], attn["row_blocks"]) == (4 * s_new, row_blocks)
        # at most 8 rows: the variant that skips the m16 tile's second row half (padding)
        few_rows = ".r8." in next(k.name for k in plan.kernels if k.name.startswith("sdpa_decode_paged"))
        assert few_rows == (4 * s_new <= 8)
        launch = next(x for x in plan.launches if x.node == "attn" and plan.kernels[x.kernel].name.startswith("sdpa_"))
        assert launch.grid[1] == HKV * row_blocks
        assert "/ 16)" in plan.kernels[launch.kernel].grid_rule


def test_inspect_shows_the_cache_dtype_and_the_scale_slots():
    plan = decode_plan(build(parse_description(json.dumps(step()), fmt="json")))
    text = json.dumps(plan_summary(plan))
    for word in ("e4m3", "k_scale", "v_scale", "kv_append.bf16.kv_e4m3.d128", "q_scale"):
        assert word in text, word


def test_the_e4m3_variants_keep_the_bf16_names_and_abi_apart():
    from frostc.kernels.kv_append import KvAppendVariant
    from frostc.kernels.sdpa_decode_paged import PagedDecodeVariant

    plain = PagedDecodeVariant("bf16", "bf16", 128, 16, True, True, False)
    scaled = PagedDecodeVariant("bf16", "e4m3", 128, 16, True, True, False)
    assert plain.name != scaled.name and ".kv_e4m3." in scaled.name
    extra = [p for p in scaled.params if p not in plain.params]
    assert extra == [("k_scale", "ptr"), ("v_scale", "ptr"), ("k_scale.stride_h", "i64"),
                     ("v_scale.stride_h", "i64"), ("q_scale", "f32")]  # fmt: skip
    plain = KvAppendVariant("bf16", 64, "bf16").params
    assert [p for p in KvAppendVariant("bf16", 64, "e4m3").params if p not in plain] == [
        ("k_scale", "ptr"), ("v_scale", "ptr"), ("k_scale.stride_h", "i64"), ("v_scale.stride_h", "i64")
    ]  # fmt: skip


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_e4m3_kernel_fences_its_ring_reads_before_each_release(head_dim):
    """The consumer warps read the TMA ring with ld.shared (the generic proxy) and TMA refills a
    stage (the async proxy) once its empty barrier completes: PTX asks for fence.proxy.async
    between the reads and the release, or the arrive may overtake reads still in flight (the
    race bench/NOTES.md, decode v5, tells of). In the PTX, every consumer arrive (not the
    producer's arrive.expect_tx) follows a fence issued after the last shared-memory load."""
    import cutlass.cute as cute

    import frostc.kernels  # noqa: F401  (imported above already: it sets the DSL to keep the PTX)
    from frostc.kernels.sdpa_decode_paged import PagedDecodeVariant

    variant = PagedDecodeVariant("bf16", "e4m3", head_dim, 32, True, True, False)
    ptx = cute.compile(variant.kernel(), *variant.compile_args()).__ptx__
    releases, unfenced_read = 0, False
    for line in ptx.splitlines():
        op = line.strip()
        if op.startswith("ld.shared"):
            unfenced_read = True
        elif op.startswith("fence.proxy.async"):
            unfenced_read = False
        elif op.startswith("mbarrier.arrive") and "expect_tx" not in op:
            assert not unfenced_read, f"a ring stage released after unfenced shared-memory reads: {op}"
            releases += 1
    assert releases == 2  # K's and V's
