"""frost_vllm's launch path on the GPU, without vLLM (issue 43): what the plugin adds to a plan.

    python bench/vllm_launch.py build     # CPU machine: a Llama-3-8B vLLM set into bench/.built/vllm
    python bench/vllm_launch.py run [--md FILE] [--json FILE]          # GPU machine

A Llama-3-8B layer (32 heads over 8 KV heads, d 128) as vLLM hands it: the NHD cache of 4096 blocks
of 16, steps of 64 decodes over 1,000 keys each (the 64-token bucket) and one 512-token chunk over
3,000 keys (the 512 bucket). Per step shape, four ways:
- `plan`: the bucket's plan alone, its buffers already in the plan's shapes (`plan.execute`);
- `contiguous`: `LayerLauncher.run` on contiguous q, k, v and the output (prefix views, no copy);
- `fused QKV`: the same on q, k, v as views of one QKV projection (vLLM's `qkv.split`): staged;
- `builder`: `StepBuffers.prepare`, once per step and KV-cache group (not per layer).
Each: the host's microseconds a call (median of 200, nothing captured: vLLM's piecewise mode runs
attention eagerly) and the device's (a CUDA graph of the calls, `common.time_ms`).
"""

from __future__ import annotations

import statistics
import sys
import time

import common

BUILT = common.BUILT / "vllm"
SET = BUILT / "llama3-8b-vllm.frostset"
PAGES, PAGE, MAX_LEN = 4096, 16, 4096
BUCKETS = (64, 512)
STEPS = {64: [(1, 1000)] * 64, 512: [(512, 3000)]}  # bucket: (new tokens, context) per sequence
HOST_CALLS = 200


def build() -> int:
    from frostc.buildset import build_set
    from frostc.models import read_model
    from frostc.planfile import write_atomic
    from frostc.serving import VllmEngine, deployment
    from tests.model_configs import LLAMA3_8B

    model = read_model(LLAMA3_8B)
    engine = VllmEngine(BUCKETS, 256, BUCKETS[-1], "nhd")
    dep = deployment(model, batch_sizes=BUCKETS, max_cache_len=MAX_LEN, page_size=PAGE, pages=PAGES, vllm=engine)
    BUILT.mkdir(parents=True, exist_ok=True)
    write_atomic(SET, build_set(model, dep, name="llama3-8b-vllm").data)
    print("built", SET.name, flush=True)
    return 0


def _host_us(fn) -> float:
    import torch

    samples = []
    for _ in range(HOST_CALLS):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def _step(s, bucket: int):
    """vLLM's tensors for the bucket's step: metadata, fused QKV rows, the output, the cache."""
    import torch

    lens = STEPS[bucket]
    kind = s.kinds[0]
    hq, hkv, d = kind.heads, kind.kv_heads, kind.head_dim
    width = MAX_LEN // PAGE
    table = torch.randint(1, PAGES, (len(lens), width), dtype=torch.int32, device="cuda")
    starts = [0]
    for q, _ in lens:
        starts.append(starts[-1] + q)
    slots = torch.randint(0, PAGES * PAGE, (bucket,), dtype=torch.int64, device="cuda")
    meta = dict(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device="cuda"),
        seq_lens=torch.tensor([q + c for q, c in lens], dtype=torch.int32, device="cuda"),
        block_table=table, slot_mapping=slots, num_reqs=len(lens), num_actual_tokens=bucket,
    )  # fmt: skip
    qkv = torch.randn(bucket, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device="cuda")
    q, k, v = (x.view(bucket, -1, d) for x in qkv.split([hq * d, hkv * d, hkv * d], -1))
    contiguous = [x.contiguous() for x in (q, k, v)]
    output = torch.empty(bucket, hq, d, dtype=torch.bfloat16, device="cuda")
    cache = torch.randn(PAGES, PAGE, hkv, 2 * d, dtype=torch.bfloat16, device="cuda").permute(0, 2, 1, 3)
    return meta, (q, k, v), contiguous, output, cache


def _ways(s, launcher, builder, bucket: int) -> dict:
    """The four calls of a bucket's step, each ready to time."""
    from frost_vllm.launch import cache_views

    meta, fused, contiguous, output, cache = _step(s, bucket)
    step = builder.prepare(**meta)
    plan, workspace = launcher.plan_for(bucket)
    k_cache, v_cache = cache_views(cache, s.head_dim, quantized=False)
    named = dict(q=contiguous[0], k_new=contiguous[1], v_new=contiguous[2], o=output, k_cache=k_cache,
                 v_cache=v_cache, slot_mapping=step.slot_mapping, page_table=step.page_table,
                 cache_len=step.cache_len, cu_q=step.cu_q)  # fmt: skip
    buffers = [named[name] for name in plan.slots]
    return {
        "plan": lambda: plan.execute(*buffers, workspace=workspace),
        "contiguous": lambda: launcher.run(*contiguous, cache, step, output),
        "fused QKV": lambda: launcher.run(*fused, cache, step, output),
        "builder": lambda: builder.prepare(**meta),
    }


def run(md=None, json_path=None) -> int:
    import torch
    from frost_vllm.launch import LayerLauncher
    from frost_vllm.plans import read_vllm_set
    from frost_vllm.step import StepBuffers

    s = read_vllm_set(str(SET))
    launcher = LayerLauncher(s, s.kinds[0])
    launcher.preload()
    builder = StepBuffers(s, "cuda")
    rows = []
    for bucket in BUCKETS:
        for name, fn in _ways(s, launcher, builder, bucket).items():
            fn()
            torch.cuda.synchronize()
            host = _host_us(fn)
            device = common.time_ms(fn) * 1e3
            rows.append({"bucket": bucket, "way": name, "host_us": host, "device_us": device})
            print(f"bucket {bucket} {name}: host {host:.1f} us, device {device:.1f} us", flush=True)
    lines = [
        f"## bench/vllm_launch.py — frost_vllm's launch path, Llama-3-8B layer, {common.machine()}",
        "",
        "| bucket (tokens) | way | host µs a call | device µs a call | device vs plan |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        base = next(x["device_us"] for x in rows if x["bucket"] == r["bucket"] and x["way"] == "plan")
        ratio = "—" if r["way"] == "builder" else f"{r['device_us'] / base:.2f}×"
        lines.append(f"| {r['bucket']} | {r['way']} | {r['host_us']:.1f} | {r['device_us']:.1f} | {ratio} |")
    common.publish("\n".join(lines) + "\n", {"rows": rows}, md, json_path)
    return 0


if __name__ == "__main__":
    sys.exit(common.main(__doc__, build, run))
