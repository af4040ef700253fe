"""frostc.models: a Hugging Face config.json read into the model's attention, family by family,
with transformers 5.23's semantics (windows, Qwen2's max_window_layers, Gemma-2's scale and
layer types), and every bad config refused with one problem per field, named by its key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from frostc.errors import DescriptionError
from frostc.models import SUPPORTED_MODEL_TYPES, load_model_config, read_model
from tests.model_configs import (
    DEEPSEEK_V3,
    GEMMA2_9B,
    GEMMA2_27B,
    GEMMA3_1B,
    GEMMA3_27B,
    GPT_OSS_20B,
    LLAMA3_8B,
    MISTRAL_7B_V01,
    MIXTRAL_8X7B,
    PHI3_MINI,
    PHI4,
    QWEN2_7B,
    QWEN3_8B,
    QWEN3_30B_A3B,
    edited,
)


def problems(config) -> list[tuple[str, str]]:
    with pytest.raises(DescriptionError) as e:
        read_model(config)
    return [(p.path, p.message) for p in e.value.problems]


def only(config, path: str, *words: str) -> str:
    found = problems(config)
    assert [p for p, _ in found] == [path], found
    for word in words:
        assert word in found[0][1], found[0]
    return found[0][1]


# ------------------------------------------------------------------------------ families


def test_llama3_8b() -> None:
    m = read_model(LLAMA3_8B)
    assert (m.model_type, m.layers, m.heads, m.kv_heads, m.head_dim) == ("llama", 32, 32, 8, 128)
    assert (m.dtype, m.max_positions, m.softcap, m.sliding_window) == ("bf16", 8192, None, None)
    assert m.scale == 128**-0.5
    assert m.window_left == (None,) * 32


def test_mistral_7b_v01_slides_on_every_layer_with_w_minus_1() -> None:
    m = read_model(MISTRAL_7B_V01)
    assert m.window_left == (4095,) * 32  # HF's window of 4096 keys, the query's own included
    assert m.sliding_window == 4096


def test_mistral_with_a_null_window_has_none() -> None:
    assert read_model(edited(MISTRAL_7B_V01, sliding_window=None)).window_left == (None,) * 32


def test_mistral_without_the_key_takes_transformers_default_window() -> None:
    assert read_model(edited(MISTRAL_7B_V01, sliding_window=...)).window_left == (4095,) * 32


def test_qwen2_7b_does_not_slide_when_use_sliding_window_is_false() -> None:
    m = read_model(QWEN2_7B)
    assert (m.layers, m.heads, m.kv_heads, m.head_dim, m.max_positions) == (28, 28, 4, 128, 131072)
    assert m.window_left == (None,) * 28


def test_qwen2_slides_from_max_window_layers_on() -> None:
    m = read_model(edited(QWEN2_7B, use_sliding_window=True, sliding_window=4096, max_window_layers=20))
    assert m.window_left == (None,) * 20 + (4095,) * 8


def test_qwen2_layer_types_win_over_max_window_layers() -> None:
    types = ["sliding_attention" if i % 4 == 3 else "full_attention" for i in range(28)]
    config = edited(QWEN2_7B, use_sliding_window=True, sliding_window=4096, max_window_layers=0, layer_types=types)
    assert read_model(config).window_left == tuple(4095 if i % 4 == 3 else None for i in range(28))


def test_qwen2_sliding_layer_types_without_use_sliding_window_have_no_window() -> None:
    # Qwen2Config sets sliding_window = None unless use_sliding_window, whatever layer_types says
    config = edited(QWEN2_7B, layer_types=["sliding_attention"] * 28)
    assert read_model(config).window_left == (None,) * 28


def test_qwen3_8b_reads_its_own_head_dim_and_no_window() -> None:
    m = read_model(QWEN3_8B)
    assert (m.model_type, m.layers, m.heads, m.kv_heads, m.head_dim, m.dtype) == ("qwen3", 36, 32, 8, 128, "bf16")
    assert m.window_left == (None,) * 36 and m.scale == 128**-0.5 and m.softcap is None


def test_qwen3_head_dim_defaults_to_128_like_its_config_class_not_hidden_over_heads() -> None:
    config = {k: v for k, v in QWEN3_8B.items() if k != "head_dim"} | {"hidden_size": 5120, "num_attention_heads": 64}
    assert read_model(config).head_dim == 128  # Qwen3Config's own default (5120 / 64 would be 80)


def test_qwen3_slides_like_qwen2_from_max_window_layers_on() -> None:
    m = read_model(edited(QWEN3_8B, use_sliding_window=True, sliding_window=4096, max_window_layers=30))
    assert m.window_left == (None,) * 30 + (4095,) * 6


def test_qwen3_moe_slides_on_every_layer_when_asked_and_derives_head_dim_when_absent() -> None:
    m = read_model(QWEN3_30B_A3B)
    assert (m.model_type, m.layers, m.heads, m.kv_heads, m.head_dim) == ("qwen3_moe", 48, 32, 4, 128)
    assert m.window_left == (None,) * 48
    sliding = read_model(edited(QWEN3_30B_A3B, use_sliding_window=True, sliding_window=2048, head_dim=None))
    assert sliding.window_left == (2047,) * 48 and sliding.head_dim == 2048 // 32


def test_mixtral_is_mistrals_attention_without_a_window_by_default() -> None:
    m = read_model(MIXTRAL_8X7B)
    assert (m.model_type, m.layers, m.heads, m.kv_heads, m.head_dim) == ("mixtral", 32, 32, 8, 128)
    assert m.window_left == (None,) * 32
    config = {k: v for k, v in MIXTRAL_8X7B.items() if k != "sliding_window"}
    assert read_model(config).window_left == (None,) * 32  # MixtralConfig's default: null
    assert read_model(edited(MIXTRAL_8X7B, sliding_window=4096)).window_left == (4095,) * 32


def test_qwen3_moe_and_mixtral_refuse_layer_types_that_disagree() -> None:
    only(edited(MIXTRAL_8X7B, layer_types=["sliding_attention"] * 32), "layer_types", "MixtralModel ignores")
    only(edited(QWEN3_30B_A3B, layer_types=["sliding_attention"] * 48), "layer_types", "Qwen3MoeModel ignores")


def test_gemma3_27b_is_read_from_text_config_five_sliding_layers_to_one_full() -> None:
    m = read_model(GEMMA3_27B)
    assert (m.model_type, m.layers, m.heads, m.kv_heads, m.head_dim, m.dtype) == (
        "gemma3_text",
        62,
        32,
        16,
        128,
        "bf16",
    )
    assert m.window_left == tuple(None if (i + 1) % 6 == 0 else 1023 for i in range(62))
    assert m.scale == 168**-0.5 and m.softcap is None


def test_gemma3_1b_text_only_config_and_its_layer_types_win() -> None:
    m = read_model(GEMMA3_1B)
    assert (m.model_type, m.kv_heads, m.head_dim) == ("gemma3_text", 1, 256)
    assert m.window_left[:6] == (511,) * 5 + (None,) and m.scale == 256**-0.5
    types = ["full_attention", "sliding_attention"] * 13
    assert read_model(edited(GEMMA3_1B, layer_types=types)).window_left == (None, 511) * 13


def test_gemma3_without_a_text_config_names_it() -> None:
    only(edited(GEMMA3_27B, text_config=...), "text_config", "JSON object")
    only(edited(GEMMA3_27B, text_config={**GEMMA3_27B["text_config"], "num_hidden_layers": 0}), "num_hidden_layers")


def test_gemma2_9b_even_layers_slide_with_a_softcap_and_the_scalar_scale() -> None:
    m = read_model(GEMMA2_9B)
    assert (m.layers, m.heads, m.kv_heads, m.head_dim, m.dtype) == (42, 16, 8, 256, "fp32")
    assert m.window_left == tuple(4095 if i % 2 == 0 else None for i in range(42))
    assert (m.softcap, m.scale) == (50.0, 256**-0.5)


def test_gemma2_27b_scale_comes_from_query_pre_attn_scalar_not_head_dim() -> None:
    m = read_model(GEMMA2_27B)
    assert (m.head_dim, m.scale) == (128, 144**-0.5)


def test_gemma2_layer_types_are_preferred() -> None:
    types = ["full_attention"] * 41 + ["sliding_attention"]
    assert read_model(edited(GEMMA2_9B, layer_types=types)).window_left == (None,) * 41 + (4095,)


def test_gemma2_final_logit_softcapping_is_not_attentions() -> None:
    m = read_model(edited(GEMMA2_9B, attn_logit_softcapping=None, final_logit_softcapping=30.0))
    assert m.softcap is None


def test_gemma2_head_dim_defaults_to_256_like_its_config_class() -> None:
    assert read_model(edited(GEMMA2_9B, head_dim=...)).head_dim == 256


def test_legacy_layer_type_attention_reads_as_full() -> None:
    config = edited(GEMMA2_9B, layer_types=["attention"] * 42)
    assert read_model(config).window_left == (None,) * 42


def test_head_dim_is_derived_when_absent_or_null() -> None:
    assert read_model(edited(LLAMA3_8B, head_dim=None)).head_dim == 128
    assert read_model(edited(LLAMA3_8B, head_dim=64)).head_dim == 64  # explicit wins over hidden // heads


def test_kv_heads_default_to_the_heads_for_llama() -> None:
    assert read_model(edited(LLAMA3_8B, num_key_value_heads=...)).kv_heads == 32


def test_dtype_key_wins_over_torch_dtype() -> None:
    assert read_model(edited(LLAMA3_8B, dtype="float16")).dtype == "fp16"
    assert read_model(edited(LLAMA3_8B, torch_dtype=...)).dtype is None


def test_a_llama_layer_types_that_says_what_llama_does_is_accepted() -> None:
    assert read_model(edited(LLAMA3_8B, layer_types=["full_attention"] * 32)).layers == 32


# ------------------------------------------------------------------------------ refusals


def test_unknown_model_type_lists_the_supported_ones() -> None:
    message = only(edited(LLAMA3_8B, model_type="gpt2"), "model_type", '"gpt2"')
    for name in SUPPORTED_MODEL_TYPES:
        assert name in message
    only(edited(LLAMA3_8B, model_type=...), "model_type", "no model_type")


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"num_attention_heads": ...}, "num_attention_heads", ("missing",)),
        ({"num_hidden_layers": "32"}, "num_hidden_layers", ('string "32"',)),
        ({"num_key_value_heads": 0}, "num_key_value_heads", ("int >= 1", "int 0")),
        ({"num_key_value_heads": 5}, "num_key_value_heads", ("does not divide", "32")),
        ({"max_position_embeddings": ...}, "max_position_embeddings", ("missing",)),
        ({"hidden_size": 4100}, "hidden_size", ("not a multiple", "head_dim")),
        ({"hidden_size": ...}, "hidden_size", ("missing",)),
        ({"head_dim": True}, "head_dim", ("bool true",)),
        ({"torch_dtype": "int8"}, "torch_dtype", ('"bfloat16"', 'string "int8"')),
        ({"layer_types": ["sliding_attention"] * 32}, "layer_types", ("LlamaModel ignores", "remove it")),
    ],
)  # fmt: skip
def test_bad_llama_fields_are_named(changes, path, words) -> None:
    only(edited(LLAMA3_8B, **changes), path, *words)


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"layer_types": ["full_attention"] * 3}, "layer_types", ("list of 42",)),
        ({"layer_types": ["full_attention"] * 41 + ["linear_attention"]}, "layer_types[41]", ('"linear_attention"',)),
        ({"sliding_window": 0}, "sliding_window", ("int >= 1",)),
        ({"attn_logit_softcapping": "50"}, "attn_logit_softcapping", ("positive number",)),
        ({"query_pre_attn_scalar": None}, "query_pre_attn_scalar", ("give it",)),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention", ("causal",)),
    ],
)  # fmt: skip
def test_bad_gemma2_fields_are_named(changes, path, words) -> None:
    only(edited(GEMMA2_9B, **changes), path, *words)


def test_mistral_layer_types_that_disagree_are_refused() -> None:
    types = ["sliding_attention", "full_attention"] * 16
    only(edited(MISTRAL_7B_V01, layer_types=types), "layer_types", "MistralModel ignores", "Ministral")


def test_every_bad_field_is_reported_at_once() -> None:
    config = edited(LLAMA3_8B, num_hidden_layers=None, num_attention_heads=-1, torch_dtype=3)
    assert [p for p, _ in problems(config)] == ["num_hidden_layers", "num_attention_heads", "torch_dtype"]


# ------------------------------------------------------------------------------ files


def test_load_model_config_reads_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    assert read_model(load_model_config(path)) == read_model(LLAMA3_8B)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"{not json", ("invalid JSON", "line 1")),
        (b"[1, 2]", ("JSON object", "an array")),
        (b"\xff\xfe garbage", ("not UTF-8",)),
        (b"[" * 100000, ("nested too deeply",)),
    ],
)
def test_unreadable_configs_name_the_file(tmp_path: Path, content: bytes, words) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(DescriptionError) as e:
        load_model_config(path)
    (problem,) = e.value.problems
    assert problem.path == str(path)
    for word in words:
        assert word in problem.message


def test_a_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(DescriptionError) as e:
        load_model_config(tmp_path / "nope.json")
    assert "cannot read the file" in str(e.value)


def test_phi3_mini_is_read_at_head_dim_96_with_no_kernel_gap() -> None:
    m = read_model(PHI3_MINI)
    assert (m.model_type, m.layers, m.heads, m.kv_heads, m.head_dim) == ("phi3", 32, 32, 32, 96)
    assert m.window_left == (2046,) * 32 and m.scale == 96**-0.5
    assert m.kernel_gap is None  # every form takes 96: prefill (packed), paged decode, mixed, kv_append
    phi4 = read_model(PHI4)
    assert (phi4.head_dim, phi4.kv_heads, phi4.window_left, phi4.kernel_gap) == (128, 10, (None,) * 40, None)


def test_a_head_dim_no_kernel_takes_is_the_gap() -> None:
    m = read_model(edited(PHI3_MINI, hidden_size=2560))  # 2560 / 32 = 80
    assert m.head_dim == 80 and m.kernel_gap == "head dim 80 (frostc's kernels take 64, 96, 128, 256) (issue 44)"


def test_gpt_oss_alternates_windows_and_names_its_sinks() -> None:
    m = read_model(GPT_OSS_20B)
    assert (m.model_type, m.layers, m.heads, m.kv_heads, m.head_dim) == ("gpt_oss", 24, 64, 8, 64)
    assert m.window_left == (127, None) * 12 and m.sinks
    assert m.kernel_gap is None  # every form's kernels take sinks
    default = {k: v for k, v in GPT_OSS_20B.items() if k != "layer_types"}
    assert read_model(default).window_left == (127, None) * 12  # GptOssConfig: even layers slide


def test_deepseek_v3_is_mla_192_over_128_with_yarns_scale() -> None:
    m = read_model(DEEPSEEK_V3)
    assert (m.model_type, m.layers, m.heads, m.kv_heads, m.head_dim, m.head_dim_v) == (
        "deepseek_v3", 61, 128, 128, 192, 128,
    )  # fmt: skip
    mscale = 0.1 * math.log(40) + 1.0
    assert math.isclose(m.scale, 192**-0.5 * mscale**2) and m.window_left == (None,) * 61
    assert m.latent_dim == 576
    for named in ("head dim 192", "value head dim 128", "576-wide latent K"):
        assert named in m.kernel_gap
    plain = {k: v for k, v in DEEPSEEK_V3.items() if k != "rope_scaling"}
    assert math.isclose(read_model(plain).scale, 192**-0.5)
    assert m.prefill_gap is None  # the 16-bit forward kernel takes (192, 128)


def test_deepseek_v3_plans_its_prefill_and_names_its_decode_gap() -> None:
    """from-config: the packed prefill plans (q/k 192, v/o 128, yarn's scale) validate and resolve;
    the decode plans stay unsupported, naming the pair's paged forms and MLA's latent decode; the
    context plans (transformers' steps over the context it expands from the latents: packed,
    bottom-right, a bucket's new tokens over up to max_cache_len keys a sequence) resolve."""
    from frostc.serving import check_entry, deployment, layer_kinds, plan_list

    model = read_model(DEEPSEEK_V3)
    dep = deployment(model, batch_sizes=(1, 8), max_cache_len=4096, tp=8)
    (kind,) = layer_kinds(model, dep)
    assert (kind.heads, kind.kv_heads, kind.head_dim, kind.head_dim_v) == (16, 16, 192, 128)
    entries = plan_list((kind,), dep)
    prefill = [e for e in entries if e.phase == "prefill"]
    assert prefill and all(e.unsupported is None and check_entry(e) == () for e in prefill)
    dims = {t.name: list(t.dims) for t in prefill[0].description.tensors}
    assert (dims["q"][-1], dims["k"][-1], dims["v"][-1], dims["o"][-1]) == (192, 192, 128, 128)
    (node,) = prefill[0].description.nodes
    assert math.isclose(node.get("attn_scale"), model.scale)
    decode = [e for e in entries if e.phase == "decode"]
    for e in decode:
        assert "576-wide latent K" in e.unsupported and "value head dim 128" in e.unsupported, e.key
    context = [e for e in entries if e.phase == "context"]
    assert [e.batch for e in context] == [1, 8] and [e.key for e in context] == ["l0-context-b1", "l0-context-b8"]
    assert all(e.unsupported is None and check_entry(e) == () and e.form == "packed" for e in context)
    dims = {t.name: list(t.dims) for t in context[1].description.tensors}
    assert dims["q"] == [8, 16, 192] and dims["k"] == [8 * 4096, 16, 192] and dims["o"] == [8, 16, 128]
    (node,) = context[1].description.nodes
    assert node.get("diagonal_alignment") == "bottom_right" and node.get("max_seqlen_kv") == 4096
    assert len(entries) == len(prefill) + len(decode) + len(context)


def test_from_config_lists_a_gap_family_plan_by_plan_and_builds_none(tmp_path) -> None:
    from typer.testing import CliRunner

    from frostc.cli import app

    path = tmp_path / "config.json"
    path.write_text(json.dumps(edited(PHI3_MINI, hidden_size=2560)))  # head dim 80: no kernel takes it
    runner = CliRunner()
    listed = runner.invoke(app, ["from-config", str(path), "--batch-sizes", "1,2", "--max-cache-len", "4096",
                                 "--dry-run", "--json"])  # fmt: skip
    assert listed.exit_code == 0, listed.output
    statuses = {p["status"] for p in json.loads(listed.output)["plans"]}
    assert len(statuses) == 1 and "head dim 80" in statuses.pop()
    built = runner.invoke(app, ["from-config", str(path), "--batch-sizes", "1", "--max-cache-len", "4096",
                                "-o", str(tmp_path / "set.frostset")])  # fmt: skip
    assert built.exit_code == 2 and "head dim 80" in built.output and not (tmp_path / "set.frostset").exists()


@pytest.mark.parametrize("engine", ["hf", "cb", "cb-e4m3", "vllm-tp2"])
def test_phi3_mini_plans_every_form_at_head_dim_96(engine: str) -> None:
    """Phi-3-mini (32 heads of 96, MHA, a window of 2047 on every layer): the prefill, decode and
    mixed plans of each engine validate and resolve (no compile here), over a bf16 or an e4m3 cache."""
    from frostc.serving import ContinuousBatching, VllmEngine, check_entry, deployment, layer_kinds, plan_list

    # transformers' continuous batching reads a window's ring in place only when whole pages divide
    # it, which 2047 keys never are (refused by --page-size): its plans here without the window
    config = edited(PHI3_MINI, sliding_window=None) if engine.startswith("cb") else PHI3_MINI
    model = read_model(config)
    flags = {
        "hf": {},
        "cb": {"cb": ContinuousBatching((64, 256), requests=64, blocks=512)},
        "cb-e4m3": {"cb": ContinuousBatching((64, 256), requests=64, blocks=512), "kv_cache_dtype": "e4m3"},
        "vllm-tp2": {"tp": 2, "pages": 512, "vllm": VllmEngine((64, 256), 64, 256)},
    }[engine]
    dep = deployment(model, batch_sizes=(1, 8), max_cache_len=4096, **flags)
    (kind,) = layer_kinds(model, dep)
    window = None if engine.startswith("cb") else 2046
    assert (kind.head_dim, kind.heads, kind.kv_heads, kind.window_left, kind.gap) == (96, 32 // dep.tp, 32 // dep.tp,
                                                                                       window, None)  # fmt: skip
    entries = plan_list((kind,), dep)
    assert entries and {e.unsupported for e in entries} == {None}
    phases = {"hf": {"prefill", "decode"}, "vllm-tp2": {"mixed"}}.get(engine, {"prefill", "decode", "mixed"})
    assert {e.phase for e in entries} == phases
    for e in entries:
        assert check_entry(e) == (), e.key


def test_from_config_builds_phi3_minis_plans(tmp_path) -> None:
    """The command a user runs: every plan of Phi-3-mini's set built (its prefill and decode plans
    at one batch size), none missing."""
    from typer.testing import CliRunner

    from frostc.cli import app

    path = tmp_path / "config.json"
    path.write_text(json.dumps(PHI3_MINI))
    out = tmp_path / "phi3.frostset"
    runner = CliRunner()
    built = runner.invoke(app, ["from-config", str(path), "--batch-sizes", "1", "--max-cache-len", "4096",
                                "-o", str(out)])  # fmt: skip
    assert built.exit_code == 0, built.output
    from frost_runtime.planset import read_set

    plans = read_set(out)
    assert not plans.missing and plans.entries
    kernels = {k.name for e in plans.entries for k in plans.plan_data(e.key).kernels}
    assert any(n.startswith("sdpa_decode_paged.bf16.d96.p16.causal_br.local") for n in kernels), kernels
    assert "sdpa_fwd_wgmma.bf16.d96.local.varlen" in kernels  # the packed prefill


@pytest.mark.parametrize("engine", ["hf", "cb", "vllm-tp2"])
def test_gpt_oss_plans_every_form_with_a_sinks_slot_per_rank(engine: str) -> None:
    """gpt-oss's plans carry a float32 `sinks` of the rank's query heads in every form; each
    validates and resolves (no compile here)."""
    from frostc.models import read_model
    from frostc.serving import ContinuousBatching, VllmEngine, check_entry, deployment, layer_kinds, plan_list

    model = read_model(GPT_OSS_20B)
    flags = {
        "hf": {},
        "cb": {"cb": ContinuousBatching((64, 256), requests=64, blocks=512)},
        "vllm-tp2": {"tp": 2, "pages": 512, "vllm": VllmEngine((64, 256), 64, 256)},
    }[engine]
    dep = deployment(model, batch_sizes=(1, 8), max_cache_len=4096, **flags)
    kinds = layer_kinds(model, dep)
    assert [k.window_left for k in kinds] == [127, None] and all(k.sinks for k in kinds)
    entries = plan_list(kinds, dep)
    assert entries and {e.unsupported for e in entries} == {None}
    for e in entries:
        sinks = {t.name: t for t in e.description.tensors}["sinks"]
        assert (sinks.dtype, list(sinks.dims)) == ("fp32", [64 // dep.tp])
        assert [n.get("sinks") for n in e.description.nodes if n.op == "sdpa"] == ["sinks"]
        assert check_entry(e) == (), e.key


def test_gpt_oss_over_an_e4m3_cache_is_refused_by_the_sinks_field() -> None:
    from frostc.models import read_model
    from frostc.serving import deployment, layer_kinds, plan_list, status

    model = read_model(GPT_OSS_20B)
    dep = deployment(model, batch_sizes=(1,), max_cache_len=4096, kv_cache_dtype="e4m3")
    statuses = {status(e) for e in plan_list(layer_kinds(model, dep), dep) if e.phase == "decode"}
    (only,) = statuses
    assert only.startswith("refused: nodes[1].sinks: attention sinks over an e4m3 cache")
    assert "keep the cache in the model's dtype" in only
