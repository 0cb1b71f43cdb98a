"""What ``steadystep.torch`` keeps to notice, in one comparison per step, what a training
script changed by hand: containers that count their changes, standing in for torch's own
(a group's list of parameters, the optimizer's state and each parameter's dict in it), and
the runs a group is stepped in when its parameters' step counts differ.

torch.optim reads all of these at every step; a fused step over arenas cannot afford to
check every view of every parameter each time (BENCHMARKS.md), so it checks one
count of changes instead, and looks closer only when it moved.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np


class Parameters(list):
    """A group's list of parameters that counts its changes (append, ``[i] = p``, pop, sort...),
    so that a step tells in one comparison whether the group must be packed again."""

    changes = 0

    def _changed(self) -> None:
        self.changes += 1


class State(collections.defaultdict):
    """The optimizer's ``state`` (torch's defaultdict of per-parameter dicts), counting the
    changes made to it and to every parameter's dict in it (an entry deleted or replaced, a
    tensor put in place of a view), so that a step tells in one comparison whether it must
    check its flat buffers against the state again. A copy is torch's plain defaultdict."""

    changes = 0

    def __init__(self, entries: dict[Any, dict[str, Any]]):
        super().__init__(dict)
        for parameter, entry in entries.items():
            dict.__setitem__(self, parameter, ParameterState(self, entry))

    def __missing__(self, parameter: Any) -> ParameterState:
        entry = self[parameter] = ParameterState(self, {})
        return entry

    def __reduce__(self) -> tuple:
        return collections.defaultdict, (dict, {parameter: dict(entry) for parameter, entry in self.items()})

    def _changed(self) -> None:
        self.changes += 1


class ParameterState(dict):
    """One parameter's state in a State, whose count its changes advance."""

    def __init__(self, owner: State, entry: dict[str, Any]):
        super().__init__(entry)
        self.owner = owner

    def __reduce__(self) -> tuple:
        return dict, (dict(self),)

    def _changed(self) -> None:
        self.owner.changes += 1


def _counting(method: Callable) -> Callable:
    def changed(self, *args, **kwargs):
        self._changed()
        return method(self, *args, **kwargs)

    return changed


_LIST_CHANGES = (
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "sort",
    "reverse",
    "__setitem__",
    "__delitem__",
    "__iadd__",
    "__imul__",
)  # every method of list that changes it
_DICT_CHANGES = ("__setitem__", "__delitem__", "pop", "popitem", "clear", "update", "setdefault", "__ior__")  # of dict
for _kind, _base, _names in (
    (Parameters, list, _LIST_CHANGES),
    (State, dict, _DICT_CHANGES),
    (ParameterState, dict, _DICT_CHANGES),
):
    for _name in _names:
        setattr(_kind, _name, _counting(getattr(_base, _name)))
del _kind, _base, _names, _name


class Runs:
    """Runs of consecutive parameters of a group that share a value (a step count; whether a
    momentum buffer starts), where the values differ: the parameters each run holds, and
    each buffer of the group's layout cut to the runs, its views made once (a step remembers
    the arrays it has checked: new views at every step would be checked at every step)."""

    def __init__(self, first: list[int], end: list[int], layout: Any):
        self.first, self.end = first, end
        self._slices = [slice(layout.offsets[start], layout.extent(stop - 1)[1]) for start, stop in zip(first, end)]
        self._parameters = [slice(start, start + 1) for start in first]
        self._views: dict[tuple[int, int], tuple[Any, list[Any]]] = {}

    @classmethod
    def of(cls, values: np.ndarray, layout: Any) -> Runs | None:
        """The runs of ``values`` (one per parameter); None when they are all equal."""
        cuts = (np.flatnonzero(values[1:] != values[:-1]) + 1).tolist()
        return cls([0, *cuts], [*cuts, len(values)], layout) if cuts else None

    def cut(self, buffers: list[Any]) -> list[list[Any]]:
        """Per run, each of ``buffers`` (flat; None stays None) cut to it."""
        views = [
            self._cached(buffer, self._slices) if buffer is not None else [None] * len(self.first) for buffer in buffers
        ]
        return [list(run) for run in zip(*views)]

    def first_counts(self, counts: Any) -> list[Any]:
        """Per run, a one-element view of the counts (one per parameter) at its first parameter."""
        return self._cached(counts, self._parameters)

    def _cached(self, buffer: Any, slices: list[slice]) -> list[Any]:
        key = id(buffer), id(slices)
        kept = self._views.get(key)
        if kept is None or kept[0] is not buffer:
            kept = self._views[key] = buffer, [buffer[part] for part in slices]
        return kept[1]
