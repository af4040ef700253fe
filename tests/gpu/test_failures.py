"""The runtime's failures on a real GPU, each a typed error naming the plan and what to do: a
kernel the driver refuses (garbage cubin bytes, the plan re-encoded with the schema's own
encoder, so its hash is right), a workspace larger than the GPU, a launch while another CUDA
context is current (a second context of this GPU; another GPU where there are two), tensors on
another GPU; and the finalizer: a plan dropped without close() unloads its modules."""

import dataclasses
import gc

import pytest

from tests.gpu.support import BUILT, Buffers, gpu_skip_reason

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")]


@pytest.fixture(scope="module")
def case(small_dense_case):
    return small_dense_case


@pytest.fixture(scope="module")
def data(case):
    from frost_runtime import schema

    return schema.decode_plan((BUILT / case["plan"]).read_bytes())


# ---------------------------------------------------------------------------- loading


def test_a_kernel_the_driver_refuses_is_a_load_error_naming_plan_and_kernel(data):
    import frost_runtime
    from frost_runtime import schema

    kernel = data.kernels[0]
    garbage = b"\x7fELF" + bytes((i * 131 + 7) % 256 for i in range(len(kernel.cubin) - 4))
    broken = dataclasses.replace(data, kernels=(dataclasses.replace(kernel, cubin=garbage), *data.kernels[1:]))
    encoded = schema.encode_plan(broken)  # the schema's own encoder: the content hash is right
    assert schema.decode_plan(encoded).kernels[0].cubin == garbage
    with pytest.raises(frost_runtime.LoadError) as info:
        frost_runtime.load(encoded)
    message = str(info.value)
    for words in (f"plan {data.header.name!r}", f"kernel 0 ({kernel.name}, entry {kernel.entry})", "CUDA_ERROR_"):
        assert words in message, message
    assert isinstance(info.value, frost_runtime.CompatibilityError)
    with frost_runtime.load(schema.encode_plan(data)):  # the GPU is fine afterwards
        pass


def test_a_workspace_larger_than_the_gpu_is_a_workspace_error(data):
    import frost_runtime
    from frost_runtime import schema

    huge = 1 << 50  # a pebibyte
    with frost_runtime.load(schema.encode_plan(dataclasses.replace(data, workspace_bytes=huge))) as plan:
        with pytest.raises(frost_runtime.WorkspaceError) as info:
            plan.allocate_workspace()
    message = str(info.value)
    for words in (f"plan {data.header.name!r}", f"{huge} bytes", "cuda:0", "smaller capacities"):
        assert words in message, message
    torch.empty(1 << 20, device="cuda")  # the allocator is fine afterwards


# ---------------------------------------------------------------------------- contexts and devices


def _new_context(ordinal: int):
    """A second context of the GPU, current in this thread (not torch's primary one)."""
    from cuda.bindings import driver as cu
    from frost_runtime.driver import check

    device = check(cu.cuDeviceGet(ordinal))
    try:
        return check(cu.cuCtxCreate(None, 0, device))  # CUDA 13: (params, flags, device)
    except TypeError:
        return check(cu.cuCtxCreate(0, device))


def test_a_launch_in_another_context_is_a_context_error(case):
    """The plan's modules live in the primary context of cuda:0; with a context of its own made
    current, the launch (on that context's default stream) is refused, and said why."""
    import frost_runtime
    from cuda.bindings import driver as cu
    from frost_runtime.driver import check

    plan = frost_runtime.load(BUILT / case["plan"])
    buffers = Buffers(case, plan)
    torch.cuda.synchronize()
    context = _new_context(0)
    try:
        with pytest.raises(frost_runtime.ContextError) as info:
            plan.execute(*buffers.all, workspace=buffers.workspace, stream=0)
    finally:
        check(cu.cuCtxPopCurrent())
        check(cu.cuCtxDestroy(context))
    message = str(info.value)
    for words in (f"plan {plan.header.name!r}", "loaded on cuda:0", "another CUDA context", "set_device(0)"):
        assert words in message, message
    plan.execute(*buffers.all, workspace=buffers.workspace)  # back in its context: it runs
    torch.cuda.synchronize()
    buffers.assert_correct()
    plan.close()


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs a second GPU (cuda:1)"
)
def test_another_gpu_is_refused_naming_the_plans(case):
    import frost_runtime

    with torch.cuda.device(0):
        plan = frost_runtime.load(BUILT / case["plan"])
        buffers = Buffers(case, plan)
    elsewhere = [t.to("cuda:1") for t in buffers.all]
    with pytest.raises(frost_runtime.BindError, match="tensor on cuda:1, the plan was loaded on cuda:0"):
        plan.execute(*elsewhere, workspace=buffers.workspace)
    with pytest.raises(frost_runtime.BindError, match="loaded on cuda:0"):
        plan.bind(*elsewhere)
    torch.cuda.synchronize()
    with torch.cuda.device(1):  # cuda:1 current, the plan's buffers on cuda:0
        try:
            plan.execute(*buffers.all, workspace=buffers.workspace)
            ran = True
        except frost_runtime.ContextError as exc:  # refused, and said why
            assert "loaded on cuda:0" in str(exc) and "set_device(0)" in str(exc)
            ran = False
    torch.cuda.synchronize()
    if ran:  # the driver took the launch into the stream's own context: then it must be right
        buffers.assert_correct()
    plan.close()


# ---------------------------------------------------------------------------- the finalizer


def test_a_plan_dropped_without_close_unloads_its_modules(case, monkeypatch):
    import frost_runtime
    from frost_runtime import driver

    unloaded = []
    real = driver.unload_kernels

    def counting(context, kernels):
        real(context, kernels)
        unloaded.append(len(kernels))

    monkeypatch.setattr(driver, "unload_kernels", counting)
    plan = frost_runtime.load(BUILT / case["plan"])
    buffers = Buffers(case, plan)
    args, buffers.plan = buffers.all, None  # only `plan` refers to the plan now
    plan.execute(*args, workspace=buffers.workspace)
    torch.cuda.synchronize()
    kernels = len(plan.data.kernels)
    del plan
    gc.collect()
    assert unloaded == [kernels]
    buffers.assert_correct()


def test_dropped_plans_keep_device_memory_flat(case):
    """300 plans loaded, run and dropped without close(): the finalizer unloads every module."""
    import frost_runtime
    from cuda.bindings import driver as cu

    data = (BUILT / case["plan"]).read_bytes()
    buffers = Buffers(case, frost_runtime.load(data))  # that first plan stays loaded, held by the buffers

    def cycle():
        p = frost_runtime.load(data)
        p.execute(*buffers.all, workspace=buffers.workspace)
        torch.cuda.synchronize()

    for _ in range(20):
        cycle()
    gc.collect()
    free_before = cu.cuMemGetInfo()[1]
    for _ in range(300):
        cycle()
    gc.collect()
    free_after = cu.cuMemGetInfo()[1]
    assert free_before - free_after < 2 << 20, f"{(free_before - free_after) >> 10} KiB less free after 300 plans"
    buffers.assert_correct()
