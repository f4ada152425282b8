"""``relay bench --spans``: the bundled maps' counted scatters (Note [Counted scatters]
in relay/runtime.py) against their floors, the same torch calls with relay's CPU host
checks or bare; each map's step, workload and floor read off its schema. Offsets,
counts and row starts are int32, as vLLM's ``query_start_loc`` is."""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable
from typing import Any, cast

import torch

from relay import runtime
from relay.schema import Field, Lane, Schema

__all__ = ["SpanWork", "handed", "plain_step", "relay_step", "sides", "workload"]

DRAFTS = 3
POOL = 513

#: A map's step read off its schema: ``forward`` fields (stashed), scatter fields in
#: span order (``head``: 0 or 1 value before the counted ones), their ``first`` and
#: ``counted`` scatters; slots, values, counts stashed (``made``) and laid (``counts``)
#: at ``starts``, row starts and each request's row, flags (``ready``), ``size``.
SpanWork = types.SimpleNamespace


def workload(batch: int, device: torch.device, seed: int = 0, name: str = "vllm_drafts") -> SpanWork:  # fmt: skip
    """Random stashes; spans packed in row order, 0-2 positions into a bounded row."""
    schema, g = Schema.bundled(name), torch.Generator().manual_seed(seed)
    forward = [f for f in schema.fields if isinstance(f, Field) and f.lane is Lane.FORWARD]  # fmt: skip
    scattered = [f for f in forward if f.scatter is not None]
    first: Any = scattered[0].scatter
    slots = torch.randperm(POOL - 1, generator=g)[:batch] + 1
    made = torch.randint(0, DRAFTS + 1, (batch,), generator=g)
    counts = torch.minimum(made, torch.randint(0, DRAFTS + 1, (batch,), generator=g))
    values = {
        f.payload_name: torch.randint(0, 32_000, (batch, *[DRAFTS] * len(f.shape)), generator=g, dtype=cast(torch.dtype, f.dtype)).to(device)
        for f in forward
    }  # fmt: skip
    pads = torch.randint(0, 1 if first.rows is None else 3, (batch,), generator=g)
    sizes = pads + counts + len(scattered) - 1
    ends = torch.cumsum(sizes, 0)
    int32: dict[str, Any] = {"device": device, "dtype": torch.int32}
    return SpanWork(
        name=name, schema=schema, forward=forward, scattered=scattered,
        head=len(scattered) - 1, first=first, counted=scattered[-1].scatter,
        slots=slots.to(device), values=values, made=made.to(device),
        starts=(ends - sizes + pads).to(**int32), counts=counts.to(**int32),
        rows=torch.cat([torch.zeros(1, dtype=torch.int64), ends]).to(**int32),
        row_index=torch.arange(batch).to(**int32),
        ready=(torch.randint(0, 2, (batch,), generator=g) > 0).to(device),
        size=int(sizes.sum()), dtype=first.cast or scattered[0].dtype,
    )  # fmt: skip


def relay_step(work: SpanWork, device: torch.device) -> tuple[Callable[[], None], Any, Any]:  # fmt: skip
    """The generated map's step (``stash``, ``resolve_future``) on ``work``; the map and
    the batch it hands on to (at the schema's paths)."""
    module = importlib.import_module(f"relay.maps.{work.name}")
    cls, first, counted = work.schema.name, work.first, work.counted
    relay = getattr(module, cls)(device, POOL, **{work.scattered[-1].shape[0]: DRAFTS})
    made = {counted.lengths.split(".")[-1]: work.made}  # the payload's counts
    payload = getattr(module, cls.replace("FutureMap", "Payload"))(**work.values, **made)  # fmt: skip
    rows = first.rows or types.SimpleNamespace(starts=None, index=None)
    paths = {
        work.schema.indices: work.slots, work.schema.owners: None,
        first.offsets: work.starts, counted.lengths: work.counts,
        rows.starts: work.rows, rows.index: work.row_index, first.when: work.ready,
        work.scattered[0].target: torch.full((work.size,), -1, dtype=work.dtype, device=device),
    }  # fmt: skip
    paths.pop(None, None)  # what the map does not read
    batch = types.SimpleNamespace()
    for path, value in paths.items():
        *parents, leaf = path.split(".")
        place = batch
        for parent in parents:
            place = place.__dict__.setdefault(parent, types.SimpleNamespace())
        setattr(place, leaf, value)

    def step() -> None:
        relay.stash(work.slots, payload)
        relay.resolve_future(batch)

    return step, relay, batch


def handed(work: SpanWork, batch: Any) -> list[torch.Tensor]:
    """What a step hands on: the scatter target, then the fields gathered whole."""
    gathered = [f.target for f in work.forward if f.scatter is None]
    paths = [work.scattered[0].target, *gathered]
    return [functools.reduce(getattr, path.split("."), batch) for path in paths]


#: A cast as the generated code spells it: the dtype's own method where it has one.
_CASTS = {torch.int32: ".int()", torch.int64: ".long()", torch.float32: ".float()"}


def plain_step(work: SpanWork, relay: Any, device: torch.device, check: bool = True) -> tuple[Callable[[], None], list[torch.Tensor]]:  # fmt: skip
    """A floor over ``relay``'s buffers: its step's data ops in order, relay's host checks
    of slots and spans where ``check`` (CPU), one straight-line function as a step is
    written by hand; and what it hands on, as ``handed`` lists it (a step fills it)."""
    buf = {f.name: getattr(relay, f"{f.name}_buf") for f in work.forward}
    gathers = [buf[f.name] for f in work.forward if f.scatter is None]
    rows, when, head = work.first.rows, work.first.when is not None, work.head
    got = [torch.full((work.size,), -1, dtype=work.dtype, device=device), *[torch.empty(0)] * len(gathers)]  # fmt: skip
    ns: dict[str, Any] = {
        "idx": work.slots, "s32": work.starts, "c32": work.counts, "ready": work.ready,
        "slots_ok": runtime.host_slots_ok, "spans_ok": runtime._spans_ok, "got": got,
        "out": got[0], "P": POOL, "K": DRAFTS, "n": len(work.slots), "size": work.size,
        "bounds": rows and (work.rows, rows.index and work.row_index),
        "cols": torch.arange(DRAFTS, device=device), "one": torch.arange(1, device=device),
    }  # fmt: skip
    check = check and device.type == "cpu"
    body = ["if not slots_ok(idx, P): raise IndexError(idx)"] if check else []
    for k, f in enumerate(work.forward):  # the stash
        ns[f"b{k}"], ns[f"v{k}"] = buf[f.name], work.values[f.payload_name]
        body.append(f"b{k}.index_copy_(0, idx, v{k})")
    for k, f in enumerate(work.scattered):  # the scattered rows, cast as they are laid
        ns[f"r{k}"], to = buf[f.name], f.scatter.cast if f.scatter else None
        body.append(f"a{k} = r{k}.index_select(0, idx){_CASTS[to] if to else ''}")
    body.append("starts = s32.long()")
    if when:  # 0 or the row (1) per request: the general plan's flag
        body.append("taken = (ready.long() != 0).long() * 1")
    body.append("counts = c32.long()")
    if check:
        body.append(f"if not spans_ok(starts, [counts], [K], {head}, size, bounds): raise IndexError(starts)")  # fmt: skip
    writes = ["out.index_copy_(0, starts, a0)"] if head and not when else []
    if when:  # a head laid where flagged: the general plan's masks
        body += ["ah = starts.unsqueeze(1) + one", "bk = a0.reshape(n, 1)"]
        body += ["kept = one < taken.unsqueeze(1)", "p0, w0 = ah[kept], bk[kept]"]
        writes.append("out.index_copy_(0, p0, w0)")
    last = f"a{len(work.scattered) - 1}"
    body.append(f"at = {'(starts + 1)' if head else 'starts'}.unsqueeze(1) + cols")
    body += ["keep = cols < counts.unsqueeze(1)", f"p1, w1 = at[keep], {last}[keep]"]
    ns.update((f"g{i}", gathered) for i, gathered in enumerate(gathers, 1))
    body += [f"got[{i}] = g{i}.index_select(0, idx)" for i in range(1, len(got))]
    body += [*writes, "out.index_copy_(0, p1, w1)"]
    source = "def step():\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(source, f"<relay bench --spans floor: {work.name}>", "exec"), ns)  # noqa: S102
    return ns["step"], got


def sides(batch: int, device: torch.device, seed: int, name: str = "vllm_drafts") -> tuple[dict[str, Callable[[], None]], bool]:  # fmt: skip
    """The generated step and its floors, one step in; whether they hand on the same."""
    work = workload(batch, device, seed, name)
    generated, relay, relay_batch = relay_step(work, device)
    floors = [plain_step(work, relay, device, check) for check in (True, False)]
    steps = {"generated": generated, "floor": floors[0][0], "bare": floors[1][0]}
    for step in steps.values():
        step()
    want = handed(work, relay_batch)
    return steps, all(all(map(torch.equal, want, got)) for _, got in floors)
