"""CUDA kernels generated from steadystep/kernels/numerical_stability.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

from numba import cuda
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cuda.primitives import ROW_THREADS, at, cast_like, math, put  # noqa: F401

# Numba's cache checks only this file: a change to the primitives these kernels inline must
# rewrite it, and test_codegen fails until codegen has
PRIMITIVES_DIGEST = "8081250d6df4c601"


@cuda.jit(device=True, inline="always")
def log1p_f32(x):
    return math.log1p(x)


@cuda.jit(device=True, inline="always")
def exp_f32(x):
    return math.exp(x)


@cuda.jit(device=True, inline="always")
def is_finite_f32(x):
    return x == x and abs(x) <= float32(3.4028234663852886e+38)


@cuda.jit(device=True, inline="always")
def exp_difference_f32(x, y):
    difference = x - y
    virtual = difference - x
    error = x - (difference - virtual) + (-y - virtual)
    term = exp_f32(difference)
    return term + term * error if is_finite_f32(difference) else term


@cuda.jit(device=True, inline="always")
def neumaier_add_f32(sum_a, compensation_a, sum_b, compensation_b):
    total = sum_a + sum_b
    a_larger = abs(sum_a) >= abs(sum_b)
    larger = sum_a if a_larger else sum_b
    smaller = sum_b if a_larger else sum_a
    return (total, compensation_a + compensation_b + (larger - total + smaller))


@cuda.jit(device=True, inline="always")
def sigmoid_stable_f32(x):
    z = exp_f32(-abs(x))
    numerator = float32(1.0) if x >= float32(0.0) else z
    return numerator / (float32(1.0) + z)


@cuda.jit(cache=True)
def sigmoid_stable_f32_kernel(out, x):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = sigmoid_stable_f32(at(x, i))


@cuda.jit(device=True, inline="always")
def softplus_f32(x):
    value = max(x, float32(0.0)) + log1p_f32(exp_f32(-abs(x)))
    return x if x != x else value


@cuda.jit(cache=True)
def softplus_f32_kernel(out, x):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = softplus_f32(at(x, i))


@cuda.jit(device=True, inline="always")
def log_sigmoid_f32(x):
    return -softplus_f32(-x)


@cuda.jit(cache=True)
def log_sigmoid_f32_kernel(out, x):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = log_sigmoid_f32(at(x, i))


@cuda.jit(device=True, inline="always")
def log_add_exp_f32(a, b):
    high = max(a, b)
    value = high + log1p_f32(exp_f32(-abs(a - b)))
    value = high if abs(high) > float32(3.4028234663852886e+38) else value
    return a + b if a != a or b != b else value


@cuda.jit(cache=True)
def log_add_exp_f32_kernel(out, a, b):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = log_add_exp_f32(at(a, i), at(b, i))


@cuda.jit(device=True, inline="always")
def relative_error_f32(approx, exact):
    if abs(exact) < float32(1.1754943508222875e-38):
        return abs(approx - exact)
    return abs(approx - exact) / abs(exact)


@cuda.jit(cache=True)
def relative_error_f32_kernel(out, approx, exact):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = relative_error_f32(at(approx, i), at(exact, i))


@cuda.jit(device=True, inline="always")
def safe_divide_f32(num, den, default):
    if abs(den) < float32(1.1754943508222875e-38):
        return default
    return num / den


@cuda.jit(cache=True)
def safe_divide_f32_kernel(out, num, den, default):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = safe_divide_f32(at(num, i), at(den, i), at(default, i))


@cuda.jit(device=True, inline="always")
def _max_lift_f32(x):
    return (x,)


@cuda.jit(device=True, inline="always")
def _max_merge_f32(a, b):
    return (b if a == a and (b != b or b > a) else a,)


@cuda.jit(device=True, inline="always")
def _exp_lift_f32(x, high):
    share = exp_difference_f32(x, high)
    return (float32(1.0) if x == high else float32(0.0), float32(0.0) if x == high else share, float32(0.0))


@cuda.jit(device=True, inline="always")
def _exp_merge_f32(count_a, rest_a, compensation_a, count_b, rest_b, compensation_b):
    rest, compensation = neumaier_add_f32(rest_a, compensation_a, rest_b, compensation_b)
    return (count_a + count_b, rest, compensation)


@cuda.jit(device=True, inline="always")
def _compensated_total_f32(total, compensation):
    if abs(total) > float32(3.4028234663852886e+38) or total != total:
        return total
    return total + compensation


@cuda.jit(device=True, inline="always")
def _log_total_f32(count, rest, compensation):
    return log1p_f32(count - float32(1.0) + (rest + compensation))


@cuda.jit(device=True, inline="always")
def _logsumexp_finish_f32(high, count, rest, compensation, length):
    if abs(high) > float32(3.4028234663852886e+38) or high != high:
        return high
    return high + _log_total_f32(count, rest, compensation)


@cuda.jit(device=True, inline="always")
def _softmax_share_f32(is_max, share, compensation):
    return is_max + share


@cuda.jit(device=True, inline="always")
def _softmax_value_f32(share, high, count, rest, compensation, length):
    value = share / (count + (rest + compensation)) if is_finite_f32(high) else share / count if high > float32(0.0) else float32(0.0)
    return value if high == high else high


@cuda.jit(device=True, inline="always")
def _log_softmax_summary_f32(high, count, rest, compensation, length):
    return (high, _log_total_f32(count, rest, compensation), -math.log(count) if high > float32(0.0) else -float32(math.inf))


@cuda.jit(device=True, inline="always")
def _log_softmax_value_f32(x, high, log_total, at_infinity):
    shifted = x - high - log_total
    value = shifted if is_finite_f32(high) else at_infinity if x == high else -float32(math.inf)
    return value if high == high else high


@cuda.jit(device=True, inline="always")
def _kahan_finish_f32(total, compensation, scaled, length):
    total = _compensated_total_f32(total, compensation)
    if _overflowed_f32(total, scaled):
        return scaled * float32(4294967296.0)
    return total


@cuda.jit(device=True, inline="always")
def _shift_lift_f32(x):
    if is_finite_f32(x):
        return (x, abs(x))
    return (float32(0.0), float32(0.0))


@cuda.jit(device=True, inline="always")
def _first_merge_f32(a, largest_a, b, largest_b):
    largest = max(largest_a, largest_b)
    if a != a:
        return (b, largest)
    return (a, largest)


@cuda.jit(device=True, inline="always")
def _welford_scale_f32(largest):
    scale = float32(1.0)
    for _ in range(9):
        scale = scale * float32(5.421010862427522e-20) if largest * scale > math.sqrt(float32(3.4028234663852886e+38)) * float32(7.62939453125e-06) else scale
    return scale


@cuda.jit(device=True, inline="always")
def _welford_lift_f32(x, shift, largest):
    scale = _welford_scale_f32(largest)
    deviation = x * scale - shift * scale
    return (float32(1.0), deviation, float32(0.0) * deviation, float32(0.0))


@cuda.jit(device=True, inline="always")
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


@cuda.jit(device=True, inline="always")
def _welford_finish_f32(shift, largest, count, mean, m2, compensation, length):
    if count == float32(0.0):
        return (float32(math.nan), float32(math.nan))
    variance = _compensated_total_f32(m2, compensation) / count
    scale = _welford_scale_f32(largest)
    return ((shift * scale + mean) / scale, variance / scale / scale)


@cuda.jit(device=True, inline="always")
def _sums_lift_f32(x):
    return (x, float32(0.0), x * float32(2.3283064365386963e-10))


@cuda.jit(device=True, inline="always")
def _sums_merge_f32(total_a, compensation_a, scaled_a, total_b, compensation_b, scaled_b):
    total, compensation = neumaier_add_f32(total_a, compensation_a, total_b, compensation_b)
    return (total, compensation, scaled_a + scaled_b)


@cuda.jit(device=True, inline="always")
def _overflowed_f32(total, scaled):
    return not abs(total) <= float32(3.4028234663852886e+38) and abs(scaled) <= float32(3.4028234663852886e+38)


@cuda.jit(device=True, inline="always")
def _normalize_value_f32(x, total, compensation, scaled, length):
    total = _compensated_total_f32(total, compensation)
    if _overflowed_f32(total, scaled):
        total = scaled
        x = x * float32(2.3283064365386963e-10)
    if total <= float32(0.0):
        return float32(1.0) / length
    return x / total


@cuda.jit(cache=True)
def logsumexp_f32_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float32(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float32)
    shared_count = cuda.shared.array(ROW_THREADS, float32)
    shared_high = cuda.shared.array(ROW_THREADS, float32)
    shared_rest = cuda.shared.array(ROW_THREADS, float32)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        high, = float32(-math.inf),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, = _max_lift_f32(xs[row, j])
            high, = _max_merge_f32(high, lifted_0)
        shared_high[thread] = high
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                high, = _max_merge_f32(shared_high[thread], shared_high[thread + step])
                shared_high[thread] = high
            cuda.syncthreads()
            step //= 2
        high = shared_high[0]
        count, rest, compensation, = float32(0.0), float32(0.0), float32(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f32(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f32(count, rest, compensation, lifted_0, lifted_1, lifted_2)
        shared_count[thread] = count
        shared_rest[thread] = rest
        shared_compensation[thread] = compensation
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                count, rest, compensation, = _exp_merge_f32(shared_count[thread], shared_rest[thread], shared_compensation[thread], shared_count[thread + step], shared_rest[thread + step], shared_compensation[thread + step])
                shared_count[thread] = count
                shared_rest[thread] = rest
                shared_compensation[thread] = compensation
            cuda.syncthreads()
            step //= 2
        count = shared_count[0]
        rest = shared_rest[0]
        compensation = shared_compensation[0]
        if thread == 0:
            out[row] = _logsumexp_finish_f32(high, count, rest, compensation, length)
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def logsumexp_f32_short_rows(out, xs):
    length = float32(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        high, = float32(-math.inf),
        for j in range(xs.shape[1]):
            lifted_0, = _max_lift_f32(xs[row, j])
            high, = _max_merge_f32(high, lifted_0)
        count, rest, compensation, = float32(0.0), float32(0.0), float32(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f32(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f32(count, rest, compensation, lifted_0, lifted_1, lifted_2)
        out[row] = _logsumexp_finish_f32(high, count, rest, compensation, length)


@cuda.jit(cache=True)
def softmax_f32_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float32(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float32)
    shared_count = cuda.shared.array(ROW_THREADS, float32)
    shared_high = cuda.shared.array(ROW_THREADS, float32)
    shared_rest = cuda.shared.array(ROW_THREADS, float32)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        high, = float32(-math.inf),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, = _max_lift_f32(xs[row, j])
            high, = _max_merge_f32(high, lifted_0)
        shared_high[thread] = high
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                high, = _max_merge_f32(shared_high[thread], shared_high[thread + step])
                shared_high[thread] = high
            cuda.syncthreads()
            step //= 2
        high = shared_high[0]
        count, rest, compensation, = float32(0.0), float32(0.0), float32(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f32(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f32(count, rest, compensation, lifted_0, lifted_1, lifted_2)
            out[row, j] = _softmax_share_f32(lifted_0, lifted_1, lifted_2)
        shared_count[thread] = count
        shared_rest[thread] = rest
        shared_compensation[thread] = compensation
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                count, rest, compensation, = _exp_merge_f32(shared_count[thread], shared_rest[thread], shared_compensation[thread], shared_count[thread + step], shared_rest[thread + step], shared_compensation[thread + step])
                shared_count[thread] = count
                shared_rest[thread] = rest
                shared_compensation[thread] = compensation
            cuda.syncthreads()
            step //= 2
        count = shared_count[0]
        rest = shared_rest[0]
        compensation = shared_compensation[0]
        for j in range(thread, xs.shape[1], ROW_THREADS):
            out[row, j] = _softmax_value_f32(out[row, j], high, count, rest, compensation, length)
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def softmax_f32_short_rows(out, xs):
    length = float32(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        high, = float32(-math.inf),
        for j in range(xs.shape[1]):
            lifted_0, = _max_lift_f32(xs[row, j])
            high, = _max_merge_f32(high, lifted_0)
        count, rest, compensation, = float32(0.0), float32(0.0), float32(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f32(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f32(count, rest, compensation, lifted_0, lifted_1, lifted_2)
            out[row, j] = _softmax_share_f32(lifted_0, lifted_1, lifted_2)
        for j in range(xs.shape[1]):
            out[row, j] = _softmax_value_f32(out[row, j], high, count, rest, compensation, length)


@cuda.jit(cache=True)
def log_softmax_f32_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float32(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float32)
    shared_count = cuda.shared.array(ROW_THREADS, float32)
    shared_high = cuda.shared.array(ROW_THREADS, float32)
    shared_rest = cuda.shared.array(ROW_THREADS, float32)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        high, = float32(-math.inf),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, = _max_lift_f32(xs[row, j])
            high, = _max_merge_f32(high, lifted_0)
        shared_high[thread] = high
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                high, = _max_merge_f32(shared_high[thread], shared_high[thread + step])
                shared_high[thread] = high
            cuda.syncthreads()
            step //= 2
        high = shared_high[0]
        count, rest, compensation, = float32(0.0), float32(0.0), float32(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f32(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f32(count, rest, compensation, lifted_0, lifted_1, lifted_2)
        shared_count[thread] = count
        shared_rest[thread] = rest
        shared_compensation[thread] = compensation
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                count, rest, compensation, = _exp_merge_f32(shared_count[thread], shared_rest[thread], shared_compensation[thread], shared_count[thread + step], shared_rest[thread + step], shared_compensation[thread + step])
                shared_count[thread] = count
                shared_rest[thread] = rest
                shared_compensation[thread] = compensation
            cuda.syncthreads()
            step //= 2
        count = shared_count[0]
        rest = shared_rest[0]
        compensation = shared_compensation[0]
        high, log_total, at_infinity, = _log_softmax_summary_f32(high, count, rest, compensation, length)
        for j in range(thread, xs.shape[1], ROW_THREADS):
            out[row, j] = _log_softmax_value_f32(xs[row, j], high, log_total, at_infinity)
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def log_softmax_f32_short_rows(out, xs):
    length = float32(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        high, = float32(-math.inf),
        for j in range(xs.shape[1]):
            lifted_0, = _max_lift_f32(xs[row, j])
            high, = _max_merge_f32(high, lifted_0)
        count, rest, compensation, = float32(0.0), float32(0.0), float32(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f32(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f32(count, rest, compensation, lifted_0, lifted_1, lifted_2)
        high, log_total, at_infinity, = _log_softmax_summary_f32(high, count, rest, compensation, length)
        for j in range(xs.shape[1]):
            out[row, j] = _log_softmax_value_f32(xs[row, j], high, log_total, at_infinity)


@cuda.jit(cache=True)
def kahan_sum_f32_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float32(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float32)
    shared_scaled = cuda.shared.array(ROW_THREADS, float32)
    shared_total = cuda.shared.array(ROW_THREADS, float32)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        total, compensation, scaled, = float32(0.0), float32(0.0), float32(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, = _sums_lift_f32(xs[row, j])
            total, compensation, scaled, = _sums_merge_f32(total, compensation, scaled, lifted_0, lifted_1, lifted_2)
        shared_total[thread] = total
        shared_compensation[thread] = compensation
        shared_scaled[thread] = scaled
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                total, compensation, scaled, = _sums_merge_f32(shared_total[thread], shared_compensation[thread], shared_scaled[thread], shared_total[thread + step], shared_compensation[thread + step], shared_scaled[thread + step])
                shared_total[thread] = total
                shared_compensation[thread] = compensation
                shared_scaled[thread] = scaled
            cuda.syncthreads()
            step //= 2
        total = shared_total[0]
        compensation = shared_compensation[0]
        scaled = shared_scaled[0]
        if thread == 0:
            out[row] = _kahan_finish_f32(total, compensation, scaled, length)
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def kahan_sum_f32_short_rows(out, xs):
    length = float32(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        total, compensation, scaled, = float32(0.0), float32(0.0), float32(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, = _sums_lift_f32(xs[row, j])
            total, compensation, scaled, = _sums_merge_f32(total, compensation, scaled, lifted_0, lifted_1, lifted_2)
        out[row] = _kahan_finish_f32(total, compensation, scaled, length)


@cuda.jit(cache=True)
def welford_mean_var_f32_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float32(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float32)
    shared_count = cuda.shared.array(ROW_THREADS, float32)
    shared_largest = cuda.shared.array(ROW_THREADS, float32)
    shared_m2 = cuda.shared.array(ROW_THREADS, float32)
    shared_mean = cuda.shared.array(ROW_THREADS, float32)
    shared_shift = cuda.shared.array(ROW_THREADS, float32)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        shift, largest, = float32(math.nan), float32(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, = _shift_lift_f32(xs[row, j])
            shift, largest, = _first_merge_f32(shift, largest, lifted_0, lifted_1)
        shared_shift[thread] = shift
        shared_largest[thread] = largest
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                shift, largest, = _first_merge_f32(shared_shift[thread], shared_largest[thread], shared_shift[thread + step], shared_largest[thread + step])
                shared_shift[thread] = shift
                shared_largest[thread] = largest
            cuda.syncthreads()
            step //= 2
        shift = shared_shift[0]
        largest = shared_largest[0]
        count, mean, m2, compensation, = float32(0.0), float32(0.0), float32(0.0), float32(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, lifted_3, = _welford_lift_f32(xs[row, j], shift, largest)
            count, mean, m2, compensation, = _welford_merge_f32(count, mean, m2, compensation, lifted_0, lifted_1, lifted_2, lifted_3)
        shared_count[thread] = count
        shared_mean[thread] = mean
        shared_m2[thread] = m2
        shared_compensation[thread] = compensation
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                count, mean, m2, compensation, = _welford_merge_f32(shared_count[thread], shared_mean[thread], shared_m2[thread], shared_compensation[thread], shared_count[thread + step], shared_mean[thread + step], shared_m2[thread + step], shared_compensation[thread + step])
                shared_count[thread] = count
                shared_mean[thread] = mean
                shared_m2[thread] = m2
                shared_compensation[thread] = compensation
            cuda.syncthreads()
            step //= 2
        count = shared_count[0]
        mean = shared_mean[0]
        m2 = shared_m2[0]
        compensation = shared_compensation[0]
        if thread == 0:
            result_0, result_1 = _welford_finish_f32(shift, largest, count, mean, m2, compensation, length)
            out[row, 0] = result_0
            out[row, 1] = result_1
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def welford_mean_var_f32_short_rows(out, xs):
    length = float32(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        shift, largest, = float32(math.nan), float32(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, = _shift_lift_f32(xs[row, j])
            shift, largest, = _first_merge_f32(shift, largest, lifted_0, lifted_1)
        count, mean, m2, compensation, = float32(0.0), float32(0.0), float32(0.0), float32(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, lifted_3, = _welford_lift_f32(xs[row, j], shift, largest)
            count, mean, m2, compensation, = _welford_merge_f32(count, mean, m2, compensation, lifted_0, lifted_1, lifted_2, lifted_3)
        result_0, result_1 = _welford_finish_f32(shift, largest, count, mean, m2, compensation, length)
        out[row, 0] = result_0
        out[row, 1] = result_1


@cuda.jit(cache=True)
def normalize_probs_f32_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float32(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float32)
    shared_scaled = cuda.shared.array(ROW_THREADS, float32)
    shared_total = cuda.shared.array(ROW_THREADS, float32)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        total, compensation, scaled, = float32(0.0), float32(0.0), float32(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, = _sums_lift_f32(xs[row, j])
            total, compensation, scaled, = _sums_merge_f32(total, compensation, scaled, lifted_0, lifted_1, lifted_2)
        shared_total[thread] = total
        shared_compensation[thread] = compensation
        shared_scaled[thread] = scaled
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                total, compensation, scaled, = _sums_merge_f32(shared_total[thread], shared_compensation[thread], shared_scaled[thread], shared_total[thread + step], shared_compensation[thread + step], shared_scaled[thread + step])
                shared_total[thread] = total
                shared_compensation[thread] = compensation
                shared_scaled[thread] = scaled
            cuda.syncthreads()
            step //= 2
        total = shared_total[0]
        compensation = shared_compensation[0]
        scaled = shared_scaled[0]
        for j in range(thread, xs.shape[1], ROW_THREADS):
            out[row, j] = _normalize_value_f32(xs[row, j], total, compensation, scaled, length)
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def normalize_probs_f32_short_rows(out, xs):
    length = float32(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        total, compensation, scaled, = float32(0.0), float32(0.0), float32(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, = _sums_lift_f32(xs[row, j])
            total, compensation, scaled, = _sums_merge_f32(total, compensation, scaled, lifted_0, lifted_1, lifted_2)
        for j in range(xs.shape[1]):
            out[row, j] = _normalize_value_f32(xs[row, j], total, compensation, scaled, length)


@cuda.jit(device=True, inline="always")
def log1p_f64(x):
    return math.log1p(x)


@cuda.jit(device=True, inline="always")
def exp_f64(x):
    return math.exp(x)


@cuda.jit(device=True, inline="always")
def is_finite_f64(x):
    return x == x and abs(x) <= float64(1e+308)


@cuda.jit(device=True, inline="always")
def exp_difference_f64(x, y):
    difference = x - y
    virtual = difference - x
    error = x - (difference - virtual) + (-y - virtual)
    term = exp_f64(difference)
    return term + term * error if is_finite_f64(difference) else term


@cuda.jit(device=True, inline="always")
def neumaier_add_f64(sum_a, compensation_a, sum_b, compensation_b):
    total = sum_a + sum_b
    a_larger = abs(sum_a) >= abs(sum_b)
    larger = sum_a if a_larger else sum_b
    smaller = sum_b if a_larger else sum_a
    return (total, compensation_a + compensation_b + (larger - total + smaller))


@cuda.jit(device=True, inline="always")
def sigmoid_stable_f64(x):
    z = exp_f64(-abs(x))
    numerator = float64(1.0) if x >= float64(0.0) else z
    return numerator / (float64(1.0) + z)


@cuda.jit(cache=True)
def sigmoid_stable_f64_kernel(out, x):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = sigmoid_stable_f64(at(x, i))


@cuda.jit(device=True, inline="always")
def softplus_f64(x):
    value = max(x, float64(0.0)) + log1p_f64(exp_f64(-abs(x)))
    return x if x != x else value


@cuda.jit(cache=True)
def softplus_f64_kernel(out, x):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = softplus_f64(at(x, i))


@cuda.jit(device=True, inline="always")
def log_sigmoid_f64(x):
    return -softplus_f64(-x)


@cuda.jit(cache=True)
def log_sigmoid_f64_kernel(out, x):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = log_sigmoid_f64(at(x, i))


@cuda.jit(device=True, inline="always")
def log_add_exp_f64(a, b):
    high = max(a, b)
    value = high + log1p_f64(exp_f64(-abs(a - b)))
    value = high if abs(high) > float64(1e+308) else value
    return a + b if a != a or b != b else value


@cuda.jit(cache=True)
def log_add_exp_f64_kernel(out, a, b):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = log_add_exp_f64(at(a, i), at(b, i))


@cuda.jit(device=True, inline="always")
def relative_error_f64(approx, exact):
    if abs(exact) < float64(1e-300):
        return abs(approx - exact)
    return abs(approx - exact) / abs(exact)


@cuda.jit(cache=True)
def relative_error_f64_kernel(out, approx, exact):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = relative_error_f64(at(approx, i), at(exact, i))


@cuda.jit(device=True, inline="always")
def safe_divide_f64(num, den, default):
    if abs(den) < float64(1e-300):
        return default
    return num / den


@cuda.jit(cache=True)
def safe_divide_f64_kernel(out, num, den, default):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = safe_divide_f64(at(num, i), at(den, i), at(default, i))


@cuda.jit(device=True, inline="always")
def _max_lift_f64(x):
    return (x,)


@cuda.jit(device=True, inline="always")
def _max_merge_f64(a, b):
    return (b if a == a and (b != b or b > a) else a,)


@cuda.jit(device=True, inline="always")
def _exp_lift_f64(x, high):
    share = exp_difference_f64(x, high)
    return (float64(1.0) if x == high else float64(0.0), float64(0.0) if x == high else share, float64(0.0))


@cuda.jit(device=True, inline="always")
def _exp_merge_f64(count_a, rest_a, compensation_a, count_b, rest_b, compensation_b):
    rest, compensation = neumaier_add_f64(rest_a, compensation_a, rest_b, compensation_b)
    return (count_a + count_b, rest, compensation)


@cuda.jit(device=True, inline="always")
def _compensated_total_f64(total, compensation):
    if abs(total) > float64(1e+308) or total != total:
        return total
    return total + compensation


@cuda.jit(device=True, inline="always")
def _log_total_f64(count, rest, compensation):
    return log1p_f64(count - float64(1.0) + (rest + compensation))


@cuda.jit(device=True, inline="always")
def _logsumexp_finish_f64(high, count, rest, compensation, length):
    if abs(high) > float64(1e+308) or high != high:
        return high
    return high + _log_total_f64(count, rest, compensation)


@cuda.jit(device=True, inline="always")
def _softmax_share_f64(is_max, share, compensation):
    return is_max + share


@cuda.jit(device=True, inline="always")
def _softmax_value_f64(share, high, count, rest, compensation, length):
    value = share / (count + (rest + compensation)) if is_finite_f64(high) else share / count if high > float64(0.0) else float64(0.0)
    return value if high == high else high


@cuda.jit(device=True, inline="always")
def _log_softmax_summary_f64(high, count, rest, compensation, length):
    return (high, _log_total_f64(count, rest, compensation), -math.log(count) if high > float64(0.0) else -float64(math.inf))


@cuda.jit(device=True, inline="always")
def _log_softmax_value_f64(x, high, log_total, at_infinity):
    shifted = x - high - log_total
    value = shifted if is_finite_f64(high) else at_infinity if x == high else -float64(math.inf)
    return value if high == high else high


@cuda.jit(device=True, inline="always")
def _kahan_finish_f64(total, compensation, scaled, length):
    total = _compensated_total_f64(total, compensation)
    if _overflowed_f64(total, scaled):
        return scaled * float64(4294967296.0)
    return total


@cuda.jit(device=True, inline="always")
def _shift_lift_f64(x):
    if is_finite_f64(x):
        return (x, abs(x))
    return (float64(0.0), float64(0.0))


@cuda.jit(device=True, inline="always")
def _first_merge_f64(a, largest_a, b, largest_b):
    largest = max(largest_a, largest_b)
    if a != a:
        return (b, largest)
    return (a, largest)


@cuda.jit(device=True, inline="always")
def _welford_scale_f64(largest):
    scale = float64(1.0)
    for _ in range(9):
        scale = scale * float64(5.421010862427522e-20) if largest * scale > math.sqrt(float64(1e+308)) * float64(7.62939453125e-06) else scale
    return scale


@cuda.jit(device=True, inline="always")
def _welford_lift_f64(x, shift, largest):
    scale = _welford_scale_f64(largest)
    deviation = x * scale - shift * scale
    return (float64(1.0), deviation, float64(0.0) * deviation, float64(0.0))


@cuda.jit(device=True, inline="always")
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


@cuda.jit(device=True, inline="always")
def _welford_finish_f64(shift, largest, count, mean, m2, compensation, length):
    if count == float64(0.0):
        return (float64(math.nan), float64(math.nan))
    variance = _compensated_total_f64(m2, compensation) / count
    scale = _welford_scale_f64(largest)
    return ((shift * scale + mean) / scale, variance / scale / scale)


@cuda.jit(device=True, inline="always")
def _sums_lift_f64(x):
    return (x, float64(0.0), x * float64(2.3283064365386963e-10))


@cuda.jit(device=True, inline="always")
def _sums_merge_f64(total_a, compensation_a, scaled_a, total_b, compensation_b, scaled_b):
    total, compensation = neumaier_add_f64(total_a, compensation_a, total_b, compensation_b)
    return (total, compensation, scaled_a + scaled_b)


@cuda.jit(device=True, inline="always")
def _overflowed_f64(total, scaled):
    return not abs(total) <= float64(1e+308) and abs(scaled) <= float64(1e+308)


@cuda.jit(device=True, inline="always")
def _normalize_value_f64(x, total, compensation, scaled, length):
    total = _compensated_total_f64(total, compensation)
    if _overflowed_f64(total, scaled):
        total = scaled
        x = x * float64(2.3283064365386963e-10)
    if total <= float64(0.0):
        return float64(1.0) / length
    return x / total


@cuda.jit(cache=True)
def logsumexp_f64_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float64(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float64)
    shared_count = cuda.shared.array(ROW_THREADS, float64)
    shared_high = cuda.shared.array(ROW_THREADS, float64)
    shared_rest = cuda.shared.array(ROW_THREADS, float64)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        high, = float64(-math.inf),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, = _max_lift_f64(xs[row, j])
            high, = _max_merge_f64(high, lifted_0)
        shared_high[thread] = high
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                high, = _max_merge_f64(shared_high[thread], shared_high[thread + step])
                shared_high[thread] = high
            cuda.syncthreads()
            step //= 2
        high = shared_high[0]
        count, rest, compensation, = float64(0.0), float64(0.0), float64(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f64(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f64(count, rest, compensation, lifted_0, lifted_1, lifted_2)
        shared_count[thread] = count
        shared_rest[thread] = rest
        shared_compensation[thread] = compensation
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                count, rest, compensation, = _exp_merge_f64(shared_count[thread], shared_rest[thread], shared_compensation[thread], shared_count[thread + step], shared_rest[thread + step], shared_compensation[thread + step])
                shared_count[thread] = count
                shared_rest[thread] = rest
                shared_compensation[thread] = compensation
            cuda.syncthreads()
            step //= 2
        count = shared_count[0]
        rest = shared_rest[0]
        compensation = shared_compensation[0]
        if thread == 0:
            out[row] = _logsumexp_finish_f64(high, count, rest, compensation, length)
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def logsumexp_f64_short_rows(out, xs):
    length = float64(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        high, = float64(-math.inf),
        for j in range(xs.shape[1]):
            lifted_0, = _max_lift_f64(xs[row, j])
            high, = _max_merge_f64(high, lifted_0)
        count, rest, compensation, = float64(0.0), float64(0.0), float64(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f64(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f64(count, rest, compensation, lifted_0, lifted_1, lifted_2)
        out[row] = _logsumexp_finish_f64(high, count, rest, compensation, length)


@cuda.jit(cache=True)
def softmax_f64_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float64(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float64)
    shared_count = cuda.shared.array(ROW_THREADS, float64)
    shared_high = cuda.shared.array(ROW_THREADS, float64)
    shared_rest = cuda.shared.array(ROW_THREADS, float64)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        high, = float64(-math.inf),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, = _max_lift_f64(xs[row, j])
            high, = _max_merge_f64(high, lifted_0)
        shared_high[thread] = high
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                high, = _max_merge_f64(shared_high[thread], shared_high[thread + step])
                shared_high[thread] = high
            cuda.syncthreads()
            step //= 2
        high = shared_high[0]
        count, rest, compensation, = float64(0.0), float64(0.0), float64(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f64(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f64(count, rest, compensation, lifted_0, lifted_1, lifted_2)
            out[row, j] = _softmax_share_f64(lifted_0, lifted_1, lifted_2)
        shared_count[thread] = count
        shared_rest[thread] = rest
        shared_compensation[thread] = compensation
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                count, rest, compensation, = _exp_merge_f64(shared_count[thread], shared_rest[thread], shared_compensation[thread], shared_count[thread + step], shared_rest[thread + step], shared_compensation[thread + step])
                shared_count[thread] = count
                shared_rest[thread] = rest
                shared_compensation[thread] = compensation
            cuda.syncthreads()
            step //= 2
        count = shared_count[0]
        rest = shared_rest[0]
        compensation = shared_compensation[0]
        for j in range(thread, xs.shape[1], ROW_THREADS):
            out[row, j] = _softmax_value_f64(out[row, j], high, count, rest, compensation, length)
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def softmax_f64_short_rows(out, xs):
    length = float64(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        high, = float64(-math.inf),
        for j in range(xs.shape[1]):
            lifted_0, = _max_lift_f64(xs[row, j])
            high, = _max_merge_f64(high, lifted_0)
        count, rest, compensation, = float64(0.0), float64(0.0), float64(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f64(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f64(count, rest, compensation, lifted_0, lifted_1, lifted_2)
            out[row, j] = _softmax_share_f64(lifted_0, lifted_1, lifted_2)
        for j in range(xs.shape[1]):
            out[row, j] = _softmax_value_f64(out[row, j], high, count, rest, compensation, length)


@cuda.jit(cache=True)
def log_softmax_f64_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float64(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float64)
    shared_count = cuda.shared.array(ROW_THREADS, float64)
    shared_high = cuda.shared.array(ROW_THREADS, float64)
    shared_rest = cuda.shared.array(ROW_THREADS, float64)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        high, = float64(-math.inf),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, = _max_lift_f64(xs[row, j])
            high, = _max_merge_f64(high, lifted_0)
        shared_high[thread] = high
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                high, = _max_merge_f64(shared_high[thread], shared_high[thread + step])
                shared_high[thread] = high
            cuda.syncthreads()
            step //= 2
        high = shared_high[0]
        count, rest, compensation, = float64(0.0), float64(0.0), float64(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f64(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f64(count, rest, compensation, lifted_0, lifted_1, lifted_2)
        shared_count[thread] = count
        shared_rest[thread] = rest
        shared_compensation[thread] = compensation
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                count, rest, compensation, = _exp_merge_f64(shared_count[thread], shared_rest[thread], shared_compensation[thread], shared_count[thread + step], shared_rest[thread + step], shared_compensation[thread + step])
                shared_count[thread] = count
                shared_rest[thread] = rest
                shared_compensation[thread] = compensation
            cuda.syncthreads()
            step //= 2
        count = shared_count[0]
        rest = shared_rest[0]
        compensation = shared_compensation[0]
        high, log_total, at_infinity, = _log_softmax_summary_f64(high, count, rest, compensation, length)
        for j in range(thread, xs.shape[1], ROW_THREADS):
            out[row, j] = _log_softmax_value_f64(xs[row, j], high, log_total, at_infinity)
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def log_softmax_f64_short_rows(out, xs):
    length = float64(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        high, = float64(-math.inf),
        for j in range(xs.shape[1]):
            lifted_0, = _max_lift_f64(xs[row, j])
            high, = _max_merge_f64(high, lifted_0)
        count, rest, compensation, = float64(0.0), float64(0.0), float64(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, = _exp_lift_f64(xs[row, j], high)
            count, rest, compensation, = _exp_merge_f64(count, rest, compensation, lifted_0, lifted_1, lifted_2)
        high, log_total, at_infinity, = _log_softmax_summary_f64(high, count, rest, compensation, length)
        for j in range(xs.shape[1]):
            out[row, j] = _log_softmax_value_f64(xs[row, j], high, log_total, at_infinity)


@cuda.jit(cache=True)
def kahan_sum_f64_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float64(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float64)
    shared_scaled = cuda.shared.array(ROW_THREADS, float64)
    shared_total = cuda.shared.array(ROW_THREADS, float64)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        total, compensation, scaled, = float64(0.0), float64(0.0), float64(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, = _sums_lift_f64(xs[row, j])
            total, compensation, scaled, = _sums_merge_f64(total, compensation, scaled, lifted_0, lifted_1, lifted_2)
        shared_total[thread] = total
        shared_compensation[thread] = compensation
        shared_scaled[thread] = scaled
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                total, compensation, scaled, = _sums_merge_f64(shared_total[thread], shared_compensation[thread], shared_scaled[thread], shared_total[thread + step], shared_compensation[thread + step], shared_scaled[thread + step])
                shared_total[thread] = total
                shared_compensation[thread] = compensation
                shared_scaled[thread] = scaled
            cuda.syncthreads()
            step //= 2
        total = shared_total[0]
        compensation = shared_compensation[0]
        scaled = shared_scaled[0]
        if thread == 0:
            out[row] = _kahan_finish_f64(total, compensation, scaled, length)
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def kahan_sum_f64_short_rows(out, xs):
    length = float64(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        total, compensation, scaled, = float64(0.0), float64(0.0), float64(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, = _sums_lift_f64(xs[row, j])
            total, compensation, scaled, = _sums_merge_f64(total, compensation, scaled, lifted_0, lifted_1, lifted_2)
        out[row] = _kahan_finish_f64(total, compensation, scaled, length)


@cuda.jit(cache=True)
def welford_mean_var_f64_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float64(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float64)
    shared_count = cuda.shared.array(ROW_THREADS, float64)
    shared_largest = cuda.shared.array(ROW_THREADS, float64)
    shared_m2 = cuda.shared.array(ROW_THREADS, float64)
    shared_mean = cuda.shared.array(ROW_THREADS, float64)
    shared_shift = cuda.shared.array(ROW_THREADS, float64)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        shift, largest, = float64(math.nan), float64(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, = _shift_lift_f64(xs[row, j])
            shift, largest, = _first_merge_f64(shift, largest, lifted_0, lifted_1)
        shared_shift[thread] = shift
        shared_largest[thread] = largest
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                shift, largest, = _first_merge_f64(shared_shift[thread], shared_largest[thread], shared_shift[thread + step], shared_largest[thread + step])
                shared_shift[thread] = shift
                shared_largest[thread] = largest
            cuda.syncthreads()
            step //= 2
        shift = shared_shift[0]
        largest = shared_largest[0]
        count, mean, m2, compensation, = float64(0.0), float64(0.0), float64(0.0), float64(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, lifted_3, = _welford_lift_f64(xs[row, j], shift, largest)
            count, mean, m2, compensation, = _welford_merge_f64(count, mean, m2, compensation, lifted_0, lifted_1, lifted_2, lifted_3)
        shared_count[thread] = count
        shared_mean[thread] = mean
        shared_m2[thread] = m2
        shared_compensation[thread] = compensation
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                count, mean, m2, compensation, = _welford_merge_f64(shared_count[thread], shared_mean[thread], shared_m2[thread], shared_compensation[thread], shared_count[thread + step], shared_mean[thread + step], shared_m2[thread + step], shared_compensation[thread + step])
                shared_count[thread] = count
                shared_mean[thread] = mean
                shared_m2[thread] = m2
                shared_compensation[thread] = compensation
            cuda.syncthreads()
            step //= 2
        count = shared_count[0]
        mean = shared_mean[0]
        m2 = shared_m2[0]
        compensation = shared_compensation[0]
        if thread == 0:
            result_0, result_1 = _welford_finish_f64(shift, largest, count, mean, m2, compensation, length)
            out[row, 0] = result_0
            out[row, 1] = result_1
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def welford_mean_var_f64_short_rows(out, xs):
    length = float64(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        shift, largest, = float64(math.nan), float64(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, = _shift_lift_f64(xs[row, j])
            shift, largest, = _first_merge_f64(shift, largest, lifted_0, lifted_1)
        count, mean, m2, compensation, = float64(0.0), float64(0.0), float64(0.0), float64(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, lifted_3, = _welford_lift_f64(xs[row, j], shift, largest)
            count, mean, m2, compensation, = _welford_merge_f64(count, mean, m2, compensation, lifted_0, lifted_1, lifted_2, lifted_3)
        result_0, result_1 = _welford_finish_f64(shift, largest, count, mean, m2, compensation, length)
        out[row, 0] = result_0
        out[row, 1] = result_1


@cuda.jit(cache=True)
def normalize_probs_f64_rows(out, xs):
    thread = cuda.threadIdx.x
    length = float64(xs.shape[1])
    shared_compensation = cuda.shared.array(ROW_THREADS, float64)
    shared_scaled = cuda.shared.array(ROW_THREADS, float64)
    shared_total = cuda.shared.array(ROW_THREADS, float64)
    for row in range(cuda.blockIdx.x, xs.shape[0], cuda.gridDim.x):
        total, compensation, scaled, = float64(0.0), float64(0.0), float64(0.0),
        for j in range(thread, xs.shape[1], ROW_THREADS):
            lifted_0, lifted_1, lifted_2, = _sums_lift_f64(xs[row, j])
            total, compensation, scaled, = _sums_merge_f64(total, compensation, scaled, lifted_0, lifted_1, lifted_2)
        shared_total[thread] = total
        shared_compensation[thread] = compensation
        shared_scaled[thread] = scaled
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if thread < step:
                total, compensation, scaled, = _sums_merge_f64(shared_total[thread], shared_compensation[thread], shared_scaled[thread], shared_total[thread + step], shared_compensation[thread + step], shared_scaled[thread + step])
                shared_total[thread] = total
                shared_compensation[thread] = compensation
                shared_scaled[thread] = scaled
            cuda.syncthreads()
            step //= 2
        total = shared_total[0]
        compensation = shared_compensation[0]
        scaled = shared_scaled[0]
        for j in range(thread, xs.shape[1], ROW_THREADS):
            out[row, j] = _normalize_value_f64(xs[row, j], total, compensation, scaled, length)
        cuda.syncthreads()  # the next row reuses the shared arrays


@cuda.jit(cache=True)
def normalize_probs_f64_short_rows(out, xs):
    length = float64(xs.shape[1])
    for row in range(cuda.grid(1), xs.shape[0], cuda.gridsize(1)):
        total, compensation, scaled, = float64(0.0), float64(0.0), float64(0.0),
        for j in range(xs.shape[1]):
            lifted_0, lifted_1, lifted_2, = _sums_lift_f64(xs[row, j])
            total, compensation, scaled, = _sums_merge_f64(total, compensation, scaled, lifted_0, lifted_1, lifted_2)
        for j in range(xs.shape[1]):
            out[row, j] = _normalize_value_f64(xs[row, j], total, compensation, scaled, length)
