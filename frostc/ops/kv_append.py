"""The kv_append op: this step's new keys and values into a paged KV cache, in place.

Three forms, chosen by the keys a node gives; the caches, and an e4m3 cache's scales, are the
same in all:

  rows (page_table, seq_len_kv): every sequence appends s_new tokens
    k, v          (b, hkv, s_new, d)          this step's new tokens (1: plain decode; up to 16:
                                              speculative decoding, chunked prefill)
    page_table    int32 (b, max_pages)        row b lists sequence b's pages, in order
    seq_len_kv    int32 (b,)                  each sequence's cache length AFTER the append
  New token t of sequence b goes to cache position p = seq_len_kv[b] - s_new + t.

  packed (cu_seqlens_q, with page_table and seq_len_kv): any mix of chunks and decodes
    k, v          (tokens, hkv, d)            the step's new rows packed like a mixed step's
                                              queries; `tokens` is the capacity
    cu_seqlens_q  int32 (b + 1,)              prefix sums: sequence b's rows are tokens
                                              cu[b] .. cu[b + 1] (0 of them: nothing appended)
  Token i = cu[b] + t of sequence b (n = cu[b + 1] - cu[b] tokens) goes to position
  p = seq_len_kv[b] - n + t. Tokens before cu[0] or from cu[b] on are not appended.

  slots (slot_mapping; vLLM's convention): each token names its cache row
    k, v          (tokens, hkv, d)
    slot_mapping  int32 (tokens,)             token i goes to row slot % page_size of page
                                              slot // page_size; -1 (padding) is skipped
  No page table and no lengths.

  k_cache,        (pages, page_size, hkv, d)  the caches, updated in place (read and written):
  v_cache                                     the plan writes only the appended rows

Position p of sequence b is page page_table[b, p // page_size], row p % page_size. The lengths,
prefix sums, page table and slots stay on the device (the caller writes them before each
execute), and the kernel clamps them: a position outside the sequence's capacity (max_pages *
page_size), a page id outside [0, pages) or a slot outside [0, pages * page_size) is skipped,
and a broken prefix sum writes each token at most once, to a position of a sequence's last n
(frostc.kernels.kv_append), so the plan never writes outside the caches, whatever they hold.

The caches may be e4m3 (quantized) with k_scale and v_scale (float32, (hkv,) or (1,)): each new
element is stored as x * (1 / scale), rounded to nearest even, saturated to +-448.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from frost_runtime.dtypes import ATTENTION
from frost_runtime.schema import MAX_GRID, NODE_FORMS, NodeRecord

from frostc.contexts import CheckedTensor, NodeContext, ResolveContext
from frostc.graph import role_slots
from frostc.kernels.cache_args import PshStrides
from frostc.kernels.interface import BhsStrides
from frostc.kernels.kv_append import (
    PACKED,
    ROWS,
    SLOTS,
    KvAppendArgs,
    KvAppendVariant,
    PackedTokens,
    TokenStrides,
)
from frostc.ops.paged_cache import (
    cache_dtype_problem,
    check_cache_scales,
    new_tokens_problem,
    page_size_problem,
    scale_args,
)
from frostc.ops.rows import INT32_MAX, agreeing_sizes, check_head_dim, check_row_layout
from frostc.resolved import ResolvedLaunch, launch

KEYS = (
    "k", "v", "k_cache", "v_cache", "page_table", "seq_len_kv", "cu_seqlens_q", "slot_mapping", "k_scale",
    "v_scale",
)  # fmt: skip

DATA_DTYPES = ATTENTION  # frost_runtime.dtypes
INDEX_DTYPE = "int32"

# The named dims of each role, by form; shared names must agree across roles.
_CACHES = {"k_cache": ("pages", "page_size", "hkv", "d"), "v_cache": ("pages", "page_size", "hkv", "d")}
_PAGED = {"page_table": ("b", "max_pages"), "seq_len_kv": ("b",)}
_TOKEN_ROWS = {"k": ("tokens", "hkv", "d"), "v": ("tokens", "hkv", "d")}
_DIMS = {
    ROWS: {"k": ("b", "hkv", "s_new", "d"), "v": ("b", "hkv", "s_new", "d"), **_CACHES, **_PAGED},
    PACKED: {**_TOKEN_ROWS, **_CACHES, **_PAGED, "cu_seqlens_q": ("b + 1",)},
    SLOTS: {**_TOKEN_ROWS, **_CACHES, "slot_mapping": ("tokens",)},
}
_LETTERS = {
    "b": "b", "hkv": "h", "s_new": "s", "d": "d", "tokens": "t", "pages": "p", "page_size": "s", "max_pages": "p",
    "b + 1": "b",
}  # fmt: skip
_UPDATED = ("k_cache", "v_cache")
_DIM_WORDS = {
    "b": "batch", "hkv": "kv heads", "s_new": "new tokens", "d": "head dim", "pages": "pages",
    "page_size": "page size", "max_pages": "pages per sequence", "tokens": "tokens", "b + 1": "batch + 1",
}  # fmt: skip
# what each int32 role holds (its dtype problem says so)
_INDEX_WORDS = {
    "page_table": "page ids", "seq_len_kv": "sequence lengths", "cu_seqlens_q": "prefix sums of new tokens",
    "slot_mapping": "cache slots",
}  # fmt: skip
# the plan's name of each form (the rows form was kv_append's only one: "", as plans wrote it)
RECORD_FORMS = {ROWS: "", PACKED: "packed", SLOTS: "slots"}


@dataclass(frozen=True)
class KvAppend:
    """A validated kv_append node."""

    op: ClassVar[str] = "kv_append"
    name: str
    path: str
    form: str  # ROWS, PACKED or SLOTS (frostc.kernels.kv_append)
    k: str
    v: str
    k_cache: str
    v_cache: str
    heads_kv: int
    head_dim: int
    pages: int
    page_size: int
    page_table: str | None = None  # rows and packed
    seq_len_kv: str | None = None  # rows and packed
    cu_seqlens_q: str | None = None  # packed
    slot_mapping: str | None = None  # slots
    batch: int = 0  # sequences (rows and packed)
    s_new: int = 0  # new tokens of every sequence (rows)
    tokens: int = 0  # the new rows' capacity (packed and slots)
    max_pages: int = 0  # rows and packed
    k_scale: str | None = None  # e4m3 caches: their scales
    v_scale: str | None = None

    @property
    def capacity(self) -> int:
        """The most tokens one sequence's cache holds (rows and packed)."""
        return self.max_pages * self.page_size

    @property
    def inputs(self) -> tuple[tuple[str, str], ...]:
        roles = ("k", "v", "page_table", "seq_len_kv", "cu_seqlens_q", "slot_mapping", "k_scale", "v_scale")
        return tuple((role, getattr(self, role)) for role in roles if getattr(self, role) is not None)

    @property
    def outputs(self) -> tuple[tuple[str, str], ...]:
        """The caches: updated in place (also read)."""
        return (("k_cache", self.k_cache), ("v_cache", self.v_cache))

    def record(self, slots: Mapping[str, int]) -> NodeRecord:
        """What the plan records of the node (frost_runtime.schema.NodeRecord): the sizes its
        form's NODE_FORMS entry names, each the node's field of that name."""
        form = RECORD_FORMS[self.form]
        sizes = {name: getattr(self, name) for name in NODE_FORMS[self.op, form].sizes}
        return NodeRecord(self.op, self.name, form, sizes, role_slots(self, slots))


# ---------------------------------------------------------------------------------------------
# Checks of a node


def validate(ctx: NodeContext) -> KvAppend | None:
    before = len(ctx.problems)
    form = _check_form(ctx)
    tensors: dict[str, CheckedTensor] = {}
    for role, names in _DIMS[form].items():
        c = _role_tensor(ctx, form, role, names)
        if c is not None:
            tensors[role] = c
    sizes = _check_shapes(tensors, form, ctx)
    _check_dtypes(tensors, ctx)
    check_cache_scales(ctx, (tensors.get("k_cache"), tensors.get("v_cache")), (sizes or {}).get("hkv"))
    if len(ctx.problems) > before or ctx.name is None or sizes is None:
        return None
    return KvAppend(
        name=ctx.name,
        path=ctx.path,
        form=form,
        **{role: ctx.value(role) for role in KEYS},
        heads_kv=sizes["hkv"],
        head_dim=sizes["d"],
        pages=sizes["pages"],
        page_size=sizes["page_size"],
        batch=sizes.get("b", 0),
        s_new=sizes.get("s_new", 0),
        tokens=sizes.get("tokens", 0),
        max_pages=sizes.get("max_pages", 0),
    )


def _check_form(ctx: NodeContext) -> str:
    """slot_mapping makes the node slots, cu_seqlens_q packed, neither rows; in the slots form
    each key of the other forms is refused (still a use of its tensor: not reported unused)."""
    if not ctx.given("slot_mapping"):
        return PACKED if ctx.given("cu_seqlens_q") else ROWS
    for key, (letters, dims, what, forms) in _NOT_SLOTS.items():
        if ctx.given(key):
            ctx.tensor(key, letters=letters, dims=dims, required=False)
            ctx.problem(
                key,
                f"{what}, but slot_mapping names each token's cache row itself (the slots form: page slot // "
                f"page_size, row slot % page_size): remove {key}, or remove slot_mapping for the {forms}",
            )
    return SLOTS


# the keys the slots form refuses: their dims, what they do and the forms that take them
_NOT_SLOTS = {
    "cu_seqlens_q": ("b", "(b + 1,)", "cu_seqlens_q places each sequence's new tokens last in its cache through "
                     "page_table and seq_len_kv", "packed form"),
    "page_table": ("bp", "(b, max_pages)", "page_table maps each sequence's positions to pages",
                   "rows or packed form"),
    "seq_len_kv": ("b", "(b,)", "seq_len_kv gives each cache's length, whose last positions the new tokens take",
                   "rows or packed form"),
}  # fmt: skip


def _role_tensor(ctx: NodeContext, form: str, role: str, names: tuple[str, ...]) -> CheckedTensor | None:
    """The role's tensor, a use with the form's dims; a rows node given packed k or v (rank 3)
    is told, in its rank problem, which keys make the node packed."""
    letters = "".join(_LETTERS[n] for n in names)
    dims = f"({', '.join(names)})" if len(names) > 1 else f"({names[0]},)"
    before = len(ctx.problems)
    c = ctx.tensor(role, letters=letters, dims=dims, updated=role in _UPDATED)
    given = ctx.tensors.get(ctx.value(role)) if isinstance(ctx.value(role), str) else None
    if form == ROWS and role in ("k", "v") and given is not None and given.dims is not None and len(given.dims) == 3:
        for i in range(before, len(ctx.problems)):
            if ctx.problems[i].path == given.at("dims"):
                ctx.problems[i] = replace(ctx.problems[i], message=ctx.problems[i].message + _PACKED_HINT)
    return c


_PACKED_HINT = (
    "; packed rows (tokens, hkv, d) need cu_seqlens_q (int32 (b + 1,): sequence b's new rows are tokens "
    "cu[b] .. cu[b + 1]) or slot_mapping (int32 (tokens,): each token's cache slot)"
)


def _check_shapes(tensors: dict[str, CheckedTensor], form: str, ctx: NodeContext) -> dict[str, int] | None:
    """Each named dim's size, from the first role that has it; a problem for each mismatch and
    for what the op does not allow (more than 16 new tokens per sequence in the rows form, a
    page size not a multiple of 16, prefix sums not one longer than the batch)."""
    sizes, owner, ok = agreeing_sizes(tensors, _DIMS[form], _DIM_WORDS, ctx)
    s_new = sizes.get("s_new")
    if s_new is not None and (message := new_tokens_problem(s_new)):
        ctx.problems_at(tensors[owner["s_new"]].at("dims[2]"), message)
        ok = False
    page_size = sizes.get("page_size")
    if page_size is not None and (message := page_size_problem(page_size)):
        ctx.problems_at(tensors[owner["page_size"]].at("dims[1]"), message)
        ok = False
    b, entries = sizes.get("b"), sizes.get("b + 1")
    if b is not None and entries is not None and entries != b + 1:
        ctx.problems_at(
            tensors["cu_seqlens_q"].at("dims[0]"),
            f"cu_seqlens_q holds b + 1 prefix sums; {owner['b']}'s batch is {b}, so write dims = [{b + 1}] "
            f"(got {entries})",
        )
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
            message = f'{role} holds {_INDEX_WORDS[role]}: it must be {INDEX_DTYPE}, got "{c.dtype}"'
            ctx.problems_at(c.at("dtype"), message)


# ---------------------------------------------------------------------------------------------
# Kernel support and the launch


def resolve(node: KvAppend, ctx: ResolveContext) -> tuple[ResolvedLaunch, ...]:
    before = len(ctx.problems)
    _check_supported(node, ctx)
    if len(ctx.problems) > before:
        return ()
    # the kernel clamps to these (never writing outside the caches); check_lengths checks them
    if node.seq_len_kv is not None:
        ctx.length_contract(node.seq_len_kv, "lengths", node.capacity)
    if node.cu_seqlens_q is not None:  # a sequence appends at most what its cache holds
        ctx.length_contract(node.cu_seqlens_q, "offsets", min(node.tokens, node.capacity), node.tokens)
    variant = KvAppendVariant(ctx.slot(node.k).dtype, node.head_dim, ctx.slot(node.k_cache).dtype, node.form)
    slots = {role: ctx.slot(name) for role, name in node.inputs + node.outputs}
    k, v = slots["k"], slots["v"]
    scales = scale_strides = None
    if "k_scale" in slots:  # one scale per kv head, or one for all (stride 0)
        scales, scale_strides = scale_args(slots["k_scale"], slots["v_scale"])
    rows, paged = node.form == ROWS, node.form != SLOTS
    args = KvAppendArgs(
        k=k, v=v, k_cache=slots["k_cache"], v_cache=slots["v_cache"], page_table=slots.get("page_table"),
        seq_len_kv=slots.get("seq_len_kv"), slot_mapping=slots.get("slot_mapping"), scales=scales,
        packed=PackedTokens(slots["cu_seqlens_q"], node.batch, node.tokens) if node.form == PACKED else None,
        heads_kv=node.heads_kv, s_new=node.s_new if rows else None, pages=node.pages, page_size=node.page_size,
        max_pages=node.max_pages if paged else None,
        k_strides=BhsStrides(*_stepped_strides(k, 3)) if rows else None,
        v_strides=BhsStrides(*_stepped_strides(v, 3)) if rows else None,
        k_token_strides=None if rows else TokenStrides(*_stepped_strides(k, 2)),
        v_token_strides=None if rows else TokenStrides(*_stepped_strides(v, 2)),
        k_cache_strides=PshStrides(*_stepped_strides(slots["k_cache"], 3)),
        v_cache_strides=PshStrides(*_stepped_strides(slots["v_cache"], 3)),
        page_table_stride=slots["page_table"].strides[0] if paged else None, scale_strides=scale_strides,
    )  # fmt: skip
    grid = (node.batch, node.s_new, 1) if rows else (node.tokens, 1, 1)
    return (launch(node.name, variant, grid, args),)


def _stepped_strides(slot, count: int) -> tuple[int, ...]:
    """The strides of the first `count` dims of a (b, h, s, d) row tensor, (tokens, h, d) packed
    rows or a cache's (pages, page_size, hkv, d), in the order the kernel takes them: (b, h, s),
    (t, h) and (p, s, h). A dim of extent 1 is never stepped along: its stride (any value)
    becomes 0, which the kernel's 16-byte assumption holds for."""
    return tuple(stride if extent > 1 else 0 for stride, extent in zip(slot.strides[:count], slot.dims[:count]))


def _check_supported(node: KvAppend, ctx: ResolveContext) -> None:
    k = ctx.tensor(node.k)
    rows = "bhsd" if node.form == ROWS else "thd"
    check_head_dim(node.head_dim, f"{k.path}.dims[{len(rows) - 1}]", ctx, where="by kv_append")
    for name, letters in ((node.k, rows), (node.v, rows), (node.k_cache, "pshd"), (node.v_cache, "pshd")):
        check_row_layout(ctx.tensor(name), letters, f'"{letters}"', ctx)
    if node.page_table is not None:
        table = ctx.tensor(node.page_table)
        if node.max_pages > 1 and table.strides[1] != 1:
            ctx.problem(
                f"{table.path}.strides[1]",
                f"stride {table.strides[1]}: each sequence's page ids must be contiguous (stride 1); "
                'leave strides out or use layout = "bp"',
            )
        if node.capacity > INT32_MAX:
            ctx.problem(
                f"{table.path}.dims[1]",
                f"{node.max_pages} pages of {node.page_size} tokens make {node.capacity} tokens per sequence, which "
                f"do not fit the kernel's int32; at most {INT32_MAX // node.page_size} pages per sequence",
            )
    for role, name, extent in (
        ("lengths", node.seq_len_kv, node.batch),
        ("prefix sums", node.cu_seqlens_q, node.batch + 1),
        ("slots", node.slot_mapping, node.tokens),
    ):
        t = ctx.tensor(name) if name is not None else None
        if t is not None and extent > 1 and t.strides[0] != 1:
            ctx.problem(
                f"{t.path}.strides[0]",
                f"stride {t.strides[0]}: {role} must be contiguous (stride 1); leave strides out",
            )
    # the launch's grid x: the sequences (rows; new tokens, at most 16, are y) or the tokens
    across, what = (node.batch, "batch") if node.form == ROWS else (node.tokens, "tokens")
    if across > MAX_GRID[0]:
        ctx.problem(f"{k.path}.dims[0]", f"{what} {across} is over {MAX_GRID[0]}, a launch's grid x; split the {what}")
    if node.heads_kv > INT32_MAX:
        ctx.problem(f"{k.path}.dims[1]", f"{node.heads_kv} KV heads do not fit the kernel's int32; at most {INT32_MAX}")
    if node.pages > INT32_MAX:
        cache = ctx.tensor(node.k_cache)
        ctx.problem(f"{cache.path}.dims[0]", f"{node.pages} pages do not fit int32 page ids; at most {INT32_MAX}")
