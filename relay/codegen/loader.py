"""Loading: import schema modules by path and take their ``SCHEMA``.

However a schema module's import ends (an exception, ``SystemExit``, a module-level
``__getattr__`` that raises), the result is a located ``SchemaImportError``; only
``KeyboardInterrupt`` passes through, since the user asked to stop.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import re
import sys
import traceback
from pathlib import Path

from relay.errors import SchemaImportError, SchemaIssue
from relay.schema import Schema


def _module_name(path: Path) -> str:
    # Unique per file, stable per path: two schema folders may hold the same stem.
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return f"_relay_schema_{digest}"


def _fail(display: str, line: int | None, problem: str, fix: str) -> SchemaImportError:
    return SchemaImportError([SchemaIssue(display, line, None, None, problem, fix)])


def load_schema(path: Path, display: str) -> Schema:
    """Import the schema module at ``path`` and return its ``SCHEMA``.

    Raises ``SchemaImportError`` naming ``display`` (and the failing line of the
    module, when the error was raised there) with the module's own error, briefly.
    """
    if not path.is_file():
        raise _fail(
            display,
            None,
            "no such schema module",
            "check the path, or the 'schemas' list under [tool.relay] in pyproject.toml",
        )
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _fail(
            display,
            None,
            "cannot be imported as a Python module",
            "give the schema module a .py name",
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    rerun = f"run `python {display}` to see the full traceback, and mend the module"
    try:
        # What a schema module prints goes to stderr: stdout carries diffs and JSON.
        with contextlib.redirect_stdout(sys.stderr):
            spec.loader.exec_module(module)
            schema = getattr(module, "SCHEMA", None)
    except KeyboardInterrupt:
        raise
    except SystemExit as error:
        raise _fail(
            display,
            _line_in(path, error),
            f"the schema module ended the process while importing "
            f"(SystemExit({error.code!r}))",
            "a schema module must only declare SCHEMA: remove the exit",
        ) from None
    # Any way an import can end is a located error (KeyboardInterrupt aside, above).
    except BaseException as error:  # noqa: BLE001
        raise _fail(
            display,
            _line_in(path, error),
            f"the schema module failed to import: {describe(error)}",
            rerun,
        ) from None
    finally:
        sys.modules.pop(name, None)
    if not isinstance(schema, Schema):
        kind = type(schema).__name__
        got = (
            "nothing"
            if schema is None
            else f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind}"
        )
        raise _fail(
            display,
            1,
            f"a schema module must define SCHEMA = Schema(...) (got {got})",
            "assign the schema declaration to a module-level name SCHEMA",
        )
    return schema


_HINT = re.compile(r"\. Did you mean: .+\?$")


def describe(error: BaseException) -> str:
    """``TypeName: message`` on one line, with Python's own hint (``Did you mean: 'X'?``)."""
    if isinstance(error, SyntaxError):
        text = f"{type(error).__name__}: {error.msg}"
    else:
        lines = traceback.format_exception_only(type(error), error)
        text = " ".join(part.strip() for part in lines if part.strip())
    if sys.version_info < (3, 12) and "Did you mean" not in text:
        # Before 3.12 only the interpreter's own display computes the hint.
        hint = _HINT.search(_interpreter_display(error))
        if hint is not None:
            text += hint.group(0)
    return text


def _interpreter_display(error: BaseException) -> str:
    """The last line the interpreter would print for ``error``."""
    saved = sys.stderr
    sys.stderr = captured = io.StringIO()
    try:
        sys.__excepthook__(type(error), error, error.__traceback__)
    except Exception:  # noqa: BLE001  (never let the hint hide the error)
        return ""
    finally:
        sys.stderr = saved
    lines = captured.getvalue().rstrip("\n").splitlines()
    return lines[-1] if lines else ""


def _line_in(path: Path, error: BaseException) -> int | None:
    """The innermost line of ``path`` in the error's traceback (or a SyntaxError's line)."""
    resolved = str(path.resolve())
    if (
        isinstance(error, SyntaxError)
        and error.filename is not None
        and error.lineno is not None
        and str(Path(error.filename).resolve()) == resolved
    ):
        return error.lineno
    line = None
    for frame in traceback.extract_tb(error.__traceback__):
        if str(Path(frame.filename).resolve()) == resolved:
            line = frame.lineno
    return line
