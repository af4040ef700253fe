"""`transformers serve --continuous-batching` over HTTP under streaming clients: frostc beside FlashAttention-4.

    python bench/serve_http.py build   # CPU machine: bench/serve.py's plan set (the same file)
    python bench/serve_http.py run [--attn frostc,flash_attention_4] [--concurrency 1,8,32,64]
                                   [--requests-per-level N] [--rate R] [--model-dir DIR] [--tiny]
                                   [--device cuda] [--md FILE] [--json FILE] [--plot FILE.png]
    python bench/serve_http.py soak [--attn frostc] [--seconds 300] [--concurrency 64]
                                    [--cancel-share 0.2] [--tiny] [--md FILE] [--json FILE]
    python bench/serve_http.py plot RUN.json FILE.png   # a run's --json plotted where matplotlib is

The server is transformers' own (`transformers.cli.serve.Serve`, 5.23), started in this process
(one attention at a time, each on a fresh port, then killed) so that frostc's attention can be
registered first, as `python -m frost_runtime.hf.serve` does, and so that the soak can read the
server's GPU memory and page pool directly. The model: Llama-3-8B's shapes with random bf16 weights
(bench/serve.py's config), saved once to --model-dir with a word-level tokenizer whose word "tN" is
token N (so a prompt is exactly the token ids it names), no end token (every request generates
exactly max_tokens). `--tiny`: tests/cb_models.py's tiny Llama, fp32 on the CPU, frostc's fp32
reference attention, prompts 16 times shorter.

Every attention serves under one continuous-batching configuration: pages of the set's page size,
bench/serve.py's pool (BLOCKS) and step budget (STEP_TOKENS), transformers' automatic switch to
FlashAttention 2/3 off (`transformers serve` has no flag for it; an sdpa server would otherwise run
FlashAttention where it is installed). frostc's plans are loaded lazily, as the real command does:
the first request (reported apart) pays for the pool, plan loads, graph captures and any JIT.

`run`: per concurrency C, N requests (default max(16, 4C)) of bench/serve.py's log-normal prompt
lengths, arriving as a Poisson process of --rate requests/s (default: as fast as the cap allows)
with at most C in flight (vLLM's --request-rate and --max-concurrency), each streamed
(`stream: true`, temperature 0) by a client process of its own (stdlib threads and http.client: in
the server's process they would hold the GIL that its event loop and batching loop wait for). Per
request: TTFT (send to first content chunk), the gaps between content chunks (ITL), end-to-end
latency, tokens (the final chunk's usage). Per level: generated tokens/s and requests/s over the
level's wall, TTFT and ITL p50/p99, errors.

`soak`: one server at concurrency C for --seconds of Poisson arrivals; a share of the requests is
cancelled by the client closing its connection after a random number of chunks. Clean means: every
request answered fully or cancelled without an error, the server's GPU memory flat, the page pool
whole once the requests are done, /health still ok, and no warning or error logged by transformers
or uvicorn. The exit status is 1 when the soak is not clean.
"""

from __future__ import annotations

import datetime
import gc
import http.client
import json
import logging
import math
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, redirect_stdout
from dataclasses import asdict, dataclass, field
from pathlib import Path

import common
import serve  # bench/serve.py: the model's config, the prompts, the pool, the plan set

ATTENTIONS = "frostc,flash_attention_4"
CONCURRENCY = "1,8,32,64"
MODEL_DIR = Path("/tmp/frostc-serve-model")
TINY_DIR = Path("/tmp/frostc-serve-model-tiny")
MARKER = "frostc-serve-model.json"  # written last: a folder without it is saved again
TINY_NEW_TOKENS = 8
TINY_SHRINK = 16  # --tiny prompts: bench/serve.py's lengths / 16 (median ~28, at most 256 < 512 positions)
HOST = "127.0.0.1"  # not "localhost": one address, no resolver ambiguity between client and server
REQUEST_TIMEOUT_S = 900.0  # a socket read: the first request may wait for JIT and graph captures
STALL_S = 120.0  # a loaded request's socket read: a stream silent this long is an error (a dead server loop)
HEALTH_TIMEOUT_S = 120.0
MEMORY_EVERY_S = 2.0
FLAT_SLACK = 64 << 20  # bytes: allocated memory may grow this much over the soak's second half
SETTLE_S = 30.0  # how long the soak waits for the server to drop its last cancelled requests
KEPT_RECORDS = 5
# What transformers logs at WARNING in normal operation, not counted by the soak: (logger, message start)
BENIGN = (
    ("transformers.cli.serving.chat_completion", "[Request received]"),  # every request
    ("transformers.cli.serving.model_manager", "Loading "),  # the model's load
    ("transformers.generation.configuration_utils", "block_size is deprecated"),  # Serve's --cb-block-size
    ("ContinuousBatchingLogger", "`eos_token_id` not set in GenerationConfig"),  # none, on purpose
)
# transformers' continuous batching logs to a logger of its own, outside "transformers"
LOGGERS = ("transformers", "ContinuousBatchingLogger", "uvicorn.error")


# ---------------------------------------------------------------------------- the setup


@dataclass
class Setup:
    """What every attention's server shares: the model folder and the continuous-batching pool."""

    model_dir: Path
    device: str
    dtype: str  # Serve's --dtype
    tiny: bool
    vocab: int
    page: int  # --cb-block-size
    blocks: int  # --cb-num-blocks
    step_tokens: int  # --cb-max-batch-tokens
    max_tokens: int
    memory_percent: float | None  # --cb-max-memory-percent (None on the CPU: nothing to probe)

    @property
    def describe(self) -> str:
        model = "tiny Llama (fp32)" if self.tiny else "Llama-3-8B shape, random bf16 weights"
        return (
            f"{model} on {self.device}; pages of {self.page}, {self.blocks} blocks, {self.step_tokens} tokens a "
            f"step; {self.max_tokens} new tokens per request, streamed"
        )


def setup(tiny: bool, model_dir: Path | None, device: str | None, max_tokens: int | None) -> Setup:
    device = device or ("cpu" if tiny else "cuda")
    if tiny:
        from tests import cb_models
        from tests.cb_models import CB_TINY

        return Setup(model_dir or TINY_DIR, device, "float32" if device == "cpu" else "bfloat16", True,
                     CB_TINY["llama"]["vocab_size"], cb_models.PAGE, cb_models.POOL_BLOCKS, cb_models.STEP_TOKENS,
                     max_tokens or TINY_NEW_TOKENS, None if device == "cpu" else 0.9)  # fmt: skip
    return Setup(model_dir or MODEL_DIR, device, "bfloat16", False, serve.config()["vocab_size"], _page(),
                 serve.BLOCKS, serve.STEP_TOKENS, max_tokens or serve.NEW_TOKENS, 0.9)  # fmt: skip


def _page() -> int:
    """The set's page size (every attention gets the same pages), or bench/serve.py's."""
    if not serve.SET.exists():
        return serve.PAGE
    import frost_runtime

    return frost_runtime.read_set(serve.SET).serving.page_size


def ensure_model(s: Setup) -> None:
    """Save the model and its word-level tokenizer to `s.model_dir`, unless they are there."""
    marker = s.model_dir / MARKER
    want = {"tiny": s.tiny, "vocab": s.vocab, "dtype": s.dtype}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return
    start = time.perf_counter()
    if s.tiny:
        from tests.cb_models import cb_model

        model = cb_model("llama", device=s.device)
    else:
        model = serve._model()
    model.generation_config.eos_token_id = None  # no end token: every request generates max_tokens
    s.model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(s.model_dir)
    del model
    _free_memory()
    _word_tokenizer(s.vocab).save_pretrained(s.model_dir)
    marker.write_text(json.dumps(want))
    print(f"model saved to {s.model_dir} in {time.perf_counter() - start:.1f} s", flush=True)


def _word_tokenizer(vocab: int):
    """A tokenizer whose word "tN" is token N, and a chat template that is the messages' words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t2")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return tokenizer


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def why_not(attention: str, s: Setup) -> str | None:
    """Why `attention` cannot serve here, or None (bench/serve.py's `available`; --tiny's frostc is
    the reference, which needs no set)."""
    if s.tiny and attention in ("frostc", "frostc-fused"):
        return None
    if attention == "flash_attention_4" and not s.device.startswith("cuda"):
        return f"FlashAttention-4 needs a GPU, not {s.device}"
    return serve.available(attention)


# ---------------------------------------------------------------------------- the server


@dataclass
class Running:
    """One attention's server: transformers' `Serve`, its port, frostc's attention object (its calls)."""

    attention: str
    server: object
    port: int
    frostc: object | None

    def manager(self):
        """transformers' `ContinuousBatchingManager` behind the server (5.23's private path:
        Serve._generation_state -> CBGenerateManager -> ._cb); None before the first request."""
        cb = self.server._generation_state._cb_manager
        return None if cb is None else cb._cb


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _register(attention: str, s: Setup) -> tuple[str, object | None]:
    """The name to hand `Serve` for `attention`, and frostc's attention object (or None)."""
    from frost_runtime.hf import cb_patches, continuous
    from frost_runtime.hf import serve as hf_serve

    hf_serve.fuse_on_load(False)  # what an earlier server of this process asked for, undone
    if attention in ("frostc", "frostc-fused"):
        plans = None
        if not s.tiny:
            import frost_runtime

            plans = frost_runtime.read_set(serve.SET)
        # what `python -m frost_runtime.hf.serve [--fuse]` does
        hf_serve.fuse_on_load(attention == "frostc-fused", plans)
        return continuous.NAME, continuous.install(None, plans)
    if attention == "flash_attention_4":
        # Serve's --attn-implementation check knows FlashAttention 2 and 3 only; cb_patches lets a
        # mask-free name through it (FA4 is one; nothing else changes for it: it is a flash name)
        cb_patches.allow(attention)
    return attention, None


class _DropRequestLines(logging.Filter):
    """Drops chat_completion.py's "[Request received]" line (BENIGN's first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(BENIGN[0][1])


@contextmanager
def serving(attention: str, s: Setup) -> Iterator[Running]:
    """transformers serve --continuous-batching with `attention`, up and healthy; killed on exit."""
    from transformers.cli.serve import Serve

    name, frostc = _register(attention, s)
    port = _free_port()
    with _quiet_requests():
        server = Serve(force_model=str(s.model_dir), continuous_batching=True, attn_implementation=name,
                       device=s.device, dtype=s.dtype, host=HOST, port=port, non_blocking=True,
                       cb_block_size=s.page, cb_num_blocks=s.blocks, cb_max_batch_tokens=s.step_tokens,
                       cb_max_memory_percent=s.memory_percent)  # fmt: skip
        try:
            # the one option the command line lacks; read when the first request builds the manager
            server._generation_state._cb_config.auto_switch_to_flash = False
            logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # a line per request otherwise
            _wait_healthy(port)
            yield Running(attention, server, port, frostc)
        finally:
            server.kill_server()
            del server
            _free_memory()
            _print_memory(f"{attention}: server killed")


@contextmanager
def _quiet_requests() -> Iterator[None]:
    """chat_completion.py logs every request at WARNING: thousands of lines under load."""
    chat = logging.getLogger("transformers.cli.serving.chat_completion")
    drop = _DropRequestLines()
    chat.addFilter(drop)
    try:
        yield
    finally:
        chat.removeFilter(drop)


def _print_memory(when: str) -> None:
    import torch

    if torch.cuda.is_available():
        print(f"{when}: {torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated, "
              f"{torch.cuda.memory_reserved() / 2**30:.2f} GiB reserved", flush=True)  # fmt: skip


def _wait_healthy(port: int, timeout: float = HEALTH_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server on port {port} is not healthy after {timeout:.0f} s")
        time.sleep(0.2)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


# ---------------------------------------------------------------------------- the client


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    cancel_after: int | None = None  # close the connection after this many content chunks (0: after the first event)


@dataclass
class Sample:
    """One streamed request as the client saw it; times in seconds from its send."""

    prompt_tokens: int
    max_tokens: int
    cancel_after: int | None
    sent: float = 0.0  # perf_counter at the send
    chunks: list[float] = field(default_factory=list)  # each content chunk's arrival
    end: float = 0.0  # the stream's end, or the client's close
    tokens: int = 0  # the final chunk's usage; else the content's words (a word is a token here)
    finish_reason: str | None = None
    cancelled: bool = False
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunks[0] if self.chunks else None

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.chunks, self.chunks[1:])]

    @property
    def ok(self) -> bool:
        """Answered fully (exactly max_tokens tokens), or cancelled by the client with no error."""
        return self.error is None and (self.cancelled or self.tokens == self.max_tokens)

    def raw(self) -> dict:
        d = asdict(self)
        d["chunks"] = [round(t, 6) for t in self.chunks]
        return d


def body(s: Setup, job: Job) -> bytes:
    return json.dumps({
        "model": str(s.model_dir),
        "messages": [{"role": "user", "content": " ".join(f"t{t}" for t in job.prompt)}],
        "max_tokens": job.max_tokens,
        "temperature": 0,
        "stream": True,
    }).encode()  # fmt: skip


def stream(port: int, payload: bytes, job: Job, timeout: float = STALL_S) -> Sample:
    """POST one streaming chat completion and read its server-sent events to the end (or close the
    connection after `job.cancel_after` content chunks); `timeout`: the longest silence (s)."""
    sample = Sample(len(job.prompt), job.max_tokens, job.cancel_after)
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    words = 0
    sample.sent = time.perf_counter()
    try:
        conn.request("POST", "/v1/chat/completions", body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            sample.error = f"HTTP {response.status}: {response.read()[:300].decode(errors='replace')}"
            return sample
        for line in response:  # "data: {chunk}\n\n" per event; transformers sends no "data: [DONE]"
            if not line.startswith(b"data:"):
                continue
            words += _event(sample, json.loads(line[5:]), time.perf_counter() - sample.sent)
            if sample.error:
                break
            if job.cancel_after is not None and len(sample.chunks) >= job.cancel_after:
                sample.cancelled = True
                break
    except (OSError, http.client.HTTPException, ValueError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"
    finally:
        sample.end = time.perf_counter() - sample.sent
        conn.close()  # for a cancelled request: the server sees the disconnect and cancels it
    sample.tokens = sample.tokens or words
    return sample


def _event(sample: Sample, event: dict, at: float) -> int:
    """Record one chunk; the words of its content."""
    if "error" in event:  # transformers' in-stream error: data: {"error": "..."}
        sample.error = f"stream error: {event['error']}"
        return 0
    if event.get("usage"):
        sample.tokens = event["usage"]["completion_tokens"]
    words = 0
    for choice in event.get("choices", ()):
        content = choice.get("delta", {}).get("content")
        if content:
            sample.chunks.append(at)
            words += len(content.split())
        sample.finish_reason = choice.get("finish_reason") or sample.finish_reason
    return words


def load(
    port: int,
    s: Setup,
    jobs: Iterator[Job],
    concurrency: int,
    rate: float,
    seed: int,
    deadline: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[Sample], float]:
    """Send `jobs` as a Poisson process of `rate` requests/s with at most `concurrency` in flight
    (an arrival waits for a free slot); stop sending at `deadline` (perf_counter). The samples, in
    completion order, and the wall from the first send to the last answer."""
    rng = random.Random(seed)
    slots = threading.Semaphore(concurrency)
    samples: list[Sample] = []
    lock = threading.Lock()

    def one(job: Job) -> None:
        try:
            try:
                sample = stream(port, body(s, job), job)
            except Exception as exc:  # a bug here must show as an error, not as a request gone missing
                sample = Sample(len(job.prompt), job.max_tokens, job.cancel_after, error=repr(exc))
            with lock:
                samples.append(sample)
                done = len(samples)
            if progress:
                progress(done)
        finally:
            slots.release()

    arrival = time.perf_counter()
    first: float | None = None
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for job in jobs:
            if math.isfinite(rate):
                arrival += rng.expovariate(rate)
                time.sleep(max(0.0, arrival - time.perf_counter()))
            wait = None if deadline is None else deadline - time.perf_counter()
            if (wait is not None and wait <= 0) or not slots.acquire(timeout=wait):
                break  # the soak's window closed: arrivals after it are not sent
            first = first or time.perf_counter()
            pool.submit(one, job)
    return samples, time.perf_counter() - (first or arrival)


@dataclass
class Load:
    """One load, for the client process (JSON on its stdin): where, how many or how long, how fast."""

    port: int
    setup: dict  # Setup's fields
    concurrency: int
    rate: float | None  # requests/s; None: as fast as the cap allows
    seed: int
    label: str
    count: int | None = None  # a level: this many of `level_jobs`; None: the soak's endless `soak_jobs`
    seconds: float | None = None  # the soak's window of arrivals
    cancel_share: float = 0.0


def drive(spec: Load) -> tuple[list[Sample], float]:
    """Run `spec` in a client process of its own (`client`): threads of this process would hold the
    GIL that the server's event loop and batching loop wait for, the very latencies measured."""
    command = [sys.executable, str(Path(__file__).resolve()), "client"]
    done = subprocess.run(command, input=json.dumps(asdict(spec)), stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{spec.label}: the client process exited with {done.returncode}")
    out = json.loads(done.stdout)
    return [Sample(**x) for x in out["samples"]], out["wall_s"]


def client() -> int:
    """The client process: a `Load` on stdin; its samples and wall on stdout, progress on stderr."""
    spec = Load(**json.load(sys.stdin))
    s = Setup(**(spec.setup | {"model_dir": Path(spec.setup["model_dir"])}))
    if spec.count is not None:
        jobs, progress = iter(level_jobs(spec.count, s, spec.seed)), _printer(spec.label, spec.count)
    else:
        jobs, progress = soak_jobs(s, spec.cancel_share, spec.seed), _soak_printer(spec.label, spec.seconds)
    deadline = None if spec.seconds is None else time.perf_counter() + spec.seconds
    rate = math.inf if spec.rate is None else spec.rate
    with redirect_stdout(sys.stderr):  # stdout carries the samples
        samples, wall = load(spec.port, s, jobs, spec.concurrency, rate, spec.seed, deadline, progress)
    json.dump({"samples": [x.raw() for x in samples], "wall_s": wall}, sys.stdout)
    return 0


def _wire(s: Setup) -> dict:
    return asdict(s) | {"model_dir": str(s.model_dir)}


def _prompts(count: int, s: Setup, seed: int) -> list[list[int]]:
    """bench/serve.py's log-normal prompts, TINY_SHRINK times shorter for --tiny."""
    prompts = serve.prompts(count, s.vocab, seed=seed)
    return [p[: max(4, len(p) // TINY_SHRINK)] for p in prompts] if s.tiny else prompts


def level_jobs(count: int, s: Setup, seed: int) -> list[Job]:
    return [Job(p, s.max_tokens) for p in _prompts(count, s, seed)]


def first_request(r: Running, s: Setup) -> Sample:
    """The server's first request (a median-length prompt): the pool, plan loads, graphs, JIT."""
    rng = random.Random(-1)
    length = serve.MEDIAN_PROMPT // TINY_SHRINK if s.tiny else serve.MEDIAN_PROMPT
    job = Job([rng.randrange(1, s.vocab) for _ in range(length)], s.max_tokens)
    sample = stream(r.port, body(s, job), job, timeout=REQUEST_TIMEOUT_S)
    if not sample.ok:
        raise RuntimeError(f"{r.attention}: the first request failed: {sample.error or sample.tokens}")
    print(f"{r.attention}: first request TTFT {sample.ttft:.2f} s, answered in {sample.end:.2f} s", flush=True)
    return sample


def _printer(label: str, total: int) -> Callable[[int], None]:
    step = max(1, total // 4)
    start = time.perf_counter()

    def progress(done: int) -> None:
        if done % step == 0 or done == total:
            print(f"{label}: {done}/{total} done, {time.perf_counter() - start:.1f} s", flush=True)

    return progress


# ---------------------------------------------------------------------------- the numbers


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    at = (len(xs) - 1) * q / 100
    low = math.floor(at)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (at - low)


@dataclass
class Level:
    """One attention at one concurrency: what the table shows (latencies in ms)."""

    attention: str
    concurrency: int
    requests: int
    wall_s: float
    generated: int
    generated_per_s: float
    requests_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    tpot_mean_ms: float | None  # (end-to-end - TTFT) / (tokens - 1), averaged over the requests
    errors: int

    @classmethod
    def of(cls, attention: str, concurrency: int, samples: list[Sample], wall: float) -> Level:
        good = [x for x in samples if x.ok]
        ttft = [x.ttft * 1e3 for x in good if x.ttft is not None]
        gaps = [g * 1e3 for x in good for g in x.gaps]
        tpot = [(x.end - x.ttft) * 1e3 / (x.tokens - 1) for x in good if x.ttft is not None and x.tokens > 1]
        generated = sum(x.tokens for x in good)
        wall = max(wall, 1e-9)  # a soak whose window closed before its first arrival sent nothing
        return cls(attention, concurrency, len(samples), wall, generated, generated / wall, len(good) / wall,
                   percentile(ttft, 50), percentile(ttft, 99), percentile(gaps, 50), percentile(gaps, 99),
                   percentile([x.end * 1e3 for x in good], 50), sum(tpot) / len(tpot) if tpot else None,
                   len(samples) - len(good))  # fmt: skip


def _machine(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return common.machine()
    return f"CPU, torch {torch.__version__}, {datetime.date.today().isoformat()}"


# ---------------------------------------------------------------------------- run


def run(attn: str = ATTENTIONS, concurrency: str = CONCURRENCY, requests_per_level: int | None = None,
        rate: float = math.inf, model_dir: Path | None = None, tiny: bool = False, device: str | None = None,
        max_tokens: int | None = None, md=None, json_path=None, plot: Path | None = None) -> int:  # fmt: skip
    s = setup(tiny, model_dir, device, max_tokens)
    levels = [int(c) for c in concurrency.split(",")]
    result = {
        "device": _machine(s.device),
        "setup": _wire(s),
        "describe": s.describe,
        "rate": _rate(rate),
        "levels": [],
        "first": {},
        "skipped": {},
        "calls": {},
        "samples": {},
    }
    print(f"{result['device']}: {s.describe}", flush=True)
    ensure_model(s)
    for attention in (a.strip() for a in attn.split(",")):
        why = why_not(attention, s)
        if why:
            result["skipped"][attention] = why
            print(f"{attention}: skipped: {why}", flush=True)
            continue
        _run_attention(attention, s, levels, requests_per_level, result["rate"], result)
    common.publish(markdown(result), result, md, json_path)
    if plot:
        write_plot(result, Path(plot))
    return 0


def _rate(rate: float | None) -> float | None:
    """None for an infinite rate (as fast as the cap allows): JSON has no inf."""
    return rate if rate is not None and math.isfinite(rate) else None


def _run_attention(attention: str, s: Setup, levels: list[int], per_level: int | None, rate: float | None,
                   result: dict) -> None:  # fmt: skip
    with serving(attention, s) as r:
        result["first"][attention] = first_request(r, s).raw()
        for c in levels:
            count = per_level or max(16, 4 * c)
            label = f"{attention}, concurrency {c}"
            spec = Load(r.port, _wire(s), c, rate, seed=c, label=label, count=count)
            samples, wall = drive(spec)
            level = Level.of(attention, c, samples, wall)
            result["levels"].append(asdict(level))
            result["samples"][f"{attention}/{c}"] = [x.raw() for x in samples]
            print(f"{label}: {level.generated_per_s:,.0f} generated tok/s, TTFT p50 {_ms(level.ttft_p50_ms)} ms, "
                  f"ITL p50 {_ms(level.itl_p50_ms)} ms, {level.errors} errors", flush=True)  # fmt: skip
        if r.frostc is not None:
            result["calls"][attention] = dict(r.frostc.calls)


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f}"


def markdown(r: dict) -> str:
    today = datetime.date.today().isoformat()
    rate = "as fast as the cap allows" if r["rate"] is None else f"Poisson, {r['rate']:g} requests/s"
    peer = {row["concurrency"]: row["generated_per_s"] for row in r["levels"]
            if row["attention"] == "flash_attention_4"}  # fmt: skip
    ratio = bool(peer) and any(row["attention"] != "flash_attention_4" for row in r["levels"])
    lines = [
        f"## bench/serve_http.py — transformers serve --continuous-batching over HTTP, {today}",
        "",
        f"{r['device']}; {r['describe']}. Arrivals: {rate}, at most the concurrency in flight. "
        "Latencies in ms; ITL: the gaps between a stream's content chunks.",
        "",
        "| attention | concurrency | requests | gen tok/s | req/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | errors |"
        + (" vs flash_attention_4 |" if ratio else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if ratio else ""),
    ]
    for row in r["levels"]:
        line = (
            f"| {row['attention']} | {row['concurrency']} | {row['requests']} | {row['generated_per_s']:,.0f} | "
            f"{row['requests_per_s']:.2f} | {_ms(row['ttft_p50_ms'])} | {_ms(row['ttft_p99_ms'])} | "
            f"{_ms(row['itl_p50_ms'])} | {_ms(row['itl_p99_ms'])} | {row['errors']} |"
        )
        if ratio:
            c = row["concurrency"]
            versus = row["attention"] != "flash_attention_4" and c in peer
            line += f" {row['generated_per_s'] / peer[c]:.2f}× |" if versus else " — |"
        lines.append(line)
    lines.append("")
    for attention, first in r["first"].items():
        lines.append(
            f"- {attention}, first request, s: TTFT {first['chunks'][0]:.2f}, answered in {first['end']:.2f} "
            f"({first['prompt_tokens']} prompt tokens; it pays for the pool, plan loads, graph captures and JIT)"
        )
    for attention, why in r["skipped"].items():
        lines.append(f"- {attention}: skipped ({why})")
    for attention, calls in r["calls"].items():
        lines.append(f"- {attention}'s calls: {calls}")
    return "\n".join(lines) + "\n"


def write_plot(r: dict, path: Path) -> None:
    """Two panels: generated tokens/s, and p99 TTFT and ITL, against concurrency; a line per attention."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullLocator
    except ImportError:
        print(f"--plot {path}: skipped, matplotlib does not import", flush=True)
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for attention in dict.fromkeys(row["attention"] for row in r["levels"]):
        rows = [row for row in r["levels"] if row["attention"] == attention]
        c = [row["concurrency"] for row in rows]
        (line,) = left.plot(c, [row["generated_per_s"] for row in rows], marker="o", label=attention)
        colour = line.get_color()  # an attention's colour in both panels: TTFT solid, ITL dashed
        right.plot(c, [row["ttft_p99_ms"] for row in rows], marker="o", color=colour, label=f"{attention} TTFT")
        right.plot(c, [row["itl_p99_ms"] for row in rows], marker="s", color=colour, linestyle="--",
                   label=f"{attention} ITL")  # fmt: skip
    levels = sorted({row["concurrency"] for row in r["levels"]})
    left.set(ylabel="generated tokens/s", title="throughput")
    right.set(yscale="log", ylabel="ms", title="p99 latency")
    for axes in (left, right):
        axes.set(xscale="log", xlabel="concurrency (requests in flight at most)")
        axes.set_xticks(levels, [str(c) for c in levels])
        axes.xaxis.set_minor_locator(NullLocator())  # log ticks between the levels: noise
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
    fig.suptitle(f"transformers serve --continuous-batching: {r['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}", flush=True)


# ---------------------------------------------------------------------------- soak


class LogWatch(logging.Handler):
    """Counts the records at WARNING and above that are not BENIGN; keeps the first few."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if any(record.name == name and message.startswith(start) for name, start in BENIGN):
            return
        self.count += 1
        if len(self.first) < KEPT_RECORDS:
            self.first.append(f"{record.levelname} {record.name}: {message[:300]}")


@contextmanager
def watching(names: tuple[str, ...] = LOGGERS) -> Iterator[LogWatch]:
    watch = LogWatch()
    for name in names:
        logging.getLogger(name).addHandler(watch)
    try:
        yield watch
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(watch)


class MemorySampler:
    """torch.cuda.memory_allocated and memory_reserved every MEMORY_EVERY_S, from a thread of the
    server's own process (it is this one)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, int]] = []  # (s since start, allocated, reserved)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start = time.perf_counter()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(MEMORY_EVERY_S):
                return

    def sample(self) -> None:
        import torch

        at = time.perf_counter() - self._start
        self.samples.append((at, torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        """First, halfway, last and max of each; flat: allocated grew at most FLAT_SLACK over the
        second half (graphs for new step sizes are captured as the soak meets them: the first
        half may grow, a leak keeps growing)."""
        allocated = [a for _, a, _ in self.samples]
        reserved = [r for _, _, r in self.samples]
        half = allocated[len(allocated) // 2]
        return {"samples": len(self.samples),
                "allocated": {"first": allocated[0], "half": half, "last": allocated[-1], "max": max(allocated)},
                "reserved": {"first": reserved[0], "last": reserved[-1], "max": max(reserved)},
                "flat": allocated[-1] - half <= FLAT_SLACK}  # fmt: skip


@dataclass
class Pool:
    """The continuous-batching cache's pool, in whole-model blocks (its num_blocks' unit)."""

    total: int
    free: int
    cached: int  # unreferenced complete blocks kept for prefix sharing: reusable, evicted on demand
    held: int  # referenced by a request's block table
    tables: int  # requests with a block table
    active: int  # the scheduler's requests being prefilled or decoded
    waiting: int  # the scheduler's requests not started yet

    @property
    def whole(self) -> bool:
        return self.held == 0 and self.tables == 0 and self.active == 0 and self.waiting == 0 and (
            self.free + self.cached == self.total)  # fmt: skip


def pool_state(processor) -> Pool:
    """Read `processor`'s PagedAttentionCache (transformers 5.23): free sectors, and each cache
    allocator's free, cached (prefix cache) and held blocks, converted to whole-model blocks."""
    cache, scheduler = processor.cache, processor.scheduler
    capacity = cache.num_sectors * cache.bytes_per_sector
    free = len(cache.pool.free_sectors) * cache.bytes_per_sector
    cached = held = tables = 0
    for allocator in cache.cache_allocators.values():
        free += cache.pool.count_free_blocks(allocator.index) * allocator.bytes_per_block
        cached += len(allocator.ledger.cached_blocks) * allocator.bytes_per_block
        owned = {b for blocks in allocator.block_table.values() for b in blocks}
        held += len(owned) * allocator.bytes_per_block
        tables += len(allocator.block_table)
    block = capacity / cache.num_blocks
    return Pool(cache.num_blocks, round(free / block), round(cached / block), round(held / block), tables,
                len(scheduler.active_requests), len(scheduler.waiting_requests))  # fmt: skip


def settled_pool(r: Running, timeout: float = SETTLE_S) -> Pool | str:
    """The pool once the server has dropped every request (cancellations reach it a step after the
    disconnect), read while transformers' loop is paused; a string when it cannot be read."""
    manager = r.manager()
    if manager is None or manager.batch_processor is None:
        return "no continuous-batching manager"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with manager.pause():  # the loop parks between steps: a consistent view
                pool = pool_state(manager.batch_processor)
        except RuntimeError as exc:
            return f"the loop cannot pause: {exc}"
        if pool.whole or time.monotonic() > deadline:
            return pool
        time.sleep(0.2)


def soak_jobs(s: Setup, cancel_share: float, seed: int) -> Iterator[Job]:
    """Endless jobs: bench/serve.py's log-normal prompts; a share cancelled after 0..max_tokens-1
    content chunks (0: as soon as the stream opens, while the request may still wait or prefill)."""
    rng = random.Random(seed)
    i = 0
    while True:
        i += 1
        cancel = rng.randrange(s.max_tokens) if rng.random() < cancel_share else None
        yield Job(_prompts(1, s, seed=seed * 1_000_003 + i)[0], s.max_tokens, cancel)


def soak(attn: str = "frostc", seconds: float = 300.0, concurrency: int = 64, cancel_share: float = 0.2,
         rate: float | None = None, model_dir: Path | None = None, tiny: bool = False, device: str | None = None,
         max_tokens: int | None = None, md=None, json_path=None) -> int:  # fmt: skip
    s = setup(tiny, model_dir, device, max_tokens)
    rate = _rate(rate or concurrency / 2)
    report = {"device": _machine(s.device), "attention": attn, "describe": s.describe, "seconds": seconds,
              "concurrency": concurrency, "cancel_share": cancel_share, "rate": rate}  # fmt: skip
    print(f"{report['device']}: soak of {attn}, {seconds:g} s, concurrency {concurrency}, "
          f"{rate or math.inf:g} requests/s, {cancel_share:.0%} cancelled; {s.describe}", flush=True)  # fmt: skip
    why = why_not(attn, s)
    if why:
        print(f"{attn}: cannot soak: {why}", flush=True)
        return 1
    ensure_model(s)
    with watching() as logs, serving(attn, s) as r:
        report["first"] = first_request(r, s).raw()
        gpu = s.device.startswith("cuda")
        with MemorySampler() if gpu else _nothing() as memory:
            spec = Load(r.port, _wire(s), concurrency, rate, seed=1, label=f"{attn} soak", seconds=seconds,
                        cancel_share=cancel_share)  # fmt: skip
            samples, wall = drive(spec)
            pool = settled_pool(r)
            if memory is not None:
                memory.sample()  # the end, after the drain
        report |= _soak_checks(samples, wall, pool, memory, logs, healthy(r.port), r, concurrency)
    common.publish(soak_markdown(report), report, md, json_path)
    return 0 if report["clean"] else 1


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _soak_printer(label: str, seconds: float) -> Callable[[int], None]:
    start, last = time.perf_counter(), [0.0]

    def progress(done: int) -> None:
        now = time.perf_counter() - start
        if now - last[0] >= max(5.0, seconds / 20):
            last[0] = now
            print(f"{label}: {done} requests done, {now:.0f}/{seconds:g} s", flush=True)

    return progress


def _soak_checks(samples: list[Sample], wall: float, pool: Pool | str, memory, logs: LogWatch, health: bool,
                 r: Running, concurrency: int) -> dict:  # fmt: skip
    bad = [x for x in samples if not x.ok]
    completed = sum(1 for x in samples if x.ok and not x.cancelled)
    cancelled = sum(1 for x in samples if x.ok and x.cancelled)
    manager = r.manager()
    handlers = len(manager.output_router.result_handlers) if manager is not None else 0
    checks = {
        "requests": (not bad, f"{completed} answered fully, {cancelled} cancelled cleanly, {len(bad)} not"),
        "pool": (isinstance(pool, Pool) and pool.whole, _pool_text(pool)),
        "health": (health, "/health ok after the soak" if health else "/health not ok after the soak"),
        "loop": (manager is not None and manager.is_running(),
                 "transformers' generation loop running after the soak" if manager is not None and
                 manager.is_running() else "transformers' generation loop is not running (it died: see the log)"),
        "logs": (logs.count == 0, f"{logs.count} warnings or errors logged" + "".join(f"; {x}" for x in logs.first)),
        # transformers drops a result handler when its request finishes, a cancelled one never does:
        # cb_patches drops it as the cancel is cleared
        "router": (handlers == 0, f"{handlers} result handlers left in transformers' output router"),
    }  # fmt: skip
    if memory is not None:
        m = memory.summary()
        a, rs = m["allocated"], m["reserved"]
        checks["memory"] = (m["flat"], f"allocated first {_gib(a['first'])}, half {_gib(a['half'])}, last "
                            f"{_gib(a['last'])}, max {_gib(a['max'])}; reserved first {_gib(rs['first'])}, last "
                            f"{_gib(rs['last'])}, max {_gib(rs['max'])} GiB ({m['samples']} samples)")  # fmt: skip
    return {
        "clean": all(ok for ok, _ in checks.values()),
        "checks": {name: {"ok": ok, "detail": detail} for name, (ok, detail) in checks.items()},
        "requests": len(samples), "completed": completed, "cancelled": cancelled, "failed": len(bad),
        "failures": [x.raw() for x in bad[:KEPT_RECORDS]],
        "wall_s": wall,
        "level": asdict(Level.of(r.attention, concurrency, [x for x in samples if not x.cancelled], wall)),
        "pool": asdict(pool) if isinstance(pool, Pool) else pool,
        "memory": memory.summary() if memory is not None else None,
        "logged": {"count": logs.count, "first": logs.first},
        "calls": dict(r.frostc.calls) if r.frostc is not None else None,
        "samples": [x.raw() for x in samples],
    }  # fmt: skip


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def _pool_text(pool: Pool | str) -> str:
    if isinstance(pool, str):
        return pool
    return (f"{pool.free} free + {pool.cached} in the prefix cache of {pool.total} blocks; {pool.held} held by "
            f"{pool.tables} requests; {pool.active} active, {pool.waiting} waiting")  # fmt: skip


def soak_markdown(r: dict) -> str:
    today = datetime.date.today().isoformat()
    level = r["level"]
    lines = [
        f"## bench/serve_http.py soak — {r['attention']}, {r['seconds']:g} s, {today}: "
        + ("clean" if r["clean"] else "NOT CLEAN"),
        "",
        f"{r['device']}; {r['describe']}. Poisson arrivals at {r['rate'] or math.inf:g} requests/s, at most "
        f"{r['concurrency']} in flight, {r['cancel_share']:.0%} of them cancelled by the client (its connection "
        f"closed after a random number of chunks). {r['requests']} requests in {r['wall_s']:.1f} s; the fully "
        f"answered ones: {level['generated_per_s']:,.0f} generated tok/s, TTFT p50/p99 {_ms(level['ttft_p50_ms'])}/"
        f"{_ms(level['ttft_p99_ms'])} ms, ITL p50/p99 {_ms(level['itl_p50_ms'])}/{_ms(level['itl_p99_ms'])} ms.",
        "",
        "| check | ok | detail |",
        "|---|---|---|",
    ]
    for name, check in r["checks"].items():
        lines.append(f"| {name} | {'yes' if check['ok'] else 'NO'} | {check['detail']} |")
    lines += ["", f"- first request, s: TTFT {r['first']['chunks'][0]:.2f}, answered in {r['first']['end']:.2f}"]
    if r["calls"]:
        lines.append(f"- frostc's calls: {r['calls']}")
    for failure in r["failures"]:
        lines.append(f"- failed: {failure['error'] or str(failure['tokens']) + ' tokens'} "
                     f"({failure['prompt_tokens']} prompt tokens)")  # fmt: skip
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the command line


def _options(p, attention: str, attn_help: str, rate: str) -> None:
    p.add_argument("--attn", default=attention, help=f"{attn_help} (default {attention})")
    p.add_argument("--rate", type=float, help=f"requests/s, Poisson arrivals (default {rate})")
    p.add_argument("--model-dir", type=Path, help=f"the saved model (default {MODEL_DIR}; --tiny: {TINY_DIR})")
    p.add_argument("--tiny", action="store_true", help="the tiny Llama, fp32 on the CPU (a check on any machine)")
    p.add_argument("--device", help="Serve's --device (default cuda; --tiny: cpu)")
    p.add_argument("--max-tokens", type=int, help=f"new tokens per request (default {serve.NEW_TOKENS}; --tiny: "
                                                   f"{TINY_NEW_TOKENS})")  # fmt: skip
    common.add_outputs(p)


def main(argv: list[str] | None = None) -> int:
    parser, commands = common.command_line(
        __doc__, build="the frostc plan set (bench/serve.py build: the same file; CPU machine)",
        run="the benchmark (GPU machine)", soak="the soak: cancellations, memory, the page pool (GPU machine)",
        client="(internal) the load generator run and soak start: a load on stdin, its samples on stdout",
        plot="the plot of a run's --json (any machine with matplotlib): plot RUN.json FILE.png",
    )  # fmt: skip
    commands["plot"].add_argument("results", type=Path, metavar="RUN.json")
    commands["plot"].add_argument("path", type=Path, metavar="FILE.png")
    run_parser, soak_parser = commands["run"], commands["soak"]
    _options(run_parser, ATTENTIONS, "attentions, in this order", "inf: as fast as the cap allows")
    run_parser.add_argument("--concurrency", default=CONCURRENCY, help=f"levels (default {CONCURRENCY})")
    run_parser.add_argument("--requests-per-level", type=int, help="requests per level (default max(16, 4C))")
    run_parser.add_argument("--plot", type=Path, metavar="FILE.png", help="also plot throughput and p99 latencies")
    run_parser.set_defaults(rate=math.inf)
    _options(soak_parser, "frostc", "the attention", "half the concurrency")
    soak_parser.add_argument("--seconds", type=float, default=300.0, help="arrivals for this long (default 300)")
    soak_parser.add_argument("--concurrency", type=int, default=64, help="requests in flight at most (default 64)")
    soak_parser.add_argument("--cancel-share", type=float, default=0.2, help="share cancelled by the client")
    functions = {"build": serve.build, "run": run, "soak": soak, "client": client, "plot": plot_file}
    return common.dispatch(parser, functions, argv)


def plot_file(results: Path, path: Path) -> int:
    """`plot`: write_plot from a run's saved numbers (the GPU machine may lack matplotlib)."""
    write_plot(json.loads(results.read_text()), path)
    return 0 if path.exists() else 1


if __name__ == "__main__":
    sys.exit(main())
