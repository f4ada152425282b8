"""Loading: the generator's entry to schema modules (``relay/schema_import.py`` imports
them by path, for ``Schema.load`` too).

However a schema module's import ends (an exception, ``SystemExit``, a module-level
``__getattr__`` that raises), the result is a located ``SchemaImportError``; only
``KeyboardInterrupt`` passes through, since the user asked to stop.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs

from relay import schema_import
from relay.schema import Schema
from relay.schema_import import describe

__all__ = ["Loaded", "describe", "load", "load_schema"]


@attrs.frozen
class Loaded:
    """A loaded schema and the schema modules it builds on (``Schema.load``), in load order."""

    schema: Schema
    bases: tuple[Path, ...]


def load(path: Path, display: str, show: Callable[[Path], str] | None = None) -> Loaded:
    """Import the schema module at ``path``: its ``SCHEMA`` and the modules it builds on.

    ``display`` names ``path`` in messages; ``show`` names any other file (a base
    module). Raises ``SchemaImportError`` naming the file and, when the error was
    raised there, the failing line, with the module's own error, briefly.
    """
    with schema_import.session(show or schema_import.shown_from_cwd) as current:
        schema = schema_import.import_schema(path, display, Schema, current)
        return Loaded(schema, tuple(current.bases))


def load_schema(path: Path, display: str) -> Schema:
    """Import the schema module at ``path`` and return its ``SCHEMA`` (see ``load``)."""
    return load(path, display).schema
