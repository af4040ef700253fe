"""The element types, defined once: what every stage of frostc and the runtime knows of a dtype
derives from this table (the names a description and a plan use, the element size, a slot's
pointer alignment, the __cuda_array_interface__ and torch forms, the Hugging Face config name,
the CuTe DSL type, whether attention's data tensors may have it, and whether a paged KV cache
may, with scale factors). Adding a dtype is a row here, plus the kernels that support it and
their tests.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # in descriptions, plans and plan sets: "bf16"
    bytes: int  # per element
    align: int  # a slot's base pointer, in bytes (16: tensor maps and 16-byte row pieces)
    typestr: str  # __cuda_array_interface__
    torch: str  # the torch dtype's attribute name: "bfloat16"
    dsl: str  # the CuTe DSL type's name in `cutlass`: "BFloat16"
    hf: str | None  # a Hugging Face config's torch_dtype / dtype value, None for none
    attention: bool  # q, k, v, o and the caches may have it
    quantized: bool = False  # a paged KV cache may hold it as x / scale, with float32 scales


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("bf16", 2, 16, "<V2", "bfloat16", "BFloat16", "bfloat16", True),
        DType("fp16", 2, 16, "<f2", "float16", "Float16", "float16", True),
        DType("fp32", 4, 4, "<f4", "float32", "Float32", "float32", False),
        DType("int32", 4, 4, "<i4", "int32", "Int32", None, False),
        DType("e4m3", 1, 16, "|V1", "float8_e4m3fn", "Float8E4M3FN", None, False, quantized=True),
    )
}
NAMES = tuple(DTYPES)
ATTENTION = tuple(name for name, d in DTYPES.items() if d.attention)  # data tensors of sdpa and kv_append
QUANTIZED_CACHE = tuple(name for name, d in DTYPES.items() if d.quantized)  # a paged cache's quantized forms
KV_CACHE = ATTENTION + QUANTIZED_CACHE  # a paged cache's elements
SCALE_DTYPE = "fp32"  # a quantized cache's scale factors
E4M3_MAX = 448.0  # the largest finite float8_e4m3fn: quantizing saturates to it
ELEMENT_BYTES = {name: d.bytes for name, d in DTYPES.items()}


def is_quantized(name: str | None) -> bool:
    """Whether `name` is a dtype a paged cache holds quantized (any other name: False)."""
    return name in DTYPES and DTYPES[name].quantized


def torch_dtype(name: str):
    """The torch dtype of `name` (imports torch)."""
    import torch

    return getattr(torch, DTYPES[name].torch)


_BY_TORCH_NAME = {f"torch.{d.torch}": name for name, d in DTYPES.items()}


def from_torch(dtype) -> str | None:
    """The table's name of a torch dtype, None for one it lacks (no torch import)."""
    return _BY_TORCH_NAME.get(str(dtype))
