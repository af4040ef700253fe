"""Every kernel the project builds, by name, with the SHA-256 of its cubin: the proof that a
refactor of a kernel's Python left what runs on the GPU as it was.

    python bench/cubins.py census OUT.json [--only GROUP ...]   # CPU machine: build and record
    python bench/cubins.py compare A.json B.json                # exit 0 the same, 1 different

`census` runs, in one process, every builder whose plans are checked or measured: the goldens,
the GPU tests' plans (python -m tests.gpu.build_plans, into tests/.built), the sanitizer's
targets and the benchmarks' plans (into bench/.built); so it also leaves every plan the GPU
machine needs built. Each distinct kernel variant is compiled once, and recorded with its entry,
parameter ABI, the SHA-256 of its cubin and of its PTX with the entry's name taken out (the PTX
shows a change that only renames the entry as none; the cubin holds the name).
"""

import argparse
import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "runtime"))

import frostc.kernels  # noqa: E402, F401  (sets the DSL's environment before cutlass is first imported)

BENCHES = ("sdpa", "varlen", "decode", "fp8", "host_overhead", "model")
GROUPS = ("golden", "tests", "sanitize", *BENCHES)


def census(groups: tuple[str, ...]) -> dict[str, dict]:
    """{variant name: its record}, from compiling every kernel the groups' builders build."""
    import cutlass.cute as cute

    import frostc.compile as compile_stage

    found: dict[str, dict] = {}
    traced: list = []
    dsl_compile = cute.compile

    def keep_ptx(*args, **kwargs):
        compiled = dsl_compile(*args, **kwargs)
        traced.append(compiled)
        return compiled

    def recording(variant):
        traced.clear()
        kernel = plain_compile(variant)
        ptx = traced[-1].__ptx__.replace(kernel.entry, "ENTRY")
        found[variant.name] = {
            "entry": kernel.entry,
            "params": [list(p) for p in kernel.params],
            "cubin": hashlib.sha256(kernel.cubin).hexdigest(),
            "ptx": hashlib.sha256(ptx.encode()).hexdigest(),
        }
        return kernel

    plain_compile = compile_stage._compile
    compile_stage._compile = recording
    cute.compile = keep_ptx
    try:
        for group in groups:
            start = time.time()
            BUILDERS[group]()
            print(f"census: {group} built ({time.time() - start:.0f} s, {len(found)} kernels so far)", flush=True)
    finally:
        compile_stage._compile = plain_compile
        cute.compile = dsl_compile
    return dict(sorted(found.items()))


def _golden() -> None:
    from frostc.golden import GOLDEN_DIR, build_rendering

    for description in sorted(GOLDEN_DIR.glob("*.toml")):
        build_rendering(description)


def _tests() -> None:
    from tests.gpu import build_plans

    saved, sys.argv = sys.argv, ["build_plans"]
    try:
        if build_plans.main() != 0:
            raise SystemExit("census: the GPU tests' plans did not all build")
    finally:
        sys.argv = saved


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sanitize() -> None:
    module = _bench_module("sanitize")
    module.build(module.BUILT, "")


def _bench(name: str):
    return lambda: _bench_module(name).build()


BUILDERS = {"golden": _golden, "tests": _tests, "sanitize": _sanitize} | {b: _bench(b) for b in BENCHES}


def compare(a: dict[str, dict], b: dict[str, dict]) -> list[str]:
    """Each difference in words: a kernel only in one census, or a field that differs."""
    lines = [f"only in the first: {name}" for name in sorted(set(a) - set(b))]
    lines += [f"only in the second: {name}" for name in sorted(set(b) - set(a))]
    for name in sorted(set(a) & set(b)):
        changed = [field for field in ("params", "ptx", "entry", "cubin") if a[name][field] != b[name][field]]
        if changed:
            lines.append(f"{name}: {', '.join(changed)} differ")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    take = verbs.add_parser("census", help="build every plan and record each kernel")
    take.add_argument("out", type=Path)
    take.add_argument("--only", nargs="+", choices=GROUPS, help="these builders only (default: all)")
    versus = verbs.add_parser("compare", help="two censuses, kernel by kernel")
    versus.add_argument("a", type=Path)
    versus.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.verb == "census":
        found = census(tuple(args.only or GROUPS))
        args.out.write_text(json.dumps(found, indent=1) + "\n")
        print(f"census: {len(found)} kernels -> {args.out}")
        return 0
    a, b = (json.loads(p.read_text()) for p in (args.a, args.b))
    lines = compare(a, b)
    for line in lines:
        print(line)
    print(f"{len(set(a) | set(b))} kernels: {'the same' if not lines else f'{len(lines)} differences'}")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
