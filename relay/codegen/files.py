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
rename puts back what the earlier ones replaced), with SIGINT and SIGTERM held
meanwhile (Note [Interrupted writes]). Every failure is a ``WriteError``.
"""

from __future__ import annotations

import difflib
import enum
import errno
import hashlib
import json
import os
import re
import secrets
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, cast, final

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
    if attrs.has(type(value)):  # a grouped declaration: what it declares, by name
        group = cast("AttrsInstance", value)
        return {"": type(value).__name__, **_options(group, ("declared_at",))}
    return str(value)  # torch.dtype


def _options(declaration: AttrsInstance, skip: tuple[str, ...]) -> dict[str, object]:
    """An attrs declaration's values by name, those left at their default omitted: a
    relay upgrade that adds an option (at a default that keeps today's meaning) leaves
    every schema's hash as it was, so ``--check`` calls it a generator change, not a
    schema change. New options are hashed without a change here."""
    found = {}
    for a in sorted(attrs.fields(type(declaration)), key=lambda a: a.name):
        value = getattr(declaration, a.name)
        if a.name in skip or (a.default is not attrs.NOTHING and value == a.default):
            continue
        found[a.name] = _canonical(value)
    return found


def schema_hash(schema: Schema) -> str:
    """sha256 of the canonical schema: what it declares, not where or how it is spelled."""
    canonical = _options(schema, ("declared_at", "fields"))
    canonical["fields"] = [_options(f, ("declared_at",)) for f in schema.fields]
    return _digest(canonical)


def _digest(canonical: dict[str, object]) -> str:
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


# Note [Hashes of an earlier vocabulary]
# A relay upgrade that spells options another way (the grouped declarations of
# relay/schema.py replaced flat ``host_mirror=``, ``tails_kv=``, ...) changes every
# hash without any schema changing. ``flat_schema_hash`` is the hash the flat
# vocabulary gave the same declarations; ``--check`` compares a module's recorded
# hash with it too and then says that relay's vocabulary changed, not the schema.

#: Each group's options as the flat vocabulary spelled them, with their defaults.
_FLAT = {
    "resolve": (
        ("offsets", "offsets", None),
        ("lengths", "lengths", None),
        ("after", "after", None),
    ),
    "host": (
        ("mirror", "host_mirror", None),
        ("sum", "host_sum", None),
        ("stream_ordered", "stream_ordered", False),
    ),
    "tails": (
        ("rows", "tails", None),
        ("add", "tails_add", 1),
        ("prefix", "tails_prefix", None),
    ),
    "schedule": (
        ("indices", "schedule_indices", None),
        ("owners", "schedule_owners", None),
    ),
}


def flat_schema_hash(schema: Schema) -> str:
    """The hash the flat vocabulary gave ``schema``'s declarations (Note [Hashes of an
    earlier vocabulary])."""
    canonical = _flat(_options(schema, ("declared_at", "fields")))
    canonical["fields"] = [_flat(_options(f, ("declared_at",))) for f in schema.fields]
    return _digest(canonical)


def _flat(options: dict[str, object]) -> dict[str, object]:
    found = dict(options)
    for group, names in _FLAT.items():
        value = found.get(group)
        if not isinstance(value, dict):
            continue
        del found[group]
        if value.get("") == "Scatter":
            found["resolve"] = "scatter"
        kv = value.get("kv")
        if isinstance(kv, dict):
            found["tails_kv"], found["tails_kv_table"] = (
                kv.get("locations"),
                kv.get("table"),
            )
        for name, flat, default in names:
            if value.get(name, default) != default:
                found[flat] = value[name]
    return found


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
    #: Schema modules ``source`` builds on (``Schema.load``), as messages show them.
    bases: tuple[str, ...] = ()
    #: The hash relay's earlier, flat vocabulary gave the schema (Note [Hashes of an
    #: earlier vocabulary]).
    flat_hash: str = ""


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
    with os.fdopen(fd, "wb") as handle:  # closes ``fd`` however this ends
        handle.write(data)


def _fill(fd: int, data: bytes, mode: int) -> None:
    """Give the new temp file ``fd`` its mode (it was created 0600) and its bytes."""
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    _write_fd(fd, data)


def _discard(paths: Iterable[Path]) -> None:
    """Delete every path, even when one deletion fails; then raise the first failure."""
    failure: BaseException | None = None
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except BaseException as error:  # noqa: BLE001  (the others still go)
            failure = failure or error
    if failure is not None:
        raise failure


# Note [Interrupted writes]
# A run stopped at any point (Ctrl-C, SIGTERM from CI or an editor, an error) leaves
# no temp file and every target either as it was or, once all are renamed, as
# generated: never a mix. Temp files are staged first, beside their targets; the
# targets are then replaced in one short phase. While files are written, SIGINT and
# SIGTERM are held (handlers can only be installed on the main thread, so a run on
# another thread relies on the cleanup alone): one that arrives while staging stops
# the run at the next file, after its temps are deleted; one that arrives while
# renaming waits until every rename is done. The held signal is then delivered
# through the handler it would have met (KeyboardInterrupt for SIGINT; SIGTERM's
# default ends the process), so relay still stops as asked. Any exception raised
# inside the phases (a full disk, or an interrupt no handler could hold) deletes
# the temps and puts back what earlier renames replaced.

_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Interrupted(Exception):
    """A held signal stopped the staging phase (delivered when the signals are restored)."""


@final
class _HeldSignals:
    """SIGINT and SIGTERM recorded instead of handled, on the main thread, while active."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self._saved: dict[int, signal.Handlers | Callable[..., object] | int] = {}

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)

    def __enter__(self) -> _HeldSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in _HELD_SIGNALS:
            previous = signal.getsignal(signum)
            # None: installed outside Python, so it could not be restored. An ignored
            # signal stays ignored.
            if previous is None or previous == signal.SIG_IGN:
                continue
            signal.signal(signum, self._hold)
            self._saved[signum] = previous
        return self

    def checkpoint(self) -> None:
        """Raise ``_Interrupted`` if a signal arrived: the caller cleans up and stops."""
        if self.pending:
            raise _Interrupted

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        for signum, previous in self._saved.items():
            signal.signal(signum, previous)
        if self.pending:
            # Delivered through the restored handler: KeyboardInterrupt, or the end of
            # the process for SIGTERM's default. A handler that returns lets this go on.
            signal.raise_signal(self.pending[0])
        if isinstance(error, _Interrupted):
            name = signal.Signals(self.pending[0]).name
            raise WriteError(
                f"interrupted by {name} before any generated file was replaced; nothing "
                "was written"
            ) from None


@attrs.frozen
class _Staged:
    item: Planned
    temp: Path
    previous: bytes | None  # what the target held, to put back if a later rename fails


def _stage(item: Planned, made: list[Path]) -> _Staged | None:
    """Write ``item`` to a temp file beside its target (listed in ``made``); None when the
    target is current."""
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
    try:
        fd, temp = _open_temp(path.parent, made)
        _fill(fd, data, mode)
    except OSError as error:
        raise WriteError(f"cannot write {item.display}: {_reason(error)}") from None
    return _Staged(item, temp, previous)


#: Temp files are named ``.relay-<random>.tmp`` beside their target: short and fixed in
#: length, since a legal module name plus a suffix could be too long for the file system.
_TEMP_PREFIX = ".relay-"


def _open_temp(folder: Path, made: list[Path]) -> tuple[int, Path]:
    """Create a new temp file in ``folder``, open for writing, mode 0600.

    Its path joins ``made`` before it is created, so a cleanup finds it however the
    creation ends (``tempfile.mkstemp`` names its file only once it has returned).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        temp = folder / f"{_TEMP_PREFIX}{secrets.token_hex(6)}.tmp"
        made.append(temp)
        try:
            return os.open(temp, flags, 0o600), temp
        except FileExistsError:
            made.pop()
    raise FileExistsError(errno.EEXIST, f"no free temp file name in {folder}")


def _put_back(done: Iterable[_Staged], made: list[Path]) -> None:
    """Best effort: restore what renamed files replaced (a failed run writes nothing).

    Each target gets its old bytes back through a temp file and a rename, so a target
    is never left half written; where no temp file can be made, it is rewritten in place.
    """
    for staged in done:
        path = staged.item.path
        try:
            if staged.previous is None:
                path.unlink(missing_ok=True)
                continue
            fd, temp = _open_temp(path.parent, made)
            _fill(fd, staged.previous, path.stat().st_mode & 0o777)
            os.replace(temp, path)
        except OSError:
            try:
                path.write_bytes(staged.previous or b"")
            except OSError:
                pass


def _commit(staged: Sequence[_Staged], made: list[Path]) -> None:
    """Rename every temp onto its target; on any failure put every target back."""
    done: list[_Staged] = []
    try:
        for s in staged:
            os.replace(s.temp, s.item.path)
            done.append(s)
    except BaseException as error:
        # A rename that happened before the failure surfaced has no temp any more.
        done += [s for s in staged[len(done) :] if not s.temp.exists()]
        _put_back(done, made)
        if isinstance(error, OSError):
            failed = staged[min(len(done), len(staged) - 1)]
            raise WriteError(
                f"cannot write {failed.item.display}: {_reason(error)}"
            ) from None
        raise


def _remove(remove: Sequence[Path]) -> list[Path]:
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
    return removed


def write_all(planned: Sequence[Planned], remove: Sequence[Path] = ()) -> WriteResult:
    """Write every changed module of ``planned``, or none; then delete ``remove``.

    Raises ``WriteError`` (one line, what failed and why) and leaves every file as it
    was when any module cannot be written. Interrupted, it leaves no temp file and
    every target as it was, or all of them written (Note [Interrupted writes]).
    """
    refuse_foreign(planned)
    staged: list[_Staged] = []
    unchanged: list[Path] = []
    made: list[Path] = []  # every temp file this run created (renamed ones are gone)
    with _HeldSignals() as held:
        try:
            for item in planned:
                held.checkpoint()
                result = _stage(item, made)
                if result is None:
                    unchanged.append(item.path)
                else:
                    staged.append(result)
            held.checkpoint()
            _commit(staged, made)
        finally:
            _discard(made)
        removed = _remove(remove)
    return WriteResult([s.item.path for s in staged], unchanged, removed)


# --- checking --------------------------------------------------------------------------------


class DriftKind(enum.Enum):
    MISSING = "missing"
    STALE = "stale"  # the schema changed since the file was generated
    VOCABULARY = "vocabulary"  # same declarations, spelled in relay's new vocabulary
    GENERATOR = "generator"  # same schema, another relay version wrote it
    HEADER = "header"  # same schema and body, but it names another source or command
    HAND_EDITED = "hand-edited"
    ORPHANED = "orphaned"


_KIND_TEXT = {
    DriftKind.MISSING: "missing",
    DriftKind.STALE: "stale (its schema changed)",
    DriftKind.VOCABULARY: "stale (relay's vocabulary changed; its schema did not)",
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
    elif item.schema_hash != found[0].schema_hash == item.flat_hash:
        kind = DriftKind.VOCABULARY
        fix = (
            f"relay now spells {item.source}'s declarations another way (a relay "
            f"upgrade); the schema itself is as it was: {regenerate}"
        )
    elif found[0].schema_hash != item.schema_hash:
        kind = DriftKind.STALE
        changed = item.source
        # The hash covers the fields a base lends (Note [Schema composition]).
        if item.bases:
            changed += f" (or {', '.join(item.bases)}, which it builds on)"
        fix = f"{changed} changed since {item.display} was generated: {regenerate}"
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
