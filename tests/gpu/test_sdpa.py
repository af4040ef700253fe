"""SDPA plans, loaded through the runtime alone, against a float64 reference.

For each case of tests/gpu/cases.py: fresh random inputs, outputs poisoned with NaN inside a
guarded allocation (sentinels before and after), one execute, then: every element written,
nothing outside the tensor touched, O and LSE within the dtype's tolerance of float64,
sequence by sequence. Variable-length plans run several fresh length mixes each (0, 1, each
side of each tile size, the capacity, random ones), with NaN in every input row outside the
sequences, and must leave output rows past each sequence untouched.
"""

import random
import sys
import zlib

import pytest

from tests.gpu.support import BUILT, Buffers, built_manifest_entries, draw_lengths, gpu_skip_reason

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")
MIXES = 3  # length mixes per variable-length plan


@pytest.fixture(scope="module")
def runtime():
    import frost_runtime

    return frost_runtime


@pytest.mark.gpu
@pytest.mark.parametrize("case", built_manifest_entries(), ids=lambda c: c["plan"].removesuffix(".frost"))
def test_plan_matches_float64_reference(runtime, manifest, case):
    seed = zlib.crc32(case["plan"].encode())
    torch.manual_seed(seed)
    rng = random.Random(seed)
    with runtime.load(BUILT / case["plan"]) as plan:
        buffers = Buffers(case, plan)
        for _ in range(1 if case["form"] == "dense" else MIXES):
            if case["form"] != "dense":
                buffers.set_lengths(*draw_lengths(case, rng))
                buffers.refill()
                buffers.poison_padding()
            buffers.execute()
            torch.cuda.synchronize()
            buffers.assert_correct()


@pytest.mark.gpu
def test_runtime_alone_ran_the_plans(runtime, manifest):
    """The GPU side imports neither the compiler nor the DSL."""
    assert not any(name == "frostc" or name.startswith(("frostc.", "cutlass")) for name in sys.modules)
