"""bfloat16 and float16 storage through the public functions: every step, clipping, AMP's
flag, the elementwise and row formulas and the torch drop-ins compute in float32 and round
each result once to the storage; stochastic rounding for bfloat16.

References: torch.optim's fused Adam/AdamW on half-precision parameters (CPU); torch.optim in
float32 with every buffer rounded to the storage after each step (what "computed in float32,
rounded once" means, for the optimizers torch has no such path for: its CPU fused SGD leaves
most reduced-precision parameters unchanged, its fused Adagrad reads its state sum back
rounded, its foreach and single-tensor paths round every intermediate); torch's and
ml_dtypes' conversions; steadystep._half's NumPy generator for the stochastic rounding.
"""

import numpy as np
import pytest

from steadystep import _half, optim
from steadystep import numerical_stability as ns
from steadystep.arena import Layout
from tests.conftest import SIMULATOR
from tests.helpers import run_python

ml_dtypes = pytest.importorskip("ml_dtypes")
torch = pytest.importorskip("torch")

# the simulator runs the kernels' NaN arithmetic in NumPy scalars, which warn (a GPU does not)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
STORAGES = {"bfloat16": (BFLOAT16, torch.bfloat16), "float16": (np.dtype(np.float16), torch.float16)}


def rounded(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 values rounded once to ``dtype`` and widened back (exactly)."""
    return np.asarray(values, np.float32).astype(dtype).astype(np.float32)


def bits(array) -> np.ndarray:
    """The raw 16 bits of a half-precision NumPy array or torch tensor, as int32 (for ulp counts)."""
    if isinstance(array, torch.Tensor):
        return array.detach().view(torch.int16).numpy().astype(np.int32)
    return np.asarray(array).view(np.int16).astype(np.int32)


# -- the functional steps: the float32 step rounded once -----------------------------------------

N = 256 if SIMULATOR else 5120


def _layout():
    return Layout.of([(N // 2,), (N // 2,)])  # whole numbers of the arena's alignment: no padding


STEPS = {
    "sgd": (lambda p, g, s, t, **kw: optim.sgd(p, g, s[0], step=t, lr=0.1, momentum=0.9, nesterov=True, **kw), 1),
    "adam": (lambda p, g, s, t, **kw: optim.adam(p, g, *s, step=t, lr=1e-2, weight_decay=0.1, **kw), 2),
    "adamw_amsgrad": (
        lambda p, g, s, t, **kw: optim.adamw(p, g, *s, step=t, lr=1e-2, amsgrad=True, weight_decay=0.1, **kw),
        3,
    ),
    "rmsprop": (
        lambda p, g, s, t, **kw: optim.rmsprop(p, g, *s, lr=1e-2, momentum=0.5, centered=True, **kw),
        3,
    ),
    "adagrad": (lambda p, g, s, t, **kw: optim.adagrad(p, g, s[0], step=t, lr=0.1, lr_decay=0.01, **kw), 1),
    "lion": (lambda p, g, s, t, **kw: optim.lion(p, g, s[0], lr=1e-2, weight_decay=0.1, **kw), 1),
    "lars": (
        lambda p, g, s, t, **kw: optim.lars(
            p, g, s[0], layout=_layout(), lr=0.1, momentum=0.9, weight_decay=1e-3, **kw
        ),
        1,
    ),
}


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("name", STEPS)
def test_a_functional_step_on_half_arrays_is_the_float32_step_rounded_once(name, storage, target):
    """Three steps on ml_dtypes.bfloat16 / NumPy float16 arrays against the same steps on
    float32 arrays whose every buffer is rounded to the storage after each step."""
    dtype = STORAGES[storage][0]
    run, states = STEPS[name]
    rng = np.random.default_rng(1)
    param = rng.standard_normal(N).astype(dtype)
    state = [(np.abs(rng.standard_normal(N)) * 0.1).astype(dtype) for _ in range(states)]
    wide_param, wide_state = param.astype(np.float32), [buffer.astype(np.float32) for buffer in state]
    for t in range(1, 4):
        grad = rng.standard_normal(N).astype(dtype)
        run(param, grad, state, t, target=target)
        run(wide_param, grad.astype(np.float32), wide_state, t, target=target)
        wide_param[...] = rounded(wide_param, dtype)
        for buffer in wide_state:
            buffer[...] = rounded(buffer, dtype)
    assert param.dtype == dtype
    np.testing.assert_array_equal(param.astype(np.float32), wide_param)
    for buffer, wide in zip(state, wide_state):
        np.testing.assert_array_equal(buffer.astype(np.float32), wide)


def test_half_buffers_of_a_step_must_share_one_dtype(target):
    """As torch's fused steps: every buffer in the parameters' dtype; a uint16 array is not
    bfloat16 (its numbers are integers); nothing is written when refused."""
    param = np.ones(4, BFLOAT16)
    for grad, message in (
        (np.ones(4, np.float32), "grad has dtype float32 but param has bfloat16"),
        (np.ones(4, np.float16), "grad has dtype float16 but param has bfloat16"),
        (np.ones(4, np.uint16), "grad has dtype uint16 but param has bfloat16"),
    ):
        with pytest.raises(TypeError, match=message):
            optim.sgd(param, grad, step=1, lr=0.5, target=target)
    with pytest.raises(TypeError, match="param has dtype uint16; optimizer steps run on float32, float64, bfloat16"):
        optim.sgd(np.ones(4, np.uint16), np.ones(4, np.uint16), step=1, target=target)
    np.testing.assert_array_equal(param.astype(np.float32), np.ones(4, np.float32))


def test_adam_counts_beside_half_parameters_are_float32(target):
    """A count array (torch's state["step"]) beside bfloat16 parameters is float32, as torch's;
    a bfloat16 count (exact only to 256) is refused."""
    param, grad = np.ones(8, BFLOAT16), np.full(8, 0.5, BFLOAT16)
    exp_avg, exp_avg_sq = np.zeros(8, BFLOAT16), np.zeros(8, BFLOAT16)
    count = np.zeros(1, np.float32)
    optim.adam(param, grad, exp_avg, exp_avg_sq, step=count, lr=0.1, target=target)
    reference = [np.ones(8, BFLOAT16), np.zeros(8, BFLOAT16), np.zeros(8, BFLOAT16)]
    optim.adam(reference[0], grad, *reference[1:], step=1, lr=0.1, target=target)
    assert count[0] == 1 and np.array_equal(param, reference[0]) and np.array_equal(exp_avg_sq, reference[2])
    with pytest.raises(TypeError, match="step has dtype bfloat16 but param has bfloat16; keep the count in float32"):
        optim.adam(param, grad, exp_avg, exp_avg_sq, step=np.zeros(1, BFLOAT16), target=target)


def test_clipping_and_the_overflow_flag_on_half_gradients(target):
    """The norm is summed in float32 from the exact values; the scaled gradients are rounded
    once; the found-inf flag is float32, as GradScaler's."""
    rng = np.random.default_rng(2)
    for dtype in (BFLOAT16, np.dtype(np.float16)):
        grad = (rng.standard_normal(N) * 3).astype(dtype)
        wide = grad.astype(np.float32)
        exact = np.linalg.norm(grad.astype(np.float64))
        norm = optim.clip_grad_norm(grad, 1.0, target=target)
        assert norm == optim.clip_grad_norm(wide, 1.0, target=target)
        np.testing.assert_allclose(norm, exact, rtol=1e-5)
        np.testing.assert_array_equal(grad.astype(np.float32), rounded(wide, dtype))
        assert float(optim.sum_of_squares(grad, target=target)[0]) == pytest.approx(
            float(np.sum(grad.astype(np.float64) ** 2)), rel=1e-5
        )
        flag = optim.found_nonfinite(grad, target=target)
        assert flag.dtype == np.float32 and flag[0] == 0
        grad[7] = np.inf
        assert optim.found_nonfinite(grad, target=target)[0] == 1


# -- elementwise and row formulas ----------------------------------------------------------------


@pytest.mark.parametrize("storage", STORAGES)
def test_elementwise_and_row_formulas_give_half_for_half(storage, target):
    """Half in, the same half out (NumPy, ml_dtypes and torch alike), computed in float32:
    the float32 result rounded once; mixed with float32 the result is float32, as torch's."""
    dtype, torch_dtype = STORAGES[storage]
    x = np.linspace(-30, 30, 101).astype(dtype)
    wide = x.astype(np.float32)
    result = ns.softplus(x, target=target)
    assert result.dtype == dtype
    np.testing.assert_array_equal(result.astype(np.float32), rounded(ns.softplus(wide, target=target), dtype))
    tensor = torch.from_numpy(x.view(np.int16)).view(torch_dtype)
    from_torch = ns.log_add_exp(tensor, tensor, target=target)
    assert from_torch.dtype == torch_dtype
    np.testing.assert_array_equal(from_torch.float().numpy(), rounded(ns.log_add_exp(wide, wide, target=target), dtype))
    assert ns.log_add_exp(x, wide, target=target).dtype == np.float32
    out = np.empty_like(x)
    ns.sigmoid_stable(x, out=out, target=target)
    np.testing.assert_array_equal(out.astype(np.float32), rounded(ns.sigmoid_stable(wide, target=target), dtype))
    with pytest.raises(TypeError, match=f"out has dtype float32; the result is {storage}"):
        ns.sigmoid_stable(x, out=np.empty(101, np.float32), target=target)
    rows = x.reshape(1, 101)
    softmax = ns.softmax(rows, target=target)
    assert softmax.dtype == dtype
    np.testing.assert_array_equal(
        softmax.astype(np.float32), rounded(ns.softmax(wide.reshape(1, 101), target=target), dtype)
    )
    assert ns.logsumexp(x, target=target) == float(rounded(ns.logsumexp(wide, target=target), dtype))


# -- the torch drop-ins ------------------------------------------------------------------------------

torch_only = pytest.mark.skipif(SIMULATOR, reason="torch CPU tensors run on the CPU target")


def _flat_run(make, dtype, steps=30, size=4000):
    """A flat half-precision parameter stepped ``steps`` times by ``make([p])`` on seeded gradients."""
    torch.manual_seed(0)
    param = torch.randn(size, dtype=dtype).requires_grad_()
    optimizer = make([param])
    for _ in range(steps):
        param.grad = torch.randn(size, dtype=dtype)
        optimizer.step()
    return param.detach(), optimizer.state[param]


def _float32_run_rounded_to(dtype, make, steps=30, size=4000):
    """The reference for a half-precision step: ``make([p])`` stepping float32 buffers that hold
    _flat_run's half values and gradients, every buffer rounded to ``dtype`` after each step.
    The parameter (as "param") and the state but its count, in float32."""
    torch.manual_seed(0)
    param = torch.randn(size, dtype=dtype).float().requires_grad_()
    optimizer = make([param])
    for _ in range(steps):
        param.grad = torch.randn(size, dtype=dtype).float()
        optimizer.step()
        with torch.no_grad():
            for tensor in [param, *(v for k, v in optimizer.state[param].items() if k != "step")]:
                tensor.copy_(tensor.to(dtype).float())
    return {"param": param.detach()} | {k: v for k, v in optimizer.state[param].items() if k != "step"}


@torch_only
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize(
    "name, options",
    [
        ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
        ("Adam", dict(lr=1e-2, weight_decay=0.1)),
        ("Adam", dict(lr=1e-2, amsgrad=True, weight_decay=0.1)),
        ("AdamW", dict(lr=1e-2, amsgrad=True)),
    ],
)
def test_adam_family_matches_torchs_fused_step_on_half_parameters(name, options, storage):
    """30 steps against torch.optim's fused step on the same bfloat16/float16 parameters:
    equal bits but for at most a few elements 1 ulp apart (torch's vectorised CPU kernel
    orders or contracts a float32 multiply-add otherwise than ours)."""
    import steadystep.torch as st

    dtype = STORAGES[storage][1]
    ours, our_state = _flat_run(lambda p: getattr(st, name)(p, **options), dtype)
    theirs, their_state = _flat_run(lambda p: getattr(torch.optim, name)(p, fused=True, **options), dtype)
    for mine, reference in [(ours, theirs), *((our_state[k], their_state[k]) for k in their_state if k != "step")]:
        assert mine.dtype == dtype
        apart = np.abs(bits(mine) - bits(reference))
        assert apart.max() <= 1 and np.count_nonzero(apart) <= 4


@torch_only
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize(
    "name, options",
    [("LARS", dict(lr=1e-2, momentum=0.9, weight_decay=0.01)), ("Lion", dict(lr=1e-3, weight_decay=0.1))],
)
def test_drop_ins_torch_lacks_on_half_parameters_are_their_float32_step_rounded_once(name, options, storage):
    """LARS and Lion have no torch.optim twin: the drop-in's own float32 step on the widened
    buffers, every buffer rounded to the storage after each step, is the reference (LARS's
    decay mask and trust ratio are float32 beside half parameters). 30 steps, equal bits."""
    import steadystep.torch as st

    dtype = STORAGES[storage][1]
    ours, our_state = _flat_run(lambda p: getattr(st, name)(p, **options), dtype)
    reference = _float32_run_rounded_to(dtype, lambda p: getattr(st, name)(p, **options))
    torch.manual_seed(0)
    assert ours.dtype == dtype and not torch.equal(ours, torch.randn(4000, dtype=dtype))  # it moved
    for mine, value in [(ours, reference["param"]), *((our_state[k], v) for k, v in reference.items() if k != "param")]:
        assert mine.dtype == dtype
        np.testing.assert_array_equal(bits(mine), bits(value.to(dtype)))


@pytest.mark.slow  # starts processes of its own
@torch_only
def test_lars_on_bfloat16_parameters_needs_no_numpy_bfloat16():
    """NumPy knows bfloat16 only once ml_dtypes is imported (as these tests do): the drop-in's
    decay mask must not ask NumPy for it."""
    result = run_python("""
import sys
sys.modules["ml_dtypes"] = None  # as if it were not installed
import torch, steadystep.torch as st
param = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
optimizer = st.LARS([param], lr=10.0, weight_decay=0.01)
param.grad = torch.ones_like(param)
optimizer.step()
print(param.dtype, bool((param < 1).all()))
""")
    assert result.stdout.split() == ["torch.bfloat16", "True"], result.stderr


@torch_only
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize(
    "name, options, exact",
    [
        ("SGD", dict(lr=1e-2), True),
        ("SGD", dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.01), True),
        ("Adagrad", dict(lr=1e-2, lr_decay=0.01), True),
        ("RMSprop", dict(lr=1e-3, momentum=0.5), False),
        ("RMSprop", dict(lr=1e-3, centered=True, weight_decay=0.01), False),
        ("AdamW", dict(lr=1e-2), False),
    ],
)
def test_drop_ins_on_half_parameters_are_torchs_float32_step_rounded_once(name, options, exact, storage):
    """torch.optim's own float32 step (single-tensor) on the widened buffers, every buffer
    rounded to the storage after each step, 30 steps: equal bits, state included, for SGD and
    Adagrad. RMSprop's square average and AdamW's second moment are rounded in float32 once
    where torch's single-tensor step rounds twice (α·s, then + (1 − α)·g²), so a few elements
    of 4000 end 1 ulp apart, and where such an element feeds a momentum, 2."""
    import steadystep.torch as st

    dtype = STORAGES[storage][1]
    ours, our_state = _flat_run(lambda p: getattr(st, name)(p, **options), dtype)
    reference = _float32_run_rounded_to(dtype, lambda p: getattr(torch.optim, name)(p, foreach=False, **options))
    assert ours.dtype == dtype
    for mine, value in [(ours, reference["param"]), *((our_state[k], v) for k, v in reference.items() if k != "param")]:
        apart = np.abs(bits(mine) - bits(value.to(dtype)))
        assert apart.max() == 0 if exact else (apart.max() <= 2 and np.count_nonzero(apart) <= 4)


@torch_only
def test_grad_scaler_with_float16_parameters_behaves_as_with_torchs_fused_adamw():
    """GradScaler hands a fused optimizer its scale and flag (no unscale_ of float16 gradients,
    which torch refuses): the same parameters and scale as torch's fused AdamW, and the same
    refusal of an explicit unscale_."""
    import steadystep.torch as st

    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(8, 4).half(), torch.nn.Linear(8, 4).half()
    theirs.load_state_dict(ours.state_dict())
    runs = [
        (ours, st.AdamW(ours.parameters(), lr=1e-2), torch.amp.GradScaler("cpu", init_scale=2.0**20)),
        (
            theirs,
            torch.optim.AdamW(theirs.parameters(), lr=1e-2, fused=True),
            torch.amp.GradScaler("cpu", init_scale=2.0**20),
        ),
    ]
    x = torch.randn(16, 8).half()
    for _ in range(6):  # the first steps overflow float16 gradients at this scale: skipped, scale backs off
        for model, optimizer, scaler in runs:
            optimizer.zero_grad()
            scaler.scale(model(x).float().pow(2).mean()).backward()
            scaler.step(optimizer)
            scaler.update()
    assert runs[0][2].get_scale() == runs[1][2].get_scale() < 2.0**20
    for mine, reference in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(mine, reference)
    for model, optimizer, scaler in runs:
        optimizer.zero_grad()
        scaler.scale(model(x).float().pow(2).mean()).backward()
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
            scaler.unscale_(optimizer)


# -- stochastic rounding ---------------------------------------------------------------------------


def _sgd_rounded(param: np.ndarray, grad: np.ndarray, lr: float, seed, target) -> tuple[np.ndarray, np.ndarray]:
    """bfloat16 ``param`` after SGD's step p − lr·g, rounded under ``seed``, and the float32
    result before rounding (the same step on float32 copies)."""
    stepped = param.copy()
    optim.sgd(stepped, grad, step=1, lr=lr, rounding_seed=seed, target=target)
    exact = param.astype(np.float32)
    optim.sgd(exact, grad.astype(np.float32), step=1, lr=lr, target=target)
    return stepped, exact


def test_stochastic_rounding_is_unbiased(target):
    """Many roundings of one value: their mean is the value, within 4 standard errors, and
    each is one of its two bfloat16 neighbours, the upper one with the right probability."""
    size = 4_000 if SIMULATOR else 400_000  # the simulator runs a Python thread an element
    ones = np.ones(size, BFLOAT16)
    stepped, exact = _sgd_rounded(ones, -ones, 2**-7 * 0.3, 11, target)  # 30% of the way to the next bfloat16
    if target != "cpu":  # the CPU's bits, which the CPU run of this test checks at 100 times the size
        assert np.array_equal(
            stepped.view(np.uint16), _sgd_rounded(ones, -ones, 2**-7 * 0.3, 11, "cpu")[0].view(np.uint16)
        )
    value = exact[0]
    assert np.all(exact == value) and abs(value - (1 + 2**-7 * 0.3)) < 1e-7
    samples = stepped.astype(np.float64)
    assert set(np.unique(samples)) <= {1.0, 1 + 2**-7}
    up = np.mean(samples > 1)
    error = np.sqrt(0.3 * 0.7 / size)
    assert abs(up - 0.3) < 4 * error
    assert abs(samples.mean() - value) < 4 * error * 2**-7


def test_stochastic_rounding_is_the_same_for_a_seed_on_every_target_and_thread_count(target):
    """The bits depend on (seed, element) alone: equal to the NumPy reference generator (hence
    the same on the CPU and the simulator), on one thread and on all of them; another seed
    draws other bits."""
    import numba

    rng = np.random.default_rng(3)
    size = 70_000 if not SIMULATOR else 2_000
    param = (rng.standard_normal(size) * 10).astype(BFLOAT16)
    param[:5] = [np.inf, -np.inf, 3.3e38, -0.0, 1e-39]  # to nearest where not finite or beyond the range
    param[5:25] = ml_dtypes.finfo(BFLOAT16).max  # stepped past it, where rounding up would give inf
    grad = rng.standard_normal(size).astype(BFLOAT16)
    grad[3:5] = 0
    grad[5:25] = -1e36
    key = optim._rounding(5, param)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single, exact = _sgd_rounded(param, grad, 0.37, 5, target)
    finally:
        numba.set_num_threads(threads)
    every, _ = _sgd_rounded(param, grad, 0.37, 5, target)
    reference = _half.stochastic_bfloat16(exact, np.arange(size), key)
    assert np.array_equal(single.view(np.uint16), reference) and np.array_equal(every.view(np.uint16), reference)
    assert not np.array_equal(every.view(np.uint16), _sgd_rounded(param, grad, 0.37, 6, target)[0].view(np.uint16))
    assert np.array_equal(every[:25].view(np.uint16), _half.narrowed(exact[:25], _half.BFLOAT16_BITS))
    assert np.all(exact[5:25] > ml_dtypes.finfo(BFLOAT16).max) and np.all(np.isfinite(every[5:25]))


def test_stochastic_rounding_moves_a_parameter_round_to_nearest_leaves_stuck(target):
    """p = 1 in bfloat16 and an update of 1e−4 per step: below half an ulp (2⁻⁸), so round to
    nearest never moves it; stochastic rounding moves it by the updates' sum on average."""
    # The simulator (a Python thread an element) runs a small case and must give the CPU's bits
    # for it; the CPU run checks the statistics on a case large enough to tell moving from stuck.
    size, steps = (128, 16) if SIMULATOR else (20_000, 100)

    def run(target):
        stuck, moving = np.ones(size, BFLOAT16), np.ones(size, BFLOAT16)
        grad = np.ones(size, BFLOAT16)
        for t in range(1, steps + 1):
            optim.sgd(stuck, grad, step=t, lr=1e-4, target=target)
            optim.sgd(moving, grad, step=t, lr=1e-4, rounding_seed=optim.step_seed(1, t), target=target)
        return stuck, moving

    stuck, moving = run(target)
    assert np.all(stuck.astype(np.float32) == 1)
    if target != "cpu":
        assert np.array_equal(moving.view(np.uint16), run("cpu")[1].view(np.uint16))
        return
    expected = 1 - steps * 1e-4
    assert abs(moving.astype(np.float64).mean() - expected) < 10 * 2**-8 / np.sqrt(size) * np.sqrt(steps)
    assert abs(1 - expected) > 10 * 2**-8 / np.sqrt(size) * np.sqrt(steps)  # a stuck parameter would fail


def test_stochastic_rounding_needs_bfloat16(target):
    for dtype in (np.float16, np.float32):
        with pytest.raises(ValueError, match=f"rounding_seed is given but param is {np.dtype(dtype)}"):
            optim.sgd(np.ones(3, dtype), np.ones(3, dtype), step=1, rounding_seed=1, target=target)
    with pytest.raises(ValueError, match="rounding_seed must be a whole number"):
        optim.sgd(np.ones(3, BFLOAT16), np.ones(3, BFLOAT16), step=1, rounding_seed=-1, target=target)


@torch_only
def test_drop_in_stochastic_rounding():
    """``stochastic_rounding=True``: the same seed gives the same bits, another seed others,
    and the parameter moves where round to nearest leaves it; float32 parameters refuse it."""
    import steadystep.torch as st

    def run(**options):
        param = torch.ones(10_000, dtype=torch.bfloat16, requires_grad=True)
        optimizer = st.SGD([param], lr=1e-4, **options)
        for _ in range(50):
            param.grad = torch.ones_like(param)
            optimizer.step()
        return param.detach()

    nearest, first, again, other = (
        run(),
        run(stochastic_rounding=True, seed=4),
        run(stochastic_rounding=True, seed=4),
        run(stochastic_rounding=True, seed=5),
    )
    assert torch.all(nearest == 1)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert abs(first.double().mean().item() - (1 - 50e-4)) < 1e-3
    param = torch.ones(3, requires_grad=True)
    optimizer = st.SGD([param], stochastic_rounding=True)
    param.grad = torch.ones(3)
    with pytest.raises(ValueError, match="param_groups\\[0\\] asks for stochastic_rounding.*torch.float32"):
        optimizer.step()
    assert torch.all(param == 1)
    with pytest.raises(ValueError, match="seed must be a whole number"):
        st.AdamW([param], seed=-2)


def test_float16_device_arrays_are_read_and_written_as_their_bits(target):
    """A Numba device array of float16 (CuPy's and torch's CUDA float16 give the same
    interface, typestr "<f2") is stepped and computed on in place as its bits; row formulas
    widen its rows on the GPU and round each result once into float16."""
    if target != "cuda":
        pytest.skip("device arrays run on target cuda")
    from numba import cuda

    rng = np.random.default_rng(4)
    host = rng.standard_normal(256).astype(np.float16)
    grad = rng.standard_normal(256).astype(np.float16)
    param, device_grad = cuda.to_device(host), cuda.to_device(grad)
    optim.sgd(param, device_grad, step=1, lr=0.1)
    wide = host.astype(np.float32)
    optim.sgd(wide, grad.astype(np.float32), step=1, lr=0.1, target="cuda")
    np.testing.assert_array_equal(param.copy_to_host(), wide.astype(np.float16))
    rows = cuda.to_device(host.reshape(4, 64))
    softmax = ns.softmax(rows)
    assert softmax.dtype == np.float16 and hasattr(softmax, "copy_to_host")
    expected = ns.softmax(host.reshape(4, 64).astype(np.float32), target="cuda")
    np.testing.assert_array_equal(softmax.copy_to_host(), expected.astype(np.float16))
    totals = cuda.device_array(4, np.float16)
    ns.logsumexp(rows, out=totals)
    expected = ns.logsumexp(host.reshape(4, 64).astype(np.float32), target="cuda").astype(np.float16)
    np.testing.assert_array_equal(totals.copy_to_host(), expected)
    result = ns.softplus(param)
    assert result.dtype == np.float16 and hasattr(result, "copy_to_host")
    np.testing.assert_array_equal(
        result.copy_to_host(), ns.softplus(wide.astype(np.float16).astype(np.float32), target="cuda").astype(np.float16)
    )


# -- the layers around the kernels: arenas, host copies, models, what refuses half precision -------


@torch_only
def test_arenas_hold_half_precision_and_host_copies_give_its_numbers():
    """Arena.pack of float16, ml_dtypes.bfloat16 and torch bfloat16 tensors keeps their dtype
    and values (the views are the packed numbers, not their bits read as numbers); the host
    copies the evaluation helpers read are the float32 numbers; a float16 feature matrix
    gives the float32 one's evaluation."""
    from steadystep import decentral, dispatch, models
    from steadystep.arena import Arena

    values = [np.array([1.5, -2.25, 3e-5]), np.array([65504.0, -0.0])]
    for pack in (
        lambda v: v.astype(np.float16),
        lambda v: v.astype(BFLOAT16),
        lambda v: torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16),
    ):
        tensors = [pack(v) for v in values]
        arena = Arena.pack(tensors)
        assert arena.buffer.dtype == tensors[0].dtype and "int16" not in repr(arena)
        for view, tensor in zip(arena.views, tensors):
            np.testing.assert_array_equal(dispatch.host_array(view), dispatch.host_array(tensor))
        np.testing.assert_array_equal(
            dispatch.host_array(tensors[0]),
            np.asarray(tensors[0].float() if hasattr(tensors[0], "float") else tensors[0], np.float32),
        )
    with pytest.raises(TypeError, match="tensors\\[1\\] has dtype float16 but tensors\\[0\\] has bfloat16"):
        Arena.pack([np.ones(2, BFLOAT16), np.ones(2, np.float16)])
    rows = np.array([[1.5, 2.0], [2.5, 4.0]], np.float16)
    np.testing.assert_array_equal(decentral.mean_model(rows), [2.0, 3.0])
    model = models.softmax_regression(3, 2)
    features = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float16)
    labels = np.arange(8) % 2
    point = np.full((1, model.dim), 0.1, np.float32)
    assert model.evaluate(point, features, labels) == model.evaluate(point, features.astype(np.float32), labels)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("order", ["awc", "atc"])
@pytest.mark.parametrize("kind", ["ring", "complete", "one_peer_exponential", "matrix"])
def test_the_decentralized_step_on_half_rows_is_the_float32_step_rounded_once(kind, order, storage, target):
    """[N, D] rows in bfloat16/float16 (NumPy and ml_dtypes; float16 on the simulator, whose
    device arrays have no bfloat16): mixing and AdamW in float32, the rows and moments
    rounded once per step, against the float32 optimizer on widened rows rounded after each
    step; clipping by whole-row norms; save and load keep the storage, bit for bit."""
    from steadystep import decentral

    if target == "cuda" and storage == "bfloat16":
        with pytest.raises(TypeError, match="params is a bfloat16 host array and the target is the GPU"):
            decentral.DecentralizedAdamW(np.ones((2, 4), BFLOAT16), topology=decentral.ring(), target=target)
        return
    dtype = STORAGES[storage][0]
    topology = (
        decentral.from_matrix(np.full((4, 4), 0.25), "uniform") if kind == "matrix" else getattr(decentral, kind)()
    )
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((4, 300)).astype(dtype)
    options = dict(
        topology=topology, order=order, lr=1e-2, weight_decay=0.1, max_norm=1.0, consensus=0.7, target=target
    )
    half = decentral.DecentralizedAdamW(rows.copy(), **options)
    wide = decentral.DecentralizedAdamW(rows.astype(np.float32), **options)
    for _ in range(3):
        grads = (rng.standard_normal((4, 300)) * 3).astype(dtype)
        half.step(grads)
        wide.step(grads.astype(np.float32))
        for buffer in (wide.params, wide.exp_avg, wide.exp_avg_sq):
            host = buffer.copy_to_host() if hasattr(buffer, "copy_to_host") else buffer
            rounded_host = rounded(host, dtype)
            if hasattr(buffer, "copy_to_host"):
                buffer.copy_to_device(rounded_host)
            else:
                buffer[...] = rounded_host
    for mine, reference in (
        (half.params, wide.params),
        (half.exp_avg, wide.exp_avg),
        (half.exp_avg_sq, wide.exp_avg_sq),
    ):
        mine = mine.copy_to_host() if hasattr(mine, "copy_to_host") else mine
        reference = reference.copy_to_host() if hasattr(reference, "copy_to_host") else reference
        assert mine.dtype == dtype
        np.testing.assert_array_equal(mine.astype(np.float32), reference)
    if target == "cpu":
        import tempfile

        with tempfile.TemporaryDirectory() as directory:
            half.save(f"{directory}/run.npz")
            back = decentral.DecentralizedAdamW.load(f"{directory}/run.npz", topology=topology)
        assert back.params.dtype == dtype and np.array_equal(back.params, half.params)
        assert np.array_equal(back.exp_avg_sq, half.exp_avg_sq) and back.t == half.t


@torch_only
def test_the_decentralized_step_on_torch_bfloat16_rows():
    """torch bfloat16 rows: stepped in place, moments in bfloat16, a checkpoint loaded back
    into torch bfloat16 (like=), and rank rows, whose exchange would mix bits, refused."""
    from steadystep import decentral

    torch.manual_seed(0)
    rows = torch.randn(4, 200).bfloat16()
    start = rows.clone()
    optimizer = decentral.DecentralizedAdamW(rows, topology=decentral.ring(), lr=1e-2)
    optimizer.step(torch.randn(4, 200).bfloat16())
    assert optimizer.params is rows and not torch.equal(rows, start) and optimizer.exp_avg.dtype == torch.bfloat16
    wide = decentral.DecentralizedAdamW(start.float(), topology=decentral.ring(), lr=1e-2)
    torch.manual_seed(0)
    torch.randn(4, 200)
    wide.step(torch.randn(4, 200).bfloat16().float())
    assert torch.equal(rows, wide.params.bfloat16())
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        optimizer.save(f"{directory}/run.npz")
        back = decentral.DecentralizedAdamW.load(f"{directory}/run.npz", like=rows)
    assert back.params.dtype == torch.bfloat16 and torch.equal(back.params, rows)


def test_what_does_not_take_half_precision_yet_says_so_by_name(target):
    """The reference models run on float32/float64 rows; GradScaler's state stays float32;
    a rank's row is mixed in float32: refused naming bfloat16/float16, not their bits' uint16."""
    from steadystep import models

    with pytest.raises(TypeError, match="params has dtype float16; use float32 or float64"):
        models.softmax_regression(3, 2).evaluate(np.ones((1, 128), np.float16), np.ones((2, 3)), np.zeros(2, int))
    flag = np.zeros(1, np.float32)
    with pytest.raises(TypeError, match="scale is float16; keep GradScaler's state in float32"):
        optim.update_loss_scale(np.ones(1, np.float16), np.zeros(1, np.float16), flag, target=target)


@torch_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_torch_module_trainer_trains_a_half_precision_module(dtype):
    """DecentralizedTrainer on a bfloat16/float16 module (its forward and backward in that
    dtype, torch's; the step the flat one on the [N, D] rows, whose bits the tests above
    check): the rows and the mean model keep the module's dtype, and the loss falls."""
    from steadystep import decentral
    from steadystep.torch.decentral import DecentralizedTrainer

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(dtype)
    trainer = DecentralizedTrainer(module, workers=4, topology=decentral.ring(), lr=3e-2, max_norm=1.0)
    inputs = torch.randn(4, 32, 8).to(dtype)
    targets = (inputs[..., 0] > 0).long() + (inputs[..., 1] > 0).long()
    first = trainer.step(inputs, targets).losses.float().mean().item()
    for _ in range(40):
        last = trainer.step(inputs, targets).losses.float().mean().item()
    assert last < 0.6 * first
    assert trainer.params.dtype == dtype and trainer.mean_model()[0].weight.dtype == dtype
    assert np.isfinite(trainer.consensus_distance())
