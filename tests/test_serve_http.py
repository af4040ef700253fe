"""bench/serve_http.py on the CPU: `transformers serve --continuous-batching` started in-process with
the tiny Llama, streamed to by the benchmark's own client (frostc's fp32 reference attention and sdpa,
concurrency 1 and 4), and a short soak whose client cancels half its requests; plus the table's
arithmetic where the CPU cannot run FlashAttention-4.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests import bench_scripts

pytest.importorskip("torch")
pytest.importorskip("transformers")
for _module in ("fastapi", "uvicorn", "openai", "accelerate"):
    pytest.importorskip(_module, reason="transformers' serving extra: pip install 'transformers[serving]==5.23.*'")

NEW_TOKENS = 5
PER_LEVEL = 6


@pytest.fixture(scope="module")
def bench():
    return bench_scripts.load("serve_http")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-model")  # saved by the first test that serves, reused after


def test_run_streams_every_request_through_both_attentions(bench, model_dir, tmp_path, capsys) -> None:
    argv = ["run", "--tiny", "--attn", "frostc,sdpa", "--concurrency", "1,4", "--requests-per-level", str(PER_LEVEL),
            "--max-tokens", str(NEW_TOKENS), "--model-dir", str(model_dir), "--md", str(tmp_path / "r.md"),
            "--plot", str(tmp_path / "r.png")]  # fmt: skip
    assert bench.main(argv) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    rows = {(row["attention"], row["concurrency"]): row for row in r["levels"]}
    assert set(rows) == {("frostc", 1), ("frostc", 4), ("sdpa", 1), ("sdpa", 4)}
    for (attention, c), samples in ((k.split("/"), v) for k, v in r["samples"].items()):
        assert len(samples) == PER_LEVEL, (attention, c)
        for x in samples:  # answered fully: no end token, so exactly max_tokens, one content chunk each
            assert x["error"] is None and not x["cancelled"] and x["finish_reason"] == "length", x
            assert x["tokens"] == NEW_TOKENS and len(x["chunks"]) == NEW_TOKENS, x
            assert x["chunks"] == sorted(x["chunks"]) and x["chunks"][-1] <= x["end"]
    for row in rows.values():
        assert row["errors"] == 0 and row["requests"] == PER_LEVEL and row["generated"] == PER_LEVEL * NEW_TOKENS
        assert row["generated_per_s"] > 0 and row["requests_per_s"] > 0
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] and 0 < row["itl_p50_ms"] <= row["itl_p99_ms"]
    assert set(r["first"]) == {"frostc", "sdpa"} and all(f["tokens"] == NEW_TOKENS for f in r["first"].values())
    assert set(r["calls"]["frostc"]) == {"mixed via reference", "decode via reference"}  # frostc served every step
    table = (tmp_path / "r.md").read_text()
    for attention in ("frostc", "sdpa"):
        for c in (1, 4):
            assert f"| {attention} | {c} | {PER_LEVEL} | " in table
        assert f"- {attention}, first request, s: TTFT " in table
    assert "vs flash_attention_4" not in table  # no FlashAttention-4 ran: no ratio column
    assert (tmp_path / "r.png").exists() or "--plot" in capsys.readouterr().out  # matplotlib, or said skipped


def test_a_soak_with_cancellations_is_clean_and_leaves_the_pool_whole(bench, model_dir, tmp_path) -> None:
    argv = ["soak", "--tiny", "--seconds", "8", "--concurrency", "4", "--rate", "4", "--cancel-share", "0.5",
            "--max-tokens", "6", "--model-dir", str(model_dir), "--json", str(tmp_path / "s.json")]  # fmt: skip
    status = bench.main(argv)
    r = json.loads((tmp_path / "s.json").read_text())
    assert status == 0 and r["clean"], r["checks"]
    assert r["completed"] >= 1 and r["cancelled"] >= 1 and r["failed"] == 0
    assert r["requests"] == r["completed"] + r["cancelled"]
    for x in r["samples"]:
        assert x["error"] is None
        assert x["tokens"] == 6 if not x["cancelled"] else len(x["chunks"]) == x["cancel_after"]
    pool = r["pool"]
    assert pool["held"] == pool["tables"] == pool["active"] == pool["waiting"] == 0
    assert pool["free"] + pool["cached"] == pool["total"] == 128  # tests/cb_models.py's POOL_BLOCKS
    assert r["logged"] == {"count": 0, "first": []} and r["memory"] is None  # no GPU: no memory samples
    # transformers 5.23 unregisters a result handler only when its request finishes; cb_patches drops
    # a cancelled request's
    assert r["checks"]["router"] == {"ok": True, "detail": "0 result handlers left in transformers' output router"}


def test_the_table_compares_with_flash_attention_4_where_it_ran(bench) -> None:
    def row(attention: str, c: int, per_s: float) -> dict:
        return {"attention": attention, "concurrency": c, "requests": 16, "generated_per_s": per_s,
                "requests_per_s": 1.0, "ttft_p50_ms": 10.0, "ttft_p99_ms": 20.0, "itl_p50_ms": 1.0,
                "itl_p99_ms": 2.0, "errors": 0}  # fmt: skip

    levels = [row("frostc", 8, 1500.0), row("frostc", 32, 3000.0), row("flash_attention_4", 8, 1000.0)]
    r = {"device": "H100", "describe": "d", "rate": 2.5, "levels": levels, "first": {}, "skipped": {}, "calls": {}}
    table = bench.markdown(r)
    assert "Poisson, 2.5 requests/s" in table and "| vs flash_attention_4 |" in table
    assert "| frostc | 8 | 16 | 1,500 | 1.00 | 10.0 | 20.0 | 1.0 | 2.0 | 0 | 1.50× |" in table
    assert "| frostc | 32 | 16 | 3,000 | 1.00 | 10.0 | 20.0 | 1.0 | 2.0 | 0 | — |" in table  # no peer at 32
    assert "| flash_attention_4 | 8 | 16 | 1,000 | 1.00 | 10.0 | 20.0 | 1.0 | 2.0 | 0 | — |" in table


def test_percentiles_interpolate_between_ranks(bench) -> None:
    assert bench.percentile([], 50) is None
    assert bench.percentile([3.0], 99) == 3.0
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert bench.percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_the_log_watch_counts_warnings_but_not_transformers_routine_ones(bench) -> None:
    with bench.watching() as watch:
        logging.getLogger("transformers.cli.serving.chat_completion").warning("[Request received] Model: m")
        logging.getLogger("ContinuousBatchingLogger").info("a step")
        logging.getLogger("ContinuousBatchingLogger").error("Error in generation loop: boom")
        logging.getLogger("uvicorn.error").error("Exception in ASGI application")
    assert watch.count == 2
    assert watch.first == ["ERROR ContinuousBatchingLogger: Error in generation loop: boom",
                           "ERROR uvicorn.error: Exception in ASGI application"]  # fmt: skip
