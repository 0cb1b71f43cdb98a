"""Reference models: softmax regression and a one-hidden-layer MLP with exact Hessian-vector products.

Batched over the N workers of an [N, D] parameter arena in passes that need no atomics:
``sample_pass`` runs once per (worker, sample) and leaves each sample's forward values and
backward deltas in workspace arrays; ``tangent_pass`` runs once per (direction, sample) and
leaves their R-operator twins; ``parameter_pass`` runs once per (worker or direction, row of a
parameter tensor) and sums either over the batch. A direction is taken at its own worker's
parameters, or at the one shared point when there is a single row of them: the forward and
backward work is then done once, not once per direction. Offsets ``w1, b1, w2, b2`` place each
tensor in a worker's row (``steadystep.models`` computes them with the arena's layout).
Softmax regression is the MLP without a hidden layer (the workspace arrays of the hidden layer
then have width 0 and the output layer reads x).

One sample x with label y, batch weight ω = 1/(valid labels in the batch), ω = 0 for y < 0::

    a = act(W1ᵀx + b1)         z = W2ᵀa + b2           ℓ = ω·(logsumexp(z) − z_y)
    δz = ω·(softmax(z) − e_y)   δh = act'(a) ⊙ (W2 δz)

The R-operator (Pearlmutter 1994) along a tangent V = (V1, Vb1, V2, Vb2) gives H·V exactly::

    Rh = V1ᵀx + Vb1    Ra = act'(a) ⊙ Rh    Rz = V2ᵀa + W2ᵀRa + Vb2
    Rδz = ω·p ⊙ (Rz − ⟨p, Rz⟩)               (p = softmax(z))
    Rδh = act'(a) ⊙ (V2 δz + W2 Rδz) + act''(a) ⊙ Rh ⊙ (W2 δz)

and the parameter pass forms ∂W1 = Σ x δhᵀ, ∂b1 = Σ δh, ∂W2 = Σ a δzᵀ, ∂b2 = Σ δz, or
(H·V)_W1 = Σ x Rδhᵀ, (H·V)_b1 = Σ Rδh, (H·V)_W2 = Σ (Ra δzᵀ + a Rδzᵀ), (H·V)_b2 = Σ Rδz.
"""

import math

from steadystep.kernels import Grid
from steadystep.kernels.autograd_ops import grad_relu, grad_tanh
from steadystep.kernels.numerical_stability import (
    _exp_lift,
    _exp_merge,
    _logsumexp_finish,
    _max_merge,
    _softmax_share,
    _softmax_value,
)


def _activate(pre, relu):
    """tanh or relu (relu keeps NaN: a broken input must not look like a dead unit)."""
    if relu:
        if pre > 0.0 or pre != pre:
            return pre
        return 0.0
    return math.tanh(pre)


def _activation_grad(act, upstream, relu):
    """act'(h)·upstream, from the activation's output act = act(h)."""
    if relu:
        return grad_relu(act, upstream)
    return grad_tanh(act, upstream)


def _activation_curvature(act, upstream, relu):
    """act''(h)·upstream from act = act(h): −2·tanh·(1 − tanh²) for tanh, 0 for relu (a.e.)."""
    if relu:
        return 0.0
    return -2.0 * act * grad_tanh(act, upstream)


def _widths(features, activation, delta_out):
    """(hidden units, classes, inputs of the output layer) from the workspace shapes."""
    if activation.shape[2]:
        return activation.shape[2], delta_out.shape[2], activation.shape[2]
    return activation.shape[2], delta_out.shape[2], features.shape[1]


def _layer_input(features, row, activation, worker, sample, j):
    """Input j of the output layer: the hidden activation, or the feature without a hidden layer."""
    if activation.shape[2]:
        return activation[worker, sample, j]
    return features[row, j]


def _tangent_layer_input(tangent_activation, worker, sample, j):
    if tangent_activation.shape[2]:
        return tangent_activation[worker, sample, j]
    return 0.0


def _point(rows, direction):
    """The row of the parameters (and of the forward workspaces) a direction is taken at: its
    own, or the one shared point."""
    if rows == 1:
        return 0
    return direction


def _batch_weight(label, valid, worker):
    """ω: 1/(valid labels in the worker's batch), 0 for an ignored label (y < 0)."""
    if label >= 0:
        return 1.0 / valid[worker]
    return 0.0


def _hidden_layer(target, weights, features, row, w1, b1, hidden):
    """target ← W1ᵀx + b1 for the W1 and b1 inside ``weights`` (a parameter or tangent row),
    accumulated row by row of W1 so the innermost loop runs along contiguous memory."""
    _assign(target, weights[b1 : b1 + hidden], hidden)
    for f in range(features.shape[1]):
        start = w1 + f * hidden
        _accumulate(target, features[row, f], weights[start : start + hidden], hidden)


def sample_pass(
    worker,
    sample,
    params,
    features,
    labels,
    batch,
    valid,
    losses,
    correct,
    activation,
    delta_hidden,
    delta_out,
    probabilities,
    w1,
    b1,
    w2,
    b2,
    relu,
):
    """Forward, loss and backward deltas of one sample; softmax(z) in ``probabilities`` for the
    tangent pass (without one, ``probabilities`` is ``delta_out``, and the deltas overwrite it)."""
    # 1-D views: Numba vectorizes loops over them, not over 3-D indexing (NOTES.md)
    x = params[worker]
    activated, out, chances = activation[worker, sample], delta_out[worker, sample], probabilities[worker, sample]
    row = batch[worker, sample]
    label = labels[row]
    hidden, classes, width = _widths(features, activation, delta_out)
    weight = _batch_weight(label, valid, worker)

    _hidden_layer(activated, x, features, row, w1, b1, hidden)  # pre-activations W1ᵀx + b1
    for h in range(hidden):
        activated[h] = _activate(activated[h], relu)

    # logits z in delta_out until they become the deltas
    _assign(out, x[b2 : b2 + classes], classes)
    for j in range(width):
        start = w2 + j * classes
        _accumulate(
            out, _layer_input(features, row, activation, worker, sample, j), x[start : start + classes], classes
        )
    high = -math.inf
    for c in range(classes):
        (high,) = _max_merge(high, out[c])
    total, compensation = 0.0, 0.0
    predicted = classes  # none yet: the first maximal logit wins ties
    for c in range(classes):
        logit = out[c]
        lift_share, lift_compensation = _exp_lift(logit, high)
        total, compensation = _exp_merge(total, compensation, lift_share, lift_compensation)
        if logit == high and predicted == classes:
            predicted = c
    losses[worker, sample] = 0.0
    correct[worker, sample] = 0.0
    if label >= 0:
        losses[worker, sample] = weight * (_logsumexp_finish(high, total, compensation, 1.0) - out[label])
        if predicted == label:
            correct[worker, sample] = 1.0
    for c in range(classes):
        lift_share, lift_compensation = _exp_lift(out[c], high)
        probability = _softmax_value(_softmax_share(lift_share, lift_compensation), high, total, compensation, 1.0)
        target = 0.0
        if c == label:
            target = 1.0
        chances[c] = probability
        out[c] = weight * (probability - target)

    for h in range(hidden):
        weights = x[w2 + h * classes : w2 + h * classes + classes]
        upstream = 0.0
        for c in range(classes):
            upstream += weights[c] * out[c]
        delta_hidden[worker, sample, h] = _activation_grad(activated[h], upstream, relu)


def tangent_pass(
    direction,
    sample,
    params,
    tangent,
    features,
    labels,
    batch,
    valid,
    activation,
    delta_out,
    probabilities,
    tangent_activation,
    tangent_delta_hidden,
    tangent_delta_out,
    w1,
    b1,
    w2,
    b2,
    relu,
):
    """The R-operator twins of one sample's forward values and deltas along ``tangent[direction]``
    (after the sample pass at the direction's point): Ra, Rδz and Rδh, with Rh and Rz kept in
    the arrays of Rδh and Rδz until those are formed."""
    point = _point(params.shape[0], direction)
    x, v = params[point], tangent[direction]
    activated, out, chances = activation[point, sample], delta_out[point, sample], probabilities[point, sample]
    pre_tangent, act_tangent = tangent_delta_hidden[direction, sample], tangent_activation[direction, sample]
    out_tangent = tangent_delta_out[direction, sample]
    row = batch[point, sample]
    label = labels[row]
    hidden, classes, width = _widths(features, activation, delta_out)
    weight = _batch_weight(label, valid, point)

    _hidden_layer(pre_tangent, v, features, row, w1, b1, hidden)  # Rh = V1ᵀx + Vb1
    for h in range(hidden):
        act_tangent[h] = _activation_grad(activated[h], pre_tangent[h], relu)

    _assign(out_tangent, v[b2 : b2 + classes], classes)
    for j in range(width):
        start = w2 + j * classes
        _accumulate_pair(
            out_tangent,
            _layer_input(features, row, activation, point, sample, j),
            v[start : start + classes],
            _tangent_layer_input(tangent_activation, direction, sample, j),
            x[start : start + classes],
            classes,
        )
    tangent_mean = 0.0
    for c in range(classes):
        tangent_mean += chances[c] * out_tangent[c]
    for c in range(classes):
        out_tangent[c] = weight * chances[c] * (out_tangent[c] - tangent_mean)

    for h in range(hidden):
        weights, tangent_weights = (
            x[w2 + h * classes : w2 + h * classes + classes],
            v[w2 + h * classes : w2 + h * classes + classes],
        )
        upstream = 0.0
        tangent_upstream = 0.0
        for c in range(classes):
            upstream += weights[c] * out[c]
            tangent_upstream += tangent_weights[c] * out[c] + weights[c] * out_tangent[c]
        act = activated[h]
        tangent_pre = pre_tangent[h]
        pre_tangent[h] = _activation_grad(act, tangent_upstream, relu) + _activation_curvature(
            act, tangent_pre * upstream, relu
        )


def hidden_row_pass(
    worker, row, features, batch, activation, delta_hidden, tangent_delta_hidden, result, w1, b1, with_tangent
):
    """One row of W1 (rows 0..F−1) or b1 (row F) of one worker's gradient, or with
    ``with_tangent`` of one direction's H·V, summed over the batch into ``result``.

    An outer-product sum Σ_s coefficient_s · δh_s along the hidden units (contiguous, so the
    innermost loop vectorizes), in sample order, so the bits do not depend on the layout.
    The parameter gradient is three grids (these rows, the classes' columns, the padding)
    rather than one: as one kernel it needed 255 registers a thread on the GPU and spilled,
    each part alone ~40.
    """
    hidden = activation.shape[2]
    point = worker
    deltas = delta_hidden
    if with_tangent:
        point = _point(activation.shape[0], worker)
        deltas = tangent_delta_hidden
    sums = result[worker]  # a 1-D view, so the sums vectorize
    start = b1
    if row < features.shape[1]:
        start = w1 + row * hidden
    _clear(result, worker, start, start + hidden)
    for sample in range(batch.shape[1]):
        coefficient = 1.0
        if row < features.shape[1]:
            coefficient = features[batch[point, sample], row]
        _accumulate(sums[start : start + hidden], coefficient, deltas[worker, sample], hidden)


def class_column_pass(
    worker,
    c,
    features,
    batch,
    activation,
    delta_out,
    tangent_activation,
    tangent_delta_out,
    result,
    column_sums,
    w2,
    b2,
    with_tangent,
):
    """Column c of W2 and b2[c] of one worker's gradient, or with ``with_tangent`` of one
    direction's H·V, summed over the batch.

    W2's columns run along the layer's inputs (32 wide, not 10 like its rows), in a row of
    ``column_sums`` that is copied into W2's strided column at the end.
    """
    hidden, classes, width = _widths(features, activation, delta_out)
    point = worker
    output_deltas = delta_out
    if with_tangent:
        point = _point(activation.shape[0], worker)
        output_deltas = tangent_delta_out
    column = column_sums[worker, c]
    for j in range(width):
        column[j] = 0.0
    bias = 0.0
    for sample in range(batch.shape[1]):
        delta = output_deltas[worker, sample, c]
        bias += delta
        inputs = features[batch[point, sample]]  # the layer's inputs: x, or a with a hidden layer
        if hidden:
            inputs = activation[point, sample]
        if with_tangent and hidden:
            _accumulate_pair(
                column, delta, inputs, delta_out[point, sample, c], tangent_activation[worker, sample], width
            )
        else:
            _accumulate(column, delta, inputs, width)
    result[worker, b2 + c] = bias
    for j in range(width):
        result[worker, w2 + j * classes + c] = column[j]


def padding_pass(worker, stretch, features, activation, delta_out, result, w1, b1, w2, b2):
    """Zeroes one of the four stretches of padding (after W1, b1, W2 and b2) of one worker's
    row of ``result`` (softmax regression: w1 = b1 = 0, so the first two are empty). One loop
    a thread: four in one thread unrolled into 178 registers on the GPU."""
    hidden, classes, width = _widths(features, activation, delta_out)
    start = b2 + classes
    stop = result.shape[1]
    if stretch == 0:
        start = w1 + features.shape[1] * hidden
        stop = b1
    elif stretch == 1:
        start = b1 + hidden
        stop = w2
    elif stretch == 2:
        start = w2 + width * classes
        stop = b2
    _clear(result, worker, start, stop)


def _accumulate(target, coefficient, values, length):
    """target += coefficient · values over ``length`` elements, in place.

    Callers pass slices rather than offsets: ``target[start + k]`` might be a negative index
    to Numba, and its wraparound check stops the loop from vectorizing (8x here)."""
    for k in range(length):
        target[k] += coefficient * values[k]


def _accumulate_pair(target, coefficient, values, other_coefficient, other_values, length):
    """target += coefficient · values, then += other_coefficient · other_values, in one pass:
    the same bits as two ``_accumulate`` calls, with half the loops (~8% of the tangent and
    parameter passes, whose vectors are only 10 to 32 wide)."""
    for k in range(length):
        target[k] = (target[k] + coefficient * values[k]) + other_coefficient * other_values[k]


def _assign(target, values, length):
    for k in range(length):
        target[k] = values[k]


def _clear(result, worker, start, stop):
    for index in range(start, stop):
        result[worker, index] = 0.0


GRIDS = (
    Grid("sample_pass"),
    Grid("tangent_pass"),
    Grid("hidden_row_pass"),
    Grid("class_column_pass"),
    Grid("padding_pass"),
)
