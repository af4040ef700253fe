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

Attention sinks (gpt-oss): `sinks`, float32 (hq,), one logit per query head that joins every
row's softmax denominator as a key with no value: O = Σ exp(s_j) v_j / (Σ exp(s_j) + exp(sink)),
the LSE includes it (a row that sees no key has O = 0 and LSE = sink). Every form takes them
with bf16 or fp16 q, k and v, and over a 16-bit cache (not e4m3 yet).

Variable lengths stay on the device: the plan fixes capacities (batch, tokens or rows,
max_seqlen_*), a scheduling kernel of the same plan turns the lengths into a tile list in the
caller's workspace, and the attention kernel walks it. Masks: causal (diagonal aligned top-left
or bottom-right), a sliding window (window_left, window_right) around the same diagonal, and
a logit softcap.
"""

from __future__ import annotations

import math

from frost_runtime.dtypes import ATTENTION, SCALE_DTYPE, is_quantized
from frost_runtime.schema import F32_MAX

from frostc.contexts import CheckedTensor, NodeContext, ResolveContext
from frostc.kernels.sdpa_common import LOG2_E
from frostc.kernels.sdpa_fwd_wgmma import HEAD_DIM_PAIRS, O_FLOAT32_HEAD_DIMS
from frostc.ops import sdpa_forward, sdpa_paged
from frostc.ops.paged_cache import (
    SCALE_ROLES,
    cache_dtype_problem,
    check_cache_scales,
    new_tokens_problem,
    page_size_problem,
)
from frostc.ops.rows import INT32_MAX
from frostc.ops.sdpa_node import CACHE_FORMS, DESCALE_ROLES, PACKED_KEYS, PADDED_KEYS, Mask, Sdpa
from frostc.resolved import ResolvedLaunch

KEYS = (
    "q", "k", "v", "o", "lse",
    "cu_seqlens_q", "cu_seqlens_kv", "seq_len_q", "seq_len_kv", "max_seqlen_q", "max_seqlen_kv",
    "attn_scale", "causal", "diagonal_alignment", "window_left", "window_right", "softcap", "inference",
    "page_table", "k_scale", "v_scale", "q_descale", "k_descale", "v_descale", "o_accumulation",
    "debug_tile_visits", "sinks",
)  # fmt: skip

ALIGNMENTS = ("top_left", "bottom_right")
DATA_DTYPES = ATTENTION  # q, k, v and o (frost_runtime.dtypes)
LSE_DTYPE = "fp32"
SINKS_DTYPE = "fp32"  # one logit per query head
LENGTH_DTYPE = "int32"
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
    "sinks": ("hq",),
    "seq_len_q": ("b",),
    "seq_len_kv": ("b",),
}
_PACKED_DIMS = {
    "q": ("tq", "hq", "d"),
    "k": ("tkv", "hkv", "d"),
    "v": ("tkv", "hkv", "dv"),
    "o": ("tq", "hq", "dv"),
    "lse": ("tq", "hq"),
    "sinks": ("hq",),
    "cu_seqlens_q": ("b + 1",),
    "cu_seqlens_kv": ("b + 1",),
}
# the mixed form: any mix of prefill chunks and decodes over a paged cache, queries packed
_MIXED_DIMS = {
    "q": ("tq", "hq", "d"),
    "k": ("pages", "page_size", "hkv", "d"),
    "v": ("pages", "page_size", "hkv", "dv"),
    "o": ("tq", "hq", "dv"),
    "lse": ("tq", "hq"),
    "page_table": ("b", "max_pages"),
    "seq_len_kv": ("b",),
    "cu_seqlens_q": ("b + 1",),
    "sinks": ("hq",),
}
_PAGED_DIMS = {
    "q": ("b", "hq", "sq", "d"),
    "k": ("pages", "page_size", "hkv", "d"),
    "v": ("pages", "page_size", "hkv", "dv"),
    "o": ("b", "hq", "sq", "dv"),
    "lse": ("b", "hq", "sq"),
    "page_table": ("b", "max_pages"),
    "seq_len_kv": ("b",),
    "sinks": ("hq",),
}
_DIM_WORDS = {
    "b": "batch", "hq": "heads", "sq": "sequence length", "d": "head dim", "hkv": "kv heads",
    "skv": "kv sequence length", "dv": "head dim", "tq": "tokens", "tkv": "kv tokens", "b + 1": "batch + 1",
    "pages": "pages", "page_size": "page size", "max_pages": "pages per sequence",
}  # fmt: skip
_LETTERS = {"b": "b", "hq": "h", "hkv": "h", "sq": "s", "skv": "s", "d": "d", "dv": "d", "tq": "t", "tkv": "t"}
_LETTERS |= {"b + 1": "b", "pages": "p", "page_size": "s", "max_pages": "p"}
_DIMS_OF_FORM = {
    "dense": _DENSE_DIMS, "padded": _DENSE_DIMS, "packed": _PACKED_DIMS, "paged": _PAGED_DIMS, "mixed": _MIXED_DIMS,
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Checks of a node


def validate(ctx: NodeContext) -> Sdpa | None:
    before = len(ctx.problems)
    form = _check_form(ctx)
    dims_of = _DIMS_OF_FORM[form]
    over_cache = form in CACHE_FORMS
    roles = list(dims_of) if over_cache else ["q", "k", "v", "o", "lse", "sinks"]
    roles += {"packed": list(PACKED_KEYS), "paged": [], "mixed": []}.get(form, list(PADDED_KEYS))
    tensors: dict[str, CheckedTensor] = {}
    for role in roles:
        names = dims_of[role]
        c = ctx.tensor(
            role,
            letters="".join(_LETTERS[n] for n in names),
            dims=f"({', '.join(names)})" if len(names) > 1 else f"({names[0]},)",
            output=role in ("o", "lse"),
            # a missing cu_seqlens_* is _check_form's to report, a paged node's lengths are not
            required=role in ("q", "k", "v", "o") or (over_cache and role not in ("lse", "sinks")),
        )
        if c is not None:
            tensors[role] = c
    k = tensors.get("k")
    if over_cache and ctx.given("sinks") and k is not None and k.dtype is not None and is_quantized(k.dtype):
        ctx.problem(
            "sinks",
            f"attention sinks over an {k.dtype} cache are not built yet (a 16-bit cache takes them): remove sinks, "
            "or keep the cache in the model's dtype",
        )
    sizes = _check_shapes(tensors, dims_of, ctx)
    if form == "mixed":
        sizes = _check_sequence_counts(tensors, sizes, ctx)
    fp8 = _check_dtypes(tensors, ctx, form)
    if fp8 and ctx.given("sinks"):
        ctx.problem(
            "sinks",
            "attention sinks with e4m3 q, k and v are not built yet (the bf16 and fp16 kernels take them): "
            "remove sinks, or give q, k and v in bf16 or fp16",
        )
    _check_descales(ctx, fp8, sizes, form)
    if over_cache:
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
            f"{'(tq, hq)' if form in ('packed', 'mixed') else '(b, hq, sq)'} for the softmax statistics"
        )
        ctx.problem("lse", message)
    capacities = _check_capacities(ctx, form, sizes)
    if len(ctx.problems) > before or ctx.name is None or sizes is None or mask is None or capacities is None:
        return None
    seq_q, seq_kv, tokens_q, tokens_kv = capacities
    return Sdpa(
        name=ctx.name,
        path=ctx.path,
        q=ctx.value("q"),
        k=ctx.value("k"),
        v=ctx.value("v"),
        o=ctx.value("o"),
        lse=ctx.value("lse"),
        form=form,
        q_lengths=ctx.value("cu_seqlens_q" if form in ("packed", "mixed") else "seq_len_q"),
        kv_lengths=ctx.value("cu_seqlens_kv" if form == "packed" else "seq_len_kv"),
        batch=sizes["b"] if "b" in sizes else sizes["b + 1"] - 1,
        heads_q=sizes["hq"],
        heads_kv=sizes["hkv"],
        head_dim=sizes["d"],
        head_dim_v=sizes.get("dv", sizes["d"]),
        seq_q=seq_q,
        seq_kv=seq_kv,
        tokens_q=tokens_q,
        tokens_kv=tokens_kv,
        attn_scale=scale if scale is not None else 1.0 / math.sqrt(sizes["d"]),
        mask=mask,
        inference=inference is not False,
        page_table=ctx.value("page_table") if over_cache else None,
        page_size=sizes["page_size"] if over_cache else 0,
        pages=sizes["pages"] if over_cache else 0,
        k_scale=ctx.value("k_scale") if over_cache else None,
        v_scale=ctx.value("v_scale") if over_cache else None,
        q_descale=ctx.value("q_descale") if fp8 else None,
        k_descale=ctx.value("k_descale") if fp8 else None,
        v_descale=ctx.value("v_descale") if fp8 else None,
        o_accumulation=o_accumulation or "tensor_cores",
        debug_tile_visits=bool(debug_tile_visits),
        sinks=ctx.value("sinks"),
    )


def _check_form(ctx: NodeContext) -> str:
    packed = [k for k in PACKED_KEYS if ctx.given(k)]
    padded = [k for k in PADDED_KEYS if ctx.given(k)]
    if ctx.given("page_table") and ctx.given("cu_seqlens_q"):
        for key in ("cu_seqlens_kv", "seq_len_q", "max_seqlen_kv"):
            if ctx.given(key):
                ctx.problem(
                    key,
                    "a mixed node (page_table with cu_seqlens_q) takes each sequence's queries from cu_seqlens_q "
                    f"and its keys from the cache, seq_len_kv of them (this step's included): remove {key}",
                )
        return "mixed"
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


def _check_sequence_counts(
    tensors: dict[str, CheckedTensor], sizes: dict[str, int] | None, ctx: NodeContext
) -> dict[str, int] | None:
    """A mixed node's sequences: cu_seqlens_q's prefix sums one more than the page table's rows."""
    if sizes is None or "b" not in sizes or "b + 1" not in sizes or sizes["b + 1"] == sizes["b"] + 1:
        return sizes
    cu = tensors["cu_seqlens_q"]
    ctx.problems_at(
        cu.at("dims[0]"),
        f"{sizes['b + 1']} prefix sums for the page table's {sizes['b']} sequences: cu_seqlens_q holds one more "
        f"than the sequences ({sizes['b'] + 1})",
    )
    return None


def _check_shapes(tensors: dict[str, CheckedTensor], dims_of: dict, ctx: NodeContext) -> dict[str, int] | None:
    """Each named dim's size, from the first role that has it; a problem for each mismatch."""
    sizes: dict[str, int] = {}
    owner: dict[str, str] = {}
    ok = True
    for role in dims_of:
        c = tensors.get(role)
        if c is None or c.dims is None:
            ok = ok and role in ("lse", "sinks", *PADDED_KEYS)  # optional roles may be absent
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

    if "d" in sizes and "dv" in sizes and sizes["d"] != sizes["dv"] and (sizes["d"], sizes["dv"]) not in HEAD_DIM_PAIRS:
        pairs = ", ".join(map(str, HEAD_DIM_PAIRS))
        message = (
            f"{owner['dv']} head dim {sizes['dv']} with q/k head dim {sizes['d']} is not supported; "
            f"supported pairs (q/k, v): {pairs}, or one head dim for q, k, v and o"
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
    fp8 = form not in CACHE_FORMS and q is not None and is_quantized(q.dtype)
    if fp8:
        _check_fp8_dtypes(tensors, ctx)
    q_dtype = q.dtype if q is not None and q.dtype in DATA_DTYPES else None
    for role, c in tensors.items():
        if c.dtype is None or (fp8 and role in ("q", "k", "v", "o")):
            continue
        if form in CACHE_FORMS and role in ("k", "v"):
            if message := cache_dtype_problem(f"the paged form's {role} (a cache)", c.dtype, q_dtype, "q"):
                ctx.problems_at(c.at("dtype"), message)
        elif role in ("k", "v") and is_quantized(c.dtype) and q_dtype is not None and form not in CACHE_FORMS:
            message = (
                f"{c.dtype} {role} with {q_dtype} q: the FP8 kernel takes e4m3 q, k and v (with q_descale, "
                f"k_descale, v_descale); quantize q too, or give {role} as {q_dtype}"
            )
            ctx.problems_at(c.at("dtype"), message)
        elif role in ("q", "k", "v", "o"):
            if c.dtype not in DATA_DTYPES:
                message = f'sdpa {role} must be {" or ".join(DATA_DTYPES)}, got "{c.dtype}"'
                if is_quantized(c.dtype) and role == "o":
                    message += "; an FP8 node's o is bf16 or fp16"
                elif is_quantized(c.dtype) and role == "q":
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
        elif role == "sinks" and c.dtype != SINKS_DTYPE:
            ctx.problems_at(c.at("dtype"), f'sinks are logits, one per query head: {SINKS_DTYPE}, got "{c.dtype}"')
        elif role == "page_table" and c.dtype != LENGTH_DTYPE:
            ctx.problems_at(c.at("dtype"), f'page_table holds page ids: it must be {LENGTH_DTYPE}, got "{c.dtype}"')
        elif role not in ("q", "k", "v", "o", "lse", "sinks", "page_table") and c.dtype != LENGTH_DTYPE:
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
        if not fp8 or form in CACHE_FORMS:
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
    if form in CACHE_FORMS:
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
    if not fp8 or form in CACHE_FORMS:
        kind = f"a {form} node" if form in CACHE_FORMS else "16-bit q, k and v (their O sums in float32)"
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
    if form == "mixed":
        longest = ctx.int("max_seqlen_q", 1, "the most query tokens one sequence has in a step")
        if sizes is None or not {"b", "tq", "max_pages", "page_size"} <= sizes.keys():
            return None
        if longest is not None and longest > sizes["tq"]:
            ctx.problem("max_seqlen_q", f"{longest} is more than the {sizes['tq']} tokens q holds; at most that")
            return None
        seq_kv = sizes["max_pages"] * sizes["page_size"]
        return longest or sizes["tq"], seq_kv, sizes["tq"], sizes["b"] * seq_kv
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
# Resolution: by form


def resolve(node: Sdpa, ctx: ResolveContext) -> tuple[ResolvedLaunch, ...]:
    if node.form in CACHE_FORMS:
        return sdpa_paged.resolve(node, ctx)
    return sdpa_forward.resolve(node, ctx)
