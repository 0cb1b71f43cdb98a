"""The typing and code generation behind ``at(x, i)`` and ``put(x, i, value)``, shared by the
CPU and CUDA targets.

Elementwise kernels take each argument either as a 1-D array (one value per output
element) or as a scalar (broadcast). Numba cannot prune an ``isinstance`` branch on the
CUDA target, so ``at`` is an intrinsic: its type is decided at compile time and the
generated code is a plain load or nothing at all.

Half-precision storage reaches the kernels as the bits of its elements: bfloat16 as a
uint16 array, float16 as an int16 array (Numba has no bfloat16 type, and no float16 on the
CPU). ``at`` reads such an element as the float32 it stands for and ``put`` rounds a value
to the nearest one (ties to even, a NaN stays a NaN), so a formula computes in float32 and
never sees the storage; ``cast_like`` takes a half array's numbers as float32 too.
"""

import functools
import operator
import typing

import numpy as np
from llvmlite import binding, ir
from numba.core import config, types
from numba.core.codegen import get_host_cpu_features
from numba.core.imputils import impl_ret_borrowed
from numba.core.typing import signature

BFLOAT16_BITS = types.uint16  # how a bfloat16 element reaches a kernel
FLOAT16_BITS = types.int16  # how a float16 element does


def computed_as(dtype: types.Type) -> types.Type:
    """The type a kernel computes an element of ``dtype`` in: float32 for half storage."""
    return types.float32 if dtype in (BFLOAT16_BITS, FLOAT16_BITS) else dtype


def constant_of(like: ir.Type, value: float) -> ir.Constant:
    """``value`` as a constant of type ``like``: a number, or every lane of a vector of them."""
    if isinstance(like, ir.VectorType):
        return ir.Constant(like, [value] * like.count)
    return ir.Constant(like, value)


def _with_element(like: ir.Type, element: ir.Type) -> ir.Type:
    """``element``, or a vector of as many of them as ``like`` has lanes."""
    return ir.VectorType(element, like.count) if isinstance(like, ir.VectorType) else element


class _BFloat16Type(ir.Type):
    """LLVM's ``bfloat``, for which llvmlite's IR builder has no class."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _BFloat16Type)

    def __hash__(self) -> int:
        return hash(_BFloat16Type)


# The x86 feature whose instructions convert each half format: LLVM lowers fptrunc/fpext to
# them (vcvtneps2bf16; vcvtps2ph, vcvtph2ps), and without the feature to a call of a routine
# Numba does not link. Elsewhere, the integer operations below.
_CONVERSION_FEATURE: dict[types.Type, str] = {BFLOAT16_BITS: "+avx512bf16", FLOAT16_BITS: "+f16c"}
# bfloat16's fptrunc: LLVM 20 and 22 lower it (checked); numba 0.60's LLVM 14 aborts the process
# ("Cannot select"), and 15 emits no vcvtneps2bf16.
BFLOAT16_FPTRUNC = binding.llvm_version_info >= (20,)


@functools.cache
def cpu_features() -> frozenset[str]:
    """The features Numba compiles CPU code for (its NUMBA_CPU_FEATURES, else the host's)."""
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return frozenset(features.split(","))


def converts_in_hardware(builder: ir.IRBuilder, dtype: types.Type) -> bool:
    """Whether the kernel ``builder`` builds runs on an x86 CPU that converts ``dtype`` in
    hardware (not a GPU: NVVM keeps the integer operations, which are what the GPU has been
    checked with). The results are the same bits either way (tests/test_half.py checks every
    float32 and every half); only the instruction count differs: 1 for float16 and 4 for
    bfloat16 (its subnormal fix-up), against 6 to 15 a value."""
    if dtype == BFLOAT16_BITS and not BFLOAT16_FPTRUNC:
        return False
    return builder.module.triple.startswith("x86_64") and _CONVERSION_FEATURE[dtype] in cpu_features()


def widened(builder: ir.IRBuilder, bits: ir.Value, dtype: types.Type, hardware: bool | None = None) -> ir.Value:
    """The float32 that a half element's ``bits`` stand for: exact (every half value is a
    float32); a NaN stays a NaN of its sign and payload, made quiet. ``hardware``: whether
    to use the CPU's conversion (default: ``converts_in_hardware``)."""
    i32 = ir.IntType(32)
    constant = functools.partial(constant_of, i32)
    if dtype == BFLOAT16_BITS:  # bfloat16 is float32's upper half
        return builder.bitcast(builder.shl(builder.zext(bits, i32), constant(16)), ir.FloatType())
    if converts_in_hardware(builder, dtype) if hardware is None else hardware:
        return builder.fpext(builder.bitcast(bits, ir.HalfType()), ir.FloatType())
    # float16 in integer operations: the exponent rebiased, the fraction shifted up; a
    # subnormal's fraction times 2⁻²⁴, exactly.
    word = builder.zext(bits, i32)
    sign = builder.shl(builder.and_(word, constant(0x8000)), constant(16))
    exponent = builder.and_(builder.lshr(word, constant(10)), constant(0x1F))
    fraction = builder.and_(word, constant(0x3FF))
    shifted = builder.shl(fraction, constant(13))
    normal = builder.or_(builder.shl(builder.add(exponent, constant(112)), constant(23)), shifted)
    # inf, or a NaN with its payload, made quiet (as vcvtph2ps does)
    special = builder.or_(
        builder.select(builder.icmp_unsigned("==", fraction, constant(0)), constant(0x7F800000), constant(0x7FC00000)),
        shifted,
    )
    tiny = builder.fmul(builder.uitofp(fraction, ir.FloatType()), ir.Constant(ir.FloatType(), 2.0**-24))
    magnitude = builder.select(
        builder.icmp_unsigned("==", exponent, constant(0)),
        builder.bitcast(tiny, i32),
        builder.select(builder.icmp_unsigned("==", exponent, constant(0x1F)), special, normal),
    )
    return builder.bitcast(builder.or_(magnitude, sign), ir.FloatType())


def narrowed(builder: ir.IRBuilder, value: ir.Value, dtype: types.Type, hardware: bool | None = None) -> ir.Value:
    """The bits of the half value nearest a float ``value`` (ties to even; a NaN stays a NaN
    of its sign and upper payload, made quiet). A float64 value is rounded to float32 first,
    as torch's conversions do. ``hardware``: as ``widened``'s."""
    if value.type != ir.FloatType():
        value = builder.fptrunc(value, ir.FloatType())
    i32 = ir.IntType(32)
    word = builder.bitcast(value, i32)
    if converts_in_hardware(builder, dtype) if hardware is None else hardware:
        if dtype == FLOAT16_BITS:
            return builder.bitcast(builder.fptrunc(value, ir.HalfType()), ir.IntType(16))
        return _bfloat16_bits_by_instruction(builder, word)
    if dtype == FLOAT16_BITS:
        return _float16_bits(builder, value, word)
    # Round to nearest even on the 16 bits that go: add 0x7FFF plus the lowest kept bit; a
    # carry into the exponent rounds up to the next binade or to inf, as it should.
    kept = builder.and_(builder.lshr(word, ir.Constant(i32, 16)), ir.Constant(i32, 1))
    rounded = builder.lshr(builder.add(word, builder.add(kept, ir.Constant(i32, 0x7FFF))), ir.Constant(i32, 16))
    # A NaN keeps its sign and upper payload and is made quiet, so that it cannot round to inf.
    quiet = builder.or_(builder.lshr(word, ir.Constant(i32, 16)), ir.Constant(i32, 0x40))
    is_nan = builder.fcmp_unordered("uno", value, value)
    return builder.trunc(builder.select(is_nan, quiet, rounded), ir.IntType(16))


def _float16_bits(builder: ir.IRBuilder, value: ir.Value, word: ir.Value) -> ir.Value:
    """float32 → float16 bits, rounded to nearest even, in integer operations (Giesen's
    float_to_half_fast3_rtne): above the range inf (a NaN: a quiet NaN); a subnormal result
    from one float addition that rounds the fraction into place; otherwise the exponent
    rebiased and the 13 bits that go rounded by adding 0xFFF plus the lowest kept bit."""
    i32 = ir.IntType(32)
    constant = functools.partial(constant_of, i32)
    sign = builder.and_(word, constant(0x80000000))
    magnitude = builder.xor(word, sign)
    # a NaN keeps its upper payload and is made quiet (as vcvtps2ph does); beyond the range, inf
    nan = builder.or_(builder.and_(builder.lshr(magnitude, constant(13)), constant(0x1FF)), constant(0x7E00))
    overflow = builder.select(builder.icmp_unsigned(">", magnitude, constant(0x7F800000)), nan, constant(0x7C00))
    denormal_magic = ((127 - 15) + (23 - 10) + 1) << 23
    shifted = builder.fadd(
        builder.bitcast(magnitude, ir.FloatType()), builder.bitcast(constant(denormal_magic), ir.FloatType())
    )
    subnormal = builder.sub(builder.bitcast(shifted, i32), constant(denormal_magic))
    odd = builder.and_(builder.lshr(magnitude, constant(13)), constant(1))
    rebiased = builder.add(builder.add(magnitude, constant(((15 - 127) << 23) + 0xFFF)), odd)
    normal = builder.lshr(rebiased, constant(13))
    half = builder.select(
        builder.icmp_unsigned(">=", magnitude, constant((127 + 16) << 23)),
        overflow,
        builder.select(builder.icmp_unsigned("<", magnitude, constant(113 << 23)), subnormal, normal),
    )
    return builder.trunc(builder.or_(half, builder.lshr(sign, constant(16))), ir.IntType(16))


def random_bits(builder: ir.IRBuilder, index: ir.Value, key: ir.Value) -> ir.Value:
    """32 bits for element ``index`` (64-bit) under ``key`` (64-bit, itself a hash of the seed
    and step), of which the upper 16 are used: Knuth's multiplicative hash of the index xor
    the key, plus the key's upper half. Counter-based, so the same (key, index) gives the same
    bits on every thread, run and target (steadystep._half.random_bits is the same function in
    NumPy). One multiplication, what a memory-bound step can afford (a two-round integer
    hash per element made stochastic rounding cost 2× round to nearest): an element's bits
    over the steps are the hash at unrelated points (the keys), and neighbouring elements'
    are spread evenly (a Weyl sequence), which only lowers the rounding error of a sum."""
    words = _with_element(index.type, ir.IntType(32))  # ``index`` and ``key`` may be vectors of them
    folded = builder.xor(index, builder.lshr(index, constant_of(index.type, 32)))  # past 2³² elements too
    word = builder.trunc(builder.xor(folded, key), words)
    mixed = builder.mul(word, constant_of(words, 0x9E3779B1))  # Knuth's multiplicative hash: the high bits
    return builder.add(mixed, builder.trunc(builder.lshr(key, constant_of(key.type, 32)), words))


def uniform_of_bits(builder: ir.IRBuilder, random: ir.Value, float_type: ir.Type) -> ir.Value:
    """``uniform``'s number from ``random_bits``' word (or each lane of a vector of them): its
    upper 24 bits times 2⁻²⁴, exact in float32 and float64."""
    top = builder.lshr(random, constant_of(random.type, 8))
    floats = _with_element(random.type, float_type)
    return builder.fmul(builder.uitofp(top, floats), constant_of(floats, 2.0**-24))


# A bfloat16 word at or above this magnitude (its largest finite value's float32 bits) is
# rounded to nearest: stochastic rounding must not turn a finite value into inf.
LARGEST_BFLOAT16_WORD = 0x7F7F0000


def _bfloat16_bits_by_instruction(builder: ir.IRBuilder, word: ir.Value) -> ir.Value:
    """``narrowed``'s bfloat16 bits by vcvtneps2bf16, which rounds as ``narrowed`` does except
    that it reads a float32 subnormal as zero: such a value (its exponent field 0) goes in
    with 2⁻¹²⁶ added, exactly (the exponent field set to 1), where the bfloat16 spacing is
    the subnormals' own, 2⁻¹³³, so the rounding is the same; the 2⁻¹²⁶ (0x80) comes off the result."""
    i32, i16 = ir.IntType(32), ir.IntType(16)
    tiny = builder.icmp_unsigned("==", builder.and_(word, ir.Constant(i32, 0x7F800000)), ir.Constant(i32, 0))
    lifted = builder.select(tiny, builder.add(word, ir.Constant(i32, 0x00800000)), word)
    bits = builder.bitcast(builder.fptrunc(builder.bitcast(lifted, ir.FloatType()), _BFloat16Type()), i16)
    return builder.select(tiny, builder.sub(bits, ir.Constant(i16, 0x80)), bits)


def stochastic_bfloat16(builder: ir.IRBuilder, value: ir.Value, random: ir.Value, nearest: ir.Value) -> ir.Value:
    """The bfloat16 bits of float32 ``value`` rounded down or up (in magnitude) with
    probabilities proportional to its distance from each: 16 random bits (the upper half of
    ``random``) added to its word, then the low half dropped. Non-finite values and those
    beyond the largest finite bfloat16 take ``nearest``, the value rounded to nearest
    (``narrowed``'s bits, which the step computes anyway)."""
    i32 = ir.IntType(32)
    word = builder.bitcast(value, i32)
    magnitude = builder.and_(word, ir.Constant(i32, 0x7FFFFFFF))
    in_range = builder.icmp_unsigned("<", magnitude, ir.Constant(i32, LARGEST_BFLOAT16_WORD))
    added = builder.add(word, builder.lshr(random, ir.Constant(i32, 16)))
    rounded = builder.trunc(builder.lshr(added, ir.Constant(i32, 16)), ir.IntType(16))
    return builder.select(in_range, rounded, nearest)


# The buckets of an 8-bit state's code lookup (steadystep.quantization builds the table): a
# float32's sign, exponent and top BUCKET_MANTISSA_BITS mantissa bits, so that a bucket spans
# 1/256 of its value or less, finer than any two neighbouring codes of the dynamic maps (a
# bucket then holds at most one decision boundary, and one comparison finishes the lookup).
# Magnitudes below 2⁻³² share the lowest bucket; those ≥ 1 the highest.
BUCKET_MANTISSA_BITS = 8
BUCKET_LOWEST = (127 - 32) << BUCKET_MANTISSA_BITS  # 2⁻³²'s magnitude bits, shifted
BUCKET_HIGHEST = 127 << BUCKET_MANTISSA_BITS  # 1.0's
BUCKETS_PER_SIGN = BUCKET_HIGHEST - BUCKET_LOWEST + 1
_WITHIN_BUCKET = (1 << (23 - BUCKET_MANTISSA_BITS)) - 1  # the mantissa bits below a bucket's


class PieceLayout(typing.NamedTuple):
    """Where an 8-bit map's code lookup holds its linear pieces, after the buckets (where the
    map has at most ``most``, as the dynamic maps have): a CPU with AVX-512 finds most codes by
    arithmetic, holding the pieces in registers, and takes the buckets only for the rare vector
    with a value close to a decision midpoint. Pieces of the positive side: piece p spans the
    magnitudes above threshold p − 1 up to threshold p, and its code is offset + floor(t),
    t = a·slope + intercept, clamped to [0, last]; a value whose t lies within ``band`` of a
    whole number is not certain. ``binades`` entries give, for each binade from
    2^(lowest_exponent − 127) up, the thresholds below it (a binade holds at most one).
    quantization.code_tables builds them."""

    at: int  # the first word's index in the lookup
    most: int = 16  # pieces a map may have: one vector register of each table
    binades: int = 32
    lowest_exponent: int = 127 - 32 + 1  # the biased exponent of the first binade (of 1.0: the last)
    band: float = 1e-4
    words: int = 128  # int32 words in all; the tables start at these, from ``at``:
    kind: int = 0  # MIRRORED, POSITIVE or 0 (no pieces)
    mirror: int = 1  # the sum of a mirrored pair of codes
    slope: int = 16  # float32 bits
    intercept: int = 32  # float32 bits
    offset: int = 48
    last: int = 64
    threshold: int = 80  # float32 bits, +inf past the last
    binade: int = 96


PIECES = PieceLayout(at=2 * BUCKETS_PER_SIGN)
MIRRORED, POSITIVE = 1, 2  # the kinds: a map symmetric about its code of 0, or one of values ≥ 0 (0: no pieces)


def code_buckets(values: np.ndarray) -> np.ndarray:
    """The bucket (int64) of each of ``values`` rounded to float32: buckets increase with the
    value, negative ones below ``BUCKETS_PER_SIGN`` and the rest (+0 too) from it. The host's
    and the simulator's reading of ``code_bucket_typer``."""
    bits = np.asarray(values, np.float32).view(np.int32).astype(np.int64)
    key = np.clip((bits & 0x7FFFFFFF) >> (23 - BUCKET_MANTISSA_BITS), BUCKET_LOWEST, BUCKET_HIGHEST) - BUCKET_LOWEST
    return np.where(bits < 0, BUCKETS_PER_SIGN - 1 - key, BUCKETS_PER_SIGN + key)


def codes_in_buckets(values: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """The code (int64) of each of ``values`` rounded to float32 from the lookup entry of its
    bucket: the host's and the simulator's reading of ``code_in_bucket_typer``. An entry holds
    a code in its upper half and, in its low 16 bits, the low mantissa bits (all but the
    bucket's) from which a value lies past the bucket's decision midpoint: 0 for every value,
    2¹⁵ for none. Past it, a positive value takes the next code up, a negative one the next down
    (steadystep.quantization builds the entries)."""
    bits = np.asarray(values, np.float32).view(np.int32).astype(np.int64)
    entries = np.asarray(entries).astype(np.int64)
    past = ((bits & _WITHIN_BUCKET) >= (entries & 0xFFFF)).astype(np.int64)
    return (entries >> 16) + np.where(bits < 0, -past, past)


def bucket_of_bits(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """``code_buckets`` in LLVM IR: the bucket (int32) of a float32 given as its bits (int32),
    or of each lane of a vector of them."""
    constant = functools.partial(constant_of, bits.type)
    key = builder.lshr(builder.and_(bits, constant(0x7FFFFFFF)), constant(23 - BUCKET_MANTISSA_BITS))
    lowest, highest = constant(BUCKET_LOWEST), constant(BUCKET_HIGHEST)
    key = builder.select(builder.icmp_signed("<", key, lowest), lowest, key)
    key = builder.sub(builder.select(builder.icmp_signed(">", key, highest), highest, key), lowest)
    return builder.select(
        builder.icmp_signed("<", bits, constant(0)),
        builder.sub(constant(BUCKETS_PER_SIGN - 1), key),
        builder.add(key, constant(BUCKETS_PER_SIGN)),
    )


def code_of_entry(builder: ir.IRBuilder, bits: ir.Value, entry: ir.Value) -> ir.Value:
    """``codes_in_buckets`` in LLVM IR: the code (int32) of a float32 given as its bits (int32)
    from its bucket's lookup ``entry`` (int32), or of each lane of vectors of them: one
    comparison of the low mantissa bits, no second load."""
    constant = functools.partial(constant_of, bits.type)
    past = builder.icmp_signed(
        ">=", builder.and_(bits, constant(_WITHIN_BUCKET)), builder.and_(entry, constant(0xFFFF))
    )
    negative = builder.ashr(bits, constant(31))  # −1 or 0
    step = builder.sub(builder.xor(builder.zext(past, bits.type), negative), negative)  # ±1 past the midpoint
    return builder.add(builder.ashr(entry, constant(16)), step)


def _float32_bits(builder: ir.IRBuilder, value: ir.Value, fromtype: types.Type) -> ir.Value:
    value = value if fromtype == types.float32 else builder.fptrunc(value, ir.FloatType())
    return builder.bitcast(value, ir.IntType(32))


def code_in_bucket_typer(typingctx, y, entry):
    """``code_in_bucket(y, entry)``: the code of float32(y) from its bucket's lookup ``entry``
    (see ``codes_in_buckets``)."""
    if y not in (types.float32, types.float64) or not isinstance(entry, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        word = context.cast(builder, args[1], sig.args[1], types.int32)
        code = code_of_entry(builder, _float32_bits(builder, args[0], sig.args[0]), word)
        return builder.sext(code, ir.IntType(64))

    return signature(types.int64, y, entry), codegen


# LLVM lowers ``llvm.maximum`` on every target from LLVM 18 on (llvm/llvm-project#67301); before,
# x86's backend aborted the process ("Cannot select: fmaximum", #53353), as numba 0.60's LLVM 14 does.
MAXIMUM_INTRINSIC = binding.llvm_version_info >= (18,)


def largest_typer(typingctx, x, y):
    """``largest(x, y)``: the larger, NaN if either is NaN, +0 above −0: LLVM's ``llvm.maximum``,
    which the loop vectoriser takes as a reduction, or where the LLVM cannot lower it the same
    in comparisons and selects."""
    if x not in (types.float32, types.float64) or y != x:
        return None

    def codegen(context, builder, sig, args):
        value_type = context.get_value_type(sig.args[0])
        if MAXIMUM_INTRINSIC:
            maximum = builder.module.declare_intrinsic(
                "llvm.maximum", [value_type], ir.FunctionType(value_type, [value_type, value_type])
            )
            return builder.call(maximum, list(args))
        a, b = args
        bits = ir.IntType(32 if value_type == ir.FloatType() else 64)
        larger = builder.select(builder.fcmp_ordered(">", a, b), a, b)
        # equal: the same bits, or ±0, where and-ing the bits gives +0
        tied = builder.bitcast(builder.and_(builder.bitcast(a, bits), builder.bitcast(b, bits)), value_type)
        either = builder.select(builder.fcmp_ordered("==", a, b), tied, larger)
        return builder.select(builder.fcmp_unordered("uno", a, b), builder.fadd(a, b), either)

    return signature(x, x, y), codegen


def larger_magnitude_typer(typingctx, top, x):
    """``larger_magnitude(top, x)``: the larger of ``top`` (≥ +0, or a NaN of sign +) and |x|,
    as signed integers: a NaN of |x| is above every finite magnitude and +inf, so it stays."""
    if top not in (types.float32, types.float64) or x != top:
        return None

    def codegen(context, builder, sig, args):
        value_type = context.get_value_type(sig.args[0])
        width = 32 if value_type == ir.FloatType() else 64
        bits = ir.IntType(width)
        running = builder.bitcast(args[0], bits)
        magnitude = builder.and_(builder.bitcast(args[1], bits), ir.Constant(bits, (1 << (width - 1)) - 1))
        return builder.bitcast(
            builder.select(builder.icmp_signed(">", magnitude, running), magnitude, running), value_type
        )

    return signature(top, top, x), codegen


def code_bucket_typer(typingctx, y):
    """``code_bucket(y)``: the bucket of float32(y) in an 8-bit state's code lookup (see
    ``code_buckets``), from its bits: integer operations the CPU vectorises."""
    if y not in (types.float32, types.float64):
        return None

    def codegen(context, builder, sig, args):
        bucket = bucket_of_bits(builder, _float32_bits(builder, args[0], sig.args[0]))
        return builder.sext(bucket, ir.IntType(64))

    return signature(types.int64, y), codegen


def at_typer(typingctx, x, i):
    if isinstance(x, types.Array):
        # An unsigned index skips the negative-index wraparound check, which keeps the
        # CPU loops vectorizable.
        load = signature(x.dtype, x, types.uintp)
        result = computed_as(x.dtype)

        def codegen(context, builder, sig, args):
            index = context.cast(builder, args[1], sig.args[1], types.uintp)
            getitem = context.get_function(operator.getitem, load)
            value = getitem(builder, (args[0], index))
            return value if result == x.dtype else widened(builder, value, x.dtype)

        return signature(result, x, i), codegen

    def passthrough(context, builder, sig, args):
        return args[0]

    return signature(x, x, i), passthrough


def cast_like_typer(typingctx, x, reference):
    """A scalar ``x`` in ``reference``'s dtype; an array ``x`` (per-element values) as it is.

    The CPU launcher passes a step's per-call numbers as Python floats (creating a NumPy
    scalar per number cost more than the rest of a small step's Python), so a float32
    kernel rounds them to float32 here, once per call, exactly as ``np.float32(x)`` would.
    """
    if isinstance(x, types.Array):

        def borrow(context, builder, sig, args):
            return impl_ret_borrowed(context, builder, sig.return_type, args[0])  # the new reference counts

        return signature(x, x, reference), borrow

    def codegen(context, builder, sig, args):
        return context.cast(builder, args[0], sig.args[0], sig.return_type)

    return signature(computed_as(reference.dtype), x, reference), codegen


def put_typer(typingctx, x, i, value):
    """``x[i] = value`` for an array; nothing for a scalar (an unused optional buffer)."""
    if isinstance(x, types.Array):
        store = signature(types.none, x, types.uintp, x.dtype)
        half = computed_as(x.dtype) != x.dtype

        def codegen(context, builder, sig, args):
            index = context.cast(builder, args[1], sig.args[1], types.uintp)
            if half:  # a float value rounded once to the storage, from float32 or float64
                value_type = sig.args[2] if sig.args[2] in (types.float32, types.float64) else types.float32
                value = context.cast(builder, args[2], sig.args[2], value_type)
                converted = narrowed(builder, value, x.dtype)
            else:
                converted = context.cast(builder, args[2], sig.args[2], x.dtype)
            setitem = context.get_function(operator.setitem, store)
            setitem(builder, (args[0], index, converted))
            return context.get_dummy_value()

        return signature(types.none, x, i, value), codegen

    def nothing(context, builder, sig, args):
        return context.get_dummy_value()

    return signature(types.none, x, i, value), nothing


def put_rounded_typer(typingctx, x, i, value, key):
    """``put``, except that a bfloat16 element is rounded stochastically when ``key`` (an
    integer) is not 0: up or down with probabilities proportional to the distance, from
    random bits keyed by (``key``, ``i``). Other storage ignores ``key``."""
    if not (isinstance(x, types.Array) and x.dtype == BFLOAT16_BITS):
        _, codegen = put_typer(typingctx, x, i, value)

        def plain(context, builder, sig, args):
            return codegen(context, builder, signature(types.none, *sig.args[:3]), args[:3])

        return signature(types.none, x, i, value, key), plain

    store = signature(types.none, x, types.uintp, x.dtype)

    def rounded(context, builder, sig, args):
        index = context.cast(builder, args[1], sig.args[1], types.uintp)
        value_type = sig.args[2] if sig.args[2] in (types.float32, types.float64) else types.float32
        value = context.cast(builder, args[2], sig.args[2], value_type)
        if value.type != ir.FloatType():
            value = builder.fptrunc(value, ir.FloatType())
        number = context.cast(builder, args[3], sig.args[3], types.int64)
        random = random_bits(builder, index, number)
        nearest = narrowed(builder, value, BFLOAT16_BITS)
        stochastic = stochastic_bfloat16(builder, value, random, nearest)
        bits = builder.select(builder.icmp_signed("!=", number, ir.Constant(ir.IntType(64), 0)), stochastic, nearest)
        setitem = context.get_function(operator.setitem, store)
        setitem(builder, (args[0], index, bits))
        return context.get_dummy_value()

    return signature(types.none, x, i, value, key), rounded


def uniform_typer(typingctx, index, key, like):
    """``uniform(index, key, like)``: a number in [0, 1) of ``like``'s float type, the upper 24
    of ``random_bits(index, key)`` times 2⁻²⁴ (exact in float32 and float64). Stochastic
    rounding of the compressors' codes and random-k's positions take it: the same bits as
    ``put_rounded``'s, so there is one generator, keyed by (seed, step) on the host."""
    result = like if like in (types.float32, types.float64) else types.float64

    def codegen(context, builder, sig, args):
        position = context.cast(builder, args[0], sig.args[0], types.int64)
        number = context.cast(builder, args[1], sig.args[1], types.int64)
        return uniform_of_bits(builder, random_bits(builder, position, number), context.get_value_type(result))

    return signature(result, index, key, like), codegen


def floor_typer(typingctx, x):
    """``floor(x)`` in x's own float type: LLVM's ``llvm.floor``, which the CPU vectorises
    (roundps) and NVVM lowers to one rounding conversion, where x − x mod 1 cost a
    floating-point remainder per element. Exact, like every rounding to an integer; ±0, ±inf
    and NaN come back as they are."""
    if x not in (types.float32, types.float64):
        return None

    def codegen(context, builder, sig, args):
        value_type = context.get_value_type(sig.args[0])
        floor = builder.module.declare_intrinsic("llvm.floor", [value_type])
        return builder.call(floor, [args[0]])

    return signature(x, x), codegen
