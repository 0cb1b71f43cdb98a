"""The CUDA backend: runs the generated CUDA kernels, zero-copy on GPU arrays (CuPy, torch
CUDA tensors, Numba device arrays), with explicit copies for host data sent to the GPU by a
forced target.

It offers the same functions, with the same signatures, as ``steadystep/cpu/backend.py``
(``dispatch.Backend`` lists them; a test compares the two). It imports the array layer
(``steadystep._arrays``) and this target's own modules only; importing it imports Numba's CUDA
support, so the package imports it only when a call runs on the GPU.
"""

from __future__ import annotations

import collections
import ctypes
import math
import sys
import threading
import types
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import config

try:  # numba-cuda's own warning class (0.30), not numba.core's; tests/test_ptx.py holds it to the dispatcher's
    from numba.cuda.core.errors import NumbaPerformanceWarning
except ImportError:  # another numba-cuda: the occupancy warning may show, nothing else changes
    from numba.core.errors import NumbaPerformanceWarning

from steadystep.cuda.primitives import broadcast_fill, convert
from steadystep.cuda.threads import THREADS, mixing_threads
from steadystep.kernels import BLOCKWISE_FAMILIES
from steadystep.cuda.runtime import require_cuda
from steadystep._arrays import (
    HALF_BITS,
    Operand,
    PerThread,
    PreparedStep,
    array_dtype,
    computed,
    c_contiguous,
    check_out,
    classify,
    device_interface,
    device_interface_of,
    dtype_name,
    host_operand,
    kernel_parameters,
    overlapping_out,
    step_arguments,
    stored_as,
    wrap_like,
)

from steadystep import _half

if TYPE_CHECKING:
    from steadystep.kernels import Step

cuda = require_cuda()

MAX_BLOCKS = 4096  # grid-stride loops cover anything larger


def _as_device_array(value: Any, owned: bool = True, interface: dict | None = None) -> Any:
    """A Numba device array over ``value``'s memory (zero-copy through __cuda_array_interface__).

    ``owned=False`` gives a view that does not keep ``value`` alive (a step remembered for
    later calls watches ``value`` weakly and is forgotten when it dies; dispatch._watch).

    Our kernels run on the default stream. An array that names the stream its data was
    written on (interface version 3, e.g. CuPy) is synchronised first only when that is a
    stream of the user's: the default stream already waits for the legacy (1) and
    per-thread (2) default streams, and a host synchronisation per call would stall every
    step (and break the AMP steps' promise of none).

    The simulator has no ``as_cuda_array``; its "device" memory is host memory, so there
    the same interface becomes a simulated device array over a NumPy view, which keeps this
    path testable without a GPU. ``interface``: ``value``'s, when already read.
    """
    if hasattr(value, "copy_to_host") and (owned or config.ENABLE_CUDASIM):
        return value  # already a Numba device array (the simulator's expose no interface to view)
    if interface is None:
        interface = value.__cuda_array_interface__
    if not config.ENABLE_CUDASIM:
        return cuda.from_cuda_array_interface(interface, owner=value if owned else None, sync=_user_stream(interface))
    dtype = np.dtype(interface["typestr"])
    count = math.prod(interface["shape"])
    memory = (ctypes.c_byte * (count * dtype.itemsize)).from_address(interface["data"][0])
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    simulated = FakeCUDAArray(np.frombuffer(memory, dtype).reshape(interface["shape"]))
    if owned:
        simulated.owner = value  # keeps value's memory alive, as from_cuda_array_interface's owner does
    return simulated


# Configured launches by (kernel, blocks, threads, shared bytes); cleared when full (a sweep over
# many sizes), as dispatch's plans are.
_CONFIGURED: dict[tuple, Any] = {}
_CONFIGURED_LIMIT = 1024


def _configured(kernel, blocks: int, threads: int, shared: int = 0) -> Any:
    """``kernel[blocks, threads, 0, shared]``, made once and kept: Numba's launch configuration
    (the dimensions' checks, the stream, an occupancy check) is host time every call would pay
    again. Its warning that a grid of fewer than 128 blocks leaves the GPU idle is silenced:
    a small tensor's launch is the package's, not the user's to resize. The simulator's kernels
    configure themselves in place (``kernel[...]`` returns the kernel), so there the launch is
    configured at every call instead."""
    if config.ENABLE_CUDASIM:
        return lambda *arguments: kernel[blocks, threads, 0, shared](*arguments)
    key = (kernel, blocks, threads, shared)
    found = _CONFIGURED.get(key)
    if found is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NumbaPerformanceWarning)
            found = kernel[blocks, threads, 0, shared]
        if len(_CONFIGURED) >= _CONFIGURED_LIMIT:
            _CONFIGURED.clear()
        _CONFIGURED[key] = found
    return found


def _device_view(operand: Operand, owned: bool = True) -> Any:
    """``_as_device_array`` of a device operand, from the interface its classification read."""
    return _as_device_array(operand.value, owned, operand.interface)


def _contiguous_view(operand: Operand, owned: bool = True) -> Any:
    """``_device_view``, refused by name unless the operand's memory is C-contiguous."""
    if not c_contiguous(device_interface_of(operand), array_dtype(operand).itemsize):
        raise ValueError(f"{operand.name} must be C-contiguous on the GPU")
    return _device_view(operand, owned)


def _shaped(array: Any, *shape: int) -> Any:
    """``array.reshape(*shape)``, or ``array`` itself when it has that shape already: Numba's
    reshape builds a new device array even then, host time at every call."""
    return array if array.shape == shape else array.reshape(*shape)


def _user_stream(interface: dict) -> bool:
    return interface.get("stream") not in (None, 1, 2)


def _launch_config(size: int, family: str) -> tuple[int, int]:
    """(blocks, threads) of a grid-stride kernel of ``family`` over ``size`` items."""
    threads = THREADS[family]
    if family in BLOCKWISE_FAMILIES:  # ``size`` counts quantization blocks: a thread block each
        return min(MAX_BLOCKS, max(1, size)), threads
    return min(MAX_BLOCKS, max(1, math.ceil(size / threads))), threads


def _device_operand(operand: Operand, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """What a CUDA kernel receives for one operand; GPU arrays are never cast or copied."""
    if operand.kind != "device":
        prepared = host_operand(operand, shape, dtype)
        return cuda.to_device(prepared) if isinstance(prepared, np.ndarray) else prepared
    if operand.dtype != dtype and not (operand.storage and dtype == np.float32):  # half: its bits, read as float32
        raise TypeError(
            f"{operand.name} is {dtype_name(operand)} on the GPU but the call computes in {dtype}; "
            "steadystep does not cast on the device, so pass matching dtypes"
        )
    array = _contiguous_view(operand)
    size = math.prod(shape)
    if operand.shape == shape:
        return _shaped(array, size)
    if array.size == 1:
        expanded = cuda.device_array(size, array_dtype(operand))  # half: its bits, copied
        if size:
            blocks, threads = _launch_config(size, "fill")
            _configured(broadcast_fill, blocks, threads)(expanded, array.reshape(1))
        return expanded
    raise ValueError(
        f"{operand.name} has shape {operand.shape}; on the GPU an operand must have the result's shape {shape} "
        "or a single element (broadcast it explicitly first)"
    )


def _overlapping_device_out(target: Operand | None, operands: list[Operand]) -> list[int]:
    """overlapping_out for a GPU ``out`` (host data reaches the GPU as copies anyway)."""
    return overlapping_out(target, operands) if target is not None and target.kind == "device" else []


def _device_copy(array: Any) -> Any:
    """A copy of a Numba device array, in new GPU memory."""
    if config.ENABLE_CUDASIM:  # the simulator's arrays copy to each other only through the host
        return cuda.to_device(array.copy_to_host())
    copy = cuda.device_array(array.shape, array.dtype)
    copy.copy_to_device(array)
    return copy


def allocate_like(operands: list[Operand], shape: tuple[int, ...], dtype: np.dtype, storage: str | None = None) -> Any:
    """A result array from the same library as the first GPU operand (CuPy, torch or Numba);
    with ``storage``, of that half-precision dtype (a Numba array holds float16 as float16,
    bfloat16 as its uint16 bits: Numba has no bfloat16)."""
    for operand in operands:
        if operand.kind != "device":
            continue
        array = operand.value if operand.source is None else operand.source
        module = type(array).__module__.split(".")[0]
        if module == "torch":
            torch = sys.modules["torch"]
            return torch.empty(shape, dtype=getattr(torch, storage or dtype.name), device=array.device)
        if module == "cupy":
            return sys.modules["cupy"].empty(shape, storage or dtype)
        break
    return cuda.device_array(shape, np.float16 if storage == "float16" else HALF_BITS.get(storage or "", dtype))


def prepare_elementwise(
    kernel, operands: list[Operand], out: Any, dtype: np.dtype, shape: tuple[int, ...], storage: str | None = None
) -> Callable[[list, Sequence, Any], Any] | None:
    """No prepared path on the GPU yet: a call's arguments are host arrays here only when the
    target is forced (GPU memory is not a kind `host_kinds()` reads), and a launch's own
    latency has not been measured beside the Python's on a GPU. Every call takes `elementwise()`."""
    return None


def elementwise(
    kernel, operands: list[Operand], out: Any, dtype: np.dtype, shape: tuple[int, ...], storage: str | None = None
) -> Any:
    stored = HALF_BITS[storage] if storage else dtype
    target = None if out is None else check_out(out, "cuda", shape, stored, operands, storage)
    arguments = [_device_operand(operand, shape, dtype) for operand in operands]
    for index in _overlapping_device_out(target, operands):
        arguments[index] = _device_copy(arguments[index])
    size = math.prod(shape)
    on_device = any(operand.kind == "device" for operand in operands)
    interface = None
    if target is not None and target.kind == "device":
        result, interface = target.value, target.interface  # out, or the view of its memory that classify took
    elif on_device:
        result = allocate_like(operands, shape, dtype, storage)
    else:
        result = cuda.device_array(shape, stored)
    if size:
        blocks, threads = _launch_config(size, "elementwise")
        written = classify("out", result).value if storage and on_device and target is None else result  # its bits
        written_array = _as_device_array(written, interface=interface if written is result else None)
        _configured(kernel, blocks, threads)(_shaped(written_array, size), *arguments)
    if target is not None and target.kind == "host":
        result.copy_to_host(target.value)
        return out
    if out is None and not on_device:
        return wrap_like(result.copy_to_host(), operands, storage)
    return result if out is None else out


# Rows of at most this many bytes go one per thread: a warp's 32 rows then stay in its SM's L1
# cache from one column to the next (longer rows, one per thread, would evict each other)
SHORT_ROW_BYTES = 128


def rows(kernels: types.ModuleType, name: str, xs: Operand, out: Any, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    """Run a row kernel of ``kernels``: ``<name>_rows``, one thread block per row, or for
    short rows ``<name>_short_rows``, one thread per row; ``shape`` is the result's."""
    if xs.kind == "device" and xs.storage:
        return _half_rows(kernels, name, xs, out, dtype, shape)
    target = None if out is None else check_out(out, "cuda", shape, dtype, [xs])
    length = xs.shape[-1]
    count = math.prod(xs.shape[:-1])
    if xs.kind == "device":
        if xs.dtype != dtype:
            raise TypeError(
                f"xs is {xs.dtype} on the GPU; steadystep does not cast on the device, pass float32/float64"
            )
        data = _shaped(_contiguous_view(xs), count, length)
        if _overlapping_device_out(target, [xs]):
            data = _device_copy(data)
    else:
        data = cuda.to_device(np.ascontiguousarray(xs.value, dtype=dtype).reshape(count, length))
    result_interface = None
    if target is not None and target.kind == "device":
        result, result_interface = target.value, target.interface
    elif xs.kind == "device":
        result = allocate_like([xs], shape, dtype)
    else:
        result = cuda.device_array(shape, dtype)
    if count:
        written = _as_device_array(result, interface=result_interface)
        arguments = (_shaped(written, count, *shape[len(xs.shape) - 1 :]), data)
        if length * dtype.itemsize <= SHORT_ROW_BYTES:
            _configured(getattr(kernels, f"{name}_short_rows"), *_launch_config(count, "short_rows"))(*arguments)
        else:
            _configured(getattr(kernels, f"{name}_rows"), min(count, MAX_BLOCKS), THREADS["rows"])(*arguments)
    if target is not None and target.kind == "host":
        result.copy_to_host(target.value)
        return out
    if out is None and xs.kind != "device":
        return result.copy_to_host()
    return result if out is None else out


def _half_rows(
    kernels: types.ModuleType, name: str, xs: Operand, out: Any, dtype: np.dtype, shape: tuple[int, ...]
) -> Any:
    """Row formulas over half-precision GPU rows: widened (exactly) into float32 scratch on the
    GPU, computed there, each result rounded once into ``xs``'s dtype (``out``, or a new
    array of ``xs``'s library)."""
    storage = xs.storage
    assert storage is not None
    target = None if out is None else check_out(out, "cuda", shape, HALF_BITS[storage], [xs], storage)
    size, results = math.prod(xs.shape), math.prod(shape)
    wide = cuda.device_array(size, dtype)
    if size:
        _configured(convert, *_launch_config(size, "fill"))(wide, _flat(xs))
    computed = rows(kernels, name, classify(xs.name, wide.reshape(xs.shape)), None, dtype, shape)
    if target is not None and target.kind == "device":
        final, bits = out, target.value
    else:
        final = allocate_like([xs], shape, dtype, storage)
        bits = classify("out", final).value
    if results:
        _configured(convert, *_launch_config(results, "fill"))(
            _as_device_array(bits).reshape(results), computed.reshape(results)
        )
    if target is not None and target.kind == "host":
        final.copy_to_host(target.value)
        return out
    return final


def _flat(operand: Operand, owned: bool = True) -> Any:
    if operand.kind == "device":
        return _shaped(_contiguous_view(operand, owned), math.prod(operand.shape))
    return cuda.to_device(np.ascontiguousarray(operand.value).reshape(-1))


def prepare_step(
    kernel, step: "Step", operands: dict[str, Operand], dtype: np.dtype, size: int, family: str = "step"
) -> PreparedStep:
    """One launch per call; host buffers (a forced target) are copied there at the launch (a
    step that another precedes, as Adam's count schedule, reads what that one wrote) and
    those the step writes copied back."""
    on_host = object()

    def convert(operand: Operand) -> Any:
        return on_host if operand.kind != "device" else _flat(operand, owned=False)

    arguments, slots, _ = step_arguments(kernel, step, operands, dtype, convert)
    names = kernel_parameters(kernel)
    hosts = [(index, operands[names[index]]) for index, value in enumerate(arguments) if value is on_host]
    configured = _configured(kernel, *_launch_config(size, family)) if size else None

    def launch(*given: Any) -> None:
        values = list(given)
        for index, operand in hosts:
            values[index] = _flat(operand)
        if configured is not None:
            configured(*values)
        for index, operand in hosts:
            if names[index] in step.updates:
                operand.value.reshape(-1)[:] = values[index].copy_to_host()

    # Host data is copied over on every call; an array written on a stream of the user's is
    # synchronised on every call (_as_device_array), so neither step is remembered.
    reusable = all(
        operand.kind == "device" and not _user_stream(device_interface_of(operand)) for operand in operands.values()
    )
    return PreparedStep(launch, arguments, slots, dtype.type, reusable=reusable)


def blockwise_launch(
    scales: Callable[..., None],
    codes: Callable[..., None],
    names: Sequence[str],
    quantized: Sequence[str],
    size: int,
    unread: Sequence[str] = (),
) -> Callable[..., None]:
    """The launch of a step with quantized states: its scales kernel (each block's new absmax,
    and the flag of a step that would make a state non-finite), then its codes kernel. Both
    always run (``unread`` matters to the CPU's bound check only)."""

    def launch(*arguments: Any) -> None:
        scales(*arguments)
        codes(*arguments)

    return launch


# The most recently used (layout, name) pairs: a sweep over many model shapes in one process
# must not keep every model's segment ids on the GPU. Shared by threads, hence the lock.
_LAYOUT_ARRAYS: collections.OrderedDict = collections.OrderedDict()
_LAYOUT_ARRAYS_LOCK = threading.Lock()
LAYOUT_ARRAYS_KEPT = 32


def layout_array(layout, name: str) -> Any:
    """``layout.chunks`` (a tuple) or ``layout.segment_ids`` on the device, copied once per
    layout rather than on every norm or LARS step (segment ids are as long as the model)."""
    key = (layout, name)
    with _LAYOUT_ARRAYS_LOCK:
        found = _LAYOUT_ARRAYS.get(key)
        if found is not None:
            _LAYOUT_ARRAYS.move_to_end(key)
            return found
        host = getattr(layout, name)
        found = _LAYOUT_ARRAYS[key] = (
            tuple(map(cuda.to_device, host)) if isinstance(host, tuple) else cuda.to_device(host)
        )
        while len(_LAYOUT_ARRAYS) > LAYOUT_ARRAYS_KEPT:
            _LAYOUT_ARRAYS.popitem(last=False)
        return found


def sum_squares(operand: Operand, layout, scale: float | Operand) -> Any:
    from steadystep.cuda.reductions import chunk_sums, segment_sums

    dtype = computed(operand)  # float32 for half precision
    starts, stops, _ = layout_array(layout, "chunks")
    blocks = max(1, min(starts.shape[0], MAX_BLOCKS))
    threads = THREADS["reduction"]
    partials, scratch = _reduction_workspace(starts.shape[0], blocks * threads, dtype)
    # every element written by segment_sums; of the GPU array's library (torch, CuPy or Numba)
    out = allocate_like([operand], (layout.segments,), dtype)
    zero = dtype.type(0)
    if starts.shape[0]:
        factor = _flat(scale) if isinstance(scale, Operand) else dtype.type(scale)
        _configured(chunk_sums, blocks, threads)(partials, scratch, _flat(operand), starts, stops, factor, zero)
    if layout.segments:
        _configured(segment_sums, *_launch_config(layout.segments, "reduction"))(
            _as_device_array(out), partials, layout_array(layout, "segment_chunks"), zero
        )
    return (
        out if operand.kind == "device" else out.copy_to_host()
    )  # host data forced to the GPU: results come back, as elementwise's


def _reduction_workspace(chunks: int, scratch: int, dtype: np.dtype) -> tuple[Any, Any]:
    """Per-thread device buffers for the reduction, grown as needed and reused: a norm then
    allocates only its result. One set per Python thread: two threads' launches interleave
    on the default stream, and one's chunk sums must not be overwritten by the other's."""
    kept = _WORKSPACE.kept.get(dtype)
    if kept is None or kept[0].shape[0] < chunks or kept[1].shape[0] < scratch:
        had = (0, 0) if kept is None else (kept[0].shape[0], kept[1].shape[0])
        kept = _WORKSPACE.kept[dtype] = (
            cuda.device_array(max(chunks, had[0], 1), dtype),
            cuda.device_array(max(scratch, had[1], 1), dtype),
        )
    return kept


_WORKSPACE = PerThread()


def run_mixing(kernel, arguments: list, workers: int, columns: int) -> None:
    """A mixing kernel in place over [N, D] GPU buffers: a thread per column, its N scratch
    values in the block's dynamic shared memory."""
    values = _device_values(arguments)
    itemsize = max(4, values[0].dtype.itemsize)  # the scratch's dtype: float32 for half-precision rows
    threads = mixing_threads(workers, itemsize)
    if columns:
        blocks = min(MAX_BLOCKS, math.ceil(columns / threads))
        _configured(kernel, blocks, threads, workers * threads * itemsize)(*values)


def check_mixing(workers: int, itemsize: int) -> None:
    """Refuse more workers than one GPU thread's share of shared memory can hold as scratch."""
    mixing_threads(workers, itemsize)


def run_grid(kernel, arguments: list, size: int) -> None:
    """A grid kernel over GPU buffers, one launch covering ``size`` items."""
    values = _device_values(arguments)
    if size:
        _configured(kernel, *_launch_config(size, "grid"))(*values)


def _device_values(arguments: list) -> list:
    """A kernel's arguments with every GPU array (torch, CuPy, Numba) as a Numba device array."""
    values = []
    for value in arguments:
        interface, holder = device_interface(value)
        values.append(value if interface is None else _as_device_array(holder, interface=interface))
    return values


def empty(shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """Scratch the kernels write before they read it."""
    return cuda.device_array(shape, dtype)


def kernel_array(operand: Operand, dtype: np.dtype | None = None) -> Any:
    """What a kernel reads for ``operand``: a view of its GPU memory, or a copy of host data
    (of ``dtype`` when given) sent to the GPU."""
    if operand.kind == "device":
        return _device_view(operand)
    if operand.storage and dtype is not None and dtype != operand.dtype:
        return to_target(np.ascontiguousarray(_half.widened(operand.value, array_dtype(operand)), dtype))
    return to_target(np.ascontiguousarray(operand.value, dtype))


def to_target(host: np.ndarray) -> Any:
    """A copy of a host array in GPU memory."""
    return cuda.to_device(np.ascontiguousarray(host))


def to_host(array: Any) -> np.ndarray:
    """A NumPy copy of a GPU array (a Numba device array, or anything with the CUDA array interface)."""
    return array.copy_to_host() if hasattr(array, "copy_to_host") else _as_device_array(array).copy_to_host()


def write(destination: Any, source: Operand) -> None:
    """Copy ``source``'s values into ``destination``, an array of this target of the same size."""
    target = classify("destination", destination)
    if source.kind == "device":
        if (source.dtype, source.storage) != (target.dtype, target.storage):
            raise TypeError(
                f"a {dtype_name(source)} GPU array cannot be copied into {dtype_name(target)} GPU memory; "
                "steadystep does not cast on the device"
            )
        values = _device_view(source)
    else:
        values = np.ascontiguousarray(stored_as(source, target))
    _device_view(target).copy_to_device(values)
