"""Runs a generated CPU kernel on prepared host arguments."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from steadystep.dispatch import (Operand, PerCall, PreparedStep, check_out, classify, host_operand, overlapping_out,
                                 step_arguments, wrap_like)


# Numba's "workqueue" threading layer (the one left where neither TBB nor OpenMP is installed,
# as on macOS from pip) aborts the whole process when two Python threads launch parallel
# kernels at once. Every parallel launch takes this lock; the kernels already use every core,
# so running them one at a time costs next to nothing.
_PARALLEL = threading.Lock()


def _one_at_a_time(kernel):
    def launch(arguments: list) -> None:
        with _PARALLEL:
            kernel(*arguments)

    return launch


def elementwise(kernel, operands: list[Operand], out: Any, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    target = None if out is None else check_out(out, "cpu", shape, dtype)
    arguments = [host_operand(operand, shape, dtype) for operand in operands]
    for index in [] if target is None else overlapping_out(target, operands):
        if isinstance(arguments[index], np.ndarray):  # a single element is passed as a number, already read
            arguments[index] = arguments[index].copy()
    if target is None:
        result = np.empty(shape, dtype)
        kernel(result.reshape(-1), *arguments)
        return wrap_like(result, operands)
    kernel(target.value.reshape(-1), *arguments)
    return out


def rows(kernel, xs: Operand, out: Any, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    """Run a row kernel over ``xs`` viewed as (rows, row length); ``shape`` is the result's."""
    target = None if out is None else check_out(out, "cpu", shape, dtype)
    length = xs.shape[-1]
    count = math.prod(xs.shape[:-1])
    data = np.ascontiguousarray(xs.value, dtype=dtype).reshape(count, length)
    if target is not None and overlapping_out(target, [xs]):
        data = data.copy()
    result = np.empty(shape, dtype) if target is None else target.value
    kernel(result.reshape((count,) + shape[len(xs.shape) - 1 :]), data)
    return wrap_like(result, [xs]) if target is None else out


def _flat(operand: Operand) -> np.ndarray:
    return _flatten(operand.value)


def prepare_step(kernel, step, operands, dtype, size) -> PreparedStep:
    arguments, slots, passed = step_arguments(kernel, step, operands, dtype, _step_argument)
    # A strided tensor reaches the kernel as a copy made here, which must not serve later calls.
    copied = any(operand.source is not None and not operand.value.flags.c_contiguous for operand in operands.values())
    return PreparedStep(_one_at_a_time(kernel), arguments, slots, float, reusable=not copied, passed=passed)


def _step_argument(operand: Operand) -> Any:
    """A NumPy array the caller gave is flattened from the caller's object on every call (a
    view kept here would keep it alive); a view of other memory (a torch tensor) is kept."""
    if operand.source is not None:
        return _flat(operand)
    array = operand.value
    if not array.flags.c_contiguous:
        return PerCall(_flatten)  # copied afresh each call: the caller writes new values into it
    return PerCall(_itself if array.ndim == 1 else _ravel)


def _itself(array: np.ndarray) -> np.ndarray:
    return array


def _ravel(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1)


def _flatten(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1)


def sum_squares(operand: Operand, layout, scale: float | Operand) -> np.ndarray:
    from steadystep.cpu.reductions import sum_squares as kernel

    dtype = operand.dtype
    out = np.zeros(layout.segments, dtype)
    starts, stops, owners = layout.chunks
    factor = _flat(scale) if isinstance(scale, Operand) else dtype.type(scale)
    with _PARALLEL:
        kernel(out, _flat(operand), starts, stops, owners, factor, dtype.type(0))
    return wrap_like(out, [operand])


def run(kernel, arguments: list, size: int) -> None:
    """A mixing or grid kernel over host buffers (torch CPU tensors viewed as NumPy)."""
    values = [_host(value) for value in arguments]
    with _PARALLEL:
        kernel(*values)


def _host(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic, bool)):
        return value
    return classify("buffer", value).value
