"""Build a plan set: every supported plan of `serving.plan_list`, each with `frostc.build.build`
(kernels compile once per variant per process: the set's plans share most of them), into one
file through the runtime's `planset.encode_set` (the format is defined there, once).

    result = build_set(model, dep, progress=...)   # result.data: the set file's bytes
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from frost_runtime import planset, schema

from frostc.build import build
from frostc.compile import MIN_DRIVER, dsl_version
from frostc.errors import FrostcError
from frostc.models import ModelAttention
from frostc.serving import Deployment, LayerKind, glue_list, layer_kinds, plan_list

# ("plan", key) when a plan starts, ("done", key) when it is built; ("compile", variant name) the
# first time a plan of the set uses a kernel; ("skip", key) for a plan frostc cannot build yet
SetProgress = Callable[[str, str], None]


class SetBuildError(FrostcError):
    """Nothing of the set can be built."""


@dataclass(frozen=True)
class SetBuild:
    data: bytes
    plans: int
    skipped: tuple[tuple[str, str], ...]  # (key, why)
    kernels: int  # distinct kernel variants the set's plans launch
    cubins: int  # cubins stored (each once)
    cubin_bytes: int  # their bytes
    cubin_bytes_per_plan: int  # what the plans would hold standalone
    seconds: float


def model_text(model: ModelAttention, dep: Deployment) -> str:
    """The header's one-line summary of what the set serves."""
    window = f", sliding window {model.sliding_window}" if model.sliding_window else ""
    softcap = f", softcap {model.softcap:g}" if model.softcap else ""
    sizes = ",".join(map(str, dep.batch_sizes))
    tokens = "token" if dep.new_tokens == 1 else "tokens"
    served = (
        f"{model.model_type}: {model.layers} layers, {model.heads} heads, {model.kv_heads} KV heads, head dim "
        f"{model.head_dim}, scale {model.scale:.6g}{window}{softcap}; served {dep.dtype}, tp {dep.tp}, "
    )
    if dep.vllm is not None:  # mixed plans only: token buckets, no prefill or decode steps
        v = dep.vllm
        return (
            f"{served}for vLLM: token buckets {sizes}, up to {v.max_num_seqs} sequences a step, {dep.kv_cache_dtype} "
            f"cache {dep.max_cache_len} tokens in blocks of {dep.page_size} ({dep.pages} blocks), layout "
            f"{v.layout.upper()}"
        )[: planset.MAX_MODEL_CHARS]
    return (
        f"{served}batch sizes {sizes}, prefill {dep.max_prompt_tokens} tokens, {dep.kv_cache_dtype} cache "
        f"{dep.max_cache_len} tokens in pages of {dep.page_size} ({dep.pages} pages), {dep.new_tokens} new {tokens} "
        "per decode step"
        + (f"; q, k, v {dep.qkv_layout}" if dep.qkv_layout != "separate" else "")
        + (f"; glue: hidden {dep.glue.hidden_size}, MLP {dep.glue.intermediate_size}" if dep.glue else "")
    )[: planset.MAX_MODEL_CHARS]


def build_set(
    model: ModelAttention,
    dep: Deployment,
    *,
    name: str,
    phases: tuple[str, ...] | None = None,
    progress: SetProgress | None = None,
) -> SetBuild:
    report = progress or (lambda event, what: None)
    start = time.perf_counter()
    kinds = layer_kinds(model, dep)
    entries = [e for e in plan_list(kinds, dep) if phases is None or e.phase in phases]
    plans, missing, seen = [], [], set()

    def on_kernel(event: str, variant) -> None:
        if event == "start" and variant not in seen:
            seen.add(variant)
            report("compile", variant.name)

    for e in entries:
        kind: LayerKind = kinds[e.kind]
        if e.unsupported:
            missing.append(planset.MissingEntry(e.key, e.phase, e.batch, kind.name, kind.layers, e.unsupported))
            report("skip", e.key)
            continue
        report("plan", e.key)
        data = build(e.description, progress=on_kernel)
        report("done", e.key)
        digest = hashlib.sha256(data).hexdigest()
        plans.append((planset.SetEntry(e.key, e.key, e.phase, e.batch, kind.name, kind.layers, digest), data))
    glue = []
    for g in glue_list(dep, phases):
        report("plan", g.key)
        data = build(g.description, progress=on_kernel)
        report("done", g.key)
        glue.append((planset.GlueEntry(g.key, g.key, g.op, g.tokens, hashlib.sha256(data).hexdigest()), data))
    if not plans:
        raise SetBuildError(
            "no plan of the set can be built yet: " + "; ".join(f"{m.key}: {m.reason}" for m in missing)
        )
    target = schema.decode_plan(plans[0][1]).header.target_arch
    header = planset.SetHeader(
        name=name,
        model=model_text(model, dep),
        frostc_version=_frostc_version(),
        cutlass_dsl_version=dsl_version(),
        target_arch=target,
        min_driver=MIN_DRIVER,
    )
    kind_table = tuple(kind_info(k) for k in kinds)
    data = planset.encode_set(header, plans, tuple(missing), kind_table, serving_info(dep), tuple(glue))
    ps = planset.read_set(data)
    per_plan = sum(len(k.cubin) for key in ps.keys for k in ps.plan_data(key).kernels)
    return SetBuild(
        data=data,
        plans=len(plans) + len(glue),
        skipped=tuple((m.key, m.reason) for m in missing),
        kernels=len({k.name for key in ps.keys for k in ps.plan_data(key).kernels}),
        cubins=len(ps.cubins),
        cubin_bytes=sum(map(len, ps.cubins.values())),
        cubin_bytes_per_plan=per_plan,
        seconds=time.perf_counter() - start,
    )


def kind_info(kind: LayerKind) -> planset.KindInfo:
    """What the set records of a layer kind: the attention a serving integration checks calls against."""
    return planset.KindInfo(
        kind.name, kind.layers, kind.heads, kind.kv_heads, kind.head_dim, kind.dtype, kind.scale,
        kind.window_left, kind.softcap, kind.sinks,
    )  # fmt: skip


def serving_info(dep: Deployment) -> planset.ServingInfo:
    return planset.ServingInfo(
        dep.max_cache_len, dep.page_size, dep.pages, dep.max_prompt_tokens, dep.new_tokens, dep.tp, dep.kv_cache_dtype
    )


def _frostc_version() -> str:
    import frostc

    return frostc.__version__


def print_set_build(result: SetBuild, console, output: str) -> None:
    from rich.markup import escape

    for key, why in result.skipped:
        console.print(f"skipped {escape(key)}: {escape(why)}", highlight=False)
    saved = result.cubin_bytes_per_plan - result.cubin_bytes
    console.print(
        f"{result.plans} plans ({len(result.skipped)} skipped), {result.kernels} distinct kernels; "
        f"{result.cubins} cubins stored once: {result.cubin_bytes:,} bytes "
        f"({result.cubin_bytes_per_plan:,} as standalone plans, {saved:,} saved)\n"
        f"wrote {escape(output)} ({len(result.data):,} bytes) in {result.seconds:.1f} s",
        highlight=False,
    )
