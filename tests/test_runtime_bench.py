"""`python -m frost_runtime bench|check` on a machine without a GPU: argument parsing, the
FLOP/byte model of real plans (built here, small) against the benchmarks' own formulas, length
generation within the plans' contracts, buffers made on the CPU, and the exit codes.

The plans reuse kernel variants that other CPU tests compile too (frostc.compile caches them
per process), so building them adds little to a whole run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from frost_runtime import bench, timing, workload
from frost_runtime.__main__ import main, parser
from frost_runtime.plan import length_problem
from frost_runtime.schema import Header, LengthContract, PlanData, TensorSlot, decode_plan
from frost_runtime.verdict import probe_gpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frostc import GraphBuilder
from frostc.build import build

# ------------------------------------------------------------------------------------ the plans

B, HQ, HKV, D = 2, 4, 2, 128


def _dense(name: str, shape_q, shape_kv, causal: bool, lse: bool, d: int = D, **mask) -> bytes:
    g = GraphBuilder(name)
    for t, shape in (("q", shape_q), ("k", shape_kv), ("v", shape_kv), ("o", shape_q)):
        g.tensor(t, dtype="bf16", dims=(*shape, d), layout="bhsd")
    if lse:
        g.tensor("lse", dtype="fp32", dims=shape_q)
    g.sdpa(q="q", k="k", v="v", o="o", lse="lse" if lse else None, causal=causal or None, **mask)
    return build(g.build())


def _packed() -> bytes:
    g = GraphBuilder("packed")
    for t, heads in (("q", HQ), ("k", HKV), ("v", HKV), ("o", HQ)):
        g.tensor(t, dtype="bf16", dims=(1000, heads, D))
    g.tensor("lse", dtype="fp32", dims=(1000, HQ), layout="ht")
    g.tensor("cu_q", dtype="int32", dims=(5,))
    g.tensor("cu_kv", dtype="int32", dims=(5,))
    g.sdpa(q="q", k="k", v="v", o="o", lse="lse", cu_seqlens_q="cu_q", cu_seqlens_kv="cu_kv",
           max_seqlen_q=400, max_seqlen_kv=400, causal=True)  # fmt: skip
    return build(g.build())


def _padded() -> bytes:
    g = GraphBuilder("padded")
    for t, heads in (("q", HQ), ("k", HKV), ("v", HKV), ("o", HQ)):
        g.tensor(t, dtype="bf16", dims=(3, heads, 300, D), layout="bshd")
    g.tensor("lse", dtype="fp32", dims=(3, HQ, 300))
    g.tensor("len_kv", dtype="int32", dims=(3,))
    g.sdpa(q="q", k="k", v="v", o="o", lse="lse", seq_len_kv="len_kv", causal=True)
    return build(g.build())


PAGE, MAX_PAGES, PAGES = 16, 512, 300  # a pool smaller than batch x max_pages (tests/test_sdpa_paged.py's)


def _decode(cache: str = "bf16") -> bytes:
    g = GraphBuilder("decode")
    for t, heads in (("k_new", HKV), ("v_new", HKV), ("q", 8), ("o", 8)):
        g.tensor(t, dtype="bf16", dims=(B, heads, 1, D), layout="bshd")
    g.tensor("lse", dtype="fp32", dims=(B, 8, 1))
    for t in ("k_cache", "v_cache"):
        g.tensor(t, dtype=cache, dims=(PAGES, PAGE, HKV, D))
    g.tensor("page_table", dtype="int32", dims=(B, MAX_PAGES))
    g.tensor("cache_len", dtype="int32", dims=(B,))
    paged = {"k_cache": "k_cache", "v_cache": "v_cache", "page_table": "page_table", "seq_len_kv": "cache_len"}
    if cache == "e4m3":
        for t in ("k_scale", "v_scale"):
            paged[t] = g.tensor(t, dtype="fp32", dims=(HKV,))
    g.node("kv_append", name="append", k="k_new", v="v_new", **paged)
    scales = {t: paged[t] for t in ("k_scale", "v_scale") if t in paged}
    g.sdpa(name="attn", q="q", k="k_cache", v="v_cache", o="o", lse="lse", page_table="page_table",
           seq_len_kv="cache_len", causal=True, **scales)  # fmt: skip
    return build(g.build())


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("plans")
    made = {
        "full": _dense("full", (B, HQ, 200), (B, HKV, 300), causal=False, lse=False),
        "causal": _dense("causal", (B, HQ, 256), (B, HKV, 256), causal=True, lse=True),
        "local": _dense("local", (1, HQ, 500), (1, HKV, 500), True, False, d=256, window_left=99, softcap=30.0),
        "left": _dense("left", (1, HQ, 300), (1, HKV, 300), causal=False, lse=False, window_left=50),
        "packed": _packed(),
        "padded": _padded(),
        "decode": _decode(),
        "decode-e4m3": _decode("e4m3"),
    }
    paths = {}
    for name, data in made.items():
        paths[name] = folder / f"{name}.frost"
        paths[name].write_bytes(data)
    return paths


def data(plans: dict[str, Path], name: str) -> PlanData:
    return decode_plan(plans[name].read_bytes())


def named(plan: PlanData, values: dict[int, list[int]]) -> dict[str, list[int]]:
    return {plan.slots[slot].name: v for slot, v in values.items()}


# ------------------------------------------------------------------------------------ arguments


def test_bench_arguments_and_their_defaults() -> None:
    args = parser().parse_args(["bench", "p.frost"])
    assert (args.plan, args.duration, args.graph, args.lengths, args.seed, args.json) == (
        "p.frost", timing.WINDOW_S, False, None, 0, False,
    )  # fmt: skip
    args = parser().parse_args(
        ["bench", "p.frost", "--duration", "0.2", "--graph", "--lengths", "random", "cu_q=1,2", "--seed", "7", "--json"]
    )
    assert (args.duration, args.graph, args.seed, args.json) == (0.2, True, 7, True)
    assert args.lengths == ["random", "cu_q=1,2"]


def test_check_arguments() -> None:
    args = parser().parse_args(["check", "p.frost", "--json"])
    assert (args.command, args.plan, args.json) == ("check", "p.frost", True)


@pytest.mark.parametrize(
    "argv",
    [[], ["bench"], ["bench", "p", "--duration", "0"], ["bench", "p", "--duration", "-1"],
     ["bench", "p", "--duration", "x"], ["bench", "p", "--lengths"], ["run", "p"]],
)  # fmt: skip
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(argv)
    assert info.value.code == 2
    assert "usage" in capsys.readouterr().err


def test_bench_help_documents_the_lengths_syntax(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["bench", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for word in ("--duration", "--graph", "random", "SLOT=SPEC", "N,N,...", "cu_seqlens", "--seed"):
        assert word in out, word


@pytest.mark.parametrize(
    "specs, default, named",
    [
        (None, "full", {}),
        (["random"], "random", {}),
        (["512"], [512], {}),
        (["1,2,3"], [1, 2, 3], {}),
        (["random", "cache_len=4096"], "random", {"cache_len": [4096]}),
        (["cu_q=full", "cu_kv=5,6"], "full", {"cu_q": "full", "cu_kv": [5, 6]}),
    ],
)
def test_lengths_specs_parse(specs, default, named) -> None:
    assert workload.parse_lengths(specs) == (default, named)


@pytest.mark.parametrize(
    "specs, words",
    [
        (["x"], "expected full, random"),
        (["1,,2"], "expected full, random"),
        (["=5"], "slot name"),
        (["a=1", "a=2"], "twice"),
        (["full", "random"], "one SPEC without a slot name"),
        (["-3"], "not negative"),
    ],
)
def test_bad_lengths_specs_are_refused(specs, words: str) -> None:
    with pytest.raises(workload.LengthSpecError, match=words):
        workload.parse_lengths(specs)


# ------------------------------------------------------------------------------------ the model


def brute_pairs(q_len: int, kv_len: int, m: workload.Mask) -> int:
    shift = kv_len - q_len if m.bottom_right else 0
    total = 0
    for i in range(q_len):
        hi = min(kv_len, i + shift + m.window_right + 1) if m.right else kv_len
        lo = max(0, i + shift - m.window_left) if m.left else 0
        total += max(0, hi - lo)
    return total


@settings(max_examples=400, deadline=None)
@given(
    q_len=st.integers(0, 300),
    kv_len=st.integers(0, 300),
    right=st.booleans(),
    left=st.booleans(),
    bottom_right=st.booleans(),
    window_left=st.integers(0, 400),
    window_right=st.integers(0, 400),
)
def test_visible_pairs_match_a_row_by_row_count(q_len, kv_len, right, left, bottom_right, window_left, window_right):
    m = workload.Mask(right, left, bottom_right, window_left if left else 0, window_right if right else 0)
    assert workload.visible_pairs(q_len, kv_len, m) == brute_pairs(q_len, kv_len, m)


def test_attention_nodes_are_read_from_the_node_records(plans) -> None:
    (full,) = workload.attention_nodes(data(plans, "full"))
    assert (full.form, full.batch, full.heads_q, full.heads_kv, full.head_dim, full.seq_q, full.seq_kv) == (
        "dense", B, HQ, HKV, D, 200, 300,
    )  # fmt: skip
    assert full.mask == workload.Mask()
    (local,) = workload.attention_nodes(data(plans, "local"))
    assert (local.head_dim, local.mask) == (256, workload.Mask(right=True, left=True, window_left=99))
    (packed,) = workload.attention_nodes(data(plans, "packed"))
    slots = [s.name for s in data(plans, "packed").slots]
    assert (packed.form, packed.seq_q, slots[packed.q_lengths], slots[packed.kv_lengths]) == (
        "packed", 400, "cu_q", "cu_kv",
    )  # fmt: skip
    (padded,) = workload.attention_nodes(data(plans, "padded"))
    assert (padded.form, padded.q_lengths, data(plans, "padded").slots[padded.kv_lengths].name) == (
        "padded", -1, "len_kv",
    )  # fmt: skip
    (paged,) = workload.attention_nodes(data(plans, "decode"))
    assert (paged.form, paged.batch, paged.heads_q, paged.heads_kv, paged.seq_q, paged.seq_kv) == (
        "paged", B, 8, HKV, 1, MAX_PAGES * PAGE,
    )  # fmt: skip
    assert paged.mask.right and paged.mask.bottom_right and paged.element_bytes == 2
    (left,) = workload.attention_nodes(data(plans, "left"))  # a left window alone: no right bound
    assert left.mask == workload.Mask(left=True, window_left=50)


def anonymous(plan: PlanData) -> PlanData:
    """The plan with every kernel and parameter renamed: what a node computes must come from its
    record, never from a kernel's name or its parameters' names."""
    kernels = tuple(
        replace(k, name=f"kernel{i}", params=tuple(replace(p, name=f"p{j}") for j, p in enumerate(k.params)))
        for i, k in enumerate(plan.kernels)
    )
    return replace(plan, kernels=kernels)


@pytest.mark.parametrize("name", ["full", "causal", "local", "left", "packed", "padded", "decode", "decode-e4m3"])
def test_nothing_is_read_from_kernel_names_or_parameters(plans, name: str) -> None:
    plan = data(plans, name)
    blind = anonymous(plan)
    for spec in (None, ["random"]):
        values = workload.make_lengths(plan, spec, seed=1)
        assert workload.work(blind, values) == workload.work(plan, values)
    assert workload.attention_nodes(blind) == workload.attention_nodes(plan)
    assert workload.page_tables(blind) == workload.page_tables(plan)


def sdpa_py_flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    """bench/sdpa.py's `_measure`, verbatim."""
    return 4 * b * h * s * s * d / (2 if causal else 1)


def varlen_py_pairs(lengths, causal: bool, window_left=None) -> int:
    """bench/varlen.py's `useful_flops` without its 4·D·HQ."""
    pairs = 0
    for n in lengths:
        if window_left is not None:
            pairs += sum(min(i, window_left) + 1 for i in range(n))
        elif causal:
            pairs += n * (n + 1) // 2
        else:
            pairs += n * n
    return pairs


def test_dense_flops_are_bench_sdpa_py_s(plans) -> None:
    work = workload.work(data(plans, "causal"), {})
    assert work.flops == sdpa_py_flops(B, HQ, 256, D, causal=True)
    assert work.bytes is None
    assert "bench/sdpa.py" in work.how[0]
    assert workload.work(data(plans, "full"), {}).flops == 4 * B * HQ * 200 * 300 * D


def test_a_sliding_window_counts_its_band_as_bench_varlen_py(plans) -> None:
    work = workload.work(data(plans, "local"), {})
    assert work.flops == 4 * 256 * HQ * varlen_py_pairs([500], causal=True, window_left=99)


def test_a_left_window_alone_counts_every_key_after_its_bound(plans) -> None:
    """No right bound: row i sees keys [max(0, i - 50), 300), as the kernel computes it (the plan
    records the windows, so this is no longer read as a sliding window bounded at the diagonal)."""
    work = workload.work(data(plans, "left"), {})
    assert work.flops == 4 * D * HQ * sum(300 - max(0, i - 50) for i in range(300))


def test_packed_flops_count_the_real_lengths_as_bench_varlen_py(plans) -> None:
    plan = data(plans, "packed")
    lengths = [37, 400, 0, 129]
    values = workload.make_lengths(plan, [",".join(map(str, lengths))])
    assert named(plan, values)["cu_q"] == [0, 37, 437, 437, 566]  # prefix sums
    assert workload.work(plan, values).flops == 4 * D * HQ * varlen_py_pairs(lengths, causal=True)


def test_padded_flops_take_the_missing_side_full(plans) -> None:
    plan = data(plans, "padded")
    values = workload.make_lengths(plan, ["len_kv=300,17,0"])
    (node,) = workload.attention_nodes(plan)
    want = sum(brute_pairs(300, kv, node.mask) for kv in (300, 17, 0))
    assert workload.work(plan, values).flops == 4 * D * HQ * want


def test_paged_bytes_are_bench_decode_py_s(plans) -> None:
    plan = data(plans, "decode")
    values = workload.make_lengths(plan, ["cache_len=100,8000"])
    work = workload.work(plan, values)
    assert work.bytes == (100 + 8000) * HKV * D * 2 * 2  # bench/decode.py: sum(len) * hkv * d * 2 B * 2
    assert work.flops is None
    full = workload.work(plan, workload.make_lengths(plan))
    assert full.bytes == B * MAX_PAGES * PAGE * HKV * D * 2 * 2


def test_an_e4m3_cache_reads_half_the_bytes(plans) -> None:
    plan = data(plans, "decode-e4m3")
    values = workload.make_lengths(plan, ["cache_len=100,8000"])
    assert workload.work(plan, values).bytes == (100 + 8000) * HKV * D * 1 * 2


def test_the_bench_buffers_of_an_e4m3_plan_have_its_dtypes(plans) -> None:
    torch = pytest.importorskip("torch")
    from frost_runtime import bench

    plan = data(plans, "decode-e4m3")
    buffers, _ = bench.make_buffers(plan, workload.make_lengths(plan), seed=0, device="cpu")
    dtypes = {slot.name: b.dtype for slot, b in zip(plan.slots, buffers)}
    assert dtypes["k_cache"] == dtypes["v_cache"] == torch.float8_e4m3fn
    assert dtypes["k_scale"] == torch.float32 and dtypes["q"] == torch.bfloat16


# ------------------------------------------------------------------------------------ lengths


def test_full_lengths_are_the_capacities(plans) -> None:
    padded = data(plans, "padded")
    assert named(padded, workload.make_lengths(padded)) == {"len_kv": [300, 300, 300]}
    packed = data(plans, "packed")
    values = named(packed, workload.make_lengths(packed))  # 4 x 400 > 1000 tokens: split evenly
    assert values == {"cu_q": [0, 250, 500, 750, 1000], "cu_kv": [0, 250, 500, 750, 1000]}
    decode = data(plans, "decode")
    assert named(decode, workload.make_lengths(decode)) == {"cache_len": [MAX_PAGES * PAGE] * B}


def test_random_lengths_agree_across_slots_of_the_same_capacities(plans) -> None:
    values = workload.make_lengths(data(plans, "packed"), ["random"], seed=3)
    cu_q, cu_kv = named(data(plans, "packed"), values).values()
    assert cu_q == cu_kv
    assert values != workload.make_lengths(data(plans, "packed"), ["random"], seed=4)
    assert values == workload.make_lengths(data(plans, "packed"), ["random"], seed=3)


@pytest.mark.parametrize(
    "name, specs, words",
    [
        ("packed", ["cu_q=401"], "over the plan's longest (400)"),
        ("packed", ["300"], "past the 1000 tokens"),
        ("padded", ["len_kv=1,2"], "2 values for 3 sequences"),
        ("padded", ["len_kv=301"], "outside [0, 300]"),
        ("padded", ["cu_q=1"], "not a length slot of this plan; its length slots are ['len_kv']"),
    ],
)
def test_lengths_that_break_the_contract_name_the_slot(plans, name: str, specs, words: str) -> None:
    with pytest.raises(workload.LengthSpecError) as info:
        workload.make_lengths(data(plans, name), specs)
    assert words in str(info.value)


def test_generated_lengths_keep_every_built_plans_contracts(plans) -> None:
    for name in ("packed", "padded", "decode"):
        plan = data(plans, name)
        for seed in range(200):
            for spec in (["random"], ["full"]):
                values = workload.make_lengths(plan, spec, seed)
                for c in plan.lengths:
                    assert length_problem(c, values[c.slot]) is None, (name, seed, spec)


def contracts_plan(contracts: list[tuple[str, int, int, int]]) -> PlanData:
    """A PlanData holding only length slots: (kind, batch, longest, total) each."""
    slots, lengths = [], []
    for i, (kind, b, longest, total) in enumerate(contracts):
        n = b + 1 if kind == "offsets" else b
        slots.append(TensorSlot(f"len{i}", i + 1, "int32", (n,), (1,), False, 4))
        lengths.append(LengthContract(i, kind, longest, total if kind == "offsets" else 0))
    return PlanData(Header("x", "0", "0", "sm_90a", 0, "0" * 64), tuple(slots), (), (), 0, (), tuple(lengths))


contract = st.tuples(
    st.sampled_from(["offsets", "lengths"]), st.integers(1, 40), st.integers(0, 5000), st.integers(0, 50000)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    contracts=st.lists(contract, min_size=1, max_size=4),
    seed=st.integers(0, 2**32),
    spec=st.sampled_from(["random", "full"]),
)
def test_generated_lengths_keep_any_contracts(contracts, seed: int, spec: str) -> None:
    plan = contracts_plan(contracts)
    values = workload.make_lengths(plan, [spec], seed)
    for c in plan.lengths:
        assert length_problem(c, values[c.slot]) is None
        if c.kind == "offsets":
            assert values[c.slot][0] == 0 and len(values[c.slot]) == plan.slots[c.slot].dims[0]


def test_a_slot_of_two_contracts_keeps_the_tighter() -> None:
    plan = contracts_plan([("lengths", 4, 100, 0)])
    plan = replace(plan, lengths=plan.lengths + (LengthContract(0, "lengths", 30, 0),))
    assert workload.make_lengths(plan) == {0: [30, 30, 30, 30]}


# --------------------------------------------------------------------------------- page tables


def test_page_tables_give_each_sequence_pages_of_its_own() -> None:
    table = workload.PageTable(slot=0, lengths=1, pages=40, page_size=16)
    rows, own = workload.page_table_rows([100, 0, 16 * 8], 10, table, seed=1)
    assert own and [len(r) for r in rows] == [10, 10, 10]
    used = rows[0][:7] + rows[2][:8]
    assert len(set(used)) == len(used)
    assert all(0 <= x < 40 for r in rows for x in r)
    assert rows != workload.page_table_rows([100, 0, 16 * 8], 10, table, seed=2)[0]


def test_a_pool_too_small_for_the_lengths_is_reported() -> None:
    table = workload.PageTable(slot=0, lengths=1, pages=5, page_size=16)
    rows, own = workload.page_table_rows([64, 64], 4, table)
    assert not own and all(0 <= x < 5 for r in rows for x in r)


def test_page_tables_of_a_built_plan(plans) -> None:
    plan = data(plans, "decode")
    (t,) = workload.page_tables(plan)
    names = [s.name for s in plan.slots]
    assert (names[t.slot], names[t.lengths], t.pages, t.page_size) == ("page_table", "cache_len", PAGES, PAGE)
    assert {n.op for n in plan.nodes if "page_table" in n.slots} == {"kv_append", "sdpa"}  # one table, two nodes


# ------------------------------------------------------------------------------- CPU buffers


def test_buffers_follow_the_slots(plans) -> None:
    torch = pytest.importorskip("torch")
    plan = data(plans, "packed")
    values = workload.make_lengths(plan, ["random"], seed=5)
    buffers, notes = bench.make_buffers(plan, values, 0, "cpu")
    assert notes == []
    for slot, buf in zip(plan.slots, buffers):
        assert tuple(buf.shape) == slot.dims and buf.stride() == slot.strides, slot.name
        if slot.dtype == "int32":
            assert buf.tolist() == values[plan.slots.index(slot)]
        elif slot.is_output:
            assert torch.isnan(buf).all(), slot.name
        else:
            assert torch.isfinite(buf).all() and (buf != 0).float().mean() > 0.99, slot.name


def test_decode_buffers_keep_the_caches_random_and_the_page_table_valid(plans) -> None:
    torch = pytest.importorskip("torch")
    plan = data(plans, "decode")
    values = workload.make_lengths(plan, ["cache_len=100,200"])
    buffers, notes = bench.make_buffers(plan, values, 0, "cpu")
    by_name = {s.name: b for s, b in zip(plan.slots, buffers)}
    for name in ("k_cache", "v_cache"):  # outputs (appended in place) that the attention reads
        assert torch.isfinite(by_name[name]).all(), name
    assert torch.isnan(by_name["o"]).all() and torch.isnan(by_name["lse"]).all()
    table = by_name["page_table"]
    assert table.min() >= 0 and table.max() < PAGES
    used = table[0, :7].tolist() + table[1, :13].tolist()
    assert len(set(used)) == len(used) and notes == []
    _, notes = bench.make_buffers(plan, workload.make_lengths(plan), 0, "cpu")  # full: 1024 pages of 300
    assert notes and "shared" in notes[0]


# ----------------------------------------------------------------------------- exit codes


def no_gpu() -> None:
    if probe_gpus().devices:
        pytest.skip("this machine has a GPU")


def test_check_without_a_gpu_exits_1(plans, capsys: pytest.CaptureFixture) -> None:
    no_gpu()
    assert main(["check", str(plans["causal"])]) == 1
    out = capsys.readouterr().out
    assert "a valid plan causal" in out and "no GPU/driver found" in out and "not runnable here" in out
    assert main(["check", str(plans["causal"]), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] and not report["runnable"] and report["exit_code"] == 1


def test_check_of_corrupt_or_missing_files_exits_2(plans, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = plans["full"].read_bytes()
    cases = {
        "truncated": good[: len(good) // 2],
        "flipped": good[:-40] + bytes([good[-40] ^ 1]) + good[-39:],
        "empty": b"",
        "text": b"not a plan",
    }
    for name, content in cases.items():
        path = tmp_path / f"{name}.frost"
        path.write_bytes(content)
        assert main(["check", str(path)]) == 2, name
        assert "invalid" in capsys.readouterr().err
        assert main(["check", str(path), "--json"]) == 2
        assert json.loads(capsys.readouterr().out)["valid"] is False
    assert main(["check", str(tmp_path / "missing.frost")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_bench_without_a_gpu_says_so_and_exits_1(plans, capsys: pytest.CaptureFixture) -> None:
    no_gpu()
    assert main(["bench", str(plans["causal"])]) == 1
    err = capsys.readouterr().err
    assert "not runnable here" in err and "no GPU/driver found" in err
    assert main(["bench", str(plans["causal"]), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["exit_code"] == 1


def test_bench_of_an_invalid_plan_or_bad_lengths_exits_2(plans, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.frost"
    bad.write_bytes(b"\x00")
    assert main(["bench", str(bad)]) == 2
    assert "bench:" in capsys.readouterr().err
    assert main(["bench", str(plans["packed"]), "--lengths", "cu_q=999"]) == 2
    assert "--lengths cu_q" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ timing


@pytest.fixture
def fake_device(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Device time without a GPU: each call takes 0.5 ms; the log holds every call made."""
    torch = pytest.importorskip("torch")
    log: list[str] = []

    def elapsed_ms(step, times: int = 1) -> float:
        before = len(log)
        for _ in range(times):
            step()
        return (len(log) - before) * 0.5

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing, "elapsed_ms", elapsed_ms)
    return log


def test_device_time_settles_then_times_the_steps_that_fill_the_window(fake_device: list[str]) -> None:
    us, timed = timing.device_us(lambda: fake_device.append("x"), window_s=0.0301, calls=4, settle_s=0.0101, warmup=3)
    # a step of 4 calls takes 2 ms: 3 calls of warm-up, one step to learn its length, ceil(10.1 / 2) = 6
    # steps of settling, then ceil(30.1 / 2) = 16 steps timed
    assert (us, timed) == (500.0, 64)
    assert len(fake_device) == 3 + 4 + 6 * 4 + 64


def test_a_short_window_still_times_ten_steps(fake_device: list[str]) -> None:
    assert timing.device_us(lambda: fake_device.append("x"), window_s=0.001, calls=2, settle_s=0.0)[1] == 20
    assert len(fake_device) == timing.WARMUP + 2 + 20


def test_host_time_is_per_call_over_bursts_from_a_drained_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    log: list[str] = []
    clock = iter([0, 4, 10, 22, 30, 38])  # perf_counter at each burst's start and end: 4, 12 and 8 s
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("drain"))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    median, least = timing.host_us(lambda: log.append("call"), bursts=3, burst=4)
    assert (median, least) == (2e6, 1e6)  # µs per call
    assert log == (["drain"] + ["call"] * 4) * 3 + ["drain"]


# ------------------------------------------------------------------------------- the report


def test_the_report_reads_as_a_table() -> None:
    result = {
        "plan": "p.frost", "name": "p", "target_arch": "sm_90a", "frostc_version": "0.1.0",
        "device": {"name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132, "driver_version": 13000},
        "launches": [{"node": "attn", "kernel": "sdpa_fwd_wgmma.bf16.d128.full", "grid": [132, 1, 1]}],
        "lengths": {"cu_q": {"kind": "offsets", "values": [0, 5, 9], "sequence_lengths": [5, 4]}},
        "lengths_spec": ["random"], "seed": 0, "notes": [],
        "method": {"graph": True, "calls_per_graph": 20, "settle_s": 0.2, "window_s": 0.4, "executes_timed": 4000,
                   "host_bursts": 25, "burst": 64},
        "flops": 10**12, "bytes": None, "model": ["attn: 4*d*hq FLOPs per (query, key) pair"],
        "device_us": 2000.0, "tflops": 500.0, "tb_s": None,
        "host_us": {"median": 4.2, "min": 4.0}, "floor_us_per_launch": 3.7,
    }  # fmt: skip
    text = "\n".join(bench.report_lines(result))
    for words in ("NVIDIA H200 (sm_90, 132 SMs, driver 13.0)", "2000.00 µs", "500.0 TFLOP/s", "4.20 µs median",
                  "3.70 µs per launch x 1", "2 sequences, 4 to 5, 9 in all", "a CUDA graph of 20"):  # fmt: skip
        assert words in text, words
