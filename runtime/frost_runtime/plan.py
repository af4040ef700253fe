"""A loaded plan: kernels loaded once, parameters packed once, `execute` patches pointers.

The rules `execute` keeps (each one is why a serving engine can call it thousands of times a
second and capture it in a CUDA graph):

1. No device-to-host read and no synchronization: a D2H read waits for the whole queued
   pipeline (milliseconds behind queued work) and is illegal under CUDA-graph capture.
2. Nothing re-derived that was fixed at build: slots, strides and parameter layouts were
   resolved by the compiler; `execute` only checks buffer metadata and patches pointers.
3. Every device operation on the launch stream, and no device memory owned by the runtime:
   scratch, when a plan needs any, comes from the caller's workspace (`workspace_bytes`;
   `allocate_workspace()` makes one with torch). Its "zeroed" regions (tile counters: the
   kernels find them zero and leave them zero) are zeroed on the launch stream by every
   `execute` and by a binding's first launch; between a binding's launches nothing else may
   write them.
4. Nothing observed at execute can cause a compile or a module load: modules are loaded in
   `load()`, so even a first `execute` inside a graph capture is a plain launch.
5. Failures cost nothing until they happen: a refused launch is explained (which launch, which
   kernel, whether another CUDA context is current) only after the driver refused it.

Lifetime: `close()` unloads the kernels. A plan dropped without it unloads them when it is
garbage-collected (a `weakref.finalize` backstop, in whichever thread collects it; never at
interpreter exit, when the process's end frees the context and everything in it, and the
driver's bindings may be half torn down). Either way the plan (or a binding of it, which holds
it) must outlive every CUDA graph that captured its launches.
"""

import ctypes
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from frost_runtime import driver, dtypes
from frost_runtime.dtypes import ELEMENT_BYTES
from frost_runtime.schema import (
    PARAM_ALIGN,
    PARAM_KINDS,
    WORKSPACE_ALIGN,
    Kernel,
    Launch,
    LengthContract,
    PlanData,
    TensorSlot,
)

_CTYPES = {
    "ptr": ctypes.c_uint64,
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "f32": ctypes.c_float,
    "tmap": ctypes.c_uint64,  # the field is the tensor map's address; the other 120 bytes are constant
    "i32x3": ctypes.c_int32 * 3,
}


class BindError(ValueError):
    """A buffer given to `execute` does not match its slot; nothing was launched."""


class CompatibilityError(RuntimeError):
    """The plan cannot run on this machine (architecture or driver); nothing was loaded."""


class LoadError(CompatibilityError):
    """The driver refused one of the plan's kernels (a damaged cubin, a GPU or driver it was
    not built for, no memory left); nothing of the plan stays loaded."""


class WorkspaceError(RuntimeError):
    """`allocate_workspace` could not get the plan's workspace: the GPU is out of memory."""


class LaunchError(driver.CudaError):
    """The driver refused one of the plan's launches (or the zero fill before them); `name`
    holds the driver's name for the error."""


class ContextError(LaunchError):
    """The plan was launched while a CUDA context other than the one it was loaded in (another
    device's, or none) was current in the calling thread."""


class LengthError(BindError):
    """Sequence lengths break the plan's capacities (found by `check_lengths`, on request)."""


class PlanClosedError(RuntimeError):
    """The plan was closed: its kernels are unloaded and it launches nothing."""


TYPESTR = {name: d.typestr for name, d in dtypes.DTYPES.items()}  # __cuda_array_interface__


@dataclass(frozen=True)
class _SlotCheck:
    """What a slot's buffer must look like, precomputed in the forms torch reports."""

    index: int
    name: str
    torch_dtype: object | None
    typestr: str  # __cuda_array_interface__ form
    itemsize: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    align: int
    key: tuple  # (dtype, torch.Size, strides, device index): what the fast path compares


MAX_STREAM_CONFIGS = 64  # early launches' configurations kept per launch (one per stream)


class _PackedLaunch:
    """One kernel launch with its parameter block packed once; only pointer fields change."""

    def __init__(self, launch: Launch, kernel: Kernel, loaded: driver.LoadedKernel, sm_count: int, index: int = 0):
        self.index = index  # in the plan's launches: what a failure names
        offsets, size = _param_offsets(kernel)
        self.buffer = (ctypes.c_byte * max(size, 1))()
        for off, arg in zip(offsets, launch.args):
            if arg.tmap:
                ctypes.memmove(ctypes.addressof(self.buffer) + off, arg.tmap, len(arg.tmap))
        self.fields = [_CTYPES[p.kind].from_buffer(self.buffer, off) for p, off in zip(kernel.params, offsets)]
        pointers = [ctypes.addressof(self.buffer) + off for off in offsets]
        self.param_array = (ctypes.c_void_p * max(len(pointers), 1))(*pointers)
        self.param_address = ctypes.addressof(self.param_array)
        self.slot_fields: list[tuple[int, ctypes.c_uint64]] = []
        self.workspace_fields: list[tuple[int, ctypes.c_uint64]] = []  # (byte offset, field)
        for field, arg in zip(self.fields, launch.args):
            if arg.slot >= 0:
                self.slot_fields.append((arg.slot, field))
            elif arg.workspace >= 0:
                self.workspace_fields.append((arg.workspace, field))
            elif isinstance(arg.value, tuple):
                field[:] = arg.value
            else:
                field.value = arg.value
        self.function = loaded.function  # the Plan holds the module, so the function stays valid
        grid = launch.grid
        if kernel.ctas_per_sm:  # persistent: one wave of CTAs loops over the tiles
            grid = (min(grid[0], sm_count * kernel.ctas_per_sm), *grid[1:])
        self.geometry = (*grid, *kernel.block, kernel.smem_bytes)
        self.early = launch.early
        self._configs: dict[int, object] = {}  # an early launch's configuration per stream

    def launch_early(self, stream: int):
        """Queue this (early) launch on `stream`: (the driver's result,). The configuration names
        the stream, so each stream gets its own, built once; two threads may both build one (the
        same contents), never change one another's."""
        config = self._configs.get(stream)
        if config is None:
            if len(self._configs) >= MAX_STREAM_CONFIGS:  # a process that cycles through streams
                self._configs.clear()
            config = self._configs[stream] = driver.early_launch_config(self.geometry, stream)
        return driver.launch_kernel_ex(config, self.function, self.param_address, 0)


def _param_offsets(kernel: Kernel) -> tuple[list[int], int]:
    """Each parameter at its alignment, as the kernel's parameter struct lays them out."""
    offsets, cursor = [], 0
    for p in kernel.params:
        size, align = PARAM_KINDS[p.kind], PARAM_ALIGN[p.kind]
        cursor = (cursor + align - 1) // align * align
        offsets.append(cursor)
        cursor += size
    return offsets, cursor


class Plan:
    """A plan ready to launch on the device whose context was current at `load()`."""

    def __init__(self, data: PlanData, device: driver.Device, context=None):
        """`context`: the CUcontext to load into, current in this thread (the current one when None)."""
        self.data = data
        self.header = data.header
        self.device = device
        self.slots: tuple[str, ...] = tuple(s.name for s in data.slots)
        self.workspace_bytes = data.workspace_bytes
        # (byte offset, 32-bit words) of the regions the launches must find zero
        self._zeroed = tuple((r.offset, r.bytes // 4) for r in data.workspace if r.zeroed)
        self._slot_index = {name: i for i, name in enumerate(self.slots)}
        self._checks = tuple(_slot_check(i, s, device.ordinal) for i, s in enumerate(data.slots))
        self._context = context if context is not None else driver.current_context()[0]
        self._context_handle = int(self._context)  # what a failed launch compares the current one with
        self._loaded = _load_kernels(data, device, self._context)
        # the backstop for a forgotten close(); it holds the modules, never the plan
        self._finalizer = weakref.finalize(self, _unload_forgotten, self._context, tuple(self._loaded))
        self._finalizer.atexit = False
        self._launches = [
            _PackedLaunch(launch, data.kernels[launch.kernel], self._loaded[launch.kernel], device.sm_count, i)
            for i, launch in enumerate(data.launches)
        ]
        self._launch = driver.launch_kernel
        self._lock = threading.Lock()  # parameter blocks are shared: patch + launch is atomic
        self._device_index = device.ordinal
        self._raw_stream = _current_stream_reader()
        self._tensor_type = _torch_tensor_type()
        self._bound: weakref.WeakSet[BoundPlan] = weakref.WeakSet()
        self.closed = False

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Unload the plan's kernels (a serving process that swaps plans would leak them
        otherwise). Work already queued must have finished or be ordered before any reuse of
        the memory; launches after close raise PlanClosedError, from bound plans too."""
        with self._lock:  # after any execute in flight; a second close (any thread) does nothing
            if self.closed:
                return
            self.closed = True
            self._launches = _ClosedLaunches()
            self._zeroed = ()  # nothing at all is queued after close, not even a fill
            for bound in list(self._bound):
                bound._calls = _ClosedLaunches()
                bound._counters_to_zero = []
            self._finalizer.detach()
            loaded, self._loaded = self._loaded, []
        try:
            driver.unload_kernels(self._context, loaded)
        except driver.CudaError as exc:
            raise driver.CudaError(
                f"plan {self.header.name!r}: unloading its kernels failed ({exc}); the CUDA context it was loaded in "
                f"(cuda:{self._device_index}) is gone or broken (a device reset, an earlier fault?). The plan is "
                "closed all the same",
                exc.name,
            ) from None

    def __enter__(self) -> "Plan":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def allocate_workspace(self):
        """A torch uint8 tensor of `workspace_bytes` on the plan's device (None when the plan
        needs none); allocated once, it serves every execute on one stream at a time."""
        if not self.workspace_bytes:
            return None
        import torch

        try:
            return torch.empty(self.workspace_bytes, dtype=torch.uint8, device=f"cuda:{self._device_index}")
        except torch.cuda.OutOfMemoryError as exc:
            n = self.workspace_bytes
            raise WorkspaceError(
                f"plan {self.header.name!r}: its workspace of {n} bytes ({_mib(n)}) does not fit in cuda:"
                f"{self._device_index}'s free memory ({str(exc).splitlines()[0] if str(exc) else 'out of memory'}). "
                "Allocate it once, early (before caches take the memory), or pass workspace= a buffer of at least "
                f"{n} bytes from your own pool, or rebuild the plan with smaller capacities (batch, max_seqlen_*, "
                "pages) for a smaller workspace"
            ) from exc

    # ------------------------------------------------------------------ the hot path
    def execute(self, *buffers, stream=None, workspace=None) -> None:
        """Launch the plan on `buffers`, given in slot order (`plan.slots`).

        `stream`: a torch.cuda.Stream, a raw CUstream handle (int or cuda-bindings object),
        or None for torch's current stream on the plan's device (the default stream without
        torch). Returns as soon as the work is queued.
        """
        pointers, base = self._validated_pointers(buffers, workspace)
        handle = self._raw_stream(self._device_index) if stream is None else _stream_handle(stream)
        launch, success = self._launch, driver.SUCCESS
        with self._lock:
            try:
                for offset, words in self._zeroed:  # tile counters, ordered before the launches
                    driver.zero_words_async(base + offset, words, handle)
            except driver.CudaError as exc:
                raise self._failure(exc.name, str(exc), "zeroing its workspace counters") from None
            for packed in self._launches:
                for slot, field in packed.slot_fields:
                    field.value = pointers[slot]
                for offset, field in packed.workspace_fields:
                    field.value = base + offset
                if packed.early:
                    (code,) = packed.launch_early(handle)
                else:
                    (code,) = launch(packed.function, *packed.geometry, handle, packed.param_address, 0)
                if code != success:
                    raise self._launch_error(code, packed.index)

    def bind(self, *buffers, workspace=None) -> "BoundPlan":
        """Check `buffers` (slot order) once and return a launcher with their pointers packed in.

        For serving loops that reuse the same buffers (as CUDA graphs do): `bound.execute()`
        only launches. The contract is a graph's: the bound tensors keep their storage, shape
        and strides while the binding is used (the binding keeps them alive).
        """
        if self.closed:
            raise PlanClosedError(f"plan {self.header.name!r} is closed")
        pointers, base = self._validated_pointers(buffers, workspace)
        launches = [self._pack(pointers, base, i) for i in range(len(self.data.launches))]
        counters = [(base + offset, words) for offset, words in self._zeroed]
        bound = BoundPlan(self, buffers + ((workspace,) if workspace is not None else ()), launches, counters)
        self._bound.add(bound)
        return bound

    def _pack(self, pointers: list[int], base: int, index: int) -> "_PackedLaunch":
        launch = self.data.launches[index]
        packed = _PackedLaunch(
            launch, self.data.kernels[launch.kernel], self._loaded[launch.kernel], self.device.sm_count, index
        )
        for slot, field in packed.slot_fields:
            field.value = pointers[slot]
        for offset, field in packed.workspace_fields:
            field.value = base + offset
        return packed

    def _validated_pointers(self, buffers: tuple, workspace) -> tuple[list[int], int]:
        """The buffers' pointers in slot order and the workspace's base (0 when none is needed)."""
        if len(buffers) != len(self._checks):
            raise BindError(
                f"execute takes {len(self._checks)} buffers in slot order {list(self.slots)}, got {len(buffers)}"
            )
        pointers = []
        for check, buf in zip(self._checks, buffers):
            # fast path: one tuple compare of torch metadata; anything else takes the careful path
            if type(buf) is self._tensor_type and (buf.dtype, buf.shape, buf.stride(), buf.get_device()) == check.key:
                pointer = buf.data_ptr()
                if not pointer % check.align:
                    pointers.append(pointer)
                    continue
            pointers.append(self._pointer(check, buf))
        base = self._workspace_pointer(workspace) if self.workspace_bytes else 0
        return pointers, base

    def execute_named(self, buffers: Mapping | None = None, /, *, stream=None, workspace=None, **named) -> None:
        """`execute` with buffers given by slot name (a mapping, keywords, or both)."""
        given = dict(buffers or {}) | named
        unknown = sorted(set(given) - set(self._slot_index))
        missing = [name for name in self.slots if name not in given]
        if unknown or missing:
            raise BindError(
                f"buffers by name: unknown {unknown or 'none'}, missing {missing or 'none'}; "
                f"the slots are {list(self.slots)}"
            )
        self.execute(*(given[name] for name in self.slots), stream=stream, workspace=workspace)

    # ------------------------------------------------------------------ failures (after the driver refused)
    def _launch_error(self, code, index: int) -> LaunchError:
        launch = self.data.launches[index]
        what = f"launch {index} (node {launch.node!r}, kernel {self.data.kernels[launch.kernel].name})"
        return self._failure(driver.error_name(code), driver.error_text(code), what)

    def _failure(self, name: str, text: str, what: str) -> LaunchError:
        """Why the driver refused `what`, and what to do: first of all, whether the calling
        thread has another CUDA context current than the plan's."""
        plan, device = f"plan {self.header.name!r}", f"cuda:{self._device_index}"
        current = driver.current_context_handle()
        if current is not None and current != self._context_handle:
            whose = "no CUDA context is" if current == 0 else "another CUDA context (another device's) is"
            return ContextError(
                f"{plan}: {what} failed ({text}): the plan was loaded on {device} but {whose} current in this "
                f"thread; make {device} current first (torch.cuda.set_device({self._device_index}), or `with "
                f"torch.cuda.device({self._device_index}):`), or load a plan for each device",
                name,
            )
        hint = _LAUNCH_HINTS.get(name, "the driver's error says why; `frostc check PLAN` says whether it runs here")
        return LaunchError(f"{plan} on {device}: {what} failed ({text}); {hint.format(device=device)}", name)

    # ------------------------------------------------------------------ checks (metadata only)
    def _pointer(self, check: _SlotCheck, buf) -> int:
        if check.torch_dtype is not None and type(buf).__module__.startswith("torch"):
            return _torch_pointer(check, buf, self.device.ordinal)
        return _cai_pointer(check, buf)

    def _workspace_pointer(self, workspace) -> int:
        """Checked from metadata like a slot: size, device, alignment; never read."""
        need = self.workspace_bytes
        if workspace is None:
            raise BindError(
                f"this plan needs a workspace of {need} bytes: pass workspace=plan.allocate_workspace() "
                "(allocate it once and reuse it)"
            )
        if type(workspace).__module__.startswith("torch"):
            nbytes = workspace.numel() * workspace.element_size()
            dev = workspace.device
            if dev.type != "cuda" or dev.index != self._device_index:
                raise BindError(f"workspace on {dev}, the plan was loaded on cuda:{self._device_index}")
            if not workspace.is_contiguous():
                raise BindError("workspace must be contiguous")
            pointer = workspace.data_ptr()
        else:
            cai = getattr(workspace, "__cuda_array_interface__", None)
            if cai is None:
                raise BindError(
                    "workspace: expected a CUDA buffer (torch or __cuda_array_interface__), "
                    f"got {type(workspace).__name__}"
                )
            itemsize = int(cai["typestr"][2:])
            nbytes = itemsize
            for extent in cai["shape"]:
                nbytes *= extent
            pointer = cai["data"][0]
        if nbytes < need:
            raise BindError(f"workspace has {nbytes} bytes, this plan needs {need}")
        if pointer % WORKSPACE_ALIGN:
            raise BindError(f"workspace pointer {pointer:#x} is not {WORKSPACE_ALIGN}-byte aligned")
        return pointer

    # ------------------------------------------------------------------ debugging (off the hot path)
    def check_lengths(self, *buffers) -> None:
        """Read the sequence-length slots back (a synchronizing host read: for debugging, never
        in a serving loop) and raise LengthError if any breaks the plan's capacities."""
        if len(buffers) != len(self._checks):
            raise BindError(f"check_lengths takes the {len(self._checks)} buffers of execute, got {len(buffers)}")
        for contract in self.data.lengths:
            values = [int(x) for x in buffers[contract.slot].cpu().tolist()]
            problem = length_problem(contract, values)
            if problem:
                raise LengthError(f"{_where(self._checks[contract.slot])}: {problem}")


_FAULT = (
    "a kernel faulted earlier on this CUDA context (not necessarily this plan's), which leaves the context "
    "unusable: restart the process (CUDA_LAUNCH_BLOCKING=1 names the kernel that faulted)"
)
_LAUNCH_HINTS = {
    "CUDA_ERROR_ILLEGAL_ADDRESS": _FAULT,
    "CUDA_ERROR_LAUNCH_FAILED": _FAULT,
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": _FAULT,
    "CUDA_ERROR_MISALIGNED_ADDRESS": _FAULT,
    "CUDA_ERROR_HARDWARE_STACK_ERROR": _FAULT,
    "CUDA_ERROR_INVALID_HANDLE": "the stream or a kernel is not valid here: pass a stream of {device}, and launch "
    "no plan after close()",
    "CUDA_ERROR_INVALID_CONTEXT": "make {device} current in this thread",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "the GPU cannot start the kernel's CTAs: the plan was built for another "
    "GPU? `frostc check PLAN` says",
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": "a capture in progress refused the launch: capture on the stream given "
    "to execute (stream=...), or capture in relaxed mode",
    "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED": "the capture in progress was already invalidated by an earlier call",
}


def _load_kernels(data: PlanData, device: driver.Device, context) -> list[driver.LoadedKernel]:
    """Every kernel of the plan, loaded into the current context; on a failure, nothing stays
    loaded and LoadError names the plan, the kernel and what to do."""
    loaded: list[driver.LoadedKernel] = []
    try:
        for i, k in enumerate(data.kernels):
            try:
                loaded.append(driver.load_kernel(k.cubin, k.entry, k.smem_bytes))
            except driver.CudaError as exc:
                hint = _LOAD_HINTS.get(exc.name, _LOAD_HINTS["CUDA_ERROR_NO_BINARY_FOR_GPU"])
                raise LoadError(
                    f"plan {data.header.name!r}: cuda:{device.ordinal} ({device.name}) refused kernel {i} "
                    f"({k.name}, entry {k.entry}): {exc}; {hint}"
                ) from None
    except BaseException:
        _unload_forgotten(context, loaded)
        raise
    return loaded


_DAMAGED = (
    "its cubin is damaged or not this plan's (plans are hash-checked, so it was written that way): rebuild "
    "the plan with `frostc build`"
)
_LOAD_HINTS = {
    "CUDA_ERROR_INVALID_IMAGE": _DAMAGED,
    "CUDA_ERROR_INVALID_SOURCE": _DAMAGED,
    "CUDA_ERROR_INVALID_PTX": _DAMAGED,
    "CUDA_ERROR_NOT_FOUND": _DAMAGED,
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "the plan was not built for this GPU and driver: `frostc check PLAN` says "
    "what runs here; rebuild the plan for this GPU",
    "CUDA_ERROR_OUT_OF_MEMORY": "the GPU is out of memory: free some, or load plans before filling caches, and load "
    "again",
}


def _unload_forgotten(context, kernels) -> None:
    """Unload `kernels` where nothing may raise: the finalizer of a plan dropped without
    close() (inside a garbage collection, in any thread), and a load that failed half-way."""
    try:
        driver.unload_kernels(context, kernels)
    except Exception:
        pass  # a context already gone (a device reset) took its modules with it


def _mib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.2f} MiB"


def length_problem(contract: LengthContract, values: list[int]) -> str | None:
    """What is wrong with `values` under the contract, or None."""
    if contract.kind == "offsets":
        if values[0] < 0:
            return f"offsets start at {values[0]}, below 0"
        for i in range(1, len(values)):
            step = values[i] - values[i - 1]
            if step < 0:
                return f"offsets decrease at entry {i} ({values[i - 1]} then {values[i]}); they are prefix sums"
            if step > contract.longest:
                return f"sequence {i - 1} has {step} tokens, over the plan's longest ({contract.longest})"
        if values[-1] > contract.total:
            return f"the offsets end at {values[-1]}, past the {contract.total} tokens the buffers hold"
        return None
    for i, length in enumerate(values):
        if not 0 <= length <= contract.longest:
            return f"sequence {i} has length {length}, outside [0, {contract.longest}]"
    return None


def _slot_check(index: int, slot: TensorSlot, device: int) -> _SlotCheck:
    torch_dtype = _torch_dtype(slot.dtype)
    size = _torch_size(slot.dims)
    return _SlotCheck(
        index=index,
        name=slot.name,
        torch_dtype=torch_dtype,
        typestr=TYPESTR[slot.dtype],
        itemsize=ELEMENT_BYTES[slot.dtype],
        shape=slot.dims,
        strides=slot.strides,
        align=slot.align,
        key=(torch_dtype, size, slot.strides, device),
    )


def _torch_size(dims: tuple[int, ...]):
    try:
        import torch
    except ImportError:
        return dims
    return torch.Size(dims)


def _torch_tensor_type():
    try:
        import torch
    except ImportError:
        return None
    return torch.Tensor


def _torch_dtype(name: str):
    try:
        return dtypes.torch_dtype(name)
    except ImportError:
        return None


def _where(check: _SlotCheck) -> str:
    return f"slot {check.index} {check.name!r}"


def _torch_pointer(check: _SlotCheck, t, device: int) -> int:
    if t.dtype is not check.torch_dtype:
        raise BindError(f"{_where(check)}: dtype {t.dtype}, the plan expects {check.torch_dtype}")
    if t.shape != check.shape:
        raise BindError(f"{_where(check)}: shape {tuple(t.shape)}, the plan expects {check.shape}")
    if t.stride() != check.strides:
        raise BindError(
            f"{_where(check)}: strides {t.stride()}, the plan expects {check.strides} "
            "(build the plan for this layout, or pass a tensor with it)"
        )
    dev = t.device
    if dev.type != "cuda" or dev.index != device:
        raise BindError(f"{_where(check)}: tensor on {dev}, the plan was loaded on cuda:{device}")
    pointer = t.data_ptr()
    if pointer % check.align:
        raise BindError(f"{_where(check)}: data pointer {pointer:#x} is not {check.align}-byte aligned")
    return pointer


def _cai_pointer(check: _SlotCheck, buf) -> int:
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai is None:
        raise BindError(
            f"{_where(check)}: expected a CUDA tensor (torch or __cuda_array_interface__), got {type(buf).__name__}"
        )
    if cai["typestr"] != check.typestr:
        raise BindError(f"{_where(check)}: typestr {cai['typestr']}, the plan expects {check.typestr}")
    if tuple(cai["shape"]) != check.shape:
        raise BindError(f"{_where(check)}: shape {tuple(cai['shape'])}, the plan expects {check.shape}")
    strides = cai.get("strides")
    strides = _contiguous(check.shape) if strides is None else tuple(s // check.itemsize for s in strides)
    if strides != check.strides:
        raise BindError(f"{_where(check)}: strides {strides}, the plan expects {check.strides}")
    pointer = cai["data"][0]
    if pointer % check.align:
        raise BindError(f"{_where(check)}: data pointer {pointer:#x} is not {check.align}-byte aligned")
    return pointer


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for extent in reversed(shape):
        strides.append(acc)
        acc *= extent
    return tuple(reversed(strides))


def _stream_handle(stream) -> int:
    raw = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream / ExternalStream
    if raw is not None:
        return raw
    if isinstance(stream, int):
        return stream
    return int(stream)  # cuda-bindings CUstream


def _current_stream_reader():
    """torch's current stream of a device as a raw handle, read without a Stream wrapper
    (building the wrapper costs microseconds per call); the legacy default stream without torch."""
    try:
        import torch
    except ImportError:
        return lambda device: 0
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:  # older torch: the wrapper is slower but correct
        return lambda device: torch.cuda.current_stream(device).cuda_stream
    return raw


class _ClosedLaunches:
    """Stands in for a closed plan's launches: iterating it (every launch loop does) raises."""

    def __iter__(self):
        raise PlanClosedError("the plan was closed; load it again to launch it")

    def __len__(self) -> int:
        return 0


class BoundPlan:
    """A plan with its buffers bound (see `Plan.bind`): `execute` only launches."""

    def __init__(self, plan: Plan, buffers: tuple, launches: list[_PackedLaunch], counters: list[tuple[int, int]]):
        self.plan = plan
        self.buffers = buffers  # held (the workspace too) so the bound memory outlives the binding
        self._launches = launches  # immutable after packing: no lock needed
        # early launches go through their packed launch (a configuration per stream)
        self._calls = [(p.function, p.geometry, p.param_address, p if p.early else None) for p in launches]
        self._raw_stream, self._device_index = plan._raw_stream, plan._device_index
        # zeroed workspace regions (address, words), until a first launch outside a capture
        # zeroed them: from then on the kernels keep them zero
        self._counters_to_zero = counters

    def execute(self, stream=None) -> None:
        """Launch on `stream` (as for `Plan.execute`; None: torch's current stream)."""
        handle = self._raw_stream(self._device_index) if stream is None else _stream_handle(stream)
        if self._counters_to_zero:
            self._zero_counters(handle)
        launch, success = driver.launch_kernel, driver.SUCCESS
        for function, geometry, params, early in self._calls:
            if early is None:
                (code,) = launch(function, *geometry, handle, params, 0)
            else:
                (code,) = early.launch_early(handle)
            if code != success:
                index = next(p.index for p in self._launches if p.param_address == params)
                raise self.plan._launch_error(code, index)

    def _zero_counters(self, handle: int) -> None:
        """Zero the counters on the launch stream before the first launch. A capture only
        records the fill (the graph then zeroes at every replay): the next launch outside a
        capture zeroes them again."""
        try:
            for address, words in self._counters_to_zero:
                driver.zero_words_async(address, words, handle)
        except driver.CudaError as exc:
            raise self.plan._failure(exc.name, str(exc), "zeroing its workspace counters") from None
        if not driver.stream_is_capturing(handle):
            self._counters_to_zero = []
