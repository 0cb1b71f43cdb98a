"""The curvature of a loss, from its Hessian-vector products: top eigenpairs, trace, spectral density.

Each function takes an H·v source as [`steadystep.diagnostics`][steadystep.diagnostics] does — a function from a
[K, D] batch of vectors to H·v for each row: ``diagnostics.matrix_hvp``, ``model_hvp``,
``finite_difference_hvp``, ``callable_hvp``,
[`steadystep.torch.curvature.ModuleHessian`][steadystep.torch.curvature.ModuleHessian],
or one of your own — and the length D of its vectors. ``support`` lists the positions of the
unique parameters when the vectors are longer (an arena row with padding): the analysis then
runs on those n coordinates, and every vector is zero elsewhere. Each call asks ``hvp`` for as
many products as the method allows at once (``batch`` at most: by default 64, or fewer where
64 float64 vectors of length D would pass 256 MiB), since one batched H·v costs far less than
as many separate ones. Products that are not finite raise ``FloatingPointError``.

>>> import numpy as np
>>> from steadystep import curvature, diagnostics
>>> hvp = diagnostics.matrix_hvp(np.diag([4.0, 2.0, 1.0, -3.0]))
>>> pairs = curvature.top_eigenpairs(hvp, dim=4, k=2)
>>> tuple(round(value, 12) for value in pairs.values)
(4.0, 2.0)
>>> curvature.hessian_trace(hvp, dim=4).trace.value  # ±1 probes are exact for a diagonal H
4.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import numpy as np

from steadystep import _estimates, checks
from steadystep.diagnostics import PROBE_BYTES, Estimate, Hvp

__all__ = [
    "Eigenpairs",
    "SpectralDensity",
    "TraceEstimate",
    "hessian_trace",
    "spectral_density",
    "top_eigenpairs",
]

_EPSILON = float(np.finfo(np.float64).eps)
_SMALLEST_WIDTH = math.sqrt(np.finfo(np.float64).tiny)  # 1/σ and the density stay finite
_DEPENDENT = 1e-10  # a new direction this small, relative to its image, lies in the span so far


class _Operator:
    """``hvp`` on the support's n coordinates: [K, n] float64 to [K, n], at most ``batch``
    vectors per call, counting the calls and the products."""

    def __init__(self, hvp: Hvp, dim: int, support: Optional[np.ndarray], batch: Optional[int]):
        _estimates.check_hvp(hvp)
        checks.counts(dim=(dim, 1))
        self.hvp, self.dim = hvp, dim
        self.everything = support is None
        self.support = _estimates.support(dim, support)
        self.size = len(self.support)
        if batch is None:
            batch = min(64, max(1, PROBE_BYTES // (8 * dim)))
        checks.counts(batch=(batch, 1))
        self.batch = batch
        self.calls = self.products = 0

    def __call__(self, vectors: np.ndarray) -> np.ndarray:
        images = np.empty_like(vectors)
        for start in range(0, len(vectors), self.batch):
            chunk = vectors[start : start + self.batch]
            images[start : start + len(chunk)] = self.restrict(_estimates.products(self.hvp, self.embed(chunk)))
            self.calls += 1
            self.products += len(chunk)
        return images

    def embed(self, vectors: np.ndarray) -> np.ndarray:
        """Rows of n coordinates as rows of length D, zero outside the support."""
        if self.everything:
            return np.ascontiguousarray(vectors)
        full = np.zeros((len(vectors), self.dim))
        full[:, self.support] = vectors
        return full

    def restrict(self, vectors: np.ndarray) -> np.ndarray:
        return vectors if self.everything else vectors[:, self.support]


def _norms(vectors: np.ndarray, axis: int) -> np.ndarray:
    """Euclidean norms along ``axis``, scaled first: squares of 1e-170 or 1e170 would under- or
    overflow (NumPy's norm does not scale)."""
    largest = np.max(np.abs(vectors), axis=axis, keepdims=True, initial=0.0)
    safe = np.where(largest > 0.0, largest, 1.0)
    return np.squeeze(safe, axis) * np.sqrt(np.sum((vectors / safe) ** 2, axis=axis))


def _choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(repr(o) for o in options)}; got {value!r}")
    return str(value)


# -- results ---------------------------------------------------------------------------------------


@dataclass(repr=False)
class Eigenpairs(_estimates.Report):
    """Eigenvalues θ_i, unit eigenvectors y_i ([k, D] rows, zero outside the support) and
    bounds r_i ≥ ‖H y_i − θ_i y_i‖. Each interval [θ_i − r_i, θ_i + r_i] holds an eigenvalue of H
    (Krylov–Weinstein), and sin∠(y_i, the true eigenvector) ≤ r_i / gap_i, the gap to the rest
    of the spectrum. The bounds hold for the H·v given; ``vectors`` stay out of JSON."""

    values: list[float]
    residual_norms: list[float]
    vectors: np.ndarray
    method: str
    converged: bool
    products: int
    calls: int

    _arrays: ClassVar[tuple[str, ...]] = ("vectors",)


@dataclass(repr=False)
class TraceEstimate(_estimates.Report):
    """tr(H) ± its standard error; ``trace.samples`` are the probes' quadratic forms (for Hutch++,
    of the deflated probes, to which the sketch's exact part ``sketch_trace`` is added)."""

    trace: Estimate
    method: str
    probes: int
    products: int
    converged: bool
    sketch_trace: Optional[float]


@dataclass(repr=False)
class SpectralDensity(_estimates.Report):
    """The eigenvalue density φ(t) ≈ (1/n) Σ_i δ(t − λ_i) broadened by a Gaussian of width
    ``sigma``, on ``grid``; ``nodes[p]`` and ``weights[p]`` are probe p's Gauss quadrature
    (Ritz values and the squared first components of their vectors, summing to 1)."""

    grid: list[float]
    density: list[float]
    nodes: list[list[float]]
    weights: list[list[float]]
    sigma: float
    steps: int
    products: int

    def moment(self, order: int) -> Estimate:
        """(1/n)·tr(H^order) estimated from the quadrature, with its standard error over the
        probes: each probe v gives vᵀH^order v / ‖v‖² exactly while order < 2·(its nodes)."""
        checks.counts(order=(order, 0))
        values = [
            float(np.dot(weights, np.asarray(nodes) ** order)) for nodes, weights in zip(self.nodes, self.weights)
        ]
        return Estimate(float(np.mean(values)), _estimates.standard_error(values), [*values])


# -- top eigenpairs ----------------------------------------------------------------------------------


def top_eigenpairs(
    hvp: Hvp,
    dim: int,
    k: int = 1,
    *,
    method: str = "lanczos",
    which: Optional[str] = None,
    tolerance: float = 1e-6,
    max_steps: Optional[int] = None,
    block: Optional[int] = None,
    seed: int = 0,
    support: Optional[np.ndarray] = None,
    batch: Optional[int] = None,
) -> Eigenpairs:
    """The k extreme eigenvalues of H and their eigenvectors.

    ``method="lanczos"`` (default): block Lanczos with full reorthogonalisation. From a random
    block V₀ of ``block`` orthonormal vectors (default k), each step makes one batched call
    W_j = H·V_j, orthogonalises W_j against every vector so far (twice, so orthogonality holds
    to rounding) into the next block, and takes the Ritz pairs of T = Qᵀ(HQ) over the basis Q:
    θ_i, y_i = Q s_i. The stored products make each residual ‖(HQ)s_i − θ_i y_i‖ exact without
    another call. It stops when every wanted residual is ≤ ``tolerance``·max|θ| (eigenvalue
    errors are then about residual²/gap), after ``max_steps`` steps, or when the basis spans
    all n coordinates (exact). As ARPACK (SciPy's ``eigsh``) does, it trusts the residuals only
    once the basis holds max(2k + 1, 20) vectors: a space barely wider than k can hold an inner
    member of a cluster with a small residual before it resolves the cluster's top.

    ``method="power"``: PyHessian's power iteration with deflation, on ``block`` ≥ k vectors at
    once (subspace iteration: V ← orth(H·V) with Rayleigh–Ritz each step): it finds the
    eigenvalues largest in magnitude, converging as |λ_{block+1}/λ_i| per step, and needs many
    more products.

    Memory: Lanczos keeps its basis and the products, 2·(steps·block)·n float64 values; power
    iteration 2·block·n.

    Like every Krylov method, Lanczos holds at most ``block`` copies of a repeated eigenvalue
    (and of a cluster closer than its resolution) and may report the next eigenvalue for a copy
    it missed: the default block (k) holds every copy among the top k.

    ``which`` picks "largest" (algebraic: Lanczos's default, the sharpest directions), "smallest"
    (the most negative curvature) or "magnitude" (power iteration's, and its only choice).
    Values come in that order.
    """
    op = _Operator(hvp, dim, support, batch)
    method = _choice("method", method, ("lanczos", "power"))
    which = _choice(
        "which", which or ("largest" if method == "lanczos" else "magnitude"), ("largest", "smallest", "magnitude")
    )
    if method == "power" and which != "magnitude":
        raise ValueError(
            f"power iteration finds the eigenvalues largest in magnitude; pass which='magnitude', or "
            f"method='lanczos' for which={which!r}"
        )
    checks.count("k", k, 1, op.size, f" (the {op.size} coordinates of the Hessian)")
    tolerance = checks.in_range("tolerance", tolerance, 0.0)
    if block is None:
        block = min(k, op.batch)
    block = min(checks.count("block", block, 1), op.size)
    if max_steps is None:
        max_steps = -(-op.size // block) if method == "lanczos" else 1000
    checks.counts(max_steps=(max_steps, 1))
    rng = np.random.default_rng(seed)
    run = _block_lanczos if method == "lanczos" else _subspace_iteration
    values, vectors, residuals, converged = run(op, k, which, tolerance, max_steps, block, rng)
    full = np.zeros((k, dim))
    full[:, op.support] = vectors.T
    return Eigenpairs(values.tolist(), residuals.tolist(), full, method, converged, op.products, op.calls)


def _ritz(
    basis: np.ndarray, images: np.ndarray, k: int, which: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The wanted Ritz values, vectors ([n, k]) and residual bounds of H on span(basis), given
    images = H·basis, and the largest |θ| (H's scale)."""
    projected = basis.T @ images
    theta, coefficients = np.linalg.eigh((projected + projected.T) / 2)
    if which == "largest":
        order = np.argsort(theta)[::-1]
    elif which == "smallest":
        order = np.argsort(theta)
    else:
        order = np.argsort(-np.abs(theta), kind="stable")
    wanted = order[:k]
    scale = float(np.max(np.abs(theta)))
    vectors = basis @ coefficients[:, wanted]
    residuals = _norms(images @ coefficients[:, wanted] - vectors * theta[wanted], axis=0)
    # the rounding of the projection and of the stored products' combinations
    residuals += basis.shape[1] * _EPSILON * scale
    return theta[wanted], vectors, residuals, scale


def _block_lanczos(
    op: _Operator, k: int, which: str, tolerance: float, max_steps: int, block: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    size = op.size
    basis = np.empty((size, 0))
    images = np.empty((size, 0))
    new = _orthonormal(rng.standard_normal((size, block)), basis, rng)
    for step in range(1, max_steps + 1):
        new_images = op(np.ascontiguousarray(new.T)).T
        basis, images = np.hstack([basis, new]), np.hstack([images, new_images])
        if basis.shape[1] >= k:
            values, vectors, residuals, scale = _ritz(basis, images, k, which)
            trusted = basis.shape[1] >= min(size, max(2 * k + 1, 20))
            converged = (trusted and bool(np.all(residuals <= tolerance * scale))) or basis.shape[1] == size
            if converged or step == max_steps:
                return values, vectors, residuals, converged
        candidates = new_images[:, : min(block, size - basis.shape[1])]
        new = _orthonormal(candidates, basis, rng)
    raise AssertionError("unreachable: the last step returns")


def _subspace_iteration(
    op: _Operator, k: int, which: str, tolerance: float, max_steps: int, block: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    basis = _orthonormal(rng.standard_normal((op.size, max(block, k))), np.empty((op.size, 0)), rng)
    for step in range(1, max_steps + 1):
        images = op(np.ascontiguousarray(basis.T)).T
        values, vectors, residuals, scale = _ritz(basis, images, k, which)
        converged = bool(np.all(residuals <= tolerance * scale))
        if converged or step == max_steps:
            return values, vectors, residuals, converged
        basis = _orthonormal(images, np.empty((op.size, 0)), rng)  # span(H·V): the next power
    raise AssertionError("unreachable")


def _orthonormal(candidates: np.ndarray, basis: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Orthonormal columns spanning ``candidates`` minus their part in span(basis), twice
    orthogonalised; a column (nearly) in the span so far is replaced by a random direction,
    so the space keeps growing past an invariant subspace."""
    scale = max(float(np.max(_norms(candidates, axis=0), initial=0.0)), np.finfo(np.float64).tiny)
    for _ in range(4):
        for _ in range(2):
            candidates = candidates - basis @ (basis.T @ candidates)
        columns, triangle = np.linalg.qr(candidates)
        for _ in range(2):
            columns = columns - basis @ (basis.T @ columns)
        columns, _ = np.linalg.qr(columns)
        weak = np.abs(np.diag(triangle)) <= _DEPENDENT * scale
        if not weak.any():
            return columns
        candidates = np.where(weak, rng.standard_normal(candidates.shape), columns)
        scale = 1.0
    raise FloatingPointError("could not extend the basis with new orthogonal directions")


# -- trace ---------------------------------------------------------------------------------------------


def hessian_trace(
    hvp: Hvp,
    dim: int,
    *,
    tolerance: float = 1e-2,
    method: str = "hutchinson",
    min_probes: int = 16,
    max_probes: int = 1024,
    sketch: Optional[int] = None,
    seed: int = 0,
    support: Optional[np.ndarray] = None,
    batch: Optional[int] = None,
) -> TraceEstimate:
    """tr(H) with its standard error, stopping when that error is ≤ ``tolerance``·|estimate|.

    Hutchinson: tr(H) = E[rᵀHr] for Rademacher r (±1 entries), estimated by the mean of the
    probes' rᵀHr with standard error s/√R (s their standard deviation). Probes go to ``hvp``
    in batches; after each, once ``min_probes`` are in, the estimate stops at the
    requested relative error, or at ``max_probes`` (``converged`` False). Batches grow from
    ``min_probes`` by doubling (at most ``batch``), so a stop overshoots by at most twofold.

    ``method="hutch++"`` (Meyer, Musco, Musco & Woodruff, 2021): a sketch Q = orth(H·S) of
    ``sketch`` random ±1 vectors S (default min(n, 32); 2·sketch products) takes the top of
    the spectrum exactly, tr(QᵀHQ), and Hutchinson estimates the rest from deflated probes
    r' = (I − QQᵀ)r: tr(H) = tr(QᵀHQ) + E[r'ᵀHr']. For a spectrum dominated by a few large
    eigenvalues the variance falls from 2‖H‖_F² to twice the tail's, so fewer products reach
    the same error.
    """
    op = _Operator(hvp, dim, support, batch)
    method = _choice("method", method, ("hutchinson", "hutch++"))
    tolerance = checks.in_range("tolerance", tolerance, 0.0)
    checks.counts(min_probes=(min_probes, 2))
    checks.count("max_probes", max_probes, min_probes, why=" (min_probes)")
    rng = np.random.default_rng(seed)
    basis, exact = None, None
    if method == "hutch++":
        sketch = min(op.size, 32) if sketch is None else checks.count("sketch", sketch, 1, op.size)
        basis = np.linalg.qr(op(_estimates.rademacher(rng, sketch, op.size)).T)[0]
        exact = float(np.trace(basis.T @ op(np.ascontiguousarray(basis.T)).T))
    elif sketch is not None:
        raise ValueError("sketch is Hutch++'s; pass method='hutch++' with it")
    samples: list[float] = []
    converged = False
    while len(samples) < max_probes:
        # min_probes first, then doubling: a stop overshoots the probes it needed at most twofold
        count = min(op.batch, max_probes - len(samples), max(min_probes - len(samples), len(samples)))
        probes = _estimates.rademacher(rng, count, op.size)
        if basis is not None:
            probes -= (probes @ basis) @ basis.T
        samples.extend(np.einsum("kn,kn->k", probes, op(probes)).tolist())
        value, error = (exact or 0.0) + float(np.mean(samples)), _estimates.standard_error(samples)
        if len(samples) >= min_probes and error is not None and error <= tolerance * abs(value):
            converged = True
            break
    return TraceEstimate(Estimate(value, error, [*samples]), method, len(samples), op.products, converged, exact)


# -- spectral density ----------------------------------------------------------------------------------


def spectral_density(
    hvp: Hvp,
    dim: int,
    *,
    probes: int = 8,
    steps: int = 40,
    sigma: Optional[float] = None,
    points: int = 1000,
    seed: int = 0,
    support: Optional[np.ndarray] = None,
    batch: Optional[int] = None,
) -> SpectralDensity:
    """The eigenvalue density of H by stochastic Lanczos quadrature (SLQ), Gaussian-broadened.

    For each of ``probes`` Rademacher vectors v (normalised), ``steps`` Lanczos steps with full
    reorthogonalisation give a tridiagonal T = S diag(θ) Sᵀ, and the Gauss quadrature
    vᵀf(H)v ≈ Σ_j τ_j f(θ_j) with weights τ_j = S_{1j}² (exact for polynomials of degree
    < 2·steps). Averaged over the probes, since E[vᵀf(H)v] = tr f(H)/n:

        φ(t) = (1/P) Σ_p Σ_j τ_pj · exp(−(t − θ_pj)²/(2σ²)) / (σ√(2π)),

    on ``points`` grid values from the lowest node − 5σ to the highest + 5σ; φ integrates
    to 1 while the grid's step stays below σ. ``sigma`` defaults to 1% of the nodes' spread
    (at least 1e-4 of their magnitude). The probes run in lockstep: each step is one call over
    all of them. Memory: probes·steps·n float64 values.
    """
    op = _Operator(hvp, dim, support, batch)
    checks.counts(probes=(probes, 1), steps=(steps, 1), points=(points, 2))
    if sigma is not None:
        sigma = checks.in_range("sigma", sigma, 0.0, low_open=True)
    rng = np.random.default_rng(seed)
    starts = _estimates.rademacher(rng, probes, op.size) / math.sqrt(op.size)
    nodes, weights = _lanczos_quadrature(op, starts, min(steps, op.size))
    everything = np.concatenate(nodes)
    low, high = float(everything.min()), float(everything.max())
    if sigma is None:  # 1% of the spread, never below what float64 resolves around the nodes
        sigma = max(0.01 * (high - low), 1e-4 * max(abs(low), abs(high)), _SMALLEST_WIDTH) if high or low else 0.01
    grid = np.linspace(low - 5 * sigma, high + 5 * sigma, points)
    density = np.zeros(points)
    for probe_nodes, probe_weights in zip(nodes, weights):
        gaussians = np.exp(-0.5 * ((grid[:, None] - probe_nodes[None, :]) / sigma) ** 2)
        density += gaussians @ probe_weights
    density /= probes * sigma * math.sqrt(2 * math.pi)
    return SpectralDensity(
        grid.tolist(),
        density.tolist(),
        [n.tolist() for n in nodes],
        [w.tolist() for w in weights],
        float(sigma),
        max(len(n) for n in nodes),
        op.products,
    )


def _lanczos_quadrature(op: _Operator, starts: np.ndarray, steps: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each start vector's Lanczos tridiagonal (full reorthogonalisation), all advanced together,
    as Gauss quadrature nodes and weights. A probe whose Krylov space closes early (an
    invariant subspace: its quadrature is then exact) drops out of the later calls."""
    count, size = starts.shape
    basis = np.zeros((count, steps, size))
    alpha, beta = np.zeros((count, steps)), np.zeros((count, steps))
    lengths = np.full(count, steps)
    basis[:, 0] = starts
    active = np.arange(count)
    for step in range(steps):
        current = basis[active, step]
        images = op(current)
        alpha[active, step] = np.einsum("an,an->a", images, current)
        if step == steps - 1:
            break
        previous = basis[active, : step + 1]
        residual = images.copy()
        for _ in range(2):  # against every earlier vector, twice: full reorthogonalisation
            residual -= np.einsum("ajn,aj->an", previous, np.einsum("ajn,an->aj", previous, residual))
        norms = _norms(residual, axis=1)
        closed = norms <= _DEPENDENT * np.maximum(_norms(images, axis=1), np.finfo(np.float64).tiny)
        lengths[active[closed]] = step + 1
        active, norms, residual = active[~closed], norms[~closed], residual[~closed]
        beta[active, step] = norms
        basis[active, step + 1] = residual / norms[:, None]
        if not len(active):
            break
    nodes, weights = [], []
    for probe in range(count):
        length = lengths[probe]
        tridiagonal = np.diag(alpha[probe, :length])
        off = beta[probe, : length - 1]
        tridiagonal += np.diag(off, 1) + np.diag(off, -1)
        theta, vectors = np.linalg.eigh(tridiagonal)
        nodes.append(theta)
        weights.append(vectors[0] ** 2)
    return nodes, weights
