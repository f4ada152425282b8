"""Bad ``Switch`` and ``Staged`` declarations: each reported at its line, with the fix."""

from __future__ import annotations

import pytest
from codegen_support import Project, line_of

from relay.codegen import explicit_job, plan
from relay.errors import SchemaError

SRC = "schemas/bad.py"

PRELUDE = (
    "import torch\n\n"
    "from relay.schema import Field, Lane, Schema, Staged, Switch, extra\n\n"
)
TOKENS = 'Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, target="spec_info.t"),'


def _module(
    project: Project,
    fields: list[str],
    *,
    staged: str | None = None,
    indices: str = "spec_info.slots",
) -> None:
    options = f"    indices={indices!r},\n"
    if staged is not None:
        options += f"    staged={staged},\n"
    body = "".join(f"        {line}\n" for line in fields)
    text = (
        PRELUDE
        + f"SCHEMA = Schema(\n    name='BadFutureMap',\n{options}    fields=[\n"
        + body
        + "    ],\n)\n"
    )
    (project.schemas / "bad.py").write_text(text, encoding="utf-8")


def _one_issue(project: Project) -> str:
    job = explicit_job([project.schemas / "bad.py"], project.maps)
    with pytest.raises(SchemaError) as excinfo:
        plan(job)
    messages = [str(issue) for issue in excinfo.value.issues]
    assert len(messages) == 1, messages
    return messages[0]


@pytest.mark.parametrize(
    ("keyword", "why"),
    [
        ("need topk", "is not a Python identifier"),
        ("debug", "is a name the generated module binds itself"),
        ("width", "is already a keyword of the constructor (a dim)"),
        ("w_buf", "is already an attribute or method of the map"),
    ],
)
def test_a_switch_keyword_the_constructor_cannot_take(
    project: Project, keyword: str, why: str
) -> None:
    """A ``Switch`` keyword must be a constructor keyword of its own."""
    _module(
        project,
        [
            (
                'Field("w", lane=Lane.FORWARD, dtype=torch.int64, shape=("width",), '
                'target="spec_info.w"),'
            ),
            f'extra("probs", target="spec_info.probs", gate=Switch({keyword!r})),',
        ],
    )
    line = line_of(project.schemas / "bad.py", "spec_info.probs")
    assert _one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.probs: Switch(keyword=...) names the "
        f"constructor keyword that turns the field on or off; {keyword!r} "
        f"{why}\n"
        '    fix: name it after what the map relays, e.g. gate=Switch("need_topk")'
    )


def test_a_switch_on_a_required_field(project: Project) -> None:
    """A switched field is an optional gathered forward field, as every gate's."""
    _module(
        project,
        [
            (
                'Field("t", lane=Lane.FORWARD, dtype=torch.int64, target="spec_info.t", '
                'gate=Switch("need_t")),'
            )
        ],
    )
    line = line_of(project.schemas / "bad.py", "need_t")
    message = _one_issue(project)
    assert message.startswith(
        f"{SRC}:{line}: error: BadFutureMap.t: gate=... says whether a batch's rows "
        "hold an optional gathered forward-lane field (got gate=Switch(keyword="
        "'need_t'), lane=Lane.FORWARD, optional=False"
    )


@pytest.mark.parametrize(
    ("method", "why"),
    [
        ("stash", "is a name the generated module binds itself"),
        ("resolve_seq_lens", "is a method or attribute the generated map has already"),
        ("lens_buf", "is a method or attribute the generated map has already"),
        ("make-staged", "is not a Python identifier"),
    ],
)
def test_a_staged_method_name_the_map_cannot_take(
    project: Project, method: str, why: str
) -> None:
    """``Staged(method)`` names a method of its own."""
    lens = 'Field("lens", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens"),'
    _module(project, [TOKENS, lens], staged=f"Staged({method!r})")
    line = line_of(project.schemas / "bad.py", "staged=")
    assert _one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap: Staged(method=...) names the method that "
        f"fills a staged draft input; {method!r} {why}\n"
        '    fix: name it after what it builds, e.g. Staged("make_staged_spec_input")'
    )


def test_staged_slots_on_the_batch_itself(project: Project) -> None:
    """``Staged`` fills the object holding the slots: the batch itself has none."""
    _module(
        project,
        ['Field("t", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids"),'],
        staged='Staged("make_staged")',
        indices="req_pool_indices",
    )
    line = line_of(project.schemas / "bad.py", "staged=")
    assert _one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap: Staged(...) fills the object that holds "
        "the slots, but indices='req_pool_indices' is an attribute of the batch itself\n"
        '    fix: read the slots through the draft input, e.g. indices="spec_info.future_'
        'indices", or remove staged=...'
    )


def test_a_staged_gate_outside_the_draft_input(project: Project) -> None:
    """Every per-batch gate a ``Staged`` method sets is a flag of the draft input."""
    _module(
        project,
        [TOKENS, 'extra("dsa", target="spec_info.dsa", gate="dsa_available"),'],
        staged='Staged("make_staged")',
    )
    line = line_of(project.schemas / "bad.py", "dsa_available")
    assert _one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.dsa: Staged(...) fills batch.spec_info, "
        "so each gate must be a flag of it (got gate='dsa_available')\n"
        '    fix: keep the flag on the draft input, e.g. gate="spec_info.<flag>"'
    )


def test_staged_given_something_else(project: Project) -> None:
    """``staged=`` takes a ``Staged(...)``."""
    _module(project, [TOKENS], staged='"make_staged"')
    line = line_of(project.schemas / "bad.py", "staged=")
    assert _one_issue(project) == (
        f"{SRC}:{line - 3}: error: BadFutureMap: staged must be a Staged(...) or None "
        "(got 'make_staged' that is a str)\n"
        '    fix: write staged=Staged("make_staged_spec_input")'
    )
