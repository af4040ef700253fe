"""The GPUs frostc builds for: one record per target, the facts every rule reads (which kernels
fit in shared memory, how work is cut across the SMs). A new target is a record here and the
measurements behind its rules."""

from __future__ import annotations

from dataclasses import dataclass

from frost_runtime.schema import MAX_SMEM_BYTES

KIB = 1024


@dataclass(frozen=True)
class Target:
    arch: str  # what the DSL compiles for, and the plan's header says
    sms: int  # streaming multiprocessors: the persistent grids' and the splits' unit of work
    smem_per_cta: int  # bytes of shared memory one CTA may opt in to
    smem_per_sm: int  # bytes of shared memory per SM, shared by its resident CTAs
    smem_reserved_per_cta: int  # bytes of each resident CTA's that the hardware keeps

    def smem_for(self, ctas_per_sm: int) -> int:
        """The most shared memory each of `ctas_per_sm` resident CTAs may take."""
        return min(self.smem_per_cta, self.smem_per_sm // ctas_per_sm - self.smem_reserved_per_cta)


# H100 SXM and H200: 132 SMs, 228 KiB of shared memory per SM, 227 KiB opt-in per CTA
SM90A = Target("sm_90a", sms=132, smem_per_cta=MAX_SMEM_BYTES, smem_per_sm=228 * KIB, smem_reserved_per_cta=KIB)

TARGETS: dict[str, Target] = {t.arch: t for t in (SM90A,)}
DEFAULT_TARGET = SM90A.arch
