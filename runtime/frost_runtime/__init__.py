"""frost_runtime: load a frostc plan and launch it. Imports neither frostc nor cutlass.

plan = frost_runtime.load("plan.frost")        # checks, loads the kernels once
plan = frost_runtime.load("plan.frost", sha256=pin)  # only that plan (a hash, hashes or a file of them)
plan.execute(q, k, v, o, lse)                  # buffers in slot order, on torch's current stream
plan.execute_named(q=q, k=k, v=v, o=o, lse=lse, stream=s)
bound = plan.bind(q, k, v, o, lse, workspace=ws)  # check once; bound.execute() only launches
plan.close()                                   # or `with frost_runtime.load(...) as plan:`
plans = frost_runtime.read_set("model.frostset")  # a plan set: verified, nothing on the GPU
step = plans.load(plans.select("decode", "l0", batch=24))  # the smallest bucket that takes 24

Errors, each naming the plan and what to do: PlanFormatError (a corrupt or foreign file;
PlanIntegrityError: not the plan `sha256=` pins),
CompatibilityError (this GPU or driver cannot run it; LoadError: the driver refused a kernel),
BindError (a buffer does not match its slot; LengthError from check_lengths), WorkspaceError
(allocate_workspace: out of GPU memory), LaunchError (the driver refused a launch; ContextError:
another CUDA context is current), PlanClosedError.
"""

import os

from frost_runtime.integrity import Pin, PlanIntegrityError, allowed_sha256, check_sha256, plan_sha256
from frost_runtime.plan import (
    BindError,
    BoundPlan,
    CompatibilityError,
    ContextError,
    LaunchError,
    LengthError,
    LoadError,
    Plan,
    PlanClosedError,
    WorkspaceError,
)
from frost_runtime.planset import PlanSet, read_set
from frost_runtime.schema import PlanData, PlanFormatError, decode_plan, read_header

__all__ = [
    "BindError",
    "BoundPlan",
    "CompatibilityError",
    "ContextError",
    "LaunchError",
    "LengthError",
    "LoadError",
    "Pin",
    "Plan",
    "PlanClosedError",
    "PlanData",
    "PlanFormatError",
    "PlanIntegrityError",
    "PlanSet",
    "WorkspaceError",
    "allowed_sha256",
    "compatibility_problems",
    "load",
    "plan_sha256",
    "read_header",
    "read_set",
    "verify_plan",
]
__version__ = "0.1.0"


def load(source: str | os.PathLike | bytes, *, sha256: Pin | None = None) -> Plan:
    """Read, verify and load a plan on the current CUDA context (the current device's primary
    context when none is current). Raises PlanIntegrityError for a plan `sha256` does not allow
    (see `verify_plan`), PlanFormatError for a corrupt or foreign file and CompatibilityError when
    this machine cannot run it (no GPU or driver, another architecture, an older driver; LoadError
    when the driver refuses a kernel); nothing is loaded then."""
    data = verify_plan(source, sha256=sha256)
    try:
        from frost_runtime import driver  # the GPU is needed from here on

        context, device = driver.current_context()
    except Exception as exc:  # no libcuda, no GPU, no cuda-bindings: cannot run here, said so
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CompatibilityError(
            f"plan {data.header.name!r} cannot run here: no usable CUDA GPU and driver ({type(exc).__name__}: "
            f"{why}); load it on a machine with an {data.header.target_arch} GPU (`frostc check PLAN` says what "
            "this one has)"
        ) from exc
    problems = compatibility_problems(data.header.target_arch, data.header.min_driver, device)
    if problems:
        raise CompatibilityError(f"plan {data.header.name!r} cannot run here: " + "; ".join(problems))
    return Plan(data, device, context)


def verify_plan(source: str | os.PathLike | bytes, *, sha256: Pin | None = None) -> PlanData:
    """Everything `load` checks before it touches the GPU: the pin, then the file (format,
    content hash, every field). `sha256`: the SHA-256 hex of the one plan allowed, a collection
    of them, or an allow-list file (a path; one per line, `sha256sum` output accepted); None
    pins nothing. The file is read once: the bytes hashed are the bytes decoded."""
    data = _read(source)
    if sha256 is not None:
        check_sha256(data, sha256)
    return decode_plan(data)


def _read(source) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    with open(source, "rb") as f:
        return f.read()


def compatibility_problems(target_arch: str, min_driver: int, device) -> list[str]:
    """Why a plan for `target_arch` cannot run on `device` (empty when it can).

    An `sm_XYa` cubin runs only on compute capability X.Y exactly; a plain `sm_XY` cubin runs
    on X.Y and later minors of the same major."""
    problems = []
    arch = target_arch.removeprefix("sm_")
    digits = arch.rstrip("af")
    if not digits.isdigit() or len(digits) < 2:
        return [f"unknown target architecture {target_arch!r}"]
    major, minor = int(digits[:-1]), int(digits[-1])
    cc = tuple(device.compute_capability)
    exact = arch.endswith(("a", "f"))
    if (exact and cc != (major, minor)) or (not exact and (cc[0] != major or cc[1] < minor)):
        problems.append(
            f"built for {target_arch} but {device.name} is sm_{cc[0]}{cc[1]}; rebuild with target = "
            f'"sm_{cc[0]}{cc[1]}a" if frostc supports it'
        )
    if device.driver_version < min_driver:
        problems.append(
            f"needs CUDA driver {_version(min_driver)} or newer, this one is {_version(device.driver_version)}"
        )
    return problems


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"
