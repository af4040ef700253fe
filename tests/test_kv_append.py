"""The kv_append op (paged KV cache, decode): its checks with their field paths, the tensors it
updates in place (the generic "update" access of frostc.validate), its launch and arguments, and
a real offline compile of its kernel. Numerics are tests/gpu's business."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from frost_runtime.schema import decode_plan

from frostc import ops
from frostc.build import build
from frostc.compile import compile_kernels
from frostc.contexts import ResolveContext
from frostc.description import parse_description
from frostc.errors import DescriptionError
from frostc.inspect import plan_summary
from frostc.kernels.kv_append import KvAppendVariant
from frostc.resolve import resolve
from frostc.resolved import LengthContract
from tests.descriptions import check, edited, only, problems

PAGES, PAGE, HKV, D, B, MAX_PAGES = 40, 16, 2, 64, 3, 8


def base() -> dict[str, Any]:
    """A valid append of 2 new tokens to 3 sequences (bf16, 2 kv heads, d 64, pages of 16)."""
    cache = {"dtype": "bf16", "dims": [PAGES, PAGE, HKV, D]}
    return {
        "format": 1,
        "name": "decode",
        "tensors": {
            "k_new": {"dtype": "bf16", "dims": [B, HKV, 2, D], "layout": "bshd"},
            "v_new": {"dtype": "bf16", "dims": [B, HKV, 2, D], "layout": "bshd"},
            "k_cache": dict(cache),
            "v_cache": dict(cache),
            "page_table": {"dtype": "int32", "dims": [B, MAX_PAGES]},
            "cache_len": {"dtype": "int32", "dims": [B]},
        },
        "nodes": [
            {
                "op": "kv_append", "name": "append", "k": "k_new", "v": "v_new", "k_cache": "k_cache",
                "v_cache": "v_cache", "page_table": "page_table", "seq_len_kv": "cache_len",
            }
        ],
    }  # fmt: skip


def tweak(**changes: Any) -> dict[str, Any]:
    return edited(base(), **changes)


def resolved(d: dict[str, Any]):
    return resolve(check(d))


def declined(d: dict[str, Any]) -> list:
    graph = check(d)  # valid: only the kernel support is lacking
    with pytest.raises(DescriptionError) as e:
        resolve(graph)
    return e.value.problems


def only_declined(d: dict[str, Any], path: str, *words: str) -> None:
    found = declined(d)
    assert [p.path for p in found] == [path], found
    for word in words:
        assert word in found[0].message, found[0]


# ---------------------------------------------------------------------------------- the node


def test_valid_node() -> None:
    g = check(base())
    (node,) = g.nodes
    assert node.op == "kv_append" and node.name == "append" and node.path == "nodes[0]"
    assert (node.batch, node.heads_kv, node.s_new, node.head_dim) == (B, HKV, 2, D)
    assert (node.pages, node.page_size, node.max_pages, node.capacity) == (PAGES, PAGE, MAX_PAGES, PAGE * MAX_PAGES)
    assert node.inputs == (("k", "k_new"), ("v", "v_new"), ("page_table", "page_table"), ("seq_len_kv", "cache_len"))
    assert node.outputs == (("k_cache", "k_cache"), ("v_cache", "v_cache"))
    # the caches are updated in place: outputs of the plan; the rest is read
    assert {t.name: t.is_output for t in g.tensors} == {
        "k_new": False, "v_new": False, "k_cache": True, "v_cache": True, "page_table": False, "cache_len": False,
    }  # fmt: skip
    assert g.tensor("k_new").strides == (2 * HKV * D, D, HKV * D, 1)  # letters "bhsd", layout "bshd"


@pytest.mark.parametrize(
    "changes, path, words",
    [
        ({"tensors.k_new.dtype": "fp32"}, "tensors.k_new.dtype", ("bf16 or fp16", "fp32", 'dtype = "bf16"')),
        ({"tensors.v_new.dtype": "fp16"}, "tensors.v_new.dtype", ("does not match k's bf16", 'dtype = "bf16"')),
        ({"tensors.k_cache.dtype": "fp16"}, "tensors.k_cache.dtype", ("does not match k's bf16", "caches")),
        ({"tensors.v_cache.dtype": "int32"}, "tensors.v_cache.dtype", ("v_cache must be bf16 or fp16 or e4m3",)),
        ({"tensors.page_table.dtype": "fp32"}, "tensors.page_table.dtype", ("page ids", "int32")),
        ({"tensors.cache_len.dtype": "bf16"}, "tensors.cache_len.dtype", ("sequence lengths", "int32")),
        ({"tensors.k_new.dims": [B, HKV, D]}, "tensors.k_new.dims", ("(b, hkv, s_new, d)", "rank 4", "rank 3")),
        ({"tensors.k_cache.dims": [PAGES, PAGE, HKV * D]}, "tensors.k_cache.dims", ("(pages, page_size, hkv, d)",)),
        ({"tensors.page_table.dims": [B * MAX_PAGES]}, "tensors.page_table.dims", ("(b, max_pages)", "rank 2")),
        ({"tensors.cache_len.dims": [B, 1]}, "tensors.cache_len.dims", ("(b,)", "rank 1")),
        ({"tensors.v_new.dims": [B, 4, 2, D]}, "tensors.v_new.dims[1]", ("kv heads 4", "k's 2", "make them equal")),
        ({"tensors.v_new.dims": [B, HKV, 1, D]}, "tensors.v_new.dims[2]", ("new tokens 1", "k's 2")),
        ({"tensors.k_cache.dims": [PAGES, PAGE, 4, D]}, "tensors.k_cache.dims[2]", ("kv heads 4", "k's 2")),
        ({"tensors.v_cache.dims": [PAGES, PAGE, HKV, 128]}, "tensors.v_cache.dims[3]", ("head dim 128", "k's 64")),
        ({"tensors.v_cache.dims": [PAGES + 1, PAGE, HKV, D]}, "tensors.v_cache.dims[0]", ("pages 41", "k_cache's 40")),
        ({"tensors.v_cache.dims": [PAGES, 32, HKV, D]}, "tensors.v_cache.dims[1]", ("page size 32", "k_cache's 16")),
        ({"tensors.page_table.dims": [4, MAX_PAGES]}, "tensors.page_table.dims[0]", ("batch 4", "k's 3")),
        ({"tensors.cache_len.dims": [4]}, "tensors.cache_len.dims[0]", ("batch 4", "k's 3")),
        ({"nodes.0.page_table": None, "tensors.page_table": None}, "nodes[0].page_table", ("missing", "max_pages)")),
        ({"nodes.0.seq_len_kv": "nope", "tensors.cache_len": None}, "nodes[0].seq_len_kv", ('no tensor named',)),
        ({"nodes.0.causal": True}, "nodes[0].causal", ("unknown key 'causal'", "page_table")),
    ],
)  # fmt: skip
def test_each_bad_input_is_one_problem_at_its_path(changes: dict, path: str, words: tuple[str, ...]) -> None:
    only(tweak(**changes), path, *words)


def test_more_than_16_new_tokens() -> None:
    d = tweak(**{"tensors.k_new.dims": [B, HKV, 17, D], "tensors.v_new.dims": [B, HKV, 17, D]})
    only(d, "tensors.k_new.dims[2]", "17 new tokens", "1 (decode) to 16", "speculative decoding", "steps")
    d = tweak(**{"tensors.k_new.dims": [B, HKV, 16, D], "tensors.v_new.dims": [B, HKV, 16, D]})
    assert check(d).nodes[0].s_new == 16


@pytest.mark.parametrize("page_size", [8, 24, 272, 512])
def test_page_size_a_multiple_of_16_up_to_256(page_size: int) -> None:
    dims = [PAGES, page_size, HKV, D]
    d = tweak(**{"tensors.k_cache.dims": dims, "tensors.v_cache.dims": dims})
    only(d, "tensors.k_cache.dims[1]", f"page size {page_size}", "multiple of 16", "at most 256")


@pytest.mark.parametrize("page_size", [16, 48, 256])
def test_supported_page_sizes(page_size: int) -> None:
    dims = [PAGES, page_size, HKV, D]
    assert check(tweak(**{"tensors.k_cache.dims": dims, "tensors.v_cache.dims": dims})).nodes[0].page_size == page_size


def test_every_problem_is_reported_at_once() -> None:
    d = tweak(**{"tensors.k_new.dtype": "fp32", "tensors.cache_len.dims": [4], "tensors.page_table.dtype": "int64"})
    paths = {p.path for p in problems(d)}
    assert {"tensors.k_new.dtype", "tensors.cache_len.dims[0]", "tensors.page_table.dtype"} <= paths


# ----------------------------------------------------------------- the update access (generic)


def test_one_cache_for_k_and_v_is_refused() -> None:
    d = tweak(**{"nodes.0.v_cache": "k_cache", "tensors.v_cache": None})
    only(d, "nodes[0].v_cache", "tensor 'k_cache'", "updated in place by nodes[0].k_cache", "own tensor")


def test_a_node_cannot_read_what_it_updates() -> None:
    # the cache as this node's k too: reading it would race with the update (other problems follow: shapes)
    d = tweak(**{"nodes.0.k": "k_cache", "tensors.k_new": None})
    found = problems(d)
    assert "nodes[0].k" in {p.path for p in found}
    assert any("updated in place by nodes[0].k_cache" in p.message for p in found if p.path == "nodes[0].k")


@dataclass(frozen=True)
class _Touch:
    """A node of the stand-in op below: reads `src`, writes `dst`, updates `acc` (any may be absent)."""

    op: ClassVar[str] = "touch"
    name: str
    path: str
    roles: tuple[tuple[str, str, str], ...]  # (role, tensor, access)

    @property
    def inputs(self) -> tuple[tuple[str, str], ...]:
        return tuple((r, t) for r, t, access in self.roles if access == "read")

    @property
    def outputs(self) -> tuple[tuple[str, str], ...]:
        return tuple((r, t) for r, t, access in self.roles if access != "read")


def _validate_touch(ctx) -> _Touch | None:
    """The generic uses alone, without any op's own checks: every tensor is 4-D, "pshd"."""
    roles = []
    for role, access in (("src", "read"), ("dst", "write"), ("acc", "update")):
        dims = "(pages, page_size, hkv, d)"
        c = ctx.tensor(
            role, letters="pshd", dims=dims, output=access == "write", updated=access == "update", required=False
        )
        if c is not None:
            roles.append((role, ctx.value(role), access))
    return _Touch(ctx.name, ctx.path, tuple(roles))


@pytest.fixture
def touch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ops.OPS, "touch", SimpleNamespace(KEYS=("src", "dst", "acc"), validate=_validate_touch))


def _with_touch(d: dict[str, Any], first: bool = False, **roles: str) -> dict[str, Any]:
    d["tensors"].setdefault("out", {"dtype": "bf16", "dims": [PAGES, PAGE, HKV, D]})
    d["nodes"].insert(0 if first else len(d["nodes"]), {"op": "touch", "name": "touch"} | roles)
    return d


@pytest.mark.parametrize("first", [False, True])
def test_an_updated_tensor_may_be_read_by_other_nodes_before_or_after(touch, first: bool) -> None:
    g = check(_with_touch(base(), first=first, src="k_cache", dst="out"))
    assert g.tensor("k_cache").is_output and g.tensor("v_cache").is_output and g.tensor("out").is_output
    assert not g.tensor("k_new").is_output


def test_an_updated_tensor_cannot_be_written_by_another_node(touch) -> None:
    d = _with_touch(base(), dst="k_cache")
    del d["tensors"]["out"]
    only(d, "nodes[1].dst", "tensor 'k_cache'", "updated in place (nodes[0].k_cache)", "its own tensor")
    d = _with_touch(base(), first=True, dst="v_cache")  # written first, then updated: still refused
    del d["tensors"]["out"]
    only(d, "nodes[0].dst", "updated in place (nodes[1].v_cache)")


def test_a_node_cannot_read_or_write_what_it_updates(touch) -> None:
    d = _with_touch(base(), acc="out", src="out")
    only(d, "nodes[1].src", "tensor 'out'", "updated in place by nodes[1].acc of the same node")
    d = _with_touch(base(), acc="out", dst="out")
    only(d, "nodes[1].dst", "updated in place by nodes[1].acc")


def test_the_existing_errors_stay(touch) -> None:
    d = _with_touch(base(), src="out", dst="out")
    only(d, "nodes[1].dst", "input (nodes[1].src) and an output", "cannot be both")
    d = _with_touch(base(), dst="k_new")
    d["tensors"]["k_new"]["dims"] = [PAGES, PAGE, HKV, D]
    assert "cannot be both" in {p.path: p.message for p in problems(d)}["nodes[1].dst"]


def test_two_nodes_may_update_the_same_tensor(touch) -> None:
    d = base()
    d["tensors"] |= {"k2": dict(d["tensors"]["k_new"]), "v2": dict(d["tensors"]["v_new"])}
    d["nodes"].append(d["nodes"][0] | {"name": "again", "k": "k2", "v": "v2"})
    g = check(_with_touch(d, acc="k_cache", src="out"))
    assert [n.name for n in g.nodes] == ["append", "again", "touch"] and g.tensor("k_cache").is_output
    assert not g.tensor("out").is_output


def test_io_of_an_updated_tensor() -> None:
    assert check(tweak(**{"tensors.k_cache.io": "output"})).tensor("k_cache").is_output
    only(
        tweak(**{"tensors.k_cache.io": "input"}),
        "tensors.k_cache.io",
        'io = "input"',
        "updated in place (nodes[0].k_cache)",
        'write io = "output"',
    )
    only(tweak(**{"tensors.k_new.io": "output"}), "tensors.k_new.io", "used as an input")


def test_updated_tensors_must_not_overlap() -> None:
    d = tweak(**{"tensors.k_cache.strides": [PAGE * HKV * D, HKV * D, 8, 1]})  # heads 8 apart, rows 64 long
    only(d, "tensors.k_cache.strides", "overlap", "dim 2 (h, extent 2)")


# ------------------------------------------------------------------------ kernel support


def test_head_dim_must_be_supported() -> None:
    d = base()
    for t in ("k_new", "v_new", "k_cache", "v_cache"):
        d["tensors"][t]["dims"][3] = 80
    only_declined(d, "tensors.k_new.dims[3]", "head dim 80", "64, 96, 128, 256")


def test_head_dim_innermost() -> None:
    found = {p.path: p.message for p in declined(tweak(**{"tensors.k_new.layout": "bsdh"}))}
    assert "innermost" in found["tensors.k_new.strides[3]"] and "stride 2" in found["tensors.k_new.strides[3]"]


def test_strides_are_multiples_of_8() -> None:
    d = tweak(**{"tensors.v_new.layout": None, "tensors.v_new.strides": [2 * 2 * 68, 68, 2 * 68, 1]})
    only_declined(d, "tensors.v_new.strides[1]", "stride 68 of dim h", "multiple of 8", "16 bytes")
    d = tweak(**{"tensors.v_cache.strides": [PAGE * HKV * 72 + 4, HKV * 72, 72, 1]})
    only_declined(d, "tensors.v_cache.strides[0]", "dim p", "multiple of 8")


def test_a_dim_of_extent_1_may_have_any_stride() -> None:
    d = tweak(**{"tensors.k_new.dims": [B, HKV, 1, D], "tensors.v_new.dims": [B, HKV, 1, D]})
    d = edited(d, **{"tensors.k_new.layout": None, "tensors.k_new.strides": [HKV * D, D, 3, 1]})
    (launch,) = resolved(d).launches
    values = {a.param: a.value for a in launch.args if a.slot < 0}
    assert values["k.stride_s"] == 0  # never stepped along: 0 holds the kernel's 16-byte assumption


def test_page_table_rows_contiguous() -> None:
    d = tweak(**{"tensors.page_table.strides": [1, B]})
    only_declined(d, "tensors.page_table.strides[1]", "stride 3", "contiguous")
    one_page = tweak(**{"tensors.page_table.dims": [B, 1], "tensors.page_table.strides": [1, 7]})
    assert resolved(one_page).launches


def test_lengths_contiguous() -> None:
    only_declined(tweak(**{"tensors.cache_len.strides": [2]}), "tensors.cache_len.strides[0]", "contiguous")


def test_capacity_fits_int32() -> None:
    d = tweak(**{"tensors.page_table.dims": [B, 1 << 27]})
    only_declined(d, "tensors.page_table.dims[1]", f"{1 << 31} tokens", "int32", f"at most {(2**31 - 1) // 16}")


def test_page_ids_fit_int32() -> None:
    dims = [1 << 31, PAGE, HKV, D]
    only_declined(tweak(**{"tensors.k_cache.dims": dims, "tensors.v_cache.dims": dims}), "tensors.k_cache.dims[0]",
                  "int32 page ids")  # fmt: skip


# ------------------------------------------------------------------------------ resolution


def test_launch_and_arguments() -> None:
    plan = resolved(base())
    assert [s.name for s in plan.slots] == ["k_new", "v_new", "page_table", "cache_len", "k_cache", "v_cache"]
    assert [s.is_output for s in plan.slots] == [False, False, False, False, True, True]
    (launch,) = plan.launches
    assert launch.node == "append" and launch.grid == (B, 2, 1)  # one CTA per (sequence, new token)
    assert launch.variant == KvAppendVariant("bf16", D, "bf16") and launch.variant.name == "kv_append.bf16.d64"
    slots = {a.param: plan.slots[a.slot].name for a in launch.args if a.slot >= 0}
    assert slots == {
        "k": "k_new", "v": "v_new", "k_cache": "k_cache", "v_cache": "v_cache", "page_table": "page_table",
        "seq_len_kv": "cache_len",
    }  # fmt: skip
    values = {a.param: a.value for a in launch.args if a.slot < 0}
    sizes = ("heads_kv", "s_new", "pages", "page_size", "max_pages")
    strides = [
        f"{t}.stride_{x}" for t, xs in (("k", "bhs"), ("v", "bhs"), ("k_cache", "psh"), ("v_cache", "psh")) for x in xs
    ]
    assert list(values) == [*sizes, *strides, "page_table.stride_b"]
    assert [values[p] for p in sizes] == [HKV, 2, PAGES, PAGE, MAX_PAGES]
    assert [values[f"k.stride_{x}"] for x in "bhs"] == [2 * HKV * D, D, HKV * D]  # bshd
    assert [values[f"v_cache.stride_{x}"] for x in "psh"] == [PAGE * HKV * D, HKV * D, D]
    assert values["page_table.stride_b"] == MAX_PAGES
    assert [(c.slot, c.kind, c.longest, c.total) for c in plan.lengths] == [(3, "lengths", PAGE * MAX_PAGES, 0)]
    assert plan.workspace_bytes == 0


def test_fp16_and_head_dim_pick_the_variant() -> None:
    d = tweak(**{f"tensors.{t}.dtype": "fp16" for t in ("k_new", "v_new", "k_cache", "v_cache")})
    for t in ("k_new", "v_new", "k_cache", "v_cache"):
        d["tensors"][t]["dims"][3] = 256
    assert resolved(d).launches[0].variant == KvAppendVariant("fp16", 256, "fp16")


def test_nodes_sharing_lengths_keep_one_contract() -> None:
    d = base()
    for t in ("k_new", "v_new", "k_cache", "v_cache"):
        d["tensors"][f"{t}2"] = dict(d["tensors"][t])
    d["nodes"].append(
        d["nodes"][0] | {"name": "layer2", "k": "k_new2", "v": "v_new2", "k_cache": "k_cache2", "v_cache": "v_cache2"}
    )
    plan = resolved(d)
    assert [launch.node for launch in plan.launches] == ["append", "layer2"]
    assert [(c.slot, c.kind, c.longest) for c in plan.lengths] == [(3, "lengths", PAGE * MAX_PAGES)]


def test_length_contracts_of_one_slot_merge_to_the_tightest() -> None:
    ctx = ResolveContext(check(base()), {s.name: s for s in resolved(base()).slots})
    ctx.length_contract("cache_len", "lengths", 128)
    ctx.length_contract("cache_len", "lengths", 128)  # an exact duplicate
    assert ctx.lengths == [LengthContract(3, "lengths", 128, 0)]
    ctx.length_contract("cache_len", "lengths", 64)
    ctx.length_contract("cache_len", "lengths", 256)
    assert ctx.lengths == [LengthContract(3, "lengths", 64, 0)]
    ctx.length_contract("page_table", "offsets", 10, 100)
    ctx.length_contract("page_table", "offsets", 20, 50)
    assert ctx.lengths[1:] == [LengthContract(2, "offsets", 10, 50)]


# ----------------------------------------------------------------------- build and compile


@pytest.fixture(scope="module")
def plan():
    return decode_plan(build(parse_description(_toml(), fmt="toml")))


def _toml() -> str:
    return """
format = 1
name = "decode-append"
[tensors.k_new]
dtype = "bf16"
dims = [32, 8, 1, 128]
layout = "bshd"
[tensors.v_new]
dtype = "bf16"
dims = [32, 8, 1, 128]
layout = "bshd"
[tensors.k_cache]
dtype = "bf16"
dims = [24576, 16, 8, 128]
[tensors.v_cache]
dtype = "bf16"
dims = [24576, 16, 8, 128]
[tensors.page_table]
dtype = "int32"
dims = [32, 768]
[tensors.cache_len]
dtype = "int32"
dims = [32]
[[nodes]]
op = "kv_append"
name = "append"
k = "k_new"
v = "v_new"
k_cache = "k_cache"
v_cache = "v_cache"
page_table = "page_table"
seq_len_kv = "cache_len"
"""


def test_build_gives_one_kernel_one_launch(plan) -> None:
    (kernel,) = plan.kernels
    assert kernel.name == "kv_append.bf16.d128" and kernel.cubin.startswith(b"\x7fELF")
    assert kernel.entry.encode() in kernel.cubin
    assert tuple((p.name, p.kind) for p in kernel.params) == KvAppendVariant("bf16", 128, "bf16").params
    assert kernel.block == (128, 1, 1) and kernel.smem_bytes == 0 and kernel.ctas_per_sm == 0
    assert kernel.grid_rule.startswith("(batch, s_new, 1)")
    (launch,) = plan.launches
    assert launch.node == "append" and launch.grid == (32, 1, 1)
    assert [s.name for s in plan.slots] == ["k_new", "v_new", "page_table", "cache_len", "k_cache", "v_cache"]
    assert plan.workspace_bytes == 0


def test_inspect_shows_the_node(plan) -> None:
    summary = plan_summary(plan)
    (launch,) = summary["launches"]
    assert launch["node"] == "append" and launch["kernel"] == "kv_append.bf16.d128"
    assert launch["args"]["k_cache"] == "slot 4 (k_cache)" and launch["args"]["seq_len_kv"] == "slot 3 (cache_len)"
    assert launch["args"]["k_cache.stride_p"] == 16 * 8 * 128
    assert [s["io"] for s in summary["slots"]] == ["input"] * 4 + ["output"] * 2
    assert summary["lengths"] == [{"slot": 3, "name": "cache_len", "kind": "lengths", "longest": 768 * 16, "total": 0}]


@pytest.mark.parametrize("dtype, head_dim", [("fp16", 64), ("bf16", 256)])
def test_other_variants_compile(dtype: str, head_dim: int) -> None:
    variant = KvAppendVariant(dtype, head_dim, dtype)
    (compiled,) = compile_kernels([variant]).values()  # the ABI is checked against the PTX
    assert compiled.params == variant.params and compiled.cubin.startswith(b"\x7fELF")
