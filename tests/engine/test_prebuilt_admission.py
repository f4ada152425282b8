"""A prebuilt request is admitted with the pages of every token its first decode step
holds: its prompt, the first token the prefill server sampled, and the look-ahead of the
step in flight and of its own, as ``_make_room`` grows every running request."""

from __future__ import annotations

import pytest
import torch

from relay.engine.model import ModelConfig
from relay.engine.scheduler import Scheduler, SchedulerConfig
from relay.engine.workload import RequestSpec


@pytest.mark.parametrize("lookahead", [1, 3])
def test_a_prebuilt_request_is_admitted_with_room_for_its_first_step(
    lookahead: int,
) -> None:
    """Pages of one token each: the admitted request holds its length (prompt + first
    token) plus two steps' look-ahead, not one token fewer."""
    prompt = (5, 6, 7, 8, 9)
    spec = RequestSpec(
        rid=0, prompt=prompt, max_new_tokens=8, arrival_step=0, first_token=11
    )
    scheduler = Scheduler(
        [spec],
        SchedulerConfig(max_running=2, kv_pages=64, page_size=1),
        ModelConfig(max_context=64),
        device=torch.device("cpu"),
        lookahead=lookahead,
    )
    batch = scheduler.next_batch()
    assert batch is not None and [r.spec.rid for r in batch.reqs] == [0]
    (req,) = batch.reqs
    assert req.seq_len == len(prompt) + 1
    assert req.pages == len(prompt) + 1 + 2 * lookahead
