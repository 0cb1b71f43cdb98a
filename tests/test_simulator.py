"""The simulator's blocks run as greenlets of one thread (tests/helpers.py): barriers still
order a block's threads, a thread that ends early leaves the others' barriers working, the
barrier reductions count, and an error names its thread and block."""

import numpy as np
import pytest

from tests.conftest import SIMULATOR

# target: run by the simulator's process, which runs only the target tests
pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's scheduling (NUMBA_ENABLE_CUDASIM=1)")

if SIMULATOR:
    from numba import cuda, float64

    @cuda.jit
    def rotate(out, x):
        """out[t] = x[t + 1] of the block, through shared memory: wrong without the barrier."""
        shared = cuda.shared.array(32, float64)
        thread = cuda.threadIdx.x
        shared[thread] = x[cuda.grid(1)]
        cuda.syncthreads()
        out[cuda.grid(1)] = shared[(thread + 1) % cuda.blockDim.x]

    @cuda.jit
    def count_positive(out, x):
        thread = cuda.threadIdx.x
        positive = thread < x.shape[0] and x[thread] > 0
        total = cuda.syncthreads_count(positive)
        every = cuda.syncthreads_and(positive or thread >= x.shape[0])
        some = cuda.syncthreads_or(positive)
        if thread == 0:
            out[0], out[1], out[2] = total, every, some

    @cuda.jit
    def double_the_first(out, x):
        thread = cuda.threadIdx.x
        if thread >= x.shape[0]:
            return  # ends before the block's barrier, which still releases the others
        cuda.syncthreads()
        out[thread] = 2 * x[thread]

    @cuda.jit
    def fail_in_one_thread(x):
        if cuda.threadIdx.x == 3 and cuda.blockIdx.x == 1:
            raise ValueError("the thread's own error")
        cuda.syncthreads()
        x[cuda.grid(1)] = 1.0


def test_a_barrier_orders_a_blocks_threads(target):
    x = np.arange(64, dtype=np.float64)
    out = np.zeros_like(x)
    rotate[2, 32](out, x)
    expected = np.concatenate([np.roll(x[:32], -1), np.roll(x[32:], -1)])
    np.testing.assert_array_equal(out, expected)


def test_the_barrier_reductions_and_threads_that_end_early(target):
    out = np.zeros(3, np.int32)
    count_positive[1, 32](out, np.array([1.0, -1.0, 2.0, 3.0, 0.0]))
    assert out.tolist() == [3, 0, 1]
    count_positive[1, 32](out, np.array([1.0, 2.0]))
    assert out.tolist() == [2, 1, 1]
    doubled = np.zeros(5)
    double_the_first[1, 32](doubled, np.arange(5.0))
    np.testing.assert_array_equal(doubled, 2 * np.arange(5.0))


def test_an_error_names_its_thread_and_block(target):
    with pytest.raises(ValueError, match=r"tid=\[3, 0, 0\] ctaid=\[1, 0, 0\]: the thread's own error"):
        fail_in_one_thread[2, 32](np.zeros(64))
