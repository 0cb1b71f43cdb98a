"""Comparison helpers for the tests: ulp distances that treat NaN, ±inf and ±0 exactly."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter with this checkout importable: for what must not
    touch the test process (a package hidden, MPI initialised, torch's process groups)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def simulate_blocks_in_one_thread() -> None:
    """Numba's CUDA simulator runs each CUDA thread of a block as a Python thread, and the
    thread that manages the block polls them in a loop: a block of 32 threads costs 32 thread
    starts, and every barrier as many GIL hand-overs. Here each CUDA thread of a block is a
    greenlet of the launching thread instead: the block's threads run in turn, each up to its
    next ``syncthreads`` (or its end), and a barrier is a switch. That is a schedule the
    hardware may run too (any order of the threads between two barriers), and it is the same
    on every run. For the simulator's pytest process and the ranks a test starts under it;
    nothing otherwise."""
    from numba import config

    if config.ENABLE_CUDASIM:
        _run_simulated_threads_as_greenlets()
        _share_simulated_shared_arrays_safely()


def _run_simulated_threads_as_greenlets() -> None:
    import types

    import greenlet
    from numba.cuda.simulator import kernel, kernelapi

    class CudaThread(greenlet.greenlet):
        """One CUDA thread: what the simulator reads off its current thread (indices, barriers)."""

        def __init__(self, function, manager, block_index, thread_index):
            super().__init__(function)
            self._manager = manager  # the name the simulator's barrier reductions read
            self.blockIdx = kernel.Dim3(*block_index)
            self.threadIdx = kernel.Dim3(*thread_index)
            x, y, _ = manager._block_dim
            self.thread_id = thread_index[0] + x * (thread_index[1] + y * thread_index[2])

        def syncthreads(self):
            self.parent.switch()  # back to the block's loop, which resumes this thread after the barrier

        # the simulator's own: write block_state, barrier, reduce it, barrier
        syncthreads_count = kernel.BlockThread.syncthreads_count
        syncthreads_and = kernel.BlockThread.syncthreads_and
        syncthreads_or = kernel.BlockThread.syncthreads_or

    def run(self, grid_point, *args):
        threads = [CudaThread(self._f, self, grid_point, point) for point in np.ndindex(*self._block_dim)]
        waiting, started = threads, False
        while waiting:  # one pass: every thread runs to its next barrier or its end
            for thread in waiting:
                try:
                    thread.switch() if started else thread.switch(*args)
                except Exception as error:  # as the simulator reports it: which thread of which block
                    where = f"tid={list(thread.threadIdx)} ctaid={list(thread.blockIdx)}"
                    raise type(error)(f"{where}: {error}" if str(error) else where).with_traceback(
                        error.__traceback__
                    ) from None
            waiting, started = [thread for thread in waiting if not thread.dead], True

    kernel.BlockManager.run = run
    # The kernel API finds the running CUDA thread as threading.current_thread() (its indices,
    # its barriers); here it is the running greenlet. Its other uses of threading are locks
    # made at import.
    kernelapi.threading = types.SimpleNamespace(current_thread=greenlet.getcurrent)


def _share_simulated_shared_arrays_safely() -> None:
    """The simulator's ``cuda.shared.array`` finds a block's array by the calling line, and
    makes it when missing without a lock: two threads switched between the lookup and the
    store each get an array of their own, so the block's threads no longer share it (seen as
    wrong softmax rows once the switch interval was short). The same lookup under a lock; the
    caller is still the kernel's line, so arrays keep their identity."""
    import threading
    import traceback

    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    made = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        if shape == 0:  # dynamic shared memory: one buffer
            return np.frombuffer(self._dynshared.data, dtype=dtype, count=self._dynshared_size // dtype.itemsize)
        caller = tuple(traceback.extract_stack(sys._getframe())[-2][0:2])
        found = self._allocations.get(caller)
        if found is None:
            with made:
                found = self._allocations.setdefault(caller, np.empty(shape, dtype))
        return found

    kernelapi.FakeCUDAShared.array = array


def import_error_without(package: str, module: str) -> str:
    """What ``import module`` raises (its output, if it raises nothing) in a fresh interpreter
    where ``package`` is not installed."""
    result = run_python(f"""
import sys
sys.modules[{package!r}] = None  # as if it were not installed
try:
    import {module}
except ImportError as error:
    print(error)
""")
    return result.stdout + result.stderr


def pairs_met(rows) -> set:
    """Every (factor, value, factor, value) that some row of ``rows`` meets."""
    return {(i, row[i], j, row[j]) for row in rows for i, j in itertools.combinations(range(len(row)), 2)}


def all_pairs(*factors) -> list[tuple]:
    """Rows of the product of ``factors`` in which every value of each factor meets every value
    of each other factor at least once (a pairwise covering table, chosen greedily and the same
    on every run): for a matrix whose options do not interact beyond pairs, its cost instead of
    the whole product's."""
    product = list(itertools.product(*factors))
    missing, rows = pairs_met(product), []
    while missing:
        best = max(product, key=lambda row: len(pairs_met([row]) & missing))
        rows.append(best)
        missing -= pairs_met([best])
    return rows


# Values that break careless numerics, per dtype: zeros of both signs, infinities, NaN,
# the largest finite values, subnormals, and ordinary magnitudes.
EDGES = {
    np.float64: [0.0, -0.0, np.inf, -np.inf, np.nan, 1e308, -1e308, 1e-310, -5e-324, 1.0, -1.0, 0.5, 2.0, 1e-300],
    np.float32: [0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-40, -1e-45, 1.0, -1.0, 0.5, 2.0, 1e-37],
}


def ulp_distance(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Number of representable values between actual and expected (0 for equal, NaN==NaN)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    integer = np.int64 if actual.dtype == np.float64 else np.int32

    def ordered(x):
        # Maps floats to integers in the same order, one step per representable value;
        # -0.0 sits one step below +0.0.
        bits = x.view(integer).astype(np.int64)
        return np.where(bits < 0, np.int64(np.iinfo(integer).min) - bits - 1, bits)

    with np.errstate(over="ignore"):
        a, b = ordered(actual), ordered(expected)
        same_sign = (a < 0) == (b < 0)
        distance = np.where(
            same_sign, np.abs(a - b).astype(np.float64), np.abs(a.astype(np.float64)) + np.abs(b.astype(np.float64))
        )
    both_nan = np.isnan(actual) & np.isnan(expected)
    one_nan = np.isnan(actual) ^ np.isnan(expected)
    distance = np.where(both_nan, 0.0, distance)
    return np.where(one_nan, np.inf, distance)


def assert_ulp_close(actual, expected, ulps: float = 0, atol=0.0, context: str = ""):
    """Equal within ``ulps`` units in the last place (or ``atol``, a number or an array of
    the same shape); NaN, ±inf and the sign of zero must match exactly.

    ``-0.0`` and ``0.0`` are one ulp apart, so ``ulps=0`` also demands the same sign of zero.
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    distance = ulp_distance(actual, expected)
    finite = np.isfinite(actual) & np.isfinite(expected)
    with np.errstate(invalid="ignore"):
        error = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    close = (distance <= ulps) | (finite & (error <= atol))
    if not close.all():
        bad = np.flatnonzero(~close.reshape(-1))[:5]
        rows = [
            f"  [{i}] got {actual.reshape(-1)[i]!r} want {expected.reshape(-1)[i]!r} ({distance.reshape(-1)[i]} ulp)"
            for i in bad
        ]
        raise AssertionError(
            f"{context}: {int((~close).sum())} of {close.size} differ beyond {ulps} ulp\n" + "\n".join(rows)
        )


class SimulatedDeviceArray:
    """A host array that presents itself as GPU memory through __cuda_array_interface__.

    Under NUMBA_ENABLE_CUDASIM=1 steadystep takes it down the same zero-copy device path
    a CuPy array or torch CUDA tensor takes on a real GPU. Where the tests run on a real GPU,
    a test that makes one is skipped: the driver refuses host memory given as the GPU's.
    """

    def __init__(self, array: np.ndarray, readonly: bool = False):
        from tests.conftest import SIMULATOR, TARGETS

        if "cuda" in TARGETS and not SIMULATOR:
            import pytest

            pytest.skip("host memory presented as GPU memory is the simulator's stand-in; this process runs a GPU")
        self.array = array
        self.readonly = readonly

    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype

    def reshape(self, *shape):
        """A view with another shape, as CuPy arrays, torch tensors and Numba device arrays have."""
        return SimulatedDeviceArray(self.array.reshape(*shape), self.readonly)

    def __getitem__(self, index):
        """A view of part of it (the same memory), as a slice of GPU memory is."""
        return SimulatedDeviceArray(self.array[index], self.readonly)

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": self.array.shape,
            "typestr": self.array.dtype.str,
            "data": (self.array.ctypes.data, self.readonly),
            "strides": None if self.array.flags.c_contiguous else self.array.strides,
            "version": 3,
        }


def to_device(array: np.ndarray):
    """GPU memory holding ``array``: a real Numba device array on a GPU, simulated otherwise."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return SimulatedDeviceArray(np.array(array))
    from numba import cuda

    return cuda.to_device(array)


def to_host(value) -> np.ndarray:
    if isinstance(value, SimulatedDeviceArray):
        return value.array
    if hasattr(value, "copy_to_host"):
        return value.copy_to_host()
    return np.asarray(value)
