"""Optimizer update rules for one parameter element; the caller owns every state buffer
(moments, velocities, step counts) and bias correction.

>>> from steadystep import gradient_descent
>>> gradient_descent.adam_update(1.0, 0.2, 0.04, 0.1, 1e-8)
0.9000000049999998
"""

from steadystep.kernels import gradient_descent as _formulas
from steadystep.registry import elementwise

sgd_update = elementwise(_formulas.sgd_update)
sgd_momentum_update = elementwise(_formulas.sgd_momentum_update)
adam_update = elementwise(_formulas.adam_update)
adamw_update = elementwise(_formulas.adamw_update)
rmsprop_update = elementwise(_formulas.rmsprop_update)
adagrad_update = elementwise(_formulas.adagrad_update)
lars_update = elementwise(_formulas.lars_update)
lion_update = elementwise(_formulas.lion_update)
gradient_clipping = elementwise(_formulas.gradient_clipping)
cosine_annealing_lr = elementwise(_formulas.cosine_annealing_lr)

__all__ = [
    "sgd_update",
    "sgd_momentum_update",
    "adam_update",
    "adamw_update",
    "rmsprop_update",
    "adagrad_update",
    "lars_update",
    "lion_update",
    "gradient_clipping",
    "cosine_annealing_lr",
]
