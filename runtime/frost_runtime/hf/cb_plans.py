"""The plan executor (vLLM's impl seam) of transformers' continuous batching: each layer's step
through the plan set's mixed plan for its layer kind and token bucket (`frostc from-config
--cb-tokens ... --cb-blocks ...`: docs/serving.md), which appends the step's K/V into the pages
(kv_append's packed form) and attends over them, reading transformers' pool in place.

- **The bucket.** The smallest mixed plan of the layer's kind whose tokens take the step's rows;
  its sequences are min(tokens, transformers' max_requests_per_batch) (what transformers pads a step
  to under graphs). A step of fewer rows or sequences is staged into the bucket's shapes (the rows
  past the step's last sequence are not the plan's: the padding is never appended nor attended).
- **The pool by strides.** The layer's K and V page views (cb_cache.py) are bound as they are; their
  block count and dtype must be the plan's (transformers sizes its pool from `num_blocks`: the set
  records the one it was built for; an e4m3 set's pool is e4m3, with frostc's per-head scales of
  the layer: continuous.py).
- **Checked first**: heads, KV heads, head dim, dtype, scale, window, softcap and sinks against the set's
  layer kind; a mismatch raises naming the field.
- **The reference where no plan fits**: a step over the largest bucket, a set without mixed plans
  for the kind, or a chunk of a sliding layer that wraps its ring (its writes would land on keys its
  own earlier queries read: the reference reads first). Each reason is counted and warned once.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

from frost_runtime import dtypes, sinks
from frost_runtime.hf.cb_step import Step
from frost_runtime.hf.continuous import LayerCall, ReferenceExecutor
from frost_runtime.hf.launches import rows_as_slot
from frost_runtime.hf.support import kinds_by_layer
from frost_runtime.planset import KindInfo, PlanSet

PHASE = "mixed"


class PlanExecutor:
    """Mixed plans of a set, loaded at first use (`load(key)`: the set's `load` on the GPU)."""

    name = "plans"

    def __init__(self, plans: PlanSet, *, load: Callable | None = None, fallback=None):
        self.plans = plans
        self.max_pages = plans.serving.max_pages  # the page tables' width, the plans'
        self.fallback = fallback if fallback is not None else ReferenceExecutor()
        self._load = load if load is not None else plans.load
        self._kinds = kinds_by_layer(plans)
        self._loaded: dict[str, tuple[object, object]] = {}  # set key -> (plan, its workspace)
        self._slots: dict[str, dict] = {}  # set key -> its slots by name (capacities, from the set)
        self._warned: set[str] = set()
        self._checked: set[int] = set()  # layers whose attention matched their kind
        self._buckets: dict[tuple[str, int], tuple[str | None, str]] = {}  # (kind, rows) -> select's answer

    def preload(self) -> int:
        """Load every mixed plan now (a serving process's start: no load inside a request)."""
        for e in self.plans.entries:
            if e.phase == PHASE:
                self._plan(e.key)
        return len(self._loaded)

    def __call__(self, call: LayerCall) -> tuple[torch.Tensor, str]:
        info = self._kinds.get(call.layer)
        if info is None:
            raise ValueError(f"plan set {self.plans.header.name!r} serves no layer {call.layer}")
        if call.layer not in self._checked:  # a layer's heads, dtype, scale and mask never change
            check_call(self.plans, info, call)
            self._checked.add(call.layer)
        key, why = self._select(info, call)
        if key is None:
            return self._fall_back(call, why)
        plan, workspace = self._plan(key)
        buffers = _buffers(call, self._slots_of(key))
        plan.execute(*(buffers[name] for name in plan.slots), workspace=workspace)
        return buffers["o"][: call.step.rows], "plans"

    def _select(self, info: KindInfo, call: LayerCall) -> tuple[str | None, str]:
        """The bucket's key, or None and why the reference serves the step."""
        if call.wraps_ring:
            return None, "a chunk of a sliding layer wraps its ring (the reference reads before it writes)"
        found = self._buckets.get((info.kind, call.step.rows))
        if found is None:
            try:
                found = self.plans.select(PHASE, info.kind, call.step.rows), ""
            except (KeyError, ValueError) as exc:
                found = None, str(exc).strip("'\"")
            self._buckets[(info.kind, call.step.rows)] = found
        key, why = found
        if key is None:
            return None, why
        sequences = self._slots_of(key)["cu_q"].dims[0] - 1
        if call.step.sequences > sequences:
            return None, f"{call.step.sequences} sequences, over the bucket's {sequences} (--cb-requests)"
        return key, ""

    def _slots_of(self, key: str) -> dict:
        if key not in self._slots:
            self._slots[key] = {s.name: s for s in self.plans.plan_data(key).slots}
        return self._slots[key]

    def _plan(self, key: str):
        if key not in self._loaded:
            plan = self._load(key)
            workspace = plan.allocate_workspace() if getattr(plan, "workspace_bytes", 0) else None
            self._loaded[key] = (plan, workspace)
        return self._loaded[key]

    def _fall_back(self, call: LayerCall, why: str) -> tuple[torch.Tensor, str]:
        if why not in self._warned:
            self._warned.add(why)
            message = f"frostc: a continuous-batching step in torch (fp32 reference), not a plan: {why}"
            warnings.warn(message, stacklevel=4)
        out, _ = self.fallback(call)
        return out, f"reference ({why})"


def check_call(plans: PlanSet, info: KindInfo, call: LayerCall) -> None:
    """The call's attention is the kind's; refused, naming each field, when not."""
    rows, hq, d = call.q.shape
    problems = [
        f"{what}: the model passes {got}, the set was built for {want}"
        for what, got, want in (
            ("heads", hq, info.heads),
            ("KV heads", call.k.shape[1], info.kv_heads),
            ("head dim", d, info.head_dim),
            ("dtype", dtypes.from_torch(call.q.dtype) or str(call.q.dtype), info.dtype),
            ("window_left", call.window_left, info.window_left),
            ("softcap", call.softcap, info.softcap),
        )
        if got != want
    ]
    if not math.isclose(call.scale, info.scale, rel_tol=1e-6):
        problems.append(f"scale: the model passes {call.scale:.8g}, the set was built for {info.scale:.8g}")
    differs = sinks.mismatch(call.sinks is not None, info.sinks)
    if differs:
        problems.append(differs)
    if problems:
        raise ValueError(
            f"layer {call.layer} (kind {info.kind} of plan set {plans.header.name!r}): "
            + "; ".join(problems)
            + ": build the set from this model's config (frostc from-config)"
        )


def _buffers(call: LayerCall, slots: dict) -> dict[str, torch.Tensor]:
    """The plan's buffers by slot name: the step's rows (staged into the bucket's when fewer), the
    pool's page views as they are, the step's metadata padded to the bucket's sequences."""
    tokens = slots["q"].dims[0]
    sequences = slots["cu_q"].dims[0] - 1
    pages = slots["k_cache"].dims[0]
    if call.k_pages.shape[0] != pages:
        raise ValueError(
            f"num_blocks: transformers' pool has {call.k_pages.shape[0]} blocks for the "
            f"{call.geo.layer_type} layers, the plan set's mixed plans were built for {pages}: give "
            "ContinuousBatchingConfig the num_blocks the set was built with (frostc from-config --cb-blocks), "
            "or build the set with yours"
        )
    pool_dtype = dtypes.from_torch(call.k_pages.dtype) or str(call.k_pages.dtype)
    if pool_dtype != slots["k_cache"].dtype:
        raise ValueError(
            f"kv_cache_dtype: transformers' pool holds {pool_dtype}, the plan set's mixed plans read "
            f"{slots['k_cache'].dtype}: install frostc's attention with the set (continuous.install(model, plans)), "
            "which has transformers allocate the pool in the set's dtype"
        )
    optional = {}  # the slots a set has or not: an e4m3 pool's scales, the kind's sinks
    if "k_scale" in slots:
        optional = {"k_scale": call.k_scale, "v_scale": call.v_scale}
    if "sinks" in slots:  # check_call matched the kind's sinks with the call's
        optional["sinks"] = call.sinks
    step = call.step
    return {
        **optional,
        # the bucket's rows as the plan takes them: the layer's own where they are (a set built
        # with --qkv-layout fused takes hf_fuse's views of its QKV buffer), else staged
        "q": rows_as_slot(call.q, slots["q"]),
        "k_new": rows_as_slot(call.k, slots["k_new"]),
        "v_new": rows_as_slot(call.v, slots["v_new"]),
        "o": torch.empty((tokens, *call.q.shape[1:]), dtype=call.q.dtype, device=call.q.device),
        "k_cache": call.k_pages,
        "v_cache": call.v_pages,
        **_padded(step, sequences),
    }


def _padded(step: Step, sequences: int) -> dict[str, torch.Tensor]:
    """cu_q, cache_len and page_table for `sequences` rows: the step's, then empty sequences (built
    once a step: its layers share them)."""
    if sequences not in step.padded:
        step.padded[sequences] = _pad(step, sequences)
    return step.padded[sequences]


def _pad(step: Step, sequences: int) -> dict[str, torch.Tensor]:
    extra = sequences - step.sequences
    if extra == 0:
        return {"cu_q": step.cu_seqlens_q, "cache_len": step.seq_len_kv, "page_table": step.page_table}
    cu = torch.cat([step.cu_seqlens_q, step.cu_seqlens_q[-1:].expand(extra)])
    zeros = step.seq_len_kv.new_zeros(extra)
    table = torch.cat([step.page_table, step.page_table.new_zeros(extra, step.page_table.shape[1])])
    return {"cu_q": cu, "cache_len": torch.cat([step.seq_len_kv, zeros]), "page_table": table}
