"""Top eigenpairs, trace and spectral density against dense Hessians (NumPy's eigh, torch's
autograd.functional.hessian), closed-form errors, and PyHessian where it installs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from steadystep import curvature, diagnostics, models
from steadystep.dispatch import use_target
from tests.conftest import SIMULATOR
from tests.helpers import to_device

cpu_only = pytest.mark.skipif(SIMULATOR, reason="host-side NumPy; the simulator process runs the target tests")


def spectrum_matrix(values, seed=0) -> np.ndarray:
    """A dense symmetric matrix with the given eigenvalues, in a random basis."""
    values = np.asarray(values, dtype=np.float64)
    basis, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(len(values), len(values))))
    return basis @ np.diag(values) @ basis.T


def spectra(most: int):
    """Spectra of 1 to ``most`` eigenvalues: any within ±1e3 (tiny ones too), and 0 and ±1
    often enough to repeat."""
    value = st.one_of(st.floats(-1e3, 1e3, allow_subnormal=False), st.sampled_from([0.0, 1.0, -1.0]))
    return st.lists(value, min_size=1, max_size=most)


def true_residuals(hessian, pairs):
    vectors = np.asarray(pairs.vectors)
    return np.linalg.norm(vectors @ hessian.T - vectors * np.asarray(pairs.values)[:, None], axis=1)


def assert_pairs_match(hessian, pairs, which="largest", rtol=1e-8, clusters=False):
    """Values as eigh's, unit vectors whose true residuals lie within the reported bounds, and
    each value within its bound of an eigenvalue (Krylov–Weinstein). With ``clusters``,
    eigenvalues closer than the residuals resolve are one: a value is then as close to eigh's
    as twice its bound plus the tolerance (1e-6 of the scale)."""
    exact = np.linalg.eigvalsh(hessian)
    k = len(pairs.values)
    if which == "largest":
        expected = exact[::-1][:k]
    elif which == "smallest":
        expected = exact[:k]
    else:
        expected = exact[np.argsort(-np.abs(exact), kind="stable")][:k]
    scale = np.abs(exact).max()
    bounds = np.asarray(pairs.residual_norms)
    slack = 2 * bounds + 1e-6 * scale if clusters else 0.0
    assert np.all(np.abs(np.asarray(pairs.values) - expected) <= rtol * scale + slack), (pairs.values, expected)
    np.testing.assert_allclose(np.linalg.norm(pairs.vectors, axis=1), 1.0, rtol=1e-12)
    assert np.all(true_residuals(hessian, pairs) <= bounds * (1 + 1e-9) + 1e-14 * scale)
    for value, bound in zip(pairs.values, bounds):
        assert np.abs(exact - value).min() <= bound + 1e-14 * scale


# -- torch models whose dense Hessian torch forms --------------------------------------------------


def torch_problem(dtype_name="float64", seed=0):
    """A small tanh MLP, three uneven batches, its ModuleHessian and the dense Hessian of the
    mean loss over all the data (torch.autograd.functional.hessian)."""
    torch = pytest.importorskip("torch")
    from steadystep.torch.curvature import ModuleHessian

    torch.manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(dtype)
    inputs = torch.randn(23, 4, dtype=dtype)
    targets = torch.randint(0, 3, (23,))
    batches = [(inputs[:5], targets[:5]), (inputs[5:16], targets[5:16]), (inputs[16:], targets[16:])]
    source = ModuleHessian(model, torch.nn.CrossEntropyLoss(), batches, dtype=torch.float64)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()

    def loss(vector):
        return source._loss(vector, (inputs.double(),), targets)

    dense = torch.autograd.functional.hessian(loss, flat).numpy()
    return model, batches, source, (dense + dense.T) / 2


@cpu_only
@pytest.mark.parametrize("which", ["largest", "smallest", "magnitude"])
def test_lanczos_finds_the_extreme_eigenpairs_of_a_torch_models_hessian(which):
    _, _, source, dense = torch_problem()
    pairs = curvature.top_eigenpairs(source, source.dim, k=4, which=which)
    assert pairs.converged and pairs.method == "lanczos"
    assert_pairs_match(dense, pairs, which)
    # one call per block step, over the block of k vectors (the last one what is left of the D)
    assert pairs.calls == math.ceil(pairs.products / 4) and pairs.products <= source.dim


@cpu_only
def test_power_iteration_agrees_within_its_bounds_and_needs_more_products():
    hessian = spectrum_matrix([10.0, -7.0, 3.0, 1.0, 0.5, -0.25, 0.1, 0.0])
    hvp = diagnostics.matrix_hvp(hessian)
    power = curvature.top_eigenpairs(hvp, 8, k=2, method="power", tolerance=1e-10, max_steps=2000)
    assert power.converged and power.method == "power"
    assert_pairs_match(hessian, power, "magnitude")  # -7 before 3: power iteration's order
    lanczos = curvature.top_eigenpairs(hvp, 8, k=2, which="magnitude", tolerance=1e-10)
    assert_pairs_match(hessian, lanczos, "magnitude")
    assert power.products > 3 * lanczos.products
    # more vectors than pairs: convergence as |λ₄/λ₂| = 1/3 instead of |λ₃/λ₂| = 3/7 per step
    wider = curvature.top_eigenpairs(hvp, 8, k=2, method="power", block=3, tolerance=1e-10, max_steps=2000)
    assert_pairs_match(hessian, wider, "magnitude")
    assert wider.calls < power.calls and wider.products == 3 * wider.calls
    short = curvature.top_eigenpairs(hvp, 8, k=2, method="power", max_steps=3)
    assert not short.converged and short.products == 6
    for value, bound in zip(short.values, short.residual_norms):  # unconverged bounds still hold
        assert np.abs(np.linalg.eigvalsh(hessian) - value).min() <= bound


@cpu_only
@settings(max_examples=60, deadline=None)
@given(
    eigenvalues=spectra(40),
    k=st.integers(1, 12),
    block=st.integers(1, 5),
    which=st.sampled_from(["largest", "smallest", "magnitude"]),
    seed=st.integers(0, 2**16),
)
def test_lanczos_agrees_with_eigh_on_any_spectrum(eigenvalues, k, block, which, seed):
    """Repeated, zero and negative eigenvalues, invariant subspaces (the basis goes on from
    random directions), blocks wider than what is left: eigh's values, bounds that hold.
    A block narrower than k only with well-separated eigenvalues (see top_eigenpairs)."""
    k = min(k, len(eigenvalues))
    # a Krylov space of blocks of b vectors holds at most b copies of a repeated eigenvalue
    distinct = np.unique(eigenvalues)
    assume(block >= k or (len(distinct) == len(eigenvalues) and np.diff(distinct).min(initial=1.0) >= 1e-3))
    hessian = spectrum_matrix(eigenvalues, seed)
    pairs = curvature.top_eigenpairs(diagnostics.matrix_hvp(hessian), len(eigenvalues), k, which=which, block=block)
    assert pairs.converged
    if which == "magnitude":  # ties in |λ| (3 and −3) may come in either order
        found, expected = np.sort(np.abs(pairs.values))[::-1], np.sort(np.abs(eigenvalues))[::-1][:k]
        slack = 2 * np.max(pairs.residual_norms) + 1e-6 * np.abs(eigenvalues).max()  # a cluster is one
        assert np.all(np.abs(found - expected) <= 1e-8 * max(1.0, np.abs(eigenvalues).max()) + slack)
        assert np.all(true_residuals(hessian, pairs) <= np.asarray(pairs.residual_norms) * (1 + 1e-9) + 1e-12)
    else:
        assert_pairs_match(hessian, pairs, which, rtol=1e-8, clusters=True)


@cpu_only
def test_an_identity_block_and_a_rank_one_hessian_close_the_krylov_space_early():
    """H = diag(5, 1, ..., 1): every start block spans an invariant subspace after one step."""
    hessian = np.diag([5.0] + [1.0] * 9)
    pairs = curvature.top_eigenpairs(diagnostics.matrix_hvp(hessian), 10, k=3, block=1)
    np.testing.assert_allclose(pairs.values, [5.0, 1.0, 1.0], rtol=1e-12)
    rank_one = np.outer(np.arange(1.0, 7.0), np.arange(1.0, 7.0))
    pairs = curvature.top_eigenpairs(diagnostics.matrix_hvp(rank_one), 6, k=2)
    np.testing.assert_allclose(pairs.values, [91.0, 0.0], atol=1e-12)


@cpu_only
def test_a_support_ignores_padding_and_keeps_vectors_zero_there():
    hessian = spectrum_matrix([4.0, 3.0, -1.0, 0.5])
    padded = np.zeros((7, 7))
    support = np.array([0, 2, 3, 6])
    padded[np.ix_(support, support)] = hessian
    padded[1, 1] = padded[4, 4] = 100.0  # what an H·v might put in padding: never asked for
    hvp = diagnostics.matrix_hvp(padded)
    pairs = curvature.top_eigenpairs(hvp, 7, k=2, support=support)
    np.testing.assert_allclose(pairs.values, [4.0, 3.0], rtol=1e-10)
    assert np.all(pairs.vectors[:, [1, 4, 5]] == 0.0)
    trace = curvature.hessian_trace(hvp, 7, support=support, method="hutch++", sketch=4)
    assert trace.trace.value == pytest.approx(6.5, rel=1e-12) and trace.trace.standard_error < 1e-12
    density = curvature.spectral_density(hvp, 7, support=support, steps=4, probes=2)
    for nodes in density.nodes:  # a Krylov space over the 4 coordinates: their eigenvalues, never 100
        np.testing.assert_allclose(nodes, [-1.0, 0.5, 3.0, 4.0], atol=1e-12)


@cpu_only
def test_k_equal_to_the_dimension_gives_the_whole_spectrum():
    hessian = spectrum_matrix(np.linspace(-3, 3, 9))
    pairs = curvature.top_eigenpairs(diagnostics.matrix_hvp(hessian), 9, k=9)
    assert_pairs_match(hessian, pairs, rtol=1e-12)


# -- trace ---------------------------------------------------------------------------------------------


def hutchinson_error(hessian, probes):
    """The exact standard error of the mean of R Rademacher forms: Var(rᵀHr) = 2 Σ_{i≠j} H_ij²."""
    off_diagonal = np.sum(hessian**2) - np.sum(np.diag(hessian) ** 2)
    return math.sqrt(2 * off_diagonal / probes)


@cpu_only
def test_hutchinson_trace_of_a_torch_model_lies_within_three_standard_errors():
    _, _, source, dense = torch_problem()
    estimate = curvature.hessian_trace(source, source.dim, tolerance=0.02)
    assert estimate.converged and estimate.trace.standard_error <= 0.02 * abs(estimate.trace.value)
    assert abs(estimate.trace.value - np.trace(dense)) <= 3 * estimate.trace.standard_error
    assert estimate.probes == len(estimate.trace.samples) == estimate.products


@cpu_only
def test_the_trace_error_shrinks_as_one_over_the_root_of_the_probes():
    hessian = spectrum_matrix(np.linspace(-1, 4, 40), seed=3)
    hvp = diagnostics.matrix_hvp(hessian)
    errors = []
    for probes in (16, 64, 256, 1024):
        estimate = curvature.hessian_trace(hvp, 40, tolerance=0.0, min_probes=probes, max_probes=probes, seed=1)
        assert estimate.probes == probes and not estimate.converged
        # the reported error estimates the exact one (a sample deviation: within ±40% at 16 probes)
        assert estimate.trace.standard_error == pytest.approx(hutchinson_error(hessian, probes), rel=0.4)
        assert abs(estimate.trace.value - np.trace(hessian)) <= 3 * hutchinson_error(hessian, probes)
        errors.append(estimate.trace.standard_error)
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    np.testing.assert_allclose(ratios, 2.0, rtol=0.35)  # 4x the probes: half the error


@cpu_only
def test_hutch_plus_plus_reaches_a_smaller_error_for_a_few_large_eigenvalues():
    """A spectrum with 5 large eigenvalues and a small tail: the sketch takes the large ones
    exactly, so the deflated probes see only the tail."""
    values = np.concatenate([[50.0, 40.0, -30.0, 20.0, 10.0], np.random.default_rng(2).uniform(-0.1, 0.1, 55)])
    hessian = spectrum_matrix(values, seed=4)
    hvp = diagnostics.matrix_hvp(hessian)
    plain = curvature.hessian_trace(hvp, 60, tolerance=0.0, min_probes=48, max_probes=48)
    plus = curvature.hessian_trace(hvp, 60, tolerance=0.0, method="hutch++", sketch=8, min_probes=32, max_probes=32)
    assert plain.products == plus.products == 48
    assert plus.trace.standard_error < plain.trace.standard_error / 10
    for estimate in (plain, plus):
        assert abs(estimate.trace.value - values.sum()) <= 3 * estimate.trace.standard_error
    everything = curvature.hessian_trace(hvp, 60, method="hutch++", sketch=60)  # the sketch spans all: exact
    assert everything.trace.value == pytest.approx(values.sum(), abs=1e-10)
    assert everything.trace.standard_error < 1e-12 and everything.sketch_trace == pytest.approx(values.sum())


@cpu_only
def test_the_adaptive_stop_meets_the_tolerance_or_says_it_did_not():
    hessian = spectrum_matrix(np.linspace(1.0, 3.0, 30), seed=5)
    hvp = diagnostics.matrix_hvp(hessian)
    loose = curvature.hessian_trace(hvp, 30, tolerance=0.05)
    tight = curvature.hessian_trace(hvp, 30, tolerance=0.005)
    assert loose.converged and tight.converged and loose.probes < tight.probes
    for estimate, tolerance in ((loose, 0.05), (tight, 0.005)):
        assert estimate.trace.standard_error <= tolerance * abs(estimate.trace.value)
        assert estimate.probes in (16, 32, 64, 128, 256, 512, 1024)  # min_probes, then doubling
    capped = curvature.hessian_trace(hvp, 30, tolerance=1e-6, max_probes=40)
    assert not capped.converged and capped.probes == 40
    json.loads(capped.to_json())  # JSON as every report


# -- spectral density -------------------------------------------------------------------------------


@cpu_only
def test_hutch_plus_plus_sketches_min_of_n_and_32_vectors_by_default():
    """The sketch costs 2·sketch products before the probes: 2·32 at n = 60; at n = 20 the
    default sketch is all 20 directions, and the trace is exact."""
    values = np.linspace(-3.0, 5.0, 60)
    wide = curvature.hessian_trace(
        diagnostics.matrix_hvp(spectrum_matrix(values, seed=1)), 60, method="hutch++", min_probes=4, max_probes=4
    )
    assert wide.products == 2 * 32 + 4
    narrow = curvature.hessian_trace(
        diagnostics.matrix_hvp(spectrum_matrix(values[:20], seed=1)), 20, method="hutch++", min_probes=4, max_probes=4
    )
    assert narrow.products == 2 * 20 + 4
    assert narrow.sketch_trace == pytest.approx(values[:20].sum(), abs=1e-10)


@cpu_only
def test_the_density_is_one_percent_of_the_nodes_spread_wide_with_a_floor_by_default():
    """σ = 1% of the Ritz values' spread; at least 1e-4 of their magnitude (a cluster far from
    zero); 0.01 when every node is zero."""
    spread = curvature.spectral_density(diagnostics.matrix_hvp(np.diag(np.linspace(-1.0, 8.0, 10))), 10, steps=10)
    assert (min(map(min, spread.nodes)), max(map(max, spread.nodes))) == pytest.approx((-1.0, 8.0), abs=1e-9)
    assert spread.sigma == pytest.approx(0.09, rel=1e-9)
    cluster = curvature.spectral_density(diagnostics.matrix_hvp(1000.0 * np.eye(6)), 6, steps=6)
    assert cluster.sigma == pytest.approx(0.1, rel=1e-12)
    assert curvature.spectral_density(diagnostics.matrix_hvp(np.zeros((6, 6))), 6).sigma == 0.01


def integral(grid, values):
    grid, values = np.asarray(grid), np.asarray(values)
    return float(np.sum((values[1:] + values[:-1]) * np.diff(grid)) / 2)


@cpu_only
def test_the_density_integrates_to_one_with_the_quadratures_moments():
    hessian = spectrum_matrix(np.concatenate([np.linspace(-1, 1, 30), [5.0, 8.0]]), seed=6)
    density = curvature.spectral_density(diagnostics.matrix_hvp(hessian), 32, probes=6, steps=12)
    grid, values = np.asarray(density.grid), np.asarray(density.density)
    assert integral(grid, values) == pytest.approx(1.0, abs=1e-6)
    assert integral(grid, grid * values) == pytest.approx(density.moment(1).value, abs=1e-6)
    assert integral(grid, grid**2 * values) == pytest.approx(density.moment(2).value + density.sigma**2, rel=1e-6)
    for nodes, weights in zip(density.nodes, density.weights):
        assert len(nodes) == 12 and sum(weights) == pytest.approx(1.0, abs=1e-12)
    # E[vᵀHᵏv]/n = tr(Hᵏ)/n: within three standard errors over the probes
    for order in (1, 2, 3, 4):
        moment = density.moment(order)
        exact = np.trace(np.linalg.matrix_power(hessian, order)) / 32
        assert abs(moment.value - exact) <= 3 * moment.standard_error + 1e-12


@cpu_only
@settings(max_examples=40, deadline=None)
@given(
    eigenvalues=spectra(10),
    steps=st.integers(1, 12),
    probes=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_density_and_trace_on_any_spectrum(eigenvalues, steps, probes, seed):
    """Zero, repeated, tiny and negative eigenvalues: the nodes lie within the spectrum (Ritz
    values interlace), each probe's weights sum to 1, the density integrates to 1, a diagonal
    H's trace is exact from any ±1 probe, and Hutch++ with a full sketch is exact."""
    values = np.asarray(eigenvalues)
    dim, scale = len(values), max(1.0, float(np.abs(values).max()))
    hessian = spectrum_matrix(values, seed)
    density = curvature.spectral_density(
        diagnostics.matrix_hvp(hessian), dim, probes=probes, steps=steps, points=4000, seed=seed
    )
    for nodes, weights in zip(density.nodes, density.weights):
        assert len(nodes) <= min(steps, dim)
        assert values.min() - 1e-9 * scale <= min(nodes) and max(nodes) <= values.max() + 1e-9 * scale
        assert sum(weights) == pytest.approx(1.0, abs=1e-9) and min(weights) >= 0.0
    assert integral(density.grid, density.density) == pytest.approx(1.0, abs=1e-4)
    diagonal = curvature.hessian_trace(diagnostics.matrix_hvp(np.diag(values)), dim, seed=seed)
    assert diagonal.trace.value == pytest.approx(values.sum(), abs=1e-9 * scale * dim)
    assert diagonal.converged and diagonal.probes == 16
    full = curvature.hessian_trace(diagnostics.matrix_hvp(hessian), dim, method="hutch++", sketch=dim, seed=seed)
    assert full.trace.value == pytest.approx(values.sum(), abs=1e-9 * scale * dim)


@cpu_only
def test_the_quadrature_is_exact_for_polynomials_below_twice_the_steps():
    """For a diagonal H, vᵀHᵏv/n = tr(Hᵏ)/n for every ±1 vector v: each probe's Gauss quadrature
    must give it exactly while k < 2·steps (here 2·5), and not beyond."""
    values = np.linspace(-2.0, 3.0, 20) ** 3
    hvp = diagnostics.matrix_hvp(np.diag(values))
    density = curvature.spectral_density(hvp, 20, probes=3, steps=5)
    for order in range(10):
        moment = density.moment(order)
        assert moment.value == pytest.approx(np.mean(values**order), rel=1e-9)
        assert moment.standard_error < 1e-9 * max(1.0, abs(moment.value))
    assert density.moment(12).value != pytest.approx(np.mean(values**12), rel=1e-3)
    closed = curvature.spectral_density(diagnostics.matrix_hvp(np.diag([2.0, 2.0, -1.0, -1.0])), 4, steps=4)
    assert all(len(nodes) == 2 for nodes in closed.nodes)  # two distinct eigenvalues: closed after 2 steps
    assert closed.products == 2 * 8


@cpu_only
def test_the_density_of_a_torch_model_puts_its_top_node_at_the_top_eigenvalue():
    _, _, source, dense = torch_problem()
    density = curvature.spectral_density(source, source.dim, probes=4, steps=source.dim)
    exact = np.linalg.eigvalsh(dense)
    for nodes in density.nodes:  # a full Krylov space: the nodes are H's eigenvalues
        assert np.abs(np.asarray(nodes)[:, None] - exact[None, :]).min(axis=1).max() < 1e-10 * exact.max()
    assert max(density.grid) == pytest.approx(exact.max() + 5 * density.sigma, rel=1e-9)
    payload = json.loads(density.to_json())
    assert len(payload["grid"]) == len(payload["density"]) == 1000


# -- the torch H·v source --------------------------------------------------------------------------


@cpu_only
def test_module_hessian_products_gradient_and_loss_equal_torchs_dense_ones():
    torch = pytest.importorskip("torch")
    from steadystep.torch.curvature import ModuleHessian

    model, batches, source, dense = torch_problem()
    vectors = np.random.default_rng(0).normal(size=(5, source.dim))
    np.testing.assert_allclose(source(vectors), vectors @ dense, rtol=1e-12, atol=1e-14)
    looped = ModuleHessian(model, torch.nn.CrossEntropyLoss(), batches, dtype=torch.float64, vectorize=False)
    np.testing.assert_allclose(looped(vectors), source(vectors), rtol=1e-13, atol=1e-15)
    chunked = ModuleHessian(model, torch.nn.CrossEntropyLoss(), batches, dtype=torch.float64, chunk=2)
    np.testing.assert_allclose(chunked(vectors), source(vectors), rtol=1e-13, atol=1e-15)
    inputs, targets = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    gradients = torch.autograd.grad(loss, list(model.parameters()))
    np.testing.assert_allclose(source.gradient(), torch.cat([g.reshape(-1) for g in gradients]), rtol=1e-12)
    assert source.loss() == pytest.approx(loss.item(), rel=1e-12) and source.targets == 23
    rows = source.batch_gradients()
    for row, (x, y) in zip(rows, batches):
        own = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), list(model.parameters()))
        np.testing.assert_allclose(row, torch.cat([g.reshape(-1) for g in own]), rtol=1e-12, atol=1e-15)


@cpu_only
def test_a_float32_module_in_float64_and_in_its_own_dtype():
    torch = pytest.importorskip("torch")
    from steadystep.torch.curvature import ModuleHessian

    model, batches, _, dense = torch_problem("float32")
    vectors = np.random.default_rng(1).normal(size=(3, dense.shape[0]))
    double = ModuleHessian(model, torch.nn.CrossEntropyLoss(), batches, dtype=torch.float64)
    single = ModuleHessian(model, torch.nn.CrossEntropyLoss(), batches)
    assert single.dtype == torch.float32 and next(model.parameters()).dtype == torch.float32  # left as it was
    np.testing.assert_allclose(double(vectors), vectors @ dense, rtol=1e-12, atol=1e-14)
    scale = np.abs(vectors @ dense).max()
    np.testing.assert_allclose(single(vectors), vectors @ dense, atol=1e-5 * scale)
    assert np.abs(single(vectors) - vectors @ dense).max() > 1e-12 * scale  # really float32


class TinyLanguageModel:
    """Tokens -> embedding -> tanh -> vocabulary logits, [B, T] tokens with ignored targets."""

    @staticmethod
    def build(torch):
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Embedding(9, 4), torch.nn.Tanh(), torch.nn.Linear(4, 9)).double()

    @staticmethod
    def criterion(torch):
        return lambda logits, targets: torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @staticmethod
    def batch(torch, generator, rows):
        tokens = torch.randint(0, 9, (rows, 6), generator=generator)
        targets = torch.randint(0, 9, (rows, 6), generator=generator)
        targets[torch.rand(rows, 6, generator=generator) < 0.3] = -100  # padding, masked prompts
        return tokens, targets


@cpu_only
def test_full_epoch_streaming_equals_one_batch_of_the_concatenated_data():
    """Token-mean weighting: batches of 1, 4 and 2 sequences with different counts of valid
    targets give the loss, ḡ and H·v of their concatenation as one batch."""
    torch = pytest.importorskip("torch")
    from steadystep.torch.curvature import ModuleHessian

    model, criterion = TinyLanguageModel.build(torch), TinyLanguageModel.criterion(torch)
    generator = torch.Generator().manual_seed(2)
    batches = [TinyLanguageModel.batch(torch, generator, rows) for rows in (1, 4, 2)]
    whole = [(torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches]))]
    streamed, single = ModuleHessian(model, criterion, batches), ModuleHessian(model, criterion, whole)
    vectors = np.random.default_rng(3).normal(size=(4, streamed.dim))
    np.testing.assert_allclose(streamed(vectors), single(vectors), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(streamed.gradient(), single.gradient(), rtol=1e-12, atol=1e-15)
    assert streamed.loss() == pytest.approx(single.loss(), rel=1e-13)
    assert streamed.targets == single.targets == int((whole[0][1] != -100).sum())
    # an unweighted mean of the batch means is not the token mean: the weights matter
    means = np.mean([ModuleHessian(model, criterion, [b]).loss() for b in batches])
    assert abs(means - single.loss()) > 1e-6
    # a batch whose targets are all ignored adds nothing (its own mean would be NaN)
    empty = (batches[0][0], torch.full_like(batches[0][1], -100))
    with_empty = ModuleHessian(model, criterion, [*batches, empty])
    np.testing.assert_allclose(with_empty(vectors), single(vectors), rtol=1e-12, atol=1e-15)
    custom = ModuleHessian(model, criterion, batches, weight=lambda batch: 1.0)  # the plain mean of batch means
    assert custom.loss() == pytest.approx(means, rel=1e-12)


@cpu_only
def test_the_alignment_estimators_take_the_torch_source():
    _, batches, source, dense = torch_problem()
    gradients = source.batch_gradients()
    got = diagnostics.noise_alignment(source, source.gradient(), gradients)
    expected = diagnostics.noise_alignment(diagnostics.matrix_hvp(dense), source.gradient(), gradients)
    assert got.a_norm.value == pytest.approx(expected.a_norm.value, rel=1e-12)
    reference = diagnostics.isotropic_reference(source, source.dim, vectors=8)
    assert reference.value == pytest.approx(
        diagnostics.isotropic_reference(diagnostics.matrix_hvp(dense), source.dim, vectors=8).value, rel=1e-12
    )


@cpu_only
def test_the_module_is_evaluated_without_dropout_and_left_as_it_was():
    torch = pytest.importorskip("torch")
    from steadystep.torch.curvature import ModuleHessian

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Dropout(0.5), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    model[3].weight.requires_grad_(False)  # frozen: not a coordinate
    before = [p.detach().clone() for p in model.parameters()]
    batches = [(torch.randn(10, 3), torch.randint(0, 2, (10,)))]
    source = ModuleHessian(model, torch.nn.CrossEntropyLoss(), batches, dtype=torch.float64)
    assert source.dim == 3 * 6 + 6 + 2
    vectors = np.eye(source.dim)[:3]
    np.testing.assert_array_equal(source(vectors), source(vectors))  # deterministic: dropout off
    assert model.training and model[1].training  # its mode back
    for old, new in zip(before, model.parameters()):
        assert torch.equal(old, new)
    point = source.point.numpy() + 0.1
    moved = ModuleHessian(model, torch.nn.CrossEntropyLoss(), batches, dtype=torch.float64, point=point)
    assert not np.allclose(moved(vectors), source(vectors))


@cpu_only
def test_pyhessian_agrees_on_the_top_eigenvalue_and_the_trace():
    """PyHessian (a dev extra) on the same float32 model and data: its power iteration stops at
    a relative change of 1e-3 and computes in float32, so the top eigenvalue agrees to 1e-2;
    the traces agree within three combined standard errors."""
    torch = pytest.importorskip("torch")
    pyhessian = pytest.importorskip("pyhessian")
    from steadystep.torch.curvature import ModuleHessian

    model, batches, _, dense = torch_problem("float32")
    inputs, targets = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    theirs = pyhessian.hessian(model, torch.nn.CrossEntropyLoss(), data=(inputs, targets), cuda=False)
    torch.manual_seed(0)
    (their_top,), _ = theirs.eigenvalues(maxIter=200, tol=1e-6)
    their_samples = theirs.trace(maxIter=400, tol=0.0)
    ours = ModuleHessian(model, torch.nn.CrossEntropyLoss(), [(inputs, targets)], dtype=torch.float64)
    top = curvature.top_eigenpairs(ours, ours.dim, k=1, which="magnitude")
    assert top.values[0] == pytest.approx(their_top, rel=1e-2)
    assert abs(top.values[0] - np.linalg.eigvalsh(dense)[-1]) <= top.residual_norms[0]
    trace = curvature.hessian_trace(ours, ours.dim, tolerance=0.01)
    their_error = np.std(their_samples, ddof=1) / math.sqrt(len(their_samples))
    combined = math.hypot(trace.trace.standard_error, their_error)
    assert abs(trace.trace.value - np.mean(their_samples)) <= 3 * combined


# -- the package's own models, on every target ----------------------------------------------------


def test_every_estimate_from_a_models_hvp_on_the_target(target):
    """steadystep's MLP H·v (R-operator) where its arrays live, against the dense Hessian formed
    from the host run's products."""
    model = models.mlp(features=3, hidden=3, classes=2, activation="tanh")
    rng = np.random.default_rng(0)
    point = model.init(1, seed=0)[0].astype(np.float64) + rng.normal(0, 0.3, model.dim) * model.decay_mask(np.float64)
    features, labels = rng.normal(size=(6, 3)), rng.integers(0, 2, 6)
    support = model.parameter_indices
    with use_target("cpu"):
        host = diagnostics.model_hvp(model, point, features, labels)
        dense = host(np.eye(model.dim)[support])[:, support]
    dense = (dense + dense.T) / 2
    arrays = (point, features, labels) if target == "cpu" else tuple(to_device(a) for a in (point, features, labels))
    with use_target(target):
        hvp = diagnostics.model_hvp(model, *arrays)
        pairs = curvature.top_eigenpairs(hvp, model.dim, k=2, support=support)
        trace = curvature.hessian_trace(hvp, model.dim, support=support, method="hutch++", sketch=len(support))
        density = curvature.spectral_density(hvp, model.dim, support=support, probes=2, steps=4)
    restricted = pairs.vectors[:, support]
    np.testing.assert_allclose(pairs.values, np.linalg.eigvalsh(dense)[::-1][:2], rtol=1e-8)
    assert np.all(
        np.linalg.norm(restricted @ dense - restricted * np.asarray(pairs.values)[:, None], axis=1)
        <= np.asarray(pairs.residual_norms) * (1 + 1e-9) + 1e-13
    )
    assert trace.trace.value == pytest.approx(np.trace(dense), rel=1e-9, abs=1e-12)
    assert density.moment(1).value == pytest.approx(
        np.trace(dense) / len(support), abs=3 * density.moment(1).standard_error + 1e-12
    )


# -- bad input -------------------------------------------------------------------------------------------


def _matrix(dim=4):
    return diagnostics.matrix_hvp(spectrum_matrix(np.arange(1.0, dim + 1)))


@cpu_only
@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: curvature.top_eigenpairs(_matrix(), 4, k=5), ValueError, "k must be a whole number ≤ 4"),
        (lambda: curvature.top_eigenpairs(_matrix(), 4, k=0), ValueError, "k must be a whole number ≥ 1"),
        (lambda: curvature.top_eigenpairs(_matrix(), 4, method="arnoldi"), ValueError, "method must be one of"),
        (lambda: curvature.top_eigenpairs(_matrix(), 4, which="top"), ValueError, "which must be one of"),
        (
            lambda: curvature.top_eigenpairs(_matrix(), 4, method="power", which="largest"),
            ValueError,
            "which='magnitude'",
        ),
        (lambda: curvature.top_eigenpairs(_matrix(), 4, tolerance=-1.0), ValueError, "tolerance must be"),
        (lambda: curvature.top_eigenpairs(_matrix(), 4, tolerance=float("nan")), ValueError, "tolerance must be"),
        (lambda: curvature.top_eigenpairs(_matrix(), 4, block=0), ValueError, "block must be"),
        (lambda: curvature.top_eigenpairs(_matrix(), 4, max_steps=0), ValueError, "max_steps must be"),
        (lambda: curvature.top_eigenpairs("hvp", 4), TypeError, "hvp must be a function"),
        (lambda: curvature.top_eigenpairs(_matrix(), 0), ValueError, "dim must be a whole number ≥ 1"),
        (lambda: curvature.top_eigenpairs(_matrix(), 4, support=[0, 0]), ValueError, "support must list distinct"),
        (lambda: curvature.top_eigenpairs(_matrix(), 5), ValueError, "vectors of length 5 for a 4×4 Hessian"),
        (lambda: curvature.hessian_trace(_matrix(), 4, method="hutch"), ValueError, "method must be one of"),
        (lambda: curvature.hessian_trace(_matrix(), 4, sketch=2), ValueError, "sketch is Hutch\\+\\+'s"),
        (lambda: curvature.hessian_trace(_matrix(), 4, method="hutch++", sketch=5), ValueError, "sketch must be"),
        (lambda: curvature.hessian_trace(_matrix(), 4, min_probes=1), ValueError, "min_probes must be"),
        (lambda: curvature.hessian_trace(_matrix(), 4, max_probes=8), ValueError, "max_probes must be"),
        (lambda: curvature.hessian_trace(_matrix(), 4, batch=0), ValueError, "batch must be"),
        (lambda: curvature.spectral_density(_matrix(), 4, probes=0), ValueError, "probes must be"),
        (lambda: curvature.spectral_density(_matrix(), 4, steps=0), ValueError, "steps must be"),
        (lambda: curvature.spectral_density(_matrix(), 4, sigma=0.0), ValueError, "sigma must be"),
        (lambda: curvature.spectral_density(_matrix(), 4, points=1), ValueError, "points must be"),
        (lambda: curvature.spectral_density(_matrix(), 4).moment(-1), ValueError, "order must be"),
    ],
)
def test_bad_arguments_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


@cpu_only
@pytest.mark.parametrize("function", ["top_eigenpairs", "hessian_trace", "spectral_density"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_products_raise_floating_point_error(function, bad):
    hessian = spectrum_matrix([3.0, 2.0, 1.0, 0.5])

    def hvp(vectors):
        products = vectors @ hessian
        products[-1, 2] = bad
        return products

    with pytest.raises(FloatingPointError, match="the Hessian-vector product's result holds non-finite values"):
        getattr(curvature, function)(hvp, 4)


@cpu_only
def test_module_hessian_names_bad_input_and_non_finite_values():
    torch = pytest.importorskip("torch")
    from steadystep.torch.curvature import ModuleHessian

    model, batches, source, _ = torch_problem()
    criterion = torch.nn.CrossEntropyLoss()
    cases = [
        (lambda: ModuleHessian("model", criterion, batches), TypeError, "module must be a torch.nn.Module"),
        (lambda: ModuleHessian(model, None, batches), TypeError, "criterion must be a loss function"),
        (
            lambda: ModuleHessian(model, torch.nn.CrossEntropyLoss(reduction="sum"), batches),
            ValueError,
            "reduction='mean'",
        ),
        (lambda: ModuleHessian(model, criterion, iter(batches)), TypeError, "batches is an iterator"),
        (lambda: ModuleHessian(model, criterion, 3), TypeError, "batches must be an iterable"),
        (lambda: ModuleHessian(model, criterion, batches, dtype=torch.int32), TypeError, "dtype must be a floating"),
        (lambda: ModuleHessian(model, criterion, batches, point=np.zeros(3)), ValueError, "point must have shape"),
        (
            lambda: ModuleHessian(model, criterion, batches, vectorize="yes"),
            TypeError,
            "vectorize must be True or False",
        ),
        (lambda: ModuleHessian(model, criterion, []).loss(), ValueError, "batches hold no valid targets"),
        (lambda: ModuleHessian(model, criterion, batches, chunk=0), ValueError, "chunk must be a whole number"),
        (lambda: ModuleHessian(model, criterion, [torch.ones(3)]).loss(), TypeError, "batch 0 must be a pair"),
        (lambda: source(np.ones((2, 3))), ValueError, f"vectors must be a \\[K, {source.dim}\\] array"),
        (lambda: source(np.full((1, source.dim), np.nan)), FloatingPointError, "vectors holds non-finite"),
        (
            lambda: ModuleHessian(model, criterion, batches, weight=lambda batch: -1.0).loss(),
            ValueError,
            "the weight of batch 0 must be a finite count",
        ),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        ModuleHessian(frozen, criterion, batches)
    broken = [batches[0], (batches[1][0].clone(), batches[1][1])]
    broken[1][0][0, 0] = float("nan")
    bad = ModuleHessian(model, criterion, broken)
    with pytest.raises(FloatingPointError, match="the loss of batch 1 holds non-finite"):
        bad.loss()
    with pytest.raises(FloatingPointError, match="the gradient of batch 1 holds non-finite"):
        bad.gradient()
    with pytest.raises(FloatingPointError, match="the Hessian-vector product of batch 1 holds non-finite"):
        bad(np.ones((1, bad.dim)))
