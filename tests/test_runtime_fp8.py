"""frost_runtime.fp8.Fp8Inputs on the CPU (torch's e4m3 conversions run there): it finds an FP8
plan's q, k, v and descale slots from the attention node's record, allocates them in the plan's layouts
(Vᵀ, keys innermost), and quantizes into them as the GPU tests do by hand; bad inputs and plans
without (or with several) FP8 nodes are refused by name."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from frost_runtime.plan import BindError
from frost_runtime.schema import decode_plan

from frostc.build import build
from frostc.description import parse_description
from tests.descriptions import edited
from tests.test_fp8_dense import HKV, HQ, fp8_node

torch = pytest.importorskip("torch")
from frost_runtime.fp8 import Fp8Inputs, fp8_slots  # noqa: E402  (imports torch)


def _plan(d=None):
    return decode_plan(build(parse_description(json.dumps(d or fp8_node()), fmt="json")))


@pytest.mark.parametrize("heads", [(HQ, HKV, 1), (1, 1, 1)], ids=["per-head", "per-tensor"])
def test_the_buffers_take_the_plans_layouts_and_hold_the_quantized_values(heads):
    data = _plan(fp8_node(heads))
    inputs = Fp8Inputs(data, device="cpu")
    slots = {s.name: s for s in data.slots}
    assert set(inputs.buffers) == {"q", "k", "v", "q_descale", "k_descale", "v_descale"}
    for name, buf in inputs.buffers.items():
        assert tuple(buf.shape) == slots[name].dims and tuple(buf.stride()) == slots[name].strides, name
    assert inputs.buffers["v"].stride(2) == 1  # keys innermost
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(slots[n].dims, generator=gen).to(torch.bfloat16) * (1 + i) for i, n in enumerate("qkv"))
    inputs.quantize(q, k, v)
    for role, x, n in zip("qkv", (q, k, v), heads):
        descale = inputs.buffers[f"{role}_descale"]
        amax = x.float().abs().amax(dim=(0, 2, 3)) if n > 1 else x.float().abs().amax().reshape(1)
        assert torch.allclose(descale, amax / 448.0)
        back = inputs.dequantized(role)
        big = x.float().abs() > 0.05 * amax.max()  # normal e4m3 values: relative error <= 2**-4
        assert ((back - x.float()).abs() <= x.float().abs() * 2**-4 + 1e-6)[big].all(), role
        assert inputs.buffers[role].float().abs().max() <= 448.0


def test_a_zero_tensor_gets_a_finite_descale():
    data = _plan()
    inputs = Fp8Inputs(data, device="cpu")
    dims = {s.name: s.dims for s in data.slots}
    inputs.quantize(torch.zeros(dims["q"]), torch.randn(dims["k"]), torch.randn(dims["v"]))
    assert torch.isfinite(inputs.buffers["q_descale"]).all() and (inputs.buffers["q"].float() == 0).all()


def test_bad_inputs_are_refused_by_role():
    data = _plan()
    inputs = Fp8Inputs(data, device="cpu")
    dims = {s.name: s.dims for s in data.slots}
    good = [torch.randn(dims[n]) for n in "qkv"]
    with pytest.raises(BindError, match="k must be a tensor of shape"):
        inputs.quantize(good[0], torch.randn(3, 3), good[2])
    with pytest.raises(BindError, match="give the unquantized values"):
        inputs.quantize(good[0], good[1], good[2].to(torch.float8_e4m3fn))


def test_a_plan_without_an_fp8_node_is_refused():
    d = fp8_node()
    for name in ("q", "k", "v"):
        d = edited(d, **{f"tensors.{name}.dtype": "bf16"})
    d = edited(d, **{"tensors.v.strides": None, "tensors.v.layout": "bshd"})
    for role in "qkv":
        d = edited(d, **{f"nodes.0.{role}_descale": None, f"tensors.{role}_descale": None})
    with pytest.raises(BindError, match="one e4m3 attention node in the plan, found none"):
        Fp8Inputs(_plan(d), device="cpu")


def test_two_fp8_nodes_need_a_node_name():
    d = fp8_node()
    second = dict(d["nodes"][0], name="second", o="o2", lse="lse2")
    d["tensors"]["o2"], d["tensors"]["lse2"] = dict(d["tensors"]["o"]), dict(d["tensors"]["lse"])
    d["nodes"] = [dict(d["nodes"][0], name="first"), second]
    data = _plan(d)
    with pytest.raises(BindError, match="pass node="):
        Fp8Inputs(data, device="cpu")
    assert Fp8Inputs(data, node="second", device="cpu").slots.node == "second"


def test_a_packed_plan_quantizes_its_token_rows_per_head():
    from tests.test_fp8_dense import packed_fp8_node

    d = packed_fp8_node()
    for role, heads in (("q", HQ), ("k", HKV)):
        d["tensors"][f"{role}_descale"]["dims"] = [heads]
    data = _plan(d)
    inputs = Fp8Inputs(data, device="cpu")
    slots = {s.name: s for s in data.slots}
    assert inputs.buffers["v"].stride() == (HKV * 128, 128, 1)  # packed V as given: (t, h, d)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(slots[n].dims, generator=gen) * (1 + i) for i, n in enumerate("qkv"))
    inputs.quantize(q, k, v)
    assert torch.allclose(inputs.buffers["q_descale"], q.abs().amax(dim=(0, 2)) / 448.0)
    assert torch.allclose(inputs.buffers["v_descale"], v.abs().amax().reshape(1) / 448.0)
    for role, x in zip("qkv", (q, k, v)):
        back = inputs.dequantized(role)
        big = x.abs() > 0.05 * x.abs().max()
        assert ((back - x).abs() <= x.abs() * 2**-4 + 1e-6)[big].all(), role


def test_a_plan_that_re_lays_v_quantizes_into_v_as_given():
    """V given with d innermost reaches the attention through the workspace: Fp8Inputs finds V's
    slot in the node's record (the slot vt_pack reads) and allocates it in its own layout."""
    from tests.test_fp8_dense import _rows_v

    data = _plan(_rows_v(fp8_node()))
    inputs = Fp8Inputs(data, device="cpu")
    v_slot = next(s for s in data.slots if s.name == "v")
    assert inputs.buffers["v"].stride() == v_slot.strides and v_slot.strides[3] == 1
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(s.dims, generator=gen) for s in (next(x for x in data.slots if x.name == n) for n in "qkv"))
    inputs.quantize(q, k, v)
    assert torch.allclose(inputs.dequantized("v"), v, rtol=2**-4, atol=0.02)


def test_the_slots_are_the_node_records_not_the_kernels_parameters():
    """Renamed kernels and parameters change nothing: the q, k, v and descale slots are the
    e4m3 attention node's roles (V's is the caller's slot, which the plan re-lays)."""
    data = _plan(_rows_v_node())
    blind = replace(data, kernels=tuple(
        replace(k, name=f"k{i}", params=tuple(replace(p, name=f"p{j}") for j, p in enumerate(k.params)))
        for i, k in enumerate(data.kernels)
    ))  # fmt: skip
    index = {s.name: i for i, s in enumerate(data.slots)}
    found = fp8_slots(blind)
    assert found == fp8_slots(data)
    assert found.data == {role: index[role] for role in "qkv"}
    assert found.descales == {role: index[f"{role}_descale"] for role in "qkv"}


def _rows_v_node():
    from tests.test_fp8_dense import _rows_v

    return _rows_v(fp8_node())
