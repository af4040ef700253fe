"""The hooks frostc needs in transformers' continuous batching (5.23) and its `transformers serve`,
and nothing else.

transformers tells a mask-free attention (one that takes `cu_seq_lens_q` / `cu_seq_lens_k` and needs
no 4-D mask) by its name: `is_flash_attention_requested`, i.e. `"flash" in name`. Two places use it:
- `ContinuousBatchingManager.switch_to_cb_friendly_attn` refuses every name but "paged|eager",
  "sdpa" and flash names (and may switch an sdpa model to FlashAttention);
- `initialization.py` turns CUDA graphs and async batching on by default only for flash names, and
  the cache's memory handler (cache.py) reserves room for masks for the others.
Everything else already treats a registered attention as mask-free: the step's inputs build masks
only for "paged|eager" and "sdpa" (`attn_mask_is_needed`), and the attention gets `cu_seq_lens_q`
and the cache's index tensors.

CUDA graphs and async batching then follow transformers' defaults for mask-free names (both on). A
replayed step holds its own metadata: transformers warms each graph up with an eager forward and
captures the same forward with the same arguments, and continuous.py never shares a step across a
capture's edge (on the H100, 2026-12-05, graph-replayed steps gave the same tokens as eager ones).

`transformers serve` (cli/serving/model_manager.py) checks `--attn-implementation` against a fixed
set (eager, sdpa, flash_attention_2/3, flex_attention) or a Hub kernel, before any model loads: a
name registered with `AttentionInterface` is refused there though `from_pretrained` would take it.
The third hook lets the names in `MASK_FREE` through that check; upstream, the check would accept
any registered name (`AttentionInterface`'s global mapping).

transformers' pool holds the model's dtype (`PagedAttentionCache(dtype=model.dtype)`: "for now,
activation and cache are the same"). An e4m3 set's attention asks for an e4m3 pool (`pool_dtype`):
the fourth hook passes that dtype to the cache, whose allocators then view the byte pool as e4m3
pages; frostc's plans append into them and read them with their scales (transformers' own write
and read of the pool are never called for frostc's attention).

One more hook fixes a bug of transformers 5.23 that any attention meets under async batching
(found by bench/serve_http.py's soak, 2026-12-06: the server's generation loop died after 136 s of
streamed requests with cancellations): `Scheduler.clear_cancelled_requests` frees a cancelled
request's blocks but leaves its state PREFILLING or DECODING, so a step already in flight that
holds it reaches `update_batch`, which skips only FINISHED and PENDING states in async mode and
calls `cache.mark_complete_blocks` on the freed request: KeyError, and the loop stops for every
request. The hook marks cancelled states FINISHED as they are cleared (the upstream fix is that
one line in `clear_cancelled_requests`). The same hook drops a cleared request's result handler
from the output router: `register_result_handler` removes a handler only when its request
finishes, which a cancelled one never does, so `transformers serve` kept one closure (and its
stream's queue) per client disconnect (850 after the soak's 5 minutes).

Naming frostc's attention "...flash..." is not the way: `set_attn_implementation` sends a flash
name that is not FlashAttention 2/3/4 to the Hugging Face Hub kernel loader, which fails for a
name that is not a Hub repository. So frostc registers "frostc_cb" and, here, makes the two checks
also accept the names in `MASK_FREE`. The upstreamable change is the same predicate in
transformers: "mask-free" = any registered attention but "sdpa" and "paged|eager" (the complement
of `attn_mask_is_needed`), or a flag the registration declares (docs/serving.md).
"""

from __future__ import annotations

import functools

MASK_FREE: set[str] = set()  # attention names continuous batching treats as mask-free (flash-like)
POOL_DTYPES: dict[str, object] = {}  # attention name -> the dtype its pool holds, where not the model's
_PATCHED = False


def allow(name: str) -> None:
    """Make transformers' continuous batching accept `name` as a mask-free attention (idempotent)."""
    MASK_FREE.add(name)
    _patch()


def pool_dtype(name: str, dtype) -> None:
    """Have transformers allocate the pool of a model on attention `name` in `dtype` (torch's
    float8_e4m3fn for an e4m3 set); None: the model's dtype again."""
    if dtype is None:
        POOL_DTYPES.pop(name, None)
    else:
        POOL_DTYPES[name] = dtype
    _patch()


def _patch() -> None:
    global _PATCHED
    if _PATCHED:
        return
    from transformers.generation.continuous_batching import cache, continuous_api, initialization

    manager = continuous_api.ContinuousBatchingManager
    manager.switch_to_cb_friendly_attn = _keep_mask_free(manager.switch_to_cb_friendly_attn)
    for module in (initialization, cache):  # the defaults for graphs and async batching; the memory plan
        module.is_flash_attention_requested = _or_mask_free(module.is_flash_attention_requested)
    cache.PagedAttentionCache.__init__ = _in_pool_dtype(cache.PagedAttentionCache.__init__)
    from transformers.generation.continuous_batching import scheduler

    scheduler.Scheduler.clear_cancelled_requests = _finishing_cancelled(scheduler.Scheduler.clear_cancelled_requests)
    processor = continuous_api.ContinuousBatchProcessor
    processor.__init__ = _scheduler_knows_router(processor.__init__)
    try:  # `transformers serve`: its module imports without the serving extras; they are needed to run it
        from transformers.cli.serving import model_manager
    except ImportError:
        model_manager = None
    if model_manager is not None:
        model_manager.ModelManager._validate_args = _serve_accepts_mask_free(model_manager.ModelManager._validate_args)
    _PATCHED = True


def _keep_mask_free(switch):
    """A model on a mask-free name stays on it: never refused, never switched to FlashAttention."""

    @functools.wraps(switch)
    def switch_to_cb_friendly_attn(self, model, auto_switch_to_flash: bool = True) -> None:
        if model.config._attn_implementation in MASK_FREE:
            return
        switch(self, model, auto_switch_to_flash)

    return switch_to_cb_friendly_attn


def _or_mask_free(is_flash):
    """`is_flash_attention_requested`, true also for a mask-free name when no FlashAttention version
    is asked about (the decode fast path asks for versions 2 and 3: it stays off)."""

    @functools.wraps(is_flash)
    def is_flash_attention_requested(config=None, requested_attention_implementation=None, version=None) -> bool:
        name = config._attn_implementation if config is not None else requested_attention_implementation
        if version is None and name in MASK_FREE:
            return True
        return is_flash(config, requested_attention_implementation, version)

    return is_flash_attention_requested


def _in_pool_dtype(init):
    """`PagedAttentionCache(..., dtype=)`, with the pool's dtype for an attention in `POOL_DTYPES`.
    transformers uses that one dtype for its allocators' pages, its bytes per block (so
    `num_blocks` counts blocks of the pool's dtype) and its estimate of activation memory (only
    where it infers num_blocks or max_batch_tokens, which frostc's sets fix)."""

    @functools.wraps(init)
    def __init__(self, config, *args, **kwargs) -> None:
        dtype = POOL_DTYPES.get(getattr(config, "_attn_implementation", None))
        if dtype is not None:
            kwargs["dtype"] = dtype
        init(self, config, *args, **kwargs)

    return __init__


def _finishing_cancelled(clear):
    """`clear_cancelled_requests`, its states marked FINISHED: a step in flight skips them."""

    @functools.wraps(clear)
    def clear_cancelled_requests(self):
        from transformers.generation.continuous_batching.requests import RequestStatus

        states = clear(self)
        for state in states:
            state.status = RequestStatus.FINISHED
        router = getattr(self, "frostc_output_router", None)
        if router is not None and states:  # no output reaches a FINISHED state: its handler is done
            with router._lock:
                for state in states:
                    router.result_handlers.pop(state.request_id, None)
        return states

    return clear_cancelled_requests


def _scheduler_knows_router(init):
    """The batch processor's `__init__`, its scheduler given the output router (for the hook above)."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self.scheduler.frostc_output_router = self.output_router

    return __init__


def _serve_accepts_mask_free(validate):
    """`transformers serve`'s argument check, passing a mask-free name's attention (the others as
    before: quantization and every other name still go through it)."""

    @functools.wraps(validate)
    def _validate_args(self) -> None:
        name = self.attn_implementation
        if name not in MASK_FREE:
            return validate(self)
        self.attn_implementation = None  # checked as if none were given; it is registered
        try:
            validate(self)
        finally:
            self.attn_implementation = name

    return _validate_args
