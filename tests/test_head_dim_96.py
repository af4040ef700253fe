"""Head dim 96 (Phi-3, issue 44) on the CPU: the 16-bit forward kernel's dense, padded and packed
forms resolve to d=128's tiles at 96 (64-byte swizzled rows), every other form refuses 96 with the
field path and the dims it takes, the O store writes every column of a tile exactly once, and
every GPU case of tests/gpu/cases.py's `head_dim_96_cases` builds (its cubins compiled, its tensor
maps encoded). The results against float64 are tests/gpu/test_sdpa.py's."""

from __future__ import annotations

from collections import Counter

import pytest
from frost_runtime.schema import decode_plan

from frostc.build import build
from frostc.errors import DescriptionError
from frostc.kernels.sdpa_common import MaskFlags
from frostc.kernels.sdpa_fwd_wgmma import SdpaForwardWgmma, SdpaFwdVariant, WgmmaTiles, tiles_for_head_dim
from frostc.ops.rows import FORWARD_HEAD_DIMS, HEAD_DIMS
from frostc.resolve import resolve
from frostc.target import SM90A
from frostc.validate import validate
from tests.gpu.build_plans import decode_description, description, mixed_description
from tests.gpu.cases import Case, head_dim_96_cases
from tests.gpu.decode_cases import DecodeCase
from tests.gpu.fp8_cases import Fp8Case
from tests.gpu.fp8_cases import description as fp8_description
from tests.gpu.mixed_cases import MixedCase

D = 96
TILES = WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=2, o_buffer=True)


def launches(case: Case):
    return resolve(validate(description(case))).launches


def declined(desc) -> dict[str, str]:
    with pytest.raises(DescriptionError) as e:
        resolve(validate(desc))
    return {p.path: p.message for p in e.value.problems}


# ------------------------------------------------------------------------------ tiles and launches


def test_the_tiles_are_d128s_within_144_kib() -> None:
    assert tiles_for_head_dim(D, window_left=False) == tiles_for_head_dim(D, window_left=True) == TILES
    rows = 2 * D  # bytes of a 16-bit row
    q = o = TILES.block_m * rows
    ring = TILES.stages * 2 * TILES.block_n * rows  # K and V
    assert q + o + ring == 144 * 1024 <= SM90A.smem_per_cta


def test_a_dense_node_resolves_to_the_d96_variant_with_its_tiles_and_grid() -> None:
    (attention,) = launches(Case("bf16", 2, 8, 2, 1000, 1000, D, False, "bshd", True))
    variant = attention.variant
    assert variant.name == "sdpa_fwd_wgmma.bf16.d96.full.lse"
    assert variant.tile_shape == TILES and variant.block == (384, 1, 1)
    assert attention.grid == (8 * 8 * 2, 1, 1)  # ceil(1000 / 128) query blocks, 8 heads, 2 sequences
    assert variant.grid_rule.startswith("(min(ceil(seq_q / 128) * heads_q * batch, SMs * 1)")


@pytest.mark.parametrize(
    ("seq", "walk"),
    [(1000, "paired"), (2000, "dynamic"), (8200, "per_tile")],  # 8 query blocks; 16; 65 key blocks of 128
)
def test_causal_heads_take_the_walk_of_their_128_key_blocks(seq, walk) -> None:
    (attention,) = launches(Case("fp16", 1, 8, 2, seq, seq, D, True, "bshd", False))
    assert attention.variant.walk == walk
    assert attention.variant.name == f"sdpa_fwd_wgmma.fp16.d96.causal.{walk}"


def test_masks_sinks_and_lse_name_their_variant() -> None:
    case = Case("fp16", 1, 8, 2, 300, 900, D, True, "bshd", True, "dense", "bottom_right", 200, None, 50.0, sinks=True)
    (attention,) = launches(case)
    assert attention.variant.name == "sdpa_fwd_wgmma.fp16.d96.local_br.softcap.sinks.lse"


@pytest.mark.parametrize("form", ["padded", "packed"])
def test_variable_lengths_schedule_128_row_units_for_the_d96_kernel(form) -> None:
    extra = dict(tokens_q=3001, tokens_kv=2800) if form == "packed" else {}
    case = Case("bf16", 5, 16, 4, 1100, 1000, D, True, "thd" if form == "packed" else "bshd", True, form, **extra)
    schedule, attention = launches(case)
    assert (schedule.variant.block_m, schedule.variant.block_n) == (128, 128)
    assert attention.variant.name == "sdpa_fwd_wgmma.bf16.d96.causal.varlen.lse"
    assert attention.variant.tile_shape == TILES


# ------------------------------------------------------------------------------ what refuses 96


def _refused(found: dict[str, str], path: str, *words: str) -> None:
    assert path in found, found
    for word in ("head dim 96 is not supported", "supported: 64, 128, 256", "dense, padded and packed", *words):
        assert word in found[path], found[path]


def test_the_paged_form_refuses_96_at_q_dims() -> None:
    case = DecodeCase("bf16", 2, 8, 2, D, 16, 8, 1, True, True, "bshd", "sdpa")
    _refused(declined(decode_description(case)), "tensors.q.dims[3]", "in the paged form")


def test_the_mixed_form_refuses_96_at_q_dims() -> None:
    case = MixedCase("bf16", 4, 300, 150, 8, 2, D, 16, 40, True)
    _refused(declined(mixed_description(case)), "tensors.q.dims[2]", "in the mixed form")


def test_kv_append_refuses_96_at_k_dims() -> None:
    case = DecodeCase("bf16", 2, 8, 2, D, 16, 8, 1, True, True, "bshd", "append")
    _refused(declined(decode_description(case)), "tensors.k_new.dims[3]", "by kv_append")


@pytest.mark.parametrize("form", ["dense", "packed"])
def test_e4m3_attention_refuses_96_at_q_dims(form) -> None:
    extra = dict(tokens_q=700, tokens_kv=700) if form == "packed" else {}
    case = Fp8Case("fp8", 2, 8, 2, 300, 300, D, form=form, **extra)
    path = "tensors.q.dims[2]" if form == "packed" else "tensors.q.dims[3]"
    _refused(declined(fp8_description(case)), path, "with e4m3 q, k and v")


def test_the_supported_dims_are_one_table() -> None:
    assert set(FORWARD_HEAD_DIMS) - set(HEAD_DIMS) == {D}


@pytest.mark.parametrize(
    "variant",
    [
        SdpaFwdVariant("e4m3", D, MaskFlags(), False, out_dtype="bf16"),
        SdpaFwdVariant("bf16", D, MaskFlags(right=True, bottom_right=True), False, varlen=True, page_size=16),
    ],
    ids=["e4m3", "paged"],
)
def test_the_kernel_refuses_96_where_its_rows_move_in_64_wide_pieces(variant) -> None:
    with pytest.raises(ValueError, match="head dims 64, 128 and 256"):
        SdpaForwardWgmma(variant)


# ------------------------------------------------------------------------------ the O store


def _row_copy_coordinates(head_dim: int) -> dict[int, list[tuple[int, int]]]:
    """(row, column) of each element each of a consumer's 128 threads stores of its (64, d) tile
    (`_row_copy`), in the thread's order, read at trace time (every index is static)."""
    import cutlass.cute as cute

    kernel = SdpaForwardWgmma(SdpaFwdVariant("bf16", head_dim, MaskFlags(), False))
    wg_m = kernel.tiles.block_m // kernel.tiles.consumers
    found: dict[int, list[tuple[int, int]]] = {}

    @cute.jit
    def trace():
        _collect(kernel._row_copy(), cute.make_identity_tensor((wg_m, head_dim)), found)

    cute.compile(trace)
    return found


def _collect(copy, tile, found) -> None:
    """Plain Python loops (outside the DSL's rewriting of a jit function's own loops)."""
    import cutlass.cute as cute

    for thread in range(128):
        part = copy.get_slice(thread).partition_D(tile)
        found[thread] = [tuple(part[i]) for i in range(cute.size(part))]


@pytest.mark.parametrize("head_dim", FORWARD_HEAD_DIMS)
def test_the_o_store_writes_every_column_once_in_16_byte_pieces(head_dim) -> None:
    """The O store's threads a row divide both a row's 16-byte pieces and 128 (at d=96 the
    pieces, 12, do not divide 128: 4 threads of 3 pieces): each element of the tile exactly
    once, no thread idle, every piece 8 consecutive columns from a multiple of 8."""
    found = _row_copy_coordinates(head_dim)
    assert sorted(found) == list(range(128))
    assert len({len(elems) for elems in found.values()}) == 1  # every thread the same share
    counts = Counter(rc for elems in found.values() for rc in elems)
    assert set(counts) == {(r, c) for r in range(64) for c in range(head_dim)}
    assert set(counts.values()) == {1}
    for elems in found.values():
        for i in range(0, len(elems), 8):
            piece = elems[i : i + 8]
            row, first = piece[0]
            assert first % 8 == 0 and piece == [(row, first + j) for j in range(8)]


# ------------------------------------------------------------------------------ the GPU cases build


@pytest.mark.parametrize("case", head_dim_96_cases(), ids=lambda c: c.id)
def test_each_gpu_case_at_96_builds(case) -> None:
    plan = decode_plan(build(description(case)))
    (forward,) = [k for k in plan.kernels if k.name.startswith("sdpa_fwd_wgmma")]
    assert ".d96." in forward.name and forward.cubin
    assert forward.tiles["block_m"] == forward.tiles["block_n"] == 128 and forward.tiles["stages"] == 2
    assert forward.smem_bytes <= SM90A.smem_per_cta
