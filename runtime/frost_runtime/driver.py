"""The CUDA driver calls the runtime needs, and nothing else.

Everything goes through cuda-bindings, the launch included: measured on the H200, its
`cuLaunchKernel` with a prebuilt parameter array (3.7 µs) beat a ctypes call into libcuda with
prebuilt ctypes arguments (4.0 µs) and with declared argtypes (4.9 µs).
"""

from dataclasses import dataclass

from cuda.bindings import driver as cu


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message holds the driver's name for the error."""


def check(result):
    """Unwrap a cuda-bindings (err, value...) tuple, raising with the driver's error string."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(_error_text(err))
    return values[0] if len(values) == 1 else tuple(values) or None


def _error_text(err) -> str:
    name = cu.cuGetErrorName(err)[1]
    text = cu.cuGetErrorString(err)[1]
    decode = lambda b: b.decode() if isinstance(b, bytes) else str(b)  # noqa: E731
    return f"{decode(name)}: {decode(text)}"


def check_launch(code) -> None:
    if code != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(_error_text(code))


@dataclass(frozen=True)
class Device:
    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    driver_version: int
    sm_count: int = 0  # streaming multiprocessors: persistent grids start at most this many CTAs


def current_context_device() -> Device:
    """Make sure a context is current (the device's primary one, as torch uses) and describe it."""
    check(cu.cuInit(0))
    ctx = check(cu.cuCtxGetCurrent())
    if int(ctx) == 0:
        ordinal = _torch_current_device()
        ctx = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(ordinal))))
        check(cu.cuCtxSetCurrent(ctx))
    return describe_device(check(cu.cuCtxGetDevice()))


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
    module = check(cu.cuModuleLoadData(cubin))
    function = check(cu.cuModuleGetFunction(module, entry.encode()))
    attr = cu.CUfunction_attribute
    if smem_bytes > 48 * 1024:  # above 48 KiB a kernel must opt in
        check(cu.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes))
    return LoadedKernel(module, function)


def unload_kernel(kernel: LoadedKernel) -> None:
    check(cu.cuModuleUnload(kernel.module))


def zero_words_async(address: int, words: int, stream: int) -> None:
    """Queue a zero fill of `words` 32-bit words at `address` on `stream` (capturable)."""
    check(cu.cuMemsetD32Async(address, 0, words, stream))


def stream_is_capturing(stream: int) -> bool:
    status = check(cu.cuStreamIsCapturing(stream))
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


SUCCESS = cu.CUresult.CUDA_SUCCESS
launch_kernel = cu.cuLaunchKernel  # (f, grid xyz, block xyz, smem, stream, params, extra)
