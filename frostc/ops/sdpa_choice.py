"""How the sdpa op's kernels cut the work, chosen once per node from its shapes and the target
(frostc.target): the forward kernel's walk over the tiles, its consumer warpgroups and where it
reads V (`choose_forward`); the paged attention's rows per CTA and key splits (`choose_decode`).
Every threshold here was measured; bench/NOTES.md names the runs. The tiles each choice implies
are the kernels' own tables (`tiles_for_head_dim`, `decode_tiles`): what fits in shared memory."""

from __future__ import annotations

from dataclasses import dataclass

from frost_runtime.dtypes import DTYPES

from frostc.kernels.sdpa_decode_paged import FEW_ROWS, DecodeTiles, decode_tiles
from frostc.kernels.sdpa_fwd_wgmma import THREE_CONSUMER_HEAD_DIMS, WgmmaTiles, tiles_for_head_dim
from frostc.ops.sdpa_node import Sdpa
from frostc.target import Target

# ------------------------------------------------------------------------------ the forward kernel

PER_TILE_MIN_KEY_BLOCKS = 64  # causal tiles of 32 key blocks on average and more (bench/NOTES.md v16)
PAIRED_MAX_QUERY_BLOCKS = 12  # causal heads of at most this many tiles walk in pairs (NOTES v19)
# e4m3 d=128 dense and packed: three consumer warpgroups (192-row tiles) where rows see this many
# keys or more; measured per tile +5-7 % from 8k keys on, -2 to -6 % at 2k-4k, packed mixes up to
# 8-16k +4 to +8 % (bench/NOTES.md, FP8 v12)
THREE_CONSUMERS_MIN_KEYS = 8192
THREE_CONSUMERS_TILE_GAIN = 1.065  # a 192-row tile's rows per second over two 128-row tiles'


@dataclass(frozen=True)
class ForwardConfig:
    """The forward kernel's configuration for one node."""

    walk: str  # how the CTAs take the tiles (sdpa_fwd_wgmma.WALKS)
    three_consumers: bool  # e4m3 d=128: 192-row tiles of three consumer warpgroups
    v_source: str  # "given" (read as the caller gave it), "relaid" or "repacked" (by vt_pack, first)
    v_layout: str  # how V then lies where the kernel reads it (sdpa_fwd_wgmma.V_LAYOUTS)
    tiles: WgmmaTiles


def choose_forward(node: Sdpa, v_d_innermost: bool, target: Target) -> ForwardConfig:
    """The forward kernel's configuration for a dense, padded or packed node (`v_d_innermost`:
    V given with its head dim innermost, as q and k).

    Walk (dense causal heads without a left window; everything else walks statically, variable
    lengths the scheduling kernel's list): tiles of many key blocks run one CTA each
    (`per_tile`), measured faster from PER_TILE_MIN_KEY_BLOCKS on; a head of few tiles is
    walked in pairs of tiles (`paired`), measured faster up to PAIRED_MAX_QUERY_BLOCKS (neutral
    at 16, slower from 22 query blocks on); the heads between take their tiles from a counter
    (`dynamic`: longest first within L2 sections, balanced at run time; NOTES v20).

    V: e4m3 is read keys innermost; packed V is always re-laid from 16-key boundaries
    (`repacked`), dense and padded V given with d innermost is re-laid (`relaid`), each 16 keys
    in P's register order for the dense form (a padded V's padding rows are the caller's: there
    the order stays)."""
    flags = node.mask.flags
    three = _three_consumers(node, target)
    tiles = tiles_for_head_dim(node.head_dim, flags.left, node.fp8, three, node.value_dim_apart)
    walk = "static"
    if node.form == "dense" and flags.right and not flags.left:
        if node.seq_kv >= PER_TILE_MIN_KEY_BLOCKS * tiles.block_n:
            walk = "per_tile"
        elif -(-node.seq_q // tiles.block_m) <= PAIRED_MAX_QUERY_BLOCKS:
            walk = "paired"
        else:
            walk = "dynamic"
    v_source, v_layout = "given", "given"
    if node.fp8 and node.form == "packed":
        v_source, v_layout = "repacked", "packed"
    elif node.fp8 and v_d_innermost:
        v_source, v_layout = "relaid", "p_order" if node.form == "dense" else "given"
    return ForwardConfig(walk, three, v_source, v_layout, tiles)


def _three_consumers(node: Sdpa, target: Target) -> bool:
    """Whether an e4m3 d=128 node's tiles take three consumer warpgroups (192 rows): a third warp
    on each SM sub-partition hides the softmax step's latency, on long rows only (packed: a key
    capacity that long). Dense causal tiles run one CTA each there and packed ones come from the
    scheduling kernel's list, so any count of them balances; dense tiles of equal cost (no right
    bound) run in turns of one per SM, and 192-row tiles are taken only where their turns, each a
    tile's time, still end sooner than the 128-row tiles'. The padded form is not measured: two
    consumers."""
    flags = node.mask.flags
    if not (node.fp8 and node.form in ("dense", "packed") and node.head_dim in THREE_CONSUMER_HEAD_DIMS):
        return False
    if flags.left or node.seq_kv < THREE_CONSUMERS_MIN_KEYS:
        return False
    if flags.right or node.form == "packed":
        return True
    two, three = (tiles_for_head_dim(node.head_dim, False, True, wide).block_m for wide in (False, True))

    def turns(rows: int) -> int:  # of the persistent CTAs, one tile each a turn
        tiles = -(-node.seq_q // rows) * node.batch * node.heads_q
        return -(-tiles // target.sms)

    return turns(three) * three / THREE_CONSUMERS_TILE_GAIN < turns(two) * two


def tile_capacity(node: Sdpa, block_m: int) -> int:
    """The attention launch's grid x: its tiles (fixed shapes), or the most any lengths within
    the capacities make (variable lengths)."""
    if node.form == "dense":
        return -(-node.seq_q // block_m) * node.heads_q * node.batch
    return unit_capacity(node, block_m) * node.heads_q


def unit_capacity(node: Sdpa, block_m: int) -> int:
    """The most (sequence, query block) units any lengths within the capacities make."""
    per_sequence = node.batch * -(-node.seq_q // block_m)
    if node.form in ("packed", "mixed"):  # sum of ceil(len / m) <= (tokens + batch * (m - 1)) / m
        return min(per_sequence, (node.tokens_q + node.batch * (block_m - 1)) // block_m)
    return per_sequence


# ------------------------------------------------------------------------------ the paged attention

WAVES = 5  # CTAs per resident slot the splits aim for at full capacity: lengths vary, the tail stays short
UNSPLIT_WAVES = 3  # as many (sequence, KV head) CTAs as this many waves: no split needed
# keys per split at least: long chunks (2048 keys), or short ones (512) when
# long ones leave more than half the resident slots idle (a short cache at a small batch:
# Llama-3-8B at batch 8 and 2k tokens ran 64 CTAs on 132 SMs, 52 % of the read ceiling; 4 splits:
# 0.71 ms from 0.92). Not otherwise: at batch 32 (256 CTAs) 4 splits took 2.30 ms against 2.16
# unsplit, and a 128k-token sequence split in 165 short chunks instead of 64 long ones ran 7 %
# slower (bench/NOTES.md, "decode in a model"; decode v1 measured 2, 3, 5 and 8 waves)
MIN_CHUNK_KEYS, SHORT_CHUNK_KEYS = 2048, 512
# an adaptive split (the mixed form with its chunks apart: a bucket serves any mix of lengths, so
# each sequence is cut on the device, `PagedDecodeVariant.adaptive`): at least this many keys a
# split (a shorter sequence is one split, written directly: no partials, nothing to merge), and
# as many splits as keep the grid within ADAPTIVE_CTAS (its CTAs past a sequence's keys exit at
# once, but a 100k-CTA grid still cost ~60 us: bench/NOTES.md, mixed v2) and the partial results
# (each split a float32 row block per sequence and KV head) within ADAPTIVE_WORKSPACE. No split
# where the capacity's CTAs fill UNSPLIT_WAVES waves or the workspace holds fewer than two splits:
# a bucket that wide is filled by steps of many sequences, which an unsplit grid keeps busy (256
# speculative decodes over 2k-6k keys: 2 forced splits took 1,540 us against 1,420 unsplit,
# bench/NOTES.md, adaptive splits)
ADAPTIVE_MIN_CHUNK_KEYS, ADAPTIVE_CTAS, ADAPTIVE_WORKSPACE = 1024, 4096, 64 << 20


@dataclass(frozen=True)
class DecodeConfig:
    """The paged attention's configuration for one node."""

    tiles: DecodeTiles
    few_rows: bool  # an e4m3 cache's kernel whose rows fit an m16n8 tile's 8 columns
    splits: int  # CTAs along each sequence's keys (1: no combine)
    # keys per split, a whole number of key blocks; the fewest, where the chunks are apart (each
    # sequence's chunk decided on the device from its length: `PagedDecodeVariant.adaptive`)
    chunk: int


def choose_decode(
    node: Sdpa, dtype: str, kv_cache_dtype: str, target: Target, chunks_apart: bool = False
) -> DecodeConfig:
    """The paged attention's tiles and key splits (`dtype`: Q's; `kv_cache_dtype`: the caches').

    Splits: one when the (sequence, KV head) CTAs already fill UNSPLIT_WAVES waves of the
    resident slots; else enough splits for WAVES waves at full capacity, each at least
    MIN_CHUNK_KEYS keys (SHORT_CHUNK_KEYS when those would fill less than half the slots). The
    chunk is a whole number of the variant's key blocks (an e4m3 cache's chunks of twice the keys
    were tried, bench/NOTES.md decode v5). `chunks_apart`: a mixed node whose chunks run on the
    forward kernel (`frostc.ops.sdpa_mixed`): this kernel's CTAs are one row block per sequence,
    split adaptively (`_adaptive`)."""
    few_rows = DTYPES[kv_cache_dtype].quantized and decode_rows(node) <= FEW_ROWS
    tiles = decode_tiles(node.head_dim, node.page_size, dtype, kv_cache_dtype, few_rows)
    units = node.heads_kv * row_block_ctas(node, tiles.rows, chunks_apart)
    slots = target.sms * tiles.ctas_per_sm
    blocks = -(-_keys_seen(node, tiles.block_n) // tiles.block_n)
    if chunks_apart:
        split_bytes = units * tiles.rows * (node.head_dim + 1) * 4  # a split's partial O and LSE
        most = ADAPTIVE_WORKSPACE // split_bytes
        if units >= UNSPLIT_WAVES * slots or most < 2:
            return DecodeConfig(tiles, False, 1, blocks * tiles.block_n)
        return _adaptive(tiles, units, blocks, most)
    wanted = 1 if units >= UNSPLIT_WAVES * slots else -(-WAVES * slots // units)
    splits = max(1, min(wanted, blocks // (MIN_CHUNK_KEYS // tiles.block_n)))
    if 2 * units * splits < slots:  # long chunks leave most of the GPU idle: shorter ones
        splits = max(1, min(wanted, blocks // (SHORT_CHUNK_KEYS // tiles.block_n)))
    chunk_blocks = -(-blocks // splits)
    return DecodeConfig(tiles, few_rows, -(-blocks // chunk_blocks), chunk_blocks * tiles.block_n)


def _adaptive(tiles: DecodeTiles, units: int, blocks: int, most: int) -> DecodeConfig:
    """The mixed form's decodes: a bucket's capacities say nothing of a step's lengths (64
    one-token decodes over 500 keys, or 8 over 40k), so the plan fixes only the splits and the
    fewest keys a split takes; each sequence's chunk is decided on the device. Measured
    before: a fixed chunk for the capacity left a 64-request job's long prompts in one or two
    CTAs while the short ones each paid a combine (bench/NOTES.md, adaptive splits). `most`:
    the splits the workspace allows."""
    min_blocks = ADAPTIVE_MIN_CHUNK_KEYS // tiles.block_n
    splits = max(1, min(blocks // min_blocks, ADAPTIVE_CTAS // units, most))
    if splits == 1:
        return DecodeConfig(tiles, False, 1, blocks * tiles.block_n)
    return DecodeConfig(tiles, False, splits, min_blocks * tiles.block_n)


def decode_rows(node: Sdpa) -> int:
    """Query rows per (sequence, KV head): the new tokens times the GQA group."""
    return node.seq_q * (node.heads_q // node.heads_kv)


def row_block_ctas(node: Sdpa, rows_per_cta: int, chunks_apart: bool = False) -> int:
    """The paged attention's CTAs per KV head and split: a block of `rows_per_cta` query rows
    each. The rows form (s_new · group rows per sequence) has them all; the mixed form one per
    sequence, then as many as the step's tokens can fill beyond each sequence's first (found
    on the device): a chunk's further row blocks, never more than the buffer's tokens make. With
    its chunks apart (on the forward kernel), one per sequence."""
    row_blocks = -(-decode_rows(node) // rows_per_cta)
    if node.form != "mixed":
        return node.batch * row_blocks
    if chunks_apart:
        return node.batch
    group = node.heads_q // node.heads_kv
    return node.batch + min(node.tokens_q * group // rows_per_cta, node.batch * (row_blocks - 1))


def _keys_seen(node: Sdpa, block_n: int) -> int:
    """The most keys one sequence's new tokens see: the capacity, or with a window the window
    of the first token through the last one, plus a block of alignment (the splits start at the
    window's first block)."""
    if node.mask.window_left is None:
        return node.seq_kv
    return min(node.seq_kv, node.mask.window_left + node.seq_q + block_n)
