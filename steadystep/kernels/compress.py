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


def _priority(values, public, k, kind, key, column, like):
    """What a sparsifier keeps the largest of at element k of a block: |v| for top-k (NaN counts
    as 0), a draw keyed by the column alone for random-k (so every worker keeps the same positions
    without sending them)."""
    if kind == 2:  # top-k
        magnitude = abs(values[k] - public[k])
        return magnitude if magnitude == magnitude else 0.0
    return uniform(column, key, like)


def _threshold(values, public, length, kind, key, first_column, kept, like):
    """The kept-th largest priority T of a block, exactly: a quickselect that moves nothing. The
    interval (low, high) holds T, with at least ``kept`` priorities ≥ low and fewer ≥ high; each
    pass counts those ≥ a pivot (an element of the interval nearest its middle) and halves it,
    until no priority lies strictly inside."""
    high = -1.0
    for k in range(length):
        high = maximum(high, _priority(values, public, k, kind, key, first_column + k, like))
    low = -1.0  # below every priority
    pivot = high
    found = False
    threshold = high
    while not found:
        at_least = 0.0
        # the next pivot for either outcome: nearest the middle of (low, pivot) and of (pivot, high)
        below, above = low, pivot
        below_middle, above_middle = 0.5 * (low + pivot), 0.5 * (pivot + high)
        for k in range(length):
            value = _priority(values, public, k, kind, key, first_column + k, like)
            at_least += 1.0 if value >= pivot else 0.0
            if low < value < pivot and (below == low or abs(value - below_middle) < abs(below - below_middle)):
                below = value
            if pivot < value < high and (above == pivot or abs(value - above_middle) < abs(above - above_middle)):
                above = value
        if at_least >= kept:
            low = pivot
            found = above == pivot  # nothing between the pivot and high: T is the pivot
            threshold = pivot
            pivot = above
        else:
            high = pivot
            found = below == low  # nothing between low and the pivot: T is low
            threshold = low
            pivot = below
    return threshold


def _share_block(values, public, start, stop, kind, levels, nearest, kept, factor, key, offset):
    """x̂ ← x̂ + Q(v − x̂) over the columns [start, stop) of one worker's row: the public copy takes in
    the compressed difference, as every neighbour reconstructs it. ``offset`` numbers the row's
    elements for stochastic rounding (worker·D)."""
    # 1-D slices indexed from 0: Numba vectorises these loops, not x[start + k] (NOTES.md)
    v, p = values[start:stop], public[start:stop]
    length = stop - start
    if kind == 0:  # identity
        for k in range(length):
            p[k] = p[k] + (v[k] - p[k])
    elif kind == 1:  # quantize
        scale = _block_scale(v, p, length)
        if scale > 0.0:
            for k in range(length):
                code = _code(v[k] - p[k], scale, levels, nearest, offset + start + k, key)
                p[k] = _dequantized(p[k], scale, code, levels)
    else:
        threshold, ties = _selection(v, p, length, kind, key, start, kept)
        for k in range(length):
            mine = _priority(v, p, k, kind, key, start + k, threshold)
            if mine > threshold:
                p[k] = p[k] + (v[k] - p[k]) * factor
            elif mine == threshold and ties > 0.0:
                p[k] = p[k] + (v[k] - p[k]) * factor
                ties -= 1.0


def _block_scale(v, p, length):
    """s = max|v − x̂| over a block."""
    scale = 0.0
    for k in range(length):
        scale = maximum(scale, abs(v[k] - p[k]))
    return scale


def _code(difference, scale, levels, nearest, index, key):
    """c = round(d/s·L), stochastic (P(up) = the fraction) or to nearest, ties up."""
    code = difference / scale * levels
    draw = 0.5 if nearest else uniform(index, key, code)
    return min(max(floor(code + draw), -levels), levels)  # c + u may round up to L + 1


def _dequantized(public, scale, code, levels):
    """x̂ + s·c/L: what sender and receivers add for a code."""
    return public + scale * code / levels


def _selection(v, p, length, kind, key, start, kept):
    """A sparsifier's threshold T and how many priorities equal to T it keeps: the ``kept``
    largest, ties to the lower column (every one above T, then the first of those equal to T)."""
    threshold = _threshold(v, p, length, kind, key, start, kept, 0.0)
    above = 0.0
    for k in range(length):
        above += 1.0 if _priority(v, p, k, kind, key, start + k, threshold) > threshold else 0.0
    return threshold, kept - above


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
    _local_steps(
        param[worker][start:stop],
        grad[worker][start:stop],
        exp_avg[worker][start:stop],
        exp_avg_sq[worker][start:stop],
        clip[worker],
        decay[start:stop],
        decoupled_factor,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        eps,
        step_size,
        inverse_bias_correction2_sqrt,
    )
    _share_block(param[worker], public[worker], start, stop, kind, levels, nearest, kept, factor, key, worker * width)


def _local_steps(
    x,
    g,
    m,
    v,
    scale,
    decay,
    decoupled_factor,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    step_size,
    inverse_bias_correction2_sqrt,
):
    """The local AdamW update of a block's slices, in place."""
    for k in range(x.shape[0]):
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
    x_i + γ Σ_j W_ij (x̂_j − x̂_i) over the worker's ``neighbours`` (their γW_ij in ``weights``),
    added to x_i in place a neighbour at a time; ATC's x_i is already adapted, AWC's steps AdamW
    from the mixed value."""
    width = param.shape[1]
    start, stop = _span(block, block_size, width)
    x, own = param[worker][start:stop], public[worker][start:stop]
    for n in range(neighbours.shape[1]):
        weight = weights[worker, n]
        if weight != 0.0:
            theirs = public[neighbours[worker, n]][start:stop]
            for k in range(stop - start):
                x[k] = x[k] + weight * (theirs[k] - own[k])
    if not atc:
        _local_steps(
            x,
            grad[worker][start:stop],
            exp_avg[worker][start:stop],
            exp_avg_sq[worker][start:stop],
            clip[worker],
            decay[start:stop],
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
    x, y = param[worker][start:stop], outer[worker][start:stop]
    e, q = residual[worker][start:stop], sent[worker][start:stop]
    for k in range(stop - start):
        e[k] = e[k] + (y[k] - x[k])
        q[k] = 0.0
    _share_block(residual[worker], sent[worker], start, stop, kind, levels, nearest, kept, factor, key, worker * width)
    for k in range(stop - start):
        e[k] = e[k] - q[k]


def outer_step(worker, block, param, outer, momentum_buffer, sent, neighbours, weights, lr, momentum, block_size):
    """The second launch: Δ̄_i = Σ_j W_ij q_j over the worker's ``neighbours`` (itself included,
    summed into x_i a neighbour at a time), then torch's Nesterov SGD on the outer copy,
    b ← μb + Δ̄, y ← y − α(Δ̄ + μb), and x ← y."""
    width = param.shape[1]
    start, stop = _span(block, block_size, width)
    x, y, b = param[worker][start:stop], outer[worker][start:stop], momentum_buffer[worker][start:stop]
    for k in range(stop - start):
        x[k] = 0.0
    for n in range(neighbours.shape[1]):
        weight = weights[worker, n]
        if weight != 0.0:
            theirs = sent[neighbours[worker, n]][start:stop]
            for k in range(stop - start):
                x[k] = x[k] + weight * theirs[k]
    for k in range(stop - start):
        velocity = momentum * b[k] + x[k]
        b[k] = velocity
        y[k] = y[k] - lr * (x[k] + momentum * velocity)
        x[k] = y[k]


def choco_encode(
    worker,
    block,
    values,
    public,
    message,
    selected,
    scales,
    kind,
    levels,
    nearest,
    kept_full,
    kept_last,
    factor_full,
    factor_last,
    key,
    block_size,
    offset,
):
    """`choco_share` that also writes what travels, for a rank to send: per element the
    ``message`` (a code, or the difference x − x̂) and whether it is ``selected`` to travel, per
    block the scale (quantization). ``offset`` numbers row 0's first element (a rank's: rank·D)."""
    width = values.shape[1]
    start, stop, kept, factor = _block_numbers(block, block_size, width, kept_full, kept_last, factor_full, factor_last)
    v, p = values[worker][start:stop], public[worker][start:stop]
    m, chosen = message[worker][start:stop], selected[worker][start:stop]
    length = stop - start
    first = offset + worker * width + start
    if kind == 0:  # identity
        for k in range(length):
            m[k] = v[k] - p[k]
            chosen[k] = 1.0
            p[k] = p[k] + m[k]
    elif kind == 1:  # quantize
        scale = _block_scale(v, p, length)
        scales[worker, block] = scale
        for k in range(length):
            m[k] = 0.0
            chosen[k] = 1.0
        if scale > 0.0:
            for k in range(length):
                m[k] = _code(v[k] - p[k], scale, levels, nearest, first + k, key)
                p[k] = _dequantized(p[k], scale, m[k], levels)
    else:
        threshold, ties = _selection(v, p, length, kind, key, start, kept)
        for k in range(length):
            mine = _priority(v, p, k, kind, key, start + k, threshold)
            taken = mine > threshold or (mine == threshold and ties > 0.0)
            ties -= 1.0 if taken and mine == threshold else 0.0
            m[k] = v[k] - p[k] if taken else 0.0
            chosen[k] = 1.0 if taken else 0.0
            if taken:
                p[k] = p[k] + m[k] * factor


def choco_decode(worker, block, public, message, selected, scales, kind, levels, factor_full, factor_last, block_size):
    """A receiver's x̂_j ← x̂_j + Q_j from what `choco_encode` wrote on the sender: the same
    additions, so every copy equals the sender's own bit for bit."""
    width = public.shape[1]
    start, stop = _span(block, block_size, width)
    factor = factor_full if stop - start == block_size else factor_last
    p, m, chosen = public[worker][start:stop], message[worker][start:stop], selected[worker][start:stop]
    length = stop - start
    if kind == 0:
        for k in range(length):
            p[k] = p[k] + m[k]
    elif kind == 1:
        scale = scales[worker, block]
        if scale > 0.0:
            for k in range(length):
                p[k] = _dequantized(p[k], scale, m[k], levels)
    else:
        for k in range(length):
            if chosen[k] != 0.0:
                p[k] = p[k] + m[k] * factor


GRIDS = (
    Grid("choco_share"),
    Grid("choco_adapt"),
    Grid("choco_mix"),
    Grid("outer_share"),
    Grid("outer_step"),
    Grid("choco_encode"),
    Grid("choco_decode"),
)
