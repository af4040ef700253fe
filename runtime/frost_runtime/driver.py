"""The CUDA driver calls the runtime needs, and nothing else.

Everything goes through cuda-bindings, the launch included: measured on the H200, its
`cuLaunchKernel` with a prebuilt parameter array (3.7 µs) beat a ctypes call into libcuda with
prebuilt ctypes arguments (4.0 µs) and with declared argtypes (4.9 µs).
"""

from dataclasses import dataclass

from cuda.bindings import driver as cu


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message holds the driver's name for the error (`name`)."""

    def __init__(self, message: str, name: str = ""):
        super().__init__(message)
        self.name = name  # e.g. "CUDA_ERROR_INVALID_IMAGE"


def check(result, call: str = ""):
    """Unwrap a cuda-bindings (err, value...) tuple, raising with the driver's error string
    (after `call`, the driver function's name, when given)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError((f"{call}: " if call else "") + error_text(err), error_name(err))
    return values[0] if len(values) == 1 else tuple(values) or None


def _decode(b) -> str:
    return b.decode() if isinstance(b, bytes) else str(b)


def error_name(err) -> str:
    """The driver's name for a CUresult, e.g. "CUDA_ERROR_INVALID_IMAGE" (the enum's own name
    when the driver cannot be asked)."""
    try:
        return _decode(cu.cuGetErrorName(err)[1])
    except Exception:
        return getattr(err, "name", str(err))


def error_text(err) -> str:
    try:
        return f"{error_name(err)}: {_decode(cu.cuGetErrorString(err)[1])}"
    except Exception:
        return error_name(err)


def check_launch(code) -> None:
    if code != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(error_text(code), error_name(code))


@dataclass(frozen=True)
class Device:
    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    driver_version: int
    sm_count: int = 0  # streaming multiprocessors: persistent grids start at most this many CTAs


def current_context() -> tuple[object, Device]:
    """Make sure a context is current (the device's primary one, as torch uses); that context
    (a CUcontext) and its device."""
    check(cu.cuInit(0), "cuInit")
    ctx = check(cu.cuCtxGetCurrent())
    if int(ctx) == 0:
        ordinal = _torch_current_device()
        ctx = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(ordinal))))
        check(cu.cuCtxSetCurrent(ctx))
    return ctx, describe_device(check(cu.cuCtxGetDevice()))


def current_context_device() -> Device:
    return current_context()[1]


def current_context_handle() -> int | None:
    """The calling thread's current context as an int (0: none), or None if the driver cannot
    say; never raises (it explains failures, off the hot path)."""
    try:
        err, ctx = cu.cuCtxGetCurrent()
        return int(ctx) if err == cu.CUresult.CUDA_SUCCESS else None
    except Exception:
        return None


def describe_device(dev) -> Device:
    """Name, compute capability and driver version of a CUdevice (what compatibility needs)."""
    attr = cu.CUdevice_attribute
    major = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    name = check(cu.cuDeviceGetName(256, dev))
    name = name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
    sms = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    return Device(int(dev), name, (int(major), int(minor)), int(check(cu.cuDriverGetVersion())), int(sms))


def _torch_current_device() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class LoadedKernel:
    module: object  # CUmodule; kept so the module outlives its functions
    function: object  # CUfunction


def load_kernel(cubin: bytes, entry: str, smem_bytes: int) -> LoadedKernel:
    """Load a cubin into the current context; a failure unloads what this call loaded."""
    module = check(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
    try:
        function = check(cu.cuModuleGetFunction(module, entry.encode()), f"cuModuleGetFunction({entry})")
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        if smem_bytes > 48 * 1024:  # above 48 KiB a kernel must opt in
            check(cu.cuFuncSetAttribute(function, attr, smem_bytes), f"cuFuncSetAttribute(smem {smem_bytes} B)")
    except CudaError:
        cu.cuModuleUnload(module)
        raise
    return LoadedKernel(module, function)


def unload_kernel(kernel: LoadedKernel) -> None:
    check(cu.cuModuleUnload(kernel.module), "cuModuleUnload")


def unload_kernels(context, kernels) -> None:
    """Unload `kernels` from `context`, made current for the calls (a module is unloaded from
    its own context, whichever thread closes the plan); every one is tried, the first failure
    raised after."""
    check(cu.cuCtxPushCurrent(context), "cuCtxPushCurrent")
    failure = None
    try:
        for kernel in kernels:
            try:
                unload_kernel(kernel)
            except CudaError as exc:
                failure = failure or exc
    finally:
        cu.cuCtxPopCurrent()
    if failure is not None:
        raise failure


def zero_words_async(address: int, words: int, stream: int) -> None:
    """Queue a zero fill of `words` 32-bit words at `address` on `stream` (capturable)."""
    check(cu.cuMemsetD32Async(address, 0, words, stream))


def stream_is_capturing(stream: int) -> bool:
    status = check(cu.cuStreamIsCapturing(stream))
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


SUCCESS = cu.CUresult.CUDA_SUCCESS
launch_kernel = cu.cuLaunchKernel  # (f, grid xyz, block xyz, smem, stream, params, extra)
launch_kernel_ex = cu.cuLaunchKernelEx  # (config, f, params, extra)


def early_launch_config(geometry: tuple[int, ...], stream: int):
    """A launch configuration (grid xyz, block xyz, shared bytes) on `stream` that lets the
    kernel start before the launch ahead of it in the stream ends (programmatic stream
    serialization: it starts once that launch's CTAs have all started or triggered
    griddepcontrol.launch_dependents; it must itself wait with griddepcontrol.wait before it
    reads what that launch writes). A CUDA-graph capture records the dependency as such."""
    attribute = cu.CUlaunchAttribute()
    attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attribute.value.programmaticStreamSerializationAllowed = 1
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = geometry[0:3]
    config.blockDimX, config.blockDimY, config.blockDimZ = geometry[3:6]
    config.sharedMemBytes = geometry[6]
    config.hStream = stream
    config.attrs = [attribute]
    config.numAttrs = 1
    return config
