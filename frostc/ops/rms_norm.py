"""The rms_norm op: RMSNorm of rows, optionally after a residual add (a decoder layer's norms).

  x             (m, n)  the rows (bf16 or fp16)
  weight        (n,)    the norm's weight, x's dtype
  out           (m, n)  round(round(x * rsqrt(mean(x^2) + eps)) * weight), in float32
  residual,     (m, n)  optional, together: residual_out = round(x + residual), and `out` is
  residual_out          the norm of that sum (Llama's post-attention norm after its residual add)
  eps           float   the norm's epsilon (Llama-3: 1e-5; the config's rms_norm_eps)

It rounds as Hugging Face's LlamaRMSNorm and its residual add do, so a model's norms can be
served by plans (frost_runtime.hf_fuse) without changing what they compute beyond the mean's
summation order. Rows are contiguous (stride 1 along n, row strides whole 16-byte pieces).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from frost_runtime.dtypes import ATTENTION
from frost_runtime.schema import MAX_GRID, NodeRecord

from frostc.contexts import CheckedTensor, NodeContext, ResolveContext
from frostc.graph import role_slots
from frostc.kernels.rms_norm import MAX_PIECES, THREADS, RmsNormArgs, RmsNormVariant
from frostc.ops.rows import agreeing_sizes, check_row_layout, row_align_elems
from frostc.resolved import ResolvedLaunch, launch

KEYS = ("x", "weight", "out", "residual", "residual_out", "eps")
DATA_DTYPES = ATTENTION
_DIMS = {"x": ("m", "n"), "weight": ("n",), "out": ("m", "n"), "residual": ("m", "n"), "residual_out": ("m", "n")}
_OPTIONAL = ("residual", "residual_out")
_DIM_WORDS = {"m": "rows", "n": "row length"}


@dataclass(frozen=True)
class RmsNorm:
    """A validated rms_norm node."""

    op: ClassVar[str] = "rms_norm"
    name: str
    path: str
    x: str
    weight: str
    out: str
    eps: float
    rows: int
    n: int
    residual: str | None = None
    residual_out: str | None = None

    @property
    def inputs(self) -> tuple[tuple[str, str], ...]:
        given = (("x", self.x), ("residual", self.residual), ("weight", self.weight))
        return tuple((role, name) for role, name in given if name)

    @property
    def outputs(self) -> tuple[tuple[str, str], ...]:
        return tuple((role, name) for role, name in (("out", self.out), ("residual_out", self.residual_out)) if name)

    def record(self, slots: Mapping[str, int]) -> NodeRecord:
        """What the plan records of the node (frost_runtime.schema.NodeRecord)."""
        sizes = {"rows": self.rows, "n": self.n}
        return NodeRecord(self.op, self.name, "", sizes, role_slots(self, slots), {"eps": self.eps})


def validate(ctx: NodeContext) -> RmsNorm | None:
    before = len(ctx.problems)
    if ctx.given("residual") != ctx.given("residual_out"):
        have, lack = ("residual", "residual_out") if ctx.given("residual") else ("residual_out", "residual")
        ctx.problem(lack, f"missing: {have} is given; a residual add needs both residual and residual_out (or neither)")
    tensors: dict[str, CheckedTensor] = {}
    for role, names in _DIMS.items():
        c = ctx.tensor(
            role,
            letters="".join(names),
            dims=f"({', '.join(names)})" if len(names) > 1 else f"({names[0]},)",
            output=role in ("out", "residual_out"),
            required=role not in _OPTIONAL,
        )
        if c is not None:
            tensors[role] = c
    sizes = _check_shapes(tensors, ctx)
    _check_dtypes(tensors, ctx)
    eps = ctx.positive_float("eps", "the config's rms_norm_eps, e.g. 1e-5")
    if not ctx.given("eps"):
        ctx.problem("eps", "missing; give the norm's epsilon, the config's rms_norm_eps (Llama-3: 1e-5)")
    if len(ctx.problems) > before or ctx.name is None or sizes is None or eps is None:
        return None
    return RmsNorm(
        name=ctx.name,
        path=ctx.path,
        x=ctx.value("x"),
        weight=ctx.value("weight"),
        out=ctx.value("out"),
        eps=eps,
        rows=sizes["m"],
        n=sizes["n"],
        residual=ctx.value("residual"),
        residual_out=ctx.value("residual_out"),
    )


def _check_shapes(tensors: dict[str, CheckedTensor], ctx: NodeContext) -> dict[str, int] | None:
    sizes, _, ok = agreeing_sizes(tensors, _DIMS, _DIM_WORDS, ctx, optional=_OPTIONAL)
    return sizes if ok else None


def _check_dtypes(tensors: dict[str, CheckedTensor], ctx: NodeContext) -> None:
    x = tensors.get("x")
    x_dtype = x.dtype if x is not None and x.dtype in DATA_DTYPES else None
    for role, c in tensors.items():
        if c.dtype is None:
            continue
        if c.dtype not in DATA_DTYPES:
            message = f'rms_norm {role} must be {" or ".join(DATA_DTYPES)}, got "{c.dtype}"'
            ctx.problems_at(c.at("dtype"), message + f'; write dtype = "{x_dtype or DATA_DTYPES[0]}"')
        elif x_dtype is not None and c.dtype != x_dtype:
            message = f"{c.dtype} does not match x's {x_dtype}; every rms_norm tensor has x's dtype"
            ctx.problems_at(c.at("dtype"), message + f': dtype = "{x_dtype}"')


def resolve(node: RmsNorm, ctx: ResolveContext) -> tuple[ResolvedLaunch, ...]:
    before = len(ctx.problems)
    _check_supported(node, ctx)
    if len(ctx.problems) > before:
        return ()
    variant = RmsNormVariant(ctx.slot(node.x).dtype, node.n, node.residual is not None)
    slots = {role: ctx.slot(name) for role, name in node.inputs + node.outputs}
    x, residual, out, residual_out = (slots.get(role) for role in ("x", "residual", "out", "residual_out"))

    def row_stride(slot) -> int:  # 0 for one row, or an absent tensor: never stepped
        return slot.strides[0] if slot is not None and node.rows > 1 else 0

    args = RmsNormArgs(
        x, residual, slots["weight"], out, residual_out,
        x_stride=row_stride(x), residual_stride=row_stride(residual), out_stride=row_stride(out),
        residual_out_stride=row_stride(residual_out), eps=node.eps,
    )  # fmt: skip
    return (launch(node.name, variant, (node.rows, 1, 1), args),)


def _check_supported(node: RmsNorm, ctx: ResolveContext) -> None:
    x = ctx.tensor(node.x)
    align = row_align_elems(x.dtype)
    longest = THREADS * MAX_PIECES * align
    if node.n % align or node.n > longest:
        ctx.problem(
            f"{x.path}.dims[1]",
            f"row length {node.n}: the kernel takes rows of a multiple of {align} elements (16 bytes), "
            f"at most {longest}",
        )
    for name in (node.x, node.out, node.residual, node.residual_out):
        if name is not None:
            check_row_layout(ctx.tensor(name), "mn", '"mn" (rows contiguous)', ctx)
    weight = ctx.tensor(node.weight)
    if node.n > 1 and weight.strides[0] != 1:
        message = f"stride {weight.strides[0]}: the weight must be contiguous (stride 1)"
        ctx.problem(f"{weight.path}.strides[0]", message)
    if node.rows > MAX_GRID[0]:
        ctx.problem(f"{x.path}.dims[0]", f"{node.rows} rows are over {MAX_GRID[0]}, a launch's grid x; split them")
