"""Per-element pieces of the decentralized AdamW step (SPEC §4) and the per-worker norm."""

from steadystep.kernels import Fold, Mixing, Row
from steadystep.kernels._numerics import neumaier_add
from steadystep.kernels.optim import adam_step


def worker_update(param, grad, exp_avg, exp_avg_sq, clip, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    """One worker's AdamW update of one element, on its clipped gradient: optim's adam_step,
    so N = 1 is bit for bit steadystep.optim.adamw.

    g̃ = g·clip; m ← m + (1 − β1)(g̃ − m); v ← β2·v + (1 − β2)·g̃²; x ← x·(1 − ηλ) − η·m̂/(√v̂ + ε)
    """
    return adam_step(param, grad * clip, exp_avg, exp_avg_sq, decay, 0.0, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, 0.0, step_size, inverse_bias_correction2_sqrt)


def _square_lift(x):
    return (x * x, 0.0)


def _square_merge(total_a, compensation_a, total_b, compensation_b):
    return neumaier_add(total_a, compensation_a, total_b, compensation_b)


def _square_finish(total, compensation, length):
    if abs(total) > 1e308 or total != total:
        return total
    return total + compensation


ROW_SUM_OF_SQUARES = Row(
    "row_sum_of_squares",
    "Σ x² along the last axis (a worker's squared gradient norm), compensated.",
    "Σ x²",
    (Fold(state=("total", "compensation"), identity=(0.0, 0.0), lift="_square_lift", merge="_square_merge"),),
    finish="_square_finish",
)
ROWS = (ROW_SUM_OF_SQUARES,)

# The mixing kernels: one launch updates every worker's moments and mixes parameters.
MIXINGS = (
    Mixing("peer", "worker_update"),  # x_i mixes with one peer per step: W_ii = a, W_i,peer = b
    Mixing("complete", "worker_update"),  # every x_i becomes (a·mean + b·x_i): the mean once per column
    Mixing("dense", "worker_update"),  # any row-stochastic W
)
