"""The merge of a split-KV paged attention's partial results, done inside the attention kernel
by the last CTA of each (sequence, KV head, row block) to finish: no launch of its own.

Split s of a row holds O_s (normalized over its keys, fp32) and LSE_s (natural log) in the
workspace. With m = max_s LSE_s and w_s = exp(LSE_s - m):  O = Σ w_s O_s / Σ w_s,
LSE = m + log Σ w_s. Only the splits that hold keys of the sequence (`active_splits`) write
partials and take part; a sequence without keys has split 0 alone, whose partial is
(O = 0, LSE = -inf): its rows get O = 0 and LSE = -inf.

Who merges: each taking part CTA, once its partial rows are stored, adds one to its row
block's counter in the workspace (a zeroed region: the runtime zeroes it before the first
launch) with acquire-release semantics at GPU scope, after a CTA barrier (so the CTA's stores
are ordered before the release); the CTA that brings the count to the number of taking part
splits saw every other partial (its acquire) and merges, and writes the counter back to zero
(nothing else touches it in this launch), so the next launch finds it zero. A separate combine
launch cost 3.5-4.4 µs of a 160 µs decode plan (bench/NOTES.md, "decode v9").
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from frostc.kernels.barriers import Barrier
from frostc.kernels.sdpa_common import LN_2, LOG2_E, any_at_barrier

VECTOR = 4  # fp32 elements of a partial row per thread and load (16 bytes)


def active_splits(kv_len, origin, chunk, splits):
    """The splits that hold keys of a sequence whose keys [origin, kv_len) are cut in chunks."""
    return cutlass.min(cutlass.max(kv_len - origin + chunk - 1, 0) // chunk, splits)


@dataclass(frozen=True)
class SplitMerge:
    """The merge of one row block's splits, by a CTA of `threads` threads (all of them call)."""

    head_dim: int
    threads: int
    out_dtype: type  # O's DSL dtype
    has_lse: bool

    @cute.jit
    def is_last(self, counter, arrivals, tidx):
        """Count this CTA's arrival (its partial rows are stored by these threads, numbered
        from 0); whether it is the last of `arrivals`, for every thread. The last resets the
        counter."""
        # the threads' partial stores before thread 0's release
        pipeline.NamedBarrier(barrier_id=Barrier.SPLIT_MERGE, num_threads=self.threads).arrive_and_wait()
        last = cutlass.Boolean(False)
        if tidx == 0:
            arrived = cute.arch.atomic_add(counter, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            last = arrived == arrivals - 1
            if last:
                cute.make_tensor(counter, cute.make_layout(1))[0] = cutlass.Int32(0)
        # thread 0's acquire, then this barrier: the other threads' loads see every partial
        return any_at_barrier(last, Barrier.SPLIT_MERGE, self.threads)

    @cute.jit
    def merge(self, partials, first_row, block_rows, rows, out, tidx):
        """Rows [first_row, first_row + block_rows) of the (sequence, KV head) whose splits'
        partials start at index `partials[2]` (split s, row r at (base + s) * rows + r): O (and
        LSE) through `out` = (o, o strides, lse, lse strides, batch, head_kv, group). Each
        thread merges a 4-float piece of a row over the splits, online (one pass)."""
        o_partial, lse_partial, base, taking_part = partials
        d = self.head_dim
        lanes = d // VECTOR
        per_pass = self.threads // lanes
        lane, slot = tidx % lanes, tidx // lanes
        for first in range(0, block_rows, per_pass):
            local = first + slot
            if slot < per_pass and local < block_rows:
                row = first_row + local
                top = -cutlass.Float32.inf
                total = cutlass.Float32(0.0)
                acc = cute.make_rmem_tensor(VECTOR, cutlass.Float32)
                acc.fill(0.0)
                for s in cutlass.range(0, taking_part, 1, unroll=2):
                    index = (base + s) * rows + row
                    lse = cute.make_tensor(lse_partial + index, cute.make_layout(1))[0]
                    piece = cute.make_tensor(o_partial + index * d + lane * VECTOR, cute.make_layout(VECTOR)).load()
                    new_top = cute.arch.fmax(top, lse)
                    shift = cutlass.select_(new_top == -cutlass.Float32.inf, cutlass.Float32(0.0), new_top)
                    kept = cute.math.exp2((top - shift) * LOG2_E, fastmath=True)  # 0 while top is -inf
                    weight = cute.math.exp2((lse - shift) * LOG2_E, fastmath=True)
                    acc.store(acc.load() * kept + piece * weight)
                    total = total * kept + weight
                    top = new_top
                self._store_row(out, row, acc, top, total, lane)

    @cute.jit
    def _store_row(self, out, row, acc, top, total, lane):
        o, o_sb, o_sh, o_ss, lse, lse_sb, lse_sh, lse_ss, batch, head_kv, group = out
        token, head = row // group, head_kv * group + row % group
        inv = cutlass.select_(total > 0.0, cute.arch.rcp_approx(total), cutlass.Float32(0.0))
        at = cutlass.Int64(batch) * o_sb + cutlass.Int64(head) * o_sh + cutlass.Int64(token) * o_ss
        dst = cute.make_tensor(o + at + lane * VECTOR, cute.make_layout(VECTOR))
        dst.store((acc.load() * inv).to(self.out_dtype))
        if cutlass.const_expr(self.has_lse):
            if lane == 0:
                at = cutlass.Int64(batch) * lse_sb + cutlass.Int64(head) * lse_sh + cutlass.Int64(token) * lse_ss
                value = -cutlass.Float32.inf
                if total > 0.0:
                    value = top + cute.math.log2(total) * LN_2
                cute.make_tensor(lse + at, cute.make_layout(1))[0] = value
