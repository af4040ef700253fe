"""Stage 4: compile each kernel variant with the CuTe DSL for sm_90a, on a machine without a GPU,
and encode each launch's TMA tensor maps.

Nothing real is needed: pointers and scalars are stand-ins whose types (and alignment) are all
the DSL uses, derived from the kernel's argument record (frostc.kernels.interface). The
parameter ABI the runtime will pack is checked against the PTX entry's own signature, so a kernel
edit that changes its parameters fails here, not on the GPU. Each entry is named after its
variant, so its cubin does not depend on the Python that traced it.

Tensor maps: the DSL's host code encodes a TMA descriptor itself (no driver call), so it runs
here, on the CPU, for each launch's extents and strides. Only the global address differs from
call to call; the runtime writes it into the map's first 8 bytes, which is checked here by
encoding every map at two addresses.
"""

import ctypes
import importlib.metadata
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from frost_runtime.schema import PARAM_KINDS, TMAP_ADDRESS_BYTES

from frostc.errors import FrostcError
from frostc.resolved import KernelVariant, ResolvedLaunch

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
    ctas_per_sm: int


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
            _cache[variant] = _compile(variant)
        out[variant] = _cache[variant]
        on_done(variant)
    return out


def _compile(variant: KernelVariant) -> CompiledKernel:
    import cutlass.cute as cute

    import frostc.kernels  # noqa: F401  (sets the DSL's environment before it is first used)
    from frostc.kernels.interface import name_entry

    kernel = variant.kernel()
    name_entry(kernel, variant.name)
    try:
        compiled = cute.compile(kernel, *variant.compile_args())
    except Exception as exc:  # the DSL raises many types; the user needs the variant and the text
        raise CompileError(f"compiling {variant.name} failed: {exc}") from exc
    entries = list(compiled.kernel_info)
    if len(entries) != 1 or not isinstance(compiled.__cubin__, bytes):
        raise CompileError(f"{variant.name}: expected one kernel and its cubin, got entries {entries}")
    params = tuple(variant.params)
    check_abi(variant.name, compiled.__ptx__, entries[0], params)
    return CompiledKernel(
        variant=variant,
        entry=entries[0],
        cubin=compiled.__cubin__,
        params=params,
        block=variant.block,
        smem_bytes=kernel.smem_bytes,
        grid_rule=variant.grid_rule,
        tiles=variant.tiles,
        ctas_per_sm=variant.ctas_per_sm,
    )


_PTX_KIND = {
    "ptr": r"\.u64 \.ptr",
    "i32": r"(\.u32|\.align 4 \.b8 \S+\[4\])",  # a one-int struct (a coordinate tensor's extent) too
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


def encode_tensor_maps(launch: ResolvedLaunch) -> dict[str, bytes]:
    """The launch's 128-byte tensor maps with global address zero (patched per call by the
    runtime), keyed by parameter name (`q.tmap`, ...); empty for a kernel that takes none."""
    variant = launch.variant
    names = variant.tensor_map_params
    if not names:
        return {}
    bases = (0x10000, 0x7F00_0000_0000)
    blobs = [_encode(variant, launch.record, base) for base in bases]
    address, rest = TMAP_ADDRESS_BYTES, slice(TMAP_ADDRESS_BYTES.stop, None)
    maps = {}
    for i, name in enumerate(names):
        a, b = (blob[i * TMAP_BYTES : (i + 1) * TMAP_BYTES] for blob in blobs)
        found = tuple(int.from_bytes(x[address], "little") for x in (a, b))
        if a[rest] != b[rest] or found != tuple(base + i * 0x1000 for base in bases):
            raise CompileError(
                f"{variant.name}: the DSL's tensor map {name} does not hold its global address in "
                "bytes 0..7; the runtime could not patch it (a DSL upgrade changed the encoding?)"
            )
        maps[name] = bytes(TMAP_ADDRESS_BYTES.stop) + a[rest]
    return maps


def _encode(variant, record, base: int) -> bytes:
    import cutlass.cute as cute

    if variant not in _encoders:  # compiled once per variant, called for every launch
        try:
            _encoders[variant] = cute.compile(variant.tensor_map_encoder(), *variant.tensor_map_compile_args())
        except Exception as exc:
            raise CompileError(f"compiling the tensor-map encoder of {variant.name} failed: {exc}") from exc
    count = len(variant.tensor_map_params)
    raw = (ctypes.c_uint8 * (count * TMAP_BYTES + 64))()
    out = (ctypes.addressof(raw) + 63) // 64 * 64
    addresses = [base + i * 0x1000 for i in range(count)]
    try:
        _encoders[variant](*variant.tensor_map_args(record, addresses, out))
    except Exception as exc:
        raise CompileError(f"{variant.name}: encoding the tensor maps failed: {exc}") from exc
    return bytes((ctypes.c_uint8 * (count * TMAP_BYTES)).from_address(out))
