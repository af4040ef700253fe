"""What the paged-KV decode tests share: the decode manifest, the lengths each mix draws from,
and `DecodeBuffers`: one decode plan's buffers (tensor names as tests/gpu/build_plans.py declares
them: q, k_new, v_new, k_cache, v_cache, page_table, cache_len, o, lse), filled the way that
makes a wrong read or write show:

- the page table maps each sequence to pages drawn from a random permutation of the pool, and
  every entry past the pages a sequence owns holds a poison id (-1, the pool size, 2^31 - 1);
- the caches hold fresh random rows (never zeros) where a sequence has tokens, NaN everywhere
  else: pages no table names, rows past a sequence's length in its last page, and the rows this
  step's append is to write (so a missed append turns O into NaN);
- O and LSE are NaN inside guarded allocations (sentinels before and after), and so are the
  caches (their guards are part of the bitwise comparison).

The checks: the caches bitwise equal to a CPU copy taken before the run with this step's new
rows written where the spec says (every other byte untouched, guards included), O and LSE
against a float64 reference computed on the gathered (expected) cache, sequence by sequence.

An e4m3 cache holds x / scale: its rows are random values quantized with random positive scales
(per kv head or one), NaN is the byte 0x7F, the appended rows are the new rows quantized the
way the spec says (`quantize`, bitwise), and the reference reads the dequantized cache.
"""

from __future__ import annotations

import math
import random

from tests.gpu.support import (
    BUILT,
    GUARD,
    SENTINEL,
    TOLERANCE,
    manifest_entries,
    manifest_skip_reason,
    reference_sequence,
    torch_dtype,
)

DECODE_MANIFEST = BUILT / "decode-manifest.json"
INT32_MAX = 2**31 - 1
DEVICE = "cuda"  # a module setting so the harness itself can be exercised on the CPU with a stand-in plan
E4M3_MAX = 448.0
FP8_NAN, FP8_GUARD = 0x7F, 0x5A  # e4m3 bytes: NaN, and a finite guard value


def quantize(x, scale):
    """x (..., hkv, d) stored as e4m3 with scales (hkv,) or (1,): x * (1 / scale) in float32,
    rounded to nearest even, saturated to +-448 (kv_append's spec)."""
    import torch

    inverse = (1.0 / scale.float()).to(x.device).view(-1, 1)
    return (x.float() * inverse).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def cache_scales(case: dict, seed: int, device: str) -> dict:
    """A quantized cache's k_scale and v_scale, float32 on `device`: positive, around what
    amax / 448 gives for N(0, 1) rows, one per kv head (case["scales"] "head") or one."""
    import torch

    count = case["heads_kv"] if case["scales"] == "head" else 1
    scales = {}
    for i, name in enumerate(("k_scale", "v_scale")):
        drawn = torch.rand(count, generator=torch.Generator().manual_seed(seed + i))
        scales[name] = ((0.5 + drawn) * (4 / E4M3_MAX)).to(device)
    return scales


def as_bits(x):
    """The same bytes as integers (bitwise comparisons and masked copies; float8 has few ops)."""
    import torch

    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()])


def decode_skip_reason() -> str | None:
    return manifest_skip_reason(DECODE_MANIFEST, "decode")


def decode_manifest_entries() -> list[dict]:
    """For parametrizing at collection time; empty (so tests skip) where nothing was built."""
    return manifest_entries(DECODE_MANIFEST)


def has_append(case: dict) -> bool:
    return case["nodes"] in ("both", "append")


def has_attention(case: dict) -> bool:
    return case["nodes"] in ("both", "sdpa")


# ---------------------------------------------------------------------------- lengths


def special_lengths(case: dict, longest: int | None = None) -> list[int]:
    """The lengths every plan must meet (cache_len after the append, so at least s_new): 1 (plain
    decode), each side of a page, the capacity."""
    p, n = case["page_size"], case["s_new"]
    longest = case["capacity"] if longest is None else longest
    wanted = [1, p - 1, p, p + 1, 2 * p + 1, longest]
    return sorted({x for x in wanted if n <= x <= longest})


def length_mixes(case: dict, rng: random.Random, count: int = 3) -> list[list[int]]:
    """`count` mixes or more: together they hold every special length once, the rest random."""
    b, n, cap = case["batch"], case["s_new"], case["capacity"]
    specials = special_lengths(case)
    count = max(count, math.ceil((len(specials) + 1) / b))
    slots = [specials[i] if i < len(specials) else rng.randint(n, cap) for i in range(count * b)]
    rng.shuffle(slots)
    return [slots[i * b : (i + 1) * b] for i in range(count)]


# ---------------------------------------------------------------------------- buffers


def guarded(physical: tuple, permute: tuple, dtype, device: str):
    """(storage, view): a tensor of `physical` dims, seen through `permute`, inside a storage
    with GUARD elements of sentinels before and after."""
    import torch

    n = math.prod(physical)
    storage = torch.empty((n + 2 * GUARD,), device=device, dtype=dtype)
    fill_guards(storage)
    return storage, storage[GUARD : GUARD + n].view(physical).permute(permute)


def fill_guards(storage) -> None:
    """Sentinels in the first and last GUARD elements (the whole storage at allocation)."""
    for part in (storage[:GUARD], storage[-GUARD:]) if storage.numel() > 2 * GUARD else (storage,):
        if part.element_size() == 1:
            as_bits(part).fill_(FP8_GUARD)
        else:
            part.fill_(SENTINEL)


class PlanBuffers:
    """What the buffers of a plan over paged caches share: the rows' and the caches' dtypes, a
    seeded generator on `device`, the tensors by name (passed in the plan's slot order) and the
    guarded storages, the workspace (set by the subclass once its tensors are made)."""

    def __init__(self, case: dict, plan, seed: int, device: str):
        import torch

        self.case, self.plan = case, plan
        self.dtype = torch_dtype(case["dtype"])
        self.scaled = case.get("cache") is not None
        self.cache_dtype = torch_dtype(case["cache"]) if self.scaled else self.dtype
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.tensors: dict = {}
        self.storage: dict = {}  # guarded allocations
        self.workspace = None

    @property
    def all(self) -> list:
        """In the plan's slot order."""
        return [self.tensors[name] for name in self.plan.slots]

    def bind(self):
        return self.plan.bind(*self.all, workspace=self.workspace)

    def execute(self, **kwargs) -> None:
        self.plan.execute(*self.all, workspace=self.workspace, **kwargs)

    @property
    def cache_shape(self) -> tuple[int, int, int, int]:
        case = self.case
        return (case["pages"], case["page_size"], case["heads_kv"], case["head_dim"])

    def cache_view(self, storage):
        """A cache storage's elements as (pages, page_size, hkv, d): NHD here (a subclass whose
        caches are laid out otherwise says how)."""
        return storage[GUARD : GUARD + math.prod(self.cache_shape)].view(self.cache_shape)

    def assert_caches(self, expected: dict | None = None) -> dict:
        """Bitwise: the caches (and their guards) equal the expected ones (default: the
        subclass's `expected_caches()`); returns those."""
        import torch

        expected = self.expected_caches() if expected is None else expected
        size = math.prod(self.cache_shape)
        for name, want in expected.items():
            got = self.storage[name].cpu()
            same = as_bits(got) == as_bits(want)
            if bool(same.all()):
                continue
            bad = (~same).nonzero().flatten()
            first = int(bad[0])
            if first < GUARD or first >= GUARD + size:
                where = "a guard element outside the cache"
            else:
                marks = torch.zeros(size + 2 * GUARD, dtype=torch.int32)
                marks[first] = 1
                page, row, head, col = (int(x[0]) for x in self.cache_view(marks).nonzero(as_tuple=True))
                where = f"page {page} row {row} head {head} element {col}"
            raise AssertionError(
                f"{name}: {len(bad)} elements differ from the expected cache; the first at {where} "
                f"(got {got[first].float().item()!r}, want {want[first].float().item()!r}; bits "
                f"{int(as_bits(got)[first])} and {int(as_bits(want)[first])})"
            )
        return expected


class DecodeBuffers(PlanBuffers):
    """One decode plan's buffers by tensor name, and the checks of a run."""

    def __init__(self, case: dict, plan, seed: int = 0):
        import torch

        super().__init__(case, plan, seed, DEVICE)
        self.rng = random.Random(seed)
        b, hq, hkv, d, n = case["batch"], case["heads_q"], case["heads_kv"], case["head_dim"], case["s_new"]
        cache_shape = (case["pages"], case["page_size"], hkv, d)
        for name in ("k_cache", "v_cache"):
            self._guarded(name, cache_shape, (0, 1, 2, 3), self.cache_dtype)
        if self.scaled:
            self.tensors |= cache_scales(case, seed, DEVICE)
        self.tensors["page_table"] = torch.zeros(b, case["max_pages"], dtype=torch.int32, device=DEVICE)
        self.tensors["cache_len"] = torch.zeros(b, dtype=torch.int32, device=DEVICE)
        if case.get("sinks"):  # around the scores' range and above it: the sink matters
            g = torch.Generator(device="cpu").manual_seed(seed + 1)
            self.tensors["sinks"] = (torch.randn(case["heads_q"], generator=g) * 2 + 1).to(DEVICE)
        if has_append(case):
            for name in ("k_new", "v_new"):
                self.tensors[name] = self._in_layout(b, hkv, n, d)
        if has_attention(case):
            self.tensors["q"] = self._in_layout(b, hq, n, d)
            if case["layout"] == "bhsd":
                self._guarded("o", (b, hq, n, d), (0, 1, 2, 3), self.dtype)
            else:
                self._guarded("o", (b, n, hq, d), (0, 2, 1, 3), self.dtype)
            if case["lse"]:
                self._guarded("lse", (b, hq, n), (0, 1, 2), torch.float32)
        self.workspace = plan.allocate_workspace()
        self.lens: list[int] = []
        self.table: list[list[int]] = []  # the page table as written (host copy, never read back)
        self.before: dict = {}  # CPU copies of the cache storages, taken by snapshot()

    # -- allocation

    def _in_layout(self, b, h, s, d):
        import torch

        if self.case["layout"] == "bhsd":
            return torch.empty(b, h, s, d, device=DEVICE, dtype=self.dtype)
        return torch.empty(b, s, h, d, device=DEVICE, dtype=self.dtype).transpose(1, 2)

    def _guarded(self, name: str, physical: tuple, permute: tuple, dtype) -> None:
        self.storage[name], self.tensors[name] = guarded(physical, permute, dtype, DEVICE)

    # -- filling

    def setup(self, lens: list[int], reach: list[int] | None = None, poison: dict | None = None) -> None:
        """A fresh step: `lens` are cache_len (after this step's append); the table maps each
        sequence's first ceil(reach / P) pages (default: its length) to pages of a random
        permutation of the pool, poison ids past them; `poison` {(b, i): id} overrides entries.
        Caches random where a sequence already has tokens, NaN elsewhere; new q/k/v random;
        O and LSE NaN, their guards sentinels. Ends with snapshot()."""
        import torch

        case, t = self.case, self.tensors
        b, p, n, mp = case["batch"], case["page_size"], case["s_new"], case["max_pages"]
        reach = lens if reach is None else reach
        order = torch.randperm(case["pages"], generator=torch.Generator().manual_seed(self.rng.getrandbits(32)))
        order = order.tolist()
        poisons = (-1, case["pages"], INT32_MAX)
        self.table = []
        for i in range(b):
            owned = min(mp, -(-max(reach[i], 0) // p))
            row = order[i * mp : i * mp + owned] + [poisons[(i + j) % 3] for j in range(mp - owned)]
            self.table.append(row)
        for (i, j), page in (poison or {}).items():
            self.table[i][j] = page
        t["page_table"].copy_(torch.tensor(self.table, dtype=torch.int32))
        self.lens = list(lens)
        t["cache_len"].copy_(torch.tensor(lens, dtype=torch.int32))
        # rows a sequence already holds before this step: all of them for sdpa alone
        held = [max(0, x - n) if has_append(case) else x for x in lens]
        for name in ("k_cache", "v_cache"):
            cache = t[name]
            if self.scaled:
                as_bits(cache).fill_(FP8_NAN)
                real = torch.randn(cache.shape, device=DEVICE, dtype=torch.float32, generator=self.gen)
                fresh = quantize(real, t[name.replace("cache", "scale")])
            else:
                cache.fill_(float("nan"))
                fresh = torch.randn(cache.shape, device=DEVICE, dtype=self.dtype, generator=self.gen)
            mask = torch.zeros(cache.shape[:2], dtype=torch.bool, device="cpu")
            for i in range(b):
                for pos in range(min(held[i], case["capacity"])):
                    page = self.table[i][pos // p]
                    if 0 <= page < case["pages"]:
                        mask[page, pos % p] = True
            mask = mask.to(DEVICE)
            as_bits(cache)[mask] = as_bits(fresh)[mask]
            fill_guards(self.storage[name])
        self.new_inputs()

    def new_inputs(self, snapshot: bool = True) -> None:
        """Fresh q, k_new, v_new (copied into the same buffers); O and LSE poisoned; snapshot()
        unless told not to (a decode loop keeps the expected caches of the step before)."""
        import torch

        for name in ("q", "k_new", "v_new"):
            if name in self.tensors:
                x = self.tensors[name]
                x.copy_(torch.randn(x.shape, device=DEVICE, dtype=self.dtype, generator=self.gen))
        for name in ("o", "lse"):
            if name in self.storage:
                self.storage[name].fill_(SENTINEL)
                self.tensors[name].fill_(float("nan"))
        if snapshot:
            self.snapshot()

    def snapshot(self) -> None:
        """CPU copies of the cache storages (guards included): what the run starts from."""
        self.before = {name: self.storage[name].cpu() for name in ("k_cache", "v_cache")}

    # -- what the run must produce

    def appended_rows(self):
        """(name, page, row, values) of every row this step's append writes, by the spec:
        position p = len - n + t of sequence b goes to page table[b][p // P], row p % P; positions
        outside [0, capacity) and page ids outside [0, pages) are skipped."""
        case = self.case
        if not has_append(case):
            return
        P, n, cap, pages = case["page_size"], case["s_new"], case["capacity"], case["pages"]
        new = {"k_cache": self.tensors["k_new"].cpu(), "v_cache": self.tensors["v_new"].cpu()}
        if self.scaled:  # (b, hkv, s_new, d): each head with its scale
            for name, x in new.items():
                scale = self.tensors[name.replace("cache", "scale")].cpu()
                new[name] = quantize(x.transpose(1, 2), scale).transpose(1, 2)
        for b, length in enumerate(self.lens):
            for t in range(n):
                pos = length - n + t
                if not 0 <= pos < cap:
                    continue
                page = self.table[b][pos // P]
                if not 0 <= page < pages:
                    continue
                for name, x in new.items():
                    yield name, page, pos % P, x[b, :, t]  # (hkv, d)

    def expected_caches(self) -> dict:
        """The cache storages (CPU, guards included) the run must leave."""
        case = self.case
        shape = (case["pages"], case["page_size"], case["heads_kv"], case["head_dim"])
        out = {name: storage.clone() for name, storage in self.before.items()}
        views = {name: as_bits(x[GUARD : GUARD + math.prod(shape)]).view(shape) for name, x in out.items()}
        for name, page, row, values in self.appended_rows():
            views[name][page, row] = as_bits(values)
        return out

    # -- checks

    def gathered(self, caches: dict, b: int):
        """Sequence b's K and V (hkv, len, d) on the GPU, read through the page table from the
        given cache storages."""
        case = self.case
        P, hkv, d = case["page_size"], case["heads_kv"], case["head_dim"]
        shape = (case["pages"], P, hkv, d)
        length = self.lens[b]
        ids = self.table[b][: -(-length // P)]
        out = []
        for name in ("k_cache", "v_cache"):
            cache = caches[name][GUARD : GUARD + math.prod(shape)].view(shape)
            rows = as_bits(cache)[ids].reshape(-1, hkv, d)[:length].view(cache.dtype)
            if self.scaled:  # the values the cache holds: x * scale, in float32 (exact)
                rows = rows.float() * self.tensors[name.replace("cache", "scale")].cpu().view(1, -1, 1)
            out.append(rows.permute(1, 0, 2).to(DEVICE))
        return out

    def assert_attention(self, caches: dict) -> None:
        """O and LSE of every sequence against float64 on the gathered cache; nothing NaN;
        the guards intact."""
        import torch

        if not has_attention(self.case):
            return
        rel_tol, abs_tol, lse_tol = TOLERANCE[self.case["dtype"]]
        mask = {"causal": self.case["causal"], "alignment": "bottom_right"}
        mask |= {"window_left": self.case.get("window_left"), "softcap": self.case.get("softcap")}
        t = self.tensors
        err_sq = ref_sq = worst = lse_worst = 0.0
        for b in range(self.case["batch"]):
            k, v = self.gathered(caches, b)
            ref_o, ref_lse = reference_sequence(mask, t["q"][b], k, v, t.get("sinks"))
            o = t["o"][b]
            assert not torch.isnan(o).any(), f"sequence {b} (len {self.lens[b]}): some O rows are NaN"
            diff = o.double() - ref_o
            err_sq += float((diff * diff).sum())
            ref_sq += float((ref_o * ref_o).sum())
            worst = max(worst, float(diff.abs().max()))
            if "lse" in t:
                lse = t["lse"][b]
                assert not torch.isnan(lse).any(), f"sequence {b} (len {self.lens[b]}): some LSE rows are NaN"
                lse_worst = max(lse_worst, float((lse.double() - ref_lse).abs().max()))
        rel = math.sqrt(err_sq / ref_sq) if ref_sq else math.sqrt(err_sq)
        where = f"lengths {self.lens}"
        assert rel < rel_tol and worst < abs_tol, f"O: relative error {rel:.2e}, max abs error {worst:.2e} ({where})"
        assert lse_worst < lse_tol, f"LSE: max abs error {lse_worst:.2e} ({where})"
        for name in ("o", "lse"):
            if name in self.storage:
                storage, size = self.storage[name], self.tensors[name].numel()
                intact = bool((storage[:GUARD] == SENTINEL).all() and (storage[GUARD + size :] == SENTINEL).all())
                assert intact, f"the plan wrote outside {name}"

    def assert_correct(self) -> dict:
        """Caches bitwise, then attention on the expected caches; returns the expected caches."""
        expected = self.assert_caches()
        self.assert_attention(expected)
        return expected
