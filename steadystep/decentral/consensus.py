"""How far the workers are from agreeing: the mean model x̄, each worker's error x_i − x̄, and
the consensus distance."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_workers", "consensus_distance", "consensus_errors", "mean_model"]

from steadystep import _arrays, dispatch


def mean_model(params: Any) -> np.ndarray:
    """x̄ = mean_i x_i (what packed validation evaluates), as a NumPy vector."""
    return _workers_rows(params).mean(axis=0)


def consensus_errors(params: Any) -> np.ndarray:
    """e_i = x_i − x̄ for every worker ([N, D] float64; exactly 0 for identical workers).

    x̄ is taken as x₀ + mean_i(x_i − x₀): for identical rows every difference is exactly 0, so
    x̄ is x₀ and each e_i is 0, where the sum-then-divide mean is not x₀ for N = 3, 5, 6, 7."""
    host = _workers_rows(params).astype(np.float64)
    first = host[:1]
    return (host - first) - (host - first).mean(axis=0)


def _workers_rows(params: Any) -> np.ndarray:
    operand = _arrays.classify("params", params)
    if operand.kind == "scalar" or operand.dtype is None or operand.dtype.kind not in "biuf":
        found = "a number" if operand.kind == "scalar" else f"dtype {operand.dtype}"
        raise TypeError(f"params must be an [N, D] array of real numbers (the workers' rows); got {found}")
    host = dispatch.host_array(params)
    check_workers(host.shape)  # a 1-D x would average its entries; no rows, to NaN
    return host


def check_workers(shape: tuple[int, ...]) -> None:
    """Refuse a shape that is not N ≥ 1 workers' rows (the optimizer's params and the metrics')."""
    if len(shape) != 2 or shape[0] == 0:
        raise ValueError(f"params must be an [N, D] array of N ≥ 1 workers' rows, got shape {shape}")


def consensus_distance(params: Any) -> float:
    """mean_i ‖x_i − x̄‖², in float64."""
    return float(np.mean(np.sum(consensus_errors(params) ** 2, axis=1)))
