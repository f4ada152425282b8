"""relay: declare overlap-scheduling relay fields once, generate typed FutureMaps.

Schema authors import the vocabulary from here (or ``relay.schema``); engines
import the generated maps (``relay.maps.<schema>`` or their own ``--out`` folder).

The names below are loaded on first use (Note [Lazy package attributes]).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Note [Lazy package attributes]
# ``relay.schema`` imports torch, which takes seconds to import. The ``relay``
# command imports this package first, and ``relay --help``, ``relay --version``
# and ``relay generate --help`` need no torch; so the vocabulary is imported when
# a name is first read (PEP 562 module ``__getattr__``), not with the package.
# ``from relay import Field`` and mypy see no difference.

if TYPE_CHECKING:
    from relay.errors import (
        CompositionError,
        RelayDebugError,
        RelayError,
        SchemaError,
        SchemaImportError,
        SchemaIssue,
    )
    from relay.schema import (
        FROM_PAYLOAD,
        Alloc,
        BatchRows,
        Carried,
        Dim,
        Field,
        FromPayload,
        Guard,
        HostCopy,
        IfNone,
        Lane,
        Layout,
        Members,
        Resolve,
        Scatter,
        ScheduleSlots,
        Schema,
        SourceLocation,
        Staged,
        Switch,
        Tails,
        TailsKv,
        TargetShape,
        Unwritten,
        extra,
    )

__version__ = "0.1.0"

#: Where each public name lives.
_HOMES = {
    "FROM_PAYLOAD": "relay.schema",
    "Alloc": "relay.schema",
    "BatchRows": "relay.schema",
    "Dim": "relay.schema",
    "Field": "relay.schema",
    "FromPayload": "relay.schema",
    "Guard": "relay.schema",
    "HostCopy": "relay.schema",
    "IfNone": "relay.schema",
    "Lane": "relay.schema",
    "Layout": "relay.schema",
    "Members": "relay.schema",
    "Resolve": "relay.schema",
    "Carried": "relay.schema",
    "Scatter": "relay.schema",
    "ScheduleSlots": "relay.schema",
    "Schema": "relay.schema",
    "Tails": "relay.schema",
    "TailsKv": "relay.schema",
    "TargetShape": "relay.schema",
    "extra": "relay.schema",
    "Unwritten": "relay.schema",
    "SourceLocation": "relay.schema",
    "Staged": "relay.schema",
    "Switch": "relay.schema",
    "CompositionError": "relay.errors",
    "RelayDebugError": "relay.errors",
    "RelayError": "relay.errors",
    "SchemaError": "relay.errors",
    "SchemaImportError": "relay.errors",
    "SchemaIssue": "relay.errors",
}

__all__ = [
    "FROM_PAYLOAD",
    "Alloc",
    "BatchRows",
    "Carried",
    "CompositionError",
    "Dim",
    "Field",
    "FromPayload",
    "Guard",
    "HostCopy",
    "IfNone",
    "Lane",
    "Layout",
    "Members",
    "RelayDebugError",
    "RelayError",
    "Resolve",
    "Scatter",
    "ScheduleSlots",
    "Schema",
    "SchemaError",
    "SchemaImportError",
    "SchemaIssue",
    "SourceLocation",
    "Staged",
    "Switch",
    "Tails",
    "TailsKv",
    "TargetShape",
    "Unwritten",
    "__version__",
    "extra",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'relay' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
