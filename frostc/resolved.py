"""The resolved plan: what stage 3 (`frostc.resolve`) produces and stages 4 and 5 (`frostc.compile`,
`frostc.planfile`) consume. Nothing is looked up by name after this: buffers are slot indices,
scratch is an offset into the caller's workspace, and every kernel parameter is bound."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from frost_runtime.dtypes import DTYPES
from frost_runtime.schema import NodeRecord

WORKSPACE_ALIGN = 256  # bytes: every region starts at a multiple (the runtime checks the base)


@dataclass(frozen=True)
class Slot:
    """A buffer `execute` takes, at position `index`."""

    index: int
    name: str
    uid: int
    dtype: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    is_output: bool
    align: int  # required base-pointer alignment in bytes


@dataclass(frozen=True)
class WorkspaceRegion:
    """A named piece of the caller's workspace; its bytes are written and read by the plan's
    own launches, in order, on one stream. Nothing needs zeroing beforehand, except a `zeroed`
    region: a counter that must be zero when the launches start and that they leave zero (the
    runtime zeroes it before a binding's first launch and every `execute`)."""

    name: str  # "<node>.<what>", e.g. "attn.tiles"
    offset: int
    bytes: int
    zeroed: bool = False


@dataclass(frozen=True)
class LengthContract:
    """What the plan assumes of a slot of sequence lengths (frost_runtime's schema says more)."""

    slot: int
    kind: str  # "offsets" (prefix sums) | "lengths"
    longest: int
    total: int = 0


@dataclass(frozen=True)
class Arg:
    """One kernel parameter's value: a slot's base pointer or tensor map (slot >= 0), a pointer
    into the workspace (workspace >= 0: the byte offset), or a constant."""

    param: str
    kind: str
    slot: int = -1
    workspace: int = -1
    value: int | float | tuple[int, ...] = 0


@dataclass(frozen=True)
class Workspace:
    """A pointer into the caller's workspace, `offset` bytes from its base: a kernel record's
    pointer (or TMA base) that an op binds to one of the plan's workspace regions."""

    offset: int


def bind(variant: KernelVariant, record: Any) -> tuple[Arg, ...]:
    """Every parameter of `variant` bound from `record`, the kernel's `Args` as its op filled
    them: a pointer (or a tensor map's base) is a slot, a `Workspace` region or None (null: an
    absent tensor the variant never touches); any other parameter is the constant given."""
    from frostc.kernels.interface import element_bytes, element_dtype, leaves

    args = []
    for param, value in leaves(variant, record):
        if param.kind in ("ptr", "tmap"):
            if isinstance(value, Slot):
                # a kernel whose elements are wider or narrower than the buffer's would address
                # the wrong bytes (a tensor map's element type lives only in the plan: no
                # compile sees it); a reinterpretation of the same width (uint8 over e4m3) is fine
                elements = element_dtype(param, variant)
                if element_bytes(elements) != DTYPES[value.dtype].bytes:
                    raise ValueError(
                        f"{variant.name}: {param.name} takes {elements} elements, its slot {value.name!r} "
                        f"holds {value.dtype}"
                    )
                args.append(Arg(param.name, param.kind, slot=value.index))
            elif isinstance(value, Workspace):
                args.append(Arg(param.name, param.kind, workspace=value.offset))
            elif value is None:
                args.append(Arg(param.name, param.kind, value=0))
            else:
                raise ValueError(f"{variant.name}: {param.name} is bound to {value!r}, not a slot or the workspace")
        elif value is None:
            raise ValueError(f"{variant.name}: parameter {param.name} ({param.kind}) has no value; give it one")
        else:
            args.append(Arg(param.name, param.kind, value=value))
    return tuple(args)


class KernelVariant(Protocol):
    """One compiled kernel's compile key and launch facts; each op's kernels provide these."""

    @property
    def name(self) -> str: ...

    @property
    def params(self) -> tuple[tuple[str, str], ...]:
        """The parameter ABI, (name, kind) in order; checked against the PTX entry."""

    @property
    def block(self) -> tuple[int, int, int]: ...

    @property
    def grid_rule(self) -> str:
        """How the grid follows from the shapes, for people (launches hold the numbers)."""

    @property
    def tiles(self) -> dict[str, int]:
        """Named tile parameters, recorded in the plan for `frostc inspect`."""

    @property
    def ctas_per_sm(self) -> int:
        """> 0: persistent; the runtime launches at most SMs * this many CTAs."""

    def kernel(self) -> Any:
        """The DSL kernel object: a `@cute.jit` `__call__`, and `smem_bytes` once compiled."""

    def compile_args(self) -> tuple:
        """Stand-in arguments for `cute.compile(kernel, *args)` (no GPU, no real memory)."""


@dataclass(frozen=True)
class ResolvedLaunch:
    node: str
    variant: KernelVariant
    grid: tuple[int, int, int]
    args: tuple[Arg, ...]  # `bind(variant, record)`
    record: Any  # the kernel's Args as its op filled them: the build encodes the TMA maps from it
    early: bool = False  # starts before the launch ahead of it ends (`frostc.resolve.mark_early_starts`)


def launch(node: str, variant: KernelVariant, grid: tuple[int, int, int], record: Any) -> ResolvedLaunch:
    """A launch of `variant` whose parameters are `record`, the kernel's Args as the op filled
    them by name (`bind`); the build encodes its TMA tensor maps from the same record."""
    return ResolvedLaunch(node, variant, grid, bind(variant, record), record)


@dataclass(frozen=True)
class ResolvedPlan:
    name: str
    target: str
    slots: tuple[Slot, ...]
    launches: tuple[ResolvedLaunch, ...]
    workspace: tuple[WorkspaceRegion, ...] = ()
    lengths: tuple[LengthContract, ...] = ()
    nodes: tuple[NodeRecord, ...] = ()  # what each node computes, in the graph's order (its op's `record`)

    @property
    def workspace_bytes(self) -> int:
        return max((r.offset + r.bytes for r in self.workspace), default=0)

    @property
    def variants(self) -> tuple[KernelVariant, ...]:
        """Distinct kernels, in first-use order."""
        return tuple(dict.fromkeys(launch.variant for launch in self.launches))
