"""SDPA plans, loaded through the runtime alone, against a float64 reference.

For each case of tests/gpu/cases.py: fresh random inputs, outputs poisoned with NaN inside a
guarded allocation (sentinels before and after), one execute, then: every element written,
nothing outside the tensor touched, O and LSE within the dtype's tolerance of float64,
sequence by sequence. Variable-length plans run several fresh length mixes each (0, 1, each
side of each tile size, the capacity, random ones), with NaN in every input row outside the
sequences, and must leave output rows past each sequence untouched.
"""

import math
import random
import sys
import zlib

import pytest

from tests.gpu.support import (
    BUILT,
    NVDISASM,
    Buffers,
    built_manifest_entries,
    disassemble,
    draw_lengths,
    gpu_skip_reason,
)

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


def _spiked_cases() -> list[dict]:
    """One dense plan per (dtype, head dim, causal, mask kind) whose keys reach past the spikes
    below: plain causal or not, and each of tests/gpu/cases.py's masks (diagonals moved,
    windows, softcap, which caps the spikes' scores)."""
    chosen = {}
    for case in built_manifest_entries():
        if case["form"] == "dense" and case["seq_kv"] >= 1000 and not case.get("sinks"):
            mask = (case["alignment"], case["window_left"], case["window_right"], case["softcap"])
            chosen.setdefault((case["dtype"], case["head_dim"], case["causal"], mask), case)
    return list(chosen.values())


# (first key, end key, log2 units added to the scores of a row of weight 1): the key blocks are
# walked last to first, so these come after the blocks that set each row's reference max
SPIKES = ((700, 710, 5.0), (300, 310, 20.0), (0, 10, 200.0))


@pytest.mark.gpu
@pytest.mark.parametrize("case", _spiked_cases(), ids=lambda c: c["plan"].removesuffix(".frost"))
def test_scores_that_outgrow_the_reference_max(runtime, manifest, case):
    """Keys walked later score far above the ones that set each row's reference max: by a
    little (kept against the stale max), by a lot (rescaled, or at d=128 redone exactly), and
    past float32's exponent range (inf probabilities unless redone). Each row weighs the
    spikes differently (its q[0] uniform in [0, 8]); against float64 like every plan."""
    seed = zlib.crc32(b"spikes" + case["plan"].encode())
    torch.manual_seed(seed)
    with runtime.load(BUILT / case["plan"]) as plan:
        buffers = Buffers(case, plan)
        q, k = buffers.tensors["q"], buffers.tensors["k"]
        q[..., 0] = torch.rand(q.shape[:-1], device="cuda") * 8
        for first, end, log2_gain in SPIKES:
            # with q[0] = 8 the score grows by 8 · k[0] · scale = log2_gain · ln 2 (scale = 1/√d)
            k[:, :, first:end, 0] = log2_gain * math.log(2) * math.sqrt(case["head_dim"]) / 8
        buffers.execute()
        torch.cuda.synchronize()
        buffers.assert_correct()


def _masked_cases() -> list[dict]:
    """One dense plan per (dtype, head dim, mask kind) of tests/gpu/cases.py's masks: moved
    diagonals and windows leave rows that see nothing of the first key blocks walked."""
    chosen = {}
    for case in built_manifest_entries():
        mask = (case["causal"], case["alignment"], case["window_left"], case["window_right"], case["softcap"])
        # (a sink would outweigh every faint score: these rows test the scores' own softmax)
        if case["form"] == "dense" and mask != (case["causal"], "top_left", None, None, None) and not case.get("sinks"):
            chosen.setdefault((case["dtype"], case["head_dim"], mask), case)
    return list(chosen.values())


# every score near -150 (natural log units): its exponential against 0 underflows float32
FAINT_SCORE = 150.0


@pytest.mark.gpu
@pytest.mark.parametrize("case", _masked_cases(), ids=lambda c: c["plan"].removesuffix(".frost"))
def test_rows_whose_every_score_underflows(runtime, manifest, case):
    """Every score far below 0 (q = -c + noise, k = c + noise: about -150 ± a few): a row's
    softmax is as defined as any, but a probability taken against 0 underflows float32. At d=128
    a row whose first keys were masked has no reference max when the fast step reaches it
    (`OnlineSoftmax.update_fast`); its probabilities must come from its scores, not from zeros
    taken for masked keys (FP8 v6, bench/NOTES.md, was caught by this test's e4m3 twin)."""
    seed = zlib.crc32(b"faint" + case["plan"].encode())
    torch.manual_seed(seed)
    level = math.sqrt(FAINT_SCORE / math.sqrt(case["head_dim"]))  # d · level² · (1/√d) = FAINT_SCORE
    with runtime.load(BUILT / case["plan"]) as plan:
        buffers = Buffers(case, plan)
        q, k = buffers.tensors["q"], buffers.tensors["k"]
        q.copy_(torch.randn(q.shape, device="cuda") * 0.5 - level)
        k.copy_(torch.randn(k.shape, device="cuda") * 0.5 + level)
        buffers.execute()
        torch.cuda.synchronize()
        buffers.assert_correct()


def _forward_kernels() -> dict[bytes, str]:
    """Each distinct forward-kernel cubin (sdpa_fwd_wgmma) of the built SDPA and FP8 plans, and
    where it was found."""
    from frost_runtime.schema import decode_plan

    from tests.gpu.fp8_support import FP8_BUILT

    paths = [BUILT / c["plan"] for c in built_manifest_entries()] + sorted(FP8_BUILT.glob("*.frost"))
    found = {}
    for path in (p for p in paths if p.exists()):
        for kernel in decode_plan(path.read_bytes()).kernels:
            if kernel.name.startswith("sdpa_fwd_wgmma"):
                found.setdefault(kernel.cubin, f"{path.name}: {kernel.name}")
    return found


def wgmma_serialized(sass: str) -> bool:
    """Whether ptxas serialized the kernel's warpgroup MMAs (its C7513: a register operand of
    one is written by another instruction between issue and wait): each HGMMA / QGMMA then waits
    for itself, so every one carries the gsb0 flag. A pipelined kernel issues a GEMM's k-steps
    back to back with gsb0 on the last only."""
    gmmas = [line for line in sass.splitlines() if "GMMA." in line]
    return bool(gmmas) and all("gsb0" in line for line in gmmas)


@pytest.mark.gpu
@pytest.mark.skipif(not NVDISASM.exists(), reason="no nvdisasm (the CUDA toolkit's) to read the kernels' SASS")
def test_no_forward_kernel_has_its_warpgroup_mmas_serialized(manifest):
    """Read in the SASS of every built forward kernel: a copy into a running WGMMA's registers
    that the compiler folds makes ptxas serialize every WGMMA of the kernel, 0.7x the speed and
    no wrong answer (bench/NOTES.md, FP8 v5), so only the SASS shows it."""
    kernels = _forward_kernels()
    assert kernels, "no forward kernel among the built plans"
    sass = disassemble(list(kernels))
    serialized = [where for cubin, where in kernels.items() if wgmma_serialized(sass[cubin])]
    assert not serialized, "WGMMAs serialized in: " + "; ".join(serialized)


@pytest.mark.gpu
def test_runtime_alone_ran_the_plans(runtime, manifest):
    """The GPU side imports neither the compiler nor the DSL."""
    assert not any(name == "frostc" or name.startswith(("frostc.", "cutlass")) for name in sys.modules)


@pytest.mark.gpu
def test_two_nodes_in_one_plan_run_in_order(runtime, manifest):
    """A dense causal node and a packed node in one plan: four launches on one stream, one
    workspace (the packed node's regions), both checked against float64."""
    from tests.gpu.cases import TWO_NODES

    path = BUILT / "two-nodes.frost"
    if not path.exists():
        pytest.skip("two-nodes.frost was not built")
    torch.manual_seed(2)
    rng = random.Random(2)
    with runtime.load(path) as plan:
        assert len(plan.data.launches) == 3  # the dense node's kernel, the packed node's two
        assert [launch.node for launch in plan.data.launches] == ["a_attn", "b_attn", "b_attn"]
        parts = {prefix: Buffers(asdict_case(case), plan) for prefix, case in zip(("a_", "b_"), TWO_NODES)}
        parts["b_"].set_lengths(*draw_lengths(asdict_case(TWO_NODES[1]), rng))
        for part in parts.values():
            part.refill()
        parts["b_"].poison_padding()
        buffers = [parts[name[:2]].tensors[name[2:]] for name in plan.slots]
        plan.execute(*buffers, workspace=parts["b_"].workspace)
        torch.cuda.synchronize()
        for part in parts.values():
            part.assert_correct()


def asdict_case(case) -> dict:
    from dataclasses import asdict

    return asdict(case)
