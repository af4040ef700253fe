"""bench/serve.py's arithmetic on the CPU: the job's prompts, its floor, the profile's kernel
families and busy time, and the table."""

import pytest

from tests import bench_scripts


@pytest.fixture(scope="module")
def serve():
    return bench_scripts.load("serve")


def test_the_job_is_seeded_and_log_normal(serve) -> None:
    a, b = serve.prompts(64, 1000, seed=64), serve.prompts(64, 1000, seed=64)
    lengths = sorted(len(p) for p in a)
    assert a == b and a != serve.prompts(64, 1000, seed=65)
    assert 8 <= lengths[0] and lengths[-1] <= serve.LONGEST
    assert 300 < lengths[32] < 650  # the median near MEDIAN_PROMPT
    assert all(0 < t < 1000 for p in a for t in p)


def test_the_floor_adds_the_prefill_at_the_gemm_rate_and_the_steps_at_the_read_rate(serve) -> None:
    weights = 2 * 10**9  # bytes: 1e9 bf16 parameters
    prefill_only = serve.floor_s([100], gemm_flops=1e12, read_bytes_per_s=float("inf"), weight_bytes=weights)
    c = serve.config()
    attention = 2 * 2 * c["num_attention_heads"] * (c["hidden_size"] // c["num_attention_heads"]) * 100 * 100 / 2
    assert prefill_only == pytest.approx((2 * 10**9 * 100 + attention * c["num_hidden_layers"]) / 1e12)
    steps_only = serve.floor_s([100], gemm_flops=float("inf"), read_bytes_per_s=1e12, weight_bytes=weights)
    assert steps_only == pytest.approx(serve.NEW_TOKENS * weights / 1e12)


@pytest.mark.parametrize(
    "name, family",
    [
        ("frostc_sdpa_decode_paged_bf16_d128_p256_causal_br_packed_decodes_split_0", "attention"),
        ("frostc_sdpa_decode_combine_bf16_d128_packed_causal_decodes_r64_0", "attention"),
        ("frostc_kv_append_packed_bf16_d128_0", "K/V gathers and copies"),  # the pool write, as FA4's index_copy_
        ("frostc_silu_mul_bf16_n14336_0", "norms, activations, elementwise"),  # glue plans: not attention
        ("frostc_add_rms_norm_bf16_n4096_0", "norms, activations, elementwise"),
        ("flash_fwd_kernel", "attention"),
        ("void at::native::index_elementwise_kernel<128, 4>", "K/V gathers and copies"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>", "K/V gathers and copies"),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "GEMMs"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "GEMMs"),
        ("void at::native::vectorized_elementwise_kernel<4, silu_kernel>", "norms, activations, elementwise"),
        ("void at::native::reduce_kernel<512, 1, ...MeanOps...>", "norms, activations, elementwise"),
        ("some_unknown_kernel", "other"),
    ],
)
def test_kernels_fall_into_their_families(serve, name: str, family: str) -> None:
    assert serve.family(name) == family


def test_busy_time_counts_overlapping_kernels_once(serve) -> None:
    spans = [(0.0, 10.0), (5.0, 12.0), (20.0, 25.0), (21.0, 22.0)]  # microseconds
    assert serve._union_s(spans) == pytest.approx(17e-6)
    assert serve._union_s([]) == 0.0


def test_busy_time_by_family_shares_each_instant_among_the_kernels_running(serve) -> None:
    # a combine launched early waits 8 us under its attention kernel, then runs 2 us alone
    spans = [(0.0, 10.0, "attention"), (2.0, 12.0, "attention"), (12.0, 20.0, "GEMMs"), (15.0, 16.0, "other")]
    busy = serve.busy_by_family(spans)
    assert busy["attention"] == pytest.approx(12e-6)  # 10 + 2, not the 20 the durations sum to
    assert busy["GEMMs"] == pytest.approx(7.5e-6)
    assert busy["other"] == pytest.approx(0.5e-6)
    assert sum(busy.values()) == pytest.approx(serve._union_s([(a, b) for a, b, _ in spans]))
    assert "attention with gathers and copies 60%" in serve.busy_shares(busy)


def test_the_table_compares_each_row_with_flash_attention_4_at_its_request_count(serve) -> None:
    row = dict(first_s=2.0, warm_s=1.0, total_per_s=1.0, x_floor=1.5, calls=None)
    result = {
        "device": "GPU, torch x, 2026-12-05",
        "read_ceiling_bytes_per_s": 4e12,
        "gemm_flops": 7e14,
        "jobs": {64: {"prompt_tokens": 44000, "floor_s": 2.0}},
        "rows": [
            {**row, "attention": "flash_attention_4", "requests": 64, "generated_per_s": 1000.0},
            {**row, "attention": "frostc", "requests": 64, "generated_per_s": 1500.0, "calls": {"mixed via plans": 9}},
        ],
        "skipped": {"sdpa": "not asked"},
        "profiles": {},
    }
    table = serve.markdown(result)
    assert "| frostc | 64 | 44,000 |" in table and "| 1.50× |" in table
    assert "- sdpa: skipped (not asked)" in table and "mixed via plans" in table
    host = {"wall_s": 4.0, "seconds": {"graph replays": 0.5, "eager forward passes": 1.5},
            "calls": {"graph replays": 120, "eager forward passes": 16}}  # fmt: skip
    result["profiles"]["frostc"] = {
        "wall_s": 4.0, "gpu_busy_s": 3.0, "idle_share": 0.25, "families_s": {"GEMMs": 2.0, "attention": 1.0},
        "top_kernels_s": {"frostc_sdpa_decode_paged_x": 0.5}, "host": host,
        "runtime_calls": {"cudaGraphLaunch": {"calls": 120, "s": 0.4}, "cudaStreamSynchronize": {"calls": 3, "s": 0.1}},
    }  # fmt: skip
    result["rows"][0]["kept_s"], result["rows"][1]["kept_s"] = 0.8, 0.5  # FA4's, frostc's
    table = serve.markdown(result)
    assert "| frostc | 64 | 0.50 | 3,000 | 1.60× |" in table  # 1,500 tok/s over a 1.0 s warm call: 1,500 tokens
    assert "| flash_attention_4 | 64 | 0.80 | 1,250 | 1.00× |" in table
    assert "- frostc's forward steps: graph replays 120 (0.50 s), eager forward passes 16 (1.50 s)" in table
    assert "- frostc's host CUDA calls (profiled): cudaGraphLaunch x120 0.40 s, cudaStreamSynchronize x3" in table


def test_host_phases_time_transformers_loop_and_put_its_methods_back(serve) -> None:
    """HostPhases around a CPU generate_batch (sync IOs; the async ones are wrapped the same way):
    every phase of every step timed once (the async IOs' nested call to the sync ones not twice),
    and transformers' methods restored on exit."""
    pytest.importorskip("transformers")
    from tests.cb_models import cb_config, cb_model, greedy, prompts

    def methods():
        found = {}
        for _, targets in serve.HOST_PHASES + serve.FORWARD_PARTS:
            for path, method in targets:
                found[(path, method)] = serve.phase_owner(path).__dict__.get(method)
        return found

    before = methods()
    model = cb_model("llama")
    model.set_attn_implementation("sdpa")
    with serve.HostPhases(serve.HOST_PHASES + serve.FORWARD_PARTS) as phases:
        out = model.generate_batch(prompts(6, 40), generation_config=greedy(4), continuous_batching_config=cb_config())
    assert len(out) == 6 and methods() == before
    labels = [label for label, _ in serve.HOST_PHASES]
    steps = phases.calls["forward: launch or graph replay"]
    assert steps >= 4 and set(phases.calls) == {*labels, "eager forward passes"}, phases.calls  # no graphs on a CPU
    assert phases.calls["eager forward passes"] == steps
    assert phases.calls["the step's inputs to the device"] == steps  # once a step, never nested twice
    assert all(phases.seconds[label] > 0 for label in labels)
