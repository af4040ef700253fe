"""What every kernel variant shares: how its entry is named in the cubin.

The DSL names a kernel's entry after the Python method, its class and module and the types of
its arguments; that name would move with every refactor of the kernel's Python, and a profiler
would show it. frostc names each entry after its variant instead (`entry_name`), so the cubin
depends only on what the kernel computes: a move of its Python leaves the bytes as they were.
"""

import re

ENTRY_PREFIX = "frostc_"
# the kernel methods a kernel class may trace as its entry
ENTRY_METHODS = ("kernel", "kernel_scaled", "kernel_fp8", "kernel_v_maps", "kernel_batched")


def entry_name(variant_name: str) -> str:
    """The entry's name: frostc_ and the variant's name as an identifier (the DSL adds "_0")."""
    return ENTRY_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", variant_name)


def name_entries(kernel: object, variant_name: str) -> None:
    """Name the entry that compiling `kernel` traces after the variant. The DSL keeps the name
    on the method's function, shared by every instance: set it right before each compile."""
    for method in ENTRY_METHODS:
        entry = getattr(type(kernel), method, None)
        if entry is not None:
            entry.set_name_prefix(entry_name(variant_name), remove_cutlass_symbol=True, keep_mangled_name=False)
