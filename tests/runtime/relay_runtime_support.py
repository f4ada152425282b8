"""Shared helpers for the runtime tests: an engine-like batch, payload builders, gates."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from relay.cpu_stream import ThreadStream
from relay.maps.eagle import EaglePayload
from relay.schema import Schema

#: Failure guard for waits that must end: generous, never an ordering or timing assert.
GUARD_S = 20.0


def _empty() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


@dataclass
class SpecInfo:
    """The engine's speculative-decoding state; every attribute a bundled map writes."""

    bonus_tokens: torch.Tensor = field(default_factory=_empty)
    topk_p: torch.Tensor = field(default_factory=_empty)
    topk_index: torch.Tensor = field(default_factory=_empty)
    hidden_states: torch.Tensor | None = None
    dsa_topk_indices: torch.Tensor | None = None
    draft_probs: torch.Tensor | None = None
    draft_confidence: torch.Tensor = field(default_factory=_empty)


@dataclass
class Batch:
    """An engine batch: request-pool slots and every attribute a bundled map reads or writes."""

    req_pool_indices: torch.Tensor
    input_ids: torch.Tensor = field(default_factory=_empty)
    seq_lens: torch.Tensor = field(default_factory=_empty)
    seq_lens_cpu: torch.Tensor = field(default_factory=_empty)
    seq_lens_sum: int = -1
    draft_confidence_cpu: torch.Tensor = field(default_factory=_empty)
    spec_info: SpecInfo = field(default_factory=SpecInfo)


def slots(*values: int) -> torch.Tensor:
    """An int64 index tensor of request-pool slots."""
    return torch.tensor(values, dtype=torch.int64)


def batch_of(*values: int) -> Batch:
    """A batch of the given slots."""
    return Batch(req_pool_indices=slots(*values))


def eagle_payload(
    n: int, topk: int, *, base: int = 0, hidden: torch.Tensor | None = None
) -> EaglePayload:
    """A distinguishable EAGLE payload for ``n`` requests (values grow from ``base``)."""
    return EaglePayload(
        bonus_tokens=torch.arange(base, base + n, dtype=torch.int64),
        topk_p=torch.arange(n * topk, dtype=torch.float32).reshape(n, topk) / 100
        + base,
        topk_index=torch.arange(n * topk, dtype=torch.int64).reshape(n, topk) + base,
        hidden_states=hidden,
    )


@contextmanager
def thread_streams(*names: str) -> Iterator[list[ThreadStream]]:
    """ThreadStreams that are drained and closed on exit."""
    streams = [ThreadStream(name) for name in names]
    try:
        yield streams
    finally:
        for stream in streams:
            stream.close()


def gated(gate: threading.Event, fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` run once ``gate`` opens (the guard only stops a broken test from hanging)."""

    def task() -> None:
        assert gate.wait(GUARD_S), "test gate never opened"
        fn()

    return task


def load_generated(schema: Schema, tmp_path: Path, module: str) -> ModuleType:
    """Render ``schema`` with the code generator and import the module it produces."""
    from relay.codegen.render import render

    path = tmp_path / f"{module}.py"
    path.write_text(render(schema, source=f"tests/{module}.py", command="pytest"))
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def buffer_copies(relay: Any) -> dict[str, torch.Tensor]:
    """A copy of every allocated buffer of ``relay``, to show a refused call wrote
    nothing (``buffers_unchanged``)."""
    found = {
        name: value.clone()
        for name, value in vars(relay).items()
        if name.endswith("_buf") and isinstance(value, torch.Tensor)
    }
    # Lazy buffers live in the map's state (their ``<name>_buf`` is a property).
    state = relay._state
    for f, buf in zip(state.table.fields, state.buffers):
        if buf is not None:
            found.setdefault(f"{f.name}_buf", buf.clone())
    return found


def buffers_unchanged(relay: Any, before: dict[str, torch.Tensor]) -> bool:
    """Whether every buffer of ``relay`` still holds what ``before`` copied (NaN equal)."""
    return all(
        torch.equal(before[name].nan_to_num(7.0), getattr(relay, name).nan_to_num(7.0))
        for name in before
    )
