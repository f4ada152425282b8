"""The ``relay`` command: generate, check, demo and bench.

Each command's flags live in its own command module (``relay.codegen.cli``,
``relay.cli.demo``, ``relay.bench.main``), imported only when that command runs: no
torch for ``--help``, ``--version``, nor a bad demo or bench flag (``relay bench`` checks
its flags before it imports torch). Exit statuses: ``Exit``. The libraries under the
commands (``relay.codegen``, ``relay.engine``, ``relay.bench``) import nothing from here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from relay import __version__
from relay.cli.status import Exit

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["Exit", "main", "rich_console"]

_EPILOG = """\
exit status: 0 ok; 1 generated files drifted (generate --check) or a result is
wrong (demo: overlap outputs differ; bench: the sides' values differ); 2 bad usage,
configuration or device; 3 invalid schema (generate); 130 Ctrl-C; 143 SIGTERM (demo).

`relay COMMAND --help` lists a command's flags."""

#: Each command's one-line help.
_COMMANDS = {
    "generate": "generate FutureMap modules from schemas (or check them with --check)",
    "demo": "generate the bundled maps privately and run the reference overlap engine",
    "bench": "benchmark generated maps against a hand-written baseline",
}


def _add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """``command``'s flags, from the module that runs it (imported only now)."""
    if command == "generate":
        from relay.codegen import cli as generate_cli

        generate_cli.add_arguments(parser)
    elif command == "demo":
        from relay.cli import demo

        demo.add_arguments(parser)
    elif command == "bench":
        from relay.bench import main as bench

        bench.add_arguments(parser)


def _missing_extra(args: argparse.Namespace) -> list[str]:
    """The modules of the ``generate`` extra this command needs that are not installed.
    The runtime an engine ships needs none of them. Generating (``relay generate``,
    ``relay demo`` unless ``--no-generate``) needs jinja2 and ruff (``ruff`` may instead
    be a binary named by ``RELAY_RUFF``); the demo and the bench print through rich."""
    generates = args.command == "generate" or (
        args.command == "demo" and not getattr(args, "no_generate", False)
    )
    names = ["rich"] if args.command in ("demo", "bench") else []
    if generates:
        names.append("jinja2")
        if not os.environ.get("RELAY_RUFF"):
            names.append("ruff")
        if sys.version_info < (3, 11):
            names.append("tomli")
    return [name for name in names if importlib.util.find_spec(name) is None]


def _run(args: argparse.Namespace) -> int:
    missing = _missing_extra(args)
    if missing:
        print(
            f"relay {args.command}: needs the generate extra ({', '.join(missing)} "
            "missing): run `pip install 'relay-futuremap[generate]'` "
            "(in a checkout: `pip install -e '.[generate]'`)",
            file=sys.stderr,
        )
        return Exit.USAGE
    if args.command == "generate":
        from relay.codegen import cli as generate_cli

        return generate_cli.run(args)
    if args.command == "demo":
        from relay.cli import demo

        return demo.run(args)
    from relay.bench import main as bench

    return bench.run(args)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error, as every other refusal of relay's."""

    #: The command parsers by name (on the ``relay`` parser only).
    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        hint = f"`{self.prog} --help` lists the flags"
        self.exit(Exit.USAGE, f"{self.prog}: error: {message} ({hint})\n")


def _build_parser(command: str | None) -> _Parser:
    """The parser; only ``command``'s flags are built (every command's without torch,
    so that a bad flag is refused at once)."""
    parser = _Parser(
        prog="relay",
        description="Declare overlap-scheduling relay fields once as attrs schemas and "
        "generate typed FutureMap classes (device buffers, fences, resolve logic).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"relay {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = {}
    for name, help_line in _COMMANDS.items():
        child = sub.add_parser(
            name, help=help_line, description=help_line[0].upper() + help_line[1:] + "."
        )
        parser.commands[name] = child
        if name == command:
            _add_arguments(name, child)
    return parser


def _command_named(argv: Sequence[str]) -> str | None:
    """The command in ``argv``: the first word that is not an option (relay's own
    options take no value)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in _COMMANDS else None
    return None


def rich_console() -> Console:
    """The console ``relay demo`` and ``relay bench`` print through (rich is imported
    only by them): colours and live progress on a terminal; off a terminal plain text,
    wide enough that tables do not fold; a closed pipe raises ``BrokenPipeError`` for
    ``main`` to end quietly, the same as a plain ``print``."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError  # rich would exit 1 itself

    console = _Console()
    if console.is_terminal:
        return console
    return _Console(width=160, no_color=True, highlight=False)


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread like Ctrl-C's ``KeyboardInterrupt``, so that
    ``with`` blocks (the demo's temporary folder, the engine's worker) clean up."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``relay`` console script and ``python -m relay``."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    command = _command_named(args_in)
    # The demo's temporary folders go on SIGTERM as on Ctrl-C: only there (generate
    # handles signals itself), from the main thread, over the default action.
    catch = command == "demo" and threading.current_thread() is threading.main_thread()
    catch = catch and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if catch:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        parser = _build_parser(command)
        args, unknown = parser.parse_known_args(args_in)
        if unknown:
            # A command's stray flag: point at that command's help, not relay's.
            owner = parser.commands.get(args.command or "", parser)
            owner.error(f"unrecognized arguments: {' '.join(unknown)}")
        if args.command is None:
            parser.print_help()
            return Exit.USAGE
        return _run(args)
    except BrokenPipeError:
        # Output piped into `head` and the like: the reader left, which is not an
        # error. Point stdout at /dev/null so the interpreter's final flush is quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return Exit.BROKEN_PIPE
    except KeyboardInterrupt:
        print("relay: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except _Terminated:
        print("relay: terminated", file=sys.stderr)
        return Exit.TERMINATED
    finally:
        if catch:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
