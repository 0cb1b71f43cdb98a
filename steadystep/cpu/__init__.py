"""CPU target: Numba ``@njit`` kernels generated from ``steadystep.kernels``."""
