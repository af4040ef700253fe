"""What the FP8 dense tests and the sanitizer's FP8 plans share: real-valued inputs, their
quantization as a serving engine does it (descale = amax / 448, per head or per tensor), and
`Fp8Run`: one plan's buffers in its layouts (V transposed), O poisoned inside sentinel guards."""

from __future__ import annotations

import math

from tests.gpu.fp8_cases import v_pitch
from tests.gpu.support import GUARD, SENTINEL, reference_sequence

E4M3_MAX = 448.0
# relative L2 of O against float64 on the dequantized inputs, by data (tests/gpu/test_fp8_dense.py)
BOUND = {"normal": 0.04, "outliers": 0.03}
LSE_TOLERANCE = 2e-3  # max abs error of the natural-log LSE
OUTLIER_CHANNELS = (3, 40, 77, 121)
OUTLIER_GAIN = 50.0


def real_inputs(case: dict, gen, outliers: bool) -> dict:
    import torch

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
    import torch

    n = math.prod(physical)
    storage = torch.full((n + 2 * GUARD,), SENTINEL, device="cuda", dtype=dtype)
    storage[GUARD : GUARD + n] = float("nan")
    return storage, storage[GUARD : GUARD + n].view(physical).permute(permute)


class Fp8Run:
    """One plan's buffers in its layouts (q, k, o "bshd"; V transposed with its keys padded to
    v_pitch), filled from real-valued inputs: quantized (e4m3) or rounded (the bf16 twin)."""

    def __init__(self, case: dict, plan, real: dict):
        import torch

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
            else:  # "bshd" storage (a head dim of 1 keeps the layout's strides, as the plan has them)
                b_, h_, s_, d_ = stored.shape
                self.tensors[name] = torch.empty(b_, s_, h_, d_, device="cuda", dtype=dtype).transpose(1, 2)
                self.tensors[name].copy_(stored)
        self.storage["o"], self.tensors["o"] = _guarded((b, sq, hq, d), (0, 2, 1, 3), out_dtype)
        if case["lse"]:
            self.storage["lse"], self.tensors["lse"] = _guarded((b, hq, sq), (0, 1, 2), torch.float32)
        self.workspace = plan.allocate_workspace() if plan.workspace_bytes else None

    def execute(self) -> None:
        import torch

        extra = {"workspace": self.workspace} if self.workspace is not None else {}
        self.plan.execute(*(self.tensors[name] for name in self.plan.slots), **extra)
        torch.cuda.synchronize()

    def check_guards(self) -> None:
        import torch

        for name, storage in self.storage.items():
            for side in (storage[:GUARD], storage[-GUARD:]):
                assert bool((side == SENTINEL).all()), f"{self.case['id']}: a write outside {name}"
        assert not torch.isnan(self.tensors["o"]).any(), f"{self.case['id']}: O has NaN (an output left unwritten)"

    def errors(self, inputs: dict) -> tuple[float, float]:
        import torch

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

    def assert_correct(self) -> None:
        """Guards intact, O written, within the N(0, 1) bound against the dequantized inputs."""
        self.check_guards()
        o_err, lse_err = self.errors(self.dequantized)
        assert o_err < BOUND["normal"], f"relative L2 error {o_err:.3e} over the bound {BOUND['normal']}"
        assert lse_err < LSE_TOLERANCE, f"LSE error {lse_err:.3e} over {LSE_TOLERANCE}"
