"""The dynamic tile walk under stress: every tile exactly once, launch after launch.

The dynamic walk's CTAs take tiles from a counter in the workspace and hand each to their
consumer warpgroups through shared memory (`TicketWalk`). A lost tile leaves output rows
unwritten, a doubled one is written twice or from the wrong tile; either would show rarely.
The debug builds of tests/gpu/cases.py's `visit_count_cases` make each consumer count its
visits of each tile into the workspace (`debug_tile_visits`). This test launches each of them
LAUNCHES times, each launch with a workspace of its own (so a launch's counts are its own),
and wants every (tile, consumer) count to be exactly 1; then BOUND_LAUNCHES more through one
binding on one workspace (the counter is zeroed once, before the first launch, and must be
left zero by every launch), wanting every count to be exactly BOUND_LAUNCHES. The outputs of
the last launch of each part are checked against float64.
"""

import zlib

import pytest

from tests.gpu.support import BUILT, Buffers, built_manifest_entries, gpu_skip_reason

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")

LAUNCHES = 10_000  # each with its own workspace: counts checked launch by launch
BOUND_LAUNCHES = 2_000  # through one binding: counts add up, the counter must be left zero
WORKSPACE_STRIDE = 256  # each launch's workspace starts on this alignment


def _visit_cases() -> list[dict]:
    return [c for c in built_manifest_entries() if c.get("count_visits")]


def _visits_region(plan):
    (region,) = [r for r in plan.data.workspace if r.name.endswith(".tile_visits")]
    return region


def _describe(counts, expected: int) -> str:
    """Which launches and (tile, consumer) entries were off, and how."""
    bad = (counts != expected).nonzero()
    launches = sorted({int(i) for i in bad[:, 0]})
    values = sorted({int(v) for v in counts[counts != expected].unique()})
    return f"{len(bad)} counts not {expected} in {len(launches)} launches (first {launches[:5]}), values {values}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", _visit_cases(), ids=lambda c: c["plan"].removesuffix(".frost"))
def test_every_tile_is_visited_exactly_once_per_launch(manifest, case):
    import frost_runtime

    torch.manual_seed(zlib.crc32(case["plan"].encode()))
    with frost_runtime.load(BUILT / case["plan"]) as plan:
        region = _visits_region(plan)
        buffers = Buffers(case, plan)
        stride = -(-plan.workspace_bytes // WORKSPACE_STRIDE) * WORKSPACE_STRIDE
        workspaces = torch.zeros(LAUNCHES, stride, dtype=torch.uint8, device="cuda")
        for i in range(LAUNCHES):
            plan.execute(*buffers.all, workspace=workspaces[i, : plan.workspace_bytes])
        torch.cuda.synchronize()
        buffers.assert_correct()
        counts = workspaces[:, region.offset : region.offset + region.bytes].contiguous().view(torch.int32)
        assert counts.shape[1] > 0
        assert bool((counts == 1).all()), _describe(counts, 1)

        workspace = plan.allocate_workspace()
        workspace.zero_()
        buffers.refill()
        bound = plan.bind(*buffers.all, workspace=workspace)
        for _ in range(BOUND_LAUNCHES):
            bound.execute()
        torch.cuda.synchronize()
        buffers.assert_correct()
        counts = workspace[region.offset : region.offset + region.bytes].view(torch.int32)[None]
        assert bool((counts == BOUND_LAUNCHES).all()), _describe(counts, BOUND_LAUNCHES)
        counter = [r for r in plan.data.workspace if r.zeroed]
        for r in counter:
            assert workspace[r.offset : r.offset + r.bytes].view(torch.int32).tolist() == [0], "counter left non-zero"
