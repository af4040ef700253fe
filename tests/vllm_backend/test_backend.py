"""frost_vllm against vLLM 0.32's real classes, on the CPU: the plugin's registration and
selection, `validate_configuration`'s refusals, the metadata builder on vLLM's own
`CommonAttentionMetadata` (decode, chunked prefill, mixed and padded steps) against the slot values
the plans expect, and the impl's choice of layer kind. vLLM 0.32 wants transformers < 5.20, so
these run in a venv of their own: `bash tests/vllm_backend/run.sh` (CI runs it); elsewhere they skip.
The launch itself needs a GPU: tests/gpu/test_vllm_launch.py runs it on tensors shaped as here.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM 0.32 is not in this venv: run `bash tests/vllm_backend/run.sh` (its own venv)")

import torch  # noqa: E402
from frost_vllm import plans  # noqa: E402
from frost_vllm.backend import FrostcBackend, FrostcImpl, FrostcMetadataBuilder  # noqa: E402
from frost_vllm.plans import SetError  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.config.attention import AttentionConfig  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from tests.vllm_sets import (  # noqa: E402
    CASES,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    PAGE_SIZE,
    PAGES,
    TRANSFORMERS_SET,
)

LLAMA, LLAMA_HND_E4M3, GEMMA2, LLAMA_PER_HEAD, GPT_OSS = CASES


@pytest.fixture(autouse=True)
def _built() -> None:
    missing = [c.path for c in CASES if not c.path.exists()]
    if missing:
        pytest.fail(f"{missing} not built: run `python -m tests.vllm_sets` in frostc's venv (run.sh does)")


def use_set(monkeypatch, path) -> None:
    """FROSTC_PLAN_SET=path for this test (the set is read once per process: the cache is reset)."""
    monkeypatch.setenv(plans.ENV, str(path))
    plans.active_set.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_set_cache():
    plans.active_set.cache_clear()
    yield
    plans.active_set.cache_clear()


# ---------------------------------------------------------------------------- registration


def test_the_entry_point_registers_frostc_and_vllm_selects_it_by_name() -> None:
    from importlib.metadata import entry_points

    from vllm.plugins import load_general_plugins

    assert "frostc" in {e.name for e in entry_points(group="vllm.general_plugins")}
    load_general_plugins()
    assert AttentionBackendEnum["FROSTC"].get_class() is FrostcBackend
    assert AttentionConfig.validate_backend_before("frostc") is AttentionBackendEnum["FROSTC"]
    assert AttentionConfig(backend="FROSTC").backend is AttentionBackendEnum["FROSTC"]
    import frost_vllm

    frost_vllm.register()  # a second call in one process is harmless
    assert AttentionBackendEnum["FROSTC"].get_class() is FrostcBackend


# ---------------------------------------------------------------------------- validate_configuration


def selector_config(**changes) -> dict:
    """The keywords vLLM's CUDA platform passes (platforms/cuda.py), for the tiny Llama."""
    config = dict(
        head_size=64, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None, use_mla=False, has_sink=False,
        use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False, attn_type="decoder",
        has_sliding_window=False, use_non_causal=False, use_batch_invariant=False, use_kv_connector=False,
        use_pcp=False, use_adaptive_verification=False, use_dcp=False, use_rswa=False,
        device_capability=DeviceCapability(9, 0),
    )  # fmt: skip
    return config | changes


def test_the_sets_model_is_valid(monkeypatch) -> None:
    use_set(monkeypatch, LLAMA.path)
    assert FrostcBackend.validate_configuration(**selector_config()) == []
    assert FrostcBackend.validate_configuration(**selector_config(block_size=16)) == []
    use_set(monkeypatch, GEMMA2.path)
    config = selector_config(head_size=256, has_sliding_window=True)
    assert FrostcBackend.validate_configuration(**config) == []
    use_set(monkeypatch, LLAMA_HND_E4M3.path)
    assert FrostcBackend.validate_configuration(**selector_config(kv_cache_dtype="fp8")) == []
    use_set(monkeypatch, LLAMA_PER_HEAD.path)
    config = selector_config(kv_cache_dtype="fp8_e4m3", use_per_head_quant_scales=True)
    assert FrostcBackend.validate_configuration(**config) == []
    use_set(monkeypatch, GPT_OSS.path)
    assert FrostcBackend.supports_sink()
    assert FrostcBackend.validate_configuration(**selector_config(has_sink=True, has_sliding_window=True)) == []
    (reason,) = FrostcBackend.validate_configuration(**selector_config(has_sliding_window=True))
    assert reason.startswith("attention sinks: the model has no attention sinks, the set")


def test_gpt_oss_layers_take_their_sinks(monkeypatch) -> None:
    """vLLM hands gpt-oss's impl its `sinks` parameter (one per query head on the rank): the layer
    finds its kind by them; a layer without sinks is refused by the set built with them."""
    use_set(monkeypatch, GPT_OSS.path)
    gpt_oss = dict(num_heads=8, head_size=64, scale=0.125, num_kv_heads=2)
    sinks = torch.randn(8, dtype=torch.bfloat16)
    assert impl(**gpt_oss, sliding_window=24, sinks=sinks).launcher.kind.kind == "l0"
    assert impl(**gpt_oss, sinks=sinks).launcher.kind.kind == "l1"
    with pytest.raises(SetError, match="attention sinks is False, the set's True"):
        impl(**gpt_oss)
    with pytest.raises(SetError, match=r"attention sinks of shape \(4,\): one per query head is \(8,\)"):
        impl(**gpt_oss, sinks=sinks[:4])


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(head_size=128), "head_size 128"),
        (dict(dtype=torch.float16), "--dtype bf16"),
        (dict(kv_cache_dtype="fp8"), "--kv-cache-dtype fp8"),
        (dict(block_size=32), "--block-size 32"),
        (dict(has_sink=True), "attention sinks"),
        (dict(use_per_head_quant_scales=True), "per-head KV scales"),
        (dict(device_capability=DeviceCapability(8, 0)), "sm_90a"),
        (dict(use_mla=True), "MLA not supported"),
        (dict(attn_type="encoder_only"), "attention type encoder_only not supported"),
        (dict(use_non_causal=True), "non-causal attention not supported"),
    ],
)
def test_what_the_set_does_not_cover_is_refused_by_name(monkeypatch, changes, named) -> None:
    use_set(monkeypatch, LLAMA.path)
    reasons = FrostcBackend.validate_configuration(**selector_config(**changes))
    assert any(named in r for r in reasons), reasons
    assert not any(r.endswith(" not supported") and r.split()[0] in ("head_size", "dtype") for r in reasons)


def test_no_set_or_a_foreign_one_is_the_reason(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(plans.ENV, raising=False)
    (reason,) = FrostcBackend.validate_configuration(**selector_config())
    assert plans.ENV in reason and "--engine vllm" in reason
    use_set(monkeypatch, tmp_path / "nowhere.frostset")
    (reason,) = FrostcBackend.validate_configuration(**selector_config())
    assert "nowhere.frostset" in reason
    if not TRANSFORMERS_SET.exists():
        pytest.fail(f"{TRANSFORMERS_SET} not built: run `python -m tests.vllm_sets`")
    use_set(monkeypatch, TRANSFORMERS_SET)
    (reason,) = FrostcBackend.validate_configuration(**selector_config())
    assert "not built for vLLM" in reason and "--engine vllm" in reason


def test_the_backend_states_the_sets_layout_and_block_size(monkeypatch) -> None:
    use_set(monkeypatch, LLAMA.path)
    assert FrostcBackend.supported_kv_cache_layouts() == (KVCacheLayout.LBNHC,)
    assert FrostcBackend.get_supported_kernel_block_sizes() == [PAGE_SIZE]
    assert FrostcBackend.get_supported_head_sizes() == [64]
    assert FrostcBackend.forward_includes_kv_cache_update  # the plan appends the step's K/V
    use_set(monkeypatch, LLAMA_HND_E4M3.path)
    assert FrostcBackend.supported_kv_cache_layouts() == (KVCacheLayout.LBHNC,)
    assert not FrostcBackend.supports_per_head_quant_scales()
    use_set(monkeypatch, LLAMA_PER_HEAD.path)
    assert FrostcBackend.supports_per_head_quant_scales()


# ---------------------------------------------------------------------------- the metadata builder


def vllm_config(model_dir, **changes) -> VllmConfig:
    """A real VllmConfig of the tiny Llama as vLLM would be started for the test sets."""
    settings = dict(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                    max_model_len=MAX_MODEL_LEN, block_size=PAGE_SIZE, num_gpu_blocks_override=PAGES)  # fmt: skip
    settings |= changes
    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=settings["max_model_len"],
                        dtype="bfloat16")  # fmt: skip
    scheduler = SchedulerConfig(
        max_num_seqs=settings["max_num_seqs"], max_num_batched_tokens=settings["max_num_batched_tokens"],
        max_model_len=settings["max_model_len"], is_encoder_decoder=False,
    )  # fmt: skip
    cache = CacheConfig(block_size=settings["block_size"], num_gpu_blocks_override=settings["num_gpu_blocks_override"])
    return VllmConfig(model_config=model, scheduler_config=scheduler, cache_config=cache,
                      device_config=DeviceConfig(device="cpu"))  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import json

    from tests.hf_models import TINY

    path = tmp_path_factory.mktemp("tiny-llama")
    (path / "config.json").write_text(json.dumps(TINY["llama"] | {"architectures": ["LlamaForCausalLM"]}))
    return path


SPEC = FullAttentionSpec(block_size=PAGE_SIZE, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)


def builder(monkeypatch, model_dir, **changes) -> FrostcMetadataBuilder:
    use_set(monkeypatch, LLAMA.path)
    return FrostcMetadataBuilder(SPEC, ["model.layers.0.self_attn.attn"], vllm_config(model_dir, **changes), "cpu")


def test_the_builder_supports_cuda_graphs_for_every_batch(monkeypatch, model_dir) -> None:
    b = builder(monkeypatch, model_dir)
    assert b.get_cudagraph_support(b.vllm_config, SPEC) is AttentionCGSupport.ALWAYS


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(max_num_seqs=16), "--max-num-seqs 16"),
        (dict(max_num_batched_tokens=128), "--max-num-batched-tokens 128"),
        (dict(block_size=32), "--block-size 32"),
        (dict(num_gpu_blocks_override=None), "--num-gpu-blocks-override 96"),
        (
            dict(num_gpu_blocks_override=200),
            "--num-gpu-blocks-override 200: the set was built for 96 (frostc from-config --pages)",
        ),
    ],
)
def test_the_builder_refuses_an_engine_the_set_was_not_built_for(monkeypatch, model_dir, changes, named) -> None:
    with pytest.raises(SetError, match="do not match") as caught:
        builder(monkeypatch, model_dir, **changes)
    assert named in str(caught.value)


def test_the_builder_refuses_a_group_whose_blocks_are_not_the_sets_pages(monkeypatch, model_dir) -> None:
    use_set(monkeypatch, LLAMA.path)
    spec = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    with pytest.raises(SetError, match="blocks of 32 tokens"):
        FrostcMetadataBuilder(spec, ["model.layers.0.self_attn.attn"], vllm_config(model_dir), "cpu")


def common_metadata(lens, padded_reqs: int = 0, padded_tokens: int = 0, seed: int = 0) -> CommonAttentionMetadata:
    """vLLM 0.32's CommonAttentionMetadata as its GPU runner fills it (on the CPU): (new tokens,
    context) per request, then `padded_reqs` requests of no tokens and length 0 (block-table rows
    of the null block 0) and `padded_tokens` tokens of slot -1."""
    import random

    rng = random.Random(seed)
    width = MAX_MODEL_LEN // PAGE_SIZE
    free = list(range(1, PAGES))
    rng.shuffle(free)
    n = len(lens) + padded_reqs
    table = torch.zeros(n, width, dtype=torch.int32)
    starts, slots = [0], []
    for i, (q, ctx) in enumerate(lens):
        for j in range(-(-(ctx + q) // PAGE_SIZE)):
            table[i, j] = free.pop()
        slots += [int(table[i, p // PAGE_SIZE]) * PAGE_SIZE + p % PAGE_SIZE for p in range(ctx, ctx + q)]
        starts.append(starts[-1] + q)
    starts += [starts[-1]] * padded_reqs
    slots += [-1] * padded_tokens
    seq_lens = torch.tensor([q + c for q, c in lens] + [0] * padded_reqs, dtype=torch.int32)
    qsl = torch.tensor(starts, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens, num_reqs=n,
        num_actual_tokens=starts[-1] + padded_tokens, max_query_len=max(q for q, _ in lens),
        max_seq_len=int(seq_lens.max()), block_table_tensor=table, slot_mapping=torch.tensor(slots, dtype=torch.int64),
        causal=True, seq_lens_cpu_upper_bound=seq_lens.clone(),
    )  # fmt: skip


STEPS = {
    "decode": ([(1, 17), (1, 0), (1, 300), (1, 95)], 0, 0),
    "chunked prefill": ([(48, 200)], 0, 0),
    "mixed": ([(20, 33), (1, 5), (1, 400), (4, 60)], 0, 0),
    "padded": ([(1, 40), (2, 7), (1, 1)], 2, 12),  # a capture size of 16: 4 tokens + 12 padding
}


@pytest.mark.parametrize("name", STEPS)
def test_the_builder_gives_the_plans_slots_vllms_step(monkeypatch, model_dir, name) -> None:
    lens, padded_reqs, padded_tokens = STEPS[name]
    m = common_metadata(lens, padded_reqs, padded_tokens)
    b = builder(monkeypatch, model_dir)
    step = b.build(0, m).step
    tokens, n = m.num_actual_tokens, m.num_reqs
    assert step.bucket == b.set.bucket(tokens)
    slots = b.set.slots("l0", step.bucket)
    for name_, tensor in (("cu_q", step.cu_q), ("cache_len", step.cache_len), ("page_table", step.page_table),
                          ("slot_mapping", step.slot_mapping)):  # fmt: skip
        assert tuple(tensor.shape) == slots[name_].dims and tensor.dtype == torch.int32, name_
        assert tensor.is_contiguous()
    seqs = step.bucket.sequences
    assert step.cu_q.tolist() == m.query_start_loc.tolist() + [m.query_start_loc[-1].item()] * (seqs - n)
    assert step.cache_len.tolist() == m.seq_lens.tolist() + [0] * (seqs - n)
    assert torch.equal(step.page_table[:n], m.block_table_tensor)
    expected_slots = m.slot_mapping.tolist() + [-1] * (step.bucket.tokens - m.slot_mapping.shape[0])
    assert step.slot_mapping.tolist() == expected_slots


def test_a_step_reuses_the_builders_buffers_and_forgets_the_last(monkeypatch, model_dir) -> None:
    """Under full CUDA graphs the plans hold these pointers: every step of a bucket fills the same
    memory, and what an earlier, larger step left there is not the new step's."""
    b = builder(monkeypatch, model_dir)
    first = b.build(0, common_metadata([(30, 100), (20, 3), (10, 0)], padded_tokens=4)).step
    second = b.build(0, common_metadata([(1, 9)], padded_reqs=1, padded_tokens=63)).step
    assert first.bucket == second.bucket and second.cu_q.data_ptr() == first.cu_q.data_ptr()
    assert second.cu_q.tolist() == [0, 1] + [1] * (second.bucket.sequences - 1)
    assert second.cache_len.tolist() == [10] + [0] * (second.bucket.sequences - 1)
    assert second.slot_mapping[1:].eq(-1).all()


def test_a_step_past_the_set_is_refused_before_anything_runs(monkeypatch, model_dir) -> None:
    b = builder(monkeypatch, model_dir)
    with pytest.raises(SetError, match="--max-num-batched-tokens 64"):
        b.build(0, common_metadata([(65, 0)]))
    with pytest.raises(SetError, match="--max-num-seqs 8"):
        b.build(0, common_metadata([(1, 1)] * 9))


# ---------------------------------------------------------------------------- the impl


def impl(**changes) -> FrostcImpl:
    """FrostcImpl as vLLM's Attention builds it: positionally (attention.py), the tiny Llama's."""
    args = dict(num_heads=8, head_size=64, scale=0.125, num_kv_heads=2, alibi_slopes=None, sliding_window=None,
                kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder",
                kv_sharing_target_layer_name=None) | changes  # fmt: skip
    extra = {k: args.pop(k) for k in list(args) if k == "sinks"}
    return FrostcImpl(*args.values(), **extra)


def test_each_layer_finds_its_kind(monkeypatch) -> None:
    use_set(monkeypatch, LLAMA.path)
    assert impl().launcher.kind.kind == "l0"
    use_set(monkeypatch, GEMMA2.path)
    gemma = dict(num_heads=4, head_size=256, scale=256**-0.5, logits_soft_cap=50.0)
    assert impl(**gemma, sliding_window=24).launcher.kind.kind == "l0"  # vLLM's window counts the query
    assert impl(**gemma).launcher.kind.kind == "l1"


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(num_heads=16), "heads (per rank: check --tp) is 16"),
        (dict(sliding_window=100), "sliding window"),
        (dict(logits_soft_cap=30.0), "logits_soft_cap is 30.0"),
        (dict(scale=0.2), "scale is 0.2"),
        (dict(kv_sharing_target_layer_name="model.layers.0.self_attn.attn"), "KV sharing"),
        (dict(alibi_slopes=[0.5] * 8), "ALiBi"),
        (dict(attn_type="encoder"), "attention type encoder"),
        (dict(sinks=torch.zeros(8)), "attention sinks"),
    ],
)
def test_a_layer_the_set_does_not_compute_is_refused_by_name(monkeypatch, changes, named) -> None:
    use_set(monkeypatch, LLAMA.path)
    with pytest.raises(SetError) as caught:
        impl(**changes)
    assert named in str(caught.value)


def test_vllms_profiling_run_and_fused_output_quantization(monkeypatch) -> None:
    use_set(monkeypatch, LLAMA.path)
    layer = impl()
    output = torch.full((4, 8, 64), float("nan"), dtype=torch.bfloat16)
    q = torch.randn(4, 8, 64, dtype=torch.bfloat16)
    kv = torch.randn(4, 2, 64, dtype=torch.bfloat16)
    cache = torch.empty(PAGES, 2, PAGE_SIZE, 128, dtype=torch.bfloat16)
    assert layer.forward(None, q, kv, kv, cache, None, output).eq(0).all()  # attn_metadata None: profiling
    with pytest.raises(SetError, match="fused output quantization"):
        layer.forward(None, q, kv, kv, cache, None, output, output_scale=torch.ones(1))
