"""frost_vllm's launch path on the GPU, on tensors shaped exactly as vLLM 0.32 hands them (vLLM
itself does not fit the GPU machine; its classes are tested on the CPU in tests/vllm_backend/):

- the per-layer cache (blocks, hkv, page_size, 2d) with vLLM's NHD or HND strides, K and V its
  halves, an fp8 cache as uint8 with 0-dim scales (vLLM's checkpoints) or one per KV head;
- q, k and v as views of one fused QKV projection (vLLM's `qkv.split`), rows padded past the
  step's tokens (a CUDA-graph capture size), `output` a view of a (tokens, hq * d) buffer;
- `query_start_loc` and `seq_lens` int32 with vLLM's padding requests (no tokens, length 0, a
  block-table row of the null block 0), `block_table_tensor` int32 of max_model_len / block_size
  columns, `slot_mapping` int64 with -1 for the padding tokens.

Each step: the metadata through StepBuffers (the builder's work), then each layer kind through its
LayerLauncher (the impl's). Checked: the caches bitwise (the step's rows at their slots, quantized
for e4m3, nothing else touched), every query row against float64 over the keys read back
through the block table, every padding row of the output still NaN. Then one CUDA graph of the
layer calls, captured once, replayed over fresh mixes whose metadata the builder copies in.
"""

from __future__ import annotations

import math
import random
import zlib

import pytest

from tests.gpu.decode_support import FP8_NAN, as_bits, quantize
from tests.gpu.support import TOLERANCE, allowed_keys, gpu_skip_reason
from tests.vllm_sets import CASES, MAX_MODEL_LEN, MAX_NUM_SEQS, PAGE_SIZE, PAGES

torch = pytest.importorskip("torch")


def _skip_reason() -> str | None:
    reason = gpu_skip_reason()
    if reason is not None and not reason.startswith("no built plans"):
        return reason
    missing = [c.path.name for c in CASES if not c.path.exists()]
    if missing:
        return f"no vLLM plan sets {missing}: run `python -m tests.vllm_sets` on the build machine first"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")]
MIXES = ("decode", "speculative", "prefill", "chunk", "mixed", "padded")
GRAPH_MIXES = 30
SCALES = (0.03, 0.05)  # k and v: vLLM's 0-dim _k_scale, _v_scale (per head: these, rising 10 % a head)


class VllmStep:
    """One layer per kind of a vLLM set, its cache, and the step tensors vLLM would pass."""

    def __init__(self, case, seed: int):
        from frost_vllm.launch import LayerLauncher
        from frost_vllm.plans import read_vllm_set
        from frost_vllm.step import StepBuffers

        self.case, self.set = case, read_vllm_set(str(case.path))
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.rng = random.Random(seed)
        self.launchers = [LayerLauncher(self.set, k) for k in self.set.kinds]
        # gpt-oss's attention sinks, one float32 logit per query head (large: they move every row)
        self.sinks = [torch.randn(k.heads, device="cuda", generator=self.gen) + 1.0 if k.sinks else None
                      for k in self.set.kinds]  # fmt: skip
        self.builder = StepBuffers(self.set, "cuda")
        self.quantized = self.set.scale_grain is not None
        self.scales = [self._scale(x) for x in SCALES] if self.quantized else [None, None]
        self.caches = [self._new_cache() for _ in self.launchers]
        kind = self.set.kinds[0]
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[kind.dtype]

    def _scale(self, value: float):
        """vLLM's scale: 0-dim, or (hkv,) for a set built with per-head scales."""
        if self.set.scale_grain == "tensor":
            return torch.tensor(value, device="cuda")
        return value * (1 + 0.1 * torch.arange(self.set.kv_heads, device="cuda", dtype=torch.float32))

    def _new_cache(self):
        s = self.set
        physical = (PAGES, PAGE_SIZE, s.kv_heads, 2 * s.head_dim) if s.layout == "nhd" else (
            PAGES, s.kv_heads, PAGE_SIZE, 2 * s.head_dim)  # fmt: skip
        dtype = torch.uint8 if self.quantized else torch.bfloat16
        storage = torch.empty(physical, dtype=dtype, device="cuda")
        return storage.permute(0, 2, 1, 3) if s.layout == "nhd" else storage  # (blocks, hkv, page, 2d)

    # ------------------------------------------------------------------ a mix, as vLLM builds it

    def draw(self, mix: str, rows: int | None = None) -> None:
        """Each request's (new tokens, context before them), vLLM's padding, and fresh tensors."""
        rng, most, ctx = self.rng, 64, 150  # 8 sequences of 150 + 4 keys fit the pool's 95 pages
        if mix == "decode":
            lens = [(1, rng.randint(0, ctx)) for _ in range(rng.randint(1, MAX_NUM_SEQS))]
        elif mix == "speculative":
            lens = [(4, rng.randint(0, ctx)) for _ in range(rng.randint(1, MAX_NUM_SEQS))]
        elif mix == "prefill":
            lens = [(rng.randint(1, 30), 0) for _ in range(2)]
        elif mix == "chunk":
            lens = [(rng.randint(17, 60), rng.randint(100, 400))]
        else:  # a chunk among decodes, or the same with vLLM's padding requests and tokens
            lens = [(rng.randint(5, 40), rng.randint(0, ctx))] + [(1, rng.randint(1, ctx)) for _ in range(5)]
        self.lens = lens[:MAX_NUM_SEQS]
        tokens = sum(n for n, _ in self.lens)
        assert tokens <= most
        self.tokens = tokens
        self.padding_requests = 2 if mix == "padded" and len(self.lens) <= MAX_NUM_SEQS - 2 else 0
        if rows is None:  # vLLM pads a step to a capture size (a bucket), or runs it as it is
            rows = self.set.bucket(tokens + 1).tokens if mix == "padded" else tokens
        self.rows = rows
        self._tensors()

    def _tensors(self) -> None:
        s, gen, n_real = self.set, self.gen, len(self.lens)
        n = n_real + self.padding_requests
        widths = MAX_MODEL_LEN // PAGE_SIZE
        free = list(range(1, PAGES))  # block 0 is vLLM's null block
        self.rng.shuffle(free)
        table = torch.zeros(n, widths, dtype=torch.int32)
        slots, starts = [], [0]
        for i, (q_len, ctx) in enumerate(self.lens):
            length = ctx + q_len
            for j in range(-(-length // PAGE_SIZE)):
                table[i, j] = free.pop()
            slots += [int(table[i, p // PAGE_SIZE]) * PAGE_SIZE + p % PAGE_SIZE for p in range(ctx, length)]
            starts.append(starts[-1] + q_len)
        starts += [starts[-1]] * self.padding_requests
        slots += [-1] * (self.rows - self.tokens)  # vLLM's padding tokens
        self.block_table = table.cuda()
        self.query_start_loc = torch.tensor(starts, dtype=torch.int32, device="cuda")
        self.seq_lens = torch.tensor([c + q for q, c in self.lens] + [0] * self.padding_requests,
                                     dtype=torch.int32, device="cuda")  # fmt: skip
        self.slot_mapping = torch.tensor(slots, dtype=torch.int64, device="cuda")
        kind = s.kinds[0]
        width = (kind.heads + 2 * kind.kv_heads) * kind.head_dim
        self.qkv = [torch.randn(self.rows, width, device="cuda", dtype=self.dtype, generator=gen)
                    for _ in self.launchers]  # fmt: skip
        self.outputs = [torch.full((self.rows, kind.heads * kind.head_dim), float("nan"), device="cuda",
                                   dtype=self.dtype) for _ in self.launchers]  # fmt: skip
        for cache in self.caches:
            self._fill_cache(cache)
        self.before = [cache.clone() for cache in self.caches]

    def _fill_cache(self, cache) -> None:
        """Random rows where a sequence has context, NaN everywhere else."""
        d = self.set.head_dim
        if self.quantized:
            as_bits(cache).fill_(FP8_NAN)
            real = torch.randn(cache.shape, device="cuda", generator=self.gen)
            by_head = real.transpose(1, 2)  # (blocks, page, hkv, 2d): quantize scales the last two dims
            k, v = (quantize(by_head[..., half], scale.reshape(-1))
                    for half, scale in ((slice(0, d), self.scales[0]), (slice(d, 2 * d), self.scales[1])))  # fmt: skip
            fresh = torch.cat([k, v], -1).transpose(1, 2).view(torch.uint8)
        else:
            cache.fill_(float("nan"))
            fresh = torch.randn(cache.shape, device="cuda", dtype=cache.dtype, generator=self.gen)
        positions = [(i, p) for i, (_, ctx) in enumerate(self.lens) for p in range(ctx)]
        if positions:
            seqs, where = torch.tensor(positions, device="cuda").unbind(1)
            blocks = self.block_table[seqs, where // PAGE_SIZE].long()
            rows = where % PAGE_SIZE
            cache[blocks, :, rows] = fresh[blocks, :, rows]

    def views(self, i: int):
        """Layer i's q, k, v as vLLM passes them: views of its fused QKV rows."""
        kind = self.set.kinds[i]
        hq, hkv, d = kind.heads, kind.kv_heads, kind.head_dim
        q, k, v = self.qkv[i].split([hq * d, hkv * d, hkv * d], dim=-1)
        return q.view(-1, hq, d), k.view(-1, hkv, d), v.view(-1, hkv, d)

    def prepare(self):
        """The builder's work; vLLM's num_actual_tokens is the padded token count (its runner)."""
        n = len(self.lens) + self.padding_requests
        return self.builder.prepare(self.query_start_loc, self.seq_lens, self.block_table, self.slot_mapping,
                                    n, self.rows)  # fmt: skip

    def run_layers(self, step) -> None:
        for i, launcher in enumerate(self.launchers):
            q, k, v = self.views(i)
            output = self.outputs[i].view(self.rows, *q.shape[1:])
            launcher.run(q, k, v, self.caches[i], step, output, *self.scales, sinks=self.sinks[i])

    # ------------------------------------------------------------------ the checks

    def assert_correct(self) -> None:
        for i in range(len(self.launchers)):
            self._assert_cache(i)
            self._assert_output(i)

    def _assert_cache(self, i: int) -> None:
        """The cache as before, but for the step's rows at their slots (quantized for e4m3)."""
        expected = self.before[i].clone()
        _, k, v = self.views(i)
        d = self.set.head_dim
        slots = self.slot_mapping[: self.tokens].tolist()
        for t, slot in enumerate(slots):
            block, row = divmod(slot, PAGE_SIZE)
            for half, new, scale in ((slice(0, d), k[t], self.scales[0]), (slice(d, 2 * d), v[t], self.scales[1])):
                value = quantize(new[None], scale.reshape(-1))[0].view(torch.uint8) if self.quantized else new
                expected[block, :, row, half] = value
        wrong = (as_bits(self.caches[i]) != as_bits(expected)).sum().item()
        assert wrong == 0, f"layer kind {i}: {wrong} cache elements differ from the expected ({self._where()})"

    def _keys(self, i: int, seq: int):
        """Sequence seq's K and V (hkv, length, d) float64, read back through the block table."""
        q_len, ctx = self.lens[seq]
        length, d = ctx + q_len, self.set.head_dim
        cache = self.caches[i].view(torch.float8_e4m3fn) if self.quantized else self.caches[i]
        blocks = self.block_table[seq, : -(-length // PAGE_SIZE)].long()
        rows = cache[blocks].transpose(1, 2).reshape(-1, self.set.kv_heads, 2 * d)[:length].double()
        k, v = rows[..., :d], rows[..., d:]
        if self.quantized:
            k, v = (x * scale.double().reshape(1, -1, 1) for x, scale in zip((k, v), self.scales))
        return k.transpose(0, 1), v.transpose(0, 1)

    def _assert_output(self, i: int) -> None:
        kind = self.set.kinds[i]
        rel_tol, abs_tol, _ = TOLERANCE[kind.dtype]
        q_all, _, _ = self.views(i)
        out = self.outputs[i].view(self.rows, kind.heads, kind.head_dim)
        mask = {"causal": True, "alignment": "bottom_right", "window_left": kind.window_left}
        err_sq = ref_sq = worst = 0.0
        start = 0
        for seq, (q_len, ctx) in enumerate(self.lens):
            rows = slice(start, start + q_len)
            start += q_len
            k, v = self._keys(i, seq)
            q = q_all[rows].transpose(0, 1).double()
            group = kind.heads // kind.kv_heads
            s = torch.einsum("hqd,hkd->hqk", q, k.repeat_interleave(group, 0)) * kind.scale
            if kind.softcap:
                s = kind.softcap * torch.tanh(s / kind.softcap)
            s = s.masked_fill(~allowed_keys(mask, q_len, ctx + q_len), float("-inf"))
            if self.sinks[i] is not None:  # a column of each head's sink joins the softmax, then goes
                sink = self.sinks[i].double().view(-1, 1, 1).expand(-1, q_len, 1)
                p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
            else:
                p = torch.softmax(s, -1).nan_to_num(0.0)
            ref = p @ v.repeat_interleave(group, 0)
            got = out[rows].transpose(0, 1).double()
            assert not torch.isnan(got).any(), f"kind {i}, sequence {seq}: NaN in the output ({self._where()})"
            diff = got - ref
            err_sq += float((diff * diff).sum())
            ref_sq += float((ref * ref).sum())
            worst = max(worst, float(diff.abs().max()))
        rel = math.sqrt(err_sq / ref_sq) if ref_sq else math.sqrt(err_sq)
        assert rel < rel_tol and worst < abs_tol, f"kind {i}: relative {rel:.2e}, max abs {worst:.2e} ({self._where()})"
        padding = out[self.tokens :]
        assert bool(torch.isnan(padding).all()), f"kind {i}: padding rows of the output were written ({self._where()})"

    def _where(self) -> str:
        padding = f"{self.padding_requests} padding requests"
        return f"{self.case.name}: (new, context) {self.lens}, {self.rows} rows, {padding}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("mix", MIXES)
def test_a_vllm_step(case, mix) -> None:
    world = VllmStep(case, seed=zlib.crc32(f"{case.name}-{mix}".encode()))
    world.draw(mix)
    world.run_layers(world.prepare())
    torch.cuda.synchronize()
    world.assert_correct()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_one_cuda_graph_replays_fresh_mixes(case) -> None:
    """vLLM's full CUDA graphs: the layer calls captured once for the 64-token bucket; each step
    the builder copies fresh metadata into its buffers (outside the graph) and the graph replays."""
    world = VllmStep(case, seed=7)
    world.draw("mixed", rows=64)
    world.run_layers(world.prepare())  # loads the plans, allocates staging: outside the capture
    torch.cuda.synchronize()
    qkv, outputs = world.qkv, world.outputs  # what the graph holds: vLLM's static buffers
    step = world.prepare()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        world.run_layers(step)
    for _ in range(GRAPH_MIXES):
        world.draw(world.rng.choice(("decode", "chunk", "mixed", "padded")), rows=64)
        for old, new in zip(qkv + outputs, world.qkv + world.outputs):
            old.copy_(new)
        world.qkv, world.outputs = qkv, outputs
        again = world.prepare()  # the builder: fresh metadata copied into the same buffers
        assert again.cu_q.data_ptr() == step.cu_q.data_ptr() and again.bucket == step.bucket
        graph.replay()
        torch.cuda.synchronize()
        world.assert_correct()
