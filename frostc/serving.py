"""From a model to the plans that serve it: deployment options, layer kinds, and the plan list.

    model = read_model(load_model_config("config.json"))        # frostc.models
    dep = deployment(model, batch_sizes=CUDA_GRAPH_BATCH_SIZES, tp=2)
    kinds = layer_kinds(model, dep)                              # distinct attentions, with their layers
    entries = plan_list(kinds, dep)                              # kind x phase x batch bucket
    problems = check_entry(entry)                                # validate + resolve: no compile

A plan per (layer kind x phase x batch bucket): prefill is the packed variable-length form (the
bucket's sequences, up to `max_prompt_tokens` tokens in all, causal, no lse); decode is the paged
form, kv_append then sdpa, with 1 + `speculative` new tokens per sequence over a pool of `pages`
pages of `page_size` tokens, in the model's dtype or in e4m3 (`kv_cache_dtype`: half the bytes,
with one float32 scale per KV head and layer, the serving side's to set). A continuous-batching
deployment (`cb_tokens`) adds the mixed phase: per token bucket, the mixed form with the packed
append over transformers' own pool by strides (`ContinuousBatching`). A vLLM deployment
(`VllmEngine`) has the mixed phase only: per token bucket, the mixed form with the slots append
(`slot_mapping`) over vLLM's per-layer cache by strides, K and V the two halves of its last dim.
Nothing here compiles: building the plan set comes later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from frost_runtime.dtypes import DTYPES, KV_CACHE, SCALE_DTYPE

from frostc.description import Description, GraphBuilder
from frostc.errors import DescriptionError, Problem
from frostc.field_checks import quoted
from frostc.models import SERVED_DTYPES, ModelAttention, ModelLayers
from frostc.ops.sdpa import SINKS_DTYPE

# vLLM's default CUDA-graph capture sizes: 1, 2, 4, then 8..256 step 8, then 272..512 step 16
CUDA_GRAPH_BATCH_SIZES = (1, 2, 4, *range(8, 257, 8), *range(272, 513, 16))
assert len(CUDA_GRAPH_BATCH_SIZES) == 51
CUDA_GRAPHS = "cuda-graphs"

PAGE_SIZE_STEP, MAX_PAGE_SIZE = 16, 256  # the paged form's rule (README, frostc.ops.paged_cache)
MAX_SPECULATIVE = 15  # the paged form takes 1 to 16 new tokens per sequence
# how decode's q, k_new and v_new lie: each in rows of its own (b, s, heads, d), or as views of one
# (b, s, hq + 2 hkv, d) buffer, what a fused QKV projection writes (frost_runtime.hf_fuse)
QKV_LAYOUTS = ("separate", "fused")
FORMS = {"prefill": "packed", "decode": "paged", "mixed": "mixed", "context": "packed"}
# transformers' continuous batching (5.23): max_requests_per_batch's fallback, and the pool's alignment
CB_MAX_REQUESTS, CB_SECTOR_ALIGN, CB_TRASH_SECTORS = 1024, 128, 2


@dataclass(frozen=True)
class ContinuousBatching:
    """A transformers continuous-batching deployment (`ContinuousBatchingConfig`): what its mixed
    plans' capacities and its pool's layout come from."""

    tokens: tuple[int, ...]  # the token buckets: a step's query rows (transformers pads them to its q interval)
    requests: int  # max_requests_per_batch: a step's sequences are min(tokens, requests)
    blocks: int  # num_blocks: whole-model blocks of page_size tokens the pool holds
    # set by `deployment()`: transformers' layer groups (cache allocators) and each one's pool blocks
    groups: tuple[tuple[str, tuple[int, ...]], ...] = ()
    pool_blocks: tuple[tuple[str, int], ...] = ()

    def sequences(self, tokens: int) -> int:
        """The page table's rows of a bucket: transformers pads the sequences to min(tokens, requests)."""
        return min(tokens, self.requests)


# vLLM V1 (frost_vllm): its cache layouts (VLLM_KV_CACHE_LAYOUT; NHD = LBNHC, its default, HND = LBHNC),
# the grain of an e4m3 cache's scales (its checkpoints load one per tensor), its server defaults on an
# H100/H200 (EngineArgs: max_num_seqs 1024, max_num_batched_tokens 8192)
ENGINES = ("transformers", "vllm")  # who serves a set: frost_runtime.hf, or frost_vllm
VLLM_LAYOUTS = ("nhd", "hnd")
VLLM_KV_SCALES = ("tensor", "head")
VLLM_MAX_NUM_SEQS, VLLM_MAX_NUM_BATCHED_TOKENS = 1024, 8192


@dataclass(frozen=True)
class VllmEngine:
    """A vLLM V1 deployment (`frost_vllm`): what its mixed plans' buckets and capacities and its
    cache's strides come from. Each step's tokens (padded to a CUDA-graph capture size, or not)
    take the smallest bucket that holds them; the page count is `Deployment.pages`, the one vLLM is
    started with (`--num-gpu-blocks-override`), because the plans' bounds are fixed at build."""

    tokens: tuple[int, ...]  # the token buckets, increasing; the largest >= max_num_batched_tokens
    max_num_seqs: int  # vLLM's --max-num-seqs: a step's sequences are at most min(tokens, this)
    max_num_batched_tokens: int  # vLLM's --max-num-batched-tokens: the largest step
    layout: str = "nhd"  # one of VLLM_LAYOUTS
    kv_scales: str = "tensor"  # one of VLLM_KV_SCALES: an e4m3 cache's k_scale / v_scale, (1,) or (hkv,)

    def sequences(self, tokens: int) -> int:
        """The page table's rows of a bucket: a step has at most one sequence per token."""
        return min(tokens, self.max_num_seqs)


def vllm_token_buckets(max_num_batched_tokens: int) -> tuple[int, ...]:
    """vLLM's CUDA-graph capture sizes up to its largest step, then doubling to that step: a
    captured step's padded tokens are a bucket exactly (no staging), a longer one is staged into
    the next power of two (or the largest step)."""
    sizes = {t for t in CUDA_GRAPH_BATCH_SIZES if t <= max_num_batched_tokens}
    t = 1024
    while t < max_num_batched_tokens:
        sizes.add(t)
        t *= 2
    sizes.add(max_num_batched_tokens)
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class Deployment:
    """How the model is served: what every plan's capacities come from."""

    dtype: str
    batch_sizes: tuple[int, ...]  # increasing
    max_prompt_tokens: int  # one prefill step's tokens, all its sequences together
    max_cache_len: int  # tokens per sequence in the cache
    page_size: int
    pages: int  # the pool's, shared by every sequence
    speculative: int  # decode's new tokens per sequence: 1 + speculative
    tp: int
    kv_cache_dtype: str  # the paged pools': `dtype`, or a quantized one (e4m3) with scales
    qkv_layout: str = "separate"  # one of QKV_LAYOUTS: how decode plans take q, k_new, v_new
    glue: ModelLayers | None = None  # the decoder layers, when the set holds the decode step's glue plans
    cb: ContinuousBatching | None = None  # a transformers continuous-batching deployment: the mixed phase
    vllm: VllmEngine | None = None  # a vLLM deployment: the mixed phase only

    @property
    def quantized_cache(self) -> bool:
        return DTYPES[self.kv_cache_dtype].quantized

    @property
    def max_pages(self) -> int:
        """Pages one sequence can hold: the page table's width."""
        return -(-self.max_cache_len // self.page_size)

    @property
    def new_tokens(self) -> int:
        return 1 + self.speculative


def parse_batch_sizes(text: str, flag: str = "--batch-sizes") -> tuple[int, ...]:
    """`--batch-sizes`: "1,2,4" (any order, no repeats) or "cuda-graphs" (vLLM's 51 capture sizes);
    `--cb-tokens` likewise (its sizes are tokens)."""
    if text.strip() == CUDA_GRAPHS and flag == "--batch-sizes":
        return CUDA_GRAPH_BATCH_SIZES
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        message = f"{text!r}: expected positive ints separated by commas (1,2,4) or {CUDA_GRAPHS!r}"
        raise DescriptionError([Problem(flag, message)])
    sizes = [int(p) for p in parts]
    if len(set(sizes)) != len(sizes):
        raise DescriptionError([Problem(flag, f"{text!r}: a size appears twice; list each once")])
    return tuple(sorted(sizes))


def deployment(
    model: ModelAttention,
    *,
    dtype: str | None = None,
    batch_sizes: tuple[int, ...] = CUDA_GRAPH_BATCH_SIZES,
    max_prompt_tokens: int | None = None,
    max_cache_len: int | None = None,
    page_size: int = PAGE_SIZE_STEP,
    pages: int | None = None,
    speculative: int = 0,
    tp: int = 1,
    kv_cache_dtype: str | None = None,
    qkv_layout: str = "separate",
    glue: ModelLayers | None = None,
    cb: ContinuousBatching | None = None,
    vllm: VllmEngine | None = None,
) -> Deployment:
    """The options, checked against each other and the model; None takes the default: the config's
    dtype, a cache of the model's max positions, prompts up to the cache's length, and a pool of
    pages enough for the largest batch at full length. Every bad option is one problem, named
    by its command-line flag."""
    problems: list[Problem] = []

    def bad(flag: str, message: str) -> None:
        problems.append(Problem(flag, message))

    if dtype is not None and dtype not in SERVED_DTYPES:
        bad("--dtype", f"{dtype!r}: frostc serves {quoted(SERVED_DTYPES)}")
    elif dtype is None:
        dtype = model.dtype
        if dtype not in SERVED_DTYPES:
            said = "names no dtype" if dtype is None else "says float32"
            served = quoted(SERVED_DTYPES)
            bad("--dtype", f"the config {said}; frostc serves {served}: pass --dtype bf16 or --dtype fp16")
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        bad("--batch-sizes", "give at least one batch size, each >= 1")
    if max_cache_len is None:
        max_cache_len = model.max_positions
    elif not 1 <= max_cache_len <= model.max_positions:
        most = model.max_positions
        bad("--max-cache-len", f"{max_cache_len}: must be 1 to the model's max_position_embeddings {most}")
    if max_prompt_tokens is None:
        max_prompt_tokens = max_cache_len
    elif max_prompt_tokens < 1:
        bad("--max-prompt-tokens", f"{max_prompt_tokens}: must be >= 1 (the tokens of one prefill step)")
    if page_size % PAGE_SIZE_STEP or not PAGE_SIZE_STEP <= page_size <= MAX_PAGE_SIZE:
        bad("--page-size", f"{page_size}: must be a multiple of {PAGE_SIZE_STEP}, {PAGE_SIZE_STEP} to {MAX_PAGE_SIZE}")
    if not 0 <= speculative <= MAX_SPECULATIVE:
        message = f"{speculative}: must be 0 to {MAX_SPECULATIVE} (a decode step takes 1 to 16 tokens per sequence)"
        bad("--speculative", message)
    _check_tp(model, tp, bad)
    if kv_cache_dtype is not None and kv_cache_dtype not in KV_CACHE:
        bad("--kv-cache-dtype", f"{kv_cache_dtype!r}: the paged cache holds {quoted(KV_CACHE)}")
    elif kv_cache_dtype is not None and dtype is not None and not DTYPES[kv_cache_dtype].quantized:
        if kv_cache_dtype != dtype:
            bad("--kv-cache-dtype", f"{kv_cache_dtype!r}: an unquantized cache holds the model's {dtype}; "
                                    f"leave the flag out, or pass e4m3 (FP8: half the bytes)")  # fmt: skip
    if glue is not None and glue.intermediate_size % tp:
        bad("--glue", f"the MLP's intermediate_size {glue.intermediate_size} does not split over --tp {tp} ranks")
    if qkv_layout not in QKV_LAYOUTS:
        bad("--qkv-layout", f"{qkv_layout!r}: decode and mixed plans take q, k and v as {quoted(QKV_LAYOUTS)}")
    if cb is not None:
        _check_cb(model, cb, page_size, bad)
    if vllm is not None:
        _check_vllm(vllm, cb, pages, bad)
        if glue is not None:
            bad("--glue", "the glue plans are for transformers' fused layers (hf_fuse); leave the flag out with vllm")
        if qkv_layout != "separate":
            bad("--qkv-layout", "vLLM hands its steps' q, k and v as rows of their own; leave the flag out with vllm")
    if problems:
        raise DescriptionError(problems)
    max_pages = -(-max_cache_len // page_size)
    if pages is None:
        pages = max(batch_sizes) * max_pages
    elif pages < max_pages:
        message = f"{pages}: fewer than one sequence of {max_cache_len} tokens needs: give at least {max_pages}"
        bad("--pages", message)
        raise DescriptionError(problems)
    if cb is not None:
        groups = cb_groups(model)
        kv_heads = max(1, model.kv_heads // tp)
        cb = replace(
            cb,
            groups=tuple(groups.items()),
            pool_blocks=tuple(cb_pool_blocks(model, kv_cache_dtype or dtype, page_size, cb.blocks, kv_heads).items()),
        )
    return Deployment(
        dtype, tuple(batch_sizes), max_prompt_tokens, max_cache_len, page_size, pages, speculative, tp,
        kv_cache_dtype or dtype,
        qkv_layout, glue, cb, vllm,
    )  # fmt: skip


def _check_vllm(vllm: VllmEngine, cb: ContinuousBatching | None, pages: int | None, bad) -> None:
    """One engine a set; vLLM's limits positive, the buckets taking its largest step, its pool's
    block count given (the plans' bounds are fixed at build: vLLM is started with the same)."""
    if cb is not None:
        bad("--engine", "vllm: the --cb-* flags are transformers' continuous batching; leave them out")
    if vllm.max_num_seqs < 1:
        bad("--max-num-seqs", f"{vllm.max_num_seqs}: vLLM's --max-num-seqs is >= 1")
    if vllm.max_num_batched_tokens < 1:
        bad("--max-num-batched-tokens", f"{vllm.max_num_batched_tokens}: vLLM's --max-num-batched-tokens is >= 1")
    elif not vllm.tokens or vllm.tokens[-1] < vllm.max_num_batched_tokens:
        most = vllm.tokens[-1] if vllm.tokens else 0
        bad("--batch-sizes", f"the largest token bucket {most} is below --max-num-batched-tokens "
                             f"{vllm.max_num_batched_tokens}: a step that long would have no plan; add it")  # fmt: skip
    if vllm.layout not in VLLM_LAYOUTS:
        bad("--kv-layout", f"{vllm.layout!r}: vLLM's cache layouts are {quoted(VLLM_LAYOUTS)} (VLLM_KV_CACHE_LAYOUT)")
    if vllm.kv_scales not in VLLM_KV_SCALES:
        bad("--kv-scales", f"{vllm.kv_scales!r}: an e4m3 cache's scales are {quoted(VLLM_KV_SCALES)}")
    if pages is None:
        bad("--pages", "give the pool's block count, and start vLLM with the same: vllm serve ... "
                       "--num-gpu-blocks-override PAGES (the plans' page bounds are fixed at build)")  # fmt: skip


def _check_cb(model: ModelAttention, cb: ContinuousBatching, page_size: int, bad) -> None:
    """transformers' rings are whole pages; its buckets and sizes > 0. (An e4m3 pool is frostc's:
    frost_runtime.hf.cb_patches has transformers allocate it in that dtype.)"""
    if not cb.tokens or any(t < 1 for t in cb.tokens) or len(set(cb.tokens)) != len(cb.tokens):
        bad("--cb-tokens", f"{list(cb.tokens)}: give distinct token buckets, each >= 1 (transformers' padded steps)")
    if cb.requests < 1:
        bad("--cb-requests", f"{cb.requests}: transformers' max_requests_per_batch is >= 1")
    if cb.blocks < 1:
        bad("--cb-blocks", f"{cb.blocks}: give transformers' num_blocks (ContinuousBatchingConfig), >= 1")
    window = model.sliding_window
    if window is not None and window % page_size:
        bad("--page-size", f"{page_size} does not divide the sliding window {window}: transformers' ring of "
                           "pages is read in place only when whole pages wrap")  # fmt: skip


def cb_groups(model: ModelAttention) -> dict[str, tuple[int, ...]]:
    """transformers' layer groups (cache allocators): the full-attention and the sliding layers."""
    groups: dict[str, list[int]] = {}
    for layer, window in enumerate(model.window_left):
        groups.setdefault("full_attention" if window is None else "sliding_attention", []).append(layer)
    return {name: tuple(layers) for name, layers in groups.items()}


def cb_pool_blocks(model: ModelAttention, dtype: str, page_size: int, num_blocks: int, kv_heads: int) -> dict[str, int]:
    """Blocks of each group's view of transformers' pool, as transformers 5.23 sizes it from
    `num_blocks` (cache.py: sectors the lcm of the groups' block bytes and 128, two trash sectors
    ahead of them; every group views the whole pool in blocks of its own size); `dtype`: the
    pool's (the model's, or e4m3)."""
    page_bytes = 2 * page_size * kv_heads * model.head_dim * DTYPES[dtype].bytes
    block_bytes = {name: page_bytes * len(layers) for name, layers in cb_groups(model).items()}
    sector = math.lcm(*block_bytes.values(), CB_SECTOR_ALIGN)
    sectors = max(1, -(-num_blocks * model.layers * page_bytes // sector))
    total = (sectors + CB_TRASH_SECTORS) * sector
    return {name: total // size for name, size in block_bytes.items()}


def _check_tp(model: ModelAttention, tp: int, bad) -> None:
    """Heads split evenly over the ranks; KV heads too, or, when fewer than the ranks, each rank
    keeps one KV head, replicated tp / kv_heads times (vLLM's QKVParallelLinear does the same)."""
    if tp < 1:
        bad("--tp", f"{tp}: the tensor-parallel degree is >= 1")
        return
    if model.heads % tp:
        message = f"{tp} does not divide the model's {model.heads} attention heads: use one of {_divisors(model.heads)}"
        bad("--tp", message)
    elif model.kv_heads % tp and tp % model.kv_heads:
        fits = [d for d in _divisors(model.heads) if model.kv_heads % d == 0 or d % model.kv_heads == 0]
        kv = model.kv_heads
        message = f"{tp} neither divides the model's {kv} KV heads nor is a multiple of them: use one of {fits}"
        bad("--tp", message)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class LayerKind:
    """One distinct attention of a model on one rank, and the layers that use it."""

    index: int
    layers: tuple[int, ...]
    heads: int  # per rank
    kv_heads: int  # per rank
    head_dim: int
    dtype: str
    window_left: int | None
    softcap: float | None
    scale: float
    sinks: bool  # each layer binds its own `sinks` (float32, one logit per query head on this rank)
    gap: str | None = None  # what frostc's kernels cannot compute of it yet (ModelAttention.kernel_gap)
    prefill_gap: str | None = None  # what of it its prefill plans lack (ModelAttention.prefill_gap)
    head_dim_v: int = 0  # v's and o's head dim where it is not head_dim (DeepSeek's prefill: 128), else 0
    # MLA (DeepSeek): transformers' model code expands the cached latents into every head's K and V
    # and hands attention the whole context at each step; the set serves those steps with its
    # `context` plans (packed, bottom-right), the absorbed latent decode being the gap
    latent: bool = False

    @property
    def name(self) -> str:
        return f"l{self.index}"


def layer_kinds(model: ModelAttention, dep: Deployment) -> tuple[LayerKind, ...]:
    """The distinct attentions, numbered in the order of their first layer. A window at least as
    long as the cache masks nothing (every key a query could see is inside it) and is dropped."""
    heads, kv_heads = model.heads // dep.tp, max(1, model.kv_heads // dep.tp)
    by_attention: dict[tuple, list[int]] = {}
    for layer, window in enumerate(model.window_left):
        window = window if window is not None and window < dep.max_cache_len - 1 else None
        attention = (heads, kv_heads, model.head_dim, dep.dtype, window, model.softcap, model.scale, model.sinks)
        by_attention.setdefault(attention, []).append(layer)
    gaps = dict(gap=model.kernel_gap, prefill_gap=model.prefill_gap, head_dim_v=model.value_dim_apart,
                latent=model.latent_dim is not None)  # fmt: skip
    return tuple(LayerKind(i, tuple(layers), *a, **gaps) for i, (a, layers) in enumerate(by_attention.items()))


def dropped_windows(model: ModelAttention, dep: Deployment) -> str | None:
    """A note when the model's window is as long as the cache (so no kind keeps it)."""
    window = model.sliding_window
    if window is not None and window - 1 >= dep.max_cache_len - 1:
        return f"sliding window of {window} keys >= the cache length {dep.max_cache_len}: it masks nothing, dropped"
    return None


@dataclass(frozen=True)
class PlanEntry:
    """One plan of the set, described but not built."""

    key: str  # "l0-decode-b32": the plan's name, and its key in the set
    kind: int
    phase: str
    batch: int
    description: Description  # what would be built (also for an unsupported entry: what it would take)
    unsupported: str | None  # why frostc cannot build it yet; None when it can

    @property
    def form(self) -> str:
        return FORMS[self.phase]


def plan_list(kinds: tuple[LayerKind, ...], dep: Deployment) -> tuple[PlanEntry, ...]:
    """Every kind's prefill plans, then its decode plans, each over the batch buckets, in order (an
    MLA kind's context plans after its decode ones); a continuous-batching deployment's mixed
    plans, over its token buckets, after them; a vLLM deployment's mixed plans alone."""
    if dep.vllm is not None:
        return vllm_entries(kinds, dep)
    plans = [
        PlanEntry(key, kind.index, phase, batch, _DESCRIBE[phase](key, kind, dep, batch), why)
        for kind in kinds
        for phase in ("prefill", "decode") + (("context",) if kind.latent else ())
        for batch in dep.batch_sizes
        for key in [f"{kind.name}-{phase}-b{batch}"]
        for why in [kind.gap if phase == "decode" else kind.prefill_gap]
    ]
    if dep.cb is not None:
        plans += mixed_entries(kinds, dep)
    return tuple(plans)


def vllm_entries(kinds: tuple[LayerKind, ...], dep: Deployment) -> tuple[PlanEntry, ...]:
    """A vLLM deployment's plans: each kind's mixed plan per token bucket, nothing else (vLLM runs
    every step, all-decode ones included, as one packed mix)."""
    return tuple(
        PlanEntry(key, kind.index, "mixed", tokens, vllm_mixed_description(key, kind, dep, tokens), kind.gap)
        for kind in kinds
        for tokens in dep.vllm.tokens
        for key in [f"{kind.name}-mixed-t{tokens}"]
    )


def mixed_entries(kinds: tuple[LayerKind, ...], dep: Deployment) -> list[PlanEntry]:
    """Each kind's mixed plan per token bucket (the entry's `batch` is the bucket's tokens), over its
    group's view of transformers' pool."""
    groups, blocks = dict(dep.cb.groups), dict(dep.cb.pool_blocks)
    entries = []
    for kind in kinds:
        owning = [name for name, layers in groups.items() if set(kind.layers) & set(layers)]
        pool = (blocks[owning[0]], len(groups[owning[0]]))
        why = kind.gap
        if len(owning) > 1:
            why = "its layers are in both of transformers' cache groups (a window as long as the cache)"
        for tokens in sorted(dep.cb.tokens):
            key = f"{kind.name}-mixed-t{tokens}"
            entries.append(
                PlanEntry(key, kind.index, "mixed", tokens, mixed_description(key, kind, dep, tokens, pool), why)
            )
    return entries


def mixed_description(name: str, kind: LayerKind, dep: Deployment, tokens: int, pool: tuple[int, int]) -> Description:
    """A continuous-batching step (docs/variable-lengths.md, "Mixed steps"): the step's K/V appended
    into the pages (kv_append's packed form), then its packed queries over each sequence's pages.
    The caches are transformers' pool by strides, `pool` = (blocks, layers of the group): a block
    holds every layer's K page then V page, so the page stride is a whole block (each layer binds its
    own views; they share these strides)."""
    g = GraphBuilder(name)
    blocks, layers = pool
    d = kind.head_dim
    _step_rows(g, kind, tokens, fused=dep.qkv_layout == "fused")
    row = kind.kv_heads * d
    strides = [2 * layers * dep.page_size * row, row, d, 1]
    for cache in ("k_cache", "v_cache"):
        g.tensor(cache, dtype=dep.kv_cache_dtype, dims=[blocks, dep.page_size, kind.kv_heads, d], strides=strides)
    scales = _cache_scales(g, dep, kind.kv_heads)  # frostc's per KV head (transformers keeps none)
    lengths = _step_lengths(g, dep.cb.sequences(tokens), dep.max_pages)
    g.node(
        "kv_append", name="append", k="k_new", v="v_new", k_cache="k_cache", v_cache="v_cache", **lengths, **scales
    )  # fmt: skip
    g.sdpa(
        name="attn", q="q", k="k_cache", v="v_cache", o="o", causal=True, window_left=kind.window_left,
        softcap=kind.softcap, attn_scale=kind.scale, **lengths, **scales, **_sinks(g, kind),
    )  # fmt: skip
    return g.build()


def vllm_cache_strides(layout: str, page_size: int, kv_heads: int, head_dim: int) -> list[int]:
    """The (pages, page_size, hkv, d) strides of K's (or V's) view of one layer of vLLM's cache,
    whose logical shape is (blocks, hkv, page_size, 2d): K the first d of the last dim, V the
    second (V's view starts d elements in). nhd stores (blocks, page_size, hkv, 2d), hnd (blocks,
    hkv, page_size, 2d)."""
    block = page_size * kv_heads * 2 * head_dim
    if layout == "nhd":
        return [block, kv_heads * 2 * head_dim, 2 * head_dim, 1]
    return [block, 2 * head_dim, page_size * 2 * head_dim, 1]


def vllm_mixed_description(name: str, kind: LayerKind, dep: Deployment, tokens: int) -> Description:
    """A vLLM step (docs/serving.md, "vLLM"): this step's K/V written to the slots vLLM assigned
    (kv_append's slots form; −1, its padding, skipped), then the packed queries over each
    sequence's pages. The caches are the two halves of vLLM's per-layer cache by strides; the
    lengths and the page table are the metadata builder's copies of vLLM's (frost_vllm)."""
    g = GraphBuilder(name)
    vllm, d = dep.vllm, kind.head_dim
    _step_rows(g, kind, tokens)
    strides = vllm_cache_strides(vllm.layout, dep.page_size, kind.kv_heads, d)
    for cache in ("k_cache", "v_cache"):
        g.tensor(cache, dtype=dep.kv_cache_dtype, dims=[dep.pages, dep.page_size, kind.kv_heads, d], strides=strides)
    scales = _cache_scales(g, dep, 1 if vllm.kv_scales == "tensor" else kind.kv_heads)
    g.tensor("slot_mapping", dtype="int32", dims=[tokens])
    lengths = _step_lengths(g, vllm.sequences(tokens), dep.max_pages)
    g.node(
        "kv_append", name="append", k="k_new", v="v_new", k_cache="k_cache", v_cache="v_cache",
        slot_mapping="slot_mapping", **scales,
    )  # fmt: skip
    g.sdpa(
        name="attn", q="q", k="k_cache", v="v_cache", o="o", causal=True, window_left=kind.window_left,
        softcap=kind.softcap, attn_scale=kind.scale, **lengths, **scales, **_sinks(g, kind),
    )  # fmt: skip
    return g.build()


def _sinks(g: GraphBuilder, kind: LayerKind) -> dict[str, str]:
    """The kind's `sinks` tensor (float32, one logit per query head) and the sdpa key naming it;
    nothing for a model without sinks. Every layer of the kind binds its own."""
    if not kind.sinks:
        return {}
    return {"sinks": g.tensor("sinks", dtype=SINKS_DTYPE, dims=[kind.heads])}


def _cache_scales(g: GraphBuilder, dep: Deployment, grain: int) -> dict[str, str]:
    """A quantized cache's k_scale and v_scale (float32, `grain` each: 1 or the KV heads), and the
    node keys naming them; nothing for a cache in the model's dtype."""
    if not dep.quantized_cache:
        return {}
    return {name: g.tensor(name, dtype=SCALE_DTYPE, dims=[grain]) for name in ("k_scale", "v_scale")}


def _step_rows(g: GraphBuilder, kind: LayerKind, tokens: int, fused: bool = False) -> None:
    """A mixed step's packed rows: q, k_new, v_new and o, (tokens, heads, d) each; `fused`: q,
    k_new and v_new the views of one (tokens, hq + 2 hkv, d) QKV buffer that hf_fuse's layers
    make (each bound at its own first head), so that no step copies them into rows of their own."""
    row = (kind.heads + 2 * kind.kv_heads) * kind.head_dim  # one token's q, k and v, fused
    for tensor, heads in (("q", kind.heads), ("k_new", kind.kv_heads), ("v_new", kind.kv_heads), ("o", kind.heads)):
        strides = {"strides": [row, kind.head_dim, 1]} if fused and tensor != "o" else {}
        g.tensor(tensor, dtype=kind.dtype, dims=[tokens, heads, kind.head_dim], **strides)


def _step_lengths(g: GraphBuilder, sequences: int, max_pages: int) -> dict[str, str]:
    """A mixed step's page table, key lengths and query prefix sums; the sdpa keys naming them."""
    g.tensor("page_table", dtype="int32", dims=[sequences, max_pages])
    g.tensor("cache_len", dtype="int32", dims=[sequences])
    g.tensor("cu_q", dtype="int32", dims=[sequences + 1])
    return dict(page_table="page_table", seq_len_kv="cache_len", cu_seqlens_q="cu_q")


def prefill_description(name: str, kind: LayerKind, dep: Deployment, batch: int) -> Description:
    """Packed prompts: up to `batch` sequences, `max_prompt_tokens` tokens in all; queries and
    keys are the same tokens, so one cu_seqlens serves both."""
    g = GraphBuilder(name)
    # a sequence may also hold the next prompt's left padding as trailing rows (frost_runtime.hf
    # reads HF's left-padded batch in place so): up to 2 * max_cache_len - 1 tokens
    tokens, longest = dep.max_prompt_tokens, min(dep.max_prompt_tokens, 2 * dep.max_cache_len - 1)
    value_dim = kind.head_dim_v or kind.head_dim  # v's and o's
    rows = (("q", kind.heads, kind.head_dim), ("k", kind.kv_heads, kind.head_dim), ("v", kind.kv_heads, value_dim),
            ("o", kind.heads, value_dim))  # fmt: skip
    for tensor, heads, d in rows:
        g.tensor(tensor, dtype=kind.dtype, dims=[tokens, heads, d])
    g.tensor("cu_seqlens", dtype="int32", dims=[batch + 1])
    capacity = longest if longest < tokens else None
    g.sdpa(
        name="attn", q="q", k="k", v="v", o="o", cu_seqlens_q="cu_seqlens", cu_seqlens_kv="cu_seqlens",
        max_seqlen_q=capacity, max_seqlen_kv=capacity, causal=True, window_left=kind.window_left,
        softcap=kind.softcap, attn_scale=kind.scale, **_sinks(g, kind),
    )  # fmt: skip
    return g.build()


def context_description(name: str, kind: LayerKind, dep: Deployment, batch: int) -> Description:
    """An MLA step as transformers' model code runs it (DeepSeek-V2/V3): each sequence's new tokens
    (`new_tokens`) over its whole context, which the model expands from the cached latents into
    every head's K (q/k head dim) and V (v's) at each step. Packed: up to `batch` sequences of
    at most `max_cache_len` keys, the queries the last of each (bottom-right)."""
    g = GraphBuilder(name)
    value_dim = kind.head_dim_v or kind.head_dim  # v's and o's
    queries, keys = batch * dep.new_tokens, batch * dep.max_cache_len
    rows = (("q", queries, kind.heads, kind.head_dim), ("k", keys, kind.kv_heads, kind.head_dim),
            ("v", keys, kind.kv_heads, value_dim), ("o", queries, kind.heads, value_dim))  # fmt: skip
    for tensor, tokens, heads, d in rows:
        g.tensor(tensor, dtype=kind.dtype, dims=[tokens, heads, d])
    g.tensor("cu_seqlens_q", dtype="int32", dims=[batch + 1])
    g.tensor("cu_seqlens_kv", dtype="int32", dims=[batch + 1])
    g.sdpa(
        name="attn", q="q", k="k", v="v", o="o", cu_seqlens_q="cu_seqlens_q", cu_seqlens_kv="cu_seqlens_kv",
        max_seqlen_q=dep.new_tokens, max_seqlen_kv=dep.max_cache_len, causal=True,
        diagonal_alignment="bottom_right", window_left=kind.window_left, softcap=kind.softcap,
        attn_scale=kind.scale, **_sinks(g, kind),
    )  # fmt: skip
    return g.build()


def decode_description(name: str, kind: LayerKind, dep: Deployment, batch: int) -> Description:
    """A decode step over the paged cache: append each sequence's new K/V rows, then attend with
    its new tokens over its whole cache (README "Paged KV cache (decode)")."""
    g = GraphBuilder(name)
    rows = dict(dtype=kind.dtype, layout="bshd")
    new = _new_rows(kind, dep)
    g.tensor("q", dims=[batch, kind.heads, dep.new_tokens, kind.head_dim], **new)
    g.tensor("k_new", dims=[batch, kind.kv_heads, dep.new_tokens, kind.head_dim], **new)
    g.tensor("v_new", dims=[batch, kind.kv_heads, dep.new_tokens, kind.head_dim], **new)
    for cache in ("k_cache", "v_cache"):
        g.tensor(cache, dtype=dep.kv_cache_dtype, dims=[dep.pages, dep.page_size, kind.kv_heads, kind.head_dim])
    scales = _cache_scales(g, dep, kind.kv_heads)  # one per KV head of the layer
    g.tensor("page_table", dtype="int32", dims=[batch, dep.max_pages])
    g.tensor("cache_len", dtype="int32", dims=[batch])
    g.tensor("o", dims=[batch, kind.heads, dep.new_tokens, kind.head_dim], **rows)
    g.node(
        "kv_append", name="append", k="k_new", v="v_new", k_cache="k_cache", v_cache="v_cache",
        page_table="page_table", seq_len_kv="cache_len", **scales,
    )  # fmt: skip
    g.sdpa(
        name="attn", q="q", k="k_cache", v="v_cache", o="o", page_table="page_table", seq_len_kv="cache_len",
        causal=True, window_left=kind.window_left, softcap=kind.softcap, attn_scale=kind.scale, **scales,
        **_sinks(g, kind),
    )  # fmt: skip
    return g.build()


def _new_rows(kind: LayerKind, dep: Deployment) -> dict:
    """The tensor keys of decode's q, k_new and v_new: rows of their own (bshd), or, fused, the
    strides of one (b, s, hq + 2 hkv, d) buffer that all three are views of (each bound at its
    own first element: k at head hq, v at head hq + hkv)."""
    if dep.qkv_layout == "separate":
        return dict(dtype=kind.dtype, layout="bshd")
    row = (kind.heads + 2 * kind.kv_heads) * kind.head_dim  # one token's q, k and v
    return dict(dtype=kind.dtype, strides=[dep.new_tokens * row, kind.head_dim, row, 1])


@dataclass(frozen=True)
class GluePlan:
    """One of the decode step's plans around the attention, described but not built: a norm, a
    norm after the residual add, or the MLP's activation, for a decode bucket's rows."""

    key: str  # "glue-rms_norm-t32": the plan's name, and its key in the set
    op: str  # frost_runtime.planset.GLUE_OPS
    tokens: int  # rows: the bucket's sequences x new tokens per step
    description: Description


def glue_list(dep: Deployment, phases: tuple[str, ...] | None = None) -> tuple[GluePlan, ...]:
    """With --glue, each glue op for the rows of every decode bucket and, with continuous batching,
    of every token bucket (a step's padded rows): frost_runtime.hf_fuse launches them between a
    fused layer's GEMMs. `phases`: only those phases' rows (None: all). None without --glue."""
    if dep.glue is None:
        return ()
    rows: set[int] = set()
    if phases is None or "decode" in phases:
        rows |= {b * dep.new_tokens for b in dep.batch_sizes}
    if dep.cb is not None and (phases is None or "mixed" in phases):
        rows |= set(dep.cb.tokens)
    rows = sorted(rows)
    return tuple(
        GluePlan(f"glue-{op}-t{t}", op, t, _GLUE[op](f"glue-{op}-t{t}", dep, dep.glue, t)) for op in _GLUE for t in rows
    )


def _norm_description(name: str, dep: Deployment, layers: ModelLayers, tokens: int, residual: bool) -> Description:
    g = GraphBuilder(name)
    rows = dict(dtype=dep.dtype, dims=[tokens, layers.hidden_size])
    g.tensor("x", **rows)
    g.tensor("weight", dtype=dep.dtype, dims=[layers.hidden_size])
    g.tensor("out", **rows)
    added = {}
    if residual:
        g.tensor("residual", **rows)
        g.tensor("residual_out", **rows)
        added = dict(residual="residual", residual_out="residual_out")
    g.node("rms_norm", name="norm", x="x", weight="weight", out="out", eps=layers.eps, **added)
    return g.build()


def _silu_mul_description(name: str, dep: Deployment, layers: ModelLayers, tokens: int) -> Description:
    g = GraphBuilder(name)
    width = layers.intermediate_size // dep.tp  # one rank's MLP
    g.tensor("x", dtype=dep.dtype, dims=[tokens, 2 * width])
    g.tensor("out", dtype=dep.dtype, dims=[tokens, width])
    g.node("silu_mul", name="act", x="x", out="out")
    return g.build()


_GLUE = {
    "rms_norm": lambda name, dep, layers, t: _norm_description(name, dep, layers, t, residual=False),
    "add_rms_norm": lambda name, dep, layers, t: _norm_description(name, dep, layers, t, residual=True),
    "silu_mul": _silu_mul_description,
}


_DESCRIBE = {"prefill": prefill_description, "decode": decode_description, "context": context_description}


def check_entry(entry: PlanEntry) -> tuple[Problem, ...]:
    """What validating and resolving the entry's description finds (no compile); () when it would
    build. An unsupported entry is not checked: its reason stands."""
    from frostc.resolve import resolve
    from frostc.validate import validate

    if entry.unsupported:
        return ()
    try:
        resolve(validate(entry.description))
    except DescriptionError as e:
        return tuple(e.problems)
    return ()


def status(entry: PlanEntry) -> str:
    """ "ok" (validated and resolved: it would build), why it is not supported yet, or the first
    problem validating or resolving it found."""
    if entry.unsupported:
        return entry.unsupported
    problems = check_entry(entry)
    if not problems:
        return "ok"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"refused: {problems[0]}{more}"


def compact_layers(layers: tuple[int, ...]) -> str:
    """Layer indices in few characters: "0..31", "0,2,4..40", "3,7"."""
    out, i = [], 0
    while i < len(layers):
        j = i + 1  # the run with layers[i]'s step goes up to j - 1
        while j < len(layers) and (j == i + 1 or layers[j] - layers[j - 1] == layers[i + 1] - layers[i]):
            j += 1
        run = layers[i:j]
        if len(run) >= 3 and run[1] - run[0] == 1:
            out.append(f"{run[0]}..{run[-1]}")
        elif len(run) >= 4:
            out.append(f"{run[0]},{run[1]},{run[2]}..{run[-1]}")
        else:
            out.append(str(layers[i]))
            j = i + 1
        i = j
    return ",".join(out)


# ---------------------------------------------------------------------------------------------
# The text form: what `frostc from-config --dry-run` prints


def dry_run_summary(model: ModelAttention, dep: Deployment, kinds: tuple[LayerKind, ...]) -> dict:
    """The model, the deployment, the layer kinds and every plan with its status, as plain data
    (`--json`); deterministic: the same inputs give the same text."""
    entries = plan_list(kinds, dep)
    dtype_bytes = DTYPES[dep.kv_cache_dtype].bytes
    pool_bytes = 2 * dep.pages * dep.page_size * kinds[0].kv_heads * kinds[0].head_dim * dtype_bytes
    notes = [note for note in [dropped_windows(model, dep)] if note]
    return {
        "model": {
            "model_type": model.model_type,
            "layers": model.layers,
            "heads": model.heads,
            "kv_heads": model.kv_heads,
            "head_dim": model.head_dim,
            "dtype": model.dtype,
            "max_positions": model.max_positions,
            "scale": model.scale,
            "softcap": model.softcap,
            "sliding_window": model.sliding_window,
        },
        "deployment": {
            "dtype": dep.dtype,
            "kv_cache_dtype": dep.kv_cache_dtype,
            "tp": dep.tp,
            "batch_sizes": list(dep.batch_sizes),
            "max_prompt_tokens": dep.max_prompt_tokens,
            "max_cache_len": dep.max_cache_len,
            "page_size": dep.page_size,
            "max_pages": dep.max_pages,
            "pages": dep.pages,
            "speculative": dep.speculative,
            "new_tokens": dep.new_tokens,
            "qkv_layout": dep.qkv_layout,
            "kv_pool_bytes_per_layer": pool_bytes,  # K and V, one rank
            "continuous_batching": None
            if dep.cb is None
            else {
                "tokens": list(dep.cb.tokens),
                "requests": dep.cb.requests,
                "num_blocks": dep.cb.blocks,
                "pool_blocks": dict(dep.cb.pool_blocks),  # each layer group's view of transformers' pool
            },
            "vllm": None
            if dep.vllm is None
            else {
                "tokens": list(dep.vllm.tokens),
                "max_num_seqs": dep.vllm.max_num_seqs,
                "max_num_batched_tokens": dep.vllm.max_num_batched_tokens,
                "kv_layout": dep.vllm.layout,
                "kv_scales": dep.vllm.kv_scales if dep.quantized_cache else None,
            },
        },
        "kinds": [
            {
                "kind": k.name,
                "layers": list(k.layers),
                "heads": k.heads,
                "kv_heads": k.kv_heads,
                "head_dim": k.head_dim,
                "dtype": k.dtype,
                "window_left": k.window_left,
                "softcap": k.softcap,
                "scale": k.scale,
            }
            for k in kinds
        ],
        "plans": [
            {
                "key": e.key,
                "kind": kinds[e.kind].name,
                "phase": e.phase,
                "batch": e.batch,
                "form": e.form,
                "status": status(e),
            }
            for e in entries
        ],
        "glue": [{"key": g.key, "op": g.op, "tokens": g.tokens} for g in glue_list(dep)],
        "notes": notes,
    }


def print_dry_run(s: dict, console, source: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    m, d = s["model"], s["deployment"]
    window = f", sliding window {m['sliding_window']}" if m["sliding_window"] else ""
    softcap = f", softcap {m['softcap']}" if m["softcap"] else ""
    console.print(
        f"[bold]{escape(m['model_type'])}[/bold] ({escape(source)}): {m['layers']} layers, {m['heads']} heads, "
        f"{m['kv_heads']} KV heads, head dim {m['head_dim']}, {m['dtype'] or 'no dtype'}, "
        f"{m['max_positions']} positions, scale {m['scale']:.6g}{window}{softcap}",
        highlight=False,
    )
    per_rank = s["kinds"][0]
    gib = d["kv_pool_bytes_per_layer"] / 2**30
    cache = (
        f"  cache: {d['kv_cache_dtype']}, {d['max_cache_len']} tokens per sequence, pages of {d['page_size']} "
        f"({d['max_pages']} per sequence), pool of {d['pages']} pages: {gib:,.1f} GiB of K and V per layer per "
        f"rank, {gib * m['layers']:,.1f} GiB for {m['layers']} layers"
    )
    if d["vllm"] is not None:  # its steps are any mix: no prefill or decode buckets
        v = d["vllm"]
        scales = f", e4m3 scales per {v['kv_scales']}" if v["kv_scales"] else ""
        steps = (
            f"  vLLM steps: token buckets {_sizes_text(v['tokens'])}; start vLLM with --max-num-seqs "
            f"{v['max_num_seqs']} --max-num-batched-tokens {v['max_num_batched_tokens']} --max-model-len "
            f"{d['max_cache_len']} --block-size {d['page_size']} --num-gpu-blocks-override {d['pages']}, "
            f"VLLM_KV_CACHE_LAYOUT={v['kv_layout'].upper()}{scales}"
        )
    else:
        graphs = " (the CUDA-graph capture sizes)" if tuple(d["batch_sizes"]) == CUDA_GRAPH_BATCH_SIZES else ""
        steps = (
            f"  batch sizes {_sizes_text(d['batch_sizes'])}{graphs}; prefill: up to {d['max_prompt_tokens']} "
            f"tokens per step\n  decode: {d['new_tokens']} new {'token' if d['new_tokens'] == 1 else 'tokens'} per "
            f"sequence per step ({d['speculative']} speculative), q, k and v {_QKV_TEXT[d['qkv_layout']]}"
        )
    console.print(
        f"serving {d['dtype']}, tp {d['tp']}: {per_rank['heads']} heads and {per_rank['kv_heads']} KV heads per rank\n"
        f"{cache}\n{steps}",
        highlight=False,
    )
    for note in s["notes"]:
        console.print(f"note: {escape(note)}", highlight=False)
    kinds = Table(title="Layer kinds", title_justify="left")
    for column in ("kind", "layers", "heads", "kv heads", "head dim", "dtype", "window_left", "softcap", "scale"):
        kinds.add_column(column)
    for k in s["kinds"]:
        cells = (k["kind"], compact_layers(tuple(k["layers"])), k["heads"], k["kv_heads"], k["head_dim"], k["dtype"])
        extra = ("—" if k["window_left"] is None else k["window_left"], k["softcap"] or "—", f"{k['scale']:.6g}")
        kinds.add_row(*(str(c) for c in cells + extra))
    console.print(kinds)
    plans = Table(title="Plans", title_justify="left")
    for column in ("key", "kind", "phase", "batch", "form", "status"):
        plans.add_column(column)
    for p in s["plans"]:
        plans.add_row(*(escape(str(p[c])) for c in ("key", "kind", "phase", "batch", "form", "status")))
    console.print(plans)
    counts: dict[str, int] = {}
    for p in s["plans"]:
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    tally = "; ".join(f"{n} {escape(text)}" for text, n in counts.items())
    console.print(f"{len(s['plans'])} plans: {tally}", highlight=False)
    if s["glue"]:
        ops = ", ".join(dict.fromkeys(g["op"] for g in s["glue"]))
        rows = ", ".join(map(str, dict.fromkeys(g["tokens"] for g in s["glue"])))
        console.print(f"{len(s['glue'])} glue plans ({ops}) for decode steps of {rows} rows", highlight=False)


_QKV_TEXT = {"separate": "in rows of their own", "fused": "as views of one fused QKV buffer"}


def _sizes_text(sizes: list[int]) -> str:
    return (
        ", ".join(map(str, sizes))
        if len(sizes) <= 8
        else f"{', '.join(map(str, sizes[:4]))} … {sizes[-1]} ({len(sizes)})"
    )
