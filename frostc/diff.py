"""`frostc diff A B`: a semantic diff of two plans, field by field, from their canonical summaries
(`frostc.inspect.plan_summary`): header and versions, slots and their order, nodes (what each
computes: op, form, mask, sizes, its roles' slots), kernels (variant, entry, each cubin's hash,
geometry, parameter ABI), launches (grid, every argument) and the workspace.

Either side may be a plan file or the canonical JSON that `frostc inspect --json` writes (told
apart by content: a plan is a msgpack map, never `{`), so a fresh build can be compared with a
committed rendering. Header differences are listed first and separately: a different build key
alone (the compiler's sources changed) means something else than a different launch grid.
Works from the bytes alone; no GPU.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from frost_runtime import schema
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from frostc.errors import FrostcError
from frostc.inspect import plan_summary

SECTIONS = ("header", "slots", "kernels", "launches", "workspace_bytes")


class PlanInputError(FrostcError):
    """A side of the diff is missing, unreadable, corrupt or not a plan summary."""


_ABSENT = object()


@dataclass(frozen=True)
class Difference:
    path: str  # e.g. "launches[0].grid", "header.build_key"
    a: object  # _ABSENT where only B has the field
    b: object  # _ABSENT where only A has the field

    @property
    def change(self) -> str:
        return "added" if self.a is _ABSENT else "removed" if self.b is _ABSENT else "changed"

    @property
    def in_header(self) -> bool:
        return self.path.startswith("header.")

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "change": self.change,
            "a": None if self.a is _ABSENT else self.a,
            "b": None if self.b is _ABSENT else self.b,
        }


def load_summary(path: str | Path) -> dict:
    """A plan file or a `frostc inspect --json` rendering, as the canonical summary (JSON types)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PlanInputError(f"{path}: no such file") from None
    except OSError as exc:
        raise PlanInputError(f"{path}: cannot read ({exc.strerror})") from None
    if data.lstrip()[:1] == b"{":
        try:
            summary = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PlanInputError(f"{path}: not valid JSON ({exc})") from None
        except RecursionError:
            raise PlanInputError(f"{path}: JSON nested too deeply to be a `frostc inspect --json` rendering") from None
        missing = [s for s in SECTIONS if s not in summary]
        if missing:
            raise PlanInputError(f"{path}: not a `frostc inspect --json` rendering (no {', '.join(missing)})")
        return summary
    try:
        plan = schema.decode_plan(data)
    except schema.PlanFormatError as exc:
        raise PlanInputError(f"{path}: {exc}") from None
    # through JSON, so both kinds of input compare with the same types (lists, not tuples)
    return json.loads(json.dumps(plan_summary(plan)))


def diff_summaries(a: dict, b: dict, ignore: tuple[str, ...] = ()) -> list[Difference]:
    """Every difference between two summaries, header ones first; paths in `ignore` are skipped."""
    found: list[Difference] = []
    _walk(a, b, "", found)
    found = [d for d in found if d.path not in ignore]
    return [d for d in found if d.in_header] + [d for d in found if not d.in_header]


def diff_files(a: str | Path, b: str | Path, ignore: tuple[str, ...] = ()) -> list[Difference]:
    return diff_summaries(load_summary(a), load_summary(b), ignore)


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return type(x) is type(y) and x == y


def _is_leaf(x) -> bool:
    # a list of plain values (dims, strides, grid, the parameter ABI) reads best as one value
    if isinstance(x, list):
        return all(not isinstance(v, (list, dict)) for v in x)
    return not isinstance(x, dict)


def _walk(a, b, path: str, out: list[Difference]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in b:
                out.append(Difference(sub, a[key], _ABSENT))
            elif key not in a:
                out.append(Difference(sub, _ABSENT, b[key]))
            else:
                _walk(a[key], b[key], sub, out)
    elif isinstance(a, list) and isinstance(b, list) and not (_is_leaf(a) and _is_leaf(b)):
        for i in range(max(len(a), len(b))):
            sub = f"{path}[{i}]"
            if i >= len(b):
                out.append(Difference(sub, a[i], _ABSENT))
            elif i >= len(a):
                out.append(Difference(sub, _ABSENT, b[i]))
            else:
                _walk(a[i], b[i], sub, out)
    elif not _same(a, b):
        out.append(Difference(path, a, b))


def diff_report(diffs: list[Difference], a: str, b: str) -> dict:
    """The machine-readable form (`frostc diff --json`)."""
    return {
        "a": a,
        "b": b,
        "equal": not diffs,
        "header": [d.to_json() for d in diffs if d.in_header],
        "body": [d.to_json() for d in diffs if not d.in_header],
    }


def print_diff(diffs: list[Difference], console: Console, a: str = "A", b: str = "B") -> None:
    if not diffs:
        console.print(f"{escape(a)} and {escape(b)} are the same plan", highlight=False)
        return
    header = [d for d in diffs if d.in_header]
    body = [d for d in diffs if not d.in_header]
    for title, rows in (("Header differences", header), ("Plan differences", body)):
        if rows:
            table = Table(title=f"{title} ({len(rows)})", title_justify="left")
            table.add_column("field", overflow="fold", min_width=min(40, max(len(d.path) for d in rows)))
            table.add_column(escape(a), overflow="fold")
            table.add_column(escape(b), overflow="fold")
            for d in rows:
                table.add_row(escape(d.path), _cell(d.a), _cell(d.b))
            console.print(table)


def _cell(value) -> str:
    if value is _ABSENT:
        return "—"
    if isinstance(value, (list, dict)):
        text = json.dumps(value)
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = str(value)
    return escape(text if len(text) <= 200 else text[:199] + "…")  # plan contents are data, not markup


# ------------------------------------------------------------------------------- plan sets


@dataclass(frozen=True)
class SetDiff:
    header: list[Difference]  # the sets' headers (name, model, versions, target, hashes)
    added: list[str]  # keys only B has
    removed: list[str]  # keys only A has
    plans: dict[str, list[Difference]]  # key -> the plan differences of a key both have (only those that differ)

    def __bool__(self) -> bool:
        return bool(self.header or self.added or self.removed or self.plans)


def is_set_file(path: str | Path) -> bool:
    """Whether the file starts as a plan set does (unreadable files are left to the readers)."""
    from frost_runtime import planset

    try:
        with open(path, "rb") as f:
            return planset.is_set(f.read(32))
    except OSError:
        return False


def load_set(path: str | Path):
    from frost_runtime import planset

    path = Path(path)
    try:
        return planset.read_set(path.read_bytes())
    except FileNotFoundError:
        raise PlanInputError(f"{path}: no such file") from None
    except OSError as exc:
        raise PlanInputError(f"{path}: cannot read ({exc.strerror})") from None
    except schema.PlanFormatError as exc:
        raise PlanInputError(f"{path}: {exc}") from None


def diff_sets(a: str | Path, b: str | Path) -> SetDiff:
    """Two plan sets: header differences, keys added and removed, and each common key's plan diff."""
    from frostc.inspect import set_summary

    for one, other in ((a, b), (b, a)):
        if not is_set_file(one) and is_set_file(other):
            raise PlanInputError(f"{one} is not a plan set but {other} is: compare a plan set with a plan set")
    sa, sb = load_set(a), load_set(b)
    header: list[Difference] = []
    _walk(set_summary(sa)["set"], set_summary(sb)["set"], "header", header)
    plans = {}
    for key in sa.keys:
        if key in sb.keys:
            found = diff_summaries(*(json.loads(json.dumps(plan_summary(s.plan_data(key)))) for s in (sa, sb)))
            if found:
                plans[key] = found
    return SetDiff(
        header,
        [k for k in sb.keys if k not in sa.keys],
        [k for k in sa.keys if k not in sb.keys],
        plans,
    )


def set_diff_report(d: SetDiff, a: str, b: str) -> dict:
    return {
        "a": a,
        "b": b,
        "equal": not d,
        "header": [x.to_json() for x in d.header],
        "added": d.added,
        "removed": d.removed,
        "plans": {key: diff_report(found, a, b) | {"a": key, "b": key} for key, found in d.plans.items()},
    }


def print_set_diff(d: SetDiff, console: Console, a: str = "A", b: str = "B") -> None:
    if not d:
        console.print(f"{escape(a)} and {escape(b)} are the same plan set", highlight=False)
        return
    if d.header:
        print_diff(d.header, console, a, b)
    for verb, keys in (("only in " + b, d.added), ("only in " + a, d.removed)):
        if keys:
            console.print(f"{len(keys)} plans {escape(verb)}: {escape(', '.join(keys))}", highlight=False)
    for key, found in d.plans.items():
        console.print(f"[bold]{escape(key)}[/bold]: {len(found)} differences")
        print_diff(found, console, a, b)
