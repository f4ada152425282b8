"""The model's forwards: compiled and eager agree, and the CPU lane's host turns."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from relay.engine import ModelConfig
from relay.engine import model as model_module
from relay.engine.lanes import ThreadLane
from relay.engine.model import DraftHead, KVCache, TargetModel

CONFIG = ModelConfig(vocab_size=128, hidden=32, layers=2, heads=2, ffn=48, max_context=32)
POOL = 6


def _compiled_or_skip() -> Any:
    kernels = model_module._kernels()
    if not isinstance(kernels.decode, torch.jit.ScriptFunction):
        pytest.skip("TorchScript is unavailable here: the forwards run eagerly")
    return kernels


def _agree(compiled: Callable[..., Any], eager: Callable[..., Any], *args: Any) -> None:
    """Run both on copies of ``args`` (the caches are written in place): same results."""
    copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    want = eager(*copies)
    got = compiled(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    for a, c in zip(args, copies):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, c, rtol=0, atol=0)  # the same cache writes


def test_compiled_forwards_match_eager() -> None:
    """The TorchScript forwards and the eager fallback give bit-identical results."""
    kernels = _compiled_or_skip()
    cpu = torch.device("cpu")
    target = TargetModel(CONFIG, cpu)
    draft = DraftHead(target)
    kv = KVCache(CONFIG, POOL, cpu)
    gen = torch.Generator().manual_seed(3)
    weights = (target.wqkv, target.wo, target.w_up, target.w_down, target.lm_head_t)

    slots = torch.tensor([3, 1, 5])
    prompt_lens = torch.tensor([4, 7, 2])
    prompts = torch.randint(0, CONFIG.vocab_size, (3, 7), generator=gen)
    _agree(kernels.prefill, model_module._prefill, prompts, prompt_lens, slots, target.embed,
           target.pos_embed, *weights, kv.k, kv.v)
    target.prefill(prompts, prompt_lens, slots, kv)  # fill the cache for the steps below

    seq_lens = prompt_lens + 1
    tokens = torch.randint(0, CONFIG.vocab_size, (3,), generator=gen)
    _agree(kernels.decode, model_module._decode, tokens, seq_lens, int(seq_lens.max()), slots,
           target.embed, target.pos_embed, *weights, kv.k, kv.v)

    steps, topk = 3, 2
    hidden = torch.randn(3, CONFIG.hidden, generator=gen, dtype=CONFIG.dtype)
    first = torch.randint(0, CONFIG.vocab_size, (3, topk), generator=gen)
    _agree(kernels.draft_and_verify, model_module._draft_and_verify, tokens, hidden, first, steps,
           seq_lens, int(seq_lens.max()), slots, target.embed, target.pos_embed, draft.w,
           *weights[:4], target.lm_head_t, kv.k, kv.v)
    result = draft.draft_and_verify(tokens, hidden, first, steps, seq_lens, int(seq_lens.max()),
                                    slots, kv)
    _agree(kernels.commit_and_extend, model_module._commit_and_extend, result.branch_k,
           result.branch_v, seq_lens, slots, result.hidden, result.bonus, topk, target.embed,
           draft.w, target.lm_head_t, kv.k, kv.v)


def test_forwards_run_eagerly_where_torchscript_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a working ``torch.jit.script`` (removed or failing) the functions run as written."""

    def broken(fn: object) -> object:
        raise RuntimeError("TorchScript is gone")

    monkeypatch.setattr(torch.jit, "script", broken)
    assert model_module._script(model_module._decode) is model_module._decode
    monkeypatch.delattr(torch.jit, "script")
    assert model_module._script(model_module._decode) is model_module._decode


def test_wait_returns_once_the_next_forward_runs_its_kernels() -> None:
    """``wait(N)`` returns only after forward N+1 finished its host-side prologue."""
    lane = ThreadLane()
    events: list[str] = []

    def step_n() -> None:
        events.append("N done")

    def step_next() -> None:
        time.sleep(0.05)  # a slow prologue: the scheduler must not start beside it
        events.append("N+1 prologue done")
        lane.kernels_started()
        time.sleep(0.05)
        events.append("N+1 done")

    try:
        first = lane.launch(step_n)
        lane.launch(step_next)
        lane.wait(first)
        events.append("host resumes")
        assert events == ["N done", "N+1 prologue done", "host resumes"]
    finally:
        lane.close()


def test_wait_does_not_hang_on_a_forward_without_kernels() -> None:
    """A forward that never calls ``kernels_started`` releases the host when it ends."""
    lane = ThreadLane()
    finished = threading.Event()
    try:
        first = lane.launch(lambda: None)
        lane.launch(lambda: finished.set())
        lane.wait(first)
        assert finished.is_set()
        last = lane.launch(lambda: None)
        lane.wait(last)  # nothing queued behind it: returns at once
    finally:
        lane.close()


@pytest.mark.parametrize("speculative", [False, True], ids=["decode", "eagle"])
def test_warm_up_touches_only_the_scratch_slot(speculative: bool) -> None:
    """Warming the forwards up writes slot 0's cache rows and nothing a request owns."""
    from relay.engine.relays import MapRelay
    from relay.engine.runner import ModelRunner, SpecConfig
    from relay.maps.eagle import EagleFutureMap

    cpu = torch.device("cpu")
    spec = SpecConfig(steps=3, topk=2) if speculative else None
    kv = KVCache(CONFIG, POOL, cpu)
    kv.k.fill_(7.0)
    kv.v.fill_(7.0)
    future_map = EagleFutureMap(cpu, POOL, topk=2, debug=True)
    before = {k: v.clone() for k, v in vars(future_map).items() if isinstance(v, torch.Tensor)}
    runner = ModelRunner(TargetModel(CONFIG, cpu), kv, MapRelay(future_map), spec=spec)
    runner.warm_up()
    assert bool((kv.k[:, 1:] == 7.0).all()) and bool((kv.v[:, 1:] == 7.0).all())
    assert not bool((kv.k[:, 0] == 7.0).all())  # the scratch rows were used
    for name, value in before.items():
        torch.testing.assert_close(getattr(future_map, name), value, rtol=0, atol=0,
                                   equal_nan=True, msg=name)
