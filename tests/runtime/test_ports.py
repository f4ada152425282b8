"""Real relays ported to relay's schema language, checked against references written
from their descriptions: sglang's n-gram relay, and a vLLM-V1-style hand-over with
reordered rows and drafts, whose known glue bugs debug mode names."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from relay.codegen.render import render
from relay.debug import DebugCheckFailed
from relay.schema import (
    Field,
    HostCopy,
    IfNone,
    Lane,
    Resolve,
    Schema,
    TargetShape,
    Unwritten,
)
from relay.testing import check_lockstep

POOL = 12
DRAFTS = 3

#: sglang's n-gram relay as its description states it: accept tokens (pool x draft
#: tokens) and accept lengths (pool), zero-initialised, read through
#: ``spec_info.future_indices`` into ``spec_info`` (flattened tokens), beside the new
#: sequence lengths on the schedule lane; prefill batches carry ``spec_info=None``.
NGRAM = Schema(
    name="PortedNgramFutureMap",
    indices="spec_info.future_indices",
    optional_parents={"spec_info": IfNone.SKIP},
    fields=[
        Field(
            "accept_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("draft_token_num",),
            target="spec_info.accept_tokens",
            target_shape=TargetShape.FLAT,
            unwritten=Unwritten.ZEROS,
        ),
        Field(
            "accept_lens",
            lane=Lane.FORWARD,
            dtype=torch.int32,
            target="spec_info.accept_lens",
            unwritten=Unwritten.ZEROS,
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host=HostCopy(mirror="seq_lens_cpu"),
        ),
    ],
)


def _generated(schema: Schema, tmp_path: Path) -> ModuleType:
    text = render(schema, source="schemas/port.py", command="relay generate")
    path = tmp_path / "port_map.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("port_map", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["port_map"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("port_map", None)
    return module


class NgramReference:
    """The n-gram relay from its description: zero-filled buffers, indexed writes, and a
    resolve that skips a batch without spec_info and flattens the accepted tokens."""

    def __init__(self) -> None:
        self.tokens = torch.zeros(POOL, DRAFTS, dtype=torch.int64)
        self.lens = torch.zeros(POOL, dtype=torch.int32)

    def stash(
        self, slots: torch.Tensor, tokens: torch.Tensor, lens: torch.Tensor
    ) -> None:
        self.tokens[slots] = tokens
        self.lens[slots] = lens.to(torch.int32)

    def resolve(self, batch: Any) -> None:
        if batch.spec_info is None:
            return
        slots = batch.spec_info.future_indices
        batch.spec_info.accept_tokens = self.tokens[slots].flatten()
        batch.spec_info.accept_lens = self.lens[slots]


def _ngram_batch(slots: list[int] | None) -> SimpleNamespace:
    if slots is None:  # a prefill batch
        return SimpleNamespace(spec_info=None)
    indices = torch.tensor(slots, dtype=torch.int64)
    return SimpleNamespace(spec_info=SimpleNamespace(future_indices=indices))


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_ngram_port_agrees_with_its_reference(debug: bool, tmp_path: Path) -> None:
    """1,000 random steps: never-stashed rows (length 0), slot reuse, prefill batches
    with spec_info=None; the generated map hands over what the reference does, and in
    debug mode every read a correct engine makes is legal."""
    module = _generated(NGRAM, tmp_path)
    relay = module.PortedNgramFutureMap(
        "cpu", POOL, draft_token_num=DRAFTS, debug=debug
    )
    reference = NgramReference()
    rng = random.Random(7)
    fresh: set[int] = set()
    stashed: set[int] = set()
    for _step in range(1_000):
        if rng.random() < 0.2:
            relay.resolve_future(_ngram_batch(None))  # prefill: left alone
            continue
        readable = [s for s in range(1, POOL) if s in fresh or s not in stashed]
        slots = rng.sample(readable, k=min(len(readable), rng.randint(1, 4)))
        if not slots:
            continue
        mine, theirs = _ngram_batch(slots), _ngram_batch(slots)
        relay.resolve_future(mine)
        reference.resolve(theirs)
        assert torch.equal(mine.spec_info.accept_tokens, theirs.spec_info.accept_tokens)
        assert torch.equal(mine.spec_info.accept_lens, theirs.spec_info.accept_lens)
        fresh -= set(slots)
        tokens = torch.randint(0, 100, (len(slots), DRAFTS))
        lens = torch.randint(0, DRAFTS + 1, (len(slots),), dtype=torch.int32)
        relay.stash(
            mine.spec_info.future_indices,
            module.PortedNgramPayload(accept_tokens=tokens, accept_lens=lens),
        )
        reference.stash(torch.tensor(slots, dtype=torch.int64), tokens, lens)
        fresh |= set(slots)
        stashed |= set(slots)
        if rng.random() < 0.1:  # a request ends: its slot goes to a new one
            done = rng.choice(slots)
            relay.release(torch.tensor([done]))
            fresh.discard(done)


def test_ngram_port_runs_in_lockstep(tmp_path: Path) -> None:
    """The port against relay's reference model too, debug on."""
    module = _generated(NGRAM, tmp_path)
    cls = module.PortedNgramFutureMap
    dims = {"draft_token_num": DRAFTS}
    assert check_lockstep(NGRAM, cls, operations=1_000, steps=100, dims=dims) >= 1_000


# --- vLLM V1: rows reordered between steps, drafts, a request id per row -------------------

#: A vLLM-V1-style hand-over in relay's terms: each request keeps a slot for its life
#: (a request-id -> slot map), step N's sampled token is substituted for the
#: placeholder ``-slot`` in step N+1's input ids, its drafts are gathered, and each row
#: names its request so debug mode can tell whose value a row holds.
VLLM = Schema(
    name="AsyncFutureMap",
    owners="req_ids",
    fields=[
        Field(
            "sampled",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
        ),
        Field(
            "drafts",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=(DRAFTS,),
            target="draft_token_ids",
        ),
    ],
)


class VllmEngine:
    """A few requests stepping together; each step's batch is the running requests in
    a new order, as vLLM's persistent batch reorders them."""

    def __init__(self, module: ModuleType, debug: bool, seed: int) -> None:
        self.module = module
        self.relay = module.AsyncFutureMap("cpu", POOL, debug=debug)
        self.rng = random.Random(seed)
        self.slot_of = {rid: rid for rid in range(1, 6)}  # request id -> its slot
        self.last: dict[int, tuple[int, list[int]]] = {}  # what the reference hands

    def batch(self, placeholder: Any = None, swap: bool = False) -> SimpleNamespace:
        rids = list(self.slot_of)
        self.rng.shuffle(rids)
        slots = [self.slot_of[r] for r in rids]
        if swap:  # the reordering bug: two pending requests' slots exchanged
            slots[0], slots[1] = slots[1], slots[0]
        indices = torch.tensor(slots)
        batch = SimpleNamespace(
            req_pool_indices=indices, req_ids=rids, input_ids=None, draft_token_ids=None
        )
        self.relay.invalidate(batch, indices)
        if placeholder is not None:  # a sentinel of vLLM's convention left behind
            batch.input_ids[0] = placeholder
        return batch

    def step(self, batch: SimpleNamespace) -> None:
        self.relay.resolve_future(batch)
        for position, rid in enumerate(batch.req_ids):
            if rid in self.last:
                token, drafts = self.last[rid]
                assert batch.input_ids[position].item() == token, "input id"
                assert batch.draft_token_ids[position].tolist() == drafts, "drafts"
        sampled = torch.randint(0, 1000, (len(batch.req_ids),))
        drafts = torch.randint(0, 1000, (len(batch.req_ids), DRAFTS))
        payload = self.module.AsyncPayload(sampled=sampled, drafts=drafts)
        self.relay.stash(batch.req_pool_indices, payload, owners=batch.req_ids)
        for position, rid in enumerate(batch.req_ids):
            self.last[rid] = (int(sampled[position]), drafts[position].tolist())

    def first_step(self) -> None:
        rids = list(self.slot_of)
        indices = torch.tensor([self.slot_of[r] for r in rids])
        sampled = torch.randint(0, 1000, (len(rids),))
        drafts = torch.randint(0, 1000, (len(rids), DRAFTS))
        payload = self.module.AsyncPayload(sampled=sampled, drafts=drafts)
        self.relay.stash(indices, payload, owners=rids)
        for position, rid in enumerate(rids):
            self.last[rid] = (int(sampled[position]), drafts[position].tolist())


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_vllm_style_hand_over_follows_requests_across_reordering(
    debug: bool, tmp_path: Path
) -> None:
    """200 steps of reordered rows: every request gets its own last token and drafts."""
    engine = VllmEngine(_generated(VLLM, tmp_path), debug, seed=3)
    engine.first_step()
    for _ in range(200):
        engine.step(engine.batch())


def test_a_vllm_sentinel_left_in_the_inputs_is_named(tmp_path: Path) -> None:
    """vLLM's ``-1`` left in input ids means slot 1 to relay: with debug off it is read
    silently (a wrong token), debug mode names the placeholder with nothing pending."""
    for debug in (False, True):
        engine = VllmEngine(_generated(VLLM, tmp_path), debug, seed=5)
        del engine.slot_of[1]  # slot 1 holds no running request: nothing pending
        engine.first_step()
        batch = engine.batch(placeholder=-1)
        if not debug:
            with pytest.raises(AssertionError, match="input id"):
                engine.step(batch)
            continue
        with pytest.raises(
            DebugCheckFailed, match="placeholder -1, which names slot 1"
        ):
            engine.step(batch)


def test_swapped_slots_of_two_pending_requests_are_named(tmp_path: Path) -> None:
    """Two requests' slots exchanged by a reordering bug: both values are fresh, so only
    the owners tell; debug mode names the request that reads another's value."""
    for debug in (False, True):
        engine = VllmEngine(_generated(VLLM, tmp_path), debug, seed=11)
        engine.first_step()
        batch = engine.batch(swap=True)
        if not debug:
            with pytest.raises(AssertionError):
                engine.step(batch)
            continue
        with pytest.raises(DebugCheckFailed, match="belongs to another request"):
            engine.step(batch)
