"""The silu_mul op: a SwiGLU MLP's activation, SiLU of the gate half times the up half.

  x    (m, 2n)  a fused gate-up projection's output: the gate in [0, n), up in [n, 2n)
  out  (m, n)   round(round(silu(gate)) * up), in float32

It rounds as the unfused `F.silu(gate) * up` does (after the SiLU, after the product), so a
model's activations can be served by a plan (frost_runtime.hf_fuse) in one kernel instead of
two. Rows are contiguous (stride 1 along the columns, row strides whole 16-byte pieces).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from frost_runtime.dtypes import ATTENTION
from frost_runtime.schema import MAX_GRID, NodeRecord

from frostc.contexts import CheckedTensor, NodeContext, ResolveContext
from frostc.graph import role_slots
from frostc.kernels.silu_mul import SiluMulArgs, SiluMulVariant
from frostc.ops.rows import check_row_layout, row_align_elems
from frostc.resolved import ResolvedLaunch, launch

KEYS = ("x", "out")
DATA_DTYPES = ATTENTION


@dataclass(frozen=True)
class SiluMul:
    """A validated silu_mul node."""

    op: ClassVar[str] = "silu_mul"
    name: str
    path: str
    x: str
    out: str
    rows: int
    n: int  # out's columns: half of x's

    @property
    def inputs(self) -> tuple[tuple[str, str], ...]:
        return (("x", self.x),)

    @property
    def outputs(self) -> tuple[tuple[str, str], ...]:
        return (("out", self.out),)

    def record(self, slots: Mapping[str, int]) -> NodeRecord:
        """What the plan records of the node (frost_runtime.schema.NodeRecord)."""
        return NodeRecord(self.op, self.name, "", {"rows": self.rows, "n": self.n}, role_slots(self, slots))


def validate(ctx: NodeContext) -> SiluMul | None:
    before = len(ctx.problems)
    x = ctx.tensor("x", letters="mk", dims="(m, 2n)")
    out = ctx.tensor("out", letters="mn", dims="(m, n)", output=True)
    sizes = _check_shapes(x, out, ctx)
    _check_dtypes(x, out, ctx)
    if len(ctx.problems) > before or ctx.name is None or sizes is None:
        return None
    return SiluMul(name=ctx.name, path=ctx.path, x=ctx.value("x"), out=ctx.value("out"), rows=sizes[0], n=sizes[1])


def _check_shapes(x: CheckedTensor | None, out: CheckedTensor | None, ctx: NodeContext) -> tuple[int, int] | None:
    if x is None or out is None or x.dims is None or out.dims is None:
        return None
    ok = True
    if x.dims[0] != out.dims[0]:
        ctx.problems_at(out.at("dims[0]"), f"rows {out.dims[0]} do not match x's {x.dims[0]}; make them equal")
        ok = False
    if x.dims[1] != 2 * out.dims[1]:
        message = (
            f"x has {x.dims[1]} columns, out {out.dims[1]}: x holds the gate and the up projection side by side, "
            f"twice out's columns ({2 * out.dims[1]})"
        )
        ctx.problems_at(x.at("dims[1]"), message)
        ok = False
    return (out.dims[0], out.dims[1]) if ok else None


def _check_dtypes(x: CheckedTensor | None, out: CheckedTensor | None, ctx: NodeContext) -> None:
    x_dtype = x.dtype if x is not None and x.dtype in DATA_DTYPES else None
    for role, c in (("x", x), ("out", out)):
        if c is None or c.dtype is None:
            continue
        if c.dtype not in DATA_DTYPES:
            message = f'silu_mul {role} must be {" or ".join(DATA_DTYPES)}, got "{c.dtype}"'
            ctx.problems_at(c.at("dtype"), message + f'; write dtype = "{x_dtype or DATA_DTYPES[0]}"')
        elif x_dtype is not None and c.dtype != x_dtype:
            ctx.problems_at(c.at("dtype"), f'{c.dtype} does not match x\'s {x_dtype}: dtype = "{x_dtype}"')


def resolve(node: SiluMul, ctx: ResolveContext) -> tuple[ResolvedLaunch, ...]:
    before = len(ctx.problems)
    x = ctx.tensor(node.x)
    align = row_align_elems(x.dtype)
    if node.n % align:
        message = f"each half of x's {2 * node.n} columns must be a multiple of {align} elements"
        ctx.problem(f"{x.path}.dims[1]", message)
    for name, letters in ((node.x, "mk"), (node.out, "mn")):
        check_row_layout(ctx.tensor(name), letters, f'"{letters}" (rows contiguous)', ctx)
    variant = SiluMulVariant(x.dtype, node.n)
    if node.rows > MAX_GRID[0]:
        ctx.problem(f"{x.path}.dims[0]", f"{node.rows} rows are over {MAX_GRID[0]}, a launch's grid x; split them")
    if len(ctx.problems) > before:
        return ()
    x, out = ctx.slot(node.x), ctx.slot(node.out)
    args = SiluMulArgs(x, out, x_stride=_row_stride(x, node), out_stride=_row_stride(out, node))
    return (launch(node.name, variant, (node.rows, variant.row_ctas, 1), args),)


def _row_stride(slot, node: SiluMul) -> int:
    """A row's stride; 0 for one row (never stepped: any value passes the kernel's assumption)."""
    return slot.strides[0] if node.rows > 1 else 0
