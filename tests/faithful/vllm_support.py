"""The vLLM faithful lockstep: a bundled ``vllm_v*_drafts`` map beside the model of
that runner's hand-over (``relay/testing/vllm_reference.py``), driven by the schedules
vLLM 0.33 runs, compared on every ``input_ids`` built.

The V1 driver keeps a persistent batch whose rows move every step; requests join
(prefills, chunked: a chunk that does not finish the prompt samples nothing and is left
out of the row map), decode with 0 to the previous step's draft width of drafts, sit a
step out (absent from the row map, their drafts then stay the host's -1 placeholders),
and end (their slots released and reused). The step's draft width changes per step
(0 included, and every step of a run without speculation). The V2 driver keeps one
state row per request and walks prompts to their end in chunks, the last chunk
padded with draft placeholders, as V2's scheduler does. Both draw only what vLLM does,
so a map in debug mode must report nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import attrs
import torch

from relay.maps.vllm_v1_drafts import VllmV1DraftsFutureMap, VllmV1DraftsPayload
from relay.maps.vllm_v2_drafts import VllmV2DraftsFutureMap, VllmV2DraftsPayload
from relay.slots import SlotTable
from relay.testing import Namespace
from relay.testing.vllm_reference import V1Runner, V2Runner

POOL = 12
HOST_JUNK = 55_555  # what the host's buffer holds where the runner writes a token


class Divergence(AssertionError):
    """The map and the model built different ``input_ids``."""


@attrs.define
class Request:
    rid: str
    prompt: list[int]
    done: int = 0
    last: int = -1  # the last token the host knows

    @property
    def prefilling(self) -> bool:
        return self.done < len(self.prompt)


#: A plant edits the relay's batch (or lookup) before the map reads it.
Plant = Callable[[Namespace, "V1Run"], None]


class V1Run:
    """One lockstep run of the V1 runner's hand-over."""

    def __init__(
        self, seed: int, *, debug: bool, width: int = 3, engine_drafts: bool = False
    ) -> None:
        self.rng = random.Random(seed)
        self.width = width
        #: A port that hands over the token alone (every count 0) and places the
        #: drafts itself after the resolve, from its own copy of step N's proposals.
        self.engine_drafts = engine_drafts
        self.map = VllmV1DraftsFutureMap(
            "cpu", POOL, num_speculative_tokens=width, debug=debug
        )
        self.slots = SlotTable(POOL, [self.map])
        self.model = V1Runner()
        self.requests: list[Request] = []
        self.next_rid = 0
        self.prev_width = 0
        #: Kept counts published at the end of the last step, by request.
        self.kept: dict[str, int] = {}
        self.seen: dict[str, int] = {
            "handed_over": 0,
            "not_first": 0,
            "left_placeholders": 0,
            "width_0": 0,
            "trimmed": 0,
            "engine_placed": 0,
        }

    # -- the scheduler ---------------------------------------------------------------
    def _churn(self) -> None:
        for r in [r for r in self.requests if not r.prefilling]:
            if self.rng.random() < 0.15:
                self.slots.finish([r.rid])
                self.requests.remove(r)
        while self.slots.free and len(self.requests) < 7 and self.rng.random() < 0.5:
            prompt = [
                self.rng.randrange(1, 1000) for _ in range(self.rng.randint(1, 6))
            ]
            rid = f"req-{self.next_rid}"
            self.next_rid += 1
            self.slots.take(rid)
            self.requests.append(Request(rid, prompt))

    def _read_kept(self, plant: Plant | None) -> None:
        """The scheduler reads back the kept counts of the requests that sampled."""
        rids = list(self.kept)
        if not rids:
            return
        lookup = Namespace(
            slots=self.slots.indices(rids),
            req_ids=rids,
            kept_counts=None,
            kept_counts_cpu=None,
        )
        if plant is not None and getattr(plant, "lookup", False):
            plant(lookup, self)
        self.map.resolve_kept_counts_cpu(lookup)
        got = lookup.kept_counts_cpu.tolist()
        if got != [self.kept[r] for r in rids]:
            raise Divergence(f"kept counts {got} != {self.kept}")
        self.kept = {}

    def step(self, plant: Plant | None = None) -> None:
        self._read_kept(plant)
        self._churn()
        order = [r for r in self.requests if self.rng.random() < 0.85]
        self.rng.shuffle(order)
        prev = self.model.prev_row
        host: list[int] = []
        cu: list[int] = []
        drafts: dict[str, int] = {}
        chunks: dict[str, int] = {}
        for r in order:
            if r.prefilling:
                chunk = self.rng.randint(1, len(r.prompt) - r.done)
                chunks[r.rid] = chunk
                host += r.prompt[r.done : r.done + chunk]
            else:
                most = self.prev_width if r.rid in prev else self.width
                d = self.rng.randint(0, most)
                if r.rid in prev and d < most:
                    self.seen["trimmed"] += 1
                drafts[r.rid] = d
                token = HOST_JUNK if r.rid in prev else r.last
                host += [token] + [-1] * d
                if r.rid not in prev and d:
                    self.seen["left_placeholders"] += 1
            cu.append(len(host))
        want = self.model.prepare_input_ids([r.rid for r in order], cu, drafts, host)
        handed = [i for i, r in enumerate(order) if r.rid in prev]
        self.seen["handed_over"] += len(handed)
        self.seen["not_first"] += any(i != j for j, i in enumerate(handed))
        rids = [order[i].rid for i in handed]
        batch = Namespace(
            slots=self.slots.indices(rids),
            req_ids=rids,
            token_positions=torch.tensor(
                [cu[i] - 1 - drafts[order[i].rid] for i in handed], dtype=torch.int32
            ),
            query_start_loc=torch.tensor([0, *cu], dtype=torch.int32),
            token_rows=torch.tensor(handed, dtype=torch.int32),
            num_draft_tokens=torch.tensor(
                [0 if self.engine_drafts else drafts[order[i].rid] for i in handed],
                dtype=torch.int32,
            ),
            input_ids=torch.tensor(host, dtype=torch.int32),
        )
        if plant is not None and not getattr(plant, "lookup", False):
            plant(batch, self)
        self.map.resolve_future(batch)
        if self.engine_drafts:
            for i in handed:
                d = drafts[order[i].rid]
                row = self.model.drafts[prev[order[i].rid]][:d]
                start = cu[i] - d
                batch.input_ids[start : start + d] = torch.tensor(row)
                self.seen["engine_placed"] += d > 0
        if batch.input_ids.tolist() != want:
            raise Divergence(f"input_ids {batch.input_ids.tolist()} != {want}")
        self._sample(order, drafts, chunks)

    # -- the forward's end -------------------------------------------------------------
    def _sample(
        self, order: list[Request], drafts: dict[str, int], chunks: dict[str, int]
    ) -> None:
        width = 0 if self.width == 0 else self.rng.randint(0, self.width)
        self.seen["width_0"] += width == 0
        n = len(order)
        sampled = [self.rng.randrange(1000) for _ in range(n)]
        proposed = [[self.rng.randrange(1000) for _ in range(width)] for _ in range(n)]
        discarded = []
        for r in order:
            if r.prefilling:
                r.done += chunks[r.rid]
                if r.prefilling:
                    discarded.append(r.rid)
        self.model.sampled_step([r.rid for r in order], sampled, proposed, discarded)
        rows = [i for i, r in enumerate(order) if r.rid not in discarded]
        self.prev_width = width
        if not rows:
            return
        rids = [order[i].rid for i in rows]
        slots = self.slots.indices(rids)
        # V1's sampler hands int32 tokens, its drafter int64 drafts (an argmax): the
        # map lays them into int32 input_ids as they are.
        block = torch.tensor([proposed[i] for i in rows], dtype=torch.int64)
        self.map.stash(
            slots,
            VllmV1DraftsPayload(
                sampled_token_ids=torch.tensor(
                    [sampled[i] for i in rows], dtype=torch.int32
                ),
                draft_token_ids=block.reshape(len(rows), width),
                num_draft_tokens=torch.full((len(rows),), width, dtype=torch.int32),
            ),
            owners=rids,
        )
        kept = [1 + self.rng.randint(0, drafts.get(order[i].rid, 0)) for i in rows]
        self.map.publish(slots, torch.tensor(kept, dtype=torch.int32), owners=rids)
        self.kept = dict(zip(rids, kept))
        for i in rows:
            order[i].last = sampled[i]


def run_v1(
    seed: int, steps: int, *, debug: bool, width: int = 3, engine_drafts: bool = False
) -> V1Run:
    """``steps`` steps of one V1 lockstep run; raises ``Divergence`` on a difference."""
    lockstep = V1Run(seed, debug=debug, width=width, engine_drafts=engine_drafts)
    for _ in range(steps):
        lockstep.step()
    return lockstep


def lookup_plant(plant: Callable[[Namespace, Any], None]) -> Plant:
    """Mark ``plant`` as one that edits the scheduler's lookup, not the batch."""
    plant.lookup = True  # type: ignore[attr-defined]
    return plant


class V2Run:
    """One lockstep run of the V2 runner's per-request state and its combine."""

    def __init__(self, seed: int, *, debug: bool, width: int = 3) -> None:
        self.payload = VllmV2DraftsPayload
        self.rng = random.Random(seed)
        self.width = width
        self.map = VllmV2DraftsFutureMap(
            "cpu", POOL, num_speculative_tokens=width, debug=debug
        )
        self.slots = SlotTable(POOL, [self.map])
        self.model = V2Runner(width)
        self.requests: list[Request] = []
        #: Each request's computed tokens, and the drafts its row holds (a count).
        self.computed: dict[str, int] = {}
        self.produced: dict[str, int] = {}
        self.next_rid = 0
        self.seen: dict[str, int] = {
            "token_laid": 0,
            "prompt_tail_drafts": 0,
            "mid_prefill": 0,
            "not_first": 0,
            "width_0": 0,
        }

    def _churn(self) -> None:
        for r in [r for r in self.requests if not r.prefilling]:
            if self.rng.random() < 0.15:
                self.slots.finish([r.rid])
                self.model.remove_request(r.rid)
                self.requests.remove(r)
        while self.slots.free and len(self.requests) < 7 and self.rng.random() < 0.5:
            prompt = [
                self.rng.randrange(1, 1000) for _ in range(self.rng.randint(1, 6))
            ]
            rid = f"req-{self.next_rid}"
            self.next_rid += 1
            slot = self.slots.take(rid)
            self.requests.append(Request(rid, prompt))
            self.computed[rid] = 0
            self.produced[rid] = self.width
            self.model.add_request(rid, len(prompt))
            # V2 zeroes a new request's drafts: a seed of zero drafts, token kept.
            zeros = torch.zeros((1, self.width), dtype=torch.int64)
            full = torch.full((1,), self.width, dtype=torch.int32)
            self.map.seed(
                torch.tensor([slot]),
                self.payload(
                    sampled_token_ids=None,
                    draft_token_ids=zeros,
                    num_draft_tokens=full,
                ),
                owners=[rid],
            )

    def step(self, plant: Callable[[Namespace, V2Run], None] | None = None) -> None:
        self._churn()
        order = [r for r in self.requests if self.rng.random() < 0.85]
        self.rng.shuffle(order)
        host: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        drafts: list[int] = []
        for r in order:
            done = self.computed[r.rid]
            prefill = len(r.prompt)
            if done < prefill:
                chunk = self.rng.randint(1, prefill - done)
                tail = done + chunk == prefill and self.rng.random() < 0.5
                n = self.rng.randint(0, self.produced[r.rid]) if tail else 0
                host += r.prompt[done : done + chunk] + [-1] * n
                self.seen["prompt_tail_drafts"] += n > 0
                self.seen["mid_prefill"] += done + chunk < prefill
            else:
                n = self.rng.randint(0, self.produced[r.rid])
                host += [-1] * (1 + n)
            drafts.append(n)
            starts.append(len(host))
            seq_lens.append(done + starts[-1] - starts[-2])
        rids = [r.rid for r in order]
        want = self.model.combine(rids, starts, seq_lens, drafts, list(host))
        prefills = [len(r.prompt) for r in order]
        ready = [s - 1 - n >= p for s, n, p in zip(seq_lens, drafts, prefills)]
        past = [s > p for s, p in zip(seq_lens, prefills)]
        self.seen["token_laid"] += sum(ready)
        self.seen["not_first"] += any(
            ready[j] and not all(ready[:j]) for j in range(len(order))
        )
        batch = Namespace(
            slots=self.slots.indices(rids),
            req_ids=rids,
            logits_starts=torch.tensor(
                [starts[i + 1] - 1 - n for i, n in enumerate(drafts)], dtype=torch.int32
            ),
            sampled_ready=torch.tensor(ready, dtype=torch.bool),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            num_draft_tokens=torch.tensor(
                [n if p else 0 for n, p in zip(drafts, past)], dtype=torch.int32
            ),
            input_ids=torch.tensor(host, dtype=torch.int32),
        )
        if plant is not None:
            plant(batch, self)
        self.map.resolve_future(batch)
        if batch.input_ids.tolist() != want:
            raise Divergence(f"input_ids {batch.input_ids.tolist()} != {want}")
        self._sample(order, seq_lens, drafts)

    def _sample(
        self, order: list[Request], seq_lens: list[int], drafts: list[int]
    ) -> None:
        width = self.rng.randint(0, self.width)
        self.seen["width_0"] += width == 0
        sampled_rows: list[int] = []
        tokens: list[int] = []
        for i, r in enumerate(order):
            n = drafts[i]
            if seq_lens[i] >= len(r.prompt):  # the prefill is done: it samples
                accepted = self.rng.randint(0, n)
                sampled = [self.rng.randrange(1000) for _ in range(1 + accepted)]
                self.model.post_update(r.rid, sampled)
                self.computed[r.rid] = seq_lens[i] - (n - accepted)
                sampled_rows.append(i)
                tokens.append(sampled[-1])
            else:
                self.computed[r.rid] = seq_lens[i]
        proposed = [[self.rng.randrange(1000) for _ in range(width)] for _ in order]
        for r, row in zip(order, proposed):
            self.model.set_drafts(r.rid, row, width)
            self.produced[r.rid] = width
            r.done = min(self.computed[r.rid], len(r.prompt))
        # The state rows, int64 as V2 keeps them: columns past the count hold -1.
        block = torch.full((len(order), self.width), -1, dtype=torch.int64)
        if width and order:
            block[:, :width] = torch.tensor(proposed, dtype=torch.int64)
        counts = torch.full((len(order),), width, dtype=torch.int32)
        rest = [i for i in range(len(order)) if i not in sampled_rows]
        for rows, values in ((sampled_rows, tokens), (rest, None)):
            if not rows:
                continue
            picked = torch.tensor(rows)
            self.map.stash(
                self.slots.indices(order[i].rid for i in rows),
                self.payload(
                    sampled_token_ids=None
                    if values is None
                    else torch.tensor(values, dtype=torch.int64),
                    draft_token_ids=block[picked],
                    num_draft_tokens=counts[picked],
                ),
                owners=[order[i].rid for i in rows],
            )


def run_v2(seed: int, steps: int, *, debug: bool, width: int = 3) -> V2Run:
    """``steps`` steps of one V2 lockstep run; raises ``Divergence`` on a difference."""
    lockstep = V2Run(seed, debug=debug, width=width)
    for _ in range(steps):
        lockstep.step()
    return lockstep
