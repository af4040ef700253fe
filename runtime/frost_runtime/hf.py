"""A Hugging Face transformers attention backend: `attn_implementation="frostc"`, served by a plan set.

    plans = frost_runtime.read_set("llama.frostset")             # frostc from-config config.json -o ...
    backend = frost_runtime.hf.install(plans, model)             # registers "frostc", switches the model
    out = model.generate(**inputs, past_key_values=backend.new_cache(), max_new_tokens=64)

The design (README, "Serving a Hugging Face model"):
- **The cache is frostc's.** `FrostcCache` stores nothing itself: its `update` hands this step's
  K/V straight to the attention, which appends them to paged pools, one pair per layer, that the
  backend owns (allocated at first use from the set's deployment). Sequence b owns pages
  [b * max_pages, (b + 1) * max_pages) and its tokens sit there compacted from position 0: left
  padding never reaches the cache, so the plans need no start offsets.
- **Lengths never leave the device.** The mask function (registered with the attention, so a
  masked batch is never silently unmasked) turns the 2-D padding mask into each row's first
  valid column and count on the device, once per forward. Prefill packs each prompt's valid
  tokens into the packed plan's buffers with device-computed indices and scatters the result
  back (pad rows get 0); decode appends with `cache_len` = the row's count. Nothing reads the
  device from the host, so a decode step can be captured in a CUDA graph (`DecodeGraph`).
- **Plans where they cover the call, torch otherwise.** Prefill of a fresh cache (`b * s` within the
  set's prompt tokens) goes through the set's packed plan, decode (1 + speculative new tokens)
  through its paged plan (kv_append + attention), windows and softcap included. A call the set
  does not cover (a batch over the largest bucket, another step size, a set lacking the plan,
  another cache) is computed by an fp32 torch reference over the same pools, with one warning per
  reason: never a wrong answer. `backend.calls` counts both (calls outside torch.compile).
- A row's valid tokens must be one run (left or right padding, as tokenizers make them); a row
  that is not gets NaN outputs (checked on the device, never read back), not a wrong answer.
- **An FP8 cache** (a set built with `--kv-cache-dtype e4m3`): the pools hold e4m3, with one
  float32 scale per KV head and layer. Each prefill (a generation's start) sets its layer's scales
  on the device from its own K and V: amax / 448 times KV_SCALE_HEADROOM, room for later tokens
  twice as large (e4m3 is floating point: the headroom costs range at the small end, not
  precision). Its rows are quantized into the pools; decode's kv_append quantizes the new rows
  with the same scales, and the attention reads the pools through them.
"""

from __future__ import annotations

import functools
import math
import types
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

from frost_runtime import dtypes, torch_ops
from frost_runtime.planset import KindInfo, PlanSet

NAME = "frostc"
KV_SCALE_HEADROOM = 2.0  # a scaled cache's scale: amax of the prefill's K (or V) per head / 448, times this


@dataclass
class FrostcMask:
    """What the mask function hands every layer of one forward: per row of the batch, the first
    valid column of the 2-D padding mask and the count of valid columns (device tensors), whether
    the row's valid columns are one run, and HF's own mask arguments (a fallback over another
    cache builds HF's mask from them)."""

    first: torch.Tensor  # (b,) int64
    count: torch.Tensor  # (b,) int32: tokens of the sequence, this step's included
    broken: torch.Tensor  # (b,) bool: the valid columns are not one run
    width: int  # the 2-D mask's columns
    hf_arguments: dict
    derived: dict = field(default_factory=dict)  # per-forward index tensors, computed by the first layer

    def positions(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, s): each column's position in its sequence, and whether it holds one of the
        sequence's tokens; computed once per forward (every layer's prefill uses them)."""
        if ("positions", s) not in self.derived:
            t = torch.arange(s, device=self.first.device)
            position = t[None, :] - self.first[:, None]
            valid = (position >= 0) & (position < self.count[:, None])
            self.derived[("positions", s)] = (position, valid)
        return self.derived[("positions", s)]

    @property
    def shape(self) -> tuple[int, ...]:  # HF code may log a mask's shape
        return (len(self.first), self.width)


@functools.cache
def _cache_class():
    """FrostcCache, defined on first use (transformers is imported only then), once: every cache
    is of one class (torch.compile guards on a cache's type; a class per cache would fail the
    guard at every new cache, and each dead class would leave its compiled entries behind)."""
    from transformers.cache_utils import Cache, CacheLayerMixin

    class FrostcLayer(CacheLayerMixin):
        """Counts the tokens a layer has seen (host ints, known to every serving engine); holds no K/V."""

        is_sliding = False
        is_compileable = False
        is_croppable = False

        def __init__(self, backend: FrostcAttention, layer: int, max_cache_len: int):
            super().__init__()
            self.backend, self.layer, self.max_cache_len, self.seen = backend, layer, max_cache_len, 0

        def lazy_initialization(self, key_states, value_states) -> None:
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            past = self.seen
            self.seen += key_states.shape[-2]
            self.backend._fresh[self.layer] = (key_states, past)
            self.is_initialized = True
            return key_states, value_states

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.seen + query_length, 0

        def get_seq_length(self) -> int:
            return self.seen

        def get_max_length(self) -> int:
            return self.max_cache_len

        def reset(self) -> None:
            self.seen = 0

        def reorder_cache(self, beam_idx) -> None:
            raise NotImplementedError("frostc's cache does not reorder (beam search): use num_beams=1")

    class FrostcCache(Cache):
        """A cache whose K/V live in the backend's paged pools (see the module's docstring)."""

        def __init__(self, backend: FrostcAttention, layers: int):
            cap = backend.plans.serving.max_cache_len
            super().__init__(layers=[FrostcLayer(backend, i, cap) for i in range(layers)])

    return FrostcCache


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
        self._fresh: dict[int, tuple[torch.Tensor, int]] = {}
        self._loaded: dict[str, str] = {}  # set key -> registry key
        self._pools: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._scales: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # a scaled cache's, per layer
        self._warned: set[str] = set()
        self._kind_of_layer = {layer: info for info in plans.kind_info.values() for layer in info.layers}
        serving = plans.serving
        self.max_pages, self.page_size = serving.max_pages, serving.page_size
        self.max_sequences = serving.pages // serving.max_pages  # sequences the pools hold at full length
        rows = torch.arange(self.max_sequences, dtype=torch.int32)[:, None] * self.max_pages
        self.page_table = (rows + torch.arange(self.max_pages, dtype=torch.int32)).to(self.device)

    # ------------------------------------------------------------------ setup
    def install(self, model=None) -> FrostcAttention:
        """Register the attention and mask functions under `self.name`; switch `model` to them."""
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(self.name, self.attention)
        AttentionMaskInterface.register(self.name, self.mask)
        if model is not None:
            self._check_model(model)
            model.set_attn_implementation(self.name)
        return self

    def preload(self) -> int:
        """Load every plan of the set now (what a serving process does at start: no load inside
        the first request); returns how many are loaded."""
        for e in self.plans.entries:
            self._register(e.key)
        return len(self._loaded)

    def new_cache(self, layers: int | None = None):
        """A cache for one generation (or one batch of steps); its K/V live in this backend's pools."""
        n = layers if layers is not None else 1 + max(self._kind_of_layer)
        return _cache_class()(self, n)

    def _check_model(self, model) -> None:
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        layers = getattr(config, "num_hidden_layers", None)
        if layers is not None and set(range(layers)) != set(self._kind_of_layer):
            raise ValueError(
                f"plan set {self.plans.header.name!r} serves layers {sorted(self._kind_of_layer)}, the "
                f"model has {layers}: build the set from this model's config"
            )

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
        if attention_mask is None:
            first = torch.zeros(batch_size, dtype=torch.int64, device=device)
            count = torch.full((batch_size,), kv_length, dtype=torch.int32, device=device)
            broken = torch.zeros(batch_size, dtype=torch.bool, device=device)
            return FrostcMask(first, count, broken, kv_length, hf_arguments)
        m = attention_mask.to(torch.bool)
        count = m.sum(-1, dtype=torch.int32)
        first = m.to(torch.int8).argmax(-1)
        starts = m[:, :1].to(torch.int32).sum(-1) + (m[:, 1:] & ~m[:, :-1]).sum(-1, dtype=torch.int32)
        return FrostcMask(first, count, starts > 1, m.shape[-1], hf_arguments)

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
        if rows is None or fresh is None or fresh[0] is not key:
            why = "the mask was not made by frostc" if rows is None else "the cache is not frostc's (new_cache())"
            return self._other_cache(query, key, value, attention_mask, scaling, softcap, why), None
        info = self._kind_of_layer.get(layer)
        if info is None:
            raise ValueError(f"plan set {self.plans.header.name!r} serves no layer {layer}")
        past = fresh[1]
        self._check_call(info, query, key, scaling, sliding_window, softcap)
        b, _, s, _ = query.shape
        self._check_capacity(b, past + s)
        pools = self._pool(layer, info, key)
        if past == 0:
            return self._prefill(info, rows, query, key, value, pools), None
        return self._decode(info, rows, query, key, value, pools), None

    def _check_call(self, info: KindInfo, query, key, scaling, sliding_window, softcap) -> None:
        """A call whose attention is not the kind's would be a wrong answer: refused, naming it."""
        _, hq, _, d = query.shape
        scale = scaling if scaling is not None else 1 / math.sqrt(d)
        window = None if sliding_window is None else sliding_window - 1  # HF's window counts the query's key
        if window is not None and info.window_left is None and window >= self.plans.serving.max_cache_len - 1:
            window = None  # as long as the cache: masks nothing (the set dropped it)
        problems = [
            f"{what}: the model passes {got}, the set was built for {want}"
            for what, got, want in (
                ("heads", hq, info.heads),
                ("KV heads", key.shape[1], info.kv_heads),
                ("head dim", d, info.head_dim),
                ("dtype", dtypes.from_torch(query.dtype) or str(query.dtype), info.dtype),
                ("window_left", window, info.window_left),
                ("softcap", softcap or None, info.softcap),
            )
            if got != want
        ]
        if not math.isclose(scale, info.scale, rel_tol=1e-6):
            problems.append(f"scale: the model passes {scale:.8g}, the set was built for {info.scale:.8g}")
        if problems:
            raise ValueError(
                f"layer kind {info.kind} of plan set {self.plans.header.name!r}: "
                + "; ".join(problems)
                + ": build the set from this model's config (frostc from-config)"
            )

    def _check_capacity(self, batch: int, tokens: int) -> None:
        serving = self.plans.serving
        if batch > self.max_sequences:
            raise ValueError(
                f"batch {batch}: the plan set's pools hold {self.max_sequences} sequences of "
                f"{serving.max_cache_len} tokens ({serving.pages} pages); build the set with more "
                "--pages or a shorter --max-cache-len"
            )
        if tokens > serving.max_cache_len:
            raise ValueError(
                f"{tokens} tokens per sequence: over the plan set's cache of {serving.max_cache_len} "
                "(--max-cache-len); stop generating earlier or build the set with a longer cache"
            )

    # ------------------------------------------------------------------ prefill
    def _prefill(self, info: KindInfo, rows: FrostcMask, query, key, value, pools: Pools):
        b, hq, s, d = query.shape
        if rows.width != s:
            raise ValueError(f"prefill: the 2-D attention mask has {rows.width} columns, the prompt {s} tokens")
        slots = self._derived(rows, "pool_slots", lambda: self._prefill_slots(rows, s))
        if pools.scales is not None:  # a new generation: its scales from its prompts' K and V
            for scale, x in zip(pools.scales, (key, value)):
                amax = x.detach().float().abs().amax(dim=(0, 2, 3))
                scale.copy_((amax * (KV_SCALE_HEADROOM / dtypes.E4M3_MAX)).clamp_min(MIN_KV_SCALE))
        pools.append(key, value, slots)
        key_plan, why = self._select("prefill", info, b)
        serving = self.plans.serving
        if key_plan is not None and b * s > serving.max_prompt_tokens:
            key_plan, why = None, f"{b} x {s} prompt tokens are over the set's --max-prompt-tokens"
        if key_plan is None:
            return self._reference_prefill(info, rows, query, key, value, why)
        slot = _slots_by_name(key_plan)
        tokens, offsets = slot["q"].dims[0], slot["cu_seqlens"].dims[0]
        in_place = self._prefill_in_place(key_plan, rows, query, key, value)
        if in_place is not None:
            return in_place
        dest, gather, cu = self._derived(
            rows, ("packed", tokens, offsets), lambda: self._packing(rows, s, tokens, offsets)
        )
        packed = [_pack(x, dest, tokens) for x in (query, key, value)]
        # o's rows past the plan's: `tokens` is 0 (pad tokens read it), `tokens + 1` NaN (rows not one run)
        o = torch.empty(tokens + 2, hq, d, dtype=query.dtype, device=query.device)
        o[tokens].zero_()
        o[tokens + 1].fill_(torch.nan)
        torch.ops.frostc.execute(key_plan, [*packed, cu], [o[:tokens]], None)
        self._count("prefill")
        return o.index_select(0, gather).view(b, s, hq, d)

    def _prefill_in_place(self, key_plan: str, rows: FrostcMask, query, key, value):
        """The packed plan run on HF's own (b * s)-row buffers, no packing: sequence i spans
        rows [i * s + first_i, (i + 1) * s + first_(i+1)), its valid tokens then the next row's
        left padding (or its own right padding), which no valid query sees (they come after it,
        and the mask is causal). Needs every span within the plan's longest sequence (2s - 1 <=
        it); None otherwise (the packing path runs). q, k, v not in (b, s, h, d) memory (views of
        a fused QKV buffer) are copied into it. Row 0's leading pads belong to no span: zeros; a
        row that is not one run: NaN."""
        r = torch_ops.registered(key_plan)
        b, hq, s, d = query.shape
        names = [slot.name for slot in r.data.slots]
        contracts = {r.data.slots[c.slot].name: c.longest for c in r.data.lengths}
        if names != ["q", "k", "v", "cu_seqlens", "o"] or 2 * s - 1 > contracts.get("cu_seqlens", 0):
            return None
        if r.plan is None:
            return None
        # HF's own rows are (b, s, h, d) memory already; views of a fused QKV buffer get one copy
        tensors = [x.transpose(1, 2).contiguous() for x in (query, key, value)]
        offsets = r.data.slots[3].dims[0]
        cu = self._derived(rows, ("spans", s, offsets), lambda: _spans(rows, s, offsets))
        o = torch.empty(b, s, hq, d, dtype=query.dtype, device=query.device)
        o[0].zero_()
        buffers = [_Capacity(t, slot) for t, slot in zip((*tensors, o), (*r.data.slots[:3], r.data.slots[4]))]
        r.plan.execute(*buffers[:3], cu, buffers[3], workspace=r.workspace)
        self._count("prefill")
        return o.masked_fill_(rows.broken[:, None, None, None], torch.nan)

    def _prefill_slots(self, rows: FrostcMask, s: int) -> torch.Tensor:
        """Each token's row in its layer's pool (pool viewed as (pages * page_size, hkv, d)); pad
        tokens go to the dump page past the plan's pages."""
        b = len(rows.first)
        position, valid = rows.positions(s)
        base = torch.arange(b, device=position.device)[:, None] * (self.max_pages * self.page_size)
        dump = self.plans.serving.pages * self.page_size
        return torch.where(valid, base + position, dump).flatten()

    def _packing(self, rows: FrostcMask, s: int, tokens: int, offsets: int):
        """Where each (row, token) goes in the packed buffers (pads: row `tokens`, a dump row past
        the plan's), where each output token comes from (pads: row `tokens`, zeros; every token of
        a row that is not one run: row `tokens + 1`, NaN), and cu_seqlens over the plan's bucket
        (empty sequences after the batch's)."""
        b = len(rows.first)
        position, valid = rows.positions(s)
        starts = torch.cumsum(rows.count, 0, dtype=torch.int32) - rows.count
        dest = torch.where(valid, starts[:, None].to(torch.int64) + position, tokens)
        gather = torch.where(rows.broken[:, None], tokens + 1, dest)
        cu = torch.zeros(offsets, dtype=torch.int32, device=position.device)
        cu[1 : b + 1] = torch.cumsum(rows.count, 0, dtype=torch.int32)
        cu[b + 1 :] = cu[b]
        return dest.flatten(), gather.flatten(), cu

    # ------------------------------------------------------------------ decode
    def _decode(self, info: KindInfo, rows: FrostcMask, query, key, value, pools: Pools):
        b, hq, s, d = query.shape
        key_plan, why = self._select("decode", info, b)
        new_tokens = self.plans.serving.new_tokens
        if key_plan is not None and s != new_tokens:
            key_plan, why = None, f"{s} new tokens per sequence, the set's decode plans take {new_tokens}"
        if key_plan is None:
            positions = rows.count[:, None].to(torch.int64) - s + torch.arange(s, device=query.device)
            base = torch.arange(b, device=query.device)[:, None] * (self.max_pages * self.page_size)
            pools.append(key, value, (base + positions).flatten())
            return self._reference_decode(info, rows, query, pools, why)
        slot = _slots_by_name(key_plan)
        bucket = slot["q"].dims[0]
        q, k_new, v_new = (_rows_to(x, slot[n]) for x, n in zip((query, key, value), ("q", "k_new", "v_new")))
        cache_len = self._derived(rows, ("cache_len", bucket, s), lambda: _cache_len(rows.count, bucket, s))
        o = torch.empty_strided(slot["o"].dims, slot["o"].strides, dtype=query.dtype, device=query.device)
        pages = self.plans.serving.pages
        reads = {"q": q, "k_new": k_new, "v_new": v_new, "page_table": self.page_table[:bucket], "cache_len": cache_len}
        if pools.scales is not None:
            reads["k_scale"], reads["v_scale"] = pools.scales
        writes = {"k_cache": pools.k[:pages], "v_cache": pools.v[:pages], "o": o}
        names_in, names_out = torch_ops.slot_roles(key_plan)
        torch.ops.frostc.execute(key_plan, [reads[n] for n in names_in], [writes[n] for n in names_out], None)
        self._count("decode")
        out = o[:b].transpose(1, 2)
        return torch.where(rows.broken[:, None, None, None], torch.nan, out)

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

    def _pool(self, layer: int, info: KindInfo, like: torch.Tensor) -> Pools:
        """The layer's K and V pools: (pages + 1, page_size, hkv, d) in the set's cache dtype (the
        last page takes pad tokens), and a scaled cache's scales ((hkv,) float32 each)."""
        pools = self._pools.get(layer)
        if pools is None:  # first use: allocate (the per-call path is the lookup)
            cache = self.plans.serving.kv_cache_dtype
            scaled = dtypes.DTYPES[cache].scaled
            shape = (self.plans.serving.pages + 1, self.page_size, info.kv_heads, info.head_dim)
            dtype = dtypes.torch_dtype(cache) if scaled else like.dtype
            pools = tuple(torch.zeros(shape, dtype=dtype, device=like.device) for _ in range(2))
            self._pools[layer] = pools
            if scaled:
                ones = torch.ones(info.kv_heads, dtype=torch.float32, device=like.device)
                self._scales[layer] = (ones, ones.clone())
        return Pools(*pools, self._scales.get(layer))

    def _derived(self, rows: FrostcMask, what, make):
        """Per-forward tensors every layer shares, computed by the first layer that needs them."""
        if what not in rows.derived:
            rows.derived[what] = make()
        return rows.derived[what]

    # ------------------------------------------------------------------ the torch reference (fallbacks)
    def _count(self, *what: str) -> None:
        """Count a call in `calls`, unless torch.compile is tracing it: a count would be a Python
        int dynamo reads, bakes into the graph and guards on (a recompile at every step)."""
        if torch.compiler.is_compiling():
            return
        for key in what:
            self.calls[key] += 1

    def _fallback(self, why: str) -> None:
        if not self.launch:
            self._count("reference")
            return
        self._count("fallback", f"fallback: {why}")
        if why not in self._warned:
            self._warned.add(why)
            warnings.warn(f"frostc: computing attention in torch (fp32 reference), not a plan: {why}", stacklevel=4)

    def _reference_prefill(self, info: KindInfo, rows: FrostcMask, query, key, value, why: str):
        self._fallback(why)
        s = query.shape[2]
        t = torch.arange(s, device=query.device)
        _, valid = rows.positions(s)
        allowed = valid[:, :, None] & valid[:, None, :] & (t[None, None, :] <= t[None, :, None])
        if info.window_left is not None:
            allowed &= t[None, None, :] >= t[None, :, None] - info.window_left
        out = _reference(query, key, value, allowed[:, None], info.scale, info.softcap)
        return _fill_rows(out, valid.flatten(), rows.broken)

    def _reference_decode(self, info: KindInfo, rows: FrostcMask, query, pools: Pools, why: str):
        self._fallback(why)
        b, _, s, d = query.shape
        length = self.max_pages * self.page_size
        pages = self.plans.serving.pages
        k_pool, v_pool = pools.values(pages)
        keys = k_pool.view(-1, length, info.kv_heads, d)[:b].transpose(1, 2)
        values = v_pool.view(-1, length, info.kv_heads, d)[:b].transpose(1, 2)
        j = torch.arange(length, device=query.device)
        at = rows.count[:, None].to(torch.int64) - s + torch.arange(s, device=query.device)  # (b, s): the queries'
        allowed = j[None, None, :] <= at[:, :, None]
        if info.window_left is not None:
            allowed &= j[None, None, :] >= at[:, :, None] - info.window_left
        out = _reference(query, keys, values, allowed[:, None], info.scale, info.softcap)
        return torch.where(rows.broken[:, None, None, None], torch.nan, out)

    def _other_cache(self, query, key, value, attention_mask, scaling, softcap, why: str):
        """Another cache (HF's own): its K/V are whole; HF's mask, built from the saved arguments."""
        self._fallback(why)
        from transformers.masking_utils import sdpa_mask

        b, _, s, d = query.shape
        scale = scaling if scaling is not None else 1 / math.sqrt(d)
        if isinstance(attention_mask, FrostcMask):
            allowed = sdpa_mask(**(attention_mask.hf_arguments | {"allow_is_causal_skip": False}))
        else:
            allowed = attention_mask
        if allowed is None:
            j = torch.arange(key.shape[2], device=query.device)
            allowed = j[None, :] <= j[-s:, None] if key.shape[2] >= s else None
        elif allowed.dtype != torch.bool:
            allowed = allowed == 0  # an additive mask: 0 where allowed
        return _reference(query, key, value, allowed[..., : key.shape[2]], scale, softcap)


# ---------------------------------------------------------------------------------------- helpers


def _slots_by_name(key: str) -> dict:
    r = torch_ops.registered(key)
    return {s.name: s for s in r.data.slots}


class _Capacity:
    """A tensor's memory presented to a plan as its slot's whole capacity (the plan's rows past
    the tensor's are never touched: the lengths end inside it), through __cuda_array_interface__."""

    def __init__(self, t: torch.Tensor, slot):
        from frost_runtime.plan import TYPESTR

        size = t.element_size()
        self.tensor = t  # kept alive while the plan is queued
        self.__cuda_array_interface__ = {
            "shape": tuple(slot.dims),
            "typestr": TYPESTR[slot.dtype],
            "strides": tuple(x * size for x in slot.strides),
            "data": (t.data_ptr(), False),
            "version": 3,
        }
        if tuple(t.stride()[-2:]) != tuple(slot.strides[-2:]) or dtypes.from_torch(t.dtype) != slot.dtype:
            raise ValueError(f"{slot.name}: {tuple(t.stride())} / {t.dtype} is not the slot's row layout")


def _spans(rows: FrostcMask, s: int, offsets: int) -> torch.Tensor:
    """cu_seqlens of HF's own rows: sequence i from row i * s + first_i; empty ones after."""
    b = len(rows.first)
    cu = torch.full((offsets,), b * s, dtype=torch.int32, device=rows.first.device)
    cu[:b] = torch.arange(b, device=rows.first.device, dtype=torch.int32) * s + rows.first.to(torch.int32)
    return cu


MIN_KV_SCALE = 1e-12  # an all-zero head's scale: any positive value stores its zeros exactly


@dataclass(frozen=True)
class Pools:
    """One layer's K and V pools, and a scaled (e4m3) cache's scales (K's, V's), else None."""

    k: torch.Tensor
    v: torch.Tensor
    scales: tuple[torch.Tensor, torch.Tensor] | None

    def append(self, key, value, slots: torch.Tensor) -> None:
        """Write (b, hkv, s, d) K/V into the pools' rows `slots` ((b * s,), pool rows of
        page_size), quantized as kv_append does when the cache is scaled."""
        hkv, d = key.shape[1], key.shape[3]
        scales = self.scales or (None, None)
        for pool, x, scale in ((self.k, key, scales[0]), (self.v, value, scales[1])):
            rows = x.transpose(1, 2).reshape(-1, hkv, d)
            if scale is not None:  # float8 has few ops: copy its bytes
                rows, pool = quantize(rows, scale).view(torch.uint8), pool.view(torch.uint8)
            pool.view(-1, hkv, d).index_copy_(0, slots, rows)

    def values(self, pages: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `pages` pages of K and V as the values they hold (a scaled cache dequantized,
        in float32: exact)."""
        k, v = self.k[:pages], self.v[:pages]
        if self.scales is None:
            return k, v
        return tuple(x.float() * s.view(1, 1, -1, 1) for x, s in zip((k, v), self.scales))


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(..., hkv, d) into e4m3 with a scale per head: x * (1 / scale) in float32, rounded to nearest
    even, saturated to +-448: what the plans' kv_append computes."""
    inverse = (1.0 / scale.float()).view(-1, 1)
    return (x.float() * inverse).clamp(-dtypes.E4M3_MAX, dtypes.E4M3_MAX).to(torch.float8_e4m3fn)


def _pack(x: torch.Tensor, dest: torch.Tensor, tokens: int) -> torch.Tensor:
    """(b, h, s, d) -> the packed plan's (tokens, h, d): row dest[i] takes token i; pads go to row
    `tokens`, a dump row past the plan's (the view handed over leaves it out)."""
    b, h, s, d = x.shape
    packed = torch.empty(tokens + 1, h, d, dtype=x.dtype, device=x.device)
    packed.index_copy_(0, dest, x.transpose(1, 2).reshape(b * s, h, d))
    return packed[:tokens]


def _fill_rows(out: torch.Tensor, valid: torch.Tensor, broken: torch.Tensor) -> torch.Tensor:
    """(b, s, h, d): pad tokens 0, every token of a row whose valid columns are not one run NaN."""
    b, s = out.shape[:2]
    fill = torch.where(broken, torch.nan, 0.0).to(out.dtype)[:, None, None, None]
    return torch.where(valid.view(b, s, 1, 1) & ~broken[:, None, None, None], out, fill)


def _rows_to(x: torch.Tensor, slot) -> torch.Tensor:
    """(b, h, s, d) as the plan's slot (bucket, h, s, d): x itself when b is the bucket and its
    strides are the slot's (those of extent-1 dims aside: they address nothing), as HF's own rows
    are for a set of separate q, k, v, and fused layers' views for a set built with --qkv-layout
    fused; else a copy in the slot's strides (rows past b: zeros)."""
    b = x.shape[0]
    if b == slot.dims[0] and all(n == 1 or a == want for n, a, want in zip(x.shape, x.stride(), slot.strides)):
        return x
    buffer = torch.empty_strided(slot.dims, slot.strides, dtype=x.dtype, device=x.device)
    if b < slot.dims[0]:
        buffer[b:].zero_()
    buffer[:b].copy_(x)
    return buffer


def _cache_len(count: torch.Tensor, bucket: int, new_tokens: int) -> torch.Tensor:
    """Each row's tokens after this step's append; rows past the batch hold just their new ones."""
    lengths = torch.full((bucket,), new_tokens, dtype=torch.int32, device=count.device)
    lengths[: len(count)] = count
    return lengths


def _reference(query, key, value, allowed, scale: float, softcap: float | None) -> torch.Tensor:
    """fp32 attention: query (b, hq, s, d), key/value (b, hkv, n, d), `allowed` broadcast to (b,
    hq, s, n); rows with no allowed key give 0. Returns (b, s, hq, d) in query's dtype."""
    groups = query.shape[1] // key.shape[1]
    k = key.float().repeat_interleave(groups, dim=1)
    v = value.float().repeat_interleave(groups, dim=1)
    scores = query.float() @ k.transpose(-1, -2) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -torch.inf)
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (p @ v).to(query.dtype).transpose(1, 2)


def install(plans: PlanSet, model=None, *, device=None, name: str = NAME, launch: bool = True) -> FrostcAttention:
    """A backend over `plans`, registered with transformers under `name`; `model` switched to it."""
    return FrostcAttention(plans, device=device, name=name, launch=launch).install(model)


class RecompileLimitError(RuntimeError):
    """A compiled DecodeGraph's step would recompile past torch._dynamo's recompile limit (and so
    run uncompiled): refused, not slowed in silence."""


class DecodeGraph:
    """Greedy decoding whose whole decode step (the model's forward: every layer, every frostc
    plan) runs as one CUDA graph, captured at the first step and replayed after.

        graph = DecodeGraph(model, backend, batch=8)
        tokens = graph.prefill(input_ids, attention_mask)   # eager; left-padded prompts
        for _ in range(n):
            tokens = graph.step(tokens)                      # one replay per step

    The step's inputs live in static buffers: the new tokens, their positions, and a 2-D mask of
    the cache's width whose row b holds ones on its first `length[b]` columns (the backend reads
    each row's count from it on the device). Nothing in the step depends on a host-side length,
    so one capture serves every later step of every generation of this batch size. A replay
    runs no Python: `backend.calls` counts only the eager and capturing runs (not compiled ones).

    `compile_model=True` runs the step's forward through `torch.compile` (inductor fuses the
    model's own elementwise work — norms, rotary, activations, residuals — around frostc's ops,
    which compile as they are) before the capture: a compile on the serving machine at the first
    step, which the plans themselves never need. One compile per graph: a step's host state is
    the same at every step and every generation (see `_hold_cache`), and each graph compiles a
    step function with a code object of its own, where dynamo keeps the graph's compiled entries
    and counts its recompiles (compiling the model itself would count every graph's, at every
    batch size, against the limit of the model's one forward code, then run it uncompiled). A
    step that would recompile past dynamo's limit raises RecompileLimitError, not a silent eager step.
    """

    def __init__(self, model, backend: FrostcAttention, batch: int, *, compile_model: bool = False):
        self.model, self.backend, self.batch = model, backend, batch
        self.compiled = torch.compile(_own_code(_step), dynamic=False) if compile_model else None
        device, width = backend.device, backend.plans.serving.max_cache_len
        self.ids = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.mask = torch.zeros(batch, width, dtype=torch.int64, device=device)
        self.length = torch.zeros(batch, dtype=torch.int64, device=device)
        self.cache = backend.new_cache()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.tokens = 0  # the most tokens a row holds (host-known: the prompts' width + steps)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Run the prompts (eager, through the set's prefill plans); the first new tokens, (b,)."""
        if input_ids.shape[0] != self.batch:
            raise ValueError(f"{input_ids.shape[0]} prompts: this graph decodes batches of {self.batch}")
        self.cache = self.backend.new_cache()
        position = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position, past_key_values=self.cache
        )
        self.length.copy_(attention_mask.sum(-1))
        self.tokens = input_ids.shape[1]
        columns = torch.arange(self.mask.shape[1], device=self.mask.device)
        self.mask.copy_((columns[None, :] < self.length[:, None]).to(self.mask.dtype))
        return out.logits[:, -1].argmax(-1)

    reset = prefill

    def step(self, tokens: torch.Tensor, *, capture: bool = True) -> torch.Tensor:
        """Feed `tokens` (b,) and return the next ones; `capture=False` runs the step eagerly.
        Refused (ValueError) once a row could outgrow the set's cache: a replay checks nothing."""
        width = self.mask.shape[1]
        if self.tokens + 1 > width:
            raise ValueError(
                f"step {self.tokens + 1 - width} past the plan set's cache of {width} tokens per sequence "
                "(--max-cache-len): stop here, or build the set with a longer cache"
            )
        self.tokens += 1
        self.ids.copy_(tokens.view(-1, 1))
        self.position.copy_(self.length.view(-1, 1))
        self.mask.scatter_(1, self.length.view(-1, 1), 1)
        self.length += 1
        if not capture:
            return self._forward()[:, -1].argmax(-1)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.logits[:, -1].argmax(-1)

    def _hold_cache(self) -> None:
        """Present the cache to the step as wide as its mask (as HF's static cache does: its mask
        sizes are its whole length): every layer has seen `width - 1` tokens before the step's
        append, at every step. The rows' lengths are the mask's, on the device; a host count that
        grew by one a step would be a Python int torch.compile specializes on: a compile a step."""
        held = self.mask.shape[1] - 1
        for layer in self.cache.layers:
            layer.seen = held

    def _forward(self) -> torch.Tensor:
        self._hold_cache()  # before every forward: a capture runs two (the warm-up, then the captured one)
        inputs = (self.model, self.ids, self.mask, self.position, self.cache)
        if self.compiled is None:
            return _step(*inputs)
        if not hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
            return self.compiled(*inputs)
        try:
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                return self.compiled(*inputs)
        except torch._dynamo.exc.FailOnRecompileLimitHit as exc:
            limit = torch._dynamo.config.recompile_limit
            raise RecompileLimitError(
                f"DecodeGraph(batch={self.batch}, compile_model=True): this graph's step would recompile past "
                f"torch._dynamo's recompile limit (torch._dynamo.config.recompile_limit = {limit}) and run "
                "uncompiled. Something the step reads changed between steps (the model's attention "
                "implementation or config, say): TORCH_LOGS=recompiles lists the guards that failed; or use "
                "compile_model=False"
            ) from exc

    def _capture(self) -> None:
        """Warm up on a side stream (the step's writes are idempotent: the same K/V rows again),
        then capture one step."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._forward()


def _step(model, ids, mask, position, cache) -> torch.Tensor:
    """A decode step's forward: the logits of `ids` (b, 1) at `position` over `cache`."""
    return model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache).logits


def _own_code(fn):
    """`fn` with a copy of its code object: dynamo keeps compiled entries, and counts a frame's
    recompiles against its limit, per code object; the copy's are its own (and go with it)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
