"""Errors frostc reports to its users."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a description, located by its field path in the user's file."""

    path: str  # e.g. "tensors.k.dims[3]" or "nodes[0].causal"
    message: str  # what is wrong and what would be valid

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class FrostcError(Exception):
    """Base class of every error frostc raises on purpose."""


class DescriptionError(FrostcError):
    """A description that cannot be used; carries every problem found, not only the first."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        # Keep the order problems were found in, but report each only once: the same tensor
        # can be checked through several roles and would repeat itself otherwise.
        self.problems: list[Problem] = list(dict.fromkeys(problems))
        super().__init__("\n".join(str(p) for p in self.problems))

    def __reduce__(self) -> tuple[type[DescriptionError], tuple[list[Problem]]]:
        # Exception pickling replays args (the rendered text); rebuild from the problems instead.
        return (type(self), (self.problems,))
