"""Each layer's attention sinks (gpt-oss) as frostc's plans take them: float32 (hq,), contiguous, on
the device. The models hold them as a parameter in their own dtype (bf16), loaded after the attention
is set up; the backends (frost_runtime.hf, frost_vllm) convert each layer's once here, not per step."""

from __future__ import annotations

import torch


class LayerSinks:
    """Each layer's attention sinks as the plans take them: float32, contiguous, on the device. The
    model's parameter (bf16 in gpt-oss) is converted once per layer and again only after it is
    written (its version counter moves: a weight load), so a step launches no conversion."""

    def __init__(self) -> None:
        self._by_layer: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}

    def of(self, layer: int, sinks: torch.Tensor | None) -> torch.Tensor | None:
        if sinks is None:
            return None
        if torch.compiler.is_compiling():  # dynamo would guard on the version counter: convert in the graph
            return sinks.to(torch.float32).contiguous()
        cached = self._by_layer.get(layer)
        version = sinks._version
        if cached is None or cached[0] is not sinks or cached[1] != version:
            cached = (sinks, version, sinks.detach().to(torch.float32).contiguous())
            self._by_layer[layer] = cached
        return cached[2]


def mismatch(given: bool, built: bool) -> str | None:
    """The problem of a call whose sinks (`given`: the model passes them) are not its kind's (`built`:
    the set's plans take them); None when they agree."""
    if given == built:
        return None
    said = "passes attention sinks (s_aux)" if given else "passes no attention sinks"
    return f"sinks: the model {said}, the set was built {'with' if built else 'without'} them"
