"""CUDA kernels generated from steadystep/kernels/decentral.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

from numba import cuda
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cuda.primitives import ROW_THREADS, at, cast_like, math, put  # noqa: F401

# Numba's cache checks only this file: a change to the primitives these kernels inline must
# rewrite it, and test_codegen fails until codegen has
PRIMITIVES_DIGEST = "8081250d6df4c601"


@cuda.jit(device=True, inline="always")
def lerp_f32(start, end, weight):
    if weight < float32(0.5):
        return start + weight * (end - start)
    return end - (end - start) * (float32(1.0) - weight)


@cuda.jit(device=True, inline="always")
def adamw_step_f32(param, grad, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    param = _decoupled_decay_f32(param, decay, decoupled_factor)
    exp_avg, exp_avg_sq = _adam_moments_f32(grad * gradient_sign, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    return (_adam_param_f32(param, exp_avg, exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq)


@cuda.jit(device=True, inline="always")
def _decoupled_decay_f32(param, decay, decoupled_factor):
    factor = float32(1.0)
    if decay != float32(0.0):
        factor = decoupled_factor
    return param * factor


@cuda.jit(device=True, inline="always")
def _adam_moments_f32(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2):
    return (lerp_f32(exp_avg, grad, one_minus_beta1), exp_avg_sq * beta2 + one_minus_beta2 * grad * grad)


@cuda.jit(device=True, inline="always")
def _adam_param_f32(param, exp_avg, second_moment, eps, step_size, inverse_bias_correction2_sqrt):
    denominator = math.sqrt(second_moment) * inverse_bias_correction2_sqrt + eps
    return param + -step_size * exp_avg / denominator


@cuda.jit(device=True, inline="always")
def worker_update_f32(param, grad, exp_avg, exp_avg_sq, clip, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    return adamw_step_f32(param, grad * clip, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, float32(1.0), step_size, inverse_bias_correction2_sqrt)


@cuda.jit(cache=True)
def peer_f32_mix(x, g, m, v, clip, decay, peers, self_weight, peer_weight, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    source = cuda.shared.array(0, x.dtype)
    lane = cuda.threadIdx.x
    lanes = cuda.blockDim.x
    for d in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        for j in range(x.shape[0]):
            if atc:
                y, new_m, new_v = worker_update_f32(x[j, d], g[j, d], m[j, d], v[j, d], clip[j], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                m[j, d] = new_m
                v[j, d] = new_v
            else:
                y = x[j, d]
            source[j * lanes + lane] = y
        for i in range(x.shape[0]):
            mixed = self_weight * source[i * lanes + lane] + peer_weight * source[peers[i] * lanes + lane]
            if atc:
                x[i, d] = mixed
            else:
                new_x, new_m, new_v = worker_update_f32(mixed, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                x[i, d] = new_x
                m[i, d] = new_m
                v[i, d] = new_v


@cuda.jit(cache=True)
def complete_f32_mix(x, g, m, v, clip, decay, mean_weight, own_weight, inverse_workers, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    source = cuda.shared.array(0, x.dtype)
    lane = cuda.threadIdx.x
    lanes = cuda.blockDim.x
    for d in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        for j in range(x.shape[0]):
            if atc:
                y, new_m, new_v = worker_update_f32(x[j, d], g[j, d], m[j, d], v[j, d], clip[j], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                m[j, d] = new_m
                v[j, d] = new_v
            else:
                y = x[j, d]
            source[j * lanes + lane] = y
        total = float32(0.0)
        for j in range(x.shape[0]):
            total += source[j * lanes + lane]
        for i in range(x.shape[0]):
            mixed = mean_weight * (total * inverse_workers) + own_weight * source[i * lanes + lane]
            if atc:
                x[i, d] = mixed
            else:
                new_x, new_m, new_v = worker_update_f32(mixed, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                x[i, d] = new_x
                m[i, d] = new_m
                v[i, d] = new_v


@cuda.jit(cache=True)
def dense_f32_mix(x, g, m, v, clip, decay, weights, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    source = cuda.shared.array(0, x.dtype)
    lane = cuda.threadIdx.x
    lanes = cuda.blockDim.x
    for d in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        for j in range(x.shape[0]):
            if atc:
                y, new_m, new_v = worker_update_f32(x[j, d], g[j, d], m[j, d], v[j, d], clip[j], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                m[j, d] = new_m
                v[j, d] = new_v
            else:
                y = x[j, d]
            source[j * lanes + lane] = y
        for i in range(x.shape[0]):
            mixed = float32(0.0)
            for j in range(x.shape[0]):
                weight = weights[i, j]
                if weight != float32(0.0):
                    mixed += weight * source[j * lanes + lane]
            if atc:
                x[i, d] = mixed
            else:
                new_x, new_m, new_v = worker_update_f32(mixed, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                x[i, d] = new_x
                m[i, d] = new_m
                v[i, d] = new_v


@cuda.jit(device=True, inline="always")
def lerp_f64(start, end, weight):
    if weight < float64(0.5):
        return start + weight * (end - start)
    return end - (end - start) * (float64(1.0) - weight)


@cuda.jit(device=True, inline="always")
def adamw_step_f64(param, grad, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, gradient_sign, step_size, inverse_bias_correction2_sqrt):
    param = _decoupled_decay_f64(param, decay, decoupled_factor)
    exp_avg, exp_avg_sq = _adam_moments_f64(grad * gradient_sign, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    return (_adam_param_f64(param, exp_avg, exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt), exp_avg, exp_avg_sq)


@cuda.jit(device=True, inline="always")
def _decoupled_decay_f64(param, decay, decoupled_factor):
    factor = float64(1.0)
    if decay != float64(0.0):
        factor = decoupled_factor
    return param * factor


@cuda.jit(device=True, inline="always")
def _adam_moments_f64(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2):
    return (lerp_f64(exp_avg, grad, one_minus_beta1), exp_avg_sq * beta2 + one_minus_beta2 * grad * grad)


@cuda.jit(device=True, inline="always")
def _adam_param_f64(param, exp_avg, second_moment, eps, step_size, inverse_bias_correction2_sqrt):
    denominator = math.sqrt(second_moment) * inverse_bias_correction2_sqrt + eps
    return param + -step_size * exp_avg / denominator


@cuda.jit(device=True, inline="always")
def worker_update_f64(param, grad, exp_avg, exp_avg_sq, clip, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    return adamw_step_f64(param, grad * clip, exp_avg, exp_avg_sq, decay, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, float64(1.0), step_size, inverse_bias_correction2_sqrt)


@cuda.jit(cache=True)
def peer_f64_mix(x, g, m, v, clip, decay, peers, self_weight, peer_weight, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    source = cuda.shared.array(0, x.dtype)
    lane = cuda.threadIdx.x
    lanes = cuda.blockDim.x
    for d in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        for j in range(x.shape[0]):
            if atc:
                y, new_m, new_v = worker_update_f64(x[j, d], g[j, d], m[j, d], v[j, d], clip[j], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                m[j, d] = new_m
                v[j, d] = new_v
            else:
                y = x[j, d]
            source[j * lanes + lane] = y
        for i in range(x.shape[0]):
            mixed = self_weight * source[i * lanes + lane] + peer_weight * source[peers[i] * lanes + lane]
            if atc:
                x[i, d] = mixed
            else:
                new_x, new_m, new_v = worker_update_f64(mixed, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                x[i, d] = new_x
                m[i, d] = new_m
                v[i, d] = new_v


@cuda.jit(cache=True)
def complete_f64_mix(x, g, m, v, clip, decay, mean_weight, own_weight, inverse_workers, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    source = cuda.shared.array(0, x.dtype)
    lane = cuda.threadIdx.x
    lanes = cuda.blockDim.x
    for d in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        for j in range(x.shape[0]):
            if atc:
                y, new_m, new_v = worker_update_f64(x[j, d], g[j, d], m[j, d], v[j, d], clip[j], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                m[j, d] = new_m
                v[j, d] = new_v
            else:
                y = x[j, d]
            source[j * lanes + lane] = y
        total = float64(0.0)
        for j in range(x.shape[0]):
            total += source[j * lanes + lane]
        for i in range(x.shape[0]):
            mixed = mean_weight * (total * inverse_workers) + own_weight * source[i * lanes + lane]
            if atc:
                x[i, d] = mixed
            else:
                new_x, new_m, new_v = worker_update_f64(mixed, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                x[i, d] = new_x
                m[i, d] = new_m
                v[i, d] = new_v


@cuda.jit(cache=True)
def dense_f64_mix(x, g, m, v, clip, decay, weights, atc, decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt):
    source = cuda.shared.array(0, x.dtype)
    lane = cuda.threadIdx.x
    lanes = cuda.blockDim.x
    for d in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        for j in range(x.shape[0]):
            if atc:
                y, new_m, new_v = worker_update_f64(x[j, d], g[j, d], m[j, d], v[j, d], clip[j], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                m[j, d] = new_m
                v[j, d] = new_v
            else:
                y = x[j, d]
            source[j * lanes + lane] = y
        for i in range(x.shape[0]):
            mixed = float64(0.0)
            for j in range(x.shape[0]):
                weight = weights[i, j]
                if weight != float64(0.0):
                    mixed += weight * source[j * lanes + lane]
            if atc:
                x[i, d] = mixed
            else:
                new_x, new_m, new_v = worker_update_f64(mixed, g[i, d], m[i, d], v[i, d], clip[i], at(decay, d), decoupled_factor, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inverse_bias_correction2_sqrt)
                x[i, d] = new_x
                m[i, d] = new_m
                v[i, d] = new_v
