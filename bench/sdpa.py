"""SDPA forward throughput: frostc plans beside torch SDPA's cuDNN and flash backends, one run.

    python bench/sdpa.py build            # CPU machine: compile the plans into bench/.built
    python bench/sdpa.py run [--md FILE]  # GPU machine: time everything, print a table

Each row: bf16, BHSD, one (batch, heads, seq, head dim) shape, causal or not; frostc runs its
serving path (`plan.bind` once, `bound.execute()`). Times are device times from CUDA-graph
replays in the power-capped steady state (see `time_ms`), so no contestant's host overhead
is counted; each contestant is measured ROUNDS times in rotated order and its median reported;
TFLOP/s counts 4*b*h*s*s*d matmul FLOPs (half of that when causal). frostc's output is
checked against the cuDNN backend's on every timed shape before its time is reported.
"""

import argparse
import datetime
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "bench" / ".built"
ROUNDS = 4  # measurements of each contestant per shape, in rotated order (median reported)
SETTLE_S = 0.2  # seconds of a contestant's own load before its timed window (`time_ms`)
WINDOW_S = 0.4  # seconds of replays in one timed window
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
]


def plan_name(shape, causal: bool) -> str:
    b, h, s, d = shape
    return f"b{b}-h{h}-s{s}-d{d}-{'causal' if causal else 'full'}"


def build() -> int:
    sys.path.insert(0, str(ROOT))
    from frostc import GraphBuilder
    from frostc.build import build as build_plan
    from frostc.planfile import write_atomic

    BUILT.mkdir(parents=True, exist_ok=True)
    for shape in SHAPES:
        for causal in (False, True):
            b, h, s, d = shape
            g = GraphBuilder(plan_name(shape, causal))
            for t in ("q", "k", "v", "o"):
                g.tensor(t, dtype="bf16", dims=shape, layout="bhsd")
            g.sdpa(q="q", k="k", v="v", o="o", causal=causal)
            write_atomic(BUILT / f"{plan_name(shape, causal)}.frost", build_plan(g.build()))
            print("built", plan_name(shape, causal), flush=True)
    return 0


def time_ms(fn, warmup: int = 10, calls: int = 20, settle_s: float = SETTLE_S, window_s: float = WINDOW_S) -> float:
    """Device time of one call, from a CUDA graph holding `calls` calls: replayed back to back
    for `settle_s` seconds, then timed over as many replays as fill `window_s` seconds, with no
    pause between the two. Graphs keep every contestant's host launch cost (tens of µs for
    torch SDPA) out of the number, which otherwise dominates at short sequences.

    Why so long: under sustained tensor-core load the H200 runs at its power cap, and the SM
    clock swings between about 1.4 and 1.7 GHz from one 25 ms sample to the next while the
    cap's controller follows the power of whatever ran just before (bench/NOTES.md, "the
    benchmark's method"). A window of tens of ms samples that swing; settling on the
    contestant's own load and averaging over several hundred ms measures the steady state a
    serving GPU is in, the same for every contestant."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    replay_s = max(start.elapsed_time(end) * 1e-3, 1e-6)
    for _ in range(math.ceil(settle_s / replay_s)):
        graph.replay()
    replays = max(10, math.ceil(window_s / replay_s))
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (replays * calls)


def run(md_path: str | None) -> int:
    import torch

    sys.path.insert(0, str(ROOT / "runtime"))
    import frost_runtime

    rows = []
    for shape in SHAPES:
        for causal in (False, True):
            rows.append(_measure(frost_runtime.load(BUILT / f"{plan_name(shape, causal)}.frost"), shape, causal))
            print(_row(rows[-1]), flush=True)

    table = _markdown(rows, torch.cuda.get_device_name(), torch.__version__)
    print(table)
    if md_path:
        Path(md_path).write_text(table)
        Path(md_path).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


def _measure(plan, shape, causal: bool) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d = shape
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    flops = 4 * b * h * s * s * d / (2 if causal else 1)

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
    contestants = {
        "frostc": bound.execute,
        "cudnn": torch_sdpa(SDPBackend.CUDNN_ATTENTION),
        "flash": torch_sdpa(SDPBackend.FLASH_ATTENTION),
    }
    fa4 = _fa4()
    if fa4 is not None:  # FlashAttention-4 takes (b, s, h, d)
        qb, kb, vb = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        contestants["fa4"] = lambda: fa4(qb, kb, vb, causal=causal)
    times = _alternating(contestants)
    tflops = {name: flops / (ms * 1e-3) / 1e12 for name, ms in times.items()}
    return {"shape": shape, "causal": causal, "rel_err": err, "ms": times, "tflops": tflops}


def _alternating(contestants: dict, rounds: int = ROUNDS) -> dict[str, float]:
    """Each contestant's median time over `rounds` measurements, the order rotated every round.
    The rotation keeps any order effect left after `time_ms`'s settling (bench/NOTES.md v15:
    the first measurement after a pause runs faster) from always favouring one contestant."""
    names = list(contestants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(time_ms(contestants[name]))
    return {name: statistics.median(xs) for name, xs in samples.items()}


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
    return (
        f"{str(r['shape']):22} {'causal' if r['causal'] else 'full':6} frostc {t['frostc']:6.1f}  "
        f"cudnn {t['cudnn']:6.1f}  flash {t['flash']:6.1f}{fa4}  ratio {t['frostc'] / t['cudnn']:.2f}"
    )


def _markdown(rows, device: str, torch_version: str) -> str:
    today = datetime.date.today().isoformat()
    have_fa4 = all("fa4" in r["tflops"] for r in rows)
    fa4_head = " FA4 | frostc / FA4 | frostc / best |" if have_fa4 else ""
    lines = [
        f"SDPA forward, bf16, BHSD — {device}, torch {torch_version}, {today}. TFLOP/s from CUDA-graph replays "
        f"({SETTLE_S:g} s settling, then a {WINDOW_S:g} s timed window), each contestant's median of {ROUNDS} "
        "measurements taken in rotated order.",
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
        lines.append(
            f"| {', '.join(map(str, r['shape']))} | {'yes' if r['causal'] else 'no'} | {t['frostc']:.1f} | "
            f"{t['cudnn']:.1f} | {t['flash']:.1f} | {ratios[-1]:.2f} |{fa4_cells} {r['rel_err']:.1e} |"
        )
    lines += ["", f"Geometric mean frostc / cuDNN: {statistics.geometric_mean(ratios):.2f}"]
    if have_fa4:
        lines += [
            f"Geometric mean frostc / FlashAttention-4: {statistics.geometric_mean(fa4_ratios):.2f}; "
            f"lowest frostc / max(FA4, cuDNN): {min(best_ratios):.2f}"
        ]
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["build", "run"])
    parser.add_argument("--md", help="also write the table (markdown) and raw numbers (json) here")
    args = parser.parse_args()
    return build() if args.mode == "build" else run(args.md)


if __name__ == "__main__":
    sys.exit(main())
