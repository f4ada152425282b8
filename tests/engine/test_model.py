"""The model's forwards: compiled and eager agree, and the CPU worker's host turns."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch

from relay.engine import ModelConfig
from relay.engine.executors import WorkerExecutor
from relay.engine.model import DraftHead, Forwards, KVCache, TargetModel

CONFIG = ModelConfig(
    vocab_size=128, hidden=32, layers=2, heads=2, ffn=48, max_context=32
)
POOL = 6


def _forwards(compiled: bool, spec: bool = True) -> tuple[Forwards, KVCache]:
    cpu = torch.device("cpu")
    target = TargetModel(CONFIG, cpu)
    kv = KVCache(CONFIG, POOL, cpu)
    kv.k.normal_(generator=torch.Generator().manual_seed(5))
    kv.v.normal_(generator=torch.Generator().manual_seed(6))
    return Forwards(
        target, kv, DraftHead(target) if spec else None, compiled=compiled
    ), kv


def _same(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    else:
        for g, w in zip(got, want, strict=True):
            _same(g, w)


def test_compiled_forwards_match_eager() -> None:
    """The TorchScript forwards and the eager ones give bit-identical results and writes."""
    compiled, kv_c = _forwards(compiled=True)
    if hasattr(torch.jit, "script"):
        assert compiled.compiled, (
            "TorchScript is available but the forwards did not compile"
        )
    eager, kv_e = _forwards(compiled=False)
    assert not eager.compiled
    gen = torch.Generator().manual_seed(3)
    slots = torch.tensor([3, 1, 5])
    prompt_lens = torch.tensor([4, 7, 2])
    prompts = torch.randint(0, CONFIG.vocab_size, (3, 7), generator=gen)
    seq_lens = prompt_lens + 1
    tokens = torch.randint(0, CONFIG.vocab_size, (3,), generator=gen)
    hidden = torch.randn(3, CONFIG.hidden, generator=gen, dtype=CONFIG.dtype)
    first = torch.randint(0, CONFIG.vocab_size, (3, 2), generator=gen)
    steps, topk, width = 3, 2, int(seq_lens.max())
    at = kv_c.req_to_token[slots, seq_lens - 1]

    calls: list[Callable[[Forwards], Any]] = [
        lambda f: f.prefill(prompts, prompt_lens, slots),
        lambda f: f.decode(tokens, seq_lens, width, slots, at),
        lambda f: f.extend(hidden, tokens, topk),
        lambda f: attrs.astuple(
            f.draft_and_verify(tokens, hidden, first, steps, seq_lens, width, slots)
        ),
        lambda f: f.commit_and_extend(
            f.draft_and_verify(tokens, hidden, first, steps, seq_lens, width, slots),
            at,
            topk,
        ),
    ]
    for call in calls:
        _same(call(compiled), call(eager))
        _same((kv_c.k, kv_c.v), (kv_e.k, kv_e.v))  # the same cache writes
    assert compiled.program.args == []  # a call's tensors are not kept


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "eager"])
def test_decode_rows_write_their_kv_where_the_locations_say(compiled: bool) -> None:
    """The table is the cache's layout, and decode and commit write a row's new keys
    and values at the location they are given (the rest of a verify's after it), not
    at the row's own slot and length: a wrong location writes another row's cache.
    A decode given no locations writes at each slot's row at its length."""
    forwards, kv = _forwards(compiled=compiled)
    width = CONFIG.max_context
    assert kv.req_to_token.shape == (POOL, width)
    assert kv.req_to_token[3, 5] == 3 * width + 5
    tokens, seq_lens, slots = (
        torch.tensor([9, 4]),
        torch.tensor([6, 3]),
        torch.tensor([2, 4]),
    )
    elsewhere = kv.req_to_token[torch.tensor([5, 1]), torch.tensor([10, 20])]
    before = kv.k.clone()
    forwards.decode(tokens, seq_lens, 6, slots, elsewhere)
    changed = (kv.k != before).any(-1).any(-2).any(0)  # (pool, max_context)
    assert changed.nonzero().tolist() == [[1, 20], [5, 10]]
    # No locations (a plain decode's own lengths): each slot's row at its length.
    before = kv.k.clone()
    forwards.decode(tokens, seq_lens, 6, slots, torch.empty(0, dtype=torch.int64))
    changed = (kv.k != before).any(-1).any(-2).any(0)
    assert changed.nonzero().tolist() == [[2, 5], [4, 2]]
    hidden = torch.randn(2, CONFIG.hidden, dtype=CONFIG.dtype)
    first = torch.tensor([[1, 2], [3, 4]])
    result = forwards.draft_and_verify(tokens, hidden, first, 3, seq_lens, 6, slots)
    before = kv.v.clone()
    forwards.commit(result, elsewhere)
    changed = (kv.v != before).any(-1).any(-2).any(0)
    want = [[1, 20 + j] for j in range(4)] + [[5, 10 + j] for j in range(4)]
    assert changed.nonzero().tolist() == want


def test_forwards_run_eagerly_where_torchscript_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a working ``torch.jit.script`` (removed or failing) the functions run as written."""

    def broken(fn: object) -> object:
        raise RuntimeError("TorchScript is gone")

    monkeypatch.setattr(torch.jit, "script", broken)
    forwards, _ = _forwards(compiled=True, spec=False)
    assert not forwards.compiled
    monkeypatch.delattr(torch.jit, "script")
    forwards, _ = _forwards(compiled=True, spec=False)
    assert not forwards.compiled
    slots = torch.tensor([1, 2])
    hidden, tokens = forwards.prefill(
        torch.tensor([[5, 6], [7, 0]]), torch.tensor([2, 1]), slots
    )
    assert hidden.shape == (2, CONFIG.hidden) and tokens.shape == (2,)


def test_wait_returns_once_the_next_forward_runs_its_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``wait(N)`` returns only after forward N+1 finished its host-side prologue."""
    lane = WorkerExecutor()
    events: list[str] = []
    host_waits = threading.Event()  # the host is blocked in ``wait`` on the worker
    host_resumed = threading.Event()
    original_wait = lane.stream.wait_ticket

    def spy_wait(ticket: int, done: Callable[[], bool], *, join: bool = True) -> None:
        host_waits.set()
        original_wait(ticket, done, join=join)

    def step_n() -> None:
        events.append("N done")

    def step_next() -> None:
        # The prologue runs while the host waits; its kernels' part only once the host
        # resumed, as the scheduler's Python runs beside a forward's kernels. Gates,
        # not sleeps; the 60 s bounds only keep a bug from hanging the suite.
        host_waits.wait(timeout=60)
        events.append("N+1 prologue done")
        lane.kernels_started()
        host_resumed.wait(timeout=60)
        events.append("N+1 done")

    monkeypatch.setattr(lane.stream, "wait_ticket", spy_wait)
    try:
        first = lane.launch(step_n)
        lane.launch(step_next)
        lane.wait(first)
        events.append("host resumes")
        host_resumed.set()
        lane.wait(first + 1)
        assert events == ["N done", "N+1 prologue done", "host resumes", "N+1 done"]
    finally:
        host_waits.set()
        host_resumed.set()
        lane.close()


def test_wait_does_not_hang_on_a_forward_without_kernels() -> None:
    """A forward that never calls ``kernels_started`` releases the host when it ends."""
    lane = WorkerExecutor()
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
    from relay.engine.maps import MapSource
    from relay.engine.relays import map_relay
    from relay.engine.runner import ModelRunner
    from relay.engine.spec import SpecConfig

    cpu = torch.device("cpu")
    spec = SpecConfig(steps=3, topk=2) if speculative else None
    kv = KVCache(CONFIG, POOL, cpu)
    kv.k.fill_(7.0)
    kv.v.fill_(7.0)
    relay = map_relay(MapSource().load(), SpecConfig(), cpu, POOL, debug=True)
    future_map = relay.map
    before = {
        k: v.clone() for k, v in vars(future_map).items() if isinstance(v, torch.Tensor)
    }
    runner = ModelRunner(
        TargetModel(CONFIG, cpu),
        kv,
        relay,
        spec=spec,
    )
    runner.warm_up()
    assert bool((kv.k[:, 1:] == 7.0).all()) and bool((kv.v[:, 1:] == 7.0).all())
    assert not bool((kv.k[:, 0] == 7.0).all())  # the scratch rows were used
    for name, value in before.items():
        torch.testing.assert_close(
            getattr(future_map, name), value, rtol=0, atol=0, equal_nan=True, msg=name
        )


def test_tree_attention_equals_attending_each_branch_alone() -> None:
    """Attention over a shared prefix gives what each branch gets as its own row."""
    from relay.engine.model import _tree_attention

    gen = torch.Generator().manual_seed(11)
    n, topk, width, heads, hd, prefix = 3, 2, 4, 2, 8, 6

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v = (
        rand(n * topk, width, heads, hd),
        rand(n * topk, heads, width, hd),
        rand(n * topk, heads, width, hd),
    )
    prefix_k, prefix_v = rand(n, heads, prefix, hd), rand(n, heads, prefix, hd)
    prefix_ok = torch.arange(prefix) < torch.tensor([6, 1, 3])[:, None]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    got = _tree_attention(q, k, v, prefix_k, prefix_v, prefix_ok, causal)

    # Reference: every branch a row of its own, its request's prefix copied in front.
    rows_prefix_k = prefix_k.repeat_interleave(topk, dim=0)
    rows_prefix_v = prefix_v.repeat_interleave(topk, dim=0)
    mask = torch.cat(
        [
            prefix_ok.repeat_interleave(topk, dim=0)[:, None, None, :].expand(
                -1, 1, width, prefix
            ),
            causal.expand(n * topk, 1, width, width),
        ],
        dim=-1,
    )
    want = (
        torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2),
            torch.cat([rows_prefix_k, k], dim=2),
            torch.cat([rows_prefix_v, v], dim=2),
            attn_mask=mask,
        )
        .transpose(1, 2)
        .reshape(n * topk, width, heads * hd)
    )
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
