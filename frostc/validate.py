"""Stage 2: check a Description and resolve its defaults into a Graph.

Every problem found is collected and reported together (a DescriptionError listing each with
its field path), because fixing a description one error per run is tedious. Checks that later
checks depend on hand partial results forward (None where a field was invalid), so one bad
field produces one problem, not a cascade.

This module checks what every description shares (header, tensors, uids, how tensors are
used); each node is checked by its op (`frostc.ops`), through a `NodeContext`. A tensor's
`layout` names its dims by letters, and the letters depend on the role the tensor plays
("bhsd" for a dense q, "thd" for a packed one), so layouts become strides only after the nodes
are checked. What the kernels support (head dims, stride alignment) is the next stage's business.
"""

from __future__ import annotations

import json
import re
from typing import Any

from frost_runtime import dtypes, schema

from frostc import ops
from frostc.contexts import CheckedTensor, NodeContext, Use
from frostc.description import (
    FORMAT_VERSION,
    NODE_KEYS,
    TENSOR_KEYS,
    TOP_KEYS,
    Description,
    TensorDecl,
    tensor_path,
)
from frostc.errors import DescriptionError, Problem
from frostc.field_checks import (
    check_choice,
    check_int_list,
    check_unknown_keys,
    describe,
    is_int,
)
from frostc.graph import Graph, Node, Tensor
from frostc.target import DEFAULT_TARGET, TARGETS

SUPPORTED_TARGETS = tuple(TARGETS)
IO_KINDS = ("input", "output")

_GRAPH_NAME = re.compile(r"[A-Za-z0-9._-]+")
_TENSOR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def validate(desc: Description) -> Graph:
    """Check everything about `desc`; raise DescriptionError listing every problem found."""
    problems: list[Problem] = []
    target = _check_header(desc, problems)
    checked = {t.name: _check_tensor(t, problems) for t in desc.tensors}
    _check_uids(desc.tensors, problems)
    if len(desc.tensors) > schema.MAX_SLOTS:
        message = f"{len(desc.tensors)} tensors; a plan holds at most {schema.MAX_SLOTS}: split the graph into plans"
        problems.append(Problem("tensors", message))
    contexts = [NodeContext(i, n, checked, problems) for i, n in enumerate(desc.nodes)]
    nodes = [_check_node(ctx) for ctx in contexts]
    _check_node_names(contexts, problems)
    if not desc.nodes:
        problems.append(Problem("nodes", 'no nodes; add a [[nodes]] table, e.g. op = "sdpa"'))
    is_output = _check_uses(contexts, checked, problems)
    for name, c in checked.items():
        uses = [u for ctx in contexts for u in ctx.uses if u.tensor == name]
        c.strides = _resolve_strides(c, uses, problems)
        if is_output[name]:
            _check_no_overlap(c, uses[0].letters if uses else None, problems)
        _check_span(c, problems)
    if problems:
        raise DescriptionError(problems)
    tensors = tuple(
        Tensor(name, c.decl.uid, c.dtype, c.dims, c.strides, is_output[name], c.path)  # type: ignore[arg-type]
        for name, c in checked.items()
    )
    return Graph(desc.name, target, tensors, tuple(nodes))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# The top level


def _check_header(desc: Description, problems: list[Problem]) -> str:
    """Checks format, name, target and top-level keys; returns the resolved target."""
    check_unknown_keys("", desc.extra, TOP_KEYS, problems)
    if desc.format is None:
        problems.append(Problem("format", f"missing; add format = {FORMAT_VERSION} (the file format version)"))
    elif not is_int(desc.format):
        problems.append(Problem("format", f"expected an int, got {describe(desc.format)}; write format = 1"))
    elif desc.format != FORMAT_VERSION:
        problems.append(Problem("format", f"unknown format version {desc.format}; only {FORMAT_VERSION} is known"))

    if desc.name is None:
        problems.append(Problem("name", 'missing; give the graph a name, e.g. name = "llama3-8b-prefill"'))
    elif not isinstance(desc.name, str):
        problems.append(Problem("name", f"expected a string, got {describe(desc.name)}"))
    elif not _GRAPH_NAME.fullmatch(desc.name):
        message = f"name {json.dumps(desc.name)} is not valid; use a non-empty string of A-Z a-z 0-9 . _ -"
        problems.append(Problem("name", message))
    elif len(desc.name) > schema.MAX_PLAN_NAME_CHARS:
        message = f"{len(desc.name)} characters; a plan's name has at most {schema.MAX_PLAN_NAME_CHARS}: shorten it"
        problems.append(Problem("name", message))

    target = desc.target if desc.target is not None else DEFAULT_TARGET
    if not isinstance(target, str):
        problems.append(Problem("target", f"expected a string, got {describe(target)}"))
    elif target not in SUPPORTED_TARGETS:
        supported = ", ".join(json.dumps(t) for t in SUPPORTED_TARGETS)
        message = f"target {json.dumps(target)} is not supported; only {supported} is supported now"
        problems.append(Problem("target", message))
    return target


# ---------------------------------------------------------------------------------------------
# Tensors, one at a time


def _check_tensor(t: TensorDecl, problems: list[Problem]) -> CheckedTensor:
    path = tensor_path(t.name)
    check_unknown_keys(path, t.extra, TENSOR_KEYS, problems)
    if not _TENSOR_NAME.fullmatch(t.name):
        message = f"tensor name {json.dumps(t.name)} is not valid; use letters, digits and _, not starting with a digit"
        problems.append(Problem(path, message))
    elif len(t.name) > schema.MAX_NAME_CHARS:
        message = f"tensor name of {len(t.name)} characters; at most {schema.MAX_NAME_CHARS}: shorten it"
        problems.append(Problem(path, message))
    dtype = check_choice(f"{path}.dtype", t.dtype, dtypes.NAMES, "dtype", problems, required=True)
    dims = _check_dims(f"{path}.dims", t.dims, problems)
    c = CheckedTensor(t, path, dtype, dims, None, None, None)
    c.io = check_choice(f"{path}.io", t.io, IO_KINDS, "io", problems, required=False)
    _check_placement(c, problems)
    return c


def _check_dims(path: str, dims: Any, problems: list[Problem]) -> tuple[int, ...] | None:
    if dims is None:
        problems.append(Problem(path, "missing; give the logical dims, e.g. [b, h, s, d] for a dense q"))
        return None
    # The rank is checked against the tensor's role by the node checks: it depends on use.
    return check_int_list(path, dims, "positive", 1, problems)


def _check_placement(c: CheckedTensor, problems: list[Problem]) -> None:
    """Layout (letters, checked against the role later), strides, or neither (contiguous)."""
    t = c.decl
    if t.layout is not None and t.strides is not None:
        problems.append(Problem(c.path, "both layout and strides are given; give exactly one (or neither: contiguous)"))
        c.placement_ok = False
        return
    if t.layout is not None:
        if not isinstance(t.layout, str) or not t.layout.isalpha():
            problems.append(
                Problem(c.at("layout"), f'expected a string of dim letters such as "bshd", got {describe(t.layout)}')
            )
            c.placement_ok = False
        else:
            c.layout = t.layout
    if t.strides is not None:
        strides = check_int_list(c.at("strides"), t.strides, "non-negative", 0, problems)
        if strides is not None and c.dims is not None and len(strides) != len(c.dims):
            message = (
                f"has {len(strides)} entries but dims has {len(c.dims)}; give one element stride per dim, in dims order"
            )
            problems.append(Problem(c.at("strides"), message))
            strides = None
        c.strides = strides
        c.placement_ok = strides is not None


def _resolve_strides(c: CheckedTensor, uses: list[Use], problems: list[Problem]) -> tuple[int, ...] | None:
    if c.dims is None or not c.placement_ok:
        return None
    if c.layout is None:
        return c.strides if c.strides is not None else contiguous_strides(c.dims)
    letter_sets = list(dict.fromkeys(u.letters for u in uses))
    if not letter_sets:
        return None  # unused: reported as such
    if len(letter_sets) > 1:
        roles = ", ".join(f"{u.path} ({', '.join(u.letters)})" for u in uses)
        problems.append(
            Problem(c.at("layout"), f"the tensor's roles name its dims differently ({roles}); give strides")
        )
        return None
    letters, use = letter_sets[0], uses[0]
    if len(c.dims) != len(letters):
        return None  # the rank is reported by the node's check
    if sorted(c.layout) != sorted(letters):
        message = (
            f"layout {json.dumps(c.layout)} is not a permutation of {json.dumps(letters)} "
            f"(the dims of {use.role}: {use.dims}); give the physical order of ({', '.join(letters)}) "
            "outermost first"
        )
        problems.append(Problem(c.at("layout"), message))
        return None
    return strides_from_layout(c.dims, c.layout, letters)


def strides_from_layout(dims: tuple[int, ...], layout: str, letters: str | None = None) -> tuple[int, ...]:
    """Element strides, in logical dim order, of dims stored in `layout` order (outermost first).
    `letters` names the logical dims (default: "bhsd", or "bhs" for rank 3).

    E.g. dims (b, h, s, d) with layout "bshd" give (s*h*d, d, h*d, 1).
    """
    letters = letters or {4: "bhsd", 3: "bhs"}[len(dims)]
    strides = [0] * len(dims)
    step = 1
    for letter in reversed(layout):  # innermost first: it has stride 1
        i = letters.index(letter)
        strides[i] = step
        step *= dims[i]
    return tuple(strides)


def contiguous_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major: the last dim innermost."""
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


def _check_no_overlap(c: CheckedTensor, letters: str | None, problems: list[Problem]) -> None:
    # Only explicit strides can overlap; outputs must not (the kernel would race on its writes).
    if c.dims is None or c.strides is None or len(c.dims) != len(c.strides):
        return
    found = _first_overlap(c.dims, c.strides)
    if found is None:
        return
    i, span = found
    if letters is None or len(letters) != len(c.dims):
        letters = "?" * len(c.dims)
    letter = letters[i]
    message = (
        f"strides {list(c.strides)} make distinct elements of output {c.decl.name!r} overlap: "
        f"dim {i} ({letter}, extent {c.dims[i]}) has stride {c.strides[i]} but the dims with smaller "
        f"strides span {span} elements; each stride must be at least that span"
    )
    problems.append(Problem(c.at("strides"), message))


def _is_utf8(text: str) -> bool:
    """False for a string that cannot be written as UTF-8 (a lone surrogate, from a JSON escape)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _check_span(c: CheckedTensor, problems: list[Problem]) -> None:
    """The furthest byte a kernel may address must fit int64 (pointer arithmetic, the plan format)."""
    if c.dims is None or c.strides is None or c.dtype is None or len(c.strides) != len(c.dims):
        return
    span = (sum((d - 1) * st for d, st in zip(c.dims, c.strides)) + 1) * dtypes.DTYPES[c.dtype].bytes
    if span > schema.I64_MAX:
        message = (
            f"dims {list(c.dims)} with strides {list(c.strides)} span {span} bytes, more than 2**63; "
            "no GPU holds that: use smaller dims"
        )
        problems.append(Problem(c.at("dims"), message))


def _check_uids(tensors: tuple[TensorDecl, ...], problems: list[Problem]) -> None:
    owners: dict[int, str] = {}
    for t in tensors:
        if t.uid is None:
            continue
        path = f"{tensor_path(t.name)}.uid"
        if not is_int(t.uid):
            problems.append(Problem(path, f"expected a positive int, got {describe(t.uid)}"))
        elif t.uid <= 0:
            problems.append(Problem(path, f"must be positive, got {t.uid}; or omit it to have one assigned"))
        elif t.uid > schema.I64_MAX:
            message = f"uid {t.uid} does not fit int64 (at most {schema.I64_MAX}); or omit it to have one assigned"
            problems.append(Problem(path, message))
        elif t.uid in owners:
            problems.append(Problem(path, f"uid {t.uid} is already used by {owners[t.uid]}; uids must be unique"))
        else:
            owners[t.uid] = tensor_path(t.name)


# ---------------------------------------------------------------------------------------------
# Nodes: the generic part; each op checks its own keys through a NodeContext


def _check_node(ctx: NodeContext) -> Node | None:
    op_name = ctx.decl.op
    if op_name is None:
        ctx.problem("op", f"missing; add op = one of {', '.join(json.dumps(o) for o in ops.OPS)}")
        return None
    if not isinstance(op_name, str):
        ctx.problem("op", f"expected a string, got {describe(op_name)}")
        return None
    op = ops.OPS.get(op_name)
    if op is None:
        ctx.problem("op", f"unknown op {json.dumps(op_name)}; known ops: {', '.join(json.dumps(o) for o in ops.OPS)}")
        return None
    valid = NODE_KEYS + op.KEYS
    check_unknown_keys(ctx.path, tuple(kv for kv in ctx.decl.keys if kv[0] not in valid), valid, ctx.problems)
    name = f"{op_name}{ctx.index}" if ctx.decl.name is None else ctx.decl.name
    if not isinstance(name, str) or not name:
        ctx.problem("name", f"expected a non-empty string, got {describe(name)}")
        name = None
    elif len(name) > schema.MAX_NAME_CHARS:
        ctx.problem("name", f"{len(name)} characters; a node's name has at most {schema.MAX_NAME_CHARS}: shorten it")
        name = None
    elif not _is_utf8(name):
        ctx.problem("name", f"{describe(name)} is not valid Unicode text (a lone surrogate escape?): rename the node")
        name = None
    ctx.name = name
    ctx.op_known = True
    return op.validate(ctx)


def _check_node_names(contexts: list[NodeContext], problems: list[Problem]) -> None:
    first: dict[str, str] = {}
    for ctx in contexts:
        if ctx.name is None:
            continue
        if ctx.name in first:
            problems.append(Problem(ctx.at("name"), f"node name {ctx.name!r} is already used by {first[ctx.name]}"))
        else:
            first[ctx.name] = ctx.path


def _check_uses(
    contexts: list[NodeContext], checked: dict[str, CheckedTensor], problems: list[Problem]
) -> dict[str, bool]:
    """How each tensor is used across nodes; returns whether each is an output."""
    uses: dict[str, list[Use]] = {name: [] for name in checked}
    for ctx in contexts:
        for use in ctx.uses:
            uses[use.tensor].append(use)
    is_output = {}
    # without nodes, "no nodes" says it all; a node of unknown op may use any tensor
    report_unused = bool(contexts) and all(ctx.op_known for ctx in contexts)
    for name, c in checked.items():
        reads = [u.path for u in uses[name] if u.access == "read"]
        writes = [u.path for u in uses[name] if u.access == "write"]
        updates = [u for u in uses[name] if u.access == "update"]
        if not uses[name] and report_unused:
            problems.append(Problem(c.path, "declared but not used by any node; remove it or use it"))
        if reads and writes:
            message = f"tensor {name!r} is used as an input ({reads[0]}) and an output; a tensor cannot be both"
            problems.append(Problem(writes[0], message))
        for again in writes[1:]:
            message = f"tensor {name!r} is already an output ({writes[0]}); each output needs its own tensor"
            problems.append(Problem(again, message))
        # (a node that writes what it updates itself is _check_updated_by_one_role's to report)
        updating = {u.node for u in updates}
        foreign = [u.path for u in uses[name] if u.access == "write" and u.node not in updating]
        if updates and foreign:
            message = (
                f"tensor {name!r} is updated in place ({updates[0].path}) and written as an output here; "
                "an updated tensor is written by its updating nodes only: give this output its own tensor"
            )
            problems.append(Problem(foreign[0], message))
        _check_updated_by_one_role(name, uses[name], problems)
        if uses[name]:
            is_output[name] = bool(writes or updates)
            _check_io(c, reads, writes, [u.path for u in updates], problems)
        else:
            is_output[name] = c.io == "output"  # unused: only io can tell (and it is an error anyway)
    return is_output


def _check_updated_by_one_role(name: str, uses: list[Use], problems: list[Problem]) -> None:
    """A node that updates a tensor in place reaches it through that one role: reading or
    writing it through another would race with the update."""
    by_node: dict[int, list[Use]] = {}
    for use in uses:
        by_node.setdefault(use.node, []).append(use)
    for same_node in by_node.values():
        update = next((u for u in same_node if u.access == "update"), None)
        if update is None:
            continue
        for other in same_node:
            if other is not update:
                message = (
                    f"tensor {name!r} is updated in place by {update.path} of the same node; a node cannot "
                    "also read or write a tensor it updates: give this role its own tensor"
                )
                problems.append(Problem(other.path, message))


def _check_io(
    c: CheckedTensor, reads: list[str], writes: list[str], updates: list[str], problems: list[Problem]
) -> None:
    if c.io is None or (reads and writes):  # both is reported already
        return
    if updates:  # read and written in place: an output of the plan
        if c.io != "output":
            message = (
                f'io = "{c.io}" but the tensor is updated in place ({updates[0]}): the plan writes it; '
                'write io = "output" or leave io out'
            )
            problems.append(Problem(c.at("io"), message))
        return
    used_as = "output" if writes else "input"
    if c.io != used_as:
        message = (
            f'io = "{c.io}" but the tensor is used as an {used_as} ({(writes or reads)[0]}); '
            f'write io = "{used_as}" or leave io out'
        )
        problems.append(Problem(c.at("io"), message))


__all__ = [
    "DEFAULT_TARGET",
    "Graph",
    "Tensor",
    "contiguous_strides",
    "overlapping_dim",
    "strides_from_layout",
    "validate",
]
