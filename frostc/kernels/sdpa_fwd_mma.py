"""SDPA forward for sm_80+ (runs on sm_90a): cp.async tiles, mma.sync m16n8k16, online softmax.

One CTA computes one tile of `BLOCK_M` query rows for one (batch, query head), walking the key
blocks from the last to the first so that only the first blocks visited need masking (the
partial key block at the end of the sequence, and the blocks crossing the causal diagonal).

Modes as the kernel sees them (element strides; the innermost head-dim stride is 1, checked
at build time):
  Q, O : (s_q, d)   at base + b * stride_b + h_q * stride_h
  K, V : (s_kv, d)  at base + b * stride_b + (h_q // group) * stride_h     (GQA / MQA)
  LSE  : (s_q,)     fp32, natural log of the row's sum of exp(scaled score), optional

Constraints: fp16 / bf16; head dim 64 or 128 (static); rows of Q, K, V, O 16-byte aligned
(strides multiple of 8 elements, base pointers 16-byte aligned); any s_q, s_kv >= 1; causal is
top-left aligned (query row i sees keys 0..i), like torch SDPA's `is_causal`.

The kernel's parameters are plain scalars (pointers, int32, int64, float32) listed in
`sdpa_common.param_list`; the runtime fills them from the plan without knowing anything about CuTe.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from frostc.kernels.sdpa_common import LN_2, STRIDE_NAMES, quad_max, quad_sum


@dataclass(frozen=True)
class SdpaFwdTiles:
    """The named tile parameters of one compiled variant."""

    block_m: int  # query rows per CTA
    block_n: int  # key rows per inner step
    num_threads: int  # 4 warps; each warp owns 16-row slices of the query tile

    def as_dict(self) -> dict[str, int]:
        return {"block_m": self.block_m, "block_n": self.block_n, "threads": self.num_threads}


def tiles_for_head_dim(head_dim: int) -> SdpaFwdTiles:
    # d=128: Q 32 KiB + K, V 16 KiB each; d=64: 128-key blocks keep the MMAs fed.
    return SdpaFwdTiles(block_m=128, block_n=64 if head_dim == 128 else 128, num_threads=128)


class SdpaForwardMma:
    """Compile-time configuration of one variant: dtype, head dim, causal, LSE or not."""

    def __init__(self, dtype: type[cutlass.Numeric], head_dim: int, causal: bool, has_lse: bool):
        self.dtype = dtype
        self.head_dim = head_dim
        self.causal = causal
        self.has_lse = has_lse
        self.tiles = tiles_for_head_dim(head_dim)
        self.smem_bytes = 0  # filled while tracing

    # ---------------------------------------------------------------- host side (traced once)
    @cute.jit
    def __call__(
        self,
        q: cute.Pointer,
        k: cute.Pointer,
        v: cute.Pointer,
        o: cute.Pointer,
        lse: cute.Pointer,
        batch: cutlass.Int32,
        heads_q: cutlass.Int32,
        seq_q: cutlass.Int32,
        seq_kv: cutlass.Int32,
        group: cutlass.Int32,
        strides: tuple,
        scale_log2: cutlass.Float32,
        stream,
    ):
        t = self.tiles
        self.shared_storage = self._shared_storage_type()
        self.smem_bytes = self.shared_storage.size_in_bytes()
        grid = (cute.ceil_div(seq_q, t.block_m), heads_q, batch)
        self.kernel(q, k, v, o, lse, seq_q, seq_kv, group, *strides, scale_log2).launch(
            grid=grid, block=[t.num_threads, 1, 1], smem=self.smem_bytes, stream=stream
        )

    def _smem_layout(self, rows: int):
        # 8 x 64 swizzled atoms: ldmatrix reads and 16-byte cp.async writes hit distinct banks.
        atom = cute.make_composed_layout(cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, 64), stride=(64, 1)))
        return cute.tile_to_shape(atom, (rows, self.head_dim), (0, 1))

    def _shared_storage_type(self):
        t = self.tiles
        q_elems = cute.cosize(self._smem_layout(t.block_m))
        kv_elems = cute.cosize(self._smem_layout(t.block_n))
        dtype = self.dtype

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, kv_elems], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, kv_elems], 1024]

        return SharedStorage

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
        # argument order is `param_list()`; look them up by ABI name below
        p = {
            "q": q,
            "k": k,
            "v": v,
            "o": o,
            "lse": lse,
            "scale_log2": scale_log2,
            "q.stride_b": q_sb,
            "q.stride_h": q_sh,
            "q.stride_s": q_ss,
            "k.stride_b": k_sb,
            "k.stride_h": k_sh,
            "k.stride_s": k_ss,
            "v.stride_b": v_sb,
            "v.stride_h": v_sh,
            "v.stride_s": v_ss,
            "o.stride_b": o_sb,
            "o.stride_h": o_sh,
            "o.stride_s": o_ss,
            "lse.stride_b": lse_sb,
            "lse.stride_h": lse_sh,
            "lse.stride_s": lse_ss,
        }
        t = self.tiles
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        head_kv = head // group

        def rows_of(name, rows, h):
            # strides are multiples of 8 elements (checked at build): rows stay 16-byte aligned
            sb, sh, ss = (cute.assume(p[f"{name}.{s}"], divby=8) for s in STRIDE_NAMES)
            base = p[name] + (batch * sb + h * sh)
            return cute.make_tensor(base, cute.make_layout((rows, self.head_dim), stride=(ss, 1)))

        mQ = rows_of("q", seq_q, head)
        mK = rows_of("k", seq_kv, head_kv)
        mV = rows_of("v", seq_kv, head_kv)
        mO = rows_of("o", seq_q, head)

        n_block_count = cute.ceil_div(seq_kv, t.block_n)
        n_block_max = n_block_count
        if cutlass.const_expr(self.causal):
            n_block_max = min(cute.ceil_div((m_block + 1) * t.block_m, t.block_n), n_block_count)

        # (BLOCK_M, d) and (BLOCK_N, d, n_block) tiles
        gQ = cute.local_tile(mQ, (t.block_m, self.head_dim), (m_block, 0))
        gK = cute.local_tile(mK, (t.block_n, self.head_dim), (None, 0))
        gV = cute.local_tile(mV, (t.block_n, self.head_dim), (None, 0))
        cQ = cute.local_tile(
            cute.make_identity_tensor((seq_q, self.head_dim)), (t.block_m, self.head_dim), (m_block, 0)
        )
        cKV = cute.local_tile(cute.make_identity_tensor((seq_kv, self.head_dim)), (t.block_n, self.head_dim), (None, 0))

        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(self._smem_layout(t.block_m))
        sK = storage.sK.get_tensor(self._smem_layout(t.block_n))
        sV = storage.sV.get_tensor(self._smem_layout(t.block_n))
        # V^T view (d, BLOCK_N) for the P @ V gemm's B operand
        sVt = cute.composition(sV, cute.make_layout((self.head_dim, t.block_n), stride=(t.block_n, 1)))

        # global -> shared copies: 16-byte cp.async, 8 threads per 64-element row chunk
        g2s = self._g2s_tiled_copy().get_slice(tidx)
        tQgQ, tQsQ, tQcQ = g2s.partition_S(gQ), g2s.partition_D(sQ), g2s.partition_S(cQ)
        tKgK, tKsK = g2s.partition_S(gK), g2s.partition_D(sK)
        tVgV, tVsV = g2s.partition_S(gV), g2s.partition_D(sV)
        tKVcKV = g2s.partition_S(cKV)

        tiled_mma = self._tiled_mma()
        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((t.block_m, self.head_dim)), cutlass.Float32)
        acc_O.fill(0.0)

        s2r_Q = cute.make_tiled_copy_A(self._ldmatrix(False), tiled_mma).get_slice(tidx)
        s2r_K = cute.make_tiled_copy_B(self._ldmatrix(False), tiled_mma).get_slice(tidx)
        s2r_V = cute.make_tiled_copy_B(self._ldmatrix(True), tiled_mma).get_slice(tidx)
        frags = _Fragments(
            tSsQ=s2r_Q.partition_S(sQ),
            tSrQ_view=s2r_Q.retile(tSrQ),
            tSrQ=tSrQ,
            tSsK=s2r_K.partition_S(sK),
            tSrK_view=s2r_K.retile(tSrK),
            tSrK=tSrK,
            tOsVt=s2r_V.partition_S(sVt),
            tOrVt_view=s2r_V.retile(tOrVt),
            tOrVt=tOrVt,
            s2r_Q=s2r_Q,
            s2r_K=s2r_K,
            s2r_V=s2r_V,
        )

        row_count = acc_O.shape[0][0] * acc_O.shape[1]
        row_max = cute.make_rmem_tensor(row_count, cutlass.Float32)
        row_sum = cute.make_rmem_tensor(row_count, cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)

        # prologue: Q tile and the last K block (both may be partial)
        self._copy_rows(g2s, tQgQ, tQsQ, tQcQ, seq_q)
        last = n_block_max - 1
        self._copy_rows(g2s, tKgK[None, None, None, last], tKsK, tKVcKV[None, None, None, last], seq_kv)
        cute.arch.cp_async_commit_group()

        ctx = _BlockContext(
            g2s=g2s,
            tKgK=tKgK,
            tKsK=tKsK,
            tVgV=tVgV,
            tVsV=tVsV,
            tKVcKV=tKVcKV,
            tiled_mma=tiled_mma,
            thr_mma=thr_mma,
            frags=frags,
            acc_O=acc_O,
            row_max=row_max,
            row_sum=row_sum,
            scale_log2=p["scale_log2"],
            m_block=m_block,
            seq_q=seq_q,
            seq_kv=seq_kv,
        )
        # the first visited blocks may hold the key residue or cross the diagonal: masked
        mask_steps = 1
        if cutlass.const_expr(self.causal):
            mask_steps = cute.ceil_div(t.block_m, t.block_n)
        for step in cutlass.range_constexpr(mask_steps):
            n_block = n_block_max - 1 - step
            if cutlass.const_expr(step == 0):
                self._one_block(ctx, n_block, is_first=True, masked=True)
            else:
                if n_block >= 0:
                    self._one_block(ctx, n_block, is_first=False, masked=True)
        for step in range(mask_steps, n_block_max, 1):
            self._one_block(ctx, n_block_max - 1 - step, is_first=False, masked=False)

        self._epilogue(ctx, sQ, mO, p, tidx, batch, head)

    # ---------------------------------------------------------------- building blocks
    def _g2s_tiled_copy(self):
        op = cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
        return self._row_tiled_copy(cute.make_copy_atom(op, self.dtype, num_bits_per_copy=128))

    def _s2g_tiled_copy(self):
        op = cute.nvgpu.CopyUniversalOp()
        return self._row_tiled_copy(cute.make_copy_atom(op, self.dtype, num_bits_per_copy=128))

    def _row_tiled_copy(self, atom):
        """16-byte pieces, 8 threads per 64-element row chunk: coalesced, matching the smem swizzle atom."""
        elems = 128 // self.dtype.width
        per_row = 64 // elems
        threads = cute.make_layout((self.tiles.num_threads // per_row, per_row), stride=(per_row, 1))
        return cute.make_tiled_copy_tv(atom, threads, cute.make_layout((1, elems)))

    def _tiled_mma(self):
        warps = self.tiles.num_threads // 32
        return cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16)),
            (warps, 1, 1),
            permutation_mnk=(warps * 16, 16, 16),
        )

    def _ldmatrix(self, transpose: bool):
        return cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=transpose, num_matrices=4), self.dtype)

    @cute.jit
    def _copy_rows(self, g2s, src, dst, coords, rows: cutlass.Int32):
        """cp.async the rows that exist; zero the shared rows past the end (they feed the MMAs)."""
        for m in cutlass.range_constexpr(cute.size(dst.shape[1])):
            if coords[0, m, 0][0] < rows:
                cute.copy(g2s, src[None, m, None], dst[None, m, None])
            else:
                dst[None, m, None].fill(0)

    @cute.jit
    def _one_block(self, ctx, n_block: cutlass.Int32, is_first: cutlass.Constexpr, masked: cutlass.Constexpr):
        t = self.tiles
        f = ctx.frags
        acc_S = cute.make_rmem_tensor(ctx.thr_mma.partition_shape_C((t.block_m, t.block_n)), cutlass.Float32)
        acc_S.fill(0.0)

        cute.arch.cp_async_wait_group(0)  # this block's K has landed
        cute.arch.sync_threads()  # ... for every thread, and everyone is done with the last V
        if cutlass.const_expr(is_first):
            self._copy_rows(
                ctx.g2s,
                ctx.tVgV[None, None, None, n_block],
                ctx.tVsV,
                ctx.tKVcKV[None, None, None, n_block],
                ctx.seq_kv,
            )
        else:
            cute.copy(ctx.g2s, ctx.tVgV[None, None, None, n_block], ctx.tVsV)
        cute.arch.cp_async_commit_group()

        # S = Q K^T, shared -> register copies one k-slice ahead of the MMAs
        k_tiles = cute.size(f.tSsQ.shape[2])
        cute.copy(f.s2r_Q, f.tSsQ[None, None, 0], f.tSrQ_view[None, None, 0])
        cute.copy(f.s2r_K, f.tSsK[None, None, 0], f.tSrK_view[None, None, 0])
        for kk in cutlass.range_constexpr(k_tiles):
            if cutlass.const_expr(kk + 1 < k_tiles):
                cute.copy(f.s2r_Q, f.tSsQ[None, None, kk + 1], f.tSrQ_view[None, None, kk + 1])
                cute.copy(f.s2r_K, f.tSsK[None, None, kk + 1], f.tSrK_view[None, None, kk + 1])
            cute.gemm(ctx.tiled_mma, acc_S, f.tSrQ[None, None, kk], f.tSrK[None, None, kk], acc_S)

        cute.arch.cp_async_wait_group(0)  # V has landed
        cute.arch.sync_threads()  # ... and nobody reads sK any more: prefetch the next K
        if n_block > 0:
            cute.copy(ctx.g2s, ctx.tKgK[None, None, None, n_block - 1], ctx.tKsK)
            cute.arch.cp_async_commit_group()

        self._online_softmax(ctx, acc_S, n_block, is_first, masked)

        # O += P V, with P re-laid from the C fragment (4, M, N) to the A fragment ((4, 2), M, N/2)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        split = cute.logical_divide(rP.layout, (None, None, 2))
        tOrP = cute.make_tensor(
            rP.iterator,
            cute.make_layout(
                ((split.shape[0], split.shape[2][0]), split.shape[1], split.shape[2][1]),
                stride=((split.stride[0], split.stride[2][0]), split.stride[1], split.stride[2][1]),
            ),
        )
        v_tiles = cute.size(tOrP.shape[2])
        cute.copy(f.s2r_V, f.tOsVt[None, None, 0], f.tOrVt_view[None, None, 0])
        for kk in cutlass.range_constexpr(v_tiles):
            if cutlass.const_expr(kk + 1 < v_tiles):
                cute.copy(f.s2r_V, f.tOsVt[None, None, kk + 1], f.tOrVt_view[None, None, kk + 1])
            cute.gemm(ctx.tiled_mma, ctx.acc_O, tOrP[None, None, kk], f.tOrVt[None, None, kk], ctx.acc_O)

    @cute.jit
    def _online_softmax(self, ctx, acc_S, n_block, is_first: cutlass.Constexpr, masked: cutlass.Constexpr):
        t = self.tiles
        s_mn = _rows_by_cols(acc_S)
        o_mn = _rows_by_cols(ctx.acc_O)
        if cutlass.const_expr(masked):
            cS = cute.local_tile(
                cute.make_identity_tensor((ctx.seq_q, ctx.seq_kv)), (t.block_m, t.block_n), (ctx.m_block, n_block)
            )
            c_mn = _rows_by_cols(ctx.thr_mma.partition_C(cS))
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
            if cutlass.const_expr(not is_first):
                new_max = cute.arch.fmax(prev_max, new_max)
            # a row with every key masked so far keeps max -inf; exponentiate against 0 instead
            safe_max = 0.0 if new_max == -cutlass.Float32.inf else new_max
            shift = safe_max * ctx.scale_log2
            probs = cute.math.exp2(row * ctx.scale_log2 - shift, fastmath=True)
            row_total = probs.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
            if cutlass.const_expr(not is_first):
                correction = cute.math.exp2(prev_max * ctx.scale_log2 - shift, fastmath=True)
                row_total = row_total + ctx.row_sum[r] * correction
                o_mn[r, None] = o_mn[r, None].load() * correction
            ctx.row_max[r] = new_max
            ctx.row_sum[r] = row_total
            s_mn[r, None] = probs

    @cute.jit
    def _epilogue(self, ctx, sQ, mO, p, tidx, batch, head):
        t = self.tiles
        o_mn = _rows_by_cols(ctx.acc_O)
        for r in cutlass.range_constexpr(cute.size(ctx.row_sum)):
            total = quad_sum(ctx.row_sum[r])
            ctx.row_sum[r] = total
            inv = 0.0 if total == 0.0 else cute.arch.rcp_approx(total)
            o_mn[r, None] = o_mn[r, None].load() * inv

        if cutlass.const_expr(self.has_lse):
            cO_rows = cute.local_tile(
                cute.make_identity_tensor((ctx.seq_q, self.head_dim)), (t.block_m, self.head_dim), (ctx.m_block, 0)
            )
            c_mn = _rows_by_cols(ctx.thr_mma.partition_C(cO_rows))
            lse_base = p["lse"] + (batch * p["lse.stride_b"] + head * p["lse.stride_h"])
            mLSE = cute.make_tensor(lse_base, cute.make_layout(ctx.seq_q, stride=p["lse.stride_s"]))
            for r in cutlass.range_constexpr(cute.size(ctx.row_sum)):
                row = c_mn[r, 0][0]
                if tidx % 4 == 0 and row < ctx.seq_q:
                    log2_total = cute.math.log2(ctx.row_sum[r], fastmath=False)
                    mLSE[row] = (ctx.row_max[r] * ctx.scale_log2 + log2_total) * LN_2

        # registers -> shared (reusing sQ: every thread passed its last read of it) -> global
        rO = cute.make_fragment_like(ctx.acc_O, self.dtype)
        rO.store(ctx.acc_O.load().to(self.dtype))
        sO = cute.make_tensor(sQ.iterator, self._smem_layout(t.block_m))
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype), ctx.tiled_mma)
        r2s_thr = r2s.get_slice(tidx)
        cute.copy(r2s, r2s_thr.retile(rO), r2s_thr.partition_D(sO))
        cute.arch.sync_threads()

        s2g = self._s2g_tiled_copy().get_slice(tidx)
        gO = cute.local_tile(mO, (t.block_m, self.head_dim), (ctx.m_block, 0))
        cO = cute.local_tile(
            cute.make_identity_tensor((ctx.seq_q, self.head_dim)), (t.block_m, self.head_dim), (ctx.m_block, 0)
        )
        tOsO, tOgO, tOcO = s2g.partition_S(sO), s2g.partition_D(gO), s2g.partition_D(cO)
        tOrO = cute.make_fragment_like(tOgO, self.dtype)
        cute.copy(s2g, tOsO, tOrO)
        for m in cutlass.range_constexpr(cute.size(tOgO.shape[1])):
            if tOcO[0, m, 0][0] < ctx.seq_q:
                cute.copy(s2g, tOrO[None, m, None], tOgO[None, m, None])


class _Fragments:
    """Shared-memory views and register fragments of the two GEMMs (a plain bag of tensors)."""

    def __init__(self, **tensors):
        self.__dict__.update(tensors)


class _BlockContext(_Fragments):
    """Everything one key-block step reads or updates."""


def _rows_by_cols(acc: cute.Tensor) -> cute.Tensor:
    """View an mma.sync C fragment ((2, 2), MMA_M, MMA_N) as (rows, cols) of this thread."""
    compact = cute.make_layout(acc.layout.shape)
    rows_cols = cute.make_layout(
        ((compact.shape[0][1], compact.shape[1]), (compact.shape[0][0], compact.shape[2])),
        stride=((compact.stride[0][1], compact.stride[1]), (compact.stride[0][0], compact.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, rows_cols))


Kernel = SdpaForwardMma
