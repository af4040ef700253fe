"""SDPA forward for sm_90a: cp.async tiles, WGMMA for both GEMMs, P kept in registers.

Two consumer warpgroups share one CTA: each owns 64 query rows of a 128-row tile and runs
`S = Q K^T` (both operands in shared memory) and `O += P V` (P from registers, V in shared
memory) with warpgroup MMAs. All 256 threads load the next K and V blocks with cp.async
into a two-stage ring while the tensor cores work on the current one. Key blocks are visited
from last to first so only the first ones need masks.

Modes, strides and constraints are those of `sdpa_fwd_mma` (same parameter ABI):
  Q, O : (s_q, d)   at base + b * stride_b + h_q * stride_h
  K, V : (s_kv, d)  at base + b * stride_b + (h_q // group) * stride_h
  LSE  : (s_q,)     fp32, natural log, optional
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from frostc.kernels.sdpa_common import LN_2, quad_max, quad_sum


@dataclass(frozen=True)
class WgmmaTiles:
    """The named tile parameters of one compiled variant."""

    block_m: int  # query rows per CTA (64 per warpgroup)
    block_n: int  # key rows per step
    warpgroups: int
    stages: int  # K/V shared-memory ring depth

    @property
    def num_threads(self) -> int:
        return 128 * self.warpgroups

    def as_dict(self) -> dict[str, int]:
        return {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "threads": self.num_threads,
            "warpgroups": self.warpgroups,
            "stages": self.stages,
        }


def tiles_for_head_dim(head_dim: int) -> WgmmaTiles:
    # d=128: Q 32 KiB + two stages of 32 KiB K and V = 160 KiB, one CTA of 8 warps per SM;
    # d=64 halves every buffer.
    return WgmmaTiles(block_m=128, block_n=128, warpgroups=2, stages=2)


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

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, k_elems], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, v_elems], 1024]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        grid = (cute.ceil_div(seq_q, t.block_m), heads_q, batch)
        self.kernel(q, k, v, o, lse, seq_q, seq_kv, group, *strides, scale_log2).launch(
            grid=grid, block=[t.num_threads, 1, 1], smem=self.smem_bytes, stream=stream
        )

    def _mmas(self):
        """(S = Q K^T, O += P V) warpgroup MMAs over one warpgroup's 64 rows."""
        t = self.tiles
        wg_m = t.block_m // t.warpgroups
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
        """Q (rows, d, warpgroup), K (keys, d, stage), V (d, keys, stage), in WGMMA's swizzles."""
        t = self.tiles
        wg_m = t.block_m // t.warpgroups
        sQ = sm90.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (wg_m, t.block_n, self.head_dim), self.dtype, t.warpgroups)
        sK = sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (wg_m, t.block_n, self.head_dim), self.dtype, t.stages)
        sV = sm90.make_smem_layout_b(LayoutEnum.COL_MAJOR, (wg_m, self.head_dim, t.block_n), self.dtype, t.stages)
        return sQ, sK, sV

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
        wg_m = t.block_m // t.warpgroups
        d = self.head_dim
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_tidx = tidx % 128
        head_kv = head // group

        def rows_of(base, sb, sh, ss, rows, h):
            sb, sh, ss = (cute.assume(x, divby=8) for x in (sb, sh, ss))
            return cute.make_tensor(base + (batch * sb + h * sh), cute.make_layout((rows, d), stride=(ss, 1)))

        mQ = rows_of(q, q_sb, q_sh, q_ss, seq_q, head)
        mK = rows_of(k, k_sb, k_sh, k_ss, seq_kv, head_kv)
        mV = rows_of(v, v_sb, v_sh, v_ss, seq_kv, head_kv)
        mO = rows_of(o, o_sb, o_sh, o_ss, seq_q, head)

        n_block_count = cute.ceil_div(seq_kv, t.block_n)
        n_block_max = n_block_count
        if cutlass.const_expr(self.causal):
            n_block_max = min(cute.ceil_div((m_block + 1) * t.block_m, t.block_n), n_block_count)

        qk_mma, pv_mma = self._mmas()
        # both gemms accumulate; S is zeroed per block instead (a field set inside the key loop
        # would be a value the loop cannot carry)
        qk_mma.set(warpgroup.Field.ACCUMULATE, True)
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)
        sQ_layout, sK_layout, sV_layout = self._smem_layouts()
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        # (keys, d, stage) view of V's (d, keys, stage) buffer, for the row copies
        sV_rows = cute.composition(sV, cute.make_layout((t.block_n, d, t.stages), stride=(d, 1, d * t.block_n)))

        # this warpgroup's query rows: global (wg_m, d), shared (wg_m, d)
        row_tile = m_block * t.warpgroups + wg
        gQ = cute.local_tile(mQ, (wg_m, d), (row_tile, 0))
        cQ = cute.local_tile(cute.make_identity_tensor((seq_q, d)), (wg_m, d), (row_tile, 0))
        sQ_wg = sQ[None, None, wg]

        q_copy = self._row_copy(128).get_slice(wg_tidx)
        kv_copy = self._row_copy(t.num_threads).get_slice(tidx)
        gK = cute.local_tile(mK, (t.block_n, d), (None, 0))  # (keys, d, n_block)
        gV = cute.local_tile(mV, (t.block_n, d), (None, 0))
        cKV = cute.local_tile(cute.make_identity_tensor((seq_kv, d)), (t.block_n, d), (None, 0))
        tKgK, tKsK = kv_copy.partition_S(gK), kv_copy.partition_D(sK)
        tVgV, tVsV = kv_copy.partition_S(gV), kv_copy.partition_D(sV_rows)
        tKVcKV = kv_copy.partition_S(cKV)

        qk_thr = qk_mma.get_slice(wg_tidx)
        pv_thr = pv_mma.get_slice(wg_tidx)
        tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ_wg))
        tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, N, K, stage)
        tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, N, K, stage)
        acc_O = pv_thr.make_fragment_C(pv_thr.partition_shape_C((wg_m, d)))
        acc_O.fill(0.0)
        rows = _wgmma_rows(acc_O.layout)
        row_max = cute.make_rmem_tensor(rows, cutlass.Float32)
        row_sum = cute.make_rmem_tensor(rows, cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)

        # prologue: Q rows, then the last K block, then the last V block (separate groups)
        self._copy_rows(q_copy, q_copy.partition_S(gQ), q_copy.partition_D(sQ_wg), q_copy.partition_S(cQ), seq_q)
        last = n_block_max - 1
        self._copy_rows(
            kv_copy, tKgK[None, None, None, last], tKsK[None, None, None, 0], tKVcKV[None, None, None, last], seq_kv
        )
        cute.arch.cp_async_commit_group()
        self._copy_rows(
            kv_copy, tVgV[None, None, None, last], tVsV[None, None, None, 0], tKVcKV[None, None, None, last], seq_kv
        )
        cute.arch.cp_async_commit_group()

        mask_steps = 1
        if cutlass.const_expr(self.causal):
            mask_steps = cute.ceil_div(t.block_m, t.block_n)
        ctx = _Ctx(
            kv_copy=kv_copy,
            tKgK=tKgK,
            tKsK=tKsK,
            tVgV=tVgV,
            tVsV=tVsV,
            qk_mma=qk_mma,
            pv_mma=pv_mma,
            qk_thr=qk_thr,
            pv_thr=pv_thr,
            tSrQ=tSrQ,
            tSrK=tSrK,
            tOrV=tOrV,
            acc_O=acc_O,
            row_max=row_max,
            row_sum=row_sum,
            scale_log2=scale_log2,
            row_tile=row_tile,
            seq_q=seq_q,
            seq_kv=seq_kv,
        )
        for step in range(0, n_block_max, 1):
            n_block = n_block_max - 1 - step
            if step < mask_steps:
                self._one_block(ctx, n_block, step, masked=True)
            else:
                self._one_block(ctx, n_block, step, masked=False)

        self._epilogue(ctx, mO, lse, lse_sb, lse_sh, lse_ss, batch, head, wg_tidx)

    # ---------------------------------------------------------------- building blocks
    def _row_copy(self, threads: int):
        """16-byte cp.async pieces along d, threads spread over rows."""
        elems = 128 // self.dtype.width
        per_row = self.head_dim // elems
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype, num_bits_per_copy=128
        )
        layout = cute.make_layout((threads // per_row, per_row), stride=(per_row, 1))
        return cute.make_tiled_copy_tv(atom, layout, cute.make_layout((1, elems)))

    @cute.jit
    def _copy_rows(self, copy, src, dst, coords, rows: cutlass.Int32):
        for m in cutlass.range_constexpr(cute.size(dst.shape[1])):
            if coords[0, m, 0][0] < rows:
                cute.copy(copy, src[None, m, None], dst[None, m, None])
            else:
                dst[None, m, None].fill(0)

    @cute.jit
    def _one_block(self, ctx, n_block: cutlass.Int32, step: cutlass.Int32, masked: cutlass.Constexpr):
        t = self.tiles
        stage = step % 2
        has_next = n_block > 0
        # K of this block landed (its V may still be in flight), for every thread
        cute.arch.cp_async_wait_group(1)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_threads()
        if has_next:
            cute.copy(ctx.kv_copy, ctx.tKgK[None, None, None, n_block - 1], ctx.tKsK[None, None, None, 1 - stage])
            cute.arch.cp_async_commit_group()

        acc_S = ctx.qk_thr.make_fragment_C(ctx.qk_thr.partition_shape_C((t.block_m // t.warpgroups, t.block_n)))
        acc_S.fill(0.0)
        warpgroup.fence()
        for kk in cutlass.range_constexpr(cute.size(ctx.tSrQ.shape[2])):
            cute.gemm(ctx.qk_mma, acc_S, ctx.tSrQ[None, None, kk], ctx.tSrK[None, None, kk, stage], acc_S)
        warpgroup.commit_group()
        warpgroup.wait_group(0)

        self._online_softmax(ctx, acc_S, n_block, step, masked)

        # P (fp32 accumulator layout) -> bf16/fp16 A-operand registers of the P V gemm
        rP = cute.make_rmem_tensor(_c_to_a_layout(acc_S.layout), self.dtype)
        cute.make_tensor(rP.iterator, acc_S.layout).store(acc_S.load().to(self.dtype))

        # V of this block landed; prefetch the next V into the other stage
        if has_next:
            cute.arch.cp_async_wait_group(1)
        else:
            cute.arch.cp_async_wait_group(0)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_threads()
        if has_next:
            cute.copy(ctx.kv_copy, ctx.tVgV[None, None, None, n_block - 1], ctx.tVsV[None, None, None, 1 - stage])
            cute.arch.cp_async_commit_group()

        warpgroup.fence()
        for kk in cutlass.range_constexpr(cute.size(rP.shape[2])):
            cute.gemm(ctx.pv_mma, ctx.acc_O, rP[None, None, kk], ctx.tOrV[None, None, kk, stage], ctx.acc_O)
        warpgroup.commit_group()
        warpgroup.wait_group(0)

    @cute.jit
    def _online_softmax(self, ctx, acc_S, n_block, step, masked: cutlass.Constexpr):
        t = self.tiles
        s_mn = _wgmma_rows_by_cols(acc_S)
        o_mn = _wgmma_rows_by_cols(ctx.acc_O)
        if cutlass.const_expr(masked):
            cS = cute.local_tile(
                cute.make_identity_tensor((ctx.seq_q, ctx.seq_kv)),
                (t.block_m // t.warpgroups, t.block_n),
                (ctx.row_tile, n_block),
            )
            c_mn = _wgmma_rows_by_cols(ctx.qk_thr.partition_C(cS))
        for r in cutlass.range_constexpr(cute.size(ctx.row_max)):
            if cutlass.const_expr(masked):
                col_limit = ctx.seq_kv
                if cutlass.const_expr(self.causal):
                    col_limit = min(c_mn[r, 0][0] + 1, ctx.seq_kv)
                for c in cutlass.range_constexpr(cute.size(s_mn.shape[1])):
                    if c_mn[r, c][1] >= col_limit:
                        s_mn[r, c] = -cutlass.Float32.inf
            row = s_mn[r, None].load()
            new_max = quad_max(row.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0))
            prev_max = ctx.row_max[r]
            new_max = cute.arch.fmax(prev_max, new_max)
            safe_max = 0.0 if new_max == -cutlass.Float32.inf else new_max
            shift = safe_max * ctx.scale_log2
            probs = cute.math.exp2(row * ctx.scale_log2 - shift, fastmath=True)
            correction = cute.math.exp2(prev_max * ctx.scale_log2 - shift, fastmath=True)
            ctx.row_sum[r] = probs.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0) + ctx.row_sum[r] * correction
            o_mn[r, None] = o_mn[r, None].load() * correction
            ctx.row_max[r] = new_max
            s_mn[r, None] = probs

    @cute.jit
    def _epilogue(self, ctx, mO, lse, lse_sb, lse_sh, lse_ss, batch, head, wg_tidx):
        t = self.tiles
        wg_m = t.block_m // t.warpgroups
        d = self.head_dim
        o_mn = _wgmma_rows_by_cols(ctx.acc_O)
        for r in cutlass.range_constexpr(cute.size(ctx.row_sum)):
            total = quad_sum(ctx.row_sum[r])
            ctx.row_sum[r] = total
            inv = 0.0 if total == 0.0 else cute.arch.rcp_approx(total)
            o_mn[r, None] = o_mn[r, None].load() * inv

        pv_thr = ctx.pv_thr
        cO = cute.local_tile(cute.make_identity_tensor((ctx.seq_q, d)), (wg_m, d), (ctx.row_tile, 0))
        c_mn = _wgmma_rows_by_cols(pv_thr.partition_C(cO))
        gO = cute.local_tile(mO, (wg_m, d), (ctx.row_tile, 0))
        tOgO = _wgmma_rows_by_cols(pv_thr.partition_C(gO))
        rO = cute.make_fragment_like(ctx.acc_O, self.dtype)
        rO.store(ctx.acc_O.load().to(self.dtype))
        rO_mn = _wgmma_rows_by_cols(rO)
        for r in cutlass.range_constexpr(cute.size(ctx.row_sum)):
            if c_mn[r, 0][0] < ctx.seq_q:
                for c in cutlass.range_constexpr(cute.size(rO_mn.shape[1])):
                    tOgO[r, c] = rO_mn[r, c]

        if cutlass.const_expr(self.has_lse):
            mLSE = cute.make_tensor(lse + (batch * lse_sb + head * lse_sh), cute.make_layout(ctx.seq_q, stride=lse_ss))
            for r in cutlass.range_constexpr(cute.size(ctx.row_sum)):
                row = c_mn[r, 0][0]
                if wg_tidx % 4 == 0 and row < ctx.seq_q:
                    mLSE[row] = (ctx.row_max[r] * ctx.scale_log2 + cute.math.log2(ctx.row_sum[r])) * LN_2


class _Ctx:
    def __init__(self, **values):
        self.__dict__.update(values)


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


Kernel = SdpaForwardWgmma
