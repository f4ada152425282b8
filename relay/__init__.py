"""relay: declare overlap-scheduling relay fields once, generate typed FutureMaps.

Schema authors import the vocabulary from here (or ``relay.schema``); engines
import the generated maps (``relay.maps.<schema>`` or their own ``--out`` folder).
"""

from relay.errors import (
    RelayDebugError,
    RelayError,
    SchemaError,
    SchemaImportError,
    SchemaIssue,
)
from relay.schema import (
    FROM_PAYLOAD,
    Alloc,
    Dim,
    Field,
    FromPayload,
    Guard,
    Lane,
    Resolve,
    Schema,
    SourceLocation,
)

__version__ = "0.1.0"

__all__ = [
    "FROM_PAYLOAD",
    "Alloc",
    "Dim",
    "Field",
    "FromPayload",
    "Guard",
    "Lane",
    "RelayDebugError",
    "RelayError",
    "Resolve",
    "Schema",
    "SchemaError",
    "SchemaImportError",
    "SchemaIssue",
    "SourceLocation",
    "__version__",
]
