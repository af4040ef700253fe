"""The sequences a forward launch attends over: the fixed extents (`Shape`), each sequence's
lengths and where its rows start (`Sequence`), read from the plan's shapes or from the
scheduling kernel's table of variable lengths (`Sequences`).

Like every device helper of the kernels, these are frozen dataclasses: the DSL passes
read-only frozen dataclasses into its loops and branches as they are, where it would try to
carry any other object as a value."""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute


@dataclass(frozen=True)
class Sequence:
    """One sequence's lengths and where its rows start: the ragged row of its first token in
    Q (and K, V) and the element offset of its first row in O (and LSE)."""

    q_len: cutlass.Int32
    kv_len: cutlass.Int32
    q_start: cutlass.Int32  # ragged row (varlen); unused for fixed shapes
    k_start: cutlass.Int32
    v_start: cutlass.Int32
    o_offset: cutlass.Int64  # elements
    lse_offset: cutlass.Int64


@dataclass(frozen=True)
class Sequences:
    """Sequence b's lengths: the plan's (fixed shapes) or the scheduling kernel's table."""

    varlen: bool
    table: cute.Pointer  # i32: (q_token, q_len, kv_token, kv_len) per sequence
    shape: "Shape"
    rows_per_batch: tuple  # (q, k, v): ragged rows per padded sequence
    o_strides: tuple  # (b, s)
    lse_strides: tuple

    def get(self, batch) -> Sequence:
        return self.make(batch, self.row(batch))

    def row(self, batch) -> tuple:
        """(q_token, q_len, kv_token, kv_len) of sequence b: loaded from the table (varlen), or
        the plan's fixed lengths."""
        if cutlass.const_expr(self.varlen):
            row = cute.make_tensor(self.table + batch * 4, cute.make_layout(4))
            return row[0], row[1], row[2], row[3]
        return cutlass.Int32(0), self.shape.seq_q, cutlass.Int32(0), self.shape.seq_kv

    def make(self, batch, row: tuple) -> Sequence:
        q_token, q_len, kv_token, kv_len = row
        q_rows, k_rows, v_rows = self.rows_per_batch
        return Sequence(
            q_len=q_len,
            kv_len=kv_len,
            q_start=batch * q_rows + q_token,
            k_start=batch * k_rows + kv_token,
            v_start=batch * v_rows + kv_token,
            o_offset=cutlass.Int64(batch) * self.o_strides[0] + cutlass.Int64(q_token) * self.o_strides[1],
            lse_offset=cutlass.Int64(batch) * self.lse_strides[0] + cutlass.Int64(q_token) * self.lse_strides[1],
        )


@dataclass(frozen=True)
class Shape:
    """The problem's fixed extents, as the kernel sees them."""

    m_blocks: cutlass.Int32  # query blocks per (batch, head), fixed shapes
    heads_q: cutlass.Int32
    batch: cutlass.Int32
    seq_q: cutlass.Int32
    seq_kv: cutlass.Int32
    group: cutlass.Int32  # query heads per K/V head


def packed_span(cu_seqlens, b, tokens, longest):
    """(first token, length) of packed sequence b, from its prefix sums `cu_seqlens` (int32,
    device): clamped so that the sequence lies within the buffer's `tokens` and is at most
    `longest` long, whatever the caller wrote (the scheduling kernel's rule too)."""
    cu = cute.make_tensor(cu_seqlens + b, cute.make_layout(2))
    start = cutlass.min(cutlass.max(cu[0], 0), tokens)
    end = cutlass.min(cutlass.max(cu[1], start), tokens)
    return start, cutlass.min(end - start, longest)
