"""``relay generate``: its flags and what it prints; the work is ``relay.codegen.api``'s."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from relay.errors import RelayError, SchemaError, SchemaImportError

EXIT_OK = 0
EXIT_DRIFT = 1
EXIT_USAGE = 2
EXIT_INVALID_SCHEMA = 3

_GENERATE_HELP = """\
Generate one typed FutureMap module per schema module.

With no SCHEMA, generate what [tool.relay] in the nearest pyproject.toml names
(in the relay repository: schemas/*.py into relay/maps/). Output is the same
bytes on every machine; only files whose content changed are written, each
through a temp file and an atomic rename.

exit status: 0 ok, 1 drift found by --check, 2 usage or configuration error,
3 invalid schema (every problem is listed)."""


def add_arguments(gen: argparse.ArgumentParser) -> None:
    """The flags of ``relay generate``."""
    gen.description = _GENERATE_HELP
    gen.formatter_class = argparse.RawDescriptionHelpFormatter
    gen.add_argument("schemas", nargs="*", type=Path, metavar="SCHEMA",
                     help="schema modules (.py files defining SCHEMA = Schema(...))")
    gen.add_argument("--out", type=Path, metavar="DIR",
                     help="output folder (default: [tool.relay] out)")
    gen.add_argument("--check", action="store_true",
                     help="write nothing; exit 1 with a diff if a generated file is stale, "
                     "hand-edited, missing or orphaned")
    gen.add_argument("-q", "--quiet", action="store_true", help="print only problems")


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def run(args: argparse.Namespace) -> int:
    """Run ``relay generate`` with parsed ``args``; returns the exit status."""
    from relay.codegen.api import check_job, configured_job, explicit_job, run_job

    def say(line: str) -> None:
        if not args.quiet:
            print(line, flush=True)

    try:
        if args.schemas:
            out = args.out
            if out is None:
                out = configured_job().out
            job = explicit_job(args.schemas, out)
        else:
            job = configured_job()
            if args.out is not None:
                job = explicit_job(list(job.schemas), args.out)
        if args.check:
            drifts = check_job(job)
            if not drifts:
                say(f"relay: {len(job.schemas)} generated module(s) up to date")
                return EXIT_OK
            for drift in drifts:
                if drift.diff:
                    sys.stdout.write(drift.diff)
            print(f"relay: {len(drifts)} generated file(s) out of date:", file=sys.stderr)
            for drift in drifts:
                print(f"  {drift}", file=sys.stderr)
            return EXIT_DRIFT
        start = time.perf_counter()
        result = run_job(job)
        for path in result.written:
            say(f"wrote {_shown(path)}")
        say(f"relay: {len(result.written)} written, {len(result.unchanged)} unchanged "
            f"({time.perf_counter() - start:.2f}s)")
        return EXIT_OK
    except SchemaError as error:
        print(f"relay: {error}", file=sys.stderr)
        return EXIT_INVALID_SCHEMA
    except SchemaImportError as error:
        print(f"relay: {error}", file=sys.stderr)
        return EXIT_INVALID_SCHEMA
    except RelayError as error:
        print(f"relay: {error}", file=sys.stderr)
        return EXIT_USAGE
