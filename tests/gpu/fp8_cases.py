"""The FP8 (e4m3) attention plans the GPU tests run: every head dim, mask shape, tile walk, O
dtype and descale form at least once, at sizes that are not multiples of the tiles; the padded
and packed forms (each sequence's Vᵀ through its own tensor map; packed V re-laid by the plan)
at every head dim; and a bf16
twin of the accuracy case, the yardstick for its error. Built on the CPU machine into
tests/.built/fp8 (`python -m tests.gpu.build_plans --only fp8`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fp8Case:
    id: str
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool = False
    alignment: str = "top_left"
    window_left: int | None = None
    window_right: int | None = None
    softcap: float | None = None
    lse: bool = True
    out: str = "bf16"  # O's dtype
    descales: str = "head"  # q and k per head, v per tensor; "tensor": all three per tensor
    dtype: str = "e4m3"  # "bf16": the accuracy case's twin (no descales)
    # variable lengths: "padded" (seq_q / seq_kv are the rows) or "packed" (they are max_seqlen_*)
    form: str = "dense"
    tokens_q: int = 0  # packed: the buffers' tokens
    tokens_kv: int = 0
    lengths: str = "qkv"  # padded: which sides have per-sequence lengths ("q", "kv", "qkv")
    v_layout: str = "keys"  # dense and padded e4m3 V: "keys" innermost (Vᵀ), or "rows" (d innermost: re-laid)
    o_accumulation: str = "tensor_cores"  # "float32": O summed in float32 every few key blocks


def cases() -> list[Fp8Case]:
    return [
        # non-causal, GQA, odd lengths; the accuracy case and its bf16 twin
        Fp8Case("fp8-d128-full", 2, 8, 2, 333, 1555, 128),
        Fp8Case("bf16-d128-full", 2, 8, 2, 333, 1555, 128, dtype="bf16", descales="none"),
        Fp8Case("fp8-d128-full-fp16-tensor", 1, 4, 4, 257, 129, 128, out="fp16", descales="tensor", lse=False),
        # causal through each walk: pairs (few query blocks), the counter, one CTA per tile
        Fp8Case("fp8-d128-causal-paired", 2, 4, 1, 1000, 1000, 128, causal=True),
        Fp8Case("fp8-d128-causal-dynamic", 1, 6, 2, 2500, 2500, 128, causal=True),
        Fp8Case("fp8-d128-causal-per_tile", 1, 2, 1, 8300, 8300, 128, causal=True),
        # three consumers (192-row tiles of 96-key blocks, rows of 8k keys and more): causal (the
        # per_tile case above), a diagonal offset by a number of keys no block divides, V re-laid in
        # P's order; and non-causal, where 89 tiles of 192 rows take one turn of the SMs and 133 of
        # 128 two (the rule of frostc.ops.sdpa._three_consumers)
        Fp8Case("fp8-d128-causal-m192-br-vrows", 1, 4, 2, 700, 9001, 128, causal=True, alignment="bottom_right",
                v_layout="rows"),
        Fp8Case("fp8-d128-full-m192", 1, 1, 1, 17000, 8200, 128),
        # packed with a key capacity of 8k and more: three consumers, causal and not
        Fp8Case("fp8-d128-packed-causal-m192", 3, 4, 2, 9000, 9000, 128, causal=True, form="packed",
                tokens_q=12001, tokens_kv=12001),
        Fp8Case("fp8-d128-packed-full-m192", 2, 2, 1, 8200, 8200, 128, form="packed", tokens_q=9000,
                tokens_kv=9000, lse=False),
        # O summed in float32 every few blocks (o_accumulation): a long key run (test_fp8_v_with_a_mean),
        # each tile walk (the per_tile case with three consumers, as its 16-bit-O twin above),
        # bottom-right rows with no reference yet, and the varlen forms with a window
        Fp8Case("fp8-d128-full-long-f32", 1, 2, 1, 200, 16000, 128, o_accumulation="float32"),
        Fp8Case("fp8-d128-causal-per_tile-f32", 1, 2, 1, 8300, 8300, 128, causal=True, o_accumulation="float32"),
        Fp8Case("fp8-d128-causal-dynamic-f32", 1, 6, 2, 2500, 2500, 128, causal=True, o_accumulation="float32"),
        Fp8Case("fp8-d128-causal-bottom_right-f32", 2, 4, 2, 200, 701, 128, causal=True, alignment="bottom_right",
                o_accumulation="float32"),
        Fp8Case("fp8-d128-packed-local-softcap-f32", 4, 4, 2, 900, 900, 128, causal=True, window_left=255,
                softcap=50.0, form="packed", tokens_q=3000, tokens_kv=3000, o_accumulation="float32"),
        Fp8Case("fp8-d128-padded-causal-vrows-f32", 6, 8, 2, 700, 801, 128, causal=True, form="padded",
                v_layout="rows", o_accumulation="float32"),
        Fp8Case("fp8-d128-causal-bottom_right", 2, 4, 2, 200, 701, 128, causal=True, alignment="bottom_right"),
        # windows and softcap (Gemma 2's local layers)
        Fp8Case("fp8-d128-local-softcap", 1, 4, 2, 900, 900, 128, causal=True, window_left=255, softcap=50.0),
        Fp8Case("fp8-d128-window-both", 1, 2, 2, 611, 611, 128, window_left=100, window_right=37),
        # the other head dims
        Fp8Case("fp8-d64-full", 2, 4, 2, 300, 777, 64),
        Fp8Case("fp8-d64-causal", 1, 4, 4, 1025, 1025, 64, causal=True),
        Fp8Case("fp8-d256-full", 1, 4, 2, 190, 651, 256),
        Fp8Case("fp8-d256-causal", 1, 2, 1, 700, 700, 256, causal=True, descales="tensor"),
        # 96-key blocks: the diagonal crosses a block inside a 128-row tile; the counter's walk
        Fp8Case("fp8-d256-causal-dynamic", 1, 2, 2, 1999, 1999, 256, causal=True),
        # variable lengths (tests/gpu/test_fp8_varlen.py): each form at each head dim, masks across them
        Fp8Case("fp8-d128-packed-causal", 6, 8, 2, 700, 800, 128, causal=True, form="packed",
                tokens_q=2001, tokens_kv=2300),
        Fp8Case("fp8-d128-packed-local-softcap", 4, 4, 2, 900, 900, 128, causal=True, window_left=255,
                softcap=50.0, form="packed", tokens_q=2500, tokens_kv=2500, descales="tensor"),
        Fp8Case("fp8-d64-packed-window", 5, 4, 1, 600, 700, 64, window_left=100, window_right=37, form="packed",
                tokens_q=1500, tokens_kv=1999, lse=False),
        Fp8Case("fp8-d256-packed-full", 3, 2, 1, 500, 650, 256, form="packed", tokens_q=1111, tokens_kv=1500,
                out="fp16"),
        # more sequences than vt_pack keeps in shared memory (1024): the rest searched in the table
        Fp8Case("fp8-d64-packed-many", 1100, 2, 1, 8, 8, 64, causal=True, form="packed", tokens_q=3001,
                tokens_kv=3001, lse=False),
        Fp8Case("fp8-d128-padded-causal", 6, 8, 2, 700, 801, 128, causal=True, form="padded"),
        Fp8Case("fp8-d128-padded-full", 3, 4, 4, 333, 1000, 128, out="fp16", descales="tensor", form="padded"),
        Fp8Case("fp8-d128-padded-local-softcap", 4, 4, 2, 900, 900, 128, causal=True, window_left=255,
                softcap=50.0, form="padded"),
        Fp8Case("fp8-d64-padded-window", 5, 4, 1, 600, 700, 64, window_left=100, window_right=37, form="padded",
                lse=False),
        Fp8Case("fp8-d64-padded-causal-br", 4, 4, 2, 300, 500, 64, causal=True, alignment="bottom_right",
                form="padded", lengths="kv"),
        Fp8Case("fp8-d256-padded-full", 3, 2, 1, 500, 650, 256, form="padded"),
        Fp8Case("fp8-d256-padded-causal", 3, 2, 2, 400, 400, 256, causal=True, form="padded", lengths="q"),
        # V given with d innermost ("bshd", like q and k): re-laid as Vᵀ by the plan (vt_pack, batched)
        Fp8Case("fp8-d128-full-vrows", 2, 8, 2, 333, 1555, 128, v_layout="rows"),
        Fp8Case("fp8-d64-causal-vrows", 3, 4, 1, 500, 700, 64, causal=True, alignment="bottom_right",
                v_layout="rows", lse=False),
        Fp8Case("fp8-d256-full-vrows", 1, 4, 2, 190, 651, 256, descales="tensor", v_layout="rows"),
        Fp8Case("fp8-d128-padded-causal-vrows", 6, 8, 2, 700, 801, 128, causal=True, form="padded",
                v_layout="rows"),
        Fp8Case("fp8-d64-padded-window-vrows", 5, 4, 1, 600, 700, 64, window_left=100, window_right=37,
                form="padded", v_layout="rows", out="fp16"),
    ]  # fmt: skip


def v_pitch(seq_kv: int) -> int:
    """Elements between Vᵀ's rows (a TMA stride is a multiple of 16 bytes)."""
    return -(-seq_kv // 16) * 16


def description(case: Fp8Case):
    """Q and K "bshd", V transposed (keys innermost, as the FP8 kernel reads it) or "bshd" too
    (`v_layout` "rows": the plan re-lays it), O "bshd"; or the packed form's (t, h, d) tensors
    (V as given: the plan re-lays it)."""
    from frostc import GraphBuilder  # the build machine's (the GPU machine has no CuTe DSL)

    if case.form == "packed":
        return _packed_description(case, GraphBuilder(case.id))
    g = GraphBuilder(case.id)
    b, hq, hkv, d = case.batch, case.heads_q, case.heads_kv, case.head_dim
    g.tensor("q", dtype=case.dtype, dims=(b, hq, case.seq_q, d), layout="bshd")
    g.tensor("k", dtype=case.dtype, dims=(b, hkv, case.seq_kv, d), layout="bshd")
    if case.dtype == "e4m3" and case.v_layout == "keys":  # Vᵀ rows of whole 16-byte pieces: keys padded
        pitch = v_pitch(case.seq_kv)
        g.tensor("v", dtype="e4m3", dims=(b, hkv, case.seq_kv, d), strides=(hkv * d * pitch, d * pitch, 1, pitch))
    else:
        g.tensor("v", dtype=case.dtype, dims=(b, hkv, case.seq_kv, d), layout="bshd")
    g.tensor("o", dtype=case.out if case.dtype == "e4m3" else case.dtype, dims=(b, hq, case.seq_q, d), layout="bshd")
    if case.lse:
        g.tensor("lse", dtype="fp32", dims=(b, hq, case.seq_q))
    lengths = {}
    if case.form == "padded":
        for side in {"qkv": ("q", "kv"), "q": ("q",), "kv": ("kv",)}[case.lengths]:
            g.tensor(f"{side}_lengths", dtype="int32", dims=(b,))
            lengths[f"seq_len_{side}"] = f"{side}_lengths"
    return _node(case, g, lengths)


def _packed_description(case: Fp8Case, g):
    hq, hkv, d, tq, tkv = case.heads_q, case.heads_kv, case.head_dim, case.tokens_q, case.tokens_kv
    for name, dims in (("q", (tq, hq, d)), ("k", (tkv, hkv, d)), ("v", (tkv, hkv, d))):
        g.tensor(name, dtype="e4m3", dims=dims)
    g.tensor("o", dtype=case.out, dims=(tq, hq, d))
    if case.lse:
        g.tensor("lse", dtype="fp32", dims=(tq, hq), layout="ht")
    for side in ("q", "kv"):
        g.tensor(f"{side}_lengths", dtype="int32", dims=(case.batch + 1,))
    lengths = dict(cu_seqlens_q="q_lengths", cu_seqlens_kv="kv_lengths", max_seqlen_q=case.seq_q,
                   max_seqlen_kv=case.seq_kv)  # fmt: skip
    return _node(case, g, lengths)


def _node(case: Fp8Case, g, lengths: dict):
    """The descales (e4m3) and the sdpa node."""
    descales = {}
    if case.dtype == "e4m3":
        per_head = case.descales == "head"
        for role, heads in (("q", case.heads_q), ("k", case.heads_kv), ("v", 1)):
            g.tensor(f"{role}_descale", dtype="fp32", dims=(heads if per_head else 1,))
            descales[f"{role}_descale"] = f"{role}_descale"
    g.sdpa(
        q="q", k="k", v="v", o="o", lse="lse" if case.lse else None,
        causal=case.causal or None,
        diagonal_alignment=None if case.alignment == "top_left" else case.alignment,
        window_left=case.window_left, window_right=case.window_right, softcap=case.softcap,
        o_accumulation=None if case.o_accumulation == "tensor_cores" else case.o_accumulation,
        **descales, **lengths,
    )  # fmt: skip
    return g.build()
