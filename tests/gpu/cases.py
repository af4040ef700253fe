"""The GPU test matrix, as plain data (the GPU side imports this without frostc).

Every value of every factor the kernel supports is crossed with each (dtype, head dim, causal)
variant and each sequence-length pair; the remaining factors (batch, heads, GQA ratio,
layout, LSE) rotate through their values so that each meets each variant. The full product
would be ~2,300 plans of ~90 KB; this covering set keeps the carried folder small.
"""

import itertools
from dataclasses import dataclass

SEQS = [(1, 1), (17, 17), (128, 128), (1000, 1000), (4096, 4096), (128, 1000)]
VARIANTS = list(itertools.product(("bf16", "fp16"), (64, 128, 256), (False, True)))  # dtype, d, causal
BATCHES = (1, 3)
HEADS_Q = (8, 16)
KV_RATIOS = ("mha", "gqa4", "mqa")  # hkv = hq, hq / 4, 1
LAYOUTS = ("bhsd", "bshd")


@dataclass(frozen=True)
class Case:
    dtype: str
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool
    layout: str
    lse: bool

    @property
    def id(self) -> str:
        c = "causal" if self.causal else "full"
        return (
            f"{self.dtype}-d{self.head_dim}-{c}-b{self.batch}-h{self.heads_q}x{self.heads_kv}"
            f"-s{self.seq_q}x{self.seq_kv}-{self.layout}{'-lse' if self.lse else ''}"
        )


def _heads_kv(heads_q: int, ratio: str) -> int:
    return {"mha": heads_q, "gqa4": heads_q // 4, "mqa": 1}[ratio]


def cases() -> list[Case]:
    out = []
    rotation = itertools.cycle(itertools.product(BATCHES, HEADS_Q, KV_RATIOS, LAYOUTS, (True, False)))
    for (dtype, d, causal), (sq, skv) in itertools.product(VARIANTS, SEQS):
        # two cases per cell, from different points of the rotation
        for _ in range(2):
            b, hq, ratio, layout, lse = next(rotation)
            if sq * skv >= 4096 * 4096 and b * hq > 16:
                b, hq = 1, 16  # keep the float64 reference of the longest rows affordable
            out.append(Case(dtype, b, hq, _heads_kv(hq, ratio), sq, skv, d, causal, layout, lse))
    return out
