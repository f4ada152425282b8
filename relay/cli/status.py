"""Exit statuses of every ``relay`` command, defined once (README "Commands").

Imported by the command modules (``relay.cli``, ``relay.cli.demo``,
``relay.codegen.cli``, ``relay.bench.main``); it imports nothing but ``enum``, so
``relay --help`` stays torch-free and fast.
"""

from __future__ import annotations

import enum

__all__ = ["Exit"]


class Exit(enum.IntEnum):
    """What a ``relay`` command's exit status means; the same number for every command."""

    OK = 0
    #: ``demo``: overlap outputs differ from the synchronous run's; ``bench``: the
    #: sides' values differ.
    FAILED = 1
    #: ``generate --check``: a generated file is missing, stale, hand-edited or orphaned.
    DRIFT = 1
    #: Bad usage or configuration, or an unusable device: one line on stderr, no traceback.
    USAGE = 2
    #: ``generate``: an invalid schema, or a schema module that cannot be imported;
    #: ``demo``: a bundled schema is invalid.
    INVALID_SCHEMA = 3
    #: Ctrl-C: 128 + SIGINT, as a shell reports it.
    INTERRUPTED = 130
    #: SIGTERM: 128 + SIGTERM, after the same cleanup as Ctrl-C.
    TERMINATED = 143
    #: The reader of our output went away (``relay demo | head``): 128 + SIGPIPE, as a
    #: shell reports a command killed by the signal; nothing is printed.
    BROKEN_PIPE = 141
