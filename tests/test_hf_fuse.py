"""Fused decoder layers (runtime/frost_runtime/hf_fuse.py) on the CPU: the rotary rewrite is HF's
arithmetic bit for bit, a fused model's logits are as close to the fp32 model's as HF's own, the
weights are shared not copied, models of other families are refused, and generation through the
frostc backend (its torch reference, `launch=False`) with a set whose decode plans take q, k, v
as views of one QKV buffer gives HF's tokens or a near tie. The plans themselves run on the GPU
(tests/gpu/test_hf.py)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import frost_runtime  # noqa: E402
from frost_runtime import hf, hf_fuse  # noqa: E402

from tests.hf_models import (  # noqa: E402
    build_tiny_set,
    greedy,
    hf_model,
    judge,
    left_padded_prompts,
    positions,
)


def test_rotary_on_the_whole_buffer_is_hfs_rotary_bit_for_bit() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, s, hq, hkv, d = 3, 5, 4, 2, 64
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(b, s, hq + 2 * hkv, d, generator=g).to(torch.bfloat16)
    angles = torch.rand(b, s, d // 2, generator=g) * 50
    cos, sin = (torch.cat((f(angles), f(angles)), -1).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    q, k, v = (qkv[:, :, a:z].transpose(1, 2) for a, z in ((0, hq), (hq, hq + hkv), (hq + hkv, None)))
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    rotary = hf_fuse._rotary(cos, sin)
    whole, broadcast = qkv.clone(), qkv.clone()
    hf_fuse._rotate(whole, *rotary.over_heads(hq, hkv))
    hf_fuse._rotate(broadcast[:, :, : hq + hkv], rotary.cos[:, :, None], rotary.signed[:, :, None])
    for got in (whole, broadcast):
        assert torch.equal(got[:, :, :hq].transpose(1, 2), want_q)
        assert torch.equal(got[:, :, hq : hq + hkv].transpose(1, 2), want_k)
        assert torch.equal(got[:, :, hq + hkv :].transpose(1, 2), v)  # v untouched


@pytest.mark.parametrize("family", hf_fuse.FAMILIES)
def test_fused_logits_are_as_close_to_fp32_as_hfs(family: str) -> None:
    """The fused layers round differently (RMSNorm's weight before the bf16 rounding, the
    residual add inside the GEMM): their logits' distance from the fp32 model's is HF's own, give
    or take bf16 noise."""
    model, fused = hf_model(family, device="cpu"), hf_model(family, device="cpu")
    assert hf_fuse.fuse_layers(fused) == model.config.num_hidden_layers
    ids, mask = left_padded_prompts([5, 11, 3], model.config.vocab_size, "cpu")
    for m in (model, fused):
        m.set_attn_implementation("sdpa")
    with torch.no_grad():
        logits = [m(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits.float()
                  for m in (model, fused)]  # fmt: skip
    exact = copy.deepcopy(model).float()
    exact.set_attn_implementation("eager")
    with torch.no_grad():
        want = exact(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    valid = mask.bool()
    err_hf, err_fused = (float((x - want)[valid].abs().amax()) for x in logits)
    assert 0 < err_fused <= 2 * err_hf + 0.02, (err_fused, err_hf)


def test_the_weights_are_shared_not_copied() -> None:
    model = hf_model("qwen2", device="cpu")  # biases on q, k, v too
    before = sum(p.numel() for p in model.parameters())
    hf_fuse.fuse_layers(model)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.q_proj.weight.data_ptr() == attn.qkv_weight.data_ptr()
    assert attn.k_proj.weight.data_ptr() == attn.qkv_weight[attn.q_proj.weight.shape[0]].data_ptr()
    assert attn.v_proj.bias.data_ptr() == attn.qkv_bias[-attn.v_proj.bias.shape[0]].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == mlp.gate_up_weight[mlp.gate_proj.weight.shape[0]].data_ptr()
    assert sum(p.numel() for p in model.parameters()) == before
    assert "qkv_weight" not in "".join(model.state_dict())  # checkpoints keep the projections' own
    with pytest.raises(ValueError, match="fused already"):
        hf_fuse.fuse_layers(model)


def test_other_families_are_refused_naming_the_model_type() -> None:
    model = hf_model("gemma2", device="cpu")
    with pytest.raises(ValueError, match="model_type 'gemma2'.*serve this model unfused"):
        hf_fuse.fuse_layers(model)
    llama = hf_model("llama", device="cpu")
    llama.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        hf_fuse.fuse_layers(llama)


@pytest.mark.parametrize("family", hf_fuse.FAMILIES)
def test_fused_generation_through_a_fused_qkv_set_matches_hf(family: str) -> None:
    """A fused model over a set built with --qkv-layout fused, through the backend's torch
    reference: HF's tokens (unfused, sdpa), or a near tie by the acceptance tests' rule."""
    reference = hf_model(family, device="cpu")
    reference.set_attn_implementation("sdpa")
    ids, mask = left_padded_prompts([5, 11, 3], reference.config.vocab_size, "cpu")
    with torch.no_grad():
        expected = greedy(reference, ids, mask, 6)
    model = hf_model(family, device="cpu")
    hf_fuse.fuse_layers(model)
    plans = frost_runtime.read_set(build_tiny_set(family, qkv_layout="fused"))
    backend = hf.install(plans, model, device="cpu", name=f"frostc-cpu-fused-{family}", launch=False)
    with torch.no_grad():
        got = greedy(model, ids, mask, 6, cache=backend.new_cache())
    assert backend.calls == {"reference": model.config.num_hidden_layers * 6}
    verdict = judge(model, "sdpa", backend, ids, mask, expected, got, reference_model=reference)
    assert verdict.startswith(("equal", "near tie"))


def test_decode_rows_are_handed_over_as_views_when_the_plan_takes_them() -> None:
    """`rows_as_slot`: q, k, v views of a QKV buffer are the slots of a fused-layout plan as they
    are; for a plan of separate rows, or a batch under the bucket, they are copied (rows past
    the batch zero)."""
    b, hq, hkv, d = 4, 8, 2, 64
    qkv = torch.randn(b, 1, hq + 2 * hkv, d).to(torch.bfloat16)
    k = qkv[:, :, hq : hq + hkv].transpose(1, 2)
    slots = {}
    for layout in ("fused", "separate"):
        plans = frost_runtime.read_set(build_tiny_set("llama", qkv_layout=layout))
        data = plans.plan_data(plans.select("decode", "l0", 4))
        slots[layout] = {s.name: s for s in data.slots}["k_new"]
    assert hf.rows_as_slot(k, slots["fused"]) is k
    separate = hf.rows_as_slot(k, slots["separate"])
    assert separate is not k and separate.stride() == slots["separate"].strides and torch.equal(separate, k)
    short = hf.rows_as_slot(k[:3], slots["fused"])
    assert short.stride() == slots["fused"].strides
    assert torch.equal(short[:3], k[:3]) and not short[3].any()


def test_glue_plans_of_another_model_are_refused_naming_the_difference() -> None:
    """Glue plans built for the tiny Llama (hidden 512) on the tiny Qwen2 (hidden 896): refused
    before anything loads, naming the width and the fix; the model is left unfused."""
    plans = frost_runtime.read_set(build_tiny_set("llama", qkv_layout="fused", glue=True))
    model = hf_model("qwen2", device="cpu")
    with pytest.raises(ValueError, match="norm width 512, the model's hidden_size is 896.*from-config --glue"):
        hf_fuse.fuse_layers(model, plans)
    assert not hasattr(model.model.layers[0].self_attn, "qkv_weight")
    eps = hf_model("llama", device="cpu")
    for layer in eps.model.layers:
        layer.input_layernorm.variance_epsilon = 1e-6
    with pytest.raises(ValueError, match="eps 1e-05, the model's norms use 1e-06, 1e-05"):
        hf_fuse.fuse_layers(eps, plans)


def test_fused_layers_compile_once_without_graph_breaks() -> None:
    """`DecodeGraph(compile_model=True)` over a fused model: one compile serves every step (no
    graph break: the rotary tensors' per-forward cache is skipped while tracing), and the tokens
    are the eager steps'."""
    from torch._dynamo.utils import counters

    model = hf_model("llama", device="cpu")
    hf_fuse.fuse_layers(model)
    plans = frost_runtime.read_set(build_tiny_set("llama", qkv_layout="fused"))
    backend = hf.install(plans, model, device="cpu", name="frostc-cpu-fused-compiled", launch=False)
    ids, mask = left_padded_prompts([5, 11], model.config.vocab_size, "cpu")
    runs = []
    for compile_model in (False, True):
        graph = hf.DecodeGraph(model, backend, batch=2, compile_model=compile_model)
        breaks, compiled = sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]
        with torch.no_grad():
            tokens = [graph.prefill(ids, mask)]
            for _ in range(4):
                tokens.append(graph.step(tokens[-1], capture=False))
        runs.append(torch.stack(tokens))
    assert sum(counters["graph_break"].values()) == breaks
    assert counters["stats"]["unique_graphs"] - compiled == 1
    assert torch.equal(runs[0], runs[1])
