"""Every verb on every kind of bad input: a clean message on stderr and the README's exit code,
never a traceback. Verbs: `frostc build`, `inspect` (tables and --json), `diff` (either side),
`check` (tables and --json) and `python -m frostc.golden`. Inputs: empty, corrupt, truncated
and foreign files (a PNG, JSON of other shapes, msgpack maps of other shapes, random bytes,
text that is not UTF-8, nesting deeper than Python recurses), a folder, a path that does not
exist, a path under a file, an unreadable file, and names that look like rich markup.

Nothing here compiles: descriptions that would compile are not among the inputs, and the
compile stage is replaced by one that fails the test. In-process through typer's CliRunner
(each verb's exit code and stderr), plus a few real processes to see what a user's terminal
shows."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
from frost_runtime import planset, schema

from frostc import golden
from tests.test_cli import frostc, plan_with_slot_named
from tests.trees import positions

ROOT = Path(__file__).resolve().parent.parent
DECODE = ROOT / "plans" / "golden" / "llama3-8b-decode-page16.toml"
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"


@pytest.fixture(autouse=True)
def nothing_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every input here must be refused before the compile stage: reaching it fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a bad input reached the compile stage")

    monkeypatch.setattr("frostc.build.compile_kernels", refuse)


def _good_plan() -> bytes:
    return plan_with_slot_named("x")


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _corrupt(data: bytes) -> bytes:
    raw = bytearray(data)
    raw[len(raw) // 2] ^= 0xFF
    return bytes(raw)


def _reheader(**fields) -> bytes:
    """The good plan with header fields replaced (the content hash stays right)."""
    top = msgpack.unpackb(_good_plan(), raw=False)
    top["header"] = dict(top["header"]) | fields
    return _pack(top)


def _good_set() -> bytes:
    """A valid plan set of one toy plan (nothing compiled)."""
    plan = _good_plan()
    header = planset.SetHeader("toyset", "a toy", "0.1.0", "4.8.0", "sm_90a", 13000)
    entry = planset.SetEntry("l0-decode-b1", "toy", "decode", 1, "l0", (0, 1), hashlib.sha256(plan).hexdigest())
    kind = planset.KindInfo("l0", (0, 1), 8, 2, 64, "bf16", 0.125, None, None)
    serving = planset.ServingInfo(4096, 16, 256, 4096, 1, 1, "bf16")
    return planset.encode_set(header, [(entry, plan)], (), (kind,), serving)


# name -> bytes of a file that is neither a plan nor a description frostc can build
CONTENTS: dict[str, bytes] = {
    "empty": b"",
    "one-zero-byte": b"\x00",
    "png": PNG,
    "random": bytes((i * 7919 + 13) % 256 for i in range(4096)),
    "not-utf8": b"format = 1\nname = \xff\xfe\n",
    "json-object": b'{"a": 1}',
    "json-array": b"[1, 2, 3]",
    "json-deep": b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "json-invalid": b'{"a": }',
    "msgpack-list": _pack([1, 2, 3]),
    "msgpack-other-map": _pack({"name": "x", "tensors": {"q": [1, 2]}}),
    "msgpack-plan-shaped": _pack({"magic": "frostc-plan", "format": schema.FORMAT_VERSION, "header": 5, "body": b""}),
    "msgpack-newer-format": _pack({"magic": "frostc-plan", "format": 99, "header": {}, "body": b""}),
    "msgpack-deep": b"\x91" * 100_000,
    "msgpack-huge-claims": b"\xdf\xff\xff\xff\xff",
    "toml-invalid": b"format = = 1\n",
    "plan-corrupt": _corrupt(_good_plan()),
    "plan-truncated": _good_plan()[: len(_good_plan()) // 2],
    "plan-bad-header": _reheader(target_arch="[/x]"),
    "plan-control-char-name": _reheader(name="[/bold red]\x01"),
    "set-corrupt": _corrupt(_good_set()),
    "set-truncated": _good_set()[: len(_good_set()) // 2],
    "set-newer-format": _good_set().replace(
        b"\xa6format" + bytes([planset.SET_FORMAT_VERSION]), b"\xa6format" + bytes([planset.SET_FORMAT_VERSION + 3]), 1
    ),
    "set-shaped": _pack({"magic": planset.SET_MAGIC, "format": 1, "header": 5, "manifest": {}, "cubins": {}}),
}


def _write(content: bytes) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / "input.frost"
        path.write_bytes(content)
        return path

    return make


def _folder(folder: Path) -> Path:
    (folder / "a_folder").mkdir()
    return folder / "a_folder"


def _under_a_file(folder: Path) -> Path:
    (folder / "a_file").write_bytes(b"x")
    return folder / "a_file" / "input.frost"  # ENOTDIR: as unreadable as it gets, also for root


def _unreadable(folder: Path) -> Path:
    path = folder / "locked.frost"
    path.write_bytes(_good_plan())
    path.chmod(0)
    try:
        path.read_bytes()
    except PermissionError:
        return path
    pytest.skip("running as root (or with CAP_DAC_OVERRIDE): chmod 000 does not stop reads here")


def _markup_name(folder: Path) -> Path:
    """A path whose text is rich markup, a closing tag included: "…/a[/bold]x[red].frost"."""
    (folder / "a[").mkdir()
    path = folder / "a[" / "bold]x[red].frost"
    path.write_bytes(b"junk")
    return path


INPUTS: dict[str, Callable[[Path], Path]] = {name: _write(content) for name, content in CONTENTS.items()}
INPUTS |= {
    "folder": _folder,
    "missing": lambda folder: folder / "nope.frost",
    "under-a-file": _under_a_file,
    "unreadable": _unreadable,
    "markup-name": _markup_name,
}


def assert_clean(result, code: int) -> None:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    # in-process, an escaped exception would be result.exception rather than printed
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert "error" in result.stderr or "invalid" in result.stderr, result.stderr


# ---------------------------------------------------------------------------- plans: inspect, diff, check


@pytest.mark.parametrize("make", list(INPUTS.values()), ids=list(INPUTS))
def test_inspect_refuses_cleanly(tmp_path: Path, make) -> None:
    path = make(tmp_path)
    for flags in ((), ("--json",)):
        result = frostc("inspect", path, *flags)
        assert_clean(result, 2)
        assert result.stdout == ""


@pytest.mark.parametrize("make", list(INPUTS.values()), ids=list(INPUTS))
def test_diff_refuses_either_side_cleanly(tmp_path: Path, make) -> None:
    path = make(tmp_path)
    good = tmp_path / "good.frost"
    good.write_bytes(_good_plan())
    for a, b in ((path, good), (good, path)):
        for flags in ((), ("--json",)):
            assert_clean(frostc("diff", a, b, *flags), 2)


@pytest.mark.parametrize("make", list(INPUTS.values()), ids=list(INPUTS))
def test_check_says_invalid_cleanly(tmp_path: Path, make) -> None:
    path = make(tmp_path)
    assert_clean(frostc("check", path), 2)
    result = frostc("check", path, "--json")
    assert result.exit_code == 2 and "Traceback" not in result.output
    verdict = json.loads(result.stdout)
    assert verdict["valid"] is False and verdict["exit_code"] == 2 and verdict["error"]


# ---------------------------------------------------------------------------- descriptions: build


@pytest.mark.parametrize("make", list(INPUTS.values()), ids=list(INPUTS))
def test_build_refuses_cleanly_and_writes_nothing(tmp_path: Path, make) -> None:
    path = make(tmp_path)
    out = tmp_path / "out" / "plan.frost"
    assert_clean(frostc("build", path, "-o", out), 2)
    assert not out.parent.exists()


MALFORMED_TOML = {
    "double-equals": "format = = 1\n",
    "open-table": "[tensors.q\ndtype = 'bf16'\n",
    "open-array": "format = 1\ndims = [1, 2\n",
    "open-string": 'name = "default\n',
    "duplicate-key": "format = 1\nformat = 1\n",
    "duplicate-table": "[tensors.q]\ndtype = 'bf16'\n[tensors.q]\ndtype = 'bf16'\n",
    "nul": "format = 1\x00\n",
    "deep-arrays": "a = " + "[" * 5000 + "]" * 5000 + "\n",
    "deep-tables": "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n",
    "nodes-as-table": "format = 1\nname = 'x'\n[nodes]\nop = 'sdpa'\n",
    "tensors-as-array": "format = 1\nname = 'x'\ntensors = [1, 2]\n",
    "datetime-dims": "format = 1\nname = 'x'\n[tensors.q]\ndtype = 'bf16'\ndims = 1979-05-27T07:32:00Z\n",
}


@pytest.mark.parametrize("text", list(MALFORMED_TOML.values()), ids=list(MALFORMED_TOML))
def test_malformed_toml_is_refused_with_the_file_named(tmp_path: Path, text: str) -> None:
    desc = tmp_path / "graph.toml"
    desc.write_text(text)
    result = frostc("build", desc, "-o", tmp_path / "out.frost")
    assert_clean(result, 2)
    assert str(desc) in result.stderr


def _replaced(tree, path: tuple, value):
    tree = json.loads(json.dumps(tree))
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return tree


# values of every JSON type; for each field, those of another type than the field's own
WRONG = {bool: True, int: -3, float: 2.5, str: "[/x]", list: [1, [2]], dict: {"a": 1}}


def _wrong_types(value) -> list:
    return [v for t, v in WRONG.items() if t is not type(value)]


def test_every_field_of_a_wrong_type_is_refused_by_path(tmp_path: Path) -> None:
    """Each field of the decode description (tensors, nodes, every key) given a value of each
    other JSON type: exit 2, the field's path in the message, nothing compiled or written."""
    import tomllib

    base = tomllib.loads(DECODE.read_text())
    desc, out = tmp_path / "graph.json", tmp_path / "out.frost"
    tried = 0
    for path in positions(base)[1:]:
        if path in (("name",),) or path[-1] == "name":  # any string is a fine name
            continue
        current = base
        for key in path:
            current = current[key]
        for value in _wrong_types(current):
            desc.write_text(json.dumps(_replaced(base, path, value)))
            result = frostc("build", desc, "-o", out)
            assert_clean(result, 2)
            assert not out.exists()
            tried += 1
    assert tried > 200


def test_a_grid_over_cudas_limit_is_refused_before_compiling(tmp_path: Path) -> None:
    """The paged attention's grid y is (KV heads x blocks of 64 query rows): 140,000 here,
    over CUDA's 65,535. Once a PlanFormatError traceback after the compile; now the field."""
    text = DECODE.read_text()
    for old, new in (
        ("dims = [64, 32, 1, 128]", "dims = [64, 560000, 16, 128]"),
        ("dims = [64, 8, 1, 128]", "dims = [64, 70000, 16, 128]"),
        ("dims = [32768, 16, 8, 128]", "dims = [64, 16, 70000, 128]"),
    ):
        assert old in text
        text = text.replace(old, new)
    desc = tmp_path / "big.toml"
    desc.write_text(text)
    result = frostc("build", desc, "-o", tmp_path / "big.frost")
    assert_clean(result, 2)
    assert "tensors.q.dims[1]" in result.stderr and "grid y" in result.stderr and "65535" in result.stderr


def test_build_that_cannot_write_its_dump_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError inside the pipeline (--dump names a file, say): one message naming it, exit 2."""
    blocker = tmp_path / "blocker"

    def pipeline(desc, progress=None, dump_dir=None):
        raise NotADirectoryError(20, "Not a directory", str(Path(dump_dir) / "1-description.toml"))

    monkeypatch.setattr("frostc.build.build", pipeline)
    result = frostc("build", ROOT / "plans/examples/default.toml", "-o", tmp_path / "p.frost", "--dump", blocker)
    assert_clean(result, 2)
    assert f"cannot write {blocker / '1-description.toml'}: Not a directory" in result.stderr
    assert not (tmp_path / "p.frost").exists()


# ---------------------------------------------------------------------------- the net under every verb


def test_an_unexpected_error_is_one_message_and_exit_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "good.frost"
    path.write_bytes(_good_plan())
    monkeypatch.setattr("frostc.inspect.print_plan", lambda *a: {}["no such key"])
    result = frostc("inspect", path)
    assert_clean(result, 3)
    assert "internal error: KeyError" in result.stderr and "frostc bug" in result.stderr
    monkeypatch.setenv("FROSTC_TRACEBACK", "1")
    assert isinstance(frostc("inspect", path).exception, KeyError)  # the traceback, on request


def test_an_input_error_no_verb_expected_is_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "good.frost"
    path.write_bytes(_good_plan())

    def broken_pipe(*args):
        raise BrokenPipeError(32, "Broken pipe", "<stdout>")

    monkeypatch.setattr("frostc.inspect.print_plan", broken_pipe)
    result = frostc("inspect", path)
    assert_clean(result, 2)
    assert "<stdout>: Broken pipe" in result.stderr


# ---------------------------------------------------------------------------- python -m frostc.golden


@pytest.mark.parametrize("content", ["junk = = 1", "", "format = 1"], ids=["invalid", "empty", "incomplete"])
def test_golden_reports_a_description_that_does_not_build(tmp_path: Path, capsys, content: str) -> None:
    (tmp_path / "[red]x.toml").write_text(content)
    assert golden.main(["--dir", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert "[red]x.toml: does not build" in out.out and "Traceback" not in out.out + out.err


@pytest.mark.parametrize("kind", ["missing", "a-file", "empty"])
def test_golden_on_a_folder_without_descriptions_exits_2(tmp_path: Path, capsys, kind: str) -> None:
    folder = {"missing": tmp_path / "nope", "a-file": tmp_path / "f", "empty": tmp_path}[kind]
    if kind == "a-file":
        folder.write_text("x")
    assert golden.main(["--dir", str(folder)]) == 2
    assert "no golden descriptions" in capsys.readouterr().out


def test_golden_reports_a_description_folder_named_like_a_toml_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "x.toml").mkdir()
    assert golden.main(["--dir", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert "x.toml: does not build" in out.out and "Traceback" not in out.out + out.err


def test_golden_internal_error_is_one_message_and_exit_3(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(golden, "run", lambda *a: [][0])
    assert golden.main(["--dir", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "internal error: IndexError" in err and "Traceback" not in err


# ---------------------------------------------------------------------------- real processes


def _run(*args: str | Path) -> subprocess.CompletedProcess:
    env = os.environ | {"COLUMNS": "200", "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT)])}
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env
    )


def test_a_users_terminal_shows_no_traceback(tmp_path: Path) -> None:
    """The verbs as a user runs them (their own processes, real stderr), on a few bad inputs."""
    png = tmp_path / "image.png"
    png.write_bytes(PNG)
    desc = tmp_path / "graph.toml"
    desc.write_bytes(CONTENTS["msgpack-other-map"])
    runs = [
        (("-m", "frostc", "build", desc, "-o", tmp_path / "o.frost"), 2),
        (("-m", "frostc", "build", tmp_path, "-o", tmp_path / "o.frost"), 2),
        (("-m", "frostc", "inspect", png), 2),
        (("-m", "frostc", "inspect", tmp_path / "nope.frost", "--json"), 2),
        (("-m", "frostc", "diff", png, tmp_path), 2),
        (("-m", "frostc", "check", png), 2),
        (("-m", "frostc.golden", "--dir", tmp_path / "nope"), 2),
    ]
    for args, code in runs:
        result = _run(*args)
        assert result.returncode == code, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr + result.stdout, (args, result.stderr)
        assert result.stderr.strip() or result.stdout.strip(), args
