"""Paged-KV decode plans (kv_append, then sdpa over the paged caches), through the runtime alone.

For each plan of tests/gpu/decode_cases.py, several length mixes (1, each side of a page, the
capacity, random ones), each with a fresh page table (pages of a shuffled pool, poison ids past
a sequence's pages), fresh random caches with NaN everywhere a sequence holds no token, NaN
outputs inside guards: the caches must equal, bitwise, the copy taken before the run with this
step's new rows written where the spec says (nothing else touched), and O and LSE must match a
float64 reference on the gathered cache. Then: kv_append skips positions past the capacity and
page ids outside the pool; a CUDA graph captured once serves 50 decode steps (new inputs in the
same buffers, cache_len += 1 on the device); and the execute contract on a decode plan (no host
reads, binding errors that name the slot).
"""

import random
import zlib

import pytest

from tests.gpu.decode_cases import DecodeCase, cases, contract_case, graph_case, scaled_graph_case
from tests.gpu.decode_support import (
    BUILT,
    DecodeBuffers,
    decode_manifest_entries,
    decode_skip_reason,
    has_append,
    has_attention,
    length_mixes,
    special_lengths,
)
from tests.gpu.support import NVDISASM, disassemble

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(decode_skip_reason() is not None, reason=decode_skip_reason() or "")]
GRAPH_STEPS = 50


def _load(case: dict):
    import frost_runtime

    return frost_runtime.load(BUILT / case["plan"])


def _entry(case: DecodeCase) -> dict:
    found = next((e for e in decode_manifest_entries() if e["plan"] == f"{case.id}.frost"), None)
    if found is None:
        pytest.fail(f"{case.id} is not among the built decode plans (did its build fail? see build_plans' output)")
    return found


def _attention_launches(plan) -> int:
    return sum(1 for launch in plan.data.launches if launch.node == "attn")


# ---------------------------------------------------------------------------- the matrix


def test_every_decode_case_was_built():
    built = {e["plan"] for e in decode_manifest_entries()}
    missing = [c.id for c in cases() if f"{c.id}.frost" not in built]
    assert not missing, f"{len(missing)} decode plans were not built: {missing}"


def test_the_matrix_meets_split_kv_and_single_launch_attention():
    """Some plans must take the split-KV path (partial results + combine: two launches for the
    attention node) and some the single launch, or half of the kernels go untested."""
    counts = {}
    for entry in decode_manifest_entries():
        if has_attention(entry):
            with _load(entry) as plan:
                counts[entry["plan"]] = _attention_launches(plan)
    assert any(n >= 2 for n in counts.values()), f"no decode plan chose split-KV: {counts}"
    assert any(n == 1 for n in counts.values()), f"every decode plan chose split-KV: {counts}"


@pytest.mark.parametrize("case", decode_manifest_entries(), ids=lambda c: c["plan"].removesuffix(".frost"))
def test_decode_plan_matches_float64_reference(case):
    seed = zlib.crc32(case["plan"].encode())
    torch.manual_seed(seed)
    rng = random.Random(seed)
    with _load(case) as plan:
        buffers = DecodeBuffers(case, plan, seed)
        for lens in length_mixes(case, rng):
            buffers.setup(lens)
            buffers.execute()
            torch.cuda.synchronize()
            buffers.assert_correct()


# ---------------------------------------------------------------------------- early launches


def _early_pairs() -> list[tuple[str, object, object]]:
    """(plan, its early launch's kernel, the launch ahead's kernel) of every built decode plan."""
    from frost_runtime.schema import decode_plan

    found = []
    for entry in decode_manifest_entries():
        plan = decode_plan((BUILT / entry["plan"]).read_bytes())
        for i, launch in enumerate(plan.launches):
            if launch.early:
                found.append((entry["plan"], plan.kernels[launch.kernel], plan.kernels[plan.launches[i - 1].kernel]))
    return found


@pytest.mark.skipif(not NVDISASM.exists(), reason="no nvdisasm (the CUDA toolkit's) to read the kernels' SASS")
def test_every_early_launch_waits_for_the_launch_ahead_which_lets_it_start():
    """A launch that starts early must wait (griddepcontrol.wait, SASS ACQBULK) before it reads
    what the launch ahead writes, and that one lets it start (launch_dependents, PREEXIT).
    Checked in the SASS: the race a missing wait leaves is one timing rarely shows (an
    attention built without its wait passed every decode test, bench/NOTES.md). Each distinct
    cubin is disassembled once, in parallel (one nvdisasm process each)."""
    pairs = _early_pairs()
    assert pairs, "no decode plan has an early launch"
    cubins = list({k.cubin: None for _, kernel, ahead in pairs for k in (kernel, ahead)})
    sass = disassemble(cubins)
    for plan, kernel, ahead in pairs:
        assert "ACQBULK" in sass[kernel.cubin], f"{plan}: {kernel.name} never waits"
        assert "PREEXIT" in sass[ahead.cubin], f"{plan}: {ahead.name} never lets it start"


# ---------------------------------------------------------------------------- kv_append's edges


def test_append_skips_positions_past_the_capacity_and_pages_outside_the_pool():
    """Broken contracts (a length over the capacity, a bad page id, a length under s_new) write
    nothing outside the buffers and nothing where the spec says to skip; the other rows land."""
    case = _entry(next(c for c in cases() if c.nodes == "append"))
    b, p, n, cap = case["batch"], case["page_size"], case["s_new"], case["capacity"]
    assert b >= 4 and 3 <= n <= p, "this test needs four sequences and three or more new tokens"
    # sequence 0: two tokens land in its last page, two are past the capacity;
    # sequence 1: the page its new tokens go to (its third) is a poison id, in three forms;
    # sequence 2: its first positions are negative (len n - 2); sequence 3 and the rest: normal
    lens = [cap + 2, 3 * p, n - 2, 2 * p + 1] + [p] * (b - 4)
    writes = 2 + 0 + 2 + n + n * (b - 4)
    with _load(case) as plan:
        buffers = DecodeBuffers(case, plan, 7)
        buffers.setup(lens, reach=[cap, 3 * p, n, 2 * p + 1] + [p] * (b - 4), poison={(1, 2): -1})
        for bad_page in (-1, case["pages"], 2**31 - 1):
            buffers.table[1][2] = bad_page
            buffers.tensors["page_table"][1, 2] = bad_page
            buffers.new_inputs()  # fresh new rows; the snapshot is the caches as they are now
            buffers.execute()
            torch.cuda.synchronize()
            assert len(list(buffers.appended_rows())) == 2 * writes, "the test's own bookkeeping"
            buffers.assert_caches()


# ---------------------------------------------------------------------------- one graph, 50 steps


@pytest.mark.parametrize(
    "pick", [graph_case, contract_case, scaled_graph_case], ids=["small-pages", "long-sequence", "e4m3-cache"]
)
def test_one_graph_serves_fifty_decode_steps(pick):
    """Captured once on a side stream; each step copies new q, k_new, v_new into the same
    buffers, adds one to cache_len on the device (the pages for the growth are in the table
    already), replays, and checks O and the caches; the graph is never captured again."""
    case = _entry(pick())
    p, cap = case["page_size"], case["capacity"]
    rng = random.Random(50)
    with _load(case) as plan:
        buffers = DecodeBuffers(case, plan, 50)
        room = cap - GRAPH_STEPS + 1
        starts = special_lengths(case, room) + [rng.randint(1, room) for _ in range(case["batch"])]
        rng.shuffle(starts)
        lens = [starts[i % len(starts)] for i in range(case["batch"])]
        lens[0] = p - 3 if p > 3 else 1  # crosses a page boundary during the loop
        buffers.setup(lens, reach=[x + GRAPH_STEPS - 1 for x in lens])
        bound = buffers.bind()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            bound.execute()  # a warm execute before capture, as serving engines do
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        expected = buffers.assert_correct()
        buffers.before = expected
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            bound.execute()
        for step in range(GRAPH_STEPS):
            if step:
                buffers.tensors["cache_len"].add_(1)  # in place, on the device
                buffers.lens = [x + 1 for x in buffers.lens]
            buffers.new_inputs(snapshot=False)  # from the step before's expected caches, not a re-read
            graph.replay()
            torch.cuda.synchronize()
            try:
                buffers.before = buffers.assert_correct()
            except AssertionError as exc:
                raise AssertionError(f"step {step} (lengths {buffers.lens}): {exc}") from None


# ---------------------------------------------------------------------------- the execute contract


def test_decode_execute_reads_nothing_back_and_never_synchronizes(monkeypatch):
    from tests.gpu.test_execute_contract import banned_host_reads

    case = _entry(contract_case())
    with _load(case) as plan:
        buffers = DecodeBuffers(case, plan, 3)
        buffers.setup([case["capacity"] - 5] * case["batch"])
        bound = buffers.bind()
        torch.cuda.synchronize()
        with banned_host_reads(monkeypatch):
            plan.execute(*buffers.all, workspace=buffers.workspace)
            bound.execute()  # appends the same rows again: the caches end the same
        torch.cuda.synchronize()
        buffers.assert_correct()


def test_first_decode_execute_may_happen_inside_a_capture():
    case = _entry(contract_case())
    with _load(case) as plan:
        buffers = DecodeBuffers(case, plan, 4)
        buffers.setup([case["page_size"] + 1] * case["batch"])
        bound = buffers.bind()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        with torch.cuda.graph(graph, stream=side):
            bound.execute()
        torch.cuda.synchronize()
        buffers.assert_caches(buffers.before)  # capturing launched nothing
        graph.replay()
        torch.cuda.synchronize()
        buffers.assert_correct()


def _refused(plan, buffers, replace: dict, workspace, *words):
    import frost_runtime

    args = [replace.get(name, buffers.tensors[name]) for name in plan.slots]
    for call in (lambda: plan.execute(*args, workspace=workspace), lambda: plan.bind(*args, workspace=workspace)):
        with pytest.raises(frost_runtime.BindError) as info:
            call()
        for word in words:
            assert word in str(info.value), f"{words}: {info.value}"


def test_decode_binding_errors_name_the_slot_and_launch_nothing():
    case = _entry(contract_case())
    with _load(case) as plan:
        buffers = DecodeBuffers(case, plan, 5)
        buffers.setup([case["capacity"] // 2] * case["batch"])
        t, ws = buffers.tensors, buffers.workspace
        _refused(plan, buffers, {"page_table": t["page_table"].long()}, ws, "'page_table'", "dtype")
        _refused(plan, buffers, {"cache_len": torch.zeros(case["batch"] + 1, dtype=torch.int32, device="cuda")}, ws,
                 "'cache_len'", "shape")  # fmt: skip
        _refused(plan, buffers, {"k_cache": t["k_cache"][:, :-1]}, ws, "'k_cache'", "shape")
        other = torch.float16 if case["dtype"] == "bf16" else torch.bfloat16
        _refused(plan, buffers, {"v_cache": t["v_cache"].to(other)}, ws, "'v_cache'", "dtype")
        torch.cuda.synchronize()
        assert bool(torch.isnan(t["o"]).all()), "a refused execute must launch nothing"
        buffers.assert_caches(buffers.before)  # no append either


def test_decode_workspace_too_small_is_refused():
    import frost_runtime

    with_workspace = None
    for entry in decode_manifest_entries():
        with _load(entry) as plan:
            if plan.workspace_bytes > 0:
                with_workspace = entry
                break
    if with_workspace is None:
        pytest.skip("no decode plan needs a workspace (none chose split-KV): nothing to refuse")
    with _load(with_workspace) as plan:
        buffers = DecodeBuffers(with_workspace, plan, 6)
        buffers.setup([with_workspace["capacity"]] * with_workspace["batch"])
        for words, workspace in (("needs a workspace", None), ("bytes, this plan needs", buffers.workspace[:-1])):
            with pytest.raises(frost_runtime.BindError, match=words):
                plan.execute(*buffers.all, workspace=workspace)
            with pytest.raises(frost_runtime.BindError, match=words):
                plan.bind(*buffers.all, workspace=workspace)
        torch.cuda.synchronize()
        if has_attention(with_workspace):
            assert bool(torch.isnan(buffers.tensors["o"]).all()), "a refused execute must launch nothing"
        if has_append(with_workspace):
            buffers.assert_caches(buffers.before)
