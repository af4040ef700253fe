"""What the ops over a paged KV cache agree on (kv_append writes it, sdpa's paged form reads
it): the page sizes and the new tokens per step their kernels take, and how anything else is
refused. A cache is (pages, page_size, hkv, d); a page table (b, max_pages) lists each
sequence's pages in order; position p of sequence b is row p % page_size of page
page_table[b, p // page_size].

A quantized cache (e4m3) holds x / scale: the node names its scales, k_scale and v_scale,
float32 device tensors of one scale per kv head (hkv,) or one for all (1,). The caller owns
them (calibrated, or amax / 448 of a prefill); the plan reads them at every launch.
"""

from __future__ import annotations

from frost_runtime.dtypes import ATTENTION, KV_CACHE, SCALE_DTYPE, is_quantized

from frostc.contexts import CheckedTensor, NodeContext
from frostc.kernels.cache_args import CacheScales, CacheScaleStrides
from frostc.ops.rows import tma_stride

PAGE_SIZE_STEP = 16  # page sizes are multiples of this: a TMA box of the cache never spans pages
MAX_PAGE_SIZE = 256
MAX_NEW_TOKENS = 16  # new tokens per sequence and step: decode, speculative decoding, short chunks


def scale_args(k_scale, v_scale) -> tuple[CacheScales, CacheScaleStrides]:
    """A quantized cache's scale slots as its kernels take them: the pointers, and each one's head
    stride (0 where one scale serves every KV head)."""
    strides = (s.strides[0] if s.dims[0] > 1 else 0 for s in (k_scale, v_scale))
    return CacheScales(k_scale, v_scale), CacheScaleStrides(*strides)


def cache_tma_strides(cache) -> tuple[int, int, int]:
    """A cache slot's (page, row, head) strides as its tensor map takes them."""
    return tuple(tma_stride(extent, stride, cache.dtype) for extent, stride in zip(cache.dims[:3], cache.strides[:3]))


def rows_per_page(cache, pages: int, page_size: int) -> int:
    """The cache's rows from one page to the next, as its ragged tensor maps count rows (the page
    stride is a whole number of rows: sdpa_paged checks it)."""
    if pages <= 1:
        return page_size
    return cache.strides[0] // tma_stride(cache.dims[1], cache.strides[1], cache.dtype)


def page_size_problem(page_size: int) -> str | None:
    if page_size % PAGE_SIZE_STEP == 0 and page_size <= MAX_PAGE_SIZE:
        return None
    return (
        f"page size {page_size} is not supported: pages hold a multiple of {PAGE_SIZE_STEP} tokens, at most "
        f"{MAX_PAGE_SIZE} (16, 32, 64, 128 and 256 are the usual sizes)"
    )


def new_tokens_problem(new_tokens: int) -> str | None:
    if 1 <= new_tokens <= MAX_NEW_TOKENS:
        return None
    return (
        f"{new_tokens} new tokens per sequence; a paged cache takes 1 (decode) to {MAX_NEW_TOKENS} per step "
        f"(speculative decoding, chunked prefill): split longer chunks into steps of at most {MAX_NEW_TOKENS}"
    )


SCALE_ROLES = ("k_scale", "v_scale")
SCALE_EXAMPLE = "amax(|x|) / 448 per kv head"


def cache_dtype_problem(role: str, dtype: str, data_dtype: str | None, data_role: str) -> str | None:
    """A cache holds the data's dtype (bf16 or fp16) or a quantized one (e4m3) with scales."""
    if dtype not in KV_CACHE:
        return f'{role} must be {" or ".join(KV_CACHE)}, got "{dtype}"; write dtype = "{data_dtype or ATTENTION[0]}"'
    if data_dtype is not None and not is_quantized(dtype) and dtype != data_dtype:
        return (
            f"{dtype} does not match {data_role}'s {data_dtype}; the caches hold {data_role}'s dtype, or e4m3 with "
            f'scales (k_scale, v_scale): write dtype = "{data_dtype}" or "e4m3"'
        )
    return None


def check_cache_scales(
    ctx: NodeContext, caches: tuple[CheckedTensor | None, CheckedTensor | None], heads_kv: int | None
) -> bool:
    """The K and V caches share one dtype; a quantized one needs k_scale and v_scale (float32,
    (hkv,) or (1,)), any other refuses them. Records the scales' uses; False on a problem."""
    k_cache, v_cache = caches
    before = len(ctx.problems)
    dtypes = [c.dtype for c in caches if c is not None and c.dtype in KV_CACHE]
    scaled = any(is_quantized(d) for d in dtypes)
    # two unquantized caches are each held to the data's dtype (cache_dtype_problem)
    if scaled and len(dtypes) == 2 and dtypes[0] != dtypes[1]:
        ctx.problems_at(
            v_cache.at("dtype"),
            f'the V cache is {dtypes[1]}, the K cache {dtypes[0]}: give both caches one dtype, dtype = "{dtypes[0]}"',
        )
    for role in SCALE_ROLES:
        if not scaled:
            if ctx.given(role):
                ctx.tensor(role, letters="h", dims="(hkv,)")  # a use: the tensor is not reported as unused
                what = dtypes[0] if dtypes else "not quantized"
                ctx.problem(role, f"scales a quantized (e4m3) cache, and the caches are {what}: remove {role}")
            continue
        if not ctx.given(role):
            ctx.problem(
                role,
                f"missing: an e4m3 cache holds x / scale, so the node needs its scales; name a {SCALE_DTYPE} tensor "
                f'(hkv,) or (1,) ({SCALE_EXAMPLE}), e.g. {role} = "{role}"',
            )
            continue
        c = ctx.tensor(role, letters="h", dims="(hkv,)")
        if c is None:
            continue
        if c.dtype is not None and c.dtype != SCALE_DTYPE:
            ctx.problems_at(c.at("dtype"), f'{role} holds scale factors: it must be {SCALE_DTYPE}, got "{c.dtype}"')
        if c.dims is not None and heads_kv is not None and c.dims[0] not in (1, heads_kv):
            ctx.problems_at(
                c.at("dims[0]"),
                f"{role} holds one scale per kv head ({heads_kv}) or one for every head (1), got {c.dims[0]}; "
                f"write dims = [{heads_kv}]",
            )
    return len(ctx.problems) == before
