"""A GPU probe of transformers' continuous batching through frostc (issue 42), the one that found the
CUDA-graph fault (docs/serving.md, "CUDA graphs"):

    PYTHONPATH=runtime:. python bench/cb_graphs_probe.py FAMILY MODE EXECUTOR
    # FAMILY: llama | qwen2 | mistral | gemma2; MODE: 0 (plain), a (async), g (graphs), ga;
    # EXECUTOR: plans (tests/.built/cb, `python -m tests.gpu.build_plans --only cb`) | ref

It prints how many of 32 requests give the peer's tokens and what served the calls; in MODE 0 also,
for the first 12 calls, the executor's output against the fp32 reference over the same pages and
whether the step's rows landed on transformers' write rows. After the fix (a step never shared across
a capture's edge, continuous.py), MODE g and ga gave 29 of 32, as MODE 0 did (H100, 2026-12-05)."""

# ruff: noqa: E401, E701, E702
import sys

import frost_runtime
import torch
from frost_runtime.hf import cb_reference, continuous
from frost_runtime.hf.cb_plans import PlanExecutor

from tests.cb_models import cb_config, cb_model, greedy, peer_tokens, prompts

fam = sys.argv[1]
mode = sys.argv[2]
graphs = "g" in mode
use_ref = sys.argv[3] == "ref"
plans = frost_runtime.read_set(f"tests/.built/cb/tiny-{fam}-cb.frostset")
model = cb_model(fam, device="cuda", dtype=torch.bfloat16)
inputs = prompts(32, 100, seed=0)
expected = peer_tokens(model, fam, inputs, 12)


class Cmp:
    name = "plans"

    def __init__(s):
        s.p = continuous.ReferenceExecutor() if use_ref else PlanExecutor(plans)
        (use_ref or s.p.preload())
        s.max_pages = plans.serving.max_pages
        s.n = 0

    def __call__(s, call):
        out, served = s.p(call)
        if mode == "0" and s.n < 12:
            st = call.step
            ref = cb_reference.attend(
                st, call.q, call.k, call.v, call.k_pages, call.v_pages, call.scale, call.window_left, call.softcap
            )
            err = float((out.float() - ref.float()).norm() / ref.float().norm())
            wrote = float((call.k_rows.index_select(0, call.write_index) - call.k).abs().max())
            print(
                f"call {s.n} layer {call.layer} served {served} rows {st.rows} seqs {st.sequences} "
                f"maxq {st.max_seqlen_q} relerr {err:.3e} append-vs-write_index maxdiff {wrote:.3e} "
                f"cu {st.cu_seqlens_q[:5].tolist()} len {st.seq_len_kv[:4].tolist()} "
                f"table0 {st.page_table[0, :4].tolist()} kpages {tuple(call.k_pages.shape)} {call.k_pages.stride()} "
                f"q {tuple(call.q.shape)} {call.q.stride()} k {call.k.stride()}",
                flush=True,
            )
        s.n += 1
        return out, served


cb = continuous.ContinuousAttention(Cmp()).install(model)
config = cb_config(use_cuda_graph=graphs, use_async_batching="a" in mode)
out = model.generate_batch(inputs, generation_config=greedy(12), continuous_batching_config=config)
same = sum(out[r].generated_tokens == expected[r] for r in expected if r in out)
print(fam, mode, sys.argv[3], f"{same} of {len(expected)} equal", dict(cb.calls), flush=True)
