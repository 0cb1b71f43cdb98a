"""Sums of squares per segment (gradient norms, LARS norms, AMP's non-finite check) on the CPU.

Not a formula: the same reduction serves every optimizer. Work is split into chunks of at
most ``CHUNK`` elements that never cross a segment, so one large tensor still uses every
core; eight independent accumulators let the loop vectorize without reassociation flags.
"""

import numpy as np
from numba import njit, prange


@njit(error_model="numpy", cache=True)
def _chunk_sum_squares(x, start, stop, scale, zero):
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
    i = start
    while i + 8 <= stop:
        v0 = x[i] * scale
        v1 = x[i + 1] * scale
        v2 = x[i + 2] * scale
        v3 = x[i + 3] * scale
        v4 = x[i + 4] * scale
        v5 = x[i + 5] * scale
        v6 = x[i + 6] * scale
        v7 = x[i + 7] * scale
        a0 += v0 * v0
        a1 += v1 * v1
        a2 += v2 * v2
        a3 += v3 * v3
        a4 += v4 * v4
        a5 += v5 * v5
        a6 += v6 * v6
        a7 += v7 * v7
        i += 8
    while i < stop:
        v = x[i] * scale
        a0 += v * v
        i += 1
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@njit(error_model="numpy", cache=True, parallel=True)
def sum_squares(out, x, chunk_starts, chunk_stops, chunk_segments, scale, zero):
    """out[s] = Σ (x·scale)² over the chunks of segment s (out starts at zero)."""
    partials = np.empty(chunk_starts.shape[0], x.dtype)
    for c in prange(chunk_starts.shape[0]):
        partials[c] = _chunk_sum_squares(x, chunk_starts[c], chunk_stops[c], scale, zero)
    for c in range(chunk_starts.shape[0]):
        out[chunk_segments[c]] += partials[c]
