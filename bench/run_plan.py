"""Execute one dense SDPA plan a few times on random inputs: a target for profilers (ncu, nsys).

    python bench/run_plan.py PLAN.frost [--calls N]

The plan's q, k, v and o slots must be BHSD bf16 (as bench/sdpa.py builds them); their shape is
read from the plan.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runtime"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()

    import frost_runtime
    import torch

    plan = frost_runtime.load(args.plan)
    shape = next(s.dims for s in plan.data.slots if s.name == "q")
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    workspace = plan.allocate_workspace()
    for _ in range(args.calls):
        plan.execute(q, k, v, o, workspace=workspace)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
