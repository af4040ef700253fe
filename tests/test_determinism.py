"""Deterministic builds: the same description with the same frostc and DSL versions gives a
byte-identical plan file in another process, from another working directory, with another
PYTHONHASHSEED, from a description at another path.

Found deterministic without changes: the DSL's cubin and entry name carry no address, path or
time; the build key hashes frostc's sources by their path relative to the package and the
description as sorted JSON (not its file path); the schema writes maps in a fixed key order.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "plans" / "examples" / "default.toml"


def _start_build(folder: Path, hash_seed: str) -> subprocess.Popen:
    """`python -m frostc build` run from `folder`, on a copy of the description kept there."""
    folder.mkdir(parents=True)
    shutil.copy(DEFAULT, folder / "graph.toml")
    env = os.environ | {"PYTHONHASHSEED": hash_seed}
    return subprocess.Popen(
        [sys.executable, "-m", "frostc", "build", "graph.toml", "-o", "plan.frost", "-q"],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_builds_in_separate_processes_are_byte_identical(tmp_path: Path) -> None:
    # run side by side: each is mostly the ~7 s kernel compile
    builds = {
        "first": _start_build(tmp_path / "first" / "deeper", "1"),
        "second": _start_build(tmp_path / "second", "4242"),
    }
    for name, proc in builds.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name} build failed:\n{out}\n{err}"
    a = (tmp_path / "first" / "deeper" / "plan.frost").read_bytes()
    b = (tmp_path / "second" / "plan.frost").read_bytes()
    if a != b:  # say where, field by field, before failing
        from frostc.diff import diff_report, diff_summaries, load_summary

        diffs = diff_summaries(
            load_summary(tmp_path / "first" / "deeper" / "plan.frost"), load_summary(tmp_path / "second" / "plan.frost")
        )
        raise AssertionError("builds differ:\n" + json.dumps(diff_report(diffs, "first", "second"), indent=1))
