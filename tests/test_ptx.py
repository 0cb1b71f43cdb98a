"""Every CUDA kernel compiles to PTX with the real compiler (no GPU needed).

The simulator runs kernels as Python and accepts code NVVM rejects; this does not.
A float32 kernel must contain no float64 instruction.
"""

import importlib
import inspect
import re

import pytest

from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="PTX needs the real CUDA compiler, not the simulator")

cuda = pytest.importorskip("numba.cuda") if not SIMULATOR else None
from numba import types  # noqa: E402

from steadystep.kernels import FORMULA_MODULES  # noqa: E402

F64 = re.compile(r"\b[a-z.]+\.f64\b")
COMPUTE_CAPABILITY = (9, 0)  # Hopper; PTX for it builds anywhere


def _kernels(ending):
    for module in FORMULA_MODULES:
        generated = importlib.import_module(f"steadystep.cuda.{module}")
        for name in sorted(vars(generated)):
            if name.endswith(ending):
                yield pytest.param(getattr(generated, name), id=f"{module}.{name}")


def _assert_float32_clean(kernel, ptx):
    if "_f32_" in kernel.py_func.__name__:
        assert not F64.findall(ptx), sorted(set(F64.findall(ptx)))


def _signature(kernel, scalar_mask):
    float_type = types.float32 if "_f32_" in kernel.py_func.__name__ else types.float64
    inputs = len(inspect.signature(kernel.py_func).parameters) - 1
    return (float_type[::1],) + tuple(float_type if scalar_mask >> k & 1 else float_type[::1] for k in range(inputs))


@pytest.mark.parametrize("kernel", list(_kernels("_kernel")))
def test_kernel_compiles_to_ptx_without_float64_in_float32(kernel):
    for scalar_mask in (0, 0b10101010):  # all arrays; alternating array/scalar
        ptx, _ = cuda.compile_ptx(kernel.py_func, _signature(kernel, scalar_mask), cc=COMPUTE_CAPABILITY)
        assert ".entry" in ptx
        _assert_float32_clean(kernel, ptx)


def _row_output_rank(kernel) -> int:
    name = re.sub(r"_f(32|64)_(short_)?rows$", "", kernel.py_func.__name__)
    for module in FORMULA_MODULES:
        for row in getattr(importlib.import_module(f"steadystep.kernels.{module}"), "ROWS", ()):
            if row.name == name:
                return 2 if row.value is not None or row.outputs > 1 else 1
    raise LookupError(name)


@pytest.mark.parametrize("kernel", list(_kernels("_rows")))
def test_row_kernel_compiles_to_ptx_without_float64_in_float32(kernel):
    float_type = types.float32 if "_f32_" in kernel.py_func.__name__ else types.float64
    out_type = float_type[:, ::1] if _row_output_rank(kernel) == 2 else float_type[::1]
    ptx, _ = cuda.compile_ptx(kernel.py_func, (out_type, float_type[:, ::1]), cc=COMPUTE_CAPABILITY)
    assert ".entry" in ptx
    # a block-wide reduction, or (short rows) one thread per row, each folding its own
    assert ("bar.sync" in ptx) != kernel.py_func.__name__.endswith("_short_rows")
    _assert_float32_clean(kernel, ptx)


def _step_declaration(kernel):
    name = kernel.py_func.__name__.rsplit("_", 2)[0]
    for module in FORMULA_MODULES:
        for step in getattr(importlib.import_module(f"steadystep.kernels.{module}"), "STEPS", ()):
            if step.name == name:
                return step
    raise LookupError(name)


@pytest.mark.parametrize("kernel", list(_kernels("_step")))
def test_step_kernel_compiles_to_ptx_without_float64_in_float32(kernel):
    step = _step_declaration(kernel)
    float_type = types.float32 if "_f32_" in kernel.py_func.__name__ else types.float64
    signature = []
    for name in inspect.signature(kernel.py_func).parameters:
        if name == "segment_ids":
            signature.append(types.int32[::1])
        elif name in step.buffers or name in step.indexed or name == "grad_scale":
            signature.append(float_type[::1])  # device-resident grad_scale: the AMP path
        else:
            signature.append(float_type)
    ptx, _ = cuda.compile_ptx(kernel.py_func, tuple(signature), cc=COMPUTE_CAPABILITY)
    assert ".entry" in ptx
    _assert_float32_clean(kernel, ptx)


@pytest.mark.parametrize("kernel", list(_kernels("_mix")))
def test_mixing_kernel_compiles_to_ptx_without_float64_in_float32(kernel):
    float_type = types.float32 if "_f32_" in kernel.py_func.__name__ else types.float64
    matrix, vector = float_type[:, ::1], float_type[::1]
    extra = {
        "peer": (types.int64[::1], float_type, float_type),
        "complete": (float_type, float_type, float_type),
        "dense": (matrix,),
    }[kernel.py_func.__name__.split("_")[0]]
    signature = (matrix,) * 4 + (vector, vector) + extra + (types.boolean,) + (float_type,) * 7
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=COMPUTE_CAPABILITY)
    assert ".entry" in ptx
    _assert_float32_clean(kernel, ptx)
    # in place: each thread mixes from its own column's scratch in shared memory, with no barrier
    assert "ld.shared" in ptx and "st.shared" in ptx and "bar.sync" not in ptx


def _grid_type(name, float_type):
    """Argument types of the model grid kernels, by parameter name (workspaces are 3-D)."""
    if name in ("rows", "columns", "w1", "b1", "w2", "b2"):
        return types.int64
    if name in ("relu", "with_tangent"):
        return types.boolean
    if name == "labels":
        return types.int64[::1]
    if name == "valid":
        return float_type[::1]
    if name == "batch":
        return types.int64[:, ::1]
    if name in ("params", "tangent", "features", "losses", "correct", "result"):
        return float_type[:, ::1]
    return float_type[:, :, ::1]


@pytest.mark.parametrize("kernel", list(_kernels("_grid")))
def test_grid_kernel_compiles_to_ptx_without_float64_in_float32(kernel):
    float_type = types.float32 if "_f32_" in kernel.py_func.__name__ else types.float64
    signature = tuple(_grid_type(name, float_type) for name in inspect.signature(kernel.py_func).parameters)
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=COMPUTE_CAPABILITY)
    assert ".entry" in ptx
    _assert_float32_clean(kernel, ptx)


def test_sum_squares_compiles_for_both_dtypes_without_atomics():
    """Atomic adds would sum in whatever order blocks finish: norms would differ run to run."""
    from steadystep.cuda.reductions import chunk_sums, segment_sums

    index = types.int64[::1]
    for float_type in (types.float32, types.float64):
        vector = float_type[::1]
        for kernel, signature in ((chunk_sums, (vector, vector, vector, index, index, float_type, float_type)),
                                  (chunk_sums, (vector, vector, vector, index, index, vector, float_type)),  # a scale on the device
                                  (segment_sums, (vector, vector, index, float_type))):
            ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=COMPUTE_CAPABILITY)
            assert ".entry" in ptx and "atom." not in ptx and "red." not in ptx
            if float_type == types.float32:
                assert not F64.findall(ptx)


def test_float64_kernels_do_use_float64():
    """The f64 check above can fail: the same scan finds f64 in a float64 kernel."""
    generated = importlib.import_module("steadystep.cuda.gradient_descent")
    kernel = generated.adam_update_f64_kernel
    ptx, _ = cuda.compile_ptx(kernel.py_func, _signature(kernel, 0), cc=COMPUTE_CAPABILITY)
    assert F64.findall(ptx)


def test_broadcast_fill_compiles():
    from steadystep.cuda.primitives import broadcast_fill

    for float_type in (types.float32, types.float64):
        ptx, _ = cuda.compile_ptx(broadcast_fill.py_func, (float_type[::1], float_type[::1]), cc=COMPUTE_CAPABILITY)
        assert ".entry" in ptx
