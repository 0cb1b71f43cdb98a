"""CPU kernels generated from steadystep/kernels/numerical_stability.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

import math  # noqa: F401  (formulas may call math functions)

import numpy as np  # noqa: F401
from numba import njit, prange  # noqa: F401
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cpu.primitives import LANES, at, cast_like, lane_chunks, put, log1p_f32, log1p_f64, exp_f32, exp_f64  # noqa: F401

# Numba's cache checks only this file: a change to the primitives these kernels inline must
# rewrite it, and test_codegen fails until codegen has
PRIMITIVES_DIGEST = "69fe65462d789b80"


@njit(error_model="numpy", cache=True, forceinline=True)
def is_finite_f32(x):
    return x == x and abs(x) <= float32(3.4028234663852886e+38)


@njit(error_model="numpy", cache=True, forceinline=True)
def exp_difference_f32(x, y):
    difference = x - y
    virtual = difference - x
    error = x - (difference - virtual) + (-y - virtual)
    term = exp_f32(difference)
    return term + term * error if is_finite_f32(difference) else term


@njit(error_model="numpy", cache=True, forceinline=True)
def neumaier_add_f32(sum_a, compensation_a, sum_b, compensation_b):
    total = sum_a + sum_b
    a_larger = abs(sum_a) >= abs(sum_b)
    larger = sum_a if a_larger else sum_b
    smaller = sum_b if a_larger else sum_a
    return (total, compensation_a + compensation_b + (larger - total + smaller))


@njit(error_model="numpy", cache=True, forceinline=True)
def sigmoid_stable_f32(x):
    z = exp_f32(-abs(x))
    numerator = float32(1.0) if x >= float32(0.0) else z
    return numerator / (float32(1.0) + z)


@njit(error_model="numpy", cache=True, parallel=True)
def sigmoid_stable_f32_kernel(out, x):
    for i in prange(out.shape[0]):
        out[i] = sigmoid_stable_f32(at(x, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def softplus_f32(x):
    value = max(x, float32(0.0)) + log1p_f32(exp_f32(-abs(x)))
    return x if x != x else value


@njit(error_model="numpy", cache=True, parallel=True)
def softplus_f32_kernel(out, x):
    for i in prange(out.shape[0]):
        out[i] = softplus_f32(at(x, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def log_sigmoid_f32(x):
    return -softplus_f32(-x)


@njit(error_model="numpy", cache=True, parallel=True)
def log_sigmoid_f32_kernel(out, x):
    for i in prange(out.shape[0]):
        out[i] = log_sigmoid_f32(at(x, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def log_add_exp_f32(a, b):
    high = max(a, b)
    value = high + log1p_f32(exp_f32(-abs(a - b)))
    value = high if abs(high) > float32(3.4028234663852886e+38) else value
    return a + b if a != a or b != b else value


@njit(error_model="numpy", cache=True, parallel=True)
def log_add_exp_f32_kernel(out, a, b):
    for i in prange(out.shape[0]):
        out[i] = log_add_exp_f32(at(a, i), at(b, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def relative_error_f32(approx, exact):
    if abs(exact) < float32(1.1754943508222875e-38):
        return abs(approx - exact)
    return abs(approx - exact) / abs(exact)


@njit(error_model="numpy", cache=True, parallel=True)
def relative_error_f32_kernel(out, approx, exact):
    for i in prange(out.shape[0]):
        out[i] = relative_error_f32(at(approx, i), at(exact, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def safe_divide_f32(num, den, default):
    if abs(den) < float32(1.1754943508222875e-38):
        return default
    return num / den


@njit(error_model="numpy", cache=True, parallel=True)
def safe_divide_f32_kernel(out, num, den, default):
    for i in prange(out.shape[0]):
        out[i] = safe_divide_f32(at(num, i), at(den, i), at(default, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def _max_lift_f32(x):
    return (x,)


@njit(error_model="numpy", cache=True, forceinline=True)
def _max_merge_f32(a, b):
    return (b if a == a and (b != b or b > a) else a,)


@njit(error_model="numpy", cache=True, forceinline=True)
def _exp_lift_f32(x, high):
    share = exp_difference_f32(x, high)
    return (float32(1.0) if x == high else float32(0.0), float32(0.0) if x == high else share, float32(0.0))


@njit(error_model="numpy", cache=True, forceinline=True)
def _exp_merge_f32(count_a, rest_a, compensation_a, count_b, rest_b, compensation_b):
    rest, compensation = neumaier_add_f32(rest_a, compensation_a, rest_b, compensation_b)
    return (count_a + count_b, rest, compensation)


@njit(error_model="numpy", cache=True, forceinline=True)
def _compensated_total_f32(total, compensation):
    if abs(total) > float32(3.4028234663852886e+38) or total != total:
        return total
    return total + compensation


@njit(error_model="numpy", cache=True, forceinline=True)
def _log_total_f32(count, rest, compensation):
    return log1p_f32(count - float32(1.0) + (rest + compensation))


@njit(error_model="numpy", cache=True, forceinline=True)
def _logsumexp_finish_f32(high, count, rest, compensation, length):
    if abs(high) > float32(3.4028234663852886e+38) or high != high:
        return high
    return high + _log_total_f32(count, rest, compensation)


@njit(error_model="numpy", cache=True, forceinline=True)
def _softmax_share_f32(is_max, share, compensation):
    return is_max + share


@njit(error_model="numpy", cache=True, forceinline=True)
def _softmax_value_f32(share, high, count, rest, compensation, length):
    value = share / (count + (rest + compensation)) if is_finite_f32(high) else share / count if high > float32(0.0) else float32(0.0)
    return value if high == high else high


@njit(error_model="numpy", cache=True, forceinline=True)
def _log_softmax_summary_f32(high, count, rest, compensation, length):
    return (high, _log_total_f32(count, rest, compensation), -math.log(count) if high > float32(0.0) else -float32(math.inf))


@njit(error_model="numpy", cache=True, forceinline=True)
def _log_softmax_value_f32(x, high, log_total, at_infinity):
    shifted = x - high - log_total
    value = shifted if is_finite_f32(high) else at_infinity if x == high else -float32(math.inf)
    return value if high == high else high


@njit(error_model="numpy", cache=True, forceinline=True)
def _kahan_finish_f32(total, compensation, scaled, length):
    total = _compensated_total_f32(total, compensation)
    if _overflowed_f32(total, scaled):
        return scaled * float32(4294967296.0)
    return total


@njit(error_model="numpy", cache=True, forceinline=True)
def _shift_lift_f32(x):
    if is_finite_f32(x):
        return (x, abs(x))
    return (float32(0.0), float32(0.0))


@njit(error_model="numpy", cache=True, forceinline=True)
def _first_merge_f32(a, largest_a, b, largest_b):
    largest = max(largest_a, largest_b)
    if a != a:
        return (b, largest)
    return (a, largest)


@njit(error_model="numpy", cache=True, forceinline=True)
def _welford_scale_f32(largest):
    scale = float32(1.0)
    for _ in range(9):
        scale = scale * float32(5.421010862427522e-20) if largest * scale > math.sqrt(float32(3.4028234663852886e+38)) * float32(7.62939453125e-06) else scale
    return scale


@njit(error_model="numpy", cache=True, forceinline=True)
def _welford_lift_f32(x, shift, largest):
    scale = _welford_scale_f32(largest)
    deviation = x * scale - shift * scale
    return (float32(1.0), deviation, float32(0.0) * deviation, float32(0.0))


@njit(error_model="numpy", cache=True, forceinline=True)
def _welford_merge_f32(count_a, mean_a, m2_a, compensation_a, count_b, mean_b, m2_b, compensation_b):
    if count_a == float32(0.0):
        return (count_b, mean_b, m2_b, compensation_b)
    if count_b == float32(0.0):
        return (count_a, mean_a, m2_a, compensation_a)
    count = count_a + count_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (count_b / count)
    m2, compensation = neumaier_add_f32(m2_a, compensation_a, m2_b, compensation_b)
    m2, compensation = neumaier_add_f32(m2, compensation, delta * delta * count_a * count_b / count, float32(0.0))
    return (count, mean, m2, compensation)


@njit(error_model="numpy", cache=True, forceinline=True)
def _welford_finish_f32(shift, largest, count, mean, m2, compensation, length):
    if count == float32(0.0):
        return (float32(math.nan), float32(math.nan))
    variance = _compensated_total_f32(m2, compensation) / count
    scale = _welford_scale_f32(largest)
    return ((shift * scale + mean) / scale, variance / scale / scale)


@njit(error_model="numpy", cache=True, forceinline=True)
def _sums_lift_f32(x):
    return (x, float32(0.0), x * float32(2.3283064365386963e-10))


@njit(error_model="numpy", cache=True, forceinline=True)
def _sums_merge_f32(total_a, compensation_a, scaled_a, total_b, compensation_b, scaled_b):
    total, compensation = neumaier_add_f32(total_a, compensation_a, total_b, compensation_b)
    return (total, compensation, scaled_a + scaled_b)


@njit(error_model="numpy", cache=True, forceinline=True)
def _overflowed_f32(total, scaled):
    return not abs(total) <= float32(3.4028234663852886e+38) and abs(scaled) <= float32(3.4028234663852886e+38)


@njit(error_model="numpy", cache=True, forceinline=True)
def _normalize_value_f32(x, total, compensation, scaled, length):
    total = _compensated_total_f32(total, compensation)
    if _overflowed_f32(total, scaled):
        total = scaled
        x = x * float32(2.3283064365386963e-10)
    if total <= float32(0.0):
        return float32(1.0) / length
    return x / total


@njit(error_model="numpy", cache=True, parallel=True)
def logsumexp_f32_rows(out, xs, blocks):
    length = float32(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_compensation = np.empty(LANES, float32)
        lane_count = np.empty(LANES, float32)
        lane_high = np.empty(LANES, float32)
        lane_rest = np.empty(LANES, float32)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float32)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_high[k] = float32(-math.inf)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f32(values[k])
                        lane_high[k], = _max_merge_f32(lane_high[k], lifted_0)
                for k in range(LANES):
                    lane_count[k] = float32(0.0)
                    lane_rest[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f32(values[k], lane_high[k])
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                for k in range(group):
                    out[first + k] = _logsumexp_finish_f32(lane_high[k], lane_count[k], lane_rest[k], lane_compensation[k], length)
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_high[k] = float32(-math.inf)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f32(values[k])
                        lane_high[k], = _max_merge_f32(lane_high[k], lifted_0)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, = _max_lift_f32(values[k])
                    lane_high[k], = _max_merge_f32(lane_high[k], lifted_0)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_high[k], = _max_merge_f32(lane_high[k], lane_high[k + width])
                high, = lane_high[0],
                for k in range(LANES):
                    lane_count[k] = float32(0.0)
                    lane_rest[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f32(values[k], high)
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, = _exp_lift_f32(values[k], high)
                    lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lane_count[k + width], lane_rest[k + width], lane_compensation[k + width])
                count, rest, compensation, = lane_count[0], lane_rest[0], lane_compensation[0],
                out[row] = _logsumexp_finish_f32(high, count, rest, compensation, length)


@njit(error_model="numpy", cache=True, parallel=True)
def softmax_f32_rows(out, xs, blocks):
    length = float32(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_compensation = np.empty(LANES, float32)
        lane_count = np.empty(LANES, float32)
        lane_high = np.empty(LANES, float32)
        lane_rest = np.empty(LANES, float32)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float32)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_high[k] = float32(-math.inf)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f32(values[k])
                        lane_high[k], = _max_merge_f32(lane_high[k], lifted_0)
                for k in range(LANES):
                    lane_count[k] = float32(0.0)
                    lane_rest[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f32(values[k], lane_high[k])
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                        values[k] = _softmax_share_f32(lifted_0, lifted_1, lifted_2)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        values[k] = _softmax_value_f32(values[k], lane_high[k], lane_count[k], lane_rest[k], lane_compensation[k], length)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        out[first + k, j] = columns[j, k]
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_high[k] = float32(-math.inf)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f32(values[k])
                        lane_high[k], = _max_merge_f32(lane_high[k], lifted_0)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, = _max_lift_f32(values[k])
                    lane_high[k], = _max_merge_f32(lane_high[k], lifted_0)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_high[k], = _max_merge_f32(lane_high[k], lane_high[k + width])
                high, = lane_high[0],
                for k in range(LANES):
                    lane_count[k] = float32(0.0)
                    lane_rest[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    shares = out[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f32(values[k], high)
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                        shares[k] = _softmax_share_f32(lifted_0, lifted_1, lifted_2)
                values = xs[row, chunks * LANES:]
                shares = out[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, = _exp_lift_f32(values[k], high)
                    lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                    shares[k] = _softmax_share_f32(lifted_0, lifted_1, lifted_2)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lane_count[k + width], lane_rest[k + width], lane_compensation[k + width])
                count, rest, compensation, = lane_count[0], lane_rest[0], lane_compensation[0],
                for j in range(xs.shape[1]):
                    out[row, j] = _softmax_value_f32(out[row, j], high, count, rest, compensation, length)


@njit(error_model="numpy", cache=True, parallel=True)
def log_softmax_f32_rows(out, xs, blocks):
    length = float32(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_at_infinity = np.empty(LANES, float32)
        lane_compensation = np.empty(LANES, float32)
        lane_count = np.empty(LANES, float32)
        lane_high = np.empty(LANES, float32)
        lane_log_total = np.empty(LANES, float32)
        lane_rest = np.empty(LANES, float32)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float32)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_high[k] = float32(-math.inf)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f32(values[k])
                        lane_high[k], = _max_merge_f32(lane_high[k], lifted_0)
                for k in range(LANES):
                    lane_count[k] = float32(0.0)
                    lane_rest[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f32(values[k], lane_high[k])
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                for k in range(LANES):
                    lane_high[k], lane_log_total[k], lane_at_infinity[k], = _log_softmax_summary_f32(lane_high[k], lane_count[k], lane_rest[k], lane_compensation[k], length)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        values[k] = _log_softmax_value_f32(values[k], lane_high[k], lane_log_total[k], lane_at_infinity[k])
                for k in range(group):
                    for j in range(xs.shape[1]):
                        out[first + k, j] = columns[j, k]
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_high[k] = float32(-math.inf)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f32(values[k])
                        lane_high[k], = _max_merge_f32(lane_high[k], lifted_0)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, = _max_lift_f32(values[k])
                    lane_high[k], = _max_merge_f32(lane_high[k], lifted_0)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_high[k], = _max_merge_f32(lane_high[k], lane_high[k + width])
                high, = lane_high[0],
                for k in range(LANES):
                    lane_count[k] = float32(0.0)
                    lane_rest[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f32(values[k], high)
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, = _exp_lift_f32(values[k], high)
                    lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f32(lane_count[k], lane_rest[k], lane_compensation[k], lane_count[k + width], lane_rest[k + width], lane_compensation[k + width])
                count, rest, compensation, = lane_count[0], lane_rest[0], lane_compensation[0],
                high, log_total, at_infinity, = _log_softmax_summary_f32(high, count, rest, compensation, length)
                for j in range(xs.shape[1]):
                    out[row, j] = _log_softmax_value_f32(xs[row, j], high, log_total, at_infinity)


@njit(error_model="numpy", cache=True, parallel=True)
def kahan_sum_f32_rows(out, xs, blocks):
    length = float32(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_compensation = np.empty(LANES, float32)
        lane_scaled = np.empty(LANES, float32)
        lane_total = np.empty(LANES, float32)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float32)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_total[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                    lane_scaled[k] = float32(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _sums_lift_f32(values[k])
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f32(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                for k in range(group):
                    out[first + k] = _kahan_finish_f32(lane_total[k], lane_compensation[k], lane_scaled[k], length)
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_total[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                    lane_scaled[k] = float32(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _sums_lift_f32(values[k])
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f32(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, = _sums_lift_f32(values[k])
                    lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f32(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f32(lane_total[k], lane_compensation[k], lane_scaled[k], lane_total[k + width], lane_compensation[k + width], lane_scaled[k + width])
                total, compensation, scaled, = lane_total[0], lane_compensation[0], lane_scaled[0],
                out[row] = _kahan_finish_f32(total, compensation, scaled, length)


@njit(error_model="numpy", cache=True, parallel=True)
def welford_mean_var_f32_rows(out, xs, blocks):
    length = float32(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_compensation = np.empty(LANES, float32)
        lane_count = np.empty(LANES, float32)
        lane_largest = np.empty(LANES, float32)
        lane_m2 = np.empty(LANES, float32)
        lane_mean = np.empty(LANES, float32)
        lane_shift = np.empty(LANES, float32)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float32)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_shift[k] = float32(math.nan)
                    lane_largest[k] = float32(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, = _shift_lift_f32(values[k])
                        lane_shift[k], lane_largest[k], = _first_merge_f32(lane_shift[k], lane_largest[k], lifted_0, lifted_1)
                for k in range(LANES):
                    lane_count[k] = float32(0.0)
                    lane_mean[k] = float32(0.0)
                    lane_m2[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, lifted_3, = _welford_lift_f32(values[k], lane_shift[k], lane_largest[k])
                        lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], = _welford_merge_f32(lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], lifted_0, lifted_1, lifted_2, lifted_3)
                for k in range(group):
                    result_0, result_1 = _welford_finish_f32(lane_shift[k], lane_largest[k], lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], length)
                    out[first + k, 0] = result_0
                    out[first + k, 1] = result_1
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_shift[k] = float32(math.nan)
                    lane_largest[k] = float32(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, = _shift_lift_f32(values[k])
                        lane_shift[k], lane_largest[k], = _first_merge_f32(lane_shift[k], lane_largest[k], lifted_0, lifted_1)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, = _shift_lift_f32(values[k])
                    lane_shift[k], lane_largest[k], = _first_merge_f32(lane_shift[k], lane_largest[k], lifted_0, lifted_1)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_shift[k], lane_largest[k], = _first_merge_f32(lane_shift[k], lane_largest[k], lane_shift[k + width], lane_largest[k + width])
                shift, largest, = lane_shift[0], lane_largest[0],
                for k in range(LANES):
                    lane_count[k] = float32(0.0)
                    lane_mean[k] = float32(0.0)
                    lane_m2[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, lifted_3, = _welford_lift_f32(values[k], shift, largest)
                        lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], = _welford_merge_f32(lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], lifted_0, lifted_1, lifted_2, lifted_3)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, lifted_3, = _welford_lift_f32(values[k], shift, largest)
                    lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], = _welford_merge_f32(lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], lifted_0, lifted_1, lifted_2, lifted_3)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], = _welford_merge_f32(lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], lane_count[k + width], lane_mean[k + width], lane_m2[k + width], lane_compensation[k + width])
                count, mean, m2, compensation, = lane_count[0], lane_mean[0], lane_m2[0], lane_compensation[0],
                result_0, result_1 = _welford_finish_f32(shift, largest, count, mean, m2, compensation, length)
                out[row, 0] = result_0
                out[row, 1] = result_1


@njit(error_model="numpy", cache=True, parallel=True)
def normalize_probs_f32_rows(out, xs, blocks):
    length = float32(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_compensation = np.empty(LANES, float32)
        lane_scaled = np.empty(LANES, float32)
        lane_total = np.empty(LANES, float32)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float32)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_total[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                    lane_scaled[k] = float32(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _sums_lift_f32(values[k])
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f32(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        values[k] = _normalize_value_f32(values[k], lane_total[k], lane_compensation[k], lane_scaled[k], length)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        out[first + k, j] = columns[j, k]
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_total[k] = float32(0.0)
                    lane_compensation[k] = float32(0.0)
                    lane_scaled[k] = float32(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _sums_lift_f32(values[k])
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f32(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, = _sums_lift_f32(values[k])
                    lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f32(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f32(lane_total[k], lane_compensation[k], lane_scaled[k], lane_total[k + width], lane_compensation[k + width], lane_scaled[k + width])
                total, compensation, scaled, = lane_total[0], lane_compensation[0], lane_scaled[0],
                for j in range(xs.shape[1]):
                    out[row, j] = _normalize_value_f32(xs[row, j], total, compensation, scaled, length)


@njit(error_model="numpy", cache=True, forceinline=True)
def is_finite_f64(x):
    return x == x and abs(x) <= float64(1e+308)


@njit(error_model="numpy", cache=True, forceinline=True)
def exp_difference_f64(x, y):
    difference = x - y
    virtual = difference - x
    error = x - (difference - virtual) + (-y - virtual)
    term = exp_f64(difference)
    return term + term * error if is_finite_f64(difference) else term


@njit(error_model="numpy", cache=True, forceinline=True)
def neumaier_add_f64(sum_a, compensation_a, sum_b, compensation_b):
    total = sum_a + sum_b
    a_larger = abs(sum_a) >= abs(sum_b)
    larger = sum_a if a_larger else sum_b
    smaller = sum_b if a_larger else sum_a
    return (total, compensation_a + compensation_b + (larger - total + smaller))


@njit(error_model="numpy", cache=True, forceinline=True)
def sigmoid_stable_f64(x):
    z = exp_f64(-abs(x))
    numerator = float64(1.0) if x >= float64(0.0) else z
    return numerator / (float64(1.0) + z)


@njit(error_model="numpy", cache=True, parallel=True)
def sigmoid_stable_f64_kernel(out, x):
    for i in prange(out.shape[0]):
        out[i] = sigmoid_stable_f64(at(x, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def softplus_f64(x):
    value = max(x, float64(0.0)) + log1p_f64(exp_f64(-abs(x)))
    return x if x != x else value


@njit(error_model="numpy", cache=True, parallel=True)
def softplus_f64_kernel(out, x):
    for i in prange(out.shape[0]):
        out[i] = softplus_f64(at(x, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def log_sigmoid_f64(x):
    return -softplus_f64(-x)


@njit(error_model="numpy", cache=True, parallel=True)
def log_sigmoid_f64_kernel(out, x):
    for i in prange(out.shape[0]):
        out[i] = log_sigmoid_f64(at(x, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def log_add_exp_f64(a, b):
    high = max(a, b)
    value = high + log1p_f64(exp_f64(-abs(a - b)))
    value = high if abs(high) > float64(1e+308) else value
    return a + b if a != a or b != b else value


@njit(error_model="numpy", cache=True, parallel=True)
def log_add_exp_f64_kernel(out, a, b):
    for i in prange(out.shape[0]):
        out[i] = log_add_exp_f64(at(a, i), at(b, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def relative_error_f64(approx, exact):
    if abs(exact) < float64(1e-300):
        return abs(approx - exact)
    return abs(approx - exact) / abs(exact)


@njit(error_model="numpy", cache=True, parallel=True)
def relative_error_f64_kernel(out, approx, exact):
    for i in prange(out.shape[0]):
        out[i] = relative_error_f64(at(approx, i), at(exact, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def safe_divide_f64(num, den, default):
    if abs(den) < float64(1e-300):
        return default
    return num / den


@njit(error_model="numpy", cache=True, parallel=True)
def safe_divide_f64_kernel(out, num, den, default):
    for i in prange(out.shape[0]):
        out[i] = safe_divide_f64(at(num, i), at(den, i), at(default, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def _max_lift_f64(x):
    return (x,)


@njit(error_model="numpy", cache=True, forceinline=True)
def _max_merge_f64(a, b):
    return (b if a == a and (b != b or b > a) else a,)


@njit(error_model="numpy", cache=True, forceinline=True)
def _exp_lift_f64(x, high):
    share = exp_difference_f64(x, high)
    return (float64(1.0) if x == high else float64(0.0), float64(0.0) if x == high else share, float64(0.0))


@njit(error_model="numpy", cache=True, forceinline=True)
def _exp_merge_f64(count_a, rest_a, compensation_a, count_b, rest_b, compensation_b):
    rest, compensation = neumaier_add_f64(rest_a, compensation_a, rest_b, compensation_b)
    return (count_a + count_b, rest, compensation)


@njit(error_model="numpy", cache=True, forceinline=True)
def _compensated_total_f64(total, compensation):
    if abs(total) > float64(1e+308) or total != total:
        return total
    return total + compensation


@njit(error_model="numpy", cache=True, forceinline=True)
def _log_total_f64(count, rest, compensation):
    return log1p_f64(count - float64(1.0) + (rest + compensation))


@njit(error_model="numpy", cache=True, forceinline=True)
def _logsumexp_finish_f64(high, count, rest, compensation, length):
    if abs(high) > float64(1e+308) or high != high:
        return high
    return high + _log_total_f64(count, rest, compensation)


@njit(error_model="numpy", cache=True, forceinline=True)
def _softmax_share_f64(is_max, share, compensation):
    return is_max + share


@njit(error_model="numpy", cache=True, forceinline=True)
def _softmax_value_f64(share, high, count, rest, compensation, length):
    value = share / (count + (rest + compensation)) if is_finite_f64(high) else share / count if high > float64(0.0) else float64(0.0)
    return value if high == high else high


@njit(error_model="numpy", cache=True, forceinline=True)
def _log_softmax_summary_f64(high, count, rest, compensation, length):
    return (high, _log_total_f64(count, rest, compensation), -math.log(count) if high > float64(0.0) else -float64(math.inf))


@njit(error_model="numpy", cache=True, forceinline=True)
def _log_softmax_value_f64(x, high, log_total, at_infinity):
    shifted = x - high - log_total
    value = shifted if is_finite_f64(high) else at_infinity if x == high else -float64(math.inf)
    return value if high == high else high


@njit(error_model="numpy", cache=True, forceinline=True)
def _kahan_finish_f64(total, compensation, scaled, length):
    total = _compensated_total_f64(total, compensation)
    if _overflowed_f64(total, scaled):
        return scaled * float64(4294967296.0)
    return total


@njit(error_model="numpy", cache=True, forceinline=True)
def _shift_lift_f64(x):
    if is_finite_f64(x):
        return (x, abs(x))
    return (float64(0.0), float64(0.0))


@njit(error_model="numpy", cache=True, forceinline=True)
def _first_merge_f64(a, largest_a, b, largest_b):
    largest = max(largest_a, largest_b)
    if a != a:
        return (b, largest)
    return (a, largest)


@njit(error_model="numpy", cache=True, forceinline=True)
def _welford_scale_f64(largest):
    scale = float64(1.0)
    for _ in range(9):
        scale = scale * float64(5.421010862427522e-20) if largest * scale > math.sqrt(float64(1e+308)) * float64(7.62939453125e-06) else scale
    return scale


@njit(error_model="numpy", cache=True, forceinline=True)
def _welford_lift_f64(x, shift, largest):
    scale = _welford_scale_f64(largest)
    deviation = x * scale - shift * scale
    return (float64(1.0), deviation, float64(0.0) * deviation, float64(0.0))


@njit(error_model="numpy", cache=True, forceinline=True)
def _welford_merge_f64(count_a, mean_a, m2_a, compensation_a, count_b, mean_b, m2_b, compensation_b):
    if count_a == float64(0.0):
        return (count_b, mean_b, m2_b, compensation_b)
    if count_b == float64(0.0):
        return (count_a, mean_a, m2_a, compensation_a)
    count = count_a + count_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (count_b / count)
    m2, compensation = neumaier_add_f64(m2_a, compensation_a, m2_b, compensation_b)
    m2, compensation = neumaier_add_f64(m2, compensation, delta * delta * count_a * count_b / count, float64(0.0))
    return (count, mean, m2, compensation)


@njit(error_model="numpy", cache=True, forceinline=True)
def _welford_finish_f64(shift, largest, count, mean, m2, compensation, length):
    if count == float64(0.0):
        return (float64(math.nan), float64(math.nan))
    variance = _compensated_total_f64(m2, compensation) / count
    scale = _welford_scale_f64(largest)
    return ((shift * scale + mean) / scale, variance / scale / scale)


@njit(error_model="numpy", cache=True, forceinline=True)
def _sums_lift_f64(x):
    return (x, float64(0.0), x * float64(2.3283064365386963e-10))


@njit(error_model="numpy", cache=True, forceinline=True)
def _sums_merge_f64(total_a, compensation_a, scaled_a, total_b, compensation_b, scaled_b):
    total, compensation = neumaier_add_f64(total_a, compensation_a, total_b, compensation_b)
    return (total, compensation, scaled_a + scaled_b)


@njit(error_model="numpy", cache=True, forceinline=True)
def _overflowed_f64(total, scaled):
    return not abs(total) <= float64(1e+308) and abs(scaled) <= float64(1e+308)


@njit(error_model="numpy", cache=True, forceinline=True)
def _normalize_value_f64(x, total, compensation, scaled, length):
    total = _compensated_total_f64(total, compensation)
    if _overflowed_f64(total, scaled):
        total = scaled
        x = x * float64(2.3283064365386963e-10)
    if total <= float64(0.0):
        return float64(1.0) / length
    return x / total


@njit(error_model="numpy", cache=True, parallel=True)
def logsumexp_f64_rows(out, xs, blocks):
    length = float64(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_compensation = np.empty(LANES, float64)
        lane_count = np.empty(LANES, float64)
        lane_high = np.empty(LANES, float64)
        lane_rest = np.empty(LANES, float64)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float64)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_high[k] = float64(-math.inf)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f64(values[k])
                        lane_high[k], = _max_merge_f64(lane_high[k], lifted_0)
                for k in range(LANES):
                    lane_count[k] = float64(0.0)
                    lane_rest[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f64(values[k], lane_high[k])
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                for k in range(group):
                    out[first + k] = _logsumexp_finish_f64(lane_high[k], lane_count[k], lane_rest[k], lane_compensation[k], length)
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_high[k] = float64(-math.inf)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f64(values[k])
                        lane_high[k], = _max_merge_f64(lane_high[k], lifted_0)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, = _max_lift_f64(values[k])
                    lane_high[k], = _max_merge_f64(lane_high[k], lifted_0)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_high[k], = _max_merge_f64(lane_high[k], lane_high[k + width])
                high, = lane_high[0],
                for k in range(LANES):
                    lane_count[k] = float64(0.0)
                    lane_rest[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f64(values[k], high)
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, = _exp_lift_f64(values[k], high)
                    lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lane_count[k + width], lane_rest[k + width], lane_compensation[k + width])
                count, rest, compensation, = lane_count[0], lane_rest[0], lane_compensation[0],
                out[row] = _logsumexp_finish_f64(high, count, rest, compensation, length)


@njit(error_model="numpy", cache=True, parallel=True)
def softmax_f64_rows(out, xs, blocks):
    length = float64(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_compensation = np.empty(LANES, float64)
        lane_count = np.empty(LANES, float64)
        lane_high = np.empty(LANES, float64)
        lane_rest = np.empty(LANES, float64)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float64)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_high[k] = float64(-math.inf)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f64(values[k])
                        lane_high[k], = _max_merge_f64(lane_high[k], lifted_0)
                for k in range(LANES):
                    lane_count[k] = float64(0.0)
                    lane_rest[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f64(values[k], lane_high[k])
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                        values[k] = _softmax_share_f64(lifted_0, lifted_1, lifted_2)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        values[k] = _softmax_value_f64(values[k], lane_high[k], lane_count[k], lane_rest[k], lane_compensation[k], length)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        out[first + k, j] = columns[j, k]
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_high[k] = float64(-math.inf)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f64(values[k])
                        lane_high[k], = _max_merge_f64(lane_high[k], lifted_0)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, = _max_lift_f64(values[k])
                    lane_high[k], = _max_merge_f64(lane_high[k], lifted_0)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_high[k], = _max_merge_f64(lane_high[k], lane_high[k + width])
                high, = lane_high[0],
                for k in range(LANES):
                    lane_count[k] = float64(0.0)
                    lane_rest[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    shares = out[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f64(values[k], high)
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                        shares[k] = _softmax_share_f64(lifted_0, lifted_1, lifted_2)
                values = xs[row, chunks * LANES:]
                shares = out[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, = _exp_lift_f64(values[k], high)
                    lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                    shares[k] = _softmax_share_f64(lifted_0, lifted_1, lifted_2)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lane_count[k + width], lane_rest[k + width], lane_compensation[k + width])
                count, rest, compensation, = lane_count[0], lane_rest[0], lane_compensation[0],
                for j in range(xs.shape[1]):
                    out[row, j] = _softmax_value_f64(out[row, j], high, count, rest, compensation, length)


@njit(error_model="numpy", cache=True, parallel=True)
def log_softmax_f64_rows(out, xs, blocks):
    length = float64(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_at_infinity = np.empty(LANES, float64)
        lane_compensation = np.empty(LANES, float64)
        lane_count = np.empty(LANES, float64)
        lane_high = np.empty(LANES, float64)
        lane_log_total = np.empty(LANES, float64)
        lane_rest = np.empty(LANES, float64)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float64)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_high[k] = float64(-math.inf)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f64(values[k])
                        lane_high[k], = _max_merge_f64(lane_high[k], lifted_0)
                for k in range(LANES):
                    lane_count[k] = float64(0.0)
                    lane_rest[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f64(values[k], lane_high[k])
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                for k in range(LANES):
                    lane_high[k], lane_log_total[k], lane_at_infinity[k], = _log_softmax_summary_f64(lane_high[k], lane_count[k], lane_rest[k], lane_compensation[k], length)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        values[k] = _log_softmax_value_f64(values[k], lane_high[k], lane_log_total[k], lane_at_infinity[k])
                for k in range(group):
                    for j in range(xs.shape[1]):
                        out[first + k, j] = columns[j, k]
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_high[k] = float64(-math.inf)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, = _max_lift_f64(values[k])
                        lane_high[k], = _max_merge_f64(lane_high[k], lifted_0)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, = _max_lift_f64(values[k])
                    lane_high[k], = _max_merge_f64(lane_high[k], lifted_0)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_high[k], = _max_merge_f64(lane_high[k], lane_high[k + width])
                high, = lane_high[0],
                for k in range(LANES):
                    lane_count[k] = float64(0.0)
                    lane_rest[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _exp_lift_f64(values[k], high)
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, = _exp_lift_f64(values[k], high)
                    lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lifted_0, lifted_1, lifted_2)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_count[k], lane_rest[k], lane_compensation[k], = _exp_merge_f64(lane_count[k], lane_rest[k], lane_compensation[k], lane_count[k + width], lane_rest[k + width], lane_compensation[k + width])
                count, rest, compensation, = lane_count[0], lane_rest[0], lane_compensation[0],
                high, log_total, at_infinity, = _log_softmax_summary_f64(high, count, rest, compensation, length)
                for j in range(xs.shape[1]):
                    out[row, j] = _log_softmax_value_f64(xs[row, j], high, log_total, at_infinity)


@njit(error_model="numpy", cache=True, parallel=True)
def kahan_sum_f64_rows(out, xs, blocks):
    length = float64(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_compensation = np.empty(LANES, float64)
        lane_scaled = np.empty(LANES, float64)
        lane_total = np.empty(LANES, float64)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float64)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_total[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                    lane_scaled[k] = float64(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _sums_lift_f64(values[k])
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f64(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                for k in range(group):
                    out[first + k] = _kahan_finish_f64(lane_total[k], lane_compensation[k], lane_scaled[k], length)
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_total[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                    lane_scaled[k] = float64(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _sums_lift_f64(values[k])
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f64(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, = _sums_lift_f64(values[k])
                    lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f64(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f64(lane_total[k], lane_compensation[k], lane_scaled[k], lane_total[k + width], lane_compensation[k + width], lane_scaled[k + width])
                total, compensation, scaled, = lane_total[0], lane_compensation[0], lane_scaled[0],
                out[row] = _kahan_finish_f64(total, compensation, scaled, length)


@njit(error_model="numpy", cache=True, parallel=True)
def welford_mean_var_f64_rows(out, xs, blocks):
    length = float64(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_compensation = np.empty(LANES, float64)
        lane_count = np.empty(LANES, float64)
        lane_largest = np.empty(LANES, float64)
        lane_m2 = np.empty(LANES, float64)
        lane_mean = np.empty(LANES, float64)
        lane_shift = np.empty(LANES, float64)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float64)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_shift[k] = float64(math.nan)
                    lane_largest[k] = float64(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, = _shift_lift_f64(values[k])
                        lane_shift[k], lane_largest[k], = _first_merge_f64(lane_shift[k], lane_largest[k], lifted_0, lifted_1)
                for k in range(LANES):
                    lane_count[k] = float64(0.0)
                    lane_mean[k] = float64(0.0)
                    lane_m2[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, lifted_3, = _welford_lift_f64(values[k], lane_shift[k], lane_largest[k])
                        lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], = _welford_merge_f64(lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], lifted_0, lifted_1, lifted_2, lifted_3)
                for k in range(group):
                    result_0, result_1 = _welford_finish_f64(lane_shift[k], lane_largest[k], lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], length)
                    out[first + k, 0] = result_0
                    out[first + k, 1] = result_1
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_shift[k] = float64(math.nan)
                    lane_largest[k] = float64(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, = _shift_lift_f64(values[k])
                        lane_shift[k], lane_largest[k], = _first_merge_f64(lane_shift[k], lane_largest[k], lifted_0, lifted_1)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, = _shift_lift_f64(values[k])
                    lane_shift[k], lane_largest[k], = _first_merge_f64(lane_shift[k], lane_largest[k], lifted_0, lifted_1)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_shift[k], lane_largest[k], = _first_merge_f64(lane_shift[k], lane_largest[k], lane_shift[k + width], lane_largest[k + width])
                shift, largest, = lane_shift[0], lane_largest[0],
                for k in range(LANES):
                    lane_count[k] = float64(0.0)
                    lane_mean[k] = float64(0.0)
                    lane_m2[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, lifted_3, = _welford_lift_f64(values[k], shift, largest)
                        lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], = _welford_merge_f64(lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], lifted_0, lifted_1, lifted_2, lifted_3)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, lifted_3, = _welford_lift_f64(values[k], shift, largest)
                    lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], = _welford_merge_f64(lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], lifted_0, lifted_1, lifted_2, lifted_3)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], = _welford_merge_f64(lane_count[k], lane_mean[k], lane_m2[k], lane_compensation[k], lane_count[k + width], lane_mean[k + width], lane_m2[k + width], lane_compensation[k + width])
                count, mean, m2, compensation, = lane_count[0], lane_mean[0], lane_m2[0], lane_compensation[0],
                result_0, result_1 = _welford_finish_f64(shift, largest, count, mean, m2, compensation, length)
                out[row, 0] = result_0
                out[row, 1] = result_1


@njit(error_model="numpy", cache=True, parallel=True)
def normalize_probs_f64_rows(out, xs, blocks):
    length = float64(xs.shape[1])
    chunks = lane_chunks(xs.shape[1])
    for block in prange(blocks):
        lane_compensation = np.empty(LANES, float64)
        lane_scaled = np.empty(LANES, float64)
        lane_total = np.empty(LANES, float64)
        start, stop = block * xs.shape[0] // blocks, (block + 1) * xs.shape[0] // blocks
        if chunks == 0:
            columns = np.zeros((xs.shape[1], LANES), float64)
            for first in range(start, stop, LANES):
                group = min(LANES, stop - first)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        columns[j, k] = xs[first + k, j]
                for k in range(LANES):
                    lane_total[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                    lane_scaled[k] = float64(0.0)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _sums_lift_f64(values[k])
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f64(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                for j in range(xs.shape[1]):
                    values = columns[j]
                    for k in range(LANES):
                        values[k] = _normalize_value_f64(values[k], lane_total[k], lane_compensation[k], lane_scaled[k], length)
                for k in range(group):
                    for j in range(xs.shape[1]):
                        out[first + k, j] = columns[j, k]
        else:
            for row in range(start, stop):
                for k in range(LANES):
                    lane_total[k] = float64(0.0)
                    lane_compensation[k] = float64(0.0)
                    lane_scaled[k] = float64(0.0)
                for chunk in range(chunks):
                    values = xs[row, chunk * LANES:(chunk + 1) * LANES]
                    for k in range(LANES):
                        lifted_0, lifted_1, lifted_2, = _sums_lift_f64(values[k])
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f64(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                values = xs[row, chunks * LANES:]
                for k in range(values.shape[0]):
                    lifted_0, lifted_1, lifted_2, = _sums_lift_f64(values[k])
                    lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f64(lane_total[k], lane_compensation[k], lane_scaled[k], lifted_0, lifted_1, lifted_2)
                width = LANES
                while width > 1:
                    width //= 2
                    for k in range(width):
                        lane_total[k], lane_compensation[k], lane_scaled[k], = _sums_merge_f64(lane_total[k], lane_compensation[k], lane_scaled[k], lane_total[k + width], lane_compensation[k + width], lane_scaled[k + width])
                total, compensation, scaled, = lane_total[0], lane_compensation[0], lane_scaled[0],
                for j in range(xs.shape[1]):
                    out[row, j] = _normalize_value_f64(xs[row, j], total, compensation, scaled, length)
