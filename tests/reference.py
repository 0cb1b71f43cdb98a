"""Plain NumPy references for every elementwise formula, written from SPEC §2.

Deliberately naive: whole-array expressions with np.where for the branches, computed in
the inputs' dtype (NumPy 2 keeps Python scalars weak, so float32 stays float32).
"""

import numpy as np

where = np.where

REFERENCES = {
    # autograd_graph
    "node_output_count": lambda count: count + 1,
    "grad_accumulate": lambda current_grad, incoming_grad: current_grad + incoming_grad,
    "checkpointing_cost": lambda memory_bytes, recompute_flops, hardware_flops, memory_bandwidth: where(
        (hardware_flops <= 0) | (memory_bandwidth <= 0) | (memory_bytes <= 0),
        np.inf,
        (recompute_flops / hardware_flops) / (memory_bytes / memory_bandwidth),
    ),
    "memory_efficient_backward_step": lambda segment_bytes, num_segments, total_bytes: where(
        total_bytes <= 0, 0.0, segment_bytes * num_segments / total_bytes
    ),
    "topological_sort_key": lambda depth, node_index, num_nodes: depth * num_nodes + node_index,
    "loss_scale": lambda loss, scale: loss * scale,
    "unscale_grad": lambda grad, scale: where(scale <= 0, grad, grad / scale),
    "jacobian_vector_product": lambda local_jacobian, tangent: local_jacobian * tangent,
    "vector_jacobian_product": lambda upstream_grad, local_jacobian: upstream_grad * local_jacobian,
    "is_dead_node": lambda consumer_count, is_output: where((consumer_count < 0.5) & (is_output < 0.5), 1.0, 0.0),
    "gradient_norm_clip_scale": lambda grad_norm, max_norm: where(grad_norm > max_norm, max_norm / grad_norm, 1.0),
    # autograd_ops
    "grad_add": lambda upstream: upstream,
    "grad_mul": lambda other, upstream: other * upstream,
    "grad_exp": lambda x, upstream: np.exp(x) * upstream,
    "grad_log": lambda x, upstream: where(x <= 0, 0.0, upstream / x),
    "grad_relu": lambda x, upstream: where(x > 0, upstream, 0.0),
    "grad_sigmoid": lambda sigmoid_out, upstream: sigmoid_out * (1 - sigmoid_out) * upstream,
    "grad_tanh": lambda tanh_out, upstream: (1 - tanh_out * tanh_out) * upstream,
    "grad_pow": lambda x, n, upstream: where(
        ((x == 0) & (n < 1)) | ((x < 0) & (np.mod(n, 1) != 0)), 0.0, n * np.power(x, n - 1) * upstream
    ),
    "chain_rule": lambda upstream, local_grad: upstream * local_grad,
    "grad_softmax_diag": lambda softmax_i, upstream: softmax_i * (1 - softmax_i) * upstream,
    # gradient_descent
    "sgd_update": lambda param, grad, lr: param - lr * grad,
    "sgd_momentum_update": lambda param, grad, velocity, lr, momentum: param - lr * (momentum * velocity + grad),
    "adam_update": lambda param, m_hat, v_hat, lr, eps: param - lr * m_hat / (np.sqrt(v_hat) + eps),
    "adamw_update": lambda param, m_hat, v_hat, lr, eps, weight_decay: param * (1 - lr * weight_decay)
    - lr * m_hat / (np.sqrt(v_hat) + eps),
    "rmsprop_update": lambda param, grad, sq_avg, lr, alpha, eps: param
    - lr * grad / (np.sqrt(alpha * sq_avg + (1 - alpha) * grad * grad) + eps),
    "adagrad_update": lambda param, grad, accumulator, lr, eps: param - lr * grad / (np.sqrt(accumulator + grad * grad) + eps),
    "lars_update": lambda param, grad, param_norm, grad_norm, lr, trust_coefficient, weight_decay: where(
        grad_norm + weight_decay * param_norm <= 0,
        param,
        param - lr * (trust_coefficient * param_norm / (grad_norm + weight_decay * param_norm)) * (grad + weight_decay * param),
    ),
    "lion_update": lambda param, momentum, grad, lr, beta1, beta2, weight_decay: param
    - lr * (np.sign(beta1 * momentum + (1 - beta1) * grad) + weight_decay * param),
    "gradient_clipping": lambda grad, grad_norm, max_norm: where(grad_norm > max_norm, grad * max_norm / grad_norm, grad),
    "cosine_annealing_lr": lambda step, total_steps, base_lr, min_lr: where(
        total_steps <= 0,
        min_lr,
        min_lr + (base_lr - min_lr) * (1 + np.cos(np.pi * (np.minimum(step, total_steps) / total_steps))) / 2,
    ),
}
