"""The glue plans (rms_norm, add_rms_norm, silu_mul) against a float64 reference, on the GPU
(tests/gpu/glue_support.py: fresh random rows with outlier channels, outputs poisoned, canary
rows on both sides): every glue plan of tests/.built/llama3-8b-tiny.frostset (Llama-3-8B's
shapes: hidden 4096, MLP 14336; rows 1, 2, 4) and of the tiny Qwen2's set (hidden 896: most of a
CTA's threads hold no piece of the row)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (these tests run on the H200 through the device tool)", allow_module_level=True)

import frost_runtime  # noqa: E402

from tests.gpu.glue_support import GlueBuffers, GlueCase  # noqa: E402

BUILT = Path(__file__).resolve().parent.parent / ".built"
SETS = (BUILT / "llama3-8b-tiny.frostset", BUILT / "hf" / "tiny-qwen2-qkv_fused-glue.frostset")


def test_every_glue_plan_matches_float64() -> None:
    checked = []
    for path in SETS:
        if not path.exists():
            pytest.skip(f"{path} is not built: run `python -m tests.gpu.build_plans --only hf` on the build machine")
        plans = frost_runtime.read_set(path)
        for i, entry in enumerate(plans.glue):
            data = plans.plan_data(entry.key)
            slots = {s.name: s for s in data.slots}
            n = slots["out"].dims[1]
            eps = next((a.value for p, a in zip(data.kernels[0].params, data.launches[0].args) if p.name == "eps"), 0)
            case = GlueCase(entry.op, entry.tokens, n, eps)
            with plans.load(entry.key) as plan:
                buffers = GlueBuffers(case, plan, seed=i)
                buffers.execute()
                torch.cuda.synchronize()
                checked.append(f"{case.id}: {buffers.assert_correct():.2f}")
    assert {c.split("-m")[0] for c in checked} == {"rms_norm", "add_rms_norm", "silu_mul"}
    print("worst error / bound:", "; ".join(checked))
