"""The CUDA driver calls the runtime needs, and nothing else.

Module loading, attributes and device queries go through cuda-bindings. The launch itself
calls libcuda's `cuLaunchKernel` through ctypes with arguments packed at load: it is the one
call on the hot path, and a prebuilt ctypes call is the cheapest way to reach the driver from
Python (cuda-bindings converts every argument on each call).
"""

import ctypes
import ctypes.util
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


def check_launch(code: int) -> None:
    if code != 0:
        raise CudaError(_error_text(cu.CUresult(code)))


@dataclass(frozen=True)
class Device:
    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    driver_version: int


def current_context_device() -> Device:
    """Make sure a context is current (the device's primary one, as torch uses) and describe it."""
    check(cu.cuInit(0))
    ctx = check(cu.cuCtxGetCurrent())
    if int(ctx) == 0:
        ordinal = _torch_current_device()
        ctx = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(ordinal))))
        check(cu.cuCtxSetCurrent(ctx))
    dev = check(cu.cuCtxGetDevice())
    attr = cu.CUdevice_attribute
    major = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    name = check(cu.cuDeviceGetName(256, dev))
    name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
    return Device(int(dev), name, (major, minor), check(cu.cuDriverGetVersion()))


def _torch_current_device() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class LoadedKernel:
    module: object  # CUmodule; kept so the module outlives its functions
    function: int  # CUfunction handle as an address
    num_regs: int
    local_bytes: int


def load_kernel(cubin: bytes, entry: str, smem_bytes: int) -> LoadedKernel:
    module = check(cu.cuModuleLoadData(cubin))
    function = check(cu.cuModuleGetFunction(module, entry.encode()))
    attr = cu.CUfunction_attribute
    if smem_bytes > 48 * 1024:  # above 48 KiB a kernel must opt in
        check(cu.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes))
    regs = check(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, function))
    local = check(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, function))
    return LoadedKernel(module, int(function), regs, local)


def unload(kernel: LoadedKernel) -> None:
    cu.cuModuleUnload(kernel.module)


def _libcuda():
    path = ctypes.util.find_library("cuda") or "libcuda.so.1"
    lib = ctypes.CDLL(path)
    fn = lib.cuLaunchKernel
    u32 = ctypes.c_uint
    fn.argtypes = [
        ctypes.c_void_p,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    fn.restype = ctypes.c_int
    return fn


_launch_kernel = None


def launch_kernel_fn():
    """libcuda's cuLaunchKernel as a ctypes function (resolved once)."""
    global _launch_kernel
    if _launch_kernel is None:
        _launch_kernel = _libcuda()
    return _launch_kernel
