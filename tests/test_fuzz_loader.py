"""The plan loader under fuzzing: 10,000+ mutated plans through `decode_plan`, each of which must
decode (and then re-encode to the same plan) or raise PlanFormatError; never another exception,
never a hang.

Mutations: raw byte flips, insertions, deletions and truncations of the whole file (every one
that changes the bytes must be refused: by msgpack, the content hash over header and body, or
the canonical-encoding check); the same on the body bytes with the content hash fixed
afterwards (they reach the body's msgpack decoding); and structure-aware ones: the body (or the
outer map, or the header) decoded, one field anywhere in it replaced by a random value of a
random type, or deleted, or given a sibling, then re-encoded (the header's and the body's with
the content hash fixed, so the mutation reaches the field and cross-field checks; the outer
map's as it is, which the hash must catch). The plan is a real one, built once.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
from frost_runtime import schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.trees import positions

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = 10_000


@pytest.fixture(scope="module")
def plan_bytes() -> bytes:
    from frostc.build import build
    from frostc.description import load_description

    return build(load_description(ROOT / "plans/examples/default.toml"))


# ------------------------------------------------------------------------------ helpers


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, use_single_float=False)


def _split(data: bytes) -> tuple[dict, object]:
    top = msgpack.unpackb(data, raw=False)
    return top, msgpack.unpackb(top["body"], raw=False)


def _reseal(top: dict, body_bytes: bytes | None = None) -> bytes:
    """Put a (mutated) body back and fix the content hash as the README defines it (SHA-256 of
    the msgpack of {magic, format, header without content_hash}, then the body), so the mutation
    gets past it. A header that is no longer a map is left as it is."""
    top = dict(top)
    if body_bytes is not None:
        top["body"] = body_bytes
    if isinstance(top.get("header"), dict) and isinstance(top.get("body"), bytes):
        fields = {k: v for k, v in top["header"].items() if k != "content_hash"}
        sealed = _pack({"magic": top.get("magic"), "format": top.get("format"), "header": fields}) + top["body"]
        top["header"] = dict(top["header"]) | {"content_hash": hashlib.sha256(sealed).hexdigest()}
    return _pack(top)


def _copy(obj):
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    return obj


def _mutate_tree(tree, path: tuple, op: str, value):
    """Replace, delete or add a sibling at `path` in a copy of `tree`; returns the copy."""
    if not path:
        return value
    root = _copy(tree)
    parent = root
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if op == "replace":
        parent[last] = value
    elif op == "delete":
        del parent[last]
    elif isinstance(parent, dict):  # "add": a key that may or may not exist
        parent[f"{last}_extra" if isinstance(last, str) else "extra"] = value
    else:
        parent.insert(last, value)
    return root


INTERESTING_INTS = [
    0, 1, -1, 2, 3, 7, 8, 63, 64, 255, 256, 1023, 1024, 1025, 65535, 65536,
    (1 << 31) - 1, 1 << 31, -(1 << 31), (1 << 32), (1 << 63) - 1, 1 << 63, -(1 << 63), (1 << 64) - 1,
]  # fmt: skip
INTERESTING_STRS = [
    "", "ptr", "i32", "i64", "f32", "bf16", "fp16", "fp32", "q", "lse", "slot", "value", "x" * 300, "\0",
]  # fmt: skip
INTERESTING_FLOATS = [0.0, -0.0, 1.0, float("nan"), float("inf"), float("-inf"), 1e39, -1e39, 3.4e38, 5e-324]


def _random_value(rng: random.Random, depth: int = 0):
    """A random value of a random msgpack type, boundary values favoured."""
    kind = rng.randrange(11 if depth < 2 else 9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice(INTERESTING_INTS)
    if kind == 3:
        return rng.randint(-(1 << 63), (1 << 64) - 1) >> rng.randrange(64)
    if kind == 4:
        return rng.choice(INTERESTING_FLOATS) if rng.random() < 0.5 else rng.uniform(-1e6, 1e6)
    if kind == 5:
        return rng.choice(INTERESTING_STRS)
    if kind == 6:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(12)))
    if kind == 7:
        return rng.randbytes(rng.randrange(12))
    if kind == 8:
        return rng.choice([b"\x7fELF", b"\x7fELF" + bytes(8)])
    if kind == 9:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {rng.choice(INTERESTING_STRS[:11]): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def _byte_mutation(data: bytes, rng: random.Random) -> bytes:
    kind = rng.choice(["flip", "insert", "delete", "truncate", "overwrite"])
    n = len(data)
    if kind == "truncate":
        return data[: rng.randrange(n)]
    # half the positions near the start, where the header and the map structure live
    pos = rng.randrange(min(n, 512)) if rng.random() < 0.5 else rng.randrange(n)
    if kind == "flip":
        return data[:pos] + bytes([data[pos] ^ (1 << rng.randrange(8))]) + data[pos + 1 :]
    if kind == "insert":
        return data[:pos] + rng.randbytes(rng.randint(1, 8)) + data[pos:]
    if kind == "delete":
        return data[:pos] + data[pos + rng.randint(1, 8) :]
    return data[:pos] + rng.randbytes(rng.randint(1, 8)) + data[pos + 8 :]


class Corpus:
    """The built plan, decoded once, with every position a mutation may target."""

    def __init__(self, data: bytes):
        self.data = data
        self.top, self.body = _split(data)
        self.body_bytes = self.top["body"]
        self.body_paths = positions(self.body)
        outer = {k: v for k, v in self.top.items() if k != "body"}
        self.outer_paths = [p for p in positions(outer) if p]  # the outer map's fields and the header's
        self.header_paths = [p for p in self.outer_paths if p[0] == "header" and p[1:2] != ("content_hash",)]

    def mutate(self, seed: int) -> tuple[str, bytes]:
        """One mutation, all of it decided by `seed`: Hypothesis draws only the seed, because
        drawing every choice through it costs ~4 ms per example, five times the check itself
        (and shrinking a mutation's parts buys nothing here)."""
        rng = random.Random(seed)
        target = rng.choice(
            ["file-bytes", "body-bytes", "body-field", "body-field", "body-field", "outer-field", "header-field"]
        )
        if target == "file-bytes":
            return target, _byte_mutation(self.data, rng)
        if target == "body-bytes":
            return target, _reseal(self.top, _byte_mutation(self.body_bytes, rng))
        op = rng.choice(["replace", "replace", "replace", "delete", "add"])
        value = _random_value(rng)
        if target == "body-field":
            path = rng.choice(self.body_paths)
            if op == "delete" and not path:
                op = "replace"
            return f"{target} {op} {path} {value!r:.80}", _reseal(
                self.top, _pack(_mutate_tree(self.body, path, op, value))
            )
        if target == "header-field":  # resealed: past the hash, to the header's own checks
            path = rng.choice(self.header_paths)
            return f"{target} {op} {path} {value!r:.80}", _reseal(_mutate_tree(self.top, path, op, value))
        path = rng.choice(self.outer_paths)
        return f"{target} {op} {path} {value!r:.80}", _pack(_mutate_tree(self.top, path, op, value))


# ------------------------------------------------------------------------------ tests


def test_the_unmutated_plan_decodes_and_round_trips(plan_bytes: bytes) -> None:
    plan = schema.decode_plan(plan_bytes)
    assert schema.encode_plan(plan) == plan_bytes


def test_mutated_plans_decode_or_raise_plan_format_error(plan_bytes: bytes) -> None:
    corpus = Corpus(plan_bytes)
    counts = {"decoded": 0, "refused": 0}

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(seed=st.integers(0, (1 << 64) - 1))
    def check(seed: int) -> None:
        what, data = corpus.mutate(seed)
        try:
            plan = schema.decode_plan(data)
        except schema.PlanFormatError:
            counts["refused"] += 1
            return
        counts["decoded"] += 1
        # unsealed, no changed byte gets through: a plan that decodes is the very file written
        assert not what.startswith(("file-bytes", "outer-field")) or data == corpus.data, what
        # whatever decodes is a plan the writer accepts too, and it is stable under a round trip
        # (the content hash may change: ignored extra body fields are not written back)
        again = schema.decode_plan(schema.encode_plan(plan))
        assert replace(again, header=replace(again.header, content_hash=plan.header.content_hash)) == plan, what

    check()
    assert counts["decoded"] + counts["refused"] >= EXAMPLES
    assert counts["refused"] > EXAMPLES // 2  # most mutations must be caught, not shrugged off


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\xc1",  # never-used msgpack byte
        b"\xdf\xff\xff\xff\xff",  # a map claiming 4 billion entries, with nothing behind it
        b"\xdd\xff\xff\xff\xff",  # an array claiming 4 billion entries
        b"\xc6\xff\xff\xff\xff",  # bin32 claiming 4 GiB
        b"\xdb\xff\xff\xff\xff",  # str32 claiming 4 GiB
        b"\x91" * 100_000,  # nesting 100,000 deep
        _pack({"magic": "frostc-plan"}),
        _pack({"magic": "frostc-plan", "format": 2, "header": {}, "body": b""}),
        _pack({"magic": "frostc-plam", "format": 1, "header": {}, "body": b""}),
        _pack([1, 2, 3]),
    ],
)
def test_hostile_small_inputs_are_refused(data: bytes) -> None:
    with pytest.raises(schema.PlanFormatError):
        schema.decode_plan(data)


def test_an_oversized_plan_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch, plan_bytes: bytes) -> None:
    monkeypatch.setattr(schema, "MAX_PLAN_BYTES", len(plan_bytes) - 1)
    with pytest.raises(schema.PlanFormatError, match="larger than any plan"):
        schema.decode_plan(plan_bytes)


def _with_body(plan_bytes: bytes, edit) -> bytes:
    top, body = _split(plan_bytes)
    edit(body)
    return _reseal(top, _pack(body))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda b: b["kernels"][0].update(entry=""), "entry"),
        (lambda b: b["kernels"][0].update(block=[1024, 2, 1]), "1024 threads"),
        (lambda b: b["kernels"][0].update(block=[1, 1, 65]), "block"),
        (lambda b: b["kernels"][0].update(cluster=[4, 4, 2]), "cluster"),
        (lambda b: b["kernels"][0].update(smem_bytes=240 * 1024), "smem_bytes"),
        (lambda b: b["launches"][0].update(grid=[1, 65536, 1]), "grid"),
        (lambda b: b["launches"][0].update(kernel=1), "kernel"),
        (lambda b: b["launches"][0]["args"].__setitem__(0, {"slot": 9}), "slot"),
        (lambda b: b["launches"][0]["args"].__setitem__(0, {"slot": 0, "value": 1}), "exactly one"),
        (lambda b: b["launches"][0]["args"].__setitem__(-1, {"value": float("nan")}), "finite float32"),
        (lambda b: b["launches"][0]["args"].__setitem__(-1, {"value": 1e39}), "finite float32"),
        (lambda b: b.update(launches=[]), "at least one"),
        (lambda b: b["slots"][0].update(dims=[1 << 40, 1 << 40, 1, 1], strides=[1 << 40, 1, 1, 1]), "2\\*\\*63"),
        (lambda b: b["slots"][0].update(align=12), "power of two"),
        (lambda b: b["slots"][0].update(name=""), "empty"),
    ],
)
def test_targeted_corruptions_name_the_field(plan_bytes: bytes, edit, message: str) -> None:
    with pytest.raises(schema.PlanFormatError, match=message):
        schema.decode_plan(_with_body(plan_bytes, edit))


def test_a_parameter_block_over_4_kib_is_refused(plan_bytes: bytes) -> None:
    plan = schema.decode_plan(plan_bytes)
    kernel = replace(plan.kernels[0], params=tuple(schema.Param(f"p{i}", "i64") for i in range(513)))
    with pytest.raises(schema.PlanFormatError, match="4104 bytes of parameters"):
        schema.encode_plan(replace(plan, kernels=(kernel,)))
