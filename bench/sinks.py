"""Attention sinks' cost (issue 44's bar: at most 2 %): frostc's forward plans on gpt-oss's
attention shapes with and without `sinks`, one run.

    python bench/sinks.py build                          # CPU machine: the plans, into bench/.built/sinks
    python bench/sinks.py run [--md FILE] [--json FILE]  # GPU machine: time both, print a table

gpt-oss's attention: head dim 64, 64 query heads over 8 KV heads, layers alternating between a
sliding window of 128 keys and full causal attention; bf16, BSHD (its q, k, v come out of the
projections so). Each row times the two plans of one shape (the same inputs, the sink logits
random around the scores' range) through the serving path (`plan.bind`, `bound.execute()`) by
CUDA-graph replays, medians of rotated rounds (bench/common.py); the plan with sinks is checked
against a float64 reference on its first 256 rows of every head before it is timed.
"""

import math
import sys

import common

BUILT = common.BUILT / "sinks"
HEADS_Q, HEADS_KV, HEAD_DIM, WINDOW = 64, 8, 64, 128  # gpt-oss-20b / 120b
SHAPES = [(1, 4096), (1, 16384), (4, 2048)]  # (batch, sequence length)
MASKS = ("causal", "window")  # gpt-oss's full layers, and its sliding ones (window_left = 127)


def plan_name(shape, mask: str, sinks: bool) -> str:
    b, s = shape
    return f"gptoss-b{b}-s{s}-{mask}" + ("-sinks" if sinks else "")


def description(shape, mask: str, sinks: bool):
    from frostc import GraphBuilder

    b, s = shape
    g = GraphBuilder(plan_name(shape, mask, sinks))
    for t, heads in (("q", HEADS_Q), ("k", HEADS_KV), ("v", HEADS_KV), ("o", HEADS_Q)):
        g.tensor(t, dtype="bf16", dims=(b, heads, s, HEAD_DIM), layout="bshd")
    if sinks:
        g.tensor("sinks", dtype="fp32", dims=(HEADS_Q,))
    g.sdpa(q="q", k="k", v="v", o="o", causal=True, window_left=WINDOW - 1 if mask == "window" else None,
           sinks="sinks" if sinks else None)  # fmt: skip
    return g.build()


def build() -> int:
    for shape in SHAPES:
        for mask in MASKS:
            for sinks in (False, True):
                common.write_plan(BUILT / f"{plan_name(shape, mask, sinks)}.frost", description(shape, mask, sinks))
    return 0


def run(md=None, json_path=None) -> int:
    import frost_runtime

    rows = []
    for shape in SHAPES:
        for mask in MASKS:
            plans = {sinks: frost_runtime.load(BUILT / f"{plan_name(shape, mask, sinks)}.frost") for sinks in (0, 1)}
            rows.append(_measure(plans, shape, mask))
            r = rows[-1]
            print(f"{shape} {mask}: without {r['ms']['without']:.3f} ms, with {r['ms']['with']:.3f} ms, "
                  f"cost {r['cost']:+.2%}, rel. err {r['rel_err']:.1e}", flush=True)  # fmt: skip
    common.publish(_markdown(rows, common.machine()), rows, md, json_path)
    return 0


def _measure(plans, shape, mask: str) -> dict:
    import torch

    b, s = shape
    q = torch.randn(b, s, HEADS_Q, HEAD_DIM, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(b, s, HEADS_KV, HEAD_DIM, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in "kv")
    sinks = torch.randn(HEADS_Q, device="cuda") * 2 + 1
    outs = {x: torch.full_like(q, float("nan")) for x in (0, 1)}
    bound = {
        0: plans[0].bind(q, k, v, outs[0], workspace=plans[0].allocate_workspace()),
        1: plans[1].bind(q, k, v, sinks, outs[1], workspace=plans[1].allocate_workspace()),
    }
    for call in bound.values():
        call.execute()
    torch.cuda.synchronize()
    err = _checked(q, k, v, sinks, outs[1], mask, shape)
    times = common.alternating({"without": bound[0].execute, "with": bound[1].execute})
    return {"shape": shape, "mask": mask, "ms": times, "cost": times["with"] / times["without"] - 1, "rel_err": err}


def _checked(q, k, v, sinks, o, mask: str, shape) -> float:
    """The sinks plan's first 256 rows of every head against float64; raises past 2e-2."""
    import torch

    rows = min(256, q.shape[2])
    group = HEADS_Q // HEADS_KV
    i = torch.arange(rows, device="cuda")[:, None]
    j = torch.arange(q.shape[2], device="cuda")[None, :]
    allowed = (j <= i) & ((j > i - WINDOW) if mask == "window" else True)
    num = den = 0.0
    for h in range(HEADS_Q):
        s = (q[0, h, :rows].double() @ k[0, h // group].double().T) / math.sqrt(HEAD_DIM)
        s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logaddexp(torch.logsumexp(s, -1), sinks[h].double().expand(rows))
        ref = torch.exp(s - lse[:, None]) @ v[0, h // group].double()
        num += float((o[0, h, :rows].double() - ref).norm() ** 2)
        den += float(ref.norm() ** 2)
    err = math.sqrt(num / den)
    if not err < 2e-2:
        raise SystemExit(f"{plan_name(shape, mask, True)}: differs from float64 (relative error {err:.2e})")
    return err


def _markdown(rows, machine: str) -> str:
    worst = max(r["cost"] for r in rows)
    lines = [
        f"Attention sinks' cost, gpt-oss's attention (d {HEAD_DIM}, {HEADS_Q} query heads over {HEADS_KV} KV heads, "
        f"bf16, BSHD) — {machine}. Device ms from CUDA-graph replays, each plan's median of {common.ROUNDS} "
        "rotated rounds; window: gpt-oss's sliding layers (128 keys).",
        "",
        "| b, s | mask | without sinks, ms | with sinks, ms | cost | rel. err (float64) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        b, s = r["shape"]
        lines.append(f"| {b}, {s} | {r['mask']} | {r['ms']['without']:.3f} | {r['ms']['with']:.3f} | "
                     f"{r['cost']:+.1%} | {r['rel_err']:.1e} |")  # fmt: skip
    lines += ["", f"Worst cost: {worst:+.1%} (issue 44's bar: at most +2 %)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(common.main(__doc__, build, run))
