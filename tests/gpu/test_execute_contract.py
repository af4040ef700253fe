"""The execute contract: no host reads or synchronization, CUDA-graph capturable (also on the
first execute), ordered on the stream it is given, safe from several threads, allocation-free,
and never loading a module after `load()`."""

import contextlib
import math
import threading

import pytest

from tests.gpu.support import BUILT, built_manifest_entries, gpu_skip_reason, reference

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")]


def _case() -> dict | None:
    for case in built_manifest_entries():
        if case["dtype"] == "bf16" and case["head_dim"] == 128 and case["lse"] and case["seq_q"] == 1000:
            return case
    return None


@pytest.fixture(scope="module")
def case(manifest):
    found = _case()
    if found is None:
        pytest.skip("no bf16 d128 plan with LSE and 1000-row sequences among the built plans")
    return found


def _load(case):
    import frost_runtime

    return frost_runtime.load(BUILT / case["plan"])


class Buffers:
    """Inputs with fresh random values, outputs poisoned; `refill` keeps the same storage."""

    def __init__(self, case):
        self.case = case
        b, hq, hkv, sq, skv, d = (case[k] for k in ("batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim"))
        rows = ((hq, sq), (hkv, skv), (hkv, skv), (hq, sq))
        self.q, self.k, self.v, self.o = (self._alloc(b, h, s, d) for h, s in rows)
        self.lse = torch.empty(b, hq, sq, device="cuda")
        self.refill()

    def _alloc(self, b, h, s, d):
        if self.case["layout"] == "bhsd":
            return torch.empty(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        return torch.empty(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)

    def refill(self, stream=None):
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for t in (self.q, self.k, self.v):
                t.copy_(torch.randn(t.shape, device="cuda", dtype=t.dtype))
            self.o.fill_(float("nan"))
            self.lse.fill_(float("nan"))

    @property
    def all(self):
        return (self.q, self.k, self.v, self.o, self.lse)

    def assert_correct(self):
        ref_o, ref_lse = reference(self.case, self.q, self.k, self.v, 1 / math.sqrt(self.case["head_dim"]))
        rel = ((self.o.double() - ref_o).norm() / ref_o.norm()).item()
        assert rel < 1.2e-2, f"O relative error {rel:.2e}"
        assert (self.lse.double() - ref_lse).abs().max().item() < 2e-3


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
    plan, buffers = _load(case), Buffers(case)
    bound = plan.bind(*buffers.all)
    torch.cuda.synchronize()
    with banned_host_reads(monkeypatch):
        plan.execute(*buffers.all)
        plan.execute_named(dict(zip(plan.slots, buffers.all)))
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
    plan, buffers = _load(case), Buffers(case)
    stream = torch.cuda.Stream()
    plan.execute(*buffers.all)  # a warm execute before capture, as serving engines do
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        plan.execute(*buffers.all, stream=stream if explicit_stream else None)
    for _ in range(3):
        buffers.refill()
        graph.replay()
        torch.cuda.synchronize()
        buffers.assert_correct()


def test_captured_bound_execute_replays_on_new_inputs(case):
    plan, buffers = _load(case), Buffers(case)
    bound = plan.bind(*buffers.all)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bound.execute()
    for _ in range(2):
        buffers.refill()
        graph.replay()
        torch.cuda.synchronize()
        buffers.assert_correct()


def test_first_execute_may_happen_inside_a_capture(case):
    plan, buffers = _load(case), Buffers(case)  # loaded, never executed
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.execute(*buffers.all)
    buffers.refill()
    graph.replay()
    torch.cuda.synchronize()
    buffers.assert_correct()


# ---------------------------------------------------------------------------- streams, threads


def test_launch_is_ordered_on_the_given_stream(case):
    """New inputs are written on the side stream after long work there; execute on the same
    stream must see them, while the default stream is busy with long work of its own."""
    plan, buffers = _load(case), Buffers(case)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):  # keep the default stream busy
        big @ big
    with torch.cuda.stream(side):
        for _ in range(20):  # the side stream is busy too, before its inputs are final
            big @ big
        buffers.refill(stream=side)
        plan.execute(*buffers.all, stream=side)
    side.synchronize()
    buffers.assert_correct()


def test_four_threads_on_four_streams(case):
    plan = _load(case)
    sets = [Buffers(case) for _ in range(4)]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in sets]
    errors = []

    def worker(buffers, stream):
        try:
            bound = plan.bind(*buffers.all)
            for i in range(50):
                if i % 2:
                    plan.execute(*buffers.all, stream=stream)
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
    plan, buffers = _load(case), Buffers(case)
    plan.execute(*buffers.all)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    for _ in range(1000):
        plan.execute(*buffers.all)
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    for key in ("allocation.all.allocated", "segment.all.allocated", "reserved_bytes.all.current"):
        assert after.get(key) == before.get(key), key


def test_no_module_load_after_load(case, monkeypatch):
    from cuda.bindings import driver as cu

    plan, buffers = _load(case), Buffers(case)
    for name in ("cuModuleLoadData", "cuModuleLoad", "cuLibraryLoadData", "cuModuleGetFunction"):
        monkeypatch.setattr(cu, name, lambda *a, _n=name, **k: pytest.fail(f"execute called {_n}"))
    for _ in range(10):
        plan.execute(*buffers.all)
    torch.cuda.synchronize()
    buffers.assert_correct()
