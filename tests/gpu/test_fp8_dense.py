"""FP8 (e4m3) dense attention on the GPU: every plan of tests/gpu/fp8_cases.py against float64
attention on the dequantized inputs, and the accuracy case beside its bf16 twin.

Inputs are fresh N(0, 1) values (or with outlier channels: four channels of Q, K and V x50),
quantized as a serving engine does: descale = amax / 448 per head (q, k) or per tensor, stored
x / descale in e4m3. O is poisoned with NaN inside sentinel guards before each run.

The bound: the kernel rounds P to e4m3 for the P V GEMM (3 mantissa bits, a relative error of at
most 2^-4 per probability), which reaches O about unchanged: a relative L2 error near 2.5 % for
N(0, 1) data (a CPU model of the same rounding on the same shapes: 0.023-0.025; bf16's P: 0.003)
and near 0.2 % with outlier channels (their scores are peaked: few probabilities carry the sum).
The LSE sees no rounding of P (the row sums are fp32).
"""

from __future__ import annotations

import json
import math
import zlib

import pytest

from tests.gpu.fp8_cases import v_pitch
from tests.gpu.support import BUILT, GUARD, SENTINEL, reference_sequence

torch = pytest.importorskip("torch")

FP8_BUILT = BUILT / "fp8"
E4M3_MAX = 448.0
# relative L2 of O against float64 on the dequantized inputs, by data
BOUND = {"normal": 0.04, "outliers": 0.01}
LSE_TOLERANCE = 2e-3  # max abs error of the natural-log LSE
OUTLIER_CHANNELS = (3, 40, 77, 121)
OUTLIER_GAIN = 50.0


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (these tests run on the H200 through the device tool)"
    if torch.cuda.get_device_capability() != (9, 0):
        return "plans target sm_90a; this GPU is another"
    if not (FP8_BUILT / "manifest.json").exists():
        return f"no built plans in {FP8_BUILT}: run `python -m tests.gpu.build_plans --only fp8` on the build machine"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")]


def _manifest() -> list[dict]:
    path = FP8_BUILT / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else []


def _case(case_id: str) -> dict:
    found = next((c for c in _manifest() if c["id"] == case_id), None)
    if found is None:
        pytest.fail(f"{case_id} is not among the built FP8 plans")
    return found


def _real_inputs(case: dict, gen, outliers: bool) -> dict:
    b, hq, hkv, d = case["batch"], case["heads_q"], case["heads_kv"], case["head_dim"]
    shapes = {"q": (b, hq, case["seq_q"], d), "k": (b, hkv, case["seq_kv"], d), "v": (b, hkv, case["seq_kv"], d)}
    real = {}
    for name, shape in shapes.items():
        x = torch.randn(shape, device="cuda", generator=gen)
        if outliers:
            x[..., [c for c in OUTLIER_CHANNELS if c < d]] *= OUTLIER_GAIN
        real[name] = x
    return real


def _descale(x, per_head: bool):
    """amax / 448, per head (dim 1) or for the whole tensor: shape (h,) or (1,)."""
    if per_head:
        return (x.abs().amax(dim=(0, 2, 3)) / E4M3_MAX).float()
    return (x.abs().amax() / E4M3_MAX).float().reshape(1)


def _guarded(physical: tuple, permute: tuple, dtype):
    n = math.prod(physical)
    storage = torch.full((n + 2 * GUARD,), SENTINEL, device="cuda", dtype=dtype)
    storage[GUARD : GUARD + n] = float("nan")
    return storage, storage[GUARD : GUARD + n].view(physical).permute(permute)


class Fp8Run:
    """One plan's buffers in its layouts (q, k, o "bshd"; V transposed with its keys padded to
    v_pitch), filled from real-valued inputs: quantized (e4m3) or rounded (the bf16 twin)."""

    def __init__(self, case: dict, plan, real: dict):
        self.case, self.plan = case, plan
        b, hq, d = case["batch"], case["heads_q"], case["head_dim"]
        sq, skv = case["seq_q"], case["seq_kv"]
        fp8 = case["dtype"] == "e4m3"
        dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        out_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[case["out"]] if fp8 else torch.bfloat16
        self.tensors, self.storage, self.dequantized = {}, {}, {}
        per_head = case["descales"] == "head"
        for name in ("q", "k", "v"):
            x = real[name]
            descale = _descale(x, per_head and name != "v") if fp8 else None
            stored = (x / descale.view(-1, 1, 1)).to(dtype) if fp8 else x.to(dtype)
            if fp8:
                self.tensors[f"{name}_descale"] = descale
            self.dequantized[name] = stored.double() * (descale.double().view(-1, 1, 1) if fp8 else 1.0)
            if name == "v" and fp8:  # (b, h, d, pitch) storage, keys innermost
                storage = torch.zeros(b, x.shape[1], d, v_pitch(skv), device="cuda", dtype=dtype)
                storage[..., :skv] = stored.transpose(2, 3)
                self.tensors[name] = storage[..., :skv].transpose(2, 3)
            else:  # "bshd"
                self.tensors[name] = stored.transpose(1, 2).contiguous().transpose(1, 2)
        self.storage["o"], self.tensors["o"] = _guarded((b, sq, hq, d), (0, 2, 1, 3), out_dtype)
        if case["lse"]:
            self.storage["lse"], self.tensors["lse"] = _guarded((b, hq, sq), (0, 1, 2), torch.float32)
        self.workspace = plan.allocate_workspace() if plan.workspace_bytes else None

    def execute(self) -> None:
        extra = {"workspace": self.workspace} if self.workspace is not None else {}
        self.plan.execute(*(self.tensors[name] for name in self.plan.slots), **extra)
        torch.cuda.synchronize()

    def check_guards(self) -> None:
        for name, storage in self.storage.items():
            for side in (storage[:GUARD], storage[-GUARD:]):
                assert bool((side == SENTINEL).all()), f"{self.case['id']}: a write outside {name}"
        assert not torch.isnan(self.tensors["o"]).any(), f"{self.case['id']}: O has NaN (an output left unwritten)"

    def errors(self, inputs: dict) -> tuple[float, float]:
        """(relative L2 of O, max abs error of the LSE) against float64 attention on `inputs`."""
        err_sq = ref_sq = lse_err = 0.0
        for b in range(self.case["batch"]):
            q, k, v = (inputs[name][b] for name in ("q", "k", "v"))
            ref, ref_lse = reference_sequence(self.case, q, k, v)
            diff = self.tensors["o"][b].double() - ref
            err_sq += float((diff * diff).sum())
            ref_sq += float((ref * ref).sum())
            if self.case["lse"]:
                got = self.tensors["lse"][b].double()
                finite = torch.isfinite(ref_lse)
                assert torch.equal(torch.isfinite(got), finite), "LSE: -inf rows differ"
                if finite.any():
                    lse_err = max(lse_err, float((got[finite] - ref_lse[finite]).abs().max()))
        return math.sqrt(err_sq / max(ref_sq, 1e-300)), lse_err


def _run(case: dict, real: dict) -> Fp8Run:
    import frost_runtime

    plan = frost_runtime.load(FP8_BUILT / case["plan"])
    run = Fp8Run(case, plan, real)
    run.execute()
    run.check_guards()
    return run


@pytest.mark.parametrize("case_id", [c["id"] for c in _manifest() if c["dtype"] == "e4m3"])
def test_fp8_plan_matches_float64(case_id, record_property):
    case = _case(case_id)
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(case_id.encode()))
    run = _run(case, _real_inputs(case, gen, outliers=False))
    o_err, lse_err = run.errors(run.dequantized)
    record_property("relative_l2", o_err)
    print(f"\n{case_id}: relative L2 of O {o_err:.2e}, LSE max abs error {lse_err:.2e}")
    assert o_err < BOUND["normal"], f"relative L2 error {o_err:.3e} over the bound {BOUND['normal']}"
    assert lse_err < LSE_TOLERANCE, f"LSE error {lse_err:.3e} over {LSE_TOLERANCE}"


@pytest.mark.parametrize("data", ["normal", "outliers"])
def test_fp8_error_beside_bf16(data, record_property):
    """The same real inputs through the FP8 plan and its bf16 twin: the FP8 error against its
    dequantized inputs within the bound, and both against the real values, recorded."""
    fp8_case, bf16_case = _case("fp8-d128-full"), _case("bf16-d128-full")
    gen = torch.Generator(device="cuda").manual_seed(20 + (data == "outliers"))
    real = _real_inputs(fp8_case, gen, outliers=data == "outliers")
    fp8, bf16 = _run(fp8_case, real), _run(bf16_case, real)
    real64 = {name: x.double() for name, x in real.items()}
    errors = {
        "e4m3 vs dequantized": fp8.errors(fp8.dequantized)[0],
        "e4m3 vs real": fp8.errors(real64)[0],
        "bf16 vs real": bf16.errors(real64)[0],
    }
    record_property("relative_l2", errors)
    print(f"\n{data}: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    assert errors["e4m3 vs dequantized"] < BOUND[data]
    assert errors["bf16 vs real"] < 0.012  # tests.gpu.support's bf16 tolerance


def test_fp8_plan_is_the_same_bits_every_run():
    """No atomics in the FP8 path: repeated runs on the same inputs give the same bits (the
    dynamic walk's tile order changes, a tile's arithmetic does not)."""
    case = _case("fp8-d128-causal-dynamic")
    gen = torch.Generator(device="cuda").manual_seed(5)
    run = _run(case, _real_inputs(case, gen, outliers=False))
    first = run.tensors["o"].clone()
    for _ in range(20):
        run.tensors["o"].fill_(float("nan"))
        run.execute()
        assert torch.equal(first, run.tensors["o"])
