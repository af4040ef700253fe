"""README.md and docs/*.md tell the truth: CI runs README's test command exactly, and every example
a reader may copy works as written.

- README has exactly two install-and-run commands, and .ci/run runs the second, character for character.
- Every ```toml block is a whole description that parses, validates and resolves.
- Every ```python block compiles, and every frostc / frost_runtime name it uses exists: module
  attributes (`frost_runtime.read_set`, `hf.DecodeGraph`), and the methods and attributes of what
  they return where the return type is annotated (`plan = frost_runtime.load(...)`, then `plan.bind`).
  Inline `frostc.x.y` / `frost_runtime.x.y` names in the prose are checked the same way.
- Every command shown (`frostc VERB`, `python -m frost_runtime VERB`, `python -m frostc.golden`) names
  a verb and options that exist (the typer app in frostc/cli.py, the runtime's argparse); a lone
  `--option` in the prose belongs to one of them.
- Every relative link points at a file that exists (and, into docs/ or README, at a heading there).
"""

import argparse
import ast
import contextlib
import importlib
import inspect
import io
import re
import types
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

# Options of other programs that the docs name in passing (vLLM's).
# vLLM's and `transformers serve`'s flags, which the pages name beside frostc's (a deployment must
# match its plan set), and `python -m frost_runtime.hf.serve`'s own --plans
FOREIGN_OPTIONS = {
    "--num-gpu-blocks-override", "--max-model-len", "--block-size", "--tensor-parallel-size", "--attention-backend",
    "--continuous-batching", "--attn-implementation", "--cb-block-size", "--cb-num-blocks",
}  # fmt: skip


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# ---------------------------------------------------------------------------------------------
# Reading markdown: fenced blocks by language, inline code spans, code lines


def fenced_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, text) of every ``` block of the page."""
    blocks, lang, lines = [], None, []
    for line in page.read_text().splitlines():
        if lang is None:
            if line.startswith("```"):
                lang, lines = line[3:].strip(), []
        elif line.startswith("```"):
            blocks.append((lang, "\n".join(lines) + "\n"))
            lang = None
        else:
            lines.append(line)
    assert lang is None, f"{page_id(page)}: a ``` block is not closed"
    return blocks


def prose_lines(page: Path) -> list[str]:
    """The page's lines outside ``` blocks."""
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def inline_spans(page: Path) -> list[str]:
    """Inline code spans, which may wrap across the lines of a paragraph."""
    paragraphs = "\n".join(prose_lines(page)).split("\n\n")
    return [" ".join(span.split()) for par in paragraphs for span in re.findall(r"`([^`]+)`", par)]


def code_lines(page: Path) -> list[str]:
    """Lines of code a reader may run: fenced sh/console/bash/text blocks (a trailing backslash
    continues a line), indented code lines, and inline spans."""
    lines = []
    for lang, text in fenced_blocks(page):
        if lang in ("toml", "python", "json"):
            continue
        lines += text.replace("\\\n", " ").splitlines()
    lines += [line.strip() for line in prose_lines(page) if line.startswith("    ") and line.strip()]
    return lines + inline_spans(page)


def toml_blocks(page: Path) -> list[str]:
    return [text for lang, text in fenced_blocks(page) if lang == "toml"]


def python_blocks(page: Path) -> list[str]:
    return [text for lang, text in fenced_blocks(page) if lang == "python"]


# ---------------------------------------------------------------------------------------------
# The two commands and CI


def readme_commands() -> list[str]:
    lines = README.read_text().splitlines()
    return [line.strip() for line in lines if line.startswith("    python3 -m venv")]


def test_readme_has_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert "frostc build plans/examples/default.toml" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    assert readme_commands()[1] in ci_lines


def test_readme_is_short():
    assert len(README.read_text().splitlines()) < 150


def test_the_docs_pages_exist():
    names = {p.name for p in DOCS}
    for name in (
        "cli.md",
        "description.md",
        "variable-lengths.md",
        "fp8.md",
        "serving.md",
        "runtime.md",
        "plan-format.md",
        "architecture.md",
    ):
        assert name in names


# ---------------------------------------------------------------------------------------------
# TOML examples


def all_toml_blocks() -> list:
    return [
        pytest.param(page_id(p), i, block, id=f"{page_id(p)}-{i}")
        for p in PAGES
        for i, block in enumerate(toml_blocks(p))
    ]


def test_there_are_toml_examples():
    assert len(toml_blocks(README)) >= 1
    assert len(all_toml_blocks()) >= 8


@pytest.mark.parametrize("page, index, block", all_toml_blocks())
def test_every_toml_example_parses_validates_and_resolves(page, index, block):
    """A new user copies these: each must be a whole, valid description as written."""
    from frostc.description import parse_description
    from frostc.resolve import resolve
    from frostc.validate import validate

    plan = resolve(validate(parse_description(block)))
    assert plan.launches, f"{page}, toml block {index}: no launches"


def test_the_builder_keys_the_docs_name_are_real():
    from frostc.ops.sdpa import KEYS

    text = "".join(p.read_text() for p in PAGES)
    for key in ("cu_seqlens_q", "seq_len_kv", "window_left", "diagonal_alignment", "softcap", "max_seqlen_q"):
        assert key in text and key in KEYS


def test_every_sdpa_key_is_documented():
    from frostc.ops.sdpa import KEYS

    text = (ROOT / "docs" / "description.md").read_text()
    for key in KEYS:
        assert f"`{key}`" in text, key


# ---------------------------------------------------------------------------------------------
# Python examples: they compile, and the names they take from frostc / frost_runtime exist


class Instance:
    """A value of a known class (what an annotated function returned, or a class called)."""

    def __init__(self, cls: type):
        self.cls = cls


def _returned(fn) -> object | None:
    """What calling `fn` gives, where that is known: an Instance of its annotated return class."""
    if isinstance(fn, type):
        return Instance(fn)
    try:
        ret = typing.get_type_hints(fn).get("return")
    except Exception:
        return None
    return Instance(ret) if isinstance(ret, type) else None


def _instance_has(cls: type, name: str) -> bool:
    """`name` is a class attribute, an annotated field, or assigned as self.name in a method."""
    if hasattr(cls, name):
        return True
    for klass in cls.__mro__:
        if klass is object:
            continue
        if name in getattr(klass, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(name)}\b\s*(:[^=\n]*)?=", source):
            return True
    return False


def _member(value, name: str, where: str):
    """value.name, checked: an AssertionError naming `where` when it does not exist; None when the
    result is not something further names can be checked on."""
    if isinstance(value, types.ModuleType):
        if not hasattr(value, name):
            try:
                importlib.import_module(f"{value.__name__}.{name}")
            except ModuleNotFoundError:
                pass
        assert hasattr(value, name), f"{where}: {value.__name__} has no attribute {name!r}"
        return getattr(value, name)
    if isinstance(value, type):
        assert hasattr(value, name), f"{where}: {value.__qualname__} has no attribute {name!r}"
        return getattr(value, name)
    if isinstance(value, Instance):
        assert _instance_has(value.cls, name), f"{where}: {value.cls.__qualname__} has no attribute {name!r}"
        attr = getattr(value.cls, name, None)
        return attr if callable(attr) else None
    return None


ROOTS = ("frostc", "frost_runtime")


class NameChecker(ast.NodeVisitor):
    """Follows the names a snippet binds to frostc / frost_runtime modules and to the annotated
    results of their functions, and checks every attribute taken from them."""

    def __init__(self, where: str):
        self.where = where
        self.env = {name: importlib.import_module(name) for name in ROOTS}
        self.checked: list[str] = []

    def value(self, node):
        """The object an expression denotes, where known (a module, class, function or Instance)."""
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.value(node.value)
            if base is None:
                return None
            self.checked.append(ast.unparse(node))
            return _member(base, node.attr, f"{self.where}: {ast.unparse(node)}")
        if isinstance(node, ast.Call):
            fn = self.value(node.func)
            for arg in (*node.args, *(k.value for k in node.keywords)):
                self.visit(arg)
            if isinstance(fn, Instance):
                return None
            return _returned(fn) if callable(fn) else None
        self.visit(node)
        return None

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name.split(".")[0] in ROOTS:
                module = importlib.import_module(alias.name)
                if alias.asname:
                    self.env[alias.asname] = module
                else:
                    self.env[alias.name.split(".")[0]] = importlib.import_module(alias.name.split(".")[0])

    def visit_ImportFrom(self, node):
        if node.module and node.module.split(".")[0] in ROOTS:
            module = importlib.import_module(node.module)
            for alias in node.names:
                self.env[alias.asname or alias.name] = _member(module, alias.name, f"{self.where}: {node.module}")

    def visit_Assign(self, node):
        value = self.value(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if value is None:
                    self.env.pop(target.id, None)
                else:
                    self.env[target.id] = value
            else:
                self.visit(target)

    def visit_With(self, node):
        for item in node.items:
            value = self.value(item.context_expr)
            if isinstance(item.optional_vars, ast.Name) and value is not None:
                self.env[item.optional_vars.id] = value
        for stmt in node.body:
            self.visit(stmt)

    def visit_Attribute(self, node):
        self.value(node)

    def visit_Call(self, node):
        self.value(node)


def all_python_blocks() -> list:
    return [
        pytest.param(page_id(p), i, block, id=f"{page_id(p)}-{i}")
        for p in PAGES
        for i, block in enumerate(python_blocks(p))
    ]


def test_there_are_python_examples():
    assert len(python_blocks(README)) >= 1
    assert len(all_python_blocks()) >= 5


@pytest.mark.parametrize("page, index, block", all_python_blocks())
def test_every_python_example_compiles_and_names_real_things(page, index, block):
    where = f"{page}, python block {index}"
    tree = compile(block, where, "exec", ast.PyCF_ONLY_AST)
    compile(tree, where, "exec")
    checker = NameChecker(where)
    checker.visit(tree)
    uses_frost = any(r in block for r in ROOTS)
    assert checker.checked or not uses_frost, f"{where}: no frostc / frost_runtime name was checked"


def test_the_checker_catches_a_wrong_name():
    for snippet in (
        "import frost_runtime\nfrost_runtime.lod('x')\n",
        "from frost_runtime import hf\nhf.instal(plans, model)\n",
        "import frost_runtime\nplan = frost_runtime.load('x')\nplan.exceute()\n",
        "import frost_runtime\nplans = frost_runtime.read_set('x')\nplans.selct('decode', 'l0', batch=1)\n",
        "from frost_runtime import hf\nbackend = hf.install(p, m)\nbackend.callz\n",
    ):
        with pytest.raises(AssertionError):
            NameChecker("test").visit(ast.parse(snippet))
    # and passes right ones, instance attributes included
    NameChecker("test").visit(
        ast.parse("import frost_runtime\np = frost_runtime.load('x')\np.slots\np.bind().execute\n")
    )


# The runtime's modules the pages name by their short names, as `from frost_runtime import hf` binds them.
SHORT_NAMES = {name: f"frost_runtime.{name}" for name in ("hf", "hf_fuse", "torch_ops", "fp8", "schema", "planset")}


def dotted_names(page: Path) -> list[str]:
    """`frostc.x.y`, `frost_runtime.x.y` and `hf.x` (SHORT_NAMES) names in the page's inline code,
    up to a call or a space."""
    names = []
    roots = "|".join((*ROOTS, *SHORT_NAMES))
    for span in inline_spans(page):
        if re.fullmatch(r"[\w./-]+\.(py|md|toml|json|sh)", span):  # a file's name, not a Python name
            continue
        m = re.match(rf"((?:{roots})(?:\.[A-Za-z_]\w*)+)", span)
        if m:
            names.append(m.group(1))
    return names


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_dotted_names_in_the_prose_exist(page):
    for name in dotted_names(page):
        parts = name.split(".")
        value = importlib.import_module(SHORT_NAMES.get(parts[0], parts[0]))
        for part in parts[1:]:
            value = _member(value, part, f"{page_id(page)}: `{name}`")
            if value is None:
                break


# ---------------------------------------------------------------------------------------------
# Commands: verbs and options that exist


def frostc_options() -> dict[str, set[str]]:
    import typer.main

    from frostc.cli import app

    group = typer.main.get_command(app)
    return {
        name: {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")} | {"--help"}
        for name, cmd in group.commands.items()
    }


def runtime_options() -> dict[str, set[str]]:
    from frost_runtime.__main__ import parser

    top = parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {name: set(p._option_string_actions) for name, p in sub.choices.items()}


def golden_options() -> set[str]:
    from frostc import golden

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        golden.main(["--help"])
    return set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", out.getvalue()))


OPTION = re.compile(r"(?<![\w./-])(--?[A-Za-z][\w-]*)")


def _options_after(text: str) -> list[str]:
    """The options of one command line: up to &&, ;, a comment, or a pipe outside [ ]."""
    found, depth = [], 0
    for token in text.split():
        if token in ("&&", ";", "||", ">", "2>", ">>") or token.startswith("#"):
            break
        if token == "|" and depth == 0:
            break
        depth += token.count("[") - token.count("]")
        m = OPTION.match(token.lstrip("["))
        if m:
            found.append(m.group(1))
    return found


INVOCATION = re.compile(
    r"(?:^|[\s/(])(?:(frostc)\s+([a-z][\w-]*)"
    r"|python3? -m (frost_runtime)\s+([a-z]+(?:\|[a-z]+)*)"
    r"|python3? -m (frostc\.golden)\b)"
)


def invocations(page: Path) -> list[tuple[str, str, list[str]]]:
    """(program, verb, options) of every command on the page's code lines."""
    found = []
    for line in code_lines(page):
        for m in INVOCATION.finditer(line):
            rest = line[m.end() :]
            if m.group(1):
                found.append(("frostc", m.group(2), _options_after(rest)))
            elif m.group(3):
                for verb in m.group(4).split("|"):
                    found.append(("frost_runtime", verb, _options_after(rest)))
            else:
                found.append(("frostc.golden", "", _options_after(rest)))
    return found


def test_there_are_commands_to_check():
    programs = {(prog, verb) for page in PAGES for prog, verb, _ in invocations(page)}
    for verb in ("build", "inspect", "diff", "check", "from-config"):
        assert ("frostc", verb) in programs
    assert ("frost_runtime", "check") in programs and ("frost_runtime", "bench") in programs
    assert ("frostc.golden", "") in programs


def command_problems(page: Path) -> list[str]:
    """Each verb or option of a command on the page that does not exist, and each lone `--option`
    in the prose that no command has."""
    frostc, runtime, golden = frostc_options(), runtime_options(), golden_options()
    problems = []
    for program, verb, options in invocations(page):
        if program == "frostc":
            known = frostc.get(verb)
        elif program == "frost_runtime":
            known = runtime.get(verb)
        else:
            known = golden
        if known is None:
            problems.append(f"`{program} {verb}` is not a verb")
            continue
        problems += [f"`{program} {verb}` has no option {o}" for o in options if o not in known]
    from frost_runtime.hf import serve as hf_serve  # python -m frost_runtime.hf.serve's own options

    every = set().union(*frostc.values(), *runtime.values(), golden, hf_serve.OPTIONS)
    for span in inline_spans(page):
        if span.startswith("--"):
            for option in OPTION.findall(span):
                if option not in every and option not in FOREIGN_OPTIONS:
                    problems.append(f"`{span}`: {option} is no option of frostc or frost_runtime")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_commands_name_real_verbs_and_options(page):
    assert command_problems(page) == [], page_id(page)


def test_the_command_check_catches_wrong_ones(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```sh\nfrostc build g.toml -o p.frost --fast\nfrostc compile g.toml\n"
        "python -m frost_runtime bench p.frost --warmup 3 \\\n    --grpah\n```\n\n"
        "Run `python -m frost_runtime check PLAN [--sha512 X]`, or `python -m frostc.golden --all`;\n"
        "`--qkv-layout fused --glu` builds them.\n"
    )
    problems = command_problems(page)
    for wrong in ("--fast", "frostc compile", "--warmup", "--grpah", "--sha512", "--all", "--glu"):
        assert any(wrong in p for p in problems), (wrong, problems)
    assert len(problems) == 7


# ---------------------------------------------------------------------------------------------
# Links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose_lines(page) if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page_id(page)}: link to {target}: no such file"
        if anchor and dest.suffix == ".md" and (dest == README or dest.parent == ROOT / "docs"):
            assert anchor in anchors(dest), f"{page_id(page)}: link to {target}: no such heading"


def test_every_docs_page_is_linked_from_the_readme():
    text = README.read_text()
    for page in DOCS:
        assert f"(docs/{page.name}" in text, f"README does not link docs/{page.name}"
