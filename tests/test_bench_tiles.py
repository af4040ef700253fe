"""frostc.cubin_info and bench/tile_trials.py on the CPU: a cubin's registers and stack read from
its ELF (what inspect shows), and a candidate's tiles in place only while its plans build."""

from __future__ import annotations

import pytest
from frost_runtime.schema import decode_plan

from frostc.build import build
from tests.bench_scripts import load


@pytest.fixture(scope="module")
def plan():
    common = load("common")
    return decode_plan(build(common.dense_description("d96", (1, 2, 300, 96), causal=False)))


def test_a_cubin_tells_its_registers_and_stack(plan) -> None:
    """The d=96 forward kernel without a window: four warpgroups (a producer and three
    consumers), so 65,536 / 512 registers a thread at launch (setmaxnreg redistributes them), and
    no stack frame; inspect's summary (the goldens', diff's) carries both."""
    from frostc.cubin_info import CubinResources, resources
    from frostc.inspect import plan_summary

    assert resources(plan.kernels[0].cubin) == CubinResources(registers=128, stack_bytes=0)
    assert resources(b"not an ELF file") == CubinResources(None, None)
    assert resources(b"\x7fELF" + bytes(range(256)) * 2) == CubinResources(None, None)  # tables pointing outside
    kernel = plan_summary(plan)["kernels"][0]
    assert (kernel["registers"], kernel["stack_bytes"]) == (128, 0)


def test_a_candidate_takes_the_kernel_only_while_it_builds() -> None:
    """192 x 96 x 2 at d=96: three consumer warpgroups of 64 rows in place of the chosen tiles,
    the other head dims untouched, the chosen tiles back afterwards."""
    import frostc.kernels.sdpa_fwd_wgmma as forward

    trials = load("tile_trials")
    chosen, chosen_128 = forward.tiles_for_head_dim(96, False), forward.tiles_for_head_dim(128, False)
    assert trials.parse("192x96x2") == (192, 96, 2)
    with trials.tiles_in_place(96, 192, 96, 2):
        tiles = forward.tiles_for_head_dim(96, False)
        assert (tiles.block_m, tiles.block_n, tiles.consumers, tiles.stages) == (192, 96, 3, 2)
        assert forward.tiles_for_head_dim(128, False) == chosen_128 and forward.tiles_for_head_dim(96, True) != tiles
    assert forward.tiles_for_head_dim(96, False) == chosen
    with pytest.raises(SystemExit, match="block_m must be 128 or 192"):
        trials.parse("256x64x2")


def test_a_pair_candidate_takes_only_its_pair() -> None:
    """DeepSeek's 192/128: the candidate replaces the pair's tiles (O through Q's buffer when asked),
    not those of q/k 192 with v 192 nor of 96; the chosen come back."""
    import frostc.kernels.sdpa_fwd_wgmma as forward

    trials = load("tile_trials")
    chosen = forward.tiles_for_head_dim(192, False, head_dim_v=128)
    with trials.tiles_in_place(192, 192, 64, 2, head_dim_v=128, o_buffer=False):
        tiles = forward.tiles_for_head_dim(192, False, head_dim_v=128)
        assert (tiles.block_m, tiles.block_n, tiles.consumers, tiles.o_buffer) == (192, 64, 3, False)
        assert forward.tiles_for_head_dim(96, False) != tiles
    assert forward.tiles_for_head_dim(192, False, head_dim_v=128) == chosen
