"""The backend (vLLM's backend seam): `FrostcAttention`, what transformers calls under
`attn_implementation="frostc"`. It registers the attention and mask functions, checks each call
against what the set supports (support.py), and routes it: to the set's plan for it (launches.py)
where there is one, else to the fp32 torch reference (reference.py), with one warning per reason and
counts of what served each call. The mask function's per-forward metadata comes from metadata.py,
the pools it owns from pools.py, its caches from cache.py.
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch

from frost_runtime import torch_ops
from frost_runtime.hf import launches, metadata, reference, support
from frost_runtime.hf.cache import cache_class
from frost_runtime.hf.metadata import FrostcMask
from frost_runtime.hf.pools import PoolPair, Pools, allocate
from frost_runtime.planset import KindInfo, PlanSet
from frost_runtime.sinks import LayerSinks

NAME = "frostc"


class FrostcAttention:
    """The backend: a plan set's plans loaded on demand, the KV pools, the attention and mask
    functions HF calls, and counts of what served each call."""

    def __init__(
        self, plans: PlanSet, *, device: torch.device | str | None = None, name: str = NAME, launch: bool = True
    ):
        """`launch=False`: every call takes the torch reference over the same pools and checks (a
        machine without a GPU can check that a model and its set agree, and what they compute)."""
        self.plans, self.name, self.launch = plans, name, launch
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        self.calls: Counter[str] = Counter()
        self._fresh: dict[int, tuple[torch.Tensor, int]] = {}  # layer -> this step's K, tokens seen before
        self._loaded: dict[str, str] = {}  # set key -> registry key
        self._pools: dict[int, PoolPair] = {}
        self._scales: dict[int, PoolPair] = {}  # a scaled cache's, per layer
        self._warned: set[str] = set()
        self._sinks = LayerSinks()
        self._kind_of_layer = support.kinds_by_layer(plans)
        # MLA kinds (DeepSeek): transformers' own cache holds the latents, and the model hands
        # attention the whole context expanded at each step; the set's context plans serve them
        self._latent_kinds = {e.kind for e in (*plans.entries, *plans.missing) if e.phase == "context"}
        serving = plans.serving
        self.max_pages, self.page_size = serving.max_pages, serving.page_size
        self.max_sequences = serving.pages // serving.max_pages  # sequences the pools hold at full length
        self.page_table = metadata.page_table(self.max_sequences, self.max_pages).to(self.device)

    # ------------------------------------------------------------------ setup
    def install(self, model=None) -> FrostcAttention:
        """Register the attention and mask functions under `self.name`; switch `model` to them."""
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(self.name, self.attention)
        AttentionMaskInterface.register(self.name, self.mask)
        if model is not None:
            support.check_model(self.plans, self._kind_of_layer, model)
            model.set_attn_implementation(self.name)
        return self

    def preload(self) -> int:
        """Load every plan of the set now (what a serving process does at start: no load inside
        the first request); returns how many are loaded."""
        for e in self.plans.entries:
            self._register(e.key)
        return len(self._loaded)

    def new_cache(self, layers: int | None = None):
        """A cache for one generation (or one batch of steps); its K/V live in this backend's pools.
        A set of MLA kinds only: transformers' own `DynamicCache` (it holds the latents, which the
        model expands for every call; the plans read that expansion in place of pools)."""
        if self._latent_kinds and self._latent_kinds >= set(self.plans.kinds):
            from transformers import DynamicCache

            return DynamicCache()
        n = layers if layers is not None else 1 + max(self._kind_of_layer)
        return cache_class()(self, n)

    def hand_over(self, layer: int, key: torch.Tensor, past: int) -> None:
        """The cache's update: `layer`'s K of this step (the attention takes the call as frostc's only
        when it is handed this very tensor) and the tokens the layer held before it."""
        self._fresh[layer] = (key, past)

    # ------------------------------------------------------------------ the mask function
    def mask(
        self,
        batch_size: int,
        q_length: int,
        kv_length: int,
        q_offset=0,
        kv_offset: int = 0,
        mask_function=None,
        attention_mask=None,
        **kwargs,
    ) -> FrostcMask:
        """Each row's first valid column and count, from the 2-D padding mask, on the device."""
        hf_arguments = dict(
            kwargs,
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function,
            attention_mask=attention_mask,
        )
        device = kwargs.get("device") or self.device
        return metadata.build_rows(attention_mask, batch_size, kv_length, device, hf_arguments)

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
        """HF's call: query (b, hq, s, d), key/value (b, hkv, s_kv, d); returns ((b, s, hq, d), None)."""
        layer = module.layer_idx
        fresh = self._fresh.pop(layer, None)
        rows = attention_mask if isinstance(attention_mask, FrostcMask) else None
        if dropout and module.training:
            raise ValueError("frostc serves inference: dropout must be 0 (model.eval())")
        info = self._kind_of_layer.get(layer)
        s_aux = kwargs.get("s_aux")  # gpt-oss's sinks (GptOssAttention passes its parameter so)
        if rows is not None and fresh is None and info is not None and info.kind in self._latent_kinds:
            support.check_call(self.plans, info, query, key, scaling, sliding_window, softcap, s_aux)
            return self._context(info, rows, query, key, value, self._sinks.of(layer, s_aux)), None
        if rows is None or fresh is None or fresh[0] is not key:
            why = "the mask was not made by frostc" if rows is None else "the cache is not frostc's (new_cache())"
            self._fallback(why)
            return reference.other_cache(query, key, value, attention_mask, scaling, softcap, s_aux), None
        if info is None:
            raise ValueError(f"plan set {self.plans.header.name!r} serves no layer {layer}")
        past = fresh[1]
        support.check_call(self.plans, info, query, key, scaling, sliding_window, softcap, s_aux)
        b, _, s, _ = query.shape
        support.check_capacity(self.plans, self.max_sequences, b, past + s)
        pools = self._layer_pools(layer, info, key)
        sinks = self._sinks.of(layer, s_aux)
        if past == 0:
            return self._prefill(info, rows, query, key, value, pools, sinks), None
        return self._decode(info, rows, query, key, value, pools, sinks), None

    def _prefill(self, info: KindInfo, rows: FrostcMask, query, key, value, pools: Pools, sinks):
        """A fresh cache: the prompts' K/V into the pools (a scaled cache's scales from them first),
        then the set's packed plan for the batch, or the reference."""
        b, _, s, _ = query.shape
        if rows.width != s:
            raise ValueError(f"prefill: the 2-D attention mask has {rows.width} columns, the prompt {s} tokens")
        slots = metadata.prefill_slots(rows, s, serving=self.plans.serving)
        pools.set_scales(key, value)  # a new generation: its scales from its prompts' K and V
        pools.append(key, value, slots)
        key_plan, why = self._select("prefill", info, b)
        if key_plan is not None and b * s > self.plans.serving.max_prompt_tokens:
            key_plan, why = None, f"{b} x {s} prompt tokens are over the set's --max-prompt-tokens"
        if key_plan is None:
            self._fallback(why)
            return reference.prefill(info, rows, query, key, value, sinks)
        out = launches.prefill(key_plan, rows, query, key, value, sinks)
        self._count("prefill")
        return out

    def _decode(self, info: KindInfo, rows: FrostcMask, query, key, value, pools: Pools, sinks):
        """A step's new tokens: the set's paged plan for the batch (it appends them itself), or their
        K/V appended here and the reference."""
        b, _, s, _ = query.shape
        serving = self.plans.serving
        key_plan, why = self._select("decode", info, b)
        if key_plan is not None and s != serving.new_tokens:
            key_plan, why = None, f"{s} new tokens per sequence, the set's decode plans take {serving.new_tokens}"
        if key_plan is None:
            pools.append(key, value, metadata.decode_slots(rows, s, serving))
            self._fallback(why)
            return reference.decode(info, rows, query, pools, serving, sinks)
        out = launches.decode(key_plan, rows, query, key, value, pools, self.page_table, serving.pages, sinks)
        self._count("decode")
        return out

    def _context(self, info: KindInfo, rows: FrostcMask, query, key, value, sinks):
        """An MLA layer's call (DeepSeek): key and value are the whole context, which transformers
        expands from its cache's latents at each step. A prompt (queries as many as keys) takes
        the set's packed prefill plan, later steps its context plan (the new tokens over the
        context, bottom-right); a call neither covers, the reference with HF's mask."""
        b, _, s, _ = query.shape
        context, serving = key.shape[2], self.plans.serving
        if rows.width != context:
            raise ValueError(f"the 2-D attention mask has {rows.width} columns, the context {context} tokens")
        if context > serving.max_cache_len:
            raise ValueError(
                f"{context} tokens per sequence: over the plan set's context of {serving.max_cache_len} "
                "(--max-cache-len); stop generating earlier or build the set with a longer cache"
            )
        phase = "prefill" if s == context else "context"
        key_plan, why = self._select(phase, info, b)
        if key_plan is not None and phase == "prefill" and b * s > serving.max_prompt_tokens:
            key_plan, why = None, f"{b} x {s} prompt tokens are over the set's --max-prompt-tokens"
        if key_plan is not None and phase == "context" and s > serving.new_tokens:
            key_plan, why = None, f"{s} new tokens per sequence, the set's context plans take {serving.new_tokens}"
        if key_plan is None:
            self._fallback(why)
            return reference.other_cache(query, key, value, rows, info.scale, info.softcap, sinks)
        run = launches.prefill if phase == "prefill" else launches.context
        out = run(key_plan, rows, query, key, value, sinks)
        self._count(phase)
        return out

    # ------------------------------------------------------------------ plans and pools
    def _select(self, phase: str, info: KindInfo, batch: int) -> tuple[str | None, str]:
        """The registry key of the plan serving (phase, kind, batch), loaded on first use, or
        None and why not."""
        if not self.launch:
            return None, "launch=False"
        try:
            set_key = self.plans.select(phase, info.kind, batch)
        except (KeyError, ValueError) as exc:
            return None, str(exc).strip("'\"")
        return self._register(set_key), ""

    def _register(self, set_key: str) -> str:
        """The registry key of a set's plan, loading and registering it the first time."""
        key = self._loaded.get(set_key)
        if key is None:
            key = f"{self.plans.sha256[:16]}/{set_key}"
            if key not in torch_ops._registry:
                with torch.cuda.device(self.device):
                    torch_ops.register(key, self.plans.load(set_key))
            self._loaded[set_key] = key
        return key

    def _layer_pools(self, layer: int, info: KindInfo, like: torch.Tensor) -> Pools:
        """The layer's pools and a scaled cache's scales, allocated at the layer's first call (the
        per-call path is the lookup)."""
        if layer not in self._pools:
            self._pools[layer], scales = allocate(self.plans.serving, info, like)
            if scales is not None:
                self._scales[layer] = scales
        return Pools(*self._pools[layer], self._scales.get(layer))

    # ------------------------------------------------------------------ counts and warnings
    def _count(self, *what: str) -> None:
        """Count a call in `calls`, unless torch.compile is tracing it: a count would be a Python
        int dynamo reads, bakes into the graph and guards on (a recompile at every step)."""
        if torch.compiler.is_compiling():
            return
        for key in what:
            self.calls[key] += 1

    def _fallback(self, why: str) -> None:
        """Count a call the reference serves; warn once per reason when plans were wanted."""
        if not self.launch:
            self._count("reference")
            return
        self._count("fallback", f"fallback: {why}")
        if why not in self._warned:
            self._warned.add(why)
            # stacklevel 3: attention() for a call the set has no plan for, HF's caller for another cache
            warnings.warn(f"frostc: computing attention in torch (fp32 reference), not a plan: {why}", stacklevel=3)


def install(plans: PlanSet, model=None, *, device=None, name: str = NAME, launch: bool = True) -> FrostcAttention:
    """A backend over `plans`, registered with transformers under `name`; `model` switched to it."""
    return FrostcAttention(plans, device=device, name=name, launch=launch).install(model)
