"""Plan sets (runtime/frost_runtime/planset.py, frostc/buildset.py): a tiny Llama-3-8B set (batch
sizes 1, 2, 4: six plans, five kernels) built once; each plan in it is byte for byte the plan
`frostc build` writes; the same inputs give the same bytes; select picks the smallest bucket; any
changed, foreign, truncated or unpinned file is refused with PlanFormatError naming what."""

from __future__ import annotations

import hashlib

import frost_runtime
import msgpack
import pytest
from frost_runtime import PlanFormatError, PlanIntegrityError, planset, read_set

from frostc.build import build
from frostc.buildset import build_set
from frostc.models import read_model
from frostc.serving import deployment, layer_kinds, plan_list
from tests.model_configs import LLAMA3_8B

SIZES = (1, 2, 4)


@pytest.fixture(scope="module")
def tiny():
    model = read_model(LLAMA3_8B)
    dep = deployment(model, batch_sizes=SIZES)
    return model, dep, build_set(model, dep, name="llama3-8b")


def _top(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False)


def _reseal(top: dict) -> bytes:
    """The set with its content hash recomputed over what `top` holds now (a careful forger)."""
    fields = {k: v for k, v in top["header"].items() if k != "content_hash"}
    header = planset.SetHeader(**fields)
    top["header"]["content_hash"] = planset.set_content_hash(header, top["manifest"], top["cubins"])
    return planset._pack(top)


def test_each_plan_is_the_standalone_build(tiny) -> None:
    model, dep, result = tiny
    ps = read_set(result.data)
    entries = plan_list(layer_kinds(model, dep), dep)
    assert ps.keys == tuple(e.key for e in entries)
    for e in entries:
        standalone = build(e.description)
        assert ps.plan_bytes(e.key) == standalone
        assert ps.entry(e.key).sha256 == hashlib.sha256(standalone).hexdigest()
        assert ps.plan_data(e.key) == frost_runtime.verify_plan(standalone)


def test_cubins_are_stored_once(tiny) -> None:
    _, _, result = tiny
    ps = read_set(result.data)
    assert result.plans == 6 and result.kernels == 5 and result.cubins == 5 == len(ps.cubins)
    assert result.cubin_bytes_per_plan == 3 * result.cubin_bytes  # every kernel serves its 3 buckets
    assert len(result.data) < sum(len(ps.plan_bytes(k)) for k in ps.keys) / 2


def test_the_same_inputs_give_the_same_bytes(tiny) -> None:
    model, dep, result = tiny
    assert build_set(model, dep, name="llama3-8b").data == result.data


def test_metadata_and_identity(tiny) -> None:
    _, _, result = tiny
    ps = read_set(result.data)
    e = ps.entry("l0-decode-b2")
    assert (e.phase, e.batch, e.kind, e.layers) == ("decode", 2, "l0", tuple(range(32)))
    assert ps.sha256 == frost_runtime.plan_sha256(result.data)
    assert ps.header.name == "llama3-8b" and "llama: 32 layers" in ps.header.model
    assert ps.kind_of(31) == "l0" and ps.kinds == ("l0",)
    with pytest.raises(KeyError, match="has no plan 'l0-decode-b8'"):
        ps.entry("l0-decode-b8")


def test_the_set_records_each_kinds_attention(tiny) -> None:
    model, dep, built = tiny
    (kind,) = layer_kinds(model, dep)
    info = read_set(built.data).kind_info
    assert info == {"l0": planset.KindInfo("l0", kind.layers, 32, 8, 128, "bf16", kind.scale, None, None)}
    serving = read_set(built.data).serving
    assert (serving.max_cache_len, serving.page_size, serving.pages) == (dep.max_cache_len, dep.page_size, dep.pages)
    assert (serving.max_pages, serving.new_tokens, serving.tp) == (dep.max_pages, 1, 1)


def test_select_takes_the_smallest_bucket_that_fits(tiny) -> None:
    ps = read_set(tiny[2].data)
    assert [ps.select("decode", "l0", b) for b in (1, 2, 3, 4)] == [
        "l0-decode-b1", "l0-decode-b2", "l0-decode-b4", "l0-decode-b4",
    ]  # fmt: skip
    assert ps.select("prefill", "l0", 1) == "l0-prefill-b1"
    with pytest.raises(ValueError, match=r"batch 5 is larger than the largest decode bucket .*: 4 \(l0-decode-b4\)"):
        ps.select("decode", "l0", 5)
    with pytest.raises(KeyError, match="no decode plan for layer kind 'l1'; its kinds: l0"):
        ps.select("decode", "l1", 1)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="expected an int >= 1"):
            ps.select("decode", "l0", bad)
    with pytest.raises(ValueError, match="phase 'train'"):
        ps.select("train", "l0", 1)


def test_a_set_says_what_it_lacks_and_why(tiny) -> None:
    ps = read_set(tiny[2].data)
    plans = [(ps.entry(k), ps.plan_bytes(k)) for k in ps.keys if "prefill" in k]
    lacking = tuple(
        planset.MissingEntry(f"l0-decode-b{b}", "decode", b, "l0", tuple(range(32)), "not supported yet: x")
        for b in SIZES
    )
    again = read_set(planset.encode_set(ps.header, plans, lacking, tuple(ps.kind_info.values()), ps.serving))
    assert again.missing == lacking
    assert again.kind_info == ps.kind_info
    with pytest.raises(KeyError, match="lacks 'l0-decode-b2': not supported yet: x"):
        again.entry("l0-decode-b2")
    with pytest.raises(KeyError, match="no decode plan for layer kind 'l0': not supported yet: x"):
        again.select("decode", "l0", 1)


def test_a_pin_is_checked_first(tiny) -> None:
    data = tiny[2].data
    assert read_set(data, sha256=hashlib.sha256(data).hexdigest()).keys
    with pytest.raises(PlanIntegrityError, match="SHA-256"):
        read_set(data, sha256="0" * 64)


def test_a_path_reads_as_bytes_do(tiny, tmp_path) -> None:
    path = tmp_path / "llama.frostset"
    path.write_bytes(tiny[2].data)
    assert read_set(path).keys == read_set(tiny[2].data).keys


def _cases(data: bytes) -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, what the refusal says)"""
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    cases = {
        "flipped-byte": (bytes(flipped), ""),
        "truncated": (data[: len(data) // 2], "not valid msgpack"),
        "empty": (b"", "not valid msgpack"),
        "foreign-msgpack": (planset._pack({"a": 1}), "not a frostc plan set"),
        "a-plan": (read_set(data).plan_bytes(read_set(data).keys[0]), "not a frostc plan set"),
    }
    top = _top(data)
    top["format"] = 6
    cases["newer"] = (_reseal(top), "plan-set format 6 is newer")
    top = _top(data)
    top["format"] = 2
    cases["older"] = (_reseal(top), "plan-set format 2 is older")
    top = _top(data)
    top["format"] = 4  # its plans were of plan format 7, which records no nodes: the fix is named
    cases["format-4"] = (
        _reseal(top),
        "plan-set format 4 is older than this runtime's format 5; rebuild it with this frostc: frostc from-config "
        "CONFIG.json -o SET",
    )
    top = _top(data)
    del top["manifest"]["kinds"]["l0"]
    cases["kind-missing"] = (_reseal(top), "which manifest.kinds lacks")
    top = _top(data)
    top["manifest"]["kinds"]["l0"]["layers"] = [0]
    cases["kind-layers"] = (_reseal(top), "layers are not those of manifest.kinds")
    top = _top(data)
    top["manifest"]["kinds"]["l0"]["scale"] = -1.0
    cases["kind-scale"] = (_reseal(top), "scale must be > 0")
    top = _top(data)
    top["manifest"]["kinds"]["l9"] = top["manifest"]["kinds"]["l0"]
    cases["kind-unused"] = (_reseal(top), "no plan or missing entry is of this kind")
    top = _top(data)
    top["manifest"]["serving"]["pages"] = 0
    cases["serving-pages"] = (_reseal(top), "manifest.serving.pages")
    top = _top(data)
    top["manifest"]["serving"]["kv_cache_dtype"] = "fp32"
    cases["serving-cache-dtype"] = (_reseal(top), "manifest.serving.kv_cache_dtype")
    top = _top(data)
    top["header"]["target_arch"] = "sm_100a"
    cases["edited-header"] = (planset._pack(top), "content hash does not match")
    top = _top(data)
    top["extra"] = 1
    cases["extra-field"] = (planset._pack(top), "set.extra: not a field")
    top = _top(data)
    sha = next(iter(top["cubins"]))
    blob = bytearray(top["cubins"][sha])
    blob[len(blob) // 2] ^= 0xFF
    top["cubins"][sha] = bytes(blob)
    cases["cubin-swapped"] = (_reseal(top), "not the cubin this hash names")
    top = _top(data)
    top["manifest"]["plans"][0]["sha256"] = "0" * 64
    cases["wrong-plan-sha"] = (_reseal(top), "rebuilt plan's SHA-256 is not the recorded one")
    top = _top(data)
    top["manifest"]["plans"][1]["key"] = top["manifest"]["plans"][0]["key"]
    cases["duplicate-key"] = (_reseal(top), "appears twice")
    top = _top(data)
    top["cubins"]["f" * 64] = b"\x7fELF"
    cases["unused-cubin"] = (_reseal(top), "")  # its hash is not its bytes' (nor used)
    top = _top(data)
    top["manifest"]["plans"] = top["manifest"]["plans"][:1]
    cases["unused-cubins"] = (_reseal(top), "no plan uses it")
    top = _top(data)
    top["header"]["min_driver"] = 1
    cases["plan-and-set-disagree"] = (_reseal(top), "min_driver 13000 is not the set's 1")
    return cases


@pytest.fixture(scope="module")
def glued():
    """Llama-3-8B's set with its glue plans (--glue): norms and the activation at 1, 2, 4 rows."""
    from frostc.models import read_layers

    model = read_model(LLAMA3_8B)
    dep = deployment(model, batch_sizes=SIZES, glue=read_layers(LLAMA3_8B))
    return build_set(model, dep, name="llama3-8b-glue").data


def test_a_set_holds_its_glue_plans_each_op_and_row_count_once(glued) -> None:
    ps = read_set(glued)
    assert {(g.op, g.tokens) for g in ps.glue} == {(op, t) for op in planset.GLUE_OPS for t in SIZES}
    assert ps.glue_key("add_rms_norm", 2) == "glue-add_rms_norm-t2" and ps.glue_key("silu_mul", 3) is None
    assert set(ps.keys) == {e.key for e in ps.entries} | {g.key for g in ps.glue}
    data = ps.plan_data("glue-silu_mul-t4")
    assert [s.dims for s in data.slots] == [(4, 2 * 14336), (4, 14336)]
    assert hashlib.sha256(ps.plan_bytes("glue-rms_norm-t1")).hexdigest() == ps.glue[0].sha256
    with pytest.raises(KeyError, match="glue-rms_norm-t1"):
        ps.entry("glue-rms_norm-t1")  # an attention plan's lookup


def test_bad_glue_entries_are_refused_naming_what(glued) -> None:
    cases = {}
    top = _top(glued)
    top["manifest"]["glue"][1]["tokens"] = top["manifest"]["glue"][0]["tokens"]
    cases["same-op-and-rows"] = (_reseal(top), "appears twice")
    top = _top(glued)
    top["manifest"]["glue"][0]["op"] = "gelu"
    cases["unknown-op"] = (_reseal(top), "'gelu' is not one of")
    top = _top(glued)
    top["manifest"]["glue"][0]["key"] = top["manifest"]["plans"][0]["key"]
    cases["key-of-a-plan"] = (_reseal(top), "appears twice")
    top = _top(glued)
    top["manifest"]["glue"][0]["sha256"] = "0" * 64
    cases["wrong-sha"] = (_reseal(top), "rebuilt plan's SHA-256 is not the recorded one")
    top = _top(glued)
    top["manifest"]["glue"][0]["layers"] = [0]
    cases["extra-field"] = (_reseal(top), "manifest.glue\\[0\\].layers: not a field")
    top = _top(glued)
    del top["manifest"]["glue"]
    cases["no-glue-list"] = (_reseal(top), "glue")
    for name, (data, says) in cases.items():
        with pytest.raises(PlanFormatError, match=says) as info:
            read_set(data)
        assert str(info.value), name


def test_bad_files_are_refused_naming_what(tiny) -> None:
    for name, (data, says) in _cases(tiny[2].data).items():
        with pytest.raises(PlanFormatError, match=says or None) as info:
            read_set(data)
        assert str(info.value), name


def test_is_set_tells_sets_from_plans(tiny) -> None:
    data = tiny[2].data
    assert planset.is_set(data)
    assert not planset.is_set(read_set(data).plan_bytes("l0-decode-b1"))
    assert not planset.is_set(b"")


# ------------------------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def set_files(tiny, tmp_path_factory):
    """The tiny set through `frostc from-config -o`, and its decode half (--phase decode)."""
    import json

    from tests.test_cli import frostc

    folder = tmp_path_factory.mktemp("sets")
    config = folder / "config.json"
    config.write_text(json.dumps(LLAMA3_8B))
    whole, decode = folder / "whole.frostset", folder / "decode.frostset"
    result = frostc("from-config", config, "--batch-sizes", "1,2,4", "--name", "llama3-8b", "-o", whole)
    assert result.exit_code == 0, result.output
    assert "6 plans (0 skipped), 5 distinct kernels; 5 cubins stored once" in result.stdout
    result = frostc("from-config", config, "--batch-sizes", "1,2,4", "--phase", "decode", "-q", "-o", decode)
    assert result.exit_code == 0 and result.stdout == "", result.output
    return whole, decode


def test_from_config_writes_the_set(tiny, set_files) -> None:
    whole, decode = set_files
    assert whole.read_bytes() == tiny[2].data
    assert read_set(decode).keys == ("l0-decode-b1", "l0-decode-b2", "l0-decode-b4")


def test_inspect_a_set(set_files) -> None:
    import json

    from tests.test_cli import frostc

    whole, _ = set_files
    result = frostc("inspect", whole)
    assert result.exit_code == 0
    says = ("plan set llama3-8b (format 5)", "l0-decode-b4", "Layer kinds (1)", "Cubins (5,", read_set(whole).sha256)
    for words in (*says, "3 plans", "serving: a bf16 paged cache"):
        assert words in result.stdout
    summary = json.loads(frostc("inspect", whole, "--json").stdout)
    assert summary["set"]["sha256"] == read_set(whole).sha256
    assert [p["key"] for p in summary["plans"]] == list(read_set(whole).keys)
    assert all(len(c["used_by"]) == 3 for c in summary["cubins"])


def test_check_a_set(set_files) -> None:
    import json

    from frost_runtime import verdict

    from tests.test_cli import frostc

    whole, _ = set_files
    judged = json.loads(frostc("check", whole, "--json").stdout)
    assert judged["valid"] and judged["header"]["kind"] == "set" and judged["exit_code"] in (0, 1)
    assert "a valid plan set llama3-8b (format 5" in verdict.check_lines(judged)[0]
    result = frostc("check", whole, "--sha256", "0" * 64)
    assert result.exit_code == 2 and "not the pinned plan" in result.stderr
    assert frostc("check", whole, "--sha256", read_set(whole).sha256).exit_code in (0, 1)


def test_diff_sets(set_files, tmp_path) -> None:
    import json

    from tests.test_cli import frostc

    whole, decode = set_files
    assert frostc("diff", whole, whole).exit_code == 0
    result = frostc("diff", whole, decode, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["removed"] == ["l0-prefill-b1", "l0-prefill-b2", "l0-prefill-b4"] and report["added"] == []
    assert report["plans"] == {}  # the decode plans are the same plans
    assert {d["path"] for d in report["header"]} >= {"header.name", "header.sha256"}
    plan = tmp_path / "one.frost"
    plan.write_bytes(read_set(whole).plan_bytes("l0-decode-b1"))
    result = frostc("diff", plan, whole)
    assert result.exit_code == 2 and "compare a plan set with a plan set" in result.stderr


def test_the_runtime_checks_a_set(set_files) -> None:
    import subprocess
    import sys

    whole, _ = set_files
    result = subprocess.run(
        [sys.executable, "-m", "frost_runtime", "check", str(whole)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode in (0, 1), result.stderr
    assert "a valid plan set" in result.stdout
