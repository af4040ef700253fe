"""Host cost of one launch: frostc `execute()` beside the driver's floor and torch SDPA, one run.

    python bench/host_overhead.py build   # CPU machine: the dense causal bf16 (2, 8, 256, 128) plan
    python bench/host_overhead.py run     # GPU machine: print the table

Host microseconds per call, from a drained queue: the host-side time of a burst of 64 calls
(no synchronization inside the burst), divided by 64, minimum over 25 bursts
(`frost_runtime.timing.host_us`, also `python -m frost_runtime bench`'s). The floor is
`cuLaunchKernel` of an empty kernel through cuda-bindings with its arguments prebuilt.
Also: CUDA-graph replay of a captured execute, and the cold `load()` of the one-kernel plan.
"""

import statistics
import sys
import time

import common
from frost_runtime import timing

PLAN = common.BUILT / "host-b2-h8-s256-d128-causal.frost"
VARLEN_PLAN = common.BUILT / "host-varlen-b2-h8-s256-d128-causal.frost"
DECODE_PLAN = common.BUILT / "host-decode-b2-h8x2-p16-d128.frost"
# a dense causal plan whose tiles come from a counter in the workspace (a zeroed region)
COUNTER_PLAN = common.BUILT / "host-counter-b1-h8-s2048-d128-causal.frost"
COUNTER_SHAPE = (1, 8, 2048, 128)
DECODE = {"batch": 2, "hq": 8, "hkv": 2, "d": 128, "page": 16, "max_pages": 256}  # split-KV: 3 launches
SHAPE = (2, 8, 256, 128)
REPS = 25  # bursts of timing.BURST calls


def build() -> int:
    from frostc import GraphBuilder

    common.write_plan(PLAN, common.dense_description("host-overhead", SHAPE, causal=True))
    g = GraphBuilder("host-overhead-varlen")  # two launches: scheduling + attention kernels
    b, h, s, d = SHAPE
    for t in ("q", "k", "v", "o"):
        g.tensor(t, dtype="bf16", dims=(b * s, h, d))
    g.tensor("cu", dtype="int32", dims=(b + 1,))
    g.sdpa(q="q", k="k", v="v", o="o", cu_seqlens_q="cu", cu_seqlens_kv="cu", causal=True)
    common.write_plan(VARLEN_PLAN, g.build())
    common.write_plan(DECODE_PLAN, _decode_description(GraphBuilder))
    common.write_plan(COUNTER_PLAN, common.dense_description("host-overhead-counter", COUNTER_SHAPE, causal=True))
    return 0


def _decode_description(GraphBuilder):
    """A decode step: kv_append, then split-KV attention over the paged cache and its combine."""
    c = DECODE
    b, hq, hkv, d, page, max_pages = c["batch"], c["hq"], c["hkv"], c["d"], c["page"], c["max_pages"]
    g = GraphBuilder("host-overhead-decode")
    for name, heads in (("k_new", hkv), ("v_new", hkv), ("q", hq), ("o", hq)):
        g.tensor(name, dtype="bf16", dims=(b, heads, 1, d), layout="bshd")
    for name in ("k_cache", "v_cache"):
        g.tensor(name, dtype="bf16", dims=(b * max_pages, page, hkv, d))
    g.tensor("page_table", dtype="int32", dims=(b, max_pages))
    g.tensor("cache_len", dtype="int32", dims=(b,))
    paged = {"k_cache": "k_cache", "v_cache": "v_cache", "page_table": "page_table", "seq_len_kv": "cache_len"}
    g.node("kv_append", name="append", k="k_new", v="v_new", **paged)
    g.sdpa(name="attn", q="q", k="k_cache", v="v_cache", o="o", page_table="page_table", seq_len_kv="cache_len")
    return g.build()


def _decode_buffers(plan) -> list:
    """Buffers in the plan's slot order, each of its slot's dims and strides: random data, lengths
    that fill the cache, an identity page table."""
    import torch

    c = DECODE
    buffers = []
    for slot in plan.data.slots:
        if slot.name == "page_table":
            buffers.append(torch.arange(c["batch"] * c["max_pages"], dtype=torch.int32, device="cuda").view(slot.dims))
        elif slot.name == "cache_len":
            buffers.append(torch.full(slot.dims, c["page"] * c["max_pages"], dtype=torch.int32, device="cuda"))
        else:
            x = torch.empty_strided(slot.dims, slot.strides, dtype=torch.bfloat16, device="cuda")
            buffers.append(x.copy_(torch.randn(slot.dims, device="cuda")))
    return buffers


def host_us(call) -> float:
    """The least host microseconds per call over REPS bursts."""
    return timing.host_us(call, REPS)[1]


def run() -> int:
    import frost_runtime
    import torch
    import torch.nn.functional as F
    from frost_runtime.bench import floor_call
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.zeros(1, device="cuda")  # the primary context exists before anything is timed
    load_ms = []
    for _ in range(10):
        start = time.perf_counter()
        plan = frost_runtime.load(PLAN)
        load_ms.append((time.perf_counter() - start) * 1e3)

    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    named = dict(q=q, k=k, v=v, o=o)

    floor_cuda_bindings = floor_call(torch.cuda.get_device_capability())  # the runtime bench's empty launch

    def torch_sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return call

    bound = plan.bind(q, k, v, o)
    varlen = frost_runtime.load(VARLEN_PLAN)
    b, h, s, d = SHAPE
    packed = [x.transpose(1, 2).reshape(b * s, h, d) for x in (q, k, v, o)]
    cu_seqlens = torch.arange(0, b * s + 1, s, dtype=torch.int32, device="cuda")
    workspace = varlen.allocate_workspace()
    varlen_args = (*packed[:3], cu_seqlens, packed[3])  # one prefix-sum tensor serves q and kv
    varlen_bound = varlen.bind(*varlen_args, workspace=workspace)
    decode = frost_runtime.load(DECODE_PLAN)
    decode_args = _decode_buffers(decode)
    decode_bound = decode.bind(*decode_args, workspace=decode.allocate_workspace())
    decode_launches = len(decode.data.launches)
    counter = frost_runtime.load(COUNTER_PLAN)
    counter_args = [torch.randn(COUNTER_SHAPE, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    counter_ws = counter.allocate_workspace()
    counter_bound = counter.bind(*counter_args, workspace=counter_ws)
    graph = torch.cuda.CUDAGraph()
    plan.execute(q, k, v, o)
    with torch.cuda.graph(graph):
        plan.execute(q, k, v, o)

    rows = [
        ("floor: cuLaunchKernel (cuda-bindings), empty kernel", host_us(floor_cuda_bindings)),
        ("frostc execute(q, k, v, o)", host_us(lambda: plan.execute(q, k, v, o))),
        ("frostc execute_named(q=..., ...)", host_us(lambda: plan.execute_named(named))),
        ("frostc bound.execute() (plan.bind(q, k, v, o) once)", host_us(bound.execute)),
        ("CUDA graph replay of a captured execute", host_us(graph.replay)),
        (
            "varlen (2 launches): execute(q, k, v, cu, o, workspace=)",
            host_us(lambda: varlen.execute(*varlen_args, workspace=workspace)),
        ),
        ("varlen (2 launches): bound.execute()", host_us(varlen_bound.execute)),
        (f"decode step ({decode_launches} launches): bound.execute()", host_us(decode_bound.execute)),
        (
            "tile counter (1 launch + its zero fill): execute(q, k, v, o, workspace=)",
            host_us(lambda: counter.execute(*counter_args, workspace=counter_ws)),
        ),
        ("tile counter: bound.execute() (zeroed once, at the first launch)", host_us(counter_bound.execute)),
        ("torch SDPA, cuDNN backend", host_us(torch_sdpa(SDPBackend.CUDNN_ATTENTION))),
        ("torch SDPA, flash backend", host_us(torch_sdpa(SDPBackend.FLASH_ATTENTION))),
    ]
    floor = rows[0][1]
    lines = [
        f"Host µs per call, {SHAPE} bf16 causal, min over {REPS} bursts of {timing.BURST} from a drained queue — "
        f"{common.machine()}.",
        "",
        "| call | host µs | × floor |",
        "|---|---:|---:|",
        *(f"| {name} | {us:.2f} | {us / floor:.2f} |" for name, us in rows),
        "",
        f"Cold `load()` of the one-kernel plan (module load included): first {load_ms[0]:.2f} ms, "
        f"median of 10 {statistics.median(load_ms):.2f} ms.",
        f"The varlen plan launches twice per call: per launch its bound.execute() is "
        f"{rows[-6][1] / 2 / floor:.2f} × the floor; the decode step ({decode_launches} launches: append, attention, "
        f"combine) {rows[-5][1] / decode_launches / floor:.2f} × the floor per launch.",
        f"TMA tensor maps: {_tensor_maps(plan)} per launch, encoded at build time; execute writes each "
        "map's 8-byte address as it writes a pointer, and encodes nothing.",
        "",
    ]
    print("\n".join(lines))
    return 0


def _tensor_maps(plan) -> int:
    return sum(p.kind == "tmap" for k in plan.data.kernels for p in k.params)


if __name__ == "__main__":
    sys.exit(common.main(__doc__, build, run, outputs=False))
