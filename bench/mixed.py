"""The mixed form (packed queries over a paged cache) where it stands: serving steps timed through
frostc's mixed plans beside the plans that serve the pure ends today (the paged decode plan for
pure-decode steps, the packed plan for pure-prefill steps), one run.

    python bench/mixed.py build                          # CPU machine: compile into bench/.built/mixed
    python bench/mixed.py run [--md FILE] [--json FILE]  # GPU machine: time everything, print a table
    MIXED_PLANS=DIR python bench/mixed.py run ...        # the plans of another build (an A/B)
    MIXED_ROWS=prefill,chunk python bench/mixed.py run  # only the rows whose name holds one of these (build too)

Shapes: bf16 q, hq 32, hkv 8, d 128 (Llama-3-8B), causal bottom-right per sequence, pages of 16
(vLLM's) or 128, each sequence's pages a shuffled draw from the pool. FlashAttention-4's
packed-over-paged call (`flash_attn_varlen_func` with `page_table`) joins every row where it is
importable (../shared/tools/fa4-peer). Two mixed plans per page
size: a decode bucket (as many query tokens as sequences, max_seqlen_q 1 or 4) and a serving
bucket (4096 query tokens, max_seqlen_q 4096: any mix); the serve-like decode rows also a step
bucket (as many query tokens as sequences, any mix: bench/serve.py's t64, whose decode-only steps
still launch the chunks' scheduling and forward kernels). Attention only: the step's rows are
already in the pages (the paged plans here have no kv_append either). Times are device times of
CUDA-graph replays (bench/common.py's `time_ms`); each contestant's O is checked against float32
on the gathered keys of four sequences before its time counts. TB/s counts the keys a step reads
(Σ len · hkv · d · 2 bytes · 2); TFLOP/s the (query, key) pairs the causal masks let through.
"""

import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import common

HQ, HKV, D = 32, 8, 128
SERVING_TOKENS = 4096
# MIXED_PLANS: another folder of the same plans (an earlier build, for an A/B in one device call)
OUT = Path(os.environ.get("MIXED_PLANS", common.BUILT / "mixed"))
FA4 = "FlashAttention-4"


@dataclass(frozen=True)
class Row:
    name: str
    page: int
    q_lens: tuple[int, ...]  # each sequence's query tokens this step
    kv_lens: tuple[int, ...]  # each sequence's keys, this step's included
    peer: str  # "paged" (the decode plan, equal query counts) | "packed" (fresh prompts) | ""
    cache: str = "bf16"  # the pages' dtype; "e4m3": per-KV-head scales, the same lengths as a bf16 twin row
    capacity: int = 0  # keys a sequence's page table holds at least (a serving set's bucket: its longest context)

    @property
    def profiled(self) -> bool:
        """Whether the row's time is also taken kernel by kernel: the pure-prefill steps, and the
        pairs of rows over bf16 and e4m3 pages (which kernel gains or loses from the halved bytes)."""
        return self.peer == "packed" or "pages" in self.name

    @property
    def batch(self) -> int:
        return len(self.q_lens)

    @property
    def max_pages(self) -> int:
        return -(-max(max(self.kv_lens), self.capacity) // self.page)


def _uniform(n: int, low: int, high: int, seed: str) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randint(low, high) for _ in range(n))


ROWS = [
    Row("decode b32 ctx 4k-12k p16", 16, (1,) * 32, _uniform(32, 4096, 12288, "d32"), "paged"),
    Row("decode b32 ctx 4k-12k p128", 128, (1,) * 32, _uniform(32, 4096, 12288, "d32"), "paged"),
    Row("decode b8 ctx 16k-48k p16", 16, (1,) * 8, _uniform(8, 16384, 49152, "d8"), "paged"),
    Row("speculative 256 x (1+3) ctx 2k-6k p16", 16, (4,) * 256, _uniform(256, 2048, 6144, "s"), "paged"),
    Row("prefill 2 x 1024 p16", 16, (1024, 1024), (1024, 1024), "packed"),
    # the same step over larger pages: a key block takes 128 // gcd(page, 128) boxes of K and of V
    Row("prefill 2 x 1024 p64", 64, (1024, 1024), (1024, 1024), "packed"),
    Row("prefill 2 x 1024 p256", 256, (1024, 1024), (1024, 1024), "packed"),
    Row("2k chunk + 63 decodes ctx 2k-32k p16", 16, (2048,) + (1,) * 63,
        (2048 + 8192,) + _uniform(63, 2048, 32768, "m"), ""),
    Row("8 chunks of 512 over 8k ctx p16", 16, (512,) * 8, (8192 + 512,) * 8, ""),
    # bench/serve.py's steps over a bf16 and an e4m3 pool (issue 42): 64 decodes over ~750 keys,
    # pages of 256; and chunks over their context
    Row("decode b64 ctx 600-900 p256 bf16 pages", 256, (1,) * 64, _uniform(64, 600, 900, "s64"), ""),
    Row("decode b64 ctx 600-900 p256 e4m3 pages", 256, (1,) * 64, _uniform(64, 600, 900, "s64"), "", "e4m3"),
    # the same decodes in plans of bench/serve.py's capacity (8,192 keys a sequence: 32 pages), which
    # set how a bucket splits the keys: what serve's t64 plan runs, against a decode-only plan
    Row("decode b64 ctx 600-900 p256 8k cap bf16 pages", 256, (1,) * 64, _uniform(64, 600, 900, "s64"), "",
        capacity=8192),
    Row("decode b64 ctx 600-900 p256 8k cap e4m3 pages", 256, (1,) * 64, _uniform(64, 600, 900, "s64"), "", "e4m3",
        capacity=8192),
    Row("8 chunks of 512 over 8k ctx p16 bf16 pages", 16, (512,) * 8, (8192 + 512,) * 8, ""),
    Row("8 chunks of 512 over 8k ctx p16 e4m3 pages", 16, (512,) * 8, (8192 + 512,) * 8, "", "e4m3"),
]  # fmt: skip


def _plans(row: Row) -> dict[str, tuple[str, int, int]]:
    """{contestant: (plan file, query tokens, max_seqlen_q)}; a paged plan's name holds its pool
    (pages of a sequence), so rows of one batch and bucket over other contexts take plans of their own."""
    decode_tokens = row.batch * max(row.q_lens)
    kv = "-kve4m3" if row.cache == "e4m3" else ""
    out = {}
    if row.peer == "paged" or row.peer == "":
        name = f"mixed-b{row.batch}-t{decode_tokens}-q{max(row.q_lens)}-p{row.page}x{row.max_pages}{kv}"
        out["mixed (decode bucket)"] = (name, decode_tokens, max(row.q_lens))
    if row.name.startswith("decode") and "pages" in row.name:
        # the continuous-batching set's bucket of the step's tokens (bench/serve.py's t64), in which
        # a chunk may come: its scheduling and forward launches run on a decode-only step too
        name = f"mixed-b{row.batch}-t{decode_tokens}-any-p{row.page}x{row.max_pages}{kv}"
        out["mixed (step bucket)"] = (name, decode_tokens, decode_tokens)
    if sum(row.q_lens) <= SERVING_TOKENS:
        name = f"mixed-b{row.batch}-t{SERVING_TOKENS}-p{row.page}x{row.max_pages}{kv}"
        out["mixed (serving bucket)"] = (name, SERVING_TOKENS, SERVING_TOKENS)
    if row.peer == "paged":
        out["paged decode plan"] = (
            f"paged-b{row.batch}-n{row.q_lens[0]}-p{row.page}x{row.max_pages}",
            0,
            row.q_lens[0],
        )
    if row.peer == "packed":
        out["packed plan"] = (f"packed-b{row.batch}-t{sum(row.q_lens)}", sum(row.q_lens), max(row.q_lens))
    if "chunk" in row.name:  # a decode bucket takes at most 4 queries a sequence
        out.pop("mixed (decode bucket)")
    return out


def _chosen_rows() -> list[Row]:
    """The rows whose name holds one of MIXED_ROWS' comma-separated pieces (all where it is
    unset), built and run alike."""
    pieces = os.environ.get("MIXED_ROWS", "").split(",")
    return [row for row in ROWS if any(piece in row.name for piece in pieces)]


def build() -> int:
    from frostc import GraphBuilder

    OUT.mkdir(parents=True, exist_ok=True)
    done = set()
    for row in _chosen_rows():
        pages = row.batch * row.max_pages
        for label, (name, tokens, longest) in _plans(row).items():
            if name in done:
                continue
            done.add(name)
            g = GraphBuilder(name)
            if label == "packed plan":
                for t, h in (("q", HQ), ("k", HKV), ("v", HKV), ("o", HQ)):
                    g.tensor(t, dtype="bf16", dims=(tokens, h, D))
                g.tensor("cu_q", dtype="int32", dims=(row.batch + 1,))
                g.sdpa(q="q", k="k", v="v", o="o", cu_seqlens_q="cu_q", cu_seqlens_kv="cu_q",
                       max_seqlen_q=longest, max_seqlen_kv=longest, causal=True)  # fmt: skip
            else:
                for t in ("k_cache", "v_cache"):
                    g.tensor(t, dtype=row.cache, dims=(pages, row.page, HKV, D))
                g.tensor("page_table", dtype="int32", dims=(row.batch, row.max_pages))
                g.tensor("cache_len", dtype="int32", dims=(row.batch,))
                paged = dict(k="k_cache", v="v_cache", page_table="page_table", seq_len_kv="cache_len", causal=True)
                if row.cache == "e4m3":  # one scale per KV head
                    for t in ("k_scale", "v_scale"):
                        g.tensor(t, dtype="fp32", dims=(HKV,))
                    paged |= {"k_scale": "k_scale", "v_scale": "v_scale"}
                if label == "paged decode plan":
                    for t in ("q", "o"):
                        g.tensor(t, dtype="bf16", dims=(row.batch, HQ, longest, D), layout="bshd")
                    g.sdpa(q="q", o="o", **paged)
                else:
                    for t in ("q", "o"):
                        g.tensor(t, dtype="bf16", dims=(tokens, HQ, D))
                    g.tensor("cu_q", dtype="int32", dims=(row.batch + 1,))
                    g.sdpa(q="q", o="o", cu_seqlens_q="cu_q", max_seqlen_q=longest, **paged)
            common.write_plan(OUT / f"{name}.frost", g.build())
    return 0


# ---------------------------------------------------------------------------- the GPU side


def _pairs(q_len: int, kv_len: int) -> int:
    """(query, key) pairs of a bottom-right causal sequence."""
    return sum(kv_len - q_len + t + 1 for t in range(q_len))


def _reference(q, k, v, q_lens, kv_lens, starts, table, page, count: int = 4):
    """float32 O of the first `count` sequences with queries: {b: (q_len, hq, d)}."""
    import torch
    import torch.nn.functional as F

    out = {}
    for b, (n, length) in enumerate(zip(q_lens, kv_lens)):
        if n == 0 or len(out) == count:
            continue
        ids = torch.tensor(table[b][: -(-length // page)], device="cuda")
        kk, vv = (c[ids].reshape(-1, HKV, D)[:length].transpose(0, 1).float() for c in (k, v))
        kk, vv = kk.repeat_interleave(HQ // HKV, 0)[None], vv.repeat_interleave(HQ // HKV, 0)[None]
        j, at = torch.arange(length, device="cuda")[None, :], torch.arange(n, device="cuda")[:, None] + length - n
        qb = q[starts[b] : starts[b] + n].transpose(0, 1)[None].float()
        out[b] = F.scaled_dot_product_attention(qb, kk, vv, attn_mask=j <= at)[0].transpose(0, 1)
    return out


def _measure(frost_runtime, row: Row, loaded: list) -> dict:
    """One row's contestants timed; its plans stay loaded (`loaded`, closed by `run`)."""
    import torch

    torch.manual_seed(0)
    pages = row.batch * row.max_pages
    k = torch.randn(pages, row.page, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(pages, row.page, HKV, D, device="cuda", dtype=torch.bfloat16)
    scales = None
    if row.cache == "e4m3":  # pages of e4m3 codes, per-KV-head scales; the reference reads their values
        scales = {n: torch.rand(HKV, device="cuda", dtype=torch.float32) * 0.5 + 0.75 for n in ("k_scale", "v_scale")}
        k = (k.float() / scales["k_scale"][:, None]).to(torch.float8_e4m3fn)
        v = (v.float() / scales["v_scale"][:, None]).to(torch.float8_e4m3fn)
    table = torch.randperm(pages, device="cuda").to(torch.int32).view(row.batch, row.max_pages)
    host_table = table.tolist()
    starts = [0]
    for n in row.q_lens:
        starts.append(starts[-1] + n)
    queries = torch.randn(sum(row.q_lens), HQ, D, device="cuda", dtype=torch.bfloat16)
    values = (k, v)
    if scales is not None:
        values = (k.float() * scales["k_scale"][:, None], v.float() * scales["v_scale"][:, None])
    want = _reference(queries, *values, row.q_lens, row.kv_lens, starts, host_table, row.page)
    element = 1 if row.cache == "e4m3" else 2
    result = {"row": row.name, "us": {}, "errors": {}, "kv_bytes": sum(row.kv_lens) * HKV * D * element * 2}
    result["flops"] = 4 * D * HQ * sum(_pairs(n, length) for n, length in zip(row.q_lens, row.kv_lens))
    for label, (name, tokens, _) in _plans(row).items():
        plan = frost_runtime.load(OUT / f"{name}.frost")
        buffers, o_rows = _buffers(label, row, tokens, queries, k, v, table, starts)
        buffers |= scales or {}
        bound = plan.bind(*[buffers[s] for s in plan.slots], workspace=plan.allocate_workspace())
        bound.execute()
        torch.cuda.synchronize()
        got = o_rows()
        err = max(float((got[b].float() - w).norm() / w.norm()) for b, w in want.items())
        result["errors"][label] = err
        result["us"][label] = common.time_ms(bound.execute) * 1000 if err < 2e-2 else None
        if row.profiled:  # where the step's time goes, kernel by kernel
            result.setdefault("kernels_us", {})[label] = _kernel_us(bound.execute)
        loaded.append(plan)
    fa4 = _fa4()
    if fa4 is not None and row.cache == "bf16":
        call = _fa4_call(fa4, row, queries, k, v, table, starts)
        out = call()
        got = out[0] if isinstance(out, tuple) else out
        err = max(float((got[starts[b] : starts[b + 1]].float() - w).norm() / w.norm()) for b, w in want.items())
        result["errors"][FA4] = err
        result["us"][FA4] = common.time_ms(call) * 1000 if err < 2e-2 else None
    return result


def _kernel_us(step, steps: int = 50) -> dict[str, float]:
    """Device µs a step of each kernel `step` launches (torch's profiler over `steps` eager calls;
    eager, so the gaps between launches are not in these figures: the graph-replayed total is)."""
    import torch
    from torch.profiler import ProfilerActivity

    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.removeprefix("frostc_")[:60]
            totals[name] = totals.get(name, 0.0) + (e.time_range.end - e.time_range.start) / steps
    return totals


def _fa4():
    try:
        from flash_attn.cute.interface import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def _fa4_call(fa4, row: Row, queries, k, v, table, starts):
    """FlashAttention-4's packed-over-paged call as engines make it: packed queries by
    cu_seqlens_q, each sequence's keys by seqused_k through the page table, host bounds given
    (no host read; graph-capturable)."""
    import torch

    cu = torch.tensor(starts, dtype=torch.int32, device="cuda")
    lens = torch.tensor(row.kv_lens, dtype=torch.int32, device="cuda")
    return lambda: fa4(
        queries, k, v, cu_seqlens_q=cu, max_seqlen_q=max(row.q_lens), max_seqlen_k=max(row.kv_lens),
        seqused_k=lens, page_table=table, causal=True,
    )  # fmt: skip


def _buffers(label: str, row: Row, tokens: int, queries, k, v, table, starts):
    """The contestant's buffers by slot name, and a function giving each sequence's O rows."""
    import torch

    total = sum(row.q_lens)
    lens = torch.tensor(row.kv_lens, dtype=torch.int32, device="cuda")
    if label == "paged decode plan":
        n = row.q_lens[0]
        q = queries.view(row.batch, n, HQ, D)
        o = torch.full_like(q, float("nan"))
        buffers = {"q": q.transpose(1, 2), "o": o.transpose(1, 2), "k_cache": k, "v_cache": v,
                   "page_table": table, "cache_len": lens}  # fmt: skip
        return buffers, lambda: {b: o[b] for b in range(row.batch)}
    q = torch.zeros(tokens, HQ, D, device="cuda", dtype=torch.bfloat16)
    q[:total] = queries
    o = torch.full_like(q, float("nan"))
    cu = torch.tensor(starts, dtype=torch.int32, device="cuda")
    if label == "packed plan":  # fresh prompts: the keys are the sequences' own rows, contiguous
        gathered = {}
        for name, cache in (("k", k), ("v", v)):
            rows = [
                cache[table[b][: -(-n // row.page)].long()].reshape(-1, HKV, D)[:n] for b, n in enumerate(row.kv_lens)
            ]
            gathered[name] = torch.cat(rows)
        buffers = {"q": q, "k": gathered["k"], "v": gathered["v"], "o": o, "cu_q": cu}
    else:
        buffers = {"q": q, "o": o, "k_cache": k, "v_cache": v, "page_table": table, "cache_len": lens, "cu_q": cu}
    return buffers, lambda: {b: o[starts[b] : starts[b + 1]] for b in range(row.batch)}


def run(md=None, json_path=None) -> int:
    import frost_runtime

    rows = _chosen_rows()
    # every plan stays loaded until the end: the profiler names kernels by their function
    # handles, which a closed plan's module hands on to the next plan's kernels (the kernel-by-
    # kernel table showed earlier plans' kernel names, 2026-12-07)
    loaded = []
    results = [_measure(frost_runtime, row, loaded) for row in rows]
    for plan in loaded:
        plan.close()
    lines = [f"# bench/mixed.py — {common.machine()}", "",
             "| step | contestant | µs | TB/s (keys) | TFLOP/s | rel. err | vs the pure-end plan | vs FA4 |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    failed = False
    for r in results:
        peers = [x for x in r["us"] if not x.startswith("mixed") and x != FA4]
        base = r["us"][peers[0]] if peers else None
        fa4 = r["us"].get(FA4)
        for label, us in r["us"].items():
            if us is None:
                failed = True
                lines.append(f"| {r['row']} | {label} | wrong | | | {r['errors'][label]:.1e} | | |")
                continue
            ours = label.startswith("mixed")
            ratio = f"{base / us:.2f}x" if base and ours else ""
            vs_fa4 = f"{fa4 / us:.2f}x" if fa4 and label != FA4 else ""
            tbs, tf = r["kv_bytes"] / us / 1e6, r["flops"] / us / 1e6
            err = r["errors"][label]
            lines.append(f"| {r['row']} | {label} | {us:.1f} | {tbs:.2f} | {tf:.0f} | {err:.1e} | {ratio} | {vs_fa4} |")
    lines += _kernel_lines(results)
    if _fa4() is None:
        lines += ["", "FlashAttention-4 not importable here: its rows are missing (../shared/tools/fa4-peer)."]
    common.publish("\n".join(lines), results, md, json_path)
    return 1 if failed else 0


def _kernel_lines(results: list[dict]) -> list[str]:
    """The profiled steps kernel by kernel (profiled eager calls: launch gaps not included)."""
    lines = ["", "Pure-prefill steps and the bf16/e4m3 pairs, kernel by kernel (µs a step, profiled eager calls):", "",
             "| step | contestant | kernel | µs |", "|---|---|---|---:|"]  # fmt: skip
    for r in results:
        for label, kernels in r.get("kernels_us", {}).items():
            for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                lines.append(f"| {r['row']} | {label} | {name} | {us:.1f} |")
    return lines


if __name__ == "__main__":
    sys.exit(common.main(__doc__, build, run))
