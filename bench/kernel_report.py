"""What the disassembly and the driver say of each kernel in the benchmark's plans.

    python bench/kernel_report.py [plan files...]     (default: bench/.built/*.frost)

Per kernel: registers per thread and local memory (spills) as the driver reports them, and,
where `cuobjdump` is installed, the SASS counts of HGMMA (warpgroup MMAs), UTMALDG / UTMASTG
(TMA loads and stores) and LDL / STL (local-memory traffic, i.e. spills). Runs on the GPU
machine; the runtime is the only frostc code it imports.
"""

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import common
import frost_runtime
from cuda.bindings import driver as cu
from frost_runtime.driver import check

SASS_OPS = ("HGMMA", "UTMALDG", "UTMASTG", "LDL", "STL")


def main(paths: list[str]) -> None:
    files = [Path(p) for p in paths] or sorted(common.BUILT.glob("*.frost"))
    seen = set()
    print(f"{'kernel':44} {'regs':>4} {'local B':>7} " + " ".join(f"{op:>7}" for op in SASS_OPS))
    for path in files:
        plan = frost_runtime.load(path)
        for kernel, loaded in zip(plan.data.kernels, plan._loaded):
            if kernel.name in seen:
                continue
            seen.add(kernel.name)
            attr = cu.CUfunction_attribute
            regs = check(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, loaded.function))
            local = check(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, loaded.function))
            counts = _sass_counts(kernel.cubin)
            cells = " ".join(f"{counts.get(op, '-'):>7}" for op in SASS_OPS)
            print(f"{kernel.name:44} {regs:>4} {local:>7} {cells}")


def _sass_counts(cubin: bytes) -> dict[str, int]:
    tool = shutil.which("cuobjdump")
    if tool is None:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True).stdout
    return {op: len(re.findall(rf"\b{op}\b", sass)) for op in SASS_OPS}


if __name__ == "__main__":
    main(sys.argv[1:])
