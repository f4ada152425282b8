"""What ``import relay`` offers a schema author: the whole vocabulary of relay.schema."""

from __future__ import annotations

import relay
import relay.schema


def test_every_name_of_the_schema_vocabulary_is_exported_by_the_package() -> None:
    """``from relay import TargetShape, Unwritten, IfNone`` works as the docs write it:
    each public class and constant of relay.schema is in ``relay.__all__`` and is the
    same object there."""
    helpers = {"bundled_names", "resolve_method"}  # functions, not vocabulary
    for name in set(relay.schema.__all__) - helpers:
        assert name in relay.__all__, name
        assert getattr(relay, name) is getattr(relay.schema, name), name
