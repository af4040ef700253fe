"""Stage 4: compile each kernel variant with the CuTe DSL for sm_90a, on a machine without a GPU.

Nothing real is needed: pointers and scalars are stand-ins whose types (and alignment) are all
the DSL uses. The parameter ABI the runtime will pack is checked against the PTX entry's own
signature, so a kernel edit that changes its parameters fails here, not on the GPU.
"""

import importlib.metadata
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from frostc.errors import FrostcError
from frostc.resolve import KernelVariant

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


def _compile_sdpa(variant: KernelVariant) -> CompiledKernel:
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_ptr
    from cutlass.cute.typing import AddressSpace

    from frostc.kernels.sdpa_common import param_list

    dtype = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}[variant.dtype]
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


_PTX_KIND = {"ptr": r"\.u64 \.ptr", "i32": r"\.u32", "i64": r"\.u64(?! \.ptr)", "f32": r"\.f32"}


def check_abi(name: str, ptx: str, entry: str, params: tuple[tuple[str, str], ...]) -> None:
    """Compare the declared parameter list with the PTX `.entry` signature, one by one."""
    match = re.search(rf"\.entry {re.escape(entry)}\((.*?)\)", ptx, re.S)
    if not match:
        raise CompileError(f"{name}: entry {entry} not found in the PTX")
    declared = [line.strip() for line in match.group(1).split(",") if line.strip()]
    if len(declared) != len(params):
        raise CompileError(f"{name}: the PTX entry has {len(declared)} parameters, the ABI lists {len(params)}")
    for i, ((pname, kind), text) in enumerate(zip(params, declared)):
        if not re.match(rf"\.param {_PTX_KIND[kind]}\b", text):
            raise CompileError(f"{name}: parameter {i} ({pname}) is declared {kind} but the PTX has {text!r}")
