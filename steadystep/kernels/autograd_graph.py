"""Reverse-mode graph bookkeeping: fan-out counts, checkpointing costs, clip scales."""

import math


def node_output_count(count):
    """Fan-out counter after one more consumer has reported in.

    count + 1
    """
    return count + 1.0


def grad_accumulate(current_grad, incoming_grad):
    """Gradient buffer after another consumer's contribution.

    current_grad + incoming_grad
    """
    return current_grad + incoming_grad


def checkpointing_cost(memory_bytes, recompute_flops, hardware_flops, memory_bandwidth):
    """Recompute time over memory time for one checkpointed segment (< 1: checkpointing wins).

    (recompute_flops/hardware_flops) / (memory_bytes/memory_bandwidth);
    +inf if hardware_flops ≤ 0, memory_bandwidth ≤ 0 or memory_bytes ≤ 0
    """
    if hardware_flops <= 0.0 or memory_bandwidth <= 0.0 or memory_bytes <= 0.0:
        return math.inf
    return (recompute_flops / hardware_flops) / (memory_bytes / memory_bandwidth)


def memory_efficient_backward_step(segment_bytes, num_segments, total_bytes):
    """Fraction of the un-checkpointed memory that a segmentation keeps resident.

    segment_bytes·num_segments/total_bytes; 0 if total_bytes ≤ 0
    """
    if total_bytes <= 0.0:
        return 0.0
    return segment_bytes * num_segments / total_bytes


def topological_sort_key(depth, node_index, num_nodes):
    """Sort key that orders nodes by depth, then by index.

    depth·num_nodes + node_index
    """
    return depth * num_nodes + node_index


def loss_scale(loss, scale):
    """Loss multiplied by the AMP loss scale.

    loss·scale
    """
    return loss * scale


def unscale_grad(grad, scale):
    """Gradient divided by the AMP loss scale; unchanged for a non-positive scale.

    grad/scale; grad if scale ≤ 0
    """
    if scale <= 0.0:
        return grad
    return grad / scale


def jacobian_vector_product(local_jacobian, tangent):
    """Forward-mode contraction of one local Jacobian element with a tangent.

    local_jacobian·tangent
    """
    return local_jacobian * tangent


def vector_jacobian_product(upstream_grad, local_jacobian):
    """Reverse-mode contraction of an upstream gradient with one local Jacobian element.

    upstream_grad·local_jacobian
    """
    return upstream_grad * local_jacobian


def is_dead_node(consumer_count, is_output):
    """1 for a node nobody consumes and that is not an output (prunable), else 0.

    1 if consumer_count < 0.5 and is_output < 0.5 else 0
    """
    if consumer_count < 0.5 and is_output < 0.5:
        return 1.0
    return 0.0


def gradient_norm_clip_scale(grad_norm, max_norm):
    """Factor that brings a global gradient norm down to max_norm.

    max_norm/grad_norm if grad_norm > max_norm else 1
    """
    if grad_norm > max_norm:
        return max_norm / grad_norm
    return 1.0
