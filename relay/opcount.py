"""Counting the aten ops a call dispatches: data ops and view ops apart.

A ``TorchDispatchMode`` sees every aten op below autograd, including view ops
(``select``, ``slice``, ``split_with_sizes``, ``squeeze``, ``view``...) that only make a
new tensor header over the same storage: they move no data and launch no kernel. A
relay's cost is its data ops (sglang's op counts in ``DOMAIN.md`` count kernels), so
the two are counted apart, and both are asserted in ``tests/runtime/test_maps_ops.py``
(the views still cost Python and dispatcher time).

The rule, from torch's own schema metadata rather than a hand list (Note [View ops]):
an op is a view op when it mutates none of its arguments and every one of its returns
aliases an input without writing it (alias annotations ``Tensor(a)`` or
``Tensor(a)[]``, not ``Tensor(a!)``). Everything else is a data op: in-place writes
(``index_copy_``: ``Tensor(a!)``), gathers and other ops that return fresh tensors.
``relay bench`` uses the same rule by importing this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounts", "count_ops", "is_view_op"]


# Note [View ops]
# Alias annotations are what autograd, functionalization and the compiler rely on to
# know an output shares its input's storage, so they hold for every aten op. An op
# that returns a fresh tensor but is implemented as a view (``_unsafe_view``) carries
# no annotation and counts as a data op; relay's generated code never calls it.


def is_view_op(op: Any) -> bool:
    """Whether aten ``op`` (an ``OpOverload``) only aliases its inputs (Note [View ops])."""
    schema = op._schema
    if schema.is_mutable or not schema.returns:
        return False
    return all(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    )


@attrs.frozen
class OpCounts:
    """The ops one call dispatched, in order, split into data ops and view ops."""

    data: tuple[str, ...]
    views: tuple[str, ...]


# torch leaves TorchDispatchMode's __init__ and __init_subclass__ unannotated.
class _Counter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.data: list[str] = []
        self.views: list[str] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = str(func.overloadpacket.__name__)
        (self.views if is_view_op(func) else self.data).append(name)
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> OpCounts:
    """Run ``fn`` and return the aten ops it dispatched (on any device)."""
    counter = _Counter()
    with counter:
        fn()
    return OpCounts(tuple(counter.data), tuple(counter.views))
