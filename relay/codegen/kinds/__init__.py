"""One module per kind: each ``Resolve``, ``Guard`` and ``Alloc`` member in its own file.

# Note [Kinds]
A kind holds, in one place, its validation rule (``problems``, which
``relay/codegen/validate.py`` runs for every field), the statements it contributes to
the generated methods (``relay/codegen/methods.py`` assembles them), and its reference
behaviour (``relay/testing/model.py`` runs it beside the generated map). Adding a kind
is a member of its enum in ``relay/schema.py``, a module here registered below, its
runtime helper if it calls one, and its docs; the views, the templates and the model
do not change. ``Guard.FINITE`` was added that way.
"""

from __future__ import annotations

from relay.codegen.kinds import (
    eager,
    gather,
    guard_finite,
    guard_non_negative,
    guard_none,
    guard_positive,
    lazy,
    placeholder,
)
from relay.codegen.kinds.base import AllocKind, GuardKind, Names, ResolveKind
from relay.schema import Alloc, Field, Guard, Resolve

__all__ = [
    "AllocKind",
    "GuardKind",
    "Names",
    "ResolveKind",
    "alloc",
    "guard",
    "resolve",
]

_ALLOC: dict[Alloc, AllocKind] = {k.alloc: k for k in (eager.KIND, lazy.KIND)}
_GUARD: dict[Guard, GuardKind] = {
    k.guard: k
    for k in (
        guard_none.KIND,
        guard_non_negative.KIND,
        guard_positive.KIND,
        guard_finite.KIND,
    )
}
_RESOLVE: dict[Resolve, ResolveKind] = {
    k.resolve: k for k in (gather.KIND, placeholder.KIND)
}
assert set(_ALLOC) == set(Alloc) and set(_GUARD) == set(Guard), "a kind has no module"
assert set(_RESOLVE) == set(Resolve), "a Resolve kind has no module"


def alloc(f: Field) -> AllocKind:
    return _ALLOC[f.alloc]


def guard(f: Field) -> GuardKind:
    return _GUARD[f.guard]


def resolve(f: Field) -> ResolveKind:
    return _RESOLVE[f.resolve]
