"""SDPA forward for sm_90a, warp-specialized and persistent: a producer warpgroup loads with
TMA, two or three consumer warpgroups compute with WGMMA, taking turns on the tensor cores.

- Tiles: a tile is `block_m` query rows of one (batch, head). The grid is at most one CTA per
  SM (the runtime caps it, `ctas_per_sm`); each CTA walks the tiles blockIdx.x,
  blockIdx.x + gridDim.x, ... so the next tile's loads overlap the current tile's last
  blocks and epilogue instead of waiting for a fresh CTA. Causal tiles are ordered longest
  first (last query block of every head, then the one before, ...).
- Producer (warpgroup 0; one thread issues everything): TMA loads of Q, once the consumers
  released the previous tile's Q, then of K and V blocks into a `stages`-deep ring. Each
  stage's "full" mbarrier is armed with its byte count and completed by the TMA unit; a stage
  is refilled after every consumer released it on its "empty" mbarrier. Rows past a
  sequence's end arrive as zeros. The ring's position carries over from tile to tile.
- Consumers (64 query rows each; setmaxnreg per `WgmmaTiles.registers`): S = Q Kᵀ and
  O += P V with warpgroup MMAs, P kept in registers. Each turn issues S_j together with
  P_(j-1) V_(j-1) and runs softmax(S_j) while P V still runs; a ring of named barriers makes
  the consumers take turns, so one's softmax also hides under the others' GEMMs. O leaves
  through shared memory in 16-byte stores: its own buffer where it fits (then Q is released
  right after the tile's last S = Q Kᵀ), else the consumer's Q buffer (released after the store).

Tensor maps (Q, K, V) are kernel parameters; `tensor_maps` builds them, and the build runs the
same code on the CPU (`encode_tensor_maps`) so the plan holds each launch's maps. Modes as the
kernel sees them (element strides; the innermost head-dim stride is 1, checked at build time),
the parameter ABI being `sdpa_common.param_list`:
  Q    : (s_q, d, h_q, b)    tensor map
  K, V : (s_kv, d, h_kv, b)  tensor maps; head h_q reads h_q // group           (GQA / MQA)
  O    : (s_q, d)   at base + b * stride_b + h_q * stride_h
  LSE  : (s_q,)     fp32, natural log of the row's sum of exp(scaled score), optional

Constraints: fp16 / bf16; head dim 64, 128 or 256 (static); rows of Q, K, V, O 16-byte
aligned; any s_q, s_kv >= 1; causal is top-left aligned (query row i sees keys 0..i), like
torch's `is_causal`. Key blocks are visited last to first, so only the first ones need masks.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from frostc.kernels.sdpa_common import LN_2, quad_max, quad_sum

# setmaxnreg per warpgroup, by consumer count: the register file (64 Ki) split between one
# producer warpgroup (a single TMA thread needs few) and the consumers (accumulators)
REGISTERS = {2: (40, 232), 3: (32, 160)}
SMEM_LIMIT = 227 * 1024  # sm_90's opt-in maximum per CTA


@dataclass(frozen=True)
class WgmmaTiles:
    """The named tile parameters of one compiled variant."""

    block_m: int  # query rows per tile (64 per consumer warpgroup)
    block_n: int  # key rows per step
    consumers: int  # consumer warpgroups
    stages: int  # K/V shared-memory ring depth
    o_buffer: bool  # O staged in its own buffer (else in the Q buffer)
    ctas_per_sm: int = 1  # persistent grid: the runtime launches min(tiles, SMs * this) CTAs

    @property
    def num_threads(self) -> int:
        return 128 * (self.consumers + 1)

    @property
    def registers(self) -> tuple[int, int]:
        """(producer, consumer) registers per thread after setmaxnreg."""
        return REGISTERS[self.consumers]

    def as_dict(self) -> dict[str, int]:
        return {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "threads": self.num_threads,
            "consumer_warpgroups": self.consumers,
            "stages": self.stages,
            "o_buffer": int(self.o_buffer),
            "ctas_per_sm": self.ctas_per_sm,
        }


def tiles_for_head_dim(head_dim: int, causal: bool) -> WgmmaTiles:
    """Shared memory decides (227 KiB): Q and O buffers are 128·d, a ring stage 2·block_n·d
    two-byte elements. bench/NOTES.md has the measurements behind each choice."""
    if head_dim == 256:
        # 64 KiB Q + 2 stages of 2·32 KiB: O must go through Q's buffer
        return WgmmaTiles(block_m=128, block_n=64, consumers=2, stages=2, o_buffer=False)
    if head_dim == 128:
        # 32 KiB Q + 32 KiB O + 2 stages of 64 KiB = 192 KiB
        return WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=2, o_buffer=True)
    if not causal:
        # d=64: a block's GEMMs are half as long as at d=128 for the same softmax work, so three
        # consumers take turns (192 rows); 24 KiB Q + 24 KiB O + 4 stages of 32 KiB = 176 KiB.
        # Causal stays at two: with 512 threads ptxas keeps 128 registers and the masks spill.
        return WgmmaTiles(block_m=192, block_n=128, consumers=3, stages=4, o_buffer=True)
    # 16 KiB Q + 16 KiB O + 4 stages of 32 KiB = 160 KiB
    return WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=4, o_buffer=True)


class SdpaForwardWgmma:
    """Compile-time configuration of one variant: dtype, head dim, causal, LSE or not."""

    def __init__(self, dtype, head_dim: int, causal: bool, has_lse: bool, tiles: WgmmaTiles | None = None):
        self.dtype = dtype
        self.head_dim = head_dim
        self.causal = causal
        self.has_lse = has_lse
        self.tiles = tiles if tiles is not None else tiles_for_head_dim(head_dim, causal)
        self.smem_bytes = 0

    # ---------------------------------------------------------------- host side
    @cute.jit
    def __call__(self, q, k, v, o, lse, batch, heads_q, seq_q, seq_kv, group, strides: tuple, scale_log2, stream):
        self.shared_storage = self._shared_storage()
        self.smem_bytes = self.shared_storage.size_in_bytes()
        (q_tma, mQ), (k_tma, mK), (v_tma, mV) = self.tma_loads(q, k, v, batch, heads_q, seq_q, seq_kv, group, strides)
        # the runtime caps this at the device's SM count; every tile is visited with any grid
        grid = (cute.ceil_div(seq_q, self.tiles.block_m) * heads_q * batch, 1, 1)
        self.kernel(
            q_tma, mQ, k_tma, mK, v_tma, mV, o, lse, batch, heads_q, seq_q, seq_kv, group, *strides[9:], scale_log2
        ).launch(
            grid=grid, block=[self.tiles.num_threads, 1, 1], smem=self.smem_bytes, stream=stream, min_blocks_per_mp=1
        )

    @cute.jit
    def tma_loads(self, q, k, v, batch, heads_q, seq_q, seq_kv, group, strides: tuple):
        """TMA atoms (their tensor maps are kernel parameters) and coordinate tensors for Q, K
        and V as 4-d tensors (rows, d, heads, batch); V is viewed (d, rows, ...) to match its
        d-major shared-memory tile. The build also runs this on the CPU to write each launch's
        tensor maps into the plan."""
        t = self.tiles
        d = self.head_dim
        wg_m = t.block_m // t.consumers
        q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss = (cute.assume(x, divby=8) for x in strides[:9])
        heads_kv = heads_q // group
        sQ, sK, sV = self._smem_layouts()
        op = cpasync.CopyBulkTensorTileG2SOp()
        gQ = cute.make_tensor(q, cute.make_layout((seq_q, d, heads_q, batch), stride=(q_ss, 1, q_sh, q_sb)))
        gK = cute.make_tensor(k, cute.make_layout((seq_kv, d, heads_kv, batch), stride=(k_ss, 1, k_sh, k_sb)))
        gV = cute.make_tensor(v, cute.make_layout((d, seq_kv, heads_kv, batch), stride=(1, v_ss, v_sh, v_sb)))
        q_info = cpasync.make_tiled_tma_atom(op, gQ, cute.select(sQ, mode=[0, 1]), (wg_m, d))
        k_info = cpasync.make_tiled_tma_atom(op, gK, cute.select(sK, mode=[0, 1]), (t.block_n, d))
        v_info = cpasync.make_tiled_tma_atom(op, gV, cute.select(sV, mode=[0, 1]), (d, t.block_n))
        return (q_info[0], q_info[1]), (k_info[0], k_info[1]), (v_info[0], v_info[1])

    @cute.jit
    def encode_tensor_maps(self, q, k, v, out, batch, heads_q, seq_q, seq_kv, group, strides: tuple):
        """Host only, at build time: write the Q, K and V tensor maps (128 bytes each) to `out`."""
        (q_tma, _), (k_tma, _), (v_tma, _) = self.tma_loads(q, k, v, batch, heads_q, seq_q, seq_kv, group, strides)
        cpasync.copy_tensormap(q_tma, out)
        cpasync.copy_tensormap(k_tma, out + 128)
        cpasync.copy_tensormap(v_tma, out + 256)

    def _shared_storage(self):
        t = self.tiles
        dtype = self.dtype
        q_elems, k_elems, v_elems = (cute.cosize(x) for x in self._smem_layouts())
        o_elems = q_elems if t.o_buffer else 8  # unused placeholder when O goes through Q
        stages = t.stages

        @cute.struct
        class SharedStorage:
            q_bars: cute.struct.MemRange[cutlass.Int64, 2]
            k_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            v_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, k_elems], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, v_elems], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[dtype, o_elems], 1024]

        if SharedStorage.size_in_bytes() > SMEM_LIMIT:
            raise ValueError(f"{t} needs {SharedStorage.size_in_bytes()} bytes of shared memory, over {SMEM_LIMIT}")
        return SharedStorage

    def _mmas(self):
        t = self.tiles
        wg_m = t.block_m // t.consumers
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        qk = sm90.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, k_major, cutlass.Float32, (1, 1, 1), (wg_m, t.block_n)
        )
        pv = sm90.make_trivial_tiled_mma(
            self.dtype,
            self.dtype,
            k_major,
            mn_major,
            cutlass.Float32,
            (1, 1, 1),
            (wg_m, self.head_dim),
            warpgroup.OperandSource.RMEM,
        )
        return qk, pv

    def _smem_layouts(self):
        """Q (rows, d, consumer), K (keys, d, stage), V (d, keys, stage), in WGMMA's swizzles."""
        t = self.tiles
        wg_m = t.block_m // t.consumers
        sQ = sm90.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (wg_m, t.block_n, self.head_dim), self.dtype, t.consumers)
        sK = sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (wg_m, t.block_n, self.head_dim), self.dtype, t.stages)
        sV = sm90.make_smem_layout_b(LayoutEnum.COL_MAJOR, (wg_m, self.head_dim, t.block_n), self.dtype, t.stages)
        return sQ, sK, sV

    def _pipelines(self, storage):
        """Q: one stage; K and V: `stages` each. "full" is armed by the producer thread with the
        stage's byte count and completed by TMA; "empty" takes the 256 consumer threads."""
        t = self.tiles
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * t.consumers)
        elem = self.dtype.width // 8

        def make(bars, stages, rows):
            return pipeline.PipelineTmaAsync.create(
                barrier_storage=bars.data_ptr(),
                num_stages=stages,
                producer_group=producer,
                consumer_group=consumers,
                tx_count=rows * self.head_dim * elem,
                defer_sync=True,
            )

        return (
            make(storage.q_bars, 1, t.block_m),
            make(storage.k_bars, t.stages, t.block_n),
            make(storage.v_bars, t.stages, t.block_n),
        )

    # ---------------------------------------------------------------- device side
    @cute.kernel
    def kernel(
        self,
        q_tma: cute.CopyAtom,
        mQ: cute.Tensor,
        k_tma: cute.CopyAtom,
        mK: cute.Tensor,
        v_tma: cute.CopyAtom,
        mV: cute.Tensor,
        o: cute.Pointer,
        lse: cute.Pointer,
        batch: cutlass.Int32,
        heads_q: cutlass.Int32,
        seq_q: cutlass.Int32,
        seq_kv: cutlass.Int32,
        group: cutlass.Int32,
        o_sb: cutlass.Int64,
        o_sh: cutlass.Int64,
        o_ss: cutlass.Int64,
        lse_sb: cutlass.Int64,
        lse_sh: cutlass.Int64,
        lse_ss: cutlass.Int64,
        scale_log2: cutlass.Float32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_tidx = tidx % 128

        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        q_pipe, k_pipe, v_pipe = self._pipelines(storage)
        sQ_layout, sK_layout, sV_layout = self._smem_layouts()
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sO = sQ
        if cutlass.const_expr(self.tiles.o_buffer):
            sO = storage.sO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        shape = TileSpace(
            cute.ceil_div(seq_q, self.tiles.block_m), heads_q, batch, seq_q, seq_kv, group,
            cute.ceil_div(seq_kv, self.tiles.block_n),
        )  # fmt: skip
        producer_regs, consumer_regs = self.tiles.registers
        if wg == 0:
            cute.arch.setmaxregister_decrease(producer_regs)
            if wg_tidx == 0:  # one thread issues every TMA load
                self._produce(q_pipe, k_pipe, v_pipe, sQ, sK, sV, shape, (q_tma, mQ), (k_tma, mK), (v_tma, mV))
        else:
            cute.arch.setmaxregister_increase(consumer_regs)
            self._consume(
                q_pipe, k_pipe, v_pipe, sQ, sK, sV, sO, shape, (o, o_sb, o_sh, o_ss), (lse, lse_sb, lse_sh, lse_ss),
                wg - 1, wg_tidx, scale_log2,
            )  # fmt: skip

    @cute.jit
    def _schedule(self, shape):
        """This CTA's walk over the tiles, the same for the producer and the consumers:
        (first tile, number of tiles, stride)."""
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        return bidx, shape.m_blocks * shape.heads_q * shape.batch, grid

    @cute.jit
    def _tile(self, tile, shape):
        """Tile index -> (query block, head, batch). Non-causal: query blocks of one head are
        neighbours (they share K and V in L2). Causal: longest first, so the short tiles
        fill the end of the schedule."""
        heads_batch = shape.heads_q * shape.batch
        m_block, hb = tile % shape.m_blocks, tile // shape.m_blocks
        if cutlass.const_expr(self.causal):
            m_block, hb = shape.m_blocks - 1 - tile // heads_batch, tile % heads_batch
        return m_block, hb % shape.heads_q, hb // shape.heads_q

    @cute.jit
    def _key_blocks(self, m_block, shape):
        """Key blocks a tile visits (causal: up to its last query row)."""
        n_block_max = shape.n_blocks
        if cutlass.const_expr(self.causal):
            n_block_max = min(cute.ceil_div((m_block + 1) * self.tiles.block_m, self.tiles.block_n), shape.n_blocks)
        return n_block_max

    # ---------------------------------------------------------------- producer
    @cute.jit
    def _produce(self, q_pipe, k_pipe, v_pipe, sQ, sK, sV, shape, q_load, k_load, v_load):
        t = self.tiles
        d = self.head_dim
        wg_m = t.block_m // t.consumers
        (q_tma, mQ), (k_tma, mK), (v_tma, mV) = q_load, k_load, v_load
        one = cute.make_layout(1)
        first, num_tiles, grid = self._schedule(shape)
        loaded = cutlass.Int32(0)  # K/V blocks issued so far: the ring position
        tile_count = cutlass.Int32(0)
        for tile in range(first, num_tiles, grid):
            m_block, head, batch = self._tile(tile, shape)
            head_kv = head // shape.group
            n_block_max = self._key_blocks(m_block, shape)
            # rows past the end of a sequence arrive as zeros (TMA's out-of-bounds fill)
            gK = cute.local_tile(mK[None, None, head_kv, batch], (t.block_n, d), (None, 0))  # (n, d, blocks)
            gV = cute.local_tile(mV[None, None, head_kv, batch], (d, t.block_n), (0, None))  # (d, n, blocks)
            tKsK, tKgK = cpasync.tma_partition(k_tma, 0, one, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
            tVsV, tVgV = cpasync.tma_partition(v_tma, 0, one, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))

            q_pipe.sync_object_empty.wait(0, tile_count % 2 ^ 1)
            q_pipe.sync_object_full.arrive(0, None)  # expects both halves' bytes
            for c in cutlass.range_constexpr(t.consumers):
                gQ = cute.local_tile(mQ[None, None, head, batch], (wg_m, d), (m_block * t.consumers + c, 0))
                tQsQ, tQgQ = cpasync.tma_partition(
                    q_tma, 0, one, cute.group_modes(sQ[None, None, c], 0, 2), cute.group_modes(gQ, 0, 2)
                )
                cute.copy(q_tma, tQgQ, tQsQ, tma_bar_ptr=q_pipe.sync_object_full.get_barrier(0))

            for n_block in range(n_block_max - 1, -1, -1):
                position = loaded + (n_block_max - 1 - n_block)
                stage, phase = position % t.stages, position // t.stages % 2
                k_pipe.sync_object_empty.wait(stage, phase ^ 1)
                k_pipe.sync_object_full.arrive(stage, None)
                cute.copy(
                    k_tma,
                    tKgK[None, n_block],
                    tKsK[None, stage],
                    tma_bar_ptr=k_pipe.sync_object_full.get_barrier(stage),
                )
                v_pipe.sync_object_empty.wait(stage, phase ^ 1)
                v_pipe.sync_object_full.arrive(stage, None)
                cute.copy(
                    v_tma,
                    tVgV[None, n_block],
                    tVsV[None, stage],
                    tma_bar_ptr=v_pipe.sync_object_full.get_barrier(stage),
                )
            loaded += n_block_max
            tile_count += 1

    # ---------------------------------------------------------------- consumers
    def _row_copy(self):
        """16-byte pieces along d, 128 threads spread over rows (the O store)."""
        elems = 128 // self.dtype.width
        per_row = self.head_dim // elems
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        layout = cute.make_layout((128 // per_row, per_row), stride=(per_row, 1))
        return cute.make_tiled_copy_tv(atom, layout, cute.make_layout((1, elems)))

    @cute.jit
    def _consume(self, q_pipe, k_pipe, v_pipe, sQ, sK, sV, sO, shape, o_args, lse_args, cw, wg_tidx, scale_log2):
        t = self.tiles
        wg_m = t.block_m // t.consumers
        qk_mma, pv_mma = self._mmas()
        qk_mma.set(warpgroup.Field.ACCUMULATE, True)
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)
        qk_thr, pv_thr = qk_mma.get_slice(wg_tidx), pv_mma.get_slice(wg_tidx)
        tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ[None, None, cw]))
        tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, N, K, stage)
        tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, N, K, stage)
        acc_O = pv_thr.make_fragment_C(pv_thr.partition_shape_C((wg_m, self.head_dim)))
        rows = _wgmma_rows(acc_O.layout)
        row_max = cute.make_rmem_tensor(rows, cutlass.Float32)
        row_sum = cute.make_rmem_tensor(rows, cutlass.Float32)
        correction = cute.make_rmem_tensor(rows, cutlass.Float32)
        s_shape = qk_thr.partition_shape_C((wg_m, t.block_n))
        rP = cute.make_rmem_tensor(_c_to_a_layout(qk_thr.make_fragment_C(s_shape).layout), self.dtype)
        mask_steps = 1
        if cutlass.const_expr(self.causal):
            mask_steps = cute.ceil_div(t.block_m, t.block_n)

        # ping-pong: consumer c issues its GEMMs after consumer c-1 issued its own, in a ring
        consumers = t.consumers
        my_turn = pipeline.NamedBarrier(barrier_id=2 + cw, num_threads=256)
        their_turn = pipeline.NamedBarrier(barrier_id=2 + (cw + 1) % consumers, num_threads=256)
        if cw == consumers - 1:
            their_turn.arrive()  # consumer 0 goes first

        first, num_tiles, grid = self._schedule(shape)
        consumed = cutlass.Int32(0)  # K/V blocks consumed so far: the ring position
        tile_count = cutlass.Int32(0)
        for tile in range(first, num_tiles, grid):
            m_block, head, batch = self._tile(tile, shape)
            n_block_max = self._key_blocks(m_block, shape)
            row_tile = m_block * t.consumers + cw
            acc_O.fill(0.0)
            row_max.fill(-cutlass.Float32.inf)
            row_sum.fill(0.0)
            q_pipe.sync_object_full.wait(0, tile_count % 2)

            # Software pipeline: step j issues S_j = Q K_jᵀ and O += P_{j-1} V_{j-1} together,
            # then runs softmax(S_j) while P V is still on the tensor cores.
            acc_S = qk_thr.make_fragment_C(s_shape)
            acc_S.fill(0.0)
            stage, phase = consumed % t.stages, consumed // t.stages % 2
            k_pipe.sync_object_full.wait(stage, phase)
            my_turn.arrive_and_wait()
            warpgroup.fence()
            self._gemm_qk(qk_mma, acc_S, tSrQ, tSrK, stage)
            warpgroup.commit_group()
            their_turn.arrive()
            warpgroup.wait_group(0)
            k_pipe.sync_object_empty.arrive(stage, None)
            if cutlass.const_expr(t.o_buffer):
                if n_block_max == 1:
                    q_pipe.sync_object_empty.arrive(0, None)  # the tile's last read of Q
            self._online_softmax(qk_thr, acc_S, row_max, row_sum, correction, scale_log2, row_tile, n_block_max - 1,
                                 shape, True)  # fmt: skip
            cute.make_tensor(rP.iterator, acc_S.layout).store(acc_S.load().to(self.dtype))

            for step in range(1, n_block_max, 1):
                n_block = n_block_max - 1 - step
                stage, phase = (consumed + step) % t.stages, (consumed + step) // t.stages % 2
                prev_stage, prev_phase = (consumed + step - 1) % t.stages, (consumed + step - 1) // t.stages % 2
                acc_S = qk_thr.make_fragment_C(s_shape)
                acc_S.fill(0.0)
                k_pipe.sync_object_full.wait(stage, phase)
                v_pipe.sync_object_full.wait(prev_stage, prev_phase)
                my_turn.arrive_and_wait()
                warpgroup.fence()
                self._gemm_qk(qk_mma, acc_S, tSrQ, tSrK, stage)
                warpgroup.commit_group()
                self._gemm_pv(pv_mma, acc_O, rP, tOrV, prev_stage)
                warpgroup.commit_group()
                their_turn.arrive()
                warpgroup.wait_group(1)  # S_j is ready; P V may still run
                k_pipe.sync_object_empty.arrive(stage, None)
                if cutlass.const_expr(t.o_buffer):
                    if step == n_block_max - 1:
                        q_pipe.sync_object_empty.arrive(0, None)
                if step < mask_steps:
                    self._online_softmax(qk_thr, acc_S, row_max, row_sum, correction, scale_log2, row_tile, n_block,
                                         shape, True)  # fmt: skip
                else:
                    self._online_softmax(qk_thr, acc_S, row_max, row_sum, correction, scale_log2, row_tile, n_block,
                                         shape, False)  # fmt: skip
                warpgroup.wait_group(0)  # O and P_{j-1} are free again
                v_pipe.sync_object_empty.arrive(prev_stage, None)
                o_mn = _wgmma_rows_by_cols(acc_O)
                for r in cutlass.range_constexpr(cute.size(row_max)):
                    o_mn[r, None] = o_mn[r, None].load() * correction[r]
                cute.make_tensor(rP.iterator, acc_S.layout).store(acc_S.load().to(self.dtype))

            last = consumed + n_block_max - 1
            last_stage, last_phase = last % t.stages, last // t.stages % 2
            v_pipe.sync_object_full.wait(last_stage, last_phase)
            my_turn.arrive_and_wait()
            warpgroup.fence()
            self._gemm_pv(pv_mma, acc_O, rP, tOrV, last_stage)
            warpgroup.commit_group()
            # every arrive meets a wait: the last consumer's very last turn has no successor
            if cw != consumers - 1:
                their_turn.arrive()
            elif tile + grid < num_tiles:
                their_turn.arrive()
            warpgroup.wait_group(0)
            v_pipe.sync_object_empty.arrive(last_stage, None)

            self._epilogue(pv_mma, acc_O, row_max, row_sum, sO[None, None, cw], o_args, lse_args,
                           batch, head, row_tile, shape.seq_q, scale_log2, cw, wg_tidx)  # fmt: skip
            if cutlass.const_expr(not t.o_buffer):
                q_pipe.sync_object_empty.arrive(0, None)  # O has left the Q buffer
            consumed += n_block_max
            tile_count += 1

    @cute.jit
    def _gemm_qk(self, qk_mma, acc_S, tSrQ, tSrK, stage):
        for kk in cutlass.range_constexpr(cute.size(tSrQ.shape[2])):
            cute.gemm(qk_mma, acc_S, tSrQ[None, None, kk], tSrK[None, None, kk, stage], acc_S)

    @cute.jit
    def _gemm_pv(self, pv_mma, acc_O, rP, tOrV, stage):
        for kk in cutlass.range_constexpr(cute.size(rP.shape[2])):
            cute.gemm(pv_mma, acc_O, rP[None, None, kk], tOrV[None, None, kk, stage], acc_O)

    @cute.jit
    def _online_softmax(
        self, qk_thr, acc_S, row_max, row_sum, correction, scale_log2, row_tile, n_block, shape,
        masked: cutlass.Constexpr,
    ):  # fmt: skip
        """S -> unnormalized probabilities in place; running max and sum updated; the factor
        the output accumulated so far must be scaled by goes to `correction` (applied by the
        caller once the P V gemm that writes the output has finished)."""
        t = self.tiles
        s_mn = _wgmma_rows_by_cols(acc_S)
        if cutlass.const_expr(masked):
            cS = cute.local_tile(
                cute.make_identity_tensor((shape.seq_q, shape.seq_kv)),
                (t.block_m // t.consumers, t.block_n),
                (row_tile, n_block),
            )
            c_mn = _wgmma_rows_by_cols(qk_thr.partition_C(cS))
        for r in cutlass.range_constexpr(cute.size(row_max)):
            if cutlass.const_expr(masked):
                col_limit = shape.seq_kv
                if cutlass.const_expr(self.causal):
                    col_limit = min(c_mn[r, 0][0] + 1, shape.seq_kv)
                for c in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
                    if c_mn[r, c][1] >= col_limit:
                        s_mn[r, c] = -cutlass.Float32.inf
            row = s_mn[r, None].load()
            prev_max = row_max[r]
            new_max = cute.arch.fmax(prev_max, quad_max(row.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0)))
            # a row with every key masked so far keeps max -inf; exponentiate against 0 instead
            safe_max = 0.0 if new_max == -cutlass.Float32.inf else new_max
            shift = safe_max * scale_log2
            probs = cute.math.exp2(row * scale_log2 - shift, fastmath=True)
            factor = cute.math.exp2(prev_max * scale_log2 - shift, fastmath=True)
            row_sum[r] = probs.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0) + row_sum[r] * factor
            correction[r] = factor
            row_max[r] = new_max
            s_mn[r, None] = probs

    @cute.jit
    def _epilogue(
        self, pv_mma, acc_O, row_max, row_sum, sO, o_args, lse_args, batch, head, row_tile, seq_q, scale_log2,
        cw, wg_tidx,
    ):  # fmt: skip
        """Normalize O, stage it through shared memory (its own buffer, or this warpgroup's Q
        buffer, whose last S = Q Kᵀ is done) and store whole 16-byte row pieces; write the LSE."""
        t = self.tiles
        wg_m = t.block_m // t.consumers
        d = self.head_dim
        mO = _rows_of(*o_args, seq_q, batch, head, d)
        o_mn = _wgmma_rows_by_cols(acc_O)
        for r in cutlass.range_constexpr(cute.size(row_sum)):
            total = quad_sum(row_sum[r])
            row_sum[r] = total
            inv = 0.0 if total == 0.0 else cute.arch.rcp_approx(total)
            o_mn[r, None] = o_mn[r, None].load() * inv
        rO = cute.make_fragment_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype), pv_mma)
        r2s_thr = r2s.get_slice(wg_tidx)
        cute.copy(r2s, r2s_thr.retile(rO), r2s_thr.partition_D(sO))
        pipeline.NamedBarrier(barrier_id=2 + t.consumers + cw, num_threads=128).arrive_and_wait()

        s2g = self._row_copy().get_slice(wg_tidx)
        gO = cute.local_tile(mO, (wg_m, d), (row_tile, 0))
        cO = cute.local_tile(cute.make_identity_tensor((seq_q, d)), (wg_m, d), (row_tile, 0))
        tOsO, tOgO, tOcO = s2g.partition_S(sO), s2g.partition_D(gO), s2g.partition_D(cO)
        tOrO = cute.make_fragment_like(tOgO, self.dtype)
        cute.copy(s2g, tOsO, tOrO)
        for m in cutlass.range_constexpr(cute.size(tOgO.shape[1])):
            if tOcO[0, m, 0][0] < seq_q:
                cute.copy(s2g, tOrO[None, m, None], tOgO[None, m, None])

        if cutlass.const_expr(self.has_lse):
            c_mn = _wgmma_rows_by_cols(pv_mma.get_slice(wg_tidx).partition_C(cO))
            lse, lse_sb, lse_sh, lse_ss = lse_args
            mLSE = cute.make_tensor(lse + (batch * lse_sb + head * lse_sh), cute.make_layout(seq_q, stride=lse_ss))
            for r in cutlass.range_constexpr(cute.size(row_sum)):
                row = c_mn[r, 0][0]
                if wg_tidx % 4 == 0 and row < seq_q:
                    mLSE[row] = (row_max[r] * scale_log2 + cute.math.log2(row_sum[r])) * LN_2


def _wgmma_rows(acc_layout) -> int:
    """Rows of a WGMMA accumulator ((2, 2, N/8), M, N) one thread holds."""
    return cute.size(acc_layout.shape[0][1]) * cute.size(acc_layout.shape[1])


def _wgmma_rows_by_cols(acc: cute.Tensor) -> cute.Tensor:
    """View ((2 cols, 2 rows, N/8 blocks), MMA_M, MMA_N) as (rows, cols)."""
    lay = cute.make_layout(acc.layout.shape)
    view = cute.make_layout(
        ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[0][2], lay.shape[2])),
        stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[0][2], lay.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, view))


def _c_to_a_layout(c):
    """Accumulator ((2, 2, N/8), M, 1) -> A operand ((2, 2, 2), M, N/16): each 16 columns of S
    are one k-slice of P (the m64nNk16 C and A register layouts agree for 16-bit types)."""
    return cute.make_layout(
        ((c.shape[0][0], c.shape[0][1], 2), c.shape[1], c.shape[0][2] // 2),
        stride=((c.stride[0][0], c.stride[0][1], c.stride[0][2]), c.stride[1], c.stride[0][2] * 2),
    )


@dataclass(frozen=True)
class TileSpace:
    """The problem's extents in tiles and rows, as the kernel loops over them."""

    m_blocks: cutlass.Int32  # query blocks per (batch, head)
    heads_q: cutlass.Int32
    batch: cutlass.Int32
    seq_q: cutlass.Int32
    seq_kv: cutlass.Int32
    group: cutlass.Int32  # query heads per K/V head
    n_blocks: cutlass.Int32  # key blocks per (batch, head)


def _rows_of(base, sb, sh, ss, rows, batch, h, d: int):
    """The (rows, d) matrix of one (batch, head); strides are multiples of 8 (checked at build)."""
    sb, sh, ss = (cute.assume(x, divby=8) for x in (sb, sh, ss))
    return cute.make_tensor(base + (batch * sb + h * sh), cute.make_layout((rows, d), stride=(ss, 1)))


Kernel = SdpaForwardWgmma
