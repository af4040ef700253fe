"""FP8 (e4m3) attention with variable lengths on the GPU: the padded and packed plans of
tests/gpu/fp8_cases.py against float64 attention on the dequantized inputs.

Each plan runs on several draws of lengths (the 16-bit tests' mix: 0, tile edges, the
capacity, random; packed sequences may start past token 0), with every input row outside the
sequences NaN: padding rows, tokens outside the packed sequences and, in a padded V's
transposed storage, the keys past each sequence and the pitch's columns. The kernel reads V
through one tensor map per sequence whose key extent ends the sequence (the scheduling kernel
writes them; packed V is first re-laid into the workspace from 16-key boundaries), so a key past
the end arrives as zero; one read of a NaN would turn its rows of O into NaN, even multiplied by
a zero probability. O and the LSE are poisoned inside sentinel guards: rows outside the
sequences must stay NaN. The error bound is the dense FP8 tests' (tests/gpu/test_fp8_dense.py
says why).
"""

from __future__ import annotations

import json
import random
import zlib

import pytest

from tests.gpu.fp8_support import BOUND, FP8_BUILT, LSE_TOLERANCE, Fp8VarlenRun, fp8_skip_reason
from tests.gpu.support import draw_lengths

torch = pytest.importorskip("torch")

DRAWS = 3  # length draws per plan, after one at the capacities


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(fp8_skip_reason() is not None, reason=fp8_skip_reason() or "")]


def _varlen_cases() -> list[dict]:
    path = FP8_BUILT / "manifest.json"
    cases = json.loads(path.read_text()) if path.exists() else []
    return [c for c in cases if c.get("form", "dense") != "dense"]


def _full_lengths(case: dict) -> tuple[list[int], list[int], int]:
    """Every sequence at its longest (packed: as many as the tokens hold)."""
    b = case["batch"]
    if case["form"] == "padded":
        return [case["seq_q"]] * b, [case["seq_kv"]] * b, 0

    def side(longest: int, tokens: int) -> list[int]:
        out, room = [], tokens
        for _ in range(b):
            out.append(min(longest, room))
            room -= out[-1]
        return out

    return side(case["seq_q"], case["tokens_q"]), side(case["seq_kv"], case["tokens_kv"]), 0


def _load(case: dict):
    import frost_runtime

    return frost_runtime.load(FP8_BUILT / case["plan"])


@pytest.mark.parametrize("case", _varlen_cases(), ids=lambda c: c["id"])
def test_fp8_varlen_plan_matches_float64(case, record_property):
    plan = _load(case)
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(case["id"].encode()))
    rng = random.Random(case["id"])
    run = Fp8VarlenRun(case, plan, gen, _full_lengths(case))
    worst = (0.0, 0.0)
    for draw in range(DRAWS + 1):
        if draw:
            run.fill(gen, draw_lengths(case, rng))
        run.execute()
        o_err, lse_err = run.errors()
        lens = f"q {run.q_lens}, kv {run.kv_lens}, start {run.start}"
        assert o_err < BOUND["normal"], f"draw {draw} ({lens}): relative L2 error {o_err:.3e}"
        assert lse_err < LSE_TOLERANCE, f"draw {draw} ({lens}): LSE error {lse_err:.3e}"
        worst = (max(worst[0], o_err), max(worst[1], lse_err))
    record_property("relative_l2", worst[0])
    print(f"\n{case['id']}: worst relative L2 of O {worst[0]:.2e}, LSE max abs error {worst[1]:.2e}")


def test_fp8_varlen_plan_in_a_cuda_graph_follows_new_lengths():
    """Bound and captured once; new lengths (and values) written into the same buffers after the
    capture: each replay's scheduling kernel writes that replay's Vᵀ maps, so the replay ends
    every sequence where its new length says (NaN past it would show otherwise)."""
    case = next(c for c in _varlen_cases() if c["form"] == "packed")
    plan = _load(case)
    gen = torch.Generator(device="cuda").manual_seed(11)
    rng = random.Random(11)
    run = Fp8VarlenRun(case, plan, gen, draw_lengths(case, rng))
    bound = plan.bind(*(run.tensors[name] for name in plan.slots), workspace=run.workspace)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        bound.execute()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bound.execute()
    for _ in range(3):
        run.fill(gen, draw_lengths(case, rng))
        graph.replay()
        torch.cuda.synchronize()
        run.assert_correct()
