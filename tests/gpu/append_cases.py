"""The ragged-append test matrix (kv_append's packed and slots forms), as plain data (the GPU
side imports this without frostc).

Each case is one plan: kv_append alone, its new rows (tokens, hkv, d) packed like a mixed step's
queries, placed by cu_seqlens_q through a page table and the lengths (packed) or by vLLM's
slot_mapping (slots). Every factor appears at least once: both forms; bf16 and fp16 rows; a
bf16/fp16 cache and an e4m3 one with scales per kv head and per tensor; head dims 64, 96, 128 and
256; page sizes 16 and 256; MQA and GQA head counts; k and v contiguous or the two halves of
one (tokens, 2 hkv, d) buffer; caches NHD (pages, page_size, hkv, d) or HND (vLLM's: the heads
outside the page's rows); many short sequences and few long ones. Plans are small (one kernel).
"""

from dataclasses import dataclass

from tests.gpu.decode_cases import PagePool


@dataclass(frozen=True)
class AppendCase(PagePool):
    form: str  # "packed" (cu_seqlens_q, page_table, seq_len_kv) | "slots" (slot_mapping)
    dtype: str  # the new rows': "bf16" | "fp16"
    batch: int  # sequences per step (slots: the sequences its slot mappings are drawn for)
    heads_kv: int
    head_dim: int
    page_size: int
    max_pages: int  # the page table's width: capacity = max_pages * page_size tokens per sequence
    tokens: int  # the new rows' capacity (k, v (tokens, hkv, d))
    cache: str | None = None  # a quantized cache ("e4m3", with k_scale and v_scale); None: `dtype`
    scales: str = "head"  # a quantized cache's scales: one per kv head ("head") or one ("tensor")
    rows: str = "thd"  # k, v: "thd" (each its own buffer) | "fused" (halves of one (tokens, 2 hkv, d))
    cache_layout: str = "pshd"  # "pshd" (NHD) | "phsd" (HND: each head's page rows together)

    @property
    def id(self) -> str:
        return (
            f"append-{self.form}-{self.dtype}-d{self.head_dim}-p{self.page_size}x{self.max_pages}"
            f"-b{self.batch}-t{self.tokens}-h{self.heads_kv}"
            f"{'' if self.cache is None else f'-kv{self.cache}-{self.scales}'}"
            f"{'-fused' if self.rows == 'fused' else ''}{'-hnd' if self.cache_layout == 'phsd' else ''}"
        )


_ = AppendCase
# fmt: off
CASES = [
    #  form      dtype    b  hkv   d    P  pages tokens
    # the packed form: Llama-3-like heads over pages of 16, and of 256; many short sequences
    _("packed", "bf16", 8, 8, 128, 16, 64, 300),
    _("packed", "fp16", 5, 2, 64, 256, 4, 700, cache_layout="phsd"),
    _("packed", "bf16", 64, 1, 128, 16, 8, 130, rows="fused"),  # MQA, more sequences than a warp
    _("packed", "bf16", 3, 4, 256, 16, 48, 600),
    # ... over an e4m3 cache, scales per kv head and per tensor
    _("packed", "bf16", 6, 4, 128, 16, 32, 200, cache="e4m3"),
    _("packed", "fp16", 3, 2, 256, 256, 2, 257, cache="e4m3", scales="tensor", rows="fused"),
    # the slots form (vLLM's slot_mapping), the same spread
    _("slots", "bf16", 8, 8, 128, 16, 64, 300),
    _("slots", "fp16", 5, 2, 64, 256, 4, 700, rows="fused", cache_layout="phsd"),
    _("slots", "bf16", 4, 2, 128, 256, 4, 500, cache="e4m3", scales="tensor"),
    _("slots", "fp16", 6, 8, 64, 16, 16, 97, cache="e4m3", cache_layout="phsd"),
    # head dim 96 (Phi-3): 12 pieces a row, the threads' loop over heads and pieces
    _("packed", "bf16", 8, 32, 96, 16, 64, 300),
    _("packed", "fp16", 5, 2, 96, 256, 4, 701, cache="e4m3", scales="tensor", cache_layout="phsd"),
    _("slots", "bf16", 6, 8, 96, 16, 16, 97, rows="fused"),
    _("slots", "fp16", 4, 2, 96, 256, 4, 500, cache="e4m3"),
]
# fmt: on
del _


def cases() -> list[AppendCase]:
    return list(CASES)


def edge_case(form: str) -> AppendCase:
    """The broken-contract checks' plan of a form: several sequences, pages of 16."""
    return next(c for c in CASES if c.form == form and c.batch >= 4 and c.page_size == 16)


def graph_case() -> AppendCase:
    """The CUDA-graph loop's plan: packed, an e4m3 cache (quantizing)."""
    return next(c for c in CASES if c.form == "packed" and c.cache is not None)
