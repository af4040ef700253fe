"""The forward kernel's setmaxnreg split (`WgmmaTiles.registers`) against the registers its CTA
launches with: the consumers' increase waits for registers the producer's decrease freed, so a
split over the launch allocation hangs on the GPU (the e4m3 converters at 48 registers did)."""

from __future__ import annotations

import json

import pytest

from frostc.golden import GOLDEN_DIR
from frostc.kernels import sdpa_fwd_wgmma
from frostc.kernels.sdpa_fwd_wgmma import REGISTERS, WgmmaTiles, launch_registers


def tiles(consumers: int) -> WgmmaTiles:
    return WgmmaTiles(block_m=64 * consumers, block_n=128, consumers=consumers, stages=2, o_buffer=False)


@pytest.mark.parametrize("consumers", sorted(REGISTERS))
def test_every_split_fits_the_registers_its_cta_launches_with(consumers: int) -> None:
    t = tiles(consumers)
    producer, consumer = t.registers
    assert 128 * producer + 128 * consumers * consumer <= launch_registers(t.num_threads) * t.num_threads


def test_a_split_over_the_launch_allocation_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # 128 x 48 + 256 x 232 is the whole register file, but 384 threads launch with 168 each
    monkeypatch.setitem(sdpa_fwd_wgmma.REGISTERS, 2, (48, 232))
    with pytest.raises(ValueError, match=r"48/232 .* over the 64,512 .* lower REGISTERS\[2\]"):
        _ = tiles(2).registers


def test_the_golden_cubins_launch_with_the_share_the_split_assumes() -> None:
    """ptxas' own register count for every forward kernel of the golden plans: the register
    file's share of its threads, rounded down to 8 (what `launch_registers` says)."""
    seen = 0
    for path in sorted(GOLDEN_DIR.glob("*.json")):
        for kernel in json.loads(path.read_text()).get("kernels", []):
            if kernel["name"].startswith("sdpa_fwd_wgmma."):
                threads = kernel["tiles"]["threads"]
                assert kernel["registers"] == launch_registers(threads), (path.name, kernel["name"])
                seen += 1
    assert seen >= 10
