"""One layer's attention in a vLLM step through the set's mixed plan (the impl's work), on tensors
exactly as vLLM hands them: no vLLM import, so the GPU tests run it where vLLM is not installed.

- **The cache by strides.** vLLM's per-layer cache is (blocks, hkv, page_size, 2d) logically, K
  the first d of the last dim and V the second; its strides are the layout's (nhd or hnd). K's
  and V's views are bound as they are (no copy): `cache_views`. An fp8 cache arrives as uint8 and
  is viewed as e4m3.
- **Rows.** The plan takes its bucket's `tokens` rows of q, k, v and o. vLLM's are as many or more
  (padded to a CUDA-graph capture size; rows past the step's sequences are never read nor
  written) or fewer (a step longer than the captured sizes, taking the next bucket): a contiguous
  tensor of enough rows is bound as a prefix view; anything else (fewer rows, or q, k, v as views
  of a fused QKV projection) is staged through buffers of the launcher's, and o copied back.
- **Scales.** vLLM's 0-dim `_k_scale` / `_v_scale` (or one per KV head) as the plan's (1,) or (hkv,).
- **Checked once per layer**: dtype, the cache's block count, layout and dtype against the plan,
  each mismatch naming vLLM's setting; the plan's own checks run at every launch (`execute`).
"""

from __future__ import annotations

import torch
from frost_runtime import dtypes
from frost_runtime.planset import KindInfo

from frost_vllm.plans import SetError, VllmSet
from frost_vllm.step import Step


def cache_views(kv_cache: torch.Tensor, head_dim: int, quantized: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """K's and V's (blocks, page_size, hkv, d) views of one layer of vLLM's cache."""
    if quantized:
        kv_cache = kv_cache.view(torch.float8_e4m3fn)
    pages = kv_cache.transpose(1, 2)  # (blocks, page_size, hkv, 2d), whatever the stride order
    return pages[..., :head_dim], pages[..., head_dim:]


class LayerLauncher:
    """The mixed plans of one layer kind: loaded at first use, shared by every layer of the kind
    (layers run one after another on one stream, so they share workspaces and staging too)."""

    def __init__(self, s: VllmSet, kind: KindInfo, *, load=None):
        self.set = s
        self.kind = kind
        self._load = load if load is not None else s.plans.load
        self._plans: dict[int, tuple[object, object]] = {}  # bucket tokens -> (plan, workspace)
        self._staging: dict[str, torch.Tensor] = {}  # role -> (max tokens, heads, d)
        # data_ptr of a layer's cache -> its K and V views: checked and made once (vLLM allocates
        # each layer's cache once, at start), not on every step
        self._caches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def preload(self) -> None:
        """Load every bucket's plan now (a server's start: no load inside a request)."""
        for bucket in self.set.buckets:
            self.plan_for(bucket.tokens)

    def run(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        step: Step,
        output: torch.Tensor,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Append the step's K/V to its slots and attend: output's first `step.tokens` rows.
        `sinks`: the layer's, float32 (hq,), where its kind has them."""
        quantized = self.set.scale_grain is not None
        views = self._caches.get(kv_cache.data_ptr())
        if views is None:
            self._check(query, kv_cache)
            views = self._caches[kv_cache.data_ptr()] = cache_views(kv_cache, self.kind.head_dim, quantized)
        k_cache, v_cache = views
        tokens = step.bucket.tokens
        o = self._bound_rows("o", output, tokens, copy=False)
        buffers = {
            "q": self._bound_rows("q", query, tokens),
            "k_new": self._bound_rows("k", key, tokens),
            "v_new": self._bound_rows("v", value, tokens),
            "o": o,
            "k_cache": k_cache,
            "v_cache": v_cache,
            "slot_mapping": step.slot_mapping,
            "page_table": step.page_table,
            "cache_len": step.cache_len,
            "cu_q": step.cu_q,
        }
        if quantized:
            buffers["k_scale"], buffers["v_scale"] = self._scale(k_scale, "k"), self._scale(v_scale, "v")
        if self.kind.sinks:
            if sinks is None:
                raise SetError(f"layer kind {self.kind.kind} has attention sinks: pass the layer's (float32, one per "
                               "query head)")  # fmt: skip
            buffers["sinks"] = sinks
        plan, workspace = self.plan_for(tokens)
        plan.execute(*(buffers[name] for name in plan.slots), workspace=workspace)
        if o.data_ptr() != output.data_ptr():  # staged: the step's rows back into vLLM's output
            rows = min(step.tokens, output.shape[0])
            output[:rows].copy_(o[:rows])

    def _bound_rows(self, role: str, x: torch.Tensor, tokens: int, copy: bool = True) -> torch.Tensor:
        """`x`'s first `tokens` rows as the plan binds them: a view of x when it has them
        contiguously, else the role's staging buffer (x's rows copied in unless `copy` is off)."""
        if x.shape[0] >= tokens and x[:tokens].is_contiguous():
            return x[:tokens]
        staged = self._staging_buffer(role, x)[:tokens]
        if copy:
            rows = min(x.shape[0], tokens)
            staged[:rows].copy_(x[:rows])
        return staged

    def _staging_buffer(self, role: str, like: torch.Tensor) -> torch.Tensor:
        if role not in self._staging:
            shape = (self.set.max_tokens, *like.shape[1:])
            self._staging[role] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return self._staging[role]

    def _scale(self, scale: torch.Tensor | None, which: str) -> torch.Tensor:
        grain = 1 if self.set.scale_grain == "tensor" else self.kind.kv_heads
        if scale is None or scale.numel() != grain:
            got = "none" if scale is None else f"{scale.numel()} values"
            raise SetError(
                f"{which}_scale: the set's e4m3 cache takes {grain} (one per {self.set.scale_grain}), vLLM passed "
                f"{got}: rebuild the set with --kv-scales {'head' if grain == 1 else 'tensor'}"
            )
        return scale.reshape(grain).to(torch.float32)

    def plan_for(self, tokens: int):
        """The plan of the bucket taking `tokens` rows, and its workspace (loaded at first use)."""
        if tokens not in self._plans:
            bucket = self.set.bucket(tokens)
            plan = self._load(self.set.key(self.kind.kind, bucket))
            workspace = plan.allocate_workspace() if getattr(plan, "workspace_bytes", 0) else None
            self._plans[tokens] = (plan, workspace)
        return self._plans[tokens]

    def _check(self, query: torch.Tensor, kv_cache: torch.Tensor) -> None:
        """The layer's dtype and cache against the set, every mismatch named."""
        s, problems = self.set, []
        dtype = dtypes.from_torch(query.dtype) or str(query.dtype)
        if dtype != self.kind.dtype:
            problems.append(f"--dtype: the model runs {dtype}, the set's kind {self.kind.kind} is {self.kind.dtype}")
        quantized = s.scale_grain is not None
        if quantized != (kv_cache.dtype == torch.uint8):
            want = "fp8" if quantized else "auto"
            problems.append(f"--kv-cache-dtype: the cache holds {kv_cache.dtype}, the set's is {s.kv_cache_dtype}: "
                            f"start vLLM with --kv-cache-dtype {want}")  # fmt: skip
        if kv_cache.dim() != 4 or kv_cache.shape[1:] != (s.kv_heads, s.page_size, 2 * s.head_dim):
            want = f"(blocks, {s.kv_heads}, {s.page_size}, {2 * s.head_dim})"
            problems.append(f"the layer's cache is {tuple(kv_cache.shape)}, the set's {want}: check --block-size and "
                            "--tensor-parallel-size")  # fmt: skip
        elif kv_cache.shape[0] != s.pages:
            problems.append(f"the cache has {kv_cache.shape[0]} blocks, the set's plans {s.pages}: start vLLM with "
                            f"--num-gpu-blocks-override {s.pages}")  # fmt: skip
        else:
            layout = "nhd" if kv_cache.stride(2) > kv_cache.stride(1) else "hnd"
            if layout != s.layout:
                problems.append(f"VLLM_KV_CACHE_LAYOUT: the cache is {layout.upper()}, the set's "
                                f"{s.layout.upper()}: set VLLM_KV_CACHE_LAYOUT={s.layout.upper()}")  # fmt: skip
        if problems:
            raise SetError(f"{s.path}, layer kind {self.kind.kind}: " + "; ".join(problems))
