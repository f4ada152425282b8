"""The ``relay`` command: generate, check, demo and bench.

Exit codes: 0 ok, 1 generated files drifted (``--check``), 2 bad usage or
configuration, 3 invalid schema.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from relay import __version__
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


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relay",
        description="Declare overlap-scheduling relay fields once as attrs schemas and "
        "generate typed FutureMap classes (device buffers, fences, resolve logic).",
    )
    parser.add_argument("--version", action="version", version=f"relay {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser(
        "generate",
        help="generate FutureMap modules from schemas (or check them with --check)",
        description=_GENERATE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument("schemas", nargs="*", type=Path, metavar="SCHEMA",
                     help="schema modules (.py files defining SCHEMA = Schema(...))")
    gen.add_argument("--out", type=Path, metavar="DIR",
                     help="output folder (default: [tool.relay] out)")
    gen.add_argument("--check", action="store_true",
                     help="write nothing; exit 1 with a diff if a generated file is stale, "
                     "hand-edited, missing or orphaned")
    gen.add_argument("-q", "--quiet", action="store_true", help="print only problems")

    demo = sub.add_parser(
        "demo",
        help="generate the bundled maps and run the reference overlap engine",
        description="Generate the bundled maps, import them and run the reference engine "
        "synchronously and with overlap scheduling, for plain and speculative decoding; "
        "print throughput, speedup, forward occupancy, acceptance length and whether the "
        "outputs are identical.",
    )
    bench = sub.add_parser(
        "bench",
        help="benchmark generated maps against a hand-written baseline",
        description="Time the generated maps' operations against a hand-written "
        "FutureMap baseline, side by side in one run, and report ratios.",
    )
    try:
        from relay.engine import demo as demo_module

        demo_module.add_arguments(demo)
    except ImportError:  # pragma: no cover - engine not installed
        pass
    try:
        from relay.bench import main as bench_module

        bench_module.add_arguments(bench)
    except ImportError:  # pragma: no cover
        pass
    return parser


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _generate(args: argparse.Namespace) -> int:
    from codegen import check_job, configured_job, explicit_job, run_job

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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``relay`` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "generate":
        return _generate(args)
    if args.command == "demo":
        from relay.engine import demo as demo_module

        return demo_module.run(args)
    if args.command == "bench":
        from relay.bench import main as bench_module

        return bench_module.run(args)
    parser.print_help()
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
