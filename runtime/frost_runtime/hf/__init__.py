"""A Hugging Face transformers attention backend: `attn_implementation="frostc"`, served by a plan set.

    plans = frost_runtime.read_set("llama.frostset")             # frostc from-config config.json -o ...
    backend = frost_runtime.hf.install(plans, model)             # registers "frostc", switches the model
    out = model.generate(**inputs, past_key_values=backend.new_cache(), max_new_tokens=64)

The design (README, "Serving a model"):
- **The cache is frostc's.** `FrostcCache` stores nothing itself: its `update` hands this step's
  K/V straight to the attention, which appends them to paged pools, one pair per layer, that the
  backend owns (allocated at first use from the set's deployment). Sequence b owns pages
  [b * max_pages, (b + 1) * max_pages) and its tokens sit there compacted from position 0: left
  padding never reaches the cache, so the plans need no start offsets.
- **Lengths never leave the device.** The mask function (registered with the attention, so a
  masked batch is never silently unmasked) turns the 2-D padding mask into each row's first
  valid column and count on the device, once per forward. Prefill runs the packed plan on HF's own
  rows, or packs each prompt's valid tokens into its buffers with device-computed indices and
  scatters the result back (pad rows get 0); decode appends with `cache_len` = the row's count.
  Nothing reads the device from the host, so a decode step can be captured in a CUDA graph
  (`DecodeGraph`).
- **Plans where they cover the call, torch otherwise.** Prefill of a fresh cache (`b * s` within the
  set's prompt tokens) goes through the set's packed plan, decode (1 + speculative new tokens)
  through its paged plan (kv_append + attention), windows and softcap included. A call the set
  does not cover (a batch over the largest bucket, another step size, a set lacking the plan,
  another cache) is computed by an fp32 torch reference over the same pools, with one warning per
  reason: never a wrong answer. `backend.calls` counts both (calls outside torch.compile).
- A row's valid tokens must be one run (left or right padding, as tokenizers make them); a row
  that is not gets NaN outputs (checked on the device, never read back), not a wrong answer.
- **An FP8 cache** (a set built with `--kv-cache-dtype e4m3`): see pools.py.
- **MLA (DeepSeek-V2/V3)**: transformers keeps the latents in its own cache and hands attention the
  whole context, expanded per head, at every step; a set of MLA kinds serves the prompt with its
  packed prefill plans and later steps with its context plans (launches.context), and
  `new_cache()` is transformers' `DynamicCache`.

The modules, along vLLM's attention-backend seams (backend, metadata builder, impl):
- backend.py: `FrostcAttention`, `install`: registration with transformers, and each call's routing
  to a plan or to the reference, with counts and warnings;
- support.py: what the set serves, and the checks of a model and of its calls against it;
- metadata.py: the mask function's per-forward `FrostcMask` and the index tensors derived from it;
- launches.py: the plans' launches, prefill (packed) and decode (paged);
- pools.py: the KV pools and an FP8 cache's scales;
- reference.py: the fp32 torch reference the fallbacks compute;
- cache.py: HF's cache class, `FrostcCache`;
- decode_graph.py: `DecodeGraph`, a decode step as one CUDA graph.

transformers' continuous batching (`generate_batch`, `ContinuousBatchingManager`) has its own modules,
along the same seams (docs/serving.md, "Continuous batching in transformers"):
- continuous.py: `ContinuousAttention`, `install`: the attention under "frostc_cb", each call one
  mixed step over transformers' pool, and the reference executor;
- cb_patches.py: the two hooks that make transformers accept the name as mask-free;
- cb_cache.py: transformers' pool as frostc's paged cache, by strides;
- cb_step.py: a step's cu_seqlens_q, seq_len_kv and page tables from transformers' own tensors;
- cb_plans.py: the plan executor (the set's mixed plans by token bucket);
- cb_reference.py: the fp32 torch reference over the pages in place.
"""

from frost_runtime.hf.backend import NAME, FrostcAttention, install
from frost_runtime.hf.decode_graph import DecodeGraph, RecompileLimitError
from frost_runtime.hf.launches import rows_as_slot  # noqa: F401  (tests/test_hf_fuse.py checks it as hf.rows_as_slot)
from frost_runtime.hf.metadata import FrostcMask
from frost_runtime.hf.pools import KV_SCALE_HEADROOM, MIN_KV_SCALE, Pools, quantize

__all__ = [
    "KV_SCALE_HEADROOM",
    "MIN_KV_SCALE",
    "NAME",
    "DecodeGraph",
    "FrostcAttention",
    "FrostcMask",
    "Pools",
    "RecompileLimitError",
    "install",
    "quantize",
]
