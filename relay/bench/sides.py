"""The sides ``relay bench`` compares, and one driver of a step for all of them: it
reads a map's public interface (payload fields, ``publish`` keywords, ``invalidate``,
schedule-side resolves), so a schema that changes design is still driven correctly."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import torch

from relay.bench.baseline import DecodeBaseline, DecodeSeqLensBaseline, EagleBaseline

__all__ = ["PAIRS", "Generated", "Pair", "Shape", "Workload", "build_side"]
__all__ += ["compare_values", "discover", "observed", "same"]


@attrs.frozen
class Shape:
    """Pool P, batch B and, for speculative maps, top-k K and hidden H (bf16; 0: the
    hidden state is not relayed). Row 0 is scratch: B is at most P - 1."""

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
    #: Speculative: shapes have K and H, and lengths grow by the accepted length.
    spec: bool

    def new_baseline(self, device: torch.device, shape: Shape) -> Any:
        if self.spec:
            return self.baseline(device, shape.pool, topk=shape.topk)
        return self.baseline(device, shape.pool)


_TOKENS = "tokens gathered; host seq_lens + 1"
_SEQ_LENS = "token placeholders; seq_lens relayed, to the host, summed"
_EAGLE = "bonus token, top-k, hidden gathered; seq_lens relayed, to the host, summed"
#: Every compared pair, in report order.
PAIRS: tuple[Pair, ...] = (
    Pair("decode", DecodeBaseline, _TOKENS, spec=False),
    Pair("decode_seq_lens", DecodeSeqLensBaseline, _SEQ_LENS, spec=False),
    Pair("eagle", EagleBaseline, _EAGLE, spec=True),
    Pair("eagle_packed", EagleBaseline, _EAGLE, spec=True),
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

    def new_map(self, device: torch.device, shape: Shape, *, debug: bool) -> Any:
        """The map at ``shape``, its eager symbolic dims (``topk``) taken from it."""
        dims = {"topk": shape.topk, "hidden": shape.hidden}
        params = inspect.signature(self.map_cls).parameters.items()
        kwargs = {
            name: dims[name]
            for name, p in params
            if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "debug"
        }
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

    bonus_tokens: torch.Tensor | None = None
    topk_p: torch.Tensor | None = None
    topk_index: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


@attrs.define(slots=False)
class Batch:
    """A scheduler batch with every attribute the maps read and write."""

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
            int(host.sum()),
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
    _handed: list[dict[str, torch.Tensor | None]] = attrs.field(factory=list)

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
        self.values = {
            "next_token_ids": tokens.to(device),
            "bonus_tokens": tokens.to(device),
            "topk_p": torch.rand((b, k), generator=g).to(device),
            "topk_index": torch.randint(0, 150_000, (b, k), generator=g).to(device),
            "hidden_states": hidden.to(device) if shape.hidden else None,
            "new_seq_lens": (self.seq_lens.cpu() + grown).to(device),
        }
        for handed in self._handed:
            handed.update((n, self.values[n]) for n in handed)

    def kwargs(
        self, names: Sequence[str], owner: str
    ) -> dict[str, torch.Tensor | None]:
        missing = [n for n in names if n not in self.values]
        if missing:
            raise LookupError(
                f"{owner} takes {', '.join(missing)}: not in the workload"
            )
        handed = {n: self.values[n] for n in names}
        self._handed.append(handed)
        return handed


@attrs.define
class Side:
    """One map at one shape, its batch, and one step as an engine drives it:
    ``invalidate`` (if the design has placeholders), ``resolve_future``, ``publish``,
    ``stash`` (building the payload), then the scheduler's resolve of the lengths, or
    its own ``seq_lens + 1`` where none are relayed."""

    name: str
    map: Any
    batch: Batch
    calls: tuple[tuple[str, Callable[[], None]], ...]

    def step(self) -> None:
        for _, call in self.calls:
            call()


def _resolves(relay_map: Any) -> list[str]:
    names = dir(type(relay_map))
    return sorted(
        n for n in names if n.startswith("resolve_") and n != "resolve_future"
    )


def _after_indices(method: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(method).parameters)[1:]


def build_side(
    name: str, relay_map: Any, work: Workload, payload_cls: type[Any] | None
) -> Side:
    """Wire ``relay_map`` to a fresh batch over ``work``, primed with one stash.
    ``payload_cls`` is the generated payload class; None for a baseline, whose
    ``stash`` takes the fields as keywords."""
    owner, indices = type(relay_map).__name__, work.indices
    batch = Batch.new(indices, work.seq_lens)
    calls: list[tuple[str, Callable[[], None]]] = []
    if hasattr(relay_map, "invalidate"):
        calls.append(
            ("invalidate", functools.partial(relay_map.invalidate, batch, indices))
        )
    calls.append(("resolve_future", functools.partial(relay_map.resolve_future, batch)))
    if hasattr(relay_map, "publish"):
        publish = relay_map.publish
        published = work.kwargs(_after_indices(publish), f"{owner}.publish")
        calls.append(("publish", lambda: publish(indices, **published)))
    stash = relay_map.stash
    if payload_cls is not None:
        make = payload_cls
        fields = work.kwargs([f.name for f in attrs.fields(make)], make.__name__)

        def stash_call() -> None:
            stash(indices, make(**fields))
    else:
        keywords = work.kwargs(_after_indices(stash), f"{owner}.stash")

        def stash_call() -> None:
            stash(indices, **keywords)

    calls.append(("stash", stash_call))
    resolves = _resolves(relay_map)
    calls += [(r, functools.partial(getattr(relay_map, r), batch)) for r in resolves]
    if not resolves:
        calls.append(("seq_lens + 1", functools.partial(advance_seq_lens, batch)))
    stash_call()
    return Side(name, relay_map, batch, tuple(calls))


def observed(batch: Batch, with_seq_lens: bool) -> Iterator[tuple[str, object]]:
    """What the next forward and the scheduler read from ``batch``."""
    spec = batch.spec_info
    yield (
        "next tokens",
        spec.bonus_tokens if spec.bonus_tokens is not None else batch.input_ids,
    )
    for name in ("topk_p", "topk_index", "hidden_states"):
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
    base = build_side("baseline", pair.new_baseline(device, shape), work, None)
    gen_map = generated.new_map(device, shape, debug=debug)
    gen = build_side("generated", gen_map, work, generated.payload_cls)
    both = bool(_resolves(base.map)) and bool(_resolves(gen.map))
    g = torch.Generator().manual_seed(seed + 1)
    problems = []
    where = f"{pair.schema} {shape.label}{' debug' if debug else ''}"
    for step in range(steps):
        work.renew(shape, g, spec=pair.spec)
        base.step()
        gen.step()
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
