"""A pipeline ring's stage and phase for the n-th use (every TMA ring of the kernels), and a
ring's own per-stage barriers."""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute


@dataclass(frozen=True)
class Ring:
    """Stage and phase of the n-th use of a `stages`-deep pipeline."""

    stages: int

    def at(self, position):
        """(stage, phase) of a non-negative position. A power-of-two depth takes two bit
        operations each; signed % and // cost a dozen uniform instructions per use, in the
        consumers' critical path (bench/NOTES.md v18)."""
        if cutlass.const_expr(self.stages & (self.stages - 1) == 0):
            shift = self.stages.bit_length() - 1
            return position & (self.stages - 1), (position >> shift) & 1
        return position % self.stages, position // self.stages % 2


@dataclass(frozen=True)
class StageBarriers:
    """One mbarrier per ring stage in shared memory, completed by `count` arrivals (a phase per
    use of the stage: wait with the phase `Ring.at` gives)."""

    barriers: cute.Pointer  # Int64 x stages
    stages: int

    def init(self, count: int):
        """By one thread, before the CTA's barrier-init fence."""
        for stage in range(self.stages):  # unrolled at trace time
            cute.arch.mbarrier_init(self.barriers + stage, count)

    def arrive(self, stage):
        cute.arch.mbarrier_arrive(self.barriers + stage)

    def wait(self, stage, phase):
        cute.arch.mbarrier_wait(self.barriers + stage, phase)
