"""CPU kernels generated from steadystep/kernels/decentral.py.

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
def lerp_f32(start, end, weight):
    if weight < float32(0.5):
        return start + weight * (end - start)
    return end - (end - start) * (float32(1.0) - weight)


@njit(error_model="numpy", cache=True, forceinline=True)
def adamw_step_f32(param, grad, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    param = _decoupled_decay_f32(param, decay, decoupled_factor)
    exp_avg, exp_avg_sq = _adam_moments_f32(grad * gradient_sign, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    return (_adam_param_f32(param, exp_avg, exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq)


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
def worker_update_f32(param, grad, exp_avg, exp_avg_sq, clip, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    return adamw_step_f32(param, grad * clip, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, float32(1.0), step_size, inverse_bias_correction2_sqrt)


@njit(error_model="numpy", cache=True, parallel=True)
def peer_f32_mix(x, g, m, v, clip, decay, peers, self_weight, peer_weight, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    width = max(32768 // x.shape[0], 16)
    for task in prange((x.shape[1] + width - 1) // width):
        start = task * width
        stop = min(start + width, x.shape[1])
        source = np.empty((x.shape[0], stop - start), x.dtype)
        for j in range(x.shape[0]):
            xs, gs, ms, vs, ys = x[j, start:stop], g[j, start:stop], m[j, start:stop], v[j, start:stop], source[j]
            for k in range(stop - start):
                if atc:
                    y, new_m, new_v = worker_update_f32(xs[k], gs[k], ms[k], vs[k], clip[j], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    ms[k] = new_m
                    vs[k] = new_v
                else:
                    y = xs[k]
                ys[k] = y
        for i in range(x.shape[0]):
            xs, gs, ms, vs = x[i, start:stop], g[i, start:stop], m[i, start:stop], v[i, start:stop]
            own, other = source[i], source[peers[i]]
            for k in range(stop - start):
                mixed = self_weight * own[k] + peer_weight * other[k]
                if atc:
                    xs[k] = mixed
                else:
                    new_x, new_m, new_v = worker_update_f32(mixed, gs[k], ms[k], vs[k], clip[i], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    xs[k] = new_x
                    ms[k] = new_m
                    vs[k] = new_v


@njit(error_model="numpy", cache=True, parallel=True)
def complete_f32_mix(x, g, m, v, clip, decay, mean_weight, own_weight, inverse_workers, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    width = max(32768 // x.shape[0], 16)
    for task in prange((x.shape[1] + width - 1) // width):
        start = task * width
        stop = min(start + width, x.shape[1])
        source = np.empty((x.shape[0], stop - start), x.dtype)
        for j in range(x.shape[0]):
            xs, gs, ms, vs, ys = x[j, start:stop], g[j, start:stop], m[j, start:stop], v[j, start:stop], source[j]
            for k in range(stop - start):
                if atc:
                    y, new_m, new_v = worker_update_f32(xs[k], gs[k], ms[k], vs[k], clip[j], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    ms[k] = new_m
                    vs[k] = new_v
                else:
                    y = xs[k]
                ys[k] = y
        total = np.zeros(stop - start, x.dtype)
        for j in range(x.shape[0]):
            row = source[j]
            for k in range(stop - start):
                total[k] += row[k]
        for i in range(x.shape[0]):
            xs, gs, ms, vs = x[i, start:stop], g[i, start:stop], m[i, start:stop], v[i, start:stop]
            own = source[i]
            for k in range(stop - start):
                mixed = mean_weight * (total[k] * inverse_workers) + own_weight * own[k]
                if atc:
                    xs[k] = mixed
                else:
                    new_x, new_m, new_v = worker_update_f32(mixed, gs[k], ms[k], vs[k], clip[i], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    xs[k] = new_x
                    ms[k] = new_m
                    vs[k] = new_v


@njit(error_model="numpy", cache=True, parallel=True)
def dense_f32_mix(x, g, m, v, clip, decay, weights, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    width = max(32768 // x.shape[0], 16)
    for task in prange((x.shape[1] + width - 1) // width):
        start = task * width
        stop = min(start + width, x.shape[1])
        source = np.empty((x.shape[0], stop - start), x.dtype)
        for j in range(x.shape[0]):
            xs, gs, ms, vs, ys = x[j, start:stop], g[j, start:stop], m[j, start:stop], v[j, start:stop], source[j]
            for k in range(stop - start):
                if atc:
                    y, new_m, new_v = worker_update_f32(xs[k], gs[k], ms[k], vs[k], clip[j], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    ms[k] = new_m
                    vs[k] = new_v
                else:
                    y = xs[k]
                ys[k] = y
        for i in range(x.shape[0]):
            xs, gs, ms, vs = x[i, start:stop], g[i, start:stop], m[i, start:stop], v[i, start:stop]
            for k in range(stop - start):
                mixed = float32(0.0)
                for j in range(x.shape[0]):
                    weight = weights[i, j]
                    if weight != float32(0.0):
                        mixed += weight * source[j, k]
                if atc:
                    xs[k] = mixed
                else:
                    new_x, new_m, new_v = worker_update_f32(mixed, gs[k], ms[k], vs[k], clip[i], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    xs[k] = new_x
                    ms[k] = new_m
                    vs[k] = new_v


@njit(error_model="numpy", cache=True, forceinline=True)
def lerp_f64(start, end, weight):
    if weight < float64(0.5):
        return start + weight * (end - start)
    return end - (end - start) * (float64(1.0) - weight)


@njit(error_model="numpy", cache=True, forceinline=True)
def adamw_step_f64(param, grad, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    param = _decoupled_decay_f64(param, decay, decoupled_factor)
    exp_avg, exp_avg_sq = _adam_moments_f64(grad * gradient_sign, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    return (_adam_param_f64(param, exp_avg, exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq)


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
def worker_update_f64(param, grad, exp_avg, exp_avg_sq, clip, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    return adamw_step_f64(param, grad * clip, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, float64(1.0), step_size, inverse_bias_correction2_sqrt)


@njit(error_model="numpy", cache=True, parallel=True)
def peer_f64_mix(x, g, m, v, clip, decay, peers, self_weight, peer_weight, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    width = max(32768 // x.shape[0], 16)
    for task in prange((x.shape[1] + width - 1) // width):
        start = task * width
        stop = min(start + width, x.shape[1])
        source = np.empty((x.shape[0], stop - start), x.dtype)
        for j in range(x.shape[0]):
            xs, gs, ms, vs, ys = x[j, start:stop], g[j, start:stop], m[j, start:stop], v[j, start:stop], source[j]
            for k in range(stop - start):
                if atc:
                    y, new_m, new_v = worker_update_f64(xs[k], gs[k], ms[k], vs[k], clip[j], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    ms[k] = new_m
                    vs[k] = new_v
                else:
                    y = xs[k]
                ys[k] = y
        for i in range(x.shape[0]):
            xs, gs, ms, vs = x[i, start:stop], g[i, start:stop], m[i, start:stop], v[i, start:stop]
            own, other = source[i], source[peers[i]]
            for k in range(stop - start):
                mixed = self_weight * own[k] + peer_weight * other[k]
                if atc:
                    xs[k] = mixed
                else:
                    new_x, new_m, new_v = worker_update_f64(mixed, gs[k], ms[k], vs[k], clip[i], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    xs[k] = new_x
                    ms[k] = new_m
                    vs[k] = new_v


@njit(error_model="numpy", cache=True, parallel=True)
def complete_f64_mix(x, g, m, v, clip, decay, mean_weight, own_weight, inverse_workers, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    width = max(32768 // x.shape[0], 16)
    for task in prange((x.shape[1] + width - 1) // width):
        start = task * width
        stop = min(start + width, x.shape[1])
        source = np.empty((x.shape[0], stop - start), x.dtype)
        for j in range(x.shape[0]):
            xs, gs, ms, vs, ys = x[j, start:stop], g[j, start:stop], m[j, start:stop], v[j, start:stop], source[j]
            for k in range(stop - start):
                if atc:
                    y, new_m, new_v = worker_update_f64(xs[k], gs[k], ms[k], vs[k], clip[j], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    ms[k] = new_m
                    vs[k] = new_v
                else:
                    y = xs[k]
                ys[k] = y
        total = np.zeros(stop - start, x.dtype)
        for j in range(x.shape[0]):
            row = source[j]
            for k in range(stop - start):
                total[k] += row[k]
        for i in range(x.shape[0]):
            xs, gs, ms, vs = x[i, start:stop], g[i, start:stop], m[i, start:stop], v[i, start:stop]
            own = source[i]
            for k in range(stop - start):
                mixed = mean_weight * (total[k] * inverse_workers) + own_weight * own[k]
                if atc:
                    xs[k] = mixed
                else:
                    new_x, new_m, new_v = worker_update_f64(mixed, gs[k], ms[k], vs[k], clip[i], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    xs[k] = new_x
                    ms[k] = new_m
                    vs[k] = new_v


@njit(error_model="numpy", cache=True, parallel=True)
def dense_f64_mix(x, g, m, v, clip, decay, weights, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    width = max(32768 // x.shape[0], 16)
    for task in prange((x.shape[1] + width - 1) // width):
        start = task * width
        stop = min(start + width, x.shape[1])
        source = np.empty((x.shape[0], stop - start), x.dtype)
        for j in range(x.shape[0]):
            xs, gs, ms, vs, ys = x[j, start:stop], g[j, start:stop], m[j, start:stop], v[j, start:stop], source[j]
            for k in range(stop - start):
                if atc:
                    y, new_m, new_v = worker_update_f64(xs[k], gs[k], ms[k], vs[k], clip[j], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    ms[k] = new_m
                    vs[k] = new_v
                else:
                    y = xs[k]
                ys[k] = y
        for i in range(x.shape[0]):
            xs, gs, ms, vs = x[i, start:stop], g[i, start:stop], m[i, start:stop], v[i, start:stop]
            for k in range(stop - start):
                mixed = float64(0.0)
                for j in range(x.shape[0]):
                    weight = weights[i, j]
                    if weight != float64(0.0):
                        mixed += weight * source[j, k]
                if atc:
                    xs[k] = mixed
                else:
                    new_x, new_m, new_v = worker_update_f64(mixed, gs[k], ms[k], vs[k], clip[i], at(decay, start + k), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                    xs[k] = new_x
                    ms[k] = new_m
                    vs[k] = new_v
