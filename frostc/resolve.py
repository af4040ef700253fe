"""Stage 3: a validated Graph becomes a resolved plan: uids, ordered slots, the workspace's
regions, kernel variants, every launch's grid and arguments, and each node's record of what it
computes (its op's `record`).

The generic part is here (slots, uids); each node is resolved by its op (`frostc.ops`) through
a `frostc.contexts.ResolveContext` (which also carves the workspace), and the op declines, with
the user's field paths, what its kernels do not support, so an unsupported graph never reaches
a GPU. After this stage nothing is looked up by
name again: the runtime sees slot indices and workspace offsets.
"""

from dataclasses import replace

from frost_runtime import schema
from frost_runtime.dtypes import DTYPES

from frostc import ops
from frostc.contexts import ResolveContext
from frostc.errors import DescriptionError
from frostc.graph import Graph, Tensor
from frostc.kernels.launch_order import NEW_ROWS_BY_S_NEW, WAITS_AT_ENTRY, WAITS_FOR_NEW_ROWS
from frostc.resolved import ResolvedLaunch, ResolvedPlan, Slot

SLOT_ALIGN = {name: d.align for name, d in DTYPES.items()}  # bytes (frost_runtime.dtypes)


def resolve(graph: Graph) -> ResolvedPlan:
    slots = _slots(graph)
    ctx = ResolveContext(graph, {s.name: s for s in slots})
    launches = tuple(launch for node in graph.nodes for launch in ops.OPS[node.op].resolve(node, ctx))
    launches = mark_early_starts(launches)
    index = {s.name: s.index for s in slots}
    nodes = tuple(node.record(index) for node in graph.nodes)
    plan = ResolvedPlan(graph.name, graph.target, slots, launches, tuple(ctx.regions), tuple(ctx.lengths), nodes)
    if not ctx.problems:
        check_plan_limits(plan, {node.name: node.path for node in graph.nodes}, ctx)
    if ctx.problems:
        raise DescriptionError(ctx.problems)
    return plan


# ------------------------------------------------------------------------------ early starts


def mark_early_starts(launches: tuple[ResolvedLaunch, ...]) -> tuple[ResolvedLaunch, ...]:
    """Mark the launches that may start while the one ahead of them still runs (programmatic
    dependent launch): a decode step's attention during its kv_append, a combine during its
    attention's last wave, a scheduling kernel and the forward kernel after a settled launch —
    each kernel waits (griddepcontrol.wait) before it reads what the launch ahead writes, so what
    it does before that (its launch, its setup, the cache blocks without new rows) overlaps. The
    first launch never: the caller's work precedes it."""
    marked = list(launches[:1])
    settled = True  # the last marked launch's completion means every launch before it completed
    for ahead, launch in zip(launches, launches[1:]):
        early = _may_start_early(ahead, launch, settled)
        marked.append(replace(launch, early=early))
        settled = not early or (settled and getattr(launch.variant, "early_start", None) == WAITS_AT_ENTRY)
    return tuple(marked)


def _may_start_early(ahead: ResolvedLaunch, launch: ResolvedLaunch, ahead_settled: bool) -> bool:
    """`ahead_settled`: the launch ahead has finished only once every launch before it has
    (launch_order.WAITS_AT_ENTRY)."""
    rule = getattr(launch.variant, "early_start", None)
    if rule == WAITS_AT_ENTRY:
        return ahead_settled or getattr(launch.variant, "reads_only_the_launch_ahead", False)
    if rule == WAITS_FOR_NEW_ROWS:  # the launch ahead must write nothing else it reads
        appended = getattr(ahead.variant, "appends_to_caches", ())
        read = _slots_of(launch, launch.variant.reads_caches)
        if not appended or _slots_of(ahead, appended) != read:
            return False
        # ... and only rows the launch deems new: both say which by the same parameters, bound alike
        new = ahead.variant.new_rows
        deemed = getattr(launch.variant, "new_rows", NEW_ROWS_BY_S_NEW)
        return new == deemed and _bindings(ahead, new) == _bindings(launch, new)
    return False


def _slots_of(launch: ResolvedLaunch, params: tuple[str, ...]) -> tuple[int, ...]:
    slots = {a.param: a.slot for a in launch.args}
    return tuple(slots.get(p, -1) for p in params)


def _bindings(launch: ResolvedLaunch, params: tuple[str, ...]) -> tuple:
    """Each parameter's slot, or its constant's value (None for a parameter the launch lacks)."""
    args = {a.param: a for a in launch.args}
    return tuple(None if p not in args else (args[p].slot, args[p].value) for p in params)


# ------------------------------------------------------------------------------ the plan format's limits

# what a constant parameter of each kind holds (i32x3: each of its three ints; f32: finite)
_INT_RANGES = {"i32": (-(1 << 31), (1 << 31) - 1), "i64": (-(1 << 63), schema.I64_MAX), "i32x3": (0, (1 << 31) - 1)}


def check_plan_limits(plan: ResolvedPlan, node_paths: dict[str, str], ctx: ResolveContext) -> None:
    """What the plan format and CUDA hold, checked for every launch before anything compiles:
    grids (x < 2**31, y and z < 65536), constants that fit their parameters, how many launches,
    kernels and workspace regions a plan holds. The ops decline what they know is too large
    with the user's own field paths; this is the net under them, naming the node."""
    fix = "make its tensors smaller (fewer sequences, heads or tokens) or split the work into several plans"
    for launch in plan.launches:
        where = node_paths.get(launch.node, "nodes")
        if len(launch.grid) != 3 or any(not 1 <= g <= hi for g, hi in zip(launch.grid, schema.MAX_GRID)):
            ctx.problem(
                where,
                f"its launch of {launch.variant.name} needs a grid of {launch.grid} CTAs, over CUDA's limits "
                f"{schema.MAX_GRID} (x, y, z): {fix}",
            )
        for arg in launch.args:
            if arg.slot >= 0 or arg.workspace >= 0 or arg.kind in ("ptr", "tmap"):
                continue
            if not _fits(arg.kind, arg.value):
                ctx.problem(
                    where,
                    f"parameter {arg.param} of {launch.variant.name} would be {arg.value!r}, which does not fit the "
                    f"kernel's {arg.kind}: {fix}",
                )
    counts = (
        (len(plan.launches), schema.MAX_LAUNCHES, "launches"),
        (len(plan.variants), schema.MAX_KERNELS, "distinct kernels"),
        (len(plan.workspace), schema.MAX_REGIONS, "workspace regions"),
        (len(plan.lengths), schema.MAX_REGIONS, "sequence-length contracts"),
    )
    for count, most, what in counts:
        if count > most:
            ctx.problem("nodes", f"the nodes make {count} {what}; a plan holds at most {most}: split the graph")
    too_long = {}  # node -> its first region whose name is too long: one problem per node
    for region in plan.workspace:  # named "<node>.<what>"
        if len(region.name) > schema.MAX_NAME_CHARS:
            too_long.setdefault(region.name.rsplit(".", 1)[0], region)
    for node, region in too_long.items():
        ctx.problem(
            f"{node_paths.get(node, 'nodes')}.name",
            f"the node's workspace region {region.name!r} would have {len(region.name)} characters, at most "
            f"{schema.MAX_NAME_CHARS}: shorten the node's name",
        )
    if plan.workspace_bytes > schema.I64_MAX:
        ctx.problem("nodes", f"the nodes need a workspace of {plan.workspace_bytes} bytes, over 2**63: {fix}")


def _fits(kind: str, value) -> bool:
    if kind == "f32":
        return isinstance(value, (int, float)) and abs(value) <= schema.F32_MAX
    lo, hi = _INT_RANGES[kind]
    values = value if kind == "i32x3" else (value,)
    return all(isinstance(v, int) and lo <= v <= hi for v in values)


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
