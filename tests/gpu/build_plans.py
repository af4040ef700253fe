"""Build the plans the GPU tests need into tests/.built (ignored by git; carried to the GPU).

    python -m tests.gpu.build_plans

Runs on the CPU machine: compiling needs the CuTe DSL, which the GPU machine does not have.
"""

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from frostc import GraphBuilder
from frostc.build import build
from frostc.planfile import write_atomic
from tests.gpu.cases import Case, cases

BUILT = Path(__file__).resolve().parent.parent / ".built"


def description(case: Case):
    g = GraphBuilder(case.id)
    rows = {"q": (case.heads_q, case.seq_q), "k": (case.heads_kv, case.seq_kv), "v": (case.heads_kv, case.seq_kv)}
    rows["o"] = rows["q"]
    for name, (h, s) in rows.items():
        g.tensor(name, dtype=case.dtype, dims=(case.batch, h, s, case.head_dim), layout=case.layout)
    if case.lse:
        g.tensor("lse", dtype="fp32", dims=(case.batch, case.heads_q, case.seq_q))
    g.sdpa(q="q", k="k", v="v", o="o", lse="lse" if case.lse else None, causal=case.causal)
    return g.build()


def main() -> int:
    BUILT.mkdir(exist_ok=True)
    manifest = []
    start = time.time()
    all_cases = cases()
    for i, case in enumerate(all_cases):
        path = BUILT / f"{case.id}.frost"
        write_atomic(path, build(description(case)))
        manifest.append(asdict(case) | {"plan": path.name})
        print(f"[{i + 1}/{len(all_cases)}] {case.id}  ({time.time() - start:.0f} s)", flush=True)
    write_atomic(BUILT / "manifest.json", json.dumps(manifest, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
