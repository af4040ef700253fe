"""What ptxas decided for a compiled kernel, read back from its cubin (no GPU, no CUDA toolkit):
registers per thread and the stack frame, from the ELF's `.nv.info` section.

EIATTR_REGCOUNT is the kernel's registers per thread at launch (a kernel that moves registers
between warpgroups with setmaxnreg shows its launch share, 65,536 / its threads); EIATTR_FRAME_SIZE
is its stack frame per thread, 0 unless a value spilled or a local array could not live in
registers. `frostc inspect`, the golden renderings and `frostc diff` show both, so a change that
makes a kernel spill shows in review before any GPU runs it.
"""

import struct
from dataclasses import dataclass

_EIFMT_SVAL = 4  # an attribute with a sized payload: (the kernel's symbol index, the value)
_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE = 0x2F, 0x11


@dataclass(frozen=True)
class CubinResources:
    registers: int | None  # per thread, at launch; None where the cubin does not say
    stack_bytes: int | None  # the stack frame per thread; None where the cubin does not say


def resources(cubin: bytes) -> CubinResources:
    """The registers and stack frame of a one-kernel cubin (frostc compiles one kernel a cubin);
    None for what a cubin that is not a well-formed ELF file does not say."""
    try:
        info = _sections(cubin).get(".nv.info", b"")
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):  # not a well-formed ELF file
        info = b""
    found: dict[int, int] = {}
    at = 0
    while at + 4 <= len(info):
        fmt, attribute, size = struct.unpack_from("<BBH", info, at)
        payload = info[at + 4 : at + 4 + size] if fmt == _EIFMT_SVAL else b""
        at += 4 + len(payload)
        if len(payload) == 8:
            found[attribute] = struct.unpack_from("<I", payload, 4)[0]
    return CubinResources(found.get(_EIATTR_REGCOUNT), found.get(_EIATTR_FRAME_SIZE))


def _sections(elf: bytes) -> dict[str, bytes]:
    """An ELF64 file's sections by name (empty for anything that is not one; struct.error,
    ValueError or IndexError for one whose tables point outside it)."""
    if elf[:4] != b"\x7fELF" or len(elf) < 0x40:
        return {}
    (table,) = struct.unpack_from("<Q", elf, 0x28)
    entry, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, table + i * entry) for i in range(count)]
    names_at = headers[names_index][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return elf[start : elf.index(b"\0", start)].decode()

    return {name(h[0]): elf[h[4] : h[4] + h[5]] for h in headers}
