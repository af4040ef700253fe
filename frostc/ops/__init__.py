"""The ops a description's nodes can name, each in a module of its own.

An op's module holds everything about it: its description keys (`KEYS`), the checks of a node
(`validate`, through a `frostc.contexts.NodeContext`), its support rules and its resolution
into launches (`resolve`, through a `frostc.contexts.ResolveContext`), the kernel variants it
picks, and what the plan records of a node (the node's `record`: frost_runtime.schema's
NodeRecord, of the sizes and roles its NODE_FORMS entry names). The generic stages dispatch
through `OPS`; adding an op is a new module, one entry here and its NODE_FORMS entry.
"""

from __future__ import annotations

from typing import Protocol

from frostc.contexts import NodeContext, ResolveContext
from frostc.graph import Node
from frostc.ops import kv_append, rms_norm, sdpa, silu_mul
from frostc.resolved import ResolvedLaunch


class Op(Protocol):
    KEYS: tuple[str, ...]  # every key a node of this op may hold, besides op and name

    def validate(self, ctx: NodeContext) -> Node | None:
        """The validated node, or None when the node's own checks found problems (in ctx)."""

    def resolve(self, node: Node, ctx: ResolveContext) -> tuple[ResolvedLaunch, ...]:
        """The node's launches, in order; unsupported declarations are problems in ctx."""


OPS: dict[str, Op] = {"sdpa": sdpa, "kv_append": kv_append, "rms_norm": rms_norm, "silu_mul": silu_mul}
