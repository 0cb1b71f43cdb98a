"""Device primitives the generated CPU kernels import (see steadystep/_primitives.py).

``exp_f32`` replaces the formula helper ``exp`` in float32 on the CPU. LLVM cannot vectorise
a loop that calls libm's ``expf``, so sigmoid, softplus and the softmax rows ran one
exponential at a time (0.87 ms for 1M float32 on two cores); this one is arithmetic the
compiler vectorises (0.17 ms). e^x = 2ⁿ·e^r with n = round(x/ln 2): r comes from a
two-part ln 2 (Cody–Waite) with its rounding error kept, e^r from Cephes's degree-6
polynomial, and 1 + r is split into head and tail so the result rounds once. Within
0.66 ulp of the exact value where the result is normal and 0.77 where it is subnormal
(every float32 checked once; libm's is within 0.51), so at most 1 float from the correctly
rounded result; in [−87, 88], 1.5% of results are that 1 float away. float64 keeps libm's exp.

``log1p_f32``/``log1p_f64`` replace the formula helper ``log1p`` on the CPU. glibc's
``log1pf`` takes ~3.5× as long as its ``logf`` (4.6 against 0.86 ms for 1M float32 on two
cores), and neither vectorises. float32 therefore computes log(1 + x) = e·ln 2 +
log(1 + f) with 1 + x = (1 + f)·2ᵉ itself: f − f²/2 + f³·P(f) (Cephes's degree-8 P), f = x
exactly where e = 0, and elsewhere the rounding of 1 + x carried to first order (Goldberg);
ln 2 in two parts, its high part added exactly. Within 0.89 ulp of the exact value, so at
most 1 float from the correctly rounded result, for every float32 above −1 (checked once).
softplus on 1M float32: 2.1 ms through logf, 0.57 now. float64 keeps libm's log1p, whose
bits the worked examples pin.
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


@njit(error_model="numpy", cache=True, forceinline=True)
def _two_sum_f32(a, b):
    """(a + b rounded, its rounding error): the two add up to a + b exactly (Knuth)."""
    total = a + b
    virtual = total - a
    return total, (a - (total - virtual)) + (b - virtual)


@intrinsic
def _fraction_and_exponent(typingctx, x):
    """(m, e) with x = m·2ᵉ and m in [√½, √2), for a positive normal float32 x, from its bits:
    adding 1 − √½'s bit pattern to x's carries the fractions at or above √2 into the next
    exponent, so that the exponent and fraction fields then give e and m − 1 + √½'s bits."""

    def codegen(context, builder, signature, arguments):
        int32 = ir.IntType(32)
        bits = builder.add(builder.bitcast(arguments[0], int32), ir.Constant(int32, 0x3F800000 - 0x3F3504F3))
        exponent = builder.sub(builder.ashr(bits, ir.Constant(int32, 23)), ir.Constant(int32, 127))
        fraction = builder.add(builder.and_(bits, ir.Constant(int32, 0x007FFFFF)), ir.Constant(int32, 0x3F3504F3))
        parts = [builder.bitcast(fraction, ir.FloatType()), builder.sitofp(exponent, ir.FloatType())]
        return context.make_tuple(builder, signature.return_type, parts)

    return types.UniTuple(types.float32, 2)(types.float32), codegen


@njit(error_model="numpy", cache=True, forceinline=True)
def log1p_f32(x):
    # selects, not early returns, so that a loop of it vectorises
    u = float32(1.0) + x
    m, e = _fraction_and_exponent(u)  # u = m·2ᵉ, m in [√½, √2)
    # log(1 + x) = e·ln 2 + log(1 + f), f = m − 1 (exact); with e = 0, f is x itself, exact
    # where u is not; otherwise the rounding of u is carried to first order (Goldberg)
    f = x if e == float32(0.0) else m - float32(1.0)
    correction = float32(0.0) if e == float32(0.0) else ((u - float32(1.0)) - x) / u
    z = f * f
    p = float32(7.0376836292e-2)
    p = p * f + float32(-1.1514610310e-1)
    p = p * f + float32(1.1676998740e-1)
    p = p * f + float32(-1.2420140846e-1)
    p = p * f + float32(1.4249322787e-1)
    p = p * f + float32(-1.6668057665e-1)
    p = p * f + float32(2.0000714765e-1)
    p = p * f + float32(-2.4999993993e-1)
    p = p * f + float32(3.3333331174e-1)
    tail = (f * z * p - float32(0.5) * z) + (e * float32(-2.12194440e-4) - correction)
    head, error = _two_sum_f32(e * float32(0.693359375), f)  # exact: ln 2's high part has 9 bits, |e| ≤ 128
    result = head + (error + tail)
    special = x if x > float32(0.0) else (float32(-math.inf) if x == float32(-1.0) else float32(math.nan))
    result = result if u > float32(0.0) and u < float32(math.inf) else special
    return x if u == float32(1.0) else result  # |x| < 2⁻²⁴ rounds to x (and −0 stays −0)


@njit(error_model="numpy", cache=True, forceinline=True)
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


@njit(error_model="numpy", cache=True, forceinline=True)
def exp_f32(x):
    # clamped where e^x is already 0 or inf in float32 (NaN, which compares false, is put back last)
    y = x if x > float32(-104.0) else float32(-104.0)
    y = y if y < float32(89.0) else float32(89.0)
    # n = round(y/ln 2): adding 1.5·2²³ rounds away the fraction
    n = (y * float32(1.4426950408889634) + float32(12582912.0)) - float32(12582912.0)
    reduced = y - n * float32(0.693145751953125)  # exact: ln 2's high part has 16 bits and |n| ≤ 150
    small = -n * float32(1.428606765330187e-06)  # ln 2's low part
    r, r_low = _two_sum_f32(reduced, small)
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


@njit(error_model="numpy", cache=True, forceinline=True)
def exp_f64(x):
    return math.exp(x)
