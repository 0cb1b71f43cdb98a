"""Reverse-mode computation-graph bookkeeping: fan-out counts, gradient accumulation,
checkpointing's recompute-vs-memory trade-off, topological keys, loss scaling, JVP/VJP,
dead-node pruning and the global-norm clip scale.

>>> from steadystep import autograd_graph
>>> autograd_graph.gradient_norm_clip_scale(8.0, 2.0)
0.25
"""

from steadystep.kernels import autograd_graph as _formulas
from steadystep.registry import elementwise

node_output_count = elementwise(_formulas.node_output_count)
grad_accumulate = elementwise(_formulas.grad_accumulate)
checkpointing_cost = elementwise(_formulas.checkpointing_cost)
memory_efficient_backward_step = elementwise(_formulas.memory_efficient_backward_step)
topological_sort_key = elementwise(_formulas.topological_sort_key)
loss_scale = elementwise(_formulas.loss_scale)
unscale_grad = elementwise(_formulas.unscale_grad)
jacobian_vector_product = elementwise(_formulas.jacobian_vector_product)
vector_jacobian_product = elementwise(_formulas.vector_jacobian_product)
is_dead_node = elementwise(_formulas.is_dead_node)
gradient_norm_clip_scale = elementwise(_formulas.gradient_norm_clip_scale)

__all__ = [
    "node_output_count",
    "grad_accumulate",
    "checkpointing_cost",
    "memory_efficient_backward_step",
    "topological_sort_key",
    "loss_scale",
    "unscale_grad",
    "jacobian_vector_product",
    "vector_jacobian_product",
    "is_dead_node",
    "gradient_norm_clip_scale",
]
