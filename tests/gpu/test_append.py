"""kv_append's ragged forms (packed: cu_seqlens_q through a page table and the lengths; slots:
vLLM's slot_mapping), through the runtime alone.

For each plan of tests/gpu/append_cases.py, several token mixes (one long chunk among single
decodes filling the capacity exactly, random splits with empty sequences, decodes with
speculative tokens and chunks with padding after them, an empty step, one sequence taking every
token), each with a fresh page table and lengths, the caches random bits inside guards: the
caches must equal, bitwise, the copy taken before the run with exactly the step's new rows
written where the spec says (an e4m3 cache: quantized by the spec's rule). Then: broken
contracts (prefix sums that start late, decrease or run past the tokens; lengths under a
sequence's tokens or past its capacity; poison page ids; slots outside the pool) write nothing
outside the buffers and nothing the clamps skip; and one CUDA graph serves twenty fresh mixes.
"""

import random
import zlib

import pytest

from tests.gpu.append_cases import cases, edge_case, graph_case
from tests.gpu.append_support import (
    BUILT,
    AppendBuffers,
    Step,
    append_manifest_entries,
    append_skip_reason,
    draw_step,
    spec_targets,
    targets,
    token_mixes,
)
from tests.gpu.decode_support import INT32_MAX

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(append_skip_reason() is not None, reason=append_skip_reason() or "")]
GRAPH_MIXES = 20


def _load(case: dict):
    import frost_runtime

    return frost_runtime.load(BUILT / case["plan"])


def _entry(case) -> dict:
    found = next((e for e in append_manifest_entries() if e["plan"] == f"{case.id}.frost"), None)
    if found is None:
        pytest.fail(f"{case.id} is not among the built append plans (did its build fail? see build_plans' output)")
    return found


def _run_and_check(buffers: AppendBuffers, what: str, run=None) -> None:
    """One run (an execute, or `run`), then the caches bitwise; a failure says which step."""
    (run or buffers.execute)()
    torch.cuda.synchronize()
    try:
        buffers.assert_caches()
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


def test_every_append_case_was_built():
    built = {e["plan"] for e in append_manifest_entries()}
    missing = [c.id for c in cases() if f"{c.id}.frost" not in built]
    assert not missing, f"{len(missing)} append plans were not built: {missing}"


def test_each_plan_is_one_launch_of_one_cta_per_token():
    for entry in append_manifest_entries():
        with _load(entry) as plan:
            (launch,) = plan.data.launches
            kernel = plan.data.kernels[launch.kernel]
            assert kernel.name.endswith(f".{entry['form']}") and launch.grid == (entry["tokens"], 1, 1)
            assert not launch.early


@pytest.mark.parametrize("case", append_manifest_entries(), ids=lambda c: c["plan"].removesuffix(".frost"))
def test_append_writes_exactly_the_new_rows(case):
    seed = zlib.crc32(case["plan"].encode())
    rng = random.Random(seed)
    with _load(case) as plan:
        buffers = AppendBuffers(case, plan, seed)
        for i, counts in enumerate(token_mixes(case, rng)):
            step = draw_step(case, counts, rng, holes=0.1 if i == 2 else 0.0)
            assert targets(case, step) == spec_targets(case, step), "the test's own bookkeeping"
            buffers.write(step)
            _run_and_check(buffers, f"mix {i} (tokens per sequence {counts})")


def test_packed_broken_contracts_write_nothing_the_clamps_skip():
    """Prefix sums that start past 0 (tokens before cu[0]), decrease (a sequence of negative
    count, and the tokens two sequences then claim), run past the tokens (clamped); lengths
    under a sequence's count (negative positions), past its capacity, negative; poison page ids
    where new rows fall. Nothing outside the caches, and exactly the clamped rows, are written."""
    case = _entry(edge_case("packed"))
    b, p, tokens, cap, pages = case["batch"], case["page_size"], case["tokens"], case["capacity"], case["pages"]
    assert b >= 6 and tokens >= 40 and cap >= 2 * p, "this test needs six sequences and some room"
    rng = random.Random(11)
    with _load(case) as plan:
        buffers = AppendBuffers(case, plan, 11)
        base = draw_step(case, [4] * b, rng)
        steps = {
            # tokens 0..2 precede cu[0]; sequence 1 runs backwards; the last sequence runs past the tokens
            "prefix sums": Step(base.counts, [3, 9, 5, 20, 26, 30] + [31] * (b - 6) + [tokens + 50], base.lens,
                                base.table, base.slots),
            # lengths: under the count, past the capacity, negative, INT32_MAX
            "lengths": Step(base.counts, base.cu, [2, cap + 2, -5, INT32_MAX] + base.lens[4:], base.table, base.slots),
            # page ids where sequence 0's new rows fall: -1, the pool's size, INT32_MAX
            "page ids": Step(base.counts, base.cu, base.lens,
                             [[-1 if j == (base.lens[0] - 1) // p else x for j, x in enumerate(base.table[0])]]
                             + [[pages] * len(row) for row in base.table[1:2]]
                             + [[INT32_MAX] * len(row) for row in base.table[2:3]] + base.table[3:], base.slots),
            # every token of the capacity claimed, the last sequence's span clamped to the tokens
            "past the tokens": Step(base.counts, [0] * b + [tokens * 2], base.lens, base.table, base.slots),
        }  # fmt: skip
        for what, step in steps.items():
            written = targets(case, step)
            assert len({(page, row) for _, page, row in written}) == len(written), "the test's own bookkeeping"
            buffers.write(step)
            _run_and_check(buffers, f"{what} (cu {step.cu}, lengths {step.lens})")


def test_slots_outside_the_pool_are_skipped():
    """Slots -1 (padding), other negatives, the first row past the pool, INT32_MAX and
    INT32_MIN write nothing; the valid slots among them land."""
    case = _entry(edge_case("slots"))
    rows = case["pages"] * case["page_size"]
    rng = random.Random(12)
    with _load(case) as plan:
        buffers = AppendBuffers(case, plan, 12)
        step = draw_step(case, token_mixes(case, rng)[1], rng)
        bad = (-1, -7, rows, rows + case["page_size"], INT32_MAX, -(2**31))
        for i in range(0, case["tokens"], 3):
            step.slots[i] = bad[(i // 3) % len(bad)]
        assert any(s >= 0 for s in step.slots)
        assert targets(case, step) == [t for t in spec_targets(case, step) if t[1] < case["pages"]]
        buffers.write(step)
        _run_and_check(buffers, "slots outside the pool")


def test_one_graph_serves_twenty_fresh_mixes():
    """Captured once on a side stream; each replay takes new prefix sums, lengths, page table
    and new rows, written into the same buffers (on the device: no re-capture), and fresh caches."""
    case = _entry(graph_case())
    rng = random.Random(20)
    with _load(case) as plan:
        buffers = AppendBuffers(case, plan, 20)
        mixes = [m for _ in range(GRAPH_MIXES // 5 + 1) for m in token_mixes(case, rng)][:GRAPH_MIXES]
        buffers.write(draw_step(case, mixes[0], rng))
        bound = buffers.bind()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            bound.execute()  # a warm execute before capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            bound.execute()
        for i, counts in enumerate(mixes):
            buffers.write(draw_step(case, counts, rng))
            _run_and_check(buffers, f"replay {i} (tokens per sequence {counts})", graph.replay)
