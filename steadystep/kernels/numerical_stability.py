"""Numerically safe building blocks: stable log-space functions, compensated sums, one-pass variance."""

import math

from steadystep.kernels import Fold, Row, Summary
from steadystep.kernels._numerics import exp, exp_difference, is_finite, log1p, neumaier_add


def sigmoid_stable(x):
    """Logistic sigmoid that never exponentiates a positive number.

    1/(1 + exp(−x)) for x ≥ 0; exp(x)/(1 + exp(x)) for x < 0
    """
    # One exp(−|x|) and a choice of numerator, the same two formulas: a branch on the sign,
    # which random signs mispredict half the time, made the CPU kernel several times slower.
    z = exp(-abs(x))
    numerator = 1.0 if x >= 0.0 else z
    return numerator / (1.0 + z)


def softplus(x):
    """log(1 + exp(x)) without overflow, accurate to a few ulp everywhere.

    max(x, 0) + log1p(exp(−|x|))
    """
    # a select, not an early return for NaN, so that a loop of it vectorises
    value = max(x, 0.0) + log1p(exp(-abs(x)))
    return x if x != x else value


def log_sigmoid(x):
    """log(sigmoid(x)) without overflow or log(0).

    −softplus(−x)
    """
    return -softplus(-x)


def log_add_exp(a, b):
    """log(exp(a) + exp(b)) without overflow.

    max(a, b) + log1p(exp(−|a − b|)); (−inf, −inf) → −inf; +inf if either is +inf
    """
    # selects, not early returns, so that a loop of it vectorises
    high = max(a, b)
    value = high + log1p(exp(-abs(a - b)))
    value = high if abs(high) > 1e308 else value
    return a + b if a != a or b != b else value


def relative_error(approx, exact):
    """Relative error, falling back to the absolute error next to zero.

    |approx − exact|/|exact|; |approx − exact| if |exact| < 1e−300
    """
    if abs(exact) < 1e-300:
        return abs(approx - exact)
    return abs(approx - exact) / abs(exact)


def safe_divide(num, den, default):
    """Division that returns a default instead of dividing by (almost) zero.

    num/den; default if |den| < 1e−300
    """
    if abs(den) < 1e-300:
        return default
    return num / den


# -- pieces of the row functions: lift/merge/finish, folded along the last axis -----------


def _max_lift(x):
    return (x,)


def _max_merge(a, b):
    """max that propagates NaN (an associative merge: NaN wins, then the larger value).
    Two selects: the first is one max instruction (it keeps a NaN a), the second puts back
    a NaN b, where one select on three comparisons took twice the instructions."""
    larger = b if b > a else a
    return (b if b != b else larger,)


def _exp_lift(x, high):
    """An element's share relative to the row maximum: (exp(x − max), −0), 1 for the maxima
    (also +inf ones, which then share the mass, and the −inf of a row of them).

    The sum is compensated, so the maxima need no count of their own to keep log1p's
    argument exact for a dominant element: logsumexp([0, −40]) = log1p((1 − 1) + exp(−40)),
    the second term in the compensation. Its identity is −0, which an addition folds away."""
    return (1.0 if x == high else exp_difference(x, high), -0.0)


def _exp_merge(total_a, compensation_a, total_b, compensation_b):
    """Two compensated sums of shares merged. Shares are never negative, so the larger
    magnitude is the larger value (neumaier_add compares magnitudes: two instructions more
    an element of softmax's pass)."""
    total = total_a + total_b
    larger = total_a if total_a >= total_b else total_b
    smaller = total_b if total_a >= total_b else total_a
    return (total, (compensation_a + compensation_b) + ((larger - total) + smaller))


def _compensated_total(total, compensation):
    """The compensated sum, or the plain IEEE sum's inf/NaN (never a NaN the compensation made)."""
    if abs(total) > 1e308 or total != total:
        return total
    return total + compensation


def _log_total(total, compensation):
    """log(Σ shares) as log1p((total − 1) + compensation): exact near 1 (the maximum's share
    is 1, so total ≥ 1, and total − 1 is exact below 2)."""
    return log1p((total - 1.0) + compensation)


def _logsumexp_finish(high, total, compensation, length):
    if abs(high) > 1e308 or high != high:
        return high
    return high + _log_total(total, compensation)


def _softmax_share(share, compensation):
    """An element's part of the row's mass before normalising, from its ``_exp_lift``."""
    return share


def _softmax_value(share, high, total, compensation, length):
    """share/Σ shares (+inf entries: 1/their number, the rest 0). Written with selects, not
    branches, so that the loop over a row vectorises; the denominator is chosen before the
    one division (a select between two quotients computed both)."""
    denominator = total + compensation if is_finite(high) else total
    value = share / denominator if is_finite(high) or high > 0.0 else 0.0
    return value if high == high else high


def _log_softmax_summary(high, total, compensation, length):
    """The row's maximum, log Σ exp(x − max), and what its maxima get if that is +inf:
    −log(how many they are), which is −log Σ then (each +inf shares 1, the rest 0, exactly)."""
    log_total = _log_total(total, compensation)
    return (high, log_total, -log_total if high > 0.0 else -math.inf)


def _log_softmax_value(x, high, log_total, at_infinity):
    """Written with selects, not branches, so that the loop over a row vectorises."""
    shifted = (x - high) - log_total
    value = shifted if is_finite(high) else (at_infinity if x == high else -math.inf)
    return value if high == high else high


def _kahan_finish(total, compensation, scaled, length):
    total = _compensated_total(total, compensation)
    if _overflowed(total, scaled):
        return scaled * 4294967296.0  # 2³²: ±inf only if the sum itself is beyond the range
    return total


def _shift_lift(x):
    """The row's first element (0 if not finite), on which Welford then shifts x, and the
    largest finite magnitude, which says whether x − shift could overflow."""
    if is_finite(x):
        return (x, abs(x))
    return (0.0, 0.0)


def _first_merge(a, largest_a, b, largest_b):
    """The leftmost value (NaN marks "none yet": associative, so the block merge ends on
    element 0 too) and the larger magnitude."""
    largest = max(largest_a, largest_b)
    if a != a:
        return (b, largest)
    return (a, largest)


def _welford_scale(largest):
    """1, or the power of two 2⁻⁶⁴ᵏ (exact) that brings a row's largest magnitude under
    √(dtype max)·2⁻¹⁷, where neither x − shift nor n·(x − mean)² can overflow for n ≤ 2³²:
    the mean of [1e308, −1e308] is 0, not −inf, and float32 values of 1e17 have a variance.

    Nine steps of 2⁻⁶⁴ reach any finite float64 (two any float32). Written as selects in a
    loop of fixed length, not a while loop, so that the compiler unrolls it and hoists it out
    of the loop over a row (which then vectorises)."""
    scale = 1.0
    for _ in range(9):
        scale = scale * 5.421010862427522e-20 if largest * scale > math.sqrt(1e308) * 7.62939453125e-06 else scale
    return scale


def _welford_lift(x, shift, largest):
    scale = _welford_scale(largest)
    deviation = x * scale - shift * scale
    # one element's Σ(x − mean)² is 0, or NaN where x is not finite: a row of one NaN or inf
    # has no variance (NumPy's var agrees), though no merge ever meets its NaN
    return (1.0, deviation, 0.0 * deviation, 0.0)


def _welford_merge(count_a, mean_a, m2_a, compensation_a, count_b, mean_b, m2_b, compensation_b):
    """Chan et al.'s merge of two (count, mean, Σ squared deviations) summaries.

    The sum of squared deviations is compensated: plain, its n roundings would cost
    ~n/2 ulp of the variance (1000 ulp for 1000 elements); compensated it stays ~1 ulp.
    """
    if count_a == 0.0:
        return (count_b, mean_b, m2_b, compensation_b)
    if count_b == 0.0:
        return (count_a, mean_a, m2_a, compensation_a)
    count = count_a + count_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (count_b / count)  # the weight first: delta · count_b alone could overflow
    m2, compensation = neumaier_add(m2_a, compensation_a, m2_b, compensation_b)
    m2, compensation = neumaier_add(m2, compensation, delta * delta * count_a * count_b / count, 0.0)
    return (count, mean, m2, compensation)


def _welford_finish(shift, largest, count, mean, m2, compensation, length):
    if count == 0.0:
        return (math.nan, math.nan)
    variance = _compensated_total(m2, compensation) / count
    scale = _welford_scale(largest)
    # undone on the mean, not its shifted part (which may overflow), and once per factor of
    # the variance (scale² may underflow)
    return ((shift * scale + mean) / scale, variance / scale / scale)


def _sums_lift(x):
    """x, and x·2⁻³² (exact: a power of two) for when the plain sum overflows though the
    entries are finite. That second sum is not compensated (a few ulp instead of one, only
    where the plain sum overflows): compensated, it made normalize_probs 60% slower."""
    return (x, 0.0, x * 2.3283064365386963e-10)


def _sums_merge(total_a, compensation_a, scaled_a, total_b, compensation_b, scaled_b):
    total, compensation = neumaier_add(total_a, compensation_a, total_b, compensation_b)
    return (total, compensation, scaled_a + scaled_b)


def _overflowed(total, scaled):
    """Whether the sum overflowed (to ±inf, or NaN where a block merge met +inf and −inf)
    while the entries are finite (the scaled sum is): then the scaled sum stands in."""
    return not abs(total) <= 1e308 and abs(scaled) <= 1e308


def _normalize_value(x, total, compensation, scaled, length):
    total = _compensated_total(total, compensation)
    if _overflowed(total, scaled):  # for the sign test too
        total = scaled
        x = x * 2.3283064365386963e-10
    if total <= 0.0:
        return 1.0 / length
    return x / total


ROW_MAX = Fold(state=("high",), identity=(-math.inf,), lift="_max_lift", merge="_max_merge")
ROW_EXP = Fold(state=("total", "compensation"), identity=(0.0, 0.0), lift="_exp_lift", merge="_exp_merge")
ROW_SUMS = Fold(
    state=("total", "compensation", "scaled"), identity=(0.0, 0.0, 0.0), lift="_sums_lift", merge="_sums_merge"
)

LOGSUMEXP = Row(
    "logsumexp",
    "log(Σ exp(x)) along the last axis, shifted by the maximum so nothing overflows.",
    "m + log1p(Σ exp(x − m) − 1), m = max(x); [] → −inf; all −inf → −inf; any +inf → +inf; any NaN → NaN",
    (ROW_MAX, ROW_EXP),
    finish="_logsumexp_finish",
)
SOFTMAX = Row(
    "softmax",
    "exp(x)/Σ exp(x) along the last axis, max-shifted.",
    "exp(x − m)/Σ exp(x − m); a row of −inf → 0s; +inf entries share the mass equally; NaN → NaN row",
    (ROW_MAX, ROW_EXP),
    value="_softmax_value",
    share="_softmax_share",
)
LOG_SOFTMAX = Row(
    "log_softmax",
    "x − logsumexp(x) along the last axis, without cancellation.",
    "(x − m) − log1p(Σ exp(x − m) − 1); a row of −inf → −infs; NaN → NaN row",
    (ROW_MAX, ROW_EXP),
    value="_log_softmax_value",
    summary=Summary(state=("high", "log_total", "at_infinity"), function="_log_softmax_summary"),
)
KAHAN_SUM = Row(
    "kahan_sum",
    "Compensated (Kahan–Babuška–Neumaier) sum along the last axis.",
    "Σ x with each rounding error carried in a compensation term; finite entries whose running sum overflows are "
    "summed again scaled by 2⁻³² (inf only if Σ x is); inf/NaN inputs give the plain IEEE sum",
    (ROW_SUMS,),
    finish="_kahan_finish",
)
WELFORD_MEAN_VAR = Row(
    "welford_mean_var",
    "Mean and population variance along the last axis in one pass (Welford/Chan).",
    "(mean, Σ(x − mean)²/n), accumulated on x − x₀ (shifted Welford; scaled by 2⁻⁶⁴ᵏ where |x| nears √(dtype "
    "max)); [] → (NaN, NaN); a constant row → variance exactly 0",
    (
        Fold(state=("shift", "largest"), identity=(math.nan, 0.0), lift="_shift_lift", merge="_first_merge"),
        Fold(
            state=("count", "mean", "m2", "compensation"),
            identity=(0.0, 0.0, 0.0, 0.0),
            lift="_welford_lift",
            merge="_welford_merge",
        ),
    ),
    finish="_welford_finish",
    outputs=2,
)
NORMALIZE_PROBS = Row(
    "normalize_probs",
    "Scale a row to sum to 1; uniform when the sum is not positive.",
    "x/Σ x (x·2⁻³²/Σ x·2⁻³² if Σ x overflows); 1/n if Σ x ≤ 0; NaN → NaN row",
    (ROW_SUMS,),
    value="_normalize_value",
)

ROWS = (LOGSUMEXP, SOFTMAX, LOG_SOFTMAX, KAHAN_SUM, WELFORD_MEAN_VAR, NORMALIZE_PROBS)
