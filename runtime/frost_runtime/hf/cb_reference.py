"""The mixed step's attention in fp32 torch, reading transformers' pages in place through the step's
page table: what the reference executor computes (tests, machines without a GPU, and the fallback
where no plan serves a step), and what the plans are checked against.

It reads before it writes: each sequence's keys come from its pages, this step's rows overlaid at
their positions, and only then are the step's K/V written where transformers' write_index says.
For full attention that is the same as writing first (the plan's packed append); for a sliding
group it is what makes a chunk correct whose writes wrap the ring over keys its earlier queries
still see (the plans are not given such steps: continuous.py).
"""

from __future__ import annotations

import torch

from frost_runtime.hf.cb_step import Step
from frost_runtime.hf.pools import quantize

TOKENS_AT_ONCE = 16  # query rows per pass: bounds the (rows, keys, hkv, d) gathers


def attend(
    step: Step,
    q: torch.Tensor,  # (rows, hq, d)
    k_new: torch.Tensor,  # (rows, hkv, d): this step's rows, packed like q
    v_new: torch.Tensor,
    k_pages: torch.Tensor,  # (pages, page_size, hkv, d), by strides
    v_pages: torch.Tensor,
    scale: float,
    window_left: int | None,
    softcap: float | None,
    overlay: bool = True,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """(rows, hq, d) in q's dtype: each sequence's queries over its keys, causal (a query sees the
    positions up to its own, and within the window); rows outside the sequences are 0. `overlay`:
    this step's rows come from k_new / v_new (the pages do not hold them yet); False: from the pages
    (a plan's contract: it appended them first). `kv_scales`: an e4m3 pool's (hkv,) K and V
    scales: the pages are read dequantized, and this step's rows as the pool will hold them.
    `sinks`: (hq,) logits that join each row's softmax denominator (gpt-oss)."""
    rows, hq, d = q.shape
    hkv = k_new.shape[1]
    seq, pos, valid = _token_positions(step, rows)
    keys, values = _keys(step, k_pages, v_pages)  # (b, n + 1, hkv, d) fp32: the last column a dump
    n = keys.shape[1] - 1
    i = seq.clamp(max=step.sequences - 1)
    if kv_scales is not None:
        for x, kv_scale in zip((keys, values), kv_scales):
            x.mul_(kv_scale.view(1, 1, -1, 1))
    if overlay:  # this step's rows where they belong; the others into the dump (no boolean indexing: no sync)
        new_rows = (k_new.float(), v_new.float())
        if kv_scales is not None:  # as the pool will hold them
            new_rows = tuple(quantize(x, s).float() * s.view(1, -1, 1) for x, s in zip((k_new, v_new), kv_scales))
        at = torch.where(valid & (pos < n), pos, n)
        keys.index_put_((i, at), new_rows[0])
        values.index_put_((i, at), new_rows[1])
    j = torch.arange(n + 1, device=q.device)
    out = torch.zeros(rows, hkv, hq // hkv, d, dtype=torch.float32, device=q.device)
    qg = q.float().reshape(rows, hkv, hq // hkv, d)
    for at in range(0, rows, TOKENS_AT_ONCE):
        s = slice(at, at + TOKENS_AT_ONCE)
        allowed = (j[None, :] <= pos[s, None]) & (j[None, :] < n) & valid[s, None]
        if window_left is not None:
            allowed &= j[None, :] >= pos[s, None] - window_left
        scores = torch.einsum("thgd,tnhd->thgn", qg[s], keys[i[s]]) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill(~allowed[:, None, None, :], -torch.inf)
        if sinks is not None:  # a column of the head's sink, dropped after the softmax
            sink = sinks.float().view(1, hkv, hq // hkv, 1).expand(*scores.shape[:-1], 1)
            p = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out[s] = torch.einsum("thgn,tnhd->thgd", p, values[i[s]])
    return out.reshape(rows, hq, d).to(q.dtype)


def _token_positions(step: Step, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each query row's sequence, position in it, and whether it is one of a sequence's queries."""
    cu = step.cu_seqlens_q.long()
    t = torch.arange(rows, device=cu.device)
    seq = torch.searchsorted(cu[1:].contiguous(), t, right=True)
    b = step.sequences
    i = seq.clamp(max=b - 1)
    first = step.seq_len_kv.long() - (cu[1:] - cu[:-1])  # the first query's position
    return seq, first[i] + t - cu[i], (seq < b) & (t >= cu[0])


def _keys(step: Step, k_pages: torch.Tensor, v_pages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's keys through its page table, (b, pages * page_size + 1, hkv, d) in fp32: the
    last column is a dump for writes that land nowhere."""
    page = k_pages.shape[1]
    j = torch.arange(step.page_table.shape[1] * page + 1, device=k_pages.device)
    j = j.clamp(max=j.shape[0] - 2)  # the dump column reads the last key: never attended
    blocks = step.page_table.long()[:, j // page]
    return k_pages[blocks, j % page].float(), v_pages[blocks, j % page].float()
