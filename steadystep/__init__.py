"""steadystep: JIT-compiled training-loop kernels for the CPU and CUDA, from one formula source.

``steadystep.torch`` (torch.optim drop-ins) and ``steadystep.decentral.mpi`` (one worker per MPI rank)
are imported only when asked for, so ``import steadystep`` needs neither torch nor MPI.

>>> import steadystep
>>> steadystep.gradient_descent.sgd_update(1.0, 0.5, 0.1)
0.95
>>> steadystep.execute("autograd_graph", "gradient_norm_clip_scale", [8.0, 2.0])
{'result': 0.25}
"""

from steadystep import (
    arena,
    autograd_graph,
    autograd_ops,
    compress,
    curvature,
    decentral,
    diagnostics,
    gradient_descent,
    models,
    numerical_stability,
    optim,
    training_stability,
)
from steadystep.dispatch import use_target
from steadystep.registry import catalog, execute

__version__ = "0.1.0"

__all__ = [
    "arena",
    "autograd_graph",
    "autograd_ops",
    "catalog",
    "compress",
    "curvature",
    "decentral",
    "diagnostics",
    "execute",
    "gradient_descent",
    "models",
    "optim",
    "numerical_stability",
    "training_stability",
    "use_target",
]
