"""kv_append's ragged forms on the CPU: packed (cu_seqlens_q, with page_table and seq_len_kv) and
slots (vLLM's slot_mapping). Their refusals with field paths, their launch (one CTA per token)
and arguments by name, their length contracts, their node records through the plan format, the
early start of an attention behind them, the offline compile (the ABI checked against the PTX)
and a deterministic build. The rows form is tests/test_kv_append.py's; numerics are
tests/gpu/test_append.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from frost_runtime import schema, workload
from frost_runtime.schema import PlanFormatError, decode_plan, encode_plan

from frostc.build import build
from frostc.compile import compile_kernels
from frostc.description import parse_description
from frostc.errors import DescriptionError
from frostc.kernels.kv_append import KvAppendVariant
from frostc.kernels.launch_order import WAITS_FOR_NEW_ROWS
from frostc.resolve import mark_early_starts, resolve
from frostc.resolved import Arg, ResolvedLaunch
from tests.descriptions import check, edited, only, problems

PAGES, PAGE, HKV, D, B, MAX_PAGES, TOKENS = 40, 16, 2, 64, 3, 8, 50
ROOT = Path(__file__).resolve().parent.parent


def _caches(d: dict[str, Any], dtype: str = "bf16") -> None:
    for name in ("k_cache", "v_cache"):
        d["tensors"][name] = {"dtype": dtype, "dims": [PAGES, PAGE, HKV, D]}


def packed() -> dict[str, Any]:
    """A valid packed append: 50 tokens of 3 sequences (bf16, 2 kv heads, d 64, pages of 16)."""
    d: dict[str, Any] = {"format": 1, "name": "mixed-append", "tensors": {}}
    for name in ("k_new", "v_new"):
        d["tensors"][name] = {"dtype": "bf16", "dims": [TOKENS, HKV, D]}
    _caches(d)
    d["tensors"] |= {
        "page_table": {"dtype": "int32", "dims": [B, MAX_PAGES]},
        "cache_len": {"dtype": "int32", "dims": [B]},
        "cu_q": {"dtype": "int32", "dims": [B + 1]},
    }
    d["nodes"] = [
        {
            "op": "kv_append", "name": "append", "k": "k_new", "v": "v_new", "k_cache": "k_cache",
            "v_cache": "v_cache", "page_table": "page_table", "seq_len_kv": "cache_len", "cu_seqlens_q": "cu_q",
        }
    ]  # fmt: skip
    return d


def slots() -> dict[str, Any]:
    """A valid slots append: 50 tokens, each to the cache row its slot_mapping entry names."""
    d: dict[str, Any] = {"format": 1, "name": "slot-append", "tensors": {}}
    for name in ("k_new", "v_new"):
        d["tensors"][name] = {"dtype": "bf16", "dims": [TOKENS, HKV, D]}
    _caches(d)
    d["tensors"]["slots"] = {"dtype": "int32", "dims": [TOKENS]}
    d["nodes"] = [
        {
            "op": "kv_append", "name": "append", "k": "k_new", "v": "v_new", "k_cache": "k_cache",
            "v_cache": "v_cache", "slot_mapping": "slots",
        }
    ]  # fmt: skip
    return d


def declined(d: dict[str, Any], path: str, *words: str) -> None:
    graph = check(d)  # valid: only the kernel support is lacking
    with pytest.raises(DescriptionError) as e:
        resolve(graph)
    found = e.value.problems
    assert [p.path for p in found] == [path], found
    for word in words:
        assert word in found[0].message, found[0]


def _args(launch) -> tuple[dict[str, str], dict[str, Any]]:
    """(param -> slot name, param -> constant) of a launch, in parameter order."""
    return (
        {a.param: a.slot for a in launch.args if a.slot >= 0},
        {a.param: a.value for a in launch.args if a.slot < 0},
    )


# ---------------------------------------------------------------------------------- the nodes


def test_the_keys_choose_the_form() -> None:
    (node,) = check(packed()).nodes
    assert node.form == "packed" and (node.batch, node.tokens, node.heads_kv, node.head_dim) == (B, TOKENS, HKV, D)
    assert (node.pages, node.page_size, node.max_pages, node.s_new) == (PAGES, PAGE, MAX_PAGES, 0)
    assert node.inputs == (
        ("k", "k_new"), ("v", "v_new"), ("page_table", "page_table"), ("seq_len_kv", "cache_len"),
        ("cu_seqlens_q", "cu_q"),
    )  # fmt: skip
    (node,) = check(slots()).nodes
    assert node.form == "slots" and (node.tokens, node.batch, node.max_pages) == (TOKENS, 0, 0)
    assert node.inputs == (("k", "k_new"), ("v", "v_new"), ("slot_mapping", "slots"))
    assert node.page_table is None and node.seq_len_kv is None


def test_a_packed_sequence_may_append_more_than_16_tokens() -> None:
    assert check(edited(packed(), **{"tensors.k_new.dims": [4096, HKV, D], "tensors.v_new.dims": [4096, HKV, D]}))


@pytest.mark.parametrize(
    "make, changes, path, words",
    [
        # packed: the dims that must agree, the dtypes, the keys it needs
        (packed, {"tensors.cu_q.dims": [B]}, "tensors.cu_q.dims[0]", ("b + 1 prefix sums", "page_table's batch is 3",
                                                                     "dims = [4]")),
        (packed, {"tensors.cu_q.dtype": "fp32"}, "tensors.cu_q.dtype", ("prefix sums", "int32")),
        (packed, {"tensors.v_new.dims": [TOKENS - 1, HKV, D]}, "tensors.v_new.dims[0]", ("tokens 49", "k's 50")),
        (packed, {"tensors.k_cache.dims": [PAGES, PAGE, 4, D]}, "tensors.k_cache.dims[2]", ("kv heads 4", "k's 2")),
        (packed, {"tensors.k_new.dims": [B, HKV, 2, D]}, "tensors.k_new.dims", ("(tokens, hkv, d)", "rank 3")),
        (packed, {"tensors.cache_len.dims": [4]}, "tensors.cache_len.dims[0]", ("batch 4", "page_table's 3")),
        (packed, {"nodes.0.page_table": None, "tensors.page_table": None}, "nodes[0].page_table", ("missing",)),
        (packed, {"nodes.0.seq_len_kv": None, "tensors.cache_len": None}, "nodes[0].seq_len_kv", ("missing",)),
        (packed, {"tensors.k_cache.dims": [PAGES, 24, HKV, D], "tensors.v_cache.dims": [PAGES, 24, HKV, D]},
         "tensors.k_cache.dims[1]", ("page size 24", "multiple of 16")),
        # slots: the keys of the other forms refused, each at its path
        (slots, {"nodes.0.cu_seqlens_q": "cu", "tensors.cu": {"dtype": "int32", "dims": [B + 1]}},
         "nodes[0].cu_seqlens_q", ("slot_mapping names each token's cache row", "remove cu_seqlens_q")),
        (slots, {"nodes.0.page_table": "table", "tensors.table": {"dtype": "int32", "dims": [B, MAX_PAGES]}},
         "nodes[0].page_table", ("slot_mapping names", "remove page_table", "rows or packed form")),
        (slots, {"nodes.0.seq_len_kv": "lens", "tensors.lens": {"dtype": "int32", "dims": [B]}},
         "nodes[0].seq_len_kv", ("remove seq_len_kv",)),
        (slots, {"tensors.slots.dims": [TOKENS + 1]}, "tensors.slots.dims[0]", ("tokens 51", "k's 50")),
        (slots, {"tensors.slots.dtype": "fp32"}, "tensors.slots.dtype", ("cache slots", "int32")),
        (slots, {"tensors.v_new.dtype": "fp16"}, "tensors.v_new.dtype", ("does not match k's bf16",)),
        (slots, {"nodes.0.k_scale": "ks", "tensors.ks": {"dtype": "fp32", "dims": [HKV]}}, "nodes[0].k_scale",
         ("quantized (e4m3) cache", "remove k_scale")),
    ],
)  # fmt: skip
def test_each_bad_input_is_one_problem_at_its_path(make, changes: dict, path: str, words: tuple[str, ...]) -> None:
    only(edited(make(), **changes), path, *words)


def test_packed_rows_without_their_keys_are_told_which_keys_place_them() -> None:
    found = {
        p.path: p.message for p in problems(edited(slots(), **{"nodes.0.slot_mapping": None, "tensors.slots": None}))
    }
    for t in ("k_new", "v_new"):
        message = found[f"tensors.{t}.dims"]
        for words in ("(b, hkv, s_new, d) (rank 4), got rank 3", "need cu_seqlens_q", "or slot_mapping"):
            assert words in message, message


def test_the_slots_form_refuses_every_key_of_the_others_at_once() -> None:
    d = edited(packed(), **{"nodes.0.slot_mapping": "slots", "tensors.slots": {"dtype": "int32", "dims": [TOKENS]}})
    with pytest.raises(DescriptionError) as e:
        check(d)
    paths = [p.path for p in e.value.problems]
    assert paths == ["nodes[0].cu_seqlens_q", "nodes[0].page_table", "nodes[0].seq_len_kv"]  # no "unused" tensors


# ---------------------------------------------------------------------------- kernel support


@pytest.mark.parametrize("make", [packed, slots])
def test_rows_in_16_byte_pieces_with_the_head_dim_innermost(make) -> None:
    graph = check(edited(make(), **{"tensors.k_new.layout": "tdh"}))
    with pytest.raises(DescriptionError) as e:
        resolve(graph)
    assert "innermost" in {p.path: p.message for p in e.value.problems}["tensors.k_new.strides[2]"]
    declined(edited(make(), **{"tensors.v_new.strides": [HKV * D + 4, D, 1]}), "tensors.v_new.strides[0]",
             "multiple of 8")  # fmt: skip
    d = edited(make(), **{f"tensors.{t}.dims": [TOKENS, HKV, 80] for t in ("k_new", "v_new")})
    for t in ("k_cache", "v_cache"):
        d["tensors"][t]["dims"][3] = 80
    declined(d, "tensors.k_new.dims[2]", "head dim 80")


def test_index_tensors_contiguous() -> None:
    declined(edited(slots(), **{"tensors.slots.strides": [2]}), "tensors.slots.strides[0]", "slots", "contiguous")
    declined(edited(packed(), **{"tensors.cu_q.strides": [3]}), "tensors.cu_q.strides[0]", "prefix sums")
    declined(edited(packed(), **{"tensors.cache_len.strides": [2]}), "tensors.cache_len.strides[0]", "lengths")


def test_the_tokens_are_the_grid() -> None:
    many = 1 << 31
    d = edited(slots(), **{f"tensors.{t}.dims": [many, HKV, D] for t in ("k_new", "v_new")})
    d["tensors"]["slots"]["dims"] = [many]
    declined(d, "tensors.k_new.dims[0]", f"tokens {many}", "grid x")


# ------------------------------------------------------------------------------ resolution


def test_packed_launch_and_arguments() -> None:
    plan = resolve(check(packed()))
    (launch,) = plan.launches
    names = [s.name for s in plan.slots]
    assert launch.grid == (TOKENS, 1, 1) and not launch.early  # one CTA per token of the capacity
    assert launch.variant == KvAppendVariant("bf16", D, "bf16", "packed")
    assert launch.variant.name == "kv_append.bf16.d64.packed"
    slots_of, values = _args(launch)
    assert {p: names[s] for p, s in slots_of.items()} == {
        "k": "k_new", "v": "v_new", "k_cache": "k_cache", "v_cache": "v_cache", "page_table": "page_table",
        "seq_len_kv": "cache_len", "cu_seqlens_q": "cu_q",
    }  # fmt: skip
    assert values == {
        "batch": B, "tokens": TOKENS, "heads_kv": HKV, "pages": PAGES, "page_size": PAGE, "max_pages": MAX_PAGES,
        "k.stride_t": HKV * D, "k.stride_h": D, "v.stride_t": HKV * D, "v.stride_h": D,
        "k_cache.stride_p": PAGE * HKV * D, "k_cache.stride_s": HKV * D, "k_cache.stride_h": D,
        "v_cache.stride_p": PAGE * HKV * D, "v_cache.stride_s": HKV * D, "v_cache.stride_h": D,
        "page_table.stride_b": MAX_PAGES,
    }  # fmt: skip
    assert list(values) == [p for p, kind in launch.variant.params if p not in slots_of]  # in ABI order
    # the lengths within each cache's capacity; the prefix sums: a sequence appends at most that
    cap = PAGE * MAX_PAGES
    assert [(names[c.slot], c.kind, c.longest, c.total) for c in plan.lengths] == [
        ("cache_len", "lengths", cap, 0), ("cu_q", "offsets", min(TOKENS, cap), TOKENS)
    ]  # fmt: skip
    assert plan.workspace_bytes == 0 and plan.workspace == ()


def test_slots_launch_and_arguments() -> None:
    plan = resolve(check(slots()))
    (launch,) = plan.launches
    names = [s.name for s in plan.slots]
    assert launch.grid == (TOKENS, 1, 1) and launch.variant.name == "kv_append.bf16.d64.slots"
    slots_of, values = _args(launch)
    assert {p: names[s] for p, s in slots_of.items()} == {
        "k": "k_new", "v": "v_new", "k_cache": "k_cache", "v_cache": "v_cache", "slot_mapping": "slots",
    }  # fmt: skip
    assert set(values) == {
        "heads_kv", "pages", "page_size", "k.stride_t", "k.stride_h", "v.stride_t", "v.stride_h",
        "k_cache.stride_p", "k_cache.stride_s", "k_cache.stride_h", "v_cache.stride_p", "v_cache.stride_s",
        "v_cache.stride_h",
    }  # fmt: skip
    assert plan.lengths == () and plan.workspace_bytes == 0


def test_an_e4m3_cache_adds_its_scales_to_either_form() -> None:
    for make in (packed, slots):
        d = make()
        _caches(d, "e4m3")
        for name in ("k_scale", "v_scale"):
            d["tensors"][name] = {"dtype": "fp32", "dims": [HKV]}
            d["nodes"][0][name] = name
        (launch,) = resolve(check(d)).launches
        assert launch.variant.name.startswith("kv_append.bf16.kv_e4m3.d64.")
        params = [p for p, _ in launch.variant.params]
        assert {"k_scale", "v_scale", "k_scale.stride_h", "v_scale.stride_h"} <= set(params)


def test_the_rows_form_keeps_its_abi() -> None:
    """The forms are optional groups of one record: the rows form's parameters are as before."""
    assert [p for p, _ in KvAppendVariant("bf16", 128, "bf16").params] == [
        "k", "v", "k_cache", "v_cache", "page_table", "seq_len_kv", "heads_kv", "s_new", "pages", "page_size",
        "max_pages", "k.stride_b", "k.stride_h", "k.stride_s", "v.stride_b", "v.stride_h", "v.stride_s",
        "k_cache.stride_p", "k_cache.stride_s", "k_cache.stride_h", "v_cache.stride_p", "v_cache.stride_s",
        "v_cache.stride_h", "page_table.stride_b",
    ]  # fmt: skip
    assert KvAppendVariant("bf16", 128, "bf16").name == "kv_append.bf16.d128"


# --------------------------------------------------------------------------- the plan's record


def test_the_records_through_the_plan_format() -> None:
    for make, form, sizes, roles in (
        (packed, "packed", {"batch": B, "tokens": TOKENS, "heads_kv": HKV, "head_dim": D, "pages": PAGES,
                            "page_size": PAGE, "max_pages": MAX_PAGES},
         ["k", "v", "page_table", "seq_len_kv", "cu_seqlens_q", "k_cache", "v_cache"]),
        (slots, "slots", {"tokens": TOKENS, "heads_kv": HKV, "head_dim": D, "pages": PAGES, "page_size": PAGE},
         ["k", "v", "slot_mapping", "k_cache", "v_cache"]),
    ):  # fmt: skip
        plan = resolve(check(make()))
        (node,) = plan.nodes
        assert (node.op, node.form, node.sizes, list(node.slots)) == ("kv_append", form, sizes, roles)
        spec = schema.NODE_FORMS["kv_append", form]
        assert list(spec.sizes) == list(sizes) and set(spec.roles) == set(roles)


def test_the_format_checks_a_slot_mapping_and_the_prefix_sums_contract() -> None:
    data = decode_plan(build(parse_description(json.dumps(slots()), fmt="json")))
    (node,) = data.nodes
    assert node.form == "slots"
    assert decode_plan(encode_plan(data)) == data
    rows = next(i for i, s in enumerate(data.slots) if s.name == "k_new")  # not a rank-1 int32 slot
    broken = replace(data, nodes=(replace(node, slots={**node.slots, "slot_mapping": rows}),))
    with pytest.raises(PlanFormatError, match=f"slot_mapping: slot {rows} is not a rank-1 int32 slot"):
        encode_plan(broken)
    data = decode_plan(build(parse_description(json.dumps(packed()), fmt="json")))
    assert data.nodes[0].form == "packed" and {c.kind for c in data.lengths} == {"lengths", "offsets"}
    no_contract = replace(data, lengths=tuple(c for c in data.lengths if c.kind == "lengths"))
    with pytest.raises(PlanFormatError, match="cu_seqlens_q: slot .* has no length contract of kind 'offsets'"):
        encode_plan(no_contract)


def test_bench_buffers_for_the_new_forms() -> None:
    """`python -m frost_runtime bench` fills each form's index slots: prefix sums and lengths
    within their contracts and a page table (packed), distinct cache rows (slots)."""
    torch = pytest.importorskip("torch")
    from frost_runtime import bench

    for make in (packed, slots):
        data = decode_plan(build(parse_description(json.dumps(make()), fmt="json")))
        values = workload.make_lengths(data, ["random"], seed=3)
        buffers, notes = bench.make_buffers(data, values, 3, "cpu")
        assert notes == []
        by_name = {s.name: b for s, b in zip(data.slots, buffers)}
        if make is slots:
            (m,) = workload.slot_mappings(data)
            rows = by_name["slots"].tolist()
            assert len(set(rows)) == TOKENS and all(0 <= r < PAGES * PAGE for r in rows)
            assert (m.pages, m.page_size) == (PAGES, PAGE)
        else:
            cu = by_name["cu_q"].tolist()
            assert cu[0] == 0 and cu == sorted(cu) and cu[-1] <= TOKENS
            table = by_name["page_table"]
            assert bool((table >= 0).all()) and bool((table < PAGES).all())
        assert torch.isnan(by_name["k_cache"]).all()  # written by the plan alone: poisoned
    few = workload.SlotMapping(0, 2, 16)  # fewer rows than tokens: the rest padding
    assert sorted(workload.slot_mapping_values(40, few, 1))[:8] == [-1] * 8


# -------------------------------------------------------------------- the attention behind it


def _follower(ahead: ResolvedLaunch, deems: tuple[str, ...] | None, **rebind: int) -> ResolvedLaunch:
    """An attention that waits for new rows, reading the caches (and `deems` parameters) the
    append writes, each bound as in the append unless `rebind` says another slot."""
    variant = SimpleNamespace(early_start=WAITS_FOR_NEW_ROWS, reads_caches=("k.tmap", "v.tmap"), name="attn")
    if deems is not None:
        variant.new_rows = deems
    bound = {a.param: a for a in ahead.args}
    args = [Arg("k.tmap", "tmap", bound["k_cache"].slot), Arg("v.tmap", "tmap", bound["v_cache"].slot)]
    for param in ("seq_len_kv", "cu_seqlens_q", "s_new"):
        if param in bound:
            a = bound[param]
            args.append(Arg(param, a.kind, rebind.get(param, a.slot), a.workspace, a.value))
    return ResolvedLaunch("attn", variant, (1, 1, 1), tuple(args), None)


def test_an_attention_starts_early_behind_a_packed_append_only_if_it_deems_the_same_rows_new() -> None:
    (append,) = resolve(check(packed())).launches
    by_packed = ("seq_len_kv", "cu_seqlens_q")
    early = lambda follower: mark_early_starts((append, follower))[1].early  # noqa: E731
    assert early(_follower(append, by_packed))
    assert not early(_follower(append, None))  # the decode attention's rows: the last s_new of each
    assert not early(_follower(append, by_packed, cu_seqlens_q=99))  # other prefix sums
    assert not early(_follower(append, by_packed, seq_len_kv=99))  # other lengths


def test_no_attention_starts_early_behind_a_slots_append() -> None:
    (append,) = resolve(check(slots())).launches
    assert append.variant.appends_to_caches == ()
    for deems in (None, ("seq_len_kv", "cu_seqlens_q"), ()):
        assert not mark_early_starts((append, _follower(append, deems)))[1].early


def test_a_decode_attention_behind_a_rows_append_of_other_new_tokens_waits() -> None:
    """The rows form deems each sequence's last s_new positions new: an attention of another
    s_new (or other lengths) would read new rows before its wait, so it starts after."""
    from tests.test_sdpa_paged import decode_step

    def early(d) -> bool:
        return resolve(check(d)).launches[1].early

    assert early(decode_step())
    two = decode_step()
    for t in ("k_new", "v_new"):
        two["tensors"][t]["dims"][2] = 2
    assert not early(two)
    other = decode_step()
    other["tensors"]["len2"] = dict(other["tensors"]["cache_len"])
    other["nodes"][1]["seq_len_kv"] = "len2"
    assert not early(other)


# ------------------------------------------------------------------------- compile and build


@pytest.mark.parametrize(
    "variant",
    [KvAppendVariant("bf16", 128, "bf16", "packed"), KvAppendVariant("fp16", 64, "e4m3", "packed"),
     KvAppendVariant("fp16", 256, "fp16", "slots"), KvAppendVariant("bf16", 128, "e4m3", "slots")],
    ids=lambda v: v.name,
)  # fmt: skip
def test_the_new_variants_compile(variant: KvAppendVariant) -> None:
    (compiled,) = compile_kernels([variant]).values()  # the ABI is checked against the PTX
    assert compiled.params == variant.params and compiled.cubin.startswith(b"\x7fELF")


def _start_build(folder: Path, hash_seed: str) -> subprocess.Popen:
    folder.mkdir(parents=True)
    both = packed()  # a packed and a slots append in one plan, over caches of their own
    other = slots()
    for name, t in other["tensors"].items():
        both["tensors"][f"s_{name}"] = t
    node = {k: (f"s_{v}" if k not in ("op", "name") else v) for k, v in other["nodes"][0].items()}
    both["nodes"].append(node | {"name": "slotted"})
    (folder / "graph.json").write_text(json.dumps(both))
    env = os.environ | {"PYTHONHASHSEED": hash_seed}
    return subprocess.Popen(
        [sys.executable, "-m", "frostc", "build", "graph.json", "-o", "plan.frost", "-q"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_builds_of_both_forms_are_byte_identical_across_processes(tmp_path: Path) -> None:
    builds = {"first": _start_build(tmp_path / "a" / "deeper", "1"), "second": _start_build(tmp_path / "b", "77")}
    for name, proc in builds.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name} build failed:\n{out}\n{err}"
    a = (tmp_path / "a" / "deeper" / "plan.frost").read_bytes()
    assert a == (tmp_path / "b" / "plan.frost").read_bytes()
    data = decode_plan(a)
    assert [(n.name, n.form) for n in data.nodes] == [("append", "packed"), ("slotted", "slots")]


def test_a_mixed_step_appends_then_attends_with_one_contract_per_slot() -> None:
    """The packed append then the mixed attention over the same caches, page table, lengths and
    prefix sums: one contract per slot, and the attention starts early: it declares the packed
    form's new rows (by seq_len_kv and cu_seqlens_q) as the ones it waits before."""
    d = packed()
    d["tensors"] |= {"q": {"dtype": "bf16", "dims": [TOKENS, 4, D]}, "o": {"dtype": "bf16", "dims": [TOKENS, 4, D]}}
    d["nodes"].append(
        {
            "op": "sdpa", "name": "attn", "q": "q", "k": "k_cache", "v": "v_cache", "o": "o",
            "page_table": "page_table", "seq_len_kv": "cache_len", "cu_seqlens_q": "cu_q", "causal": True,
        }
    )  # fmt: skip
    plan = resolve(check(d))
    names = [s.name for s in plan.slots]
    append, attention = plan.launches[:2]
    assert append.variant.name == "kv_append.bf16.d64.packed" and attention.node == "attn"
    assert sorted((names[c.slot], c.kind) for c in plan.lengths) == [("cache_len", "lengths"), ("cu_q", "offsets")]
    assert attention.variant.new_rows == append.variant.new_rows == ("seq_len_kv", "cu_seqlens_q")
    assert attention.early  # it waits before exactly the rows the append writes


def test_a_mixed_attention_over_other_prefix_sums_waits_at_its_start() -> None:
    """The attention's queries counted by prefix sums of another slot than the append's: the rows
    it would deem new need not be those written, so it never starts early."""
    d = packed()
    d["tensors"] |= {
        "q": {"dtype": "bf16", "dims": [TOKENS, 4, D]},
        "o": {"dtype": "bf16", "dims": [TOKENS, 4, D]},
        "cu_q_other": {"dtype": "int32", "dims": [B + 1]},
    }
    d["nodes"].append(
        {
            "op": "sdpa", "name": "attn", "q": "q", "k": "k_cache", "v": "v_cache", "o": "o",
            "page_table": "page_table", "seq_len_kv": "cache_len", "cu_seqlens_q": "cu_q_other", "causal": True,
        }
    )  # fmt: skip
    append, attention = resolve(check(d)).launches[:2]
    assert attention.variant.new_rows == append.variant.new_rows
    assert not attention.early
