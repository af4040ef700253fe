"""The launches (vLLM's impl seam): a call's q, k, v handed to the plan the backend chose, and the
plan's output back in HF's (b, s, hq, d). Prefill runs the set's packed plan on HF's own rows in place
where every sequence's span fits the plan, else on packed copies; decode runs its paged plan
(kv_append into the pools, then the attention). The index tensors come from metadata.py, computed
on the device: nothing here reads the device from the host.
"""

from __future__ import annotations

import torch

from frost_runtime import dtypes, torch_ops
from frost_runtime.hf import metadata
from frost_runtime.hf.metadata import FrostcMask
from frost_runtime.hf.pools import Pools

# ------------------------------------------------------------------------------------- prefill


def prefill(key_plan: str, rows: FrostcMask, query, key, value, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The packed plan `key_plan` over a fresh cache's prompts (their K/V are in the pools already);
    `sinks`: the layer's (float32, one per query head) where the kind has them."""
    b, hq, s, _ = query.shape
    dv = value.shape[-1]  # o's (DeepSeek's: 128 under q/k's 192)
    slot = _slots_by_name(key_plan)
    tokens, offsets = slot["q"].dims[0], slot["cu_seqlens"].dims[0]
    in_place = _prefill_in_place(key_plan, rows, query, key, value, sinks)
    if in_place is not None:
        return in_place
    dest, gather, cu = metadata.packing(rows, s, tokens, offsets)
    packed = [_pack(x, dest, tokens) for x in (query, key, value)]
    # o's rows past the plan's: `tokens` is 0 (pad tokens read it), `tokens + 1` NaN (rows not one run)
    o = torch.empty(tokens + 2, hq, dv, dtype=query.dtype, device=query.device)
    o[tokens].zero_()
    o[tokens + 1].fill_(torch.nan)
    reads = dict(zip(("q", "k", "v"), packed), cu_seqlens=cu, sinks=sinks)
    _execute(key_plan, reads, {"o": o[:tokens]})
    return o.index_select(0, gather).view(b, s, hq, dv)


# ------------------------------------------------------------------------------------- context


def context(key_plan: str, rows: FrostcMask, query, key, value, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The context plan `key_plan` (an MLA model's steps after its prompt): each row's s new tokens
    over its valid columns of the whole context transformers expanded (left padding packed out
    with device-computed indices), the queries the last keys of their sequence (bottom-right).
    The packed buffers hold this call's rows only (b x context keys, b x s queries), presented to
    the plan as its slots' capacity (a bucket's capacity is batch x --max-cache-len keys: at
    DeepSeek's sizes, gigabytes no call needs); a plan held as metadata only (tracing) takes
    whole-capacity buffers."""
    b, hq, s, d = query.shape
    context, dv = key.shape[2], value.shape[-1]
    r = torch_ops.registered(key_plan)
    slot = {x.name: x for x in r.data.slots}
    offsets = slot["cu_seqlens_q"].dims[0]
    sized = r.plan is not None
    queries, keys = (b * s, b * context) if sized else (slot["q"].dims[0], slot["k"].dims[0])
    dest, _, cu_kv = metadata.packing(rows, context, keys, offsets)
    k, v = (_pack(x, dest, keys) for x in (key, value))
    q = query.transpose(1, 2).reshape(b * s, hq, d).contiguous()  # a view where HF's rows allow
    if not sized:  # the slot's whole capacity; rows past b * s: no sequence reads them
        q = torch.cat([q, q.new_empty(queries - b * s, hq, d)])
    o = torch.empty(queries, hq, dv, dtype=query.dtype, device=query.device)
    lengths = dict(cu_seqlens_q=metadata.query_spans(rows, s, offsets), cu_seqlens_kv=cu_kv, sinks=sinks)
    if sized:  # the lengths end inside this call's rows: the plan touches nothing past them
        _execute_in_capacity(r, dict(q=q, k=k, v=v, o=o), lengths)
    else:
        _execute(key_plan, dict(q=q, k=k, v=v) | lengths, {"o": o})
    out = o[: b * s].view(b, s, hq, dv)
    return torch.where(rows.broken[:, None, None, None], torch.nan, out)


def _execute_in_capacity(r, tensors: dict, others: dict) -> None:
    """The loaded plan `r` on `tensors` presented as their slots' whole capacity (`_Capacity`) and
    `others` (lengths, sinks) as they are, in slot order."""
    slots = {slot.name: slot for slot in r.data.slots}
    buffers = {name: _Capacity(t, slots[name]) for name, t in tensors.items()} | others
    r.plan.execute(*(buffers[slot.name] for slot in r.data.slots), workspace=r.workspace)


def _execute(key_plan: str, reads: dict, writes: dict) -> None:
    """torch_ops.launch with the plan's slots taken by name (a plan's optional slots, such as
    `sinks`, change the positions)."""
    names_in, names_out = torch_ops.slot_roles(key_plan)
    torch_ops.launch(key_plan, [reads[n] for n in names_in], [writes[n] for n in names_out])


_PREFILL_SLOTS = ({"q", "k", "v", "cu_seqlens", "o"}, {"q", "k", "v", "cu_seqlens", "o", "sinks"})


def _prefill_in_place(key_plan: str, rows: FrostcMask, query, key, value, sinks) -> torch.Tensor | None:
    """The packed plan run on HF's own (b * s)-row buffers, no packing: sequence i spans
    rows [i * s + first_i, (i + 1) * s + first_(i+1)), its valid tokens then the next row's
    left padding (or its own right padding), which no valid query sees (they come after it,
    and the mask is causal). Needs every span within the plan's longest sequence (2s - 1 <=
    it); None otherwise (the packing path runs). q, k, v not in (b, s, h, d) memory (views of
    a fused QKV buffer) are copied into it. Row 0's leading pads belong to no span: zeros; a
    row that is not one run: NaN."""
    r = torch_ops.registered(key_plan)
    b, hq, s, _ = query.shape
    slots = {slot.name: slot for slot in r.data.slots}
    contracts = {r.data.slots[c.slot].name: c.longest for c in r.data.lengths}
    if set(slots) not in _PREFILL_SLOTS or 2 * s - 1 > contracts.get("cu_seqlens", 0):
        return None
    if r.plan is None:
        return None
    # HF's own rows are (b, s, h, d) memory already; views of a fused QKV buffer get one copy
    tensors = dict(zip(("q", "k", "v"), (x.transpose(1, 2).contiguous() for x in (query, key, value))))
    cu = metadata.spans(rows, s, slots["cu_seqlens"].dims[0])
    o = torch.empty(b, s, hq, value.shape[-1], dtype=query.dtype, device=query.device)
    o[0].zero_()
    _execute_in_capacity(r, tensors | {"o": o}, {"cu_seqlens": cu, "sinks": sinks})
    return o.masked_fill_(rows.broken[:, None, None, None], torch.nan)


def _pack(x: torch.Tensor, dest: torch.Tensor, tokens: int) -> torch.Tensor:
    """(b, h, s, d) -> the packed plan's (tokens, h, d): row dest[i] takes token i; pads go to row
    `tokens`, a dump row past the plan's (the view handed over leaves it out)."""
    b, h, s, d = x.shape
    packed = torch.empty(tokens + 1, h, d, dtype=x.dtype, device=x.device)
    packed.index_copy_(0, dest, x.transpose(1, 2).reshape(b * s, h, d))
    return packed[:tokens]


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


# -------------------------------------------------------------------------------------- decode


def decode(
    key_plan: str,
    rows: FrostcMask,
    query,
    key,
    value,
    pools: Pools,
    page_table: torch.Tensor,
    pages: int,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """The paged plan `key_plan`: this step's K/V appended to the pools' first `pages` pages, and the
    new tokens' attention over their sequences; `page_table` holds every sequence's pages; `sinks`
    the layer's where the kind has them."""
    b, hq, s, d = query.shape
    slot = _slots_by_name(key_plan)
    bucket = slot["q"].dims[0]
    q, k_new, v_new = (rows_as_slot(x, slot[n]) for x, n in zip((query, key, value), ("q", "k_new", "v_new")))
    cache_len = metadata.cache_len(rows, bucket, s)
    o = torch.empty_strided(slot["o"].dims, slot["o"].strides, dtype=query.dtype, device=query.device)
    reads = {"q": q, "k_new": k_new, "v_new": v_new, "page_table": page_table[:bucket], "cache_len": cache_len,
             "sinks": sinks}  # fmt: skip
    if pools.scales is not None:
        reads["k_scale"], reads["v_scale"] = pools.scales
    writes = {"k_cache": pools.k[:pages], "v_cache": pools.v[:pages], "o": o}
    _execute(key_plan, reads, writes)
    out = o[:b].transpose(1, 2)
    return torch.where(rows.broken[:, None, None, None], torch.nan, out)


def rows_as_slot(x: torch.Tensor, slot) -> torch.Tensor:
    """x as the plan's slot, its first dim the bucket's (decode's (b, h, s, d) rows, a continuous-
    batching step's (tokens, h, d)): x itself when that dim is the bucket's and its
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


def _slots_by_name(key: str) -> dict:
    r = torch_ops.registered(key)
    return {s.name: s for s in r.data.slots}
