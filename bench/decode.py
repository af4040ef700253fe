"""Paged-KV decode throughput: one frostc plan per row (kv_append + attention over the paged
caches) beside FlashAttention-4's paged path (where installed) and torch SDPA on a gathered
dense cache, with this GPU's measured read ceiling, one run.

    python bench/decode.py build                          # CPU machine: compile into bench/.built
    python bench/decode.py run [--md FILE] [--json FILE]  # GPU machine: time everything, print a table

Rows: bf16 q, hq 32, hkv 8, d 128, a bf16 cache or an e4m3 one (one scale per kv head, amax /
448 of the row's data: the FP8 rows, beside the bf16 row of the same shape), the caches in
vLLM's NHD layout (pages, page, hkv, d) or, in the HND rows, (pages, hkv, page, d) in memory,
described with strides as the same dims; contexts uniform in
[mean/2, 3·mean/2] (seeded; the batch-1 row exactly 131072), pages of each sequence a shuffled
draw from the pool. The plans' capacity is max_pages = ceil(3·mean/2 / page) per sequence (batch
1: 131072 / page), the pool batch · max_pages pages. A frostc step is the whole plan,
`bound.execute()`: the append of this step's K/V rows, then the attention (split-KV plans:
partial results + combine). FlashAttention-4 appends nothing: its time is attention alone.
torch's time counts the gather of the pages into a dense (batch, hkv, longest, d) cache, the
length mask and SDPA.

Times are device times from CUDA-graph replays (bench/common.py's `time_ms`: 20 steps in one
graph, replayed to settle, then timed over a window of replays). TB/s counts the KV bytes a
step must read: Σ len · hkv · d · element bytes · 2 (K and V; e4m3: 1 byte; with a window, only
the keys a step's tokens see: min(len, window + s_new)). The ceiling is the fastest plain
read of a 4 GiB buffer in the same run (a torch reduction, which reads every byte once and
writes a scalar; bench/common.py's `read_ceiling`). frostc's O is checked against
float32 attention on the gathered cache before its time is reported; a row that fails prints
"wrong" and the run exits 1.
"""

import functools
import random
import sys
from dataclasses import dataclass

import common

HQ, HKV, D = 32, 8, 128
LONG = 131072
REPEATS = 20  # executes compared bit for bit after the timing (a race shows as a difference)


@dataclass(frozen=True)
class Row:
    batch: int
    mean: int  # contexts uniform in [mean/2, 3 mean/2]; batch 1: exactly LONG
    page: int
    s_new: int = 1
    causal: bool = False  # bottom-right (speculative tokens see the cache and each other in order)
    cache: str = "bf16"  # or "e4m3", with one float32 scale per kv head
    window: int | None = None  # window_left (causal): each token sees its last window + 1 keys (Mistral)
    heads_outer: bool = False  # the caches (pages, hkv, page, d) in memory: a head's rows of a page contiguous

    @property
    def cache_strides(self) -> tuple[int, int, int, int]:
        """The caches' strides as (pages, page, hkv, d) dims: vLLM's NHD, or HND with heads_outer."""
        if self.heads_outer:
            return (HKV * self.page * D, D, self.page * D, 1)
        return (self.page * HKV * D, HKV * D, D, 1)

    @property
    def max_pages(self) -> int:
        return LONG // self.page if self.batch == 1 else -(-(3 * self.mean // 2) // self.page)

    @property
    def pages(self) -> int:
        return self.batch * self.max_pages

    @property
    def plan(self) -> str:
        name = f"decode-b{self.batch}-ctx{self.mean}-p{self.page}-n{self.s_new}{'-causal' if self.causal else ''}"
        name += "" if self.window is None else f"-w{self.window}"
        name += "-hnd" if self.heads_outer else ""
        return name + ("" if self.cache == "bf16" else f"-kv_{self.cache}")

    @property
    def element_bytes(self) -> int:
        return 1 if self.cache == "e4m3" else 2

    def lengths(self) -> list[int]:
        if self.batch == 1:
            return [LONG]
        rng = random.Random(f"{self.batch}-{self.mean}")  # the same contexts at every page size
        return [rng.randint(self.mean // 2, 3 * self.mean // 2) for _ in range(self.batch)]


ROWS = [
    Row(32, 8192, 128),
    Row(32, 8192, 16),
    Row(8, 32768, 128),
    Row(128, 2048, 128),
    Row(1, LONG, 128),
    Row(32, 8192, 128, s_new=4, causal=True),  # speculative decoding: 4 tokens per step
    Row(32, 8192, 128, causal=True, window=4095),  # Mistral-7B's window: only the last 4096 keys are read
    Row(32, 8192, 128, cache="e4m3"),  # an FP8 cache: half the bytes per token
    Row(8, 32768, 128, cache="e4m3"),
    # the layout's share: each KV head's rows of a page contiguous (vLLM/FlashInfer's HND)
    Row(32, 8192, 128, heads_outer=True),
    Row(32, 8192, 128, cache="e4m3", heads_outer=True),
    Row(8, 32768, 128, heads_outer=True),  # issue 20's second FP8 decode shape, HND too
    Row(8, 32768, 128, cache="e4m3", heads_outer=True),
]


def build() -> int:
    from frostc import GraphBuilder

    for row in ROWS:
        b, n = row.batch, row.s_new
        g = GraphBuilder(row.plan)
        g.tensor("q", dtype="bf16", dims=(b, HQ, n, D), layout="bshd")
        g.tensor("k_new", dtype="bf16", dims=(b, HKV, n, D), layout="bshd")
        g.tensor("v_new", dtype="bf16", dims=(b, HKV, n, D), layout="bshd")
        g.tensor("k_cache", dtype=row.cache, dims=(row.pages, row.page, HKV, D), strides=row.cache_strides)
        g.tensor("v_cache", dtype=row.cache, dims=(row.pages, row.page, HKV, D), strides=row.cache_strides)
        scales = {}
        if row.cache != "bf16":
            scales = {"k_scale": g.tensor("k_scale", dtype="fp32", dims=(HKV,)),
                      "v_scale": g.tensor("v_scale", dtype="fp32", dims=(HKV,))}  # fmt: skip
        g.tensor("page_table", dtype="int32", dims=(b, row.max_pages))
        g.tensor("cache_len", dtype="int32", dims=(b,))
        g.tensor("o", dtype="bf16", dims=(b, HQ, n, D), layout="bshd")
        g.node("kv_append", name="append", k="k_new", v="v_new", k_cache="k_cache", v_cache="v_cache",
               page_table="page_table", seq_len_kv="cache_len", **scales)  # fmt: skip
        g.sdpa(name="attn", q="q", k="k_cache", v="v_cache", o="o", page_table="page_table", seq_len_kv="cache_len",
               causal=row.causal or None, window_left=row.window, **scales)  # fmt: skip
        common.write_plan(common.BUILT / f"{row.plan}.frost", g.build())
    return 0


# ---------------------------------------------------------------------------- the GPU side


def _fa4():
    """FlashAttention-4's paged entry where importable (../shared/tools/fa4-peer), else the reason."""
    try:
        from flash_attn.cute.interface import _flash_attn_fwd
    except Exception as exc:  # ImportError, or the DSL failing to import on this machine
        return None, f"{type(exc).__name__}: {exc}"
    return _flash_attn_fwd, None


def _mask(lens, n: int, keys: int, causal: bool, window: int | None = None):
    """(b, 1, n, keys) bool from the device lengths: key j of sequence b is seen by query t when
    j < len (and j <= len - n + t when causal, and j >= len - n + t - window with a window)."""
    import torch

    j = torch.arange(keys, device="cuda")[None, None, None, :]
    end = lens.long()[:, None, None, None]
    seen = j < end
    t = torch.arange(n, device="cuda")[None, None, :, None]
    if causal:
        seen = seen & (j <= end - n + t)
    if window is not None:
        seen = seen & (j >= end - n + t - window)
    return seen


def _reference(row: Row, q, k_cache, v_cache, table: list[list[int]], lens: list[int]):
    """float32 attention of each sequence on its gathered cache: (b, n, hq, d) like q."""
    import torch
    import torch.nn.functional as F

    out = torch.empty(q.shape, dtype=torch.float32, device="cuda")
    n, group = row.s_new, HQ // HKV
    for b, length in enumerate(lens):
        ids = torch.tensor(table[b][: -(-length // row.page)], device="cuda")
        k, v = (c[ids].reshape(-1, HKV, D)[:length].transpose(0, 1).float() for c in (k_cache, v_cache))
        k, v = k.repeat_interleave(group, 0)[None], v.repeat_interleave(group, 0)[None]
        mask = None
        if row.causal:
            j, at = torch.arange(length, device="cuda")[None, :], torch.arange(n, device="cuda")[:, None] + length - n
            mask = j <= at
            if row.window is not None:
                mask &= j >= at - row.window
        qb = q[b].transpose(0, 1)[None].float()  # (1, hq, n, d)
        out[b] = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask)[0].transpose(0, 1)
    return out


def _rel_err(got, want) -> float:
    return float((got.float() - want).norm() / want.norm())


def _measure(frost_runtime, row: Row, fa4, ceiling: float) -> dict:
    import torch
    import torch.nn.functional as F

    b, n, P = row.batch, row.s_new, row.page
    lens = row.lengths()
    torch.manual_seed(0)
    t = {
        "q": torch.randn(b, n, HQ, D, device="cuda", dtype=torch.bfloat16),  # physical bshd
        "k_new": torch.randn(b, n, HKV, D, device="cuda", dtype=torch.bfloat16),
        "v_new": torch.randn(b, n, HKV, D, device="cuda", dtype=torch.bfloat16),
        "k_cache": _cache(row),
        "v_cache": _cache(row),
        "page_table": torch.randperm(row.pages, device="cuda").to(torch.int32).view(b, row.max_pages),  # shuffled
        "cache_len": torch.tensor(lens, dtype=torch.int32, device="cuda"),
        "o": torch.empty(b, n, HQ, D, device="cuda", dtype=torch.bfloat16),
    }
    if row.cache == "e4m3":  # quantized with one scale per kv head: amax / 448
        for name in ("k", "v"):
            real = t[f"{name}_cache"]
            t[f"{name}_scale"] = real.float().abs().amax(dim=(0, 1, 3)) / 448.0
            quantized = torch.empty_like(real, dtype=torch.float8_e4m3fn)  # the same strides
            quantized.copy_(real.float() / t[f"{name}_scale"].view(1, 1, HKV, 1))
            t[f"{name}_cache"] = quantized
            del real
    logical = {name: t[name].transpose(1, 2) for name in ("q", "k_new", "v_new", "o")}  # (b, h, n, d)
    table = t["page_table"].tolist()
    seen = [min(x, row.window + n) if row.window is not None else x for x in lens]  # the keys a step must read
    kv_bytes = sum(seen) * HKV * D * row.element_bytes * 2
    result = {"row": row.plan, "batch": b, "mean": row.mean, "page": P, "s_new": n, "causal": row.causal,
              "cache": row.cache, "heads_outer": row.heads_outer, "window": row.window, "lengths": lens,
              "kv_bytes": kv_bytes, "us": {},
              "errors": {}}  # fmt: skip

    plan = frost_runtime.load(common.BUILT / f"{row.plan}.frost")
    result["launches"] = [launch.node for launch in plan.data.launches]
    bound = plan.bind(*[logical.get(name, t.get(name)) for name in plan.slots], workspace=plan.allocate_workspace())
    t["o"].fill_(float("nan"))
    bound.execute()
    torch.cuda.synchronize()
    caches = [t["k_cache"], t["v_cache"]]  # after the append; an e4m3 one dequantized
    if row.cache == "e4m3":
        caches = [c.float() * t[f"{x}_scale"].view(1, 1, HKV, 1) for c, x in zip(caches, "kv")]
    want = _reference(row, t["q"], *caches, table, lens)
    del caches
    result["errors"]["frostc"] = err = _rel_err(t["o"], want)
    if not err < 2e-2:
        result["wrong"] = True
        plan.close()
        return result
    result["us"]["frostc"] = common.time_ms(bound.execute) * 1e3
    result["repeats_differing"] = _repeats_differing(bound, t["o"])
    if result["repeats_differing"]:
        result["wrong"] = True
    if row.cache != "bf16":  # no peer reads an FP8 paged cache on this GPU (FA4's sm90 path has none)
        result["tb_s"] = {"frostc": kv_bytes / (result["us"]["frostc"] * 1e-6) / 1e12}
        result["of_ceiling"] = kv_bytes / (result["us"]["frostc"] * 1e-6) / ceiling
        plan.close()
        return result

    if fa4 is not None:  # attention alone: FlashAttention-4 has no append
        window = {} if row.window is None else {"window_size_left": row.window, "window_size_right": 0}
        fa4_call = functools.partial(fa4, t["q"], t["k_cache"], t["v_cache"], seqused_k=t["cache_len"],
                                     page_table=t["page_table"], causal=row.causal, **window)  # fmt: skip
        try:
            out = fa4_call()  # the first call JIT-compiles (seconds): a warm-up outside the timing
            out = out[0] if isinstance(out, tuple) else out
            torch.cuda.synchronize()
            result["errors"]["fa4"] = _rel_err(out, want)
            result["us"]["fa4"] = common.time_ms(fa4_call) * 1e3
        except Exception as exc:  # reported in its column; the row goes on
            result["fa4_failed"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    # torch: gather every sequence's pages (up to the longest) into a dense cache, mask, SDPA
    keys_pages = -(-max(lens) // P)
    ids = t["page_table"][:, :keys_pages]

    def torch_gathered(gqa: bool):
        def call():
            k, v = (c[ids].reshape(b, keys_pages * P, HKV, D).transpose(1, 2) for c in (t["k_cache"], t["v_cache"]))
            if not gqa:
                k, v = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
            mask = _mask(t["cache_len"], n, keys_pages * P, row.causal, row.window)
            return F.scaled_dot_product_attention(logical["q"], k, v, attn_mask=mask, enable_gqa=gqa)

        return call

    for gqa in (True, False):
        try:
            out = torch_gathered(gqa)()
            torch.cuda.synchronize()
            result["errors"]["torch"] = _rel_err(out.transpose(1, 2), want)
            result["us"]["torch"] = common.time_ms(torch_gathered(gqa)) * 1e3
            result["torch_form"] = "enable_gqa" if gqa else "repeated heads"
            break
        except Exception as exc:  # enable_gqa with a mask may be refused: repeat the heads instead
            result["torch_failed"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            torch.cuda.synchronize()
    if "torch" in result["us"]:
        result.pop("torch_failed", None)
    result["tb_s"] = {name: kv_bytes / (us * 1e-6) / 1e12 for name, us in result["us"].items()}
    result["of_ceiling"] = kv_bytes / (result["us"]["frostc"] * 1e-6) / ceiling
    plan.close()
    return result


def _cache(row: Row):
    """A random bf16 cache, (pages, page, hkv, d) with the row's strides."""
    import torch

    if row.heads_outer:
        return torch.randn(row.pages, HKV, row.page, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    return torch.randn(row.pages, row.page, HKV, D, device="cuda", dtype=torch.bfloat16)


def _repeats_differing(bound, o, repeats: int = REPEATS) -> int:
    """How many of `repeats` more executes give an output not bit for bit the one before (a
    step's appends are idempotent: the same inputs every time; the kernels have no atomics, so
    any difference is a race)."""
    import torch

    differing = 0
    for _ in range(repeats):
        before = o.clone()
        bound.execute()
        differing += not torch.equal(before, o)
    return differing


def run(md=None, json_path=None) -> int:
    import frost_runtime
    import torch

    fa4, fa4_missing = _fa4()
    ceiling = common.read_ceiling()
    torch.cuda.empty_cache()  # the 4 GiB buffer
    print(f"read ceiling: {ceiling['bytes_per_s'] / 1e12:.2f} TB/s ({ceiling['how']})", flush=True)
    rows = []
    for row in ROWS:
        rows.append(_measure(frost_runtime, row, fa4, ceiling["bytes_per_s"]))
        torch.cuda.empty_cache()  # the row's caches
        print(_line(rows[-1]), flush=True)
    table = _markdown(rows, ceiling, common.machine(), fa4_missing)
    common.publish(table, {"ceiling": ceiling, "rows": rows}, md, json_path)
    return 1 if any(r.get("wrong") for r in rows) else 0


def _line(r: dict) -> str:
    if r.get("repeats_differing"):
        return f"{r['row']:34} WRONG: {r['repeats_differing']} of {REPEATS} repeated executes differed in bits"
    if r.get("wrong"):
        return f"{r['row']:34} WRONG: relative error {r['errors']['frostc']:.2e}"
    return f"{r['row']:34} " + "  ".join(f"{k} {v:8.1f} µs" for k, v in r["us"].items())


def _markdown(rows, ceiling: dict, machine: str, fa4_missing: str | None) -> str:
    top = ceiling["bytes_per_s"] / 1e12
    lines = [
        f"Paged-KV decode, bf16 q, hq {HQ}, hkv {HKV}, d {D} — {machine}.",
        "µs per step from CUDA-graph replays (20 steps per graph, settled, then a timed window); TB/s = KV bytes read "
        "(Σ len · hkv · d · element bytes · 2) per second.",
        f"Read ceiling in this run: {top:.2f} TB/s ({ceiling['how']}); device copy (read + write counted): "
        f"{ceiling['copy_read_plus_write'] / 1e12:.2f} TB/s.",
        "frostc = kv_append + attention (the whole plan); FA4 = FlashAttention-4 paged attention alone (no append); "
        "torch = gather pages to a dense cache + length mask + SDPA (gather counted).",
        "",
        "| batch | mean ctx | page | s_new | cache | launches | frostc µs | frostc TB/s | % of ceiling | FA4 µs "
        "| FA4 TB/s | frostc / FA4 | torch µs | frostc / torch | err |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_plan = {r["row"]: r for r in rows}
    for r in rows:
        causal = (" causal" if r["causal"] else "") + (f" window {r['window']}" if r.get("window") is not None else "")
        head = f"| {r['batch']} | {r['mean']} | {r['page']} | {r['s_new']}{causal} | "
        head += f"{r['cache']}{' HND' if r.get('heads_outer') else ''} | {len(r['launches'])} | "
        if r.get("repeats_differing"):
            lines.append(head + f"wrong ({r['repeats_differing']} of {REPEATS} repeats differ) | | | | | | | | |")
        elif r.get("wrong"):
            lines.append(head + f"wrong (rel. err {r['errors']['frostc']:.1e}) | | | | | | | | |")
            continue
        us, tb = r["us"], r["tb_s"]
        if r["cache"] != "bf16":
            lines.append(
                head + f"{us['frostc']:.1f} | {tb['frostc']:.2f} | {100 * r['of_ceiling']:.0f} % | no FP8 cache | — "
                f"| — | no FP8 cache | — | {r['errors']['frostc']:.1e} |"
            )
            continue
        if "fa4" in us:
            fa4_cells = f"{us['fa4']:.1f} | {tb['fa4']:.2f} | {us['fa4'] / us['frostc']:.2f}"
        else:
            why = "not installed" if fa4_missing else f"failed: {r.get('fa4_failed', '?')}"
            fa4_cells = f"{why} | — | —"
        if "torch" in us:
            torch_cells = f"{us['torch']:.1f} | {us['torch'] / us['frostc']:.2f}"
        else:
            torch_cells = f"failed: {r.get('torch_failed', '?')} | —"
        lines.append(
            head + f"{us['frostc']:.1f} | {tb['frostc']:.2f} | {100 * r['of_ceiling']:.0f} % | {fa4_cells} | "
            f"{torch_cells} | {r['errors']['frostc']:.1e} |"
        )
    lines += [
        "",
        "- frostc / FA4 and frostc / torch are speed ratios (their time over frostc's: above 1, frostc is faster);",
        "  launches = the plan's kernel launches per step (append, attention, and a combine when split-KV).",
        f"- Every row's plan also ran {REPEATS} more times after the timing, each output bit for bit the one before.",
        "- e4m3 rows: err is against attention on the dequantized cache (the kernel's own error, not the",
        "  quantization's: tests/gpu/test_fp8_cache.py bounds that).",
        "- HND: the caches hold (pages, hkv, page, d) in memory (described with strides as (pages, page, hkv, d)), so",
        "  a KV head's rows of a page are one contiguous run; the other rows: (pages, page, hkv, d), vLLM's NHD.",
    ]
    for r in rows:
        twin = by_plan.get(
            Row(r["batch"], r["mean"], r["page"], r["s_new"], r["causal"], heads_outer=r["heads_outer"]).plan
        )
        if r["cache"] != "bf16" and not r.get("wrong") and twin and not twin.get("wrong"):
            lines.append(
                f"- e4m3 cache{' (HND)' if r['heads_outer'] else ''}, batch {r['batch']}, mean context {r['mean']}: "
                f"{r['us']['frostc']:.1f} µs against the "
                f"bf16 cache's {twin['us']['frostc']:.1f} µs: {twin['us']['frostc'] / r['us']['frostc']:.2f}x the "
                f"tokens per second, {100 * r['of_ceiling']:.0f} % of the read ceiling in bytes."
            )
    if fa4_missing:
        lines.append(f"- FlashAttention-4 was not installed in this run ({fa4_missing}).")
    forms = {r.get("torch_form") for r in rows if r.get("torch_form")}
    if forms:
        lines.append(f"- torch SDPA form: {', '.join(sorted(forms))}; backend chosen by torch (a boolean mask).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(common.main(__doc__, build, run))
