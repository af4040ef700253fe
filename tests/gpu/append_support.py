"""What the ragged-append tests share (kv_append's packed and slots forms; tests/gpu/append_cases.py):
the append manifest, the token mixes each plan runs, one step's placement data, and
`AppendBuffers`: one plan's buffers by tensor name (as tests/gpu/build_plans.py declares them:
k_new, v_new, k_cache, v_cache, page_table, cache_len, cu_q, slot_mapping, k_scale, v_scale),
filled the way that makes a wrong write show:

- the caches hold random bits everywhere (NaNs and all) inside guarded allocations (sentinels
  before and after), fresh for every step;
- the new rows are random, padding tokens (past cu_q[b], or slot -1) included;
- the page table maps each sequence to pages of a random permutation of the pool, and every
  entry past the pages a sequence owns holds a poison id (-1, the pool size, 2^31 - 1).

The check: the cache storages bitwise equal to a CPU copy taken before the run with this step's
new rows written where the spec says (`targets`), every other byte and the guards untouched; an
e4m3 cache's rows are the new rows quantized as kv_append's spec says (decode_support.quantize).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from tests.gpu.decode_support import (
    INT32_MAX,
    PlanBuffers,
    as_bits,
    cache_scales,
    fill_guards,
    guarded,
    quantize,
)
from tests.gpu.support import BUILT, GUARD, manifest_entries, manifest_skip_reason

APPEND_MANIFEST = BUILT / "append-manifest.json"
DEVICE = "cuda"
POISON_PAGES = (-1, None, INT32_MAX)  # None: the pool's size (the first id past it)


def append_skip_reason() -> str | None:
    return manifest_skip_reason(APPEND_MANIFEST, "append")


def append_manifest_entries() -> list[dict]:
    """For parametrizing at collection time; empty (so tests skip) where nothing was built."""
    return manifest_entries(APPEND_MANIFEST)


# ---------------------------------------------------------------------------- token mixes


def _split(total: int, parts: int, rng: random.Random, zeros: float) -> list[int]:
    """`total` tokens over `parts` sequences at random, about `zeros` of them given none."""
    weights = [0.0 if rng.random() < zeros else rng.random() ** 3 + 1e-3 for _ in range(parts)]
    if not any(weights):
        weights[rng.randrange(parts)] = 1.0
    counts = [int(w / sum(weights) * total) for w in weights]
    counts[max(range(parts), key=lambda i: weights[i])] += total - sum(counts)
    return counts


def token_mixes(case: dict, rng: random.Random) -> list[list[int]]:
    """Per-sequence new-token counts, one list per step: one long chunk among single decodes
    (the capacity exactly), the capacity split at random with empty sequences, a random mix of
    decodes, speculative 1 + k and chunks with padding after it, nothing at all, and one
    sequence taking every token. Each count fits its sequence's cache."""
    b, tokens, cap = case["batch"], case["tokens"], case["capacity"]
    chunk = [1] * b
    chunk[rng.randrange(b)] = tokens - (b - 1)
    mixed = [rng.choice([0, 1, 1, 1 + rng.randint(1, 3), rng.randint(2, max(2, tokens // b))]) for _ in range(b)]
    while sum(mixed) > tokens:
        mixed[max(range(b), key=lambda i: mixed[i])] //= 2
    alone = [0] * b
    alone[rng.randrange(b)] = tokens
    mixes = [chunk, _split(tokens, b, rng, 0.3), mixed, [0] * b, alone]
    return [[min(n, cap) for n in mix] for mix in mixes]


# ---------------------------------------------------------------------------- one step


@dataclass
class Step:
    """One step's placement, as the host writes it (never read back): prefix sums, cache lengths
    after the append and the page table (packed), or one slot per token (slots)."""

    counts: list[int]
    cu: list[int]
    lens: list[int]
    table: list[list[int]]
    slots: list[int]


def draw_step(case: dict, counts: list[int], rng: random.Random, holes: float = 0.0) -> Step:
    """A step that keeps the contract: each sequence's context (its length before the append)
    drawn from 0, the page edges and the rest of its capacity; its pages from a random
    permutation of the pool, poison ids past them. The slots follow the same placement, -1 for
    the padding tokens and, with `holes`, for that fraction of the others too."""
    b, p, mp, pages, tokens = case["batch"], case["page_size"], case["max_pages"], case["pages"], case["tokens"]
    cu = [0]
    for n in counts:
        cu.append(cu[-1] + n)
    lens = []
    for n in counts:
        room = case["capacity"] - n  # from an empty cache, from a page's last row or its edge, to full
        context = rng.choice([0, min(room, p - 1), min(room, p), room, rng.randint(0, room)])
        lens.append(context + n)
    order = list(range(pages))
    rng.shuffle(order)
    table = []
    for i in range(b):
        owned = -(-lens[i] // p)
        poison = [POISON_PAGES[(i + j) % 3] for j in range(mp - owned)]
        table.append(order[i * mp : i * mp + owned] + [pages if x is None else x for x in poison])
    slots = [-1] * tokens
    for s in range(b):
        for t in range(counts[s]):
            pos = lens[s] - counts[s] + t
            if rng.random() >= holes:
                slots[cu[s] + t] = table[s][pos // p] * p + pos % p
    return Step(list(counts), cu, lens, table, slots)


def spec_targets(case: dict, step: Step) -> list[tuple[int, int, int]]:
    """(token, page, row) of every row a step that keeps the contract appends, as the op's
    spec says: token cu[b] + t of sequence b (n tokens) at position len - n + t (packed), or
    at its slot unless -1 (slots)."""
    p = case["page_size"]
    if case["form"] == "slots":
        return [(i, s // p, s % p) for i, s in enumerate(step.slots) if s >= 0]
    out = []
    for b, n in enumerate(step.counts):
        for t in range(n):
            pos = step.lens[b] - n + t
            out.append((step.cu[b] + t, step.table[b][pos // p], pos % p))
    return sorted(out)


def _sequence_of(cu: list[int], token: int, batch: int) -> int:
    """The kernel's binary search (frostc.kernels.kv_append._sequence_of), step for step."""
    lo, hi = 0, batch - 1
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        lo, hi = (mid, hi) if cu[mid] <= token else (lo, mid - 1)
    return lo


def targets(case: dict, step: Step) -> list[tuple[int, int, int]]:
    """(token, page, row) of every row the kernel writes for any step, the contract kept or not:
    the spec's clamps (frostc.kernels.kv_append). Packed: tokens before cu[0] or from cu[b] on
    are skipped; a token's sequence is the binary search's, its span clamped to the tokens and
    skipped when the token lies outside it; positions outside [0, capacity) and page ids outside
    the pool are skipped. Slots: a slot below 0 or past the pool is skipped."""
    p, pages, tokens, cap = case["page_size"], case["pages"], case["tokens"], case["capacity"]
    out = []
    if case["form"] == "slots":
        for i, s in enumerate(step.slots):
            if s >= 0 and s // p < pages:
                out.append((i, s // p, s % p))
        return out
    b_cap, cu = case["batch"], step.cu
    for i in range(tokens):
        if not cu[0] <= i < cu[b_cap]:
            continue
        b = _sequence_of(cu, i, b_cap)
        start = min(max(cu[b], 0), tokens)
        end = min(max(cu[b + 1], start), tokens)
        if not start <= i < end:
            continue
        pos = max(step.lens[b], 0) - (end - start) + (i - start)
        if not 0 <= pos < cap:
            continue
        page = step.table[b][pos // p]
        if 0 <= page < pages:
            out.append((i, page, pos % p))
    return out


# ---------------------------------------------------------------------------- buffers


class AppendBuffers(PlanBuffers):
    """One append plan's buffers by tensor name, and the checks of a run."""

    def __init__(self, case: dict, plan, seed: int = 0):
        import torch

        super().__init__(case, plan, seed, DEVICE)
        b, hkv, d, tokens = case["batch"], case["heads_kv"], case["head_dim"], case["tokens"]
        for name in ("k_cache", "v_cache"):
            self._guarded_cache(name)
        if self.scaled:
            self.tensors |= cache_scales(case, seed, DEVICE)
        if case["rows"] == "fused":  # k and v: the two halves of one (tokens, 2 hkv, d) buffer
            both = torch.empty(tokens, 2 * hkv, d, device=DEVICE, dtype=self.dtype)
            self.tensors["k_new"], self.tensors["v_new"] = both[:, :hkv], both[:, hkv:]
        else:
            for name in ("k_new", "v_new"):
                self.tensors[name] = torch.empty(tokens, hkv, d, device=DEVICE, dtype=self.dtype)
        if case["form"] == "packed":
            self.tensors["page_table"] = torch.zeros(b, case["max_pages"], dtype=torch.int32, device=DEVICE)
            self.tensors["cache_len"] = torch.zeros(b, dtype=torch.int32, device=DEVICE)
            self.tensors["cu_q"] = torch.zeros(b + 1, dtype=torch.int32, device=DEVICE)
        else:
            self.tensors["slot_mapping"] = torch.full((tokens,), -1, dtype=torch.int32, device=DEVICE)
        self.workspace = plan.allocate_workspace()
        self.step: Step | None = None
        self.before: dict = {}  # CPU copies of the cache storages, taken by write()

    def _guarded_cache(self, name: str) -> None:
        pages, p, hkv, d = self.cache_shape
        hnd = self.case["cache_layout"] == "phsd"
        physical, permute = ((pages, hkv, p, d), (0, 2, 1, 3)) if hnd else (self.cache_shape, (0, 1, 2, 3))
        self.storage[name], self.tensors[name] = guarded(physical, permute, self.cache_dtype, DEVICE)

    # -- filling

    def write(self, step: Step, poison: bool = True) -> None:
        """The step's placement into the device tensors, fresh new rows, and (`poison`) the caches
        random bits again, their guards sentinels; then the CPU copy the run is checked from."""
        import torch

        t = self.tensors
        self.step = step
        if self.case["form"] == "packed":
            t["cu_q"].copy_(torch.tensor(step.cu, dtype=torch.int32))
            t["cache_len"].copy_(torch.tensor(step.lens, dtype=torch.int32))
            t["page_table"].copy_(torch.tensor(step.table, dtype=torch.int32))
        else:
            t["slot_mapping"].copy_(torch.tensor(step.slots, dtype=torch.int32))
        for name in ("k_new", "v_new"):
            t[name].copy_(torch.randn(t[name].shape, device=DEVICE, dtype=self.dtype, generator=self.gen))
        if poison:
            for storage in self.storage.values():
                bits = as_bits(storage)
                low, high = (0, 256) if bits.element_size() == 1 else (-(2**15), 2**15)
                bits.copy_(torch.randint(low, high, bits.shape, device=DEVICE, generator=self.gen, dtype=bits.dtype))
                fill_guards(storage)
        self.before = {name: storage.to("cpu", copy=True) for name, storage in self.storage.items()}

    # -- what the run must leave

    def new_rows(self) -> dict:
        """The rows the caches take, per cache (CPU, (tokens, hkv, d)): the new rows, quantized
        with their heads' scales for an e4m3 cache."""
        out = {}
        for name in ("k_cache", "v_cache"):
            x = self.tensors[name.replace("cache", "new")].cpu()
            if self.scaled:
                x = quantize(x, self.tensors[name.replace("cache", "scale")].cpu())
            out[name] = x
        return out

    def expected_caches(self, rows: list[tuple[int, int, int]] | None = None) -> dict:
        """The cache storages (CPU, guards included) the run must leave: the copy from before
        with `rows` (default: `targets` of the step) written."""
        rows = targets(self.case, self.step) if rows is None else rows
        new = self.new_rows()
        out = {name: storage.clone() for name, storage in self.before.items()}
        for name, storage in out.items():
            view = self.cache_view(as_bits(storage))
            bits = as_bits(new[name])
            for token, page, row in rows:
                view[page, row] = bits[token]
        return out

    def cache_view(self, storage):
        """A storage's cache elements as (pages, page_size, hkv, d), NHD or HND."""
        if self.case["cache_layout"] != "phsd":
            return super().cache_view(storage)
        pages, p, hkv, d = self.cache_shape
        return storage[GUARD : GUARD + math.prod(self.cache_shape)].view(pages, hkv, p, d).permute(0, 2, 1, 3)

    def assert_correct(self) -> dict:
        """What a run must leave (bench/sanitize.py's check of every target): the caches."""
        return self.assert_caches()
