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
