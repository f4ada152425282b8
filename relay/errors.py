"""The exceptions relay raises, in one place.

``RelayError`` is the root. Schema problems carry every issue found, each naming
the file and line of the declaration, the schema, the field, what was expected,
what was given and the fix.
"""

from __future__ import annotations

import attrs

__all__ = [
    "RelayDebugError",
    "RelayError",
    "SchemaError",
    "SchemaImportError",
    "SchemaIssue",
]


class RelayError(Exception):
    """Root of every error relay raises on purpose."""


@attrs.frozen
class SchemaIssue:
    """One problem in one declaration."""

    where: str  # "schemas/eagle.py:42"
    schema: str
    field: str | None
    problem: str  # what was expected and what was given
    fix: str

    def __str__(self) -> str:
        subject = f"{self.schema}.{self.field}" if self.field else self.schema
        return f"{self.where}: {subject}: {self.problem}\n    fix: {self.fix}"


class SchemaError(RelayError):
    """A schema is invalid; ``issues`` lists every problem found.

    ``import_failures`` holds the messages of schema modules of the same run that
    failed to import, so one run reports everything.
    """

    def __init__(self, issues: list[SchemaIssue], import_failures: list[str] | None = None) -> None:
        self.issues = issues
        self.import_failures = import_failures or []
        lines = [*self.import_failures, *(str(i) for i in issues)]
        count = f"{len(lines)} problem" + ("s" if len(lines) != 1 else "")
        super().__init__(f"invalid schema ({count}):\n" + "\n".join(lines))


class SchemaImportError(RelayError):
    """A schema module could not be imported or holds no ``SCHEMA``."""


class RelayDebugError(RelayError):
    """A debug-mode check found a relay used out of order."""
