"""transformers' continuous batching (generate_batch, ContinuousBatchingManager) through frostc's
mixed form (runtime/frost_runtime/hf/continuous.py) on the CPU, with the torch reference executor:
transformers' pool read in place through page tables derived from its own index tensors.

- the step metadata (cb_step.py) against transformers' own gather indices, for full and sliding
  groups, over many random mixes of chunks and decodes;
- the four tiny families (tests/hf_models.py; Mistral's window bites, Gemma-2 has window and softcap)
  through `generate_batch` with mixed prompt lengths, chunked prefills among them: the same tokens as
  transformers' continuous batching with its own attention (float32 models: no near ties), every
  attention call served by frostc (counted against the forwards), none reading the device;
- a `ContinuousBatchingManager` taking requests while it runs, some cancelled, its pool's pages
  reused, and whole at the end;
- docs/serving.md's example, run as written.
The compiled plans run the same on the GPU: tests/gpu/test_hf_continuous.py.
"""

from __future__ import annotations

import contextlib
import random
import re
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from frost_runtime.hf import cb_cache, cb_patches, cb_step, continuous  # noqa: E402

from tests.cb_models import CB_TINY, PAGE, cb_config, cb_model, greedy, peer_tokens, prompts  # noqa: E402
from tests.hf_models import TINY  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs" / "serving.md"


class CountingForwards:
    """Counts the model's forwards (each is one step: every layer's attention is called once)."""

    def __init__(self, model):
        self.count = 0
        self.handle = model.model.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.count += 1


HOST_READS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")
_REAL = {name: getattr(torch.Tensor, name) for name in HOST_READS}


def _refuse(*_, **__):
    raise AssertionError("a host read in frostc's attention path")


@contextlib.contextmanager
def no_host_reads():
    """Any read of a tensor's values on the host (item, tolist, numpy, bool / int / float of a tensor)
    raises: what a device-to-host read would be on the GPU."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}
    for name in HOST_READS:
        setattr(torch.Tensor, name, _refuse)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


@contextlib.contextmanager
def host_reads_allowed():
    """Inside no_host_reads: what stands in for a kernel (ContractPlan) may read."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}
    for name, fn in _REAL.items():
        setattr(torch.Tensor, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


class Guarded(continuous.ContinuousAttention):
    """The attention with host reads refused inside it (its executor's too)."""

    def attention(self, *args, **kwargs):
        with no_host_reads():
            return super().attention(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# The step metadata against transformers' own indices


def _paged_cache(family: str, dtype=None, **fields):
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    from transformers.generation.continuous_batching.distributed import DistributedHelper

    model = cb_model(family)
    helper = DistributedHelper(device_mesh=None, cpu_group_timeout=None, tp_plan={})
    config = cb_config(**fields)
    config.max_blocks_per_request, config.max_memory_percent = 0, 0.6  # what resolving the config sets on a CPU
    cache = PagedAttentionCache(model.config, config, "cpu", helper, dtype=dtype or torch.float32)
    return model, cache


def _mix(cache, rng: random.Random, sequences: int):
    """Requests at random (past, query) lengths allocated in the cache, and transformers' kwargs of the
    step: its cu_seq_lens, positions, read and write indices."""
    from transformers.generation.continuous_batching.requests import RequestState

    cu_q, cu_k, positions, lengths = [0], {t: [0] for t in cache.cache_allocators}, [], []
    groups = len(cache.cache_allocators)
    read, write = [[] for _ in range(groups)], [[] for _ in range(groups)]
    for i in range(sequences):
        past = rng.choice((0, rng.randint(0, 90), rng.randint(0, 15)))
        query = rng.choice((1, 1, rng.randint(1, 40)))
        state = RequestState(request_id=f"r{i}-{rng.random()}", initial_tokens=[1] * (past + query))
        assert cache.can_store_request_tokens(state, past + query)
        cache.extend_read_and_write_indices(state.request_id, past, query, read, write)
        cu_q.append(cu_q[-1] + query)
        for layer_type, allocator in cache.cache_allocators.items():
            cu_k[layer_type].append(cu_k[layer_type][-1] + allocator.get_seqlen_k(past, query))
        positions.extend(range(past, past + query))
        lengths.append((past, query))
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    kwargs = {
        "cu_seq_lens_q": as_int(cu_q + [cu_q[-1]] * 2),  # two padding sequences, as under graphs
        "cu_seq_lens_k": {t: as_int(c + [c[-1]] * 2) for t, c in cu_k.items()},
        "position_ids": as_int(positions + [0] * 3)[None],  # three padding tokens
        "read_index": [torch.tensor(r + [0] * 5, dtype=torch.int64) for r in read],
        "write_index": [
            torch.tensor(w + [a.write_trash_index] * 3) for w, a in zip(write, cache.cache_allocators.values())
        ],
        "max_length_q": max(q for _, q in lengths),
    }
    return kwargs, lengths, read


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_page_tables_address_the_rows_transformers_gathers(family: str) -> None:
    """For every sequence of random mixes, the page table, lengths and prefix sums frostc derives put
    each key position exactly on the pool row transformers' read_index gathers for it (full
    attention: positions 0 .. L; a sliding ring: the last window - 1 before the step)."""
    _, cache = _paged_cache(family)
    rng = random.Random(3)
    for trial in range(12):
        cache.reset()
        kwargs, lengths, read = _mix(cache, rng, sequences=rng.randint(1, 6))
        for allocator in cache.cache_allocators.values():
            geo = cb_cache.geometry(allocator)
            step = cb_step.build(kwargs, geo, max_pages=16, rows=kwargs["position_ids"].shape[1])
            b = len(lengths)
            assert step.sequences == b + 2 and step.seq_len_kv[b:].tolist() == [0, 0]
            assert step.seq_len_kv[:b].tolist() == [p + q for p, q in lengths]
            assert torch.equal(step.cu_seqlens_q, kwargs["cu_seq_lens_q"])
            at = 0
            for i, (past, query) in enumerate(lengths):
                if geo.window is None:
                    positions = range(past + query)
                else:
                    cached = min(past, geo.window - 1)
                    positions = range(past - cached, past)
                for k, p in enumerate(positions):
                    row = int(step.page_table[i, p // PAGE]) * geo.block_rows + p % PAGE
                    assert row == read[geo.index][at + k], (trial, family, geo.layer_type, i, p)
                at += len(positions) + (0 if geo.window is None else query)


def test_sliding_window_not_a_whole_number_of_pages_is_refused() -> None:
    _, cache = _paged_cache("mistral", page_size=12)
    with pytest.raises(ValueError, match="sliding_window 32 is not a multiple of the continuous-batching page_size 12"):
        cb_cache.geometry(cache.cache_allocators["sliding_attention"])


def test_pool_views_are_the_pool_itself() -> None:
    """Layer i's K and V page views are strided views of transformers' one pool: a write through
    transformers' token rows is seen at (block, row) of the page views."""
    _, cache = _paged_cache("gemma2")
    for allocator in cache.cache_allocators.values():
        geo = cb_cache.geometry(allocator)
        for layer in geo.layers:
            k_pages, v_pages = cb_cache.layer_pages(allocator, geo, layer)
            k_rows, v_rows = cb_cache.layer_rows(allocator, geo, layer)
            assert k_pages.untyped_storage().data_ptr() == allocator.cache_tensor.untyped_storage().data_ptr()
            block, row = 5, 3
            k_rows[block * geo.block_rows + row] = float(layer + 1)
            v_rows[block * geo.block_rows + row] = -float(layer + 1)
            assert (k_pages[block, row] == layer + 1).all() and (v_pages[block, row] == -(layer + 1)).all()


# ---------------------------------------------------------------------------------------------
# An e4m3 pool (frostc's: transformers allocates it so through cb_patches.pool_dtype)


def _e4m3_cache(family: str):
    """The family's model on frostc's attention with an e4m3 pool, and transformers' cache for it."""
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    from transformers.generation.continuous_batching.distributed import DistributedHelper

    model = cb_model(family)
    cb = continuous.install(model, kv_cache_dtype="e4m3")
    helper = DistributedHelper(device_mesh=None, cpu_group_timeout=None, tp_plan={})
    config = cb_config()
    config.max_blocks_per_request, config.max_memory_percent = 0, 0.6
    cache = PagedAttentionCache(model.config, config, "cpu", helper, dtype=torch.float32)
    return model, cb, cache


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_an_e4m3_pool_is_written_and_read_with_per_head_scales(family: str) -> None:
    """transformers allocates the pool in e4m3 (half the bytes of the same blocks); a layer's first
    step sets its (hkv,) scales from its K/V (amax / 448, twice the headroom); the step's rows land
    in the pool quantized with them (x / scale, saturated, to nearest), and the attention over
    random past pages and the step's rows is a float64 reference's over the dequantized keys.
    Mistral: its window bites (the reference reads the ring before the step writes it)."""
    from frost_runtime.hf import pools

    try:
        model, cb, cache = _e4m3_cache(family)
        allocators = list(cache.cache_allocators.values())
        assert all(a.cache_tensor.dtype == torch.float8_e4m3fn for a in allocators)
        raw = torch.randn(cache.cache_tensor.numel(), generator=torch.Generator().manual_seed(1)) * 40
        cache.cache_tensor.copy_(raw.to(torch.float8_e4m3fn).view(torch.uint8))  # random past pages
        kwargs, lengths, read = _mix(cache, random.Random(5), sequences=5)
        layer = 1
        module = model.model.layers[layer].self_attn
        allocator = cache.layer_to_allocator[layer]
        geo = cb_cache.geometry(allocator)
        rows = kwargs["position_ids"].shape[1]
        hq, hkv, d = model.config.num_attention_heads, model.config.num_key_value_heads, module.head_dim
        g = torch.Generator().manual_seed(2)
        q, k, v = (torch.randn(1, h, rows, d, generator=g) * 3 for h in (hq, hkv, hkv))
        past = [x.clone().float() for x in cb_cache.layer_rows(allocator, geo, layer)]  # before the step writes
        window = model.config.sliding_window if geo.window is not None else None
        out, _ = cb.attention(
            module, q, k, v, None, scaling=module.scaling, sliding_window=window, cache=cache, **kwargs
        )  # fmt: skip
        k_scale, v_scale = (pools.head_scales(x[0], head_dim=0) for x in (k, v))
        assert torch.equal(cb._pool(allocator).scales[layer][0], k_scale)
        k_rows, _ = cb_cache.layer_rows(allocator, geo, layer)
        written = kwargs["write_index"][geo.index][: sum(qn for _, qn in lengths)]
        stored = pools.quantize(k[0].transpose(0, 1), k_scale)[: written.shape[0]]
        assert torch.equal(k_rows[written].view(torch.uint8), stored.view(torch.uint8))
        expected = _float64_attention(q, k, v, (k_scale, v_scale), past, lengths, read, geo, module.scaling)
        got = out[0, : expected.shape[0]].double()
        assert torch.allclose(got, expected, atol=2e-4, rtol=2e-4), (got - expected).abs().max()
    finally:
        continuous.install(None)  # the model's dtype again for every later pool


def _float64_attention(q, k, v, scales, past, lengths, read, geo, scaling: float) -> torch.Tensor:
    """(rows, hq, d): each sequence's queries over its past keys (the rows transformers' read_index
    names in the layer's token rows before the step, dequantized) and its new ones (as the pool
    holds them), causal, within the window."""
    from frost_runtime.hf import pools

    hq, hkv = q.shape[1], k.shape[1]
    new = [pools.quantize(x[0].transpose(0, 1), s).double() * s.double().view(1, -1, 1) for x, s in zip((k, v), scales)]
    old = [x.double() * s.double().view(1, -1, 1) for x, s in zip(past, scales)]
    outs, at_q, at_read = [], 0, 0
    for past_len, query in lengths:
        cached = past_len if geo.window is None else min(past_len, geo.window - 1)
        rows = torch.tensor(read[geo.index][at_read : at_read + cached], dtype=torch.int64)
        keys, values = (torch.cat([o[rows], n[at_q : at_q + query]]) for o, n in zip(old, new))
        positions = torch.arange(past_len - cached, past_len + query)
        for j in range(query):
            p = past_len + j
            seen = positions <= p
            if geo.window is not None:
                seen &= positions > p - geo.window
            kk, vv = (x[seen].repeat_interleave(hq // hkv, dim=1) for x in (keys, values))  # (n, hq, d)
            weights = torch.softmax(torch.einsum("hd,nhd->hn", q[0, :, at_q + j].double(), kk) * scaling, dim=-1)
            outs.append(torch.einsum("hn,nhd->hd", weights, vv))
        at_q += query
        at_read += cached + query  # read_index lists the past rows, then the step's
    return torch.stack(outs)


# ---------------------------------------------------------------------------------------------
# Whole generations


@pytest.mark.parametrize("family", list(CB_TINY))
def test_generate_batch_through_frostc_gives_the_peers_tokens(family: str) -> None:
    """24 requests of 1 to 100 tokens (prefills chunked over steps of at most 64 tokens, decodes
    among them), 10 new tokens each: the same tokens as transformers' continuous batching with
    sdpa (Gemma-2: eager); every attention call of every step served by frostc's mixed form,
    decode-only steps included; no host read inside it."""
    model = cb_model(family)
    inputs = prompts(24, 100, seed=list(TINY).index(family))
    expected = peer_tokens(model, family, inputs, 10)
    cb = Guarded().install(model)
    forwards = CountingForwards(model)
    out = model.generate_batch(inputs, generation_config=greedy(10), continuous_batching_config=cb_config())
    forwards.handle.remove()
    assert {rid: o.generated_tokens for rid, o in out.items()} == expected
    layers = model.config.num_hidden_layers
    assert sum(cb.calls.values()) == layers * forwards.count
    assert set(cb.calls) == {"mixed via reference", "decode via reference"}, cb.calls


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_fused_layers_under_continuous_batching_give_the_peers_tokens(family: str) -> None:
    """hf_fuse's fused decoder layers (one QKV GEMM, rotary in place, the norms and SiLU's product
    as one kernel each) inside transformers' continuous batching: the peer's tokens, every
    attention call served by frostc, no host read; the layers hand position_ids on to the attention
    as HF's do (a sliding group's lengths come from them)."""
    from frost_runtime import hf_fuse

    model = cb_model(family)
    inputs = prompts(24, 100, seed=list(TINY).index(family))
    expected = peer_tokens(model, family, inputs, 10)
    hf_fuse.fuse_layers(model)
    cb = Guarded().install(model)
    out = model.generate_batch(inputs, generation_config=greedy(10), continuous_batching_config=cb_config())
    assert {rid: o.generated_tokens for rid, o in out.items()} == expected
    assert set(cb.calls) == {"mixed via reference", "decode via reference"}, cb.calls


def test_a_finished_calls_pool_is_freed() -> None:
    """frostc keeps each pool's views only while transformers holds the cache: the next
    generate_batch sizes its pool from free memory, which a kept pool would take (on the GPU the
    second call of bench/serve.py was refused by transformers' memory check)."""
    import gc

    model = cb_model("llama")
    cb = continuous.install(model)
    for _ in range(2):
        model.generate_batch(prompts(4, 40), generation_config=greedy(3), continuous_batching_config=cb_config())
        gc.collect()
        allocators = [o for o in gc.get_objects() if type(o).__name__.endswith("CacheAllocator")]
        assert not allocators, "a finished call's cache (its pool) is still referenced"
    assert cb.calls["mixed via reference"] > 0


def test_a_cancelled_request_is_finished_as_it_is_cleared() -> None:
    """transformers 5.23's race under async batching (cb_patches): a request cancelled while the
    step holding it is in flight reached `update_batch` with its blocks freed, and
    `mark_complete_blocks` raised KeyError (the soak's server loop died of it). Unpatched, the
    cleared state stays DECODING and raises; patched, it is FINISHED and skipped, and its result
    handler (never removed upstream: a cancelled request never finishes) leaves the router."""
    from transformers.generation.continuous_batching.continuous_api import OutputRouter
    from transformers.generation.continuous_batching.requests import RequestState, RequestStatus
    from transformers.generation.continuous_batching.scheduler import FIFOScheduler

    continuous.install(None)  # the hooks
    _, cache = _paged_cache("llama", allow_block_sharing=True)
    scheduler = FIFOScheduler(cache, 0.0, 8)
    scheduler.frostc_output_router = router = OutputRouter()  # as the batch processor's hook sets it
    unpatched = FIFOScheduler.clear_cancelled_requests.__wrapped__
    for clear, raises in ((unpatched, True), (FIFOScheduler.clear_cancelled_requests, False)):
        state = RequestState(request_id=f"r{raises}", initial_tokens=list(range(1, 41)))
        state.status = RequestStatus.DECODING
        assert cache.can_store_request_tokens(state, 40)
        scheduler.active_requests[state.request_id] = state
        router.result_handlers[state.request_id] = (print, None)
        scheduler.set_request_cancellation(state.request_id)
        assert clear(scheduler) == [state]
        assert (state.request_id in router.result_handlers) == raises
        if raises:
            assert state.status == RequestStatus.DECODING
            with pytest.raises(KeyError):
                cache.mark_complete_blocks(state, {"full_attention": 2})  # the step in flight's update
        else:
            assert state.status == RequestStatus.FINISHED
            cache.mark_complete_blocks(state, {"full_attention": 2})


def test_outside_continuous_batching_the_name_is_refused() -> None:
    model = cb_model("llama")
    continuous.install(model)
    with pytest.raises(ValueError, match="serves transformers' continuous batching only"):
        model(torch.tensor([[1, 2, 3]]))


def test_the_name_is_accepted_as_mask_free() -> None:
    """transformers' checks (cb_patches.py): accepted, not switched away, graphs and async batching
    chosen as for FlashAttention, no masks built."""
    from transformers.generation.continuous_batching import initialization
    from transformers.generation.continuous_batching.utils import attn_mask_is_needed

    model = cb_model("llama")
    continuous.install(model)
    assert continuous.NAME in cb_patches.MASK_FREE and "flash" not in continuous.NAME
    manager = model.init_continuous_batching(generation_config=greedy(2), continuous_batching_config=cb_config())
    assert model.config._attn_implementation == continuous.NAME
    assert initialization.is_flash_attention_requested(model.config)
    assert not initialization.is_flash_attention_requested(model.config, version=[2, 3])  # no fast path
    assert not attn_mask_is_needed(model.config)
    manager.destroy() if hasattr(manager, "destroy") else None


def test_a_step_is_shared_within_a_forward_but_never_across_a_capture(monkeypatch) -> None:
    """transformers warms a graph up with an eager forward and then captures the same forward (the
    same kwargs): the captured one must build its own step, or the graph holds no metadata and every
    replay reads the warm-up's page tables (what the H100 run showed)."""
    built = []
    monkeypatch.setattr(cb_step, "build", lambda kwargs, geo, max_pages, rows: built.append(rows) or object())
    capturing = [False]
    monkeypatch.setattr(continuous, "_capturing", lambda t: capturing[0])
    attention = continuous.ContinuousAttention(max_pages=4)
    geo = type("Geo", (), {"index": 0})()
    kwargs = {"cu_seq_lens_q": torch.tensor([0, 3])}
    layers = lambda: [attention._step(kwargs, geo, None, 3) for _ in range(3)]  # noqa: E731
    eager = layers()
    capturing[0] = True
    captured = layers()
    assert len(built) == 2, "one build per forward: the warm-up's, then the capture's own"
    assert len({id(s) for s in eager}) == 1 and len({id(s) for s in captured}) == 1 and eager[0] is not captured[0]
    capturing[0] = False
    layers()
    assert len(built) == 3, "after the capture, an eager forward builds again"
    layers()
    assert len(built) == 3
    kwargs = {"cu_seq_lens_q": torch.tensor([0, 3])}  # the next step's kwargs
    layers()
    assert len(built) == 4


def test_cuda_graphs_and_async_batching_are_on_by_default_for_the_name(monkeypatch) -> None:
    """As for FlashAttention: transformers' defaults for a mask-free name where a graph backend
    exists (replayed steps are right: the previous test); sdpa keeps them off."""
    from transformers.generation.continuous_batching import continuous_api, initialization

    monkeypatch.setattr(initialization, "get_accelerator_graph_name", lambda: "cuda")
    model = cb_model("llama")
    continuous.install(model)
    resolve = continuous_api.resolve_continuous_batching_config
    device = torch.device("cpu")
    resolved = resolve(model.config, cb_config(), None, False, device)
    assert all(resolved.cuda_graph_booleans) and resolved.use_async_batching
    model.set_attn_implementation("sdpa")
    assert not any(resolve(model.config, cb_config(), None, False, device).cuda_graph_booleans)


def test_a_manager_takes_requests_while_running_cancels_some_and_reuses_its_pages() -> None:
    """A ContinuousBatchingManager over a small pool: 12 requests, 8 more added while it runs, 4
    cancelled. The others give the peer's tokens; together they need more pages than the pool has (so
    pages were freed and reused); at the end every block is back in the pool."""
    family = "mistral"
    model = cb_model(family)
    first, later = prompts(12, 60, seed=5), prompts(8, 60, seed=6)
    config = dict(num_blocks=24, max_batch_tokens=48, allow_block_sharing=False)
    expected = peer_tokens(model, family, first + later, 16, **config)
    cb = continuous.install(model)
    manager = model.init_continuous_batching(
        generation_config=greedy(16), continuous_batching_config=cb_config(**config)
    )
    manager.start()
    try:
        ids = manager.add_requests(first, max_new_tokens=16)
        cancelled = {ids[1], ids[6]}
        for rid in cancelled:
            manager.cancel_request(rid)
        time.sleep(0.2)  # the loop is running: add while it does
        later_ids = manager.add_requests(later, max_new_tokens=16)
        for rid in later_ids[2:4]:
            manager.cancel_request(rid)
            cancelled.add(rid)
        results = _collect(manager, set(ids + later_ids) - cancelled)
        cache = manager.batch_processor.cache  # stop() lets the batch processor go
        assert manager.batch_processor.scheduler.frostc_output_router is manager.output_router
        time.sleep(0.2)  # the loop's last step frees the last request's blocks
        free = cache.compute_free_capacity()
    finally:
        manager.stop(block=True, timeout=30)
    by_order = dict(zip(ids + later_ids, expected.values()))
    for rid, out in results.items():
        assert out.generated_tokens == by_order[rid], rid
    pages = sum(-(-min(len(p) + 16, 32) // PAGE) for p in first + later)  # the sliding ring's pages each
    assert pages > cache.num_blocks  # more than the pool holds at once: pages were reused
    assert free == 1.0, "blocks still held at the end"
    assert all(not a.block_table for a in cache.cache_allocators.values())
    assert cb.calls["mixed via reference"] > 0 and cb.calls["decode via reference"] > 0


def _collect(manager, wanted: set[str], timeout: float = 120.0) -> dict:
    results, deadline = {}, time.time() + timeout
    while set(results) < wanted and time.time() < deadline:
        out = manager.get_result(timeout=1)
        if out is not None and out.is_finished() and out.request_id in wanted:
            results[out.request_id] = out
    assert set(results) == wanted, f"missing {sorted(wanted - set(results))}"
    return results


# ---------------------------------------------------------------------------------------------
# The plan path, with each plan's contract computed in torch


class ContractPlan:
    """A built mixed plan's contract on the CPU: its slots (from the plan file) checked as the runtime
    checks a bound buffer (dtype, dims, strides), then what the plan computes, in torch: the packed
    append of k_new / v_new through the page table, then the attention read from the pages alone."""

    def __init__(self, plans, key: str):
        self.data = plans.plan_data(key)
        self.slots = tuple(s.name for s in self.data.slots)
        self.workspace_bytes = 0
        info = plans.kind_info[plans.entry(key).kind]
        self.attention = (info.scale, info.window_left, info.softcap)
        self.executed = 0

    def execute(self, *buffers, workspace=None) -> None:
        with host_reads_allowed():  # it stands in for the plan's kernels
            self._execute(*buffers)

    def _execute(self, *buffers) -> None:
        from frost_runtime import dtypes
        from frost_runtime.hf import cb_reference

        named = dict(zip(self.slots, buffers, strict=True))
        for slot in self.data.slots:
            t = named[slot.name]
            got = (dtypes.from_torch(t.dtype), tuple(t.shape), t.stride())
            assert got == (slot.dtype, slot.dims, slot.strides), f"{slot.name}: {got}, the plan's {slot}"
        step = cb_step.Step(
            named["cu_q"], named["cache_len"], named["page_table"], rows=len(named["q"]), max_seqlen_q=0
        )
        seq, pos, valid = cb_reference._token_positions(step, step.rows)
        page = named["k_cache"].shape[1]
        valid &= pos < step.page_table.shape[1] * page
        i = seq.clamp(max=step.sequences - 1)
        for t in valid.nonzero().flatten().tolist():  # the padding rows are not appended
            block = int(step.page_table[i[t], pos[t] // page])
            named["k_cache"][block, int(pos[t]) % page] = named["k_new"][t]
            named["v_cache"][block, int(pos[t]) % page] = named["v_new"][t]
        args = (named["q"], named["k_new"], named["v_new"], named["k_cache"], named["v_cache"], *self.attention)
        named["o"].copy_(cb_reference.attend(step, *args, overlay=False, sinks=named.get("sinks")))
        self.executed += 1


@pytest.fixture(scope="module")
def cb_sets() -> dict:
    import frost_runtime

    from tests.cb_models import build_cb_set

    return {family: frost_runtime.read_set(build_cb_set(family)) for family in CB_TINY}


def test_from_config_sizes_the_pool_as_transformers_does(cb_sets) -> None:
    """The mixed plans' caches have exactly the blocks of each layer group's view of transformers'
    pool for the same num_blocks, page size and dtype (bf16), with its strides."""
    for family, plans in cb_sets.items():
        _, cache = _paged_cache(family, dtype=torch.bfloat16)
        kinds = {layer: info for info in plans.kind_info.values() for layer in info.layers}
        for allocator in cache.cache_allocators.values():
            geo = cb_cache.geometry(allocator)
            k_pages, _ = cb_cache.layer_pages(allocator, geo, geo.layers[-1])
            for e in plans.entries:
                if set(e.layers) & set(geo.layers):
                    assert kinds[geo.layers[0]].kind == e.kind
                    k_cache = next(s for s in plans.plan_data(e.key).slots if s.name == "k_cache")
                    assert (k_cache.dims, k_cache.strides) == (tuple(k_pages.shape), k_pages.stride()), family


@pytest.mark.parametrize("family", list(CB_TINY))
def test_generate_batch_through_the_plans(cb_sets, family: str) -> None:
    """The plan executor (cb_plans.py) with each plan's contract computed in torch: bucket choice,
    staging, the pool bound by strides, the page tables the append writes through (a sliding ring
    too). bf16: the peer's tokens or near ties (tests/cb_models.py states the rule), and exactly the
    reference executor's tokens (the same fp32 attention over the same pages); every step through a
    plan but the chunks that wrap a sliding ring."""
    from frost_runtime.hf.cb_plans import PlanExecutor

    from tests.cb_models import near_ties

    model = cb_model(family, dtype=torch.bfloat16)
    inputs = prompts(24, 100, seed=list(TINY).index(family))
    expected = peer_tokens(model, family, inputs, 10)
    plans = cb_sets[family]
    loaded = {}
    executor = PlanExecutor(plans, load=lambda key: loaded.setdefault(key, ContractPlan(plans, key)))
    cb = Guarded(executor).install(model)
    with pytest.warns(UserWarning) if "sliding_window" in TINY[family] else contextlib.nullcontext():
        out = model.generate_batch(inputs, generation_config=greedy(10), continuous_batching_config=cb_config())
    got = {rid: o.generated_tokens for rid, o in out.items()}
    near_ties(model, dict(zip(expected, inputs)), expected, got)
    continuous.install(model)  # the reference executor: the same fp32 attention over the same bf16 pages
    exact = model.generate_batch(inputs, generation_config=greedy(10), continuous_batching_config=cb_config())
    assert got == {rid: o.generated_tokens for rid, o in exact.items()}
    assert cb.calls["mixed via plans"] > 0 and cb.calls["decode via plans"] > 0
    others = {k for k in cb.calls if "via plans" not in k}
    assert all("wraps its ring" in k for k in others), others
    assert set(loaded) == {e.key for e in plans.entries}  # both buckets served steps


def test_fused_layers_hand_their_qkv_views_to_a_fused_set_without_a_copy(cb_sets) -> None:
    """A set built with --qkv-layout fused (tests/cb_models.py's, for the families hf_fuse fuses)
    takes q, k_new and v_new as views of the fused layer's QKV buffer: a step at a bucket's rows
    binds those views as they are (one storage, the QKV row's stride), a step of other rows is
    staged into the same strides; the tokens are the peer's or near ties."""
    from frost_runtime import hf_fuse
    from frost_runtime.hf.cb_plans import PlanExecutor

    from tests.cb_models import near_ties

    class Recording(ContractPlan):
        views: list[bool] = []

        def _execute(self, *buffers) -> None:
            named = dict(zip(self.slots, buffers, strict=True))
            q, k, v = named["q"], named["k_new"], named["v_new"]
            self.views.append(
                q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
            )
            super()._execute(*buffers)

    model = cb_model("llama", dtype=torch.bfloat16)
    inputs = prompts(24, 100, seed=0)
    expected = peer_tokens(model, "llama", inputs, 10)
    plans = cb_sets["llama"]
    q_slot = next(s for s in plans.plan_data(plans.entries[0].key).slots if s.name == "q")
    heads, d = model.config.num_attention_heads, model.config.head_dim
    assert q_slot.strides == ((heads + 2 * model.config.num_key_value_heads) * d, d, 1)  # the QKV row
    hf_fuse.fuse_layers(model)
    executor = PlanExecutor(plans, load=lambda key: Recording(plans, key))
    cb = Guarded(executor).install(model)
    out = model.generate_batch(inputs, generation_config=greedy(10), continuous_batching_config=cb_config())
    near_ties(model, dict(zip(expected, inputs)), expected, {rid: o.generated_tokens for rid, o in out.items()})
    assert any(Recording.views) and cb.calls["decode via plans"] > 0


def test_a_pool_the_plans_were_not_built_for_is_refused(cb_sets) -> None:
    from frost_runtime.hf.cb_plans import PlanExecutor

    model = cb_model("llama", dtype=torch.bfloat16)
    plans = cb_sets["llama"]
    executor = PlanExecutor(plans, load=lambda key: ContractPlan(plans, key))
    continuous.install(model, executor=executor)
    config = cb_config(num_blocks=64)
    out = model.generate_batch([[1, 2, 3]], generation_config=greedy(2), continuous_batching_config=config)
    assert _failed_with(out, "num_blocks: transformers' pool has 66 blocks for the full_attention layers, the plan")


def test_a_model_the_plans_were_not_built_for_is_refused(cb_sets) -> None:
    from frost_runtime.hf.cb_plans import PlanExecutor

    model = cb_model("llama", dtype=torch.float16)
    plans = cb_sets["llama"]
    continuous.install(model, executor=PlanExecutor(plans, load=lambda key: ContractPlan(plans, key)))
    out = model.generate_batch([[1, 2, 3]], generation_config=greedy(2), continuous_batching_config=cb_config())
    assert _failed_with(out, "dtype: the model passes fp16, the set was built for bf16")


def _failed_with(out: dict, message: str) -> bool:
    """generate_batch's requests failed (its loop logs the error and fails them), naming `message`."""
    return bool(out) and all(o.error is not None and message in str(o.error) for o in out.values())


# ---------------------------------------------------------------------------------------------
# The docs


def docs_example() -> str:
    """docs/serving.md's continuous-batching example (the first python block of its section)."""
    text = DOCS.read_text()
    section = text.split("## Continuous batching in transformers", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_docs_example_runs() -> None:
    """As written, with `model` and `prompts` given: the peer's tokens."""
    model = cb_model("qwen2")
    inputs = prompts(8, 40, seed=9)
    expected = peer_tokens(model, "qwen2", inputs, 64)
    scope = {"model": model, "prompts": inputs}
    exec(compile(docs_example(), str(DOCS), "exec"), scope)
    assert {rid: o.generated_tokens for rid, o in scope["out"].items()} == expected
    assert sum(scope["cb"].calls.values()) > 0


def test_a_steps_padded_metadata_is_built_once_for_all_its_layers() -> None:
    """The bucket's padding of a step's cu_q, cache_len and page table: built by its first layer,
    the same tensors for the others (host time in every eager pass and capture)."""
    from frost_runtime.hf.cb_plans import _padded
    from frost_runtime.hf.cb_step import Step

    step = Step(torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([5, 9], dtype=torch.int32),
                torch.arange(8, dtype=torch.int32).view(2, 4), rows=3, max_seqlen_q=2)  # fmt: skip
    first = _padded(step, 4)
    assert _padded(step, 4) is first and first["cu_q"].tolist() == [0, 2, 3, 3, 3]
    assert first["cache_len"].tolist() == [5, 9, 0, 0] and first["page_table"][2:].eq(0).all()
    assert _padded(step, 2)["cu_q"] is step.cu_seqlens_q  # no padding: the step's own
