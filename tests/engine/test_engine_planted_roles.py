"""An attribute in two roles, planted into the reference engine's own n-gram schema.

The engine's n-gram relay names every kind of batch path relay reads or writes: the
slots, the requests (``rids``), a counted scatter's offsets, counts and rows, the
mixed batch's tail rows and their KV locations and table. Each plant below gives one
of those paths a second role, the way a port mixes up two attributes; each is
refused when the map is generated, at the plant's line, naming both roles, so no
engine run ever reads the slots as KV locations or draft counts. Unplanted, the
engine's schema has no issue.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from relay.codegen.validate import validate
from relay.schema import Field, Scatter, Schema, SourceLocation, TailsKv
from relay.schemas.ngram import SCHEMA as NGRAM


def _field(name: str) -> Field:
    return next(f for f in NGRAM.fields if f.name == name)


def _planted(field: Field) -> Schema:
    return NGRAM.derive(
        name="PlantedNgramFutureMap",
        doc="The engine's n-gram relay, planted.",
        replace=[field],
    )


def _kv(locations: str) -> tuple[Schema, SourceLocation]:
    lens = _field("new_seq_lens")
    assert lens.tails is not None and lens.tails.kv is not None
    kv = TailsKv(locations=locations, table=lens.tails.kv.table)
    planted = attrs.evolve(lens, tails=attrs.evolve(lens.tails, kv=kv))
    return _planted(planted), kv.declared_at


def _counts(lengths: str) -> tuple[Schema, SourceLocation]:
    drafts = _field("accept_tokens")
    assert isinstance(drafts.resolve, Scatter)
    scatter = Scatter(
        offsets=drafts.resolve.offsets, lengths=lengths, rows=drafts.resolve.rows
    )
    return _planted(attrs.evolve(drafts, resolve=scatter)), scatter.declared_at


#: (id, the plant, a phrase of the problem): each overwrites or misreads engine state
#: without a word if it is generated.
PLANTS: list[tuple[str, Callable[[], tuple[Schema, SourceLocation]], str]] = [
    (
        "kv-locations-are-the-slots",
        lambda: _kv(NGRAM.indices),
        f"TailsKv(locations=...) '{NGRAM.indices}' is also the schema's indices",
    ),
    (
        "kv-locations-are-the-tails-rows",
        lambda: _kv("mix_running_indices"),
        "TailsKv(locations=...) 'mix_running_indices' is also the Tails(rows=...)",
    ),
    (
        "kv-locations-are-the-requests",
        lambda: _kv("rids"),
        "TailsKv(locations=...) 'rids' is also the schema's owners",
    ),
    (
        "kv-locations-are-their-table",
        lambda: _kv("req_to_token"),
        "'req_to_token' is also the TailsKv(locations=...)",
    ),
    (
        "draft-counts-are-the-slots",
        lambda: _counts(NGRAM.indices),
        f"'{NGRAM.indices}' is also the schema's indices",
    ),
    (
        "draft-counts-are-the-requests",
        lambda: _counts("rids"),
        "'rids' is also the schema's owners",
    ),
]


def test_the_engines_schema_has_one_role_per_path() -> None:
    assert [str(issue) for issue in validate(NGRAM, str)] == []


@pytest.mark.parametrize(
    ("plant", "problem"),
    [(plant, problem) for _, plant, problem in PLANTS],
    ids=[name for name, _, _ in PLANTS],
)
def test_a_path_planted_in_two_roles_is_refused_at_its_line(
    plant: Callable[[], tuple[Schema, SourceLocation]], problem: str
) -> None:
    schema, at = plant()
    issues = validate(schema, str)
    assert len(issues) == 1, [str(issue) for issue in issues]
    (issue,) = issues
    assert (issue.path, issue.line) == (at.file, at.line)
    assert problem in issue.problem, issue.problem
    assert issue.fix
