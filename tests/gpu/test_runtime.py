"""The runtime on a real GPU: binding errors name the slot and launch nothing, the by-name and
stream forms, loading from bytes, and refusing plans this GPU cannot run."""

import dataclasses

import pytest

from tests.gpu.support import BUILT, built_manifest_entries, gpu_skip_reason

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")]


def _small_bshd_case() -> dict | None:
    """A bf16 BSHD plan with LSE and several query rows (so layouts are distinguishable)."""
    for case in built_manifest_entries():
        if case["layout"] == "bshd" and case["lse"] and case["dtype"] == "bf16" and case["seq_q"] == 17:
            return case
    return None


@pytest.fixture(scope="module")
def case(manifest):
    found = _small_bshd_case()
    if found is None:
        pytest.skip("no small bf16 BSHD plan with LSE among the built plans")
    return found


@pytest.fixture(scope="module")
def plan(case):
    import frost_runtime

    return frost_runtime.load(BUILT / case["plan"])


def _buffers(case):
    b, hq, hkv, sq, skv, d = (case[k] for k in ("batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim"))

    def bshd(h, s):
        return torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)

    lse = torch.full((b, hq, sq), float("nan"), device="cuda")
    return [bshd(hq, sq), bshd(hkv, skv), bshd(hkv, skv), bshd(hq, sq).fill_(float("nan")), lse]


def _assert_refused(plan, buffers, *words):
    import frost_runtime

    with pytest.raises(frost_runtime.BindError) as info:
        plan.execute(*buffers)
    torch.cuda.synchronize()
    for word in words:
        assert word in str(info.value)
    assert torch.isnan(buffers[3]).all(), "a refused execute must launch nothing"


def test_wrong_dtype_names_the_slot(plan, case):
    buffers = _buffers(case)
    buffers[1] = buffers[1].half()
    _assert_refused(plan, buffers, "slot 1 'k'", "dtype")


def test_wrong_shape_names_the_slot(plan, case):
    buffers = _buffers(case)
    buffers[0] = buffers[0][:, :, :-1]
    _assert_refused(plan, buffers, "slot 0 'q'", "shape")


def test_wrong_strides_name_the_slot(plan, case):
    buffers = _buffers(case)
    buffers[2] = buffers[2].contiguous()  # BHSD data where the plan declared BSHD
    _assert_refused(plan, buffers, "slot 2 'v'", "strides")


def test_host_tensor_is_refused(plan, case):
    buffers = _buffers(case)
    buffers[0] = buffers[0].cpu()
    _assert_refused(plan, buffers, "slot 0 'q'", "cpu")


def test_misaligned_pointer_is_refused(plan, case):
    buffers = _buffers(case)
    q = buffers[0]
    storage = torch.empty(q.numel() + 8, device="cuda", dtype=q.dtype)
    shifted = storage[1 : 1 + q.numel()].view(q.shape[0], q.shape[2], q.shape[1], q.shape[3]).transpose(1, 2)
    buffers[0] = shifted
    _assert_refused(plan, buffers, "slot 0 'q'", "aligned")


def test_wrong_buffer_count_is_refused(plan, case):
    _assert_refused(plan, _buffers(case)[:4], "5 buffers")


def test_named_form_and_explicit_stream_match_positional(plan, case):
    buffers = _buffers(case)
    plan.execute(*buffers)
    expected_o, expected_lse = buffers[3].clone(), buffers[4].clone()
    buffers[3].fill_(float("nan"))
    buffers[4].fill_(float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    plan.execute_named(dict(zip(plan.slots, buffers)), stream=side)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(buffers[3], expected_o) and torch.equal(buffers[4], expected_lse)


def test_bind_checks_like_execute(plan, case):
    import frost_runtime

    buffers = _buffers(case)
    buffers[4] = buffers[4].double()
    with pytest.raises(frost_runtime.BindError, match="slot 4 'lse'.*dtype"):
        plan.bind(*buffers)


def test_bound_execute_matches_execute(plan, case):
    buffers = _buffers(case)
    plan.execute(*buffers)
    expected = buffers[3].clone()
    buffers[3].fill_(float("nan"))
    plan.bind(*buffers).execute()
    torch.cuda.synchronize()
    assert torch.equal(buffers[3], expected)


def test_unknown_and_missing_names_are_listed(plan, case):
    import frost_runtime

    buffers = dict(zip(plan.slots, _buffers(case)))
    buffers["query"] = buffers.pop("q")
    with pytest.raises(frost_runtime.BindError, match=r"unknown \['query'\], missing \['q'\]"):
        plan.execute_named(buffers)


def test_load_from_bytes(case):
    import frost_runtime

    plan = frost_runtime.load((BUILT / case["plan"]).read_bytes())
    assert plan.slots == ("q", "k", "v", "o", "lse")


def test_plan_for_another_arch_is_refused(case):
    import frost_runtime
    from frost_runtime import schema

    data = schema.decode_plan((BUILT / case["plan"]).read_bytes())
    foreign = dataclasses.replace(data, header=dataclasses.replace(data.header, target_arch="sm_100a"))
    with pytest.raises(frost_runtime.CompatibilityError, match="built for sm_100a but .* is sm_90"):
        frost_runtime.load(schema.encode_plan(foreign))


def test_corrupt_plan_is_refused(case):
    import frost_runtime

    raw = bytearray((BUILT / case["plan"]).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    with pytest.raises(frost_runtime.PlanFormatError):
        frost_runtime.load(bytes(raw))


def test_a_pinned_plan_loads_and_another_is_refused(case):
    import frost_runtime

    path = BUILT / case["plan"]
    with frost_runtime.load(path, sha256=frost_runtime.plan_sha256(path)) as pinned:
        assert pinned.slots == ("q", "k", "v", "o", "lse")
    with pytest.raises(frost_runtime.PlanIntegrityError, match="not the pinned"):
        frost_runtime.load(path, sha256="0" * 64)


def test_length_slots_are_checked_from_metadata(manifest):
    """int32 sequence lengths are slots like any other: dtype, shape, device checked, never read."""
    import frost_runtime

    from tests.gpu.support import Buffers

    case = next((c for c in built_manifest_entries() if c["form"] == "packed"), None)
    if case is None:
        pytest.skip("no packed plan among the built plans")
    plan = frost_runtime.load(BUILT / case["plan"])
    buffers = Buffers(case, plan)
    index = plan.slots.index("q_lengths")
    for bad, words in (
        (buffers.tensors["q_lengths"].long(), "dtype"),
        (torch.zeros(case["batch"] + 2, dtype=torch.int32, device="cuda"), "shape"),
        (buffers.tensors["q_lengths"].cpu(), "cpu"),
    ):
        given = list(buffers.all)
        given[index] = bad
        with pytest.raises(frost_runtime.BindError, match=f"slot {index} 'q_lengths'.*{words}"):
            plan.execute(*given, workspace=buffers.workspace)
    torch.cuda.synchronize()
    assert bool(torch.isnan(buffers.tensors["o"]).all())
