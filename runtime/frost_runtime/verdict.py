"""Is a file a valid plan, and can it run on this machine? (`python -m frost_runtime check`,
and `frostc check` through the same functions.)

Validity is `schema.decode_plan`'s (magic, format version, content hash, every field).
Runnability asks the CUDA driver (through cuda-bindings, guarded: a machine without a driver or
a GPU is an answer, not a crash) for each device's compute capability and the driver version,
and judges them with `compatibility_problems`, the very rule `frost_runtime.load` applies.
Nothing is loaded and nothing is launched.

Exit codes: 0 runnable here, 1 valid but not runnable here, 2 invalid, unreadable or not the
pinned plan (`--sha256`).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from frost_runtime import planset, schema

RUNNABLE, NOT_RUNNABLE, INVALID = 0, 1, 2


@dataclass
class Probe:
    devices: list = field(default_factory=list)  # frost_runtime.driver.Device, one per GPU
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


def read_plan(path: str | Path) -> tuple[schema.PlanData | None, str | None]:
    """The plan in the file, or None and why it is not one."""
    try:
        return schema.decode_plan(Path(path).read_bytes()), None
    except FileNotFoundError:
        return None, f"{path}: no such file"
    except OSError as exc:
        return None, f"{path}: cannot read ({exc.strerror})"
    except schema.PlanFormatError as exc:
        return None, f"{path}: {exc}"


def _read_header(path: str | Path) -> tuple[schema.Header | planset.SetHeader | None, str | None]:
    """A plan's header, or a plan set's (every plan in it verified), or None and why neither."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None, f"{path}: no such file"
    except OSError as exc:
        return None, f"{path}: cannot read ({exc.strerror})"
    try:
        return (planset.read_set(data).header if planset.is_set(data) else schema.decode_plan(data).header), None
    except schema.PlanFormatError as exc:
        return None, f"{path}: {exc}"


def _pinned(path: str | Path, sha256) -> tuple[str | None, bool | None, str | None]:
    """(the file's SHA-256, whether the pin allows it (None: no pin), why not): checked before
    the file is decoded, as `frost_runtime.load(..., sha256=)` checks it. A pin that cannot be
    read allows nothing: refused, never ignored."""
    from frost_runtime.integrity import PlanIntegrityError, allowed_sha256, check_sha256, plan_sha256

    try:
        allowed = None if sha256 is None else allowed_sha256(sha256)
    except (ValueError, TypeError) as exc:
        return None, False, str(exc)
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None, None, None  # read_plan reports it
    digest = plan_sha256(data)
    if allowed is None:
        return digest, None, None
    try:
        check_sha256(data, allowed)
    except PlanIntegrityError as exc:
        return digest, False, f"{path}: {exc}"
    return digest, True, None


def check_plan_file(path: str | Path, probe: Callable[[], Probe] | None = None, sha256=None) -> dict:
    """The whole verdict, as `check --json` prints it; `exit_code` included. An invalid or
    unpinned file is judged without probing the GPU. `sha256`: a pin (`frost_runtime.load`'s
    forms), or None."""
    from frost_runtime import compatibility_problems

    result: dict = {"plan": str(path), "valid": False, "error": None, "header": None, "gpu": None, "devices": []}
    result["runnable"] = False
    result["sha256"], result["pinned"], error = _pinned(path, sha256)
    if result["pinned"] is False:
        return result | {"error": error, "exit_code": INVALID}
    h, error = _read_header(path)
    if h is None:
        return result | {"error": error, "exit_code": INVALID}
    result["valid"] = True
    result["header"] = {
        "name": h.name,
        "kind": "set" if isinstance(h, planset.SetHeader) else "plan",
        "format": planset.SET_FORMAT_VERSION if isinstance(h, planset.SetHeader) else schema.FORMAT_VERSION,
        "frostc_version": h.frostc_version,
        "cutlass_dsl_version": h.cutlass_dsl_version,
        "target_arch": h.target_arch,
        "min_driver": h.min_driver,
        "content_hash": h.content_hash,
    }
    found = (probe or probe_gpus)()
    devices = []
    for d in found.devices:
        problems = compatibility_problems(h.target_arch, h.min_driver, d)
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


def check_lines(result: dict) -> list[str]:
    """The verdict as plain text, one line each."""
    if not result["valid"]:
        return [f"{'not the pinned plan' if result['pinned'] is False else 'invalid'}: {result['error']}"]
    h = result["header"]
    lines = [
        f"{result['plan']}: a valid {_kind_text(h)} {h['name']} (format {h['format']}, target {h['target_arch']}, "
        f"min driver {version_text(h['min_driver'])}, frostc {h['frostc_version']}, "
        f"cutlass-dsl {h['cutlass_dsl_version']}; content hash verified)",
        f"sha256 {result['sha256']}{'; the pinned plan' if result['pinned'] else ''}",
    ]
    gpu = result["gpu"]
    if not gpu["found"]:
        lines.append(gpu["reason"])
    for d in result["devices"]:
        cc = "".join(map(str, d["compute_capability"]))
        verdict = "can run it" if d["runnable"] else "cannot run it: " + "; ".join(d["problems"])
        lines.append(
            f"GPU {d['ordinal']}: {d['name']} (sm_{cc}, driver {version_text(gpu['driver_version'])}) {verdict}"
        )
    lines.append("runnable here" if result["runnable"] else "not runnable here")
    return lines


def _kind_text(header: dict) -> str:
    return "plan set" if header.get("kind") == "set" else "plan"


def version_text(v: int | None) -> str:
    """A cuDriverGetVersion() number as "13.0"."""
    return "unknown" if v is None else f"{v // 1000}.{v % 1000 // 10}"
