"""The execute contract: no host reads or synchronization, CUDA-graph capturable (also on the
first execute, and one graph for every mix of sequence lengths), ordered on the stream it is
given, safe from several threads, allocation-free, never loading a module after `load()`;
and the plan's lifetime: close() unloads, a load/close soak keeps memory flat. Each test runs
on a dense plan, on a dense causal plan that takes its tiles from a counter in the workspace,
and on a packed variable-length plan (two launches and a workspace)."""

import contextlib
import random
import threading

import pytest

from tests.gpu.support import BUILT, Buffers, built_manifest_entries, draw_lengths, gpu_skip_reason

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")]


def _dense_case(entry: dict) -> bool:
    return (
        entry["form"] == "dense" and entry["dtype"] == "bf16" and entry["head_dim"] == 128 and entry["lse"]
        and entry["seq_q"] == 1000 and entry["alignment"] == "top_left" and entry["softcap"] is None
    )  # fmt: skip


def _packed_case(entry: dict) -> bool:
    return entry["form"] == "packed" and entry["lse"] and entry["causal"]


def _dynamic_case(entry: dict) -> bool:
    """cases.dynamic_walk_cases()'s first: a dense causal plan whose tiles come from a counter
    in the workspace (a zeroed region)."""
    return (
        entry["form"] == "dense" and entry["causal"] and entry["seq_q"] == 2000 and entry["head_dim"] == 128
        and not entry.get("count_visits") and not entry.get("sinks")
    )  # fmt: skip


CONTRACT_CASES = {"dense": _dense_case, "packed": _packed_case, "dense-dynamic": _dynamic_case}


@pytest.fixture(scope="module", params=list(CONTRACT_CASES))
def case(request, manifest):
    found = next((c for c in built_manifest_entries() if CONTRACT_CASES[request.param](c)), None)
    if found is None:
        pytest.skip(f"no {request.param} plan of the contract tests' kind among the built plans")
    return found


def _load(case):
    import frost_runtime

    return frost_runtime.load(BUILT / case["plan"])


def _buffers(case, plan, seed: int = 0) -> Buffers:
    """Fresh buffers; a variable-length plan gets a fresh mix of lengths."""
    buffers = Buffers(case, plan)
    if case["form"] != "dense":
        buffers.set_lengths(*draw_lengths(case, random.Random(seed)))
        buffers.refill()
    return buffers


# ---------------------------------------------------------------------------- no host reads

HOST_READS = {
    torch.Tensor: ["item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"],
    torch: ["is_nonzero", "equal"],
    torch.cuda: ["synchronize"],
    torch.cuda.Stream: ["synchronize", "query"],
    torch.cuda.Event: ["synchronize", "query"],
}
DRIVER_READS = [
    "cuMemcpyDtoH",
    "cuMemcpyDtoHAsync",
    "cuMemcpy",
    "cuMemcpyAsync",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuStreamQuery",
    "cuDeviceSynchronize",
]


@contextlib.contextmanager
def banned_host_reads(monkeypatch):
    """Every host-reading accessor raises, naming itself, for the duration of the block."""
    from cuda.bindings import driver as cu

    def ban(owner, name):
        if not hasattr(owner, name):
            return

        def refuse(*args, **kwargs):
            raise AssertionError(f"execute() called the host-reading accessor {name}")

        monkeypatch.setattr(owner, name, refuse)

    for owner, names in HOST_READS.items():
        for name in names:
            ban(owner, name)
    for name in DRIVER_READS:
        ban(cu, name)
    real_to, real_copy = torch.Tensor.to, torch.Tensor.copy_

    def to(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, torch.Tensor):
            target = target.device
        if target is not None and not isinstance(target, torch.dtype) and torch.device(target).type == "cpu":
            raise AssertionError("execute() called the host-reading accessor Tensor.to(cpu)")
        return real_to(self, *args, **kwargs)

    def copy_(self, src, *args, **kwargs):
        if self.device.type == "cpu" and src.device.type == "cuda":
            raise AssertionError("execute() called the host-reading accessor Tensor.copy_ into a CPU tensor")
        return real_copy(self, src, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)
        monkeypatch.undo()


def test_execute_reads_nothing_back_and_never_synchronizes(case, monkeypatch):
    plan = _load(case)
    buffers = _buffers(case, plan)
    bound = plan.bind(*buffers.all, workspace=buffers.workspace)
    torch.cuda.synchronize()
    with banned_host_reads(monkeypatch):
        plan.execute(*buffers.all, workspace=buffers.workspace)
        plan.execute_named(dict(zip(plan.slots, buffers.all)), workspace=buffers.workspace)
        bound.execute()
    torch.cuda.synchronize()
    buffers.assert_correct()


def test_the_ban_itself_catches_a_host_read(monkeypatch):
    """Guard against a ban that cannot fail."""
    x = torch.ones(1, device="cuda")
    with pytest.raises(AssertionError, match="item"):
        with banned_host_reads(monkeypatch):
            x.item()


# ---------------------------------------------------------------------------- CUDA graphs


@pytest.mark.parametrize("explicit_stream", [False, True], ids=["current-stream", "explicit-stream"])
def test_captured_execute_replays_on_new_inputs(case, explicit_stream):
    plan = _load(case)
    buffers = _buffers(case, plan)
    stream = torch.cuda.Stream()
    plan.execute(*buffers.all, workspace=buffers.workspace)  # a warm execute before capture, as serving engines do
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        plan.execute(*buffers.all, workspace=buffers.workspace, stream=stream if explicit_stream else None)
    for _ in range(3):
        buffers.refill()
        graph.replay()
        torch.cuda.synchronize()
        buffers.assert_correct()


def test_captured_bound_execute_replays_on_new_inputs(case):
    plan = _load(case)
    buffers = _buffers(case, plan)
    bound = plan.bind(*buffers.all, workspace=buffers.workspace)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bound.execute()
    for _ in range(2):
        buffers.refill()
        graph.replay()
        torch.cuda.synchronize()
        buffers.assert_correct()


def test_first_execute_may_happen_inside_a_capture(case):
    plan = _load(case)
    buffers = _buffers(case, plan)  # loaded, never executed
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.execute(*buffers.all, workspace=buffers.workspace)
    buffers.refill()
    graph.replay()
    torch.cuda.synchronize()
    buffers.assert_correct()


# ---------------------------------------------------------------------------- streams, threads


def test_launch_is_ordered_on_the_given_stream(case):
    """New inputs are written on the side stream after long work there; execute on the same
    stream must see them, while the default stream is busy with long work of its own."""
    plan = _load(case)
    buffers = _buffers(case, plan)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):  # keep the default stream busy
        big @ big
    with torch.cuda.stream(side):
        for _ in range(20):  # the side stream is busy too, before its inputs are final
            big @ big
        buffers.refill(stream=side)
        plan.execute(*buffers.all, workspace=buffers.workspace, stream=side)
    side.synchronize()
    buffers.assert_correct()


def test_four_threads_on_four_streams(case):
    plan = _load(case)
    sets = [_buffers(case, plan, seed) for seed in range(4)]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in sets]
    errors = []

    def worker(buffers, stream):
        try:
            bound = plan.bind(*buffers.all, workspace=buffers.workspace)
            for i in range(50):
                if i % 2:
                    plan.execute(*buffers.all, workspace=buffers.workspace, stream=stream)
                else:
                    bound.execute(stream=stream)
        except Exception as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=pair) for pair in zip(sets, streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors
    for buffers in sets:
        buffers.assert_correct()


# ---------------------------------------------------------------------------- no hidden work


def test_no_allocation_across_a_thousand_executes(case):
    plan = _load(case)
    buffers = _buffers(case, plan)
    plan.execute(*buffers.all, workspace=buffers.workspace)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    for _ in range(1000):
        plan.execute(*buffers.all, workspace=buffers.workspace)
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    for key in ("allocation.all.allocated", "segment.all.allocated", "reserved_bytes.all.current"):
        assert after.get(key) == before.get(key), key


def test_no_module_load_after_load(case, monkeypatch):
    from cuda.bindings import driver as cu

    plan = _load(case)
    buffers = _buffers(case, plan)
    for name in ("cuModuleLoadData", "cuModuleLoad", "cuLibraryLoadData", "cuModuleGetFunction"):
        monkeypatch.setattr(cu, name, lambda *a, _n=name, **k: pytest.fail(f"execute called {_n}"))
    for _ in range(10):
        plan.execute(*buffers.all, workspace=buffers.workspace)
    torch.cuda.synchronize()
    buffers.assert_correct()


# ---------------------------------------------------------------------------- one graph, any lengths


def _varlen(form: str):
    def pick(entry: dict) -> bool:
        return entry["form"] == form and entry["lse"] and entry["causal"] and entry["head_dim"] == 128

    found = next((c for c in built_manifest_entries() if pick(c)), None)
    if found is None:
        found = next((c for c in built_manifest_entries() if c["form"] == form), None)
    if found is None:
        pytest.skip(f"no {form} plan among the built plans")
    return found


@pytest.mark.parametrize("form", ["packed", "padded"])
def test_one_graph_serves_twenty_length_mixes(manifest, form):
    """Captured once; each replay gets new lengths written into the same length buffers (and
    new inputs, NaN outside the sequences) and is checked against float64."""
    case = _varlen(form)
    plan = _load(case)
    buffers = _buffers(case, plan)
    bound = plan.bind(*buffers.all, workspace=buffers.workspace)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bound.execute()
    rng = random.Random(2026)
    for _ in range(20):
        buffers.set_lengths(*draw_lengths(case, rng))
        buffers.refill()
        buffers.poison_padding()
        graph.replay()
        torch.cuda.synchronize()
        buffers.assert_correct()


# ---------------------------------------------------------------------------- lifetime


def test_close_unloads_and_refuses_every_later_launch(case):
    import frost_runtime

    plan = _load(case)
    buffers = _buffers(case, plan)
    bound = plan.bind(*buffers.all, workspace=buffers.workspace)
    plan.close()
    for launch in (
        lambda: plan.execute(*buffers.all, workspace=buffers.workspace),
        lambda: bound.execute(),
        lambda: plan.bind(*buffers.all, workspace=buffers.workspace),
    ):
        with pytest.raises(frost_runtime.PlanClosedError):
            launch()
    plan.close()  # a second close is harmless
    torch.cuda.synchronize()
    assert bool(torch.isnan(buffers.tensors["o"]).all()), "a closed plan launched something"


def test_load_close_soak_keeps_device_memory_flat(case):
    """A serving process that swaps plans: 300 load/execute/close cycles leak no module."""
    import frost_runtime
    from cuda.bindings import driver as cu

    data = (BUILT / case["plan"]).read_bytes()
    plan = frost_runtime.load(data)
    buffers = _buffers(case, plan)
    plan.close()

    def cycle():
        with frost_runtime.load(data) as p:
            p.execute(*buffers.all, workspace=buffers.workspace)
            torch.cuda.synchronize()

    for _ in range(20):  # warm: allocator pools, the driver's own caches
        cycle()
    free_before = cu.cuMemGetInfo()[1]
    for _ in range(300):
        cycle()
    free_after = cu.cuMemGetInfo()[1]
    assert free_before - free_after < 2 << 20, f"{(free_before - free_after) >> 10} KiB less free after 300 cycles"
    buffers.assert_correct()


# ---------------------------------------------------------------------------- workspace and lengths


def test_workspace_is_checked_and_nothing_is_launched_without_a_good_one(manifest):
    import frost_runtime

    case = _varlen("packed")
    plan = _load(case)
    buffers = _buffers(case, plan)
    ws = buffers.workspace
    bad = {
        "needs a workspace": None,
        "bytes, this plan needs": ws[: plan.workspace_bytes - 1],
        "aligned": torch.empty(plan.workspace_bytes + 256, dtype=torch.uint8, device="cuda")[4:],
        "cpu": torch.empty(plan.workspace_bytes, dtype=torch.uint8),
    }
    for words, workspace in bad.items():
        with pytest.raises(frost_runtime.BindError, match=words):
            plan.execute(*buffers.all, workspace=workspace)
        with pytest.raises(frost_runtime.BindError, match=words):
            plan.bind(*buffers.all, workspace=workspace)
    torch.cuda.synchronize()
    assert bool(torch.isnan(buffers.tensors["o"]).all()), "a refused execute must launch nothing"


def test_tile_counter_is_zeroed_before_use_and_left_zero(manifest):
    """The dynamic walk's counter (a zeroed region) may start as garbage: execute zeroes it on
    its stream every call, a binding before its first launch; every launch leaves it zero."""
    case = next((c for c in built_manifest_entries() if _dynamic_case(c)), None)
    if case is None:
        pytest.skip("no dense-dynamic plan among the built plans")
    plan = _load(case)
    (region,) = [r for r in plan.data.workspace if r.zeroed]
    buffers = _buffers(case, plan)
    counter = buffers.workspace[region.offset : region.offset + region.bytes].view(torch.int32)
    for launch in ("execute", "bound"):
        buffers.workspace.fill_(0xA5)  # a counter of -1515870811: no tile would be right
        bound = plan.bind(*buffers.all, workspace=buffers.workspace)
        for _ in range(3):
            buffers.refill()
            buffers.execute() if launch == "execute" else bound.execute()
            torch.cuda.synchronize()
            buffers.assert_correct()
            assert counter.tolist() == [0], launch


def test_check_lengths_names_what_breaks_the_capacities(manifest):
    import frost_runtime

    case = _varlen("packed")
    plan = _load(case)
    buffers = _buffers(case, plan)
    plan.check_lengths(*buffers.all)  # the drawn mix keeps the contract
    b = case["batch"]
    too_long = [case["seq_q"] + 1] + [0] * (b - 1)
    buffers.set_lengths(too_long, [1] * b)
    with pytest.raises(frost_runtime.LengthError, match="over the plan's longest"):
        plan.check_lengths(*buffers.all)
    buffers.set_lengths([1] * b, [1] * b)
    plan.check_lengths(*buffers.all)
    cu = buffers.tensors["kv_lengths"]
    cu.copy_(torch.arange(b + 1, dtype=torch.int32, device="cuda").flip(0))
    with pytest.raises(frost_runtime.LengthError, match="decrease"):
        plan.check_lengths(*buffers.all)


def test_lengths_past_the_capacities_stay_inside_the_buffers(manifest):
    """The caller broke the contract: results are unspecified, but the plan reads and writes
    nothing outside its buffers (the scheduling kernel clamps), and does not fault."""
    case = _varlen("padded")
    plan = _load(case)
    buffers = _buffers(case, plan)
    b = case["batch"]
    for name, capacity in (("q_lengths", case["seq_q"]), ("kv_lengths", case["seq_kv"])):
        if name in buffers.tensors:
            buffers.tensors[name].copy_(torch.tensor([capacity + 1000, -5] * b, dtype=torch.int32)[:b])
    buffers.execute()
    torch.cuda.synchronize()
    for name, storage in buffers.storage.items():
        n = buffers.tensors[name].numel()
        assert bool((storage[:4096] == 12345.0).all() and (storage[4096 + n :] == 12345.0).all()), name
