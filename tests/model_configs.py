"""Hugging Face config.json contents modeled on real checkpoints' (the keys attention reads, and a
few it must ignore), for tests of frostc.models and frostc.serving."""

from __future__ import annotations

import copy
from typing import Any

LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}

QWEN2_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 131072,
    "sliding_window": 131072,
    "max_window_layers": 28,
    "use_sliding_window": False,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
}

MISTRAL_7B_V01: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}

# Qwen3-8B's config.json (head_dim its own key; no window)
QWEN3_8B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "sliding_window": None,
    "use_sliding_window": False,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-06,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}

# Qwen3-30B-A3B's (the MoE: 32 q heads over 4 KV heads of 128, hidden 2048)
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "sliding_window": None,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}

# Mixtral-8x7B's (Mistral's attention, no window)
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 32768,
    "sliding_window": None,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}

# Gemma-3-27B's config.json: the multimodal checkpoint, its text model in text_config (the dtype at
# the top); 5 sliding layers of 1024 to 1 full, head dim 128, the scale from query_pre_attn_scalar
GEMMA3_27B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "query_pre_attn_scalar": 168,
        "sliding_window": 1024,
        "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    },
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
}

# Gemma-3-1B's (text only): head dim 256, one KV head, windows of 512
GEMMA3_1B: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}

GEMMA2_9B: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "cache_implementation": "hybrid",
    "torch_dtype": "float32",  # as google/gemma-2-9b ships it: served with --dtype bf16
    "vocab_size": 256000,
}

# 27b: head_dim 128 but query_pre_attn_scalar 144 (hidden 4608 / 32 heads): the scale is 1/12
GEMMA2_27B: dict[str, Any] = {
    **GEMMA2_9B,
    "hidden_size": 4608,
    "num_hidden_layers": 46,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "head_dim": 128,
    "query_pre_attn_scalar": 144,
    "torch_dtype": "bfloat16",
}


def edited(config: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy with keys changed; a value of `...` deletes the key."""
    out = copy.deepcopy(config)
    for key, value in changes.items():
        if value is ...:
            out.pop(key, None)
        else:
            out[key] = value
    return out


# microsoft/Phi-3-mini-4k-instruct (head dim 3072 / 32 = 96, a window on every layer) and
# microsoft/phi-4 (the same model type at head dim 128, no window)
PHI3_MINI: dict[str, Any] = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "sliding_window": 2047,
    "torch_dtype": "bfloat16",
}

PHI4: dict[str, Any] = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "hidden_size": 5120,
    "intermediate_size": 17920,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "num_key_value_heads": 10,
    "max_position_embeddings": 16384,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
}

# openai/gpt-oss-20b: alternating sliding (128) and full layers, attention sinks, head dim 64
GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "num_local_experts": 32,
    "torch_dtype": "bfloat16",
}

# deepseek-ai/DeepSeek-V3: MLA (query/key 128 + 64 = 192 wide, values 128, latent 512 + 64), yarn x40
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    },  # fmt: skip
    "torch_dtype": "bfloat16",
}
