"""The sides ``relay bench`` compares, and one driver of a step for all of them."""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import attrs
import torch

from relay.bench import baseline as hand
from relay.schema import Field, Schema

__all__ = ["PAIRS", "SEQ_LENS_PLUS_ONE", "SPEC_READS", "Batch", "Generated", "Pair"]
__all__ += ["Shape", "Side", "Workload", "advance_seq_lens", "buffer_bytes", "same"]
__all__ += ["compare_values", "differences", "discover", "new_batch", "observed"]
__all__ += ["pair_sides"]

#: Resolves no decode step calls.
LEFT_OUT = ("resolve_confidence_cpu", "resolve_tails")
#: The driver's own step where a map relays no lengths.
SEQ_LENS_PLUS_ONE = "seq_lens + 1"


@attrs.frozen
class Shape:
    """Pool P, batch B <= P - 1 (row 0 is scratch); speculative: top-k K, bf16 hidden H."""

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
    """A bundled schema, its baseline and ``design``, said in the report."""

    schema: str
    baseline: type[Any]
    design: str
    spec: bool
    hidden: bool = True
    graph: bool = False

    @property
    def name(self) -> str:
        return f"{self.schema}/graph" if self.graph else self.schema

    def graph_fields(self) -> list[Field]:
        fields = Schema.bundled(self.schema).fields if self.graph else ()
        return [f for f in fields if isinstance(f, Field) and f.graph_written]


_TOKENS = "tokens gathered; host seq_lens + 1"
_EAGLE = "bonus token, top-k, hidden gathered; seq_lens relayed, to the host, summed"
_SGLANG = "sglang 0.5.23, by spec_info.future_indices: "
_NGRAM = "accepted drafts and counts gathered; seq_lens relayed, to the host, summed"
#: Every compared pair, in report order.
PAIRS: tuple[Pair, ...] = (
    Pair("decode", hand.DecodeBaseline, _TOKENS, spec=False),
    Pair("decode_seq_lens", hand.DecodeSeqLensBaseline,
         "token placeholders; seq_lens relayed, to the host, summed", spec=False),
    Pair("eagle", hand.EagleBaseline, _EAGLE, spec=True),
    Pair("eagle_packed", hand.EagleBaseline, _EAGLE, spec=True),
    Pair("eagle_draft_probs", hand.EagleBaseline, _EAGLE + "; draft_probs: none given", spec=True),
    Pair("eagle_dsa", hand.EagleBaseline, _EAGLE + "; DSA top-k: none given", spec=True),
    Pair("eagle_multilayer", hand.EagleBaseline, _EAGLE.replace(", hidden", ""), spec=True, hidden=False),
    Pair("eagle_confidence", hand.EagleConfidenceBaseline, _EAGLE + "; K confidences relayed, to the host", spec=True),
    Pair("sglang_decode", hand.DecodeBaseline, "sglang 0.5.23: " + _TOKENS, spec=False),
    Pair("sglang_eagle", hand.SglangEagleBaseline, _SGLANG + _EAGLE, spec=True),
    Pair("sglang_eagle", hand.SglangEagleBaseline,
         _SGLANG + _EAGLE + "; seq_lens and bonus token written by a captured graph",
         spec=True, graph=True),
    Pair("sglang_ngram", hand.NgramBaseline, _SGLANG + _NGRAM, spec=True, hidden=False),
)  # fmt: skip


@attrs.frozen
class Generated:
    map_cls: type[Any]
    payload_cls: type[Any]


def discover(
    schemas: Sequence[str] | None = None,
) -> tuple[list[tuple[Pair, Generated]], list[tuple[Pair, str]]]:
    """The pairs whose generated module exists, and those skipped with the reason."""
    found, skipped = [], []
    for pair in [p for p in PAIRS if schemas is None or p.schema in schemas]:
        try:
            module = importlib.import_module(f"relay.maps.{pair.schema}")
        except ImportError as error:
            skipped.append((pair, str(error)))
            continue
        # A generated module exports one map, one payload and its batch Protocols.
        exported = [getattr(module, name) for name in module.__all__]
        (map_cls,) = [c for c in exported if c.__name__.endswith("FutureMap")]
        (payload_cls,) = [c for c in exported if c.__name__.endswith("Payload")]
        found.append((pair, Generated(map_cls, payload_cls)))
    return found, skipped


#: What a resolve hands the next forward through the batch's draft input.
SPEC_READS: tuple[str, ...] = ("topk_p", "topk_index", "hidden_states", "draft_probs")
SPEC_READS += ("dsa_topk_indices", "draft_confidence", "accept_tokens", "accept_lens")


#: A scheduler batch: every attribute the maps read and write in a decode step.
Batch = types.SimpleNamespace


def new_batch(indices: torch.Tensor, seq_lens: torch.Tensor) -> Batch:
    """A batch whose draft input holds the slots, bonus tokens and ``SPEC_READS``."""
    host = seq_lens.cpu().clone()
    spec_info = Batch(
        future_indices=indices, bonus_tokens=None,
        future_dsa_topk_indices_available=False, **dict.fromkeys(SPEC_READS),
    )  # fmt: skip
    return Batch(
        req_pool_indices=indices, req_pool_indices_cpu=indices.cpu(),
        input_ids=torch.zeros_like(indices), seq_lens=seq_lens.clone(),
        seq_lens_cpu=host, seq_lens_sum=int(host.sum()), spec_info=spec_info,
        reqs=indices.cpu(),  # a request id per row (a map's owners, debug mode)
        beam_tail=None,  # no member rows past them (sglang_decode's owners)
    )  # fmt: skip


def advance_seq_lens(batch: Batch) -> None:
    """The scheduler's own ``seq_lens + 1`` where no lengths are relayed."""
    batch.seq_lens_cpu = batch.seq_lens_cpu + 1
    batch.seq_lens_sum += batch.seq_lens_cpu.shape[0]


@attrs.define
class Workload:
    """One step's tensors by payload field or ``publish`` keyword."""

    indices: torch.Tensor
    seq_lens: torch.Tensor
    values: dict[str, torch.Tensor | None] = attrs.field(factory=dict)
    _handed: list[tuple[dict[str, Any], list[str], frozenset[str]]] = attrs.field(factory=list)  # fmt: skip

    @staticmethod
    def random(shape: Shape, device: torch.device, seed: int) -> Workload:
        g = torch.Generator().manual_seed(seed)
        indices = torch.randperm(shape.pool - 1, generator=g)[: shape.batch] + 1
        seq_lens = torch.randint(1, 30_000, (shape.batch,), generator=g)
        w = Workload(indices.to(device), seq_lens.to(device))
        w.renew(shape, g)
        return w

    def renew(self, shape: Shape, g: torch.Generator) -> None:
        """New outputs of the same requests; with a top-k, lengths grow by 1 to K + 1."""
        b, k, device = shape.batch, max(shape.topk, 1), self.indices.device

        def ints(high: int, *size: int) -> torch.Tensor:
            return torch.randint(0, high, size, generator=g).to(device)

        grown = torch.randint(1, k + 2, (b,), generator=g) if shape.topk else 1
        tokens = ints(150_000, b)
        hidden = torch.randn((b, shape.hidden), generator=g).to(torch.bfloat16)
        self.values = {
            "next_token_ids": tokens,
            "bonus_tokens": tokens,
            "topk_p": torch.rand((b, k), generator=g).to(device),
            "topk_index": ints(150_000, b, k),
            "draft_confidence": torch.rand((b, k), generator=g).to(device),
            "hidden_states": hidden.to(device) if shape.hidden else None,
            # Extras no bundled step relays: the maps that declare them get None.
            **dict.fromkeys(("draft_probs", "dsa_topk_indices", "confidence")),
            # n-gram: K drafts per request, left-aligned, and how many were accepted.
            "accept_tokens": ints(150_000, b, k),
            "accept_lens": ints(k + 1, b).to(torch.int32),
            "new_seq_lens": (self.seq_lens.cpu() + grown).to(device),
        }
        for ns, names, nones in self._handed:
            ns.update((n, None if n in nones else self.values[n]) for n in names)

    def bind(
        self, ns: dict[str, Any], names: Sequence[str], owner: str,
        nones: Collection[str] = (),
    ) -> str:  # fmt: skip
        """``names``' values (``nones``: None) into ``ns``, which ``renew`` keeps
        current; their keywords spelled out, as an engine spells a call."""
        missing = ", ".join(n for n in names if n not in self.values)
        if missing:
            raise LookupError(f"{owner} takes {missing}: not in the workload")
        self._handed.append((ns, list(names), frozenset(nones)))
        ns.update((n, None if n in nones else self.values[n]) for n in names)
        return ", ".join(f"{n}={n}" for n in names)


@attrs.define
class Side:
    """A map, its batch, its step's calls; ``graph``: the write ``check_step`` adds."""

    map: Any
    batch: Batch
    calls: tuple[tuple[str, Callable[[], None]], ...]
    graph: Callable[[], None] | None = None
    run: Callable[[], None] | None = None  # the calls in one function: no frame each

    def step(self) -> None:
        if self.run is not None:
            return self.run()
        for _, call in self.calls:
            call()

    def check_step(self) -> None:
        for name, call in self.calls:
            if name == "graph_wrote" and self.graph is not None:
                self.graph()
            call()


def _keywords(method: Callable[..., Any], after: int = 1) -> list[str]:
    """``method``'s parameters after its first ``after`` (the indices), but ``owners``."""
    return [p for p in inspect.signature(method).parameters if p != "owners"][after:]


def build_side(
    relay_map: Any, work: Workload, payload_cls: type[Any] | None, pair: Pair
) -> Side:
    """``relay_map``'s step in an engine's order (docs/bench.md, how a step is driven),
    primed with one stash; ``payload_cls``: None for a baseline (keyword stash)."""
    owner, indices, m = type(relay_map).__name__, work.indices, relay_map
    graph = pair.graph_fields()
    batch = new_batch(indices, work.seq_lens)
    nones = [f.payload_name for f in graph] if payload_cls is not None else []
    ns: dict[str, Any] = {"batch": batch, "_i": indices, "_make": payload_cls, "_advance": advance_seq_lens}  # fmt: skip
    calls = []  # (method, the call as an engine writes it)
    if hasattr(m, "invalidate"):
        calls.append(("invalidate", "_invalidate(batch, _i)"))
    calls.append(("resolve_future", "_resolve_future(batch)"))
    if graph and payload_cls is not None:
        calls.append(("graph_wrote", "_graph_wrote(_i)"))
    elif graph:
        words = work.bind(ns, _keywords(m.graph_wrote, 0), owner)
        calls.append(("graph_wrote", f"_graph_wrote({words})"))
    if hasattr(m, "publish"):
        words = work.bind(ns, _keywords(m.publish), f"{owner}.publish", nones)
        calls.append(("publish", f"_publish(_i, {words})"))
    make = payload_cls  # None: a baseline's stash takes the values as keywords
    keys = [f.name for f in attrs.fields(make)] if make else _keywords(m.stash)
    words = work.bind(ns, keys, make.__name__ if make else f"{owner}.stash", nones)
    calls.append(("stash", f"_stash(_i, _make({words}))" if make else f"_stash(_i, {words})"))  # fmt: skip
    names, skip = sorted(dir(type(m))), ("resolve_future", *LEFT_OUT)
    calls += [(n, f"_{n}(batch)") for n in names if n.startswith("resolve_") and n not in skip]  # fmt: skip
    if calls[-1][0] == "stash":  # no resolve: the scheduler's own seq_lens + 1
        calls.append((SEQ_LENS_PLUS_ONE, "_advance(batch)"))
    ns.update((f"_{n}", getattr(m, n)) for n, _ in calls if n != SEQ_LENS_PLUS_ONE)
    source = [f"def _m{k}(): {call}" for k, (_, call) in enumerate(calls)]
    source.append(f"def _step(): {'; '.join(call for _, call in calls)}")
    exec(compile("\n".join(source), f"<relay bench: {owner}'s step>", "exec"), ns)  # noqa: S102
    methods = tuple((n, ns[f"_m{k}"]) for k, (n, _) in enumerate(calls))
    side = Side(m, batch, methods, run=ns["_step"])
    if graph:  # the graph writes the map's buffers, then the priming stash follows
        targets = [(getattr(m, f"{f.name}_buf"), f.payload_name) for f in graph]

        def write() -> None:
            for buf, value in targets:
                buf.index_copy_(0, work.indices, work.values[value])

        side.graph = write
        write()
        dict(methods)["graph_wrote"]()
    dict(methods)["stash"]()
    return side


def pair_sides(pair: Pair, generated: Generated, shape: Shape, device: torch.device,
               work: Workload, *, debug: bool = False) -> tuple[Side, Side]:  # fmt: skip
    """The baseline's side and the generated map's (``debug``: in debug mode)."""
    base = build_side(_new(pair.baseline, pair, shape, device), work, None, pair)
    relay_map = _new(generated.map_cls, pair, shape, device, debug=debug)
    return base, build_side(relay_map, work, generated.payload_cls, pair)


def _new(cls: Any, pair: Pair, shape: Shape, device: torch.device, **kw: Any) -> Any:
    """``cls`` at ``shape``, given its eager dims and the buffers the graph writes."""
    dims = {"topk": shape.topk, "draft_tokens": shape.topk, "hidden": shape.hidden}
    params = inspect.signature(cls).parameters.items()
    kw.update((n, dims[n]) for n, p in params if p.kind is p.KEYWORD_ONLY and n in dims)
    for f in pair.graph_fields():
        kw[f"{f.name}_buf"] = torch.zeros(shape.pool, dtype=f.dtype, device=device)  # type: ignore[arg-type]
    return cls(device, shape.pool, **kw)


def buffer_bytes(relay_map: Any, fields: Sequence[str]) -> int:
    """Bytes of the ``<field>_buf`` buffers, a shared storage counted once."""
    bufs = [getattr(relay_map, f"{name}_buf", None) for name in fields]
    storages = [b.untyped_storage() for b in bufs if isinstance(b, torch.Tensor)]
    return sum({s.data_ptr(): s.nbytes() for s in storages}.values())


def observed(batch: Batch) -> Iterator[tuple[str, object]]:
    """What the next forward and the scheduler read from ``batch``."""
    spec = batch.spec_info
    tokens = spec.bonus_tokens if spec.bonus_tokens is not None else batch.input_ids
    yield "next tokens", tokens
    for name in SPEC_READS:
        yield f"spec_info.{name}", getattr(spec, name)
    for name in ("seq_lens", "seq_lens_cpu", "seq_lens_sum"):
        yield name, getattr(batch, name)
    yield "draft_confidence_cpu", getattr(batch, "draft_confidence_cpu", None)


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same_kind = (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device)
        return same_kind and bool(torch.equal(a, b))
    return type(a) is type(b) and a == b


def differences(want: Batch, got: Batch) -> list[tuple[str, object, object]]:
    """Each value the next forward or the scheduler reads that ``got`` holds otherwise."""
    both = zip(observed(want), observed(got))
    return [(key, a, b) for (key, a), (_, b) in both if not same(a, b)]


def compare_values(pair: Pair, generated: Generated, shape: Shape, device: torch.device,
                   *, steps: int, seed: int = 0, debug: bool = False) -> list[str]:  # fmt: skip
    """What the next forward and the scheduler read that differs, over fresh steps."""
    work = Workload.random(shape, device, seed)
    work.values["hidden_states"] = None  # before any side takes it: the priming stash
    base, gen = pair_sides(pair, generated, shape, device, work, debug=debug)
    g = torch.Generator().manual_seed(seed + 1)
    problems = []
    where = f"{pair.name} {shape.label}{' debug' if debug else ''}"
    for step in range(steps):
        work.renew(shape, g)
        base.check_step()
        gen.check_step()
        assert work.values["new_seq_lens"] is not None
        work.seq_lens = work.values["new_seq_lens"]
        problems += [
            f"{where} step {step}: {key} differs (baseline {a!r:.60}, generated {b!r:.60})"
            for key, a, b in differences(base.batch, gen.batch)
        ]
    return problems
