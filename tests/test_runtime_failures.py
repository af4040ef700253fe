"""The runtime's failures, on the CPU with a stand-in driver: each is a typed error naming the
plan and what to do. Loading on a machine without a GPU (CompatibilityError), a kernel the
driver refuses (LoadError: nothing stays loaded), a workspace the GPU has no room for
(WorkspaceError), a launch the driver refuses (LaunchError) and a launch while another CUDA
context is current (ContextError); close() from several threads, and the finalizer that unloads
a plan dropped without close(). What needs a real GPU is in tests/gpu/test_failures.py."""

from __future__ import annotations

import gc
import sys
import threading

import frost_runtime
import pytest
from frost_runtime import driver, schema
from frost_runtime.plan import Plan

CONTEXT = 0x5EED  # the stand-in CUcontext the plans load into
DEVICE = driver.Device(0, "Stand-in H200", (9, 0), 13000, 132)


def toy_plan(workspace: bool = False) -> schema.PlanData:
    """Two kernels, three launches, one fp32 slot; a zeroed workspace counter when asked."""
    kernels = tuple(
        schema.Kernel(name, f"{name}_entry", b"\x7fELF", (schema.Param("x", "ptr"),), (32, 1, 1), (1, 1, 1), 0, "one")
        for name in ("first", "second")
    )
    return schema.PlanData(
        header=schema.Header("toy", "0.1.0", "4.8.0", "sm_90a", 13000, "ab" * 32),
        slots=(schema.TensorSlot("x", 1, "fp32", (4,), (1,), True, 4),),
        kernels=kernels,
        launches=tuple(schema.Launch(k, (1, 1, 1), (schema.Arg(slot=0),), f"node{k}") for k in (0, 1, 1)),
        # toys: each node's x and out are the one slot
        nodes=tuple(
            schema.NodeRecord("silu_mul", f"node{k}", "", {"rows": 1, "n": 2}, {"x": 0, "out": 0}) for k in (0, 1)
        ),
        workspace_bytes=256 if workspace else 0,
        workspace=(schema.WorkspaceRegion("node0.counter", 0, 4, True),) if workspace else (),
    )


class Buffer:
    """A device buffer as far as the runtime can tell: __cuda_array_interface__ metadata only."""

    def __init__(self, shape=(4,), typestr="<f4", pointer=0x7F00_0000_0000):
        self.__cuda_array_interface__ = {"typestr": typestr, "shape": shape, "strides": None,
                                         "data": (pointer, False), "version": 3}  # fmt: skip


class FakeDriver:
    """Records loads, unloads and launches; `fail_load` / `fail_launch` make the driver refuse."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.loaded: list[driver.LoadedKernel] = []
        self.unloaded: list[tuple[int, list]] = []
        self.launches = 0
        self.fail_load: dict[str, str] = {}  # entry -> error name
        self.fail_launch: dict[int, object] = {}  # launch number -> CUresult
        self.current = CONTEXT
        monkeypatch.setattr(driver, "load_kernel", self.load_kernel)
        monkeypatch.setattr(driver, "unload_kernels", self.unload_kernels)
        monkeypatch.setattr(driver, "launch_kernel", self.launch_kernel)
        monkeypatch.setattr(driver, "current_context_handle", lambda: self.current)
        monkeypatch.setattr(driver, "zero_words_async", lambda address, words, stream: None)
        monkeypatch.setattr(driver, "stream_is_capturing", lambda stream: False)

    def load_kernel(self, cubin: bytes, entry: str, smem_bytes: int) -> driver.LoadedKernel:
        if entry in self.fail_load:
            name = self.fail_load[entry]
            raise driver.CudaError(f"cuModuleLoadData: {name}: device kernel image is invalid", name)
        kernel = driver.LoadedKernel(module=f"module of {entry}", function=f"function of {entry}")
        self.loaded.append(kernel)
        return kernel

    def unload_kernels(self, context, kernels) -> None:
        self.unloaded.append((context, list(kernels)))

    def launch_kernel(self, function, *args):
        self.launches += 1
        return (self.fail_launch.get(self.launches, driver.SUCCESS),)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    return FakeDriver(monkeypatch)


def load(data: schema.PlanData | None = None) -> Plan:
    return Plan(data or toy_plan(), DEVICE, CONTEXT)


# ---------------------------------------------------------------------------- loading


def test_load_without_a_gpu_is_a_compatibility_error_naming_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver():
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search.')

    monkeypatch.setattr(driver, "current_context", no_driver)
    with pytest.raises(frost_runtime.CompatibilityError) as info:
        frost_runtime.load(schema.encode_plan(toy_plan()))
    message = str(info.value)
    assert "plan 'toy' cannot run here: no usable CUDA GPU and driver" in message
    assert "sm_90a GPU" in message and "frostc check" in message


def test_a_kernel_the_driver_refuses_is_a_load_error_and_nothing_stays_loaded(fake: FakeDriver) -> None:
    fake.fail_load["second_entry"] = "CUDA_ERROR_INVALID_IMAGE"
    with pytest.raises(frost_runtime.LoadError) as info:
        load()
    assert isinstance(info.value, frost_runtime.CompatibilityError)  # a fallback's except catches it too
    message = str(info.value)
    for words in ("plan 'toy'", "cuda:0 (Stand-in H200)", "kernel 1 (second, entry second_entry)",
                  "CUDA_ERROR_INVALID_IMAGE", "rebuild the plan"):  # fmt: skip
        assert words in message, message
    assert fake.unloaded == [(CONTEXT, fake.loaded)] and len(fake.loaded) == 1  # the first, unloaded again


def test_a_plan_for_another_gpu_says_so_when_the_driver_refuses_it(fake: FakeDriver) -> None:
    fake.fail_load["first_entry"] = "CUDA_ERROR_NO_BINARY_FOR_GPU"
    with pytest.raises(frost_runtime.LoadError, match="not built for this GPU and driver: `frostc check PLAN`"):
        load()
    assert fake.unloaded == [(CONTEXT, [])]


# ---------------------------------------------------------------------------- lifetime


def test_a_plan_dropped_without_close_unloads_its_kernels_when_collected(fake: FakeDriver) -> None:
    plan = load()
    assert plan._finalizer.atexit is False  # never at interpreter exit
    loaded = list(fake.loaded)
    del plan
    gc.collect()
    assert fake.unloaded == [(CONTEXT, loaded)]


def test_a_binding_keeps_its_plan_loaded(fake: FakeDriver) -> None:
    plan = load()
    bound = plan.bind(Buffer())
    del plan
    gc.collect()
    assert fake.unloaded == []
    bound.execute(stream=7)
    del bound
    gc.collect()
    assert len(fake.unloaded) == 1


def test_close_unloads_once_and_the_finalizer_never_again(fake: FakeDriver) -> None:
    plan = load()
    plan.close()
    plan.close()
    assert len(fake.unloaded) == 1
    del plan
    gc.collect()
    assert len(fake.unloaded) == 1


def test_close_from_eight_threads_at_once_unloads_once(fake: FakeDriver) -> None:
    for _ in range(20):
        plan = load()
        start = threading.Barrier(8)

        def close(plan=plan, start=start):
            start.wait()
            plan.close()

        threads = [threading.Thread(target=close) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(fake.unloaded) == 20


def test_the_finalizer_never_raises(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A context already gone (a device reset): the collection goes on, nothing is reported."""

    def gone(context, kernels):
        raise driver.CudaError("cuCtxPushCurrent: CUDA_ERROR_CONTEXT_IS_DESTROYED", "CUDA_ERROR_CONTEXT_IS_DESTROYED")

    reported = []
    monkeypatch.setattr(driver, "unload_kernels", gone)
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    plan = load()
    del plan
    gc.collect()
    assert reported == []


def test_close_names_the_plan_when_unloading_fails(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(context, kernels):
        raise driver.CudaError("cuModuleUnload: CUDA_ERROR_INVALID_CONTEXT", "CUDA_ERROR_INVALID_CONTEXT")

    plan = load()
    monkeypatch.setattr(driver, "unload_kernels", gone)
    with pytest.raises(driver.CudaError, match="plan 'toy': unloading its kernels failed .* closed all the same"):
        plan.close()
    assert plan.closed
    with pytest.raises(frost_runtime.PlanClosedError):
        plan.execute(Buffer(), stream=7)


def test_unload_kernels_tries_every_module_in_the_plans_context(monkeypatch: pytest.MonkeyPatch) -> None:
    cu, ok = driver.cu, driver.cu.CUresult.CUDA_SUCCESS
    calls = []
    monkeypatch.setattr(cu, "cuCtxPushCurrent", lambda ctx: calls.append(("push", ctx)) or (ok,))
    monkeypatch.setattr(cu, "cuCtxPopCurrent", lambda: calls.append(("pop",)) or (ok, CONTEXT))

    def unload(module):
        calls.append(("unload", module))
        return (cu.CUresult.CUDA_ERROR_INVALID_HANDLE if module == "b" else ok,)

    monkeypatch.setattr(cu, "cuModuleUnload", unload)
    kernels = [driver.LoadedKernel(m, None) for m in "abc"]
    with pytest.raises(driver.CudaError, match="cuModuleUnload: CUDA_ERROR_INVALID_HANDLE"):
        driver.unload_kernels(CONTEXT, kernels)
    assert calls == [("push", CONTEXT), ("unload", "a"), ("unload", "b"), ("unload", "c"), ("pop",)]


def test_load_kernel_unloads_its_module_when_the_entry_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    cu, ok = driver.cu, driver.cu.CUresult.CUDA_SUCCESS
    unloaded = []
    monkeypatch.setattr(cu, "cuModuleLoadData", lambda cubin: (ok, "module"))
    monkeypatch.setattr(cu, "cuModuleGetFunction", lambda module, name: (cu.CUresult.CUDA_ERROR_NOT_FOUND, None))
    monkeypatch.setattr(cu, "cuModuleUnload", lambda module: unloaded.append(module) or (ok,))
    with pytest.raises(driver.CudaError) as info:
        driver.load_kernel(b"\x7fELF", "kernel_entry", 0)
    assert info.value.name == "CUDA_ERROR_NOT_FOUND" and "cuModuleGetFunction(kernel_entry)" in str(info.value)
    assert unloaded == ["module"]


# ---------------------------------------------------------------------------- workspace


def test_a_workspace_the_gpu_has_no_room_for_is_a_workspace_error(fake: FakeDriver, monkeypatch) -> None:
    torch = pytest.importorskip("torch")

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 PiB.\nmore text")

    plan = load(toy_plan(workspace=True))
    monkeypatch.setattr(torch, "empty", out_of_memory)
    with pytest.raises(frost_runtime.WorkspaceError) as info:
        plan.allocate_workspace()
    message = str(info.value)
    for words in ("plan 'toy'", "256 bytes", "cuda:0", "Tried to allocate 1.00 PiB", "Allocate it once",
                  "workspace= a buffer of at least 256 bytes", "smaller capacities"):  # fmt: skip
        assert words in message, message
    assert isinstance(info.value.__cause__, torch.cuda.OutOfMemoryError)


# ---------------------------------------------------------------------------- launches


@pytest.mark.parametrize("form", ["execute", "bound"])
def test_a_refused_launch_names_the_plan_the_launch_and_what_to_do(fake: FakeDriver, form: str) -> None:
    plan = load()
    bound = plan.bind(Buffer())
    fake.fail_launch[3] = driver.cu.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(frost_runtime.LaunchError) as info:
        plan.execute(Buffer(), stream=7) if form == "execute" else bound.execute(stream=7)
    message = str(info.value)
    for words in ("plan 'toy' on cuda:0", "launch 2 (node 'node1', kernel second)", "CUDA_ERROR_ILLEGAL_ADDRESS",
                  "restart the process"):  # fmt: skip
        assert words in message, message
    assert info.value.name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert not isinstance(info.value, frost_runtime.ContextError)


@pytest.mark.parametrize("current, words", [(0xBAD, "another CUDA context"), (0, "no CUDA context is current")])
@pytest.mark.parametrize("form", ["execute", "bound"])
def test_a_launch_in_another_context_is_a_context_error(fake: FakeDriver, form: str, current: int, words: str):
    plan = load()
    bound = plan.bind(Buffer())
    fake.current = current
    fake.fail_launch[1] = driver.cu.CUresult.CUDA_ERROR_INVALID_HANDLE
    with pytest.raises(frost_runtime.ContextError) as info:
        plan.execute(Buffer(), stream=7) if form == "execute" else bound.execute(stream=7)
    message = str(info.value)
    for expected in ("plan 'toy'", "launch 0", "loaded on cuda:0", words, "torch.cuda.set_device(0)"):
        assert expected in message, message
    assert isinstance(info.value, frost_runtime.LaunchError)


def test_a_refused_zero_fill_is_a_launch_error(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(address, words, stream):
        raise driver.CudaError("cuMemsetD32Async: CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_INVALID_VALUE")

    plan = load(toy_plan(workspace=True))
    monkeypatch.setattr(driver, "zero_words_async", refuse)
    for launch in (
        lambda: plan.execute(Buffer(), workspace=Buffer((256,), "|u1", 0x7F00_0001_0000), stream=7),
        lambda: plan.bind(Buffer(), workspace=Buffer((256,), "|u1", 0x7F00_0001_0000)).execute(stream=7),
    ):
        with pytest.raises(frost_runtime.LaunchError, match="plan 'toy' on cuda:0: zeroing its workspace counters"):
            launch()
    assert fake.launches == 0


def test_a_successful_launch_asks_the_driver_nothing_else(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path stays as it was: no context check, no error lookup, per execute."""

    def forbidden(*args):
        raise AssertionError("asked on the hot path")

    for name in ("current_context_handle", "error_name", "error_text", "current_context"):
        monkeypatch.setattr(driver, name, forbidden)
    plan = load()
    bound = plan.bind(Buffer())
    for _ in range(3):
        plan.execute(Buffer(), stream=7)
        bound.execute(stream=7)
    assert fake.launches == 18


def test_a_tensor_on_another_device_is_a_bind_error_naming_the_slot(fake: FakeDriver) -> None:
    torch = pytest.importorskip("torch")
    plan = load()
    with pytest.raises(frost_runtime.BindError, match="slot 0 'x': tensor on cpu, the plan was loaded on cuda:0"):
        plan.execute(torch.zeros(4))
    with pytest.raises(frost_runtime.BindError, match="slot 0 'x': tensor on cpu"):
        plan.bind(torch.zeros(4))
    assert fake.launches == 0
