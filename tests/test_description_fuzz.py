"""Descriptions under fuzzing: thousands of mutated descriptions (every golden and example one,
a field anywhere replaced by a value of any type, boundary sizes favoured, deleted, or given an
unknown sibling) through parse, validate and resolve. Each must be refused with a
DescriptionError (every problem with a field path) or resolve to a plan that the plan format
holds: assembled with stand-in kernels (nothing compiles), it encodes, and the runtime's own
reader takes it back (`frostc.build._encode_checked`, the build's last step). Never another
exception: an exception here would be a traceback from `frostc build`, a plan the runtime
refuses is a build that fails after minutes of compiling."""

from __future__ import annotations

import dataclasses
import json
import random
import tomllib
from pathlib import Path

import pytest
from frost_runtime import schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frostc import planfile
from frostc.build import PlanLimitError, _encode_checked
from frostc.compile import CompiledKernel
from frostc.description import parse_description
from frostc.errors import DescriptionError, FrostcError
from frostc.resolve import resolve
from frostc.validate import validate
from tests.trees import positions

ROOT = Path(__file__).resolve().parent.parent
BASES = sorted((ROOT / "plans" / "golden").glob("*.toml")) + sorted((ROOT / "plans" / "examples").glob("*.toml"))
EXAMPLES = 3000  # ~5 s; 40,000 found nothing more

BIG_INTS = [
    0, -1, 1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 255, 256, 257, 4097, 65535, 65536, 65537, 1 << 20,
    (1 << 31) - 1, 1 << 31, (1 << 32) + 1, 1 << 40, 1 << 48, (1 << 63) - 1, 1 << 63, 1 << 64, 10**30,
]  # fmt: skip
STRINGS = ["", "q", "k", "o", "lse", "bf16", "fp32", "int32", "bshd", "bhsd", "thd", "pshd", "ht", "bottom_right",
           "sdpa", "kv_append", "[/x]", "\udcff", "\x00", "x" * 300, "é"]  # fmt: skip
FLOATS = [0.0, -1.0, 0.5, 1e-300, 1e-30, 3.5e38, 1e300, float("nan"), float("inf"), float("-inf")]


@pytest.fixture(scope="module")
def bases() -> list[dict]:
    return [tomllib.loads(path.read_text()) for path in BASES]


def _value(rng: random.Random, current, depth: int = 0):
    """A random value: a boundary size (most often: sizes are where the limits are), a scaled
    copy of an int, a float, a string, a bool, or a small list or table."""
    kind = rng.randrange(9 if depth == 0 else 7)
    if kind in (0, 1):
        return rng.choice(BIG_INTS)
    if kind == 2 and isinstance(current, int) and not isinstance(current, bool):
        return current * rng.choice((2, 3, 16, 1000, 1 << 16, 1 << 31))
    if kind == 3:
        return rng.choice(FLOATS)
    if kind == 4:
        return rng.choice(STRINGS)
    if kind == 5:
        return rng.random() < 0.5
    if kind == 6:
        return None
    if kind == 7:
        return [_value(rng, None, depth + 1) for _ in range(rng.randrange(5))]
    return {rng.choice(STRINGS[:12]): _value(rng, None, depth + 1) for _ in range(rng.randrange(3))}


def _resize(tree: dict, rng: random.Random) -> None:
    """A size changed everywhere it appears (every tensor's dims, every int of a node): shapes
    stay consistent, so the description often stays valid and its size reaches the limits."""
    sizes = sorted({d for t in tree.get("tensors", {}).values() for d in t.get("dims", [])})
    if not sizes:
        return
    old = rng.choice(sizes)
    new = rng.choice(BIG_INTS[5:]) if rng.random() < 0.5 else old * rng.choice((2, 3, 17, 1000, 1 << 16, 1 << 31))

    def swap(values):
        return [new if v == old else v for v in values]

    for t in tree["tensors"].values():
        t["dims"] = swap(t.get("dims", []))
    for node in tree.get("nodes", []):
        for key, value in node.items():
            if value == old and isinstance(value, int) and not isinstance(value, bool):
                node[key] = new


def mutate(base: dict, seed: int) -> dict:
    """One to three mutations of a copy of `base`, all decided by `seed` (drawing only the seed
    through Hypothesis keeps an example fast; shrinking a mutation buys nothing)."""
    rng = random.Random(seed)
    tree = json.loads(json.dumps(base))
    resizes = rng.choice((0, 1, 1, 2))  # first, while the tree still has the base's shape
    for _ in range(resizes):
        _resize(tree, rng)
    for _ in range(rng.randint(0 if resizes else 1, 2)):
        path = rng.choice(positions(tree))
        parent, current = None, tree
        for key in path:
            parent, current = current, current[key]
        op = rng.choice(["replace"] * 6 + ["delete", "add"])
        if not path:
            op = "add"
        value = _value(rng, current)
        if op == "add":
            target = current if isinstance(current, dict) else parent if isinstance(parent, dict) else tree
            target[rng.choice(["extra", "uid", "strides", "layout", "io", "window_left", "softcap", "lse"])] = value
        elif op == "delete":
            del parent[path[-1]]
        elif value is None:  # JSON null is absence: write it as such
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return tree


def stand_in_kernels(plan) -> dict:
    """What compile_kernels returns, without the DSL: each variant's declared ABI and geometry."""
    return {
        v: CompiledKernel(
            v, f"{v.name}_entry", b"\x7fELF", tuple(v.params), v.block, 0, v.grid_rule, v.tiles, v.ctas_per_sm
        )  # fmt: skip
        for v in plan.variants
    }


def assembled_bytes(desc) -> bytes:
    """The build's pipeline with stand-ins for the compile (kernels, tensor maps, build key)."""
    plan = resolve(validate(desc))
    maps = [{a.param: bytes(128) for a in launch.args if a.kind == "tmap"} for launch in plan.launches]
    return _encode_checked(planfile.assemble(plan, stand_in_kernels(plan), maps, desc.to_dict()))


@pytest.fixture(autouse=True)
def cheap_build_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planfile, "build_key", lambda description: "ab" * 32)


def test_every_base_description_resolves_and_encodes(bases: list[dict]) -> None:
    for base in bases:
        assembled_bytes(parse_description(json.dumps(base), fmt="json"))


def test_mutated_descriptions_are_refused_by_path_or_make_a_plan_the_runtime_reads(bases: list[dict]) -> None:
    counts = {"refused": 0, "built": 0}

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(base=st.integers(0, len(bases) - 1), seed=st.integers(0, (1 << 64) - 1))
    def check(base: int, seed: int) -> None:
        text = json.dumps(mutate(bases[base], seed))
        try:
            assembled_bytes(parse_description(text, fmt="json"))
        except DescriptionError as exc:
            assert exc.problems and all(p.path and p.message for p in exc.problems), text[:2000]
            counts["refused"] += 1
            return
        counts["built"] += 1

    check()
    assert counts["refused"] + counts["built"] >= EXAMPLES
    assert counts["built"] > EXAMPLES // 50  # some mutations must stay valid, or this tests only refusals


@pytest.mark.parametrize(
    "edit, path",
    [
        ({"nodes.1.name": "n" * 129}, "nodes[1].name"),
        ({"nodes.1.name": "n" * 120}, "nodes[1].name"),  # its workspace regions' names: "<node>.o_partial"
        ({"nodes.1.name": "\udcff"}, "nodes[1].name"),
        ({"name": "n" * 257}, "name"),
        ({"tensors.q.uid": 1 << 63}, "tensors.q.uid"),
        ({"tensors.q.dims": [64, 560000, 16, 128], "tensors.o.dims": [64, 560000, 16, 128],
          "tensors.k_new.dims": [64, 70000, 16, 128], "tensors.v_new.dims": [64, 70000, 16, 128],
          "tensors.k_cache.dims": [64, 16, 70000, 128], "tensors.v_cache.dims": [64, 16, 70000, 128]},
         "tensors.q.dims[1]"),
        ({"tensors.q.dims": [1 << 31, 32, 1, 128], "tensors.o.dims": [1 << 31, 32, 1, 128],
          "tensors.k_new.dims": [1 << 31, 8, 1, 128], "tensors.v_new.dims": [1 << 31, 8, 1, 128],
          "tensors.page_table.dims": [1 << 31, 512], "tensors.cache_len.dims": [1 << 31]},
         "tensors.k_new.dims[0]"),
        ({"tensors.k_cache.dims": [1 << 60, 16, 8, 128], "tensors.v_cache.dims": [1 << 60, 16, 8, 128]},
         "tensors.k_cache.dims"),
    ],
)  # fmt: skip
def test_sizes_over_the_formats_limits_name_the_field(bases: list[dict], edit: dict, path: str) -> None:
    base = json.loads(json.dumps(bases[BASES.index(ROOT / "plans/golden/llama3-8b-decode-page16.toml")]))
    for dotted, value in edit.items():
        *parents, last = dotted.split(".")
        table = base
        for part in parents:
            table = table[int(part)] if isinstance(table, list) else table[part]
        table[last] = value
    with pytest.raises(DescriptionError) as info:
        assembled_bytes(parse_description(json.dumps(base), fmt="json"))
    assert path in [p.path for p in info.value.problems], info.value


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("attn_scale", 1e300, "float32"),
        ("softcap", 1e300, "float32"),
        ("softcap", 1e-300, "larger softcap"),
        ("window_left", 1 << 31, "int32"),
        ("window_right", 1 << 40, "int32"),
    ],
)
def test_constants_over_the_kernels_types_name_the_field(key: str, value, words: str) -> None:
    d = tomllib.loads((ROOT / "plans/examples/default.toml").read_text())
    d["nodes"][0][key] = value
    if key.startswith("window"):
        d["nodes"][0].pop("causal")
    with pytest.raises(DescriptionError) as info:
        assembled_bytes(parse_description(json.dumps(d), fmt="json"))
    found = {p.path: p.message for p in info.value.problems}
    assert words in found[f"nodes[0].{key}"], found


@pytest.mark.parametrize(
    "change, words",
    [
        ({"slots": (schema.TensorSlot("x" * 129, 1, "fp32", (4,), (1,), True, 4),)}, r"slots\[0\]\.name: longer"),
        ({"slots": (schema.TensorSlot("x", 1 << 64, "fp32", (4,), (1,), True, 4),)}, "out of range"),
        (
            {
                "launches": (schema.Launch(0, (1, 1, 1), (schema.Arg(slot=0),), "\udcff"),),
                "nodes": (schema.NodeRecord("silu_mul", "\udcff", "", {"rows": 1, "n": 2}, {"x": 0, "out": 0}),),
            },
            "surrogates",
        ),
    ],
)
def test_the_builds_last_check_refuses_what_the_runtime_would(change: dict, words: str) -> None:
    """The net under validate and resolve: a plan the runtime's reader would refuse fails the
    build as a PlanLimitError (a FrostcError: `frostc build` exits 2), naming the field."""
    plan = schema.PlanData(
        header=schema.Header("toy", "0.1.0", "4.8.0", "sm_90a", 13000, "ab" * 32),
        slots=(schema.TensorSlot("x", 1, "fp32", (4,), (1,), True, 4),),
        kernels=(
            schema.Kernel("k", "k_entry", b"\x7fELF", (schema.Param("x", "ptr"),), (32, 1, 1), (1, 1, 1), 0, "1"),
        ),
        launches=(schema.Launch(0, (1, 1, 1), (schema.Arg(slot=0),), "act"),),
        nodes=(schema.NodeRecord("silu_mul", "act", "", {"rows": 1, "n": 2}, {"x": 0, "out": 0}),),  # a toy: in place
    )
    with pytest.raises(PlanLimitError, match=words) as info:
        _encode_checked(dataclasses.replace(plan, **change))
    assert isinstance(info.value, FrostcError) and "please report this" in str(info.value)
