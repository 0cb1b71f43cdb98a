"""A batch as the trainers take it: a tensor, or tuples, lists, namedtuples and dicts of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["map_tensors", "tensors_in"]


def map_tensors(function: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """``batch`` with ``function`` applied to each of its tensors, in the same structure
    (tuples, lists, namedtuples, dicts)."""
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, Mapping):
        return {key: map_tensors(function, value) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        items = [map_tensors(function, item) for item in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)  # a namedtuple too
    return batch


def tensors_in(batch: Any) -> list[torch.Tensor]:
    """The tensors in a batch: itself, or those in its tuples, lists and dicts."""
    found: list[torch.Tensor] = []

    def collect(tensor: torch.Tensor) -> torch.Tensor:
        found.append(tensor)
        return tensor

    map_tensors(collect, batch)
    return found
