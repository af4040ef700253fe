"""bench/common.py on the CPU: the rotation of `alternating`, what `publish` writes, the command
line every build/run script shares (each script answers `run --help` with its options, in a
process that has only the script's own path setup), and `time_ms` as the runtime's device time
of CUDA-graph replays."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


@pytest.fixture(scope="module")
def common():
    spec = importlib.util.spec_from_file_location("common", BENCH / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------- timing


def test_alternating_rotates_the_order_and_takes_each_median(common) -> None:
    order = []
    times = {"a": iter([5.0, 1.0, 3.0, 9.0]), "b": iter([2.0, 2.0, 4.0, 4.0]), "c": iter([7.0, 6.0, 8.0, 1.0])}

    def measure(name: str) -> float:
        order.append(name)
        return next(times[name])

    medians = common.alternating({name: name for name in "abc"}, rounds=4, measure=measure)
    assert order == list("abcbcacababc")
    assert medians == {"a": 4.0, "b": 3.0, "c": 6.5}


def test_time_ms_is_the_runtime_device_time_of_graph_replays(common, monkeypatch) -> None:
    from frost_runtime import timing

    seen = []

    def device_us(call, **options):
        seen.append(options)
        return 1500.0, 400

    monkeypatch.setattr(timing, "device_us", device_us)
    assert common.time_ms(print) == 1.5
    assert common.time_ms(print, calls=5) == 1.5
    assert seen == [{"graph": True, "calls": timing.GRAPH_CALLS}, {"graph": True, "calls": 5}]


# ----------------------------------------------------------------------------------- the report


def test_publish_prints_and_writes_the_table_and_the_numbers(common, tmp_path: Path, capsys) -> None:
    common.publish("| a |", {"x": 1})
    assert capsys.readouterr().out == "| a |\n"
    assert list(tmp_path.iterdir()) == []
    common.publish("| a |", [1, 2], md=tmp_path / "t.md")  # the numbers beside the table
    assert (tmp_path / "t.md").read_text() == "| a |"
    assert json.loads((tmp_path / "t.json").read_text()) == [1, 2]
    common.publish("| b |", {"y": 2}, md=tmp_path / "u.md", json_path=tmp_path / "raw.json")
    assert not (tmp_path / "u.json").exists() and json.loads((tmp_path / "raw.json").read_text()) == {"y": 2}
    common.publish("| c |", {"z": 3}, json_path=tmp_path / "only.json")
    assert json.loads((tmp_path / "only.json").read_text()) == {"z": 3}


def test_the_plans_description_validates(common) -> None:
    from frostc.validate import validate

    graph = validate(common.dense_description("dense", (2, 4, 256, 128), causal=True))
    assert graph.name == "dense" and len(graph.nodes) == 1


def test_the_plans_description_takes_a_value_head_dim(common) -> None:
    """bench/sdpa.py's DeepSeek rows: v and o at 128 under q and k at 192."""
    from frostc.validate import validate

    graph = validate(common.dense_description("mla-prefill", (1, 2, 256, 192), causal=False, head_dim_v=128))
    assert {t.name: t.dims[-1] for t in graph.tensors} == {"q": 192, "k": 192, "v": 128, "o": 128}


# ----------------------------------------------------------------------------------- the command line


def test_a_command_gets_its_options_as_keywords(common, tmp_path: Path) -> None:
    calls = []

    def run(md=None, json_path=None):
        calls.append(("run", md, json_path))
        return 3

    def build():
        calls.append(("build",))
        return 0

    assert common.main("doc\nmore", build, run, argv=["build"]) == 0
    assert common.main("doc", build, run, argv=["run", "--md", str(tmp_path / "t.md")]) == 3
    assert common.main("doc", build, run, argv=["run", "--json", "r.json", "--md", "t.md"]) == 3
    assert calls == [("build",), ("run", tmp_path / "t.md", None), ("run", Path("t.md"), Path("r.json"))]


@pytest.mark.parametrize("argv", [[], ["bench"], ["build", "--md", "x"]])
def test_bad_command_lines_exit_2(common, argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as info:
        common.main("doc", lambda: 0, lambda md=None, json_path=None: 0, argv=argv)
    assert info.value.code == 2 and "usage" in capsys.readouterr().err


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    """`python bench/NAME.py ARGS` from elsewhere, with no PYTHONPATH: the script finds the code."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [sys.executable, str(BENCH / f"{name}.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd="/", env=env)


@pytest.mark.parametrize(
    "name, options",
    [
        ("sdpa", ["--md FILE", "--json FILE"]),
        ("varlen", ["--md FILE", "--json FILE"]),
        ("fp8", ["--md FILE", "--json FILE"]),
        ("decode", ["--md FILE", "--json FILE"]),
        ("model", ["--md FILE", "--json FILE", "--hf-compiled", "--compiled-model"]),
        ("host_overhead", []),
        ("sanitize", ["--plans", "--only", "--tools"]),
        ("mixed", ["--md FILE", "--json FILE"]),
        ("serve", ["--md FILE", "--json FILE", "--requests", "--attn", "--profile"]),
    ],
)
def test_each_script_answers_run_help(name: str, options: list[str]) -> None:
    result = script(name, "run", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {name}.py run ")
    for option in options:
        assert option in result.stdout, option
    assert ("--md" in result.stdout) == ("--md FILE" in options)


def test_sanitize_refuses_an_unknown_tool() -> None:
    result = script("sanitize", "run", "--tools", "memcheck,leakcheck")
    assert result.returncode == 2 and "unknown tool(s) leakcheck; choose from memcheck" in result.stderr
