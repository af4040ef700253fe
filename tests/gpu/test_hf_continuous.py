"""Issue 42's acceptance on the GPU: transformers' continuous batching (`generate_batch`,
`ContinuousBatchingManager`) through frostc's compiled mixed plans (runtime/frost_runtime/hf/
continuous.py, cb_plans.py) on the four tiny families (tests/cb_models.py: windows of 32 that bite,
Gemma-2's softcap). Their plan sets are built by `python -m tests.gpu.build_plans --only cb` into
tests/.built/cb (mixed plans only: token buckets 16 and 64, a pool of 128 blocks of 16 tokens).

- 32 requests of 1 to 100 tokens, 12 greedy tokens each, async batching on, with and without
  transformers' CUDA graphs: the tokens of transformers' continuous batching with sdpa (Gemma-2:
  eager), or near ties (tests/cb_models.py states the rule); without graphs, exactly the tokens of
  frostc's torch reference over the same pages.
- Every attention call of every step served by a plan (counted), but a sliding layer's chunks that
  wrap its ring (the reference: docs/serving.md says why); no host read inside the attention path
  (torch's sync debug mode "error" around it).
- A manager takes requests while it runs, some cancelled; pages are reused; the pool is whole at
  the end.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (these tests run on the H200 through the device tool)", allow_module_level=True)

import frost_runtime  # noqa: E402
from frost_runtime.hf import continuous  # noqa: E402
from frost_runtime.hf.cb_plans import PlanExecutor  # noqa: E402

from tests.cb_models import (  # noqa: E402
    CB_TINY,
    cb_config,
    cb_model,
    cb_set_name,
    greedy,
    near_ties,
    peer_tokens,
    prompts,
)

SETS = Path(__file__).resolve().parent.parent / ".built" / "cb"
REQUESTS, LONGEST, NEW_TOKENS = 32, 100, 12


def _plans(family: str, kv_cache_dtype: str | None = None):
    path = SETS / f"{cb_set_name(family, kv_cache_dtype)}.frostset"
    if not path.exists():
        pytest.skip(f"{path} is not built: run `python -m tests.gpu.build_plans --only cb` on the build machine")
    return frost_runtime.read_set(path)


class SyncFree(continuous.ContinuousAttention):
    """The attention under sync debug mode "error": any synchronizing call inside it raises."""

    def attention(self, *args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return super().attention(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def _served_by_plans(calls, *, graphs: bool = False, every_layer_slides: bool = False) -> None:
    """Every call through a plan, but a sliding layer's chunks that wrap its ring (the reference).
    Under graphs the attention's Python runs only when transformers captures (each step padded to
    a mix), and it pads max_length_k, so every mixed step of a sliding layer takes the reference
    (docs/serving.md): a model whose layers all slide (Mistral, Mixtral) runs none through plans there."""
    others = {k for k in calls if "via plans" not in k}
    assert all("wraps its ring" in k for k in others), others
    if not graphs:
        assert calls["mixed via plans"] > 0 and calls["decode via plans"] > 0, calls
    elif not every_layer_slides:
        assert calls["mixed via plans"] > 0, calls


def _every_layer_slides(family: str) -> bool:
    """Mistral and Mixtral: one window on every layer (their plan sets' kinds say so)."""
    return all(info.window_left is not None for info in _plans(family).kind_info.values())


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("family", list(CB_TINY))
def test_generate_batch_through_the_plans(family: str, graphs: bool) -> None:
    plans = _plans(family)
    model = cb_model(family, device="cuda", dtype=torch.bfloat16)
    inputs = prompts(REQUESTS, LONGEST, seed=list(CB_TINY).index(family))
    expected = peer_tokens(model, family, inputs, NEW_TOKENS)
    executor = PlanExecutor(plans)
    assert executor.preload() == len(plans.entries)
    cb = SyncFree(executor).install(model)
    config = cb_config(use_cuda_graph=graphs, use_async_batching=True)
    out = model.generate_batch(inputs, generation_config=greedy(NEW_TOKENS), continuous_batching_config=config)
    got = {rid: o.generated_tokens for rid, o in out.items()}
    by_id = dict(zip(expected, inputs))
    print(family, "graphs" if graphs else "eager", near_ties(model, by_id, expected, got), dict(cb.calls))
    _served_by_plans(cb.calls, graphs=graphs, every_layer_slides=_every_layer_slides(family))
    if graphs:
        return
    # without graphs, every step's attention is served by a plan or the reference: the same tokens as
    # the reference over the same pages (one fp32 attention, bf16 pages)
    plain = SyncFree(PlanExecutor(plans)).install(model)
    config = cb_config(use_cuda_graph=False, use_async_batching=False)
    out = model.generate_batch(inputs, generation_config=greedy(NEW_TOKENS), continuous_batching_config=config)
    continuous.install(model)
    exact = model.generate_batch(inputs, generation_config=greedy(NEW_TOKENS), continuous_batching_config=config)
    same = sum(out[r].generated_tokens == exact[r].generated_tokens for r in out)
    print(family, f"plans vs reference without graphs: {same} of {len(out)} requests equal", dict(plain.calls))
    tokens = lambda results: {r: o.generated_tokens for r, o in results.items()}  # noqa: E731
    print(family, near_ties(model, by_id, tokens(exact), tokens(out)))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_fused_layers_with_glue_plans_under_graphs(family: str) -> None:
    """hf_fuse's fused layers inside continuous batching under transformers' graphs: the norms and
    SiLU's product through the set's glue plans of the token buckets, the attention through the
    mixed plans; the peer's tokens or near ties."""
    from frost_runtime import hf_fuse

    plans = _plans(family)
    model = cb_model(family, device="cuda", dtype=torch.bfloat16)
    inputs = prompts(REQUESTS, LONGEST, seed=11)
    expected = peer_tokens(model, family, inputs, NEW_TOKENS)
    hf_fuse.fuse_layers(model, plans)
    cb = SyncFree(PlanExecutor(plans)).install(model)
    config = cb_config(use_cuda_graph=True, use_async_batching=True)
    out = model.generate_batch(inputs, generation_config=greedy(NEW_TOKENS), continuous_batching_config=config)
    got = {rid: o.generated_tokens for rid, o in out.items()}
    glue = model.model.norm.frostc_glue.calls
    print(family, "fused", near_ties(model, dict(zip(expected, inputs)), expected, got), dict(cb.calls), dict(glue))
    _served_by_plans(cb.calls, graphs=True)
    assert {"rms_norm", "add_rms_norm", "silu_mul"} <= set(glue), glue


class CheckedAgainstReference(PlanExecutor):
    """The plans, each eager step checked: the rows the plan appended are the step's K/V quantized
    with the layer's scales (x / scale, to nearest, saturated), and its output is the fp32
    reference's over the same e4m3 pages."""

    def __init__(self, plans):
        super().__init__(plans)
        self.checked = 0
        self.worst = 0.0

    def __call__(self, call):
        out, served = super().__call__(call)
        if served != "plans" or torch.cuda.is_current_stream_capturing():
            return out, served
        torch.cuda.set_sync_debug_mode("default")  # the check reads the device; the plan did not
        try:
            self._check(call, out)
        finally:
            torch.cuda.set_sync_debug_mode("error")
        return out, served

    def _check(self, call, out) -> None:
        from frost_runtime.hf import cb_reference, pools

        real = _real_rows(call.step)
        written = call.write_index[: call.step.rows][real]
        for pages, x, scale in ((call.k_rows, call.k, call.k_scale), (call.v_rows, call.v, call.v_scale)):
            stored = pages[written].view(torch.uint8)
            want = pools.quantize(x[: call.step.rows][real], scale).view(torch.uint8)
            assert torch.equal(stored, want), f"layer {call.layer}: the appended rows"
        want = cb_reference.attend(
            call.step, call.q, call.k, call.v, call.k_pages, call.v_pages, call.scale, call.window_left,
            call.softcap, overlay=False, kv_scales=(call.k_scale, call.v_scale),
        )  # fmt: skip
        error = float((out.float() - want.float())[real].abs().max()) if bool(real.any()) else 0.0
        self.worst = max(self.worst, error)
        assert error < 2e-2, f"layer {call.layer}: plan vs reference over the e4m3 pages, max |diff| {error:.4f}"
        self.checked += 1


def _real_rows(step) -> torch.Tensor:
    """The step's query rows that belong to a sequence (not transformers' padding)."""
    t = torch.arange(step.rows, device=step.cu_seqlens_q.device)
    return (t >= step.cu_seqlens_q[0]) & (t < step.cu_seqlens_q[-1])


def test_an_e4m3_pool_through_the_plans() -> None:
    """Llama over an e4m3 pool (`frostc from-config --kv-cache-dtype e4m3 --cb-tokens ...`):
    transformers allocates the pool in e4m3 (half the bytes), every eager step's appended rows and
    output checked against the reference over the same pages; then under transformers' graphs,
    every call through a plan, the tokens printed beside the bf16 peer's."""
    plans = _plans("llama", "e4m3")
    model = cb_model("llama", device="cuda", dtype=torch.bfloat16)
    inputs = prompts(REQUESTS, LONGEST, seed=21)
    expected = peer_tokens(model, "llama", inputs, NEW_TOKENS)
    checked = CheckedAgainstReference(plans)
    cb = SyncFree(checked, kv_cache_dtype="e4m3").install(model)
    config = cb_config(use_cuda_graph=False, use_async_batching=False)
    out = model.generate_batch(inputs, generation_config=greedy(NEW_TOKENS), continuous_batching_config=config)
    assert checked.checked > 0 and set(cb.calls) == {"mixed via plans", "decode via plans"}, dict(cb.calls)
    print(f"e4m3 eager: {checked.checked} steps checked, worst |plan - reference| {checked.worst:.4f}")
    graphed = SyncFree(PlanExecutor(plans), kv_cache_dtype="e4m3").install(model)
    config = cb_config(use_cuda_graph=True, use_async_batching=True)
    again = model.generate_batch(inputs, generation_config=greedy(NEW_TOKENS), continuous_batching_config=config)
    _served_by_plans(graphed.calls, graphs=True)
    same = sum(again[r].generated_tokens == out[r].generated_tokens for r in out)
    peer = sum(again[r].generated_tokens == expected[r] for r in out)
    print(f"e4m3 under graphs: {same} of {len(out)} requests as eager e4m3, {peer} as the bf16 peer (sdpa)")
    continuous.install(model)  # the model's dtype again for later pools


def test_a_manager_adds_and_cancels_and_reuses_its_pages() -> None:
    family = "llama"
    plans = _plans(family)
    model = cb_model(family, device="cuda", dtype=torch.bfloat16)
    first, later = prompts(24, 100, seed=5), prompts(16, 100, seed=6)
    fields = dict(allow_block_sharing=False, use_async_batching=True)
    expected = peer_tokens(model, family, first + later, 16, **fields)
    cb = SyncFree(PlanExecutor(plans)).install(model)
    manager = model.init_continuous_batching(
        generation_config=greedy(16), continuous_batching_config=cb_config(**fields)
    )
    manager.start()
    try:
        ids = manager.add_requests(first, max_new_tokens=16)
        cancelled = {ids[1], ids[6]}
        for rid in cancelled:
            manager.cancel_request(rid)
        time.sleep(0.2)
        later_ids = manager.add_requests(later, max_new_tokens=16)
        for rid in later_ids[2:4]:
            manager.cancel_request(rid)
            cancelled.add(rid)
        wanted, results, deadline = set(ids + later_ids) - cancelled, {}, time.time() + 120
        while set(results) < wanted and time.time() < deadline:
            out = manager.get_result(timeout=1)
            if out is not None and out.is_finished() and out.request_id in wanted:
                results[out.request_id] = out
        cache = manager.batch_processor.cache
        time.sleep(0.5)
        free = cache.compute_free_capacity()
    finally:
        manager.stop(block=True, timeout=30)
    assert set(results) == wanted
    by_id = dict(zip(ids + later_ids, expected.values()))
    prompts_by_id = dict(zip(ids + later_ids, first + later))
    got = {r: o.generated_tokens for r, o in results.items()}
    print(near_ties(model, prompts_by_id, {r: by_id[r] for r in results}, got))
    pages = sum(-(-(len(p) + 16) // 16) for p in first + later)
    assert pages > cache.num_blocks  # more than the pool holds at once: pages were freed and reused
    assert free == 1.0, "blocks still held at the end"
    # async batching with a mask-free attention: transformers' CUDA graphs are on, so only the
    # captures' calls are counted (every step replays one)
    _served_by_plans(cb.calls, graphs=True)
