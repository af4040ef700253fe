"""`frostc diff` and `frostc check` on hand-made plans (a fake cubin, so nothing is compiled),
through typer's CliRunner. diff: 0 equal, 1 different, 2 unreadable. check: 0 runnable,
1 valid but not runnable here, 2 invalid or not the plan `--sha256` pins. This machine has no
GPU driver: `check` must say so."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from frost_runtime.schema import (
    Arg,
    Header,
    Kernel,
    Launch,
    NodeMask,
    NodeRecord,
    Param,
    PlanData,
    TensorSlot,
    encode_plan,
)
from typer.testing import CliRunner, Result

from frostc import plan_verdict
from frostc.cli import app
from frostc.diff import diff_files, load_summary
from frostc.plan_verdict import GpuDevice, Probe, check_plan_file

FAKE_CUBIN = b"\x7fELF" + bytes(range(256))


def frostc(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "1000"})


def make_plan(**changes) -> PlanData:
    plan = PlanData(
        header=Header("toy", "0.1.0", "4.8.1", "sm_90a", 13000, "ab" * 32),
        slots=(
            TensorSlot("q", 1, "bf16", (1, 2, 64, 64), (8192, 64, 128, 1), False, 16),
            TensorSlot("o", 2, "bf16", (1, 2, 64, 64), (8192, 64, 128, 1), True, 16),
        ),
        kernels=(
            Kernel(
                "sdpa_fwd_mma.bf16.d64.full",
                "kernel_0",
                FAKE_CUBIN,
                (Param("q", "ptr"), Param("o", "ptr"), Param("seq_q", "i32"), Param("scale", "f32")),
                (128, 1, 1),
                (1, 1, 1),
                49152,
                "(ceil(seq_q / 128), heads_q, batch)",
                {"block_m": 128},
            ),
        ),
        launches=(Launch(0, (1, 2, 1), (Arg(slot=0), Arg(slot=1), Arg(value=64), Arg(value=0.125)), "attn"),),
        nodes=(NODE,),
    )
    return replace(plan, **changes)


SIZES = {"batch": 1, "heads_q": 2, "heads_kv": 2, "head_dim": 64, "seq_q": 64, "seq_kv": 64}
NODE = NodeRecord(
    "sdpa",
    "attn",
    "dense",
    SIZES | {"tokens_q": 64, "tokens_kv": 64},
    {"q": 0, "k": 0, "v": 0, "o": 1},
    {"attn_scale": 0.125},
    NodeMask(False, "top_left", None, None, None),
)


def write(path: Path, plan: PlanData) -> Path:
    path.write_bytes(encode_plan(plan))
    return path


@pytest.fixture
def plan_a(tmp_path: Path) -> Path:
    return write(tmp_path / "a.frost", make_plan())


# ---------------------------------------------------------------------------------------- diff


def test_diff_of_identical_plans_exits_0(tmp_path: Path, plan_a: Path) -> None:
    b = write(tmp_path / "b.frost", make_plan())
    result = frostc("diff", plan_a, b)
    assert result.exit_code == 0, result.output
    assert "same plan" in result.output


def test_diff_lists_header_differences_first_and_exits_1(tmp_path: Path, plan_a: Path) -> None:
    plan = make_plan()
    changed = replace(
        plan,
        header=replace(plan.header, build_key="cd" * 32),
        launches=(replace(plan.launches[0], grid=(2, 2, 1)),),
    )
    b = write(tmp_path / "b.frost", changed)
    result = frostc("diff", plan_a, b, "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert not report["equal"]
    # the content hash and the file's sha256 change with the header and the body
    assert [d["path"] for d in report["header"]] == ["header.build_key", "header.content_hash", "header.sha256"]
    assert report["body"] == [{"path": "launches[0].grid", "change": "changed", "a": [1, 2, 1], "b": [2, 2, 1]}]
    human = frostc("diff", plan_a, b)
    assert human.exit_code == 1
    assert human.output.index("Header differences") < human.output.index("Plan differences")
    assert "launches[0].grid" in human.output


@pytest.mark.parametrize(
    "changes, path",
    [
        ({"slots": tuple(reversed(make_plan().slots))}, "slots[0].name"),
        ({"kernels": (replace(make_plan().kernels[0], cubin=FAKE_CUBIN + b"x"),)}, "kernels[0].cubin_sha256"),
        ({"kernels": (replace(make_plan().kernels[0], block=(256, 1, 1)),)}, "kernels[0].block"),
        ({"launches": (replace(make_plan().launches[0], args=(*make_plan().launches[0].args[:3], Arg(value=0.5))),)},
         "launches[0].args.scale"),
        ({"workspace_bytes": 1024}, "workspace_bytes"),
        ({"slots": make_plan().slots[:1]}, "slots[1]"),
        ({"nodes": (replace(NODE, sizes=NODE.sizes | {"batch": 2}),)}, "nodes[0].sizes.batch"),
        ({"nodes": (replace(NODE, mask=replace(NODE.mask, softcap=30.0)),)}, "nodes[0].mask.softcap"),
        ({"nodes": (replace(NODE, slots=NODE.slots | {"k": 1}),)}, "nodes[0].slots.k"),
    ],
)  # fmt: skip
def test_diff_names_the_field(tmp_path: Path, plan_a: Path, changes: dict, path: str) -> None:
    plan = make_plan(**changes)
    if "slots" in changes and len(plan.slots) == 1:  # drop the launch's and the node's references to the missing slot
        launch = plan.launches[0]
        plan = replace(plan, launches=(replace(launch, args=(Arg(slot=0), Arg(slot=0), *launch.args[2:])),))
        plan = replace(plan, nodes=(replace(NODE, slots=NODE.slots | {"o": 0}),))
    diffs = diff_files(plan_a, write(tmp_path / "b.frost", plan))
    assert path in [d.path for d in diffs]


def test_diff_accepts_the_inspect_json_rendering(tmp_path: Path, plan_a: Path) -> None:
    rendering = frostc("inspect", plan_a, "--json")
    assert rendering.exit_code == 0
    (tmp_path / "a.json").write_text(rendering.stdout)
    assert frostc("diff", tmp_path / "a.json", plan_a).exit_code == 0
    assert frostc("diff", plan_a, tmp_path / "a.json").exit_code == 0
    assert load_summary(tmp_path / "a.json") == load_summary(plan_a)
    other = write(tmp_path / "b.frost", make_plan(workspace_bytes=64))
    assert frostc("diff", tmp_path / "a.json", other).exit_code == 1


@pytest.mark.parametrize(
    "content",
    [b"", b"not a plan", b"{ not json", b'{"header": {}}', b"\x84\xa5magic\xabfrostc-plam"],
)
def test_diff_of_an_unreadable_side_exits_2(tmp_path: Path, plan_a: Path, content: bytes) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(content)
    for args in ((plan_a, bad), (bad, plan_a)):
        result = frostc("diff", *args)
        assert result.exit_code == 2, result.output
        assert "bad" in result.output


def test_diff_of_a_corrupt_plan_exits_2(tmp_path: Path, plan_a: Path) -> None:
    data = bytearray(plan_a.read_bytes())
    data[-40] ^= 0x01  # inside the body: the content hash no longer matches
    corrupt = tmp_path / "corrupt.frost"
    corrupt.write_bytes(bytes(data))
    result = frostc("diff", plan_a, corrupt)
    assert result.exit_code == 2
    assert "content hash" in result.output


def test_diff_of_a_missing_file_exits_2(tmp_path: Path, plan_a: Path) -> None:
    result = frostc("diff", plan_a, tmp_path / "missing.frost")
    assert result.exit_code == 2
    assert "no such file" in result.output


# --------------------------------------------------------------------------------------- check

H200 = GpuDevice(0, "NVIDIA H200", (9, 0), 13000)


def test_check_without_a_driver_says_so_and_exits_1(plan_a: Path) -> None:
    """This machine has no NVIDIA driver: the real probe must answer, not crash."""
    probe = plan_verdict.probe_gpus()
    if probe.devices:
        pytest.skip("this machine has a GPU")
    assert probe.reason and probe.reason.startswith("no GPU/driver found")
    result = frostc("check", plan_a)
    assert result.exit_code == 1, result.output
    assert "valid plan" in result.output
    assert "no GPU/driver found" in result.output
    assert "not runnable here" in result.output
    report = json.loads(frostc("check", plan_a, "--json").stdout)
    assert report["valid"] and not report["runnable"] and report["exit_code"] == 1
    assert report["gpu"]["found"] is False


@pytest.mark.parametrize(
    "devices, runnable, problem",
    [
        ([H200], True, None),
        ([GpuDevice(0, "NVIDIA B200", (10, 0), 13000)], False, "built for sm_90a"),
        ([replace(H200, driver_version=12080)], False, "needs CUDA driver 13.0"),
        ([GpuDevice(0, "NVIDIA B200", (10, 0), 13000), replace(H200, ordinal=1)], True, "built for sm_90a"),
    ],
)
def test_check_judges_each_gpu_with_the_runtime_rule(
    monkeypatch: pytest.MonkeyPatch, plan_a: Path, devices, runnable: bool, problem: str | None
) -> None:
    monkeypatch.setattr(plan_verdict, "probe_gpus", lambda: Probe(devices=devices, driver_version=13000))
    result = frostc("check", plan_a, "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == (0 if runnable else 1)
    assert report["runnable"] is runnable
    if problem:
        assert any(problem in p for d in report["devices"] for p in d["problems"])
    human = frostc("check", plan_a)
    assert ("runnable here" in human.output) and (("not runnable" in human.output) != runnable)


def test_check_of_a_corrupt_plan_exits_2_without_probing(tmp_path: Path, plan_a: Path) -> None:
    data = plan_a.read_bytes()
    cases = {
        "truncated": data[: len(data) // 2],
        "wrong magic": data.replace(b"frostc-plan", b"frostc-plam"),
        "flipped": data[:-40] + bytes([data[-40] ^ 1]) + data[-39:],
        "empty": b"",
    }

    def probe() -> Probe:
        raise AssertionError("an invalid plan needs no GPU probe")

    for name, content in cases.items():
        path = tmp_path / f"{name}.frost"
        path.write_bytes(content)
        report = check_plan_file(path, probe=probe)
        assert report["exit_code"] == 2 and not report["valid"], name
        result = frostc("check", path)
        assert result.exit_code == 2, name
        assert "invalid" in result.output


def test_check_of_a_missing_file_exits_2(tmp_path: Path) -> None:
    result = frostc("check", tmp_path / "missing.frost", "--json")
    assert result.exit_code == 2
    assert "no such file" in json.loads(result.stdout)["error"]


# ------------------------------------------------------------------------------ check --sha256


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_check_reports_the_plans_sha256(plan_a: Path) -> None:
    report = json.loads(frostc("check", plan_a, "--json").stdout)
    assert report["sha256"] == sha256_of(plan_a) and report["pinned"] is None
    assert f"sha256 {sha256_of(plan_a)}" in frostc("check", plan_a).output


def test_check_with_the_right_sha256_goes_on_to_the_gpus(plan_a: Path, tmp_path: Path) -> None:
    pins = tmp_path / "pins.sha256"
    pins.write_text(f"{'0' * 64}  other.frost\n{sha256_of(plan_a).upper()} *{plan_a}\n")
    for pin in (sha256_of(plan_a), str(pins)):
        result = frostc("check", plan_a, "--sha256", pin, "--json")
        report = json.loads(result.stdout)
        assert result.exit_code == 1, result.output  # pinned, valid; no GPU on this machine
        assert report["valid"] and report["pinned"] is True
    assert "the pinned plan" in frostc("check", plan_a, "--sha256", sha256_of(plan_a)).output


def test_check_with_another_sha256_exits_2_without_probing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plan_a: Path
) -> None:
    def probe() -> Probe:
        raise AssertionError("a plan that is not the pinned one needs no GPU probe")

    monkeypatch.setattr(plan_verdict, "probe_gpus", probe)
    other = write(tmp_path / "b.frost", make_plan(workspace_bytes=64))
    result = frostc("check", plan_a, "--sha256", sha256_of(other))
    assert result.exit_code == 2
    assert "not the pinned plan" in result.output
    assert f"the plan's SHA-256 is {sha256_of(plan_a)}, not the pinned {sha256_of(other)}" in result.output
    report = json.loads(frostc("check", plan_a, "--sha256", sha256_of(other), "--json").stdout)
    assert report["exit_code"] == 2 and report["pinned"] is False and report["sha256"] == sha256_of(plan_a)


@pytest.mark.parametrize(
    "pin, words",
    [("abc123", "is not a SHA-256 (64 hex digits"), ("missing-pins.txt", "cannot read it"), ("x" * 64, "cannot read")],
)
def test_check_with_a_bad_sha256_exits_2_naming_it(plan_a: Path, pin: str, words: str) -> None:
    result = frostc("check", plan_a, "--sha256", pin)
    assert result.exit_code == 2
    assert "sha256" in result.output and words in result.output
