"""bench/sinks.py on the CPU: its plans' descriptions (gpt-oss's attention with and without sinks)
and its table."""

import pytest

from frostc.resolve import resolve
from frostc.validate import validate
from tests import bench_scripts


@pytest.fixture(scope="module")
def sinks():
    return bench_scripts.load("sinks")


@pytest.mark.parametrize("mask", ["causal", "window"])
def test_the_two_plans_differ_by_the_sinks_only(sinks, mask: str) -> None:
    variants = {}
    for with_sinks in (False, True):
        (launch,) = resolve(validate(sinks.description((1, 4096), mask, with_sinks))).launches
        variants[with_sinks] = launch.variant
    assert variants[True].sinks and not variants[False].sinks
    assert variants[True].name == variants[False].name + ".sinks"  # the same kernel otherwise


def test_the_table_states_the_worst_cost_against_the_bar(sinks) -> None:
    rows = [
        {"shape": (1, 4096), "mask": "causal", "ms": {"without": 1.0, "with": 1.01}, "cost": 0.01, "rel_err": 3e-3},
        {"shape": (1, 4096), "mask": "window", "ms": {"without": 0.5, "with": 0.515}, "cost": 0.03, "rel_err": 3e-3},
    ]
    text = sinks._markdown(rows, "GPU")
    assert "| 1, 4096 | window | 0.500 | 0.515 | +3.0% |" in text and "Worst cost: +3.0%" in text
