"""What the generator writes, tested by behaviour: a schema using every field option is
rendered during the run and checked in lockstep with the reference model, debug on and
off; and a mutation of an emitted statement fails a behavioural test, not only a byte
comparison with a golden file."""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from relay.codegen.render import render
from relay.codegen.validate import validate
from relay.errors import RelayError
from relay.schema import (
    FROM_PAYLOAD,
    Alloc,
    BatchRows,
    Field,
    Guard,
    HostCopy,
    IfNone,
    Lane,
    Layout,
    Resolve,
    Scatter,
    Schema,
    Tails,
    TailsKv,
    TargetShape,
    Unwritten,
)
from relay.testing import check_lockstep


def every_option(layout: Layout) -> Schema:
    """Every field option at once: optional lazy fields, a host mirror and sum, a
    placeholder, every guard, rows read as zeros, a flat target, an optional parent,
    seeding and owners, a kept field, a graph-written, stream-ordered lengths field with
    late-bound tails (and, packed, two fields sharing a buffer)."""
    forward = Lane.FORWARD
    fields = [
        Field("tokens", lane=forward, dtype=torch.int64, target="input_ids",
              resolve=Resolve.PLACEHOLDER, guard=Guard.NON_NEGATIVE),
        Field("bonus", lane=forward, dtype=torch.int64, target="spec_info.bonus",
              guard=Guard.POSITIVE),
        Field("topk_p", lane=forward, dtype=torch.float32, shape=("topk",),
              target="spec_info.topk_p", guard=Guard.FINITE),
        Field("accept", lane=forward, dtype=torch.int64, shape=("topk",),
              target="spec_info.accept", target_shape=TargetShape.FLAT,
              unwritten=Unwritten.ZEROS),
        Field("hidden", lane=forward, dtype=FROM_PAYLOAD, shape=("hidden",),
              alloc=Alloc.LAZY, optional=True, target="spec_info.hidden", kept=True),
        Field("scores", lane=forward, dtype=torch.float32, shape=(2,), optional=True,
              target="scores"),
        Field("lens", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens",
              host=HostCopy(mirror="seq_lens_cpu", sum="seq_lens_sum", stream_ordered=True), guard=Guard.POSITIVE,
              graph_written=True, tails=Tails(rows="mix_running_indices", kv=TailsKv(locations="out_cache_loc", table="req_to_token")),
              ),
        Field("conf", lane=Lane.SCHEDULE, dtype=torch.float32, optional=True,
              target="conf", host=HostCopy(mirror="conf_cpu")),
    ]  # fmt: skip
    if layout is Layout.PACKED:
        fields.append(
            Field(
                "index",
                lane=forward,
                dtype=torch.float32,
                shape=("topk",),
                target="spec_info.index",
            )
        )
    schema = Schema(
        name=f"Every{layout.value.title()}FutureMap",
        fields=fields,
        layout=layout,
        optional_parents={"spec_info": IfNone.SKIP},
        seeded=True,
        owners="rids",
    )
    assert validate(schema, str) == []
    return schema


def _module(text: str, tmp_path: Path, name: str) -> ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def _rendered(layout: Layout = Layout.SEPARATE) -> tuple[Schema, str]:
    schema = every_option(layout)
    return schema, render(schema, source="schemas/every.py", command="relay generate")


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("debug", [True, False], ids=["debug-on", "debug-off"])
def test_every_option_runs_in_lockstep(
    layout: Layout, debug: bool, tmp_path: Path
) -> None:
    """The module generated now for every option agrees with the reference model."""
    schema, text = _rendered(layout)
    cls = getattr(_module(text, tmp_path, f"every_{layout.value}"), schema.name)
    done = check_lockstep(schema, cls, operations=600, steps=60, debug=debug)
    assert done >= 600


# --- behaviour a user relies on, and mutations of the statements that give it -------------


def _batch(slots: list[int], rids: list[int] | None = None) -> SimpleNamespace:
    indices = torch.tensor(slots)
    return SimpleNamespace(
        req_pool_indices=indices,
        input_ids=indices.neg(),
        spec_info=SimpleNamespace(),
        rids=rids if rids is not None else slots,
    )


def _payload(module: ModuleType, n: int, **change: object) -> Any:
    values: dict[str, object] = {
        "tokens": torch.arange(1, n + 1),
        "bonus": torch.arange(1, n + 1),
        "topk_p": torch.rand(n, 2),
        "accept": torch.ones(n, 2, dtype=torch.int64),
        "hidden": torch.ones(n, 3),
        "scores": torch.ones(n, 2),
    }
    values.update(change)
    return module.EverySeparatePayload(**values)


def omitted_rows_read_zeros(module: ModuleType) -> None:
    """Debug off: rows whose latest stash left an optional field out read zeros in a
    later resolve that mixes them with rows of a carrying stash (Note [Optional
    fields]), on the common path (the slots resolve_future gathered with)."""
    relay = module.EverySeparateFutureMap("cpu", 8, topk=2)
    both = _batch([1, 2])
    relay.stash(both.req_pool_indices, _payload(module, 2))
    relay.resolve_future(both)
    one = _batch([1])
    relay.resolve_future(one)
    relay.stash(one.req_pool_indices, _payload(module, 1, scores=None))
    two = _batch([2])
    relay.resolve_future(two)
    relay.stash(
        two.req_pool_indices, _payload(module, 1, scores=torch.full((1, 2), 7.0))
    )
    relay.resolve_future(both)
    assert both.scores.tolist() == [[0.0, 0.0], [7.0, 7.0]]


def host_mirror_is_its_own_tensor(module: ModuleType) -> None:
    """The host mirror is a copy: changing the device value leaves it as it was."""
    relay = module.EverySeparateFutureMap("cpu", 8, topk=2)
    batch = _batch([1, 2])
    relay.publish(batch.req_pool_indices, torch.tensor([5, 6]))
    relay.resolve_seq_lens_cpu(batch)
    batch.seq_lens.add_(100)
    assert batch.seq_lens_cpu.tolist() == [5, 6] and batch.seq_lens_sum == 11


def debug_release_marks_rows_stale(module: ModuleType) -> None:
    """Debug mode: a resolve of a released slot's unread value is reported."""
    relay = module.EverySeparateFutureMap("cpu", 8, topk=2, debug=True)
    batch = _batch([3])
    relay.stash(batch.req_pool_indices, _payload(module, 1))
    relay.release(batch.req_pool_indices)
    with pytest.raises(RelayError, match="released"):
        relay.resolve_future(_batch([3]))


def zeros_before_first_write(module: ModuleType) -> None:
    """A zeros field's never-written rows read zeros with debug off, and its buffer
    starts as zeros in debug mode too (where other fields start as poison)."""
    relay = module.EverySeparateFutureMap("cpu", 8, topk=2)
    relay.stash(torch.tensor([1]), _payload(module, 1, accept=torch.full((1, 2), 9)))
    batch = _batch([1, 4])
    relay.resolve_future(batch)
    assert batch.spec_info.accept.tolist() == [9, 9, 0, 0]  # flat: (n * topk,)
    checked = module.EverySeparateFutureMap("cpu", 8, topk=2, debug=True)
    assert checked.accept_buf.eq(0).all() and not checked.bonus_buf.eq(0).any()


BEHAVIOURS: dict[str, tuple[Callable[[ModuleType], None], Callable[[str], str]]] = {
    "omitted field's zero-fill dropped": (
        omitted_rows_read_zeros,
        lambda text: text.replace(
            "_rt.write_optional(self.scores_buf, indices, scores",
            "scores is not None and _rt.write_optional(self.scores_buf, indices, scores",
        ),
    ),
    "host mirror handed the device tensor": (
        host_mirror_is_its_own_tensor,
        lambda text: text.replace(
            "batch.seq_lens_cpu = host", "batch.seq_lens_cpu = lens"
        ),
    ),
    "debug release doing nothing": (
        debug_release_marks_rows_stale,
        lambda text: text.replace("self._state.debug.release(indices)", "pass"),
    ),
    "zeros rows allocated as poison": (
        zeros_before_first_write,
        lambda text: text.replace("unwritten=_rt.Unwritten.ZEROS, ", ""),
    ),
}


@pytest.mark.parametrize("name", sorted(BEHAVIOURS))
def test_a_mutated_statement_fails_a_behavioural_test(
    name: str, tmp_path: Path
) -> None:
    """The behaviour holds for the generated module and fails once the one statement
    that gives it is mutated."""
    check, mutate = BEHAVIOURS[name]
    _schema, text = _rendered()
    check(_module(text, tmp_path, "every_plain"))
    mutated = mutate(text)
    assert mutated != text, "the mutation no longer matches the generated module"
    with pytest.raises((AssertionError, RelayError, pytest.fail.Exception)):
        check(_module(mutated, tmp_path, "every_mutated"))


@pytest.mark.parametrize("parents", [{}, {"spec_info": IfNone.SKIP}])
def test_slots_read_through_an_object_a_target_writes_into(
    parents: dict[str, IfNone], tmp_path: Path
) -> None:
    """``indices="spec_info.idx"`` beside ``target="spec_info.a"``: every name is bound
    before use, so the resolve reads the slots and hands the rows over (and, with the
    parent optional, leaves a batch whose spec_info is None alone)."""
    schema = Schema(
        name="SharedFutureMap",
        indices="spec_info.idx",
        optional_parents=parents,
        fields=[
            Field("a", lane=Lane.FORWARD, dtype=torch.int64, target="spec_info.a"),
            Field("b", lane=Lane.FORWARD, dtype=torch.int64, target="spec_info.b"),
        ],
    )
    text = render(schema, source="schemas/shared.py", command="relay generate")
    module = _module(text, tmp_path, f"shared_{len(parents)}")
    for debug in (False, True):
        relay = module.SharedFutureMap("cpu", 4, debug=debug)
        relay.stash(
            torch.tensor([2]),
            module.SharedPayload(a=torch.tensor([7]), b=torch.tensor([8])),
        )
        batch = SimpleNamespace(spec_info=SimpleNamespace(idx=torch.tensor([2])))
        relay.resolve_future(batch)
        assert (batch.spec_info.a.tolist(), batch.spec_info.b.tolist()) == ([7], [8])
    if parents:
        relay.resolve_future(SimpleNamespace(spec_info=None))  # nothing to resolve


def test_rows_scattered_at_per_request_offsets(tmp_path: Path) -> None:
    """``Resolve.SCATTER``: each request's token and drafts land at its start offset of
    a flat target, in one scatter; the rest of the target is left alone; and the map
    agrees with the reference model in lockstep."""
    schema = Schema(
        name="FlatFutureMap",
        fields=[
            Field(
                "tokens",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                shape=("width",),
                target="input_ids",
                resolve=Scatter(offsets="starts"),
            ),
        ],
    )
    text = render(schema, source="schemas/flat.py", command="relay generate")
    module = _module(text, tmp_path, "flat_map")
    relay = module.FlatFutureMap("cpu", 6, width=2)
    rows = torch.tensor([[10, 11], [20, 21]])
    relay.stash(torch.tensor([4, 2]), module.FlatPayload(tokens=rows))
    batch = SimpleNamespace(
        req_pool_indices=torch.tensor([2, 4]),
        starts=torch.tensor([0, 3]),
        input_ids=torch.full((6,), -1),
    )
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [20, 21, -1, 10, 11, -1]
    done = check_lockstep(
        schema, module.FlatFutureMap, operations=500, dims={"width": 2}
    )
    assert done >= 500


def _reads_through_batch(text: str, parent: str) -> list[str]:
    """Every ``batch.<parent>.<attribute>`` the generated code (not its doc strings)
    spells out."""
    return [
        f"batch.{parent}.{node.attr}"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == parent
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "batch"
    ]


def test_a_scatter_under_a_skipped_parent_reads_its_layout_there(
    tmp_path: Path,
) -> None:
    """A counted, row-bounded scatter whose target, offsets, counts and rows are under
    an optional parent reads them through the local the resolve checked is set (so
    `mypy --strict` knows it is), and lays the rows in; a batch without the parent is
    left alone."""
    schema = Schema(
        name="UnderFutureMap",
        optional_parents={"spec_info": IfNone.SKIP},
        fields=[
            Field(
                "drafts",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                shape=(2,),
                target="spec_info.packed",
                resolve=Scatter(
                    offsets="spec_info.starts",
                    lengths="spec_info.counts",
                    rows=BatchRows(starts="spec_info.rows"),
                ),
            ),
        ],
    )
    text = render(schema, source="schemas/under.py", command="relay generate")
    assert _reads_through_batch(text, "spec_info") == []
    module = _module(text, tmp_path, "under_map")
    relay = module.UnderFutureMap("cpu", 4)
    rows = torch.tensor([[10, 11], [20, 21]])
    counts = torch.tensor([1, 2])
    relay.stash(torch.tensor([1, 2]), module.UnderPayload(drafts=rows, counts=counts))
    info = SimpleNamespace(
        packed=torch.zeros(4, dtype=torch.int64),
        starts=torch.tensor([0, 1]),
        counts=counts,
        rows=torch.tensor([0, 1, 3]),
    )
    relay.resolve_future(
        SimpleNamespace(req_pool_indices=torch.tensor([1, 2]), spec_info=info)
    )
    assert info.packed.tolist() == [10, 20, 21, 0]
    relay.resolve_future(
        SimpleNamespace(req_pool_indices=torch.tensor([1]), spec_info=None)
    )
