"""The pipeline, stage by stage:

    description --validate--> graph --resolve--> resolved plan --compile--> kernels + tensor maps
        --assemble--> plan file

Each stage is a module of its own; this one only runs them in order, reports progress and,
with `dump_dir`, writes each stage's text form so every stage can be read and tested alone.
"""

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from frost_runtime import schema

from frostc.compile import compile_kernels, encode_tensor_maps
from frostc.description import Description, to_toml
from frostc.errors import FrostcError
from frostc.planfile import assemble
from frostc.resolve import resolve
from frostc.resolved import KernelVariant
from frostc.validate import validate

Progress = Callable[[str, KernelVariant], None]  # ("start" | "done", variant)


class PlanLimitError(FrostcError):
    """The compiled plan breaks a limit of the plan format that validation and resolution did
    not catch (a frostc bug: they should have refused the description, with its field path)."""


def build(desc: Description, progress: Progress | None = None, dump_dir: str | Path | None = None) -> bytes:
    """Run every stage; return the plan file's bytes."""
    report = progress or (lambda event, variant: None)
    graph = validate(desc)
    resolved = resolve(graph)
    kernels = compile_kernels(
        resolved.variants,
        on_start=lambda v: report("start", v),
        on_done=lambda v: report("done", v),
    )
    tensor_maps = [encode_tensor_maps(launch) for launch in resolved.launches]
    plan = assemble(resolved, kernels, tensor_maps, desc.to_dict())
    data = _encode_checked(plan)
    if dump_dir is not None:
        _dump(Path(dump_dir), desc, graph, resolved, kernels)
    return data


def _encode_checked(plan: schema.PlanData) -> bytes:
    """The plan's bytes, read back by the runtime's own reader: a plan frostc writes is one the
    runtime loads, or the build fails here, naming the field (never at load, on a GPU machine)."""
    try:
        data = schema.encode_plan(plan)
        schema.decode_plan(data)
    except (schema.PlanFormatError, OverflowError, UnicodeEncodeError, ValueError) as exc:
        raise PlanLimitError(
            f"the plan would break the plan format ({exc}); frostc should have refused the description "
            "before compiling: please report this with the description, and make the tensors named there smaller"
        ) from None
    return data


def _dump(folder: Path, desc, graph, resolved, kernels) -> None:
    """One file per stage, named for it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "1-description.toml").write_text(to_toml(desc))
    (folder / "2-graph.json").write_text(_json(graph))
    (folder / "3-resolved.json").write_text(_json(resolved))
    for variant, k in kernels.items():
        (folder / f"4-{variant.name}.cubin").write_bytes(k.cubin)


def _json(obj) -> str:
    return json.dumps(_plain(obj), indent=2, default=str) + "\n"


def _plain(obj):
    """Dataclasses as dicts with their kind, and (for nodes) what they read and write."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {"kind": type(obj).__name__}
        out |= {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if hasattr(obj, "name") and not isinstance(obj, (str,)) and hasattr(type(obj), "inputs"):
            out |= {"op": obj.op, "inputs": list(obj.inputs), "outputs": list(obj.outputs)}
        if hasattr(type(obj), "params") and hasattr(obj, "tiles"):  # a kernel variant
            out |= {"name": obj.name, "tiles": obj.tiles}
        return out
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    return obj
