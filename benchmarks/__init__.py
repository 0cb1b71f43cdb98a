"""Benchmarks: ``python -m benchmarks.<script>``, each timing steadystep beside its peers in one process."""

import os

# Before any script imports torch or starts Numba's threads: OpenMP threads that sleep when idle.
# Spinning, torch's threads take the 2 cores from Numba's right after each torch call, and a
# round-robin comparison then reads steadystep's parallel kernels far slower than they are.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
