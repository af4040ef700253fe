"""compute-sanitizer (memcheck, racecheck, synccheck) over one small plan of every kernel variant.

    python bench/sanitize.py build              # CPU machine: the plans into bench/.built/sanitize
    python bench/sanitize.py run [--tools ...] [--only PIECE,...] [--plans DIR]  # GPU machine: a table

Run it after every kernel change (README's development notes). The plans cover every tile walk
(static persistent, per tile, paired, dynamic), every mask kind (causal top-left and
bottom-right, left and two-sided windows, softcap), each head dim (96: the `d96` group, in every
form; q/k 192 with v 128: `d192`), the dense, padded and packed forms (with the scheduling
kernel), paged decode split and unsplit (with the combine kernel), kv_append alone (its rows,
packed and slots forms, each over a 16-bit and an e4m3 cache), the glue kernels and the FP8
kernel's variants (dense, padded and packed).
Sizes are small, odd where it matters, and large enough that each walk is the one its rule
picks. Inputs come from the GPU tests' buffers (tests/gpu/support.py, fp8_support.py,
append_support.py): fresh random values, lengths drawn within each plan's contracts, outputs
poisoned; each plan's result is also checked against float64 under the tool (an append's caches:
bitwise against the spec).

`run` starts the tools side by side, each in `--shards` processes (`launch`), each of which runs
its share of the plans in turn and prints a marker line before and after each; the sanitizer's
reports between two markers belong to that plan.
The tools check only frostc's kernels (`--kernel-name kns=frostc_`: every entry is named
frostc_<variant>). racecheck runs with `--racecheck-report all` (every hazard, not only the
analysed races). Full logs go to $OUT when it is set (the device tool's folder), else to
bench/.built/sanitize.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import common  # first: the repository (tests.gpu) on the path

from tests.gpu.append_cases import AppendCase
from tests.gpu.cases import Case
from tests.gpu.decode_cases import DecodeCase
from tests.gpu.fp8_cases import Fp8Case
from tests.gpu.glue_support import GlueCase
from tests.gpu.mixed_cases import MixedCase

BUILT = common.BUILT / "sanitize"

TOOLS = ("memcheck", "racecheck", "synccheck")
SANITIZER = "/usr/local/cuda/bin/compute-sanitizer"
MARK = "@@sanitize"


@dataclass(frozen=True)
class Target:
    """One plan and what it covers (the table's row)."""

    label: str
    covers: str
    sdpa: Case | None = None
    decode: DecodeCase | None = None
    glue: GlueCase | None = None
    fp8: Fp8Case | None = None
    append: AppendCase | None = None
    mixed: MixedCase | None = None

    @property
    def plan(self) -> str:
        return f"{self.label}.frost"


def _dense(dtype, b, hq, hkv, sq, skv, d, causal, layout="bshd", lse=True, **kw) -> Case:
    return Case(dtype, b, hq, hkv, sq, skv, d, causal, layout, lse, **kw)


def _new_head_dim_forward(d: int, dv: int = 0) -> list[Target]:
    """The forward kernel's three targets of a new head dim (`dv`: v's and o's where not d): the
    static walk, the dynamic walk with bottom-right causal and softcap, the packed form with a
    window and sinks."""
    label, words = f"d{d}", f"d={d}" + (f"/{dv}" if dv else "")
    v = {"head_dim_v": dv} if dv else {}
    return [
        Target(f"{label}-dense-full", f"{words}, static walk, GQA, LSE",
               _dense("bf16", 2, 8, 2, 300, 333, d, False, **v)),
        Target(f"{label}-dense-dynamic-br", f"{words}, bottom-right causal, softcap, dynamic walk, rows without keys",
               _dense("fp16", 1, 8, 4, 2500, 2000, d, True, "bhsd", alignment="bottom_right", softcap=50.0, **v)),
        Target(f"{label}-packed-window-sinks", f"{words}, packed, causal, window, sinks",
               Case("bf16", 4, 8, 2, 500, 600, d, True, "thd", True, "packed", window_left=127, tokens_q=1100,
                    tokens_kv=1300, sinks=True, **v)),
    ]  # fmt: skip


def targets() -> list[Target]:
    """Every kernel variant once (the walk each rule picks is named in `covers`)."""
    t = Target
    return [
        # dense: each head dim's tiles, the static persistent walk
        t("dense-d64-full", "static walk, 3 consumers", _dense("fp16", 2, 4, 1, 300, 333, 64, False)),
        t("dense-d128-full", "static walk, O buffer", _dense("bf16", 1, 4, 2, 500, 777, 128, False, "bhsd")),
        t("dense-d256-full", "static walk, O through Q", _dense("bf16", 1, 2, 2, 300, 300, 256, False, lse=False)),
        # the causal walks
        t("dense-d128-paired", "causal, paired walk", _dense("bf16", 2, 4, 4, 700, 700, 128, True)),
        t("dense-d128-dynamic", "causal, dynamic walk", _dense("bf16", 1, 4, 2, 2000, 2000, 128, True, "bhsd")),
        t("dense-d64-dynamic", "causal, dynamic walk, 3 consumers", _dense("fp16", 1, 4, 1, 3000, 3000, 64, True)),
        t("dense-d256-dynamic-br", "bottom-right causal, dynamic walk, empty tiles",
          _dense("bf16", 1, 2, 2, 2500, 1000, 256, True, alignment="bottom_right")),
        t("dense-d256-per-tile", "causal, one CTA per tile", _dense("bf16", 1, 1, 1, 4100, 4100, 256, True, lse=False)),
        # the other mask kinds
        t("mask-d128-br", "bottom-right causal, unseen blocks",
          _dense("bf16", 1, 4, 1, 300, 1000, 128, True, alignment="bottom_right")),
        t("mask-d64-window", "sliding window (2 consumers)",
          _dense("fp16", 2, 4, 4, 777, 777, 64, True, window_left=100)),
        t("mask-d128-two-sided", "two-sided window", _dense("bf16", 1, 4, 4, 600, 600, 128, False,
          window_left=60, window_right=30)),
        t("mask-d256-softcap", "softcap", _dense("bf16", 1, 2, 1, 500, 500, 256, False, softcap=30.0)),
        t("mask-d128-window-softcap", "window + softcap, bottom-right",
          _dense("fp16", 1, 4, 2, 300, 900, 128, True, alignment="bottom_right", window_left=200, softcap=50.0)),
        # variable lengths: the scheduling kernel and the listed walk
        t("padded-d128-causal", "padded, schedule kernel",
          _dense("bf16", 3, 4, 1, 500, 600, 128, True, form="padded")),
        t("packed-d64-br", "packed, bottom-right causal", Case("fp16", 4, 4, 2, 500, 600, 64, True, "thd", True,
          "packed", "bottom_right", tokens_q=1100, tokens_kv=1300)),
        t("packed-d256-window", "packed, window", Case("bf16", 3, 2, 2, 400, 400, 256, False, "thd", False,
          "packed", window_left=60, window_right=30, tokens_q=900, tokens_kv=900)),
        t("padded-d128-softcap", "padded, softcap", _dense("fp16", 2, 4, 4, 300, 300, 128, False, form="padded",
          lengths="kv", softcap=40.0)),
        # attention sinks (gpt-oss): the epilogue's sink term, rows with no key (the sink's LSE)
        t("sinks-d64-window-br", "sinks, window, bottom-right (rows without keys)",
          _dense("bf16", 1, 8, 1, 700, 300, 64, True, alignment="bottom_right", window_left=127, sinks=True)),
        t("sinks-packed-d128", "sinks, packed", Case("fp16", 3, 8, 2, 400, 500, 128, True, "thd", True,
          "packed", tokens_q=900, tokens_kv=1200, sinks=True)),
        t("sinks-d128-dynamic", "sinks, causal, dynamic walk",
          _dense("bf16", 1, 4, 2, 2000, 2000, 128, True, "bhsd", sinks=True)),
        t("sinks-decode-split", "sinks, paged decode split-KV + the combine's sink",
          decode=DecodeCase("bf16", 1, 64, 8, 64, 16, 512, 1, True, True, "bshd", sinks=True)),
        t("sinks-decode-unsplit", "sinks, paged decode in one launch, window, s_new 4",
          decode=DecodeCase("fp16", 3, 16, 2, 64, 32, 32, 4, True, True, "bhsd", window_left=127, sinks=True)),
        t("sinks-mixed-chunks", "sinks, mixed form: chunks on the forward kernel, unsplit decodes",
          mixed=MixedCase("bf16", 6, 400, 160, 32, 4, 64, 16, 40, True, lse="th", window_left=127, sinks=True)),
        t("sinks-mixed-adaptive", "sinks, mixed form: decodes split adaptively (direct rows + the combine's sink)",
          mixed=MixedCase("bf16", 6, 200, 64, 32, 4, 64, 16, 320, True, lse="ht", window_left=2500, sinks=True)),
        # head dim 96 (Phi-3): 64-byte swizzled tiles, the O store 4 threads a row
        *_new_head_dim_forward(96),
        # ... and over a paged cache: the decode kernel's and the paged forward kernel's three 32-wide
        # TMA boxes a row, the combine's 10 groups of 24 threads (16 idle), kv_append's 12 pieces a row
        t("d96-decode-split-sinks", "d=96, kv_append + split-KV + combine, sinks",
          decode=DecodeCase("fp16", 1, 32, 8, 96, 16, 512, 1, True, True, "bhsd", sinks=True)),
        t("d96-decode-window-softcap", "d=96, one launch, window + softcap, pages of 256, s_new 3",
          decode=DecodeCase("bf16", 3, 16, 2, 96, 256, 4, 3, True, True, "bshd", window_left=300, softcap=50.0)),
        t("d96-decode-e4m3-few-rows", "d=96, e4m3 cache: quantizing kv_append, transposed MMAs, split + combine",
          decode=DecodeCase("bf16", 4, 32, 8, 96, 16, 64, 1, False, True, "bshd", cache="e4m3")),
        t("d96-decode-e4m3-rows", "d=96, e4m3 cache, 21 rows (two row blocks), one launch",
          decode=DecodeCase("bf16", 2, 28, 4, 96, 16, 24, 3, True, True, "bhsd", cache="e4m3")),
        t("d96-mixed-chunks-adaptive", "d=96, mixed form: packed append, chunks on the forward kernel over the "
          "pages, decodes split adaptively, window, sinks",
          mixed=MixedCase("bf16", 6, 200, 64, 32, 8, 96, 16, 320, True, lse="ht", window_left=2047, append=True,
                          sinks=True)),
        t("d96-mixed-chunks-p64-mha", "d=96, mixed form, chunks on the forward kernel over pages of 64, MHA",
          mixed=MixedCase("bf16", 4, 300, 150, 16, 16, 96, 64, 12, True, lse="th")),
        t("d96-kv-append-slots-e4m3", "d=96, kv_append slots, e4m3 cache, pages of 256",
          append=AppendCase("slots", "fp16", 4, 2, 96, 256, 4, 500, cache="e4m3")),
        # q/k head dim 192 with v 128 (DeepSeek's prefill): O staged in each consumer's part of Q's buffer
        *_new_head_dim_forward(192, 128),
        # paged decode
        t("decode-split", "kv_append + split-KV + combine",
          decode=DecodeCase("bf16", 1, 8, 2, 128, 16, 512, 1, True, True, "bshd")),
        t("decode-unsplit", "kv_append + one launch, MQA, s_new 4, causal",
          decode=DecodeCase("fp16", 5, 8, 1, 64, 32, 8, 4, True, False, "bshd")),
        t("decode-d256", "d=256, several new tokens", decode=DecodeCase("bf16", 2, 8, 2, 256, 64, 8, 4, True, True,
          "bshd", "sdpa")),
        t("decode-window-split", "sliding window, split over the window + combine",
          decode=DecodeCase("bf16", 1, 32, 8, 128, 16, 512, 1, True, True, "bshd", window_left=1000)),
        t("decode-window-softcap", "window + softcap, d=256, s_new 4 (Gemma-2 local)",
          decode=DecodeCase("bf16", 2, 16, 8, 256, 32, 64, 4, True, True, "bshd", window_left=100, softcap=50.0)),
        # an e4m3 cache (quantizing append; the decode kernel's warp-level MMAs over converted rows)
        t("decode-e4m3-split", "e4m3 cache, head scales: quantizing kv_append + split-KV + combine",
          decode=DecodeCase("bf16", 1, 8, 2, 128, 16, 512, 1, True, True, "bshd", cache="e4m3")),
        t("decode-e4m3-d64-few-rows", "e4m3 cache, d=64, a group of 8 by one token (the transposed MMAs)",
          decode=DecodeCase("fp16", 3, 16, 2, 64, 16, 64, 1, False, False, "bhsd", cache="e4m3")),
        t("decode-e4m3-unsplit", "e4m3 cache, one scale: kv_append + one launch, d=64, s_new 4",
          decode=DecodeCase("fp16", 5, 8, 1, 64, 32, 8, 4, True, False, "bshd", cache="e4m3", scales="tensor")),
        t("decode-e4m3-window-softcap", "e4m3 cache, window + softcap, d=256 (Gemma-2 local)",
          decode=DecodeCase("bf16", 2, 16, 8, 256, 32, 64, 1, True, True, "bshd", window_left=100, softcap=50.0,
                            cache="e4m3")),
        t("kv-append", "kv_append alone", decode=DecodeCase("bf16", 4, 8, 8, 128, 16, 16, 4, False, False, "bhsd",
          "append")),
        # kv_append's ragged forms: one CTA per token, packed (each finds its sequence in cu_seqlens_q) or by slot
        t("kv-append-packed", "kv_append packed (each token finds its sequence in cu_seqlens_q), page table",
          append=AppendCase("packed", "bf16", 5, 2, 128, 16, 16, 97)),
        t("kv-append-packed-e4m3", "kv_append packed, e4m3 cache (one scale), d=64, pages of 256, k/v halves of one "
          "buffer", append=AppendCase("packed", "fp16", 3, 2, 64, 256, 2, 130, cache="e4m3", scales="tensor",
                                      rows="fused")),
        t("kv-append-slots", "kv_append slots (slot_mapping), d=256, pages of 256, HND caches",
          append=AppendCase("slots", "bf16", 3, 2, 256, 256, 2, 111, cache_layout="phsd")),
        t("kv-append-slots-e4m3", "kv_append slots, e4m3 cache (head scales)",
          append=AppendCase("slots", "bf16", 4, 8, 128, 16, 8, 90, cache="e4m3")),
        # the decode step's glue (fused layers): a row that leaves threads idle, Llama-3-8B's rows
        t("glue-rms-norm", "rms_norm, 904-wide rows (most threads hold no piece)", glue=GlueCase("rms_norm", 3, 904)),
        t("glue-add-rms-norm", "rms_norm after a residual add, 4096-wide rows", glue=GlueCase("add_rms_norm", 5, 4096)),
        t("glue-silu-mul", "silu_mul, an MLP of 14336", glue=GlueCase("silu_mul", 3, 14336)),
        # FP8 dense (e4m3 Q, K, Vᵀ; P packed and swapped in the quad): each head dim's tiles and walk
        t("fp8-d128-full", "e4m3, static walk, head descales", fp8=Fp8Case("s", 1, 4, 2, 333, 555, 128)),
        t("fp8-d128-paired", "e4m3, causal, paired walk", fp8=Fp8Case("s", 2, 4, 1, 700, 700, 128, causal=True)),
        t("fp8-d128-dynamic", "e4m3, causal, dynamic walk",
          fp8=Fp8Case("s", 1, 4, 2, 2000, 2000, 128, causal=True, descales="tensor")),
        t("fp8-d256-per-tile", "e4m3, causal, one CTA per tile, d=256",
          fp8=Fp8Case("s", 1, 1, 1, 6200, 6200, 256, causal=True, lse=False)),
        t("fp8-d256-dynamic", "e4m3, causal, dynamic walk, d=256 (96-key blocks across the diagonal)",
          fp8=Fp8Case("s", 1, 2, 1, 1999, 1999, 256, causal=True)),
        t("fp8-d256-full", "e4m3, static walk, d=256", fp8=Fp8Case("s", 2, 2, 2, 333, 301, 256)),
        t("fp8-d64-full", "e4m3, 3 consumers", fp8=Fp8Case("s", 2, 4, 1, 300, 333, 64, out="fp16")),
        t("fp8-d64-window", "e4m3, sliding window (2 consumers)",
          fp8=Fp8Case("s", 2, 4, 4, 777, 777, 64, causal=True, window_left=100)),
        t("fp8-d128-window-softcap-br", "e4m3, window + softcap, bottom-right, fp16 O",
          fp8=Fp8Case("s", 1, 4, 2, 300, 900, 128, causal=True, alignment="bottom_right", window_left=200,
                      softcap=50.0, out="fp16", descales="tensor")),
        # FP8 with three consumers (192-row tiles of 96-key blocks: rows of 8k keys and more)
        t("fp8-d128-m192-causal-br", "e4m3, 3 consumers, causal bottom-right, one CTA per tile",
          fp8=Fp8Case("s", 1, 2, 1, 300, 8300, 128, causal=True, alignment="bottom_right")),
        t("fp8-d128-m192-full", "e4m3, 3 consumers, static walk (89 tiles: one turn of the SMs)",
          fp8=Fp8Case("s", 1, 1, 1, 16900, 8192, 128, descales="tensor")),
        t("fp8-d128-m192-packed", "e4m3, 3 consumers, packed (a key capacity of 8,300), causal",
          fp8=Fp8Case("s", 2, 2, 1, 8300, 8300, 128, causal=True, form="packed", tokens_q=8700, tokens_kv=8700)),
        t("fp8-d128-m192-f32", "e4m3, 3 consumers, O in float32, causal bottom-right, one CTA per tile",
          fp8=Fp8Case("s", 1, 2, 1, 300, 8300, 128, causal=True, alignment="bottom_right", o_accumulation="float32")),
        # FP8 variable lengths: the scheduling kernel writes each sequence's Vᵀ map, V loads through it
        t("fp8-d128-padded", "e4m3, padded, causal, per-sequence Vᵀ maps",
          fp8=Fp8Case("s", 5, 4, 2, 300, 401, 128, causal=True, form="padded")),
        t("fp8-d128-packed", "e4m3, packed: V re-laid (vt_pack), per-sequence Vᵀ maps",
          fp8=Fp8Case("s", 5, 4, 2, 300, 400, 128, causal=True, form="packed", tokens_q=901, tokens_kv=1111)),
        t("fp8-d64-padded", "e4m3, padded, window, 3 consumers",
          fp8=Fp8Case("s", 3, 4, 1, 333, 500, 64, window_left=70, form="padded")),
        t("fp8-d256-padded", "e4m3, padded, causal bottom-right, d=256",
          fp8=Fp8Case("s", 3, 2, 2, 200, 450, 256, causal=True, alignment="bottom_right", form="padded",
                      lengths="kv")),
        # FP8 with O summed in float32 every few key blocks (o_accumulation = "float32")
        t("fp8-d128-f32-dynamic", "e4m3, O in float32, causal, dynamic walk",
          fp8=Fp8Case("s", 1, 4, 2, 2000, 2000, 128, causal=True, descales="tensor", o_accumulation="float32")),
        t("fp8-d128-f32-packed-br", "e4m3, O in float32, packed, window + softcap, bottom-right",
          fp8=Fp8Case("s", 5, 4, 2, 300, 900, 128, causal=True, alignment="bottom_right", window_left=200,
                      softcap=50.0, form="packed", tokens_q=901, tokens_kv=2600, o_accumulation="float32")),
        # FP8 with V given d innermost: vt_pack's batched variant re-lays it first
        t("fp8-d128-vrows", "e4m3, V re-laid (vt_pack batched), then the static walk",
          fp8=Fp8Case("s", 2, 4, 2, 333, 555, 128, v_layout="rows")),
        t("fp8-d64-padded-vrows", "e4m3, padded, V re-laid (vt_pack batched), per-sequence Vᵀ maps",
          fp8=Fp8Case("s", 3, 4, 1, 333, 500, 64, window_left=70, form="padded", v_layout="rows")),
        # the mixed form: packed queries over a paged cache, through the paged kernel's packed variants
        t("mixed-split", "mixed form, decode-sized: packed queries, split-KV + the packed combine",
          mixed=MixedCase("bf16", 5, 20, 4, 16, 4, 128, 16, 64, True, lse="th")),
        t("mixed-chunks", "mixed form, chunks and decodes, window + softcap, LSE (hq, tokens)",
          mixed=MixedCase("bf16", 4, 300, 150, 8, 2, 64, 64, 8, True, lse="ht", window_left=90, softcap=30.0)),
        # the chunks apart (16-bit caches): the decodes on the paged kernel, the chunks on the
        # forward kernel over the pages (bench/NOTES.md, mixed v3)
        t("mixed-chunks-split-p16", "mixed form, chunks on the forward kernel (pages of 16), decodes split adaptively",
          mixed=MixedCase("bf16", 6, 256, 128, 32, 8, 128, 16, 256, True, lse="th")),
        t("mixed-chunks-d256", "mixed form, chunks on the forward kernel at d 256, window + softcap",
          mixed=MixedCase("bf16", 4, 200, 120, 16, 2, 256, 16, 40, True, window_left=100, softcap=30.0)),
        t("mixed-chunks-p48", "mixed form, chunks on the forward kernel over pages of 48 (not a key block's divisor)",
          mixed=MixedCase("fp16", 5, 300, 160, 16, 4, 128, 48, 12, True, lse="th", cache_layout="vllm_hnd")),
        t("mixed-chunks-p256", "mixed form, chunks on the forward kernel over pages of 256, MHA, not causal",
          mixed=MixedCase("fp16", 5, 300, 160, 8, 8, 128, 256, 4, False)),
        t("mixed-e4m3", "mixed form, e4m3 cache, per-head scales",
          mixed=MixedCase("bf16", 4, 40, 12, 16, 4, 128, 32, 12, True, lse="th", cache="e4m3")),
        t("mixed-e4m3-few-rows-split", "mixed form, e4m3 cache, few rows (transposed MMAs), split + combine",
          mixed=MixedCase("fp16", 5, 10, 1, 8, 1, 64, 16, 64, True, cache="e4m3", scales="tensor")),
        # an e4m3 cache's chunks on the forward kernel that converts the pages (the converter warps,
        # the raw ring, the "converted" barriers): d=128 over pages of 16, d=256 at the smem limit
        t("mixed-e4m3-chunks", "mixed form, e4m3 cache, chunks converted by the forward kernel, d=128, pages of 16",
          mixed=MixedCase("bf16", 4, 300, 160, 16, 4, 128, 16, 24, True, lse="th", cache="e4m3")),
        # ... with the decodes split adaptively: a short decode's one split written directly by the
        # e4m3 decode kernel (its O was left unwritten before: NaN in the GPU case, H100 2026-12-07)
        t("mixed-e4m3-chunks-split", "mixed form, e4m3 cache, chunks converted, decodes split adaptively, pages of 64",
          mixed=MixedCase("bf16", 8, 64, 16, 32, 8, 128, 64, 32, True, lse="th", cache="e4m3")),
        t("mixed-e4m3-chunks-d256", "mixed form, e4m3 cache, chunks converted, d=256, window + softcap",
          mixed=MixedCase("bf16", 3, 200, 120, 8, 2, 256, 16, 20, True, window_left=100, softcap=30.0, cache="e4m3")),
    ]  # fmt: skip


# ------------------------------------------------------------------------------ build (CPU)


def _chosen(label: str, only: str) -> bool:
    """`only`: comma-separated pieces of labels ("mixed,d96"); empty chooses every target."""
    return any(piece in label for piece in only.split(","))


def build(plans: Path, only: str) -> int:
    from frostc.build import build as build_plan
    from frostc.planfile import write_atomic
    from tests.gpu import fp8_cases
    from tests.gpu.build_plans import append_description, decode_description, description, mixed_description
    from tests.gpu.glue_support import glue_description

    plans.mkdir(parents=True, exist_ok=True)
    manifest = []
    start = time.time()
    chosen = [t for t in targets() if _chosen(t.label, only)]
    for i, target in enumerate(chosen):
        if target.glue is not None:
            desc = glue_description(target.glue)
        elif target.fp8 is not None:
            desc = fp8_cases.description(target.fp8)
        elif target.append is not None:
            desc = append_description(target.append)
        elif target.mixed is not None:
            desc = mixed_description(target.mixed)
        else:
            desc = description(target.sdpa) if target.sdpa else decode_description(target.decode)
        data = build_plan(desc)
        write_atomic(plans / target.plan, data)
        kernels = _kernel_names(data)
        manifest.append({"label": target.label, "covers": target.covers, "plan": target.plan, "kernels": kernels})
        print(f"[{i + 1}/{len(chosen)}] {target.label}: {', '.join(kernels)} ({time.time() - start:.0f} s)")
    write_atomic(plans / "manifest.json", json.dumps(manifest, indent=1).encode())
    return 0


def _kernel_names(data: bytes) -> list[str]:
    from frost_runtime.schema import decode_plan

    return [k.name for k in decode_plan(data).kernels]


# ------------------------------------------------------------------------------ launch (GPU, under a tool)


def _manifest(plans: Path, only: str, shard: tuple[int, int] = (0, 1)) -> list[dict]:
    """The chosen targets; of them, shard (i, n) takes every n-th from the i-th."""
    chosen = [e for e in json.loads((plans / "manifest.json").read_text()) if _chosen(e["label"], only)]
    index, count = shard
    return chosen[index::count]


def launch(plans: Path, only: str, shard: tuple[int, int] = (0, 1)) -> int:
    """Every plan once (a variable-length or decode plan: one drawn mix), markers around each."""
    import random
    import zlib

    import frost_runtime
    import torch

    from tests.gpu.append_support import AppendBuffers, draw_step, token_mixes
    from tests.gpu.decode_support import DecodeBuffers, length_mixes
    from tests.gpu.fp8_support import Fp8Run, Fp8VarlenRun, real_inputs
    from tests.gpu.glue_support import GlueBuffers
    from tests.gpu.mixed_support import MixedBuffers, draw_mix
    from tests.gpu.support import Buffers, draw_lengths

    by_label = {t.label: t for t in targets()}
    for entry in _manifest(plans, only, shard):
        target = by_label[entry["label"]]
        seed = zlib.crc32(target.label.encode())
        torch.manual_seed(seed)
        rng = random.Random(seed)
        print(f"{MARK} begin {target.label}", flush=True)
        verdict = "ok"
        try:
            with frost_runtime.load(plans / target.plan) as plan:
                if target.glue is not None:
                    buffers = GlueBuffers(target.glue, plan, seed)
                    buffers.execute()
                elif target.fp8 is not None:
                    case = asdict(target.fp8) | {"id": target.label}
                    gen = torch.Generator(device="cuda").manual_seed(seed)
                    if case["form"] == "dense":
                        buffers = Fp8Run(case, plan, real_inputs(case, gen, outliers=False))
                    else:
                        buffers = Fp8VarlenRun(case, plan, gen, draw_lengths(case, rng))
                    buffers.execute()
                elif target.append is not None:
                    case = asdict(target.append) | {"pages": target.append.pages, "capacity": target.append.capacity}
                    buffers = AppendBuffers(case, plan, seed)
                    buffers.write(draw_step(case, token_mixes(case, rng)[0], rng, holes=0.1))
                    buffers.execute()
                elif target.mixed is not None:
                    case = asdict(target.mixed) | {"pages": target.mixed.pages, "capacity": target.mixed.capacity}
                    buffers = MixedBuffers(case, plan, seed)
                    buffers.setup(*draw_mix(case, rng, "chunks"))
                    buffers.execute()
                elif target.sdpa is not None:
                    case = asdict(target.sdpa)
                    buffers = Buffers(case, plan)
                    if case["form"] != "dense":
                        buffers.set_lengths(*draw_lengths(case, rng))
                        buffers.refill()
                        buffers.poison_padding()
                    buffers.execute()
                else:
                    case = asdict(target.decode) | {"pages": target.decode.pages, "capacity": target.decode.capacity}
                    buffers = DecodeBuffers(case, plan, seed)
                    buffers.setup(length_mixes(case, rng, 1)[0])
                    buffers.execute()
                torch.cuda.synchronize()
                buffers.assert_correct()
        except Exception as exc:  # reported in the table; the other plans still run
            verdict = f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"{MARK} end {target.label} {verdict}", flush=True)
    return 0


# ------------------------------------------------------------------------------ run (GPU)


@dataclass
class ToolResult:
    reports: dict[str, int]  # plan label -> reports (errors and hazards) between its markers
    verdicts: dict[str, str]  # plan label -> "ok" or why its output check failed
    summary: str  # the tool's closing summary line
    exit_code: int


def run(tools: list[str], plans: Path, only: str, shards: int = 3, out: Path | None = None) -> int:
    """Every plan under each tool; the table and logs go to `out` (default: $OUT where set, else
    the plans' folder). Exit 0 only when every count is 0 and every output check passed."""
    out = out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else plans)
    out.mkdir(parents=True, exist_ok=True)
    labels = [e["label"] for e in _manifest(plans, only)]
    # every tool over every shard of the plans side by side, each its own process on the one GPU:
    # the wall is the slowest shard's (racecheck's), not the sum — device time is what a GPU
    # session runs short of
    jobs = [(tool, i) for tool in tools for i in range(shards)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        running = {
            (tool, i): pool.submit(
                _run_tool, tool, out / f"sanitize-{tool}-{i}.log",
                ["--plans", str(plans), "--only", only, "--shard", f"{i}/{shards}"],
            )
            for tool, i in jobs
        }  # fmt: skip
        results = {tool: _merged([running[tool, i].result() for i in range(shards)]) for tool in tools}
    for tool, r in results.items():
        print(f"{tool}: {r.summary} (exit {r.exit_code})", flush=True)
    table = _table(labels, tools, results)
    print(table)
    (out / "sanitize.md").write_text(table + "\n")
    clean = all(
        r.exit_code == 0 and not any(r.reports.values()) and set(r.verdicts) == set(labels)
        and all(v == "ok" for v in r.verdicts.values())
        for r in results.values()
    )  # fmt: skip
    print("all clean" if clean else "NOT CLEAN: see the table and the logs")
    return 0 if clean else 1


def _merged(shards: list[ToolResult]) -> ToolResult:
    """One tool's shards as one result: their counts and verdicts, their summaries side by side."""
    reports: dict[str, int] = {}
    for shard in shards:
        for label, count in shard.reports.items():
            reports[label] = reports.get(label, 0) + count
    verdicts = {label: v for shard in shards for label, v in shard.verdicts.items()}
    summary = " | ".join(shard.summary for shard in shards)
    return ToolResult(reports, verdicts, summary, max(shard.exit_code for shard in shards))


def _run_tool(tool: str, log: Path, selection: list[str]) -> ToolResult:
    command = [SANITIZER, "--tool", tool, "--kernel-name", "kns=frostc_", "--print-limit", "100000"]
    if tool == "racecheck":
        command += ["--racecheck-report", "all"]
    command += [sys.executable, str(Path(__file__).resolve()), "launch", *selection]
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=common.ROOT)
    text = done.stdout + done.stderr
    log.write_text(text)
    return _parse(text, done.returncode)


# a report's first line: "========= " then a word (not an indented frame, not a summary)
_REPORT = re.compile(r"^========= (?!ERROR SUMMARY|RACECHECK SUMMARY|COMPUTE-SANITIZER|Target application)\S")


def _parse(text: str, exit_code: int) -> ToolResult:
    reports: dict[str, int] = {}
    verdicts: dict[str, str] = {}
    summary = ""
    current = None
    for line in text.splitlines():
        if line.startswith(f"{MARK} begin "):
            current = line.split()[2]
            reports[current] = 0
        elif line.startswith(f"{MARK} end "):
            _, _, label, verdict = line.split(" ", 3)
            verdicts[label] = verdict
            current = None
        elif "SUMMARY" in line and line.startswith("========="):
            summary = line.removeprefix("=========").strip()
        elif _REPORT.match(line):
            reports[current or "(outside any plan)"] = reports.get(current or "(outside any plan)", 0) + 1
    return ToolResult(reports, verdicts, summary, exit_code)


def _table(labels: list[str], tools: list[str], results: dict[str, ToolResult]) -> str:
    covers = {t.label: t.covers for t in targets()}
    head = "| plan | covers | " + " | ".join(tools) + " | output |"
    rows = [head, "|" + "---|" * (len(tools) + 3)]
    for label in labels + [x for x in results[tools[0]].reports if x not in labels]:
        cells = [str(results[tool].reports.get(label, "-")) for tool in tools]
        verdicts = {results[tool].verdicts.get(label, "not run") for tool in tools}
        output = "; ".join(sorted(verdicts))
        rows.append(f"| {label} | {covers.get(label, '')} | " + " | ".join(cells) + f" | {output} |")
    return "\n".join(rows)


def _tools(text: str) -> list[str]:
    tools = [t for t in text.split(",") if t]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown tool(s) {', '.join(unknown)}; choose from {', '.join(TOOLS)}")
    return tools


def _shard(text: str) -> tuple[int, int]:
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise argparse.ArgumentTypeError(f"--shard takes I/N with 0 <= I < N, not {text!r}")
    return int(index), int(count)


def main(argv: list[str] | None = None) -> int:
    parser, commands = common.command_line(
        __doc__,
        run="the plans under every tool; a table (GPU machine)",
        launch="run the plans once each (what each tool's process runs)",
    )
    for command in commands.values():
        command.add_argument("--plans", type=Path, default=BUILT, help=f"the plans' folder (default {BUILT})")
        command.add_argument(
            "--only", default="", help="plans whose label holds one of these comma-separated pieces (default: all)"
        )
    commands["run"].add_argument(
        "--tools", type=_tools, default=",".join(TOOLS), help="comma-separated, default: all three"
    )
    commands["run"].add_argument(
        "--shards", type=int, default=3, help="processes per tool, each over every n-th plan (default 3)"
    )
    commands["launch"].add_argument("--shard", type=_shard, default=(0, 1), help="I/N: every N-th plan from the I-th")
    return common.dispatch(parser, {"build": build, "run": run, "launch": launch}, argv)


if __name__ == "__main__":
    sys.exit(main())
