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

Grid (ceil(pitch / KEYS), hkv): a CTA writes KEYS consecutive keys of every d row of one KV
head, in destination order. The CTA first copies the sequences' aligned starts (from the
scheduling kernel's table) into shared memory. Each thread takes one key and finds its source
token (a binary search over those starts; keys in the gaps between sequences take any token: no
map's extent reaches them), kept in shared memory. Then the keys' rows of d bytes are copied
into shared memory, 8 lanes per row (a warp reads 4 whole rows an instruction). Last, each
thread gathers 16 keys × 4 d bytes (one 4-byte shared load per key), transposes them in
registers and stores 4 rows' 16-byte pieces of Vᵀ, 8 lanes per row (a warp writes 4 whole
128-byte lines an instruction). Every global access is whole lines: a lane per token and a lane
per d row (earlier versions) left half of every sector unused and ran at 0.7 TB/s (NOTES).

Shared rows are `ROW_WORDS` 4-byte words apart, and each group of 16 rows 4 words further: the
gather's 8 lanes of one d word read rows 16 apart, which then fall in distinct banks.

Tensors, in bytes (e4m3): V (t, hkv, d) strides (stride_t, stride_h, 1), whole 16-byte pieces;
Vᵀ (hkv, d, pitch) contiguous in the workspace, pitch a multiple of 128.

The `batched` variant serves the dense and padded forms when V is given with d innermost (as a
projection writes it, "bshd" or "bhsd"): V (b, hkv, s, d) becomes Vᵀ (b, hkv, d, pitch), pitch =
s rounded up to 128 keys, the layout those forms read ("bhds"). Grid (ceil(pitch / KEYS), hkv, b);
key k of sequence b is row k of V[b] (keys past s copy row s - 1: no map's extent reaches them).
"""

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute

from frostc.kernels.interface import I32, I64, Group, Kernel, Ptr, Variant, abi, pointer, when
from frostc.kernels.row_pieces import VECTOR_BYTES
from frostc.kernels.sdpa_common import P_KEY_ORDER
from frostc.kernels.sequence_maps import aligned_start

THREADS = 128
KEYS = THREADS  # destination keys per CTA: one per thread while their tokens are found
ROW_PAD = 16  # bytes after each shared row
GROUP = 16  # keys per 16-byte store
GROUPS = KEYS // GROUP  # lanes that store one d row's KEYS keys together (a 128-byte line)
LANES_PER_ROW = 8  # lanes that load one token's row together (8 pieces of 16 bytes at d=128)
# sequences whose aligned starts a CTA first copies into shared memory, so that each thread's
# binary search reads shared memory (a search through global memory is a chain of dependent
# loads, the kernel's critical path); sequences past it are searched in the table itself
SHARED_STARTS = 1024


def relaid_pitch(seq_kv: int) -> int:
    """Keys per Vᵀ row of the batched variant's output: whole 128-byte lines."""
    return -(-seq_kv // KEYS) * KEYS


def _packed(variant) -> bool:
    return not variant.batched


def _batched(variant) -> bool:
    return variant.batched


@dataclass(frozen=True)
class PackedV(Group):
    """Packed V (t, h, d): the sequences' count and tokens, and V's strides."""

    batch: I32
    tokens: I32
    stride_t: I64 = abi("v.stride_t")
    stride_h: I64 = abi("v.stride_h")


@dataclass(frozen=True)
class BatchedV(Group):
    """V (b, h, s, d) of the dense or padded form: its rows and strides."""

    seq_kv: I32
    stride_b: I64 = abi("v.stride_b")
    stride_s: I64 = abi("v.stride_s")
    stride_h: I64 = abi("v.stride_h")


@dataclass(frozen=True)
class VtPackArgs:
    v: Ptr = pointer("uint8")
    sequences: Ptr | None = when(_packed, dtype="int32")  # the scheduling kernel's table
    v_packed: Ptr = pointer("uint32")  # Vᵀ in the workspace
    packed: PackedV | None = when(_packed)
    batched: BatchedV | None = when(_batched)
    pitch: I64  # keys per Vᵀ row


@dataclass(frozen=True)
class VtPackVariant(Variant):
    """Compile key: the head dim (the bytes of a row); `batched`: V (b, h, s, d) of the dense or
    padded form, else packed V (t, h, d) with the scheduling kernel's table."""

    ARGS: ClassVar[type] = VtPackArgs
    THREADS: ClassVar[int] = THREADS
    head_dim: int
    batched: bool = False
    # each 16 keys written in the order the attention's P leaves its accumulator in (2c, 2c + 1,
    # 2c + 8, 2c + 9 at word c: `sdpa_common.P_KEY_ORDER`), so that it packs P as it lies;
    # keys outside every sequence are written as zeros (its maps then end on 16-key groups and
    # read them: P = 0 there, and 0 · NaN would be NaN)
    p_order: bool = False

    @property
    def name(self) -> str:
        name = f"vt_pack.e4m3.d{self.head_dim}" + (".batched" if self.batched else "")
        return name + (".p_order" if self.p_order else "")

    @property
    def tiles(self) -> dict[str, int]:
        return {"keys_per_cta": KEYS, "threads": THREADS, "row_pad": ROW_PAD, "lanes_per_row": LANES_PER_ROW}

    @property
    def grid_rule(self) -> str:
        batches = "b" if self.batched else "1"
        return f"(ceil(pitch / {KEYS}), hkv, {batches}): {KEYS} destination keys of one KV head per CTA"

    def grid(self, pitch: int, heads_kv: int, batch: int = 1) -> tuple[int, int, int]:
        return (-(-pitch // KEYS), heads_kv, batch if self.batched else 1)

    def kernel(self) -> "VtPack":
        return VtPack(self)


class VtPack(Kernel):
    def __init__(self, variant: VtPackVariant):
        super().__init__(variant)
        self.v = variant
        self.d = variant.head_dim
        self.row_words = (variant.head_dim + ROW_PAD) // 4

    def _row_word(self, row):
        """The shared word where key row `row` starts: rows ROW_WORDS apart, each group of 16 rows
        4 words further, so that 8 rows 16 apart fall in 8 distinct banks (of a word's 4)."""
        return row * self.row_words + (row // GROUP) * 4

    def prepare(self) -> None:
        row_storage = (KEYS * self.row_words + GROUPS * 4) * 4
        # the batched variant finds its tokens without the sequences' starts
        start_words = 1 if self.v.batched else SHARED_STARTS

        @cute.struct
        class SharedStorage:
            rows: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, row_storage], 16]
            starts: cute.struct.MemRange[cutlass.Int32, start_words]
            tokens: cute.struct.MemRange[cutlass.Int32, KEYS]  # each key's source token

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()

    @cute.kernel
    def kernel(self, args: VtPackArgs):
        if cutlass.const_expr(self.v.batched):
            self._batched(args.v, args.v_packed, args.batched, args.pitch)
        else:
            self._packed(args.v, args.sequences, args.v_packed, args.packed, args.pitch)

    @cute.jit
    def _packed(self, v, sequences, v_packed, packed: PackedV, pitch):
        batch, tokens_total, v_st, v_sh = packed.batch, packed.tokens, packed.stride_t, packed.stride_h
        tidx, _, _ = cute.arch.thread_idx()
        block, head, _ = cute.arch.block_idx()
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        rows = storage.rows.data_ptr()
        first_key = block * KEYS

        # 0. the sequences' aligned starts, all threads at once
        starts = storage.starts.get_tensor(cute.make_layout(SHARED_STARTS))
        for b in range(tidx, cutlass.min(batch, SHARED_STARTS), THREADS):
            starts[b] = aligned_start(cute.make_tensor(sequences + b * 4 + 2, cute.make_layout(1))[0], b)
        cute.arch.sync_threads()

        # 1. this thread's key: its source token
        token = self._source_token(sequences, starts, batch, first_key + tidx)
        tokens = storage.tokens.get_tensor(cute.make_layout(KEYS))
        if cutlass.const_expr(self.v.p_order):
            tokens[tidx] = cutlass.min(token, tokens_total - 1)  # a gap's key: -1, written as zeros
        else:
            tokens[tidx] = cutlass.max(cutlass.min(token, tokens_total - 1), 0)  # a gap's key: any token will do
        cute.arch.sync_threads()

        self._transpose(tidx, rows, tokens, v + cute.assume(cutlass.Int64(head) * v_sh, divby=16), v_st,
                        v_packed, cutlass.Int64(head * self.d), pitch, first_key)  # fmt: skip

    @cute.jit
    def _batched(self, v, v_packed, batched: BatchedV, pitch):
        seq_kv, v_sb, v_ss, v_sh = batched.seq_kv, batched.stride_b, batched.stride_s, batched.stride_h
        tidx, _, _ = cute.arch.thread_idx()
        block, head, b = cute.arch.block_idx()
        _, heads_kv, _ = cute.arch.grid_dim()
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        first_key = block * KEYS
        # key k is V[b]'s row k; keys past the sequence copy its last row (no map reaches them),
        # or with `p_order` are zeros (-1)
        tokens = storage.tokens.get_tensor(cute.make_layout(KEYS))
        if cutlass.const_expr(self.v.p_order):
            tokens[tidx] = cutlass.select_(first_key + tidx < seq_kv, first_key + tidx, -1)
        else:
            tokens[tidx] = cutlass.min(first_key + tidx, seq_kv - 1)
        cute.arch.sync_threads()
        src = v + cute.assume(cutlass.Int64(b) * v_sb + cutlass.Int64(head) * v_sh, divby=16)
        first_row = (cutlass.Int64(b) * heads_kv + head) * self.d
        self._transpose(tidx, storage.rows.data_ptr(), tokens, src, v_ss, v_packed, first_row, pitch, first_key)

    @cute.jit
    def _transpose(self, tidx, rows, tokens, src_rows, v_st, v_packed, first_row, pitch, first_key):
        """KEYS keys' rows of d bytes (`tokens`: each key's source row, `v_st` bytes apart from
        `src_rows`) into Vᵀ's d rows `first_row` onward (`pitch` keys each), from `first_key`."""
        # 2. the keys' rows of d bytes into shared memory, LANES_PER_ROW lanes a row: every load
        # first (each lane's pieces of its rows), then the shared stores
        pieces = self.d // VECTOR_BYTES
        lanes = min(LANES_PER_ROW, pieces)  # d=64: a row is 4 pieces
        rows_per_pass, pieces_per_lane = THREADS // lanes, pieces // lanes
        loaded = []
        for k in cutlass.range_constexpr(KEYS * pieces // THREADS):
            row = k // pieces_per_lane * rows_per_pass + tidx // lanes
            piece = (k % pieces_per_lane) * lanes + tidx % lanes
            src = src_rows + cute.assume(cutlass.Int64(cutlass.max(tokens[row], 0)) * v_st, divby=16)
            at = src + cute.assume(piece * VECTOR_BYTES, divby=VECTOR_BYTES)  # one 16-byte load
            if cutlass.const_expr(self.v.p_order):  # as 4 words, to zero a row outside every sequence
                at = cute.recast_ptr(at, dtype=cutlass.Uint32)
            loaded.append(
                (row, piece, cute.make_tensor(at, cute.make_layout(VECTOR_BYTES * 8 // at.dtype.width)).load())
            )
        for row, piece, value in loaded:
            shared = rows + cute.assume((self._row_word(row) + piece * (VECTOR_BYTES // 4)) * 4, divby=16)
            if cutlass.const_expr(self.v.p_order):  # a token of -1: zeros
                keep = cutlass.select_(tokens[row] < 0, cutlass.Uint32(0), cutlass.Uint32(0xFFFFFFFF))
                cute.make_tensor(cute.recast_ptr(shared, dtype=cutlass.Uint32), cute.make_layout(4)).store(value & keep)
            else:
                cute.make_tensor(shared, cute.make_layout(VECTOR_BYTES)).store(value)
        cute.arch.sync_threads()

        # 3. 16 keys x 4 d bytes a thread, transposed into 4 rows' 16-byte pieces; the GROUPS
        # lanes of one d word store its rows' keys together (whole lines)
        words_layout = cute.make_layout(KEYS * self.row_words + GROUPS * 4)
        words = cute.make_tensor(cute.recast_ptr(rows, dtype=cutlass.Uint32), words_layout)
        quads = self.d // 4
        for k in cutlass.range_constexpr(quads * GROUPS // THREADS):
            group = tidx % GROUPS
            quad = k * (THREADS // GROUPS) + tidx // GROUPS
            key = first_key + group * GROUP
            if key + GROUP <= pitch:
                gathered = []
                for j in cutlass.range_constexpr(GROUP):
                    gathered.append(words[self._row_word(group * GROUP + j) + quad])
                order = P_KEY_ORDER if cutlass.const_expr(self.v.p_order) else tuple(range(GROUP))
                for byte in cutlass.range_constexpr(4):
                    out = cute.make_rmem_tensor((4,), cutlass.Uint32)
                    for q in cutlass.range_constexpr(4):
                        out[q] = _bytes_at([gathered[order[4 * q + j]] for j in range(4)], byte)
                    d_row = first_row + (quad * 4 + byte)
                    target = v_packed + cute.assume((d_row * pitch + key) // 4, divby=4)
                    cute.make_tensor(target, cute.make_layout(4)).store(out.load())

    @cute.jit
    def _source_token(self, sequences, starts, batch, key):
        """The token whose V goes to destination key `key`, or -1 in a gap: the owner is the last
        sequence whose aligned start is at most `key` (the starts grow with b)."""
        lo, hi = cutlass.Int32(0), batch - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            start = cutlass.Int32(0)
            if mid < SHARED_STARTS:
                start = starts[mid]
            else:
                start = aligned_start(cute.make_tensor(sequences + mid * 4 + 2, cute.make_layout(1))[0], mid)
            lo = cutlass.select_(start <= key, mid, lo)
            hi = cutlass.select_(start <= key, hi, mid - 1)
        row = cute.make_tensor(sequences + lo * 4, cute.make_layout(4))
        kv_token, kv_len = row[2], row[3]
        start = aligned_start(kv_token, lo)
        inside = (key >= start) & (key < start + kv_len)
        return cutlass.select_(inside, kv_token + key - start, -1)


def _bytes_at(quad: list, byte: int):
    """Byte `byte` of each of four words, packed in order into one word."""
    out = cutlass.Uint32(0)
    for j in range(4):
        out = out | (((quad[j] >> (8 * byte)) & 0xFF) << (8 * j))
    return out
