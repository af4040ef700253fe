"""One continuous-batching step's metadata (vLLM's metadata-builder seam) for frostc's mixed form:
`cu_seqlens_q`, `seq_len_kv` and `page_table`, derived on the device from what transformers hands the
attention (its `cu_seq_lens_q`, `position_ids`, and the `read_index` / `write_index` rows it built for
its own gather), per layer group, once per forward.

transformers' index tensors give each token row its pool row; a pool row's block is its page id
(cb_cache.py). Every entry of a sequence's indices says "position p of this sequence lives in block
B", so scattering (sequence, p // page_size) <- B builds the sequence's page table:
- full attention: the read indices cover positions [0, L) (write then read), the write indices
  [L - n, L); a step without any cache to read has no read indices, and then the writes cover all;
- sliding attention: a ring of `window / page_size` pages, position p in ring slot p % window. The
  read indices cover the last min(past, window - 1) positions before the step (in ring order from
  `(past + 1) % window` once the ring is full, then one sentinel per query), the writes the step's
  last min(n, window) positions (earlier ones go to the trash). Their ring pages give the ring's
  table, and logical page j is ring page j mod (window / page_size): a query at p reads keys
  p - window + 1 .. p, which are exactly those the ring holds.
A sequence's length L is its last query's position + 1 (`position_ids`), 0 for the padding
sequences (transformers repeats the last prefix sum). Nothing is read back to the host: the host
knows only shapes and transformers' own host-side integers, so the step can be captured in a graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from frost_runtime.hf.cb_cache import GroupGeometry


@dataclass
class Step:
    """A layer group's view of one step: what the mixed plan binds (device tensors, int32) and what
    the host knows of it."""

    cu_seqlens_q: torch.Tensor  # (b + 1,): sequence i's queries are rows cu[i] .. cu[i + 1]
    seq_len_kv: torch.Tensor  # (b,): keys after the step (its own included); 0 for padding sequences
    page_table: torch.Tensor  # (b, max_pages): logical page j of sequence i -> its block (page id)
    rows: int  # the step's query rows (transformers pads them to its q interval under graphs)
    max_seqlen_q: int  # host side: the most queries one sequence has (transformers' max_length_q)
    max_seqlen_k: int | None = None  # host side: transformers' max_length_k of the group (padded under graphs)
    # the metadata padded to a bucket's sequences, by their count: built by the step's first layer,
    # reused by the others (cb_plans)
    padded: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)

    @property
    def sequences(self) -> int:
        return self.page_table.shape[0]

    @property
    def all_decode(self) -> bool:
        """A decode-only step (transformers' block-table fast path for FlashAttention 2/3)."""
        return self.max_seqlen_q <= 1


def build(kwargs: dict, geo: GroupGeometry, max_pages: int, rows: int) -> Step:
    """The step's metadata for `geo`'s group, from the attention call's keyword arguments."""
    cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
    q_len = (cu_q[1:] - cu_q[:-1]).long()
    length = _lengths(kwargs, cu_q, q_len, geo)
    past = length - q_len
    read = kwargs["read_index"][geo.index]
    write = kwargs["write_index"][geo.index]
    cu_k = kwargs["cu_seq_lens_k"][geo.layer_type].long()
    b = q_len.shape[0]
    cols = geo.ring_pages or max_pages
    entries = [_read_entries(read, cu_k, past, geo), _write_entries(write, cu_q.long(), q_len, past, geo)]
    table = _scatter(entries, b, cols, geo)
    if geo.ring_pages is not None:  # logical page j is ring page j mod ring_pages
        table = table[:, torch.arange(max_pages, device=table.device) % geo.ring_pages]
    return Step(
        cu_seqlens_q=cu_q,
        seq_len_kv=length.to(torch.int32),
        page_table=table.contiguous(),
        rows=rows,
        max_seqlen_q=int(kwargs.get("max_length_q", rows)),
        max_seqlen_k=kwargs.get("max_length_k", {}).get(geo.layer_type),
    )


def _lengths(kwargs: dict, cu_q: torch.Tensor, q_len: torch.Tensor, geo: GroupGeometry) -> torch.Tensor:
    """Each sequence's keys after the step: its last query's position + 1 (0 without queries)."""
    positions = kwargs.get("position_ids")
    if positions is not None:
        last = positions.reshape(-1)[(cu_q[1:].long() - 1).clamp(min=0)].long()
        return torch.where(q_len > 0, last + 1, 0)
    if geo.window is not None:
        raise ValueError(
            "position_ids: the model's attention call carries none, and a sliding group's lengths "
            "cannot be told without them; pass position_ids through to the attention (as transformers' "
            "decoder layers do)"
        )
    cu_k = kwargs["cu_seq_lens_k"][geo.layer_type].long()
    return cu_k[1:] - cu_k[:-1]


def _sequence_of(entry: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """The sequence each flat entry falls in (b for entries past the last: padding)."""
    return torch.searchsorted(cu[1:].contiguous(), entry, right=True)


def _read_entries(read: torch.Tensor, cu_k: torch.Tensor, past: torch.Tensor, geo: GroupGeometry):
    """(sequence, slot, block, valid) of every read index: slot is the position (full attention) or
    the ring slot (sliding)."""
    e = torch.arange(read.shape[0], device=read.device)
    b = past.shape[0]
    seq = _sequence_of(e, cu_k)
    i = seq.clamp(max=b - 1)
    k = e - cu_k[i]
    valid = seq < b
    if geo.window is None:
        slot = k
    else:  # the cached part, in ring order, then one sentinel per query (not a cache row)
        w = geo.window
        valid &= k < past[i].clamp(max=w - 1)
        start = torch.where(past[i] < w, 0, (past[i] + 1) % w)
        slot = (start + k) % w
    return seq, slot, read.long() // geo.block_rows, valid


def _write_entries(write, cu_q: torch.Tensor, q_len: torch.Tensor, past: torch.Tensor, geo: GroupGeometry):
    """(sequence, slot, block, valid) of every write index (padding tokens write to the trash)."""
    e = torch.arange(write.shape[0], device=write.device)
    b = past.shape[0]
    seq = _sequence_of(e, cu_q)
    i = seq.clamp(max=b - 1)
    t = e - cu_q[i]
    valid = seq < b
    position = past[i] + t
    if geo.window is None:
        slot = position
    else:  # a chunk longer than the window stores only its last `window` rows
        valid &= t >= q_len[i] - q_len[i].clamp(max=geo.window)
        slot = position % geo.window
    return seq, slot, write.long() // geo.block_rows, valid


def _scatter(entries, b: int, cols: int, geo: GroupGeometry) -> torch.Tensor:
    """(b, cols) int32 page table from (sequence, slot, block, valid) entries; pages no entry names
    stay 0 (a block of the read-trash sector: never a wrong sequence's keys, and masked anyway)."""
    seq = torch.cat([s for s, _, _, _ in entries])
    page = torch.cat([slot for _, slot, _, _ in entries]) // geo.page_size
    block = torch.cat([blk for _, _, blk, _ in entries])
    valid = torch.cat([v for _, _, _, v in entries]) & (page < cols)
    dump = b * cols  # one extra cell takes the invalid entries
    where = torch.where(valid, seq.clamp(max=b - 1) * cols + page.clamp(max=cols - 1), dump)
    flat = torch.zeros(dump + 1, dtype=torch.int32, device=block.device)
    flat.scatter_(0, where, block.to(torch.int32))  # entries of one page agree on its block
    return flat[:dump].view(b, cols)
