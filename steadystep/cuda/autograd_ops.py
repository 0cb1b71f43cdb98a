"""CUDA kernels generated from steadystep/kernels/autograd_ops.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

from numba import cuda
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cuda.primitives import ROW_THREADS, at, cast_like, math, put  # noqa: F401

# Numba's cache checks only this file: a change to the primitives these kernels inline must
# rewrite it, and test_codegen fails until codegen has
PRIMITIVES_DIGEST = "8081250d6df4c601"


@cuda.jit(device=True, inline="always")
def is_integer_f32(x):
    return x % float32(1.0) == float32(0.0)


@cuda.jit(device=True, inline="always")
def exp_f32(x):
    return math.exp(x)


@cuda.jit(device=True, inline="always")
def grad_add_f32(upstream):
    return upstream


@cuda.jit(cache=True)
def grad_add_f32_kernel(out, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_add_f32(at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_mul_f32(other, upstream):
    return other * upstream


@cuda.jit(cache=True)
def grad_mul_f32_kernel(out, other, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_mul_f32(at(other, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_exp_f32(x, upstream):
    return exp_f32(x) * upstream


@cuda.jit(cache=True)
def grad_exp_f32_kernel(out, x, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_exp_f32(at(x, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_log_f32(x, upstream):
    if x <= float32(0.0):
        return float32(0.0)
    return upstream / x


@cuda.jit(cache=True)
def grad_log_f32_kernel(out, x, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_log_f32(at(x, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_relu_f32(x, upstream):
    if x > float32(0.0):
        return upstream
    return float32(0.0)


@cuda.jit(cache=True)
def grad_relu_f32_kernel(out, x, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_relu_f32(at(x, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_sigmoid_f32(sigmoid_out, upstream):
    return sigmoid_out * (float32(1.0) - sigmoid_out) * upstream


@cuda.jit(cache=True)
def grad_sigmoid_f32_kernel(out, sigmoid_out, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_sigmoid_f32(at(sigmoid_out, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_tanh_f32(tanh_out, upstream):
    return (float32(1.0) - tanh_out * tanh_out) * upstream


@cuda.jit(cache=True)
def grad_tanh_f32_kernel(out, tanh_out, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_tanh_f32(at(tanh_out, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_pow_f32(x, n, upstream):
    if x == float32(0.0) and n < float32(1.0):
        return float32(0.0)
    if x < float32(0.0) and (not is_integer_f32(n)):
        return float32(0.0)
    return n * x ** (n - float32(1.0)) * upstream


@cuda.jit(cache=True)
def grad_pow_f32_kernel(out, x, n, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_pow_f32(at(x, i), at(n, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def chain_rule_f32(upstream, local_grad):
    return upstream * local_grad


@cuda.jit(cache=True)
def chain_rule_f32_kernel(out, upstream, local_grad):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = chain_rule_f32(at(upstream, i), at(local_grad, i))


@cuda.jit(device=True, inline="always")
def grad_softmax_diag_f32(softmax_i, upstream):
    return softmax_i * (float32(1.0) - softmax_i) * upstream


@cuda.jit(cache=True)
def grad_softmax_diag_f32_kernel(out, softmax_i, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_softmax_diag_f32(at(softmax_i, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def is_integer_f64(x):
    return x % float64(1.0) == float64(0.0)


@cuda.jit(device=True, inline="always")
def exp_f64(x):
    return math.exp(x)


@cuda.jit(device=True, inline="always")
def grad_add_f64(upstream):
    return upstream


@cuda.jit(cache=True)
def grad_add_f64_kernel(out, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_add_f64(at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_mul_f64(other, upstream):
    return other * upstream


@cuda.jit(cache=True)
def grad_mul_f64_kernel(out, other, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_mul_f64(at(other, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_exp_f64(x, upstream):
    return exp_f64(x) * upstream


@cuda.jit(cache=True)
def grad_exp_f64_kernel(out, x, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_exp_f64(at(x, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_log_f64(x, upstream):
    if x <= float64(0.0):
        return float64(0.0)
    return upstream / x


@cuda.jit(cache=True)
def grad_log_f64_kernel(out, x, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_log_f64(at(x, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_relu_f64(x, upstream):
    if x > float64(0.0):
        return upstream
    return float64(0.0)


@cuda.jit(cache=True)
def grad_relu_f64_kernel(out, x, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_relu_f64(at(x, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_sigmoid_f64(sigmoid_out, upstream):
    return sigmoid_out * (float64(1.0) - sigmoid_out) * upstream


@cuda.jit(cache=True)
def grad_sigmoid_f64_kernel(out, sigmoid_out, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_sigmoid_f64(at(sigmoid_out, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_tanh_f64(tanh_out, upstream):
    return (float64(1.0) - tanh_out * tanh_out) * upstream


@cuda.jit(cache=True)
def grad_tanh_f64_kernel(out, tanh_out, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_tanh_f64(at(tanh_out, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def grad_pow_f64(x, n, upstream):
    if x == float64(0.0) and n < float64(1.0):
        return float64(0.0)
    if x < float64(0.0) and (not is_integer_f64(n)):
        return float64(0.0)
    return n * x ** (n - float64(1.0)) * upstream


@cuda.jit(cache=True)
def grad_pow_f64_kernel(out, x, n, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_pow_f64(at(x, i), at(n, i), at(upstream, i))


@cuda.jit(device=True, inline="always")
def chain_rule_f64(upstream, local_grad):
    return upstream * local_grad


@cuda.jit(cache=True)
def chain_rule_f64_kernel(out, upstream, local_grad):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = chain_rule_f64(at(upstream, i), at(local_grad, i))


@cuda.jit(device=True, inline="always")
def grad_softmax_diag_f64(softmax_i, upstream):
    return softmax_i * (float64(1.0) - softmax_i) * upstream


@cuda.jit(cache=True)
def grad_softmax_diag_f64_kernel(out, softmax_i, upstream):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_softmax_diag_f64(at(softmax_i, i), at(upstream, i))
