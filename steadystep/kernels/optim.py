"""Per-element updates of the fused optimizer steps, with torch.optim's semantics and
evaluation order (so float64 trajectories match torch to rounding), plus LARS and Lion."""

import math

from steadystep.kernels import Blockwise, Step
from steadystep.kernels._numerics import adam_parameter, floor, is_finite, lerp, maximum, sign
from steadystep.kernels.autograd_graph import grad_accumulate
from steadystep.kernels.training_stability import ema_update


def _l2_gradient(grad, param, weight_decay, gradient_sign):
    """The gradient torch's coupled-decay optimizers use: gradient_sign = −1 (maximize) flips
    it, L2 decay adds to it.

    maximize arrives as a factor of ±1 rather than a flag: g·(−1) is −g for every value
    (NaN's sign bit aside), and each loop-invariant branch stays inside the vectorized loop
    as a compare and jump; one fewer speeds SGD with momentum up in cache (BENCHMARKS.md).
    """
    grad = grad * gradient_sign
    if weight_decay != 0.0:
        grad = grad + weight_decay * param
    return grad


def sgd_step(
    param, grad, momentum_buffer, decay, lr, momentum, dampening, weight_decay, nesterov, gradient_sign, first_step
):
    """SGD with momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD).

    d = g + λ·p; b ← d on the first step, else μ·b + (1 − τ)·d; d ← d + μ·b (Nesterov) or b; p ← p − lr·d
    """
    direction = _l2_gradient(grad, param, weight_decay * decay, gradient_sign)
    if momentum != 0.0:
        if first_step != 0.0:
            momentum_buffer = direction
        else:
            momentum_buffer = momentum_buffer * momentum + (1.0 - dampening) * direction
        if nesterov != 0.0:
            direction = direction + momentum * momentum_buffer
        else:
            direction = momentum_buffer
    return param - lr * direction, momentum_buffer


def adam_step(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    decay,
    weight_decay,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    gradient_sign,
    step_size,
    inverse_bias_correction2_sqrt,
):
    """Adam with L2 weight decay added to the gradient (torch.optim.Adam).

    g ← g + λ·p; m ← m + (1 − β1)(g − m); v ← β2·v + (1 − β2)·g²; p ← p − (lr/(1 − β1ᵗ))·m/(√v/√(1 − β2ᵗ) + ε)
    """
    grad = _l2_gradient(grad, param, weight_decay * decay, gradient_sign)
    exp_avg, exp_avg_sq = _adam_moments(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    return (
        adam_parameter(param, exp_avg, exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt),
        exp_avg,
        exp_avg_sq,
    )


def adam_amsgrad_step(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    max_exp_avg_sq,
    decay,
    weight_decay,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    gradient_sign,
    step_size,
    inverse_bias_correction2_sqrt,
):
    """Adam with AMSGrad: the step divides by the running maximum of v (torch.optim.Adam, amsgrad=True).

    g ← g + λ·p; m, v as in Adam; v̂ ← max(v̂, v); p ← p − (lr/(1 − β1ᵗ))·m/(√v̂/√(1 − β2ᵗ) + ε)
    """
    grad = _l2_gradient(grad, param, weight_decay * decay, gradient_sign)
    exp_avg, exp_avg_sq = _adam_moments(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2)
    max_exp_avg_sq = maximum(max_exp_avg_sq, exp_avg_sq)
    return (
        adam_parameter(param, exp_avg, max_exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt),
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
    )


def adamw_step(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    decay,
    decoupled_factor,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    gradient_sign,
    step_size,
    inverse_bias_correction2_sqrt,
):
    """AdamW: decoupled weight decay, decoupled_factor = 1 − lr·λ (torch.optim.AdamW).

    p ← p·(1 − lr·λ); m ← m + (1 − β1)(g − m); v ← β2·v + (1 − β2)·g²; p ← p − (lr/(1 − β1ᵗ))·m/(√v/√(1 − β2ᵗ) + ε)
    """
    param = _decoupled_decay(param, decay, decoupled_factor)
    exp_avg, exp_avg_sq = _adam_moments(
        grad * gradient_sign, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2
    )
    return (
        adam_parameter(param, exp_avg, exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt),
        exp_avg,
        exp_avg_sq,
    )


def adamw_amsgrad_step(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    max_exp_avg_sq,
    decay,
    decoupled_factor,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    gradient_sign,
    step_size,
    inverse_bias_correction2_sqrt,
):
    """AdamW with AMSGrad: the step divides by the running maximum of v (torch.optim.AdamW, amsgrad=True).

    p ← p·(1 − lr·λ); m, v as in AdamW; v̂ ← max(v̂, v); p ← p − (lr/(1 − β1ᵗ))·m/(√v̂/√(1 − β2ᵗ) + ε)
    """
    param = _decoupled_decay(param, decay, decoupled_factor)
    exp_avg, exp_avg_sq = _adam_moments(
        grad * gradient_sign, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2
    )
    max_exp_avg_sq = maximum(max_exp_avg_sq, exp_avg_sq)
    return (
        adam_parameter(param, exp_avg, max_exp_avg_sq, eps, step_size, inverse_bias_correction2_sqrt),
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
    )


def adam_schedule_step(step, step_size, inverse_bias_correction2_sqrt, lr, one_minus_beta1, one_minus_beta2):
    """Adam's step count and bias-corrected factors, advanced where the count lives (a count on the device).

    A count that is not a whole number ≥ 0 (negative, NaN, inf, 2.5) stays as it is and
    makes the step size NaN, so the Adam step that reads it writes nothing.

    t ← t + 1; step_size = lr/(1 − β1ᵗ); 1/√(1 − β2ᵗ), with 1 − βᵗ = −expm1(t·log1p(−(1 − β)))
    """
    if not (step >= 0.0 and step < math.inf and floor(step) == step):
        return step, math.nan, math.nan
    # From 1 − β (exact in float64 on the host) rather than β: in float32, 1 − 0.999ᵗ
    # computed from 0.999 is off by 1.3e−5 at t = 1, this way by an ulp or two.
    step = step + 1.0
    bias_correction1 = -math.expm1(step * math.log1p(-one_minus_beta1))
    bias_correction2 = -math.expm1(step * math.log1p(-one_minus_beta2))
    return step, lr / bias_correction1, 1.0 / math.sqrt(bias_correction2)


def _decoupled_decay(param, decay, decoupled_factor):
    """AdamW's decay p·(1 − lr·λ), or p itself where the mask says no decay.

    Choosing the factor (a blend) rather than branching around the multiplication keeps
    a loop-invariant test out of the vectorized loop, which makes the in-cache step about
    a quarter faster; multiplying by 1 leaves an undecayed parameter bit for bit as it was.
    """
    factor = 1.0
    if decay != 0.0:
        factor = decoupled_factor
    return param * factor


def _adam_moments(grad, exp_avg, exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2):
    """Adam's moments, in torch's evaluation order.

    The host computes 1 − β1 and 1 − β2 in float64, as torch does: in float32, 1 − 0.999
    is off by 1.3e−5.
    """
    return lerp(exp_avg, grad, one_minus_beta1), exp_avg_sq * beta2 + one_minus_beta2 * grad * grad


def rmsprop_step(
    param,
    grad,
    square_avg,
    grad_avg,
    momentum_buffer,
    decay,
    lr,
    alpha,
    one_minus_alpha,
    eps,
    weight_decay,
    momentum,
    centered,
    gradient_sign,
):
    """RMSprop with momentum, centering and L2 weight decay (torch.optim.RMSprop).

    The host computes 1 − α in float64, as torch does. torch's addcmul is fused, so its
    s − ḡ² stays +inf when s is +inf and a finite ḡ² overflows; the check keeps that (not
    inf − inf), while an infinite or NaN ḡ still gives NaN, as a fused multiply-add does.

    s ← α·s + (1 − α)·g²; a = √(s − ḡ²) + ε with ḡ ← ḡ + (1 − α)(g − ḡ) (centered) or √s + ε;
    b ← μ·b + g/a, p ← p − lr·b (momentum) or p ← p − lr·g/a
    """
    grad = _l2_gradient(grad, param, weight_decay * decay, gradient_sign)
    square_avg = square_avg * alpha + one_minus_alpha * grad * grad
    variance = square_avg
    if centered != 0.0:
        grad_avg = lerp(grad_avg, grad, one_minus_alpha)
        if square_avg < math.inf or not is_finite(grad_avg):
            variance = square_avg + -1.0 * grad_avg * grad_avg
    average = math.sqrt(variance) + eps
    if momentum > 0.0:
        momentum_buffer = momentum_buffer * momentum + grad / average
        return param - lr * momentum_buffer, square_avg, grad_avg, momentum_buffer
    return param + -lr * grad / average, square_avg, grad_avg, momentum_buffer


def adagrad_step(param, grad, state_sum, decay, clr, eps, weight_decay, gradient_sign):
    """AdaGrad with L2 weight decay; clr = lr/(1 + (t − 1)·lr_decay) (torch.optim.Adagrad).

    s ← s + g²; p ← p − clr·g/(√s + ε)
    """
    grad = _l2_gradient(grad, param, weight_decay * decay, gradient_sign)
    state_sum = state_sum + grad * grad
    return param + -clr * grad / (math.sqrt(state_sum) + eps), state_sum


def lars_trust_ratio(param_sum_squares, grad_sum_squares, trust_coefficient, weight_decay, eps):
    """LARS's layer-wise trust ratio for one parameter tensor, from its squared norms.

    trust_coefficient·‖w‖/(‖g‖ + weight_decay·‖w‖ + eps)
    """
    param_norm = math.sqrt(param_sum_squares)
    return trust_coefficient * param_norm / (math.sqrt(grad_sum_squares) + weight_decay * param_norm + eps)


def lars_step(param, grad, momentum_buffer, trust_ratio, tensor_weight_decay, lr, momentum, gradient_sign):
    """LARS: the tensor's trust ratio scales the decayed gradient; optional heavy-ball momentum.
    Both the ratio and λ (the weight decay, or 0 for a tensor the mask leaves out) are per tensor.

    u = ratio·(g + λ·p); b ← μ·b + u (if μ ≠ 0) and u ← b; p ← p − lr·u
    """
    update = trust_ratio * _l2_gradient(grad, param, tensor_weight_decay, gradient_sign)
    if momentum != 0.0:
        momentum_buffer = momentum * momentum_buffer + update
        update = momentum_buffer
    return param - lr * update, momentum_buffer


def lion_step(
    param, grad, exp_avg, decay, lr, beta1, one_minus_beta1, beta2, one_minus_beta2, weight_decay, gradient_sign
):
    """Lion: the seed's lion_update, then the momentum moves with beta2 (optax / the paper).

    The host computes 1 − β1 and 1 − β2 in float64, as for Adam: in float32, 1 − 0.99 is
    8.6 ulp off, and the moments would drift from a float64-derived reference.

    p ← p − lr·(sign(β1·m + (1 − β1)·g) + λ·p); m ← β2·m + (1 − β2)·g
    """
    grad = grad * gradient_sign
    direction = sign(beta1 * exp_avg + one_minus_beta1 * grad)
    param = param - lr * (direction + weight_decay * decay * param)
    return param, beta2 * exp_avg + one_minus_beta2 * grad


def scaled_copy_step(param, grad):
    """param ← grad (already multiplied by the step's grad_scale): in-place gradient clipping.

    p ← g·scale
    """
    return (grad,)


def accumulate_step(total, grad):
    """Gradient accumulation over micro-batches: the seed's grad_accumulate per element, on
    the gradient already multiplied by the step's grad_scale (1/k, an inverse loss scale).

    G ← G + g·scale
    """
    return (grad_accumulate(total, grad),)


def ema_step(ema, param, decay):
    """Exponential moving average of the weights, the seed's ema_update per element.

    e ← decay·e + (1 − decay)·p
    """
    return (ema_update(ema, param, decay),)


def loss_scale_step(scale, growth_tracker, overflow, growth_factor, backoff_factor, growth_interval):
    """torch.amp.GradScaler's update, on the device: back off on overflow, grow after a run of good steps.

    overflow: s ← s·backoff, n ← 0; else n ← n + 1 and, when n = interval, s ← s·growth if finite and n ← 0
    """
    if overflow != 0.0:
        return scale * backoff_factor, 0.0
    successful = growth_tracker + 1.0
    if successful >= growth_interval:
        grown = scale * growth_factor
        if abs(grown) <= 1e308:
            scale = grown
        return scale, 0.0
    return scale, successful


def clip_coefficient(sum_of_squares, max_norm):
    """torch.nn.utils.clip_grad_norm_'s coefficient from the squared global norm.

    min(1, max_norm/(√Σg² + 1e−6)); NaN for a NaN gradient, as torch's clamp passes it on
    """
    coefficient = max_norm / (math.sqrt(sum_of_squares) + 1e-6)
    if coefficient >= 1.0:
        return 1.0
    return coefficient


def l2_norm(sum_of_squares):
    """A norm from its sum of squares.

    √Σx²
    """
    return math.sqrt(sum_of_squares)


def nonfinite(x):
    """AMP's found-inf flag from a sum of squares: 1 when a gradient was inf or NaN.

    0 if x is finite else 1
    """
    if is_finite(x):
        return 0.0
    return 1.0


# Adam's per-step numbers: from the host, or computed on the device by adam_schedule
ADAM_SCHEDULE = ("step_size", "inverse_bias_correction2_sqrt")


def _trains(name, formula, buffers, updates, **options) -> Step:
    """A step that trains parameters from a gradient: it reads grad × grad_scale, decays where
    the decay_mask is 1, and flips the gradient's sign for maximize."""
    return Step(
        name,
        formula,
        buffers,
        updates,
        gradient="grad",
        mask="decay",
        sign="gradient_sign",
        names=(("decay", "decay_mask"),),
        **options,
    )


STEPS = (
    _trains(
        "sgd",
        "sgd_step",
        ("param", "grad", "momentum_buffer"),
        ("param", "momentum_buffer"),
        optional=("momentum_buffer",),
    ),
    _trains(
        "adam",
        "adam_step",
        ("param", "grad", "exp_avg", "exp_avg_sq"),
        ("param", "exp_avg", "exp_avg_sq"),
        device_scalars=ADAM_SCHEDULE,
    ),
    _trains(
        "adamw",
        "adamw_step",
        ("param", "grad", "exp_avg", "exp_avg_sq"),
        ("param", "exp_avg", "exp_avg_sq"),
        device_scalars=ADAM_SCHEDULE,
    ),
    _trains(
        "adam_amsgrad",
        "adam_amsgrad_step",
        ("param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
        ("param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
        device_scalars=ADAM_SCHEDULE,
    ),
    _trains(
        "adamw_amsgrad",
        "adamw_amsgrad_step",
        ("param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
        ("param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
        device_scalars=ADAM_SCHEDULE,
    ),
    Step("adam_schedule", "adam_schedule_step", ("step", *ADAM_SCHEDULE), ("step", *ADAM_SCHEDULE)),
    _trains(
        "rmsprop",
        "rmsprop_step",
        ("param", "grad", "square_avg", "grad_avg", "momentum_buffer"),
        ("param", "square_avg", "grad_avg", "momentum_buffer"),
        optional=("grad_avg", "momentum_buffer"),
    ),
    _trains("adagrad", "adagrad_step", ("param", "grad", "state_sum"), ("param", "state_sum")),
    Step(
        "lars",
        "lars_step",
        ("param", "grad", "momentum_buffer"),
        ("param", "momentum_buffer"),
        indexed=("trust_ratio", "tensor_weight_decay"),
        optional=("momentum_buffer",),
        gradient="grad",
        sign="gradient_sign",
    ),
    _trains("lion", "lion_step", ("param", "grad", "exp_avg"), ("param", "exp_avg")),
    Step("scaled_copy", "scaled_copy_step", ("param", "grad"), ("param",), gradient="grad", guards_scale=False),
    Step("ema", "ema_step", ("ema", "param"), ("ema",), names=(("ema", "average"),)),
    Step("accumulate", "accumulate_step", ("total", "grad"), ("total",), gradient="grad"),
    Step(
        "loss_scale",
        "loss_scale_step",
        ("scale", "growth_tracker"),
        ("scale", "growth_tracker"),
        names=(("overflow", "found_inf"),),
    ),
)


_STEP = {step.name: step for step in STEPS}

# The steps offered with 8-bit states (SPEC §9): first moments signed, second moments from 0.
BLOCKWISE = (
    Blockwise(_STEP["adamw"], ("exp_avg", "exp_avg_sq"), (True, False), reads_param=False),
    Blockwise(_STEP["adam"], ("exp_avg", "exp_avg_sq"), (True, False)),
    Blockwise(_STEP["lion"], ("exp_avg",), (True,), reads_param=False),
    Blockwise(_STEP["sgd"], ("momentum_buffer",), (True,)),
    Blockwise(_STEP["rmsprop"], ("square_avg",), (False,)),
    Blockwise(_STEP["adagrad"], ("state_sum",), (False,)),
)
