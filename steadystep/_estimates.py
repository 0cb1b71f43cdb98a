"""What the curvature diagnostics share (steadystep.diagnostics, steadystep.curvature,
steadystep.torch.curvature): reading what an H·v source returns to the host, checked; the
Rademacher probes and the standard error of every estimate; the report base class (JSON, a
repr, an HTML table for Jupyter)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, ClassVar, Optional

import numpy as np

from steadystep import _html

__all__ = [
    "Report",
    "check_hvp",
    "finite",
    "host_values",
    "products",
    "rademacher",
    "standard_error",
    "support",
]

Hvp = Callable[[np.ndarray], np.ndarray]


def host_values(values: Any, name: str = "the Hessian-vector product") -> np.ndarray:
    """What a user's function returned (or what was passed as ``name``), as float64 NumPy:
    NumPy arrays and lists, torch tensors (on the GPU too, or requiring grad, as double
    backward leaves them), CuPy and Numba device arrays, JAX arrays."""
    if hasattr(values, "detach"):  # torch
        values = values.detach().cpu()
    elif hasattr(values, "copy_to_host"):  # Numba
        values = values.copy_to_host()
    elif hasattr(values, "get") and hasattr(values, "__cuda_array_interface__"):  # CuPy
        values = values.get()
    if values is None:
        raise TypeError(f"{name} is None; it must be an array of real numbers")
    values = np.asarray(values)
    if values.dtype.kind == "c":  # NumPy would drop the imaginary parts with a warning
        raise TypeError(f"{name} is complex ({values.dtype}); the diagnostics take real values")
    if values.dtype.kind not in "biuf":  # strings would be parsed as numbers, None would become NaN
        raise TypeError(f"{name} has dtype {values.dtype}; it must be an array of real numbers")
    return values.astype(np.float64, copy=False)


def finite(values: np.ndarray, name: str) -> np.ndarray:
    """``values`` if every one is finite, else a FloatingPointError naming them and the first
    row that is not (a NaN would make every estimate NaN ± NaN, which JSON shows as the
    undefined case, null)."""
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argwhere(bad)[0][0]) if values.ndim > 1 else None
        where = f" (row {row})" if row is not None else ""
        raise FloatingPointError(f"{name} holds non-finite values (NaN or inf){where}; the estimates need finite ones")
    return values


def check_hvp(hvp: Any, name: str = "hvp") -> None:
    if not callable(hvp):
        raise TypeError(
            f"{name} must be a function taking a [K, D] array of vectors to their Hessian-vector products "
            f"(diagnostics.matrix_hvp, model_hvp, or your own); got {hvp!r}"
        )


def products(hvp: Hvp, vectors: np.ndarray) -> np.ndarray:
    """H·v for each row of ``vectors`` ([K, D] float64), shape-checked and finite."""
    products = finite(host_values(hvp(vectors)), "the Hessian-vector product's result")
    # (D,) for a single vector is one product per vector too; (D, K), H·Vᵀ, has the right size but not the order
    if products.shape != vectors.shape and not (vectors.shape[0] == 1 and products.shape == vectors.shape[1:]):
        raise ValueError(
            f"the Hessian-vector product returned shape {products.shape} for {vectors.shape[0]} vectors of "
            f"length {vectors.shape[1]}; it must return one product per vector, shape {vectors.shape}"
        )
    return products.reshape(vectors.shape)


def standard_error(values: Any) -> Optional[float]:
    """The standard error of the mean of ``values`` (s/√n), None for fewer than two."""
    return float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None


def rademacher(rng: np.random.Generator, count: int, length: int) -> np.ndarray:
    """``count`` random ±1 vectors of ``length`` (float64), the probes of every trace estimate."""
    return rng.choice(np.array([-1.0, 1.0]), size=(count, length))


def support(dim: int, support: Optional[np.ndarray]) -> np.ndarray:
    """The positions of the unique parameters among ``dim`` (all of them when None), checked."""
    positions = np.arange(dim) if support is None else np.asarray(support)
    unique = len(positions)
    if (
        positions.ndim != 1
        or positions.dtype.kind not in "iu"
        or unique == 0
        or positions.min() < 0
        or positions.max() >= dim
        or len(np.unique(positions)) != unique
    ):
        raise ValueError(f"support must list distinct positions in [0, {dim}), at least one")
    return positions


@dataclass(repr=False)
class Report:
    """JSON (None → null), a readable repr and an HTML table for Jupyter."""

    _arrays: ClassVar[tuple[str, ...]] = ()  # array fields (eigenvectors), left out of JSON and the repr

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values. A number that is not finite (NaN or inf from a diverged
        H·v) becomes None like an undefined one: JSON has no NaN, and strict parsers refuse it."""
        return json_values(
            {
                name: asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
                for name, value in self._fields()
            }
        )

    def _fields(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self) if f.name not in self._arrays]

    def to_json(self, **options: Any) -> str:
        return json.dumps(self.to_dict(), **{"allow_nan": False, **options})

    def _rows(self) -> list[tuple[str, str]]:
        return [(name, repr(value)) for name, value in self._fields()]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{name}={text}" for name, text in self._rows()) + ")"

    def _repr_html_(self) -> str:
        return _html.table(type(self).__name__, self._rows())


def json_values(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: json_values(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_values(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
