"""Kernels written in the CuTe DSL, one per file.

The DSL reads its configuration from the environment when it is first imported, so this
package sets it before any kernel module imports cutlass: compile for sm_90a on a machine
without a GPU, keep the cubin and PTX in memory (`compiled.__cubin__`), and never serve a
compile from the DSL's caches (the plan must hold exactly what this compiler produced).
"""

import atexit
import os
import shutil
import tempfile

TARGET_ARCH = "sm_90a"

_dump_dir = tempfile.mkdtemp(prefix="frostc-dsl-")
atexit.register(shutil.rmtree, _dump_dir, ignore_errors=True)
os.environ["CUTE_DSL_ARCH"] = TARGET_ARCH
os.environ["CUTE_DSL_KEEP"] = "cubin,ptx"
os.environ["CUTE_DSL_DUMP_DIR"] = _dump_dir
os.environ["CUTE_DSL_NO_CACHE"] = "1"
os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"
