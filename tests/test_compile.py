"""Stage 4 and the whole pipeline: a real offline compile of the default example (bf16, head
dim 128, causal, with lse) for sm_90a, without a GPU, and the checks on what comes out: the
cubin, the kernel's launch facts, the parameter ABI against the PTX, and reproducible plans.

The kernel is compiled once per process (frostc.compile caches variants); every test here
reads the same plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from frost_runtime.schema import PlanData, decode_plan

import frostc.compile
from frostc.build import build
from frostc.compile import CompileError, check_abi
from frostc.description import load_description
from frostc.kernels.sdpa_common import MaskFlags
from frostc.kernels.sdpa_fwd_wgmma import SdpaFwdVariant
from frostc.planfile import build_key

DEFAULT = Path(__file__).resolve().parent.parent / "plans" / "examples" / "default.toml"
VARIANT = SdpaFwdVariant("bf16", 128, MaskFlags(right=True), has_lse=True, walk="paired")


@pytest.fixture(scope="module")
def plan_bytes() -> bytes:
    return build(load_description(DEFAULT))


@pytest.fixture(scope="module")
def plan(plan_bytes: bytes) -> PlanData:
    return decode_plan(plan_bytes)


# ------------------------------------------------------------------------------ the kernel


def test_one_kernel_of_the_expected_variant(plan: PlanData) -> None:
    assert [k.name for k in plan.kernels] == ["sdpa_fwd_wgmma.bf16.d128.causal.paired.lse"]


def test_cubin_is_an_elf_file(plan: PlanData) -> None:
    assert plan.kernels[0].cubin.startswith(b"\x7fELF")


def test_entry_name_is_in_the_cubin(plan: PlanData) -> None:
    kernel = plan.kernels[0]
    assert kernel.entry
    assert kernel.entry.encode() in kernel.cubin


def test_launch_geometry(plan: PlanData) -> None:
    kernel = plan.kernels[0]
    # Q 32 KiB + O 32 KiB + two stages of 32 KiB K and 32 KiB V, plus the pipelines' mbarriers
    assert 196608 < kernel.smem_bytes <= 196608 + 2048 <= 227 * 1024
    assert kernel.block == (384, 1, 1)  # a producer and two consumer warpgroups
    assert kernel.cluster == (1, 1, 1)
    assert kernel.tiles == {
        "block_m": 128, "block_n": 128, "threads": 384, "consumer_warpgroups": 2, "stages": 2, "o_buffer": 1,
        "ctas_per_sm": 1,
    }  # fmt: skip
    assert kernel.ctas_per_sm == 1  # persistent: the runtime caps the grid at the SM count
    assert kernel.grid_rule.startswith("(min(ceil(seq_q / 128) * heads_q * batch, SMs * 1), 1, 1)")


def test_params_are_the_kernel_abi(plan: PlanData) -> None:
    assert tuple((p.name, p.kind) for p in plan.kernels[0].params) == VARIANT.params


def test_header(plan: PlanData) -> None:
    h = plan.header
    assert h.name == "default"
    assert h.target_arch == "sm_90a"
    assert h.min_driver == frostc.compile.MIN_DRIVER == 13000
    assert h.frostc_version == frostc.__version__
    assert h.cutlass_dsl_version == frostc.compile.dsl_version()
    assert len(h.build_key) == 64


def test_launch_binds_slots_and_constants(plan: PlanData) -> None:
    (launch,) = plan.launches
    assert launch.kernel == 0
    assert launch.grid == (1024 // 128 * 16 * 2, 1, 1)  # tiles
    args = {p.name: a for p, a in zip(plan.kernels[0].params, launch.args)}
    assert [args[name].slot for name in ("q.tmap", "k.tmap", "v.tmap", "o", "lse")] == [0, 1, 2, 3, 4]
    assert args["group"].value == 4
    assert (args["seq_q"].value, args["seq_kv"].value) == (1024, 1024)
    assert args["q.extents"].value == (1024, 16, 2)
    assert args["k.extents"].value == args["v.extents"].value == (1024, 4, 2)
    assert [args[f"o.stride_{x}"].value for x in "bhs"] == [1024 * 16 * 128, 128, 16 * 128]  # bshd


def test_tensor_maps_are_full_with_a_zero_address(plan: PlanData) -> None:
    """The map is the DSL's own encoding; the runtime writes only the address (bytes 0..7)."""
    args = {p.name: a for p, a in zip(plan.kernels[0].params, plan.launches[0].args)}
    maps = [args[f"{name}.tmap"].tmap for name in "qkv"]
    assert all(len(m) == 128 and m[:8] == bytes(8) and any(m[8:]) for m in maps)
    assert maps[1] == maps[2] or maps[1] != maps[0]  # K and V share extents; Q has its own


def test_compiled_variant_is_cached(plan: PlanData) -> None:
    compiled = frostc.compile._cache[VARIANT]
    assert compiled.cubin == plan.kernels[0].cubin
    assert compiled.entry == plan.kernels[0].entry
    again = frostc.compile.compile_kernels([VARIANT])  # no recompile: the same object
    assert again[VARIANT] is compiled


# ------------------------------------------------------------------------------ the ABI check

ENTRY = "toy_kernel"
KIND_PTX = {
    "ptr": ".u64 .ptr .global .align 16",
    "i32": ".u32",
    "i64": ".u64",
    "f32": ".f32",
    "tmap": ".align 64 .b8",
    "i32x3": ".align 4 .b8",
}
KIND_SUFFIX = {"tmap": "[128]", "i32x3": "[12]"}


def ptx_for(kinds: list[str], entry: str = ENTRY) -> str:
    """A PTX module whose one `.entry` has parameters of `kinds`, written the way the DSL writes them."""
    params = ",\n".join(
        f"\t.param {KIND_PTX[kind]} {entry}_param_{i}{KIND_SUFFIX.get(kind, '')}" for i, kind in enumerate(kinds)
    )
    return f".version 8.8\n.target sm_90a\n.address_size 64\n\n.visible .entry {entry}(\n{params}\n)\n{{\n\tret;\n}}\n"


TOY_PARAMS = (("q", "ptr"), ("seq_q", "i32"), ("q.stride_b", "i64"), ("scale_log2", "f32"))


def test_check_abi_accepts_a_matching_signature() -> None:
    check_abi("toy", ptx_for(["ptr", "i32", "i64", "f32"]), ENTRY, TOY_PARAMS)


def test_check_abi_accepts_the_full_kernel_abi() -> None:
    params = VARIANT.params
    check_abi("sdpa", ptx_for([kind for _, kind in params]), ENTRY, params)


def test_check_abi_takes_a_one_int_struct_as_i32() -> None:
    """A coordinate tensor with one dynamic extent is passed as a 4-byte struct."""
    ptx = ptx_for(["i32x3"]).replace("[12]", "[4]")
    check_abi("ragged", ptx, ENTRY, (("q.extents", "i32"),))


def test_check_abi_rejects_a_wrong_parameter_count() -> None:
    with pytest.raises(CompileError, match="the PTX entry has 3 parameters, the ABI lists 4"):
        check_abi("toy", ptx_for(["ptr", "i32", "i64"]), ENTRY, TOY_PARAMS)


@pytest.mark.parametrize(
    ("ptx_kinds", "bad_index", "bad_name"),
    [
        (["ptr", "i64", "i64", "f32"], 1, "seq_q"),  # an i32 declared, a .u64 compiled
        (["ptr", "i32", "ptr", "f32"], 2, "q.stride_b"),  # an i64 must not match a pointer
        (["i64", "i32", "i64", "f32"], 0, "q"),  # a pointer must be .u64 .ptr
        (["ptr", "i32", "i64", "i32"], 3, "scale_log2"),
    ],
)
def test_check_abi_rejects_a_wrong_kind_naming_the_parameter(
    ptx_kinds: list[str], bad_index: int, bad_name: str
) -> None:
    with pytest.raises(CompileError) as e:
        check_abi("toy", ptx_for(ptx_kinds), ENTRY, TOY_PARAMS)
    assert f"parameter {bad_index} ({bad_name})" in str(e.value)
    assert str(e.value).startswith("toy: ")


def test_check_abi_rejects_a_missing_entry() -> None:
    with pytest.raises(CompileError, match="entry other_kernel not found"):
        check_abi("toy", ptx_for(["ptr"]), "other_kernel", (("q", "ptr"),))


def test_check_abi_finds_its_entry_among_several() -> None:
    ptx = ptx_for(["i32"], entry="toy_kernel_helper") + ptx_for(["ptr", "i32", "i64", "f32"])
    check_abi("toy", ptx, ENTRY, TOY_PARAMS)


def test_compile_error_is_a_frostc_error() -> None:
    assert issubclass(CompileError, frostc.FrostcError)


# ------------------------------------------------------------------------------ reproducibility


def test_plan_bytes_are_identical_across_builds(plan_bytes: bytes) -> None:
    assert build(load_description(DEFAULT)) == plan_bytes


def test_build_key_is_stable_across_builds(plan: PlanData) -> None:
    again = decode_plan(build(load_description(DEFAULT)))
    assert again.header.build_key == plan.header.build_key
    assert build_key(load_description(DEFAULT).to_dict()) == plan.header.build_key


def test_build_key_follows_the_description() -> None:
    desc = load_description(DEFAULT).to_dict()
    other = desc | {"name": "other"}
    assert build_key(desc) != build_key(other)


def test_progress_reports_start_and_done() -> None:
    events = []
    build(load_description(DEFAULT), progress=lambda event, variant: events.append((event, variant)))
    assert events == [("start", VARIANT), ("done", VARIANT)]


def test_dump_writes_every_stage(tmp_path: Path, plan: PlanData) -> None:
    build(load_description(DEFAULT), dump_dir=tmp_path / "stages")
    names = sorted(p.name for p in (tmp_path / "stages").iterdir())
    assert names == [
        "1-description.toml",
        "2-graph.json",
        "3-resolved.json",
        "4-sdpa_fwd_wgmma.bf16.d128.causal.paired.lse.cubin",
    ]
    assert (tmp_path / "stages" / names[-1]).read_bytes() == plan.kernels[0].cubin
    assert load_description(tmp_path / "stages" / "1-description.toml") == load_description(DEFAULT)
