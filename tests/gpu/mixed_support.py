"""Buffers and checks for the mixed form's plans (tests/gpu/test_mixed.py): packed queries over a
paged cache, any mix of chunks and decodes.

A mix is each sequence's (query tokens, cache length after this step): the step's queries are the
cache's last q_len positions. The page table maps each sequence's pages to a shuffled pool, poison
ids past them; the caches hold random rows where a sequence has keys and NaN everywhere else; q is
random and O and LSE are NaN inside guards. After a run: every query row of every sequence equals
a float64 reference over the gathered keys, every other row of O and LSE is still NaN, no guard is
touched and the caches are bitwise as they were (the plan only reads them). The caches are views
by strides of the buffers an engine would hold (mixed_cases.CACHE_LAYOUTS). A plan that appends
the step's K/V first finds NaN in the new rows' places; after it, the caches are bitwise as they
were but for exactly those rows, which hold k_new and v_new (quantized as kv_append's spec says
for an e4m3 cache), and the reference reads them there.
"""

from __future__ import annotations

import json
import math
import random

from tests.gpu.decode_support import FP8_GUARD, FP8_NAN, as_bits, quantize
from tests.gpu.mixed_cases import cache_buffers, cache_views
from tests.gpu.support import BUILT, GUARD, SENTINEL, TOLERANCE, gpu_skip_reason, reference_sequence, torch_dtype

MIXED = BUILT / "mixed"
DEVICE = "cuda"
E4M3_MAX = 448.0
POISON_PAGES = (-1, None, 2**31 - 1)  # None: the pool's size (one past the last page)
KINDS = ("decode", "speculative", "prefill", "chunks", "empty", "edges")


def mixed_skip_reason() -> str | None:
    reason = gpu_skip_reason()
    if reason is not None and not reason.startswith("no built plans"):
        return reason
    if not (MIXED / "manifest.json").exists():
        return f"no mixed plans in {MIXED}: run `python -m tests.gpu.build_plans` on the build machine first"
    return None


def mixed_manifest_entries() -> list[dict]:
    path = MIXED / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else []


def draw_mix(case: dict, rng: random.Random, kind: str) -> tuple[list[int], list[int], int]:
    """(query tokens, cache lengths, first token) of one step of `kind`, within the plan's
    capacities: every q_len <= its cache length, the step's tokens within the buffer."""
    b, cap, longest, tokens = case["batch"], case["capacity"], case["max_seqlen_q"], case["tokens"]
    first = rng.choice((0, 0, 3))  # tokens before cu_seqlens_q[0] are not the plan's
    q, kv = [], []
    for _ in range(b):
        if kind == "decode":
            n, ctx = (1, rng.randint(0, cap - 1))
        elif kind == "speculative":
            n = min(4, longest)
            ctx = rng.randint(0, cap - n)
        elif kind == "prefill":
            n, ctx = rng.randint(1, min(longest, cap)), 0
        elif kind == "chunks":
            n = rng.randint(1, min(longest, cap))
            ctx = rng.randint(0, cap - n)
        elif kind == "empty":  # some sequences without queries (with and without keys), some decodes
            n = rng.choice((0, 0, 1))
            ctx = rng.choice((0, rng.randint(0, cap - 1)))
        else:  # edges: the capacity of keys, the longest chunk, each side of a page
            n = rng.choice((1, min(longest, cap)))
            page = case["page_size"]
            ctx = min(cap - n, rng.choice((cap - n, page - 1, page, page + 1, 0)))
        q.append(n)
        kv.append(ctx + n)
    room = tokens - first
    for i in range(b):  # the step's tokens within the buffer: later sequences get what is left
        q[i] = min(q[i], room)
        room -= q[i]
    if kind == "edges" and room > 0 and b:  # the buffer exactly full where the capacities allow
        i = rng.randrange(b)
        grow = min(room, longest - q[i], cap - kv[i])
        q[i] += grow
        kv[i] += grow
    return q, kv, first


class MixedBuffers:
    """One mixed plan's buffers by tensor name, and the checks of a run."""

    def __init__(self, case: dict, plan, seed: int = 0):
        import torch

        self.case, self.plan = case, plan
        self.dtype = torch_dtype(case["dtype"])
        self.scaled = case.get("cache") is not None
        self.cache_dtype = torch_dtype(case["cache"]) if self.scaled else self.dtype
        self.gen = torch.Generator(device=DEVICE).manual_seed(seed)
        self.rng = random.Random(seed)
        t, hq, hkv, d = case["tokens"], case["heads_q"], case["heads_kv"], case["head_dim"]
        self.tensors: dict = {}
        self.storage: dict = {}
        layout = (case.get("cache_layout", "own"), case["pages"], case["page_size"], hkv, d)
        self.cache_buffers = list(cache_buffers(*layout))
        for name, elements in cache_buffers(*layout).items():
            self.storage[name] = self._new_storage(elements, self.cache_dtype)
        for name, (buffer, offset, strides) in cache_views(*layout).items():
            self.tensors[name] = self._cache_view(self.storage[buffer], offset, strides)
        self.appends = bool(case.get("append"))
        if self.appends:
            for name in ("k_new", "v_new"):
                self.tensors[name] = torch.empty(t, hkv, d, device=DEVICE, dtype=self.dtype)
        if self.scaled:
            count = hkv if case["scales"] == "head" else 1
            for i, name in enumerate(("k_scale", "v_scale")):
                drawn = torch.rand(count, generator=torch.Generator().manual_seed(seed + i))
                self.tensors[name] = ((0.5 + drawn) * (4 / E4M3_MAX)).to(DEVICE)
        self.tensors["q"] = torch.empty(t, hq, d, device=DEVICE, dtype=self.dtype)
        if case.get("sinks"):  # around the scores' range and above it: the sink matters
            g = torch.Generator(device="cpu").manual_seed(seed + 1)
            self.tensors["sinks"] = (torch.randn(hq, generator=g) * 2 + 1).to(DEVICE)
        self._guarded("o", (t, hq, d), None, self.dtype)
        if case["lse"] == "ht":
            self._guarded("lse", (hq, t), (1, 0), torch.float32)
        elif case["lse"]:
            self._guarded("lse", (t, hq), None, torch.float32)
        self.tensors["page_table"] = torch.zeros(case["batch"], case["max_pages"], dtype=torch.int32, device=DEVICE)
        self.tensors["cache_len"] = torch.zeros(case["batch"], dtype=torch.int32, device=DEVICE)
        self.tensors["cu_q"] = torch.zeros(case["batch"] + 1, dtype=torch.int32, device=DEVICE)
        self.workspace = plan.allocate_workspace()
        self.q_lens: list[int] = []
        self.kv_lens: list[int] = []
        self.first = 0
        self.table: list[list[int]] = []
        self.before: dict = {}

    def _guarded(self, name: str, physical: tuple, permute: tuple | None, dtype) -> None:
        n = math.prod(physical)
        storage = self._new_storage(n, dtype)
        self.storage[name] = storage
        view = storage[GUARD : GUARD + n].view(physical)
        self.tensors[name] = view.permute(permute) if permute else view

    def _new_storage(self, elements: int, dtype):
        """`elements` between two guards."""
        import torch

        storage = torch.empty((elements + 2 * GUARD,), device=DEVICE, dtype=dtype)
        self._fill_guards(storage)
        return storage

    def _cache_view(self, storage, offset: int, strides: tuple):
        """A (pages, page_size, hkv, d) view of a cache buffer (guards around it), by strides."""
        import torch

        c = self.case
        shape = (c["pages"], c["page_size"], c["heads_kv"], c["head_dim"])
        return torch.as_strided(storage[GUARD + offset :], shape, strides)

    @staticmethod
    def _fill_guards(storage) -> None:
        for part in (storage[:GUARD], storage[-GUARD:]):
            if part.element_size() == 1:
                as_bits(part).fill_(FP8_GUARD)
            else:
                part.fill_(SENTINEL)

    @property
    def all(self) -> list:
        return [self.tensors[name] for name in self.plan.slots]

    def bind(self):
        return self.plan.bind(*self.all, workspace=self.workspace)

    def execute(self, **kwargs) -> None:
        self.plan.execute(*self.all, workspace=self.workspace, **kwargs)

    # -- a step

    def setup(self, q_lens: list[int], kv_lens: list[int], first: int) -> None:
        """The step's lengths, page table and caches (random where a sequence has keys, NaN
        elsewhere), fresh q, O and LSE poisoned; a snapshot of the caches."""
        import torch

        case, t = self.case, self.tensors
        b, p, mp, pages = case["batch"], case["page_size"], case["max_pages"], case["pages"]
        self.q_lens, self.kv_lens, self.first = list(q_lens), list(kv_lens), first
        cu = [first]
        for n in q_lens:
            cu.append(cu[-1] + n)
        t["cu_q"].copy_(torch.tensor(cu, dtype=torch.int32))
        t["cache_len"].copy_(torch.tensor(kv_lens, dtype=torch.int32))
        order = torch.randperm(pages, generator=torch.Generator().manual_seed(self.rng.getrandbits(32))).tolist()
        poisons = [pages if x is None else x for x in POISON_PAGES]
        self.table = []
        for i in range(b):
            owned = -(-kv_lens[i] // p)
            self.table.append(order[i * mp : i * mp + owned] + [poisons[(i + j) % 3] for j in range(mp - owned)])
        t["page_table"].copy_(torch.tensor(self.table, dtype=torch.int32))
        held = torch.zeros(pages, p, dtype=torch.bool)
        for i in range(b):
            for pos in range(kv_lens[i]):
                held[self.table[i][pos // p], pos % p] = True
        held = held.to(DEVICE)
        self.new_rows = self._new_rows(p)
        for name in ("k_cache", "v_cache"):
            cache = t[name]
            if self.scaled:
                as_bits(cache).fill_(FP8_NAN)
                real = torch.randn(cache.shape, device=DEVICE, dtype=torch.float32, generator=self.gen)
                fresh = quantize(real, t[name.replace("cache", "scale")])
            else:
                cache.fill_(float("nan"))
                fresh = torch.randn(cache.shape, device=DEVICE, dtype=self.dtype, generator=self.gen)
            as_bits(cache)[held] = as_bits(fresh)[held]
            if self.appends:  # the step's rows are the plan's to write: NaN until it does
                pages_of, rows_of, _ = self.new_rows
                nan = torch.full((1,), float("nan"), dtype=self.dtype, device=DEVICE)
                as_bits(cache)[pages_of, rows_of] = FP8_NAN if self.scaled else as_bits(nan)
        self.new_queries()

    def _new_rows(self, page_size: int) -> tuple:
        """(pages, rows, tokens): where each of the step's query tokens sits in the caches
        (position L - n + t of its sequence), as index tensors; tokens past the capacity or a
        page the table does not list are not among them."""
        import torch

        pages, rows, tokens = [], [], []
        token = self.first
        for b, (n, length) in enumerate(zip(self.q_lens, self.kv_lens)):
            for i in range(n):
                pos = length - n + i
                pages.append(self.table[b][pos // page_size])
                rows.append(pos % page_size)
                tokens.append(token + i)
            token += n
        return tuple(torch.tensor(x, dtype=torch.long, device=DEVICE) for x in (pages, rows, tokens))

    def new_queries(self) -> None:
        import torch

        q = self.tensors["q"]
        q.copy_(torch.randn(q.shape, device=DEVICE, dtype=self.dtype, generator=self.gen))
        for name in ("o", "lse"):
            if name in self.storage:
                self.storage[name].fill_(SENTINEL)
                self.tensors[name].fill_(float("nan"))
        if self.appends:
            for name in ("k_new", "v_new"):
                x = self.tensors[name]
                x.copy_(torch.randn(x.shape, device=DEVICE, dtype=self.dtype, generator=self.gen))
        self.before = {name: self.storage[name].to("cpu", copy=True) for name in self.cache_buffers}

    # -- checks

    def gathered(self, b: int):
        """Sequence b's K and V (hkv, len, d), float32 values, through the page table."""
        case = self.case
        length = self.kv_lens[b]
        ids = self.table[b][: -(-length // case["page_size"])]
        out = []
        for name in ("k_cache", "v_cache"):
            cache = self.tensors[name]
            rows = as_bits(cache)[ids].reshape(-1, case["heads_kv"], case["head_dim"])[:length].view(cache.dtype)
            rows = rows.float()
            if self.scaled:
                rows = rows * self.tensors[name.replace("cache", "scale")].view(1, -1, 1)
            out.append(rows.permute(1, 0, 2))
        return out

    def assert_correct(self) -> None:
        import torch

        case, t = self.case, self.tensors
        rel_tol, abs_tol, lse_tol = TOLERANCE[case["dtype"]]
        mask = {"causal": case["causal"], "alignment": "bottom_right"}
        mask |= {"window_left": case.get("window_left"), "softcap": case.get("softcap")}
        written = torch.zeros(case["tokens"], dtype=torch.bool)
        err_sq = ref_sq = worst = lse_worst = 0.0
        start = self.first
        for b, (n, length) in enumerate(zip(self.q_lens, self.kv_lens)):
            rows = slice(start, start + n)
            start += n
            if n == 0:
                continue
            written[rows] = True
            k, v = self.gathered(b)
            ref_o, ref_lse = reference_sequence(mask, t["q"][rows].transpose(0, 1), k, v, t.get("sinks"))
            o = t["o"][rows].transpose(0, 1)
            assert not torch.isnan(o).any(), f"sequence {b} ({n} queries over {length} keys): NaN in O"
            diff = o.double() - ref_o
            err_sq += float((diff * diff).sum())
            ref_sq += float((ref_o * ref_o).sum())
            worst = max(worst, float(diff.abs().max()))
            if "lse" in t:
                lse = t["lse"][rows].transpose(0, 1).double()
                assert not torch.isnan(lse).any(), f"sequence {b}: NaN in LSE"
                finite = torch.isfinite(ref_lse)
                assert bool((torch.isfinite(lse) == finite).all()), f"sequence {b}: LSE -inf where it should not be"
                if bool(finite.any()):
                    lse_worst = max(lse_worst, float((lse - ref_lse)[finite].abs().max()))
        rel = math.sqrt(err_sq / ref_sq) if ref_sq else math.sqrt(err_sq)
        where = f"q {self.q_lens}, kv {self.kv_lens}, first token {self.first}"
        assert rel < rel_tol and worst < abs_tol, f"O: relative error {rel:.2e}, max abs {worst:.2e} ({where})"
        assert lse_worst < lse_tol, f"LSE: max abs error {lse_worst:.2e} ({where})"
        untouched = (~written).nonzero().flatten().tolist()
        if untouched:  # rows outside this step's sequences are still the NaN they were given
            assert bool(torch.isnan(t["o"][untouched]).all()), f"O rows outside the step were written ({where})"
            if "lse" in t:
                assert bool(torch.isnan(t["lse"][untouched]).all()), "LSE rows outside the step were written"
        for name in ("o", "lse"):
            if name in self.storage:
                storage, size = self.storage[name], self.tensors[name].numel()
                intact = bool((storage[:GUARD] == SENTINEL).all() and (storage[GUARD + size :] == SENTINEL).all())
                assert intact, f"the plan wrote outside {name}"
        for name, expected in self.expected_caches().items():
            got = as_bits(self.storage[name].cpu())
            wrong = (got != as_bits(expected)).nonzero().flatten()
            what = "the appended rows or elsewhere" if self.appends else "a cache the plan only reads"
            assert wrong.numel() == 0, f"{name}: {wrong.numel()} elements differ from the expected ({what})"

    def expected_caches(self) -> dict:
        """{cache buffer: its expected bytes (CPU, guards included)}: as before the run, and with
        an append, the step's new rows where the append puts them."""
        import torch

        expected = {name: before.clone() for name, before in self.before.items()}
        if not self.appends:
            return expected
        c = self.case
        layout = (c.get("cache_layout", "own"), c["pages"], c["page_size"], c["heads_kv"], c["head_dim"])
        pages, rows, tokens = (x.cpu() for x in self.new_rows)
        for name, (buffer, offset, strides) in cache_views(*layout).items():
            shape = (c["pages"], c["page_size"], c["heads_kv"], c["head_dim"])
            view = torch.as_strided(expected[buffer][GUARD + offset :], shape, strides)
            new = self.tensors[name.replace("cache", "new")].cpu()[tokens]
            if self.scaled:
                new = quantize(new, self.tensors[name.replace("cache", "scale")].cpu())
            as_bits(view)[pages, rows] = as_bits(new.to(view.dtype))
        return expected
