"""The ``relay`` command: generate, check, demo and bench.

Exit codes: 0 ok, 1 generated files drifted (``--check``), 2 bad usage or
configuration, 3 invalid schema.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from relay import __version__

EXIT_USAGE = 2


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
    )
    from relay.codegen import cli as generate_cli

    generate_cli.add_arguments(gen)

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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``relay`` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "generate":
        from relay.codegen import cli as generate_cli

        return generate_cli.run(args)
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
