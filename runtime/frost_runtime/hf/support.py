"""What a plan set serves, and the checks of a model and of its calls against it: each layer's
attention (its kind: heads, KV heads, head dim, dtype, scale, window, softcap) and the deployment's
capacities (sequences in the pools, tokens per sequence). A mismatch would be a wrong answer, so it
is refused with a `ValueError` naming the field and the fix, before anything launches."""

from __future__ import annotations

import math

import torch

from frost_runtime import dtypes
from frost_runtime import sinks as frost_sinks
from frost_runtime.planset import KindInfo, PlanSet


def kinds_by_layer(plans: PlanSet) -> dict[int, KindInfo]:
    """The set's layer kinds, by the layers they serve."""
    return {layer: info for info in plans.kind_info.values() for layer in info.layers}


def check_model(plans: PlanSet, kinds: dict[int, KindInfo], model) -> None:
    """The model's layers are the set's (a set built from another config is refused at install)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = getattr(config, "num_hidden_layers", None)
    if layers is not None and set(range(layers)) != set(kinds):
        raise ValueError(
            f"plan set {plans.header.name!r} serves layers {sorted(kinds)}, the "
            f"model has {layers}: build the set from this model's config"
        )


def check_call(
    plans: PlanSet,
    info: KindInfo,
    query: torch.Tensor,
    key: torch.Tensor,
    scaling,
    sliding_window,
    softcap,
    sinks: torch.Tensor | None = None,
) -> None:
    """A call whose attention is not the kind's would be a wrong answer: refused, naming it.
    `sinks`: what the model passes as `s_aux` (gpt-oss: one logit per query head)."""
    _, hq, _, d = query.shape
    scale = scaling if scaling is not None else 1 / math.sqrt(d)
    window = None if sliding_window is None else sliding_window - 1  # HF's window counts the query's key
    if window is not None and info.window_left is None and window >= plans.serving.max_cache_len - 1:
        window = None  # as long as the cache: masks nothing (the set dropped it)
    problems = [
        f"{what}: the model passes {got}, the set was built for {want}"
        for what, got, want in (
            ("heads", hq, info.heads),
            ("KV heads", key.shape[1], info.kv_heads),
            ("head dim", d, info.head_dim),
            ("dtype", dtypes.from_torch(query.dtype) or str(query.dtype), info.dtype),
            ("window_left", window, info.window_left),
            ("softcap", softcap or None, info.softcap),
        )
        if got != want
    ]
    differs = frost_sinks.mismatch(sinks is not None, info.sinks)
    if differs:
        problems.append(differs)
    elif sinks is not None and tuple(sinks.shape) != (hq,):
        problems.append(f"sinks: the model passes shape {tuple(sinks.shape)}, one per query head is ({hq},)")
    if not math.isclose(scale, info.scale, rel_tol=1e-6):
        problems.append(f"scale: the model passes {scale:.8g}, the set was built for {info.scale:.8g}")
    if problems:
        raise ValueError(
            f"layer kind {info.kind} of plan set {plans.header.name!r}: "
            + "; ".join(problems)
            + ": build the set from this model's config (frostc from-config)"
        )


def check_capacity(plans: PlanSet, max_sequences: int, batch: int, tokens: int) -> None:
    """`batch` sequences of `tokens` (this step's included) fit the set's pools and cache."""
    serving = plans.serving
    if batch > max_sequences:
        raise ValueError(
            f"batch {batch}: the plan set's pools hold {max_sequences} sequences of "
            f"{serving.max_cache_len} tokens ({serving.pages} pages); build the set with more "
            "--pages or a shorter --max-cache-len"
        )
    if tokens > serving.max_cache_len:
        raise ValueError(
            f"{tokens} tokens per sequence: over the plan set's cache of {serving.max_cache_len} "
            "(--max-cache-len); stop generating earlier or build the set with a longer cache"
        )
