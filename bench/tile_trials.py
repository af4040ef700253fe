"""Candidate tiles of the 16-bit forward kernel for one head dim, built beside the chosen ones so
that one GPU call times them all (kernel tuning; nothing here changes what frostc chooses).

    python bench/tile_trials.py build --head-dim 96 --candidates 192x96x2,192x96x3
    python bench/tile_trials.py build --head-dim 192 --head-dim-v 128 --candidates 192x64x2,128x96x2
    # then, on the GPU machine, per candidate (bash bench/gpu_checks.sh tiles runs them all):
    SDPA_PLANS=bench/.built/tiles/d96-192x96x2 python bench/sdpa.py run --head-dims 96

A candidate is block_m x block_n x stages (block_m / 64 consumer warpgroups, O in its own
buffer, or through Q's where its own does not fit). Each builds bench/sdpa.py's rows of that head
dim (and v's: `--head-dim-v`, DeepSeek's 192/128), with the same plan names, into
bench/.built/tiles/d{D}[v{DV}]-{candidate}/, its tiles put in place of `tiles_for_head_dim`'s for
that pair (16-bit, no left window) while it builds. A candidate whose kernel keeps a stack frame
(a spill: frostc.cubin_info) or does not fit shared memory is reported and skipped.
bench/sdpa.py checks each plan's output against cuDNN before it times it.
"""

import argparse
import contextlib
import sys
from pathlib import Path

import common
import sdpa

TRIALS = common.BUILT / "tiles"


def parse(candidate: str) -> tuple[int, int, int]:
    """ "192x96x2" -> (block_m, block_n, stages)."""
    block_m, block_n, stages = (int(x) for x in candidate.split("x"))
    if block_m % 64 or block_m // 64 not in (2, 3):
        raise SystemExit(f"{candidate}: block_m must be 128 or 192 (two or three consumer warpgroups of 64 rows)")
    return block_m, block_n, stages


@contextlib.contextmanager
def tiles_in_place(head_dim: int, block_m: int, block_n: int, stages: int, head_dim_v: int = 0, o_buffer=True):
    """`tiles_for_head_dim` answering the candidate for `head_dim` (and `head_dim_v`: 0, v's the
    same; 16-bit, no left window) while the plans build; the kernel module and the choice module
    both hold the function."""
    import frostc.compile as compile_stage
    import frostc.kernels.sdpa_fwd_wgmma as forward
    import frostc.ops.sdpa_choice as choice

    chosen = forward.tiles_for_head_dim
    consumers = block_m // 64
    candidate = forward.WgmmaTiles(
        block_m=block_m, block_n=block_n, consumers=consumers, stages=stages, o_buffer=o_buffer
    )

    pair_v = head_dim_v

    def trial(d, window_left, fp8=False, three_consumers=False, head_dim_v=0):
        if d == head_dim and not window_left and not fp8 and head_dim_v == pair_v:
            return candidate
        return chosen(d, window_left, fp8, three_consumers, head_dim_v)

    forward.tiles_for_head_dim = choice.tiles_for_head_dim = trial
    compile_stage._cache.clear()  # kept by variant, whose name does not hold its tiles
    try:
        yield
    finally:
        forward.tiles_for_head_dim = choice.tiles_for_head_dim = chosen
        compile_stage._cache.clear()


def build(head_dim: int, candidates: str, head_dim_v: int = 0) -> int:
    value_dim = head_dim_v or head_dim
    shapes = [s for s in sdpa.SHAPES if s[3] == head_dim and sdpa.dims(s)[4] == value_dim]
    if not shapes:
        raise SystemExit(f"--head-dim {head_dim} (v {value_dim}): bench/sdpa.py has no rows of that pair")
    pair = f"d{head_dim}" + (f"v{head_dim_v}" if head_dim_v else "")
    for candidate in candidates.split(","):
        for o_buffer in (True, False):  # O in its own buffer, else through Q's where that does not fit
            with tiles_in_place(head_dim, *parse(candidate), head_dim_v=head_dim_v, o_buffer=o_buffer):
                outcome = _build_candidate(TRIALS / f"{pair}-{candidate}", candidate, shapes)
            if outcome != "shared memory":
                break
    return 0


def _build_candidate(folder: Path, candidate: str, shapes) -> str:
    """The candidate's plans into `folder`; none where one of them does not build or spills.
    Returns "built", "spills", "shared memory" or "does not build"."""
    from frost_runtime.schema import decode_plan

    from frostc.build import build as build_plan
    from frostc.cubin_info import resources
    from frostc.planfile import write_atomic

    built = {}
    for shape in shapes:
        b, h, s, d, dv = sdpa.dims(shape)
        for causal in (False, True):
            name = sdpa.plan_name(shape, causal)
            try:
                data = build_plan(common.dense_description(name, (b, h, s, d), causal, dv))
            except Exception as exc:  # the DSL's refusal (shared memory, a layout): this candidate is out
                message = str(exc).splitlines()[0][:160]
                print(f"{candidate}: {name} does not build ({message}): skipped")
                return "shared memory" if "shared memory" in str(exc) else "does not build"
            kernel = decode_plan(data).kernels[0]
            used = resources(kernel.cubin)
            print(f"{candidate}: {name} {kernel.name} {used.registers} registers, "
                  f"{used.stack_bytes} B stack, {kernel.smem_bytes:,} B shared")  # fmt: skip
            if used.stack_bytes:
                print(f"{candidate}: spills (a stack frame): skipped")
                return "spills"
            built[name] = data
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in built.items():
        write_atomic(folder / f"{name}.frost", data)
    return "built"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--head-dim", type=int, required=True)
    parser.add_argument("--head-dim-v", type=int, default=0, help="v's and o's head dim where not q's (192: 128)")
    parser.add_argument("--candidates", required=True, help="block_m x block_n x stages, comma-separated")
    args = parser.parse_args(argv)
    return build(args.head_dim, args.candidates, args.head_dim_v)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))
    sys.exit(main())
