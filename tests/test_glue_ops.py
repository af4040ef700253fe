"""The glue ops (rms_norm, silu_mul: the decode step's work around attention, for fused layers):
their checks with field paths, their launches, a real offline compile, and `frostc from-config
--glue`. Numerics are tests/gpu/test_glue.py's business."""

from __future__ import annotations

import json
from typing import Any

import pytest
from frost_runtime.schema import decode_plan

from frostc.build import build
from frostc.description import parse_description
from frostc.errors import DescriptionError
from frostc.resolve import resolve
from tests.descriptions import check, edited, only, problems

M, N = 5, 4096


def norm(residual: bool = True) -> dict[str, Any]:
    rows = {"dtype": "bf16", "dims": [M, N]}
    tensors = {"x": dict(rows), "w": {"dtype": "bf16", "dims": [N]}, "y": dict(rows)}
    node = {"op": "rms_norm", "name": "norm", "x": "x", "weight": "w", "out": "y", "eps": 1e-5}
    if residual:
        tensors |= {"r": dict(rows), "r_out": dict(rows)}
        node |= {"residual": "r", "residual_out": "r_out"}
    return {"format": 1, "name": "norm", "tensors": tensors, "nodes": [node]}


def act(n: int = 14336) -> dict[str, Any]:
    return {
        "format": 1,
        "name": "act",
        "tensors": {"gu": {"dtype": "bf16", "dims": [M, 2 * n]}, "a": {"dtype": "bf16", "dims": [M, n]}},
        "nodes": [{"op": "silu_mul", "name": "act", "x": "gu", "out": "a"}],
    }


def declined(d: dict[str, Any], path: str, *words: str, alone: bool = True) -> None:
    """Valid, but resolving it finds a problem at `path` saying `words` (the only one if `alone`)."""
    with pytest.raises(DescriptionError) as e:
        resolve(check(d))
    found = e.value.problems
    assert [p.path for p in found] == [path] if alone else path in [p.path for p in found], found
    problem = next(p for p in found if p.path == path)
    for word in words:
        assert word in problem.message, problem


def test_valid_nodes_and_their_launches() -> None:
    (node,) = check(norm()).nodes
    assert (node.rows, node.n, node.eps) == (M, N, 1e-5)
    assert node.inputs == (("x", "x"), ("residual", "r"), ("weight", "w"))
    assert node.outputs == (("out", "y"), ("residual_out", "r_out"))
    plan = resolve(check(norm()))
    (launch,) = plan.launches
    assert launch.variant.name == "rms_norm.bf16.n4096.residual" and launch.grid == (M, 1, 1)
    (launch,) = resolve(check(norm(residual=False))).launches
    assert launch.variant.name == "rms_norm.bf16.n4096"
    (launch,) = resolve(check(act())).launches
    assert launch.variant.name == "silu_mul.bf16.n14336" and launch.grid == (M, 14, 1)


@pytest.mark.parametrize(
    "changes, path, words",
    [
        ({"nodes.0.eps": None}, "nodes[0].eps", ("missing", "rms_norm_eps")),
        ({"nodes.0.eps": -1.0}, "nodes[0].eps", ("> 0",)),
        ({"nodes.0.residual_out": None, "tensors.r_out": None}, "nodes[0].residual_out", ("residual is given", "both")),
        ({"tensors.w.dims": [N // 2]}, "tensors.w.dims[0]", ("row length 2048", "x's 4096")),
        ({"tensors.r.dims": [M + 1, N]}, "tensors.r.dims[0]", ("rows 6", "x's 5")),
        ({"tensors.y.dtype": "fp16"}, "tensors.y.dtype", ("does not match x's bf16",)),
        ({"tensors.x.dtype": "fp32"}, "tensors.x.dtype", ("bf16 or fp16", "fp32")),
        ({"tensors.x.dims": [M, 2, N // 2]}, "tensors.x.dims", ("(m, n)", "rank 2")),
    ],
)
def test_bad_norms_are_refused_naming_the_field(changes: dict, path: str, words: tuple) -> None:
    only(edited(norm(), **changes), path, *words)


def test_bad_activations_are_refused_naming_the_field() -> None:
    only(edited(act(), **{"tensors.a.dims": [M, 1000]}), "tensors.gu.dims[1]", "twice out's columns")
    only(edited(act(), **{"tensors.a.dims": [M + 1, 14336]}), "tensors.a.dims[0]", "rows 6", "x's 5")
    assert {p.path for p in problems(edited(act(), **{"tensors.a.dtype": "fp16"}))} == {"tensors.a.dtype"}


def test_what_the_kernels_do_not_take_is_declined_at_resolve() -> None:
    # one row: rows of 20 elements would also need row strides of whole 16-byte pieces
    declined(edited(norm(), **{"tensors.x.dims": [1, 20], "tensors.w.dims": [20], "tensors.y.dims": [1, 20],
                               "tensors.r.dims": [1, 20], "tensors.r_out.dims": [1, 20]}),
             "tensors.x.dims[1]", "multiple of 8")  # fmt: skip
    wide = 1 << 15
    declined(edited(norm(residual=False), **{"tensors.x.dims": [M, wide], "tensors.w.dims": [wide],
                                             "tensors.y.dims": [M, wide]}),
             "tensors.x.dims[1]", "at most 16384")  # fmt: skip
    transposed = edited(norm(), **{"tensors.x.strides": [1, M]})
    declined(transposed, "tensors.x.strides[1]", "row must be innermost", alone=False)
    declined(edited(act(12), **{"tensors.gu.dims": [1, 24], "tensors.a.dims": [1, 12]}), "tensors.gu.dims[1]",
             "multiple of 8")  # fmt: skip


def test_glue_plans_compile_offline_and_read_back() -> None:
    for d in (norm(), act(904)):
        data = decode_plan(build(parse_description(json.dumps(d), fmt="json")))
        (kernel,) = data.kernels
        assert kernel.cubin[:4] == b"\x7fELF" and data.launches[0].grid[0] == M


def test_from_config_builds_glue_plans_and_refuses_them_for_other_families(tmp_path) -> None:
    from tests.hf_models import TINY
    from tests.test_serving import frostc

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY["llama"]))
    shown = frostc("from-config", config, "--batch-sizes", "1,4", "--glue", "--qkv-layout", "fused", "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert "6 glue plans (rms_norm, add_rms_norm, silu_mul) for decode steps of 1, 4 rows" in shown.stdout
    assert "as views of one fused QKV buffer" in shown.stdout
    listed = json.loads(frostc("from-config", config, "--batch-sizes", "1,4", "--glue", "--dry-run", "--json").stdout)
    assert [g["key"] for g in listed["glue"]][:2] == ["glue-rms_norm-t1", "glue-rms_norm-t4"]
    config.write_text(json.dumps(TINY["gemma2"]))
    refused = frostc("from-config", config, "--glue", "--dry-run")
    assert refused.exit_code != 0 and "build this model's set without --glue" in refused.output
    config.write_text(json.dumps(TINY["llama"]))
    bad = frostc("from-config", config, "--qkv-layout", "interleaved", "--dry-run")
    assert bad.exit_code != 0 and "--qkv-layout" in bad.output
