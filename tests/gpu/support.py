"""What the GPU tests share: where the plans are (tests/.built, built on the CPU machine by
`python -m tests.gpu.build_plans`) and why the tests skip where they cannot run."""

import json
from pathlib import Path

BUILT = Path(__file__).resolve().parent.parent / ".built"


def gpu_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (these tests run on the H200 through the device tool)"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"plans target sm_90a; this GPU is sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    if not (BUILT / "manifest.json").exists():
        return f"no built plans in {BUILT}: run `python -m tests.gpu.build_plans` on the build machine first"
    return None


def built_manifest_entries() -> list[dict]:
    """For parametrizing at collection time; empty (so tests skip) where nothing was built."""
    path = BUILT / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else []
