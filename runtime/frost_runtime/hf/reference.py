"""The fp32 torch reference: what a call computes when the set has no plan for it (and every call of
a backend made with `launch=False`), over the same pools and lengths as the plans: slower, never
wrong. Also what a call over another cache (HF's own) computes, with HF's mask. Rows whose valid
columns are not one run give NaN, pad tokens 0, as the plans do."""

from __future__ import annotations

import math

import torch

from frost_runtime.hf.metadata import FrostcMask, decode_positions
from frost_runtime.hf.pools import Pools
from frost_runtime.planset import KindInfo, ServingInfo


def attend(query, key, value, allowed, scale: float, softcap: float | None, sinks=None) -> torch.Tensor:
    """fp32 attention: query (b, hq, s, d), key/value (b, hkv, n, d), `allowed` broadcast to (b,
    hq, s, n); rows with no allowed key give 0. `sinks` (hq,): each head's logit joins every row's
    softmax denominator (and weights no value). Returns (b, s, hq, d) in query's dtype."""
    groups = query.shape[1] // key.shape[1]
    k = key.float().repeat_interleave(groups, dim=1)
    v = value.float().repeat_interleave(groups, dim=1)
    scores = query.float() @ k.transpose(-1, -2) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -torch.inf)
    if sinks is not None:
        sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        p = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (p @ v).to(query.dtype).transpose(1, 2)


def prefill(info: KindInfo, rows: FrostcMask, query, key, value, sinks=None) -> torch.Tensor:
    """A fresh cache's prompts: each valid token sees its sequence's valid tokens up to its own (and
    within the kind's window)."""
    s = query.shape[2]
    t = torch.arange(s, device=query.device)
    _, valid = rows.positions(s)
    allowed = valid[:, :, None] & valid[:, None, :] & (t[None, None, :] <= t[None, :, None])
    if info.window_left is not None:
        allowed &= t[None, None, :] >= t[None, :, None] - info.window_left
    out = attend(query, key, value, allowed[:, None], info.scale, info.softcap, sinks)
    return _fill_rows(out, valid.flatten(), rows.broken)


def decode(info: KindInfo, rows: FrostcMask, query, pools: Pools, serving: ServingInfo, sinks=None) -> torch.Tensor:
    """A step's new tokens (appended to the pools already) over their sequences' pooled tokens."""
    b, _, s, d = query.shape
    length = serving.max_pages * serving.page_size
    k_pool, v_pool = pools.values(serving.pages)
    keys = k_pool.view(-1, length, info.kv_heads, d)[:b].transpose(1, 2)
    values = v_pool.view(-1, length, info.kv_heads, d)[:b].transpose(1, 2)
    j = torch.arange(length, device=query.device)
    at = decode_positions(rows, s)  # (b, s): the queries'
    allowed = j[None, None, :] <= at[:, :, None]
    if info.window_left is not None:
        allowed &= j[None, None, :] >= at[:, :, None] - info.window_left
    out = attend(query, keys, values, allowed[:, None], info.scale, info.softcap, sinks)
    return torch.where(rows.broken[:, None, None, None], torch.nan, out)


def other_cache(query, key, value, attention_mask, scaling, softcap, sinks=None) -> torch.Tensor:
    """Another cache (HF's own): its K/V are whole; HF's mask, built from the saved arguments."""
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
    return attend(query, key, value, allowed[..., : key.shape[2]], scale, softcap, sinks)


def _fill_rows(out: torch.Tensor, valid: torch.Tensor, broken: torch.Tensor) -> torch.Tensor:
    """(b, s, h, d): pad tokens 0, every token of a row whose valid columns are not one run NaN."""
    b, s = out.shape[:2]
    fill = torch.where(broken, torch.nan, 0.0).to(out.dtype)[:, None, None, None]
    return torch.where(valid.view(b, s, 1, 1) & ~broken[:, None, None, None], out, fill)
