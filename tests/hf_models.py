"""Small random-weight Hugging Face models of the families the HF backend serves, their frostc
plan sets, and the greedy-generation comparison the HF backend's tests use (CPU and GPU alike).

Each config keeps the family's attention traits at a small size: Llama-3 GQA 4:1, Qwen2 7:1,
Qwen3 its q/k norms and a head dim of its own, Mistral and Mixtral a sliding window shorter than
the prompts plus the generation (Mixtral's experts behind it), Gemma-2 alternating window layers
with softcap and head dim 256, Gemma-3 its `layer_types` (sliding and global) with q/k norms,
Phi-3 its fused QKV projection at head dim 96, gpt-oss its attention sinks over sliding and
full layers. The plan sets come from the configs' JSON through
`frostc from-config`'s functions (batch sizes 1, 2, 4; a cache of 256 tokens).
"""

from __future__ import annotations

from typing import Any

_COMMON: dict[str, Any] = {
    "vocab_size": 512,
    "intermediate_size": 256,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}

TINY: dict[str, dict[str, Any]] = {
    "llama": _COMMON
    | {
        "model_type": "llama",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "rope_theta": 500000.0,
    },
    "qwen2": _COMMON
    | {
        "model_type": "qwen2",
        "hidden_size": 896,
        "num_hidden_layers": 2,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "use_sliding_window": False,
    },
    "mistral": _COMMON
    | {
        "model_type": "mistral",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "sliding_window": 24,
    },
    # Qwen3: q/k RMSNorm before attention, head_dim its own key (64 here, hidden_size / heads 85)
    "qwen3": _COMMON
    | {
        "model_type": "qwen3",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "use_sliding_window": False,
    },
    # Mixtral: Mistral's attention (here its window) in front of a mixture of experts
    "mixtral": _COMMON
    | {
        "model_type": "mixtral",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 24,
    },
    "gemma2": _COMMON
    | {
        "model_type": "gemma2",
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 24,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    # Gemma-3: sliding and global layers from `layer_types` (here 2:1; 5:1 in the real ones), q/k
    # norms, query_pre_attn_scalar, head dim 256, no softcap
    "gemma3": _COMMON
    | {
        "model_type": "gemma3_text",
        "hidden_size": 512,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 24,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    },
    # Phi-3 / Phi-4: one fused qkv_proj (split before attention), head dim hidden_size / heads: 96
    # (Phi-3-mini's; Phi-4's 128 is the other families'); token ids inside the tiny vocab
    "phi3": _COMMON
    | {
        "model_type": "phi3",
        "hidden_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    # gpt-oss: attention sinks (a learned logit per query head) on every layer, sliding and full
    # layers from `layer_types`, head dim 64, its experts behind them
    "gpt_oss": _COMMON
    | {
        "model_type": "gpt_oss",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 24,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    # DeepSeek-V3 (MLA): q/k 192 wide (128 + 64 rotary), v 128, the latents (64 + 64) in transformers'
    # own cache, expanded for every call (the set's context plans); its yarn mscale in the scale,
    # one dense layer then a small MoE
    "deepseek_v3": _COMMON
    | {
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 96,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "moe_intermediate_size": 64,
        "first_k_dense_replace": 1,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 32,
            "beta_slow": 1,
        },  # fmt: skip
    },
}

BATCH_SIZES = (1, 2, 4)
MAX_CACHE_LEN = 256


def tiny_set_name(family: str, kv_cache_dtype: str | None = None, qkv_layout: str = "separate",
                  glue: bool = False) -> str:  # fmt: skip
    suffix = f"-kv_{kv_cache_dtype}" if kv_cache_dtype else ""
    return f"tiny-{family}{suffix}" + ("-qkv_fused" if qkv_layout == "fused" else "") + ("-glue" if glue else "")


def build_tiny_set(
    family: str, kv_cache_dtype: str | None = None, qkv_layout: str = "separate", glue: bool = False
) -> bytes:
    """The family's plan set (frostc, CPU): prefill and decode over batch sizes 1, 2, 4; its
    paged cache in the model's dtype, or `kv_cache_dtype` (e4m3); decode's q, k, v in rows of
    their own, or as views of one QKV buffer (`qkv_layout` "fused": frost_runtime.hf_fuse); with
    `glue`, the decode steps' norm and activation plans too."""
    from frostc.buildset import build_set
    from frostc.models import read_layers, read_model
    from frostc.serving import deployment

    model = read_model(TINY[family])
    dep = deployment(
        model, batch_sizes=BATCH_SIZES, max_cache_len=MAX_CACHE_LEN, kv_cache_dtype=kv_cache_dtype,
        qkv_layout=qkv_layout, glue=read_layers(TINY[family]) if glue else None,
    )  # fmt: skip
    return build_set(model, dep, name=tiny_set_name(family, kv_cache_dtype, qkv_layout, glue)).data


def hf_model(family: str, *, device: str, dtype=None, seed: int = 0):
    """The family's HF model with random weights (seeded), in eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in TINY[family].items() if k not in ("model_type", "torch_dtype")}
    config = AutoConfig.for_model(TINY[family]["model_type"], **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.bfloat16)
    return model.eval()


def left_padded_prompts(lengths: list[int], vocab: int, device: str, seed: int = 1):
    """input_ids and attention_mask of prompts of `lengths` tokens, left-padded as HF's tokenizers
    pad for generation (pad id 0)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.int64)
    mask = torch.zeros(len(lengths), width, dtype=torch.int64)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(1, vocab, (n,), generator=g)
        mask[row, width - n :] = 1
    return ids.to(device), mask.to(device)


def greedy(model, ids, mask, n: int, cache=None):
    """`n` greedy tokens after each prompt: (b, n)."""
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
        past_key_values=cache, pad_token_id=0,
    )  # fmt: skip
    return out[:, ids.shape[1] :]


def positions(mask):
    """HF's positions of left-padded rows: each valid token's index in its sequence (pads 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def stepwise_logits(model, ids, mask, tokens, cache):
    """Teacher-forced fp32 logits predicting tokens[:, j] (b, n, vocab): the prompt as one
    prefill, then one decode step per token, as generation runs them."""
    import torch

    out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), past_key_values=cache)
    logits = [out.logits[:, -1].float()]
    for j in range(tokens.shape[1] - 1):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        step = tokens[:, j : j + 1]
        out = model(input_ids=step, attention_mask=mask, position_ids=positions(mask)[:, -1:], past_key_values=cache)
        logits.append(out.logits[:, -1].float())
    return torch.stack(logits, dim=1)


def reference_logits(model, ids, mask, tokens):
    """The same logits from an fp32 copy of the model (eager attention), one forward, no cache."""
    import copy

    import torch

    exact = copy.deepcopy(model).float()
    exact.set_attn_implementation("eager")
    full = torch.cat([ids, tokens], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(tokens)], dim=1)
    with torch.no_grad():
        logits = exact(input_ids=full, attention_mask=full_mask, position_ids=positions(full_mask)).logits
    p = ids.shape[1]
    return logits[:, p - 1 : p - 1 + tokens.shape[1]].float()


def compare_generations(expected, got, logits_expected, logits_got, logits_exact) -> str:
    """The rule of the acceptance tests: the same greedy tokens, or, where they differ, a near
    tie: frostc's teacher-forced logits (along the expected tokens) are as close to the fp32
    model's as the reference implementation's (within 1.5x, plus 0.02), and at each row's first
    differing token the fp32 model's top two logits are closer than the two implementations'
    errors together. Returns "equal" or "near tie (k of n tokens equal)"; raises AssertionError
    otherwise."""
    same = int((expected == got).sum())
    if same == expected.numel():
        return "equal"
    err_expected = float((logits_expected - logits_exact).abs().amax())
    err_got = float((logits_got - logits_exact).abs().amax())
    assert err_got <= 1.5 * err_expected + 0.02, (
        f"frostc's logits err {err_got:.4f}, the reference's {err_expected:.4f}"
    )
    for row in range(expected.shape[0]):
        differ = (expected[row] != got[row]).nonzero()
        if len(differ):
            j = int(differ[0])
            top2 = logits_exact[row, j].topk(2).values
            gap = float(top2[0] - top2[1])
            assert gap <= err_expected + err_got, f"row {row} token {j}: no near tie (fp32 top-2 gap {gap:.4f})"
    return f"near tie ({same} of {expected.numel()} tokens equal)"


def judge(model, reference: str, backend, ids, mask, expected, got, reference_model=None) -> str:
    """`compare_generations` with the logits it needs: teacher-forced through the reference
    implementation (HF's DynamicCache) and through the backend (a fresh frostc cache), and the
    fp32 model's. `reference_model`: the model `expected` came from, when it is not `model` (HF's
    own layers, against a model with fused layers). Leaves the model on the backend's attention."""
    import torch
    from transformers import DynamicCache

    if bool((expected == got).all()):
        return "equal"
    source = reference_model if reference_model is not None else model
    with torch.no_grad():
        source.set_attn_implementation(reference)
        logits_expected = stepwise_logits(source, ids, mask, expected, DynamicCache(config=source.config))
        model.set_attn_implementation(backend.name)
        logits_got = stepwise_logits(model, ids, mask, expected, backend.new_cache())
        logits_exact = reference_logits(source, ids, mask, expected)
    return compare_generations(expected, got, logits_expected, logits_got, logits_exact)
