"""Variable-length SDPA throughput: one frostc plan per mix (device-side lengths, packed form)
beside FlashAttention-4's varlen path (where installed) and torch SDPA's cuDNN backend with
every sequence padded to the longest, one run.

    python bench/varlen.py build                          # CPU machine: compile the plans into bench/.built
    python bench/varlen.py run [--md FILE] [--json FILE]  # GPU machine: time everything, print a table

Useful TFLOP/s count only the real lengths: 4·d·hq·Σ(visible (query, key) pairs) FLOPs, so
causal counts the lower triangle and a sliding window its band. Times are device times from
CUDA-graph replays (bench/common.py's `time_ms`); frostc's time is both of its launches (the
scheduling kernel and the attention kernel). frostc's output is checked against cuDNN's on
every mix before its time is reported. Also: all-equal lengths through the varlen path against
the dense plan of the same shape, and a sliding window of 4096 on one 16k sequence against the
dense causal kernel (TFLOP/s over the key blocks the window leaves).

FP8 rows: the same mix through an e4m3 packed plan (Q, K and V quantized on the device, one
descale per tensor, all (t, h, d); the plan re-lays V transposed into its workspace, a launch of
its own counted in its time), beside the bf16 packed plan on the same real inputs; its output is
checked against float32 attention on the dequantized inputs (relative L2 under 4 %, the GPU
tests' bound: e4m3's P rounding).
"""

import random
import sys
from dataclasses import dataclass

import common

HQ, HKV, D = 32, 8, 128
ISSUE_MIX = [37, 512, 1900, 128, 3000, 700, 64, 2048, 1024, 333, 4000, 90, 1500, 256, 800, 2500]


@dataclass(frozen=True)
class Mix:
    name: str
    lengths: tuple[int, ...]
    causal: bool
    window_left: int | None = None

    @property
    def plan(self) -> str:
        return f"varlen-{self.name}-{'causal' if self.causal else 'full'}"

    @property
    def fp8_plan(self) -> str:
        return f"{self.plan}-e4m3"


def _mixes() -> list[Mix]:
    rng = random.Random(9)
    short = tuple(rng.randint(16, 300) for _ in range(128))
    long_among_short = (8192,) + tuple(rng.randint(32, 256) for _ in range(31))
    out = []
    for causal in (False, True):
        out += [
            Mix("issue-16", tuple(ISSUE_MIX), causal),
            Mix("short-128", short, causal),
            Mix("long-among-short", long_among_short, causal),
            Mix("equal-8x2048", (2048,) * 8, causal),
        ]
    out.append(Mix("window4096-16k", (16384,), True, window_left=4095))
    return out


MIXES = _mixes()


def dense_plan(mix: Mix) -> str:
    """The dense plan an all-equal mix (or the window row) is compared with."""
    return f"dense-b{len(mix.lengths)}-s{mix.lengths[0]}-{'causal' if mix.causal else 'full'}"


def build() -> int:
    from frostc import GraphBuilder

    dense = {}
    for mix in MIXES:
        tokens, b = sum(mix.lengths), len(mix.lengths)
        g = GraphBuilder(mix.plan)
        for name, heads in (("q", HQ), ("k", HKV), ("v", HKV), ("o", HQ)):
            g.tensor(name, dtype="bf16", dims=(tokens, heads, D))
        g.tensor("cu_q", dtype="int32", dims=(b + 1,))
        g.tensor("cu_kv", dtype="int32", dims=(b + 1,))
        g.sdpa(q="q", k="k", v="v", o="o", cu_seqlens_q="cu_q", cu_seqlens_kv="cu_kv", max_seqlen_q=max(mix.lengths),
               max_seqlen_kv=max(mix.lengths), causal=mix.causal, window_left=mix.window_left)  # fmt: skip
        common.write_plan(common.BUILT / f"{mix.plan}.frost", g.build())
        common.write_plan(common.BUILT / f"{mix.fp8_plan}.frost", _fp8_description(mix))
        if len(set(mix.lengths)) == 1:
            dense[dense_plan(mix)] = (b, mix.lengths[0], mix.causal)
    for name, (b, s, causal) in dense.items():
        g = GraphBuilder(name)
        for t, heads in (("q", HQ), ("k", HKV), ("v", HKV), ("o", HQ)):
            g.tensor(t, dtype="bf16", dims=(b, heads, s, D), layout="bshd")  # the packed tensors' memory
        g.sdpa(q="q", k="k", v="v", o="o", causal=causal)
        common.write_plan(common.BUILT / f"{name}.frost", g.build())
    return 0


def _fp8_description(mix: Mix):
    from frostc import GraphBuilder

    tokens, b = sum(mix.lengths), len(mix.lengths)
    g = GraphBuilder(mix.fp8_plan)
    for name, heads in (("q", HQ), ("k", HKV), ("v", HKV)):
        g.tensor(name, dtype="e4m3", dims=(tokens, heads, D))
    g.tensor("o", dtype="bf16", dims=(tokens, HQ, D))
    g.tensor("cu_q", dtype="int32", dims=(b + 1,))
    g.tensor("cu_kv", dtype="int32", dims=(b + 1,))
    for role in ("q", "k", "v"):
        g.tensor(f"{role}_descale", dtype="fp32", dims=(1,))
    g.sdpa(q="q", k="k", v="v", o="o", cu_seqlens_q="cu_q", cu_seqlens_kv="cu_kv", max_seqlen_q=max(mix.lengths),
           max_seqlen_kv=max(mix.lengths), causal=mix.causal, window_left=mix.window_left, q_descale="q_descale",
           k_descale="k_descale", v_descale="v_descale")  # fmt: skip
    return g.build()


def useful_flops(mix: Mix) -> float:
    pairs = 0
    for n in mix.lengths:
        if mix.window_left is not None:  # causal band: row i sees min(i, left) + 1 keys
            w = mix.window_left
            pairs += sum(min(i, w) + 1 for i in range(n))
        elif mix.causal:
            pairs += n * (n + 1) // 2
        else:
            pairs += n * n
    return 4.0 * D * HQ * pairs


def block_flops(mix: Mix, block: int = 128) -> float:
    """FLOPs of the key blocks the kernel visits (128 x 128 tiles): the window row's measure."""
    blocks = 0
    for n in mix.lengths:
        for m in range(-(-n // block)):
            first, last = m * block, min(n, (m + 1) * block) - 1
            hi = last + 1 if mix.causal else n
            lo = max(0, first - mix.window_left) if mix.window_left is not None else 0
            blocks += -(-hi // block) - lo // block
    return 4.0 * D * HQ * blocks * block * block


def run(md=None, json_path=None) -> int:
    import frost_runtime

    fa4 = _fa4()
    rows = []
    for mix in MIXES:
        rows.append(_measure(frost_runtime, mix, fa4))
        print(_row(rows[-1]), flush=True)
    common.publish(_markdown(rows, common.machine(), fa4 is not None), rows, md, json_path)
    return 0


def _window_mask(n: int, left: int):
    import torch

    i = torch.arange(n, device="cuda")
    return (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - left)


def _fa4():
    try:
        from flash_attn.cute.interface import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def _measure(frost_runtime, mix: Mix, fa4) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, tokens, longest = len(mix.lengths), sum(mix.lengths), max(mix.lengths)
    q = torch.randn(tokens, HQ, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(tokens, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o = torch.empty_like(q)
    cu_list = [0]
    for n in mix.lengths:
        cu_list.append(cu_list[-1] + n)
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    plan = frost_runtime.load(common.BUILT / f"{mix.plan}.frost")
    bound = plan.bind(q, k, v, cu, cu, o, workspace=plan.allocate_workspace())
    times = {"frostc": common.time_ms(bound.execute)}

    # torch on the padded batch: every sequence padded to the longest, K and V heads repeated
    # for the query heads (cuDNN; the window row needs a mask, which takes the mem-efficient
    # backend). Padding is attended (that is what padding costs); the check below is per sequence.
    group = HQ // HKV
    padded = [torch.zeros(b, HQ, longest, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    for i, (start, n) in enumerate(zip(cu_list, mix.lengths)):
        for t, src in zip(padded, (q, k, v)):
            t[i, :, :n] = src[start : start + n].transpose(0, 1).repeat_interleave(HQ // src.shape[1], 0)
    mask, backend = None, SDPBackend.CUDNN_ATTENTION
    if mix.window_left is not None:
        mask = _window_mask(longest, mix.window_left)
        backend = SDPBackend.EFFICIENT_ATTENTION

    def torch_padded():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(*padded, attn_mask=mask, is_causal=mix.causal and mask is None)

    times["torch_padded"] = common.time_ms(torch_padded)
    padded.clear()  # free the padded copies before the next contestant

    o.fill_(float("nan"))
    bound.execute()
    torch.cuda.synchronize()
    err_sq = ref_sq = 0.0
    for start, n in zip(cu_list, mix.lengths):  # torch on each sequence alone: the reference
        qs = q[start : start + n].transpose(0, 1)[None]
        ks, vs = (x[start : start + n].transpose(0, 1).repeat_interleave(group, 0)[None] for x in (k, v))
        window = _window_mask(n, mix.window_left) if mix.window_left is not None else None
        want = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=window, is_causal=mix.causal and window is None)
        got = o[start : start + n].transpose(0, 1)[None]
        err_sq += float(((got.float() - want.float()) ** 2).sum())
        ref_sq += float((want.float() ** 2).sum())
    err = (err_sq / ref_sq) ** 0.5
    if not err < 2e-2:
        raise SystemExit(f"{mix.plan}: frostc differs from torch (relative error {err:.2e})")
    times["frostc_e4m3"], fp8_err = _measure_fp8(frost_runtime, mix, (q, k, v), cu_list)

    if fa4 is not None:
        window = (mix.window_left, 0) if mix.window_left is not None else (None, None)
        times["fa4"] = common.time_ms(
            lambda: fa4(
                q,
                k,
                v,
                cu_seqlens_q=cu,
                cu_seqlens_k=cu,
                max_seqlen_q=longest,
                max_seqlen_k=longest,
                causal=mix.causal,
                window_size=window,
            )  # fmt: skip
        )
    dense_flops = None
    if (common.BUILT / f"{dense_plan(mix)}.frost").exists():  # all-equal lengths: the dense plan of that shape
        dense = frost_runtime.load(common.BUILT / f"{dense_plan(mix)}.frost")
        s = mix.lengths[0]
        shaped = [x.view(b, s, x.shape[1], D).transpose(1, 2) for x in (q, k, v, o)]
        times["frostc_dense"] = common.time_ms(dense.bind(*shaped, workspace=dense.allocate_workspace()).execute)
        dense_flops = useful_flops(Mix("dense", mix.lengths, mix.causal))
    flops = useful_flops(mix)
    tflops = {name: flops / (ms * 1e-3) / 1e12 for name, ms in times.items()}
    if dense_flops is not None:
        tflops["frostc_dense"] = dense_flops / (times["frostc_dense"] * 1e-3) / 1e12
    if mix.window_left is not None:
        tflops["frostc_blocks"] = block_flops(mix) / (times["frostc"] * 1e-3) / 1e12
    return {"mix": mix.name, "plan": mix.plan, "causal": mix.causal, "sequences": b, "tokens": tokens,
            "rel_err": err, "fp8_err": fp8_err, "ms": times, "tflops": tflops,
            "torch_backend": backend.name}  # fmt: skip


def _measure_fp8(frost_runtime, mix: Mix, qkv: tuple, cu_list: list[int]) -> tuple[float, float]:
    """(ms, relative L2 against float32 attention on the dequantized inputs) of the packed e4m3
    plan on the same real inputs."""
    import torch
    import torch.nn.functional as F

    buffers = {}
    for role, x in zip("qkv", qkv):
        descale = (x.float().abs().amax() / 448.0).reshape(1)
        buffers[role], buffers[f"{role}_descale"] = (x.float() / descale).to(torch.float8_e4m3fn), descale
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    o = torch.full((sum(mix.lengths), HQ, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    buffers |= {"o": o, "cu_q": cu, "cu_kv": cu}
    plan = frost_runtime.load(common.BUILT / f"{mix.fp8_plan}.frost")
    bound = plan.bind(*(buffers[name] for name in plan.slots), workspace=plan.allocate_workspace())
    ms = common.time_ms(bound.execute)
    o.fill_(float("nan"))
    bound.execute()
    torch.cuda.synchronize()
    err_sq = ref_sq = 0.0
    group = HQ // HKV
    for start, n in zip(cu_list, mix.lengths):
        qd, kd, vd = (buffers[r][start : start + n].transpose(0, 1).float() * buffers[f"{r}_descale"] for r in "qkv")
        kd, vd = (x.repeat_interleave(group, 0) for x in (kd, vd))
        window = _window_mask(n, mix.window_left) if mix.window_left is not None else None
        causal = mix.causal and window is None
        want = F.scaled_dot_product_attention(qd[None], kd[None], vd[None], attn_mask=window, is_causal=causal)[0]
        err_sq += float(((o[start : start + n].transpose(0, 1).float() - want) ** 2).sum())
        ref_sq += float((want**2).sum())
    err = (err_sq / ref_sq) ** 0.5
    if not err < 4e-2:
        raise SystemExit(f"{mix.fp8_plan}: e4m3 differs from attention on its dequantized inputs ({err:.2e})")
    return ms, err


def _row(r) -> str:
    t = r["tflops"]
    cols = "  ".join(f"{k} {v:6.1f}" for k, v in t.items())
    return f"{r['plan']:34} {cols}"


def _markdown(rows, machine: str, have_fa4: bool) -> str:
    lines = [
        f"Variable-length SDPA forward, bf16, hq {HQ}, hkv {HKV}, d {D} — {machine}.",
        "Useful TFLOP/s (real lengths only) from CUDA-graph replays; frostc = scheduling + attention kernels;",
        "torch padded = SDPA on every sequence padded to the longest (cuDNN; the window row: a mask, mem-efficient).",
        "",
        "frostc e4m3 = the packed e4m3 plan on the same inputs, its V re-laid by a launch of its own (err e4m3:",
        "relative L2 against float32 attention on its dequantized inputs).",
        "",
        "| mix | causal | seqs | tokens | frostc | FA4 varlen | torch padded | frostc / FA4 | frostc / torch | err "
        "| frostc e4m3 | e4m3 / bf16 | err e4m3 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        t = r["tflops"]
        fa4 = t.get("fa4")
        vs_fa4 = f"{t['frostc'] / fa4:.2f}" if fa4 else "—"
        lines.append(
            f"| {r['mix']} | {'yes' if r['causal'] else 'no'} | {r['sequences']} | {r['tokens']} | {t['frostc']:.1f} | "
            f"{f'{fa4:.1f}' if fa4 else '—'} | {t['torch_padded']:.1f} | {vs_fa4} | "
            f"{t['frostc'] / t['torch_padded']:.2f} | {r['rel_err']:.1e} | {t['frostc_e4m3']:.1f} | "
            f"{t['frostc_e4m3'] / t['frostc']:.2f} | {r['fp8_err']:.1e} |"
        )
    lines.append("")
    for r in rows:
        t = r["tflops"]
        if "frostc_blocks" in t:
            dense = t.get("frostc_dense")
            lines.append(
                f"- {r['mix']}: {t['frostc_blocks']:.1f} TFLOP/s over the visited key blocks ({t['frostc']:.1f} useful)"
                + (
                    f"; the dense causal plan of that sequence: {dense:.1f} = {t['frostc_blocks'] / dense:.2f}"
                    if dense
                    else ""
                )
            )
        elif "frostc_dense" in t:
            lines.append(
                f"- {r['mix']} ({'causal' if r['causal'] else 'full'}): varlen {t['frostc']:.1f} vs dense plan "
                f"{t['frostc_dense']:.1f} TFLOP/s = {t['frostc'] / t['frostc_dense']:.2f}"
            )
    if not have_fa4:
        lines.append("- FlashAttention-4 was not installed in this run.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(common.main(__doc__, build, run))
