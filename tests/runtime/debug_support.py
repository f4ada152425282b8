"""Helpers of the tests that drive debug mode through generated maps."""

from __future__ import annotations

import typing
from typing import Any

import torch

from relay.schema import Field, Lane, Resolve, Schema
from relay.testing import Namespace, load_map_class


def slots(*values: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """An index tensor of request-pool slots."""
    return torch.tensor(values, dtype=dtype)


def batch(*values: int) -> Namespace:
    """A batch of the given slots with a ``spec_info`` to resolve into (any attribute)."""
    return Namespace(req_pool_indices=slots(*values), spec_info=Namespace())


def placeholder_map_class() -> type[Any]:
    """A generated map with one placeholder field: ``tokens`` -> ``batch.input_ids``."""
    return load_map_class(
        Schema(
            name="PlaceholderFutureMap",
            fields=[
                Field(
                    "output_tokens",
                    lane=Lane.FORWARD,
                    dtype=torch.int64,
                    source="tokens",
                    target="input_ids",
                    resolve=Resolve.PLACEHOLDER,
                ),
            ],
        )
    )


def payload_of(cls: type[Any], **values: Any) -> Any:
    """The payload class of generated map ``cls``, built from ``values``."""
    return typing.get_type_hints(cls.stash)["payload"](**values)
