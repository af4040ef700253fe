"""The plan-set format, defined once: a model's plans (one per layer kind x phase x batch bucket)
in one file, each kernel cubin stored once however many plans use it. frostc writes through
`encode_set`; the runtime reads through `read_set`.

A set file is one msgpack map:

    {"magic": "frostc-planset", "format": 5, "header": {...}, "manifest": {...}, "cubins": {...}}

- header: the set's name, the model it serves (text), frostc and cutlass-dsl versions, target
  arch, minimum driver, and `content_hash`;
- manifest: `plans`, one entry per plan (key, the plan's name, phase, batch, layer kind, the
  layers it serves, the SHA-256 of the plan as a standalone plan file, and that file's bytes with
  each kernel's cubin replaced by its SHA-256 in hex: a reference into the cubin table), and
  `missing`, the keys the set lacks and why, and `kinds`: each layer kind's attention (layers,
  heads and KV heads per rank, head dim, dtype, scale, window, softcap), what a serving
  integration checks a model's call against before it launches a plan, and `serving`: the
  deployment's capacities (cache length, pages, prompt tokens, new tokens per decode step);
- cubins: SHA-256 (hex) -> cubin bytes, each stored once, in hash order.

`content_hash` is the SHA-256 of the msgpack of {magic, format, header but content_hash,
manifest, cubins}; a file must also be exactly the canonical encoding of what it holds, so any
changed byte is refused. The set's identity is the SHA-256 of the whole file (`plan_sha256`).
Reading rebuilds each plan's standalone bytes (cubins put back), checks them against the
recorded SHA-256 and decodes them with `schema.decode_plan`: a plan from a set is byte for byte
the plan `frostc build` writes for its description.
"""

import hashlib
import math
import os
import re
from dataclasses import asdict, dataclass, field

import msgpack

from frost_runtime import schema
from frost_runtime.dtypes import DTYPES, KV_CACHE
from frost_runtime.integrity import Pin, check_sha256
from frost_runtime.schema import PlanData, PlanFormatError, _Reader, _unpack

SET_MAGIC = "frostc-planset"
# 2: the manifest's `kinds`; 3: the serving map's kv_cache_dtype; 4: `glue`; 5: its plans are of plan format 8
# (they record what each node computes: a set of an older format holds plans this runtime refuses)
SET_FORMAT_VERSION = 5
REBUILD_SET = "rebuild it with this frostc: frostc from-config CONFIG.json -o SET"
MAX_SET_BYTES = 1 << 32
MAX_SET_PLANS = 4096
MAX_SET_CUBINS = 1024
MAX_MODEL_CHARS = 2048
# mixed: transformers' continuous batching (its buckets are tokens); context: an MLA model's steps over
# the whole context transformers expands from its latents (frostc.serving.context_description)
PHASES = ("prefill", "decode", "mixed", "context")
# the decode step's plans around the attention, for fused decoder layers (frost_runtime.hf_fuse)
GLUE_OPS = ("rms_norm", "add_rms_norm", "silu_mul")
_SHA = re.compile(r"[0-9a-f]{64}")
_KIND = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class SetHeader:
    name: str
    model: str  # what the set serves, for people: the model and the deployment in one text
    frostc_version: str
    cutlass_dsl_version: str
    target_arch: str
    min_driver: int
    content_hash: str = ""


@dataclass(frozen=True)
class SetEntry:
    """A plan of the set, without its bytes."""

    key: str  # "l0-decode-b32"
    name: str  # the plan's header name
    phase: str  # one of PHASES
    batch: int  # the bucket: the most sequences the plan takes
    kind: str  # the layer kind, "l0"
    layers: tuple[int, ...]  # the model's layers of that kind
    sha256: str  # the standalone plan file's SHA-256: what `load(..., sha256=)` would pin


@dataclass(frozen=True)
class GlueEntry:
    """A plan of the decode step's other work (a norm, a norm after a residual add, an MLP's
    activation) for `tokens` rows: what a model's fused layers launch around the attention."""

    key: str  # "glue-rms_norm-t32"
    name: str  # the plan's header name
    op: str  # one of GLUE_OPS
    tokens: int  # the rows it takes: a decode bucket's sequences x new tokens
    sha256: str


@dataclass(frozen=True)
class MissingEntry:
    """A plan the set lacks (frostc cannot build it yet), and why."""

    key: str
    phase: str
    batch: int
    kind: str
    layers: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class KindInfo:
    """One layer kind's attention, as the model computes it on one rank."""

    kind: str
    layers: tuple[int, ...]
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    scale: float
    window_left: int | None  # keys before the query's own a query sees; None: no window
    softcap: float | None
    sinks: bool = False  # a learned logit per query head joins the softmax (gpt-oss): each layer binds its own


@dataclass(frozen=True)
class ServingInfo:
    """The deployment the plans were built for: the capacities every plan of the set shares."""

    max_cache_len: int  # tokens per sequence in the cache
    page_size: int
    pages: int  # the pool's, shared by every sequence
    max_prompt_tokens: int  # one prefill step's tokens, all its sequences together
    new_tokens: int  # per sequence per decode step
    tp: int
    kv_cache_dtype: str  # the pools' (the kinds' dtype, or e4m3: one float32 scale per KV head and layer)

    @property
    def max_pages(self) -> int:
        """Pages one sequence can hold: the page table's width."""
        return -(-self.max_cache_len // self.page_size)


@dataclass(frozen=True)
class PlanSet:
    header: SetHeader
    entries: tuple[SetEntry, ...]
    missing: tuple[MissingEntry, ...]
    kind_info: dict[str, KindInfo]
    serving: ServingInfo
    cubins: dict[str, bytes] = field(repr=False)  # sha256 hex -> bytes
    sha256: str = ""  # the set file's SHA-256, its identity
    _plans: dict[str, bytes] = field(default_factory=dict, repr=False)  # key -> standalone plan bytes
    _data: dict[str, PlanData] = field(default_factory=dict, repr=False)
    glue: tuple[GlueEntry, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """Every plan's key: the attention plans', then the glue plans'."""
        return tuple(e.key for e in self.entries) + tuple(g.key for g in self.glue)

    def entry(self, key: str) -> SetEntry:
        """The attention plan `key` (KeyError for a glue plan's key, or one the set lacks)."""
        for e in self.entries:
            if e.key == key:
                return e
        lacking = next((m for m in self.missing if m.key == key), None)
        if lacking is not None:
            raise KeyError(f"plan set {self.header.name!r} lacks {key!r}: {lacking.reason}")
        raise KeyError(f"plan set {self.header.name!r} has no plan {key!r}; its keys: {', '.join(self.keys)}")

    def plan_bytes(self, key: str) -> bytes:
        """The plan's standalone file bytes (what `frostc build` writes for its description)."""
        return self._plans[self._key(key)]

    def plan_data(self, key: str) -> PlanData:
        return self._data[self._key(key)]

    def _key(self, key: str) -> str:
        """`key`, a plan or glue plan of the set (KeyError naming what the set has otherwise)."""
        if any(g.key == key for g in self.glue):
            return key
        return self.entry(key).key

    def glue_key(self, op: str, tokens: int) -> str | None:
        """The key of the glue plan of `op` for exactly `tokens` rows, or None (the set has none:
        built without --glue, or no decode bucket makes that many rows)."""
        return next((g.key for g in self.glue if g.op == op and g.tokens == tokens), None)

    def kind_of(self, layer: int) -> str:
        """The layer kind that serves model layer `layer`."""
        for e in (*self.entries, *self.missing):
            if layer in e.layers:
                return e.kind
        raise KeyError(f"plan set {self.header.name!r} serves no layer {layer}")

    def select(self, phase: str, layer_kind: str, batch: int) -> str:
        """The key of the smallest bucket of `phase` and `layer_kind` that takes `batch` sequences."""
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r}: expected one of {list(PHASES)}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch {batch!r}: expected an int >= 1")
        buckets = sorted((e.batch, e.key) for e in self.entries if e.phase == phase and e.kind == layer_kind)
        if not buckets:
            lacking = [m for m in self.missing if m.phase == phase and m.kind == layer_kind]
            why = f": {lacking[0].reason}" if lacking else f"; its kinds: {', '.join(self.kinds)}"
            raise KeyError(f"plan set {self.header.name!r} has no {phase} plan for layer kind {layer_kind!r}{why}")
        for size, key in buckets:
            if size >= batch:
                return key
        largest, key = buckets[-1]
        raise ValueError(
            f"batch {batch} is larger than the largest {phase} bucket of layer kind {layer_kind!r} in plan set "
            f"{self.header.name!r}: {largest} ({key}); split the batch, or build the set with a larger batch size "
            "(frostc from-config --batch-sizes)"
        )

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.kind for e in (*self.entries, *self.missing)))

    def load(self, key: str, **kwargs):
        """Load one plan on the GPU (`frost_runtime.load` on its standalone bytes)."""
        from frost_runtime import load

        return load(self.plan_bytes(key), **kwargs)


# ------------------------------------------------------------------------------- encoding


def header_fields(h: SetHeader) -> dict:
    """The set header's fields, as the file holds them."""
    return {
        "name": h.name,
        "model": h.model,
        "frostc_version": h.frostc_version,
        "cutlass_dsl_version": h.cutlass_dsl_version,
        "target_arch": h.target_arch,
        "min_driver": h.min_driver,
        "content_hash": h.content_hash,
    }


def entry_fields(e: SetEntry) -> dict:
    """A manifest entry's fields, as the file holds them (less the plan's bytes)."""
    return {
        "key": e.key,
        "name": e.name,
        "phase": e.phase,
        "batch": e.batch,
        "kind": e.kind,
        "layers": list(e.layers),
        "sha256": e.sha256,
    }


def serving_fields(d: ServingInfo) -> dict:
    """The manifest's `serving` map: the dataclass's fields, in their order."""
    return asdict(d)


def kind_fields(k: KindInfo) -> dict:
    return {
        "layers": list(k.layers),
        "heads": k.heads,
        "kv_heads": k.kv_heads,
        "head_dim": k.head_dim,
        "dtype": k.dtype,
        "scale": float(k.scale),
        "window_left": -1 if k.window_left is None else k.window_left,
        "softcap": 0.0 if k.softcap is None else float(k.softcap),
    } | ({"sinks": True} if k.sinks else {})  # written only where true: sets without sinks are unchanged


def glue_fields(g: GlueEntry) -> dict:
    """A glue entry's fields, as the manifest holds them (less the plan's bytes)."""
    return {"key": g.key, "name": g.name, "op": g.op, "tokens": g.tokens, "sha256": g.sha256}


def missing_fields(m: MissingEntry) -> dict:
    """A missing entry's fields, as the manifest holds them."""
    return {
        "key": m.key,
        "phase": m.phase,
        "batch": m.batch,
        "kind": m.kind,
        "layers": list(m.layers),
        "reason": m.reason,
    }


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, use_single_float=False)


def set_content_hash(header: SetHeader, manifest: dict, cubins: dict) -> str:
    fields = {k: v for k, v in header_fields(header).items() if k != "content_hash"}
    top = {"magic": SET_MAGIC, "format": SET_FORMAT_VERSION, "header": fields, "manifest": manifest, "cubins": cubins}
    return hashlib.sha256(_pack(top)).hexdigest()


def _file_map(header: SetHeader, manifest: dict, cubins: dict) -> dict:
    return {
        "magic": SET_MAGIC,
        "format": SET_FORMAT_VERSION,
        "header": header_fields(header),
        "manifest": manifest,
        "cubins": cubins,
    }


def strip_cubins(plan: bytes) -> tuple[bytes, dict[str, bytes]]:
    """A plan file's bytes with each kernel's cubin replaced by its SHA-256 (hex), and the cubins."""
    top = msgpack.unpackb(plan, raw=False)
    body = msgpack.unpackb(top["body"], raw=False)
    cubins = {}
    for k in body["kernels"]:
        digest = hashlib.sha256(k["cubin"]).hexdigest()
        cubins[digest] = k["cubin"]
        k["cubin"] = digest
    top["body"] = _pack(body)
    return _pack(top), cubins


def encode_set(
    header: SetHeader,
    plans: list[tuple[SetEntry, bytes]],
    missing: tuple[MissingEntry, ...],
    kinds: tuple[KindInfo, ...],
    serving: ServingInfo,
    glue: tuple[tuple[GlueEntry, bytes], ...] = (),
) -> bytes:
    """The set file's bytes: `plans` and `glue` are (entry, standalone plan bytes), in manifest
    order; each plan is checked with the runtime's reader, and so is the set (what frostc
    writes, the runtime reads)."""
    cubins: dict[str, bytes] = {}

    def stripped(entry, data: bytes, fields) -> dict:
        schema.decode_plan(data)
        if entry.sha256 != hashlib.sha256(data).hexdigest():
            raise PlanFormatError(f"manifest {entry.key!r}: sha256 is not the plan's")
        bare, used = strip_cubins(data)
        cubins.update(used)
        return fields(entry) | {"plan": bare}

    manifest = {
        "plans": [stripped(e, data, entry_fields) for e, data in plans],
        "missing": [missing_fields(m) for m in missing],
        "kinds": {k.kind: kind_fields(k) for k in kinds},
        "serving": serving_fields(serving),
        "glue": [stripped(g, data, glue_fields) for g, data in glue],
    }
    table = dict(sorted(cubins.items()))
    sealed = SetHeader(**(header_fields(header) | {"content_hash": set_content_hash(header, manifest, table)}))
    data = _pack(_file_map(sealed, manifest, table))
    read_set(data)
    return data


# ------------------------------------------------------------------------------- decoding


def is_set(data: bytes) -> bool:
    """Whether `data` starts as a plan-set file does (its canonical encoding's first fields)."""
    return bytes(data[:32]).startswith(b"\x85" + _pack("magic") + _pack(SET_MAGIC))


def read_set(source: str | os.PathLike | bytes, *, sha256: Pin | None = None) -> PlanSet:
    """Read and verify a plan set: the pin (on the file's bytes, first), the format, the content
    hash, the canonical encoding, every plan (rebuilt, its SHA-256 checked, decoded) and the
    cubin table. Nothing touches the GPU. Raises PlanFormatError (PlanIntegrityError for a set
    the pin does not allow) naming what is wrong and what to do."""
    data = _read(source)
    if sha256 is not None:
        check_sha256(data, sha256)
    if len(data) > MAX_SET_BYTES:
        raise PlanFormatError(f"{len(data)} bytes is larger than any plan set ({MAX_SET_BYTES} at most)")
    top = _unpack(data, "file")
    if not isinstance(top, dict) or top.get("magic") != SET_MAGIC:
        raise PlanFormatError("not a frostc plan set (wrong magic); build one with `frostc from-config CONFIG -o SET`")
    r = _Reader(top, "set")
    version = r.get("format", int)
    if version != SET_FORMAT_VERSION:
        newer = version > SET_FORMAT_VERSION
        raise PlanFormatError(
            f"plan-set format {version} is {'newer' if newer else 'older'} than this runtime's format "
            f"{SET_FORMAT_VERSION}; {'read it with a newer frost_runtime, or ' if newer else ''}{REBUILD_SET}"
        )
    h = _Reader(r.get("header", dict), "header")
    header = SetHeader(
        name=h.str("name"),
        model=h.str("model", MAX_MODEL_CHARS),
        frostc_version=h.str("frostc_version", 64),
        cutlass_dsl_version=h.str("cutlass_dsl_version", 64),
        target_arch=h.str("target_arch", 32),
        min_driver=h.int("min_driver", 0, 1 << 30),
        content_hash=h.str("content_hash", 64),
    )
    manifest = r.get("manifest", dict)
    cubins = r.get("cubins", dict)
    _refuse_extra(top, _file_map(header, manifest, cubins), "set")
    _refuse_extra(top["header"], header_fields(header), "header")
    if set_content_hash(header, manifest, cubins) != header.content_hash:
        raise PlanFormatError(
            "header.content_hash: the content hash does not match the set: the file is corrupt or was edited "
            f"after frostc wrote it; {REBUILD_SET}"
        )
    if _pack(_file_map(header, manifest, cubins)) != data:
        raise PlanFormatError(
            f"the file is not in its canonical encoding: it was edited after frostc wrote it; {REBUILD_SET}"
        )
    for key in ("name", "frostc_version", "cutlass_dsl_version", "target_arch", "content_hash"):
        value = getattr(header, key)
        if not schema._HEADER_FORMS[key].fullmatch(value):
            raise PlanFormatError(
                f"header.{key}: {value[:80]!r} is not of the form {schema._HEADER_FORMS[key].pattern}"
            )
    return _read_manifest(header, manifest, cubins, hashlib.sha256(data).hexdigest())


def _read_manifest(header: SetHeader, manifest: dict, cubins: dict, digest: str) -> PlanSet:
    m = _Reader(manifest, "manifest")
    _refuse_extra(manifest, {"plans": 0, "missing": 0, "kinds": 0, "serving": 0, "glue": 0}, "manifest")
    if len(cubins) > MAX_SET_CUBINS:
        raise PlanFormatError(f"cubins: {len(cubins)} entries, at most {MAX_SET_CUBINS} allowed")
    for sha, blob in cubins.items():
        if not isinstance(sha, str) or not isinstance(blob, bytes) or hashlib.sha256(blob).hexdigest() != sha:
            raise PlanFormatError(f"cubins[{str(sha)[:16]!r}]: the bytes are not the cubin this hash names")
    entries, missing, plans, decoded, used, seen = [], [], {}, {}, set(), set()
    for i, raw in enumerate(m.list("plans", MAX_SET_PLANS)):
        e = _Reader(raw, f"manifest.plans[{i}]")
        entry = SetEntry(
            key=e.str("key", schema.MAX_PLAN_NAME_CHARS), name=e.str("name", schema.MAX_PLAN_NAME_CHARS),
            phase=e.str("phase", 16), batch=e.int("batch", 1, 1 << 30), kind=e.str("kind", 64),
            layers=e.ints("layers", (1, 1 << 16), 0, 1 << 20), sha256=e.str("sha256", 64),
        )  # fmt: skip
        _check_entry(entry, e.path, seen)
        plans[entry.key], decoded[entry.key] = _read_plan(e, entry, header, cubins, used)
        entries.append(entry)
    for i, raw in enumerate(m.list("missing", MAX_SET_PLANS)):
        e = _Reader(raw, f"manifest.missing[{i}]")
        lack = MissingEntry(
            key=e.str("key", schema.MAX_PLAN_NAME_CHARS), phase=e.str("phase", 16), batch=e.int("batch", 1, 1 << 30),
            kind=e.str("kind", 64), layers=e.ints("layers", (1, 1 << 16), 0, 1 << 20), reason=e.str("reason", 1024),
        )  # fmt: skip
        _check_entry(lack, e.path, seen)
        missing.append(lack)
    if not entries:
        raise PlanFormatError("manifest.plans: a plan set holds at least one plan")
    glue = _read_glue(m, header, cubins, used, plans, decoded)
    kind_info = _read_kinds(m, (*entries, *missing))
    serving = _read_serving(m)
    for info in kind_info.values():  # an unquantized cache holds its layers' dtype
        if serving.kv_cache_dtype != info.dtype and not DTYPES[serving.kv_cache_dtype].quantized:
            raise PlanFormatError(
                f"manifest.serving.kv_cache_dtype: {serving.kv_cache_dtype} caches for kind {info.kind}, whose "
                f"dtype is {info.dtype}; {REBUILD_SET}"
            )
    unused = sorted(set(cubins) - used)
    if unused:
        raise PlanFormatError(f"cubins[{unused[0][:16]!r}]: no plan uses it; {REBUILD_SET}")
    return PlanSet(
        header, tuple(entries), tuple(missing), kind_info, serving, dict(cubins), digest, plans, decoded, glue
    )


def _read_plan(e: _Reader, entry, header: SetHeader, cubins: dict, used: set) -> tuple[bytes, PlanData]:
    """A manifest entry's plan: rebuilt with its cubins, its SHA-256 checked, decoded."""
    plan = _rebuild(e.get("plan", bytes), cubins, used, e.path)
    if hashlib.sha256(plan).hexdigest() != entry.sha256:
        raise PlanFormatError(f"{e.path}.sha256: the rebuilt plan's SHA-256 is not the recorded one; {REBUILD_SET}")
    try:
        data = schema.decode_plan(plan)
    except PlanFormatError as exc:
        raise PlanFormatError(f"{e.path} ({entry.key}): {exc}") from None
    _check_plan_header(data.header, header, entry, e.path)
    return plan, data


def _read_glue(m: _Reader, header: SetHeader, cubins: dict, used: set, plans: dict, decoded: dict):
    """The glue plans: each op and row count once, keys apart from the attention plans'."""
    glue, seen = [], set()
    for i, raw in enumerate(m.list("glue", MAX_SET_PLANS)):
        e = _Reader(raw, f"manifest.glue[{i}]")
        entry = GlueEntry(
            key=e.str("key", schema.MAX_PLAN_NAME_CHARS), name=e.str("name", schema.MAX_PLAN_NAME_CHARS),
            op=e.str("op", 32), tokens=e.int("tokens", 1, 1 << 30), sha256=e.str("sha256", 64),
        )  # fmt: skip
        _refuse_extra(raw, glue_fields(entry) | {"plan": 0}, e.path)
        if entry.op not in GLUE_OPS:
            raise PlanFormatError(f"{e.path}.op: {entry.op!r} is not one of {list(GLUE_OPS)}")
        if not _SHA.fullmatch(entry.sha256):
            raise PlanFormatError(f"{e.path}.sha256: not a SHA-256 in lower-case hex")
        if entry.key in plans or (entry.op, entry.tokens) in seen:
            raise PlanFormatError(f"{e.path}: {entry.key!r} (or its op and tokens) appears twice")
        seen.add((entry.op, entry.tokens))
        plans[entry.key], decoded[entry.key] = _read_plan(e, entry, header, cubins, used)
        glue.append(entry)
    return tuple(glue)


def _read_serving(m: _Reader) -> ServingInfo:
    raw = m.get("serving", dict)
    d = _Reader(raw, "manifest.serving")
    big = 1 << 30
    serving = ServingInfo(
        max_cache_len=d.int("max_cache_len", 1, big), page_size=d.int("page_size", 1, big),
        pages=d.int("pages", 1, big), max_prompt_tokens=d.int("max_prompt_tokens", 1, big),
        new_tokens=d.int("new_tokens", 1, 1 << 16),
        tp=d.int("tp", 1, 1 << 16),
        kv_cache_dtype=d.str("kv_cache_dtype", 16),
    )  # fmt: skip
    if serving.kv_cache_dtype not in KV_CACHE:
        raise PlanFormatError(f"manifest.serving.kv_cache_dtype: {serving.kv_cache_dtype!r} is not one of {KV_CACHE}")
    _refuse_extra(raw, serving_fields(serving), "manifest.serving")
    return serving


def _read_kinds(m: _Reader, entries) -> dict[str, KindInfo]:
    """The kinds table: one per kind the entries name, no other, with the entries' layers."""
    table = m.get("kinds", dict)
    if len(table) > MAX_SET_PLANS:
        raise PlanFormatError(f"manifest.kinds: {len(table)} kinds, at most {MAX_SET_PLANS}")
    kinds = {}
    for name, raw in table.items():
        where = f"manifest.kinds[{str(name)[:64]!r}]"
        if not isinstance(name, str) or not _KIND.fullmatch(name):
            raise PlanFormatError(f"{where}: a kind's name is of the form {_KIND.pattern}")
        if not isinstance(raw, dict):
            raise PlanFormatError(f"{where}: expected a map, found {type(raw).__name__}")
        k = _Reader(raw, where)
        window, softcap = k.int("window_left", -1, 1 << 30), k.get("softcap", float)
        info = KindInfo(
            kind=name, layers=k.ints("layers", (1, 1 << 16), 0, 1 << 20), heads=k.int("heads", 1, 1 << 16),
            kv_heads=k.int("kv_heads", 1, 1 << 16), head_dim=k.int("head_dim", 1, 1 << 16), dtype=k.str("dtype", 16),
            scale=k.get("scale", float), window_left=None if window < 0 else window,
            softcap=None if softcap == 0.0 else softcap, sinks=k.get("sinks", bool) if "sinks" in raw else False,
        )  # fmt: skip
        _refuse_extra(raw, kind_fields(info), where)
        if not (math.isfinite(info.scale) and info.scale > 0 and math.isfinite(softcap) and softcap >= 0):
            raise PlanFormatError(f"{where}: scale must be > 0 and softcap >= 0 (0: none), both finite")
        kinds[name] = info
    for e in entries:
        if e.kind not in kinds:
            raise PlanFormatError(f"manifest: {e.key!r} names layer kind {e.kind!r}, which manifest.kinds lacks")
        if e.layers != kinds[e.kind].layers:
            raise PlanFormatError(f"manifest: {e.key!r}'s layers are not those of manifest.kinds[{e.kind!r}]")
    unused = sorted(set(kinds) - {e.kind for e in entries})
    if unused:
        raise PlanFormatError(f"manifest.kinds[{unused[0]!r}]: no plan or missing entry is of this kind")
    return kinds


def _check_entry(entry, where: str, seen: set) -> None:
    if entry.phase not in PHASES:
        raise PlanFormatError(f"{where}.phase: {entry.phase!r} is not one of {list(PHASES)}")
    if not _KIND.fullmatch(entry.kind):
        raise PlanFormatError(f"{where}.kind: {entry.kind[:80]!r} is not of the form {_KIND.pattern}")
    if isinstance(entry, SetEntry) and not _SHA.fullmatch(entry.sha256):
        raise PlanFormatError(f"{where}.sha256: not a SHA-256 in lower-case hex")
    for mark in (entry.key, (entry.kind, entry.phase, entry.batch)):
        if mark in seen:
            raise PlanFormatError(f"{where}: {entry.key!r} (or its kind, phase and batch) appears twice")
        seen.add(mark)


def _rebuild(stripped: bytes, cubins: dict, used: set, where: str) -> bytes:
    """The standalone plan: each kernel's cubin reference replaced by the table's bytes."""
    try:
        top = _Reader(_unpack(stripped, f"{where}.plan"), f"{where}.plan")
        body = _Reader(_unpack(top.get("body", bytes), f"{where}.plan.body"), f"{where}.plan.body")
        for j, k in enumerate(body.list("kernels", schema.MAX_KERNELS)):
            ref = _Reader(k, f"{where}.plan.kernels[{j}]").get("cubin", str)
            if ref not in cubins:
                raise PlanFormatError(f"{where}.plan.kernels[{j}].cubin: {ref[:16]!r} is not in the cubin table")
            used.add(ref)
            k["cubin"] = cubins[ref]
        top.obj["body"] = _pack(body.obj)
        return _pack(top.obj)
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, PlanFormatError):
            raise
        raise PlanFormatError(f"{where}.plan: not a plan with its cubins referenced ({exc})") from None


def _check_plan_header(plan: schema.Header, header: SetHeader, entry: SetEntry, where: str) -> None:
    if plan.name != entry.name:
        raise PlanFormatError(f"{where}.name: {entry.name!r}, but the plan is named {plan.name!r}")
    for key in ("frostc_version", "cutlass_dsl_version", "target_arch", "min_driver"):
        if getattr(plan, key) != getattr(header, key):
            raise PlanFormatError(
                f"{where} ({entry.key}): the plan's {key} {getattr(plan, key)!r} is not the set's "
                f"{getattr(header, key)!r}; {REBUILD_SET}"
            )


def _refuse_extra(found: dict, known: dict, path: str) -> None:
    for key in found:
        if key not in known:
            raise PlanFormatError(
                f"{path}.{str(key)[:80]}: not a field of a format-{SET_FORMAT_VERSION} plan set: the file was edited "
                f"after frostc wrote it; {REBUILD_SET}"
            )


def _read(source) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    with open(source, "rb") as f:
        return f.read()
