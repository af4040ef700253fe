"""SDPA forward plans, loaded through the runtime alone, against a float64 reference.

For each case of tests/gpu/cases.py: fresh random inputs, outputs poisoned with NaN inside a
guarded allocation (sentinels before and after), one execute, then: every element written,
nothing outside the tensor touched, O and LSE within the dtype's tolerance of float64.
"""

import math
import sys
import zlib

import pytest

from tests.gpu.support import BUILT, built_manifest_entries, gpu_skip_reason, reference

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")

# relative Frobenius error of O, max abs error of O, max abs error of LSE
TOLERANCE = {"bf16": (1.2e-2, 6e-2, 2e-3), "fp16": (2e-3, 1e-2, 2e-3)}
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
GUARD = 4096  # sentinel elements on each side of every output
SENTINEL = 12345.0


def make_input(case: dict, heads: int, seq: int) -> torch.Tensor:
    """A (b, h, s, d) view in the case's physical layout, filled with fresh random values."""
    b, d, dtype = case["batch"], case["head_dim"], TORCH_DTYPE[case["dtype"]]
    if case["layout"] == "bhsd":
        return torch.randn(b, heads, seq, d, device="cuda", dtype=dtype)
    return torch.randn(b, seq, heads, d, device="cuda", dtype=dtype).transpose(1, 2)


def make_guarded_output(shape_in_layout: tuple, permute: tuple, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """An output view inside a larger buffer: NaN where the kernel must write, sentinels around."""
    n = math.prod(shape_in_layout)
    storage = torch.full((n + 2 * GUARD,), SENTINEL, device="cuda", dtype=dtype)
    storage[GUARD : GUARD + n] = float("nan")
    view = storage[GUARD : GUARD + n].view(shape_in_layout).permute(permute)
    return storage, view


@pytest.fixture(scope="module")
def runtime():
    import frost_runtime

    return frost_runtime


@pytest.mark.gpu
@pytest.mark.parametrize("case", built_manifest_entries(), ids=lambda c: c["plan"].removesuffix(".frost"))
def test_plan_matches_float64_reference(runtime, manifest, case):
    torch.manual_seed(zlib.crc32(case["plan"].encode()))
    plan = runtime.load(BUILT / case["plan"])
    b, hq, hkv, sq, skv, d = (case[k] for k in ("batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim"))
    q, k, v = make_input(case, hq, sq), make_input(case, hkv, skv), make_input(case, hkv, skv)
    dtype = TORCH_DTYPE[case["dtype"]]
    if case["layout"] == "bhsd":
        o_storage, o = make_guarded_output((b, hq, sq, d), (0, 1, 2, 3), dtype)
    else:
        o_storage, o = make_guarded_output((b, sq, hq, d), (0, 2, 1, 3), dtype)
    buffers = [q, k, v, o]
    if case["lse"]:
        lse_storage, lse = make_guarded_output((b, hq, sq), (0, 1, 2), torch.float32)
        buffers.append(lse)

    plan.execute(*buffers)
    torch.cuda.synchronize()

    ref_o, ref_lse = reference(case, q, k, v, 1 / math.sqrt(d))
    rel_tol, abs_tol, lse_tol = TOLERANCE[case["dtype"]]
    assert not torch.isnan(o).any(), "some output elements were never written"
    assert _guards_intact(o_storage, o.numel()), "the kernel wrote outside O"
    rel = ((o.double() - ref_o).norm() / ref_o.norm()).item()
    worst = (o.double() - ref_o).abs().max().item()
    assert rel < rel_tol and worst < abs_tol, f"O: relative error {rel:.2e}, max abs error {worst:.2e}"
    if case["lse"]:
        assert not torch.isnan(lse).any(), "some LSE elements were never written"
        assert _guards_intact(lse_storage, lse.numel()), "the kernel wrote outside LSE"
        lse_err = (lse.double() - ref_lse).abs().max().item()
        assert lse_err < lse_tol, f"LSE: max abs error {lse_err:.2e}"


def _guards_intact(storage: torch.Tensor, n: int) -> bool:
    return bool((storage[:GUARD] == SENTINEL).all() and (storage[GUARD + n :] == SENTINEL).all())


@pytest.mark.gpu
def test_runtime_alone_ran_the_plans(runtime, manifest):
    """The GPU side imports neither the compiler nor the DSL."""
    assert not any(name == "frostc" or name.startswith(("frostc.", "cutlass")) for name in sys.modules)
