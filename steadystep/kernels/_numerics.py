"""Scalar helpers shared by the formulas (compiled alongside them, never public)."""

import math


def sign(x):
    """-1, 0 or +1 with the sign of x; NaN stays NaN."""
    if x > 0.0:
        return 1.0
    if x < 0.0:
        return -1.0
    if x == 0.0:
        return 0.0
    return x


def is_integer(x):
    """True when x is a finite whole number."""
    return x % 1.0 == 0.0


def cospi(x):
    """cos(π·x), x first reduced to [0, 2) (exact: the period is 2), so a large x loses nothing
    to the rounding of π·x; on CUDA, libdevice's cospi, which reduces exactly too."""
    return math.cos(math.pi * (x % 2.0))


def log1p(x):
    """log(1 + x); on the CPU, a polynomial the compiler vectorises (cpu/primitives.py)."""
    return math.log1p(x)


def exp(x):
    """eˣ; on the CPU, a polynomial the compiler vectorises (cpu/primitives.py)."""
    return math.exp(x)


def is_finite(x):
    """True unless x is NaN or ±inf (1e308 means the dtype's largest finite value)."""
    return x == x and abs(x) <= 1e308


def floor(x):
    """The largest whole number ≤ x, in x's own dtype (math.floor would return an int64); both
    targets compile LLVM's floor instead (``_primitives.floor_typer``), which vectorises."""
    if not is_finite(x):
        return x
    return x - x % 1.0


def ceil(x):
    """The smallest whole number ≥ x, in x's own dtype; ceil(−0.5) is −0.0 as in NumPy."""
    return -floor(-x)


def exp_with_tail(x, tail):
    """e^(x + tail) for a ``tail`` far below x's ulp (the rounding error of the subtraction
    that made x, NaN where x is not finite): e^x·(1 + tail) to first order; on the CPU, a
    primitive that folds the tail into its argument reduction (cpu/primitives.py), so that
    the result rounds once. Where the correction is NaN (x infinite, or e^x overflowing),
    e^x alone: a select, not a branch, so that a loop of it vectorises."""
    term = exp(x)
    corrected = term + term * tail
    return corrected if corrected == corrected else term


def exp_difference(x, y):
    """exp(x − y) to about one ulp even when x − y itself rounds.

    x − y = d + e exactly (Knuth's TwoSum), and exp(d + e) is taken with e as its tail:
    without it, exp(−100.000000000000014) is off by ~100 ulp.
    """
    difference = x - y
    virtual = difference - x
    tail = (x - (difference - virtual)) + (-y - virtual)  # NaN where the difference is inf or NaN
    return exp_with_tail(difference, tail)


def maximum(x, y):
    """The larger of x and y, NaN if either is NaN (torch.maximum, np.maximum)."""
    if x > y or x != x:
        return x
    return y


def largest(x, y):
    """The larger of x and y, NaN if either is NaN: ``maximum``, which the CPU compiles as LLVM's
    ``llvm.maximum`` (``_primitives.largest_typer``) so that a loop's running maximum vectorises
    as a reduction (a compare and a select per element does not). On ±0 it may differ from
    ``maximum``: for maxima of magnitudes only."""
    if x > y or x != x:
        return x
    return y


def larger_magnitude(top, x):
    """largest(top, |x|) for a running maximum of magnitudes (top ≥ 0 or NaN): NaN once any x
    is NaN. The CPU compiles it as an integer maximum of the bits (``_primitives.larger_magnitude_typer``),
    one instruction a vector where ``llvm.maximum`` takes five: a magnitude's bits order as
    its value, and a NaN's lie above +inf's."""
    return largest(top, abs(x))


def lerp(start, end, weight):
    """start + weight·(end − start), evaluated like torch.lerp (from the nearer end)."""
    if weight < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (1.0 - weight)


def neumaier_add(sum_a, compensation_a, sum_b, compensation_b):
    """Two compensated partial sums merged (Neumaier): the new rounding error joins the compensation."""
    total = sum_a + sum_b
    a_larger = abs(sum_a) >= abs(sum_b)
    larger = sum_a if a_larger else sum_b
    smaller = sum_b if a_larger else sum_a
    return total, (compensation_a + compensation_b) + ((larger - total) + smaller)


def adam_parameter(param, exp_avg, second_moment, eps, step_size, inverse_bias_correction2_sqrt):
    """Adam's parameter update from the moments (second_moment: v, or AMSGrad's max v̂): the
    one text of it, for the fused steps (bias corrections from the host) and the catalog's
    adam_update/adamw_update (moments already corrected: step_size = lr, the factor 1).

    The host computes the bias corrections in float64. Multiplying by 1/√(1 − β2ᵗ) instead
    of dividing saves a division per element (the step is arithmetic-bound in cache).
    """
    denominator = math.sqrt(second_moment) * inverse_bias_correction2_sqrt + eps
    return param + -step_size * exp_avg / denominator


def uniform(index, key, like):
    """A number in [0, 1) of ``like``'s dtype from 24 random bits of (``key``, ``index``):
    steadystep._half.random_bits's hash, counter-based, so every target and run draws the same.
    Both targets compile it as an intrinsic (``_primitives.uniform_typer``); this is its
    plain-Python reading."""
    folded = (index ^ (index >> 32)) ^ key
    word = ((folded & 0xFFFFFFFF) * 0x9E3779B1 + ((key >> 32) & 0xFFFFFFFF)) & 0xFFFFFFFF
    return (word >> 8) * 5.9604644775390625e-08


def code_bucket(y):
    """The bucket of float32(y) in an 8-bit state's code lookup: its sign, exponent and top
    mantissa bits (``steadystep._primitives.code_buckets``). Both targets compile it as an
    intrinsic (``_primitives.code_bucket_typer``); this is its plain-Python reading."""
    from steadystep._primitives import code_buckets

    return int(code_buckets(y)[()])


def nearest_code(y, lookup):
    """The index of the entry of an increasing 256-entry map nearest y, ties to the lower one:
    the number of the map's decision midpoints below y. ``lookup`` holds an entry a bucket, and
    a bucket holds at most one midpoint, so y's bits and its bucket's entry finish it
    (``code_in_bucket``; steadystep.quantization builds the entries for a map)."""
    return code_in_bucket(y, lookup[code_bucket(y)])


def nearest_code16(y, midpoints):
    """``nearest_code`` for a 16-entry map (4-bit codes): the count of its 15 decision
    ``midpoints`` below y, by comparisons. Fifteen comparisons vectorise, and cost less than a
    bucket's two dependent loads. Each an int: NumPy adds booleans as a logical or (the CUDA
    simulator runs this text on NumPy scalars)."""
    return (
        int(y > midpoints[0])
        + int(y > midpoints[1])
        + int(y > midpoints[2])
        + int(y > midpoints[3])
        + int(y > midpoints[4])
        + int(y > midpoints[5])
        + int(y > midpoints[6])
        + int(y > midpoints[7])
        + int(y > midpoints[8])
        + int(y > midpoints[9])
        + int(y > midpoints[10])
        + int(y > midpoints[11])
        + int(y > midpoints[12])
        + int(y > midpoints[13])
        + int(y > midpoints[14])
    )


def code_in_bucket(y, entry):
    """``nearest_code`` of y from its bucket's lookup ``entry``. Both targets compile it as an
    intrinsic (``_primitives.code_in_bucket_typer``); this is its plain-Python reading."""
    from steadystep._primitives import codes_in_buckets

    return int(codes_in_buckets(y, entry)[()])


def rounded_code(y, nearest, qmap, index, key):
    """One of the two map entries around y, stochastically: the upper with probability
    (y − below)/(above − below), so the dequantized value is y on average (y beyond the map's
    ends takes the end). ``nearest`` is y's nearest code (``nearest_code``, or
    ``nearest_code16`` for a 4-bit map); ``index`` and ``key`` draw the number (``uniform``)."""
    lower = min(max(nearest - (0 if qmap[nearest] <= y else 1), 0), qmap[2:].shape[0])  # ≤ the next-to-last
    below = qmap[lower]
    fraction = (y - below) / (qmap[lower + 1] - below)
    return lower + (1 if uniform(index, key, y) < fraction else 0)
