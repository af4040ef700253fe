"""The contexts an op is given: what `frostc.validate` hands an op's node checks (a
`NodeContext` over the `CheckedTensor`s) and what `frostc.resolve` hands its resolution (a
`ResolveContext`). They sit below the stages and the ops alike, so the stages import the ops and
the ops import these, never the stages (`tests/test_import_direction.py` holds to that)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from frostc.description import NodeDecl, TensorDecl, key_path, node_path
from frostc.errors import Problem
from frostc.field_checks import check_bool, check_choice, check_int, check_positive_float, describe
from frostc.graph import Graph, Tensor
from frostc.resolved import WORKSPACE_ALIGN, LengthContract, Slot, WorkspaceRegion

# ---------------------------------------------------------------------------------------------
# Validation: one tensor's checked fields, a node's uses of tensors, the context of a node's checks


@dataclass
class CheckedTensor:
    """What survived the checks of one tensor: None where that field was invalid. `strides`
    holds explicit strides until the uses are known, then the resolved ones."""

    decl: TensorDecl
    path: str
    dtype: str | None
    dims: tuple[int, ...] | None
    layout: str | None
    strides: tuple[int, ...] | None
    io: str | None
    placement_ok: bool = True  # False: layout/strides were invalid (already reported)

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"


@dataclass(frozen=True)
class Use:
    """One reference from a node to a tensor."""

    tensor: str
    role: str  # "q", "cu_seqlens_q", ...
    path: str  # "nodes[0].q"
    letters: str  # the logical dims' letters in this role, e.g. "bhsd"
    dims: str  # the role's dims for messages, e.g. "(b, hq, sq, d)"
    access: str  # "read" | "write" | "update" (read and written in place, e.g. a KV cache)
    node: int  # the using node's index

    @property
    def is_output(self) -> bool:
        """Whether the node writes the tensor (an update does too)."""
        return self.access != "read"


@dataclass
class NodeContext:
    """What an op's checks work with: the node's raw keys, the checked tensors, and where to
    report problems. Tensor references go through `tensor()`, which records each use."""

    index: int
    decl: NodeDecl
    tensors: dict[str, CheckedTensor]
    problems: list[Problem]
    uses: list[Use] = field(default_factory=list)
    name: str | None = None
    op_known: bool = False  # False: the node's references could not be read (no or unknown op)

    @property
    def path(self) -> str:
        return node_path(self.index)

    def at(self, key: str) -> str:
        return key_path(self.path, key)

    def value(self, key: str) -> Any:
        return self.decl.get(key)

    def given(self, key: str) -> bool:
        return self.decl.get(key) is not None

    def problem(self, key: str, message: str) -> None:
        """A problem with one of this node's keys (the node itself when key is empty)."""
        self.problems.append(Problem(self.at(key) if key else self.path, message))

    def problems_at(self, path: str, message: str) -> None:
        """A problem found through this node but located elsewhere (a tensor's dims, say)."""
        self.problems.append(Problem(path, message))

    def tensor(
        self, role: str, *, letters: str, dims: str, output: bool = False, updated: bool = False, required: bool = True
    ):
        """The tensor named by key `role`, recorded as a use with the role's logical dims;
        None when absent or invalid. Its rank is checked against the role's. `output`: the node
        writes it; `updated`: the node reads and writes it in place (it is an output of the
        plan, other nodes may read it, before or after, but no other node may write it whole)."""
        ref = self.value(role)
        path = self.at(role)
        if ref is None:
            if required:
                self.problems.append(Problem(path, f'missing; name the {role} tensor {dims}, e.g. {role} = "{role}"'))
            return None
        if not isinstance(ref, str):
            self.problems.append(Problem(path, f"expected a tensor name (a string), got {describe(ref)}"))
            return None
        if ref not in self.tensors:
            declared = f"declared tensors: {', '.join(self.tensors)}" if self.tensors else "no tensors are declared"
            self.problems.append(Problem(path, f"no tensor named {json.dumps(ref)}; {declared}"))
            return None
        access = "update" if updated else "write" if output else "read"
        self.uses.append(Use(ref, role, path, letters, dims, access, self.index))
        c = self.tensors[ref]
        if c.dims is not None and len(c.dims) != len(letters):
            message = f"{role} dims must be {dims} (rank {len(letters)}), got rank {len(c.dims)}"
            self.problems.append(Problem(c.at("dims"), message))
            return None
        return c

    def bool(self, key: str) -> bool | None:
        return check_bool(self.at(key), self.value(key), self.problems)

    def int(self, key: str, minimum: int, what: str) -> int | None:
        return check_int(self.at(key), self.value(key), minimum, what, self.problems)

    def positive_float(self, key: str, what: str) -> float | None:
        return check_positive_float(self.at(key), self.value(key), what, self.problems)

    def choice(self, key: str, choices: tuple[str, ...], what: str) -> str | None:
        return check_choice(self.at(key), self.value(key), choices, what, self.problems, required=False)


# ---------------------------------------------------------------------------------------------
# Resolution


@dataclass
class ResolveContext:
    """What an op's resolution works with: the graph, the slots, the workspace, the problems."""

    graph: Graph
    slots: dict[str, Slot]
    problems: list[Problem] = field(default_factory=list)
    regions: list[WorkspaceRegion] = field(default_factory=list)
    lengths: list[LengthContract] = field(default_factory=list)

    def tensor(self, name: str) -> Tensor:
        return self.graph.tensor(name)

    def slot(self, name: str) -> Slot:
        return self.slots[name]

    def problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def length_contract(self, tensor: str, kind: str, longest: int, total: int = 0) -> None:
        """Record what the plan assumes of a slot of sequence lengths (checked on request only).
        A slot several nodes (or roles) read keeps one contract of each kind: the tightest."""
        index = self.slots[tensor].index
        for i, c in enumerate(self.lengths):
            if c.slot == index and c.kind == kind:
                self.lengths[i] = LengthContract(index, kind, min(c.longest, longest), min(c.total, total))
                return
        self.lengths.append(LengthContract(index, kind, longest, total))

    def workspace(self, name: str, nbytes: int, zeroed: bool = False) -> int:
        """Carve a region of `nbytes` out of the caller's workspace; returns its byte offset.
        `zeroed`: a counter the launches find zero and leave zero (`WorkspaceRegion`)."""
        end = max((r.offset + r.bytes for r in self.regions), default=0)
        offset = -(-end // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
        self.regions.append(WorkspaceRegion(name, offset, nbytes, zeroed))
        return offset
