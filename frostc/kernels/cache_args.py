"""Argument groups of the kernels over a paged KV cache (kv_append.py, sdpa_decode_paged.py,
sdpa_decode_combine.py): the caches' strides, a quantized cache's scales, and the mixed form's
packed queries."""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from frost_runtime.dtypes import DTYPES

from frostc.kernels.interface import I32, I64, Facets, Group, Ptr, abi, pointer


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


def head_scales(scales: CacheScales, strides: CacheScaleStrides, head_kv):
    """(K's scale, V's scale) of KV head `head_kv`, read on the device (a stride of 0: the one
    scale of every head)."""
    one = cute.make_layout(1)
    k = cute.make_tensor(scales.k_scale + cutlass.Int64(head_kv) * strides.k_scale, one)[0]
    v = cute.make_tensor(scales.v_scale + cutlass.Int64(head_kv) * strides.v_scale, one)[0]
    return k, v


def packed(variant) -> bool:
    """Whether the variant's queries are packed (the mixed form: any mix of chunks and decodes)."""
    return variant.packed


@dataclass(frozen=True)
class PackedQueries(Group):
    """The mixed form's queries: sequence b's are tokens cu_seqlens_q[b] .. cu_seqlens_q[b + 1] of
    q, o and lse (at most `tokens` in all); a sequence's new tokens are the last of its keys."""

    cu_seqlens_q: Ptr = pointer("int32", align=4)
    tokens: I32
