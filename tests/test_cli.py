"""The command line: `frostc build` and `frostc inspect`, run in-process through typer's
CliRunner (so the one compile of the default example is shared through frostc.compile's
cache), plus `python -m frostc --help` in a subprocess.

Exit codes: 0 success, 2 bad input with nothing written."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from frost_runtime.schema import (
    Arg,
    Header,
    Kernel,
    Launch,
    NodeRecord,
    Param,
    PlanData,
    TensorSlot,
    decode_plan,
    encode_plan,
)
from typer.testing import CliRunner, Result

from frostc.cli import app

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "plans" / "examples" / "default.toml"


def frostc(*args: str | Path) -> Result:
    # a wide terminal, so rich never wraps a message or a path in the middle
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "1000"})


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    """`frostc build` of the default example, once for this module."""
    out = tmp_path_factory.mktemp("build") / "default.frost"
    return frostc("build", DEFAULT, "-o", out), out


@pytest.fixture(scope="module")
def plan_file(built: tuple[Result, Path]) -> Path:
    result, path = built
    assert result.exit_code == 0, result.output
    return path


def described(tmp_path: Path, old: str, new: str, count: int = 1) -> Path:
    """The default example with `old` replaced by `new`, written into `tmp_path`."""
    text = DEFAULT.read_text()
    assert text.count(old) >= count, old
    path = tmp_path / "graph.toml"
    path.write_text(text.replace(old, new, count))
    return path


# ----------------------------------------------------------------------------------- help


def test_python_m_frostc_help_exits_0() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "frostc", "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert "build" in result.stdout
    assert "inspect" in result.stdout


# ----------------------------------------------------------------------------------- build


def test_build_writes_a_plan(built: tuple[Result, Path]) -> None:
    result, path = built
    assert result.exit_code == 0, result.output
    assert f"wrote {path}" in result.stdout
    assert decode_plan(path.read_bytes()).header.name == "default"


def test_build_leaves_no_temp_file(plan_file: Path) -> None:
    assert [p.name for p in plan_file.parent.iterdir()] == [plan_file.name]


def test_build_reports_the_compile_on_stderr(built: tuple[Result, Path]) -> None:
    result, _ = built
    assert "sdpa_fwd_wgmma.bf16.d128.causal.paired.lse" in result.stderr


def test_build_quiet_prints_nothing(tmp_path: Path, plan_file: Path) -> None:
    out = tmp_path / "quiet.frost"
    result = frostc("build", DEFAULT, "-o", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert result.output == ""
    assert out.read_bytes() == plan_file.read_bytes()


def test_build_dump_writes_stage_files(tmp_path: Path) -> None:
    result = frostc("build", DEFAULT, "-o", tmp_path / "p.frost", "-q", "--dump", tmp_path / "stages")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "stages" / "3-resolved.json").is_file()


def test_build_replaces_an_existing_plan(tmp_path: Path, plan_file: Path) -> None:
    out = tmp_path / "p.frost"
    out.write_bytes(b"old")
    assert frostc("build", DEFAULT, "-o", out, "-q").exit_code == 0
    assert out.read_bytes() == plan_file.read_bytes()


def test_bad_description_exits_2_with_the_field_path_and_writes_nothing(tmp_path: Path) -> None:
    desc = described(tmp_path, "dims = [2, 4, 1024, 128]   # (b, hkv, skv, d)", "dims = [2, 4, 1024, 64]")
    out = tmp_path / "out.frost"
    result = frostc("build", desc, "-o", out)
    assert result.exit_code == 2
    assert "tensors.k.dims[3]" in result.stderr
    assert "head dim 64 does not match q's 128" in result.stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["graph.toml"]  # no temp file either


def test_unsupported_description_exits_2_with_the_field_path(tmp_path: Path) -> None:
    desc = described(tmp_path, ", 128]", ", 80]", count=4)  # head dim 80 everywhere: valid, unsupported
    out = tmp_path / "out.frost"
    result = frostc("build", desc, "-o", out)
    assert result.exit_code == 2
    assert "tensors.q.dims[3]: head dim 80 is not supported" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["graph.toml"]


def test_bad_description_keeps_an_existing_plan(tmp_path: Path) -> None:
    desc = described(tmp_path, "causal = true", 'causal = "yes"')
    out = tmp_path / "out.frost"
    out.write_bytes(b"previous plan")
    result = frostc("build", desc, "-o", out)
    assert result.exit_code == 2
    assert "nodes[0].causal" in result.stderr
    assert out.read_bytes() == b"previous plan"


def test_missing_description_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    result = frostc("build", missing, "-o", tmp_path / "out.frost")
    assert result.exit_code == 2
    assert str(missing) in result.stderr
    assert "No such file" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_invalid_toml_exits_2(tmp_path: Path) -> None:
    desc = tmp_path / "graph.toml"
    desc.write_text("format = = 1\n")
    result = frostc("build", desc, "-o", tmp_path / "out.frost")
    assert result.exit_code == 2
    assert "invalid TOML" in result.stderr


def test_error_message_shows_user_values_verbatim(tmp_path: Path) -> None:
    desc = described(tmp_path, 'dtype = "fp32"', 'dtype = "[red]fp32"')
    result = frostc("build", desc, "-o", tmp_path / "out.frost")
    assert result.exit_code == 2
    assert 'unknown dtype "[red]fp32"' in result.stderr


def test_error_message_with_a_closing_tag_exits_2(tmp_path: Path) -> None:
    desc = described(tmp_path, 'dtype = "fp32"', 'dtype = "[/x]"')
    result = frostc("build", desc, "-o", tmp_path / "out.frost")
    assert result.exit_code == 2
    assert 'unknown dtype "[/x]"' in result.stderr


def test_output_path_that_is_a_folder_exits_2(tmp_path: Path, plan_file: Path) -> None:
    folder = tmp_path / "a_folder"
    folder.mkdir()
    result = frostc("build", DEFAULT, "-o", folder, "-q")
    assert result.exit_code == 2
    assert str(folder) in result.stderr


# ----------------------------------------------------------------------------------- inspect


def test_inspect_prints_slots_and_kernel(plan_file: Path) -> None:
    result = frostc("inspect", plan_file)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "Slots" in text
    for name in ("q", "k", "v", "o", "lse"):
        assert f"│ {name} " in text, name
    assert "sdpa_fwd_wgmma.bf16.d128.causal.paired.lse" in text
    kernel = decode_plan(plan_file.read_bytes()).kernels[0]
    assert f"{kernel.smem_bytes} B" in text
    assert "stages=" in text and "ctas_per_sm=" in text  # the tile parameters the build chose
    assert "sm_90a" in text
    assert "Nodes (what the plan computes)" in text  # the node's record
    assert "│ attn │ sdpa │ dense │ causal top_left │ batch=2 heads_q=16" in text


def test_inspect_json_is_valid_json_with_every_section(plan_file: Path) -> None:
    result = frostc("inspect", plan_file, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert list(summary) == [
        "header", "slots", "nodes", "kernels", "launches", "workspace_bytes", "workspace", "lengths",
    ]  # fmt: skip
    assert [s["name"] for s in summary["slots"]] == ["q", "k", "v", "o", "lse"]
    (node,) = summary["nodes"]
    assert (node["name"], node["op"], node["form"], node["mask"]["causal"]) == ("attn", "sdpa", "dense", True)
    assert node["sizes"] == {"batch": 2, "heads_q": 16, "heads_kv": 4, "head_dim": 128, "seq_q": 1024,
                             "seq_kv": 1024, "tokens_q": 2048, "tokens_kv": 2048}  # fmt: skip
    assert node["slots"] == {"q": "slot 0 (q)", "k": "slot 1 (k)", "v": "slot 2 (v)", "o": "slot 3 (o)",
                             "lse": "slot 4 (lse)"}  # fmt: skip
    assert [s["io"] for s in summary["slots"]] == ["input"] * 3 + ["output"] * 2
    assert summary["kernels"][0]["name"] == "sdpa_fwd_wgmma.bf16.d128.causal.paired.lse"
    assert summary["kernels"][0]["smem_bytes"] == decode_plan(plan_file.read_bytes()).kernels[0].smem_bytes
    assert summary["launches"][0]["grid"] == [8 * 16 * 2, 1, 1]  # tiles: (1024 / 128) x heads x batch
    assert summary["launches"][0]["args"]["lse"] == "slot 4 (lse)"
    assert summary["launches"][0]["args"]["q.tmap"].startswith("tensor map of slot 0 (q), sha256 ")
    assert summary["launches"][0]["args"]["q.extents"] == [1024, 16, 2]
    assert summary["workspace_bytes"] == 0


def test_inspect_shows_the_plans_sha256(plan_file: Path) -> None:
    """The file's SHA-256, what `sha256sum` prints: the plan's identity, to pin."""
    digest = hashlib.sha256(plan_file.read_bytes()).hexdigest()
    assert json.loads(frostc("inspect", plan_file, "--json").stdout)["header"]["sha256"] == digest
    assert f"sha256 {digest}" in frostc("inspect", plan_file).stdout


def test_inspect_json_is_stable(plan_file: Path) -> None:
    assert frostc("inspect", plan_file, "--json").stdout == frostc("inspect", plan_file, "--json").stdout


def test_inspect_corrupt_file_exits_2_with_a_clear_message(tmp_path: Path, plan_file: Path) -> None:
    data = bytearray(plan_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt = tmp_path / "corrupt.frost"
    corrupt.write_bytes(bytes(data))
    result = frostc("inspect", corrupt)
    assert result.exit_code == 2
    assert "error:" in result.stderr
    assert str(corrupt) in result.stderr
    assert "content hash does not match" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("content", [b"", b"junk", b"\x81\xa5magic\xa3foo"], ids=["empty", "junk", "foreign"])
def test_inspect_non_plan_file_exits_2(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.frost"
    path.write_bytes(content)
    result = frostc("inspect", path)
    assert result.exit_code == 2
    assert str(path) in result.stderr
    assert result.stdout == ""


def test_inspect_truncated_file_exits_2(tmp_path: Path, plan_file: Path) -> None:
    path = tmp_path / "short.frost"
    path.write_bytes(plan_file.read_bytes()[:1000])
    result = frostc("inspect", path)
    assert result.exit_code == 2
    assert "not valid msgpack" in result.stderr


def plan_with_slot_named(name: str) -> bytes:
    """A small valid plan (fake cubin, nothing compiled) whose one slot is called `name`."""
    return encode_plan(
        PlanData(
            header=Header("toy", "0.1.0", "4.8.0", "sm_90a", 13000, "ab" * 32),
            slots=(TensorSlot(name, 1, "fp32", (4,), (1,), True, 4),),
            kernels=(
                Kernel("toy", "toy_entry", b"\x7fELF", (Param("x", "ptr"),), (32, 1, 1), (1, 1, 1), 0, "(1, 1, 1)"),
            ),
            launches=(Launch(0, (1, 1, 1), (Arg(slot=0),), "act"),),
            nodes=(NodeRecord("silu_mul", "act", "", {"rows": 1, "n": 2}, {"x": 0, "out": 0}),),  # a toy: in place
        )
    )


def test_inspect_a_hand_made_plan(tmp_path: Path) -> None:
    path = tmp_path / "toy.frost"
    path.write_bytes(plan_with_slot_named("x"))
    result = frostc("inspect", path)
    assert result.exit_code == 0, result.output
    assert "toy_entry" in result.stdout


def test_inspect_prints_names_verbatim(tmp_path: Path) -> None:
    path = tmp_path / "toy.frost"
    path.write_bytes(plan_with_slot_named("[/x]"))
    result = frostc("inspect", path)
    assert result.exit_code == 0, result.output
    assert "[/x]" in result.stdout


def test_inspect_missing_file_exits_2(tmp_path: Path) -> None:
    result = frostc("inspect", tmp_path / "nope.frost")
    assert result.exit_code == 2
    assert "no such file" in result.stderr


def test_inspect_a_folder_exits_2(tmp_path: Path) -> None:
    result = frostc("inspect", tmp_path)
    assert result.exit_code == 2
    assert str(tmp_path) in result.stderr
