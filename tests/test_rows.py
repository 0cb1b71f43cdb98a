"""Row functions (along the last axis) against exact references, SPEC edge cases and SciPy."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import special

import steadystep
from steadystep import _arrays
from steadystep.cpu.primitives import LANES, TILE, copy_transposed
from tests.conftest import SIMULATOR
from tests.helpers import assert_ulp_close

ns = steadystep.numerical_stability
inf, nan = math.inf, math.nan
LONG = 70 if SIMULATOR else 1000  # longer than a GPU block (32 threads simulated, 256 real)

# -- exact references (mpmath at 60 digits) -----------------------------------------------------

mpmath.mp.dps = 60


def exact_log_total(finite):
    """log Σ exp(x − max) as log1p of the other terms: log(1 + 1e-56) at 60 digits would lose it."""
    values = sorted(finite, reverse=True)
    high = values[0]
    return high, mpmath.log1p(mpmath.fsum(mpmath.exp(x - high) for x in values[1:]))


def exact_logsumexp(row):
    if any(math.isnan(x) for x in row):
        return nan
    if inf in row:
        return inf
    finite = [mpmath.mpf(float(x)) for x in row if x != -inf]
    if not finite:
        return -inf
    high, log_total = exact_log_total(finite)
    return float(high + log_total)


def exact_log_softmax(row):
    if any(math.isnan(x) for x in row):
        return [nan] * len(row)
    finite = [mpmath.mpf(float(x)) for x in row if x != -inf]
    if inf in row:
        count = list(row).count(inf)
        return [-math.log(count) if x == inf else -inf for x in row]
    if not finite:
        return [-inf] * len(row)
    high, log_total = exact_log_total(finite)
    return [float(mpmath.mpf(float(x)) - high - log_total) if x != -inf else -inf for x in row]


def exact_softmax(row):
    return (
        [math.exp(v) if v != -inf else 0.0 for v in exact_log_softmax(row)]
        if not any(math.isnan(x) for x in row)
        else [nan] * len(row)
    )


def exact_softmax_mp(row):
    """softmax to the last bit: exp of the exact log-softmax, taken in mpmath."""
    if any(math.isnan(x) for x in row) or inf in row or all(x == -inf for x in row):
        return exact_softmax(row)
    finite = [mpmath.mpf(float(x)) for x in row if x != -inf]
    high = max(finite)
    total = mpmath.fsum(mpmath.exp(x - high) for x in finite)
    return [float(mpmath.exp(mpmath.mpf(float(x)) - high) / total) if x != -inf else 0.0 for x in row]


def apply_rows(function, xs, dtype):
    xs = np.asarray(xs)
    results = [function(list(map(float, row))) for row in xs.reshape(-1, xs.shape[-1])]
    return np.asarray(results, dtype=dtype).reshape(
        xs.shape[:-1] + np.asarray(results[0]).shape if results else xs.shape[:-1]
    )


def random_rows(rng, dtype, rows, length, scale):
    return (rng.normal(size=(rows, length)) * scale).astype(dtype)


# -- the SPEC's edge cases, one table ------------------------------------------------------------

EDGE_CASES = [
    ("logsumexp", [], -inf),
    ("logsumexp", [-inf, -inf], -inf),
    ("logsumexp", [inf, -inf], inf),
    ("logsumexp", [1.0, inf, 2.0], inf),
    ("logsumexp", [1.0, nan, inf], nan),
    ("logsumexp", [1000.0, 1000.0], 1000.6931471805599),
    ("logsumexp", [0.0, -40.0], 4.248354255291589e-18),
    ("logsumexp", [-1e308, 1e308], 1e308),
    ("softmax", [-inf, -inf, -inf], [0.0, 0.0, 0.0]),
    ("softmax", [inf, 1.0, inf], [0.5, 0.0, 0.5]),
    ("softmax", [1.0, nan, 2.0], [nan, nan, nan]),
    ("softmax", [], []),
    ("softmax", [0.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]),
    ("log_softmax", [0.0, -40.0], [-4.248354255291589e-18, -40.0]),
    ("log_softmax", [-inf, -inf], [-inf, -inf]),
    ("log_softmax", [inf, 0.0], [0.0, -inf]),
    ("log_softmax", [nan, 0.0], [nan, nan]),
    ("kahan_sum", [1.0, 1e100, 1.0, -1e100], 2.0),
    ("kahan_sum", [inf, 1.0], inf),
    ("kahan_sum", [inf, -inf], nan),
    ("kahan_sum", [nan, 1.0], nan),
    ("kahan_sum", [], 0.0),
    ("kahan_sum", [0.1] * 100_000, 10000.0),
    ("kahan_sum", [1e308, 1e308, -1e308], 1e308),  # the running sum overflows, the sum does not
    ("kahan_sum", [1e308, 1e308, -1e308, -1e308], 0.0),  # and on the GPU its halves meet as inf − inf
    ("kahan_sum", [1e308, 1e308], inf),
    ("kahan_sum", [inf, -1e308, -1e308], inf),
    ("welford_mean_var", [1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 2.0]),
    ("welford_mean_var", [1e9 + 4, 1e9 + 7, 1e9 + 13, 1e9 + 16], [1e9 + 10, 22.5]),
    ("welford_mean_var", [0.1] * 1000, [0.1, 0.0]),
    ("welford_mean_var", [], [nan, nan]),
    ("welford_mean_var", [1.0, nan], [nan, nan]),
    ("welford_mean_var", [nan], [nan, nan]),
    ("welford_mean_var", [inf], [inf, nan]),
    ("welford_mean_var", [1e308, -1e308], [0.0, inf]),  # x − x₀ overflows unless scaled
    ("welford_mean_var", [1e308, 1e308, 1e308], [1e308, 0.0]),
    ("normalize_probs", [1.0, 3.0], [0.25, 0.75]),
    ("normalize_probs", [0.0, 0.0], [0.5, 0.5]),
    ("normalize_probs", [-1.0, -2.0, 0.0, -1.0], [0.25, 0.25, 0.25, 0.25]),
    ("normalize_probs", [1.0, nan], [nan, nan]),
    ("normalize_probs", [], []),
    ("normalize_probs", [1e308, 1e308], [0.5, 0.5]),  # Σ x overflows
    ("normalize_probs", [1e308, 1e308, -1e308], [1.0, 1.0, -1.0]),
    # the running sum overflows to −inf (and on the GPU meets +inf in a merge), the true sum is 1e308 > 0
    ("normalize_probs", [-1e308, -1e308, 1e308, 1e308, 1e308], [-1.0, -1.0, 1.0, 1.0, 1.0]),
]


@pytest.mark.parametrize(
    "name, row, expected", EDGE_CASES, ids=lambda v: str(v)[:30] if not isinstance(v, list) else None
)
def test_spec_edge_cases(name, row, expected, target):
    if SIMULATOR and len(row) > LONG:
        row = row[:LONG]
        expected = {"kahan_sum": math.fsum(row), "welford_mean_var": [0.1, 0.0]}[name]
    result = getattr(ns, name)(np.array(row, dtype=np.float64), target=target)
    assert_ulp_close(np.asarray(result), np.asarray(expected, dtype=np.float64), 0, context=f"{name}({row[:6]})")


# -- accuracy against mpmath ---------------------------------------------------------------------

SCALES = [1.0, 30.0, 1000.0, 1e300]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("scale", SCALES)
def test_logsumexp_and_log_softmax_within_4_ulp_of_mpmath(dtype, scale, target):
    if dtype == np.float32 and scale > 1e30:
        scale = 1e37
    rng = np.random.default_rng(int(scale) % 1000)
    xs = random_rows(rng, dtype, 3, 40, scale)
    xs[0, :5] = -inf
    lse = ns.logsumexp(xs, target=target)
    expected = apply_rows(exact_logsumexp, xs, dtype)
    # m + log(Σ) cancels when the max is near −log(Σ): the error is then bounded by the
    # terms' size, not the result's (scipy and every max-shifted method share this).
    high = np.max(xs, axis=-1).astype(np.float64)
    atol = 4 * np.finfo(dtype).eps * (np.abs(high) + np.log(xs.shape[-1]))
    assert_ulp_close(lse, expected, 4, atol, context="logsumexp")
    assert_ulp_close(
        ns.log_softmax(xs, target=target), apply_rows(exact_log_softmax, xs, dtype), 4, context="log_softmax"
    )
    assert_ulp_close(ns.softmax(xs, target=target), apply_rows(exact_softmax_mp, xs, dtype), 4, context="softmax")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kahan_sum_agrees_with_fsum_to_one_ulp(dtype, target):
    rng = np.random.default_rng(5)
    magnitudes = 10.0 ** rng.uniform(-10, 10, size=(4, LONG))
    xs = np.where(rng.random((4, LONG)) < 0.5, -magnitudes, magnitudes).astype(dtype)
    expected = np.array([math.fsum(map(float, row)) for row in xs], dtype=dtype)
    assert_ulp_close(ns.kahan_sum(xs, target=target), expected, 1, context="kahan_sum")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_welford_matches_exact_mean_and_variance(dtype, target):
    rng = np.random.default_rng(9)
    xs = (rng.normal(size=(3, LONG)) + 1e4).astype(dtype)

    def exact(row):
        values = [mpmath.mpf(float(x)) for x in row]
        mean = mpmath.fsum(values) / len(values)
        return [float(mean), float(mpmath.fsum((v - mean) ** 2 for v in values) / len(values))]

    result = ns.welford_mean_var(xs, target=target)
    expected = apply_rows(exact, xs, dtype)
    # Offset data (mean/std = 1e4) is where the textbook formula loses everything; the
    # shifted, compensated Welford keeps the mean to 2 ulp and the variance to 4.
    assert_ulp_close(result[:, 0], expected[:, 0], 2, context="mean")
    assert_ulp_close(result[:, 1], expected[:, 1], 4, context="variance")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rows_near_the_dtypes_largest_value(dtype, target):
    """Welford's x − x₀ and normalize_probs' Σ x overflow there; the results must not."""
    largest = float(np.finfo(dtype).max)
    rng = np.random.default_rng(11)
    xs = (rng.uniform(-1, 1, size=(3, 40)) * largest).astype(dtype)
    xs[0, :2] = largest, -largest
    mean, variance = np.asarray(ns.welford_mean_var(xs, target=target)).T
    exact = [float(mpmath.fsum(mpmath.mpf(float(x)) for x in row) / len(row)) for row in xs]
    # shifted Welford's mean is accurate to a few ulp of the row's largest magnitude
    np.testing.assert_allclose(mean, exact, rtol=0, atol=8 * np.finfo(dtype).eps * largest)
    assert np.all(variance == inf)  # the true variances (≈ largest²/3) are beyond the dtype's range
    positive = np.abs(xs)
    expected = apply_rows(
        lambda row: [float(mpmath.mpf(float(x)) / mpmath.fsum(map(float, row))) for x in row], positive, dtype
    )
    # the sum that did not overflow is a plain one: a few ulp (the compensated sum keeps 1 elsewhere)
    assert_ulp_close(ns.normalize_probs(positive, target=target), expected, 4, context="normalize_probs")
    halves = rng.uniform(0.5, 1.0, 20) * largest
    cancelling = np.concatenate([halves, -halves[::-1] * 0.999]).astype(dtype)  # the running sum overflows, Σ does not
    exact = float(mpmath.fsum(mpmath.mpf(float(x)) for x in cancelling))
    np.testing.assert_allclose(
        ns.kahan_sum(cancelling, target=target), exact, rtol=0, atol=64 * np.finfo(dtype).eps * largest
    )


@pytest.mark.parametrize("dtype, sigma", [(np.float32, 1e18), (np.float64, 1e153)])
def test_welford_variance_whose_sum_of_squares_would_overflow(dtype, sigma, target):
    """n·var beyond the dtype's range, var itself within it (NumPy's float32 var gives inf
    here): Welford runs on values scaled by a power of two."""
    xs = (np.random.default_rng(12).normal(size=(2, 1000)) * sigma).astype(dtype)

    def exact(row):
        values = [mpmath.mpf(float(x)) for x in row]
        mean = mpmath.fsum(values) / len(values)
        return [float(mean), float(mpmath.fsum((v - mean) ** 2 for v in values) / len(values))]

    expected = apply_rows(exact, xs, np.float64)
    result = np.asarray(ns.welford_mean_var(xs, target=target), np.float64)
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(result[:, 0], expected[:, 0], rtol=0, atol=8 * eps * np.abs(xs).max())
    np.testing.assert_allclose(result[:, 1], expected[:, 1], rtol=8 * eps)


@pytest.mark.skipif(SIMULATOR, reason="rows of millions: the CPU kernels (the GPU merges the same pieces)")
@pytest.mark.parametrize("length, spread", [(1 << 20, "normal"), (1 << 22, "normal"), (1 << 22, "narrow")])
def test_float32_log_space_rows_of_millions_stay_within_4_ulp(length, spread):
    """The compensation term of the log-sum matters only on long rows: without it float32
    log_softmax was 41 ulp off on these rows of 1M and 382 on those of 4M (measured; 1 with
    it), while rows of ≤ 1000 stay within 4 either way."""
    from scipy.special import log_softmax, logsumexp

    rng = np.random.default_rng(length)
    values = rng.normal(0.0, 3.0, size=length) if spread == "normal" else rng.uniform(-1e-3, 0.0, size=length)
    xs = values.astype(np.float32)[None]
    wide = xs.astype(np.float64)  # float64's error is 1e-16: far below a float32 ulp
    assert_ulp_close(np.float32(ns.logsumexp(xs[0])), np.float32(logsumexp(wide[0])), 4, context="logsumexp")
    assert_ulp_close(ns.log_softmax(xs), log_softmax(wide, axis=-1).astype(np.float32), 4, context="log_softmax")


@pytest.mark.skipif(SIMULATOR, reason="rows of 120,000: the CPU kernels")
@pytest.mark.parametrize("dtype, magnitude", [(np.float64, 1.45e149), (np.float32, 2.7e14)])
def test_welford_rescales_rows_just_above_its_threshold(dtype, magnitude):
    """Magnitudes just above √max·2⁻¹⁷, on long rows: moving the threshold to 2⁻¹⁶ gave an
    infinite variance here (n·(x − mean)² overflows in the merges), and no other test noticed."""
    row = np.tile(np.array([magnitude, -magnitude], dtype), 60_000)[None]
    mean, variance = np.asarray(ns.welford_mean_var(row))[0]
    exact = float(mpmath.mpf(float(row[0, 0])) ** 2)  # mean 0, variance a²
    assert mean == 0.0
    assert_ulp_close(np.array([variance], dtype), np.array([exact], dtype), 4, context="variance")


def test_normalize_probs_sums_to_one(target):
    rng = np.random.default_rng(2)
    xs = rng.random((3, LONG))
    result = ns.normalize_probs(xs, target=target)
    np.testing.assert_allclose(result.sum(axis=-1), 1.0, rtol=4 * LONG * np.finfo(float).eps)
    assert_ulp_close(result, xs / np.array([[math.fsum(row)] for row in xs]), 1)


# -- long rows: the CPU folds their whole chunks of LANES columns in vector lanes ------------------

LANE_LENGTHS = [LANES * 2 - 1, LANES * 2, LANES * 2 + 1, LANES * 3 + 8, 1000]  # around the lanes' threshold


def exact_row(name, row):
    """The exact result of a row function on one row (Python floats), NaN and ±inf included."""
    if name == "logsumexp":
        return exact_logsumexp(row)
    if name == "softmax":
        return exact_softmax_mp(row)
    if name == "log_softmax":
        return exact_log_softmax(row)
    if any(math.isnan(x) for x in row):
        return [nan] * len(row) if name == "normalize_probs" else ([nan, nan] if name == "welford_mean_var" else nan)
    if name == "kahan_sum":
        return math.fsum(row) if all(math.isfinite(x) for x in row) else sum(row)
    values = [mpmath.mpf(x) for x in row]
    total = mpmath.fsum(values)
    if name == "welford_mean_var":
        mean = total / len(values)
        return [float(mean), float(mpmath.fsum((v - mean) ** 2 for v in values) / len(values))]
    return [float(v / total) for v in values] if total > 0 else [1.0 / len(row)] * len(row)


def lane_rows(name, length, dtype, rng):
    """Rows whose special values fall in the lanes (column 3, the first column of the second
    chunk) and after the last whole chunk (the last column)."""
    last, second = length - 1, min(LANES, length - 1)
    if name in ("kahan_sum", "normalize_probs", "welford_mean_var"):
        magnitudes = 10.0 ** rng.uniform(-6, 6, size=(4, length))
        rows = np.where(rng.random((4, length)) < 0.5, -magnitudes, magnitudes)
        if name == "normalize_probs":
            rows = np.abs(rows)
            rows[1] = -rows[1]  # Σ x ≤ 0: uniform
        if name == "welford_mean_var":
            rows = rng.normal(size=(4, length)) + 1e4  # offset data, where the textbook formula fails
        rows[2, second] = nan
        rows[3, last] = nan
        return rows.astype(dtype)
    rows = rng.normal(size=(8, length)) * 30
    rows[1, [min(3, last), last]] = -inf
    rows[2, [min(1, last), second, last]] = inf
    rows[3, last] = nan
    rows[4, second] = nan
    rows[5] = 0.0  # every column a maximum: counted lane by lane
    rows[6, [0, min(second + 1, last), last]] = 200.0  # the maximum in three lanes
    rows[7] = -inf
    return rows.astype(dtype)


def assert_matches_exact(name, xs, target=None):
    """The tolerances of the accuracy tests above: 1 ulp for sums, 4 for the log-space rows
    (logsumexp's error bounded by the terms where m + log Σ cancels), Welford's 2 and 4."""
    dtype = xs.dtype.type
    result = np.asarray(getattr(ns, name)(xs, target=target))
    expected = apply_rows(lambda row: exact_row(name, row), xs, dtype)
    if name == "welford_mean_var":
        assert_ulp_close(result[..., 0], expected[..., 0], 2, context="mean")
        assert_ulp_close(result[..., 1], expected[..., 1], 4, context="variance")
    elif name == "logsumexp":
        high = np.abs(np.max(np.where(np.isfinite(xs), xs, 0), axis=-1)).astype(np.float64)
        assert_ulp_close(result, expected, 4, 4 * np.finfo(dtype).eps * (high + np.log(xs.shape[-1])), context=name)
    else:
        assert_ulp_close(result, expected, 1 if name in ("kahan_sum", "normalize_probs") else 4, context=name)


ROW_NAMES = ["logsumexp", "softmax", "log_softmax", "kahan_sum", "welford_mean_var", "normalize_probs"]


@pytest.mark.skipif(SIMULATOR, reason="the lanes are the CPU kernels'")
@pytest.mark.parametrize("name", ROW_NAMES)
@pytest.mark.parametrize("length", LANE_LENGTHS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_long_rows_match_the_exact_results(name, length, dtype):
    assert_matches_exact(name, lane_rows(name, length, dtype, np.random.default_rng(length)))


@pytest.mark.skipif(SIMULATOR, reason="the lanes are the CPU kernels'")
@pytest.mark.parametrize("name", ROW_NAMES)
@pytest.mark.parametrize("length", [1, 7, TILE, 50, 100])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_short_rows_taken_a_group_at_a_time_match_the_exact_results(name, length, dtype):
    """Short rows go LANES at a time, one per lane: 2.5 groups of rows with special values,
    drawn at random, so that every kind of row meets many lanes and the last group is partial
    (and the transposes' whole tiles and edges both carry special values)."""
    rng = np.random.default_rng(length)
    rows = lane_rows(name, length, dtype, rng)
    assert_matches_exact(name, rows[rng.integers(0, len(rows), size=LANES * 5 // 2)])


@pytest.mark.skipif(SIMULATOR, reason="the lanes are the CPU kernels'")
@pytest.mark.parametrize("name", ROW_NAMES)
@pytest.mark.parametrize("length", [50, 1000])
def test_rows_are_the_same_bits_on_one_thread_and_on_two(name, length):
    """Each parallel task folds its rows in lanes of its own (``lane_array``, on its stack):
    calls large enough for the threads give one thread's bits with two (short rows a group
    at a time, long ones a row at a time)."""
    import numba

    rng = np.random.default_rng(length)
    xs = np.abs(rng.standard_normal((200_000 // length, length))) * 3
    if name == "normalize_probs":
        xs /= xs.sum(axis=-1, keepdims=True)
    results = []
    previous = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            results.append(np.asarray(getattr(ns, name)(xs)))
    finally:
        numba.set_num_threads(previous)
    np.testing.assert_array_equal(results[0], results[1])
    assert_matches_exact(name, xs[:: len(xs) // 7])


@pytest.mark.skipif(SIMULATOR, reason="the lanes are the CPU kernels'")
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp"])
def test_short_rows_of_a_strided_view_match_a_contiguous_copy(name):
    """A view whose rows are not contiguous takes the transposes' element-by-element path."""
    xs = np.random.default_rng(3).normal(0.0, 5.0, size=(150, 2 * TILE * 3)).astype(np.float32)
    view = xs[:, ::2]
    np.testing.assert_array_equal(getattr(ns, name)(view), getattr(ns, name)(np.ascontiguousarray(view)))


@pytest.mark.skipif(SIMULATOR, reason="a CPU primitive")
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 3 * TILE + 3),
    columns=st.integers(0, 3 * TILE + 3),
    offsets=st.tuples(st.integers(0, 5), st.integers(0, 5)),
    dtype=st.sampled_from([np.float32, np.float64]),
    step=st.sampled_from([1, 2]),
)
def test_copy_transposed_matches_numpy(rows, columns, offsets, dtype, step):
    """Whole tiles through the shuffles and the edges one by one, at any offsets, against
    NumPy's transpose; nothing outside the target's block is written. A source with
    strided rows (step 2) takes the element-by-element path."""
    source_row, target_row = offsets
    rng = np.random.default_rng(rows * 1000 + columns)
    source = rng.standard_normal((source_row + rows, step * columns)).astype(dtype)[:, ::step]
    target = np.full((target_row + columns + 2, rows + 1), -7.0, dtype)
    copy_transposed(target, target_row, source, source_row, rows, columns)
    np.testing.assert_array_equal(target[target_row : target_row + columns, :rows], source[source_row:].T)
    untouched = np.ones(target.shape, bool)
    untouched[target_row : target_row + columns, :rows] = False
    assert (target[untouched] == -7.0).all()


# -- agreement with SciPy on adversarial finite rows ----------------------------------------------

ADVERSARIAL = np.array(
    [
        [1000.0, 999.0, -1000.0, 0.0],
        [-745.0, -745.1, -800.0, -1e5],
        [1e-310, -1e-310, 5e-324, 0.0],
        [700.0, 709.0, 709.7, 710.0],
        [-1e300, 1e300, 0.0, 3.0],
        [0.0, -40.0, -80.0, -1e-16],
    ]
)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        ("logsumexp", lambda xs: special.logsumexp(xs, axis=-1)),
        ("softmax", lambda xs: special.softmax(xs, axis=-1)),
        ("log_softmax", lambda xs: special.log_softmax(xs, axis=-1)),
    ],
)
def test_rows_agree_with_scipy(ours, theirs, target):
    np.testing.assert_allclose(getattr(ns, ours)(ADVERSARIAL, target=target), theirs(ADVERSARIAL), rtol=1e-14, atol=0)


def test_sigmoid_functions_agree_with_scipy(target):
    xs = np.concatenate([np.linspace(-700, 700, 101), [-1e-300, 0.0, 1e-300, 36.0, -36.0]])
    np.testing.assert_allclose(ns.sigmoid_stable(xs, target=target), special.expit(xs), rtol=1e-15, atol=0)
    np.testing.assert_allclose(ns.log_sigmoid(xs, target=target), special.log_expit(xs), rtol=1e-15, atol=0)


# -- shapes, batching, out= -----------------------------------------------------------------------


def test_leading_axes_are_batched(target):
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(2, 3, 7))
    assert ns.logsumexp(xs, target=target).shape == (2, 3)
    assert ns.welford_mean_var(xs, target=target).shape == (2, 3, 2)
    assert ns.softmax(xs, target=target).shape == (2, 3, 7)
    np.testing.assert_allclose(ns.logsumexp(xs, target=target), special.logsumexp(xs, axis=-1), rtol=1e-15)


def test_empty_batches_and_empty_rows(target):
    assert ns.logsumexp(np.zeros((0, 5)), target=target).shape == (0,)
    np.testing.assert_array_equal(ns.logsumexp(np.zeros((3, 0)), target=target), [-inf] * 3)
    assert ns.softmax(np.zeros((3, 0)), target=target).shape == (3, 0)


def test_out_receives_row_results(target):
    xs = np.arange(12.0).reshape(3, 4)
    out = np.full((3, 4), -1.0)
    assert ns.softmax(xs, out=out, target=target) is out
    np.testing.assert_allclose(out, special.softmax(xs, axis=-1), rtol=1e-15)
    with pytest.raises(ValueError, match="out has shape \\(3,\\); the result of shape \\(3, 2\\) \\(from xs"):
        ns.welford_mean_var(xs, out=np.zeros(3), target=target)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "normalize_probs"])
@pytest.mark.parametrize("length", [7, 200])
def test_rows_written_over_their_input_match_a_fresh_output(name, length, target):
    """``out=xs``: softmax's last pass writes each element's exp(x − max) to ``out`` for the
    value pass, which must not then read x from that same memory."""
    xs = lane_rows(name, length, np.float64, np.random.default_rng(length))
    expected = getattr(ns, name)(xs, target=target)
    overwritten = xs.copy()
    assert getattr(ns, name)(overwritten, out=overwritten, target=target) is overwritten
    assert_ulp_close(overwritten, expected, 0, context=name)


def test_one_row_returns_a_python_float():
    assert type(ns.logsumexp([1.0, 2.0])) is float


def test_scalars_are_not_rows():
    with pytest.raises(ValueError, match="xs must be an array with at least one axis"):
        ns.logsumexp(3.0)


def test_float32_rows_stay_float32(target):
    assert ns.kahan_sum(np.ones((2, 5), np.float32), target=target).dtype == np.float32


@pytest.mark.skipif(SIMULATOR, reason="torch CPU tensors run on the CPU target")
def test_torch_rows():
    torch = pytest.importorskip("torch")
    xs = torch.randn(4, 9, dtype=torch.float64)
    result = ns.log_softmax(xs)
    assert isinstance(result, torch.Tensor)
    assert torch.allclose(result, torch.log_softmax(xs, dim=-1), rtol=1e-14, atol=0)


def test_execute_takes_and_returns_lists():
    assert steadystep.execute("numerical_stability", "welford_mean_var", [[1.0, 2.0, 3.0, 4.0, 5.0]]) == {
        "result": [3.0, 2.0]
    }
    assert steadystep.execute("numerical_stability", "softmax", [[[0.0, 0.0], [1.0, 1.0]]]) == {
        "result": [[0.5, 0.5], [0.5, 0.5]]
    }


# -- the GPU's two row kernels: one thread per short row, one block per longer row -------------------


class _Launches:
    """Stands in for a CUDA kernel and counts its launches (not its configurations: on a GPU
    the launcher configures a kernel once for each grid and keeps it)."""

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, launch_config):
        configured = self.kernel[launch_config]

        def launch(*arguments):
            self.count += 1
            return configured(*arguments)

        return launch


@pytest.mark.parametrize("name", ROW_NAMES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_short_and_long_row_kernels_match_the_exact_results(name, dtype, target, monkeypatch):
    if target != "cuda":
        pytest.skip("the CUDA launcher's choice between its two row kernels")
    from steadystep.cuda import backend as launch
    from steadystep.cuda._generated import numerical_stability as kernels

    spies = {}
    for kind in ("short_rows", "rows"):
        kernel = f"{name}_{_arrays.suffix(np.dtype(dtype))}_{kind}"
        spies[kind] = _Launches(getattr(kernels, kernel))
        monkeypatch.setattr(kernels, kernel, spies[kind])
    shortest_long = launch.SHORT_ROW_BYTES // np.dtype(dtype).itemsize + 1
    for length, kind in ((1, "short_rows"), (shortest_long - 1, "short_rows"), (shortest_long, "rows")):
        launched = spies[kind].count
        assert_matches_exact(name, lane_rows(name, length, dtype, np.random.default_rng(length)), target)
        assert spies[kind].count == launched + 1, (length, kind)


# -- properties -------------------------------------------------------------------------------------

rows_of = hnp.arrays(
    np.float64,
    st.tuples(st.integers(1, 4), st.integers(1, 40)),
    elements=st.floats(-1e6, 1e6, allow_subnormal=True),
)


@settings(max_examples=10 if SIMULATOR else 100, deadline=None)
@given(xs=rows_of)
def test_softmax_rows_sum_to_one_and_log_softmax_is_not_positive(xs, target):
    total = ns.softmax(xs, target=target).sum(axis=-1)
    assert np.all(np.abs(total - 1.0) <= 2 * xs.shape[-1] * np.finfo(float).eps), total
    assert np.all(ns.log_softmax(xs, target=target) <= 0.0)


@pytest.mark.skipif(not SIMULATOR, reason="compares the simulated CUDA kernels with the CPU ones")
@settings(max_examples=10, deadline=None)
@given(
    xs=rows_of,
    name=st.sampled_from(["logsumexp", "softmax", "log_softmax", "kahan_sum", "welford_mean_var", "normalize_probs"]),
)
def test_cpu_and_cuda_agree(xs, name, target):
    function = getattr(ns, name)
    cpu, cuda = np.asarray(function(xs, target="cpu")), np.asarray(function(xs, target="cuda"))
    # The block merge adds in another order than the CPU's left-to-right fold; both are
    # compensated, so they agree to a few ulp of the row's largest magnitude.
    scale = np.max(np.abs(xs), axis=-1)
    scale = scale**2 if name == "welford_mean_var" else scale
    atol = 8 * np.finfo(float).eps * scale.reshape(scale.shape + (1,) * (cpu.ndim - scale.ndim))
    assert_ulp_close(cuda, cpu, 4, np.broadcast_to(atol, cpu.shape), context=name)
