"""The text form of a plan file: what `frostc inspect` prints, as tables or as canonical JSON.

Works from the bytes alone (no GPU, no DSL): the schema is the runtime's.
"""

import hashlib

from frost_runtime import plan_sha256, schema
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _arg_text(a, plan) -> str | int | float | list[int]:
    """What a person needs to know of an argument (a tensor map by its content hash: the 128
    bytes themselves are in the plan)."""
    if a.tmap:
        digest = hashlib.sha256(a.tmap).hexdigest()[:16]
        return f"tensor map of slot {a.slot} ({plan.slots[a.slot].name}), sha256 {digest}"
    if a.slot >= 0:
        return f"slot {a.slot} ({plan.slots[a.slot].name})"
    if a.workspace >= 0:
        region = next((r.name for r in plan.workspace if r.offset == a.workspace), "?")
        return f"workspace + {a.workspace} ({region})"
    return list(a.value) if isinstance(a.value, tuple) else a.value


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
        "kernels": [
            {
                "name": k.name,
                "entry": k.entry,
                "cubin_sha256": hashlib.sha256(k.cubin).hexdigest(),
                "cubin_bytes": len(k.cubin),
                "block": list(k.block),
                "cluster": list(k.cluster),
                "smem_bytes": k.smem_bytes,
                "grid_rule": k.grid_rule,
                "tiles": dict(k.tiles),
                "params": [f"{p.name}:{p.kind}" for p in k.params],
                "ctas_per_sm": k.ctas_per_sm,
            }
            for k in plan.kernels
        ],
        "launches": [
            {
                "node": launch.node,
                "kernel": plan.kernels[launch.kernel].name,
                "grid": list(launch.grid),
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
    for i, k in enumerate(s["kernels"]):
        rows = [
            {"field": "entry", "value": k["entry"][:60] + ("…" if len(k["entry"]) > 60 else "")},
            {"field": "block", "value": k["block"]},
            {"field": "cluster", "value": k["cluster"]},
            {"field": "dynamic smem", "value": f"{k['smem_bytes']} B"},
            {"field": "grid rule", "value": k["grid_rule"]},
            {"field": "tiles", "value": _kv(k["tiles"])},
            {"field": "ctas per SM", "value": k["ctas_per_sm"] or "not persistent"},
            {"field": "cubin", "value": f"{k['cubin_bytes']} B, sha256 {k['cubin_sha256'][:16]}…"},
        ]
        console.print(_table(f"Kernel {i}: {escape(k['name'])}", rows, ["field", "value"]))
    for i, launch in enumerate(s["launches"]):
        rows = [{"param": k, "value": v} for k, v in launch["args"].items()]
        title = f"Launch {i} (node {escape(launch['node'])}): {escape(launch['kernel'])}  grid {tuple(launch['grid'])}"
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
