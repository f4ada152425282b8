"""sglang 0.5.23's relay (its ``FutureMap``), as a reference model, slot by slot.

Written from docs/sglang.md (what the release does, described in relay's words) and
nothing else: plain dicts of per-slot rows, one method per call sglang's engine makes,
no buffers, streams or debug bookkeeping, and nothing of relay's schema vocabulary or
generator. The faithful bundled maps (``relay/maps/sglang_*.py``) run beside it in
lockstep (``tests/faithful/``), which compares every value the two hand a batch.

A batch is any object with sglang's attribute names (``req_pool_indices``,
``spec_info.future_indices``, ``seq_lens``, ``mix_running_indices``, ...). A row the
relay holds nothing defined for (an uninitialised ``empty`` row) is a ``ModelError``:
the harness never asks for one, so asking is a harness bug.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
from torch import Tensor

from relay.testing.model import ModelError

__all__ = [
    "ALGORITHMS",
    "EXTRAS",
    "BeamTail",
    "BeamTailEntry",
    "Req",
    "SglangRelay",
    "beam_rows",
]

#: The algorithms the model knows: plain decoding, EAGLE (with its extras), n-gram.
ALGORITHMS = ("decode", "eagle", "ngram")

#: EAGLE's extras, in payload order; ``topk_p`` and ``topk_index`` come as a pair.
EXTRAS = ("topk_p", "topk_index", "hidden_states", "draft_probs", "dsa_topk_indices")

#: Extras written with a cast to the buffer's dtype; ``draft_probs`` is written as given.
_CAST = {"topk_p", "topk_index", "hidden_states", "dsa_topk_indices"}


class Req:
    """A request as sglang's batches hold it (``batch.reqs``, one per row of its
    slots): its id is ``rid``; its ``repr``, as sglang's, spells more than the id."""

    def __init__(self, rid: str) -> None:
        self.rid = rid

    def __repr__(self) -> str:
        return f"Req(rid={self.rid}, input_ids=[...], output_ids=[...])"


class BeamTailEntry(NamedTuple):
    """One beam group's member rows in a decode batch (sglang's ``BeamTailEntry``):
    the leader's position in the batch's ``reqs``, and its member rows ``[start,
    end)`` counted from the first row past ``reqs``."""

    group: object
    leader_idx: int
    start: int
    end: int


class BeamTail:
    """The member rows a beam-search decode batch carries after the rows of its
    ``reqs`` (sglang's ``BeamTail``, the batch's ``beam_tail``)."""

    def __init__(self, num_base_rows: int, entries: list[BeamTailEntry]) -> None:
        self.num_base_rows = num_base_rows
        self.entries = entries


def beam_rows(
    slots: Sequence[int], members: Mapping[int, Sequence[int]]
) -> tuple[list[int], BeamTail | None]:
    """A decode batch's slots as sglang's ``append_beam_tail`` lays them out: the
    rows of its requests (``slots``), then the member slots of each beam leader among
    them (``members``: leader slot -> its member slots), in row order; and the tail
    listing them (``None`` where no leader has members)."""
    rows = list(slots)
    entries = []
    for i, slot in enumerate(slots):
        tail = members.get(slot, ())
        if tail:
            start = len(rows) - len(slots)
            entries.append(BeamTailEntry(slot, i, start, start + len(tail)))
            rows += tail
    return rows, BeamTail(len(slots), entries) if entries else None


class SglangRelay:
    """One ``FutureMap`` of one algorithm. ``req_to_token`` is the pool's
    request-to-token table (the late-bound tails read KV locations from it);
    ``host_lengths`` says whether an attention backend needs host lengths
    (``needs_cpu_seq_lens``); ``confidence`` turns the confidence relay on;
    ``need_topk`` and ``need_hidden_states`` say whether the EAGLE-family algorithm
    relays the top-k pair (EAGLE and standalone drafts do) and the hidden state (not
    for standalone, DFlash, DSpark or multi-layer EAGLE): the others are never
    allocated, whatever the payloads carry."""

    def __init__(
        self,
        algorithm: str,
        *,
        req_to_token: Tensor | None = None,
        host_lengths: bool = True,
        confidence: bool = False,
        need_topk: bool = True,
        need_hidden_states: bool = True,
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise ModelError(f"unknown algorithm {algorithm!r}")
        self.algorithm = algorithm
        self.speculative = algorithm != "decode"
        self.req_to_token = req_to_token
        self.host_lengths = host_lengths or algorithm == "ngram"
        self.confidence_on = confidence
        #: The extras this algorithm never relays.
        self.unrelayed: set[str] = set()
        if not need_topk:
            self.unrelayed |= {"topk_p", "topk_index"}
        if not need_hidden_states:
            self.unrelayed.add("hidden_states")
        #: The eager scalar lanes: slot -> int64 value.
        self.tokens: dict[int, Tensor] = {}
        self.lengths: dict[int, Tensor] = {}
        #: Lazily allocated buffers: name -> slot -> row; a name is present once its
        #: buffer exists (``dtypes`` holds its dtype from then on).
        self.rows: dict[str, dict[int, Tensor]] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        #: The buffers whose rows read as zeros before their first write: row shapes.
        self.zeros: dict[str, tuple[int, ...]] = {}
        #: The tensors a captured graph already scattered into the adopted buffers.
        self.graph_lengths: Tensor | None = None
        self.graph_bonus: Tensor | None = None
        #: Whether a fence exists (the first speculative publish makes it).
        self.fenced = False

    # -- writes ------------------------------------------------------------------------
    def graph_writes(self, slots: list[int], lengths: Tensor, bonus: Tensor) -> None:
        """The static verify graph scatters the step's accepted lengths and bonus
        tokens into the adopted buffers; the engine keeps the very tensors."""
        self._put(self.lengths, slots, lengths)
        self._put(self.tokens, slots, bonus)
        self.graph_lengths, self.graph_bonus = lengths, bonus

    def publish(
        self, slots: list[int], lengths: Tensor, confidence: Tensor | None = None
    ) -> None:
        """Mid-forward, after verification: the lengths (unless the graph wrote these
        very ones), the confidence when its relay is on and one is given, the fence."""
        if not slots:
            return
        if self.graph_lengths is not None and lengths is self.graph_lengths:
            self.graph_lengths = None
        else:
            self._put(self.lengths, slots, lengths)
        if self.confidence_on and confidence is not None:
            self._allocate("confidence", confidence, torch.float32)
            self._put(self.rows["confidence"], slots, confidence, torch.float32)
        if self.speculative:
            self.fenced = True

    def stash(self, slots: list[int], payload: Mapping[str, Tensor | None]) -> None:
        """End of a forward: n-gram's two buffers, or the bonus token and each extra
        whose buffer exists and which the payload carries (an omitted one is kept)."""
        if not slots:
            return
        if self.algorithm == "ngram":
            for name in ("accept_tokens", "accept_lens"):
                value = payload[name]
                assert value is not None
                self._allocate(name, value, value.dtype)
                self._put(self.rows[name], slots, value, self.dtypes[name])
            return
        for name in EXTRAS:
            value = payload.get(name)
            if value is not None and self.speculative and name not in self.unrelayed:
                self._allocate(name, value, value.dtype)
        bonus = payload["bonus_tokens"]
        assert bonus is not None, "sglang's stash needs the bonus token"
        if self.graph_bonus is not None and bonus is self.graph_bonus:
            self.graph_bonus = None
        else:
            self._put(self.tokens, slots, bonus)
        for name in EXTRAS:
            value = payload.get(name)
            if name in self.rows and value is not None:
                dtype = self.dtypes[name] if name in _CAST else value.dtype
                self._put(self.rows[name], slots, value, dtype)

    def stash_bonus_tokens(self, slots: list[int], bonus: Tensor) -> None:
        """The bonus tokens only, every extra kept: with speculation on and overlap
        off, a mixed batch's running rows' last tokens, for its decode-token gather."""
        self._put(self.tokens, slots, bonus)

    def make_staged_spec_input(self, slots: Tensor) -> Any:
        """A fresh draft input for requests leaving the staging area (EAGLE family
        only): their slots, and the sparse indices flagged where their buffer exists."""
        if self.algorithm != "eagle":
            raise ModelError("sglang stages EAGLE-family draft inputs only")
        return SimpleNamespace(
            future_indices=slots,
            future_dsa_topk_indices_available="dsa_topk_indices" in self.rows,
        )

    def _allocate(self, name: str, value: Tensor, dtype: torch.dtype) -> None:
        """A lazy buffer, allocated by the first payload that carries it; the n-gram
        ones (and only they) read as zeros before their first write."""
        if name in self.rows:
            return
        self.rows[name] = {}
        self.dtypes[name] = dtype
        if name in ("accept_tokens", "accept_lens"):
            self.zeros[name] = tuple(value.shape[1:])

    @staticmethod
    def _put(
        rows: dict[int, Tensor],
        slots: list[int],
        values: Tensor,
        dtype: torch.dtype = torch.int64,
    ) -> None:
        for position, slot in enumerate(slots):
            rows[slot] = values[position].to(dtype).clone()

    # -- reads -------------------------------------------------------------------------
    def _row(self, name: str, slot: int) -> Tensor:
        if name == "output_tokens":
            rows = self.tokens
        elif name == "new_seq_lens":
            rows = self.lengths
        else:
            rows = self.rows[name]
        if slot in rows:
            return rows[slot]
        if name in self.zeros:
            return torch.zeros(self.zeros[name], dtype=self.dtypes[name])
        raise ModelError(f"{name}: slot {slot} was never written (an empty row)")

    def gather(self, name: str, slots: list[int]) -> Tensor:
        """``buffer[slots]``: the rows of ``slots``, stacked."""
        if not slots:
            dtype = self.dtypes.get(name, torch.int64)
            return torch.empty((0,), dtype=dtype)
        return torch.stack([self._row(name, slot) for slot in slots])

    def resolve_forward_inputs(self, batch: Any) -> None:
        """First thing in a forward: a mixed batch's late-bound tails and decode rows,
        plain decoding's input tokens, then (speculative) the draft input's extras."""
        running = getattr(batch, "mix_running_indices", None)
        if running is not None and self.algorithm == "ngram":
            raise ModelError(
                "sglang runs no mixed batch with n-gram: its server arguments turn "
                "mixed chunked prefill off, as n-gram relays no bonus token to gather"
            )
        if getattr(batch, "prefill_input_ids", None) is not None:
            prefill = batch.prefill_input_ids
            if running is not None:
                if self.speculative:
                    self.resolve_mixed_spec_tails(batch)
                decode = self.gather("output_tokens", running.tolist())
                prefill = torch.cat([prefill, decode])
            batch.input_ids = prefill
            batch.prefill_input_ids = None
            batch.mix_running_indices = None
        elif batch.input_ids is None and not self.speculative:
            batch.input_ids = self.gather(
                "output_tokens", batch.req_pool_indices.tolist()
            )
        if self.speculative:
            self.resolve_spec_extras(batch)

    def resolve_spec_extras(self, batch: Any) -> None:
        """The draft input's extras, by its ``future_indices``."""
        info = batch.spec_info
        if info is None:
            return
        if self.algorithm == "ngram":
            if info.future_indices is None or info.future_indices.shape[0] == 0:
                return
            slots = info.future_indices.tolist()
            info.accept_tokens = self.gather("accept_tokens", slots).flatten()
            info.accept_lens = self.gather("accept_lens", slots)
            return
        slots = info.future_indices.tolist()  # None raises, as sglang's does
        if not slots:
            return
        info.bonus_tokens = self.gather("output_tokens", slots)
        topk = "topk_p" in self.rows
        if topk:
            info.topk_p = self.gather("topk_p", slots)
            info.topk_index = self.gather("topk_index", slots)
        if "hidden_states" in self.rows:
            info.hidden_states = self.gather("hidden_states", slots)
        if topk and "draft_probs" in self.rows:
            info.draft_probs = self.gather("draft_probs", slots)
        info.dsa_topk_indices = None
        if info.future_dsa_topk_indices_available:
            info.dsa_topk_indices = self.gather("dsa_topk_indices", slots)

    def resolve_seq_lens_cpu(self, batch: Any, stream_ordered: bool = False) -> None:
        """The schedule side: the lengths of the draft input's slots, on the device
        and (when a backend needs them) on the host with their sum. Whether the read
        waits or is ordered on the stream changes when, never what, it reads."""
        info = batch.spec_info
        if info is None or info.future_indices is None:
            return
        batch.seq_lens = self.gather("new_seq_lens", info.future_indices.tolist())
        if not self.host_lengths:
            batch.seq_lens_cpu = None
            batch.seq_lens_sum = None
            return
        batch.seq_lens_cpu = batch.seq_lens.clone()
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

    def resolve_mixed_spec_tails(self, batch: Any) -> None:
        """Late binding of a mixed batch's decode tails: the last n rows' lengths,
        KV write locations, host lengths, sum and prefix lengths from the published
        lengths of their slots (a second read: nothing is consumed)."""
        if self.algorithm == "ngram":
            raise ModelError("sglang runs no mixed batch with n-gram")
        slots = batch.mix_running_indices.tolist()
        n = len(slots)
        if n == 0:
            return
        assert self.req_to_token is not None, (
            "the tails read the request-to-token table"
        )
        fresh = self.gather("new_seq_lens", slots)
        seq_lens = batch.seq_lens.clone()
        seq_lens[-n:] = fresh + 1
        batch.seq_lens = seq_lens
        locations = batch.out_cache_loc.clone()
        table = self.req_to_token[torch.tensor(slots), fresh]
        locations[-n:] = table.to(locations.dtype)
        batch.out_cache_loc = locations
        if batch.seq_lens_cpu is not None:
            host = batch.seq_lens_cpu.clone()
            host[-n:] = fresh + 1
            batch.seq_lens_cpu = host
            batch.seq_lens_sum = int(host.sum())
        batch.prefix_lens = list(batch.prefix_lens[:-n]) + fresh.tolist()

    def resolve_confidence_cpu(self, batch: Any) -> Tensor | None:
        """The published confidence of the batch's slots on the host (the path
        without a copy stream), or None when there is nothing to read."""
        info = batch.spec_info
        if not self.confidence_on or "confidence" not in self.rows or info is None:
            return None
        if info.future_indices is None or info.future_indices.shape[0] == 0:
            return None
        return self.gather("confidence", batch.req_pool_indices.tolist())
