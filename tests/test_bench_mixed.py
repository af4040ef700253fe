"""bench/mixed.py on the CPU: which plans each row takes (the pure-prefill rows over three page
sizes share one packed plan), and the kernel-by-kernel table of the pure-prefill steps."""

import pytest

from tests import bench_scripts


@pytest.fixture(scope="module")
def mixed():
    return bench_scripts.load("mixed")


def test_the_prefill_rows_differ_by_their_pages_and_share_the_packed_plan(mixed) -> None:
    prefill = [row for row in mixed.ROWS if row.peer == "packed"]
    assert [row.page for row in prefill] == [16, 64, 256]
    plans = [mixed._plans(row) for row in prefill]
    assert {p["packed plan"][0] for p in plans} == {"packed-b2-t2048"}
    serving = [p["mixed (serving bucket)"][0] for p in plans]
    assert serving == ["mixed-b2-t4096-p16x64", "mixed-b2-t4096-p64x16", "mixed-b2-t4096-p256x4"]


def test_the_kernel_table_lists_each_prefill_steps_kernels_longest_first(mixed) -> None:
    results = [
        {"row": "prefill 2 x 1024 p16", "kernels_us": {
            "mixed (serving bucket)": {"sdpa_schedule.mixed": 2.0, "sdpa_fwd_wgmma.paged_p16": 44.5},
            "packed plan": {"sdpa_fwd_wgmma.varlen": 41.0},
        }},
        {"row": "decode b8", "us": {}},  # a row without a profile adds nothing
    ]  # fmt: skip
    lines = mixed._kernel_lines(results)
    body = [line for line in lines if line.startswith("| prefill")]
    assert body == [
        "| prefill 2 x 1024 p16 | mixed (serving bucket) | sdpa_fwd_wgmma.paged_p16 | 44.5 |",
        "| prefill 2 x 1024 p16 | mixed (serving bucket) | sdpa_schedule.mixed | 2.0 |",
        "| prefill 2 x 1024 p16 | packed plan | sdpa_fwd_wgmma.varlen | 41.0 |",
    ]


def test_the_e4m3_rows_take_plans_of_their_own_beside_their_bf16_twins(mixed) -> None:
    """issue 42's question (which kernel gains from the halved bytes): each e4m3 row has a bf16
    twin of the same lengths, both profiled kernel by kernel; their plans differ by the cache."""
    pairs = {}
    for row in mixed.ROWS:
        if "pages" in row.name:
            pairs.setdefault(row.name.rsplit(" ", 2)[0], {})[row.cache] = row
    assert pairs and all(set(p) == {"bf16", "e4m3"} for p in pairs.values())
    for twins in pairs.values():
        bf16, e4m3 = twins["bf16"], twins["e4m3"]
        assert (bf16.q_lens, bf16.kv_lens, bf16.page) == (e4m3.q_lens, e4m3.kv_lens, e4m3.page)
        assert bf16.profiled and e4m3.profiled
        names = {p[0] for p in mixed._plans(bf16).values()}, {p[0] for p in mixed._plans(e4m3).values()}
        assert names[1] == {n + "-kve4m3" for n in names[0]}


def test_an_e4m3_rows_plans_build_over_e4m3_pages_with_their_scales(mixed, tmp_path, monkeypatch) -> None:
    row = next(r for r in mixed.ROWS if r.cache == "e4m3" and "decode" in r.name)
    monkeypatch.setattr(mixed, "ROWS", [row])
    monkeypatch.setattr(mixed, "OUT", tmp_path)
    written = {}
    monkeypatch.setattr(mixed.common, "write_plan", lambda path, built: written.setdefault(path.name, built))
    assert mixed.build() == 0
    assert set(written) == {p[0] + ".frost" for p in mixed._plans(row).values()}
    for description in written.values():
        d = description.to_dict()
        tensors, (node,) = d["tensors"], d["nodes"]
        assert tensors["k_cache"]["dtype"] == tensors["v_cache"]["dtype"] == "e4m3"
        assert list(tensors["k_scale"]["dims"]) == [mixed.HKV] and node["k_scale"] == "k_scale"
