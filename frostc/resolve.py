"""Stage 3: a validated Graph becomes a resolved plan: uids, ordered slots, kernel variants and
every launch's grid and arguments.

After this stage nothing is looked up by name again: the runtime sees slot indices, and each
kernel parameter is bound either to a slot's pointer or to a constant. What the kernels
support is checked here, against the user's field paths, so an unsupported graph is declined
at build time and never reaches a GPU.
"""

import importlib
from dataclasses import dataclass

from frostc.errors import DescriptionError, Problem
from frostc.kernels.sdpa_common import LOG2_E, param_list
from frostc.validate import Graph, Sdpa, Tensor

ROW_ALIGN_ELEMS = 8  # 16-byte cp.async rows of 2-byte elements
# The kernel file each head dim gets (frostc/kernels/sdpa_fwd_<family>.py); bench/NOTES.md
# records the measurements that chose it.
KERNEL_FOR_HEAD_DIM = {64: "wgmma", 128: "wgmma", 256: "wgmma"}
GRID_YZ_MAX = 65535
TMA_STRIDE_LIMIT = 1 << 40  # bytes: the largest global stride a tensor map can hold, exclusive
ELEMENT_BYTES = 2  # bf16 / fp16, the types the kernels load
INT32_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class Slot:
    """A buffer `execute` takes, at position `index`."""

    index: int
    name: str
    uid: int
    dtype: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    is_output: bool
    align: int  # required base-pointer alignment in bytes


@dataclass(frozen=True)
class KernelVariant:
    """The compile key of one kernel: declaration facts only (no shapes, which are arguments)."""

    family: str  # the kernel file: frostc/kernels/sdpa_fwd_<family>.py
    dtype: str
    head_dim: int
    causal: bool
    has_lse: bool

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        return f"sdpa_fwd_{self.family}.{self.dtype}.d{self.head_dim}.{mask}" + (".lse" if self.has_lse else "")

    @property
    def module(self):
        return importlib.import_module(f"frostc.kernels.sdpa_fwd_{self.family}")

    @property
    def tiles(self):
        """The kernel's named tile parameters for this head dim (block_m, block_n, num_threads, ...)."""
        return self.module.tiles_for_head_dim(self.head_dim, self.causal)

    @property
    def grid_rule(self) -> str:
        tiles = f"ceil(seq_q / {self.tiles.block_m}) * heads_q * batch"
        return f"(min({tiles}, SMs * {self.tiles.ctas_per_sm}), 1, 1), persistent over the tiles"

    def grid(self, batch: int, heads_q: int, seq_q: int) -> tuple[int, int, int]:
        """Tiles; the runtime caps the CTAs at the device's SM count (ctas_per_sm)."""
        return (-(-seq_q // self.tiles.block_m) * heads_q * batch, 1, 1)


@dataclass(frozen=True)
class Arg:
    """One kernel parameter's value: a slot's base pointer or tensor map (slot >= 0) or a constant."""

    param: str
    kind: str
    slot: int = -1
    value: int | float | tuple[int, ...] = 0


@dataclass(frozen=True)
class LaunchShape:
    """The extents and element strides a launch's tensor maps are encoded from."""

    batch: int
    heads_q: int
    seq_q: int
    seq_kv: int
    group: int
    strides: tuple[tuple[int, int, int], ...]  # (b, h, s) of q, k, v, o, lse (zeros for no LSE)


@dataclass(frozen=True)
class ResolvedLaunch:
    node: str
    variant: KernelVariant
    grid: tuple[int, int, int]
    args: tuple[Arg, ...]
    shape: LaunchShape


@dataclass(frozen=True)
class ResolvedPlan:
    name: str
    target: str
    slots: tuple[Slot, ...]
    launches: tuple[ResolvedLaunch, ...]
    workspace_bytes: int

    @property
    def variants(self) -> tuple[KernelVariant, ...]:
        """Distinct kernels, in first-use order."""
        return tuple(dict.fromkeys(launch.variant for launch in self.launches))


def resolve(graph: Graph) -> ResolvedPlan:
    problems: list[Problem] = []
    for node in graph.nodes:
        _check_supported(graph, node, problems)
    if problems:
        raise DescriptionError(problems)
    slots = _slots(graph)
    by_name = {s.name: s for s in slots}
    launches = tuple(_sdpa_launch(node, by_name) for node in graph.nodes)
    return ResolvedPlan(graph.name, graph.target, slots, launches, workspace_bytes=0)


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
    """Inputs then outputs, in each node's role order (q, k, v, o, lse): the order a caller writes."""
    order: list[str] = []
    for node in graph.nodes:
        for name in (node.q, node.k, node.v, node.o, node.lse):
            if name is not None and name not in order:
                order.append(name)
    return order


def _slots(graph: Graph) -> tuple[Slot, ...]:
    uids = assign_uids(graph.tensors)
    slots = []
    for index, name in enumerate(_slot_order(graph)):
        t = graph.tensor(name)
        align = 16 if t.dtype in ("bf16", "fp16") else 4
        slots.append(Slot(index, name, uids[name], t.dtype, t.dims, t.strides, t.is_output, align))
    return tuple(slots)


# ------------------------------------------------------------------------------ kernel support


def _check_supported(graph: Graph, node: Sdpa, problems: list[Problem]) -> None:
    q = graph.tensor(node.q)
    if node.head_dim not in KERNEL_FOR_HEAD_DIM:
        supported = ", ".join(map(str, KERNEL_FOR_HEAD_DIM))
        problems.append(
            Problem(f"{q.path}.dims[3]", f"head dim {node.head_dim} is not supported yet; supported: {supported}")
        )
    if graph.target != "sm_90a":
        problems.append(Problem("target", f'target {graph.target!r} is not supported; use "sm_90a"'))
    for name in (node.q, node.k, node.v, node.o):
        _check_row_layout(graph.tensor(name), problems)
    for name in (node.q, node.k, node.v):
        _check_tma_strides(graph.tensor(name), problems)
    for value, what, path in (
        (node.seq_q, "query length", f"{q.path}.dims[2]"),
        (node.seq_kv, "key length", f"{graph.tensor(node.k).path}.dims[2]"),
    ):
        if value > INT32_MAX:
            problems.append(Problem(path, f"{what} {value} does not fit the kernel's int32; at most {INT32_MAX}"))
    for value, what, path in (
        (node.heads_q, "query heads", f"{q.path}.dims[1]"),
        (node.batch, "batch", f"{q.path}.dims[0]"),
    ):
        if value > GRID_YZ_MAX:
            problems.append(Problem(path, f"{what} {value} exceeds the launch grid's limit of {GRID_YZ_MAX}"))


def _check_row_layout(t: Tensor, problems: list[Problem]) -> None:
    """The kernel reads and writes whole 16-byte pieces of each head-dim row."""
    if t.strides[3] != 1:
        problems.append(
            Problem(
                f"{t.path}.strides[3]",
                f"the head dim must be innermost (stride 1), found stride {t.strides[3]}; "
                'use a layout ending in d, such as "bshd" or "bhsd"',
            )
        )
    for i, letter in enumerate("bhs"):
        if t.dims[i] > 1 and t.strides[i] % ROW_ALIGN_ELEMS:
            problems.append(
                Problem(
                    f"{t.path}.strides[{i}]",
                    f"stride {t.strides[i]} of dim {letter} must be a multiple of {ROW_ALIGN_ELEMS} elements "
                    "(16 bytes) so rows can be loaded in 16-byte pieces",
                )
            )


def _check_tma_strides(t: Tensor, problems: list[Problem]) -> None:
    """Q, K and V are loaded through TMA tensor maps, whose strides must stay under 2**40 bytes."""
    for i, letter in enumerate("bhs"):
        if t.dims[i] > 1 and t.strides[i] * ELEMENT_BYTES >= TMA_STRIDE_LIMIT:
            problems.append(
                Problem(
                    f"{t.path}.strides[{i}]",
                    f"stride {t.strides[i]} of dim {letter} is {t.strides[i] * ELEMENT_BYTES} bytes; TMA "
                    f"loads need strides under 2**40 bytes ({TMA_STRIDE_LIMIT // ELEMENT_BYTES} elements)",
                )
            )


# ------------------------------------------------------------------------------ launches


def _sdpa_launch(node: Sdpa, slots: dict[str, Slot]) -> ResolvedLaunch:
    family = KERNEL_FOR_HEAD_DIM[node.head_dim]
    variant = KernelVariant(family, slots[node.q].dtype, node.head_dim, node.causal, node.lse is not None)
    tensors = {"q": node.q, "k": node.k, "v": node.v, "o": node.o, "lse": node.lse}
    heads_kv = node.heads_kv
    values: dict[str, int | float | tuple[int, ...]] = {
        "batch": node.batch,
        "heads_q": node.heads_q,
        "seq_q": node.seq_q,
        "seq_kv": node.seq_kv,
        "group": node.heads_q // node.heads_kv,
        "scale_log2": node.attn_scale * LOG2_E,
        "q.extents": (node.seq_q, node.heads_q, node.batch),
        "k.extents": (node.seq_kv, heads_kv, node.batch),
        "v.extents": (node.seq_kv, heads_kv, node.batch),
    }
    strides = {}
    for role, name in tensors.items():
        strides[role] = _tma_strides(slots[name]) if name is not None else (0, 0, 0)
        values |= dict(zip((f"{role}.{s}" for s in ("stride_b", "stride_h", "stride_s")), strides[role]))
    args = []
    for param, kind in param_list():
        if kind in ("ptr", "tmap"):
            name = tensors[param.split(".")[0]]
            # an absent LSE: the variant never touches its pointer, so a null constant is bound
            args.append(Arg(param, kind, slot=slots[name].index) if name is not None else Arg(param, kind, value=0))
        else:
            args.append(Arg(param, kind, value=values[param]))
    shape = LaunchShape(
        node.batch, node.heads_q, node.seq_q, node.seq_kv, node.heads_q // node.heads_kv,
        tuple(strides[role] for role in tensors),
    )  # fmt: skip
    grid = variant.grid(node.batch, node.heads_q, node.seq_q)
    return ResolvedLaunch(node.name, variant, grid, tuple(args), shape)


def _tma_strides(slot: Slot) -> tuple[int, int, int]:
    """(b, h, s) element strides; a dim of extent 1 is never stepped over, so its stride (which
    the description may leave at any value) becomes one TMA accepts (16 bytes)."""
    return tuple(st if extent > 1 else ROW_ALIGN_ELEMS for extent, st in zip(slot.dims[:3], slot.strides[:3]))
