"""`transformers serve --continuous-batching` with frostc's attention (transformers 5.23, its
`serving` extra installed):

    python -m frost_runtime.hf.serve MODEL --plans SET.frostset [--fuse] [transformers serve's options]

The command registers frostc's continuous-batching attention, `frostc_cb`, in this process. With
`--plans` it runs the set's mixed plans; without, it runs the fp32 torch reference (a check on any
machine). It then runs transformers' own `serve` command, adding `--continuous-batching` and
`--attn-implementation frostc_cb`, plus `--cb-block-size` from the set's page size.

The server must load its model in the process that registered the name, which is why this is a
command of its own. transformers' `serve` checks `--attn-implementation` against a fixed list;
cb_patches.py lets the registered name through.

`--fuse`: the model's decoder layers fused as it loads (frost_runtime.hf_fuse: one QKV GEMM, rotary
in place, the norms and SiLU's product through the set's glue plans where it has them: a set built
with `--glue`); Llama-family models only, refused by name otherwise.

Give `--cb-num-blocks` the `--cb-blocks` the set was built with (`frostc from-config --cb-tokens
... --cb-blocks N`); the plans refuse another pool by name.
"""

from __future__ import annotations

import functools
import sys

from frost_runtime.hf import continuous

USAGE = "python -m frost_runtime.hf.serve MODEL [--plans SET.frostset] [--fuse] [transformers serve options]"
OPTIONS = ("--plans", "--fuse")  # this command's own; the rest are transformers serve's
_FUSE: dict = {"on": False, "plans": None}  # what a loaded model gets: read by the patched loader


def fuse_on_load(on: bool, plans=None) -> None:
    """Have `transformers serve` fuse each model it loads from now on (hf_fuse.fuse_layers, with
    `plans`' glue plans), or stop doing so (`on` False)."""
    from transformers.cli.serving import model_manager

    _FUSE.update(on=on, plans=plans)
    manager = model_manager.ModelManager
    if not getattr(manager._load_model, "frostc_fuses", False):
        manager._load_model = _fusing(manager._load_model)


def _fusing(load):
    @functools.wraps(load)
    def _load_model(self, *args, **kwargs):
        model = load(self, *args, **kwargs)
        if _FUSE["on"]:
            from frost_runtime import hf_fuse

            hf_fuse.fuse_layers(model, _FUSE["plans"])
        return model

    _load_model.frostc_fuses = True
    return _load_model


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
    argv = list(sys.argv[1:] if argv is None else argv)
    fuse = "--fuse" in argv
    if fuse:
        argv.remove("--fuse")
    plans_path, args = serve_arguments(argv)
    plans = None
    if plans_path is not None:
        import frost_runtime

        plans = frost_runtime.read_set(plans_path)
        if not any(flag in args for flag in ("--cb-block-size", "--cb_block_size")):
            args += ["--cb-block-size", str(plans.serving.page_size)]
    continuous.install(None, plans)  # registers frostc_cb; a model loaded with it runs the plans
    fuse_on_load(fuse, plans)
    from transformers.cli.transformers import app

    try:
        app(["serve", *args], prog_name="transformers")
    except SystemExit as done:
        return int(done.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
