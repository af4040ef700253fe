"""The paged-KV decode test matrix, as plain data (the GPU side imports this without frostc).

Each case is one plan: kv_append (this step's new K/V rows into the paged caches) then sdpa
over the caches, or one of the two alone. The list is written out rather than crossed: every
value of each factor appears at least once (dtype bf16/fp16; head dim 64, 128, one 256, and a
block of 96 (Phi-3) in every mode; page size 16, 32, 48, 64, 128, 256; hq/hkv 1, 4, 8 and MQA;
s_new 1, 4, 16 with and without the bottom-right causal mask; LSE on some; batch 1..8; q/o/k_new
layouts bshd and bhsd; an e4m3 cache with scales per kv head and per tensor), and the
capacities (max_pages per sequence) are chosen so that some plans see many pages per sequence
and few sequences (the split-KV path) and others few pages and many sequences (one launch).
~24 plans of ~100-300 KB each keep the carried folder small.
"""

from dataclasses import dataclass

SPARE_PAGES = 5  # pages in the pool beyond batch * max_pages: never in a table, always NaN


class PagePool:
    """The pool and the capacity of a case over a paged cache (its batch, max_pages and
    page_size): every sequence can reach its capacity, plus spare pages."""

    @property
    def pages(self) -> int:
        return self.batch * self.max_pages + SPARE_PAGES

    @property
    def capacity(self) -> int:
        return self.max_pages * self.page_size


@dataclass(frozen=True)
class DecodeCase(PagePool):
    dtype: str
    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    page_size: int
    max_pages: int  # the page table's width: capacity = max_pages * page_size tokens per sequence
    s_new: int  # tokens appended (and queried) per sequence per step
    causal: bool  # bottom-right: query t sees keys 0 .. len - s_new + t
    lse: bool
    layout: str  # q, k_new, v_new and o: "bshd" or "bhsd"
    nodes: str = "both"  # both (kv_append then sdpa) | sdpa (sdpa alone) | append (kv_append alone)
    window_left: int | None = None  # token t (at len - s_new + t) sees keys from there - window_left on
    softcap: float | None = None
    cache: str | None = None  # a quantized cache ("e4m3", with k_scale and v_scale); None: `dtype`
    scales: str = "head"  # a quantized cache's scales: one per kv head ("head") or one ("tensor")
    sinks: bool = False  # a float32 sink logit per query head (gpt-oss); 16-bit caches

    @property
    def id(self) -> str:
        c = "causal" if self.causal else "full"
        return (
            f"decode-{self.nodes}-{self.dtype}-d{self.head_dim}-p{self.page_size}x{self.max_pages}"
            f"-b{self.batch}-h{self.heads_q}x{self.heads_kv}-n{self.s_new}-{c}-{self.layout}"
            f"{'-lse' if self.lse else ''}"
            f"{'' if self.window_left is None else f'-w{self.window_left}'}"
            f"{'' if self.softcap is None else f'-cap{self.softcap:g}'}"
            f"{'' if self.cache is None else f'-kv{self.cache}-{self.scales}'}"
            f"{'-sinks' if self.sinks else ''}"
        )


_ = DecodeCase
# fmt: off
CASES = [
    #  dtype   b  hq hkv   d    P  pages s_new causal lse   layout
    # plain decode (s_new 1), every page size
    _("bf16", 4, 32, 8, 128, 16, 64, 1, False, True, "bshd"),
    _("fp16", 8, 8, 8, 128, 16, 16, 1, False, False, "bhsd"),
    _("bf16", 3, 16, 2, 64, 32, 32, 1, False, True, "bshd"),
    _("bf16", 2, 32, 4, 128, 48, 40, 1, False, True, "bhsd"),
    _("fp16", 8, 32, 4, 128, 64, 64, 1, False, False, "bhsd"),
    _("fp16", 8, 16, 2, 128, 128, 4, 1, False, False, "bshd"),
    _("bf16", 2, 8, 2, 64, 256, 32, 1, False, True, "bshd"),
    _("bf16", 2, 8, 2, 256, 64, 32, 1, False, True, "bshd"),  # the d=256 case
    # one long sequence: many pages per sequence (split-KV)
    _("bf16", 1, 32, 8, 128, 128, 128, 1, False, True, "bshd"),
    _("bf16", 1, 8, 2, 128, 16, 512, 1, True, True, "bshd"),  # causal with s_new 1: the same mask
    _("fp16", 1, 16, 4, 64, 64, 128, 16, False, False, "bhsd"),
    _("bf16", 2, 32, 8, 128, 16, 256, 16, True, True, "bshd"),
    # several new tokens (speculative decoding, chunked prefill), with and without the diagonal
    _("fp16", 5, 8, 1, 64, 32, 8, 4, True, False, "bshd"),  # MQA
    _("fp16", 6, 8, 8, 128, 64, 16, 4, True, True, "bshd"),
    _("fp16", 3, 8, 8, 128, 256, 4, 4, False, False, "bhsd"),
    _("fp16", 2, 8, 2, 128, 48, 12, 16, True, False, "bshd"),
    _("bf16", 4, 8, 8, 64, 128, 8, 16, False, True, "bshd"),
    _("fp16", 7, 16, 16, 64, 16, 8, 4, False, False, "bshd"),
    # sdpa alone: the caller appended by other means
    _("bf16", 4, 32, 8, 128, 128, 16, 1, False, True, "bshd", "sdpa"),
    _("fp16", 3, 8, 2, 64, 16, 64, 4, True, False, "bhsd", "sdpa"),
    _("bf16", 1, 16, 2, 128, 64, 64, 16, True, True, "bshd", "sdpa"),
    _("fp16", 8, 8, 8, 128, 32, 8, 1, False, True, "bshd", "sdpa"),
    # sliding windows and softcap (Mistral, Gemma-2): split and not, windows shorter and longer
    # than a split's chunk and than the lengths, with several new tokens
    _("bf16", 1, 32, 8, 128, 16, 512, 1, True, True, "bshd", window_left=1000),  # split over the window
    _("bf16", 2, 16, 8, 256, 32, 64, 1, True, True, "bshd", window_left=300, softcap=50.0),  # Gemma-2 local
    _("bf16", 2, 16, 8, 256, 32, 64, 1, True, False, "bshd", softcap=50.0),  # Gemma-2 global
    _("fp16", 3, 8, 2, 64, 64, 32, 4, True, True, "bhsd", window_left=70),
    _("bf16", 1, 8, 2, 128, 16, 1024, 16, False, True, "bshd", window_left=5000, softcap=30.0),
    _("fp16", 8, 32, 8, 128, 16, 16, 1, True, False, "bshd", window_left=31),  # many sequences, one launch
    # kv_append alone (hq, causal and lse do not apply)
    _("bf16", 4, 8, 8, 128, 16, 16, 4, False, False, "bhsd", "append"),
    # an FP8 (e4m3) cache with float32 scales per kv head or per tensor: split and not, each head
    # dim, windows and softcap, several new tokens, each node alone
    _("bf16", 4, 32, 8, 128, 16, 64, 1, False, True, "bshd", cache="e4m3"),  # Llama-3 decode
    _("fp16", 1, 16, 4, 64, 64, 128, 16, True, False, "bhsd", cache="e4m3", scales="tensor"),  # split
    _("bf16", 2, 16, 8, 256, 32, 64, 1, True, True, "bshd", window_left=300, softcap=50.0, cache="e4m3"),
    _("bf16", 8, 32, 8, 128, 128, 4, 4, True, True, "bshd", cache="e4m3", scales="tensor"),  # one launch
    _("bf16", 3, 8, 2, 128, 48, 40, 1, False, False, "bhsd", "sdpa", cache="e4m3"),
    _("fp16", 4, 8, 8, 64, 16, 16, 4, False, False, "bhsd", "append", cache="e4m3"),
    # a group of 8 by one token: 8 rows, the most the e4m3 kernel's first row half holds (few_rows)
    _("bf16", 2, 64, 8, 128, 32, 40, 1, True, True, "bshd", cache="e4m3"),
    # d 64 with a window and softcap over six KV heads, two tokens (4 rows: the transposed MMAs);
    # one short capacity, unsplit (the Llama-3 row above and the 8-row one are split)
    _("fp16", 3, 12, 6, 64, 16, 96, 2, True, True, "bshd", window_left=200, softcap=30.0, cache="e4m3",
      scales="tensor"),
    _("bf16", 5, 16, 4, 128, 16, 8, 1, False, True, "bshd", cache="e4m3"),
    # a group of 7 (Qwen2) by 3 new tokens: 21 rows, two row blocks of the e4m3 kernel's 16
    _("bf16", 2, 28, 4, 128, 16, 24, 3, True, True, "bhsd", cache="e4m3"),
    # the accuracy pair: one shape, a bf16 cache and an e4m3 one (tests/gpu/test_fp8_cache.py)
    _("bf16", 4, 32, 8, 128, 64, 64, 1, False, False, "bshd", "sdpa"),
    _("bf16", 4, 32, 8, 128, 64, 64, 1, False, False, "bshd", "sdpa", cache="e4m3"),
    # attention sinks (gpt-oss: d 64, 64 query heads over 8, windows of 128 on every other layer):
    # unsplit (the decode kernel adds them), split over 8k keys (the combine does), a window and
    # several new tokens
    _("bf16", 8, 64, 8, 64, 16, 16, 1, True, True, "bshd", sinks=True),
    _("bf16", 1, 64, 8, 64, 16, 512, 1, True, True, "bshd", sinks=True),
    _("fp16", 3, 16, 2, 64, 32, 32, 4, True, True, "bhsd", window_left=127, sinks=True),
    # head dim 96 (Phi-3: 32 query heads over 32 KV heads, a window of 2047): 64-byte swizzled
    # tiles loaded in three 32-wide boxes a row, the combine's 10 groups of 24 threads; split and
    # not, pages of 16 and 256, GQA, MQA and MHA, odd new-token counts, windows, softcap, sinks
    _("bf16", 4, 32, 32, 96, 16, 16, 1, False, True, "bshd"),  # Phi-3-mini's heads, one launch
    _("fp16", 1, 32, 8, 96, 256, 32, 1, True, True, "bhsd"),  # split over 8k keys, pages of 256
    _("bf16", 2, 16, 4, 96, 16, 256, 4, True, False, "bshd"),  # several new tokens, split
    _("fp16", 5, 8, 1, 96, 16, 8, 3, True, True, "bshd"),  # MQA, 3 new tokens, one launch
    _("bf16", 1, 32, 32, 96, 16, 512, 1, True, True, "bshd", window_left=2047),  # Phi-3's window, split
    _("bf16", 3, 16, 2, 96, 256, 4, 1, True, True, "bshd", window_left=300, softcap=50.0),
    _("fp16", 2, 16, 4, 96, 64, 64, 16, False, True, "bhsd", "sdpa", softcap=30.0),  # 64 rows: one row block
    _("bf16", 8, 32, 8, 96, 16, 16, 1, True, True, "bshd", sinks=True),  # sinks in one launch
    _("fp16", 1, 32, 8, 96, 16, 512, 1, True, True, "bhsd", sinks=True),  # ... split: the combine's
    _("fp16", 3, 8, 8, 96, 16, 16, 4, False, False, "bhsd", "append"),
    # ... over an e4m3 cache: the warp-level kernel's d/4- and d/8-wide pieces (24 and 12 bytes)
    _("bf16", 4, 32, 8, 96, 16, 64, 1, False, True, "bshd", cache="e4m3"),  # few rows, split
    _("fp16", 1, 16, 4, 96, 64, 128, 16, True, False, "bhsd", cache="e4m3", scales="tensor"),  # 4 row blocks
    _("bf16", 2, 28, 4, 96, 16, 24, 3, True, True, "bhsd", cache="e4m3"),  # 21 rows
    _("fp16", 3, 12, 6, 96, 256, 2, 2, True, True, "bshd", window_left=200, softcap=30.0, cache="e4m3",
      scales="tensor"),
]
# fmt: on
del _


def cases() -> list[DecodeCase]:
    return list(CASES)


def graph_case() -> DecodeCase:
    """The CUDA-graph decode loop's plan: append + attention, one new token per step, many short
    sequences (the attention in one launch, no split, as built at the time of writing)."""
    return next(c for c in CASES if c.nodes == "both" and c.s_new == 1 and c.batch >= 8 and c.page_size == 16)


def contract_case() -> DecodeCase:
    """The execute-contract checks' plan: append + attention, LSE, a long capacity (workspace
    when split-KV is chosen)."""
    return next(c for c in CASES if c.nodes == "both" and c.batch == 1 and c.max_pages >= 128 and c.lse)


def scaled_graph_case() -> DecodeCase:
    """The CUDA-graph decode loop over an e4m3 cache: append (quantizing) + attention."""
    return next(c for c in CASES if c.nodes == "both" and c.s_new == 1 and c.cache is not None)


def accuracy_pair() -> tuple[DecodeCase, DecodeCase]:
    """Two sdpa-alone plans of one shape, over a bf16 cache and over an e4m3 cache."""
    shape = DecodeCase("bf16", 4, 32, 8, 128, 64, 64, 1, False, False, "bshd", "sdpa")
    return shape, DecodeCase(**{**shape.__dict__, "cache": "e4m3"})
