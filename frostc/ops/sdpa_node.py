"""The sdpa op's validated node: what `frostc.ops.sdpa` checks a description's node into, and
what its resolutions read (`sdpa_forward` for the dense, padded and packed forms, `sdpa_paged`
for the paged one, `sdpa_choice` for how their kernels cut the work). A module of its own so
that each of those imports the node and none imports another's rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from frost_runtime.schema import NodeMask, NodeRecord

from frostc.graph import role_slots
from frostc.kernels.sdpa_common import MaskFlags

CACHE_FORMS = ("paged", "mixed")  # the forms whose k and v are a paged KV cache
PACKED_KEYS = ("cu_seqlens_q", "cu_seqlens_kv")  # a packed node's lengths
PADDED_KEYS = ("seq_len_q", "seq_len_kv")  # a padded one's (a paged one's: seq_len_kv)
DESCALE_ROLES = {"q_descale": "hq", "k_descale": "hkv", "v_descale": "hkv"}  # role: the heads it may have


@dataclass(frozen=True)
class Mask:
    causal: bool
    alignment: str  # "top_left" | "bottom_right"
    window_left: int | None  # keys from the diagonal - window_left; None: unbounded
    window_right: int | None  # keys up to the diagonal + window_right (causal: 0); None: unbounded
    softcap: float | None

    @property
    def flags(self) -> MaskFlags:
        return MaskFlags(
            right=self.window_right is not None,
            left=self.window_left is not None,
            bottom_right=self.alignment == "bottom_right",
            softcap=self.softcap is not None,
        )


@dataclass(frozen=True)
class Sdpa:
    """A validated sdpa node. For variable lengths, seq_q / seq_kv are capacities: the padded
    tensors' rows, or max_seqlen_* (packed)."""

    op: ClassVar[str] = "sdpa"
    name: str
    path: str
    q: str
    k: str
    v: str
    o: str
    lse: str | None
    form: str  # "dense" | "padded" | "packed" | "paged" | "mixed" (packed queries over a paged cache)
    q_lengths: str | None  # seq_len_q or cu_seqlens_q
    kv_lengths: str | None
    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int  # q's and k's
    head_dim_v: int  # v's and o's: head_dim but for HEAD_DIM_PAIRS (DeepSeek's MLA prefill: 192, 128)
    seq_q: int
    seq_kv: int
    tokens_q: int  # packed: q's tokens; else batch * seq_q
    tokens_kv: int
    attn_scale: float  # resolved: 1/sqrt(head_dim) (q's and k's) when not given
    mask: Mask
    inference: bool
    page_table: str | None = None  # paged: seq_kv is max_pages * page_size, the capacity
    page_size: int = 0
    pages: int = 0
    k_scale: str | None = None  # paged, e4m3 caches: their scales
    v_scale: str | None = None
    q_descale: str | None = None  # dense e4m3 q, k, v: x = stored · descale
    k_descale: str | None = None
    v_descale: str | None = None
    o_accumulation: str = "tensor_cores"  # e4m3: O_ACCUMULATIONS
    # a debug build: the dynamic tile walk counts each tile's visits into the workspace
    debug_tile_visits: bool = False
    sinks: str | None = None  # float32 (hq,): each head's sink logit in the softmax denominator

    @property
    def causal(self) -> bool:
        return self.mask.causal

    @property
    def value_dim_apart(self) -> int:
        """v's and o's head dim where it is not q's and k's (the kernel variant's `head_dim_v`), else 0."""
        return self.head_dim_v if self.head_dim_v != self.head_dim else 0

    @property
    def fp8(self) -> bool:
        """e4m3 q, k and v (validation admits them only with their descales)."""
        return self.q_descale is not None

    @property
    def inputs(self) -> tuple[tuple[str, str], ...]:
        roles = [("q", self.q), ("k", self.k), ("v", self.v)]
        if self.form == "mixed":
            roles += [("cu_seqlens_q", self.q_lengths)]
        if self.form in CACHE_FORMS:
            roles += [("page_table", self.page_table), ("seq_len_kv", self.kv_lengths)]
            optional = (("k_scale", self.k_scale), ("v_scale", self.v_scale), ("sinks", self.sinks))
            return tuple(roles) + tuple((r, n) for r, n in optional if n)
        length_keys = PACKED_KEYS if self.form == "packed" else PADDED_KEYS
        roles += [(key, name) for key, name in zip(length_keys, (self.q_lengths, self.kv_lengths)) if name]
        descales = (("q_descale", self.q_descale), ("k_descale", self.k_descale), ("v_descale", self.v_descale))
        optional = (*descales, ("sinks", self.sinks))
        return tuple(roles) + tuple((role, name) for role, name in optional if name)

    @property
    def outputs(self) -> tuple[tuple[str, str], ...]:
        return (("o", self.o),) + ((("lse", self.lse),) if self.lse else ())

    def record(self, slots: Mapping[str, int]) -> NodeRecord:
        """What the plan records of the node (frost_runtime.schema.NodeRecord): its form, mask,
        sizes (capacities where lengths vary) and scale, and its roles' slots."""
        sizes = {
            "batch": self.batch, "heads_q": self.heads_q, "heads_kv": self.heads_kv, "head_dim": self.head_dim,
            "seq_q": self.seq_q, "seq_kv": self.seq_kv, "tokens_q": self.tokens_q, "tokens_kv": self.tokens_kv,
        }  # fmt: skip
        if self.head_dim_v != self.head_dim:
            sizes["head_dim_v"] = self.head_dim_v
        if self.form in CACHE_FORMS:
            sizes |= {"pages": self.pages, "page_size": self.page_size}
        m = self.mask
        mask = NodeMask(m.causal, m.alignment, m.window_left, m.window_right, m.softcap)
        constants = {"attn_scale": self.attn_scale}
        return NodeRecord(self.op, self.name, self.form, sizes, role_slots(self, slots), constants, mask)
