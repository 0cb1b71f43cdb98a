"""Training-loop guards: loss scaling, finiteness checks, schedules, EMA, spike detection."""

from steadystep.kernels._numerics import ceil, cospi, is_finite


def loss_scale_adjust(scale, overflow, growth_factor, backoff_factor, growth_interval, steps_since_overflow):
    """Dynamic AMP loss scale after one step (the caller resets its counter after a change).

    scale/backoff_factor if overflow > 0.5; scale·growth_factor if steps_since_overflow + 1 ≥ growth_interval
    and that is finite; else scale
    """
    if overflow > 0.5:
        return scale / backoff_factor
    if steps_since_overflow + 1.0 >= growth_interval:
        grown = scale * growth_factor
        if is_finite(grown):
            return grown
    return scale


def is_finite_check(x):
    """1 for a finite value, 0 for NaN or ±inf.

    1 if x == x and |x| ≤ 1e308 else 0 (1e308: the dtype's largest finite value)
    """
    if is_finite(x):
        return 1.0
    return 0.0


def grad_norm_finite(grad_norm):
    """1 for a usable gradient norm, 0 for NaN or one above 1e8 (a health signal, not overflow).

    1 if grad_norm == grad_norm and grad_norm ≤ 1e8 else 0
    """
    if grad_norm == grad_norm and grad_norm <= 1e8:
        return 1.0
    return 0.0


def gradient_accumulation_step(accumulated, micro_grad, num_micro_batches):
    """Accumulator after folding in one micro-batch's gradient.

    accumulated + micro_grad/num_micro_batches
    """
    return accumulated + micro_grad / num_micro_batches


def linear_warmup_lr(step, warmup_steps, base_lr):
    """Learning rate ramping linearly to base_lr over warmup_steps (step is zero-based).

    base_lr·min(1, (step+1)/warmup_steps); base_lr if warmup_steps ≤ 0
    """
    if warmup_steps <= 0.0:
        return base_lr
    ratio = (step + 1.0) / warmup_steps
    if ratio >= 1.0:
        return base_lr
    return base_lr * ratio  # a NaN step propagates (min() would hide it)


def warmup_cosine_lr(step, warmup_steps, total_steps, base_lr, min_lr):
    """Linear warmup, then cosine decay from base_lr to min_lr, then min_lr.

    linear_warmup_lr for step < warmup_steps;
    min_lr + (base_lr − min_lr)·(1 + cos(π·(step − warmup_steps)/(total_steps − warmup_steps)))/2 until total_steps;
    min_lr from total_steps on
    """
    if step < warmup_steps:
        return linear_warmup_lr(step, warmup_steps, base_lr)
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (base_lr - min_lr) * ((1.0 + cospi(progress)) / 2.0)


def ema_update(ema, value, decay):
    """Exponential moving average after one more value.

    decay·ema + (1 − decay)·value
    """
    return decay * ema + (1.0 - decay) * value


def overflow_skip_step(step_count, overflow):
    """Optimizer step counter: an overflowed step does not count.

    step_count if overflow > 0.5 else step_count + 1
    """
    if overflow > 0.5:
        return step_count
    return step_count + 1.0


def loss_spike_detector(loss, running_avg, threshold):
    """1 when the loss spikes above threshold × its running average, or is not finite.

    1 if loss is not finite; 0 if running_avg ≤ 0; 1 if loss/running_avg > threshold (strict) else 0
    """
    if not is_finite(loss):
        return 1.0
    if running_avg <= 0.0:
        return 0.0
    if loss / running_avg > threshold:
        return 1.0
    return 0.0


def chinchilla_step_count(num_params, tokens_per_step):
    """Steps for a compute-optimal run: about 20 training tokens per parameter (Chinchilla).

    ceil(20·num_params/tokens_per_step), tokens_per_step = workers·micro-batch·context length
    """
    return ceil(20.0 * num_params / tokens_per_step)
