"""SPEC §1–§2 edge cases of the elementwise functions, one row per case, on each target."""

import math

import numpy as np
import pytest

import steadystep
from tests.helpers import assert_ulp_close

inf, nan = math.inf, math.nan
f32, f64 = np.float32, np.float64

CASES = [
    # (module, function, args, dtype, expected)
    ("numerical_stability", "sigmoid_stable", [-1000.0], f64, 0.0),
    ("numerical_stability", "sigmoid_stable", [1000.0], f64, 1.0),
    ("numerical_stability", "softplus", [20.0], f64, 20.000000002061153),  # the seed's ±20 cut-off was 2e-9 off
    ("numerical_stability", "softplus", [-800.0], f64, 0.0),
    ("numerical_stability", "softplus", [-inf], f64, 0.0),
    ("numerical_stability", "softplus", [inf], f64, inf),
    ("numerical_stability", "log_sigmoid", [-1000.0], f64, -1000.0),
    ("numerical_stability", "log_add_exp", [-inf, -inf], f64, -inf),
    ("numerical_stability", "log_add_exp", [inf, inf], f64, inf),
    ("numerical_stability", "log_add_exp", [inf, -inf], f64, inf),
    ("numerical_stability", "log_add_exp", [1000.0, 1000.0], f64, 1000.6931471805599),
    ("numerical_stability", "log_add_exp", [nan, 1.0], f64, nan),
    ("numerical_stability", "safe_divide", [1.0, 1e-301, 7.0], f64, 7.0),
    ("numerical_stability", "safe_divide", [1.0, 1e-40, 7.0], f32, 7.0),  # 1e-300 means float32's smallest normal
    ("numerical_stability", "safe_divide", [1.0, 2e-38, 7.0], f32, 5e37),
    ("numerical_stability", "relative_error", [3.0, 0.0], f64, 3.0),
    ("numerical_stability", "relative_error", [1.1, 1.0], f64, 0.10000000000000009),
    ("training_stability", "is_finite_check", [1e308], f64, 1.0),
    ("training_stability", "is_finite_check", [inf], f64, 0.0),
    ("training_stability", "is_finite_check", [nan], f64, 0.0),
    ("training_stability", "is_finite_check", [3e38], f32, 1.0),  # 1e308 means float32's largest
    ("training_stability", "is_finite_check", [inf], f32, 0.0),
    ("training_stability", "grad_norm_finite", [1e8], f64, 1.0),
    ("training_stability", "grad_norm_finite", [1.0000001e8], f64, 0.0),
    ("training_stability", "grad_norm_finite", [nan], f64, 0.0),
    ("training_stability", "loss_scale_adjust", [65536.0, 0.0, 2.0, 2.0, 2000.0, 1999.0], f64, 131072.0),
    ("training_stability", "loss_scale_adjust", [65536.0, 0.0, 2.0, 2.0, 2000.0, 1998.0], f64, 65536.0),
    ("training_stability", "loss_scale_adjust", [3e38, 0.0, 2.0, 2.0, 1.0, 0.0], f32, 3e38),  # growth would overflow
    ("training_stability", "loss_spike_detector", [inf, 1.0, 4.0], f64, 1.0),
    ("training_stability", "loss_spike_detector", [nan, 1.0, 4.0], f64, 1.0),
    ("training_stability", "loss_spike_detector", [5.0, 0.0, 4.0], f64, 0.0),
    # every documented boundary exactly at the boundary (a strict > made ≥ passed every other case)
    ("training_stability", "loss_spike_detector", [8.0, 2.0, 4.0], f64, 0.0),  # loss/avg = threshold: no spike
    ("training_stability", "loss_spike_detector", [8.000000000000002, 2.0, 4.0], f64, 1.0),  # one ulp above
    ("training_stability", "loss_spike_detector", [8.0, 2.0, 4.0], f32, 0.0),
    ("training_stability", "loss_spike_detector", [5.0, -1.0, 4.0], f64, 0.0),  # running_avg ≤ 0
    ("training_stability", "loss_spike_detector", [-inf, 1.0, 4.0], f64, 1.0),
    ("training_stability", "grad_norm_finite", [1.0000000000000002e8], f64, 0.0),
    ("training_stability", "overflow_skip_step", [7.0, 0.5], f64, 8.0),  # overflow > 0.5, strict
    ("training_stability", "overflow_skip_step", [7.0, 0.5000000000000001], f64, 7.0),
    ("training_stability", "linear_warmup_lr", [9.0, 10.0, 0.3], f64, 0.3),  # (step + 1)/warmup = 1
    (
        "gradient_descent",
        "gradient_clipping",
        [0.1, 3.0, 3.0],
        f64,
        0.1,
    ),  # grad_norm = max_norm: not scaled (0.1·3/3 ≠ 0.1)
    ("gradient_descent", "gradient_clipping", [0.1, 3.0000000000000004, 3.0], f64, 0.09999999999999999),
    ("training_stability", "linear_warmup_lr", [0.0, 10.0, 1.0], f64, 0.1),
    ("training_stability", "linear_warmup_lr", [20.0, 10.0, 1.0], f64, 1.0),
    ("training_stability", "linear_warmup_lr", [3.0, 0.0, 0.5], f64, 0.5),
    ("training_stability", "warmup_cosine_lr", [5.0, 10.0, 110.0, 1.0, 0.1], f64, 0.6),
    ("training_stability", "warmup_cosine_lr", [60.0, 10.0, 110.0, 1.0, 0.1], f64, 0.55),
    ("training_stability", "warmup_cosine_lr", [200.0, 10.0, 110.0, 1.0, 0.1], f64, 0.1),
    ("training_stability", "overflow_skip_step", [7.0, 1.0], f64, 7.0),
    ("training_stability", "overflow_skip_step", [7.0, 0.0], f64, 8.0),
    ("training_stability", "chinchilla_step_count", [1e9, 4e6], f64, 5000.0),
    ("training_stability", "chinchilla_step_count", [1e9, 3e6], f64, 6667.0),
    ("training_stability", "ema_update", [1.0, 0.0, 0.9], f64, 0.9),
    ("gradient_descent", "cosine_annealing_lr", [50.0, 100.0, 1.0, 0.0], f64, 0.5),
    ("gradient_descent", "cosine_annealing_lr", [150.0, 100.0, 1.0, 0.1], f64, 0.1),
    ("gradient_descent", "cosine_annealing_lr", [5.0, 0.0, 1.0, 0.1], f64, 0.1),
    ("gradient_descent", "lion_update", [1.0, 0.0, 0.0, 0.1, 0.9, 0.99, 0.5], f64, 0.95),  # sign(0) = 0: pure decay
    ("gradient_descent", "lars_update", [1.0, 0.5, 0.0, 0.0, 0.1, 0.001, 0.0], f64, 1.0),  # no trust ratio
    ("autograd_ops", "grad_pow", [-2.0, 0.5, 1.0], f64, 0.0),
    ("autograd_ops", "grad_pow", [0.0, 0.5, 1.0], f64, 0.0),
    ("autograd_ops", "grad_pow", [0.0, 1.0, 1.0], f64, 1.0),
    ("autograd_ops", "grad_log", [0.0, 1.0], f64, 0.0),
    ("autograd_graph", "checkpointing_cost", [0.0, 1.0, 1.0, 1.0], f64, inf),
    ("autograd_graph", "unscale_grad", [3.0, 0.0], f64, 3.0),
    ("autograd_graph", "is_dead_node", [0.0, 0.0], f64, 1.0),
    ("autograd_graph", "is_dead_node", [0.0, 1.0], f64, 0.0),
]


@pytest.mark.parametrize("module, function, args, dtype, expected", CASES, ids=lambda v: str(v)[:24])
def test_edge_case(module, function, args, dtype, expected, target):
    arrays = [np.array([value], dtype=dtype) for value in args]
    result = getattr(getattr(steadystep, module), function)(*arrays, target=target)
    assert result.dtype == dtype
    assert_ulp_close(result, np.array([expected], dtype=dtype), 1, context=f"{function}{tuple(args)}")
