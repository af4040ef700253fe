"""The golden plans (plans/golden): every description rebuilt and compared with its committed
`frostc inspect --json` rendering by `python -m frostc.golden`, so CI catches any change to a
plan. An intended change: `python -m frostc.golden --update`, review, commit.

Run in-process, so the kernel compiles are shared with the other tests through
frostc.compile's cache."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

from rich.console import Console

from frostc import golden
from frostc.golden import IGNORED


def run(folder: Path, update: bool = False) -> tuple[int, str]:
    console = Console(record=True, width=200, file=io.StringIO())
    code = golden.run(folder, update=update, console=console)
    return code, console.export_text()


def test_golden_plans_match_their_committed_renderings() -> None:
    code, text = run(golden.GOLDEN_DIR)
    assert code == 0, f"golden plans changed (python -m frostc.golden --update if intended):\n{text}"
    assert len(list(golden.GOLDEN_DIR.glob("*.toml"))) >= 4


def test_goldens_hold_nothing_machine_dependent() -> None:
    for path in golden.GOLDEN_DIR.glob("*.json"):
        text = path.read_text()
        # an absolute path starts a token with "/" (a grid rule's "a / b" does not)
        assert not re.search(r"(^|[\s\"'(])/\w", text), f"{path.name} holds a path"
        assert set(json.loads(text)) == {
            "header",
            "slots",
            "nodes",
            "kernels",
            "launches",
            "workspace_bytes",
            "workspace",
            "lengths",
        }


def _one_golden(tmp_path: Path) -> Path:
    for suffix in (".toml", ".json"):
        shutil.copy(golden.GOLDEN_DIR / f"mqa-decode{suffix}", tmp_path / f"mqa-decode{suffix}")
    return tmp_path / "mqa-decode.json"


def test_a_changed_plan_is_reported_with_its_fields_and_exits_1(tmp_path: Path) -> None:
    rendering = _one_golden(tmp_path)
    summary = json.loads(rendering.read_text())
    summary["launches"][0]["grid"][0] += 1
    summary["kernels"][0]["cubin_sha256"] = "0" * 64
    rendering.write_text(json.dumps(summary, indent=2) + "\n")
    code, text = run(tmp_path)
    assert code == 1
    assert "launches[0].grid" in text and "kernels[0].cubin_sha256" in text
    assert "--update" in text


def test_the_build_key_alone_is_not_compared(tmp_path: Path) -> None:
    rendering = _one_golden(tmp_path)
    summary = json.loads(rendering.read_text())
    summary["header"]["build_key"] = "f" * 64  # what any edit of frostc's sources does
    rendering.write_text(json.dumps(summary, indent=2) + "\n")
    assert run(tmp_path)[0] == 0


def test_update_writes_what_inspect_json_prints(tmp_path: Path) -> None:
    rendering = _one_golden(tmp_path)
    committed = rendering.read_text()
    rendering.unlink()
    code, _ = run(tmp_path)
    assert code == 1  # missing
    assert run(tmp_path, update=True)[0] == 0
    fresh = json.loads(rendering.read_text())
    old = json.loads(committed)
    for field in IGNORED:  # the build key moves with every source edit, and the hashes over it
        key = field.removeprefix("header.")
        fresh["header"].pop(key), old["header"].pop(key)
    assert fresh == old
    assert rendering.read_text().endswith("}\n") and '\n  "header": {\n' in rendering.read_text()
    assert run(tmp_path)[0] == 0


def test_a_description_that_does_not_build_exits_2(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('format = 1\nname = "bad"\n')
    code, text = run(tmp_path)
    assert code == 2
    assert "does not build" in text
