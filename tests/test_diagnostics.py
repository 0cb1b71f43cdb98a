"""Curvature/noise diagnostics against exact oracles (quadratics with known spectra)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from steadystep import diagnostics
from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="host-side NumPy estimators")


def indefinite(dim: int = 6, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    return basis @ np.diag(np.linspace(-2.0, 3.0, dim)) @ basis.T


def quadratic_gradient(hessian, center):
    return lambda x: hessian @ (x - center)


def test_every_hvp_source_equals_h_times_v():
    hessian = indefinite()
    vectors = np.random.default_rng(1).normal(size=(4, 6))
    expected = vectors @ hessian.T
    point = np.random.default_rng(2).normal(size=6)
    sources = {
        "matrix": diagnostics.matrix_hvp(hessian),
        "callable": diagnostics.callable_hvp(lambda v: hessian @ v),
        "batched": diagnostics.callable_hvp(lambda vs: vs @ hessian.T, batched=True),
    }
    torch = pytest.importorskip("torch")
    # torch results as double backward leaves them: tensors that require grad, which NumPy refuses
    tracked = torch.tensor(hessian, requires_grad=True)
    sources["torch, batched"] = diagnostics.callable_hvp(lambda vs: torch.as_tensor(vs) @ tracked.T, batched=True)
    sources["torch, per vector"] = diagnostics.callable_hvp(lambda v: tracked @ torch.as_tensor(v))
    sources["list"] = diagnostics.callable_hvp(lambda v: (hessian @ v).tolist())
    for name, hvp in sources.items():
        np.testing.assert_allclose(hvp(vectors), expected, rtol=1e-14, atol=1e-14, err_msg=name)
    plain = diagnostics.noise_alignment(sources["matrix"], np.zeros(6), vectors)
    direct = diagnostics.noise_alignment(lambda vs: torch.as_tensor(vs) @ tracked.T, np.zeros(6), vectors)  # no wrapper
    assert direct.a_norm.value == pytest.approx(plain.a_norm.value, rel=1e-14)
    # gradients as a training loop holds them: torch tensors that require grad
    held = diagnostics.noise_alignment(
        sources["matrix"], torch.zeros(6, requires_grad=True), torch.tensor(vectors, requires_grad=True)
    )
    assert held.a_norm.samples == plain.a_norm.samples
    # Central differences of a quadratic have no truncation error, only rounding: of x ± h·v
    # (relative ulp(x)/h) and of the gradients (ε·‖∇f‖/h), with h ≈ ε^(1/3)·max(1, ‖x‖)/‖v‖.
    # At x = 0 both vanish and the product is exact to ~1e-12; elsewhere expect ~1e-10.
    origin = np.zeros(6)
    at_origin = diagnostics.finite_difference_hvp(quadratic_gradient(hessian, origin), origin)
    np.testing.assert_allclose(at_origin(vectors), expected, rtol=1e-12, atol=1e-13)
    elsewhere = diagnostics.finite_difference_hvp(quadratic_gradient(hessian, np.ones(6)), point)
    np.testing.assert_allclose(elsewhere(vectors), expected, rtol=1e-9, atol=1e-10)
    of_torch = diagnostics.finite_difference_hvp(lambda x: tracked @ torch.as_tensor(x - np.ones(6)), point)
    np.testing.assert_allclose(of_torch(vectors), expected, rtol=1e-9, atol=1e-10)


def test_finite_differences_call_the_gradient_in_the_points_dtype():
    """A float32 model's gradient function got float64 points (x ± h·v promoted by the
    float64 vectors), which a torch float32 model refuses; its H·v is still float32-accurate."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    matrix = rng.normal(size=(5, 5))
    hessian = torch.tensor(matrix + matrix.T, dtype=torch.float32)
    point = rng.normal(size=5).astype(np.float32)
    vectors = rng.normal(size=(3, 5))
    hvp = diagnostics.finite_difference_hvp(lambda x: hessian @ torch.from_numpy(x), point)
    expected = vectors @ hessian.double().numpy().T
    np.testing.assert_allclose(hvp(vectors), expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_finite_differences_follow_curvature_of_a_non_quadratic():
    gradient = lambda x: np.array([np.exp(x[0]) + x[1], x[0] + 3 * x[1] ** 2])  # noqa: E731
    point = np.array([0.3, -0.2])
    exact = np.array([[np.exp(0.3), 1.0], [1.0, 6 * -0.2]])
    hvp = diagnostics.finite_difference_hvp(gradient, point)
    np.testing.assert_allclose(hvp(np.eye(2)), exact, rtol=1e-9)


@pytest.mark.parametrize("index", [0, 5])  # the most negative and the most positive eigenvalue
def test_noise_along_an_eigenvector_gives_its_eigenvalue(index):
    hessian = indefinite()
    values, vectors = np.linalg.eigh(hessian)
    mean = np.random.default_rng(3).normal(size=6)
    scales = np.array([0.5, -1.0, 2.0, 3.0])
    gradients = mean + scales[:, None] * vectors[:, index]
    result = diagnostics.noise_alignment(diagnostics.matrix_hvp(hessian), mean, gradients)
    assert result.a_norm.value == pytest.approx(values[index], rel=1e-12)
    assert result.a.value == pytest.approx(values[index] * np.mean(scales**2), rel=1e-12)


def test_scaling_the_noise_scales_a_but_not_a_norm():
    hessian = indefinite()
    rng = np.random.default_rng(4)
    mean, noise = rng.normal(size=6), rng.normal(size=(16, 6))
    hvp = diagnostics.matrix_hvp(hessian)
    base = diagnostics.noise_alignment(hvp, mean, mean + noise)
    scaled = diagnostics.noise_alignment(hvp, mean, mean + 3.0 * noise)
    assert scaled.a_norm.value == pytest.approx(base.a_norm.value, rel=1e-12)
    assert scaled.a.value == pytest.approx(9.0 * base.a.value, rel=1e-12)
    assert scaled.a_norm.value == pytest.approx(
        np.sum(np.einsum("kd,de,ke->k", noise, hessian, noise)) / np.sum(noise**2)
    )


def test_zero_noise_leaves_a_norm_undefined_and_serializes_as_null():
    result = diagnostics.noise_alignment(diagnostics.matrix_hvp(np.eye(3)), np.ones(3), np.ones((4, 3)))
    assert result.a_norm.value is None and result.a.value == 0.0
    payload = json.loads(result.to_json())
    assert payload["a_norm"]["value"] is None
    assert "undefined" in repr(result) and "<table>" in result._repr_html_()


def test_reports_are_strict_json_with_null_for_undefined_or_non_finite_numbers():
    # One noise vector is zero (its own ratio is undefined); an H·v that overflows gives inf
    # and NaN. JSON has neither, and strict parsers (browsers, jq) refuse the NaN json writes.
    hvp = diagnostics.matrix_hvp(np.diag([2.0, -1.0]))
    result = diagnostics.noise_alignment(hvp, np.zeros(2), np.array([[1.0, 0.0], [0.0, 0.0], [-1.0, 0.0]]))
    assert result.a_norm.samples == [2.0, None, 2.0]
    strict = lambda text: json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))  # noqa: E731
    assert strict(result.to_json())["a_norm"]["samples"] == [2.0, None, 2.0]
    # finite products whose quadratic forms overflow: inf, which JSON cannot hold either
    with np.errstate(invalid="ignore", over="ignore"):  # inf − inf in the spread: NumPy's warning, expected here
        diverged = diagnostics.noise_alignment(
            diagnostics.matrix_hvp(np.diag([1e300, 1.0])), np.zeros(2), np.array([[1e5, 1.0], [-1e5, 0.5]])
        )
    payload = strict(diverged.to_json())
    assert payload["a"]["value"] is None and payload["a_norm"]["samples"] == [None, None]
    assert np.isinf(diverged.a.value)  # the result itself keeps the number


@pytest.mark.parametrize(
    "call, what",
    [
        # NoiseAlignment(a=nan ± nan, ...) before, null in JSON: indistinguishable from the undefined case
        (lambda hvp, g: diagnostics.noise_alignment(hvp, np.zeros(3), g), "gradients holds non-finite values .*row 1"),
        (
            lambda hvp, g: diagnostics.noise_alignment(hvp, np.array([0.0, np.inf, 0.0]), np.ones((2, 3))),
            "mean_gradient",
        ),
        (
            lambda hvp, g: diagnostics.noise_alignment(lambda v: hvp(v) * np.nan, np.zeros(3), np.ones((2, 3))),
            "the Hessian-vector product's result holds non-finite",
        ),
        (
            lambda hvp, g: diagnostics.isotropic_reference(lambda v: hvp(v) / 0.0, 3),
            "the Hessian-vector product's result",
        ),
        (lambda hvp, g: diagnostics.consensus_alignment(hvp, g), "params holds non-finite"),
        (
            lambda hvp, g: diagnostics.consensus_alignment(lambda v: hvp(v) + np.inf, np.eye(3)),
            "Hessian-vector product's",
        ),
    ],
)
def test_non_finite_input_or_products_raise_floating_point_error_naming_them(call, what):
    gradients = np.ones((3, 3))
    gradients[1, 2] = np.nan
    with np.errstate(all="ignore"), pytest.raises(FloatingPointError, match=what):
        call(diagnostics.matrix_hvp(np.eye(3)), gradients)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda hvp: diagnostics.noise_alignment(hvp, np.zeros(3), np.ones((0, 3))), "gradients must be a non-empty"),
        (
            lambda hvp: diagnostics.noise_alignment(hvp, np.zeros(4), np.ones((2, 3))),
            "mean_gradient has shape \\(4,\\)",
        ),
        (lambda hvp: diagnostics.isotropic_reference(hvp, 3, vectors=0), "vectors must be a whole number ≥ 1, got 0"),
        (lambda hvp: diagnostics.isotropic_reference(hvp, 3, batch=0), "batch must be a whole number ≥ 1, got 0"),
        # counts that are not whole numbers (NumPy's 'float object cannot be interpreted as an integer' before)
        (lambda hvp: diagnostics.isotropic_reference(hvp, 3.0), "dim must be a whole number ≥ 1, got 3.0"),
        (
            lambda hvp: diagnostics.isotropic_reference(hvp, 3, vectors=True),
            "vectors must be a whole number ≥ 1, got True",
        ),
        (lambda hvp: diagnostics.isotropic_reference(hvp, 3, support=[0, 1.5]), "support must list distinct positions"),
        (lambda hvp: diagnostics.isotropic_reference(hvp, 3, support=np.array([0, 5])), "support must list distinct"),
        (lambda hvp: diagnostics.isotropic_reference(hvp, 3, support=np.array([1, 1])), "support must list distinct"),
        (
            lambda hvp: diagnostics.consensus_alignment(hvp, np.ones(3)),
            "params must be an \\[N, D\\] array of N ≥ 1 workers' rows",
        ),
        (lambda hvp: diagnostics.consensus_alignment(hvp, np.ones((0, 3))), "got shape \\(0, 3\\)"),
        # NumPy's matmul error from inside the product, before
        (
            lambda hvp: diagnostics.isotropic_reference(hvp, 4),
            "vectors of length 4 for a 3×3 Hessian; they must have length 3",
        ),
        (
            lambda hvp: diagnostics.noise_alignment(lambda vs: hvp(vs)[:, :2], np.zeros(3), np.ones((2, 3))),
            "returned shape \\(2, 2\\) for 2 vectors of length 3; "
            "it must return one product per vector, shape \\(2, 3\\)",
        ),
        # H·Vᵀ instead of V·H: the right number of values, each in the wrong place (taken before)
        (
            lambda hvp: diagnostics.noise_alignment(lambda vs: hvp(vs).T, np.zeros(3), np.ones((2, 3))),
            "returned shape \\(3, 2\\) for 2 vectors of length 3",
        ),
        # a gradient of the wrong shape made an H·v of the wrong shape (returned, before)
        (
            lambda hvp: diagnostics.finite_difference_hvp(lambda x: x[:2], np.zeros(3))(np.eye(3)),
            "the gradient function returned shape \\(2,\\) at a point of shape \\(3,\\)",
        ),
        # complex values lost their imaginary parts with NumPy's warning (before)
        (
            lambda hvp: diagnostics.noise_alignment(lambda vs: hvp(vs) + 0j, np.zeros(3), np.ones((2, 3))),
            "the Hessian-vector product is complex \\(complex128\\); the diagnostics take real values",
        ),
        (lambda hvp: diagnostics.noise_alignment(hvp, np.zeros(3), np.ones((2, 3)) * 1j), "gradients is complex"),
        (
            lambda hvp: diagnostics.finite_difference_hvp(lambda x: x * 1j, np.zeros(3))(np.eye(3)),
            "the gradient function is complex",
        ),
        (lambda hvp: diagnostics.matrix_hvp(np.eye(3) * (1 + 1j)), "hessian is complex"),  # dropped, before
        (lambda hvp: diagnostics.matrix_hvp(np.array([["1", "0"], ["0", "1"]])), "hessian has dtype <U1"),
        (lambda hvp: diagnostics.noise_alignment(hvp, "abc", np.ones((2, 3))), "mean_gradient has dtype <U3"),
        (lambda hvp: diagnostics.noise_alignment(hvp, np.zeros(3), [[1, None, 2]]), "gradients has dtype object"),
        (lambda hvp: diagnostics.noise_alignment(None, np.zeros(3), np.ones((2, 3))), "hvp must be a function"),
        (lambda hvp: diagnostics.isotropic_reference("matrix", 3), "hvp must be a function"),
        (lambda hvp: diagnostics.consensus_alignment(None, np.ones((2, 3))), "hvp_at_mean must be a function"),
        (lambda hvp: diagnostics.anisotropy(None, None), "alignment must be an Estimate"),
        (lambda hvp: diagnostics.anisotropy(diagnostics.Estimate(1.0, 0.1), 0.5), "reference must be an Estimate"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(diagnostics.matrix_hvp(np.eye(3)))


def test_a_single_vectors_product_may_come_back_as_one_row():
    hvp = diagnostics.matrix_hvp(np.diag([2.0, -1.0, 0.5]))
    flat = diagnostics.noise_alignment(lambda vs: hvp(vs)[0], np.zeros(3), np.array([[1.0, 1.0, 0.0]]))
    assert flat.a.value == 1.0 and flat.a_norm.value == 0.5


def test_hutchinson_is_exact_for_a_diagonal_hessian():
    diagonal = np.array([1.0, -2.0, 5.0, 0.5])
    estimate = diagnostics.isotropic_reference(diagnostics.matrix_hvp(np.diag(diagonal)), 4, vectors=32, seed=1)
    assert estimate.value == pytest.approx(diagonal.mean(), rel=1e-15)
    assert estimate.standard_error == 0.0


def test_hutchinson_over_a_support_ignores_padding():
    """Probes only on the D unique parameters of a padded row: exact trace/D for a diagonal H."""
    diagonal = np.array([2.0, -1.0, 0.0, 5.0, 0.0, 0.0])  # entries 2, 4, 5 are padding
    support = np.array([0, 1, 3])
    hvp = diagnostics.matrix_hvp(np.diag(diagonal))
    probes = []
    estimate = diagnostics.isotropic_reference(
        lambda v: probes.append(v.copy()) or hvp(v), dim=6, vectors=16, support=support
    )
    assert estimate.value == 2.0 and estimate.standard_error == 0.0  # (2 − 1 + 5) / 3
    probes = np.concatenate(probes)
    np.testing.assert_array_equal(np.abs(probes[:, support]), 1.0)
    np.testing.assert_array_equal(probes[:, [2, 4, 5]], 0.0)


def test_hutchinson_batches_its_probes_to_bound_their_memory(monkeypatch):
    """64 float64 probes of a 10M-parameter model are 5 GiB: by default hvp gets as many at a
    time as fit in PROBE_BYTES (here made small), and the probes are the same."""
    hessian = indefinite(dim=12, seed=5)
    whole = diagnostics.isotropic_reference(diagnostics.matrix_hvp(hessian), 12, vectors=20, seed=3, batch=64)
    monkeypatch.setattr(diagnostics, "PROBE_BYTES", 3 * 12 * 8)
    sizes = []
    batched = diagnostics.isotropic_reference(lambda v: sizes.append(len(v)) or v @ hessian.T, 12, vectors=20, seed=3)
    assert sizes == [3] * 6 + [2]
    np.testing.assert_allclose(batched.samples, whole.samples, rtol=1e-12)  # the same probes (BLAS rounds by batch)


def test_hutchinson_for_a_dense_hessian_matches_its_closed_form_error():
    hessian = indefinite(dim=12, seed=5)
    dim, count = 12, 512
    estimate = diagnostics.isotropic_reference(diagnostics.matrix_hvp(hessian), dim, vectors=count, seed=7)
    truth = np.trace(hessian) / dim
    closed_form = np.sqrt(2 * (np.sum(hessian**2) - np.sum(np.diag(hessian) ** 2)) / count) / dim
    assert abs(estimate.value - truth) <= 4 * estimate.standard_error
    assert estimate.standard_error == pytest.approx(closed_form, rel=0.2)
    again = diagnostics.isotropic_reference(diagnostics.matrix_hvp(hessian), dim, vectors=count, seed=7)
    assert again.samples == estimate.samples  # seeded


def test_the_standard_errors_are_their_analytic_values():
    """Vectors of equal norm n: A_norm = mean(q)/n exactly, and its delta-method error reduces to
    the sample standard deviation of q (ddof = 1) / (√S·n); A's is stdev(q)/√S. Computed here
    with the statistics module, term by term (ddof = 0 is 13% smaller at S = 4)."""
    import statistics

    rng = np.random.default_rng(4)
    hessian = indefinite(dim=5, seed=2)
    vectors = rng.choice([-1.0, 1.0], size=(4, 5)) * 0.5  # ‖v‖² = 1.25 for each
    forms = [float(v @ hessian @ v) for v in vectors]
    result = diagnostics.noise_alignment(diagnostics.matrix_hvp(hessian), np.zeros(5), vectors)
    count, norm = len(forms), 1.25
    assert result.a.standard_error == pytest.approx(statistics.stdev(forms) / count**0.5, rel=1e-12)
    assert result.a_norm.value == pytest.approx(statistics.fmean(forms) / norm, rel=1e-12)
    assert result.a_norm.standard_error == pytest.approx(statistics.stdev(forms) / (count**0.5 * norm), rel=1e-12)
    # unequal norms: Var(q − R·n) / (S·n̄²), the first-order error of a ratio of means
    vectors = vectors * np.array([[1.0], [2.0], [0.5], [3.0]])
    forms = [float(v @ hessian @ v) for v in vectors]
    norms = [float(v @ v) for v in vectors]
    ratio = sum(forms) / sum(norms)
    residuals = [q - ratio * n for q, n in zip(forms, norms)]
    expected = statistics.stdev(residuals) / (count**0.5 * statistics.fmean(norms))
    result = diagnostics.noise_alignment(diagnostics.matrix_hvp(hessian), np.zeros(5), vectors)
    assert result.a_norm.standard_error == pytest.approx(expected, rel=1e-12)
    reference = diagnostics.isotropic_reference(diagnostics.matrix_hvp(hessian), 5, vectors=6, seed=1)
    assert reference.standard_error == pytest.approx(statistics.stdev(reference.samples) / 6**0.5, rel=1e-12)


def test_anisotropy_ratio_and_error():
    kappa = diagnostics.anisotropy(diagnostics.Estimate(2.0, 0.2), diagnostics.Estimate(0.5, 0.05))
    assert kappa.value == 4.0
    assert kappa.standard_error == pytest.approx(4.0 * np.sqrt(0.01 + 0.01))
    assert diagnostics.anisotropy(diagnostics.Estimate(None, None), diagnostics.Estimate(1.0, 0.1)).value is None


def test_consensus_alignment():
    hessian = indefinite()
    params = np.random.default_rng(8).normal(size=(5, 6))
    result = diagnostics.consensus_alignment(diagnostics.matrix_hvp(hessian), params)
    errors = params - params.mean(axis=0)
    np.testing.assert_allclose(errors.sum(axis=0), 0.0, atol=1e-14)
    assert result.a_norm.value == pytest.approx(np.einsum("kd,de,ke->", errors, hessian, errors) / np.sum(errors**2))
    assert result.consensus_distance == pytest.approx(np.mean(np.sum(errors**2, axis=1)))
    norms = np.sqrt(np.sum(errors**2, axis=1))
    assert result.mean_error_norm == pytest.approx(np.mean(norms), rel=1e-12)
    assert abs(np.mean(norms) - np.sqrt(np.mean(norms**2))) > 1e-3  # their mean, which is not their RMS here
    identical = diagnostics.consensus_alignment(diagnostics.matrix_hvp(hessian), np.ones((4, 6)))
    assert identical.a_norm.value is None
