"""transformers' continuous batching (`model.generate_batch`) on a Llama-3-8B-shaped model with
frostc's mixed plans as its attention, beside FlashAttention-4 and sdpa in the same run (issue 42).

    python bench/serve.py build      # CPU machine: the mixed plan set, into bench/.built/serve
    python bench/serve.py run [--requests 64,256] [--attn frostc,flash_attention_4,sdpa,frostc-fused,frostc-fused-e4m3]
                              [--profile] [--md FILE] [--json FILE]     # GPU machine

The job (issue 42's): Llama-3-8B's shapes, random bf16 weights (no Hub); N requests of random token
ids whose prompt lengths are log-normal (median ~450, at most 4096: 64 requests hold ~44k prompt
tokens); 128 greedy new tokens each (no end token, so every request generates all of them). Every
attention runs under one `ContinuousBatchingConfig` (pages of 256 tokens, a pool of 512 blocks,
8192 tokens a step: transformers' default step budget); graphs and async batching as transformers
decides them for the attention (on for the mask-free kinds: frostc and FlashAttention-4; off for
sdpa). frostc's set holds one mixed plan per token bucket (64 to 8192: transformers pads a step's
queries to a multiple of 64 under graphs), and the glue plans (RMSNorm, the add before it, SiLU's
product) of those buckets' rows: `frostc-fused` is frostc's attention in hf_fuse's fused decoder
layers, whose norms and activation run through them.

Per attention and request count: the wall of the first call (plans loaded, graphs captured, JIT
for FlashAttention-4) and of a warm second call; generated and total tokens/s; how frostc's calls
were served. The job's floor: its prefill FLOPs over the bf16 GEMM rate measured in the run, plus
128 steps that each read the weights at the read ceiling measured in the run. `--profile` adds a
profile of a warm 64-request call per attention: GPU time by kernel family and the idle share.
FlashAttention-4 joins where `flash_attn.cute` imports (../shared/tools/fa4-peer).
"""

from __future__ import annotations

import datetime
import math
import random
import sys
import time
from collections import Counter

import common

BUILT = common.BUILT / "serve"
SET = BUILT / "llama3-8b-cb.frostset"
SET_E4M3 = BUILT / "llama3-8b-cb-e4m3.frostset"  # the same over an e4m3 pool (frostc's per-head scales)

PAGE = 256  # ContinuousBatchingConfig.page_size (transformers' default)
BLOCKS = 512  # num_blocks: 131,072 tokens of pool, 16 GiB for this shape
STEP_TOKENS = 8192  # max_batch_tokens: transformers' default
BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, STEP_TOKENS)
NEW_TOKENS = 128
MEDIAN_PROMPT, SIGMA, LONGEST = 500, 0.92, 4096  # 64 requests: 43.9k prompt tokens, median 451
# frostc-fused: frostc's attention with hf_fuse's fused layers and the set's glue plans for the token
# buckets; it changes the model in place, so it runs after the others; frostc-fused-e4m3: the same
# fused layers, the pool in e4m3 (half the bytes of K/V read and written)
ATTENTIONS = ("frostc", "flash_attention_4", "sdpa", "frostc-fused", "frostc-fused-e4m3")


def config() -> dict:
    from tests.model_configs import LLAMA3_8B

    return LLAMA3_8B


# ---------------------------------------------------------------------------- build (CPU)


def build() -> int:
    from frostc.buildset import build_set
    from frostc.models import read_layers, read_model
    from frostc.planfile import write_atomic
    from frostc.serving import CB_MAX_REQUESTS, ContinuousBatching, deployment

    BUILT.mkdir(parents=True, exist_ok=True)
    model = read_model(config())
    cb = ContinuousBatching(BUCKETS, CB_MAX_REQUESTS, BLOCKS)  # with the glue plans of its token buckets
    for path, kv in ((SET, None), (SET_E4M3, "e4m3")):
        dep = deployment(
            model, batch_sizes=(1,), page_size=PAGE, cb=cb, glue=read_layers(config()), kv_cache_dtype=kv,
            qkv_layout="fused",  # frostc-fused's layers pass q, k, v as views of their QKV GEMM's output
        )  # fmt: skip
        start = time.perf_counter()
        result = build_set(model, dep, name=path.stem, phases=("mixed",))
        write_atomic(path, result.data)
        print(f"{path.name}: {result.plans} plans, {len(result.data):,} bytes ({time.perf_counter() - start:.1f} s)")
    return 0


# ---------------------------------------------------------------------------- the job


def prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Log-normal prompt lengths (median MEDIAN_PROMPT, at most LONGEST) of random token ids."""
    rng = random.Random(seed)
    lengths = [min(LONGEST, max(8, round(rng.lognormvariate(math.log(MEDIAN_PROMPT), SIGMA)))) for _ in range(count)]
    return [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths]


def floor_s(prompt_lengths: list[int], gemm_flops: float, read_bytes_per_s: float, weight_bytes: int) -> float:
    """The job's floor: the prefill's FLOPs (weights and causal attention) at the GEMM rate, plus
    NEW_TOKENS steps that each read every weight at the read ceiling."""
    c = config()
    layers, head_dim = c["num_hidden_layers"], c["hidden_size"] // c["num_attention_heads"]
    weight_flops = 2 * (weight_bytes // 2) * sum(prompt_lengths)
    attention_flops = sum(2 * 2 * c["num_attention_heads"] * head_dim * n * n / 2 * layers for n in prompt_lengths)
    return (weight_flops + attention_flops) / gemm_flops + NEW_TOKENS * weight_bytes / read_bytes_per_s


def _model():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config().items() if k not in ("model_type", "torch_dtype", "architectures")}
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **fields), dtype=torch.bfloat16)
    return model.eval()


def _cb_config():
    from transformers.generation import ContinuousBatchingConfig

    return ContinuousBatchingConfig(
        page_size=PAGE, num_blocks=BLOCKS, max_batch_tokens=STEP_TOKENS, max_memory_percent=0.9,
        auto_switch_to_flash=False,
    )  # fmt: skip


def _generation():
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1)


def _job(model, inputs, keep: bool = False) -> tuple[float, int]:
    """One generate_batch call: its wall (s) and the tokens it generated. `keep`: the manager (its
    pool and CUDA graphs) is kept on the model for the next call (`persistent_manager`), which
    then captures nothing."""
    import gc

    import torch

    gc.collect()  # the previous call's pool: transformers sizes its own from the memory torch holds
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate_batch(
        inputs, generation_config=_generation(), continuous_batching_config=_cb_config(), persistent_manager=keep
    )
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    generated = sum(len(o.generated_tokens) for o in out.values())
    if len(out) != len(inputs) or generated != len(inputs) * NEW_TOKENS:
        raise RuntimeError(f"{len(out)} of {len(inputs)} requests answered, {generated} tokens generated")
    return wall, generated


def _use(model, attention: str):
    """Switch `model` to `attention`; frostc's object (its call counts) or None."""
    import frost_runtime
    from frost_runtime.hf import continuous

    if not attention.startswith("frostc"):
        model.set_attn_implementation(attention)
        return None
    plans = frost_runtime.read_set(SET_E4M3 if attention.endswith("e4m3") else SET)
    if attention.startswith("frostc-fused") and not hasattr(model.model.norm, "frostc_glue"):
        from frost_runtime import hf_fuse

        hf_fuse.fuse_layers(model, plans)  # once: both sets' glue plans are the same
    cb = continuous.install(model, plans)
    start = time.perf_counter()
    loaded = cb.executor.preload()
    print(f"frostc: {loaded} mixed plans loaded in {time.perf_counter() - start:.2f} s", flush=True)
    return cb


def available(attention: str) -> str | None:
    """Why `attention` cannot run here, or None."""
    if attention == "flash_attention_4":
        try:
            import flash_attn.cute  # noqa: F401
        except ImportError as exc:
            return f"flash_attn.cute does not import ({exc}): ../shared/tools/fa4-peer"
    wanted = SET_E4M3 if attention.endswith("e4m3") else SET
    if attention.startswith("frostc") and not wanted.exists():
        return f"{wanted} is not built: python bench/serve.py build"
    return None


# ---------------------------------------------------------------------------- the profile

FAMILIES = (  # (family, substrings of a kernel's name, lower case), first match wins
    ("attention", ("frostc_sdpa", "flash", "fmha", "attention", "sdpa", "cudnn")),
    # frostc's kv_append is the pool write transformers' own `update` does with index_copy_ for FA4
    (
        "K/V gathers and copies",
        ("frostc_kv_append", "index", "gather", "scatter", "copy", "cat", "memcpy", "memset", "fill"),
    ),  # fmt: skip
    ("GEMMs", ("gemm", "gemv", "nvjet", "xmma", "cutlass", "cublas", "sm90_", "splitk")),
    # frostc's glue plans (frostc_rms_norm, frostc_add_rms_norm, frostc_silu_mul) among them
    ("norms, activations, elementwise", ("elementwise", "reduce", "norm", "silu", "softmax", "rsqrt", "pow", "mul")),
)


def family(name: str) -> str:
    lower = name.lower()
    return next((f for f, keys in FAMILIES if any(k in lower for k in keys)), "other")


def profile(model, inputs) -> dict:
    """GPU time by kernel family over one warm call, and the share of its wall the GPU was idle."""
    import torch
    from torch.profiler import ProfilerActivity

    with torch.profiler.profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        wall, _ = _job(model, inputs)
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    by_family: Counter[str] = Counter()
    top: Counter[str] = Counter()
    spans = []
    for e in kernels:
        us = e.time_range.end - e.time_range.start
        by_family[family(e.name)] += us / 1e6
        top[e.name[:90]] += us / 1e6
        spans.append((e.time_range.start, e.time_range.end, family(e.name)))
    busy = _union_s([(a, b) for a, b, _ in spans])
    return {
        "wall_s": wall,
        "gpu_busy_s": busy,
        "idle_share": max(0.0, 1 - busy / wall),
        "families_s": dict(by_family.most_common()),
        "busy_families_s": busy_by_family(spans),
        "top_kernels_s": dict(top.most_common(12)),
        # the kernels of the two families issue 42's bar sums, named (its K/V copies are matched by
        # substrings such as "copy" and "cat", which other elementwise kernels share)
        "attention_path_kernels_s": {
            f: dict(Counter({n: t for n, t in top.items() if family(n) == f}).most_common(6))
            for f in ("attention", "K/V gathers and copies")
        },
        "runtime_calls": runtime_calls(events),
    }


def runtime_calls(events) -> dict[str, dict]:
    """The host's CUDA runtime and driver calls (cudaGraphLaunch, cudaLaunchKernel, syncs, copies):
    count and host seconds of the 8 costliest: where a forward's host time goes, and any sync in it."""
    import torch

    seconds: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith(("cuda", "cu")):
            seconds[e.name] += (e.time_range.end - e.time_range.start) / 1e6
            count[e.name] += 1
    return {name: {"calls": count[name], "s": s} for name, s in seconds.most_common(8)}


# transformers' generation thread, step by step (5.23, generation/continuous_batching): what a phase
# is called here, and the methods it is (class path, method); async batching has IOs of its own
_IOS = ("input_outputs.ContinuousBatchingIOs", "input_outputs.ContinuousBatchingAsyncIOs")
HOST_PHASES = (
    ("schedule the next step", (("continuous_api.ContinuousBatchProcessor", "prepare_next_batch"),)),
    ("the step's inputs to the device", tuple((io, "get_model_kwargs") for io in _IOS)),
    ("forward: launch or graph replay", (("model_runner.ModelRunner", "compute_batch"),)),
    ("wait for the previous step's tokens", tuple((io, "prepare_batch_update") for io in _IOS)),
    ("update the requests", (("continuous_api.ContinuousBatchProcessor", "update_batch"),)),
)
# inside the forward phase: how its steps ran (a capture runs the forward eagerly twice: warm-up
# and capture; those eager passes are in "eager forward passes" too)
FORWARD_PARTS = (
    ("graph replays", (("torch.cuda.graphs.CUDAGraph", "replay"),)),
    ("graph captures", (("model_runner.ModelRunner", "_capture_graph"),)),
    ("eager forward passes", (("model_runner.ModelRunner", "_forward_process_and_sample"),)),
)
# inside the eager passes (captures' included): what frostc's own Python takes (nested: a plan
# launch is inside the executor or the glue that made it)
FROSTC_PARTS = (
    ("the model's forward", (("transformers.models.llama.modeling_llama.LlamaModel", "forward"),)),
    ("frostc: layer calls", (("frost_runtime.hf.continuous.ContinuousAttention", "_layer_call"),)),
    ("frostc: step metadata", (("frost_runtime.hf.continuous.ContinuousAttention", "_step"),)),
    ("frostc: mixed plans", (("frost_runtime.hf.cb_plans.PlanExecutor", "__call__"),)),
    ("frostc: glue", tuple(("frost_runtime.hf_fuse.Glue", m) for m in ("norm", "add_norm", "silu_mul"))),
    ("frostc: plan launches", (("frost_runtime.plan.Plan", "execute"),)),
)


def phase_owner(path: str):
    """The class a phase wraps: a full module path as it is, else one of transformers' continuous batching."""
    import importlib

    module, cls = path.rsplit(".", 1)
    if not module.startswith(("torch.", "transformers.", "frost_runtime.")):
        module = f"transformers.generation.continuous_batching.{module}"
    return getattr(importlib.import_module(module), cls)


class HostPhases:
    """Wall seconds transformers' generation thread spends in each of HOST_PHASES over a call
    (wrappers around the methods while inside; a phase inside itself counted once, different
    phases apart, so the update's time includes its wait). What the GPU's idle share is made of,
    measured: a host-bound loop spends its steps scheduling and updating, a GPU-bound one waits
    for the step's tokens."""

    def __init__(self, phases=HOST_PHASES):
        self.phases = phases
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._depth: Counter[str] = Counter()
        self._saved: list[tuple[type, str, object]] = []

    def __enter__(self) -> HostPhases:
        for label, methods in self.phases:
            for path, method in methods:
                owner = phase_owner(path)
                self._saved.append((owner, method, owner.__dict__.get(method)))
                setattr(owner, method, self._timed(label, getattr(owner, method)))
        return self

    def _timed(self, label: str, original):
        def timed(*args, **kwargs):
            outermost = self._depth[label] == 0
            self._depth[label] += 1
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._depth[label] -= 1
                if outermost:
                    self.seconds[label] += time.perf_counter() - start
                    self.calls[label] += 1

        return timed

    def __exit__(self, *exc) -> None:
        for owner, method, original in reversed(self._saved):
            if original is None:  # it was inherited: the class's own lookup again
                delattr(owner, method)
            else:
                setattr(owner, method, original)
        self._saved.clear()


def host_phases(model, inputs) -> dict:
    """One warm call with HostPhases around it: its wall, each phase's seconds and calls."""
    with HostPhases(HOST_PHASES + FORWARD_PARTS + FROSTC_PARTS) as phases:
        wall, _ = _job(model, inputs)
    return {"wall_s": wall, "seconds": dict(phases.seconds), "calls": dict(phases.calls)}


def busy_by_family(spans: list[tuple[float, float, str]]) -> dict[str, float]:
    """The GPU's busy seconds by kernel family, each instant shared evenly among the kernels
    running then. Kernel durations alone count overlapping kernels twice: a kernel launched early
    (programmatic dependent launch: frostc's combine, transformers' graphs) is "running" while it
    waits for its predecessor, so summed durations overstate both its share and the GPU's time."""
    edges = sorted({t for a, b, _ in spans for t in (a, b)})
    shares: Counter[str] = Counter()
    events = sorted((a, b, f) for a, b, f in spans if b > a)
    running: list[tuple[float, str]] = []  # (end, family) of the kernels started so far
    nxt = 0
    for left, right in zip(edges, edges[1:]):
        while nxt < len(events) and events[nxt][0] <= left:
            running.append((events[nxt][1], events[nxt][2]))
            nxt += 1
        running = [(end, f) for end, f in running if end > left]
        for _, f in running:
            shares[f] += (right - left) / len(running) / 1e6
    return dict(shares.most_common())


def busy_shares(busy: dict[str, float]) -> str:
    """'attention 0.41 s (14 %), ... ; attention with gathers and copies 19 %' from busy_by_family."""
    total = sum(busy.values()) or 1.0
    parts = ", ".join(f"{f} {busy.get(f, 0.0):.2f} s ({busy.get(f, 0.0) / total:.0%})" for f in busy)
    paths = busy.get("attention", 0.0) + busy.get("K/V gathers and copies", 0.0)
    return f"{parts}; attention with gathers and copies {paths / total:.0%}"


def _union_s(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total / 1e6


# ---------------------------------------------------------------------------- the run (GPU)


def gemm_rate() -> float:
    """bf16 FLOP/s of a large square GEMM (the prefill's ceiling)."""
    import torch

    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    return 2 * 8192**3 / (common.time_ms(lambda: a @ b) * 1e-3)


def run(requests: str = "64,256", attn: str = ",".join(ATTENTIONS), profile_calls: bool = False, md=None,
        json_path=None, kept: bool = False) -> int:  # fmt: skip
    import torch

    counts = [int(n) for n in requests.split(",")]
    attentions = sorted((a.strip() for a in attn.split(",")), key=lambda a: a.startswith("frostc-fused"))  # fused: last
    ceiling = common.read_ceiling()["bytes_per_s"]
    gemm = gemm_rate()
    torch.cuda.empty_cache()  # the probes' buffers: transformers sizes its pool from what is free
    model = _model()
    print(f"model: {torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated", flush=True)
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    jobs = {n: prompts(n, config()["vocab_size"], seed=n) for n in counts}
    result = {
        "device": common.machine(),
        "read_ceiling_bytes_per_s": ceiling,
        "gemm_flops": gemm,
        "jobs": {n: {"prompt_tokens": sum(map(len, p)), "floor_s": floor_s([len(x) for x in p], gemm, ceiling,
                                                                            weight_bytes)} for n, p in jobs.items()},
        "rows": [],
        "skipped": {},
        "profiles": {},
    }  # fmt: skip
    print(
        f"{result['device']}: read ceiling {ceiling / 1e12:.2f} TB/s, bf16 GEMM {gemm / 1e12:.0f} TFLOP/s", flush=True
    )
    for attention in attentions:
        why = available(attention)
        if why:
            result["skipped"][attention] = why
            print(f"{attention}: skipped: {why}", flush=True)
            continue
        cb = _use(model, attention)
        for n, inputs in jobs.items():
            if attention == "sdpa" and n > min(counts):
                continue  # sdpa's 256 requests take over a minute (RESULTS has it); its 64 are the reference
            first, generated = _job(model, inputs)
            warm, _ = _job(model, inputs)
            total = result["jobs"][n]["prompt_tokens"] + generated
            kept_s = kept_call(model, inputs) if kept else None
            row = {"attention": attention, "requests": n, "first_s": first, "warm_s": warm, "kept_s": kept_s,
                   "generated_per_s": generated / warm, "total_per_s": total / warm,
                   "x_floor": warm / result["jobs"][n]["floor_s"],
                   "calls": dict(cb.calls) if cb is not None else None}  # fmt: skip
            result["rows"].append(row)
            print(f"{attention} {n} requests: first {first:.2f} s, warm {warm:.2f} s, "
                  f"{row['generated_per_s']:,.0f} generated tok/s, {row['x_floor']:.2f}x floor")  # fmt: skip
        if profile_calls:
            result["profiles"][attention] = profile(model, jobs[min(counts)])
            result["profiles"][attention]["host"] = host_phases(model, jobs[min(counts)])
            print(f"{attention} profile: {result['profiles'][attention]}", flush=True)
        torch.cuda.empty_cache()
    common.publish(markdown(result), result, md, json_path)
    return 0


def n_generated(row: dict) -> float:
    """The tokens a row's calls generated (its warm call's rate times its wall)."""
    return row["generated_per_s"] * row["warm_s"]


def kept_call(model, inputs) -> float:
    """The wall of a call that reuses the previous call's manager (its pool and graphs: no
    warm-up captures), what a process calling generate_batch again with persistent_manager=True
    pays; the manager is destroyed after it."""
    _job(model, inputs, keep=True)
    try:
        wall, _ = _job(model, inputs, keep=True)
    finally:
        model.destroy_cached_continuous_batching_manager()
    return wall


def markdown(r: dict) -> str:
    today = datetime.date.today().isoformat()
    lines = [
        f"## bench/serve.py — transformers' continuous batching, Llama-3-8B shape, {today}",
        "",
        f"{r['device']}; read ceiling {r['read_ceiling_bytes_per_s'] / 1e12:.2f} TB/s, bf16 GEMM "
        f"{r['gemm_flops'] / 1e12:.0f} TFLOP/s (both measured in the run). Pages of {PAGE}, {BLOCKS} blocks, "
        f"{STEP_TOKENS} tokens a step, {NEW_TOKENS} new tokens per request.",
        "",
        "| attention | requests | prompt tokens | first call s | warm s | generated tok/s | total tok/s | "
        "× floor | vs flash_attention_4 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    peer = {row["requests"]: row["generated_per_s"] for row in r["rows"] if row["attention"] == "flash_attention_4"}
    for row in r["rows"]:
        n = row["requests"]
        versus = f"{row['generated_per_s'] / peer[n]:.2f}×" if n in peer else "—"
        lines.append(
            f"| {row['attention']} | {n} | {r['jobs'][n]['prompt_tokens']:,} | {row['first_s']:.2f} | "
            f"{row['warm_s']:.2f} | {row['generated_per_s']:,.0f} | {row['total_per_s']:,.0f} | "
            f"{row['x_floor']:.2f} | {versus} |"
        )
    lines += ["", "Floors: " + ", ".join(f"{n} requests {j['floor_s']:.2f} s" for n, j in r["jobs"].items()) + "."]
    kept = [row for row in r["rows"] if row.get("kept_s")]
    if kept:
        peer_kept = {row["requests"]: row["kept_s"] for row in kept if row["attention"] == "flash_attention_4"}
        lines += ["", "A kept manager (`persistent_manager=True`: the call reuses the previous call's pool and CUDA "
                  "graphs, no warm-up captures):", "",
                  "| attention | requests | kept-manager call s | generated tok/s | vs flash_attention_4 |",
                  "|---|---:|---:|---:|---:|"]  # fmt: skip
        for row in kept:
            n, per_s = row["requests"], n_generated(row) / row["kept_s"]
            versus = f"{peer_kept[n] / row['kept_s']:.2f}×" if n in peer_kept else "—"
            lines.append(f"| {row['attention']} | {n} | {row['kept_s']:.2f} | {per_s:,.0f} | {versus} |")
    for attention, why in r["skipped"].items():
        lines.append(f"- {attention}: skipped ({why})")
    for row in r["rows"]:
        if row["calls"]:
            lines.append(f"- {row['attention']}'s calls, {row['requests']} requests (both calls): {row['calls']}")
    if r["profiles"]:
        lines += ["", "| profile (warm call) | wall s | GPU busy s | idle | " + " | ".join(f for f, _ in FAMILIES)
                  + " | other |", "|---|---:|---:|---:|" + "---:|" * (len(FAMILIES) + 1)]  # fmt: skip
        for attention, p in r["profiles"].items():
            shares = [p["families_s"].get(f, 0.0) for f, _ in FAMILIES] + [p["families_s"].get("other", 0.0)]
            kernel_s = sum(shares)  # shares of the kernels' time (overlapping kernels counted apart)
            lines.append(
                f"| {attention} | {p['wall_s']:.2f} | {p['gpu_busy_s']:.2f} | {p['idle_share']:.0%} | "
                + " | ".join(f"{s:.2f} s ({s / kernel_s:.0%})" for s in shares)
                + " |"
            )
        lines += [
            "",
            "The same by GPU busy time, each instant shared among the kernels running then (summed "
            "durations count a kernel launched early, waiting on its predecessor, as running):",
            "",
        ]
        for attention, p in r["profiles"].items():
            lines.append(f"- {attention}: {busy_shares(p.get('busy_families_s') or {})}")
        lines += ["", "| host loop (warm call, unprofiled) | wall s | " + " | ".join(p for p, _ in HOST_PHASES)
                  + " |", "|---|---:|" + "---:|" * len(HOST_PHASES)]  # fmt: skip
        for attention, p in r["profiles"].items():
            host = p.get("host")
            if host:
                cells = [f"{host['seconds'].get(label, 0.0):.2f}" for label, _ in HOST_PHASES]
                lines.append(f"| {attention} | {host['wall_s']:.2f} | " + " | ".join(cells) + " |")
        lines.append("")
        for attention, p in r["profiles"].items():
            host = p.get("host") or {}
            parts = [f"{label} {host['calls'].get(label, 0)} ({host['seconds'].get(label, 0.0):.2f} s)"
                     for label, _ in FORWARD_PARTS + FROSTC_PARTS if label in host.get("calls", {})]  # fmt: skip
            if parts:
                lines.append(f"- {attention}'s forward steps: " + ", ".join(parts))
            calls = p.get("runtime_calls") or {}
            if calls:
                lines.append(f"- {attention}'s host CUDA calls (profiled): "
                             + ", ".join(f"{n} x{c['calls']} {c['s']:.2f} s" for n, c in calls.items()))  # fmt: skip
        for attention, p in r["profiles"].items():  # what the attention-path families are made of
            by_family = p.get("attention_path_kernels_s") or {"attention": p["top_kernels_s"]}
            for fam, kernels in by_family.items():
                mine = [(name, s) for name, s in kernels.items() if family(name) == fam]
                named = ", ".join(f"{name.split('(')[0][:70]} {s:.3f} s" for name, s in mine)
                lines.append(f"- {attention}'s top {fam} kernels: {named or 'none'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser, commands = common.command_line(__doc__)
    run_parser = commands["run"]
    common.add_outputs(run_parser)
    run_parser.add_argument("--requests", default="64,256", help="request counts, e.g. 64,256")
    run_parser.add_argument("--attn", default=",".join(ATTENTIONS), help="attentions, in this order")
    run_parser.add_argument(
        "--profile", dest="profile_calls", action="store_true", help="profile a warm call of the smallest job"
    )
    run_parser.add_argument(
        "--kept", action="store_true", help="also time a call that reuses the previous call's manager (no captures)"
    )
    return common.dispatch(parser, {"build": build, "run": run}, argv)


if __name__ == "__main__":
    sys.exit(main())
