"""V of an e4m3 packed plan, transposed and re-laid so that every sequence starts on a 16-key
boundary: what the FP8 attention kernel can load.

The FP8 kernel reads V transposed (keys innermost: 8-bit WGMMA operands are K-major), and TMA
takes a tile's innermost coordinate only on a 16-byte boundary, so a packed sequence, which may
start at any token, cannot be loaded where it lies (bench/NOTES.md, FP8 with variable lengths).
This kernel copies packed V (t, hkv, d), d innermost as a projection writes it, into the
workspace as Vᵀ (hkv, d, pitch): sequence b's keys start at `aligned_start(kv_token_b, b)`, past
the previous sequence's end with at most 15 keys between. The scheduling kernel writes each
sequence's tensor map over it (sequence_maps.py), its key extent ending the sequence. One pass
over V, launched after the scheduling kernel (it reads its table).

Grid (ceil(tokens / 32), hkv · d / 16 / WARPS): lane i of a warp takes token 32·x + i and one
16-byte piece of d of one KV head. It finds its sequence in the scheduling kernel's table (a
binary search over the clamped starts), loads its piece with one 16-byte load and stores its
16 bytes into 16 rows of Vᵀ, so that the warp's lanes write consecutive keys of each row.
Tokens outside every sequence are skipped; nothing outside V and the region is touched.

Tensors, in bytes (e4m3): V (t, hkv, d) strides (stride_t, stride_h, 1), whole 16-byte pieces;
Vᵀ (hkv, d, pitch) contiguous in the workspace.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_ptr
from cutlass.cute.typing import AddressSpace

from frostc.kernels.row_pieces import VECTOR_BYTES, load_piece
from frostc.kernels.sdpa_common import fake_ptr
from frostc.kernels.sequence_maps import aligned_start

WARPS = 4
TOKENS_PER_CTA = 32  # one per lane
INT_PARAMS = ("batch", "tokens")
I64_PARAMS = ("v.stride_t", "v.stride_h", "pitch")


@dataclass(frozen=True)
class VtPackVariant:
    """Compile key: the head dim (the pieces of a row)."""

    head_dim: int

    @property
    def name(self) -> str:
        return f"vt_pack.e4m3.d{self.head_dim}"

    @property
    def pieces(self) -> int:
        """16-byte pieces of one KV head's row."""
        return self.head_dim // VECTOR_BYTES

    @property
    def params(self) -> tuple[tuple[str, str], ...]:
        pointers = (("v", "ptr"), ("sequences", "ptr"), ("v_packed", "ptr"))
        return pointers + tuple((p, "i32") for p in INT_PARAMS) + tuple((p, "i64") for p in I64_PARAMS)

    @property
    def block(self) -> tuple[int, int, int]:
        return (32 * WARPS, 1, 1)

    @property
    def tiles(self) -> dict[str, int]:
        return {"warps": WARPS, "tokens_per_cta": TOKENS_PER_CTA, "vector_bytes": VECTOR_BYTES}

    @property
    def grid_rule(self) -> str:
        return f"(ceil(tokens / {TOKENS_PER_CTA}), hkv * {self.pieces} / {WARPS}, 1): a lane per token and piece"

    @property
    def ctas_per_sm(self) -> int:
        return 0

    def grid(self, tokens: int, heads_kv: int) -> tuple[int, int, int]:
        return (-(-tokens // TOKENS_PER_CTA), heads_kv * self.pieces // WARPS, 1)

    def kernel(self) -> "VtPack":
        return VtPack(self)

    def compile_args(self) -> tuple:
        table = make_ptr(cutlass.Int32, 0x10000, AddressSpace.gmem, assumed_align=16)
        pointers = (fake_ptr(cutlass.Uint8, 16), table, fake_ptr(cutlass.Uint8, 16))
        ints = tuple(cutlass.Int32(1) for _ in INT_PARAMS) + tuple(cutlass.Int64(16) for _ in I64_PARAMS)
        return (*pointers, ints, make_fake_stream())


class VtPack:
    def __init__(self, variant: VtPackVariant):
        self.v = variant
        self.smem_bytes = 0

    @cute.jit
    def __call__(self, v, sequences, v_packed, ints: tuple, stream):
        # the plan's launch gives the grid; only the cubin is kept from here
        self.kernel(v, sequences, v_packed, *ints).launch(
            grid=(1, 1, 1), block=[32 * WARPS, 1, 1], smem=0, stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        v: cute.Pointer,
        sequences: cute.Pointer,
        v_packed: cute.Pointer,
        batch: cutlass.Int32,
        tokens: cutlass.Int32,
        v_st: cutlass.Int64,
        v_sh: cutlass.Int64,
        pitch: cutlass.Int64,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        token = bx * TOKENS_PER_CTA + tidx % 32
        piece = by * WARPS + tidx // 32  # over (kv head, piece of d)
        head, d0 = piece // self.v.pieces, (piece % self.v.pieces) * VECTOR_BYTES
        if token < tokens:
            b = self._sequence_of(sequences, batch, token)
            row = cute.make_tensor(sequences + b * 4, cute.make_layout(4))
            kv_token, kv_len = row[2], row[3]
            if token >= kv_token and token < kv_token + kv_len:
                src = v + cute.assume(cutlass.Int64(token) * v_st + cutlass.Int64(head) * v_sh, divby=16)
                values = load_piece(src, d0, VECTOR_BYTES)
                key = cutlass.Int64(aligned_start(kv_token, b) + token - kv_token)
                first_row = cutlass.Int64(head * self.v.head_dim + d0)
                for i in cutlass.range_constexpr(VECTOR_BYTES):
                    out = cute.make_tensor(v_packed + (first_row + i) * pitch + key, cute.make_layout(1))
                    out[0] = values[i]

    @cute.jit
    def _sequence_of(self, sequences, batch, token):
        """The last sequence whose (clamped) first key is at most `token`: its owner, if any."""
        lo, hi = cutlass.Int32(0), batch - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            start = cute.make_tensor(sequences + mid * 4 + 2, cute.make_layout(1))[0]
            lo = cutlass.select_(start <= token, mid, lo)
            hi = cutlass.select_(start <= token, hi, mid - 1)
        return lo
