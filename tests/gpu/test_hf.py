"""Issue 19's acceptance: Hugging Face `generate()` through `attn_implementation="frostc"` on small
random-weight models of the families (tests/hf_models.py; their plan sets are built by
`python -m tests.gpu.build_plans --only hf` into tests/.built/hf).

At batch 4 with left-padded prompts of different lengths, 64 greedy tokens must be those of
the reference implementation (sdpa; eager for Gemma-2, whose softcap sdpa refuses), or differ
only at a near tie (`compare_generations` states the rule). Every attention call is counted:
each layer's prefill and each of its 63 decode steps go through a plan (windows and softcap
included), none through the torch fallback. No host read happens inside the backend: its
functions run under torch's sync debug mode "error".
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (these tests run on the H200 through the device tool)", allow_module_level=True)

import frost_runtime  # noqa: E402
from frost_runtime import hf, hf_fuse  # noqa: E402

from tests.hf_models import TINY, greedy, hf_model, judge, left_padded_prompts  # noqa: E402

SETS = Path(__file__).resolve().parent.parent / ".built" / "hf"
PROMPTS = [7, 30, 19, 12]
NEW_TOKENS = 64
REFERENCE = {"llama": "sdpa", "qwen2": "sdpa", "qwen3": "sdpa", "mistral": "sdpa", "mixtral": "sdpa", "gemma2": "eager",
             "gemma3": "sdpa", "phi3": "sdpa", "gpt_oss": "eager", "deepseek_v3": "sdpa"}  # fmt: skip


def _plans(family: str, suffix: str = ""):
    path = SETS / f"tiny-{family}{suffix}.frostset"
    if not path.exists():
        pytest.skip(f"{path} is not built: run `python -m tests.gpu.build_plans --only hf` on the build machine")
    return frost_runtime.read_set(path)


def _sync_free(fn):
    """`fn` under sync debug mode "error": any synchronizing call inside it raises."""

    def wrapped(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    return wrapped


def _backend(plans, model, name: str):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    backend = hf.FrostcAttention(plans, name=name)
    backend.preload()
    AttentionInterface.register(name, _sync_free(backend.attention))
    AttentionMaskInterface.register(name, _sync_free(backend.mask))
    model.set_attn_implementation(name)
    return backend


@pytest.mark.parametrize("family", list(TINY))
def test_generate_matches_the_reference(family: str) -> None:
    plans = _plans(family)
    model = hf_model(family, device="cuda")
    layers = model.config.num_hidden_layers
    ids, mask = left_padded_prompts(PROMPTS, model.config.vocab_size, "cuda")
    model.set_attn_implementation(REFERENCE[family])
    with torch.no_grad():
        expected = greedy(model, ids, mask, NEW_TOKENS)
    backend = _backend(plans, model, f"frostc-test-{family}")
    with torch.no_grad():
        got = greedy(model, ids, mask, NEW_TOKENS, cache=backend.new_cache())
    torch.cuda.synchronize()

    # every call counted: each through a plan (DeepSeek's steps after the prompt: its context plans,
    # over the context transformers expands from the latents in its own cache)
    calls = dict(backend.calls)
    steps = "context" if family == "deepseek_v3" else "decode"
    assert calls == {"prefill": layers, steps: layers * (NEW_TOKENS - 1)}, calls

    print(f"{family}: {judge(model, REFERENCE[family], backend, ids, mask, expected, got)}; calls {calls}")


@pytest.mark.parametrize("family, fused", [("llama", False), ("gemma2", False), ("llama", True)])
def test_an_fp8_cache_through_the_plans_matches_its_torch_reference(family: str, fused: bool) -> None:
    """A set built with --kv-cache-dtype e4m3: every call through a plan (the decode plans'
    kv_append quantizing, the attention reading e4m3 pages), and the teacher-forced logits equal,
    within the bf16 model's noise, those of the backend's torch reference over the same
    quantized pools (launch=False: the same scales, the same e4m3 bytes, dequantized in fp32)."""
    from tests.hf_models import stepwise_logits

    plans = _plans(family, "-kv_e4m3" + ("-qkv_fused-glue" if fused else ""))
    model = hf_model(family, device="cuda")
    if fused:  # fused layers: the quantizing kv_append reads k and v as views of the QKV buffer
        hf_fuse.fuse_layers(model, plans)
    layers = model.config.num_hidden_layers
    ids, mask = left_padded_prompts(PROMPTS, model.config.vocab_size, "cuda")
    backend = _backend(plans, model, f"frostc-test-{family}-fp8{'-fused' if fused else ''}")
    with torch.no_grad():
        tokens = greedy(model, ids, mask, 16, cache=backend.new_cache())
        assert dict(backend.calls) == {"prefill": layers, "decode": layers * 15}, dict(backend.calls)
        assert backend._pools[0][0].dtype == torch.float8_e4m3fn
        got = stepwise_logits(model, ids, mask, tokens, backend.new_cache())
        reference = hf.install(plans, model, device="cuda", name=f"frostc-test-{family}-fp8-ref{fused}", launch=False)
        want = stepwise_logits(model, ids, mask, tokens, reference.new_cache())
    err = float((got - want).abs().amax())
    print(
        f"{family}{' fused' if fused else ''} e4m3 cache: max logit difference, plans against the torch "
        f"reference, {err:.4f}"
    )
    assert err < 0.1, err


def test_a_prompt_too_long_to_read_in_place_is_packed() -> None:
    """Prefill reads HF's rows in place when every span fits the plan's longest sequence (2s - 1
    tokens); a longer prompt is packed first. Both give the reference's tokens (or a near tie)."""
    plans = _plans("llama")
    model = hf_model("llama", device="cuda")
    longest = max(c.longest for c in plans.plan_data(plans.select("prefill", "l0", 1)).lengths)
    length = longest // 2 + 20  # 2 * length - 1 > longest: the packing path
    ids, mask = left_padded_prompts([length], model.config.vocab_size, "cuda")
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        expected = greedy(model, ids, mask, 8)
    backend = _backend(plans, model, "frostc-test-packed")
    with torch.no_grad():
        got = greedy(model, ids, mask, 8, cache=backend.new_cache())
    assert backend.calls["prefill"] == model.config.num_hidden_layers and "fallback" not in backend.calls
    print("packed:", judge(model, "sdpa", backend, ids, mask, expected, got))


def test_the_backend_reads_nothing_back_in_a_decode_step_captured_as_a_graph() -> None:
    """A prefill, then one decode step captured in a CUDA graph and replayed: the replay's output
    equals the eager step's (lengths and positions live in device buffers)."""
    plans = _plans("llama")
    model = hf_model("llama", device="cuda")
    backend = _backend(plans, model, "frostc-test-graph")
    ids, mask = left_padded_prompts(PROMPTS, model.config.vocab_size, "cuda")
    with torch.no_grad():
        graph = hf.DecodeGraph(model, backend, batch=len(PROMPTS))
        first = graph.prefill(ids, mask)
        eager = [first]
        replayed = [first]
        for _ in range(8):
            eager.append(graph.step(eager[-1], capture=False))
        graph.reset(ids, mask)
        for _ in range(8):
            replayed.append(graph.step(replayed[-1]))
    assert torch.equal(torch.stack(eager), torch.stack(replayed))


@pytest.mark.parametrize("family", hf_fuse.FAMILIES)
def test_fused_layers_over_a_fused_set_generate_the_references_tokens(family: str) -> None:
    """A model with fused layers (frost_runtime.hf_fuse) over a set built with --qkv-layout fused
    --glue (decode plans read q, k, v where the QKV GEMM wrote them; the decode steps' norms and
    activations through glue plans): the unfused model's sdpa tokens, or a near tie by the rule;
    every attention call through a plan, and every decode step's norms and activation too."""
    plans = _plans(family, "-qkv_fused-glue")
    reference = hf_model(family, device="cuda")
    reference.set_attn_implementation("sdpa")
    ids, mask = left_padded_prompts(PROMPTS, reference.config.vocab_size, "cuda")
    with torch.no_grad():
        expected = greedy(reference, ids, mask, NEW_TOKENS)
    model = hf_model(family, device="cuda")
    hf_fuse.fuse_layers(model, plans)
    layers = model.config.num_hidden_layers
    backend = _backend(plans, model, f"frostc-test-fused-{family}")
    with torch.no_grad():
        got = greedy(model, ids, mask, NEW_TOKENS, cache=backend.new_cache())
    torch.cuda.synchronize()
    calls = dict(backend.calls)
    assert calls == {"prefill": layers, "decode": layers * (NEW_TOKENS - 1)}, calls
    steps = NEW_TOKENS - 1  # decode steps: batch 4, one token each: the t4 glue plans
    glue = dict(model.model.norm.frostc_glue.calls)
    assert glue == {"rms_norm": (layers + 1) * steps, "add_rms_norm": layers * steps, "silu_mul": layers * steps}, glue
    verdict = judge(model, "sdpa", backend, ids, mask, expected, got, reference_model=reference)
    print(f"fused {family}: {verdict}; calls {calls}; glue {glue}")


def test_fused_layers_decode_the_same_through_either_qkv_layout_and_in_a_graph() -> None:
    """One fused model (its glue from the fused set) over the fused-layout set (views handed over
    as they are) and over a separate-layout set (the views copied into its rows): the same logits
    bit for bit, step after step; and a captured step replays as the eager one."""
    model = hf_model("llama", device="cuda")
    fused_set = _plans("llama", "-qkv_fused-glue")
    hf_fuse.fuse_layers(model, fused_set)
    ids, mask = left_padded_prompts(PROMPTS, model.config.vocab_size, "cuda")
    steps = {}
    for name, plans in (("fused", fused_set), ("separate", _plans("llama"))):
        backend = _backend(plans, model, f"frostc-test-fused-layout-{name}")
        with torch.no_grad():
            graph = hf.DecodeGraph(model, backend, batch=len(PROMPTS))
            eager = [graph.prefill(ids, mask)]
            logits = []
            for _ in range(6):
                eager.append(graph.step(eager[-1], capture=False))
                logits.append(graph._forward().clone())  # the same step again: the same logits
            graph.reset(ids, mask)
            replayed = [eager[0]]
            for _ in range(6):
                replayed.append(graph.step(replayed[-1]))
        assert torch.equal(torch.stack(eager), torch.stack(replayed)), name
        assert backend.calls["decode"] > 0 and "fallback" not in backend.calls
        steps[name] = (torch.stack(eager), torch.stack(logits))
    assert torch.equal(steps["fused"][0], steps["separate"][0])
    assert torch.equal(steps["fused"][1], steps["separate"][1])
