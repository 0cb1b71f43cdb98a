"""Decides where a call runs and hands its arguments to the matching compiled kernel.

* NumPy arrays, torch CPU tensors, anything NumPy can view (DLPack on the CPU, lists):
  the CPU kernel, zero-copy.
* Objects with ``__cuda_array_interface__`` (CuPy, Numba device arrays, torch CUDA
  tensors): the CUDA kernel, zero-copy, in place.
* Only scalars: the CPU kernel, and the result comes back as a Python float (Python
  numbers alone call the float64 formula directly, with no array in between).
* ``target="cpu" | "cuda"`` (argument) or ``with steadystep.use_target(...)`` forces a
  target; the tests use it to run CUDA kernels on Numba's simulator.

Everything is checked before anything is written: a bad argument raises a
``TypeError``/``ValueError`` that names it and leaves ``out`` untouched.
"""

from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import dataclasses
import functools
import importlib
import math
import sys
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from steadystep import _half
from steadystep.kernels import BLOCKWISE_SCRATCH, QUANTIZED_PARTS, blockwise_family, blockwise_prefix
from steadystep._arrays import (
    HALF_BITS,
    check_out,
    wrap_like,
    array_dtype,
    zeros_like,
    library,
    beyond_float64,
    broadcast_shape,
    check_allocatable,
    check_mask,
    check_step,
    check_untracked,
    classify,
    compute_dtype,
    computed,
    host_kinds,
    kernel_parameters,
    mark_written,
    Operand,
    PreparedStep,
    result_storage,
    size_of_result,
    suffix,
    tracks_versions,
)

__all__ = [
    "TARGETS",
    "choose_target",
    "use_target",
]

if TYPE_CHECKING:
    from steadystep.kernels import Blockwise, Row, Step

TARGETS = ("cpu", "cuda")
_forced_target: contextvars.ContextVar[str | None] = contextvars.ContextVar("steadystep_target", default=None)


@contextlib.contextmanager
def use_target(target: str) -> Iterator[None]:
    """Run every steadystep call inside the block on ``target`` ("cpu" or "cuda").

    >>> with steadystep.use_target("cuda"):   # doctest: +SKIP
    ...     steadystep.gradient_descent.sgd_update(params, grads, 0.1)
    """
    token = _forced_target.set(_check_target(target))
    try:
        yield
    finally:
        _forced_target.reset(token)


def _check_target(target: str | None) -> str | None:
    if target is not None and target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS} or None, got {target!r}")
    return target


def host_array(value: Any) -> np.ndarray:
    """``value``'s numbers as a NumPy array: a view of host data (NumPy, torch CPU), a copy of
    GPU data; bfloat16 and float16 as the float32 they stand for (a copy)."""
    operand = classify("value", value)
    if operand.storage:
        return host_values(operand)
    if hasattr(value, "copy_to_host"):
        return value.copy_to_host()
    return backend("cuda").to_host(operand.value) if operand.kind == "device" else operand.value


def host_values(operand: Operand) -> np.ndarray:
    """An array operand's numbers on the host: half precision as float32 (exactly)."""
    if operand.storage is None:
        return host_array(operand.value)
    bits = backend("cuda").to_host(operand.value) if operand.kind == "device" else operand.value
    return _half.widened(bits, array_dtype(operand))


def choose_target(operands: Sequence[Operand], target: str | None) -> str:
    forced = _check_target(target) or _forced_target.get()
    host = [operand.name for operand in operands if operand.kind == "host"]
    device = [operand.name for operand in operands if operand.kind == "device"]
    if host and device:
        raise TypeError(
            f"arguments live on different devices: {', '.join(device)} on the GPU, {', '.join(host)} on the CPU; "
            "move them to one device first (steadystep never copies silently)"
        )
    if forced == "cpu" and device:
        raise TypeError(f"target='cpu' but {', '.join(device)} live on the GPU; copy them to the host first")
    if device:
        _check_one_gpu(operands)
    if forced is not None:
        return forced
    return "cuda" if device else "cpu"


def _check_one_gpu(operands: Sequence[Operand]) -> None:
    """Every GPU array of a call must live on the device Numba launches on. Numba cannot
    reach another GPU's memory (it fails deep inside with CUDA_ERROR_INVALID_VALUE, numba
    issue 4092), and steadystep's own device buffers live on that device too."""
    indices = {}
    for operand in operands:
        # torch tensors say where they live as device.index, CuPy arrays as device.id; Numba
        # device arrays do not say (they belong to the context they were made in)
        device = getattr(operand.source if operand.source is not None else operand.value, "device", None)
        index = getattr(device, "index", None)
        index = getattr(device, "id", None) if index is None else index
        if isinstance(index, int):
            indices[operand.name] = index
    if not indices:
        return
    if len(set(indices.values())) > 1:
        places = ", ".join(f"{name} on cuda:{index}" for name, index in indices.items())
        raise TypeError(f"arguments live on different GPUs: {places}; move them to one device first")
    from steadystep.cuda.runtime import current_device_index

    name, index = next(iter(indices.items()))
    current = current_device_index()
    if index != current:
        raise ValueError(
            f"{name} lives on cuda:{index}, but steadystep launches on this thread's CUDA device, cuda:{current}. "
            f"Keep the arrays on cuda:{current}, or use one process per GPU and make cuda:{index} current "
            f"before steadystep's first GPU call (torch.cuda.set_device({index}) or numba.cuda.select_device({index}))"
        )


def kernel_module(target: str, module: str):
    """The generated kernel module of ``module`` for ``target`` (imports CUDA lazily)."""
    return _target_module(target, f"_generated.{module}")


def _target_module(target: str, module: str):
    name = f"steadystep.{target}.{module}"
    found = sys.modules.get(name)
    # A module another thread is still importing (compiling) is in sys.modules half-built;
    # import_module then waits for it.
    if found is not None and not getattr(found.__spec__, "_initializing", False):
        return found
    if target == "cuda":
        from steadystep.cuda import runtime

        runtime.require_cuda()
    return importlib.import_module(name)


class Backend(Protocol):
    """What each target offers: ``steadystep/cpu/backend.py`` and ``steadystep/cuda/backend.py``
    define these functions with these signatures (``tests/test_dispatch.py`` compares them), so
    a module above chooses a target once and calls either alike. Arrays going in are
    `Operand` (classified once, by the entry point) or the target's own arrays."""

    def elementwise(
        self,
        kernel,
        operands: list[Operand],
        out: Any,
        dtype: np.dtype,
        shape: tuple[int, ...],
        storage: str | None = None,
    ) -> Any:
        """An elementwise kernel computed in ``dtype`` over broadcast operands, into ``out`` or
        a new array (of half-precision ``storage``, when given)."""

    def prepare_elementwise(
        self,
        kernel,
        operands: list[Operand],
        out: Any,
        dtype: np.dtype,
        shape: tuple[int, ...],
        storage: str | None = None,
    ) -> Callable[[list, Sequence, Any], Any] | None:
        """``elementwise`` for later calls with arguments of these operands' kinds, or None."""

    def rows(
        self, kernels: types.ModuleType, name: str, xs: Operand, out: Any, dtype: np.dtype, shape: tuple[int, ...]
    ) -> Any:
        """The row kernel ``name`` of the module ``kernels`` along the last axis of ``xs``."""

    def prepare_step(
        self, kernel, step: "Step", operands: dict[str, Operand], dtype: np.dtype, size: int, family: str = "step"
    ) -> PreparedStep:
        """A checked step's launch over ``size`` elements, with slots for what each call brings
        (``family``: which launch configuration a GPU kernel takes, steadystep.cuda.threads)."""

    def blockwise_launch(
        self,
        scales: Callable[..., None],
        codes: Callable[..., None],
        names: Sequence[str],
        quantized: Sequence[str],
        size: int,
        unread: Sequence[str] = (),
    ) -> Callable[..., None]:
        """What runs a step with quantized states from its two kernels' launches (``names``:
        the kernels' parameters; ``quantized``: its quantized buffers; ``unread``: buffers no
        moment's update reads)."""

    def run_grid(self, kernel, arguments: list, size: int) -> None:
        """A grid kernel over ``size`` (row, column) items."""

    def run_mixing(self, kernel, arguments: list, workers: int, columns: int) -> None:
        """A mixing kernel in place over [N, D] buffers."""

    def check_mixing(self, workers: int, itemsize: int) -> None:
        """Refuse a number of workers the mixing kernels cannot hold."""

    def sum_squares(self, operand: Operand, layout, scale: float | Operand) -> Any:
        """Each segment's sum of squares of ``operand`` times ``scale``."""

    def layout_array(self, layout, name: str) -> Any:
        """A layout's index array where the kernels read it."""

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """Scratch the kernels write before they read it."""

    def allocate_like(
        self, operands: list[Operand], shape: tuple[int, ...], dtype: np.dtype, storage: str | None = None
    ) -> Any:
        """A result array of the operands' library (of half-precision ``storage``, when given)."""

    def kernel_array(self, operand: Operand, dtype: np.dtype | None = None) -> Any:
        """What a kernel reads for ``operand`` (a view where it can be one, else a copy)."""

    def to_target(self, host: np.ndarray) -> Any:
        """A host array where this target's kernels read it."""

    def to_host(self, array: Any) -> np.ndarray:
        """A NumPy array of one of this target's arrays."""

    def write(self, destination: Any, source: Operand) -> None:
        """Copy ``source``'s values into ``destination``, an array of this target."""


def backend(target: str) -> Backend:
    """The backend of ``target`` ("cpu" or "cuda"; the CUDA one imports Numba's CUDA support)."""
    return _target_module(target, "backend")


if TYPE_CHECKING:  # mypy checks that both backends offer Backend's functions, with its signatures
    from steadystep.cpu import backend as _cpu_backend
    from steadystep.cuda import backend as _cuda_backend

    _BACKENDS: tuple[Backend, Backend] = (_cpu_backend, _cuda_backend)


def run_grid(where: str, module: str, name: str, dtype: Any, grid: tuple[int, int], arguments: list) -> None:
    """The grid kernel ``name`` of the formulas ``module`` for ``dtype`` over ``grid`` (rows,
    columns: one item each) on target ``where``, with ``arguments`` after the grid's size."""
    kernel = getattr(kernel_module(where, module), f"{name}_{suffix(dtype)}_grid")
    backend(where).run_grid(kernel, [*grid, *arguments], grid[0] * grid[1])


# Prepared elementwise calls by (module, function, target, forced target, argument kinds):
# a plan, or None for kinds that take the general path every time. Plans hold no arrays.
_PLANS: dict[tuple, Callable | None] = {}
_PLANS_LIMIT = 1024


def call_elementwise(
    module: str, function: str, names: Sequence[str], args: Sequence[Any], out: Any, target: str | None
) -> Any:
    """An elementwise call: classified, checked and launched by `run_elementwise()` the first
    time its arguments have their kinds (`host_kinds()`), then by the plan that call left, which
    skips what the kinds already decided (classification, dtype and shape checks, the kernel's
    choice). What depends on the values still runs every call: an integer's range, autograd's
    mode, and the memory ``out`` shares with the inputs."""
    found = host_kinds((*args, out)) if target is None or type(target) is str else None
    key = None
    if found is not None:
        key = (module, function, target, _forced_target.get(), found[0])
        try:
            plan = _PLANS[key]
        except KeyError:  # the first call of these kinds: prepared below
            pass
        else:
            result = None if plan is None else plan(found[1], args, out)
            if result is not None:
                return result
            key = None
    operands = [classify(name, value) for name, value in zip(names, args)]
    check_untracked(operands, out)
    result = run_elementwise(module, function, operands, out, target)
    if key is not None:
        if len(_PLANS) >= _PLANS_LIMIT:
            _PLANS.clear()
        where, kernel, dtype, shape, storage = _elementwise_launch(module, function, operands, target)
        _PLANS[key] = backend(where).prepare_elementwise(kernel, operands, out, dtype, shape, storage)
    return result


def _elementwise_launch(module: str, function: str, operands: list[Operand], target: str | None) -> tuple:
    """What classified operands decide of an elementwise call: (target, kernel, computed dtype,
    result shape, half-precision storage of the result or None)."""
    where = choose_target(operands, target)
    dtype = compute_dtype(operands)
    kernel = getattr(kernel_module(where, module), f"{function}_{suffix(dtype)}_kernel")
    return where, kernel, dtype, broadcast_shape(operands), result_storage(operands)


def run_elementwise(module: str, function: str, operands: list[Operand], out: Any, target: str | None) -> Any:
    """Run one elementwise formula over classified operands; see the module docstring."""
    where, kernel, dtype, shape, storage = _elementwise_launch(module, function, operands, target)
    if out is None:
        check_allocatable(operands, shape, dtype)
    try:
        result = backend(where).elementwise(kernel, operands, out, dtype, shape, storage)
    except MemoryError:
        raise _beyond_memory(size_of_result(operands, shape, dtype)) from None
    if out is None and all(operand.kind == "scalar" for operand in operands):
        return float(np.asarray(result).reshape(-1)[0])
    mark_written(out)
    return result


def _beyond_memory(needs: str) -> MemoryError:
    """The MemoryError of a call whose arrays this machine cannot hold, saying their size."""
    return MemoryError(f"{needs}, more than this machine can allocate; pass smaller arrays (or out= of that shape)")


def python_numbers(args: tuple) -> bool:
    """Whether a call is on Python floats and ints alone (within float64's range), with the
    GPU not forced: such a call runs ``scalar_formula`` directly."""
    for arg in args:  # a loop, not all() over a generator: an array first argument costs one test
        if type(arg) is not float and (type(arg) is not int or beyond_float64(arg)):
            return False
    return _forced_target.get() != "cuda"


def scalar_formula(module: str, function: str) -> Callable[..., float]:
    """The formula itself, compiled by Numba for float64 numbers: the function every CPU
    float64 kernel of it inlines, so the same bits. A call on Python numbers skips the
    classification, the 1-element result array and the kernel launch (a schedule, a loss
    scale or a worked example computed on the host; BENCHMARKS.md, "Choices in the code")."""
    return getattr(kernel_module("cpu", module), f"{function}_f64")


def run_rows(module: str, row: "Row", xs: Operand, out: Any, target: str | None) -> Any:
    """Run one row function along the last axis of ``xs``, batched over the leading axes."""
    if xs.kind == "scalar" or not xs.shape:
        raise ValueError(f"xs must be an array with at least one axis (a row); got {xs.value!r}")
    where = choose_target([xs], target)
    dtype = compute_dtype([xs])
    leading = xs.shape[:-1]
    if row.value is not None:
        shape = xs.shape
    else:
        shape = leading + ((row.outputs,) if row.outputs > 1 else ())
    check_allocatable([xs], xs.shape, dtype)  # a broadcast view is read as one contiguous array
    try:
        if xs.storage is not None and xs.kind == "host":  # on the GPU: the backend widens them there
            return _half_rows(module, row, xs, out, where, shape)
        kernels = kernel_module(where, module)
        result = backend(where).rows(kernels, f"{row.name}_{suffix(dtype)}", xs, out, dtype, shape)
    except MemoryError:
        gib = math.prod(xs.shape) * dtype.itemsize / 2**30
        needs = f"xs of shape {xs.shape}, read as one contiguous {dtype} array, needs {gib:.3g} GiB"
        raise _beyond_memory(needs) from None
    if out is None and isinstance(result, np.ndarray) and result.ndim == 0:
        return float(result)  # one row in, a Python float out (as for all-scalar calls)
    mark_written(out)
    return result


def _half_rows(module: str, row: "Row", xs: Operand, out: Any, where: str, shape: tuple[int, ...]) -> Any:
    """A row formula over half-precision host ``xs``: its rows widened to float32 (exactly),
    computed in float32 (on ``where``), each result rounded once to ``xs``'s dtype."""
    storage = xs.storage
    assert storage is not None
    bits = HALF_BITS[storage]
    target = None if out is None else check_out(out, "cpu", shape, bits, [xs], storage)
    wide = Operand(xs.name, _half.widened(xs.value, bits), "host", dtype=np.dtype(np.float32), shape=xs.shape)
    result = _half.narrowed(host_array(run_rows(module, row, wide, None, where)), bits)
    if target is not None:
        target.value[...] = result
        mark_written(out)
        return out
    if not shape:
        return float(_half.widened(result, bits))
    return wrap_like(result, [xs], storage)


_PREPARED: collections.OrderedDict = collections.OrderedDict()
_PREPARED_LIMIT = 32  # recently stepped buffer sets


def run_step(
    module: str,
    step: "Step",
    arrays: dict[str, Any],
    scalars: dict[str, float],
    *,
    skip_step: Any = None,
    grad_scale: Any = None,
    segment_ids: Any = None,
    target: str | None = None,
) -> None:
    """Run one fused, in-place step: check every buffer, then launch once.

    ``arrays`` maps buffer names (and per-element or ``indexed`` arrays) to arrays, or to
    None: an unused optional buffer (read as 0, never written) or a per-element argument
    whose number is in ``scalars``. ``skip_step`` and ``grad_scale`` may be numbers or
    one-element arrays. Buffers must share one shape, dtype and device; updated ones must
    be writable. Nothing is written unless every check passes. Both dictionaries are the
    call's own: the step fills its defaults into them.

    A validated set of arrays is remembered by identity, so stepping the same buffers
    again costs a dictionary lookup rather than a full check: a small step is mostly this
    Python, which is why the numbers never enter the key. The memory holds the arrays only
    weakly (see ``_watch``).
    """
    prepared, given, scalars = _checked_step(module, step, arrays, scalars, skip_step, grad_scale, segment_ids, target)
    prepared(given, scalars)


def checked_step(
    module: str,
    step: "Step",
    arrays: dict[str, Any],
    scalars: dict[str, float],
    *,
    skip_step: Any = None,
    grad_scale: Any = None,
    target: str | None = None,
) -> Callable[[], None]:
    """run_step's checks now, its launch later: for a step that another must precede only if
    this one can run (nothing is written when either fails its checks)."""
    prepared, given, scalars = _checked_step(module, step, arrays, scalars, skip_step, grad_scale, None, target)
    return lambda: prepared(given, scalars)


def _number_or_array(name: str, value: Any, default: float) -> tuple[Any, Any]:
    """(the kernel's scalar, None) for a number, (``default``, the array) for an array or None.
    A NumPy number of another type (float16, bfloat16, int8, ...) is the float it stands for."""
    if type(value) in _NUMBERS:
        return value, None
    if isinstance(value, np.generic):
        return float(classify(name, value).value), None  # classify refuses a complex number by name
    return default, value


def _checked_step(
    module, step, arrays, scalars, skip_step, grad_scale, segment_ids, target, prepare=None
) -> tuple[PreparedStep, dict, dict]:
    # ``arrays`` and ``scalars`` are the call's own (each caller builds them for this call), so
    # they are filled in rather than copied: in a small step this Python is most of the time.
    if skip_step is None and grad_scale is None:  # the usual step: neither to convert
        scalars["skip_step"], scalars["grad_scale"] = 0.0, 1.0
    else:
        scalars["skip_step"], skip_step = _number_or_array("skip_step", skip_step, 0.0)
        scalars["grad_scale"], grad_scale = _number_or_array("grad_scale", grad_scale, 1.0)
    given = arrays
    given["skip_step"], given["grad_scale"], given["segment_ids"] = skip_step, grad_scale, segment_ids
    # the objects' identities, not their names: _unchanged reads each name the step bound
    key = (module, step.name, target, _forced_target.get(), *map(id, given.values()))
    cached = _PREPARED.get(key)
    if cached is None or not _unchanged(cached[0], given):
        bound = {name: value for name, value in given.items() if value is not None}
        prepared = (prepare or _prepare_step)(module, step, bound, target)
        cached = (_watch(bound, key), prepared)
        if prepared.reusable and cached[0] is not None:
            _PREPARED[key] = cached
            if len(_PREPARED) > _PREPARED_LIMIT:
                _PREPARED.popitem(last=False)
    if cached[1].versioned and sys.modules["torch"].is_grad_enabled():  # checked at every call: grad mode changes
        _check_no_tracked_write(step, given, cached[1].versioned)
    return cached[1], given, scalars


def run_blockwise(
    module: str,
    blockwise: "Blockwise",
    arrays: dict[str, Any],
    scalars: dict[str, Any],
    *,
    skip_step: Any = None,
    grad_scale: Any = None,
    target: str | None = None,
    bits: int = 8,
) -> None:
    """Run a step with quantized states (``kernels.Blockwise``; codes of ``bits``, 8 or 4): its
    two kernels, the second only if every block's new absmax is finite; otherwise nothing is
    written and ValueError says so.

    ``arrays`` holds the step's float buffers and per-element arrays by the kernel's names, each
    quantized buffer's codes under its own name with its ``QUANTIZED_PARTS`` beside it
    (``exp_avg_absmax``, ...), the ``per_row`` arrays, and the scratch ``new_absmax`` (float32,
    one per block per quantized buffer) and ``refused`` (one float32 zero); ``scalars`` the
    numbers, ``row_length`` (an int) among them. Validated once per set of arrays, as run_step."""
    step = blockwise.step
    kernel_step = _blockwise_kernel_step(blockwise, bits)
    prepare = lambda module, _, bound, target: _prepare_blockwise(module, blockwise, bound, target, bits)  # noqa: E731
    refused = arrays["refused"]
    prepared, given, scalars = _checked_step(
        module, kernel_step, arrays, scalars, skip_step, grad_scale, None, target, prepare=prepare
    )
    prepared(given, scalars)
    if host_array(refused).reshape(-1)[0] != 0:
        copy_into(refused, np.zeros(1, np.float32))
        raise ValueError(
            f"the {step.name} step would make a state non-finite (an inf or NaN gradient, or one whose square "
            f"overflows float32), which {bits} bits cannot hold; nothing was written. Clip or skip such steps "
            "(GradScaler's found_inf skips them on the device)"
        )


@functools.cache
def _blockwise_kernel_step(blockwise: "Blockwise", bits: int) -> "Step":
    """The step as its blockwise kernels see it: what they write includes the codes, absmax
    and scratch (a forced GPU copies such host arrays back)."""
    step = blockwise.step
    quantized = [name for name in step.updates if name in blockwise.quantized]
    return dataclasses.replace(
        step,
        name=f"{step.name}_{blockwise_family(bits)}",
        updates=(*step.updates, *(f"{name}_absmax" for name in quantized), *BLOCKWISE_SCRATCH),
        optional=tuple(name for name in step.optional if name not in blockwise.quantized),
    )


def _prepare_blockwise(
    module: str, blockwise: "Blockwise", bound: dict[str, Any], target: str | None, bits: int = 8
) -> PreparedStep:
    step = blockwise.step
    floats = tuple(name for name in step.buffers if name not in blockwise.quantized)
    for name in floats:
        if name not in bound and name not in step.optional:
            raise TypeError(f"{_caller_name(step, name)} must be an array; got None")
    # the float buffers are checked as any step's; the mask is per column of a row, checked here
    checked = dataclasses.replace(
        step, buffers=floats, updates=tuple(name for name in step.updates if name in floats), mask=None
    )
    parts = {f"{name}_{part}" for name in blockwise.quantized for part in QUANTIZED_PARTS}
    apart = {*blockwise.quantized, *parts, *blockwise.per_row, *BLOCKWISE_SCRATCH, step.mask}
    operands = {name: classify(_caller_name(step, name), value) for name, value in bound.items()}
    reference = check_step(checked, {name: operand for name, operand in operands.items() if name not in apart})
    if computed(reference) != np.float32:
        raise TypeError(
            f"{reference.name} is {reference.dtype}; 8-bit states serve float32, bfloat16 and float16 parameters "
            "(keep float32 states for float64 ones)"
        )
    size = math.prod(reference.shape)
    where = choose_target(list(operands.values()), target)
    for name in blockwise.quantized:  # their length against the parameter's: quantization.run_step, every call
        given = operands[name]
        if given.kind == "scalar" or array_dtype(given) != np.uint8:
            raise ValueError(f"{_caller_name(step, name)}'s codes must be a uint8 array")
        if given.kind != reference.kind:
            raise ValueError(f"{_caller_name(step, name)} and {reference.name} must be on one device")
    if step.mask in operands and operands[step.mask].kind != "scalar":
        check_mask(operands[step.mask].name, host_values(operands[step.mask]))
    kernels = kernel_module(where, module)
    dtype = np.dtype(np.float32)
    blocks = math.prod(operands["new_absmax"].shape) // len(blockwise.quantized)  # the GPU's: a block each
    pair = [getattr(kernels, f"{blockwise_prefix(step.name, 'f32', bits)}_{kind}") for kind in ("scales", "codes")]
    scales, codes = (
        backend(where).prepare_step(
            kernel,
            _blockwise_kernel_step(blockwise, bits),
            operands,
            dtype,
            size if where == "cpu" else blocks,
            family=blockwise_family(bits),
        )
        for kernel in pair
    )
    names = kernel_parameters(pair[0])
    unread = () if blockwise.reads_param else (step.updates[0],)  # what no moment reads: no bound needed
    scales.launch = backend(where).blockwise_launch(
        scales.launch, codes.launch, names, blockwise.quantized, size, unread=unread
    )
    scales.reusable = scales.reusable and codes.reusable
    scales.versioned = tuple(name for name in step.updates if tracks_versions(bound.get(name)))
    return scales


def _check_no_tracked_write(step: "Step", given: dict[str, Any], written: Sequence[str]) -> None:
    """Refuse a step that would write a tensor requiring grad while autograd records, as torch
    refuses an in-place change of such a leaf: torch.optim steps under torch.no_grad()."""
    for name in written:
        if given[name].requires_grad:
            raise TypeError(
                f"{_caller_name(step, name)} is a torch tensor that requires grad, and the step would change it in "
                "place while autograd records; step under torch.no_grad(), as torch.optim does"
            )


_CHECKED: collections.OrderedDict = collections.OrderedDict()


def check_once(name: str, arrays: dict[str, Any], check: Callable[[], Any]) -> None:
    """Run ``check``, a validation that depends only on which objects ``arrays`` holds (arrays,
    None for an absent one) and on their memory, unless the same objects passed it before:
    remembered as run_step remembers the buffers it validated, so a training loop pays once."""
    bound = {key: value for key, value in arrays.items() if value is not None}
    key = (name, *bound, *map(id, bound.values()))
    watched = _CHECKED.get(key)
    if watched is not None and _unchanged(watched, bound):
        return
    check()
    watched = _watch(bound, key, _CHECKED)
    if watched is not None:
        _CHECKED[key] = watched
        if len(_CHECKED) > _PREPARED_LIMIT:
            _CHECKED.popitem(last=False)


def _watch(bound: dict[str, Any], key: tuple, memory: collections.OrderedDict = _PREPARED) -> tuple | None:
    """Weak references to a step's validated objects, with each torch tensor's data pointer.

    The memory must not keep the caller's arrays alive (a loop that makes a new gradient
    array every step would otherwise keep the last 32 of them), and must notice a new
    object under a dead one's id, or a tensor given new storage (``p.data = ...``,
    ``module.to(dtype)``). An entry is dropped as soon as one of its objects dies, which
    frees the views of torch or GPU memory it holds. None: an object that takes no weak
    reference (a list), whose step is prepared on every call.
    """
    forget = lambda _: memory.pop(key, None)  # noqa: E731
    try:
        return tuple(
            (name, weakref.ref(value, forget), value.data_ptr() if hasattr(value, "data_ptr") else None)
            for name, value in bound.items()
        )
    except TypeError:
        return None


def _unchanged(watched: tuple, given: dict[str, Any]) -> bool:
    for name, reference, pointer in watched:
        value = given.get(name)
        if reference() is not value or (pointer is not None and value.data_ptr() != pointer):
            return False
    return True


_NUMBERS = frozenset({int, float, bool, np.float32, np.float64, np.int32, np.int64})


def _prepare_step(module: str, step: "Step", bound: dict[str, Any], target: str | None) -> PreparedStep:
    for name in step.buffers:
        if name not in bound and name not in step.optional:  # None would run as a buffer of zeros, never written
            raise TypeError(
                f"{_caller_name(step, name)} must be an array (a state buffer starts as zeros, as "
                "in torch.optim); got None"
            )
    # Keyed by the kernels' parameter names, each named as the caller knows it in messages.
    operands = {name: classify(_caller_name(step, name), value) for name, value in bound.items()}
    reference = check_step(step, operands)
    where = choose_target(list(operands.values()), target)
    dtype = computed(reference)
    if step.mask in operands:  # validated once per mask object: a step that reuses it reads it unchecked
        check_mask(operands[step.mask].name, host_values(operands[step.mask]))
    kernel = getattr(kernel_module(where, module), f"{step.name}_{suffix(dtype)}_step")
    prepared = backend(where).prepare_step(kernel, step, operands, dtype, math.prod(reference.shape))
    prepared.versioned = tuple(name for name in step.updates if tracks_versions(bound.get(name)))
    return prepared


def _caller_name(step: "Step", name: str) -> str:
    """What the caller calls the kernel's argument ``name``, for messages (the step declares
    its own; skip_step is what AMP calls found_inf)."""
    return dict(step.names).get(name, "found_inf" if name == "skip_step" else name)


def copy_into(view: Any, tensor: Any) -> None:
    """view[...] = tensor across libraries (CuPy refuses NumPy on assignment; Numba copies both ways)."""
    if library(view) == "torch":
        torch = sys.modules["torch"]
        # detached: an arena is a plain buffer for the fused steps, outside autograd, also when
        # packed from parameters that require grad
        view.copy_(tensor.detach() if isinstance(tensor, torch.Tensor) else torch.as_tensor(tensor))
    else:
        where = "cuda" if classify("view", view).kind == "device" else "cpu"
        backend(where).write(view, classify("tensor", tensor))


def as_like(host: np.ndarray, like: Any, storage: str | None = None) -> Any:
    """``host``'s values in a new array of ``like``'s library and device (a NumPy copy when
    ``like`` is None): where a resumed state goes. ``storage`` ("bfloat16", "float16"): the
    new array holds that half precision (a NumPy bfloat16 one is ``ml_dtypes``')."""
    dtype: Any = host.dtype
    if storage is not None:
        dtype = _half_dtype(storage, like)
    if like is None:
        return host.astype(dtype)
    buffer = zeros_like(like, host.size, dtype).reshape(host.shape)
    copy_into(buffer, host)
    return buffer


def _half_dtype(storage: str, like: Any) -> Any:
    """``storage`` as a dtype of ``like``'s library (torch's, else NumPy's or ml_dtypes')."""
    if like is not None and library(like) == "torch":
        return getattr(sys.modules["torch"], storage)
    if storage == "float16":
        return np.dtype(np.float16)
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(
            "the checkpoint holds bfloat16 rows, which NumPy has no dtype for: install ml_dtypes, or "
            "pass like= a torch tensor"
        ) from None
    return np.dtype(ml_dtypes.bfloat16)
