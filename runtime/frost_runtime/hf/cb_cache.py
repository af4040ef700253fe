"""transformers' continuous-batching cache (`PagedAttentionCache`, 5.23) seen as frostc's paged cache,
by strides, no copy.

transformers keeps one byte pool. Each layer group (full attention, sliding attention) is an
allocator that views the whole pool as blocks of `2 * layers * page_size` token rows: in a block,
layer i's K page then its V page, for every layer of the group (cache_allocators/full_attention.py,
`register_cache_tensor`). A request owns whole blocks; its token at position p lives in its block
`p // page_size` (full attention), or in the ring slot `p % window` (sliding attention: a request
holds `ceil(window / page_size)` blocks and overwrites the token that slid out).

So layer i's K cache is the pool viewed as (blocks, page_size, hkv, d) starting 2i pages in, with
a whole block as the page stride, and its V cache the same view one page later: what frostc's
mixed form takes by strides (docs/variable-lengths.md, "Caches as engines hold them"). A page id
is a block id, and transformers' index tensors give it as `row // block_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupGeometry:
    """One allocator's layout: what every layer of its group shares."""

    index: int  # the allocator's index: its row in transformers' read/write index lists
    layer_type: str  # "full_attention" or "sliding_attention": its key in cu_seq_lens_k
    layers: tuple[int, ...]  # the group's layers, in the order of their pages in a block
    page_size: int
    block_rows: int  # token rows of one block: 2 * layers * page_size (transformers' block_physical_stride)
    blocks: int  # blocks in the whole pool, the two trash sectors included: the page ids of the views
    heads_kv: int
    head_dim: int
    window: int | None  # a sliding group's window (keys a query sees, itself included); None: full

    @property
    def ring_pages(self) -> int | None:
        """Pages of a sliding group's ring (None for full attention)."""
        return None if self.window is None else self.window // self.page_size


def geometry(allocator) -> GroupGeometry:
    """A transformers cache allocator's layout; a sliding window that is not a whole number of pages
    is refused (its ring would wrap inside a page, which no page table can describe)."""
    window = getattr(allocator, "sliding_window", None)
    page = allocator.tokens_per_page
    if window is not None and window % page:
        raise ValueError(
            f"sliding_window {window} is not a multiple of the continuous-batching page_size {page}: "
            "frostc reads transformers' ring of pages in place only when whole pages wrap; set "
            f"ContinuousBatchingConfig(page_size=...) to a divisor of {window}"
        )
    rows = allocator.cache_tensor.shape[0] * allocator.rows_per_token
    return GroupGeometry(
        index=allocator.index,
        layer_type=allocator.layer_type,
        layers=tuple(allocator.layer_indices),
        page_size=page,
        block_rows=allocator.block_physical_stride,
        blocks=rows // allocator.block_physical_stride,
        heads_kv=allocator.num_key_value_heads,
        head_dim=allocator.head_dim,
        window=window,
    )


def layer_pages(allocator, geo: GroupGeometry, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `layer`'s K and V caches as (blocks, page_size, hkv, d) views of the pool (no copy)."""
    pool = allocator.cache_tensor  # (tokens, 2, hkv, d) in the cache dtype, the whole pool
    row = geo.heads_kv * geo.head_dim
    at = 2 * geo.layers.index(layer) * geo.page_size * row + pool.storage_offset()
    size = (geo.blocks, geo.page_size, geo.heads_kv, geo.head_dim)
    stride = (geo.block_rows * row, row, geo.head_dim, 1)
    k = torch.as_strided(pool, size, stride, at)
    v = torch.as_strided(pool, size, stride, at + geo.page_size * row)
    return k, v


def layer_rows(allocator, geo: GroupGeometry, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `layer`'s K and V as the token-row views transformers' write_index addresses (its
    `_kv_token_views`, rebuilt from the pool): row r of K is token row r counted from the layer's K page."""
    flat = allocator.cache_tensor.view(-1, geo.heads_kv, geo.head_dim)
    at = 2 * geo.layers.index(layer) * geo.page_size
    return flat[at:], flat[at + geo.page_size :]
