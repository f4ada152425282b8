"""``relay generate``: its flags and what it prints; the work is ``relay.codegen.api``'s.

This module imports nothing heavy at the top (no jinja2, no pipeline), so ``relay``
can build its parser cheaply; the pipeline is imported when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from relay.cli.status import Exit
from relay.errors import RelayError, SchemaError

if TYPE_CHECKING:
    from relay.codegen.api import Job

EXIT_OK, EXIT_DRIFT, EXIT_USAGE = Exit.OK, Exit.DRIFT, Exit.USAGE
EXIT_INVALID_SCHEMA = Exit.INVALID_SCHEMA

_GENERATE_HELP = """\
Generate one typed FutureMap module per schema module.

With no SCHEMA, generate what [tool.relay] in the nearest pyproject.toml names
(in the relay repository: relay/schemas/*.py into relay/maps/). Output is the same
bytes on every machine; only files whose content changed are written, and a run
writes all of its modules or none (each staged in a temp file, then renamed).
relay never writes over a file it did not generate.

exit status:
  0  ok
  1  drift found by --check or --diff
  2  usage, configuration or write error (one line on stderr)
  3  invalid schema, or a schema module that cannot be imported (every problem
     listed as path:line: error: Schema.field: message, then its fix)"""


def add_arguments(gen: argparse.ArgumentParser) -> None:
    """The flags of ``relay generate``."""
    gen.description = _GENERATE_HELP
    gen.formatter_class = argparse.RawDescriptionHelpFormatter
    gen.add_argument(
        "schemas",
        nargs="*",
        type=Path,
        metavar="SCHEMA",
        help="schema modules (.py files defining SCHEMA = Schema(...))",
    )
    gen.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="output folder (default: [tool.relay] out)",
    )
    gen.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and list each generated file that is stale, "
        "hand-edited, missing or orphaned, with the fix",
    )
    gen.add_argument(
        "--diff",
        action="store_true",
        help="as --check, and print a unified diff of each drifted file on stdout",
    )
    gen.add_argument(
        "--remove-orphans",
        action="store_true",
        help="delete generated modules no schema produces any more (relay's own "
        "files only)",
    )
    gen.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="json: one JSON object on stdout (files, drift kinds, problems with "
        "path and line; each file's diff with --diff), for CI annotations",
    )
    gen.add_argument("-q", "--quiet", action="store_true", help="print only problems")


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _job(args: argparse.Namespace) -> Job:
    from relay.codegen.api import configured_job, explicit_job

    if args.schemas:
        out = args.out if args.out is not None else configured_job().out
        return explicit_job(args.schemas, out)
    job = configured_job()
    if args.out is not None:
        return explicit_job(list(job.schemas), args.out)
    return job


class _Printer:
    """Text for people, or one JSON object for CI (``--format json``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.json = args.format == "json"
        self.quiet = args.quiet or self.json
        self.report: dict[str, object] = {
            "version": 1,
            "mode": "check" if args.check or args.diff else "generate",
        }

    def info(self, line: str) -> None:
        if not self.quiet:
            print(line, flush=True)

    def problem(self, line: str) -> None:
        if not self.json:
            print(line, file=sys.stderr, flush=True)

    def done(self, code: int, status: str, **fields: object) -> int:
        if self.json:
            self.report.update(status=status, exit_code=code, **fields)
            print(json.dumps(self.report, indent=2))
        return code


def run(args: argparse.Namespace) -> int:
    """Run ``relay generate`` with parsed ``args``; returns the exit status."""
    out = _Printer(args)
    checking = args.check or args.diff
    try:
        if checking and args.remove_orphans:
            raise RelayError(
                "--remove-orphans deletes files, and --check/--diff write "
                "nothing: use one or the other"
            )
        job = _job(args)
        if checking:
            from relay.codegen.api import check_job

            drifts = check_job(job)
            if not drifts:
                out.info(f"relay: {len(job.schemas)} generated module(s) up to date")
                return out.done(EXIT_OK, "ok", files=[])
            if args.diff and not out.json:
                for drift in drifts:
                    sys.stdout.write(drift.diff)
                sys.stdout.flush()
            out.problem(f"relay: {len(drifts)} generated file(s) out of date:")
            for drift in drifts:
                out.problem(f"  {drift}")
            return out.done(
                EXIT_DRIFT, "drift", files=[d.as_json(diff=args.diff) for d in drifts]
            )

        from relay.codegen.api import display, run_job

        start = time.perf_counter()
        result = run_job(job, remove_orphans=args.remove_orphans)
        for path in result.written:
            out.info(f"wrote {_shown(path)}")
        for path in result.removed:
            out.info(f"removed {_shown(path)}")
        for path in result.orphans:
            out.problem(
                f"relay: warning: {_shown(path)} is orphaned: no schema generates it "
                "any more; delete it, or run `relay generate --remove-orphans`"
            )
        removed = f", {len(result.removed)} removed" if result.removed else ""
        out.info(
            f"relay: {len(result.written)} written, {len(result.unchanged)} unchanged"
            f"{removed} ({time.perf_counter() - start:.2f}s)"
        )

        def shown(paths: list[Path]) -> list[str]:
            return [display(p, job.root) for p in paths]

        return out.done(
            EXIT_OK,
            "ok",
            written=shown(result.written),
            unchanged=shown(result.unchanged),
            orphans=shown(result.orphans),
            removed=shown(result.removed),
        )
    except SchemaError as error:
        for issue in error.issues:
            out.problem(str(issue))
        out.problem(f"relay: {error.summary} (nothing was written)")
        return out.done(
            EXIT_INVALID_SCHEMA,
            "invalid-schema",
            problems=[issue.as_json() for issue in error.issues],
        )
    except RelayError as error:
        message = " ".join(str(error).split("\n"))
        print(f"relay: error: {message}", file=sys.stderr, flush=True)
        return out.done(EXIT_USAGE, "error", error=message)
