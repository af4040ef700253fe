"""Continuous batching in transformers (`model.generate_batch`, `ContinuousBatchingManager`) with
frostc's mixed form as the attention.

    from frost_runtime.hf import continuous
    cb = continuous.install(model)                    # registers "frostc_cb", switches the model
    cb = continuous.install(model, plans)             # or: a plan set's mixed plans (GPU)
    out = model.generate_batch(prompts, generation_config=gen,
                               continuous_batching_config=ContinuousBatchingConfig(page_size=16))
    cb.calls                                          # Counter: mixed / decode steps per executor

Every step of transformers' loop is one ragged mix over its paged pool; each attention call is
served here as one mixed step (docs/variable-lengths.md, "Mixed steps"):
- the pool is read in place: each layer's K and V caches are strided views of transformers' own
  pool (cb_cache.py); transformers' `cache.update`, which gathers every sequence's whole context
  through `read_index` before attention, is never called;
- the step's `cu_seqlens_q`, `seq_len_kv` and `page_table` come from transformers' own tensors on
  the device, once per forward and layer group (cb_step.py): no host read;
- an executor computes the attention and writes the step's K/V into the pages: the fp32 torch
  reference (cb_reference.py, `ReferenceExecutor`: any machine) or compiled mixed plans
  (cb_plans.py, `PlanExecutor`: a GPU and a plan set);
- all-decode steps (transformers' block-table fast path is FlashAttention 2/3's only) go through
  the same mixed form, as do chunked prefills and mixes of both.
transformers accepts the name as a mask-free attention through cb_patches.py (why a patch and not
a "flash" name: there). `calls` counts what served every call.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import torch

from frost_runtime import dtypes
from frost_runtime.hf import cb_cache, cb_patches, cb_reference, cb_step, pools
from frost_runtime.hf.cb_cache import GroupGeometry
from frost_runtime.hf.cb_step import Step
from frost_runtime.sinks import LayerSinks

NAME = "frostc_cb"


@dataclass
class LayerCall:
    """One layer's attention in one step, as an executor gets it."""

    layer: int
    geo: GroupGeometry
    step: Step
    q: torch.Tensor  # (rows, hq, d), a view of transformers' query
    k: torch.Tensor  # (rows, hkv, d): the step's new rows, packed like q
    v: torch.Tensor
    k_pages: torch.Tensor  # (blocks, page_size, hkv, d): views of the pool
    v_pages: torch.Tensor
    k_rows: torch.Tensor  # the token-row views transformers' write_index addresses
    v_rows: torch.Tensor
    write_index: torch.Tensor  # transformers' own: where the step's rows go (padding to the trash)
    scale: float
    window_left: int | None
    softcap: float | None
    k_scale: torch.Tensor | None = None  # an e4m3 pool's (hkv,) float32 scales (frostc's); None: unscaled
    v_scale: torch.Tensor | None = None
    sinks: torch.Tensor | None = None  # the layer's attention sinks, (hq,) float32 (gpt-oss's s_aux); None: none

    def write(self) -> None:
        """The step's K/V into the pages where transformers' write_index says (as its `update`
        would), quantized with the layer's scales into an e4m3 pool."""
        for rows, x, scale in ((self.k_rows, self.k, self.k_scale), (self.v_rows, self.v, self.v_scale)):
            if scale is not None:  # float8 has few ops: copy its bytes
                rows, x = rows.view(torch.uint8), pools.quantize(x, scale).view(torch.uint8)
            rows.index_copy_(0, self.write_index, x)

    @property
    def wraps_ring(self) -> bool:
        """Whether a chunk of this step writes over ring slots its own earlier queries still read:
        a sliding group, a sequence with n >= 2 queries and past + n > window. That is exactly
        transformers' host-side max_length_k (n + min(past, window - 1) per sequence) over the
        window; under CUDA graphs transformers pads it, and the answer errs towards yes."""
        if self.geo.window is None or self.step.all_decode:
            return False
        return self.step.max_seqlen_k is None or self.step.max_seqlen_k > self.geo.window


class Executor(Protocol):
    name: str

    def __call__(self, call: LayerCall) -> tuple[torch.Tensor, str]:
        """(rows, hq, d) output, having written the step's K/V; and what served it (a `calls` key)."""
        ...


class ReferenceExecutor:
    """fp32 torch over the pages in place (cb_reference.py); writes with transformers' write_index."""

    name = "reference"

    def __call__(self, call: LayerCall) -> tuple[torch.Tensor, str]:
        out = cb_reference.attend(
            call.step, call.q, call.k, call.v, call.k_pages, call.v_pages, call.scale, call.window_left, call.softcap,
            kv_scales=None if call.k_scale is None else (call.k_scale, call.v_scale), sinks=call.sinks,
        )  # fmt: skip
        call.write()
        return out, "reference"


@dataclass
class _Pool:
    """What frostc keeps of one cache allocator (a layer group of one cache): none of it refers
    back to the allocator, so the pool dies with transformers' cache."""

    geometry: GroupGeometry
    views: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)  # layer -> page and row views
    scales: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # an e4m3 pool's, by layer


class ContinuousAttention:
    """The attention transformers' continuous batching calls under `NAME`; `calls` counts what
    served each call (outside torch.compile)."""

    def __init__(
        self,
        executor: Executor | None = None,
        *,
        name: str = NAME,
        max_pages: int | None = None,
        kv_cache_dtype: str | None = None,
    ):
        """`max_pages`: the page tables' width (pages per sequence); default: the model's
        `max_position_embeddings` in pages, or the plans' (PlanExecutor.max_pages).
        `kv_cache_dtype`: "e4m3" for an e4m3 pool (with frostc's per-head scales); None: the
        model's dtype (the pool transformers allocates)."""
        if kv_cache_dtype is not None and not (
            kv_cache_dtype in dtypes.DTYPES and dtypes.DTYPES[kv_cache_dtype].quantized
        ):
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r}: give 'e4m3', or leave it out (the model's dtype)")
        self.executor = executor if executor is not None else ReferenceExecutor()
        self.name = name
        self.kv_cache_dtype = kv_cache_dtype
        self.max_pages = max_pages or getattr(self.executor, "max_pages", None)
        self.calls: Counter[str] = Counter()
        # allocator -> its layout and its layers' views, held weakly: a finished generate_batch's
        # cache (its pool) must be freed before the next one sizes its own from free memory
        self._pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._steps: dict[int, tuple[torch.Tensor, bool, Step]] = {}  # allocator index -> (cu_q, capturing, step)
        self._sinks = LayerSinks()

    def install(self, model=None) -> ContinuousAttention:
        """Register under `self.name` (mask-free for continuous batching); switch `model` to it."""
        from transformers import AttentionInterface

        AttentionInterface.register(self.name, self.attention)
        cb_patches.allow(self.name)
        pool = None if self.kv_cache_dtype is None else dtypes.torch_dtype(self.kv_cache_dtype)
        cb_patches.pool_dtype(self.name, pool)  # the name's pools in e4m3, or back to the model's dtype
        if model is not None:
            model.set_attn_implementation(self.name)
        return self

    # ------------------------------------------------------------------ the attention function
    def attention(
        self,
        module,
        query,
        key,
        value,
        attention_mask,
        dropout: float = 0.0,
        scaling=None,
        sliding_window=None,
        softcap=None,
        **kwargs,
    ):
        """transformers' call: query (1, hq, rows, d), key/value (1, hkv, rows, d) (the step's
        packed tokens); returns ((1, rows, hq, d), None)."""
        cache = kwargs.get("cache")
        if cache is None or "read_index" not in kwargs:
            raise ValueError(
                f"attn_implementation {self.name!r} serves transformers' continuous batching only "
                "(generate_batch, ContinuousBatchingManager); for generate() use frost_runtime.hf.install "
                "(attn_implementation 'frostc')"
            )
        if dropout and module.training:
            raise ValueError("frostc serves inference: dropout must be 0 (model.eval())")
        if kwargs.get("block_table") is not None:
            raise ValueError("block_table: transformers' decode fast path is FlashAttention's; frostc keeps it off")
        call = self._layer_call(module, query, key, value, cache, kwargs, scaling, sliding_window, softcap)
        out, served = self.executor(call)
        self._count(("decode" if call.step.all_decode else "mixed") + f" via {served}")
        return out.unsqueeze(0), None

    def _layer_call(self, module, query, key, value, cache, kwargs, scaling, sliding_window, softcap) -> LayerCall:
        layer = module.layer_idx
        allocator = cache.layer_to_allocator[layer]
        geo = self._layout(allocator)
        if sliding_window != geo.window:
            raise ValueError(
                f"layer {layer}: the model passes sliding_window={sliding_window}, transformers' cache group "
                f"{geo.layer_type!r} holds a window of {geo.window}: the config's layer_types and "
                "sliding_window disagree"
            )
        rows, d = query.shape[2], query.shape[3]
        step = self._step(kwargs, geo, module, rows)
        k_pages, v_pages, k_rows, v_rows = self._views(allocator, geo, layer)
        k_scale, v_scale = self._scales(allocator, layer, k_pages.dtype, key, value)
        return LayerCall(
            layer=layer,
            geo=geo,
            step=step,
            q=query[0].transpose(0, 1),
            k=key[0].transpose(0, 1),
            v=value[0].transpose(0, 1),
            k_pages=k_pages,
            v_pages=v_pages,
            k_rows=k_rows,
            v_rows=v_rows,
            write_index=kwargs["write_index"][geo.index],
            scale=scaling if scaling is not None else 1 / math.sqrt(d),
            window_left=None if sliding_window is None else sliding_window - 1,  # HF's window counts the query
            softcap=softcap or None,
            k_scale=k_scale,
            v_scale=v_scale,
            sinks=self._sinks.of(layer, kwargs.get("s_aux")),  # gpt-oss passes its parameter so
        )

    def _scales(self, allocator, layer: int, pool_dtype, key, value) -> tuple[torch.Tensor | None, ...]:
        """An e4m3 pool's scales of the layer, (hkv,) float32 each: set on the device from the K/V
        of the layer's first step (pools.head_scales: amax / 448 with twice the headroom), then
        fixed for the pool's life (pages written with them are never rescaled). (None, None) for a
        pool in the model's dtype."""
        if pool_dtype != torch.float8_e4m3fn:
            return None, None
        scales = self._pool(allocator).scales
        if layer not in scales:
            if _capturing(key):
                raise ValueError(
                    f"layer {layer}: an e4m3 pool's scales are set by its first step, which must run eagerly; "
                    "transformers warms every graph up eagerly first: capture after a warm-up step"
                )
            scales[layer] = (pools.head_scales(key[0], head_dim=0), pools.head_scales(value[0], head_dim=0))
        return scales[layer]

    def _pool(self, allocator) -> _Pool:
        pool = self._pools.get(allocator)
        if pool is None:
            pool = self._pools[allocator] = _Pool(cb_cache.geometry(allocator))
        return pool

    def _layout(self, allocator) -> GroupGeometry:
        """The allocator's layout, worked out at its first call (a new cache: a new allocator)."""
        return self._pool(allocator).geometry

    def _views(self, allocator, geo: GroupGeometry, layer: int) -> tuple[torch.Tensor, ...]:
        """The layer's page and row views of the pool, made at its first call (the pool is the
        cache's for its life: a new cache, a new allocator)."""
        views = self._pool(allocator).views
        if layer not in views:
            views[layer] = cb_cache.layer_pages(allocator, geo, layer) + cb_cache.layer_rows(allocator, geo, layer)
        return views[layer]

    def _step(self, kwargs: dict, geo: GroupGeometry, module, rows: int) -> Step:
        """The step's metadata for the group: built by its first layer of the forward, then shared
        (the forward's `cu_seq_lens_q` is one tensor object for every layer; a new step has another).
        Never shared across a graph capture's edge: transformers runs a forward eagerly and then
        captures the same one, with the same kwargs; a step built by the eager one would leave the
        metadata out of the graph, and every replay would read the warm-up step's page tables."""
        cu_q = kwargs["cu_seq_lens_q"]
        capturing = _capturing(cu_q)
        known = self._steps.get(geo.index)
        if known is not None and known[0] is cu_q and known[1] == capturing:
            return known[2]
        step = cb_step.build(kwargs, geo, self._max_pages(module, geo), rows)
        self._steps[geo.index] = (cu_q, capturing, step)
        return step

    def _max_pages(self, module, geo: GroupGeometry) -> int:
        if self.max_pages is not None:
            return self.max_pages
        longest = getattr(module.config, "max_position_embeddings", None)
        if longest is None:
            raise ValueError("max_pages: the model's config has no max_position_embeddings; pass max_pages=")
        return -(-longest // geo.page_size)

    def _count(self, key: str) -> None:
        if not torch.compiler.is_compiling():  # a count under dynamo would be baked into the graph
            self.calls[key] += 1


def _capturing(t: torch.Tensor) -> bool:
    """Whether the current stream of `t`'s device is capturing a CUDA graph."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def install(
    model=None,
    plans=None,
    *,
    executor: Executor | None = None,
    name: str = NAME,
    max_pages: int | None = None,
    kv_cache_dtype: str | None = None,
) -> ContinuousAttention:
    """A `ContinuousAttention` registered with transformers under `name`; `model` switched to it.
    With `plans` (a plan set with mixed plans: `frostc from-config --cb-tokens`), the steps run its
    plans on the GPU (cb_plans.PlanExecutor); without, the fp32 torch reference. The pool holds the
    set's cache dtype (`kv_cache_dtype` without a set: "e4m3" or the model's, None); an e4m3 pool is
    allocated so by transformers through cb_patches.pool_dtype."""
    if plans is not None:
        if kv_cache_dtype is not None:
            raise ValueError("kv_cache_dtype: the plan set's pool dtype decides; leave it out")
        kv_cache_dtype = pool_dtype(plans)
        if executor is None:
            from frost_runtime.hf.cb_plans import PlanExecutor

            executor = PlanExecutor(plans)
    attention = ContinuousAttention(executor, name=name, max_pages=max_pages, kv_cache_dtype=kv_cache_dtype)
    return attention.install(model)


def pool_dtype(plans) -> str | None:
    """A plan set's pool dtype for `ContinuousAttention(kv_cache_dtype=)`: "e4m3", or None (the
    model's)."""
    kv = plans.serving.kv_cache_dtype
    return kv if dtypes.DTYPES[kv].quantized else None
