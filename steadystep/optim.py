"""Fused, in-place optimizer steps over flat buffers, on the CPU or the GPU.

Each step reads the parameters, the gradient and every state buffer once and writes them
back in the same pass: one parallel loop on the CPU, one kernel launch on the GPU. The
semantics and defaults are torch.optim's (``exp_avg``, ``exp_avg_sq``, ``step`` counted
from 1), plus LARS and Lion. Buffers may be NumPy arrays, torch tensors, CuPy arrays or
Numba device arrays; pack a whole model into one buffer with [`steadystep.arena.Arena`][steadystep.arena.Arena].

>>> import numpy as np
>>> from steadystep import optim
>>> param, grad = np.ones(4, np.float32), np.full(4, 0.5, np.float32)
>>> exp_avg, exp_avg_sq = np.zeros_like(param), np.zeros_like(param)
>>> optim.adamw(param, grad, exp_avg, exp_avg_sq, step=1, lr=0.1)
>>> param.round(6)
array([0.899, 0.899, 0.899, 0.899], dtype=float32)

Every step also takes:

* ``decay_mask``: a per-element 0/1 array saying where weight decay applies (for example
  ``layout.mask()``: matrices yes, biases no); any real dtype on the host (a copy in the
  buffers' dtype is stepped then); other values than 0 and 1 are refused when a step first
  meets the mask;
* ``grad_scale``: multiplies the gradient as it is read (AMP's inverse loss scale, a clip
  coefficient): a number or a one-element array on the buffers' device. It must be finite:
  a number or a host array is checked, and on the device a non-finite one makes the step
  write nothing (reading it on the host would cost a synchronisation);
* ``found_inf``: a one-element array on the device; when non-zero the step changes nothing
  (parameters and state stay bit-identical). Neither needs a host synchronisation;
* ``rounding_seed``: for bfloat16 parameters, round them stochastically (up or down with
  probability proportional to the distance, so an update below half an ulp lands on
  average) with bits drawn from this seed and each element's index; None (the default)
  rounds to nearest. Pass a new one each step: ``step_seed(seed, step)``.

Buffers in bfloat16 or float16 (torch tensors, NumPy float16, ``ml_dtypes.bfloat16``, CuPy
float16) are computed in float32 and each result rounded once to the storage: the float32
step rounded once. Every buffer of a step shares one dtype, as in torch's fused steps; the
count, ``grad_scale`` and ``found_inf`` beside them are float32.

>>> import ml_dtypes
>>> p, g = np.ones(1000, ml_dtypes.bfloat16), np.ones(1000, ml_dtypes.bfloat16)
>>> for t in range(1, 101):
...     optim.sgd(p, g, step=t, lr=1e-4, rounding_seed=optim.step_seed(0, t))
>>> round(float(p.astype(np.float32).mean()), 3)  # 1 − 100·1e−4; to nearest, p would stay 1
0.99

``step`` is this step's count, from 1, as in torch.optim. A loop that never synchronises
cannot know which steps ``found_inf`` skipped; for it, ``adam`` and ``adamw`` also take the
count as a one-element array on the buffers' device (torch's ``state["step"]``, 0 before the
first step): the call adds 1 to it, unless ``found_inf`` skips the step, and computes the
bias corrections from it there, so only the steps taken count, as in torch. A count on the
host is checked; on the device, one that is not a whole number ≥ 0 (negative, NaN, 2.5) is
left as it is and the step writes nothing.

>>> count = np.zeros(1, np.float32)
>>> optim.adamw(param, grad, exp_avg, exp_avg_sq, step=count, lr=0.1, found_inf=np.ones(1, np.float32))
>>> count, param.round(6)
(array([0.], dtype=float32), array([0.899, 0.899, 0.899, 0.899], dtype=float32))
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from typing import Any, Callable, Optional

import numpy as np

from steadystep import _arrays, _half, checks, dispatch, quantization
from steadystep.arena import Layout
from steadystep.kernels import Step
from steadystep.kernels import optim as _formulas

__all__ = [
    "Array",
    "accumulate",
    "adagrad",
    "adam",
    "adamw",
    "clip_grad_norm",
    "ema",
    "found_nonfinite",
    "FUSED",
    "fused_step",
    "lars",
    "lion",
    "rmsprop",
    "sgd",
    "step_seed",
    "sum_of_squares",
    "update_loss_scale",
]

Array = Any  # NumPy array, torch tensor, CuPy array or Numba device array
_STEPS = {step.name: step for step in _formulas.STEPS}


def _check_scale(name: str, scale: Any) -> None:
    """A factor that multiplies every gradient must be finite: NaN or ±inf would silently turn
    every parameter into NaN. A number, or a one-element array on the host, is read here; one on
    the device is read by the kernel, which then writes nothing (see the module docstring)."""
    if scale is None:
        return
    if checks.is_number(scale):
        checks.in_range(name, scale, why=" (an inverse loss scale, a clip coefficient, 1/k for k micro-batches)")
        return
    operand = _arrays.classify(name, scale)
    if operand.kind == "host" and operand.value.size == 1 and operand.dtype is not None and operand.dtype.kind == "f":
        value = operand.value.reshape(-1)[0]
        if not math.isfinite(value):
            raise ValueError(
                f"{name} must hold a finite number (an inverse loss scale, a clip coefficient); got {value!r}"
            )


_QUANTIZED = frozenset({quantization.QuantizedState})  # a buffer of 8-bit codes (its type alone)


def _run(
    name: str | Step,
    arrays: dict[str, Any],
    scalars: dict[str, float],
    decay_mask,
    grad_scale,
    found_inf,
    target,
    segment_ids=None,
    after: Optional[Any] = None,
    rounding_seed: Optional[int] = None,
    module: str = "optim",
) -> None:
    """The step ``name`` (of kernels/optim.py, or a Step of formula module ``module``) with its
    maximize and decay_mask turned into what the kernel reads; ``after``, a callable checked and
    run only once the step has passed its checks, runs just before it (Adam's device count:
    advanced only by a step that will happen)."""
    step = name if isinstance(name, Step) else _STEPS[name]
    assert step.sign is not None, step.name
    scalars[_arrays.ROUNDING] = _rounding(rounding_seed, arrays["param"])
    scalars[step.sign] = (
        -1.0 if checks.flag("maximize", scalars.pop("maximize")) else 1.0
    )  # see kernels.optim._l2_gradient
    _check_scale("grad_scale", grad_scale)
    if step.mask is not None:
        scalars[step.mask] = 1.0  # read only where no decay_mask is given
        arrays[step.mask] = decay_mask if decay_mask is None else _mask_like(decay_mask, arrays["param"])
    if not _QUANTIZED.isdisjoint(map(type, arrays.values())):  # one C loop: each small step asks
        quantization.run_step(module, step, arrays, scalars, skip_step=found_inf, grad_scale=grad_scale, target=target)
        return
    if after is None:
        dispatch.run_step(
            module,
            step,
            arrays,
            scalars,
            skip_step=found_inf,
            grad_scale=grad_scale,
            segment_ids=segment_ids,
            target=target,
        )
        return
    launch = dispatch.checked_step(
        module, step, arrays, scalars, skip_step=found_inf, grad_scale=grad_scale, target=target
    )
    after()
    launch()


def sgd(
    param: Array,
    grad: Array,
    momentum_buffer: Optional[Array] = None,
    *,
    step: int,
    lr: float = 1e-3,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    maximize: bool = False,
    decay_mask: Optional[Array] = None,
    grad_scale: Any = None,
    found_inf: Optional[Array] = None,
    rounding_seed: Optional[int] = None,
    target: Optional[str] = None,
) -> None:
    """torch.optim.SGD's step, in place.

    d = g + λ·p; b ← d on step 1, else μ·b + (1 − dampening)·d; d ← d + μ·b (Nesterov) or b; p ← p − lr·d
    """
    checks.step(step)
    checks.non_negative(lr=lr, momentum=momentum, weight_decay=weight_decay)
    nesterov = checks.sgd_options(momentum, dampening, nesterov)
    if momentum != 0.0 and momentum_buffer is None:
        raise ValueError("momentum_buffer is required when momentum is non-zero")
    _run(
        "sgd",
        {"param": param, "grad": grad, "momentum_buffer": momentum_buffer if momentum else None},
        dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=float(nesterov),
            maximize=maximize,
            first_step=float(step == 1),
        ),
        decay_mask,
        grad_scale,
        found_inf,
        target,
        rounding_seed=rounding_seed,
    )


def _adam(
    decoupled: bool,
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    max_exp_avg_sq,
    step,
    lr,
    betas,
    eps,
    weight_decay,
    amsgrad,
    maximize,
    decay_mask,
    grad_scale,
    found_inf,
    target,
    rounding_seed=None,
) -> None:
    on_device = not _is_count(step)
    if on_device and any(isinstance(state, quantization.QuantizedState) for state in (exp_avg, exp_avg_sq)):
        raise TypeError("with 8-bit states, step must be an int (a count on the device is not offered with them)")
    if not on_device:
        checks.step(step)
    checks.non_negative(lr=lr, eps=eps, weight_decay=weight_decay)
    beta1, beta2 = checks.betas(betas)
    amsgrad = checks.flag("amsgrad", amsgrad)
    if amsgrad and max_exp_avg_sq is None:
        raise ValueError(
            "max_exp_avg_sq is required when amsgrad=True (zeros before the first step, as in torch.optim)"
        )
    buffers = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if amsgrad:
        buffers["max_exp_avg_sq"] = max_exp_avg_sq
    # one dict display, filled in place: in a small step this Python is most of the time
    scalars = {
        "one_minus_beta1": 1 - beta1,
        "beta2": beta2,
        "one_minus_beta2": 1 - beta2,
        "eps": eps,
        "maximize": maximize,
    }
    if decoupled:
        scalars["decoupled_factor"] = 1 - lr * weight_decay
    else:
        scalars["weight_decay"] = weight_decay
    advance = None
    if on_device:
        schedule = _schedule(
            step, param, {**buffers, "decay_mask": decay_mask, "grad_scale": grad_scale, "found_inf": found_inf}
        )
        buffers.update(schedule)
        advance = lambda: dispatch.run_step(  # noqa: E731
            "optim",
            _STEPS["adam_schedule"],
            {"step": step, **schedule},
            dict(lr=lr, one_minus_beta1=1 - beta1, one_minus_beta2=1 - beta2),
            skip_step=found_inf,
            target=target,
        )
    else:
        scalars["step_size"] = lr / (1 - beta1**step)
        scalars["inverse_bias_correction2_sqrt"] = 1 / (1 - beta2**step) ** 0.5
    _run(
        ("adamw" if decoupled else "adam") + ("_amsgrad" if amsgrad else ""),
        buffers,
        scalars,
        decay_mask,
        grad_scale,
        found_inf,
        target,
        after=advance,
        rounding_seed=rounding_seed,
    )


def step_seed(seed: int, step: int) -> int:
    """A step's ``rounding_seed`` from a run's ``seed`` and the step's number: each step then
    rounds with other random bits, and a rerun with the same seed with the same."""
    return _arrays.rounding_key(checks.count("seed", seed), checks.count("step", step))


def _rounding(seed: Optional[int], param: Array) -> int:
    """The kernels' rounding key: 0 (round to nearest) for ``seed`` None, else a 63-bit hash
    of it (so that nearby seeds draw unrelated bits). Stochastic rounding needs bfloat16
    parameters."""
    if seed is None:
        return 0
    checks.count("rounding_seed", seed)
    storage = _arrays.dtype_name(_arrays.classify("param", param))
    if storage != "bfloat16":
        raise ValueError(
            f"rounding_seed is given but param is {storage}; stochastic rounding applies to bfloat16 "
            "parameters (leave rounding_seed None to round to nearest)"
        )
    return _arrays.rounding_key(seed, 0)


def _is_count(step: Any) -> bool:
    return type(step) is int or isinstance(step, numbers.Number)  # anything else is read as an array


def _schedule(step: Array, param: Array, others: dict[str, Any]) -> dict[str, Any]:
    """Adam with its step count in a one-element array (torch's ``state["step"]`` tensor): one
    small launch (``adam_schedule``) adds 1 to it, unless ``found_inf`` is set, and computes
    the step size and bias correction from it where it lives, so a sync-free AMP loop counts
    only the steps taken, as torch does. Checks the count; returns the arrays, beside the
    parameters, that the launch writes and the step reads."""
    counter = _arrays.classify("step", step)
    if counter.kind == "scalar" or math.prod(counter.shape) != 1:
        raise ValueError(
            "step must be an integer ≥ 1 (this step's count) or a one-element array holding the "
            f"count of steps taken so far (advanced in place); got {step!r}"
        )
    arrays = {name: value for name, value in others.items() if not isinstance(value, numbers.Number)}
    # what depends only on the arrays themselves is checked once for a loop's objects
    dispatch.check_once("adam count", {"step": step, **arrays}, lambda: _check_count(counter, param, arrays))
    if counter.kind == "host":  # read where it costs no synchronisation; on the device the kernel writes nothing
        taken = counter.value.reshape(-1)[0]
        if not (math.isfinite(taken) and taken >= 0 and taken == math.floor(taken)):
            raise ValueError(f"step must hold the count of steps taken so far, a whole number ≥ 0; it holds {taken!r}")
    dtype = _arrays.array_dtype(counter)  # the parameters' (checked)
    key = (counter.shape, dtype, counter.kind == "device")
    schedule = _SCHEDULE.kept.get(key)
    if schedule is None:  # reused, so the steps reading them stay validated from one call to the next
        schedule = _SCHEDULE.kept[key] = {
            name: _on_device_of(param, np.zeros(counter.shape, dtype)) for name in _formulas.ADAM_SCHEDULE
        }
    return schedule


def _check_count(counter: _arrays.Operand, param: Array, arrays: dict[str, Any]) -> None:
    """A count array beside the parameters: on their side, in their dtype, writable, and apart
    from every other argument (its own launch writes it before the step reads those)."""
    reference = _arrays.classify("param", param)
    if reference.kind == "scalar":
        raise TypeError(f"param must be an array; got the number {param!r}")
    if counter.kind != reference.kind:
        places = {"host": "the CPU", "device": "the GPU"}
        raise TypeError(
            f"step and param live on different devices (step on {places[counter.kind]}, param on "
            f"{places[reference.kind]}); keep the count beside the parameters"
        )
    expected = _arrays.computed(reference)  # float32 beside half precision, as torch's counts
    if counter.dtype != expected or counter.storage is not None:
        raise TypeError(
            f"step has dtype {_arrays.dtype_name(counter)} but param has {_arrays.dtype_name(reference)}; keep the "
            f"count in {expected}"
        )
    _arrays.check_writable(counter)
    for name, value in arrays.items():
        if value is not None:
            operand = _arrays.classify(name, value)
            if operand.kind == counter.kind and _arrays.overlap(counter, operand):
                raise ValueError(f"step and {name} share memory; keep the count in an array of its own")


_SCHEDULE = _arrays.PerThread()


def adam(
    param: Array,
    grad: Array,
    exp_avg: Array,
    exp_avg_sq: Array,
    max_exp_avg_sq: Optional[Array] = None,
    *,
    step: int | Array,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    amsgrad: bool = False,
    maximize: bool = False,
    decay_mask: Optional[Array] = None,
    grad_scale: Any = None,
    found_inf: Optional[Array] = None,
    rounding_seed: Optional[int] = None,
    target: Optional[str] = None,
) -> None:
    """torch.optim.Adam's step (L2 weight decay added to the gradient), in place
    (``max_exp_avg_sq`` when amsgrad: v̂, the running maximum of v, divides instead of v;
    ``step`` an integer, or a one-element array counting the steps taken, advanced in place).

    g ← g + λ·p; m ← m + (1 − β1)(g − m); v ← β2·v + (1 − β2)·g²; p ← p − (lr/(1 − β1ᵗ))·m/(√v/√(1 − β2ᵗ) + ε)
    """
    _adam(
        False,
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
        step,
        lr,
        betas,
        eps,
        weight_decay,
        amsgrad,
        maximize,
        decay_mask,
        grad_scale,
        found_inf,
        target,
        rounding_seed,
    )


def adamw(
    param: Array,
    grad: Array,
    exp_avg: Array,
    exp_avg_sq: Array,
    max_exp_avg_sq: Optional[Array] = None,
    *,
    step: int | Array,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    amsgrad: bool = False,
    maximize: bool = False,
    decay_mask: Optional[Array] = None,
    grad_scale: Any = None,
    found_inf: Optional[Array] = None,
    rounding_seed: Optional[int] = None,
    target: Optional[str] = None,
) -> None:
    """torch.optim.AdamW's step (decoupled weight decay), in place
    (``max_exp_avg_sq`` when amsgrad: v̂, the running maximum of v, divides instead of v;
    ``step`` an integer, or a one-element array counting the steps taken, advanced in place).

    p ← p·(1 − lr·λ); m ← m + (1 − β1)(g − m); v ← β2·v + (1 − β2)·g²; p ← p − (lr/(1 − β1ᵗ))·m/(√v/√(1 − β2ᵗ) + ε)
    """
    _adam(
        True,
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
        step,
        lr,
        betas,
        eps,
        weight_decay,
        amsgrad,
        maximize,
        decay_mask,
        grad_scale,
        found_inf,
        target,
        rounding_seed,
    )


def rmsprop(
    param: Array,
    grad: Array,
    square_avg: Array,
    grad_avg: Optional[Array] = None,
    momentum_buffer: Optional[Array] = None,
    *,
    lr: float = 1e-2,
    alpha: float = 0.99,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    centered: bool = False,
    maximize: bool = False,
    decay_mask: Optional[Array] = None,
    grad_scale: Any = None,
    found_inf: Optional[Array] = None,
    rounding_seed: Optional[int] = None,
    target: Optional[str] = None,
) -> None:
    """torch.optim.RMSprop's step, in place (grad_avg when centered, momentum_buffer when momentum > 0).

    s ← α·s + (1 − α)·g²; a = √(s − ḡ²) + ε (centered, ḡ ← ḡ + (1 − α)(g − ḡ)) or √s + ε;
    p ← p − lr·b with b ← μ·b + g/a, or p ← p − lr·g/a
    """
    checks.non_negative(lr=lr, eps=eps, weight_decay=weight_decay, momentum=momentum)
    checks.in_range("alpha", alpha, 0.0, 1.0)
    centered = checks.flag("centered", centered)
    if centered and grad_avg is None:
        raise ValueError("grad_avg is required when centered=True")
    if momentum > 0.0 and momentum_buffer is None:
        raise ValueError("momentum_buffer is required when momentum > 0")
    _run(
        "rmsprop",
        {
            "param": param,
            "grad": grad,
            "square_avg": square_avg,
            "grad_avg": grad_avg if centered else None,
            "momentum_buffer": momentum_buffer if momentum > 0.0 else None,
        },
        dict(
            lr=lr,
            alpha=alpha,
            one_minus_alpha=1 - alpha,
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            centered=float(centered),
            maximize=maximize,
        ),
        decay_mask,
        grad_scale,
        found_inf,
        target,
        rounding_seed=rounding_seed,
    )


def adagrad(
    param: Array,
    grad: Array,
    state_sum: Array,
    *,
    step: int,
    lr: float = 1e-2,
    lr_decay: float = 0.0,
    weight_decay: float = 0.0,
    eps: float = 1e-10,
    maximize: bool = False,
    decay_mask: Optional[Array] = None,
    grad_scale: Any = None,
    found_inf: Optional[Array] = None,
    rounding_seed: Optional[int] = None,
    target: Optional[str] = None,
) -> None:
    """torch.optim.Adagrad's step, in place (state_sum starts at initial_accumulator_value).

    s ← s + g²; p ← p − (lr/(1 + (t − 1)·lr_decay))·g/(√s + ε)
    """
    checks.step(step)
    checks.non_negative(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, eps=eps)
    _run(
        "adagrad",
        {"param": param, "grad": grad, "state_sum": state_sum},
        dict(
            clr=lr / (1 + (step - 1) * lr_decay),
            eps=eps,
            weight_decay=weight_decay,
            maximize=maximize,
        ),
        decay_mask,
        grad_scale,
        found_inf,
        target,
        rounding_seed=rounding_seed,
    )


def lars(
    param: Array,
    grad: Array,
    momentum_buffer: Optional[Array] = None,
    *,
    layout: Layout,
    lr: float,
    trust_coefficient: float = 1e-3,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    eps: float = 1e-8,
    maximize: bool = False,
    decay_mask: Optional[Array] = None,
    grad_scale: Any = None,
    found_inf: Optional[Array] = None,
    rounding_seed: Optional[int] = None,
    target: Optional[str] = None,
) -> None:
    """LARS over an arena: each tensor's trust ratio tc·‖w‖/(‖g‖ + λ·‖w‖ + ε) scales its update.

    ``decay_mask`` (a host array, e.g. ``layout.mask()``) decides per tensor, by the value at
    its first element, whether λ applies to it (in its trust ratio and its update).

    u = ratio·(g + λ·p); b ← μ·b + u and u ← b (if μ ≠ 0); p ← p − lr·u
    """
    checks.non_negative(
        lr=lr, trust_coefficient=trust_coefficient, momentum=momentum, weight_decay=weight_decay, eps=eps
    )
    if not isinstance(layout, Layout):
        raise TypeError(
            f"layout must be a steadystep.arena.Layout (an Arena's .layout: where each tensor lies in "
            f"param); got {type(layout).__name__}"
        )
    if momentum != 0.0 and momentum_buffer is None:
        raise ValueError("momentum_buffer is required when momentum is non-zero")
    checks.flag("maximize", maximize)
    _check_scale("grad_scale", grad_scale)
    if grad_scale is not None and not isinstance(grad_scale, numbers.Real):
        _one_element_beside("grad_scale", grad_scale, _arrays.classify("grad", grad))
    param_squares = _sum_of_squares("param", param, layout, 1.0, target)
    grad_squares = _sum_of_squares("grad", grad, layout, 1.0 if grad_scale is None else grad_scale, target)
    squares = _arrays.classify("param_sum_squares", param_squares)
    kinds = [_arrays.classify(name, value) for name, value in (("grad", grad), ("param", param))]
    if (
        len({(operand.dtype, operand.storage) for operand in kinds}) > 1
    ):  # named here: the trust ratios' launch would blame its own out
        found = [_arrays.dtype_name(operand) for operand in kinds]
        raise TypeError(f"grad has dtype {found[0]} but param has {found[1]}; pass matching dtypes")
    tensor_decay = [weight_decay if decays else 0.0 for decays in _tensor_decays(decay_mask, layout)]
    on_device = _arrays.classify("param", param).kind == "device"
    trust_ratio, tensor_weight_decay = _per_tensor_arrays(
        layout, _arrays.array_dtype(squares), param, on_device, tensor_decay
    )
    dispatch.run_elementwise(
        "optim",
        "lars_trust_ratio",
        [
            squares,
            *(
                _arrays.classify(name, value)
                for name, value in (
                    ("grad_sum_squares", grad_squares),
                    ("trust_coefficient", trust_coefficient),
                    ("weight_decay", tensor_weight_decay),
                    ("eps", eps),
                )
            ),
        ],
        trust_ratio,
        target,
    )
    segment_ids = dispatch.backend("cuda" if on_device else "cpu").layout_array(layout, "segment_ids")
    _run(
        "lars",
        {
            "param": param,
            "grad": grad,
            "momentum_buffer": momentum_buffer if momentum else None,
            "trust_ratio": trust_ratio,
            "tensor_weight_decay": tensor_weight_decay,
        },
        dict(lr=lr, momentum=momentum, maximize=maximize),
        None,
        grad_scale,
        found_inf,
        target,
        segment_ids=segment_ids,
        rounding_seed=rounding_seed,
    )


def _per_tensor_arrays(
    layout: Layout, dtype: np.dtype, param: Array, on_device: bool, tensor_decay: list[float]
) -> tuple[Any, Any]:
    """LARS's trust-ratio and weight-decay arrays (one value per tensor) for this layout, dtype
    and device: kept and rewritten in place, so the step reading them stays validated from one
    call to the next (run_step remembers arrays), and the decays reach a GPU only when they change."""
    key = (layout, dtype, on_device)
    kept = _PER_TENSOR.kept.get(key)
    if kept is None:
        kept = _PER_TENSOR.kept[key] = [
            _on_device_of(param, np.zeros(layout.segments, dtype)),
            _on_device_of(param, np.zeros(layout.segments, dtype)),
            None,
        ]
    trust_ratio, tensor_weight_decay, written = kept
    if written != tensor_decay:
        values = np.asarray(tensor_decay, dtype)
        if on_device:
            tensor_weight_decay.copy_to_device(values)
        else:
            tensor_weight_decay[:] = values
        kept[2] = tensor_decay
    return trust_ratio, tensor_weight_decay


_PER_TENSOR = _arrays.PerThread()


def lion(
    param: Array,
    grad: Array,
    exp_avg: Array,
    *,
    lr: float = 1e-4,
    betas: tuple[float, float] = (0.9, 0.99),
    weight_decay: float = 0.0,
    maximize: bool = False,
    decay_mask: Optional[Array] = None,
    grad_scale: Any = None,
    found_inf: Optional[Array] = None,
    rounding_seed: Optional[int] = None,
    target: Optional[str] = None,
) -> None:
    """Lion: a sign update with decoupled weight decay; the momentum moves with beta2 afterwards.

    p ← p − lr·(sign(β1·m + (1 − β1)·g) + λ·p); m ← β2·m + (1 − β2)·g
    """
    checks.non_negative(lr=lr, weight_decay=weight_decay)
    beta1, beta2 = checks.betas(betas)
    # 1 − β on the host in float64 (as Adam's): in float32, 1 − 0.99 is 8.6 ulp off
    _run(
        "lion",
        {"param": param, "grad": grad, "exp_avg": exp_avg},
        dict(
            lr=lr,
            beta1=beta1,
            one_minus_beta1=1 - beta1,
            beta2=beta2,
            one_minus_beta2=1 - beta2,
            weight_decay=weight_decay,
            maximize=maximize,
        ),
        decay_mask,
        grad_scale,
        found_inf,
        target,
        rounding_seed=rounding_seed,
    )


# -- fused steps made from their catalog entry ----------------------------------------------------

FUSED: dict[str, Callable[..., None]] = {}  # by name: steadystep.torch makes a drop-in of each


def fused_step(name: str, module: str = "optim") -> Callable[..., None]:
    """The functional step of the catalog entry ``name``, a `Step` of
    ``steadystep.kernels.<module>`` that declares its ``hyperparameters``: exporting the
    result (``toy = fused_step("toy")`` here) is all a new optimizer needs beyond its formula,
    and steadystep.torch makes its drop-in (the step's ``drop_in`` name) from it.

    The step takes ``(param, grad, *state)`` (its other buffers, in the entry's order; an
    optional one may be None), each hyperparameter as a keyword (a finite number ≥ 0, the
    declared default if left out), and the options every step has: ``maximize``,
    ``decay_mask`` (if the entry has a mask), ``grad_scale``, ``found_inf``,
    ``rounding_seed``, ``target``.

    A new optimizer, say heavy-ball momentum: its formula ``heavy_ball_step(param, grad,
    velocity, decay, lr, momentum, weight_decay, gradient_sign)`` in ``kernels/optim.py``
    beside its entry ``_trains("heavy_ball", "heavy_ball_step", ("param", "grad",
    "velocity"), ("param", "velocity"), hyperparameters=(("lr", 1e-3), ("momentum", 0.9),
    ("weight_decay", 0.0)), drop_in="HeavyBall")``, and here ``heavy_ball =
    fused_step("heavy_ball")`` with its name in ``__all__`` (tests/test_recipe.py does
    exactly this).
    """
    step = _catalog(module).get(name)
    if step is None or not step.hyperparameters:
        raise ValueError(
            f"steadystep.kernels.{module} has no step {name!r} that declares its hyperparameters; "
            "declare them in its Step entry (hyperparameters=((name, default), ...))"
        )
    if step.buffers[:2] != ("param", "grad") or step.gradient != "grad" or step.sign is None or step.indexed:
        raise ValueError(
            f"step {name!r} does not have the shape fused_step makes a function of: buffers (param, grad, "
            "*state), gradient 'grad', a sign for maximize, nothing indexed; write its function by hand"
        )
    formula = getattr(importlib.import_module(f"steadystep.kernels.{module}"), step.formula)
    state = step.buffers[2:]
    keyword = inspect.Parameter.KEYWORD_ONLY
    options = [
        *(inspect.Parameter(hyper, keyword, default=default) for hyper, default in step.hyperparameters),
        inspect.Parameter("maximize", keyword, default=False),
        *([inspect.Parameter("decay_mask", keyword, default=None)] if step.mask else []),
        *(inspect.Parameter(option, keyword, default=None) for option in _EVERY_STEP),
    ]
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature(
        [
            *(inspect.Parameter(buffer, positional) for buffer in ("param", "grad")),
            *(
                inspect.Parameter(buffer, positional, **({"default": None} if buffer in step.optional else {}))
                for buffer in state
            ),
            *options,
        ],
        return_annotation=None,
    )

    def fused(*args: Any, **kwargs: Any) -> None:
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        values = given.arguments
        numbers = {hyper: values[hyper] for hyper, _ in step.hyperparameters}
        checks.non_negative(**numbers)
        _run(
            step,
            {buffer: values[buffer] for buffer in step.buffers},
            {**numbers, "maximize": values["maximize"]},
            values.get("decay_mask"),
            values["grad_scale"],
            values["found_inf"],
            values["target"],
            rounding_seed=values["rounding_seed"],
            module=module,
        )

    fused.__signature__ = signature  # type: ignore[attr-defined]
    fused.__name__ = fused.__qualname__ = name
    fused.__doc__ = inspect.getdoc(formula)
    fused.step = step  # type: ignore[attr-defined]  # what steadystep.torch reads for the drop-in
    FUSED[name] = fused
    return fused


_EVERY_STEP = ("grad_scale", "found_inf", "rounding_seed", "target")


def _catalog(module: str) -> dict[str, Any]:
    """The Step entries of formula module ``module``, by name."""
    return {step.name: step for step in importlib.import_module(f"steadystep.kernels.{module}").STEPS}


# -- reductions, clipping, AMP, EMA ---------------------------------------------------------------


def sum_of_squares(
    x: Array, layout: Optional[Layout] = None, *, scale: float | Array = 1.0, target: Optional[str] = None
) -> Array:
    """Σ (x·scale)² for each tensor of ``layout`` (the whole buffer if None): an array of x's
    library on x's device (``scale``: a number, or a one-element array of x's dtype beside
    it, such as an inverse loss scale on the GPU)."""
    _arrays.check_untracked([_arrays.classify("x", x)], None)  # a norm penalty would train nothing
    return _sum_of_squares("x", x, layout, scale, target)


def _sum_of_squares(
    name: str, x: Array, layout: Optional[Layout], scale: float | Array, target: Optional[str]
) -> Array:
    """sum_of_squares with ``x`` named as the caller knows it (clipping's and AMP's ``grad``)."""
    operand = _arrays.classify(name, x)
    if operand.kind == "scalar" or (operand.dtype not in ("float32", "float64") and operand.storage is None):
        found = "a number" if operand.kind == "scalar" else f"dtype {operand.dtype}"
        raise TypeError(f"{name} must be a float32, float64, bfloat16 or float16 array; got {found}")
    if not isinstance(scale, numbers.Real):
        scale = _one_element_beside("scale", scale, operand)
    size = math.prod(operand.shape)
    if layout is not None and not isinstance(layout, Layout):
        raise TypeError(
            f"layout must be a steadystep.arena.Layout (an Arena's .layout) or None for the whole "
            f"buffer; got {layout!r}"
        )
    layout = layout or Layout.whole(size)
    if size != layout.size:
        raise ValueError(f"{name} has {size} elements but the layout holds {layout.size}")
    where = dispatch.choose_target([operand], target)
    return dispatch.backend(where).sum_squares(
        operand, layout, scale if isinstance(scale, _arrays.Operand) else float(scale)
    )


def clip_grad_norm(grad: Array, max_norm: float, *, target: Optional[str] = None) -> Array:
    """Scale ``grad`` in place so its global L2 norm is at most ``max_norm`` (torch's clip_grad_norm_).

    The coefficient is max_norm/(‖g‖ + 1e−6), capped at 1, and is always applied. Returns
    the norm before clipping: a float for host buffers, a one-element array on the GPU
    (no synchronisation). As in torch (CPU and CUDA alike), the squares are summed in the
    gradient's dtype: a float32 gradient whose squared norm exceeds 3.4e38 reports an
    infinite norm and is scaled by 0.
    """
    checks.non_negative(max_norm=max_norm)
    operand = _arrays.classify("grad", grad)
    if operand.kind == "scalar":
        raise TypeError(f"grad must be an array (the gradients, clipped in place); got the number {grad!r}")
    _arrays.check_writable(operand)  # named as the caller knows it, before the norm
    squares = _sum_of_squares("grad", grad, None, 1.0, target)
    on_host = _arrays.classify("squares", squares)
    if on_host.kind == "host":
        # On the host the norm comes back as a number anyway: scaling by a number rather than
        # a new one-element array lets run_step reuse the validated scaling step.
        total = on_host.value[0]
        formulas = dispatch.kernel_module("cpu", "optim")
        kind = _arrays.suffix(total.dtype)
        coefficient = getattr(formulas, f"clip_coefficient_{kind}")(total, total.dtype.type(max_norm))
        _run_plain("scaled_copy", {"param": grad, "grad": grad}, {}, grad_scale=float(coefficient), target=target)
        return float(getattr(formulas, f"l2_norm_{kind}")(total))
    coefficient = _elementwise("clip_coefficient", squares, max_norm, target=target)
    _run_plain("scaled_copy", {"param": grad, "grad": grad}, {}, grad_scale=coefficient, target=target)
    return _elementwise("l2_norm", squares, target=target)


def found_nonfinite(grad: Array, *, out: Optional[Array] = None, target: Optional[str] = None) -> Array:
    """AMP's found-inf flag for ``grad``: a one-element array, 1 if any value is inf or NaN.

    ``out`` (a one-element array of grad's dtype, float32 for bfloat16 or float16 gradients, on its
    device) receives the flag instead of a new array. Keep one and pass it to every step: a step
    remembers the arrays it has validated, so a new flag array each iteration costs the AMP step a
    full check.

    The values are scaled by 2⁻¹⁰⁰ (float32; 2⁻⁹⁰⁰ for float64) before they are squared and
    summed, so no finite gradient can overflow the sum (the largest square is then 2⁵⁶)
    while inf and NaN stay what they are; what underflows to 0 did not matter to the flag.
    """
    dtype = _arrays.classify("grad", grad).dtype  # half precision is summed in float32
    if out is not None:
        _arrays.check_untracked([], out)
    scale = 2.0**-900 if dtype == np.float64 else 2.0**-100
    squares = _arrays.classify("squares", _sum_of_squares("grad", grad, None, scale, target))
    return dispatch.run_elementwise("optim", "nonfinite", [squares], out, target)


def update_loss_scale(
    scale: Array,
    growth_tracker: Array,
    found_inf: Array,
    *,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
    target: Optional[str] = None,
) -> None:
    """torch.amp.GradScaler.update on one-element arrays, in place, with no host synchronisation.

    All three live in one dtype, the scale's: GradScaler's int32 growth tracker becomes a
    float one here (a float32 counts exactly to 2²⁴, past any growth_interval in use).
    """
    for name, value in (("scale", scale), ("growth_tracker", growth_tracker)):
        operand = _arrays.classify(name, value)
        if operand.storage:
            raise TypeError(
                f"{name} is {operand.storage}; keep GradScaler's state in float32 (beside half-precision "
                "gradients too, as torch does: a float16 scale overflows at 65504)"
            )
    tracker = _arrays.classify("growth_tracker", growth_tracker)
    if tracker.dtype is not None and tracker.dtype.kind in "iu":
        raise TypeError(
            f"growth_tracker has dtype {tracker.dtype}; keep it in the scale's dtype (as "
            "scale.new_zeros(1) or np.zeros_like(scale), not GradScaler's int32): it counts exactly "
            "to 2**24 in float32"
        )
    # GradScaler's own conditions: a factor on the wrong side of 1 (or NaN) would silently
    # shrink the scale on success or grow it on overflow.
    checks.in_range("growth_factor", growth_factor, 1.0, low_open=True, why=" (as in torch.amp.GradScaler)")
    checks.in_range(
        "backoff_factor", backoff_factor, 0.0, 1.0, low_open=True, high_open=True, why=" (as in torch.amp.GradScaler)"
    )
    # the tracker counts exactly up to 2^24 in float32 (2^53 in float64): a longer interval would never end
    exact = 2**24 if tracker.dtype == np.float32 else 2**53
    checks.count(
        "growth_interval", growth_interval, 1, exact, f" (the tracker's {tracker.dtype} counts exactly to {exact})"
    )
    if found_inf is None:
        raise TypeError("found_inf must be a one-element array (optim.found_nonfinite's flag); got None")
    for name, value in (("scale", scale), ("growth_tracker", growth_tracker), ("found_inf", found_inf)):
        operand = _arrays.classify(name, value)
        if operand.kind == "scalar" or math.prod(operand.shape) != 1:
            raise ValueError(
                f"{name} must be a one-element array (GradScaler's state lives on the device); got "
                f"{'a number' if operand.kind == 'scalar' else f'shape {operand.shape}'}"
            )
    _run_plain(
        "loss_scale",
        {"scale": scale, "growth_tracker": growth_tracker, "overflow": found_inf},
        dict(growth_factor=growth_factor, backoff_factor=backoff_factor, growth_interval=growth_interval),
        target=target,
    )


def ema(average: Array, param: Array, *, decay: float, target: Optional[str] = None) -> None:
    """Exponential moving average of weights, in place: average ← decay·average + (1 − decay)·param."""
    checks.in_range("decay", decay, 0.0, 1.0)  # NaN too: it would silently turn the average into NaN
    _run_plain("ema", {"ema": average, "param": param}, dict(decay=decay), target=target)


def accumulate(
    total: Array, grad: Array, *, scale: Any = 1.0, found_inf: Optional[Array] = None, target: Optional[str] = None
) -> None:
    """Gradient accumulation, in place: total ← total + scale·grad.

    ``scale`` is a number or a one-element array on the buffers' device (1/k to average k
    micro-batches, an inverse loss scale under AMP); with ``found_inf`` set, total is left
    untouched. Zero ``total`` before the first micro-batch, then step on it.

    >>> from steadystep import optim
    >>> total, grad = np.zeros(3), np.array([1.0, 2.0, 3.0])
    >>> for _ in range(4):
    ...     optim.accumulate(total, grad, scale=0.25)
    >>> total
    array([1., 2., 3.])
    """
    _check_scale("scale", scale)
    dispatch.run_step(
        "optim",
        _STEPS["accumulate"],
        {"total": total, "grad": grad},
        {},
        skip_step=found_inf,
        grad_scale=scale,
        target=target,
    )


def _one_element_beside(name: str, value: Any, reference: _arrays.Operand) -> _arrays.Operand:
    """``value`` classified, checked to be one element of ``reference``'s dtype (or of float32,
    beside half precision) on its side."""
    operand = _arrays.classify(name, value)
    dtype = _arrays.dtype_name(operand)
    if (
        operand.kind != reference.kind
        or dtype not in (_arrays.dtype_name(reference), str(_arrays.computed(reference)))
        or math.prod(operand.shape) != 1
    ):
        raise TypeError(
            f"{name} must be a number or a one-element {_arrays.dtype_name(reference)} array on the "
            f"{'GPU' if reference.kind == 'device' else 'CPU'} like {reference.name}; got {value!r}"
        )
    return operand


def _mask_like(decay_mask: Array, param: Array) -> Array:
    """A host mask of another dtype than the parameters' (bool, integers, ``layout.mask()``'s
    float32 beside float64 buffers) as a copy in theirs: any 0/1 mask is accepted. The copy is
    new at every call, so such a step is checked in full each time; a mask of the parameters'
    dtype is checked once."""
    if type(decay_mask) is type(param) and getattr(decay_mask, "dtype", None) == getattr(param, "dtype", None):
        return decay_mask  # the usual case, without classifying both again
    mask = _arrays.classify("decay_mask", decay_mask)
    if mask.kind != "host" or mask.dtype is None or mask.dtype.kind not in "biuf":
        return decay_mask  # the step's checks name what is wrong with it
    reference = _arrays.classify("param", param)
    dtype = reference.dtype
    if reference.storage is not None and reference.kind == "host" and mask.storage != reference.storage:
        bits = _half.narrowed(dispatch.host_values(mask), _arrays.array_dtype(reference))
        return _arrays.wrap_like(bits, [reference], reference.storage)
    if dtype in (np.float32, np.float64) and mask.dtype != dtype:
        return np.asarray(mask.value, dtype)
    return decay_mask


def _run_plain(
    name: str, arrays: dict[str, Any], scalars: dict[str, float], grad_scale: Any = None, target=None
) -> None:
    dispatch.run_step("optim", _STEPS[name], arrays, scalars, grad_scale=grad_scale, target=target)


def _elementwise(function: str, *args: Any, target: Optional[str] = None) -> Any:
    operands = [_arrays.classify(f"argument {index}", value) for index, value in enumerate(args)]
    return dispatch.run_elementwise("optim", function, operands, None, target)


def _tensor_decays(decay_mask: Optional[Array], layout: Layout) -> list[bool]:
    """Whether each tensor of ``layout`` gets weight decay: the mask's value at its first element."""
    if decay_mask is None:
        return [True] * layout.segments
    mask = _arrays.classify("decay_mask", decay_mask)
    if mask.kind != "host":
        raise TypeError(
            "decay_mask for LARS must be a host array (e.g. layout.mask()): LARS reads one value per "
            "tensor on the host and keeps the per-tensor decays on the device itself"
        )
    if math.prod(mask.shape) != layout.size:
        raise ValueError(f"decay_mask has {math.prod(mask.shape)} elements; the layout's buffer has {layout.size}")
    return [bool(value) for value in dispatch.host_values(mask).reshape(-1)[list(layout.offsets)]]


def _on_device_of(reference: Any, host: Any) -> Any:
    if _arrays.classify("reference", reference).kind != "device":
        return host
    from steadystep.cuda.runtime import require_cuda

    return require_cuda().to_device(host)
