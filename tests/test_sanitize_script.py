"""bench/sanitize.py on the CPU: its plan list covers what it says, and a tool's log is read
into counts per plan (reports between a plan's markers, summaries not counted, a failed output
check kept) and a verdict that is clean only when every count is 0."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sanitize():
    sys.path.insert(0, str(ROOT / "bench"))  # as when run as a script: bench/common.py importable
    spec = importlib.util.spec_from_file_location("sanitize", ROOT / "bench" / "sanitize.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sanitize"] = module
    spec.loader.exec_module(module)
    return module


RACECHECK_LOG = """========= COMPUTE-SANITIZER
@@sanitize begin dense-a
@@sanitize end dense-a ok
@@sanitize begin dense-b
========= Error: Potential WAR hazard detected at __shared__ 0x30808 in block (61,0,0) :
=========     Read Thread (159,0,0) at kernel+0x47f0
=========     Write Thread (0,0,0) at kernel+0x4580
=========
========= Error: Race reported between Write access at kernel+0x4580
=========     and Read access at kernel+0x47f0 [4 hazards]
=========
@@sanitize end dense-b FAILED AssertionError: O: relative error 1.0e+00
@@sanitize begin decode-c
@@sanitize end decode-c ok
========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)
"""


def test_the_targets_cover_every_walk_form_and_paged_kernel(sanitize) -> None:
    targets = sanitize.targets()
    labels = [t.label for t in targets]
    assert len(labels) == len(set(labels))
    covers = " ".join(t.covers for t in targets)
    for kind in ("static walk", "paired walk", "dynamic walk", "one CTA per tile", "schedule kernel", "packed",
                 "padded", "split-KV", "combine", "kv_append alone", "softcap", "window", "bottom-right"):  # fmt: skip
        assert kind in covers, kind
    assert {t.sdpa.head_dim for t in targets if t.sdpa} == {64, 96, 128, 192, 256}
    d96 = [t for t in targets if "d96" in t.label]  # the d96 group (--only d96): every form at 96
    assert len(d96) == 10
    assert {t.sdpa.form for t in d96 if t.sdpa} == {"dense", "packed"}
    assert {t.decode.cache for t in d96 if t.decode} == {None, "e4m3"}
    assert [t.append.form for t in d96 if t.append] == ["slots"] and len([t for t in d96 if t.mixed]) == 2
    d192 = [t for t in targets if "d192" in t.label]  # the d192 group (--only d192)
    assert len(d192) == 3 and {(t.sdpa.head_dim, t.sdpa.head_dim_v) for t in d192} == {(192, 128)}


def test_a_log_is_read_into_counts_per_plan(sanitize) -> None:
    result = sanitize._parse(RACECHECK_LOG, 0)
    assert result.reports == {"dense-a": 0, "dense-b": 2, "decode-c": 0}
    assert result.verdicts["dense-b"].startswith("FAILED AssertionError")
    assert result.verdicts["dense-a"] == result.verdicts["decode-c"] == "ok"
    assert result.summary.startswith("RACECHECK SUMMARY: 2 hazards")


def test_reports_outside_any_plan_are_kept(sanitize) -> None:
    result = sanitize._parse("========= Error: something before the first plan\n", 1)
    assert result.reports == {"(outside any plan)": 1}
    assert result.exit_code == 1


def test_the_table_and_the_verdict(sanitize, tmp_path, monkeypatch) -> None:
    logs = {
        "memcheck": "@@sanitize begin dense-a\n@@sanitize end dense-a ok\n========= ERROR SUMMARY: 0 errors\n",
        "racecheck": RACECHECK_LOG.replace("dense-b", "dense-a").split("@@sanitize begin decode-c")[0],
    }
    monkeypatch.setattr(sanitize, "_manifest", lambda plans, only: [{"label": "dense-a"}])
    monkeypatch.setattr(sanitize, "_run_tool", lambda tool, log, selection: sanitize._parse(logs[tool], 0))
    assert sanitize.run(["memcheck"], tmp_path, "", out=tmp_path) == 0
    assert "| dense-a |" in (tmp_path / "sanitize.md").read_text()
    assert sanitize.run(["memcheck", "racecheck"], tmp_path, "", out=tmp_path) == 1


def test_shards_split_the_plans_and_merge_back(sanitize, tmp_path) -> None:
    (tmp_path / "manifest.json").write_text('[{"label": "a"}, {"label": "b"}, {"label": "c"}, {"label": "d"}]')
    shares = [[e["label"] for e in sanitize._manifest(tmp_path, "", (i, 3))] for i in range(3)]
    assert shares == [["a", "d"], ["b"], ["c"]]
    first = sanitize._parse(RACECHECK_LOG.split("@@sanitize begin decode-c")[0], 0)
    second = sanitize._parse("@@sanitize begin decode-c\n@@sanitize end decode-c ok\n", 2)
    merged = sanitize._merged([first, second])
    assert merged.reports == {"dense-a": 0, "dense-b": 2, "decode-c": 0}
    assert set(merged.verdicts) == {"dense-a", "dense-b", "decode-c"} and merged.exit_code == 2


def test_a_shard_is_i_of_n(sanitize) -> None:
    assert sanitize._shard("1/3") == (1, 3)
    for bad in ("3/3", "x/2", "1"):
        with pytest.raises(Exception, match="I/N"):
            sanitize._shard(bad)
