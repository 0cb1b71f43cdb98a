"""Compressed gossip (SPEC §8): the compressors over blocks of a row, the CHOCO step's two
launches and DiLoCo's outer step, as grids over (worker, block) pairs.

A compressor is one of the four ``KINDS`` (its ``kind`` is the index there) given by numbers the
host prepares (``steadystep.compress.Compressor.arguments``): the quantization ``levels`` L
(127 for int8, 7 for int4) and whether codes round to ``nearest``; for the sparsifiers the
count ``kept`` of a whole block and of the last, shorter one, and the factor values are sent
with (1, or b/kept for an unbiased random-k); the step's ``key`` (a hash of the seed and the
step) and the block size. Every block is one (worker, block) pair: a block's scale or
selection needs the whole block, and no two pairs write the same element.
"""

from steadystep.kernels import Grid
from steadystep.kernels._numerics import floor, maximum, uniform
from steadystep.kernels.decentral import worker_update

# What a kernel's ``kind`` number means (the formulas compare with the numbers themselves:
# generated kernels see no module constants)
KINDS = ("identity", "quantize", "top_k", "random_k")


def _span(block, block_size, width):
    """The columns [start, stop) of a block."""
    start = block * block_size
    return start, min(start + block_size, width)


def _priority(values, public, column, kind, key, like):
    """What a sparsifier keeps the largest of: |v| for top-k, a draw keyed by the column alone for
    random-k (so every worker keeps the same positions without sending them)."""
    if kind == 2:  # top-k
        return abs(values[column] - public[column])
    return uniform(column, key, like)


def _share_block(values, public, start, stop, kind, levels, nearest, kept, factor, key, offset):
    """x̂ ← x̂ + Q(v − x̂) over the columns [start, stop) of one worker's row: the public copy takes in
    the compressed difference, as every neighbour reconstructs it. ``offset`` numbers the row's
    elements for stochastic rounding (worker·D)."""
    if kind == 0:  # identity
        for k in range(start, stop):
            public[k] = public[k] + (values[k] - public[k])
    elif kind == 1:  # quantize
        # s = max|v|; c = round(v/s·L), stochastic (P(up) = the fraction) or to nearest, ties up;
        # Q(v) = s·c/L
        scale = 0.0
        for k in range(start, stop):
            scale = maximum(scale, abs(values[k] - public[k]))
        if scale > 0.0:
            for k in range(start, stop):
                code = (values[k] - public[k]) / scale * levels
                draw = 0.5 if nearest else uniform(offset + k, key, code)
                code = min(max(floor(code + draw), -levels), levels)  # c + u may round up to L + 1
                public[k] = public[k] + scale * code / levels
    else:
        # the ``kept`` largest priorities (ties: the lower column): find the last one kept, whose
        # rank is kept − 1, then keep every column at or above it
        threshold = 0.0
        last = start
        for k in range(start, stop):
            mine = _priority(values, public, k, kind, key, threshold)
            rank = 0.0
            for j in range(start, stop):
                other = _priority(values, public, j, kind, key, threshold)
                rank += 1.0 if other > mine or (other == mine and j < k) else 0.0
            if rank == kept - 1.0:
                threshold = mine
                last = k
        for k in range(start, stop):
            mine = _priority(values, public, k, kind, key, threshold)
            if mine > threshold or (mine == threshold and k <= last):
                public[k] = public[k] + (values[k] - public[k]) * factor


def _block_numbers(block, block_size, width, kept_full, kept_last, factor_full, factor_last):
    """A block's span, and the kept count and factor of its length (the last may be shorter)."""
    start, stop = _span(block, block_size, width)
    whole = stop - start == block_size
    return start, stop, kept_full if whole else kept_last, factor_full if whole else factor_last


def choco_share(
    worker,
    block,
    values,
    public,
    kind,
    levels,
    nearest,
    kept_full,
    kept_last,
    factor_full,
    factor_last,
    key,
    block_size,
):
    """x̂_i ← x̂_i + Q(x_i − x̂_i) for one block of one worker (CHOCO's public-copy update; with
    x̂ = 0 it writes Q(x) itself)."""
    width = values.shape[1]
    start, stop, kept, factor = _block_numbers(block, block_size, width, kept_full, kept_last, factor_full, factor_last)
    _share_block(values[worker], public[worker], start, stop, kind, levels, nearest, kept, factor, key, worker * width)


def choco_adapt(
    worker,
    block,
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    public,
    clip,
    decay,
    decoupled_factor,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    step_size,
    inverse_bias_correction2_sqrt,
    kind,
    levels,
    nearest,
    kept_full,
    kept_last,
    factor_full,
    factor_last,
    key,
    block_size,
):
    """CHOCO-ATC's first launch for one block of one worker: the local AdamW step
    x_i' = (1 − ηλ)x_i − ηu_i, then x̂_i ← x̂_i + Q(x_i' − x̂_i)."""
    width = param.shape[1]
    start, stop, kept, factor = _block_numbers(block, block_size, width, kept_full, kept_last, factor_full, factor_last)
    x, g, m, v = param[worker], grad[worker], exp_avg[worker], exp_avg_sq[worker]
    scale = clip[worker]
    for k in range(start, stop):
        x[k], m[k], v[k] = worker_update(
            x[k],
            g[k],
            m[k],
            v[k],
            scale,
            decay[k],
            decoupled_factor,
            one_minus_beta1,
            beta2,
            one_minus_beta2,
            eps,
            step_size,
            inverse_bias_correction2_sqrt,
        )
    _share_block(x, public[worker], start, stop, kind, levels, nearest, kept, factor, key, worker * width)


def choco_mix(
    worker,
    block,
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    public,
    clip,
    decay,
    neighbours,
    weights,
    atc,
    decoupled_factor,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    step_size,
    inverse_bias_correction2_sqrt,
    block_size,
):
    """CHOCO's gossip for one block of one worker, once every public copy is updated:
    x_i + γ Σ_j W_ij (x̂_j − x̂_i) over the worker's ``neighbours`` (their γW_ij in ``weights``);
    ATC adds it to the adapted x_i, AWC steps AdamW from it."""
    width = param.shape[1]
    start, stop = _span(block, block_size, width)
    x, g, m, v, own = param[worker], grad[worker], exp_avg[worker], exp_avg_sq[worker], public[worker]
    scale = clip[worker]
    if atc:
        for k in range(start, stop):
            gossip = 0.0
            for n in range(neighbours.shape[1]):
                gossip += weights[worker, n] * (public[neighbours[worker, n], k] - own[k])
            x[k] = x[k] + gossip
    else:
        for k in range(start, stop):
            gossip = 0.0
            for n in range(neighbours.shape[1]):
                gossip += weights[worker, n] * (public[neighbours[worker, n], k] - own[k])
            x[k], m[k], v[k] = worker_update(
                x[k] + gossip,
                g[k],
                m[k],
                v[k],
                scale,
                decay[k],
                decoupled_factor,
                one_minus_beta1,
                beta2,
                one_minus_beta2,
                eps,
                step_size,
                inverse_bias_correction2_sqrt,
            )


def outer_share(
    worker,
    block,
    param,
    outer,
    residual,
    sent,
    kind,
    levels,
    nearest,
    kept_full,
    kept_last,
    factor_full,
    factor_last,
    key,
    block_size,
):
    """The first launch of DiLoCo's outer step for one block of one worker: the pseudo-gradient
    Δ_i = y_i − x_i joins what compression left behind (e_i += Δ_i), what travels is
    q_i = Q(e_i), and e_i keeps the rest (e_i −= q_i; 0 for the identity)."""
    width = param.shape[1]
    start, stop, kept, factor = _block_numbers(block, block_size, width, kept_full, kept_last, factor_full, factor_last)
    x, y, e, q = param[worker], outer[worker], residual[worker], sent[worker]
    for k in range(start, stop):
        e[k] = e[k] + (y[k] - x[k])
        q[k] = 0.0
    _share_block(e, q, start, stop, kind, levels, nearest, kept, factor, key, worker * width)
    for k in range(start, stop):
        e[k] = e[k] - q[k]


def outer_step(worker, block, param, outer, momentum_buffer, sent, neighbours, weights, lr, momentum, block_size):
    """The second launch: Δ̄_i = Σ_j W_ij q_j over the worker's ``neighbours`` (itself included),
    then torch's Nesterov SGD on the outer copy, b ← μb + Δ̄, y ← y − α(Δ̄ + μb), and x ← y."""
    width = param.shape[1]
    start, stop = _span(block, block_size, width)
    x, y, b = param[worker], outer[worker], momentum_buffer[worker]
    for k in range(start, stop):
        mixed = 0.0
        for n in range(neighbours.shape[1]):
            mixed += weights[worker, n] * sent[neighbours[worker, n], k]
        velocity = momentum * b[k] + mixed
        b[k] = velocity
        y[k] = y[k] - lr * (mixed + momentum * velocity)
        x[k] = y[k]


GRIDS = (Grid("choco_share"), Grid("choco_adapt"), Grid("choco_mix"), Grid("outer_share"), Grid("outer_step"))
