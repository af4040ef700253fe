"""Golden plans: `python -m frostc.golden [--update]`.

Every description in plans/golden/*.toml is rebuilt and its canonical rendering (exactly what
`frostc inspect --json` prints) compared, through `frostc.diff`, with the committed
plans/golden/<name>.json. The differences are printed; the exit code is 1 on any, 2 when a
description does not build or a file cannot be read or written (never a traceback; 3 for a
frostc bug). `--update` rewrites the JSON files instead (review the diff, commit).

Renderings, not plan files, are committed: a plan is ~90 KB of cubin that changes with every
kernel edit; its rendering holds the cubin's SHA-256 and size, which show such a change as well.

Compared: everything in the rendering except `header.build_key` and the two hashes over it.
The build key hashes the compiler's own sources, so any commit that touches frostc/ changes it,
even one that leaves every kernel and launch the same; comparing it would force regenerating the
goldens on every commit. The content hash seals the header (the build key included) with the
body, and `header.sha256` is the whole file's, so both move with it. What a source change does
to a plan shows in the fields that matter: the rendering holds every body field (each cubin and
tensor map by its hash). It holds no machine-dependent values (no paths, no times), and builds
are deterministic (tests/test_determinism.py), so the goldens hold on any build machine with the
same frostc and DSL versions.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from frost_runtime import schema
from rich.console import Console
from rich.markup import escape

from frostc.diff import diff_summaries, print_diff
from frostc.errors import INPUT_ERRORS, FrostcError, input_error_message, internal_error_message
from frostc.inspect import plan_summary

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "plans" / "golden"
IGNORED = ("header.build_key", "header.content_hash", "header.sha256")


def render(plan: schema.PlanData) -> str:
    """The canonical JSON, byte for byte what `frostc inspect --json` prints."""
    return json.dumps(plan_summary(plan), indent=2) + "\n"


def build_rendering(description: Path) -> str:
    from frostc.build import build
    from frostc.description import load_description

    return render(schema.decode_plan(build(load_description(description))))


def run(folder: Path = GOLDEN_DIR, update: bool = False, console: Console | None = None) -> int:
    console = console or Console()
    descriptions = sorted(folder.glob("*.toml"))
    if not descriptions:
        console.print(f"no golden descriptions (*.toml) in {escape(str(folder))}", highlight=False)
        return 2
    failed = broken = 0
    for desc in descriptions:
        golden = desc.with_suffix(".json")
        try:
            fresh = build_rendering(desc)
        except FrostcError as exc:
            console.print(
                f"[bold red]{escape(desc.name)}: does not build[/bold red]\n{escape(str(exc))}", highlight=False
            )
            broken += 1
            continue
        if update:
            if not golden.exists() or golden.read_text() != fresh:
                golden.write_text(fresh)
                console.print(f"updated {escape(golden.name)}", highlight=False)
            else:
                console.print(f"unchanged {escape(golden.name)}", highlight=False)
            continue
        if not golden.exists():
            console.print(f"[bold red]{escape(golden.name)}: missing[/bold red] (run with --update)", highlight=False)
            failed += 1
            continue
        try:
            committed = json.loads(golden.read_text())
        except (OSError, UnicodeError, RecursionError, json.JSONDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else f"not valid JSON: {exc}"
            console.print(
                f"[bold red]{escape(golden.name)}: unreadable[/bold red] ({escape(str(why))})", highlight=False
            )
            failed += 1
            continue
        diffs = diff_summaries(committed, json.loads(fresh), ignore=IGNORED)
        if diffs:
            failed += 1
            console.print(
                f"[bold red]{escape(desc.stem)}: differs from {escape(golden.name)}[/bold red]", highlight=False
            )
            print_diff(diffs, console, a=f"{golden.name} (committed)", b="fresh build")
        else:
            console.print(f"{escape(desc.stem)}: matches {escape(golden.name)}", highlight=False)
    if broken:
        return 2
    if failed:
        console.print(
            f"{failed} golden plan(s) differ; if the change is intended: python -m frostc.golden --update",
            highlight=False,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m frostc.golden", description=__doc__.split("\n\n")[1])
    parser.add_argument("--update", action="store_true", help="rewrite the committed JSON renderings")
    parser.add_argument("--dir", type=Path, default=GOLDEN_DIR, help="folder of golden descriptions")
    args = parser.parse_args(argv)
    err = Console(stderr=True)
    try:
        return run(args.dir, args.update)
    except INPUT_ERRORS as exc:  # e.g. --update cannot write
        err.print(f"[bold red]error:[/bold red] {escape(input_error_message(exc))}", highlight=False)
        return 2
    except Exception as exc:  # a frostc bug: one message, as the CLI says it
        if os.environ.get("FROSTC_TRACEBACK"):
            raise
        err.print(escape(internal_error_message(exc)), highlight=False)
        return 3


if __name__ == "__main__":
    sys.exit(main())
