"""Sums of squares per segment (gradient norms, LARS norms, AMP's non-finite check) on the CPU.

Not a formula: the same reduction serves every optimizer. Work is split into chunks of at
most ``CHUNK`` elements that never cross a segment, so one large tensor still uses every
core; eight independent accumulators let the loop vectorize without reassociation flags.
"""

import numpy as np
from numba import njit, prange


@njit(error_model="numpy", cache=True)
def _chunk_sum_squares(x, start, stop, scale, zero):
    # Loads through a slice with constant offsets: `x[i + 1]` with a runtime i carries Numba's
    # negative-index check, which kept this loop scalar (1.6x slower at 32M float32).
    values = x[start:stop]
    full = values.shape[0] - values.shape[0] % 8
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
    for i in range(0, full, 8):
        block = values[i:i + 8]
        v0 = block[0] * scale
        v1 = block[1] * scale
        v2 = block[2] * scale
        v3 = block[3] * scale
        v4 = block[4] * scale
        v5 = block[5] * scale
        v6 = block[6] * scale
        v7 = block[7] * scale
        a0 += v0 * v0
        a1 += v1 * v1
        a2 += v2 * v2
        a3 += v3 * v3
        a4 += v4 * v4
        a5 += v5 * v5
        a6 += v6 * v6
        a7 += v7 * v7
    for value in values[full:]:
        value = value * scale
        a0 += value * value
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@njit(error_model="numpy", cache=True, parallel=True)
def sum_squares(out, x, chunk_starts, chunk_stops, chunk_segments, scale, zero):
    """out[s] = Σ (x·scale)² over the chunks of segment s (out starts at zero)."""
    partials = np.empty(chunk_starts.shape[0], x.dtype)
    for c in prange(chunk_starts.shape[0]):
        partials[c] = _chunk_sum_squares(x, chunk_starts[c], chunk_stops[c], scale, zero)
    for c in range(chunk_starts.shape[0]):
        out[chunk_segments[c]] += partials[c]
