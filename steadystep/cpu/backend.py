"""The CPU backend: runs the generated CPU kernels on host arrays (NumPy, torch CPU tensors).

It offers the same functions, with the same signatures, as ``steadystep/cuda/backend.py``
(``dispatch.Backend`` lists them; a test compares the two), so the modules above choose a
target once (``dispatch.backend``) and call either alike. It imports the array layer
(``steadystep._arrays``) and this target's own modules only.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numba
import numpy as np

from steadystep._arrays import (
    HALF_BITS,
    Operand,
    PerCall,
    PreparedStep,
    array_dtype,
    check_out,
    computed,
    classify,
    host_operand,
    increment_versions,
    overlapping_out,
    step_arguments,
    stored_as,
    wrap_like,
)

from steadystep import _half
from steadystep.cpu import threads
from steadystep.cpu.parallel import address_of, in_parallel

if TYPE_CHECKING:
    from steadystep.kernels import Step


# Numba's "workqueue" threading layer (the one left where neither TBB nor OpenMP is installed,
# as on macOS from pip) aborts the whole process when two Python threads launch parallel
# kernels at once. Every parallel launch takes this lock; the kernels already use every core,
# so running them one at a time costs next to nothing.
_PARALLEL = threading.Lock()

# GNU OpenMP is not fork-safe: once a process has run a parallel kernel on Numba's OpenMP
# layer, a child it forks (multiprocessing's default on Linux up to Python 3.13, a Pool in
# Jupyter) is terminated by Numba when it launches one, and a Pool waits for it forever. In
# such a child every kernel runs its whole loop in the calling thread instead: the same
# results, on one thread per process, which is what a Pool of workers sharing the cores wants
# anyway.
_FORKED_AFTER_OPENMP = False


def _after_fork_in_child() -> None:
    global _FORKED_AFTER_OPENMP, _PARALLEL
    _PARALLEL = threading.Lock()  # another thread of the parent may have held it at the fork
    if not _FORKED_AFTER_OPENMP:
        try:
            layer = numba.threading_layer()
        except ValueError:  # the parent never ran a parallel kernel: this child may start OpenMP itself
            return
        if layer == "omp":
            omppool = importlib.import_module("numba.np.ufunc.omppool")  # compiled: no hints to import it by
            _FORKED_AFTER_OPENMP = omppool.openmp_vendor == "GNU"


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@functools.cache
def _serial(kernel):
    """A reduction (cpu/reductions.py: a parallel loop, then its partials combined) compiled
    without ``parallel`` (prange runs as range). The twin has a name of its own: Numba's
    on-disk cache keys a function by name and types, not by its options."""
    function = kernel.py_func
    twin = types.FunctionType(
        function.__code__,
        function.__globals__,
        function.__name__ + "_serial",
        function.__defaults__,
        function.__closure__,
    )
    twin.__qualname__ = function.__qualname__ + "_serial"
    twin.__module__ = function.__module__
    return numba.njit(twin, cache=True, error_model=kernel.targetoptions["error_model"])


def _share_threads() -> None:
    """Held under _PARALLEL at each parallel launch: this calling thread's share of the threads
    (`threads.share()`), which Numba keeps per calling thread."""
    share = threads.share()
    if share is not None and numba.get_num_threads() > share:
        numba.set_num_threads(share)


def _reduce(kernel, arguments: list, size: int) -> Any:
    """A reduction over ``size`` elements: its serial twin below PARALLEL_MIN, else in parallel."""
    if size < PARALLEL_MIN:
        return _serial(kernel)(*arguments)
    return _launch(kernel, *arguments)


def _launch(kernel, *arguments: Any) -> Any:
    """A reduction's parallel kernel (prange), one launch at a time."""
    with _PARALLEL:
        _share_threads()
        return (_serial(kernel) if _FORKED_AFTER_OPENMP else kernel)(*arguments)


# Parts of a kernel's loop run at once (cpu/parallel.py): eight a thread, for balance. Fixed, as
# asking Numba for the threads of each launch took longer than the parts a thread too many cost.
PARTS = 8 * numba.config.NUMBA_NUM_THREADS


def _run_range(kernel, arguments: tuple, size: int, parts: int = PARTS, address: int | None = None) -> None:
    """``kernel(*arguments, part, parts)`` over its whole loop: at once below PARALLEL_MIN
    elements (``size``), else in ``parts`` parts at once; ``address``: the kernel's for these
    arguments' kinds, where the caller keeps it (`address_of()`)."""
    if size < PARALLEL_MIN:
        kernel(*arguments, 0, 1)
    else:
        _in_parts(kernel, arguments, parts, address)


def _in_parts(kernel, arguments: tuple, parts: int, address: int | None = None) -> None:
    """``kernel(*arguments, part, parts)`` for every part at once (cpu/parallel.py)."""
    with _PARALLEL:
        _share_threads()
        if _FORKED_AFTER_OPENMP:
            kernel(*arguments, 0, 1)
        else:
            in_parallel(address_of(kernel, arguments) if address is None else address, parts, *arguments)


# Elements below which a call (elementwise, rows, an optimizer step, a sum of squares) runs
# serially: starting the threads costs what a memory-bound formula takes for tens of
# thousands of elements on one core, and float32 AdamW breaks even a little below this on 2
# cores (BENCHMARKS.md, "Choices in the code").
PARALLEL_MIN = 1 << 16


def _launcher(kernel, size: int) -> Callable[..., None]:
    """What runs a prepared step's ``kernel`` over ``size`` elements, given the step's
    arguments, which end in the whole loop's part (`_arrays.WHOLE_LOOP`): the kernel itself
    below PARALLEL_MIN, else its parts at once; kept by a prepared call."""
    if size < PARALLEL_MIN:
        return kernel  # called directly: a small step is mostly the Python around it
    address: list = []  # the kernel's, found at the first call: a prepared step's arguments keep their kinds

    def launch(*arguments: Any) -> None:
        if size < PARALLEL_MIN:  # read at each call, as _run_range does
            kernel(*arguments)
            return
        loop = arguments[:-2]
        if not address:
            address.append(address_of(kernel, loop))
        _in_parts(kernel, loop, PARTS, address[0])

    return launch


def _machine_code(dispatcher, arguments: Sequence[Any]) -> Callable[..., Any] | None:
    """The compiled function ``dispatcher`` ran for ``arguments``, to be called without its
    dispatch on their types (a third of a small elementwise call), or None if it has none of
    exactly their types. Only for a caller whose later arguments have the same types: a
    prepared call, keyed by its arguments' kinds (`_arrays.host_kinds()`), which fix every
    Numba type (dtype, layout, writability, alignment)."""
    compiled = dispatcher.overloads.get(tuple(dispatcher.typeof_pyval(value) for value in arguments))
    return None if compiled is None else compiled.entry_point


def elementwise(
    kernel, operands: list[Operand], out: Any, dtype: np.dtype, shape: tuple[int, ...], storage: str | None = None
) -> Any:
    stored = HALF_BITS[storage] if storage else dtype
    target = None if out is None else check_out(out, "cpu", shape, stored, operands, storage)
    strided = target is not None and not target.value.flags.c_contiguous
    arguments = [host_operand(operand, shape, dtype) for operand in operands]
    for index in [] if target is None or strided else overlapping_out(target, operands):
        if isinstance(arguments[index], np.ndarray):  # a single element is passed as a number, already read
            arguments[index] = arguments[index].copy()
    size = math.prod(shape)
    if target is None or strided:
        result = np.empty(shape, stored)
        _run_range(kernel, (result.reshape(-1), *arguments), size)
        return wrap_like(result, operands, storage) if target is None else _copied_into(target, result, out)
    _run_range(kernel, (target.value.reshape(-1), *arguments), size)
    return out


def _apart(first: np.ndarray, second: np.ndarray) -> bool:
    """Whether two NumPy arrays certainly share no memory, told from their owners alone (cheaper
    than np.may_share_memory): a view's ``base`` is the array that owns its memory, and two
    arrays that each own an allocation hold separate ones. False where that cannot tell."""
    first_owner = first if first.base is None else first.base
    second_owner = second if second.base is None else second.base
    return (
        first_owner is not second_owner
        and isinstance(first_owner, np.ndarray)
        and isinstance(second_owner, np.ndarray)
        and first_owner.flags.owndata
        and second_owner.flags.owndata
    )


def prepare_elementwise(
    kernel, operands: list[Operand], out: Any, dtype: np.dtype, shape: tuple[int, ...], storage: str | None = None
) -> Callable[[list, Sequence, Any], Any] | None:
    """`elementwise()` for arguments of these operands' kinds, once the general path has checked
    them: ``run(views, args, out)``, ``views`` being what `host_kinds()` read of ``args`` and
    ``out``. It returns the result, or None when ``out`` shares memory with an input other than
    itself (the general path copies that input). None instead of ``run``: these kinds take the
    general path every time (half precision, broadcasting, a conversion, a strided array)."""
    target = None if out is None else classify("out", out)
    arrays = [operand for operand in [*operands, target] if operand is not None and operand.kind == "host"]
    if storage is not None or any(
        operand.shape != shape or operand.dtype != dtype or not operand.value.flags.c_contiguous for operand in arrays
    ):
        return None
    size = math.prod(shape)
    serial = size < PARALLEL_MIN  # a larger call reads PARALLEL_MIN at each call, in _run_range()
    # the kernel's machine code once its first call found it (or None); a parallel launch keeps the dispatcher
    machine: list = [] if serial else [None]
    shared: list = []  # a parallel launch's kernel address, found at its first call: every call has these kinds
    number = dtype.type
    numbers = [index for index, operand in enumerate(operands) if operand.kind == "scalar"]
    inputs = [index for index, operand in enumerate(operands) if operand.kind == "host"]
    tensors = [index for index in inputs if operands[index].source is not None]  # torch's: they know their address
    flat = len(shape) != 1
    as_tensors = bool(tensors)
    versioned = target is not None and target.source is not None
    nbytes = math.prod(shape) * dtype.itemsize

    def shares_memory(views: list, args: Sequence, out: Any) -> bool:
        """Whether ``out`` shares memory with an input other than its own elements. Every array
        is contiguous, of one shape and dtype: so they overlap exactly when their addresses
        are closer than their size, and are the same elements when equal."""
        written = views[-1]
        for index in inputs:
            given = args[index]
            if given is out:
                continue
            if versioned and index in tensors:
                if 0 < abs(given.data_ptr() - out.data_ptr()) < nbytes:
                    return True
            elif not _apart(views[index], written) and np.may_share_memory(views[index], written):
                return True
        return False

    def run_kernel(result: np.ndarray, arguments: list) -> None:
        code = machine[0] if machine else None
        if code is not None:  # it converts a number to the kernel's dtype as NumPy does (an int by way of a double)
            code(result, *arguments, 0, 1)
            return
        for index in numbers:
            arguments[index] = number(arguments[index])
        if not serial:
            if not shared:
                shared.append(address_of(kernel, (result, *arguments)))
            _run_range(kernel, (result, *arguments), size, min(size, PARTS), shared[0])
            return
        kernel(result, *arguments, 0, 1)
        if not machine:
            machine.append(_machine_code(kernel, [result, *arguments, 0, 1]))

    def run(views: list, args: Sequence, out: Any) -> Any:
        arguments = views[:-1]
        if flat:
            for index in inputs:
                arguments[index] = arguments[index].reshape(-1)
        if out is None:
            result = np.empty(shape, dtype)
            run_kernel(result.reshape(-1) if flat else result, arguments)
            return sys.modules["torch"].from_numpy(result) if as_tensors else result
        if shares_memory(views, args, out):
            return None
        written = views[-1]
        run_kernel(written.reshape(-1) if flat else written, arguments)
        if versioned and not out.is_inference():
            increment_versions([out])
        return out

    return run


def _copied_into(target: Operand, result: np.ndarray, out: Any) -> Any:
    """A strided ``out`` (a column, a transposed view) gets the result copied in, as a NumPy
    ufunc's does; every input was read into ``result`` first, so overlaps do not matter."""
    np.copyto(target.value, result)
    return out


def rows(kernels: types.ModuleType, name: str, xs: Operand, out: Any, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    """Run the row kernel ``<name>_rows`` of ``kernels`` over ``xs`` viewed as (rows, row
    length), in parts of the rows at once from PARALLEL_MIN elements; ``shape`` is the
    result's."""
    kernel = getattr(kernels, f"{name}_rows")
    target = None if out is None else check_out(out, "cpu", shape, dtype, [xs])
    strided = target is not None and not target.value.flags.c_contiguous
    length = xs.shape[-1]
    count = math.prod(xs.shape[:-1])
    data = np.ascontiguousarray(xs.value, dtype=dtype).reshape(count, length)
    if target is not None and not strided and overlapping_out(target, [xs]):
        data = data.copy()
    result = np.empty(shape, dtype) if target is None or strided else target.value
    _run_range(kernel, (result.reshape((count,) + shape[len(xs.shape) - 1 :]), data), count * length, min(count, PARTS))
    if target is None:
        return wrap_like(result, [xs])
    return _copied_into(target, result, out) if strided else out


def _flat(operand: Operand) -> np.ndarray:
    return _flatten(operand.value)


def prepare_step(
    kernel, step: "Step", operands: dict[str, Operand], dtype: np.dtype, size: int, family: str = "step"
) -> PreparedStep:
    arguments, slots, passed = step_arguments(kernel, step, operands, dtype, _step_argument, _single_argument)
    # A strided tensor reaches the kernel as a copy made here, which must not serve later calls.
    copied = any(operand.source is not None and not operand.value.flags.c_contiguous for operand in operands.values())
    return PreparedStep(_launcher(kernel, size), arguments, slots, float, reusable=not copied, passed=passed)


# Below these, no step with quantized states can make a moment non-finite: each moment's
# update is a polynomial of degree at most 2 in the gradient, the parameter and the old moment,
# with the step's numbers as coefficients (kernels.Blockwise), so with every number and array
# of the step within 2¹⁶ and the old moments within 2⁶⁴ (their absmax), no term reaches 2¹⁰⁰.
STEP_BOUND = 2.0**16
STATE_BOUND = 2.0**64


def blockwise_launch(
    scales: Callable[..., None],
    codes: Callable[..., None],
    names: Sequence[str],
    quantized: Sequence[str],
    size: int,
    unread: Sequence[str] = (),
) -> Callable[..., None]:
    """The launch of a step with quantized states (kernels ``names``' parameters): its codes
    kernel, which finds each block's new absmax itself, after the scales kernel, which flags a
    step that would make a state non-finite, unless the step's numbers and arrays are within
    the bounds above (a pass that only reads the gradients, and the parameters unless they are
    ``unread``: no moment's update reads them), where none can."""
    from steadystep.cpu.reductions import largest_magnitude
    from steadystep.kernels import BLOCKWISE_INTEGERS, BLOCKWISE_SCRATCH, QUANTIZED_PARTS

    parts = {f"{name}_{part}" for name in quantized for part in QUANTIZED_PARTS}  # the absmax, the map's tables
    absmax = {f"{name}_absmax" for name in quantized}
    states = [index for index, name in enumerate(names) if name in absmax]
    apart = {*quantized, *parts, *BLOCKWISE_INTEGERS, *BLOCKWISE_SCRATCH, *unread}
    numbers = [index for index, name in enumerate(names) if name not in apart]

    def within(value: Any, bound: float) -> bool:
        if isinstance(value, np.ndarray):
            return value.size == 0 or _reduce(largest_magnitude, [value], value.size) <= bound
        return abs(value) <= bound  # False for NaN

    def launch(*arguments: Any) -> None:
        if size < PARALLEL_MIN or not (
            all(within(arguments[index], STEP_BOUND) for index in numbers)
            and all(within(arguments[index], STATE_BOUND) for index in states)
        ):
            scales(*arguments)
        codes(*arguments)

    return launch


def _step_argument(operand: Operand) -> Any:
    """A NumPy array the caller gave is flattened from the caller's object on every call (a
    view kept here would keep it alive); a view of other memory (a torch tensor) is kept."""
    if operand.source is not None:
        return _flat(operand)
    array = operand.value
    if not array.flags.c_contiguous:
        return PerCall(_flatten)  # copied afresh each call: the caller writes new values into it
    return PerCall(None if array.ndim == 1 else _ravel)


def _single_argument(operand: Operand) -> Any:
    """A one-element float32 or float64 array (GradScaler's found_inf and scale, a device
    scalar) reaches the kernel as the number it holds, read at every call: the kernel casts
    it to the step's dtype, which the array's element already had (check_step), so the bits
    are the same, and each step compiles once for numbers and arrays alike. Half-precision
    bits stay an array (``at`` widens them)."""
    if operand.storage is not None:
        return _step_argument(operand)
    if operand.source is not None:  # a view of the caller's memory (a torch tensor), kept
        view = _flat(operand)
        return PerCall(lambda _: view.item())
    return PerCall(np.ndarray.item)


def _ravel(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1)


def _flatten(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1)


def sum_squares(operand: Operand, layout, scale: float | Operand) -> Any:
    from steadystep.cpu.reductions import sum_squares as kernel

    dtype = computed(operand)  # float32 for half precision
    out = np.zeros(layout.segments, dtype)
    starts, stops, owners = layout.chunks
    factor = _flat(scale) if isinstance(scale, Operand) else dtype.type(scale)
    _reduce(kernel, [out, _flat(operand), starts, stops, owners, factor, dtype.type(0)], layout.size)
    return wrap_like(out, [operand])


def run_grid(kernel, arguments: list, size: int) -> None:
    """A grid kernel over host buffers (torch CPU tensors viewed as NumPy), in parallel: an
    item's work is the kernel's own (a model's item sums a whole row), so no size says when the
    threads' start-up would outweigh it."""
    _in_parts(kernel, tuple(_host(value) for value in arguments), PARTS)


def run_mixing(kernel, arguments: list, workers: int, columns: int) -> None:
    """A mixing kernel in place over [N, D] host buffers: its tasks split the columns themselves,
    a few operations an element, so below PARALLEL_MIN elements its whole loop runs at once."""
    _run_range(kernel, tuple(_host(value) for value in arguments), workers * columns)


def check_mixing(workers: int, itemsize: int) -> None:
    """Whether a mixing kernel can hold ``workers`` rows of scratch: a CPU task sizes its own
    block to the workers (``codegen.MIX_SCRATCH``), so any number fits."""


def _host(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic, bool)):
        return value
    return classify("buffer", value).value


def layout_array(layout, name: str) -> Any:
    """``layout.chunks`` or ``layout.segment_ids`` where the kernels read them: the host's own."""
    return getattr(layout, name)


def empty(shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """Scratch the kernels write before they read it."""
    return np.empty(shape, dtype)


def allocate_like(operands: list[Operand], shape: tuple[int, ...], dtype: np.dtype, storage: str | None = None) -> Any:
    """A result array of the operands' library (a torch tensor for torch operands), of
    half-precision ``storage`` when given."""
    return wrap_like(np.empty(shape, HALF_BITS[storage] if storage else dtype), operands, storage)


def kernel_array(operand: Operand, dtype: np.dtype | None = None) -> Any:
    """What a kernel reads for ``operand``: its C-contiguous host array (a view when it is one
    already; of ``dtype`` when given, half precision converted by its values)."""
    if operand.storage and dtype is not None and dtype != operand.dtype:
        return np.ascontiguousarray(_half.widened(operand.value, array_dtype(operand)), dtype)
    return np.ascontiguousarray(operand.value, dtype)


def to_target(host: np.ndarray) -> Any:
    """A host array where this target's kernels read it: the array itself."""
    return host


def to_host(array: Any) -> np.ndarray:
    """A NumPy array of this target's ``array`` (a view of a torch CPU tensor)."""
    return _host(array)


def write(destination: Any, source: Operand) -> None:
    """Copy ``source``'s values into ``destination``, an array of this target of the same size
    (rounded once where ``destination`` is half precision and ``source`` is not)."""
    target = classify("destination", destination)
    target.value[...] = stored_as(source, target)
