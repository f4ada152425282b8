"""The sides ``relay bench`` compares, and one driver of a step for all of them: it
reads a map's public interface (payload fields, ``publish`` keywords, ``invalidate``,
schedule-side resolves), so a schema that changes design is still driven correctly."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import attrs
import torch

from relay.bench.baseline import (
    DecodeBaseline,
    DecodeSeqLensBaseline,
    EagleBaseline,
    NgramBaseline,
    SglangEagleBaseline,
)
from relay.schema import Field, Schema

__all__ = ["PAIRS", "Generated", "Pair", "Shape", "Workload", "build_side"]
__all__ += ["compare_values", "discover", "generated_side", "observed", "pair_sides"]
__all__ += ["relays_seq_lens", "same"]


@attrs.frozen
class Shape:
    """Pool P, batch B and, for speculative maps, top-k K (n-gram: drafts per request)
    and hidden H (bf16; 0: the hidden state is not relayed). Row 0 is scratch: B is at
    most P - 1."""

    pool: int
    batch: int
    topk: int = 0
    hidden: int = 0

    @property
    def label(self) -> str:
        text = f"P={self.pool} B={self.batch}"
        return text + (f" K={self.topk} H={self.hidden}" if self.topk else "")


@attrs.frozen
class Pair:
    """One bundled schema and the hand-written map an engine would keep instead."""

    schema: str
    baseline: type[Any]
    #: One line for the report: what the baseline does.
    design: str
    #: Speculative: shapes have K (and H), and lengths grow by the accepted length.
    spec: bool
    #: Relays a hidden state: shapes have H (a speculative map without one has H = 0).
    hidden: bool = True
    #: Methods an engine does not call in a decode step (``resolve_tails``: a mixed
    #: batch's; ``resolve_confidence_cpu``: a ragged verify's), left out of the step.
    left_out: tuple[str, ...] = ()
    #: A captured verify graph writes the schema's ``graph_written`` fields: both maps
    #: adopt buffers for them, the step declares the graph's write (``graph_wrote``)
    #: and hands the generated map ``None`` for those values, the baseline the very
    #: tensors the graph wrote; neither scatters them.
    graph: bool = False

    @property
    def name(self) -> str:
        """The pair in the report: the schema, ``/graph`` for a graph-written step."""
        return f"{self.schema}/graph" if self.graph else self.schema

    def new_baseline(
        self,
        device: torch.device,
        shape: Shape,
        adopted: dict[str, torch.Tensor] | None = None,
    ) -> Any:
        params = inspect.signature(self.baseline).parameters
        kwargs: dict[str, Any] = dict(adopted or {})
        if "topk" in params:
            kwargs["topk"] = shape.topk
        return self.baseline(device, shape.pool, **kwargs)

    def graph_fields(self) -> list[Field]:
        """The fields the captured graph writes (none unless ``graph``)."""
        if not self.graph:
            return []
        schema = Schema.bundled(self.schema)
        return [f for f in schema.fields if isinstance(f, Field) and f.graph_written]


_TOKENS = "tokens gathered; host seq_lens + 1"
_SEQ_LENS = "token placeholders; seq_lens relayed, to the host, summed"
_EAGLE = "bonus token, top-k, hidden gathered; seq_lens relayed, to the host, summed"
_SGLANG_EAGLE = "sglang 0.5.23, by spec_info.future_indices: " + _EAGLE
_SGLANG_GRAPH = _SGLANG_EAGLE + "; seq_lens and bonus token written by a captured graph"
_SGLANG_NGRAM = (
    "sglang 0.5.23, by spec_info.future_indices: accepted drafts and counts gathered; "
    "seq_lens relayed, to the host, summed"
)
_NOT_IN_A_DECODE_STEP = ("resolve_confidence_cpu", "resolve_tails")
#: Every compared pair, in report order.
PAIRS: tuple[Pair, ...] = (
    Pair("decode", DecodeBaseline, _TOKENS, spec=False),
    Pair("decode_seq_lens", DecodeSeqLensBaseline, _SEQ_LENS, spec=False),
    Pair("eagle", EagleBaseline, _EAGLE, spec=True),
    Pair("eagle_packed", EagleBaseline, _EAGLE, spec=True),
    Pair("sglang_decode", DecodeBaseline, "sglang 0.5.23: " + _TOKENS, spec=False),
    Pair(
        "sglang_eagle",
        SglangEagleBaseline,
        _SGLANG_EAGLE,
        spec=True,
        left_out=_NOT_IN_A_DECODE_STEP,
    ),
    Pair(
        "sglang_eagle",
        SglangEagleBaseline,
        _SGLANG_GRAPH,
        spec=True,
        left_out=_NOT_IN_A_DECODE_STEP,
        graph=True,
    ),
    Pair(
        "sglang_ngram",
        NgramBaseline,
        _SGLANG_NGRAM,
        spec=True,
        hidden=False,
        left_out=_NOT_IN_A_DECODE_STEP,
    ),
)


@attrs.frozen
class Generated:
    """A generated map module: its FutureMap and Payload classes."""

    map_cls: type[Any]
    payload_cls: type[Any]

    @staticmethod
    def load(schema: str) -> Generated:
        """``relay.maps.<schema>``; ImportError if it is not generated."""
        module = importlib.import_module(f"relay.maps.{schema}")
        names: Sequence[str] = getattr(module, "__all__", dir(module))
        maps = [n for n in names if n.endswith("FutureMap")]
        payloads = [n for n in names if n.endswith("Payload")]
        if len(maps) != 1 or len(payloads) != 1:
            raise ImportError(f"relay.maps.{schema}: not one FutureMap and one Payload")
        return Generated(getattr(module, maps[0]), getattr(module, payloads[0]))

    def new_map(
        self,
        device: torch.device,
        shape: Shape,
        *,
        debug: bool,
        adopted: dict[str, torch.Tensor] | None = None,
    ) -> Any:
        """The map at ``shape``, its eager symbolic dims (``topk``) taken from it, on
        the ``adopted`` buffers a captured graph writes (``<field>_buf``)."""
        dims: dict[str, Any] = {"topk": shape.topk, "hidden": shape.hidden}
        params = inspect.signature(self.map_cls).parameters.items()
        kwargs = {
            name: dims[name]
            for name, p in params
            if p.kind is inspect.Parameter.KEYWORD_ONLY and name in dims
        }
        kwargs.update(adopted or {})
        return self.map_cls(device, shape.pool, debug=debug, **kwargs)


def discover(
    schemas: Sequence[str] | None = None,
) -> tuple[list[tuple[Pair, Generated]], list[tuple[Pair, str]]]:
    """The pairs whose generated module exists, and those skipped with the reason."""
    found, skipped = [], []
    for pair in PAIRS:
        if schemas is None or pair.schema in schemas:
            try:
                found.append((pair, Generated.load(pair.schema)))
            except ImportError as error:
                skipped.append((pair, str(error)))
    return found, skipped


@attrs.define(slots=False)
class SpecInfo:
    """The draft input of a speculative batch."""

    future_indices: torch.Tensor | None = None
    bonus_tokens: torch.Tensor | None = None
    topk_p: torch.Tensor | None = None
    topk_index: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    draft_probs: torch.Tensor | None = None
    dsa_topk_indices: torch.Tensor | None = None
    accept_tokens: torch.Tensor | None = None
    accept_lens: torch.Tensor | None = None


@attrs.define(slots=False)
class Batch:
    """A scheduler batch with every attribute the maps read and write in a decode
    step; its draft input's ``future_indices`` are its ``req_pool_indices``, as in
    sglang's batches."""

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
            indices, indices.cpu(), torch.zeros_like(indices), seq_lens.clone(), host,
            int(host.sum()), SpecInfo(future_indices=indices),
        )  # fmt: skip


def advance_seq_lens(batch: Batch) -> None:
    """The scheduler's own work where plain decoding relays no lengths: each request
    grew by one token (sglang: ``seq_lens + 1`` on the host)."""
    batch.seq_lens_cpu = batch.seq_lens_cpu + 1
    batch.seq_lens_sum += batch.seq_lens_cpu.shape[0]


@attrs.define
class Workload:
    """The tensors of one step for ``shape.batch`` requests, by payload field or
    ``publish`` keyword. ``kwargs`` hands a side the dict it unpacks, kept current."""

    indices: torch.Tensor
    seq_lens: torch.Tensor
    values: dict[str, torch.Tensor | None] = attrs.field(factory=dict)
    _handed: list[tuple[dict[str, torch.Tensor | None], frozenset[str]]] = attrs.field(
        factory=list
    )

    @staticmethod
    def random(
        shape: Shape, device: torch.device, seed: int, *, spec: bool
    ) -> Workload:
        """Distinct slots in 1..P-1 and plausible values; ``renew`` draws the next."""
        g = torch.Generator().manual_seed(seed)
        indices = torch.randperm(shape.pool - 1, generator=g)[: shape.batch] + 1
        seq_lens = torch.randint(1, 30_000, (shape.batch,), generator=g)
        w = Workload(indices.to(device), seq_lens.to(device))
        w.renew(shape, g, spec=spec)
        return w

    def renew(self, shape: Shape, g: torch.Generator, *, spec: bool) -> None:
        """New outputs of the same requests: lengths grow by one token, or by the
        accepted length (1 to K + 1) when speculative."""
        b, k, device = shape.batch, max(shape.topk, 1), self.indices.device
        grown = torch.randint(1, k + 2, (b,), generator=g) if spec else 1
        tokens = torch.randint(0, 150_000, (b,), generator=g)
        hidden = torch.randn((b, shape.hidden), generator=g).to(torch.bfloat16)
        accepted = torch.randint(0, k + 1, (b,), generator=g).to(torch.int32)
        self.values = {
            "next_token_ids": tokens.to(device),
            "bonus_tokens": tokens.to(device),
            "topk_p": torch.rand((b, k), generator=g).to(device),
            "topk_index": torch.randint(0, 150_000, (b, k), generator=g).to(device),
            "hidden_states": hidden.to(device) if shape.hidden else None,
            # Extras no bundled step relays: the maps that declare them get None.
            "draft_probs": None,
            "dsa_topk_indices": None,
            "confidence": None,
            # n-gram: K drafts per request, left-aligned, and how many were accepted.
            "accept_tokens": torch.randint(0, 150_000, (b, k), generator=g).to(device),
            "accept_lens": accepted.to(device),
            "new_seq_lens": (self.seq_lens.cpu() + grown).to(device),
        }
        for handed, nones in self._handed:
            handed.update((n, None if n in nones else self.values[n]) for n in handed)

    def kwargs(
        self, names: Sequence[str], owner: str, nones: Collection[str] = ()
    ) -> dict[str, torch.Tensor | None]:
        """The values ``names`` name, those in ``nones`` handed as None (a value a
        captured graph wrote), kept current by ``renew``."""
        missing = [n for n in names if n not in self.values]
        if missing:
            raise LookupError(
                f"{owner} takes {', '.join(missing)}: not in the workload"
            )
        handed = {n: None if n in nones else self.values[n] for n in names}
        self._handed.append((handed, frozenset(nones)))
        return handed


@attrs.define
class Side:
    """One map at one shape, its batch, and one step as an engine drives it:
    ``invalidate`` (if the design has placeholders), ``resolve_future``, ``graph_wrote``
    (where a captured graph wrote values), ``publish``, ``stash`` (building the
    payload), then the scheduler's resolve of the lengths, or its own ``seq_lens + 1``
    where none are relayed. ``graph`` is the captured graph's own write of this step's
    values into the map's adopted buffers: not the map's work, so ``step`` (what is
    timed) leaves it out and ``check_step`` makes it, before ``graph_wrote``."""

    name: str
    map: Any
    batch: Batch
    calls: tuple[tuple[str, Callable[[], None]], ...]
    graph: Callable[[], None] | None = None

    def step(self) -> None:
        for _, call in self.calls:
            call()

    def check_step(self) -> None:
        """A step with fresh values: the graph writes them first where one does."""
        for name, call in self.calls:
            if name == "graph_wrote" and self.graph is not None:
                self.graph()
            call()


def _resolves(relay_map: Any, left_out: Collection[str] = ()) -> list[str]:
    names = dir(type(relay_map))
    return sorted(
        n
        for n in names
        if n.startswith("resolve_") and n != "resolve_future" and n not in left_out
    )


def _after_indices(method: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(method).parameters)[1:]


def build_side(
    name: str,
    relay_map: Any,
    work: Workload,
    payload_cls: type[Any] | None,
    *,
    left_out: Collection[str] = (),
    graph: Sequence[tuple[str, str]] = (),
) -> Side:
    """Wire ``relay_map`` to a fresh batch over ``work``, primed with one stash.
    ``payload_cls`` is the generated payload class; None for a baseline, whose
    ``stash`` takes the fields as keywords. ``left_out``: resolves not called.
    ``graph``: (field, value name) of the values a captured graph writes into the
    map's ``<field>_buf``; the generated map is told ``graph_wrote(indices)`` and
    handed None for them, a baseline ``graph_wrote(**values)`` and the values."""
    owner, indices = type(relay_map).__name__, work.indices
    batch = Batch.new(indices, work.seq_lens)
    calls: list[tuple[str, Callable[[], None]]] = []
    nones = [value for _, value in graph] if payload_cls is not None else []
    if hasattr(relay_map, "invalidate"):
        calls.append(
            ("invalidate", functools.partial(relay_map.invalidate, batch, indices))
        )
    calls.append(("resolve_future", functools.partial(relay_map.resolve_future, batch)))
    graph_write = None
    if graph:
        wrote = relay_map.graph_wrote
        if payload_cls is not None:
            calls.append(("graph_wrote", functools.partial(wrote, indices)))
        else:
            names = list(inspect.signature(wrote).parameters)
            graph_values = work.kwargs(names, f"{owner}.graph_wrote")
            calls.append(("graph_wrote", lambda: wrote(**graph_values)))
        targets = [(getattr(relay_map, f"{f}_buf"), value) for f, value in graph]

        def graph_write() -> None:
            for buf, value in targets:
                buf.index_copy_(0, indices, work.values[value])

    if hasattr(relay_map, "publish"):
        publish = relay_map.publish
        published = work.kwargs(_after_indices(publish), f"{owner}.publish", nones)
        calls.append(("publish", lambda: publish(indices, **published)))
    stash = relay_map.stash
    if payload_cls is not None:
        make = payload_cls
        names = [f.name for f in attrs.fields(make)]
        fields = work.kwargs(names, make.__name__, nones)

        def stash_call() -> None:
            stash(indices, make(**fields))
    else:
        keywords = work.kwargs(_after_indices(stash), f"{owner}.stash")

        def stash_call() -> None:
            stash(indices, **keywords)

    calls.append(("stash", stash_call))
    resolves = _resolves(relay_map, left_out)
    calls += [(r, functools.partial(getattr(relay_map, r), batch)) for r in resolves]
    if not resolves:
        calls.append(("seq_lens + 1", functools.partial(advance_seq_lens, batch)))
    if graph_write is not None:  # the priming stash follows a graph's write
        graph_write()
        dict(calls)["graph_wrote"]()
    stash_call()
    return Side(name, relay_map, batch, tuple(calls), graph_write)


def _adopted(pair: Pair, shape: Shape, device: torch.device) -> dict[str, torch.Tensor]:
    """Buffers a captured graph writes (one scalar per slot, as sglang's lengths and
    bonus tokens), allocated by the engine before the map."""
    adopted = {}
    for f in pair.graph_fields():
        assert isinstance(f.dtype, torch.dtype) and not f.shape, f
        adopted[f"{f.name}_buf"] = torch.zeros(shape.pool, dtype=f.dtype, device=device)
    return adopted


def _graph_values(pair: Pair) -> list[tuple[str, str]]:
    return [(f.name, f.payload_name) for f in pair.graph_fields()]


def generated_side(
    pair: Pair,
    generated: Generated,
    shape: Shape,
    device: torch.device,
    work: Workload,
    *,
    debug: bool = False,
    name: str = "generated",
) -> Side:
    """The generated map of ``pair`` at ``shape``, driven as an engine drives it."""
    relay_map = generated.new_map(
        device, shape, debug=debug, adopted=_adopted(pair, shape, device)
    )
    return build_side(
        name,
        relay_map,
        work,
        generated.payload_cls,
        left_out=pair.left_out,
        graph=_graph_values(pair),
    )


def pair_sides(
    pair: Pair,
    generated: Generated,
    shape: Shape,
    device: torch.device,
    work: Workload,
    *,
    debug: bool = False,
) -> tuple[Side, Side]:
    """The baseline's side and the generated map's, over one workload."""
    relay_map = pair.new_baseline(device, shape, _adopted(pair, shape, device))
    base = build_side(
        "baseline", relay_map, work, None, left_out=pair.left_out,
        graph=_graph_values(pair),
    )  # fmt: skip
    return base, generated_side(pair, generated, shape, device, work, debug=debug)


def observed(batch: Batch, with_seq_lens: bool) -> Iterator[tuple[str, object]]:
    """What the next forward and the scheduler read from ``batch``."""
    spec = batch.spec_info
    yield (
        "next tokens",
        spec.bonus_tokens if spec.bonus_tokens is not None else batch.input_ids,
    )
    for name in ("topk_p", "topk_index", "hidden_states", "draft_probs"):
        yield f"spec_info.{name}", getattr(spec, name)
    for name in ("dsa_topk_indices", "accept_tokens", "accept_lens"):
        yield f"spec_info.{name}", getattr(spec, name)
    if with_seq_lens:
        yield "seq_lens", batch.seq_lens
    yield "seq_lens_cpu", batch.seq_lens_cpu
    yield "seq_lens_sum", batch.seq_lens_sum


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same_kind = (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device)
        return same_kind and bool(torch.equal(a, b))
    return type(a) is type(b) and a == b


def relays_seq_lens(side: Side) -> bool:
    """Whether the side's step resolves relayed lengths (else the host adds one)."""
    return all(name != "seq_lens + 1" for name, _ in side.calls)


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
    """Drive the baseline and the generated map through ``steps`` steps with fresh
    outputs each, and list every difference in what the next forward and the scheduler
    read (empty: none). The first stash carries no hidden state, so lazy allocation is
    compared too."""
    work = Workload.random(shape, device, seed, spec=pair.spec)
    work.values["hidden_states"] = None  # before any side takes it: the priming stash
    base, gen = pair_sides(pair, generated, shape, device, work, debug=debug)
    both = relays_seq_lens(base) and relays_seq_lens(gen)
    g = torch.Generator().manual_seed(seed + 1)
    problems = []
    where = f"{pair.name} {shape.label}{' debug' if debug else ''}"
    for step in range(steps):
        work.renew(shape, g, spec=pair.spec)
        base.check_step()
        gen.check_step()
        assert work.values["new_seq_lens"] is not None
        work.seq_lens = work.values["new_seq_lens"]
        want, got = dict(observed(base.batch, both)), dict(observed(gen.batch, both))
        problems += [
            f"{where} step {step}: {key} differs (baseline {want[key]!r:.60}, "
            f"generated {got[key]!r:.60})"
            for key in want
            if not same(want[key], got[key])
        ]
    return problems
