"""Small plan sets built for vLLM (`frostc from-config --engine vllm`), for frost_vllm's tests: the
CPU ones (the set checks and the metadata builder, in vLLM 0.32's venv: tests/vllm_backend/) and the GPU
ones (the launch path on tensors shaped as vLLM hands them: tests/gpu/test_vllm_launch.py).

Each set: token buckets 1, 4, 16 and 64 (vLLM's max_num_batched_tokens 64), at most 8 sequences a
step, a cache of 512 tokens a sequence in a pool of 96 pages of 16; tiny Llama (GQA 4:1, one
kind) in both of vLLM's layouts, over an e4m3 cache with per-tensor scales in HND and with per-head
scales in NHD, tiny Gemma-2 (window and softcap layers: two kinds), and tiny gpt-oss (attention
sinks on sliding and full layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.hf_models import TINY

BUILT = Path(__file__).resolve().parent / ".built" / "vllm"
TOKENS = (1, 4, 16, 64)
MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS = 8, 64
PAGES, PAGE_SIZE, MAX_MODEL_LEN = 96, 16, 512
TRANSFORMERS_SET = BUILT / "tiny-llama-transformers.frostset"  # prefill and decode plans: not vLLM's


@dataclass(frozen=True)
class VllmSetCase:
    family: str
    layout: str  # "nhd" | "hnd"
    kv_cache_dtype: str | None = None  # None: the model's dtype; or "e4m3"
    kv_scales: str = "tensor"  # an e4m3 cache's: "tensor" (vLLM's 0-dim) or "head"

    @property
    def name(self) -> str:
        cache = f"-kv_{self.kv_cache_dtype}" if self.kv_cache_dtype else ""
        cache += "-per_head" if self.kv_cache_dtype and self.kv_scales == "head" else ""
        return f"tiny-{self.family}-vllm-{self.layout}{cache}"

    @property
    def path(self) -> Path:
        return BUILT / f"{self.name}.frostset"


CASES = (
    VllmSetCase("llama", "nhd"),
    VllmSetCase("llama", "hnd", "e4m3"),
    VllmSetCase("gemma2", "nhd"),
    VllmSetCase("llama", "nhd", "e4m3", "head"),
    VllmSetCase("gpt_oss", "nhd"),
)


def build_vllm_set(case: VllmSetCase) -> bytes:
    """What `frostc from-config CONFIG --engine vllm --batch-sizes 1,4,16,64 --max-num-seqs 8
    --max-num-batched-tokens 64 --pages 96 --max-cache-len 512 --kv-layout LAYOUT` builds."""
    from frostc.buildset import build_set
    from frostc.models import read_model
    from frostc.serving import VllmEngine, deployment

    model = read_model(TINY[case.family])
    engine = VllmEngine(TOKENS, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, case.layout, case.kv_scales)
    dep = deployment(
        model, batch_sizes=TOKENS, max_cache_len=MAX_MODEL_LEN, page_size=PAGE_SIZE, pages=PAGES,
        kv_cache_dtype=case.kv_cache_dtype, vllm=engine,
    )  # fmt: skip
    return build_set(model, dep, name=case.name).data


def main() -> None:
    """python -m tests.vllm_sets: build every case into tests/.built/vllm (what tests/vllm_backend and
    the GPU tests read)."""
    import time

    from frostc.planfile import write_atomic
    from tests.hf_models import build_tiny_set

    BUILT.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        start = time.time()
        write_atomic(case.path, build_vllm_set(case))
        print(f"[vllm] {case.path.name} ({time.time() - start:.0f} s)", flush=True)
    write_atomic(TRANSFORMERS_SET, build_tiny_set("llama"))  # a set the plugin must refuse: not vLLM's
    print(f"[vllm] {TRANSFORMERS_SET.name}", flush=True)


if __name__ == "__main__":
    main()
