"""One Vᵀ tensor map per sequence: how an e4m3 variable-length plan reads V.

e4m3 V is read transposed (keys innermost: 8-bit WGMMA operands are K-major). The ragged tensor
maps of the 16-bit plans (ragged.py) bound a sequence with two extra modes whose strides are
multiples of a row; Vᵀ's rows (keys) are its innermost mode, one byte apart, and TMA wants
every stride but the innermost a multiple of 16 bytes, so that trick cannot end a Vᵀ sequence.
Without an end, the keys past a sequence's length would be read (a padded row's tail), and
0 · NaN in P V is NaN.

So the scheduling kernel writes one tensor map per sequence into the workspace: the plan's Vᵀ
map (its address patched by the runtime per call, as for every tensor map) with the key extent
set to the row where the sequence ends. The attention kernel's producer loads each sequence's
V blocks through its map, and the TMA unit zero-fills the keys past the end as it does past a
dense tensor's. The writes are the generic proxy and the loads the tensor-map proxy: the writer
fences with a release (`release_sequence_maps`), the reader with an acquire on the map's
address before its first load (`sequence_map`).

A map bounds a sequence's end only: its start is a coordinate, and TMA takes an innermost
coordinate only on a 16-byte boundary (else the load is an illegal instruction). A padded
sequence starts at b · (batch stride), whole 16-byte pieces by the build's checks. A packed one
may start at any token, so the packed form's V is first copied into the workspace by
vt_pack.py, sequence b's keys from `aligned_start`, and its maps point there."""

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.typing import AddressSpace
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.tensor_utils import TensorMapManager, TensorMapUpdateMode

MAP_BYTES = 128
MAP_WORDS = MAP_BYTES // 4
TEMPLATE_WORDS = 16  # what `copy_tensormap` writes: the maps' fields all lie in the first 64 bytes
# a tensor map's dims run innermost first: Vᵀ's keys, whose stride is 1
KEY_DIM = 0
# word 2, bit 21 of a tensor map: its out-of-bounds fetch window. A map whose extent is replaced
# on the device takes the always-safe mode (the DSL's own tensormap_replace does the same)
OOB_WINDOW_WORD = 2
OOB_WINDOW_CLEAR = ~(1 << 21) & 0xFFFFFFFF

_MAPS = TensorMapManager(TensorMapUpdateMode.GMEM, MAP_BYTES)


def aligned_start(kv_token, b):
    """Where packed sequence b's keys start in the re-laid Vᵀ: its first token rounded up to 16
    after 15 keys per earlier sequence, so that it starts past the previous one's end (whose
    own start moved by at most 15 · b + 15) and on a 16-byte boundary."""
    return (kv_token + 15 * b + 15) // 16 * 16


def packed_pitch(tokens: int, batch: int) -> int:
    """Keys per row of the re-laid Vᵀ: every aligned sequence ends by then; whole 128-byte lines,
    so that vt_pack's stores of a row's keys are whole lines."""
    return -(-(tokens + 15 * batch + 15) // 128) * 128


def _map_ptr(maps: cute.Pointer, index) -> cute.Pointer:
    """Map `index` of the workspace region `maps` (an int32 pointer, 128-byte aligned)."""
    return _MAPS.get_tensormap_ptr(maps + index * MAP_WORDS)


@dsl_user_op
def _replace(desc: cute.Pointer, field: str, value, *, loc=None, ip=None):
    """tensormap.replace of one field of the map at `desc` (the DSL's wrapper is experimental):
    `field` "global_dim" (the key dim's extent, an int32) or "global_address" (a pointer)."""
    if field == "global_dim":
        operand, text, constraint = cutlass.Int32(value), f"global_dim.global.b1024.b32 [$0], {KEY_DIM}, $1", "r"
    else:
        operand, text, constraint = value.toint(loc=loc, ip=ip), "global_address.global.b1024.b64 [$0], $1", "l"
    llvm.inline_asm(
        None,
        [desc.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip), operand.ir_value(loc=loc, ip=ip)],
        f"tensormap.replace.tile.{text};",
        f"l,{constraint},~{{memory}}",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


@cute.jit
def write_sequence_map(template: cute.CopyAtom, maps: cute.Pointer, index, key_end, base=None):
    """Map `index` := `template` with keys [0, key_end) (and, given `base`, that address): one
    thread writes it."""
    desc = _map_ptr(maps, index)
    words = cute.make_tensor(maps + index * MAP_WORDS, cute.make_layout(MAP_WORDS))
    cpasync.copy_tensormap(template, desc)  # the DSL copies the 64 bytes its maps use
    for i in cutlass.range_constexpr(TEMPLATE_WORDS, MAP_WORDS):
        words[i] = 0  # as in the plan's maps: the rest of the 128 bytes are zero
    _replace(desc, "global_dim", key_end)
    if cutlass.const_expr(base is not None):
        _replace(desc, "global_address", base)
    words[OOB_WINDOW_WORD] = words[OOB_WINDOW_WORD] & cutlass.Int32(OOB_WINDOW_CLEAR - (1 << 32))


def release_sequence_maps():
    """After a thread's last map write: makes the maps visible to later tensor-map reads."""
    cpasync.fence_tma_desc_release()


@cute.jit
def sequence_map(maps: cute.Pointer, index) -> cute.Pointer:
    """Map `index`, acquired for the TMA loads that follow (by the thread that issues them)."""
    desc = _map_ptr(maps, index)
    cpasync.fence_tma_desc_acquire(desc)
    return _MAPS.get_tensormap_ptr(desc, AddressSpace.generic)  # the form TMA copies take
