"""Sums of squares per segment on the GPU (see steadystep/cpu/reductions.py).

One block per chunk (a chunk never crosses a segment); each thread folds a strided share
of its chunk and adds it to the segment's total with one atomic add, so the kernel needs
no shared memory and serves float32 and float64 alike.
"""

from numba import cuda


@cuda.jit(cache=True)
def sum_squares(out, x, chunk_starts, chunk_stops, chunk_segments, scale, zero):
    """out[s] += Σ (x·scale)² over the chunks of segment s (out starts at zero)."""
    for c in range(cuda.blockIdx.x, chunk_starts.shape[0], cuda.gridDim.x):
        total = zero
        for i in range(chunk_starts[c] + cuda.threadIdx.x, chunk_stops[c], cuda.blockDim.x):
            value = x[i] * scale
            total += value * value
        cuda.atomic.add(out, chunk_segments[c], total)
