"""HF's cache class for frostc: `FrostcCache` stores no K/V. Its `update` hands this step's K/V
straight to the backend's attention, which appends them to the backend's paged pools; each layer
keeps only the count of tokens it has seen (a host int, known to every serving engine)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from frost_runtime.hf.backend import FrostcAttention


@functools.cache
def cache_class():
    """FrostcCache, defined on first use (transformers is imported only then), once: every cache
    is of one class (torch.compile guards on a cache's type; a class per cache would fail the
    guard at every new cache, and each dead class would leave its compiled entries behind)."""
    from transformers.cache_utils import Cache, CacheLayerMixin

    class FrostcLayer(CacheLayerMixin):
        """Counts the tokens a layer has seen (host ints, known to every serving engine); holds no K/V."""

        is_sliding = False
        is_compileable = False
        is_croppable = False

        def __init__(self, backend: FrostcAttention, layer: int, max_cache_len: int):
            super().__init__()
            self.backend, self.layer, self.max_cache_len, self.seen = backend, layer, max_cache_len, 0

        def lazy_initialization(self, key_states, value_states) -> None:
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            past = self.seen
            self.seen += key_states.shape[-2]
            self.backend.hand_over(self.layer, key_states, past)
            self.is_initialized = True
            return key_states, value_states

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.seen + query_length, 0

        def get_seq_length(self) -> int:
            return self.seen

        def get_max_length(self) -> int:
            return self.max_cache_len

        def reset(self) -> None:
            self.seen = 0

        def reorder_cache(self, beam_idx) -> None:
            raise NotImplementedError("frostc's cache does not reorder (beam search): use num_beams=1")

    class FrostcCache(Cache):
        """A cache whose K/V live in the backend's paged pools (see the module's docstring)."""

        def __init__(self, backend: FrostcAttention, layers: int):
            cap = backend.plans.serving.max_cache_len
            super().__init__(layers=[FrostcLayer(backend, i, cap) for i in range(layers)])

    return FrostcCache
