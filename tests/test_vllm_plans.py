"""Plan sets for vLLM (`frostc from-config --engine vllm`) and the vLLM-free half of frost_vllm
(plans.py, step.py, launch.py) on the CPU: the set's plans, its refusals, the cache views by
strides, and that the launch path binds exactly what each plan's slots declare. The vLLM classes
themselves are tested in vLLM's own venv (tests/vllm_backend/), the launch on the GPU
(tests/gpu/test_vllm_launch.py)."""

from __future__ import annotations

import json

import pytest
import torch
from frost_vllm.launch import LayerLauncher, cache_views
from frost_vllm.plans import Deployment, SetError, deployment_problems, kind_for, layer_attention, read_vllm_set
from frost_vllm.step import StepBuffers
from typer.testing import CliRunner

from frostc.cli import app
from frostc.serving import CUDA_GRAPH_BATCH_SIZES, vllm_cache_strides, vllm_token_buckets
from tests.hf_models import TINY
from tests.model_configs import LLAMA3_8B
from tests.vllm_sets import CASES, MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, PAGE_SIZE, PAGES, build_vllm_set

runner = CliRunner()


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    return path


def from_config(config, *args: str):
    return runner.invoke(app, ["from-config", str(config), "--engine", "vllm", *args])


def test_a_vllm_set_is_mixed_plans_over_vllms_capture_sizes(config) -> None:
    result = from_config(config, "--pages", "4096", "--max-cache-len", "8192", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    s = json.loads(result.output)
    tokens = [t for t in CUDA_GRAPH_BATCH_SIZES] + [1024, 2048, 4096, 8192]
    assert s["deployment"]["vllm"]["tokens"] == tokens == list(vllm_token_buckets(8192))
    assert [p["key"] for p in s["plans"]] == [f"l0-mixed-t{t}" for t in tokens]
    assert {p["status"] for p in s["plans"]} == {"ok"} and {p["form"] for p in s["plans"]} == {"mixed"}
    assert s["deployment"]["vllm"] | {"tokens": None} == {
        "tokens": None, "max_num_seqs": 1024, "max_num_batched_tokens": 8192, "kv_layout": "nhd", "kv_scales": None,
    }  # fmt: skip
    text = from_config(config, "--pages", "4096", "--max-cache-len", "8192", "--dry-run").output
    assert "--num-gpu-blocks-override 4096" in text and "VLLM_KV_CACHE_LAYOUT=NHD" in text


def test_the_buckets_reach_the_longest_step() -> None:
    assert vllm_token_buckets(2048)[-3:] == (512, 1024, 2048)
    assert vllm_token_buckets(100)[-2:] == (96, 100)
    assert vllm_token_buckets(3000)[-3:] == (1024, 2048, 3000)


@pytest.mark.parametrize(
    "args, named",
    [
        ((), "--pages: give the pool's block count"),
        (("--pages", "4096", "--kv-layout", "xyz"), "--kv-layout: 'xyz'"),
        (("--pages", "4096", "--max-num-seqs", "0"), "--max-num-seqs: 0"),
        (("--pages", "4096", "--batch-sizes", "1,2,4"), "below --max-num-batched-tokens 8192"),
        (("--pages", "4096", "--glue"), "--glue: the glue plans are for transformers"),
        (("--pages", "4096", "--qkv-layout", "fused"), "--qkv-layout: vLLM hands its steps' q, k and v as rows"),
        (("--pages", "4096", "--cb-tokens", "64", "--cb-blocks", "100"), "--engine: vllm: the --cb-* flags"),
        (("--pages", "4096", "--kv-cache-dtype", "e4m3", "--kv-scales", "row"), "--kv-scales: 'row'"),
    ],
)
def test_what_vllm_cannot_run_is_refused_by_flag(config, args, named) -> None:
    result = from_config(config, "--dry-run", *args)
    assert result.exit_code == 2 and named in " ".join(result.output.split()), result.output


def test_an_unknown_engine_is_refused(config) -> None:
    result = runner.invoke(app, ["from-config", str(config), "--engine", "sglang", "--dry-run"])
    assert result.exit_code == 2 and "--engine 'sglang'" in result.output


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_the_cache_strides_are_those_of_vllms_halves(layout) -> None:
    """K's and V's views of vLLM's per-layer cache, as frost_vllm takes them from the tensor vLLM
    hands over, have exactly the strides the plans are built with."""
    blocks, hkv, d = 5, 3, 64
    physical = (blocks, PAGE_SIZE, hkv, 2 * d) if layout == "nhd" else (blocks, hkv, PAGE_SIZE, 2 * d)
    storage = torch.arange(torch.Size(physical).numel(), dtype=torch.float32).reshape(physical)
    logical = storage.permute(0, 2, 1, 3) if layout == "nhd" else storage  # (blocks, hkv, page, 2d)
    k, v = cache_views(logical, d, quantized=False)
    assert list(k.stride()) == list(v.stride()) == vllm_cache_strides(layout, PAGE_SIZE, hkv, d)
    assert v.data_ptr() - k.data_ptr() == d * storage.element_size()
    assert k[2, 7, 1, 5] == logical[2, 1, 7, 5] and v[2, 7, 1, 5] == logical[2, 1, 7, d + 5]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-sets")
    paths = {}
    for case in CASES:
        paths[case.name] = folder / f"{case.name}.frostset"
        paths[case.name].write_bytes(build_vllm_set(case))
    return {name: read_vllm_set(str(path)) for name, path in paths.items()}


def test_the_set_says_what_vllm_must_be_started_with(sets) -> None:
    llama, llama_e4m3, gemma, per_head, gpt_oss = (sets[c.name] for c in CASES)
    assert [b.tokens for b in llama.buckets] == [1, 4, 16, 64]
    assert [b.sequences for b in llama.buckets] == [1, 4, MAX_NUM_SEQS, MAX_NUM_SEQS]
    assert (llama.pages, llama.page_size, llama.max_pages) == (PAGES, PAGE_SIZE, MAX_MODEL_LEN // PAGE_SIZE)
    assert (llama.layout, llama.kv_cache_dtype, llama.scale_grain) == ("nhd", "bf16", None)
    assert (llama_e4m3.layout, llama_e4m3.kv_cache_dtype, llama_e4m3.scale_grain) == ("hnd", "e4m3", "tensor")
    assert (per_head.layout, per_head.kv_cache_dtype, per_head.scale_grain) == ("nhd", "e4m3", "head")
    assert [(k.window_left, k.softcap) for k in gemma.kinds] == [(23, 50.0), (None, 50.0)]
    assert [(k.window_left, k.sinks) for k in gpt_oss.kinds] == [(23, True), (None, True)]
    assert not any(k.sinks for s in (llama, llama_e4m3, gemma, per_head) for k in s.kinds)
    good = Deployment(MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, MAX_MODEL_LEN, PAGE_SIZE, PAGES, 1)
    assert deployment_problems(llama, good) == []
    bad = Deployment(16, 128, 1024, 32, None, 2)
    problems = " | ".join(deployment_problems(llama, bad))
    for named in ("--max-num-seqs 16", "--max-num-batched-tokens 128", "--max-model-len 1024", "--block-size 32",
                  "--tensor-parallel-size 2", "--num-gpu-blocks-override not given"):  # fmt: skip
        assert named in problems


def test_a_foreign_set_is_refused(tmp_path) -> None:
    from tests.hf_models import build_tiny_set

    path = tmp_path / "hf.frostset"
    path.write_bytes(build_tiny_set("llama"))
    with pytest.raises(SetError, match="not built for vLLM"):
        read_vllm_set(str(path))
    with pytest.raises(SetError, match="nowhere"):
        read_vllm_set(str(tmp_path / "nowhere.frostset"))


def test_layers_find_their_kind_or_are_refused_by_field(sets) -> None:
    gemma = sets[CASES[2].name]
    scale = TINY["gemma2"]["query_pre_attn_scalar"] ** -0.5
    assert kind_for(gemma, layer_attention(4, 256, scale, 2, 24, 50.0, MAX_MODEL_LEN)).kind == "l0"
    assert kind_for(gemma, layer_attention(4, 256, scale, 2, None, 50.0, MAX_MODEL_LEN)).kind == "l1"
    assert kind_for(gemma, layer_attention(4, 256, scale, 2, 10**6, 50.0, MAX_MODEL_LEN)).kind == "l1"  # covers all
    with pytest.raises(SetError, match="logits_soft_cap is None, the set's 50.0"):
        kind_for(gemma, layer_attention(4, 256, scale, 2, None, None, MAX_MODEL_LEN))


class _Recorded:
    """A loaded plan's stand-in on the CPU: it records what `execute` is given (the launch itself
    needs a GPU: tests/gpu/test_vllm_launch.py)."""

    def __init__(self, data):
        self.data, self.slots, self.calls = data, [s.name for s in data.slots], []

    def execute(self, *buffers, workspace=None):
        self.calls.append(dict(zip(self.slots, buffers)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("rows", [3, 16, 40])
def test_the_launch_binds_what_each_plans_slots_declare(sets, case, rows) -> None:
    """q, k, v as views of a fused QKV projection, output as vLLM allocates it, vLLM's cache
    tensor and 0-dim scales: every buffer the plan gets has its slot's dtype, dims and strides."""
    s = sets[case.name]
    kind = s.kinds[0]
    loaded = {}

    def load(key):
        loaded[key] = _Recorded(s.plans.plan_data(key))
        return loaded[key]

    launcher = LayerLauncher(s, kind, load=load)
    sinks = torch.zeros(kind.heads) if kind.sinks else None  # gpt-oss: float32, one per query head
    q, k, v, cache, step, output, *scales = _vllm_call(s, rows)
    launcher.run(q, k, v, cache, step, output, *scales, sinks=sinks)
    (plan,) = loaded.values()
    (call,) = plan.calls
    for slot in plan.data.slots:
        buffer = call[slot.name]
        dtype = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "int32": torch.int32, "fp32": torch.float32}
        assert buffer.dtype == dtype[slot.dtype], slot.name
        assert tuple(buffer.shape) == slot.dims and tuple(buffer.stride()) == slot.strides, slot.name
    staged = rows < step.bucket.tokens or not q.is_contiguous()
    assert (call["q"].data_ptr() != q.data_ptr()) == staged
    assert torch.equal(call["q"][:rows], q[: step.bucket.tokens])
    assert call["k_cache"].data_ptr() == cache.data_ptr()  # the cache in place, never copied


def test_the_vllm_free_half_loads_neither_vllm_nor_the_compiler() -> None:
    """plans.py, step.py and launch.py run where only the runtime is (the GPU machine): they import
    no vLLM, no frostc and no DSL."""
    import subprocess
    import sys
    from pathlib import Path

    runtime = Path(__file__).resolve().parent.parent / "runtime"
    code = (
        "import sys\n"
        "import frost_vllm.plans, frost_vllm.step, frost_vllm.launch\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'frostc', 'cutlass', 'typer', 'rich'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=runtime)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_sinks_kind_launched_without_its_sinks_is_refused_by_name(sets) -> None:
    from frost_vllm.launch import LayerLauncher

    s = sets[next(c.name for c in CASES if c.family == "gpt_oss")]
    launcher = LayerLauncher(s, s.kinds[0], load=lambda key: None)
    with pytest.raises(SetError, match="layer kind l0 has attention sinks: pass the layer's"):
        launcher.run(*_vllm_call(s, 4))


def _vllm_call(s, rows: int) -> tuple:
    """A step of `rows` tokens for the set's first kind as vLLM hands it: q, k, v as views of a
    fused QKV projection, output as vLLM allocates it, vLLM's cache tensor and its scales."""
    kind = s.kinds[0]
    hq, hkv, d = kind.heads, kind.kv_heads, kind.head_dim
    qkv = torch.randn(rows, (hq + 2 * hkv) * d, dtype=torch.bfloat16)
    q, k, v = (x.view(rows, -1, d) for x in qkv.split([hq * d, hkv * d, hkv * d], -1))
    output = torch.empty(rows, hq * d, dtype=torch.bfloat16).view(rows, hq, d)
    quantized = s.scale_grain is not None
    physical = (PAGES, PAGE_SIZE, hkv, 2 * d) if s.layout == "nhd" else (PAGES, hkv, PAGE_SIZE, 2 * d)
    cache = torch.zeros(physical, dtype=torch.uint8 if quantized else torch.bfloat16)
    cache = cache.permute(0, 2, 1, 3) if s.layout == "nhd" else cache
    step = StepBuffers(s, "cpu").prepare(
        torch.tensor([0, rows], dtype=torch.int32), torch.tensor([rows + 5], dtype=torch.int32),
        torch.arange(1, 1 + MAX_MODEL_LEN // PAGE_SIZE, dtype=torch.int32)[None], torch.arange(rows) + 5, 1, rows,
    )  # fmt: skip
    grain = () if s.scale_grain == "tensor" else (hkv,)  # vLLM's 0-dim scales, or one per KV head
    scales = (torch.full(grain, 0.5), torch.full(grain, 0.25)) if quantized else (None, None)
    return q, k, v, cache, step, output, *scales
