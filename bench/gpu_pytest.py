"""The GPU suite as one pytest process per test file, several side by side on the one GPU.

    python bench/gpu_pytest.py [--jobs 4] [--timeout 400] [-k EXPR] [--out DIR]   # GPU machine

Why: device time is what a GPU session runs short of, and one process for the whole suite has two
costs there. Its files run one after another (the wall is their sum, not the longest file's), and
a kernel that faults ends the CUDA context of the process: every later test fails with it (a
fault in the e4m3 mixed cases cost 392 failures, 2026-12-07). Here a fault costs its own file.

Files that measure the whole device (`ALONE`) run after the others, one at a time.

Each file's log goes to DIR/pytest-<file>.log ($OUT where set). Printed: one line per file (its
pytest summary and exit code), the FAILED and ERROR lines, and the sum of the files' counts in
pytest's words. Exit 0 only when every file's pytest did (5, "no tests collected", counts as 0).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_TESTS = 5  # pytest's exit code when a file's tests are all deselected
# files that run alone, after the others: each has a case that reads the device's free memory
# (cuMemGetInfo), which other processes' allocations move: side by side the plan soak read 1.3-2.0 GB
# "leaked" (H100), and test_failures' 300 dropped plans 2 MiB (H200, 2026-12-07, eleventh session)
ALONE = ("test_execute_contract", "test_failures", "test_threads")
# the words of pytest's summary line, in its order
OUTCOMES = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "warnings", "errors")
_COUNT = re.compile(r"(\d+) (failed|passed|skipped|deselected|xfailed|xpassed|warnings?|errors?)\b")


@dataclass
class FileRun:
    name: str
    exit_code: int
    summary: str  # pytest's last line, "== 3 passed in 1.2s ==" without the rules
    counts: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  # its FAILED / ERROR lines


def parse(name: str, log: str, exit_code: int) -> FileRun:
    """A file's pytest output: its summary line's counts and its FAILED / ERROR lines."""
    lines = [line.strip("= ").strip() for line in log.splitlines() if line.strip()]
    summary = next((line for line in reversed(lines) if _COUNT.search(line)), lines[-1] if lines else "")
    counts: dict[str, int] = {}
    for number, word in _COUNT.findall(summary):
        word = word if word in OUTCOMES else word + "s"  # "1 warning", "1 error"
        counts[word] = counts.get(word, 0) + int(number)
    failures = [line for line in log.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return FileRun(name, exit_code, summary, counts, failures)


def total(runs: list[FileRun]) -> str:
    """The files' counts summed, in pytest's words and order."""
    sums = {word: sum(r.counts.get(word, 0) for r in runs) for word in OUTCOMES}
    return ", ".join(f"{sums[w]} {w}" for w in OUTCOMES if sums[w]) or "no tests ran"


def run_file(path: Path, out: Path, timeout: int, select: str) -> FileRun:
    command = [sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider", "-rs"]
    command += ["-k", select] if select else []
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
        log, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:  # its captured output is bytes, text=True or not
        captured = b"".join(x for x in (exc.stdout, exc.stderr) if isinstance(x, bytes))
        log, code = captured.decode(errors="replace") + f"\nTIMED OUT after {timeout} s", 124
    (out / f"pytest-{path.stem}.log").write_text(log)
    return parse(path.stem, log, code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=4, help="files side by side (default 4)")
    parser.add_argument("--timeout", type=int, default=400, help="seconds a file may take (default 400)")
    parser.add_argument("-k", dest="select", default="", help="pytest's -k, for every file")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")), help="the logs' folder")
    args = parser.parse_args(argv)
    files = sorted((ROOT / "tests" / "gpu").glob("test_*.py"), key=lambda p: -p.stat().st_size)  # longest first
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    together = [p for p in files if p.stem not in ALONE]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        runs = list(pool.map(lambda p: run_file(p, args.out, args.timeout, args.select), together))
    runs += [run_file(p, args.out, args.timeout, args.select) for p in files if p.stem in ALONE]
    for r in sorted(runs, key=lambda r: r.name):
        print(f"{r.name}: {r.summary} (exit {r.exit_code})")
    for line in (line for r in runs for line in r.failures[:10]):
        print(line)
    print(f"tests/gpu, {len(runs)} files side by side: {total(runs)} in {time.time() - started:.0f} s")
    return 0 if all(r.exit_code in (0, NO_TESTS) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
