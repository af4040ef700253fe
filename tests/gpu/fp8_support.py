"""What the FP8 tests and the sanitizer's FP8 plans share: real-valued inputs, their
quantization as a serving engine does it (descale = amax / 448, per head or per tensor),
`Fp8Run`: one dense plan's buffers in its layouts (V transposed), O poisoned inside sentinel
guards, and `Fp8VarlenRun`: a padded or packed plan's, with lengths and NaN padding."""

from __future__ import annotations

import math

from tests.gpu.fp8_cases import v_pitch
from tests.gpu.support import BUILT, GUARD, SENTINEL, reference_sequence

FP8_BUILT = BUILT / "fp8"

E4M3_MAX = 448.0
# relative L2 of O against float64 on the dequantized inputs, by data (tests/gpu/test_fp8_dense.py)
BOUND = {"normal": 0.04, "outliers": 0.03}
LSE_TOLERANCE = 2e-3  # max abs error of the natural-log LSE
OUTLIER_CHANNELS = (3, 40, 77, 121)
OUTLIER_GAIN = 50.0


def fp8_skip_reason() -> str | None:
    """Why the FP8 GPU tests cannot run here, or None."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (these tests run on the H200 through the device tool)"
    if torch.cuda.get_device_capability() != (9, 0):
        return "plans target sm_90a; this GPU is another"
    if not (FP8_BUILT / "manifest.json").exists():
        return f"no built plans in {FP8_BUILT}: run `python -m tests.gpu.build_plans --only fp8` on the build machine"
    return None


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
            if name == "v" and fp8 and case["v_layout"] == "keys":  # (b, h, d, pitch) storage, keys innermost
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


def _e4m3_nan(t) -> None:
    """NaN into an e4m3 tensor (view) in place: the byte 0x7F."""
    import torch

    t.view(torch.uint8).fill_(0x7F)


class Fp8VarlenRun:
    """A padded or packed FP8 plan's buffers: real N(0, 1) values quantized as in `Fp8Run`
    (descales over the whole buffers), lengths drawn as the 16-bit tests draw them
    (`draw_lengths`), every input row outside the sequences NaN (padded V's in its Vᵀ storage,
    the pitch's columns too), O and LSE poisoned with NaN inside sentinel guards."""

    def __init__(self, case: dict, plan, gen, lengths: tuple):
        import torch

        self.case, self.plan = case, plan
        b, hq, hkv, d = case["batch"], case["heads_q"], case["heads_kv"], case["head_dim"]
        self.packed = case["form"] == "packed"
        self.tensors, self.storage, self.dequantized = {}, {}, {}
        e4m3 = torch.float8_e4m3fn
        out = {"bf16": torch.bfloat16, "fp16": torch.float16}[case["out"]]
        if self.packed:  # (t, h, d) each, V too (the plan re-lays it)
            tq, tkv = case["tokens_q"], case["tokens_kv"]
            self.shapes = {"q": (tq, hq, d), "k": (tkv, hkv, d), "v": (tkv, hkv, d)}
            for name, shape in self.shapes.items():
                self.tensors[name] = torch.empty(shape, device="cuda", dtype=e4m3)
            self.storage["o"], self.tensors["o"] = _guarded((tq, hq, d), (0, 1, 2), out)
            if case["lse"]:
                self.storage["lse"], self.tensors["lse"] = _guarded((hq, tq), (1, 0), torch.float32)
            sides = ("q", "kv")
        else:
            sq, skv = case["seq_q"], case["seq_kv"]
            self.shapes = {"q": (b, hq, sq, d), "k": (b, hkv, skv, d), "v": (b, hkv, skv, d)}
            self.v_rows = case["v_layout"] == "rows"  # V "bshd" like q and k (the plan re-lays it)
            for name in ("q", "k", "v") if self.v_rows else ("q", "k"):  # "bshd"
                h, s_ = self.shapes[name][1], self.shapes[name][2]
                self.tensors[name] = torch.empty(b, s_, h, d, device="cuda", dtype=e4m3).transpose(1, 2)
            if not self.v_rows:
                self.v_storage = torch.zeros(b, hkv, d, v_pitch(skv), device="cuda", dtype=e4m3)  # keys innermost
                self.tensors["v"] = self.v_storage[..., :skv].transpose(2, 3)
            self.storage["o"], self.tensors["o"] = _guarded((b, sq, hq, d), (0, 2, 1, 3), out)
            if case["lse"]:
                self.storage["lse"], self.tensors["lse"] = _guarded((b, hq, sq), (0, 1, 2), torch.float32)
            sides = {"qkv": ("q", "kv"), "q": ("q",), "kv": ("kv",)}[case["lengths"]]
        for name, shape in self.shapes.items():
            self.tensors[f"{name}_descale"] = torch.empty(shape[1] if self._per_head(name) else 1, device="cuda")
        for side in sides:
            self.tensors[f"{side}_lengths"] = torch.zeros(b + self.packed, dtype=torch.int32, device="cuda")
        self.workspace = plan.allocate_workspace()
        self.fill(gen, lengths)

    def _per_head(self, name: str) -> bool:
        return self.case["descales"] == "head" and name != "v"

    def fill(self, gen, lengths: tuple) -> None:
        """Fresh values quantized into the same buffers, the lengths written into the same
        length tensors, rows outside the sequences NaN, outputs poisoned again."""
        import torch

        self.q_lens, self.kv_lens, self.start = lengths
        view = (1, -1, 1) if self.packed else (1, -1, 1, 1)  # per head: dim 1
        for name, shape in self.shapes.items():
            x = torch.randn(shape, device="cuda", generator=gen)
            others = tuple(i for i in range(x.dim()) if i != 1)
            amax = x.abs().amax(dim=others) if self._per_head(name) else x.abs().amax().reshape(1)
            descale = (amax / E4M3_MAX).float()
            stored = (x / descale.view(view)).to(torch.float8_e4m3fn)
            self.tensors[f"{name}_descale"].copy_(descale)
            self.dequantized[name] = stored.double() * descale.double().view(view)
            self.tensors[name].copy_(stored)
        for side, lens in (("q", self.q_lens), ("kv", self.kv_lens)):
            if f"{side}_lengths" in self.tensors:
                values = [self.start + sum(lens[:i]) for i in range(len(lens) + 1)] if self.packed else list(lens)
                self.tensors[f"{side}_lengths"].copy_(torch.tensor(values, dtype=torch.int32))
        self._poison()
        for name, storage in self.storage.items():
            storage.fill_(SENTINEL)
            self.tensors[name].fill_(float("nan"))

    def _poison(self) -> None:
        """NaN in every input row the plan must not read: one load of any, even multiplied by a
        zero probability, makes O NaN."""
        t = self.tensors
        if self.packed:
            for name, lens in (("q", self.q_lens), ("k", self.kv_lens), ("v", self.kv_lens)):
                _e4m3_nan(t[name][: self.start])
                _e4m3_nan(t[name][self.start + sum(lens) :])
            return
        for b, (lq, lkv) in enumerate(zip(self.q_lens, self.kv_lens)):
            _e4m3_nan(t["q"][b, :, lq:])
            _e4m3_nan(t["k"][b, :, lkv:])
            if self.v_rows:
                _e4m3_nan(t["v"][b, :, lkv:])
            else:
                _e4m3_nan(self.v_storage[b, :, :, lkv:])  # the pitch's columns too

    def execute(self) -> None:
        import torch

        self.plan.execute(*(self.tensors[name] for name in self.plan.slots), workspace=self.workspace)
        torch.cuda.synchronize()

    def _sequences(self):
        """Per sequence: dequantized q, k, v (h, s, d), O rows (h, s, d), LSE rows (h, s) or None."""
        deq, t = self.dequantized, self.tensors
        q_at = kv_at = self.start
        for b, (lq, lkv) in enumerate(zip(self.q_lens, self.kv_lens)):
            if self.packed:
                rq, rkv = slice(q_at, q_at + lq), slice(kv_at, kv_at + lkv)
                q_at, kv_at = q_at + lq, kv_at + lkv
                lse = t["lse"][rq].transpose(0, 1) if "lse" in t else None
                yield (deq["q"][rq].transpose(0, 1), deq["k"][rkv].transpose(0, 1), deq["v"][rkv].transpose(0, 1),
                       t["o"][rq].transpose(0, 1), lse)  # fmt: skip
            else:
                lse = t["lse"][b, :, :lq] if "lse" in t else None
                yield deq["q"][b, :, :lq], deq["k"][b, :, :lkv], deq["v"][b, :, :lkv], t["o"][b, :, :lq], lse

    def _untouched(self):
        """Output rows past each padded sequence, or outside the packed sequences."""
        t = self.tensors
        names = ["o"] + (["lse"] if "lse" in t else [])
        if self.packed:
            end = self.start + sum(self.q_lens)
            for name in names:
                yield t[name][: self.start]
                yield t[name][end:]
            return
        for b, lq in enumerate(self.q_lens):
            for name in names:
                yield t[name][b, :, lq:]

    def errors(self) -> tuple[float, float]:
        """(relative L2 of O over all sequences, max abs LSE error), checking that every row of
        a sequence was written, rows seeing no key have LSE -inf, and nothing else was."""
        import torch

        err_sq = ref_sq = lse_err = 0.0
        for q, k, v, o, lse in self._sequences():
            ref, ref_lse = reference_sequence(self.case, q, k, v)
            assert not torch.isnan(o).any(), f"{self.case['id']}: O rows of a sequence were never written"
            diff = o.double() - ref
            err_sq += float((diff * diff).sum())
            ref_sq += float((ref * ref).sum())
            if lse is not None and lse.numel():
                finite = torch.isfinite(ref_lse)
                assert torch.equal(torch.isfinite(lse), finite), "LSE: -inf rows differ"
                if finite.any():
                    lse_err = max(lse_err, float((lse.double()[finite] - ref_lse[finite]).abs().max()))
        for rows in self._untouched():
            assert bool(torch.isnan(rows).all()), f"{self.case['id']}: wrote rows outside the sequences"
        for name, storage in self.storage.items():
            for side in (storage[:GUARD], storage[-GUARD:]):
                assert bool((side == SENTINEL).all()), f"{self.case['id']}: a write outside {name}"
        return (math.sqrt(err_sq / ref_sq) if ref_sq else math.sqrt(err_sq)), lse_err

    def assert_correct(self) -> None:
        o_err, lse_err = self.errors()
        assert o_err < BOUND["normal"], f"relative L2 error {o_err:.3e} over the bound {BOUND['normal']}"
        assert lse_err < LSE_TOLERANCE, f"LSE error {lse_err:.3e} over {LSE_TOLERANCE}"
