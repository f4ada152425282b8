"""The exceptions relay raises, in one place.

``RelayError`` is the root. Schema problems carry every issue found, each naming
the file and line of the declaration, the schema, the field, what was expected,
what was given and the fix, in the format editors and CI annotate::

    schemas/eagle.py:42: error: EagleFutureMap.topk_p: dtype must be ... (got 'fp8' that is a str)
        fix: write dtype=torch.<name>, e.g. dtype=torch.int64
"""

from __future__ import annotations

import attrs

__all__ = [
    "CompositionError",
    "RelayDebugError",
    "RelayError",
    "SchemaError",
    "SchemaImportError",
    "SchemaIssue",
    "SlotError",
]


class RelayError(Exception):
    """Root of every error relay raises on purpose."""


@attrs.frozen
class SchemaIssue:
    """One problem in one schema module or declaration."""

    path: str  # "schemas/eagle.py", relative to the project root
    line: int | None  # of the declaration; None when the file itself is the problem
    schema: str | None  # None when the module could not be loaded
    field: str | None
    problem: str  # what was expected and what was given
    fix: str

    @property
    def where(self) -> str:
        """``schemas/eagle.py:42``."""
        return self.path if self.line is None else f"{self.path}:{self.line}"

    def __str__(self) -> str:
        subject = f"{self.schema}.{self.field}" if self.field else self.schema
        lead = f"{subject}: " if subject else ""
        # A name may hold a control character (the problem reported): never print it raw.
        return _printable(f"{self.where}: error: {lead}{self.problem}") + (
            f"\n    fix: {_printable(self.fix)}"
        )

    def as_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "line": self.line,
            "schema": self.schema,
            "field": self.field,
            "message": self.problem,
            "fix": self.fix,
        }


def _printable(text: str) -> str:
    """``text`` with each unprintable character escaped as ``repr`` spells it (one line)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


class SchemaError(RelayError):
    """Schemas are invalid or could not be loaded; ``issues`` lists every problem found."""

    def __init__(self, issues: list[SchemaIssue]) -> None:
        self.issues = issues
        files = len({issue.path for issue in issues})
        self.summary = (
            f"invalid schema: {_count(len(issues), 'problem')} in "
            f"{_count(files, 'schema module')}"
        )
        super().__init__("\n".join([*(str(i) for i in issues), self.summary]))


class SchemaImportError(SchemaError):
    """A schema module could not be imported or holds no ``SCHEMA``."""


class CompositionError(RelayError, ValueError):
    """``Schema.load`` or ``Schema.derive`` cannot build what a schema module asks for.

    Raised while the schema module runs, at the line of the call; ``relay generate``
    reports it as a located problem (exit 3) with ``fix``.
    """

    def __init__(self, file: str, line: int, problem: str, fix: str) -> None:
        self.file = file
        self.line = line
        self.problem = problem
        self.fix = fix
        super().__init__(f"{file}:{line}: {problem}; fix: {fix}")


class SlotError(RelayError, IndexError):
    """A slot outside the map's pool, refused before anything was written."""


class RelayDebugError(RelayError):
    """A debug-mode check found a relay used out of order."""
