"""The kv_append op: this step's new keys and values into a paged KV cache, in place.

  k, v        (b, hkv, s_new, d)          this step's new tokens (1: plain decode; up to 16:
                                          speculative decoding, chunked prefill)
  k_cache,    (pages, page_size, hkv, d)  the caches, updated in place (read and written):
  v_cache                                 the plan writes only the appended rows
  page_table  int32 (b, max_pages)        row b lists sequence b's pages, in order
  seq_len_kv  int32 (b,)                  each sequence's cache length AFTER the append

New token t of sequence b goes to cache position p = seq_len_kv[b] - s_new + t: page
page_table[b, p // page_size], row p % page_size. The lengths and the page table stay on the
device (the caller writes them before each execute); a position outside the sequence's
capacity (max_pages * page_size) or a page id outside [0, pages) is skipped, so the plan never
writes outside the caches, whatever they hold.

The caches may be e4m3 (quantized) with k_scale and v_scale (float32, (hkv,) or (1,)): each new
element is stored as x * (1 / scale), rounded to nearest even, saturated to +-448.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from frost_runtime.dtypes import ATTENTION
from frost_runtime.schema import MAX_GRID, NodeRecord

from frostc.contexts import CheckedTensor, NodeContext, ResolveContext
from frostc.graph import role_slots
from frostc.kernels.cache_args import CacheScales, CacheScaleStrides, PshStrides
from frostc.kernels.interface import BhsStrides
from frostc.kernels.kv_append import KvAppendArgs, KvAppendVariant
from frostc.ops.paged_cache import (
    cache_dtype_problem,
    check_cache_scales,
    new_tokens_problem,
    page_size_problem,
)
from frostc.ops.rows import INT32_MAX, agreeing_sizes, check_head_dim, check_row_layout
from frostc.resolved import ResolvedLaunch, launch

KEYS = ("k", "v", "k_cache", "v_cache", "page_table", "seq_len_kv", "k_scale", "v_scale")

DATA_DTYPES = ATTENTION  # frost_runtime.dtypes
INDEX_DTYPE = "int32"

# The named dims of each role; shared names must agree across roles.
_DIMS = {
    "k": ("b", "hkv", "s_new", "d"),
    "v": ("b", "hkv", "s_new", "d"),
    "k_cache": ("pages", "page_size", "hkv", "d"),
    "v_cache": ("pages", "page_size", "hkv", "d"),
    "page_table": ("b", "max_pages"),
    "seq_len_kv": ("b",),
}
_LETTERS = {"k": "bhsd", "v": "bhsd", "k_cache": "pshd", "v_cache": "pshd", "page_table": "bp", "seq_len_kv": "b"}
_UPDATED = ("k_cache", "v_cache")
_DIM_WORDS = {
    "b": "batch", "hkv": "kv heads", "s_new": "new tokens", "d": "head dim", "pages": "pages",
    "page_size": "page size", "max_pages": "pages per sequence",
}  # fmt: skip


@dataclass(frozen=True)
class KvAppend:
    """A validated kv_append node."""

    op: ClassVar[str] = "kv_append"
    name: str
    path: str
    k: str
    v: str
    k_cache: str
    v_cache: str
    page_table: str
    seq_len_kv: str
    batch: int
    heads_kv: int
    s_new: int
    head_dim: int
    pages: int
    page_size: int
    max_pages: int
    k_scale: str | None = None  # e4m3 caches: their scales
    v_scale: str | None = None

    @property
    def capacity(self) -> int:
        """The most tokens one sequence's cache holds."""
        return self.max_pages * self.page_size

    @property
    def inputs(self) -> tuple[tuple[str, str], ...]:
        roles = (("k", self.k), ("v", self.v), ("page_table", self.page_table), ("seq_len_kv", self.seq_len_kv))
        return roles + tuple((r, n) for r, n in (("k_scale", self.k_scale), ("v_scale", self.v_scale)) if n)

    @property
    def outputs(self) -> tuple[tuple[str, str], ...]:
        """The caches: updated in place (also read)."""
        return (("k_cache", self.k_cache), ("v_cache", self.v_cache))

    def record(self, slots: Mapping[str, int]) -> NodeRecord:
        """What the plan records of the node (frost_runtime.schema.NodeRecord)."""
        sizes = {
            "batch": self.batch, "heads_kv": self.heads_kv, "s_new": self.s_new, "head_dim": self.head_dim,
            "pages": self.pages, "page_size": self.page_size, "max_pages": self.max_pages,
        }  # fmt: skip
        return NodeRecord(self.op, self.name, "", sizes, role_slots(self, slots))


# ---------------------------------------------------------------------------------------------
# Checks of a node


def validate(ctx: NodeContext) -> KvAppend | None:
    before = len(ctx.problems)
    tensors: dict[str, CheckedTensor] = {}
    for role, names in _DIMS.items():
        c = ctx.tensor(
            role,
            letters=_LETTERS[role],
            dims=f"({', '.join(names)})" if len(names) > 1 else f"({names[0]},)",
            updated=role in _UPDATED,
        )
        if c is not None:
            tensors[role] = c
    sizes = _check_shapes(tensors, ctx)
    _check_dtypes(tensors, ctx)
    check_cache_scales(ctx, (tensors.get("k_cache"), tensors.get("v_cache")), (sizes or {}).get("hkv"))
    if len(ctx.problems) > before or ctx.name is None or sizes is None:
        return None
    return KvAppend(
        name=ctx.name,
        path=ctx.path,
        **{role: ctx.value(role) for role in KEYS},
        batch=sizes["b"],
        heads_kv=sizes["hkv"],
        s_new=sizes["s_new"],
        head_dim=sizes["d"],
        pages=sizes["pages"],
        page_size=sizes["page_size"],
        max_pages=sizes["max_pages"],
    )


def _check_shapes(tensors: dict[str, CheckedTensor], ctx: NodeContext) -> dict[str, int] | None:
    """Each named dim's size, from the first role that has it; a problem for each mismatch and
    for what the op does not allow (more than 16 new tokens, a page size not a multiple of 16)."""
    sizes, owner, ok = agreeing_sizes(tensors, _DIMS, _DIM_WORDS, ctx)
    s_new = sizes.get("s_new")
    if s_new is not None and (message := new_tokens_problem(s_new)):
        ctx.problems_at(tensors[owner["s_new"]].at("dims[2]"), message)
        ok = False
    page_size = sizes.get("page_size")
    if page_size is not None and (message := page_size_problem(page_size)):
        ctx.problems_at(tensors[owner["page_size"]].at("dims[1]"), message)
        ok = False
    return sizes if ok else None


def _check_dtypes(tensors: dict[str, CheckedTensor], ctx: NodeContext) -> None:
    k = tensors.get("k")
    k_dtype = k.dtype if k is not None and k.dtype in DATA_DTYPES else None
    for role, c in tensors.items():
        if c.dtype is None:
            continue
        if role in ("k_cache", "v_cache"):
            if message := cache_dtype_problem(f"kv_append {role}", c.dtype, k_dtype, "k"):
                ctx.problems_at(c.at("dtype"), message)
        elif role in ("k", "v"):
            if c.dtype not in DATA_DTYPES:
                message = f'kv_append {role} must be {" or ".join(DATA_DTYPES)}, got "{c.dtype}"'
                ctx.problems_at(c.at("dtype"), message + f'; write dtype = "{k_dtype or DATA_DTYPES[0]}"')
            elif k_dtype is not None and c.dtype != k_dtype:
                message = (
                    f"{c.dtype} does not match k's {k_dtype}; k, v and the caches must share one dtype: "
                    f'write dtype = "{k_dtype}"'
                )
                ctx.problems_at(c.at("dtype"), message)
        elif c.dtype != INDEX_DTYPE:
            what = "page ids" if role == "page_table" else "sequence lengths"
            ctx.problems_at(c.at("dtype"), f'{role} holds {what}: it must be {INDEX_DTYPE}, got "{c.dtype}"')


# ---------------------------------------------------------------------------------------------
# Kernel support and the launch


def resolve(node: KvAppend, ctx: ResolveContext) -> tuple[ResolvedLaunch, ...]:
    before = len(ctx.problems)
    _check_supported(node, ctx)
    if len(ctx.problems) > before:
        return ()
    # the kernel clamps to this (never writing outside the caches); check_lengths checks it
    ctx.length_contract(node.seq_len_kv, "lengths", node.capacity)
    variant = KvAppendVariant(ctx.slot(node.k).dtype, node.head_dim, ctx.slot(node.k_cache).dtype)
    slots = {role: ctx.slot(name) for role, name in node.inputs + node.outputs}
    k, v, k_cache, v_cache = (slots[role] for role in ("k", "v", "k_cache", "v_cache"))
    scales = strides = None
    if "k_scale" in slots:  # one scale per kv head, or one for all (stride 0)
        scales = CacheScales(slots["k_scale"], slots["v_scale"])
        strides = CacheScaleStrides(*(_head_stride(slots[role]) for role in ("k_scale", "v_scale")))
    args = KvAppendArgs(
        k, v, k_cache, v_cache, slots["page_table"], slots["seq_len_kv"], scales,
        heads_kv=node.heads_kv, s_new=node.s_new, pages=node.pages, page_size=node.page_size,
        max_pages=node.max_pages,
        k_strides=BhsStrides(*_stepped_strides(k)), v_strides=BhsStrides(*_stepped_strides(v)),
        k_cache_strides=PshStrides(*_stepped_strides(k_cache)), v_cache_strides=PshStrides(*_stepped_strides(v_cache)),
        page_table_stride=slots["page_table"].strides[0], scale_strides=strides,
    )  # fmt: skip
    return (launch(node.name, variant, (node.batch, node.s_new, 1), args),)


def _stepped_strides(slot) -> tuple[int, int, int]:
    """The strides of a (b, h, s, d) row tensor's b, h, s or a cache's (pages, page_size, hkv, d)
    p, s, h dims, in the order the kernel takes them: (b, h, s) and (p, s, h). A dim of extent 1 is
    never stepped along: its stride (any value) becomes 0, which the kernel's 16-byte assumption
    holds for."""
    stepped = [stride if extent > 1 else 0 for stride, extent in zip(slot.strides[:3], slot.dims[:3])]
    return (stepped[0], stepped[1], stepped[2])


def _head_stride(slot) -> int:
    return slot.strides[0] if slot.dims[0] > 1 else 0


def _check_supported(node: KvAppend, ctx: ResolveContext) -> None:
    k = ctx.tensor(node.k)
    check_head_dim(node.head_dim, f"{k.path}.dims[3]", ctx)
    for name, letters in ((node.k, "bhsd"), (node.v, "bhsd"), (node.k_cache, "pshd"), (node.v_cache, "pshd")):
        check_row_layout(ctx.tensor(name), letters, f'"{letters}"', ctx)
    table = ctx.tensor(node.page_table)
    if node.max_pages > 1 and table.strides[1] != 1:
        ctx.problem(
            f"{table.path}.strides[1]",
            f"stride {table.strides[1]}: each sequence's page ids must be contiguous (stride 1); "
            'leave strides out or use layout = "bp"',
        )
    lengths = ctx.tensor(node.seq_len_kv)
    if node.batch > 1 and lengths.strides[0] != 1:
        ctx.problem(
            f"{lengths.path}.strides[0]",
            f"stride {lengths.strides[0]}: length tensors must be contiguous (stride 1); leave strides out",
        )
    # the launch's grid is (batch, new tokens, 1); new tokens are at most 16
    if node.batch > MAX_GRID[0]:
        ctx.problem(
            f"{k.path}.dims[0]", f"batch {node.batch} is over {MAX_GRID[0]}, a launch's grid x; split the batch"
        )
    if node.heads_kv > INT32_MAX:
        ctx.problem(f"{k.path}.dims[1]", f"{node.heads_kv} KV heads do not fit the kernel's int32; at most {INT32_MAX}")
    cache = ctx.tensor(node.k_cache)
    if node.capacity > INT32_MAX:
        ctx.problem(
            f"{table.path}.dims[1]",
            f"{node.max_pages} pages of {node.page_size} tokens make {node.capacity} tokens per sequence, which do "
            f"not fit the kernel's int32; at most {INT32_MAX // node.page_size} pages per sequence",
        )
    if node.pages > INT32_MAX:
        ctx.problem(f"{cache.path}.dims[0]", f"{node.pages} pages do not fit int32 page ids; at most {INT32_MAX}")
