"""The mixed form's test matrix, as plain data (the GPU side imports this without frostc).

Each case is one plan: sdpa over a paged cache with packed queries (`cu_seqlens_q`), any mix of
prefill chunks and decodes in one step. Every factor appears at least once: bf16 and fp16; head
dims 64, 96, 128 and 256; page sizes 16, 64 and 256; GQA groups 1, 4 and 8; causal (bottom-right per
sequence) and not; a sliding window and softcap; LSE as (tokens, hq) and as FlashAttention's (hq,
tokens); an e4m3 cache with scales per KV head and per tensor (its few-rows kernel too); a
decode-sized bucket (few queries a sequence, long contexts: split across CTAs, with the combine)
and a prefill-sized one (chunks of up to hundreds of tokens); the caches as engines hold them, by
strides, no copy (`CACHE_LAYOUTS`); and steps whose plan appends the new K/V first (kv_append's
packed form, the attention starting early behind it).
"""

from dataclasses import dataclass

SPARE_PAGES = 5  # pool pages no table lists: always NaN

# How the K and V caches lie in memory, each viewed as (pages, page_size, hkv, d) by strides:
CACHE_LAYOUTS = (
    "own",  # two buffers of their own, contiguous
    "vllm_nhd",  # vLLM's NHD: the two halves of the last dim of one (pages, page_size, hkv, 2d) buffer
    "vllm_hnd",  # vLLM's HND: ... of one (pages, hkv, page_size, 2d) buffer
    # transformers' continuous batching (5.23): one pool of blocks, each the K page then the V page
    # of every layer of a group, (blocks, layers, 2, page_size, hkv, d); here layer 1 of 2's
    "hf",
)
HF_LAYERS, HF_LAYER = 2, 1


@dataclass(frozen=True)
class MixedCase:
    dtype: str
    batch: int  # the plan's sequences (mixes leave some empty)
    tokens: int  # q's and o's rows: the step's query tokens at most
    max_seqlen_q: int  # the most query tokens one sequence has
    heads_q: int
    heads_kv: int
    head_dim: int
    page_size: int
    max_pages: int  # pages per sequence: capacity = max_pages * page_size keys
    causal: bool
    lse: str = ""  # "" none, "th" (tokens, hq), "ht" stored (hq, tokens)
    window_left: int | None = None
    softcap: float | None = None
    cache: str | None = None  # "e4m3" (with k_scale, v_scale); None: `dtype`
    scales: str = "head"  # e4m3: one scale per KV head ("head") or one ("tensor")
    cache_layout: str = "own"  # one of CACHE_LAYOUTS
    append: bool = False  # the plan appends the step's K/V (k_new, v_new packed like q) first
    sinks: bool = False  # a float32 sink logit per query head (gpt-oss); 16-bit caches

    @property
    def pages(self) -> int:
        return self.batch * self.max_pages + SPARE_PAGES

    @property
    def capacity(self) -> int:
        return self.max_pages * self.page_size

    @property
    def id(self) -> str:
        return (
            f"mixed-{self.dtype}-d{self.head_dim}-p{self.page_size}x{self.max_pages}-b{self.batch}"
            f"-t{self.tokens}x{self.max_seqlen_q}-h{self.heads_q}x{self.heads_kv}-{'causal' if self.causal else 'full'}"
            f"{f'-lse_{self.lse}' if self.lse else ''}"
            f"{'' if self.window_left is None else f'-w{self.window_left}'}"
            f"{'' if self.softcap is None else f'-cap{self.softcap:g}'}"
            f"{'' if self.cache is None else f'-kv{self.cache}-{self.scales}'}"
            f"{'' if self.cache_layout == 'own' else f'-{self.cache_layout}'}{'-append' if self.append else ''}"
            f"{'-sinks' if self.sinks else ''}"
        )

    def cache_views(self) -> dict[str, tuple[str, int, tuple[int, int, int, int]]]:
        """{cache: (its buffer, element offset in it, strides of its (pages, page_size, hkv, d) view)}."""
        return cache_views(self.cache_layout, self.pages, self.page_size, self.heads_kv, self.head_dim)

    def buffer_elements(self) -> dict[str, int]:
        """{buffer: elements}: the memory the cache views lie in."""
        return cache_buffers(self.cache_layout, self.pages, self.page_size, self.heads_kv, self.head_dim)


def cache_views(layout: str, pages: int, page: int, hkv: int, d: int) -> dict:
    if layout == "own":
        strides = (page * hkv * d, hkv * d, d, 1)
        return {"k_cache": ("k_cache", 0, strides), "v_cache": ("v_cache", 0, strides)}
    strides, v_at = {
        "vllm_nhd": ((page * hkv * 2 * d, hkv * 2 * d, 2 * d, 1), d),
        "vllm_hnd": ((hkv * page * 2 * d, 2 * d, page * 2 * d, 1), d),
    }.get(layout, (None, 0))
    if layout == "hf":  # page stride: a block of every layer's K and V pages; V a page after K
        page_elements = page * hkv * d
        strides, k_at = (2 * HF_LAYERS * page_elements, hkv * d, d, 1), 2 * HF_LAYER * page_elements
        return {"k_cache": ("kv_cache", k_at, strides), "v_cache": ("kv_cache", k_at + page_elements, strides)}
    return {"k_cache": ("kv_cache", 0, strides), "v_cache": ("kv_cache", v_at, strides)}


def cache_buffers(layout: str, pages: int, page: int, hkv: int, d: int) -> dict[str, int]:
    n = pages * page * hkv * d
    if layout == "hf":
        return {"kv_cache": HF_LAYERS * 2 * n}
    return {"k_cache": n, "v_cache": n} if layout == "own" else {"kv_cache": 2 * n}


def cases() -> list[MixedCase]:
    c = MixedCase
    return [
        # a decode-sized bucket: few queries each (1 + 3 speculative), long contexts, split
        c("bf16", 8, 32, 4, 32, 8, 128, 16, 96, True, lse="th"),
        # a prefill-sized bucket: chunks over contexts, decodes among them
        c("bf16", 6, 700, 300, 16, 4, 128, 64, 24, True, lse="ht"),
        c("fp16", 5, 300, 160, 8, 8, 64, 256, 4, False),  # MHA, not causal, pages of 256
        c("bf16", 4, 200, 120, 16, 2, 256, 16, 40, True, lse="th", window_left=100, softcap=30.0),
        c("bf16", 8, 64, 16, 32, 8, 128, 64, 32, True, lse="th", cache="e4m3"),  # e4m3, per-head scales
        c("fp16", 6, 12, 1, 8, 1, 64, 16, 80, True, cache="e4m3", scales="tensor"),  # few rows: MQA by one token
        # the caches as engines hold them: vLLM's NHD and HND halves, transformers' pool of pages
        c("bf16", 6, 256, 128, 32, 8, 128, 16, 48, True, lse="th", cache_layout="vllm_nhd"),
        c("bf16", 5, 96, 32, 16, 4, 128, 32, 40, True, cache="e4m3", scales="tensor", cache_layout="vllm_hnd"),
        c("fp16", 8, 160, 64, 32, 8, 64, 256, 6, True, lse="ht", window_left=300, cache_layout="hf"),
        # a whole step: the packed append of the new K/V, then the attention over them
        c("bf16", 7, 200, 96, 32, 8, 128, 16, 40, True, lse="th", append=True),
        c("bf16", 8, 32, 4, 32, 8, 128, 16, 96, True, cache_layout="vllm_nhd", append=True),  # decode-sized, split
        c("fp16", 4, 64, 32, 16, 2, 64, 64, 12, True, cache="e4m3", cache_layout="hf", append=True),
        # an e4m3 cache's chunks on the forward kernel that converts the pages (`kv_cache`): long
        # chunks over pages of 16 at d=128 (K and V's raw boxes 8 a block), d=256 at the shared
        # memory's limit with a window and softcap, per-tensor scales over transformers' pool
        c("bf16", 6, 700, 300, 32, 8, 128, 16, 40, True, lse="th", cache="e4m3"),
        c("bf16", 4, 300, 160, 16, 4, 256, 16, 48, True, window_left=200, softcap=30.0, cache="e4m3"),
        c("fp16", 5, 400, 200, 16, 2, 64, 256, 4, True, lse="ht", cache="e4m3", scales="tensor", cache_layout="hf"),
        # attention sinks (gpt-oss: d 64, 8 query heads a KV head, windows of 128): chunks on the
        # forward kernel beside unsplit decodes; a decode-sized bucket split over its keys (the combine)
        c("bf16", 6, 400, 160, 32, 4, 64, 16, 40, True, lse="th", window_left=127, append=True, sinks=True),
        c("bf16", 8, 32, 4, 32, 4, 64, 16, 96, True, lse="ht", sinks=True),
        # adaptive splits (the decodes beside chunks apart, contexts of thousands): each sequence's
        # chunk from its length on the device; a short one written by split 0 alone, a long one
        # over every split and merged by the combine (transformers' pool of pages of 256)
        c("bf16", 8, 96, 40, 32, 8, 128, 256, 16, True, lse="th", cache_layout="hf"),
        c("bf16", 6, 200, 64, 32, 4, 64, 16, 320, True, lse="ht", window_left=2500, append=True, sinks=True),
        c("fp16", 5, 160, 48, 16, 8, 256, 64, 40, False, lse="th", softcap=30.0),
        # head dim 96 (Phi-3: MHA, 32 heads, a window of 2047): the decode kernel's 32-wide boxes,
        # the forward kernel's over the pages (chunks apart), adaptive splits, an e4m3 cache
        c("bf16", 8, 32, 4, 32, 32, 96, 16, 96, True, lse="th"),  # decode-sized, MHA, split
        c("bf16", 6, 700, 300, 32, 32, 96, 64, 24, True, lse="ht"),  # chunks apart, MHA
        c("fp16", 5, 300, 160, 16, 4, 96, 256, 4, False),  # pages of 256, not causal
        c("bf16", 4, 200, 120, 16, 2, 96, 16, 40, True, lse="th", window_left=100, softcap=30.0),
        c("bf16", 8, 96, 40, 32, 8, 96, 256, 16, True, lse="th", cache_layout="hf"),  # adaptive splits
        c("bf16", 6, 200, 64, 32, 8, 96, 16, 320, True, lse="ht", window_left=2047, append=True, sinks=True),
        c("fp16", 6, 256, 128, 32, 8, 96, 16, 48, True, lse="th", cache_layout="vllm_nhd", append=True),
        c("bf16", 8, 32, 4, 32, 4, 96, 16, 96, True, lse="ht", sinks=True),  # decode-sized, split, sinks
        c("bf16", 8, 64, 16, 32, 8, 96, 64, 32, True, lse="th", cache="e4m3"),  # e4m3: chunks converted
        c("fp16", 6, 12, 1, 8, 1, 96, 16, 80, True, cache="e4m3", scales="tensor", cache_layout="vllm_hnd"),
        # pages of 48, which no key block is a multiple of (boxes of 16 rows), in vLLM's HND halves;
        # pages of 32 of transformers' pool at d=64 (three consumers)
        c("fp16", 5, 300, 160, 16, 4, 128, 48, 12, True, lse="th", cache_layout="vllm_hnd"),
        c("bf16", 6, 400, 200, 32, 8, 64, 32, 30, True, lse="ht", cache_layout="hf"),
    ]


def graph_case() -> MixedCase:
    """Small, so that a CUDA graph can be replayed and checked over 100 fresh mixes; sequences of
    up to 24 queries at a GQA group of 4, so that both halves run (the decodes' kernel up to 16,
    the forward kernel's chunks above)."""
    return MixedCase("bf16", 6, 48, 24, 8, 2, 64, 16, 16, True, lse="th")
