"""Decode steps over static buffers per bucket (relay/engine/graphs.py): eagerly on the
CPU, captured in CUDA graphs and replayed on CUDA; the same tokens and the same model
state as the eager forward."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch

from relay.engine import (
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpecConfig,
    WorkloadConfig,
    run_workload,
)
from relay.engine.batch import ForwardBatch, ForwardMode, Request, StepOutput
from relay.engine.compare import first_output_difference
from relay.engine.graphs import StaticInputs, buckets_for
from relay.engine.maps import MapSource
from relay.engine.model import KVCache, TargetModel
from relay.engine.relays import DirectRelay, MapRelay, Relay, map_relay
from relay.engine.runner import ModelRunner
from relay.engine.trace import no_ranges
from relay.engine.workload import RequestSpec
from relay.errors import RelayDebugError
from relay.opcount import count_ops

MODEL = ModelConfig(
    vocab_size=512, hidden=32, layers=2, heads=2, ffn=64, max_context=48
)
MODES: dict[str, SpecConfig | None] = {
    "decode": None,
    "eagle": SpecConfig(steps=3, topk=2),
    "ngram": SpecConfig(steps=3, method="ngram"),
    "ngram_variable": SpecConfig(steps=3, method="ngram", variable_drafts=True),
}
POOL = 6
PROMPTS = [(5, 9, 14, 9, 5), (3, 3, 8, 1, 44, 3, 3), (100, 7, 7, 100)]
CPU = torch.device("cpu")


def test_buckets() -> None:
    """Powers of two up to the most running requests, and that number itself."""
    assert buckets_for(1) == (1,)
    assert buckets_for(6) == (1, 2, 4, 6)
    assert buckets_for(8) == (1, 2, 4, 8)
    assert buckets_for(9) == (1, 2, 4, 8, 9)


def _map_relay(
    spec: SpecConfig | None, *, graph_written: bool, debug: bool = False
) -> MapRelay:
    return map_relay(
        MapSource().load(), spec, CPU, POOL, debug=debug, graph_written=graph_written
    )


def _decode_batch(slots: list[int], relay: Relay, step: int) -> ForwardBatch:
    reqs = [
        Request(
            RequestSpec(rid=i, prompt=(1,), max_new_tokens=8, arrival_step=0), slot=s
        )
        for i, s in enumerate(slots)
    ]
    empty = torch.empty(0, dtype=torch.int64)
    index = torch.tensor(slots, dtype=torch.int64)
    batch = ForwardBatch(ForwardMode.DECODE, reqs, index, empty, empty, empty)
    relay.resolve_lengths(batch)
    batch.max_seq_len = int(batch.seq_lens_cpu.max())
    batch.step = step
    return batch


def _run_steps(
    spec: SpecConfig | None,
    buckets: tuple[int, ...],
    *,
    maps: bool,
    debug: bool = False,
    relay: Relay | None = None,
) -> tuple[list[StepOutput], KVCache, ModelRunner]:
    """A prefill of three prompts into slots 1 to 3, then four decode steps; the map
    relay adopts the buffers the static steps write, as the engine's does."""
    kv = KVCache(MODEL, POOL, CPU)
    if relay is None and maps:
        relay = _map_relay(spec, graph_written=bool(buckets), debug=debug)
    elif relay is None:
        relay = DirectRelay(
            POOL, CPU, no_ranges, "decode" if spec is None else spec.method
        )
    runner = ModelRunner(
        TargetModel(MODEL, CPU),
        kv,
        relay,
        spec=spec,
        buckets=buckets,
        resolve_in_graph=not debug,
    )
    slots = [1, 2, 3]
    lens = [len(p) for p in PROMPTS]
    width = max(lens)
    padded = [list(p) + [0] * (width - len(p)) for p in PROMPTS]
    reqs = [
        Request(RequestSpec(rid=i, prompt=p, max_new_tokens=8, arrival_step=0), slot=s)
        for i, (s, p) in enumerate(zip(slots, PROMPTS))
    ]
    prefill = ForwardBatch(
        ForwardMode.PREFILL,
        reqs,
        torch.tensor(slots),
        torch.tensor(padded),
        torch.tensor(lens),
        torch.tensor(lens),
        chunk_lens=torch.tensor(lens),
        final=[True] * 3,
    )
    outs = [StepOutput()]
    relay.scheduled(prefill)
    runner.forward(prefill, outs[0])
    for step in range(4):
        batch = _decode_batch(slots, relay, step + 2)
        outs.append(StepOutput())
        relay.scheduled(batch)
        runner.forward(batch, outs[-1])
    return outs, kv, runner


@pytest.mark.parametrize("maps", [False, True], ids=["direct", "map"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_padded_bucket_computes_what_the_eager_forward_does(
    mode: str, maps: bool
) -> None:
    """Three rows in a bucket of four: the same tokens, lengths and counts as the eager
    forward, and every slot's cache and history rows but the scratch slot's alike."""
    spec = MODES[mode]
    eager, eager_kv, _ = _run_steps(spec, (), maps=maps)
    static, static_kv, runner = _run_steps(spec, (4,), maps=maps)
    assert runner.graphs is not None and runner.graphs.runs == {4: 4}
    for a, b in zip(eager, static):
        for name in ("tokens", "counts", "new_seq_lens"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    torch.testing.assert_close(static_kv.k[:, 1:], eager_kv.k[:, 1:])
    torch.testing.assert_close(static_kv.v[:, 1:], eager_kv.v[:, 1:])
    assert torch.equal(static_kv.tokens[1:], eager_kv.tokens[1:])


#: Per mode: the map's graph-written buffers, and the ``Written`` buffer each is.
ADOPTED = {
    "decode": {"output_tokens_buf": "tokens"},
    "eagle": {
        "output_tokens_buf": "tokens",
        "topk_p_buf": "topk_p",
        "topk_index_buf": "topk_index",
        "new_seq_lens_buf": "new_seq_lens",
    },
    "ngram": {
        "output_tokens_buf": "tokens",
        "accept_tokens_buf": "accept_tokens",
        "new_seq_lens_buf": "new_seq_lens",
    },
}
ADOPTED["ngram_variable"] = ADOPTED["ngram"]


@pytest.mark.parametrize("mode", list(MODES))
def test_the_map_adopts_the_buffers_the_static_steps_write(mode: str) -> None:
    """Each graph-written buffer of the map is the tensor the static steps write into
    (the engine's, handed to the constructor), and holds the last step's rows: its
    bonus (or sampled) tokens and its new lengths."""
    spec = MODES[mode]
    relay = _map_relay(spec, graph_written=True)
    outs, _, runner = _run_steps(spec, (4,), maps=True, relay=relay)
    written = relay.written
    assert runner.graphs is not None and runner.graphs.written is written
    assert written is not None
    for buf, name in ADOPTED[mode].items():
        adopted, theirs = getattr(relay.map, buf), getattr(written, name)
        assert adopted is theirs and adopted.data_ptr() == theirs.data_ptr(), buf
    last, slots = outs[-1], torch.tensor([1, 2, 3])
    bonus = last.tokens.gather(1, last.counts[:, None] - 1).squeeze(1)
    assert torch.equal(written.tokens[slots], bonus)
    if spec is not None:
        assert written.new_seq_lens is not None
        assert torch.equal(written.new_seq_lens[slots], last.new_seq_lens)


def _scatters(relay: MapRelay, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """Per call of the map's ``stash`` and ``publish``, the ``index_copy_`` it dispatched."""
    calls: dict[str, list[int]] = {"stash": [], "publish": []}
    for name, seen in calls.items():
        method = getattr(relay.map, name, None)
        if method is None:  # plain decoding's map publishes nothing
            continue

        def counted(
            *args: object, method: Any = method, seen: list[int] = seen
        ) -> None:
            ops = count_ops(lambda: method(*args))
            seen.append(ops.data.count("index_copy_"))

        monkeypatch.setattr(relay.map, name, counted)
    return calls


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("adopted", [True, False], ids=["adopted", "own"])
def test_a_static_step_scatters_nothing_the_forward_wrote(
    mode: str, adopted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode step over static buffers leaves the map no scatter of a field it wrote
    itself: only EAGLE's hidden states are stashed. A map that keeps its own buffers
    is stashed and published field by field, with the same tokens."""
    spec = MODES[mode]
    relay = _map_relay(spec, graph_written=adopted)
    calls = _scatters(relay, monkeypatch)
    outs, _, _ = _run_steps(spec, (4,), maps=True, relay=relay)
    eager, _, _ = _run_steps(spec, (), maps=True)
    for a, b in zip(eager, outs):
        assert torch.equal(a.tokens, b.tokens)
    # The first call of each is the prefill's, which passes values.
    stashes, publishes = calls["stash"][1:], calls["publish"][1:]
    assert len(stashes) == 4 and len(publishes) == (0 if spec is None else 4)
    forward = {"decode": 1, "eagle": 4}.get(mode, 2)
    if adopted:
        assert stashes == [1 if mode == "eagle" else 0] * 4  # the hidden states
        assert publishes == [0] * len(publishes)
    else:
        assert stashes == [forward] * 4
        assert publishes == [1] * len(publishes)


@pytest.mark.parametrize("mode", list(MODES))
def test_debug_mode_checks_the_rows_the_static_steps_write(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debug maps report nothing of static steps that declare their writes
    (``graph_wrote``); a step that leaves the declaration out is reported at the next
    read of its rows, as a read before the graph ran."""
    spec = MODES[mode]
    _run_steps(spec, (4,), maps=True, debug=True)
    declared = MapRelay.graph_wrote
    steps = []

    def second_step_forgets(relay: MapRelay, slots: torch.Tensor) -> None:
        steps.append(slots)
        if len(steps) != 2:
            declared(relay, slots)

    monkeypatch.setattr(MapRelay, "graph_wrote", second_step_forgets)
    with pytest.raises(RelayDebugError, match="no graph_wrote"):
        _run_steps(spec, (4,), maps=True, debug=True)
    assert len(steps) == 2  # reported at the read after the step that forgot


def test_padded_rows_point_at_the_scratch_slot() -> None:
    """``fill`` copies the real rows and pads the rest with slot 0, length 1; ``adopt``
    of a resolve over the whole bucket zeroes what the padded rows gathered."""
    static = StaticInputs.allocate(4, MODEL, SpecConfig(steps=3, topk=2), CPU)
    static.slots.fill_(5)
    static.seq_lens.fill_(9)
    reqs = [
        Request(
            RequestSpec(rid=i, prompt=(1,), max_new_tokens=8, arrival_step=0), slot=s
        )
        for i, s in enumerate([2, 3])
    ]
    empty = torch.empty(0, dtype=torch.int64)
    batch = ForwardBatch(
        ForwardMode.DECODE,
        reqs,
        torch.tensor([2, 3]),
        empty,
        torch.tensor([7, 4]),
        empty,
    )
    static.fill(batch)
    assert static.slots.tolist() == [2, 3, 0, 0]
    assert static.seq_lens.tolist() == [7, 4, 1, 1]
    assert static.real.tolist() == [True, True, False, False]
    info = static.batch.spec_info
    info.bonus_tokens = torch.tensor([11, 12, -9, 10**9])  # what slot 0's rows held
    info.topk_p = torch.full((4, 2), float("nan"))
    info.topk_index = torch.tensor([[1, 2], [3, 4], [-1, -1], [-5, 7]])
    info.hidden_states = torch.ones(4, MODEL.hidden, dtype=MODEL.dtype)
    static.adopt(static.batch, SpecConfig(steps=3, topk=2), 4)
    assert static.tokens.tolist() == [11, 12, 0, 0]
    assert static.topk_index.tolist() == [[1, 2], [3, 4], [0, 0], [0, 0]]
    assert bool(static.topk_p[2:].eq(0).all()) and bool(static.topk_p[:2].isnan().all())
    assert static.hidden[2:].eq(0).all() and static.hidden[:2].eq(1).all()


def _config(spec: SpecConfig | None, device: str) -> EngineConfig:
    return EngineConfig(
        model=MODEL,
        spec=spec,
        device=device,
        workload=WorkloadConfig(
            requests=16,
            min_prompt=4,
            max_prompt=20,
            min_output=2,
            max_output=16,
            arrival_rate=2.0,
            prebuilt_share=0.3,
        ),
        scheduler=SchedulerConfig(max_running=6, max_prefill_tokens=32),
    )


def test_mixed_batches_run_eagerly() -> None:
    """A mixed batch (a prefill chunk riding with decode rows) runs the eager forward,
    counted, and the run still matches the synchronous one."""
    config = _config(None, "cpu")
    config = attrs.evolve(
        config,
        scheduler=attrs.evolve(config.scheduler, mixed=True, chunked_prefill=True),
    )
    sync = run_workload(attrs.evolve(config, overlap=False))
    static = run_workload(attrs.evolve(config, overlap=True, graphs=True))
    assert first_output_difference(sync.outputs, static.outputs) is None
    assert static.eager_decode_steps > 0 and sum(static.bucket_steps.values()) > 0
    assert static.graphs_captured == 0  # the CPU captures nothing


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", list(MODES))
def test_cuda_graphs_capture_once_and_replay(mode: str) -> None:
    """On CUDA every bucket's phases are captured once at warm-up and replayed: the
    overlap loop over graphs yields the eager synchronous loop's tokens."""
    spec = MODES[mode]
    config = _config(spec, "cuda")
    sync = run_workload(attrs.evolve(config, overlap=False))
    graphed = run_workload(attrs.evolve(config, overlap=True, graphs=True))
    phases = 1 if spec is None else 2
    assert graphed.graphs_captured == len(buckets_for(6)) * phases
    assert sum(graphed.bucket_steps.values()) > 0
    assert first_output_difference(sync.outputs, graphed.outputs) is None
    both = run_workload(attrs.evolve(config, overlap=False, graphs=True))
    assert first_output_difference(sync.outputs, both.outputs) is None
