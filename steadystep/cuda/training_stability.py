"""CUDA kernels generated from steadystep/kernels/training_stability.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

from numba import cuda
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cuda.primitives import ROW_THREADS, at, cast_like, math, put, cospi_f32, cospi_f64  # noqa: F401

# Numba's cache checks only this file: a change to the primitives these kernels inline must
# rewrite it, and test_codegen fails until codegen has
PRIMITIVES_DIGEST = "8081250d6df4c601"


@cuda.jit(device=True, inline="always")
def is_finite_f32(x):
    return x == x and abs(x) <= float32(3.4028234663852886e+38)


@cuda.jit(device=True, inline="always")
def floor_f32(x):
    if not is_finite_f32(x):
        return x
    return x - x % float32(1.0)


@cuda.jit(device=True, inline="always")
def ceil_f32(x):
    return -floor_f32(-x)


@cuda.jit(device=True, inline="always")
def loss_scale_adjust_f32(scale, overflow, growth_factor, backoff_factor, growth_interval, steps_since_overflow):
    if overflow > float32(0.5):
        return scale / backoff_factor
    if steps_since_overflow + float32(1.0) >= growth_interval:
        grown = scale * growth_factor
        if is_finite_f32(grown):
            return grown
    return scale


@cuda.jit(cache=True)
def loss_scale_adjust_f32_kernel(out, scale, overflow, growth_factor, backoff_factor, growth_interval, steps_since_overflow):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = loss_scale_adjust_f32(at(scale, i), at(overflow, i), at(growth_factor, i), at(backoff_factor, i), at(growth_interval, i), at(steps_since_overflow, i))


@cuda.jit(device=True, inline="always")
def is_finite_check_f32(x):
    if is_finite_f32(x):
        return float32(1.0)
    return float32(0.0)


@cuda.jit(cache=True)
def is_finite_check_f32_kernel(out, x):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = is_finite_check_f32(at(x, i))


@cuda.jit(device=True, inline="always")
def grad_norm_finite_f32(grad_norm):
    if grad_norm == grad_norm and grad_norm <= float32(100000000.0):
        return float32(1.0)
    return float32(0.0)


@cuda.jit(cache=True)
def grad_norm_finite_f32_kernel(out, grad_norm):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_norm_finite_f32(at(grad_norm, i))


@cuda.jit(device=True, inline="always")
def gradient_accumulation_step_f32(accumulated, micro_grad, num_micro_batches):
    return accumulated + micro_grad / num_micro_batches


@cuda.jit(cache=True)
def gradient_accumulation_step_f32_kernel(out, accumulated, micro_grad, num_micro_batches):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = gradient_accumulation_step_f32(at(accumulated, i), at(micro_grad, i), at(num_micro_batches, i))


@cuda.jit(device=True, inline="always")
def linear_warmup_lr_f32(step, warmup_steps, base_lr):
    if warmup_steps <= float32(0.0):
        return base_lr
    ratio = (step + float32(1.0)) / warmup_steps
    if ratio >= float32(1.0):
        return base_lr
    return base_lr * ratio


@cuda.jit(cache=True)
def linear_warmup_lr_f32_kernel(out, step, warmup_steps, base_lr):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = linear_warmup_lr_f32(at(step, i), at(warmup_steps, i), at(base_lr, i))


@cuda.jit(device=True, inline="always")
def warmup_cosine_lr_f32(step, warmup_steps, total_steps, base_lr, min_lr):
    if step < warmup_steps:
        return linear_warmup_lr_f32(step, warmup_steps, base_lr)
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (base_lr - min_lr) * ((float32(1.0) + cospi_f32(progress)) / float32(2.0))


@cuda.jit(cache=True)
def warmup_cosine_lr_f32_kernel(out, step, warmup_steps, total_steps, base_lr, min_lr):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = warmup_cosine_lr_f32(at(step, i), at(warmup_steps, i), at(total_steps, i), at(base_lr, i), at(min_lr, i))


@cuda.jit(device=True, inline="always")
def ema_update_f32(ema, value, decay):
    return decay * ema + (float32(1.0) - decay) * value


@cuda.jit(cache=True)
def ema_update_f32_kernel(out, ema, value, decay):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = ema_update_f32(at(ema, i), at(value, i), at(decay, i))


@cuda.jit(device=True, inline="always")
def overflow_skip_step_f32(step_count, overflow):
    if overflow > float32(0.5):
        return step_count
    return step_count + float32(1.0)


@cuda.jit(cache=True)
def overflow_skip_step_f32_kernel(out, step_count, overflow):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = overflow_skip_step_f32(at(step_count, i), at(overflow, i))


@cuda.jit(device=True, inline="always")
def loss_spike_detector_f32(loss, running_avg, threshold):
    if not is_finite_f32(loss):
        return float32(1.0)
    if running_avg <= float32(0.0):
        return float32(0.0)
    if loss / running_avg > threshold:
        return float32(1.0)
    return float32(0.0)


@cuda.jit(cache=True)
def loss_spike_detector_f32_kernel(out, loss, running_avg, threshold):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = loss_spike_detector_f32(at(loss, i), at(running_avg, i), at(threshold, i))


@cuda.jit(device=True, inline="always")
def chinchilla_step_count_f32(num_params, tokens_per_step):
    return ceil_f32(float32(20.0) * num_params / tokens_per_step)


@cuda.jit(cache=True)
def chinchilla_step_count_f32_kernel(out, num_params, tokens_per_step):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = chinchilla_step_count_f32(at(num_params, i), at(tokens_per_step, i))


@cuda.jit(device=True, inline="always")
def is_finite_f64(x):
    return x == x and abs(x) <= float64(1e+308)


@cuda.jit(device=True, inline="always")
def floor_f64(x):
    if not is_finite_f64(x):
        return x
    return x - x % float64(1.0)


@cuda.jit(device=True, inline="always")
def ceil_f64(x):
    return -floor_f64(-x)


@cuda.jit(device=True, inline="always")
def loss_scale_adjust_f64(scale, overflow, growth_factor, backoff_factor, growth_interval, steps_since_overflow):
    if overflow > float64(0.5):
        return scale / backoff_factor
    if steps_since_overflow + float64(1.0) >= growth_interval:
        grown = scale * growth_factor
        if is_finite_f64(grown):
            return grown
    return scale


@cuda.jit(cache=True)
def loss_scale_adjust_f64_kernel(out, scale, overflow, growth_factor, backoff_factor, growth_interval, steps_since_overflow):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = loss_scale_adjust_f64(at(scale, i), at(overflow, i), at(growth_factor, i), at(backoff_factor, i), at(growth_interval, i), at(steps_since_overflow, i))


@cuda.jit(device=True, inline="always")
def is_finite_check_f64(x):
    if is_finite_f64(x):
        return float64(1.0)
    return float64(0.0)


@cuda.jit(cache=True)
def is_finite_check_f64_kernel(out, x):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = is_finite_check_f64(at(x, i))


@cuda.jit(device=True, inline="always")
def grad_norm_finite_f64(grad_norm):
    if grad_norm == grad_norm and grad_norm <= float64(100000000.0):
        return float64(1.0)
    return float64(0.0)


@cuda.jit(cache=True)
def grad_norm_finite_f64_kernel(out, grad_norm):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_norm_finite_f64(at(grad_norm, i))


@cuda.jit(device=True, inline="always")
def gradient_accumulation_step_f64(accumulated, micro_grad, num_micro_batches):
    return accumulated + micro_grad / num_micro_batches


@cuda.jit(cache=True)
def gradient_accumulation_step_f64_kernel(out, accumulated, micro_grad, num_micro_batches):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = gradient_accumulation_step_f64(at(accumulated, i), at(micro_grad, i), at(num_micro_batches, i))


@cuda.jit(device=True, inline="always")
def linear_warmup_lr_f64(step, warmup_steps, base_lr):
    if warmup_steps <= float64(0.0):
        return base_lr
    ratio = (step + float64(1.0)) / warmup_steps
    if ratio >= float64(1.0):
        return base_lr
    return base_lr * ratio


@cuda.jit(cache=True)
def linear_warmup_lr_f64_kernel(out, step, warmup_steps, base_lr):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = linear_warmup_lr_f64(at(step, i), at(warmup_steps, i), at(base_lr, i))


@cuda.jit(device=True, inline="always")
def warmup_cosine_lr_f64(step, warmup_steps, total_steps, base_lr, min_lr):
    if step < warmup_steps:
        return linear_warmup_lr_f64(step, warmup_steps, base_lr)
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (base_lr - min_lr) * ((float64(1.0) + cospi_f64(progress)) / float64(2.0))


@cuda.jit(cache=True)
def warmup_cosine_lr_f64_kernel(out, step, warmup_steps, total_steps, base_lr, min_lr):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = warmup_cosine_lr_f64(at(step, i), at(warmup_steps, i), at(total_steps, i), at(base_lr, i), at(min_lr, i))


@cuda.jit(device=True, inline="always")
def ema_update_f64(ema, value, decay):
    return decay * ema + (float64(1.0) - decay) * value


@cuda.jit(cache=True)
def ema_update_f64_kernel(out, ema, value, decay):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = ema_update_f64(at(ema, i), at(value, i), at(decay, i))


@cuda.jit(device=True, inline="always")
def overflow_skip_step_f64(step_count, overflow):
    if overflow > float64(0.5):
        return step_count
    return step_count + float64(1.0)


@cuda.jit(cache=True)
def overflow_skip_step_f64_kernel(out, step_count, overflow):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = overflow_skip_step_f64(at(step_count, i), at(overflow, i))


@cuda.jit(device=True, inline="always")
def loss_spike_detector_f64(loss, running_avg, threshold):
    if not is_finite_f64(loss):
        return float64(1.0)
    if running_avg <= float64(0.0):
        return float64(0.0)
    if loss / running_avg > threshold:
        return float64(1.0)
    return float64(0.0)


@cuda.jit(cache=True)
def loss_spike_detector_f64_kernel(out, loss, running_avg, threshold):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = loss_spike_detector_f64(at(loss, i), at(running_avg, i), at(threshold, i))


@cuda.jit(device=True, inline="always")
def chinchilla_step_count_f64(num_params, tokens_per_step):
    return ceil_f64(float64(20.0) * num_params / tokens_per_step)


@cuda.jit(cache=True)
def chinchilla_step_count_f64_kernel(out, num_params, tokens_per_step):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = chinchilla_step_count_f64(at(num_params, i), at(tokens_per_step, i))
