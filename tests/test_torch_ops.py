"""The `frostc::` torch ops on the CPU (runtime/frost_runtime/torch_ops.py): their schemas (what they
mutate, exactly), the registry, and fakes from plan metadata: `torch.ops.frostc.run` traces on
fake CUDA tensors with no GPU and gives tensors shaped as the plan's output slots. They run on
the GPU in tests/gpu/test_torch_ops.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import frost_runtime  # noqa: E402
from frost_runtime import torch_ops  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from tests.hf_models import build_tiny_set  # noqa: E402


@pytest.fixture(scope="module")
def keys():
    plans = frost_runtime.read_set(build_tiny_set("llama"))
    out = {}
    for name in ("l0-prefill-b2", "l0-decode-b2"):
        out[name] = f"cpu-test/{name}"
        torch_ops.register(out[name], plans.plan_data(name), replace=True)
    return out


def _fake_slots(key: str, names) -> list:
    slots = {s.name: s for s in torch_ops.registered(key).data.slots}
    dtypes = {"bf16": torch.bfloat16, "int32": torch.int32}
    return [
        torch.empty_strided(slots[n].dims, slots[n].strides, dtype=dtypes[slots[n].dtype], device="cuda") for n in names
    ]


def test_schemas_say_exactly_what_is_mutated() -> None:
    execute = str(torch.ops.frostc.execute.default._schema)
    run = str(torch.ops.frostc.run.default._schema)
    assert execute == "frostc::execute(str plan, Tensor[] reads, Tensor(a2!)[] writes, Tensor(a3!)? workspace) -> ()"
    assert run == "frostc::run(str plan, Tensor[] reads) -> Tensor[]"


def test_slot_roles_split_reads_and_writes(keys) -> None:
    assert torch_ops.slot_roles(keys["l0-prefill-b2"]) == (("q", "k", "v", "cu_seqlens"), ("o",))
    reads, writes = torch_ops.slot_roles(keys["l0-decode-b2"])
    assert reads == ("k_new", "v_new", "page_table", "cache_len", "q")
    assert writes == ("k_cache", "v_cache", "o")


def test_the_fake_gives_the_plans_output_slots(keys) -> None:
    key = keys["l0-prefill-b2"]
    with FakeTensorMode():
        reads = _fake_slots(key, ("q", "k", "v", "cu_seqlens"))
        (o,) = torch.ops.frostc.run(key, reads)
    assert (tuple(o.shape), o.stride(), o.dtype, o.device.type) == ((256, 8, 64), (512, 64, 1), torch.bfloat16, "cuda")


def test_run_traces_without_a_gpu(keys) -> None:
    key = keys["l0-prefill-b2"]

    def attend(q, k, v, cu):
        (o,) = torch.ops.frostc.run(key, [q, k, v, cu])
        return o * 2

    with FakeTensorMode():
        args = _fake_slots(key, ("q", "k", "v", "cu_seqlens"))
    graph = torch.fx.experimental.proxy_tensor.make_fx(attend, tracing_mode="fake")(*args)
    assert "torch.ops.frostc.run.default('cpu-test/l0-prefill-b2'" in graph.code


def test_run_refuses_a_plan_that_appends_to_caches(keys) -> None:
    key = keys["l0-decode-b2"]
    with FakeTensorMode(), pytest.raises(frost_runtime.BindError, match="updates caches in place"):
        torch.ops.frostc.run(key, _fake_slots(key, torch_ops.slot_roles(key)[0]))


def test_the_registry_names_what_is_wrong(keys) -> None:
    with pytest.raises(KeyError, match="no frostc plan is registered under 'nope'"):
        torch_ops.registered("nope")
    with pytest.raises(ValueError, match="is registered already"):
        torch_ops.register(keys["l0-prefill-b2"], torch_ops.registered(keys["l0-prefill-b2"]).data)
    with pytest.raises(ValueError, match="non-empty string"):
        torch_ops.register("", torch_ops.registered(keys["l0-prefill-b2"]).data)
    with pytest.raises(TypeError, match="expected a frost_runtime Plan or PlanData"):
        torch_ops.register("x", object())
    key = keys["l0-prefill-b2"]
    with FakeTensorMode(), pytest.raises(frost_runtime.BindError, match="takes 4 tensors"):
        torch.ops.frostc.run(key, _fake_slots(key, ("q", "k", "v")))


def test_metadata_only_plans_do_not_execute(keys) -> None:
    with pytest.raises(RuntimeError, match="registered from metadata only"):
        torch_ops._runnable(torch_ops.registered(keys["l0-prefill-b2"]))
