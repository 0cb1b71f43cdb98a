"""Local gradients of elementary operations, each already multiplied by the upstream gradient."""

from steadystep.kernels._numerics import exp, is_integer


def grad_add(upstream):
    """Gradient through an addition.

    upstream
    """
    return upstream


def grad_mul(other, upstream):
    """Gradient through a product with respect to one factor.

    other·upstream
    """
    return other * upstream


def grad_exp(x, upstream):
    """Gradient through exp.

    exp(x)·upstream
    """
    return exp(x) * upstream


def grad_log(x, upstream):
    """Gradient through log; 0 outside the domain.

    upstream/x; 0 for x ≤ 0
    """
    if x <= 0.0:
        return 0.0
    return upstream / x


def grad_relu(x, upstream):
    """Gradient through ReLU.

    upstream if x > 0 else 0
    """
    if x > 0.0:
        return upstream
    return 0.0


def grad_sigmoid(sigmoid_out, upstream):
    """Gradient through sigmoid, from the forward output s.

    s(1−s)·upstream
    """
    return sigmoid_out * (1.0 - sigmoid_out) * upstream


def grad_tanh(tanh_out, upstream):
    """Gradient through tanh, from the forward output t.

    (1−t²)·upstream
    """
    return (1.0 - tanh_out * tanh_out) * upstream


def grad_pow(x, n, upstream):
    """Gradient of x**n with respect to x; exact for negative bases with integer n.

    n·x^(n−1)·upstream; 0 where no real derivative exists (x < 0 with non-integer n, x = 0 with n < 1)
    """
    if x == 0.0 and n < 1.0:
        return 0.0
    if x < 0.0 and not is_integer(n):
        return 0.0
    return n * x ** (n - 1.0) * upstream


def chain_rule(upstream, local_grad):
    """Chain rule for a bare local Jacobian element.

    upstream·local_grad
    """
    return upstream * local_grad


def grad_softmax_diag(softmax_i, upstream):
    """Diagonal of the softmax Jacobian, from the forward output.

    softmax_i(1−softmax_i)·upstream
    """
    return softmax_i * (1.0 - softmax_i) * upstream
