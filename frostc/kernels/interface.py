"""Each kernel's interface, declared once.

A kernel takes one argument record, its `Args`: a frozen dataclass whose fields are the kernel's
parameters in order, or groups of them (frozen dataclasses too). The CuTe DSL flattens a
dataclass argument into the kernel's parameters field by field, and a field that is None adds
none, so a group that only some variants take (an e4m3 kernel's descales) is None in the others.
Everything that used to repeat a kernel's argument list derives from that declaration here:

- `params(variant)`: the parameter ABI the plan records, (name, kind) in order; the build checks
  it against the PTX entry (frostc.compile.check_abi);
- `stand_ins(variant)`: the record a compile traces the kernel with (no GPU, no memory: a
  pointer's type and alignment, and a scalar's type, are all the DSL uses);
- `leaves(variant, record)`: a record the op filled by name, parameter by parameter: what the
  resolver binds to slots, workspace and constants (frostc.resolved.bind);
- `host_values(variant, record, addresses)`: the same record as the kernel's host code takes
  it, to encode a launch's TMA tensor maps on the CPU at build time.

A parameter's name in the plan is its field's, or the name `abi(...)` gives it; a `Facets` group
(a tensor's strides, its tensor map) names its parameters "<tensor>.<field>", the tensor being
the field's name or the one `facets(...)` gives. The runtime reads some parameters by those
names, so they are part of the plan format.

The kernel's host code sees a TMA-loaded tensor (a `TmaTensor` field) as a `TmaSource` — its
base pointer and strides — and hands the device code a `TmaTensor` of the TMA atom and the
coordinate tensor made from it (`Kernel.tma_atoms`); in the plan it is the tensor map
("x.tmap", whose address the runtime patches per call) and the coordinate tensor's dynamic
extents ("x.extents").

Entries are named after their variant (`entry_name`), not after the Python that traced them,
so a cubin depends only on what its kernel computes: moving the Python leaves the bytes alone.
"""

import dataclasses
import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_ptr
from cutlass.cute.typing import AddressSpace
from frost_runtime.dtypes import DTYPES
from frost_runtime.schema import PARAM_KINDS

# ------------------------------------------------------------------------------ leaf kinds


class Leaf:
    """A parameter's kind, as a field's annotation (the DSL reads values, not annotations)."""

    kind: ClassVar[str]


class Ptr(Leaf):
    """A global pointer: a slot's base, a workspace region, or null where the variant never reads it."""

    kind = "ptr"


class I32(Leaf):
    kind = "i32"


class I64(Leaf):
    kind = "i64"


class F32(Leaf):
    kind = "f32"


STAND_IN_SCALARS = {"i32": cutlass.Int32(1), "i64": cutlass.Int64(8), "f32": cutlass.Float32(1.0)}
_DSL_SCALARS = {"i32": cutlass.Int32, "i64": cutlass.Int64, "f32": cutlass.Float32}
_ADDRESS = 0x10000  # a stand-in pointer's (its type and alignment are what a compile uses)


_BYTES = {"uint8": "Uint8", "uint32": "Uint32"}  # raw bytes and words (workspace regions)
_RAW_WIDTHS = {"uint8": 1, "uint32": 4}


def _dsl_pointer(dtype: str, address: int, align: int):
    name = _BYTES.get(dtype) or DTYPES[dtype].dsl
    return make_ptr(getattr(cutlass, name), address, AddressSpace.gmem, assumed_align=align)


# ------------------------------------------------------------------------------ declarations


def pointer(dtype: str | None = None, *, of: str = "dtype", align: int = 16) -> Any:
    """A pointer field: to elements of `dtype` (a frost dtype, or "uint8" / "uint32" for raw bytes
    and words), or of the dtype the variant's attribute `of` holds; `align`: what the kernel may
    assume of it."""
    return field(metadata={"dtype": dtype, "of": of, "align": align})


def abi(name: str) -> Any:
    """A field whose parameter the plan names `name` (e.g. "x.stride_m")."""
    return field(metadata={"abi": name})


def facets(tensor: str) -> Any:
    """A `Facets` field whose parameters are named "<tensor>.<its fields>"."""
    return field(metadata={"tensor": tensor})


def when(present: Callable[[Any], bool], *, tensor: str | None = None, named: str | None = None, **facts: Any) -> Any:
    """A field (a group, or a leaf) the variants where `present(variant)` holds take; None in the
    others. `facts`: what `pointer` would say of a pointer field; `tensor`: what `facets` says of
    a `Facets` group, `named`: what `abi` says of a leaf."""
    meta = {"when": present}
    if facts:
        meta |= pointer(**facts).metadata
    if tensor is not None:
        meta["tensor"] = tensor
    if named is not None:
        meta["abi"] = named
    return field(metadata=meta)


def host_only(variant_of: Callable[[Any], Any]) -> Any:
    """A field the kernel's host code reads and its device code never takes (no parameter): the
    record of another kernel, `variant_of(variant)`, whose host code makes what this kernel takes
    (the scheduling kernel writes each sequence's V map from the attention's). None on the device."""
    return field(metadata={"host_only": variant_of})


def tma(*, extents: Callable[[Any], str | None] | str | None, of: str = "dtype", strides: int = 3) -> Any:
    """A `TmaTensor` field: loaded through a tensor map of elements of the variant's `of` dtype,
    made by the host code from the base pointer and `strides` element strides; `extents`: the
    kind of its coordinate tensor's dynamic extents in the plan ("i32", "i32x3"; a function of
    the variant; None: the kernel takes the map alone)."""
    return field(metadata={"extents": extents, "of": of, "strides": strides, "dtype": None, "align": 16})


class Group:
    """A group of parameters (subclass and decorate with @dataclass(frozen=True)): named by
    their own fields."""


class Facets(Group):
    """A group of one tensor's parameters: named "<tensor>.<field>"."""


@dataclass(frozen=True)
class BhsStrides(Facets):
    """A tensor's (b, h, s) element strides."""

    stride_b: I64
    stride_h: I64
    stride_s: I64

    def bhs(self) -> tuple:
        return (self.stride_b, self.stride_h, self.stride_s)


@dataclass(frozen=True)
class TmaTensor(Facets):
    """In the device code: a TMA atom (its tensor map) and the coordinate tensor to tile."""

    tmap: Any
    extents: Any


@dataclass(frozen=True)
class TmaSource:
    """A TMA-loaded tensor as the op gives it and the host code reads it: its base (a slot or a
    workspace region when bound; a pointer in the host code), its element strides (the host code
    folds them into the tensor map) and the plan's value of its "x.extents" parameter."""

    base: Any
    strides: tuple
    extents: int | tuple | None = None


# ------------------------------------------------------------------------------ derivations


@dataclass(frozen=True)
class Param:
    """One parameter as the declaration gives it."""

    name: str
    kind: str
    path: tuple[str, ...]  # the field names from the record down to it
    meta: dict


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _group_type(hint) -> type | None:
    """The group a field's annotation names (`X | None` included), or None for a leaf."""
    options = typing.get_args(hint) or (hint,)
    for option in options:
        if isinstance(option, type) and issubclass(option, Group):
            return option
    return None


def _leaf_kind(hint) -> str:
    options = typing.get_args(hint) or (hint,)
    for option in options:
        if isinstance(option, type) and issubclass(option, Leaf):
            return option.kind
    raise TypeError(f"{hint!r} is neither a parameter kind nor a group")


def _present(meta: dict, variant) -> bool:
    present = meta.get("when")
    return present is None or bool(present(variant))


def declared(variant, args_type: type | None = None) -> Iterator[Param]:
    """The variant's parameters in order, each with its name, kind, field path and facts."""
    yield from _walk(args_type or variant.ARGS, variant, (), None)


def _walk(cls: type, variant, path: tuple[str, ...], tensor: str | None) -> Iterator[Param]:
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        if not _present(meta, variant) or "host_only" in meta:
            continue
        where = (*path, f.name)
        group = _group_type(hints[f.name])
        if group is TmaTensor:
            prefix = meta.get("tensor", f.name)
            yield Param(f"{prefix}.tmap", "tmap", where, meta)
            extents = meta["extents"]
            kind = extents(variant) if callable(extents) else extents
            if kind is not None:
                yield Param(f"{prefix}.extents", kind, where, meta)
        elif group is not None:
            inner = meta.get("tensor", f.name) if issubclass(group, Facets) else None
            yield from _walk(group, variant, where, inner)
        else:
            name = meta.get("abi") or (f"{tensor}.{f.name}" if tensor else f.name)
            yield Param(name, _leaf_kind(hints[f.name]), where, meta)


def params(variant) -> tuple[tuple[str, str], ...]:
    """The parameter ABI: (name, kind) in order."""
    return tuple((p.name, p.kind) for p in declared(variant))


def tensor_map_params(variant) -> tuple[str, ...]:
    """The tensor-map parameters ("q.tmap", ...), in order."""
    return tuple(p.name for p in declared(variant) if p.kind == "tmap")


def _dtype(meta: dict, variant) -> str:
    return meta.get("dtype") or getattr(variant, meta.get("of", "dtype"))


def element_dtype(param: Param, variant) -> str:
    """The elements a pointer or tensor-map parameter reads or writes, as the kernel (and its
    tensor map's encoding) takes them."""
    return _dtype(param.meta, variant)


def element_bytes(dtype: str) -> int:
    """A pointer's element width: a frost dtype's, or raw bytes' and words'."""
    return _RAW_WIDTHS.get(dtype) or DTYPES[dtype].bytes


def stand_ins(variant):
    """The record a compile traces `variant`'s kernel with."""
    return _host_record(variant, variant.ARGS, None, {})


def compile_args(variant) -> tuple:
    """What `cute.compile(kernel, *...)` takes: the stand-in record and a stream."""
    return (stand_ins(variant), make_fake_stream())


def leaves(variant, record) -> Iterator[tuple[Param, Any]]:
    """Each parameter of `variant` with its value in `record` (an op's filled record): a TMA
    field's map is its source's base, its extents the source's `extents`."""
    for param in declared(variant):
        value = record
        for name in param.path:
            value = getattr(value, name)
        if isinstance(value, TmaSource):
            value = value.base if param.kind == "tmap" else value.extents
        yield param, value


def host_values(variant, record, addresses: dict[str, int]):
    """`record` (an op's filled record) as the kernel's host code takes it: scalars as DSL
    values, the base of the TMA tensor named t a pointer at `addresses[t]` (any other a
    stand-in), every other pointer a stand-in (the host code only makes tensor maps)."""
    return _host_record(variant, variant.ARGS, record, addresses)


def _host_record(variant, cls: type, record, addresses: dict[str, int]):
    """An instance of `cls` (the record or one of its groups) of DSL values: `record`'s, or
    stand-ins where it is None (the compile's)."""
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        group = _group_type(hints[f.name])
        value = None if record is None else getattr(record, f.name)
        if not _present(meta, variant):
            values[f.name] = None
        elif "host_only" in meta:
            inner = meta["host_only"](variant)
            values[f.name] = _host_record(inner, inner.ARGS, value, addresses)
        elif group is TmaTensor:
            address = addresses.get(meta.get("tensor", f.name), _ADDRESS)
            if value is None:
                strides = (STAND_IN_SCALARS["i64"],) * meta["strides"]
            else:
                strides = tuple(cutlass.Int64(x) for x in value.strides)
            values[f.name] = TmaSource(_dsl_pointer(_dtype(meta, variant), address, 16), strides)
        elif group is not None:
            values[f.name] = _host_record(variant, group, value, addresses)
        elif (kind := _leaf_kind(hints[f.name])) == "ptr":
            values[f.name] = _dsl_pointer(_dtype(meta, variant), _ADDRESS, meta.get("align", 16))
        else:
            values[f.name] = STAND_IN_SCALARS[kind] if record is None else _DSL_SCALARS[kind](value)
    return cls(**values)


def tma_values(record) -> Iterator[TmaTensor]:
    """The TmaTensor values of a device record, in declaration order."""
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, TmaTensor):
            yield value
        elif isinstance(value, Group):
            yield from tma_values(value)


# ------------------------------------------------------------------------------ the kernel


ENTRY_PREFIX = "frostc_"


def entry_name(variant_name: str) -> str:
    """The entry's name: frostc_ and the variant's name as an identifier (the DSL adds "_0")."""
    return ENTRY_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", variant_name)


def name_entry(kernel: "Kernel", variant_name: str) -> None:
    """Name the entry that compiling `kernel` traces after the variant. The DSL keeps the name
    on the method's function, shared by every instance: set right before each compile."""
    type(kernel).kernel.set_name_prefix(entry_name(variant_name), remove_cutlass_symbol=True, keep_mangled_name=False)


class Kernel:
    """One variant's kernel. A subclass defines the device entry, `kernel(self, args)` (a
    `@cute.kernel` taking the record), and where it needs them `prepare()` (shared memory:
    sets `shared_storage` and `smem_bytes`), `tma_atoms(args)` (its TMA fields' atoms and
    coordinate tensors) and `launch_options`. `__call__` is the host entry the build compiles;
    the plan's launches give the grid, so the DSL's own launcher (and its grid) never runs."""

    smem_bytes = 0
    launch_options: ClassVar[dict] = {}

    def __init__(self, variant) -> None:
        self.variant = variant

    def prepare(self) -> None:
        """At trace time, before the entry: shared memory and the like."""

    def tma_atoms(self, args) -> dict:
        """{top-level field: its device value} for the fields holding TMA tensors: each source a
        TmaTensor(atom, coordinate tensor)."""
        return {}

    @cute.jit
    def __call__(self, args, stream):
        self.prepare()
        device = dataclasses.replace(args, **self.tma_atoms(args))
        self.kernel(device).launch(
            grid=(1, 1, 1), block=list(self.variant.block), smem=self.smem_bytes, stream=stream, **self.launch_options
        )

    @cute.jit
    def encode_tensor_maps(self, args, out):
        """Host only, at build time: the record's tensor maps, 128 bytes each, in order, to `out`."""
        device = dataclasses.replace(args, **self.tma_atoms(args))
        for i, loaded in enumerate(tma_values(device)):
            cute.nvgpu.cpasync.copy_tensormap(loaded.tmap, out + PARAM_KINDS["tmap"] * i)


class Variant:
    """What every kernel variant shares (mixed into each variant's frozen dataclass, which
    sets `ARGS`, `THREADS` or `block`, `name`, `tiles`, `grid_rule` and `kernel()`)."""

    ARGS: ClassVar[type]
    THREADS: ClassVar[int]  # a CTA's (block (THREADS, 1, 1))

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.THREADS, 1, 1)

    @property
    def params(self) -> tuple[tuple[str, str], ...]:
        return params(self)

    @property
    def ctas_per_sm(self) -> int:
        return 0  # one CTA per grid block (a persistent kernel says how many per SM)

    def compile_args(self) -> tuple:
        return compile_args(self)

    # tensor maps: the build encodes each launch's on the CPU with the kernel's own host code

    @property
    def tensor_map_params(self) -> tuple[str, ...]:
        return tensor_map_params(self)

    def tensor_map_encoder(self):
        return self.kernel().encode_tensor_maps

    def tensor_map_compile_args(self) -> tuple:
        return (stand_ins(self), _dsl_pointer("uint8", _ADDRESS, 64))

    def tensor_map_args(self, record, addresses: list[int], out: int) -> tuple:
        """The encoder's arguments for a launch's filled `record`, its TMA fields' bases at
        `addresses` (in order), the maps written to `out`."""
        tensors = (name.rsplit(".", 1)[0] for name in self.tensor_map_params)
        return (host_values(self, record, dict(zip(tensors, addresses))), _dsl_pointer("uint8", out, 64))
