"""`frostc build`, `inspect`, `diff`, `check` and `from-config`. Exit codes: 0 success, 2 bad input (nothing written);
`diff` and `check` also use 1 (different / not runnable here); 3 an internal error (a frostc bug).
No verb prints a traceback: every failure is one message on stderr (FROSTC_TRACEBACK=1 shows the
traceback of an internal error)."""

import functools
import json
import os
import sys
from pathlib import Path

import typer
from frost_runtime import schema
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from frostc.errors import INPUT_ERRORS, FrostcError, input_error_message, internal_error_message
from frostc.serving import ENGINES, VLLM_MAX_NUM_BATCHED_TOKENS, VLLM_MAX_NUM_SEQS

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="A plan compiler for attention on NVIDIA GPUs.",
)
out = Console()
err = Console(stderr=True)


def _fail(message: str, code: int = 2) -> None:
    # the message quotes the user's values: print them verbatim, never as rich markup
    err.print("[bold red]error:[/bold red] " + escape(message), highlight=False)
    raise typer.Exit(code)


def _reports_failures(command):
    """Every verb's net: an expected error that a verb did not report itself becomes one clean
    message and exit 2; anything else is a frostc bug, said so in one message, exit 3."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except INPUT_ERRORS as exc:
            _fail(input_error_message(exc))
        except Exception as exc:
            if os.environ.get("FROSTC_TRACEBACK"):
                raise
            _fail(internal_error_message(exc), code=3)

    return run


@app.command()
def build(
    description: Path = typer.Argument(..., help="Graph description (.toml or .json)."),
    output: Path = typer.Option(..., "-o", "--output", help="Plan file to write (.frost)."),
    dump: Path | None = typer.Option(None, "--dump", help="Also write each stage's text form into this folder."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print nothing on success."),
) -> None:
    """Validate, resolve and compile DESCRIPTION into a plan file."""
    from frostc.build import build as run_pipeline
    from frostc.description import load_description
    from frostc.inspect import print_plan
    from frostc.planfile import write_atomic

    try:
        desc = load_description(description)
        with _progress(quiet) as report:
            data = run_pipeline(desc, progress=report, dump_dir=dump)
    except FrostcError as exc:
        _fail(f"{description} is not a plan frostc can build:\n{exc}")
    except OSError as exc:  # --dump's files, say: the description itself was read above
        _fail(f"building {description}: cannot write {exc.filename or 'a file'}: {exc.strerror or exc}")
    try:
        write_atomic(output, data)
    except OSError as exc:
        _fail(f"{output}: cannot write the plan: {exc.strerror or exc}")
    if not quiet:
        print_plan(schema.decode_plan(data), out)
        out.print(f"wrote {output} ({len(data)} bytes)")


class _progress:
    """A spinner line per kernel being compiled (compiles take seconds each)."""

    def __init__(self, quiet: bool):
        self.bar = (
            None
            if quiet
            else Progress(
                SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=False
            )
        )
        self.tasks = {}

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
        return self.report

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)

    def report(self, event: str, variant) -> None:
        if not self.bar:
            return
        if event == "start":
            self.tasks[variant] = self.bar.add_task(f"compiling {variant.name}", total=1)
        else:
            self.bar.update(self.tasks[variant], completed=1, description=f"compiled  {variant.name}")


@app.command()
def inspect(
    plan: Path = typer.Argument(..., help="Plan file (.frost)."),
    as_json: bool = typer.Option(False, "--json", help="Canonical JSON instead of tables."),
) -> None:
    """Print a plan's header, slots, kernels, launches and workspace, or a plan set's header, plans
    and cubin table. Needs no GPU."""
    from frost_runtime.planset import PlanSet

    from frostc.inspect import plan_summary, print_plan, print_set, set_summary

    data = _read_plan(plan)
    if isinstance(data, PlanSet):
        summary, show = set_summary, print_set
    else:
        summary, show = plan_summary, print_plan
    if as_json:
        sys.stdout.write(json.dumps(summary(data), indent=2) + "\n")
    else:
        show(data, out)


def _read_plan(path: Path):
    """The plan in the file, or the plan set (a frost_runtime.PlanSet)."""
    from frost_runtime import planset

    try:
        data = path.read_bytes()
        return planset.read_set(data) if planset.is_set(data) else schema.decode_plan(data)
    except FileNotFoundError:
        _fail(f"{path}: no such file")
    except OSError as exc:
        _fail(f"{path}: cannot read: {exc.strerror or exc}")
    except schema.PlanFormatError as exc:
        _fail(f"{path}: {exc}")


@app.command()
def diff(
    a: Path = typer.Argument(..., help="Plan file, or a `frostc inspect --json` rendering."),
    b: Path = typer.Argument(..., help="Plan file, or a `frostc inspect --json` rendering."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable differences."),
) -> None:
    """Compare two plans field by field (header first), or two plan sets (keys added and removed,
    each common plan's differences). Exit 0 equal, 1 different, 2 unreadable."""
    from frostc.diff import (
        PlanInputError,
        diff_files,
        diff_report,
        diff_sets,
        is_set_file,
        print_diff,
        print_set_diff,
        set_diff_report,
    )

    if is_set_file(a) or is_set_file(b):
        try:
            found = diff_sets(a, b)
        except PlanInputError as exc:
            _fail(str(exc))
        if as_json:
            sys.stdout.write(json.dumps(set_diff_report(found, str(a), str(b)), indent=2) + "\n")
        else:
            print_set_diff(found, out, str(a), str(b))
        raise typer.Exit(1 if found else 0)
    try:
        diffs = diff_files(a, b)
    except PlanInputError as exc:
        _fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps(diff_report(diffs, str(a), str(b)), indent=2) + "\n")
    else:
        print_diff(diffs, out, str(a), str(b))
    raise typer.Exit(1 if diffs else 0)


@app.command()
def check(
    plan: Path = typer.Argument(..., help="Plan file (.frost)."),
    as_json: bool = typer.Option(False, "--json", help="The verdict as JSON."),
    sha256: str | None = typer.Option(
        None, "--sha256", help="Require this plan: its SHA-256 (hex), or a file of allowed ones (sha256sum output)."
    ),
) -> None:
    """Validate a plan and say whether it can run on this machine's GPU and driver; launches
    nothing. Exit 0 runnable, 1 valid but not runnable here, 2 invalid, unreadable or not the
    pinned plan (--sha256)."""
    from frostc.plan_verdict import check_plan_file, print_check

    result = check_plan_file(plan, sha256=sha256)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        print_check(result, out if result["valid"] else err)
    raise typer.Exit(result["exit_code"])


@app.command("from-config")
def from_config(
    config: Path = typer.Argument(
        ...,
        help="A Hugging Face config.json (llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma2, gemma3, phi3, "
        "gpt_oss, deepseek_v2/v3).",
    ),
    batch_sizes: str = typer.Option(
        "cuda-graphs", "--batch-sizes", help='Batch buckets: "1,2,4", or "cuda-graphs" (vLLM\'s 51 capture sizes).'
    ),
    max_prompt_tokens: int | None = typer.Option(
        None,
        "--max-prompt-tokens",
        help="Tokens of one prefill step, all sequences together [default: the cache length].",
    ),
    max_cache_len: int | None = typer.Option(
        None, "--max-cache-len", help="Tokens per sequence in the KV cache [default: max_position_embeddings]."
    ),
    page_size: int = typer.Option(16, "--page-size", help="Tokens per page: a multiple of 16, at most 256."),
    pages: int | None = typer.Option(
        None, "--pages", help="Pages in the pool [default: enough for the largest batch at full length]."
    ),
    speculative: int = typer.Option(0, "--speculative", help="Speculative tokens per decode step, 0 to 15."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree: the heads split over this many ranks."),
    dtype: str | None = typer.Option(None, "--dtype", help="bf16 or fp16 [default: the config's]."),
    kv_cache_dtype: str | None = typer.Option(
        None, "--kv-cache-dtype", help="The paged cache's: e4m3 (FP8, scaled per KV head) [default: the dtype]."
    ),
    qkv_layout: str = typer.Option(
        "separate",
        "--qkv-layout",
        help="Decode's and continuous batching's q, k, v: separate (rows of their own) or fused (views of one "
        "QKV buffer, as hf_fuse makes).",
    ),
    glue: bool = typer.Option(
        False,
        "--glue",
        help="Also the norm and activation plans of the decode (and --cb-tokens) buckets' rows, for "
        "fused layers (hf_fuse).",
    ),
    cb_tokens: str | None = typer.Option(
        None,
        "--cb-tokens",
        help="transformers continuous batching: mixed plans for these step sizes in tokens, e.g. 64,128,256.",
    ),
    cb_requests: int = typer.Option(
        1024, "--cb-requests", help="transformers' max_requests_per_batch: a step's sequences (with --cb-tokens)."
    ),
    cb_blocks: int | None = typer.Option(
        None, "--cb-blocks", help="transformers' num_blocks: the pool the mixed plans read (with --cb-tokens)."
    ),
    engine: str = typer.Option(
        "transformers",
        "--engine",
        help="Who serves the plans: transformers (frost_runtime.hf) or vllm (frost_vllm: mixed plans only).",
    ),
    max_num_seqs: int = typer.Option(
        VLLM_MAX_NUM_SEQS, "--max-num-seqs", help="vLLM's --max-num-seqs: a step's sequences (with --engine vllm)."
    ),
    max_num_batched_tokens: int = typer.Option(
        VLLM_MAX_NUM_BATCHED_TOKENS,
        "--max-num-batched-tokens",
        help="vLLM's --max-num-batched-tokens: its longest step (with --engine vllm).",
    ),
    kv_layout: str = typer.Option(
        "nhd", "--kv-layout", help="vLLM's cache layout, VLLM_KV_CACHE_LAYOUT: nhd or hnd (with --engine vllm)."
    ),
    kv_scales: str = typer.Option(
        "tensor", "--kv-scales", help="An e4m3 cache's scales for vLLM: tensor (its checkpoints') or head."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the plans (validated and resolved); build nothing."),
    as_json: bool = typer.Option(False, "--json", help="The listing as JSON."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Plan set to write (.frostset)."),
    phase: str | None = typer.Option(
        None, "--phase", help="Build only this phase's plans: prefill, decode, mixed or context (MLA)."
    ),
    name: str | None = typer.Option(None, "--name", help="The set's name [default: MODEL_TYPE-DTYPE-tpN]."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print nothing on success."),
) -> None:
    """Plan a model's attention from its config.json: its layer kinds, and a plan per layer kind,
    phase (prefill, decode) and batch bucket; with -o, build them into one plan set. No weights,
    no GPU."""
    from frost_runtime.planset import PHASES

    from frostc.models import load_model_config, read_layers, read_model
    from frostc.serving import (
        ContinuousBatching,
        VllmEngine,
        deployment,
        dry_run_summary,
        layer_kinds,
        parse_batch_sizes,
        print_dry_run,
        vllm_token_buckets,
    )

    try:
        raw = load_model_config(config)
        model = read_model(raw)
        layers = read_layers(raw) if glue else None
        cb = None
        if cb_tokens is not None:
            if cb_blocks is None:
                _fail("--cb-tokens needs --cb-blocks: transformers' num_blocks (ContinuousBatchingConfig), its pool")
            cb = ContinuousBatching(parse_batch_sizes(cb_tokens, "--cb-tokens"), cb_requests, cb_blocks)
        if engine not in ENGINES:
            _fail(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
        vllm, sizes = None, parse_batch_sizes(batch_sizes)
        if engine == "vllm":  # the buckets are tokens: the capture sizes, then doubling to the longest step
            if batch_sizes.strip() == "cuda-graphs":
                sizes = vllm_token_buckets(max_num_batched_tokens)
            vllm = VllmEngine(sizes, max_num_seqs, max_num_batched_tokens, kv_layout.lower(), kv_scales)
        dep = deployment(
            model,
            dtype=dtype,
            batch_sizes=sizes,
            max_prompt_tokens=max_prompt_tokens,
            max_cache_len=max_cache_len,
            page_size=page_size,
            pages=pages,
            speculative=speculative,
            tp=tp,
            kv_cache_dtype=kv_cache_dtype,
            qkv_layout=qkv_layout,
            glue=layers,
            cb=cb,
            vllm=vllm,
        )
    except FrostcError as exc:
        _fail(f"{config} cannot be planned:\n{exc}")
    if phase is not None and phase not in PHASES:
        _fail(f"--phase {phase!r}: expected one of {', '.join(PHASES)}")
    if not dry_run:
        if output is None:
            _fail("give -o SET.frostset to build the plan set, or --dry-run to list its plans")
        _build_set(model, dep, output, phase, name, quiet)
        return
    summary = dry_run_summary(model, dep, layer_kinds(model, dep))
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        print_dry_run(summary, out, str(config))


def _build_set(model, dep, output: Path, phase: str | None, name: str | None, quiet: bool) -> None:
    from frost_runtime.planset import MAX_SET_BYTES

    from frostc.buildset import build_set, print_set_build
    from frostc.planfile import write_atomic
    from frostc.serving import glue_list, layer_kinds, plan_list

    phases = None if phase is None else (phase,)
    name = name or f"{model.model_type}-{dep.dtype}-tp{dep.tp}" + ("-vllm" if dep.vllm else "")
    entries = [e for e in plan_list(layer_kinds(model, dep), dep) if phases is None or e.phase in phases]
    glue = glue_list(dep, phases)
    total = sum(1 for e in entries if not e.unsupported) + len(glue)
    try:
        with _SetProgress(quiet, total) as report:
            result = build_set(model, dep, name=name, phases=phases, progress=report)
    except FrostcError as exc:
        _fail(f"the plan set of {name} cannot be built:\n{exc}")
    if len(result.data) > MAX_SET_BYTES:
        _fail(f"the plan set would be {len(result.data)} bytes, over the format's {MAX_SET_BYTES}: build fewer plans")
    try:
        write_atomic(output, result.data)
    except OSError as exc:
        _fail(f"{output}: cannot write the plan set: {exc.strerror or exc}")
    if not quiet:
        print_set_build(result, out, str(output))


class _SetProgress:
    """One bar: plans done of the set's, and the kernels compiled so far."""

    def __init__(self, quiet: bool, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn

        self.bar = (
            None
            if quiet
            else Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err,
            )  # fmt: skip
        )
        self.total, self.kernels, self.skipped, self.task = total, 0, [], None

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
            self.task = self.bar.add_task("plans", total=self.total)
        return self.report

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)

    def report(self, event: str, what: str) -> None:
        if not self.bar:
            return
        if event == "skip":
            self.bar.console.print(f"skipped {escape(what)}: not supported yet", highlight=False)
            return
        if event == "compile":
            self.kernels += 1
        elif event == "done":
            self.bar.advance(self.task)
        text = f"plan {escape(what)}" if event in ("plan", "done") else f"compiling {escape(what)}"
        self.bar.update(self.task, description=f"{text} ({self.kernels} kernels compiled)")


# every verb, present and future, behind the same net
for _command in app.registered_commands:
    _command.callback = _reports_failures(_command.callback)


def main() -> None:
    app()
