"""CUDA kernels generated from steadystep/kernels/autograd_graph.py.

Do not edit: change the formula there and run `python -m steadystep.codegen`.
"""

from numba import cuda
from numpy import float32, float64  # noqa: F401  (literal casts)

from steadystep.cuda.primitives import ROW_THREADS, at, cast_like, math, put  # noqa: F401

# Numba's cache checks only this file: a change to the primitives these kernels inline must
# rewrite it, and test_codegen fails until codegen has
PRIMITIVES_DIGEST = "8081250d6df4c601"


@cuda.jit(device=True, inline="always")
def node_output_count_f32(count):
    return count + float32(1.0)


@cuda.jit(cache=True)
def node_output_count_f32_kernel(out, count):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = node_output_count_f32(at(count, i))


@cuda.jit(device=True, inline="always")
def grad_accumulate_f32(current_grad, incoming_grad):
    return current_grad + incoming_grad


@cuda.jit(cache=True)
def grad_accumulate_f32_kernel(out, current_grad, incoming_grad):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_accumulate_f32(at(current_grad, i), at(incoming_grad, i))


@cuda.jit(device=True, inline="always")
def checkpointing_cost_f32(memory_bytes, recompute_flops, hardware_flops, memory_bandwidth):
    if hardware_flops <= float32(0.0) or memory_bandwidth <= float32(0.0) or memory_bytes <= float32(0.0):
        return float32(math.inf)
    return recompute_flops / hardware_flops / (memory_bytes / memory_bandwidth)


@cuda.jit(cache=True)
def checkpointing_cost_f32_kernel(out, memory_bytes, recompute_flops, hardware_flops, memory_bandwidth):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = checkpointing_cost_f32(at(memory_bytes, i), at(recompute_flops, i), at(hardware_flops, i), at(memory_bandwidth, i))


@cuda.jit(device=True, inline="always")
def memory_efficient_backward_step_f32(segment_bytes, num_segments, total_bytes):
    if total_bytes <= float32(0.0):
        return float32(0.0)
    return segment_bytes * num_segments / total_bytes


@cuda.jit(cache=True)
def memory_efficient_backward_step_f32_kernel(out, segment_bytes, num_segments, total_bytes):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = memory_efficient_backward_step_f32(at(segment_bytes, i), at(num_segments, i), at(total_bytes, i))


@cuda.jit(device=True, inline="always")
def topological_sort_key_f32(depth, node_index, num_nodes):
    return depth * num_nodes + node_index


@cuda.jit(cache=True)
def topological_sort_key_f32_kernel(out, depth, node_index, num_nodes):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = topological_sort_key_f32(at(depth, i), at(node_index, i), at(num_nodes, i))


@cuda.jit(device=True, inline="always")
def loss_scale_f32(loss, scale):
    return loss * scale


@cuda.jit(cache=True)
def loss_scale_f32_kernel(out, loss, scale):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = loss_scale_f32(at(loss, i), at(scale, i))


@cuda.jit(device=True, inline="always")
def unscale_grad_f32(grad, scale):
    if scale <= float32(0.0):
        return grad
    return grad / scale


@cuda.jit(cache=True)
def unscale_grad_f32_kernel(out, grad, scale):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = unscale_grad_f32(at(grad, i), at(scale, i))


@cuda.jit(device=True, inline="always")
def jacobian_vector_product_f32(local_jacobian, tangent):
    return local_jacobian * tangent


@cuda.jit(cache=True)
def jacobian_vector_product_f32_kernel(out, local_jacobian, tangent):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = jacobian_vector_product_f32(at(local_jacobian, i), at(tangent, i))


@cuda.jit(device=True, inline="always")
def vector_jacobian_product_f32(upstream_grad, local_jacobian):
    return upstream_grad * local_jacobian


@cuda.jit(cache=True)
def vector_jacobian_product_f32_kernel(out, upstream_grad, local_jacobian):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = vector_jacobian_product_f32(at(upstream_grad, i), at(local_jacobian, i))


@cuda.jit(device=True, inline="always")
def is_dead_node_f32(consumer_count, is_output):
    if consumer_count < float32(0.5) and is_output < float32(0.5):
        return float32(1.0)
    return float32(0.0)


@cuda.jit(cache=True)
def is_dead_node_f32_kernel(out, consumer_count, is_output):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = is_dead_node_f32(at(consumer_count, i), at(is_output, i))


@cuda.jit(device=True, inline="always")
def gradient_norm_clip_scale_f32(grad_norm, max_norm):
    if grad_norm > max_norm:
        return max_norm / grad_norm
    return float32(1.0)


@cuda.jit(cache=True)
def gradient_norm_clip_scale_f32_kernel(out, grad_norm, max_norm):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = gradient_norm_clip_scale_f32(at(grad_norm, i), at(max_norm, i))


@cuda.jit(device=True, inline="always")
def node_output_count_f64(count):
    return count + float64(1.0)


@cuda.jit(cache=True)
def node_output_count_f64_kernel(out, count):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = node_output_count_f64(at(count, i))


@cuda.jit(device=True, inline="always")
def grad_accumulate_f64(current_grad, incoming_grad):
    return current_grad + incoming_grad


@cuda.jit(cache=True)
def grad_accumulate_f64_kernel(out, current_grad, incoming_grad):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = grad_accumulate_f64(at(current_grad, i), at(incoming_grad, i))


@cuda.jit(device=True, inline="always")
def checkpointing_cost_f64(memory_bytes, recompute_flops, hardware_flops, memory_bandwidth):
    if hardware_flops <= float64(0.0) or memory_bandwidth <= float64(0.0) or memory_bytes <= float64(0.0):
        return float64(math.inf)
    return recompute_flops / hardware_flops / (memory_bytes / memory_bandwidth)


@cuda.jit(cache=True)
def checkpointing_cost_f64_kernel(out, memory_bytes, recompute_flops, hardware_flops, memory_bandwidth):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = checkpointing_cost_f64(at(memory_bytes, i), at(recompute_flops, i), at(hardware_flops, i), at(memory_bandwidth, i))


@cuda.jit(device=True, inline="always")
def memory_efficient_backward_step_f64(segment_bytes, num_segments, total_bytes):
    if total_bytes <= float64(0.0):
        return float64(0.0)
    return segment_bytes * num_segments / total_bytes


@cuda.jit(cache=True)
def memory_efficient_backward_step_f64_kernel(out, segment_bytes, num_segments, total_bytes):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = memory_efficient_backward_step_f64(at(segment_bytes, i), at(num_segments, i), at(total_bytes, i))


@cuda.jit(device=True, inline="always")
def topological_sort_key_f64(depth, node_index, num_nodes):
    return depth * num_nodes + node_index


@cuda.jit(cache=True)
def topological_sort_key_f64_kernel(out, depth, node_index, num_nodes):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = topological_sort_key_f64(at(depth, i), at(node_index, i), at(num_nodes, i))


@cuda.jit(device=True, inline="always")
def loss_scale_f64(loss, scale):
    return loss * scale


@cuda.jit(cache=True)
def loss_scale_f64_kernel(out, loss, scale):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = loss_scale_f64(at(loss, i), at(scale, i))


@cuda.jit(device=True, inline="always")
def unscale_grad_f64(grad, scale):
    if scale <= float64(0.0):
        return grad
    return grad / scale


@cuda.jit(cache=True)
def unscale_grad_f64_kernel(out, grad, scale):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = unscale_grad_f64(at(grad, i), at(scale, i))


@cuda.jit(device=True, inline="always")
def jacobian_vector_product_f64(local_jacobian, tangent):
    return local_jacobian * tangent


@cuda.jit(cache=True)
def jacobian_vector_product_f64_kernel(out, local_jacobian, tangent):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = jacobian_vector_product_f64(at(local_jacobian, i), at(tangent, i))


@cuda.jit(device=True, inline="always")
def vector_jacobian_product_f64(upstream_grad, local_jacobian):
    return upstream_grad * local_jacobian


@cuda.jit(cache=True)
def vector_jacobian_product_f64_kernel(out, upstream_grad, local_jacobian):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = vector_jacobian_product_f64(at(upstream_grad, i), at(local_jacobian, i))


@cuda.jit(device=True, inline="always")
def is_dead_node_f64(consumer_count, is_output):
    if consumer_count < float64(0.5) and is_output < float64(0.5):
        return float64(1.0)
    return float64(0.0)


@cuda.jit(cache=True)
def is_dead_node_f64_kernel(out, consumer_count, is_output):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = is_dead_node_f64(at(consumer_count, i), at(is_output, i))


@cuda.jit(device=True, inline="always")
def gradient_norm_clip_scale_f64(grad_norm, max_norm):
    if grad_norm > max_norm:
        return max_norm / grad_norm
    return float64(1.0)


@cuda.jit(cache=True)
def gradient_norm_clip_scale_f64_kernel(out, grad_norm, max_norm):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = gradient_norm_clip_scale_f64(at(grad_norm, i), at(max_norm, i))
