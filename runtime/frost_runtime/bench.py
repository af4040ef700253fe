"""`python -m frost_runtime bench PLAN`: time a plan on this GPU with buffers made from its slots.

Buffers follow each slot's dtype, dims and strides: inputs random normal, outputs poisoned with
NaN (an output a launch also reads through a tensor map, such as a KV cache appended in place,
is random like an input), length slots filled by `workload.make_lengths`, page tables with a
seeded shuffle of the cache's pages, slot mappings (kv_append's slots form) with distinct rows
of the cache drawn by a seeded sample, the workspace from `plan.allocate_workspace()`. The plan is
bound once and timed three ways, by `frost_runtime.timing` (the bench/ scripts' timing too):

- device time per execute: CUDA events around a settled window: `timing.SETTLE_S` seconds of
  back-to-back executes first, so the power-capped clocks reach their steady state under this
  load, then as many executes as fill the window (`--duration`), with no pause between the two;
  with `--graph` the executes are replayed from a CUDA graph of `timing.GRAPH_CALLS`;
- host time of `bound.execute()`: perf_counter around bursts of `timing.BURST` calls from a
  drained queue, the median (and the least) per call;
- the driver's floor: `cuLaunchKernel` of an empty kernel, timed the same way, per launch.
"""

import math
from dataclasses import dataclass

from frost_runtime import dtypes, timing, workload
from frost_runtime.verdict import version_text

EMPTY_PTX = """
.version {version}
.target sm_{cc}
.address_size 64
.visible .entry frost_empty(.param .u64 p0) {{ ret; }}
"""


class BenchError(RuntimeError):
    """The benchmark cannot run here (no GPU, no torch); the message says why."""


# ------------------------------------------------------------------------------------ buffers


@dataclass
class Setup:
    plan: object  # frost_runtime.Plan
    buffers: list  # torch tensors in slot order
    workspace: object  # torch uint8 tensor or None
    bound: object  # frost_runtime.BoundPlan
    lengths: dict[int, list[int]]  # slot -> the values written there
    notes: list[str]


def prepare(plan, lengths: dict[int, list[int]], seed: int = 0) -> Setup:
    """Buffers for every slot of a loaded plan, and the plan bound to them."""
    buffers, notes = make_buffers(plan.data, lengths, seed, f"cuda:{plan.device.ordinal}")
    workspace = plan.allocate_workspace()
    bound = plan.bind(*buffers, workspace=workspace)
    return Setup(plan, buffers, workspace, bound, lengths, notes)


def make_buffers(data, lengths: dict[int, list[int]], seed: int, device: str) -> tuple[list, list[str]]:
    """A torch tensor per slot of `data` (a PlanData), in slot order, and notes for the report."""
    import torch

    torch.manual_seed(seed)
    tables = {t.slot: t for t in workload.page_tables(data)}
    mappings = {m.slot: m for m in workload.slot_mappings(data)}
    read_by_tmap = {a.slot for launch in data.launches for a in launch.args if a.tmap}
    notes = []
    buffers = []
    for index, slot in enumerate(data.slots):
        view = _empty(slot, device)  # random normal; int32 zero
        if index in lengths:
            _write_ints(view, lengths[index])
        elif index in tables:
            t = tables[index]
            b, max_pages = slot.dims
            cache_lens = lengths.get(t.lengths) or [max_pages * t.page_size] * b
            rows, own = workload.page_table_rows(cache_lens[:b], max_pages, t, seed)
            _write_ints(view, [x for row in rows for x in row])
            if not own:
                notes.append(f"{slot.name}: the cache's {t.pages} pages are fewer than the lengths need; shared")
        elif index in mappings:
            _write_ints(view, workload.slot_mapping_values(slot.dims[0], mappings[index], seed))
        elif slot.dtype == "int32":
            notes.append(f"{slot.name}: an int32 slot with no length contract, filled with zeros")
        elif slot.is_output and index not in read_by_tmap:
            view.fill_(float("nan"))
        buffers.append(view)
    return buffers, notes


def _empty(slot, device: str):
    """A buffer of the slot's dims and strides over storage that spans exactly its extent,
    random normal (int32: zeros), padding between rows included."""
    import torch

    dtype = dtypes.torch_dtype(slot.dtype)
    extent = sum((d - 1) * s for d, s in zip(slot.dims, slot.strides)) + 1
    if slot.dtype == "int32":
        storage = torch.zeros(extent, dtype=dtype, device=device)
    elif dtypes.DTYPES[slot.dtype].quantized:  # torch draws no float8 directly
        storage = torch.randn(extent, device=device).to(dtype)
    else:
        storage = torch.empty(extent, dtype=dtype, device=device).normal_()
    return storage.as_strided(slot.dims, slot.strides)


def _write_ints(view, values: list[int]) -> None:
    import torch

    view.copy_(torch.tensor(values, dtype=torch.int32).view(view.shape))


# ------------------------------------------------------------------------ the driver's floor


def floor_call(compute_capability: tuple[int, int]):
    """A launch of an empty kernel on torch's current stream (the driver's floor per launch),
    or None where the driver cannot compile the kernel."""
    import ctypes

    import torch
    from cuda.bindings import driver as cu

    from frost_runtime import driver

    major, minor = compute_capability
    ptx = EMPTY_PTX.format(version="8.0" if major <= 9 else "8.6", cc=f"{major}{minor}").encode() + b"\0"
    try:
        module = driver.check(cu.cuModuleLoadData(ptx))
    except driver.CudaError:
        return None
    empty = driver.check(cu.cuModuleGetFunction(module, b"frost_empty"))
    arg = ctypes.c_uint64(0)
    args = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
    stream = torch.cuda.current_stream().cuda_stream

    def call():
        cu.cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, stream, ctypes.addressof(args), 0)

    call.keep = (module, arg, args)  # alive as long as the call
    return call


# ------------------------------------------------------------------------------------- the run


def run(path, duration: float = timing.WINDOW_S, graph: bool = False, lengths=None, seed: int = 0) -> dict:
    """Load, prepare, time; the report as a dict (what `bench --json` prints)."""
    try:
        import torch
    except ImportError:
        raise BenchError("bench needs torch (buffers, CUDA events and graphs): pip install torch") from None
    if not torch.cuda.is_available():
        raise BenchError("bench needs a CUDA GPU: torch sees none")
    import frost_runtime

    torch.cuda.init()
    plan = frost_runtime.load(path)
    try:
        values = workload.make_lengths(plan.data, lengths, seed)
        amount = workload.work(plan.data, values)
        setup = prepare(plan, values, seed)
        dev_us, timed = timing.device_us(setup.bound.execute, duration, graph)
        bursts = max(5, min(25, math.ceil(duration / max(timing.BURST * dev_us * 1e-6, 1e-9))))
        host_median, host_min = timing.host_us(setup.bound.execute, bursts)
        floor = floor_call(plan.device.compute_capability)
        floor_median = timing.host_us(floor, bursts)[0] if floor is not None else None
    finally:
        plan.close()
    d = plan.device
    data = plan.data
    result = {
        "plan": str(path),
        "name": data.header.name,
        "target_arch": data.header.target_arch,
        "frostc_version": data.header.frostc_version,
        "device": {
            "name": d.name,
            "compute_capability": list(d.compute_capability),
            "sm_count": d.sm_count,
            "driver_version": d.driver_version,
        },
        "launches": [
            {"node": x.node, "kernel": data.kernels[x.kernel].name, "grid": list(x.grid)} for x in data.launches
        ],
        "lengths": _lengths_report(data, values),
        "lengths_spec": list(lengths or [workload.FULL]),
        "seed": seed,
        "notes": setup.notes,
        "method": {
            "graph": graph,
            "calls_per_graph": timing.GRAPH_CALLS if graph else None,
            "settle_s": timing.SETTLE_S,
            "window_s": duration,
            "executes_timed": timed,
            "host_bursts": bursts,
            "burst": timing.BURST,
        },
        "flops": amount.flops,
        "bytes": amount.bytes,
        "model": list(amount.how),
        "device_us": dev_us,
        "tflops": amount.flops / (dev_us * 1e-6) / 1e12 if amount.flops is not None else None,
        "tb_s": amount.bytes / (dev_us * 1e-6) / 1e12 if amount.bytes is not None else None,
        "host_us": {"median": host_median, "min": host_min},
        "floor_us_per_launch": floor_median,
    }
    return result


def report_lines(r: dict) -> list[str]:
    """The report as a plain-text table."""
    d, m = r["device"], r["method"]
    cc = "".join(map(str, d["compute_capability"]))
    n = len(r["launches"])
    lines = [
        f"plan      {r['plan']}: {r['name']} ({r['target_arch']}, frostc {r['frostc_version']}), "
        f"{n} launch{'es' if n != 1 else ''}",
    ]
    width = max(len(x["node"]) for x in r["launches"])
    for i, x in enumerate(r["launches"]):
        lines.append(f"  {i}  {x['node']:{width}}  {x['kernel']}  grid {tuple(x['grid'])}")
    lines.append(f"GPU       {d['name']} (sm_{cc}, {d['sm_count']} SMs, driver {version_text(d['driver_version'])})")
    lines.append(f"lengths   {' '.join(r['lengths_spec'])} (seed {r['seed']})" if r["lengths"] else "lengths   none")
    for name, entry in r["lengths"].items():
        lines.append(f"  {name}: {_lengths_text(entry['sequence_lengths'])}")
    lines += [f"note      {note}" for note in r["notes"]]
    how = f"a CUDA graph of {m['calls_per_graph']} executes, replayed" if m["graph"] else "bound.execute() calls"
    lines += [
        f"timing    {how}: {m['settle_s']:g} s settling, then a {m['window_s']:g} s window "
        f"({m['executes_timed']} executes)",
        "",
        f"{'per execute':26} value",
        f"{'device time':26} {r['device_us']:.2f} µs",
    ]
    if r["tflops"] is not None:
        lines.append(f"{'throughput':26} {r['tflops']:.1f} TFLOP/s ({r['flops'] / 1e9:.3f} GFLOP)")
    if r["tb_s"] is not None:
        lines.append(f"{'KV read':26} {r['tb_s']:.2f} TB/s ({r['bytes'] / 1e6:.1f} MB)")
    host, floor = r["host_us"], r["floor_us_per_launch"]
    lines.append(
        f"{'host: bound.execute()':26} {host['median']:.2f} µs median, {host['min']:.2f} least "
        f"({m['host_bursts']} bursts of {m['burst']})"
    )
    if floor is not None:
        lines.append(f"{'host: driver floor':26} {floor:.2f} µs per launch x {n} = {floor * n:.2f} µs")
    lines.append("")
    lines += [f"model     {how}" for how in r["model"]] or ["model     none: no attention launch to count"]
    return lines


def _lengths_report(data, values: dict[int, list[int]]) -> dict:
    contracts = workload.merged_contracts(data)
    out = {}
    for slot, v in values.items():
        kind = contracts[slot].kind
        lengths = [v[i + 1] - v[i] for i in range(len(v) - 1)] if kind == "offsets" else v
        out[data.slots[slot].name] = {"kind": kind, "values": v, "sequence_lengths": lengths}
    return out


def _lengths_text(lengths: list[int]) -> str:
    """Per-sequence lengths in a few words."""
    n, total = len(lengths), sum(lengths)
    if len(set(lengths)) == 1:
        return f"{n} sequence{'s' if n != 1 else ''} of {lengths[0]} ({total} in all)"
    shown = ",".join(map(str, lengths)) if n <= 16 else ",".join(map(str, lengths[:12])) + ",..."
    return f"{n} sequences, {min(lengths)} to {max(lengths)}, {total} in all: {shown}"
