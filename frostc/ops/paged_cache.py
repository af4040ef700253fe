"""What the ops over a paged KV cache agree on (kv_append writes it, sdpa's paged form reads
it): the page sizes and the new tokens per step their kernels take, and how anything else is
refused. A cache is (pages, page_size, hkv, d); a page table (b, max_pages) lists each
sequence's pages in order; position p of sequence b is row p % page_size of page
page_table[b, p // page_size]."""

from __future__ import annotations

PAGE_SIZE_STEP = 16  # page sizes are multiples of this: a TMA box of the cache never spans pages
MAX_PAGE_SIZE = 256
MAX_NEW_TOKENS = 16  # new tokens per sequence and step: decode, speculative decoding, short chunks


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
