"""Numerically safe building blocks. Row functions (logsumexp, softmax, log_softmax,
kahan_sum, welford_mean_var, normalize_probs) work along the last axis and batch over the
leading ones; the rest are elementwise.

>>> from steadystep import numerical_stability
>>> numerical_stability.logsumexp([1000.0, 1000.0])
1000.6931471805599
>>> numerical_stability.kahan_sum([1.0, 1e100, 1.0, -1e100])
2.0
"""

from steadystep.kernels import numerical_stability as _formulas
from steadystep.registry import elementwise, rowwise

sigmoid_stable = elementwise(_formulas.sigmoid_stable)
softplus = elementwise(_formulas.softplus)
log_sigmoid = elementwise(_formulas.log_sigmoid)
log_add_exp = elementwise(_formulas.log_add_exp)
relative_error = elementwise(_formulas.relative_error)
safe_divide = elementwise(_formulas.safe_divide)

logsumexp = rowwise(_formulas.LOGSUMEXP, "numerical_stability")
softmax = rowwise(_formulas.SOFTMAX, "numerical_stability")
log_softmax = rowwise(_formulas.LOG_SOFTMAX, "numerical_stability")
kahan_sum = rowwise(_formulas.KAHAN_SUM, "numerical_stability")
welford_mean_var = rowwise(_formulas.WELFORD_MEAN_VAR, "numerical_stability")
normalize_probs = rowwise(_formulas.NORMALIZE_PROBS, "numerical_stability")

__all__ = [
    "sigmoid_stable",
    "softplus",
    "log_sigmoid",
    "log_add_exp",
    "relative_error",
    "safe_divide",
    "logsumexp",
    "softmax",
    "log_softmax",
    "kahan_sum",
    "welford_mean_var",
    "normalize_probs",
]
