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


def reference(case: dict, q, k, v, scale: float):
    """float64 softmax(q k^T * scale) v and its log-sum-exp, head by head to bound memory."""
    import torch

    group = case["heads_q"] // case["heads_kv"]
    out = torch.empty(q.shape, dtype=torch.float64, device="cuda")
    lse = torch.empty(q.shape[:3], dtype=torch.float64, device="cuda")
    sq, skv = q.shape[2], k.shape[2]
    mask = torch.ones(sq, skv, dtype=torch.bool, device="cuda").tril() if case["causal"] else None
    for h in range(q.shape[1]):
        qh, kh, vh = q[:, h].double(), k[:, h // group].double(), v[:, h // group].double()
        s = (qh @ kh.transpose(-1, -2)) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        lse[:, h] = torch.logsumexp(s, -1)
        out[:, h] = torch.softmax(s, -1) @ vh
    return out, lse
