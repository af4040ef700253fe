"""Attention sinks (gpt-oss) on the CPU: the `sinks` key of an sdpa node (float32, one logit per
query head) in the forms that take it, the forms that refuse it by name, and what the plan and its
kernel record. The kernels' results against float64 are tests/gpu's (tests/gpu/cases.py,
`sink_cases`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from frost_runtime.schema import decode_plan

from frostc.build import build
from frostc.description import parse_description
from frostc.resolve import resolve
from tests.descriptions import check, edited, only, problems
from tests.test_mixed import base as mixed_base


def dense(**changes: Any) -> dict[str, Any]:
    """gpt-oss's attention at a small size: 8 query heads over 1 KV head, d 64, causal, a window of
    128, sinks and LSE."""
    d = {
        "format": 1,
        "name": "sinks",
        "tensors": {
            "q": {"dtype": "bf16", "dims": [2, 8, 300, 64], "layout": "bshd"},
            "k": {"dtype": "bf16", "dims": [2, 1, 300, 64], "layout": "bshd"},
            "v": {"dtype": "bf16", "dims": [2, 1, 300, 64], "layout": "bshd"},
            "o": {"dtype": "bf16", "dims": [2, 8, 300, 64], "layout": "bshd"},
            "lse": {"dtype": "fp32", "dims": [2, 8, 300]},
            "sinks": {"dtype": "fp32", "dims": [8]},
        },
        "nodes": [{"op": "sdpa", "q": "q", "k": "k", "v": "v", "o": "o", "lse": "lse", "sinks": "sinks",
                   "causal": True, "window_left": 127}],
    }  # fmt: skip
    return edited(d, **changes)


def test_sinks_reach_the_node_the_kernel_and_the_plan() -> None:
    graph = check(dense())
    assert graph.nodes[0].sinks == "sinks" and ("sinks", "sinks") in graph.nodes[0].inputs
    (launch,) = resolve(graph).launches
    assert launch.variant.sinks and launch.variant.name.endswith(".sinks.lse")
    plan = decode_plan(build(parse_description(json.dumps(dense()), fmt="json")))
    slot = next(i for i, s in enumerate(plan.slots) if s.name == "sinks")
    assert plan.nodes[0].slots["sinks"] == slot and plan.slots[slot].dtype == "fp32"
    assert [a for a in plan.launches[0].args if a.slot == slot and not a.tmap]  # a parameter: its pointer


def test_without_sinks_the_kernel_is_the_one_it_was() -> None:
    """The same node without sinks: the variant of before (its name, so its cubin: the goldens)."""
    graph = check(dense(**{"nodes.0.sinks": None, "tensors.sinks": None}))
    (launch,) = resolve(graph).launches
    assert not launch.variant.sinks and ".sinks" not in launch.variant.name


@pytest.mark.parametrize(
    "changes, path, words",
    [
        ({"tensors.sinks.dtype": "bf16"}, "tensors.sinks.dtype", ("fp32", "one per query head")),
        ({"tensors.sinks.dims": [1]}, "tensors.sinks.dims[0]", ("heads 1", "q's 8")),
        ({"nodes.0.sinks": "nowhere", "tensors.sinks": None}, "nodes[0].sinks", ("nowhere",)),
    ],
)
def test_bad_sinks_name_the_field(changes, path, words) -> None:
    only(dense(**changes), path, *words)


def test_e4m3_attention_refuses_sinks_by_name() -> None:
    d = dense(**{f"tensors.{t}.dtype": "e4m3" for t in ("q", "k", "v")})
    d = edited(d, **{f"tensors.{r}_descale": {"dtype": "fp32", "dims": [1]} for r in "qkv"})
    d = edited(d, **{f"nodes.0.{r}_descale": f"{r}_descale" for r in "qkv"})
    found = {p.path: p.message for p in problems(d)}
    assert "e4m3" in found["nodes[0].sinks"] and "remove sinks" in found["nodes[0].sinks"], found


def _with_sinks(d: dict[str, Any]) -> dict[str, Any]:
    heads = d["tensors"]["q"]["dims"][1]
    return edited(d, **{"tensors.sinks": {"dtype": "fp32", "dims": [heads]}, "nodes.0.sinks": "sinks"})


def test_every_launch_of_a_mixed_step_takes_the_sinks_where_its_rows_end() -> None:
    """A mixed step with its chunks apart: the decode kernel (unsplit: it adds the sinks itself)
    and the forward kernel over the pages; a decode-sized step split over its keys: the partials
    leave the sinks out and the combine adds them once."""
    plan = resolve(check(_with_sinks(mixed_base())))
    decodes, _, chunks = plan.launches
    assert decodes.variant.sinks and not decodes.variant.split and chunks.variant.sinks
    assert decodes.variant.name.endswith(".sinks.lse") and ".sinks" in chunks.variant.name
    split = resolve(check(_with_sinks(mixed_base(tokens=24, max_seqlen_q=4, max_pages=256))))
    attention, combine = split.launches
    assert attention.variant.split and not attention.variant.sinks  # partials without the sink
    assert combine.variant.sinks and combine.variant.name.endswith(".sinks.lse")
    without = resolve(check(mixed_base(tokens=24, max_seqlen_q=4, max_pages=256))).launches[0].variant
    assert attention.variant == without  # the same split kernel as without sinks


def test_an_e4m3_cache_refuses_sinks_by_name() -> None:
    d = _with_sinks(mixed_base())
    d = edited(d, **{"tensors.k_cache.dtype": "e4m3", "tensors.v_cache.dtype": "e4m3"})
    d = edited(d, **{f"tensors.{r}": {"dtype": "fp32", "dims": [1]} for r in ("k_scale", "v_scale")})
    d = edited(d, **{"nodes.0.k_scale": "k_scale", "nodes.0.v_scale": "v_scale"})
    found = {p.path: p.message for p in problems(d)}
    assert "e4m3 cache" in found["nodes[0].sinks"] and "remove sinks" in found["nodes[0].sinks"], found
