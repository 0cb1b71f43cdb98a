"""Sums of squares per segment on the GPU (see steadystep/cpu/reductions.py).

The order of every addition is fixed, so a gradient norm has the same bits on every run
(atomic adds would sum in whatever order the blocks finish, and clipping, LARS and the
decentralized step would differ run to run). Two launches:

1. ``chunk_sums``: one block per chunk (a chunk never crosses a segment). Thread t sums the
   elements t, t + blockDim, ... of its chunk in order (another order than the CPU's lanes, so
   other bits than the CPU's, the same on every run), then the block's threads are added in a
   pairwise tree. The tree lives in a global scratch row per block rather than in
   shared memory, whose dtype would have to be fixed at compile time: one kernel serves
   float32 and float64 (and half-precision x, summed in float32), and the barrier makes a
   block's global writes visible to the block.
2. ``segment_sums``: one thread per segment adds its chunks' sums in chunk order.
"""

from numba import cuda

from steadystep.cuda.primitives import at, jit_kernel


@jit_kernel
def chunk_sums(partials, scratch, x, chunk_starts, chunk_stops, scale, zero):
    """partials[c] = Σ (x·scale)² over chunk c (scale: a number or a one-element array);
    scratch holds blockDim values per block."""
    factor = at(scale, 0)
    thread, threads = cuda.threadIdx.x, cuda.blockDim.x
    row = cuda.blockIdx.x * threads
    for c in range(cuda.blockIdx.x, chunk_starts.shape[0], cuda.gridDim.x):
        total = zero
        for i in range(chunk_starts[c] + thread, chunk_stops[c], threads):
            value = at(x, i) * factor  # half precision read as float32
            total += value * value
        scratch[row + thread] = total
        cuda.syncthreads()
        width = threads // 2
        while width > 0:
            if thread < width:
                scratch[row + thread] += scratch[row + thread + width]
            cuda.syncthreads()
            width //= 2
        if thread == 0:
            partials[c] = scratch[row]
        cuda.syncthreads()  # the block's next chunk reuses its scratch row


@jit_kernel
def segment_sums(out, partials, segment_chunks, zero):
    """out[s] = Σ partials[c] for c in segment_chunks[s]:segment_chunks[s + 1], in order."""
    for segment in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        total = zero
        for c in range(segment_chunks[segment], segment_chunks[segment + 1]):
            total += partials[c]
        out[segment] = total
