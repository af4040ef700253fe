"""The sdpa op's paged form (decode over a paged KV cache): its checks with their field paths,
the split-KV decision made at build (from the capacities and the SM count), the launches and
workspace it resolves into, a plan of append + attend, and real offline compiles of its kernels.
Numerics are tests/gpu's business."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from frost_runtime.schema import decode_plan

from frostc.build import build
from frostc.description import parse_description
from frostc.errors import DescriptionError
from frostc.inspect import plan_summary
from frostc.kernels.sdpa_decode_paged import BLOCK_N, decode_tiles
from frostc.ops.sdpa_choice import choose_decode
from frostc.resolve import resolve
from frostc.target import SM90A
from tests.descriptions import check, edited, only, problems

TILES = decode_tiles(128, 16, "bf16", "bf16")  # blocks of BLOCK_N keys, two CTAs per SM

B, HQ, HKV, D, PAGE, MAX_PAGES, PAGES = 4, 8, 2, 128, 16, 64, 300


def base(batch: int = B, max_pages: int = MAX_PAGES, new_tokens: int = 1) -> dict[str, Any]:
    """Attention of `new_tokens` per sequence over a paged cache (bf16, GQA 4, d 128, pages of 16)."""
    cache = {"dtype": "bf16", "dims": [PAGES, PAGE, HKV, D]}
    rows = {"dtype": "bf16", "dims": [batch, HQ, new_tokens, D], "layout": "bshd"}
    return {
        "format": 1,
        "name": "decode",
        "tensors": {
            "q": dict(rows),
            "k_cache": dict(cache),
            "v_cache": dict(cache),
            "page_table": {"dtype": "int32", "dims": [batch, max_pages]},
            "cache_len": {"dtype": "int32", "dims": [batch]},
            "o": dict(rows),
        },
        "nodes": [
            {
                "op": "sdpa", "name": "attn", "q": "q", "k": "k_cache", "v": "v_cache", "o": "o",
                "page_table": "page_table", "seq_len_kv": "cache_len", "causal": True,
            }
        ],
    }  # fmt: skip


def tweak(**changes: Any) -> dict[str, Any]:
    return edited(base(), **changes)


def test_a_paged_node_validates_with_its_capacities():
    graph = check(base())
    (node,) = graph.nodes
    assert node.form == "paged"
    assert (node.page_size, node.pages, node.seq_kv, node.seq_q) == (PAGE, PAGES, MAX_PAGES * PAGE, 1)
    assert node.mask.alignment == "bottom_right"  # the new tokens are the cache's last
    assert [role for role, _ in node.inputs] == ["q", "k", "v", "page_table", "seq_len_kv"]


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"tensors.k_cache.dims": [PAGES, 24, HKV, D], "tensors.v_cache.dims": [PAGES, 24, HKV, D]},
         "tensors.k_cache.dims[1]", ("page size 24", "multiple of 16")),
        ({"tensors.k_cache.dims": [PAGES, 512, HKV, D], "tensors.v_cache.dims": [PAGES, 512, HKV, D]},
         "tensors.k_cache.dims[1]", ("at most 256",)),
        ({"tensors.q.dims": [B, HQ, 17, D], "tensors.o.dims": [B, HQ, 17, D]}, "tensors.q.dims[2]",
         ("1 (decode) to 16",)),
        ({"nodes.0.diagonal_alignment": "top_left"}, "nodes[0].diagonal_alignment", ("bottom_right",)),
        ({"nodes.0.causal": None, "nodes.0.window_right": 4}, "nodes[0].window_right", ("not supported in the paged",)),
        ({"nodes.0.seq_len_q": "cache_len"}, "nodes[0].seq_len_q", ("remove seq_len_q",)),
        ({"nodes.0.max_seqlen_kv": 100}, "nodes[0].max_seqlen_kv", ("remove max_seqlen_kv",)),
        ({"nodes.0.seq_len_kv": None, "tensors.cache_len": None}, "nodes[0].seq_len_kv", ("missing",)),
        ({"tensors.page_table.dtype": "fp32"}, "tensors.page_table.dtype", ("page ids", "int32")),
        ({"tensors.cache_len.dtype": "fp32"}, "tensors.cache_len.dtype", ("int32",)),
        ({"tensors.page_table.dims": [B + 1, MAX_PAGES]}, "tensors.page_table.dims[0]", ("batch 5", "4")),
        ({"tensors.v_cache.dims": [PAGES, PAGE, HKV + 1, D]}, "tensors.v_cache.dims[2]", ("kv heads 3",)),
        ({"tensors.k_cache.dims": [PAGES, PAGE, 3, D], "tensors.v_cache.dims": [PAGES, PAGE, 3, D]},
         "tensors.k_cache.dims[2]", ("GQA", "8 % 3")),
        ({"tensors.k_cache.dims": [PAGES, PAGE, HKV]}, "tensors.k_cache.dims", ("(pages, page_size, hkv, d)",)),
    ],
)  # fmt: skip
def test_bad_paged_declarations_name_the_field_and_the_fix(changes, path, words):
    only(tweak(**changes), path, *words)


def declined(d: dict[str, Any]) -> list:
    graph = check(d)  # valid: only the kernels' support is lacking
    with pytest.raises(DescriptionError) as e:
        resolve(graph)
    return e.value.problems


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"tensors.k_cache.layout": "sphd", "tensors.v_cache.layout": "sphd"}, "tensors.k_cache.strides[0]",
         ("multiple of the row stride", "pshd")),
        ({"tensors.v_cache.layout": "phsd"}, "tensors.v_cache.strides", ("same layout",)),
        ({"tensors.q.dims": [B, HQ, 1, 80], "tensors.o.dims": [B, HQ, 1, 80],
          "tensors.k_cache.dims": [PAGES, PAGE, HKV, 80], "tensors.v_cache.dims": [PAGES, PAGE, HKV, 80]},
         "tensors.q.dims[3]", ("head dim 80 is not supported in the paged form", "64, 96, 128, 256")),
        ({"tensors.q.strides": [1024, 128, 1024, 1], "tensors.q.layout": None, "tensors.page_table.strides": [1, B]},
         "tensors.page_table.strides[1]", ("contiguous",)),
        ({"tensors.o.strides": [1025, 128, 1025, 1], "tensors.o.layout": None}, "tensors.o.strides[0]",
         ("multiple of 8",)),
    ],
)  # fmt: skip
def test_unsupported_layouts_are_declined_at_resolve(changes, path, words):
    found = declined(tweak(**changes))
    assert path in [p.path for p in found], found
    message = next(p.message for p in found if p.path == path)
    for word in words:
        assert word in message


def test_a_long_context_for_few_sequences_is_split():
    plan = resolve(check(base(batch=1, max_pages=8192)))  # 131072 keys, 2 KV heads
    attention, combine = plan.launches
    splits, chunk = attention.grid[0], _arg(attention, "chunk")
    assert splits > 1 and _arg(attention, "splits") == splits == _arg(combine, "splits")
    assert chunk % BLOCK_N == 0 and splits * chunk >= 8192 * PAGE > (splits - 1) * chunk
    assert combine.grid == (HQ // HKV, HKV, 1)  # one CTA per query row
    names = [r.name for r in plan.workspace]
    assert names == ["attn.o_partial", "attn.lse_partial"]
    rows = HQ // HKV
    assert plan.workspace[0].bytes == HKV * splits * rows * D * 4
    assert [c.longest for c in plan.lengths] == [8192 * PAGE]


def test_windows_and_softcap_make_their_variant_and_splits_follow_the_window():
    d = edited(base(batch=1, max_pages=8192), **{"nodes.0.window_left": 4095, "nodes.0.softcap": 30.0})
    plan = resolve(check(d))
    attention, combine = plan.launches
    assert attention.variant.name == "sdpa_decode_paged.bf16.d128.p16.causal_br.local.softcap.split"
    assert _arg(attention, "window_left") == _arg(combine, "window_left") == 4095
    assert _arg(combine, "s_new") == 1 and _arg(combine, "block_n") == BLOCK_N
    splits, chunk = attention.grid[0], _arg(attention, "chunk")
    assert splits * chunk >= 4096 + BLOCK_N > (splits - 1) * chunk  # the window, not the 131072-key capacity
    assert _arg(attention, "score_scale") == pytest.approx(D**-0.5 / 30.0)
    assert _arg(attention, "scale_log2") == pytest.approx(30.0 * 1.4426950408889634)
    unmasked = resolve(check(base(batch=1, max_pages=8192))).launches[0]
    assert _arg(unmasked, "window_left") == -1 and _arg(unmasked, "score_scale") == 0.0


def test_many_sequences_run_unsplit_with_no_workspace():
    plan = resolve(check(base(batch=512, max_pages=16)))
    (attention,) = plan.launches
    assert attention.grid == (1, HKV, 512)
    assert attention.variant.split is False and plan.workspace_bytes == 0


def test_the_split_count_follows_the_sm_count_and_the_residency():
    node = check(base(batch=32, max_pages=4096)).nodes[0]  # 64 (sequence, KV head) pairs, 65536 keys
    ctas = decode_tiles(D, PAGE, "bf16", "bf16").ctas_per_sm
    few = splits(node, 66)
    config = choose_decode(node, "bf16", "bf16", SM90A)
    many, chunk = config.splits, config.chunk
    assert 1 < few < many
    assert 32 * HKV * many >= 4 * SM90A.sms * ctas  # waves of CTAs at full capacity
    assert chunk >= 2048 and chunk % BLOCK_N == 0


def splits(node, sms: int = SM90A.sms) -> int:
    """The split count for a bf16 cache on a target of `sms` SMs."""
    return choose_decode(node, "bf16", "bf16", replace(SM90A, sms=sms)).splits


def test_short_capacities_and_full_grids_are_not_split():
    assert TILES.ctas_per_sm == 2
    assert splits(check(base(batch=2, max_pages=32)).nodes[0]) == 1  # 512 keys: one chunk
    assert splits(check(base(batch=2, max_pages=64)).nodes[0]) == 2  # 1024 keys: two of 512
    # CTAs filling half the slots or more: chunks of 2048 keys at least
    assert splits(check(base(batch=66, max_pages=144)).nodes[0]) == 1  # 132 CTAs
    assert splits(check(base(batch=65, max_pages=144)).nodes[0]) == 4  # 130: chunks of 576
    assert splits(check(base(batch=512, max_pages=4096)).nodes[0]) == 1  # 1024 CTAs already


def test_more_rows_than_one_warpgroup_make_row_blocks():
    d = base(new_tokens=16)  # 16 tokens x 4 heads of a group = 64 rows: one block
    assert resolve(check(d)).launches[0].grid[1] == HKV
    d = edited(d, **{"tensors.q.dims": [B, 16, 16, D], "tensors.o.dims": [B, 16, 16, D]})  # 128 rows
    assert resolve(check(d)).launches[0].grid[1] == 2 * HKV


def _arg(launch, name: str):
    return next(a.value for a in launch.args if a.param == name)


def decode_step() -> dict[str, Any]:
    """kv_append then sdpa over the same caches, lengths and page table."""
    d = base(batch=2, max_pages=512)
    d["tensors"]["k_new"] = {"dtype": "bf16", "dims": [2, HKV, 1, D], "layout": "bshd"}
    d["tensors"]["v_new"] = {"dtype": "bf16", "dims": [2, HKV, 1, D], "layout": "bshd"}
    d["tensors"]["lse"] = {"dtype": "fp32", "dims": [2, HQ, 1]}
    d["nodes"][0]["lse"] = "lse"
    append = {
        "op": "kv_append", "name": "append", "k": "k_new", "v": "v_new", "k_cache": "k_cache",
        "v_cache": "v_cache", "page_table": "page_table", "seq_len_kv": "cache_len",
    }  # fmt: skip
    d["nodes"].insert(0, append)
    return d


def test_a_decode_step_plan_builds_and_inspect_shows_nodes_splits_and_workspace():
    import json

    plan = decode_plan(build(parse_description(json.dumps(decode_step()), fmt="json")))
    assert [launch.node for launch in plan.launches] == ["append", "attn", "attn"]
    assert [s.name for s in plan.slots if s.is_output] == ["k_cache", "v_cache", "o", "lse"]
    text = json.dumps(plan_summary(plan))
    for word in ("kv_append", "sdpa_decode_paged", "sdpa_decode_combine", "splits", "attn.o_partial", "cache_len"):
        assert word in text, word


def test_the_caches_cannot_be_written_by_the_attention():
    d = decode_step()
    d["nodes"][1]["o"] = "k_cache"
    assert any("k_cache" in p.message for p in problems(d))


def _early_starts(d: dict[str, Any]) -> list[tuple[str, str, bool]]:
    plan = resolve(check(d))
    return [(launch.node, launch.variant.name.split(".")[0], launch.early) for launch in plan.launches]


def test_a_decode_step_starts_its_attention_and_combine_early():
    """The attention starts during its kv_append (it waits for it before the blocks with the new
    rows) and the combine during the attention (it waits at entry); the first launch never."""
    assert _early_starts(decode_step()) == [
        ("append", "kv_append", False),
        ("attn", "sdpa_decode_paged", True),
        ("attn", "sdpa_decode_combine", True),
    ]


def test_an_attention_alone_starts_at_once_only_its_combine_early():
    assert _early_starts(base(batch=2, max_pages=512)) == [
        ("attn", "sdpa_decode_paged", False),
        ("attn", "sdpa_decode_combine", True),
    ]


def test_an_attention_after_an_append_into_other_caches_waits_for_it():
    """An append whose caches the attention does not read writes something else: the attention
    would read it before its wait, so it is launched after the append has finished."""
    d = decode_step()
    for name in ("k_other", "v_other"):
        d["tensors"][name] = dict(d["tensors"]["k_cache"])
    d["nodes"][0]["k_cache"], d["nodes"][0]["v_cache"] = "k_other", "v_other"
    assert [early for _, _, early in _early_starts(d)] == [False, False, True]


def test_the_ctas_take_the_kv_heads_fastest_and_every_work_item_once():
    """In the order the hardware starts CTAs (x fastest), consecutive CTAs take one split of
    consecutive KV heads (NHD pages read by the heads together), and the (split, head) items
    are each taken once."""
    from frostc.kernels.sdpa_decode_paged import PagedDecode

    splits, head_rows = 6, 8
    started = [(x, y, 0) for y in range(head_rows) for x in range(splits)]  # x fastest
    taken = [PagedDecode._work_of(cta, head_rows, splits) for cta in started]
    assert taken[:3] == [(0, 0, 0), (0, 1, 0), (0, 2, 0)]
    assert sorted(taken) == sorted((s, h, 0) for s in range(splits) for h in range(head_rows))
