"""How step N's outputs reach step N+1: through a generated map (``MapRelay``, the
overlap loop), or from plain per-slot tensors once step N has finished
(``DirectRelay``, the synchronous baseline). The synchronous run checks the overlap
run, so the two share no hand-over code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import torch
from torch import Tensor

from relay.engine import trace
from relay.engine.batch import ForwardBatch, SpecInfo
from relay.engine.trace import Ranges, no_ranges

if TYPE_CHECKING:  # no map is imported with the engine
    from relay.engine.maps import Maps
    from relay.engine.spec import SpecConfig

# Note [Tracing the fence wait]
# The fence wait is inside the generated resolve_seq_lens_cpu, and ranges never go
# inside generated code (Note [Ranges that cost nothing when off] in
# relay/engine/trace.py), nor does the engine reach into a map's private fence. So
# a traced run's fence-wait range wraps the whole schedule-side resolve, whose time
# is the wait but for one gather and a host copy of a few rows.

# Note [Seeding a prebuilt request]
# A prebuilt request's row is seeded (its first token, and in speculative decoding
# its draft state and length) while a forward may still be in flight on that row for
# the slot's previous owner (a finished request's extra step, a retracted request's
# step). ``seed`` below hands the rows to the map's generated ``seed``, which queues
# them for its next ``resolve_future`` (on the forward stream, behind every launched
# forward: Note [Seeds] in relay/runtime.py); the engine calls it on the forward
# stream too, after releasing the slots freed since the last launch, so neither the
# release nor the lengths' publish lands out of order.

# Note [Graph-written relay buffers]
# A decode step over static buffers (relay/engine/graphs.py) writes the relay's rows
# itself, inside its forward (its CUDA graph, on CUDA), into buffers the engine
# allocates and the overlap map adopts as its graph-written fields' (``Written``;
# docs/schema.md, "Graph-written buffers"), as sglang's verify graph writes its
# bonus tokens and lengths: the map's stash and publish then dispatch no scatter for
# them. Everything but EAGLE's hidden states is written so (the hidden states are a
# lazily allocated optional field, whose buffer the map makes from its first value).
# The step declares the write (``graph_wrote``, debug mode's record) after its first
# phase, before the publish: the scheduler reads the lengths behind the publish's
# fence. EAGLE's draft top-k, which the second phase writes, is declared with them;
# its only reader is the next forward's resolve, on the same stream after the second
# phase. The synchronous relay adopts nothing: its step's stash writes its rows.

__all__ = ["DirectRelay", "Extras", "FutureMap", "LengthsLane", "MapRelay", "Relay"]
__all__ += ["Written", "map_relay"]

#: What a step hands the next besides its tokens: EAGLE's draft (topk_p, topk_index,
#: hidden states), n-gram speculation's accepted drafts (n, draft_token_num) and
#: their counts (n,) int32, or nothing (plain decoding).
Extras = tuple[Tensor, ...]


@attrs.frozen(eq=False)
class Written:
    """The relay rows a decode step over static buffers writes itself, by slot: the
    overlap map's graph-written buffers, which the engine allocates and the map adopts
    (Note [Graph-written relay buffers])."""

    #: (pool_size,) int64: the sampled token (plain decoding) or the bonus token.
    tokens: Tensor
    #: Speculative decoding: (pool_size,) int64, each slot's length after the verify.
    new_seq_lens: Tensor | None = None
    #: EAGLE: (pool_size, topk) the draft's first top-k probabilities and token ids.
    topk_p: Tensor | None = None
    topk_index: Tensor | None = None
    #: n-gram: (pool_size, steps) the accepted drafts (their counts travel with the
    #: step's stash).
    accept_tokens: Tensor | None = None


class Relay(Protocol):
    """The hand-over between steps. On the scheduler: ``resolve_lengths`` sets a decode
    batch's ``seq_lens``, ``seq_lens_cpu`` and ``seq_lens_sum``; ``scheduled`` says a
    batch (any mode) is about to launch, ``seeded`` that prebuilt requests took slots,
    with these lengths. On the forward: ``resolve_future`` first fills a decode batch's
    inputs from the previous forward, ``publish`` hands the new lengths to the
    scheduler mid-forward, ``stash`` hands this step's tokens (and draft state) to the
    next forward, ``release`` says the requests of slots ended (debug maps refuse stale
    reads), and ``seed`` seeds prebuilt requests' rows (Note [Seeding a prebuilt
    request]). ``resolve_tails``, first in a forward, sets a late-bound mixed batch's
    lengths and KV write locations, read from ``batch.req_to_token`` (Note
    [Late-bound tails] in runner.py). ``seeds_pending``: a seed is
    waiting for the next ``resolve_future`` to apply it. ``written``: the buffers a
    decode step over static buffers writes itself, or ``None``; such a step calls
    ``graph_wrote`` once it wrote them, ``publish`` with ``None`` lengths and
    ``stash_written`` with what it did not write (Note [Graph-written relay
    buffers])."""

    seeds_pending: bool
    written: Written | None

    def resolve_lengths(self, batch: ForwardBatch) -> None: ...
    def resolve_tails(self, batch: ForwardBatch) -> None: ...
    def scheduled(self, batch: ForwardBatch) -> None: ...
    def seeded(self, slots: list[int], seq_lens: list[int]) -> None: ...
    def resolve_future(self, batch: ForwardBatch) -> None: ...
    def publish(self, slots: Tensor, new_seq_lens: Tensor | None) -> None: ...
    def stash(self, slots: Tensor, tokens: Tensor, extras: Extras) -> None: ...
    def graph_wrote(self, slots: Tensor) -> None: ...
    def stash_written(self, slots: Tensor, extras: Extras) -> None: ...
    def release(self, slots: Tensor) -> None: ...
    def seed(
        self, slots: Tensor, tokens: Tensor, extras: Extras, seq_lens: Tensor
    ) -> None: ...


class FutureMap(Protocol):
    """What the engine calls on every generated map it drives; typed with its own
    ``ForwardBatch``, so mypy checks in ``map_relay`` that it fits each map's."""

    def resolve_future(self, batch: ForwardBatch) -> None: ...
    def stash(self, indices: Tensor, payload: Any) -> None: ...
    def seed(self, indices: Tensor, payload: Any) -> None: ...
    def release(self, indices: Tensor) -> None: ...
    def graph_wrote(self, indices: Tensor) -> None: ...


class LengthsLane(Protocol):
    """A map that relays the new lengths too, on its schedule lane (eagle, ngram)."""

    def publish(self, indices: Tensor, new_seq_lens: Tensor | None) -> None: ...
    def resolve_seq_lens_cpu(self, batch: ForwardBatch) -> None: ...


class TailsLane(Protocol):
    """A map whose lengths a mixed batch's decode rows bind late (ngram)."""

    def resolve_tails(self, batch: ForwardBatch) -> None: ...


def _host_slots(batch: ForwardBatch) -> Tensor:
    return torch.tensor([req.slot for req in batch.reqs], dtype=torch.int64)


class MapRelay:
    """The overlap hand-over, through one generated map (``map_relay`` builds it): the
    forward gathers the previous forward's stash on its own stream. ``lane`` is the
    map itself where it relays lengths, which the scheduler resolves behind the map's
    fence; ``None`` in plain decoding, whose map relays tokens only: every request
    grows by one token per step, so the host keeps each slot's next length.
    ``written``: the buffers the map adopted (Note [Graph-written relay buffers]).
    """

    def __init__(
        self,
        future_map: FutureMap,
        maps: Maps,
        payload: Callable[[Maps, Tensor | None, Extras], Any],  # a step's payload
        lane: LengthsLane | None,
        pool_size: int,
        ranges: Ranges = no_ranges,
        tails: TailsLane | None = None,
        written: Written | None = None,
    ) -> None:
        self.map = future_map
        self._tails = tails
        self.maps = maps  # future_map's class and its payload classes
        self.ranges = ranges
        self._payload = payload
        self._lane = lane
        self.written = written
        self._next_lens_cpu = torch.zeros(pool_size, dtype=torch.int64)
        self.seeds_pending = False

    def resolve_lengths(self, batch: ForwardBatch) -> None:
        if self._lane is not None:
            # Blocks until the newest forward has published (not until it has
            # finished), also on a CPU worker (Note [Host order of CPU records]);
            # Note [Tracing the fence wait].
            step = batch.step
            with (
                self.ranges(trace.RESOLVE_SEQ_LENS, step),
                self.ranges(trace.FENCE_WAIT, step),
            ):
                self._lane.resolve_seq_lens_cpu(batch)
            return
        with self.ranges(trace.HOST_SEQ_LENS, batch.step):
            lens = self._next_lens_cpu[_host_slots(batch)]
            batch.seq_lens_cpu = lens
            batch.seq_lens = lens.to(batch.req_pool_indices.device)
            batch.seq_lens_sum = int(lens.sum())

    def resolve_tails(self, batch: ForwardBatch) -> None:
        assert self._tails is not None, "only a map with tails binds them"
        n, device = len(batch), batch.req_pool_indices.device
        batch.seq_lens = torch.zeros(n, dtype=torch.int64, device=device)
        batch.seq_lens_cpu = torch.zeros(n, dtype=torch.int64)  # every row a tail
        batch.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=device)
        # The bundled ngram declares Tails(add=0): its published lengths count the
        # token a row decodes now.
        self._tails.resolve_tails(batch)

    def scheduled(self, batch: ForwardBatch) -> None:
        if self._lane is not None:
            return
        # Plain decoding: each step adds one token (sglang's host ``seq_lens + 1``).
        for part in (batch, batch.chunk):
            if part is not None and part.reqs:
                self._next_lens_cpu[_host_slots(part)] = part.seq_lens_cpu + 1

    def seeded(self, slots: list[int], seq_lens: list[int]) -> None:
        if self._lane is None:
            self._next_lens_cpu[torch.tensor(slots)] = torch.tensor(seq_lens)

    def resolve_future(self, batch: ForwardBatch) -> None:
        self.map.resolve_future(batch)
        self.seeds_pending = False

    def publish(self, slots: Tensor, new_seq_lens: Tensor | None) -> None:
        if self._lane is not None:
            self._lane.publish(slots, new_seq_lens)

    def stash(self, slots: Tensor, tokens: Tensor, extras: Extras) -> None:
        self.map.stash(slots, self._payload(self.maps, tokens, extras))

    def graph_wrote(self, slots: Tensor) -> None:
        self.map.graph_wrote(slots)

    def stash_written(self, slots: Tensor, extras: Extras) -> None:
        # The step wrote the tokens, and every extra but EAGLE's hidden states, into
        # ``written``: ``None`` for them, so the map dispatches no scatter.
        self.map.stash(slots, self._payload(self.maps, None, extras))

    def release(self, slots: Tensor) -> None:
        self.map.release(slots)

    def seed(
        self, slots: Tensor, tokens: Tensor, extras: Extras, seq_lens: Tensor
    ) -> None:
        # Note [Seeding a prebuilt request]: the map's seed queues the rows for its
        # next resolve_future, on the forward stream; the lengths are published here.
        self.map.seed(slots, self._payload(self.maps, tokens, extras))
        self.seeds_pending = True
        self.publish(slots, seq_lens)


# A step's payload: ``tokens=None`` after a step that wrote the rows of ``Written``
# itself, which are then ``None`` too (Note [Graph-written relay buffers]).


def _decode_payload(maps: Maps, tokens: Tensor | None, extras: Extras) -> Any:
    return maps.decode_payload(next_token_ids=tokens)


def _eagle_payload(maps: Maps, tokens: Tensor | None, extras: Extras) -> Any:
    p, index, hidden = extras
    written = tokens is None
    return maps.eagle_payload(
        bonus_tokens=tokens,
        topk_p=None if written else p,
        topk_index=None if written else index,
        hidden_states=hidden,
    )


def _ngram_payload(maps: Maps, tokens: Tensor | None, extras: Extras) -> Any:
    # The counts come with the stash whoever wrote the drafts (Note [Packed accepted
    # drafts] in runner.py).
    accepted, lens = extras
    return maps.ngram_payload(
        bonus_tokens=tokens,
        accept_tokens=None if tokens is None else accepted,
        accept_lens=lens,
    )


def map_relay(
    maps: Maps,
    spec: SpecConfig | None,
    device: torch.device,
    pool_size: int,
    *,
    debug: bool,
    ranges: Ranges = no_ranges,
    graph_written: bool = False,
) -> MapRelay:
    """The overlap relay of plain decoding (``spec=None``), EAGLE or n-gram
    speculation: the one place the engine tells the modes' maps apart.
    ``graph_written``: allocate the buffers a decode step over static buffers writes
    itself and hand them to the map (Note [Graph-written relay buffers])."""

    def rows(*shape: int, dtype: torch.dtype = torch.int64) -> Tensor:
        return torch.zeros((pool_size, *shape), dtype=dtype, device=device)

    w: Written | None = None
    if spec is None:
        if graph_written:
            w = Written(tokens=rows())
        decode = maps.decode(
            device,
            pool_size,
            output_tokens_buf=w.tokens if w is not None else None,
            debug=debug,
        )
        return MapRelay(
            decode, maps, _decode_payload, None, pool_size, ranges, written=w
        )
    if spec.method == "ngram":
        if graph_written:
            w = Written(
                tokens=rows(),
                new_seq_lens=rows(),
                accept_tokens=rows(spec.steps),
            )
        ngram = maps.ngram(
            device,
            pool_size,
            draft_token_num=spec.steps,
            output_tokens_buf=w.tokens if w is not None else None,
            accept_tokens_buf=w.accept_tokens if w is not None else None,
            new_seq_lens_buf=w.new_seq_lens if w is not None else None,
            debug=debug,
        )
        return MapRelay(ngram, maps, _ngram_payload, ngram, pool_size, ranges, ngram, w)
    if graph_written:
        w = Written(
            tokens=rows(),
            new_seq_lens=rows(),
            topk_p=rows(spec.topk, dtype=torch.float32),
            topk_index=rows(spec.topk),
        )
    eagle = maps.eagle(
        device,
        pool_size,
        topk=spec.topk,
        output_tokens_buf=w.tokens if w is not None else None,
        topk_p_buf=w.topk_p if w is not None else None,
        topk_index_buf=w.topk_index if w is not None else None,
        new_seq_lens_buf=w.new_seq_lens if w is not None else None,
        debug=debug,
    )
    return MapRelay(eagle, maps, _eagle_payload, eagle, pool_size, ranges, written=w)


def _eagle_inputs(info: SpecInfo, rows: Extras) -> None:
    info.topk_p, info.topk_index, info.hidden_states = rows


def _ngram_inputs(info: SpecInfo, rows: Extras) -> None:
    # Packed by the counts each verify stored, whatever the batch laid out (the
    # overlap map lays them by the batch's: Note [Packed accepted drafts] in
    # runner.py); drafts past a count go to one spare position, so no mask's size is
    # read back.
    tokens, lens = rows
    n, width = tokens.shape
    columns = torch.arange(width, device=tokens.device)
    counts = lens.long()
    starts = torch.cumsum(counts, 0) - counts
    at = torch.where(columns < counts[:, None], starts[:, None] + columns, n * width)
    packed = tokens.new_zeros(n * width + 1)
    packed[at.flatten()] = tokens.flatten()
    info.accept_tokens = packed[: n * width]


class DirectRelay:
    """The synchronous hand-over: per-slot tensors read after the previous step finished.

    ``mode`` names what the extras are: ``decode`` (none), ``eagle`` or ``ngram``.
    """

    #: Its seeds are plain writes.
    seeds_pending = False
    #: It adopts no buffers: its step's stash writes its rows.
    written: Written | None = None

    def __init__(
        self, pool_size: int, device: torch.device, ranges: Ranges, mode: str
    ) -> None:
        self.ranges = ranges
        self.pool_size = pool_size
        self.tokens = torch.zeros(pool_size, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(pool_size, dtype=torch.int64, device=device)
        #: Per-slot rows of the extras, allocated on the first stash.
        self.extras: Extras = ()
        self._set_extras = _ngram_inputs if mode == "ngram" else _eagle_inputs

    def resolve_lengths(self, batch: ForwardBatch) -> None:
        with self.ranges(trace.HOST_SEQ_LENS, batch.step):
            batch.seq_lens = self.seq_lens[batch.req_pool_indices]
            batch.seq_lens_cpu = batch.seq_lens.cpu()
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

    def resolve_tails(self, batch: ForwardBatch) -> None:
        """Its tensors hold the finished step's lengths, at schedule time or in the
        forward; the KV locations are read from the table at them."""
        self.resolve_lengths(batch)
        rows = batch.req_pool_indices
        batch.out_cache_loc = batch.req_to_token[rows, batch.seq_lens - 1]

    def resolve_future(self, batch: ForwardBatch) -> None:
        slots = batch.req_pool_indices
        batch.input_ids = self.tokens[slots]
        if self.extras:
            batch.spec_info.bonus_tokens = batch.input_ids
            self._set_extras(batch.spec_info, tuple(e[slots] for e in self.extras))

    def publish(self, slots: Tensor, new_seq_lens: Tensor | None) -> None:
        assert new_seq_lens is not None, "only a relay with written buffers takes None"
        self.seq_lens[slots] = new_seq_lens

    def stash(self, slots: Tensor, tokens: Tensor, extras: Extras) -> None:
        if slots.numel() == 0:
            return
        self.tokens[slots] = tokens
        if not extras:
            return
        if not self.extras:
            self.extras = tuple(
                e.new_zeros((self.pool_size, *e.shape[1:])) for e in extras
            )
        for store, value in zip(self.extras, extras):
            store[slots] = value

    def _nothing(self, *args: object) -> None:
        """Plain tensors: the lengths come from the publish of the finished step or of
        the seed, and nothing tracks a slot's owner."""

    scheduled = seeded = release = _nothing

    def _adopts_nothing(self, *args: object) -> None:
        """No step writes its rows itself (``written`` is ``None``)."""
        raise AssertionError("the synchronous relay adopts no buffers")

    graph_wrote = stash_written = _adopts_nothing

    def seed(
        self, slots: Tensor, tokens: Tensor, extras: Extras, seq_lens: Tensor
    ) -> None:
        self.stash(slots, tokens, extras)
        self.publish(slots, seq_lens)
