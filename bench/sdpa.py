"""SDPA forward throughput: frostc plans beside torch SDPA's cuDNN and flash backends, one run.

    python bench/sdpa.py build                          # CPU machine: compile the plans into bench/.built
    python bench/sdpa.py run [--md FILE] [--json FILE]  # GPU machine: time everything, print a table
    python bench/sdpa.py run --head-dims 96             # only the rows of these head dims (q's and k's)
    SDPA_PLANS=DIR python bench/sdpa.py run ...         # frostc's plans from another folder (bench/tile_trials.py)

Each row: bf16, BHSD, one (batch, heads, seq, head dim) shape, causal or not (a fifth dim: v's
and o's head dim where it is not q's and k's, DeepSeek's 192 / 128); frostc runs its
serving path (`plan.bind` once, `bound.execute()`). Times are device times from CUDA-graph
replays in the power-capped steady state (bench/common.py's `time_ms`), so no contestant's host
overhead is counted; each contestant is measured ROUNDS times in rotated order and its median
reported (`alternating`); TFLOP/s counts 4*b*h*s*s*d matmul FLOPs (half of that when causal; d is
(d_qk + d_v) / 2 where they differ). torch's flash backend takes one head dim: "-" where they differ.
frostc's output is checked against the cuDNN backend's on every timed shape before its time is
reported.
"""

import os
import statistics
import sys
from pathlib import Path

import common
from frost_runtime.timing import SETTLE_S, WINDOW_S

SHAPES = [
    (16, 16, 512, 128),
    (8, 16, 1024, 128),
    (4, 16, 2048, 128),
    (2, 16, 4096, 128),
    (1, 16, 8192, 128),
    (1, 16, 16384, 128),
    (4, 32, 2048, 64),
    (2, 16, 4096, 64),
    (2, 16, 4096, 256),
    (2, 32, 4096, 96),  # Phi-3-mini's heads (32, MHA) at head dim 96
    (1, 32, 16384, 96),
    (2, 16, 4096, 192, 128),  # DeepSeek-V3's prefill (q/k 192, v 128), its 128 heads over 8 GPUs
    (1, 16, 16384, 192, 128),
]


def dims(shape) -> tuple[int, int, int, int, int]:
    """(b, h, s, d, d_v) of a shape: d_v, v's and o's head dim, is d unless given fifth."""
    b, h, s, d, *value = shape
    return b, h, s, d, value[0] if value else d


def plan_name(shape, causal: bool) -> str:
    b, h, s, d, dv = dims(shape)
    return f"b{b}-h{h}-s{s}-d{d}{f'v{dv}' if dv != d else ''}-{'causal' if causal else 'full'}"


def build() -> int:
    for shape in SHAPES:
        b, h, s, d, dv = dims(shape)
        for causal in (False, True):
            name = plan_name(shape, causal)
            desc = common.dense_description(name, (b, h, s, d), causal, dv)
            common.write_plan(common.BUILT / f"{name}.frost", desc)
    return 0


# SDPA_PLANS: the same plans built another way (bench/tile_trials.py's candidates), for an A/B
PLANS = Path(os.environ.get("SDPA_PLANS", common.BUILT))


def run(md=None, json_path=None, head_dims: str | None = None) -> int:
    import frost_runtime

    rows = []
    wanted = {int(d) for d in head_dims.split(",")} if head_dims else None
    for shape in SHAPES:
        if wanted is not None and shape[3] not in wanted:  # q's and k's head dim
            continue
        for causal in (False, True):
            rows.append(_measure(frost_runtime.load(PLANS / f"{plan_name(shape, causal)}.frost"), shape, causal))
            print(_row(rows[-1]), flush=True)

    common.publish(_markdown(rows, common.machine()), rows, md, json_path)
    return 0


def _measure(plan, shape, causal: bool) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d, dv = dims(shape)
    q, k = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(b, h, s, dv, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(v)
    flops = 2 * b * h * s * s * (d + dv) / (2 if causal else 1)

    def torch_sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return call

    ref = torch_sdpa(SDPBackend.CUDNN_ATTENTION)()
    o.fill_(float("nan"))
    bound = plan.bind(q, k, v, o, workspace=plan.allocate_workspace())  # the serving path
    bound.execute()
    torch.cuda.synchronize()
    err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
    if not err < 2e-2:
        raise SystemExit(f"{plan_name(shape, causal)}: frostc differs from cuDNN (relative error {err:.2e})")
    contestants = {"frostc": bound.execute, "cudnn": torch_sdpa(SDPBackend.CUDNN_ATTENTION)}
    if dv == d:  # torch's flash backend takes one head dim for q, k and v
        contestants["flash"] = torch_sdpa(SDPBackend.FLASH_ATTENTION)
    fa4 = _fa4()
    if fa4 is not None:  # FlashAttention-4 takes (b, s, h, d)
        qb, kb, vb = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        contestants["fa4"] = lambda: fa4(qb, kb, vb, causal=causal)
    times = common.alternating(contestants)
    tflops = {name: flops / (ms * 1e-3) / 1e12 for name, ms in times.items()}
    return {"shape": shape, "causal": causal, "rel_err": err, "ms": times, "tflops": tflops}


def _fa4():
    """FlashAttention-4's dense entry where installed (../shared/tools/fa4-peer), else None."""
    try:
        from flash_attn.cute.interface import flash_attn_func
    except ImportError:
        return None
    return flash_attn_func


def _row(r) -> str:
    t = r["tflops"]
    fa4 = f"  fa4 {t['fa4']:6.1f}" if "fa4" in t else ""
    flash = f"{t['flash']:6.1f}" if "flash" in t else "     -"
    return (
        f"{str(r['shape']):22} {'causal' if r['causal'] else 'full':6} frostc {t['frostc']:6.1f}  "
        f"cudnn {t['cudnn']:6.1f}  flash {flash}{fa4}  ratio {t['frostc'] / t['cudnn']:.2f}"
    )


def _markdown(rows, machine: str) -> str:
    have_fa4 = all("fa4" in r["tflops"] for r in rows)
    fa4_head = " FA4 | frostc / FA4 | frostc / best |" if have_fa4 else ""
    lines = [
        f"SDPA forward, bf16, BHSD — {machine}. TFLOP/s from CUDA-graph replays "
        f"({SETTLE_S:g} s settling, then a {WINDOW_S:g} s timed window), each contestant's median of {common.ROUNDS} "
        "measurements taken in rotated order." + (f" frostc's plans: {PLANS}." if PLANS != common.BUILT else ""),
        "",
        f"| b, h, s, d | causal | frostc | torch cuDNN | torch flash | frostc / cuDNN |{fa4_head} rel. err vs cuDNN |",
        "|---|---|---:|---:|---:|---:|" + ("---:|---:|---:|" if have_fa4 else "") + "---:|",
    ]
    ratios, fa4_ratios, best_ratios = [], [], []
    for r in rows:
        t = r["tflops"]
        ratios.append(t["frostc"] / t["cudnn"])
        fa4_cells = ""
        if have_fa4:
            fa4_ratios.append(t["frostc"] / t["fa4"])
            best_ratios.append(t["frostc"] / max(t["fa4"], t["cudnn"]))
            fa4_cells = f" {t['fa4']:.1f} | {fa4_ratios[-1]:.2f} | {best_ratios[-1]:.2f} |"
        flash = f"{t['flash']:.1f}" if "flash" in t else "-"
        lines.append(
            f"| {', '.join(map(str, r['shape']))} | {'yes' if r['causal'] else 'no'} | {t['frostc']:.1f} | "
            f"{t['cudnn']:.1f} | {flash} | {ratios[-1]:.2f} |{fa4_cells} {r['rel_err']:.1e} |"
        )
    lines += ["", f"Geometric mean frostc / cuDNN: {statistics.geometric_mean(ratios):.2f}"]
    if have_fa4:
        lines += [
            f"Geometric mean frostc / FlashAttention-4: {statistics.geometric_mean(fa4_ratios):.2f}; "
            f"lowest frostc / max(FA4, cuDNN): {min(best_ratios):.2f}"
        ]
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser, commands = common.command_line(__doc__)
    common.add_outputs(commands["run"])
    commands["run"].add_argument("--head-dims", metavar="D,D", help="only the shapes of these head dims (e.g. 96)")
    return common.dispatch(parser, {"build": build, "run": run}, argv)


if __name__ == "__main__":
    sys.exit(main())
