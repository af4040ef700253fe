"""`transformers serve --continuous-batching` with frostc's attention (transformers 5.23, its
`serving` extra installed):

    python -m frost_runtime.hf.serve MODEL --plans SET.frostset [transformers serve's options]

The command registers frostc's continuous-batching attention, `frostc_cb`, in this process. With
`--plans` it runs the set's mixed plans; without, it runs the fp32 torch reference (a check on any
machine). It then runs transformers' own `serve` command, adding `--continuous-batching` and
`--attn-implementation frostc_cb`, plus `--cb-block-size` from the set's page size.

The server must load its model in the process that registered the name, which is why this is a
command of its own. transformers' `serve` checks `--attn-implementation` against a fixed list;
cb_patches.py lets the registered name through.

Give `--cb-num-blocks` the `--cb-blocks` the set was built with (`frostc from-config --cb-tokens
... --cb-blocks N`); the plans refuse another pool by name.
"""

from __future__ import annotations

import sys

from frost_runtime.hf import continuous

USAGE = "python -m frost_runtime.hf.serve MODEL [--plans SET.frostset] [transformers serve options]"


def serve_arguments(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the plan set's path or None, transformers serve's arguments with frostc's attention)."""
    args, plans = list(argv), None
    if "--plans" in args:
        at = args.index("--plans")
        if at + 1 >= len(args):
            raise SystemExit(f"--plans needs a plan set's path: {USAGE}")
        plans = args[at + 1]
        del args[at : at + 2]
    for flag in ("--attn-implementation", "--attn_implementation"):
        if flag in args:
            given = args[args.index(flag) + 1] if args.index(flag) + 1 < len(args) else ""
            if given != continuous.NAME:
                raise SystemExit(f"{flag} {given}: this command serves frostc's attention ({continuous.NAME}); "
                                 "leave the flag out, or run transformers serve itself")  # fmt: skip
    if "--no-continuous-batching" in args:
        raise SystemExit("--no-continuous-batching: frostc's attention serves continuous batching; leave it out")
    extra = ["--continuous-batching"] if "--continuous-batching" not in args else []
    if not any(f in args for f in ("--attn-implementation", "--attn_implementation")):
        extra += ["--attn-implementation", continuous.NAME]
    return plans, args + extra


def main(argv: list[str] | None = None) -> int:
    plans_path, args = serve_arguments(sys.argv[1:] if argv is None else argv)
    plans = None
    if plans_path is not None:
        import frost_runtime

        plans = frost_runtime.read_set(plans_path)
        if not any(flag in args for flag in ("--cb-block-size", "--cb_block_size")):
            args += ["--cb-block-size", str(plans.serving.page_size)]
    continuous.install(None, plans)  # registers frostc_cb; a model loaded with it runs the plans
    from transformers.cli.transformers import app

    try:
        app(["serve", *args], prog_name="transformers")
    except SystemExit as done:
        return int(done.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
