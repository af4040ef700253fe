"""The plan file format, defined once: the compiler writes through `encode_plan`, the runtime
reads through `decode_plan`.

A plan file is one msgpack map:

    {"magic": "frostc-plan", "format": 8, "header": {...}, "body": <bytes>}

The header is readable without a GPU and without decoding the body. `header.content_hash` seals
the header and the body together (`content_hash`): a changed header field (the target, the
minimum driver, the build key) or body byte is found before anything in the plan is used. A
file must also be exactly what `encode_plan` writes for the values it holds (no extra fields,
no other encoding of a value), so no byte of it can change unnoticed, and its SHA-256 (what
`sha256sum` prints, `frost_runtime.plan_sha256`) names one plan.
The body is a msgpack map of tensors (each bound to an ordered slot), kernels (cubin, entry,
parameter ABI, launch geometry), the launch sequence, the workspace (its size and named
regions: scratch the plan's own launches write and read, carved from the caller's buffer; a
"zeroed" region must hold zeros when a launch sequence starts, and the launches leave it so),
what the plan assumes of its sequence-length slots, and what each node of the description
computes (`NodeRecord`: its op, form, mask, sizes, constants and the slots of its roles), so
nothing needs to read a kernel's name or parameters to know. Maps are written with their keys in
a fixed order and floats as float64, so the same plan always encodes to the same bytes.

Everything read from a file is checked for type, range and size before use: a plan file is
input from outside the process.
"""

import hashlib
import re
from dataclasses import dataclass, field, replace

import msgpack

from frost_runtime import dtypes

MAGIC = "frostc-plan"
# 2: tensor-map and i32x3 parameters, persistent grids (ctas_per_sm)
# 3: int32 slots, workspace arguments and named workspace regions
# 4: zeroed workspace regions (tile counters the runtime zeroes before a binding's first launch)
# 5: the content hash covers the header too, and a file must be in its canonical encoding
# 6: tensor maps bound to the workspace (data a launch of the plan re-laid there)
# 7: launches that start early (`early`: programmatic dependent launch)
# 8: what each node computes (`nodes`: NodeRecord), and the body in its canonical encoding too
FORMAT_VERSION = 8
REBUILD = "rebuild it with this frostc: frostc build DESC -o PLAN"
MAX_PLAN_BYTES = 1 << 30  # a plan is a few hundred KiB; refuse to decode absurd inputs
MAX_CUBIN_BYTES = 64 << 20  # one kernel's cubin is ~100 KiB
MAX_PARAM_BYTES = 4096  # the classic CUDA kernel-parameter limit (what every driver accepts)
MAX_BLOCK = (1024, 1024, 64)  # per-dimension block limits; and at most 1024 threads in all
MAX_GRID = ((1 << 31) - 1, 65535, 65535)
MAX_CLUSTER_CTAS = 16  # the non-portable cluster size limit on sm_90
MAX_SMEM_BYTES = 227 * 1024  # opt-in dynamic shared memory per CTA on sm_90
# how many of each a plan holds and how long its names are, at most (frostc refuses a
# description that would need more before it compiles anything)
MAX_SLOTS = 256
MAX_KERNELS = 64
MAX_LAUNCHES = 256
MAX_REGIONS = 256  # workspace regions, and length contracts
MAX_NAME_CHARS = 128  # a slot's, a launch's node's, a workspace region's
MAX_PLAN_NAME_CHARS = 256  # the header's (the reader's default string limit, and _HEADER_FORMS)
F32_MAX = 3.4028234663852886e38

WORKSPACE_ALIGN = 256  # bytes: the workspace's base and every region's offset are multiples
# name -> bytes. "tmap": a TMA tensor map (CUtensorMap) passed by value, its global address
# (bytes 0..7) patched from a slot's pointer; "i32x3": three int32 (a coordinate tensor's extents)
PARAM_KINDS = {"ptr": 8, "i32": 4, "i64": 8, "f32": 4, "tmap": 128, "i32x3": 12}
PARAM_ALIGN = {"ptr": 8, "i32": 4, "i64": 8, "f32": 4, "tmap": 64, "i32x3": 4}
TMAP_ADDRESS_BYTES = slice(0, 8)  # where a tensor map holds its global address (checked at build)


class PlanFormatError(ValueError):
    """The bytes are not a plan this runtime can use (corrupt, foreign, truncated, too new)."""


@dataclass(frozen=True)
class Header:
    name: str
    frostc_version: str
    cutlass_dsl_version: str
    target_arch: str  # e.g. "sm_90a"
    min_driver: int  # cuDriverGetVersion() encoding, e.g. 12080
    build_key: str  # hash of compiler sources, DSL version, graph and options
    content_hash: str = ""  # `content_hash(header, body)`; filled by encode_plan


@dataclass(frozen=True)
class TensorSlot:
    """A buffer that `execute` takes, in slot order."""

    name: str
    uid: int
    dtype: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    is_output: bool
    align: int  # required byte alignment of the base pointer


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # one of PARAM_KINDS


@dataclass(frozen=True)
class Kernel:
    name: str  # the variant, e.g. "sdpa_fwd_mma.bf16.d128.causal.lse"
    entry: str  # the cubin's function name
    cubin: bytes
    params: tuple[Param, ...]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    smem_bytes: int  # dynamic shared memory per CTA
    grid_rule: str  # how the grid follows from the shapes (for people; launches hold the numbers)
    tiles: dict[str, int] = field(default_factory=dict)  # named tile parameters, for inspect
    # persistent kernels: a launch's grid x counts tiles and the runtime starts at most
    # SMs * ctas_per_sm CTAs, each looping over tiles; 0: launch the grid as written
    ctas_per_sm: int = 0


@dataclass(frozen=True)
class Arg:
    """Where one kernel parameter's value comes from: a slot's pointer, a pointer into the
    workspace, or a constant."""

    slot: int = -1  # >= 0: the base pointer of that slot's buffer (or a tensor map's address)
    value: int | float | tuple[int, ...] = 0  # the constant otherwise (three ints for i32x3)
    tmap: bytes = b""  # a tmap parameter's 128 bytes; its address field is patched per call
    workspace: int = -1  # >= 0: the workspace's base pointer plus this many bytes


@dataclass(frozen=True)
class Launch:
    kernel: int  # index into PlanData.kernels
    grid: tuple[int, int, int]
    args: tuple[Arg, ...]  # one per kernel parameter
    node: str = ""  # the description's node it belongs to (for people)
    # launched with programmatic stream serialization: it may start while the launch before it
    # still runs (once that one's CTAs have all started); its kernel waits (griddepcontrol.wait)
    # before it reads what that launch writes. Never the first launch: what precedes it on the
    # stream is the caller's work, which no plan kernel waits for
    early: bool = False


@dataclass(frozen=True)
class WorkspaceRegion:
    """A named piece of the workspace (launches hold offsets). `zeroed`: the region must hold
    zeros when the plan's launches start, and they leave it zero (a counter the CTAs take work
    from); the runtime zeroes it before the first launch of a binding and every `execute`."""

    name: str
    offset: int
    bytes: int
    zeroed: bool = False


@dataclass(frozen=True)
class LengthContract:
    """What the plan assumes of an int32 slot of sequence lengths (the caller's contract, like a
    CUDA graph's: nothing checks it per call; `Plan.check_lengths` does on request).

    kind "offsets": prefix sums (b + 1 entries), non-decreasing, from >= 0 to <= `total`, each
    step <= `longest`; kind "lengths": each entry in [0, `longest`]."""

    slot: int
    kind: str
    longest: int
    total: int = 0


LENGTH_KINDS = ("offsets", "lengths")


@dataclass(frozen=True)
class NodeMask:
    """An sdpa node's mask, as its description gives it (docs/description.md): query row i sees
    the keys from diagonal - window_left to diagonal + window_right, the diagonal at key i
    (alignment "top_left") or i + kv length - q length ("bottom_right"); a window of None is
    unbounded on that side (causal: window_right 0). softcap: each scaled score s becomes
    softcap * tanh(s / softcap) before the softmax; None: none."""

    causal: bool
    alignment: str  # one of ALIGNMENTS
    window_left: int | None
    window_right: int | None
    softcap: float | None


ALIGNMENTS = ("top_left", "bottom_right")
WINDOW_MAX = (1 << 31) - 1  # the kernels take windows as int32


@dataclass(frozen=True)
class NodeRecord:
    """What one node of the description computes, recorded by its op at build: the runtime reads
    this, never a kernel's name or parameters, to know what a plan computes.

    `form`, `sizes`, `constants` and the roles in `slots` are those NODE_FORMS gives the op and
    form; `mask` is the sdpa op's (None for the other ops). Sizes are the node's dims (an sdpa
    node's seq_q, seq_kv, tokens_q and tokens_kv are capacities where lengths vary); `slots` maps
    each of the node's roles (its description's keys: q, k, v, o, lse, seq_len_kv, page_table,
    k_cache, ...) to the slot bound there."""

    op: str
    name: str  # the description's node (what launches name in `Launch.node`)
    form: str  # sdpa: "dense" | "padded" | "packed" | "paged" | "mixed"; "" for an op of one form
    sizes: dict[str, int]
    slots: dict[str, int]  # role -> slot index
    constants: dict[str, float] = field(default_factory=dict)  # sdpa: attn_scale; rms_norm: eps
    mask: NodeMask | None = None


@dataclass(frozen=True)
class NodeForm:
    """What a node of one op and form records: each of `sizes` and `constants` (in this order),
    the slots of the `roles` it always has and of the `optional` roles it may have (in this
    order; each group in `together` all or none), and whether it has a mask."""

    sizes: tuple[str, ...]
    roles: tuple[str, ...]
    optional: tuple[str, ...] = ()
    constants: tuple[str, ...] = ()
    mask: bool = False
    together: tuple[tuple[str, ...], ...] = ()
    optional_sizes: tuple[str, ...] = ()  # sizes recorded only where they apply, after `sizes`


_SDPA_SIZES = ("batch", "heads_q", "heads_kv", "head_dim", "seq_q", "seq_kv", "tokens_q", "tokens_kv")
_SDPA_ROLES = ("q", "k", "v", "o")
_DESCALES = ("q_descale", "k_descale", "v_descale")  # e4m3 q, k and v
_SCALES = ("k_scale", "v_scale")  # e4m3 caches


def _sdpa(sizes: tuple[str, ...], roles: tuple[str, ...], optional: tuple[str, ...], together=(_DESCALES,), more=()):
    return NodeForm(sizes, roles, optional, ("attn_scale",), mask=True, together=together, optional_sizes=more)


# head_dim_v: v's and o's head dim where it is not q's and k's (the 16-bit forms' (192, 128))
_VALUE_DIM = ("head_dim_v",)


# (op, form) -> what its nodes record: the ops of frostc.ops, each op's record made by its module
NODE_FORMS = {
    ("sdpa", "dense"): _sdpa(_SDPA_SIZES, _SDPA_ROLES, ("lse", *_DESCALES, "sinks"), more=_VALUE_DIM),
    ("sdpa", "padded"): _sdpa(
        _SDPA_SIZES, _SDPA_ROLES, ("seq_len_q", "seq_len_kv", "lse", *_DESCALES, "sinks"), more=_VALUE_DIM
    ),
    ("sdpa", "packed"): _sdpa(
        _SDPA_SIZES, (*_SDPA_ROLES, "cu_seqlens_q", "cu_seqlens_kv"), ("lse", *_DESCALES, "sinks"), more=_VALUE_DIM
    ),
    ("sdpa", "paged"): _sdpa(
        (*_SDPA_SIZES, "pages", "page_size"),
        (*_SDPA_ROLES, "page_table", "seq_len_kv"),
        ("lse", *_SCALES, "sinks"),
        (_SCALES,),
    ),
    ("sdpa", "mixed"): _sdpa(
        (*_SDPA_SIZES, "pages", "page_size"),
        (*_SDPA_ROLES, "cu_seqlens_q", "page_table", "seq_len_kv"),
        ("lse", *_SCALES, "sinks"),
        (_SCALES,),
    ),
    ("kv_append", ""): NodeForm(  # rows: k, v (b, hkv, s_new, d), every sequence s_new new tokens
        ("batch", "heads_kv", "s_new", "head_dim", "pages", "page_size", "max_pages"),
        ("k", "v", "k_cache", "v_cache", "page_table", "seq_len_kv"),
        _SCALES,
        together=(_SCALES,),
    ),
    ("kv_append", "packed"): NodeForm(  # k, v (tokens, hkv, d), sequence b's by cu_seqlens_q
        ("batch", "tokens", "heads_kv", "head_dim", "pages", "page_size", "max_pages"),
        ("k", "v", "k_cache", "v_cache", "page_table", "seq_len_kv", "cu_seqlens_q"),
        _SCALES,
        together=(_SCALES,),
    ),
    ("kv_append", "slots"): NodeForm(  # k, v (tokens, hkv, d), token i to the cache slot slot_mapping[i]
        ("tokens", "heads_kv", "head_dim", "pages", "page_size"),
        ("k", "v", "k_cache", "v_cache", "slot_mapping"),
        _SCALES,
        together=(_SCALES,),
    ),
    ("rms_norm", ""): NodeForm(
        ("rows", "n"),
        ("x", "weight", "out"),
        ("residual", "residual_out"),
        ("eps",),
        together=(("residual", "residual_out"),),
    ),
    ("silu_mul", ""): NodeForm(("rows", "n"), ("x", "out")),
}
# roles that hold sequence lengths: the kind of length contract their slot has
LENGTH_ROLES = {"cu_seqlens_q": "offsets", "cu_seqlens_kv": "offsets", "seq_len_q": "lengths", "seq_len_kv": "lengths"}
PAGE_TABLE_ROLE = "page_table"  # int32 (batch, pages per sequence)
SLOT_MAPPING_ROLE = "slot_mapping"  # int32 (tokens,): each token's cache row, page * page_size + row


@dataclass(frozen=True)
class PlanData:
    header: Header
    slots: tuple[TensorSlot, ...]
    kernels: tuple[Kernel, ...]
    launches: tuple[Launch, ...]
    workspace_bytes: int = 0
    workspace: tuple[WorkspaceRegion, ...] = ()
    lengths: tuple[LengthContract, ...] = ()
    nodes: tuple[NodeRecord, ...] = ()  # in the description's order


# ------------------------------------------------------------------------------- encoding


def header_map(h: Header) -> dict:
    """The header as written to the file (also what `frostc inspect` shows)."""
    return {
        "name": h.name,
        "frostc_version": h.frostc_version,
        "cutlass_dsl_version": h.cutlass_dsl_version,
        "target_arch": h.target_arch,
        "min_driver": h.min_driver,
        "build_key": h.build_key,
        "content_hash": h.content_hash,
    }


def _body_map(plan: PlanData) -> dict:
    return {
        "slots": [
            {
                "name": s.name,
                "uid": s.uid,
                "dtype": s.dtype,
                "dims": list(s.dims),
                "strides": list(s.strides),
                "is_output": s.is_output,
                "align": s.align,
            }
            for s in plan.slots
        ],
        "kernels": [
            {
                "name": k.name,
                "entry": k.entry,
                "cubin": k.cubin,
                "params": [[p.name, p.kind] for p in k.params],
                "block": list(k.block),
                "cluster": list(k.cluster),
                "smem_bytes": k.smem_bytes,
                "grid_rule": k.grid_rule,
                "tiles": dict(sorted(k.tiles.items())),
                "ctas_per_sm": k.ctas_per_sm,
            }
            for k in plan.kernels
        ],
        "launches": [
            {
                "node": launch.node,
                "kernel": launch.kernel,
                "grid": list(launch.grid),
                "args": [_arg_map(a) for a in launch.args],
                "early": launch.early,
            }
            for launch in plan.launches
        ],
        "workspace_bytes": plan.workspace_bytes,
        "workspace": [
            {"name": r.name, "offset": r.offset, "bytes": r.bytes, "zeroed": r.zeroed} for r in plan.workspace
        ],
        "lengths": [{"slot": c.slot, "kind": c.kind, "longest": c.longest, "total": c.total} for c in plan.lengths],
        "nodes": [_node_map(n) for n in plan.nodes],
    }


def _node_map(n: NodeRecord) -> dict:
    """Sizes, constants and roles in NODE_FORMS' order (check_plan has checked the op and form)."""
    form = NODE_FORMS[n.op, n.form]
    mask = n.mask
    return {
        "op": n.op,
        "name": n.name,
        "form": n.form,
        "sizes": {k: n.sizes[k] for k in form.sizes} | {k: n.sizes[k] for k in form.optional_sizes if k in n.sizes},
        "constants": {k: n.constants[k] for k in form.constants},
        "slots": {role: n.slots[role] for role in form.roles + form.optional if role in n.slots},
        "mask": None if mask is None else {
            "causal": mask.causal, "alignment": mask.alignment, "window_left": mask.window_left,
            "window_right": mask.window_right, "softcap": mask.softcap,
        },
    }  # fmt: skip


def _arg_map(a: Arg) -> dict:
    if a.tmap:
        return {"slot": a.slot, "tmap": a.tmap} if a.slot >= 0 else {"workspace": a.workspace, "tmap": a.tmap}
    if a.slot >= 0:
        return {"slot": a.slot}
    if a.workspace >= 0:
        return {"workspace": a.workspace}
    return {"value": list(a.value) if isinstance(a.value, tuple) else a.value}


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, use_single_float=False)


def content_hash(header: Header, body: bytes) -> str:
    """The SHA-256 that seals a plan: over the msgpack of {magic, format, header fields but
    `content_hash`} (as `encode_plan` writes them), then the body bytes.

    Every value the runtime reads from a file is under it, the header's included (a plan pins
    its target and driver, not only its cubins). The first part is one msgpack map, which says
    where it ends, so no bytes can move between it and the body with the same hash."""
    fields = {k: v for k, v in header_map(header).items() if k != "content_hash"}
    digest = hashlib.sha256(_pack({"magic": MAGIC, "format": FORMAT_VERSION, "header": fields}))
    digest.update(body)
    return digest.hexdigest()


def _file_map(header: Header, body: bytes) -> dict:
    return {"magic": MAGIC, "format": FORMAT_VERSION, "header": header_map(header), "body": body}


def encode_plan(plan: PlanData) -> bytes:
    """Serialize; the header's content hash is computed here (`content_hash`)."""
    check_plan(plan)
    body = _pack(_body_map(plan))
    return _pack(_file_map(replace(plan.header, content_hash=content_hash(plan.header, body)), body))


# ------------------------------------------------------------------------------- decoding


class _Reader:
    """Typed field access that names the field in every error."""

    def __init__(self, obj, path: str):
        if not isinstance(obj, dict):
            raise PlanFormatError(f"{path}: expected a map, found {type(obj).__name__}")
        self.obj, self.path = obj, path

    def get(self, key: str, kind: type | tuple[type, ...]):
        if key not in self.obj:
            raise PlanFormatError(f"{self.path}.{key}: missing")
        value = self.obj[key]
        # bool is an int subclass: never accept it where a number is meant
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise PlanFormatError(f"{self.path}.{key}: expected {_kind_name(kind)}, found bool")
        if not isinstance(value, kind):
            raise PlanFormatError(f"{self.path}.{key}: expected {_kind_name(kind)}, found {type(value).__name__}")
        return value

    def int(self, key: str, lo: int, hi: int) -> int:
        value = self.get(key, int)
        if not lo <= value <= hi:
            raise PlanFormatError(f"{self.path}.{key}: {value} is outside [{lo}, {hi}]")
        return value

    def str(self, key: str, max_len: int = 256) -> str:
        value = self.get(key, str)
        if len(value) > max_len:
            raise PlanFormatError(f"{self.path}.{key}: longer than {max_len} characters")
        return value

    def list(self, key: str, max_len: int) -> list:
        value = self.get(key, list)
        if len(value) > max_len:
            raise PlanFormatError(f"{self.path}.{key}: {len(value)} entries, at most {max_len} allowed")
        return value

    def map(self, key: str, kind: type, max_len: int = 64) -> dict:
        """A map of short names to values of `kind` (ranges are check_plan's)."""
        value = self.get(key, dict)
        if len(value) > max_len:
            raise PlanFormatError(f"{self.path}.{key}: {len(value)} entries, at most {max_len} allowed")
        for name, v in value.items():
            if not isinstance(name, str) or not 0 < len(name) <= 64:
                raise PlanFormatError(f"{self.path}.{key}: {str(name)[:80]!r} is not a name (1 to 64 characters)")
            if isinstance(v, bool) or not isinstance(v, kind):
                raise PlanFormatError(f"{self.path}.{key}.{name}: expected {kind.__name__}, found {type(v).__name__}")
        return value

    def ints(self, key: str, length: tuple[int, int], lo: int, hi: int) -> tuple[int, ...]:
        values = self.list(key, length[1])
        if len(values) < length[0]:
            raise PlanFormatError(f"{self.path}.{key}: {len(values)} entries, at least {length[0]} needed")
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise PlanFormatError(f"{self.path}.{key}[{i}]: expected an integer in [{lo}, {hi}], found {v!r}")
        return tuple(values)


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


I64_MAX = (1 << 63) - 1
U64_MAX = (1 << 64) - 1


def read_header(data: bytes) -> tuple[Header, bytes]:
    """Check magic, format version, content hash and encoding; return the header and the body
    bytes (the body is not decoded)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PlanFormatError(f"a plan is bytes, not {type(data).__name__}")
    if len(data) > MAX_PLAN_BYTES:
        raise PlanFormatError(f"{len(data)} bytes is larger than any plan ({MAX_PLAN_BYTES} at most)")
    data = bytes(data)
    top = _unpack(data, "file")
    if not isinstance(top, dict) or top.get("magic") != MAGIC:
        raise PlanFormatError("not a frostc plan (wrong magic); build one with `frostc build`")
    r = _Reader(top, "plan")
    _check_format(r.get("format", int))
    h = _Reader(r.get("header", dict), "header")
    body = r.get("body", bytes)
    header = Header(
        name=h.str("name"),
        frostc_version=h.str("frostc_version", 64),
        cutlass_dsl_version=h.str("cutlass_dsl_version", 64),
        target_arch=h.str("target_arch", 32),
        min_driver=h.int("min_driver", 0, 1 << 30),
        build_key=h.str("build_key", 128),
        content_hash=h.str("content_hash", 64),
    )
    if len(body) > len(data):  # cannot happen with msgpack; kept as the invariant the limits rely on
        raise PlanFormatError("body: larger than the file")
    # fields the content hash does not cover: named first, so they are refused by name
    _refuse_extra_fields(top, _file_map(header, body), "plan")
    _refuse_extra_fields(top["header"], header_map(header), "header")
    if content_hash(header, body) != header.content_hash:
        raise PlanFormatError(
            "header.content_hash: the content hash does not match the header and body: the plan file is "
            f"corrupt or was edited after frostc wrote it; {REBUILD}"
        )
    # what the hash cannot see: another encoding of the same values
    if _pack(_file_map(header, body)) != data:
        raise PlanFormatError(
            "the file is not in its canonical encoding (a value encoded otherwise than frostc writes it, "
            f"or fields in another order): it was edited after frostc wrote it; {REBUILD}"
        )
    _check_header_text(header)
    return header, body


def _refuse_extra_fields(found: dict, known: dict, path: str) -> None:
    for key in found:
        if key not in known:
            raise PlanFormatError(
                f"{path}.{str(key)[:80]}: not a field of a format-{FORMAT_VERSION} plan (the content hash does "
                f"not cover it): the file was edited after frostc wrote it; {REBUILD}"
            )


def _check_format(version: int) -> None:
    if version == FORMAT_VERSION:
        return
    if version > FORMAT_VERSION:
        raise PlanFormatError(
            f"plan format {version} is newer than this runtime's format {FORMAT_VERSION}; load it with a "
            f"newer frost_runtime, or {REBUILD}"
        )
    raise PlanFormatError(f"plan format {version} is older than this runtime's format {FORMAT_VERSION}; {REBUILD}")


# A sealed header can still be wrong (sealed by another writer, or by hand): its text fields are
# held to their forms, the content hash's included.
_HEADER_FORMS = {
    "name": re.compile(r"[\x20-\x7e]{1,256}"),
    "frostc_version": re.compile(r"[0-9A-Za-z.+_-]{1,64}"),
    "cutlass_dsl_version": re.compile(r"[0-9A-Za-z.+_-]{1,64}"),
    "target_arch": re.compile(r"sm_[0-9]{2,3}[af]?"),
    "build_key": re.compile(r"[0-9a-f]{64}"),
    "content_hash": re.compile(r"[0-9a-f]{64}"),
}


def _check_header_text(header: Header) -> None:
    for key, form in _HEADER_FORMS.items():
        value = getattr(header, key)
        if not form.fullmatch(value):
            raise PlanFormatError(f"header.{key}: {value[:80]!r} is not of the form {form.pattern}")


def _unpack(data: bytes, what: str):
    try:
        # strict limits: a corrupt length field must not make the unpacker allocate gigabytes
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=len(data),
            max_str_len=min(len(data), 1 << 20),
            max_array_len=1 << 16,
            max_map_len=1 << 12,
        )
    except (
        ValueError,
        msgpack.exceptions.ExtraData,
        msgpack.exceptions.FormatError,
        msgpack.exceptions.StackError,
        TypeError,
    ) as exc:
        raise PlanFormatError(f"{what}: not valid msgpack ({exc})") from None


def decode_plan(data: bytes) -> PlanData:
    header, body_bytes = read_header(data)
    body = _Reader(_unpack(body_bytes, "body"), "body")
    slots = tuple(_read_slot(_Reader(s, f"slots[{i}]")) for i, s in enumerate(body.list("slots", MAX_SLOTS)))
    kernels = tuple(_read_kernel(_Reader(k, f"kernels[{i}]")) for i, k in enumerate(body.list("kernels", MAX_KERNELS)))
    launches = tuple(
        _read_launch(_Reader(x, f"launches[{i}]")) for i, x in enumerate(body.list("launches", MAX_LAUNCHES))
    )
    regions = tuple(
        _read_region(_Reader(r, f"workspace[{i}]")) for i, r in enumerate(body.list("workspace", MAX_REGIONS))
    )
    lengths = tuple(
        _read_contract(_Reader(c, f"lengths[{i}]")) for i, c in enumerate(body.list("lengths", MAX_REGIONS))
    )
    nodes = tuple(_read_node(_Reader(n, f"nodes[{i}]")) for i, n in enumerate(body.list("nodes", MAX_LAUNCHES)))
    workspace_bytes = body.int("workspace_bytes", 0, I64_MAX)
    plan = PlanData(header, slots, kernels, launches, workspace_bytes, regions, lengths, nodes)
    if not launches:
        raise PlanFormatError("body.launches: a plan launches at least one kernel")
    check_plan(plan)
    # what the content hash cannot see, as for the file: another encoding of the same values
    if _pack(_body_map(plan)) != body_bytes:
        raise PlanFormatError(
            "body: not in its canonical encoding (an extra field, a value encoded otherwise than frostc writes it, "
            f"or fields in another order): it was edited after frostc wrote it; {REBUILD}"
        )
    return plan


def _read_slot(r: _Reader) -> TensorSlot:
    dims = r.ints("dims", (1, 8), 1, I64_MAX)
    return TensorSlot(
        name=r.str("name", MAX_NAME_CHARS),
        uid=r.int("uid", 1, I64_MAX),
        dtype=r.str("dtype", 8),
        dims=dims,
        strides=r.ints("strides", (len(dims), len(dims)), 0, I64_MAX),
        is_output=r.get("is_output", bool),
        align=r.int("align", 1, 4096),
    )


def _read_region(r: _Reader) -> WorkspaceRegion:
    return WorkspaceRegion(
        name=r.str("name", MAX_NAME_CHARS), offset=r.int("offset", 0, I64_MAX), bytes=r.int("bytes", 0, I64_MAX),
        zeroed=r.get("zeroed", bool),
    )  # fmt: skip


def _read_contract(r: _Reader) -> LengthContract:
    return LengthContract(
        slot=r.int("slot", 0, MAX_SLOTS - 1), kind=r.str("kind", 16), longest=r.int("longest", 0, I64_MAX),
        total=r.int("total", 0, I64_MAX),
    )  # fmt: skip


def _read_node(r: _Reader) -> NodeRecord:
    mask = r.get("mask", (dict, type(None)))
    return NodeRecord(
        op=r.str("op", 32), name=r.str("name", MAX_NAME_CHARS), form=r.str("form", 32),
        sizes=r.map("sizes", int), slots=r.map("slots", int), constants=r.map("constants", float),
        mask=None if mask is None else _read_mask(_Reader(mask, f"{r.path}.mask")),
    )  # fmt: skip


def _read_mask(r: _Reader) -> NodeMask:
    return NodeMask(
        causal=r.get("causal", bool), alignment=r.str("alignment", 32),
        window_left=r.get("window_left", (int, type(None))), window_right=r.get("window_right", (int, type(None))),
        softcap=r.get("softcap", (float, type(None))),
    )  # fmt: skip


def _read_kernel(r: _Reader) -> Kernel:
    params = []
    for i, p in enumerate(r.list("params", 512)):
        if not (isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and 0 < len(x) <= 128 for x in p)):
            raise PlanFormatError(f"{r.path}.params[{i}]: expected [name, kind], two short non-empty strings")
        params.append(Param(p[0], p[1]))
    tiles = r.get("tiles", dict)
    if len(tiles) > 64 or not all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, int) and not isinstance(v, bool) and abs(v) <= I64_MAX
        for k, v in tiles.items()
    ):
        raise PlanFormatError(f"{r.path}.tiles: expected a map of names to integers (at most 64, each within int64)")
    cubin = r.get("cubin", bytes)
    if len(cubin) > MAX_CUBIN_BYTES:
        raise PlanFormatError(f"{r.path}.cubin: {len(cubin)} bytes, at most {MAX_CUBIN_BYTES} allowed")
    return Kernel(
        name=r.str("name"),
        entry=r.str("entry", 1024),
        cubin=cubin,
        params=tuple(params),
        block=r.ints("block", (3, 3), 1, 1024),
        cluster=r.ints("cluster", (3, 3), 1, MAX_CLUSTER_CTAS),
        smem_bytes=r.int("smem_bytes", 0, MAX_SMEM_BYTES),
        grid_rule=r.str("grid_rule"),
        tiles=tiles,
        ctas_per_sm=r.int("ctas_per_sm", 0, 64),
    )


def _read_launch(r: _Reader) -> Launch:
    args = []
    for i, a in enumerate(r.list("args", 512)):
        ar = _Reader(a, f"{r.path}.args[{i}]")
        if not isinstance(a, dict):
            raise PlanFormatError(f"{ar.path}: expected a map")
        if "tmap" in a:
            if set(a) == {"slot", "tmap"}:
                args.append(Arg(slot=ar.int("slot", 0, MAX_SLOTS - 1), tmap=ar.get("tmap", bytes)))
            elif set(a) == {"workspace", "tmap"}:
                args.append(Arg(workspace=ar.int("workspace", 0, I64_MAX), tmap=ar.get("tmap", bytes)))
            else:
                raise PlanFormatError(f"{ar.path}: a tensor map takes tmap and exactly one of slot or workspace")
        elif len(a) != 1:
            raise PlanFormatError(f"{ar.path}: expected exactly one of slot, workspace or value")
        elif "slot" in a:
            args.append(Arg(slot=ar.int("slot", 0, MAX_SLOTS - 1)))
        elif "workspace" in a:
            args.append(Arg(workspace=ar.int("workspace", 0, I64_MAX)))
        else:
            value = ar.get("value", (int, float, list))
            args.append(Arg(value=tuple(value) if isinstance(value, list) else value))
    return Launch(
        kernel=r.int("kernel", 0, MAX_KERNELS - 1),
        grid=r.ints("grid", (3, 3), 1, MAX_GRID[0]),
        args=tuple(args),
        node=r.str("node", MAX_NAME_CHARS),
        early=r.get("early", bool),
    )


# ------------------------------------------------------------------------------- consistency


def check_plan(plan: PlanData) -> None:
    """Cross-field checks shared by the writer and the reader."""
    names = set()
    for i, s in enumerate(plan.slots):
        where = f"slots[{i}]"
        if s.dtype not in dtypes.ELEMENT_BYTES:
            raise PlanFormatError(f"{where}.dtype: {s.dtype!r} is not one of {sorted(dtypes.ELEMENT_BYTES)}")
        if len(s.strides) != len(s.dims):
            raise PlanFormatError(f"{where}.strides: {len(s.strides)} strides for {len(s.dims)} dims")
        if s.name in names:
            raise PlanFormatError(f"{where}.name: {s.name!r} appears twice")
        names.add(s.name)
        if not s.name:
            raise PlanFormatError(f"{where}.name: empty")
        if any(d < 1 for d in s.dims) or any(st < 0 for st in s.strides):
            raise PlanFormatError(f"{where}: dims must be positive and strides non-negative")
        # the furthest element any kernel may address, in bytes, must fit int64 (pointer arithmetic)
        extent = (sum((d - 1) * st for d, st in zip(s.dims, s.strides)) + 1) * dtypes.ELEMENT_BYTES[s.dtype]
        if extent > I64_MAX:
            raise PlanFormatError(f"{where}: dims {s.dims} with strides {s.strides} span more than 2**63 bytes")
        if s.align & (s.align - 1) or s.align < 1:
            raise PlanFormatError(f"{where}.align: {s.align} is not a power of two")
    for i, k in enumerate(plan.kernels):
        where = f"kernels[{i}]"
        param_bytes = 0
        for j, p in enumerate(k.params):
            if p.kind not in PARAM_KINDS:
                raise PlanFormatError(f"{where}.params[{j}]: kind {p.kind!r} is not one of {sorted(PARAM_KINDS)}")
            size, align = PARAM_KINDS[p.kind], PARAM_ALIGN[p.kind]
            param_bytes = (param_bytes + align - 1) // align * align + size
        if param_bytes > MAX_PARAM_BYTES:
            raise PlanFormatError(f"{where}.params: {param_bytes} bytes of parameters, at most {MAX_PARAM_BYTES}")
        if not k.cubin.startswith(b"\x7fELF"):
            raise PlanFormatError(f"{where}.cubin: not an ELF cubin")
        if not k.entry or "\0" in k.entry:
            raise PlanFormatError(f"{where}.entry: the kernel's function name must be a non-empty string")
        if len(k.block) != 3 or any(not 1 <= b <= hi for b, hi in zip(k.block, MAX_BLOCK)):
            raise PlanFormatError(f"{where}.block: {k.block} is outside CUDA's limits {MAX_BLOCK}")
        if k.block[0] * k.block[1] * k.block[2] > 1024:
            raise PlanFormatError(f"{where}.block: {k.block} is more than 1024 threads")
        if len(k.cluster) != 3 or min(k.cluster) < 1 or k.cluster[0] * k.cluster[1] * k.cluster[2] > MAX_CLUSTER_CTAS:
            raise PlanFormatError(f"{where}.cluster: {k.cluster} is more than {MAX_CLUSTER_CTAS} CTAs")
        if not 0 <= k.smem_bytes <= MAX_SMEM_BYTES:
            raise PlanFormatError(f"{where}.smem_bytes: {k.smem_bytes} is outside [0, {MAX_SMEM_BYTES}]")
    _check_workspace(plan)
    _check_lengths(plan)
    _check_nodes(plan)
    for i, launch in enumerate(plan.launches):
        where = f"launches[{i}]"
        if len(launch.grid) != 3 or any(not 1 <= g <= hi for g, hi in zip(launch.grid, MAX_GRID)):
            raise PlanFormatError(f"{where}.grid: {launch.grid} is outside CUDA's limits {MAX_GRID}")
        if not 0 <= launch.kernel < len(plan.kernels):
            raise PlanFormatError(f"{where}.kernel: {launch.kernel} but the plan has {len(plan.kernels)} kernels")
        if launch.early and i == 0:
            raise PlanFormatError(f"{where}.early: the first launch cannot start early (none of the plan is ahead)")
        params = plan.kernels[launch.kernel].params
        if len(launch.args) != len(params):
            raise PlanFormatError(f"{where}.args: {len(launch.args)} arguments for {len(params)} parameters")
        for j, (arg, param) in enumerate(zip(launch.args, params)):
            _check_arg(arg, param, len(plan.slots), plan.workspace_bytes, f"{where}.args[{j}]")


def _check_lengths(plan: PlanData) -> None:
    for i, c in enumerate(plan.lengths):
        where = f"lengths[{i}]"
        if c.kind not in LENGTH_KINDS:
            raise PlanFormatError(f"{where}.kind: {c.kind!r} is not one of {list(LENGTH_KINDS)}")
        if (
            not 0 <= c.slot < len(plan.slots)
            or plan.slots[c.slot].dtype != "int32"
            or len(plan.slots[c.slot].dims) != 1
        ):
            raise PlanFormatError(f"{where}.slot: {c.slot} is not a rank-1 int32 slot")


def _check_nodes(plan: PlanData) -> None:
    """Each node is of a known op and form with exactly its sizes and constants and the roles it
    has, its slots in range (a length role's with a contract of its kind, a page table's rank-2
    int32); every launch is a node's, and every node has a launch."""
    names = set()
    contracts = {(c.slot, c.kind) for c in plan.lengths}
    for i, n in enumerate(plan.nodes):
        where = f"nodes[{i}]"
        if not n.name or n.name in names:
            raise PlanFormatError(f"{where}.name: {n.name!r} is empty or appears twice")
        names.add(n.name)
        form = NODE_FORMS.get((n.op, n.form))
        if form is None:
            forms = [f for op, f in NODE_FORMS if op == n.op]
            if not forms:
                raise PlanFormatError(f"{where}.op: {n.op!r} is not one of {sorted({op for op, _ in NODE_FORMS})}")
            raise PlanFormatError(f"{where}.form: {n.form!r} is not a form of op {n.op!r} (one of {forms})")
        _check_names(n.sizes, form.sizes, f"{where}.sizes", f"a size of a {n.op} node", form.optional_sizes)
        for key, value in n.sizes.items():
            if not _int_in(value, 1, I64_MAX):
                raise PlanFormatError(f"{where}.sizes.{key}: {value!r} is not an integer in [1, {I64_MAX}]")
        _check_names(n.constants, form.constants, f"{where}.constants", f"a constant of a {n.op} node")
        for key, value in n.constants.items():
            if not _positive_f32(value):
                raise PlanFormatError(f"{where}.constants.{key}: {value!r} is not a finite float32 > 0")
        _check_roles(n, form, plan, contracts, where)
        if form.mask != (n.mask is not None):
            raise PlanFormatError(f"{where}.mask: {'missing' if form.mask else f'a {n.op} node has no mask'}")
        if n.mask is not None:
            _check_mask(n.mask, f"{where}.mask")
    launched = set()
    for i, launch in enumerate(plan.launches):
        if launch.node not in names:
            raise PlanFormatError(f"launches[{i}].node: {launch.node[:80]!r} is not a node of the plan (body.nodes)")
        launched.add(launch.node)
    for i, n in enumerate(plan.nodes):
        if n.name not in launched:
            raise PlanFormatError(f"nodes[{i}]: node {n.name!r} has no launch")


def _check_names(found: dict, names: tuple[str, ...], where: str, what: str, optional: tuple[str, ...] = ()) -> None:
    for key in found:
        if key not in names and key not in optional:
            raise PlanFormatError(f"{where}.{str(key)[:80]}: not {what}")
    for key in names:
        if key not in found:
            raise PlanFormatError(f"{where}.{key}: missing")


def _check_roles(n: NodeRecord, form: NodeForm, plan: PlanData, contracts: set, where: str) -> None:
    for role in n.slots:
        if role not in form.roles + form.optional:
            of = f"a {n.op} node" + (f" of form {n.form!r}" if n.form else "")
            raise PlanFormatError(f"{where}.slots.{str(role)[:80]}: not a role of {of}")
    for role in form.roles:
        if role not in n.slots:
            raise PlanFormatError(f"{where}.slots.{role}: missing")
    for group in form.together:
        given = [role for role in group if role in n.slots]
        if given and len(given) < len(group):
            lacking = next(role for role in group if role not in n.slots)
            raise PlanFormatError(f"{where}.slots.{lacking}: missing ({', '.join(group)} go together)")
    for role, slot in n.slots.items():
        if not _int_in(slot, 0, len(plan.slots) - 1):
            raise PlanFormatError(f"{where}.slots.{role}: {slot!r} but the plan has {len(plan.slots)} slots")
        kind = LENGTH_ROLES.get(role)
        if kind is not None and (slot, kind) not in contracts:
            raise PlanFormatError(f"{where}.slots.{role}: slot {slot} has no length contract of kind {kind!r}")
        s = plan.slots[slot]
        if role == PAGE_TABLE_ROLE and (s.dtype != "int32" or len(s.dims) != 2):
            raise PlanFormatError(f"{where}.slots.{role}: slot {slot} is not a rank-2 int32 slot")
        if role == SLOT_MAPPING_ROLE and (s.dtype != "int32" or len(s.dims) != 1):
            raise PlanFormatError(f"{where}.slots.{role}: slot {slot} is not a rank-1 int32 slot")


def _check_mask(m: NodeMask, where: str) -> None:
    if m.alignment not in ALIGNMENTS:
        raise PlanFormatError(f"{where}.alignment: {m.alignment!r} is not one of {list(ALIGNMENTS)}")
    for key in ("window_left", "window_right"):
        value = getattr(m, key)
        if value is not None and not _int_in(value, 0, WINDOW_MAX):
            raise PlanFormatError(f"{where}.{key}: {value!r} is neither None nor an integer in [0, {WINDOW_MAX}]")
    if m.causal and m.window_right != 0:
        raise PlanFormatError(f"{where}.window_right: {m.window_right!r}, but a causal mask's is 0")
    if m.softcap is not None and not _positive_f32(m.softcap):
        raise PlanFormatError(f"{where}.softcap: {m.softcap!r} is neither None nor a finite float32 > 0")


def _int_in(value, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _positive_f32(value) -> bool:
    """A float (never an int: frostc writes floats as float64) that float32 holds, > 0 (not NaN)."""
    return isinstance(value, float) and 0 < value <= F32_MAX


def _check_workspace(plan: PlanData) -> None:
    names = set()
    for i, r in enumerate(plan.workspace):
        where = f"workspace[{i}]"
        if not r.name or r.name in names:
            raise PlanFormatError(f"{where}.name: {r.name!r} is empty or appears twice")
        names.add(r.name)
        if r.offset % WORKSPACE_ALIGN or r.offset + r.bytes > plan.workspace_bytes:
            raise PlanFormatError(
                f"{where}: {r.bytes} bytes at offset {r.offset} must start at a multiple of {WORKSPACE_ALIGN} "
                f"and lie within the {plan.workspace_bytes}-byte workspace"
            )
        if r.zeroed and r.bytes % 4:
            raise PlanFormatError(f"{where}: a zeroed region is zeroed in 4-byte words; {r.bytes} bytes is not")


def _check_arg(arg: Arg, param: Param, n_slots: int, workspace_bytes: int, where: str) -> None:
    if param.kind == "tmap" or arg.tmap:
        bound = 0 <= arg.slot < n_slots or 0 <= arg.workspace < workspace_bytes
        if param.kind != "tmap" or len(arg.tmap) != PARAM_KINDS["tmap"] or not bound:
            raise PlanFormatError(
                f"{where}: tensor-map parameter {param.name!r} needs a slot or a workspace offset, and 128 bytes "
                f"(found slot {arg.slot}, workspace {arg.workspace}, {len(arg.tmap)} bytes, kind {param.kind})"
            )
        return
    if param.kind == "i32x3":
        value = arg.value
        if arg.slot >= 0 or not (
            isinstance(value, tuple) and len(value) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 31 for x in value)
        ):  # fmt: skip
            raise PlanFormatError(f"{where}.value: expected three int32 for {param.name!r}, found {value!r}")
        return
    if isinstance(arg.value, tuple):
        raise PlanFormatError(f"{where}.value: a list for {param.kind} parameter {param.name!r}")
    if arg.workspace >= 0:
        if param.kind != "ptr" or arg.slot >= 0:
            raise PlanFormatError(f"{where}: a workspace offset bound to {param.kind} parameter {param.name!r}")
        if arg.workspace >= workspace_bytes:
            raise PlanFormatError(
                f"{where}.workspace: offset {arg.workspace} is outside the {workspace_bytes}-byte workspace"
            )
        return
    if arg.slot >= 0:
        if param.kind != "ptr":
            raise PlanFormatError(f"{where}: a slot bound to {param.kind} parameter {param.name!r}")
        if not 0 <= arg.slot < n_slots:
            raise PlanFormatError(f"{where}.slot: {arg.slot} but the plan has {n_slots} slots")
        return
    value = arg.value
    if param.kind == "f32":
        # a finite value that a float32 can hold: NaN/inf or overflow would poison every result
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not abs(value) <= F32_MAX:
            raise PlanFormatError(f"{where}.value: expected a finite float32 for {param.name!r}, found {value!r}")
        return
    lo, hi = {"i32": (-(1 << 31), (1 << 31) - 1), "i64": (-(1 << 63), I64_MAX), "ptr": (0, U64_MAX)}[param.kind]
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise PlanFormatError(f"{where}.value: {value!r} does not fit {param.kind} parameter {param.name!r}")
