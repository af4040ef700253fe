"""The KV pools the backend owns: per layer a K and a V pool of pages, (pages + 1, page_size, hkv, d)
in the set's cache dtype (the last page takes pad tokens), allocated at the layer's first call.

An FP8 cache (a set built with `--kv-cache-dtype e4m3`) holds e4m3 with one float32 scale per KV head
and layer. Each prefill (a generation's start) sets its layer's scales on the device from its own K
and V: amax / 448 times KV_SCALE_HEADROOM, room for later tokens twice as large (e4m3 is floating
point: the headroom costs range at the small end, not precision). Its rows are stored quantized;
decode's kv_append quantizes the new rows with the same scales, and the attention reads the pools
through them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frost_runtime import dtypes
from frost_runtime.planset import KindInfo, ServingInfo

KV_SCALE_HEADROOM = 2.0  # a scaled cache's scale: amax of the prefill's K (or V) per head / 448, times this
MIN_KV_SCALE = 1e-12  # an all-zero head's scale: any positive value stores its zeros exactly

PoolPair = tuple[torch.Tensor, torch.Tensor]  # a layer's (K, V) pools, or a scaled cache's (K, V) scales


@dataclass(frozen=True)
class Pools:
    """One layer's K and V pools, and a scaled (e4m3) cache's scales (K's, V's), else None."""

    k: torch.Tensor
    v: torch.Tensor
    scales: PoolPair | None

    def set_scales(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """A scaled cache's new generation: its scales from its prompts' (b, hkv, s, d) K and V, per
        KV head, on the device; an unscaled cache has none to set."""
        if self.scales is None:
            return
        for scale, x in zip(self.scales, (key, value)):
            scale.copy_(head_scales(x, head_dim=1))

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

    def values(self, pages: int) -> PoolPair:
        """The first `pages` pages of K and V as the values they hold (a scaled cache dequantized,
        in float32: exact)."""
        k, v = self.k[:pages], self.v[:pages]
        if self.scales is None:
            return k, v
        return tuple(x.float() * s.view(1, 1, -1, 1) for x, s in zip((k, v), self.scales))


def allocate(serving: ServingInfo, info: KindInfo, like: torch.Tensor) -> tuple[PoolPair, PoolPair | None]:
    """A layer's zeroed K and V pools, in the set's cache dtype (else `like`'s) on `like`'s device, and
    a scaled cache's scales ((hkv,) float32 each, ones until a prefill sets them), else None."""
    scaled = dtypes.DTYPES[serving.kv_cache_dtype].quantized
    shape = (serving.pages + 1, serving.page_size, info.kv_heads, info.head_dim)
    dtype = dtypes.torch_dtype(serving.kv_cache_dtype) if scaled else like.dtype
    pools = tuple(torch.zeros(shape, dtype=dtype, device=like.device) for _ in range(2))
    if not scaled:
        return pools, None
    ones = torch.ones(info.kv_heads, dtype=torch.float32, device=like.device)
    return pools, (ones, ones.clone())


def head_scales(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(hkv,) float32 scales for `x`'s rows, its KV heads along `head_dim`: amax / 448 times
    KV_SCALE_HEADROOM, on the device (no host read)."""
    dims = tuple(i for i in range(x.dim()) if i != head_dim)
    amax = x.detach().float().abs().amax(dim=dims)
    return (amax * (KV_SCALE_HEADROOM / dtypes.E4M3_MAX)).clamp_min(MIN_KV_SCALE)


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(..., hkv, d) into e4m3 with a scale per head: x * (1 / scale) in float32, rounded to nearest
    even, saturated to +-448: what the plans' kv_append computes."""
    inverse = (1.0 / scale.float()).view(-1, 1)
    return (x.float() * inverse).clamp(-dtypes.E4M3_MAX, dtypes.E4M3_MAX).to(torch.float8_e4m3fn)
