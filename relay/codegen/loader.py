"""Loading: import schema modules by path and take their ``SCHEMA``."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from pathlib import Path

from relay.errors import SchemaImportError
from relay.schema import Schema


def _module_name(path: Path) -> str:
    # Unique per file, stable per path: two schema folders may hold the same stem.
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return f"_relay_schema_{path.stem}_{digest}"


def load_schema(path: Path, display: str) -> Schema:
    """Import the schema module at ``path`` and return its ``SCHEMA``.

    Raises ``SchemaImportError`` naming ``display`` (and the failing line of the
    module, when the error was raised there) with the module's own error, briefly.
    """
    if not path.is_file():
        raise SchemaImportError(
            f"{display}: no such schema module\n    fix: check the path, or the "
            "'schemas' list under [tool.relay] in pyproject.toml"
        )
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SchemaImportError(f"{display}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        line = _line_in(path, error)
        where = f"{display}:{line}" if line else display
        raise SchemaImportError(
            f"{where}: the schema module failed to import: {type(error).__name__}: {error}\n"
            "    fix: run `python " + display + "` to see the full traceback, and mend the module"
        ) from None
    finally:
        sys.modules.pop(name, None)
    schema = getattr(module, "SCHEMA", None)
    if not isinstance(schema, Schema):
        kind = type(schema).__name__
        got = "nothing" if schema is None else f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind}"
        raise SchemaImportError(
            f"{display}: a schema module must define SCHEMA = Schema(...) (got {got})\n"
            "    fix: assign the schema declaration to a module-level name SCHEMA"
        )
    return schema


def _line_in(path: Path, error: BaseException) -> int | None:
    """The innermost line of ``path`` in the error's traceback (or a SyntaxError's line)."""
    if isinstance(error, SyntaxError) and error.lineno is not None:
        return error.lineno
    line = None
    resolved = str(path.resolve())
    for frame in traceback.extract_tb(error.__traceback__):
        if str(Path(frame.filename).resolve()) == resolved:
            line = frame.lineno
    return line
