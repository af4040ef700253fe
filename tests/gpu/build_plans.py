"""Build the plans the GPU tests need into tests/.built (ignored by git; carried to the GPU).

    python -m tests.gpu.build_plans [--only sdpa|decode|append|hf|fp8|mixed|cb|vllm]

Runs on the CPU machine: compiling needs the CuTe DSL, which the GPU machine does not have.
The sdpa plans go to manifest.json (and two-nodes.frost), the paged-KV decode plans of
tests/gpu/decode_cases.py to decode-manifest.json, the ragged appends of
tests/gpu/append_cases.py to append-manifest.json. A decode or append plan that fails to build
is reported by name with its error, the others are still built, and the command exits 1.
"""

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from frostc import GraphBuilder
from frostc.build import build
from frostc.planfile import write_atomic
from tests.gpu.append_cases import AppendCase
from tests.gpu.append_cases import cases as append_cases
from tests.gpu.cases import TWO_NODES, Case, cases
from tests.gpu.decode_cases import DecodeCase
from tests.gpu.decode_cases import cases as decode_cases
from tests.gpu.mixed_cases import MixedCase

BUILT = Path(__file__).resolve().parent.parent / ".built"


def description(case: Case, g: GraphBuilder | None = None, prefix: str = ""):
    """The case's description; or its tensors and node added to `g`, named with `prefix`."""
    alone = g is None
    g = g if g is not None else GraphBuilder(case.id)
    tensor = lambda name, **kw: g.tensor(prefix + name, **kw)  # noqa: E731
    b, hq, hkv, d = case.batch, case.heads_q, case.heads_kv, case.head_dim
    dv = case.head_dim_v or d  # v's and o's
    lengths = {}
    if case.sinks:
        tensor("sinks", dtype="fp32", dims=(hq,))
    if case.form == "packed":
        for name, dims in (("q", (case.tokens_q, hq, d)), ("k", (case.tokens_kv, hkv, d)),
                           ("v", (case.tokens_kv, hkv, dv)), ("o", (case.tokens_q, hq, dv))):  # fmt: skip
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
        rows = {"q": (hq, case.seq_q, d), "k": (hkv, case.seq_kv, d), "v": (hkv, case.seq_kv, dv),
                "o": (hq, case.seq_q, dv)}  # fmt: skip
        for name, (h, s, dims) in rows.items():
            tensor(name, dtype=case.dtype, dims=(b, h, s, dims), layout=case.layout)
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
        debug_tile_visits=case.count_visits or None,
        sinks=prefix + "sinks" if case.sinks else None,
        **lengths,
    )
    return g.build() if alone else g


def decode_description(case: DecodeCase):
    """kv_append then sdpa over the paged caches (or either alone, as the case says)."""
    g = GraphBuilder(case.id)
    b, hq, hkv, d, n = case.batch, case.heads_q, case.heads_kv, case.head_dim, case.s_new
    append, attend = case.nodes in ("both", "append"), case.nodes in ("both", "sdpa")
    if attend:
        g.tensor("q", dtype=case.dtype, dims=(b, hq, n, d), layout=case.layout)
    if append:
        for name in ("k_new", "v_new"):
            g.tensor(name, dtype=case.dtype, dims=(b, hkv, n, d), layout=case.layout)
    for name in ("k_cache", "v_cache"):  # (pages, page_size, hkv, d)
        g.tensor(name, dtype=case.cache or case.dtype, dims=(case.pages, case.page_size, hkv, d))
    scales = {}
    if case.cache is not None:
        scales = dict(k_scale="k_scale", v_scale="v_scale")
        for name in scales:
            g.tensor(name, dtype="fp32", dims=(hkv if case.scales == "head" else 1,))
    g.tensor("page_table", dtype="int32", dims=(b, case.max_pages))
    g.tensor("cache_len", dtype="int32", dims=(b,))
    if case.sinks:
        g.tensor("sinks", dtype="fp32", dims=(hq,))
    if attend:
        g.tensor("o", dtype=case.dtype, dims=(b, hq, n, d), layout=case.layout)
        if case.lse:
            g.tensor("lse", dtype="fp32", dims=(b, hq, n))
    paged = dict(k_cache="k_cache", v_cache="v_cache", page_table="page_table", seq_len_kv="cache_len") | scales
    if append:
        g.node("kv_append", name="append", k="k_new", v="v_new", **paged)
    if attend:
        g.sdpa(name="attn", q="q", k="k_cache", v="v_cache", o="o", lse="lse" if case.lse else None,
               page_table="page_table", seq_len_kv="cache_len", causal=case.causal or None,
               window_left=case.window_left, softcap=case.softcap, sinks="sinks" if case.sinks else None,
               **scales)  # fmt: skip
    return g.build()


def append_description(case: AppendCase):
    """kv_append alone, its new rows (tokens, hkv, d) placed by cu_seqlens_q (packed) or by
    slot_mapping (slots)."""
    g = GraphBuilder(case.id)
    hkv, d, tokens = case.heads_kv, case.head_dim, case.tokens
    # fused: k and v the halves of one (tokens, 2 hkv, d) buffer, a token's rows 2 hkv d apart
    strides = {"strides": (2 * hkv * d, d, 1)} if case.rows == "fused" else {}
    for name in ("k_new", "v_new"):
        g.tensor(name, dtype=case.dtype, dims=(tokens, hkv, d), **strides)
    for name in ("k_cache", "v_cache"):  # (pages, page_size, hkv, d), NHD or HND
        g.tensor(name, dtype=case.cache or case.dtype, dims=(case.pages, case.page_size, hkv, d),
                 layout=case.cache_layout)  # fmt: skip
    keys = dict(k="k_new", v="v_new", k_cache="k_cache", v_cache="v_cache")
    if case.cache is not None:
        for name in ("k_scale", "v_scale"):
            keys[name] = g.tensor(name, dtype="fp32", dims=(hkv if case.scales == "head" else 1,))
    if case.form == "packed":
        keys["page_table"] = g.tensor("page_table", dtype="int32", dims=(case.batch, case.max_pages))
        keys["seq_len_kv"] = g.tensor("cache_len", dtype="int32", dims=(case.batch,))
        keys["cu_seqlens_q"] = g.tensor("cu_q", dtype="int32", dims=(case.batch + 1,))
    else:
        keys["slot_mapping"] = g.tensor("slot_mapping", dtype="int32", dims=(tokens,))
    g.node("kv_append", name="append", **keys)
    return g.build()


def mixed_description(case: MixedCase):
    """sdpa over a paged cache with packed queries (the mixed form)."""
    g = GraphBuilder(case.id)
    t, hq, hkv, d = case.tokens, case.heads_q, case.heads_kv, case.head_dim
    for name in ("q", "o"):
        g.tensor(name, dtype=case.dtype, dims=(t, hq, d))
    if case.lse:
        g.tensor("lse", dtype="fp32", dims=(t, hq), layout="ht" if case.lse == "ht" else None)
    for name, (_, _, strides) in case.cache_views().items():  # engines' layouts by strides
        g.tensor(name, dtype=case.cache or case.dtype, dims=(case.pages, case.page_size, hkv, d), strides=strides)
    scales = {}
    if case.cache is not None:
        scales = dict(k_scale="k_scale", v_scale="v_scale")
        for name in scales:
            g.tensor(name, dtype="fp32", dims=(hkv if case.scales == "head" else 1,))
    g.tensor("page_table", dtype="int32", dims=(case.batch, case.max_pages))
    g.tensor("cache_len", dtype="int32", dims=(case.batch,))
    g.tensor("cu_q", dtype="int32", dims=(case.batch + 1,))
    if case.sinks:
        g.tensor("sinks", dtype="fp32", dims=(hq,))
    if case.append:  # the step's new K/V, packed like q, into the pages first
        for name in ("k_new", "v_new"):
            g.tensor(name, dtype=case.dtype, dims=(t, hkv, d))
        g.node("kv_append", name="append", k="k_new", v="v_new", k_cache="k_cache", v_cache="v_cache",
               page_table="page_table", seq_len_kv="cache_len", cu_seqlens_q="cu_q", **scales)  # fmt: skip
    g.sdpa(name="attn", q="q", k="k_cache", v="v_cache", o="o", lse="lse" if case.lse else None,
           page_table="page_table", seq_len_kv="cache_len", cu_seqlens_q="cu_q", max_seqlen_q=case.max_seqlen_q,
           causal=case.causal or None, window_left=case.window_left, softcap=case.softcap,
           sinks="sinks" if case.sinks else None, **scales)  # fmt: skip
    return g.build()


def build_mixed() -> None:
    """tests/gpu/test_mixed.py's plans, into .built/mixed with their manifest."""
    from tests.gpu.mixed_cases import cases as mixed_cases
    from tests.gpu.mixed_cases import graph_case

    out = BUILT / "mixed"
    out.mkdir(exist_ok=True)
    manifest, start = [], time.time()
    all_cases = [*mixed_cases(), graph_case()]
    for i, case in enumerate(all_cases):
        write_atomic(out / f"{case.id}.frost", build(mixed_description(case)))
        extra = {"plan": f"{case.id}.frost", "pages": case.pages, "capacity": case.capacity}
        manifest.append(asdict(case) | extra)
        print(f"[mixed {i + 1}/{len(all_cases)}] {case.id}  ({time.time() - start:.0f} s)", flush=True)
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=1).encode())


def build_sdpa() -> None:
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


def build_group(group: str, all_cases: list, describe) -> list[tuple[str, str]]:
    """Build every case of a group ("decode": tests/gpu/decode_cases.py, "append":
    append_cases.py) it can, each described by `describe`; returns (case id, error) of those
    that failed. The group's manifest lists the built ones (its tests fail on the missing ones
    by name)."""
    manifest, failed = [], []
    start = time.time()
    for stale in BUILT.glob(f"{group}-*.frost"):  # a plan that no longer builds must not be tested
        stale.unlink()
    for i, case in enumerate(all_cases):
        path = BUILT / f"{case.id}.frost"
        try:
            write_atomic(path, build(describe(case)))
        except Exception as exc:  # reported by name below; the other cases still build
            failed.append((case.id, f"{type(exc).__name__}: {exc}"))
            print(f"[{group} {i + 1}/{len(all_cases)}] {case.id}  FAILED: {type(exc).__name__}: {exc}", flush=True)
            continue
        extra = {"plan": path.name, "pages": case.pages, "capacity": case.capacity}
        manifest.append(asdict(case) | extra)
        size = path.stat().st_size >> 10
        print(f"[{group} {i + 1}/{len(all_cases)}] {case.id}  {size} KiB ({time.time() - start:.0f} s)", flush=True)
    write_atomic(BUILT / f"{group}-manifest.json", json.dumps(manifest, indent=1).encode())
    return failed


def build_fp8() -> None:
    """tests/gpu/test_fp8_dense.py's plans, into .built/fp8 with their manifest."""
    from tests.gpu import fp8_cases

    out = BUILT / "fp8"
    out.mkdir(exist_ok=True)
    manifest, start = [], time.time()
    all_cases = fp8_cases.cases()
    for i, case in enumerate(all_cases):
        write_atomic(out / f"{case.id}.frost", build(fp8_cases.description(case)))
        manifest.append(asdict(case) | {"plan": f"{case.id}.frost"})
        print(f"[fp8 {i + 1}/{len(all_cases)}] {case.id}  ({time.time() - start:.0f} s)", flush=True)
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=1).encode())


def build_set_of_tiny_llama() -> None:
    """tests/gpu/test_planset.py's set: Llama-3-8B, batch sizes 1, 2, 4 (a small cache and pool),
    with its glue plans (tests/gpu/test_glue.py)."""
    from frostc.buildset import build_set
    from frostc.models import read_layers, read_model
    from frostc.serving import deployment
    from tests.model_configs import LLAMA3_8B

    model = read_model(LLAMA3_8B)
    dep = deployment(model, batch_sizes=(1, 2, 4), max_cache_len=1024, pages=256, glue=read_layers(LLAMA3_8B))
    write_atomic(BUILT / "llama3-8b-tiny.frostset", build_set(model, dep, name="llama3-8b-tiny").data)


def build_hf_sets() -> None:
    """tests/gpu/test_hf.py's sets: the four tiny families of tests/hf_models.py."""
    from frost_runtime.hf_fuse import FAMILIES as FUSED_FAMILIES

    from tests.hf_models import TINY, build_tiny_set, tiny_set_name

    (BUILT / "hf").mkdir(exist_ok=True)
    for family in TINY:
        start = time.time()
        write_atomic(BUILT / "hf" / f"tiny-{family}.frostset", build_tiny_set(family))
        print(f"[hf] tiny-{family}.frostset ({time.time() - start:.0f} s)", flush=True)
    for family in ("llama", "gemma2"):  # an FP8 cache: test_hf.py's e4m3 test
        write_atomic(BUILT / "hf" / f"tiny-{family}-kv_e4m3.frostset", build_tiny_set(family, "e4m3"))
        print(f"[hf] tiny-{family}-kv_e4m3.frostset", flush=True)
    for family in FUSED_FAMILIES:  # decode plans taking views of one QKV buffer, and glue: fused layers
        name = tiny_set_name(family, qkv_layout="fused", glue=True)
        write_atomic(BUILT / "hf" / f"{name}.frostset", build_tiny_set(family, qkv_layout="fused", glue=True))
        print(f"[hf] {name}.frostset", flush=True)
    name = tiny_set_name("llama", "e4m3", "fused", glue=True)  # fused layers over an FP8 cache
    write_atomic(BUILT / "hf" / f"{name}.frostset", build_tiny_set("llama", "e4m3", "fused", glue=True))
    print(f"[hf] {name}.frostset", flush=True)


def build_cb_sets() -> None:
    """tests/gpu/test_hf_continuous.py's sets: the four tiny families' mixed plans for transformers'
    continuous batching (tests/cb_models.py: token buckets 16 and 64, a pool of 128 blocks of 16),
    and Llama's over an e4m3 pool."""
    from tests.cb_models import CB_TINY, build_cb_set, cb_set_name

    (BUILT / "cb").mkdir(exist_ok=True)
    for family, kv in [(family, None) for family in CB_TINY] + [("llama", "e4m3")]:
        start = time.time()
        name = cb_set_name(family, kv) + ".frostset"
        write_atomic(BUILT / "cb" / name, build_cb_set(family, kv))
        print(f"[cb] {name} ({time.time() - start:.0f} s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="Build the GPU tests' plans into tests/.built.")
    parser.add_argument(
        "--only",
        choices=["sdpa", "decode", "append", "hf", "fp8", "mixed", "cb", "vllm"],
        help="build one group only (default: all)",
    )
    args = parser.parse_args()
    BUILT.mkdir(exist_ok=True)
    if args.only in (None, "mixed"):
        build_mixed()
    if args.only in (None, "fp8"):
        build_fp8()
    if args.only in (None, "cb"):
        build_cb_sets()
    if args.only in (None, "vllm"):  # tests/gpu/test_vllm_launch.py's (and tests/vllm_backend/'s) sets
        from tests.vllm_sets import main as build_vllm_sets

        build_vllm_sets()
    if args.only in (None, "hf"):
        build_hf_sets()
        build_set_of_tiny_llama()
    if args.only in (None, "sdpa"):
        build_sdpa()
    failures = []  # (group, its case count, [(case id, error)])
    for group, all_cases, describe in (
        ("decode", decode_cases(), decode_description),
        ("append", append_cases(), append_description),
    ):
        if args.only in (None, group):
            failures.append((group, len(all_cases), build_group(group, all_cases, describe)))
    for group, count, failed in failures:
        if failed:
            print(f"\n{len(failed)} of {count} {group} plans FAILED to build (not in {group}-manifest.json):")
            for case_id, error in failed:
                print(f"  {case_id}: {error.splitlines()[0] if error else ''}")
    return 1 if any(failed for _, _, failed in failures) else 0


if __name__ == "__main__":
    sys.exit(main())
