"""bench/candidates.py on the CPU: the NAME=REV arguments, what a build runs in each candidate's
worktree and packs (the builds themselves faked: they compile for minutes), and the side-by-side
table the GPU side prints."""

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests import bench_scripts


@pytest.fixture(scope="module")
def candidates():
    return bench_scripts.load("candidates")


def test_candidates_are_name_equals_revision(candidates) -> None:
    assert candidates.parse_candidates(["r40=abc123", "r48=HEAD~1"]) == {"r40": "abc123", "r48": "HEAD~1"}
    for bad, says in (("r40", "NAME=REV"), ("=HEAD", "NAME=REV"), ("base=HEAD", "not 'base'"), ("a/b=HEAD", "letters")):
        with pytest.raises(SystemExit, match=says):
            candidates.parse_candidates([bad])
    with pytest.raises(SystemExit, match="named twice"):
        candidates.parse_candidates(["r40=HEAD", "r40=HEAD~1"])


def test_a_build_runs_each_candidates_own_scripts_in_its_worktree_and_packs_them(
    candidates, monkeypatch, tmp_path
) -> None:
    root = tmp_path / "repo"
    (root / "build").mkdir(parents=True)
    monkeypatch.setattr(candidates, "ROOT", root)
    monkeypatch.setattr(candidates, "PACK", root / "build" / "cand.tar.xz")
    monkeypatch.setattr(candidates, "MANIFEST", root / "build" / "cand.json")
    calls = []
    real_run = subprocess.run

    def fake_run(command, cwd=None, env=None, check=False, **_):
        calls.append((list(command), Path(cwd), env or {}))
        if command[:3] == ["git", "worktree", "add"]:
            Path(command[4]).mkdir(parents=True)
        elif command[1:3] == ["bench/mixed.py", "build"]:
            Path(env["MIXED_PLANS"]).mkdir(parents=True)
            (Path(env["MIXED_PLANS"]) / "row.frost").write_bytes(b"plan")
        elif command[1:3] == ["bench/sanitize.py", "build"]:
            Path(command[command.index("--plans") + 1]).mkdir(parents=True)
        elif command[1:3] == ["-m", "tests.gpu.build_plans"]:
            (Path(cwd) / "tests" / ".built" / command[4]).mkdir(parents=True)
        elif command[0] == "tar":
            return real_run(command, cwd=cwd, check=check)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(candidates.subprocess, "run", fake_run)
    assert candidates.build(["r48=HEAD~1"], "pages", "mixed,cb", "mixed-e4m3", "e4m3 and test_mixed") == 0

    manifest = json.loads((root / "build" / "cand.json").read_text())
    assert manifest == {"names": ["base", "r48"], "rows": "pages", "tests": ["mixed", "cb"],
                        "pytest_k": "e4m3 and test_mixed", "sanitize": "mixed-e4m3"}  # fmt: skip
    worktree = next(Path(c[0][4]) for c in calls if c[0][:3] == ["git", "worktree", "add"])
    assert [c[0][-1] for c in calls if c[0][:3] == ["git", "worktree", "add"]] == ["HEAD~1"]
    assert any(c[0][:3] == ["git", "worktree", "remove"] and c[0][-1] == str(worktree) for c in calls)
    # each tree builds with its own scripts and its own code on the path
    mixed_builds = [(c[1], c[2]) for c in calls if c[0][1:3] == ["bench/mixed.py", "build"]]
    assert [cwd for cwd, _ in mixed_builds] == [root, worktree]
    assert all(env["MIXED_ROWS"] == "pages" and str(cwd) in env["PYTHONPATH"] for cwd, env in mixed_builds)
    groups = [c[0][4] for c in calls if c[0][1:3] == ["-m", "tests.gpu.build_plans"]]
    assert groups == ["mixed", "cb", "mixed", "cb"]
    with tarfile.open(root / "build" / "cand.tar.xz") as pack:
        names = set(pack.getnames())
    for name in ("base", "r48"):
        assert f"bench/.built/mixed-{name}/row.frost" in names
        assert f"bench/.built/sanitize-{name}" in names
        assert {f"tests/.built-{name}/mixed", f"tests/.built-{name}/cb"} <= names


def test_the_table_puts_each_candidates_time_beside_the_baselines(candidates) -> None:
    timings = {
        "base": [{"row": "8 chunks e4m3 pages", "us": {"mixed (serving bucket)": 2050.0}}],
        "r40": [{"row": "8 chunks e4m3 pages", "us": {"mixed (serving bucket)": 1640.0}}],
        "r48": [],  # its run produced nothing: a dash, no ratio
    }
    lines = candidates.side_by_side(["base", "r40", "r48"], timings)
    assert lines[0] == "| step | contestant | base µs | r40 µs | r48 µs | r40 / base | r48 / base |"
    assert lines[2] == "| 8 chunks e4m3 pages | mixed (serving bucket) | 2050.0 | 1640.0 | - | 1.25x |  |"


def test_mixed_builds_only_the_rows_it_runs(monkeypatch) -> None:
    mixed = bench_scripts.load("mixed")
    monkeypatch.setenv("MIXED_ROWS", "pages")
    assert {row.name for row in mixed._chosen_rows()} == {row.name for row in mixed.ROWS if "pages" in row.name}
    monkeypatch.setenv("MIXED_ROWS", "prefill,chunk")
    chosen = {row.name for row in mixed._chosen_rows()}
    assert chosen == {row.name for row in mixed.ROWS if "prefill" in row.name or "chunk" in row.name}
    assert any("prefill" in name for name in chosen) and any("chunk" in name for name in chosen)
    monkeypatch.delenv("MIXED_ROWS")
    assert mixed._chosen_rows() == mixed.ROWS


def test_a_hung_candidate_skips_its_checks_and_fails_the_run(candidates, monkeypatch, tmp_path, capsys) -> None:
    """A candidate whose rows run past ROWS_S is taken as hung: its GPU cases and sanitizer (which
    would each wait out their own limits) are not run, the others' are, and the run fails."""
    manifest = tmp_path / "cand.json"
    plan = {"names": ["base", "r48"], "rows": "pages", "tests": ["mixed"], "pytest_k": "", "sanitize": "mixed-e4m3"}
    manifest.write_text(json.dumps(plan))
    monkeypatch.setattr(candidates, "MANIFEST", manifest)
    monkeypatch.setenv("OUT", str(tmp_path))
    rows = [{"row": "8 chunks e4m3 pages", "us": {"mixed (serving bucket)": 2050.0}}]
    monkeypatch.setattr(candidates, "_time", lambda name, *_: (rows, True) if name == "base" else ([], False))
    checked = []
    monkeypatch.setattr(candidates, "_check", lambda name, *_: checked.append(name) or ["GPU cases rc=0: 9 passed"])
    assert candidates.run() == 1
    assert checked == ["base"]
    printed = capsys.readouterr().out
    assert "base: GPU cases rc=0: 9 passed" in printed
    assert f"r48: hung: its bench/mixed.py rows ran past {candidates.ROWS_S} s" in printed


def test_cand_checks_limits_the_checks_not_the_rows(candidates, monkeypatch, tmp_path, capsys) -> None:
    """CAND_CHECKS names the candidates whose GPU cases and sanitizer run; every one's rows are timed."""
    manifest = tmp_path / "cand.json"
    plan = {"names": ["base", "a", "b"], "rows": "prefill", "tests": ["mixed"], "pytest_k": "", "sanitize": ""}
    manifest.write_text(json.dumps(plan))
    monkeypatch.setattr(candidates, "MANIFEST", manifest)
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("CAND_CHECKS", "b")
    timed, checked = [], []
    monkeypatch.setattr(candidates, "_time", lambda name, *_: timed.append(name) or ([], True))
    monkeypatch.setattr(candidates, "_check", lambda name, *_: checked.append(name) or ["GPU cases rc=0: 3 passed"])
    assert candidates.run() == 0
    assert timed == ["base", "a", "b"] and checked == ["b"]
    assert "b: GPU cases rc=0: 3 passed" in capsys.readouterr().out
