"""The per-forward metadata (vLLM's metadata-builder seam): what the registered mask function makes
of HF's 2-D padding mask once per forward — `FrostcMask`, each row's first valid column and count and
whether its valid columns are one run — and the index tensors the layers take from it: each token's
pool slot, the packed plan's rows and spans, each row's cache length.

Those are computed on the device, by the first layer that needs them, and shared by every later
layer of the forward; nothing reads the device from the host, so a decode step can be captured.
Sequence b owns the pool pages [b * max_pages, (b + 1) * max_pages) (the page table, built once) and
its tokens sit there compacted from position 0; pad tokens go to the dump page past the plan's pages.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from frost_runtime.planset import ServingInfo


def once_per_forward(make):
    """`make(rows, *sizes, **context)` computed by the first layer that asks for it, then kept in
    `rows.derived` under its name and sizes for every later layer of the same forward (one mask,
    one set of index tensors; the context, such as the deployment, is the backend's: one per forward)."""
    name = make.__name__

    @functools.wraps(make)
    def derived(rows: FrostcMask, *sizes: int, **context):
        key = (name, *sizes)
        if key not in rows.derived:
            rows.derived[key] = make(rows, *sizes, **context)
        return rows.derived[key]

    return derived


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

    @once_per_forward
    def positions(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, s): each column's position in its sequence, and whether it holds one of the
        sequence's tokens (every layer's prefill uses them)."""
        t = torch.arange(s, device=self.first.device)
        position = t[None, :] - self.first[:, None]
        valid = (position >= 0) & (position < self.count[:, None])
        return position, valid

    @property
    def shape(self) -> tuple[int, ...]:  # HF code may log a mask's shape
        return (len(self.first), self.width)


def build_rows(
    attention_mask: torch.Tensor | None, batch_size: int, kv_length: int, device, hf_arguments: dict
) -> FrostcMask:
    """Each row's first valid column and count, from the 2-D padding mask, on the device (no mask:
    every row's `kv_length` columns are valid)."""
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


# ---------------------------------------------------------------------------- the pools' slots


def page_table(sequences: int, max_pages: int) -> torch.Tensor:
    """(sequences, max_pages) int32, on the host: sequence b's pages, b * max_pages on (the decode
    plans' page table, the same at every step)."""
    rows = torch.arange(sequences, dtype=torch.int32)[:, None] * max_pages
    return rows + torch.arange(max_pages, dtype=torch.int32)


def _sequence_starts(b: int, device, serving: ServingInfo) -> torch.Tensor:
    """(b, 1): the pool row (pool viewed as (pages * page_size, hkv, d)) of each sequence's first token."""
    return torch.arange(b, device=device)[:, None] * (serving.max_pages * serving.page_size)


@once_per_forward
def prefill_slots(rows: FrostcMask, s: int, *, serving: ServingInfo) -> torch.Tensor:
    """Each token's row in its layer's pool; pad tokens go to the dump page past the plan's pages."""
    position, valid = rows.positions(s)
    dump = serving.pages * serving.page_size
    return torch.where(valid, _sequence_starts(len(rows.first), position.device, serving) + position, dump).flatten()


def decode_positions(rows: FrostcMask, s: int) -> torch.Tensor:
    """(b, s) int64: the positions of a decode step's `s` new tokens in their sequences (the
    step's tokens are each row's last)."""
    return rows.count[:, None].to(torch.int64) - s + torch.arange(s, device=rows.count.device)


def decode_slots(rows: FrostcMask, s: int, serving: ServingInfo) -> torch.Tensor:
    """Each of a decode step's new tokens' row in its layer's pool, (b * s,)."""
    positions = decode_positions(rows, s)
    return (_sequence_starts(len(rows.first), positions.device, serving) + positions).flatten()


# ------------------------------------------------------------------- the plans' index tensors


@once_per_forward
def packing(rows: FrostcMask, s: int, tokens: int, offsets: int):
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


@once_per_forward
def spans(rows: FrostcMask, s: int, offsets: int) -> torch.Tensor:
    """cu_seqlens of HF's own rows: sequence i from row i * s + first_i; empty ones after."""
    b = len(rows.first)
    cu = torch.full((offsets,), b * s, dtype=torch.int32, device=rows.first.device)
    cu[:b] = torch.arange(b, device=rows.first.device, dtype=torch.int32) * s + rows.first.to(torch.int32)
    return cu


@once_per_forward
def query_spans(rows: FrostcMask, s: int, offsets: int) -> torch.Tensor:
    """cu_seqlens of `s` new tokens per row, packed (an MLA step's queries); empty ones after."""
    b = len(rows.first)
    steps = torch.arange(offsets, device=rows.first.device, dtype=torch.int32) * s
    return steps.clamp_(max=b * s)


@once_per_forward
def cache_len(rows: FrostcMask, bucket: int, new_tokens: int) -> torch.Tensor:
    """Each row's tokens after this step's append; rows past the batch hold just their new ones."""
    lengths = torch.full((bucket,), new_tokens, dtype=torch.int32, device=rows.count.device)
    lengths[: len(rows.count)] = rows.count
    return lengths
