"""What one execute of a plan computes, read from the plan alone: its attention nodes, the
sequence lengths to run them with, and the FLOPs or bytes that turn a time into a rate.

Pure Python (no torch, no GPU), so the benchmark's arithmetic is testable anywhere.

An attention node is its record in the plan (`schema.NodeRecord`, what frostc's sdpa op
records of it): its form, mask, sizes (capacities where lengths vary) and the slots of its
roles (K's element size from k's slot; the sequence lengths from its length slots). No kernel's
name or parameters are read.

The models, each the definition of the benchmark that reports it:
- attention FLOPs = 4 · d · hq · (visible (query, key) pairs), summed over sequences, where
  row i of a sequence sees keys [lo(i), hi(i)) as the README's masks say;
  - a dense (fixed-length) plan with a causal mask and sq = skv counts b · sq · skv / 2 pairs:
    bench/sdpa.py's 4·b·h·s·s·d, halved when causal, exactly;
  - any other plan counts the pairs the real lengths see (bench/varlen.py's useful FLOPs);
- paged decode bytes = Σ cache_len · hkv · d · element bytes · 2 (K and V): the KV a step must
  read (bench/decode.py's TB/s).
"""

import random
from dataclasses import dataclass

from frost_runtime.dtypes import ELEMENT_BYTES
from frost_runtime.schema import PAGE_TABLE_ROLE, SLOT_MAPPING_ROLE, LengthContract, NodeMask, NodeRecord, PlanData

FULL, RANDOM = "full", "random"


class LengthSpecError(ValueError):
    """A `--lengths` value the plan cannot take (the message names the slot)."""


# ------------------------------------------------------------------------------ attention nodes


@dataclass(frozen=True)
class Mask:
    """The README's mask: row i sees keys [lo(i), hi(i)) around the diagonal i + shift."""

    right: bool = False  # hi(i) = min(kv, i + shift + window_right + 1); else kv
    left: bool = False  # lo(i) = max(0, i + shift - window_left); else 0
    bottom_right: bool = False  # shift = kv - q; else 0
    window_left: int = 0
    window_right: int = 0

    @property
    def label(self) -> str:
        base = "local" if self.left else "causal" if self.right else "full"
        return base + ("_br" if self.bottom_right else "")

    @staticmethod
    def of(mask: NodeMask) -> "Mask":
        """A node record's mask (a window of None: no bound on that side)."""
        return Mask(
            right=mask.window_right is not None,
            left=mask.window_left is not None,
            bottom_right=mask.alignment == "bottom_right",
            window_left=mask.window_left or 0,
            window_right=mask.window_right or 0,
        )


@dataclass(frozen=True)
class Attention:
    """One attention node of a plan, as its record describes it."""

    node: str
    form: str  # "dense" | "padded" | "packed" | "paged" | "mixed"
    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    seq_q: int  # the query rows (dense) or their capacity; paged: the new tokens
    seq_kv: int  # the keys (dense) or their capacity
    mask: Mask
    element_bytes: int  # of K and V
    q_lengths: int = -1  # the slot of the query lengths (padded, packed), or -1
    kv_lengths: int = -1  # the slot of the key lengths (padded, packed, paged), or -1
    head_dim_v: int = 0  # V's and O's head dim where it is not head_dim (q's and k's), else 0

    @property
    def value_dim(self) -> int:
        return self.head_dim_v or self.head_dim


def attention_nodes(plan: PlanData) -> list[Attention]:
    """The plan's attention (sdpa) nodes, in the description's order."""
    return [_attention(plan, n) for n in plan.nodes if n.op == "sdpa"]


def _attention(plan: PlanData, n: NodeRecord) -> Attention:
    slots = n.slots  # a packed node's lengths are cu_seqlens_*, a padded or paged one's seq_len_*
    return Attention(
        node=n.name,
        form=n.form,
        batch=n.sizes["batch"],
        heads_q=n.sizes["heads_q"],
        heads_kv=n.sizes["heads_kv"],
        head_dim=n.sizes["head_dim"],
        seq_q=n.sizes["seq_q"],
        seq_kv=n.sizes["seq_kv"],
        mask=Mask.of(n.mask),
        element_bytes=ELEMENT_BYTES[plan.slots[slots["k"]].dtype],
        q_lengths=slots.get("cu_seqlens_q", slots.get("seq_len_q", -1)),
        kv_lengths=slots.get("cu_seqlens_kv", slots.get("seq_len_kv", -1)),
        head_dim_v=n.sizes.get("head_dim_v", 0),
    )


# ------------------------------------------------------------------------------- the models


def visible_pairs(q_len: int, kv_len: int, mask: Mask) -> int:
    """(query, key) pairs one sequence's mask lets through, in closed form.

    Row i sees clamp(i + a, 0, kv) - clamp(i + b, 0, kv) keys with a = shift + window_right + 1
    (or kv: no right bound) and b = shift - window_left (or -q_len: no left bound): the README's
    [max(0, i + shift - L), min(kv, i + shift + R + 1)), empty where it would be negative."""
    if q_len <= 0 or kv_len <= 0:
        return 0
    shift = kv_len - q_len if mask.bottom_right else 0
    a = shift + mask.window_right + 1 if mask.right else kv_len
    b = shift - mask.window_left if mask.left else -q_len
    return _clamped_sum(q_len, a, kv_len) - _clamped_sum(q_len, b, kv_len)


def _clamped_sum(n: int, c: int, m: int) -> int:
    """sum(clamp(i + c, 0, m) for i in range(n))."""
    return _prefix(c + n, m) - _prefix(c, m)


def _prefix(x: int, m: int) -> int:
    """sum(clamp(y, 0, m) for y in range(0, x)), 0 for x <= 0."""
    if x <= 0:
        return 0
    if x <= m + 1:
        return x * (x - 1) // 2
    return m * (m + 1) // 2 + (x - m - 1) * m


def sequence_lengths(node: Attention, values: dict[int, list[int]]) -> tuple[list[int], list[int]]:
    """Each sequence's (query lengths, key lengths) for the length slots' `values` (slot ->
    the int32 values written there); a side without a length slot is full."""

    def side(slot: int, full: int, offsets: bool) -> list[int]:
        if slot < 0:
            return [full] * node.batch
        v = values[slot]
        if offsets:
            return [v[i + 1] - v[i] for i in range(node.batch)]
        return [min(x, full) for x in v[: node.batch]]  # the kernels clamp to the capacity

    q_offsets = node.form in ("packed", "mixed")  # prefix sums; the mixed form's keys are lengths
    return side(node.q_lengths, node.seq_q, q_offsets), side(node.kv_lengths, node.seq_kv, node.form == "packed")


@dataclass(frozen=True)
class Work:
    """What one execute does: FLOPs of its attention (None: no attention that is counted in
    FLOPs), KV bytes of its paged attention (None: none), and how each was counted."""

    flops: int | None
    bytes: int | None
    how: tuple[str, ...]


def work(plan: PlanData, values: dict[int, list[int]]) -> Work:
    flops = bytes_read = None
    how = []
    for node in attention_nodes(plan):
        q_lens, kv_lens = sequence_lengths(node, values)
        if node.form in ("paged", "mixed"):
            n = sum(kv_lens) * node.heads_kv * node.head_dim * node.element_bytes * 2
            bytes_read = (bytes_read or 0) + n
            how.append(f"{node.node}: KV bytes read = sum(cache_len)*hkv*d*{node.element_bytes} B*2 (K and V)")
            if node.form == "paged":
                continue
        if node.form == "dense" and node.mask.label in ("causal", "causal_br") and node.seq_q == node.seq_kv:
            pairs = node.batch * node.seq_q * node.seq_kv // 2
            how.append(f"{node.node}: 4*b*hq*sq*skv*d / 2 FLOPs (dense causal: bench/sdpa.py's count)")
        else:
            pairs = sum(visible_pairs(q, k, node.mask) for q, k in zip(q_lens, kv_lens))
            how.append(f"{node.node}: 4*d*hq FLOPs per (query, key) pair the {node.mask.label} mask lets through")
        if node.head_dim_v:
            how.append(f"{node.node}: d = (d_qk + d_v) / 2 = ({node.head_dim} + {node.head_dim_v}) / 2")
        flops = (flops or 0) + 2 * (node.head_dim + node.value_dim) * node.heads_q * pairs
    return Work(flops, bytes_read, tuple(how))


# ---------------------------------------------------------------------------------- lengths

LENGTHS_HELP = """\
sequence lengths written to the plan's length slots (int32 slots with a length contract:
seq_len_*, cu_seqlens_*, cache_len), one or more SPECs:
  full           every sequence at the plan's capacity (the default); a packed plan whose
                 capacity in tokens is less than batch x longest splits its tokens evenly
  random         uniform in [0, capacity], seeded by --seed (the same draw for every slot of
                 the same batch, so q and kv lengths agree where their capacities do; packed:
                 scaled down to fit the tokens)
  N              every sequence N tokens
  N,N,...        one length per sequence (batch values)
  SLOT=SPEC      that slot only (e.g. cache_len=4096 or cu_q=100,2000 cu_kv=random);
                 a SPEC without SLOT= applies to every slot not named
values are per-sequence lengths, for prefix-sum (cu_seqlens) slots too; each set is checked
against the plan's contract (exit 2 when it breaks it)"""


def parse_lengths(specs: list[str] | None) -> tuple[str | list[int], dict[str, str | list[int]]]:
    """`--lengths` tokens into (the default spec, {slot name: spec}); a spec is "full",
    "random" or a list of ints (one int: every sequence). Raises LengthSpecError."""
    default: str | list[int] = FULL
    named: dict[str, str | list[int]] = {}
    defaults_given = 0
    for token in specs or []:
        name, sep, spec = token.partition("=")
        if not sep:
            name, spec = "", token
        elif not name:
            raise LengthSpecError(f"--lengths {token!r}: a slot name goes before '='")
        value = _parse_spec(spec, token)
        if name:
            if name in named:
                raise LengthSpecError(f"--lengths: slot {name!r} is given twice")
            named[name] = value
        else:
            defaults_given += 1
            if defaults_given > 1:
                raise LengthSpecError("--lengths: give one SPEC without a slot name at most (it serves every slot)")
            default = value
    return default, named


def _parse_spec(spec: str, token: str) -> str | list[int]:
    if spec in (FULL, RANDOM):
        return spec
    try:
        values = [int(x) for x in spec.split(",")]
    except ValueError:
        raise LengthSpecError(
            f"--lengths {token!r}: expected full, random, N or N,N,... (per-sequence lengths), optionally SLOT="
        ) from None
    if any(v < 0 for v in values):
        raise LengthSpecError(f"--lengths {token!r}: lengths are not negative")
    return values


def batch_of(plan: PlanData, contract: LengthContract) -> int:
    """Sequences a length slot describes: its entries (lengths) or entries - 1 (offsets)."""
    n = plan.slots[contract.slot].dims[0]
    return n - 1 if contract.kind == "offsets" else n


def merged_contracts(plan: PlanData) -> dict[int, LengthContract]:
    """One contract per length slot: a slot serving several nodes keeps the tightest bounds."""
    merged: dict[int, LengthContract] = {}
    for c in plan.lengths:
        m = merged.get(c.slot)
        if m is None:
            merged[c.slot] = c
        elif m.kind != c.kind:
            raise ValueError(f"slot {plan.slots[c.slot].name!r}: both {m.kind} and {c.kind} contracts")
        else:
            merged[c.slot] = LengthContract(c.slot, c.kind, min(m.longest, c.longest), min(m.total, c.total))
    return merged


def make_lengths(plan: PlanData, specs: list[str] | None = None, seed: int = 0) -> dict[int, list[int]]:
    """The values of every length slot (slot -> int32 values: lengths, or prefix sums from 0),
    from `--lengths` tokens. Every set satisfies the plan's contracts; a user's set that does
    not raises LengthSpecError naming the slot."""
    from frost_runtime.plan import length_problem

    default, named = parse_lengths(specs)
    contracts = merged_contracts(plan)
    names = {plan.slots[s].name: s for s in contracts}
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise LengthSpecError(
            f"--lengths: {', '.join(map(repr, unknown))} is not a length slot of this plan; its length slots are "
            f"{sorted(names) or 'none'}"
        )
    rng = random.Random(seed)
    draws: dict[int, list[float]] = {}  # batch -> one fraction per sequence, shared by the slots
    out = {}
    for slot, c in sorted(contracts.items()):
        name = plan.slots[slot].name
        spec = named.get(name, default)
        b = batch_of(plan, c)
        if spec == FULL:
            lengths = _full(c, b)
        elif spec == RANDOM:
            if b not in draws:
                draws[b] = [rng.random() for _ in range(b)]
            lengths = _random(c, draws[b])
        else:
            if len(spec) not in (1, b):
                raise LengthSpecError(f"--lengths {name}: {len(spec)} values for {b} sequences (give 1 or {b})")
            lengths = spec * b if len(spec) == 1 else list(spec)
        values = _offsets(lengths) if c.kind == "offsets" else lengths
        problem = length_problem(c, values)
        if problem:
            raise LengthSpecError(f"--lengths {name}: {problem}")
        out[slot] = values
    return out


def _full(c: LengthContract, b: int) -> list[int]:
    if c.kind == "offsets" and b * c.longest > c.total:  # the tokens, split as evenly as they go
        return [c.total // b + (i < c.total % b) for i in range(b)]
    return [c.longest] * b


def _random(c: LengthContract, fractions: list[float]) -> list[int]:
    lengths = [min(c.longest, int(u * (c.longest + 1))) for u in fractions]
    if c.kind == "offsets" and sum(lengths) > c.total:
        total = sum(lengths)
        lengths = [x * c.total // total for x in lengths]
    return lengths


def _offsets(lengths: list[int]) -> list[int]:
    values = [0]
    for n in lengths:
        values.append(values[-1] + n)
    return values


# ------------------------------------------------------------------------------- page tables


@dataclass(frozen=True)
class PageTable:
    """A page-table slot and what its rows index: `lengths` is the slot of the cache lengths
    the same launches read, `pages` and `page_size` the cache's (pages, page_size, ...) dims."""

    slot: int
    lengths: int
    pages: int
    page_size: int


def page_tables(plan: PlanData) -> list[PageTable]:
    """Every page-table slot of the plan's nodes (a paged attention's, a kv_append's), with the
    lengths slot and the cache sizes of its first node."""
    found: dict[int, PageTable] = {}
    for n in plan.nodes:
        table = n.slots.get(PAGE_TABLE_ROLE, -1)
        if table >= 0 and table not in found:
            found[table] = PageTable(table, n.slots.get("seq_len_kv", -1), n.sizes["pages"], n.sizes["page_size"])
    return list(found.values())


def page_table_rows(
    lengths: list[int], max_pages: int, table: PageTable, seed: int = 0
) -> tuple[list[list[int]], bool]:
    """Rows of a page table (one per sequence, `max_pages` entries) from a seeded shuffle of
    the cache's pages: each sequence's first ceil(len / page_size) entries take pages no other
    sequence uses, then the unused entries take the rest of the shuffle (valid ids all). The
    flag is False when the pool holds fewer pages than the lengths need (pages are shared)."""
    pool = list(range(table.pages))
    random.Random(seed).shuffle(pool)
    need = [min(max_pages, -(-n // table.page_size)) for n in lengths]
    rows = [[0] * max_pages for _ in lengths]
    order = [(b, j) for b, n in enumerate(need) for j in range(n)]
    order += [(b, j) for b, n in enumerate(need) for j in range(n, max_pages)]
    for k, (b, j) in enumerate(order):
        rows[b][j] = pool[k % len(pool)]
    return rows, sum(need) <= table.pages


# ------------------------------------------------------------------------------ slot mappings


@dataclass(frozen=True)
class SlotMapping:
    """A slot-mapping slot (kv_append's slots form: token i to cache row slot_mapping[i]) and the
    cache it indexes: `pages` pages of `page_size` rows."""

    slot: int
    pages: int
    page_size: int


def slot_mappings(plan: PlanData) -> list[SlotMapping]:
    """Every slot-mapping slot of the plan's nodes, with the cache sizes of its first node."""
    found: dict[int, SlotMapping] = {}
    for n in plan.nodes:
        mapping = n.slots.get(SLOT_MAPPING_ROLE, -1)
        if mapping >= 0 and mapping not in found:
            found[mapping] = SlotMapping(mapping, n.sizes["pages"], n.sizes["page_size"])
    return list(found.values())


def slot_mapping_values(tokens: int, mapping: SlotMapping, seed: int = 0) -> list[int]:
    """One cache row per token, no two alike, drawn from the whole pool by a seeded sample;
    -1 (padding: not appended) for the tokens past the pool's rows."""
    rows = mapping.pages * mapping.page_size
    taken = random.Random(seed).sample(range(rows), min(tokens, rows))
    return taken + [-1] * (tokens - len(taken))
