"""How many threads each kernel family is launched with: the one place the CUDA target's
launches are configured (steadystep.cuda.backend reads it; tests/test_ptx.py checks every
kernel's registers and shared memory against it). Imports no CUDA driver."""

from __future__ import annotations

from numba import config

from steadystep.cuda.primitives import ROW_THREADS
from steadystep.kernels import blockwise_family

# Threads per block, by kernel family, chosen from what ptxas reports for each family's kernels
# on sm_80 and sm_90 (BENCHMARKS.md, "GPU kernel
# resources"; tests/test_ptx.py checks every kernel against its family's entry): 256 threads
# leave each family at least two blocks an SM, the streaming ones (elementwise, steps,
# mixing, reductions) 50% occupancy or more, and every kernel without spills. Row kernels
# size their shared scratch by ROW_THREADS; mixing kernels take fewer threads when N
# workers' scratch would not fit (mixing_threads). The simulator runs each thread in Python: 32.
THREADS = {
    family: 32 if config.ENABLE_CUDASIM else 256
    for family in ("elementwise", "step", "grid", "short_rows", "mixing", "reduction", "fill")
}
THREADS["rows"] = ROW_THREADS
# A step with 8-bit states: a block per quantization block of 256 elements, whose threads
# stride over it (a power of two, at most 256: their maxima meet in a tree); with 4-bit
# states, blocks of 128 elements, whose codes kernel gives each thread a pair (one byte)
THREADS[blockwise_family(8)] = 32 if config.ENABLE_CUDASIM else 256
THREADS[blockwise_family(4)] = 32 if config.ENABLE_CUDASIM else 64


def threads_for(family: str) -> int:
    """Threads per block of a kernel of ``family`` (see THREADS)."""
    return THREADS[family]


SHARED_BYTES = 48 * 1024  # dynamic shared memory a block may take without opting in, on every GPU


def mixing_threads(workers: int, itemsize: int) -> int:
    """Threads per block of a mixing kernel: each keeps N scratch elements in shared memory
    (up to 256 threads, whole warps while 32 fit). Refuses more workers than one thread's
    scratch can hold (12,288 float32 rows)."""
    fit = SHARED_BYTES // (workers * itemsize)
    if fit < 1:
        raise ValueError(
            f"{workers} workers of {itemsize}-byte values do not fit one GPU thread's scratch of "
            f"{SHARED_BYTES} bytes of shared memory; use fewer workers per process (or the MPI backend)"
        )
    return min(THREADS["mixing"], fit if fit < 32 else fit // 32 * 32)
