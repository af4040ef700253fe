"""`frostc build` and `frostc inspect`. Exit codes: 0 success, 2 bad input (nothing written)."""

import json
import sys
from pathlib import Path

import typer
from frost_runtime import schema
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from frostc.errors import FrostcError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="A plan compiler for attention on NVIDIA GPUs.",
)
out = Console()
err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/bold red] {message}", highlight=False)
    raise typer.Exit(2)


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
    except FileNotFoundError as exc:
        _fail(f"{exc.filename}: no such file")
    except FrostcError as exc:
        _fail(f"{description} is not a plan frostc can build:\n{exc}")
    write_atomic(output, data)
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
    """Print a plan's header, slots, kernels, launches and workspace. Needs no GPU."""
    from frostc.inspect import plan_summary, print_plan

    data = _read_plan(plan)
    if as_json:
        sys.stdout.write(json.dumps(plan_summary(data), indent=2) + "\n")
    else:
        print_plan(data, out)


def _read_plan(path: Path) -> schema.PlanData:
    try:
        return schema.decode_plan(path.read_bytes())
    except FileNotFoundError:
        _fail(f"{path}: no such file")
    except schema.PlanFormatError as exc:
        _fail(f"{path}: {exc}")


def main() -> None:
    app()
