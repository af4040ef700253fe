"""Registers and stack bytes (spills) of each kernel in plan files, read from the cubins on the CPU.

    python bench/kernel_resources.py PLAN.frost ...   # one line per kernel

A cubin's `.nv.info` section holds, per kernel, what ptxas decided: EIATTR_REGCOUNT (registers
per thread at launch; a kernel that redistributes them with setmaxnreg shows the launch share,
65,536 / its threads) and EIATTR_FRAME_SIZE (bytes of stack per thread: 0 unless something
spilled or a local array could not live in registers). bench/kernel_report.py reads the same from
the driver on the GPU machine; this reads it where the plans are built, before a device call.
"""

import struct
import sys
from pathlib import Path

EIFMT_SVAL = 4  # an attribute with a sized payload
EIATTR = {0x2F: "registers", 0x11: "stack_bytes"}  # EIATTR_REGCOUNT, EIATTR_FRAME_SIZE


def _sections(elf: bytes) -> dict[str, bytes]:
    """The ELF64 file's sections by name."""
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * entsize) for i in range(count)]
    names_at = headers[names_index][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return elf[start : elf.index(b"\0", start)].decode()

    return {name(h[0]): elf[h[4] : h[4] + h[5]] for h in headers}


def resources(cubin: bytes) -> dict[str, int]:
    """{"registers": n, "stack_bytes": n} of a one-kernel cubin (frostc compiles one per cubin)."""
    info = _sections(cubin).get(".nv.info", b"")
    found: dict[str, int] = {}
    at = 0
    while at + 4 <= len(info):
        fmt, attribute, size = struct.unpack_from("<BBH", info, at)
        payload = info[at + 4 : at + 4 + size] if fmt == EIFMT_SVAL else b""
        at += 4 + len(payload)
        if attribute in EIATTR and len(payload) == 8:  # (the kernel's symbol index, the value)
            found[EIATTR[attribute]] = struct.unpack_from("<I", payload, 4)[0]
    return found


def main(paths: list[str]) -> int:
    from frost_runtime.schema import decode_plan

    for path in paths:
        for kernel in decode_plan(Path(path).read_bytes()).kernels:
            r = resources(kernel.cubin)
            spills = "  (a spill or a local array)" if r.get("stack_bytes") else ""
            print(f"{Path(path).name:40} {kernel.name:60} {r.get('registers', '?'):>4} registers "
                  f"{r.get('stack_bytes', '?'):>4} B stack{spills}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))
    sys.exit(main(sys.argv[1:]))
