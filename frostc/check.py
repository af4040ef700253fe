"""`frostc check PLAN`: is the file a valid plan, and can it run on this machine?

Validity is the runtime's own (`frost_runtime.schema.decode_plan`: magic, format version, content
hash, every field). Runnability asks the CUDA driver (through cuda-bindings, guarded: a machine
without a driver or a GPU is an answer, not a crash) for each device's compute capability and
the driver version, and judges them with the runtime's `compatibility_problems`, the very rule
`frost_runtime.load` applies. Nothing is loaded and nothing is launched. With `--sha256` the
file must also be a pinned plan, checked as `frost_runtime.load(..., sha256=)` checks it.

Exit codes: 0 runnable here, 1 valid but not runnable here, 2 invalid, unreadable or not pinned.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import frost_runtime
from frost_runtime import schema
from frost_runtime.driver import Device as GpuDevice  # what compatibility_problems reads
from frost_runtime.integrity import check_sha256

RUNNABLE, NOT_RUNNABLE, INVALID = 0, 1, 2


@dataclass
class Probe:
    devices: list[GpuDevice] = field(default_factory=list)
    driver_version: int | None = None
    reason: str | None = None  # why there is no device, when there is none


def probe_gpus() -> Probe:
    """The CUDA devices of this machine and the driver's version; never raises."""
    try:
        from cuda.bindings import driver as cu
    except Exception as exc:  # not installed, or a broken install
        return Probe(reason=f"no GPU/driver found (cuda-bindings unavailable: {_first_line(exc)})")
    try:
        (err,) = cu.cuInit(0)
    except Exception as exc:  # libcuda.so itself is missing: cuda-bindings raises at the first call
        return Probe(reason=f"no GPU/driver found (libcuda could not be loaded: {type(exc).__name__})")
    if err != cu.CUresult.CUDA_SUCCESS:
        return Probe(reason=f"no GPU/driver found (cuInit: {_error_name(cu, err)})")
    try:
        err, version = cu.cuDriverGetVersion()
        err2, count = cu.cuDeviceGetCount()
        if err2 != cu.CUresult.CUDA_SUCCESS or count == 0:
            return Probe(driver_version=int(version), reason="no GPU/driver found (the driver sees no CUDA device)")
        from frost_runtime.driver import describe_device

        devices = [describe_device(cu.cuDeviceGet(i)[1]) for i in range(count)]
        return Probe(devices=devices, driver_version=int(version))
    except Exception as exc:
        return Probe(reason=f"no GPU/driver found (querying the devices failed: {_first_line(exc)})")


def _error_name(cu, err) -> str:
    try:
        name = cu.cuGetErrorName(err)[1]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return str(err)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def check_plan_file(
    path: str | Path, probe: Callable[[], Probe] | None = None, sha256: frost_runtime.Pin | None = None
) -> dict:
    """The whole verdict, as the JSON `frostc check --json` prints; `exit_code` included.
    `sha256`: the pin (`frost_runtime.load`'s), or None."""
    path = Path(path)
    result: dict = {"plan": str(path), "valid": False, "error": None, "header": None, "gpu": None, "devices": []}
    result |= {"runnable": False, "sha256": None, "pinned": None}
    try:
        allowed = None if sha256 is None else frost_runtime.allowed_sha256(sha256)
    except (ValueError, TypeError) as exc:  # a pin that cannot be read allows nothing: refused, never ignored
        return result | {"error": str(exc), "exit_code": INVALID}
    try:
        data = path.read_bytes()
        result["sha256"] = frost_runtime.plan_sha256(data)
        if allowed is not None:
            check_sha256(data, allowed)
            result["pinned"] = True
        plan = schema.decode_plan(data)
    except FileNotFoundError:
        return result | {"error": f"{path}: no such file", "exit_code": INVALID}
    except OSError as exc:
        return result | {"error": f"{path}: cannot read ({exc.strerror})", "exit_code": INVALID}
    except frost_runtime.PlanIntegrityError as exc:
        return result | {"error": f"{path}: {exc}", "pinned": False, "exit_code": INVALID}
    except schema.PlanFormatError as exc:
        return result | {"error": f"{path}: {exc}", "exit_code": INVALID}
    h = plan.header
    result["valid"] = True
    result["header"] = {
        "name": h.name,
        "format": schema.FORMAT_VERSION,
        "frostc_version": h.frostc_version,
        "cutlass_dsl_version": h.cutlass_dsl_version,
        "target_arch": h.target_arch,
        "min_driver": h.min_driver,
        "content_hash": h.content_hash,
    }
    found = (probe or probe_gpus)()
    devices = []
    for d in found.devices:
        problems = frost_runtime.compatibility_problems(h.target_arch, h.min_driver, d)
        devices.append(
            {
                "ordinal": d.ordinal,
                "name": d.name,
                "compute_capability": list(d.compute_capability),
                "runnable": not problems,
                "problems": problems,
            }
        )
    result["gpu"] = {"found": bool(devices), "reason": found.reason, "driver_version": found.driver_version}
    result["devices"] = devices
    result["runnable"] = any(d["runnable"] for d in devices)
    result["exit_code"] = RUNNABLE if result["runnable"] else NOT_RUNNABLE
    return result


def print_check(result: dict, console) -> None:
    from rich.markup import escape

    if not result["valid"]:
        verdict = "not the pinned plan" if result["pinned"] is False else "invalid"
        console.print(f"[bold red]{verdict}:[/bold red] {escape(result['error'])}", highlight=False)
        return
    h = result["header"]
    console.print(
        f"{escape(result['plan'])}: a valid plan [bold]{escape(h['name'])}[/bold] (format {h['format']}, "
        f"target {h['target_arch']}, min driver {_version(h['min_driver'])}, frostc {escape(h['frostc_version'])}, "
        f"cutlass-dsl {escape(h['cutlass_dsl_version'])}; content hash verified)",
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
        where = f"sm_{cc}, driver {_version(gpu['driver_version'])}"
        console.print(f"GPU {d['ordinal']}: {escape(d['name'])} ({where}) {escape(verdict)}", highlight=False)
    if result["runnable"]:
        console.print("[bold green]runnable here[/bold green]")
    else:
        console.print("[bold yellow]not runnable here[/bold yellow]")


def _version(v: int | None) -> str:
    return "unknown" if v is None else f"{v // 1000}.{v % 1000 // 10}"
