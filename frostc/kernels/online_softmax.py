"""The online softmax of one consumer's rows over key blocks (running max and sum, rescales
of O, the natural-log LSE), shared by the forward and decode kernels."""

from dataclasses import dataclass, field, replace

import cutlass
import cutlass.cute as cute

from frostc.kernels.sdpa_common import LN_2, LOG2_E, QUAD_LANES, lane_reduce

# the online softmax keeps a row's reference max until a block raises it by more than this
# (log2 units; probabilities stay <= 2**8 = 256, exact in bf16/fp16 range and fp32 sums)
RESCALE_LOG2 = 8.0

# a block's probabilities taken against the reference max without computing the block's max
# (`OnlineSoftmax.update_fast`) are kept when each thread's sum of them stays at most this, so
# no probability exceeds it (fp16's P and fp32 sums stay far from overflow)
FAST_SUM_LIMIT = 4096.0


@dataclass(frozen=True)
class ProbabilityLimits:
    """How large the unnormalized probabilities may grow, as the P operand's dtype allows:
    `rescale_log2` and `fast_sum_limit` as above, and `p_scale_log2`: every probability (and so
    every row sum) is scaled by 2**p_scale_log2, for free inside the exponential, so that an
    8-bit P uses its range (the normalization cancels it; the LSE takes it out)."""

    rescale_log2: float = RESCALE_LOG2
    fast_sum_limit: float = FAST_SUM_LIMIT
    p_scale_log2: float = 0.0


@dataclass(frozen=True)
class OnlineSoftmax:
    """The running row max and row sum of one consumer's rows, over key blocks (register
    tensors, updated in place)."""

    scale_log2: cutlass.Float32
    row_max: cute.Tensor
    row_sum: cute.Tensor
    correction: cute.Tensor
    block_sum: cute.Tensor  # `update_fast`'s sums, added by `accept_fast`
    limits: ProbabilityLimits = field(default_factory=ProbabilityLimits)
    # the lanes (xor offsets) that share a row: a quad for the MMAs' row-major accumulators
    lanes: tuple[int, ...] = QUAD_LANES

    @staticmethod
    def create(
        rows: int, scale_log2, limits: ProbabilityLimits | None = None, lanes: tuple[int, ...] = QUAD_LANES
    ) -> "OnlineSoftmax":
        make = lambda: cute.make_rmem_tensor(rows, cutlass.Float32)  # noqa: E731
        return OnlineSoftmax(scale_log2, make(), make(), make(), make(), limits or ProbabilityLimits(), lanes)

    def lane_max(self, value):
        return lane_reduce(value, cute.arch.fmax, self.lanes)

    def lane_sum(self, value):
        return lane_reduce(value, lambda a, b: a + b, self.lanes)

    def with_scale(self, scale_log2) -> "OnlineSoftmax":
        """The same state under another scale (a tile's own: e4m3 inputs' descales)."""
        return replace(self, scale_log2=scale_log2)

    def _shifted(self, shift):
        """The exponent's offset: the reference max's, less the probabilities' scale."""
        if cutlass.const_expr(self.limits.p_scale_log2 != 0.0):
            return shift - self.limits.p_scale_log2
        return shift

    def reset(self):
        self.row_max.fill(-cutlass.Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def update(self, s_mn):
        """Scores (rows, cols) -> unnormalized probabilities in place. Returns whether this
        warp's output so far must be scaled by `correction` (applied once the P V that writes
        it ended). A row's reference max moves only when some row of the warp grew by more
        than RESCALE_LOG2 (log2 units): below that the stale max is kept, probabilities reach
        at most 2**RESCALE_LOG2, and the warp skips the rescale of O (exact either way: the
        output and the row sum always share one reference max)."""
        rows = cute.size(self.row_max)
        block_max = cute.make_rmem_tensor(rows, cutlass.Float32)
        grow = cutlass.Boolean(False)
        for r in cutlass.range_constexpr(rows):
            block_max[r] = self.lane_max(s_mn[r, None].load().reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0))
            # a row that saw no key has max -inf: any finite score grows it (inf > threshold)
            grow = grow | ((block_max[r] - self.row_max[r]) * self.scale_log2 > self.limits.rescale_log2)
        moved = cute.arch.vote_any_sync(grow)
        for r in cutlass.range_constexpr(rows):
            row = s_mn[r, None].load()
            prev_max = self.row_max[r]
            new_max = cutlass.select_(moved, cute.arch.fmax(prev_max, block_max[r]), prev_max)
            # a row that has seen no key yet keeps max -inf: exponentiate against 0 instead
            safe_max = 0.0 if new_max == -cutlass.Float32.inf else new_max
            shift = safe_max * self.scale_log2
            probs = cute.math.exp2(row * self.scale_log2 - self._shifted(shift), fastmath=True)
            factor = cute.math.exp2(prev_max * self.scale_log2 - shift, fastmath=True)
            self.row_sum[r] = probs.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0) + self.row_sum[r] * factor
            self.correction[r] = factor
            self.row_max[r] = new_max
            s_mn[r, None] = probs
        return moved

    @cute.jit
    def update_fast(self, s_mn, emit_row):
        """Scores -> probabilities against each row's reference max as it stands, without this
        block's max (its reductions were a third of a step's instructions, all ahead of the
        exponentials on the consumer's critical path). Each row's probabilities go to
        `emit_row(r, probabilities)`; the scores stay as they are, so that a thread which needs
        the exact `update` instead can take it from them. Returns whether it does: a row
        without a reference yet (max -inf), or a sum of its probabilities above FAST_SUM_LIMIT
        (or NaN), so that some probability may have grown past it."""
        retry = cutlass.Boolean(False)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            reference = self.row_max[r]
            unset = reference == -cutlass.Float32.inf
            shift = cutlass.select_(unset, cutlass.Float32(0.0), reference * self.scale_log2)
            probs = cute.math.exp2(s_mn[r, None].load() * self.scale_log2 - self._shifted(shift), fastmath=True)
            total = probs.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
            retry = retry | unset | (total > self.limits.fast_sum_limit) | (total != total)
            self.block_sum[r] = total
            emit_row(r, probs)
        return retry

    @cute.jit
    def accept_fast(self):
        """Keep `update_fast`'s probabilities: the reference max did not move, no rescale."""
        for r in cutlass.range_constexpr(cute.size(self.row_sum)):
            self.row_sum[r] = self.row_sum[r] + self.block_sum[r]

    @cute.jit
    def rescale(self, o_mn):
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            o_mn[r, None] = o_mn[r, None].load() * self.correction[r]

    @cute.jit
    def normalize(self, o_mn, out_scale=None, sink=None):
        """O /= row sum (0 for a row that saw no key), times `out_scale` unless None; row_sum
        becomes the quad's total. `sink`: a logit (natural log, already scaled: gpt-oss's
        attention sinks), or a function of the row giving it, whose exponential joins the sum as
        a key with no value, taken against the row's reference max as the scores were (against
        0 for a row that saw no key)."""
        for r in cutlass.range_constexpr(cute.size(self.row_sum)):
            total = self.lane_sum(self.row_sum[r])
            if cutlass.const_expr(sink is not None):
                logit = sink(r) if cutlass.const_expr(callable(sink)) else sink
                reference = self.row_max[r]
                shift = cutlass.select_(
                    reference == -cutlass.Float32.inf, cutlass.Float32(0.0), reference * self.scale_log2
                )
                total = total + cute.math.exp2(logit * LOG2_E - self._shifted(shift), fastmath=True)
            self.row_sum[r] = total
            inv = 0.0 if total == 0.0 else cute.arch.rcp_approx(total)
            if cutlass.const_expr(out_scale is not None):
                inv = inv * out_scale
            o_mn[r, None] = o_mn[r, None].load() * inv

    def lse(self, r, sinks: bool = False):
        """Natural-log log-sum-exp of row r (after `normalize`); -inf for a row that saw no key,
        or with `sinks` (normalize took a sink) the sink's own logit there: its sum is the sink's
        term alone, taken against 0."""
        log2_sum = cute.math.log2(self.row_sum[r])
        if cutlass.const_expr(self.limits.p_scale_log2 != 0.0):
            log2_sum = log2_sum - self.limits.p_scale_log2
        reference = self.row_max[r] * self.scale_log2
        if cutlass.const_expr(sinks):
            reference = cutlass.select_(self.row_max[r] == -cutlass.Float32.inf, cutlass.Float32(0.0), reference)
        return (reference + log2_sum) * LN_2
