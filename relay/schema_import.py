"""Importing schema modules by path and taking their ``SCHEMA``: a leaf below both
``relay/schema.py`` (``Schema.load``) and the generator's loader.

However a schema module's import ends (an exception, ``SystemExit``, a module-level
``__getattr__`` that raises), the result is a located ``SchemaImportError``; only
``KeyboardInterrupt`` passes through, since the user asked to stop.

A schema module may build on another with ``Schema.load`` (Note [Schema composition]
in ``relay/schema.py``): the base is imported here too, by path, relative to the
module that asks; a cycle or a missing file is a located error at the ``load`` line,
and a broken base is reported at its own lines.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import importlib.util
import io
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import attrs

from relay.errors import CompositionError, SchemaError, SchemaImportError, SchemaIssue

T = TypeVar("T")


def _module_name(path: Path) -> str:
    # Unique per file, stable per path: two schema folders may hold the same stem.
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return f"_relay_schema_{digest}"


def _fail(display: str, line: int | None, problem: str, fix: str) -> SchemaImportError:
    return SchemaImportError([SchemaIssue(display, line, None, None, problem, fix)])


@attrs.define
class Session:
    """One top-level load: how paths are shown, and the modules being imported now."""

    show: Callable[[Path], str]
    importing: list[Path] = attrs.Factory(list)  # outermost first: a cycle is refused
    bases: list[Path] = attrs.Factory(list)


_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "relay_schema_load", default=None
)


def shown_from_cwd(path: Path) -> str:
    """``path`` relative to the working folder when inside it, with forward slashes."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def session(show: Callable[[Path], str]) -> contextlib.AbstractContextManager[Session]:
    """One top-level load: ``Schema.load`` calls made while it runs join it."""
    return _session(Session(show))


@contextlib.contextmanager
def _session(current: Session) -> Iterator[Session]:
    token = _SESSION.set(current)
    try:
        yield current
    finally:
        _SESSION.reset(token)


def import_schema(path: Path, display: str, kind: type[T], current: Session) -> T:
    """The ``SCHEMA`` of the module at ``path``, refused unless it is a ``kind``."""
    return _declared(_import(path, display, current), display, kind)


def load_base(path: Path, file: str, line: int, kind: type[T]) -> T:
    """``Schema.load``: the ``SCHEMA`` of the module at ``path``, relative to ``file``
    (the caller's, at ``line``). Outside a load (``python schemas/eagle_dsa.py``) it
    starts its own."""
    session = _SESSION.get()
    if session is None:
        resolved = _resolve_base(path, file, line, shown_from_cwd)
        with _session(Session(shown_from_cwd)) as current:
            return import_schema(resolved, shown_from_cwd(resolved), kind, current)
    resolved = _resolve_base(path, file, line, session.show)
    if resolved in session.importing:
        chain = [*session.importing[session.importing.index(resolved) :], resolved]
        raise CompositionError(
            file,
            line,
            f"Schema.load({path.as_posix()!r}) makes a cycle: "
            + " -> ".join(session.show(p) for p in chain),
            "let both modules build on a third one that holds the fields they share",
        )
    if resolved not in session.bases:
        session.bases.append(resolved)
    return import_schema(resolved, session.show(resolved), kind, session)


def _resolve_base(
    path: Path, file: str, line: int, show: Callable[[Path], str]
) -> Path:
    given = path.as_posix()
    if not path.is_absolute():
        if file.startswith("<"):
            raise CompositionError(
                file,
                line,
                f"Schema.load({given!r}) is relative to the calling module's "
                f"folder, but it was called from {file}, which has none",
                "call it from a schema module file, or pass an absolute path",
            )
        path = Path(os.path.abspath(file)).parent / path
    resolved = path.resolve()
    if not resolved.is_file():
        raise CompositionError(
            file,
            line,
            f"Schema.load({given!r}): no such schema module {show(resolved)}",
            "the path is relative to the folder of the module that calls Schema.load; "
            "check its spelling",
        )
    return resolved


def _import(path: Path, display: str, session: Session) -> object:
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
    session.importing.append(path.resolve())
    rerun = f"run `python {display}` to see the full traceback, and mend the module"
    try:
        # What a schema module prints goes to stderr: stdout carries diffs and JSON.
        with contextlib.redirect_stdout(sys.stderr):
            spec.loader.exec_module(module)
            schema = getattr(module, "SCHEMA", None)
    except KeyboardInterrupt:
        raise
    except CompositionError as error:  # Schema.load or derive refused its arguments
        raise SchemaImportError(
            [
                SchemaIssue(
                    session.show(Path(error.file)),
                    error.line,
                    None,
                    None,
                    error.problem,
                    error.fix,
                )
            ]
        ) from None
    except SchemaError as error:  # a base module (Schema.load) did not load
        bases = sorted({issue.path for issue in error.issues})
        raise SchemaImportError(
            [
                *error.issues,
                SchemaIssue(
                    display,
                    _line_in(path, error),
                    None,
                    None,
                    f"builds on {', '.join(bases)}, which cannot be loaded",
                    f"mend {', '.join(bases)} (its problems are listed with it)",
                ),
            ]
        ) from None
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
            _respelled(error) or rerun,
        ) from None
    finally:
        sys.modules.pop(name, None)
        session.importing.pop()
    return schema


def _declared(schema: object, display: str, kind: type[T]) -> T:
    """The module's ``SCHEMA``, refused unless it is a ``kind``."""
    if not isinstance(schema, kind):
        shown = type(schema).__name__
        got = (
            "nothing"
            if schema is None
            else f"{'an' if shown[0] in 'aeiouAEIOU' else 'a'} {shown}"
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


#: Options that only mean something together and are declared as one value now
#: (relay/schema.py), by the name they were once passed flat under: a schema module
#: that still passes one is told how to spell it.
_REGROUPED = {
    "offsets": "resolve=Scatter(offsets=...)",
    "lengths": "resolve=Scatter(offsets=..., lengths=...)",
    "after": "resolve=Scatter(offsets=..., after=...)",
    "host_mirror": "host=HostCopy(mirror=...)",
    "host_sum": "host=HostCopy(sum=...)",
    "stream_ordered": "host=HostCopy(..., stream_ordered=True)",
    "tails_kv": "tails=Tails(rows=..., kv=TailsKv(locations=..., table=...))",
    "tails_kv_table": "tails=Tails(rows=..., kv=TailsKv(locations=..., table=...))",
    "tails_add": "tails=Tails(rows=..., add=...)",
    "tails_prefix": "tails=Tails(rows=..., prefix=...)",
    "schedule_indices": "schedule=ScheduleSlots(indices=...)",
    "schedule_owners": "schedule=ScheduleSlots(owners=...)",
    "SCATTER": "resolve=Scatter(offsets=...)",
}


_KEYWORD = re.compile(r"unexpected keyword argument '(\w+)'")


def _respelled(error: BaseException) -> str | None:
    """The fix for an option relay now declares as part of a group (``host_mirror=``
    is ``host=HostCopy(mirror=...)``), where that is what failed; ``None`` otherwise."""
    found = _KEYWORD.search(str(error)) if isinstance(error, TypeError) else None
    if found is not None and found.group(1) in _REGROUPED:
        old = found.group(1)
        return f"{old}=... is declared as {_REGROUPED[old]} (see docs/schema.md)"
    if isinstance(error, AttributeError) and str(error) == "SCATTER":
        return f"Resolve.SCATTER is declared as {_REGROUPED['SCATTER']} (see docs/schema.md)"
    return None
