"""Each kernel's interface is declared once, in its `Args` record (frostc/kernels/interface.py):
the parameter ABI, the compile stand-ins and the launch binding all derive from it."""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

import frostc
from frostc.kernels.interface import (
    F32,
    I32,
    I64,
    BhsStrides,
    Group,
    Ptr,
    TmaSource,
    TmaTensor,
    Variant,
    abi,
    declared,
    entry_name,
    facets,
    host_only,
    leaves,
    params,
    pointer,
    stand_ins,
    tma,
    when,
)
from frostc.kernels.kv_append import KvAppendVariant
from frostc.kernels.rms_norm import RmsNormVariant
from frostc.kernels.sdpa_common import MaskFlags
from frostc.kernels.sdpa_decode_combine import DecodeCombineVariant
from frostc.kernels.sdpa_decode_paged import PagedDecodeVariant
from frostc.kernels.sdpa_fwd_wgmma import SdpaFwdVariant
from frostc.kernels.sdpa_schedule import ScheduleVariant
from frostc.kernels.silu_mul import SiluMulVariant
from frostc.kernels.vt_pack import VtPackVariant

ROOT = Path(frostc.__file__).resolve().parent


@dataclass(frozen=True)
class Extra(Group):
    count: I32
    bias: F32 = abi("extra.bias")


@dataclass(frozen=True)
class ToyArgs:
    x: TmaTensor = tma(extents=lambda v: "i32x3" if v.dense else "i32")
    out: Ptr = pointer(of="out_dtype")
    table: Ptr = pointer("int32", align=4)
    x_strides: BhsStrides = facets("x")
    out_stride: I64 = abi("out.stride_m")
    extra: Extra | None = when(lambda v: v.extra)
    helper: Any = host_only(lambda v: SiluMulVariant("bf16", 64))


@dataclass(frozen=True)
class Toy(Variant):
    ARGS: ClassVar[type] = ToyArgs
    dense: bool = True
    extra: bool = False
    dtype: str = "bf16"
    out_dtype: str = "fp16"
    name: str = "toy.x"


def test_a_parameter_is_named_by_its_field_its_abi_name_or_its_tensor() -> None:
    assert params(Toy()) == (
        ("x.tmap", "tmap"),
        ("x.extents", "i32x3"),
        ("out", "ptr"),
        ("table", "ptr"),
        ("x.stride_b", "i64"),
        ("x.stride_h", "i64"),
        ("x.stride_s", "i64"),
        ("out.stride_m", "i64"),
    )


def test_optional_groups_and_kinds_follow_the_variant_and_host_only_fields_take_no_parameter() -> None:
    names = [name for name, _ in params(Toy(dense=False, extra=True))]
    assert names[1] == "x.extents" and dict(params(Toy(dense=False)))["x.extents"] == "i32"
    assert names[-2:] == ["count", "extra.bias"]
    assert "helper" not in names and all(not p.name.startswith("helper") for p in declared(Toy()))


def test_stand_ins_have_each_pointers_dtype_and_alignment_and_each_scalars_type() -> None:
    import cutlass  # after frostc.kernels, which sets the DSL's target before its first import

    record = stand_ins(Toy(extra=True))
    assert isinstance(record.x, TmaSource) and len(record.x.strides) == 3
    assert record.out.dtype is cutlass.Float16 and record.out._assumed_align == 16
    assert record.table.dtype is cutlass.Int32 and record.table._assumed_align == 4
    assert isinstance(record.x_strides.stride_b, cutlass.Int64) and isinstance(record.extra.bias, cutlass.Float32)
    assert record.helper.x.dtype is cutlass.BFloat16  # the host-only record: its own kernel's stand-ins


def test_leaves_give_each_parameter_its_value_from_a_filled_record() -> None:
    record = ToyArgs(TmaSource("X", (1, 2, 3), extents=(7, 8, 9)), "O", None, BhsStrides(4, 5, 6), 10, None, None)
    assert [(p.name, v) for p, v in leaves(Toy(), record)] == [
        ("x.tmap", "X"),
        ("x.extents", (7, 8, 9)),
        ("out", "O"),
        ("table", None),
        ("x.stride_b", 4),
        ("x.stride_h", 5),
        ("x.stride_s", 6),
        ("out.stride_m", 10),
    ]


def test_an_entry_is_named_after_its_variant() -> None:
    assert entry_name("sdpa_schedule.padded.q+kv.m128n128.causal") == "frostc_sdpa_schedule_padded_q_kv_m128n128_causal"


# ------------------------------------------------------------------------------ every kernel


def _variants() -> list:
    fwd = SdpaFwdVariant("bf16", 128, MaskFlags(right=True), True)
    fp8 = SdpaFwdVariant("e4m3", 128, MaskFlags(), False, out_dtype="bf16", varlen=True, v_layout="packed")
    return [
        SiluMulVariant("bf16", 4096),
        RmsNormVariant("bf16", 4096, True),
        KvAppendVariant("bf16", 128, "bf16"),
        KvAppendVariant("bf16", 128, "e4m3"),
        DecodeCombineVariant("bf16", 128, True),
        PagedDecodeVariant("bf16", "bf16", 128, 16, True, True, False),
        PagedDecodeVariant("bf16", "e4m3", 128, 16, True, False, True),
        VtPackVariant(128),
        VtPackVariant(128, batched=True),
        fwd,
        fp8,
        ScheduleVariant(True, True, True, MaskFlags(), 128, 128),
        ScheduleVariant(True, True, True, MaskFlags(), 128, 128, v_maps_of=fp8),
    ]


@pytest.mark.parametrize("variant", _variants(), ids=lambda v: v.name)
def test_every_kernels_parameters_are_distinct_and_of_known_kinds(variant) -> None:
    names = [name for name, _ in variant.params]
    assert len(names) == len(set(names))
    assert {kind for _, kind in variant.params} <= {"ptr", "i32", "i64", "f32", "tmap", "i32x3"}
    assert dataclasses.is_dataclass(stand_ins(variant))


def _abi_names() -> set[str]:
    """Every parameter name of every kernel that has a dot: "<tensor>.<what>"."""
    return {name for v in _variants() for name, _ in v.params if "." in name}


def _string_constants(path: Path) -> set[str]:
    return {
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_no_op_or_stage_spells_a_kernel_parameter_out_again() -> None:
    """A kernel argument is written in its Args (and filled by field name in its op): no op and
    no stage names a parameter by its plan name, as they once did in value dicts and asserts."""
    names = _abi_names()
    assert {"q.rows_per_batch", "k_cache.stride_p", "x.stride_m"} <= names
    found = {}
    for path in [*(ROOT / "ops").glob("*.py"), *ROOT.glob("*.py")]:
        spelled = _string_constants(path) & names
        if spelled:
            found[path.name] = sorted(spelled)
    assert found == {}
