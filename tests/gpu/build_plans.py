"""Build the plans the GPU tests need into tests/.built (ignored by git; carried to the GPU).

    python -m tests.gpu.build_plans

Runs on the CPU machine: compiling needs the CuTe DSL, which the GPU machine does not have.
"""

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from frostc import GraphBuilder
from frostc.build import build
from frostc.planfile import write_atomic
from tests.gpu.cases import TWO_NODES, Case, cases

BUILT = Path(__file__).resolve().parent.parent / ".built"


def description(case: Case, g: GraphBuilder | None = None, prefix: str = ""):
    """The case's description; or its tensors and node added to `g`, named with `prefix`."""
    alone = g is None
    g = g if g is not None else GraphBuilder(case.id)
    tensor = lambda name, **kw: g.tensor(prefix + name, **kw)  # noqa: E731
    b, hq, hkv, d = case.batch, case.heads_q, case.heads_kv, case.head_dim
    lengths = {}
    if case.form == "packed":
        for name, dims in (("q", (case.tokens_q, hq, d)), ("k", (case.tokens_kv, hkv, d)),
                           ("v", (case.tokens_kv, hkv, d)), ("o", (case.tokens_q, hq, d))):  # fmt: skip
            tensor(name, dtype=case.dtype, dims=dims)
        if case.lse:
            tensor("lse", dtype="fp32", dims=(case.tokens_q, hq), layout="ht")  # FlashAttention's (h, t)
        tensor("q_lengths", dtype="int32", dims=(b + 1,))
        tensor("kv_lengths", dtype="int32", dims=(b + 1,))
        lengths = dict(
            cu_seqlens_q=prefix + "q_lengths",
            cu_seqlens_kv=prefix + "kv_lengths",
            max_seqlen_q=case.seq_q,
            max_seqlen_kv=case.seq_kv,
        )
    else:
        rows = {"q": (hq, case.seq_q), "k": (hkv, case.seq_kv), "v": (hkv, case.seq_kv), "o": (hq, case.seq_q)}
        for name, (h, s) in rows.items():
            tensor(name, dtype=case.dtype, dims=(b, h, s, d), layout=case.layout)
        if case.lse:
            tensor("lse", dtype="fp32", dims=(b, hq, case.seq_q))
        if case.form == "padded":
            for side in {"qkv": ("q", "kv"), "q": ("q",), "kv": ("kv",)}[case.lengths]:
                tensor(f"{side}_lengths", dtype="int32", dims=(b,))
                lengths[f"seq_len_{side}"] = f"{prefix}{side}_lengths"
    g.sdpa(
        name=f"{prefix}attn" if prefix else None,
        q=prefix + "q",
        k=prefix + "k",
        v=prefix + "v",
        o=prefix + "o",
        lse=prefix + "lse" if case.lse else None,
        causal=case.causal or None,
        diagonal_alignment=None if case.alignment == "top_left" else case.alignment,
        window_left=case.window_left,
        window_right=case.window_right,
        softcap=case.softcap,
        **lengths,
    )
    return g.build() if alone else g


def main() -> int:
    BUILT.mkdir(exist_ok=True)
    manifest = []
    start = time.time()
    all_cases = cases()
    for i, case in enumerate(all_cases):
        path = BUILT / f"{case.id}.frost"
        write_atomic(path, build(description(case)))
        manifest.append(asdict(case) | {"plan": path.name})
        print(f"[{i + 1}/{len(all_cases)}] {case.id}  ({time.time() - start:.0f} s)", flush=True)
    write_atomic(BUILT / "manifest.json", json.dumps(manifest, indent=1).encode())
    g = GraphBuilder("two-nodes")
    for prefix, case in zip(("a_", "b_"), TWO_NODES):
        description(case, g, prefix)
    write_atomic(BUILT / "two-nodes.frost", build(g.build()))
    print("two-nodes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
