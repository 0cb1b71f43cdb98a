"""CuPy arrays, for real: the calls take them zero-copy on the GPU and give CuPy arrays back,
with the values the CPU kernels give for the same NumPy inputs. These need a GPU and CuPy
(``pip install 'steadystep[cupy]'``): ci/gpu_check.sh runs them; elsewhere they skip."""

from __future__ import annotations

import numpy as np
import pytest

from steadystep import arena, decentral, optim
from steadystep import numerical_stability as ns
from tests.conftest import SIMULATOR


@pytest.fixture
def cupy(target):
    if target != "cuda" or SIMULATOR:
        pytest.skip("CuPy needs a real GPU (the simulator's device arrays are Numba's)")
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available():
        pytest.skip("CuPy sees no GPU")
    return cupy


def _moments(rng: np.random.Generator, size: int) -> list[np.ndarray]:
    return [rng.standard_normal(size), rng.standard_normal(size), np.zeros(size), np.zeros(size)]


def test_adamw_steps_cupy_arrays_in_place(cupy):
    host = _moments(np.random.default_rng(0), 100_003)
    device = [cupy.asarray(array) for array in host]
    pointers = [array.data.ptr for array in device]
    for step in (1, 2):
        optim.adamw(*host, step=step, lr=1e-2, weight_decay=0.1)
        optim.adamw(*device, step=step, lr=1e-2, weight_decay=0.1)
    assert [array.data.ptr for array in device] == pointers  # the same memory, written in place
    for gpu, cpu in zip(device, host):
        np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=1e-12, atol=1e-15)


def test_elementwise_and_row_functions_give_cupy_arrays(cupy):
    x = np.random.default_rng(1).standard_normal((300, 70)) * 30
    softplus = ns.softplus(cupy.asarray(x))
    softmax = ns.softmax(cupy.asarray(x))
    assert isinstance(softplus, cupy.ndarray) and isinstance(softmax, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(softplus), ns.softplus(x), rtol=1e-14)
    np.testing.assert_allclose(cupy.asnumpy(softmax), ns.softmax(x), rtol=1e-13, atol=1e-300)


def test_decentralized_adamw_on_cupy_rows(cupy):
    rng = np.random.default_rng(2)
    params, grads = rng.standard_normal((8, 1000)).astype(np.float32), rng.standard_normal((8, 1000)).astype(np.float32)
    rows = cupy.asarray(params)
    on_gpu = decentral.DecentralizedAdamW(rows, topology=decentral.one_peer_exponential(), lr=1e-2, max_norm=1.0)
    on_cpu = decentral.DecentralizedAdamW(params, topology=decentral.one_peer_exponential(), lr=1e-2, max_norm=1.0)
    for _ in range(3):
        on_gpu.step(cupy.asarray(grads))
        on_cpu.step(grads)
    assert on_gpu.where == "cuda"
    np.testing.assert_allclose(cupy.asnumpy(rows), params, rtol=1e-5, atol=1e-6)  # rows trained in place


def test_arena_packs_cupy_tensors(cupy):
    tensors = [cupy.arange(6, dtype=cupy.float32).reshape(2, 3), cupy.ones(4, dtype=cupy.float32)]
    packed = arena.Arena.pack(tensors)
    # each tensor starts at a multiple of 64 elements, the padding zero
    expected = np.zeros(128, np.float32)
    expected[:6], expected[64:68] = np.arange(6), 1
    assert isinstance(packed.buffer, cupy.ndarray) and packed.buffer.shape == expected.shape
    np.testing.assert_array_equal(cupy.asnumpy(packed.buffer), expected)
    packed.views[1][...] = 7  # a view, not a copy
    assert float(packed.buffer[67]) == 7.0 and float(packed.buffer[68]) == 0.0


def test_cupy_and_numpy_mixed_are_refused_before_writing(cupy):
    param = cupy.ones(5)
    with pytest.raises(TypeError, match="different devices"):
        optim.sgd(param, np.ones(5), step=1, lr=0.1)
    np.testing.assert_array_equal(cupy.asnumpy(param), np.ones(5))
