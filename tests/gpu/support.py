"""What the GPU tests share: where the plans are (tests/.built, built on the CPU machine by
`python -m tests.gpu.build_plans`), why the tests skip where they cannot run, the float64
reference, and `Buffers`: one plan's inputs (fresh random values), outputs (NaN-poisoned,
inside sentinel guards), sequence lengths and workspace, and the check of a run."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BUILT = Path(__file__).resolve().parent.parent / ".built"

# relative Frobenius error of O, max abs error of O, max abs error of LSE
TOLERANCE = {"bf16": (1.2e-2, 6e-2, 2e-3), "fp16": (2e-3, 1e-2, 2e-3)}
GUARD = 4096  # sentinel elements on each side of every output
SENTINEL = 12345.0
# lengths every mix draws from, besides random ones: empty, one row, each side of each tile size
SPECIAL_LENGTHS = (0, 1, 63, 64, 65, 127, 128, 129, 191, 192, 193)


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
    return manifest_entries(BUILT / "manifest.json")


def manifest_entries(path: Path) -> list[dict]:
    """A group's manifest (decode-manifest.json, ...), or none where nothing was built."""
    return json.loads(path.read_text()) if path.exists() else []


def manifest_skip_reason(path: Path, group: str) -> str | None:
    """Why a group's tests (built into the manifest at `path`) cannot run here, or None."""
    reason = gpu_skip_reason()
    if reason is not None and not reason.startswith("no built plans"):
        return reason
    if not path.exists():
        return f"no {group} plans in {BUILT}: run `python -m tests.gpu.build_plans` on the build machine first"
    return None


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn}[name]


# ---------------------------------------------------------------------------- the reference


def allowed_keys(case: dict, q_len: int, kv_len: int, device="cuda"):
    """(q_len, kv_len) bool: which keys each query row sees (the README's mask definitions)."""
    import torch

    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(kv_len, device=device)[None, :]
    shift = kv_len - q_len if case.get("alignment") == "bottom_right" else 0
    ok = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    right = 0 if case["causal"] else case.get("window_right")
    if right is not None:
        ok &= j <= i + shift + right
    if case.get("window_left") is not None:
        ok &= j >= i + shift - case["window_left"]
    return ok


def reference_sequence(case: dict, q, k, v, sinks=None):
    """float64 attention of one sequence: q (hq, sq, d), k (hkv, skv, d) and v (hkv, skv, d_v) ->
    O (hq, sq, d_v) (d_v: v's head dim, d's but for DeepSeek's 192 / 128; the scale 1/sqrt(d)) and
    the natural-log LSE (hq, sq). A row that sees no key has O = 0 and LSE = -inf. `sinks`
    (hq,): each head's logit joins the denominator (a key with no value): the LSE includes it,
    and a row that sees no key has LSE = the sink."""
    import torch

    hq, sq, d = q.shape
    group = hq // k.shape[0]
    scale = 1 / math.sqrt(d)
    allowed = allowed_keys(case, sq, k.shape[1])
    out = torch.zeros(hq, sq, v.shape[-1], dtype=torch.float64, device="cuda")
    lse = torch.empty(hq, sq, dtype=torch.float64, device="cuda")
    if sq == 0:
        return out, lse
    for h in range(hq):  # head by head bounds the memory of the longest rows
        s = (q[h].double() @ k[h // group].double().T) * scale
        if case.get("softcap") is not None:
            s = case["softcap"] * torch.tanh(s / case["softcap"])
        s = s.masked_fill(~allowed, float("-inf"))
        lse[h] = torch.logsumexp(s, -1) if k.shape[1] else float("-inf")
        if sinks is not None:
            lse[h] = torch.logaddexp(lse[h], sinks[h].double().expand_as(lse[h]))
        p = torch.where(allowed, torch.exp(s - lse[h][:, None]), 0.0)
        out[h] = p @ v[h // group].double()
    return out, lse


# ---------------------------------------------------------------------------- lengths


def draw_lengths(case: dict, rng: random.Random) -> tuple[list[int], list[int], int]:
    """A fresh mix of (q lengths, kv lengths, first token) for a variable-length plan: special
    lengths and random ones, within the plan's capacities."""
    b = case["batch"]

    def side(longest: int, total: int | None) -> list[int]:
        specials = [x for x in SPECIAL_LENGTHS + (longest,) if x <= longest]
        lengths = [rng.choice(specials) if rng.random() < 0.6 else rng.randint(0, longest) for _ in range(b)]
        if total is not None:  # packed: the sequences share the buffer's tokens
            room = total
            for i, n in enumerate(lengths):
                lengths[i] = min(n, room)
                room -= lengths[i]
        return lengths

    if case["form"] == "packed":
        start = rng.choice((0, 0, 5))
        q = side(case["seq_q"], case["tokens_q"] - start)
        kv = side(case["seq_kv"], case["tokens_kv"] - start)
        return q, kv, start
    q = side(case["seq_q"], None) if case["lengths"] in ("q", "qkv") else [case["seq_q"]] * b
    kv = side(case["seq_kv"], None) if case["lengths"] in ("kv", "qkv") else [case["seq_kv"]] * b
    return q, kv, 0


# ---------------------------------------------------------------------------- buffers


class Buffers:
    """One plan's buffers, by slot name: inputs with fresh random values, outputs poisoned with
    NaN inside guarded allocations, int32 sequence lengths, and the workspace."""

    def __init__(self, case: dict, plan):
        import torch

        self.case, self.plan = case, plan
        self.dtype = torch_dtype(case["dtype"])
        b, hq, hkv, d = case["batch"], case["heads_q"], case["heads_kv"], case["head_dim"]
        dv = case.get("head_dim_v") or d  # v's and o's
        self.tensors = {}
        self.storage = {}
        if case["form"] == "packed":
            for name, (t, h, dims) in {"q": (case["tokens_q"], hq, d), "k": (case["tokens_kv"], hkv, d),
                                       "v": (case["tokens_kv"], hkv, dv)}.items():  # fmt: skip
                self.tensors[name] = torch.empty(t, h, dims, device="cuda", dtype=self.dtype)
            self._guarded("o", (case["tokens_q"], hq, dv), (0, 1, 2), self.dtype)
            if case["lse"]:
                self._guarded("lse", (hq, case["tokens_q"]), (1, 0), torch.float32)  # layout "ht"
            for name in ("q_lengths", "kv_lengths"):
                self.tensors[name] = torch.zeros(b + 1, dtype=torch.int32, device="cuda")
        else:
            rows = {"q": (hq, case["seq_q"], d), "k": (hkv, case["seq_kv"], d), "v": (hkv, case["seq_kv"], dv)}
            for name, (h, s, dims) in rows.items():
                self.tensors[name] = self._in_layout(b, h, s, dims)
            if case["layout"] == "bhsd":
                self._guarded("o", (b, hq, case["seq_q"], dv), (0, 1, 2, 3), self.dtype)
            else:
                self._guarded("o", (b, case["seq_q"], hq, dv), (0, 2, 1, 3), self.dtype)
            if case["lse"]:
                self._guarded("lse", (b, hq, case["seq_q"]), (0, 1, 2), torch.float32)
            if case["form"] == "padded":
                for side in {"qkv": ("q", "kv"), "q": ("q",), "kv": ("kv",)}[case["lengths"]]:
                    self.tensors[f"{side}_lengths"] = torch.zeros(b, dtype=torch.int32, device="cuda")
        if case.get("sinks"):
            self.tensors["sinks"] = torch.empty(hq, dtype=torch.float32, device="cuda")
        self.workspace = plan.allocate_workspace()
        self.q_lens = [case["seq_q"]] * b
        self.kv_lens = [case["seq_kv"]] * b
        self.start = 0
        self.refill()

    def _in_layout(self, b, h, s, d):
        import torch

        if self.case["layout"] == "bhsd":
            return torch.empty(b, h, s, d, device="cuda", dtype=self.dtype)
        return torch.empty(b, s, h, d, device="cuda", dtype=self.dtype).transpose(1, 2)

    def _guarded(self, name: str, physical: tuple, permute: tuple, dtype) -> None:
        import torch

        n = math.prod(physical)
        storage = torch.full((n + 2 * GUARD,), SENTINEL, device="cuda", dtype=dtype)
        self.storage[name] = storage
        self.tensors[name] = storage[GUARD : GUARD + n].view(physical).permute(permute)

    @property
    def all(self) -> list:
        """In the plan's slot order."""
        return [self.tensors[name] for name in self.plan.slots]

    def set_lengths(self, q_lens: list[int], kv_lens: list[int], start: int = 0, stream=None) -> None:
        """Write new lengths into the same length buffers (what a serving loop does per step)."""
        import torch

        self.q_lens, self.kv_lens, self.start = q_lens, kv_lens, start
        with torch.cuda.stream(stream) if stream is not None else _nothing():
            if self.case["form"] == "packed":
                for name, lens in (("q_lengths", q_lens), ("kv_lengths", kv_lens)):
                    cu = [start]
                    for n in lens:
                        cu.append(cu[-1] + n)
                    self.tensors[name].copy_(torch.tensor(cu, dtype=torch.int32))
            elif self.case["form"] == "padded":
                for name, lens in (("q_lengths", q_lens), ("kv_lengths", kv_lens)):
                    if name in self.tensors:
                        self.tensors[name].copy_(torch.tensor(lens, dtype=torch.int32))

    def refill(self, stream=None) -> None:
        """Fresh random inputs, outputs poisoned again (same storage)."""
        import torch

        with torch.cuda.stream(stream) if stream is not None else _nothing():
            for name in ("q", "k", "v"):
                t = self.tensors[name]
                t.copy_(torch.randn(t.shape, device="cuda", dtype=t.dtype))
            if "sinks" in self.tensors:  # around the scores' range and above it: the sink matters
                sinks = self.tensors["sinks"]
                sinks.copy_(torch.randn(sinks.shape, device="cuda") * 2 + 1)
            for name, storage in self.storage.items():
                storage.fill_(SENTINEL)
                self.tensors[name].fill_(float("nan"))

    def poison_padding(self, stream=None) -> None:
        """NaN in every input row outside the sequences (padding rows, tokens past the last
        sequence): a plan that reads any of them, even only to multiply by zero, fails."""
        import torch

        t = self.tensors
        with torch.cuda.stream(stream) if stream is not None else _nothing():
            if self.case["form"] == "packed":
                for name, lens in (("q", self.q_lens), ("k", self.kv_lens), ("v", self.kv_lens)):
                    t[name][: self.start] = float("nan")
                    t[name][self.start + sum(lens) :] = float("nan")
            elif self.case["form"] == "padded":
                for b, (lq, lkv) in enumerate(zip(self.q_lens, self.kv_lens)):
                    t["q"][b, :, lq:] = float("nan")
                    t["k"][b, :, lkv:] = float("nan")
                    t["v"][b, :, lkv:] = float("nan")

    def execute(self, **kwargs) -> None:
        self.plan.execute(*self.all, workspace=self.workspace, **kwargs)

    def sequences(self):
        """(b, q rows, kv rows, O rows, LSE rows) of each sequence: views of the buffers."""
        t = self.tensors
        if self.case["form"] == "packed":
            q_at, kv_at = self.start, self.start
            for b, (lq, lkv) in enumerate(zip(self.q_lens, self.kv_lens)):
                rows_q, rows_kv = slice(q_at, q_at + lq), slice(kv_at, kv_at + lkv)
                lse = t["lse"][rows_q].transpose(0, 1) if "lse" in t else None
                yield (b, t["q"][rows_q].transpose(0, 1), t["k"][rows_kv].transpose(0, 1),
                       t["v"][rows_kv].transpose(0, 1), t["o"][rows_q].transpose(0, 1), lse)  # fmt: skip
                q_at, kv_at = q_at + lq, kv_at + lkv
            return
        for b, (lq, lkv) in enumerate(zip(self.q_lens, self.kv_lens)):
            lse = t["lse"][b, :, :lq] if "lse" in t else None
            yield b, t["q"][b, :, :lq], t["k"][b, :, :lkv], t["v"][b, :, :lkv], t["o"][b, :, :lq], lse

    def untouched(self):
        """Output rows the plan must leave alone: past each padded sequence's length, or the
        tokens before the first sequence and after cu_seqlens[-1] (packed)."""
        t = self.tensors
        if self.case["form"] == "packed":
            end = self.start + sum(self.q_lens)
            names = ["o"] + (["lse"] if "lse" in t else [])
            for name in names:
                yield t[name][: self.start]
                yield t[name][end:]
            return
        for b, lq in enumerate(self.q_lens):
            yield t["o"][b, :, lq:]
            if "lse" in t:
                yield t["lse"][b, :, lq:]

    def assert_correct(self) -> None:
        """Every sequence's O and LSE against float64; untouched rows still NaN; guards intact."""
        import torch

        rel_tol, abs_tol, lse_tol = TOLERANCE[self.case["dtype"]]
        err_sq = ref_sq = worst = lse_worst = 0.0
        for b, q, k, v, o, lse in self.sequences():
            ref_o, ref_lse = reference_sequence(self.case, q, k, v, self.tensors.get("sinks"))
            assert not torch.isnan(o).any(), f"sequence {b}: some O rows were never written"
            diff = o.double() - ref_o
            err_sq += float((diff * diff).sum())
            ref_sq += float((ref_o * ref_o).sum())
            worst = max(worst, float(diff.abs().max()) if diff.numel() else 0.0)
            if lse is not None and lse.numel():
                assert not torch.isnan(lse).any(), f"sequence {b}: some LSE rows were never written"
                empty = torch.isinf(ref_lse)
                assert bool((lse[empty] == float("-inf")).all()), f"sequence {b}: rows seeing no key need LSE -inf"
                if (~empty).any():
                    lse_worst = max(lse_worst, float((lse.double() - ref_lse)[~empty].abs().max()))
        rel = math.sqrt(err_sq / ref_sq) if ref_sq else math.sqrt(err_sq)
        assert rel < rel_tol and worst < abs_tol, f"O: relative error {rel:.2e}, max abs error {worst:.2e}"
        assert lse_worst < lse_tol, f"LSE: max abs error {lse_worst:.2e}"
        for rows in self.untouched():
            assert bool(torch.isnan(rows).all()), "the plan wrote rows past a sequence's length"
        for name, storage in self.storage.items():
            n = self.tensors[name].numel()
            intact = bool((storage[:GUARD] == SENTINEL).all() and (storage[GUARD + n :] == SENTINEL).all())
            assert intact, f"the plan wrote outside {name}"


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---------------------------------------------------------------------------- SASS

NVDISASM = Path(shutil.which("nvdisasm") or "/usr/local/cuda/bin/nvdisasm")


def _sass(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(NVDISASM), "-c", f.name], capture_output=True, text=True, check=True).stdout


def disassemble(cubins: list[bytes]) -> dict[bytes, str]:
    """Each cubin's SASS (nvdisasm), one process per cubin, in parallel."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        return dict(zip(cubins, pool.map(_sass, cubins)))
