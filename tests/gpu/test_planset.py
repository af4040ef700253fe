"""A plan set's plans load and run like their standalone builds: `PlanSet.load(key)` is
`frost_runtime.load` on the rebuilt bytes (tests/.built/llama3-8b-tiny.frostset, written by
`python -m tests.gpu.build_plans`; skipped where it is not built or there is no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import frost_runtime  # noqa: E402

SET = Path(__file__).resolve().parent.parent / ".built" / "llama3-8b-tiny.frostset"


@pytest.fixture(scope="module")
def plans():
    if not SET.exists():
        pytest.skip(f"{SET} is not built: run `python -m tests.gpu.build_plans` on the build machine")
    return frost_runtime.read_set(SET)


def test_every_plan_of_the_set_loads(plans) -> None:
    for key in plans.keys:
        with plans.load(key) as plan:
            assert plan.slots == tuple(s.name for s in plans.plan_data(key).slots)


def test_a_selected_decode_plan_binds_and_runs(plans) -> None:
    key = plans.select("decode", "l0", 3)
    with plans.load(key, sha256=plans.entry(key).sha256) as plan:
        data = plans.plan_data(key)
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "int32": torch.int32}
        buffers = []
        for s in data.slots:
            size = 1 + sum((d - 1) * st for d, st in zip(s.dims, s.strides))
            buffers.append(torch.zeros(size, dtype=dtypes[s.dtype], device="cuda").as_strided(s.dims, s.strides))
        named = dict(zip(plan.slots, buffers))
        named["cache_len"].fill_(1)
        plan.execute(*buffers, workspace=plan.allocate_workspace())
        torch.cuda.synchronize()
        assert torch.isfinite(named["o"].float()).all()
