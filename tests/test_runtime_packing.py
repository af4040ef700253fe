"""How the runtime packs a launch's parameters, checked without a GPU: each parameter at its
alignment, a tensor map's 128 bytes copied once with only its address (bytes 0..7) written
per call, i32x3 extents, and a persistent kernel's grid capped at the device's SMs."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

from frost_runtime.plan import _PackedLaunch, _param_offsets
from frost_runtime.schema import Arg, Kernel, Launch, Param

TMAP = bytes(8) + bytes(range(1, 121))


def kernel(ctas_per_sm: int = 1) -> Kernel:
    return Kernel(
        name="toy",
        entry="toy_entry",
        cubin=b"\x7fELF",
        params=(
            Param("q.tmap", "tmap"),
            Param("q.extents", "i32x3"),
            Param("lse", "ptr"),
            Param("seq_q", "i32"),
            Param("k.tmap", "tmap"),
            Param("scale", "f32"),
        ),
        block=(384, 1, 1),
        cluster=(1, 1, 1),
        smem_bytes=1024,
        grid_rule="tiles",
        ctas_per_sm=ctas_per_sm,
    )


def packed(tiles: int = 1000, ctas_per_sm: int = 1, sm_count: int = 132) -> _PackedLaunch:
    launch = Launch(
        kernel=0,
        grid=(tiles, 1, 1),
        args=(
            Arg(slot=0, tmap=TMAP),
            Arg(value=(300, 16, 2)),
            Arg(slot=2),
            Arg(value=300),
            Arg(slot=1, tmap=TMAP),
            Arg(value=0.5),
        ),
    )
    return _PackedLaunch(launch, kernel(ctas_per_sm), SimpleNamespace(function=None), sm_count)


def raw(p: _PackedLaunch, offset: int, size: int) -> bytes:
    return ctypes.string_at(ctypes.addressof(p.buffer) + offset, size)


def test_offsets_follow_each_kinds_alignment() -> None:
    offsets, size = _param_offsets(kernel())
    # tmap at 0 (align 64), i32x3 at 128, ptr at 144 (align 8), i32 at 152, tmap at 192, f32 at 320
    assert offsets == [0, 128, 144, 152, 192, 320]
    assert size == 324


def test_tensor_map_bytes_are_copied_and_only_the_address_is_patched() -> None:
    p = packed()
    assert raw(p, 0, 128) == TMAP and raw(p, 192, 128) == TMAP
    slots = dict(p.slot_fields)  # slot -> field
    slots[0].value = 0x7F00_1234_5670
    slots[1].value = 0x7F00_AAAA_0000
    slots[2].value = 0xDEAD_BEE0
    assert raw(p, 0, 8) == (0x7F00_1234_5670).to_bytes(8, "little")
    assert raw(p, 8, 120) == TMAP[8:]
    assert raw(p, 192, 8) == (0x7F00_AAAA_0000).to_bytes(8, "little")
    assert raw(p, 144, 8) == (0xDEAD_BEE0).to_bytes(8, "little")


def test_constants_are_packed_once() -> None:
    p = packed()
    assert raw(p, 128, 12) == b"".join(x.to_bytes(4, "little") for x in (300, 16, 2))
    assert raw(p, 152, 4) == (300).to_bytes(4, "little")
    assert ctypes.c_float.from_buffer_copy(raw(p, 320, 4)).value == 0.5


def test_each_parameter_pointer_addresses_its_bytes() -> None:
    p = packed()
    offsets, _ = _param_offsets(kernel())
    array = (ctypes.c_void_p * len(offsets)).from_address(p.param_address)
    assert [a - ctypes.addressof(p.buffer) for a in array] == offsets


def test_persistent_grid_is_capped_at_the_sm_count() -> None:
    assert packed(tiles=1000).geometry[:3] == (132, 1, 1)
    assert packed(tiles=100).geometry[:3] == (100, 1, 1)  # fewer tiles than SMs: one CTA each
    assert packed(tiles=1000, ctas_per_sm=2, sm_count=78).geometry[:3] == (156, 1, 1)
    assert packed(tiles=1000, ctas_per_sm=0).geometry[:3] == (1000, 1, 1)  # not persistent


def test_workspace_arguments_are_patched_from_the_base_plus_their_offset() -> None:
    k = Kernel(
        name="toy", entry="e", cubin=b"\x7fELF", params=(Param("sequences", "ptr"), Param("tiles", "ptr")),
        block=(1024, 1, 1), cluster=(1, 1, 1), smem_bytes=0, grid_rule="one", ctas_per_sm=0,
    )  # fmt: skip
    launch = Launch(kernel=0, grid=(1, 1, 1), args=(Arg(workspace=0), Arg(workspace=256)))
    p = _PackedLaunch(launch, k, SimpleNamespace(function=None), 132)
    assert p.slot_fields == [] and [offset for offset, _ in p.workspace_fields] == [0, 256]
    for offset, field in p.workspace_fields:
        field.value = 0x7F00_0000_0000 + offset
    assert raw(p, 0, 16) == b"".join((0x7F00_0000_0000 + o).to_bytes(8, "little") for o in (0, 256))


def test_length_contracts_name_what_breaks_them() -> None:
    from frost_runtime.plan import length_problem
    from frost_runtime.schema import LengthContract

    offsets = LengthContract(slot=3, kind="offsets", longest=100, total=250)
    assert length_problem(offsets, [0, 100, 100, 200, 250]) is None  # an empty sequence is fine
    assert "below 0" in length_problem(offsets, [-1, 5])
    assert "decrease at entry 2" in length_problem(offsets, [0, 50, 40])
    assert "sequence 1 has 101 tokens" in length_problem(offsets, [0, 1, 102])
    assert "past the 250 tokens" in length_problem(offsets, [0, 100, 200, 251])
    lengths = LengthContract(slot=4, kind="lengths", longest=64)
    assert length_problem(lengths, [0, 64, 3]) is None
    assert "sequence 1 has length 65" in length_problem(lengths, [0, 65])
    assert "outside [0, 64]" in length_problem(lengths, [-2])


# ------------------------------------------------------------------ zeroed workspace regions


def test_a_binding_zeroes_its_counters_before_its_first_launch_only(monkeypatch) -> None:
    """Tile counters (zeroed regions) are filled on the launch stream before a binding's first
    launch; later launches find them zero (the kernels leave them so) and only launch. A fill
    recorded by a capture does not count: the next launch outside one fills again."""
    from frost_runtime import driver
    from frost_runtime.plan import BoundPlan

    calls: list[tuple] = []
    capturing = {7: False, 8: True}
    monkeypatch.setattr(
        driver, "zero_words_async", lambda address, words, stream: calls.append(("zero", address, words, stream))
    )
    monkeypatch.setattr(driver, "stream_is_capturing", lambda stream: capturing[stream])
    monkeypatch.setattr(driver, "launch_kernel", lambda *a: calls.append(("launch", a[8])) or (driver.SUCCESS,))
    plan = SimpleNamespace(_raw_stream=lambda device: 7, _device_index=0)
    bound = BoundPlan(plan, (), [packed()], [(0x1000, 1), (0x2000, 2)])

    bound.execute(stream=8)  # inside a capture: recorded, not yet done for eager launches
    bound.execute()
    bound.execute()
    assert calls == [
        ("zero", 0x1000, 1, 8), ("zero", 0x2000, 2, 8), ("launch", 8),
        ("zero", 0x1000, 1, 7), ("zero", 0x2000, 2, 7), ("launch", 7),
        ("launch", 7),
    ]  # fmt: skip


def test_an_early_launch_goes_through_launch_kernel_ex_with_one_configuration_per_stream(monkeypatch) -> None:
    """A launch marked early is queued by cuLaunchKernelEx with the programmatic-serialization
    configuration of its stream (built once per stream); the others by cuLaunchKernel."""
    from frost_runtime import driver
    from frost_runtime.plan import BoundPlan

    calls: list[tuple] = []
    built: list[tuple] = []
    monkeypatch.setattr(driver, "launch_kernel", lambda *a: calls.append(("plain", a[8])) or (driver.SUCCESS,))
    monkeypatch.setattr(
        driver, "early_launch_config", lambda geometry, stream: built.append((geometry, stream)) or ("config", stream)
    )
    launch_ex = lambda config, f, params, extra: calls.append(("early", config)) or (driver.SUCCESS,)  # noqa: E731
    monkeypatch.setattr(driver, "launch_kernel_ex", launch_ex)
    first, second = packed(), packed()
    second.early = True
    plan = SimpleNamespace(_raw_stream=lambda device: 7, _device_index=0)
    bound = BoundPlan(plan, (), [first, second], [])
    bound.execute()
    bound.execute()
    bound.execute(stream=9)
    assert calls == [
        ("plain", 7), ("early", ("config", 7)),
        ("plain", 7), ("early", ("config", 7)),
        ("plain", 9), ("early", ("config", 9)),
    ]  # fmt: skip
    assert built == [(second.geometry, 7), (second.geometry, 9)]
