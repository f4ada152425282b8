"""The generator's entry points: plan, generate and check, for the CLI and for tests.

Pipeline (as torchgen's): load (``loader``) -> validate (``validate``) -> view and
render (``views``, ``render``) -> write or check (``files``, which alone knows the
generated-file format).
"""

from __future__ import annotations

import keyword
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from relay.codegen import files
from relay.codegen.config import Config, load_config, project_root
from relay.codegen.files import Drift, Planned, WriteResult
from relay.codegen.formatting import FormatError
from relay.codegen.loader import describe, load
from relay.codegen.render import BrokenModule, render
from relay.codegen.validate import validate
from relay.errors import RelayError, SchemaError, SchemaImportError, SchemaIssue
from relay.schema import Schema

__all__ = [
    "GenerateResult",
    "Job",
    "check_job",
    "configured_job",
    "explicit_job",
    "generate_configured",
    "plan",
    "run_job",
]


@attrs.frozen
class Job:
    """What to generate: schema modules, the output folder, and how to name them."""

    schemas: tuple[Path, ...]
    out: Path
    root: Path  # paths in headers and messages are relative to this folder
    command: str  # the command that regenerates the whole job
    configured: bool  # from [tool.relay]: then every other generated file is an orphan
    #: The project's [tool.relay], if it has one: a module it generates records the
    #: plain `relay generate` however it was generated (Note [Stable regenerate command]).
    config: Config | None = None

    def command_for(self, schema: Path) -> str:
        """The command that regenerates one module, written into its header."""
        # Note [Stable regenerate command]: the header must not depend on how this run
        # was invoked, or `relay generate x.py --out maps` and `relay generate` would
        # write two headers for one file and `--check` would call one of them stale.
        # It depends only on where the file is: one [tool.relay] generates says so.
        config = self.config
        if (
            config is not None
            and self.out.resolve() == config.out.resolve()
            and (schema.resolve() in {s.resolve() for s in config.schemas})
        ):
            return "relay generate"
        return f"relay generate {display(schema, self.root)} --out {display(self.out, self.root)}"


@attrs.frozen
class GenerateResult:
    written: list[Path]
    unchanged: list[Path]
    orphans: list[Path]  # generated files no schema of the job produces (kept)
    removed: list[Path]  # orphans deleted (``remove_orphans=True``)


def display(path: Path | str, root: Path) -> str:
    """``path`` relative to ``root`` with forward slashes, whatever the working folder."""
    path = Path(path)
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return Path(os.path.relpath(path.resolve(), root.resolve())).as_posix()


def configured_job(start: Path | None = None) -> Job:
    """The job ``[tool.relay]`` in the nearest pyproject.toml describes."""
    config = load_config(start or Path.cwd())
    if not config.schemas:
        raise RelayError(
            f"{config.root / 'pyproject.toml'}: [tool.relay] schemas matches no file"
        )
    return Job(
        config.schemas,
        config.out,
        config.root,
        "relay generate",
        configured=True,
        config=config,
    )


def explicit_job(schemas: Sequence[Path], out: Path) -> Job:
    """A job for schema modules named on the command line."""
    root = project_root(Path(schemas[0]).resolve())
    try:
        config: Config | None = load_config(root)
    except (
        RelayError
    ):  # no usable [tool.relay]: then every header names its own command
        config = None
    if config is not None and config.root.resolve() != root.resolve():
        config = None
    shown = " ".join(display(Path(s), root) for s in schemas)
    command = f"relay generate {shown} --out {display(out, root)}"
    return Job(
        tuple(Path(s) for s in schemas),
        out,
        root,
        command,
        configured=False,
        config=config,
    )


def _refuse_schema_folder(job: Job) -> None:
    """An output folder that holds schema modules would have them overwritten: refuse it."""
    out = job.out.resolve()
    candidates = [*job.schemas, *(job.config.schemas if job.config is not None else ())]
    for schema in candidates:
        if Path(schema).resolve().parent == out:
            raise RelayError(
                f"the output folder {display(job.out, job.root)} holds schema modules "
                f"({display(schema, job.root)}); generated modules need a folder of their "
                "own: choose another --out (or [tool.relay] out)"
            )


def _file_name_issue(path: Path, source: str) -> SchemaIssue | None:
    """A schema file whose generated module could not be imported or named in a header."""
    if not source.isprintable():
        return SchemaIssue(
            repr(source),
            None,
            None,
            None,
            "the schema path holds a line break or control character",
            "rename the file or folder",
        )
    stem = path.stem
    if not stem.isidentifier() or keyword.iskeyword(stem):
        suggestion = "".join(c if c.isalnum() or c == "_" else "_" for c in stem)
        if not suggestion.isidentifier() or keyword.iskeyword(suggestion):
            suggestion = f"relay_{suggestion}"
        return SchemaIssue(
            source,
            None,
            None,
            None,
            f"its generated module would be {stem}.py, a name Python cannot import",
            f"rename the schema module, e.g. to {suggestion}.py",
        )
    return None


def _broken(
    schema: Schema, error: BrokenModule, shown: str, where: Callable[[str], str]
) -> SchemaIssue:
    """A generated module that would not compile or reads an unbound name: a relay
    bug, located at the schema (Note [Compiled before written] in render.py)."""
    loc = schema.declared_at
    return SchemaIssue(
        where(loc.file),
        loc.line,
        str(schema.name),
        None,
        f"the generated module {shown} would be broken ({error.reason} at its line "
        f"{error.lineno}: {error.line.strip()[:160]!r}); nothing was written",
        "this is a relay bug: please report it with the schema; meanwhile plainer "
        "field names and paths usually avoid it",
    )


def plan(job: Job) -> list[Planned]:
    """Load, validate and render every schema of ``job``; writes nothing.

    Raises ``SchemaError`` with every problem of every schema (those that did not
    load included), or ``RelayError`` when the job itself is unusable.
    """
    _refuse_schema_folder(job)
    planned: list[Planned] = []
    issues: list[SchemaIssue] = []
    only_imports = True
    targets: dict[Path, str] = {}
    for path in job.schemas:
        source = display(path, job.root)
        naming_issue = _file_name_issue(path, source)
        if naming_issue is not None:
            issues.append(naming_issue)
            continue
        try:
            loaded = load(path.resolve(), source, lambda f: display(f, job.root))
        except SchemaImportError as error:
            issues.extend(error.issues)
            continue
        schema = loaded.schema
        only_imports = False
        found = _validated(schema, job)
        out_path = job.out / f"{path.stem}.py"
        if out_path in targets:
            found.append(
                SchemaIssue(
                    source,
                    None,
                    str(schema.name),
                    None,
                    f"generates {out_path.name} like {targets[out_path]}",
                    "rename one of the schema modules",
                )
            )
        targets[out_path] = source
        if found:
            issues.extend(found)
            continue
        shown = display(out_path, job.root)
        try:
            digest = files.schema_hash(schema)
            content = render(
                schema, source=source, command=job.command_for(path), schema_hash=digest
            )
        # The pinned formatter is missing or another version: exit 2 with the fix.
        except (KeyboardInterrupt, FormatError):
            raise
        except BrokenModule as error:
            issues.append(_broken(schema, error, shown, lambda f: display(f, job.root)))
            continue
        except BaseException as error:  # a generator bug: say what was being generated
            loc = schema.declared_at
            raise RelayError(
                f"while generating {shown} from {display(loc.file, job.root)}:{loc.line}: "
                f"{type(error).__name__}: {error}"
            ) from error
        bases = tuple(display(b, job.root) for b in loaded.bases)
        flat = files.flat_schema_hash(schema)
        planned.append(Planned(out_path, shown, content, source, digest, bases, flat))
    if issues:
        raise (SchemaImportError if only_imports else SchemaError)(_unique(issues))
    return planned


def _validated(schema: Schema, job: Job) -> list[SchemaIssue]:
    """``validate``'s issues; a check that a hostile value broke is one located issue."""
    try:
        return validate(schema, lambda file: display(file, job.root))
    except KeyboardInterrupt:
        raise
    # A hostile value (even a SystemExit) broke a check: a located error, exit 3.
    except BaseException as error:  # noqa: BLE001
        loc = schema.declared_at
        return [
            SchemaIssue(
                display(loc.file, job.root),
                loc.line,
                None,
                None,
                f"the schema could not be validated: {describe(error)}",
                "declare the schema with plain values (str, int, enums, torch dtypes)",
            )
        ]


def _unique(issues: list[SchemaIssue]) -> list[SchemaIssue]:
    """``issues`` without repeats: a base module's problem reaches every variant built
    on it, and is said once."""
    seen: set[tuple[object, ...]] = set()
    unique = []
    for issue in issues:
        key = (issue.path, issue.line, issue.field, issue.problem, issue.fix)
        if key not in seen:
            seen.add(key)
            unique.append(issue)
    return unique


def orphans(job: Job, planned: Sequence[Planned]) -> list[Path]:
    """Generated files in the output folder that no schema of ``job`` produces."""
    produced = {item.path.resolve() for item in planned}
    found = []
    for path in files.generated_files(job.out):
        if path.resolve() in produced:
            continue
        # Outside [tool.relay] only files whose schema is gone are orphans: the
        # folder may hold maps of schemas this command did not name.
        source = files.recorded_source(path)
        if job.configured or source is None or not (job.root / source).is_file():
            found.append(path)
    return found


def run_job(job: Job, *, remove_orphans: bool = False) -> GenerateResult:
    """Generate ``job``: every changed module or none, only the changed ones rewritten."""
    planned = plan(job)
    stray = orphans(job, planned)
    result: WriteResult = files.write_all(planned, stray if remove_orphans else ())
    return GenerateResult(
        result.written,
        result.unchanged,
        [p for p in stray if p not in result.removed],
        result.removed,
    )


def check_job(job: Job) -> list[Drift]:
    """Every stale, hand-edited, missing or orphaned file of ``job``; writes nothing."""
    planned = plan(job)
    files.refuse_foreign(planned)
    stray = [(p, display(p, job.root)) for p in orphans(job, planned)]
    return files.check(planned, stray, job.command)


def generate_configured() -> GenerateResult:
    """Regenerate what ``[tool.relay]`` names (the bundled maps in this repository)."""
    return run_job(configured_job())
