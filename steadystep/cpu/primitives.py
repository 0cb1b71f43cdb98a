"""Device primitives the generated CPU kernels import (see steadystep/_primitives.py).

``exp_f32``/``exp_f64`` replace the formula helper ``exp`` on the CPU, and ``exp_with_tail_f32``/
``exp_with_tail_f64`` its ``exp_with_tail``, e^(x + tail) with the tail added to the reduced
argument's low part (exp is that with a tail of −0). LLVM cannot vectorise
a loop that calls libm's ``exp``, so sigmoid, softplus and the softmax rows ran one
exponential at a time; these are arithmetic the compiler vectorises (BENCHMARKS.md,
"Choices in the code", has sigmoid's times before and after). e^x = 2ⁿ·e^r with
n = round(x/ln 2): r comes from a two-part ln 2 (Cody–Waite) with its rounding error kept,
e^r − 1 − r from a polynomial (Cephes's degree 6 in float32, the Taylor series to r¹³ in
float64), and 1 + r is split into head and tail so the result rounds once. float32: within
0.66 ulp of the exact value where the result is normal and 0.77 where it is subnormal (every
float32 checked; libm's is within 0.51), so at most 1 float from the correctly rounded
result; in [−87, 88], 1.5% of results are that 1 float away. float64: within 0.62 ulp of the
exact value where the result is normal and 0.75 where it is subnormal (5M samples against
mpmath); in [−708, 709], 4.8% of results differ from glibc's by 1 float.

``log1p_f32``/``log1p_f64`` replace the formula helper ``log1p`` on the CPU: glibc's
``log1p`` is slower still than its ``exp`` and does not vectorise either. Both compute
log(1 + x) = e·ln 2 + log(1 + f) with 1 + x = (1 + f)·2ᵉ themselves: f = x exactly where
e = 0, and elsewhere the rounding of 1 + x carried to first order (Goldberg); ln 2 in two
parts, its high part added exactly. float32 takes log(1 + f) as f − f²/2 + f³·P(f) (Cephes's
degree-8 P) and is within 0.88 ulp of the exact value, so at most 1 float from the correctly
rounded result, for every float32 above −1 (checked); float64 takes the series of
2·atanh(f/(2 + f)) and is within 0.91 ulp in 5M samples against mpmath (0.89 with fused
multiply-adds); softplus's times before and after are in BENCHMARKS.md.

All four let LLVM fuse a multiplication and an addition (``fastmath={"contract"}``; nothing that
assumes finite values), which halves their polynomials' instructions; the bounds above were measured
with it. ``_two_sum`` has no such flag: its error term needs the sum rounded on its own.
"""

import functools
import math

import numpy as np
from llvmlite import binding, ir
from numba import float32, njit, types
from numba.core import cgutils, config
from numba.core.compiler import Compiler
from numba.core.typing import signature
from numba.extending import intrinsic, overload
from numba.np.arrayobj import make_array, populate_array

from steadystep._primitives import (
    MIRRORED,
    PIECES,
    POSITIVE,
    at_typer,
    bucket_of_bits,
    cast_like_typer,
    code_bucket_typer,
    code_buckets,
    code_in_bucket_typer,
    code_of_entry,
    codes_in_buckets,
    constant_of,
    cpu_features,
    floor_typer,
    larger_magnitude_typer,
    largest_typer,
    put_rounded_typer,
    put_typer,
    random_bits,
    uniform_of_bits,
    uniform_typer,
)

at = intrinsic(at_typer)
cast_like = intrinsic(cast_like_typer)
put = intrinsic(put_typer)
put_rounded = intrinsic(put_rounded_typer)
uniform_f32 = uniform_f64 = intrinsic(uniform_typer)  # the formula helper uniform: the same bits everywhere
floor_f32 = floor_f64 = intrinsic(floor_typer)
code_bucket_f32 = code_bucket_f64 = intrinsic(code_bucket_typer)  # an 8-bit state's code lookup
code_in_bucket_f32 = code_in_bucket_f64 = intrinsic(code_in_bucket_typer)
largest_f32 = largest_f64 = intrinsic(largest_typer)  # a running maximum that vectorises
larger_magnitude_f32 = larger_magnitude_f64 = intrinsic(larger_magnitude_typer)  # of magnitudes: one instruction

# Independent states in a row kernel's pass (codegen._lane_fold_lines): four AVX-512
# registers of float32 (16 were slower on a 1000-column max, 128 no faster: BENCHMARKS.md).
LANES = 64


class DistinctBuffers(Compiler):
    """The pipeline of the optimizer steps' kernels (plain and with quantized states), whose
    arrays never share memory that the kernel writes (`_arrays.check_apart`): their pointers are
    marked ``noalias``, as Numba marks a parallel loop's body where it finds no aliasing, so
    LLVM vectorises without run-time overlap checks and keeps loaded values in registers
    (BENCHMARKS.md, "Choices in the code"). A buffer that is only read may be exactly a written
    one (``param`` as its own ``grad``): each element is loaded before its update is stored."""

    def __init__(self, typingctx, targetctx, library, args, return_type, flags, locals) -> None:
        flags = flags.copy()
        flags.noalias = True
        super().__init__(typingctx, targetctx, library, args, return_type, flags, locals)


@intrinsic
def unowned(typingctx, x):
    """An array argument without its owner (meminfo and parent null), a number as it is: the
    views a kernel's loop takes of it then count no references, which are atomic updates of one
    counter that the threads running a kernel's parts contend for (a model grid's items ran
    1.5–2.2× slower on one thread, slower still on two; BENCHMARKS.md). The caller holds the
    array for the whole call, and a kernel keeps nothing."""
    if not isinstance(x, types.Array):
        return signature(x, x), lambda context, builder, sig, args: args[0]

    def codegen(context, builder, sig, args):
        array = context.make_array(x)(context, builder, value=args[0])
        array.meminfo = cgutils.get_null_value(array.meminfo.type)
        array.parent = cgutils.get_null_value(array.parent.type)
        return array._getvalue()

    return signature(x, x), codegen


@njit(cache=True, forceinline=True)
def part_of(count, part, parts):
    """``(begin, end)``: part ``part`` of ``parts`` of ``range(count)``, the loop a kernel's call
    runs (cpu/parallel.py); the parts together are the range, in order."""
    return count * part // parts, count * (part + 1) // parts


@njit(cache=True)
def lane_chunks(length):
    """The whole chunks of LANES columns a row kernel's lanes take: none in a row shorter than
    2·LANES, where merging the lanes would cost about what they save."""
    return length // LANES if length >= 2 * LANES else 0


@intrinsic(prefer_literal=True)
def lane_array(typingctx, like, count):
    """``count`` (a constant) elements of ``like``'s type (a number) in the kernel's stack
    frame: a kernel's lane states. A heap array's stores were masked (a lane keeps its state)
    and every chunk reloaded them, which no CPU forwards from a masked store; on the stack,
    the compiler keeps the states in registers (BENCHMARKS.md, "Choices in the code"). The
    array must not outlive the kernel, as no array of a generated kernel does."""
    if not isinstance(like, (types.Float, types.Integer)) or not isinstance(count, types.IntegerLiteral):
        return None
    array_type = types.Array(like, 1, "C")
    length = count.literal_value

    def codegen(context, builder, sig, args):
        element = context.get_data_type(like)
        data = cgutils.alloca_once(builder, element, size=length)  # in the entry block: once a call
        array = make_array(array_type)(context, builder)
        size = context.get_constant(types.intp, context.get_abi_sizeof(element))
        shape = [context.get_constant(types.intp, length)]
        populate_array(array, data=data, shape=shape, strides=[size], itemsize=size, meminfo=None)
        return array._getvalue()

    return array_type(like, count), codegen


@njit(error_model="numpy", cache=True, forceinline=True)
def _two_sum(a, b):
    """(a + b rounded, its rounding error): the two add up to a + b exactly (Knuth)."""
    total = a + b
    virtual = total - a
    return total, (a - (total - virtual)) + (b - virtual)


@njit(error_model="numpy", cache=True, forceinline=True)
def _fast_two_sum(a, b):
    """``_two_sum`` in three operations where |a| ≥ |b| (Dekker). exp's reduced argument is
    below its low part only when both are tiny, where the error term's inexactness changes no
    result: every float32 gives the bits ``_two_sum`` gave (checked), and the largest error
    over every float32 with tails up to 1e-4 is unchanged."""
    total = a + b
    return total, b - (total - a)


@intrinsic
def _fraction_and_exponent(typingctx, x):
    """(m, e) with x = m·2ᵉ and m in [√½, √2), for a positive normal float x, from its bits:
    adding 1 − √½'s bit pattern to x's carries the fractions at or above √2 into the next
    exponent, so that the exponent and fraction fields then give e and m − 1 + √½'s bits."""
    if x == types.float64:
        width, fraction_bits, bias, one, root_half = 64, 52, 1023, 0x3FF0000000000000, 0x3FE6A09E667F3BCD
    else:
        width, fraction_bits, bias, one, root_half = 32, 23, 127, 0x3F800000, 0x3F3504F3

    def codegen(context, builder, signature, arguments):
        integer = ir.IntType(width)
        bits = builder.add(builder.bitcast(arguments[0], integer), ir.Constant(integer, one - root_half))
        exponent = builder.sub(builder.ashr(bits, ir.Constant(integer, fraction_bits)), ir.Constant(integer, bias))
        fraction_mask = ir.Constant(integer, (1 << fraction_bits) - 1)
        fraction = builder.add(builder.and_(bits, fraction_mask), ir.Constant(integer, root_half))
        float_type = arguments[0].type
        parts = [builder.bitcast(fraction, float_type), builder.sitofp(exponent, float_type)]
        return context.make_tuple(builder, signature.return_type, parts)

    return types.UniTuple(x, 2)(x), codegen


@njit(error_model="numpy", cache=True, forceinline=True, fastmath={"contract"})
def log1p_f32(x):
    # selects, not early returns, so that a loop of it vectorises
    u = float32(1.0) + x
    m, e = _fraction_and_exponent(u)  # u = m·2ᵉ, m in [√½, √2)
    # log(1 + x) = e·ln 2 + log(1 + f), f = m − 1 (exact); with e = 0, f is x itself, exact
    # where u is not; otherwise the rounding of u is carried to first order (Goldberg)
    # f = 0 where 1 + x rounds to 1 (the result is x, below) keeps f² out of the subnormals,
    # where each operation costs a microcode assist (softplus on logits in ±50 slowed by half)
    f = (x if u != float32(1.0) else float32(0.0)) if e == float32(0.0) else m - float32(1.0)
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
    head, error = _two_sum(e * float32(0.693359375), f)  # exact: ln 2's high part has 9 bits, |e| ≤ 128
    result = head + (error + tail)
    special = x if x > float32(0.0) else (float32(-math.inf) if x == float32(-1.0) else float32(math.nan))
    result = result if u > float32(0.0) and u < float32(math.inf) else special
    return x if u == float32(1.0) else result  # |x| < 2⁻²⁴ rounds to x (and −0 stays −0)


@njit(error_model="numpy", cache=True, forceinline=True, fastmath={"contract"})
def log1p_f64(x):
    # log1p_f32's steps in float64, with log(1 + f) = f − f²/2 + s·(f²/2 + R) for s = f/(2 + f),
    # R = Σ 2s²ᵏ/(2k + 1) to k = 11 (2·atanh(s) = 2s + s·R, and 2s = f − f²/2 + s·f²/2): |s| ≤ 0.172
    u = 1.0 + x
    m, e = _fraction_and_exponent(u)
    f = (x if u != 1.0 else 0.0) if e == 0.0 else m - 1.0
    correction = 0.0 if e == 0.0 else ((u - 1.0) - x) / u
    s = f / (2.0 + f)
    z = s * s
    r = 2.0 / 23.0
    r = r * z + 2.0 / 21.0
    r = r * z + 2.0 / 19.0
    r = r * z + 2.0 / 17.0
    r = r * z + 2.0 / 15.0
    r = r * z + 2.0 / 13.0
    r = r * z + 2.0 / 11.0
    r = r * z + 2.0 / 9.0
    r = r * z + 2.0 / 7.0
    r = r * z + 2.0 / 5.0
    r = r * z + 2.0 / 3.0
    half_square = 0.5 * f * f
    tail = (s * (half_square + r * z) - half_square) + (e * 1.9082149292705877e-10 - correction)
    head, error = _two_sum(e * 0.6931471803691238, f)  # exact: ln 2's high part has 32 bits, |e| ≤ 1024
    result = head + (error + tail)
    special = x if x > 0.0 else (-math.inf if x == -1.0 else math.nan)
    result = result if u > 0.0 and u < math.inf else special
    return x if u == 1.0 else result  # |x| < 2⁻⁵³ rounds to x (and −0 stays −0)


# x86's backend lowers ``llvm.ldexp`` on vectors to vscalefps/vscalefpd from LLVM 22 on, where
# AVX-512 has them; LLVM 20 calls libm's ldexpf for each element (21 not checked).
LDEXP_INSTRUCTION = binding.llvm_version_info >= (22,)


def times_power_of_two_typer(typingctx, value, exponent):
    """value·2ᵉ for a float value and an integer-valued e of the same type, e within twice the
    type's exponent range ([−252, 254] in float32, [−2044, 2046] in float64), rounded once
    (into the subnormals, or to ±inf): by ``llvm.ldexp`` where it becomes vscalefps (3
    instructions), else by two exact scalings by 2^(e >> 1) and 2^(e − (e >> 1)), each built
    from its exponent bits, so that only the last product rounds (9)."""
    width, fraction_bits, bias = (64, 52, 1023) if value == types.float64 else (32, 23, 127)

    def codegen(context, builder, signature, arguments):
        scaled, exponent = arguments
        if LDEXP_INSTRUCTION and "+avx512f" in cpu_features():
            i32 = ir.IntType(32)
            name = f"llvm.ldexp.{'f64' if width == 64 else 'f32'}.i32"
            ldexp = _declared(builder, name, scaled.type, scaled.type, i32)
            return builder.call(ldexp, [scaled, builder.fptosi(exponent, i32)])
        integer = ir.IntType(width)
        whole = builder.fptosi(exponent, integer)
        half = builder.ashr(whole, ir.Constant(integer, 1))

        def power(k):
            biased = builder.add(k, ir.Constant(integer, bias))
            return builder.bitcast(builder.shl(biased, ir.Constant(integer, fraction_bits)), scaled.type)

        return builder.fmul(builder.fmul(scaled, power(half)), power(builder.sub(whole, half)))

    return value(value, value), codegen


_times_power_of_two = intrinsic(times_power_of_two_typer)


@njit(error_model="numpy", cache=True, forceinline=True, fastmath={"contract"})
def exp_f32(x):
    return exp_with_tail_f32(x, float32(-0.0))  # x − 0 would not fold away; x − (−0) is x


@njit(error_model="numpy", cache=True, forceinline=True, fastmath={"contract"})
def exp_with_tail_f32(x, tail):
    # clamped where e^x is already 0 or inf in float32 (NaN, which compares false, is put back last)
    y = x if x > float32(-104.0) else float32(-104.0)
    y = y if y < float32(89.0) else float32(89.0)
    # n = round(y/ln 2): adding 1.5·2²³ rounds away the fraction
    n = (y * float32(1.4426950408889634) + float32(12582912.0)) - float32(12582912.0)
    reduced = y - n * float32(0.693145751953125)  # exact: ln 2's high part has 16 bits and |n| ≤ 150
    # ln 2's low part; the tail only where x is not clamped (a large x has a large tail, an
    # infinite or NaN one a NaN tail)
    small = (tail if y == x else float32(-0.0)) - n * float32(1.428606765330187e-06)
    r, r_low = _fast_two_sum(reduced, small)
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


@njit(error_model="numpy", cache=True, forceinline=True, fastmath={"contract"})
def exp_f64(x):
    return exp_with_tail_f64(x, -0.0)


@njit(error_model="numpy", cache=True, forceinline=True, fastmath={"contract"})
def exp_with_tail_f64(x, tail):
    # exp_with_tail_f32's steps in float64; the clamps are where e^x is 0 or inf in float64
    y = x if x > -746.0 else -746.0
    y = y if y < 710.0 else 710.0
    n = (y * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0  # 1.5·2⁵² rounds away the fraction
    reduced = y - n * 0.6931471803691238  # exact: ln 2's high part has 32 bits and |n| ≤ 1077
    small = (tail if y == x else -0.0) - n * 1.9082149292705877e-10  # ln 2's low part
    r, r_low = _fast_two_sum(reduced, small)
    # e^r − 1 − r = r²·Σ rᵏ/(k + 2)! to k = 11: the next term is below 5e-18 for |r| ≤ ln 2/2
    p = 1.6059043836821613e-10
    p = p * r + 2.08767569878681e-09
    p = p * r + 2.505210838544172e-08
    p = p * r + 2.755731922398589e-07
    p = p * r + 2.7557319223985893e-06
    p = p * r + 2.48015873015873e-05
    p = p * r + 1.984126984126984e-04
    p = p * r + 1.388888888888889e-03
    p = p * r + 8.333333333333333e-03
    p = p * r + 4.1666666666666664e-02
    p = p * r + 1.6666666666666666e-01
    p = p * r + 0.5
    head = 1.0 + r
    tail = (1.0 - head) + r  # exact, as |r| < 1
    result = _times_power_of_two(head + (tail + (r * r * p + r_low * head)), n)
    return result if x == x else x


# Rows shorter than two chunks of LANES are taken LANES at a time, transposed so that one
# vector step takes a column of them (codegen._cpu_row_kernel). Element by element, the two
# transposes took about as long as softmax's three passes; a tile of TILE × TILE goes
# through registers instead: TILE row loads, log₂ TILE rounds of shuffles, TILE stores.
TILE = 16


@intrinsic
def _transpose_tile(typingctx, target, target_row, target_column, source, source_row, source_column):
    """target[target_row + c, target_column + r] = source[source_row + r, source_column + c]
    for r, c < TILE, both arrays' rows contiguous. Round d (8, 4, 2, 1) swaps the blocks
    where bit d of the row and of the column differ: after all four, every element has
    exchanged its row and column."""
    if not (isinstance(target, types.Array) and target.ndim == 2 and target.dtype == getattr(source, "dtype", None)):
        return None
    if target.dtype not in (types.float32, types.float64):
        return None
    index = types.intp

    def codegen(context, builder, sig, args):
        element = context.get_value_type(sig.args[0].dtype)
        vector = ir.VectorType(element, TILE)
        align = context.get_abi_sizeof(element)
        arrays = [context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 3)]

        def row_pointer(which, row, column, r):
            array = arrays[which]
            stride = builder.extract_value(array.strides, 0)
            offset = builder.add(
                builder.mul(builder.add(row, ir.Constant(row.type, r)), stride),
                builder.mul(column, ir.Constant(column.type, align)),
            )
            byte = builder.bitcast(array.data, ir.IntType(8).as_pointer())
            return builder.bitcast(builder.gep(byte, [offset]), vector.as_pointer())

        rows = [builder.load(row_pointer(1, args[4], args[5], r), align=align) for r in range(TILE)]
        d = TILE // 2
        while d:
            low = [c if not c & d else TILE + c - d for c in range(TILE)]
            high = [c + d if not c & d else TILE + c for c in range(TILE)]
            for i in [i for i in range(TILE) if not i & d]:
                a, b = rows[i], rows[i + d]
                rows[i] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), TILE), low))
                rows[i + d] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), TILE), high))
            d //= 2
        for c in range(TILE):
            builder.store(rows[c], row_pointer(0, args[1], args[2], c), align=align)
        return context.get_dummy_value()

    return signature(types.void, target, index, index, source, index, index), codegen


@njit(error_model="numpy", cache=True)
def copy_transposed(target, target_row, source, source_row, rows, columns):
    """target[target_row + c, r] = source[source_row + r, c] for r < rows, c < columns: whole
    tiles through registers where both arrays' rows are contiguous, the edges one by one."""
    whole_rows, whole_columns = rows - rows % TILE, columns - columns % TILE
    if source.strides[1] != source.itemsize or target.strides[1] != target.itemsize:
        whole_rows = whole_columns = 0
    for r in range(0, whole_rows, TILE):
        for c in range(0, whole_columns, TILE):
            _transpose_tile(target, target_row + c, r, source, source_row + r, c)
    for r in range(rows):
        for c in range(whole_columns if r < whole_rows else 0, columns):
            target[target_row + c, r] = source[source_row + r, c]


# AVX-512 VBMI's byte permutes (Ice Lake and Zen 4 onward): a 256-entry map looked up for 64
# codes at once, in registers, where a gather fetches 16 values from memory one by one
# (BENCHMARKS.md has the 8-bit step's times with each). Read as Numba reads the CPU it
# compiles for; its cache is keyed by that CPU, so a kernel never runs where it was not built.
_FEATURES = (
    config.CPU_FEATURES if config.CPU_FEATURES is not None else binding.get_host_cpu_features().flatten()
).split(",")
BYTE_PERMUTES = "+avx512vbmi" in _FEATURES
FLOAT_PERMUTES = "+avx512f" in _FEATURES  # a 16-entry map, permuted for 16 codes at once (4-bit states)
_BYTES = ir.VectorType(ir.IntType(8), 64)


@intrinsic
def _float_bits(typingctx, x):
    """A float32's bits as an int32."""
    if x != types.float32:
        return None
    return signature(types.int32, x), lambda context, builder, sig, args: builder.bitcast(args[0], ir.IntType(32))


@njit(error_model="numpy", cache=True)
def byte_planes(qmap):
    """A 256-entry float32 map as four planes of its bytes (plane b holds byte b, least
    significant first, of every entry): what ``dequantize_block`` permutes."""
    planes = np.empty(4 * 256, np.uint8)
    for k in range(256):
        bits = _float_bits(qmap[k])
        for b in range(4):
            planes[b * 256 + k] = np.uint8((bits >> (8 * b)) & 255)
    return planes


def _splat(builder, value: ir.Value, lanes: int) -> ir.Value:
    """A vector of ``lanes`` copies of the scalar ``value``."""
    vector = ir.VectorType(value.type, lanes)
    one = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(
        one, ir.Constant(vector, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
    )


def _store_scaled(builder, vector, values_data, offset, scale) -> None:
    """values[offset:offset + n] = the n floats of ``vector`` times ``scale`` (one multiply each)."""
    target = builder.bitcast(builder.gep(values_data, [offset], inbounds=True), vector.type.as_pointer())
    builder.store(builder.fmul(vector, _splat(builder, scale, vector.type.count)), target, align=4)


@intrinsic
def _dequantize64(typingctx, values, offset, codes, start, planes, scale):
    """values[offset + k] = map[codes[start + k]]·scale for k < 64, the map given as its
    ``byte_planes``: each plane's byte by two permutes over its halves (a code's top bit
    chooses between them), the four bytes put together as the float, then one multiply."""
    if scale != types.float32 or values.dtype != types.float32 or codes.dtype != types.uint8:
        return None

    def codegen(context, builder, sig, args):
        values_data, codes_data, planes_data = (
            context.make_array(sig.args[i])(context, builder, args[i]).data for i in (0, 2, 4)
        )

        def load(data, index):
            pointer = builder.bitcast(builder.gep(data, [index], inbounds=True), _BYTES.as_pointer())
            return builder.load(pointer, align=1)

        permute = _declared(builder, "llvm.x86.avx512.vpermi2var.qi.512", _BYTES, _BYTES, _BYTES, _BYTES)
        index = load(codes_data, args[3])
        upper = builder.icmp_signed("<", index, ir.Constant(_BYTES, None))  # codes 128 to 255
        planes = []
        for b in range(4):
            quarters = [load(planes_data, ir.Constant(ir.IntType(64), b * 256 + 64 * q)) for q in range(4)]
            lower_half = builder.call(permute, [quarters[0], index, quarters[1]])
            upper_half = builder.call(permute, [quarters[2], index, quarters[3]])
            planes.append(builder.select(upper, upper_half, lower_half))

        def interleaved(first: ir.Value, second: ir.Value) -> ir.Value:  # first[0], second[0], first[1], ...
            count = first.type.count
            order = ir.Constant(
                ir.VectorType(ir.IntType(32), 2 * count), [k // 2 + count * (k % 2) for k in range(2 * count)]
            )
            return builder.shuffle_vector(first, second, order)

        # each value's four bytes side by side, least significant first: its float32 bits
        halves = ir.VectorType(ir.IntType(16), 64)
        low, high = (builder.bitcast(interleaved(planes[b], planes[b + 1]), halves) for b in (0, 2))
        word = builder.bitcast(interleaved(low, high), ir.VectorType(ir.FloatType(), 64))
        _store_scaled(builder, word, values_data, args[1], args[5])
        return context.get_dummy_value()

    return signature(types.void, values, offset, codes, start, planes, scale), codegen


def dequantize_block(values, codes, start, count, qmap, planes, scale):
    """values[k] = qmap[codes[start + k]]·scale for k < count: a block of 8-bit codes read as
    float32 (``planes``: ``byte_planes(qmap)``). 64 codes at a time by byte permutes where the
    CPU has them and the arrays are contiguous; otherwise, and for the rest, a load each."""
    for k in range(count):
        values[k] = qmap[codes[start + k]] * scale


@overload(dequantize_block, jit_options={"error_model": "numpy", "forceinline": True})
def _dequantize_block(values, codes, start, count, qmap, planes, scale):
    permutes = BYTE_PERMUTES and all(array.layout == "C" for array in (values, codes, planes))

    def dequantize(values, codes, start, count, qmap, planes, scale):
        done = 0
        if permutes:
            while done + 64 <= count:
                _dequantize64(values, done, codes, start + done, planes, scale)
                done += 64
        for k in range(done, count):
            values[k] = qmap[at(codes, start + k)] * scale

    return dequantize


# An 8-bit block's codes, 16 at a time: the division, codes and (for stochastic rounding) the
# random numbers as vectors. With AVX-512 a code comes from the map's linear pieces held in
# registers (``_piece_codes``); otherwise, and for a vector with a value near a midpoint, from
# its bucket's entry, each read by a scalar load (LLVM makes the plain loops' table reads
# gather instructions, which take about twice as long on the Zen 5 machine of BENCHMARKS.md).
# The elements past the last 16, and blocks of arrays that are not contiguous, are the
# caller's: the generated kernels run the formulas (``nearest_code``, ``rounded_code``) on them.
CODE_LANES = 16


def _declared(builder, name: str, result: ir.Type, *operands: ir.Type) -> ir.Function:
    """The LLVM intrinsic ``name`` taking ``operands`` and giving ``result``, declared in the
    module ``builder`` builds."""
    return builder.module.declare_intrinsic(name, fnty=ir.FunctionType(result, list(operands)))


def _lane_loads(builder, data, indices: ir.Value) -> ir.Value:
    """data[indices[k]] for each lane k of the int32 vector ``indices`` (each ≥ 0), as a vector."""
    i32 = ir.IntType(32)
    loaded = ir.Constant(ir.VectorType(data.type.pointee, indices.type.count), ir.Undefined)
    for lane in range(indices.type.count):
        index = builder.zext(builder.extract_element(indices, ir.Constant(i32, lane)), ir.IntType(64))
        element = builder.load(builder.gep(data, [index], inbounds=True))
        loaded = builder.insert_element(loaded, element, ir.Constant(i32, lane))
    return loaded


def _array_data(context, builder, sig, args, position: int) -> ir.Value:
    return context.make_array(sig.args[position])(context, builder, args[position]).data


def _draws(builder, first_index: ir.Value, stride: ir.Value, key: ir.Value, elements: list[int]) -> tuple:
    """The random numbers' positions (first_index + element·stride, a vector of int64) and key."""
    i64 = ir.IntType(64)
    lanes = len(elements)
    steps = builder.mul(_splat(builder, stride, lanes), ir.Constant(ir.VectorType(i64, lanes), elements))
    return builder.add(_splat(builder, first_index, lanes), steps), _splat(builder, key, lanes)


def _rounded_codes(builder, y: ir.Value, nearest: ir.Value, entries, size: int, draws: tuple) -> ir.Value:
    """``rounded_code`` in each lane: of the map's two entries around y, the upper with
    probability (y − below)/(above − below). ``nearest``: y's nearest codes; ``entries(i)``:
    the map's values at lane indices i (a map of ``size``); ``draws``: from ``_draws``."""
    words = nearest.type
    constant = functools.partial(constant_of, words)
    past = builder.fcmp_ordered("<=", entries(nearest), y)
    lower = builder.sub(nearest, builder.select(past, constant(0), constant(1)))
    lower = builder.select(builder.icmp_signed("<", lower, constant(0)), constant(0), lower)
    last = constant(size - 2)  # the next-to-last entry: ``lower + 1`` is in the map
    lower = builder.select(builder.icmp_signed(">", lower, last), last, lower)
    below = entries(lower)
    fraction = builder.fdiv(builder.fsub(y, below), builder.fsub(entries(builder.add(lower, constant(1))), below))
    number = uniform_of_bits(builder, random_bits(builder, *draws), ir.FloatType())
    return builder.add(lower, builder.zext(builder.fcmp_ordered("<", number, fraction), words))


def _bucket_codes(builder, bits: ir.Value, lookup_data) -> ir.Value:
    """``nearest_code`` of each lane of a float32 vector given as its ``bits``, from its
    bucket's entry in the lookup, each entry read by a scalar load."""
    return code_of_entry(builder, bits, _lane_loads(builder, lookup_data, bucket_of_bits(builder, bits)))


def _piece_codes(builder, bits: ir.Value, lookup_data) -> ir.Value:
    """``nearest_code`` of each lane of a vector of CODE_LANES float32 given as its ``bits``
    from the map's linear pieces, which the lookup holds after its buckets (``_primitives.PIECES``),
    in registers: a lane's piece by its binade and one comparison, then its code by one fused
    multiply-add. Where a lane is not certain (within the band of a midpoint, a negative value
    for a map from 0, a map without pieces), the vector takes the buckets instead."""
    i32, lanes = ir.IntType(32), CODE_LANES
    floats, words = ir.VectorType(ir.FloatType(), lanes), ir.VectorType(i32, lanes)
    constant = functools.partial(constant_of, words)
    pieces = builder.gep(lookup_data, [ir.Constant(i32, PIECES.at)], inbounds=True)

    def table(at: int, kind: ir.Type = words) -> ir.Value:
        # never written while a kernel runs: the compiler may load it once for a block
        pointer = builder.bitcast(builder.gep(pieces, [ir.Constant(i32, at)]), kind.as_pointer())
        loaded = builder.load(pointer, align=4)
        loaded.set_metadata("invariant.load", builder.module.add_metadata([]))
        return loaded

    permute_words = _declared(builder, "llvm.x86.avx512.permvar.si.512", words, words, words)
    permute_floats = _declared(builder, "llvm.x86.avx512.permvar.sf.512", floats, floats, words)
    kind = table(PIECES.kind, i32)
    mirrored = builder.icmp_signed("==", kind, ir.Constant(i32, MIRRORED))
    negative = builder.icmp_signed("<", bits, constant(0))
    magnitude = builder.and_(bits, constant(0x7FFFFFFF))
    a = builder.bitcast(magnitude, floats)
    # the binade's index: its biased exponent less the first's, 0 below it (a saturating
    # subtraction of 16-bit halves: the upper half of an exponent is 0), the last above it
    halves = ir.VectorType(ir.IntType(16), 2 * lanes)
    lowest = ir.Constant(halves, [PIECES.lowest_exponent, 0] * lanes)
    exponent = builder.bitcast(builder.lshr(magnitude, constant(23)), halves)
    binade = builder.call(_declared(builder, "llvm.usub.sat.v32i16", halves, halves, halves), [exponent, lowest])
    binade = builder.bitcast(binade, words)
    binade = builder.select(
        builder.icmp_signed(">", binade, constant(PIECES.binades - 1)), constant(PIECES.binades - 1), binade
    )
    two_tables = _declared(builder, "llvm.x86.avx512.vpermi2var.d.512", words, words, words, words)
    below = builder.call(two_tables, [table(PIECES.binade), binade, table(PIECES.binade + lanes)])
    threshold = builder.call(permute_floats, [table(PIECES.threshold, floats), below])
    piece = builder.add(below, builder.zext(builder.fcmp_ordered("<", threshold, a), words))
    slope, intercept = (
        builder.call(permute_floats, [table(at, floats), piece]) for at in (PIECES.slope, PIECES.intercept)
    )
    offset, last = (builder.call(permute_words, [table(at), piece]) for at in (PIECES.offset, PIECES.last))
    fma = _declared(builder, "llvm.fma.v16f32", floats, floats, floats, floats)
    t = builder.call(fma, [a, slope, intercept])
    nearest_whole = builder.call(_declared(builder, "llvm.roundeven.v16f32", floats, floats), [t])
    off = builder.call(_declared(builder, "llvm.fabs.v16f32", floats, floats), [builder.fsub(t, nearest_whole)])
    certain = builder.fcmp_ordered(">=", off, constant_of(floats, PIECES.band))  # NaN: not certain
    # not certain either: a negative value of a map from 0, and a negative value of a mirrored
    # map on a threshold, which ties to the larger magnitude (the piece above)
    larger = builder.and_(negative, _splat(builder, mirrored, lanes))
    positive = builder.icmp_signed("==", kind, ir.Constant(i32, POSITIVE))
    doubtful = builder.and_(negative, _splat(builder, positive, lanes))
    doubtful = builder.or_(doubtful, builder.and_(larger, builder.fcmp_ordered("==", threshold, a)))
    certain = builder.and_(certain, builder.not_(doubtful))
    whole = builder.fptosi(t, words)  # toward 0: floor(t) where t ≥ 0, and 0 (as clamped) above −1
    whole = builder.select(builder.icmp_signed("<", whole, constant(0)), constant(0), whole)
    whole = builder.select(builder.icmp_signed(">", whole, last), last, whole)
    code = builder.add(offset, whole)
    mirror = _splat(builder, table(PIECES.mirror, i32), lanes)
    reflected = builder.sub(mirror, code)
    reflected = builder.select(builder.icmp_signed("<", reflected, constant(0)), constant(0), reflected)
    code = builder.select(larger, reflected, code)
    every = builder.icmp_unsigned("==", builder.bitcast(certain, ir.IntType(lanes)), ir.Constant(ir.IntType(lanes), -1))
    start = builder.block
    by_buckets, coded = builder.append_basic_block("by_buckets"), builder.append_basic_block("coded")
    builder.cbranch(every, coded, by_buckets).set_weights([1000, 1])
    builder.position_at_end(by_buckets)
    exact = _bucket_codes(builder, bits, lookup_data)
    builder.branch(coded)
    builder.position_at_end(coded)
    result = builder.phi(words)
    result.add_incoming(code, start)
    result.add_incoming(exact, by_buckets)
    return result


def _codes16(context, builder, sig, args, rounded: bool) -> None:
    """codes[start + k] for k < CODE_LANES from values[offset + k]/scale (0 where scale is not
    above 0): ``nearest_code``, or where ``rounded`` ``rounded_code`` with element k's random
    number drawn at first_index + k·stride. The arguments: codes, start, values, offset,
    scale, lookup, then (rounded) qmap, first_index, stride, key."""
    codes_data, values_data, lookup_data = (_array_data(context, builder, sig, args, i) for i in (0, 2, 5))
    i32, lanes = ir.IntType(32), CODE_LANES
    floats, words = ir.VectorType(ir.FloatType(), lanes), ir.VectorType(i32, lanes)
    pointer = builder.bitcast(builder.gep(values_data, [args[3]], inbounds=True), floats.as_pointer())
    value = builder.load(pointer, align=4)
    above = builder.fcmp_ordered(">", args[4], ir.Constant(ir.FloatType(), 0.0))
    y = builder.select(above, builder.fdiv(value, _splat(builder, args[4], lanes)), ir.Constant(floats, [0.0] * lanes))
    bits = builder.bitcast(y, words)
    code = (_piece_codes if FLOAT_PERMUTES else _bucket_codes)(builder, bits, lookup_data)
    if rounded:
        qmap_data = _array_data(context, builder, sig, args, 6)
        draws = _draws(builder, args[7], args[8], args[9], list(range(lanes)))
        code = _rounded_codes(builder, y, code, functools.partial(_lane_loads, builder, qmap_data), 256, draws)
    stored = builder.trunc(code, ir.VectorType(ir.IntType(8), lanes))
    target = builder.gep(codes_data, [args[1]], inbounds=True)
    builder.store(stored, builder.bitcast(target, stored.type.as_pointer()), align=1)


def _rounded_codegen(body):
    """The codegen of a stochastic block intrinsic: ``body`` (rounded) with its last three
    arguments (first_index, stride, key) as int64."""

    def codegen(context, builder, sig, args):
        leading, index = len(args) - 3, types.int64
        draws = [context.cast(builder, args[i], sig.args[i], index) for i in range(leading, len(args))]
        widened = signature(sig.return_type, *sig.args[:leading], index, index, index)
        body(context, builder, widened, [*args[:leading], *draws], rounded=True)
        return context.get_dummy_value()

    return codegen


def _code_arrays(codes, values, lookup) -> bool:
    return codes.dtype == types.uint8 and values.dtype == types.float32 and lookup.dtype == types.int32


@intrinsic
def _nearest16(typingctx, codes, start, values, offset, scale, lookup):
    if scale != types.float32 or not _code_arrays(codes, values, lookup):
        return None

    def codegen(context, builder, sig, args):
        _codes16(context, builder, sig, args, rounded=False)
        return context.get_dummy_value()

    return signature(types.void, codes, start, values, offset, scale, lookup), codegen


@intrinsic
def _rounded16(typingctx, codes, start, values, offset, scale, lookup, qmap, first_index, stride, key):
    if scale != types.float32 or not _code_arrays(codes, values, lookup) or qmap.dtype != types.float32:
        return None
    arguments = (codes, start, values, offset, scale, lookup, qmap, first_index, stride, key)
    return signature(types.void, *arguments), _rounded_codegen(_codes16)


def quantize_block(codes, start, values, count, scale, lookup):
    """codes[start + k] = the code nearest values[k]/scale (0 in a block of zeros, whose scale
    is 0) for the first k that fill groups of CODE_LANES, where the arrays are contiguous:
    ``nearest_code`` of each, ``lookup`` the map's bucket entries. Returns how many it wrote;
    the rest is the caller's."""
    done = count // CODE_LANES * CODE_LANES
    scaled = values[:done] / scale if scale > 0 else np.zeros(done, np.float32)
    codes[start : start + done] = codes_in_buckets(scaled, lookup[code_buckets(scaled)])
    return done


@overload(quantize_block, jit_options={"error_model": "numpy", "forceinline": True})
def _quantize_block(codes, start, values, count, scale, lookup):
    vectors = all(array.layout == "C" for array in (codes, values, lookup))

    def quantize(codes, start, values, count, scale, lookup):
        done = 0
        if vectors:
            while done + CODE_LANES <= count:
                _nearest16(codes, start + done, values, done, scale, lookup)
                done += CODE_LANES
        return done

    return quantize


def quantize_block_rounded(codes, start, values, count, scale, lookup, qmap, first_index, stride, key):
    """``quantize_block`` with stochastic rounding: ``rounded_code`` of each, element k's random
    number drawn at first_index + k·stride under ``key``. A map of 256 entries only. Compiled
    code only (the kernels call it; the formula is its plain reading)."""
    raise NotImplementedError("quantize_block_rounded runs in compiled code; call it from an @njit function")


@overload(quantize_block_rounded, jit_options={"error_model": "numpy", "forceinline": True})
def _quantize_block_rounded(codes, start, values, count, scale, lookup, qmap, first_index, stride, key):
    vectors = all(array.layout == "C" for array in (codes, values, lookup, qmap))

    def quantize(codes, start, values, count, scale, lookup, qmap, first_index, stride, key):
        done = 0
        if vectors and qmap.shape[0] == 256:
            while done + CODE_LANES <= count:
                _rounded16(
                    codes, start + done, values, done, scale, lookup, qmap, first_index + done * stride, stride, key
                )
                done += CODE_LANES
        return done

    return quantize


def _nibbles32(context, builder, sig, args, rounded: bool) -> None:
    """codes[base + k] = (code of values[offset + 2k]) << 4 | code of values[offset + 2k + 1]
    for k < 16: ``nearest_code16``, the count of a 4-bit map's midpoints below the value by a
    binary search of four steps over its 16 midpoints (15 and +inf) held in one register; or
    where ``rounded`` ``rounded_code``, the map in a register too, element i's random number
    drawn at first_index + i·stride. The arguments: codes, base, values, offset, midpoints,
    then (rounded) qmap, first_index, stride, key."""
    codes_data, values_data = (_array_data(context, builder, sig, args, i) for i in (0, 2))
    i32, lanes = ir.IntType(32), CODE_LANES
    floats, words = ir.VectorType(ir.FloatType(), lanes), ir.VectorType(i32, lanes)
    pointer = builder.bitcast(builder.gep(values_data, [args[3]], inbounds=True), floats.as_pointer())
    first = builder.load(pointer, align=4)
    second = builder.load(builder.gep(pointer, [ir.Constant(i32, 1)]), align=4)
    permute = _declared(builder, "llvm.x86.avx512.permvar.sf.512", floats, floats, words)

    def table(index: int) -> ir.Value:  # a 16-entry float32 array as one register
        data = _array_data(context, builder, sig, args, index)
        return builder.load(builder.bitcast(data, floats.as_pointer()), align=4)

    midpoints = table(4)
    qmap = table(5) if rounded else None
    constant = functools.partial(constant_of, words)

    def code(y: ir.Value, parity: int) -> ir.Value:
        found = constant(0)  # how many of the sorted midpoints lie below y
        for step in (8, 4, 2, 1):
            probe = builder.call(permute, [midpoints, builder.add(found, constant(step - 1))])
            found = builder.or_(found, builder.select(builder.fcmp_ordered("<", probe, y), constant(step), constant(0)))
        if not rounded:
            return found
        draws = _draws(builder, args[6], args[7], args[8], [2 * k + parity for k in range(lanes)])
        return _rounded_codes(builder, y, found, lambda indices: builder.call(permute, [qmap, indices]), 16, draws)

    order = lambda parity: ir.Constant(words, [2 * k + parity for k in range(lanes)])  # noqa: E731
    high = code(builder.shuffle_vector(first, second, order(0)), 0)
    low = code(builder.shuffle_vector(first, second, order(1)), 1)
    byte = builder.trunc(builder.or_(builder.shl(high, constant(4)), low), ir.VectorType(ir.IntType(8), lanes))
    target = builder.gep(codes_data, [args[1]], inbounds=True)
    builder.store(byte, builder.bitcast(target, byte.type.as_pointer()), align=1)


def _nibble_arrays(codes, values, *maps) -> bool:
    return codes.dtype == types.uint8 and all(array.dtype == types.float32 for array in (values, *maps))


@intrinsic
def _nearest32_nibbles(typingctx, codes, base, values, offset, midpoints):
    if not _nibble_arrays(codes, values, midpoints):
        return None

    def codegen(context, builder, sig, args):
        _nibbles32(context, builder, sig, args, rounded=False)
        return context.get_dummy_value()

    return signature(types.void, codes, base, values, offset, midpoints), codegen


@intrinsic
def _rounded32_nibbles(typingctx, codes, base, values, offset, midpoints, qmap, first_index, stride, key):
    if not _nibble_arrays(codes, values, midpoints, qmap):
        return None
    arguments = (codes, base, values, offset, midpoints, qmap, first_index, stride, key)
    return signature(types.void, *arguments), _rounded_codegen(_nibbles32)


def quantize_pairs(codes, base, values, pairs, midpoints):
    """codes[base + k] = the 4-bit codes of values[2k] (high nibble) and values[2k + 1] (low),
    values already divided by the block's scale, for the first k that fill groups of 16 where
    the CPU has AVX-512 and the arrays are contiguous: ``nearest_code16`` of each, ``midpoints``
    the map's 15 decision midpoints and +inf. Returns how many bytes it wrote; the rest is the
    caller's."""
    done = pairs // 16 * 16 if FLOAT_PERMUTES else 0
    found = (values[: 2 * done, None] > midpoints[None, :15]).sum(axis=1).reshape(-1, 2)
    codes[base : base + done] = (found[:, 0] << 4) | found[:, 1]
    return done


@overload(quantize_pairs, jit_options={"error_model": "numpy", "forceinline": True})
def _quantize_pairs(codes, base, values, pairs, midpoints):
    permutes = FLOAT_PERMUTES and all(array.layout == "C" for array in (codes, values, midpoints))

    def quantize(codes, base, values, pairs, midpoints):
        done = 0
        if permutes and midpoints.shape[0] == 16:
            while done + 16 <= pairs:
                _nearest32_nibbles(codes, base + done, values, 2 * done, midpoints)
                done += 16
        return done

    return quantize


def quantize_pairs_rounded(codes, base, values, pairs, midpoints, qmap, first_index, stride, key):
    """``quantize_pairs`` with stochastic rounding: ``rounded_code`` of each, element i's (2k
    or 2k + 1) random number drawn at first_index + i·stride under ``key``. Compiled code only
    (the kernels call it; the formula is its plain reading)."""
    raise NotImplementedError("quantize_pairs_rounded runs in compiled code; call it from an @njit function")


@overload(quantize_pairs_rounded, jit_options={"error_model": "numpy", "forceinline": True})
def _quantize_pairs_rounded(codes, base, values, pairs, midpoints, qmap, first_index, stride, key):
    permutes = FLOAT_PERMUTES and all(array.layout == "C" for array in (codes, values, midpoints, qmap))

    def quantize(codes, base, values, pairs, midpoints, qmap, first_index, stride, key):
        done = 0
        if permutes and midpoints.shape[0] == 16 and qmap.shape[0] == 16:
            while done + 16 <= pairs:
                _rounded32_nibbles(
                    codes, base + done, values, 2 * done, midpoints, qmap, first_index + 2 * done * stride, stride, key
                )
                done += 16
        return done

    return quantize


@intrinsic
def _dequantize32_nibbles(typingctx, values, offset, codes, start, qmap, scale):
    """values[offset + 2k] and values[offset + 2k + 1] = map[high and low nibble of
    codes[start + k]]·scale for k < 16: the 16-entry map in one register, permuted."""
    if scale != types.float32 or values.dtype != types.float32 or codes.dtype != types.uint8:
        return None

    def codegen(context, builder, sig, args):
        values_data, codes_data, qmap_data = (
            context.make_array(sig.args[i])(context, builder, args[i]).data for i in (0, 2, 4)
        )
        i32, floats = ir.IntType(32), ir.VectorType(ir.FloatType(), 16)
        words = ir.VectorType(i32, 16)
        pointer = builder.gep(codes_data, [args[3]], inbounds=True)
        raw = builder.load(builder.bitcast(pointer, ir.VectorType(ir.IntType(8), 16).as_pointer()), align=1)
        index = builder.zext(raw, words)
        table = builder.load(builder.bitcast(qmap_data, floats.as_pointer()), align=4)
        permute = _declared(builder, "llvm.x86.avx512.permvar.sf.512", floats, floats, words)
        high = builder.call(permute, [table, builder.lshr(index, ir.Constant(words, [4] * 16))])
        low = builder.call(permute, [table, builder.and_(index, ir.Constant(words, [15] * 16))])
        order = ir.Constant(ir.VectorType(i32, 32), [k // 2 + 16 * (k % 2) for k in range(32)])
        _store_scaled(builder, builder.shuffle_vector(high, low, order), values_data, args[1], args[5])
        return context.get_dummy_value()

    return signature(types.void, values, offset, codes, start, qmap, scale), codegen


def dequantize_pairs(values, codes, base, pairs, qmap, scale):
    """values[2k], values[2k + 1] = qmap[codes[base + k] >> 4], qmap[codes[base + k] & 15], each
    times scale, for k < pairs: a block of 4-bit codes read as float32. 16 bytes at a time by
    a permute of the 16-entry map where the CPU has AVX-512 and the arrays are contiguous."""
    for k in range(pairs):
        values[2 * k] = qmap[codes[base + k] >> 4] * scale
        values[2 * k + 1] = qmap[codes[base + k] & 15] * scale


@overload(dequantize_pairs, jit_options={"error_model": "numpy", "forceinline": True})
def _dequantize_pairs(values, codes, base, pairs, qmap, scale):
    permutes = FLOAT_PERMUTES and all(array.layout == "C" for array in (values, codes, qmap))

    def dequantize(values, codes, base, pairs, qmap, scale):
        done = 0
        if permutes:
            while done + 16 <= pairs:
                _dequantize32_nibbles(values, 2 * done, codes, base + done, qmap, scale)
                done += 16
        for k in range(done, pairs):
            byte = at(codes, base + k)
            values[2 * k] = at(qmap, byte >> 4) * scale
            values[2 * k + 1] = at(qmap, byte & 15) * scale

    return dequantize
