"""Sums of squares per segment (gradient norms, LARS norms, AMP's non-finite check) on the CPU,
and the largest magnitude of an array (the bound that lets a step with quantized states skip
its scales kernel: cpu/backend.py).

Not a formula: the same reduction serves every optimizer. Work is split into chunks of at
most ``CHUNK`` elements that never cross a segment, so one large tensor still uses every
core. Within a chunk, lane k of ``LANES`` sums the elements k, k + LANES, ... in order, and
the lanes are added in a fixed pairwise tree: an order written in the code, so the result
has the same bits on every run and machine without reassociation flags, while the loop over
the lanes is a plain elementwise loop LLVM vectorizes.
"""

import numpy as np
from numba import njit, prange

from steadystep.cpu.primitives import at, lane_array, larger_magnitude_f32

# 128: 64 is as fast now that the lanes live on the stack; at 32 LLVM unrolls the loop fully
# instead of vectorizing it (BENCHMARKS.md, "Choices in the code").
LANES = 128


@njit(error_model="numpy", cache=True)
def _chunk_sum_squares(x, start, stop, scale, zero):
    full = (stop - start) - (stop - start) % LANES
    lanes = lane_array(zero, LANES)
    for k in range(LANES):
        lanes[k] = zero
    for base in range(start, start + full, LANES):
        block = x[base : base + LANES]  # a slice: x[base + k] would carry a negative-index check
        for k in range(LANES):
            value = at(block, k) * scale  # half precision read as float32
            lanes[k] += value * value
    for i in range(start + full, stop):
        value = at(x, i) * scale
        lanes[0] += value * value
    width = LANES
    while width > 1:
        width //= 2
        for k in range(width):
            lanes[k] += lanes[k + width]
    return lanes[0]


@njit(error_model="numpy", cache=True, parallel=True)
def sum_squares(out, x, chunk_starts, chunk_stops, chunk_segments, scale, zero):
    """out[s] = Σ (x·scale)² over the chunks of segment s (out starts at zero); scale is a
    number or a one-element array (an inverse loss scale kept beside the gradients)."""
    factor = at(scale, 0)
    partials = np.full(chunk_starts.shape[0], zero)  # zero's dtype: the one x is summed in
    for c in prange(chunk_starts.shape[0]):
        partials[c] = _chunk_sum_squares(x, chunk_starts[c], chunk_stops[c], factor, zero)
    for c in range(chunk_starts.shape[0]):
        out[chunk_segments[c]] += partials[c]


# elements a task of largest_magnitude takes
MAGNITUDE_CHUNK = 1 << 16


@njit(error_model="numpy", cache=True, parallel=True)
def largest_magnitude(x):
    """max |x| over a flat, non-empty array, as a float64; NaN if any element is NaN (llvm.maximum,
    which vectorises as a reduction). Half-precision storage is read as the float32 it holds."""
    chunks = (x.shape[0] + MAGNITUDE_CHUNK - 1) // MAGNITUDE_CHUNK
    partials = np.empty(chunks, np.float64)
    for c in prange(chunks):
        start = c * MAGNITUDE_CHUNK
        top = abs(at(x, start))
        for i in range(start + 1, min(start + MAGNITUDE_CHUNK, x.shape[0])):
            top = larger_magnitude_f32(top, at(x, i))
        partials[c] = top
    result = partials[0]
    for c in range(1, chunks):
        result = larger_magnitude_f32(result, partials[c])
    return result
