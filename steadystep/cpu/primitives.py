"""Device primitives the generated CPU kernels import (see steadystep/_primitives.py).

``exp_f32`` replaces the formula helper ``exp`` in float32 on the CPU. LLVM cannot vectorise
a loop that calls libm's ``expf``, so sigmoid, softplus and the softmax rows ran one
exponential at a time (0.87 ms for 1M float32 on two cores); this one is arithmetic the
compiler vectorises (0.17 ms). e^x = 2ⁿ·e^r with n = round(x/ln 2): r comes from a
two-part ln 2 (Cody–Waite) with its rounding error kept, e^r from Cephes's degree-6
polynomial, and 1 + r is split into head and tail so the result rounds once. Within
0.66 ulp of the correctly rounded result where that is normal and 0.77 where it is
subnormal (every float32 checked once; libm's is within 0.51); in [−87, 88], 1.5% of
results are an ulp away from the correctly rounded one. float64 keeps libm's exp.

``log1p_f32``/``log1p_f64`` replace the formula helper ``log1p`` on the CPU. glibc's
``log1pf`` takes ~3.5× as long as its ``logf`` (4.6 against 0.86 ms for 1M float32 on two
cores), and softplus, log_sigmoid and log_add_exp spend most of their time in it. float32
therefore takes log(u) − ((u − 1) − x)/u with u = 1 + x: the correction is the rounding of
1 + x, carried to first order (Goldberg). Within 1 ulp of the correctly rounded result for
every float32 in [0, 1] and on samples of (−1, 0) and (1, 3.4e38), as log1pf is. float64
keeps libm's log1p, whose bits the worked examples pin.
"""

import math

from llvmlite import ir
from numba import float32, njit, types
from numba.extending import intrinsic

from steadystep._primitives import at_typer, cast_like_typer, put_typer

at = intrinsic(at_typer)
cast_like = intrinsic(cast_like_typer)
put = intrinsic(put_typer)

# Independent states in a row kernel's pass (codegen._lane_fold_lines): four AVX-512
# registers of float32. 16 lanes measured 2.5x slower on a 1000-column max; 128 no faster.
LANES = 64


@njit(cache=True)
def lane_chunks(length):
    """The whole chunks of LANES columns a row kernel's lanes take: none in a row shorter than
    2·LANES, where merging the lanes would cost about what they save."""
    return length // LANES if length >= 2 * LANES else 0


@njit(error_model="numpy", cache=True)
def log1p_f32(x):
    u = float32(1.0) + x
    if u == float32(1.0):  # |x| < 2⁻²⁴: log1p(x) rounds to x itself (and −0 stays −0)
        return x
    correction = ((u - float32(1.0)) - x) / u
    if correction != correction:  # u = 0 (x = −1), ±inf or NaN: log(u) alone is the answer
        correction = float32(0.0)
    return math.log(u) - correction


@njit(error_model="numpy", cache=True)
def log1p_f64(x):
    return math.log1p(x)


@intrinsic
def _times_power_of_two(typingctx, value, exponent):
    """value·2ᵉ for a float32 value and an integer-valued float32 e in [−252, 254]: two exact
    scalings by 2^(e >> 1) and 2^(e − (e >> 1)), each built from its exponent bits, so that
    only the last product rounds (into the subnormals, or to ±inf)."""

    def codegen(context, builder, signature, arguments):
        value, exponent = arguments
        int32 = ir.IntType(32)
        whole = builder.fptosi(exponent, int32)
        half = builder.ashr(whole, ir.Constant(int32, 1))

        def power(k):
            biased = builder.add(k, ir.Constant(int32, 127))
            return builder.bitcast(builder.shl(biased, ir.Constant(int32, 23)), ir.FloatType())

        return builder.fmul(builder.fmul(value, power(half)), power(builder.sub(whole, half)))

    return types.float32(types.float32, types.float32), codegen


@njit(error_model="numpy", cache=True)
def exp_f32(x):
    # clamped where e^x is already 0 or inf in float32 (NaN, which compares false, is put back last)
    y = x if x > float32(-104.0) else float32(-104.0)
    y = y if y < float32(89.0) else float32(89.0)
    # n = round(y/ln 2): adding 1.5·2²³ rounds away the fraction
    n = (y * float32(1.4426950408889634) + float32(12582912.0)) - float32(12582912.0)
    reduced = y - n * float32(0.693145751953125)  # exact: ln 2's high part has 16 bits and |n| ≤ 150
    small = -n * float32(1.428606765330187e-06)  # ln 2's low part
    r = reduced + small
    virtual = r - reduced
    r_low = (reduced - (r - virtual)) + (small - virtual)  # r + r_low = reduced + small exactly
    p = float32(1.9875691500e-4)
    p = p * r + float32(1.3981999507e-3)
    p = p * r + float32(8.3334519073e-3)
    p = p * r + float32(4.1665795894e-2)
    p = p * r + float32(1.6666665459e-1)
    p = p * r + float32(5.0000001201e-1)
    head = float32(1.0) + r
    tail = (float32(1.0) - head) + r  # exact, as |r| < 1
    result = _times_power_of_two(head + (tail + (r * r * p + r_low * head)), n)
    return result if x == x else x


@njit(error_model="numpy", cache=True)
def exp_f64(x):
    return math.exp(x)
