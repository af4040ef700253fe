"""The sdpa op: scaled-dot-product attention forward, O = softmax(mask(Q Kᵀ · scale)) V.

Everything about the op is here: its description keys, the checks of a node, what the kernels
support, and how a node becomes launches. Three forms of sequence lengths:

  dense   q (b, hq, sq, d), k and v (b, hkv, skv, d), o (b, hq, sq, d), lse (b, hq, sq):
          every sequence has the dims' lengths
  padded  the same tensors with the s dims as capacities, and seq_len_q / seq_len_kv
          (int32, (b,)) giving each sequence's length; either may be left out
  packed  q (tq, hq, d), k and v (tkv, hkv, d), o (tq, hq, d), lse (tq, hq): the sequences one
          after another, with cu_seqlens_q / cu_seqlens_kv (int32, (b + 1,), prefix sums)
  paged   q (b, hq, s_new, d) a few new tokens per sequence, k and v a paged KV cache
          (pages, page_size, hkv, d), page_table (int32, (b, max_pages)) and seq_len_kv (int32,
          (b,)): each sequence's keys are its first seq_len_kv cache positions, position p in
          page page_table[b, p // page_size]; resolved by `frostc.ops.sdpa_paged` (split-KV);
          the caches may be e4m3 with k_scale and v_scale (float32, (hkv,) or (1,))

FP8: q, k and v e4m3 with q_descale, k_descale and v_descale (float32, (1,) or one per head:
(hq,), (hkv,), (hkv,)), o bf16 or fp16. The kernel reads V with its keys innermost (8-bit WGMMA
operands are K-major): dense and padded V is either given so, its s stride 1, e.g. layout
"bhds" (read as it is), or with d innermost like q and k, and a kernel of the plan re-lays it
transposed into the workspace first (`_relaid_v`); packed V is given (t, h, d) like q and k and
always re-laid, each sequence from a 16-key boundary (TMA loads a tile only from an innermost
coordinate on a 16-byte boundary: `frostc.kernels.vt_pack`).
With variable lengths the scheduling kernel also writes each sequence's Vᵀ tensor map into the
workspace (keys innermost cannot be ragged: `frostc.kernels.sequence_maps`).

Variable lengths stay on the device: the plan fixes capacities (batch, tokens or rows,
max_seqlen_*), a scheduling kernel of the same plan turns the lengths into a tile list in the
caller's workspace, and the attention kernel walks it. Masks: causal (diagonal aligned top-left
or bottom-right), a sliding window (window_left, window_right) around the same diagonal, and
a logit softcap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from frost_runtime.dtypes import ATTENTION, SCALE_DTYPE
from frost_runtime.schema import F32_MAX, MAX_GRID

from frostc.contexts import CheckedTensor, NodeContext, ResolveContext
from frostc.kernels.interface import BhsStrides, TmaSource
from frostc.kernels.sdpa_common import LOG2_E, MaskFlags, SoftmaxScales
from frostc.kernels.sdpa_fwd_wgmma import (
    O_FLOAT32_HEAD_DIMS,
    THREE_CONSUMER_HEAD_DIMS,
    Descales,
    ForwardShape,
    Outputs,
    SdpaForwardArgs,
    SdpaFwdVariant,
    TileWorkspace,
    tiles_for_head_dim,
)
from frostc.kernels.sdpa_schedule import ScheduleArgs, ScheduleVariant, VMaps
from frostc.kernels.sequence_maps import MAP_BYTES, packed_pitch
from frostc.kernels.vt_pack import BatchedV, PackedV, VtPackArgs, VtPackVariant, relaid_pitch
from frostc.ops import sdpa_paged
from frostc.ops.paged_cache import (
    SCALE_ROLES,
    cache_dtype_problem,
    check_cache_scales,
    is_scaled,
    new_tokens_problem,
    page_size_problem,
)
from frostc.ops.rows import (
    HEAD_DIMS,
    INT32_MAX,
    check_head_dim,
    check_row_layout,
    check_tma_strides,
    check_whole_pieces,
    tma_stride,
)
from frostc.resolved import ResolvedLaunch, Workspace, launch

KEYS = (
    "q", "k", "v", "o", "lse",
    "cu_seqlens_q", "cu_seqlens_kv", "seq_len_q", "seq_len_kv", "max_seqlen_q", "max_seqlen_kv",
    "attn_scale", "causal", "diagonal_alignment", "window_left", "window_right", "softcap", "inference",
    "page_table", "k_scale", "v_scale", "q_descale", "k_descale", "v_descale", "o_accumulation",
    "debug_tile_visits",
)  # fmt: skip

ALIGNMENTS = ("top_left", "bottom_right")
DATA_DTYPES = ATTENTION  # q, k, v and o (frost_runtime.dtypes)
LSE_DTYPE = "fp32"
LENGTH_DTYPE = "int32"
PACKED_KEYS = ("cu_seqlens_q", "cu_seqlens_kv")
PADDED_KEYS = ("seq_len_q", "seq_len_kv")
DESCALE_ROLES = {"q_descale": "hq", "k_descale": "hkv", "v_descale": "hkv"}  # role: the heads it may have
DESCALE_EXAMPLE = "amax(|x|) / 448 of the unquantized tensor"
OUT_DTYPES_FP8 = ATTENTION  # o of e4m3 q, k, v
# where e4m3 attention sums O: in the FP8 tensor cores' accumulator throughout (as cuDNN's FP8
# SDPA does: fast, but a sum of many products of one sign loses its small terms), or in
# float32 every few key blocks (the kernel's PROMOTE_BLOCKS)
O_ACCUMULATIONS = ("tensor_cores", "float32")

# The named dims of each role, by form; shared names must agree across roles.
_DENSE_DIMS = {
    "q": ("b", "hq", "sq", "d"),
    "k": ("b", "hkv", "skv", "d"),
    "v": ("b", "hkv", "skv", "dv"),
    "o": ("b", "hq", "sq", "dv"),
    "lse": ("b", "hq", "sq"),
    "seq_len_q": ("b",),
    "seq_len_kv": ("b",),
}
_PACKED_DIMS = {
    "q": ("tq", "hq", "d"),
    "k": ("tkv", "hkv", "d"),
    "v": ("tkv", "hkv", "dv"),
    "o": ("tq", "hq", "dv"),
    "lse": ("tq", "hq"),
    "cu_seqlens_q": ("b + 1",),
    "cu_seqlens_kv": ("b + 1",),
}
_PAGED_DIMS = {
    "q": ("b", "hq", "sq", "d"),
    "k": ("pages", "page_size", "hkv", "d"),
    "v": ("pages", "page_size", "hkv", "dv"),
    "o": ("b", "hq", "sq", "dv"),
    "lse": ("b", "hq", "sq"),
    "page_table": ("b", "max_pages"),
    "seq_len_kv": ("b",),
}
_DIM_WORDS = {
    "b": "batch", "hq": "heads", "sq": "sequence length", "d": "head dim", "hkv": "kv heads",
    "skv": "kv sequence length", "dv": "head dim", "tq": "tokens", "tkv": "kv tokens", "b + 1": "batch + 1",
    "pages": "pages", "page_size": "page size", "max_pages": "pages per sequence",
}  # fmt: skip
_LETTERS = {"b": "b", "hq": "h", "hkv": "h", "sq": "s", "skv": "s", "d": "d", "dv": "d", "tq": "t", "tkv": "t"}
_LETTERS |= {"b + 1": "b", "pages": "p", "page_size": "s", "max_pages": "p"}
_DIMS_OF_FORM = {"dense": _DENSE_DIMS, "padded": _DENSE_DIMS, "packed": _PACKED_DIMS, "paged": _PAGED_DIMS}


# ---------------------------------------------------------------------------------------------
# The validated node


@dataclass(frozen=True)
class Mask:
    causal: bool
    alignment: str  # "top_left" | "bottom_right"
    window_left: int | None  # keys from the diagonal - window_left; None: unbounded
    window_right: int | None  # keys up to the diagonal + window_right (causal: 0); None: unbounded
    softcap: float | None

    @property
    def flags(self) -> MaskFlags:
        return MaskFlags(
            right=self.window_right is not None,
            left=self.window_left is not None,
            bottom_right=self.alignment == "bottom_right",
            softcap=self.softcap is not None,
        )


@dataclass(frozen=True)
class Sdpa:
    """A validated sdpa node. For variable lengths, seq_q / seq_kv are capacities: the padded
    tensors' rows, or max_seqlen_* (packed)."""

    op: ClassVar[str] = "sdpa"
    name: str
    path: str
    q: str
    k: str
    v: str
    o: str
    lse: str | None
    form: str  # "dense" | "padded" | "packed" | "paged"
    q_lengths: str | None  # seq_len_q or cu_seqlens_q
    kv_lengths: str | None
    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    seq_q: int
    seq_kv: int
    tokens_q: int  # packed: q's tokens; else batch * seq_q
    tokens_kv: int
    attn_scale: float  # resolved: 1/sqrt(head_dim) when not given
    mask: Mask
    inference: bool
    page_table: str | None = None  # paged: seq_kv is max_pages * page_size, the capacity
    page_size: int = 0
    pages: int = 0
    k_scale: str | None = None  # paged, e4m3 caches: their scales
    v_scale: str | None = None
    q_descale: str | None = None  # dense e4m3 q, k, v: x = stored · descale
    k_descale: str | None = None
    v_descale: str | None = None
    o_accumulation: str = "tensor_cores"  # e4m3: O_ACCUMULATIONS
    # a debug build: the dynamic tile walk counts each tile's visits into the workspace
    debug_tile_visits: bool = False

    @property
    def causal(self) -> bool:
        return self.mask.causal

    @property
    def fp8(self) -> bool:
        """e4m3 q, k and v (validation admits them only with their descales)."""
        return self.q_descale is not None

    @property
    def inputs(self) -> tuple[tuple[str, str], ...]:
        roles = [("q", self.q), ("k", self.k), ("v", self.v)]
        if self.form == "paged":
            roles += [("page_table", self.page_table), ("seq_len_kv", self.kv_lengths)]
            return tuple(roles) + tuple((r, n) for r, n in (("k_scale", self.k_scale), ("v_scale", self.v_scale)) if n)
        length_keys = PACKED_KEYS if self.form == "packed" else PADDED_KEYS
        roles += [(key, name) for key, name in zip(length_keys, (self.q_lengths, self.kv_lengths)) if name]
        descales = (("q_descale", self.q_descale), ("k_descale", self.k_descale), ("v_descale", self.v_descale))
        return tuple(roles) + tuple((role, name) for role, name in descales if name)

    @property
    def outputs(self) -> tuple[tuple[str, str], ...]:
        return (("o", self.o),) + ((("lse", self.lse),) if self.lse else ())


# ---------------------------------------------------------------------------------------------
# Checks of a node


def validate(ctx: NodeContext) -> Sdpa | None:
    before = len(ctx.problems)
    form = _check_form(ctx)
    dims_of = _DIMS_OF_FORM[form]
    roles = list(dims_of) if form == "paged" else ["q", "k", "v", "o", "lse"]
    roles += {"packed": list(PACKED_KEYS), "paged": []}.get(form, list(PADDED_KEYS))
    tensors: dict[str, CheckedTensor] = {}
    for role in roles:
        names = dims_of[role]
        c = ctx.tensor(
            role,
            letters="".join(_LETTERS[n] for n in names),
            dims=f"({', '.join(names)})" if len(names) > 1 else f"({names[0]},)",
            output=role in ("o", "lse"),
            # a missing cu_seqlens_* is _check_form's to report, a paged node's lengths are not
            required=role in ("q", "k", "v", "o") or (form == "paged" and role != "lse"),
        )
        if c is not None:
            tensors[role] = c
    sizes = _check_shapes(tensors, dims_of, ctx)
    fp8 = _check_dtypes(tensors, ctx, form)
    _check_descales(ctx, fp8, sizes, form)
    if form == "paged":
        check_cache_scales(ctx, (tensors.get("k"), tensors.get("v")), (sizes or {}).get("hkv"))
    else:
        for role in SCALE_ROLES:
            if ctx.given(role):
                ctx.problem(
                    role,
                    f"scales a quantized (e4m3) paged KV cache; the {form} form has no cache (e4m3 q, k and v of "
                    f"the dense form take q_descale, k_descale and v_descale): remove {role}",
                )
    mask = _check_mask(ctx, form)
    scale = ctx.positive_float("attn_scale", "omit it for the default 1/sqrt(head dim)")
    default_scale = 1.0 / math.sqrt(sizes["d"]) if sizes and "d" in sizes else 1.0
    _check_float32_scales(ctx, scale, default_scale, mask)
    inference = ctx.bool("inference")
    o_accumulation = _check_o_accumulation(ctx, fp8, form, sizes)
    debug_tile_visits = ctx.bool("debug_tile_visits")
    if debug_tile_visits and form != "dense":
        ctx.problem(
            "debug_tile_visits",
            f"counts the visits of the dense causal kernel's dynamic tile walk; a {form} node has no such "
            "walk: remove debug_tile_visits",
        )
    if inference is False and not ctx.given("lse"):
        message = (
            'inference = false (training) requires lse: add lse = "<name>" naming an fp32 tensor '
            f"{'(tq, hq)' if form == 'packed' else '(b, hq, sq)'} for the softmax statistics"
        )
        ctx.problem("lse", message)
    capacities = _check_capacities(ctx, form, sizes)
    if len(ctx.problems) > before or ctx.name is None or sizes is None or mask is None or capacities is None:
        return None
    seq_q, seq_kv, tokens_q, tokens_kv = capacities
    paged = form == "paged"
    return Sdpa(
        name=ctx.name,
        path=ctx.path,
        q=ctx.value("q"),
        k=ctx.value("k"),
        v=ctx.value("v"),
        o=ctx.value("o"),
        lse=ctx.value("lse"),
        form=form,
        q_lengths=ctx.value("cu_seqlens_q" if form == "packed" else "seq_len_q"),
        kv_lengths=ctx.value("cu_seqlens_kv" if form == "packed" else "seq_len_kv"),
        batch=sizes["b"] if "b" in sizes else sizes["b + 1"] - 1,
        heads_q=sizes["hq"],
        heads_kv=sizes["hkv"],
        head_dim=sizes["d"],
        seq_q=seq_q,
        seq_kv=seq_kv,
        tokens_q=tokens_q,
        tokens_kv=tokens_kv,
        attn_scale=scale if scale is not None else 1.0 / math.sqrt(sizes["d"]),
        mask=mask,
        inference=inference is not False,
        page_table=ctx.value("page_table") if paged else None,
        page_size=sizes["page_size"] if paged else 0,
        pages=sizes["pages"] if paged else 0,
        k_scale=ctx.value("k_scale") if paged else None,
        v_scale=ctx.value("v_scale") if paged else None,
        q_descale=ctx.value("q_descale") if fp8 else None,
        k_descale=ctx.value("k_descale") if fp8 else None,
        v_descale=ctx.value("v_descale") if fp8 else None,
        o_accumulation=o_accumulation or "tensor_cores",
        debug_tile_visits=bool(debug_tile_visits),
    )


def _check_form(ctx: NodeContext) -> str:
    packed = [k for k in PACKED_KEYS if ctx.given(k)]
    padded = [k for k in PADDED_KEYS if ctx.given(k)]
    if ctx.given("page_table"):
        for key in (
            packed
            + [k for k in padded if k != "seq_len_kv"]
            + [k for k in ("max_seqlen_q", "max_seqlen_kv") if ctx.given(k)]
        ):
            ctx.problem(
                key,
                f"a paged node (page_table) takes each sequence's cache length from seq_len_kv and its "
                f"query tokens from q's s dim (every sequence has that many new tokens): remove {key}",
            )
        return "paged"
    if packed and padded:
        ctx.problem(
            padded[0],
            f"{padded[0]} gives per-sequence lengths of padded tensors, but {packed[0]} makes the node packed; "
            "give cu_seqlens_q and cu_seqlens_kv (packed) or seq_len_q / seq_len_kv (padded), not both",
        )
    if packed:
        for key in PACKED_KEYS:
            if not ctx.given(key):
                other = "q" if key.endswith("kv") else "kv"
                ctx.problem(
                    key,
                    f"missing; the packed form needs both cu_seqlens_q and cu_seqlens_kv (int32 (b + 1,) prefix "
                    f"sums); for q and kv of the same sequences give {key} = <the cu_seqlens_{other} tensor>",
                )
        return "packed"
    return "padded" if padded else "dense"


def _check_shapes(tensors: dict[str, CheckedTensor], dims_of: dict, ctx: NodeContext) -> dict[str, int] | None:
    """Each named dim's size, from the first role that has it; a problem for each mismatch."""
    sizes: dict[str, int] = {}
    owner: dict[str, str] = {}
    ok = True
    for role in dims_of:
        c = tensors.get(role)
        if c is None or c.dims is None:
            ok = ok and role in ("lse", *PADDED_KEYS)  # optional roles may be absent
            continue
        for i, (name, size) in enumerate(zip(dims_of[role], c.dims)):
            if name not in sizes:
                sizes[name], owner[name] = size, role
            elif sizes[name] != size:
                ctx.problems_at(
                    c.at(f"dims[{i}]"), f"{_DIM_WORDS[name]} {size} does not match {owner[name]}'s {sizes[name]}"
                )
                ok = False

    def dim(name: str) -> str:  # the path of a named dim, in the role it was taken from
        role = owner[name]
        return tensors[role].at(f"dims[{dims_of[role].index(name)}]")

    if "d" in sizes and "dv" in sizes and sizes["d"] != sizes["dv"]:
        message = (
            f"V head dim {sizes['dv']} differs from q's head dim {sizes['d']}; "
            "a different V head dim is not supported yet"
        )
        ctx.problems_at(dim("dv"), message)
        ok = False
    if "hq" in sizes and "hkv" in sizes and sizes["hq"] % sizes["hkv"]:
        hq, hkv = sizes["hq"], sizes["hkv"]
        message = f"q has {hq} heads and k has {hkv}; GQA needs hq % hkv == 0, but {hq} % {hkv} = {hq % hkv}"
        ctx.problems_at(dim("hkv"), message)
        ok = False
    if "page_size" in sizes and (message := page_size_problem(sizes["page_size"])):
        ctx.problems_at(dim("page_size"), message)
        ok = False
    if "page_size" in sizes and "sq" in sizes and (message := new_tokens_problem(sizes["sq"])):
        ctx.problems_at(dim("sq"), message)
        ok = False
    if "b + 1" in sizes and sizes["b + 1"] < 2:
        ctx.problems_at(dim("b + 1"), "cu_seqlens has batch + 1 entries: at least 2")
        ok = False
    return sizes if ok and all(n in sizes for n in ("hq", "hkv", "d")) else None


def _check_dtypes(tensors: dict[str, CheckedTensor], ctx: NodeContext, form: str) -> bool:
    """Problems for dtypes the roles may not have; returns whether the node is FP8 (e4m3 q)."""
    q = tensors.get("q")
    fp8 = form != "paged" and q is not None and is_scaled(q.dtype)
    if fp8:
        _check_fp8_dtypes(tensors, ctx)
    q_dtype = q.dtype if q is not None and q.dtype in DATA_DTYPES else None
    for role, c in tensors.items():
        if c.dtype is None or (fp8 and role in ("q", "k", "v", "o")):
            continue
        if form == "paged" and role in ("k", "v"):
            if message := cache_dtype_problem(f"the paged form's {role} (a cache)", c.dtype, q_dtype, "q"):
                ctx.problems_at(c.at("dtype"), message)
        elif role in ("k", "v") and is_scaled(c.dtype) and q_dtype is not None and form != "paged":
            message = (
                f"{c.dtype} {role} with {q_dtype} q: the FP8 kernel takes e4m3 q, k and v (with q_descale, "
                f"k_descale, v_descale); quantize q too, or give {role} as {q_dtype}"
            )
            ctx.problems_at(c.at("dtype"), message)
        elif role in ("q", "k", "v", "o"):
            if c.dtype not in DATA_DTYPES:
                message = f'sdpa {role} must be {" or ".join(DATA_DTYPES)}, got "{c.dtype}"'
                if is_scaled(c.dtype) and role == "o":
                    message += "; an FP8 node's o is bf16 or fp16"
                elif is_scaled(c.dtype) and role == "q":
                    # only the paged form gets here with e4m3 q (the others take the FP8 kernel)
                    message += (
                        "; the paged form's q stays 16-bit (an FP8 cache is e4m3 k and v with k_scale and v_scale): "
                        "e4m3 q is for the dense, padded and packed forms"
                    )
                ctx.problems_at(c.at("dtype"), message)
            elif q_dtype is not None and c.dtype != q_dtype:
                message = f"{c.dtype} does not match q's {q_dtype}; q, k, v and o must share one dtype (bf16 or fp16)"
                ctx.problems_at(c.at("dtype"), message)
        elif role == "lse" and c.dtype != LSE_DTYPE:
            ctx.problems_at(c.at("dtype"), f'lse must be {LSE_DTYPE}, got "{c.dtype}"')
        elif role == "page_table" and c.dtype != LENGTH_DTYPE:
            ctx.problems_at(c.at("dtype"), f'page_table holds page ids: it must be {LENGTH_DTYPE}, got "{c.dtype}"')
        elif role not in ("q", "k", "v", "o", "lse", "page_table") and c.dtype != LENGTH_DTYPE:
            ctx.problems_at(c.at("dtype"), f'{role} holds sequence lengths: it must be {LENGTH_DTYPE}, got "{c.dtype}"')
    return fp8


def _check_fp8_dtypes(tensors: dict[str, CheckedTensor], ctx: NodeContext) -> None:
    """e4m3 q: k and v e4m3 too, o bf16 or fp16 (the other roles: `_check_dtypes`)."""
    q = tensors["q"]
    for role in ("k", "v"):
        c = tensors.get(role)
        if c is not None and c.dtype is not None and c.dtype != q.dtype:
            ctx.problems_at(
                c.at("dtype"),
                f'{c.dtype} does not match q\'s {q.dtype}; the FP8 kernel takes e4m3 q, k and v: dtype = "{q.dtype}"',
            )
    o = tensors.get("o")
    if o is not None and o.dtype is not None and o.dtype not in OUT_DTYPES_FP8:
        ctx.problems_at(
            o.at("dtype"),
            f'an FP8 node writes o as {" or ".join(OUT_DTYPES_FP8)}, got "{o.dtype}": dtype = "{OUT_DTYPES_FP8[0]}"',
        )


def _check_descales(ctx: NodeContext, fp8: bool, sizes: dict[str, int] | None, form: str) -> None:
    """e4m3 q, k, v need their descales (float32, (1,) or one per head); other nodes refuse them."""
    for role, heads in DESCALE_ROLES.items():
        if not fp8 or form == "paged":
            if ctx.given(role):
                ctx.tensor(role, letters="h", dims=f"({heads},)")  # a use: the tensor is not reported as unused
                ctx.problem(role, f"dequantizes e4m3 q, k and v, and q is not e4m3: remove {role}")
            continue
        if not ctx.given(role):
            ctx.problem(
                role,
                f"missing: e4m3 {role[0]} holds x / descale, so the node needs it; name a {SCALE_DTYPE} tensor "
                f'({heads},) or (1,) ({DESCALE_EXAMPLE}), e.g. {role} = "{role}"',
            )
            continue
        c = ctx.tensor(role, letters="h", dims=f"({heads},)")
        if c is None:
            continue
        if c.dtype is not None and c.dtype != SCALE_DTYPE:
            ctx.problems_at(c.at("dtype"), f'{role} holds a scale factor: it must be {SCALE_DTYPE}, got "{c.dtype}"')
        count = (sizes or {}).get(heads)
        if c.dims is not None and count is not None and (len(c.dims) != 1 or c.dims[0] not in (1, count)):
            ctx.problems_at(
                c.at("dims"),
                f"{role} holds one factor per {'q' if heads == 'hq' else 'kv'} head ({count}) or one for all (1), "
                f"got dims {list(c.dims)}; write dims = [{count}] or [1]",
            )


def _check_mask(ctx: NodeContext, form: str) -> Mask | None:
    before = len(ctx.problems)
    causal = ctx.bool("causal")
    alignment = ctx.choice("diagonal_alignment", ALIGNMENTS, "diagonal alignment")
    left = ctx.int("window_left", 0, "keys before the diagonal each query sees")
    right = ctx.int("window_right", 0, "keys after the diagonal each query sees")
    softcap = ctx.positive_float("softcap", "Gemma 2 uses 50.0; omit it for no softcap")
    for key, value in (("window_left", left), ("window_right", right)):
        if value is not None and value > INT32_MAX:
            ctx.problem(key, f"{value} keys do not fit the kernel's int32 (at most {INT32_MAX}); omit it for no bound")
    if causal and right is not None and right > 0:
        ctx.problem(
            "window_right",
            f"causal = true already ends each query's keys at the diagonal (window_right = 0), but window_right "
            f"= {right}; drop causal for a window reaching {right} keys past the diagonal, or drop window_right",
        )
    if alignment is not None and not causal and left is None and right is None:
        ctx.problem(
            "diagonal_alignment",
            "places the diagonal of causal = true or of a window; with neither it does nothing: "
            "add causal = true (or window_left / window_right), or remove diagonal_alignment",
        )
    if form == "paged":
        _check_paged_mask(ctx, alignment, left, right, softcap)
        alignment = "bottom_right"  # the new tokens are the cache's last
    if len(ctx.problems) > before:
        return None
    if causal:
        right = 0
    return Mask(bool(causal), alignment or "top_left", left, right, softcap)


def _check_float32_scales(ctx: NodeContext, scale: float | None, default: float, mask: Mask | None) -> None:
    """The kernels take the scales as float32: scale * log2(e) (or softcap * log2(e)) and
    scale / softcap must stay finite there."""
    most = f"{F32_MAX / LOG2_E:.3g}"
    if scale is not None and scale * LOG2_E > F32_MAX:
        ctx.problem("attn_scale", f"{scale} is beyond float32's range once scaled by log2(e): at most {most}")
    softcap = mask.softcap if mask is not None else None
    if softcap is None:
        return
    if softcap * LOG2_E > F32_MAX:
        ctx.problem("softcap", f"{softcap} is beyond float32's range once scaled by log2(e): at most {most}")
    elif (scale or default) / softcap > F32_MAX:
        ratio = (scale or default) / softcap
        ctx.problem("softcap", f"attn_scale / softcap = {ratio:.3g} is beyond float32's range: use a larger softcap")


def _check_o_accumulation(ctx: NodeContext, fp8: bool, form: str, sizes: dict | None) -> str | None:
    """`o_accumulation`: e4m3 q, k and v of the dense, padded or packed form only, and "float32"
    at the head dims its kernel is built for."""
    choice = ctx.choice("o_accumulation", O_ACCUMULATIONS, "O accumulation")
    if choice is None:
        return None
    if not fp8 or form == "paged":
        kind = "a paged node" if form == "paged" else "16-bit q, k and v (their O sums in float32)"
        ctx.problem("o_accumulation", f"chooses where e4m3 attention sums O; {kind} has no choice: remove it")
        return None
    d = (sizes or {}).get("d")
    if choice == "float32" and d is not None and d not in O_FLOAT32_HEAD_DIMS:
        dims = ", ".join(map(str, O_FLOAT32_HEAD_DIMS))
        ctx.problem(
            "o_accumulation",
            f'"float32" is built for head dim {dims}, this node\'s is {d}: use "tensor_cores" (or remove it)',
        )
        return None
    return choice


def _check_paged_mask(ctx: NodeContext, alignment, left, right, softcap) -> None:
    if alignment == "top_left":
        ctx.problem(
            "diagonal_alignment",
            'a paged node\'s new tokens are the last of each cache, so its diagonal is "bottom_right": '
            "remove diagonal_alignment (or write bottom_right)",
        )
    if right is not None:
        ctx.problem(
            "window_right",
            "window_right is not supported in the paged form (its new tokens are the cache's last: no key lies "
            "past them): remove it",
        )


def _check_capacities(ctx: NodeContext, form: str, sizes: dict[str, int] | None) -> tuple[int, int, int, int] | None:
    """(seq_q, seq_kv, tokens_q, tokens_kv): lengths (dense) or capacities (variable)."""
    if form == "paged":
        if sizes is None or not {"b", "sq", "max_pages", "page_size"} <= sizes.keys():
            return None
        seq_kv = sizes["max_pages"] * sizes["page_size"]
        return sizes["sq"], seq_kv, sizes["b"] * sizes["sq"], sizes["b"] * seq_kv
    if form != "packed":
        for key in ("max_seqlen_q", "max_seqlen_kv"):
            if ctx.given(key):
                ctx.problem(
                    key,
                    f"{key} is a capacity of the packed form (cu_seqlens_*); in the {form} form the s dims "
                    "of the tensors are the capacities: remove it",
                )
        if sizes is None or "sq" not in sizes or "skv" not in sizes:
            return None
        return sizes["sq"], sizes["skv"], sizes["b"] * sizes["sq"], sizes["b"] * sizes["skv"]
    result = []
    for key, tokens in (("max_seqlen_q", "tq"), ("max_seqlen_kv", "tkv")):
        value = ctx.int(key, 1, "the longest sequence the plan serves")
        total = sizes.get(tokens) if sizes else None
        if value is not None and total is not None and value > total:
            ctx.problem(key, f"{value} is longer than the {total} tokens the buffers hold; at most {total}")
            value = None
        result.append(value if value is not None else total)
    if sizes is None or None in result:
        return None
    return result[0], result[1], sizes["tq"], sizes["tkv"]


# ---------------------------------------------------------------------------------------------
# Kernel support and launches

PER_TILE_MIN_KEY_BLOCKS = 64  # causal tiles of 32 key blocks on average and more (bench/NOTES.md v16)
PAIRED_MAX_QUERY_BLOCKS = 12  # causal heads of at most this many tiles walk in pairs (NOTES v19)
# e4m3 d=128 dense and packed: three consumer warpgroups (192-row tiles) where rows see this many
# keys or more; measured per tile +5-7 % from 8k keys on, -2 to -6 % at 2k-4k, packed mixes up to
# 8-16k +4 to +8 % (bench/NOTES.md, FP8 v12)
THREE_CONSUMERS_MIN_KEYS = 8192
THREE_CONSUMERS_TILE_GAIN = 1.065  # a 192-row tile's rows per second over two 128-row tiles'


def resolve(node: Sdpa, ctx: ResolveContext) -> tuple[ResolvedLaunch, ...]:
    if node.form == "paged":
        return sdpa_paged.resolve(node, ctx)
    before = len(ctx.problems)
    _check_supported(node, ctx)
    if len(ctx.problems) > before:
        return ()
    variant = _variant(node, ctx)
    relaid = _relaid_v(node, ctx)  # e4m3 V given with d innermost: Vᵀ re-laid into the workspace
    if node.form == "dense":
        regions: dict[str, int] = {}
        if variant.dynamic:  # the tiles' counter: zero at every launch's start, left zero
            regions["tile_counter"] = ctx.workspace(f"{node.name}.tile_counter", 4, zeroed=True)
        if variant.count_visits:  # int32 per (tile, consumer), through the tile list's pointer
            visits = _tile_capacity(node, variant.tile_shape.block_m) * variant.tile_shape.consumers
            regions["tiles"] = ctx.workspace(f"{node.name}.tile_visits", 4 * visits)
        if relaid:
            regions["v_relaid"] = _relaid_region(node, ctx)
            return (_relay_launch(node, regions["v_relaid"], ctx), _attention_launch(node, variant, ctx, regions))
        return (_attention_launch(node, variant, ctx, regions),)
    _record_length_contracts(node, ctx)
    tiles = variant.tile_shape
    units = _unit_capacity(node, tiles.block_m)
    workspace = {
        "sequences": ctx.workspace(f"{node.name}.sequences", 16 * node.batch),
        "tiles": ctx.workspace(f"{node.name}.tiles", 8 * units),
        "tile_count": ctx.workspace(f"{node.name}.tile_count", 4),
    }
    if node.fp8:  # each sequence's Vᵀ tensor map, written by the scheduling kernel
        workspace["v_maps"] = ctx.workspace(f"{node.name}.v_maps", MAP_BYTES * node.batch)
    if variant.v_repacked:  # packed V, transposed from 16-key boundaries (vt_pack)
        rows = node.heads_kv * node.head_dim
        workspace["v_packed"] = ctx.workspace(f"{node.name}.v_packed", rows * packed_pitch(node.tokens_kv, node.batch))
    if relaid:  # padded V's rows, transposed: both launches' V maps address the workspace
        workspace["v_relaid"] = _relaid_region(node, ctx)
    attention = _attention_launch(node, variant, ctx, workspace)
    schedule = _schedule_launch(node, variant, units, workspace, attention, ctx)
    if variant.v_repacked:
        return (schedule, _pack_launch(node, workspace, ctx), attention)
    if relaid:
        return (schedule, _relay_launch(node, workspace["v_relaid"], ctx), attention)
    return (schedule, attention)


def _relaid_v(node: Sdpa, ctx: ResolveContext) -> bool:
    """Dense or padded e4m3 V given with d innermost (as q and k): a launch of the plan writes it
    transposed (keys innermost, the layout 8-bit WGMMA reads) into the workspace."""
    return node.fp8 and node.form != "packed" and ctx.tensor(node.v).strides[3] == 1


def _relaid_region(node: Sdpa, ctx: ResolveContext) -> int:
    """The workspace region of the re-laid Vᵀ (b, hkv, d, pitch), e4m3: its offset."""
    nbytes = node.batch * node.heads_kv * node.head_dim * relaid_pitch(node.seq_kv)
    return ctx.workspace(f"{node.name}.v_relaid", nbytes)


def _relaid_strides(node: Sdpa) -> tuple[int, int, int]:
    """(b, h, s) element strides of the re-laid Vᵀ: keys innermost, d rows `pitch` apart."""
    pitch = relaid_pitch(node.seq_kv)
    return (node.heads_kv * node.head_dim * pitch, node.head_dim * pitch, 1)


def _relay_launch(node: Sdpa, offset: int, ctx: ResolveContext) -> ResolvedLaunch:
    """Dense or padded e4m3 V (b, h, s, d) with d innermost, transposed into the workspace at
    `offset` as Vᵀ (b, h, d, pitch) (vt_pack's batched variant), before the attention."""
    variant = VtPackVariant(node.head_dim, batched=True, p_order=_v_in_p_order(node, ctx))
    v = ctx.slot(node.v)
    pitch = relaid_pitch(node.seq_kv)
    batched = BatchedV(node.seq_kv, stride_b=v.strides[0], stride_s=v.strides[2], stride_h=v.strides[1])
    args = VtPackArgs(v, None, Workspace(offset), packed=None, batched=batched, pitch=pitch)
    return launch(node.name, variant, variant.grid(pitch, node.heads_kv, node.batch), args)


def _record_length_contracts(node: Sdpa, ctx: ResolveContext) -> None:
    """What the plan assumes of the caller's lengths; the kernels clamp to it (never reading or
    writing outside a buffer), and frost_runtime's check_lengths checks it on request."""
    for name, longest, total in (
        (node.q_lengths, node.seq_q, node.tokens_q),
        (node.kv_lengths, node.seq_kv, node.tokens_kv),
    ):
        if name is not None:
            kind = "offsets" if node.form == "packed" else "lengths"
            ctx.length_contract(name, kind, longest, total if kind == "offsets" else 0)


def _variant(node: Sdpa, ctx: ResolveContext) -> SdpaFwdVariant:
    """The attention kernel's compile key (its tiles follow from it). Dense causal tiles of many
    key blocks run one CTA each (`per_tile`): measured faster from PER_TILE_MIN_KEY_BLOCKS on;
    a causal head of few tiles is walked in pairs of tiles (`paired`): measured faster up to
    PAIRED_MAX_QUERY_BLOCKS (neutral at 16, slower from 22 query blocks on); the causal heads
    between take their tiles from a counter (`dynamic`: longest first within L2 sections,
    balanced at run time; NOTES v20), which needs a zeroed word of workspace."""
    flags = node.mask.flags
    three = _three_consumers(node, ctx)
    tiles = tiles_for_head_dim(node.head_dim, flags.left, node.fp8, three)
    causal_dense = node.form == "dense" and flags.right and not flags.left
    per_tile = causal_dense and node.seq_kv >= PER_TILE_MIN_KEY_BLOCKS * tiles.block_n
    paired = causal_dense and not per_tile and -(-node.seq_q // tiles.block_m) <= PAIRED_MAX_QUERY_BLOCKS
    dynamic = causal_dense and not per_tile and not paired
    if node.debug_tile_visits and not dynamic:
        walk = "one CTA per tile" if per_tile else "pairs of tiles" if paired else "a fixed walk"
        ctx.problem(
            f"{node.path}.debug_tile_visits",
            f"counts the visits of the dynamic tile walk (dense causal heads of {PAIRED_MAX_QUERY_BLOCKS + 1} or "
            f"more query blocks and fewer than {PER_TILE_MIN_KEY_BLOCKS} key blocks), but this node's tiles "
            f"run as {walk}: remove debug_tile_visits",
        )
    return SdpaFwdVariant(
        ctx.slot(node.q).dtype,
        node.head_dim,
        flags,
        node.lse is not None,
        out_dtype=ctx.slot(node.o).dtype if node.fp8 else "",
        varlen=node.form != "dense",
        per_tile=per_tile,
        paired=paired,
        dynamic=dynamic,
        count_visits=dynamic and node.debug_tile_visits,
        v_repacked=node.fp8 and node.form == "packed",
        v_in_p_order=_v_in_p_order(node, ctx),
        o_float32=node.o_accumulation == "float32",
        three_consumers=three,
    )


def _three_consumers(node: Sdpa, ctx: ResolveContext) -> bool:
    """Whether an e4m3 d=128 node's tiles take three consumer warpgroups (192 rows): a third warp
    on each SM sub-partition hides the softmax step's latency, on long rows only (packed: a key
    capacity that long). Dense causal tiles run one CTA each there and packed ones come from the
    scheduling kernel's list, so any count of them balances; dense tiles of equal cost (no right
    bound) run in turns of one per SM, and 192-row tiles are taken only where their turns, each a
    tile's time, still end sooner than the 128-row tiles' (the target's SM count). The padded
    form is not measured: two consumers."""
    flags = node.mask.flags
    if not (node.fp8 and node.form in ("dense", "packed") and node.head_dim in THREE_CONSUMER_HEAD_DIMS):
        return False
    if flags.left or node.seq_kv < THREE_CONSUMERS_MIN_KEYS:
        return False
    if flags.right or node.form == "packed":
        return True
    sms = sdpa_paged.TARGET_SMS[ctx.graph.target]
    two, three = (tiles_for_head_dim(node.head_dim, False, True, wide).block_m for wide in (False, True))

    def turns(rows: int) -> int:  # of the persistent CTAs, one tile each a turn
        tiles = -(-node.seq_q // rows) * node.batch * node.heads_q
        return -(-tiles // sms)

    return turns(three) * three / THREE_CONSUMERS_TILE_GAIN < turns(two) * two


def _v_in_p_order(node: Sdpa, ctx: ResolveContext) -> bool:
    """e4m3 V that the plan re-lays (packed, or dense given with d innermost): vt_pack writes each
    16 keys in P's register order and zeros outside the sequences. Not padded V: its padding rows
    (between a sequence's length and the capacity) are the caller's and may hold anything."""
    return node.fp8 and (node.form == "packed" or (node.form == "dense" and _relaid_v(node, ctx)))


def _tile_capacity(node: Sdpa, block_m: int) -> int:
    """The attention launch's grid x: its tiles (fixed shapes), or the most any lengths within
    the capacities make (variable lengths)."""
    if node.form == "dense":
        return -(-node.seq_q // block_m) * node.heads_q * node.batch
    return _unit_capacity(node, block_m) * node.heads_q


def _unit_capacity(node: Sdpa, block_m: int) -> int:
    """The most (sequence, query block) units any lengths within the capacities make."""
    per_sequence = node.batch * -(-node.seq_q // block_m)
    if node.form == "packed":  # sum of ceil(len / m) <= (tokens + batch * (m - 1)) / m
        return min(per_sequence, (node.tokens_q + node.batch * (block_m - 1)) // block_m)
    return per_sequence


def _check_supported(node: Sdpa, ctx: ResolveContext) -> None:
    q = ctx.tensor(node.q)
    check_head_dim(node.head_dim, f"{q.path}.dims[{len(q.dims) - 1}]", ctx)
    letters = _letters(node.form)
    layouts = '"thd"' if node.form == "packed" else '"bshd" or "bhsd"'
    # e4m3 V is read keys innermost: given so (dense, padded), or re-laid by the plan (packed; dense
    # and padded V given with d innermost): vt_pack
    relaid = _relaid_v(node, ctx)
    v_transposed = node.fp8 and node.form != "packed" and not relaid
    for name in (node.q, node.k, node.o) if v_transposed else (node.q, node.k, node.v, node.o):
        check_row_layout(ctx.tensor(name), letters, layouts, ctx)
    for name in (node.q, node.k) if v_transposed else (node.q, node.k, node.v):
        check_tma_strides(ctx.tensor(name), letters, tuple(range(len(letters) - 1)), ctx)
    if v_transposed:
        _check_keys_innermost(ctx.tensor(node.v), ctx)
    for role in DESCALE_ROLES:
        t = ctx.tensor(name) if (name := getattr(node, role)) is not None else None
        if t is not None and t.dims[0] > 1 and t.strides[0] != 1:
            ctx.problem(f"{t.path}.strides[0]", f"stride {t.strides[0]}: {role} must be contiguous (stride 1)")
    for name in (node.q_lengths, node.kv_lengths):
        if name is not None:
            t = ctx.tensor(name)
            if t.dims[0] > 1 and t.strides[0] != 1:
                ctx.problem(
                    f"{t.path}.strides[0]", f"stride {t.strides[0]}: length tensors must be contiguous (stride 1)"
                )
    what = "row" if node.form == "dense" else "capacity"
    for value, label, t, i in (
        (node.seq_q, "query length", q, len(q.dims) - 2),
        (node.seq_kv, "key length", ctx.tensor(node.k), len(q.dims) - 2),
    ):
        if node.form != "packed" and value > INT32_MAX:
            ctx.problem(
                f"{t.path}.dims[{i}]", f"{label} {what} {value} does not fit the kernel's int32; at most {INT32_MAX}"
            )
    if node.form == "packed":
        for t in (q, ctx.tensor(node.k)):
            if t.dims[0] > INT32_MAX:
                ctx.problem(
                    f"{t.path}.dims[0]", f"{t.dims[0]} tokens do not fit the kernel's int32; at most {INT32_MAX}"
                )
        if node.fp8 and packed_pitch(node.tokens_kv, node.batch) > INT32_MAX:
            k = ctx.tensor(node.k)
            ctx.problem(
                f"{k.path}.dims[0]",
                f"{node.tokens_kv} tokens of {node.batch} sequences, re-laid from 16-key boundaries, do not fit the "
                f"kernel's int32 key index; at most {INT32_MAX - 16 * node.batch - 16} tokens",
            )
    if node.form == "padded":
        _check_padded_rows(node, ctx)
    if relaid:
        _check_relaid(node, ctx)
    if node.head_dim in HEAD_DIMS:
        tiles = _variant(node, ctx).tile_shape
        count = _tile_capacity(node, tiles.block_m)
        if count > MAX_GRID[0]:  # the attention launch's grid x
            ctx.problem(
                f"{q.path}.dims",
                f"{count} tiles of {tiles.block_m} query rows per head: a launch holds at most {MAX_GRID[0]}; "
                "split the work into several plans",
            )


def _check_relaid(node: Sdpa, ctx: ResolveContext) -> None:
    """Re-laid Vᵀ: one CTA row of the transpose per sequence (grid z), and a padded form's key
    coordinates (sequence b from b · hkv · d · pitch) within int32."""
    v = ctx.tensor(node.v)
    if node.batch > MAX_GRID[2]:
        ctx.problem(f"{v.path}.dims[0]", f"batch {node.batch}: re-laying V takes one launch row per sequence, at most "
                    f"{MAX_GRID[2]}; give V keys innermost (\"bhds\") or split the batch")  # fmt: skip
    rows = _relaid_strides(node)[0]
    if node.form == "padded" and (node.batch - 1) * rows + node.seq_kv > INT32_MAX:
        ctx.problem(f"{v.path}.dims", f"{node.batch} sequences of V re-laid as Vᵀ ({rows} keys each) do not fit int32 "
                    'key coordinates; give V keys innermost ("bhds") or split the batch')  # fmt: skip


def _check_keys_innermost(v, ctx: ResolveContext) -> None:
    """e4m3 V (b, h, s, d) given as Vᵀ is read as it is, its keys innermost: s stride 1, and its
    b, h and d strides whole 16-byte pieces under TMA's stride limit (so every sequence of a
    padded V starts on a 16-byte boundary, as TMA's innermost coordinate must). (V with d
    innermost is re-laid by the plan: `_relaid_v`.)"""
    if v.dims[2] > 1 and v.strides[2] != 1:
        ctx.problem(
            f"{v.path}.strides[2]",
            f"e4m3 V is read with its keys innermost (8-bit WGMMA operands are K-major): give V either with d "
            f'innermost (d stride 1, as q and k: the plan re-lays it) or with its s stride 1 (layout "bhds"); '
            f"found strides {list(v.strides)}",
        )
    check_whole_pieces(v, "bhsd", (0, 1, 3), "(16 bytes: TMA's rule for the strides of a tensor map)", ctx)
    check_tma_strides(v, "bhsd", (0, 1, 3), ctx)


def _letters(form: str) -> str:
    """The logical dims of q, k, v and o in the node's form."""
    return "thd" if form == "packed" else "bhsd"


def _check_padded_rows(node: Sdpa, ctx: ResolveContext) -> None:
    """Padded sequences are loaded as ragged rows: sequence b starts at row b * (batch stride /
    row stride), which must be a whole row, and every row index must fit int32."""
    for name in (node.q, node.k, node.v):
        t = ctx.tensor(name)
        sb, ss = t.strides[0], t.strides[2]
        if t.dims[0] > 1 and (ss == 0 or sb % ss):
            ctx.problem(
                f"{t.path}.strides[0]",
                f"batch stride {sb} is not a multiple of the sequence stride {ss}; padded variable-length "
                'tensors need whole rows between sequences: use a layout with b outside s, such as "bshd" or "bhsd"',
            )
        elif ss and (t.dims[0] - 1) * (sb // ss) + t.dims[2] > INT32_MAX:
            ctx.problem(f"{t.path}.dims", f"{t.dims[0]} sequences of {t.dims[2]} rows do not fit int32 row indices")


def _attention_launch(node: Sdpa, variant: SdpaFwdVariant, ctx: ResolveContext, workspace) -> ResolvedLaunch:
    slots = {role: ctx.slot(name) for role, name in (node.inputs + node.outputs)}
    varlen = node.form != "dense"
    strides = {role: _bhs_strides(slots.get(role), node.form) for role in ("q", "k", "v", "o", "lse")}
    relaid = "v_relaid" in workspace  # V's map addresses the re-laid Vᵀ in the workspace, not V's slot
    if relaid:
        strides["v"] = _relaid_strides(node)
    rows_per_batch = {
        role: strides[role][0] // strides[role][2] if node.form == "padded" else 0 for role in ("q", "k", "v")
    }
    mask = node.mask
    if mask.softcap is not None:  # s -> softcap * tanh(s / softcap): tanh(raw * scale / cap), then * cap
        softmax = SoftmaxScales(scale_log2=mask.softcap * LOG2_E, score_scale=node.attn_scale / mask.softcap)
    else:
        softmax = SoftmaxScales(scale_log2=node.attn_scale * LOG2_E, score_scale=0.0)
    shape = ForwardShape(
        batch=node.batch, heads_q=node.heads_q, seq_q=node.seq_q, seq_kv=node.seq_kv,
        group=node.heads_q // node.heads_kv, window_left=mask.window_left or 0, window_right=mask.window_right or 0,
        q_rows=rows_per_batch["q"], k_rows=rows_per_batch["k"], v_rows=rows_per_batch["v"],
    )  # fmt: skip
    q_extents = node.heads_q if varlen else (node.seq_q, node.heads_q, node.batch)
    kv_extents = node.heads_kv if varlen else (node.seq_kv, node.heads_kv, node.batch)
    tma = {role: _tma_strides(slots[role], strides[role]) for role in ("q", "k", "v")}
    v_base = Workspace(workspace["v_relaid"]) if relaid else slots["v"]
    if relaid:  # (b, h, d) strides of Vᵀ (b, h, d, pitch)
        tma["v"] = (*tma["v"][:2], tma_stride(node.head_dim, relaid_pitch(node.seq_kv), "e4m3"))
    elif variant.v_repacked:  # the re-laid Vᵀ (h, d, pitch) in the workspace: (b, h, d) strides
        pitch = packed_pitch(node.tokens_kv, node.batch)
        tma["v"] = (0, node.head_dim * pitch, pitch)
    elif variant.fp8:  # V's keys are innermost: its tensor map steps over (b, h, d)
        v = slots["v"]
        tma["v"] = (*tma["v"][:2], tma_stride(v.dims[-1], v.strides[-1], v.dtype))
    descales = v_maps = None
    if node.fp8:  # per tensor (stride 0) or per head (1); each sequence's Vᵀ map (variable lengths)
        q_descale, k_descale, v_descale = (slots[role] for role in DESCALE_ROLES)
        strides_of = (1 if s.dims[0] > 1 else 0 for s in (q_descale, k_descale, v_descale))
        descales = Descales(q_descale, k_descale, v_descale, *strides_of)
        v_maps = Workspace(workspace["v_maps"]) if "v_maps" in workspace else None
    b_stride = {role: 0 if node.form == "packed" else strides[role][0] for role in ("o", "lse")}
    args = SdpaForwardArgs(
        q=TmaSource(slots["q"], tma["q"], q_extents),
        k=TmaSource(slots["k"], tma["k"], kv_extents),
        v=TmaSource(v_base, tma["v"], kv_extents),
        outputs=Outputs(slots["o"], slots.get("lse")),
        workspace=TileWorkspace(
            *(_region(workspace, name) for name in ("sequences", "tiles", "tile_count", "tile_counter"))
        ),
        shape=shape,
        o_strides=BhsStrides(b_stride["o"], *strides["o"][1:]),
        lse_strides=BhsStrides(b_stride["lse"], *strides["lse"][1:]),
        softmax=softmax,
        descales=descales,
        v_maps=v_maps,
    )
    grid = (_tile_capacity(node, variant.tile_shape.block_m), 1, 1)
    return launch(node.name, variant, grid, args)


def _region(workspace: dict[str, int], name: str) -> Workspace | None:
    """A workspace region the op carved for `name`, or None (a null pointer) where it has none."""
    return Workspace(workspace[name]) if name in workspace else None


def _schedule_launch(
    node: Sdpa, attention_variant: SdpaFwdVariant, units: int, workspace: dict[str, int], attention: ResolvedLaunch,
    ctx: ResolveContext,
) -> ResolvedLaunch:  # fmt: skip
    """The scheduling kernel's launch; an e4m3 node's also writes the sequences' Vᵀ maps, from
    the attention launch's V map (its record: the same host code, so the same bytes)."""
    tiles = attention_variant.tile_shape
    variant = ScheduleVariant(
        packed=node.form == "packed",
        q_lengths=node.q_lengths is not None,
        kv_lengths=node.kv_lengths is not None,
        mask=MaskFlags(node.mask.flags.right, node.mask.flags.left, node.mask.flags.bottom_right),
        block_m=tiles.block_m,
        block_n=tiles.block_n,
        v_maps_of=attention_variant if node.fp8 else None,
    )
    packed = node.form == "packed"
    maps = None
    if node.fp8:
        record = attention.record
        maps = VMaps(
            v=record.v, v_maps=Workspace(workspace["v_maps"]), v_rows=record.shape.v_rows,
            v_packed=_region(workspace, "v_packed"), attention=record,
        )  # fmt: skip
    lengths = (ctx.slot(name) if name is not None else None for name in (node.q_lengths, node.kv_lengths))
    args = ScheduleArgs(
        *lengths, Workspace(workspace["sequences"]), Workspace(workspace["tiles"]), Workspace(workspace["tile_count"]),
        batch=node.batch,
        q_capacity=node.tokens_q if packed else node.seq_q,
        kv_capacity=node.tokens_kv if packed else node.seq_kv,
        max_seqlen_q=node.seq_q,
        max_seqlen_kv=node.seq_kv,
        unit_capacity=units,
        heads_q=node.heads_q,
        window_left=node.mask.window_left or 0,
        window_right=node.mask.window_right or 0,
        maps=maps,
    )  # fmt: skip
    return launch(node.name, variant, (1, 1, 1), args)


def _pack_launch(node: Sdpa, workspace: dict[str, int], ctx: ResolveContext) -> ResolvedLaunch:
    """e4m3 packed: V (t, h, d) transposed into the workspace, sequence b's keys from a 16-key
    boundary (after the scheduling kernel, whose table it reads)."""
    variant = VtPackVariant(node.head_dim, p_order=_v_in_p_order(node, ctx))
    v = ctx.slot(node.v)
    pitch = packed_pitch(node.tokens_kv, node.batch)
    packed = PackedV(node.batch, node.tokens_kv, stride_t=v.strides[0], stride_h=v.strides[1])
    regions = (Workspace(workspace["sequences"]), Workspace(workspace["v_packed"]))
    args = VtPackArgs(v, *regions, packed=packed, batched=None, pitch=pitch)
    return launch(node.name, variant, variant.grid(pitch, node.heads_kv), args)


def _bhs_strides(slot, form: str) -> tuple[int, int, int]:
    """(b, h, s) element strides of q, k, v, o or lse; packed tensors have no b (0); an absent
    tensor has zeros."""
    if slot is None:
        return (0, 0, 0)
    if form == "packed":  # (t, h, d) or (t, h)
        return (0, slot.strides[1], slot.strides[0])
    return (slot.strides[0], slot.strides[1], slot.strides[2])


def _tma_strides(slot, strides: tuple[int, int, int]) -> tuple[int, int, int]:
    """(b, h, s) strides TMA accepts; a packed tensor's absent b has extent 0 (never stepped)."""
    extents = (0, slot.dims[1], slot.dims[0]) if len(slot.dims) == 3 else slot.dims[:3]
    return tuple(tma_stride(extent, st, slot.dtype) for extent, st in zip(extents, strides))
