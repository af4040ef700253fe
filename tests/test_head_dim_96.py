"""Head dim 96 (Phi-3, issue 44) on the CPU, in every form: the 16-bit forward kernel's dense,
padded and packed forms resolve to 192-row tiles of 96 keys at 96 (three consumers; a left
window: d=128's tiles; 64-byte swizzled rows either way); the paged decode
kernel (rows, packed, the mixed form's decodes, split and adaptively split, with its combine), the
forward kernel over the pages (the mixed form's chunks) and kv_append take 96 too, over 16-bit and
e4m3 caches; e4m3 q, k and v still refuse 96 with the field path and the dims they take. Traced
here: the O store writes every column of a tile exactly once; each TMA box of a paged cache lands
in its own piece of a stage's tile (32 wide at 96, in the tile's 64-byte swizzle); the combine's
and the e4m3 kernel's pieces of d cover it. Every GPU case at 96 (tests/gpu/cases.py,
decode_cases.py, mixed_cases.py, append_cases.py) builds. The results against float64 are the
GPU tests'."""

from __future__ import annotations

from collections import Counter

import pytest
from frost_runtime.schema import decode_plan

from frostc.build import build
from frostc.errors import DescriptionError
from frostc.kernels.sdpa_common import MaskFlags
from frostc.kernels.sdpa_decode_combine import THREADS as COMBINE_THREADS
from frostc.kernels.sdpa_decode_combine import VECTOR, DecodeCombine, DecodeCombineVariant
from frostc.kernels.sdpa_decode_paged import (
    CONSUMER_WARPS,
    ROWS,
    ROWS_SCALED,
    DecodeTiles,
    PagedDecode,
    PagedDecodeVariant,
    decode_tiles,
)
from frostc.kernels.sdpa_fwd_wgmma import SdpaForwardWgmma, SdpaFwdVariant, WgmmaTiles, tiles_for_head_dim
from frostc.ops.rows import E4M3_HEAD_DIMS, HEAD_DIMS
from frostc.resolve import resolve
from frostc.target import SM90A
from frostc.validate import validate
from tests.gpu.append_cases import cases as append_cases
from tests.gpu.build_plans import append_description, decode_description, description, mixed_description
from tests.gpu.cases import Case, head_dim_96_cases
from tests.gpu.decode_cases import DecodeCase
from tests.gpu.decode_cases import cases as decode_cases
from tests.gpu.fp8_cases import Fp8Case
from tests.gpu.fp8_cases import description as fp8_description
from tests.gpu.mixed_cases import MixedCase
from tests.gpu.mixed_cases import cases as mixed_cases

D = 96
TILES = WgmmaTiles(block_m=192, block_n=96, consumers=3, stages=2, o_buffer=True)
WINDOW_TILES = WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=2, o_buffer=True)  # d=128's


def launches(case: Case):
    return resolve(validate(description(case))).launches


def declined(desc) -> dict[str, str]:
    with pytest.raises(DescriptionError) as e:
        resolve(validate(desc))
    return {p.path: p.message for p in e.value.problems}


# ------------------------------------------------------------------------------ tiles and launches


@pytest.mark.parametrize("window_left", [False, True])
def test_the_tiles_take_144_kib(window_left) -> None:
    """192 x 96 with three consumers (3-8 % over 128 x 128 on the H100, bench/RESULTS.md); a left
    window's masks keep d=128's two consumers (three spill at d=64 already)."""
    tiles = tiles_for_head_dim(D, window_left=window_left)
    assert tiles == (WINDOW_TILES if window_left else TILES)
    rows = 2 * D  # bytes of a 16-bit row
    q = o = tiles.block_m * rows
    ring = tiles.stages * 2 * tiles.block_n * rows  # K and V
    assert q + o + ring == 144 * 1024 <= SM90A.smem_per_cta


def test_a_dense_node_resolves_to_the_d96_variant_with_its_tiles_and_grid() -> None:
    (attention,) = launches(Case("bf16", 2, 8, 2, 1000, 1000, D, False, "bshd", True))
    variant = attention.variant
    assert variant.name == "sdpa_fwd_wgmma.bf16.d96.full.lse"
    assert variant.tile_shape == TILES and variant.block == (512, 1, 1)
    assert attention.grid == (6 * 8 * 2, 1, 1)  # ceil(1000 / 192) query blocks, 8 heads, 2 sequences
    assert variant.grid_rule.startswith("(min(ceil(seq_q / 192) * heads_q * batch, SMs * 1)")


@pytest.mark.parametrize(
    ("seq", "walk"),
    [(2000, "paired"), (3000, "dynamic"), (8200, "per_tile")],  # 11 query blocks of 192; 16; 86 key blocks of 96
)
def test_causal_heads_take_the_walk_of_their_tiles(seq, walk) -> None:
    (attention,) = launches(Case("fp16", 1, 8, 2, seq, seq, D, True, "bshd", False))
    assert attention.variant.walk == walk
    assert attention.variant.name == f"sdpa_fwd_wgmma.fp16.d96.causal.{walk}"


def test_masks_sinks_and_lse_name_their_variant() -> None:
    case = Case("fp16", 1, 8, 2, 300, 900, D, True, "bshd", True, "dense", "bottom_right", 200, None, 50.0, sinks=True)
    (attention,) = launches(case)
    assert attention.variant.name == "sdpa_fwd_wgmma.fp16.d96.local_br.softcap.sinks.lse"


@pytest.mark.parametrize("form", ["padded", "packed"])
def test_variable_lengths_schedule_192_row_units_for_the_d96_kernel(form) -> None:
    extra = dict(tokens_q=3001, tokens_kv=2800) if form == "packed" else {}
    case = Case("bf16", 5, 16, 4, 1100, 1000, D, True, "thd" if form == "packed" else "bshd", True, form, **extra)
    schedule, attention = launches(case)
    assert (schedule.variant.block_m, schedule.variant.block_n) == (192, 96)
    assert attention.variant.name == "sdpa_fwd_wgmma.bf16.d96.causal.varlen.lse"
    assert attention.variant.tile_shape == TILES


# ------------------------------------------------------------------------------ what refuses 96


def _refused(found: dict[str, str], path: str, *words: str) -> None:
    assert path in found, found
    for word in ("head dim 96 is not supported", "supported: 64, 128, 256", "bf16 or fp16 q, k and v", *words):
        assert word in found[path], found[path]


@pytest.mark.parametrize("form", ["dense", "packed"])
def test_e4m3_attention_refuses_96_at_q_dims(form) -> None:
    extra = dict(tokens_q=700, tokens_kv=700) if form == "packed" else {}
    case = Fp8Case("fp8", 2, 8, 2, 300, 300, D, form=form, **extra)
    path = "tensors.q.dims[2]" if form == "packed" else "tensors.q.dims[3]"
    _refused(declined(fp8_description(case)), path, "with e4m3 q, k and v")


def test_the_supported_dims_are_one_table() -> None:
    assert set(HEAD_DIMS) - set(E4M3_HEAD_DIMS) == {D}


def test_the_kernel_refuses_96_with_e4m3_q_k_and_v() -> None:
    with pytest.raises(ValueError, match="e4m3 is built for head dims 64, 128 and 256"):
        SdpaForwardWgmma(SdpaFwdVariant("e4m3", D, MaskFlags(), False, out_dtype="bf16"))


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


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
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
    tiles = WINDOW_TILES if case.window_left is not None else TILES
    assert (forward.tiles["block_m"], forward.tiles["block_n"], forward.tiles["stages"]) == (
        tiles.block_m,
        tiles.block_n,
        tiles.stages,
    )
    assert forward.smem_bytes <= SM90A.smem_per_cta


# ------------------------------------------------------------------------------ the paged decode kernel


def test_the_decode_tiles_fit_two_ctas_with_four_stages() -> None:
    """Q 64 x 96 (12 KiB) and four stages of 64 keys of K and V (4 x 24 KiB) in the 112 KiB each
    of two CTAs an SM may take; an e4m3 cache's ring six stages of 2 x 6 KiB, three CTAs with few rows."""
    tiles = decode_tiles(D, 16, "bf16", "bf16")
    assert tiles == DecodeTiles(block_n=64, stages=4, box_rows=16, ctas_per_sm=2)
    assert ROWS * D * 2 + tiles.stages * 2 * tiles.block_n * D * 2 == 108 * 1024
    kernel = PagedDecode(PagedDecodeVariant("bf16", "bf16", D, 256, True, False, True))
    assert kernel.d_chunk == 32 and kernel.tiles.box_rows == 64  # the compiled smem: the GPU cases' builds below
    assert decode_tiles(D, 16, "bf16", "e4m3", few_rows=True) == DecodeTiles(64, 6, 16, 3, ROWS_SCALED)
    assert decode_tiles(D, 16, "bf16", "e4m3") == DecodeTiles(64, 6, 16, 2, ROWS_SCALED)


def _kernels(desc) -> list[str]:
    return [launch.variant.name for launch in resolve(validate(desc)).launches]


@pytest.mark.parametrize(
    ("case", "names"),
    [
        (DecodeCase("bf16", 4, 32, 32, D, 16, 16, 1, False, True, "bshd"),
         ["kv_append.bf16.d96", "sdpa_decode_paged.bf16.d96.p16.full.lse"]),
        (DecodeCase("fp16", 1, 32, 8, D, 256, 32, 1, True, True, "bhsd", "sdpa", sinks=True),
         ["sdpa_decode_paged.fp16.d96.p256.causal_br.split", "sdpa_decode_combine.fp16.d96.sinks.lse"]),
        (DecodeCase("bf16", 3, 16, 2, D, 256, 4, 3, True, True, "bshd", "sdpa", window_left=300, softcap=50.0),
         ["sdpa_decode_paged.bf16.d96.p256.causal_br.local.softcap.lse"]),
        (DecodeCase("bf16", 4, 32, 8, D, 16, 64, 1, False, True, "bshd", cache="e4m3"),
         ["kv_append.bf16.kv_e4m3.d96", "sdpa_decode_paged.bf16.kv_e4m3.r8.d96.p16.full.split",
          "sdpa_decode_combine.bf16.d96.lse"]),
    ],
    ids=["unsplit", "split-sinks", "window-softcap", "e4m3"],
)  # fmt: skip
def test_the_paged_form_takes_96_split_or_not(case, names) -> None:
    assert _kernels(decode_description(case)) == names


def test_the_mixed_form_takes_96_its_chunks_apart_on_the_forward_kernel_over_the_pages() -> None:
    """A GQA group of 4: decodes of up to 16 queries on the paged kernel (split adaptively, the
    sinks where it writes rows), the other sequences' chunks on the forward kernel reading the
    pages in 32-wide boxes."""
    case = MixedCase("bf16", 6, 200, 64, 32, 8, D, 16, 320, True, lse="ht", window_left=2047, sinks=True)
    assert _kernels(mixed_description(case)) == [
        "sdpa_decode_paged.bf16.d96.p16.causal_br.local.packed.decodes.sinks.split.lse",
        "sdpa_decode_combine.bf16.d96.packed.causal.decodes_r64.sinks.lse",
        "sdpa_schedule.mixed.m128n128.local_br",
        "sdpa_fwd_wgmma.bf16.d96.local_br.varlen.paged_p16.sinks.lse",
    ]
    # over an e4m3 cache the chunks' forward kernel converts the pages (`kv_cache`); the decodes are
    # the e4m3 kernel's 16-row blocks
    e4m3 = MixedCase("bf16", 8, 64, 16, 32, 8, D, 64, 32, True, lse="th", cache="e4m3")
    assert _kernels(mixed_description(e4m3)) == [
        "sdpa_decode_paged.bf16.kv_e4m3.d96.p64.causal_br.packed.decodes.split.lse",
        "sdpa_decode_combine.bf16.d96.packed.causal.decodes_r16.lse",
        "sdpa_schedule.mixed.m192n96.causal_br",
        "sdpa_fwd_wgmma.bf16.d96.causal_br.varlen.kv_e4m3.paged_p64.lse",
    ]


def test_kv_append_takes_96_in_each_form() -> None:
    case = DecodeCase("bf16", 2, 8, 2, D, 16, 8, 1, True, True, "bshd", "append")
    assert _kernels(decode_description(case)) == ["kv_append.bf16.d96"]
    found = {name for c in append_cases() if c.head_dim == D for name in _kernels(append_description(c))}
    assert found == {
        "kv_append.bf16.d96.packed", "kv_append.fp16.kv_e4m3.d96.packed", "kv_append.bf16.d96.slots",
        "kv_append.fp16.kv_e4m3.d96.slots",
    }  # fmt: skip


# ------------------------------------------------------------------------------ a paged cache's TMA boxes


def _paged_kernels(head_dim: int):
    """The two kernels that read a paged cache through TMA boxes, at pages of 16 (boxes of 16 keys)."""
    decode = PagedDecode(PagedDecodeVariant("bf16", "bf16", head_dim, 16, True, False, True))
    flags = MaskFlags(right=True, bottom_right=True)
    forward = SdpaForwardWgmma(SdpaFwdVariant("bf16", head_dim, flags, True, varlen=True, page_size=16))
    return [(decode, decode.tiles.box_rows, decode.tiles.block_n), (forward, forward.box_rows, forward.tiles.block_n)]


def _box_placement(kernel, rows: int, block_n: int) -> dict[str, tuple]:
    """For K and V: (element offsets where the boxes start, the number of elements of a stage
    whose place in the tile is not the box's start plus its place in the box, the tile's
    swizzle, the box's), read at trace time (every layout is static)."""
    import cutlass.cute as cute

    found = {}

    @cute.jit
    def trace():
        _, sK, sV = kernel._smem_layouts()
        k_box, v_box = kernel._box_layouts()
        for name, tile, box, keys_mode in (("k", sK, k_box, 0), ("v", sV, v_box, 1)):
            found[name] = _compare_boxes(tile, box, rows, kernel.d_chunk, block_n, kernel.head_dim, keys_mode)

    cute.compile(trace)
    return found


def _compare_boxes(tile, box, rows, chunk, block_n, d, keys_mode):
    """Plain Python loops (outside the DSL's rewriting of a jit function's own loops)."""
    import cutlass.cute as cute

    def at(key, col):  # (key, column of d) in the tile's mode order, stage 0
        return (key, col, 0) if keys_mode == 0 else (col, key, 0)

    starts, misplaced = [], 0
    for i in range(block_n // rows):
        for c in range(d // chunk):
            start = cute.crd2idx(at(i * rows, c * chunk), tile.outer)
            starts.append(start)
            for r in range(rows):
                for col in range(chunk):
                    inside = (r, col) if keys_mode == 0 else (col, r)
                    if cute.crd2idx(at(i * rows + r, c * chunk + col), tile.outer) != start + cute.crd2idx(
                        inside, box.outer
                    ):
                        misplaced += 1
    return starts, misplaced, str(tile.inner), str(box.inner)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_each_tma_box_of_a_page_lands_in_its_own_piece_of_the_stage_tile(head_dim) -> None:
    """Both kernels that read a paged cache load a stage box by box (16 keys of one page by a
    swizzle atom's row of d: 64 wide, 32 at d=96). Each box must be a contiguous piece of the
    stage's tile in the box's own layout and swizzle (TMA writes a box as one block), start on a
    whole swizzle period (8 rows of the atom's width: 512 bytes at d=96, 1024 else), and the
    boxes must tile the stage exactly once."""
    for kernel, rows, block_n in _paged_kernels(head_dim):
        assert kernel.d_chunk == (32 if head_dim == 96 else 64)
        for name, (starts, misplaced, tile_swizzle, box_swizzle) in _box_placement(kernel, rows, block_n).items():
            assert misplaced == 0, (type(kernel).__name__, name)
            assert tile_swizzle == box_swizzle == ("S<2,4,3>" if head_dim == 96 else "S<3,4,3>")
            period = 8 * kernel.d_chunk  # elements of 8 atom rows
            assert all(start % period == 0 for start in starts)
            assert len(starts) * rows * kernel.d_chunk == block_n * head_dim
            assert sorted(starts) == [rows * kernel.d_chunk * i for i in range(len(starts))]  # no overlap


# ------------------------------------------------------------------------------ pieces of d


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_the_combine_sums_each_piece_of_each_split_once(head_dim) -> None:
    """256 threads in groups of d/4 (one 4-float piece each): at d=96, 10 groups of 24 and 16
    threads with no group, which must sum no split (the others' columns have them all) and write
    a spare column of the partial sums, inside the shared buffer and never read; at 64, 128 and
    256 every thread has a group. Split s is summed by group s % groups, for any count of splits."""
    kernel = DecodeCombine(DecodeCombineVariant("bf16", head_dim, True))
    lanes, groups, columns = kernel.lanes, kernel.groups, kernel.columns
    splits = 37
    writes, summed = Counter(), Counter()
    for tidx in range(COMBINE_THREADS):
        lane, grp = tidx % lanes, tidx // lanes
        split = grp if grp < groups else splits  # the kernel's `split` (a thread past the groups: none)
        summed.update((lane, s) for s in range(split, splits, groups))
        writes.update((lane * VECTOR + i, grp) for i in range(VECTOR))
        assert grp < columns
    assert summed == Counter({(lane, s): 1 for lane in range(lanes) for s in range(splits)})
    read = {(col, g) for col in range(head_dim) for g in range(groups)}  # the final sum's columns
    assert read <= set(writes) and all(writes[w] == 1 for w in read)
    spare = COMBINE_THREADS - groups * lanes
    assert (groups, spare, columns) == ((10, 16, 11) if head_dim == 96 else (COMBINE_THREADS // lanes, 0, groups))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_the_decode_kernels_pieces_of_d_cover_it(head_dim) -> None:
    """The 16-bit kernel loads Q in 16-byte pieces, a flat index over 128 threads: a whole number
    of passes (64 rows x 12 pieces = 6 x 128 at d=96). The e4m3 kernel's lanes take d/4 (Q, K:
    four pairs) and d/8 (V, O: eight quads) of each row, its V pieces interleaved in words four
    at a time (d/8 a multiple of 4), and its merge of 16 rows stores d/8 per thread, 8 a row."""
    pieces = ROWS * head_dim // 8
    assert pieces % 128 == 0
    assert head_dim % 16 == 0 and (head_dim // 8) % 4 == 0
    assert 4 * (head_dim // 4) == 8 * (head_dim // 8) == head_dim
    assert 128 // 8 == ROWS_SCALED and CONSUMER_WARPS * 32 == 128


# ------------------------------------------------------------------------------ every GPU case at 96 builds


def _d96(cases):
    return [c for c in cases if c.head_dim == D]


@pytest.mark.parametrize(
    ("case", "describe"),
    [(c, decode_description) for c in _d96(decode_cases())]
    + [(c, mixed_description) for c in _d96(mixed_cases())]
    + [(c, append_description) for c in _d96(append_cases())],
    ids=lambda x: getattr(x, "id", ""),
)
def test_each_paged_gpu_case_at_96_builds(case, describe) -> None:
    plan = decode_plan(build(describe(case)))
    assert plan.kernels and all(".d96" in k.name for k in plan.kernels if not k.name.startswith("sdpa_schedule"))
    for kernel in plan.kernels:
        assert kernel.cubin.startswith(b"\x7fELF")
        assert kernel.smem_bytes <= SM90A.smem_for(kernel.tiles.get("ctas_per_sm", 1))  # the residency it was sized for


def test_the_paged_gpu_cases_at_96_cover_every_mode() -> None:
    names = {
        launch.variant.name
        for c in _d96(decode_cases())
        for launch in resolve(validate(decode_description(c))).launches
    }
    names |= {
        launch.variant.name for c in _d96(mixed_cases()) for launch in resolve(validate(mixed_description(c))).launches
    }
    joined = " ".join(names)
    modes = (".split", ".lse", ".sinks", ".local", ".softcap", ".p16.", ".p256.", ".packed", ".decodes")
    modes += ("kv_e4m3.r8", "kv_e4m3.d96", "sdpa_decode_combine", "paged_p16", "paged_p256", "fp16", "bf16")
    for mode in modes:
        assert mode in joined, mode
    assert any(n.startswith("sdpa_decode_paged") and ".split" not in n for n in names)  # unsplit too
    assert any(".decodes." in n and ".split" in n for n in names)  # the adaptive split
