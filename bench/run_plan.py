"""Execute any plan a few times on buffers made from its slots: a target for profilers (ncu, nsys).

    python bench/run_plan.py PLAN.frost [--calls N] [--lengths SPEC ...] [--seed N]

The buffers, lengths and page tables are `python -m frost_runtime bench`'s (see its --help for
--lengths); the plan is bound once and `bound.execute()` called N times, nothing timed.
"""

import argparse
import sys
from pathlib import Path

import common  # noqa: F401 (runtime/ on the path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--lengths", nargs="+", metavar="SPEC", help="as `python -m frost_runtime bench` takes them")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import frost_runtime
    import torch
    from frost_runtime import bench, workload

    plan = frost_runtime.load(args.plan)
    setup = bench.prepare(plan, workload.make_lengths(plan.data, args.lengths, args.seed), args.seed)
    for _ in range(args.calls):
        setup.bound.execute()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
