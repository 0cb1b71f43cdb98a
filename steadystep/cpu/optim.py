"""CPU kernels generated from steadystep/kernels/optim.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

import math  # noqa: F401  (formulas may call math functions)

import numpy as np  # noqa: F401
from numba import njit, prange  # noqa: F401
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cpu.primitives import LANES, at, cast_like, lane_chunks, put  # noqa: F401

# Numba's cache checks only this file: a change to the primitives these kernels inline must
# rewrite it, and test_codegen fails until codegen has
PRIMITIVES_DIGEST = "69fe65462d789b80"


@njit(error_model="numpy", cache=True, forceinline=True)
def sign_f32(x):
    if x > float32(0.0):
        return float32(1.0)
    if x < float32(0.0):
        return -float32(1.0)
    if x == float32(0.0):
        return float32(0.0)
    return x


@njit(error_model="numpy", cache=True, forceinline=True)
def is_finite_f32(x):
    return x == x and abs(x) <= float32(3.4028234663852886e+38)


@njit(error_model="numpy", cache=True, forceinline=True)
def floor_f32(x):
    if not is_finite_f32(x):
        return x
    return x - x % float32(1.0)


@njit(error_model="numpy", cache=True, forceinline=True)
def maximum_f32(x, y):
    if x > y or x != x:
        return x
    return y


@njit(error_model="numpy", cache=True, forceinline=True)
def lerp_f32(start, end, weight):
    if weight < float32(0.5):
        return start + weight * (end - start)
    return end - (end - start) * (float32(1.0) - weight)


@njit(error_model="numpy", cache=True, forceinline=True)
def grad_accumulate_f32(current_grad, incoming_grad):
    return current_grad + incoming_grad


@njit(error_model="numpy", cache=True, forceinline=True)
def ema_update_f32(ema, value, decay):
    return decay * ema + (float32(1.0) - decay) * value


@njit(error_model="numpy", cache=True, forceinline=True)
def _l2_gradient_f32(grad, param, weight_decay, gradient_sign):
    grad = grad * gradient_sign
    if weight_decay != float32(0.0):
        grad = grad + weight_decay * param
    return grad


@njit(error_model="numpy", cache=True, forceinline=True)
def sgd_step_f32(param, grad, momentum_buffer, decay, lr, momentum, dampening, weight_decay, nesterov, gradient_sign, first_step):
    direction = _l2_gradient_f32(grad, param, weight_decay * decay, gradient_sign)
    if momentum != float32(0.0):
        if first_step != float32(0.0):
            momentum_buffer = direction
        else:
            momentum_buffer = momentum_buffer * momentum + (float32(1.0) - dampening) * direction
        if nesterov != float32(0.0):
            direction = direction + momentum * momentum_buffer
        else:
            direction = momentum_buffer
    return (param - lr * direction, momentum_buffer)


@njit(error_model="numpy", cache=True, forceinline=True)
def adam_step_f32(param, grad, exp_avg, exp_avg_sq, decay, weight_decay, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    grad = _l2_gradient_f32(grad, param, weight_decay * decay, gradient_sign)
    exp_avg, exp_avg_sq = _adam_moments_f32(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    return (_adam_param_f32(param, exp_avg, exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq)


@njit(error_model="numpy", cache=True, forceinline=True)
def adam_amsgrad_step_f32(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, weight_decay, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    grad = _l2_gradient_f32(grad, param, weight_decay * decay, gradient_sign)
    exp_avg, exp_avg_sq = _adam_moments_f32(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    max_exp_avg_sq = maximum_f32(max_exp_avg_sq, exp_avg_sq)
    return (_adam_param_f32(param, exp_avg, max_exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq, max_exp_avg_sq)


@njit(error_model="numpy", cache=True, forceinline=True)
def adamw_step_f32(param, grad, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    param = _decoupled_decay_f32(param, decay, decoupled_factor)
    exp_avg, exp_avg_sq = _adam_moments_f32(grad * gradient_sign, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    return (_adam_param_f32(param, exp_avg, exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq)


@njit(error_model="numpy", cache=True, forceinline=True)
def adamw_amsgrad_step_f32(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    param = _decoupled_decay_f32(param, decay, decoupled_factor)
    exp_avg, exp_avg_sq = _adam_moments_f32(grad * gradient_sign, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    max_exp_avg_sq = maximum_f32(max_exp_avg_sq, exp_avg_sq)
    return (_adam_param_f32(param, exp_avg, max_exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq, max_exp_avg_sq)


@njit(error_model="numpy", cache=True, forceinline=True)
def adam_schedule_step_f32(step, step_size, inverse_bias_correction2_sqrt, lr, one_minus_beta1, one_minus_beta2):
    if not (step >= float32(0.0) and step < float32(math.inf) and (floor_f32(step) == step)):
        return (step, float32(math.nan), float32(math.nan))
    step = step + float32(1.0)
    bias_correction1 = -math.expm1(step * math.log1p(-one_minus_beta1))
    bias_correction2 = -math.expm1(step * math.log1p(-one_minus_beta2))
    return (step, lr / bias_correction1, float32(1.0) / math.sqrt(bias_correction2))


@njit(error_model="numpy", cache=True, forceinline=True)
def _decoupled_decay_f32(param, decay, decoupled_factor):
    factor = float32(1.0)
    if decay != float32(0.0):
        factor = decoupled_factor
    return param * factor


@njit(error_model="numpy", cache=True, forceinline=True)
def _adam_moments_f32(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2):
    return (lerp_f32(exp_avg, grad, one_minus_beta1), exp_avg_sq * beta2 + one_minus_beta2 * grad * grad)


@njit(error_model="numpy", cache=True, forceinline=True)
def _adam_param_f32(param, exp_avg, second_moment, eps, step_size, inverse_bias_correction2_sqrt):
    denominator = math.sqrt(second_moment) * inverse_bias_correction2_sqrt + eps
    return param + -step_size * exp_avg / denominator


@njit(error_model="numpy", cache=True, forceinline=True)
def rmsprop_step_f32(param, grad, square_avg, grad_avg, momentum_buffer, decay, lr, alpha, one_minus_alpha, eps, weight_decay, momentum, centered, gradient_sign):
    grad = _l2_gradient_f32(grad, param, weight_decay * decay, gradient_sign)
    square_avg = square_avg * alpha + one_minus_alpha * grad * grad
    variance = square_avg
    if centered != float32(0.0):
        grad_avg = lerp_f32(grad_avg, grad, one_minus_alpha)
        if square_avg < float32(math.inf) or not is_finite_f32(grad_avg):
            variance = square_avg + -float32(1.0) * grad_avg * grad_avg
    average = math.sqrt(variance) + eps
    if momentum > float32(0.0):
        momentum_buffer = momentum_buffer * momentum + grad / average
        return (param - lr * momentum_buffer, square_avg, grad_avg, momentum_buffer)
    return (param + -lr * grad / average, square_avg, grad_avg, momentum_buffer)


@njit(error_model="numpy", cache=True, forceinline=True)
def adagrad_step_f32(param, grad, state_sum, decay, clr, eps, weight_decay, gradient_sign):
    grad = _l2_gradient_f32(grad, param, weight_decay * decay, gradient_sign)
    state_sum = state_sum + grad * grad
    return (param + -clr * grad / (math.sqrt(state_sum) + eps), state_sum)


@njit(error_model="numpy", cache=True, forceinline=True)
def lars_trust_ratio_f32(param_sum_squares, grad_sum_squares, trust_coefficient, weight_decay, eps):
    param_norm = math.sqrt(param_sum_squares)
    return trust_coefficient * param_norm / (math.sqrt(grad_sum_squares) + weight_decay * param_norm + eps)


@njit(error_model="numpy", cache=True, parallel=True)
def lars_trust_ratio_f32_kernel(out, param_sum_squares, grad_sum_squares, trust_coefficient, weight_decay, eps):
    for i in prange(out.shape[0]):
        out[i] = lars_trust_ratio_f32(at(param_sum_squares, i), at(grad_sum_squares, i), at(trust_coefficient, i), at(weight_decay, i), at(eps, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def lars_step_f32(param, grad, momentum_buffer, trust_ratio, tensor_weight_decay, lr, momentum, gradient_sign):
    update = trust_ratio * _l2_gradient_f32(grad, param, tensor_weight_decay, gradient_sign)
    if momentum != float32(0.0):
        momentum_buffer = momentum * momentum_buffer + update
        update = momentum_buffer
    return (param - lr * update, momentum_buffer)


@njit(error_model="numpy", cache=True, forceinline=True)
def lion_step_f32(param, grad, exp_avg, decay, lr, beta1, one_minus_beta1, beta2, one_minus_beta2, weight_decay, gradient_sign):
    grad = grad * gradient_sign
    direction = sign_f32(beta1 * exp_avg + one_minus_beta1 * grad)
    param = param - lr * (direction + weight_decay * decay * param)
    return (param, beta2 * exp_avg + one_minus_beta2 * grad)


@njit(error_model="numpy", cache=True, forceinline=True)
def scaled_copy_step_f32(param, grad):
    return (grad,)


@njit(error_model="numpy", cache=True, forceinline=True)
def accumulate_step_f32(total, grad):
    return (grad_accumulate_f32(total, grad),)


@njit(error_model="numpy", cache=True, forceinline=True)
def ema_step_f32(ema, param, decay):
    return (ema_update_f32(ema, param, decay),)


@njit(error_model="numpy", cache=True, forceinline=True)
def loss_scale_step_f32(scale, growth_tracker, overflow, growth_factor, backoff_factor, growth_interval):
    if overflow != float32(0.0):
        return (scale * backoff_factor, float32(0.0))
    successful = growth_tracker + float32(1.0)
    if successful >= growth_interval:
        grown = scale * growth_factor
        if abs(grown) <= float32(3.4028234663852886e+38):
            scale = grown
        return (scale, float32(0.0))
    return (scale, successful)


@njit(error_model="numpy", cache=True, forceinline=True)
def clip_coefficient_f32(sum_of_squares, max_norm):
    coefficient = max_norm / (math.sqrt(sum_of_squares) + float32(9.999999974752427e-07))
    if coefficient >= float32(1.0):
        return float32(1.0)
    return coefficient


@njit(error_model="numpy", cache=True, parallel=True)
def clip_coefficient_f32_kernel(out, sum_of_squares, max_norm):
    for i in prange(out.shape[0]):
        out[i] = clip_coefficient_f32(at(sum_of_squares, i), at(max_norm, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def l2_norm_f32(sum_of_squares):
    return math.sqrt(sum_of_squares)


@njit(error_model="numpy", cache=True, parallel=True)
def l2_norm_f32_kernel(out, sum_of_squares):
    for i in prange(out.shape[0]):
        out[i] = l2_norm_f32(at(sum_of_squares, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def nonfinite_f32(x):
    if is_finite_f32(x):
        return float32(0.0)
    return float32(1.0)


@njit(error_model="numpy", cache=True, parallel=True)
def nonfinite_f32_kernel(out, x):
    for i in prange(out.shape[0]):
        out[i] = nonfinite_f32(at(x, i))


@njit(error_model="numpy", cache=True, parallel=True)
def sgd_f32_step(skip_step, grad_scale, param, grad, momentum_buffer, decay, lr, momentum, dampening, weight_decay, nesterov, gradient_sign, first_step):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    lr = cast_like(lr, param)
    momentum = cast_like(momentum, param)
    dampening = cast_like(dampening, param)
    weight_decay = cast_like(weight_decay, param)
    nesterov = cast_like(nesterov, param)
    gradient_sign = cast_like(gradient_sign, param)
    first_step = cast_like(first_step, param)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float32(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_momentum_buffer, = sgd_step_f32(at(param, i), at(grad, i) * grad_factor, at(momentum_buffer, i), at(decay, i), at(lr, i), at(momentum, i), at(dampening, i), at(weight_decay, i), at(nesterov, i), at(gradient_sign, i), at(first_step, i))
        put(param, i, new_param)
        put(momentum_buffer, i, new_momentum_buffer)


@njit(error_model="numpy", cache=True, parallel=True)
def adam_f32_step(skip_step, grad_scale, param, grad, exp_avg, exp_avg_sq, decay, weight_decay, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    weight_decay = cast_like(weight_decay, param)
    one_minus_beta1 = cast_like(one_minus_beta1, param)
    beta2 = cast_like(beta2, param)
    one_minus_beta2 = cast_like(one_minus_beta2, param)
    eps = cast_like(eps, param)
    gradient_sign = cast_like(gradient_sign, param)
    step_size = cast_like(at(step_size, 0), param)
    inverse_bias_correction2_sqrt = cast_like(at(inverse_bias_correction2_sqrt, 0), param)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float32(0.0):
        return
    if step_size - step_size != float32(0.0):
        return
    if inverse_bias_correction2_sqrt - inverse_bias_correction2_sqrt != float32(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_exp_avg, new_exp_avg_sq, = adam_step_f32(at(param, i), at(grad, i) * grad_factor, at(exp_avg, i), at(exp_avg_sq, i), at(decay, i), at(weight_decay, i), at(one_minus_beta1, i), at(beta2, i), at(one_minus_beta2, i), at(eps, i), at(gradient_sign, i), at(step_size, i), at(inverse_bias_correction2_sqrt, i))
        put(param, i, new_param)
        put(exp_avg, i, new_exp_avg)
        put(exp_avg_sq, i, new_exp_avg_sq)


@njit(error_model="numpy", cache=True, parallel=True)
def adamw_f32_step(skip_step, grad_scale, param, grad, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    decoupled_factor = cast_like(decoupled_factor, param)
    one_minus_beta1 = cast_like(one_minus_beta1, param)
    beta2 = cast_like(beta2, param)
    one_minus_beta2 = cast_like(one_minus_beta2, param)
    eps = cast_like(eps, param)
    gradient_sign = cast_like(gradient_sign, param)
    step_size = cast_like(at(step_size, 0), param)
    inverse_bias_correction2_sqrt = cast_like(at(inverse_bias_correction2_sqrt, 0), param)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float32(0.0):
        return
    if step_size - step_size != float32(0.0):
        return
    if inverse_bias_correction2_sqrt - inverse_bias_correction2_sqrt != float32(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_exp_avg, new_exp_avg_sq, = adamw_step_f32(at(param, i), at(grad, i) * grad_factor, at(exp_avg, i), at(exp_avg_sq, i), at(decay, i), at(decoupled_factor, i), at(one_minus_beta1, i), at(beta2, i), at(one_minus_beta2, i), at(eps, i), at(gradient_sign, i), at(step_size, i), at(inverse_bias_correction2_sqrt, i))
        put(param, i, new_param)
        put(exp_avg, i, new_exp_avg)
        put(exp_avg_sq, i, new_exp_avg_sq)


@njit(error_model="numpy", cache=True, parallel=True)
def adam_amsgrad_f32_step(skip_step, grad_scale, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, weight_decay, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    weight_decay = cast_like(weight_decay, param)
    one_minus_beta1 = cast_like(one_minus_beta1, param)
    beta2 = cast_like(beta2, param)
    one_minus_beta2 = cast_like(one_minus_beta2, param)
    eps = cast_like(eps, param)
    gradient_sign = cast_like(gradient_sign, param)
    step_size = cast_like(at(step_size, 0), param)
    inverse_bias_correction2_sqrt = cast_like(at(inverse_bias_correction2_sqrt, 0), param)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float32(0.0):
        return
    if step_size - step_size != float32(0.0):
        return
    if inverse_bias_correction2_sqrt - inverse_bias_correction2_sqrt != float32(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_exp_avg, new_exp_avg_sq, new_max_exp_avg_sq, = adam_amsgrad_step_f32(at(param, i), at(grad, i) * grad_factor, at(exp_avg, i), at(exp_avg_sq, i), at(max_exp_avg_sq, i), at(decay, i), at(weight_decay, i), at(one_minus_beta1, i), at(beta2, i), at(one_minus_beta2, i), at(eps, i), at(gradient_sign, i), at(step_size, i), at(inverse_bias_correction2_sqrt, i))
        put(param, i, new_param)
        put(exp_avg, i, new_exp_avg)
        put(exp_avg_sq, i, new_exp_avg_sq)
        put(max_exp_avg_sq, i, new_max_exp_avg_sq)


@njit(error_model="numpy", cache=True, parallel=True)
def adamw_amsgrad_f32_step(skip_step, grad_scale, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    decoupled_factor = cast_like(decoupled_factor, param)
    one_minus_beta1 = cast_like(one_minus_beta1, param)
    beta2 = cast_like(beta2, param)
    one_minus_beta2 = cast_like(one_minus_beta2, param)
    eps = cast_like(eps, param)
    gradient_sign = cast_like(gradient_sign, param)
    step_size = cast_like(at(step_size, 0), param)
    inverse_bias_correction2_sqrt = cast_like(at(inverse_bias_correction2_sqrt, 0), param)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float32(0.0):
        return
    if step_size - step_size != float32(0.0):
        return
    if inverse_bias_correction2_sqrt - inverse_bias_correction2_sqrt != float32(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_exp_avg, new_exp_avg_sq, new_max_exp_avg_sq, = adamw_amsgrad_step_f32(at(param, i), at(grad, i) * grad_factor, at(exp_avg, i), at(exp_avg_sq, i), at(max_exp_avg_sq, i), at(decay, i), at(decoupled_factor, i), at(one_minus_beta1, i), at(beta2, i), at(one_minus_beta2, i), at(eps, i), at(gradient_sign, i), at(step_size, i), at(inverse_bias_correction2_sqrt, i))
        put(param, i, new_param)
        put(exp_avg, i, new_exp_avg)
        put(exp_avg_sq, i, new_exp_avg_sq)
        put(max_exp_avg_sq, i, new_max_exp_avg_sq)


@njit(error_model="numpy", cache=True, parallel=True)
def adam_schedule_f32_step(skip_step, grad_scale, step, step_size, inverse_bias_correction2_sqrt, lr, one_minus_beta1, one_minus_beta2):
    skip_step = cast_like(skip_step, step)
    grad_scale = cast_like(grad_scale, step)
    lr = cast_like(lr, step)
    one_minus_beta1 = cast_like(one_minus_beta1, step)
    one_minus_beta2 = cast_like(one_minus_beta2, step)
    if at(skip_step, 0) != float32(0.0):
        return
    for i in prange(step.shape[0]):
        new_step, new_step_size, new_inverse_bias_correction2_sqrt, = adam_schedule_step_f32(at(step, i), at(step_size, i), at(inverse_bias_correction2_sqrt, i), at(lr, i), at(one_minus_beta1, i), at(one_minus_beta2, i))
        put(step, i, new_step)
        put(step_size, i, new_step_size)
        put(inverse_bias_correction2_sqrt, i, new_inverse_bias_correction2_sqrt)


@njit(error_model="numpy", cache=True, parallel=True)
def rmsprop_f32_step(skip_step, grad_scale, param, grad, square_avg, grad_avg, momentum_buffer, decay, lr, alpha, one_minus_alpha, eps, weight_decay, momentum, centered, gradient_sign):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    lr = cast_like(lr, param)
    alpha = cast_like(alpha, param)
    one_minus_alpha = cast_like(one_minus_alpha, param)
    eps = cast_like(eps, param)
    weight_decay = cast_like(weight_decay, param)
    momentum = cast_like(momentum, param)
    centered = cast_like(centered, param)
    gradient_sign = cast_like(gradient_sign, param)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float32(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_square_avg, new_grad_avg, new_momentum_buffer, = rmsprop_step_f32(at(param, i), at(grad, i) * grad_factor, at(square_avg, i), at(grad_avg, i), at(momentum_buffer, i), at(decay, i), at(lr, i), at(alpha, i), at(one_minus_alpha, i), at(eps, i), at(weight_decay, i), at(momentum, i), at(centered, i), at(gradient_sign, i))
        put(param, i, new_param)
        put(square_avg, i, new_square_avg)
        put(grad_avg, i, new_grad_avg)
        put(momentum_buffer, i, new_momentum_buffer)


@njit(error_model="numpy", cache=True, parallel=True)
def adagrad_f32_step(skip_step, grad_scale, param, grad, state_sum, decay, clr, eps, weight_decay, gradient_sign):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    clr = cast_like(clr, param)
    eps = cast_like(eps, param)
    weight_decay = cast_like(weight_decay, param)
    gradient_sign = cast_like(gradient_sign, param)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float32(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_state_sum, = adagrad_step_f32(at(param, i), at(grad, i) * grad_factor, at(state_sum, i), at(decay, i), at(clr, i), at(eps, i), at(weight_decay, i), at(gradient_sign, i))
        put(param, i, new_param)
        put(state_sum, i, new_state_sum)


@njit(error_model="numpy", cache=True, parallel=True)
def lars_f32_step(skip_step, grad_scale, segment_ids, param, grad, momentum_buffer, trust_ratio, tensor_weight_decay, lr, momentum, gradient_sign):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    lr = cast_like(lr, param)
    momentum = cast_like(momentum, param)
    gradient_sign = cast_like(gradient_sign, param)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float32(0.0):
        return
    size = param.shape[0]
    for block in prange((size + 255) // 256):
        start = block * 256
        stop = min(start + 256, size)
        if segment_ids[start] == segment_ids[stop - 1]:
            trust_ratio_here = trust_ratio[segment_ids[start]]
            tensor_weight_decay_here = tensor_weight_decay[segment_ids[start]]
            for i in range(start, stop):
                new_param, new_momentum_buffer, = lars_step_f32(at(param, i), at(grad, i) * grad_factor, at(momentum_buffer, i), trust_ratio_here, tensor_weight_decay_here, at(lr, i), at(momentum, i), at(gradient_sign, i))
                put(param, i, new_param)
                put(momentum_buffer, i, new_momentum_buffer)
        else:
            for i in range(start, stop):
                new_param, new_momentum_buffer, = lars_step_f32(at(param, i), at(grad, i) * grad_factor, at(momentum_buffer, i), trust_ratio[segment_ids[i]], tensor_weight_decay[segment_ids[i]], at(lr, i), at(momentum, i), at(gradient_sign, i))
                put(param, i, new_param)
                put(momentum_buffer, i, new_momentum_buffer)


@njit(error_model="numpy", cache=True, parallel=True)
def lion_f32_step(skip_step, grad_scale, param, grad, exp_avg, decay, lr, beta1, one_minus_beta1, beta2, one_minus_beta2, weight_decay, gradient_sign):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    lr = cast_like(lr, param)
    beta1 = cast_like(beta1, param)
    one_minus_beta1 = cast_like(one_minus_beta1, param)
    beta2 = cast_like(beta2, param)
    one_minus_beta2 = cast_like(one_minus_beta2, param)
    weight_decay = cast_like(weight_decay, param)
    gradient_sign = cast_like(gradient_sign, param)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float32(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_exp_avg, = lion_step_f32(at(param, i), at(grad, i) * grad_factor, at(exp_avg, i), at(decay, i), at(lr, i), at(beta1, i), at(one_minus_beta1, i), at(beta2, i), at(one_minus_beta2, i), at(weight_decay, i), at(gradient_sign, i))
        put(param, i, new_param)
        put(exp_avg, i, new_exp_avg)


@njit(error_model="numpy", cache=True, parallel=True)
def scaled_copy_f32_step(skip_step, grad_scale, param, grad):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    for i in prange(param.shape[0]):
        new_param, = scaled_copy_step_f32(at(param, i), at(grad, i) * grad_factor)
        put(param, i, new_param)


@njit(error_model="numpy", cache=True, parallel=True)
def ema_f32_step(skip_step, grad_scale, ema, param, decay):
    skip_step = cast_like(skip_step, ema)
    grad_scale = cast_like(grad_scale, ema)
    decay = cast_like(decay, ema)
    if at(skip_step, 0) != float32(0.0):
        return
    for i in prange(ema.shape[0]):
        new_ema, = ema_step_f32(at(ema, i), at(param, i), at(decay, i))
        put(ema, i, new_ema)


@njit(error_model="numpy", cache=True, parallel=True)
def accumulate_f32_step(skip_step, grad_scale, total, grad):
    skip_step = cast_like(skip_step, total)
    grad_scale = cast_like(grad_scale, total)
    if at(skip_step, 0) != float32(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float32(0.0):
        return
    for i in prange(total.shape[0]):
        new_total, = accumulate_step_f32(at(total, i), at(grad, i) * grad_factor)
        put(total, i, new_total)


@njit(error_model="numpy", cache=True, parallel=True)
def loss_scale_f32_step(skip_step, grad_scale, scale, growth_tracker, overflow, growth_factor, backoff_factor, growth_interval):
    skip_step = cast_like(skip_step, scale)
    grad_scale = cast_like(grad_scale, scale)
    overflow = cast_like(overflow, scale)
    growth_factor = cast_like(growth_factor, scale)
    backoff_factor = cast_like(backoff_factor, scale)
    growth_interval = cast_like(growth_interval, scale)
    if at(skip_step, 0) != float32(0.0):
        return
    for i in prange(scale.shape[0]):
        new_scale, new_growth_tracker, = loss_scale_step_f32(at(scale, i), at(growth_tracker, i), at(overflow, i), at(growth_factor, i), at(backoff_factor, i), at(growth_interval, i))
        put(scale, i, new_scale)
        put(growth_tracker, i, new_growth_tracker)


@njit(error_model="numpy", cache=True, forceinline=True)
def sign_f64(x):
    if x > float64(0.0):
        return float64(1.0)
    if x < float64(0.0):
        return -float64(1.0)
    if x == float64(0.0):
        return float64(0.0)
    return x


@njit(error_model="numpy", cache=True, forceinline=True)
def is_finite_f64(x):
    return x == x and abs(x) <= float64(1e+308)


@njit(error_model="numpy", cache=True, forceinline=True)
def floor_f64(x):
    if not is_finite_f64(x):
        return x
    return x - x % float64(1.0)


@njit(error_model="numpy", cache=True, forceinline=True)
def maximum_f64(x, y):
    if x > y or x != x:
        return x
    return y


@njit(error_model="numpy", cache=True, forceinline=True)
def lerp_f64(start, end, weight):
    if weight < float64(0.5):
        return start + weight * (end - start)
    return end - (end - start) * (float64(1.0) - weight)


@njit(error_model="numpy", cache=True, forceinline=True)
def grad_accumulate_f64(current_grad, incoming_grad):
    return current_grad + incoming_grad


@njit(error_model="numpy", cache=True, forceinline=True)
def ema_update_f64(ema, value, decay):
    return decay * ema + (float64(1.0) - decay) * value


@njit(error_model="numpy", cache=True, forceinline=True)
def _l2_gradient_f64(grad, param, weight_decay, gradient_sign):
    grad = grad * gradient_sign
    if weight_decay != float64(0.0):
        grad = grad + weight_decay * param
    return grad


@njit(error_model="numpy", cache=True, forceinline=True)
def sgd_step_f64(param, grad, momentum_buffer, decay, lr, momentum, dampening, weight_decay, nesterov, gradient_sign, first_step):
    direction = _l2_gradient_f64(grad, param, weight_decay * decay, gradient_sign)
    if momentum != float64(0.0):
        if first_step != float64(0.0):
            momentum_buffer = direction
        else:
            momentum_buffer = momentum_buffer * momentum + (float64(1.0) - dampening) * direction
        if nesterov != float64(0.0):
            direction = direction + momentum * momentum_buffer
        else:
            direction = momentum_buffer
    return (param - lr * direction, momentum_buffer)


@njit(error_model="numpy", cache=True, forceinline=True)
def adam_step_f64(param, grad, exp_avg, exp_avg_sq, decay, weight_decay, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    grad = _l2_gradient_f64(grad, param, weight_decay * decay, gradient_sign)
    exp_avg, exp_avg_sq = _adam_moments_f64(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    return (_adam_param_f64(param, exp_avg, exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq)


@njit(error_model="numpy", cache=True, forceinline=True)
def adam_amsgrad_step_f64(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, weight_decay, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    grad = _l2_gradient_f64(grad, param, weight_decay * decay, gradient_sign)
    exp_avg, exp_avg_sq = _adam_moments_f64(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    max_exp_avg_sq = maximum_f64(max_exp_avg_sq, exp_avg_sq)
    return (_adam_param_f64(param, exp_avg, max_exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq, max_exp_avg_sq)


@njit(error_model="numpy", cache=True, forceinline=True)
def adamw_step_f64(param, grad, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    param = _decoupled_decay_f64(param, decay, decoupled_factor)
    exp_avg, exp_avg_sq = _adam_moments_f64(grad * gradient_sign, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    return (_adam_param_f64(param, exp_avg, exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq)


@njit(error_model="numpy", cache=True, forceinline=True)
def adamw_amsgrad_step_f64(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    param = _decoupled_decay_f64(param, decay, decoupled_factor)
    exp_avg, exp_avg_sq = _adam_moments_f64(grad * gradient_sign, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    max_exp_avg_sq = maximum_f64(max_exp_avg_sq, exp_avg_sq)
    return (_adam_param_f64(param, exp_avg, max_exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq, max_exp_avg_sq)


@njit(error_model="numpy", cache=True, forceinline=True)
def adam_schedule_step_f64(step, step_size, inverse_bias_correction2_sqrt, lr, one_minus_beta1, one_minus_beta2):
    if not (step >= float64(0.0) and step < float64(math.inf) and (floor_f64(step) == step)):
        return (step, float64(math.nan), float64(math.nan))
    step = step + float64(1.0)
    bias_correction1 = -math.expm1(step * math.log1p(-one_minus_beta1))
    bias_correction2 = -math.expm1(step * math.log1p(-one_minus_beta2))
    return (step, lr / bias_correction1, float64(1.0) / math.sqrt(bias_correction2))


@njit(error_model="numpy", cache=True, forceinline=True)
def _decoupled_decay_f64(param, decay, decoupled_factor):
    factor = float64(1.0)
    if decay != float64(0.0):
        factor = decoupled_factor
    return param * factor


@njit(error_model="numpy", cache=True, forceinline=True)
def _adam_moments_f64(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2):
    return (lerp_f64(exp_avg, grad, one_minus_beta1), exp_avg_sq * beta2 + one_minus_beta2 * grad * grad)


@njit(error_model="numpy", cache=True, forceinline=True)
def _adam_param_f64(param, exp_avg, second_moment, eps, step_size, inverse_bias_correction2_sqrt):
    denominator = math.sqrt(second_moment) * inverse_bias_correction2_sqrt + eps
    return param + -step_size * exp_avg / denominator


@njit(error_model="numpy", cache=True, forceinline=True)
def rmsprop_step_f64(param, grad, square_avg, grad_avg, momentum_buffer, decay, lr, alpha, one_minus_alpha, eps, weight_decay, momentum, centered, gradient_sign):
    grad = _l2_gradient_f64(grad, param, weight_decay * decay, gradient_sign)
    square_avg = square_avg * alpha + one_minus_alpha * grad * grad
    variance = square_avg
    if centered != float64(0.0):
        grad_avg = lerp_f64(grad_avg, grad, one_minus_alpha)
        if square_avg < float64(math.inf) or not is_finite_f64(grad_avg):
            variance = square_avg + -float64(1.0) * grad_avg * grad_avg
    average = math.sqrt(variance) + eps
    if momentum > float64(0.0):
        momentum_buffer = momentum_buffer * momentum + grad / average
        return (param - lr * momentum_buffer, square_avg, grad_avg, momentum_buffer)
    return (param + -lr * grad / average, square_avg, grad_avg, momentum_buffer)


@njit(error_model="numpy", cache=True, forceinline=True)
def adagrad_step_f64(param, grad, state_sum, decay, clr, eps, weight_decay, gradient_sign):
    grad = _l2_gradient_f64(grad, param, weight_decay * decay, gradient_sign)
    state_sum = state_sum + grad * grad
    return (param + -clr * grad / (math.sqrt(state_sum) + eps), state_sum)


@njit(error_model="numpy", cache=True, forceinline=True)
def lars_trust_ratio_f64(param_sum_squares, grad_sum_squares, trust_coefficient, weight_decay, eps):
    param_norm = math.sqrt(param_sum_squares)
    return trust_coefficient * param_norm / (math.sqrt(grad_sum_squares) + weight_decay * param_norm + eps)


@njit(error_model="numpy", cache=True, parallel=True)
def lars_trust_ratio_f64_kernel(out, param_sum_squares, grad_sum_squares, trust_coefficient, weight_decay, eps):
    for i in prange(out.shape[0]):
        out[i] = lars_trust_ratio_f64(at(param_sum_squares, i), at(grad_sum_squares, i), at(trust_coefficient, i), at(weight_decay, i), at(eps, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def lars_step_f64(param, grad, momentum_buffer, trust_ratio, tensor_weight_decay, lr, momentum, gradient_sign):
    update = trust_ratio * _l2_gradient_f64(grad, param, tensor_weight_decay, gradient_sign)
    if momentum != float64(0.0):
        momentum_buffer = momentum * momentum_buffer + update
        update = momentum_buffer
    return (param - lr * update, momentum_buffer)


@njit(error_model="numpy", cache=True, forceinline=True)
def lion_step_f64(param, grad, exp_avg, decay, lr, beta1, one_minus_beta1, beta2, one_minus_beta2, weight_decay, gradient_sign):
    grad = grad * gradient_sign
    direction = sign_f64(beta1 * exp_avg + one_minus_beta1 * grad)
    param = param - lr * (direction + weight_decay * decay * param)
    return (param, beta2 * exp_avg + one_minus_beta2 * grad)


@njit(error_model="numpy", cache=True, forceinline=True)
def scaled_copy_step_f64(param, grad):
    return (grad,)


@njit(error_model="numpy", cache=True, forceinline=True)
def accumulate_step_f64(total, grad):
    return (grad_accumulate_f64(total, grad),)


@njit(error_model="numpy", cache=True, forceinline=True)
def ema_step_f64(ema, param, decay):
    return (ema_update_f64(ema, param, decay),)


@njit(error_model="numpy", cache=True, forceinline=True)
def loss_scale_step_f64(scale, growth_tracker, overflow, growth_factor, backoff_factor, growth_interval):
    if overflow != float64(0.0):
        return (scale * backoff_factor, float64(0.0))
    successful = growth_tracker + float64(1.0)
    if successful >= growth_interval:
        grown = scale * growth_factor
        if abs(grown) <= float64(1e+308):
            scale = grown
        return (scale, float64(0.0))
    return (scale, successful)


@njit(error_model="numpy", cache=True, forceinline=True)
def clip_coefficient_f64(sum_of_squares, max_norm):
    coefficient = max_norm / (math.sqrt(sum_of_squares) + float64(1e-06))
    if coefficient >= float64(1.0):
        return float64(1.0)
    return coefficient


@njit(error_model="numpy", cache=True, parallel=True)
def clip_coefficient_f64_kernel(out, sum_of_squares, max_norm):
    for i in prange(out.shape[0]):
        out[i] = clip_coefficient_f64(at(sum_of_squares, i), at(max_norm, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def l2_norm_f64(sum_of_squares):
    return math.sqrt(sum_of_squares)


@njit(error_model="numpy", cache=True, parallel=True)
def l2_norm_f64_kernel(out, sum_of_squares):
    for i in prange(out.shape[0]):
        out[i] = l2_norm_f64(at(sum_of_squares, i))


@njit(error_model="numpy", cache=True, forceinline=True)
def nonfinite_f64(x):
    if is_finite_f64(x):
        return float64(0.0)
    return float64(1.0)


@njit(error_model="numpy", cache=True, parallel=True)
def nonfinite_f64_kernel(out, x):
    for i in prange(out.shape[0]):
        out[i] = nonfinite_f64(at(x, i))


@njit(error_model="numpy", cache=True, parallel=True)
def sgd_f64_step(skip_step, grad_scale, param, grad, momentum_buffer, decay, lr, momentum, dampening, weight_decay, nesterov, gradient_sign, first_step):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    lr = cast_like(lr, param)
    momentum = cast_like(momentum, param)
    dampening = cast_like(dampening, param)
    weight_decay = cast_like(weight_decay, param)
    nesterov = cast_like(nesterov, param)
    gradient_sign = cast_like(gradient_sign, param)
    first_step = cast_like(first_step, param)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float64(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_momentum_buffer, = sgd_step_f64(at(param, i), at(grad, i) * grad_factor, at(momentum_buffer, i), at(decay, i), at(lr, i), at(momentum, i), at(dampening, i), at(weight_decay, i), at(nesterov, i), at(gradient_sign, i), at(first_step, i))
        put(param, i, new_param)
        put(momentum_buffer, i, new_momentum_buffer)


@njit(error_model="numpy", cache=True, parallel=True)
def adam_f64_step(skip_step, grad_scale, param, grad, exp_avg, exp_avg_sq, decay, weight_decay, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    weight_decay = cast_like(weight_decay, param)
    one_minus_beta1 = cast_like(one_minus_beta1, param)
    beta2 = cast_like(beta2, param)
    one_minus_beta2 = cast_like(one_minus_beta2, param)
    eps = cast_like(eps, param)
    gradient_sign = cast_like(gradient_sign, param)
    step_size = cast_like(at(step_size, 0), param)
    inverse_bias_correction2_sqrt = cast_like(at(inverse_bias_correction2_sqrt, 0), param)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float64(0.0):
        return
    if step_size - step_size != float64(0.0):
        return
    if inverse_bias_correction2_sqrt - inverse_bias_correction2_sqrt != float64(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_exp_avg, new_exp_avg_sq, = adam_step_f64(at(param, i), at(grad, i) * grad_factor, at(exp_avg, i), at(exp_avg_sq, i), at(decay, i), at(weight_decay, i), at(one_minus_beta1, i), at(beta2, i), at(one_minus_beta2, i), at(eps, i), at(gradient_sign, i), at(step_size, i), at(inverse_bias_correction2_sqrt, i))
        put(param, i, new_param)
        put(exp_avg, i, new_exp_avg)
        put(exp_avg_sq, i, new_exp_avg_sq)


@njit(error_model="numpy", cache=True, parallel=True)
def adamw_f64_step(skip_step, grad_scale, param, grad, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    decoupled_factor = cast_like(decoupled_factor, param)
    one_minus_beta1 = cast_like(one_minus_beta1, param)
    beta2 = cast_like(beta2, param)
    one_minus_beta2 = cast_like(one_minus_beta2, param)
    eps = cast_like(eps, param)
    gradient_sign = cast_like(gradient_sign, param)
    step_size = cast_like(at(step_size, 0), param)
    inverse_bias_correction2_sqrt = cast_like(at(inverse_bias_correction2_sqrt, 0), param)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float64(0.0):
        return
    if step_size - step_size != float64(0.0):
        return
    if inverse_bias_correction2_sqrt - inverse_bias_correction2_sqrt != float64(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_exp_avg, new_exp_avg_sq, = adamw_step_f64(at(param, i), at(grad, i) * grad_factor, at(exp_avg, i), at(exp_avg_sq, i), at(decay, i), at(decoupled_factor, i), at(one_minus_beta1, i), at(beta2, i), at(one_minus_beta2, i), at(eps, i), at(gradient_sign, i), at(step_size, i), at(inverse_bias_correction2_sqrt, i))
        put(param, i, new_param)
        put(exp_avg, i, new_exp_avg)
        put(exp_avg_sq, i, new_exp_avg_sq)


@njit(error_model="numpy", cache=True, parallel=True)
def adam_amsgrad_f64_step(skip_step, grad_scale, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, weight_decay, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    weight_decay = cast_like(weight_decay, param)
    one_minus_beta1 = cast_like(one_minus_beta1, param)
    beta2 = cast_like(beta2, param)
    one_minus_beta2 = cast_like(one_minus_beta2, param)
    eps = cast_like(eps, param)
    gradient_sign = cast_like(gradient_sign, param)
    step_size = cast_like(at(step_size, 0), param)
    inverse_bias_correction2_sqrt = cast_like(at(inverse_bias_correction2_sqrt, 0), param)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float64(0.0):
        return
    if step_size - step_size != float64(0.0):
        return
    if inverse_bias_correction2_sqrt - inverse_bias_correction2_sqrt != float64(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_exp_avg, new_exp_avg_sq, new_max_exp_avg_sq, = adam_amsgrad_step_f64(at(param, i), at(grad, i) * grad_factor, at(exp_avg, i), at(exp_avg_sq, i), at(max_exp_avg_sq, i), at(decay, i), at(weight_decay, i), at(one_minus_beta1, i), at(beta2, i), at(one_minus_beta2, i), at(eps, i), at(gradient_sign, i), at(step_size, i), at(inverse_bias_correction2_sqrt, i))
        put(param, i, new_param)
        put(exp_avg, i, new_exp_avg)
        put(exp_avg_sq, i, new_exp_avg_sq)
        put(max_exp_avg_sq, i, new_max_exp_avg_sq)


@njit(error_model="numpy", cache=True, parallel=True)
def adamw_amsgrad_f64_step(skip_step, grad_scale, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    decoupled_factor = cast_like(decoupled_factor, param)
    one_minus_beta1 = cast_like(one_minus_beta1, param)
    beta2 = cast_like(beta2, param)
    one_minus_beta2 = cast_like(one_minus_beta2, param)
    eps = cast_like(eps, param)
    gradient_sign = cast_like(gradient_sign, param)
    step_size = cast_like(at(step_size, 0), param)
    inverse_bias_correction2_sqrt = cast_like(at(inverse_bias_correction2_sqrt, 0), param)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float64(0.0):
        return
    if step_size - step_size != float64(0.0):
        return
    if inverse_bias_correction2_sqrt - inverse_bias_correction2_sqrt != float64(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_exp_avg, new_exp_avg_sq, new_max_exp_avg_sq, = adamw_amsgrad_step_f64(at(param, i), at(grad, i) * grad_factor, at(exp_avg, i), at(exp_avg_sq, i), at(max_exp_avg_sq, i), at(decay, i), at(decoupled_factor, i), at(one_minus_beta1, i), at(beta2, i), at(one_minus_beta2, i), at(eps, i), at(gradient_sign, i), at(step_size, i), at(inverse_bias_correction2_sqrt, i))
        put(param, i, new_param)
        put(exp_avg, i, new_exp_avg)
        put(exp_avg_sq, i, new_exp_avg_sq)
        put(max_exp_avg_sq, i, new_max_exp_avg_sq)


@njit(error_model="numpy", cache=True, parallel=True)
def adam_schedule_f64_step(skip_step, grad_scale, step, step_size, inverse_bias_correction2_sqrt, lr, one_minus_beta1, one_minus_beta2):
    skip_step = cast_like(skip_step, step)
    grad_scale = cast_like(grad_scale, step)
    lr = cast_like(lr, step)
    one_minus_beta1 = cast_like(one_minus_beta1, step)
    one_minus_beta2 = cast_like(one_minus_beta2, step)
    if at(skip_step, 0) != float64(0.0):
        return
    for i in prange(step.shape[0]):
        new_step, new_step_size, new_inverse_bias_correction2_sqrt, = adam_schedule_step_f64(at(step, i), at(step_size, i), at(inverse_bias_correction2_sqrt, i), at(lr, i), at(one_minus_beta1, i), at(one_minus_beta2, i))
        put(step, i, new_step)
        put(step_size, i, new_step_size)
        put(inverse_bias_correction2_sqrt, i, new_inverse_bias_correction2_sqrt)


@njit(error_model="numpy", cache=True, parallel=True)
def rmsprop_f64_step(skip_step, grad_scale, param, grad, square_avg, grad_avg, momentum_buffer, decay, lr, alpha, one_minus_alpha, eps, weight_decay, momentum, centered, gradient_sign):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    lr = cast_like(lr, param)
    alpha = cast_like(alpha, param)
    one_minus_alpha = cast_like(one_minus_alpha, param)
    eps = cast_like(eps, param)
    weight_decay = cast_like(weight_decay, param)
    momentum = cast_like(momentum, param)
    centered = cast_like(centered, param)
    gradient_sign = cast_like(gradient_sign, param)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float64(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_square_avg, new_grad_avg, new_momentum_buffer, = rmsprop_step_f64(at(param, i), at(grad, i) * grad_factor, at(square_avg, i), at(grad_avg, i), at(momentum_buffer, i), at(decay, i), at(lr, i), at(alpha, i), at(one_minus_alpha, i), at(eps, i), at(weight_decay, i), at(momentum, i), at(centered, i), at(gradient_sign, i))
        put(param, i, new_param)
        put(square_avg, i, new_square_avg)
        put(grad_avg, i, new_grad_avg)
        put(momentum_buffer, i, new_momentum_buffer)


@njit(error_model="numpy", cache=True, parallel=True)
def adagrad_f64_step(skip_step, grad_scale, param, grad, state_sum, decay, clr, eps, weight_decay, gradient_sign):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    clr = cast_like(clr, param)
    eps = cast_like(eps, param)
    weight_decay = cast_like(weight_decay, param)
    gradient_sign = cast_like(gradient_sign, param)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float64(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_state_sum, = adagrad_step_f64(at(param, i), at(grad, i) * grad_factor, at(state_sum, i), at(decay, i), at(clr, i), at(eps, i), at(weight_decay, i), at(gradient_sign, i))
        put(param, i, new_param)
        put(state_sum, i, new_state_sum)


@njit(error_model="numpy", cache=True, parallel=True)
def lars_f64_step(skip_step, grad_scale, segment_ids, param, grad, momentum_buffer, trust_ratio, tensor_weight_decay, lr, momentum, gradient_sign):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    lr = cast_like(lr, param)
    momentum = cast_like(momentum, param)
    gradient_sign = cast_like(gradient_sign, param)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float64(0.0):
        return
    size = param.shape[0]
    for block in prange((size + 255) // 256):
        start = block * 256
        stop = min(start + 256, size)
        if segment_ids[start] == segment_ids[stop - 1]:
            trust_ratio_here = trust_ratio[segment_ids[start]]
            tensor_weight_decay_here = tensor_weight_decay[segment_ids[start]]
            for i in range(start, stop):
                new_param, new_momentum_buffer, = lars_step_f64(at(param, i), at(grad, i) * grad_factor, at(momentum_buffer, i), trust_ratio_here, tensor_weight_decay_here, at(lr, i), at(momentum, i), at(gradient_sign, i))
                put(param, i, new_param)
                put(momentum_buffer, i, new_momentum_buffer)
        else:
            for i in range(start, stop):
                new_param, new_momentum_buffer, = lars_step_f64(at(param, i), at(grad, i) * grad_factor, at(momentum_buffer, i), trust_ratio[segment_ids[i]], tensor_weight_decay[segment_ids[i]], at(lr, i), at(momentum, i), at(gradient_sign, i))
                put(param, i, new_param)
                put(momentum_buffer, i, new_momentum_buffer)


@njit(error_model="numpy", cache=True, parallel=True)
def lion_f64_step(skip_step, grad_scale, param, grad, exp_avg, decay, lr, beta1, one_minus_beta1, beta2, one_minus_beta2, weight_decay, gradient_sign):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    decay = cast_like(decay, param)
    lr = cast_like(lr, param)
    beta1 = cast_like(beta1, param)
    one_minus_beta1 = cast_like(one_minus_beta1, param)
    beta2 = cast_like(beta2, param)
    one_minus_beta2 = cast_like(one_minus_beta2, param)
    weight_decay = cast_like(weight_decay, param)
    gradient_sign = cast_like(gradient_sign, param)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float64(0.0):
        return
    for i in prange(param.shape[0]):
        new_param, new_exp_avg, = lion_step_f64(at(param, i), at(grad, i) * grad_factor, at(exp_avg, i), at(decay, i), at(lr, i), at(beta1, i), at(one_minus_beta1, i), at(beta2, i), at(one_minus_beta2, i), at(weight_decay, i), at(gradient_sign, i))
        put(param, i, new_param)
        put(exp_avg, i, new_exp_avg)


@njit(error_model="numpy", cache=True, parallel=True)
def scaled_copy_f64_step(skip_step, grad_scale, param, grad):
    skip_step = cast_like(skip_step, param)
    grad_scale = cast_like(grad_scale, param)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    for i in prange(param.shape[0]):
        new_param, = scaled_copy_step_f64(at(param, i), at(grad, i) * grad_factor)
        put(param, i, new_param)


@njit(error_model="numpy", cache=True, parallel=True)
def ema_f64_step(skip_step, grad_scale, ema, param, decay):
    skip_step = cast_like(skip_step, ema)
    grad_scale = cast_like(grad_scale, ema)
    decay = cast_like(decay, ema)
    if at(skip_step, 0) != float64(0.0):
        return
    for i in prange(ema.shape[0]):
        new_ema, = ema_step_f64(at(ema, i), at(param, i), at(decay, i))
        put(ema, i, new_ema)


@njit(error_model="numpy", cache=True, parallel=True)
def accumulate_f64_step(skip_step, grad_scale, total, grad):
    skip_step = cast_like(skip_step, total)
    grad_scale = cast_like(grad_scale, total)
    if at(skip_step, 0) != float64(0.0):
        return
    grad_factor = at(grad_scale, 0)
    if grad_factor - grad_factor != float64(0.0):
        return
    for i in prange(total.shape[0]):
        new_total, = accumulate_step_f64(at(total, i), at(grad, i) * grad_factor)
        put(total, i, new_total)


@njit(error_model="numpy", cache=True, parallel=True)
def loss_scale_f64_step(skip_step, grad_scale, scale, growth_tracker, overflow, growth_factor, backoff_factor, growth_interval):
    skip_step = cast_like(skip_step, scale)
    grad_scale = cast_like(grad_scale, scale)
    overflow = cast_like(overflow, scale)
    growth_factor = cast_like(growth_factor, scale)
    backoff_factor = cast_like(backoff_factor, scale)
    growth_interval = cast_like(growth_interval, scale)
    if at(skip_step, 0) != float64(0.0):
        return
    for i in prange(scale.shape[0]):
        new_scale, new_growth_tracker, = loss_scale_step_f64(at(scale, i), at(growth_tracker, i), at(overflow, i), at(growth_factor, i), at(backoff_factor, i), at(growth_interval, i))
        put(scale, i, new_scale)
        put(growth_tracker, i, new_growth_tracker)
