"""steadystep.models against a plain NumPy model, torch autograd and finite differences.

Oracles: a vectorised NumPy forward/backward written from the textbook formulas
(scipy's logsumexp), torch double-backward for H·v, and a dense Hessian assembled column by
column from central differences of the analytic gradient.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp, softmax

from steadystep import diagnostics, models, use_target
from tests.helpers import to_device, to_host

MODELS = {
    "softmax_regression": lambda: models.softmax_regression(features=5, classes=3),
    "mlp_tanh": lambda: models.mlp(features=5, hidden=4, classes=3, activation="tanh"),
    "mlp_relu": lambda: models.mlp(features=5, hidden=4, classes=3, activation="relu"),
}


def reference_loss_and_grad(model, row, features, labels):
    """Mean cross-entropy over valid labels and its gradient, in whole-array NumPy."""
    tensors = model.unpack(row)
    valid = labels >= 0
    x, y = features[valid], labels[valid]
    count = max(int(valid.sum()), 1)
    if model.hidden:
        pre = x @ tensors["W1"] + tensors["b1"]
        hidden = np.tanh(pre) if model.activation == "tanh" else np.maximum(pre, 0.0)
    else:
        hidden = x
    logits = hidden @ tensors["W2"] + tensors["b2"]
    loss = (logsumexp(logits, axis=1) - logits[np.arange(len(y)), y]).sum() / count
    delta = softmax(logits, axis=1)
    delta[np.arange(len(y)), y] -= 1.0
    delta /= count
    grad = np.zeros_like(row)
    parts = model.unpack(grad)
    parts["W2"][...] = hidden.T @ delta
    parts["b2"][...] = delta.sum(axis=0)
    if model.hidden:
        upstream = delta @ tensors["W2"].T
        local = 1.0 - hidden**2 if model.activation == "tanh" else (pre > 0).astype(row.dtype)
        parts["W1"][...] = x.T @ (upstream * local)
        parts["b1"][...] = (upstream * local).sum(axis=0)
    return loss, grad


def problem(model, workers=3, samples=7, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    params = np.stack(
        [
            model.init(seed=seed, dtype=dtype)[0]
            + rng.normal(0, 0.3, model.dim).astype(dtype) * model.decay_mask(dtype)
            for _ in range(workers)
        ]
    )
    params += rng.normal(0, 0.1, params.shape).astype(dtype) * (1 - model.decay_mask(dtype)) * _unpadded(model)
    features = rng.normal(size=(samples, model.features)).astype(dtype)
    labels = rng.integers(0, model.classes, samples)
    labels[1] = -1  # ignored
    batch = np.stack([rng.choice(samples, 5, replace=False) for _ in range(workers)])
    return params, features, labels, batch


def _unpadded(model):
    mask = np.zeros(model.dim)
    for start, shape in zip(model.layout.offsets, model.layout.shapes):
        mask[start : start + int(np.prod(shape))] = 1
    return mask


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_loss_gradient_and_accuracy_match_the_numpy_model(name, dtype, target):
    model = MODELS[name]()
    params, features, labels, batch = problem(model, dtype=dtype)
    with use_target(target):
        loss, grad = model.loss_and_grad(params, features, labels, batch)
        evaluation = model.evaluate(params, features, labels, batch)
    tolerance = 1e-12 if dtype == np.float64 else 2e-5
    for worker in range(len(params)):
        rows = batch[worker]
        expected_loss, expected_grad = reference_loss_and_grad(
            model, params[worker].astype(np.float64), features[rows].astype(np.float64), labels[rows]
        )
        np.testing.assert_allclose(loss[worker], expected_loss, rtol=tolerance)
        np.testing.assert_allclose(
            grad[worker], expected_grad, rtol=tolerance, atol=tolerance * np.abs(expected_grad).max()
        )
        assert grad.dtype == dtype
        logits_argmax = _reference_predictions(
            model, params[worker].astype(np.float64), features[rows].astype(np.float64)
        )
        valid = labels[rows] >= 0
        assert evaluation.accuracy[worker] == pytest.approx(np.mean(logits_argmax[valid] == labels[rows][valid]))
    np.testing.assert_array_equal(evaluation.loss, loss)


def _reference_predictions(model, row, features):
    tensors = model.unpack(row)
    hidden = features
    if model.hidden:
        pre = features @ tensors["W1"] + tensors["b1"]
        hidden = np.tanh(pre) if model.activation == "tanh" else np.maximum(pre, 0.0)
    return np.argmax(hidden @ tensors["W2"] + tensors["b2"], axis=1)


@pytest.mark.parametrize("name", MODELS)
def test_hessian_vector_product_matches_differences_of_the_reference_gradient(name, target):
    """H·v along several directions against central differences of the NumPy gradient."""
    model = MODELS[name]()
    params, features, labels, batch = problem(model, seed=1)
    tangent = np.random.default_rng(2).normal(size=params.shape) * _unpadded(model)
    with use_target(target):
        product = model.hvp(params, tangent, features, labels, batch)
    step = 1e-5
    for worker in range(len(params)):
        rows = batch[worker]
        plus = reference_loss_and_grad(model, params[worker] + step * tangent[worker], features[rows], labels[rows])[1]
        minus = reference_loss_and_grad(model, params[worker] - step * tangent[worker], features[rows], labels[rows])[1]
        expected = (plus - minus) / (2 * step)
        np.testing.assert_allclose(product[worker], expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())


@pytest.mark.parametrize("name", MODELS)
def test_one_point_many_directions(name, target):
    """params with one row and K tangent rows: H at that point times each direction, against
    central differences, and the same bits as the point repeated K times."""
    model = MODELS[name]()
    params, features, labels, batch = problem(model, workers=1, seed=3)
    directions = np.random.default_rng(4).normal(size=(6, model.dim)) * _unpadded(model)
    with use_target(target):
        product = model.hvp(params, directions, features, labels, batch)
        repeated = model.hvp(np.repeat(params, 6, axis=0), directions, features, labels, np.repeat(batch, 6, axis=0))
        everything = model.hvp(params, directions, features, labels)
        alone = model.hvp(params, directions[2:3], features, labels)
        none = model.hvp(params, directions[:0], features, labels, batch)
    assert none.shape == (0, model.dim)
    np.testing.assert_array_equal(product, repeated)
    step, rows = 1e-5, batch[0]
    for direction, got in zip(directions, product):
        plus = reference_loss_and_grad(model, params[0] + step * direction, features[rows], labels[rows])[1]
        minus = reference_loss_and_grad(model, params[0] - step * direction, features[rows], labels[rows])[1]
        expected = (plus - minus) / (2 * step)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
    np.testing.assert_array_equal(everything[2], alone[0])


@pytest.mark.parametrize("name", MODELS)
def test_hessian_vector_product_equals_the_dense_finite_difference_hessian(name):
    """The issue's oracle: H assembled column by column from differences of the analytic
    gradient, then H·v, to 1e−6 relative; and the gradient passes a difference check."""
    model = MODELS[name]()
    params, features, labels, _ = problem(model, workers=1, seed=3)
    point = params[0]
    columns = np.flatnonzero(_unpadded(model))
    step = 1e-5
    hessian = np.zeros((model.dim, model.dim))
    loss_at = lambda row: model.loss_and_grad(row[None], features, labels)[0][0]  # noqa: E731
    _, grad = model.loss_and_grad(params, features, labels)
    for column in columns:
        unit = np.zeros(model.dim)
        unit[column] = step
        hessian[:, column] = (
            model.loss_and_grad((point + unit)[None], features, labels)[1][0]
            - model.loss_and_grad((point - unit)[None], features, labels)[1][0]
        ) / (2 * step)
        difference = (loss_at(point + unit) - loss_at(point - unit)) / (2 * step)
        assert difference == pytest.approx(grad[0, column], rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(hessian, hessian.T, atol=1e-7)  # an honest Hessian is symmetric
    vectors = np.random.default_rng(4).normal(size=(4, model.dim)) * _unpadded(model)
    expected = vectors @ hessian.T
    actual = model.hvp(np.repeat(params, 4, axis=0), vectors, features, labels)
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
    assert np.abs(actual).max() > 1e-3  # a real curvature, not a vacuous zero


def test_hessian_vector_product_matches_torch_double_backward():
    torch = pytest.importorskip("torch")
    model = MODELS["mlp_tanh"]()
    params, features, labels, _ = problem(model, workers=1, seed=5)
    tangent = np.random.default_rng(6).normal(size=params.shape) * _unpadded(model)
    row = torch.tensor(params[0], requires_grad=True)

    def loss(flat):
        tensors = {
            name: flat[offset : offset + int(np.prod(shape))].reshape(shape)
            for name, shape, offset in zip(model.names, model.layout.shapes, model.layout.offsets)
        }
        hidden = torch.tanh(torch.as_tensor(features) @ tensors["W1"] + tensors["b1"])
        return torch.nn.functional.cross_entropy(
            hidden @ tensors["W2"] + tensors["b2"], torch.as_tensor(labels), ignore_index=-1
        )

    (grad,) = torch.autograd.grad(loss(row), row, create_graph=True)
    (expected,) = torch.autograd.grad(grad @ torch.as_tensor(tangent[0]), row)
    ours_loss, ours_grad = model.loss_and_grad(params, features, labels)
    assert ours_loss[0] == pytest.approx(float(loss(row).detach()), rel=1e-14)
    np.testing.assert_allclose(ours_grad[0], grad.detach().numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(
        model.hvp(params, tangent, features, labels)[0], expected.numpy(), rtol=1e-11, atol=1e-14
    )


@settings(max_examples=40, deadline=None)
@given(
    features=st.integers(1, 4),
    hidden=st.integers(0, 4),
    classes=st.integers(1, 4),
    samples=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    activation=st.sampled_from(models.ACTIVATIONS),
)
def test_any_shape_agrees_with_the_numpy_model(features, hidden, classes, samples, seed, activation):
    model = models.Model(features, classes, hidden, activation)
    rng = np.random.default_rng(seed)
    params = rng.normal(size=(2, model.dim)) * _unpadded(model)
    data = rng.normal(size=(samples, features)) * 3
    labels = rng.integers(-1, classes, samples)
    batch = rng.integers(0, samples, (2, samples))
    loss, grad = model.loss_and_grad(params, data, labels, batch)
    for worker in range(2):
        rows = batch[worker]
        expected_loss, expected_grad = reference_loss_and_grad(model, params[worker], data[rows], labels[rows])
        assert loss[worker] == pytest.approx(expected_loss, rel=1e-12, abs=1e-300)
        np.testing.assert_allclose(grad[worker], expected_grad, rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(grad[worker][_unpadded(model) == 0], 0.0)  # padding stays still


def test_no_valid_label_gives_zero_loss_zero_gradient_and_undefined_accuracy(target):
    model = MODELS["mlp_tanh"]()
    params, features, _, _ = problem(model, workers=2)
    labels = np.full(len(features), -1)
    with use_target(target):
        loss, grad = model.loss_and_grad(params, features, labels)
        evaluation = model.evaluate(params, features, labels)
    np.testing.assert_array_equal(loss, 0.0)
    np.testing.assert_array_equal(grad, 0.0)
    assert np.isnan(evaluation.accuracy).all()


def test_huge_logits_stay_finite_and_exact():
    """logits ≈ ±1e6: naive exp overflows; the stable pieces give scipy's logsumexp."""
    model = models.softmax_regression(features=2, classes=3)
    params = np.zeros((1, model.dim))
    model.unpack(params[0])["W2"][...] = [[1e6, -1e6, 3e5], [2e5, 1e6, -4e5]]
    features, labels = np.array([[1.0, 0.5], [-0.3, 1.0]]), np.array([2, 0])
    loss, grad = model.loss_and_grad(params, features, labels)
    expected_loss, expected_grad = reference_loss_and_grad(model, params[0], features, labels)
    assert loss[0] == pytest.approx(expected_loss, rel=1e-15)
    np.testing.assert_allclose(grad[0], expected_grad, rtol=1e-15)


def test_nan_parameters_propagate_to_loss_and_gradient():
    model = MODELS["mlp_relu"]()
    params, features, labels, _ = problem(model, workers=2)
    params[1, model.layout.offsets[1]] = np.nan  # one hidden bias of worker 1
    loss, grad = model.loss_and_grad(params, features, labels)
    assert np.isfinite(loss[0]) and np.isnan(loss[1])
    assert np.isfinite(grad[0]).all() and np.isnan(grad[1]).any()


def test_float32_tracks_float64():
    model = MODELS["mlp_tanh"]()
    params, features, labels, batch = problem(model)
    loss64, grad64 = model.loss_and_grad(params, features, labels, batch)
    loss32, grad32 = model.loss_and_grad(params.astype(np.float32), features.astype(np.float32), labels, batch)
    assert loss32.dtype == np.float64 and grad32.dtype == np.float32  # losses are summed on the host
    np.testing.assert_allclose(loss32, loss64, rtol=1e-6)
    np.testing.assert_allclose(grad32, grad64, rtol=1e-4, atol=1e-6)


def test_device_arrays_go_zero_copy_and_results_stay_on_the_device(target):
    if target != "cuda":
        pytest.skip("device arrays need the CUDA target")
    model = MODELS["mlp_tanh"]()
    params, features, labels, batch = problem(model)
    expected_loss, expected_grad = model.loss_and_grad(params, features, labels, batch)  # forced GPU run
    out = to_device(np.zeros_like(params))
    loss, grad = model.loss_and_grad(
        to_device(params), to_device(features), to_device(labels), to_device(batch), out=out
    )
    assert grad is out
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-12)
    np.testing.assert_allclose(to_host(out), expected_grad, rtol=1e-12, atol=1e-15)
    with pytest.raises(TypeError, match="different devices"):
        model.loss_and_grad(to_device(params), features, labels)


def test_torch_cpu_tensors_in_give_torch_tensors_out_with_the_numpy_bits():
    torch = pytest.importorskip("torch")
    model = MODELS["mlp_tanh"]()
    params, features, labels, batch = problem(model)
    tangent = np.random.default_rng(5).normal(size=(2, model.dim))
    loss, grad = model.loss_and_grad(
        torch.from_numpy(params), torch.from_numpy(features), torch.from_numpy(labels), torch.from_numpy(batch)
    )
    product = model.hvp(
        torch.from_numpy(params[:1]), torch.from_numpy(tangent), torch.from_numpy(features), torch.from_numpy(labels)
    )
    assert isinstance(grad, torch.Tensor) and isinstance(product, torch.Tensor)
    expected_loss, expected_grad = model.loss_and_grad(params, features, labels, batch)
    assert loss.tobytes() == expected_loss.tobytes()  # the per-worker losses are host summaries, NumPy as on the GPU
    assert grad.numpy().tobytes() == expected_grad.tobytes()
    assert product.numpy().tobytes() == model.hvp(params[:1], tangent, features, labels).tobytes()


def test_out_buffers_are_written_in_place(target):
    model = MODELS["softmax_regression"]()
    params, features, labels, batch = problem(model)
    tangent = np.ones_like(params)
    gradient_out, product_out = np.full_like(params, 7.0), np.full_like(params, 7.0)
    with use_target(target):
        _, grad = model.loss_and_grad(params, features, labels, batch, out=gradient_out)
        product = model.hvp(params, tangent, features, labels, batch, out=product_out)
        fresh_grad = model.loss_and_grad(params, features, labels, batch)[1]
        fresh_product = model.hvp(params, tangent, features, labels, batch)
    assert grad is gradient_out and product is product_out
    np.testing.assert_array_equal(gradient_out, fresh_grad)
    np.testing.assert_array_equal(product_out, fresh_product)


def test_out_buffers_that_cannot_be_written_in_place_are_refused(target):
    model = MODELS["softmax_regression"]()
    params, features, labels, batch = problem(model)
    read_only = np.zeros_like(params)
    read_only.flags.writeable = False
    cases = [
        (read_only, ValueError, "out is read-only"),  # Numba's typing error before
        (params.tolist(), TypeError, "out is a list"),  # written into a copy, silently
        (np.zeros((params.shape[0], 2 * params.shape[1]))[:, ::2], ValueError, "out must be C-contiguous"),
    ]
    with use_target(target):
        for out, error, message in cases:
            with pytest.raises(error, match=message):
                model.loss_and_grad(params, features, labels, batch, out=out)
            with pytest.raises(error, match=message):
                model.hvp(params, np.ones_like(params), features, labels, batch, out=out)


def test_full_data_calls_reuse_the_compiled_kernels(monkeypatch):
    """Without a batch the model makes its own [N, samples] index array; for one worker a
    broadcast view of it would be read-only, which Numba types apart from a writable array,
    and every kernel would compile a second time (the demo evaluates one mean model)."""
    import steadystep.cpu.backend as cpu_backend

    launched = []
    run = cpu_backend.run_grid
    monkeypatch.setattr(
        cpu_backend,
        "run_grid",
        lambda kernel, arguments, size: (launched.append(arguments), run(kernel, arguments, size)),
    )
    model = MODELS["mlp_tanh"]()
    params, features, labels, _ = problem(model, workers=1)
    model.loss_and_grad(params, features, labels)
    model.hvp(params, np.ones_like(params), features, labels)
    arrays = [value for arguments in launched for value in arguments if isinstance(value, np.ndarray)]
    assert arrays
    assert all(array.flags.writeable for array in arrays)


BAD_CALLS = [
    ("params", lambda m, p, f, y: m.loss_and_grad(p[:, :-1], f, y), ValueError, r"params must be an \[N, "),
    ("params dtype", lambda m, p, f, y: m.loss_and_grad(p.astype(np.int64), f, y), TypeError, "float32 or float64"),
    ("features", lambda m, p, f, y: m.loss_and_grad(p, f[:, :-1], y), ValueError, "features must be"),
    (
        "labels range",
        lambda m, p, f, y: m.loss_and_grad(p, f, np.full_like(y, m.classes)),
        ValueError,
        "labels must be < classes",
    ),
    (
        "labels dtype",
        lambda m, p, f, y: m.loss_and_grad(p, f, y.astype(float)),
        ValueError,
        "labels must be an integer",
    ),
    (
        "batch range",
        lambda m, p, f, y: m.loss_and_grad(p, f, y, np.full((len(p), 2), len(f))),
        ValueError,
        "batch entries",
    ),
    (
        "batch shape",
        lambda m, p, f, y: m.loss_and_grad(p, f, y, np.zeros((len(p) + 1, 2), int)),
        ValueError,
        "batch must be",
    ),
    ("tangent", lambda m, p, f, y: m.hvp(p, p[:, :3], f, y), ValueError, "tangent must be"),
    (
        "tangent rows",
        lambda m, p, f, y: m.hvp(p, np.vstack([p, p]), f, y),
        ValueError,
        r"tangent must be .* \(or any number of rows for one row of params\)",
    ),
    ("out", lambda m, p, f, y: m.loss_and_grad(p, f, y, out=np.zeros(3)), ValueError, "out must be"),
    # features other than real numbers: complex lost its imaginary part, strings were parsed, None gave NaN
    ("complex features", lambda m, p, f, y: m.loss_and_grad(p, f + 1j, y), TypeError, "features has dtype complex128"),
    ("string features", lambda m, p, f, y: m.loss_and_grad(p, f.astype(str), y), TypeError, "features has dtype <U"),
    (
        "object features",
        lambda m, p, f, y: m.loss_and_grad(p, np.where(f > 0, f, None), y),
        TypeError,
        "features has dtype object",
    ),
    ("complex tangent", lambda m, p, f, y: m.hvp(p, p + 0j, f, y), TypeError, "tangent has dtype complex"),
    ("no tangent", lambda m, p, f, y: m.hvp(p, None, f, y), TypeError, "tangent must be an array of directions"),
]


@pytest.mark.parametrize("case", BAD_CALLS, ids=[case[0] for case in BAD_CALLS])
def test_bad_input_names_the_argument_and_writes_nothing(case):
    _, call, error, message = case
    model = MODELS["mlp_tanh"]()
    params, features, labels, _ = problem(model)
    before = params.copy()
    with pytest.raises(error, match=message):
        call(model, params, features, labels)
    np.testing.assert_array_equal(params, before)


def test_an_out_that_requires_grad_is_refused_while_autograd_records():
    """As the formula functions refuse it: the write would bypass autograd's graph."""
    torch = pytest.importorskip("torch")
    model = MODELS["mlp_tanh"]()
    params, features, labels, _ = problem(model)
    out = torch.zeros(params.shape, dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match="out is a torch tensor that requires grad"):
        model.loss_and_grad(torch.from_numpy(params), torch.from_numpy(features), torch.from_numpy(labels), out=out)
    assert not out.detach().any()
    with torch.no_grad():  # an in-place use under no_grad is what the message offers
        model.loss_and_grad(torch.from_numpy(params), torch.from_numpy(features), torch.from_numpy(labels), out=out)
    assert out.detach().any()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: models.mlp(3, 2, 2, activation="gelu"), "activation must be one of"),
        (
            lambda: models.mlp(3, 0, 2),
            r"hidden must be a whole number ≥ 1 for an MLP \(with none, use softmax_regression\)",
        ),
        (lambda: models.mlp(3, True, 2), "hidden must be a whole number ≥ 1 for an MLP .*, got True"),
        (lambda: models.softmax_regression(3, 0), "classes must be a whole number ≥ 1, got 0"),
        (lambda: models.softmax_regression(3.0, 2), "features must be a whole number ≥ 1, got 3.0"),
        (lambda: models.Model(3, 2, hidden=-1), r"hidden must be a whole number ≥ 0 \(0: softmax regression\), got -1"),
        (lambda: models.mlp(3, 2, 2).init(workers=0), "workers must be a whole number ≥ 1, got 0"),
        (lambda: models.mlp(3, 2, 2).init(dtype=int), "dtype must be float32 or float64"),
        (lambda: models.mlp(3, 2, 2).init(dtype=np.float16), "dtype must be float32 or float64"),
        (
            lambda: models.mlp(3, 2, 2).unpack(np.zeros((2, 256))),
            r"row must be one worker's parameters, shape \(256,\)",
        ),
        (lambda: models.mlp(3, 2, 2).unpack(np.zeros(100)), r"shape \(256,\) .* got shape \(100,\)"),
    ],
)
def test_bad_model_definitions_are_refused(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_numpy_integers_define_the_same_model():
    """Sizes read off arrays (labels.max() + 1) are NumPy integers: the same model, plain ints inside."""
    model = models.mlp(np.int64(64), np.int32(32), np.int64(10))
    assert model == models.mlp(64, 32, 10) and type(model.classes) is int
    np.testing.assert_array_equal(model.init(workers=np.int64(2)), models.mlp(64, 32, 10).init(workers=2))


def test_layout_init_and_decay_mask():
    model = models.mlp(features=64, hidden=32, classes=10)
    assert model.layout.shapes == ((64, 32), (32,), (32, 10), (10,))
    assert all(offset % 64 == 0 for offset in model.layout.offsets)
    params = model.init(workers=8, seed=3)
    assert params.shape == (8, model.dim) and params.dtype == np.float32
    np.testing.assert_array_equal(params, np.repeat(params[:1], 8, axis=0))  # workers start in consensus
    tensors = model.unpack(params[0])
    assert np.abs(tensors["W1"]).max() <= np.sqrt(6 / 96) and tensors["W1"].std() > 0.05
    np.testing.assert_array_equal(tensors["b1"], 0.0)
    mask = model.decay_mask()
    assert mask.sum() == 64 * 32 + 32 * 10 and mask[model.layout.offsets[1]] == 0


def test_model_hvp_is_a_diagnostics_source():
    """An eigenvector of the model's Hessian gives A_norm = its eigenvalue."""
    model = MODELS["mlp_tanh"]()
    params, features, labels, _ = problem(model, workers=1, seed=7)
    source = diagnostics.model_hvp(model, params[0], features, labels)
    live = np.flatnonzero(_unpadded(model))
    hessian = source(np.eye(model.dim)[live])[:, live]
    values, vectors = np.linalg.eigh((hessian + hessian.T) / 2)
    direction = np.zeros(model.dim)
    direction[live] = vectors[:, 0]  # the most negative curvature (tanh makes H indefinite)
    result = diagnostics.noise_alignment(source, np.zeros(model.dim), np.stack([direction, -2 * direction]))
    assert result.a_norm.value == pytest.approx(values[0], rel=1e-9)
    with pytest.raises(ValueError, match=f"vectors must be a \\[K, {model.dim}\\] array for this model, got shape"):
        source(np.ones((2, model.dim - 1)))  # the message named the model's internal 'tangent'


def test_model_hvp_runs_where_the_point_lives(target):
    """A point on the GPU (or a torch tensor that requires grad, as training holds it) takes
    the vectors to itself; the products come back as host float64, with the host run's values."""
    model = MODELS["mlp_tanh"]()
    params, features, labels, batch = problem(model, workers=1, seed=3)
    vectors = np.random.default_rng(4).normal(size=(3, model.dim))
    with use_target(target):
        expected = diagnostics.model_hvp(model, params[0], features, labels, batch[0])(vectors)
    if target == "cuda":
        point, features, labels, rows = (to_device(array) for array in (params[0], features, labels, batch[0]))
    else:
        torch = pytest.importorskip("torch")
        point, rows = torch.tensor(params[0], requires_grad=True), torch.from_numpy(batch[0])
    products = diagnostics.model_hvp(model, point, features, labels, rows)(vectors)
    assert type(products) is np.ndarray and products.dtype == np.float64
    np.testing.assert_array_equal(products, expected)
