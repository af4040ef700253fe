"""A Llama-3-8B-shaped model served through frostc's plans in Hugging Face transformers, beside HF's
own paths, in one run (issue 19).

    python bench/model.py build                   # CPU machine: the plan sets, into bench/.built/model
    python bench/model.py run [--md FILE] [--json FILE] [--hf-compiled] [--compiled-model]   # GPU machine
    python bench/model.py cold SET                # one process: start -> first token (run calls it)

The model: Llama-3-8B's shapes (32 layers, 32 heads, 8 KV heads, d 128, vocab 128256), random
bf16 weights (no Hub), prompts of 2048 random tokens. Rows:
- decode step at batch 8 and 32 (after a 2048-token prefill): frostc with the whole step as one
  CUDA graph (`frost_runtime.hf.DecodeGraph`), frostc eager (the same step, no graph), HF
  `generate()` with a static cache and sdpa (eager), and with `--hf-compiled` HF's compiled
  static-cache path at batch 32 (its compile time reported; minutes per batch size). ms per
  step and tokens/s; the bandwidth floor is the bytes a step must read (every weight but the
  embedding table, plus the KV of every sequence) over the read ceiling measured in the run.
  Also frostc with an FP8 (e4m3) cache (a set built with --kv-cache-dtype e4m3): its graph step
  and its own floor (half the KV bytes); and with `--compiled-model` frostc's graph step with the
  model's forward through torch.compile (`DecodeGraph(compile_model=True)`: inductor fuses the
  model's elementwise work around frostc's ops; its compile time reported). Last, the model's
  layers fused (`frost_runtime.hf_fuse`, no compile) over a set whose decode plans take q, k, v
  as views of the fused QKV buffer and which holds the decode step's norm and activation plans
  (`--qkv-layout fused --glue`): the same graph steps.
- prefill of 8 x 2048 and 1 x 32768 tokens: frostc (packed plans; the K/V written to its pools)
  against HF sdpa (the K/V kept in its default DynamicCache), logits of the last token only.
- cold start: a fresh process from start to first token with the plan set (read, verify, load
  every plan: the part frostc adds), against HF's compile time when `--hf-compiled` measured it.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time

import common

BUILT = common.BUILT / "model"

PROMPT = 2048
STEPS = 32  # generated tokens per timed generate() (HF) and replays per timing window (frostc)
DECODE_BATCHES = (8, 32)
LONG = 32768
SETS = {  # name -> (batch sizes, max cache length, max prompt tokens, paged cache dtype, fused layers' set)
    "llama3-8b-serve": ((8, 32), PROMPT + 256, 32 * PROMPT, None, False),
    "llama3-8b-serve-kv_e4m3": ((8, 32), PROMPT + 256, 32 * PROMPT, "e4m3", False),
    "llama3-8b-serve-fused": ((8, 32), PROMPT + 256, 32 * PROMPT, None, True),  # --qkv-layout fused --glue
    "llama3-8b-serve-fused-kv_e4m3": ((8, 32), PROMPT + 256, 32 * PROMPT, "e4m3", True),
    "llama3-8b-long": ((1,), LONG + 256, LONG, None, False),
}


def config() -> dict:
    """Llama-3-8B's config.json, with Llama 3.1's 131072 positions (the 32k prefill row)."""
    from tests.model_configs import LLAMA3_8B

    return LLAMA3_8B | {"max_position_embeddings": 131072}


# ---------------------------------------------------------------------------- build (CPU)


def build() -> int:
    from frostc.buildset import build_set
    from frostc.models import read_layers, read_model
    from frostc.planfile import write_atomic
    from frostc.serving import deployment

    BUILT.mkdir(parents=True, exist_ok=True)
    model = read_model(config())
    for name, (sizes, cache, prompt, kv_cache_dtype, fused) in SETS.items():
        dep = deployment(
            model, batch_sizes=sizes, max_cache_len=cache, max_prompt_tokens=prompt, kv_cache_dtype=kv_cache_dtype,
            qkv_layout="fused" if fused else "separate", glue=read_layers(config()) if fused else None,
        )  # fmt: skip
        start = time.perf_counter()
        result = build_set(model, dep, name=name)
        write_atomic(BUILT / f"{name}.frostset", result.data)
        print(f"{name}: {result.plans} plans, {len(result.data):,} bytes ({time.perf_counter() - start:.1f} s)")
    return 0


# ---------------------------------------------------------------------------- the GPU side


def _model(attn: str = "sdpa"):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config().items() if k not in ("model_type", "torch_dtype", "architectures")}
    hf_config = AutoConfig.for_model("llama", **fields)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16, attn_implementation=attn)
    return model.eval()


def _prompts(batch: int, length: int, vocab: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(batch * 7 + length)
    ids = torch.randint(1, vocab, (batch, length), generator=g, device="cuda")
    return ids, torch.ones_like(ids)


def _cuda_ms(fn, reps: int) -> float:
    """Median device-and-host wall of `fn` (synchronized each time), in ms."""
    import statistics

    import torch

    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def step_bytes(model, batch: int, context: int, kv_element_bytes: int = 2) -> int:
    """What one decode step must read: every weight but the embedding table (a step reads only
    its tokens' rows), and each sequence's K and V of every layer."""
    c = model.config
    weights = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    per_token = c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 2
    return weights + batch * context * per_token * kv_element_bytes


def hf_generate_step_ms(model, ids, mask, *, compiled: bool) -> tuple[float, float]:
    """HF generate() with a static cache: ms per decode step ((t(1 + STEPS) - t(1)) / STEPS) and,
    compiled, the first call's wall (its compile)."""
    import torch

    def generate(n: int):
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            cache_implementation="static",
            disable_compile=not compiled,
            pad_token_id=0,
        )

    torch.cuda.synchronize()
    start = time.perf_counter()
    generate(1 + STEPS)  # warm-up; compiled: the compile
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    one = _cuda_ms(lambda: generate(1), 2)
    many = _cuda_ms(lambda: generate(1 + STEPS), 2)
    return (many - one) / STEPS, first


def frostc_decode(model, backend, ids, mask, compile_model: bool = False) -> dict:
    """frostc's decode step at this batch: graph replays (device time over STEPS replays) and
    the same step eager; the graph's tokens are checked against the eager step's. With
    `compile_model`, the first (compiling) step's seconds too, and the graphs dynamo compiled
    over the whole row (1: one compile served every eager step, the reset and the capture)."""
    import torch
    from frost_runtime import timing
    from frost_runtime.hf import DecodeGraph
    from torch._dynamo.utils import counters

    compiled_before = counters["stats"]["unique_graphs"]
    graph = DecodeGraph(model, backend, batch=ids.shape[0], compile_model=compile_model)
    extra = {}
    with torch.no_grad():
        tokens = graph.prefill(ids, mask)
        eager_tokens = [tokens]
        if compile_model:
            start = time.perf_counter()
            eager_tokens.append(graph.step(tokens, capture=False))
            torch.cuda.synchronize()
            extra["compile_s"] = time.perf_counter() - start
        eager_ms = _cuda_ms(lambda: eager_tokens.append(graph.step(eager_tokens[-1], capture=False)), 5)
        graph.reset(ids, mask)
        replayed = [tokens]
        for _ in range(len(eager_tokens) - 1):
            replayed.append(graph.step(replayed[-1]))
        same = all(torch.equal(a, b) for a, b in zip(eager_tokens, replayed))
        for _ in range(10):
            graph.graph.replay()
        graph_ms = timing.elapsed_ms(graph.graph.replay, STEPS) / STEPS  # 10 replays' warm-up, no settling
    result = {"graph_ms": graph_ms, "eager_ms": eager_ms, "graph_tokens_match_eager": same}
    if compile_model:
        extra["compiles"] = counters["stats"]["unique_graphs"] - compiled_before
    return result | extra


def prefill_ms(model, backend, ids, mask) -> dict:
    import torch

    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        # both keep the prompt's K/V for the decode that follows (HF: its default DynamicCache)
        hf = _cuda_ms(lambda: model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1), 3)
    return {"hf_sdpa_ms": hf, "frostc_ms": frostc_prefill_ms(model, backend, ids, mask)}


def frostc_prefill_ms(model, backend, ids, mask) -> float:
    import torch

    model.set_attn_implementation(backend.name)
    with torch.no_grad():
        return _cuda_ms(
            lambda: model(input_ids=ids, attention_mask=mask, past_key_values=backend.new_cache(), logits_to_keep=1),
            3,
        )


def cold(set_path: str) -> int:
    """One fresh process: imports, the plan set (read, verify, load every plan), the model
    (random weights), prefill of one 2048-token prompt, the first token. Prints JSON phases."""
    start = float(os.environ.get("FROSTC_COLD_START", time.time()))
    phases = {}
    mark = time.time()
    import frost_runtime
    import torch
    from frost_runtime import hf

    phases["imports_s"] = time.time() - mark
    mark = time.time()
    plans = frost_runtime.read_set(set_path)
    torch.cuda.init()
    backend = hf.FrostcAttention(plans)
    loaded = backend.preload()
    torch.cuda.synchronize()
    phases["plan_set_s"] = time.time() - mark
    mark = time.time()
    model = _model()
    backend.install(model)
    torch.cuda.synchronize()
    phases["model_s"] = time.time() - mark
    mark = time.time()
    ids, mask = _prompts(1, PROMPT, model.config.vocab_size)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, past_key_values=backend.new_cache(), logits_to_keep=1)
        token = int(out.logits[0, -1].argmax())
    phases["first_token_s"] = time.time() - mark
    phases["total_s"] = time.time() - start
    print(json.dumps({"plans_loaded": loaded, "token": token, **phases}))
    return 0


def run(md=None, json_path=None, hf_compiled: bool = False, compiled_model: bool = False) -> int:
    import frost_runtime
    import torch
    from frost_runtime import hf

    ceiling = common.read_ceiling()["bytes_per_s"]
    print(f"read ceiling {ceiling / 1e12:.2f} TB/s", flush=True)
    result: dict = {"ceiling_bytes_per_s": ceiling, "decode": [], "prefill": []}

    env = dict(os.environ, FROSTC_COLD_START=str(time.time()))
    cold_run = subprocess.run(
        [sys.executable, __file__, "cold", str(BUILT / "llama3-8b-serve.frostset")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    result["cold"] = json.loads(cold_run.stdout.strip().splitlines()[-1]) if cold_run.returncode == 0 else None
    print("cold start:", result["cold"] or cold_run.stderr[-2000:], flush=True)

    model = _model()
    start = time.perf_counter()
    plans = frost_runtime.read_set(BUILT / "llama3-8b-serve.frostset")
    backend = hf.FrostcAttention(plans, name="frostc-bench")
    backend.preload()
    torch.cuda.synchronize()
    result["plan_set_load_s"] = time.perf_counter() - start
    backend.install()
    vocab = model.config.vocab_size
    for batch in DECODE_BATCHES:
        ids, mask = _prompts(batch, PROMPT, vocab)
        model.set_attn_implementation(backend.name)
        row = {"batch": batch, "context": PROMPT, "floor_bytes": step_bytes(model, batch, PROMPT + STEPS // 2)}
        row["floor_ms"] = row["floor_bytes"] / ceiling * 1e3
        row |= frostc_decode(model, backend, ids, mask)
        print(row, flush=True)
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            row["hf_sdpa_ms"], _ = hf_generate_step_ms(model, ids, mask, compiled=False)
            if hf_compiled and batch == max(DECODE_BATCHES):  # minutes of compile per batch size: one row
                row["hf_compiled_ms"], row["hf_compile_s"] = hf_generate_step_ms(model, ids, mask, compiled=True)
        print(row, flush=True)
        result["decode"].append(row)
        torch.cuda.empty_cache()
    fp8 = hf.FrostcAttention(frost_runtime.read_set(BUILT / "llama3-8b-serve-kv_e4m3.frostset"), name="frostc-fp8")
    fp8.preload()
    fp8.install()
    model.set_attn_implementation(fp8.name)
    for row in result["decode"]:  # the same steps over an FP8 cache
        ids, mask = _prompts(row["batch"], PROMPT, vocab)
        floor = step_bytes(model, row["batch"], PROMPT + STEPS // 2, kv_element_bytes=1) / ceiling * 1e3
        row["fp8"] = {"floor_ms": floor} | frostc_decode(model, fp8, ids, mask)
        print(row["fp8"], flush=True)
        torch.cuda.empty_cache()
    del fp8
    model.set_attn_implementation(backend.name)
    for row in result["decode"] if compiled_model else ():  # the model's own work fused around frostc's ops
        ids, mask = _prompts(row["batch"], PROMPT, vocab)
        try:
            row["compiled_model"] = frostc_decode(model, backend, ids, mask, compile_model=True)
        except hf.RecompileLimitError as exc:  # DecodeGraph refuses a step past dynamo's recompile limit
            row["compiled_model"] = {"error": str(exc), "graph_tokens_match_eager": False}
        print(row["compiled_model"], flush=True)
        torch.cuda.empty_cache()
    ids, mask = _prompts(8, PROMPT, vocab)
    result["prefill"].append({"shape": "8 x 2048"} | prefill_ms(model, backend, ids, mask))
    print(result["prefill"][-1], flush=True)
    del backend
    torch.cuda.empty_cache()
    long_backend = hf.FrostcAttention(frost_runtime.read_set(BUILT / "llama3-8b-long.frostset"), name="frostc-long")
    long_backend.install()
    ids, mask = _prompts(1, LONG, vocab)
    result["prefill"].append({"shape": "1 x 32768"} | prefill_ms(model, long_backend, ids, mask))
    print(result["prefill"][-1], flush=True)
    del long_backend
    torch.cuda.empty_cache()
    fused_layers(model, result)
    common.publish(markdown(result, torch.cuda.get_device_name(), torch.__version__), result, md, json_path)
    same = [r["graph_tokens_match_eager"] and all(r.get(k, {}).get("graph_tokens_match_eager", True)
                                                  for k in ("fp8", "compiled_model", "fused", "fused_fp8"))
            for r in result["decode"]]  # fmt: skip
    return 0 if all(same) else 1


def fused_layers(model, result: dict) -> None:
    """The same decode steps and the 8 x 2048 prefill with the model's layers fused
    (frost_runtime.hf_fuse: one QKV and one gate-up GEMM, rotary in place, the norms, the residual
    add before the second norm and the MLP's activation through the set's glue plans at decode)
    over a set built with --qkv-layout fused --glue. Fusing is for good: the model's last rows."""
    import frost_runtime
    import torch
    from frost_runtime import hf, hf_fuse

    plans = frost_runtime.read_set(BUILT / "llama3-8b-serve-fused.frostset")
    start = time.perf_counter()
    hf_fuse.fuse_layers(model, plans)
    torch.cuda.synchronize()
    result["fuse_s"] = time.perf_counter() - start
    backend = hf.FrostcAttention(plans, name="frostc-fused")
    backend.preload()
    backend.install(model)
    for row in result["decode"]:
        ids, mask = _prompts(row["batch"], PROMPT, model.config.vocab_size)
        row["fused"] = frostc_decode(model, backend, ids, mask)
        print(row["fused"], flush=True)
        torch.cuda.empty_cache()
    ids, mask = _prompts(8, PROMPT, model.config.vocab_size)
    result["prefill"][0]["frostc_fused_ms"] = frostc_prefill_ms(model, backend, ids, mask)
    print(result["prefill"][0], flush=True)
    del backend
    torch.cuda.empty_cache()
    fp8 = hf.FrostcAttention(frost_runtime.read_set(BUILT / "llama3-8b-serve-fused-kv_e4m3.frostset"),
                             name="frostc-fused-fp8")  # fmt: skip
    fp8.preload()
    fp8.install(model)  # the glue plans stay the bf16 set's: the same rows, the same kernels
    for row in result["decode"]:  # the same fused steps over an FP8 cache
        ids, mask = _prompts(row["batch"], PROMPT, model.config.vocab_size)
        floor = step_bytes(model, row["batch"], PROMPT + STEPS // 2, kv_element_bytes=1) / result["ceiling_bytes_per_s"]
        row["fused_fp8"] = {"floor_ms": floor * 1e3} | frostc_decode(model, fp8, ids, mask)
        print(row["fused_fp8"], flush=True)
        torch.cuda.empty_cache()


def _cell(value: float | None, form: str = ".1f") -> str:
    return "—" if value is None else format(value, form)


def markdown(r: dict, device: str, torch_version: str) -> str:
    today = datetime.date.today().isoformat()
    ceiling = r["ceiling_bytes_per_s"] / 1e12
    columns = (
        "decode step",
        "floor ms",
        "frostc graph ms",
        "tok/s",
        "× floor",
        "frostc eager ms",
        "HF sdpa ms",
        "HF compiled ms",
        "HF sdpa / frostc",
        "HF compiled / frostc",
    )
    lines = [
        f"## bench/model.py — Llama-3-8B-shaped model in HF transformers, {today}",
        "",
        f"{device}, torch {torch_version}, read ceiling {ceiling:.2f} TB/s (measured in the run).",
        "",
        "| " + " | ".join(columns) + " |",
        "|---|" + "---:|" * (len(columns) - 1),
    ]
    for d in r["decode"]:
        graph, compiled = d["graph_ms"], d.get("hf_compiled_ms")
        cells = (
            f"batch {d['batch']}, context {d['context']}",
            _cell(d["floor_ms"], ".2f"),
            _cell(graph, ".2f"),
            _cell(d["batch"] / graph * 1e3, ",.0f"),
            _cell(graph / d["floor_ms"], ".2f"),
            _cell(d["eager_ms"]),
            _cell(d["hf_sdpa_ms"]),
            _cell(compiled),
            _cell(d["hf_sdpa_ms"] / graph),
            _cell(None if compiled is None else compiled / graph),
        )
        lines.append("| " + " | ".join(cells) + " |")
    lines += _variant_table(
        r["decode"], "fp8", "FP8 cache", ("floor ms", "frostc graph ms", "tok/s", "× floor", "× bf16 cache's tok/s"),
        lambda d, f: (f"{f['floor_ms']:.2f}", f"{f['graph_ms']:.2f}", f"{d['batch'] / f['graph_ms'] * 1e3:,.0f}",
                      f"{f['graph_ms'] / f['floor_ms']:.2f}", f"{d['graph_ms'] / f['graph_ms']:.2f}"),
    )  # fmt: skip
    lines += _variant_table(
        r["decode"],
        "compiled_model",
        "model through torch.compile",
        ("frostc graph ms", "× floor", "compile s", "compiles"),
        _compiled_cells,
    )
    lines += _variant_table(
        r["decode"], "fused", "fused layers (hf_fuse), --qkv-layout fused --glue",
        ("frostc graph ms", "tok/s", "× floor", "× HF layers' tok/s", "HF sdpa / frostc", "HF compiled / frostc"),
        lambda d, f: (f"{f['graph_ms']:.2f}", f"{d['batch'] / f['graph_ms'] * 1e3:,.0f}",
                      f"{f['graph_ms'] / d['floor_ms']:.2f}", f"{d['graph_ms'] / f['graph_ms']:.2f}",
                      f"{d['hf_sdpa_ms'] / f['graph_ms']:.1f}",
                      _cell(d["hf_compiled_ms"] / f["graph_ms"] if "hf_compiled_ms" in d else None)),
    )  # fmt: skip
    lines += _variant_table(
        r["decode"],
        "fused_fp8",
        "fused layers and an FP8 cache",
        ("floor ms", "frostc graph ms", "tok/s", "× floor", "× fused bf16 cache's tok/s"),
        lambda d, f: (
            f"{f['floor_ms']:.2f}",
            f"{f['graph_ms']:.2f}",
            f"{d['batch'] / f['graph_ms'] * 1e3:,.0f}",
            f"{f['graph_ms'] / f['floor_ms']:.2f}",
            f"{d['fused']['graph_ms'] / f['graph_ms']:.2f}",
        ),
    )
    errors = [f"batch {d['batch']}: {d['compiled_model']['error']}" for d in r["decode"]
              if "error" in d.get("compiled_model", {})]  # fmt: skip
    if errors:
        lines += ["", "Model through torch.compile, refused: " + "; ".join(errors)]
    lines += [
        "",
        "| prefill | HF sdpa ms | frostc ms | HF / frostc | frostc, fused layers ms | HF / frostc fused |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for p in r["prefill"]:
        fused = p.get("frostc_fused_ms")
        cells = (
            p["shape"],
            _cell(p["hf_sdpa_ms"]),
            _cell(p["frostc_ms"]),
            _cell(p["hf_sdpa_ms"] / p["frostc_ms"], ".2f"),
            _cell(fused),
            _cell(None if fused is None else p["hf_sdpa_ms"] / fused, ".2f"),
        )
        lines.append("| " + " | ".join(cells) + " |")
    c = r.get("cold")
    lines += ["", f"Plan set load (read, verify, load every plan): {r['plan_set_load_s']:.2f} s."]
    if c:
        lines.append(
            f"Cold start, a fresh process to the first token: {c['total_s']:.1f} s (imports {c['imports_s']:.1f} s, "
            f"plan set {c['plan_set_s']:.2f} s for {c['plans_loaded']} plans, model init {c['model_s']:.1f} s, "
            f"prefill + first token {c['first_token_s']:.2f} s); no compile."
        )
    compiles = [f"batch {d['batch']}: {d['hf_compile_s']:.0f} s" for d in r["decode"] if "hf_compile_s" in d]
    if compiles:
        lines.append("HF compiled static path, first generate() (its compile): " + ", ".join(compiles) + ".")
    return "\n".join(lines) + "\n"


def _compiled_cells(d: dict, c: dict) -> tuple[str, ...]:
    """A compiled-model row's cells; dashes where DecodeGraph refused the compile (its error is
    listed under the table)."""
    if "error" in c:
        return ("—", "—", "—", "refused")
    return (f"{c['graph_ms']:.2f}", f"{c['graph_ms'] / d['floor_ms']:.2f}", f"{c['compile_s']:.0f}", str(c["compiles"]))


def _variant_table(decode: list[dict], key: str, what: str, columns: tuple[str, ...], cells) -> list[str]:
    """A table of the decode rows that measured a variant of the step (`key`), or nothing."""
    rows = [d for d in decode if key in d]
    if not rows:
        return []
    lines = ["", f"| decode step, {what} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for d in rows:
        lines.append(f"| batch {d['batch']}, context {d['context']} | " + " | ".join(cells(d, d[key])) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser, commands = common.command_line(__doc__, cold="one process: start -> first token (run calls it)")
    run_parser = commands["run"]
    common.add_outputs(run_parser)
    run_parser.add_argument("--hf-compiled", action="store_true", help="also HF's compiled path (minutes of compile)")
    run_parser.add_argument(
        "--compiled-model", action="store_true", help="also frostc's step with the model through torch.compile"
    )
    commands["cold"].add_argument("set_path", metavar="SET")
    return common.dispatch(parser, {"build": build, "run": run, "cold": cold}, argv)


if __name__ == "__main__":
    sys.exit(main())
