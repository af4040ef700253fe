"""Stage 1: parsing descriptions as written, the builder, and the TOML/JSON writers."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest

from frostc.description import (
    Description,
    GraphBuilder,
    NodeDecl,
    TensorDecl,
    load_description,
    parse_description,
    to_json,
    to_toml,
)
from frostc.errors import DescriptionError, Problem

TOY_TOML = """
format = 1
name = "toy"

[tensors.q]
dtype = "bf16"
dims = [1, 8, 128, 64]
layout = "bshd"

[tensors.k]
dtype = "bf16"
dims = [1, 2, 128, 64]
strides = [16384, 64, 128, 1]
uid = 7
io = "input"

[[nodes]]
op = "sdpa"
q = "q"
k = "k"
v = "k"
o = "o"
causal = true
attn_scale = 0.125
"""


def toy_builder() -> GraphBuilder:
    g = GraphBuilder("toy", target="sm_90a")
    g.tensor("q", dtype="bf16", dims=(1, 8, 128, 64), layout="bshd")
    g.tensor("k", dtype="bf16", dims=[1, 2, 128, 64], strides=[16384, 64, 128, 1], uid=3)
    g.tensor("v", dtype="bf16", dims=(1, 2, 128, 64), io="input")
    g.tensor("o", dtype="bf16", dims=(1, 8, 128, 64), layout="bshd")
    g.tensor("lse", dtype="fp32", dims=(1, 8, 128))
    g.sdpa(q="q", k="k", v="v", o="o", lse="lse", causal=True, attn_scale=0.1, inference=False, name="attn")
    return g


def test_parse_toml_keeps_values_as_written() -> None:
    desc = parse_description(TOY_TOML)
    assert desc.format == 1
    assert desc.name == "toy"
    assert desc.target is None  # no default filled in at this stage
    assert [t.name for t in desc.tensors] == ["q", "k"]
    q, k = desc.tensors
    assert q == TensorDecl(name="q", dtype="bf16", dims=(1, 8, 128, 64), layout="bshd")
    assert k.strides == (16384, 64, 128, 1) and k.uid == 7 and k.io == "input"
    keys = (("q", "q"), ("k", "k"), ("v", "k"), ("o", "o"), ("causal", True), ("attn_scale", 0.125))
    assert desc.nodes == (NodeDecl(op="sdpa", keys=keys),)
    assert desc.nodes[0].get("causal") is True and desc.nodes[0].get("lse") is None


def test_parse_keeps_unknown_keys_and_wrong_types_for_stage_2() -> None:
    text = 'format = "1"\nnmae = "x"\n[tensors.q]\ndtpye = "bf16"\ndims = 4\n[[nodes]]\ncasual = true\n'
    desc = parse_description(text)
    assert desc.format == "1"
    assert desc.extra == (("nmae", "x"),)
    assert desc.tensors[0].extra == (("dtpye", "bf16"),)
    assert desc.tensors[0].dims == 4
    assert desc.nodes[0].keys == (("casual", True),)  # which keys a node may hold is its op's business


def test_parse_json_equals_toml() -> None:
    from_toml = parse_description(TOY_TOML)
    text = json.dumps(from_toml.to_dict())
    assert parse_description(text) == from_toml  # detected by the leading "{"
    assert parse_description(text, filename="x.json") == from_toml
    assert parse_description(text, fmt="json") == from_toml


def test_json_null_is_absent() -> None:
    desc = parse_description('{"format": 1, "target": null, "tensors": {"q": {"uid": null}}, "nodes": null}')
    assert desc.target is None and desc.tensors[0].uid is None and desc.nodes == ()


def test_round_trip_builder_toml() -> None:
    desc = toy_builder().build()
    text = to_toml(desc)
    assert parse_description(text) == desc
    assert parse_description(text).to_dict() == desc.to_dict()


def test_round_trip_builder_json() -> None:
    desc = toy_builder().build()
    assert parse_description(to_json(desc)) == desc
    assert json.loads(to_json(desc)) == desc.to_dict()


def test_round_trip_odd_values() -> None:
    # Escapes, quoted keys, floats and values of unknown keys must survive the TOML emitter too.
    desc = Description(
        format=1,
        name='we"ird\\name\n\t\x01\x7f é',
        tensors=(TensorDecl(name="has space", dims=(1, 2), extra=(("nested", {"a b": (1, 2.5)}),)),),
        nodes=(NodeDecl(op="sdpa", keys=(("attn_scale", 1e-20), ("big", 1e300), ("neg", -0.5))),),
        extra=(("empty", {}), ("flags", (True, False))),
    )
    assert parse_description(to_toml(desc)) == desc
    inf = Description(nodes=(NodeDecl(keys=(("attn_scale", math.inf),)),))
    assert parse_description(to_toml(inf)) == inf


def test_builder_matches_file() -> None:
    g = GraphBuilder("toy")
    g.tensor("q", dtype="bf16", dims=(1, 8, 128, 64), layout="bshd")
    g.tensor("k", dtype="bf16", dims=(1, 2, 128, 64), strides=(16384, 64, 128, 1), uid=7, io="input")
    assert g.sdpa(q="q", k="k", v="k", o="o", causal=True, attn_scale=0.125) == "sdpa0"
    assert g.build() == parse_description(TOY_TOML)


def test_builder_returns_names_and_rejects_duplicates() -> None:
    g = GraphBuilder("toy")
    assert g.tensor("q", dtype="bf16", dims=(1, 1, 1, 1)) == "q"
    assert g.sdpa(q="q", k="q", v="q", o="o", name="attn") == "attn"
    with pytest.raises(DescriptionError) as e:
        g.tensor("q", dtype="bf16", dims=(1, 1, 1, 1))
    assert e.value.problems[0].path == "tensors.q"


def test_toml_syntax_error_names_file_and_position() -> None:
    with pytest.raises(DescriptionError) as e:
        parse_description('format = 1\nname = "x\n', filename="bad.toml")
    (problem,) = e.value.problems
    assert problem.path == "bad.toml"
    assert "invalid TOML" in problem.message and "line 2" in problem.message
    assert str(e.value).startswith("bad.toml: invalid TOML")


def test_json_syntax_error_and_duplicate_key() -> None:
    with pytest.raises(DescriptionError) as e:
        parse_description('{"format": 1,\n "name": }', filename="bad.json")
    assert e.value.problems[0].path == "bad.json"
    assert "line 2, column" in e.value.problems[0].message
    with pytest.raises(DescriptionError) as e:
        parse_description('{"tensors": {"q": {}, "q": {}}}')
    assert '"q" appears twice' in e.value.problems[0].message


def test_wrong_top_level_types_are_parse_errors() -> None:
    with pytest.raises(DescriptionError) as e:
        parse_description("[1, 2]", fmt="json", filename="f.json")
    assert e.value.problems == [Problem("f.json", "the top level must be a table, got an array")]

    with pytest.raises(DescriptionError) as e:
        parse_description('tensors = 3\n[nodes]\nop = "sdpa"\n')
    paths = [p.path for p in e.value.problems]
    assert paths == ["tensors", "nodes"]  # all reported, not only the first
    assert "[[nodes]], not [nodes]" in e.value.problems[1].message

    with pytest.raises(DescriptionError) as e:
        parse_description('nodes = [1]\n[tensors]\nq = "bf16"\n')
    assert [p.path for p in e.value.problems] == ["tensors.q", "nodes[0]"]


def test_load_description(tmp_path: Path) -> None:
    path = tmp_path / "toy.toml"
    path.write_text("\ufeff" + TOY_TOML, encoding="utf-8")  # a BOM is tolerated
    assert load_description(path) == parse_description(TOY_TOML)
    with pytest.raises(DescriptionError) as e:
        load_description(tmp_path / "missing.toml")
    assert e.value.problems[0].path.endswith("missing.toml")
    assert "cannot read" in e.value.problems[0].message


def test_description_error_renders_one_problem_per_line_and_pickles() -> None:
    err = DescriptionError([Problem("a", "one"), Problem("b.c[1]", "two"), Problem("a", "one")])
    assert str(err) == "a: one\nb.c[1]: two"  # repeats dropped
    again = pickle.loads(pickle.dumps(err))
    assert again.problems == err.problems and str(again) == str(err)


def test_unknown_fmt_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        parse_description("", fmt="yaml")
