"""frostc's attention backend for vLLM V1 (0.32): `--attention-backend FROSTC` with
`FROSTC_PLAN_SET=SET.frostset` (a set from `frostc from-config CONFIG --engine vllm`).

- `FrostcBackend` states what the set covers as data, and `validate_configuration` refuses, naming
  the setting and the fix, anything else (vLLM then stops at start: it never falls back silently).
- `FrostcMetadataBuilder` turns vLLM's `CommonAttentionMetadata` into the plans' slots with device
  copies into buffers it owns (step.py), once per step and KV-cache group, with no host read, and
  supports CUDA graphs for every batch (`AttentionCGSupport.ALWAYS`).
- `FrostcImpl` runs each layer through its kind's plan (launch.py): the step's K/V written to
  vLLM's slots by the plan's own append, then the attention, reading vLLM's cache in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from frost_runtime.sinks import LayerSinks
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

from frost_vllm.launch import LayerLauncher
from frost_vllm.plans import (
    ENV,
    Deployment,
    SetError,
    VllmSet,
    active_set,
    deployment_problems,
    kind_for,
    layer_attention,
)
from frost_vllm.step import Step, StepBuffers

NAME = "FROSTC"
LAYOUTS = {"nhd": KVCacheLayout.LBNHC, "hnd": KVCacheLayout.LBHNC}
VLLM_CACHE_DTYPES = {"bf16": ("auto", "bfloat16"), "fp16": ("auto", "float16"), "e4m3": ("fp8", "fp8_e4m3")}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HOPPER = (9, 0)


def _set_or_none() -> VllmSet | None:
    try:
        return active_set()
    except SetError:
        return None


def configuration_problems(
    s: VllmSet, *, head_size: int, dtype: torch.dtype, kv_cache_dtype: str | None, block_size: int | None,
    device_capability, has_sink: bool = False, use_per_head_quant_scales: bool = False, **_,
) -> list[str]:  # fmt: skip
    """What vLLM's selector hands the backend, against the set: each problem names the setting."""
    problems = []
    dims = sorted({k.head_dim for k in s.kinds})
    if head_size not in dims:
        problems.append(f"head_size {head_size}: the set {s.path} plans head dim {dims}")
    served = sorted({k.dtype for k in s.kinds})
    if all(TORCH_DTYPES.get(d) != dtype for d in served):
        problems.append(f"dtype {dtype}: the set's plans are {served}: start vLLM with --dtype {served[0]}")
    cache_names = VLLM_CACHE_DTYPES[s.kv_cache_dtype]
    if kv_cache_dtype is not None and kv_cache_dtype not in cache_names:
        problems.append(f"--kv-cache-dtype {kv_cache_dtype}: the set's cache is {s.kv_cache_dtype}: start vLLM with "
                        f"--kv-cache-dtype {cache_names[0]}, or rebuild the set (frostc --kv-cache-dtype)")  # fmt: skip
    if block_size is not None and block_size != s.page_size:
        problems.append(f"--block-size {block_size}: the set's pages hold {s.page_size} tokens")
    set_sinks = any(k.sinks for k in s.kinds)
    if has_sink != set_sinks:
        said = "has attention sinks" if has_sink else "has no attention sinks"
        problems.append(f"attention sinks: the model {said}, the set {s.path} was built "
                        f"{'with' if set_sinks else 'without'} them: rebuild it from this model's config")  # fmt: skip
    if use_per_head_quant_scales and s.scale_grain != "head":
        problems.append("per-head KV scales: the set's e4m3 cache takes one per tensor (frostc --kv-scales head)")
    if device_capability is not None and tuple(device_capability) != HOPPER:
        problems.append(f"compute capability {tuple(device_capability)}: frostc's plans are for sm_90a (Hopper)")
    return problems


class FrostcBackend(AttentionBackend):
    # the base class's checks read these; the set-specific ones are in validate_configuration
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3"]
    forward_includes_kv_cache_update: bool = True  # the plan appends the step's K/V itself

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls() -> type[FrostcImpl]:
        return FrostcImpl

    @staticmethod
    def get_builder_cls() -> type[FrostcMetadataBuilder]:
        return FrostcMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int]:
        s = _set_or_none()
        return [s.page_size] if s is not None else []

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        s = _set_or_none()
        return sorted({k.head_dim for k in s.kinds}) if s is not None else []

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        s = _set_or_none()
        return s is not None and any(k.sinks for k in s.kinds)

    @classmethod
    def supports_per_head_quant_scales(cls) -> bool:
        s = _set_or_none()
        return s is not None and s.scale_grain == "head"

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return tuple(capability) == HOPPER

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...] | None:
        s = _set_or_none()
        return (LAYOUTS[s.layout],) if s is not None else None

    @classmethod
    def validate_configuration(cls, **config) -> list[str]:
        """vLLM's generic checks (MLA, sparse, encoder attention, ...) and the set's own, each
        naming the setting; an unset or unreadable FROSTC_PLAN_SET is the one reason then."""
        try:
            s = active_set()
        except SetError as exc:
            return [str(exc)]
        generic = super().validate_configuration(**config)
        # the set's problems say more than the base class's one-word ones for the same settings
        vague = {"head_size not supported", "dtype not supported", "kv_cache_dtype not supported",
                 "block_size not supported", "compute capability not supported",
                 "attention sinks not supported", "per-head quant scales not supported"}  # fmt: skip
        return configuration_problems(s, **config) + [r for r in generic if r not in vague]


@dataclass
class FrostcMetadata(AttentionMetadata):
    step: Step
    num_actual_tokens: int


class FrostcMetadataBuilder(AttentionMetadataBuilder[FrostcMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.set = active_set()
        problems = deployment_problems(self.set, engine_deployment(vllm_config))
        spec_block = getattr(kv_cache_spec, "block_size", self.set.page_size)
        if spec_block != self.set.page_size:  # the hybrid allocator may give a group blocks of its own
            group = ", ".join(layer_names[:2]) + (", ..." if len(layer_names) > 2 else "")
            problems.append(f"the KV-cache group of {group} has blocks of {spec_block} tokens, the set's pages "
                            f"{self.set.page_size}: serve this model with another backend")  # fmt: skip
        if problems:
            raise SetError(f"vLLM's settings do not match {self.set.path}: " + "; ".join(problems))
        self.buffers = StepBuffers(self.set, device)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> FrostcMetadata:
        m = common_attn_metadata
        if m.causal is not True:
            raise SetError("a non-causal step: frostc's vLLM plans are causal (decoder attention)")
        step = self.buffers.prepare(
            m.query_start_loc, m.seq_lens, m.block_table_tensor, m.slot_mapping, m.num_reqs, m.num_actual_tokens
        )
        return FrostcMetadata(step=step, num_actual_tokens=m.num_actual_tokens)


def engine_deployment(vllm_config) -> Deployment:
    """What the engine was started with, from its VllmConfig."""
    scheduler, cache, parallel = vllm_config.scheduler_config, vllm_config.cache_config, vllm_config.parallel_config
    return Deployment(
        max_num_seqs=scheduler.max_num_seqs,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_model_len=vllm_config.model_config.max_model_len,
        block_size=cache.block_size,
        num_gpu_blocks=cache.num_gpu_blocks_override,
        tensor_parallel_size=parallel.tensor_parallel_size,
    )


class FrostcImpl(AttentionImpl[FrostcMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        **extra,
    ) -> None:
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        refused = [
            what
            for what, given in (
                ("ALiBi slopes", alibi_slopes is not None),
                (f"attention type {attn_type}", attn_type != AttentionType.DECODER),
                ("KV sharing across layers (kv_sharing_target_layer_name)", kv_sharing_target_layer_name is not None),
            )
            if given
        ]
        if refused:
            raise SetError(f"frostc's vLLM backend does not take {', '.join(refused)}: serve this model with another "
                           "--attention-backend")  # fmt: skip
        self.sinks = extra.get("sinks")  # gpt-oss's parameter: loaded after this, converted at each forward's lookup
        if self.sinks is not None and tuple(self.sinks.shape) != (num_heads,):
            raise SetError(f"attention sinks of shape {tuple(self.sinks.shape)}: one per query head is ({num_heads},)")
        self._sinks = LayerSinks()
        s = active_set()
        attention = layer_attention(
            num_heads, head_size, scale, num_kv_heads, sliding_window, logits_soft_cap, s.max_model_len,
            sinks=self.sinks is not None,
        )  # fmt: skip
        self.launcher = _launcher(s, kind_for(s, attention).kind)

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: FrostcMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise SetError("fused output quantization: frostc's plans write bf16/fp16 (leave it off)")
        if attn_metadata is None:  # vLLM's profiling run: no step, nothing to attend
            return output.fill_(0)
        quantized = self.launcher.set.scale_grain is not None
        self.launcher.run(
            query, key, value, kv_cache, attn_metadata.step, output,
            k_scale=layer._k_scale if quantized else None, v_scale=layer._v_scale if quantized else None,
            sinks=self._sinks.of(0, self.sinks),
        )  # fmt: skip
        return output


_LAUNCHERS: dict[tuple[str, str], LayerLauncher] = {}


def _launcher(s: VllmSet, kind: str) -> LayerLauncher:
    """One launcher per layer kind in a process: its layers share plans, workspaces, staging."""
    key = (s.path, kind)
    if key not in _LAUNCHERS:
        _LAUNCHERS[key] = LayerLauncher(s, s.plans.kind_info[kind])
    return _LAUNCHERS[key]


__all__ = ["ENV", "NAME", "FrostcBackend", "FrostcImpl", "FrostcMetadata", "FrostcMetadataBuilder"]
