"""The text form of a plan file: what `frostc inspect` prints, as tables or as canonical JSON.

Works from the bytes alone (no GPU, no DSL): the schema is the runtime's.
"""

import hashlib

from frost_runtime import plan_sha256, schema
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from frostc.cubin_info import resources


def _arg_text(a, plan) -> str | int | float | list[int]:
    """What a person needs to know of an argument (a tensor map by its content hash: the 128
    bytes themselves are in the plan)."""
    if a.tmap:
        digest = hashlib.sha256(a.tmap).hexdigest()[:16]
        if a.slot < 0:
            return f"tensor map of workspace + {a.workspace} ({_region(plan, a.workspace)}), sha256 {digest}"
        return f"tensor map of {_slot_text(plan, a.slot)}, sha256 {digest}"
    if a.slot >= 0:
        return _slot_text(plan, a.slot)
    if a.workspace >= 0:
        return f"workspace + {a.workspace} ({_region(plan, a.workspace)})"
    return list(a.value) if isinstance(a.value, tuple) else a.value


def _slot_text(plan, index: int) -> str:
    return f"slot {index} ({plan.slots[index].name})"


def _node(plan, n: schema.NodeRecord) -> dict:
    """A node's record: what it computes, and its roles' slots by name."""
    m = n.mask
    mask = None if m is None else {
        "causal": m.causal, "alignment": m.alignment, "window_left": m.window_left, "window_right": m.window_right,
        "softcap": m.softcap,
    }  # fmt: skip
    return {
        "name": n.name,
        "op": n.op,
        "form": n.form,
        "mask": mask,
        "sizes": dict(n.sizes),
        "constants": dict(n.constants),
        "slots": {role: _slot_text(plan, i) for role, i in n.slots.items()},
    }


def _region(plan, offset: int) -> str:
    """The name of the workspace region that starts at `offset`, or "?"."""
    return next((r.name for r in plan.workspace if r.offset == offset), "?")


def plan_summary(plan: schema.PlanData) -> dict:
    """A canonical, diffable rendering: everything but the raw cubin bytes (hashed instead).

    `header.sha256` is the plan file's SHA-256, its identity (what `load(..., sha256=)` pins): a
    plan has one encoding (decoding refuses any other), so re-encoding gives the file's bytes."""
    return {
        "header": schema.header_map(plan.header) | {"sha256": plan_sha256(schema.encode_plan(plan))},
        "slots": [
            {
                "slot": i,
                "name": s.name,
                "uid": s.uid,
                "dtype": s.dtype,
                "dims": list(s.dims),
                "strides": list(s.strides),
                "io": "output" if s.is_output else "input",
                "align": s.align,
            }
            for i, s in enumerate(plan.slots)
        ],
        "nodes": [_node(plan, n) for n in plan.nodes],
        "kernels": [
            {
                "name": k.name,
                "entry": k.entry,
                "cubin_sha256": hashlib.sha256(k.cubin).hexdigest(),
                "cubin_bytes": len(k.cubin),
                "block": list(k.block),
                "cluster": list(k.cluster),
                "smem_bytes": k.smem_bytes,
                # what ptxas decided, read from the cubin: a change that makes a kernel spill shows here
                "registers": used.registers,
                "stack_bytes": used.stack_bytes,
                "grid_rule": k.grid_rule,
                "tiles": dict(k.tiles),
                "params": [f"{p.name}:{p.kind}" for p in k.params],
                "ctas_per_sm": k.ctas_per_sm,
            }
            for k in plan.kernels
            for used in [resources(k.cubin)]  # the cubin's ELF read once
        ],
        "launches": [
            {
                "node": launch.node,
                "kernel": plan.kernels[launch.kernel].name,
                "grid": list(launch.grid),
                "early": launch.early,
                "args": {p.name: _arg_text(a, plan) for p, a in zip(plan.kernels[launch.kernel].params, launch.args)},
            }
            for launch in plan.launches
        ],
        "workspace_bytes": plan.workspace_bytes,
        "workspace": [
            {"name": r.name, "offset": r.offset, "bytes": r.bytes, "zeroed": r.zeroed} for r in plan.workspace
        ],
        "lengths": [
            {"slot": c.slot, "name": plan.slots[c.slot].name, "kind": c.kind, "longest": c.longest, "total": c.total}
            for c in plan.lengths
        ],
    }


def print_plan(plan: schema.PlanData, console: Console) -> None:
    s = plan_summary(plan)
    h = s["header"]
    console.print(
        f"[bold]{escape(h['name'])}[/bold]  target {escape(h['target_arch'])}  frostc {escape(h['frostc_version'])}  "
        f"cutlass-dsl {escape(h['cutlass_dsl_version'])}  min driver {h['min_driver']}"
    )
    console.print(f"content {h['content_hash'][:16]}…  build key {h['build_key'][:16]}…")
    console.print(f"sha256 {h['sha256']}  (the file's; what load(..., sha256=) pins)", highlight=False)
    console.print(
        _table(
            "Slots (execute's buffer order)",
            s["slots"],
            ["slot", "name", "uid", "dtype", "dims", "strides", "io", "align"],
        )
    )
    rows = [
        dict(n, form=n["form"] or "—", mask=_mask_text(n["mask"]), sizes=_kv(n["sizes"] | n["constants"]),
             slots="\n".join(f"{role}: {text}" for role, text in n["slots"].items()))
        for n in s["nodes"]
    ]  # fmt: skip
    console.print(_table("Nodes (what the plan computes)", rows, ["name", "op", "form", "mask", "sizes", "slots"]))
    for i, k in enumerate(s["kernels"]):
        registers, stack = "not in the cubin", "not in the cubin"  # a cubin that is not a well-formed ELF file
        if k["registers"] is not None:
            registers = f"{k['registers']} a thread at launch"
        if k["stack_bytes"] is not None:
            stack = f"{k['stack_bytes']} B a thread" + (" (a spill or a local array)" if k["stack_bytes"] else "")
        rows = [
            {"field": "entry", "value": k["entry"][:60] + ("…" if len(k["entry"]) > 60 else "")},
            {"field": "block", "value": k["block"]},
            {"field": "cluster", "value": k["cluster"]},
            {"field": "dynamic smem", "value": f"{k['smem_bytes']} B"},
            {"field": "registers", "value": registers},
            {"field": "stack", "value": stack},
            {"field": "grid rule", "value": k["grid_rule"]},
            {"field": "tiles", "value": _kv(k["tiles"])},
            {"field": "ctas per SM", "value": k["ctas_per_sm"] or "not persistent"},
            {"field": "cubin", "value": f"{k['cubin_bytes']} B, sha256 {k['cubin_sha256'][:16]}…"},
        ]
        console.print(_table(f"Kernel {i}: {escape(k['name'])}", rows, ["field", "value"]))
    for i, launch in enumerate(s["launches"]):
        rows = [{"param": k, "value": v} for k, v in launch["args"].items()]
        title = f"Launch {i} (node {escape(launch['node'])}): {escape(launch['kernel'])}  grid {tuple(launch['grid'])}"
        if launch["early"]:  # programmatic dependent launch
            title += ", starts early (during the launch before; its kernel waits for that one's writes)"
        console.print(_table(title, rows, ["param", "value"]))
    if s["lengths"]:
        rows = [dict(c, contract=_contract_text(c)) for c in s["lengths"]]
        console.print(_table("Sequence lengths (the caller's contract)", rows, ["slot", "name", "contract"]))
    if s["workspace"]:
        title = f"Workspace: {s['workspace_bytes']} bytes (the caller's; plan.allocate_workspace())"
        rows = [dict(r, zeroed="yes: kept zero between launches" if r["zeroed"] else "") for r in s["workspace"]]
        console.print(_table(title, rows, ["name", "offset", "bytes", "zeroed"]))
    else:
        console.print(f"Workspace: {s['workspace_bytes']} bytes")


def _mask_text(m: dict | None) -> str:
    """The mask as a description writes it: causal, the windows and the diagonal they bound keys
    around, the softcap; "full" for none of them."""
    if m is None:
        return "—"
    words = ["causal"] if m["causal"] else []
    if m["window_left"] is not None:
        words.append(f"window_left={m['window_left']}")
    if m["window_right"] is not None and not m["causal"]:
        words.append(f"window_right={m['window_right']}")
    if words:
        words.append(m["alignment"])
    if m["softcap"] is not None:
        words.append(f"softcap={m['softcap']!r}")
    return " ".join(words) or "full"


def _contract_text(c: dict) -> str:
    if c["kind"] == "offsets":
        return f"prefix sums, non-decreasing, from >= 0 to <= {c['total']} tokens, each sequence <= {c['longest']}"
    return f"each length in [0, {c['longest']}]"


def _kv(d: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items())


def _table(title: str, rows: list[dict], columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c)
    for row in rows:
        table.add_row(*(_cell(row[c]) for c in columns))
    return table


def _cell(value) -> str:
    """Plan contents are data, never rich markup: escape them."""
    if isinstance(value, list):
        return "(" + ", ".join(map(str, value)) + ")"
    if isinstance(value, float):
        return repr(value)
    return escape(str(value))


# ------------------------------------------------------------------------------- plan sets


def set_summary(ps) -> dict:
    """A plan set's canonical rendering (`frostc inspect SET --json`): the header with the file's
    SHA-256 (the set's identity), each plan's metadata and kernels, what it lacks, the cubin table."""
    from frost_runtime import planset

    used: dict[str, list[str]] = {sha: [] for sha in ps.cubins}
    variant: dict[str, str] = {}

    def kernels(key: str) -> list[str]:
        data = ps.plan_data(key)
        for k in data.kernels:
            sha = hashlib.sha256(k.cubin).hexdigest()
            variant.setdefault(sha, k.name)
            if key not in used[sha]:
                used[sha].append(key)
        return [k.name for k in data.kernels]

    plans = [planset.entry_fields(e) | {"kernels": kernels(e.key)} for e in ps.entries]
    glue = [planset.glue_fields(g) | {"kernels": kernels(g.key)} for g in ps.glue]
    h = ps.header
    return {
        "set": {"format": planset.SET_FORMAT_VERSION} | planset.header_fields(h) | {"sha256": ps.sha256},
        "serving": planset.serving_fields(ps.serving),
        "kinds": [planset.kind_fields(k) | {"kind": k.kind} for k in ps.kind_info.values()],
        "plans": plans,
        "missing": [planset.missing_fields(m) for m in ps.missing],
        "glue": glue,
        "cubins": [
            {"sha256": sha, "kernel": variant[sha], "bytes": len(blob), "used_by": used[sha]}
            for sha, blob in ps.cubins.items()
        ],
    }


def print_set(ps, console: Console) -> None:
    from frostc.serving import compact_layers

    s = set_summary(ps)
    h = s["set"]
    console.print(
        f"plan set [bold]{escape(h['name'])}[/bold] (format {h['format']})  target {escape(h['target_arch'])}  "
        f"frostc {escape(h['frostc_version'])}  cutlass-dsl {escape(h['cutlass_dsl_version'])}  "
        f"min driver {h['min_driver']}"
    )
    console.print(escape(h["model"]), highlight=False)
    console.print(f"content {h['content_hash'][:16]}…")
    console.print(f"sha256 {h['sha256']}  (the set file's; what read_set(..., sha256=) pins)", highlight=False)
    v = s["serving"]
    steps = (  # a set of mixed plans only (continuous batching, vLLM) has no prefill or decode steps
        ""
        if {p["phase"] for p in s["plans"]} == {"mixed"}
        else f"prefill up to {v['max_prompt_tokens']} tokens per step; "
        f"{v['new_tokens']} new {'token' if v['new_tokens'] == 1 else 'tokens'} per decode step; "
    )
    console.print(
        f"serving: a {v['kv_cache_dtype']} paged cache of {v['pages']} pages of {v['page_size']} tokens, up to "
        f"{v['max_cache_len']} tokens per sequence; {steps}tp {v['tp']}",
        highlight=False,
    )
    rows = [
        dict(
            k,
            layers=compact_layers(tuple(k["layers"])),
            window_left="—" if k["window_left"] < 0 else k["window_left"],
            softcap=k["softcap"] or "—",
            scale=f"{k['scale']:.6g}",
        )
        for k in s["kinds"]
    ]
    columns = ["kind", "layers", "heads", "kv_heads", "head_dim", "dtype", "scale", "window_left", "softcap"]
    console.print(_table(f"Layer kinds ({len(rows)})", rows, columns))
    rows = [
        dict(p, layers=compact_layers(tuple(p["layers"])), sha256=p["sha256"][:16] + "…", kernels=len(p["kernels"]))
        for p in s["plans"]
    ]
    columns = ["key", "phase", "batch", "kind", "layers", "sha256", "kernels"]
    console.print(_table(f"Plans ({len(rows)})", rows, columns))
    if s["glue"]:
        rows = [dict(g, sha256=g["sha256"][:16] + "…", kernels=", ".join(g["kernels"])) for g in s["glue"]]
        title = f"Glue plans ({len(rows)}: the decode step's norms and activation, for fused layers)"
        console.print(_table(title, rows, ["key", "op", "tokens", "sha256", "kernels"]))
    if s["missing"]:
        rows = [dict(m, layers=compact_layers(tuple(m["layers"]))) for m in s["missing"]]
        console.print(_table(f"Missing ({len(rows)})", rows, ["key", "phase", "batch", "kind", "layers", "reason"]))
    rows = [
        {"sha256": c["sha256"][:16] + "…", "bytes": c["bytes"], "used by": f"{len(c['used_by'])} plans"}
        for c in s["cubins"]
    ]
    total = sum(c["bytes"] for c in s["cubins"])
    console.print(
        _table(f"Cubins ({len(rows)}, {total} bytes, each stored once)", rows, ["sha256", "bytes", "used by"])
    )
