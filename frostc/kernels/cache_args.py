"""Argument groups of the kernels that read or write a paged KV cache (kv_append.py,
sdpa_decode_paged.py): the caches' strides and a quantized cache's scales."""

from dataclasses import dataclass

from frost_runtime.dtypes import DTYPES

from frostc.kernels.interface import I64, Facets, Group, Ptr, abi, pointer


def quantized(variant) -> bool:
    """Whether the variant's caches are quantized (e4m3, with float32 scales)."""
    return DTYPES[variant.kv_cache_dtype].quantized


@dataclass(frozen=True)
class PshStrides(Facets):
    """A paged cache's (page, row, head) element strides."""

    stride_p: I64
    stride_s: I64
    stride_h: I64


@dataclass(frozen=True)
class CacheScales(Group):
    """A quantized cache's float32 scales: one per KV head, or one for all."""

    k_scale: Ptr = pointer("fp32", align=4)
    v_scale: Ptr = pointer("fp32", align=4)


@dataclass(frozen=True)
class CacheScaleStrides(Group):
    """The scales' head strides: 1 (one per KV head) or 0 (one for all)."""

    k_scale: I64 = abi("k_scale.stride_h")
    v_scale: I64 = abi("v_scale.stride_h")
