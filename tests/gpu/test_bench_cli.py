"""`python -m frost_runtime bench` on the GPU: on built plans of each kind (dense, the dense
plan whose tiles come from a zeroed workspace counter, packed with random lengths, two nodes,
paged decode), `--duration 0.2 --json` returns sane numbers, with and without `--graph`; and
the buffers it makes are ones the plan really runs on (its outputs get written)."""

import json
import math

import pytest

from tests.gpu.cases import dynamic_walk_cases
from tests.gpu.decode_support import decode_manifest_entries
from tests.gpu.support import BUILT, built_manifest_entries, gpu_skip_reason

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")]

PEAK_TFLOPS = 1000  # above any H200 bf16/fp16 dense rate: a number past it is a wrong count or time


def _dense_case() -> dict:
    for case in built_manifest_entries():
        if (case["form"], case["dtype"], case["head_dim"], case["causal"], case["seq_q"], case["seq_kv"]) == (
            "dense", "bf16", 128, True, 1000, 1000,
        ) and case["alignment"] == "top_left" and case["window_left"] is None:  # fmt: skip
            return case
    pytest.skip("no dense bf16 d128 causal 1000x1000 plan among the built plans")


def _packed_case() -> dict:
    for case in built_manifest_entries():
        if case["form"] == "packed" and case["causal"] and case["window_left"] is None:
            return case
    pytest.skip("no packed causal plan among the built plans")


def _bench(capsys, plan: str, *extra: str) -> dict:
    from frost_runtime.__main__ import main

    code = main(["bench", str(BUILT / plan), "--duration", "0.2", "--json", *extra])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def _sane(r: dict) -> None:
    assert math.isfinite(r["device_us"]) and r["device_us"] > 0
    assert r["method"]["executes_timed"] >= 200
    assert 0 < r["host_us"]["min"] <= r["host_us"]["median"] < 1000
    assert r["floor_us_per_launch"] is None or 0 < r["floor_us_per_launch"] < 100
    if r["tflops"] is not None:
        assert 0 < r["tflops"] < PEAK_TFLOPS
    if r["tb_s"] is not None:
        assert r["tb_s"] > 0


@pytest.mark.parametrize("graph", [False, True], ids=["stream", "graph"])
def test_dense_plan(capsys, manifest, graph: bool) -> None:
    case = _dense_case()
    r = _bench(capsys, case["plan"], *(["--graph"] if graph else []))
    _sane(r)
    b, hq, s, d = case["batch"], case["heads_q"], case["seq_q"], case["head_dim"]
    assert r["flops"] == 4 * b * hq * s * s * d / 2  # bench/sdpa.py's count
    assert r["method"]["graph"] is graph and r["tb_s"] is None


def test_graph_replays_are_no_slower_than_stream_launches(capsys, manifest) -> None:
    case = _dense_case()
    stream = _bench(capsys, case["plan"])["device_us"]
    graph = _bench(capsys, case["plan"], "--graph")["device_us"]
    assert graph < 1.2 * stream, (graph, stream)


def test_the_counter_plan_under_a_graph(capsys, manifest) -> None:
    """Its workspace holds a zeroed tile counter: the graph's replays must keep working."""
    r = _bench(capsys, f"{dynamic_walk_cases()[0].id}.frost", "--graph")
    _sane(r)
    assert r["tflops"] > 1


def test_packed_plan_with_random_lengths(capsys, manifest) -> None:
    from frost_runtime.plan import length_problem
    from frost_runtime.schema import decode_plan

    case = _packed_case()
    r = _bench(capsys, case["plan"], "--lengths", "random", "--seed", "3")
    _sane(r)
    plan = decode_plan((BUILT / case["plan"]).read_bytes())
    names = [s.name for s in plan.slots]
    for c in plan.lengths:
        assert length_problem(c, r["lengths"][names[c.slot]]["values"]) is None


def test_two_nodes_count_both(capsys, manifest) -> None:
    r = _bench(capsys, "two-nodes.frost")
    _sane(r)
    assert len(r["model"]) == 2


def test_decode_plan_reports_tb_s(capsys, manifest) -> None:
    entries = [e for e in decode_manifest_entries() if e["nodes"] == "both"]
    if not entries:
        pytest.skip("no built decode plans")
    for graph in ([], ["--graph"]):
        r = _bench(capsys, entries[0]["plan"], "--lengths", "random", *graph)
        _sane(r)
        assert r["flops"] is None and r["bytes"] > 0 and r["tb_s"] > 0


@pytest.mark.parametrize("which", ["dense", "packed", "decode"])
def test_the_buffers_are_ones_the_plan_runs_on(manifest, which: str) -> None:
    import frost_runtime
    from frost_runtime import bench, workload

    if which == "decode":
        entries = [e for e in decode_manifest_entries() if e["nodes"] == "both"]
        if not entries:
            pytest.skip("no built decode plans")
        name = entries[0]["plan"]
    else:
        name = (_dense_case() if which == "dense" else _packed_case())["plan"]
    plan = frost_runtime.load(BUILT / name)
    setup = bench.prepare(plan, workload.make_lengths(plan.data), seed=0)
    setup.bound.execute()
    torch.cuda.synchronize()
    o = setup.buffers[plan.slots.index("o")]
    if which == "packed":  # full lengths: the tokens split evenly, all of them rows of a sequence
        assert not torch.isnan(o).any()
    else:
        assert torch.isfinite(o).all()
    plan.close()
