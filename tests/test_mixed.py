"""The sdpa op's mixed form (packed queries over a paged cache: any mix of prefill chunks and
decodes in one step): its checks with their field paths, its capacities and length contracts, the
launches and workspace it resolves into, what the plan records of it, and offline compiles of its
kernels. Numerics are tests/gpu/test_mixed.py's business."""

from __future__ import annotations

from typing import Any

import pytest
from frost_runtime.schema import decode_plan
from frost_runtime.workload import attention_nodes, sequence_lengths, work

from frostc.build import build
from frostc.description import parse_description
from frostc.kernels.sdpa_common import sequence_chunk
from frostc.ops.sdpa_choice import ADAPTIVE_MIN_CHUNK_KEYS
from frostc.resolve import resolve
from tests.descriptions import check, edited, only

T, B, HQ, HKV, D, PAGE, MAX_PAGES, PAGES = 96, 5, 16, 4, 128, 16, 32, 200


def base(tokens: int = T, max_seqlen_q: int | None = 40, max_pages: int = MAX_PAGES) -> dict[str, Any]:
    """A step of up to `tokens` query tokens of B sequences over a paged cache (bf16, GQA 4)."""
    cache = {"dtype": "bf16", "dims": [PAGES, PAGE, HKV, D]}
    rows = {"dtype": "bf16", "dims": [tokens, HQ, D]}
    node = {
        "op": "sdpa", "name": "attn", "q": "q", "k": "k_cache", "v": "v_cache", "o": "o", "lse": "lse",
        "page_table": "page_table", "seq_len_kv": "cache_len", "cu_seqlens_q": "cu_q", "causal": True,
    }  # fmt: skip
    if max_seqlen_q is not None:
        node["max_seqlen_q"] = max_seqlen_q
    return {
        "format": 1,
        "name": "mixed",
        "tensors": {
            "q": dict(rows),
            "o": dict(rows),
            "lse": {"dtype": "fp32", "dims": [tokens, HQ], "layout": "ht"},
            "k_cache": dict(cache),
            "v_cache": dict(cache),
            "page_table": {"dtype": "int32", "dims": [B, max_pages]},
            "cache_len": {"dtype": "int32", "dims": [B]},
            "cu_q": {"dtype": "int32", "dims": [B + 1]},
        },
        "nodes": [node],
    }


def tweak(**changes: Any) -> dict[str, Any]:
    return edited(base(), **changes)


def test_a_mixed_node_validates_with_its_capacities():
    (node,) = check(base()).nodes
    assert node.form == "mixed"
    assert (node.batch, node.tokens_q, node.seq_q, node.seq_kv) == (B, T, 40, MAX_PAGES * PAGE)
    assert node.mask.alignment == "bottom_right"  # each sequence's queries are its cache's last keys
    assert [role for role, _ in node.inputs] == ["q", "k", "v", "cu_seqlens_q", "page_table", "seq_len_kv"]
    (default,) = check(base(max_seqlen_q=None)).nodes
    assert default.seq_q == T  # a sequence may take every token of the step


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"nodes.0.cu_seqlens_kv": "cu_q"}, "nodes[0].cu_seqlens_kv", ("mixed", "seq_len_kv", "remove")),
        ({"nodes.0.seq_len_q": "cache_len"}, "nodes[0].seq_len_q", ("mixed", "remove")),
        ({"nodes.0.max_seqlen_kv": 100}, "nodes[0].max_seqlen_kv", ("remove",)),
        ({"nodes.0.max_seqlen_q": T + 1}, "nodes[0].max_seqlen_q", ("97", "96 tokens")),
        ({"tensors.cu_q.dims": [B]}, "tensors.cu_q.dims[0]", ("5 prefix sums", "5 sequences", "(6)")),
        ({"nodes.0.diagonal_alignment": "top_left"}, "nodes[0].diagonal_alignment", ("bottom_right",)),
        ({"nodes.0.causal": None, "nodes.0.window_right": 4}, "nodes[0].window_right", ("not supported",)),
        ({"tensors.cu_q.dtype": "int64"}, "tensors.cu_q.dtype", ("int32",)),
        ({"tensors.o.dims": [T, HQ + 1, D]}, "tensors.o.dims[1]", ("heads 17",)),
        ({"tensors.q.dims": [T, HQ, 1, D]}, "tensors.q.dims", ("(tq, hq, d)",)),
        ({"nodes.0.o_accumulation": "float32"}, "nodes[0].o_accumulation", ("mixed node",)),
    ],
)  # fmt: skip
def test_bad_mixed_declarations_name_the_field_and_the_fix(changes, path, words):
    only(tweak(**changes), path, *words)


def test_a_decode_sized_step_splits_its_keys_and_merges_packed_partials():
    plan = resolve(check(base(tokens=24, max_seqlen_q=4, max_pages=256)))  # 4096 keys a sequence
    attention, combine = plan.launches
    assert attention.variant.packed and attention.variant.split and combine.variant.packed
    splits = attention.grid[0]
    assert splits > 1 and attention.grid[1:] == (HKV, B)  # 4 tokens x GQA 4 rows: one row block
    assert combine.grid == (4 * HQ // HKV, HKV, B)  # a CTA per (row, KV head, sequence) of the capacity
    # the partials by (split, token, query head): every token of the buffer, not every row of a batch
    o_partial, lse_partial = (r for r in plan.workspace)
    assert (o_partial.bytes, lse_partial.bytes) == (splits * 24 * HQ * D * 4, splits * 24 * HQ * 4)
    args = {a.param: a for a in attention.args}
    assert args["tokens"].value == 24 and args["s_new"].value == 4 and args["q.stride_b"].value == 0
    assert args["q.stride_s"].value == HQ * D and args["lse.stride_s"].value == 1  # lse stored (hq, tokens)


def test_a_prefill_sized_step_runs_its_chunks_on_the_forward_kernel_over_the_pages():
    """Sequences of up to 40 queries at GQA 4 may outgrow one 64-row block of the paged decode
    kernel: the node becomes its decodes (sequences of at most 16 queries: one row block each, a
    CTA row per sequence) and its chunks (the scheduling kernel lists the others' query blocks, the
    forward kernel walks them reading the pages), each sequence in exactly one half."""
    plan = resolve(check(base()))
    decodes, schedule, chunks = plan.launches  # enough CTAs without splitting keys: no combine
    assert decodes.variant.chunks_apart and not decodes.variant.split and decodes.grid == (1, HKV, B)
    assert schedule.variant.name == "sdpa_schedule.mixed.m128n128.causal_br" and schedule.grid == (1, 1, 1)
    assert chunks.variant.page_size == PAGE and chunks.variant.varlen
    # each launch after a settled one starts early and waits at entry (launch_order.WAITS_AT_ENTRY)
    assert (decodes.early, schedule.early, chunks.early) == (False, True, True)
    units = min(B * 1, (T + B * 127) // 128)  # query blocks of 128 that the step's tokens can make
    assert chunks.grid == (units * HQ, 1, 1)
    args = {a.param: a for a in schedule.args}
    assert args["decode_tokens"].value == 64 // (HQ // HKV)
    args = {a.param: a for a in chunks.args}
    assert (args["pages"].value, args["rows_per_page"].value, args["page_table.stride_b"].value) == (
        PAGES,
        PAGE,
        MAX_PAGES,
    )
    assert args["o.stride_b"].value == 0 and args["seq_q"].value == 40  # packed queries, at most 40 a sequence
    names = [region.name for region in plan.workspace]
    assert names == ["attn.chunk_sequences", "attn.chunk_tiles", "attn.chunk_tile_count"]
    few = resolve(check(base(tokens=12, max_seqlen_q=12))).launches  # 12 queries x 4: one row block
    assert len(few) == 1 and not few[0].variant.chunks_apart and few[0].grid == (1, HKV, B)
    contracts = {plan.slots[c.slot].name: (c.kind, c.longest, c.total) for c in plan.lengths}
    assert contracts == {"cache_len": ("lengths", MAX_PAGES * PAGE, 0), "cu_q": ("offsets", 40, T)}


def test_decodes_beside_chunks_apart_split_adaptively_within_the_grid_and_workspace_budgets():
    """With the chunks apart the decodes' plan must serve 64 short decodes and 8 long ones alike:
    it fixes the splits and the fewest keys a split takes; each sequence's chunk is decided on
    the device (`sequence_chunk`), a short one written by split 0 alone, the combine merging the
    long ones' partials, a row block of them per sequence and KV head."""
    plan = resolve(check(base(max_pages=256)))  # 4096 keys a sequence, chunks of up to 40 queries
    decodes, combine, _schedule, _chunks = plan.launches
    assert decodes.variant.chunks_apart and decodes.variant.split and decodes.variant.adaptive
    assert decodes.variant.name.endswith(".packed.decodes.split.lse")  # it writes short sequences' LSE itself
    assert combine.variant.decode_rows == 64
    assert combine.grid == (64 // 8, HKV, B)  # a warp a row, 8 a CTA: a decode of up to 16 tokens at GQA 4
    assert combine.variant.tiles == {"threads": 256, "rows_per_cta": 8}
    args = {a.param: a.value for a in decodes.args}
    splits = args["splits"]
    assert args["chunk"] == ADAPTIVE_MIN_CHUNK_KEYS and splits == 4096 // ADAPTIVE_MIN_CHUNK_KEYS
    assert decodes.grid == (splits, HKV, B) and {a.param: a.value for a in combine.args}["chunk"] == args["chunk"]
    o_partial, lse_partial = (r for r in plan.workspace if "partial" in r.name)
    blocks = B * HKV * splits * decodes.variant.tile_shape.rows  # a row block per sequence, KV head and split
    assert (o_partial.bytes, lse_partial.bytes) == (blocks * D * 4, blocks * 4)
    # short capacities: one split, no combine
    short = resolve(check(base(max_pages=100))).launches  # 1600 keys: fewer than two splits of the fewest
    assert not short[0].variant.split and len(short) == 3


def test_a_bucket_wide_enough_to_fill_the_gpu_keeps_its_decodes_unsplit():
    """A bucket of 256 sequences (1,024 CTAs a split over 4 KV heads: three waves of 132 SMs x 2)
    is filled by steps of many sequences; forcing two splits there cost 8 % on 256 speculative
    decodes (bench/NOTES.md), so its decodes run unsplit: no partials, no combine."""
    wide = base(tokens=1024, max_pages=256)
    wide["tensors"]["page_table"]["dims"] = [256, 256]
    wide["tensors"]["cache_len"]["dims"] = [256]
    wide["tensors"]["cu_q"]["dims"] = [257]
    decodes, *rest = resolve(check(wide)).launches
    assert decodes.variant.chunks_apart and not decodes.variant.split
    assert decodes.grid == (1, HKV, 256) and not any("combine" in launch.variant.name for launch in rest)


@pytest.mark.parametrize("splits", [1, 2, 3, 8])
def test_a_sequences_adaptive_chunk_covers_its_keys_in_its_splits_and_one_split_iff_short(splits: int) -> None:
    """The attention kernel's key ranges [origin + s * chunk, + chunk) over s < splits cover the
    sequence's keys exactly once, a sequence is written directly iff it fits one split, and the
    combine counts the same splits (both call `sequence_chunk`)."""
    min_chunk, block_n = ADAPTIVE_MIN_CHUNK_KEYS, 64
    for keys in [*range(0, 3000, 7), splits * min_chunk, splits * min_chunk + 1, 40_000]:
        chunk = sequence_chunk(keys, min_chunk, splits, block_n)
        assert chunk % block_n == 0 and chunk >= min_chunk
        covered = [k for s in range(splits) for k in range(s * chunk, min((s + 1) * chunk, keys))]
        assert covered == list(range(keys))  # every key once, whatever the length
        used = -(-keys // chunk)  # the splits with keys: what the combine merges
        assert (keys <= chunk) == (used <= 1)  # written directly iff one split
        if keys > splits * min_chunk:  # long: every split used, the last short by less than a block a split
            assert used == splits and splits * chunk - keys < splits * block_n


def test_an_e4m3_caches_chunks_run_on_the_forward_kernel_that_converts_the_pages():
    """Over an e4m3 cache the chunks run on the forward kernel too, its pages read raw and
    converted into the 16-bit stages (`kv_cache`), the scales among its arguments; the decodes
    stay on the e4m3 decode kernel, whose row block (16 rows) decides which sequences are decodes:
    at GQA 4, 4 queries or fewer."""
    description = base()
    for name in ("k_cache", "v_cache"):
        description["tensors"][name]["dtype"] = "e4m3"
    description["tensors"]["k_scale"] = {"dtype": "fp32", "dims": [HKV]}
    description["tensors"]["v_scale"] = {"dtype": "fp32", "dims": [HKV]}
    description["nodes"][0] |= {"k_scale": "k_scale", "v_scale": "v_scale"}
    launches = resolve(check(description)).launches
    decodes, schedule, chunks = (launch for launch in launches if not launch.variant.name.startswith("sdpa_decode_c"))
    assert decodes.variant.quantized and decodes.variant.chunks_apart
    assert chunks.variant.name == f"sdpa_fwd_wgmma.bf16.d{D}.causal_br.varlen.kv_e4m3.paged_p{PAGE}.lse"
    # two raw stages (TMA fills one while the converters empty the other), O through Q's buffer
    tiles = chunks.variant.tile_shape
    assert (tiles.raw_stages, tiles.o_buffer) == (2, False) and chunks.variant.tiles["raw_stages"] == 2
    # its tensor cores run fp16 (e4m3 -> fp16 is one instruction a pair), Q converted once a tile
    kernel = chunks.variant.kernel()
    assert (kernel.mma_dtype.__name__, kernel.dtype.__name__) == ("Float16", "BFloat16")
    rows = decodes.variant.tile_shape.rows
    assert {a.param: a for a in schedule.args}["decode_tokens"].value == rows // (HQ // HKV) == 4
    args = {a.param for a in chunks.args}
    assert {"k_scale", "v_scale"} <= {p.split(".")[0] for p in args}


def test_the_plan_records_a_mixed_node_and_the_runtime_reads_its_work():
    data = build(parse_description(__import__("json").dumps(base(tokens=24, max_seqlen_q=4)), fmt="json"))
    plan = decode_plan(data)
    (record,) = plan.nodes
    assert record.form == "mixed" and record.sizes["seq_q"] == 4 and record.sizes["tokens_q"] == 24
    assert set(record.slots) >= {"cu_seqlens_q", "page_table", "seq_len_kv", "lse"}
    (node,) = attention_nodes(plan)
    cu, lens = record.slots["cu_seqlens_q"], record.slots["seq_len_kv"]
    values = {cu: [0, 1, 5, 5, 6, 10], lens: [100, 4, 0, 30, 512]}
    assert sequence_lengths(node, values) == ([1, 4, 0, 1, 4], [100, 4, 0, 30, 512])
    counted = work(plan, values)
    assert counted.bytes == sum(values[lens]) * HKV * D * 2 * 2  # every key read once a KV head
    pairs = 100 + (1 + 2 + 3 + 4) + 30 + (509 + 510 + 511 + 512)  # bottom-right causal rows
    assert counted.flops == 4 * D * HQ * pairs


def test_the_gpu_tests_mixed_plans_resolve_with_the_engines_cache_layouts() -> None:
    """tests/gpu's mixed matrix (engines' cache layouts by strides, steps that append first)
    stays buildable: each description validates and resolves; an appending step's attention
    starts early behind its append. Behind that attention (which waits only before the new rows,
    so may finish before the append does) no scheduling kernel starts early: the forward kernel
    reads the appended pages, and its wait covers only the launch ahead."""
    from frostc.validate import validate
    from tests.gpu.build_plans import mixed_description
    from tests.gpu.mixed_cases import cases, graph_case

    for case in [*cases(), graph_case()]:
        plan = resolve(validate(mixed_description(case)))
        kinds = [launch.variant.name.split(".")[0] for launch in plan.launches]
        assert kinds[0] == ("kv_append" if case.append else "sdpa_decode_paged"), case.id
        if case.append:
            assert plan.launches[1].early, f"{case.id}: the attention waits for the whole append"
        for launch in plan.launches:
            if launch.variant.name.startswith("sdpa_schedule"):
                assert launch.early != case.append, f"{case.id}: the schedule starts early only behind a settled launch"
