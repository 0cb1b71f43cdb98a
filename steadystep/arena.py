"""A parameter arena: many tensors packed into one flat buffer, so a model steps in one launch.

>>> import numpy as np
>>> from steadystep.arena import Arena
>>> arena = Arena.pack([np.ones((3, 4)), np.zeros(5)])
>>> arena.layout.offsets, arena.layout.size          # each tensor padded to 64 elements
((0, 64), 128)
>>> arena.views[0].shape
(3, 4)
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from steadystep import _arrays, dispatch

__all__ = [
    "ALIGNMENT",
    "CHUNK",
    "Arena",
    "Layout",
    "decays_matrices",
    "memory_order",
]

ALIGNMENT = 64  # elements: every tensor starts on a 256-byte (float32) boundary
CHUNK = 1 << 16  # elements per reduction chunk: enough per core/block, small enough to balance


def decays_matrices(shape: tuple[int, ...]) -> bool:
    """The usual weight-decay rule: decay weight matrices and kernels, not biases or norms."""
    return len(shape) >= 2


@dataclass(frozen=True)
class Layout:
    """Where each tensor lives in a flat buffer: offsets padded to multiples of 64 elements.

    ``orders`` keeps a tensor's memory order where it is not row-major: the axes from the
    outermost in memory to the innermost (a channels_last [N, C, H, W] kernel: (0, 2, 3, 1);
    a Fortran-ordered matrix: (1, 0)), so its views are strided as the tensor was. None
    for a row-major tensor. Steps run over the flat buffer, and every arena of one layout
    (parameters, gradients, state) orders each tensor alike, so elements still correspond.
    """

    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    size: int
    orders: tuple[tuple[int, ...] | None, ...] | None = None  # None: all row-major

    @classmethod
    def of(cls, shapes: Iterable[Sequence[int]], orders: Sequence[tuple[int, ...] | None] | None = None) -> Layout:
        if shapes is None or isinstance(shapes, (str, bytes)) or not isinstance(shapes, Iterable):
            raise TypeError(f"shapes must be a sequence of tensor shapes, such as [(256, 128), (128,)]; got {shapes!r}")
        checked = tuple(_shape(index, shape) for index, shape in enumerate(shapes))  # a generator is read once
        offsets, position = [], 0
        for shape in checked:
            offsets.append(position)
            position += -(-math.prod(shape) // ALIGNMENT) * ALIGNMENT
        orders = tuple(orders) if orders is not None and any(order is not None for order in orders) else None
        return cls(checked, tuple(offsets), position, orders)

    @classmethod
    @functools.lru_cache(maxsize=64)
    def whole(cls, size: int) -> Layout:
        """One tensor of ``size`` elements, no padding: a whole buffer as one segment. Cached,
        so its reduction chunks are computed once per size, not on every norm."""
        return cls(((size,),), (0,), size)

    @property
    def segments(self) -> int:
        return len(self.shapes)

    def extent(self, index: int) -> tuple[int, int]:
        """Start and stop (padding included) of tensor ``index``."""
        start = self.offsets[index]
        stop = self.offsets[index + 1] if index + 1 < self.segments else self.size
        return start, stop

    @functools.cached_property
    def segment_ids(self) -> np.ndarray:
        """The tensor each element belongs to (padding belongs to the tensor before it)."""
        ids = np.empty(self.size, np.int32)
        for index in range(self.segments):
            start, stop = self.extent(index)
            ids[start:stop] = index
        return ids

    @functools.cached_property
    def chunks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, stops, segment) of reduction chunks that never cross a tensor."""
        starts, stops, owners = [], [], []
        for index in range(self.segments):
            start, stop = self.extent(index)
            for chunk_start in range(start, stop, CHUNK):
                starts.append(chunk_start)
                stops.append(min(stop, chunk_start + CHUNK))
                owners.append(index)
        return np.array(starts, np.int64), np.array(stops, np.int64), np.array(owners, np.int64)

    @functools.cached_property
    def segment_chunks(self) -> np.ndarray:
        """Tensor s's reduction chunks are ``chunks[...][segment_chunks[s]:segment_chunks[s + 1]]``."""
        return np.searchsorted(self.chunks[2], np.arange(self.segments + 1)).astype(np.int64)

    def mask(self, rule: Callable[[tuple[int, ...]], bool] = decays_matrices, dtype: Any = np.float32) -> np.ndarray:
        """A per-element 1/0 mask (e.g. which elements get weight decay) from a per-tensor rule
        (a function of a tensor's shape). Any 0/1 mask steps buffers of another dtype too."""
        if not callable(rule):
            raise TypeError(
                f"rule must be a function of a tensor's shape saying whether it gets the mask's 1 (such "
                f"as arena.decays_matrices); got {rule!r}"
            )
        mask = np.zeros(self.size, dtype)
        for index, shape in enumerate(self.shapes):
            if rule(shape):
                start, stop = self.extent(index)
                mask[start:stop] = 1
        return mask


class Arena:
    """A flat buffer holding several tensors, with a view back to each one.

    Works with NumPy arrays, torch tensors (CPU or CUDA), CuPy arrays and Numba device
    arrays: the buffer is allocated by the same library, on the same device.
    """

    def __init__(self, buffer: Any, layout: Layout):
        if not isinstance(layout, Layout):
            raise TypeError(f"layout must be a Layout (Layout.of(shapes), or another arena's .layout); got {layout!r}")
        if tuple(getattr(buffer, "shape", ())) != (layout.size,):
            raise ValueError(
                f"buffer must be a flat array of the layout's {layout.size} elements, got "
                f"{type(buffer).__name__} of shape {tuple(getattr(buffer, 'shape', ()))}"
            )
        self.buffer = buffer
        self.layout = layout
        self.views = [self.view(index) for index in range(layout.segments)]

    def __reduce__(self) -> tuple:
        # A copy (copy.deepcopy, pickle) rebuilds the views from the copied buffer: copied one
        # by one, NumPy views would become arrays of their own that the buffer no longer updates.
        return Arena, (self.buffer, self.layout)

    def __repr__(self) -> str:
        operand = _arrays.classify("buffer", self.buffer)
        where = "GPU" if operand.kind == "device" else "host"
        count = self.layout.segments
        return (
            f"Arena({count} tensor{'s' if count != 1 else ''} in {self.layout.size:,} {_arrays.dtype_name(operand)} "
            "elements, "
            f"{type(self.buffer).__module__.split('.')[0]} on the {where})"
        )

    def view(self, index: int) -> Any:
        """A new view of tensor ``index`` in the buffer (strided as the tensor was: see Layout)."""
        if (
            isinstance(index, (bool, np.bool_))
            or not isinstance(index, (int, np.integer))
            or not (-self.layout.segments <= index < self.layout.segments)
        ):
            raise IndexError(
                f"index must be a whole number in [0, {self.layout.segments}) (which tensor); got {index!r}"
            )
        start = self.layout.offsets[index]
        shape = self.layout.shapes[index]
        flat = self.buffer[start : start + math.prod(shape)]
        order = self.layout.orders[index] if self.layout.orders else None
        if order is None:
            return flat.reshape(shape)
        in_memory = flat.reshape(tuple(shape[axis] for axis in order))
        inverse = tuple(order.index(axis) for axis in range(len(order)))
        return in_memory.permute(inverse) if hasattr(in_memory, "permute") else in_memory.transpose(inverse)

    @classmethod
    def pack(cls, tensors: Iterable[Any], dtype: Any = None) -> Arena:
        """Copy ``tensors`` (of one library, device and dtype; ``dtype`` converts them all;
        ``model.parameters()`` too) into a new zero-padded flat buffer."""
        if hasattr(tensors, "shape"):  # one array: iterating it would pack its rows as tensors of their own
            raise TypeError(
                f"tensors is one {type(tensors).__name__} of shape {tuple(tensors.shape)}; pass a list of "
                "tensors ([x] for this one alone)"
            )
        if isinstance(tensors, Mapping):  # iterating it would give the names
            raise TypeError("tensors is a mapping (a state_dict?); pack its values(), e.g. model.parameters()")
        if not isinstance(tensors, Iterable) or isinstance(tensors, (str, bytes)):
            raise TypeError(f"tensors must be a list of arrays or tensors (model.parameters() too); got {tensors!r}")
        tensors = list(tensors)
        if not tensors:
            raise ValueError("tensors is empty; an arena needs at least one tensor")
        _check_alike(tensors, dtype)
        layout = Layout.of([tuple(tensor.shape) for tensor in tensors], [memory_order(tensor) for tensor in tensors])
        first = tensors[0]
        arena = cls(_arrays.zeros_like(first, layout.size, dtype), layout)
        for view, tensor in zip(arena.views, tensors):
            dispatch.copy_into(view, tensor)
        return arena

    def zeros_like(self, fill: float = 0.0) -> Arena:
        """Another arena of the same layout, device and dtype (for gradients and optimizer state)."""
        try:  # a NumPy number or a one-element tensor too (Adagrad's initial_accumulator_value); not a string
            value = float(fill) if hasattr(fill, "__float__") else None
        except (TypeError, ValueError):
            value = None
        if value is None:
            raise TypeError(f"fill must be a number (every element's starting value), got {type(fill).__name__}")
        buffer = _arrays.zeros_like(self.buffer, self.layout.size, None)
        if value:
            buffer[...] = value  # a float: torch refuses a NumPy number here
        return Arena(buffer, self.layout)


def _shape(index: int, shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of ints, or a ValueError naming ``shapes[index]``."""
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    if dims is None or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0 for n in dims):
        raise ValueError(
            f"shapes[{index}] is {shape!r}, not a shape: a sequence of whole numbers ≥ 0, such as "
            "tensor.shape or (3,) for a vector"
        )
    return tuple(int(n) for n in dims)


def memory_order(tensor: Any) -> tuple[int, ...] | None:
    """The axes of a dense NumPy, torch or CuPy ``tensor`` from the outermost in memory to the
    innermost, when that is not row-major (channels_last, Fortran order); None for a row-major
    tensor, and for one with gaps or overlaps or from Numba (whose device arrays cannot be
    permuted), which an arena holds row-major."""
    if hasattr(tensor, "copy_to_host"):
        return None
    if callable(getattr(tensor, "stride", None)):
        strides = tensor.stride()  # torch counts in elements
    elif hasattr(tensor, "strides") and hasattr(tensor, "itemsize"):
        strides = tuple(stride // tensor.itemsize for stride in tensor.strides)  # NumPy and CuPy count bytes
    else:
        return None
    shape = tuple(tensor.shape)
    # Axes of one element play no part in where the others lie; they go first.
    spread = sorted((axis for axis in range(len(shape)) if shape[axis] != 1), key=lambda axis: (-strides[axis], axis))
    if spread == sorted(spread) or 0 in shape:
        return None
    expected = 1
    for axis in reversed(spread):
        if strides[axis] != expected:
            return None
        expected *= shape[axis]
    return tuple(axis for axis in range(len(shape)) if shape[axis] == 1) + tuple(spread)


def _check_alike(tensors: Sequence[Any], dtype: Any) -> None:
    """Refuse tensors the buffer cannot hold as they are: another library or device (no silent
    copies), or another dtype unless ``dtype`` asks for the conversion (float64 values would
    silently lose digits in a float32 buffer)."""
    for index, tensor in enumerate(tensors):
        if not hasattr(tensor, "shape"):  # a number or a list: there is nothing for a view to point back into
            raise TypeError(
                f"tensors[{index}] is a {type(tensor).__name__}; pack arrays or tensors (np.asarray(...) "
                "first), which the arena's views then stand for"
            )
    first = _arrays.classify("tensors[0]", tensors[0])
    for index, tensor in enumerate(tensors[1:], start=1):
        operand = _arrays.classify(f"tensors[{index}]", tensor)
        if _arrays.library(tensor) != _arrays.library(tensors[0]) or operand.kind != first.kind:
            raise TypeError(
                f"{operand.name} is a {_described(tensor, operand)} but tensors[0] is a "
                f"{_described(tensors[0], first)}; pack tensors of one library and device"
            )
        if dtype is None and (operand.dtype, operand.storage) != (first.dtype, first.storage):
            raise TypeError(
                f"{operand.name} has dtype {_arrays.dtype_name(operand)} but tensors[0] has "
                f"{_arrays.dtype_name(first)}; pass dtype= to convert them all"
            )


def _described(tensor: Any, operand: _arrays.Operand) -> str:
    return f"{_arrays.library(tensor)} {type(tensor).__name__} ({'GPU' if operand.kind == 'device' else 'host'})"
