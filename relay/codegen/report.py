"""Reports: the collector every validation rule adds its issues to, and the helpers
the rules share (how a value is spelled in a message, what a path is)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch

from relay.codegen import naming
from relay.errors import SchemaIssue
from relay.schema import Field, Schema, SourceLocation

__all__ = [
    "EXAMPLE",
    "Collector",
    "got",
    "is_int_dtype",
    "unusable_dtype",
    "valid_path",
]


def got(value: object) -> str:
    """``'fp8' that is a str``: the value and its type, as attrs' messages say it."""
    return f"{value!r} that is a {type(value).__name__}"


def is_int_dtype(dtype: object) -> bool:
    return isinstance(dtype, torch.dtype) and not (
        dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
    )


@functools.cache
def unusable_dtype(dtype: torch.dtype) -> str | None:
    """Why torch cannot hold ``dtype`` in a relay buffer (allocate, write rows, read rows)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            buf = torch.zeros((2,), dtype=dtype)
            rows = torch.ones((1,), dtype=torch.int64)
            buf[rows] = rows.to(dtype)
            buf[rows]
    # torch says why (NotImplementedError, RuntimeError, ...): its reason is the message.
    except Exception as error:  # noqa: BLE001
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{type(error).__name__}: {first}"
    return None


def valid_path(path: object) -> bool:
    return isinstance(path, str) and all(
        naming.identifier_problem(part, reserved=False) is None
        for part in path.split(".")
    )


class Collector:
    """The issues of one schema, each at its declaration's line."""

    def __init__(self, schema: Schema, display: Callable[[str], str]) -> None:
        self.schema = schema
        self.display = display
        self.schema_name = (
            schema.name if isinstance(schema.name, str) else repr(schema.name)
        )
        self.issues: list[SchemaIssue] = []

    def where(self, loc: SourceLocation) -> str:
        """``schemas/eagle.py:42``, for messages that point at another declaration."""
        return f"{self.display(loc.file)}:{loc.line}"

    def add(
        self,
        field: Field | None,
        problem: str,
        fix: str,
        at: SourceLocation | None = None,
    ) -> None:
        """An issue of ``field`` (the schema's, ``None``), at ``at`` where a grouped
        declaration inside it is at fault, else at the field's (the schema's) line."""
        if at is None:
            at = field.declared_at if field is not None else self.schema.declared_at
        loc = at
        name = field.name if field is not None and isinstance(field.name, str) else None
        self.issues.append(
            SchemaIssue(
                self.display(loc.file), loc.line, self.schema_name, name, problem, fix
            )
        )


#: Example paths, as the fixes spell them.
EXAMPLE = {
    "indices": "req_pool_indices",
    "owners": "rids",
    "ScheduleSlots(indices=...)": "req_pool_indices",
    "ScheduleSlots(owners=...)": "rids",
    "Members(requests=...)": "reqs",
    "Members(tail=...)": "beam_tail",
    "Scatter(offsets=...)": "query_start_loc",
    "Scatter(lengths=...)": "num_draft_tokens",
    "Scatter(when=...)": "sampled_ready",
    "BatchRows(starts=...)": "query_start_loc",
    "BatchRows(index=...)": "handed_rows",
    "HostCopy(mirror=...)": "seq_lens_cpu",
    "HostCopy(sum=...)": "seq_lens_sum",
    "Tails(rows=...)": "mix_running_indices",
    "Tails(prefix=...)": "prefix_lens",
    "TailsKv(locations=...)": "out_cache_loc",
    "TailsKv(table=...)": "req_to_token",
}
