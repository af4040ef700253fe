"""Dependencies point down: the stages (`frostc.validate`, `frostc.resolve`) import the ops, and
the ops import the contexts they are given (`frostc.contexts`), never the stages; the contexts
import no op. Checked on the sources with `ast`, following imports through frostc's own modules,
so a circle cannot hide behind a function-level or TYPE_CHECKING import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import frostc

ROOT = Path(frostc.__file__).resolve().parent.parent
STAGES = ("frostc.validate", "frostc.resolve")
OP_MODULES = sorted(f"frostc.ops.{p.stem}" for p in (ROOT / "frostc" / "ops").glob("*.py") if p.stem != "__init__")


def source(module: str) -> Path | None:
    """The file of one of frostc's modules, or None for anything else (a name, not a module)."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imports(module: str) -> set[str]:
    """frostc's modules that `module`'s source imports, at any depth of its code; `from a import b`
    counts as a.b where b is a module, else as a."""
    path = source(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package up
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names = [f"{base}.{a.name}" if source(f"{base}.{a.name}") else base for a in node.names]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] == "frostc" and source(n)}
    return found


def reachable(module: str) -> dict[str, str]:
    """Every frostc module `module` imports, directly or through others: {module: who imports it}."""
    seen, todo = {}, [module]
    while todo:
        current = todo.pop()
        for name in sorted(imports(current)):
            if name not in seen and name != module:
                seen[name] = current
                todo.append(name)
    return seen


def is_under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@pytest.mark.parametrize("module", ["frostc.ops", *OP_MODULES])
def test_the_ops_never_import_a_stage(module: str) -> None:
    assert {m: by for m, by in reachable(module).items() if is_under(m, STAGES)} == {}


def test_the_contexts_import_no_op_and_no_stage() -> None:
    found = reachable("frostc.contexts")
    assert "frostc.resolved" in found, "the scan follows the contexts' imports"
    assert {m: by for m, by in found.items() if is_under(m, ("frostc.ops", *STAGES))} == {}


def test_the_stages_take_their_contexts_from_contexts() -> None:
    assert "frostc.contexts" in imports("frostc.validate")
    assert "frostc.contexts" in imports("frostc.resolve")
    assert "frostc.ops" in imports("frostc.validate") and "frostc.ops" in imports("frostc.resolve")
    assert "frostc.contexts" in reachable("frostc.ops.sdpa_paged")  # the scan follows the ops' imports


def test_the_scan_sees_nested_and_guarded_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "frostc" / "ops"
    package.mkdir(parents=True)
    for name in ("__init__.py", "validate.py", "resolve.py", "contexts.py"):
        (package.parent / name).write_text("")
    (package / "__init__.py").write_text("")
    (package / "bad.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from frostc.validate import NodeContext\n"
        "def f():\n    from frostc import resolve\n"
        "from .. import contexts\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert imports("frostc.ops.bad") == {"frostc.validate", "frostc.resolve", "frostc.contexts"}


KERNELS = ROOT / "frostc" / "kernels"


def defines_a_kernel(path: Path) -> bool:
    """A kernel's module: it defines a class of `frostc.kernels.interface.Kernel` (by name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(
        isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == "Kernel" for b in node.bases)
        for node in ast.walk(tree)
    )


KERNEL_FILES = sorted(p.stem for p in KERNELS.glob("*.py") if defines_a_kernel(p))


def test_the_rule_finds_every_kernel() -> None:
    assert {"sdpa_fwd_wgmma", "sdpa_decode_paged", "sdpa_decode_combine", "sdpa_schedule", "kv_append"} <= set(
        KERNEL_FILES
    )
    assert {"vt_pack", "rms_norm", "silu_mul"} <= set(KERNEL_FILES)
    assert "interface" not in KERNEL_FILES and "sdpa_common" not in KERNEL_FILES


@pytest.mark.parametrize("kernel", KERNEL_FILES)
def test_a_kernel_takes_shared_parts_from_their_modules_not_from_another_kernel(kernel: str) -> None:
    """The parts the kernels share (the interface, softmax, rings, tile walks, sequences, barriers,
    layouts, argument groups) live in modules of their own: no kernel's file imports another
    kernel's, or the ops or stages."""
    found = reachable(f"frostc.kernels.{kernel}")
    others = {f"frostc.kernels.{k}" for k in KERNEL_FILES} - {f"frostc.kernels.{kernel}"}
    assert {m: by for m, by in found.items() if m in others or is_under(m, ("frostc.ops", *STAGES))} == {}


@pytest.mark.parametrize("part", sorted(p.stem for p in KERNELS.glob("*.py") if p.stem not in KERNEL_FILES))
def test_the_kernels_parts_import_no_kernel_op_or_stage(part: str) -> None:
    found = reachable(f"frostc.kernels.{part}")
    kernels = {f"frostc.kernels.{k}" for k in KERNEL_FILES}
    assert {m: by for m, by in found.items() if m in kernels or is_under(m, ("frostc.ops", *STAGES))} == {}


def test_the_decode_kernel_shares_the_forward_kernels_parts() -> None:
    found = reachable("frostc.kernels.sdpa_decode_paged")
    for part in ("online_softmax", "ring", "ragged", "wgmma_layouts", "barriers", "sdpa_common"):
        assert f"frostc.kernels.{part}" in found, part


def all_modules() -> list[str]:
    return sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "frostc").rglob("*.py")
    )


def circles() -> dict[str, str]:
    """Each module that reaches itself through its imports: {module: the module importing it back}."""
    found = {}
    for module in all_modules():
        back = next((other for other in sorted(reachable(module)) if module in imports(other)), None)
        if back is not None:
            found[module] = back
    return found


def test_no_module_of_frostc_is_in_an_import_circle_even_for_types_only() -> None:
    """Every import counts, TYPE_CHECKING and function-level ones too."""
    assert circles() == {}


def test_the_circle_scan_finds_a_guarded_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "frostc" / "ops"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from frostc.ops import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from frostc.ops.a import X\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert circles() == {"frostc.ops.a": "frostc.ops.b", "frostc.ops.b": "frostc.ops.a"}
