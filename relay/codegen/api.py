"""The generator's entry points: plan, generate and check, for the CLI and for tests.

Pipeline (as torchgen's): load (``loader``) -> validate (``validate``) -> view and
render (``views``, ``render``) -> write or check (``writer``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from relay.codegen.config import Config, load_config, project_root
from relay.codegen.loader import load_schema
from relay.codegen.render import render, schema_hash
from relay.codegen.validate import validate
from relay.codegen.writer import Drift, Planned, check, generated_files, write_atomic
from relay.errors import RelayError, SchemaError, SchemaImportError, SchemaIssue
from relay.schema import SourceLocation

__all__ = ["GenerateResult", "Job", "check_job", "configured_job", "explicit_job",
           "generate_configured", "plan", "run_job"]

@attrs.frozen
class Job:
    """What to generate: schema modules, the output folder, and how to name them."""

    schemas: tuple[Path, ...]
    out: Path
    root: Path  # paths in headers and messages are relative to this folder
    command: str  # the command that regenerates the whole job
    configured: bool  # from [tool.relay]: then every other generated file is an orphan

    def command_for(self, source: str) -> str:
        """The command that regenerates one module, written into its header."""
        if self.configured:
            return self.command
        return f"relay generate {source} --out {_display(self.out, self.root)}"


@attrs.frozen
class GenerateResult:
    written: list[Path]
    unchanged: list[Path]


def _display(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` with forward slashes, whatever the working folder."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return Path(os.path.relpath(path.resolve(), root.resolve())).as_posix()


def configured_job(start: Path | None = None) -> Job:
    """The job ``[tool.relay]`` in the nearest pyproject.toml describes."""
    config: Config = load_config(start or Path.cwd())
    if not config.schemas:
        raise RelayError(f"{config.root / 'pyproject.toml'}: [tool.relay] schemas matches no file")
    return Job(config.schemas, config.out, config.root, "relay generate", configured=True)


def explicit_job(schemas: Sequence[Path], out: Path) -> Job:
    """A job for schema modules named on the command line."""
    root = project_root(Path(schemas[0]).resolve())
    shown = " ".join(_display(Path(s), root) for s in schemas)
    command = f"relay generate {shown} --out {_display(out, root)}"
    return Job(tuple(Path(s) for s in schemas), out, root, command, configured=False)


def plan(job: Job) -> list[Planned]:
    """Load, validate and render every schema of ``job``.

    Raises ``SchemaError`` with the issues of all schemas together, or
    ``SchemaImportError`` for modules that failed to import (all of them).
    """
    def where(loc: SourceLocation) -> str:
        return f"{_display(Path(loc.file), job.root)}:{loc.line}"

    planned: list[Planned] = []
    issues: list[SchemaIssue] = []
    import_errors: list[str] = []
    targets: dict[Path, str] = {}
    for path in job.schemas:
        source = _display(path, job.root)
        try:
            schema = load_schema(path.resolve(), source)
        except SchemaImportError as error:
            import_errors.append(str(error))
            continue
        found = validate(schema, where)
        out_path = job.out / f"{path.stem}.py"
        if out_path in targets:
            found.append(SchemaIssue(source, str(schema.name), None,
                                     f"generates {out_path.name} like {targets[out_path]}",
                                     "rename one of the schema modules"))
        targets[out_path] = source
        if found:
            issues.extend(found)
            continue
        try:
            content = render(schema, source=source, command=job.command_for(source))
        except Exception as error:  # a generator bug: say what was being generated
            raise RelayError(
                f"while generating {_display(out_path, job.root)} from "
                f"{where(schema.declared_at)}: {type(error).__name__}: {error}"
            ) from error
        planned.append(Planned(out_path, content, source, schema_hash(schema)))
    if issues:
        raise SchemaError(issues, import_errors)
    if import_errors:
        raise SchemaImportError("\n".join(import_errors))
    return planned


def run_job(job: Job) -> GenerateResult:
    """Generate ``job``, writing only the files whose bytes changed."""
    planned = plan(job)
    written: list[Path] = []
    unchanged: list[Path] = []
    for item in planned:
        (written if write_atomic(item.path, item.content) else unchanged).append(item.path)
    return GenerateResult(written, unchanged)


def check_job(job: Job) -> list[Drift]:
    """Every stale, hand-edited, missing or orphaned file of ``job``; writes nothing."""
    planned = plan(job)
    produced = {item.path.resolve() for item in planned}
    orphans = []
    for path in generated_files(job.out):
        if path.resolve() in produced:
            continue
        # Outside [tool.relay] only files whose schema is gone are orphans: the
        # folder may hold maps of schemas this command did not name.
        if job.configured or not _source_exists(path, job.root):
            orphans.append(path)
    display = {p: _display(p, job.root) for p in [*(i.path for i in planned), *orphans]}
    return check(planned, display, orphans, job.command)


def _source_exists(path: Path, root: Path) -> bool:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    source = first.removeprefix("# @generated by relay from ").removesuffix(". DO NOT EDIT.")
    return (root / source).is_file()


def generate_configured() -> GenerateResult:
    """Regenerate what ``[tool.relay]`` names (the bundled maps in this repository)."""
    return run_job(configured_job())
