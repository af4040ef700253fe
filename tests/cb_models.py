"""transformers' continuous batching over the tiny families of tests/hf_models.py, for frostc's
continuous-batching tests on the CPU (tests/test_hf_continuous.py) and the GPU
(tests/gpu/test_hf_continuous.py): the models (windows of 32 where they slide: whole pages of 16),
prompts, transformers' configs, the peer's tokens, the mixed plan sets (`frostc from-config
--cb-tokens`), and the near-tie rule for bf16 runs.
"""

from __future__ import annotations

import random
from typing import Any

from tests.hf_models import TINY

PAGE = 16  # a multiple of 16 (what plans take) dividing the windows below
WINDOW = 32
POOL_BLOCKS = 128  # ContinuousBatchingConfig.num_blocks, and the sets' --cb-blocks
STEP_TOKENS = 64  # ContinuousBatchingConfig.max_batch_tokens
CB_TOKENS = (16, STEP_TOKENS)  # the sets' token buckets: small steps, and transformers' padded ones
CB_REQUESTS = 64
MAX_CACHE_LEN = 512  # the tiny configs' max_position_embeddings
# the families continuous batching serves: not MLA's (DeepSeek: its mixed plans are a kernel gap)
CB_TINY: dict[str, dict[str, Any]] = {
    family: fields | ({"sliding_window": WINDOW} if "sliding_window" in fields else {})
    for family, fields in TINY.items()
    if family != "deepseek_v3"
}
PEER = {  # transformers' own attention in continuous batching (Gemma-2 and gpt-oss have no sdpa)
    "llama": "sdpa",
    "qwen2": "sdpa",
    "qwen3": "sdpa",
    "mistral": "sdpa",
    "mixtral": "sdpa",
    "gemma2": "paged|eager",
    "gemma3": "sdpa",
    "phi3": "sdpa",
    "gpt_oss": "paged|eager",  # no sdpa; transformers' paged eager adds the module's sinks
}
TIE_GAP = 0.05  # a near tie: the exact fp32 logits of the two tokens are closer than this


def cb_model(family: str, *, device: str = "cpu", dtype=None, seed: int = 0):
    """The family's tiny model (random weights, seeded; float32 unless `dtype`), in eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in CB_TINY[family].items() if k not in ("model_type", "torch_dtype")}
    config = AutoConfig.for_model(CB_TINY[family]["model_type"], **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    return model.eval()


def prompts(count: int, longest: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 500) for _ in range(rng.randint(1, longest))] for _ in range(count)]


def cb_config(**fields):
    """A fixed pool and step budget (no memory probing: the CPU has none to probe)."""
    from transformers.generation import ContinuousBatchingConfig

    defaults = {"page_size": PAGE, "num_blocks": POOL_BLOCKS, "max_batch_tokens": STEP_TOKENS}
    return ContinuousBatchingConfig(**(defaults | fields))


def greedy(new_tokens: int):
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1)


def peer_tokens(model, family: str, inputs, new_tokens: int, **config) -> dict[str, list[int]]:
    """transformers' continuous batching with its own attention: the tokens frostc must give."""
    model.set_attn_implementation(PEER[family])
    config = cb_config(auto_switch_to_flash=False, **config)
    out = model.generate_batch(inputs, generation_config=greedy(new_tokens), continuous_batching_config=config)
    return {rid: o.generated_tokens for rid, o in out.items()}


def build_cb_set(family: str, kv_cache_dtype: str | None = None) -> bytes:
    """The family's mixed plans (frostc from-config --phase mixed --cb-tokens 16,64 --cb-blocks 128
    --page-size 16, bf16): one per layer kind and token bucket; for the families hf_fuse fuses
    (--glue), the glue plans of the buckets' rows too, and q, k and v taken as views of the fused
    layers' QKV buffer (--qkv-layout fused: the unfused layers' rows are staged into that layout,
    the fused ones' passed as they are). `kv_cache_dtype` "e4m3": an e4m3 pool."""
    from frost_runtime.hf_fuse import FAMILIES

    from frostc.buildset import build_set
    from frostc.models import read_layers, read_model
    from frostc.serving import ContinuousBatching, deployment

    model = read_model(CB_TINY[family])
    cb = ContinuousBatching(CB_TOKENS, CB_REQUESTS, POOL_BLOCKS)
    glue = read_layers(CB_TINY[family]) if family in FAMILIES else None
    dep = deployment(
        model, batch_sizes=(1,), max_cache_len=MAX_CACHE_LEN, page_size=PAGE, cb=cb, glue=glue,
        kv_cache_dtype=kv_cache_dtype, qkv_layout="fused" if glue else "separate",
    )  # fmt: skip
    return build_set(model, dep, name=cb_set_name(family, kv_cache_dtype), phases=("mixed",)).data


def cb_set_name(family: str, kv_cache_dtype: str | None = None) -> str:
    return f"tiny-{family}-cb" + (f"-kv_{kv_cache_dtype}" if kv_cache_dtype else "")


def near_ties(model, inputs: dict[str, list[int]], expected: dict, got: dict) -> str:
    """The rule for bf16 runs (`inputs`, `expected`, `got` by request id): the same tokens, or, at
    each request's first differing token j, either
    - a near tie: teacher-forced along the expected tokens, the fp32 copy of the model (eager
      attention, one forward) puts the two tokens' logits within TIE_GAP; or
    - the peer left the fp32 model's own greedy tokens first: they differ from the peer's at or
      before j, and frostc's follow them at least as far (a bf16 peer far from fp32 makes no
      near tie: gpt-oss's paged|eager takes its softmax in bf16 and its experts' top-k routing
      turns that into early flips; in fp32 its tokens and frostc's are equal).
    Returns "equal" or "near ties (k of n requests equal)"; raises AssertionError otherwise."""
    import copy

    import torch

    differ = [rid for rid in expected if expected[rid] != got[rid]]
    if not differ:
        return "equal"
    exact = copy.deepcopy(model).float()
    exact.set_attn_implementation("eager")
    for rid in differ:
        want, have = expected[rid], got[rid]
        j = _first_difference(want, have)
        ids = torch.tensor([inputs[rid] + want[:j]], device=model.device)
        with torch.no_grad():
            logits = exact(input_ids=ids).logits[0, -1].float()
        gap = float((logits[want[j]] - logits[have[j]]).abs())
        if gap <= TIE_GAP:
            continue
        prompt = torch.tensor([inputs[rid]], device=model.device)
        with torch.no_grad():
            out = exact.generate(prompt, max_new_tokens=len(want), min_new_tokens=len(want), do_sample=False)
        fp32 = out[0, prompt.shape[1] :].tolist()
        peer_left, ours_left = _first_difference(fp32, want), _first_difference(fp32, have)
        assert peer_left <= j and ours_left >= peer_left, (
            f"{rid} token {j}: {want[j]} vs {have[j]}, fp32 logits {gap:.4f} apart: no near tie; the fp32 model's "
            f"tokens leave the peer's at {peer_left}, frostc's at {ours_left}"
        )
    return f"near ties ({len(expected) - len(differ)} of {len(expected)} requests equal)"


def _first_difference(a: list[int], b: list[int]) -> int:
    """The first index where a and b differ (their common length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
