"""A pipeline ring's stage and phase for the n-th use: every TMA ring of the kernels."""

from dataclasses import dataclass

import cutlass


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
