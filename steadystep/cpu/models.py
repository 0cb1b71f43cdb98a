"""CPU kernels generated from steadystep/kernels/models.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

import math  # noqa: F401  (formulas may call math functions)

import numpy as np  # noqa: F401
from numba import njit, prange  # noqa: F401
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cpu.primitives import at, put  # noqa: F401


@njit(error_model="numpy", cache=True)
def is_finite_f32(x):
    return x == x and abs(x) <= float32(3.4028234663852886e+38)


@njit(error_model="numpy", cache=True)
def exp_difference_f32(x, y):
    difference = x - y
    if not is_finite_f32(difference):
        return math.exp(difference)
    virtual = difference - x
    error = x - (difference - virtual) + (-y - virtual)
    term = math.exp(difference)
    return term + term * error


@njit(error_model="numpy", cache=True)
def neumaier_add_f32(sum_a, compensation_a, sum_b, compensation_b):
    total = sum_a + sum_b
    if abs(sum_a) >= abs(sum_b):
        error = sum_a - total + sum_b
    else:
        error = sum_b - total + sum_a
    return (total, compensation_a + compensation_b + error)


@njit(error_model="numpy", cache=True)
def grad_relu_f32(x, upstream):
    if x > float32(0.0):
        return upstream
    return float32(0.0)


@njit(error_model="numpy", cache=True)
def grad_tanh_f32(tanh_out, upstream):
    return (float32(1.0) - tanh_out * tanh_out) * upstream


@njit(error_model="numpy", cache=True)
def _max_merge_f32(a, b):
    if a != a:
        return (a,)
    if b != b or b > a:
        return (b,)
    return (a,)


@njit(error_model="numpy", cache=True)
def _exp_lift_f32(x, high):
    if x == high:
        return (float32(1.0), float32(0.0), float32(0.0))
    return (float32(0.0), exp_difference_f32(x, high), float32(0.0))


@njit(error_model="numpy", cache=True)
def _exp_merge_f32(count_a, rest_a, compensation_a, count_b, rest_b, compensation_b):
    rest, compensation = neumaier_add_f32(rest_a, compensation_a, rest_b, compensation_b)
    return (count_a + count_b, rest, compensation)


@njit(error_model="numpy", cache=True)
def _log_total_f32(count, rest, compensation):
    return math.log1p(count - float32(1.0) + (rest + compensation))


@njit(error_model="numpy", cache=True)
def _logsumexp_finish_f32(high, count, rest, compensation, length):
    if abs(high) > float32(3.4028234663852886e+38) or high != high:
        return high
    return high + _log_total_f32(count, rest, compensation)


@njit(error_model="numpy", cache=True)
def _softmax_value_f32(x, high, count, rest, compensation, length):
    if high != high:
        return high
    if high < -float32(3.4028234663852886e+38):
        return float32(0.0)
    if high > float32(3.4028234663852886e+38):
        if x == high:
            return float32(1.0) / count
        return float32(0.0)
    return exp_difference_f32(x, high) / (count + (rest + compensation))


@njit(error_model="numpy", cache=True)
def _activate_f32(pre, relu):
    if relu:
        if pre > float32(0.0) or pre != pre:
            return pre
        return float32(0.0)
    return math.tanh(pre)


@njit(error_model="numpy", cache=True)
def _activation_grad_f32(act, upstream, relu):
    if relu:
        return grad_relu_f32(act, upstream)
    return grad_tanh_f32(act, upstream)


@njit(error_model="numpy", cache=True)
def _activation_curvature_f32(act, upstream, relu):
    if relu:
        return float32(0.0)
    return -float32(2.0) * act * grad_tanh_f32(act, upstream)


@njit(error_model="numpy", cache=True)
def _widths_f32(features, activation, delta_out):
    if activation.shape[2]:
        return (activation.shape[2], delta_out.shape[2], activation.shape[2])
    return (activation.shape[2], delta_out.shape[2], features.shape[1])


@njit(error_model="numpy", cache=True)
def _layer_input_f32(features, row, activation, worker, sample, j):
    if activation.shape[2]:
        return activation[worker, sample, j]
    return features[row, j]


@njit(error_model="numpy", cache=True)
def _tangent_layer_input_f32(tangent_activation, worker, sample, j):
    if tangent_activation.shape[2]:
        return tangent_activation[worker, sample, j]
    return float32(0.0)


@njit(error_model="numpy", cache=True)
def sample_pass_f32(worker, sample, params, tangent, features, labels, batch, losses, correct, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu, with_tangent):
    x = params[worker]
    v = tangent[worker]
    row = batch[worker, sample]
    label = labels[row]
    hidden, classes, width = _widths_f32(features, activation, delta_out)
    valid = float32(0.0)
    for k in range(batch.shape[1]):
        if labels[batch[worker, k]] >= 0:
            valid += float32(1.0)
    weight = float32(0.0)
    if label >= 0:
        weight = float32(1.0) / valid
    for h in range(hidden):
        pre = x[b1 + h]
        for f in range(features.shape[1]):
            pre += features[row, f] * x[w1 + f * hidden + h]
        act = _activate_f32(pre, relu)
        activation[worker, sample, h] = act
        if with_tangent:
            tangent_pre = v[b1 + h]
            for f in range(features.shape[1]):
                tangent_pre += features[row, f] * v[w1 + f * hidden + h]
            tangent_activation[worker, sample, h] = _activation_grad_f32(act, tangent_pre, relu)
            tangent_delta_hidden[worker, sample, h] = tangent_pre
    high = -float32(math.inf)
    for c in range(classes):
        logit = x[b2 + c]
        tangent_logit = v[b2 + c]
        for j in range(width):
            layer_input = _layer_input_f32(features, row, activation, worker, sample, j)
            logit += layer_input * x[w2 + j * classes + c]
            if with_tangent:
                tangent_logit += layer_input * v[w2 + j * classes + c]
                tangent_logit += _tangent_layer_input_f32(tangent_activation, worker, sample, j) * x[w2 + j * classes + c]
        delta_out[worker, sample, c] = logit
        if with_tangent:
            tangent_delta_out[worker, sample, c] = tangent_logit
        high, = _max_merge_f32(high, logit)
    count, rest, compensation = (float32(0.0), float32(0.0), float32(0.0))
    predicted = classes
    for c in range(classes):
        logit = delta_out[worker, sample, c]
        lift_count, lift_rest, lift_compensation = _exp_lift_f32(logit, high)
        count, rest, compensation = _exp_merge_f32(count, rest, compensation, lift_count, lift_rest, lift_compensation)
        if logit == high and predicted == classes:
            predicted = c
    losses[worker, sample] = float32(0.0)
    correct[worker, sample] = float32(0.0)
    if label >= 0:
        losses[worker, sample] = weight * (_logsumexp_finish_f32(high, count, rest, compensation, float32(1.0)) - delta_out[worker, sample, label])
        if predicted == label:
            correct[worker, sample] = float32(1.0)
    tangent_mean = float32(0.0)
    if with_tangent:
        for c in range(classes):
            probability = _softmax_value_f32(delta_out[worker, sample, c], high, count, rest, compensation, float32(1.0))
            tangent_mean += probability * tangent_delta_out[worker, sample, c]
    for c in range(classes):
        probability = _softmax_value_f32(delta_out[worker, sample, c], high, count, rest, compensation, float32(1.0))
        target = float32(0.0)
        if c == label:
            target = float32(1.0)
        delta_out[worker, sample, c] = weight * (probability - target)
        if with_tangent:
            tangent_delta_out[worker, sample, c] = weight * probability * (tangent_delta_out[worker, sample, c] - tangent_mean)
    for h in range(hidden):
        upstream = float32(0.0)
        tangent_upstream = float32(0.0)
        for c in range(classes):
            upstream += x[w2 + h * classes + c] * delta_out[worker, sample, c]
            if with_tangent:
                tangent_upstream += v[w2 + h * classes + c] * delta_out[worker, sample, c]
                tangent_upstream += x[w2 + h * classes + c] * tangent_delta_out[worker, sample, c]
        act = activation[worker, sample, h]
        delta_hidden[worker, sample, h] = _activation_grad_f32(act, upstream, relu)
        if with_tangent:
            tangent_pre = tangent_delta_hidden[worker, sample, h]
            tangent_delta_hidden[worker, sample, h] = _activation_grad_f32(act, tangent_upstream, relu) + _activation_curvature_f32(act, tangent_pre * upstream, relu)


@njit(error_model="numpy", cache=True, inline="always")
def parameter_pass_f32(worker, index, features, batch, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, gradient, hessian_vector, w1, b1, w2, b2, with_tangent):
    hidden, classes, width = _widths_f32(features, activation, delta_out)
    total = float32(0.0)
    tangent_total = float32(0.0)
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
            layer_input = _layer_input_f32(features, batch[worker, sample], activation, worker, sample, j)
            total += layer_input * delta_out[worker, sample, c]
            if with_tangent:
                tangent_total += layer_input * tangent_delta_out[worker, sample, c]
                tangent_total += _tangent_layer_input_f32(tangent_activation, worker, sample, j) * delta_out[worker, sample, c]
    elif b2 <= index < b2 + classes:
        c = index - b2
        for sample in range(batch.shape[1]):
            total += delta_out[worker, sample, c]
            if with_tangent:
                tangent_total += tangent_delta_out[worker, sample, c]
    gradient[worker, index] = total
    if with_tangent:
        hessian_vector[worker, index] = tangent_total


@njit(error_model="numpy", cache=True, parallel=True)
def sample_pass_f32_grid(rows, columns, params, tangent, features, labels, batch, losses, correct, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu, with_tangent):
    for flat in prange(rows * columns):
        sample_pass_f32(flat // columns, flat % columns, params, tangent, features, labels, batch, losses, correct, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu, with_tangent)


@njit(error_model="numpy", cache=True, parallel=True)
def parameter_pass_f32_grid(rows, columns, features, batch, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, gradient, hessian_vector, w1, b1, w2, b2, with_tangent):
    for flat in prange(rows * columns):
        parameter_pass_f32(flat // columns, flat % columns, features, batch, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, gradient, hessian_vector, w1, b1, w2, b2, with_tangent)


@njit(error_model="numpy", cache=True)
def is_finite_f64(x):
    return x == x and abs(x) <= float64(1e+308)


@njit(error_model="numpy", cache=True)
def exp_difference_f64(x, y):
    difference = x - y
    if not is_finite_f64(difference):
        return math.exp(difference)
    virtual = difference - x
    error = x - (difference - virtual) + (-y - virtual)
    term = math.exp(difference)
    return term + term * error


@njit(error_model="numpy", cache=True)
def neumaier_add_f64(sum_a, compensation_a, sum_b, compensation_b):
    total = sum_a + sum_b
    if abs(sum_a) >= abs(sum_b):
        error = sum_a - total + sum_b
    else:
        error = sum_b - total + sum_a
    return (total, compensation_a + compensation_b + error)


@njit(error_model="numpy", cache=True)
def grad_relu_f64(x, upstream):
    if x > float64(0.0):
        return upstream
    return float64(0.0)


@njit(error_model="numpy", cache=True)
def grad_tanh_f64(tanh_out, upstream):
    return (float64(1.0) - tanh_out * tanh_out) * upstream


@njit(error_model="numpy", cache=True)
def _max_merge_f64(a, b):
    if a != a:
        return (a,)
    if b != b or b > a:
        return (b,)
    return (a,)


@njit(error_model="numpy", cache=True)
def _exp_lift_f64(x, high):
    if x == high:
        return (float64(1.0), float64(0.0), float64(0.0))
    return (float64(0.0), exp_difference_f64(x, high), float64(0.0))


@njit(error_model="numpy", cache=True)
def _exp_merge_f64(count_a, rest_a, compensation_a, count_b, rest_b, compensation_b):
    rest, compensation = neumaier_add_f64(rest_a, compensation_a, rest_b, compensation_b)
    return (count_a + count_b, rest, compensation)


@njit(error_model="numpy", cache=True)
def _log_total_f64(count, rest, compensation):
    return math.log1p(count - float64(1.0) + (rest + compensation))


@njit(error_model="numpy", cache=True)
def _logsumexp_finish_f64(high, count, rest, compensation, length):
    if abs(high) > float64(1e+308) or high != high:
        return high
    return high + _log_total_f64(count, rest, compensation)


@njit(error_model="numpy", cache=True)
def _softmax_value_f64(x, high, count, rest, compensation, length):
    if high != high:
        return high
    if high < -float64(1e+308):
        return float64(0.0)
    if high > float64(1e+308):
        if x == high:
            return float64(1.0) / count
        return float64(0.0)
    return exp_difference_f64(x, high) / (count + (rest + compensation))


@njit(error_model="numpy", cache=True)
def _activate_f64(pre, relu):
    if relu:
        if pre > float64(0.0) or pre != pre:
            return pre
        return float64(0.0)
    return math.tanh(pre)


@njit(error_model="numpy", cache=True)
def _activation_grad_f64(act, upstream, relu):
    if relu:
        return grad_relu_f64(act, upstream)
    return grad_tanh_f64(act, upstream)


@njit(error_model="numpy", cache=True)
def _activation_curvature_f64(act, upstream, relu):
    if relu:
        return float64(0.0)
    return -float64(2.0) * act * grad_tanh_f64(act, upstream)


@njit(error_model="numpy", cache=True)
def _widths_f64(features, activation, delta_out):
    if activation.shape[2]:
        return (activation.shape[2], delta_out.shape[2], activation.shape[2])
    return (activation.shape[2], delta_out.shape[2], features.shape[1])


@njit(error_model="numpy", cache=True)
def _layer_input_f64(features, row, activation, worker, sample, j):
    if activation.shape[2]:
        return activation[worker, sample, j]
    return features[row, j]


@njit(error_model="numpy", cache=True)
def _tangent_layer_input_f64(tangent_activation, worker, sample, j):
    if tangent_activation.shape[2]:
        return tangent_activation[worker, sample, j]
    return float64(0.0)


@njit(error_model="numpy", cache=True)
def sample_pass_f64(worker, sample, params, tangent, features, labels, batch, losses, correct, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu, with_tangent):
    x = params[worker]
    v = tangent[worker]
    row = batch[worker, sample]
    label = labels[row]
    hidden, classes, width = _widths_f64(features, activation, delta_out)
    valid = float64(0.0)
    for k in range(batch.shape[1]):
        if labels[batch[worker, k]] >= 0:
            valid += float64(1.0)
    weight = float64(0.0)
    if label >= 0:
        weight = float64(1.0) / valid
    for h in range(hidden):
        pre = x[b1 + h]
        for f in range(features.shape[1]):
            pre += features[row, f] * x[w1 + f * hidden + h]
        act = _activate_f64(pre, relu)
        activation[worker, sample, h] = act
        if with_tangent:
            tangent_pre = v[b1 + h]
            for f in range(features.shape[1]):
                tangent_pre += features[row, f] * v[w1 + f * hidden + h]
            tangent_activation[worker, sample, h] = _activation_grad_f64(act, tangent_pre, relu)
            tangent_delta_hidden[worker, sample, h] = tangent_pre
    high = -float64(math.inf)
    for c in range(classes):
        logit = x[b2 + c]
        tangent_logit = v[b2 + c]
        for j in range(width):
            layer_input = _layer_input_f64(features, row, activation, worker, sample, j)
            logit += layer_input * x[w2 + j * classes + c]
            if with_tangent:
                tangent_logit += layer_input * v[w2 + j * classes + c]
                tangent_logit += _tangent_layer_input_f64(tangent_activation, worker, sample, j) * x[w2 + j * classes + c]
        delta_out[worker, sample, c] = logit
        if with_tangent:
            tangent_delta_out[worker, sample, c] = tangent_logit
        high, = _max_merge_f64(high, logit)
    count, rest, compensation = (float64(0.0), float64(0.0), float64(0.0))
    predicted = classes
    for c in range(classes):
        logit = delta_out[worker, sample, c]
        lift_count, lift_rest, lift_compensation = _exp_lift_f64(logit, high)
        count, rest, compensation = _exp_merge_f64(count, rest, compensation, lift_count, lift_rest, lift_compensation)
        if logit == high and predicted == classes:
            predicted = c
    losses[worker, sample] = float64(0.0)
    correct[worker, sample] = float64(0.0)
    if label >= 0:
        losses[worker, sample] = weight * (_logsumexp_finish_f64(high, count, rest, compensation, float64(1.0)) - delta_out[worker, sample, label])
        if predicted == label:
            correct[worker, sample] = float64(1.0)
    tangent_mean = float64(0.0)
    if with_tangent:
        for c in range(classes):
            probability = _softmax_value_f64(delta_out[worker, sample, c], high, count, rest, compensation, float64(1.0))
            tangent_mean += probability * tangent_delta_out[worker, sample, c]
    for c in range(classes):
        probability = _softmax_value_f64(delta_out[worker, sample, c], high, count, rest, compensation, float64(1.0))
        target = float64(0.0)
        if c == label:
            target = float64(1.0)
        delta_out[worker, sample, c] = weight * (probability - target)
        if with_tangent:
            tangent_delta_out[worker, sample, c] = weight * probability * (tangent_delta_out[worker, sample, c] - tangent_mean)
    for h in range(hidden):
        upstream = float64(0.0)
        tangent_upstream = float64(0.0)
        for c in range(classes):
            upstream += x[w2 + h * classes + c] * delta_out[worker, sample, c]
            if with_tangent:
                tangent_upstream += v[w2 + h * classes + c] * delta_out[worker, sample, c]
                tangent_upstream += x[w2 + h * classes + c] * tangent_delta_out[worker, sample, c]
        act = activation[worker, sample, h]
        delta_hidden[worker, sample, h] = _activation_grad_f64(act, upstream, relu)
        if with_tangent:
            tangent_pre = tangent_delta_hidden[worker, sample, h]
            tangent_delta_hidden[worker, sample, h] = _activation_grad_f64(act, tangent_upstream, relu) + _activation_curvature_f64(act, tangent_pre * upstream, relu)


@njit(error_model="numpy", cache=True, inline="always")
def parameter_pass_f64(worker, index, features, batch, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, gradient, hessian_vector, w1, b1, w2, b2, with_tangent):
    hidden, classes, width = _widths_f64(features, activation, delta_out)
    total = float64(0.0)
    tangent_total = float64(0.0)
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
            layer_input = _layer_input_f64(features, batch[worker, sample], activation, worker, sample, j)
            total += layer_input * delta_out[worker, sample, c]
            if with_tangent:
                tangent_total += layer_input * tangent_delta_out[worker, sample, c]
                tangent_total += _tangent_layer_input_f64(tangent_activation, worker, sample, j) * delta_out[worker, sample, c]
    elif b2 <= index < b2 + classes:
        c = index - b2
        for sample in range(batch.shape[1]):
            total += delta_out[worker, sample, c]
            if with_tangent:
                tangent_total += tangent_delta_out[worker, sample, c]
    gradient[worker, index] = total
    if with_tangent:
        hessian_vector[worker, index] = tangent_total


@njit(error_model="numpy", cache=True, parallel=True)
def sample_pass_f64_grid(rows, columns, params, tangent, features, labels, batch, losses, correct, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu, with_tangent):
    for flat in prange(rows * columns):
        sample_pass_f64(flat // columns, flat % columns, params, tangent, features, labels, batch, losses, correct, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, w1, b1, w2, b2, relu, with_tangent)


@njit(error_model="numpy", cache=True, parallel=True)
def parameter_pass_f64_grid(rows, columns, features, batch, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, gradient, hessian_vector, w1, b1, w2, b2, with_tangent):
    for flat in prange(rows * columns):
        parameter_pass_f64(flat // columns, flat % columns, features, batch, activation, delta_hidden, delta_out, tangent_activation, tangent_delta_hidden, tangent_delta_out, gradient, hessian_vector, w1, b1, w2, b2, with_tangent)
