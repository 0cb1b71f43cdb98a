"""Optimizer update rules for one parameter element; the caller owns every state buffer."""

import math

from steadystep.kernels._numerics import adam_parameter, cospi, sign


def sgd_update(param, grad, lr):
    """Plain gradient descent.

    param − lr·grad
    """
    return param - lr * grad


def sgd_momentum_update(param, grad, velocity, lr, momentum):
    """Gradient descent with heavy-ball momentum (velocity is the previous one).

    param − lr·(momentum·velocity + grad)
    """
    return param - lr * (momentum * velocity + grad)


def adam_update(param, m_hat, v_hat, lr, eps):
    """Adam step from bias-corrected moments (bias correction is the caller's).

    param − lr·m_hat/(√v_hat + eps)
    """
    return adam_parameter(param, m_hat, v_hat, eps, lr, 1.0)


def adamw_update(param, m_hat, v_hat, lr, eps, weight_decay):
    """AdamW step: decoupled weight decay, then Adam from bias-corrected moments.

    param·(1 − lr·weight_decay) − lr·m_hat/(√v_hat + eps)
    """
    return adam_parameter(param * (1.0 - lr * weight_decay), m_hat, v_hat, eps, lr, 1.0)


def rmsprop_update(param, grad, sq_avg, lr, alpha, eps):
    """RMSprop step from the previous squared-gradient average.

    s = alpha·sq_avg + (1−alpha)·grad²; param − lr·grad/(√s + eps)
    """
    square_avg = alpha * sq_avg + (1.0 - alpha) * grad * grad
    return param - lr * grad / (math.sqrt(square_avg) + eps)


def adagrad_update(param, grad, accumulator, lr, eps):
    """AdaGrad step from the previous squared-gradient sum.

    a = accumulator + grad²; param − lr·grad/(√a + eps)
    """
    total = accumulator + grad * grad
    return param - lr * grad / (math.sqrt(total) + eps)


def lars_update(param, grad, param_norm, grad_norm, lr, trust_coefficient, weight_decay):
    """LARS step with its layer-wise trust ratio; unchanged when the ratio is undefined.

    d = grad_norm + weight_decay·param_norm; param if d ≤ 0,
    else param − lr·(trust_coefficient·param_norm/d)·(grad + weight_decay·param)
    """
    denominator = grad_norm + weight_decay * param_norm
    if denominator <= 0.0:
        return param
    local_lr = trust_coefficient * param_norm / denominator
    return param - lr * local_lr * (grad + weight_decay * param)


def lion_update(param, momentum, grad, lr, beta1, beta2, weight_decay):
    """Lion step: the sign of the blended momentum, plus decoupled weight decay.

    c = sign(beta1·momentum + (1−beta1)·grad), sign(0) = 0; param − lr·(c + weight_decay·param)
    """
    direction = sign(beta1 * momentum + (1.0 - beta1) * grad)
    return param - lr * (direction + weight_decay * param)


def gradient_clipping(grad, grad_norm, max_norm):
    """One gradient element scaled so the global norm does not exceed max_norm.

    grad·max_norm/grad_norm if grad_norm > max_norm else grad
    """
    if grad_norm > max_norm:
        return grad * max_norm / grad_norm
    return grad


def cosine_annealing_lr(step, total_steps, base_lr, min_lr):
    """Cosine learning-rate decay from base_lr to min_lr over total_steps.

    min_lr + (base_lr − min_lr)·(1 + cos(π·min(step, total_steps)/total_steps))/2; min_lr if total_steps ≤ 0
    """
    if total_steps <= 0.0:
        return min_lr
    progress = min(step, total_steps) / total_steps
    return min_lr + (base_lr - min_lr) * ((1.0 + cospi(progress)) / 2.0)
