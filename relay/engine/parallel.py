"""Data-parallel ranks: one process each, with its own scheduler, maps and forward executor.

Requests are dealt round-robin. Ranks share every step, as data-parallel attention
does: the schedulers agree (gloo, host tensors) whether any rank has a batch and
any has work left, and every forward joins one collective on its own group (gloo or
nccl); a rank without requests runs an idle forward (relay calls on zero indices).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import tempfile
from collections import Counter
from pathlib import Path

import attrs
import torch
import torch.distributed as dist

from relay.engine.engine import SCHEDULER_COUNTS, EngineConfig, RunResult, run_workload
from relay.engine.workload import make_workload

__all__ = ["merge_results", "run_data_parallel", "run_data_parallel_many"]


@attrs.frozen
class _GroupAgreement:
    """The schedulers' per-step agreement, on a host (gloo) group."""

    group: dist.ProcessGroup

    def agree(self, active: bool, more: bool) -> tuple[bool, bool]:
        flags = torch.tensor([int(active), int(more)], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flags[0]), bool(flags[1])


def _sync_tokens(group: dist.ProcessGroup, device: torch.device, tokens: int) -> None:
    """The forward's collective: every rank learns the step's global token count, as
    data-parallel attention does to pad its shared layers."""
    count = torch.tensor([tokens], dtype=torch.int64, device=device)
    dist.all_reduce(count, group=group)


def _rank_main(rank: int, world: int, configs: list[EngineConfig], shared: str) -> None:
    cuda = configs[0].device.startswith("cuda")
    backend = "nccl" if cuda else "gloo"
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, init_method=f"file://{shared}/init", rank=rank, world_size=world
    )
    try:
        agree = _GroupAgreement(dist.new_group(backend="gloo"))
        sync = functools.partial(_sync_tokens, dist.new_group(backend=backend), device)
        results = []
        for config in configs:
            model = config.model
            every = make_workload(config.workload, model.vocab_size, model.eos_token_id)
            specs = [s for s in every if s.rid % world == rank]  # round-robin
            on_rank = attrs.evolve(config, device=str(device))
            results.append(
                run_workload(on_rank, specs, agreement=agree, step_sync=sync)
            )
        Path(shared, f"rank{rank}.pkl").write_bytes(pickle.dumps(results))
    finally:
        dist.destroy_process_group()


#: ``RunResult`` counts that add up over ranks.
_SUMMED: tuple[str, ...] = ("generated_tokens", "idle_steps", "eager_decode_steps")
_SUMMED += ("graphs_captured",)
_SUMMED += SCHEDULER_COUNTS


def merge_results(results: list[RunResult]) -> RunResult:
    """One result for all ranks: outputs together, the slowest rank's wall time, and
    the mean busy time (so ``occupancy`` is the ranks' mean)."""
    outputs = {rid: out for r in results for rid, out in r.outputs.items()}
    busy = sum(r.forward_busy_seconds for r in results)
    reasons = sum((Counter(r.finish_reasons) for r in results), Counter[str]())
    return RunResult(
        outputs=dict(sorted(outputs.items())),
        finish_reasons=dict(sorted(reasons.items())),
        wall_seconds=max(r.wall_seconds for r in results),
        forward_busy_seconds=busy / len(results),
        steps=max(r.steps for r in results),
        aborted_ids=tuple(sorted(i for r in results for i in r.aborted_ids)),
        bucket_steps=dict(sum((Counter(r.bucket_steps) for r in results), Counter())),
        **{name: sum(getattr(r, name) for r in results) for name in _SUMMED},
    )


def run_data_parallel(
    config: EngineConfig, ranks: int
) -> tuple[RunResult, list[RunResult]]:
    """Run ``config.workload`` on ``ranks`` spawned processes (on CUDA, each on the
    GPU of its rank number); (merged, per rank)."""
    (per_rank,) = run_data_parallel_many([config], ranks)
    return merge_results(per_rank), per_rank


def run_data_parallel_many(
    configs: list[EngineConfig], ranks: int
) -> list[list[RunResult]]:
    """Run each of ``configs`` in turn on the same ``ranks`` spawned processes (one
    start-up for all); per config, the results of each rank."""
    config = configs[0]
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1 (got {ranks})")
    if config.device.startswith("cuda") and (gpus := torch.cuda.device_count()) < ranks:
        raise ValueError(f"{ranks} ranks need {ranks} GPUs; {gpus} found")
    with tempfile.TemporaryDirectory(prefix="relay-dp-") as shared:
        env_before = os.environ.get("OMP_NUM_THREADS")
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # ranks share the host's cores
        try:
            # Spawned: no forked torch or CUDA state.
            context = multiprocessing.get_context("spawn")
            procs = [
                context.Process(
                    target=_rank_main,
                    args=(rank, ranks, list(configs), shared),
                    name=f"relay-rank{rank}",
                )
                for rank in range(ranks)
            ]
            for proc in procs:
                proc.start()
            for proc in procs:
                proc.join()
            failed = ", ".join(p.name for p in procs if p.exitcode != 0)
            if failed:
                raise RuntimeError(f"data-parallel ranks failed: {failed} (see above)")
        finally:
            if env_before is None:
                os.environ.pop("OMP_NUM_THREADS", None)
        files = [Path(shared, f"rank{r}.pkl") for r in range(ranks)]
        per_rank = [pickle.loads(f.read_bytes()) for f in files]
    return [[per_rank[r][i] for r in range(ranks)] for i in range(len(configs))]
