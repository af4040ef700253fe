"""An FP8 plan's inputs, made on the device: bf16 / fp16 / fp32 q, k and v quantized into e4m3
buffers laid out as the plan's slots (V as its description gives it: keys innermost, as the FP8
kernel reads it, or d innermost, which the plan re-lays), with their descales, amax / 448,
one per head or one per tensor as the descale slots' dims say. Nothing is read back to the host
and nothing synchronizes, so a serving step can quantize and attend inside one CUDA graph.

    inputs = Fp8Inputs(plan)                  # the e4m3 attention's buffers, allocated once
    inputs.quantize(q, k, v)                  # (b, h, s, d), or (t, h, d) packed; in place
    bound = plan.bind(*(inputs.buffers.get(name) or mine[name] for name in plan.slots), ...)

Which slots are the node's q, k, v and descales is read from the plan's record of its e4m3
attention node (its roles' slots), so any slot names work. The amax is taken over the whole
tensor (or head) as given: with variable lengths, rows outside the sequences count too, so they
should hold finite values (zeros, or an earlier step's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frost_runtime import dtypes
from frost_runtime.plan import BindError, Plan
from frost_runtime.schema import PlanData, TensorSlot

ROLES = ("q", "k", "v")
DESCALES = {role: f"{role}_descale" for role in ROLES}  # the roles of an e4m3 attention node's descales
HEAD_DIM = 1  # (b, h, s, d) and the packed (t, h, d) alike
SMALLEST_AMAX = 1e-12  # an all-zero tensor gets descale SMALLEST_AMAX / 448 (not 0: x / 0 is NaN)


@dataclass(frozen=True)
class Fp8Slots:
    """The slot indices of one e4m3 attention node: data (q, k, v) and their descales."""

    node: str
    data: dict[str, int]
    descales: dict[str, int]


def fp8_slots(data: PlanData, node: str | None = None) -> Fp8Slots:
    """The e4m3 attention node's slots (node `node`, or the plan's only such node): an sdpa node
    with descales, whose q, k and v are the slots the caller writes (a V that the plan re-lays
    for its kernel is still the caller's V slot)."""
    found = [
        Fp8Slots(n.name, {role: n.slots[role] for role in ROLES}, {role: n.slots[d] for role, d in DESCALES.items()})
        for n in data.nodes
        if n.op == "sdpa" and DESCALES["q"] in n.slots and (node is None or n.name == node)
    ]
    if len(found) != 1:
        where = f"node {node!r}" if node is not None else "the plan"
        what = "none" if not found else f"{len(found)} (nodes {', '.join(f.node for f in found)}): pass node="
        raise BindError(f"plan {data.header.name!r}: Fp8Inputs needs one e4m3 attention node in {where}, found {what}")
    return found[0]


class Fp8Inputs:
    """The e4m3 q, k, v and descale buffers of one FP8 attention node, allocated once in the
    plan's layouts on `device`; `quantize` refills them in place."""

    def __init__(self, plan: Plan | PlanData, node: str | None = None, device: torch.device | str = "cuda"):
        data = plan.data if isinstance(plan, Plan) else plan
        self.slots = fp8_slots(data, node)
        self._data_slots = {role: data.slots[i] for role, i in self.slots.data.items()}
        self._descale_slots = {role: data.slots[i] for role, i in self.slots.descales.items()}
        self.buffers: dict[str, torch.Tensor] = {}  # by slot name
        for slot in (*self._data_slots.values(), *self._descale_slots.values()):
            self.buffers[slot.name] = _empty(slot, device)

    def quantize(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
        """Quantize q, k and v ((b, h, s, d), or (t, h, d) packed: the slots' dims) into the
        buffers: descale = amax / 448 over each head (a descale slot of h entries) or the whole
        tensor (one entry), stored x / descale rounded to nearest and saturated at ±448. Returns
        the buffers, by slot name."""
        for role, x in zip(ROLES, (q, k, v)):
            slot, descale_slot = self._data_slots[role], self._descale_slots[role]
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != slot.dims:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise BindError(f"Fp8Inputs.quantize: {role} must be a tensor of shape {slot.dims} (slot "
                                f"{slot.name!r}), got {got}")  # fmt: skip
            if not x.is_floating_point() or x.dtype == torch.float8_e4m3fn:
                raise BindError(f"Fp8Inputs.quantize: {role} is {x.dtype}; give the unquantized values (bf16, fp16 "
                                "or fp32)")  # fmt: skip
            descale = self.buffers[descale_slot.name]
            per_head = descale_slot.dims[0] > 1
            others = tuple(i for i in range(x.dim()) if i != HEAD_DIM)
            amax = x.abs().amax(dim=others) if per_head else x.abs().amax().reshape(1)
            torch.div(amax.float().clamp_min(SMALLEST_AMAX), dtypes.E4M3_MAX, out=descale)
            scaled = x.float() / descale.view(_per_head_view(x.dim()))
            self.buffers[slot.name].copy_(scaled.clamp(-dtypes.E4M3_MAX, dtypes.E4M3_MAX))
        return self.buffers

    def dequantized(self, role: str) -> torch.Tensor:
        """q, k or v as the kernel sees it, in float32 (the slot's dims): stored value x descale."""
        slot, descale_slot = self._data_slots[role], self._descale_slots[role]
        stored = self.buffers[slot.name]
        return stored.float() * self.buffers[descale_slot.name].view(_per_head_view(stored.dim()))


def _per_head_view(rank: int) -> tuple[int, ...]:
    """A descale's shape against a tensor of `rank` dims: one value per head (dim 1), or one."""
    return tuple(-1 if i == HEAD_DIM else 1 for i in range(rank))


def _empty(slot: TensorSlot, device) -> torch.Tensor:
    return torch.empty_strided(slot.dims, slot.strides, dtype=dtypes.torch_dtype(slot.dtype), device=device)
