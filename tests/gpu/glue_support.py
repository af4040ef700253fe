"""The glue plans' buffers and float64 check, shared by tests/gpu/test_glue.py and
bench/sanitize.py: fresh random rows with a few outlier channels, outputs poisoned (NaN) with a
NaN canary row on each side, and the bound of a kernel that rounds twice to bf16 as HF's code
does: 2^-7 of the float64 value's magnitude, plus 1e-6."""

from __future__ import annotations

from dataclasses import dataclass

import torch

BOUND = 2.0**-7


@dataclass(frozen=True)
class GlueCase:
    op: str  # "rms_norm" | "add_rms_norm" | "silu_mul"
    rows: int
    n: int  # the norm's row, or the activation's output row (its input holds 2n)
    eps: float = 1e-5

    @property
    def id(self) -> str:
        return f"{self.op}-m{self.rows}-n{self.n}"


def glue_description(case: GlueCase):
    """The case as a description (what `frostc from-config --glue` writes for a decode bucket)."""
    from frostc.description import GraphBuilder

    g = GraphBuilder(f"glue-{case.id}")
    if case.op == "silu_mul":
        g.tensor("x", dtype="bf16", dims=[case.rows, 2 * case.n])
        g.tensor("out", dtype="bf16", dims=[case.rows, case.n])
        g.node("silu_mul", name="act", x="x", out="out")
        return g.build()
    rows = dict(dtype="bf16", dims=[case.rows, case.n])
    g.tensor("x", **rows)
    g.tensor("weight", dtype="bf16", dims=[case.n])
    g.tensor("out", **rows)
    added = {}
    if case.op == "add_rms_norm":
        g.tensor("residual", **rows)
        g.tensor("residual_out", **rows)
        added = dict(residual="residual", residual_out="residual_out")
    g.node("rms_norm", name="norm", x="x", weight="weight", out="out", eps=case.eps, **added)
    return g.build()


def _rows(rows: int, n: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, n, generator=g, dtype=torch.float64)
    x[:, torch.randperm(n, generator=g)[:4]] *= 30  # a few outlier channels, as real activations have
    return x.to(torch.bfloat16)


def _guarded(rows: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN-poisoned (rows, n) output inside a buffer with a NaN canary row on each side."""
    whole = torch.full((rows + 2, n), torch.nan, dtype=torch.bfloat16, device="cuda")
    return whole, whole[1:-1]


class GlueBuffers:
    """One glue plan's inputs and guarded outputs; `execute`, then `assert_correct` (returns the
    worst element's error as a fraction of the bound)."""

    def __init__(self, case: GlueCase, plan, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.case, self.plan = case, plan
        self.inputs: dict[str, torch.Tensor] = {}
        self.guarded: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if case.op == "silu_mul":
            self.inputs["x"] = _rows(case.rows, 2 * case.n, g)
            self.guarded["out"] = _guarded(case.rows, case.n)
            return
        self.inputs["x"] = _rows(case.rows, case.n, g)
        self.inputs["weight"] = (torch.rand(case.n, generator=g, dtype=torch.float64) + 0.5).to(torch.bfloat16)
        self.guarded["out"] = _guarded(case.rows, case.n)
        if case.op == "add_rms_norm":
            self.inputs["residual"] = _rows(case.rows, case.n, g)
            self.guarded["residual_out"] = _guarded(case.rows, case.n)

    def execute(self) -> None:
        named = {k: v.cuda() for k, v in self.inputs.items()} | {k: v[1] for k, v in self.guarded.items()}
        self.plan.execute_named(named)

    def expected(self) -> dict[str, torch.Tensor]:
        x = self.inputs["x"].double()
        if self.case.op == "silu_mul":
            gate, up = x[:, : self.case.n], x[:, self.case.n :]
            return {"out": gate / (1 + torch.exp(-gate)) * up}
        want = {}
        if self.case.op == "add_rms_norm":
            x = (x + self.inputs["residual"].double()).to(torch.bfloat16).double()  # the rounded sum, normed
            want["residual_out"] = x
        rms = torch.sqrt((x * x).mean(-1, keepdim=True) + self.case.eps)
        want["out"] = x / rms * self.inputs["weight"].double()
        return want

    def assert_correct(self) -> float:
        worst = 0.0
        for name, want in self.expected().items():
            whole, got = self.guarded[name]
            what = f"{self.case.id} {name}"
            assert torch.isnan(whole[0]).all() and torch.isnan(whole[-1]).all(), f"{what}: a canary row was written"
            assert torch.isfinite(got).all(), f"{what}: an output element was not written"
            ratio = float(((got.double().cpu() - want).abs() / (BOUND * want.abs() + 1e-6)).max())
            assert ratio <= 1.0, f"{what}: an element is {ratio:.2f}x the bound"
            worst = max(worst, ratio)
        return worst
