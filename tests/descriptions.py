"""Helpers for tests that edit a description (as plain data) and read what validation says."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from frostc.description import parse_description
from frostc.errors import DescriptionError, Problem
from frostc.graph import Graph
from frostc.validate import validate


def edited(d: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of `d` with dotted-path changes, e.g. edited(d, **{"tensors.k.dims": [...]}) or
    "nodes.0.causal"; None deletes."""
    d = copy.deepcopy(d)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        table: Any = d
        for part in parents:
            table = table[int(part)] if isinstance(table, list) else table[part]
        if value is None:
            del table[last]
        else:
            table[last] = value
    return d


def check(d: dict[str, Any]) -> Graph:
    return validate(parse_description(json.dumps(d), fmt="json"))


def problems(d: dict[str, Any]) -> list[Problem]:
    with pytest.raises(DescriptionError) as e:
        check(d)
    return e.value.problems


def only(d: dict[str, Any], path: str, *words: str) -> Problem:
    """Asserts `d` has exactly one problem, at `path`, mentioning every one of `words`."""
    found = problems(d)
    assert [p.path for p in found] == [path], found
    for word in words:
        assert word in found[0].message, found[0]
    return found[0]
