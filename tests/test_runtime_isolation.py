"""The runtime stands alone: importing it pulls in neither the compiler (frostc) nor the DSL
(cutlass), its sources import neither, its command line (`python -m frost_runtime`) runs where
only the runtime is on the path and uses no typer or rich, and the parts that need no GPU (the
compatibility rules and the parameter-block layout) behave as documented."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import frost_runtime
import pytest
from frost_runtime.plan import _param_offsets
from frost_runtime.schema import Kernel, Param

RUNTIME_DIR = Path(frost_runtime.__file__).resolve().parent
FORBIDDEN = ("frostc", "cutlass", "typer", "rich")  # the compiler, the DSL, the compiler's CLI libraries
SOURCES = sorted(RUNTIME_DIR.rglob("*.py"))  # the subpackages' too (frost_runtime.hf)
MODULES = tuple(
    ".".join(("frost_runtime", *p.relative_to(RUNTIME_DIR).with_suffix("").parts)).removesuffix(".__init__")
    for p in SOURCES
)


def is_forbidden(module: str) -> bool:
    top = module.split(".")[0]
    return any(top.startswith(name) for name in FORBIDDEN)


# ----------------------------------------------------------------------------------- imports


def test_importing_the_runtime_loads_no_compiler_or_dsl_module() -> None:
    code = (
        "import sys, importlib\n"
        f"for name in {MODULES!r}: importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0].startswith({FORBIDDEN!r}))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_runtime_is_the_one_in_this_repository() -> None:
    assert RUNTIME_DIR.parent.name == "runtime"
    assert [p.relative_to(RUNTIME_DIR).as_posix() for p in SOURCES] == [
        "__init__.py", "__main__.py", "bench.py", "driver.py", "dtypes.py", "fp8.py",
        "hf/__init__.py", "hf/backend.py", "hf/cache.py", "hf/cb_cache.py", "hf/cb_patches.py", "hf/cb_plans.py",
        "hf/cb_reference.py", "hf/cb_step.py", "hf/continuous.py", "hf/decode_graph.py", "hf/launches.py",
        "hf/metadata.py", "hf/pools.py", "hf/reference.py", "hf/serve.py", "hf/support.py",
        "hf_fuse.py", "integrity.py", "plan.py", "planset.py", "schema.py", "sinks.py", "timing.py", "torch_ops.py",
        "verdict.py", "workload.py",
    ]  # fmt: skip


def runtime_only(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m frost_runtime ARGS` with the runtime alone importable (not the repository's root,
    so not frostc), reporting the forbidden modules it loaded on its last line."""
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['frost_runtime', *{list(args)!r}]\n"
        "try:\n"
        "    runpy.run_module('frost_runtime', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0].startswith({FORBIDDEN!r}))\n"
        "print('exit', code, 'forbidden', bad)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(RUNTIME_DIR.parent)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )


def test_the_command_line_runs_with_the_runtime_alone(tmp_path: Path) -> None:
    from tests.test_diff_check import make_plan, write  # a hand-made plan: nothing to compile

    plan = write(tmp_path / "toy.frost", make_plan())
    (tmp_path / "bad.frost").write_bytes(b"not a plan")
    help_ = runtime_only(tmp_path, "--help")
    assert "bench" in help_.stdout and help_.stdout.splitlines()[-1] == "exit 0 forbidden []", help_.stderr
    for args, codes in (
        (("check", str(plan)), (0, 1)),  # 1: no GPU here
        (("check", "bad.frost", "--json"), (2,)),
        (("bench", "bad.frost"), (2,)),
        (("bench", str(plan), "--duration", "0.1"), (0, 1)),
    ):
        result = runtime_only(tmp_path, *args)
        last = result.stdout.splitlines()[-1]
        assert last.endswith("forbidden []"), (args, last)
        assert int(last.split()[1]) in codes, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)


def imported_modules(path: Path) -> list[str]:
    """Every module an `import` or `from ... import` in `path` names, at any depth."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(RUNTIME_DIR).as_posix())
def test_runtime_source_imports_no_compiler_or_dsl(path: Path) -> None:
    modules = imported_modules(path)
    assert modules, "every runtime module imports something; the scan found nothing"
    assert [m for m in modules if is_forbidden(m)] == []


def test_the_source_scan_sees_nested_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import cutlass.cute\n    from frostc import build\n")
    assert [m for m in imported_modules(sample) if is_forbidden(m)] == ["cutlass.cute", "frostc"]


# ----------------------------------------------------------------------------- compatibility


def device(cc: tuple[int, int] = (9, 0), driver: int = 13000, name: str = "NVIDIA H100") -> SimpleNamespace:
    return SimpleNamespace(name=name, compute_capability=cc, driver_version=driver)


def test_sm_90a_runs_on_compute_capability_9_0() -> None:
    assert frost_runtime.compatibility_problems("sm_90a", 13000, device((9, 0))) == []


def test_a_newer_driver_is_fine() -> None:
    assert frost_runtime.compatibility_problems("sm_90a", 13000, device(driver=13020)) == []


def test_sm_90a_is_refused_on_10_0_naming_sm_100() -> None:
    (problem,) = frost_runtime.compatibility_problems("sm_90a", 13000, device((10, 0), name="NVIDIA B200"))
    assert "built for sm_90a" in problem
    assert "NVIDIA B200 is sm_100" in problem
    assert '"sm_100a"' in problem


def test_sm_100a_is_refused_on_9_0() -> None:
    (problem,) = frost_runtime.compatibility_problems("sm_100a", 13000, device((9, 0)))
    assert "built for sm_100a" in problem
    assert "is sm_90" in problem


def test_arch_specific_target_needs_the_exact_minor() -> None:
    assert frost_runtime.compatibility_problems("sm_90a", 13000, device((9, 1))) != []


def test_plain_target_runs_on_later_minors_of_the_same_major() -> None:
    assert frost_runtime.compatibility_problems("sm_80", 13000, device((8, 6))) == []
    assert frost_runtime.compatibility_problems("sm_86", 13000, device((8, 0))) != []
    assert frost_runtime.compatibility_problems("sm_80", 13000, device((9, 0))) != []


def test_old_driver_is_refused_naming_both_versions() -> None:
    (problem,) = frost_runtime.compatibility_problems("sm_90a", 13000, device(driver=12080))
    assert "13.0" in problem
    assert "12.8" in problem
    assert "driver" in problem


def test_wrong_arch_and_old_driver_are_both_reported() -> None:
    problems = frost_runtime.compatibility_problems("sm_90a", 13000, device((10, 0), driver=12080))
    assert len(problems) == 2


@pytest.mark.parametrize("target", ["", "sm_", "sm_9", "gfx90a", "sm_xxa"])
def test_unknown_target_is_refused(target: str) -> None:
    (problem,) = frost_runtime.compatibility_problems(target, 13000, device())
    assert "unknown target architecture" in problem


# ------------------------------------------------------------------------- parameter layout


def kernel_with(kinds: list[str]) -> Kernel:
    return Kernel(
        name="k",
        entry="k",
        cubin=b"\x7fELF",
        params=tuple(Param(f"p{i}", kind) for i, kind in enumerate(kinds)),
        block=(128, 1, 1),
        cluster=(1, 1, 1),
        smem_bytes=0,
        grid_rule="",
    )


def test_param_offsets_use_natural_alignment() -> None:
    offsets, size = _param_offsets(kernel_with(["ptr", "i32", "i64", "f32", "i32", "ptr"]))
    assert offsets == [0, 8, 16, 24, 28, 32]
    assert size == 40


def test_param_offsets_of_no_params() -> None:
    assert _param_offsets(kernel_with([])) == ([], 0)


def test_param_offsets_pad_a_pointer_after_an_odd_i32() -> None:
    assert _param_offsets(kernel_with(["i32", "ptr", "f32", "i64"])) == ([0, 8, 16, 24], 32)
