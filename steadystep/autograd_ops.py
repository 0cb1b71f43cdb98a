"""Local gradients of elementary operations, each already multiplied by ``upstream``.

>>> from steadystep import autograd_ops
>>> autograd_ops.grad_pow(-2.0, 3.0, 1.0)   # exact for negative bases with integer n
12.0
"""

from steadystep.kernels import autograd_ops as _formulas
from steadystep.registry import elementwise

grad_add = elementwise(_formulas.grad_add)
grad_mul = elementwise(_formulas.grad_mul)
grad_exp = elementwise(_formulas.grad_exp)
grad_log = elementwise(_formulas.grad_log)
grad_relu = elementwise(_formulas.grad_relu)
grad_sigmoid = elementwise(_formulas.grad_sigmoid)
grad_tanh = elementwise(_formulas.grad_tanh)
grad_pow = elementwise(_formulas.grad_pow)
chain_rule = elementwise(_formulas.chain_rule)
grad_softmax_diag = elementwise(_formulas.grad_softmax_diag)

__all__ = [
    "grad_add",
    "grad_mul",
    "grad_exp",
    "grad_log",
    "grad_relu",
    "grad_sigmoid",
    "grad_tanh",
    "grad_pow",
    "chain_rule",
    "grad_softmax_diag",
]
