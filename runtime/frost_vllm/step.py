"""One vLLM step's metadata in the mixed plans' slots (the metadata builder's work): vLLM's
`query_start_loc`, `seq_lens`, `block_table_tensor` and `slot_mapping` copied on the device into
buffers the builder owns, padded to the step's bucket.

Why copies, not vLLM's tensors: a bucket's plan takes exactly its shapes (b + 1 prefix sums, b
lengths, a (b, max_pages) table, `tokens` int32 slots), vLLM's are sliced to the step's padded
request count and its slots are int64; and under full CUDA graphs the plan's launches hold these
pointers, so they must not move between steps. The copies are a few small device kernels per step
and KV-cache group (not per layer), queued on the current stream before the step's graph or
layers, and nothing is read back to the host: the host knows only vLLM's own integers (requests,
tokens).

Padding: sequences past vLLM's requests are empty (their prefix sums repeat the last one, their
lengths are 0: they cost nothing); slots past vLLM's are -1 (not written).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frost_vllm.plans import Bucket, SetError, VllmSet


@dataclass(frozen=True)
class Step:
    """The mixed plans' metadata for one step: views of the builder's buffers sized to `bucket`."""

    bucket: Bucket
    tokens: int  # vLLM's num_actual_tokens: the rows the sequences cover
    cu_q: torch.Tensor  # (b + 1,) int32
    cache_len: torch.Tensor  # (b,) int32: each sequence's keys, this step's included
    page_table: torch.Tensor  # (b, max_pages) int32
    slot_mapping: torch.Tensor  # (tokens of the bucket,) int32, -1 past vLLM's


class StepBuffers:
    """The builder's buffers, sized once for the set's largest bucket; each step fills a prefix."""

    def __init__(self, s: VllmSet, device: torch.device | str):
        b, t = s.max_sequences, s.max_tokens
        i32 = dict(dtype=torch.int32, device=device)
        self.set = s
        self.cu_q = torch.zeros(b + 1, **i32)
        self.cache_len = torch.zeros(b, **i32)
        self.page_table = torch.zeros(b, s.max_pages, **i32)
        self.slot_mapping = torch.full((t,), -1, **i32)

    def prepare(
        self,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
        num_reqs: int,
        num_actual_tokens: int,
    ) -> Step:
        """Fill the bucket of `num_actual_tokens` from vLLM's tensors (device to device)."""
        bucket = self.set.bucket(max(num_actual_tokens, 1))
        n, b = num_reqs, bucket.sequences
        if n > b:
            raise SetError(
                f"a step of {n} requests over {num_actual_tokens} tokens: the set's bucket of {bucket.tokens} "
                f"tokens takes {b} sequences; start vLLM with --max-num-seqs {self.set.max_sequences} or less"
            )
        width = block_table.shape[1]
        if width > self.set.max_pages:
            raise SetError(
                f"vLLM's block table is {width} blocks wide, over the set's {self.set.max_pages} pages a sequence: "
                f"start vLLM with --max-model-len {self.set.max_pages * self.set.page_size} or less"
            )
        cu = self.cu_q[: b + 1]
        cu[: n + 1].copy_(query_start_loc[: n + 1])
        if b > n:  # empty sequences: their prefix sums repeat the step's last
            cu[n + 1 :].copy_(query_start_loc[n : n + 1].expand(b - n))
        lengths = self.cache_len[:b]
        lengths[:n].copy_(seq_lens[:n])
        lengths[n:].zero_()
        table = self.page_table[:b]
        table[:n, :width].copy_(block_table[:n])
        slots = self.slot_mapping[: bucket.tokens]
        given = min(slot_mapping.shape[0], bucket.tokens)
        slots[:given].copy_(slot_mapping[:given])  # int64 to int32: slots are < pages x page_size
        slots[given:].fill_(-1)
        return Step(bucket, num_actual_tokens, cu, lengths, table, slots)
