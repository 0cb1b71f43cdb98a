"""Worked examples: the seed document's, with its printed values, plus steadystep's own.

``python -m steadystep`` runs them all, and ``tests/test_examples.py`` requires each
result to equal ``expected`` to the last bit (CPU, float64). The seed's are written as it
writes them (a row function's row is the argument list itself); steadystep's own pass a row
as the one argument, the other form ``execute`` takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "EXAMPLES",
    "Example",
]


@dataclass(frozen=True)
class Example:
    module: str
    function: str
    args: list[Any]
    expected: Any
    note: str
    from_seed: bool = True


EXAMPLES = [
    Example(
        "autograd_graph",
        "gradient_norm_clip_scale",
        [8.0, 2.0],
        0.25,
        "norm 8 above max_norm 2: every gradient times 2/8",
    ),
    Example(
        "autograd_graph",
        "checkpointing_cost",
        [1e9, 1e11, 1e13, 1e10],
        0.09999999999999999,
        "recompute 0.01 s vs memory 0.1 s",
    ),
    Example(
        "autograd_graph",
        "memory_efficient_backward_step",
        [1e8, 4, 1e10],
        0.04,
        "4 segments of 1e8 bytes keep 4% resident",
    ),
    Example("autograd_ops", "grad_sigmoid", [0.5, 1.0], 0.25, "sigmoid's steepest slope, at s = 0.5"),
    Example("autograd_ops", "grad_pow", [2.0, 3.0, 1.0], 12.0, "d/dx x^3 at 2"),
    Example("autograd_ops", "grad_log", [0.5, 1.0], 2.0, "d/dx log x at 0.5"),
    Example("autograd_ops", "grad_pow", [0.0, 1.0, 1.0], 1.0, "x^1 at 0: the boundary n = 1"),
    Example(
        "autograd_ops",
        "grad_pow",
        [0.0, 2.0, 1.0],
        0.0,
        "exactly 0 (the seed's 1e-300 stand-in gave 2e-300)",
        from_seed=False,
    ),
    Example(
        "autograd_ops",
        "grad_pow",
        [-2.0, 3.0, 1.0],
        12.0,
        "negative base, integer n: exact (the seed returned 0)",
        from_seed=False,
    ),
    Example("autograd_ops", "grad_pow", [-2.0, 2.0, 1.0], -4.0, "d/dx x^2 at -2", from_seed=False),
    Example(
        "gradient_descent",
        "adam_update",
        [1.0, 0.2, 0.04, 0.1, 1e-8],
        0.9000000049999998,
        "1 - 0.1*0.2/(sqrt(0.04)+1e-8)",
    ),
    Example(
        "gradient_descent",
        "adagrad_update",
        [1.0, 0.5, 0.0, 0.1, 1e-8],
        0.900000002,
        "accumulator 0.25, sqrt 0.5 exactly",
    ),
    Example(
        "gradient_descent",
        "lars_update",
        [1.0, 0.5, 10.0, 2.0, 0.01, 0.001, 0.0001],
        0.9999750074962519,
        "trust ratio 0.0049975",
    ),
    Example(
        "gradient_descent",
        "lion_update",
        [1.0, 0.1, 0.5, 0.01, 0.9, 0.99, 0.01],
        0.9899,
        "sign(0.14) = +1: lr*(1 + wd*param)",
    ),
    Example(
        "training_stability",
        "loss_scale_adjust",
        [65536.0, 1.0, 2.0, 2.0, 2000.0, 0.0],
        32768.0,
        "overflow: the scale backs off",
    ),
    Example("training_stability", "loss_spike_detector", [8.0, 2.0, 4.0], 0.0, "8/2 = 4 is not above 4 (strict)"),
    Example("training_stability", "loss_spike_detector", [8.01, 2.0, 4.0], 1.0, "8.01/2 = 4.005 is a spike"),
    Example(
        "training_stability",
        "gradient_accumulation_step",
        [0.3, 0.8, 4.0],
        0.5,
        "fourth micro-batch folded in as 0.8/4",
    ),
    Example("numerical_stability", "logsumexp", [1000.0, 1000.0], 1000.6931471805599, "exp(1000) alone overflows"),
    Example("numerical_stability", "kahan_sum", [0.1] * 100_000, 10000.0, "a plain loop drifts to 10000.000000018848"),
    Example(
        "numerical_stability", "welford_mean_var", [1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 2.0], "population mean and variance"
    ),
    Example("numerical_stability", "sigmoid_stable", [-1000.0], 0.0, "never evaluates exp(1000)"),
    Example(
        "numerical_stability",
        "kahan_sum",
        [[1.0, 1e100, 1.0, -1e100]],
        2.0,
        "Neumaier keeps both ones",
        from_seed=False,
    ),
    Example(
        "numerical_stability",
        "welford_mean_var",
        [[1e9 + 4, 1e9 + 7, 1e9 + 13, 1e9 + 16]],
        [1e9 + 10, 22.5],
        "E[x²] − E[x]² gives −128",
        from_seed=False,
    ),
]
