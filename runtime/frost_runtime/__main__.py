"""`python -m frost_runtime bench|check PLAN`: what a machine with only the runtime can say
about a plan (trtexec --loadEngine's job). Exit codes: 0 success (check: runnable here), 1 valid
but not runnable here (no GPU, another GPU, an old driver; or a failure on the GPU), 2 invalid
plan or bad arguments."""

import argparse
import json
import sys

from frost_runtime import bench, timing, verdict, workload


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m frost_runtime",
        description="Benchmark or check a frostc plan where only the runtime is installed.",
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="{bench,check}")

    b = commands.add_parser(
        "bench",
        help="time a plan on this GPU (device time, host time, TFLOP/s or TB/s)",
        description="Time a plan on this GPU with buffers made from its slots: device time per execute (CUDA "
        f"events over a window after {timing.SETTLE_S:g} s of settling), host time of bound.execute() beside the "
        "driver's launch floor, and TFLOP/s (attention) or TB/s (paged decode: KV bytes read). Exit 0 measured, "
        "1 not runnable here (no GPU, another GPU, an old driver) or failed on the GPU, 2 invalid plan or arguments.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="--lengths SPEC [SPEC ...]:\n" + workload.LENGTHS_HELP,
    )
    b.add_argument("plan", help="plan file (.frost)")
    b.add_argument(
        "--duration",
        type=_positive_float,
        default=timing.WINDOW_S,
        metavar="S",
        help=f"seconds of the timed window, after {timing.SETTLE_S:g} s of settling (default {timing.WINDOW_S:g})",
    )
    b.add_argument("--graph", action="store_true", help="time executes replayed from a CUDA graph")
    b.add_argument(
        "--lengths", nargs="+", metavar="SPEC", help="full (default), random, N, N,N,... or SLOT=SPEC; see below"
    )
    b.add_argument("--seed", type=int, default=0, help="seed of the random data, lengths and page tables (default 0)")
    b.add_argument("--json", action="store_true", help="the report as JSON")

    c = commands.add_parser(
        "check",
        help="is the file a valid plan, can this machine run it? (launches nothing)",
        description="Validate a plan and say whether it can run on this machine's GPU and driver; launches "
        "nothing. Exit 0 runnable, 1 valid but not runnable here (or no GPU), 2 invalid, unreadable or not the "
        "pinned plan.",
    )
    c.add_argument("plan", help="plan file (.frost)")
    c.add_argument("--sha256", help="require this plan: its SHA-256 (hex), or a file of allowed ones (sha256sum)")
    c.add_argument("--json", action="store_true", help="the verdict as JSON")
    return top


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "check":
        return _check(args)
    return _bench(args)


def _check(args) -> int:
    result = verdict.check_plan_file(args.plan, sha256=args.sha256)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        stream = sys.stdout if result["valid"] else sys.stderr
        print("\n".join(verdict.check_lines(result)), file=stream)
    return result["exit_code"]


def _bench(args) -> int:
    """The file and --lengths first (exit 2), then whether this machine can run the plan (exit
    1): each an answer, not a traceback. Then measure."""
    data, error = verdict.read_plan(args.plan)
    if data is None:
        return _fail(args, verdict.INVALID, error)
    try:
        workload.make_lengths(data, args.lengths, args.seed)
    except workload.LengthSpecError as exc:
        return _fail(args, verdict.INVALID, str(exc))
    judged = verdict.check_plan_file(args.plan)
    if judged["exit_code"] != verdict.RUNNABLE:
        why = "; ".join(verdict.check_lines(judged)[2:-1])
        return _fail(args, judged["exit_code"], f"{args.plan}: not runnable here: {why}")
    from frost_runtime.plan import BindError, CompatibilityError

    try:
        result = bench.run(args.plan, args.duration, args.graph, args.lengths, args.seed)
    except (bench.BenchError, CompatibilityError, BindError, RuntimeError, OSError) as exc:
        return _fail(args, verdict.NOT_RUNNABLE, f"{type(exc).__name__}: {exc}")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(bench.report_lines(result)))
    return 0


def _fail(args, code: int, message: str) -> int:
    if args.json:
        print(json.dumps({"plan": args.plan, "error": message, "exit_code": code}, indent=2))
    print(f"bench: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
