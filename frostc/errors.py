"""Errors frostc reports to its users."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from frost_runtime.schema import PlanFormatError


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


# What bad input (a file, a description, a plan) can raise besides FrostcError: a corrupt or
# foreign plan, file-system errors, text that is not UTF-8, nesting deeper than Python recurses.
# The command-line tools report these as one message and exit 2; anything else is a frostc bug.
INPUT_ERRORS = (FrostcError, PlanFormatError, OSError, UnicodeError, RecursionError, MemoryError)


def input_error_message(exc: BaseException) -> str:
    """One line (or a DescriptionError's list) for an error of INPUT_ERRORS."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    if isinstance(exc, RecursionError):
        return "the input is nested too deeply to read"
    if isinstance(exc, MemoryError):
        return "out of memory reading the input (is it a plan or a description?)"
    return str(exc) or type(exc).__name__


def internal_error_message(exc: BaseException) -> str:
    return (
        f"internal error: {type(exc).__name__}: {exc}\nThis is a frostc bug: please report it with the command "
        "and its input files (FROSTC_TRACEBACK=1 shows the traceback)."
    )
