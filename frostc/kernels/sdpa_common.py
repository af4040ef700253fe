"""What the SDPA forward kernels share: the parameter ABI, constants, quad reductions.

Every SDPA forward kernel takes the same plain-scalar parameters (`param_list`), so the
resolver binds arguments once whichever kernel a head dim selects.
"""

import cutlass.cute as cute

LOG2_E = 1.4426950408889634
LN_2 = 0.6931471805599453

LOADED = ("q", "k", "v")  # read through TMA tensor maps
STORED = ("o", "lse")  # written through plain pointers
STRIDE_NAMES = ("stride_b", "stride_h", "stride_s")


def param_list() -> list[tuple[str, str]]:
    """The kernels' parameter ABI, in order.

    `x.tmap` is the TMA tensor map of slot x (its address is patched per call); `x.extents` are
    the dynamic extents (rows, heads, batch) of its coordinate tensor; `x.stride_*` are element
    strides. The LSE pointer and strides are always present (zero when the variant writes no
    LSE), so every variant shares one ABI.
    """
    params: list[tuple[str, str]] = []
    for name in LOADED:
        params += [(f"{name}.tmap", "tmap"), (f"{name}.extents", "i32x3")]
    params += [(name, "ptr") for name in STORED]
    params += [("batch", "i32"), ("heads_q", "i32"), ("seq_q", "i32"), ("seq_kv", "i32"), ("group", "i32")]
    for name in STORED:
        params += [(f"{name}.{s}", "i64") for s in STRIDE_NAMES]
    params.append(("scale_log2", "f32"))
    return params


def quad_reduce(value, combine):
    # the 4 threads of a quad hold the same accumulator rows
    for offset in (2, 1):
        value = combine(value, cute.arch.shuffle_sync_bfly(value, offset=offset, mask=-1, mask_and_clamp=31))
    return value


def quad_max(value):
    return quad_reduce(value, cute.arch.fmax)


def quad_sum(value):
    return quad_reduce(value, lambda a, b: a + b)
