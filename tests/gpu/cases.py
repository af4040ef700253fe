"""The GPU test matrix, as plain data (the GPU side imports this without frostc).

Three sets (and smaller ones: long tiles, the dynamic walk, sinks, head dim 96, head dims 192 / 128):
- dense: every value of every factor the kernel supports is crossed with each (dtype, head dim,
  causal) variant and each sequence-length pair; the remaining factors (batch, heads, GQA
  ratio, layout, LSE) rotate through their values so that each meets each variant. The full
  product would be ~2,300 plans of ~90 KB; this covering set keeps the carried folder small.
- masks: dense plans with each mask kind (bottom-right causal, sliding windows, softcap, and
  their combinations) at every head dim, on lengths that make rows without keys.
- varlen: padded and packed plans with each mask kind at every head dim; the test draws
  several fresh length mixes per plan (0, 1, tile - 1, tile, tile + 1, the capacity, ...).
"""

import itertools
from dataclasses import dataclass, replace

SEQS = [(1, 1), (17, 17), (128, 128), (1000, 1000), (4096, 4096), (128, 1000)]
VARIANTS = list(itertools.product(("bf16", "fp16"), (64, 128, 256), (False, True)))  # dtype, d, causal
BATCHES = (1, 3)
HEADS_Q = (8, 16)
KV_RATIOS = ("mha", "gqa4", "mqa")  # hkv = hq, hq / 4, 1
LAYOUTS = ("bhsd", "bshd")

# mask kinds: (causal, alignment, window_left, window_right, softcap)
MASKS = [
    (True, "bottom_right", None, None, None),  # chunked prefill / a KV cache
    (True, "top_left", 100, None, None),  # Mistral-style sliding window
    (False, "top_left", 60, 30, None),  # bidirectional local window
    (True, "bottom_right", 200, None, None),
    (False, "top_left", None, None, 30.0),  # Gemma 2 softcap
    (True, "bottom_right", None, None, 50.0),
    (False, "bottom_right", 40, 0, None),  # a window whose right bound is the diagonal
]
MASK_SEQS = [(300, 1000), (1000, 300), (777, 777), (129, 4000)]
VARLEN_MASKS = [
    (False, "top_left", None, None, None),
    (True, "top_left", None, None, None),
    (True, "bottom_right", None, None, None),
    (True, "bottom_right", 256, None, None),
    (False, "top_left", None, None, 40.0),
    (False, "top_left", 60, 30, None),  # a bidirectional window
]


@dataclass(frozen=True)
class Case:
    dtype: str
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int  # dense: the length; padded: the rows (capacity); packed: max_seqlen_q
    seq_kv: int
    head_dim: int
    causal: bool
    layout: str
    lse: bool
    form: str = "dense"  # dense | padded | packed
    alignment: str = "top_left"
    window_left: int | None = None
    window_right: int | None = None
    softcap: float | None = None
    tokens_q: int = 0  # packed: the buffers' tokens
    tokens_kv: int = 0
    lengths: str = "qkv"  # padded: which sides have per-sequence lengths ("q", "kv", "qkv")
    count_visits: bool = False  # a debug build of the dynamic walk that counts tile visits
    sinks: bool = False  # a float32 sink logit per query head (gpt-oss)
    head_dim_v: int = 0  # v's and o's head dim where it is not head_dim (q's and k's; DeepSeek: 192, 128)

    @property
    def id(self) -> str:
        c = "causal" if self.causal else "full"
        d = f"{self.head_dim}" + (f"v{self.head_dim_v}" if self.head_dim_v else "")
        base = (
            f"{self.dtype}-d{d}-{c}-b{self.batch}-h{self.heads_q}x{self.heads_kv}"
            f"-s{self.seq_q}x{self.seq_kv}-{self.layout}{'-lse' if self.lse else ''}"
        )
        extra = ""
        if self.alignment != "top_left":
            extra += "-br"
        if self.window_left is not None or self.window_right is not None:
            extra += f"-w{self.window_left if self.window_left is not None else 'x'}"
            extra += f"_{self.window_right if self.window_right is not None else 'x'}"
        if self.softcap is not None:
            extra += f"-cap{self.softcap:g}"
        if self.form == "padded":
            extra += f"-padded_{self.lengths}"
        elif self.form == "packed":
            extra += f"-packed_t{self.tokens_q}x{self.tokens_kv}"
        if self.count_visits:
            extra += "-visits"
        if self.sinks:
            extra += "-sinks"
        return base + extra


def _heads_kv(heads_q: int, ratio: str) -> int:
    return {"mha": heads_q, "gqa4": heads_q // 4, "mqa": 1}[ratio]


def dense_cases() -> list[Case]:
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


def mask_cases() -> list[Case]:
    out = []
    rotation = itertools.cycle(itertools.product(("bf16", "fp16"), KV_RATIOS, LAYOUTS, (True, False), BATCHES))
    seqs = itertools.cycle(MASK_SEQS)
    for d, (causal, align, left, right, cap) in itertools.product((64, 128, 256), MASKS):
        dtype, ratio, layout, lse, b = next(rotation)
        sq, skv = next(seqs)
        out.append(
            Case(dtype, b, 8, _heads_kv(8, ratio), sq, skv, d, causal, layout, lse, "dense", align, left, right, cap)
        )
    return out


def varlen_cases() -> list[Case]:
    out = []
    rotation = itertools.cycle(itertools.product(("bf16", "fp16"), KV_RATIOS, (True, False), LAYOUTS))
    sides = itertools.cycle(("qkv", "kv", "qkv", "q"))
    for form, d, (causal, align, left, right, cap) in itertools.product(
        ("padded", "packed"), (64, 128, 256), VARLEN_MASKS
    ):
        dtype, ratio, lse, layout = next(rotation)
        hq = 16 if d < 256 else 8
        if form == "padded":
            case = Case(dtype, 5, hq, _heads_kv(hq, ratio), 1100, 1000, d, causal, layout, lse, form, align, left,
                        right, cap, lengths=next(sides))  # fmt: skip
        else:
            case = Case(dtype, 7, hq, _heads_kv(hq, ratio), 1100, 1000, d, causal, "thd", lse, form, align, left,
                        right, cap, tokens_q=3001, tokens_kv=2800)  # fmt: skip
        out.append(case)
    return out


def long_tile_cases() -> list[Case]:
    """Dense causal plans whose tiles see 64+ key blocks: one CTA per tile (the per_tile variant),
    at d 64 and 128 (d 256 gets it from 4096 keys: the dense set's 4096 rows), odd sizes included."""
    return [
        Case("bf16", 1, 4, 2, 8192, 8192, 128, True, "bhsd", True),
        Case("fp16", 1, 4, 1, 8200, 8200, 64, True, "bshd", False),
        Case("bf16", 2, 4, 4, 3000, 8500, 128, True, "bshd", True, "dense", "bottom_right"),
    ]


def dynamic_walk_cases() -> list[Case]:
    """Dense causal plans of 13+ query blocks and fewer than 64 key blocks: tiles taken from a
    counter in the workspace (the dynamic variant) at each head dim, odd sizes, and one whose
    first 2000 query rows see no key (bottom-right alignment), so the walk meets empty tiles.
    The first is also the execute-contract tests' dynamic plan."""
    return [
        Case("bf16", 1, 4, 2, 2000, 2000, 128, True, "bhsd", True),
        Case("fp16", 2, 4, 1, 3000, 3000, 64, True, "bshd", False),
        Case("bf16", 2, 4, 4, 2500, 3100, 256, True, "bshd", True, "dense", "bottom_right"),
        Case("fp16", 1, 8, 2, 3000, 1000, 128, True, "bhsd", True, "dense", "bottom_right"),
    ]


def visit_count_cases() -> list[Case]:
    """Debug builds of the dynamic walk's plans (`debug_tile_visits`): each consumer counts its
    visits of each tile into the workspace; the stress test (test_dynamic_walk.py) launches
    them thousands of times and wants every count exactly 1 per launch."""
    return [replace(case, count_visits=True) for case in dynamic_walk_cases()]


def sink_cases() -> list[Case]:
    """Attention sinks (gpt-oss: d 64, 8 query heads a KV head, sliding layers of 128 keys between
    full ones) in each form that takes them, with and without LSE, odd sizes; rows that see no key
    (bottom-right, more queries than keys) get O = 0 and the sink as their LSE; a softcap and the
    dynamic walk too."""
    return [
        Case("bf16", 2, 16, 2, 777, 777, 64, True, "bshd", True, "dense", "top_left", 127, sinks=True),
        Case("fp16", 1, 8, 1, 1000, 300, 64, True, "bhsd", True, "dense", "bottom_right", sinks=True),
        Case("bf16", 3, 8, 8, 129, 1000, 128, False, "bhsd", False, sinks=True),
        Case("bf16", 1, 4, 2, 2000, 2000, 128, True, "bhsd", True, sinks=True),  # the dynamic walk
        Case(
            "fp16", 5, 8, 2, 1100, 1000, 256, False, "bshd", True, "padded", "top_left", None, None, 40.0, sinks=True
        ),  # fmt: skip
        Case(
            "bf16",
            7,
            16,
            2,
            1100,
            1000,
            64,
            True,
            "thd",
            True,
            "packed",
            "bottom_right",
            127,
            tokens_q=3001,
            tokens_kv=2800,
            sinks=True,
        ),  # fmt: skip
    ]


def head_dim_96_cases() -> list[Case]:
    """Head dim 96 (Phi-3; the 16-bit forward kernel's dense, padded and packed forms): rows of the
    O store split 4 threads a row (`_row_copy`), so every O column is checked, rows without keys
    included; Phi-3-mini's 32 heads on the dynamic walk."""
    return _new_head_dim_cases(96, dynamic_heads=32)


def head_dim_192_cases() -> list[Case]:
    """q and k at head dim 192, v and o at 128 (DeepSeek-V2/V3/R1's prefill, MLA not absorbed): O
    leaves through each consumer's part of Q's buffer, so rows without keys (bottom-right, more
    queries than keys) and rows short of a tile are included; MHA on the dynamic walk as
    DeepSeek's, and a packed MHA case."""
    packed_mha = Case("bf16", 7, 16, 16, 1100, 1000, 192, True, "thd", True, "packed", tokens_q=3001, tokens_kv=2800)
    cases = _new_head_dim_cases(192, dynamic_heads=16, extra=[packed_mha])
    return [replace(case, head_dim_v=128) for case in cases]


def _new_head_dim_cases(d: int, dynamic_heads: int, extra: list[Case] = ()) -> list[Case]:
    """A head dim new to the forward kernel: each walk (static, paired, dynamic, one CTA per
    tile), each mask kind, sinks and both variable-length forms, in bf16 and fp16, GQA, MHA and
    MQA, on lengths that are not multiples of the 128-row tiles (`extra` before the last two
    packed cases)."""
    h = dynamic_heads
    return [
        Case("bf16", 2, 8, 8, 1000, 1000, d, False, "bshd", True),  # static walk
        Case("fp16", 1, 16, 4, 1000, 1000, d, True, "bhsd", False),  # paired walk
        Case("bf16", 1, h, h, 2000, 2000, d, True, "bshd", True),  # dynamic walk, the model's heads
        Case("fp16", 1, 4, 1, 8200, 8200, d, True, "bshd", False),  # one CTA per tile, MQA
        Case("bf16", 3, 8, 2, 17, 17, d, False, "bhsd", True),  # rows short of a tile
        Case("fp16", 1, 8, 2, 129, 4000, d, False, "bshd", True),
        Case("bf16", 2, 8, 2, 300, 1000, d, True, "bshd", True, "dense", "bottom_right"),
        Case("fp16", 1, 8, 8, 1000, 300, d, True, "bhsd", True, "dense", "bottom_right"),  # rows without keys
        Case("bf16", 2, 8, 2, 777, 777, d, True, "bshd", False, "dense", "top_left", 100),  # sliding window
        Case("fp16", 1, 8, 4, 600, 600, d, False, "bhsd", True, "dense", "top_left", 60, 30),  # two-sided
        Case("bf16", 1, 8, 2, 500, 1000, d, False, "bshd", True, "dense", softcap=30.0),
        Case("fp16", 1, 8, 2, 300, 900, d, True, "bshd", True, "dense", "bottom_right", 200, None, 50.0),
        Case("bf16", 2, 16, 2, 777, 777, d, True, "bshd", True, "dense", "top_left", 127, sinks=True),
        Case("bf16", 5, 16, 4, 1100, 1000, d, True, "bshd", True, "padded", lengths="qkv"),
        Case("fp16", 5, 16, 16, 1100, 1000, d, False, "bhsd", False, "padded", softcap=40.0, lengths="kv"),
        *extra,
        Case("bf16", 7, 16, 4, 1100, 1000, d, True, "thd", True, "packed", "bottom_right", tokens_q=3001,
             tokens_kv=2800),
        Case("fp16", 7, 16, 1, 1100, 1000, d, False, "thd", True, "packed", "top_left", 60, 30, tokens_q=3001,
             tokens_kv=2800, sinks=True),
    ]  # fmt: skip


def cases() -> list[Case]:
    return (
        dense_cases() + mask_cases() + varlen_cases() + long_tile_cases() + dynamic_walk_cases()
        + visit_count_cases() + sink_cases() + head_dim_96_cases() + head_dim_192_cases()
    )  # fmt: skip


# One plan of two independent sdpa nodes (they run in order, each with its own launches and
# workspace regions): a dense causal node and a packed one. Their tensors are named with the
# prefixes "a_" and "b_".
TWO_NODES = (
    Case("bf16", 2, 8, 2, 300, 300, 128, True, "bshd", True),
    Case("fp16", 3, 8, 8, 700, 700, 64, True, "thd", True, "packed", "bottom_right", tokens_q=900, tokens_kv=1000),
)
