"""The sides ``relay bench`` compares: each bundled map against its hand-written baseline.

A ``Pair`` is declared once: the schema name (its generated module is
``relay.maps.<schema>``), the baseline class, and what one step of its design does.
Both sides are driven by one generic driver that reads the map's own interface (its
payload fields, ``publish`` keywords, whether it has ``invalidate`` and which
schedule-side resolves), so a schema that changes design keeps being driven
correctly and a new bundled schema needs one ``Pair`` line.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

import attrs
import torch

from relay.bench.baseline import DecodeBaseline, DecodeSeqLensBaseline, EagleBaseline
from relay.bench.sizes import Shape

__all__ = [
    "PAIRS",
    "Batch",
    "Generated",
    "Pair",
    "Side",
    "SpecInfo",
    "Workload",
    "baseline_side",
    "build_side",
    "compare_values",
    "discover",
    "generated_side",
    "observed",
    "pair_named",
    "same_value",
    "sides_for",
]


@attrs.frozen
class Pair:
    """One bundled schema and the hand-written map an engine would keep instead."""

    #: The schema's name: its generated module is ``relay.maps.<schema>``.
    schema: str
    #: The baseline: ``cls(device, pool)``, or ``cls(device, pool, topk=K)`` if ``spec``.
    baseline: type[Any]
    #: One line for the report: what the baseline does.
    design: str
    #: Speculative decoding: shapes have top-k and hidden sizes; sequences grow by the
    #: accepted length. Otherwise by one token, which the scheduler can compute.
    spec: bool

    def new_baseline(self, device: torch.device, shape: Shape) -> Any:
        if self.spec:
            return self.baseline(device, shape.pool, topk=shape.topk)
        return self.baseline(device, shape.pool)


#: Every compared pair, in report order. A schema not generated yet is skipped.
PAIRS: tuple[Pair, ...] = (
    Pair(
        "decode",
        DecodeBaseline,
        "sglang today: tokens gathered into input_ids; the host computes seq_lens + 1",
        spec=False,
    ),
    Pair(
        "decode_seq_lens",
        DecodeSeqLensBaseline,
        "sglang 2026-05: token placeholders in input_ids; seq_lens relayed, host copy, sum",
        spec=False,
    ),
    Pair(
        "eagle",
        EagleBaseline,
        "sglang today: bonus token, top-k, hidden gathered; seq_lens published, copied, summed",
        spec=True,
    ),
    Pair(
        "eagle_packed",
        EagleBaseline,
        "sglang today (as for eagle); the generated map packs fields of one dtype",
        spec=True,
    ),
)


def pair_named(schema: str) -> Pair:
    """The declared pair of ``schema``."""
    for pair in PAIRS:
        if pair.schema == schema:
            return pair
    raise KeyError(
        f"no baseline is declared for schema {schema!r} (relay/bench/sides.py)"
    )


# ---------------------------------------------------------------------------
# The generated side, read from its module


@attrs.frozen
class Generated:
    """A generated map module and the parts of it the driver calls."""

    module: ModuleType
    map_cls: type[Any]
    payload_cls: type[Any]

    @staticmethod
    def load(schema: str) -> Generated:
        """``relay.maps.<schema>``; raises ImportError if it is not generated."""
        module = importlib.import_module(f"relay.maps.{schema}")
        names: Sequence[str] = getattr(module, "__all__", dir(module))
        maps = [n for n in names if n.endswith("FutureMap")]
        payloads = [n for n in names if n.endswith("Payload")]
        if len(maps) != 1 or len(payloads) != 1:
            raise ImportError(
                f"relay.maps.{schema} exports {len(maps)} FutureMap and {len(payloads)} "
                "Payload classes; the bench drives modules with one of each"
            )
        return Generated(module, getattr(module, maps[0]), getattr(module, payloads[0]))

    def new_map(self, device: torch.device, shape: Shape, *, debug: bool) -> Any:
        """The map at ``shape``: eager symbolic dims (``topk``, ``hidden``) from it."""
        dims = {"topk": shape.topk, "hidden": shape.hidden}
        kwargs: dict[str, Any] = {}
        for name, param in inspect.signature(self.map_cls).parameters.items():
            if param.kind is not inspect.Parameter.KEYWORD_ONLY or name == "debug":
                continue
            if name not in dims:
                raise TypeError(
                    f"{self.map_cls.__name__} needs dim {name!r}; the bench "
                    f"knows only {', '.join(dims)}"
                )
            kwargs[name] = dims[name]
        return self.map_cls(device, shape.pool, debug=debug, **kwargs)


def discover(
    schemas: Sequence[str] | None = None,
) -> tuple[list[tuple[Pair, Generated]], list[tuple[Pair, str]]]:
    """The pairs whose generated module exists, and those skipped with the reason."""
    found: list[tuple[Pair, Generated]] = []
    skipped: list[tuple[Pair, str]] = []
    for pair in PAIRS:
        if schemas is not None and pair.schema not in schemas:
            continue
        try:
            found.append((pair, Generated.load(pair.schema)))
        except ImportError as error:
            skipped.append((pair, str(error)))
    return found, skipped


# ---------------------------------------------------------------------------
# Batches and workloads


@attrs.define(slots=False)
class SpecInfo:
    """The draft input of a speculative batch, as the EAGLE maps resolve it."""

    bonus_tokens: torch.Tensor | None = None
    topk_p: torch.Tensor | None = None
    topk_index: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


@attrs.define(slots=False)
class Batch:
    """A scheduler batch with every attribute the maps read and write (not slotted:
    a new schema may resolve into attributes this class does not name)."""

    req_pool_indices: torch.Tensor
    req_pool_indices_cpu: torch.Tensor
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    spec_info: SpecInfo = attrs.field(factory=SpecInfo)

    @staticmethod
    def new(indices: torch.Tensor, seq_lens: torch.Tensor) -> Batch:
        host = seq_lens.cpu().clone()
        return Batch(
            req_pool_indices=indices,
            req_pool_indices_cpu=indices.cpu(),
            input_ids=torch.zeros_like(indices),
            seq_lens=seq_lens.clone(),
            seq_lens_cpu=host,
            seq_lens_sum=int(host.sum()),
        )

    def next_tokens(self) -> torch.Tensor:
        """What the next forward reads as each request's input token: the draft
        input's bonus tokens where the map gathers them there, else ``input_ids``."""
        bonus = self.spec_info.bonus_tokens
        return bonus if bonus is not None else self.input_ids


def advance_seq_lens(batch: Batch) -> None:
    """The scheduler's own work where plain decoding relays no lengths: each request
    grew by one token (sglang: ``seq_lens + 1`` on the host, the sum by the batch)."""
    batch.seq_lens_cpu = batch.seq_lens_cpu + 1
    batch.seq_lens_sum += batch.seq_lens_cpu.shape[0]


@attrs.define
class Workload:
    """The tensors of one step: what a forward produced for ``shape.batch`` requests.
    ``values`` holds them by payload field or ``publish`` keyword."""

    indices: torch.Tensor
    seq_lens: torch.Tensor  # the lengths before the step
    values: dict[str, torch.Tensor | None]
    # The keyword dicts handed to sides (see ``view``), refreshed by ``renew``.
    _views: list[tuple[tuple[str, ...], dict[str, torch.Tensor | None]]] = attrs.field(
        factory=list, init=False
    )

    @staticmethod
    def random(
        shape: Shape, device: torch.device, g: torch.Generator, *, spec: bool
    ) -> Workload:
        """Distinct slots in 1..P-1 (row 0 is scratch) and plausible values."""
        b = shape.batch
        indices = (torch.randperm(shape.pool - 1, generator=g)[:b] + 1).to(device)
        seq_lens = torch.randint(1, 30_000, (b,), generator=g).to(device)
        w = Workload(indices, seq_lens, {})
        w.renew(shape, device, g, spec=spec)
        return w

    def renew(
        self, shape: Shape, device: torch.device, g: torch.Generator, *, spec: bool
    ) -> None:
        """New outputs for the same requests. The lengths grow by one token (plain
        decoding) or by the accepted length, 1 to K + 1 (speculative)."""
        b, k = shape.batch, max(shape.topk, 1)
        grown = torch.randint(1, k + 2, (b,), generator=g).to(device) if spec else 1
        new_seq_lens = self.seq_lens + grown
        tokens = torch.randint(0, 150_000, (b,), generator=g).to(device)
        hidden = None
        if shape.hidden:
            hidden = (
                torch.randn((b, shape.hidden), generator=g)
                .to(torch.bfloat16)
                .to(device)
            )
        self.values = {
            "next_token_ids": tokens,
            "bonus_tokens": tokens,
            "output_tokens": tokens,
            "topk_p": torch.rand((b, k), generator=g).to(device),
            "topk_index": torch.randint(0, 150_000, (b, k), generator=g).to(device),
            "hidden_states": hidden,
            "new_seq_lens": new_seq_lens,
        }
        for names, kwargs in self._views:
            kwargs.update((n, self.values[n]) for n in names)

    def advance(self) -> None:
        """After a step: its new lengths are the next step's lengths."""
        new_seq_lens = self.values["new_seq_lens"]
        assert new_seq_lens is not None
        self.seq_lens = new_seq_lens

    def view(self, names: Sequence[str], owner: str) -> dict[str, torch.Tensor | None]:
        """The values ``owner`` takes, as a keyword dict that ``renew`` keeps current:
        a timed call only unpacks it, the same cost on both sides."""
        missing = [n for n in names if n not in self.values]
        if missing:
            raise LookupError(
                f"{owner} takes {', '.join(missing)}, which the bench's "
                f"workload does not produce (it has {', '.join(self.values)})"
            )
        kwargs = {n: self.values[n] for n in names}
        self._views.append((tuple(names), kwargs))
        return kwargs


# ---------------------------------------------------------------------------
# One side, driven step by step


@attrs.define
class Side:
    """One implementation at one shape: its map, its batch and its step, call by call.

    A step is one overlap iteration as an engine drives it: placeholders where the
    design has them (``invalidate``), the forward-side ``resolve_future``, the
    mid-forward ``publish``, the end-of-forward ``stash`` (building the payload
    included: an engine builds one per forward), then the scheduler's resolve of
    the published lengths, or its own ``seq_lens + 1`` where none are relayed.
    """

    name: str
    map: Any
    batch: Batch
    calls: tuple[tuple[str, Callable[[], None]], ...]

    def step(self) -> None:
        for _, call in self.calls:
            call()

    def buffers(self) -> dict[str, torch.Tensor]:
        return {
            k: v
            for k, v in sorted(vars(self.map).items())
            if k.endswith("_buf") and isinstance(v, torch.Tensor)
        }


def _schedule_resolves(relay_map: Any) -> list[str]:
    return sorted(
        n
        for n in dir(type(relay_map))
        if n.startswith("resolve_") and n != "resolve_future"
    )


def _after_indices(method: Callable[..., Any]) -> list[str]:
    params = list(inspect.signature(method).parameters)
    return params[1:]  # bound method: (indices, ...)


def build_side(
    name: str, relay_map: Any, work: Workload, *, payload_cls: type[Any] | None
) -> Side:
    """Wire ``relay_map`` to a fresh batch over ``work``'s tensors, then prime it with
    one stash so the first resolve has rows to read and lazy buffers exist.

    ``payload_cls`` is the generated payload class; ``None`` for a baseline, whose
    ``stash`` takes the same fields as keywords.
    """
    owner = type(relay_map).__name__
    batch = Batch.new(work.indices, work.seq_lens)
    indices = work.indices
    calls: list[tuple[str, Callable[[], None]]] = []
    if hasattr(relay_map, "invalidate"):
        calls.append(
            ("invalidate", functools.partial(relay_map.invalidate, batch, indices))
        )
    calls.append(("resolve_future", functools.partial(relay_map.resolve_future, batch)))
    if hasattr(relay_map, "publish"):
        publish, values = (
            relay_map.publish,
            work.view(_after_indices(relay_map.publish), f"{owner}.publish"),
        )

        def publish_call() -> None:
            publish(indices, **values)

        calls.append(("publish", publish_call))
    stash = relay_map.stash
    if payload_cls is not None:
        make = payload_cls
        payload = work.view([f.name for f in attrs.fields(make)], make.__name__)

        def stash_call() -> None:
            stash(indices, make(**payload))
    else:
        fields = work.view(_after_indices(stash), f"{owner}.stash")

        def stash_call() -> None:
            stash(indices, **fields)

    calls.append(("stash", stash_call))
    resolves = _schedule_resolves(relay_map)
    for resolve in resolves:
        calls.append((resolve, functools.partial(getattr(relay_map, resolve), batch)))
    if not resolves:
        calls.append(
            ("scheduler: seq_lens + 1", functools.partial(advance_seq_lens, batch))
        )
    stash_call()
    return Side(name, relay_map, batch, tuple(calls))


def baseline_side(
    pair: Pair, shape: Shape, device: torch.device, work: Workload
) -> Side:
    """The baseline of ``pair`` at ``shape``, primed."""
    return build_side(
        "baseline", pair.new_baseline(device, shape), work, payload_cls=None
    )


def generated_side(
    generated: Generated,
    shape: Shape,
    device: torch.device,
    work: Workload,
    *,
    debug: bool = False,
) -> Side:
    """The generated map at ``shape``, primed; built with ``debug=debug``."""
    return build_side(
        "generated+debug" if debug else "generated",
        generated.new_map(device, shape, debug=debug),
        work,
        payload_cls=generated.payload_cls,
    )


def sides_for(
    pair: Pair,
    generated: Generated,
    shape: Shape,
    device: torch.device,
    work: Workload,
    *,
    debug: bool = False,
) -> tuple[Side, Side]:
    """The baseline and the generated side of ``pair`` at ``shape``."""
    return (
        baseline_side(pair, shape, device, work),
        generated_side(generated, shape, device, work, debug=debug),
    )


# ---------------------------------------------------------------------------
# Same values


def observed(side: Side, both_relay_seq_lens: bool) -> Iterator[tuple[str, object]]:
    batch = side.batch
    yield "next tokens", batch.next_tokens()
    spec = batch.spec_info
    for name in ("topk_p", "topk_index", "hidden_states"):
        yield f"spec_info.{name}", getattr(spec, name)
    if both_relay_seq_lens:
        yield "seq_lens", batch.seq_lens
    yield "seq_lens_cpu", batch.seq_lens_cpu
    yield "seq_lens_sum", batch.seq_lens_sum


def same_value(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.device == b.device
            and bool(torch.equal(a, b))
        )
    return type(a) is type(b) and a == b


def compare_values(
    pair: Pair,
    generated: Generated,
    shape: Shape,
    device: torch.device,
    *,
    steps: int,
    seed: int = 0,
    debug: bool = False,
) -> list[str]:
    """Drive both sides through ``steps`` steps with fresh outputs each step and list
    every difference in what the next forward and the scheduler see (empty: none).

    The first stash carries no hidden state, so lazy allocation is compared too.
    Buffers of the same name are compared with debug off (debug mode poisons
    consumed rows by design).
    """
    g = torch.Generator().manual_seed(seed)
    work = Workload.random(shape, device, g, spec=pair.spec)
    work.values["hidden_states"] = None  # before any view: the priming stash omits it
    base, gen = sides_for(pair, generated, shape, device, work, debug=debug)
    both = bool(_schedule_resolves(base.map)) and bool(_schedule_resolves(gen.map))
    problems: list[str] = []
    where = f"{pair.schema} {shape.label}{' debug' if debug else ''}"
    for step in range(steps):
        work.renew(shape, device, g, spec=pair.spec)
        base.step()
        gen.step()
        work.advance()
        want, got = dict(observed(base, both)), dict(observed(gen, both))
        problems += [
            f"{where} step {step}: {key} differs (baseline {want[key]!r:.60}, "
            f"generated {got[key]!r:.60})"
            for key in want
            if not same_value(want[key], got[key])
        ]
        if not debug:
            gen_bufs = gen.buffers()
            problems += [
                f"{where} step {step}: {key} differs"
                for key, buf in base.buffers().items()
                if key in gen_bufs and not same_value(buf, gen_bufs[key])
            ]
    return problems
