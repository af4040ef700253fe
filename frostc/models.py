"""What a model's attention is, read from a Hugging Face `config.json`: no weights, no GPU.

`read_model(config)` gives a `ModelAttention`: heads, KV heads, head dim, dtype, positions, the
attention scale and softcap, and each layer's sliding window in frostc's terms (`window_left`).
The semantics follow transformers 5.23's own sources (configuration_*.py, modeling_*.py and
masking_utils.py of each family), read for this module:

- A sliding window of W (HF's `sliding_window`) lets a query see W keys, itself included:
  masking_utils' `sliding_window_overlay` keeps kv_idx > q_idx - W under the causal mask, and the
  flash path passes window_size = (W - 1, W - 1). frostc's `window_left` is therefore W - 1.
- llama: no window. mistral: `sliding_window` (null: none) on every layer; MistralModel ignores
  `layer_types` (it warns and points at Ministral). qwen2: the window exists only when
  `use_sliding_window` is true (Qwen2Config sets sliding_window = None otherwise, whatever
  `layer_types` says); without `layer_types`, layers i >= `max_window_layers` slide. gemma2:
  without `layer_types`, even layers slide ("sliding_attention" if (i + 1) % 2); the scale is
  `query_pre_attn_scalar` ** -0.5 (not head_dim ** -0.5), `attn_logit_softcapping` caps every
  layer's scores (`final_logit_softcapping` is the LM head's, not attention's).
- qwen3: Qwen2's window rules, head_dim a key of its own (default 128). qwen3_moe and mixtral: one
  window (qwen3_moe: only with `use_sliding_window`) on every layer, `layer_types` unread. gemma3:
  the text model's config is `text_config` (gemma3_text: the config itself); Gemma-2's scale,
  `layer_types` or every `sliding_window_pattern`-th layer full (default 6), no softcap unless
  `attn_logit_softcapping` is given.
- phi3 (Phi-3, Phi-3.5, Phi-4): `sliding_window` (null: none) on every layer, head_dim hidden_size
  // heads (96 for Phi-3-mini). gpt_oss: `layer_types` (default: even layers slide), window 128,
  attention sinks on every layer. deepseek_v2 / deepseek_v3 (MLA): query/key head dim
  qk_nope_head_dim + qk_rope_head_dim (192), value head dim `v_head_dim` (128), one KV head per
  head in the prefill form, scale qk_head_dim ** -0.5 times yarn's mscale(factor, mscale_all_dim)
  squared; its decode is the absorbed latent form (one kv_lora_rank + qk_rope_head_dim wide K).
  Their attention is read and planned (gpt-oss's sinks: a float32 `sinks` tensor in every plan;
  Phi-3's head dim 96 in every form); the kernels that attention needs beyond frostc's (head dims
  other than 64, 96, 128 and 256; d_v != d_qk outside the 16-bit dense, padded and packed forms;
  the latent decode) are named as each plan's gap (`kernel_gap`; the prefill plans' own:
  `prefill_gap`, so DeepSeek's prefill plans, q/k 192 and v 128, are built).
- head_dim: the explicit key when present and not null, else hidden_size // heads (Gemma2Config
  defaults it to 256). The dtype: `dtype`, else the older `torch_dtype` (as PreTrainedConfig does).
- A key a config leaves out takes the default of transformers' config class for its model type
  (Mistral's 8 KV heads and 4096 window, Gemma-2's softcap 50 and scalar 256, ...), except the
  shapes (layers, heads, hidden size or head dim, max positions): a config without them is not a
  checkpoint's, and guessing would plan for the wrong model.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from frost_runtime import dtypes

from frostc.description import read_text_file
from frostc.errors import DescriptionError, Problem
from frostc.field_checks import describe, is_int, is_number, quoted
from frostc.kernels.sdpa_fwd_wgmma import HEAD_DIM_PAIRS
from frostc.ops.rows import HEAD_DIMS

FULL, SLIDING = "full_attention", "sliding_attention"
LEGACY_LAYER_TYPES = {"attention": FULL}  # transformers' remap_legacy_layer_types

# HF dtype names -> frostc's; fp32 is read (so the refusal can say what the config holds) but not served
HF_DTYPES = {d.hf: name for name, d in dtypes.DTYPES.items() if d.hf}  # config names -> ours
SERVED_DTYPES = dtypes.ATTENTION

# transformers 5.23's config-class defaults for the keys a config may leave out, by model type
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"num_key_value_heads": None},
    "mistral": {"num_key_value_heads": 8, "sliding_window": 4096},
    "qwen2": {"num_key_value_heads": 32, "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
    # Qwen3: Qwen2's windows (layer_types, max_window_layers) with head_dim a key of its own (128);
    # Qwen3-MoE and Mixtral: Mistral's window on every layer (layer_types unread), head_dim or
    # hidden_size // heads. Attention is the same as the families above (Qwen3's q/k RMSNorm runs
    # before it, in the model's code)
    "qwen3": {
        "num_key_value_heads": 32,
        "head_dim": 128,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "qwen3_moe": {"num_key_value_heads": 4, "use_sliding_window": False, "sliding_window": 4096},
    "mixtral": {"num_key_value_heads": 8, "sliding_window": None},
    # Gemma-3's text model: Gemma-2's scale, windows by layer_types or every sliding_window_pattern-th
    # layer full (1 in 6), no softcap by default; "gemma3" (the multimodal checkpoints) nests it in
    # text_config (`read_model` reads it there)
    "gemma3_text": {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "attn_logit_softcapping": None,
        "use_bidirectional_attention": False,
    },
    "gemma2": {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "use_bidirectional_attention": None,
    },
}
# Phi-3/4: Mistral's rule (one window on every layer, none by default); gpt-oss: alternate layers
# slide over 128 keys, sinks everywhere; DeepSeek-V2/V3: MLA (query/key 192 wide, value 128)
DEFAULTS |= {
    "phi3": {"num_key_value_heads": None, "sliding_window": None},
    "gpt_oss": {"num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128},
    "deepseek_v2": {
        "num_key_value_heads": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "kv_lora_rank": 512,
    },  # fmt: skip
    "deepseek_v3": {
        "num_key_value_heads": 128,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "kv_lora_rank": 512,
    },  # fmt: skip
}
MLA = ("deepseek_v2", "deepseek_v3")
NESTED = {"gemma3": "gemma3_text"}  # model types whose text model's config is `text_config`
SUPPORTED_MODEL_TYPES = tuple(sorted([*DEFAULTS, *NESTED]))


@dataclass(frozen=True)
class ModelAttention:
    """A model's attention, whole (before tensor parallelism splits its heads)."""

    model_type: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str | None  # "bf16", "fp16", "fp32", or None when the config names none
    max_positions: int
    scale: float  # the scores' multiplier
    softcap: float | None  # every layer's, when the family has one
    window_left: tuple[int | None, ...]  # per layer: keys before the query's own it sees; None: all
    head_dim_v: int | None = None  # the values' head dim where it is not head_dim (MLA's prefill)
    sinks: bool = False  # a learned logit per head joins every row's softmax (gpt-oss)
    latent_dim: int | None = None  # MLA: the absorbed decode's K width (kv_lora_rank + qk_rope_head_dim)

    @property
    def kernel_gap(self) -> str | None:
        """What this attention needs that frostc's kernels do not compute yet; None: nothing."""
        return self._gaps(prefill=False)

    @property
    def prefill_gap(self) -> str | None:
        """What its prefill plans (the packed form) need that frostc's kernels do not compute yet:
        the 16-bit forward kernel takes DeepSeek's (192, 128) pair, and the latent decode is not
        the prefill's."""
        return self._gaps(prefill=True)

    @property
    def value_dim_apart(self) -> int:
        """The values' head dim where it is not head_dim, else 0."""
        return self.head_dim_v if self.head_dim_v is not None and self.head_dim_v != self.head_dim else 0

    def _gaps(self, prefill: bool) -> str | None:
        gaps = []
        pair = (self.head_dim, self.value_dim_apart) in HEAD_DIM_PAIRS
        if pair:
            if not prefill:
                gaps.append(
                    f"head dim {self.head_dim} with a value head dim {self.head_dim_v} in the paged decode and mixed "
                    "forms (only the 16-bit dense, padded and packed forms take the pair)"
                )
        elif self.head_dim not in HEAD_DIMS:
            gaps.append(f"head dim {self.head_dim} (frostc's kernels take {', '.join(map(str, HEAD_DIMS))})")
        if self.value_dim_apart and not pair:
            gaps.append(f"a value head dim {self.head_dim_v} beside the query/key's {self.head_dim}")
        if self.latent_dim is not None and not prefill:
            gaps.append(f"MLA's absorbed decode (one {self.latent_dim}-wide latent K per token)")
        return "; ".join(gaps) + " (issue 44)" if gaps else None

    @property
    def sliding_window(self) -> int | None:
        """HF's W (keys a query sees, its own included) of the sliding layers; None when none slides."""
        return next((w + 1 for w in self.window_left if w is not None), None)


def load_model_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a config.json; unreadable or non-JSON files are a DescriptionError naming the file."""
    filename, text = read_text_file(path)
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        message = f"invalid JSON: {e.msg} (at line {e.lineno}, column {e.colno}); expected a Hugging Face config.json"
        raise DescriptionError([Problem(filename, message)]) from None
    except RecursionError:
        raise DescriptionError([Problem(filename, "nested too deeply to be a config.json")]) from None
    if not isinstance(config, dict):
        message = f"the top level must be a JSON object (a Hugging Face config.json), got {describe(config)}"
        raise DescriptionError([Problem(filename, message)])
    return config


class _Fields:
    """Typed reads of a config's keys; each bad key is one problem naming it."""

    def __init__(self, config: dict[str, Any], defaults: dict[str, Any]) -> None:
        self.config, self.defaults, self.problems = config, defaults, []

    def raw(self, key: str) -> Any:
        return self.config[key] if key in self.config else self.defaults.get(key)

    def problem(self, key: str, message: str) -> None:
        self.problems.append(Problem(key, message))

    def int(self, key: str, *, required: bool = False, minimum: int = 1) -> int | None:
        value = self.raw(key)
        if required and self.config.get(key) is None:
            said = "null" if key in self.config else "missing"
            self.problem(key, f"{said}; a config.json of this model writes it (an int)")
            return None
        if value is None:
            return None
        if not is_int(value) or value < minimum:
            self.problem(key, f"expected an int >= {minimum}, got {describe(value)}")
            return None
        return value

    def float(self, key: str) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        if not is_number(value) or not math.isfinite(value) or value <= 0:
            self.problem(key, f"expected a positive number or null, got {describe(value)}")
            return None
        return float(value)

    def bool(self, key: str) -> bool | None:
        value = self.raw(key)
        if value is not None and not isinstance(value, bool):
            self.problem(key, f"expected true or false, got {describe(value)}")
            return None
        return value


def read_model(config: dict[str, Any]) -> ModelAttention:
    """The attention of the model a config.json describes; a DescriptionError lists every problem."""
    model_type = config.get("model_type")
    if model_type in NESTED:
        return read_model(_text_config(config, NESTED[model_type]))
    if model_type not in DEFAULTS:
        got = describe(model_type) if "model_type" in config else "no model_type"
        message = f"{got} is not a model frostc can plan; supported: {quoted(SUPPORTED_MODEL_TYPES)}"
        raise DescriptionError([Problem("model_type", message)])
    f = _Fields(config, DEFAULTS[model_type])
    layers = f.int("num_hidden_layers", required=True)
    heads = f.int("num_attention_heads", required=True)
    kv_heads = f.int("num_key_value_heads")
    kv_heads = heads if kv_heads is None else kv_heads
    mla = _mla(f) if model_type in MLA else {}
    head_dim = mla["head_dim"] if mla else _head_dim(f, heads)
    max_positions = f.int("max_position_embeddings", required=True)
    dtype = _dtype(f)
    if heads and kv_heads and heads % kv_heads:
        f.problem("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads {heads} (GQA needs it to)")
    window_left, scale, softcap = _FAMILIES[model_type](f, layers or 0)
    if f.problems or None in (layers, heads, kv_heads, head_dim, max_positions):
        raise DescriptionError(f.problems)
    return ModelAttention(
        model_type=model_type,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        max_positions=max_positions,
        scale=scale if scale is not None else head_dim**-0.5,
        softcap=softcap,
        window_left=window_left,
        head_dim_v=mla.get("head_dim_v"),
        sinks=model_type == "gpt_oss",  # GptOssAttention's `sinks`, on every layer
        latent_dim=mla.get("latent_dim"),
    )


def _mla(f: _Fields) -> dict[str, int | None]:
    """DeepSeek's MLA in its prefill form: query/key qk_nope + qk_rope wide, values v_head_dim; the
    absorbed decode's latent K kv_lora_rank + qk_rope wide."""
    nope, rope, v, rank = (f.int(k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"))
    if None in (nope, rope):
        return {"head_dim": None}
    return {"head_dim": nope + rope, "head_dim_v": v, "latent_dim": None if rank is None else rank + rope}


def _text_config(config: dict[str, Any], text_type: str) -> dict[str, Any]:
    """A multimodal checkpoint's text model config (`text_config`) as a config of model type
    `text_type`, the dtype taken from the top level where the text config names none."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        message = f"expected the text model's config (a JSON object), got {describe(text)}"
        raise DescriptionError([Problem("text_config", message)])
    inner = dict(text) | {"model_type": text_type}
    for key in ("dtype", "torch_dtype"):
        if inner.get(key) is None and config.get(key) is not None:
            inner[key] = config[key]
    return inner


def _head_dim(f: _Fields, heads: int | None) -> int | None:
    head_dim = f.int("head_dim")
    if head_dim is not None or f.config.get("head_dim") is not None:
        return head_dim  # given (or given badly: its problem is recorded); absent or null: derived
    hidden = f.int("hidden_size", required=True)
    if hidden is None or heads is None:
        return None
    if hidden % heads:
        f.problem("hidden_size", f"{hidden} is not a multiple of num_attention_heads {heads}: give head_dim")
        return None
    return hidden // heads


def _dtype(f: _Fields) -> str | None:
    key = "dtype" if f.config.get("dtype") is not None else "torch_dtype"
    value = f.config.get(key)
    if value is None:
        return None
    if value not in HF_DTYPES:
        f.problem(key, f"expected one of {quoted(HF_DTYPES)}, got {describe(value)}")
        return None
    return HF_DTYPES[value]


def _windows(types: list[str], window: int | None) -> tuple[int | None, ...]:
    return tuple(window - 1 if t == SLIDING and window is not None else None for t in types)


def _layer_types(f: _Fields, layers: int) -> list[str] | None:
    """A config's `layer_types`, checked (one problem for the whole list at most); None when absent."""
    raw = f.config.get("layer_types")
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != layers:
        f.problem("layer_types", f"expected a list of {layers} layer types (num_hidden_layers), got {describe(raw)}")
        return None
    types = [LEGACY_LAYER_TYPES.get(t, t) if isinstance(t, str) else t for t in raw]
    bad = next((i for i, t in enumerate(types) if t not in (FULL, SLIDING)), None)
    if bad is not None:
        message = f"{describe(raw[bad])}: frostc plans {quoted((FULL, SLIDING))} layers only"
        f.problem(f"layer_types[{bad}]", message)
        return None
    return types


def _llama(f: _Fields, layers: int) -> tuple[tuple[int | None, ...], None, None]:
    _check_ignored_layer_types(f, layers, [FULL] * layers, "LlamaModel ignores layer_types: every layer is full")
    return (None,) * layers, None, None


def _mistral(f: _Fields, layers: int) -> tuple[tuple[int | None, ...], None, None]:
    why = "MistralModel ignores layer_types (sliding_window applies to every layer; transformers warns: use Ministral)"
    return _every_layer(f, layers, f.int("sliding_window"), why)


def _every_layer(f: _Fields, layers: int, window: int | None, why: str) -> tuple[tuple[int | None, ...], None, None]:
    """A family whose one window (or none) applies to every layer, its model ignoring
    `layer_types` (`why` says so when a config's layer_types disagree)."""
    types = [SLIDING if window is not None else FULL] * layers
    _check_ignored_layer_types(f, layers, types, why)
    return _windows(types, window), None, None


def _qwen2(f: _Fields, layers: int) -> tuple[tuple[int | None, ...], None, None]:
    use = f.bool("use_sliding_window")
    window = f.int("sliding_window") if use else None  # Qwen2Config: sliding_window = None unless use_sliding_window
    first = f.int("max_window_layers", minimum=0)
    types = _layer_types(f, layers)
    if types is None:
        types = [SLIDING if window is not None and first is not None and i >= first else FULL for i in range(layers)]
    return _windows(types, window), None, None


def _qwen3_moe(f: _Fields, layers: int) -> tuple[tuple[int | None, ...], None, None]:
    """Qwen3-MoE: the window (when `use_sliding_window`) on every layer, as Qwen3MoeAttention
    reads `config.sliding_window` whatever the layer; it has no layer_types."""
    window = f.int("sliding_window") if f.bool("use_sliding_window") else None
    why = "Qwen3MoeModel ignores layer_types (its window, if use_sliding_window, applies to every layer)"
    return _every_layer(f, layers, window, why)


def _mixtral(f: _Fields, layers: int) -> tuple[tuple[int | None, ...], None, None]:
    """Mixtral: Mistral's rule (sliding_window, null by default, on every layer)."""
    why = "MixtralModel ignores layer_types (sliding_window applies to every layer)"
    return _every_layer(f, layers, f.int("sliding_window"), why)


def _gemma2(f: _Fields, layers: int) -> tuple[tuple[int | None, ...], float | None, float | None]:
    if f.bool("use_bidirectional_attention"):
        f.problem("use_bidirectional_attention", "true: frostc plans causal language models; set it false or remove it")
    window = f.int("sliding_window")
    types = _layer_types(f, layers)
    if types is None:
        types = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]  # even layers slide
    scalar = f.float("query_pre_attn_scalar")
    if scalar is None and "query_pre_attn_scalar" in f.config and f.config["query_pre_attn_scalar"] is None:
        f.problem("query_pre_attn_scalar", "null: Gemma-2 scales scores by query_pre_attn_scalar ** -0.5; give it")
    return _windows(types, window), scalar**-0.5 if scalar else None, f.float("attn_logit_softcapping")


def _gemma3(f: _Fields, layers: int) -> tuple[tuple[int | None, ...], float | None, float | None]:
    if f.bool("use_bidirectional_attention"):
        f.problem("use_bidirectional_attention", "true: frostc plans causal language models; set it false or remove it")
    window = f.int("sliding_window")
    types = _layer_types(f, layers)
    pattern = f.int("sliding_window_pattern")
    if types is None and pattern is not None:  # Gemma3TextConfig: every pattern-th layer is full
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
    scalar = f.float("query_pre_attn_scalar")
    if scalar is None and "query_pre_attn_scalar" in f.config and f.config["query_pre_attn_scalar"] is None:
        f.problem("query_pre_attn_scalar", "null: Gemma-3 scales scores by query_pre_attn_scalar ** -0.5; give it")
    return (
        _windows(types or [FULL] * layers, window),
        scalar**-0.5 if scalar else None,
        f.float("attn_logit_softcapping"),
    )


def _phi3(f: _Fields, layers: int) -> tuple[tuple[int | None, ...], None, None]:
    """Phi-3/4: `sliding_window` (null by default) on every layer; Phi3Model has no layer_types."""
    why = "Phi3Model ignores layer_types (sliding_window applies to every layer)"
    return _every_layer(f, layers, f.int("sliding_window"), why)


def _gpt_oss(f: _Fields, layers: int) -> tuple[tuple[int | None, ...], None, None]:
    """gpt-oss: `layer_types`, by default even layers sliding (GptOssConfig), over `sliding_window`."""
    types = _layer_types(f, layers) or [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
    return _windows(types, f.int("sliding_window")), None, None


def _deepseek(f: _Fields, layers: int) -> tuple[tuple[int | None, ...], float | None, None]:
    """DeepSeek-V2/V3: no window; scale qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim)
    squared under yarn rope scaling (modeling_deepseek_v3's yarn_apply_mscale)."""
    nope, rope = f.int("qk_nope_head_dim"), f.int("qk_rope_head_dim")
    if None in (nope, rope):
        return (None,) * layers, None, None
    scale = (nope + rope) ** -0.5
    rope_parameters = f.config.get("rope_parameters") or f.config.get("rope_scaling") or {}
    if not isinstance(rope_parameters, dict):
        return (None,) * layers, scale, None
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type"))  # transformers renames "type"
    if rope_type not in (None, "default") and rope_parameters.get("mscale_all_dim"):
        factor = rope_parameters.get("factor", 1)
        if is_number(factor) and factor > 1:
            mscale = 0.1 * rope_parameters["mscale_all_dim"] * math.log(factor) + 1.0
            scale *= mscale * mscale
    return (None,) * layers, scale, None


def _check_ignored_layer_types(f: _Fields, layers: int, meant: list[str], why: str) -> None:
    """A family whose model ignores `layer_types`: accept it only when it says what the model does."""
    types = _layer_types(f, layers)
    if types is not None and types != meant:
        f.problem("layer_types", f"disagrees with the model: {why}; frostc will not guess which is meant: remove it")


_FAMILIES = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "qwen3": _qwen2,  # Qwen3Config: the same window rules as Qwen2's
    "qwen3_moe": _qwen3_moe,
    "mixtral": _mixtral,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3,
    "phi3": _phi3,
    "gpt_oss": _gpt_oss,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
}
assert set(_FAMILIES) == set(DEFAULTS)

__all__ = ["SUPPORTED_MODEL_TYPES", "ModelAttention", "load_model_config", "read_model"]


# ---------------------------------------------------------------------------------------------
# The decoder layers around the attention: what the decode step's glue plans need (--glue)

GLUE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # RMSNorm (x * weight) and a SiLU-gated MLP
GLUE_DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-6, "hidden_act": "silu"}  # the four config classes'


@dataclass(frozen=True)
class ModelLayers:
    """A model's decoder-layer shapes outside attention: its norms' width and epsilon, its MLP's
    width (before tensor parallelism splits it)."""

    hidden_size: int
    intermediate_size: int
    eps: float


def read_layers(config: dict[str, Any]) -> ModelLayers:
    """The decoder layers a config.json describes, for the glue plans; a DescriptionError names
    what frostc's glue kernels do not compute (another family's norm, another activation)."""
    model_type = config.get("model_type")
    if model_type not in GLUE_FAMILIES:
        message = (
            f"{describe(model_type)}: glue plans compute {quoted(GLUE_FAMILIES)} layers (RMSNorm times its weight, "
            "a SiLU-gated MLP); build this model's set without --glue"
        )
        raise DescriptionError([Problem("model_type", message)])
    f = _Fields(config, GLUE_DEFAULTS)
    hidden = f.int("hidden_size", required=True)
    intermediate = f.int("intermediate_size", required=True)
    eps = f.float("rms_norm_eps")
    act = f.raw("hidden_act")
    if act != "silu":
        f.problem("hidden_act", f"{describe(act)}: the glue plans' activation is SiLU; build the set without --glue")
    if f.problems or None in (hidden, intermediate, eps):
        raise DescriptionError(f.problems)
    return ModelLayers(hidden, intermediate, eps)
