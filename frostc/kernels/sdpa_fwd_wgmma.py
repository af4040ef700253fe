"""SDPA forward for sm_90a, warp-specialized: a producer warpgroup loads, two consumer
warpgroups compute with WGMMA, taking turns on the tensor cores (ping-pong).

- Producer (warpgroup 0, 40 registers): cp.async Q (together with the first K and V), then K
  and V blocks into a `stages`-deep ring, two blocks in flight; a stage is published on its
  "full" mbarrier once the producer's own copies landed, and refilled after both consumers
  released it on its "empty" mbarrier.
- Consumers (warpgroups 1 and 2, 232 registers, 64 query rows each): S = Q Kᵀ and O += P V
  with warpgroup MMAs, P kept in registers. Each turn issues S_j together with
  P_(j-1) V_(j-1) and runs softmax(S_j) while P V still runs; two named barriers make the
  consumers take turns, so one's softmax also hides under the other's GEMMs. O leaves
  through the consumer's Q buffer in 16-byte stores.

Modes as the kernel sees them (element strides; the innermost head-dim stride is 1, checked
at build time), the parameter ABI being `sdpa_common.param_list`:
  Q, O : (s_q, d)   at base + b * stride_b + h_q * stride_h
  K, V : (s_kv, d)  at base + b * stride_b + (h_q // group) * stride_h     (GQA / MQA)
  LSE  : (s_q,)     fp32, natural log of the row's sum of exp(scaled score), optional

Constraints: fp16 / bf16; head dim 64 or 128 (static); rows of Q, K, V, O 16-byte aligned;
any s_q, s_kv >= 1; causal is top-left aligned (query row i sees keys 0..i), like torch's
`is_causal`. Key blocks are visited last to first, so only the first ones need masks.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from frostc.kernels.sdpa_common import LN_2, quad_max, quad_sum

PRODUCER_REGS = 40
CONSUMER_REGS = 232


@dataclass(frozen=True)
class WgmmaTiles:
    """The named tile parameters of one compiled variant."""

    block_m: int  # query rows per CTA (64 per consumer warpgroup)
    block_n: int  # key rows per step
    consumers: int  # consumer warpgroups
    stages: int  # K/V shared-memory ring depth

    @property
    def num_threads(self) -> int:
        return 128 * (self.consumers + 1)

    def as_dict(self) -> dict[str, int]:
        return {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "threads": self.num_threads,
            "consumer_warpgroups": self.consumers,
            "stages": self.stages,
        }


def tiles_for_head_dim(head_dim: int) -> WgmmaTiles:
    # d=128: Q 32 KiB + 3 stages of 32 KiB K and V = 224 KiB (the limit is 227); d=64 halves
    # every buffer. Three stages let the producer keep two blocks in flight.
    return WgmmaTiles(block_m=128, block_n=128, consumers=2, stages=3)


class SdpaForwardWgmma:
    """Compile-time configuration of one variant: dtype, head dim, causal, LSE or not."""

    def __init__(self, dtype, head_dim: int, causal: bool, has_lse: bool):
        self.dtype = dtype
        self.head_dim = head_dim
        self.causal = causal
        self.has_lse = has_lse
        self.tiles = tiles_for_head_dim(head_dim)
        self.smem_bytes = 0

    # ---------------------------------------------------------------- host side
    @cute.jit
    def __call__(self, q, k, v, o, lse, batch, heads_q, seq_q, seq_kv, group, strides: tuple, scale_log2, stream):
        t = self.tiles
        dtype = self.dtype
        q_elems, k_elems, v_elems = (cute.cosize(x) for x in self._smem_layouts())
        stages = t.stages

        @cute.struct
        class SharedStorage:
            q_full: cute.struct.MemRange[cutlass.Int64, 2]
            k_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            v_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, k_elems], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, v_elems], 1024]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        grid = (cute.ceil_div(seq_q, t.block_m), heads_q, batch)
        self.kernel(q, k, v, o, lse, seq_q, seq_kv, group, *strides, scale_log2).launch(
            grid=grid, block=[t.num_threads, 1, 1], smem=self.smem_bytes, stream=stream, min_blocks_per_mp=1
        )

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
        """Q: one stage; K and V: `stages` each. Producers: the 128 producer threads; consumers:
        the 256 consumer threads."""
        t = self.tiles
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 128)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * t.consumers)

        def make(bars, stages):
            return pipeline.PipelineAsync.create(
                barrier_storage=bars.data_ptr(),
                num_stages=stages,
                producer_group=producer,
                consumer_group=consumers,
                defer_sync=True,
            )

        return make(storage.q_full, 1), make(storage.k_bars, t.stages), make(storage.v_bars, t.stages)

    # ---------------------------------------------------------------- device side
    @cute.kernel
    def kernel(
        self,
        q: cute.Pointer,
        k: cute.Pointer,
        v: cute.Pointer,
        o: cute.Pointer,
        lse: cute.Pointer,
        seq_q: cutlass.Int32,
        seq_kv: cutlass.Int32,
        group: cutlass.Int32,
        q_sb: cutlass.Int64,
        q_sh: cutlass.Int64,
        q_ss: cutlass.Int64,
        k_sb: cutlass.Int64,
        k_sh: cutlass.Int64,
        k_ss: cutlass.Int64,
        v_sb: cutlass.Int64,
        v_sh: cutlass.Int64,
        v_ss: cutlass.Int64,
        o_sb: cutlass.Int64,
        o_sh: cutlass.Int64,
        o_ss: cutlass.Int64,
        lse_sb: cutlass.Int64,
        lse_sh: cutlass.Int64,
        lse_ss: cutlass.Int64,
        scale_log2: cutlass.Float32,
    ):
        t = self.tiles
        d = self.head_dim
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.causal):
            # longest first: the last query tiles see the most keys, so they start first and
            # the short ones fill the tail of the grid
            m_blocks, _, _ = cute.arch.grid_dim()
            m_block = m_blocks - 1 - m_block
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_tidx = tidx % 128
        head_kv = head // group

        n_block_count = cute.ceil_div(seq_kv, t.block_n)
        n_block_max = n_block_count
        if cutlass.const_expr(self.causal):
            n_block_max = min(cute.ceil_div((m_block + 1) * t.block_m, t.block_n), n_block_count)

        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        q_pipe, k_pipe, v_pipe = self._pipelines(storage)
        sQ_layout, sK_layout, sV_layout = self._smem_layouts()
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        mQ = _rows_of(q, q_sb, q_sh, q_ss, seq_q, batch, head, d)
        mK = _rows_of(k, k_sb, k_sh, k_ss, seq_kv, batch, head_kv, d)
        mV = _rows_of(v, v_sb, v_sh, v_ss, seq_kv, batch, head_kv, d)
        mO = _rows_of(o, o_sb, o_sh, o_ss, seq_q, batch, head, d)
        if wg == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            self._produce(q_pipe, k_pipe, v_pipe, mQ, mK, mV, sQ, sK, sV, m_block, n_block_max, seq_q, seq_kv, wg_tidx)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self._consume(
                q_pipe, k_pipe, v_pipe, sQ, sK, sV, mO, lse, lse_sb, lse_sh, lse_ss,
                m_block, n_block_max, seq_q, seq_kv, batch, head, wg - 1, wg_tidx, scale_log2,
            )  # fmt: skip

    # ---------------------------------------------------------------- producer
    @cute.jit
    def _produce(self, q_pipe, k_pipe, v_pipe, mQ, mK, mV, sQ, sK, sV, m_block, n_block_max, seq_q, seq_kv, ptidx):
        t = self.tiles
        d = self.head_dim
        wg_m = t.block_m // t.consumers
        copy = self._row_copy().get_slice(ptidx)
        # (keys, d, stage) view of V's (d, keys, stage) buffer, for row copies
        sV_rows = cute.composition(sV, cute.make_layout((t.block_n, d, t.stages), stride=(d, 1, d * t.block_n)))
        for c in cutlass.range_constexpr(t.consumers):
            tile = m_block * t.consumers + c
            gQ = cute.local_tile(mQ, (wg_m, d), (tile, 0))
            cQ = cute.local_tile(cute.make_identity_tensor((seq_q, d)), (wg_m, d), (tile, 0))
            self._copy_rows(
                copy, copy.partition_S(gQ), copy.partition_D(sQ[None, None, c]), copy.partition_S(cQ), seq_q
            )
        cute.arch.cp_async_commit_group()  # Q is published as soon as it lands, below

        gK = cute.local_tile(mK, (t.block_n, d), (None, 0))
        gV = cute.local_tile(mV, (t.block_n, d), (None, 0))
        cKV = cute.local_tile(cute.make_identity_tensor((seq_kv, d)), (t.block_n, d), (None, 0))
        tKgK, tKsK = copy.partition_S(gK), copy.partition_D(sK)
        tVgV, tVsV = copy.partition_S(gV), copy.partition_D(sV_rows)
        tKVcKV = copy.partition_S(cKV)
        # Q, K_0 and V_0 load together; then two blocks in flight: block j is published once
        # block j+1's copies are issued and block j's have landed
        for step in range(0, n_block_max, 1):
            n_block = n_block_max - 1 - step
            stage = step % t.stages
            empty_phase = (step // t.stages) % 2 ^ 1
            k_pipe.sync_object_empty.wait(stage, empty_phase)
            self._copy_rows(
                copy, tKgK[None, None, None, n_block], tKsK[None, None, None, stage],
                tKVcKV[None, None, None, n_block], seq_kv,
            )  # fmt: skip
            cute.arch.cp_async_commit_group()
            v_pipe.sync_object_empty.wait(stage, empty_phase)
            self._copy_rows(
                copy, tVgV[None, None, None, n_block], tVsV[None, None, None, stage],
                tKVcKV[None, None, None, n_block], seq_kv,
            )  # fmt: skip
            cute.arch.cp_async_commit_group()
            if step == 0:
                cute.arch.cp_async_wait_group(2)  # in flight: Q, K_0, V_0; Q has landed
                self._publish_landed(q_pipe, 0)
            else:
                cute.arch.cp_async_wait_group(2)
                previous = (step - 1) % t.stages
                self._publish_landed(k_pipe, previous)
                self._publish_landed(v_pipe, previous)
        cute.arch.cp_async_wait_group(0)
        last_stage = (n_block_max - 1) % t.stages
        self._publish_landed(k_pipe, last_stage)
        self._publish_landed(v_pipe, last_stage)

    @cute.jit
    def _publish_landed(self, pipe, stage):
        # shared memory written by this thread (cp.async and zero fills) is read next by WGMMA,
        # i.e. through the async proxy: fence before the release
        cute.arch.fence_proxy("async.shared", space="cta")
        pipe.sync_object_full.arrive(stage, None)

    def _row_copy(self, op=None):
        """16-byte pieces along d (cp.async by default), 128 threads spread over rows."""
        elems = 128 // self.dtype.width
        per_row = self.head_dim // elems
        op = op if op is not None else cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
        atom = cute.make_copy_atom(op, self.dtype, num_bits_per_copy=128)
        layout = cute.make_layout((128 // per_row, per_row), stride=(per_row, 1))
        return cute.make_tiled_copy_tv(atom, layout, cute.make_layout((1, elems)))

    @cute.jit
    def _copy_rows(self, copy, src, dst, coords, rows: cutlass.Int32):
        for m in cutlass.range_constexpr(cute.size(dst.shape[1])):
            if coords[0, m, 0][0] < rows:
                cute.copy(copy, src[None, m, None], dst[None, m, None])
            else:
                dst[None, m, None].fill(0)

    # ---------------------------------------------------------------- consumers
    @cute.jit
    def _consume(
        self, q_pipe, k_pipe, v_pipe, sQ, sK, sV, mO, lse, lse_sb, lse_sh, lse_ss,
        m_block, n_block_max, seq_q, seq_kv, batch, head, cw, wg_tidx, scale_log2,
    ):  # fmt: skip
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
        acc_O.fill(0.0)
        rows = _wgmma_rows(acc_O.layout)
        row_max = cute.make_rmem_tensor(rows, cutlass.Float32)
        row_sum = cute.make_rmem_tensor(rows, cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)
        row_tile = m_block * t.consumers + cw

        # ping-pong: consumer c issues its GEMMs after the other one issued its own
        my_turn = pipeline.NamedBarrier(barrier_id=2 + cw, num_threads=256)
        their_turn = pipeline.NamedBarrier(barrier_id=3 - cw, num_threads=256)
        if cw == 1:
            their_turn.arrive()  # consumer 0 goes first

        s_shape = qk_thr.partition_shape_C((wg_m, t.block_n))
        rP = cute.make_rmem_tensor(_c_to_a_layout(qk_thr.make_fragment_C(s_shape).layout), self.dtype)
        correction = cute.make_rmem_tensor(rows, cutlass.Float32)
        mask_steps = 1
        if cutlass.const_expr(self.causal):
            mask_steps = cute.ceil_div(t.block_m, t.block_n)
        q_pipe.sync_object_full.wait(0, 0)

        # Software pipeline: step j issues S_j = Q K_jᵀ and O += P_{j-1} V_{j-1} together, then
        # runs softmax(S_j) while P V is still on the tensor cores.
        acc_S = qk_thr.make_fragment_C(s_shape)
        acc_S.fill(0.0)
        k_pipe.sync_object_full.wait(0, 0)
        my_turn.arrive_and_wait()
        warpgroup.fence()
        self._gemm_qk(qk_mma, acc_S, tSrQ, tSrK, 0)
        warpgroup.commit_group()
        their_turn.arrive()
        warpgroup.wait_group(0)
        k_pipe.sync_object_empty.arrive(0, None)
        self._online_softmax(qk_thr, acc_S, row_max, row_sum, correction, scale_log2, row_tile, n_block_max - 1,
                             seq_q, seq_kv, True)  # fmt: skip
        cute.make_tensor(rP.iterator, acc_S.layout).store(acc_S.load().to(self.dtype))

        for step in range(1, n_block_max, 1):
            n_block = n_block_max - 1 - step
            stage, phase = step % t.stages, (step // t.stages) % 2
            prev_stage, prev_phase = (step - 1) % t.stages, ((step - 1) // t.stages) % 2
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
            if step < mask_steps:
                self._online_softmax(qk_thr, acc_S, row_max, row_sum, correction, scale_log2, row_tile, n_block,
                                     seq_q, seq_kv, True)  # fmt: skip
            else:
                self._online_softmax(qk_thr, acc_S, row_max, row_sum, correction, scale_log2, row_tile, n_block,
                                     seq_q, seq_kv, False)  # fmt: skip
            warpgroup.wait_group(0)  # O and P_{j-1} are free again
            v_pipe.sync_object_empty.arrive(prev_stage, None)
            o_mn = _wgmma_rows_by_cols(acc_O)
            for r in cutlass.range_constexpr(cute.size(row_max)):
                o_mn[r, None] = o_mn[r, None].load() * correction[r]
            cute.make_tensor(rP.iterator, acc_S.layout).store(acc_S.load().to(self.dtype))

        last_stage, last_phase = (n_block_max - 1) % t.stages, ((n_block_max - 1) // t.stages) % 2
        v_pipe.sync_object_full.wait(last_stage, last_phase)
        my_turn.arrive_and_wait()
        warpgroup.fence()
        self._gemm_pv(pv_mma, acc_O, rP, tOrV, last_stage)
        warpgroup.commit_group()
        if cw == 0:  # consumer 1's last turn needs no successor: every arrive meets a wait
            their_turn.arrive()
        warpgroup.wait_group(0)
        v_pipe.sync_object_empty.arrive(last_stage, None)

        self._epilogue(pv_mma, acc_O, row_max, row_sum, sQ[None, None, cw], mO, lse, lse_sb, lse_sh, lse_ss,
                       batch, head, row_tile, seq_q, scale_log2, cw, wg_tidx)  # fmt: skip

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
        self, qk_thr, acc_S, row_max, row_sum, correction, scale_log2, row_tile, n_block, seq_q, seq_kv,
        masked: cutlass.Constexpr,
    ):  # fmt: skip
        """S -> unnormalized probabilities in place; running max and sum updated; the factor
        the output accumulated so far must be scaled by goes to `correction` (applied by the
        caller once the P V gemm that writes the output has finished)."""
        t = self.tiles
        s_mn = _wgmma_rows_by_cols(acc_S)
        if cutlass.const_expr(masked):
            cS = cute.local_tile(
                cute.make_identity_tensor((seq_q, seq_kv)), (t.block_m // t.consumers, t.block_n), (row_tile, n_block)
            )
            c_mn = _wgmma_rows_by_cols(qk_thr.partition_C(cS))
        for r in cutlass.range_constexpr(cute.size(row_max)):
            if cutlass.const_expr(masked):
                col_limit = seq_kv
                if cutlass.const_expr(self.causal):
                    col_limit = min(c_mn[r, 0][0] + 1, seq_kv)
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
        self, pv_mma, acc_O, row_max, row_sum, sO, mO, lse, lse_sb, lse_sh, lse_ss, batch, head,
        row_tile, seq_q, scale_log2, cw, wg_tidx,
    ):  # fmt: skip
        """Normalize O, stage it through this warpgroup's Q buffer (its last S = Q Kᵀ is done)
        and store whole 16-byte row pieces; write the LSE."""
        t = self.tiles
        wg_m = t.block_m // t.consumers
        d = self.head_dim
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
        pipeline.NamedBarrier(barrier_id=4 + cw, num_threads=128).arrive_and_wait()

        s2g = self._row_copy(cute.nvgpu.CopyUniversalOp()).get_slice(wg_tidx)
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


def _rows_of(base, sb, sh, ss, rows, batch, h, d: int):
    """The (rows, d) matrix of one (batch, head); strides are multiples of 8 (checked at build)."""
    sb, sh, ss = (cute.assume(x, divby=8) for x in (sb, sh, ss))
    return cute.make_tensor(base + (batch * sb + h * sh), cute.make_layout((rows, d), stride=(ss, 1)))


Kernel = SdpaForwardWgmma
