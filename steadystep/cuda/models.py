"""CUDA kernels generated from steadystep/kernels/models.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

from numba import cuda
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cuda.primitives import ROW_THREADS, at, cast_like, math, put  # noqa: F401

# Numba's cache checks only this file: a change to the primitives these kernels inline must
# rewrite it, and test_codegen fails until codegen has
PRIMITIVES_DIGEST = "8081250d6df4c601"


@cuda.jit(device=True, inline="always")
def log1p_f32(x):
    return math.log1p(x)


@cuda.jit(device=True, inline="always")
def exp_f32(x):
    return math.exp(x)


@cuda.jit(device=True, inline="always")
def is_finite_f32(x):
    return x == x and abs(x) <= float32(3.4028234663852886e+38)


@cuda.jit(device=True, inline="always")
def exp_difference_f32(x, y):
    difference = x - y
    virtual = difference - x
    error = x - (difference - virtual) + (-y - virtual)
    term = exp_f32(difference)
    return term + term * error if is_finite_f32(difference) else term


@cuda.jit(device=True, inline="always")
def neumaier_add_f32(sum_a, compensation_a, sum_b, compensation_b):
    total = sum_a + sum_b
    a_larger = abs(sum_a) >= abs(sum_b)
    larger = sum_a if a_larger else sum_b
    smaller = sum_b if a_larger else sum_a
    return (total, compensation_a + compensation_b + (larger - total + smaller))


@cuda.jit(device=True, inline="always")
def grad_relu_f32(x, upstream):
    if x > float32(0.0):
        return upstream
    return float32(0.0)


@cuda.jit(device=True, inline="always")
def grad_tanh_f32(tanh_out, upstream):
    return (float32(1.0) - tanh_out * tanh_out) * upstream


@cuda.jit(device=True, inline="always")
def _max_merge_f32(a, b):
    return (b if a == a and (b != b or b > a) else a,)


@cuda.jit(device=True, inline="always")
def _exp_lift_f32(x, high):
    share = exp_difference_f32(x, high)
    return (float32(1.0) if x == high else float32(0.0), float32(0.0) if x == high else share, float32(0.0))


@cuda.jit(device=True, inline="always")
def _exp_merge_f32(count_a, rest_a, compensation_a, count_b, rest_b, compensation_b):
    rest, compensation = neumaier_add_f32(rest_a, compensation_a, rest_b, compensation_b)
    return (count_a + count_b, rest, compensation)


@cuda.jit(device=True, inline="always")
def _log_total_f32(count, rest, compensation):
    return log1p_f32(count - float32(1.0) + (rest + compensation))


@cuda.jit(device=True, inline="always")
def _logsumexp_finish_f32(high, count, rest, compensation, length):
    if abs(high) > float32(3.4028234663852886e+38) or high != high:
        return high
    return high + _log_total_f32(count, rest, compensation)


@cuda.jit(device=True, inline="always")
def _softmax_share_f32(is_max, share, compensation):
    return is_max + share


@cuda.jit(device=True, inline="always")
def _softmax_value_f32(share, high, count, rest, compensation, length):
    value = share / (count + (rest + compensation)) if is_finite_f32(high) else share / count if high > float32(0.0) else float32(0.0)
    return value if high == high else high


@cuda.jit(device=True, inline="always")
def _activate_f32(pre, relu):
    if relu:
        if pre > float32(0.0) or pre != pre:
            return pre
        return float32(0.0)
    return math.tanh(pre)


@cuda.jit(device=True, inline="always")
def _activation_grad_f32(act, upstream, relu):
    if relu:
        return grad_relu_f32(act, upstream)
    return grad_tanh_f32(act, upstream)


@cuda.jit(device=True, inline="always")
def _activation_curvature_f32(act, upstream, relu):
    if relu:
        return float32(0.0)
    return -float32(2.0) * act * grad_tanh_f32(act, upstream)


@cuda.jit(device=True, inline="always")
def _widths_f32(features, activation, delta_out):
    if activation.shape[2]:
        return (activation.shape[2], delta_out.shape[2], activation.shape[2])
    return (activation.shape[2], delta_out.shape[2], features.shape[1])


@cuda.jit(device=True, inline="always")
def _layer_input_f32(features, row, activation, worker, sample, j):
    if activation.shape[2]:
        return activation[worker, sample, j]
    return features[row, j]


@cuda.jit(device=True, inline="always")
def _tangent_layer_input_f32(tangent_activation, worker, sample, j):
    if tangent_activation.shape[2]:
        return tangent_activation[worker, sample, j]
    return float32(0.0)


@cuda.jit(device=True, inline="always")
def _point_f32(rows, direction):
    if rows == 1:
        return 0
    return direction


@cuda.jit(device=True, inline="always")
def _batch_weight_f32(label, valid, worker):
    if label >= 0:
        return float32(1.0) / valid[worker]
    return float32(0.0)


@cuda.jit(device=True, inline="always")
def _hidden_layer_f32(target, weights, features, row, w1, b1, hidden):
    _assign_f32(target, weights[b1:b1 + hidden], hidden)
    for f in range(features.shape[1]):
        start = w1 + f * hidden
        _accumulate_f32(target, features[row, f], weights[start:start + hidden], hidden)


@cuda.jit(device=True, inline="always")
def sample_pass_f32(worker, sample, params, features, labels, batch, valid, losses, correct, activation, delta_hidden, delta_out, probabilities, w1, b1, w2, b2, relu):
    x = params[worker]
    activated, out, chances = (activation[worker, sample], delta_out[worker, sample], probabilities[worker, sample])
    row = batch[worker, sample]
    label = labels[row]
    hidden, classes, width = _widths_f32(features, activation, delta_out)
    weight = _batch_weight_f32(label, valid, worker)
    _hidden_layer_f32(activated, x, features, row, w1, b1, hidden)
    for h in range(hidden):
        activated[h] = _activate_f32(activated[h], relu)
    _assign_f32(out, x[b2:b2 + classes], classes)
    for j in range(width):
        start = w2 + j * classes
        _accumulate_f32(out, _layer_input_f32(features, row, activation, worker, sample, j), x[start:start + classes], classes)
    high = -float32(math.inf)
    for c in range(classes):
        high, = _max_merge_f32(high, out[c])
    count, rest, compensation = (float32(0.0), float32(0.0), float32(0.0))
    predicted = classes
    for c in range(classes):
        logit = out[c]
        lift_count, lift_rest, lift_compensation = _exp_lift_f32(logit, high)
        count, rest, compensation = _exp_merge_f32(count, rest, compensation, lift_count, lift_rest, lift_compensation)
        if logit == high and predicted == classes:
            predicted = c
    losses[worker, sample] = float32(0.0)
    correct[worker, sample] = float32(0.0)
    if label >= 0:
        losses[worker, sample] = weight * (_logsumexp_finish_f32(high, count, rest, compensation, float32(1.0)) - out[label])
        if predicted == label:
            correct[worker, sample] = float32(1.0)
    for c in range(classes):
        lift_count, lift_rest, lift_compensation = _exp_lift_f32(out[c], high)
        share = _softmax_share_f32(lift_count, lift_rest, lift_compensation)
        probability = _softmax_value_f32(share, high, count, rest, compensation, float32(1.0))
        target = float32(0.0)
        if c == label:
            target = float32(1.0)
        chances[c] = probability
        out[c] = weight * (probability - target)
    for h in range(hidden):
        weights = x[w2 + h * classes:w2 + h * classes + classes]
        upstream = float32(0.0)
        for c in range(classes):
            upstream += weights[c] * out[c]
        delta_hidden[worker, sample, h] = _activation_grad_f32(activated[h], upstream, relu)


@cuda.jit(device=True, inline="always")
def tangent_pass_f32(direction, sample, params, tangent, features, labels, batch, valid, activation, delta_out, probabilities, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu):
    point = _point_f32(params.shape[0], direction)
    x, v = (params[point], tangent[direction])
    activated, out, chances = (activation[point, sample], delta_out[point, sample], probabilities[point, sample])
    pre_tangent, act_tangent = (tangent_delta_hidden[direction, sample], tangent_activation[direction, sample])
    out_tangent = tangent_delta_out[direction, sample]
    row = batch[point, sample]
    label = labels[row]
    hidden, classes, width = _widths_f32(features, activation, delta_out)
    weight = _batch_weight_f32(label, valid, point)
    _hidden_layer_f32(pre_tangent, v, features, row, w1, b1, hidden)
    for h in range(hidden):
        act_tangent[h] = _activation_grad_f32(activated[h], pre_tangent[h], relu)
    _assign_f32(out_tangent, v[b2:b2 + classes], classes)
    for j in range(width):
        start = w2 + j * classes
        _accumulate_pair_f32(out_tangent, _layer_input_f32(features, row, activation, point, sample, j), v[start:start + classes], _tangent_layer_input_f32(tangent_activation, direction, sample, j), x[start:start + classes], classes)
    tangent_mean = float32(0.0)
    for c in range(classes):
        tangent_mean += chances[c] * out_tangent[c]
    for c in range(classes):
        out_tangent[c] = weight * chances[c] * (out_tangent[c] - tangent_mean)
    for h in range(hidden):
        weights, tangent_weights = (x[w2 + h * classes:w2 + h * classes + classes], v[w2 + h * classes:w2 + h * classes + classes])
        upstream = float32(0.0)
        tangent_upstream = float32(0.0)
        for c in range(classes):
            upstream += weights[c] * out[c]
            tangent_upstream += tangent_weights[c] * out[c] + weights[c] * out_tangent[c]
        act = activated[h]
        tangent_pre = pre_tangent[h]
        pre_tangent[h] = _activation_grad_f32(act, tangent_upstream, relu) + _activation_curvature_f32(act, tangent_pre * upstream, relu)


@cuda.jit(device=True, inline="always")
def hidden_row_pass_f32(worker, row, features, batch, activation, delta_hidden, tangent_delta_hidden, result, w1, b1, with_tangent):
    hidden = activation.shape[2]
    point = worker
    deltas = delta_hidden
    if with_tangent:
        point = _point_f32(activation.shape[0], worker)
        deltas = tangent_delta_hidden
    sums = result[worker]
    start = b1
    if row < features.shape[1]:
        start = w1 + row * hidden
    _clear_f32(result, worker, start, start + hidden)
    for sample in range(batch.shape[1]):
        coefficient = float32(1.0)
        if row < features.shape[1]:
            coefficient = features[batch[point, sample], row]
        _accumulate_f32(sums[start:start + hidden], coefficient, deltas[worker, sample], hidden)


@cuda.jit(device=True, inline="always")
def class_column_pass_f32(worker, c, features, batch, activation, delta_out, tangent_activation, tangent_delta_out, result, column_sums, w2, b2, with_tangent):
    hidden, classes, width = _widths_f32(features, activation, delta_out)
    point = worker
    output_deltas = delta_out
    if with_tangent:
        point = _point_f32(activation.shape[0], worker)
        output_deltas = tangent_delta_out
    column = column_sums[worker, c]
    for j in range(width):
        column[j] = float32(0.0)
    bias = float32(0.0)
    for sample in range(batch.shape[1]):
        delta = output_deltas[worker, sample, c]
        bias += delta
        inputs = features[batch[point, sample]]
        if hidden:
            inputs = activation[point, sample]
        if with_tangent and hidden:
            _accumulate_pair_f32(column, delta, inputs, delta_out[point, sample, c], tangent_activation[worker, sample], width)
        else:
            _accumulate_f32(column, delta, inputs, width)
    result[worker, b2 + c] = bias
    for j in range(width):
        result[worker, w2 + j * classes + c] = column[j]


@cuda.jit(device=True, inline="always")
def padding_pass_f32(worker, stretch, features, activation, delta_out, result, w1, b1, w2, b2):
    hidden, classes, width = _widths_f32(features, activation, delta_out)
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
    _clear_f32(result, worker, start, stop)


@cuda.jit(device=True, inline="always")
def _accumulate_f32(target, coefficient, values, length):
    for k in range(length):
        target[k] += coefficient * values[k]


@cuda.jit(device=True, inline="always")
def _accumulate_pair_f32(target, coefficient, values, other_coefficient, other_values, length):
    for k in range(length):
        target[k] = target[k] + coefficient * values[k] + other_coefficient * other_values[k]


@cuda.jit(device=True, inline="always")
def _assign_f32(target, values, length):
    for k in range(length):
        target[k] = values[k]


@cuda.jit(device=True, inline="always")
def _clear_f32(result, worker, start, stop):
    for index in range(start, stop):
        result[worker, index] = float32(0.0)


@cuda.jit(cache=True)
def sample_pass_f32_grid(rows, columns, params, features, labels, batch, valid, losses, correct, activation, delta_hidden, delta_out, probabilities, w1, b1, w2, b2, relu):
    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        sample_pass_f32(flat // columns, flat % columns, params, features, labels, batch, valid, losses, correct, activation, delta_hidden, delta_out, probabilities, w1, b1, w2, b2, relu)


@cuda.jit(cache=True)
def tangent_pass_f32_grid(rows, columns, params, tangent, features, labels, batch, valid, activation, delta_out, probabilities, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu):
    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        tangent_pass_f32(flat // columns, flat % columns, params, tangent, features, labels, batch, valid, activation, delta_out, probabilities, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu)


@cuda.jit(cache=True)
def hidden_row_pass_f32_grid(rows, columns, features, batch, activation, delta_hidden, tangent_delta_hidden, result, w1, b1, with_tangent):
    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        hidden_row_pass_f32(flat // columns, flat % columns, features, batch, activation, delta_hidden, tangent_delta_hidden, result, w1, b1, with_tangent)


@cuda.jit(cache=True)
def class_column_pass_f32_grid(rows, columns, features, batch, activation, delta_out, tangent_activation, tangent_delta_out, result, column_sums, w2, b2, with_tangent):
    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        class_column_pass_f32(flat // columns, flat % columns, features, batch, activation, delta_out, tangent_activation, tangent_delta_out, result, column_sums, w2, b2, with_tangent)


@cuda.jit(cache=True)
def padding_pass_f32_grid(rows, columns, features, activation, delta_out, result, w1, b1, w2, b2):
    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        padding_pass_f32(flat // columns, flat % columns, features, activation, delta_out, result, w1, b1, w2, b2)


@cuda.jit(device=True, inline="always")
def log1p_f64(x):
    return math.log1p(x)


@cuda.jit(device=True, inline="always")
def exp_f64(x):
    return math.exp(x)


@cuda.jit(device=True, inline="always")
def is_finite_f64(x):
    return x == x and abs(x) <= float64(1e+308)


@cuda.jit(device=True, inline="always")
def exp_difference_f64(x, y):
    difference = x - y
    virtual = difference - x
    error = x - (difference - virtual) + (-y - virtual)
    term = exp_f64(difference)
    return term + term * error if is_finite_f64(difference) else term


@cuda.jit(device=True, inline="always")
def neumaier_add_f64(sum_a, compensation_a, sum_b, compensation_b):
    total = sum_a + sum_b
    a_larger = abs(sum_a) >= abs(sum_b)
    larger = sum_a if a_larger else sum_b
    smaller = sum_b if a_larger else sum_a
    return (total, compensation_a + compensation_b + (larger - total + smaller))


@cuda.jit(device=True, inline="always")
def grad_relu_f64(x, upstream):
    if x > float64(0.0):
        return upstream
    return float64(0.0)


@cuda.jit(device=True, inline="always")
def grad_tanh_f64(tanh_out, upstream):
    return (float64(1.0) - tanh_out * tanh_out) * upstream


@cuda.jit(device=True, inline="always")
def _max_merge_f64(a, b):
    return (b if a == a and (b != b or b > a) else a,)


@cuda.jit(device=True, inline="always")
def _exp_lift_f64(x, high):
    share = exp_difference_f64(x, high)
    return (float64(1.0) if x == high else float64(0.0), float64(0.0) if x == high else share, float64(0.0))


@cuda.jit(device=True, inline="always")
def _exp_merge_f64(count_a, rest_a, compensation_a, count_b, rest_b, compensation_b):
    rest, compensation = neumaier_add_f64(rest_a, compensation_a, rest_b, compensation_b)
    return (count_a + count_b, rest, compensation)


@cuda.jit(device=True, inline="always")
def _log_total_f64(count, rest, compensation):
    return log1p_f64(count - float64(1.0) + (rest + compensation))


@cuda.jit(device=True, inline="always")
def _logsumexp_finish_f64(high, count, rest, compensation, length):
    if abs(high) > float64(1e+308) or high != high:
        return high
    return high + _log_total_f64(count, rest, compensation)


@cuda.jit(device=True, inline="always")
def _softmax_share_f64(is_max, share, compensation):
    return is_max + share


@cuda.jit(device=True, inline="always")
def _softmax_value_f64(share, high, count, rest, compensation, length):
    value = share / (count + (rest + compensation)) if is_finite_f64(high) else share / count if high > float64(0.0) else float64(0.0)
    return value if high == high else high


@cuda.jit(device=True, inline="always")
def _activate_f64(pre, relu):
    if relu:
        if pre > float64(0.0) or pre != pre:
            return pre
        return float64(0.0)
    return math.tanh(pre)


@cuda.jit(device=True, inline="always")
def _activation_grad_f64(act, upstream, relu):
    if relu:
        return grad_relu_f64(act, upstream)
    return grad_tanh_f64(act, upstream)


@cuda.jit(device=True, inline="always")
def _activation_curvature_f64(act, upstream, relu):
    if relu:
        return float64(0.0)
    return -float64(2.0) * act * grad_tanh_f64(act, upstream)


@cuda.jit(device=True, inline="always")
def _widths_f64(features, activation, delta_out):
    if activation.shape[2]:
        return (activation.shape[2], delta_out.shape[2], activation.shape[2])
    return (activation.shape[2], delta_out.shape[2], features.shape[1])


@cuda.jit(device=True, inline="always")
def _layer_input_f64(features, row, activation, worker, sample, j):
    if activation.shape[2]:
        return activation[worker, sample, j]
    return features[row, j]


@cuda.jit(device=True, inline="always")
def _tangent_layer_input_f64(tangent_activation, worker, sample, j):
    if tangent_activation.shape[2]:
        return tangent_activation[worker, sample, j]
    return float64(0.0)


@cuda.jit(device=True, inline="always")
def _point_f64(rows, direction):
    if rows == 1:
        return 0
    return direction


@cuda.jit(device=True, inline="always")
def _batch_weight_f64(label, valid, worker):
    if label >= 0:
        return float64(1.0) / valid[worker]
    return float64(0.0)


@cuda.jit(device=True, inline="always")
def _hidden_layer_f64(target, weights, features, row, w1, b1, hidden):
    _assign_f64(target, weights[b1:b1 + hidden], hidden)
    for f in range(features.shape[1]):
        start = w1 + f * hidden
        _accumulate_f64(target, features[row, f], weights[start:start + hidden], hidden)


@cuda.jit(device=True, inline="always")
def sample_pass_f64(worker, sample, params, features, labels, batch, valid, losses, correct, activation, delta_hidden, delta_out, probabilities, w1, b1, w2, b2, relu):
    x = params[worker]
    activated, out, chances = (activation[worker, sample], delta_out[worker, sample], probabilities[worker, sample])
    row = batch[worker, sample]
    label = labels[row]
    hidden, classes, width = _widths_f64(features, activation, delta_out)
    weight = _batch_weight_f64(label, valid, worker)
    _hidden_layer_f64(activated, x, features, row, w1, b1, hidden)
    for h in range(hidden):
        activated[h] = _activate_f64(activated[h], relu)
    _assign_f64(out, x[b2:b2 + classes], classes)
    for j in range(width):
        start = w2 + j * classes
        _accumulate_f64(out, _layer_input_f64(features, row, activation, worker, sample, j), x[start:start + classes], classes)
    high = -float64(math.inf)
    for c in range(classes):
        high, = _max_merge_f64(high, out[c])
    count, rest, compensation = (float64(0.0), float64(0.0), float64(0.0))
    predicted = classes
    for c in range(classes):
        logit = out[c]
        lift_count, lift_rest, lift_compensation = _exp_lift_f64(logit, high)
        count, rest, compensation = _exp_merge_f64(count, rest, compensation, lift_count, lift_rest, lift_compensation)
        if logit == high and predicted == classes:
            predicted = c
    losses[worker, sample] = float64(0.0)
    correct[worker, sample] = float64(0.0)
    if label >= 0:
        losses[worker, sample] = weight * (_logsumexp_finish_f64(high, count, rest, compensation, float64(1.0)) - out[label])
        if predicted == label:
            correct[worker, sample] = float64(1.0)
    for c in range(classes):
        lift_count, lift_rest, lift_compensation = _exp_lift_f64(out[c], high)
        share = _softmax_share_f64(lift_count, lift_rest, lift_compensation)
        probability = _softmax_value_f64(share, high, count, rest, compensation, float64(1.0))
        target = float64(0.0)
        if c == label:
            target = float64(1.0)
        chances[c] = probability
        out[c] = weight * (probability - target)
    for h in range(hidden):
        weights = x[w2 + h * classes:w2 + h * classes + classes]
        upstream = float64(0.0)
        for c in range(classes):
            upstream += weights[c] * out[c]
        delta_hidden[worker, sample, h] = _activation_grad_f64(activated[h], upstream, relu)


@cuda.jit(device=True, inline="always")
def tangent_pass_f64(direction, sample, params, tangent, features, labels, batch, valid, activation, delta_out, probabilities, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu):
    point = _point_f64(params.shape[0], direction)
    x, v = (params[point], tangent[direction])
    activated, out, chances = (activation[point, sample], delta_out[point, sample], probabilities[point, sample])
    pre_tangent, act_tangent = (tangent_delta_hidden[direction, sample], tangent_activation[direction, sample])
    out_tangent = tangent_delta_out[direction, sample]
    row = batch[point, sample]
    label = labels[row]
    hidden, classes, width = _widths_f64(features, activation, delta_out)
    weight = _batch_weight_f64(label, valid, point)
    _hidden_layer_f64(pre_tangent, v, features, row, w1, b1, hidden)
    for h in range(hidden):
        act_tangent[h] = _activation_grad_f64(activated[h], pre_tangent[h], relu)
    _assign_f64(out_tangent, v[b2:b2 + classes], classes)
    for j in range(width):
        start = w2 + j * classes
        _accumulate_pair_f64(out_tangent, _layer_input_f64(features, row, activation, point, sample, j), v[start:start + classes], _tangent_layer_input_f64(tangent_activation, direction, sample, j), x[start:start + classes], classes)
    tangent_mean = float64(0.0)
    for c in range(classes):
        tangent_mean += chances[c] * out_tangent[c]
    for c in range(classes):
        out_tangent[c] = weight * chances[c] * (out_tangent[c] - tangent_mean)
    for h in range(hidden):
        weights, tangent_weights = (x[w2 + h * classes:w2 + h * classes + classes], v[w2 + h * classes:w2 + h * classes + classes])
        upstream = float64(0.0)
        tangent_upstream = float64(0.0)
        for c in range(classes):
            upstream += weights[c] * out[c]
            tangent_upstream += tangent_weights[c] * out[c] + weights[c] * out_tangent[c]
        act = activated[h]
        tangent_pre = pre_tangent[h]
        pre_tangent[h] = _activation_grad_f64(act, tangent_upstream, relu) + _activation_curvature_f64(act, tangent_pre * upstream, relu)


@cuda.jit(device=True, inline="always")
def hidden_row_pass_f64(worker, row, features, batch, activation, delta_hidden, tangent_delta_hidden, result, w1, b1, with_tangent):
    hidden = activation.shape[2]
    point = worker
    deltas = delta_hidden
    if with_tangent:
        point = _point_f64(activation.shape[0], worker)
        deltas = tangent_delta_hidden
    sums = result[worker]
    start = b1
    if row < features.shape[1]:
        start = w1 + row * hidden
    _clear_f64(result, worker, start, start + hidden)
    for sample in range(batch.shape[1]):
        coefficient = float64(1.0)
        if row < features.shape[1]:
            coefficient = features[batch[point, sample], row]
        _accumulate_f64(sums[start:start + hidden], coefficient, deltas[worker, sample], hidden)


@cuda.jit(device=True, inline="always")
def class_column_pass_f64(worker, c, features, batch, activation, delta_out, tangent_activation, tangent_delta_out, result, column_sums, w2, b2, with_tangent):
    hidden, classes, width = _widths_f64(features, activation, delta_out)
    point = worker
    output_deltas = delta_out
    if with_tangent:
        point = _point_f64(activation.shape[0], worker)
        output_deltas = tangent_delta_out
    column = column_sums[worker, c]
    for j in range(width):
        column[j] = float64(0.0)
    bias = float64(0.0)
    for sample in range(batch.shape[1]):
        delta = output_deltas[worker, sample, c]
        bias += delta
        inputs = features[batch[point, sample]]
        if hidden:
            inputs = activation[point, sample]
        if with_tangent and hidden:
            _accumulate_pair_f64(column, delta, inputs, delta_out[point, sample, c], tangent_activation[worker, sample], width)
        else:
            _accumulate_f64(column, delta, inputs, width)
    result[worker, b2 + c] = bias
    for j in range(width):
        result[worker, w2 + j * classes + c] = column[j]


@cuda.jit(device=True, inline="always")
def padding_pass_f64(worker, stretch, features, activation, delta_out, result, w1, b1, w2, b2):
    hidden, classes, width = _widths_f64(features, activation, delta_out)
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
    _clear_f64(result, worker, start, stop)


@cuda.jit(device=True, inline="always")
def _accumulate_f64(target, coefficient, values, length):
    for k in range(length):
        target[k] += coefficient * values[k]


@cuda.jit(device=True, inline="always")
def _accumulate_pair_f64(target, coefficient, values, other_coefficient, other_values, length):
    for k in range(length):
        target[k] = target[k] + coefficient * values[k] + other_coefficient * other_values[k]


@cuda.jit(device=True, inline="always")
def _assign_f64(target, values, length):
    for k in range(length):
        target[k] = values[k]


@cuda.jit(device=True, inline="always")
def _clear_f64(result, worker, start, stop):
    for index in range(start, stop):
        result[worker, index] = float64(0.0)


@cuda.jit(cache=True)
def sample_pass_f64_grid(rows, columns, params, features, labels, batch, valid, losses, correct, activation, delta_hidden, delta_out, probabilities, w1, b1, w2, b2, relu):
    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        sample_pass_f64(flat // columns, flat % columns, params, features, labels, batch, valid, losses, correct, activation, delta_hidden, delta_out, probabilities, w1, b1, w2, b2, relu)


@cuda.jit(cache=True)
def tangent_pass_f64_grid(rows, columns, params, tangent, features, labels, batch, valid, activation, delta_out, probabilities, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu):
    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        tangent_pass_f64(flat // columns, flat % columns, params, tangent, features, labels, batch, valid, activation, delta_out, probabilities, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu)


@cuda.jit(cache=True)
def hidden_row_pass_f64_grid(rows, columns, features, batch, activation, delta_hidden, tangent_delta_hidden, result, w1, b1, with_tangent):
    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        hidden_row_pass_f64(flat // columns, flat % columns, features, batch, activation, delta_hidden, tangent_delta_hidden, result, w1, b1, with_tangent)


@cuda.jit(cache=True)
def class_column_pass_f64_grid(rows, columns, features, batch, activation, delta_out, tangent_activation, tangent_delta_out, result, column_sums, w2, b2, with_tangent):
    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        class_column_pass_f64(flat // columns, flat % columns, features, batch, activation, delta_out, tangent_activation, tangent_delta_out, result, column_sums, w2, b2, with_tangent)


@cuda.jit(cache=True)
def padding_pass_f64_grid(rows, columns, features, activation, delta_out, result, w1, b1, w2, b2):
    for flat in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        padding_pass_f64(flat // columns, flat % columns, features, activation, delta_out, result, w1, b1, w2, b2)
