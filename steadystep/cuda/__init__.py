"""CUDA target: Numba ``@cuda.jit`` kernels generated from ``steadystep.kernels``.

Nothing here is imported by ``import steadystep``; the dispatcher imports it the first
time a call runs on the CUDA target (a GPU array, or an explicit ``target="cuda"``).
"""
