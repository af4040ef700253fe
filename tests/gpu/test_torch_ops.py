"""The `frostc::` torch ops on the GPU (runtime/frost_runtime/torch_ops.py), with the plans of the
tiny Llama set (tests/.built/hf, `python -m tests.gpu.build_plans --only hf`): the ops compute
what `Plan.execute` computes, bit for bit; `torch.library.opcheck` passes (a permuted-stride
input included: staged, not refused); they run under `torch.compile(fullgraph=True)` and inside
CUDA-graph capture."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (these tests run on the H200 through the device tool)", allow_module_level=True)

import frost_runtime  # noqa: E402
from frost_runtime import torch_ops  # noqa: E402

SET = Path(__file__).resolve().parent.parent / ".built" / "hf" / "tiny-llama.frostset"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@pytest.fixture(scope="module")
def keys():
    if not SET.exists():
        pytest.skip(f"{SET} is not built: run `python -m tests.gpu.build_plans --only hf` on the build machine")
    plans = frost_runtime.read_set(SET)
    out = {}
    for name in ("l0-prefill-b2", "l0-decode-b2"):
        key = f"test-ops/{name}"
        torch_ops.register(key, plans.load(name), replace=True)
        out[name] = key
    return out


def _prefill_inputs(key: str, seed: int = 0):
    """q, k, v and cu_seqlens of two sequences (100 and 37 tokens) in the plan's buffers."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    slots = {s.name: s for s in torch_ops.registered(key).data.slots}
    q, k, v = (
        torch.randn(slots[n].dims, generator=g, device="cuda")
        .to(torch.bfloat16)
        .as_strided(slots[n].dims, slots[n].strides)
        for n in ("q", "k", "v")
    )
    cu = torch.tensor([0, 100, 137], dtype=torch.int32, device="cuda")
    return q, k, v, cu


def test_run_computes_what_execute_does(keys) -> None:
    key = keys["l0-prefill-b2"]
    q, k, v, cu = _prefill_inputs(key)
    (o,) = torch.ops.frostc.run(key, [q, k, v, cu])
    plan = torch_ops.registered(key).plan
    expected = torch.full_like(o, torch.nan)
    plan.execute(q, k, v, cu, expected, workspace=plan.allocate_workspace())
    torch.cuda.synchronize()
    assert torch.equal(o[:137], expected[:137])
    # against float64: sequence 0, causal
    qf, kf, vf = (x[:100].double().transpose(0, 1) for x in (q, k, v))
    kf, vf = (x.repeat_interleave(4, dim=0) for x in (kf, vf))
    s = qf @ kf.transpose(-1, -2) * 0.125
    s = s.masked_fill(torch.ones(100, 100, device="cuda", dtype=torch.bool).triu(1), -torch.inf)
    ref = (s.softmax(-1) @ vf).transpose(0, 1)
    assert (o[:100].double() - ref).abs().max() < 2e-2


def test_a_permuted_input_is_staged_not_refused(keys) -> None:
    key = keys["l0-prefill-b2"]
    q, k, v, cu = _prefill_inputs(key, seed=1)
    permuted = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, (h, t, d) memory
    assert permuted.stride() != q.stride()
    (a,) = torch.ops.frostc.run(key, [q, k, v, cu])
    (b,) = torch.ops.frostc.run(key, [permuted, k, v, cu])
    assert torch.equal(a[:137], b[:137])
    with pytest.raises(frost_runtime.BindError, match="q"):
        torch.ops.frostc.run(key, [q.float(), k, v, cu])


def test_opcheck(keys) -> None:
    key = keys["l0-prefill-b2"]
    q, k, v, cu = _prefill_inputs(key, seed=2)
    torch.library.opcheck(torch.ops.frostc.run.default, (key, [q, k, v, cu]))
    permuted = q.transpose(0, 1).contiguous().transpose(0, 1)
    torch.library.opcheck(torch.ops.frostc.run.default, (key, [permuted, k, v, cu]))
    decode = keys["l0-decode-b2"]
    reads, writes = _decode_buffers(decode)
    torch.library.opcheck(torch.ops.frostc.execute.default, (decode, reads, writes, None))


def _decode_buffers(key: str, seed: int = 3):
    g = torch.Generator(device="cuda").manual_seed(seed)
    slots = {s.name: s for s in torch_ops.registered(key).data.slots}

    def random(name):
        s = slots[name]
        return torch.randn(s.dims, generator=g, device="cuda").to(DTYPES[s.dtype]).as_strided(s.dims, s.strides)

    table = torch.arange(32, dtype=torch.int32, device="cuda").view(2, 16)
    lengths = torch.tensor([40, 7], dtype=torch.int32, device="cuda")
    names_in, names_out = torch_ops.slot_roles(key)
    given = {"page_table": table, "cache_len": lengths}
    reads = [given[n] if n in given else random(n) for n in names_in]
    writes = [random(n) for n in names_out]
    return reads, writes


def test_execute_mutates_the_caches_and_o_like_the_plan(keys) -> None:
    key = keys["l0-decode-b2"]
    reads, writes = _decode_buffers(key)
    expected = [w.clone() for w in writes]
    names_in, names_out = torch_ops.slot_roles(key)
    buffers = dict(zip(names_in, reads)) | dict(zip(names_out, expected))
    torch_ops.registered(key).plan.execute_named(buffers)
    torch.ops.frostc.execute(key, reads, writes, None)
    torch.cuda.synchronize()
    for name, a, b in zip(names_out, writes, expected):
        assert torch.equal(a, b), name


def test_compile_fullgraph(keys) -> None:
    key = keys["l0-prefill-b2"]
    q, k, v, cu = _prefill_inputs(key, seed=4)

    def attend(q, k, v, cu):
        (o,) = torch.ops.frostc.run(key, [q * 1.0, k, v, cu])
        return o[:137].float().sum(-1)

    compiled = torch.compile(attend, fullgraph=True)
    # the op's output is bit-identical; inductor's fused sum may add in another order
    torch.testing.assert_close(compiled(q, k, v, cu), attend(q, k, v, cu), rtol=1e-5, atol=1e-4)

    decode = keys["l0-decode-b2"]
    reads, writes = _decode_buffers(decode)
    expected = [w.clone() for w in writes]
    torch.ops.frostc.execute(decode, reads, expected, None)

    def step(reads, writes):
        torch.ops.frostc.execute(decode, reads, writes, None)
        return writes[-1].float().sum()

    torch.compile(step, fullgraph=True)(reads, writes)
    for a, b in zip(writes, expected):
        assert torch.equal(a, b)


def test_inside_cuda_graph_capture(keys) -> None:
    key = keys["l0-prefill-b2"]
    q, k, v, cu = _prefill_inputs(key, seed=5)
    (eager,) = torch.ops.frostc.run(key, [q, k, v, cu])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.frostc.run(key, [q, k, v, cu])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (captured,) = torch.ops.frostc.run(key, [q, k, v, cu])
    q2, k2, v2, _ = _prefill_inputs(key, seed=6)
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    graph.replay()
    (fresh,) = torch.ops.frostc.run(key, [q, k, v, cu])
    torch.cuda.synchronize()
    assert torch.equal(captured[:137], fresh[:137]) and not torch.equal(captured[:137], eager[:137])
