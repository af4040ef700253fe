"""A plan's identity (the SHA-256 of its file) and pinning it: `frost_runtime.plan_sha256`,
`verify_plan(..., sha256=)` and `load(..., sha256=)`, which refuses a plan the pin does not allow
before the GPU is touched. All on the CPU: `load` is stopped at the driver."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import frost_runtime
import msgpack
import pytest
from frost_runtime import PlanFormatError, PlanIntegrityError, allowed_sha256, plan_sha256, verify_plan
from frost_runtime import driver as driver_module
from frost_runtime.schema import decode_plan, encode_plan

from tests.test_schema import make_plan, seal


@pytest.fixture
def plan(tmp_path: Path) -> Path:
    path = tmp_path / "toy.frost"
    path.write_bytes(encode_plan(make_plan()))
    return path


@pytest.fixture
def other(tmp_path: Path) -> Path:
    path = tmp_path / "other.frost"
    path.write_bytes(encode_plan(replace(make_plan(), workspace_bytes=256)))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class ReachedTheGpu(Exception):
    pass


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """`load` past its CPU checks asks the driver for the device: stop it there."""

    def current_context():
        raise ReachedTheGpu

    monkeypatch.setattr(driver_module, "current_context", current_context)


# ----------------------------------------------------------------------------------- identity


def test_plan_sha256_is_what_sha256sum_prints(plan: Path) -> None:
    data = plan.read_bytes()
    expected = hashlib.sha256(data).hexdigest()
    for source in (data, bytearray(data), memoryview(data), plan, str(plan)):
        assert plan_sha256(source) == expected


def test_one_plan_one_identity(plan: Path, other: Path) -> None:
    """Builds are deterministic and a plan has one encoding: same plan, same hash."""
    assert plan_sha256(encode_plan(decode_plan(plan.read_bytes()))) == sha(plan)
    assert sha(plan) != sha(other)


# ------------------------------------------------------------------------------------- pins


def test_a_pin_is_a_hash_a_collection_or_an_allow_list_file(tmp_path: Path, plan: Path, other: Path) -> None:
    a, b = sha(plan), sha(other)
    listing = tmp_path / "pins.sha256"
    # sha256sum's own output (text and binary mode, an escaped name), comments, blank lines
    listing.write_text(f"# serving fleet, 2025-06\n{a}  {plan}\n\n\\{b.upper()} *dir\\\\other.frost\n")
    assert allowed_sha256(a) == allowed_sha256(f" {a.upper()}\n") == {a}
    assert allowed_sha256([a, b]) == allowed_sha256({a, b}) == allowed_sha256(h for h in (b, a)) == {a, b}
    assert allowed_sha256(listing) == allowed_sha256(str(listing)) == {a, b}


@pytest.mark.parametrize(
    "pin, error, words",
    [
        ("ab12", ValueError, "sha256: 'ab12' is not a SHA-256 (64 hex digits"),
        ("0" * 63, ValueError, "is not a SHA-256"),
        ([], ValueError, "the allow-list is empty"),
        (["0" * 64, "nope"], ValueError, "sha256[1]: 'nope' is not a SHA-256"),
        ([b"0" * 64], ValueError, "sha256[0]"),
        (42, TypeError, "sha256: expected a SHA-256 (64 hex digits), a collection of them, or a file"),
        (b"0" * 64, TypeError, "found bytes"),
        ("no-such-pins.txt", ValueError, "'no-such-pins.txt' is not a SHA-256 (64 hex digits), a collection"),
    ],
)
def test_a_bad_pin_is_refused_naming_it(pin, error: type, words: str) -> None:
    with pytest.raises(error) as e:
        allowed_sha256(pin)
    assert words in str(e.value)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "holds no hashes"),
        ("# only a comment\n", "holds no hashes"),
        (f"{'0' * 64}\nSHA256 (x) = 00\n", ":2: 'SHA256'"),
    ],
)
def test_a_bad_allow_list_file_is_refused_naming_the_line(tmp_path: Path, text: str, words: str) -> None:
    listing = tmp_path / "pins"
    listing.write_text(text)
    with pytest.raises(ValueError, match="sha256: ") as e:
        allowed_sha256(listing)
    assert words in str(e.value)


# ------------------------------------------------------------------------------ verify_plan


def test_verify_plan_accepts_the_pinned_plan(tmp_path: Path, plan: Path, other: Path) -> None:
    listing = tmp_path / "pins"
    listing.write_text(f"{sha(other)}  other.frost\n{sha(plan)}  toy.frost\n")
    for pin in (None, sha(plan), [sha(other), sha(plan)], listing):
        assert verify_plan(plan, sha256=pin).header.name == "toy"
        assert verify_plan(plan.read_bytes(), sha256=pin) == decode_plan(plan.read_bytes())


def test_verify_plan_refuses_another_plan_naming_both_hashes(plan: Path, other: Path) -> None:
    with pytest.raises(PlanIntegrityError) as e:
        verify_plan(plan, sha256=sha(other))
    message = str(e.value)
    assert f"sha256: the plan's SHA-256 is {sha(plan)}, not the pinned {sha(other)}" in message
    assert "sha256sum PLAN" in message and "frostc build DESC -o PLAN" in message
    with pytest.raises(PlanIntegrityError, match="not one of the 2 pinned"):
        verify_plan(plan, sha256=[sha(other), "0" * 64])
    assert issubclass(PlanIntegrityError, PlanFormatError)  # whoever catches bad plans catches this too


def test_a_pin_catches_a_resealed_edit(plan: Path) -> None:
    """The content hash proves the file whole; only the pin says it is the plan that was built."""
    top = msgpack.unpackb(plan.read_bytes(), raw=False)
    top["header"]["min_driver"] = 12000
    seal(top)
    edited = msgpack.packb(top, use_bin_type=True)
    assert verify_plan(edited).header.min_driver == 12000
    with pytest.raises(PlanIntegrityError):
        verify_plan(edited, sha256=sha(plan))


def test_the_pin_is_checked_before_the_file_is_decoded(plan: Path) -> None:
    with pytest.raises(PlanIntegrityError):
        verify_plan(b"not a plan at all", sha256=sha(plan))
    with pytest.raises(PlanFormatError, match="not valid msgpack"):
        verify_plan(b"not a plan at all", sha256=hashlib.sha256(b"not a plan at all").hexdigest())


# ------------------------------------------------------------------------------------- load


@pytest.mark.usefixtures("no_gpu")
def test_load_refuses_a_plan_before_touching_the_gpu(tmp_path: Path, plan: Path, other: Path) -> None:
    with pytest.raises(PlanIntegrityError):
        frost_runtime.load(plan, sha256=sha(other))
    with pytest.raises(ValueError, match="is not a SHA-256"):
        frost_runtime.load(plan, sha256="0123")
    data = bytearray(plan.read_bytes())
    data[data.index(b"sm_90a") + 4] ^= 1  # the header's target: sm_91a
    with pytest.raises(PlanFormatError, match="content hash does not match"):
        frost_runtime.load(bytes(data))


@pytest.mark.usefixtures("no_gpu")
def test_load_goes_on_to_the_gpu_with_an_allowed_plan(tmp_path: Path, plan: Path, other: Path) -> None:
    listing = tmp_path / "pins"
    listing.write_text(f"{sha(plan)}  toy.frost\n")
    for pin in (None, sha(plan), {sha(plan), sha(other)}, listing):
        with pytest.raises(frost_runtime.CompatibilityError) as refused:  # no GPU here: said so
            frost_runtime.load(plan, sha256=pin)
        assert isinstance(refused.value.__cause__, ReachedTheGpu)
