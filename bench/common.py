"""What the bench/ scripts share: the path to the code, the command line, the timing, the report.

A script that builds plans here and times them there has one command line:

    python bench/SCRIPT.py build                          # CPU machine: compile the plans into bench/.built
    python bench/SCRIPT.py run [--md FILE] [--json FILE]  # GPU machine: time everything, print a table

`--md` also writes the table (markdown) there and the raw numbers beside it (FILE.json), unless
`--json` names their file. Timing is `frost_runtime.timing`'s, the same code as `python -m
frost_runtime bench`'s (the runtime cannot import bench/, so the one implementation lives there):
`time_ms` is its device time over a settled window of CUDA-graph replays, `alternating` measures
contestants in rotated rounds. A script imports this module first (`import common`): it puts the
repository (frostc, tests) and runtime/ (frost_runtime) on the path, so a script needs no
PYTHONPATH on either machine.
"""

import argparse
import datetime
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "bench" / ".built"  # the plans, carried to the GPU machine, never committed
for _path in (ROOT, ROOT / "runtime"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

ROUNDS = 4  # measurements of each contestant, in rotated order (`alternating`: the median reported)
CEILING_BYTES = 4 << 30  # the buffer `read_ceiling` reads

# ---------------------------------------------------------------------------- the command line

COMMANDS = {"build": "compile the plans (CPU machine)", "run": "time them and print the table (GPU machine)"}


def command_line(doc: str, **commands: str) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """A script's parser (its description: the first line of `doc`) with the commands `build` and
    `run` and those in `commands` (name: help; a help for build or run replaces theirs), and each
    command's parser by name, for the script's own options."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    return parser, {name: sub.add_parser(name, help=text) for name, text in (COMMANDS | commands).items()}


def add_outputs(run: argparse.ArgumentParser) -> None:
    """`--md FILE` and `--json FILE` (`publish`'s md and json_path)."""
    run.add_argument(
        "--md",
        type=Path,
        metavar="FILE",
        help="also write the table (markdown) here, and the raw numbers beside it (FILE.json) unless --json names "
        "their file",
    )
    run.add_argument("--json", dest="json_path", type=Path, metavar="FILE", help="also write the raw numbers here")


def dispatch(parser: argparse.ArgumentParser, functions: dict[str, Callable[..., int]], argv=None) -> int:
    """Parse `argv` (default: the process's arguments) and call the command's function with its
    options as keywords; what it returns is the exit status."""
    options = vars(parser.parse_args(argv))
    return functions[options.pop("command")](**options)


def main(doc: str, build: Callable[[], int], run: Callable[..., int], outputs: bool = True, argv=None) -> int:
    """The command line of a script with `build` and `run` and no options but `run`'s outputs
    (`add_outputs`; none where `outputs` is false)."""
    parser, commands = command_line(doc)
    if outputs:
        add_outputs(commands["run"])
    return dispatch(parser, {"build": build, "run": run}, argv)


# ---------------------------------------------------------------------------------- the plans


def write_plan(path: Path, description) -> None:
    """Compile a description into `path` (written whole or not at all) and say so."""
    from frostc.build import build
    from frostc.planfile import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, build(description))
    print("built", path.stem, flush=True)


def dense_description(name: str, shape: tuple[int, int, int, int], causal: bool, head_dim_v: int | None = None):
    """bf16 attention over (b, h, s, d) tensors q, k, v and o, laid out bhsd; v and o of head dim
    `head_dim_v` where given (DeepSeek's prefill: q/k 192, v/o 128)."""
    from frostc import GraphBuilder

    b, h, s, d = shape
    value_shape = (b, h, s, head_dim_v or d)
    g = GraphBuilder(name)
    for t in ("q", "k", "v", "o"):
        g.tensor(t, dtype="bf16", dims=shape if t in ("q", "k") else value_shape, layout="bhsd")
    g.sdpa(q="q", k="k", v="v", o="o", causal=causal)
    return g.build()


# ----------------------------------------------------------------------------------- timing


def time_ms(fn: Callable[[], object], calls: int | None = None) -> float:
    """Device milliseconds of one call of `fn`, from replays of a CUDA graph of `calls` calls
    (default timing.GRAPH_CALLS) over a settled window (`frost_runtime.timing.device_us`; its
    docstring says why the window is long). Graphs keep every contestant's host launch cost out of
    the number."""
    from frost_runtime import timing  # not at import: bench/model.py's cold start times the runtime's import

    return timing.device_us(fn, graph=True, calls=calls or timing.GRAPH_CALLS)[0] * 1e-3


def alternating(contestants: dict[str, Callable], rounds: int = ROUNDS, measure=time_ms) -> dict[str, float]:
    """Each contestant's median `measure` over `rounds` measurements, the order rotated every
    round. The rotation keeps any order effect left after the settling (bench/NOTES.md v15: the
    first measurement after a pause runs faster) from always favouring one contestant."""
    names = list(contestants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(measure(contestants[name]))
    return {name: statistics.median(xs) for name, xs in samples.items()}


def read_ceiling() -> dict:
    """Bytes per second of the fastest plain read of a 4 GiB buffer (a reduction to a scalar:
    every byte read once, nothing written back but the result). Also the device copy (read +
    write, both counted) for reference."""
    import torch

    x = torch.ones(CEILING_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    readers = {
        "torch.sum of 4 GiB bf16 (fp32 accumulation)": lambda: x.sum(dtype=torch.float32),
        "torch.sum of the same 4 GiB viewed as fp32": lambda: x.view(torch.float32).sum(),
    }
    rates = {name: CEILING_BYTES / (time_ms(fn) * 1e-3) for name, fn in readers.items()}
    best = max(rates, key=rates.get)
    half = x[: x.numel() // 2]
    y = torch.empty_like(half)
    # an elementwise kernel: a captured copy_ becomes a memcpy node, served by the copy engines
    copy = 2 * half.numel() * 2 / (time_ms(lambda: torch.mul(half, 1, out=y)) * 1e-3)
    return {"bytes_per_s": rates[best], "how": best, "all": rates, "copy_read_plus_write": copy}


# ----------------------------------------------------------------------------------- the report


def machine() -> str:
    """The GPU, torch's version and today's date, as each table's first line gives them."""
    import torch

    return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {datetime.date.today().isoformat()}"


def publish(table: str, raw, md: Path | None = None, json_path: Path | None = None) -> None:
    """Print the table; write it to `md`, and the raw numbers to `json_path` (beside `md` as
    .json when no json_path is given)."""
    print(table)
    if md:
        Path(md).write_text(table)
        json_path = json_path or Path(md).with_suffix(".json")
    if json_path:
        Path(json_path).write_text(json.dumps(raw, indent=1))
