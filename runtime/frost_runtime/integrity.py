"""A plan's identity, and pinning the plans a process may run (`load(..., sha256=...)`).

A plan's identity is the SHA-256 of its whole file: what `sha256sum plan.frost` prints. A
decodable file is the one canonical encoding of its values (schema.read_header), and builds
are deterministic, so one description built by one frostc always has the same identity, and
no two different plans share one. The content hash inside the file proves a file whole; a pin
says which whole files this process accepts (a valid plan can still be the wrong one).

Pins are checked on the file's bytes, before anything in them is decoded or loaded.
"""

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from frost_runtime.schema import REBUILD, PlanFormatError

# one hash (64 hex digits), a collection of them, or an allow-list file (a path) with one per line
Pin = str | os.PathLike | Iterable[str]

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_HEX = re.compile(r"[0-9a-fA-F]+")
_PIN_FORMS = "a SHA-256 (64 hex digits), a collection of them, or a file with one per line (sha256sum's output)"


class PlanIntegrityError(PlanFormatError):
    """The plan is whole but not one the caller pinned: its SHA-256 is not an allowed one."""


def plan_sha256(source: bytes | bytearray | memoryview | str | os.PathLike) -> str:
    """A plan's identity: the SHA-256 (hex) of its file's bytes; `source` is the bytes or a path."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return hashlib.sha256(source).hexdigest()
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()


def allowed_sha256(pin: Pin) -> frozenset[str]:
    """The hashes `pin` allows, lower case. A str of hex digits is one hash; any other str, or a
    path, names an allow-list file; any other iterable is a collection of hashes. Raises
    ValueError (TypeError for a wrong type) naming what is wrong: a bad pin must never mean
    "allow anything"."""
    if isinstance(pin, str) and _HEX.fullmatch(pin.strip()):
        return frozenset([_hash(pin.strip(), "sha256")])
    if isinstance(pin, (str, os.PathLike)):
        return _read_allow_list(Path(pin))
    if isinstance(pin, (bytes, bytearray, memoryview)) or not isinstance(pin, Iterable):
        raise TypeError(f"sha256: expected {_PIN_FORMS}, found {type(pin).__name__}")
    hashes = frozenset(_hash(h, f"sha256[{i}]") for i, h in enumerate(pin))
    if not hashes:
        raise ValueError("sha256: the allow-list is empty, so no plan could load; pin at least one hash")
    return hashes


def _hash(value: object, where: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise ValueError(f"{where}: {str(value)[:80]!r} is not a SHA-256 (64 hex digits, as sha256sum prints)")
    return value.lower()


def _read_allow_list(path: Path) -> frozenset[str]:
    """One hash per line, optionally followed by a file name (`sha256sum *.frost > pins`); blank
    lines and `#` comments are skipped."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"sha256: {str(path)!r} is not {_PIN_FORMS}: cannot read it ({reason})") from None
    hashes = set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        # sha256sum starts a line with "\" when it escapes the file name
        hashes.add(_hash(line.split()[0].removeprefix("\\"), f"sha256: {path}:{number}"))
    if not hashes:
        raise ValueError(f"sha256: {path} holds no hashes, so no plan could load; write one per line")
    return frozenset(hashes)


def check_sha256(data: bytes, pin: Pin) -> str:
    """Refuse `data` unless `pin` allows its SHA-256 (PlanIntegrityError); return the SHA-256."""
    allowed = allowed_sha256(pin)
    digest = plan_sha256(data)
    if digest not in allowed:
        expected = f"the pinned {next(iter(allowed))}" if len(allowed) == 1 else f"one of the {len(allowed)} pinned"
        raise PlanIntegrityError(
            f"sha256: the plan's SHA-256 is {digest}, not {expected}: a different build or an edited file; "
            f"load the plan that was pinned, pin this one (sha256sum PLAN), or {REBUILD}"
        )
    return digest
