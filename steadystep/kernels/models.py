"""Reference models: softmax regression and a one-hidden-layer MLP with exact Hessian-vector products.

Batched over the N workers of an [N, D] parameter arena in two passes that need no atomics:
``sample_pass`` runs once per (worker, sample) and leaves each sample's backward deltas in
workspace arrays; ``parameter_pass`` runs once per (worker, parameter) and sums them over the
batch. Offsets ``w1, b1, w2, b2`` place each tensor in a worker's row (``steadystep.models``
computes them with the arena's layout). Softmax regression is the MLP without a hidden layer
(the workspace arrays of the hidden layer then have width 0 and the output layer reads x).

One sample x with label y, batch weight ω = 1/(valid labels in the batch), ω = 0 for y < 0::

    a = act(W1ᵀx + b1)         z = W2ᵀa + b2           ℓ = ω·(logsumexp(z) − z_y)
    δz = ω·(softmax(z) − e_y)   δh = act'(a) ⊙ (W2 δz)

The R-operator (Pearlmutter 1994) along a tangent V = (V1, Vb1, V2, Vb2) gives H·V exactly::

    Rh = V1ᵀx + Vb1    Ra = act'(a) ⊙ Rh    Rz = V2ᵀa + W2ᵀRa + Vb2
    Rδz = ω·p ⊙ (Rz − ⟨p, Rz⟩)               (p = softmax(z))
    Rδh = act'(a) ⊙ (V2 δz + W2 Rδz) + act''(a) ⊙ Rh ⊙ (W2 δz)

and the parameter pass forms ∂W1 = Σ x δhᵀ, ∂b1 = Σ δh, ∂W2 = Σ a δzᵀ, ∂b2 = Σ δz, and
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


def sample_pass(worker, sample, params, tangent, features, labels, batch, losses, correct,
                activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden,
                tangent_delta_out, w1, b1, w2, b2, relu, with_tangent):
    """Forward, loss, backward deltas (and with ``with_tangent`` their R-operator twins) of one sample."""
    x = params[worker]
    v = tangent[worker]
    row = batch[worker, sample]
    label = labels[row]
    hidden, classes, width = _widths(features, activation, delta_out)
    valid = 0.0
    for k in range(batch.shape[1]):
        if labels[batch[worker, k]] >= 0:
            valid += 1.0
    weight = 0.0
    if label >= 0:
        weight = 1.0 / valid

    for h in range(hidden):
        pre = x[b1 + h]
        for f in range(features.shape[1]):
            pre += features[row, f] * x[w1 + f * hidden + h]
        act = _activate(pre, relu)
        activation[worker, sample, h] = act
        if with_tangent:
            tangent_pre = v[b1 + h]
            for f in range(features.shape[1]):
                tangent_pre += features[row, f] * v[w1 + f * hidden + h]
            tangent_activation[worker, sample, h] = _activation_grad(act, tangent_pre, relu)
            tangent_delta_hidden[worker, sample, h] = tangent_pre  # Rh, until the backward pass below

    # logits z in delta_out (Rz in tangent_delta_out) until they become the deltas
    high = -math.inf
    for c in range(classes):
        logit = x[b2 + c]
        tangent_logit = v[b2 + c]
        for j in range(width):
            layer_input = _layer_input(features, row, activation, worker, sample, j)
            logit += layer_input * x[w2 + j * classes + c]
            if with_tangent:
                tangent_logit += layer_input * v[w2 + j * classes + c]
                tangent_logit += _tangent_layer_input(tangent_activation, worker, sample, j) * x[w2 + j * classes + c]
        delta_out[worker, sample, c] = logit
        if with_tangent:
            tangent_delta_out[worker, sample, c] = tangent_logit
        (high,) = _max_merge(high, logit)
    count, rest, compensation = 0.0, 0.0, 0.0
    predicted = classes  # none yet: the first maximal logit wins ties
    for c in range(classes):
        logit = delta_out[worker, sample, c]
        lift_count, lift_rest, lift_compensation = _exp_lift(logit, high)
        count, rest, compensation = _exp_merge(count, rest, compensation, lift_count, lift_rest, lift_compensation)
        if logit == high and predicted == classes:
            predicted = c
    losses[worker, sample] = 0.0
    correct[worker, sample] = 0.0
    if label >= 0:
        losses[worker, sample] = weight * (_logsumexp_finish(high, count, rest, compensation, 1.0) - delta_out[worker, sample, label])
        if predicted == label:
            correct[worker, sample] = 1.0
    tangent_mean = 0.0
    if with_tangent:
        for c in range(classes):
            probability = _softmax_value(delta_out[worker, sample, c], high, count, rest, compensation, 1.0)
            tangent_mean += probability * tangent_delta_out[worker, sample, c]
    for c in range(classes):
        probability = _softmax_value(delta_out[worker, sample, c], high, count, rest, compensation, 1.0)
        target = 0.0
        if c == label:
            target = 1.0
        delta_out[worker, sample, c] = weight * (probability - target)
        if with_tangent:
            tangent_delta_out[worker, sample, c] = weight * probability * (tangent_delta_out[worker, sample, c] - tangent_mean)

    for h in range(hidden):
        upstream = 0.0
        tangent_upstream = 0.0
        for c in range(classes):
            upstream += x[w2 + h * classes + c] * delta_out[worker, sample, c]
            if with_tangent:
                tangent_upstream += v[w2 + h * classes + c] * delta_out[worker, sample, c]
                tangent_upstream += x[w2 + h * classes + c] * tangent_delta_out[worker, sample, c]
        act = activation[worker, sample, h]
        delta_hidden[worker, sample, h] = _activation_grad(act, upstream, relu)
        if with_tangent:
            tangent_pre = tangent_delta_hidden[worker, sample, h]
            tangent_delta_hidden[worker, sample, h] = _activation_grad(act, tangent_upstream, relu) + _activation_curvature(
                act, tangent_pre * upstream, relu
            )


def parameter_pass(worker, index, features, batch, activation, delta_hidden, delta_out, tangent_activation,
                   tangent_delta_hidden, tangent_delta_out, gradient, hessian_vector, w1, b1, w2, b2, with_tangent):
    """One parameter of one worker: its gradient (and H·V entry), summed over the worker's batch."""
    hidden, classes, width = _widths(features, activation, delta_out)
    total = 0.0
    tangent_total = 0.0
    if hidden and w1 <= index < w1 + features.shape[1] * hidden:
        f = (index - w1) // hidden
        h = (index - w1) % hidden
        for sample in range(batch.shape[1]):
            feature = features[batch[worker, sample], f]
            total += feature * delta_hidden[worker, sample, h]
            if with_tangent:
                tangent_total += feature * tangent_delta_hidden[worker, sample, h]
    elif hidden and b1 <= index < b1 + hidden:
        h = index - b1
        for sample in range(batch.shape[1]):
            total += delta_hidden[worker, sample, h]
            if with_tangent:
                tangent_total += tangent_delta_hidden[worker, sample, h]
    elif w2 <= index < w2 + width * classes:
        j = (index - w2) // classes
        c = (index - w2) % classes
        for sample in range(batch.shape[1]):
            layer_input = _layer_input(features, batch[worker, sample], activation, worker, sample, j)
            total += layer_input * delta_out[worker, sample, c]
            if with_tangent:
                tangent_total += layer_input * tangent_delta_out[worker, sample, c]
                tangent_total += _tangent_layer_input(tangent_activation, worker, sample, j) * delta_out[worker, sample, c]
    elif b2 <= index < b2 + classes:
        c = index - b2
        for sample in range(batch.shape[1]):
            total += delta_out[worker, sample, c]
            if with_tangent:
                tangent_total += tangent_delta_out[worker, sample, c]
    gradient[worker, index] = total
    if with_tangent:
        hessian_vector[worker, index] = tangent_total


# a parameter sums over a batch (little work per call); a sample runs a whole forward/backward
GRIDS = (Grid("sample_pass"), Grid("parameter_pass", inline=True))
