"""Every message debug mode reports, in one table.

docs/debugging.md quotes each text verbatim with its likely causes, and
tests/runtime/test_debug_messages.py raises each one; a test keeps the three equal.
The fields in braces are filled by ``text``: ``owner`` is the map's class name, ``op``
the map method, ``field`` one field, ``fields`` the fields one call reports, ``stream``
and ``writer_stream`` the streams' names, ``writer_op`` the method that wrote.

Texts ending in ``_summary`` are what a device-side assert carries off the CPU, where
reading the failing element back would cost a host sync: they name every field of the
call, not the slot. The others are raised on the CPU and name the slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import torch

from relay.debug.owners import MemberRows, Owners

__all__ = ["MESSAGES", "request_at", "text"]

_SLOTS_ARE = (
    "(slots are request-pool indices of this map, which has {pool} rows; a negative "
    "slot would wrap around)"
)
_SCRATCH = "(row 0 is the scratch row: placeholder 0 would read as token 0)"

MESSAGES: Final[Mapping[str, str]] = MappingProxyType(
    {
        # -- slots, before anything is written ----------------------------------------
        "indices_dtype": (
            "{owner}.{op}: indices must be integer slots, got a {dtype} tensor; pass "
            "request-pool slots as int64 or int32"
        ),
        "slot_outside": (
            "{owner}.{op}: slots must be in [0, {pool}); slot {slot} at position "
            "{position} is not " + _SLOTS_ARE
        ),
        "slot_outside_no_scratch": (
            "{owner}.{op}: slots must be in [1, {pool}) "
            + _SCRATCH
            + "; slot {slot} at "
            "position {position} is not " + _SLOTS_ARE
        ),
        "slot_twice": (
            "{owner}.{op}: slot {slot} appears twice in one batch; each request holds one "
            "slot, so a repeat means two requests share it (a stash would keep one value, "
            "a resolve would consume one value twice)"
        ),
        "slots_summary": (
            "{owner}.{op}: slots must be in [0, {pool}), and no slot may appear twice in "
            "one batch, row 0 excepted (padding)"
        ),
        "slots_no_scratch_summary": (
            "{owner}.{op}: slots must be in [1, {pool}) "
            + _SCRATCH
            + ", and no slot may "
            "appear twice in one batch"
        ),
        # -- reads: freshness and order -------------------------------------------------
        "never_written": (
            "{owner}.{field}: slot {slot}: {op} reads a row that was never written: no "
            "stash or publish wrote this slot before the read"
        ),
        "consumed": (
            "{owner}.{field}: slot {slot}: {op} reads a row that was not written since it "
            "was last consumed (a stash or publish is missing, or the slot is read twice)"
        ),
        "omitted": (
            "{owner}.{field}: slot {slot}: {op} reads the optional field, but the latest "
            "stash of this slot left it out ({field}=None), so there is no value to hand "
            "over"
        ),
        "released": (
            "{owner}.{field}: slot {slot}: {op}: the slot was released and reused between "
            "its write ({writer_op}) and this read; the value belongs to the slot's "
            "previous request"
        ),
        "unordered_read": (
            "{owner}.{field}: slot {slot}: {op} on {stream} reads the value {writer_op} "
            "wrote on {writer_stream}, but nothing orders the read after that write (no "
            "fence wait, stream wait or event synchronize between them that the checker "
            "was told of): the read may see the old value. Resolve through the map on the "
            "stream that wrote, wait on its fence, or report the engine's own waits "
            "(relay.debug.wait_event, synchronize_event, ...)"
        ),
        "read_summary": (
            "{owner}.{fields}: {op} on {stream} read a row that was not written for this "
            "request since it was last consumed, was left out, was written for another "
            "request, or whose write is not ordered before the read"
        ),
        # -- reads: placeholders ------------------------------------------------------
        "placeholder_nothing_pending": (
            "{owner}.{field}: {op}: position {position} holds the placeholder "
            "{placeholder}, which names slot {slot}, but nothing is pending for slot "
            "{slot} ({why}). A placeholder -slot must name a slot whose value is on its "
            "way; a sentinel of another convention left in the target (vLLM's -1 for "
            "'not known yet' names slot 1 here) reads another request's row. Write "
            "placeholders with invalidate(batch, indices) only, and real values "
            "(>= 0) everywhere else."
        ),
        "slot_named_twice": (
            "{owner}.{field}: {op}: slot {slot} is named twice in one read (positions "
            "{first} and {second}); a slot holds one pending value, which one position "
            "may take. Likely a placeholder left behind by an earlier step, or two "
            "requests given one slot."
        ),
        "placeholder_read_summary": (
            "{owner}.{fields}: {op} on {stream}: a placeholder names a slot with nothing "
            "pending for it (never written, already read, left out or released), a slot "
            "written for another request, or one whose write is not ordered before the "
            "read"
        ),
        "slot_named_twice_summary": (
            "{owner}.{fields}: {op}: a slot is named twice in one read (row 0, the "
            "scratch row, excepted)"
        ),
        # -- reads: owners ----------------------------------------------------------------
        "wrong_owner": (
            "{owner}.{field}: slot {slot}: {op} reads it for {reader} (position "
            "{position}), but {writer_op} wrote it for request {writer_request}: the "
            "value is fresh but belongs to another request. Likely the batch's slots "
            "were reordered without their requests (two pending requests' slots "
            "swapped), or a slot went to a new request while the old one's value was "
            "pending."
        ),
        # -- writes: order ----------------------------------------------------------------
        "unordered_write": (
            "{owner}.{field}: slot {slot}: {op} on {stream} overwrites the value "
            "{writer_op} wrote on {writer_stream}, and nothing orders the two writes (no "
            "stream wait or event between them): which value the next read sees depends "
            "on timing. Write from one stream, or order the streams."
        ),
        "write_summary": (
            "{owner}.{fields}: {op} on {stream} overwrites a row written on another "
            "stream with no order between the writes"
        ),
        # -- seeds ------------------------------------------------------------------------
        "unordered_seed": (
            "{owner}.{field}: slot {slot}: {op} on {stream} and {other_op} on "
            "{other_stream} touch the row with nothing ordering them: a seed must come "
            "after any forward still in flight on the row, or that forward's read or "
            "stash lands on the seeded request's row. Seed through the map's seed(...), "
            "which writes on the forward stream after it; or make the seeding stream "
            "wait for the forward stream (a stream wait or an event) and report the wait "
            "(relay.debug.wait_stream, ...)."
        ),
        "unordered_seed_summary": (
            "{owner}.{fields}: {op} on {stream} seeds a row that a forward may still "
            "read or stash into, with no order between them"
        ),
        "seed_over_unread": (
            "{owner}.{field}: slot {slot}: {op} for request {request} would overwrite "
            "the value {writer_op} wrote for request {other}, which no read has taken "
            "and no release ended: request {other} still holds the row, and its value "
            "would be lost. Release the slot (release(...)) once its request ends, "
            "then seed it."
        ),
        "seed_over_unread_summary": (
            "{owner}.{fields}: {op} would overwrite a value another request has not "
            "read, in a slot never released"
        ),
        # -- scatters (Note [Scatter destinations] in relay/runtime.py) -----------------
        "scatter_outside": (
            "{owner}.{field}: {request} starts at {start}, so its {width} value(s) "
            "would not fit the target's {size} positions; its offset is wrong (one past "
            "the right place, or another batch's)."
        ),
        "scatter_overlap": (
            "{owner}.{field}: {request} starts at {start}, inside the {width} "
            "position(s) of {other} from {other_start}: one would overwrite the other's "
            "values. Give each request its own positions (offsets one row apart at "
            "least)."
        ),
        "scatter_summary": (
            "{owner}.{field}: a scatter's offsets run outside the target or overlap"
        ),
        "scatter_count_outside": (
            "{owner}.{field}: {request} has a count of {count} value(s), outside "
            "[0, {width}]: a row holds {width}."
        ),
        "scatter_count_disagrees": (
            "{owner}.{field}: {request} reads {count} value(s), but its stash wrote "
            "{wrote}: the producer and the consumer disagree on its count (drafts "
            "trimmed on one side, or another step's count)."
        ),
        "scatter_count_summary": (
            "{owner}.{field}: a count is outside the row's width, or more than the "
            "stash wrote"
        ),
        "scatter_claimed": (
            "{owner}.{field}: {request} would write position {position}, which holds "
            "{value}, not a placeholder: its span runs into "
            "another request's positions (a count larger than the span its batch laid "
            "out, or an offset off)."
        ),
        "scatter_claimed_summary": (
            "{owner}.{field}: a scatter would overwrite a position that holds no "
            "placeholder"
        ),
        "scatter_leftover": (
            "{owner}.{field}: after the scatter, position {position} of the target "
            "still holds {value}: a placeholder no request's row covered (an offset one "
            "off, or a request missing from the batch)."
        ),
        "scatter_leftover_summary": (
            "{owner}.{field}: after the scatter, the target still holds a negative "
            "placeholder"
        ),
        # -- the fence --------------------------------------------------------------------
        # -- graph-written rows, kept rows, late-bound tails ---------------------------
        "graph_not_run": (
            "{owner}.{field}: slot {slot}: {op} reads a row a captured graph writes, but "
            "it holds no value to take ({why}): the read came before the graph ran, or "
            "no graph_wrote(indices) declared the graph's write. Call graph_wrote once the "
            "graph has written the rows, before any resolve reads them"
        ),
        "kept_stale": (
            "{owner}.{field}: slot {slot}: {op} keeps this field's row, but it holds no "
            "value to keep ({why}): the next resolve would hand over a stale value. "
            "Stash the row in full (stash) before a partial stash keeps it"
        ),
        "kept_stale_summary": (
            "{owner}.{op}: a kept row of {fields} holds no value to keep (already read, "
            "never written or released)"
        ),
        "stale_tail": (
            "{owner}.{field}: slot {slot}: {op} binds a decode tail from a row that holds "
            "no published value to take ({why}): the tail would carry a stale length. "
            "Publish the in-flight step's lengths before the tails are bound, and bind "
            "them before the schedule-side resolve consumes them"
        ),
        "stale_tail_summary": (
            "{owner}.{op}: a decode tail of {fields} was bound from a row holding no "
            "published value (already read, never written, released or not ordered)"
        ),
        "stale_fence": (
            "{owner}.{op}: fence waited on with no publish since the last wait; the rows "
            "it would read are stale. Call publish(...) for this step before resolving."
        ),
        # -- guards (Note [Guards in debug mode] in relay/runtime.py) ------------------
        "guard_non_negative_summary": "{what}: guard failed, values must be >= 0",
        "guard_positive_summary": "{what}: guard failed, values must be > 0",
        "guard_finite_summary": (
            "{what}: guard failed, values must be finite (no NaN, no inf)"
        ),
        "cast_summary": (
            "{what}: a value does not fit {cast}, the dtype Scatter(cast=...) lays it "
            "into {target} as; it would be laid in changed. Stash values {cast} "
            "holds, or give the target the field's dtype"
        ),
        # -- an engine's host reads of placeholder targets (check_resolved) -------------
        "placeholder": (
            "{consumer}: position {position} holds the placeholder {placeholder} (slot "
            "{slot}), not a value: the host read the target after invalidate and before "
            "the resolve replaced it. Read it after resolve_future (on the forward "
            "stream, then a host copy), or read the value the relay hands over instead."
        ),
        "placeholder_summary": "{consumer}: read a placeholder (-slot) not resolved yet",
    }
)


def request_at(row: int, slot: int, owners: Owners | None = None) -> str:
    """How a scatter's message names the request of batch row ``row``: by its id where
    the batch names its requests (``owners``), else by its row; with its slot."""
    if owners is None:
        return f"the request in row {row} (slot {slot})"
    named: object
    if isinstance(owners, torch.Tensor):
        named = owners.reshape(-1)[row].item()
    else:
        named = owners[row]
    if isinstance(owners, MemberRows) and row >= owners.leading:
        return f"a member row of request {named!r} (row {row}, slot {slot})"
    return f"request {named!r} (row {row}, slot {slot})"


def text(key: str, **fields: object) -> str:
    """The message ``key`` of ``MESSAGES`` with its fields filled in."""
    return MESSAGES[key].format(**fields)
