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


def _start_build(folder: Path, hash_seed: str = "0", description: str | None = None) -> subprocess.Popen:
    """`python -m frostc build` run from `folder`, on a copy of the description kept there
    (`description`'s TOML, else the default example's)."""
    folder.mkdir(parents=True)
    if description is None:
        shutil.copy(DEFAULT, folder / "graph.toml")
    else:
        (folder / "graph.toml").write_text(description)
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


def _paged_description() -> str:
    """A mixed plan whose chunks run the d=64 forward kernel over pages of 64 (bench/sanitize.py's
    `mixed-chunks`)."""
    from frostc.description import to_toml
    from tests.gpu.build_plans import mixed_description
    from tests.gpu.mixed_cases import MixedCase

    case = MixedCase("bf16", 4, 300, 150, 8, 2, 64, 64, 8, True, lse="ht", window_left=90, softcap=30.0)
    return to_toml(mixed_description(case))


def test_the_paged_forward_kernel_compiles_to_one_cubin(tmp_path: Path) -> None:
    """The d=64 forward kernel over pages of 64 came out one of two cubins (about 6 builds in 10
    one, 4 the other) while its producer's block loop was unrolled: four builds now agree (all
    four alike by chance: ~15 % before)."""
    description = _paged_description()
    plans = []
    for pair in range(2):  # two at a time: the CPU machines have two cores
        builds = [_start_build(tmp_path / f"b{pair}{i}", description=description) for i in range(2)]
        for proc in builds:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"build failed:\n{out}\n{err}"
        plans += [(tmp_path / f"b{pair}{i}" / "plan.frost").read_bytes() for i in range(2)]
    assert all(plan == plans[0] for plan in plans), "the mixed plan's builds differ"
