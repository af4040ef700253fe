"""The mixed form (packed queries over a paged cache: any mix of chunks and decodes in one step),
through the runtime alone.

For each plan of tests/gpu/mixed_cases.py, one step of every kind of mix (pure decode, 1 + 3
speculative tokens, pure prefill, chunks over long contexts, empty sequences, the capacities'
edges), each with a fresh page table, fresh caches (NaN where no sequence has keys) and NaN
outputs inside guards: every query row against float64, every other row untouched, the caches
unchanged. Then one CUDA graph, captured once, replayed over 100 fresh mixes.
"""

import random
import zlib

import pytest

from tests.gpu.mixed_cases import cases, graph_case
from tests.gpu.mixed_support import KINDS, MIXED, MixedBuffers, draw_mix, mixed_manifest_entries, mixed_skip_reason

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(mixed_skip_reason() is not None, reason=mixed_skip_reason() or "")]
GRAPH_MIXES = 100


def _entry(case) -> dict:
    found = next((e for e in mixed_manifest_entries() if e["plan"] == f"{case.id}.frost"), None)
    if found is None:
        pytest.fail(f"{case.id} is not among the built mixed plans (run `python -m tests.gpu.build_plans`)")
    return found


def _load(entry: dict):
    import frost_runtime

    return frost_runtime.load(MIXED / entry["plan"])


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.id)
def test_every_kind_of_mix(case) -> None:
    entry = _entry(case)
    seed = zlib.crc32(case.id.encode())
    with _load(entry) as plan:
        buffers = MixedBuffers(entry, plan, seed)
        rng = random.Random(seed)
        for kind in KINDS:
            buffers.setup(*draw_mix(entry, rng, kind))
            buffers.execute()
            torch.cuda.synchronize()
            buffers.assert_correct()


def test_one_cuda_graph_serves_a_hundred_fresh_mixes() -> None:
    """The lengths, offsets and page table are device data the plan reads on the device: a
    graph captured once replays every mix, new values written into the same buffers."""
    entry = _entry(graph_case())
    seed = 41
    with _load(entry) as plan:
        buffers = MixedBuffers(entry, plan, seed)
        rng = random.Random(seed)
        buffers.setup(*draw_mix(entry, rng, "chunks"))
        bound = buffers.bind()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            bound.execute()  # a warm execute before capture, as serving engines do
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        buffers.assert_correct()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            bound.execute()
        for i in range(GRAPH_MIXES):
            buffers.setup(*draw_mix(entry, rng, KINDS[i % len(KINDS)]))
            graph.replay()
            torch.cuda.synchronize()
            buffers.assert_correct()
