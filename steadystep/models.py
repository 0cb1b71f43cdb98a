"""Reference models with exact gradients and Hessian-vector products, batched over N workers.

A model's parameters are one row of an [N, D] arena (``model.layout``: each tensor padded to
64 elements), so N workers' forward, backward and R-operator Hessian-vector products run as
two parallel Numba kernels on the CPU or the GPU, whichever holds ``params``. The loss is
the cross-entropy averaged over each worker's valid labels (a label < 0 is ignored), with
the package's stable logsumexp/softmax pieces; the formulas are in
``steadystep/kernels/models.py``.

>>> import numpy as np
>>> from steadystep import models
>>> model = models.mlp(features=4, hidden=3, classes=2)
>>> params = model.init(workers=2, seed=0)                  # [2, D], identical rows
>>> features, labels = np.eye(4), np.array([0, 1, 1, 0])
>>> loss, grad = model.loss_and_grad(params, features, labels)
>>> grad.shape == params.shape, np.allclose(loss[0], loss[1])
(True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from steadystep import _arrays, checks, dispatch
from steadystep.arena import Layout
from steadystep.diagnostics import Hvp

__all__ = [
    "ACTIVATIONS",
    "Evaluation",
    "Model",
    "mlp",
    "softmax_regression",
]

ACTIVATIONS = ("tanh", "relu")


@dataclass(frozen=True)
class Evaluation:
    """Per-worker mean loss and accuracy over the evaluated samples."""

    loss: np.ndarray
    accuracy: np.ndarray


@dataclass(frozen=True)
class Model:
    """Softmax regression (``hidden == 0``) or a one-hidden-layer MLP, parameters in one row.

    Tensors, in row order: ``W1`` [features, hidden] and ``b1`` [hidden] (MLP only), then
    ``W2`` [inputs, classes] and ``b2`` [classes], where inputs is ``hidden`` or ``features``.
    """

    features: int
    classes: int
    hidden: int = 0
    activation: str = "tanh"

    def __post_init__(self) -> None:
        checks.counts(features=(self.features, 1), classes=(self.classes, 1))
        checks.counts(" (0: softmax regression)", hidden=(self.hidden, 0))
        for name in ("features", "classes", "hidden"):  # a NumPy integer (classes = labels.max() + 1) is a count too
            object.__setattr__(self, name, int(getattr(self, name)))
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return ("W1", "b1", "W2", "b2") if self.hidden else ("W2", "b2")

    @cached_property
    def layout(self) -> Layout:
        inputs = self.hidden or self.features
        shapes = [(inputs, self.classes), (self.classes,)]
        if self.hidden:
            shapes = [(self.features, self.hidden), (self.hidden,)] + shapes
        return Layout.of(shapes)

    @property
    def dim(self) -> int:
        """D, the length of one worker's parameter row (padding included)."""
        return self.layout.size

    @cached_property
    def parameter_indices(self) -> np.ndarray:
        """Where the real parameters sit in a row (everything but the padding)."""
        return np.concatenate(
            [
                np.arange(offset, offset + math.prod(shape))
                for shape, offset in zip(self.layout.shapes, self.layout.offsets)
            ]
        )

    def decay_mask(self, dtype: Any = np.float32) -> np.ndarray:
        """1 on the weight matrices, 0 on biases and padding (for weight decay)."""
        return self.layout.mask(dtype=dtype)

    def unpack(self, row: np.ndarray) -> dict[str, np.ndarray]:
        """Views of each tensor inside one parameter row."""
        if np.shape(row) != (self.dim,):
            raise ValueError(
                f"row must be one worker's parameters, shape ({self.dim},) for this model (params[i] of "
                f"an [N, {self.dim}] array), got shape {np.shape(row)}"
            )
        return {
            name: row[offset : offset + math.prod(shape)].reshape(shape)
            for name, shape, offset in zip(self.names, self.layout.shapes, self.layout.offsets)
        }

    def init(self, workers: int = 1, seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
        """[workers, D] parameters, every row the same Glorot-uniform draw (biases and padding 0)."""
        checks.counts(workers=(workers, 1))
        if np.dtype(dtype) not in (np.float32, np.float64):
            raise TypeError(
                f"dtype must be float32 or float64 (what the model kernels compute in), got {np.dtype(dtype)}"
            )
        rng = np.random.default_rng(seed)
        row = np.zeros(self.dim, np.float64)
        for name, tensor in self.unpack(row).items():
            if tensor.ndim == 2:
                limit = math.sqrt(6.0 / sum(tensor.shape))
                tensor[...] = rng.uniform(-limit, limit, tensor.shape)
        return np.tile(row.astype(dtype), (workers, 1))

    # -- batched evaluation ----------------------------------------------------------------------

    def loss_and_grad(
        self, params: Any, features: Any, labels: Any, batch: Any = None, out: Any = None
    ) -> tuple[np.ndarray, Any]:
        """Each worker's mean cross-entropy over its batch (host [N]) and its gradient ([N, D],
        in ``out`` when given, else a new array on the side of ``params``).

        ``batch[n]`` lists the rows of ``features``/``labels`` worker n uses (one [N, B]
        integer array); ``None`` gives every worker all rows. All arrays live on one side
        (CPU or GPU), as everywhere in steadystep.
        """
        run = self._run(params, features, labels, batch, backward=True, gradient_out=out)
        return run.loss, run.gradient

    def hvp(self, params: Any, tangent: Any, features: Any, labels: Any, batch: Any = None, out: Any = None) -> Any:
        """Each worker's exact Hessian-vector product H(params[n])·tangent[n] ([N, D]).

        With one row of ``params`` ([1, D]) and K rows of ``tangent``, H at that one point
        times each of the K directions ([K, D]): the forward and backward work runs once,
        not K times (``batch``, when given, is then [1, B]).
        """
        if tangent is None:  # the run would compute the gradient and return no product
            raise TypeError(
                f"tangent must be an array of directions ([N, {self.dim}], or [K, {self.dim}] for one row of "
                "params); got None"
            )
        return self._run(params, features, labels, batch, backward=True, tangent=tangent, hvp_out=out).hessian_vector

    def evaluate(self, params: Any, features: Any, labels: Any, batch: Any = None) -> Evaluation:
        """Each worker's mean loss and accuracy (argmax, first maximum on ties) over its batch."""
        run = self._run(params, features, labels, batch, backward=False)
        return Evaluation(run.loss, run.accuracy)

    def hvp_at(self, point: Any, features: Any, labels: Any, batch: Any = None) -> Hvp:
        """A diagnostics Hessian-vector product source: H at ``point`` (one row, [D]) applied
        to a [K, D] batch of vectors in one launch, where ``point`` lives (a GPU point takes
        the vectors there); the products come back as host float64, as diagnostics work in NumPy."""
        operand = _arrays.classify("point", point)
        _arrays.compute_dtype([operand])  # refuses strings and objects by name
        if operand.kind == "scalar" or operand.shape != (self.dim,):
            raise ValueError(f"point must have shape ({self.dim},), got {operand.shape}")
        row = _one_row("point", point)
        rows = None if batch is None else _one_row("batch", batch)

        def product(vectors: np.ndarray) -> np.ndarray:
            vectors = np.atleast_2d(_arrays.host_numbers("vectors", vectors, operand.dtype))
            if vectors.ndim != 2 or vectors.shape[1] != self.dim:  # named as the diagnostics pass them
                raise ValueError(f"vectors must be a [K, {self.dim}] array for this model, got shape {vectors.shape}")
            if operand.kind == "device":
                from steadystep.cuda.runtime import require_cuda

                vectors = require_cuda().to_device(np.ascontiguousarray(vectors))
            return dispatch.host_array(self.hvp(row, vectors, features, labels, rows)).astype(np.float64)

        return product

    # -- the launches ----------------------------------------------------------------------------

    def _run(
        self,
        params: Any,
        features: Any,
        labels: Any,
        batch: Any,
        backward: bool,
        tangent: Any = None,
        gradient_out: Any = None,
        hvp_out: Any = None,
    ) -> _Run:
        params_operand = _arrays.classify("params", params)
        shape, dtype = params_operand.shape, params_operand.dtype
        if params_operand.kind == "scalar" or len(shape) != 2 or shape[1] != self.dim:
            raise ValueError(f"params must be an [N, {self.dim}] array for this model, got shape {shape}")
        if dtype not in (np.float32, np.float64) or params_operand.storage:
            raise TypeError(f"params has dtype {_arrays.dtype_name(params_operand)}; use float32 or float64")
        workers = shape[0]
        operands = {"params": params_operand}
        operands["features"] = _arrays.classify("features", features)
        operands["labels"] = _arrays.classify("labels", labels)
        samples = operands["features"].shape[0] if operands["features"].shape else 0
        if batch is not None:
            operands["batch"] = _arrays.classify("batch", batch)
        for name, value in (("tangent", tangent), ("gradient_out", gradient_out), ("hvp_out", hvp_out)):
            if value is not None:
                operands[name] = _arrays.classify(name, value)
                if name.endswith("_out"):  # written in place: refused before any launch if it cannot be
                    out = _arrays.classify("out", value)
                    if out.kind == "scalar":
                        raise TypeError(f"out must be an array (written in place); got the number {value!r}")
                    _arrays.check_writable(out)
        where = dispatch.choose_target(list(operands.values()), None)
        # as the formula functions: nothing here is differentiable by autograd, and an out
        # that requires grad would be written behind its back
        _arrays.check_untracked(
            [operand for name, operand in operands.items() if not name.endswith("_out")],
            gradient_out if gradient_out is not None else hvp_out,
        )
        if batch is None:  # every row for every worker, made on the host and moved like user data
            # a writable copy, not a broadcast view: Numba types read-only arrays apart, and each
            # kernel would compile a second time (~10 s of the demo's first run)
            everything = np.tile(np.arange(samples, dtype=np.int64), (workers, 1))
            operands["batch"] = _arrays.Operand("batch", everything, "host", everything.dtype, everything.shape)
        label_values, batch_values = self._check(operands, workers, samples, dtype)
        side = _Side(where, dtype, params_operand)
        arrays = {name: side.put(operand) for name, operand in operands.items()}
        width = operands["batch"].shape[1]
        with_tangent = "tangent" in operands
        directions = operands["tangent"].shape[0] if with_tangent else 0
        losses, correct = side.empty((workers, width)), side.empty((workers, width))
        valid_counts = (label_values[batch_values] >= 0).sum(axis=1)
        valid = side.put(_arrays.classify("valid", valid_counts.astype(dtype)))
        forward = self._workspace(side, workers, width)  # activation, delta_hidden, delta_out
        # softmax(z) for the tangent pass; without one the deltas overwrite it in delta_out
        probabilities = side.empty((workers, width, self.classes)) if with_tangent else forward[2]
        offsets = self.layout.offsets if self.hidden else (0, 0, *self.layout.offsets)
        module = dispatch.kernel_module(where, "models")
        suffix = _arrays.suffix(dtype)
        backend = side.backend
        common = [arrays["features"], arrays["labels"], arrays["batch"], valid]
        relu = self.activation == "relu"
        backend.run_grid(
            getattr(module, f"sample_pass_{suffix}_grid"),
            [workers, width, arrays["params"], *common, losses, correct, *forward, probabilities, *offsets, relu],
            workers * width,
        )
        run = _Run(
            loss=dispatch.host_array(losses).sum(axis=1, dtype=np.float64),
            accuracy=_accuracy(dispatch.host_array(correct), valid_counts),
        )
        if not backward:
            return run
        tangents = forward  # without a tangent the R-operator arrays are never read: the forward ones stand in
        if with_tangent:
            tangents = self._workspace(side, directions, width)  # Ra, Rδh, Rδz
            activation, _, delta_out = forward
            backend.run_grid(
                getattr(module, f"tangent_pass_{suffix}_grid"),
                [
                    directions,
                    width,
                    arrays["params"],
                    arrays["tangent"],
                    *common,
                    activation,
                    delta_out,
                    probabilities,
                    *tangents,
                    *offsets,
                    relu,
                ],
                directions * width,
            )
        # the gradient of each worker, or the H·v of each direction
        requested, name, count = (
            (hvp_out, "hvp_out", directions) if with_tangent else (gradient_out, "gradient_out", workers)
        )
        result = arrays[name] if name in arrays else side.result((count, self.dim))
        column_sums = side.empty((count, self.classes, self.hidden or self.features))
        activation, delta_hidden, delta_out = forward
        tangent_activation, tangent_delta_hidden, tangent_delta_out = tangents
        w1, b1, w2, b2 = offsets
        if self.hidden:  # one item per row of W1 and one for b1
            rows = self.features + 1
            backend.run_grid(
                getattr(module, f"hidden_row_pass_{suffix}_grid"),
                [
                    count,
                    rows,
                    arrays["features"],
                    arrays["batch"],
                    activation,
                    delta_hidden,
                    tangent_delta_hidden,
                    result,
                    w1,
                    b1,
                    with_tangent,
                ],
                count * rows,
            )
        backend.run_grid(
            getattr(module, f"class_column_pass_{suffix}_grid"),  # one per class: W2's column and b2's entry
            [
                count,
                self.classes,
                arrays["features"],
                arrays["batch"],
                activation,
                delta_out,
                tangent_activation,
                tangent_delta_out,
                result,
                column_sums,
                w2,
                b2,
                with_tangent,
            ],
            count * self.classes,
        )
        backend.run_grid(
            getattr(module, f"padding_pass_{suffix}_grid"),  # the four stretches of padding
            [count, 4, arrays["features"], activation, delta_out, result, w1, b1, w2, b2],
            count * 4,
        )
        if with_tangent:
            run.hessian_vector = side.back(result, requested)
        else:
            run.gradient = side.back(result, requested)
        _arrays.mark_written(requested)
        return run

    def _workspace(self, side: "_Side", rows: int, width: int) -> list:
        """Per-sample arrays of one pass: two [rows, width, hidden] (hidden units) and one
        [rows, width, classes]."""
        return [
            side.empty((rows, width, self.hidden)),
            side.empty((rows, width, self.hidden)),
            side.empty((rows, width, self.classes)),
        ]

    def _check(self, operands: dict, workers: int, samples: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Refuses bad input before any launch; returns the labels and batch as host values."""
        features, labels, batch = operands["features"], operands["labels"], operands["batch"]
        for name in ("features", "tangent"):
            kind = operands[name].dtype.kind if name in operands and operands[name].dtype is not None else "f"
            if kind not in "biuf":  # complex lost its imaginary part, strings were parsed, None became NaN
                raise TypeError(
                    f"{name} has dtype {operands[name].dtype}; pass real numbers (float32 or float64; "
                    "convert objects or strings with .astype(np.float32) first)"
                )
        if features.shape != (samples, self.features) or samples < 1:
            raise ValueError(
                f"features must be a non-empty [samples, {self.features}] array, got shape {features.shape}"
            )
        if features.kind == "device" and (features.dtype != dtype or features.storage):
            raise TypeError(
                f"features are {_arrays.dtype_name(features)} on the GPU but params are {dtype}; pass matching dtypes"
            )
        if labels.shape != (samples,) or labels.dtype.kind not in "iu":
            raise ValueError(
                f"labels must be an integer array of shape ({samples},), got {labels.dtype} {labels.shape}"
            )
        if len(batch.shape) != 2 or batch.shape[0] != workers or batch.dtype.kind not in "iu":
            raise ValueError(
                f"batch must be an integer [{workers}, B] array of sample rows, got {batch.dtype} {batch.shape}"
            )
        label_values = dispatch.host_array(labels.value)
        if label_values.size and label_values.max() >= self.classes:
            raise ValueError(
                f"labels must be < classes = {self.classes} (negative labels are ignored); found {label_values.max()}"
            )
        batch_values = dispatch.host_array(batch.value)
        if batch_values.size and (batch_values.min() < 0 or batch_values.max() >= samples):
            raise ValueError(
                f"batch entries must be rows of features, in [0, {samples}); "
                f"found {batch_values.min()}..{batch_values.max()}"
            )
        tangent = operands.get("tangent")
        directions = workers if tangent is None or len(tangent.shape) != 2 or workers != 1 else tangent.shape[0]
        for name in ("tangent", "gradient_out", "hvp_out"):
            rows = workers if name == "gradient_out" else directions
            if name in operands and (operands[name].shape != (rows, self.dim) or operands[name].dtype != dtype):
                label = "out" if name.endswith("_out") else name
                shared = " (or any number of rows for one row of params)" if name == "tangent" and workers > 1 else ""
                raise ValueError(
                    f"{label} must be {dtype} of shape {(rows, self.dim)}{shared}, "
                    f"got {operands[name].dtype} {operands[name].shape}"
                )
        return label_values, batch_values


def softmax_regression(features: int, classes: int) -> Model:
    """Multinomial logistic regression: z = W2ᵀx + b2, cross-entropy loss."""
    return Model(features, classes)


def mlp(features: int, hidden: int, classes: int, activation: str = "tanh") -> Model:
    """One hidden layer: z = W2ᵀ act(W1ᵀx + b1) + b2 with act = tanh or relu."""
    checks.counts(" for an MLP (with none, use softmax_regression)", hidden=(hidden, 1))
    return Model(features, classes, hidden, activation)


# -- helpers ---------------------------------------------------------------------------------------


@dataclass
class _Run:
    loss: np.ndarray
    accuracy: np.ndarray
    gradient: Any = None
    hessian_vector: Any = None


def _one_row(name: str, values: Any) -> Any:
    """A point's parameters or its batch of sample rows as one [1, n] row, on the side they live."""
    operand = _arrays.classify(name, values)
    return values.reshape(1, -1) if operand.kind == "device" else np.asarray(operand.value).reshape(1, -1)


def _accuracy(correct: np.ndarray, valid: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(valid > 0, correct.sum(axis=1) / np.maximum(valid, 1), np.nan)


_INDEX = np.dtype(np.int64)


class _Side:
    """Puts arrays where the kernels run: GPU arrays stay (zero-copy); host arrays go to the GPU
    only when the target was forced (``use_target("cuda")``), and then results come back."""

    def __init__(self, where: str, dtype: np.dtype, params: _arrays.Operand):
        self.where, self.dtype, self.params = where, dtype, params
        self.backend = dispatch.backend(where)
        self.forced = where == "cuda" and params.kind == "host"

    def put(self, operand: _arrays.Operand) -> Any:
        if operand.name in ("gradient_out", "hvp_out") and self.where == "cpu":
            return operand.value  # written in place (a NumPy view of a torch CPU tensor works too)
        dtype = {"features": self.dtype, "labels": _INDEX, "batch": _INDEX}.get(operand.name)
        return self.backend.kernel_array(operand, dtype)

    def empty(self, shape: tuple[int, ...]) -> Any:
        return self.backend.empty(shape, self.dtype)

    def result(self, shape: tuple[int, ...]) -> Any:
        """A new result array of the library of ``params`` (NumPy or torch on the CPU; torch,
        CuPy or Numba on the GPU); NumPy when host data was forced onto the GPU."""
        if self.forced:
            return self.empty(shape)
        return self.backend.allocate_like([self.params], shape, self.dtype)

    def back(self, result: Any, requested: Any) -> Any:
        """What the caller gets: a forced GPU run copies into their host ``out`` (or a new array)."""
        if not self.forced:
            return result if requested is None else requested
        if requested is None:
            return result.copy_to_host()
        result.copy_to_host(_arrays.classify("out", requested).value)
        return requested
