"""Device primitives the generated CUDA kernels import (plain Python under the simulator),
and the one helper kernel the launcher needs.

``math`` is Python's module on the GPU and an IEEE-faithful stand-in on the simulator.
``cospi_f32``/``cospi_f64`` replace the formula helper ``cospi`` on the GPU: libdevice's
cos(πx) reduces its argument exactly, where ``cosf`` falls back to float64 arithmetic for
large arguments (a float32 kernel must not do any).
"""

from typing import Any

from numba import config, cuda

# Threads per block of the row kernels (one block per row; a power of two for the tree
# merge). The simulator runs each thread in Python, so it gets fewer; rows longer than a
# block are still folded in strided pieces first.
ROW_THREADS = 32 if config.ENABLE_CUDASIM else 256


if config.ENABLE_CUDASIM:
    import math as _python_math
    from types import SimpleNamespace

    import numpy as np

    # The simulator runs kernels as Python, where math.exp(1000) raises OverflowError and
    # math.log(0) raises ValueError; the GPU returns inf/NaN, and so does NumPy.
    math: Any = SimpleNamespace(
        **{
            name: getattr(np, name)
            for name in ("exp", "expm1", "log", "log1p", "sqrt", "cos", "sin", "tanh", "fabs", "copysign")
        },
        **{name: getattr(_python_math, name) for name in ("pi", "e", "tau", "inf", "nan")},
    )

    from steadystep._primitives import code_buckets, codes_in_buckets
    from steadystep._half import BFLOAT16_BITS, FLOAT16_BITS, narrowed, random_bits, stochastic_bfloat16, widened

    _HALF = (BFLOAT16_BITS, FLOAT16_BITS)  # half storage as its bits: read as float32, rounded on writing

    def at(x, i):
        if not getattr(x, "ndim", 0):
            return x
        return widened(x[i], x.dtype)[()] if x.dtype in _HALF else x[i]

    def put(x, i, value):
        if getattr(x, "ndim", 0):
            x[i] = narrowed(value, x.dtype) if x.dtype in _HALF else value

    def put_rounded(x, i, value, key):
        if getattr(x, "ndim", 0) and x.dtype == BFLOAT16_BITS:
            x[i] = stochastic_bfloat16(value, i, int(key))[()]
        else:
            put(x, i, value)

    def cast_like(x, reference):
        if getattr(x, "ndim", 0):
            return x
        return np.float32(x) if reference.dtype in _HALF else reference.dtype.type(x)

    def cospi_f32(x):
        return np.cos(type(x)(np.pi) * (x % type(x)(2.0)))

    def uniform_f32(index, key, like):
        return type(like)(random_bits(np.uint64(index), int(key)) >> np.uint32(8)) * type(like)(2.0**-24)

    uniform_f64 = uniform_f32

    def floor_f32(x):
        return np.floor(x)

    floor_f64 = floor_f32

    def code_bucket_f32(y):
        return int(code_buckets(y)[()])

    code_bucket_f64 = code_bucket_f32

    def code_in_bucket_f32(y, entry):
        return int(codes_in_buckets(y, entry)[()])

    code_in_bucket_f64 = code_in_bucket_f32

    cospi_f64 = cospi_f32

else:
    import math as _device_math

    math = _device_math  # the generated kernels take ``math`` from here

    from numba.cuda import libdevice
    from numba.cuda.extending import intrinsic

    from steadystep._primitives import (
        at_typer,
        cast_like_typer,
        code_bucket_typer,
        code_in_bucket_typer,
        floor_typer,
        put_rounded_typer,
        put_typer,
        uniform_typer,
    )

    at = intrinsic(at_typer)
    cast_like = intrinsic(cast_like_typer)
    put = intrinsic(put_typer)
    put_rounded = intrinsic(put_rounded_typer)
    uniform_f32 = uniform_f64 = intrinsic(uniform_typer)
    floor_f32 = floor_f64 = intrinsic(floor_typer)
    code_bucket_f32 = code_bucket_f64 = intrinsic(code_bucket_typer)
    code_in_bucket_f32 = code_in_bucket_f64 = intrinsic(code_in_bucket_typer)
    cospi_f32 = libdevice.cospif
    cospi_f64 = libdevice.cospi


def device_function(function):
    """``cuda.jit(device=True)`` for the package's device functions: inlined by NVVM
    (``forceinline``), not in Numba's IR.

    IR inlining (``inline="always"``) types a callee again at every call site; a device
    function compiled once per signature and linked is inlined by NVVM all the same (the same
    registers), and making a kernel's PTX costs less (the CHANGELOG has the measurement). The
    simulator's ``cuda.jit`` takes no ``forceinline``.
    """
    if config.ENABLE_CUDASIM:
        return cuda.jit(device=True)(function)
    return cuda.jit(device=True, forceinline=True)(function)


# A formula's min and max (codegen renames them): Python's rule, ``a`` unless ``b`` compares
# below (above) it, so a NaN ``a`` comes through as on the CPU and the simulator. Numba's
# CUDA min/max of two floats are libdevice's fmin/fmax, which return the other operand.
@device_function
def python_min(a, b):
    return b if b < a else a


@device_function
def python_max(a, b):
    return b if b > a else a


def jit_kernel(function):
    """``cuda.jit`` for the package's kernels: cached, and linked from PTX rather than LTO-IR.

    nvJitLink optimises LTO-IR once more and contracts its multiplies and adds (its own
    ``-fma`` defaults on, beyond the ``-fma=0`` runtime.compile_without_contraction gives
    NVVM): an H200 then gave last-bit differences from the CPU. ``lto`` goes in with the
    function, since numba-cuda 0.30's ``cuda.jit(lto=False)(function)`` drops it.
    """
    if config.ENABLE_CUDASIM:  # the simulator takes no lto
        return cuda.jit(function, cache=True)
    return cuda.jit(function, cache=True, lto=False)


@jit_kernel
def broadcast_fill(out, value):
    """out[:] = value[0]: expands a size-1 GPU operand to the result's length."""
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = value[0]


@jit_kernel
def convert(out, x):
    """out[i] = x[i] as ``out`` stores it: half-precision bits read as float32, or float32
    rounded once to them (row formulas over half-precision rows on the GPU)."""
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        put(out, i, at(x, i))
