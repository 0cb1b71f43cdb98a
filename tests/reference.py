"""Plain NumPy references for every elementwise formula, written from SPEC §2.

Deliberately naive: whole-array expressions with np.where for the branches, computed in
the inputs' dtype (NumPy 2 keeps Python scalars weak, so float32 stays float32).
"""

import math

import mpmath
import numpy as np

where = np.where


def _cosine(progress):
    """The cosine schedule's factor, halved before it scales the lr range (no overflow); the
    progress reduced by the period first, so that π·progress rounds no more than π·2 does."""
    return (1 + np.cos(np.pi * np.remainder(progress, 2))) / 2


REFERENCES = {
    # autograd_graph
    "node_output_count": lambda count: count + 1,
    "grad_accumulate": lambda current_grad, incoming_grad: current_grad + incoming_grad,
    "checkpointing_cost": lambda memory_bytes, recompute_flops, hardware_flops, memory_bandwidth: where(
        (hardware_flops <= 0) | (memory_bandwidth <= 0) | (memory_bytes <= 0),
        np.inf,
        (recompute_flops / hardware_flops) / (memory_bytes / memory_bandwidth),
    ),
    "memory_efficient_backward_step": lambda segment_bytes, num_segments, total_bytes: where(
        total_bytes <= 0, 0.0, segment_bytes * num_segments / total_bytes
    ),
    "topological_sort_key": lambda depth, node_index, num_nodes: depth * num_nodes + node_index,
    "loss_scale": lambda loss, scale: loss * scale,
    "unscale_grad": lambda grad, scale: where(scale <= 0, grad, grad / scale),
    "jacobian_vector_product": lambda local_jacobian, tangent: local_jacobian * tangent,
    "vector_jacobian_product": lambda upstream_grad, local_jacobian: upstream_grad * local_jacobian,
    "is_dead_node": lambda consumer_count, is_output: where((consumer_count < 0.5) & (is_output < 0.5), 1.0, 0.0),
    "gradient_norm_clip_scale": lambda grad_norm, max_norm: where(grad_norm > max_norm, max_norm / grad_norm, 1.0),
    # autograd_ops
    "grad_add": lambda upstream: upstream,
    "grad_mul": lambda other, upstream: other * upstream,
    "grad_exp": lambda x, upstream: np.exp(x) * upstream,
    "grad_log": lambda x, upstream: where(x <= 0, 0.0, upstream / x),
    "grad_relu": lambda x, upstream: where(x > 0, upstream, 0.0),
    "grad_sigmoid": lambda sigmoid_out, upstream: sigmoid_out * (1 - sigmoid_out) * upstream,
    "grad_tanh": lambda tanh_out, upstream: (1 - tanh_out * tanh_out) * upstream,
    "grad_pow": lambda x, n, upstream: where(
        ((x == 0) & (n < 1)) | ((x < 0) & (np.mod(n, 1) != 0)), 0.0, n * np.power(x, n - 1) * upstream
    ),
    "chain_rule": lambda upstream, local_grad: upstream * local_grad,
    "grad_softmax_diag": lambda softmax_i, upstream: softmax_i * (1 - softmax_i) * upstream,
    # gradient_descent
    "sgd_update": lambda param, grad, lr: param - lr * grad,
    "sgd_momentum_update": lambda param, grad, velocity, lr, momentum: param - lr * (momentum * velocity + grad),
    "adam_update": lambda param, m_hat, v_hat, lr, eps: param - lr * m_hat / (np.sqrt(v_hat) + eps),
    "adamw_update": lambda param, m_hat, v_hat, lr, eps, weight_decay: (
        param * (1 - lr * weight_decay) - lr * m_hat / (np.sqrt(v_hat) + eps)
    ),
    "rmsprop_update": lambda param, grad, sq_avg, lr, alpha, eps: (
        param - lr * grad / (np.sqrt(alpha * sq_avg + (1 - alpha) * grad * grad) + eps)
    ),
    "adagrad_update": lambda param, grad, accumulator, lr, eps: (
        param - lr * grad / (np.sqrt(accumulator + grad * grad) + eps)
    ),
    "lars_update": lambda param, grad, param_norm, grad_norm, lr, trust_coefficient, weight_decay: where(
        grad_norm + weight_decay * param_norm <= 0,
        param,
        param
        - lr
        * (trust_coefficient * param_norm / (grad_norm + weight_decay * param_norm))
        * (grad + weight_decay * param),
    ),
    "lion_update": lambda param, momentum, grad, lr, beta1, beta2, weight_decay: (
        param - lr * (np.sign(beta1 * momentum + (1 - beta1) * grad) + weight_decay * param)
    ),
    "gradient_clipping": lambda grad, grad_norm, max_norm: where(
        grad_norm > max_norm, grad * max_norm / grad_norm, grad
    ),
    "cosine_annealing_lr": lambda step, total_steps, base_lr, min_lr: where(
        total_steps <= 0,
        min_lr,
        min_lr + (base_lr - min_lr) * _cosine(np.minimum(step, total_steps) / total_steps),
    ),
}


def _largest(x):
    """1e308, or the dtype's largest finite value where 1e308 does not exist (SPEC §1)."""
    return min(1e308, float(np.finfo(np.asarray(x).dtype).max))


def _smallest(x):
    """1e-300, or the dtype's smallest normal value where 1e-300 does not exist (SPEC §1)."""
    return max(1e-300, float(np.finfo(np.asarray(x).dtype).tiny))


def _finite(x):
    return (x == x) & (np.abs(x) <= _largest(x))


REFERENCES.update(
    {
        # training_stability
        "loss_scale_adjust": lambda scale, overflow, growth_factor, backoff_factor, growth_interval, steps_since_overflow: (  # noqa: E501
            where(
                overflow > 0.5,
                scale / backoff_factor,
                where(
                    (steps_since_overflow + 1 >= growth_interval) & _finite(scale * growth_factor),
                    scale * growth_factor,
                    scale,
                ),
            )
        ),
        "is_finite_check": lambda x: where(_finite(x), 1.0, 0.0),
        "grad_norm_finite": lambda grad_norm: where((grad_norm == grad_norm) & (grad_norm <= 1e8), 1.0, 0.0),
        "gradient_accumulation_step": lambda accumulated, micro_grad, num_micro_batches: (
            accumulated + micro_grad / num_micro_batches
        ),
        "linear_warmup_lr": lambda step, warmup_steps, base_lr: where(
            warmup_steps <= 0,
            base_lr,
            where((step + 1) / warmup_steps >= 1, base_lr, base_lr * ((step + 1) / warmup_steps)),
        ),
        "warmup_cosine_lr": lambda step, warmup_steps, total_steps, base_lr, min_lr: where(
            step < warmup_steps,
            REFERENCES["linear_warmup_lr"](step, warmup_steps, base_lr),
            where(
                step >= total_steps,
                min_lr,
                min_lr + (base_lr - min_lr) * _cosine((step - warmup_steps) / (total_steps - warmup_steps)),
            ),
        ),
        "ema_update": lambda ema, value, decay: decay * ema + (1 - decay) * value,
        "overflow_skip_step": lambda step_count, overflow: where(overflow > 0.5, step_count, step_count + 1),
        "loss_spike_detector": lambda loss, running_avg, threshold: where(
            ~_finite(loss), 1.0, where(running_avg <= 0, 0.0, where(loss / running_avg > threshold, 1.0, 0.0))
        ),
        "chinchilla_step_count": lambda num_params, tokens_per_step: np.ceil(20 * num_params / tokens_per_step),
        # numerical_stability (elementwise; the log-space ones use the mpmath references below)
        "relative_error": lambda approx, exact: where(
            np.abs(exact) < _smallest(exact), np.abs(approx - exact), np.abs(approx - exact) / np.abs(exact)
        ),
        "safe_divide": lambda num, den, default: where(np.abs(den) < _smallest(den), default, num / den),
    }
)


# -- high-precision references: mpmath at 60 digits, rounded to the dtype --------------------

mpmath.mp.dps = 60


def _exact(function, *arrays):
    """Apply an mpmath function elementwise; IEEE special cases are the function's own."""
    arrays = np.broadcast_arrays(*(np.asarray(a) for a in arrays))
    dtype = np.result_type(*arrays)
    out = np.empty(arrays[0].shape, dtype)
    for index in np.ndindex(out.shape):
        out[index] = function(*(float(a[index]) for a in arrays))
    return out


def _mp_sigmoid(x):
    if math.isnan(x):
        return x
    return float(1 / (1 + mpmath.exp(-mpmath.mpf(x))))


def _mp_softplus(x):
    if math.isnan(x) or math.isinf(x):
        return x if x > 0 or math.isnan(x) else 0.0
    return float(mpmath.log1p(mpmath.exp(mpmath.mpf(x))))


def _mp_log_add_exp(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if math.isinf(a) or math.isinf(b):
        return max(a, b)
    # The same identity as the kernel, but exact: log(exp(a) + exp(b)) at 60 digits would
    # round exp(1e-201) to 1 and lose the answer.
    a, b = mpmath.mpf(a), mpmath.mpf(b)
    return float(max(a, b) + mpmath.log1p(mpmath.exp(-abs(a - b))))


REFERENCES.update(
    {
        "sigmoid_stable": lambda x: _exact(_mp_sigmoid, x),
        "softplus": lambda x: _exact(_mp_softplus, x),
        "log_sigmoid": lambda x: -_exact(_mp_softplus, -np.asarray(x)),
        "log_add_exp": lambda a, b: _exact(_mp_log_add_exp, a, b),
    }
)
