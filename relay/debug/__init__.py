"""Debug mode of the generated maps: what each method reports to ``DebugChecks``, and the
happens-before checker behind it.

Three units, each with a public interface and none reaching into another's state:

- ``relay.debug.state``: the per-row state table (Note [Debug state table]);
- ``relay.debug.clocks``: the happens-before vector clocks (Note [Happens-before in
  debug mode]), installed explicitly (``enable_happens_before``, ``happens_before``);
- ``relay.debug.messages``: every message text, in one table.

``DebugChecks`` (``relay.debug.checks``) composes them for one map.

The contract
------------
The generator and the debug runtime meet here: the generated code calls exactly these
methods, and only when the map was built with ``debug=True``. The bookkeeping behind
them is free to change.

Per method, in this order, one report of its lane work (not one per field), so that the
checks of a method are a fixed number of ops whatever its field count (Note [Debug state
table]):

- ``stash`` / ``publish``: ``check_slots`` (before anything is written), the writes, then
  one ``wrote(op, indices, fields, carried=...)`` naming every field written, ``carried``
  saying for each optional one whether this call carried it (one left out is marked
  omitted); ``publish`` calls ``publishing`` right before its fence record.
- ``invalidate``: ``check_slots(..., scratch_ok=False)`` before the placeholders.
- ``resolve_future``: ``check_slots``, the gathers, then one ``read(op, indices,
  buffers, carried=...)`` of every gathered field (``buffers``: field name -> buffer,
  whose rows read are poisoned; ``carried``: whether each optional one was read), and
  one ``read`` per placeholder field with its own rows and ``taken`` mask.
- schedule resolves: the fence wait, ``waited``, ``check_slots``, the gather, ``read``.
- ``seed`` (a forward-lane write from the scheduler): ``check_slots``, the writes, then
  ``seeded(indices, fields, ...)``, which checks the seed is ordered after the rows'
  latest write and read (Note [Seeds in debug mode]).
- ``release``: ``release``.

Keyword arguments the map passes where its schema says so: ``owners=`` (one request id
per row, or a ``MemberRows`` of the batch's requests and the member rows after them:
Note [Member rows] in ``owners.py``) to ``wrote``/``seeded`` and ``read``, where the
batch says which request each row belongs to; ``distinct=True`` to a placeholder ``read``, whose slots no
``check_slots`` saw. The constructor takes ``initial_zeros`` (fields whose never-written
rows read as zeros) and ``seeds`` (fields a ``seed`` writes).

What debug mode checks (see docs/debugging.md for every message)
-----------------------------------------------------------------
- Slots: integers, in range, row 0 only where padding may point at it, no slot twice.
- Freshness: each row of each field has a state kept apart from its values (never
  written, written, consumed, omitted), so every legal value is accepted (NaN, inf and
  -1 included) and each written value is read exactly once. Rows read are filled with
  ``poison(dtype)`` again, so a stray read outside the map still looks wrong.
- Release: ``release`` marks the slots' unread values stale; a value written for the
  slot's previous request is never handed to the next one.
- Zeros: a never-written row of an ``initial_zeros`` field reads as zeros, and the
  read neither consumes nor poisons it; once written, the row is checked as above.
- Placeholders: a placeholder naming a slot with nothing pending for it, and a slot
  named twice in one read (``distinct``), are reported by name.
- Owners: a value read by another request than the one it was written for.
- Fence freshness: each schedule-side resolve waits on a publish made since its last wait.
- Happens-before, while the clocks are installed: every write and read of a row is
  stamped with its stream and that stream's vector clock; a read not ordered after the
  write it reads, two unordered writes of one row, or a seed not ordered after a
  forward still in flight on its row, is reported.

Checks run on the device where they can (``torch._assert_async``, no host sync). On the
CPU, where a check costs no sync, a failure raises ``DebugCheckFailed`` (a
``RelayDebugError``) naming the field, the slot and the operations; on other devices the
device-side assert carries the fields of the call, the operation and the streams.

Engines install the clocks (``happens_before()`` around a run, or
``enable_happens_before()``) and report their own stream waits and event synchronizes
with ``record_event``, ``wait_event``, ``synchronize_event``, ``wait_stream`` and
``synchronize_stream``; ``check_resolved`` checks a placeholder target before a host
consumer reads it.
"""

from __future__ import annotations

from relay.debug.checks import DebugCheckFailed, DebugChecks, check_resolved
from relay.debug.clocks import (
    disable_happens_before,
    enable_happens_before,
    happens_before,
    happens_before_enabled,
    record_event,
    synchronize_event,
    synchronize_stream,
    wait_event,
    wait_stream,
)
from relay.debug.messages import MESSAGES
from relay.debug.state import poison

__all__ = [
    "MESSAGES",
    "DebugCheckFailed",
    "DebugChecks",
    "check_resolved",
    "disable_happens_before",
    "enable_happens_before",
    "happens_before",
    "happens_before_enabled",
    "poison",
    "record_event",
    "synchronize_event",
    "synchronize_stream",
    "wait_event",
    "wait_stream",
]
