"""Stage 2: check a Description and resolve its defaults into a Graph.

Every problem found is collected and reported together (a DescriptionError listing each with
its field path), because fixing a description one error per run is tedious. Checks that later
checks depend on hand partial results forward (None where a field was invalid), so one bad
field produces one problem, not a cascade.

Only what the description means is checked here; what the kernels support (head dims, stride
alignment, unit innermost stride) is a later stage's business.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from frostc.description import (
    FORMAT_VERSION,
    NODE_KEYS,
    TENSOR_KEYS,
    TOP_KEYS,
    Description,
    NodeDecl,
    TensorDecl,
    key_path,
    node_path,
    tensor_path,
)
from frostc.errors import DescriptionError, Problem

DEFAULT_TARGET = "sm_90a"
SUPPORTED_TARGETS = ("sm_90a",)
DTYPES = ("bf16", "fp16", "fp32")
SDPA_DTYPES = ("bf16", "fp16")  # q, k, v and o
LSE_DTYPE = "fp32"
IO_KINDS = ("input", "output")

# Logical dim letters by rank, in the order dims are written: (b, h, s, d), or (b, h, s) for lse.
DIM_LETTERS = {4: "bhsd", 3: "bhs"}
INPUT_ROLES = ("q", "k", "v")
OUTPUT_ROLES = ("o", "lse")
ROLE_DIMS = {
    "q": "(b, hq, sq, d)",
    "k": "(b, hkv, skv, d)",
    "v": "(b, hkv, skv, dv)",
    "o": "(b, hq, sq, dv)",
    "lse": "(b, hq, sq)",
}

_GRAPH_NAME = re.compile(r"[A-Za-z0-9._-]+")
_TENSOR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Tensor:
    """A validated tensor."""

    name: str
    uid: int | None  # as given; None when absent (a later stage assigns)
    dtype: str  # "bf16" | "fp16" | "fp32"
    dims: tuple[int, ...]  # logical: (b, h, s, d), or (b, h, s) for lse
    strides: tuple[int, ...]  # element strides in logical dim order, always resolved
    is_output: bool
    path: str  # "tensors.q", for later stages' error messages


@dataclass(frozen=True)
class Sdpa:
    """A validated scaled-dot-product-attention node."""

    name: str
    q: str
    k: str
    v: str
    o: str
    lse: str | None
    attn_scale: float  # resolved: 1/sqrt(head_dim) when not given
    causal: bool  # top-left aligned: row i sees keys 0..i
    inference: bool
    path: str  # "nodes[0]"
    # Derived from the tensors, for later stages' convenience.
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim: int


@dataclass(frozen=True)
class Graph:
    name: str
    target: str
    tensors: tuple[Tensor, ...]  # in the order declared in the file
    nodes: tuple[Sdpa, ...]

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r} in graph {self.name!r}")


def validate(desc: Description) -> Graph:
    """Check everything about `desc`; raise DescriptionError listing every problem found."""
    problems: list[Problem] = []
    target = _check_header(desc, problems)
    checked = {t.name: _check_tensor(t, problems) for t in desc.tensors}
    _check_uids(desc.tensors, problems)
    nodes = [_check_node(i, n, checked, problems) for i, n in enumerate(desc.nodes)]
    _check_node_count(len(desc.nodes), problems)
    for node in nodes:
        _check_sdpa_tensors(node, checked, problems)
    is_output = _check_uses(nodes, checked, problems)
    for name, c in checked.items():
        if is_output[name]:
            _check_no_overlap(c, problems)
    if problems:
        raise DescriptionError(problems)
    return _build(desc, target, checked, nodes, is_output)


# ---------------------------------------------------------------------------------------------
# Small checks shared by all fields


def _describe(value: Any) -> str:
    """A value with its type, as the user would have written it."""
    if isinstance(value, bool):
        return f"bool {str(value).lower()}"
    if isinstance(value, int):
        return f"int {value}"
    if isinstance(value, float):
        return f"float {value!r}"
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    if isinstance(value, tuple | list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # TOML true is not 1


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)


def _quoted(choices: Iterable[str]) -> str:
    return ", ".join(json.dumps(c) for c in choices)


def _check_unknown_keys(
    prefix: str, extra: tuple[tuple[str, Any], ...], valid: tuple[str, ...], problems: list[Problem]
) -> None:
    for key, _ in extra:
        # Unknown keys are nearly always typos, so suggest the closest valid one.
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(Problem(key_path(prefix, key), f"unknown key {key!r}{hint}; valid keys: {', '.join(valid)}"))


def _check_choice(
    path: str, value: Any, choices: tuple[str, ...], what: str, problems: list[Problem], *, required: bool
) -> str | None:
    """The value if it is one of `choices`; otherwise records a problem and returns None."""
    if value is None:
        if required:
            problems.append(Problem(path, f"missing; give the {what}, one of {_quoted(choices)}"))
        return None
    if not isinstance(value, str):
        problems.append(Problem(path, f"expected a string, one of {_quoted(choices)}; got {_describe(value)}"))
        return None
    if value not in choices:
        problems.append(Problem(path, f"unknown {what} {json.dumps(value)}; valid: {_quoted(choices)}"))
        return None
    return value


def _check_bool(path: str, value: Any, problems: list[Problem]) -> bool | None:
    if value is not None and not isinstance(value, bool):
        problems.append(Problem(path, f"expected a bool (true or false), got {_describe(value)}"))
        return None
    return value


# ---------------------------------------------------------------------------------------------
# The top level


def _check_header(desc: Description, problems: list[Problem]) -> str:
    """Checks format, name, target and top-level keys; returns the resolved target."""
    _check_unknown_keys("", desc.extra, TOP_KEYS, problems)
    if desc.format is None:
        problems.append(Problem("format", f"missing; add format = {FORMAT_VERSION} (the file format version)"))
    elif not _is_int(desc.format):
        problems.append(Problem("format", f"expected an int, got {_describe(desc.format)}; write format = 1"))
    elif desc.format != FORMAT_VERSION:
        problems.append(Problem("format", f"unknown format version {desc.format}; only {FORMAT_VERSION} is known"))

    if desc.name is None:
        problems.append(Problem("name", 'missing; give the graph a name, e.g. name = "llama3-8b-prefill"'))
    elif not isinstance(desc.name, str):
        problems.append(Problem("name", f"expected a string, got {_describe(desc.name)}"))
    elif not _GRAPH_NAME.fullmatch(desc.name):
        message = f"name {json.dumps(desc.name)} is not valid; use a non-empty string of A-Z a-z 0-9 . _ -"
        problems.append(Problem("name", message))

    target = desc.target if desc.target is not None else DEFAULT_TARGET
    if not isinstance(target, str):
        problems.append(Problem("target", f"expected a string, got {_describe(target)}"))
    elif target not in SUPPORTED_TARGETS:
        message = f"target {json.dumps(target)} is not supported; only {_quoted(SUPPORTED_TARGETS)} is supported now"
        problems.append(Problem("target", message))
    return target


# ---------------------------------------------------------------------------------------------
# Tensors, one at a time


@dataclass
class _Checked:
    """What survived the checks of one tensor: None where that field was invalid."""

    decl: TensorDecl
    path: str
    dtype: str | None
    dims: tuple[int, ...] | None
    strides: tuple[int, ...] | None
    io: str | None


def _check_tensor(t: TensorDecl, problems: list[Problem]) -> _Checked:
    path = tensor_path(t.name)
    _check_unknown_keys(path, t.extra, TENSOR_KEYS, problems)
    if not _TENSOR_NAME.fullmatch(t.name):
        message = f"tensor name {json.dumps(t.name)} is not valid; use letters, digits and _, not starting with a digit"
        problems.append(Problem(path, message))
    dtype = _check_choice(f"{path}.dtype", t.dtype, DTYPES, "dtype", problems, required=True)
    dims = _check_dims(f"{path}.dims", t.dims, problems)
    strides = _check_placement(t, path, dims, problems)
    io = _check_choice(f"{path}.io", t.io, IO_KINDS, "io", problems, required=False)
    return _Checked(t, path, dtype, dims, strides, io)


def _check_int_list(path: str, value: Any, what: str, minimum: int, problems: list[Problem]) -> tuple[int, ...] | None:
    """An array of ints >= minimum, with a problem per bad entry at its index."""
    if not isinstance(value, tuple):
        problems.append(Problem(path, f"expected an array of {what} ints, got {_describe(value)}"))
        return None
    ok = True
    for i, item in enumerate(value):
        if not _is_int(item):
            problems.append(Problem(f"{path}[{i}]", f"expected a {what} int, got {_describe(item)}"))
            ok = False
        elif item < minimum:
            problems.append(Problem(f"{path}[{i}]", f"must be {what}, got {item}"))
            ok = False
    return value if ok else None


def _check_dims(path: str, dims: Any, problems: list[Problem]) -> tuple[int, ...] | None:
    if dims is None:
        problems.append(Problem(path, "missing; give the logical dims, [b, h, s, d] (or [b, h, s] for lse)"))
        return None
    # The rank is checked against the tensor's role by the node checks: it depends on use.
    return _check_int_list(path, dims, "positive", 1, problems)


def _check_placement(
    t: TensorDecl, path: str, dims: tuple[int, ...] | None, problems: list[Problem]
) -> tuple[int, ...] | None:
    """The tensor's strides, resolved from layout, strides or neither (contiguous)."""
    strides = None if t.strides is None else _check_strides(f"{path}.strides", t.strides, dims, problems)
    layout = None if t.layout is None else _check_layout(f"{path}.layout", t.layout, dims, problems)
    if t.layout is not None and t.strides is not None:
        problems.append(Problem(path, "both layout and strides are given; give exactly one (or neither: contiguous)"))
        return None
    if dims is None:
        return None
    if layout is not None:
        return strides_from_layout(dims, layout)
    if t.layout is None and t.strides is None:
        return contiguous_strides(dims)
    return strides


def _check_layout(path: str, layout: Any, dims: tuple[int, ...] | None, problems: list[Problem]) -> str | None:
    if not isinstance(layout, str):
        problems.append(Problem(path, f'expected a string such as "bshd", got {_describe(layout)}'))
        return None
    rank = len(dims) if dims is not None else None
    if rank not in DIM_LETTERS:
        # The rank is wrong or unknown, and is reported at dims; only catch a garbled layout here.
        if not any(sorted(layout) == sorted(letters) for letters in DIM_LETTERS.values()):
            problems.append(Problem(path, f'layout {json.dumps(layout)} is not a permutation of "bhsd" or "bhs"'))
        return None
    letters = DIM_LETTERS[rank]
    if sorted(layout) != sorted(letters):
        message = (
            f"layout {json.dumps(layout)} is not a permutation of {json.dumps(letters)} (rank {rank} dims); "
            f"give the physical order of ({', '.join(letters)}) outermost first"
        )
        problems.append(Problem(path, message))
        return None
    return layout


def _check_strides(
    path: str, strides: Any, dims: tuple[int, ...] | None, problems: list[Problem]
) -> tuple[int, ...] | None:
    strides = _check_int_list(path, strides, "non-negative", 0, problems)
    if strides is not None and dims is not None and len(strides) != len(dims):
        message = f"has {len(strides)} entries but dims has {len(dims)}; give one element stride per dim, in dims order"
        problems.append(Problem(path, message))
        return None
    return strides


def strides_from_layout(dims: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """Element strides, in logical dim order, of dims stored in `layout` order (outermost first).

    E.g. dims (b, h, s, d) with layout "bshd" give (s*h*d, d, h*d, 1).
    """
    letters = DIM_LETTERS[len(dims)]
    strides = [0] * len(dims)
    step = 1
    for letter in reversed(layout):  # innermost first: it has stride 1
        i = letters.index(letter)
        strides[i] = step
        step *= dims[i]
    return tuple(strides)


def contiguous_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    return strides_from_layout(dims, DIM_LETTERS[len(dims)]) if len(dims) in DIM_LETTERS else _row_major(dims)


def _row_major(dims: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for extent in reversed(dims):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def overlapping_dim(dims: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The first dim whose stride lets distinct elements share memory, or None if none does."""
    found = _first_overlap(dims, strides)
    return None if found is None else found[0]


def _first_overlap(dims: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """(dim, span of the dims with smaller strides) for the first overlapping dim, or None.

    Going from the smallest stride up, each stride must be at least the span (max offset + 1) of
    the dims before it. Dims of extent 1 are never stepped along, so their stride doesn't matter.
    """
    span = 1
    for i in sorted((i for i, extent in enumerate(dims) if extent > 1), key=lambda i: strides[i]):
        if strides[i] < span:
            return i, span
        span += (dims[i] - 1) * strides[i]
    return None


def _check_no_overlap(c: _Checked, problems: list[Problem]) -> None:
    # Only explicit strides can overlap; outputs must not (the kernel would race on its writes).
    if c.dims is None or c.strides is None or len(c.dims) != len(c.strides):
        return
    found = _first_overlap(c.dims, c.strides)
    if found is None:
        return
    i, span = found
    letter = DIM_LETTERS[len(c.dims)][i] if len(c.dims) in DIM_LETTERS else str(i)
    message = (
        f"strides {list(c.strides)} make distinct elements of output {c.decl.name!r} overlap: "
        f"dim {i} ({letter}, extent {c.dims[i]}) has stride {c.strides[i]} but the dims with smaller "
        f"strides span {span} elements; each stride must be at least that span"
    )
    problems.append(Problem(f"{c.path}.strides", message))


def _check_uids(tensors: tuple[TensorDecl, ...], problems: list[Problem]) -> None:
    owners: dict[int, str] = {}
    for t in tensors:
        if t.uid is None:
            continue
        path = f"{tensor_path(t.name)}.uid"
        if not _is_int(t.uid):
            problems.append(Problem(path, f"expected a positive int, got {_describe(t.uid)}"))
        elif t.uid <= 0:
            problems.append(Problem(path, f"must be positive, got {t.uid}; or omit it to have one assigned"))
        elif t.uid in owners:
            problems.append(Problem(path, f"uid {t.uid} is already used by {owners[t.uid]}; uids must be unique"))
        else:
            owners[t.uid] = tensor_path(t.name)


# ---------------------------------------------------------------------------------------------
# Nodes


@dataclass
class _Node:
    """What survived the checks of one node: refs holds only roles naming a declared tensor."""

    path: str
    name: str | None
    refs: dict[str, str] = field(default_factory=dict)
    attn_scale: float | None = None
    causal: bool | None = None
    inference: bool | None = None


def _check_node(index: int, n: NodeDecl, checked: dict[str, _Checked], problems: list[Problem]) -> _Node:
    path = node_path(index)
    _check_unknown_keys(path, n.extra, NODE_KEYS, problems)
    if n.op is None:
        problems.append(Problem(f"{path}.op", 'missing; add op = "sdpa" (the only op)'))
    elif not isinstance(n.op, str):
        problems.append(Problem(f"{path}.op", f'expected a string ("sdpa"), got {_describe(n.op)}'))
    elif n.op != "sdpa":
        problems.append(Problem(f"{path}.op", f'unknown op {json.dumps(n.op)}; the only op is "sdpa"'))
    name = f"sdpa{index}" if n.name is None else n.name
    if not isinstance(name, str) or not name:
        problems.append(Problem(f"{path}.name", f"expected a non-empty string, got {_describe(name)}"))
        name = None
    node = _Node(path, name)
    for role in INPUT_ROLES + OUTPUT_ROLES:
        ref = _check_ref(f"{path}.{role}", role, getattr(n, role), checked, problems)
        if ref is not None:
            node.refs[role] = ref
    node.attn_scale = _check_scale(f"{path}.attn_scale", n.attn_scale, problems)
    node.causal = _check_bool(f"{path}.causal", n.causal, problems)
    node.inference = _check_bool(f"{path}.inference", n.inference, problems)
    if node.inference is False and n.lse is None:
        message = (
            'inference = false (training) requires lse: add lse = "<name>" naming an fp32 (b, hq, sq) '
            "tensor for the softmax statistics"
        )
        problems.append(Problem(f"{path}.lse", message))
    return node


def _check_ref(path: str, role: str, ref: Any, checked: dict[str, _Checked], problems: list[Problem]) -> str | None:
    if ref is None:
        if role != "lse":  # lse is the only optional tensor
            problems.append(Problem(path, f'missing; name the {role} tensor {ROLE_DIMS[role]}, e.g. {role} = "{role}"'))
        return None
    if not isinstance(ref, str):
        problems.append(Problem(path, f"expected a tensor name (a string), got {_describe(ref)}"))
        return None
    if ref not in checked:
        declared = f"declared tensors: {', '.join(checked)}" if checked else "no tensors are declared"
        problems.append(Problem(path, f"no tensor named {json.dumps(ref)}; {declared}"))
        return None
    return ref


def _check_scale(path: str, scale: Any, problems: list[Problem]) -> float | None:
    if scale is None:
        return None
    if not _is_number(scale):
        problems.append(Problem(path, f"expected a float, got {_describe(scale)}"))
        return None
    if not (math.isfinite(scale) and scale > 0):
        problems.append(Problem(path, f"must be finite and > 0, got {scale}; omit it for the default 1/sqrt(head dim)"))
        return None
    return float(scale)


def _check_node_count(count: int, problems: list[Problem]) -> None:
    if count == 0:
        problems.append(Problem("nodes", 'no nodes; exactly one [[nodes]] table with op = "sdpa" is required'))
    elif count > 1:
        message = f"{count} nodes given; only one node is supported for now, more are not supported yet"
        problems.append(Problem(node_path(1), message))


def _check_sdpa_tensors(node: _Node, checked: dict[str, _Checked], problems: list[Problem]) -> None:
    """Ranks, shapes and dtypes of the tensors of one sdpa node, against each other."""
    tensors = {role: checked[ref] for role, ref in node.refs.items()}
    dims = {}
    for role, c in tensors.items():
        if c.dims is None:
            continue
        rank = 3 if role == "lse" else 4
        if len(c.dims) != rank:
            message = f"{role} dims must be {ROLE_DIMS[role]} (rank {rank}), got rank {len(c.dims)}"
            problems.append(Problem(f"{c.path}.dims", message))
        else:
            dims[role] = c.dims
    _check_shapes(dims, tensors, problems)
    _check_dtypes(tensors, problems)


def _check_shapes(dims: dict[str, tuple[int, ...]], tensors: dict[str, _Checked], problems: list[Problem]) -> None:
    def expect(role: str, i: int, ref: str, j: int, what: str) -> None:
        if role in dims and ref in dims and dims[role][i] != dims[ref][j]:
            message = f"{what} {dims[role][i]} does not match {ref}'s {dims[ref][j]}"
            problems.append(Problem(f"{tensors[role].path}.dims[{i}]", message))

    for role in ("k", "v", "o", "lse"):
        expect(role, 0, "q", 0, "batch")
    expect("k", 3, "q", 3, "head dim")
    expect("v", 1, "k", 1, "kv heads")
    expect("v", 2, "k", 2, "kv sequence length")
    expect("o", 1, "q", 1, "heads")
    expect("o", 2, "q", 2, "sequence length")
    expect("o", 3, "v" if "v" in dims else "q", 3, "head dim")
    expect("lse", 1, "q", 1, "heads")
    expect("lse", 2, "q", 2, "sequence length")
    if "q" in dims and "v" in dims and dims["v"][3] != dims["q"][3]:
        message = (
            f"V head dim {dims['v'][3]} differs from q's head dim {dims['q'][3]}; "
            "a different V head dim is not supported yet"
        )
        problems.append(Problem(f"{tensors['v'].path}.dims[3]", message))
    if "q" in dims and "k" in dims:
        hq, hkv = dims["q"][1], dims["k"][1]
        if hq % hkv:
            message = f"q has {hq} heads and k has {hkv}; GQA needs hq % hkv == 0, but {hq} % {hkv} = {hq % hkv}"
            problems.append(Problem(f"{tensors['k'].path}.dims[1]", message))


def _check_dtypes(tensors: dict[str, _Checked], problems: list[Problem]) -> None:
    q = tensors.get("q")
    q_dtype = q.dtype if q is not None and q.dtype in SDPA_DTYPES else None
    for role in ("q", "k", "v", "o"):
        c = tensors.get(role)
        if c is None or c.dtype is None:
            continue
        if c.dtype not in SDPA_DTYPES:
            message = f"sdpa {role} must be {' or '.join(SDPA_DTYPES)}, got {json.dumps(c.dtype)}"
            problems.append(Problem(f"{c.path}.dtype", message))
        elif q_dtype is not None and c.dtype != q_dtype:
            message = f"{c.dtype} does not match q's {q_dtype}; q, k, v and o must share one dtype (bf16 or fp16)"
            problems.append(Problem(f"{c.path}.dtype", message))
    lse = tensors.get("lse")
    if lse is not None and lse.dtype is not None and lse.dtype != LSE_DTYPE:
        problems.append(Problem(f"{lse.path}.dtype", f"lse must be {LSE_DTYPE}, got {json.dumps(lse.dtype)}"))


def _check_uses(nodes: list[_Node], checked: dict[str, _Checked], problems: list[Problem]) -> dict[str, bool]:
    """How each tensor is used across nodes; returns whether each is an output."""
    uses: dict[str, list[tuple[str, str]]] = {name: [] for name in checked}  # name -> [(field path, role)]
    for node in nodes:
        for role, ref in node.refs.items():
            uses[ref].append((f"{node.path}.{role}", role))
    is_output = {}
    for name, c in checked.items():
        reads = [p for p, role in uses[name] if role in INPUT_ROLES]
        writes = [p for p, role in uses[name] if role in OUTPUT_ROLES]
        if not reads and not writes and nodes:  # without nodes, "no nodes" says it all
            problems.append(Problem(c.path, "declared but not used by any node; remove it or use it"))
        if reads and writes:
            message = f"tensor {name!r} is used as an input ({reads[0]}) and an output; a tensor cannot be both"
            problems.append(Problem(writes[0], message))
        for again in writes[1:]:
            message = f"tensor {name!r} is already an output ({writes[0]}); each output needs its own tensor"
            problems.append(Problem(again, message))
        if reads or writes:
            is_output[name] = bool(writes)
            _check_io(c, reads, writes, problems)
        else:
            is_output[name] = c.io == "output"  # unused: only io can tell (and it is an error anyway)
    return is_output


def _check_io(c: _Checked, reads: list[str], writes: list[str], problems: list[Problem]) -> None:
    if c.io is None or (reads and writes):  # both is reported already
        return
    used_as = "output" if writes else "input"
    if c.io != used_as:
        message = (
            f'io = "{c.io}" but the tensor is used as an {used_as} ({(writes or reads)[0]}); '
            f'write io = "{used_as}" or leave io out'
        )
        problems.append(Problem(f"{c.path}.io", message))


# ---------------------------------------------------------------------------------------------
# Building the result (only reached without problems, so every checked value is present)


def _build(
    desc: Description, target: str, checked: dict[str, _Checked], nodes: list[_Node], is_output: dict[str, bool]
) -> Graph:
    tensors = tuple(
        Tensor(name, c.decl.uid, c.dtype, c.dims, c.strides, is_output[name], c.path)  # type: ignore[arg-type]
        for name, c in checked.items()
    )
    return Graph(desc.name, target, tensors, tuple(_build_sdpa(n, checked) for n in nodes))


def _build_sdpa(node: _Node, checked: dict[str, _Checked]) -> Sdpa:
    refs = node.refs
    b, hq, sq, d = checked[refs["q"]].dims  # type: ignore[misc]
    _, hkv, skv, _ = checked[refs["k"]].dims  # type: ignore[misc]
    return Sdpa(
        name=node.name,  # type: ignore[arg-type]
        q=refs["q"],
        k=refs["k"],
        v=refs["v"],
        o=refs["o"],
        lse=refs.get("lse"),
        attn_scale=node.attn_scale if node.attn_scale is not None else 1.0 / math.sqrt(d),
        causal=bool(node.causal),
        inference=node.inference is not False,
        path=node.path,
        batch=b,
        heads_q=hq,
        heads_kv=hkv,
        seq_q=sq,
        seq_kv=skv,
        head_dim=d,
    )


__all__ = [
    "DEFAULT_TARGET",
    "Graph",
    "Sdpa",
    "Tensor",
    "contiguous_strides",
    "overlapping_dim",
    "strides_from_layout",
    "validate",
]
