"""Stage 5: a resolved plan and its compiled kernels become plan-file bytes, written through the
runtime's schema (the format is defined there, once) and to disk without ever leaving half a file.
"""

import hashlib
import json
import os
import tempfile
from pathlib import Path

from frost_runtime import schema

import frostc
from frostc.compile import MIN_DRIVER, CompiledKernel, dsl_version
from frostc.resolved import Arg, KernelVariant, ResolvedPlan


def assemble(
    plan: ResolvedPlan,
    kernels: dict[KernelVariant, CompiledKernel],
    tensor_maps: list[dict[str, bytes]],
    description: dict,
) -> schema.PlanData:
    """`tensor_maps[i]`: launch i's tensor maps by parameter name (compile.encode_tensor_maps)."""
    variants = plan.variants
    index = {v: i for i, v in enumerate(variants)}
    header = schema.Header(
        name=plan.name,
        frostc_version=frostc.__version__,
        cutlass_dsl_version=dsl_version(),
        target_arch=plan.target,
        min_driver=MIN_DRIVER,
        build_key=build_key(description),
    )
    return schema.PlanData(
        header=header,
        slots=tuple(
            schema.TensorSlot(s.name, s.uid, s.dtype, s.dims, s.strides, s.is_output, s.align) for s in plan.slots
        ),
        kernels=tuple(_kernel(kernels[v]) for v in variants),
        launches=tuple(
            schema.Launch(
                node=launch.node,
                kernel=index[launch.variant],
                grid=launch.grid,
                args=tuple(_arg(a, maps) for a in launch.args),
                early=launch.early,
            )
            for launch, maps in zip(plan.launches, tensor_maps, strict=True)
        ),
        workspace_bytes=plan.workspace_bytes,
        workspace=tuple(schema.WorkspaceRegion(r.name, r.offset, r.bytes, r.zeroed) for r in plan.workspace),
        lengths=tuple(schema.LengthContract(c.slot, c.kind, c.longest, c.total) for c in plan.lengths),
        nodes=plan.nodes,
    )


def _arg(a: Arg, maps: dict[str, bytes]) -> schema.Arg:
    if a.kind == "tmap":  # its address: a slot's buffer, or the workspace (data re-laid there)
        return schema.Arg(slot=a.slot, workspace=a.workspace, tmap=maps[a.param])
    if a.slot >= 0:
        return schema.Arg(slot=a.slot)
    if a.workspace >= 0:
        return schema.Arg(workspace=a.workspace)
    return schema.Arg(value=a.value)


def _kernel(k: CompiledKernel) -> schema.Kernel:
    return schema.Kernel(
        name=k.variant.name,
        entry=k.entry,
        cubin=k.cubin,
        params=tuple(schema.Param(name, kind) for name, kind in k.params),
        block=k.block,
        cluster=(1, 1, 1),
        smem_bytes=k.smem_bytes,
        grid_rule=k.grid_rule,
        tiles=k.tiles,
        ctas_per_sm=k.ctas_per_sm,
    )


def build_key(description: dict) -> str:
    """What a plan depends on: the compiler's own sources, the DSL version and the graph."""
    h = hashlib.sha256()
    for path in sorted(Path(frostc.__file__).parent.rglob("*.py")):
        h.update(path.relative_to(Path(frostc.__file__).parent).as_posix().encode())
        h.update(path.read_bytes())
    h.update(dsl_version().encode())
    h.update(json.dumps(description, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write beside the target, then rename: readers see the old file or the new one, never half."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a plan is an artifact others read
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
