"""The plan file format (frost_runtime.schema): round trips, determinism, the header read alone,
the content hash over header and body, and every kind of corruption declined with PlanFormatError
and never another exception.

Plans here are made by hand with a fake cubin, so nothing is compiled."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import msgpack
import pytest
from frost_runtime import schema
from frost_runtime.schema import (
    FORMAT_VERSION,
    MAGIC,
    Arg,
    Header,
    Kernel,
    Launch,
    LengthContract,
    NodeMask,
    NodeRecord,
    Param,
    PlanData,
    PlanFormatError,
    TensorSlot,
    WorkspaceRegion,
    content_hash,
    decode_plan,
    encode_plan,
    read_header,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FAKE_CUBIN = b"\x7fELF" + bytes(range(256)) * 2


TOY_TMAP = bytes(8) + bytes(range(1, 121))  # a tensor map: address zero, then 120 other bytes
TOY_SIZES = {"batch": 2, "heads_q": 8, "heads_kv": 8, "head_dim": 64, "seq_q": 128, "seq_kv": 128}
TOY_NODE = NodeRecord(
    op="sdpa",
    name="attn",
    form="dense",
    sizes=TOY_SIZES | {"tokens_q": 256, "tokens_kv": 256},
    slots={"q": 0, "k": 0, "v": 0, "o": 0, "lse": 1},  # a toy: k, v and o share q's slot
    constants={"attn_scale": 0.125},
    mask=NodeMask(causal=True, alignment="top_left", window_left=None, window_right=0, softcap=None),
)


def make_plan() -> PlanData:
    """Two slots, one kernel with one parameter of each kind, one launch."""
    return PlanData(
        header=Header(
            name="toy",
            frostc_version="0.1.0",
            cutlass_dsl_version="4.8.0",
            target_arch="sm_90a",
            min_driver=13000,
            build_key="ab" * 32,
        ),
        slots=(
            TensorSlot("q", 1, "bf16", (2, 8, 128, 64), (65536, 64, 512, 1), False, 16),
            TensorSlot("lse", 7, "fp32", (2, 8, 128), (1024, 128, 1), True, 4),
        ),
        kernels=(
            Kernel(
                name="sdpa_fwd_mma.bf16.d64.causal.lse",
                entry="kernel_entry_0",
                cubin=FAKE_CUBIN,
                params=(
                    Param("q", "ptr"),
                    Param("seq_q", "i32"),
                    Param("q.stride_b", "i64"),
                    Param("scale", "f32"),
                    Param("q.tmap", "tmap"),
                    Param("q.extents", "i32x3"),
                ),
                block=(128, 1, 1),
                cluster=(1, 1, 1),
                smem_bytes=49152,
                grid_rule="(ceil(seq_q / 128), heads_q, batch)",
                tiles={"block_m": 128, "block_n": 128, "threads": 128},
                ctas_per_sm=1,
            ),
        ),
        launches=(
            Launch(
                kernel=0,
                grid=(16, 1, 1),
                args=(
                    Arg(slot=0),
                    Arg(value=128),
                    Arg(value=65536),
                    Arg(value=0.18),
                    Arg(slot=0, tmap=TOY_TMAP),
                    Arg(value=(128, 8, 2)),
                ),
                node="attn",
            ),
        ),
        workspace_bytes=0,
        nodes=(TOY_NODE,),
    )


@pytest.fixture(scope="module")
def encoded() -> bytes:
    return encode_plan(make_plan())


def decode_error(data: Any) -> str:
    """The PlanFormatError message `decode_plan` raises for `data` (any other exception fails)."""
    with pytest.raises(PlanFormatError) as e:
        decode_plan(data)
    return str(e.value)


# -------------------------------------------------------------------------- hand-made variants


def unpack_top(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, use_single_float=False)


def seal(top: dict) -> None:
    """Recompute the content hash of a decoded file as the README defines it, written here
    apart from the schema's code: SHA-256 over the msgpack of {magic, format, the header without
    content_hash}, then the body bytes."""
    fields = {k: v for k, v in top["header"].items() if k != "content_hash"}
    sealed = pack({"magic": top["magic"], "format": top["format"], "header": fields}) + top["body"]
    top["header"]["content_hash"] = hashlib.sha256(sealed).hexdigest()


def with_body(data: bytes, edit: Callable[[dict], None]) -> bytes:
    """`data` with its body edited by hand and the content hash recomputed, so the hash passes
    and only the body's own checks can catch the edit."""
    top = unpack_top(data)
    body = msgpack.unpackb(top["body"], raw=False)
    edit(body)
    top["body"] = pack(body)
    seal(top)
    return pack(top)


def with_top(data: bytes, edit: Callable[[dict], None]) -> bytes:
    top = unpack_top(data)
    edit(top)
    return pack(top)


# ------------------------------------------------------------------------------- good plans


def test_round_trip_gives_the_same_plan(encoded: bytes) -> None:
    decoded = decode_plan(encoded)
    assert decoded == replace(make_plan(), header=decoded.header)
    assert replace(decoded.header, content_hash="") == make_plan().header


def test_round_trip_keeps_value_types(encoded: bytes) -> None:
    args = decode_plan(encoded).launches[0].args
    assert [type(a.value) for a in args[1:4]] == [int, int, float]
    assert args[3].value == 0.18  # float64 on the wire: no rounding to float32
    assert (args[4].slot, args[4].tmap) == (0, TOY_TMAP)  # a tensor map keeps its slot and bytes
    assert args[5].value == (128, 8, 2)  # i32x3 comes back as a tuple
    assert decode_plan(encoded).kernels[0].ctas_per_sm == 1


def test_encoding_is_deterministic() -> None:
    assert encode_plan(make_plan()) == encode_plan(make_plan())


def test_re_encoding_a_decoded_plan_gives_the_same_bytes(encoded: bytes) -> None:
    assert encode_plan(decode_plan(encoded)) == encoded


def test_tiles_order_does_not_change_the_bytes() -> None:
    plan = make_plan()
    kernel = replace(plan.kernels[0], tiles={"threads": 128, "block_n": 128, "block_m": 128})
    assert encode_plan(replace(plan, kernels=(kernel,))) == encode_plan(plan)


def test_header_is_readable_alone(encoded: bytes) -> None:
    header, body = read_header(encoded)
    assert header.name == "toy"
    assert header.target_arch == "sm_90a"
    assert header.min_driver == 13000
    assert header.build_key == "ab" * 32
    assert header.content_hash == content_hash(header, body)
    top = unpack_top(encoded)
    seal(top)
    assert top["header"]["content_hash"] == header.content_hash  # the documented definition


def test_header_does_not_decode_the_body(encoded: bytes) -> None:
    # a body that is not even msgpack: read_header still works, decode_plan refuses
    top = unpack_top(encoded)
    top["body"] = b"\xc1 not msgpack"
    seal(top)
    data = pack(top)
    header, _ = read_header(data)
    assert header.name == "toy"
    assert "body: not valid msgpack" in decode_error(data)


def test_file_is_one_map_with_magic_and_format(encoded: bytes) -> None:
    top = unpack_top(encoded)
    assert list(top) == ["magic", "format", "header", "body"]
    assert top["magic"] == MAGIC == "frostc-plan"
    assert top["format"] == FORMAT_VERSION == 8


def test_bytearray_and_memoryview_are_accepted(encoded: bytes) -> None:
    assert decode_plan(bytearray(encoded)) == decode_plan(memoryview(encoded)) == decode_plan(encoded)


def test_an_early_launch_round_trips_and_the_first_launch_cannot_be_one() -> None:
    plan = make_plan()
    second = replace(plan.launches[0], early=True)
    two = replace(plan, launches=(plan.launches[0], second))
    assert [launch.early for launch in decode_plan(encode_plan(two)).launches] == [False, True]
    first_early = replace(plan, launches=(second, plan.launches[0]))
    with pytest.raises(PlanFormatError, match=r"launches\[0\]\.early: the first launch cannot start early"):
        encode_plan(first_early)


def test_an_early_flag_that_is_not_a_bool_is_refused(encoded: bytes) -> None:
    def edit(body: dict) -> None:
        body["launches"][0]["early"] = 1

    assert "launches[0].early: expected bool" in decode_error(with_body(encoded, edit))


def test_encode_refuses_an_inconsistent_plan() -> None:
    plan = make_plan()
    bad = replace(plan, kernels=(replace(plan.kernels[0], cubin=b"MZ not elf"),))
    with pytest.raises(PlanFormatError, match="not an ELF cubin"):
        encode_plan(bad)


# ---------------------------------------------------------------------------- corrupt files


@pytest.mark.parametrize("cut", [0, 1, 2, 16, 100, -300, -1])
def test_truncated_file_is_refused(encoded: bytes, cut: int) -> None:
    decode_error(encoded[:cut])


def test_truncation_at_every_point_is_refused(encoded: bytes) -> None:
    for cut in range(0, len(encoded), 7):
        with pytest.raises(PlanFormatError):
            decode_plan(encoded[:cut])


def test_trailing_bytes_are_refused(encoded: bytes) -> None:
    assert "not valid msgpack" in decode_error(encoded + b"\x00")


def test_wrong_magic_is_refused(encoded: bytes) -> None:
    data = with_top(encoded, lambda top: top.update(magic="frostc-plam"))
    assert "wrong magic" in decode_error(data)


def test_a_msgpack_file_that_is_not_a_map_is_refused() -> None:
    assert "wrong magic" in decode_error(pack(["frostc-plan", 1]))


def test_newer_format_says_newer_and_to_rebuild(encoded: bytes) -> None:
    data = with_top(encoded, lambda top: top.update(format=FORMAT_VERSION + 1))
    message = decode_error(data)
    assert f"format {FORMAT_VERSION + 1} is newer" in message
    assert "newer frost_runtime" in message and "frostc build DESC -o PLAN" in message
    with pytest.raises(PlanFormatError, match="newer"):
        read_header(data)


def test_older_format_says_older(encoded: bytes) -> None:
    assert "older" in decode_error(with_top(encoded, lambda top: top.update(format=0)))


def test_a_format_4_plan_is_refused_with_the_fix(encoded: bytes) -> None:
    """Format 4 sealed the body alone: such a file, whole as it is, is refused by its format."""

    def as_format_4(top: dict) -> None:
        top["format"] = 4
        top["header"]["content_hash"] = hashlib.sha256(top["body"]).hexdigest()

    message = decode_error(with_top(encoded, as_format_4))
    assert "plan format 4 is older than this runtime's format 8" in message
    assert "rebuild it with this frostc: frostc build DESC -o PLAN" in message


def test_a_format_7_plan_is_refused_with_the_fix(encoded: bytes) -> None:
    """Format 7 recorded no nodes: a whole format-7 file (sealed as format 7) is refused by its
    format, naming the fix, before its body is read."""

    def as_format_7(top: dict) -> None:
        top["format"] = 7
        body = msgpack.unpackb(top["body"], raw=False)
        del body["nodes"]
        top["body"] = pack(body)
        seal(top)

    message = decode_error(with_top(encoded, as_format_7))
    assert message == (
        "plan format 7 is older than this runtime's format 8; rebuild it with this frostc: frostc build DESC -o PLAN"
    )


def test_format_as_a_string_is_refused(encoded: bytes) -> None:
    assert "plan.format" in decode_error(with_top(encoded, lambda top: top.update(format="1")))


def test_missing_body_is_refused(encoded: bytes) -> None:
    assert "plan.body: missing" in decode_error(with_top(encoded, lambda top: top.pop("body")))


def test_missing_header_field_is_refused(encoded: bytes) -> None:
    data = with_top(encoded, lambda top: top["header"].pop("min_driver"))
    assert "header.min_driver: missing" in decode_error(data)


def flip(data: bytes, at: int, bit: int = 0) -> bytes:
    return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]


MISMATCH = "content hash does not match the header and body"


def test_flipped_byte_in_the_body_is_a_hash_mismatch(encoded: bytes) -> None:
    _, body = read_header(encoded)
    at = encoded.index(body) + len(body) // 2  # inside the fake cubin
    assert MISMATCH in decode_error(flip(encoded, at))


@pytest.mark.parametrize(
    ("text", "edited"),
    [
        (b"sm_90a", "target_arch 'sm_91a'"),  # a well-formed target: only the hash can tell
        (b"\xcd\x32\xc8", "min_driver 13001"),  # 13000 as uint16: the low bit of its last byte
        (b"ab" * 32, "build_key"),
        (b"toy", "name"),
        (b"4.8.0", "cutlass_dsl_version"),
    ],
)
def test_flipped_byte_in_the_header_is_a_hash_mismatch(encoded: bytes, text: bytes, edited: str) -> None:
    at = encoded.index(text) + len(text) - 1
    message = decode_error(flip(encoded, at))
    assert MISMATCH in message, edited
    assert "frostc build DESC -o PLAN" in message


@pytest.mark.parametrize(
    "field, value",
    [("name", "toy2"), ("frostc_version", "0.1.1"), ("cutlass_dsl_version", "4.8.1"), ("target_arch", "sm_100a"),
     ("min_driver", 12080), ("build_key", "cd" * 32)],
)  # fmt: skip
def test_every_header_field_is_under_the_hash(encoded: bytes, field: str, value: Any) -> None:
    """A header edited with care (well formed, the format-4 body hash left right) is refused."""
    header, body = read_header(encoded)
    assert content_hash(replace(header, **{field: value}), body) != header.content_hash
    assert MISMATCH in decode_error(with_top(encoded, lambda top: top["header"].update({field: value})))


def test_a_header_edited_and_resealed_decodes(encoded: bytes) -> None:
    """The hash proves a file whole, not who wrote it: resealed, an edit decodes (a pin, the
    file's SHA-256, says which plan it must be; tests/test_integrity.py)."""

    def edit(top: dict) -> None:
        top["header"]["min_driver"] = 12080
        seal(top)

    assert decode_plan(with_top(encoded, edit)).header.min_driver == 12080


def test_every_single_bit_flip_anywhere_in_the_file_is_refused(encoded: bytes) -> None:
    for at in range(len(encoded)):
        for bit in range(8):
            with pytest.raises(PlanFormatError):
                decode_plan(flip(encoded, at, bit))


def test_edited_content_hash_is_a_mismatch(encoded: bytes) -> None:
    data = with_top(encoded, lambda top: top["header"].update(content_hash="0" * 64))
    assert MISMATCH in decode_error(data)


@pytest.mark.parametrize("where", ["top", "header"])
def test_an_extra_field_is_refused_by_name(encoded: bytes, where: str) -> None:
    def edit(top: dict) -> None:
        (top if where == "top" else top["header"])["signed_by"] = "me"
        seal(top)

    message = decode_error(with_top(encoded, edit))
    assert f"{'plan' if where == 'top' else 'header'}.signed_by: not a field of a format-8 plan" in message


def test_another_encoding_of_the_same_values_is_refused(encoded: bytes) -> None:
    """min_driver 13000 as a uint32 instead of a uint16: the same values, other bytes."""
    data = encoded.replace(b"\xaamin_driver\xcd\x32\xc8", b"\xaamin_driver\xce\x00\x00\x32\xc8")
    assert len(data) == len(encoded) + 2
    assert "not in its canonical encoding" in decode_error(data)


def test_fields_in_another_order_are_refused(encoded: bytes) -> None:
    top = unpack_top(encoded)
    reordered = pack({k: top[k] for k in ("format", "magic", "header", "body")})
    assert "not in its canonical encoding" in decode_error(reordered)


def set_path(body: dict, path: str, value: Any) -> None:
    """body["a"][0]["b"] = value for path "a.0.b"."""
    *parents, last = path.split(".")
    target: Any = body
    for key in parents:
        target = target[int(key)] if key.isdigit() else target[key]
    target[int(last) if last.isdigit() else last] = value


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("launches.0.args.0", {"slot": 2}, "launches[0].args[0].slot: 2 but the plan has 2 slots"),
        ("launches.0.args.0", {"slot": 300}, "launches[0].args[0].slot: 300 is outside [0, 255]"),
        ("launches.0.args.1", {"slot": 0}, "a slot bound to i32 parameter 'seq_q'"),
        ("launches.0.args.1", {"value": 1.5}, "does not fit i32 parameter 'seq_q'"),
        ("launches.0.args.1", {"value": 1 << 31}, "does not fit i32 parameter 'seq_q'"),
        ("launches.0.args.1", {"value": True}, "launches[0].args[1].value: expected int or float or list, found bool"),
        ("launches.0.args.3", {"value": "0.18"}, "launches[0].args[3].value: expected int or float or list, found str"),
        ("launches.0.args.0", [0], "launches[0].args[0]: expected a map, found list"),
        ("launches.0.args.4", {"slot": 0, "tmap": b"x" * 100}, "tensor-map parameter 'q.tmap' needs a slot or a"),
        ("launches.0.args.4", {"slot": 0}, "tensor-map parameter 'q.tmap' needs a slot or a workspace offset"),
        ("launches.0.args.4", {"workspace": 1 << 40, "tmap": b"x" * 128}, "'q.tmap' needs a slot or a workspace"),
        (
            "launches.0.args.4",
            {"slot": 0, "tmap": b"x" * 128, "value": 1},
            "a tensor map takes tmap and exactly one of slot or workspace",
        ),
        (
            "launches.0.args.4",
            {"slot": 0, "workspace": 0, "tmap": b"x" * 128},
            "a tensor map takes tmap and exactly one of slot or workspace",
        ),
        ("launches.0.args.0", {"slot": 0, "tmap": b"x" * 128}, "tensor-map parameter 'q' needs"),
        ("launches.0.args.5", {"value": [128, 8]}, "expected three int32 for 'q.extents'"),
        ("launches.0.args.5", {"value": [128, 8, -1]}, "expected three int32 for 'q.extents'"),
        ("launches.0.args.5", {"value": 128}, "expected three int32 for 'q.extents'"),
        ("launches.0.args.1", {"value": [1, 2, 3]}, "a list for i32 parameter 'seq_q'"),
        ("kernels.0.ctas_per_sm", -1, "kernels[0].ctas_per_sm: -1 is outside"),
        ("launches.0.kernel", 1, "launches[0].kernel: 1 but the plan has 1 kernels"),
        ("launches.0.grid", [1, 8], "launches[0].grid: 2 entries, at least 3 needed"),
        ("kernels.0.params.1", ["seq_q", "u8"], "kernels[0].params[1]: kind 'u8' is not one of"),
        ("kernels.0.params.1", ["seq_q"], "kernels[0].params[1]: expected [name, kind]"),
        ("kernels.0.cubin", b"MZ\x90\x00", "kernels[0].cubin: not an ELF cubin"),
        ("kernels.0.cubin", "\x7fELF", "kernels[0].cubin: expected bytes, found str"),
        ("kernels.0.smem_bytes", -1, "kernels[0].smem_bytes: -1 is outside"),
        ("kernels.0.block", [128, 1, 1.0], "kernels[0].block[2]: expected an integer"),
        ("kernels.0.tiles", {"block_m": "128"}, "kernels[0].tiles: expected a map of names to integers"),
        ("slots.0.dims", [2, -8, 128, 64], "slots[0].dims[1]: expected an integer in [1,"),
        ("slots.0.dims", [], "slots[0].dims: 0 entries, at least 1 needed"),
        ("slots.0.strides", [65536, 64, 512], "slots[0].strides: 3 entries, at least 4 needed"),
        ("slots.0.is_output", 1, "slots[0].is_output: expected bool, found int"),
        ("slots.0.uid", True, "slots[0].uid: expected int, found bool"),
        ("slots.0.uid", 0, "slots[0].uid: 0 is outside"),
        ("slots.0.dtype", "int8", "slots[0].dtype: 'int8' is not one of"),
        ("slots.1.name", "q", "slots[1].name: 'q' appears twice"),
        ("workspace_bytes", -1, "workspace_bytes: -1 is outside"),
    ],
)
def test_wrong_body_field_is_refused_with_its_path(encoded: bytes, path: str, value: Any, words: str) -> None:
    data = with_body(encoded, lambda body: set_path(body, path, value))
    assert words in decode_error(data)


def test_fewer_args_than_params_is_refused(encoded: bytes) -> None:
    data = with_body(encoded, lambda body: body["launches"][0]["args"].pop())
    assert "launches[0].args: 5 arguments for 6 parameters" in decode_error(data)


def test_more_args_than_params_is_refused(encoded: bytes) -> None:
    data = with_body(encoded, lambda body: body["launches"][0]["args"].append({"value": 0}))
    assert "7 arguments for 6 parameters" in decode_error(data)


def test_missing_body_field_is_refused(encoded: bytes) -> None:
    data = with_body(encoded, lambda body: body["kernels"][0].pop("entry"))
    assert "kernels[0].entry: missing" in decode_error(data)


def test_body_that_is_not_a_map_is_refused(encoded: bytes) -> None:
    top = unpack_top(encoded)
    top["body"] = pack([1, 2, 3])
    seal(top)
    assert "body: expected a map, found list" in decode_error(pack(top))


@pytest.mark.parametrize("data", ["a plan", None, 42, ["frostc-plan"], {"magic": "frostc-plan"}])
def test_non_bytes_input_is_refused(data: Any) -> None:
    assert "a plan is bytes" in decode_error(data)


@pytest.mark.parametrize("seed", range(20))
def test_random_garbage_is_refused(seed: int) -> None:
    rng = random.Random(seed)
    decode_error(rng.randbytes(rng.randrange(0, 4096)))


def test_plan_error_is_a_value_error() -> None:
    assert issubclass(PlanFormatError, ValueError)


# ------------------------------------------------------------------------------ random edits

_EDIT = st.tuples(
    st.sampled_from(["flip", "insert", "delete", "truncate"]),
    st.integers(min_value=0, max_value=1 << 20),  # position, taken modulo the length
    st.integers(min_value=0, max_value=255),  # a byte, or the bit to flip (mod 8)
)


def mutate(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for op, position, byte in edits:
        at = position % (len(buf) + 1)
        if op == "flip" and at < len(buf):
            buf[at] ^= 1 << (byte % 8)
        elif op == "insert":
            buf[at:at] = bytes([byte])
        elif op == "delete" and at < len(buf):
            del buf[at]
        elif op == "truncate":
            del buf[at:]
    return bytes(buf)


def decodes_or_refuses(data: bytes) -> None:
    try:
        plan = decode_plan(data)
    except PlanFormatError:
        return
    assert isinstance(plan, PlanData)


_ENCODED = encode_plan(make_plan())


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_EDIT, min_size=1, max_size=4))
def test_mutated_file_decodes_or_raises_plan_format_error(edits: list[tuple[str, int, int]]) -> None:
    decodes_or_refuses(mutate(_ENCODED, edits))


_BODY = read_header(_ENCODED)[1]


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_EDIT, min_size=1, max_size=4))
def test_mutated_body_with_a_matching_hash_decodes_or_raises_plan_format_error(
    edits: list[tuple[str, int, int]],
) -> None:
    # past the hash check: the body's own parsing and checks must hold on their own
    top = unpack_top(_ENCODED)
    top["body"] = mutate(_BODY, edits)
    seal(top)
    decodes_or_refuses(pack(top))


# ------------------------------------------------------------------------------- format 3: workspace, lengths


def varlen_plan() -> PlanData:
    """make_plan() with an int32 length slot, a workspace of two regions, a pointer argument
    into it and a length contract."""
    plan = make_plan()
    slots = plan.slots + (TensorSlot("cu_q", 9, "int32", (5,), (1,), False, 4),)
    kernel = replace(plan.kernels[0], params=plan.kernels[0].params + (Param("tiles", "ptr"),))
    launch = replace(plan.launches[0], args=plan.launches[0].args + (Arg(workspace=256),), node="attn")
    return replace(
        plan,
        slots=slots,
        kernels=(kernel,),
        launches=(launch,),
        workspace_bytes=300,
        workspace=(WorkspaceRegion("attn.sequences", 0, 64), WorkspaceRegion("attn.tiles", 256, 44, zeroed=True)),
        lengths=(LengthContract(2, "offsets", 100, 400),),
    )


def test_workspace_regions_and_contracts_round_trip() -> None:
    data = encode_plan(varlen_plan())
    decoded = decode_plan(data)
    assert decoded == replace(varlen_plan(), header=decoded.header)
    assert decoded.launches[0].args[-1] == Arg(workspace=256) and decoded.launches[0].node == "attn"


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("launches.0.args.6", {"workspace": 300}, "outside the 300-byte workspace"),
        ("launches.0.args.6", {"workspace": 0, "slot": 1}, "exactly one"),
        ("launches.0.args.1", {"workspace": 0}, "workspace offset bound to i32"),
        ("workspace.1.offset", 200, "multiple of 256"),
        ("workspace.1.bytes", 45, "within the 300-byte workspace"),
        ("workspace.0.name", "attn.tiles", "appears twice"),
        ("workspace.1.bytes", 43, "zeroed in 4-byte words"),
        ("workspace.1.zeroed", 1, "zeroed"),
        ("lengths.0.slot", 0, "not a rank-1 int32 slot"),
        ("lengths.0.kind", "prefix", "is not one of"),
        ("lengths.0.longest", -1, "outside"),
    ],
)
def test_bad_workspace_or_contract_is_refused(path: str, value: Any, words: str) -> None:
    def edit(body: dict) -> None:
        *parents, last = path.split(".")
        table: Any = body
        for part in parents:
            table = table[int(part)] if isinstance(table, list) else table[part]
        table[int(last) if isinstance(table, list) else last] = value

    assert words in decode_error(with_body(encode_plan(varlen_plan()), edit))


# ------------------------------------------------------------------------------- format 8: node records


def test_a_node_record_round_trips_with_its_types(encoded: bytes) -> None:
    (node,) = decode_plan(encoded).nodes
    assert node == TOY_NODE
    assert type(node.constants["attn_scale"]) is float and node.mask.window_left is None
    top = unpack_top(encoded)
    written = msgpack.unpackb(top["body"], raw=False)["nodes"][0]
    assert list(written) == ["op", "name", "form", "sizes", "constants", "slots", "mask"]
    assert written["mask"] == {"causal": True, "alignment": "top_left", "window_left": None, "window_right": 0,
                               "softcap": None}  # fmt: skip


def test_every_op_and_form_round_trips() -> None:
    """A node of each (op, form) the format knows, with all its roles (the slots are toys)."""
    plan = make_plan()
    slots = plan.slots + (
        TensorSlot("offsets", 3, "int32", (3,), (1,), False, 4),
        TensorSlot("lengths", 4, "int32", (2,), (1,), False, 4),
        TensorSlot("table", 5, "int32", (2, 8), (8, 1), False, 4),
    )
    lengths = (LengthContract(2, "offsets", 128, 256), LengthContract(3, "lengths", 128))
    roles = {"cu_seqlens_q": 2, "cu_seqlens_kv": 2, "seq_len_q": 3, "seq_len_kv": 3, "page_table": 4, "slot_mapping": 3}
    nodes = []
    for i, ((op, form), spec) in enumerate(schema.NODE_FORMS.items()):
        mask = TOY_NODE.mask if spec.mask else None
        nodes.append(NodeRecord(
            op, f"n{i}", form, dict.fromkeys(spec.sizes, 16),
            {role: roles.get(role, i % 2) for role in spec.roles + spec.optional},
            dict.fromkeys(spec.constants, 0.5), mask,
        ))  # fmt: skip
    launches = tuple(replace(plan.launches[0], node=n.name) for n in nodes)
    many = replace(plan, slots=slots, lengths=lengths, nodes=tuple(nodes), launches=launches)
    decoded = decode_plan(encode_plan(many))
    assert decoded.nodes == many.nodes
    assert {(n.op, n.form) for n in decoded.nodes} == set(schema.NODE_FORMS)


def test_a_node_map_in_another_order_gives_the_same_bytes() -> None:
    plan = make_plan()
    reversed_maps = {key: dict(reversed(getattr(TOY_NODE, key).items())) for key in ("sizes", "slots")}
    node = replace(TOY_NODE, **reversed_maps)
    assert encode_plan(replace(plan, nodes=(node,))) == encode_plan(plan)


@pytest.mark.parametrize(
    "edit",
    [
        lambda body: body["nodes"][0].update(sizes=dict(reversed(body["nodes"][0]["sizes"].items()))),
        lambda body: body["nodes"][0].update(extra=1),
        lambda body: body.update(signed_by="me"),
        lambda body: body.update({k: body.pop(k) for k in ("slots", "kernels")}),
    ],
    ids=["sizes-reordered", "extra-node-field", "extra-body-field", "body-fields-reordered"],
)
def test_a_body_in_another_encoding_is_refused(encoded: bytes, edit) -> None:
    """The same values in other bytes, sealed again: the body must be canonical, as the file is."""
    assert "body: not in its canonical encoding" in decode_error(with_body(encoded, edit))


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("nodes", {}, "body.nodes: expected list, found dict"),
        ("nodes", [], "launches[0].node: 'attn' is not a node of the plan"),
        ("nodes.0", [1], "nodes[0]: expected a map, found list"),
        ("nodes.0.op", "gemm", "nodes[0].op: 'gemm' is not one of ['kv_append', 'rms_norm', 'sdpa', 'silu_mul']"),
        ("nodes.0.op", 3, "nodes[0].op: expected str, found int"),
        ("nodes.0.form", "ragged", "nodes[0].form: 'ragged' is not a form of op 'sdpa' (one of ['dense', 'padded'"),
        ("nodes.0.form", "", "nodes[0].form: '' is not a form of op 'sdpa'"),
        ("nodes.0.name", 5, "nodes[0].name: expected str, found int"),
        ("nodes.0.name", "x" * 129, "nodes[0].name: longer than 128 characters"),
        ("nodes.0.name", "other", "launches[0].node: 'attn' is not a node of the plan"),
        ("nodes.0.sizes", [], "nodes[0].sizes: expected dict, found list"),
        ("nodes.0.sizes", {"batch": 2}, "nodes[0].sizes.heads_q: missing"),
        ("nodes.0.sizes", {"": 1}, "nodes[0].sizes: '' is not a name"),
        ("nodes.0.sizes.batch", 0, "nodes[0].sizes.batch: 0 is not an integer in [1,"),
        ("nodes.0.sizes.batch", 2.0, "nodes[0].sizes.batch: expected int, found float"),
        ("nodes.0.sizes.batch", True, "nodes[0].sizes.batch: expected int, found bool"),
        ("nodes.0.sizes.pages", 4, "nodes[0].sizes.pages: not a size of a sdpa node"),
        ("nodes.0.slots", {"q": 0}, "nodes[0].slots.k: missing"),
        ("nodes.0.slots.q", 2, "nodes[0].slots.q: 2 but the plan has 2 slots"),
        ("nodes.0.slots.q", -1, "nodes[0].slots.q: -1 but the plan has 2 slots"),
        ("nodes.0.slots.q", True, "nodes[0].slots.q: expected int, found bool"),
        ("nodes.0.slots.page_table", 0, "nodes[0].slots.page_table: not a role of a sdpa node of form 'dense'"),
        ("nodes.0.slots.q_descale", 1, "nodes[0].slots.k_descale: missing (q_descale, k_descale, v_descale go"),
        ("nodes.0.constants", {}, "nodes[0].constants.attn_scale: missing"),
        ("nodes.0.constants.eps", 0.5, "nodes[0].constants.eps: not a constant of a sdpa node"),
        ("nodes.0.constants.attn_scale", 1, "nodes[0].constants.attn_scale: expected float, found int"),
        ("nodes.0.constants.attn_scale", -0.5, "nodes[0].constants.attn_scale: -0.5 is not a finite float32 > 0"),
        ("nodes.0.constants.attn_scale", float("nan"), "nodes[0].constants.attn_scale: nan is not a finite"),
        ("nodes.0.constants.attn_scale", 1e39, "nodes[0].constants.attn_scale: 1e+39 is not a finite float32"),
        ("nodes.0.mask", None, "nodes[0].mask: missing"),
        ("nodes.0.mask", 1, "nodes[0].mask: expected dict or NoneType, found int"),
        ("nodes.0.mask.causal", 1, "nodes[0].mask.causal: expected bool, found int"),
        ("nodes.0.mask.alignment", "center", "nodes[0].mask.alignment: 'center' is not one of ['top_left', 'bottom"),
        ("nodes.0.mask.window_left", -1, "nodes[0].mask.window_left: -1 is neither None nor an integer in [0, "),
        ("nodes.0.mask.window_left", 1 << 31, "nodes[0].mask.window_left: 2147483648 is neither None nor"),
        ("nodes.0.mask.window_left", 1.5, "nodes[0].mask.window_left: expected int or NoneType, found float"),
        ("nodes.0.mask.window_right", 3, "nodes[0].mask.window_right: 3, but a causal mask's is 0"),
        ("nodes.0.mask.window_right", None, "nodes[0].mask.window_right: None, but a causal mask's is 0"),
        ("nodes.0.mask.softcap", 0.0, "nodes[0].mask.softcap: 0.0 is neither None nor a finite float32 > 0"),
        ("nodes.0.mask.softcap", 30, "nodes[0].mask.softcap: expected float or NoneType, found int"),
    ],
)
def test_a_wrong_node_field_is_refused_with_its_path(encoded: bytes, path: str, value: Any, words: str) -> None:
    assert words in decode_error(with_body(encoded, lambda body: set_path(body, path, value)))


@pytest.mark.parametrize("key", ["op", "name", "form", "sizes", "constants", "slots", "mask"])
def test_a_missing_node_field_is_refused_with_its_path(encoded: bytes, key: str) -> None:
    assert f"nodes[0].{key}: missing" in decode_error(with_body(encoded, lambda body: body["nodes"][0].pop(key)))


@pytest.mark.parametrize("key", ["causal", "alignment", "window_left", "window_right", "softcap"])
def test_a_missing_mask_field_is_refused_with_its_path(encoded: bytes, key: str) -> None:
    data = with_body(encoded, lambda body: body["nodes"][0]["mask"].pop(key))
    assert f"nodes[0].mask.{key}: missing" in decode_error(data)


def test_a_plan_without_nodes_is_refused(encoded: bytes) -> None:
    assert "body.nodes: missing" in decode_error(with_body(encoded, lambda body: body.pop("nodes")))


def test_node_names_are_unique_and_each_node_has_a_launch(encoded: bytes) -> None:
    twice = with_body(encoded, lambda body: body["nodes"].append(dict(body["nodes"][0])))
    assert "nodes[1].name: 'attn' is empty or appears twice" in decode_error(twice)
    idle = with_body(encoded, lambda body: body["nodes"].append(dict(body["nodes"][0], name="idle")))
    assert "nodes[1]: node 'idle' has no launch" in decode_error(idle)


def test_only_sdpa_nodes_have_a_mask() -> None:
    node = NodeRecord("silu_mul", "attn", "", {"rows": 1, "n": 8}, {"x": 0, "out": 1}, mask=TOY_NODE.mask)
    with pytest.raises(PlanFormatError, match=r"nodes\[0\]\.mask: a silu_mul node has no mask"):
        encode_plan(replace(make_plan(), nodes=(node,)))


def length_node_plan(contract: LengthContract | None, table: TensorSlot | None = None) -> PlanData:
    """make_plan() with an int32 slot 2 as a padded node's seq_len_kv (or, with `table`, a paged
    node's lengths and slot 3 its page table)."""
    plan = make_plan()
    slots = plan.slots + (TensorSlot("len", 3, "int32", (2,), (1,), False, 4),) + ((table,) if table else ())
    roles = dict(TOY_NODE.slots, seq_len_kv=2) | ({"page_table": 3} if table else {})
    sizes = TOY_NODE.sizes | ({"pages": 8, "page_size": 16} if table else {})
    mask = replace(TOY_NODE.mask, alignment="bottom_right")
    node = replace(TOY_NODE, form="paged" if table else "padded", slots=roles, sizes=sizes, mask=mask)
    return replace(plan, slots=slots, nodes=(node,), lengths=(contract,) if contract else ())


def test_a_length_role_needs_a_contract_of_its_kind() -> None:
    good = length_node_plan(LengthContract(2, "lengths", 128))
    assert decode_plan(encode_plan(good)).nodes[0].slots["seq_len_kv"] == 2
    for contract in (None, LengthContract(2, "offsets", 128, 256)):
        with pytest.raises(
            PlanFormatError, match=r"slots\.seq_len_kv: slot 2 has no length contract of kind 'lengths'"
        ):
            encode_plan(length_node_plan(contract))


def test_a_page_table_role_is_a_rank_2_int32_slot() -> None:
    contract = LengthContract(2, "lengths", 128)
    good = length_node_plan(contract, TensorSlot("table", 4, "int32", (2, 8), (8, 1), False, 4))
    assert decode_plan(encode_plan(good)).nodes[0].slots["page_table"] == 3
    for table in (TensorSlot("table", 4, "int32", (16,), (1,), False, 4),
                  TensorSlot("table", 4, "fp32", (2, 8), (8, 1), False, 4)):  # fmt: skip
        with pytest.raises(PlanFormatError, match=r"nodes\[0\]\.slots\.page_table: slot 3 is not a rank-2 int32"):
            encode_plan(length_node_plan(contract, table))
