"""Kernel candidates side by side in one GPU call: each a git revision whose plans are built here
beside the current tree's (the baseline, "base"), packed into one file; on the GPU machine each
candidate's bench/mixed.py rows are timed in turn, then its GPU cases run and its sanitizer
targets too, so one warm machine gives the A/B and the verdict on correctness at once.

    python bench/candidates.py build NAME=REV ... --rows PIECE [--tests GROUP,...]
        [--sanitize PIECE,...] [--pytest-k EXPR]            # CPU machine: build/cand.tar.xz
    python bench/candidates.py run                           # GPU machine, after unpacking it
    bash bench/gpu_checks.sh cand                            # the same, transformers installed first

Why: a kernel change often has two or three candidate forms (tile shapes, register budgets, batch
sizes) and device time is scarce; building each by hand into its own folders and writing the
call by hand cost a session a call (2026-12-07). Each candidate is built in a worktree of its
revision (`git worktree add`), with that revision's own build scripts; its plans travel as
tests/.built-NAME, bench/.built/mixed-NAME and bench/.built/sanitize-NAME, and build/cand.json
says what to run. `--rows` picks bench/mixed.py's rows (`MIXED_ROWS`), `--tests` the groups of
tests.gpu.build_plans the GPU cases need, `--pytest-k` which cases run, `--sanitize` the
sanitizer targets. A candidate whose rows run past CAND_ROWS_S (150 s) is taken as hung: its
GPU cases and sanitizer targets are skipped (each would wait out its own limit) and the run fails.
`CAND_CHECKS=NAME,...` at run time checks only those candidates (rows are timed for all).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import common

ROOT = common.ROOT
PACK = ROOT / "build" / "cand.tar.xz"
MANIFEST = ROOT / "build" / "cand.json"
BASE = "base"
# seconds a candidate's bench/mixed.py rows may take ("pages": ~30 s); past it the candidate is
# taken as hung (a kernel that never finishes: 48-register converters, 2026-12-07) and its GPU
# cases and sanitizer targets are not run, which would each wait out their own limits
ROWS_S = int(os.environ.get("CAND_ROWS_S", "150"))


@dataclass(frozen=True)
class Candidates:
    """What one call runs: the candidates in order (the baseline first) and the pieces of each."""

    names: list[str]
    rows: str  # bench/mixed.py's rows whose name holds this
    tests: list[str] = field(default_factory=list)  # tests.gpu.build_plans groups
    pytest_k: str = ""
    sanitize: str = ""  # bench/sanitize.py's --only


def parse_candidates(pairs: list[str]) -> dict[str, str]:
    """["r40=abc123", "r48=HEAD~1"] -> {"r40": "abc123", "r48": "HEAD~1"}, names that can be folder names."""
    out = {}
    for pair in pairs:
        name, sep, rev = pair.partition("=")
        if not sep or not name or not rev:
            raise SystemExit(f"candidate {pair!r}: write NAME=REV (e.g. r48=HEAD~1)")
        if name == BASE or not name.replace("-", "").replace("_", "").isalnum():
            raise SystemExit(f"candidate {pair!r}: the name must be letters, digits, - or _, and not {BASE!r}")
        if name in out:
            raise SystemExit(f"candidate {name!r} named twice")
        out[name] = rev
    return out


# ---------------------------------------------------------------------------- the CPU side


def build(pairs: list[str], rows: str, tests: str, sanitize: str, pytest_k: str) -> int:
    revisions = parse_candidates(pairs)
    plan = Candidates([BASE, *revisions], rows, [g for g in tests.split(",") if g], pytest_k, sanitize)
    with tempfile.TemporaryDirectory(prefix="frostc-cand-") as staging:
        staging = Path(staging)
        _build_in(ROOT, BASE, plan, staging)
        for name, rev in revisions.items():
            tree = staging / f"tree-{name}"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True)
            try:
                _build_in(tree, name, plan, staging)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True)
        PACK.parent.mkdir(exist_ok=True)
        folders = [p.name for p in (staging / "pack").iterdir()]
        subprocess.run(["tar", "-cJf", str(PACK), *folders], cwd=staging / "pack", check=True)
    MANIFEST.write_text(json.dumps(asdict(plan), indent=1))
    print(f"{PACK.relative_to(ROOT)}: {PACK.stat().st_size / 2**20:.1f} MiB, {', '.join(plan.names)}; "
          f"carry build (and .hfslim for transformers' cases), then: bash bench/gpu_checks.sh cand")  # fmt: skip
    return 0


def _build_in(tree: Path, name: str, plan: Candidates, staging: Path) -> None:
    """One candidate's plans, built by its own tree's scripts, into the staging pack's folders."""
    env = os.environ | {"PYTHONPATH": f"{tree / 'runtime'}:{tree}"}
    pack = staging / "pack"
    (pack / "bench" / ".built").mkdir(parents=True, exist_ok=True)

    def step(what: str, *args: str, **extra: str) -> None:
        print(f"[{name}] {what}", flush=True)
        subprocess.run([sys.executable, *args], cwd=tree, env=env | extra, check=True)

    mixed = pack / "bench" / ".built" / f"mixed-{name}"
    step(f"bench/mixed.py rows '{plan.rows}'", "bench/mixed.py", "build", MIXED_ROWS=plan.rows, MIXED_PLANS=str(mixed))
    if plan.sanitize:
        scratch = staging / f"sanitize-{name}"
        step(f"sanitizer targets {plan.sanitize}", "bench/sanitize.py", "build", "--only", plan.sanitize,
             "--plans", str(scratch))  # fmt: skip
        shutil.copytree(scratch, pack / "bench" / ".built" / f"sanitize-{name}")
    if plan.tests:
        built = tree / "tests" / ".built"
        for group in plan.tests:
            step(f"GPU cases: {group}", "-m", "tests.gpu.build_plans", "--only", group)
        (pack / "tests").mkdir(exist_ok=True)
        shutil.copytree(built, pack / "tests" / f".built-{name}")


# ---------------------------------------------------------------------------- the GPU side


def run() -> int:
    plan = Candidates(**json.loads(MANIFEST.read_text()))
    out = Path(os.environ.get("OUT", "/tmp"))
    timings, hung = {}, []
    for name in plan.names:
        timings[name], finished = _time(name, plan.rows, out)
        if not finished:
            hung.append(name)
    checks = {}
    # CAND_CHECKS=NAME,...: only these candidates' GPU cases and sanitizer (a base checked already)
    wanted = os.environ.get("CAND_CHECKS")
    checked = wanted.split(",") if wanted else plan.names
    skipped = f"hung: its bench/mixed.py rows ran past {ROWS_S} s; GPU cases and sanitizer not run"
    if plan.tests or plan.sanitize:
        for name in (n for n in plan.names if n in checked):
            checks[name] = [skipped] if name in hung else _check(name, plan, out)
    print("\n".join(side_by_side(plan.names, timings)))
    for name, verdicts in checks.items():
        print(f"{name}: " + "; ".join(verdicts))
    return 0 if all(all("rc=0" in v for v in verdicts) for verdicts in checks.values()) else 1


def _time(name: str, rows: str, out: Path) -> tuple[list[dict], bool]:
    """The candidate's bench/mixed.py results, and whether its run finished within ROWS_S."""
    raw = out / f"cand-mixed-{name}.json"
    env = os.environ | {"MIXED_PLANS": str(common.BUILT / f"mixed-{name}"), "MIXED_ROWS": rows}
    with open(out / f"cand-mixed-{name}.log", "w") as log:
        try:
            subprocess.run([sys.executable, "bench/mixed.py", "run", "--json", str(raw)], cwd=ROOT, env=env,
                           stdout=log, stderr=subprocess.STDOUT, timeout=ROWS_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            print(f"{name}: bench/mixed.py ran past {ROWS_S} s (its log: {log.name})", flush=True)
            return [], False
    return (json.loads(raw.read_text()) if raw.exists() else []), True


def _check(name: str, plan: Candidates, out: Path) -> list[str]:
    """The candidate's GPU cases (its tests/.built in place) beside its sanitizer targets: their
    verdict lines."""
    verdicts = []
    sanitizer = None
    if plan.sanitize:
        log = open(out / f"cand-sanitize-{name}.txt", "w")  # closed once the sanitizer is done
        sanitizer = subprocess.Popen(
            [sys.executable, "bench/sanitize.py", "run", "--only", plan.sanitize,
             "--plans", str(common.BUILT / f"sanitize-{name}")],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    if plan.tests:
        built = ROOT / "tests" / ".built"
        shutil.rmtree(built, ignore_errors=True)
        shutil.copytree(ROOT / "tests" / f".built-{name}", built)
        pytest = subprocess.run(
            [sys.executable, "bench/gpu_pytest.py", "--jobs", "4", "--timeout", "200", "-k", plan.pytest_k,
             "--out", str(out / f"cand-pytest-{name}")],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        (out / f"cand-pytest-{name}.txt").write_text(pytest.stdout + pytest.stderr)
        summary = pytest.stdout.strip().splitlines()[-1] if pytest.stdout.strip() else "no output"
        verdicts.append(f"GPU cases rc={pytest.returncode}: {summary}")
    if sanitizer is not None:
        code = sanitizer.wait()
        log.close()
        text = (out / f"cand-sanitize-{name}.txt").read_text()
        verdicts.append(f"sanitizer rc={code}: {'all clean' if 'all clean' in text else 'NOT clean (see its log)'}")
    return verdicts


def side_by_side(names: list[str], timings: dict[str, list[dict]]) -> list[str]:
    """µs of every (row, contestant) under each candidate, and each against the baseline."""
    lines = [
        "| step | contestant | " + " | ".join(f"{n} µs" for n in names) + " | "
        + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |",
        "|---|---|" + "---:|" * (2 * len(names) - 1),
    ]  # fmt: skip
    by_name = {name: _times(rows) for name, rows in timings.items()}
    keys = list(dict.fromkeys(key for rows in by_name.values() for key in rows))
    for row, label in keys:
        times = [by_name[n].get((row, label)) for n in names]
        cells = [f"{t:.1f}" if t else "-" for t in times]
        base = times[0]
        ratios = [f"{base / t:.2f}x" if base and t else "" for t in times[1:]]
        lines.append(f"| {row} | {label} | " + " | ".join(cells + ratios) + " |")
    return lines


def _times(results: list[dict]) -> dict[tuple[str, str], float | None]:
    """bench/mixed.py's raw results as {(row, contestant): µs}."""
    return {(r["row"], label): us for r in results for label, us in r["us"].items()}


def main(argv: list[str] | None = None) -> int:
    parser, commands = common.command_line(__doc__)
    b = commands["build"]
    b.add_argument("candidates", nargs="+", metavar="NAME=REV", help="each candidate's name and git revision")
    b.add_argument("--rows", required=True, help="bench/mixed.py's rows: names holding one of these (prefill,chunk)")
    b.add_argument("--tests", default="", help="tests.gpu.build_plans groups the GPU cases need, e.g. mixed,cb")
    b.add_argument("--pytest-k", default="", help="pytest's -k for the GPU cases, e.g. 'e4m3 and test_mixed'")
    b.add_argument("--sanitize", default="", help="bench/sanitize.py's --only pieces, e.g. mixed-e4m3")
    args = parser.parse_args(argv)
    if args.command == "build":
        return build(args.candidates, args.rows, args.tests, args.sanitize, args.pytest_k)
    return run()


if __name__ == "__main__":
    sys.exit(main())
