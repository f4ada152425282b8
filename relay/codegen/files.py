"""The generated-file format, owned here alone: header, hashes, ours or not, write, check.

A generated module is a four-line header and the body the template rendered
(``MARKER`` is the at-sign and the word generated; it is never spelled whole here)::

    # MARKER by relay from schemas/eagle.py. DO NOT EDIT.
    # Regenerate with: relay generate
    # schema-hash: sha256:<canonical schema>
    # body-hash: sha256:<the text below the header>

The schema hash says which declaration a file was generated from; the body hash
(which covers the generator's identity, Note [Formatter pin]) lets ``--check`` tell a
hand edit (the body no longer matches its own hash) from a file another generator
version wrote (intact, but different). A file whose first
line is not relay's is not ours: relay never writes over it nor deletes it.

Writing is all or nothing: every changed module is staged in a temp file beside its
target first, and only when all are staged are they renamed into place (a failed
rename puts back what the earlier ones replaced). Every failure is a ``WriteError``.
"""

from __future__ import annotations

import difflib
import enum
import errno
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from relay.codegen.formatting import GENERATOR
from relay.errors import RelayError
from relay.schema import FromPayload, Schema

if TYPE_CHECKING:
    from attrs import AttrsInstance

# Spelled in two pieces so that tools which skip generated files (by this marker
# near the top of a file) never take the generator's own source for generated code.
MARKER = "@" + "generated"
_FIRST_LINE = f"# {MARKER} by relay from "
_FIRST_LINE_END = ". DO NOT EDIT."
_COMMAND_LINE = "# Regenerate with: "
_SCHEMA_LINE = "# schema-hash: "
_BODY_LINE = "# body-hash: "
_HEADER_LINES = 4
_HASH = re.compile(r"sha256:[0-9a-f]{64}")


class WriteError(RelayError):
    """A generated file could not be written, or must not be: nothing of the run was written."""


# --- hashes ----------------------------------------------------------------------------------


def _canonical(value: object) -> object:
    """A JSON-ready form of schema values: enums by value, dtypes by name."""
    if isinstance(value, FromPayload):
        return "FROM_PAYLOAD"
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    return str(value)  # torch.dtype


def _options(declaration: AttrsInstance, skip: tuple[str, ...]) -> dict[str, object]:
    """An attrs declaration's values by name (new options are hashed without a change here)."""
    names = sorted(a.name for a in attrs.fields(type(declaration)))
    return {
        name: _canonical(getattr(declaration, name))
        for name in names
        if name not in skip
    }


def schema_hash(schema: Schema) -> str:
    """sha256 of the canonical schema: what it declares, not where or how it is spelled."""
    canonical = _options(schema, ("declared_at", "fields"))
    canonical["fields"] = [_options(f, ("declared_at",)) for f in schema.fields]
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def body_hash(body: str) -> str:
    """sha256 of the generator's identity and a module's text below its header: a
    module another formatter version laid out is stale (Note [Formatter pin])."""
    blob = f"{GENERATOR}\n{body}".encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _intact_hashes(body: str) -> tuple[str, str]:
    """The body hashes under which ``body`` is intact: this generator's, and that of
    relay before the formatter pin (a plain sha256 of the body), so a module it wrote
    reads as another relay version's, never as a hand edit."""
    legacy = "sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest()
    return body_hash(body), legacy


# --- the header ------------------------------------------------------------------------------


@attrs.frozen
class Header:
    """What a generated file's header records."""

    source: str  # the schema module, relative to the project root
    command: str  # the command that regenerates the file
    schema_hash: str
    body_hash: str


def _one_line(what: str, text: str) -> str:
    if not text.isprintable():
        raise RelayError(
            f"{what} {text!r} holds a line break or control character; rename it"
        )
    return text


def compose(body: str, *, source: str, command: str, schema_hash: str) -> str:
    """The whole generated module: relay's header, then ``body`` (LF, one final newline)."""
    body = body.rstrip("\n") + "\n"
    lines = (
        f"{_FIRST_LINE}{_one_line('schema path', source)}{_FIRST_LINE_END}",
        f"{_COMMAND_LINE}{_one_line('command', command)}",
        f"{_SCHEMA_LINE}{schema_hash}",
        f"{_BODY_LINE}{body_hash(body)}",
    )
    return "".join(line + "\n" for line in lines) + body


def is_ours_text(text: str) -> bool:
    """Whether ``text`` starts with relay's first header line."""
    return text.startswith(_FIRST_LINE)


def parse(text: str) -> tuple[Header, str] | None:
    """``(header, body)`` of a file relay generated; None when the header is not relay's
    or is damaged (a file relay wrote whose header was edited counts as damaged)."""
    lines = text.split("\n", _HEADER_LINES)
    if len(lines) <= _HEADER_LINES:
        return None
    first, command, schema, body_line, body = lines
    if not (
        first.startswith(_FIRST_LINE)
        and first.endswith(_FIRST_LINE_END)
        and command.startswith(_COMMAND_LINE)
        and schema.startswith(_SCHEMA_LINE)
        and body_line.startswith(_BODY_LINE)
    ):
        return None
    recorded_schema = schema[len(_SCHEMA_LINE) :]
    recorded_body = body_line[len(_BODY_LINE) :]
    if not (_HASH.fullmatch(recorded_schema) and _HASH.fullmatch(recorded_body)):
        return None
    source = first[len(_FIRST_LINE) : -len(_FIRST_LINE_END)]
    return Header(
        source, command[len(_COMMAND_LINE) :], recorded_schema, recorded_body
    ), body


def _first_line(path: Path) -> str | None:
    """The first line of ``path``; None when it is not a readable text file."""
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            return handle.readline()
    except (OSError, UnicodeDecodeError):
        return None


def is_ours(path: Path) -> bool:
    """Whether ``path`` is a file relay generated (judged by its first line)."""
    first = _first_line(path)
    return first is not None and is_ours_text(first)


def generated_files(folder: Path) -> list[Path]:
    """The modules in ``folder`` that relay generated, sorted."""
    try:
        candidates = sorted(p for p in folder.glob("*.py") if p.is_file())
    except OSError:
        return []
    return [p for p in candidates if is_ours(p)]


def recorded_source(path: Path) -> str | None:
    """The schema path a generated file names in its header."""
    first = _first_line(path)
    if first is None or not is_ours_text(first):
        return None
    return first.rstrip("\n")[len(_FIRST_LINE) :].removesuffix(_FIRST_LINE_END)


# --- planned files ---------------------------------------------------------------------------


@attrs.frozen
class Planned:
    """A module to be generated: where, what, and from which schema."""

    path: Path
    display: str  # the path as messages show it
    content: str
    source: str  # the schema module, as messages show it
    schema_hash: str


def refuse_foreign(planned: Sequence[Planned]) -> None:
    """Raise ``WriteError`` if a planned path holds something relay did not generate."""
    for item in planned:
        path = item.path
        if path.is_dir():
            raise WriteError(
                f"cannot write {item.display}: it is a folder; move it away, or rename "
                f"{item.source}"
            )
        if path.exists() and not is_ours(path):
            raise WriteError(
                f"{item.display} exists and relay did not generate it (no relay header), so "
                "relay will not overwrite it; move it away, or choose another --out"
            )


# --- writing ---------------------------------------------------------------------------------


@attrs.frozen
class WriteResult:
    written: list[Path]
    unchanged: list[Path]
    removed: list[Path]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _reason(error: OSError) -> str:
    if error.errno == errno.ENAMETOOLONG:
        return "the file name is too long for this file system"
    return error.strerror or str(error)


def _write_fd(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


@attrs.frozen
class _Staged:
    item: Planned
    temp: Path
    previous: bytes | None  # what the target held, to put back if a later rename fails


def _stage(item: Planned) -> _Staged | None:
    """Write ``item`` to a temp file beside its target; None when the target is current."""
    data = item.content.encode("utf-8")
    path = item.path
    misplaced = WriteError(
        f"cannot write {item.display}: a file stands where its folder should be; move it "
        "away, or choose another --out"
    )
    try:
        previous: bytes | None = path.read_bytes()
    except FileNotFoundError:
        previous = None
    except NotADirectoryError:
        raise misplaced from None
    except OSError as error:
        raise WriteError(f"cannot write {item.display}: {_reason(error)}") from None
    if previous == data:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise misplaced from None
    except OSError as error:
        raise WriteError(
            f"cannot create the folder of {item.display}: {_reason(error)}"
        ) from None
    try:
        mode = path.stat().st_mode & 0o777  # a rewrite keeps the file's mode
    except FileNotFoundError:
        mode = 0o666 & ~_umask()  # a new file gets the mode any other new file would
    except OSError as error:
        raise WriteError(f"cannot write {item.display}: {_reason(error)}") from None
    # A short, fixed-length temp name: a legal module name plus a suffix could be too long.
    try:
        fd, temp = tempfile.mkstemp(prefix=".relay-", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise WriteError(f"cannot write {item.display}: {_reason(error)}") from None
    try:
        os.fchmod(fd, mode)  # mkstemp creates 0600
        _write_fd(fd, data)
    except OSError as error:
        Path(temp).unlink(missing_ok=True)
        raise WriteError(f"cannot write {item.display}: {_reason(error)}") from None
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return _Staged(item, Path(temp), previous)


def _put_back(done: Iterable[_Staged]) -> None:
    """Best effort: restore what renamed files replaced (a failed run writes nothing)."""
    for staged in done:
        try:
            if staged.previous is None:
                staged.item.path.unlink(missing_ok=True)
            else:
                staged.item.path.write_bytes(staged.previous)
        except OSError:
            pass


def write_all(planned: Sequence[Planned], remove: Sequence[Path] = ()) -> WriteResult:
    """Write every changed module of ``planned``, or none; then delete ``remove``.

    Raises ``WriteError`` (one line, what failed and why) and leaves every file as it
    was when any module cannot be written.
    """
    refuse_foreign(planned)
    staged: list[_Staged] = []
    unchanged: list[Path] = []
    try:
        for item in planned:
            result = _stage(item)
            if result is None:
                unchanged.append(item.path)
            else:
                staged.append(result)
    except BaseException:
        for s in staged:
            s.temp.unlink(missing_ok=True)
        raise
    done: list[_Staged] = []
    for index, s in enumerate(staged):
        try:
            os.replace(s.temp, s.item.path)
        except OSError as error:
            for rest in staged[index:]:
                rest.temp.unlink(missing_ok=True)
            _put_back(done)
            raise WriteError(
                f"cannot write {s.item.display}: {_reason(error)}"
            ) from None
        done.append(s)
    removed = []
    for path in remove:
        if not is_ours(path):  # never delete a file relay did not generate
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as error:
            raise WriteError(f"cannot remove {path}: {_reason(error)}") from None
        removed.append(path)
    return WriteResult([s.item.path for s in staged], unchanged, removed)


# --- checking --------------------------------------------------------------------------------


class DriftKind(enum.Enum):
    MISSING = "missing"
    STALE = "stale"  # the schema changed since the file was generated
    GENERATOR = "generator"  # same schema, another relay version wrote it
    HEADER = "header"  # same schema and body, but it names another source or command
    HAND_EDITED = "hand-edited"
    ORPHANED = "orphaned"


_KIND_TEXT = {
    DriftKind.MISSING: "missing",
    DriftKind.STALE: "stale (its schema changed)",
    DriftKind.GENERATOR: "stale (another relay version generated it)",
    DriftKind.HEADER: "stale (its header names another schema path or command)",
    DriftKind.HAND_EDITED: "hand-edited",
    DriftKind.ORPHANED: "orphaned",
}


@attrs.frozen
class Drift:
    """One generated file that does not match: kind, file, diff and the fix."""

    kind: DriftKind
    path: Path
    display: str
    diff: str
    fix: str

    def __str__(self) -> str:
        return f"{self.display}: {_KIND_TEXT[self.kind]}\n    fix: {self.fix}"

    def as_json(self, *, diff: bool = False) -> dict[str, str]:
        found = {
            "path": self.display,
            "kind": self.kind.value,
            "message": _KIND_TEXT[self.kind],
            "fix": self.fix,
        }
        return {**found, "diff": self.diff} if diff else found


def _diff(old: str, new: str, display: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"{display} (on disk)",
        tofile=f"{display} (generated)",
    )
    return "".join(lines)


def _drift_of(item: Planned, on_disk: str, command: str) -> Drift:
    expected = parse(item.content)
    assert expected is not None, "the generator wrote a header it cannot read back"
    found = parse(on_disk)
    regenerate = f"run `{command}` and commit {item.display}"
    # Our very bytes under another generator's body hash: another formatter version
    # laid it out the same way (Note [Formatter pin]).
    relabelled = (
        found is not None
        and found[1] == expected[1]
        and found[0].schema_hash == item.schema_hash
        and found[0].body_hash != expected[0].body_hash
    )
    if relabelled:
        kind = DriftKind.GENERATOR
        fix = (
            f"the generator changed since {item.display} was generated (a relay upgrade): "
            f"{regenerate}"
        )
    elif found is None or found[0].body_hash not in _intact_hashes(found[1]):
        kind = DriftKind.HAND_EDITED
        fix = (
            f"generated files are never edited by hand: change {item.source}, then run "
            f"`{command}` (it overwrites the edit)"
        )
    elif found[0].schema_hash != item.schema_hash:
        kind = DriftKind.STALE
        fix = f"{item.source} changed since {item.display} was generated: {regenerate}"
    elif found[1] != expected[1]:
        kind = DriftKind.GENERATOR
        fix = (
            f"the generator changed since {item.display} was generated (a relay upgrade): "
            f"{regenerate}"
        )
    else:
        kind = DriftKind.HEADER
        fix = (
            f"{item.display} was generated from {found[0].source!r} with "
            f"`{found[0].command}`, not from {item.source} with `{expected[0].command}`: "
            f"{regenerate}"
        )
    return Drift(
        kind, item.path, item.display, _diff(on_disk, item.content, item.display), fix
    )


def check(
    planned: Sequence[Planned], orphans: Sequence[tuple[Path, str]], command: str
) -> list[Drift]:
    """Every drift between ``planned`` and the disk, then the ``(path, display)`` orphans."""
    drifts = []
    for item in planned:
        try:
            on_disk = item.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            drifts.append(
                Drift(
                    DriftKind.MISSING,
                    item.path,
                    item.display,
                    _diff("", item.content, item.display),
                    f"run `{command}` and commit {item.display}",
                )
            )
            continue
        except (OSError, UnicodeDecodeError) as error:
            raise WriteError(f"cannot read {item.display}: {error}") from None
        if on_disk != item.content:
            drifts.append(_drift_of(item, on_disk, command))
    for path, shown in orphans:
        try:
            on_disk = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            on_disk = ""
        drifts.append(
            Drift(
                DriftKind.ORPHANED,
                path,
                shown,
                _diff(on_disk, "", shown),
                f"no schema generates it any more: delete {shown}, or run "
                "`relay generate --remove-orphans`, or add its schema back",
            )
        )
    return drifts
