"""Registers and stack bytes (spills) of each kernel in plan files, read from the cubins on the CPU.

    python bench/kernel_resources.py PLAN.frost ...   # one line per kernel

frostc.cubin_info reads what ptxas decided from each cubin's `.nv.info` (registers per thread at
launch, the stack frame); bench/kernel_report.py reads the same from the driver on the GPU
machine. This runs where the plans are built, before a device call (bench/tile_trials.py drops a
candidate that keeps a stack frame).
"""

import sys
from pathlib import Path


def main(paths: list[str]) -> int:
    from frost_runtime.schema import decode_plan

    from frostc.cubin_info import resources

    for path in paths:
        for kernel in decode_plan(Path(path).read_bytes()).kernels:
            r = resources(kernel.cubin)
            frame = "  (a spill or a local array)" if r.stack_bytes else ""
            print(f"{Path(path).name:40} {kernel.name:60} {r.registers:>4} registers {r.stack_bytes:>4} B stack{frame}")
    return 0


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(root), str(root / "runtime")]
    sys.exit(main(sys.argv[1:]))
