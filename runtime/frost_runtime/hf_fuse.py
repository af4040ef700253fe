"""Fused decoder layers for a Hugging Face Llama-family model (Llama / Llama-3, Mistral, Qwen2, Qwen3):
the non-attention work of a serving step in fewer, larger kernels, with no compile.

    plans = frost_runtime.read_set("llama.frostset")   # from-config ... --qkv-layout fused --glue
    frost_runtime.hf_fuse.fuse_layers(model, plans)    # once, after loading the weights
    backend = frost_runtime.hf.install(plans, model)

Why: at decode, a step's attention is a few kernels per layer (frostc's plans), but HF's eager
modeling code launches ~35 more per layer: RMSNorm as eight elementwise kernels, rotary as five
per tensor, the residual adds, SiLU and its product, and three + two separate projections. Each
costs a launch (~2 µs in a CUDA graph) on a step whose useful work is reading the weights once:
at batch 8 those launches alone are ~2.5 ms of a Llama-3-8B step whose bandwidth floor is ~4 ms
(bench/NOTES.md, "Fused decoder layers and glue plans"). Fused, per layer:
- q, k and v: one GEMM over the concatenated weights (and biases: Qwen2); Qwen3's per-head RMSNorm
  of q and k (its own modules, on views of that output, written back in place); rotary on q and k in
  place in its output (four kernels, HF's `apply_rotary_pos_emb` arithmetic bit for bit); q, k, v
  handed to the attention as views of it (a set built with --qkv-layout fused reads them there;
  another set's plans get them copied into their rows);
- the norms, the residual add before the second norm, and SiLU(gate) * up: one kernel each,
  through the set's glue plans (--glue) when a step's rows are a decode bucket's; in torch
  otherwise, rounding the same way (the plans round where HF's code rounds);
- gate and up: one GEMM over the concatenated weights; the last residual add in the down
  projection's epilogue, in place.

What changes in the numbers: the last residual add rounds once with its GEMM (HF rounds the GEMM,
then the sum), and sums run in other orders: a step's logits are as close to an fp32 model's as
HF's own (tested on the CPU; generation on the GPU gives HF's tokens or a near tie). The weights
are not copied: each projection's weight becomes a view into its concatenation. The attention
is whatever the model's config names (frostc's backend, or sdpa), called through HF's attention
interface as HF's layer calls it.
"""

from __future__ import annotations

import math
import sys
import types
import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from frost_runtime import torch_ops

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
QK_NORM_FAMILIES = ("qwen3",)  # q and k RMSNorm-ed per head before rotary


def fuse_layers(model, plans=None, *, device=None) -> int:
    """Fuse every decoder layer of `model` (and its final norm) in place; returns the layers fused.
    `plans`: a plan set built with --glue, whose norm and activation plans then serve the steps
    of the rows they were built for (the decode buckets); others run in torch. Refuses
    (ValueError, naming what differs) a model whose layers are not the Llama family's, or glue
    plans built for another model."""
    config = model.config
    if config.model_type not in FAMILIES:
        raise ValueError(
            f"fuse_layers: model_type {config.model_type!r}; fused layers are written for {', '.join(FAMILIES)} "
            "(their decoder layer: RMSNorm, rotary, q/k/v/o projections, SiLU-gated MLP); serve this model unfused"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"fuse_layers: hidden_act {config.hidden_act!r}; the fused MLP computes SiLU: serve unfused")
    inner = model.model
    if hasattr(inner.norm, "frostc_glue"):
        raise ValueError("fuse_layers: this model's layers are fused already (fuse once, after loading the weights)")
    for layer in inner.layers:
        _check_layer(layer)
    glue = Glue.load(plans, model, device) if plans is not None else Glue({})
    rotary = _SignedSine(inner.rotary_emb)
    for layer in inner.layers:
        _concatenate(layer.self_attn, ("q_proj", "k_proj", "v_proj"), "qkv")
        _concatenate(layer.mlp, ("gate_proj", "up_proj"), "gate_up")
        layer.frostc_glue = glue
        layer.forward = types.MethodType(_layer_forward, layer)
    inner.norm.frostc_glue = glue
    inner.norm.forward = types.MethodType(_norm_forward, inner.norm)
    inner.rotary_emb.forward = rotary.forward
    return len(inner.layers)


def _check_layer(layer) -> None:
    """The modules the fused forward reads, present and of the expected kinds (a model that kept
    the family's name but changed its layer is refused, not computed wrongly)."""
    attn, mlp = layer.self_attn, layer.mlp
    missing = [
        name
        for owner, names in (
            (attn, ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling", "layer_idx")),
            (mlp, ("gate_proj", "up_proj", "down_proj")),
            (layer.input_layernorm, ("weight", "variance_epsilon")),
            (layer.post_attention_layernorm, ("weight", "variance_epsilon")),
        )
        for name in names
        if not hasattr(owner, name)
    ]
    if attn.config.model_type in QK_NORM_FAMILIES:
        missing += [name for name in ("q_norm", "k_norm") if not hasattr(attn, name)]
    if missing:
        raise ValueError(f"fuse_layers: layer {type(layer).__name__} lacks {', '.join(missing)}: serve it unfused")
    if attn.o_proj.bias is not None or mlp.down_proj.bias is not None or mlp.gate_proj.bias is not None:
        raise ValueError("fuse_layers: output or MLP projections with biases are not fused: serve unfused")


def _concatenate(owner, names: tuple[str, ...], fused: str) -> None:
    """One weight (and bias) for the projections `names` of `owner`, the buffer `{fused}_weight`;
    each projection's own parameters become views into it (no second copy of the weights)."""
    linears = [getattr(owner, n) for n in names]
    weight = torch.cat([lin.weight.detach() for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(weight[start : start + rows], requires_grad=False)
        if bias is not None:
            lin.bias = torch.nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    # buffers, not plain attributes: a later .to(dtype or device) converts them with the rest
    # (non-persistent: a checkpoint keeps only the projections' own weights)
    owner.register_buffer(f"{fused}_weight", weight, persistent=False)
    owner.register_buffer(f"{fused}_bias", bias, persistent=False)


class _SignedSine:
    """The model's rotary embedding, remembering each forward's sine with its first half negated,
    so that rotary's `cat(-x2, x1) * sin` is `roll(x) * signed` (exact: a sign flip rounds
    nothing), and, for a few tokens (decode), cos and signed sine over every head of q, k and v
    (v's: 1 and 0), so that rotary runs on the whole QKV buffer contiguously: computed once per
    forward, shared by every layer."""

    def __init__(self, rotary):
        self.original = rotary.forward

    def forward(self, x, position_ids):
        cos, sin = self.original(x, position_ids)
        if not torch.compiler.is_compiling():  # traced, each layer's are computed in the graph (and fused there)
            _ROTARY.clear()  # the latest forward's only: older sines are gone
            _ROTARY[id(sin)] = _Rotary(weakref.ref(sin), cos, _negate_first_half(sin))
        return cos, sin


@dataclass
class _Rotary:
    sin: weakref.ref | None  # the sine these were made from (None: made for one call)
    cos: torch.Tensor
    signed: torch.Tensor
    whole: dict = field(default_factory=dict)  # (hq, hkv) -> cos, signed sine over q, k and v's heads

    def over_heads(self, hq: int, hkv: int) -> tuple[torch.Tensor, torch.Tensor]:
        if (hq, hkv) not in self.whole:
            b, s, d = self.cos.shape
            ones = torch.ones(b, s, hkv, d, dtype=self.cos.dtype, device=self.cos.device)
            cos = torch.cat((self.cos[:, :, None].expand(b, s, hq + hkv, d), ones), dim=2)
            signed = torch.cat((self.signed[:, :, None].expand(b, s, hq + hkv, d), torch.zeros_like(ones)), dim=2)
            self.whole[(hq, hkv)] = (cos, signed)
        return self.whole[(hq, hkv)]


_ROTARY: dict[int, _Rotary] = {}  # id(sin) -> the latest forward's rotary tensors
WHOLE_BUFFER_TOKENS = 1024  # up to this many tokens a step (decode), rotary runs over all of q, k, v


def _negate_first_half(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rotary(cos: torch.Tensor, sin: torch.Tensor) -> _Rotary:
    """The forward's rotary tensors, made once per forward by `_SignedSine` (eager); made here
    under torch.compile (a tensor's id is no guard dynamo can keep) or for a sine from elsewhere."""
    if not torch.compiler.is_compiling():
        held = _ROTARY.get(id(sin))
        if held is not None and held.sin() is sin:
            return held
    return _Rotary(None, cos, _negate_first_half(sin))


@dataclass
class Glue:
    """The glue plans a fused model launches, by (op, rows): registry keys of `frost_runtime.torch_ops`.
    A call whose rows no plan was built for runs the same arithmetic in torch."""

    keys: dict[tuple[str, int], str]
    calls: Counter = field(default_factory=Counter)  # per op, the calls a plan served (outside torch.compile)

    @classmethod
    def load(cls, plans, model, device=None) -> Glue:
        """Load and register `plans`' glue plans, after checking them against the model's norms
        (width, epsilon) and MLP (width)."""
        config = model.config
        norms = [m for layer in model.model.layers for m in (layer.input_layernorm, layer.post_attention_layernorm)]
        want = {
            "hidden": config.hidden_size,
            "mlp": config.intermediate_size,
            "eps": {float(m.variance_epsilon) for m in (*norms, model.model.norm)},
        }
        for g in plans.glue:  # every plan checked before any is loaded
            _check_glue(plans, g, want)
        keys = {}
        for g in plans.glue:
            key = f"{plans.sha256[:16]}/{g.key}"
            if key not in torch_ops._registry:
                with torch.cuda.device(device if device is not None else torch.cuda.current_device()):
                    torch_ops.register(key, plans.load(g.key))
            keys[(g.op, g.tokens)] = key
        return cls(keys)

    def norm(self, module, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm as HF's LlamaRMSNorm rounds (normalized, rounded, times the weight)."""
        rows = x.reshape(-1, x.shape[-1])
        key = self.keys.get(("rms_norm", rows.shape[0]))
        if key is None:
            normed = F.rms_norm(x, (x.shape[-1],), None, module.variance_epsilon)
            return module.weight * normed
        out = torch.empty_like(rows)
        torch_ops.launch(key, [rows, module.weight], [out], None)
        self._count("rms_norm")
        return out.view(x.shape)

    def add_norm(self, module, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + x, the norm of that sum), rounded as HF's add then norm round."""
        rows, res = x.reshape(-1, x.shape[-1]), residual.reshape(-1, x.shape[-1])
        key = self.keys.get(("add_rms_norm", rows.shape[0]))
        if key is None:
            summed = residual + x
            return summed, self.norm(module, summed)
        out, summed = torch.empty_like(rows), torch.empty_like(rows)
        torch_ops.launch(key, [rows, res, module.weight], [out, summed], None)
        self._count("add_rms_norm")
        return summed.view(x.shape), out.view(x.shape)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SiLU of the gate half times the up half, rounded as `F.silu(gate) * up` rounds."""
        width = gate_up.shape[-1] // 2
        rows = gate_up.reshape(-1, gate_up.shape[-1])
        key = self.keys.get(("silu_mul", rows.shape[0]))
        if key is None:
            return F.silu(gate_up[..., :width]).mul_(gate_up[..., width:])
        out = rows.new_empty(rows.shape[0], width)
        torch_ops.launch(key, [rows], [out], None)
        self._count("silu_mul")
        return out.view(*gate_up.shape[:-1], width)

    def _count(self, op: str) -> None:
        if not torch.compiler.is_compiling():  # a count dynamo would bake in and guard on
            self.calls[op] += 1


def _check_glue(plans, g, want: dict) -> None:
    """A glue plan of another model would compute the wrong norm: refused, naming the difference."""
    data = plans.plan_data(g.key)
    slots = {s.name: s for s in data.slots}
    problems = []
    if g.op == "silu_mul":
        if slots["out"].dims[1] != want["mlp"]:
            problems.append(f"MLP width {slots['out'].dims[1]}, the model's intermediate_size is {want['mlp']}")
    else:
        if slots["x"].dims[1] != want["hidden"]:
            problems.append(f"norm width {slots['x'].dims[1]}, the model's hidden_size is {want['hidden']}")
        eps = next(n.constants["eps"] for n in data.nodes if n.op == "rms_norm")  # its node's record
        if any(not math.isclose(eps, e, rel_tol=1e-6) for e in want["eps"]):
            problems.append(f"eps {eps:g}, the model's norms use {', '.join(f'{e:g}' for e in sorted(want['eps']))}")
    if problems:
        raise ValueError(
            f"glue plan {g.key} of plan set {plans.header.name!r}: "
            + "; ".join(problems)
            + ": build the set from this model's config (frostc from-config --glue)"
        )


def _norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return self.frostc_glue.norm(self, hidden_states)


def _layer_forward(
    self,
    hidden_states: torch.Tensor,
    attention_mask=None,
    position_ids=None,
    past_key_values=None,
    use_cache: bool | None = False,
    position_embeddings=None,
    **kwargs,
) -> torch.Tensor:
    glue: Glue = self.frostc_glue
    normed = glue.norm(self.input_layernorm, hidden_states)
    # position_ids on to the attention function, as HF's decoder layers hand them (continuous
    # batching's frostc attention reads a sliding group's lengths from them)
    attended = _attention(
        self.self_attn,
        normed,
        position_embeddings,
        attention_mask,
        past_key_values,
        position_ids=position_ids,
        **kwargs,
    )
    hidden_states, normed = glue.add_norm(self.post_attention_layernorm, attended, hidden_states)
    act = glue.silu_mul(F.linear(normed, self.mlp.gate_up_weight))
    # the residual add in the down projection's epilogue (one rounding, not HF's two), in place:
    # hidden_states is this layer's own sum
    rows = hidden_states.view(-1, hidden_states.shape[-1])
    rows.addmm_(act.reshape(-1, act.shape[-1]), self.mlp.down_proj.weight.t())
    return hidden_states


def _attention(attn, normed, position_embeddings, attention_mask, past_key_values, **kwargs):
    """The attention block's output: one QKV GEMM, rotary on q and k in place in its output, q,
    k and v handed on as views of it (a plan set built with --qkv-layout fused takes them as
    they are; another copies them into its rows), the model's attention function, o_proj."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = sys.modules[type(attn).__module__].eager_attention_forward
    b, s, _ = normed.shape
    d = attn.head_dim
    hq = attn.q_proj.weight.shape[0] // d
    hkv = attn.k_proj.weight.shape[0] // d
    qkv = F.linear(normed, attn.qkv_weight, attn.qkv_bias).view(b, s, hq + 2 * hkv, d)
    if hasattr(attn, "q_norm"):  # Qwen3: each head's q and k normed (HF's modules) before rotary
        qkv[:, :, :hq] = attn.q_norm(qkv[:, :, :hq])
        qkv[:, :, hq : hq + hkv] = attn.k_norm(qkv[:, :, hq : hq + hkv])
    rotary = _rotary(*position_embeddings)
    if b * s <= WHOLE_BUFFER_TOKENS:  # contiguous over the whole buffer: vectorized kernels
        _rotate(qkv, *rotary.over_heads(hq, hkv))
    else:  # prefill: q and k only, cos and sine broadcast over the heads
        _rotate(qkv[:, :, : hq + hkv], rotary.cos[:, :, None], rotary.signed[:, :, None])
    query = qkv[:, :, :hq].transpose(1, 2)
    key = qkv[:, :, hq : hq + hkv].transpose(1, 2)
    value = qkv[:, :, hq + hkv :].transpose(1, 2)
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, attn.layer_idx)
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager)
    sliding = getattr(attn, "sliding_window", None)
    if attn.config.model_type == "mistral":
        sliding = getattr(attn.config, "sliding_window", None)
    if sliding is not None:
        kwargs["sliding_window"] = sliding
    out, _ = interface(attn, query, key, value, attention_mask, dropout=0.0, scaling=attn.scaling, **kwargs)
    return F.linear(out.reshape(b, s, hq * d), attn.o_proj.weight)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    """HF's rotary, `x * cos + cat(-x2, x1) * sin`, as `x * cos + roll(x, d/2) * signed`, written
    back into x: four kernels, each op rounding as HF's does (bit for bit its result)."""
    rolled = torch.roll(x, x.shape[-1] // 2, dims=-1)
    torch.add(x * cos, rolled.mul_(signed_sin), out=x)
