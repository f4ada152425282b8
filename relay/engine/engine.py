"""The engine loop, in its two modes, and ``run_workload``: the API the demo and benchmarks use.

One loop serves both modes (Note [One schedule for both modes])::

    build batch N+1 (pre-fence: admit, filter and merge, pick rows)
    resolve lengths of N+1            overlap: waits for N's publish only
    launch N+1                        overlap: queued behind N; sync: runs now
    wait N, process N's results       overlap: N+1 keeps the forward busy

In overlap mode nothing in the scheduler reads a value forward N produced except
through the map (lengths, behind its fence) and N's host copy once N is done.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import torch

from relay import debug
from relay.engine.batch import ForwardBatch, ForwardMode, Request, Seeds, StepOutput
from relay.engine.executors import ForwardExecutor, make_executor
from relay.engine.graphs import buckets_for
from relay.engine.maps import MapSource
from relay.engine.model import KVCache, ModelConfig, TargetModel
from relay.engine.relays import DirectRelay, Relay, map_relay
from relay.engine.runner import ModelRunner
from relay.engine.scheduler import Scheduler, SchedulerConfig
from relay.engine.spec import SpecConfig
from relay.engine.trace import BUILD, HOST_WAIT, PROCESS, RUN, ranges_for
from relay.engine.workload import RequestSpec, WorkloadConfig, make_workload

__all__ = ["SCHEDULER_COUNTS", "EngineConfig", "RunResult", "StepAgreement"]
__all__ += ["ideal_speedup", "run_workload", "seed_prebuilt"]

#: The ``RunResult`` counts the scheduler keeps, under the same names.
SCHEDULER_COUNTS: tuple[str, ...] = ("decode_rows", "decode_tokens", "retractions")
SCHEDULER_COUNTS += ("aborts", "chunks", "prebuilt")
#: ``progress(finished, total)`` after each processed step.
Progress = Callable[[int, int], None]


@attrs.frozen(kw_only=True)
class EngineConfig:
    """Everything a run depends on."""

    model: ModelConfig = attrs.field(factory=ModelConfig)
    workload: WorkloadConfig = attrs.field(factory=WorkloadConfig)
    scheduler: SchedulerConfig = attrs.field(factory=SchedulerConfig)
    #: ``None``: plain decoding with the ``decode`` map; else speculative decoding,
    #: EAGLE with the ``eagle`` map or n-gram with the ``ngram`` map.
    spec: SpecConfig | None = None
    overlap: bool = True
    device: str = "cpu"
    #: Generated maps in debug mode (poisoned buffers, consume-once and fence checks).
    debug: bool = False
    #: Where the overlap loop's generated maps come from (default: ``relay.maps``).
    maps: MapSource = attrs.field(factory=MapSource)
    #: torch intra-op threads on the CPU (``None`` leaves torch's setting). One core
    #: plays the device, the rest run the scheduler; both modes use the same setting.
    cpu_threads: int | None = 1
    #: ``sys.setswitchinterval`` during a CPU run: the forward thread gets the GIL back
    #: within 1 ms of an op instead of up to 5 ms while the scheduler runs Python.
    switch_interval: float | None = 1e-3
    #: Open a named range around each piece of each step's work, for a profiler
    #: (``relay.engine.trace.record``); off, the ranges cost nothing (Note [Ranges
    #: that cost nothing when off] in relay/engine/trace.py).
    trace: bool = False
    #: Keep each decode step's input tokens per request (``RunResult.inputs``), read
    #: back on the forward: for comparing two runs step by step, not for timing.
    record_inputs: bool = False
    #: Decode steps run over static buffers per batch-size bucket, captured once in
    #: CUDA graphs and replayed on CUDA, run eagerly over the same buffers on the CPU
    #: (relay/engine/graphs.py); mixed batches and prefills run eagerly.
    graphs: bool = False


@attrs.frozen(kw_only=True)
class RunResult:
    """What one run produced and how fast."""

    outputs: dict[int, tuple[int, ...]]
    finish_reasons: dict[str, int]
    generated_tokens: int
    wall_seconds: float
    forward_busy_seconds: float
    steps: int
    #: Steps this rank ran with no requests, joining other ranks' steps.
    idle_steps: int
    #: Speculative decoding: rows of verify steps and the tokens they emitted.
    decode_rows: int
    decode_tokens: int
    #: Requests retracted (each time), aborted, prefill rows that were part of a
    #: context (chunks), and requests that arrived prebuilt.
    retractions: int = 0
    aborts: int = 0
    chunks: int = 0
    prebuilt: int = 0
    #: Ids of the requests aborted.
    aborted_ids: tuple[int, ...] = ()
    #: With ``record_inputs``: per decode step, (step, request id, input token) rows.
    inputs: tuple[tuple[int, int, int], ...] = ()
    #: With ``EngineConfig.graphs``: decode steps run per bucket size, decode steps
    #: that ran eagerly (mixed batches), and the CUDA graphs captured.
    bucket_steps: dict[int, int] = attrs.field(factory=dict)
    eager_decode_steps: int = 0
    graphs_captured: int = 0

    @property
    def tokens_per_second(self) -> float:
        """Output tokens per second of wall time."""
        return self.generated_tokens / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def occupancy(self) -> float:
        """Share of wall time the forward executor was busy."""
        wall = self.wall_seconds
        return self.forward_busy_seconds / wall if wall else 0.0

    @property
    def accept_length(self) -> float:
        """Tokens emitted per request per decode step (accepted drafts + the bonus)."""
        return self.decode_tokens / self.decode_rows if self.decode_rows else 0.0


def ideal_speedup(sync: RunResult) -> float:
    """The overlap speedup a perfect overlap would give a synchronous run: there the
    forward (busy) and the scheduler (the rest) take turns; overlapped, a step takes
    the longer of the two."""
    busy = sync.forward_busy_seconds
    rest = sync.wall_seconds - busy
    longer = max(busy, rest)
    return sync.wall_seconds / longer if longer > 0 else 1.0


class StepAgreement(Protocol):
    """How ranks share a step: each says whether it has a batch and more work."""

    def agree(self, active: bool, more: bool) -> tuple[bool, bool]:
        """(any rank has a batch now, any rank has work left)."""


def run_workload(
    config: EngineConfig,
    specs: Sequence[RequestSpec] | None = None,
    *,
    progress: Progress | None = None,
    agreement: StepAgreement | None = None,
    step_sync: Callable[[int], None] | None = None,
) -> RunResult:
    """Run ``specs`` (default: ``config.workload``) to completion and measure it;
    ``agreement`` and ``step_sync`` make it one data-parallel rank (``parallel``)."""
    device = torch.device(config.device)
    model, spec = config.model, config.spec
    mode = "decode" if spec is None else spec.method
    if specs is None:
        specs = make_workload(config.workload, model.vocab_size, model.eos_token_id)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(sys.setswitchinterval, sys.getswitchinterval())
        cleanup.callback(torch.set_num_threads, torch.get_num_threads())
        if device.type == "cpu" and config.cpu_threads is not None:
            torch.set_num_threads(config.cpu_threads)
        if device.type == "cpu" and config.switch_interval is not None:
            sys.setswitchinterval(config.switch_interval)
        if config.debug:
            # Debug maps check stream order only while the clocks are installed, from
            # before the lane's streams exist (docs/debugging.md).
            cleanup.enter_context(debug.happens_before())
        pool_size = config.scheduler.max_running + 1  # row 0 is the scratch row
        ranges = ranges_for(config.trace)  # chosen once per run
        executor = make_executor(
            device, overlap=config.overlap, cpu_threads=config.cpu_threads
        )
        cleanup.callback(executor.close)
        relay: Relay
        if config.overlap:
            maps = config.maps.load()  # Note [One set of map classes per run]
            relay = map_relay(
                maps,
                spec,
                device,
                pool_size,
                debug=config.debug,
                ranges=ranges,
                graph_written=config.graphs,  # the static-buffer steps write its rows
            )
        else:
            relay = DirectRelay(pool_size, device, ranges, mode)
        runner = ModelRunner(
            TargetModel(model, device),
            KVCache(model, pool_size, device),
            relay,
            spec=spec,
            step_sync=step_sync,
            kernels_started=executor.kernels_started,
            ranges=ranges,
            buckets=buckets_for(config.scheduler.max_running) if config.graphs else (),
            resolve_in_graph=not config.debug,
        )
        runner.warm_up()
        if config.record_inputs:
            runner.record = []
        lookahead = 1 if spec is None else spec.steps + 1
        late = spec is not None and spec.method == "ngram"  # its map binds tails
        scheduler = Scheduler(
            specs,
            config.scheduler,
            model,
            device=device,
            lookahead=lookahead,
            late_tails=late,
        )
        loop = "overlap" if config.overlap else "sync"
        with ranges(f"{RUN} {mode} {loop}", 0):
            result = _loop(scheduler, runner, executor, agreement, progress, len(specs))
    return result


def _loop(
    scheduler: Scheduler,
    runner: ModelRunner,
    executor: ForwardExecutor,
    agreement: StepAgreement | None,
    progress: Progress | None,
    total: int,
) -> RunResult:
    relay, ranges = runner.relay, runner.ranges
    in_flight: tuple[ForwardBatch, StepOutput, object] | None = None
    steps = idle_steps = 0
    start = time.perf_counter()
    while True:
        step = steps + 1  # the number this iteration's batch gets if it launches
        with ranges(BUILD, step):
            batch = scheduler.next_batch()
        seeds = scheduler.take_seeds()
        if seeds:
            seed_prebuilt(seeds, scheduler, relay, runner, executor)
        if batch is not None and batch.mode is ForwardMode.DECODE:
            batch.step = step
            if not scheduler.bound_tails(batch):  # else the forward binds them
                relay.resolve_lengths(batch)
                if not scheduler.cap_lengths(batch):
                    batch = batch.chunk  # a mixed batch's chunk runs alone
        active = batch is not None
        more = active or in_flight is not None or scheduler.has_work()
        if agreement is not None:  # data-parallel: another rank's batch or work counts
            active, more = agreement.agree(active, more)
        if not more:
            break
        launched = None
        if active:
            if batch is None:  # another rank has work: join its step
                batch = ForwardBatch.idle(scheduler.device)
                idle_steps += 1
            batch.step = step
            batch.released = scheduler.take_released()
            relay.scheduled(batch)
            out = StepOutput()
            handle = executor.launch(functools.partial(runner.forward, batch, out))
            launched = (batch, out, handle)
            steps += 1
        if in_flight is not None:
            done_batch, done_out, done_handle = in_flight
            with ranges(HOST_WAIT, done_batch.step):
                executor.wait(done_handle)
            with ranges(PROCESS, done_batch.step):
                scheduler.process(done_batch, done_out)
            if progress is not None:
                progress(scheduler.finished, total)
        in_flight = launched
        scheduler.clock += 1
    busy = executor.busy_seconds()  # waits for the executor
    wall = time.perf_counter() - start
    requests = sorted(scheduler.requests.items())
    graphs = runner.graphs
    outputs = {rid: tuple(r.output) for rid, r in requests}
    reasons = Counter(r.finish_reason or "unfinished" for _, r in requests)
    return RunResult(
        outputs=outputs,
        finish_reasons=dict(sorted(reasons.items())),
        generated_tokens=sum(len(o) for o in outputs.values()),
        wall_seconds=wall,
        forward_busy_seconds=busy,
        steps=steps,
        idle_steps=idle_steps,
        aborted_ids=tuple(rid for rid, r in requests if r.finish_reason == "abort"),
        inputs=tuple(runner.record or ()),
        bucket_steps=graphs.runs if graphs is not None else {},
        eager_decode_steps=graphs.eager_steps if graphs is not None else 0,
        graphs_captured=graphs.graphs if graphs is not None else 0,
        **{name: getattr(scheduler, name) for name in SCHEDULER_COUNTS},
    )


def seed_prebuilt(
    reqs: list[Request],
    scheduler: Scheduler,
    relay: Relay,
    runner: ModelRunner,
    executor: ForwardExecutor,
) -> None:
    """Seed admitted prebuilt requests' relay rows, behind every launched forward
    (Note [Seeding a prebuilt request] in relay/engine/relays.py)."""
    device = scheduler.device
    lens = [len(r.spec.prompt) for r in reqs]
    width = max(lens)
    prompts = [list(r.spec.prompt) + [0] * (width - n) for r, n in zip(reqs, lens)]
    first = [r.spec.first_token for r in reqs]
    slots = [r.slot for r in reqs]
    relay.seeded(slots, [n + 1 for n in lens])
    seeds = Seeds(
        slots=torch.tensor(slots, dtype=torch.int64).to(device),
        prompts=torch.tensor(prompts, dtype=torch.int64).to(device),
        prompt_lens=torch.tensor(lens, dtype=torch.int64).to(device),
        first_tokens=torch.tensor(first, dtype=torch.int64).to(device),
        released=scheduler.take_released(),
    )
    executor.launch(functools.partial(runner.seed, seeds))
