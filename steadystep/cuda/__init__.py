"""CUDA target: Numba ``@cuda.jit`` kernels generated from ``steadystep.kernels``.

Nothing here is imported by ``import steadystep``; the dispatcher imports it the first
time a call runs on the CUDA target (a GPU array, or an explicit ``target="cuda"``).
"""

from steadystep.cuda.runtime import compile_without_contraction

compile_without_contraction()  # before any kernel of the package can compile
