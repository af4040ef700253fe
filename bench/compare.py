"""A/B comparison of frostc kernels: the same bench/sdpa.py plans built from different trees,
measured alternately in one run (GPU machine).

    python bench/compare.py DIR [DIR ...] [--rounds N] [--only SUBSTR]

Each DIR holds plans named as bench/sdpa.py names them (`bench/sdpa.py build` in another
checkout, then copy its bench/.built). For every plan name present in the first DIR, each DIR's
plan is measured `rounds` times in rotated order (bench/common.py's `alternating`: the first
measurement after a pause runs faster), outputs are checked against the first DIR's, and the
table gives TFLOP/s medians and each DIR's ratio to the first.
"""

import argparse
import statistics
import sys
from pathlib import Path

import common
from sdpa import SHAPES, dims, plan_name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=common.ROUNDS)
    parser.add_argument("--only", default="", help="plan names containing this")
    args = parser.parse_args()

    labels = [d.name for d in args.dirs]
    print("| plan | " + " | ".join(labels) + " | " + " | ".join(f"{x} / {labels[0]}" for x in labels[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(labels) - 1))
    ratios: dict[str, list[float]] = {x: [] for x in labels[1:]}
    errors: dict[str, float] = {x: 0.0 for x in labels[1:]}
    for shape in SHAPES:
        for causal in (False, True):
            name = plan_name(shape, causal)
            if args.only not in name or not (args.dirs[0] / f"{name}.frost").exists():
                continue
            tf, err = _measure(name, shape, causal, labels, args.dirs, args.rounds)
            errors = {x: max(errors[x], err[x]) for x in errors}
            for x in labels[1:]:
                ratios[x].append(tf[x] / tf[labels[0]])
            cells = " | ".join(f"{tf[x]:.1f}" for x in labels)
            rel = " | ".join(f"{tf[x] / tf[labels[0]]:.3f}" for x in labels[1:])
            print(f"| {name} | {cells} | {rel} |", flush=True)
    for x, r in ratios.items():
        if r:
            print(
                f"geometric mean {x} / {labels[0]}: {statistics.geometric_mean(r):.3f}; "
                f"largest relative difference of its outputs: {errors[x]:.1e}"
            )
    return 0


def _measure(name: str, shape, causal: bool, labels: list[str], dirs: list[Path], rounds: int):
    """TFLOP/s of each directory's plan `name`, and its output's relative difference from the
    first directory's (checked to be small before anything is timed)."""
    import frost_runtime
    import torch

    b, h, s, d, dv = dims(shape)
    q, k = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(b, h, s, dv, device="cuda", dtype=torch.bfloat16)
    outs = {x: torch.full_like(v, float("nan")) for x in labels}
    plans = {x: frost_runtime.load(dir_ / f"{name}.frost") for x, dir_ in zip(labels, dirs)}
    bound = {x: plans[x].bind(q, k, v, outs[x], workspace=plans[x].allocate_workspace()) for x in labels}
    for x in labels:
        bound[x].execute()
    torch.cuda.synchronize()
    ref = outs[labels[0]].float()

    def check(when: str) -> dict[str, float]:
        """Each plan's output against the first's, as the last call left it."""
        err = {x: ((outs[x].float() - ref).norm() / ref.norm()).item() for x in labels[1:]}
        for x, e in err.items():
            if not e < 1e-2:
                raise SystemExit(f"{name}: {x} differs from {labels[0]}{when} (relative error {e:.2e})")
        return err

    err = check("")
    calls = {x: bound[x].execute for x in labels}
    times = common.alternating(calls, rounds)
    torch.cuda.synchronize()
    check(" after the timed calls")  # every call must be right, not only the first
    flops = 2 * b * h * s * s * (d + dv) / (2 if causal else 1)
    return {x: flops / (times[x] * 1e-3) / 1e12 for x in labels}, err


if __name__ == "__main__":
    sys.exit(main())
