"""Every elementwise function against its plain NumPy reference, on each target.

The table below gives each function's tolerance; 0 ulp means bit-identical to NumPy
evaluating the same expression in the same dtype.
"""

from __future__ import annotations

import math
import zlib

import mpmath
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import steadystep
from tests.helpers import EDGES, assert_ulp_close
from tests.reference import REFERENCES
from tests.conftest import SIMULATOR

# Functions whose formulas call a transcendental (libm's or NumPy's ulp errors differ).
ULPS = {
    "grad_exp": 4,
    "grad_pow": 4,
    "cosine_annealing_lr": 4,
    "warmup_cosine_lr": 4,
    "sigmoid_stable": 4,
    "softplus": 4,
    "log_sigmoid": 4,
    "log_add_exp": 4,
}
# The cosine schedules: 1 + cos(πp) cancels near p = 1, so the error is relative to the lr range.
SCHEDULES = {"cosine_annealing_lr", "warmup_cosine_lr"}
LENGTH = 16 if SIMULATOR else 200
FUNCTIONS = [entry for entry in steadystep.catalog() if entry["kind"] == "elementwise"]
IDS = [f"{entry['module']}.{entry['function']}" for entry in FUNCTIONS]


def public(entry):
    return getattr(getattr(steadystep, entry["module"]), entry["function"])


def tolerance(name, arguments, dtype):
    """ulps, and an absolute floor for the cosine schedule where 1 + cos(πp) cancels."""
    if name not in SCHEDULES:
        return ULPS.get(name, 0), 0.0
    base_lr, min_lr = np.broadcast_arrays(*arguments)[-2:]
    with np.errstate(over="ignore"):
        scale = np.abs(base_lr.astype(np.float64)) + np.abs(min_lr.astype(np.float64))
    return ULPS[name], 4 * np.finfo(dtype).eps * np.where(np.isfinite(scale), scale, 0.0)


def mixed_values(rng, dtype, size):
    """Edge values and random magnitudes from 1e-3 to 1e3 with random signs, shuffled."""
    magnitudes = 10.0 ** rng.uniform(-3, 3, size)
    values = np.where(rng.random(size) < 0.5, -magnitudes, magnitudes)
    values[rng.random(size) < 0.3] = rng.random(int(np.sum(rng.random(size) < 0.3)) or 1)[0]
    edges = np.array(EDGES[dtype], dtype=dtype)
    picks = rng.random(size) < 0.35
    values[picks] = rng.choice(edges, int(picks.sum()))
    return values.astype(dtype)


def reference(name, arguments, dtype):
    shape = np.broadcast_shapes(*(np.shape(a) for a in arguments))
    # One-element arrays, not 0-d ones: NumPy 1.26 treats a 0-d array as a scalar and
    # promotes by value (1 - alpha became float64 there), NumPy 2 by dtype.
    arrays = [np.reshape(a, np.shape(a) or (1,)) for a in arguments]
    with np.errstate(all="ignore"):
        return np.asarray(REFERENCES[name](*arrays), dtype=dtype).reshape(shape)


def check(entry, arguments, dtype, target, **options):
    result = public(entry)(*arguments, target=target, **options)
    ulps, atol = tolerance(entry["function"], arguments, dtype)
    expected = reference(entry["function"], [np.asarray(a, dtype) for a in arguments], dtype)
    result = np.asarray(result)
    assert result.dtype == dtype, f"{entry['function']} returned {result.dtype} for {dtype.__name__} input"
    assert_ulp_close(result, expected, ulps, atol, context=f"{entry['function']} {dtype.__name__} on {target}")
    return result


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("entry", FUNCTIONS, ids=IDS)
def test_arrays_with_edge_values_match_reference(entry, dtype, target):
    rng = np.random.default_rng(zlib.crc32(entry["function"].encode()))
    arguments = [mixed_values(rng, dtype, LENGTH) for _ in entry["parameters"]]
    check(entry, arguments, dtype, target)


@pytest.mark.parametrize("entry", FUNCTIONS, ids=IDS)
def test_scalar_hyperparameters_broadcast_against_arrays(entry, target):
    """First argument an array, the rest Python floats (weak: float32 stays float32)."""
    rng = np.random.default_rng(7)
    first = mixed_values(rng, np.float32, LENGTH)
    rest = [float(v) for v in rng.uniform(0.05, 2.0, len(entry["parameters"]) - 1)]
    check(entry, [first, *rest], np.float32, target)


@pytest.mark.parametrize("entry", FUNCTIONS, ids=IDS)
def test_all_scalars_return_a_python_float(entry, target):
    arguments = [0.75 + 0.5 * index for index in range(len(entry["parameters"]))]
    result = public(entry)(*arguments, target=target)
    assert type(result) is float
    expected = reference(entry["function"], [np.float64(a) for a in arguments], np.float64)
    assert_ulp_close(np.float64(result), expected, ULPS.get(entry["function"], 0), context=entry["function"])


@pytest.mark.parametrize("entry", FUNCTIONS, ids=IDS)
def test_general_broadcasting_matches_numpy(entry, target):
    """Arguments alternate between a column (n, 1), a row (1, m) and a scalar array."""
    rng = np.random.default_rng(3)
    shapes = [(5, 1), (1, 4), ()]
    arguments = [
        mixed_values(rng, np.float64, 20)[: math.prod(shapes[i % 3])].reshape(shapes[i % 3])
        for i in range(len(entry["parameters"]))
    ]
    result = check(entry, arguments, np.float64, target)
    assert result.shape == np.broadcast_shapes(*(a.shape for a in arguments))


@pytest.mark.parametrize("entry", FUNCTIONS, ids=IDS)
def test_out_receives_the_result_in_place(entry, target):
    rng = np.random.default_rng(11)
    arguments = [mixed_values(rng, np.float64, LENGTH).reshape(2, -1) for _ in entry["parameters"]]
    out = np.full((2, LENGTH // 2), 123.0)
    returned = public(entry)(*arguments, out=out, target=target)
    assert returned is out
    assert_ulp_close(
        out,
        reference(entry["function"], arguments, np.float64),
        ULPS.get(entry["function"], 0),
        tolerance(entry["function"], arguments, np.float64)[1],
        context=entry["function"],
    )


def test_in_place_update_of_an_input(target):
    """out may be one of the inputs: the usual way to step parameters."""
    param = np.linspace(-1, 1, LENGTH)
    grad = np.full(LENGTH, 0.5)
    expected = param - 0.1 * grad
    steadystep.gradient_descent.sgd_update(param, grad, 0.1, out=param, target=target)
    assert_ulp_close(param, expected, 0)


def test_integer_arrays_compute_in_float64(target):
    result = steadystep.autograd_graph.node_output_count(np.arange(LENGTH), target=target)
    assert result.dtype == np.float64
    np.testing.assert_array_equal(result, np.arange(LENGTH) + 1.0)


def test_mixed_float32_and_float64_arrays_promote_like_numpy():
    result = steadystep.autograd_ops.grad_mul(np.ones(4, np.float32), np.full(4, 0.1))
    assert result.dtype == np.float64
    np.testing.assert_array_equal(result, np.float32(1.0) * np.full(4, 0.1))


@pytest.mark.parametrize("number", [0.1, 1e300, 3])
def test_python_numbers_do_not_promote_arrays(number, target):
    """NEP 50 (NumPy 2): a Python number is weak, however large, on any installed NumPy
    (NumPy 1.26 would promote float32 to float64 for 1e300, which float32 cannot hold)."""
    with np.errstate(over="ignore"):  # 1e300 is inf in float32, as NumPy 2 makes it
        result = steadystep.autograd_ops.grad_mul(np.ones(3, np.float32), number, target=target)
        expected = np.ones(3, np.float32) * np.float32(number)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, expected)


def test_numpy_scalars_are_strong_like_in_numpy():
    """NumPy 2's promotion (NEP 50): a NumPy float64 scalar makes the result float64, whichever
    NumPy is installed (NumPy 1.26 would look at the value and keep float32)."""
    result = steadystep.autograd_ops.grad_mul(np.ones(3, np.float32), np.float64(0.1))
    assert result.dtype == np.float64


def test_empty_arrays_give_empty_results(target):
    result = steadystep.gradient_descent.adam_update(np.zeros(0, np.float32), 0.1, 0.2, 0.1, 1e-8, target=target)
    assert result.shape == (0,) and result.dtype == np.float32


def test_keyword_arguments_work(target):
    assert steadystep.gradient_descent.sgd_update(param=1.0, grad=0.5, lr=0.1, target=target) == 1.0 - 0.1 * 0.5


finite_or_not = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True, width=64)


@settings(max_examples=15 if SIMULATOR else 150, deadline=None)
@given(data=st.data())
def test_property_any_floats_match_reference(data, target):
    entry = data.draw(st.sampled_from(FUNCTIONS))
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    size = data.draw(st.integers(1, 12))
    elements = st.floats(
        allow_nan=True, allow_infinity=True, allow_subnormal=True, width=32 if dtype == np.float32 else 64
    )
    arguments = [data.draw(hnp.arrays(dtype, size, elements=elements)) for _ in entry["parameters"]]
    check(entry, arguments, dtype, target)


python_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from(EDGES[np.float64]),
    st.integers(-(2**64), 2**64),
)


def bits(number):
    return np.float64(number).view(np.int64)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_calls_on_python_numbers_give_the_bits_of_the_array_kernel(data):
    """A call on Python numbers alone runs the formula compiled for float64 numbers, not the
    array kernel; both must give the same float, to the bit, edge values included (a NaN's
    sign and payload aside: which NaN operand x86 passes on depends on register order)."""
    entry = data.draw(st.sampled_from(FUNCTIONS))
    arguments = [data.draw(python_numbers) for _ in entry["parameters"]]
    direct = public(entry)(*arguments)
    assert type(direct) is float
    through_the_kernel = public(entry)(*[np.array([float(a)]) for a in arguments])[0]
    both_nan = math.isnan(direct) and math.isnan(through_the_kernel)
    assert both_nan or bits(direct) == bits(through_the_kernel), (
        entry["function"],
        arguments,
        direct,
        through_the_kernel,
    )


def test_calls_on_python_numbers_run_on_a_forced_gpu(target, monkeypatch):
    """The shortcut for Python numbers is a CPU one: use_target("cuda") still runs the CUDA kernel."""
    ran = []
    run_elementwise = steadystep.dispatch.run_elementwise
    monkeypatch.setattr(
        steadystep.dispatch,
        "run_elementwise",
        lambda module, function, *rest: ran.append(function) or run_elementwise(module, function, *rest),
    )
    with steadystep.use_target(target):
        assert steadystep.numerical_stability.softplus(0.0) == math.log(2.0)
    assert ran == ([] if target == "cpu" else ["softplus"])


@pytest.mark.parametrize(
    "number, message", [(10**400, "x is an integer beyond float64's range"), (True, None), (np.float32(0.5), None)]
)
def test_other_numbers_take_the_general_path(number, message):
    """Huge integers keep their named error; bools and NumPy scalars their array semantics
    (a float32 scalar computes in float32)."""
    if message:
        with pytest.raises(OverflowError, match=message):
            steadystep.numerical_stability.softplus(number)
        return
    expected = steadystep.numerical_stability.softplus(np.array([number]))[0]
    assert bits(steadystep.numerical_stability.softplus(number)) == bits(expected)


@numba.njit
def each_element(helper, x):
    """A scalar CPU primitive (a Numba function) applied to every element of x."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = helper(x[i])
    return out


def _libm(function, values):
    """glibc's results through Python's math (NumPy's own SIMD exp and log1p, such as NumPy
    1.26's on AVX-512, are up to 1.8 ulp off), with IEEE's where math raises instead."""

    def one(value):
        try:
            return function(value)
        except OverflowError:
            return math.inf
        except ValueError:  # log1p at or below −1
            return -math.inf if value == -1 else math.nan

    return np.array([one(value) for value in values.tolist()])


def _float64_cases():
    """(primitive, its mpmath and math twins, inputs, special values) for the float64 tests."""
    from steadystep.cpu.primitives import exp_f64, log1p_f64

    rng = np.random.default_rng(7)
    both_signs = 10.0 ** rng.uniform(-320, 0, 200_000) * rng.choice([-1, 1], 200_000)
    exp_inputs = np.concatenate(
        [rng.uniform(-745.2, 709.8, 1_000_000), both_signs, rng.uniform(-745.2, -708.3, 100_000)]
    )  # the subnormal results
    log1p_inputs = np.concatenate(
        [
            10.0 ** rng.uniform(-320, 308.2, 400_000),
            -rng.uniform(0, 1, 300_000),
            -(1 - 10.0 ** -rng.uniform(0, 16, 100_000)),
            rng.uniform(-0.3, 0.42, 400_000),
            rng.uniform(-0.3, -0.29, 100_000),
            rng.uniform(0.41, 0.42, 100_000),
        ]
    )  # 1 + f at √½ and √2
    return [
        (
            exp_f64,
            mpmath.exp,
            math.exp,
            exp_inputs,
            [
                np.nan,
                np.inf,
                -np.inf,
                0.0,
                -0.0,
                709.782712893384,
                709.7827128933841,
                -745.1332191019411,
                -745.1332191019412,
                1e300,
                -1e300,
                5e-324,
            ],
        ),
        (
            log1p_f64,
            mpmath.log1p,
            math.log1p,
            log1p_inputs[np.isfinite(log1p_inputs) & (log1p_inputs > -1)],
            [-1.0, -2.0, np.inf, -np.inf, np.nan, 0.0, -0.0, 5e-324, -5e-324, 1.7e308, -0.9999999999999999, 1e-17],
        ),
    ]


@pytest.mark.parametrize("case", range(2), ids=["exp", "log1p"])
def test_the_cpu_float64_exp_and_log1p_are_within_one_ulp_of_the_exact_value(case):
    """Every float64 formula on the CPU takes exp and log1p from vectorisable polynomials of
    our own (libm's kept the loops scalar): within 1 ulp of the exact value (mpmath) in a
    sample, at most 1 float from glibc's (itself within 0.51 ulp) across the whole range, and
    glibc's results, sign of zero included, for the special values."""
    primitive, exact, libm_twin, x, special = _float64_cases()[case]
    result = each_element(primitive, x)
    assert_ulp_close(result, _libm(libm_twin, x), 1, context=primitive.__name__)
    sample = np.random.default_rng(8).choice(len(x), 4_000, replace=False)
    errors = []
    for value, got in zip(x[sample].tolist(), result[sample].tolist()):
        reference = exact(mpmath.mpf(value))
        if float(reference) != 0:  # exp's results below half the least subnormal
            errors.append(abs(float((mpmath.mpf(got) - reference) / math.ulp(float(reference)))))
    assert max(errors) < 1, f"{primitive.__name__}: {max(errors):.3f} ulp from the exact value"
    special = np.array(special)
    assert_ulp_close(
        each_element(primitive, special), _libm(libm_twin, special), 0, context=primitive.__name__
    )  # −0 too


@settings(deadline=None, max_examples=300)
@given(x=st.floats(width=64), name=st.sampled_from(["exp", "log1p"]), width=st.sampled_from([32, 64]))
def test_the_cpu_exp_and_log1p_are_within_one_float_of_the_exact_value_for_any_input(x, name, width):
    """Hypothesis's floats (subnormals, the range's ends, ±0, ±inf, NaN) through the CPU's own
    exp and log1p in each dtype, against mpmath rounded to the dtype (IEEE's special values
    where mpmath has none)."""
    from steadystep.cpu import primitives

    dtype = np.float32 if width == 32 else np.float64
    with np.errstate(all="ignore"):
        value = np.array([x], dtype)
        if np.isnan(value[0]) or np.isinf(value[0]) or (name == "log1p" and value[0] <= -1):
            expected = _libm(getattr(math, name), value).astype(dtype)
        else:
            exact = getattr(mpmath, name)(mpmath.mpf(float(value[0])))
            expected = np.array([float(exact)], np.float64).astype(dtype)  # the float64 step rounds at most once more
    result = each_element(getattr(primitives, f"{name}_f{width}"), value)
    assert_ulp_close(result, expected, 1, context=f"{name}_f{width}({value[0]!r})")


def test_the_cpu_float32_log1p_is_within_one_ulp_of_the_correctly_rounded_result():
    """softplus, log_sigmoid, log_add_exp and the row functions take log1p on the CPU in
    float32 from a vectorisable polynomial of our own (glibc's log1pf is slow and keeps
    loops scalar): every float32 of a dense stretch of [0.5, 0.625), of the stretch just
    below 0 where 1 + x rounds, and samples out to the range's ends, against float64's
    log1p rounded to float32, plus the special values."""
    from steadystep.cpu.primitives import log1p_f32

    rng = np.random.default_rng(5)
    dense = np.concatenate(
        [
            np.arange(0x3F000000, 0x3F000000 + 2**21, dtype=np.uint32),  # [0.5, 0.625)
            np.arange(0xB3000000, 0xB3000000 + 2**21, dtype=np.uint32),
        ]
    ).view(np.float32)  # −3e-8 down
    spread = np.concatenate(
        [
            10.0 ** rng.uniform(-45, 38.5, 400_000),
            -rng.uniform(0, 1, 200_000),
            -(1 - 10.0 ** -rng.uniform(0, 7.2, 100_000)),
        ]
    ).astype(np.float32)
    x = np.concatenate([dense, spread[np.isfinite(spread) & (spread > -1)]])
    result = each_element(log1p_f32, x)
    assert_ulp_close(result, np.log1p(x.astype(np.float64)).astype(np.float32), 1, context="log1p_f32")
    special = np.array([-1.0, -2.0, np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -1e-45, 3e38], np.float32)
    result = each_element(log1p_f32, special)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.log1p(special)
    np.testing.assert_array_equal(result, expected)
    assert np.signbit(result[6])  # log1p(−0) = −0


def test_the_cpu_float32_exp_is_within_one_ulp_of_the_correctly_rounded_result():
    """Every float32 formula on the CPU takes exp from a vectorisable polynomial (libm's
    expf kept the loops scalar): a dense stretch of every float32 in [1, 1.25) and in the
    subnormal results of [−88, −87.5), samples across the whole range where exp is neither 0
    nor inf, against float64's exp rounded to float32, plus the special values."""
    from steadystep.cpu.primitives import exp_f32

    rng = np.random.default_rng(6)
    dense = np.arange(0x3F800000, 0x3F800000 + 2**21, dtype=np.uint32).view(np.float32)
    subnormal = np.arange(0xC2B00000, 0xC2AF0000, -1, dtype=np.uint32).view(np.float32)
    x = np.concatenate(
        [
            dense,
            subnormal,
            rng.uniform(-104, 89, 1_000_000).astype(np.float32),
            (10.0 ** rng.uniform(-45, 1, 200_000) * rng.choice([-1, 1], 200_000)).astype(np.float32),
        ]
    )
    result = each_element(exp_f32, x)
    with np.errstate(over="ignore"):
        expected = np.exp(x.astype(np.float64)).astype(np.float32)
    assert_ulp_close(result, expected, 1, context="exp_f32")
    special = np.array(
        [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72283, 88.72284, -103.97, -104.0, 1e30, -1e30, 1e-45], np.float32
    )
    result = each_element(exp_f32, special)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(result, np.exp(special.astype(np.float64)).astype(np.float32))


@pytest.mark.skipif(SIMULATOR, reason="a CPU primitive")
def test_the_cpu_float32_exp_meets_its_documented_error_bound_across_the_float32s():
    """cpu/primitives' docstring: within 0.66 ulp of the exact value where the result is normal
    and 0.77 where it is subnormal (against float64's exp, itself within a float64 ulp); the
    measured maxima, on every 13th float32 (all of them take 40 s here), so that a change to
    the polynomial, the reduction's Fast2Sum or the power of two that loses accuracy fails."""
    from llvmlite import ir
    from numba import njit, prange, types
    from numba.extending import intrinsic

    from steadystep.cpu.primitives import exp_f32

    @intrinsic
    def float_of_bits(typingctx, word):
        return types.float32(types.uint32), lambda context, builder, sig, args: builder.bitcast(args[0], ir.FloatType())

    @njit(parallel=True, error_model="numpy")
    def worst(start, count):
        normal = np.zeros(count, np.float64)
        subnormal = np.zeros(count, np.float64)
        for k in prange(count):
            x = float_of_bits(np.uint32(start + 13 * k))
            if not (x > -104.0 and x < 88.72):
                continue
            exact = math.exp(np.float64(x))
            error = abs(np.float64(exp_f32(x)) - exact)
            if exact >= 2.0**-126:
                normal[k] = error / math.ldexp(1.0, math.frexp(exact)[1] - 24)
            else:
                subnormal[k] = error / 2.0**-149
        return normal.max(), subnormal.max()

    step = 13 << 26
    results = [worst(start, min(1 << 26, ((1 << 32) - start + 12) // 13)) for start in range(0, 1 << 32, step)]
    assert max(normal for normal, _ in results) <= 0.66
    assert max(subnormal for _, subnormal in results) <= 0.77


@numba.njit
def _with_tails(helper, differences, tails):
    out = np.empty_like(differences)
    for i in range(differences.shape[0]):
        out[i] = helper(differences[i], tails[i])
    return out


@pytest.mark.skipif(SIMULATOR, reason="a CPU primitive")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cpu_exp_with_tail_is_exp_of_the_unrounded_difference(dtype):
    """exp_with_tail(d, e), d = x − y rounded and e its rounding error (what exp_difference
    passes, and the row functions' exp(x − max)): within 1 ulp of e^(x − y) taken exactly
    (float64 for float32 pairs, mpmath for float64 ones); past the clamps, a large tail (or
    the NaN one of an infinite difference) gives 0 or inf, not NaN."""
    from steadystep.cpu.primitives import exp_with_tail_f32, exp_with_tail_f64

    helper = exp_with_tail_f32 if dtype == np.float32 else exp_with_tail_f64
    rng = np.random.default_rng(12)
    count = 400_000 if dtype == np.float32 else 20_000
    y = (rng.standard_normal(count) * 30).astype(dtype)
    x = (y - rng.uniform(0, 100, count)).astype(dtype)  # e^(x − y) from 1 down to e^−100
    differences = x - y
    if dtype == np.float32:
        tails = (x.astype(np.float64) - y.astype(np.float64) - differences).astype(np.float32)  # exact
        expected = np.exp(x.astype(np.float64) - y.astype(np.float64)).astype(np.float32)
    else:
        virtual = differences - x
        tails = (x - (differences - virtual)) + (-y - virtual)  # Knuth's TwoSum: exact
        expected = np.array([float(mpmath.exp(mpmath.mpf(a) - mpmath.mpf(b))) for a, b in zip(x, y)])
    assert np.count_nonzero(tails) > count // 4  # the tails are there to be taken
    assert_ulp_close(_with_tails(helper, differences, tails), expected, 1, context="exp_with_tail")
    big = np.array([-1e30, 1e30, -1e30, -np.inf, np.inf, np.nan], dtype)
    result = _with_tails(helper, big, np.array([1e22, -1e22, -1e22, np.nan, np.nan, np.nan], dtype))
    np.testing.assert_array_equal(result[:5], [0.0, np.inf, 0.0, 0.0, np.inf])
    assert np.isnan(result[5])


def _compiled_with(monkeypatch, module, flag: str, value: bool, typer):
    """A fresh intrinsic of ``typer`` (one Numba has not compiled), which reads ``module.flag``
    as ``value`` when it compiles: each of a primitive's two forms, on one machine."""
    from numba.extending import intrinsic

    monkeypatch.setattr(module, flag, value)
    return intrinsic(typer)


@pytest.mark.skipif(SIMULATOR, reason="a CPU primitive")
@pytest.mark.parametrize("instruction", [True, False], ids=["llvm.ldexp (vscalef)", "two exact scalings"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cpu_exps_power_of_two_rounds_once_both_ways(monkeypatch, instruction, dtype):
    """exp's last step, value·2ⁿ, both ways it compiles, against NumPy's ldexp (one rounding):
    values in [1, 2) and random ones, n across twice the exponent range, so that results go
    subnormal, to 0 and to inf."""
    from steadystep import _primitives
    from steadystep.cpu import primitives

    if instruction and not (primitives.LDEXP_INSTRUCTION and "+avx512f" in _primitives.cpu_features()):
        pytest.skip("this LLVM or CPU has no vscalef lowering of llvm.ldexp")
    scale = _compiled_with(
        monkeypatch, primitives, "LDEXP_INSTRUCTION", instruction, primitives.times_power_of_two_typer
    )

    @numba.njit(error_model="numpy")
    def scaled(values, exponents, out):
        for i in range(values.shape[0]):
            out[i] = scale(values[i], exponents[i])

    rng = np.random.default_rng(3)
    low, high = (-252, 254) if dtype == np.float32 else (-2044, 2046)
    count = 200_000
    values = np.concatenate([1 + rng.uniform(0, 1, count // 2), rng.uniform(-3, 3, count // 2)]).astype(dtype)
    exponents = rng.integers(low, high + 1, count).astype(dtype)
    out = np.empty_like(values)
    scaled(values, exponents, out)
    with np.errstate(over="ignore", under="ignore"):
        expected = np.ldexp(values, exponents.astype(np.int32))
    bits = np.int64 if dtype == np.float64 else np.int32
    np.testing.assert_array_equal(out.view(bits), expected.view(bits))
    assert np.count_nonzero((expected != 0) & (np.abs(expected) < np.finfo(dtype).tiny)) > 100  # subnormal results


def _pairwise_and_running(function):
    """Loops that apply a two-argument primitive pair by pair, and as a running value from a
    start over an array (a reduction the vectoriser takes)."""
    from numba import njit

    @njit(error_model="numpy")
    def pairwise(x, y, out):
        for i in range(x.shape[0]):
            out[i] = function(x[i], y[i])

    @njit(error_model="numpy")
    def running(start, x):
        top = start
        for i in range(x.shape[0]):
            top = function(top, x[i])
        return top

    return pairwise, running


@pytest.mark.skipif(SIMULATOR, reason="a CPU primitive")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cpu_larger_magnitude_is_the_maximum_of_magnitudes(dtype):
    """larger_magnitude(top, x), the blockwise steps' running absmax, as integers: largest(top,
    |x|) for every running value top can hold (≥ +0 or NaN) and every edge x, pair by pair and
    as a reduction the vectoriser takes."""
    from steadystep.cpu.primitives import larger_magnitude_f32

    pairwise, running = _pairwise_and_running(larger_magnitude_f32)

    tiny = np.finfo(dtype).smallest_subnormal
    edges = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, tiny, -tiny, 3.5, -2.25], dtype)
    tops = np.array([0.0, tiny, 1.0, 2.25, np.inf, np.nan], dtype)
    top, x = (grid.reshape(-1) for grid in np.meshgrid(tops, edges))
    out = np.empty_like(x)
    pairwise(top, x, out)
    expected = np.where(np.isnan(top) | np.isnan(x), np.nan, np.maximum(top, np.abs(x)))
    np.testing.assert_array_equal(out, expected)
    assert not np.signbit(out).any()
    values = np.random.default_rng(14).standard_normal(1001).astype(dtype)
    assert running(dtype(0.0), values) == np.abs(values).max()
    values[517] = -np.nan
    assert np.isnan(running(dtype(0.0), values))
    values[517] = -np.inf
    assert running(dtype(0.0), values) == np.inf


@pytest.mark.skipif(SIMULATOR, reason="a CPU primitive")
@pytest.mark.parametrize("intrinsic", [True, False], ids=["llvm.maximum", "compare and select (LLVM < 18)"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cpu_largest_is_ieee_maximum(monkeypatch, intrinsic, dtype):
    """largest(x, y), the kernels' running maximum, both ways it compiles: the larger, NaN if
    either is NaN, +0 above −0; over edge values and every pair of them, in a loop the
    vectoriser may take (a reduction) and element by element."""

    from steadystep import _primitives

    if intrinsic and not _primitives.MAXIMUM_INTRINSIC:
        pytest.skip("this LLVM cannot lower llvm.maximum (it aborts); the other way is what it compiles")
    largest = _compiled_with(monkeypatch, _primitives, "MAXIMUM_INTRINSIC", intrinsic, _primitives.largest_typer)
    pairwise, running = _pairwise_and_running(largest)

    tiny = np.finfo(dtype).smallest_subnormal
    edges = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, tiny, -tiny, 3.5, -2.25], dtype)
    x, y = (grid.reshape(-1) for grid in np.meshgrid(edges, edges))
    out = np.empty_like(x)
    pairwise(x, y, out)
    expected = np.where(
        np.isnan(x) | np.isnan(y), np.nan, np.where(x == y, np.where(np.signbit(x), y, x), np.maximum(x, y))
    )
    np.testing.assert_array_equal(out, expected)
    assert np.array_equal(np.signbit(out[~np.isnan(out)]), np.signbit(expected[~np.isnan(expected)]))
    rng = np.random.default_rng(13)
    values = rng.standard_normal(1000).astype(dtype)
    assert running(values[0], values) == values.max()
    values[517] = np.nan
    assert np.isnan(running(values[0], values))
    signed_zeros = np.array([-0.0] * 40 + [0.0] + [-0.0] * 40, dtype)
    assert not np.signbit(running(signed_zeros[0], signed_zeros))
