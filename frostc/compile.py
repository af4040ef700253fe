"""Stage 4: compile each kernel variant with the CuTe DSL for sm_90a, on a machine without a GPU,
and encode each launch's TMA tensor maps.

Nothing real is needed: pointers and scalars are stand-ins whose types (and alignment) are all
the DSL uses. The parameter ABI the runtime will pack is checked against the PTX entry's own
signature, so a kernel edit that changes its parameters fails here, not on the GPU.

Tensor maps: the DSL's host code encodes a TMA descriptor itself (no driver call), so it runs
here, on the CPU, for each launch's extents and strides. Only the global address differs from
call to call; the runtime writes it into the map's first 8 bytes, which is checked here by
encoding every map at two addresses.
"""

import importlib.metadata
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from frost_runtime.schema import PARAM_KINDS, TMAP_ADDRESS_BYTES

from frostc.errors import FrostcError
from frostc.kernels.sdpa_common import LOADED
from frostc.resolve import KernelVariant, LaunchShape

MIN_DRIVER = 13000  # CUDA 13.0: the oldest driver these cubins were run on


class CompileError(FrostcError):
    """The DSL failed, or produced something the runtime could not launch."""


@dataclass(frozen=True)
class CompiledKernel:
    variant: KernelVariant
    entry: str
    cubin: bytes = field(repr=False)
    params: tuple[tuple[str, str], ...]
    block: tuple[int, int, int]
    smem_bytes: int
    grid_rule: str
    tiles: dict[str, int]


def dsl_version() -> str:
    return importlib.metadata.version("nvidia-cutlass-dsl")


_cache: dict[KernelVariant, CompiledKernel] = {}


def compile_kernels(
    variants: Iterable[KernelVariant],
    on_start: Callable[[KernelVariant], None] = lambda v: None,
    on_done: Callable[[KernelVariant], None] = lambda v: None,
) -> dict[KernelVariant, CompiledKernel]:
    """Compile each distinct variant once per process (several plans often share kernels)."""
    out = {}
    for variant in variants:
        on_start(variant)
        if variant not in _cache:
            _cache[variant] = _compile_sdpa(variant)
        out[variant] = _cache[variant]
        on_done(variant)
    return out


def _dsl_dtype(name: str):
    import cutlass

    return {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}[name]


def _compile_sdpa(variant: KernelVariant) -> CompiledKernel:
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_ptr
    from cutlass.cute.typing import AddressSpace

    from frostc.kernels.sdpa_common import param_list

    dtype = _dsl_dtype(variant.dtype)
    kernel = variant.module.Kernel(dtype, variant.head_dim, variant.causal, variant.has_lse)

    def pointer(elem, align: int):
        return make_ptr(elem, 0, AddressSpace.gmem, assumed_align=align)

    i32, i64 = cutlass.Int32, cutlass.Int64
    try:
        compiled = cute.compile(
            kernel,
            *(pointer(dtype, 16) for _ in range(4)),
            pointer(cutlass.Float32, 4),
            i32(1),
            i32(1),
            i32(1),
            i32(1),
            i32(1),  # batch, heads_q, seq_q, seq_kv, group
            tuple(i64(8) for _ in range(15)),  # (b, h, s) strides of q, k, v, o, lse
            cutlass.Float32(1.0),
            make_fake_stream(),
        )
    except Exception as exc:  # the DSL raises many types; the user needs the variant and the text
        raise CompileError(f"compiling {variant.name} failed: {exc}") from exc
    entries = list(compiled.kernel_info)
    if len(entries) != 1 or not isinstance(compiled.__cubin__, bytes):
        raise CompileError(f"{variant.name}: expected one kernel and its cubin, got entries {entries}")
    params = tuple(param_list())
    check_abi(variant.name, compiled.__ptx__, entries[0], params)
    tiles = kernel.tiles
    return CompiledKernel(
        variant=variant,
        entry=entries[0],
        cubin=compiled.__cubin__,
        params=params,
        block=(tiles.num_threads, 1, 1),
        smem_bytes=kernel.smem_bytes,
        grid_rule=variant.grid_rule,
        tiles=tiles.as_dict(),
    )


_PTX_KIND = {
    "ptr": r"\.u64 \.ptr",
    "i32": r"\.u32",
    "i64": r"\.u64(?! \.ptr)",
    "f32": r"\.f32",
    "tmap": r"\.align 64 \.b8 \S+\[128\]",
    "i32x3": r"\.align 4 \.b8 \S+\[12\]",
}


def check_abi(name: str, ptx: str, entry: str, params: tuple[tuple[str, str], ...]) -> None:
    """Compare the declared parameter list with the PTX `.entry` signature, one by one."""
    match = re.search(rf"\.entry {re.escape(entry)}\((.*?)\)", ptx, re.S)
    if not match:
        raise CompileError(f"{name}: entry {entry} not found in the PTX")
    declared = [line.strip() for line in match.group(1).split(",") if line.strip()]
    if len(declared) != len(params):
        raise CompileError(f"{name}: the PTX entry has {len(declared)} parameters, the ABI lists {len(params)}")
    for i, ((pname, kind), text) in enumerate(zip(params, declared)):
        if not re.match(rf"\.param {_PTX_KIND[kind]}(?!\w)", text):
            raise CompileError(f"{name}: parameter {i} ({pname}) is declared {kind} but the PTX has {text!r}")


# ------------------------------------------------------------------------------ tensor maps

TMAP_BYTES = PARAM_KINDS["tmap"]
_encoders: dict[KernelVariant, Callable] = {}


def encode_tensor_maps(variant: KernelVariant, shape: LaunchShape) -> dict[str, bytes]:
    """The 128-byte tensor maps of Q, K and V for one launch, global address zero (patched per
    call by the runtime), keyed by parameter name (`q.tmap`, ...)."""
    first = _encode(variant, shape, base=0x10000)
    second = _encode(variant, shape, base=0x7F00_0000_0000)
    address, rest = TMAP_ADDRESS_BYTES, slice(TMAP_ADDRESS_BYTES.stop, None)
    maps = {}
    for i, name in enumerate(LOADED):
        a, b = (blob[i * TMAP_BYTES : (i + 1) * TMAP_BYTES] for blob in (first, second))
        addr_a, addr_b = (int.from_bytes(x[address], "little") for x in (a, b))
        base_a, base_b = (0x10000 + i * 0x1000, 0x7F00_0000_0000 + i * 0x1000)
        if a[rest] != b[rest] or (addr_a, addr_b) != (base_a, base_b):
            raise CompileError(
                f"{variant.name}: the DSL's tensor map for {name} does not hold its global address in "
                "bytes 0..7; the runtime could not patch it (a DSL upgrade changed the encoding?)"
            )
        maps[f"{name}.tmap"] = bytes(TMAP_ADDRESS_BYTES.stop) + a[rest]
    return maps


def _encode(variant: KernelVariant, shape: LaunchShape, base: int) -> bytes:
    import ctypes

    import cutlass
    from cutlass.cute.runtime import make_ptr
    from cutlass.cute.typing import AddressSpace

    if variant not in _encoders:  # compiled once per variant, called for every launch
        _encoders[variant] = _compile_encoder(variant)
    raw = (ctypes.c_uint8 * (len(LOADED) * TMAP_BYTES + 64))()
    out_addr = (ctypes.addressof(raw) + 63) // 64 * 64
    dtype = _dsl_dtype(variant.dtype)
    pointers = [make_ptr(dtype, base + i * 0x1000, AddressSpace.gmem, assumed_align=16) for i in range(len(LOADED))]
    out = make_ptr(cutlass.Uint8, out_addr, AddressSpace.gmem, assumed_align=64)
    strides = tuple(cutlass.Int64(x) for triple in shape.strides for x in triple)
    i32 = cutlass.Int32
    try:
        _encoders[variant](
            *pointers, out, i32(shape.batch), i32(shape.heads_q), i32(shape.seq_q), i32(shape.seq_kv),
            i32(shape.group), strides,
        )  # fmt: skip
    except Exception as exc:
        raise CompileError(f"{variant.name}: encoding the tensor maps failed: {exc}") from exc
    return bytes((ctypes.c_uint8 * (len(LOADED) * TMAP_BYTES)).from_address(out_addr))


def _compile_encoder(variant: KernelVariant):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr
    from cutlass.cute.typing import AddressSpace

    dtype = _dsl_dtype(variant.dtype)
    kernel = variant.module.Kernel(dtype, variant.head_dim, variant.causal, variant.has_lse)
    i32, i64 = cutlass.Int32, cutlass.Int64
    fake = [make_ptr(dtype, 0x10000, AddressSpace.gmem, assumed_align=16) for _ in range(3)]
    out = make_ptr(cutlass.Uint8, 0x10000, AddressSpace.gmem, assumed_align=64)
    try:
        return cute.compile(
            kernel.encode_tensor_maps, *fake, out, i32(1), i32(1), i32(1), i32(1), i32(1),
            tuple(i64(8) for _ in range(15)),
        )  # fmt: skip
    except Exception as exc:
        raise CompileError(f"compiling the tensor-map encoder of {variant.name} failed: {exc}") from exc
