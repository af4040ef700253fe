"""What frost_vllm reads from a plan set built for vLLM (`frostc from-config CONFIG --engine vllm`),
and the checks of a vLLM deployment against it. No vLLM import: the GPU machine, which has no
vLLM, runs the launch path (step.py, launch.py) on these.

A vLLM set holds, per layer kind, one mixed plan per token bucket, each with the slots append
(`slot_mapping`) and vLLM's per-layer cache by strides. Everything the plugin needs is read from
the plans' slots, so the set format knows nothing of vLLM:
- the buckets: the entries' `batch` (tokens); a bucket's sequences: its `cu_q` slot's rows - 1;
- the pool: `k_cache`'s dims (pages, page_size, hkv, d); its layout: `k_cache`'s strides
  (nhd: a token's heads adjacent, hnd: a head's tokens adjacent);
- an e4m3 cache's scale grain: `k_scale`'s dims ((1,): per tensor, (hkv,): per KV head).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cache

from frost_runtime.planset import KindInfo, PlanSet, read_set
from frost_runtime.schema import TensorSlot

ENV = "FROSTC_PLAN_SET"  # the plan set's path, in every vLLM process (the plugin reads it there)
PHASE = "mixed"
REBUILD = "build it with: frostc from-config CONFIG.json --engine vllm --pages N -o SET.frostset"
# each setting: vLLM's flag, and frostc from-config's for the same (the fixes a message names)
FLAGS = {
    "max_num_seqs": ("--max-num-seqs", "--max-num-seqs"),
    "max_num_batched_tokens": ("--max-num-batched-tokens", "--max-num-batched-tokens"),
    "max_model_len": ("--max-model-len", "--max-cache-len"),
    "block_size": ("--block-size", "--page-size"),
    "num_gpu_blocks": ("--num-gpu-blocks-override", "--pages"),
    "tensor_parallel_size": ("--tensor-parallel-size", "--tp"),
}


class SetError(ValueError):
    """The plan set is not one frost_vllm can serve, or does not match the deployment."""


@dataclass(frozen=True)
class Bucket:
    tokens: int  # the query rows a plan takes
    sequences: int  # its page table's rows


@dataclass(frozen=True)
class VllmSet:
    """A plan set built for vLLM, with what its plans' slots say of the deployment."""

    plans: PlanSet
    path: str
    buckets: tuple[Bucket, ...]  # increasing tokens; the same for every kind
    pages: int  # vLLM's num_gpu_blocks
    page_size: int  # vLLM's block_size
    max_pages: int  # the page tables' width: max_model_len / block_size, rounded up
    kv_heads: int
    head_dim: int
    layout: str  # "nhd" or "hnd" (VLLM_KV_CACHE_LAYOUT)
    kv_cache_dtype: str  # "bf16", "fp16" or "e4m3"
    scale_grain: str | None  # an e4m3 cache's: "tensor" or "head"

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1].tokens

    @property
    def max_sequences(self) -> int:
        return self.buckets[-1].sequences

    @property
    def max_model_len(self) -> int:
        return self.plans.serving.max_cache_len

    @property
    def tp(self) -> int:
        return self.plans.serving.tp

    @property
    def kinds(self) -> tuple[KindInfo, ...]:
        return tuple(self.plans.kind_info.values())

    def bucket(self, tokens: int) -> Bucket:
        """The smallest bucket taking `tokens` rows (SetError past the largest)."""
        for b in self.buckets:
            if b.tokens >= tokens:
                return b
        raise SetError(
            f"a step of {tokens} tokens is over the set's largest bucket {self.max_tokens}: start vLLM with "
            f"--max-num-batched-tokens {self.max_tokens} or less, or rebuild the set with a larger one"
        )

    def key(self, kind: str, bucket: Bucket) -> str:
        return f"{kind}-{PHASE}-t{bucket.tokens}"

    def slots(self, kind: str, bucket: Bucket) -> dict[str, TensorSlot]:
        return {s.name: s for s in self.plans.plan_data(self.key(kind, bucket)).slots}


@cache
def active_set() -> VllmSet:
    """The set named by FROSTC_PLAN_SET, read and checked once per process."""
    path = os.environ.get(ENV)
    if not path:
        raise SetError(f"{ENV} is not set: point it at a plan set built for vLLM ({REBUILD})")
    return read_vllm_set(path)


def read_vllm_set(path: str) -> VllmSet:
    """Read `path` (verified as every set is) and check it was built for vLLM."""
    try:
        plans = read_set(path)
    except OSError as exc:
        raise SetError(f"{ENV}={path}: {exc.strerror or exc}") from None
    other = sorted({e.phase for e in plans.entries if e.phase != PHASE})
    mixed = [e for e in plans.entries if e.phase == PHASE]
    if other or not mixed:
        raise SetError(f"{path} holds {', '.join(other) or 'no mixed'} plans: it was not built for vLLM; {REBUILD}")
    first = {s.name: s for s in plans.plan_data(mixed[0].key).slots}
    if "slot_mapping" not in first:
        raise SetError(f"{path}'s mixed plans are transformers' (no slot_mapping): {REBUILD}")
    cache_slot = first["k_cache"]
    pages, page_size, kv_heads, head_dim = cache_slot.dims
    scale = first.get("k_scale")
    buckets = sorted({(e.batch, {s.name: s for s in plans.plan_data(e.key).slots}["cu_q"].dims[0] - 1) for e in mixed})
    return VllmSet(
        plans=plans,
        path=str(path),
        buckets=tuple(Bucket(t, b) for t, b in buckets),
        pages=pages,
        page_size=page_size,
        max_pages=first["page_table"].dims[1],
        kv_heads=kv_heads,
        head_dim=head_dim,
        layout=cache_layout(cache_slot),
        kv_cache_dtype=cache_slot.dtype,
        scale_grain=None if scale is None else ("tensor" if scale.dims == (1,) else "head"),
    )


def cache_layout(slot: TensorSlot) -> str:
    """nhd when a page's token stride spans its heads (vLLM's LBNHC), hnd when a head's tokens
    are adjacent (LBHNC): the (pages, page_size, hkv, d) view's strides say which."""
    _, token, head, _ = slot.strides
    return "nhd" if token > head else "hnd"


@dataclass(frozen=True)
class Deployment:
    """What a vLLM engine was started with, as the plugin reads it from its VllmConfig."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_gpu_blocks: int | None  # --num-gpu-blocks-override, when given
    tensor_parallel_size: int


def deployment_problems(s: VllmSet, d: Deployment) -> list[str]:
    """Every way the engine's settings exceed or differ from what the set's plans were built for,
    each naming vLLM's flag and what the set takes."""
    problems = []

    def over(field: str, got: int, most: int) -> None:
        vllm, frostc = FLAGS[field]
        if got > most:
            problems.append(f"{vllm} {got}: the set's plans take at most {most} (frostc from-config {frostc})")

    def differs(field: str, got: int | None, want: int) -> None:
        vllm, frostc = FLAGS[field]
        if got != want:
            problems.append(f"{vllm} {got}: the set was built for {want} (frostc from-config {frostc})")

    over("max_num_seqs", d.max_num_seqs, s.max_sequences)
    over("max_num_batched_tokens", d.max_num_batched_tokens, s.max_tokens)
    over("max_model_len", d.max_model_len, s.max_pages * s.page_size)
    differs("block_size", d.block_size, s.page_size)
    differs("tensor_parallel_size", d.tensor_parallel_size, s.tp)
    if d.num_gpu_blocks is None:
        problems.append(f"--num-gpu-blocks-override not given: start vLLM with --num-gpu-blocks-override {s.pages}")
    else:
        differs("num_gpu_blocks", d.num_gpu_blocks, s.pages)
    return problems


@dataclass(frozen=True)
class LayerAttention:
    """One attention layer as vLLM builds its impl (per rank), in the set's terms."""

    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    window_left: int | None  # vLLM's sliding_window - 1; None: no window
    softcap: float | None
    sinks: bool = False  # the impl is given attention sinks (gpt-oss)


def layer_attention(
    heads: int, head_size: int, scale: float, kv_heads: int | None, sliding_window: int | None,
    logits_soft_cap: float | None, max_model_len: int, sinks: bool = False,
) -> LayerAttention:  # fmt: skip
    """vLLM's impl arguments as the set's kinds state them: a window in keys before the query's
    own (dropped, as frostc drops it, when it covers the whole cache), no softcap as None."""
    window = None if sliding_window is None else sliding_window - 1
    if window is not None and window >= max_model_len - 1:
        window = None
    return LayerAttention(heads, kv_heads or heads, head_size, scale, window, logits_soft_cap or None, sinks)


def kind_for(s: VllmSet, layer: LayerAttention) -> KindInfo:
    """The set's kind computing `layer`'s attention (kinds are distinct attentions, so at most one
    matches); SetError naming each field of the nearest kind that differs."""
    problems_by_kind = {k.kind: _differences(k, layer) for k in s.kinds}
    for kind, problems in problems_by_kind.items():
        if not problems:
            return s.plans.kind_info[kind]
    kind, problems = min(problems_by_kind.items(), key=lambda item: len(item[1]))
    raise SetError(
        f"no layer kind of {s.path} computes this layer's attention; nearest, {kind}: " + "; ".join(problems)
        + ": rebuild the set from this model's config with vLLM's settings (frostc from-config --engine vllm)"
    )  # fmt: skip


def _differences(k: KindInfo, layer: LayerAttention) -> list[str]:
    fields = (
        ("heads (per rank: check --tp)", layer.heads, k.heads),
        ("KV heads (per rank)", layer.kv_heads, k.kv_heads),
        ("head_size", layer.head_dim, k.head_dim),
        ("sliding window (keys before the query's own)", layer.window_left, k.window_left),
        ("logits_soft_cap", layer.softcap, k.softcap),
        ("attention sinks", layer.sinks, k.sinks),
    )
    problems = [f"{what} is {got}, the set's {want}" for what, got, want in fields if got != want]
    if not math.isclose(layer.scale, k.scale, rel_tol=1e-6):
        problems.append(f"scale is {layer.scale:.8g}, the set's {k.scale:.8g}")
    return problems
