"""docs/integrating.md's calls for an engine that indexes by last step's row run as
written against the code: its ``SlotTable`` and map calls, with small stand-ins for the
engine's own values."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from relay.testing import Namespace

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "integrating.md"


def _snippet() -> str:
    """The guide's Python block that builds a ``SlotTable``."""
    blocks = re.findall(
        r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL
    )
    (found,) = [b for b in blocks if "SlotTable(" in b and "slots.take(req_id)" in b]
    return found


def test_the_guides_slot_table_calls_run() -> None:
    """One request takes a slot, one step launches and is processed, its drafts are
    looked up, resolved and stashed: every call exists with the arguments the guide
    gives, and the stash lands in the request's slot."""
    scope = {
        "device": "cpu",
        "pool_size": 4,
        "K": 2,
        "ci_debug": False,
        "req_id": "r0",
        "finished_req_ids": [],
        "req_ids": ["r0"],
        "handed_req_ids": ["r0"],
        "done_step": 0,
        "lookup": Namespace(),
        "batch": Namespace(input_ids=torch.zeros(3, dtype=torch.int32)),
        "query_start_loc": torch.tensor([0], dtype=torch.int32),
        "handed_rows": torch.tensor([0]),  # the handed-over rows' positions
        "scheduled_drafts": torch.tensor([1], dtype=torch.int32),
        "sampled": torch.tensor([5]),
        "drafts": torch.tensor([[6, 7]]),
        "draft_counts": torch.tensor([1]),
    }
    exec(compile(_snippet(), str(GUIDE), "exec"), scope)
    slots, relay = scope["slots"], scope["relay"]
    assert scope["step"] == 1 and slots.slot("r0") == 1
    assert relay.sampled_tokens_buf[1].item() == 5
    slots.finish(["r0"])  # the step is in flight: the slot is held back
    assert slots.held_back == 1
    slots.processed(scope["step"])
    assert slots.free == 3
