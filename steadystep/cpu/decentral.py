"""CPU kernels generated from steadystep/kernels/decentral.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

import math  # noqa: F401  (formulas may call math functions)

import numpy as np  # noqa: F401
from numba import njit, prange  # noqa: F401
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cpu.primitives import at, put  # noqa: F401


@njit(error_model="numpy", cache=True)
def lerp_f32(start, end, weight):
    if weight < float32(0.5):
        return start + weight * (end - start)
    return end - (end - start) * (float32(1.0) - weight)


@njit(error_model="numpy", cache=True)
def _l2_gradient_f32(grad, param, weight_decay, maximize):
    if maximize != float32(0.0):
        grad = -grad
    if weight_decay != float32(0.0):
        grad = grad + weight_decay * param
    return grad


@njit(error_model="numpy", cache=True)
def adam_step_f32(param, grad, exp_avg, exp_avg_sq, decay, weight_decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, maximize, step_size, inverse_bias_correction2_sqrt):
    if maximize != float32(0.0):
        grad = -grad
    if decoupled_factor != float32(1.0):
        if decay != float32(0.0):
            param = param * decoupled_factor
    else:
        grad = _l2_gradient_f32(grad, param, weight_decay * decay, float32(0.0))
    exp_avg = lerp_f32(exp_avg, grad, one_minus_beta1)
    exp_avg_sq = exp_avg_sq * beta2 + one_minus_beta2 * grad * grad
    denominator = math.sqrt(exp_avg_sq) * inverse_bias_correction2_sqrt + eps
    return (param + -step_size * exp_avg / denominator, exp_avg, exp_avg_sq)


@njit(error_model="numpy", cache=True)
def worker_update_f32(param, grad, exp_avg, exp_avg_sq, clip, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    return adam_step_f32(param, grad * clip, exp_avg, exp_avg_sq, decay, float32(0.0), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, float32(0.0), step_size, inverse_bias_correction2_sqrt)


@njit(error_model="numpy", cache=True, parallel=True)
def peer_f32_mix(x_out, m_out, v_out, x, g, m, v, clip, decay, peers, self_weight, peer_weight, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    groups = (x.shape[0] + 7) // 8
    chunks = (x.shape[1] + 4095) // 4096
    for task in prange(groups * chunks):
        first = (task % groups) * 8
        start = (task // groups) * 4096
        for i in range(first, min(first + 8, x.shape[0])):
            for d in range(start, min(start + 4096, x.shape[1])):
                p = peers[i]
                if atc:
                    own, new_m, new_v = worker_update_f32(x[i, d], g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    other, unused_m, unused_v = worker_update_f32(x[p, d], g[p, d], m[p, d], v[p, d], clip[p], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[i, d] = self_weight * own + peer_weight * other
                else:
                    mixed = self_weight * x[i, d] + peer_weight * x[p, d]
                    new_x, new_m, new_v = worker_update_f32(mixed, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[i, d] = new_x
                m_out[i, d] = new_m
                v_out[i, d] = new_v


@njit(error_model="numpy", cache=True, parallel=True)
def complete_f32_mix(x_out, m_out, v_out, x, g, m, v, clip, decay, mean_weight, own_weight, inverse_workers, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    for task in prange((x.shape[1] + 4095) // 4096):
        start = task * 4096
        stop = min(start + 4096, x.shape[1])
        total = np.zeros(stop - start, x.dtype)
        for j in range(x.shape[0]):
            for d in range(start, stop):
                if atc:
                    y, new_m, new_v = worker_update_f32(x[j, d], g[j, d], m[j, d], v[j, d], clip[j], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[j, d] = y
                    m_out[j, d] = new_m
                    v_out[j, d] = new_v
                    total[d - start] += y
                else:
                    total[d - start] += x[j, d]
        for i in range(x.shape[0]):
            for d in range(start, stop):
                mean = total[d - start] * inverse_workers
                if atc:
                    x_out[i, d] = mean_weight * mean + own_weight * x_out[i, d]
                else:
                    mixed = mean_weight * mean + own_weight * x[i, d]
                    new_x, new_m, new_v = worker_update_f32(mixed, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[i, d] = new_x
                    m_out[i, d] = new_m
                    v_out[i, d] = new_v


@njit(error_model="numpy", cache=True, parallel=True)
def dense_f32_mix(x_out, m_out, v_out, x, g, m, v, clip, decay, weights, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    chunks = (x.shape[1] + 4095) // 4096
    for task in prange(chunks):
        for d in range(task * 4096, min(task * 4096 + 4096, x.shape[1])):
            for i in range(x.shape[0]):
                total = float32(0.0)
                for j in range(x.shape[0]):
                    weight = weights[i, j]
                    if weight != float32(0.0):
                        if atc:
                            y, unused_m, unused_v = worker_update_f32(x[j, d], g[j, d], m[j, d], v[j, d], clip[j], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                        else:
                            y = x[j, d]
                        total += weight * y
                if atc:
                    unused_x, new_m, new_v = worker_update_f32(x[i, d], g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[i, d] = total
                else:
                    new_x, new_m, new_v = worker_update_f32(total, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[i, d] = new_x
                m_out[i, d] = new_m
                v_out[i, d] = new_v


@njit(error_model="numpy", cache=True)
def lerp_f64(start, end, weight):
    if weight < float64(0.5):
        return start + weight * (end - start)
    return end - (end - start) * (float64(1.0) - weight)


@njit(error_model="numpy", cache=True)
def _l2_gradient_f64(grad, param, weight_decay, maximize):
    if maximize != float64(0.0):
        grad = -grad
    if weight_decay != float64(0.0):
        grad = grad + weight_decay * param
    return grad


@njit(error_model="numpy", cache=True)
def adam_step_f64(param, grad, exp_avg, exp_avg_sq, decay, weight_decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, maximize, step_size, inverse_bias_correction2_sqrt):
    if maximize != float64(0.0):
        grad = -grad
    if decoupled_factor != float64(1.0):
        if decay != float64(0.0):
            param = param * decoupled_factor
    else:
        grad = _l2_gradient_f64(grad, param, weight_decay * decay, float64(0.0))
    exp_avg = lerp_f64(exp_avg, grad, one_minus_beta1)
    exp_avg_sq = exp_avg_sq * beta2 + one_minus_beta2 * grad * grad
    denominator = math.sqrt(exp_avg_sq) * inverse_bias_correction2_sqrt + eps
    return (param + -step_size * exp_avg / denominator, exp_avg, exp_avg_sq)


@njit(error_model="numpy", cache=True)
def worker_update_f64(param, grad, exp_avg, exp_avg_sq, clip, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    return adam_step_f64(param, grad * clip, exp_avg, exp_avg_sq, decay, float64(0.0), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, float64(0.0), step_size, inverse_bias_correction2_sqrt)


@njit(error_model="numpy", cache=True, parallel=True)
def peer_f64_mix(x_out, m_out, v_out, x, g, m, v, clip, decay, peers, self_weight, peer_weight, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    groups = (x.shape[0] + 7) // 8
    chunks = (x.shape[1] + 4095) // 4096
    for task in prange(groups * chunks):
        first = (task % groups) * 8
        start = (task // groups) * 4096
        for i in range(first, min(first + 8, x.shape[0])):
            for d in range(start, min(start + 4096, x.shape[1])):
                p = peers[i]
                if atc:
                    own, new_m, new_v = worker_update_f64(x[i, d], g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    other, unused_m, unused_v = worker_update_f64(x[p, d], g[p, d], m[p, d], v[p, d], clip[p], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[i, d] = self_weight * own + peer_weight * other
                else:
                    mixed = self_weight * x[i, d] + peer_weight * x[p, d]
                    new_x, new_m, new_v = worker_update_f64(mixed, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[i, d] = new_x
                m_out[i, d] = new_m
                v_out[i, d] = new_v


@njit(error_model="numpy", cache=True, parallel=True)
def complete_f64_mix(x_out, m_out, v_out, x, g, m, v, clip, decay, mean_weight, own_weight, inverse_workers, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    for task in prange((x.shape[1] + 4095) // 4096):
        start = task * 4096
        stop = min(start + 4096, x.shape[1])
        total = np.zeros(stop - start, x.dtype)
        for j in range(x.shape[0]):
            for d in range(start, stop):
                if atc:
                    y, new_m, new_v = worker_update_f64(x[j, d], g[j, d], m[j, d], v[j, d], clip[j], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[j, d] = y
                    m_out[j, d] = new_m
                    v_out[j, d] = new_v
                    total[d - start] += y
                else:
                    total[d - start] += x[j, d]
        for i in range(x.shape[0]):
            for d in range(start, stop):
                mean = total[d - start] * inverse_workers
                if atc:
                    x_out[i, d] = mean_weight * mean + own_weight * x_out[i, d]
                else:
                    mixed = mean_weight * mean + own_weight * x[i, d]
                    new_x, new_m, new_v = worker_update_f64(mixed, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[i, d] = new_x
                    m_out[i, d] = new_m
                    v_out[i, d] = new_v


@njit(error_model="numpy", cache=True, parallel=True)
def dense_f64_mix(x_out, m_out, v_out, x, g, m, v, clip, decay, weights, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    chunks = (x.shape[1] + 4095) // 4096
    for task in prange(chunks):
        for d in range(task * 4096, min(task * 4096 + 4096, x.shape[1])):
            for i in range(x.shape[0]):
                total = float64(0.0)
                for j in range(x.shape[0]):
                    weight = weights[i, j]
                    if weight != float64(0.0):
                        if atc:
                            y, unused_m, unused_v = worker_update_f64(x[j, d], g[j, d], m[j, d], v[j, d], clip[j], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                        else:
                            y = x[j, d]
                        total += weight * y
                if atc:
                    unused_x, new_m, new_v = worker_update_f64(x[i, d], g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[i, d] = total
                else:
                    new_x, new_m, new_v = worker_update_f64(total, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    x_out[i, d] = new_x
                m_out[i, d] = new_m
                v_out[i, d] = new_v
