"""CUDA kernels generated from steadystep/kernels/gradient_descent.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

from numba import cuda
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cuda.primitives import ROW_THREADS, at, cast_like, math, put, cospi_f32, cospi_f64  # noqa: F401

# Numba's cache checks only this file: a change to the primitives these kernels inline must
# rewrite it, and test_codegen fails until codegen has
PRIMITIVES_DIGEST = "8081250d6df4c601"


@cuda.jit(device=True, inline="always")
def sign_f32(x):
    if x > float32(0.0):
        return float32(1.0)
    if x < float32(0.0):
        return -float32(1.0)
    if x == float32(0.0):
        return float32(0.0)
    return x


@cuda.jit(device=True, inline="always")
def sgd_update_f32(param, grad, lr):
    return param - lr * grad


@cuda.jit(cache=True)
def sgd_update_f32_kernel(out, param, grad, lr):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = sgd_update_f32(at(param, i), at(grad, i), at(lr, i))


@cuda.jit(device=True, inline="always")
def sgd_momentum_update_f32(param, grad, velocity, lr, momentum):
    return param - lr * (momentum * velocity + grad)


@cuda.jit(cache=True)
def sgd_momentum_update_f32_kernel(out, param, grad, velocity, lr, momentum):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = sgd_momentum_update_f32(at(param, i), at(grad, i), at(velocity, i), at(lr, i), at(momentum, i))


@cuda.jit(device=True, inline="always")
def adam_update_f32(param, m_hat, v_hat, lr, eps):
    return param - lr * m_hat / (math.sqrt(v_hat) + eps)


@cuda.jit(cache=True)
def adam_update_f32_kernel(out, param, m_hat, v_hat, lr, eps):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = adam_update_f32(at(param, i), at(m_hat, i), at(v_hat, i), at(lr, i), at(eps, i))


@cuda.jit(device=True, inline="always")
def adamw_update_f32(param, m_hat, v_hat, lr, eps, weight_decay):
    return param * (float32(1.0) - lr * weight_decay) - lr * m_hat / (math.sqrt(v_hat) + eps)


@cuda.jit(cache=True)
def adamw_update_f32_kernel(out, param, m_hat, v_hat, lr, eps, weight_decay):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = adamw_update_f32(at(param, i), at(m_hat, i), at(v_hat, i), at(lr, i), at(eps, i), at(weight_decay, i))


@cuda.jit(device=True, inline="always")
def rmsprop_update_f32(param, grad, sq_avg, lr, alpha, eps):
    square_avg = alpha * sq_avg + (float32(1.0) - alpha) * grad * grad
    return param - lr * grad / (math.sqrt(square_avg) + eps)


@cuda.jit(cache=True)
def rmsprop_update_f32_kernel(out, param, grad, sq_avg, lr, alpha, eps):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = rmsprop_update_f32(at(param, i), at(grad, i), at(sq_avg, i), at(lr, i), at(alpha, i), at(eps, i))


@cuda.jit(device=True, inline="always")
def adagrad_update_f32(param, grad, accumulator, lr, eps):
    total = accumulator + grad * grad
    return param - lr * grad / (math.sqrt(total) + eps)


@cuda.jit(cache=True)
def adagrad_update_f32_kernel(out, param, grad, accumulator, lr, eps):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = adagrad_update_f32(at(param, i), at(grad, i), at(accumulator, i), at(lr, i), at(eps, i))


@cuda.jit(device=True, inline="always")
def lars_update_f32(param, grad, param_norm, grad_norm, lr, trust_coefficient, weight_decay):
    denominator = grad_norm + weight_decay * param_norm
    if denominator <= float32(0.0):
        return param
    local_lr = trust_coefficient * param_norm / denominator
    return param - lr * local_lr * (grad + weight_decay * param)


@cuda.jit(cache=True)
def lars_update_f32_kernel(out, param, grad, param_norm, grad_norm, lr, trust_coefficient, weight_decay):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = lars_update_f32(at(param, i), at(grad, i), at(param_norm, i), at(grad_norm, i), at(lr, i), at(trust_coefficient, i), at(weight_decay, i))


@cuda.jit(device=True, inline="always")
def lion_update_f32(param, momentum, grad, lr, beta1, beta2, weight_decay):
    direction = sign_f32(beta1 * momentum + (float32(1.0) - beta1) * grad)
    return param - lr * (direction + weight_decay * param)


@cuda.jit(cache=True)
def lion_update_f32_kernel(out, param, momentum, grad, lr, beta1, beta2, weight_decay):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = lion_update_f32(at(param, i), at(momentum, i), at(grad, i), at(lr, i), at(beta1, i), at(beta2, i), at(weight_decay, i))


@cuda.jit(device=True, inline="always")
def gradient_clipping_f32(grad, grad_norm, max_norm):
    if grad_norm > max_norm:
        return grad * max_norm / grad_norm
    return grad


@cuda.jit(cache=True)
def gradient_clipping_f32_kernel(out, grad, grad_norm, max_norm):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = gradient_clipping_f32(at(grad, i), at(grad_norm, i), at(max_norm, i))


@cuda.jit(device=True, inline="always")
def cosine_annealing_lr_f32(step, total_steps, base_lr, min_lr):
    if total_steps <= float32(0.0):
        return min_lr
    progress = min(step, total_steps) / total_steps
    return min_lr + (base_lr - min_lr) * ((float32(1.0) + cospi_f32(progress)) / float32(2.0))


@cuda.jit(cache=True)
def cosine_annealing_lr_f32_kernel(out, step, total_steps, base_lr, min_lr):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = cosine_annealing_lr_f32(at(step, i), at(total_steps, i), at(base_lr, i), at(min_lr, i))


@cuda.jit(device=True, inline="always")
def sign_f64(x):
    if x > float64(0.0):
        return float64(1.0)
    if x < float64(0.0):
        return -float64(1.0)
    if x == float64(0.0):
        return float64(0.0)
    return x


@cuda.jit(device=True, inline="always")
def sgd_update_f64(param, grad, lr):
    return param - lr * grad


@cuda.jit(cache=True)
def sgd_update_f64_kernel(out, param, grad, lr):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = sgd_update_f64(at(param, i), at(grad, i), at(lr, i))


@cuda.jit(device=True, inline="always")
def sgd_momentum_update_f64(param, grad, velocity, lr, momentum):
    return param - lr * (momentum * velocity + grad)


@cuda.jit(cache=True)
def sgd_momentum_update_f64_kernel(out, param, grad, velocity, lr, momentum):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = sgd_momentum_update_f64(at(param, i), at(grad, i), at(velocity, i), at(lr, i), at(momentum, i))


@cuda.jit(device=True, inline="always")
def adam_update_f64(param, m_hat, v_hat, lr, eps):
    return param - lr * m_hat / (math.sqrt(v_hat) + eps)


@cuda.jit(cache=True)
def adam_update_f64_kernel(out, param, m_hat, v_hat, lr, eps):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = adam_update_f64(at(param, i), at(m_hat, i), at(v_hat, i), at(lr, i), at(eps, i))


@cuda.jit(device=True, inline="always")
def adamw_update_f64(param, m_hat, v_hat, lr, eps, weight_decay):
    return param * (float64(1.0) - lr * weight_decay) - lr * m_hat / (math.sqrt(v_hat) + eps)


@cuda.jit(cache=True)
def adamw_update_f64_kernel(out, param, m_hat, v_hat, lr, eps, weight_decay):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = adamw_update_f64(at(param, i), at(m_hat, i), at(v_hat, i), at(lr, i), at(eps, i), at(weight_decay, i))


@cuda.jit(device=True, inline="always")
def rmsprop_update_f64(param, grad, sq_avg, lr, alpha, eps):
    square_avg = alpha * sq_avg + (float64(1.0) - alpha) * grad * grad
    return param - lr * grad / (math.sqrt(square_avg) + eps)


@cuda.jit(cache=True)
def rmsprop_update_f64_kernel(out, param, grad, sq_avg, lr, alpha, eps):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = rmsprop_update_f64(at(param, i), at(grad, i), at(sq_avg, i), at(lr, i), at(alpha, i), at(eps, i))


@cuda.jit(device=True, inline="always")
def adagrad_update_f64(param, grad, accumulator, lr, eps):
    total = accumulator + grad * grad
    return param - lr * grad / (math.sqrt(total) + eps)


@cuda.jit(cache=True)
def adagrad_update_f64_kernel(out, param, grad, accumulator, lr, eps):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = adagrad_update_f64(at(param, i), at(grad, i), at(accumulator, i), at(lr, i), at(eps, i))


@cuda.jit(device=True, inline="always")
def lars_update_f64(param, grad, param_norm, grad_norm, lr, trust_coefficient, weight_decay):
    denominator = grad_norm + weight_decay * param_norm
    if denominator <= float64(0.0):
        return param
    local_lr = trust_coefficient * param_norm / denominator
    return param - lr * local_lr * (grad + weight_decay * param)


@cuda.jit(cache=True)
def lars_update_f64_kernel(out, param, grad, param_norm, grad_norm, lr, trust_coefficient, weight_decay):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = lars_update_f64(at(param, i), at(grad, i), at(param_norm, i), at(grad_norm, i), at(lr, i), at(trust_coefficient, i), at(weight_decay, i))


@cuda.jit(device=True, inline="always")
def lion_update_f64(param, momentum, grad, lr, beta1, beta2, weight_decay):
    direction = sign_f64(beta1 * momentum + (float64(1.0) - beta1) * grad)
    return param - lr * (direction + weight_decay * param)


@cuda.jit(cache=True)
def lion_update_f64_kernel(out, param, momentum, grad, lr, beta1, beta2, weight_decay):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = lion_update_f64(at(param, i), at(momentum, i), at(grad, i), at(lr, i), at(beta1, i), at(beta2, i), at(weight_decay, i))


@cuda.jit(device=True, inline="always")
def gradient_clipping_f64(grad, grad_norm, max_norm):
    if grad_norm > max_norm:
        return grad * max_norm / grad_norm
    return grad


@cuda.jit(cache=True)
def gradient_clipping_f64_kernel(out, grad, grad_norm, max_norm):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = gradient_clipping_f64(at(grad, i), at(grad_norm, i), at(max_norm, i))


@cuda.jit(device=True, inline="always")
def cosine_annealing_lr_f64(step, total_steps, base_lr, min_lr):
    if total_steps <= float64(0.0):
        return min_lr
    progress = min(step, total_steps) / total_steps
    return min_lr + (base_lr - min_lr) * ((float64(1.0) + cospi_f64(progress)) / float64(2.0))


@cuda.jit(cache=True)
def cosine_annealing_lr_f64_kernel(out, step, total_steps, base_lr, min_lr):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = cosine_annealing_lr_f64(at(step, i), at(total_steps, i), at(base_lr, i), at(min_lr, i))
