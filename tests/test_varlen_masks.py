"""Variable-length forms (padded, packed) and masks (bottom-right causal, sliding window, softcap):
what validation makes of them, what it refuses (with the field path), and how resolution turns
them into launches: the scheduling kernel, the workspace's regions, the length contracts and
the attention kernel's arguments. No GPU; no compile except where named."""

from __future__ import annotations

from typing import Any

import pytest

from frostc.errors import DescriptionError, Problem
from frostc.kernels.sdpa_common import LOG2_E, MaskFlags
from frostc.resolve import resolve
from frostc.resolved import ResolvedPlan
from tests.descriptions import check, edited, only


def packed() -> dict[str, Any]:
    """A valid packed description: 3000 tokens of up to 8 sequences, GQA 16/4, d 128."""
    return {
        "format": 1,
        "name": "packed",
        "tensors": {
            "q": {"dtype": "bf16", "dims": [3000, 16, 128]},
            "k": {"dtype": "bf16", "dims": [2500, 4, 128]},
            "v": {"dtype": "bf16", "dims": [2500, 4, 128]},
            "o": {"dtype": "bf16", "dims": [3000, 16, 128]},
            "lse": {"dtype": "fp32", "dims": [3000, 16], "layout": "ht"},
            "cu_q": {"dtype": "int32", "dims": [9]},
            "cu_kv": {"dtype": "int32", "dims": [9]},
        },
        "nodes": [
            {
                "op": "sdpa", "name": "attn", "q": "q", "k": "k", "v": "v", "o": "o", "lse": "lse",
                "cu_seqlens_q": "cu_q", "cu_seqlens_kv": "cu_kv", "max_seqlen_q": 1024, "causal": True,
            }
        ],
    }  # fmt: skip


def padded() -> dict[str, Any]:
    """A valid padded description: 4 sequences of up to 512 query and 2048 key rows."""
    return {
        "format": 1,
        "name": "padded",
        "tensors": {
            "q": {"dtype": "fp16", "dims": [4, 8, 512, 64], "layout": "bshd"},
            "k": {"dtype": "fp16", "dims": [4, 8, 2048, 64], "layout": "bshd"},
            "v": {"dtype": "fp16", "dims": [4, 8, 2048, 64], "layout": "bshd"},
            "o": {"dtype": "fp16", "dims": [4, 8, 512, 64], "layout": "bshd"},
            "len_q": {"dtype": "int32", "dims": [4]},
            "len_kv": {"dtype": "int32", "dims": [4]},
        },
        "nodes": [
            {"op": "sdpa", "q": "q", "k": "k", "v": "v", "o": "o", "seq_len_q": "len_q", "seq_len_kv": "len_kv",
             "causal": True, "diagonal_alignment": "bottom_right", "window_left": 255, "softcap": 30.0}
        ],
    }  # fmt: skip


def resolved(d: dict[str, Any]) -> ResolvedPlan:
    return resolve(check(d))


def declined(d: dict[str, Any]) -> list[Problem]:
    graph = check(d)
    with pytest.raises(DescriptionError) as e:
        resolve(graph)
    return e.value.problems


# ---------------------------------------------------------------------------------------------
# What valid descriptions become


def test_packed_node_holds_capacities_and_lengths() -> None:
    (node,) = check(packed()).nodes
    assert node.form == "packed" and node.q_lengths == "cu_q" and node.kv_lengths == "cu_kv"
    assert (node.batch, node.heads_q, node.heads_kv, node.head_dim) == (8, 16, 4, 128)
    assert (node.seq_q, node.seq_kv, node.tokens_q, node.tokens_kv) == (1024, 2500, 3000, 2500)  # kv: all tokens
    assert node.mask.causal and node.mask.window_right == 0 and node.mask.alignment == "top_left"
    assert node.inputs == (("q", "q"), ("k", "k"), ("v", "v"), ("cu_seqlens_q", "cu_q"), ("cu_seqlens_kv", "cu_kv"))


def test_packed_lse_layout_uses_the_roles_letters() -> None:
    g = check(packed())
    assert g.tensor("lse").strides == (1, 3000)  # (t, h) stored h-major, FlashAttention's (h, t)
    assert g.tensor("q").strides == (16 * 128, 128, 1)


def test_padded_node_and_its_mask() -> None:
    (node,) = check(padded()).nodes
    assert node.form == "padded" and (node.seq_q, node.seq_kv) == (512, 2048)
    assert node.mask.flags == MaskFlags(right=True, left=True, bottom_right=True, softcap=True)
    assert (node.mask.window_left, node.mask.window_right, node.mask.softcap) == (255, 0, 30.0)


def test_padded_lengths_may_be_given_for_one_side() -> None:
    (node,) = check(edited(padded(), **{"nodes.0.seq_len_q": None, "tensors.len_q": None})).nodes
    assert node.q_lengths is None and node.kv_lengths == "len_kv"


def test_window_without_causal_and_bidirectional_windows() -> None:
    d = edited(padded(), **{"nodes.0.causal": None, "nodes.0.window_right": 16})
    assert check(d).nodes[0].mask.flags == MaskFlags(right=True, left=True, bottom_right=True, softcap=True)
    d = edited(padded(), **{"nodes.0.causal": None, "nodes.0.window_left": None, "nodes.0.diagonal_alignment": None})
    assert check(d).nodes[0].mask.flags == MaskFlags(softcap=True)


# ---------------------------------------------------------------------------------------------
# What validation refuses, by field


def test_forms_are_not_mixed() -> None:
    d = edited(packed(), **{"nodes.0.seq_len_q": "len"})
    d["tensors"]["len"] = {"dtype": "int32", "dims": [8]}
    with pytest.raises(DescriptionError) as e:
        check(d)
    assert any(p.path == "nodes[0].seq_len_q" and "not both" in p.message for p in e.value.problems)


def test_packed_needs_both_prefix_sums() -> None:
    d = edited(packed(), **{"nodes.0.cu_seqlens_kv": None, "tensors.cu_kv": None})
    only(d, "nodes[0].cu_seqlens_kv", "missing", "both cu_seqlens_q and cu_seqlens_kv")


def test_length_tensors_are_int32_of_the_batch() -> None:
    only(edited(packed(), **{"tensors.cu_kv.dtype": "fp32"}), "tensors.cu_kv.dtype", "int32")
    only(edited(packed(), **{"tensors.cu_kv.dims": [7]}), "tensors.cu_kv.dims[0]", "batch + 1 7", "cu_seqlens_q's 9")
    only(edited(padded(), **{"tensors.len_kv.dims": [5]}), "tensors.len_kv.dims[0]", "batch 5", "q's 4")
    only(edited(packed(), **{"tensors.cu_q.dims": [9, 1]}), "tensors.cu_q.dims", "(b + 1,)", "rank 1")


def test_packed_shapes() -> None:
    only(edited(packed(), **{"tensors.o.dims": [2999, 16, 128]}), "tensors.o.dims[0]", "tokens 2999", "q's 3000")
    only(edited(packed(), **{"tensors.v.dims": [2500, 2, 128]}), "tensors.v.dims[1]", "kv heads 2", "k's 4")
    only(edited(packed(), **{"tensors.lse.dims": [3000, 8]}), "tensors.lse.dims[1]", "heads 8", "q's 16")
    only(edited(packed(), **{"tensors.q.dims": [1, 3000, 16, 128]}), "tensors.q.dims", "(tq, hq, d)", "rank 3")


def test_packed_layout_letters() -> None:
    only(edited(packed(), **{"tensors.lse.layout": "bs"}), "tensors.lse.layout", 'not a permutation of "th"')
    d = edited(packed(), **{"tensors.q.layout": "htd"})
    assert check(d).tensor("q").strides == (128, 3000 * 128, 1)


def test_capacities() -> None:
    only(edited(packed(), **{"nodes.0.max_seqlen_q": 3001}), "nodes[0].max_seqlen_q", "3000 tokens")
    only(edited(packed(), **{"nodes.0.max_seqlen_q": 0}), "nodes[0].max_seqlen_q", "at least 1")
    only(edited(padded(), **{"nodes.0.max_seqlen_kv": 100}), "nodes[0].max_seqlen_kv", "packed form", "remove it")


def test_contradictory_and_idle_mask_keys() -> None:
    only(edited(padded(), **{"nodes.0.window_right": 8}), "nodes[0].window_right", "causal = true", "drop")
    assert check(edited(padded(), **{"nodes.0.window_right": 0})).nodes[0].mask.window_right == 0  # the same
    d = edited(padded(), **{"nodes.0.causal": None, "nodes.0.window_left": None})
    only(d, "nodes[0].diagonal_alignment", "does nothing", "causal = true")
    only(edited(padded(), **{"nodes.0.window_left": -1}), "nodes[0].window_left", "at least 0")
    only(edited(padded(), **{"nodes.0.diagonal_alignment": "left"}), "nodes[0].diagonal_alignment", "top_left")
    only(edited(padded(), **{"nodes.0.softcap": 0.0}), "nodes[0].softcap", "> 0")
    only(edited(padded(), **{"nodes.0.softcap": "50"}), "nodes[0].softcap", "expected a float")


def test_unknown_key_is_suggested_from_the_ops_keys() -> None:
    only(edited(packed(), **{"nodes.0.cu_seqlen_q": "cu_q"}), "nodes[0].cu_seqlen_q", "did you mean 'cu_seqlens_q'")


# ---------------------------------------------------------------------------------------------
# Resolution: launches, workspace, contracts


def test_packed_resolves_to_a_schedule_and_an_attention_launch() -> None:
    plan = resolved(packed())
    assert [s.name for s in plan.slots] == ["q", "k", "v", "cu_q", "cu_kv", "o", "lse"]
    schedule, attention = plan.launches
    assert schedule.variant.name == "sdpa_schedule.packed.m128n128.causal" and schedule.grid == (1, 1, 1)
    assert attention.variant.name == "sdpa_fwd_wgmma.bf16.d128.causal.varlen.lse"
    units = min(8 * 8, (3000 + 8 * 127) // 128)  # per-sequence bound, token bound
    assert attention.grid == (units * 16, 1, 1)
    assert [(r.name, r.offset, r.bytes) for r in plan.workspace] == [
        ("attn.sequences", 0, 16 * 8), ("attn.tiles", 256, 8 * units), ("attn.tile_count", 512, 4),
    ]  # fmt: skip
    assert plan.workspace_bytes == 516


def test_the_two_launches_share_the_workspace_regions() -> None:
    schedule, attention = resolved(packed()).launches
    s = {a.param: a for a in schedule.args}
    a = {x.param: x for x in attention.args}
    assert (s["sequences"].workspace, s["units"].workspace, s["tile_count"].workspace) == (0, 256, 512)
    assert (a["sequences"].workspace, a["tiles"].workspace, a["tile_count"].workspace) == (0, 256, 512)
    assert (s["q_lengths"].slot, s["kv_lengths"].slot) == (3, 4)
    assert {x.param: x.value for x in schedule.args if x.kind == "i32"} == {
        "batch": 8, "q_capacity": 3000, "kv_capacity": 2500, "max_seqlen_q": 1024, "max_seqlen_kv": 2500,
        "unit_capacity": 31, "heads_q": 16, "window_left": 0, "window_right": 0,
    }  # fmt: skip


def test_packed_attention_arguments() -> None:
    attention = resolved(packed()).launches[1]
    values = {a.param: a.value for a in attention.args if a.slot < 0 and a.workspace < 0}
    assert values["q.extents"] == 16 and values["k.extents"] == values["v.extents"] == 4  # heads: ragged maps
    assert (values["q.rows_per_batch"], values["k.rows_per_batch"]) == (0, 0)
    assert [values[f"o.stride_{x}"] for x in "bhs"] == [0, 128, 16 * 128]  # packed: no batch stride
    assert [values[f"lse.stride_{x}"] for x in "bhs"] == [0, 3000, 1]


def test_padded_attention_arguments() -> None:
    plan = resolved(padded())
    attention = plan.launches[1]
    values = {a.param: a.value for a in attention.args if a.slot < 0 and a.workspace < 0}
    assert values["q.rows_per_batch"] == 512 and values["k.rows_per_batch"] == 2048  # bshd: b stride / s stride
    assert (values["window_left"], values["window_right"]) == (255, 0)
    assert values["scale_log2"] == 30.0 * LOG2_E and values["score_scale"] == pytest.approx(0.125 / 30.0)
    assert attention.variant.name == "sdpa_fwd_wgmma.fp16.d64.local_br.softcap.varlen"
    assert plan.launches[0].variant.name == "sdpa_schedule.padded.q+kv.m128n128.local_br"


def test_length_contracts() -> None:
    assert [(c.slot, c.kind, c.longest, c.total) for c in resolved(packed()).lengths] == [
        (3, "offsets", 1024, 3000), (4, "offsets", 2500, 2500),
    ]  # fmt: skip
    assert [(c.slot, c.kind, c.longest) for c in resolved(padded()).lengths] == [
        (3, "lengths", 512),
        (4, "lengths", 2048),
    ]


def test_dense_masks_resolve_to_one_launch() -> None:
    d = edited(padded(), **{"nodes.0.seq_len_q": None, "nodes.0.seq_len_kv": None, "tensors.len_q": None,
                             "tensors.len_kv": None})  # fmt: skip
    plan = resolved(d)
    (launch,) = plan.launches
    assert launch.variant.name == "sdpa_fwd_wgmma.fp16.d64.local_br.softcap" and plan.workspace_bytes == 0
    assert plan.lengths == ()


def test_padded_rows_must_be_whole_rows_apart() -> None:
    d = edited(padded(), **{f"tensors.{t}.layout": "sbhd" for t in ("q", "k", "v")})
    found = declined(d)
    assert {p.path for p in found} == {"tensors.q.strides[0]", "tensors.k.strides[0]", "tensors.v.strides[0]"}
    assert "whole rows between sequences" in found[0].message


def test_length_tensors_must_be_contiguous() -> None:
    d = edited(packed(), **{"tensors.cu_q.strides": [2]})
    (problem,) = declined(d)
    assert problem.path == "tensors.cu_q.strides[0]" and "contiguous" in problem.message


def test_tokens_over_int32_are_declined_with_the_path() -> None:
    d = edited(packed(), **{"tensors.q.dims": [1 << 31, 16, 128], "tensors.o.dims": [1 << 31, 16, 128],
                             "tensors.lse": None, "nodes.0.lse": None})  # fmt: skip
    (problem,) = declined(d)
    assert problem.path == "tensors.q.dims[0]" and "int32" in problem.message


def test_dense_tile_count_over_int32_is_declined_not_a_traceback() -> None:
    d = edited(padded(), **{"nodes.0.seq_len_q": None, "nodes.0.seq_len_kv": None, "tensors.len_q": None,
                             "tensors.len_kv": None, "tensors.q.dims": [65536, 8, 1 << 20, 64],
                             "tensors.o.dims": [65536, 8, 1 << 20, 64], "tensors.k.dims": [65536, 8, 64, 64],
                             "tensors.v.dims": [65536, 8, 64, 64]})  # fmt: skip
    found = declined(d)
    assert any(p.path == "tensors.q.dims" and "tiles" in p.message for p in found)
