"""Stage 1: read a graph description into plain data, exactly as written.

A description is TOML (or JSON). Parsing keeps every value as the user wrote it, including
unknown keys and values of the wrong type, because stage 2 (`frostc.validate`) reports all
problems at once with their paths, and it can only do that if nothing was dropped here. Only
what prevents building these dataclasses at all (bad syntax, a top level that is not a table,
`tensors` or `nodes` of the wrong shape) is an error at this stage.

No defaults are filled in: an absent field is `None`. (JSON `null` counts as absent too, since
TOML has no null.) Arrays become tuples so descriptions compare equal however they were made.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from frostc.errors import DescriptionError, Problem

FORMAT_VERSION = 1

# The keys each table may hold, in the order `to_dict` and `to_toml` write them.
TOP_KEYS = ("format", "name", "target", "tensors", "nodes")
TENSOR_KEYS = ("dtype", "dims", "layout", "strides", "uid", "io")
# Every node has these; the rest of a node's keys belong to its op (frostc.ops), which checks them.
NODE_KEYS = ("op", "name")

# A value as written in the file, not yet type-checked (stage 2 does that); None means absent.
Raw = Any
# Keys the schema does not know, with their values, in file order; kept so stage 2 can name them.
Extra = tuple[tuple[str, Raw], ...]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_path(prefix: str, key: str) -> str:
    """The field path of `key` inside the table at `prefix`, quoting keys TOML can't write bare."""
    part = key if _BARE_KEY.fullmatch(key) else _toml_string(key)
    return f"{prefix}.{part}" if prefix else part


def tensor_path(name: str) -> str:
    return key_path("tensors", name)


def node_path(index: int) -> str:
    return f"nodes[{index}]"


@dataclass(frozen=True)
class TensorDecl:
    """One `[tensors.<name>]` table."""

    name: str
    dtype: Raw = None
    dims: Raw = None
    layout: Raw = None
    strides: Raw = None
    uid: Raw = None
    io: Raw = None
    extra: Extra = ()

    def to_dict(self) -> dict[str, Any]:
        return _decl_to_dict(self, TENSOR_KEYS)


@dataclass(frozen=True)
class NodeDecl:
    """One `[[nodes]]` table; its index in `Description.nodes` is its identity until validated.

    Which keys a node may hold depends on its op, so all but `op` and `name` are kept in
    `keys`, in file order, for the op's own checks (`frostc.ops`)."""

    op: Raw = None
    name: Raw = None
    keys: Extra = ()

    def get(self, key: str) -> Raw:
        """The value written for `key`, None when absent."""
        return next((value for k, value in self.keys if k == key), None)

    def to_dict(self) -> dict[str, Any]:
        out = {key: _thaw(getattr(self, key)) for key in NODE_KEYS if getattr(self, key) is not None}
        out.update((key, _thaw(value)) for key, value in self.keys if value is not None)
        return out


@dataclass(frozen=True)
class Description:
    """A whole description file, unvalidated."""

    format: Raw = None
    name: Raw = None
    target: Raw = None
    tensors: tuple[TensorDecl, ...] = ()  # in the order declared
    nodes: tuple[NodeDecl, ...] = ()
    extra: Extra = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts and lists, ready for `json.dumps`; absent fields are left out."""
        out: dict[str, Any] = {}
        for key in ("format", "name", "target"):
            value = getattr(self, key)
            if value is not None:
                out[key] = _thaw(value)
        if self.tensors:
            out["tensors"] = {t.name: t.to_dict() for t in self.tensors}
        if self.nodes:
            out["nodes"] = [n.to_dict() for n in self.nodes]
        out.update((key, _thaw(value)) for key, value in self.extra)
        return out


def _decl_to_dict(decl: TensorDecl, keys: tuple[str, ...]) -> dict[str, Any]:
    out = {key: _thaw(getattr(decl, key)) for key in keys if getattr(decl, key) is not None}
    out.update((key, _thaw(value)) for key, value in decl.extra)
    return out


def _freeze(value: Raw) -> Raw:
    """Arrays become tuples (recursively) so equality doesn't depend on list vs tuple."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    return value


def _thaw(value: Raw) -> Raw:
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------
# Parsing


def parse_description(text: str, *, filename: str = "<string>", fmt: str | None = None) -> Description:
    """Parse description text; `fmt` is "toml" or "json", guessed from `filename`/text when None."""
    fmt = fmt or _guess_format(text, filename)
    if fmt not in ("toml", "json"):
        raise ValueError(f"unknown description format {fmt!r}; use 'toml' or 'json'")
    try:
        root = _load_toml(text, filename) if fmt == "toml" else _load_json(text, filename)
        return _from_root(root, filename)
    except RecursionError:  # the parsers and _freeze recurse once per level
        message = "arrays or tables nested too deeply to read; a description nests a few levels at most"
        raise DescriptionError([Problem(filename, message)]) from None


def read_text_file(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(file name, text) of an input file; unreadable or non-UTF-8 files are a DescriptionError
    naming the file."""
    filename = os.fspath(path)
    try:
        # utf-8-sig: editors on some systems prepend a BOM, which neither parser accepts.
        return filename, Path(filename).read_text(encoding="utf-8-sig")
    except OSError as e:
        raise DescriptionError([Problem(filename, f"cannot read the file: {e.strerror or e}")]) from None
    except UnicodeDecodeError as e:
        raise DescriptionError([Problem(filename, f"the file is not UTF-8 text: {e}")]) from None


def load_description(path: str | os.PathLike[str]) -> Description:
    """Read and parse a description file; unreadable files are a DescriptionError too."""
    filename, text = read_text_file(path)
    return parse_description(text, filename=filename)


def _guess_format(text: str, filename: str) -> str:
    if filename.lower().endswith(".json") or text.lstrip().startswith("{"):
        return "json"
    return "toml"


def _load_toml(text: str, filename: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib's message already ends with "(at line L, column C)".
        raise DescriptionError([Problem(filename, f"invalid TOML: {e}")]) from None


class _DuplicateKey(Exception):
    pass


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads silently keeps the last of repeated keys; TOML rejects them, so JSON should too.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _load_json(text: str, filename: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as e:
        message = f"invalid JSON: {e.msg} (at line {e.lineno}, column {e.colno})"
    except _DuplicateKey as e:
        message = f"invalid JSON: key {json.dumps(e.args[0])} appears twice in one object"
    raise DescriptionError([Problem(filename, message)])


def _from_root(root: Any, filename: str) -> Description:
    if not isinstance(root, dict):
        raise DescriptionError([Problem(filename, f"the top level must be a table, got {_kind(root)}")])
    problems: list[Problem] = []
    tensors = _tensor_decls(root.get("tensors"), problems)
    nodes = _node_decls(root.get("nodes"), problems)
    if problems:
        raise DescriptionError(problems)
    known = {key: _freeze(root.get(key)) for key in ("format", "name", "target")}
    return Description(**known, tensors=tensors, nodes=nodes, extra=_extra(root, TOP_KEYS))


def _tensor_decls(raw: Any, problems: list[Problem]) -> tuple[TensorDecl, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        problems.append(Problem("tensors", f"must be a table of [tensors.<name>] tables, got {_kind(raw)}"))
        return ()
    decls = []
    for name, table in raw.items():
        if not isinstance(table, dict):
            message = f"must be a table ([{tensor_path(name)}] with dtype, dims, ...), got {_kind(table)}"
            problems.append(Problem(tensor_path(name), message))
            continue
        known = {key: _freeze(table.get(key)) for key in TENSOR_KEYS}
        decls.append(TensorDecl(name=name, **known, extra=_extra(table, TENSOR_KEYS)))
    return tuple(decls)


def _node_decls(raw: Any, problems: list[Problem]) -> tuple[NodeDecl, ...]:
    if raw is None:
        return ()
    if isinstance(raw, dict):
        # The usual slip: a single [nodes] table instead of an array of [[nodes]] tables.
        problems.append(Problem("nodes", "must be an array of tables: write [[nodes]], not [nodes]"))
        return ()
    if not isinstance(raw, list):
        problems.append(Problem("nodes", f"must be an array of [[nodes]] tables, got {_kind(raw)}"))
        return ()
    decls = []
    for index, table in enumerate(raw):
        if not isinstance(table, dict):
            problems.append(Problem(node_path(index), f"must be a table (a [[nodes]] entry), got {_kind(table)}"))
            continue
        known = {key: _freeze(table.get(key)) for key in NODE_KEYS}
        decls.append(NodeDecl(**known, keys=_extra(table, NODE_KEYS)))
    return tuple(decls)


def _extra(table: dict[str, Any], known: tuple[str, ...]) -> Extra:
    return tuple((key, _freeze(value)) for key, value in table.items() if key not in known)


def _kind(value: Any) -> str:
    """A value's type in the file's own words, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__  # dates and times, which TOML allows but the schema never uses


# ---------------------------------------------------------------------------------------------
# Writing


def to_json(desc: Description, *, indent: int | None = 2) -> str:
    return json.dumps(desc.to_dict(), indent=indent) + "\n"


def to_toml(desc: Description) -> str:
    """TOML text that parses back to an equal Description.

    The schema is small (top-level scalars, one table per tensor, an array of node tables), so
    a dependency-free emitter suffices; values of unknown keys are written inline.
    """
    top = desc.to_dict()
    tensors = top.pop("tensors", {})
    nodes = top.pop("nodes", [])
    # Every top-level key must come before the first table header, or it would land in that table.
    lines = [_toml_pair(key, value) for key, value in top.items()]
    for name, table in tensors.items():
        lines += ["", f"[{tensor_path(name)}]"]
        lines += [_toml_pair(key, value) for key, value in table.items()]
    for table in nodes:
        lines += ["", "[[nodes]]"]
        lines += [_toml_pair(key, value) for key, value in table.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_pair(key: str, value: Any) -> str:
    return f"{key_path('', key)} = {_toml_value(value)}"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # shortest text that reads back to the same float; always has . or e
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(_toml_pair(k, v) for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {_kind(value)} as TOML: {value!r}")


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:  # TOML basic strings forbid raw control chars
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# ---------------------------------------------------------------------------------------------
# Building in Python


class GraphBuilder:
    """Builds the same Description a file would give, from Python.

    Like the parser, it fills in no defaults (an argument left as None is absent) and checks
    nothing beyond what a TOML file could not express; `frostc.validate.validate` does the rest.
    """

    def __init__(self, name: str, *, target: str | None = None) -> None:
        self._name = name
        self._target = target
        self._tensors: dict[str, TensorDecl] = {}
        self._nodes: list[NodeDecl] = []

    def tensor(
        self,
        name: str,
        *,
        dtype: str,
        dims: tuple[int, ...] | list[int],
        layout: str | None = None,
        strides: tuple[int, ...] | list[int] | None = None,
        uid: int | None = None,
        io: str | None = None,
    ) -> str:
        """Declare a tensor; returns its name, for use in `sdpa(...)`."""
        if name in self._tensors:
            # A TOML table can't hold a key twice, so a Description can't represent this.
            raise DescriptionError([Problem(tensor_path(name), "tensor declared twice; names must be unique")])
        self._tensors[name] = TensorDecl(
            name=name,
            dtype=dtype,
            dims=_freeze(dims),
            layout=layout,
            strides=_freeze(strides),
            uid=uid,
            io=io,
        )
        return name

    def node(self, op: str, *, name: str | None = None, **keys: Any) -> str:
        """Add a node of `op` with its keys as the description would write them (None: absent);
        returns its name (the default "<op><index>" when none is given)."""
        frozen = tuple((key, _freeze(value)) for key, value in keys.items() if value is not None)
        self._nodes.append(NodeDecl(op=op, name=name, keys=frozen))
        return name if name is not None else f"{op}{len(self._nodes) - 1}"

    def sdpa(self, *, name: str | None = None, **keys: Any) -> str:
        """An sdpa node: q, k, v, o, lse, causal, attn_scale, ... (frostc.ops.sdpa.KEYS lists them,
        README.md explains them)."""
        return self.node("sdpa", name=name, **keys)

    def build(self) -> Description:
        return Description(
            format=FORMAT_VERSION,
            name=self._name,
            target=self._target,
            tensors=tuple(self._tensors.values()),
            nodes=tuple(self._nodes),
        )


__all__ = [
    "FORMAT_VERSION",
    "NODE_KEYS",
    "TENSOR_KEYS",
    "TOP_KEYS",
    "Description",
    "GraphBuilder",
    "NodeDecl",
    "TensorDecl",
    "key_path",
    "load_description",
    "node_path",
    "parse_description",
    "tensor_path",
    "to_json",
    "to_toml",
]

# The parser, emitter and validator go by the key tuples, the dataclasses by their fields:
# fail at import, not with a confusing message later, if someone changes one and not the other.
assert tuple(f.name for f in fields(TensorDecl))[1:-1] == TENSOR_KEYS
assert tuple(f.name for f in fields(NodeDecl))[:-1] == NODE_KEYS
