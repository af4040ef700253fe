"""bench/gpu_pytest.py on the CPU: a file's pytest output read into counts and failures, the
files' counts summed in pytest's words, a timed-out or faulting file kept apart, and a real run
over this machine's GPU suite (every file skips without a GPU: exit 0, skips counted)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("gpu_pytest", ROOT / "bench" / "gpu_pytest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_pytest"] = module
    spec.loader.exec_module(module)
    return module


def test_a_log_is_read_into_counts_and_failures() -> None:
    g = _script()
    log = "..F.\nFAILED tests/gpu/test_mixed.py::test_x[a] - CudaError: boom\n" \
          "== 1 failed, 3 passed, 1 warning in 2.0s ==\n"  # fmt: skip
    r = g.parse("test_mixed", log, 1)
    assert r.counts == {"failed": 1, "passed": 3, "warnings": 1}
    assert r.failures == ["FAILED tests/gpu/test_mixed.py::test_x[a] - CudaError: boom"]
    assert r.summary == "1 failed, 3 passed, 1 warning in 2.0s"


def test_the_files_counts_are_summed_in_pytests_words() -> None:
    g = _script()
    runs = [g.parse("a", "== 5 passed, 1 skipped in 1s ==", 0), g.parse("b", "== 2 failed, 1 error in 1s ==", 1),
            g.parse("c", "TIMED OUT after 9 s", 124)]  # fmt: skip
    assert g.total(runs) == "2 failed, 5 passed, 1 skipped, 1 errors"
    assert runs[2].counts == {} and runs[2].summary == "TIMED OUT after 9 s"


def test_a_run_on_a_machine_without_a_gpu_skips_every_file(tmp_path) -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_pytest.py"), "--jobs", "2", "--out", str(tmp_path),
         "-k", "no_such_test_name"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(p.stem for p in (ROOT / "tests" / "gpu").glob("test_*.py"))
    assert sorted(p.stem.removeprefix("pytest-") for p in tmp_path.glob("pytest-*.log")) == files
    assert "failed" not in done.stdout.splitlines()[-1]


def test_a_file_that_measures_the_whole_device_runs_alone_after_the_others(monkeypatch, tmp_path) -> None:
    import threading
    import time

    g = _script()
    running, log = set(), []
    lock = threading.Lock()

    def run_file(path, out, timeout, select):
        with lock:
            running.add(path.stem)
            log.append((path.stem, frozenset(running)))
        time.sleep(0.05)
        with lock:
            running.discard(path.stem)
        return g.parse(path.stem, "== 1 passed in 0.1s ==", 0)

    monkeypatch.setattr(g, "run_file", run_file)
    assert g.main(["--jobs", "4", "--out", str(tmp_path)]) == 0
    alone = [(name, beside) for name, beside in log if name in g.ALONE]
    assert alone and all(beside == {name} for name, beside in alone), "an ALONE file ran beside another"
    assert [name for name, _ in log][-len(alone) :] == [name for name, _ in alone], "an ALONE file ran first"
