"""The dtype table (runtime/frost_runtime/dtypes.py) is the one source: every stage's view of a
dtype derives from it and agrees with torch and the CuTe DSL about sizes."""

from __future__ import annotations

import pytest
from frost_runtime import dtypes, plan

from frostc import models
from frostc.kernels.sdpa_common import dsl_dtype
from frostc.ops import kv_append, sdpa
from frostc.resolve import SLOT_ALIGN

torch = pytest.importorskip("torch")


def test_every_stage_takes_the_table() -> None:
    assert dtypes.NAMES == ("bf16", "fp16", "fp32", "int32", "e4m3")
    assert dtypes.ELEMENT_BYTES == {name: d.bytes for name, d in dtypes.DTYPES.items()}
    assert SLOT_ALIGN == {name: d.align for name, d in dtypes.DTYPES.items()}
    assert plan.TYPESTR == {name: d.typestr for name, d in dtypes.DTYPES.items()}
    assert sdpa.DATA_DTYPES == kv_append.DATA_DTYPES == models.SERVED_DTYPES == dtypes.ATTENTION == ("bf16", "fp16")
    assert models.HF_DTYPES == {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    assert dtypes.KV_CACHE == ("bf16", "fp16", "e4m3") and dtypes.QUANTIZED_CACHE == ("e4m3",)
    assert float(torch.finfo(torch.float8_e4m3fn).max) == dtypes.E4M3_MAX


@pytest.mark.parametrize("name", dtypes.NAMES)
def test_sizes_agree_with_torch_and_the_dsl(name: str) -> None:
    d = dtypes.DTYPES[name]
    assert dtypes.torch_dtype(name).itemsize == d.bytes
    assert dsl_dtype(name).width == 8 * d.bytes
    assert dtypes.from_torch(dtypes.torch_dtype(name)) == name
    assert d.align % d.bytes == 0 and int(d.typestr[2:]) == d.bytes
