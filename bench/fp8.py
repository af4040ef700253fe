"""FP8 (e4m3) SDPA forward throughput: frostc's e4m3 plans beside its bf16 plans of the same
shapes, torch's e4m3 GEMM (the FP8 tensor-core ceiling, measured in the same run) and, where
installed, cuDNN's FP8 SDPA (nvidia-cudnn-frontend).

    python bench/fp8.py build                          # CPU machine: compile the plans into bench/.built/fp8
    python bench/fp8.py run [--md FILE] [--json FILE]  # GPU machine: time everything, print a table

Each row: one (batch, heads, seq, head dim) shape, causal or not. frostc e4m3 takes Q and K
"bhsd", one descale per tensor and O in bf16, and V in either of two layouts, each its own plan:
transposed ("bhds", keys innermost, as the kernel reads it) or "bhsd" like Q and K (the plan
re-lays it with vt_pack first, in P's key order: its time is counted). frostc bf16 is the same
shape's bf16 plan ("bhsd"). All run their serving path (`plan.bind` once, `bound.execute()`).
Times and rounds as in bench/sdpa.py (bench/common.py's `time_ms`, `alternating`); TFLOP/s counts
4*b*h*s*s*d matmul FLOPs (half of that when causal). The e4m3 output is checked against bf16
attention on the dequantized inputs before its time is reported.
"""

import statistics
import sys

import common
from frost_runtime.timing import SETTLE_S, WINDOW_S

BUILT = common.BUILT / "fp8"
SHAPES = [
    (4, 16, 2048, 128),
    (2, 16, 4096, 128),
    (1, 16, 8192, 128),
    (1, 16, 16384, 128),
    (2, 16, 4096, 64),
    (2, 16, 4096, 256),
]
GEMM = 8192  # the FP8 ceiling: an e4m3 GEMM of this size (torch._scaled_mm), bf16 out
MAX_REL_ERR = 0.05  # e4m3 P: about 2.5 % against attention on the dequantized inputs


V_LAYOUTS = {"keys innermost": "bhds", "bhsd": "bhsd"}  # the e4m3 plans' V, by column name


def plan_name(shape, causal: bool, dtype: str, v_layout: str = "bhds") -> str:
    b, h, s, d = shape
    relaid = "-vbhsd" if dtype == "e4m3" and v_layout == "bhsd" else ""
    return f"{dtype}{relaid}-b{b}-h{h}-s{s}-d{d}-{'causal' if causal else 'full'}"


def _plan_kinds() -> list[tuple[str, str]]:
    """(dtype, V layout) of each plan a shape has."""
    return [("e4m3", layout) for layout in V_LAYOUTS.values()] + [("bf16", "bhsd")]


def build() -> int:
    from frostc import GraphBuilder

    for shape in SHAPES:
        for causal in (False, True):
            for dtype, v_layout in _plan_kinds():
                name = plan_name(shape, causal, dtype, v_layout)
                g = GraphBuilder(name)
                g.tensor("q", dtype=dtype, dims=shape, layout="bhsd")
                g.tensor("k", dtype=dtype, dims=shape, layout="bhsd")
                g.tensor("v", dtype=dtype, dims=shape, layout=v_layout)
                g.tensor("o", dtype="bf16", dims=shape, layout="bhsd")
                descales = {}
                if dtype == "e4m3":
                    for role in ("q", "k", "v"):
                        g.tensor(f"{role}_descale", dtype="fp32", dims=(1,))
                        descales[f"{role}_descale"] = f"{role}_descale"
                g.sdpa(q="q", k="k", v="v", o="o", causal=causal, **descales)
                common.write_plan(BUILT / f"{name}.frost", g.build())
    return 0


def run(md=None, json_path=None) -> int:
    import frost_runtime

    ceiling = _gemm_tflops()
    print(f"e4m3 GEMM {GEMM}^3: {ceiling:.0f} TFLOP/s", flush=True)
    rows = []
    for shape in SHAPES:
        for causal in (False, True):
            plans = {kind: frost_runtime.load(BUILT / f"{plan_name(shape, causal, *kind)}.frost")
                     for kind in _plan_kinds()}  # fmt: skip
            rows.append(_measure(plans, shape, causal))
            print(_row(rows[-1], ceiling), flush=True)
    common.publish(_markdown(rows, ceiling, common.machine()), {"gemm_tflops": ceiling, "rows": rows}, md, json_path)
    return 0


def _gemm_tflops() -> float:
    import torch

    a = torch.randn(GEMM, GEMM, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(GEMM, GEMM, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    one = torch.ones((), device="cuda")
    ms = statistics.median(
        common.time_ms(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), calls=5)
        for _ in range(common.ROUNDS)
    )
    return 2 * GEMM**3 / (ms * 1e-3) / 1e12


def _quantize(x):
    """(x / descale in e4m3, descale): one descale for the tensor, amax / 448."""
    import torch

    descale = (x.abs().amax() / 448.0).float().reshape(1)
    return (x / descale).to(torch.float8_e4m3fn), descale


def _bind(plan, **buffers):
    return plan.bind(*(buffers[name] for name in plan.slots), workspace=plan.allocate_workspace())


def _measure(plans: dict, shape, causal: bool) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d = shape
    real = [torch.randn(b, h, s, d, device="cuda") for _ in range(3)]
    (q8, dq), (k8, dk), (v8, dv) = (_quantize(x) for x in real)
    v8_t = v8.transpose(2, 3).contiguous().transpose(2, 3)  # keys innermost
    qd, kd, vd = ((x.float() * sc).to(torch.bfloat16) for x, sc in ((q8, dq), (k8, dk), (v8, dv)))
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal).float()

    contestants, errors = {}, {}
    for column, layout in V_LAYOUTS.items():
        o8 = torch.full((b, h, s, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        v = v8_t if layout == "bhds" else v8
        fp8 = _bind(plans[("e4m3", layout)], q=q8, k=k8, v=v, q_descale=dq, k_descale=dk, v_descale=dv, o=o8)
        fp8.execute()
        torch.cuda.synchronize()
        errors[column] = err = ((o8.float() - ref).norm() / ref.norm()).item()
        if not err < MAX_REL_ERR:
            name = plan_name(shape, causal, "e4m3", layout)
            raise SystemExit(f"{name}: relative error {err:.2e} against bf16 attention")
        contestants[f"frostc e4m3, V {column}"] = fp8.execute
    o16 = torch.empty(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    bf16 = _bind(plans[("bf16", "bhsd")], q=qd, k=kd, v=vd, o=o16)
    contestants["frostc bf16"] = bf16.execute
    cudnn_fp8 = _cudnn_fp8(q8, k8, v8, dq, dk, dv, causal)
    cudnn_err = None
    if cudnn_fp8 is not None:
        call, out = cudnn_fp8
        call()
        torch.cuda.synchronize()
        cudnn_err = ((out.float() - ref).norm() / ref.norm()).item()
        contestants["cuDNN e4m3"] = call
    times = common.alternating(contestants)
    tflops = {name: flops / (ms * 1e-3) / 1e12 for name, ms in times.items()}
    return {"shape": shape, "causal": causal, "rel_err": max(errors.values()), "cudnn_rel_err": cudnn_err,
            "ms": times, "tflops": tflops}  # fmt: skip


def _e4m3(tflops: dict) -> list[float]:
    """frostc e4m3's TFLOP/s per V layout, in V_LAYOUTS' order."""
    return [tflops[f"frostc e4m3, V {column}"] for column in V_LAYOUTS]


def _pair(values: list[float], over: float) -> str:
    return " / ".join(f"{v / over:.2f}" for v in values)


def _cudnn_fp8(q8, k8, v8, dq, dk, dv, causal: bool):
    """(call, its O) of cuDNN's FP8 SDPA (nvidia-cudnn-frontend's graph API), where it is installed
    and supports the shape; else None (the reason printed). Its O is e4m3 (Hopper's FP8 SDPA writes FP8 O), with
    scale_s = 448 for P as FA3 and cuDNN's samples use."""
    import torch

    try:
        import cudnn
    except Exception as exc:  # ImportError, or the library failing to load
        print(f"cuDNN FP8: not available ({type(exc).__name__}: {exc})", flush=True)
        return None
    b, h, s, d = q8.shape
    e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    handle = cudnn.create_handle()
    graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    v_bhsd = v8.contiguous()  # cuDNN reads V as (b, h, s, d)
    tq, tk, tv = (graph.tensor(name=n, dim=list(x.shape), stride=list(x.stride()), data_type=e4m3)
                  for n, x in (("q", q8), ("k", k8), ("v", v_bhsd)))  # fmt: skip
    scalars = {n: graph.tensor(name=n, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
               for n in ("dq", "dk", "dv", "ds", "ss", "so")}  # fmt: skip
    o, _, amax_s, amax_o = graph.sdpa_fp8(
        q=tq, k=tk, v=tv, descale_q=scalars["dq"], descale_k=scalars["dk"], descale_v=scalars["dv"],
        descale_s=scalars["ds"], scale_s=scalars["ss"], scale_o=scalars["so"], is_inference=True,
        attn_scale=1.0 / d**0.5, use_causal_mask=causal, name="sdpa_fp8",
    )  # fmt: skip
    out = torch.empty(b, h, s, d, device="cuda", dtype=torch.float8_e4m3fn)
    o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride())).set_data_type(e4m3)
    amaxes = [torch.empty(1, 1, 1, 1, device="cuda") for _ in range(2)]
    for tensor in (amax_s, amax_o):
        tensor.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
    try:
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
    except Exception as exc:
        print(f"cuDNN FP8: {q8.shape} causal={causal} not supported ({exc})", flush=True)
        return None
    one = torch.ones(1, 1, 1, 1, device="cuda")
    values = {"dq": dq.view(1, 1, 1, 1), "dk": dk.view(1, 1, 1, 1), "dv": dv.view(1, 1, 1, 1),
              "ds": one / 448.0, "ss": one * 448.0, "so": one}  # fmt: skip
    pack = {tq: q8, tk: k8, tv: v_bhsd, o: out, amax_s: amaxes[0], amax_o: amaxes[1]}
    pack |= {scalars[n]: values[n] for n in scalars}
    workspace = torch.empty(graph.get_workspace_size(), device="cuda", dtype=torch.uint8)

    def call():  # on the current stream (a graph capture's own)
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        graph.execute(pack, workspace, handle=handle)

    return call, out


def _row(r, ceiling: float) -> str:
    t = r["tflops"]
    cells = "  ".join(f"{name} {value:6.1f}" for name, value in t.items())
    return (
        f"{str(r['shape']):22} {'causal' if r['causal'] else 'full':6} {cells}  "
        f"e4m3/bf16 {_pair(_e4m3(t), t['frostc bf16'])}  e4m3/GEMM {_pair(_e4m3(t), ceiling)}"
    )


def _markdown(rows, ceiling: float, machine: str) -> str:
    cudnn = all("cuDNN e4m3" in r["tflops"] for r in rows)
    lines = [
        f"SDPA forward, e4m3 — {machine}. TFLOP/s from CUDA-graph replays "
        f"({SETTLE_S:g} s settling, then a {WINDOW_S:g} s timed window), each contestant's median of {common.ROUNDS} "
        f"measurements in rotated order. e4m3 GEMM ceiling ({GEMM}³, torch._scaled_mm, same run): "
        f"{ceiling:.0f} TFLOP/s. frostc e4m3 in two plans per shape: V with its keys innermost "
        '("bhds", read as it is) and V "bhsd" like Q and K (re-laid by the plan, counted); '
        "ratio cells give both, in that order.",
        "",
        "| b, h, s, d | causal | frostc e4m3, V keys innermost | frostc e4m3, V bhsd | frostc bf16 | e4m3 / bf16 |"
        " e4m3 / GEMM ceiling |" + (" cuDNN e4m3 | frostc / cuDNN |" if cudnn else "") + " rel. err |",
        "|---|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if cudnn else "") + "---:|",
    ]
    for r in rows:
        t = r["tflops"]
        e4m3 = _e4m3(t)
        extra = f" {t['cuDNN e4m3']:.1f} | {_pair(e4m3, t['cuDNN e4m3'])} |" if cudnn else ""
        lines.append(
            f"| {', '.join(map(str, r['shape']))} | {'yes' if r['causal'] else 'no'} | {e4m3[0]:.1f} | "
            f"{e4m3[1]:.1f} | {t['frostc bf16']:.1f} | {_pair(e4m3, t['frostc bf16'])} | "
            f"{_pair(e4m3, ceiling)} |{extra} {r['rel_err']:.1e} |"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(common.main(__doc__, build, run))
