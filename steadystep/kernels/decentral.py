"""The per-element update of the decentralized AdamW step (SPEC §4) and its mixing kernels."""

from steadystep.kernels import Blockwise, Mixing, Step
from steadystep.kernels.optim import adamw_step


def worker_update(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    clip,
    decay,
    decoupled_factor,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    step_size,
    inverse_bias_correction2_sqrt,
):
    """One worker's AdamW update of one element, on its clipped gradient: optim's adamw_step,
    so N = 1 is bit for bit steadystep.optim.adamw.

    g̃ = g·clip; m ← m + (1 − β1)(g̃ − m); v ← β2·v + (1 − β2)·g̃²; x ← x·(1 − ηλ) − η·m̂/(√v̂ + ε)
    """
    return adamw_step(
        param,
        grad * clip,
        exp_avg,
        exp_avg_sq,
        decay,
        decoupled_factor,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        eps,
        1.0,
        step_size,
        inverse_bias_correction2_sqrt,
    )


def _mixing(kind: str) -> Mixing:
    """worker_update mixed by ``kind``, with what its leading parameters are."""
    return Mixing(
        kind,
        "worker_update",
        state=("param", "exp_avg", "exp_avg_sq"),
        gradient="grad",
        per_worker="clip",
        per_column="decay",
    )


# The mixing kernels: one launch updates every worker's moments and mixes parameters.
MIXINGS = (
    _mixing("peer"),  # x_i mixes with one peer per step: W_ii = a, W_i,peer = b
    _mixing("complete"),  # every x_i becomes (a·mean + b·x_i): the mean once per column
    _mixing("dense"),  # any row-stochastic W
)


# With 8-bit moments (SPEC §9) the local step is worker_update over blocks of each worker's row,
# its clip coefficient read once per row, and the mixing runs apart, before (AWC) or after (ATC)
# it, as gossip alone: one launch cannot both wait for every worker's block maxima and mix.
WORKER_STEP = Step(
    "worker",
    "worker_update",
    ("param", "grad", "exp_avg", "exp_avg_sq"),
    ("param", "exp_avg", "exp_avg_sq"),
    gradient="grad",
    mask="decay",
    names=(("decay", "decay_mask"), ("param", "params"), ("grad", "grads")),
)
BLOCKWISE = (Blockwise(WORKER_STEP, ("exp_avg", "exp_avg_sq"), (True, False), per_row=("clip",), reads_param=False),)
GOSSIP = ("peer", "complete", "dense")  # x_i ← Σ_j W_ij x_j in place, by the mixing kinds above
