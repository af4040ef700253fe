"""Stage 2: every validation rule, with the path and the key words of its message."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from frostc.description import GraphBuilder, load_description, parse_description
from frostc.errors import DescriptionError
from frostc.validate import overlapping_dim, strides_from_layout, validate
from tests.descriptions import check, edited, only, problems

EXAMPLES = Path(__file__).resolve().parent.parent / "plans" / "examples"


def base() -> dict[str, Any]:
    """A valid description as plain data: GQA 8/2 heads, with lse; tests break one thing each."""
    return {
        "format": 1,
        "name": "toy",
        "tensors": {
            "q": {"dtype": "bf16", "dims": [2, 8, 128, 64], "layout": "bshd"},
            "k": {"dtype": "bf16", "dims": [2, 2, 256, 64], "layout": "bshd"},
            "v": {"dtype": "bf16", "dims": [2, 2, 256, 64], "layout": "bshd"},
            "o": {"dtype": "bf16", "dims": [2, 8, 128, 64], "layout": "bshd"},
            "lse": {"dtype": "fp32", "dims": [2, 8, 128]},
        },
        "nodes": [{"op": "sdpa", "q": "q", "k": "k", "v": "v", "o": "o", "lse": "lse"}],
    }


def tweak(**changes: Any) -> dict[str, Any]:
    """base() with dotted-path changes, e.g. tweak(**{"tensors.k.dims": [...]}); None deletes."""
    return edited(base(), **changes)


# ---------------------------------------------------------------------------------------------
# What a valid description becomes


def test_valid_description_resolves_defaults() -> None:
    g = check(base())
    assert g.name == "toy" and g.target == "sm_90a"
    assert [t.name for t in g.tensors] == ["q", "k", "v", "o", "lse"]
    assert [t.is_output for t in g.tensors] == [False, False, False, True, True]
    assert g.tensor("lse").strides == (1024, 128, 1)  # contiguous when neither layout nor strides
    assert g.tensor("q").path == "tensors.q" and g.tensor("q").uid is None
    (node,) = g.nodes
    assert node.name == "sdpa0" and node.path == "nodes[0]"
    assert node.attn_scale == pytest.approx(1 / math.sqrt(64))
    assert node.causal is False and node.inference is True and node.lse == "lse"
    assert (node.batch, node.heads_q, node.heads_kv, node.seq_q, node.seq_kv, node.head_dim) == (2, 8, 2, 128, 256, 64)
    with pytest.raises(KeyError):
        g.tensor("nope")


def test_given_values_are_kept() -> None:
    d = tweak(**{"nodes.0.attn_scale": 1, "nodes.0.causal": True, "nodes.0.inference": False, "nodes.0.name": "attn"})
    d["tensors"]["q"]["uid"] = 5
    d["tensors"]["o"]["io"] = "output"
    d["tensors"]["q"]["io"] = "input"
    g = check(d)
    node = g.nodes[0]
    assert node.attn_scale == 1.0 and isinstance(node.attn_scale, float)  # int accepted where float expected
    assert node.causal is True and node.inference is False and node.name == "attn"
    assert g.tensor("q").uid == 5


@pytest.mark.parametrize(
    ("layout", "strides"),
    [
        ("bhsd", (8 * 128 * 64, 128 * 64, 64, 1)),
        ("bshd", (128 * 8 * 64, 64, 8 * 64, 1)),
        ("sbhd", (8 * 64, 64, 2 * 8 * 64, 1)),
    ],
)
def test_layout_to_strides(layout: str, strides: tuple[int, ...]) -> None:
    dims = (2, 8, 128, 64)  # (b, h, s, d)
    assert strides_from_layout(dims, layout) == strides
    d = tweak(**{"tensors.q.layout": layout})
    assert check(d).tensor("q").strides == strides


def test_lse_layout_and_explicit_strides() -> None:
    assert strides_from_layout((2, 8, 128), "sbh") == (8, 1, 16)
    d = tweak(**{"tensors.lse.layout": "bsh", "tensors.q.layout": None, "tensors.q.strides": [0, 64, 512, 1]})
    g = check(d)
    assert g.tensor("lse").strides == (1024, 1, 8)
    assert g.tensor("q").strides == (0, 64, 512, 1)  # inputs may broadcast (stride 0)


def test_gqa_and_mqa_are_accepted() -> None:
    for hkv in (8, 4, 2, 1):  # MHA, GQA, GQA, MQA
        d = tweak(**{"tensors.k.dims": [2, hkv, 256, 64], "tensors.v.dims": [2, hkv, 256, 64]})
        assert check(d).nodes[0].heads_kv == hkv


def test_builder_description_validates() -> None:
    g = GraphBuilder("toy")
    g.tensor("q", dtype="fp16", dims=(1, 4, 16, 32))
    g.tensor("k", dtype="fp16", dims=(1, 1, 16, 32))
    g.tensor("v", dtype="fp16", dims=(1, 1, 16, 32))
    g.tensor("o", dtype="fp16", dims=(1, 4, 16, 32), layout="bshd")
    g.sdpa(q="q", k="k", v="v", o="o", causal=True)
    graph = validate(g.build())
    assert graph.nodes[0].causal and graph.tensor("o").strides == (4 * 16 * 32, 32, 4 * 32, 1)


@pytest.mark.parametrize("name", ["default.toml", "mqa_d64.toml", "varlen_packed.toml"])
def test_examples_validate(name: str) -> None:
    g = validate(load_description(EXAMPLES / name))
    assert g.name == name.removesuffix(".toml")


def test_example_contents() -> None:
    default = validate(load_description(EXAMPLES / "default.toml"))
    node = default.nodes[0]
    assert (node.batch, node.heads_q, node.heads_kv, node.seq_q, node.seq_kv, node.head_dim) == (
        2,
        16,
        4,
        1024,
        1024,
        128,
    )
    assert node.causal and node.lse is not None and default.tensor("q").dtype == "bf16"
    assert default.tensor("q").strides == strides_from_layout((2, 16, 1024, 128), "bshd")
    mqa = validate(load_description(EXAMPLES / "mqa_d64.toml"))
    node = mqa.nodes[0]
    assert (node.batch, node.heads_q, node.heads_kv, node.seq_q, node.seq_kv, node.head_dim) == (1, 8, 1, 128, 1000, 64)
    assert not node.causal and node.lse is None and mqa.tensor("q").dtype == "fp16"


# ---------------------------------------------------------------------------------------------
# The top level


def test_format_missing_wrong_type_and_unknown() -> None:
    only(tweak(format=None), "format", "missing", "format = 1")
    only(tweak(format=True), "format", "expected an int", "bool")
    only(tweak(format=2), "format", "unknown format version 2", "only 1")


def test_name_rules() -> None:
    only(tweak(name=None), "name", "missing")
    only(tweak(name=3), "name", "expected a string")
    only(tweak(name=""), "name", "not valid", "A-Z a-z 0-9 . _ -")
    only(tweak(name="my graph"), "name", "not valid")


def test_target_rules() -> None:
    only(tweak(target="sm_80"), "target", '"sm_80" is not supported', 'only "sm_90a" is supported now')
    only(tweak(target=90), "target", "expected a string")
    assert check(tweak(target="sm_90a")).target == "sm_90a"


def test_unknown_keys_name_the_key_suggest_and_list_valid_keys() -> None:
    p = only(tweak(**{"tensors.q.dtpye": "bf16"}), "tensors.q.dtpye", "unknown key 'dtpye'", "did you mean 'dtype'")
    assert "valid keys: dtype, dims, layout, strides, uid, io" in p.message
    only(tweak(**{"nodes.0.casual": True}), "nodes[0].casual", "did you mean 'causal'", "attn_scale")
    only(tweak(nmae="x"), "nmae", "unknown key", "did you mean 'name'", "format, name, target, tensors, nodes")
    only(tweak(**{"tensors.q.zzz": 1}), "tensors.q.zzz", "unknown key 'zzz'; valid keys")


def test_typo_in_file_reports_at_its_path() -> None:
    text = (EXAMPLES / "default.toml").read_text().replace("causal = true", "casual = true")
    with pytest.raises(DescriptionError) as e:
        validate(parse_description(text))
    assert str(e.value).startswith("nodes[0].casual: unknown key 'casual' (did you mean 'causal'?)")


# ---------------------------------------------------------------------------------------------
# Tensors on their own


def test_tensor_name_must_be_an_identifier() -> None:
    d = base()
    d["tensors"]["1q"] = d["tensors"].pop("q")
    d["nodes"][0]["q"] = "1q"
    only(d, "tensors.1q", "not valid", "not starting with a digit")


def test_dtype_rules() -> None:
    only(tweak(**{"tensors.lse.dtype": None}), "tensors.lse.dtype", "missing", '"bf16", "fp16", "fp32"')
    only(tweak(**{"tensors.lse.dtype": "fp64"}), "tensors.lse.dtype", 'unknown dtype "fp64"', '"fp32"')
    only(tweak(**{"tensors.lse.dtype": 32}), "tensors.lse.dtype", "expected a string")


def test_dims_rules() -> None:
    only(tweak(**{"tensors.q.dims": None}), "tensors.q.dims", "missing")
    only(tweak(**{"tensors.q.dims": 4}), "tensors.q.dims", "expected an array of positive ints")
    only(tweak(**{"tensors.lse.dims": [2, 0, 128]}), "tensors.lse.dims[1]", "must be positive", "0")
    only(tweak(**{"tensors.lse.dims": [2, 8, True]}), "tensors.lse.dims[2]", "expected a positive int", "bool")
    only(tweak(**{"tensors.lse.dims": [2, 8, 128.0]}), "tensors.lse.dims[2]", "expected a positive int", "float")


def test_rank_depends_on_role() -> None:
    d = tweak(**{"tensors.q.dims": [2, 8, 128], "tensors.q.layout": None})
    only(d, "tensors.q.dims", "q dims must be (b, hq, sq, d)", "rank 4", "got rank 3")
    only(tweak(**{"tensors.lse.dims": [2, 8, 128, 1]}), "tensors.lse.dims", "(b, hq, sq)", "rank 3", "got rank 4")


def test_layout_rules() -> None:
    only(tweak(**{"tensors.q.layout": "bshx"}), "tensors.q.layout", 'not a permutation of "bhsd"')
    only(tweak(**{"tensors.q.layout": "bsd"}), "tensors.q.layout", "not a permutation", "(b, hq, sq, d)")
    only(tweak(**{"tensors.lse.layout": "bshd"}), "tensors.lse.layout", 'not a permutation of "bhs"')
    only(tweak(**{"tensors.q.layout": 1}), "tensors.q.layout", "expected a string")


def test_layout_and_strides_are_exclusive() -> None:
    only(tweak(**{"tensors.q.strides": [65536, 64, 512, 1]}), "tensors.q", "both layout and strides", "exactly one")


def test_strides_rules() -> None:
    d = tweak(**{"tensors.q.layout": None, "tensors.q.strides": [1, 2, 3]})
    only(d, "tensors.q.strides", "3 entries but dims has 4")
    d = tweak(**{"tensors.q.layout": None, "tensors.q.strides": [65536, -1, 512, 1]})
    only(d, "tensors.q.strides[1]", "must be non-negative", "-1")
    d = tweak(**{"tensors.q.layout": None, "tensors.q.strides": [65536, 64, "512", 1]})
    only(d, "tensors.q.strides[2]", "expected a non-negative int", "string")


def test_output_strides_must_not_overlap() -> None:
    d = tweak(**{"tensors.o.layout": None, "tensors.o.strides": [65536, 64, 64, 1]})  # h and s collide
    only(d, "tensors.o.strides", "overlap", "output 'o'", "stride 64")
    d = tweak(**{"tensors.lse.strides": [1024, 0, 1]})
    only(d, "tensors.lse.strides", "overlap", "dim 1 (h, extent 8) has stride 0")
    # Extent-1 dims are exempt, and the same strides are fine on an input.
    d = tweak(
        **{
            "tensors.o.dims": [1, 8, 128, 64],
            "tensors.q.dims": [1, 8, 128, 64],
            "tensors.k.dims": [1, 2, 256, 64],
            "tensors.v.dims": [1, 2, 256, 64],
            "tensors.lse.dims": [1, 8, 128],
            "tensors.o.layout": None,
            "tensors.o.strides": [0, 64, 512, 1],
        }
    )
    check(d)
    check(tweak(**{"tensors.k.layout": None, "tensors.k.strides": [0, 0, 64, 1]}))


def test_overlapping_dim() -> None:
    assert overlapping_dim((2, 3, 4), (12, 4, 1)) is None
    assert overlapping_dim((2, 3, 4), (12, 3, 1)) == 1
    assert overlapping_dim((2, 3, 4), (1, 2, 8)) is None  # strides needn't follow dim order
    assert overlapping_dim((4, 3, 2), (1, 8, 2)) == 2  # found in stride order, not dim order
    assert overlapping_dim((1, 3, 4), (0, 4, 1)) is None


def test_uid_rules() -> None:
    only(tweak(**{"tensors.q.uid": 0}), "tensors.q.uid", "must be positive")
    only(tweak(**{"tensors.q.uid": True}), "tensors.q.uid", "expected a positive int")
    only(tweak(**{"tensors.q.uid": 3, "tensors.o.uid": 3}), "tensors.o.uid", "uid 3 is already used by tensors.q")


def test_io_rules() -> None:
    only(tweak(**{"tensors.q.io": "output"}), "tensors.q.io", 'io = "output"', "used as an input", "nodes[0].q")
    only(tweak(**{"tensors.lse.io": "input"}), "tensors.lse.io", "used as an output", "nodes[0].lse")
    only(tweak(**{"tensors.o.io": "out"}), "tensors.o.io", 'unknown io "out"', '"input", "output"')


# ---------------------------------------------------------------------------------------------
# Nodes and how they use tensors


def test_node_count() -> None:
    only(tweak(nodes=[]), "nodes", "no nodes", "[[nodes]]")  # and unused tensors go unmentioned
    only(tweak(nodes=None, tensors=None), "nodes", "no nodes")


def test_several_nodes_run_in_order_with_distinct_names() -> None:
    d = base()
    d["nodes"].append(dict(d["nodes"][0], o="o2", lse="lse2"))
    d["tensors"]["o2"] = d["tensors"]["o"]
    d["tensors"]["lse2"] = d["tensors"]["lse"]
    g = check(d)
    assert [n.name for n in g.nodes] == ["sdpa0", "sdpa1"]
    d["nodes"][1]["name"] = "sdpa0"
    only(d, "nodes[1].name", "'sdpa0' is already used by nodes[0]")


def test_op_rules() -> None:
    only(tweak(**{"nodes.0.op": "matmul"}), "nodes[0].op", 'unknown op "matmul"', 'known ops: "sdpa"')
    only(tweak(**{"nodes.0.op": None}), "nodes[0].op", "missing", "sdpa")


def test_node_name_must_be_a_non_empty_string() -> None:
    only(tweak(**{"nodes.0.name": ""}), "nodes[0].name", "non-empty string")


def test_unknown_tensor_reference_lists_declared() -> None:
    p = only(tweak(**{"nodes.0.k": "kk"}, **{"tensors.k": None}), "nodes[0].k", 'no tensor named "kk"')
    assert "declared tensors: q, v, o, lse" in p.message


def test_missing_required_reference() -> None:
    d = tweak(**{"nodes.0.v": None, "tensors.v": None})
    only(d, "nodes[0].v", "missing", "v tensor")
    only(tweak(**{"nodes.0.q": 1, "tensors.q": None}), "nodes[0].q", "expected a tensor name", "int 1")


def test_unused_tensor() -> None:
    d = base()
    d["tensors"]["spare"] = {"dtype": "bf16", "dims": [1]}
    only(d, "tensors.spare", "not used by any node")


def test_tensor_both_input_and_output() -> None:
    d = tweak(**{"nodes.0.o": "q", "tensors.o": None})
    only(d, "nodes[0].o", "tensor 'q'", "input (nodes[0].q)", "output", "cannot be both")


def test_tensor_in_two_output_roles() -> None:
    d = tweak(**{"nodes.0.lse": "o", "tensors.lse": None})
    found = problems(d)
    by_path = {p.path: p.message for p in found}
    assert "already an output (nodes[0].o)" in by_path["nodes[0].lse"]
    assert "rank 3" in by_path["tensors.o.dims"]  # o can't also have lse's shape


def test_same_input_in_several_roles_is_fine() -> None:
    d = tweak(**{"nodes.0.k": "x", "nodes.0.v": "x", "tensors.k": None, "tensors.v": None})
    d["tensors"]["x"] = {"dtype": "bf16", "dims": [2, 2, 256, 64]}
    assert check(d).nodes[0].k == "x"


def test_attn_scale_rules() -> None:
    only(tweak(**{"nodes.0.attn_scale": 0}), "nodes[0].attn_scale", "finite and > 0", "got 0")
    only(tweak(**{"nodes.0.attn_scale": -0.5}), "nodes[0].attn_scale", "> 0")
    d = parse_description(json.dumps(base()).replace('"lse"}]', '"lse", "attn_scale": Infinity}]'), fmt="json")
    with pytest.raises(DescriptionError) as e:
        validate(d)
    assert e.value.problems[0].path == "nodes[0].attn_scale" and "finite" in e.value.problems[0].message
    only(tweak(**{"nodes.0.attn_scale": True}), "nodes[0].attn_scale", "expected a float", "bool")
    only(tweak(**{"nodes.0.attn_scale": "0.1"}), "nodes[0].attn_scale", "expected a float", "string")


def test_bool_flags_reject_other_types() -> None:
    only(tweak(**{"nodes.0.causal": 1}), "nodes[0].causal", "expected a bool", "int 1")
    only(tweak(**{"nodes.0.inference": "no"}), "nodes[0].inference", "expected a bool")


def test_training_requires_lse() -> None:
    d = tweak(**{"nodes.0.inference": False, "nodes.0.lse": None, "tensors.lse": None})
    only(d, "nodes[0].lse", "inference = false", "requires lse")
    assert check(tweak(**{"nodes.0.lse": None, "tensors.lse": None})).nodes[0].lse is None


# ---------------------------------------------------------------------------------------------
# sdpa shapes and dtypes


def test_head_dim_mismatch_message() -> None:
    d = tweak(
        **{
            "tensors.q.dims": [2, 8, 128, 128],
            "tensors.o.dims": [2, 8, 128, 128],
            "tensors.v.dims": [2, 2, 256, 128],
            "tensors.k.dims": [2, 2, 256, 96],
        }
    )
    p = only(d, "tensors.k.dims[3]")
    assert str(p) == "tensors.k.dims[3]: head dim 96 does not match q's 128"


def test_batch_must_match() -> None:
    only(tweak(**{"tensors.v.dims": [3, 2, 256, 64]}), "tensors.v.dims[0]", "batch 3 does not match q's 2")
    only(tweak(**{"tensors.lse.dims": [1, 8, 128]}), "tensors.lse.dims[0]", "batch 1", "q's 2")


def test_k_and_v_agree() -> None:
    d = tweak(**{"tensors.v.dims": [2, 1, 256, 64]})
    only(d, "tensors.v.dims[1]", "kv heads 1 does not match k's 2")
    only(tweak(**{"tensors.v.dims": [2, 2, 255, 64]}), "tensors.v.dims[2]", "kv sequence length 255", "k's 256")


def test_a_v_head_dim_apart_from_q_is_only_a_supported_pair() -> None:
    d = tweak(**{"tensors.v.dims": [2, 2, 256, 128], "tensors.o.dims": [2, 8, 128, 128]})
    only(d, "tensors.v.dims[3]", "v head dim 128 with q/k head dim 64 is not supported", "pairs (q/k, v): (192, 128)")


def test_o_and_lse_shapes_follow_q() -> None:
    only(tweak(**{"tensors.o.dims": [2, 4, 128, 64]}), "tensors.o.dims[1]", "heads 4 does not match q's 8")
    only(tweak(**{"tensors.o.dims": [2, 8, 64, 64]}), "tensors.o.dims[2]", "sequence length 64", "q's 128")
    only(tweak(**{"tensors.o.dims": [2, 8, 128, 32]}), "tensors.o.dims[3]", "head dim 32 does not match v's 64")
    only(tweak(**{"tensors.lse.dims": [2, 16, 128]}), "tensors.lse.dims[1]", "heads 16", "q's 8")
    only(tweak(**{"tensors.lse.dims": [2, 8, 256]}), "tensors.lse.dims[2]", "sequence length 256", "q's 128")


def test_gqa_needs_divisible_heads() -> None:
    d = tweak(**{"tensors.k.dims": [2, 3, 256, 64], "tensors.v.dims": [2, 3, 256, 64]})
    only(d, "tensors.k.dims[1]", "GQA needs hq % hkv == 0", "8 % 3 = 2", "q has 8 heads and k has 3")
    d = tweak(**{"tensors.k.dims": [2, 16, 256, 64], "tensors.v.dims": [2, 16, 256, 64]})
    only(d, "tensors.k.dims[1]", "GQA", "8 % 16")


def test_sdpa_dtypes() -> None:
    d = tweak(**{f"tensors.{t}.dtype": "fp32" for t in ("q", "k", "v", "o")})
    found = problems(d)
    assert [p.path for p in found] == [f"tensors.{t}.dtype" for t in ("q", "k", "v", "o")]
    assert 'sdpa q must be bf16 or fp16, got "fp32"' in found[0].message
    only(tweak(**{"tensors.v.dtype": "fp16"}), "tensors.v.dtype", "fp16 does not match q's bf16", "one dtype")
    only(tweak(**{"tensors.lse.dtype": "bf16"}), "tensors.lse.dtype", "lse must be fp32", '"bf16"')
    fp16 = tweak(**{f"tensors.{t}.dtype": "fp16" for t in ("q", "k", "v", "o")})
    assert check(fp16).tensor("q").dtype == "fp16"


# ---------------------------------------------------------------------------------------------
# All problems at once


def test_every_problem_is_reported() -> None:
    d = tweak(
        **{
            "format": 2,
            "target": "sm_80",
            "tensors.q.dtpye": "bf16",
            "tensors.k.dims": [2, 2, 256, 96],
            "tensors.v.dtype": "fp16",
            "tensors.o.io": "input",
            "nodes.0.causal": "yes",
            "nodes.0.attn_scale": -1.0,
            "nodes.0.lse": "lsee",
        }
    )
    with pytest.raises(DescriptionError) as e:
        check(d)
    paths = [p.path for p in e.value.problems]
    assert sorted(paths) == sorted(
        [
            "format",
            "target",
            "tensors.q.dtpye",
            "nodes[0].lse",
            "nodes[0].attn_scale",
            "nodes[0].causal",
            "tensors.k.dims[3]",
            "tensors.v.dtype",
            "tensors.o.io",
            "tensors.lse",  # unused now that the node names "lsee"
        ]
    )
    lines = str(e.value).splitlines()
    assert len(lines) == len(paths)
    assert all(line.startswith(f"{p.path}: ") for line, p in zip(lines, e.value.problems, strict=True))


def test_one_bad_field_does_not_cascade() -> None:
    # q's dims are unusable, so nothing that compares against q is reported too.
    only(tweak(**{"tensors.q.dims": [2, 8, "x", 64]}), "tensors.q.dims[2]", "expected a positive int")


def test_an_e4m3_dense_q_without_descales_names_each_missing_one() -> None:
    desc = GraphBuilder("fp8_dense")
    for name in ("q", "k", "v"):
        desc.tensor(name, dtype="e4m3", dims=(1, 4, 64, 128))
    desc.tensor("o", dtype="bf16", dims=(1, 4, 64, 128))
    desc.sdpa(q="q", k="k", v="v", o="o")
    with pytest.raises(DescriptionError) as err:
        validate(desc.build())
    paths = [p.path for p in err.value.problems]
    assert paths == ["nodes[0].q_descale", "nodes[0].k_descale", "nodes[0].v_descale"]
    assert all("missing" in p.message and "(1,)" in p.message for p in err.value.problems)
