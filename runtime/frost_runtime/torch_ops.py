"""`frostc::` torch custom ops: plans launched from torch code, under `torch.compile` and inside
CUDA-graph capture.

    from frost_runtime import torch_ops
    torch_ops.register("llama/l0-decode-b8", plan)    # a loaded Plan under a string key, once
    torch.ops.frostc.execute("llama/l0-decode-b8", reads, writes, workspace)   # in place, -> None
    o, = torch.ops.frostc.run("llama/l0-prefill-b4", reads)   # new outputs, one per written slot

`reads` are the plan's input slots and `writes` its output slots (o, lse, and both caches for a
step with kv_append), each in slot order (`slot_roles(key)` lists them). Schemas take tensors,
ints and strings, so a plan travels as a string key into this process-wide registry (vLLM passes
its layers by name the same way). `execute` mutates exactly `writes` and the workspace; `run`
allocates its outputs from the plan's slots (its fake does the same from the plan's metadata, so
`torch.compile` traces it without a GPU call) and uses the registry's workspace.

A tensor of the slot's dtype and shape whose strides differ (as compile can produce) or whose
pointer is misaligned is staged into a plan-shaped buffer: one copy in (and one back for a
written slot), memory-bound at HBM speed, e.g. ~2 us per MB on an H200. Anything else that does
not match its slot (dtype, shape, device) raises BindError naming the slot.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from frost_runtime import dtypes
from frost_runtime.plan import BindError, Plan
from frost_runtime.schema import PlanData, TensorSlot

_TORCH_DTYPES = {name: dtypes.torch_dtype(name) for name in dtypes.NAMES}


@dataclass
class Registered:
    """A plan under its key: what the ops launch, and the metadata their fakes read."""

    key: str
    data: PlanData
    plan: Plan | None  # None: metadata only (tracing, fakes); executing it raises
    reads: tuple[int, ...]  # the input slots' indices, in slot order
    writes: tuple[int, ...]  # the output slots' indices
    workspace: torch.Tensor | None  # `run`'s, and `execute`'s when given none


_registry: dict[str, Registered] = {}
_lock = threading.Lock()


def register(key: str, plan: Plan | PlanData, *, replace: bool = False) -> Registered:
    """Put `plan` under `key` for the ops. A loaded Plan can be executed; PlanData (a decoded plan,
    no GPU) serves fakes and shape checks only. Its workspace is allocated here, once. A key is
    taken once unless `replace`."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"plan key {key!r}: expected a non-empty string")
    data = plan.data if isinstance(plan, Plan) else plan
    if not isinstance(data, PlanData):
        raise TypeError(f"register({key!r}, ...): expected a frost_runtime Plan or PlanData, got {type(plan).__name__}")
    reads = tuple(i for i, s in enumerate(data.slots) if not s.is_output)
    writes = tuple(i for i, s in enumerate(data.slots) if s.is_output)
    workspace = plan.allocate_workspace() if isinstance(plan, Plan) else None
    entry = Registered(key, data, plan if isinstance(plan, Plan) else None, reads, writes, workspace)
    with _lock:
        if key in _registry and not replace:
            raise ValueError(
                f"plan key {key!r} is registered already (to {_registry[key].data.header.name!r}); "
                "pick another key, or register(..., replace=True)"
            )
        _registry[key] = entry
    return entry


def unregister(key: str) -> None:
    with _lock:
        _registry.pop(key, None)


def registered(key: str) -> Registered:
    try:
        return _registry[key]
    except KeyError:
        known = ", ".join(sorted(_registry)[:8]) or "none"
        raise KeyError(
            f"no frostc plan is registered under {key!r} (registered: {known}); "
            "call frost_runtime.torch_ops.register(key, plan) first"
        ) from None


def slot_roles(key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The slot names `reads` and `writes` take, in order."""
    r = registered(key)
    return tuple(r.data.slots[i].name for i in r.reads), tuple(r.data.slots[i].name for i in r.writes)


# --------------------------------------------------------------------------------------- the ops


@torch.library.custom_op("frostc::execute", mutates_args=("writes", "workspace"), device_types="cuda")
def execute(plan: str, reads: list[torch.Tensor], writes: list[torch.Tensor], workspace: torch.Tensor | None) -> None:
    """Launch the plan registered under `plan` on its input slots `reads` and output slots
    `writes` (slot order), on torch's current stream; `workspace` None takes the registry's."""
    _execute(plan, reads, writes, workspace)


def launch(plan: str, reads: list[torch.Tensor], writes: list[torch.Tensor], workspace=None) -> None:
    """`torch.ops.frostc.execute` where torch.compile traces; outside it the same launch without the
    dispatcher's custom-op layer (~0.1 ms of host time a call: the serving loops' eager steps and
    CUDA-graph captures call plans thousands of times)."""
    if torch.compiler.is_compiling():
        torch.ops.frostc.execute(plan, reads, writes, workspace)
    else:
        _execute(plan, reads, writes, workspace)


def _execute(plan: str, reads: list[torch.Tensor], writes: list[torch.Tensor], workspace) -> None:
    r = registered(plan)
    runnable = _runnable(r)
    staged_reads = [_plan_shaped(r, i, t) for i, t in _paired(r, r.reads, reads, "reads")]
    staged_writes = [_plan_shaped(r, i, t) for i, t in _paired(r, r.writes, writes, "writes")]
    runnable.execute(*_in_slot_order(r, staged_reads, staged_writes), workspace=_workspace(r, workspace))
    for given, staged in zip(writes, staged_writes):
        if staged is not given:
            given.copy_(staged)


@torch.library.custom_op("frostc::run", mutates_args=(), device_types="cuda")
def run(plan: str, reads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Launch the plan on its input slots and return its output slots, new tensors shaped as the
    plan's slots (for plans that write only fresh outputs: o, lse; a step that appends to caches
    takes `execute`). Rows the plan does not write (past a packed batch's tokens, past a padded
    sequence's length) are 0: an output is a function of the inputs, as torch.compile assumes."""
    r = registered(plan)
    runnable = _runnable(r)
    _refuse_caches(r)
    staged = [_plan_shaped(r, i, t) for i, t in _paired(r, r.reads, reads, "reads")]
    outputs = [_empty_slot(r.data.slots[i], reads[0].device).zero_() for i in r.writes]
    runnable.execute(*_in_slot_order(r, staged, outputs), workspace=r.workspace)
    return outputs


@run.register_fake
def _(plan: str, reads: list[torch.Tensor]) -> list[torch.Tensor]:
    r = registered(plan)
    _refuse_caches(r)
    _paired(r, r.reads, reads, "reads")
    return [_empty_slot(r.data.slots[i], reads[0].device) for i in r.writes]


# --------------------------------------------------------------------------------------- helpers


def _runnable(r: Registered) -> Plan:
    if r.plan is None:
        raise RuntimeError(
            f"plan key {r.key!r} was registered from metadata only (PlanData): fakes and tracing work, executing "
            "needs a loaded plan: register(key, frost_runtime.load(...), replace=True)"
        )
    return r.plan


def _refuse_caches(r: Registered) -> None:
    """`run` allocates its outputs: a plan that updates caches in place (kv_append) cannot be run so."""
    if any(n.op == "kv_append" for n in r.data.nodes):
        caches = [r.data.slots[i].name for i in r.writes]
        raise BindError(
            f"plan {r.key!r} updates caches in place (kv_append): call torch.ops.frostc.execute with "
            f"its written slots {caches} as `writes`"
        )


def _paired(r: Registered, indices: tuple[int, ...], given: list[torch.Tensor], what: str):
    if len(given) != len(indices):
        names = [r.data.slots[i].name for i in indices]
        raise BindError(f"plan {r.key!r}: `{what}` takes {len(indices)} tensors, the slots {names}; got {len(given)}")
    return zip(indices, given)


def _in_slot_order(r: Registered, reads: list, writes: list) -> list:
    buffers: list = [None] * len(r.data.slots)
    for i, t in zip(r.reads, reads):
        buffers[i] = t
    for i, t in zip(r.writes, writes):
        buffers[i] = t
    return buffers


def _plan_shaped(r: Registered, index: int, t: torch.Tensor) -> torch.Tensor:
    """`t`; a view of it in the slot's strides when they differ only on dims of size 1 (which
    address nothing: HF's decode-step queries carry such strides); else a copy in the slot's
    strides when only strides or alignment differ."""
    slot = r.data.slots[index]
    dtype = _TORCH_DTYPES.get(slot.dtype)
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != slot.dims:
        return t  # the plan's check names what is wrong
    aligned = t.data_ptr() % slot.align == 0
    if tuple(t.stride()) == slot.strides and aligned:
        return t
    if aligned and all(n == 1 or a == b for n, a, b in zip(slot.dims, t.stride(), slot.strides)):
        return t.as_strided(slot.dims, slot.strides)
    staged = _empty_slot(slot, t.device)
    staged.copy_(t)
    return staged


def _empty_slot(slot: TensorSlot, device: torch.device) -> torch.Tensor:
    return torch.empty_strided(slot.dims, slot.strides, dtype=_TORCH_DTYPES[slot.dtype], device=device)


def _workspace(r: Registered, given: torch.Tensor | None) -> torch.Tensor | None:
    return r.workspace if given is None else given
