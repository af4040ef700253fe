"""frostc.serving and `frostc from-config`: deployment options, layer kinds per family, tensor
parallelism, batch buckets, the plan list (every supported description validates and resolves;
the unsupported ones are reported, and still refused by validation: the claim stays true), and
the CLI's dry run (table, --json, exit codes, no tracebacks)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from frostc.cli import app
from frostc.errors import DescriptionError
from frostc.models import read_model
from frostc.resolve import resolve
from frostc.serving import (
    CUDA_GRAPH_BATCH_SIZES,
    check_entry,
    compact_layers,
    deployment,
    dry_run_summary,
    layer_kinds,
    parse_batch_sizes,
    plan_list,
)
from frostc.validate import validate
from tests.model_configs import GEMMA2_9B, GEMMA2_27B, LLAMA3_8B, MISTRAL_7B_V01, QWEN2_7B, edited

FAMILIES = {
    "llama3-8b": (LLAMA3_8B, {}),
    "qwen2-7b": (QWEN2_7B, {}),
    "qwen2-7b-sliding": (edited(QWEN2_7B, use_sliding_window=True, sliding_window=4096, max_window_layers=20), {}),
    "mistral-7b-v0.1": (MISTRAL_7B_V01, {}),
    "gemma2-9b": (GEMMA2_9B, {"dtype": "bf16"}),
    "gemma2-27b": (GEMMA2_27B, {}),
}


def planned(config, **options):
    model = read_model(config)
    dep = deployment(model, **options)
    return model, dep, layer_kinds(model, dep)


def refusals(config, **options) -> list[tuple[str, str]]:
    with pytest.raises(DescriptionError) as e:
        planned(config, **options)
    return [(p.path, p.message) for p in e.value.problems]


# ------------------------------------------------------------------------------ batch buckets


def test_the_cuda_graph_capture_sizes_are_vllms_51() -> None:
    sizes = CUDA_GRAPH_BATCH_SIZES
    assert len(sizes) == 51
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[34] == 256 and sizes[35] == 272 and sizes[-1] == 512
    assert list(sizes) == sorted(set(sizes))


def test_parse_batch_sizes() -> None:
    assert parse_batch_sizes("cuda-graphs") == CUDA_GRAPH_BATCH_SIZES
    assert parse_batch_sizes("8, 1,4") == (1, 4, 8)


@pytest.mark.parametrize("text", ["", "1,,2", "0", "-1", "two", "1.5", "4,4"])
def test_bad_batch_sizes_name_the_flag(text: str) -> None:
    with pytest.raises(DescriptionError) as e:
        parse_batch_sizes(text)
    assert [p.path for p in e.value.problems] == ["--batch-sizes"]


# ------------------------------------------------------------------------------ deployment


def test_the_defaults() -> None:
    _, dep, _ = planned(LLAMA3_8B)
    assert dep.batch_sizes == CUDA_GRAPH_BATCH_SIZES
    assert (dep.dtype, dep.max_cache_len, dep.max_prompt_tokens, dep.page_size, dep.speculative, dep.tp) == (
        "bf16", 8192, 8192, 16, 0, 1,
    )  # fmt: skip
    assert dep.max_pages == 512
    assert dep.pages == 512 * 512  # the largest batch, every sequence at full length


def test_pages_round_up() -> None:
    _, dep, _ = planned(LLAMA3_8B, max_cache_len=1000, page_size=64, batch_sizes=(1, 3))
    assert (dep.max_pages, dep.pages) == (16, 48)


@pytest.mark.parametrize(
    ("options", "flag", "words"),
    [
        ({"page_size": 24}, "--page-size", ("multiple of 16",)),
        ({"page_size": 272}, "--page-size", ("256",)),
        ({"speculative": 16}, "--speculative", ("0 to 15",)),
        ({"speculative": -1}, "--speculative", ("0 to 15",)),
        ({"max_cache_len": 8193}, "--max-cache-len", ("max_position_embeddings 8192",)),
        ({"max_cache_len": 0}, "--max-cache-len", ("must be 1",)),
        ({"max_prompt_tokens": 0}, "--max-prompt-tokens", (">= 1",)),
        ({"pages": 100}, "--pages", ("at least 512",)),
        ({"tp": 0}, "--tp", (">= 1",)),
        ({"tp": 3}, "--tp", ("does not divide", "32 attention heads", "[1, 2, 4, 8, 16, 32]")),
        ({"dtype": "fp32"}, "--dtype", ('"bf16", "fp16"',)),
        ({"batch_sizes": ()}, "--batch-sizes", ("at least one",)),
        ({"kv_cache_dtype": "fp32"}, "--kv-cache-dtype", ('"bf16", "fp16", "e4m3"',)),
        ({"kv_cache_dtype": "fp16"}, "--kv-cache-dtype", ("model's bf16", "e4m3")),
    ],
)  # fmt: skip
def test_bad_options_name_the_flag_and_the_fix(options, flag, words) -> None:
    ((path, message),) = refusals(LLAMA3_8B, **options)
    assert path == flag
    for word in words:
        assert word in message


def test_a_float32_config_needs_dtype() -> None:
    ((path, message),) = refusals(GEMMA2_9B)
    assert path == "--dtype" and "float32" in message and "--dtype bf16" in message
    ((path, message),) = refusals(edited(LLAMA3_8B, torch_dtype=...))
    assert path == "--dtype" and "names no dtype" in message
    assert planned(GEMMA2_9B, dtype="fp16")[1].dtype == "fp16"


def test_every_bad_option_is_reported_at_once() -> None:
    found = refusals(LLAMA3_8B, page_size=8, speculative=99, tp=5)
    assert [p for p, _ in found] == ["--page-size", "--speculative", "--tp"]


# ------------------------------------------------------------------------------ layer kinds


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("llama3-8b", [("0..31", 32, 8, 128, None, None)]),
        ("qwen2-7b", [("0..27", 28, 4, 128, None, None)]),
        ("qwen2-7b-sliding", [("0..19", 28, 4, 128, None, None), ("20..27", 28, 4, 128, 4095, None)]),
        ("mistral-7b-v0.1", [("0..31", 32, 8, 128, 4095, None)]),
        ("gemma2-9b", [("0,2,4..40", 16, 8, 256, 4095, 50.0), ("1,3,5..41", 16, 8, 256, None, 50.0)]),
        ("gemma2-27b", [("0,2,4..44", 32, 16, 128, 4095, 50.0), ("1,3,5..45", 32, 16, 128, None, 50.0)]),
    ],
)
def test_layer_kinds_per_family(family: str, expected) -> None:
    config, options = FAMILIES[family]
    model, _, kinds = planned(config, **options)
    got = [(compact_layers(k.layers), k.heads, k.kv_heads, k.head_dim, k.window_left, k.softcap) for k in kinds]
    assert got == expected
    assert [k.index for k in kinds] == list(range(len(kinds)))
    assert sorted(i for k in kinds for i in k.layers) == list(range(model.layers))
    assert all(k.scale == model.scale for k in kinds)


def test_a_window_as_long_as_the_cache_masks_nothing_and_is_dropped() -> None:
    model, dep, kinds = planned(MISTRAL_7B_V01, max_cache_len=4096)
    assert [k.window_left for k in kinds] == [None]
    assert "masks nothing" in dry_run_summary(model, dep, kinds)["notes"][0]
    assert [k.window_left for k in planned(MISTRAL_7B_V01, max_cache_len=4097)[2]] == [4095]


@pytest.mark.parametrize(
    ("tp", "heads", "kv_heads"),
    [(1, 32, 8), (2, 16, 4), (8, 4, 1), (16, 2, 1), (32, 1, 1)],  # 16 and 32: each rank one replicated KV head
)
def test_tensor_parallel_splits_the_heads(tp: int, heads: int, kv_heads: int) -> None:
    (kind,) = planned(LLAMA3_8B, tp=tp)[2]
    assert (kind.heads, kind.kv_heads) == (heads, kv_heads)


def test_tensor_parallel_that_splits_kv_heads_unevenly_is_refused() -> None:
    ((path, message),) = refusals(QWEN2_7B, tp=7)  # 28 heads split, 4 KV heads do not
    assert path == "--tp" and "4 KV heads" in message and "[1, 2, 4, 28]" in message


# ------------------------------------------------------------------------------ the plan list


def test_keys_order_and_count() -> None:
    _, dep, kinds = planned(GEMMA2_9B, dtype="bf16", batch_sizes=(1, 32))
    entries = plan_list(kinds, dep)
    assert [e.key for e in entries] == [
        "l0-prefill-b1", "l0-prefill-b32", "l0-decode-b1", "l0-decode-b32",
        "l1-prefill-b1", "l1-prefill-b32", "l1-decode-b1", "l1-decode-b32",
    ]  # fmt: skip
    assert [e.form for e in entries[:4]] == ["packed", "packed", "paged", "paged"]
    assert all(e.description.name == e.key for e in entries)
    assert len(plan_list(*reversed(planned(GEMMA2_9B, dtype="bf16")[1:]))) == 2 * 2 * 51


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_supported_plan_validates_and_resolves(family: str) -> None:
    config, options = FAMILIES[family]
    _, dep, kinds = planned(config, **options)
    entries = plan_list(kinds, dep)
    supported = [e for e in entries if not e.unsupported]
    assert supported
    for entry in supported:
        assert check_entry(entry) == (), entry.key
    assert all(e.unsupported is None for e in entries)


def test_gemma2_decodes_with_its_window_and_softcap_in_the_paged_form() -> None:
    _, dep, kinds = planned(GEMMA2_9B, dtype="bf16", batch_sizes=(8,))
    decode = [e for e in plan_list(kinds, dep) if e.phase == "decode"]
    assert [e.key for e in decode] == ["l0-decode-b8", "l1-decode-b8"]
    names = [[v.name for v in {launch.variant for launch in resolve(validate(e.description)).launches}] for e in decode]
    assert any("local.softcap" in n for n in names[0]) and not any("local" in n for n in names[1])
    assert any("softcap" in n for n in names[1])


def test_a_decode_plans_shapes() -> None:
    llama31 = edited(LLAMA3_8B, max_position_embeddings=131072)
    _, dep, kinds = planned(llama31, batch_sizes=(32,), speculative=3, max_cache_len=12288, page_size=16, tp=2)
    (_, decode) = plan_list(kinds, dep)
    graph = validate(decode.description)
    tensors = {t.name: t.dims for t in graph.tensors}
    assert tensors["q"] == (32, 16, 4, 128)  # 1 + 3 speculative tokens, 16 heads per rank
    assert tensors["k_new"] == (32, 4, 4, 128)
    assert tensors["k_cache"] == (32 * 768, 16, 4, 128)
    assert tensors["page_table"] == (32, 768)
    assert [n.op for n in graph.nodes] == ["kv_append", "sdpa"]
    attn = graph.nodes[1]
    assert attn.form == "paged" and attn.attn_scale == 128**-0.5


def test_an_fp8_cache_makes_the_decode_plans_e4m3_with_scales_per_kv_head() -> None:
    _, dep, kinds = planned(LLAMA3_8B, batch_sizes=(8,), kv_cache_dtype="e4m3", tp=2)
    assert (dep.kv_cache_dtype, dep.quantized_cache) == ("e4m3", True)
    prefill, decode = plan_list(kinds, dep)
    graph = validate(decode.description)
    tensors = {t.name: (t.dtype, t.dims) for t in graph.tensors}
    assert tensors["k_cache"][0] == tensors["v_cache"][0] == "e4m3"
    assert tensors["k_scale"] == tensors["v_scale"] == ("fp32", (4,))  # 4 KV heads per rank
    assert tensors["q"][0] == tensors["k_new"][0] == "bf16"
    assert {n.k_scale for n in graph.nodes} == {"k_scale"}
    assert "k_scale" not in {t.name for t in validate(prefill.description).tensors}  # prefill reads no cache
    _, dep_bf16, _ = planned(LLAMA3_8B, batch_sizes=(8,), kv_cache_dtype="bf16")
    assert dep_bf16.kv_cache_dtype == "bf16" and not dep_bf16.quantized_cache


def test_a_prefill_plans_shapes() -> None:
    _, dep, kinds = planned(GEMMA2_27B, batch_sizes=(4,), max_prompt_tokens=16384, max_cache_len=8000)
    prefill = plan_list(kinds, dep)[0]
    graph = validate(prefill.description)
    tensors = {t.name: t.dims for t in graph.tensors}
    assert tensors["q"] == (16384, 32, 128) and tensors["k"] == (16384, 16, 128)
    assert tensors["cu_seqlens"] == (5,)
    (attn,) = graph.nodes
    assert attn.form == "packed" and attn.lse is None
    assert math.isclose(attn.attn_scale, 1 / 12)
    assert (attn.mask.window_left, attn.mask.softcap) == (4095, 50.0)
    # a prompt fits its cache; a sequence may also hold the next one's left padding (HF's rows read in place)
    assert prefill.description.nodes[0].get("max_seqlen_q") == 2 * 8000 - 1


def test_the_summary_is_deterministic() -> None:
    first = json.dumps(dry_run_summary(*planned(GEMMA2_9B, dtype="bf16")))
    assert first == json.dumps(dry_run_summary(*planned(GEMMA2_9B, dtype="bf16")))


@pytest.mark.parametrize(
    ("layers", "text"),
    [
        (tuple(range(32)), "0..31"),
        (tuple(range(0, 42, 2)), "0,2,4..40"),
        ((3, 7), "3,7"),
        ((0, 1), "0,1"),
        ((0, 1, 2, 5, 9, 13, 17), "0..2,5,9,13..17"),
        ((0, 2, 4), "0,2,4"),
        ((5,), "5"),
    ],
)
def test_compact_layers(layers, text) -> None:
    assert compact_layers(layers) == text


# ------------------------------------------------------------------------------ the CLI


def frostc(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "1000"})


@pytest.fixture
def config_file(tmp_path: Path):
    def write(config, name: str = "config.json") -> Path:
        path = tmp_path / name
        path.write_text(json.dumps(config))
        return path

    return write


def test_dry_run_prints_the_model_the_kinds_and_the_plans(config_file) -> None:
    result = frostc("from-config", config_file(GEMMA2_9B), "--dry-run", "--dtype", "bf16", "--batch-sizes", "1,8")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "gemma2" in out and "42 layers" in out and "sliding window 4096" in out and "softcap 50.0" in out
    assert "0,2,4..40" in out and "1,3,5..41" in out
    assert "l0-prefill-b8" in out and "l1-decode-b1" in out
    assert "8 plans: 8 ok" in out


def test_dry_run_shows_an_fp8_cache_and_its_smaller_pool(config_file) -> None:
    import json

    args = ("from-config", config_file(LLAMA3_8B), "--dry-run", "--batch-sizes", "8")
    plain, fp8 = (json.loads(frostc(*args, "--json", *extra).stdout) for extra in ((), ("--kv-cache-dtype", "e4m3")))
    assert (plain["deployment"]["kv_cache_dtype"], fp8["deployment"]["kv_cache_dtype"]) == ("bf16", "e4m3")
    assert fp8["deployment"]["kv_pool_bytes_per_layer"] * 2 == plain["deployment"]["kv_pool_bytes_per_layer"]
    assert all(p["status"] == "ok" for p in fp8["plans"])
    assert "cache: e4m3" in frostc(*args, "--kv-cache-dtype", "e4m3").stdout


def test_dry_run_json(config_file) -> None:
    result = frostc("from-config", config_file(LLAMA3_8B), "--dry-run", "--json", "--tp", "2")
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["model"]["model_type"] == "llama" and s["deployment"]["tp"] == 2
    assert s["deployment"]["batch_sizes"] == list(CUDA_GRAPH_BATCH_SIZES)
    assert [k["layers"] for k in s["kinds"]] == [list(range(32))]
    assert len(s["plans"]) == 102 and {p["status"] for p in s["plans"]} == {"ok"}
    assert s["plans"][0] == {
        "key": "l0-prefill-b1", "kind": "l0", "phase": "prefill", "batch": 1, "form": "packed", "status": "ok",
    }  # fmt: skip
    again = frostc("from-config", config_file(LLAMA3_8B), "--dry-run", "--json", "--tp", "2")
    assert again.stdout == result.stdout


def test_without_dry_run_it_needs_an_output(config_file) -> None:
    result = frostc("from-config", config_file(LLAMA3_8B))
    assert result.exit_code == 2
    assert "give -o SET.frostset to build the plan set, or --dry-run" in result.stderr
    assert result.stdout == ""
    result = frostc("from-config", config_file(LLAMA3_8B), "-o", "x.frostset", "--phase", "train")
    assert result.exit_code == 2 and "--phase 'train': expected one of prefill, decode" in result.stderr


@pytest.mark.parametrize(
    ("config", "args", "words"),
    [
        (edited(LLAMA3_8B, model_type="bert"), [], ('model_type: string "bert"', "gemma2")),
        (edited(LLAMA3_8B, num_attention_heads="many"), [], ("num_attention_heads: expected an int",)),
        (GEMMA2_9B, [], ("--dtype: the config says float32",)),
        (LLAMA3_8B, ["--tp", "3"], ("--tp: 3 does not divide",)),
        (LLAMA3_8B, ["--batch-sizes", "1,x"], ("--batch-sizes",)),
        (LLAMA3_8B, ["--page-size", "8", "--speculative", "20"], ("--page-size: 8", "--speculative: 20")),
    ],
)
def test_bad_input_exits_2_naming_the_field(config_file, config, args, words) -> None:
    result = frostc("from-config", config_file(config), "--dry-run", *args)
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("content", [b"", b"garbage", b"\x00\xff\xfe", b"[]", b"{" * 5000, b'{"model_type": null}'])
def test_garbage_files_exit_2_without_a_traceback(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    result = frostc("from-config", path, "--dry-run")
    assert result.exit_code == 2, result.output
    assert str(path) in result.stderr
    assert "Traceback" not in result.output


def test_a_missing_file_or_a_folder_exits_2(tmp_path: Path) -> None:
    for path in (tmp_path / "nope.json", tmp_path):
        result = frostc("from-config", path, "--dry-run")
        assert result.exit_code == 2, result.output
        assert "cannot read the file" in result.stderr


# ------------------------------------------------------------------------------ continuous batching


def test_a_continuous_batching_deployment_adds_mixed_plans_per_token_bucket() -> None:
    """--cb-tokens: a mixed plan per layer kind and token bucket after the other phases, each
    validating and resolving; its caches are transformers' pool by strides (a block: every layer of
    the group's K page then V page), its sequences min(tokens, requests)."""
    from frostc.serving import ContinuousBatching

    cb = ContinuousBatching((512, 64), requests=256, blocks=4096)
    model, dep, kinds = planned(GEMMA2_9B, dtype="bf16", batch_sizes=(1,), page_size=64, cb=cb)
    entries = plan_list(kinds, dep)
    mixed = [e for e in entries if e.phase == "mixed"]
    assert [e.key for e in mixed] == ["l0-mixed-t64", "l0-mixed-t512", "l1-mixed-t64", "l1-mixed-t512"]
    assert entries[-4:] == tuple(mixed) and all(e.form == "mixed" and not check_entry(e) for e in mixed)
    assert dict(dep.cb.groups) == {
        "sliding_attention": tuple(range(0, 42, 2)),
        "full_attention": tuple(range(1, 42, 2)),
    }
    tensors = {t.name: t for t in mixed[1].description.tensors}
    row = 8 * 256  # KV heads x head dim
    assert tensors["k_cache"].strides == (2 * 21 * 64 * row, row, 256, 1)
    assert tensors["page_table"].dims == (256, dep.max_pages) and tensors["cu_q"].dims == (257,)
    assert tensors["q"].dims == (512, 16, 256) and {t.name: t.dims for t in mixed[0].description.tensors}["cu_q"] == (
        65,
    )


def test_continuous_batching_sizes_the_pool_as_transformers_5_23() -> None:
    """num_blocks whole-model blocks, in sectors (the lcm of the groups' block bytes and 128), two
    trash sectors ahead: Llama-3-8B's 32 layers in pages of 16 tokens hold 2 x 16 x 8 x 128 x 2
    bytes a page, its blocks 32 pages; 1000 blocks are 1000 sectors, 1002 with the trash."""
    from frostc.serving import ContinuousBatching

    _, dep, _ = planned(LLAMA3_8B, batch_sizes=(1,), cb=ContinuousBatching((64,), 1024, 1000))
    assert dict(dep.cb.pool_blocks) == {"full_attention": 1002}


def test_an_e4m3_pool_halves_the_pages_and_adds_per_head_scales() -> None:
    """With --kv-cache-dtype e4m3 the pool holds e4m3 (transformers allocates it so through
    cb_patches): a page is half the bytes, a sector one block of them, so 1000 blocks are the
    same 1002 with the trash in half the memory; the mixed plans read and append e4m3 pages with
    one float32 scale per KV head."""
    from frostc.serving import ContinuousBatching

    cb = ContinuousBatching((64,), 1024, 1000)
    _, dep, kinds = planned(LLAMA3_8B, batch_sizes=(1,), kv_cache_dtype="e4m3", cb=cb)
    assert dict(dep.cb.pool_blocks) == {"full_attention": 1002}
    mixed = [e for e in plan_list(kinds, dep) if e.phase == "mixed"]
    tensors = {t.name: t for t in mixed[0].description.tensors}
    assert tensors["k_cache"].dtype == tensors["v_cache"].dtype == "e4m3"
    assert tensors["k_cache"].dims == (1002, 16, 8, 128)
    assert tensors["k_scale"].dims == tensors["v_scale"].dims == (8,) and tensors["k_scale"].dtype == "fp32"
    nodes = {n.name: n for n in mixed[0].description.nodes}
    assert nodes["append"].get("k_scale") == nodes["attn"].get("k_scale") == "k_scale"
    assert check_entry(mixed[0]) == ()


@pytest.mark.parametrize(
    ("config", "options", "flag", "words"),
    [
        (MISTRAL_7B_V01, {"page_size": 48}, "--page-size", "does not divide the sliding window 4096"),
        (LLAMA3_8B, {"kv_cache_dtype": "fp16"}, "--kv-cache-dtype", "holds the model's bf16"),
        (LLAMA3_8B, {"tokens": ()}, "--cb-tokens", "distinct token buckets"),
        (LLAMA3_8B, {"blocks": 0}, "--cb-blocks", "num_blocks"),
    ],
)
def test_bad_continuous_batching_options_name_the_flag(config, options, flag, words) -> None:
    from frostc.serving import ContinuousBatching

    fields = {"tokens": (64,), "requests": 1024, "blocks": 100}
    cb = ContinuousBatching(**{k: options.pop(k, v) for k, v in fields.items()})
    assert any(path == flag and words in message for path, message in refusals(config, cb=cb, **options))


def test_dry_run_lists_mixed_plans_and_needs_blocks(config_file) -> None:
    path = config_file(LLAMA3_8B)
    result = frostc(
        "from-config", path, "--dry-run", "--json", "--batch-sizes", "1", "--cb-tokens", "64,128", "--cb-blocks", "512"
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [p["key"] for p in summary["plans"] if p["phase"] == "mixed"] == ["l0-mixed-t64", "l0-mixed-t128"]
    assert summary["deployment"]["continuous_batching"]["pool_blocks"] == {"full_attention": 514}
    result = frostc("from-config", path, "--dry-run", "--cb-tokens", "64")
    assert result.exit_code == 2 and "--cb-tokens needs --cb-blocks" in result.stderr
