"""The validated graph: what stage 2 (`frostc.validate`) produces and stage 3 (`frostc.resolve`)
consumes. Every default is filled in, every name refers to a declared tensor, every stride is
resolved; each node is its op's own frozen dataclass (`frostc.ops`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from frost_runtime.schema import NodeRecord


@dataclass(frozen=True)
class Tensor:
    """A validated tensor."""

    name: str
    uid: int | None  # as given; None when absent (a later stage assigns)
    dtype: str  # "bf16" | "fp16" | "fp32" | "int32"
    dims: tuple[int, ...]  # logical, in the order the op defines for the tensor's role
    strides: tuple[int, ...]  # element strides in logical dim order, always resolved
    is_output: bool
    path: str  # "tensors.q", for later stages' error messages


class Node(Protocol):
    """What the generic stages need of any op's validated node."""

    op: str
    name: str
    path: str  # "nodes[0]"

    @property
    def inputs(self) -> tuple[tuple[str, str], ...]:
        """(role, tensor name) of what the node reads, in the order a caller lists them."""

    @property
    def outputs(self) -> tuple[tuple[str, str], ...]:
        """(role, tensor name) of what the node writes."""

    def record(self, slots: Mapping[str, int]) -> NodeRecord:
        """What the plan records of the node: what it computes (its op's own sizes, form, mask),
        its roles' slots found in `slots` (each tensor's slot index, `role_slots`)."""


def role_slots(node: Node, slots: Mapping[str, int]) -> dict[str, int]:
    """Each role of the node (what it reads, then what it writes) -> its tensor's slot index."""
    return {role: slots[name] for role, name in node.inputs + node.outputs}


@dataclass(frozen=True)
class Graph:
    name: str
    target: str
    tensors: tuple[Tensor, ...]  # in the order declared in the file
    nodes: tuple[Node, ...]

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r} in graph {self.name!r}")
