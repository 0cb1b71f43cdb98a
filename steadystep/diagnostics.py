"""Gradient-noise and consensus curvature diagnostics (SPEC §5); the Hessian's top eigenpairs,
trace and spectral density are in [`steadystep.curvature`][steadystep.curvature].

At a checkpoint with full-data mean gradient ḡ and Hessian H of the same mean loss, sampled
minibatch gradients g_k have noise v_k = g_k − ḡ, and

    A = (1/S) Σ v_kᵀ H v_k,        A_norm = Σ v_kᵀ H v_k / Σ ‖v_k‖²   (a ratio of sums),

compared with the isotropic reference (1/(D·R)) Σ r_kᵀ H r_k over Rademacher vectors r_k.
Consensus alignment applies the same estimators to e_i = x_i − x̄ with H at x̄.

A Hessian-vector product is any function taking a [K, D] batch of vectors to H·v for each
row: [`matrix_hvp()`][steadystep.diagnostics.matrix_hvp],
[`finite_difference_hvp()`][steadystep.diagnostics.finite_difference_hvp] of a gradient function,
[`model_hvp()`][steadystep.diagnostics.model_hvp] of a [`steadystep.models`][steadystep.models] model, or a user
callable, for example with torch (double backward)::

    def hvp(vectors):                                  # [K, D] float64 NumPy -> [K, D]
        out = []
        for v in torch.as_tensor(vectors, dtype=params.dtype, device=params.device):
            grad = torch.autograd.grad(loss(params), params, create_graph=True)[0]
            out.append(torch.autograd.grad(grad @ v, params)[0])
        return torch.stack(out)

or with JAX, ``jax.vmap(lambda v: jax.jvp(jax.grad(loss), (x,), (v,))[1])``; for a torch module,
[`steadystep.torch.curvature.ModuleHessian`][steadystep.torch.curvature.ModuleHessian] does it
(forward-over-reverse, vmapped, streamed over a data set's batches as a token mean). What such a
function returns may be any array (torch tensors, on the GPU or requiring grad; CuPy and Numba
device arrays; JAX arrays; lists): it comes back to the host as float64.

>>> import numpy as np
>>> from steadystep import diagnostics
>>> hvp = diagnostics.matrix_hvp(np.diag([2.0, -1.0]))
>>> diagnostics.noise_alignment(hvp, np.zeros(2), np.array([[1.0, 0.0], [-1.0, 0.0]])).a_norm.value
2.0
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from steadystep import _arrays, _estimates, checks

__all__ = [
    "ConsensusAlignment",
    "Estimate",
    "Hvp",
    "NoiseAlignment",
    "PROBE_BYTES",
    "anisotropy",
    "callable_hvp",
    "consensus_alignment",
    "finite_difference_hvp",
    "isotropic_reference",
    "matrix_hvp",
    "model_hvp",
    "noise_alignment",
]

Hvp = _estimates.Hvp
PROBE_BYTES = 256 * 2**20  # isotropic_reference's default batch of probes stays under this


# -- Hessian-vector products --------------------------------------------------------------------


def matrix_hvp(hessian: np.ndarray) -> Hvp:
    """H·v from an explicit symmetric matrix."""
    hessian = _estimates.host_values(hessian, "hessian")
    if hessian.ndim != 2 or hessian.shape[0] != hessian.shape[1]:
        raise ValueError(f"hessian must be a square matrix, got shape {hessian.shape}")
    size = hessian.shape[0]

    def product(vectors: np.ndarray) -> np.ndarray:
        vectors = np.atleast_2d(vectors)
        if vectors.shape[-1] != size:  # isotropic_reference(hvp, dim=...) with another dim, say
            raise ValueError(
                f"vectors of length {vectors.shape[-1]} for a {size}×{size} Hessian; they must have length {size}"
            )
        return vectors @ hessian.T

    return product


def callable_hvp(function: Callable[[np.ndarray], np.ndarray], batched: bool = False) -> Hvp:
    """H·v from a user function of one vector (or of a [K, D] batch when ``batched``)."""
    if batched:
        return lambda vectors: _estimates.host_values(function(np.atleast_2d(vectors)))
    return lambda vectors: np.stack([_estimates.host_values(function(v)) for v in np.atleast_2d(vectors)])


def finite_difference_hvp(gradient: Callable[[np.ndarray], np.ndarray], point: np.ndarray) -> Hvp:
    """H·v ≈ (∇f(x + h·v) − ∇f(x − h·v)) / 2h, by central differences of a gradient function.

    The step is h = ε^(1/3)·max(1, ‖x‖)/‖v‖ for the dtype's ε, balancing truncation (h²)
    against rounding (ε/h). It needs a deterministic gradient (no dropout, fixed batch) and a
    loss that is twice differentiable near x (ReLU kinks give one-sided answers). Exact, up to
    rounding, for quadratic losses.
    """
    point = _arrays.host_numbers("point", point)
    dtype = point.dtype if point.dtype.kind == "f" else np.dtype(np.float64)
    epsilon = np.finfo(dtype).eps

    def product(vectors: np.ndarray) -> np.ndarray:
        rows = []
        for vector in np.atleast_2d(_arrays.host_numbers("vectors", vectors)):
            norm = float(np.linalg.norm(vector))
            if norm == 0.0:
                rows.append(np.zeros_like(vector, dtype=np.float64))
                continue
            step = epsilon ** (1 / 3) * max(1.0, float(np.linalg.norm(point))) / norm
            # x ± h·v in the point's dtype: a float32 model's gradient gets float32 points
            forward = _gradient_at(gradient, (point + step * vector).astype(dtype, copy=False))
            backward = _gradient_at(gradient, (point - step * vector).astype(dtype, copy=False))
            rows.append((forward - backward) / (2 * step))
        return np.stack(rows)

    return product


def _gradient_at(gradient: Callable[[np.ndarray], np.ndarray], point: np.ndarray) -> np.ndarray:
    values = _estimates.host_values(gradient(point), "the gradient function")
    if values.shape != point.shape:  # differences of a wrong-shaped gradient would be a wrong-shaped H·v
        raise ValueError(
            f"the gradient function returned shape {values.shape} at a point of shape {point.shape}; "
            "it must return the gradient there, of the point's shape"
        )
    return values


def model_hvp(model: Any, point: np.ndarray, features: Any, labels: Any, batch: Any = None) -> Hvp:
    """Exact H·v of a [`steadystep.models`][steadystep.models] model's mean loss at ``point`` (its R-operator:
    one forward and backward at the point, then all K vectors in one batched launch)."""
    return model.hvp_at(point, features, labels, batch)


# -- results ---------------------------------------------------------------------------------------


@dataclass
class Estimate:
    """An estimate with its standard error and the raw per-sample values (None: undefined)."""

    value: Optional[float]
    standard_error: Optional[float]
    samples: list[Optional[float]] = field(default_factory=list, repr=False)

    def __repr__(self) -> str:
        if self.value is None:
            return "undefined"
        return (
            f"{self.value:.6g} ± {self.standard_error:.2g}" if self.standard_error is not None else f"{self.value:.6g}"
        )


@dataclass(repr=False)
class NoiseAlignment(_estimates.Report):
    a: Estimate
    a_norm: Estimate
    samples: int


@dataclass(repr=False)
class ConsensusAlignment(_estimates.Report):
    a: Estimate
    a_norm: Estimate
    mean_error_norm: float
    consensus_distance: float


# -- estimators ----------------------------------------------------------------------------------


def _quadratic_forms(hvp: Hvp, vectors: np.ndarray) -> np.ndarray:
    return np.einsum("kd,kd->k", vectors, _estimates.products(hvp, vectors))


def _rows(name: str, vectors: Any) -> np.ndarray:
    """``vectors`` as a float64 [K, D] array with K ≥ 1, or a ValueError naming it."""
    rows = np.atleast_2d(_estimates.host_values(vectors, name))
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty [K, D] array of vectors, got shape {np.shape(vectors)}")
    return _estimates.finite(rows, name)


def _alignment(hvp: Hvp, vectors: np.ndarray) -> tuple[Estimate, Estimate]:
    """A (mean of vᵀHv) and A_norm (Σ vᵀHv / Σ‖v‖², delta-method error) over the rows."""
    count = vectors.shape[0]
    forms = _quadratic_forms(hvp, vectors)
    norms = np.einsum("kd,kd->k", vectors, vectors)
    a = Estimate(float(np.mean(forms)), _estimates.standard_error(forms), forms.tolist())
    total = float(np.sum(norms))
    if total == 0.0:
        return a, Estimate(None, None, [])
    ratio = float(np.sum(forms)) / total
    # Delta method for a ratio of means: Var(q̄/n̄) ≈ Var(q − R·n) / (S·n̄²).
    error = float(np.std(forms - ratio * norms, ddof=1) / (math.sqrt(count) * np.mean(norms))) if count > 1 else None
    # a zero vector's own ratio is undefined (None), as the whole one is when every vector is zero
    per_vector = [form / norm if norm else None for form, norm in zip(forms.tolist(), norms.tolist())]
    return a, Estimate(ratio, error, per_vector)


def noise_alignment(hvp: Hvp, mean_gradient: np.ndarray, gradients: np.ndarray) -> NoiseAlignment:
    """A and A_norm of the gradient noise v_k = g_k − ḡ (negative curvature kept; A_norm is
    None when the total noise is zero)."""
    _estimates.check_hvp(hvp)
    gradients = _rows("gradients", gradients)
    mean_gradient = _estimates.finite(_estimates.host_values(mean_gradient, "mean_gradient"), "mean_gradient")
    if mean_gradient.shape != gradients.shape[1:]:
        raise ValueError(f"mean_gradient has shape {mean_gradient.shape}; the gradients need {gradients.shape[1:]}")
    noise = gradients - mean_gradient
    a, a_norm = _alignment(hvp, noise)
    return NoiseAlignment(a, a_norm, gradients.shape[0])


def isotropic_reference(
    hvp: Hvp,
    dim: int,
    vectors: int = 64,
    seed: int = 0,
    batch: Optional[int] = None,
    support: Optional[np.ndarray] = None,
) -> Estimate:
    """(1/(D·R)) Σ r_kᵀ H r_k over R Rademacher vectors (Hutchinson's trace estimator / D).

    ``support`` lists the positions of the D unique parameters when the vectors ``hvp`` takes
    are longer (an arena row with padding): the probes are ±1 there and 0 elsewhere.
    ``hvp`` gets the probes ``batch`` at a time: by default 64, or fewer where 64 float64
    probes of length ``dim`` would pass 256 MiB (a 10M-parameter model: 3 at a time instead
    of 5 GiB). The probes do not depend on ``batch``.
    """
    _estimates.check_hvp(hvp)
    checks.counts(dim=(dim, 1), vectors=(vectors, 1))
    if batch is None:
        batch = min(64, max(1, PROBE_BYTES // (8 * dim)))
    checks.counts(batch=(batch, 1))
    rng = np.random.default_rng(seed)
    support = _estimates.support(dim, support)
    unique = len(support)
    batches = []
    for start in range(0, vectors, batch):
        probes = np.zeros((min(batch, vectors - start), dim))
        probes[:, support] = _estimates.rademacher(rng, probes.shape[0], unique)
        batches.append(_quadratic_forms(hvp, probes) / unique)
    values = np.concatenate(batches)
    return Estimate(float(np.mean(values)), _estimates.standard_error(values), values.tolist())


def anisotropy(alignment: Estimate, reference: Estimate) -> Estimate:
    """κ = A_norm / isotropic reference, with the first-order error of a ratio."""
    for name, estimate in (("alignment", alignment), ("reference", reference)):
        if not isinstance(estimate, Estimate):
            raise TypeError(
                f"{name} must be an Estimate (noise_alignment(...).a_norm, isotropic_reference(...)); got {estimate!r}"
            )
    if alignment.value is None or reference.value in (None, 0.0):
        return Estimate(None, None)
    kappa = alignment.value / reference.value
    relative = [
        (e / v) ** 2
        for e, v in ((alignment.standard_error, alignment.value), (reference.standard_error, reference.value))
        if e is not None and v != 0.0
    ]
    return Estimate(kappa, abs(kappa) * math.sqrt(sum(relative)) if relative else None)


def consensus_alignment(hvp_at_mean: Hvp, params: np.ndarray) -> ConsensusAlignment:
    """The alignment estimators on the consensus errors e_i = x_i − x̄ (H taken at x̄)."""
    from steadystep.decentral import consensus_errors

    _estimates.check_hvp(hvp_at_mean, "hvp_at_mean")
    errors = _estimates.finite(
        _estimates.host_values(consensus_errors(params), "params"), "params"
    )  # N ≥ 1 rows, or refused there
    a, a_norm = _alignment(hvp_at_mean, errors)
    norms = np.linalg.norm(errors, axis=1)
    return ConsensusAlignment(a, a_norm, float(np.mean(norms)), float(np.mean(norms**2)))
