"""Stage 3: a validated Graph becomes a resolved plan: uids, ordered slots, the workspace's
regions, kernel variants and every launch's grid and arguments.

The generic part is here (slots, uids, the workspace); each node is resolved by its op
(`frostc.ops`), which also declines, with the user's field paths, what its kernels do not
support, so an unsupported graph never reaches a GPU. After this stage nothing is looked up by
name again: the runtime sees slot indices and workspace offsets.
"""

from dataclasses import dataclass, field

from frostc import ops
from frostc.errors import DescriptionError, Problem
from frostc.graph import Graph, Tensor
from frostc.resolved import WORKSPACE_ALIGN, LengthContract, ResolvedPlan, Slot, WorkspaceRegion

SLOT_ALIGN = {"bf16": 16, "fp16": 16, "fp32": 4, "int32": 4}  # bytes: 16-byte rows of half types


def resolve(graph: Graph) -> ResolvedPlan:
    slots = _slots(graph)
    ctx = ResolveContext(graph, {s.name: s for s in slots})
    launches = tuple(launch for node in graph.nodes for launch in ops.OPS[node.op].resolve(node, ctx))
    if ctx.problems:
        raise DescriptionError(ctx.problems)
    return ResolvedPlan(graph.name, graph.target, slots, launches, tuple(ctx.regions), tuple(ctx.lengths))


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


# ------------------------------------------------------------------------------ slots and uids


def assign_uids(tensors: tuple[Tensor, ...]) -> dict[str, int]:
    """Keep given uids; give the others the smallest unused positive integers, in declaration
    order, so the result depends only on the description."""
    taken = {t.uid for t in tensors if t.uid is not None}
    uids, candidate = {}, 1
    for t in tensors:
        if t.uid is not None:
            uids[t.name] = t.uid
            continue
        while candidate in taken:
            candidate += 1
        uids[t.name] = candidate
        taken.add(candidate)
    return uids


def _slot_order(graph: Graph) -> list[str]:
    """Each node's inputs, then its outputs, in the op's role order (sdpa: q, k, v, lengths,
    o, lse): the order a caller writes them."""
    order: list[str] = []
    for node in graph.nodes:
        for _, name in node.inputs + node.outputs:
            if name not in order:
                order.append(name)
    return order


def _slots(graph: Graph) -> tuple[Slot, ...]:
    uids = assign_uids(graph.tensors)
    slots = []
    for index, name in enumerate(_slot_order(graph)):
        t = graph.tensor(name)
        slots.append(Slot(index, name, uids[name], t.dtype, t.dims, t.strides, t.is_output, SLOT_ALIGN[t.dtype]))
    return tuple(slots)
