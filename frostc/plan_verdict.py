"""`frostc check PLAN`: is the file a valid plan, and can it run on this machine?

The verdict is the runtime's own (`frost_runtime.verdict`, also `python -m frost_runtime check`
where only the runtime is installed); this module renders it with rich.

Exit codes: 0 runnable here, 1 valid but not runnable here, 2 invalid, unreadable or not the
pinned plan (`--sha256`).
"""

from collections.abc import Callable
from pathlib import Path

from frost_runtime import verdict as runtime_verdict
from frost_runtime.driver import Device as GpuDevice  # what compatibility_problems reads
from frost_runtime.verdict import INVALID, NOT_RUNNABLE, RUNNABLE, Probe, probe_gpus, version_text

__all__ = ["INVALID", "NOT_RUNNABLE", "RUNNABLE", "GpuDevice", "Probe", "check_plan_file", "print_check", "probe_gpus"]


def check_plan_file(path: str | Path, probe: Callable[[], Probe] | None = None, sha256=None) -> dict:
    """The whole verdict, as the JSON `frostc check --json` prints; `exit_code` included.
    `sha256`: the pin (`frost_runtime.load`'s forms), or None."""
    return runtime_verdict.check_plan_file(path, probe or probe_gpus, sha256)


def print_check(result: dict, console) -> None:
    from rich.markup import escape

    if not result["valid"]:
        verdict = "not the pinned plan" if result["pinned"] is False else "invalid"
        console.print(f"[bold red]{verdict}:[/bold red] {escape(result['error'])}", highlight=False)
        return
    h = result["header"]
    kind = "plan set" if h["kind"] == "set" else "plan"
    console.print(
        f"{escape(result['plan'])}: a valid {kind} [bold]{escape(h['name'])}[/bold] (format {h['format']}, "
        f"target {h['target_arch']}, min driver {version_text(h['min_driver'])}, "
        f"frostc {escape(h['frostc_version'])}, cutlass-dsl {escape(h['cutlass_dsl_version'])}; "
        "content hash verified)",
        highlight=False,
    )
    pinned = "; the pinned plan" if result["pinned"] else ""
    console.print(f"sha256 {result['sha256']}{pinned}", highlight=False)
    gpu = result["gpu"]
    if not gpu["found"]:
        console.print(f"{escape(gpu['reason'])}", highlight=False)
    for d in result["devices"]:
        cc = "".join(map(str, d["compute_capability"]))
        verdict = "can run it" if d["runnable"] else "cannot run it: " + "; ".join(d["problems"])
        where = f"sm_{cc}, driver {version_text(gpu['driver_version'])}"
        console.print(f"GPU {d['ordinal']}: {escape(d['name'])} ({where}) {escape(verdict)}", highlight=False)
    if result["runnable"]:
        console.print("[bold green]runnable here[/bold green]")
    else:
        console.print("[bold yellow]not runnable here[/bold yellow]")
