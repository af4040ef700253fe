"""`DecodeGraph`: greedy decoding whose whole decode step (the model's forward through the backend)
is one CUDA graph, captured at the first step and replayed after, optionally through torch.compile."""

from __future__ import annotations

import types

import torch

from frost_runtime.hf.backend import FrostcAttention


class RecompileLimitError(RuntimeError):
    """A compiled DecodeGraph's step would recompile past torch._dynamo's recompile limit (and so
    run uncompiled): refused, not slowed in silence."""


class DecodeGraph:
    """Greedy decoding whose whole decode step (the model's forward: every layer, every frostc
    plan) runs as one CUDA graph, captured at the first step and replayed after.

        graph = DecodeGraph(model, backend, batch=8)
        tokens = graph.prefill(input_ids, attention_mask)   # eager; left-padded prompts
        for _ in range(n):
            tokens = graph.step(tokens)                      # one replay per step

    The step's inputs live in static buffers: the new tokens, their positions, and a 2-D mask of
    the cache's width whose row b holds ones on its first `length[b]` columns (the backend reads
    each row's count from it on the device). Nothing in the step depends on a host-side length,
    so one capture serves every later step of every generation of this batch size. A replay
    runs no Python: `backend.calls` counts only the eager and capturing runs (not compiled ones).

    `compile_model=True` runs the step's forward through `torch.compile` (inductor fuses the
    model's own elementwise work — norms, rotary, activations, residuals — around frostc's ops,
    which compile as they are) before the capture: a compile on the serving machine at the first
    step, which the plans themselves never need. One compile per graph: a step's host state is
    the same at every step and every generation (see `_hold_cache`), and each graph compiles a
    step function with a code object of its own, where dynamo keeps the graph's compiled entries
    and counts its recompiles (compiling the model itself would count every graph's, at every
    batch size, against the limit of the model's one forward code, then run it uncompiled). A
    step that would recompile past dynamo's limit raises RecompileLimitError, not a silent eager step.
    """

    def __init__(self, model, backend: FrostcAttention, batch: int, *, compile_model: bool = False):
        self.model, self.backend, self.batch = model, backend, batch
        self.compiled = torch.compile(_own_code(_step), dynamic=False) if compile_model else None
        device, width = backend.device, backend.plans.serving.max_cache_len
        self.ids = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.mask = torch.zeros(batch, width, dtype=torch.int64, device=device)
        self.length = torch.zeros(batch, dtype=torch.int64, device=device)
        self.cache = backend.new_cache()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.tokens = 0  # the most tokens a row holds (host-known: the prompts' width + steps)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Run the prompts (eager, through the set's prefill plans); the first new tokens, (b,)."""
        if input_ids.shape[0] != self.batch:
            raise ValueError(f"{input_ids.shape[0]} prompts: this graph decodes batches of {self.batch}")
        self.cache = self.backend.new_cache()
        position = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position, past_key_values=self.cache
        )
        self.length.copy_(attention_mask.sum(-1))
        self.tokens = input_ids.shape[1]
        columns = torch.arange(self.mask.shape[1], device=self.mask.device)
        self.mask.copy_((columns[None, :] < self.length[:, None]).to(self.mask.dtype))
        return out.logits[:, -1].argmax(-1)

    reset = prefill

    def step(self, tokens: torch.Tensor, *, capture: bool = True) -> torch.Tensor:
        """Feed `tokens` (b,) and return the next ones; `capture=False` runs the step eagerly.
        Refused (ValueError) once a row could outgrow the set's cache: a replay checks nothing."""
        width = self.mask.shape[1]
        if self.tokens + 1 > width:
            raise ValueError(
                f"step {self.tokens + 1 - width} past the plan set's cache of {width} tokens per sequence "
                "(--max-cache-len): stop here, or build the set with a longer cache"
            )
        self.tokens += 1
        self.ids.copy_(tokens.view(-1, 1))
        self.position.copy_(self.length.view(-1, 1))
        self.mask.scatter_(1, self.length.view(-1, 1), 1)
        self.length += 1
        if not capture:
            return self._forward()[:, -1].argmax(-1)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.logits[:, -1].argmax(-1)

    def _hold_cache(self) -> None:
        """Present the cache to the step as wide as its mask (as HF's static cache does: its mask
        sizes are its whole length): every layer has seen `width - 1` tokens before the step's
        append, at every step. The rows' lengths are the mask's, on the device; a host count that
        grew by one a step would be a Python int torch.compile specializes on: a compile a step."""
        held = self.mask.shape[1] - 1
        for layer in self.cache.layers:
            layer.seen = held

    def _forward(self) -> torch.Tensor:
        self._hold_cache()  # before every forward: a capture runs two (the warm-up, then the captured one)
        inputs = (self.model, self.ids, self.mask, self.position, self.cache)
        if self.compiled is None:
            return _step(*inputs)
        if not hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
            return self.compiled(*inputs)
        try:
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                return self.compiled(*inputs)
        except torch._dynamo.exc.FailOnRecompileLimitHit as exc:
            limit = torch._dynamo.config.recompile_limit
            raise RecompileLimitError(
                f"DecodeGraph(batch={self.batch}, compile_model=True): this graph's step would recompile past "
                f"torch._dynamo's recompile limit (torch._dynamo.config.recompile_limit = {limit}) and run "
                "uncompiled. Something the step reads changed between steps (the model's attention "
                "implementation or config, say): TORCH_LOGS=recompiles lists the guards that failed; or use "
                "compile_model=False"
            ) from exc

    def _capture(self) -> None:
        """Warm up on a side stream (the step's writes are idempotent: the same K/V rows again),
        then capture one step."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._forward()


def _step(model, ids, mask, position, cache) -> torch.Tensor:
    """A decode step's forward: the logits of `ids` (b, 1) at `position` over `cache`."""
    return model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache).logits


def _own_code(fn):
    """`fn` with a copy of its code object: dynamo keeps compiled entries, and counts a frame's
    recompiles against its limit, per code object; the copy's are its own (and go with it)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
