"""The Hugging Face backend (runtime/frost_runtime/hf/) on the CPU: registration, the mask
function, the checks of a model's calls against its plan set, and generation through the
backend's torch reference (`launch=False`: the same pools, packing and lengths as the plan path,
computed in torch) against HF's own attention, with left-padded batches. The plan path itself
runs on the GPU (tests/gpu/test_hf.py)."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import frost_runtime  # noqa: E402
from frost_runtime import hf  # noqa: E402

from tests.hf_models import MAX_CACHE_LEN, TINY, build_tiny_set, greedy, hf_model, judge, left_padded_prompts  # noqa: E402

REFERENCE = {"llama": "sdpa", "qwen2": "sdpa", "qwen3": "sdpa", "mistral": "sdpa", "mixtral": "sdpa", "gemma2": "eager",
             "gemma3": "sdpa", "phi3": "sdpa", "gpt_oss": "eager", "deepseek_v3": "sdpa"}  # fmt: skip


@pytest.fixture(scope="module")
def sets() -> dict:
    return {family: frost_runtime.read_set(build_tiny_set(family)) for family in TINY}


def _backend(plans, model, name: str) -> hf.FrostcAttention:
    return hf.install(plans, model, device="cpu", name=name, launch=False)


def test_install_registers_the_attention_and_its_mask(sets) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    model = hf_model("llama", device="cpu")
    backend = _backend(sets["llama"], model, "frostc-cpu-install")
    assert "frostc-cpu-install" in AttentionInterface._global_mapping
    assert ALL_MASK_ATTENTION_FUNCTIONS["frostc-cpu-install"] == backend.mask
    assert model.config._attn_implementation == "frostc-cpu-install"
    assert "flash" not in hf.NAME


def test_the_mask_function_finds_each_rows_run(sets) -> None:
    backend = hf.FrostcAttention(sets["llama"], device="cpu", launch=False)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 0, 1, 1], [0, 0, 0, 0, 0]])
    rows = backend.mask(batch_size=5, q_length=5, kv_length=5, attention_mask=mask)
    assert rows.first.tolist() == [2, 0, 0, 1, 0]
    assert rows.count.tolist() == [3, 5, 2, 3, 0]
    assert rows.broken.tolist() == [False, False, False, True, False]
    full = backend.mask(batch_size=2, q_length=3, kv_length=7, attention_mask=None)
    assert full.count.tolist() == [7, 7] and not full.broken.any()


@pytest.mark.parametrize("family", list(TINY))
def test_generation_through_the_backend_matches_hf(sets, family: str) -> None:
    """Left-padded prompts of different lengths; the backend's pools, packing and lengths give
    the tokens of HF's own attention, or differ at a near tie only (the torch reference computes
    in fp32, HF in bf16; `compare_generations` states the rule)."""
    model = hf_model(family, device="cpu")
    ids, mask = left_padded_prompts([5, 11, 3], model.config.vocab_size, "cpu")
    model.set_attn_implementation(REFERENCE[family])
    with torch.no_grad():
        expected = greedy(model, ids, mask, 6)
    backend = _backend(sets[family], model, f"frostc-cpu-{family}")
    with torch.no_grad():
        got = greedy(model, ids, mask, 6, cache=backend.new_cache())
    assert backend.calls == {"reference": model.config.num_hidden_layers * 6}
    # equal, or a near tie by the rule (judge raises AssertionError otherwise)
    assert judge(model, REFERENCE[family], backend, ids, mask, expected, got).startswith(("equal", "near tie"))


def test_a_row_that_is_not_one_run_gives_nan_not_a_wrong_answer(sets) -> None:
    model = hf_model("llama", device="cpu")
    backend = _backend(sets["llama"], model, "frostc-cpu-holes")
    ids, _ = left_padded_prompts([6, 6], model.config.vocab_size, "cpu")
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, past_key_values=backend.new_cache()).logits
    assert logits[0].isnan().all() and not logits[1].isnan().any()


def test_calls_the_set_was_not_built_for_are_refused_naming_what(sets) -> None:
    model = hf_model("llama", device="cpu")
    _backend(sets["qwen2"], model, "frostc-cpu-mismatch")  # a Qwen2 set under a Llama model
    ids, mask = left_padded_prompts([4], model.config.vocab_size, "cpu")
    with pytest.raises(ValueError, match="plan set 'tiny-qwen2' serves layers"):
        hf.install(sets["qwen2"], hf_model("gemma2", device="cpu"), device="cpu", launch=False)
    backend = hf.FrostcAttention(sets["qwen2"], device="cpu", launch=False).install()
    model.set_attn_implementation("frostc")
    with pytest.raises(ValueError, match=r"heads: the model passes 8, the set was built for 14"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask, past_key_values=backend.new_cache())


def test_a_prompt_over_the_cache_is_refused(sets) -> None:
    model = hf_model("llama", device="cpu")
    backend = _backend(sets["llama"], model, "frostc-cpu-long")
    ids, mask = left_padded_prompts([MAX_CACHE_LEN + 1], model.config.vocab_size, "cpu")
    with pytest.raises(ValueError, match=r"257 tokens per sequence: over the plan set's cache of 256"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask, past_key_values=backend.new_cache())


def test_another_cache_falls_back_with_one_warning(sets) -> None:
    """HF's own DynamicCache hands the attention whole K/V: the backend computes them in torch
    with HF's mask and warns once; the tokens are still HF's."""
    model = hf_model("llama", device="cpu")
    ids, mask = left_padded_prompts([5, 9], model.config.vocab_size, "cpu")
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        expected = greedy(model, ids, mask, 4)
    backend = hf.install(sets["llama"], model, device="cpu", name="frostc-cpu-other")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        got = greedy(model, ids, mask, 4)
    assert torch.equal(expected, got)
    said = [w for w in caught if "frostc: computing attention in torch" in str(w.message)]
    assert len(said) == 1 and "the cache is not frostc's" in str(said[0].message)
    assert backend.calls["fallback"] == 2 * 4


def test_the_decode_graph_helper_steps_as_generate_does(sets) -> None:
    """DecodeGraph's eager step (the one it captures on a GPU) gives generate's tokens."""
    model = hf_model("llama", device="cpu")
    ids, mask = left_padded_prompts([5, 9, 2], model.config.vocab_size, "cpu")
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        expected = greedy(model, ids, mask, 5)
    backend = _backend(sets["llama"], model, "frostc-cpu-graph")
    graph = hf.DecodeGraph(model, backend, batch=3)
    with torch.no_grad():
        tokens = [graph.prefill(ids, mask)]
        for _ in range(4):
            tokens.append(graph.step(tokens[-1], capture=False))
    assert torch.equal(torch.stack(tokens, dim=1), expected)


def test_the_decode_graph_helper_stops_at_the_cache(sets) -> None:
    model = hf_model("llama", device="cpu")
    backend = _backend(sets["llama"], model, "frostc-cpu-graph-full")
    graph = hf.DecodeGraph(model, backend, batch=1)
    ids, mask = left_padded_prompts([MAX_CACHE_LEN - 1], model.config.vocab_size, "cpu")
    with torch.no_grad():
        tokens = graph.step(graph.prefill(ids, mask), capture=False)  # the cache's last position
        with pytest.raises(ValueError, match="past the plan set's cache of 256 tokens"):
            graph.step(tokens, capture=False)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_an_fp8_cache_quantizes_with_scales_from_the_prefill_and_stays_close(sets, family: str) -> None:
    """A set built with --kv-cache-dtype e4m3: float8 pools, scales from each layer's prefill (amax
    / 448 x the headroom, per KV head), decode over the dequantized pools. Its teacher-forced
    logits stay near the fp32 model's: within a bound of the bf16 cache's error (e4m3 keeps 3
    mantissa bits, bf16 7)."""
    from transformers import DynamicCache

    from tests.hf_models import reference_logits, stepwise_logits

    fp8 = frost_runtime.read_set(build_tiny_set(family, "e4m3"))
    assert fp8.serving.kv_cache_dtype == "e4m3" and sets[family].serving.kv_cache_dtype == "bf16"
    decode_plan = fp8.plan_data(next(k for k in fp8.keys if "decode" in k))
    assert {s.name: s.dtype for s in decode_plan.slots}["k_cache"] == "e4m3"
    model = hf_model(family, device="cpu")
    ids, mask = left_padded_prompts([5, 11, 3], model.config.vocab_size, "cpu")
    model.set_attn_implementation(REFERENCE[family])
    with torch.no_grad():
        tokens = greedy(model, ids, mask, 6)
        logits_exact = reference_logits(model, ids, mask, tokens)
        logits_sdpa = stepwise_logits(model, ids, mask, tokens, DynamicCache(config=model.config))
    errors = {}
    for name, plans in (("bf16", sets[family]), ("e4m3", fp8)):
        backend = _backend(plans, model, f"frostc-cpu-{family}-{name}")
        with torch.no_grad():
            logits = stepwise_logits(model, ids, mask, tokens, backend.new_cache())
        errors[name] = float((logits - logits_exact).abs().amax())
        if name == "e4m3":
            k_pool, v_pool = backend._pools[0]
            assert k_pool.dtype == v_pool.dtype == torch.float8_e4m3fn
            k_scale, v_scale = backend._scales[0]
            assert bool((k_scale > 0).all() and (k_scale != 1).all() and (v_scale != 1).all())
            stored = torch.cat([k_pool.float().flatten(), v_pool.float().flatten()])
            assert bool(stored.isfinite().all()) and float(stored.abs().amax()) > 448 / hf.KV_SCALE_HEADROOM / 4
    sdpa = float((logits_sdpa - logits_exact).abs().amax())
    print(f"\n{family}: max logit error against fp32, sdpa {sdpa:.4f}, bf16 cache {errors['bf16']:.4f}, "
          f"e4m3 cache {errors['e4m3']:.4f}")  # fmt: skip
    assert errors["e4m3"] <= 8 * max(errors["bf16"], sdpa) + 0.05, (errors, sdpa)


def test_the_decode_graph_helper_may_compile_the_step_around_the_backend(sets) -> None:
    """`compile_model=True`: the step's forward through torch.compile (dynamo traces the
    backend's attention and mask functions); the tokens are the eager step's."""
    model = hf_model("llama", device="cpu")
    backend = _backend(sets["llama"], model, "frostc-cpu-compiled-step")
    ids, mask = left_padded_prompts([5, 11], model.config.vocab_size, "cpu")
    runs = []
    for compile_model in (False, True):
        graph = hf.DecodeGraph(model, backend, batch=2, compile_model=compile_model)
        with torch.no_grad():
            tokens = [graph.prefill(ids, mask)]
            for _ in range(3):
                tokens.append(graph.step(tokens[-1], capture=False))
        runs.append(torch.stack(tokens))
    assert torch.equal(runs[0], runs[1])


def _dynamo_counts() -> tuple[int, int]:
    """Graphs dynamo compiled so far in this process, and its recompile-limit fallbacks to eager."""
    from torch._dynamo.utils import counters

    limit_hits = sum(n for what, n in counters["unimplemented"].items() if "recompile limit" in what)
    return counters["stats"]["unique_graphs"], limit_hits


def test_compiled_decode_graphs_compile_once_each_at_any_batch_and_step(sets) -> None:
    """`compile_model=True` at two batch sizes on one model, each through a generation, a reset
    and another: one compile per graph (a step's host state is the same at every step and every
    generation, and each graph's step keeps its own compiled entries: the model's forward code is
    not where they are counted), never dynamo's recompile limit and its silent fallback to eager,
    and the eager step's tokens."""
    model = hf_model("llama", device="cpu")
    backend = _backend(sets["llama"], model, "frostc-cpu-compile-once")

    def generations(batch: int, compile_model: bool) -> torch.Tensor:
        ids, mask = left_padded_prompts([5, 11, 3][:batch], model.config.vocab_size, "cpu")
        graph = hf.DecodeGraph(model, backend, batch=batch, compile_model=compile_model)
        runs = []
        with torch.no_grad():
            for _ in range(2):  # prefill is a reset: a new cache, the same graph
                tokens = [graph.prefill(ids, mask)]
                for _ in range(3):
                    tokens.append(graph.step(tokens[-1], capture=False))
                runs.append(torch.stack(tokens))
        return torch.stack(runs)

    expected = {batch: generations(batch, False) for batch in (2, 3)}
    graphs, limit_hits = _dynamo_counts()
    got = {batch: generations(batch, True) for batch in (2, 3)}
    assert _dynamo_counts() == (graphs + 2, limit_hits)
    for batch in (2, 3):
        assert torch.equal(got[batch], expected[batch])


def test_a_compiled_decode_graph_over_the_recompile_limit_says_so(sets) -> None:
    """A step that would recompile past dynamo's limit (here the model's attention switched under
    the graph, with a limit of 1) is refused, naming the limit, not run uncompiled in silence."""
    model = hf_model("llama", device="cpu")
    backend = _backend(sets["llama"], model, "frostc-cpu-compile-limit")
    ids, mask = left_padded_prompts([5, 11], model.config.vocab_size, "cpu")
    graph = hf.DecodeGraph(model, backend, batch=2, compile_model=True)
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=1):
        tokens = graph.step(graph.prefill(ids, mask), capture=False)
        model.set_attn_implementation("sdpa")
        with pytest.raises(hf.RecompileLimitError, match="recompile limit"):
            graph.step(tokens, capture=False)


def test_gpt_oss_sinks_reach_the_attention_in_prefill_and_decode(sets) -> None:
    """gpt-oss's sinks (made large here, so they move every row's weights) pass from the model's
    `s_aux` to the backend: its fp32 logits over a prefill and two decode steps are HF eager's;
    the same model with its sinks zeroed gives other logits (the check can fail)."""
    model = hf_model("gpt_oss", device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    for layer in model.model.layers:
        layer.self_attn.sinks.data = 2.0 + torch.randn(layer.self_attn.sinks.shape, generator=g)
    ids, mask = left_padded_prompts([7, 12], model.config.vocab_size, "cpu")
    tokens = torch.randint(1, model.config.vocab_size, (2, 3), generator=g)

    def logits(cache) -> torch.Tensor:
        from tests.hf_models import stepwise_logits

        with torch.no_grad():
            return stepwise_logits(model, ids, mask, tokens, cache)

    from transformers import DynamicCache

    model.set_attn_implementation("eager")
    expected = logits(DynamicCache(config=model.config))
    backend = hf.FrostcAttention(frost_runtime.read_set(build_tiny_set("gpt_oss")), device="cpu", launch=False)
    # the set is bf16 (what plans take); its reference computes the fp32 model's calls alike
    backend._kind_of_layer = {k: replace(v, dtype="fp32") for k, v in backend._kind_of_layer.items()}
    backend.install()
    model.set_attn_implementation("frostc")
    got = logits(backend.new_cache())
    assert backend.calls == {"reference": 2 * 3}  # two layers, a prefill and two decode steps
    assert torch.allclose(got, expected, atol=2e-4, rtol=1e-4), (got - expected).abs().max()
    for layer in model.model.layers:
        layer.self_attn.sinks.data.zero_()
    without = logits(backend.new_cache())
    assert (without - expected).abs().max() > 0.1


def _packed_attention(scale: float):
    """A float64 stand-in for a packed plan's launch: each sequence's queries (cu_seqlens_q) over
    its keys (cu_seqlens_kv), bottom-right causal, as the context plans compute."""

    def execute(key_plan, reads, writes):
        q, k, v, cu_q, cu_kv = (reads[n] for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_kv"))
        for i in range(len(cu_q) - 1):
            (qs, qe), (ks, ke) = (int(cu_q[i]), int(cu_q[i + 1])), (int(cu_kv[i]), int(cu_kv[i + 1]))
            if qe == qs:
                continue
            scores = torch.einsum("qhd,khd->hqk", q[qs:qe].double(), k[ks:ke].double()) * scale
            query, key = torch.arange(qe - qs)[:, None], torch.arange(ke - ks)[None, :]
            scores = scores.masked_fill(key > query + (ke - ks) - (qe - qs), -torch.inf)
            out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v[ks:ke].double())
            writes["o"][qs:qe] = out.to(writes["o"].dtype)

    return execute


class _FakePlan:
    """A loaded plan as `launches.context` drives it: `execute` over buffers in slot order (this
    call's rows presented as the slots' capacity), recorded, then the float64 stand-in."""

    def __init__(self, slots, scale: float):
        self.slots, self.attend, self.rows = slots, _packed_attention(scale), {}

    def execute(self, *buffers, workspace=None):
        tensors = {s.name: getattr(x, "tensor", x) for s, x in zip(self.slots, buffers)}
        self.rows = {n: (len(tensors[n]), tuple(buffers[i].__cuda_array_interface__["shape"]))
                     for i, n in enumerate(s.name for s in self.slots) if n in ("q", "k", "v", "o")}  # fmt: skip
        self.attend(None, tensors, tensors)


@pytest.mark.parametrize("loaded", [True, False])
def test_an_mla_step_packs_the_expanded_context_and_its_queries(sets, monkeypatch, loaded: bool) -> None:
    """DeepSeek's steps after the prompt (the context plans, `launches.context`) with the plan's
    launch replaced by a float64 packed attention: left-padded rows of HF's expanded K (192) and V
    (128, a view as the model makes it) packed by device-computed indices and cu_seqlens, the new
    token the last key of its row; the result is the fp32 reference's over the valid keys. A
    loaded plan gets this call's rows only (3 x 9 keys, not the bucket's 4 x 256) as its slots'
    capacity; a plan held as metadata only, whole-capacity buffers through torch_ops."""
    from types import SimpleNamespace

    from frost_runtime import torch_ops
    from frost_runtime.hf import launches, reference
    from frost_runtime.schema import decode_plan

    plans = sets["deepseek_v3"]
    info = plans.kind_info["l0"]
    key_plan = plans.select("context", "l0", 3)
    assert key_plan == "l0-context-b4"
    data = decode_plan(plans.plan_bytes(key_plan))
    plan = _FakePlan(data.slots, info.scale) if loaded else None
    monkeypatch.setattr(torch_ops, "registered", lambda key: SimpleNamespace(data=data, plan=plan, workspace=None))
    monkeypatch.setattr(launches, "_execute", _packed_attention(info.scale))
    backend = hf.FrostcAttention(plans, device="cpu", launch=False)
    mask = torch.tensor([[1] * 9, [0, 0, 0, 0] + [1] * 5, [0, 0] + [1] * 7])
    rows = backend.mask(batch_size=3, q_length=1, kv_length=9, attention_mask=mask)
    g = torch.Generator().manual_seed(7)
    query = torch.randn(3, 4, 1, 192, generator=g).bfloat16()
    key = torch.randn(3, 4, 9, 192, generator=g).bfloat16()
    value = torch.randn(3, 9, 4, 320, generator=g).bfloat16().transpose(1, 2)[..., 192:]  # a split view
    got = launches.context(key_plan, rows, query, key, value)
    want = reference.attend(query, key, value, mask.bool()[:, None, None, :], info.scale, None)  # the last query
    assert got.shape == (3, 1, 4, 128)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    if loaded:
        assert plan.rows == {"q": (3, (4, 4, 192)), "k": (27, (4 * MAX_CACHE_LEN, 4, 192)),
                             "v": (27, (4 * MAX_CACHE_LEN, 4, 128)), "o": (3, (4, 4, 128))}  # fmt: skip
