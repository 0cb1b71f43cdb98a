"""Training-loop guards: dynamic loss scaling, finiteness checks, gradient accumulation,
warmup and cosine schedules, EMA, overflow-skip counting, loss-spike detection and a
Chinchilla step budget.

>>> from steadystep import training_stability
>>> training_stability.loss_scale_adjust(65536.0, 1.0, 2.0, 2.0, 2000.0, 0.0)
32768.0
"""

from steadystep.kernels import training_stability as _formulas
from steadystep.registry import elementwise

loss_scale_adjust = elementwise(_formulas.loss_scale_adjust)
is_finite_check = elementwise(_formulas.is_finite_check)
grad_norm_finite = elementwise(_formulas.grad_norm_finite)
gradient_accumulation_step = elementwise(_formulas.gradient_accumulation_step)
linear_warmup_lr = elementwise(_formulas.linear_warmup_lr)
warmup_cosine_lr = elementwise(_formulas.warmup_cosine_lr)
ema_update = elementwise(_formulas.ema_update)
overflow_skip_step = elementwise(_formulas.overflow_skip_step)
loss_spike_detector = elementwise(_formulas.loss_spike_detector)
chinchilla_step_count = elementwise(_formulas.chinchilla_step_count)

__all__ = [
    "loss_scale_adjust",
    "is_finite_check",
    "grad_norm_finite",
    "gradient_accumulation_step",
    "linear_warmup_lr",
    "warmup_cosine_lr",
    "ema_update",
    "overflow_skip_step",
    "loss_spike_detector",
    "chinchilla_step_count",
]
